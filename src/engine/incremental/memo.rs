//! Incremental evaluation: what an evaluation remembers for the next one.
//!
//! Every trigger's outcome is cached with the *reads* its render made (which
//! objects of which kind it looked at, through which filters), indexed in
//! reverse: from an object, and from a shared filter (selector, owner), to
//! the triggers that could see it. The next evaluation asks the store's
//! journal what changed and renders again only the triggers those changes
//! reach; changes to emitted objects reach the rules after the emitter the
//! same way. The emitted objects, conflicts, policy verdicts and reports
//! are cached and updated by the difference, so an evaluation costs what
//! changed, not the size of the cluster. A full evaluation *is* an
//! incremental one from an empty memo (a test checks they agree).

use std::borrow::{Borrow, Cow};
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::caches::Caches;
use crate::api::OutputKind;
use crate::engine::error::{FieldError, FieldWarning};
use crate::engine::fast_hash::{HashMap, HashSet};
use crate::engine::limits;
use crate::engine::model::{Desired, DesiredSet, Evaluation, OutKey, Refusal, RuleReport, Seen};
use crate::engine::store::controller_uid;
use crate::engine::store::{GroupKind, ObjectKey, group_of};
use crate::engine::time::creation_time;

static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh engine identity: a memo made by one engine is never reused by
/// another (rules or options may differ).
pub(in crate::engine) fn next_engine_id() -> u64 {
    NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed)
}

/// What the read index asks of the world a rule sees: the object under a
/// key, compact or as JSON (built only when asked).
pub(in crate::engine) trait Lookup<'a> {
    /// The object of kind `gk` under `key`, as the reader sees it.
    fn get_seen(&self, gk: &GroupKind, key: &ObjectKey) -> Option<Seen<'a>>;
    /// That object as JSON.
    fn get_value(&self, gk: &GroupKind, key: &ObjectKey) -> Option<Cow<'a, Value>>;
}

/// A trigger's identity within its rule: its namespace and name, `None`
/// for the static (trigger-less) output set.
pub(in crate::engine) type TKey = Option<ObjectKey>;

/// What an evaluation leaves for the next: pass the same `Memo` to
/// [`crate::engine::Engine::evaluate_incremental`] each time. A memo made by another
/// engine is discarded, so rebuilding the engine (rules changed) starts over.
#[derive(Default)]
pub struct Memo {
    pub(in crate::engine) engine: u64,
    /// The store version the last evaluation saw.
    pub(in crate::engine) seen: Option<(u64, u64)>,
    /// Per runnable rule, in evaluation order.
    pub(in crate::engine) rules: Vec<RuleMemo>,
    /// Who emits each object, in rule and trigger order.
    pub(in crate::engine) emitters: Emitters,
    /// Objects with more than one emitter: the emitters' rules and triggers.
    pub(in crate::engine) contested: BTreeMap<OutKey, Vec<(usize, Option<String>)>>,
    /// Outputs policy refused, and by whom.
    pub(in crate::engine) refused: BTreeMap<OutKey, Refusal>,
    /// Notices on aggregated roles (see [`RuleMemo::notices`]): the rule
    /// (when it runs) and the text.
    pub(in crate::engine) noticed: BTreeMap<OutKey, (Option<usize>, String)>,
    /// Live managed objects policy refuses, with why.
    pub(in crate::engine) live_revoked: BTreeMap<OutKey, String>,
    /// Everything revoked: refused outputs, else refused live objects.
    pub(in crate::engine) revoked: BTreeMap<OutKey, String>,
    /// Objects (desired or live) whose verdict depends on other objects:
    /// aggregated ClusterRoles, with the selections they read (by JSON),
    /// and bindings under an allow-list (with none: any role change).
    pub(in crate::engine) dependents: BTreeMap<OutKey, BTreeSet<String>>,
    /// The allow-list's effective rules (an aggregated list's, as last
    /// computed); `None` without an allow-list or before the first
    /// evaluation.
    pub(in crate::engine) allow_rules: Option<Vec<k8s_openapi::api::rbac::v1::PolicyRule>>,
    pub(in crate::engine) desired: DesiredSet,
    pub(in crate::engine) reports: Arc<BTreeMap<String, RuleReport>>,
    /// The last result, returned again when nothing changed.
    pub(in crate::engine) last: Option<Evaluation>,
    /// The views' caches (policy rules, denials, copies, selections).
    pub(in crate::engine) caches: Caches,
    /// Size of the rules cache after it was last pruned.
    pub(in crate::engine) rules_cache_pruned: usize,
    /// Renders (triggers and static sets) the last evaluation made.
    pub(in crate::engine) renders: usize,
    /// Made by [`Memo::one_shot`]: keeps no read index.
    pub(in crate::engine) one_shot: bool,
    /// Triggers shed by a total (`limits::shed`): they fail, unrendered,
    /// until the memo starts afresh.
    pub(in crate::engine) shed: crate::engine::limits::Shed,
    /// The evaluation's outputs' bytes as `limits::shed` last measured them,
    /// and the rules' `rendered` then.
    pub(in crate::engine) measured: Option<(usize, usize)>,
    /// What the engine that made it is made of: another engine of the same
    /// rules takes it over (see [`super::adopt`]).
    pub(in crate::engine) stamp: Option<Arc<super::stamp::EngineStamp>>,
    /// Set when another engine took it over, until its first evaluation:
    /// the rules that changed.
    pub(in crate::engine) adopted: Option<super::stamp::Adopted>,
    /// Outputs (desired or live) policy judged, over every evaluation
    /// since the memo last started afresh (see [`Memo::verdicts`]).
    pub(in crate::engine) verdicts: u64,
}

impl Memo {
    /// An empty memo: the next evaluation renders everything.
    pub fn new() -> Memo {
        Memo::default()
    }

    /// A memo for one evaluation (a one-shot render): the evaluation is the
    /// same, but it records no index of what triggers read, which only
    /// incremental evaluations use. Evaluating with it again renders
    /// everything again.
    pub fn one_shot() -> Memo {
        Memo {
            one_shot: true,
            ..Memo::default()
        }
    }

    /// The allow-list's effective rules as last computed (none without an
    /// allow-list).
    pub(in crate::engine) fn allow_rules(&self) -> &[k8s_openapi::api::rbac::v1::PolicyRule] {
        self.allow_rules.as_deref().unwrap_or_default()
    }

    /// How many trigger (or static) output sets the last evaluation
    /// rendered; the rest were reused.
    pub fn renders(&self) -> usize {
        self.renders
    }

    /// Entries the index of observed objects by owner holds (see
    /// [`super::owners`]): one per ownerReference of the kinds read
    /// through an owner filter, bounded by the cluster.
    pub fn owner_index_entries(&self) -> usize {
        self.caches.owners.borrow().entries()
    }

    /// Outputs policy judged, counted over the evaluations since the memo
    /// last started afresh (a change of rules or everything starts it
    /// afresh): a change costs the verdicts it can alter, not one per
    /// output.
    pub fn verdicts(&self) -> u64 {
        self.verdicts
    }

    /// Selections a changed ClusterRole was checked against, counted over
    /// every evaluation with this memo (see `View::refresh_selections`):
    /// a change costs the selections that hold or can match the role.
    pub fn selections_visited(&self) -> u64 {
        self.caches.work.get().selections_visited
    }

    /// Members read out of cached ClusterRole selections, counted over
    /// every evaluation with this memo: a verdict visits the members that
    /// can earn a refusal, not every member.
    pub fn selection_members_visited(&self) -> u64 {
        self.caches.work.get().members_visited
    }

    /// Filings the index of cached ClusterRole selections holds, over every
    /// reader: at most one per selector and value it names, so as large
    /// as the selections, whatever the cluster.
    pub fn selection_index_entries(&self) -> usize {
        self.caches
            .selections
            .borrow()
            .values()
            .map(|r| r.index.entries())
            .sum()
    }

    /// Bytes the texts of its engine's rules hold (see [`super::adopt`]):
    /// what a new engine compares its rules with, shared with the engine.
    pub fn rule_stamp_bytes(&self) -> usize {
        self.stamp.as_ref().map_or(0, |s| s.bytes())
    }

    /// Whether every rule's and the evaluation's totals are within
    /// `limits` without measuring them: then nothing needs shedding. What
    /// the memo counts per trigger (every output whole, a rule list shared
    /// by many counted for each) bounds what they hold from above; the
    /// evaluation's bytes as last measured plus what was rendered since
    /// bound them too.
    /// `namespaces` holds each rule's namespace (a tenant rule's), by its
    /// place in evaluation order.
    pub(in crate::engine) fn within_totals(
        &self,
        limits: &crate::engine::Limits,
        namespaces: &[Option<&str>],
    ) -> bool {
        let (mut bytes, mut objects, mut rendered) = (0usize, 0usize, 0usize);
        let mut per_namespace: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for (i, r) in self.rules.iter().enumerate() {
            if r.held > limits.bytes_per_rule || r.emitted > limits.objects_per_rule {
                return false;
            }
            if let Some(Some(ns)) = namespaces.get(i) {
                let t = per_namespace.entry(ns).or_default();
                *t = (t.0.saturating_add(r.held), t.1.saturating_add(r.emitted));
                if t.0 > limits.bytes_per_namespace || t.1 > limits.objects_per_namespace {
                    return false;
                }
            }
            bytes = bytes.saturating_add(r.held);
            objects = objects.saturating_add(r.emitted);
            rendered = rendered.saturating_add(r.rendered);
        }
        if let Some((measured, then)) = self.measured {
            bytes = bytes.min(measured.saturating_add(rendered.saturating_sub(then)));
        }
        bytes <= limits.bytes_per_evaluation && objects <= limits.objects_per_evaluation
    }

    /// Notes the evaluation's outputs' bytes just measured.
    pub(in crate::engine) fn measured(&mut self, bytes: usize) {
        let rendered = self.rules.iter().map(|r| r.rendered).sum();
        self.measured = Some((bytes, rendered));
    }
}

/// An output key by its parts, borrowed: a map keyed by [`OutKey`] is
/// looked up with one without building a key (two strings) per lookup.
pub(in crate::engine) trait KeyParts {
    fn parts(&self) -> (OutputKind, &str, &str);
}

impl KeyParts for OutKey {
    fn parts(&self) -> (OutputKind, &str, &str) {
        (self.0, &self.1, &self.2)
    }
}

impl KeyParts for (OutputKind, &str, &str) {
    fn parts(&self) -> (OutputKind, &str, &str) {
        *self
    }
}

impl<'a> Borrow<dyn KeyParts + 'a> for OutKey {
    fn borrow(&self) -> &(dyn KeyParts + 'a) {
        self
    }
}

