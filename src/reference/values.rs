//! Templates and template values (docs/rules.md "Templates",
//! "Expressions: forEach and when", "List directives and $merge").
//!
//! Every string is a handlebars template rendered in strict mode. An
//! expression (`forEach`, `when`, `in`, `vars[].value`) evaluates to a JSON
//! value. A template value is expanded recursively: strings rendered, a
//! list entry `{forEach, as, when, item | items}` expanded to zero or more
//! entries, a map's keys rendered and its `$merge` maps merged in. Strings
//! rendered from a template inside `rules` and `subjects` are marked as
//! data ([`DATA_MARK`]): such a value is a name, never a wildcard or a
//! `system:` subject ([`crate::engine::output`]).
//!
//! Fast twin: `engine/values.rs`.

use std::collections::BTreeMap;

use handlebars::Context;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde_json::{Map, Value};

use super::run::Result;
use super::trigger::{Render, bind, unbind};
use crate::engine::ErrorKind;
use crate::engine::compile::{Body, directive};
use crate::engine::error::FieldError;
use crate::engine::output::DATA_MARK;
use crate::engine::path::scalar_text;
use crate::engine::template::{Templates, truthy};

/// Whether strings rendered from templates are marked as data.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Marked {
    No,
    AsData,
}

fn template_error(field: &str, message: String) -> FieldError {
    FieldError::new(ErrorKind::Template, field, message)
}

