//! The data model every stage shares: what an evaluation produces
//! (desired objects, per-rule reports, contested and revoked objects) and
//! how outputs are identified.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::error::{self, EngineError, EngineWarning};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::manifest::Manifest;
use crate::api::OutputKind;

/// A key identifying an emitted object: kind, namespace and name.
pub type OutKey = (OutputKind, String, String);

/// A desired object's sort key, borrowed: kind name, namespace, name.
/// The set is looked up with one, so it keeps no copy of the strings.
trait SortParts {
    fn parts(&self) -> (&str, &str, &str);
}

impl SortParts for (&str, &str, &str) {
    fn parts(&self) -> (&str, &str, &str) {
        *self
    }
}

/// The parts of an output key.
fn parts(key: &OutKey) -> (&'static str, &str, &str) {
    (key.0.as_str(), &key.1, &key.2)
}

impl PartialEq for dyn SortParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn SortParts + '_ {}

impl PartialOrd for dyn SortParts + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for dyn SortParts + '_ {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.parts().cmp(&other.parts())
    }
}

/// A desired object as its own key, ordered by its sort key (the object's
/// own strings, not copies).
#[derive(Clone)]
struct Entry(Arc<Desired>);

impl SortParts for Entry {
    fn parts(&self) -> (&str, &str, &str) {
        (self.0.kind.as_str(), &self.0.namespace, &self.0.name)
    }
}

impl<'a> std::borrow::Borrow<dyn SortParts + 'a> for Entry {
    fn borrow(&self) -> &(dyn SortParts + 'a) {
        self
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.parts().cmp(&other.parts())
    }
}

/// Desired objects sorted by kind, namespace and name; cheap to clone
/// (a persistent set shared between evaluations).
#[derive(Clone, Default)]
pub struct DesiredSet {
    set: imbl::OrdSet<Entry>,
}

impl DesiredSet {
    /// Number of objects.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Every object, sorted by kind, namespace and name.
    pub fn iter(&self) -> impl Iterator<Item = &Desired> {
        self.set.iter().map(|e| &*e.0)
    }

    /// One object by kind, namespace and name.
    pub fn get(&self, key: &OutKey) -> Option<&Desired> {
        self.get_shared(key).map(|d| &**d)
    }

    pub(super) fn get_shared(&self, key: &OutKey) -> Option<&Arc<Desired>> {
        self.set.get(&parts(key) as &dyn SortParts).map(|e| &e.0)
    }

    /// Puts `d` in, giving back the object it replaced.
    pub(super) fn insert(&mut self, d: Arc<Desired>) -> Option<Arc<Desired>> {
        self.set.insert(Entry(d)).map(|e| e.0)
    }

    /// Takes an object out, giving it back.
    pub(super) fn remove(&mut self, key: &OutKey) -> Option<Arc<Desired>> {
        self.set.remove(&parts(key) as &dyn SortParts).map(|e| e.0)
    }
}

impl FromIterator<Desired> for DesiredSet {
    fn from_iter<I: IntoIterator<Item = Desired>>(iter: I) -> Self {
        let mut set = DesiredSet::default();
        for d in iter {
            set.insert(Arc::new(d));
        }
        set
    }
}

impl From<Vec<Desired>> for DesiredSet {
    fn from(v: Vec<Desired>) -> Self {
        v.into_iter().collect()
    }
}

impl PartialEq for DesiredSet {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl std::fmt::Debug for DesiredSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &'a DesiredSet {
    type Item = &'a Desired;
    type IntoIter = Box<dyn Iterator<Item = &'a Desired> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

/// An object the rules want in the cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    /// Its kind.
    pub kind: OutputKind,
    /// Namespace; empty for cluster-scoped kinds.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The rule that emitted it (shared by its objects).
    pub rule: Arc<str>,
    /// The trigger it was rendered for (`Kind.group/[ns/]name`; shared by
    /// the trigger's outputs).
    pub trigger: Option<Arc<str>>,
    /// The output of the rule that emitted it, e.g. `spec.outputs[0]`
    /// (shared by its objects).
    pub field: Arc<str>,
    /// Set when rendering found it must be refused (a `*` from data): the
    /// field and why. Policy then drops and revokes it.
    pub refusal: Option<error::FieldError>,
    /// The full manifest, with provenance (shared: evaluations reuse it).
    pub object: Manifest,
}

impl Desired {
    /// Whether it is a binding rendered with no subjects.
    pub fn has_no_subjects(&self) -> bool {
        matches!(self.object.body(), super::manifest::Body::Binding { subjects, .. } if subjects.is_empty())
    }