impl<'a> Borrow<dyn KeyParts + 'a> for Arc<OutKey> {
    fn borrow(&self) -> &(dyn KeyParts + 'a) {
        &**self
    }
}

/// Hashes as the [`OutKey`] with the same parts does (a `String` hashes as
/// its `str`).
impl Hash for dyn KeyParts + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.parts().hash(state);
    }
}

impl PartialEq for dyn KeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn KeyParts + '_ {}

/// Who emits each object: hashed for lookups (every copied role is one),
/// ordered for listing a kind. Both share one copy of each key.
#[derive(Default)]
pub(in crate::engine) struct Emitters {
    by_key: HashMap<Arc<OutKey>, Vec<Emit>>,
    ordered: BTreeSet<Arc<OutKey>>,
}

impl Emitters {
    pub fn get(&self, key: &OutKey) -> Option<&Vec<Emit>> {
        self.by_key.get(key)
    }

    /// The emitters of the object of `kind` with this key.
    pub fn get_parts(&self, kind: OutputKind, key: &ObjectKey) -> Option<&Vec<Emit>> {
        let parts = (kind, key.0.as_str(), key.1.as_str());
        self.by_key.get(&parts as &dyn KeyParts)
    }

    /// The key of the object of `kind` with this key, shared, when
    /// something emits it.
    pub fn shared_key(&self, kind: OutputKind, key: &ObjectKey) -> Option<&Arc<OutKey>> {
        let parts = (kind, key.0.as_str(), key.1.as_str());
        self.by_key
            .get_key_value(&parts as &dyn KeyParts)
            .map(|(k, _)| k)
    }

    /// The keys, shared.
    pub fn shared_keys(&self) -> impl Iterator<Item = &Arc<OutKey>> {
        self.by_key.keys()
    }

    /// Keys with more than one emitter.
    pub fn contested(&self) -> impl Iterator<Item = &OutKey> {
        self.by_key
            .iter()
            .filter(|(_, es)| es.len() >= 2)
            .map(|(k, _)| &**k)
    }

    /// Keys from `start` on, in order.
    pub fn range_from(&self, start: OutKey) -> impl Iterator<Item = &OutKey> {
        self.ordered.range::<OutKey, _>(start..).map(|k| &**k)
    }

    /// Changes the emitters of `key`; an object left with none is dropped.
    /// A key given by value is not copied when it is new.
    pub fn update(&mut self, key: Cow<'_, OutKey>, f: impl FnOnce(&mut Vec<Emit>)) {
        match self.by_key.get_mut(&*key) {
            Some(list) => {
                f(list);
                if list.is_empty() {
                    self.by_key.remove(&*key);
                    self.ordered.remove(&*key);
                }
            }
            None => self.insert_new(key.into_owned(), f),
        }
    }

    fn insert_new(&mut self, key: OutKey, f: impl FnOnce(&mut Vec<Emit>)) {
        // Most objects have one emitter: room for one, not the default four.
        let mut list = Vec::with_capacity(1);
        f(&mut list);
        if !list.is_empty() {
            let key = Arc::new(key);
            self.ordered.insert(Arc::clone(&key));
            self.by_key.insert(key, list);
        }
    }
}

/// One emitter of an object.
#[derive(Clone, Debug)]
pub(in crate::engine) struct Emit {
    /// The rule's index in evaluation order.
    pub rule: usize,
    /// Shared by the trigger's outputs.
    pub trigger: Arc<TKey>,
    pub desired: Arc<Desired>,
}

/// What other rules' views depend on: which triggers keep their live
/// objects (paused, deleting, failed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(in crate::engine) struct Signature {
    /// Triggers whose live objects are preserved.
    pub preserved: BTreeSet<String>,
    /// Whether the static output set's live objects are preserved.
    pub static_preserved: bool,
}

/// One rule's remembered outcomes.
#[derive(Default)]
pub(in crate::engine) struct RuleMemo {
    /// By the trigger's namespace and name (view order), with its
    /// `Kind.group/[ns/]name`.
    pub triggers: BTreeMap<ObjectKey, (String, TriggerMemo)>,
    pub static_set: Option<TriggerMemo>,
    pub index: ReadIndex,
    /// Triggers whose live objects are preserved, from outcomes (not conflicts).
    pub signature: Signature,
    /// Triggers that matched (including paused ones).
    pub matched: usize,
    /// Objects rendered, before conflicts and policy.
    pub emitted: usize,
    /// Bytes those objects hold (see `limits::held`).
    pub held: usize,
    /// Bytes its triggers' outputs held when rendered, added up over the
    /// memo's life (never taken away): how much the evaluation's outputs
    /// can have grown by since a total was last measured.
    pub rendered: usize,
    /// Triggers with an error, a warning or preserved objects: what the report lists.
    pub noted: BTreeSet<ObjectKey>,
    /// Objects of this rule that another emitter contests, by trigger.
    pub conflicts: BTreeSet<(OutKey, Option<String>)>,
    /// Outputs of this rule that policy refused, and why.
    pub refused: BTreeMap<OutKey, Refusal>,
    /// Aggregated roles of this rule that collect roles no rule manages
    /// and policy would refuse: the trigger, the field, the notice.
    pub notices: BTreeMap<OutKey, (Option<String>, String, String)>,
    /// Verdicts on listField items (see [`ItemCache`]).
    pub items: ItemCache,
    /// listField lists and vars shared by the triggers that compute them
    /// from the same inputs (see [`Derived`]).
    pub derived: Derived,
    /// The vars each of the rule's template values reads, by its address
    /// (see `EvalCaches::expansion_key`): the rule's templates do not change while
    /// the memo is its engine's.
    pub deps: HashMap<usize, Option<Vec<String>>>,
    /// Per `forEach` directive (by address): whether nothing in its loop
    /// names its list's root (see `EvalCaches::unseen`).
    pub unseen: HashMap<usize, bool>,
    /// Tests: the derived values and item verdicts the rule freed when it
    /// last ran (what the evaluation shared, looked at after it).
    #[cfg(test)]
    pub freed: Option<(Derived, ItemCache)>,
}

/// [`Derived::prune_after`] prunes once the changed objects could have
/// left one pin in this many dead, or the values cached since hold this
/// share of the bytes the cache held after the last prune (a value made
/// stale is mostly replaced by a new one of its size: a family's type
/// list after a CRD added).
pub(in crate::engine) const PRUNE_SHARE: usize = 16;

/// Values a render derives from its inputs, cached for the next render with
/// the same inputs: a family's revisions all list the family's types, so
/// the list and the vars built from it are computed once, not per
/// trigger. A cached value is lent to the render's context (moved, not
/// copied) and taken back after it. A rule hands them to the next rule
/// that defines them alike; the last one keeps them for the next
/// evaluation, whose first rule of the chain takes them back
/// (`keys::chain_tails`), so a change computes again only the values its
/// objects reach (a changed family member's entries, not the family's).
/// Bounded: by count ([`DERIVED_MAX`]) and bytes ([`DERIVED_BYTES_MAX`])
/// per rule, pruned of what was computed from objects gone.
#[derive(Default)]
pub(in crate::engine) struct Derived {
    /// listField results, by related set and the addresses of the source
    /// objects (trigger, related objects) they read, sorted.
    pub lists: HashMap<(usize, Vec<usize>), ListEntry>,
    /// vars by index and the tokens of the lists they read.
    pub vars: HashMap<(usize, Vec<u64>), VarEntry>,
    /// Expanded template values (output rules) that read only vars: by
    /// the template's address, whether data is marked, and the vars'
    /// tokens; with the bytes expanding charged.
    pub expansions: HashMap<(usize, bool, Vec<u64>), (Value, usize)>,
    /// Nested lists built by a `forEach` that read only cached vars and loop
    /// variables over cached vars (see [`NestedKey`]), with the bytes
    /// expanding charged: the roles of a family that render the same
    /// `resources` list for a group share one.
    pub nested: HashMap<NestedKey, (Value, usize)>,
    /// An output's policy rules checked from a cached expansion (same key),
    /// shared by the outputs that render them: the rules, or the refusal
    /// of a `*` from data.
    pub policies: HashMap<(usize, bool, Vec<u64>), CachedPolicy>,
    /// A role's rules put together entry by entry (see [`Assembly`]):
    /// triggers that render the same entries (a family's members) share one list
    /// (joined, and judged by policy, once) instead of a copy each.
    pub assembled: HashMap<Assembly, Arc<Vec<k8s_openapi::api::rbac::v1::PolicyRule>>>,
    /// The objects whose addresses the keys name, held weakly: an
    /// address is not reused while held, and an object no one else holds
    /// is gone from the cluster (its entries go with it).
    pub pins: HashMap<usize, Weak<Value>>,
    /// Objects changed in the cluster (or by a rule's render) since the
    /// last [`Derived::prune`]: each left at most one pin dead.
    pub changed_since_prune: usize,
    /// Bytes of the values cached since the last prune, and those the
    /// cache held after it (see [`PRUNE_SHARE`]).
    pub bytes_since_prune: usize,
    pub bytes_at_prune: usize,
    /// A listField's entries extracted from one source object (before
    /// its conditions), with their JSON text and what extracting warned:
    /// by related set, whether templates see only its metadata (1) and its
    /// address. A
    /// changed family member's entries are extracted again, not all.
    pub extracts: HashMap<(usize, usize, usize), Extracted>,
    /// `where` verdicts on related objects, by related set and the
    /// addresses of the object and the trigger (0: none, or a `where`
    /// that reads only the object).
    pub verdicts: HashMap<(usize, usize, usize), Verdict>,
    /// The values loops over cached vars bound, by the var's token and the
    /// index: each value's id (see [`Derived::content_id`]).
    pub bound: HashMap<(u64, usize), u64>,
    /// Those values by a hash of their content, each with its id; held as
    /// JSON text (maps are sorted, so equal values have equal text), not as
    /// trees: a tree holds about 640 bytes for every map in it.
    pub contents: HashMap<u64, Vec<(Box<str>, u64)>>,
    /// The last token or id given: neither is ever reused.
    pub next: u64,
}

/// What a role's rule list was put together from: whether it is a
/// namespaced role, and each entry of its template in order, as the key
/// of a cached expansion with checked rules, or else as the JSON text of
/// what the entry expanded to (data marks included). The same parts give
/// the same rules, and put together without a refusal.
pub(in crate::engine) type Assembly = (bool, Vec<AssemblyPart>);