impl Render<'_> {
    /// Renders a template to text.
    pub fn tpl(&self, field: &str, text: &str, ctx: &Context) -> Result<String> {
        self.templates
            .render(text, ctx)
            .map_err(|e| template_error(field, e))
    }

    /// Evaluates an expression to a JSON value.
    pub fn expr(&self, field: &str, text: &str, ctx: &Context) -> Result<Value> {
        let v = self
            .templates
            .eval_ref(text, ctx)
            .map_err(|e| template_error(field, e))?;
        Ok(v.into_owned())
    }

    /// Whether an expression is true (not `false`, `null`, `""`, `0`,
    /// `[]` or `{}`).
    pub fn truthy(&self, field: &str, text: &str, ctx: &Context) -> Result<bool> {
        Ok(truthy(&self.expr(field, text, ctx)?))
    }

    /// Evaluates a `forEach` expression: a list (null is empty).
    pub fn list_of(&self, field: &str, text: &str, ctx: &Context) -> Result<Vec<Value>> {
        match self.expr(field, text, ctx)? {
            Value::Array(a) => Ok(a),
            Value::Null => Ok(Vec::new()),
            other => Err(template_error(
                field,
                format!("forEach must yield a list, got {other}"),
            )),
        }
    }

    /// Runs `each` once per entry of the `forEach` list `text`, bound as `var`.
    pub fn for_each(
        &self,
        field: &str,
        text: &str,
        var: &str,
        ctx: &mut Context,
        mut each: impl FnMut(&mut Context) -> Result<()>,
    ) -> Result<()> {
        let list = self.list_of(field, text, ctx)?;
        let old = bind(ctx, var, Value::Null);
        let mut result = Ok(());
        for x in list {
            bind(ctx, var, x);
            result = each(ctx);
            if result.is_err() {
                break;
            }
        }
        unbind(ctx, var, old);
        result
    }

    /// Expands a template value.
    pub fn expand(&self, v: &Value, ctx: &mut Context, field: &str, mark: Marked) -> Result<Value> {
        match v {
            Value::String(s) => self.expand_string(s, ctx, field, mark),
            Value::Array(items) => {
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    self.entry(item, &format!("{field}[{i}]"), ctx, mark, &mut out)?;
                }
                Ok(Value::Array(out))
            }
            Value::Object(map) => self.expand_map(map, ctx, field, mark),
            other => Ok(other.clone()),
        }
    }

    fn expand_string(&self, s: &str, ctx: &Context, field: &str, mark: Marked) -> Result<Value> {
        let mark = (mark == Marked::AsData && !Templates::is_literal(s)).then_some(DATA_MARK);
        let text = self
            .templates
            .render_after(mark, s, ctx)
            .map_err(|e| template_error(field, e))?;
        Ok(Value::String(text))
    }

    /// Expands one list entry into `out`: a value, or a directive's values.
    fn entry(
        &self,
        item: &Value,
        f: &str,
        ctx: &mut Context,
        mark: Marked,
        out: &mut Vec<Value>,
    ) -> Result<()> {
        let d = directive(item).map_err(|m| FieldError::new(ErrorKind::InvalidRule, f, m))?;
        let Some(d) = d else {
            out.push(self.expand(item, ctx, f, mark)?);
            return Ok(());
        };
        let (body, body_at, splice) = match d.body {
            Body::Item(b) => (b, format!("{f}.item"), false),
            Body::Items(b) => (b, format!("{f}.items"), true),
        };
        let when_at = format!("{f}.when");
        let mut emit = |ctx: &mut Context| -> Result<()> {
            if let Some(w) = d.when
                && !self.truthy(&when_at, w, ctx)?
            {
                return Ok(());
            }
            match self.expand(body, ctx, &body_at, mark)? {
                Value::Array(xs) if splice => out.extend(xs),
                other => out.push(other),
            }
            Ok(())
        };
        match d.for_each {
            None => emit(ctx),
            Some(e) => {
                let var = d.as_name.unwrap_or("item");
                self.for_each(&format!("{f}.forEach"), e, var, ctx, emit)
            }
        }
    }

    /// Expands a map: keys rendered, `$merge` maps merged.
    fn expand_map(
        &self,
        map: &Map<String, Value>,
        ctx: &mut Context,
        field: &str,
        mark: Marked,
    ) -> Result<Value> {
        let mut out = Map::new();
        for (k, val) in map {
            if k == "$merge" {
                let merged = self.expand(val, ctx, &format!("{field}.$merge"), mark)?;
                for (j, part) in merged.as_array().into_iter().flatten().enumerate() {
                    merge_into(&mut out, part, &format!("{field}.$merge[{j}]"))?;
                }
                continue;
            }
            let key = self.tpl(&format!("{field}[{k:?}]"), k, ctx)?;
            let val = self.expand(val, ctx, &format!("{field}.{k}"), mark)?;
            if out.insert(key.clone(), val).is_some() {
                let message = format!("key {key:?} is rendered twice");
                return Err(FieldError::new(ErrorKind::InvalidOutput, field, message));
            }
        }
        Ok(Value::Object(out))
    }

    /// Expands a template list of text (`names`, `clusterRoleNames`).
    pub fn strings(&self, field: &str, v: &Value, ctx: &mut Context) -> Result<Vec<String>> {
        let Value::Array(items) = self.expand(v, ctx, field, Marked::No)? else {
            return Err(FieldError::new(
                ErrorKind::InvalidOutput,
                field,
                "must render to a list",
            ));
        };
        let text = |(i, x): (usize, Value)| {
            scalar_text(&x).ok_or_else(|| {
                FieldError::new(
                    ErrorKind::InvalidOutput,
                    format!("{field}[{i}]"),
                    "must render to text",
                )
            })
        };
        items.into_iter().enumerate().map(text).collect()
    }

    /// Renders a label selector whose keys and values are templates.
    pub fn selector(
        &self,
        field: &str,
        sel: &LabelSelector,
        ctx: &Context,
    ) -> Result<LabelSelector> {
        let mut out = LabelSelector::default();
        if let Some(ml) = &sel.match_labels {
            let mut m = BTreeMap::new();
            for (k, v) in ml {
                let f = format!("{field}.matchLabels[{k:?}]");
                m.insert(self.tpl(&f, k, ctx)?, self.tpl(&f, v, ctx)?);
            }
            out.match_labels = Some(m);
        }
        if let Some(exprs) = &sel.match_expressions {
            let mut rendered = Vec::new();
            for (i, e) in exprs.iter().enumerate() {
                let f = format!("{field}.matchExpressions[{i}]");
                let values = match &e.values {
                    Some(vs) => Some(
                        vs.iter()
                            .enumerate()
                            .map(|(j, v)| self.tpl(&format!("{f}.values[{j}]"), v, ctx))
                            .collect::<Result<Vec<_>>>()?,
                    ),
                    None => None,
                };
                let key = self.tpl(&format!("{f}.key"), &e.key, ctx)?;
                rendered.push(LabelSelectorRequirement {
                    key,
                    operator: e.operator.clone(),
                    values,
                });
            }
            out.match_expressions = Some(rendered);
        }
        crate::selector::validate(&out)
            .map_err(|e| FieldError::new(ErrorKind::Selector, field, e.to_string()))?;
        Ok(out)
    }
}

/// Merges one rendered `$merge` map into `out`; a key given twice with
/// different values is an error.
fn merge_into(out: &mut Map<String, Value>, part: &Value, at: &str) -> Result<()> {
    let Value::Object(pm) = part else {
        return Err(FieldError::new(
            ErrorKind::InvalidRule,
            at,
            "must render to a map",
        ));
    };
    for (pk, pv) in pm {
        if out
            .insert(pk.clone(), pv.clone())
            .is_some_and(|old| old != *pv)
        {
            let message = format!("key {pk:?} is given twice with different values");
            return Err(FieldError::new(ErrorKind::InvalidOutput, at, message));
        }
    }
    Ok(())
}
