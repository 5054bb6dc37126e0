//! Incremental evaluation: what an evaluation remembers for the next one.
//!
//! Every trigger's outcome is kept with the *reads* its render made (which
//! objects of which kind it looked at, through which filters). The next
//! evaluation finds the objects that changed (by resourceVersion, or by
//! content where there is none) and renders again only the triggers whose
//! own object changed or whose reads a changed object touches; changes to
//! emitted ClusterRoles cascade to the rules that copy from them. The result
//! is the same as a full evaluation (a test checks this on random changes):
//! a full evaluation *is* an incremental one from an empty memo.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::error::{FieldError, FieldWarning};
use super::store::{GroupKind, ObjectKey, ObjectStore, group_of};
use super::{Desired, RuleState};
use crate::api::OutputKind;

/// A key identifying an emitted object.
pub(super) type OutKey = (OutputKind, String, String);

static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh engine identity: a memo made by one engine is never reused by
/// another (rules or options may differ).
pub(super) fn next_engine_id() -> u64 {
    NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed)
}

/// What an evaluation leaves for the next: pass the same `Memo` to
/// [`super::Engine::evaluate_incremental`] each time. A memo made by another
/// engine is discarded, so rebuilding the engine (rules changed) starts over.
#[derive(Default)]
pub struct Memo {
    pub(super) engine: u64,
    /// Fingerprint of every observed object seen last time.
    fingerprints: HashMap<GroupKind, HashMap<ObjectKey, u64>>,
    pub(super) rules: HashMap<String, RuleMemo>,
    /// Per rule: what other rules' views depend on (see `View::hidden`).
    pub(super) signatures: HashMap<String, Signature>,
    pub(super) contested: BTreeSet<OutKey>,
    /// Renders (triggers and static sets) the last evaluation made.
    pub(super) renders: usize,
    /// Policy verdicts on emitted objects that depend on nothing else, by
    /// the address of the shared manifest (held, so it cannot be reused).
    pub(super) verdicts: HashMap<usize, (Arc<Value>, Option<String>)>,
}

impl Memo {
    /// An empty memo: the next evaluation renders everything.
    pub fn new() -> Memo {
        Memo::default()
    }

    /// How many trigger (or static) output sets the last evaluation
    /// rendered; the rest were reused.
    pub fn renders(&self) -> usize {
        self.renders
    }

    /// Starts over for `engine` when the memo is another engine's. Returns
    /// whether it was reset (everything counts as changed then).
    pub(super) fn adopt(&mut self, engine: u64) -> bool {
        if self.engine == engine {
            return false;
        }
        *self = Memo {
            engine,
            ..Memo::default()
        };
        true
    }

    /// The observed objects that differ from last time (added, changed or
    /// gone), remembering the new fingerprints.
    pub(super) fn observe(&mut self, observed: &ObjectStore) -> Changes {
        let mut changes = Changes::default();
        let mut next: HashMap<GroupKind, HashMap<ObjectKey, u64>> = HashMap::new();
        for gk in observed.kinds() {
            let before = self.fingerprints.remove(gk).unwrap_or_default();
            let mut now = HashMap::with_capacity(before.len());
            for obj in observed.list(gk) {
                let Some(key) = super::store::key_of(obj) else {
                    continue;
                };
                let fp = fingerprint(obj);
                if before.get(&key) != Some(&fp) {
                    changes.add(gk, key.clone());
                }
                now.insert(key, fp);
            }
            for key in before.keys() {
                if !now.contains_key(key) {
                    changes.add(gk, key.clone());
                }
            }
            next.insert(gk.clone(), now);
        }
        // Kinds that vanished altogether.
        for (gk, before) in self.fingerprints.drain() {
            for key in before.into_keys() {
                changes.add(&gk, key);
            }
        }
        self.fingerprints = next;
        changes
    }
}

/// resourceVersion changes with every write; objects without one (offline
/// renders, tests) are compared by content.
fn fingerprint(obj: &Value) -> u64 {
    let mut h = DefaultHasher::new();
    match obj["metadata"]["resourceVersion"].as_str() {
        Some(rv) if !rv.is_empty() => rv.hash(&mut h),
        _ => obj.to_string().hash(&mut h),
    }
    h.finish()
}

/// What other rules' views depend on: a change re-renders their readers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Signature {
    pub state: RuleState,
    pub kept_triggers: BTreeSet<String>,
    pub static_kept: bool,
}

/// One rule's remembered outcomes.
#[derive(Default)]
pub(super) struct RuleMemo {
    /// By the trigger's namespace and name (view order), with its
    /// `Kind.group/[ns/]name`.
    pub triggers: BTreeMap<ObjectKey, (String, TriggerMemo)>,
    pub static_set: Option<TriggerMemo>,
}