/// One entry of an [`Assembly`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(in crate::engine) enum AssemblyPart {
    /// A cached expansion whose checked rules were reused.
    Cached((usize, bool, Vec<u64>)),
    /// An entry checked in this render, by its expanded JSON.
    Text(String),
}

/// A nested list's key: its template's JSON text, whether data is marked,
/// the tokens of the vars it reads, and each loop variable bound around it
/// with the id of its value (see [`Derived::content_id`]).
pub(in crate::engine) type NestedKey = (Arc<str>, bool, Vec<u64>, Vec<(String, u64)>);

/// A hash of a JSON value's content, for [`Derived::contents`] (values
/// with one hash are compared whole).
fn content_hash(v: &Value) -> u64 {
    fn walk(v: &Value, h: &mut impl Hasher) {
        match v {
            Value::Null => h.write_u8(0),
            Value::Bool(b) => h.write_u8(1 + u8::from(*b)),
            Value::Number(n) => {
                h.write_u8(3);
                n.hash(h);
            }
            Value::String(s) => {
                h.write_u8(4);
                s.hash(h);
            }
            Value::Array(a) => {
                h.write_u8(5);
                h.write_usize(a.len());
                a.iter().for_each(|x| walk(x, h));
            }
            Value::Object(m) => {
                h.write_u8(6);
                h.write_usize(m.len());
                for (k, x) in m {
                    k.hash(h);
                    walk(x, h);
                }
            }
        }
    }
    // Seeded once per process, as the engine's maps are (`fast_hash`):
    // values from the cluster cannot aim at one bucket of a known function.
    static STATE: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
    let mut h = STATE.get_or_init(Default::default).build_hasher();
    walk(v, &mut h);
    h.finish()
}

/// Policy rules checked once for a cached expansion (see
/// [`Derived::policies`]).
pub(in crate::engine) type CachedPolicy = (
    Arc<Vec<k8s_openapi::api::rbac::v1::PolicyRule>>,
    Option<FieldError>,
);

/// Entries extracted from one source (see [`Derived::extracts`]).
pub(in crate::engine) type Extracted = (Arc<ExtractedEntries>, Vec<FieldWarning>);

/// Extracted entries with their JSON text, in the source's order.
pub(in crate::engine) type ExtractedEntries = Vec<(String, Value)>;

/// A kept verdict: whether the object is kept, and the bytes judging it
/// charged.
pub(in crate::engine) type Verdict = (bool, usize);

/// A cached listField result.
pub(in crate::engine) struct ListEntry {
    /// `None` while lent to a render.
    pub value: Option<Value>,
    /// What computing it warned.
    pub warnings: Vec<FieldWarning>,
    /// Bytes computing it charged to the budget.
    pub bytes: usize,
    /// Names this value for the vars computed from it.
    pub token: u64,
    /// Cached without its objects' copies (an empty list): the rules that
    /// computed it read them by reference only (see
    /// `CompiledRule::unread`); one that reads it computes it again.
    pub hollow: bool,
}

/// A cached var.
pub(in crate::engine) struct VarEntry {
    /// `None` while lent to a render.
    pub value: Option<Value>,
    pub bytes: usize,
    /// Names this value for the expansions that read it.
    pub token: u64,
}

/// Derived values a rule keeps at most (lists and vars each); past it
/// the cache starts over.
pub(in crate::engine) const DERIVED_MAX: usize = 1_024;

/// Bytes a rule's cached lists, vars and expansions may hold (as charged
/// when they were computed); past it they start over (see
/// [`Derived::bound_bytes`]).
pub(in crate::engine) const DERIVED_BYTES_MAX: usize = 8 * 1024 * 1024;

impl Derived {
    /// A whole value's expansion cached before, charging the budget what
    /// expanding it charged; `None` over budget (expanded again, to fail
    /// where and as a full render does).
    pub fn expansion(&self, key: &(usize, bool, Vec<u64>)) -> Option<Value> {
        let (cached, bytes) = self.expansions.get(key)?;
        limits::charge(*bytes).ok()?;
        Some(cached.clone())
    }

    /// Caches a whole value's expansion, computed since `before` (the
    /// budget used then).
    pub fn remember_expansion(
        &mut self,
        key: (usize, bool, Vec<u64>),
        value: Value,
        before: usize,
    ) {
        let bytes = limits::used().saturating_sub(before);
        self.cached_now(bytes);
        self.expansions.insert(key, (value, bytes));
    }

    /// An output's policy rules checked before from a cached expansion,
    /// charging the budget what expanding it charged.
    pub fn checked_policy(&self, key: &(usize, bool, Vec<u64>)) -> Option<CachedPolicy> {
        let (_, bytes) = self.expansions.get(key)?;
        let cached = self.policies.get(key)?;
        limits::charge(*bytes).ok()?;
        Some((Arc::clone(&cached.0), cached.1.clone()))
    }

    /// A listField list cached before, lent (taken out until the render
    /// gives it back), charging the budget what computing it charged: with
    /// the warnings computing it gave and its token. `None` when absent,
    /// lent, over budget, or hollow (its items not kept) while `read`
    /// (templates read it).
    pub fn lend_list(
        &mut self,
        key: &(usize, Vec<usize>),
        read: bool,
    ) -> Option<(Vec<Value>, &[FieldWarning], u64)> {
        let e = self.lists.get_mut(key)?;
        if e.value.is_none() || (e.hollow && read) || limits::charge(e.bytes).is_err() {
            return None;
        }
        let Some(Value::Array(v)) = e.value.take() else {
            return None;
        };
        Some((v, &e.warnings, e.token))
    }

    /// Reserves a listField list's entry (filled when the render gives its
    /// value back), with the warnings and bytes computing it gave: a fresh
    /// token for it.
    pub fn reserve_list(
        &mut self,
        key: (usize, Vec<usize>),
        warnings: Vec<FieldWarning>,
        bytes: usize,
        hollow: bool,
    ) -> u64 {
        let token = self.token();
        self.cached_now(bytes);
        self.lists.insert(
            key,
            ListEntry {
                value: None,
                warnings,
                bytes,
                token,
                hollow,
            },
        );
        token
    }

    /// Reserves a var's entry (filled when the render gives its value
    /// back), with the bytes computing it charged: a fresh token for it.
    pub fn reserve_var(&mut self, key: (usize, Vec<u64>), bytes: usize) -> u64 {
        let token = self.token();
        self.cached_now(bytes);
        self.vars.insert(
            key,
            VarEntry {
                value: None,
                bytes,
                token,
            },
        );
        token
    }

    /// A nested list cached before, charging the budget what building it
    /// charged; `None` over budget.
    pub fn nested_list(&self, key: &NestedKey) -> Option<Value> {
        let (cached, bytes) = self.nested.get(key)?;
        limits::charge(*bytes).ok()?;
        Some(cached.clone())
    }

    /// Caches a nested list, built since `before` (the budget used then).
    pub fn remember_nested_list(&mut self, key: NestedKey, value: Value, before: usize) {
        let bytes = limits::used().saturating_sub(before);
        self.cached_now(bytes);
        self.nested.insert(key, (value, bytes));
    }

    /// What the cached values hold, as charged when they were computed.
    pub fn cached_bytes(&self) -> usize {
        let lists: usize = self.lists.values().map(|e| e.bytes).sum();
        let vars: usize = self.vars.values().map(|e| e.bytes).sum();
        let expansions: usize = self.expansions.values().map(|(_, b)| *b).sum();
        let nested: usize = self.nested.values().map(|(_, b)| *b).sum();
        lists
            .saturating_add(vars)
            .saturating_add(expansions)
            .saturating_add(nested)
    }

    /// Starts the cached values over when they hold more than `max` bytes:
    /// triggers that each keep a large value of their own (a var built
    /// from a related set only they select) would otherwise pile them up
    /// until the rule ends (bounded evaluation). A miss only computes again.
    pub fn bound_bytes(&mut self, max: usize) {
        if self.cached_bytes() <= max {
            return;
        }
        self.lists.clear();
        self.vars.clear();
        self.expansions.clear();
        self.nested.clear();
        // What depended on them goes too.
        self.prune();
    }

