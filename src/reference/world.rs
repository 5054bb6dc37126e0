//! What a rule reads: the observed objects, overlaid with the objects the
//! rules before it emitted in this evaluation (docs/rules.md, "How rules
//! are evaluated", 4 and 5).
//!
//! - An emitted object is seen when exactly one earlier rule or trigger
//!   emits it; two emitters contest it and neither copy is seen.
//! - A live object a rule manages is hidden when its fresh output replaces
//!   it: its rule runs at or after the reader (about to be replaced, or the
//!   reader's own), or ran before and neither kept its trigger (paused,
//!   deleting, failed) nor had the object contested. Objects of failed or
//!   inactive rules are seen; those of rules that are gone are not.
//!
//! Policy reads the same world after every rule (`reader` = `None`).

use std::collections::BTreeMap;

use serde_json::Value;

use super::order::Prepared;
use super::trigger::RuleRun;
use crate::api::OutputKind;
use crate::engine::compile::{gk_of, output_kind};
use crate::engine::output;
use crate::engine::store::ObjectKey;
use crate::engine::{Desired, GroupKind, ObjectStore, OutKey};

/// One rule's (or trigger's) copy of an object.
pub(super) struct Emitter {
    /// The rule's place in evaluation order.
    pub rule: usize,
    pub desired: Desired,
    /// The object as JSON, as readers see it.
    pub json: Value,
}

/// Every object emitted so far, with its emitters in rule and trigger
/// order.
#[derive(Default)]
pub(super) struct Emitted {
    pub by_key: BTreeMap<OutKey, Vec<Emitter>>,
}

impl Emitted {
    /// Adds the outputs of one rule's run.
    pub fn add(&mut self, rule: usize, run: &RuleRun) {
        for t in &run.triggers {
            for d in t.outcome.outputs() {
                let key = (d.kind, d.namespace.clone(), d.name.clone());
                self.by_key.entry(key).or_default().push(Emitter {
                    rule,
                    desired: d.clone(),
                    json: d.object.to_value(),
                });
            }
        }
    }
}

/// The world as one reader sees it.
pub(super) struct World<'a> {
    pub observed: &'a ObjectStore,
    pub prepared: &'a Prepared,
    pub emitted: &'a Emitted,
    /// What the rules before the reader did (all of them, for policy).
    pub runs: &'a [RuleRun],
    /// The reading rule's place in evaluation order; `None`: policy.
    pub reader: Option<usize>,
}

impl<'a> World<'a> {
    pub fn new(
        observed: &'a ObjectStore,
        prepared: &'a Prepared,
        emitted: &'a Emitted,
        runs: &'a [RuleRun],
        reader: Option<usize>,
    ) -> Self {
        World {
            observed,
            prepared,
            emitted,
            runs,
            reader,
        }
    }

    /// The emitters of `key` the reader sees: those of earlier rules.
    pub fn emitters(&self, key: &OutKey) -> Vec<&'a Emitter> {
        let before = self.reader.unwrap_or(usize::MAX);
        let all = self
            .emitted
            .by_key
            .get(key)
            .map(Vec::as_slice)
            .unwrap_or_default();
        all.iter().filter(|e| e.rule < before).collect()
    }

    /// One object as the reader sees it.
    pub fn get(&self, gk: &GroupKind, key: &ObjectKey) -> Option<&'a Value> {
        self.seen(gk, key).map(Seen::json)
    }

    /// One object as the reader sees it, and where it comes from.
    pub fn seen(&self, gk: &GroupKind, key: &ObjectKey) -> Option<Seen<'a>> {
        let Some(kind) = output_kind(gk) else {
            return self.observed.get(gk, key).map(Seen::Observed);
        };
        let emitters = self.emitters(&(kind, key.0.clone(), key.1.clone()));
        if let [one] = emitters.as_slice() {
            return Some(Seen::Emitted(&one.json));
        }
        let contested = emitters.len() >= 2;
        let observed = self.observed.get(gk, key);
        observed
            .filter(|o| !self.hidden(o, contested))
            .map(Seen::Observed)
    }

    /// Every object of a kind (in one namespace) the reader sees, sorted
    /// by namespace and name.
    pub fn list(&self, gk: &GroupKind, ns: Option<&str>) -> Vec<&'a Value> {
        self.list_seen(gk, ns).into_iter().map(Seen::json).collect()
    }

    /// [`World::list`], with where each object comes from.
    pub fn list_seen(&self, gk: &GroupKind, ns: Option<&str>) -> Vec<Seen<'a>> {
        let in_ns = |n: &str| ns.is_none_or(|ns| ns == n);
        let Some(kind) = output_kind(gk) else {
            let objects = self.observed.entries(gk).filter(|(k, _)| in_ns(&k.0));
            return objects.map(|(_, o)| Seen::Observed(o)).collect();
        };
        let mut keys: Vec<ObjectKey> = self.observed.entries(gk).map(|(k, _)| k.clone()).collect();
        keys.extend(
            self.emitted
                .by_key
                .keys()
                .filter(|k| k.0 == kind)
                .map(|k| (k.1.clone(), k.2.clone())),
        );
        keys.retain(|k| in_ns(&k.0));
        keys.sort();
        keys.dedup();
        keys.iter().filter_map(|k| self.seen(gk, k)).collect()
    }

    /// Every ClusterRole the reader sees, by name.
    pub fn cluster_roles(&self) -> Vec<Seen<'a>> {
        self.list_seen(gk_of(OutputKind::ClusterRole), None)
    }

    /// Whether a live managed object is superseded (see the module doc).
    fn hidden(&self, obj: &Value, contested: bool) -> bool {
        if !output::is_managed(obj) {
            return false;
        }
        let annotations = &obj["metadata"]["annotations"];
        let Some(rule) = annotations[output::rule_annotation()].as_str() else {
            return false;
        };
        let trigger = annotations[output::trigger_annotation()].as_str();
        let Some(r) = self.prepared.index_of(rule) else {
            return !self.prepared.fixed.contains_key(rule);
        };
        if self.reader.is_some_and(|i| r >= i) {
            return true;
        }
        let run = &self.runs[r];
        if run.held {
            return false;
        }
        !run.keeps(trigger) && !contested
    }
}

/// An object a reader sees: emitted in this evaluation, or observed.
#[derive(Clone, Copy)]
pub(super) enum Seen<'a> {
    Emitted(&'a Value),
    Observed(&'a Value),
}

impl<'a> Seen<'a> {
    /// The object as JSON.
    pub fn json(self) -> &'a Value {
        match self {
            Seen::Emitted(v) | Seen::Observed(v) => v,
        }
    }

    /// The object, when it is a live one.
    pub fn observed(self) -> Option<&'a Value> {
        match self {
            Seen::Observed(v) => Some(v),
            Seen::Emitted(_) => None,
        }
    }
}
