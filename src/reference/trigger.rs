//! Triggers (`spec.trigger`, docs/rules.md "Trigger matching"): which
//! objects make a rule render, and what becomes of each.
//!
//! An object of the trigger's group and kind (any version) triggers the
//! rule when it passes `selector`, every `conditions` entry and
//! `metadataMatch` (its entries become `matches`). A paused or deleting
//! trigger renders nothing and its outputs are kept as they are. A trigger
//! that fails a `require` condition renders nothing, with a warning. The
//! others render: related sets, vars, outputs. A rule without a trigger
//! renders once.
//!
//! Fast twin: `engine/trigger.rs` and `engine/expand.rs`.

use std::borrow::Cow;

use handlebars::Context;
use serde_json::{Map, Value, json};

use super::run::{Outcome, Result, RuleRun, TriggerRun};
use super::world::World;
use crate::api::{MetadataSource, Trigger};
use crate::engine::compile::{CompiledRule, anchored};
use crate::engine::error::{FieldError, FieldWarning};
use crate::engine::store::{key_of, object_ref};
use crate::engine::template::Templates;
use crate::engine::{Desired, ErrorKind, GroupKind};

/// The render of one trigger: what every stage reads.
pub(super) struct Render<'a> {
    pub rule: &'a CompiledRule,
    pub templates: &'a Templates,
    pub world: &'a World<'a>,
    /// The trigger object as the store holds it.
    pub trigger: Option<&'a Value>,
    pub warnings: Vec<FieldWarning>,
    /// Sources left out of a copy (`rulesFrom`), found while rendering
    /// outputs (which read the render shared).
    pub left_out: std::cell::RefCell<Vec<FieldWarning>>,
}

/// Renders every trigger of `rule` (once, for a static rule).
pub(super) fn run_rule(rule: &CompiledRule, templates: &Templates, world: &World) -> RuleRun {
    let Some(trigger) = &rule.spec.trigger else {
        let mut render = Render {
            rule,
            templates,
            world,
            trigger: None,
            warnings: Vec::new(),
            left_out: Default::default(),
        };
        let mut ctx = render.base_context();
        let outcome = match render.render(&mut ctx) {
            Ok(outputs) => Outcome::Rendered(outputs),
            Err(e) => Outcome::Failed(e),
        };
        render.warnings.extend(render.left_out.take());
        let warnings = sorted(render.warnings);
        return RuleRun {
            held: false,
            triggers: vec![TriggerRun {
                key: None,
                tref: None,
                outcome,
                warnings,
            }],
        };
    };
    let gk = GroupKind::new(&trigger.api_group, &trigger.kind);
    let mut triggers = Vec::new();
    for obj in world.list(&gk, None) {
        let Some(key) = key_of(obj) else { continue };
        let mut render = Render {
            rule,
            templates,
            world,
            trigger: Some(obj),
            warnings: Vec::new(),
            left_out: Default::default(),
        };
        let outcome = render.trigger_outcome(trigger, obj);
        render.warnings.extend(render.left_out.take());
        let warnings = sorted(render.warnings);
        triggers.push(TriggerRun {
            key: Some(key),
            tref: Some(object_ref(obj)),
            outcome,
            warnings,
        });
    }
    RuleRun {
        held: false,
        triggers,
    }
}

fn sorted(mut warnings: Vec<FieldWarning>) -> Vec<FieldWarning> {
    warnings.sort();
    warnings.dedup();
    warnings
}

/// What templates see of an object: only `apiVersion`, `kind` and
/// `metadata` with `metadataOnly`, those and the `fields` named when there
/// are some, and never `metadata.managedFields`.
pub(super) fn visible(obj: &Value, metadata_only: bool, fields: &[String]) -> Value {
    let mut v = if metadata_only {
        json!({
            "apiVersion": obj.get("apiVersion").cloned().unwrap_or(Value::Null),
            "kind": obj.get("kind").cloned().unwrap_or(Value::Null),
            "metadata": obj.get("metadata").cloned().unwrap_or(Value::Null),
        })
    } else if !fields.is_empty() {
        let seen = crate::engine::path::seen_fields(fields);
        crate::engine::path::keep_fields(std::borrow::Cow::Borrowed(obj), &seen)
    } else {
        obj.clone()
    };
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    v
}

/// Binds `name` in the context, giving back what it was bound to.
pub(super) fn bind(ctx: &mut Context, name: &str, v: Value) -> Option<Value> {
    ctx.data_mut()
        .as_object_mut()
        .and_then(|m| m.insert(name.to_string(), v))
}

/// Puts back what `name` was bound to before [`bind`].
pub(super) fn unbind(ctx: &mut Context, name: &str, old: Option<Value>) {
    if let Some(m) = ctx.data_mut().as_object_mut() {
        match old {
            Some(o) => m.insert(name.to_string(), o),
            None => m.remove(name),
        };
    }
}