    /// A fresh token.
    pub fn token(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// The id of the value a loop over the cached var `token` bound at
    /// `index` (`value`): equal values (compared whole, not by their hash
    /// alone) get one id, whatever var or place they come from, so a
    /// nested list built from one is built from all (a family's API groups
    /// whose types did not change when the var was computed again).
    pub fn content_id(&mut self, token: u64, index: usize, value: &Value) -> u64 {
        if let Some(id) = self.bound.get(&(token, index)) {
            return *id;
        }
        // A value that cannot be written as text (none can) gets an id of
        // its own: less sharing, never a wrong one.
        let id = match serde_json::to_string(value) {
            Ok(text) => {
                let bucket = self.contents.entry(content_hash(value)).or_default();
                match bucket.iter().find(|(t, _)| **t == *text) {
                    Some((_, id)) => *id,
                    None => {
                        self.next += 1;
                        bucket.push((text.into_boxed_str(), self.next));
                        self.next
                    }
                }
            }
            Err(_) => self.token(),
        };
        self.bound.insert((token, index), id);
        id
    }

    /// Holds `obj` and gives its address, for a key.
    pub fn pin(&mut self, obj: &Arc<Value>) -> usize {
        let addr = Arc::as_ptr(obj) as usize;
        self.pins.entry(addr).or_insert_with(|| Arc::downgrade(obj));
        addr
    }

    /// Prunes ([`Derived::prune`]) once the objects changed since the
    /// last prune, `changed` of them in this evaluation, could have left
    /// one pin in [`PRUNE_SHARE`] dead: a prune walks the whole cache,
    /// so pruning after every change made a change cost what the cache
    /// holds (a namespace rule's thousands of entries for an XRD added).
    /// Amortised, a change pays a bounded share of one. A dead pin still
    /// holds its object's allocation (a `Weak`), so its address is not
    /// reused and the stale entries are never found for another object.
    pub fn prune_after(&mut self, changed: usize) {
        self.changed_since_prune = self.changed_since_prune.saturating_add(changed);
        if self.changed_since_prune.saturating_mul(PRUNE_SHARE) >= self.pins.len()
            || self.bytes_since_prune.saturating_mul(PRUNE_SHARE) > self.bytes_at_prune
        {
            self.prune();
        }
    }

    /// Drops what was computed from objects gone from the cluster (only
    /// this cache holds them), and what was computed from that.
    pub fn prune(&mut self) {
        self.changed_since_prune = 0;
        self.pins.retain(|_, o| o.strong_count() > 0);
        let pins = &self.pins;
        self.verdicts
            .retain(|(_, o, t), _| pins.contains_key(o) && (*t == 0 || pins.contains_key(t)));
        if self.verdicts.len() > 16 * DERIVED_MAX {
            self.verdicts.clear();
        }
        self.extracts.retain(|(_, _, a), _| pins.contains_key(a));
        if self.extracts.len() > 16 * DERIVED_MAX {
            self.extracts.clear();
        }
        self.lists
            .retain(|(_, addrs), _| addrs.iter().all(|a| pins.contains_key(a)));
        if self.lists.len() > DERIVED_MAX {
            self.lists.clear();
        }
        let live: HashSet<u64> = self.lists.values().map(|e| e.token).collect();
        self.vars
            .retain(|(_, deps), _| deps.iter().all(|d| live.contains(d)));
        if self.vars.len() > DERIVED_MAX {
            self.vars.clear();
        }
        let live: HashSet<u64> = self.vars.values().map(|e| e.token).collect();
        self.expansions
            .retain(|(_, _, deps), _| deps.iter().all(|d| live.contains(d)));
        self.bound.retain(|(t, _), _| live.contains(t));
        let ids: HashSet<u64> = self.bound.values().copied().collect();
        self.contents.retain(|_, bucket| {
            bucket.retain(|(_, id)| ids.contains(id));
            !bucket.is_empty()
        });
        self.nested.retain(|(_, _, deps, bound), _| {
            deps.iter().all(|d| live.contains(d)) && bound.iter().all(|(_, id)| ids.contains(id))
        });
        if self.nested.len() > 16 * DERIVED_MAX {
            self.nested.clear();
        }
        if self.expansions.len() > DERIVED_MAX {
            self.expansions.clear();
        }
        let expansions = &self.expansions;
        self.policies.retain(|k, _| expansions.contains_key(k));
        self.assembled.retain(|(_, parts), _| {
            parts.iter().all(|p| match p {
                AssemblyPart::Cached(k) => expansions.contains_key(k),
                AssemblyPart::Text(_) => true,
            })
        });
        if self.assembled.len() > DERIVED_MAX {
            self.assembled.clear();
        }
        self.bytes_since_prune = 0;
        self.bytes_at_prune = self.cached_bytes();
    }

    /// Counts `bytes` of a value cached now (see [`Derived::prune_after`]).
    fn cached_now(&mut self, bytes: usize) {
        self.bytes_since_prune = self.bytes_since_prune.saturating_add(bytes);
    }
}

/// Moves what `from` cached for its triggers' lists and vars into `to`,
/// keeping only the values of the first `related` sets and `vars` (those
/// the two rules define alike; a key names them by index). When `from`
/// holds none (a held rule broke the chain) `to` starts without.
pub(in crate::engine) fn share_derived(
    to: &mut RuleMemo,
    from: &mut RuleMemo,
    (related, vars): (usize, usize),
) {
    if !from.derived.lists.is_empty() || !from.derived.vars.is_empty() {
        let mut d = std::mem::take(&mut from.derived);
        d.lists.retain(|(i, _), _| *i < related);
        d.verdicts.retain(|(i, _, _), _| *i < related);
        d.extracts.retain(|(i, _, _), _| *i < related);
        d.vars.retain(|(i, _), _| *i < vars);
        to.derived = d;
    }
    if !from.items.is_empty() {
        let mut items = std::mem::take(&mut from.items);
        items.retain(|(i, _), _| *i < related);
        to.items = items;
    }
}

/// Verdicts of a listField's `where` (false) or `require` (true)
/// conditions that read nothing but the item, by related set and stage,
/// then by the item's JSON text, with the bytes judging it charged: family
/// members judge the same entries, and a changed revision only its own.
pub(in crate::engine) type ItemCache =
    HashMap<(usize, bool), HashMap<String, (ItemVerdict, usize)>>;

/// An item's verdict cached from before, charging the budget what judging
/// it charged; `None` over budget (judged again, to fail where and as a
/// full render does).
pub(in crate::engine) fn cached_verdict(
    items: &ItemCache,
    slot: (usize, bool),
    text: &str,
) -> Option<ItemVerdict> {
    let (verdict, bytes) = items.get(&slot).and_then(|m| m.get(text))?;
    limits::charge(*bytes).ok()?;
    Some(verdict.clone())
}

/// Caches a verdict judged since `before` (the budget used then).
pub(in crate::engine) fn remember_verdict(
    items: &mut ItemCache,
    slot: (usize, bool),
    text: &str,
    verdict: &ItemVerdict,
    before: usize,
) {
    let bytes = limits::used().saturating_sub(before);
    items
        .entry(slot)
        .or_default()
        .insert(text.to_string(), (verdict.clone(), bytes));
}

/// Entries an [`ItemCache`] keeps before it starts over.
pub(in crate::engine) const ITEM_CACHE_MAX: usize = 20_000;

/// What a stage of conditions said of one item.
#[derive(Clone, Debug)]
pub(in crate::engine) enum ItemVerdict {
    /// `where`: whether the item is kept.
    Where(bool),
    /// `require`: the warning of the condition it fails, if any.
    Require(Option<FieldWarning>),
}

/// One trigger's (or the static set's) outcome and what producing it read.
#[derive(Clone, Debug)]
pub(in crate::engine) struct TriggerMemo {
    pub outcome: Outcome,
    /// Bytes its outputs hold (see `limits::held`).
    pub bytes: usize,
    pub reads: Vec<Read>,
    /// What the render skipped with a warning, sorted and de-duplicated.
    pub warnings: Vec<FieldWarning>,
}

impl TriggerMemo {
    /// Whether the report mentions this trigger.
    pub fn noted(&self) -> bool {
        !self.warnings.is_empty()
            || matches!(
                self.outcome,
                Outcome::MatchError(_) | Outcome::Frozen | Outcome::Failed(_)
            )
            || self.outcome.outputs().iter().any(|d| d.has_no_subjects())
    }

    /// Whether its live objects are preserved as they are.
    pub fn preserves(&self) -> bool {
        matches!(
            self.outcome,
            Outcome::MatchError(_) | Outcome::Frozen | Outcome::Failed(_)
        )
    }

    /// Whether the object triggers the rule.
    pub fn matched(&self) -> bool {
        matches!(
            self.outcome,
            Outcome::Frozen | Outcome::Failed(_) | Outcome::Rendered(_)
        )
    }
}

/// What became of one trigger.
#[derive(Clone, Debug)]
pub(in crate::engine) enum Outcome {
    /// The object does not trigger the rule.
    NoMatch,
    /// Testing whether it triggers failed (a condition's template).
    MatchError(FieldError),
    /// It triggers, but is paused or being deleted.
    Frozen,
    /// It triggers; rendering failed.
    Failed(FieldError),
    /// It triggers; these objects were rendered.
    Rendered(Vec<Arc<Desired>>),
}

impl Outcome {
    pub fn outputs(&self) -> &[Arc<Desired>] {
        match self {
            Outcome::Rendered(d) => d,
            _ => &[],
        }
    }
}

/// The controller ownerReference a related-object query required.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(in crate::engine) struct Owner {
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

/// The ownership a related-object query requires of the objects it finds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(in crate::engine) enum OwnerFilter {
    /// A controller ownerReference to this object (`controlledByTrigger`).
    /// Boxed: an `Owner` is 96 bytes, and every read of every trigger
    /// holds an `Option<OwnerFilter>`, most of them `None`.
    Controller(Box<Owner>),
    /// Any ownerReference whose uid is one of these (`ownedBy`).
    AnyOf(Arc<BTreeSet<String>>),
    /// A controller ownerReference whose uid is a key here, on an object
    /// created no earlier than its value, when it has one (`controlledBy`,
    /// `notOlderThan`: the render computed the creation time of each
    /// owner's controlling ancestor, so the filter reads the object alone).
    Lineage(Arc<BTreeMap<String, Option<i64>>>),
}

impl OwnerFilter {
    /// Whether `obj` carries the ownership this filter requires.
    pub fn passes(&self, obj: &Value) -> bool {
        match self {
            OwnerFilter::Controller(o) => o.controls(obj),
            OwnerFilter::AnyOf(uids) => owner_uids(obj).any(|u| uids.contains(u)),
            OwnerFilter::Lineage(owners) => match controller_uid(obj).and_then(|u| owners.get(u)) {
                None => false,
                Some(None) => true,
                Some(Some(least)) => creation_time(obj).is_some_and(|t| t >= *least),
            },
        }
    }

    /// The owner uids an object passing this filter has a reference to
    /// (`""`: a reference without a uid), to look it up by in an index of
    /// objects by owner ([`super::owners`]); `None` when the filter can
    /// pass an object by its owner's kind and name alone.
    pub fn index_uids(&self) -> Option<Vec<&str>> {
        Some(match self {
            // A controller reference without a uid matches by kind and name.
            OwnerFilter::Controller(o) if !o.uid.is_empty() => vec![o.uid.as_str(), ""],
            OwnerFilter::Controller(_) => return None,
            // Only references with a uid count.
            OwnerFilter::AnyOf(uids) => uids.iter().map(String::as_str).collect(),
            // Only a controller with a uid counts.
            OwnerFilter::Lineage(owners) => owners.keys().map(String::as_str).collect(),
        })
    }
}

/// The non-empty uids of `obj`'s ownerReferences.
pub(in crate::engine) fn owner_uids(obj: &Value) -> impl Iterator<Item = &str> {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["uid"].as_str())
        .filter(|u| !u.is_empty())
}

/// One lookup a render made: objects of a kind (in a namespace), narrowed
/// by names, a selector and an owner, and the objects it found.
#[derive(Clone, Debug)]
pub(in crate::engine) struct Read {
    /// Shared: most reads of a rule are of the same few kinds.
    pub gk: Arc<GroupKind>,
    /// Shared with the rule's other reads in the namespace.
    pub namespace: Option<Arc<str>>,
    /// Shared: the triggers of a rule often look for the same names.
    pub names: Option<Arc<BTreeSet<String>>>,
    pub selector: Option<Arc<LabelSelector>>,
    /// Names *or* selector (rulesFrom) rather than names *and* selector.
    pub either: bool,
    pub owner: Option<OwnerFilter>,
    /// Shared: the triggers of a rule often find the same objects (a
    /// selector on cluster-scoped roles finds the same for every one).
    pub hits: Arc<BTreeSet<ObjectKey>>,
}

