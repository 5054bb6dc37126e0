//! The world view: what a rule reads — the observed objects, overlaid with
//! the objects the rules before it emitted in this evaluation.
//!
//! An emitted object is visible when exactly one earlier rule (or trigger)
//! emits it; two emitters contest it and neither copy is seen. A live
//! object that a rule manages is hidden when that rule ran before and its
//! fresh output replaces it (its trigger is not kept, the object is not
//! contested); a rule never reads what it emits itself.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::Arc;

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::Engine;
use super::compile::output_gk;
use super::memo::{Emit, RuleMemo};
use super::model::OutKey;
use super::output;
use super::store::{GroupKind, ObjectKey, ObjectStore};
use crate::api::OutputKind;

/// A kind, optionally narrowed to one namespace.
type ListKey = (GroupKind, Option<String>);

/// Parsed rules of roles, by the address of the shared manifest (held, so
/// the address cannot be reused while cached).
pub(super) type RulesCache = HashMap<usize, (Arc<Value>, Arc<Vec<PolicyRule>>)>;

/// The output kind of a group and kind, if it is one.
pub(super) fn output_kind(gk: &GroupKind) -> Option<OutputKind> {
    OutputKind::ALL.into_iter().find(|k| output_gk(*k) == *gk)
}

/// What one rule (or policy, after every rule) sees.
pub(super) struct View<'a> {
    pub observed: &'a ObjectStore,
    pub emitters: &'a BTreeMap<OutKey, Vec<Emit>>,
    /// Every rule's memo (the reader's own slot is empty while it runs).
    pub rules: &'a [RuleMemo],
    pub engine: &'a Engine,
    /// The rule reading (its index in evaluation order); `None` for policy.
    pub reader: Option<usize>,
    pub rules_cache: &'a RefCell<RulesCache>,
    /// Merged lists, built once per view: a rule lists the same kind once
    /// per trigger.
    merged: RefCell<HashMap<ListKey, Rc<Vec<&'a Arc<Value>>>>>,
    /// ClusterRoles per rendered selector: every trigger of a rule usually
    /// renders the same one.
    selected: RefCell<HashMap<String, Rc<Vec<&'a Arc<Value>>>>>,
}

impl<'a> View<'a> {
    pub fn new(
        observed: &'a ObjectStore,
        emitters: &'a BTreeMap<OutKey, Vec<Emit>>,
        rules: &'a [RuleMemo],
        engine: &'a Engine,
        reader: Option<usize>,
        rules_cache: &'a RefCell<RulesCache>,
    ) -> Self {
        View {
            observed,
            emitters,
            rules,
            engine,
            reader,
            rules_cache,
            merged: RefCell::default(),
            selected: RefCell::default(),
        }
    }

