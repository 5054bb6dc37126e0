//! Vars (`spec.vars[]`, docs/rules.md "Vars"): each expression evaluated
//! after the related sets, in order, bound as `vars.<name>`; a var that
//! reads only cached related lists is cached with them.
//!
//! Reference twin: `reference/vars.rs`.

use handlebars::Context;
use serde_json::{Map, Value};

use super::expand::{Evaluator, Result, bind, limited};
use super::incremental::eval::VarKey;
use super::limits;
use super::path::At;
use super::template::named_reads;

impl Evaluator<'_> {
    /// Binds each var as `vars.<name>`, in order.
    pub(super) fn bind_vars(&self, ctx: &mut Context) -> Result<()> {
        bind(ctx, "vars", Value::Object(Map::new()));
        let vars_at = At::Field("spec.vars");
        for (i, v) in self.rule.spec.vars.iter().enumerate() {
            let at = At::Index(&vars_at, i);
            let value = self.var_value(i, &v.name, &v.value, ctx)?;
            if let Value::Array(a) = &value {
                limited(
                    At::Key(&at, "value"),
                    limits::check_list(a.len(), format_args!("var {:?}", v.name)),
                )?;
            }
            if let Some(vars) = ctx
                .data_mut()
                .get_mut("vars")
                .and_then(Value::as_object_mut)
            {
                vars.insert(v.name.clone(), value);
            }
        }
        Ok(())
    }

    /// A var's key in the cache: when its expression reads nothing but
    /// related lists, each of them cached (by its token).
    fn var_key(&self, i: usize, expr: &str) -> Option<VarKey> {
        self.caches.var_key(i, || {
            if !self.engine.templates.expr_reads_only(expr, "related") {
                return None;
            }
            let names: Vec<&str> = self
                .rule
                .spec
                .related
                .iter()
                .map(|r| r.name.as_str())
                .collect();
            named_reads(&[expr], "related", &names)
        })
    }

    /// A var's value: cached, or evaluated (and cached when it has a key).
    fn var_value(&self, i: usize, name: &str, expr: &str, ctx: &Context) -> Result<Value> {
        let vars_at = At::Field("spec.vars");
        let at = At::Index(&vars_at, i);
        let field = At::Key(&at, "value");
        let key = self.var_key(i, expr);
        self.caches
            .var(name, key, || Ok(self.expr(field, expr, ctx)?.into_owned()))
    }
}
