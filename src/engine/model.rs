//! The data model every stage shares: what an evaluation produces
//! (desired objects, per-rule reports, contested and revoked objects) and
//! how outputs are identified.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::error::{self, EngineError, EngineWarning};
use super::manifest::Manifest;
use crate::api::OutputKind;

/// A key identifying an emitted object: kind, namespace and name.
pub type OutKey = (OutputKind, String, String);

/// Sort key of desired objects: kind name, namespace, name.
type SortKey = (&'static str, String, String);

/// The sort key of an output key.
pub(super) fn sort_key(key: &OutKey) -> SortKey {
    (key.0.as_str(), key.1.clone(), key.2.clone())
}

/// Desired objects sorted by kind, namespace and name; cheap to clone
/// (a persistent map shared between evaluations).
#[derive(Clone, Default)]
pub struct DesiredSet {
    map: imbl::OrdMap<SortKey, Arc<Desired>>,
}

impl DesiredSet {
    /// Number of objects.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every object, sorted by kind, namespace and name.
    pub fn iter(&self) -> impl Iterator<Item = &Desired> {
        self.map.values().map(|d| &**d)
    }

    /// One object by kind, namespace and name.
    pub fn get(&self, key: &OutKey) -> Option<&Desired> {
        self.map.get(&sort_key(key)).map(|d| &**d)
    }

    pub(super) fn get_shared(&self, key: &OutKey) -> Option<&Arc<Desired>> {
        self.map.get(&sort_key(key))
    }

    pub(super) fn insert(&mut self, d: Arc<Desired>) {
        let key = (d.kind.as_str(), d.namespace.clone(), d.name.clone());
        self.map.insert(key, d);
    }

    pub(super) fn remove(&mut self, key: &OutKey) {
        self.map.remove(&sort_key(key));
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
    /// The rule that emitted it.
    pub rule: String,
    /// The trigger it was rendered for (`Kind.group/[ns/]name`).
    pub trigger: Option<String>,
    /// The output of the rule that emitted it, e.g. `spec.outputs[0]`.
    pub field: String,
    /// Set when rendering found it must be refused (a `*` from data): the
    /// field and why. Policy then drops and revokes it.
    pub refusal: Option<error::FieldError>,
    /// The full manifest, with provenance (shared: evaluations reuse it).
    pub object: Manifest,
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
    /// Invalid or in a dependency cycle: nothing evaluated, its objects kept.
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
    /// Whether the static (trigger-less) output set failed and is kept.
    pub static_kept: bool,
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
        }
    }
}

/// The result of evaluating every rule.
///
/// An *error* (invalid rule, template error, conflict, …) keeps: the
/// objects the failing rule or trigger made before stay as they are (see
/// [`Evaluation::keeps`]). A *refusal* by policy
/// ([`ErrorKind::EscalationDenied`]) revokes: the refused object is not
/// desired, its trigger is not kept for it, and it is listed in
/// [`Evaluation::revoked`] so that the caller deletes the live copy.
#[derive(Clone, Debug, Default)]
pub struct Evaluation {
    /// Desired objects, sorted by kind, namespace and name.
    pub desired: DesiredSet,
    /// Per rule, by name.
    pub reports: BTreeMap<String, RuleReport>,
    /// Objects two rules or triggers both emit: neither copy is desired and
    /// the live object must be left alone.
    pub contested: BTreeSet<(OutputKind, String, String)>,
    /// Objects policy refuses, to be deleted whatever keeps them: every
    /// refused output, and every live managed object (in the observed
    /// store) whose content policy now refuses — even when its rule or
    /// trigger is kept, paused, failed or held. Keyed by kind, namespace
    /// and name, with the reason.
    pub revoked: BTreeMap<(OutputKind, String, String), String>,
    /// Objects whose desired content or presence differs from the previous
    /// evaluation made with the same memo (every desired object for a
    /// fresh memo), sorted.
    pub changed: Vec<(OutputKind, String, String)>,
}

impl Evaluation {
    /// Every error, in rule order.
    pub fn errors(&self) -> impl Iterator<Item = &EngineError> {
        self.reports.values().flat_map(|r| r.errors.iter())
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