/// One trigger's (or the static set's) outcome and what producing it read.
#[derive(Clone, Debug)]
pub(super) struct TriggerMemo {
    pub outcome: Outcome,
    pub reads: Vec<Read>,
    /// What the render skipped with a warning, sorted and de-duplicated.
    pub warnings: Vec<FieldWarning>,
}

/// What became of one trigger.
#[derive(Clone, Debug)]
pub(super) enum Outcome {
    /// The object does not trigger the rule.
    NoMatch,
    /// Testing whether it triggers failed (a condition's template).
    MatchError(FieldError),
    /// It triggers, but is paused or being deleted.
    Frozen,
    /// It triggers; rendering failed.
    Failed(FieldError),
    /// It triggers; these objects were rendered.
    Rendered(Vec<Desired>),
}

impl Outcome {
    pub fn outputs(&self) -> &[Desired] {
        match self {
            Outcome::Rendered(d) => d,
            _ => &[],
        }
    }
}

/// The controller ownerReference a related-object query required.
#[derive(Clone, Debug)]
pub(super) struct Owner {
    pub uid: String,
    pub gk: Option<GroupKind>,
    pub name: String,
}

impl Owner {
    pub fn of(obj: &Value) -> Owner {
        Owner {
            uid: obj["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            gk: GroupKind::of(obj),
            name: obj["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        }
    }

    /// Whether `obj` has a controller ownerReference to this owner (by uid
    /// when both have one, else by group, kind and name).
    pub fn controls(&self, obj: &Value) -> bool {
        obj["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["controller"].as_bool() == Some(true))
            .any(|r| {
                let uid = r["uid"].as_str().unwrap_or_default();
                if !uid.is_empty() && !self.uid.is_empty() {
                    return uid == self.uid;
                }
                let gk = GroupKind::new(
                    group_of(r["apiVersion"].as_str().unwrap_or_default()),
                    r["kind"].as_str().unwrap_or_default(),
                );
                Some(gk) == self.gk && r["name"].as_str() == Some(self.name.as_str())
            })
    }
}

/// One lookup a render made: objects of a kind (in a namespace), narrowed
/// by names, a selector and an owner, and the objects it found.
#[derive(Clone, Debug)]
pub(super) struct Read {
    pub gk: GroupKind,
    pub namespace: Option<String>,
    pub names: Option<BTreeSet<String>>,
    pub selector: Option<LabelSelector>,
    /// Names *or* selector (rulesFrom) rather than names *and* selector.
    pub either: bool,
    pub owner: Option<Owner>,
    pub hits: BTreeSet<ObjectKey>,
}

impl Read {
    /// Whether `obj` passes this lookup's filters (its `where` conditions
    /// aside: passing these is enough to re-render).
    pub fn passes(&self, obj: &Value) -> bool {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let by_name = self.names.as_ref().map(|n| n.contains(name));
        if self.either {
            let by_selector = self
                .selector
                .as_ref()
                .is_some_and(|s| matches_labels(s, obj));
            (by_name.unwrap_or(false) || by_selector) && self.owner_ok(obj)
        } else {
            by_name.unwrap_or(true) && self.passes_unnamed(obj)
        }
    }

    /// Whether `obj` passes the selector and owner filters, whatever its
    /// name.
    pub fn passes_unnamed(&self, obj: &Value) -> bool {
        self.selector
            .as_ref()
            .is_none_or(|s| matches_labels(s, obj))
            && self.owner_ok(obj)
    }

    fn owner_ok(&self, obj: &Value) -> bool {
        self.owner.as_ref().is_none_or(|o| o.controls(obj))
    }
}

fn matches_labels(selector: &LabelSelector, obj: &Value) -> bool {
    crate::selector::matches_json(selector, obj["metadata"]["labels"].as_object())
}

/// Objects that changed since the last evaluation, by kind; `whole` kinds
/// changed in ways no key list captures (a rule's kept objects).
#[derive(Default, Debug)]
pub(super) struct Changes {
    pub keys: HashMap<GroupKind, BTreeSet<ObjectKey>>,
    pub whole: HashSet<GroupKind>,
    pub all: bool,
}

impl Changes {
    pub fn add(&mut self, gk: &GroupKind, key: ObjectKey) {
        self.keys.entry(gk.clone()).or_default().insert(key);
    }

    pub fn contains(&self, gk: &GroupKind, key: &ObjectKey) -> bool {
        self.all || self.whole.contains(gk) || self.keys.get(gk).is_some_and(|k| k.contains(key))
    }
}