    /// The notice of a binding rendered with no subjects
    /// ([`error::ErrorKind::NoSubjects`]), for the report of `rule`; the same in
    /// the reference and the engine.
    pub fn no_subjects_notice(&self, rule: &str) -> Option<EngineError> {
        if !self.has_no_subjects() {
            return None;
        }
        let object = if self.namespace.is_empty() {
            format!("{} {}", self.kind.as_str(), self.name)
        } else {
            format!("{} {}/{}", self.kind.as_str(), self.namespace, self.name)
        };
        Some(EngineError {
            kind: error::ErrorKind::NoSubjects,
            rule: rule.to_string(),
            field: self.field.to_string(),
            trigger: self.trigger.as_deref().map(str::to_string),
            message: format!(
                "{object} is rendered with no subjects: it grants no one; the subjects it \
                 expects were not found (a missing object, or a param naming the wrong \
                 namespace: check --param / RBAC_RULES_PARAM_*)"
            ),
        })
    }
}

/// Where a rule stands after an evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleState {
    /// Evaluated; some triggers may still have failed.
    Evaluated,
    /// Above the configured manage level: its objects are left alone.
    Inactive,
    /// Held back by the caller (see [`Options::held`]): objects left alone.
    Held,
    /// Invalid or in a dependency cycle: nothing evaluated, its objects preserved.
    Failed,
}

/// What happened to one rule.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleReport {
    /// Overall state.
    pub state: RuleState,
    /// Objects that matched the trigger (including paused ones).
    pub matched_triggers: usize,
    /// Objects emitted.
    pub outputs: usize,
    /// Every error, rule-level and per trigger.
    pub errors: Vec<EngineError>,
    /// What the rule skipped on purpose (`require`, `extract` with
    /// `unmatched: warn`), per trigger; the rest was rendered.
    pub warnings: Vec<EngineWarning>,
    /// Triggers whose outputs must be left as they are: paused, being
    /// deleted, or failed to render.
    pub kept_triggers: BTreeSet<String>,
    /// Whether the static (trigger-less) output set failed and is preserved.
    pub static_kept: bool,
    /// What is not an error of the rule but needs a person: an aggregated
    /// role of the rule collects roles no rule manages that policy would
    /// refuse ([`ErrorKind::UnmanagedAggregation`]), or one of its bindings
    /// is rendered with no subjects ([`ErrorKind::NoSubjects`]). Nothing
    /// is refused or preserved for it.
    pub notices: Vec<EngineError>,
}

impl RuleReport {
    /// An empty report in `state`.
    pub fn new(state: RuleState) -> Self {
        RuleReport {
            state,
            matched_triggers: 0,
            outputs: 0,
            errors: Vec::new(),
            warnings: Vec::new(),
            kept_triggers: BTreeSet::new(),
            static_kept: false,
            notices: Vec::new(),
        }
    }
}

/// The result of evaluating every rule.
///
/// An *error* (invalid rule, template error, conflict, …) keeps: the
/// objects the failing rule or trigger made before stay as they are (see
/// [`Evaluation::keeps`]). A *refusal* by policy
/// ([`ErrorKind::EscalationDenied`]) revokes: the refused object is not
/// desired, its trigger is not preserved for it, and it is listed in
/// [`Evaluation::revoked`] so that the caller deletes the live copy.
#[derive(Clone, Debug, Default)]
pub struct Evaluation {
    /// Desired objects, sorted by kind, namespace and name.
    pub desired: DesiredSet,
    /// Per rule, by name; shared (by the memo and the evaluations it
    /// returns), not copied: a copy is thousands of trigger names.
    pub reports: Arc<BTreeMap<String, RuleReport>>,
    /// Objects two rules or triggers both emit: neither copy is desired and
    /// the live object must be left alone.
    pub contested: BTreeSet<OutKey>,
    /// Objects policy refuses, to be deleted whatever keeps them: every
    /// refused output, and every live managed object (in the observed
    /// store) whose content policy now refuses — even when its rule or
    /// trigger is preserved, paused, failed or held. Keyed by kind, namespace
    /// and name, with the reason.
    pub revoked: BTreeMap<OutKey, String>,
    /// Objects whose desired content or presence differs from the previous
    /// evaluation made with the same memo (every desired object for a
    /// fresh memo), sorted.
    pub changed: Vec<OutKey>,
}

impl Evaluation {
    /// Every error, in rule order.
    pub fn errors(&self) -> impl Iterator<Item = &EngineError> {
        self.reports.values().flat_map(|r| r.errors.iter())
    }

    /// Every notice, in rule order (see [`RuleReport::notices`]).
    pub fn notices(&self) -> impl Iterator<Item = &EngineError> {
        self.reports.values().flat_map(|r| r.notices.iter())
    }

    /// Every warning, in rule order.
    pub fn warnings(&self) -> impl Iterator<Item = &EngineWarning> {
        self.reports.values().flat_map(|r| r.warnings.iter())
    }