impl Render<'_> {
    /// What every template starts with: `rule.name`, `related` (empty so
    /// far) and `params`.
    pub fn base_context(&self) -> Context {
        Context::from(
            json!({"rule": {"name": self.rule.name}, "related": {}, "params": self.rule.params}),
        )
    }

    /// Matches one candidate trigger and renders it.
    fn trigger_outcome(&mut self, trigger: &Trigger, obj: &Value) -> Outcome {
        let mut ctx = self.base_context();
        let seen = visible(obj, trigger.metadata_only, &trigger.fields);
        bind(&mut ctx, "trigger", seen.clone());
        let matches = match self.matches(trigger, &seen, &ctx) {
            Ok(None) => return Outcome::NoMatch,
            Ok(Some(m)) => m,
            Err(e) => return Outcome::MatchError(e),
        };
        let paused = trigger.pause.as_ref().is_some_and(|p| {
            obj["metadata"]["annotations"][p.annotation.as_str()].as_str() == Some(p.value.as_str())
        });
        let deleting = obj["metadata"]
            .get("deletionTimestamp")
            .is_some_and(|v| !v.is_null());
        if paused || deleting {
            return Outcome::Frozen;
        }
        for (i, c) in trigger.require.iter().enumerate() {
            match self.check(&format!("spec.trigger.require[{i}]"), c, &seen, &ctx) {
                Ok(None) => {}
                Ok(Some(w)) => {
                    self.warnings.push(w);
                    return Outcome::Rendered(Vec::new());
                }
                Err(e) => return Outcome::Failed(e),
            }
        }
        if let Some(m) = matches {
            bind(&mut ctx, "matches", Value::Array(m));
        }
        match self.render(&mut ctx) {
            Ok(outputs) => Outcome::Rendered(outputs),
            Err(e) => Outcome::Failed(e),
        }
    }

    /// `None`: no match. `Some(matches)`: a match, with the metadata
    /// matches when the trigger asks for them.
    fn matches(
        &self,
        t: &Trigger,
        obj: &Value,
        ctx: &Context,
    ) -> Result<Option<Option<Vec<Value>>>> {
        if let Some(sel) = &t.selector
            && !crate::selector::matches_json(sel, obj["metadata"]["labels"].as_object())
        {
            return Ok(None);
        }
        for (i, c) in t.conditions.iter().enumerate() {
            if !self.condition(&format!("spec.trigger.conditions[{i}]"), c, obj, ctx)? {
                return Ok(None);
            }
        }
        let Some(mm) = &t.metadata_match else {
            return Ok(Some(None));
        };
        let found = metadata_matches(self.rule, mm, obj)?;
        Ok((!found.is_empty()).then_some(Some(found)))
    }

    /// Renders related sets, vars and outputs for the trigger bound in `ctx`.
    pub fn render(&mut self, ctx: &mut Context) -> Result<Vec<Desired>> {
        self.related_sets(ctx)?;
        self.vars(ctx)?;
        self.outputs(ctx)
    }
}

/// `metadataMatch`: the label or annotation entries whose whole key and
/// value match, each `{key, value, <named captures>}`, sorted by key.
fn metadata_matches(
    rule: &CompiledRule,
    mm: &crate::api::MetadataMatch,
    obj: &Value,
) -> Result<Vec<Value>> {
    let source = match mm.source {
        MetadataSource::Annotations => "annotations",
        MetadataSource::Labels => "labels",
    };
    let key_re = regex(rule, "spec.trigger.metadataMatch.key", &mm.key)?;
    let value_re = match &mm.value {
        Some(v) => Some(regex(rule, "spec.trigger.metadataMatch.value", v)?),
        None => None,
    };
    let mut found = Vec::new();
    for (k, v) in obj["metadata"][source].as_object().into_iter().flatten() {
        let Some(v) = v.as_str() else { continue };
        let Some(key_caps) = key_re.captures(k) else {
            continue;
        };
        let mut entry = Map::new();
        entry.insert("key".into(), json!(k));
        entry.insert("value".into(), json!(v));
        add_captures(&mut entry, &key_re, &key_caps);
        if let Some(re) = &value_re {
            let Some(caps) = re.captures(v) else { continue };
            add_captures(&mut entry, re, &caps);
        }
        found.push(Value::Object(entry));
    }
    Ok(found)
}

/// Adds the named captures of a match to `entry`.
pub(super) fn add_captures(
    entry: &mut Map<String, Value>,
    re: &regex::Regex,
    caps: &regex::Captures,
) {
    for name in re.capture_names().flatten() {
        if let Some(c) = caps.name(name) {
            entry.insert(name.to_string(), json!(c.as_str()));
        }
    }
}

/// A regular expression anchored to the whole value: the rule's, compiled
/// with it, or (a templated pattern) compiled now.
pub(super) fn regex<'r>(
    rule: &'r CompiledRule,
    field: &str,
    text: &str,
) -> Result<Cow<'r, regex::Regex>> {
    if let Some(re) = rule.regexes.get(text) {
        return Ok(Cow::Borrowed(re));
    }
    anchored(text).map(Cow::Owned).map_err(|e| {
        FieldError::new(
            ErrorKind::Regex,
            field,
            format!("invalid regular expression {text:?}: {e}"),
        )
    })
}
