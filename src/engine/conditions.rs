//! Conditions (docs/rules.md "Conditions"): whether one condition holds
//! for the object under test — `trigger.conditions` and `require`, a
//! related set's `where` and `require` — and a failed `require` as a
//! warning showing the tested value.
//!
//! Reference twin: `reference/conditions.rs`.

use handlebars::Context;
use serde_json::Value;

use super::error::{ErrorKind, FieldError, FieldWarning};
use super::expand::{Evaluator, Result};
use super::path::{At, FieldPath, scalar_text};
use crate::api::Condition;

impl Evaluator<'_> {
    pub(super) fn condition(
        &self,
        field: At<'_>,
        c: &Condition,
        subject: &Value,
        ctx: &Context,
    ) -> Result<bool> {
        Ok(self.test(field, c, subject, ctx)?.0)
    }

    /// A `require` condition: `Some(warning)` when it fails.
    pub(super) fn check(
        &self,
        field: At<'_>,
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
        Ok(Some(FieldWarning::new(field.to_string(), &shown, message)))
    }

    /// Whether the condition holds, and the tested value as a warning
    /// shows it.
    fn test(
        &self,
        field: At<'_>,
        c: &Condition,
        subject: &Value,
        ctx: &Context,
    ) -> Result<(bool, String)> {
        const MISSING: &str = "(missing)";
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
            (None, Some(t)) => Some(self.tpl(At::Key(&field, "value"), t, ctx)?),
            (None, None) => None,
        };
        let shown = actual.clone().unwrap_or_else(|| MISSING.to_string());
        let ok = self.holds(field, c, actual.as_deref(), ctx)?;
        Ok((ok, shown))
    }

    /// Whether the operator holds for the tested text (None: missing).
    fn holds(
        &self,
        field: At<'_>,
        c: &Condition,
        actual: Option<&str>,
        ctx: &Context,
    ) -> Result<bool> {
        if let Some(e) = &c.equals {
            let want = self.tpl(At::Key(&field, "equals"), e, ctx)?;
            return Ok(actual == Some(want.as_str()));
        }
        if let Some(e) = &c.not_equals {
            let want = self.tpl(At::Key(&field, "notEquals"), e, ctx)?;
            return Ok(actual != Some(want.as_str()));
        }
        if let Some(list) = &c.one_of {
            let one_of = At::Key(&field, "oneOf");
            for (i, e) in list.iter().enumerate() {
                let want = self.tpl(At::Index(&one_of, i), e, ctx)?;
                if actual == Some(want.as_str()) {
                    return Ok(true);
                }
            }
            return Ok(false);
        }
        if let Some(r) = &c.regex {
            let at = At::Key(&field, "regex");
            let text = self.tpl(at, r, ctx)?;
            let re = self.regex(at, &text)?;
            return Ok(actual.is_some_and(|a| re.is_match(a)));
        }
        if let Some(r) = &c.not_regex {
            let at = At::Key(&field, "notRegex");
            let text = self.tpl(at, r, ctx)?;
            let re = self.regex(at, &text)?;
            return Ok(!actual.is_some_and(|a| re.is_match(a)));
        }
        if let Some(e) = &c.in_list {
            let Some(a) = actual else { return Ok(false) };
            let list = self.list_of(At::Key(&field, "in"), e, ctx)?;
            return Ok(list.iter().any(|x| scalar_text(x).as_deref() == Some(a)));
        }
        if let Some(f) = c.format {
            return Ok(actual.is_some_and(|a| super::format::check(f, a)));
        }
        Ok(false)
    }
}