    /// Whether a live object carrying this provenance must be left as it
    /// is rather than pruned when it is not desired: its rule is inactive,
    /// failed, or its trigger is paused, deleting or failed. An object of a
    /// rule that no longer exists may be pruned.
    pub fn keeps(&self, rule: &str, trigger: Option<&str>) -> bool {
        match self.reports.get(rule) {
            None => false,
            Some(r) => match r.state {
                RuleState::Inactive | RuleState::Held | RuleState::Failed => true,
                RuleState::Evaluated => match trigger {
                    Some(t) => r.kept_triggers.contains(t),
                    None => r.static_kept,
                },
            },
        }
    }
}

/// Whether any of `selectors` selects `obj` by its labels.
pub(crate) fn selects(selectors: &[LabelSelector], obj: &Value) -> bool {
    let labels = obj["metadata"]["labels"].as_object();
    selectors
        .iter()
        .any(|s| crate::selector::matches_json(s, labels))
}

/// An object a reader sees: emitted in this evaluation, or observed.
/// Emitted objects are read in their compact form; JSON is built only
/// for a reader that asks for it (`View::json`).
#[derive(Clone, Copy)]
pub(crate) enum Seen<'a> {
    Emitted(&'a Manifest),
    Observed(&'a Arc<Value>),
}

impl<'a> Seen<'a> {
    /// metadata.name.
    pub fn name(&self) -> &'a str {
        match self {
            Seen::Emitted(m) => m.name(),
            Seen::Observed(o) => o["metadata"]["name"].as_str().unwrap_or_default(),
        }
    }

    /// Whether any of `selectors` (validated) selects it by its labels.
    pub fn selected_by(&self, selectors: &[LabelSelector]) -> bool {
        match self {
            Seen::Emitted(m) => m.labels().selected_by(selectors),
            Seen::Observed(o) => selects(selectors, o),
        }
    }
}

/// An output policy refused: which rule and trigger emitted it, the
/// field of the rule's spec, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The emitting rule's place in evaluation order.
    pub rule: usize,
    /// The trigger (`None`: a static rule).
    pub trigger: Option<String>,
    /// The field of the rule's spec that made the output.
    pub field: String,
    /// Why policy refuses it.
    pub why: String,
}

/// The engine's name of a tenant rule: `<namespace>/<name>` (a cluster
/// rule's name never holds a `/`, so reports cannot collide).
pub fn rule_name(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The namespace of a tenant rule, by its engine name.
pub fn rule_namespace(rule: &str) -> Option<&str> {
    rule.split_once('/').map(|(ns, _)| ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desired(kind: OutputKind, ns: &str, name: &str, rule: &str) -> Desired {
        let mut v = serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": kind.as_str(),
            "metadata": {"name": name},
        });
        if !ns.is_empty() {
            v["metadata"]["namespace"] = ns.into();
        }
        Desired {
            kind,
            namespace: ns.into(),
            name: name.into(),
            rule: rule.into(),
            trigger: None,
            field: "spec.outputs[0]".into(),
            refusal: None,
            object: Manifest::from_value(&v).expect("a manifest"),
        }
    }

    fn key(kind: OutputKind, ns: &str, name: &str) -> OutKey {
        (kind, ns.into(), name.into())
    }

    #[test]
    fn the_set_is_sorted_and_looked_up_by_kind_namespace_and_name() {
        let mut set: DesiredSet = vec![
            desired(OutputKind::RoleBinding, "a", "x", "r"),
            desired(OutputKind::Role, "b", "x", "r"),
            desired(OutputKind::Role, "a", "y", "r"),
            desired(OutputKind::ClusterRole, "", "z", "r"),
        ]
        .into();
        let order: Vec<(&str, &str, &str)> = set
            .iter()
            .map(|d| (d.kind.as_str(), d.namespace.as_str(), d.name.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                ("ClusterRole", "", "z"),
                ("Role", "a", "y"),
                ("Role", "b", "x"),
                ("RoleBinding", "a", "x"),
            ]
        );
        assert!(set.get(&key(OutputKind::Role, "b", "x")).is_some());
        assert!(set.get(&key(OutputKind::RoleBinding, "b", "x")).is_none());

        // Inserting an object with the same key replaces it.
        set.insert(Arc::new(desired(OutputKind::Role, "b", "x", "other")));
        assert_eq!(set.len(), 4);
        let got = set.get(&key(OutputKind::Role, "b", "x")).expect("kept");
        assert_eq!(&*got.rule, "other");

        set.remove(&key(OutputKind::Role, "b", "x"));
        assert_eq!(set.len(), 3);
        assert!(set.get(&key(OutputKind::Role, "b", "x")).is_none());
        assert!(set.get(&key(OutputKind::Role, "a", "y")).is_some());
    }
}