/// Reads are alike when they look up the same way and found the same
/// objects; shared parts compare by address first.
impl PartialEq for Read {
    fn eq(&self, other: &Self) -> bool {
        fn same<T: PartialEq + ?Sized>(a: &Arc<T>, b: &Arc<T>) -> bool {
            Arc::ptr_eq(a, b) || a == b
        }
        fn same_opt<T: PartialEq + ?Sized>(a: &Option<Arc<T>>, b: &Option<Arc<T>>) -> bool {
            match (a, b) {
                (Some(a), Some(b)) => same(a, b),
                (None, None) => true,
                _ => false,
            }
        }
        same(&self.gk, &other.gk)
            && same_opt(&self.namespace, &other.namespace)
            && same_opt(&self.names, &other.names)
            && same_opt(&self.selector, &other.selector)
            && self.either == other.either
            && self.owner == other.owner
            && same(&self.hits, &other.hits)
    }
}

impl Read {
    /// Its rendered selector as JSON, to key lookups and filters by (a
    /// `LabelSelector` has no `Hash`).
    pub fn selector_text(&self) -> Option<String> {
        self.selector
            .as_deref()
            .map(|s| serde_json::to_string(s).unwrap_or_default())
    }

    /// Whether `obj` passes this lookup's filters (its `where` conditions
    /// aside: passing these is enough to re-render).
    pub fn passes(&self, obj: &Value) -> bool {
        let by_name = self.names.as_ref().map(|n| {
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            n.contains(name)
        });
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
        self.owner.as_ref().is_none_or(|o| o.passes(obj))
    }
}

fn matches_labels(selector: &LabelSelector, obj: &Value) -> bool {
    crate::selector::matches_json(selector, obj["metadata"]["labels"].as_object())
}

/// Objects that changed since the last evaluation, by kind; `whole` kinds
/// changed in ways no key list captures (which live objects a rule keeps).
#[derive(Default, Debug)]
pub(in crate::engine) struct Changes {
    pub keys: HashMap<GroupKind, BTreeSet<ObjectKey>>,
    pub whole: HashSet<GroupKind>,
    pub all: bool,
    /// Rules (by index) whose every trigger renders again: they changed
    /// since the memo's last evaluation (see [`super::adopt`]).
    pub rules: BTreeSet<usize>,
    /// Of `keys`, the outputs a rule's render changed in this evaluation
    /// (the rest are the store's: live objects).
    pub emitted: HashSet<(OutputKind, ObjectKey)>,
}

impl Changes {
    pub fn add(&mut self, gk: &GroupKind, key: ObjectKey) {
        self.keys.entry(gk.clone()).or_default().insert(key);
    }

    /// An output a render changed (emitted, changed or no longer emitted).
    pub fn add_emitted(&mut self, kind: OutputKind, gk: &GroupKind, key: ObjectKey) {
        self.emitted.insert((kind, key.clone()));
        self.add(gk, key);
    }

    /// How many objects changed (saturated when a kind or everything
    /// changed as a whole).
    pub fn objects_changed(&self) -> usize {
        if self.all || !self.whole.is_empty() {
            return usize::MAX;
        }
        self.keys.values().map(BTreeSet::len).sum()
    }

    /// Whether a kind changed as a whole (or everything did).
    pub fn whole(&self, gk: &GroupKind) -> bool {
        self.all || self.whole.contains(gk)
    }

    /// Whether some object of kind `gk` changed (or the kind, or
    /// everything, as a whole).
    pub fn touches(&self, gk: &GroupKind) -> bool {
        self.whole(gk) || self.keys.get(gk).is_some_and(|k| !k.is_empty())
    }
}

/// The shared part of a read's filters, compared by value: triggers whose
/// reads share it are reached together. Built on every add and removal of
/// a trigger's reads: the owner filter is shared, not formatted (the text
/// of a family's lineage was 12% of a CRD added).
#[derive(Clone, PartialEq, Eq, Hash)]
struct FilterKey {
    namespace: Option<Arc<str>>,
    /// The selector's JSON text: a `LabelSelector` has no `Hash`.
    selector: Option<String>,
    owner: Option<OwnerFilter>,
}

fn filter_key(r: &Read) -> FilterKey {
    FilterKey {
        namespace: r.namespace.clone(),
        selector: r.selector_text(),
        owner: r.owner.clone(),
    }
}

/// Triggers, each key shared by all the index entries of its trigger.
type Triggers = HashSet<Arc<TKey>>;

/// A set of objects reads found, and the triggers whose reads found it.
type FoundSet = (Arc<BTreeSet<ObjectKey>>, Triggers);

/// From what a changed object is, to the triggers whose reads it can
/// affect.
#[derive(Default)]
pub(in crate::engine) struct ReadIndex {
    /// Objects a read found, to the found sets holding them (by address):
    /// triggers that found the same share one set, so an object is not
    /// listed once per trigger.
    hits: HashMap<GroupKind, HashMap<ObjectKey, Vec<usize>>>,
    /// A found set (kept alive here, so its address stays its own) and
    /// the triggers whose reads found it.
    /// By kind: two kinds may find sets of the same names (one set).
    found: HashMap<GroupKind, HashMap<usize, FoundSet>>,
    /// Names a read looked for (in any namespace).
    names: HashMap<GroupKind, HashMap<String, Triggers>>,
    /// Reads that any object passing their filters can affect, by kind and
    /// shared filter.
    groups: HashMap<GroupKind, HashMap<FilterKey, (Read, Triggers)>>,
}

impl ReadIndex {
    /// Whether a read is reached only through the names it looked for.
    fn names_only(r: &Read) -> bool {
        r.names.is_some() && (!r.either || r.selector.is_none())
    }

    pub fn add(&mut self, t: &TKey, reads: &[Read]) {
        // One shared copy of the trigger's key for all its entries.
        let t = Arc::new(t.clone());
        for r in reads {
            if !r.hits.is_empty() {
                let id = Arc::as_ptr(&r.hits) as usize;
                let found = self.found.entry((*r.gk).clone()).or_default();
                let (_, ts) = found.entry(id).or_insert_with(|| {
                    let hits = self.hits.entry((*r.gk).clone()).or_default();
                    for k in r.hits.iter() {
                        // Most keys are known: no copy of the key for those.
                        match hits.get_mut(k) {
                            Some(ids) => ids.push(id),
                            None => {
                                hits.insert(k.clone(), vec![id]);
                            }
                        }
                    }
                    (Arc::clone(&r.hits), HashSet::default())
                });
                ts.insert(Arc::clone(&t));
            }
            if let Some(names) = &r.names {
                let by_name = self.names.entry((*r.gk).clone()).or_default();
                for n in names.iter() {
                    match by_name.get_mut(n) {
                        Some(ts) => {
                            ts.insert(Arc::clone(&t));
                        }
                        None => {
                            by_name.insert(n.clone(), HashSet::from_iter([Arc::clone(&t)]));
                        }
                    }
                }
            }
            if !Self::names_only(r) {
                let proto = Read {
                    names: None,
                    hits: Arc::default(),
                    ..r.clone()
                };
                self.groups
                    .entry((*r.gk).clone())
                    .or_default()
                    .entry(filter_key(r))
                    .or_insert_with(|| (proto, HashSet::default()))
                    .1
                    .insert(Arc::clone(&t));
            }
        }
    }

    pub fn remove(&mut self, t: &TKey, reads: &[Read]) {
        for r in reads {
            let id = Arc::as_ptr(&r.hits) as usize;
            if let Some(found) = self.found.get_mut(&*r.gk)
                && let Some((_, ts)) = found.get_mut(&id)
            {
                ts.remove(t);
                if ts.is_empty() {
                    found.remove(&id);
                    if let Some(hits) = self.hits.get_mut(&*r.gk) {
                        for k in r.hits.iter() {
                            if let Some(ids) = hits.get_mut(k) {
                                ids.retain(|i| *i != id);
                                if ids.is_empty() {
                                    hits.remove(k);
                                }
                            }
                        }
                    }
                }
            }
            if let (Some(names), Some(by_name)) = (&r.names, self.names.get_mut(&*r.gk)) {
                for n in names.iter() {
                    if let Some(ts) = by_name.get_mut(n) {
                        ts.remove(t);
                        if ts.is_empty() {
                            by_name.remove(n);
                        }
                    }
                }
            }
            if !Self::names_only(r)
                && let Some(groups) = self.groups.get_mut(&*r.gk)
            {
                let fk = filter_key(r);
                if let Some((_, ts)) = groups.get_mut(&fk) {
                    ts.remove(t);
                    if ts.is_empty() {
                        groups.remove(&fk);
                    }
                }
            }
        }
    }

