//! Conditions (docs/rules.md "Conditions"): `trigger.conditions`,
//! `trigger.require`, `related[].where` and `related[].require`.
//!
//! A condition tests one value — a field of the object under test (`path`)
//! or a rendered template (`value`) — with one operator. A missing field
//! fails every operator but `notEquals`, `notRegex` and `exists: false`;
//! with `optional` it passes. A `require` condition that fails is a
//! warning showing the tested value.
//!
//! Fast twin: `engine/conditions.rs`.

use handlebars::Context;
use serde_json::Value;

use super::run::Result;
use super::trigger::{Render, regex};
use crate::api::Condition;
use crate::engine::ErrorKind;
use crate::engine::error::{FieldError, FieldWarning};
use crate::engine::path::{FieldPath, scalar_text};

const MISSING: &str = "(missing)";

impl Render<'_> {
    /// Whether condition `c` (at `field`) holds for `subject`.
    pub fn condition(
        &self,
        field: &str,
        c: &Condition,
        subject: &Value,
        ctx: &Context,
    ) -> Result<bool> {
        Ok(self.test(field, c, subject, ctx)?.0)
    }

    /// A `require` condition: `Some(warning)` when it fails.
    pub fn check(
        &self,
        field: &str,
        c: &Condition,
        subject: &Value,
        ctx: &Context,
    ) -> Result<Option<FieldWarning>> {
        let (ok, shown) = self.test(field, c, subject, ctx)?;
        if ok {
            return Ok(None);
        }
        let message = match (&c.message, c.format) {
            (Some(m), _) => m.clone(),
            (None, Some(f)) => format!("not a valid {}", f.as_str()),
            (None, None) => "does not pass the condition".to_string(),
        };
        Ok(Some(FieldWarning::new(field, &shown, message)))
    }

    /// Whether the condition holds, and the tested value as a warning
    /// shows it.
    fn test(
        &self,
        field: &str,
        c: &Condition,
        subject: &Value,
        ctx: &Context,
    ) -> Result<(bool, String)> {
        let actual: Option<String> = match (&c.path, &c.value) {
            (Some(p), _) => {
                let path = FieldPath::parse(p).map_err(|e| {
                    FieldError::new(ErrorKind::InvalidRule, format!("{field}.path"), e)
                })?;
                let v = path.get(subject).filter(|v| !v.is_null());
                let shown = match v {
                    None => MISSING.to_string(),
                    Some(x) => scalar_text(x).unwrap_or_else(|| x.to_string()),
                };
                if let Some(want) = c.exists {
                    return Ok((v.is_some() == want, shown));
                }
                if v.is_none() && c.optional {
                    return Ok((true, shown));
                }
                v.and_then(scalar_text)
            }
            (None, Some(t)) => Some(self.tpl(&format!("{field}.value"), t, ctx)?),
            (None, None) => None,
        };
        let shown = actual.clone().unwrap_or_else(|| MISSING.to_string());
        Ok((self.holds(field, c, actual.as_deref(), ctx)?, shown))
    }

    /// Whether the operator holds for the tested text (`None`: missing).
    fn holds(
        &self,
        field: &str,
        c: &Condition,
        actual: Option<&str>,
        ctx: &Context,
    ) -> Result<bool> {
        if let Some(e) = &c.equals {
            return Ok(actual == Some(self.tpl(&format!("{field}.equals"), e, ctx)?.as_str()));
        }
        if let Some(e) = &c.not_equals {
            return Ok(actual != Some(self.tpl(&format!("{field}.notEquals"), e, ctx)?.as_str()));
        }
        if let Some(list) = &c.one_of {
            for (i, e) in list.iter().enumerate() {
                if actual == Some(self.tpl(&format!("{field}.oneOf[{i}]"), e, ctx)?.as_str()) {
                    return Ok(true);
                }
            }
            return Ok(false);
        }
        if let Some(r) = &c.regex {
            let at = format!("{field}.regex");
            let re = regex(self.rule, &at, &self.tpl(&at, r, ctx)?)?;
            return Ok(actual.is_some_and(|a| re.is_match(a)));
        }
        if let Some(r) = &c.not_regex {
            let at = format!("{field}.notRegex");
            let re = regex(self.rule, &at, &self.tpl(&at, r, ctx)?)?;
            return Ok(!actual.is_some_and(|a| re.is_match(a)));
        }
        if let Some(e) = &c.in_list {
            let Some(a) = actual else { return Ok(false) };
            let list = self.list_of(&format!("{field}.in"), e, ctx)?;
            return Ok(list.iter().any(|x| scalar_text(x).as_deref() == Some(a)));
        }
        if let Some(f) = c.format {
            return Ok(actual.is_some_and(|a| crate::engine::format::check(f, a)));
        }
        Ok(false)
    }
}
