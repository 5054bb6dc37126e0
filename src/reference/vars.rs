//! Vars (`spec.vars[]`, docs/rules.md "Vars"): named expressions evaluated
//! once per trigger, after the related sets and in order (a var may read
//! earlier ones), bound as `vars.<name>`.
//!
//! Fast twin: `engine/vars.rs`.

use handlebars::Context;
use serde_json::{Map, Value};

use super::run::Result;
use super::trigger::{Render, bind};

impl Render<'_> {
    /// Evaluates every var into `vars.<name>`.
    pub fn vars(&self, ctx: &mut Context) -> Result<()> {
        bind(ctx, "vars", Value::Object(Map::new()));
        for (i, v) in self.rule.spec.vars.iter().enumerate() {
            let value = self.expr(&format!("spec.vars[{i}].value"), &v.value, ctx)?;
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
}
