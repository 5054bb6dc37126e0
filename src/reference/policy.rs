//! Policy, once every rule has run (docs/rules.md "Outputs and their
//! validation", docs/security.md): over the final world (live objects and
//! every output), so it adds no ordering between rules.
//!
//! - An object two emitters (rules or triggers) emit is contested: neither
//!   copy is desired, each emitter gets a `Conflict` and keeps its trigger.
//! - Every other emitted object is judged on what it grants: a role its
//!   rules, a binding the role it names when that is a live role no rule
//!   manages, or, when it is an aggregated ClusterRole a rule makes, the
//!   live roles no rule manages that it aggregates (one breaking a denial,
//!   or missing the allow-list when picked by a label the rule chose:
//!   [`crate::policy::effective`]). It is refused for a protected name or label, a default
//!   denial (cluster-admin equivalents, escalating verbs, bindings to
//!   `cluster-admin`, `system:*` or everyone), a protected aggregation, a
//!   grant outside the allow-list, or a `*` from data. A refused object is
//!   not desired and is revoked (its trigger is not kept for it).
//! - A live managed object nothing desires any more is revoked when policy
//!   now refuses it, whatever keeps it.
//! - An aggregated role that collects roles no rule manages that policy
//!   would refuse gets a notice (not a refusal).
//!
//! Fast twin: `engine/policy.rs`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::judge::Judge;
use super::world::{Emitter, World};
use crate::api::OutputKind;
use crate::engine::compile::gk_of;
use crate::engine::output;
use crate::engine::{Desired, Options, OutKey};

/// A refused output: its rule (place in evaluation order), trigger, field
/// and why.
pub(super) struct Refusal {
    pub rule: usize,
    pub trigger: Option<String>,
    pub field: String,
    pub why: String,
}

/// A notice on an aggregated role: its rule (when it runs), trigger, field
/// and text.
pub(super) struct Notice {
    pub rule: Option<usize>,
    pub trigger: Option<String>,
    pub field: String,
    pub text: String,
}

/// What policy decided about every object.
#[derive(Default)]
pub(super) struct Verdicts {
    pub desired: Vec<Desired>,
    pub contested: Vec<OutKey>,
    pub refused: BTreeMap<OutKey, Refusal>,
    pub revoked: BTreeMap<OutKey, String>,
    pub notices: BTreeMap<OutKey, Notice>,
}

/// Judges every emitted and every live RBAC object, in key order.
pub(super) fn judge_all(world: &World, options: &Options) -> Verdicts {
    let mut protected = options.protected.clone();
    if let Some(a) = &options.allow {
        protected.extend(a.selectors.iter().cloned());
    }
    let allow = world
        .grants
        .allow
        .as_ref()
        .map(|(a, rules)| (*a, rules.clone()));
    let judge = Judge {
        world,
        waivers: &options.waivers,
        protected,
        allow,
        ceiling: crate::engine::tenant::Ceiling::new(world.observed, &options.tenancy),
    };
    let mut keys: Vec<OutKey> = world.emitted.by_key.keys().cloned().collect();
    for kind in OutputKind::ALL {
        keys.extend(
            world
                .observed
                .entries(gk_of(kind))
                .map(|(k, _)| (kind, k.0.clone(), k.1.clone())),
        );
    }
    keys.sort();
    keys.dedup();
    let mut verdicts = Verdicts::default();
    for key in keys {
        judge.one(&key, &mut verdicts);
    }
    verdicts
}

impl Judge<'_, '_> {
    /// The verdict on one object.
    fn one(&self, key: &OutKey, v: &mut Verdicts) {
        let emitters: &[Emitter] = self
            .world
            .emitted
            .by_key
            .get(key)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if emitters.len() >= 2 {
            v.contested.push(key.clone());
        }
        let single = match emitters {
            [one] => Some(one),
            _ => None,
        };
        let refused = single.and_then(|e| self.refusal_of_output(e));
        let desired = single.filter(|_| refused.is_none());
        let live = self
            .world
            .observed
            .get(gk_of(key.0), &(key.1.clone(), key.2.clone()));
        let live = live.filter(|o| output::is_managed(o));
        let live_why = match (desired, live) {
            (None, Some(l)) => self.refusal(l, false),
            _ => None,
        };
        let notice = match (desired, live) {
            (Some(e), _) if e.json.get("aggregationRule").is_some() => {
                self.notice(&e.json).map(|text| Notice {
                    rule: Some(e.rule),
                    trigger: e.desired.trigger.as_deref().map(str::to_string),
                    field: e.desired.field.to_string(),
                    text,
                })
            }
            (None, Some(l))
                if refused.is_none()
                    && live_why.is_none()
                    && l.get("aggregationRule").is_some() =>
            {
                self.notice(l).map(|text| self.live_notice(l, text))
            }
            _ => None,
        };
        if let Some(e) = desired {
            v.desired.push(e.desired.clone());
        }
        if let Some(why) = refused.as_ref().map(|r| r.why.clone()).or(live_why) {
            v.revoked.insert(key.clone(), why);
        }
        if let Some(r) = refused {
            v.refused.insert(key.clone(), r);
        }
        if let Some(n) = notice {
            v.notices.insert(key.clone(), n);
        }
    }

    /// Why an output with one emitter is refused: a `*` from data found
    /// while rendering, or policy.
    fn refusal_of_output(&self, e: &Emitter) -> Option<Refusal> {
        let d = &e.desired;
        let (field, why) = match &d.refusal {
            Some(err) => (
                err.field.clone(),
                format!("{} {:?}: {}", d.kind, d.name, err.message),
            ),
            None => (d.field.to_string(), self.refusal(&e.json, true)?),
        };
        let trigger = d.trigger.as_deref().map(str::to_string);
        Some(Refusal {
            rule: e.rule,
            trigger,
            field,
            why,
        })
    }

    /// A notice on a live aggregated role, on the rule its provenance names.
    fn live_notice(&self, live: &Value, text: String) -> Notice {
        let annotations = &live["metadata"]["annotations"];
        let rule = annotations[output::rule_annotation()].as_str();
        Notice {
            rule: rule.and_then(|r| self.world.prepared.index_of(r)),
            trigger: annotations[output::trigger_annotation()]
                .as_str()
                .map(str::to_string),
            field: "spec.outputs".to_string(),
            text,
        }
    }
}
