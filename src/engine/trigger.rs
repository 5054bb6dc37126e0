//! Trigger matching: whether an object triggers a rule (selector,
//! conditions, metadata match), and whether it is paused or being deleted.
//!
//! Reference twin: `reference/trigger.rs`.

use std::sync::Arc;

use handlebars::Context;
use serde_json::{Map, Value, json};

use super::error::FieldError;
use super::expand::{Evaluator, bind, is_deleting, project, shown, visible};
use super::memo::Outcome;
use super::path::At;
use super::view::View;
use crate::api::{MetadataSource, Trigger};

type Result<T> = std::result::Result<T, FieldError>;

impl Evaluator<'_> {
    /// Matches and renders one candidate trigger.
    pub(super) fn trigger_outcome(
        &self,
        trigger: &Trigger,
        obj: &Arc<Value>,
        view: &View,
    ) -> Outcome {
        self.start(Some(Arc::clone(obj)));
        let mut ctx = self.base_context();
        let whole;
        let seen: &Value = match &self.rule.trigger_paths {
            // Templates see the parts they read; matching reads it whole.
            Some(paths) => {
                bind(
                    &mut ctx,
                    "trigger",
                    project(obj, paths, self.rule.trigger_seen()),
                );
                whole = shown(obj, self.rule.trigger_seen());
                &whole
            }
            None => {
                bind(&mut ctx, "trigger", visible(obj, self.rule.trigger_seen()));
                &ctx.data()["trigger"]
            }
        };
        let matches = match self.trigger_matches(trigger, seen, &ctx) {
            Ok(None) => return Outcome::NoMatch,
            Ok(Some(m)) => m,
            Err(e) => return Outcome::MatchError(e),
        };
        let paused = trigger.pause.as_ref().is_some_and(|p| {
            obj["metadata"]["annotations"][p.annotation.as_str()].as_str() == Some(p.value.as_str())
        });
        if paused || is_deleting(obj) {
            return Outcome::Frozen;
        }
        // A trigger whose data the rule does not believe renders nothing:
        // its earlier outputs go, with a warning rather than an error.
        for (i, c) in trigger.require.iter().enumerate() {
            match self.check(
                At::Index(&At::Field("spec.trigger.require"), i),
                c,
                seen,
                &ctx,
            ) {
                Ok(None) => {}
                Ok(Some(w)) => {
                    self.warnings.borrow_mut().push(w);
                    return Outcome::Rendered(Vec::new());
                }
                Err(e) => return Outcome::Failed(e),
            }
        }
        if let Some(m) = matches {
            bind(&mut ctx, "matches", Value::Array(m));
        }
        match self.render(&mut ctx, Some(obj), view) {
            Ok(outs) => {
                // Collected in place, the list would keep the room of the
                // rendered objects for their pointers.
                let mut outs: Vec<_> = outs.into_iter().map(Arc::new).collect();
                outs.shrink_to_fit();
                Outcome::Rendered(outs)
            }
            Err(e) => Outcome::Failed(e),
        }
    }

    /// `Ok(None)`: no match. `Ok(Some(matches))`: a match, with the
    /// metadata matches when the trigger asks for them.
    fn trigger_matches(
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
            if !self.condition(
                At::Index(&At::Field("spec.trigger.conditions"), i),
                c,
                obj,
                ctx,
            )? {
                return Ok(None);
            }
        }
        let Some(mm) = &t.metadata_match else {
            return Ok(Some(None));
        };
        let source = match mm.source {
            MetadataSource::Annotations => "annotations",
            MetadataSource::Labels => "labels",
        };
        let key_re = self.regex(At::Field("spec.trigger.metadataMatch.key"), &mm.key)?;
        let val_re = match &mm.value {
            Some(v) => Some(self.regex(At::Field("spec.trigger.metadataMatch.value"), v)?),
            None => None,
        };
        let mut found = Vec::new();
        if let Some(m) = obj["metadata"][source].as_object() {
            // serde_json maps are sorted by key: matches come out sorted.
            for (k, v) in m {
                let Some(v) = v.as_str() else { continue };
                let Some(kc) = key_re.captures(k) else {
                    continue;
                };
                let mut entry = Map::new();
                entry.insert("key".into(), json!(k));
                entry.insert("value".into(), json!(v));
                for name in key_re.capture_names().flatten() {
                    if let Some(c) = kc.name(name) {
                        entry.insert(name.to_string(), json!(c.as_str()));
                    }
                }
                if let Some(vre) = &val_re {
                    let Some(vc) = vre.captures(v) else { continue };
                    for name in vre.capture_names().flatten() {
                        if let Some(c) = vc.name(name) {
                            entry.insert(name.to_string(), json!(c.as_str()));
                        }
                    }
                }
                found.push(Value::Object(entry));
            }
        }
        Ok(if found.is_empty() {
            None
        } else {
            Some(Some(found))
        })
    }
}
