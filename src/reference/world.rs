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
//!
//! Fast twin: `engine/view.rs`.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::order::Prepared;
use super::run::RuleRun;
use crate::api::OutputKind;
use crate::engine::compile::{gk_of, output_kind};
use crate::engine::output;
use crate::engine::store::ObjectKey;
use crate::engine::{Desired, GroupKind, ObjectStore, Options, OutKey};
use crate::policy::{AllowList, Waivers};

/// One rule's (or trigger's) copy of an object.
pub(super) struct Emitter {
    /// The rule's place in evaluation order.
    pub rule: usize,
    pub desired: Desired,
    /// The object as JSON, as readers see it.
    pub json: Value,
    /// A role's own rules, as its JSON holds them (none for a binding or
    /// an aggregated ClusterRole).
    pub rules: Vec<PolicyRule>,
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
                let json = d.object.to_value();
                let rules = rules_of(&json);
                let e = Emitter {
                    rule,
                    desired: d.clone(),
                    json,
                    rules,
                };
                self.by_key.entry(key).or_default().push(e);
            }
        }
    }

    /// The keys of objects of `kind` (in namespace `ns`) emitted so far.
    fn keys<'k>(
        &'k self,
        kind: OutputKind,
        ns: Option<&'k str>,
    ) -> impl Iterator<Item = ObjectKey> + 'k {
        let start = (kind, ns.unwrap_or_default().to_string(), String::new());
        let keys = self.by_key.range(start..).map(|(k, _)| k);
        let keys = keys.take_while(move |k| k.0 == kind && ns.is_none_or(|ns| ns == k.1));
        keys.map(|k| (k.1.clone(), k.2.clone()))
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
    /// What copies (`rulesFrom`) and outputs are judged by.
    pub grants: &'a Grants<'a>,
    /// Every ClusterRole the reader sees, by name (`rulesFrom` and
    /// aggregation select among them).
    pub cluster_roles: Vec<Seen<'a>>,
    /// The same, by each label they carry (places in `cluster_roles`):
    /// where a selector's `matchLabels` candidates are found.
    by_label: BTreeMap<(&'a str, &'a str), Vec<usize>>,
}

impl<'a> World<'a> {
    pub fn new(
        observed: &'a ObjectStore,
        prepared: &'a Prepared,
        emitted: &'a Emitted,
        runs: &'a [RuleRun],
        reader: Option<usize>,
        grants: &'a Grants<'a>,
    ) -> Self {
        let mut world = World {
            observed,
            prepared,
            emitted,
            runs,
            reader,
            grants,
            cluster_roles: Vec::new(),
            by_label: BTreeMap::new(),
        };
        world.cluster_roles = world.list_seen(gk_of(OutputKind::ClusterRole), None);
        for (i, role) in world.cluster_roles.iter().enumerate() {
            let labels = role.json()["metadata"]["labels"]
                .as_object()
                .into_iter()
                .flatten();
            for (k, v) in labels.filter_map(|(k, v)| Some((k.as_str(), v.as_str()?))) {
                world.by_label.entry((k, v)).or_default().push(i);
            }
        }
        world
    }