    /// The emitters of `key` this view sees: those of rules before the
    /// reader.
    fn emitters_of(&self, key: &OutKey) -> impl Iterator<Item = &'a Emit> {
        let before = self.reader.unwrap_or(usize::MAX);
        self.emitters
            .get(key)
            .into_iter()
            .flatten()
            .filter(move |e| e.rule < before)
    }

    /// Whether a live managed object is superseded by this evaluation's
    /// output (see the module doc).
    pub fn hidden(&self, obj: &Value, contested: bool) -> bool {
        if !output::is_managed(obj) {
            return false;
        }
        let meta = &obj["metadata"];
        let Some(rule) = meta["annotations"][output::rule_annotation()].as_str() else {
            return false;
        };
        let trigger = meta["annotations"][output::trigger_annotation()].as_str();
        match self.engine.rule_index(rule) {
            Some(r) => {
                if self.reader.is_some_and(|i| r >= i) {
                    // Not run yet (or the reader itself): about to be
                    // replaced or pruned.
                    return true;
                }
                if self.engine.options.held.contains(rule) {
                    return false;
                }
                let sig = &self.rules[r].signature;
                let kept = match trigger {
                    Some(t) => sig.kept.contains(t),
                    None => sig.static_kept,
                };
                !kept && !contested
            }
            // Failed or inactive rules keep their objects; a rule that
            // is gone has its objects pruned.
            None => !self.engine.fixed_reports.contains_key(rule),
        }
    }

    /// One object as the reader sees it.
    pub fn get_shared(&self, gk: &GroupKind, key: &ObjectKey) -> Option<&'a Arc<Value>> {
        let Some(kind) = output_kind(gk) else {
            return self.observed.get_shared(gk, key);
        };
        let okey = (kind, key.0.clone(), key.1.clone());
        let mut seen = self.emitters_of(&okey);
        let first = seen.next();
        let contested = match (first, seen.next()) {
            (Some(e), None) => return Some(&e.desired.object),
            (Some(_), Some(_)) => true,
            _ => false,
        };
        self.observed
            .get_shared(gk, key)
            .filter(|o| !self.hidden(o, contested))
    }

    /// One object as the reader sees it.
    pub fn get(&self, gk: &GroupKind, key: &ObjectKey) -> Option<&'a Value> {
        self.get_shared(gk, key).map(|o| &**o)
    }

    /// Every object of a kind (in a namespace) the reader sees, sorted by
    /// namespace and name.
    pub fn list(&self, gk: &GroupKind, ns: Option<&str>) -> Rc<Vec<&'a Arc<Value>>> {
        let key = (gk.clone(), ns.map(str::to_string));
        if let Some(hit) = self.merged.borrow().get(&key) {
            return Rc::clone(hit);
        }
        let list = Rc::new(self.build_list(gk, ns));
        self.merged.borrow_mut().insert(key, Rc::clone(&list));
        list
    }

    fn build_list(&self, gk: &GroupKind, ns: Option<&str>) -> Vec<&'a Arc<Value>> {
        let observed: Vec<(&'a ObjectKey, &'a Arc<Value>)> = match ns {
            Some(ns) => self.observed.entries_namespace(gk, ns).collect(),
            None => self.observed.entries(gk).collect(),
        };
        let Some(kind) = output_kind(gk) else {
            return observed.into_iter().map(|(_, o)| o).collect();
        };
        let mut keys: BTreeSet<ObjectKey> = observed.into_iter().map(|(k, _)| k.clone()).collect();
        let start = (kind, ns.unwrap_or_default().to_string(), String::new());
        for ((k, n, name), _) in self.emitters.range(start..) {
            if *k != kind || ns.is_some_and(|ns| ns != n) {
                break;
            }
            keys.insert((n.clone(), name.clone()));
        }
        keys.iter().filter_map(|k| self.get_shared(gk, k)).collect()
    }

    /// The ClusterRoles that `selector` (validated) matches, memoized by the
    /// selector's content.
    pub fn selected_cluster_roles(&self, selector: &LabelSelector) -> Rc<Vec<&'a Arc<Value>>> {
        let key = serde_json::to_string(selector).unwrap_or_default();
        if let Some(hit) = self.selected.borrow().get(&key) {
            return Rc::clone(hit);
        }
        let list = self.list(&output_gk(OutputKind::ClusterRole), None);
        let hits: Rc<Vec<&'a Arc<Value>>> = Rc::new(
            list.iter()
                .copied()
                .filter(|o| {
                    crate::selector::matches_json(selector, o["metadata"]["labels"].as_object())
                })
                .collect(),
        );
        self.selected.borrow_mut().insert(key, Rc::clone(&hits));
        hits
    }

    /// A role's rules, parsed once per shared manifest.
    pub fn rules_of(&self, role: &Arc<Value>) -> Arc<Vec<PolicyRule>> {
        let at = Arc::as_ptr(role) as usize;
        if let Some((held, rules)) = self.rules_cache.borrow().get(&at)
            && Arc::ptr_eq(held, role)
        {
            return Arc::clone(rules);
        }
        let rules = Arc::new(super::grants::rules_of(role));
        self.rules_cache
            .borrow_mut()
            .insert(at, (Arc::clone(role), Arc::clone(&rules)));
        rules
    }
}