    /// Adds to `out` every trigger whose reads the change of `key` (of
    /// kind `gk`) can affect: those that found it, looked for its name, or
    /// whose filters it now passes.
    pub fn affected<'a>(
        &self,
        gk: &GroupKind,
        key: &ObjectKey,
        view: &impl Lookup<'a>,
        out: &mut BTreeSet<TKey>,
    ) {
        if let Some(ids) = self.hits.get(gk).and_then(|h| h.get(key)) {
            let found = self.found.get(gk);
            for (_, ts) in ids.iter().filter_map(|id| found?.get(id)) {
                out.extend(ts.iter().map(|t| (**t).clone()));
            }
        }
        if let Some(ts) = self.names.get(gk).and_then(|n| n.get(&key.1)) {
            out.extend(ts.iter().map(|t| (**t).clone()));
        }
        let Some(groups) = self.groups.get(gk) else {
            return;
        };
        let Some(seen) = view.get_seen(gk, key) else {
            return;
        };
        // An emitted object's JSON is built only for a filter on owners:
        // a selector reads its labels.
        let mut json = None;
        for (proto, ts) in groups.values() {
            if proto.namespace.as_deref().is_some_and(|ns| ns != key.0) {
                continue;
            }
            let passes = match seen {
                Seen::Emitted(_) if proto.owner.is_none() => proto
                    .selector
                    .as_ref()
                    .is_none_or(|s| seen.selected_by(std::slice::from_ref(s))),
                _ => {
                    let obj = json.get_or_insert_with(|| view.get_value(gk, key));
                    obj.as_ref().is_some_and(|o| proto.passes_unnamed(o))
                }
            };
            if passes {
                out.extend(ts.iter().map(|t| (**t).clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A memo holds three reads or so per trigger, thousands of triggers:
    /// a read's owner filter, mostly absent, takes a pointer's room, not
    /// an owner's (96 bytes).
    #[test]
    fn a_read_is_small_whatever_its_owner_filter() {
        assert!(std::mem::size_of::<Option<OwnerFilter>>() <= 16);
        assert!(
            std::mem::size_of::<Read>() <= 72,
            "{}",
            std::mem::size_of::<Read>()
        );
    }

    /// A read of CRDs filtered by lineage: controllers `owners`, found
    /// nothing yet.
    fn lineage_read(owners: &[(&str, Option<i64>)]) -> Read {
        let owners: BTreeMap<String, Option<i64>> =
            owners.iter().map(|(u, t)| (u.to_string(), *t)).collect();
        Read {
            gk: Arc::new(GroupKind::new(
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
            )),
            namespace: None,
            names: None,
            selector: None,
            either: false,
            owner: Some(OwnerFilter::Lineage(Arc::new(owners))),
            hits: Arc::default(),
        }
    }

    fn trigger(name: &str) -> TKey {
        Some((String::new(), name.to_string()))
    }

    /// Triggers whose reads filter alike share one entry of the read
    /// index, whether or not their filters are one allocation; a filter
    /// that differs in one owner or one creation time has its own; the
    /// entry goes with the last trigger that read it.
    #[test]
    fn reads_that_filter_alike_share_one_entry_of_the_read_index() {
        let family = [("rev-a", Some(10)), ("rev-b", None)];
        let (a, b) = (trigger("a"), trigger("b"));
        let mut index = ReadIndex::default();
        // Each render makes its own filter: equal, not the same Arc.
        index.add(&a, &[lineage_read(&family)]);
        index.add(&b, &[lineage_read(&family)]);
        let gk = GroupKind::new("apiextensions.k8s.io", "CustomResourceDefinition");
        let groups = |index: &ReadIndex| -> Vec<usize> {
            let mut g: Vec<usize> = index
                .groups
                .get(&gk)
                .map(|g| g.values().map(|(_, ts)| ts.len()).collect())
                .unwrap_or_default();
            g.sort_unstable();
            g
        };
        assert_eq!(groups(&index), vec![2]);
        let c = trigger("c");
        index.add(&c, &[lineage_read(&[("rev-a", Some(11)), ("rev-b", None)])]);
        let d = trigger("d");
        index.add(&d, &[lineage_read(&[("rev-a", Some(10))])]);
        assert_eq!(groups(&index), vec![1, 1, 2]);
        index.remove(&a, &[lineage_read(&family)]);
        assert_eq!(groups(&index), vec![1, 1, 1]);
        index.remove(&b, &[lineage_read(&family)]);
        index.remove(&c, &[lineage_read(&[("rev-a", Some(11)), ("rev-b", None)])]);
        assert_eq!(groups(&index), vec![1]);
    }

    /// A Widget of family `f` listing `refs` in its status.
    fn widget(name: &str, refs: &[&str]) -> Value {
        let refs: Vec<Value> = refs.iter().map(|r| json!({"name": r})).collect();
        json!({
            "apiVersion": "example.io/v1", "kind": "Widget",
            "metadata": {"name": name, "uid": name, "labels": {"example.io/family": "f"}},
            "status": {"refs": refs},
        })
    }

    /// Widgets w-1 and w-2 of one family, each listing one type.
    fn two_widgets() -> crate::engine::store::ObjectStore {
        let mut store = crate::engine::store::ObjectStore::new();
        assert!(store.insert(widget("w-1", &["as.example.org"])).is_ok());
        assert!(store.insert(widget("w-2", &["bs.example.org"])).is_ok());
        store
    }

    /// A rule on Widgets that lists a family's types and grants `verb` on
    /// them in role `widget:<trigger>:<suffix>`; with `extra`, it also
    /// reads a set no template uses.
    fn sharing_rule(suffix: &str, verb: &str, extra: bool) -> String {
        const EXTRA: &str = r#"
  - name: extra
    objects: {apiGroup: apps, kind: Deployment, namespace: system, controlledByTrigger: true}"#;
        r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: widget-@SUFFIX@}
spec:
  trigger: {apiGroup: example.io, kind: Widget}
  related:
  - name: family
    objects:
      apiGroup: example.io
      kind: Widget
      selector: {matchLabels: {example.io/family: "{{trigger.metadata.labels.[example.io/family]}}"}}
  - name: types
    listField:
      path: status.refs
      of: [trigger, family]
      extract: {path: name, regex: '(?P<plural>[^.]+)\.(?P<group>.+)'}@EXTRA@
  vars:
  - {name: groups, value: 'groupBy (sortBy related.types "plural") "group"'}
  outputs:
  - kind: ClusterRole
    when: related.types
    name: "widget:{{trigger.metadata.name}}:@SUFFIX@"
    rules:
    - forEach: vars.groups
      as: g
      item:
        apiGroups: ["{{g.key}}"]
        resources: [{forEach: g.items, as: t, item: "{{t.plural}}"}]
        verbs: [@VERB@]
"#
        .replace("@SUFFIX@", suffix)
        .replace("@VERB@", verb)
        .replace("@EXTRA@", if extra { EXTRA } else { "" })
    }

    /// The first rule of [`sharing_rules`]: it reads `extra`.
    fn rule_a() -> String {
        sharing_rule("a", "get", true)
    }

    /// Two rules on one trigger kind that list a family's types alike;
    /// only the first reads `extra`.
    fn sharing_rules() -> String {
        // Each ends and starts with a line break.
        format!("{}---{}", rule_a(), sharing_rule("b", "list", false))
    }

    /// An engine of [`sharing_rules`].
    fn sharing_engine() -> crate::engine::Engine {
        let sources =
            crate::rules::parse_text(std::path::Path::new("sharing.yaml"), &sharing_rules())
                .unwrap_or_default();
        crate::engine::Engine::new(&sources, crate::engine::Options::default())
    }

    /// [`sharing_rules`] and a third rule, ordered between them by name,
    /// that lists the family's members by name: it reads `related.family`.
    fn family_reading_engine() -> crate::engine::Engine {
        let reader = sharing_rule("aa", "get", true).replace(
                "resources: [{forEach: g.items, as: t, item: \"{{t.plural}}\"}]",
                "resources: [{forEach: g.items, as: t, item: \"{{t.plural}}\"}]\n        resourceNames: [{forEach: related.family, as: m, item: \"{{m.metadata.name}}\"}]",
            );
        let text = format!("{}\n---\n{reader}", sharing_rules());
        let sources = crate::rules::parse_text(std::path::Path::new("sharing.yaml"), &text)
            .unwrap_or_default();
        crate::engine::Engine::new(&sources, crate::engine::Options::default())
    }

    #[test]
    fn a_set_only_a_list_field_reads_is_not_copied_and_a_rule_that_reads_it_sees_it_whole() {
        let engine = family_reading_engine();
        let unread = |name: &str| {
            engine
                .rules
                .iter()
                .find(|r| r.name == name)
                .map(|r| r.unread.iter().cloned().collect::<Vec<_>>())
        };
        // `family` is read by reference only (a listField's source);
        // `extra` by nothing at all.
        assert_eq!(
            unread("widget-a"),
            Some(vec!["extra".to_string(), "family".to_string()])
        );
        assert_eq!(unread("widget-aa"), Some(vec!["extra".to_string()]));
        assert_eq!(unread("widget-b"), Some(vec!["family".to_string()]));
        let names_of = |e: &Evaluation, w: &str| {
            let key = (
                crate::api::OutputKind::ClusterRole,
                String::new(),
                format!("widget:{w}:aa"),
            );
            e.desired
                .get(&key)
                .and_then(|d| d.object.rules().cloned())
                .and_then(|r| r.first().and_then(|r| r.resource_names.clone()))
        };
        let both = Some(vec!["w-1".to_string(), "w-2".to_string()]);
        let mut store = two_widgets();
        let mut memo = Memo::new();
        let e = engine.evaluate_incremental(&store, &mut memo);
        // The rules that read no member share cached lists with the one that
        // does (it runs between them): it sees every member, whichever ran first.
        assert_eq!(e.desired.len(), 6);
        assert_eq!(names_of(&e, "w-1"), both);
        assert_eq!(names_of(&e, "w-2"), both);
        // A changed member: the lists cached hollow are not lent to it.
        assert!(store.insert(widget("w-2", &["cs.example.org"])).is_ok());
        let e = engine.evaluate_incremental(&store, &mut memo);
        assert_eq!(names_of(&e, "w-1"), both);
        let full = engine.evaluate_incremental(&store, &mut Memo::new());
        let texts = |e: &Evaluation| -> Vec<String> {
            e.desired
                .iter()
                .map(|d| serde_json::to_string(&d.object.to_value()).unwrap_or_default())
                .collect()
        };
        assert_eq!(texts(&e), texts(&full));
        // w-2's new type is listed: its entries were read from the store.
        assert!(texts(&e).iter().any(|t| t.contains("\"cs\"")));
    }

    #[test]
    fn a_rule_that_may_read_the_whole_context_copies_every_set() {
        // `@root`, `this` or `../` could reach any set: none is left out.
        for text in ["{{@root.related.family.length}}", "{{#with this}}{{/with}}"] {
            let rule = rule_a().replace(
                "    when: related.types\n",
                &format!("    when: related.types\n    labels: {{n: \"{text}\"}}\n"),
            );
            let sources =
                crate::rules::parse_text(std::path::Path::new("r.yaml"), &rule).unwrap_or_default();
            let engine = crate::engine::Engine::new(&sources, crate::engine::Options::default());
            let unread = engine.rules.first().map(|r| r.unread.len());
            assert_eq!(unread, Some(0), "{text}");
        }
    }

    #[test]
    fn rules_of_the_same_derivation_share_their_kept_values() {
        let sources =
            crate::rules::parse_text(std::path::Path::new("sharing.yaml"), &sharing_rules())
                .unwrap_or_default();
        assert_eq!(sources.len(), 2);
        let engine = crate::engine::Engine::new(&sources, crate::engine::Options::default());
        let at = |name: &str| engine.rules.iter().position(|r| r.name == name);
        let (Some(a), Some(b)) = (at("widget-a"), at("widget-b")) else {
            panic!("both rules compile");
        };
        // The later takes from the earlier; `family` and `types` alike,
        // `extra` only in one.
        let (first, last) = (a.min(b), a.max(b));
        let derivations: Vec<_> = engine.rules.iter().map(|r| &r.derivation).collect();
        let from = |i| super::super::keys::derived_from(&derivations, i).map(|(j, _)| j);
        assert_eq!(
            super::super::keys::derived_from(&derivations, last).map(|(_, c)| c),
            Some((2, 1))
        );
        assert_eq!((from(first), from(last)), (None, Some(first)));

        let store = two_widgets();
        let mut memo = Memo::new();
        let e = engine.evaluate_incremental(&store, &mut memo);
        assert_eq!(e.desired.len(), 4);
        // Computed once, handed on, kept by the rule that ran last for
        // the next evaluation (the first takes them back then).
        assert!(memo.rules[first].derived.lists.is_empty());
        let d = &memo.rules[last].derived;
        assert!(
            !d.lists.is_empty(),
            "the last rule keeps what the first computed"
        );
        // The family's widgets list the same types: their roles' policy
        // rules were checked once, and are shared.
        let rules_of = |w: &str| {
            let key = (
                crate::api::OutputKind::ClusterRole,
                String::new(),
                format!("widget:{w}:a"),
            );
            e.desired.get(&key).and_then(|d| d.object.rules().cloned())
        };
        let (r1, r2) = (rules_of("w-1"), rules_of("w-2"));
        assert!(r1.as_ref().is_some_and(|r| r.len() == 1), "{r1:?}");
        assert!(r1.zip(r2).is_some_and(|(x, y)| Arc::ptr_eq(&x, &y)));
        // The whole rules value is read again only through its checked
        // rules: cached as null beside them, not copied.
        assert!(!d.policies.is_empty());
        assert!(
            d.policies
                .keys()
                .all(|k| d.expansions.get(k).is_some_and(|e| e.0.is_null()))
        );
        // A member changed: the family's lists are computed again (the
        // unchanged member's entries reused), handed on and kept alike.
        let mut store = store;
        assert!(
            store
                .insert(widget("w-1", &["as.example.org", "cs.example.org"]))
                .is_ok()
        );
        let again = engine.evaluate_incremental(&store, &mut memo);
        assert_eq!(again.desired.len(), e.desired.len());
        assert!(memo.rules[first].derived.lists.is_empty());
        assert!(!memo.rules[last].derived.lists.is_empty());
    }

    #[test]
    fn emitters_are_found_by_borrowed_parts_as_by_key() {
        let mut emitters = Emitters::default();
        let desired = |ns: &str, name: &str| {
            Arc::new(Desired {
                kind: OutputKind::Role,
                namespace: ns.to_string(),
                name: name.to_string(),
                rule: "r".into(),
                trigger: None,
                field: "spec.outputs[0]".into(),
                refusal: None,
                object: crate::engine::manifest::Manifest::from_value(&json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": name, "namespace": ns},
                }))
                .unwrap_or_else(|e| panic!("{e}")),
            })
        };
        for (ns, name) in [("a", "x"), ("a", "y"), ("b", "x"), ("", "ax")] {
            let key = (OutputKind::Role, ns.to_string(), name.to_string());
            emitters.update(Cow::Borrowed(&key), |list| {
                list.push(Emit {
                    rule: 0,
                    trigger: Arc::new(None),
                    desired: desired(ns, name),
                })
            });
        }
        for (ns, name) in [
            ("a", "x"),
            ("a", "y"),
            ("b", "x"),
            ("", "ax"),
            ("a", ""),
            ("", "a"),
        ] {
            let key = (OutputKind::Role, ns.to_string(), name.to_string());
            let by_key = emitters.get(&key).map(|l| l[0].desired.name.clone());
            let okey = (ns.to_string(), name.to_string());
            let by_parts = emitters
                .get_parts(OutputKind::Role, &okey)
                .map(|l| l[0].desired.name.clone());
            assert_eq!(by_key, by_parts, "{ns}/{name}");
            assert_eq!(by_key.is_some(), !name.is_empty() && name != "a");
            assert!(emitters.get_parts(OutputKind::ClusterRole, &okey).is_none());
        }
    }

    #[test]
    fn evaluations_share_the_memo_s_reports_until_one_changes() {
        let engine = sharing_engine();
        let mut store = two_widgets();
        let mut memo = Memo::new();
        let first = engine.evaluate_incremental(&store, &mut memo);
        let again = engine.evaluate_incremental(&store, &mut memo);
        // Nothing changed: the same reports, not a copy.
        assert!(Arc::ptr_eq(&first.reports, &again.reports));
        assert!(Arc::ptr_eq(&first.reports, &memo.reports));
        // A change makes new reports; the ones returned before stay as
        // they were.
        let before = (*first.reports).clone();
        assert!(store.insert(widget("w-1", &["cs.example.org"])).is_ok());
        let changed = engine.evaluate_incremental(&store, &mut memo);
        assert!(!Arc::ptr_eq(&first.reports, &changed.reports));
        assert!(Arc::ptr_eq(&changed.reports, &memo.reports));
        assert_eq!(format!("{:?}", *first.reports), format!("{before:?}"));
    }

    /// Related sets of Widgets, judged three ways: `all` has no `where`,
    /// `listed` one that reads only the item, `others` one that reads the
    /// trigger too.
    const JUDGING_RULE: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: widget-judging}
spec:
  trigger: {apiGroup: example.io, kind: Widget}
  related:
  - name: all
    objects: {apiGroup: example.io, kind: Widget}
  - name: listed
    objects: {apiGroup: example.io, kind: Widget}
    where:
    - {path: status.refs, exists: true}
  - name: others
    objects: {apiGroup: example.io, kind: Widget}
    where:
    - {value: "{{item.metadata.name}}", notEquals: "{{trigger.metadata.name}}"}
  outputs:
  - kind: ClusterRole
    name: "widget:{{trigger.metadata.name}}"
    rules:
    - apiGroups: [example.io]
      resources: [widgets]
      resourceNames:
      - {forEach: related.all, as: o, item: "all-{{o.metadata.name}}"}
      - {forEach: related.listed, as: o, item: "listed-{{o.metadata.name}}"}
      - {forEach: related.others, as: o, item: "other-{{o.metadata.name}}"}
      verbs: [get]
"#;

    /// A related object is judged per trigger only when the `where` reads
    /// the trigger: a set without `where` judges nothing, one whose
    /// `where` reads only the item judges each object once for every
    /// trigger, so a changed trigger judges none of them again.
    #[test]
    fn a_where_is_judged_per_trigger_only_when_it_reads_the_trigger() {
        let sources = crate::rules::parse_text(std::path::Path::new("judging.yaml"), JUDGING_RULE)
            .unwrap_or_default();
        let engine = crate::engine::Engine::new(&sources, crate::engine::Options::default());
        let mut store = two_widgets();
        let mut memo = Memo::new();
        let e = engine.evaluate_incremental(&store, &mut memo);
        assert_eq!(
            e.errors().count(),
            0,
            "{:?}",
            e.errors().collect::<Vec<_>>()
        );
        // Verdicts by set: (judged per trigger, judged once).
        let verdicts = |memo: &Memo| -> Vec<(usize, usize)> {
            let d = &memo.rules[0].derived;
            (0..3)
                .map(|set| {
                    let of = d.verdicts.keys().filter(|(i, _, _)| *i == set);
                    let once = of.clone().filter(|(_, _, t)| *t == 0).count();
                    (of.count() - once, once)
                })
                .collect()
        };
        assert_eq!(verdicts(&memo), [(0, 0), (0, 2), (4, 0)]);
        let names = |e: &Evaluation, t: &str| -> Vec<String> {
            let key = (
                crate::api::OutputKind::ClusterRole,
                String::new(),
                format!("widget:{t}"),
            );
            let rules = e.desired.get(&key).and_then(|d| d.object.rules().cloned());
            rules
                .iter()
                .flat_map(|r| r.iter())
                .flat_map(|r| r.resource_names.clone().unwrap_or_default())
                .collect()
        };
        let all = ["all-w-1", "all-w-2", "listed-w-1", "listed-w-2"];
        assert_eq!(names(&e, "w-1"), [&all[..], &["other-w-2"]].concat());
        // w-1 changes: the item-only verdict of w-2 stands; only the new
        // w-1 is judged, once, and per trigger where the trigger is read.
        let mut changed = widget("w-1", &["as.example.org"]);
        changed["metadata"]["annotations"] = json!({"note": "changed"});
        assert!(store.insert(changed).is_ok());
        let e = engine.evaluate_incremental(&store, &mut memo);
        assert_eq!(
            e.errors().count(),
            0,
            "{:?}",
            e.errors().collect::<Vec<_>>()
        );
        let judged: Vec<(usize, usize)> = verdicts(&memo);
        assert_eq!(judged[0], (0, 0));
        // The old w-1's verdict may wait for a prune: w-2's and the new one's.
        assert!(
            (2..=3).contains(&judged[1].1) && judged[1].0 == 0,
            "{judged:?}"
        );
        assert_eq!(names(&e, "w-2"), [&all[..], &["other-w-1"]].concat());
    }

    #[test]
    fn a_changed_member_s_list_entries_are_extracted_again() {
        let engine = sharing_engine();
        let mut store = two_widgets();
        let mut memo = Memo::new();
        let _ = engine.evaluate_incremental(&store, &mut memo);
        // The rule that ran last keeps them: entries by source address.
        let extracts = |memo: &Memo| -> Vec<(String, Arc<ExtractedEntries>)> {
            let d = memo
                .rules
                .iter()
                .map(|r| &r.derived)
                .find(|d| !d.extracts.is_empty());
            let mut v: Vec<_> = d
                .map(|d| {
                    d.extracts
                        .values()
                        .map(|(e, _)| {
                            (
                                e.iter()
                                    .map(|(t, _)| t.as_str())
                                    .collect::<Vec<_>>()
                                    .join(","),
                                Arc::clone(e),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        let before = extracts(&memo);
        // Each widget's, as a trigger or a family member alike.
        assert_eq!(
            before.len(),
            2,
            "{:?}",
            before.iter().map(|b| &b.0).collect::<Vec<_>>()
        );
        assert!(store.insert(widget("w-1", &["cs.example.org"])).is_ok());
        for r in &mut memo.rules {
            r.freed = None;
        }
        let e = engine.evaluate_incremental(&store, &mut memo);
        let after = extracts(&memo);
        // w-1's old entries went with it; w-2's were extracted again.
        assert_eq!(after.len(), 2);
        assert!(after.iter().all(|(t, _)| !t.contains("as.example.org")));
        assert_eq!(
            after
                .iter()
                .filter(|(t, _)| t.contains("bs.example.org"))
                .count(),
            1
        );
        // And the roles list the new type with the cached one.
        let key = (
            crate::api::OutputKind::ClusterRole,
            String::new(),
            "widget:w-2:b".to_string(),
        );
        let rules = e.desired.get(&key).and_then(|d| d.object.rules().cloned());
        let resources: Vec<String> = rules
            .iter()
            .flat_map(|r| r.iter())
            .flat_map(|r| r.resources.clone().unwrap_or_default())
            .collect();
        assert_eq!(resources, ["bs", "cs"], "{rules:?}");
    }

    #[test]
    fn a_rules_list_that_fails_its_check_fails_every_trigger_alike() {
        // Verbs from the family's types: no verbs is no rule, an error.
        let text = sharing_rule("a", "", true);
        let sources = crate::rules::parse_text(std::path::Path::new("failing.yaml"), &text)
            .unwrap_or_default();
        let engine = crate::engine::Engine::new(&sources, crate::engine::Options::default());
        let store = two_widgets();
        let errors = |e: &Evaluation| -> Vec<String> {
            e.reports
                .get("widget-a")
                .map(|r| r.errors.iter().map(|x| format!("{x}")).collect())
                .unwrap_or_default()
        };
        let mut memo = Memo::new();
        let incremental = engine.evaluate_incremental(&store, &mut memo);
        let full = engine.evaluate_incremental(&store, &mut Memo::new());
        // Both widgets fail, the second as the first (nothing kept null is
        // read back as their rules).
        let all = errors(&incremental);
        assert_eq!(all.len(), 2, "{all:?}");
        // The same error for both, but for the trigger named in it.
        assert_eq!(all[0].replace("w-1", "w-2"), all[1], "{all:?}");
        assert_eq!(errors(&incremental), errors(&full));
        assert!(incremental.desired.is_empty());
        assert!(memo.rules.iter().all(|r| r.derived.policies.is_empty()));
        assert!(
            memo.rules
                .iter()
                .all(|r| r.derived.expansions.values().all(|e| !e.0.is_null()))
        );
    }

    #[test]
    fn a_nested_list_rendered_alike_is_built_once_for_every_role() {
        let engine = sharing_engine();
        let mut store = two_widgets();
        assert!(store.insert(widget("w-3", &["cs.other.org"])).is_ok());
        let mut memo = Memo::new();
        let e = engine.evaluate_incremental(&store, &mut memo);
        let resources = |name: &str| {
            let role = e
                .desired
                .get(&(OutputKind::ClusterRole, String::new(), name.to_string()))
                .and_then(|d| serde_json::from_slice::<Value>(&d.object.to_json()).ok());
            role.map(|r| r["rules"].clone()).unwrap_or_default()
        };
        let want = json!([
            {"apiGroups": ["example.org"], "resources": ["as", "bs"], "verbs": ["get"]},
            {"apiGroups": ["other.org"], "resources": ["cs"], "verbs": ["get"]},
        ]);
        assert_eq!(resources("widget:w-3:a"), want);
        assert_eq!(resources("widget:w-1:b")[1]["resources"], json!(["cs"]));
        // Both rules' roles, for all three triggers, render the same two
        // `resources` lists: each is built once and cached by its text.
        let lists = |memo: &Memo| -> Vec<String> {
            memo.rules
                .iter()
                .flat_map(|r| r.derived.nested.values())
                // Without the marks of text from data.
                .map(|(v, _)| v.to_string().replace("\\u0000", ""))
                .collect()
        };
        assert_eq!(lists(&memo).len(), 2);

        // One group's types change: the lists are built again, the
        // changed one as it now is.
        for r in &mut memo.rules {
            r.freed = None;
        }
        assert!(
            store
                .insert(widget("w-3", &["cs.other.org", "ds.other.org"]))
                .is_ok()
        );
        let e = engine.evaluate_incremental(&store, &mut memo);
        let mut after = lists(&memo);
        after.sort();
        assert_eq!(after, [r#"["as","bs"]"#, r#"["cs","ds"]"#], "{after:?}");
        let role = e
            .desired
            .get(&(
                OutputKind::ClusterRole,
                String::new(),
                "widget:w-1:b".into(),
            ))
            .and_then(|d| serde_json::from_slice::<Value>(&d.object.to_json()).ok())
            .unwrap_or_default();
        assert_eq!(role["rules"][0]["resources"], json!(["as", "bs"]));
        assert_eq!(role["rules"][1]["resources"], json!(["cs", "ds"]));
    }

    #[test]
    fn only_rule_lists_with_kept_entries_are_kept_put_together() {
        let rule = |name: &str, first: &str| {
            format!(
                r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: {name}}}
spec:
  trigger: {{apiGroup: example.io, kind: Widget}}
  outputs:
  - kind: ClusterRole
    name: "{name}:{{{{trigger.metadata.name}}}}"
    rules:
    - {first}
    - {{apiGroups: [example.io], resources: ["{{{{trigger.metadata.name}}}}"], verbs: [get]}}
"#
            )
        };
        let text = [
            rule("kept", "{apiGroups: [example.io], resources: [widgets], verbs: [get]}"),
            rule(
                "own",
                r#"{apiGroups: [example.io], resources: ["{{trigger.metadata.uid}}"], verbs: [list]}"#,
            ),
        ]
        .join("---\n");
        let sources =
            crate::rules::parse_text(std::path::Path::new("lists.yaml"), &text).unwrap_or_default();
        let engine = crate::engine::Engine::new(&sources, crate::engine::Options::default());
        let mut memo = Memo::new();
        let e = engine.evaluate_incremental(&two_widgets(), &mut memo);
        assert_eq!(e.desired.len(), 4, "{:?}", e.reports);
        let kept: Vec<usize> = memo
            .rules
            .iter()
            .map(|r| r.derived.assembled.len())
            .collect();
        // One list per trigger for the rule with a cached entry (the other
        // entry differs per trigger); none for the one without.
        assert_eq!(kept, [2, 0]);
    }

    #[test]
    fn prune_drops_what_was_computed_from_objects_gone() {
        let mut d = Derived::default();
        let a = Arc::new(json!({"metadata": {"name": "a"}}));
        let b = Arc::new(json!({"metadata": {"name": "b"}}));
        let (pa, pb) = (d.pin(&a), d.pin(&b));
        let list = |d: &mut Derived| ListEntry {
            value: Some(json!([])),
            warnings: Vec::new(),
            bytes: 0,
            token: d.token(),
            hollow: false,
        };
        let only_a = list(&mut d);
        let both = list(&mut d);
        let both_token = both.token;
        d.lists.insert((0, vec![pa]), only_a);
        d.lists.insert((1, vec![pa, pb]), both);
        let var_token = d.token();
        d.vars.insert(
            (0, vec![both_token]),
            VarEntry {
                value: Some(json!([])),
                bytes: 0,
                token: var_token,
            },
        );
        d.expansions
            .insert((7, true, vec![var_token]), (json!([]), 0));
        d.verdicts.insert((0, pb, pa), (true, 0));
        d.verdicts.insert((0, pa, pa), (true, 0));

        // Nothing gone: everything kept.
        d.prune();
        assert_eq!((d.lists.len(), d.vars.len(), d.expansions.len()), (2, 1, 1));

        // `b` replaced in the cluster: all computed from it goes, and
        // what was computed from that.
        drop(b);
        d.prune();
        assert_eq!(d.pins.len(), 1);
        assert!(d.lists.contains_key(&(0, vec![pa])));
        assert_eq!(d.lists.len(), 1);
        assert!(d.vars.is_empty());
        assert!(d.expansions.is_empty());
        assert_eq!(d.verdicts.len(), 1);
        drop(a);
    }

    #[test]
    fn prune_waits_until_the_changes_could_have_left_a_share_of_pins_dead() {
        let mut d = Derived::default();
        let n = 2 * PRUNE_SHARE;
        let objs: Vec<Arc<Value>> = (0..n)
            .map(|i| Arc::new(json!({"metadata": {"name": i.to_string()}})))
            .collect();
        let pins: Vec<usize> = objs.iter().map(|o| d.pin(o)).collect();
        for (i, p) in pins.iter().enumerate() {
            d.verdicts.insert((i, *p, 0), (true, 0));
        }
        let mut objs = objs.into_iter();
        drop(objs.next());
        // One change among 2 × PRUNE_SHARE pins: not yet one in PRUNE_SHARE.
        d.prune_after(1);
        assert_eq!((d.pins.len(), d.verdicts.len()), (n, n));
        // A second: one in PRUNE_SHARE may be dead, the dead pins and
        // their verdicts go.
        drop(objs.next());
        d.prune_after(1);
        assert_eq!((d.pins.len(), d.verdicts.len()), (n - 2, n - 2));
        assert_eq!(d.changed_since_prune, 0);
        // A change of everything prunes at once.
        drop(objs.next());
        d.prune_after(usize::MAX);
        assert_eq!(d.pins.len(), n - 3);
    }

    #[test]
    fn prune_comes_too_once_the_values_cached_since_hold_a_share_of_the_bytes() {
        let mut d = Derived::default();
        let a = Arc::new(json!({"metadata": {"name": "a"}}));
        let b = Arc::new(json!({"metadata": {"name": "b"}}));
        let (pa, pb) = (d.pin(&a), d.pin(&b));
        let kept = PRUNE_SHARE * 100;
        d.reserve_list((0, vec![pa]), Vec::new(), kept, false);
        d.reserve_list((1, vec![pb]), Vec::new(), 1, false);
        d.prune();
        assert_eq!((d.bytes_at_prune, d.bytes_since_prune), (kept + 1, 0));
        // `b` gone: no object change counted, and a small value cached
        // since: kept stale.
        drop(b);
        d.reserve_list((2, vec![pa]), Vec::new(), 50, false);
        d.prune_after(0);
        assert_eq!(d.lists.len(), 3);
        // Values of over a PRUNE_SHARE-th of the bytes cached since: pruned.
        d.reserve_list((3, vec![pa]), Vec::new(), 60, false);
        d.prune_after(0);
        assert_eq!(d.lists.len(), 3);
        assert!(!d.lists.contains_key(&(1, vec![pb])));
        assert_eq!(d.bytes_since_prune, 0);
        drop(a);
    }

    #[test]
    fn equal_bound_values_share_an_id_whatever_var_bound_them() {
        let mut d = Derived::default();
        let mut a = serde_json::Map::new();
        a.insert("plural".into(), json!("gadgets"));
        a.insert("group".into(), json!("example.org"));
        let mut b = serde_json::Map::new();
        b.insert("group".into(), json!("example.org"));
        b.insert("plural".into(), json!("gadgets"));
        let id = d.content_id(1, 0, &Value::Object(a));
        // Built in another order, bound by another var: the same value.
        assert_eq!(d.content_id(2, 3, &Value::Object(b)), id);
        // Asked again for the same place: the id it was given.
        assert_eq!(d.content_id(1, 0, &json!("anything")), id);
        // Values that differ, even as numbers of one magnitude, do not.
        let one = d.content_id(3, 0, &json!(1));
        let float = d.content_id(3, 1, &json!(1.0));
        assert_ne!(one, float);
        assert_ne!(one, id);
        assert_eq!(d.content_id(4, 0, &json!(1)), one);
        // Held as text, one entry per distinct value.
        assert_eq!(d.contents.values().map(Vec::len).sum::<usize>(), 3);
    }
}