    /// The ClusterRoles the reader sees that `selector` selects, by name.
    pub fn selected_cluster_roles(&self, selector: &LabelSelector) -> Vec<Seen<'a>> {
        let matches = |role: &Seen| {
            crate::selector::matches_json(selector, role.json()["metadata"]["labels"].as_object())
        };
        // Only the roles carrying one of its matchLabels can match.
        match selector.match_labels.iter().flatten().next() {
            Some((k, v)) => {
                let at = self.by_label.get(&(k.as_str(), v.as_str()));
                let candidates = at.map(Vec::as_slice).unwrap_or_default();
                candidates
                    .iter()
                    .map(|i| self.cluster_roles[*i])
                    .filter(matches)
                    .collect()
            }
            None => self.cluster_roles.iter().copied().filter(matches).collect(),
        }
    }

    /// The emitters of `key` the reader sees: those of earlier rules (an
    /// object's emitters are kept in rule order).
    pub fn emitters(&self, key: &OutKey) -> &'a [Emitter] {
        let before = self.reader.unwrap_or(usize::MAX);
        let all = self
            .emitted
            .by_key
            .get(key)
            .map(Vec::as_slice)
            .unwrap_or_default();
        &all[..all.partition_point(|e| e.rule < before)]
    }

    /// One object as the reader sees it, and where it comes from.
    pub fn seen(&self, gk: &GroupKind, key: &ObjectKey) -> Option<Seen<'a>> {
        let Some(kind) = output_kind(gk) else {
            return self.observed.get(gk, key).map(Seen::Observed);
        };
        let emitters = self.emitters(&(kind, key.0.clone(), key.1.clone()));
        if let [one] = emitters {
            return Some(Seen::Emitted(one));
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
    fn list_seen(&self, gk: &GroupKind, ns: Option<&str>) -> Vec<Seen<'a>> {
        let observed: Vec<(&ObjectKey, &std::sync::Arc<Value>)> = match ns {
            Some(ns) => self.observed.entries_namespace(gk, ns).collect(),
            None => self.observed.entries(gk).collect(),
        };
        let Some(kind) = output_kind(gk) else {
            return observed
                .into_iter()
                .map(|(_, o)| Seen::Observed(o))
                .collect();
        };
        let mut keys: BTreeSet<ObjectKey> = observed.into_iter().map(|(k, _)| k.clone()).collect();
        keys.extend(self.emitted.keys(kind, ns));
        keys.iter().filter_map(|k| self.seen(gk, k)).collect()
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
    Emitted(&'a Emitter),
    Observed(&'a Value),
}

impl<'a> Seen<'a> {
    /// The object as JSON.
    pub fn json(self) -> &'a Value {
        match self {
            Seen::Emitted(e) => &e.json,
            Seen::Observed(v) => v,
        }
    }

    /// A role's own rules (what does not parse skipped).
    pub fn rules(self) -> Cow<'a, [PolicyRule]> {
        match self {
            Seen::Emitted(e) => Cow::Borrowed(&e.rules),
            Seen::Observed(v) => Cow::Owned(rules_of(v)),
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

/// A role's rules as its JSON holds them (none for an emitted aggregated
/// ClusterRole); what does not parse is skipped.
pub(super) fn rules_of(role: &Value) -> Vec<PolicyRule> {
    let rules = role
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    rules
        .filter_map(|r| serde_json::from_value(r.clone()).ok())
        .collect()
}

/// How outputs and copies are judged: the waivers, and the allow-list with
/// its effective rules (an aggregated list's: those of the live
/// ClusterRoles it selects that no rule manages).
pub(super) struct Grants<'o> {
    pub waivers: &'o Waivers,
    pub allow: Option<(&'o AllowList, Vec<PolicyRule>)>,
}

impl<'o> Grants<'o> {
    pub fn new(observed: &ObjectStore, options: &'o Options) -> Self {
        let allow = options.allow.as_ref().map(|a| {
            let rules = if a.is_aggregated() {
                allow_list_rules(observed, a)
            } else {
                a.rules.clone()
            };
            (a, rules)
        });
        Grants {
            waivers: &options.waivers,
            allow,
        }
    }

    /// Why a ClusterRole granting `rules` is left out of a copy
    /// ([`crate::policy::copy_refusal`]).
    pub fn copy_refusal(&self, rules: &[PolicyRule]) -> Option<String> {
        let allow = self.allow.as_ref().map(|(a, r)| (*a, r.as_slice()));
        crate::policy::copy_refusal(rules, self.waivers, allow)
    }
}

/// The rules of an aggregated allow-list: those of the live ClusterRoles
/// its selectors pick that no rule manages.
fn allow_list_rules(observed: &ObjectStore, allow: &AllowList) -> Vec<PolicyRule> {
    let mut out = Vec::new();
    for role in observed.list(gk_of(OutputKind::ClusterRole)) {
        let labels = role["metadata"]["labels"].as_object();
        if !output::is_managed(role)
            && allow
                .selectors
                .iter()
                .any(|s| crate::selector::matches_json(s, labels))
        {
            out.extend(rules_of(role));
        }
    }
    out
}
