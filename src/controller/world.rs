//! The world index: everything the controller knows about the cluster, fed
//! by watch events and read by each reconcile. Pure: no client, no tasks;
//! tested by feeding events ([`World::apply`]).
//!
//! A list never shows a half-empty view: lists of objects are applied
//! object by object (an unchanged object keeps its cached copy) and what a
//! list no longer holds is swept at its end (`InitDone`); lists of rules
//! and of the allow-list are buffered and swapped in then.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;

use super::apply::Learned;
use super::live::{Live, ObjectId};
use super::status::Hold;
use crate::api::{ManageLevel, OutputKind, RbacRule, RbacRuleSpec};
use crate::engine::compile::gk_of;
pub(super) use crate::engine::compile::output_kind;
use crate::engine::store::key_of;
use crate::engine::{GroupKind, Interest, ObjectStore, Options, RuleSource};

/// What a watch task sends to the control loop.
#[derive(Debug)]
pub enum Feed {
    /// An RbacRule event (boxed: rules are large, other feeds small).
    Rules(Box<Event<RbacRule>>),
    /// A NamespacedRbacRule event, the rule carried as an RbacRule with its
    /// namespace ([`super::tenants`]).
    Tenants(Box<Event<RbacRule>>),
    /// An event of the watch on every object of an output kind: ours (with
    /// our managed-by label) are cached, others only by name.
    Owned(OutputKind, Event<Live>),
    /// An event of a watch on a kind the rules read; `epoch` tells a
    /// restarted watch from its predecessor.
    Kind(GroupKind, u64, Event<Value>),
    /// An event of the allow-list ClusterRole watch.
    Allow(Box<Event<ClusterRole>>),
    /// What a write just did (from the write pass, not a watch).
    Learned(Learned),
    /// A watch error.
    Error(Source, watcher::Error),
}

/// Which watch a [`Feed::Error`] comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The RbacRule watch.
    Rules,
    /// The NamespacedRbacRule watch.
    Tenants,
    /// An owned-object watch.
    Owned(OutputKind),
    /// A rule-kind watch.
    Kind(GroupKind, u64),
    /// The allow-list watch.
    Allow,
}

/// Progress of one watch's list.
#[derive(Debug)]
struct Listing<T> {
    /// A complete list has been received and no list failed since.
    synced: bool,
    /// The last list error.
    error: Option<String>,
    /// Objects of a list in progress.
    buffer: Option<Vec<T>>,
}

/// What applying an event means for the control loop.
enum Step<T> {
    /// Nothing to do yet (list in progress).
    Nothing,
    /// One object added or changed.
    Upsert(T),
    /// One object removed.
    Remove(T),
    /// A complete list replaces everything.
    Replace(Vec<T>),
}

impl<T> Default for Listing<T> {
    fn default() -> Self {
        Listing {
            synced: false,
            error: None,
            buffer: None,
        }
    }
}

impl<T> Listing<T> {
    fn step(&mut self, event: Event<T>) -> Step<T> {
        match event {
            Event::Init => {
                self.buffer = Some(Vec::new());
                Step::Nothing
            }
            Event::InitApply(o) => {
                self.buffer.get_or_insert_with(Vec::new).push(o);
                Step::Nothing
            }
            Event::InitDone => {
                self.synced = true;
                self.error = None;
                Step::Replace(self.buffer.take().unwrap_or_default())
            }
            Event::Apply(o) => Step::Upsert(o),
            Event::Delete(o) => Step::Remove(o),
        }
    }

    /// Records a watch error. Only a failed list makes the cache stale: a
    /// failed watch resumes from its resourceVersion, and a 410 re-lists.
    fn fail(&mut self, error: &watcher::Error) {
        if let watcher::Error::InitialListFailed(e) = error {
            self.synced = false;
            self.error = Some(e.to_string());
        }
    }
}

/// Whether `new` differs from `old` in `metadata.resourceVersion` alone:
/// the server bumps it on every write, also of what the watch cut away (a
/// status update of a kind read by `fields` or `metadataOnly`). Such an
/// event changes nothing a rule sees, so the stored copy stays: rules see
/// the resourceVersion of the last version that changed anything else.
fn same_but_version(old: &Value, new: &Value) -> bool {
    let (Some(a), Some(b)) = (old.as_object(), new.as_object()) else {
        return old == new;
    };
    fn meta(m: &serde_json::Map<String, Value>) -> Option<&serde_json::Map<String, Value>> {
        m.get("metadata").and_then(Value::as_object)
    }
    // Entries besides resourceVersion, all of them equal.
    let same =
        |x: &serde_json::Map<String, Value>, y: &serde_json::Map<String, Value>, skip: &str| {
            let n = |m: &serde_json::Map<String, Value>| m.keys().filter(|k| *k != skip).count();
            n(x) == n(y) && x.iter().all(|(k, v)| k == skip || y.get(k) == Some(v))
        };
    same(a, b, "metadata")
        && match (meta(a), meta(b)) {
            (Some(x), Some(y)) => same(x, y, "resourceVersion"),
            _ => a.get("metadata") == b.get("metadata"),
        }
}

/// Rebuilds a map with full nodes. Objects mostly arrive in key order (a
/// write pass answers in plan order), and a B-tree filled at its right
/// edge keeps its nodes about half full: for the live cache, about 2.5 MB
/// of empty slots at `large`. `append` merges by a bulk build that drains
/// the old nodes as it fills new ones, so no second copy is held.
fn pack_map<K: Ord, V>(map: &mut BTreeMap<K, V>) {
    let mut old = std::mem::take(map);
    if let Some((k, v)) = old.pop_first() {
        map.insert(k, v);
        map.append(&mut old);
    }
}

/// Whether a list failed because the kind is not served (404).
fn not_found(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::InitialListFailed(kube::Error::Api(s)) if s.code == 404)
}

/// State of the watch on one kind the rules read.
#[derive(Debug)]
struct KindWatch {
    interest: Interest,
    /// Why there is no watch (not served, discovery failed), if there is none.
    unresolved: Option<String>,
    epoch: u64,
    listing: Listing<Value>,
    /// While a list is in progress, the objects it held so far.
    seen: Option<BTreeSet<crate::engine::store::ObjectKey>>,
    /// Whether a watch runs (its task lives in [`super::watch::Watches`]).
    watching: bool,
}

/// Everything the controller knows about the cluster.
#[derive(Default)]
pub struct World {
    /// RbacRules by name, and NamespacedRbacRules by `<namespace>/<name>`
    /// ([`super::tenants::key_of`]).
    pub rules: BTreeMap<String, RbacRule>,
    rules_listing: Listing<RbacRule>,
    tenants_listing: Listing<RbacRule>,
    /// Kinds each rule reads (cached per spec).
    rule_kinds: BTreeMap<String, (RbacRuleSpec, Vec<GroupKind>)>,
    /// Objects of the kinds the rules read.
    pub store: ObjectStore,
    kinds: BTreeMap<GroupKind, KindWatch>,
    next_epoch: u64,
    /// Live objects labelled as ours.
    pub owned: BTreeMap<ObjectId, Live>,
    /// Objects of the output kinds without our label: a desired object of
    /// one of these names is looked up before it is written (adoption or
    /// conflict); every other name is free, so a create needs no read.
    pub foreign: BTreeSet<ObjectId>,
    /// Objects of the output kinds labelled ours that our inventory did not
    /// make ([`Live::is_ours`]), with the rule they name: foreign (neither
    /// pruned, revoked, overwritten nor judged as ours), and reported.
    pub forged: BTreeMap<ObjectId, Option<String>>,
    owned_listing: BTreeMap<OutputKind, Listing<Live>>,
    /// Size of `owned` when it was last packed ([`pack_map`]).
    owned_packed_len: usize,
    /// Per output kind whose list is in progress, the objects it held so far.
    relisting: BTreeMap<OutputKind, BTreeSet<ObjectId>>,
    /// `--allow-clusterrole`, if set.
    allow_name: Option<String>,
    allow: Option<ClusterRole>,
    allow_listing: Listing<ClusterRole>,
    /// Rules moved to the slow lane, with the spec that was slow: a new
    /// spec gets a new chance in the main pass.
    slow: BTreeMap<String, RbacRuleSpec>,
    /// What tenant rules may read (`--tenant-readable-kinds`): part of
    /// what they watch.
    pub tenancy: crate::engine::tenant::Tenancy,
}

/// What a feed item changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Something the engine reads or the plan compares changed.
    pub dirty: bool,
    /// The set of rule specs changed: watches may need to start or stop.
    pub rules: bool,
    /// A kind stopped being served: rediscover it.
    pub lost_kind: bool,
}

impl World {
    /// An empty world; `allow_name` is the `--allow-clusterrole` value.
    pub fn new(allow_name: Option<String>) -> Self {
        World {
            allow_name,
            ..World::default()
        }
    }

    /// Applies one feed item.
    pub fn apply(&mut self, feed: Feed) -> Change {
        let dirty = |dirty| Change {
            dirty,
            ..Change::default()
        };
        match feed {
            Feed::Rules(ev) => self.apply_rule_event(*ev, false),
            Feed::Tenants(ev) => self.apply_rule_event(*ev, true),
            Feed::Owned(kind, ev) => dirty(self.apply_owned_event(kind, ev)),
            Feed::Kind(gk, epoch, ev) => dirty(self.apply_kind_event(&gk, epoch, ev)),
            Feed::Allow(ev) => dirty(self.apply_allow_event(*ev)),
            Feed::Learned(learned) => dirty(self.learn(learned)),
            Feed::Error(source, error) => self.apply_watch_error(source, &error),
        }
    }

    /// An RbacRule event. A status-only change (often our own patch)
    /// re-renders nothing; the new status is kept for comparison.
    /// Tenant rules (`tenant`) come from their own watch and list: a list
    /// of either replaces only its own kind's rules.
    fn apply_rule_event(&mut self, ev: Event<RbacRule>, tenant: bool) -> Change {
        let changed = Change {
            dirty: true,
            rules: true,
            lost_kind: false,
        };
        let listing = if tenant {
            &mut self.tenants_listing
        } else {
            &mut self.rules_listing
        };
        match listing.step(map_event(ev, without_managed_fields)) {
            Step::Nothing => Change::default(),
            Step::Upsert(r) => {
                let name = super::tenants::key_of(&r);
                let same_spec = self.rules.get(&name).is_some_and(|old| {
                    old.spec == r.spec && old.metadata.generation == r.metadata.generation
                });
                // A confirmation of held prunes is read by the next plan.
                let confirm = |r: &RbacRule| {
                    r.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(super::plan::CONFIRM_PRUNE_ANNOTATION).cloned())
                };
                let confirmed = self
                    .rules
                    .get(&name)
                    .is_some_and(|old| confirm(old) != confirm(&r));
                self.rules.insert(name, r);
                match (same_spec, confirmed) {
                    (true, false) => Change::default(),
                    (true, true) => Change {
                        dirty: true,
                        ..Change::default()
                    },
                    (false, _) => changed,
                }
            }
            Step::Remove(r) => {
                self.rules.remove(&super::tenants::key_of(&r));
                changed
            }
            Step::Replace(all) => {
                self.rules
                    .retain(|key, _| super::tenants::is_tenant_key(key) != tenant);
                self.rules
                    .extend(all.into_iter().map(|r| (super::tenants::key_of(&r), r)));
                changed
            }
        }
    }

    /// An event of an output kind's watch; whether it changed the cache.
    /// A list is applied object by object, and what it no longer holds
    /// swept at its end: unchanged objects keep their cached copy (no
    /// second copy of thousands of objects during a relist, and the plan's
    /// memo stays valid).
    fn apply_owned_event(&mut self, kind: OutputKind, ev: Event<Live>) -> bool {
        match ev {
            Event::Init => {
                self.relisting.insert(kind, BTreeSet::new());
                false
            }
            Event::InitApply(o) => {
                if let Some(id) = o.id() {
                    // The cached key's text, when known: a relist of
                    // thousands of objects adds no second copy of names.
                    let id = match self.owned.get_key_value(id) {
                        Some((known, _)) => known.clone(),
                        None => id.clone(),
                    };
                    self.relisting.entry(kind).or_default().insert(id);
                }
                self.upsert_rbac(o)
            }
            Event::InitDone => {
                let seen = self.relisting.remove(&kind).unwrap_or_default();
                let listing = self.owned_listing.entry(kind).or_default();
                listing.synced = true;
                listing.error = None;
                let gone: Vec<ObjectId> = self
                    .owned
                    .keys()
                    .chain(self.foreign.iter())
                    .filter(|id| id.kind == kind && !seen.contains(*id))
                    .cloned()
                    .collect();
                for id in gone {
                    self.forget_rbac(&id);
                }
                true
            }
            ev => {
                let listing = self.owned_listing.entry(kind).or_default();
                match listing.step(ev) {
                    Step::Upsert(o) => self.upsert_rbac(o),
                    Step::Remove(o) => {
                        // The deletion of an older object of the name (a
                        // binding re-created with a new roleRef, whose new
                        // copy the cache already learned) keeps the new one.
                        let newer =
                            |l: &Live| matches!((l.uid(), o.uid()), (Some(a), Some(b)) if a != b);
                        match o.id() {
                            Some(id) if !self.owned.get(id).is_some_and(newer) => {
                                self.forget_rbac(id)
                            }
                            _ => false,
                        }
                    }
                    Step::Nothing | Step::Replace(_) => false,
                }
            }
        }
    }

    /// Whether `o` changes what the store holds under `k`: a new
    /// resourceVersion alone does not ([`same_but_version`]).
    fn changes_stored(
        &self,
        gk: &GroupKind,
        k: &crate::engine::store::ObjectKey,
        o: &Value,
    ) -> bool {
        !self
            .store
            .get(gk, k)
            .is_some_and(|old| same_but_version(old, o))
    }

    /// An event of the watch on a kind the rules read (of its current
    /// `epoch`; a stopped watch's late events are dropped); whether it
    /// changed the store. As for the output kinds, a list is applied
    /// object by object (an unchanged object keeps its stored copy) and
    /// what it no longer holds is swept at its end, which is also when it
    /// counts as a change.
    fn apply_kind_event(&mut self, gk: &GroupKind, epoch: u64, ev: Event<Value>) -> bool {
        let Some(w) = self.kinds.get_mut(gk).filter(|w| w.epoch == epoch) else {
            return false;
        };
        match ev {
            Event::Init => {
                w.seen = Some(BTreeSet::new());
                false
            }
            Event::InitApply(o) => {
                if let Some(k) = key_of(&o) {
                    w.seen.get_or_insert_with(BTreeSet::new).insert(k.clone());
                    if self.changes_stored(gk, &k, &o) {
                        let _ = self.store.insert(o);
                    }
                }
                false
            }
            Event::InitDone => {
                let seen = w.seen.take().unwrap_or_default();
                w.listing.synced = true;
                w.listing.error = None;
                let gone: Vec<_> = self
                    .store
                    .list(gk)
                    .filter_map(key_of)
                    .filter(|k| !seen.contains(k))
                    .collect();
                for k in gone {
                    self.store.remove(gk, &k);
                }
                true
            }
            Event::Apply(o) => {
                let differs = key_of(&o).is_some_and(|k| self.changes_stored(gk, &k, &o));
                if differs {
                    let _ = self.store.insert(o);
                }
                differs
            }
            Event::Delete(o) => match key_of(&o) {
                Some(k) => self.store.remove(gk, &k).is_some(),
                None => false,
            },
        }
    }

    /// An event of the allow-list ClusterRole's watch; whether it changed
    /// the allow-list.
    fn apply_allow_event(&mut self, ev: Event<ClusterRole>) -> bool {
        match self.allow_listing.step(ev) {
            Step::Nothing => return false,
            Step::Upsert(cr) => self.allow = Some(cr),
            Step::Remove(_) => self.allow = None,
            Step::Replace(all) => self.allow = all.into_iter().next(),
        }
        true
    }

    /// A watch error: its listing records it. A kind the API server no
    /// longer serves (its CRD went away) stops being watched, keeps its
    /// last list (no pruning from it while unresolved) and is rediscovered
    /// later.
    fn apply_watch_error(&mut self, source: Source, error: &watcher::Error) -> Change {
        tracing::warn!(?source, error = %error, "watch error");
        let mut change = Change::default();
        match source {
            Source::Rules => self.rules_listing.fail(error),
            // No NamespacedRbacRule kind served (its CRD not installed): no
            // tenant rule exists, and the cluster rules go on.
            // (The watcher retries with backoff: a repeated 404 changes
            // nothing.)
            Source::Tenants if not_found(error) => {
                let none = self.tenants_listing.synced
                    && !self.rules.keys().any(|k| super::tenants::is_tenant_key(k));
                if none {
                    return change;
                }
                self.apply_rule_event(Event::Init, true);
                return self.apply_rule_event(Event::InitDone, true);
            }
            Source::Tenants => self.tenants_listing.fail(error),
            Source::Owned(k) => self.owned_listing.entry(k).or_default().fail(error),
            Source::Allow => self.allow_listing.fail(error),
            Source::Kind(gk, epoch) => {
                if let Some(w) = self.kinds.get_mut(&gk).filter(|w| w.epoch == epoch) {
                    w.listing.fail(error);
                    if not_found(error) {
                        w.watching = false;
                        w.seen = None;
                        w.unresolved = Some(format!("{gk} is no longer served by the API server"));
                        change.lost_kind = true;
                    }
                    change.dirty = true;
                }
            }
        }
        change
    }

    /// An object of an output kind as a watch delivers it: ours is cached,
    /// anyone else's only named (taking our label off an object makes it
    /// someone else's).
    /// An object of an output kind is gone: from our cache, the names, and
    /// the store.
    fn forget_rbac(&mut self, id: &ObjectId) -> bool {
        self.forged.remove(id);
        let foreign = self.foreign.remove(id);
        let owned = self.remove_owned(id);
        let key = id.store_key();
        let read = self.store.remove(gk_of(id.kind), &key).is_some();
        owned || foreign || read
    }

    fn upsert_rbac(&mut self, mut o: Live) -> bool {
        let Some(id) = o.id().cloned() else {
            return false;
        };
        if o.is_ours() {
            self.forged.remove(&id);
            let foreign = self.foreign.remove(&id);
            return self.upsert_live(id, o) || foreign;
        }
        // Labelled ours by someone else: anyone's, and reported.
        let forged = o.is_managed();
        if forged {
            self.note_forged(&id, o.rule());
        } else {
            self.forged.remove(&id);
        }
        let owned = self.remove_owned(&id);
        let gk = gk_of(id.kind);
        let mut read = false;
        // Kept whole only where a rule reads the kind (rules copied from
        // ClusterRoles, an allow-list), else only its name is.
        if self.kinds.contains_key(gk) {
            o.unpack();
            let key = id.store_key();
            if let Some(object) = o.shared() {
                // The engine sees it without the claim, as anyone's.
                let object = match forged {
                    true => {
                        let mut copy = Value::clone(object);
                        crate::engine::output::disown(&mut copy);
                        Arc::new(copy)
                    }
                    false => Arc::clone(object),
                };
                if self.store.get(gk, &key) != Some(&*object) {
                    read = self.store.insert_shared(object).is_ok();
                }
            }
        }
        self.foreign.insert(id) || owned || read
    }

    /// Records an object labelled ours that our inventory did not make,
    /// logging it when it is new or names another rule (the pass reports
    /// it on the rule it names, and counts it).
    fn note_forged(&mut self, id: &ObjectId, rule: Option<&str>) {
        let rule = rule.map(str::to_string);
        if self.forged.get(id) != Some(&rule) {
            tracing::warn!(
                object = %id,
                rule = rule.as_deref().unwrap_or_default(),
                "labelled app.kubernetes.io/managed-by=rbac-rules, but rbac-rules did not make it (no Apply entry of its field manager): not ours, left alone"
            );
            self.forged.insert(id.clone(), rule);
        }
    }

    /// Caches one of our objects.
    fn upsert_live(&mut self, id: ObjectId, mut live: Live) -> bool {
        // Nothing reads the body of our object while a desired copy stands
        // for it: policy judges that copy, and the engine's view shows a
        // rule that copy or nothing, never our live one (see
        // `engine::view`). Packed then, and out of the engine's store,
        // until a plan keeps it without a desired copy ([`World::unpack`])
        // or its rule is held ([`World::unpack_held`]). Where no rule reads
        // the kind, only what policy reads is kept.
        let read = self.kinds.contains_key(gk_of(id.kind));
        if !read {
            live.slim();
        }
        live.pack();
        match self.owned.get(&id) {
            Some(known) if known == &live => return false,
            // A watch event from before a write whose response the cache
            // already learned: older, so nothing to change.
            Some(known) if older(&live, known) => return false,
            // The version already known (perhaps unpacked since): nothing
            // changed. Where a rule reads the kind, an unpacked copy may be
            // slim: the new one replaces it.
            Some(known) if (!read || known.is_packed()) && known.same_version(&live) => {
                return false;
            }
            _ => {}
        }
        self.mirror(&id, live.shared());
        self.foreign.remove(&id);
        if self.owned.insert(id, live).is_none()
            && self.owned.len() >= (self.owned_packed_len + self.owned_packed_len / 4).max(1024)
        {
            pack_map(&mut self.owned);
            self.owned_packed_len = self.owned.len();
        }
        true
    }

    /// Unpacks the bodies of `kept` objects (those a plan left alone: no
    /// desired copy stands for them), so that policy judges them in the
    /// next evaluation. Whether any was packed. Packed objects are Roles
    /// no rule reads ([`Live::pack`]): while a desired copy stands for one,
    /// policy judges that copy and the plan compares digests.
    pub fn unpack<'a>(&mut self, kept: impl IntoIterator<Item = &'a ObjectId>) -> bool {
        let mut any = false;
        for id in kept {
            let Some(live) = self.owned.get_mut(id) else {
                continue;
            };
            if live.unpack() {
                if !self.kinds.contains_key(gk_of(id.kind)) {
                    live.slim();
                }
                let object = live.shared().cloned();
                self.mirror(id, object.as_ref());
                any = true;
            }
        }
        any
    }

    /// Drops the packed `rules` of our objects a plan found equal to their
    /// desired copy ([`Live::shed_rules`]). How many.
    pub fn shed_rules(&mut self) -> usize {
        self.owned
            .values_mut()
            .map(Live::shed_rules)
            .filter(|shed| *shed)
            .count()
    }

    /// Unpacks our objects of held rules where a rule reads the kind: the
    /// engine's view shows a held rule's live objects (it renders no copy
    /// of them), so they are in the store before the evaluation that holds
    /// the rule. Whether any was packed.
    pub fn unpack_held(&mut self, holds: &BTreeMap<String, Hold>) -> bool {
        if holds.is_empty() {
            return false;
        }
        let ids: Vec<ObjectId> = self
            .owned
            .iter()
            .filter(|(id, l)| {
                l.is_packed()
                    && self.kinds.contains_key(gk_of(id.kind))
                    && l.rule().is_some_and(|r| holds.contains_key(r))
            })
            .map(|(id, _)| id.clone())
            .collect();
        self.unpack(&ids)
    }

    fn remove_owned(&mut self, id: &ObjectId) -> bool {
        self.mirror(id, None);
        self.owned.remove(id).is_some()
    }

    /// Keeps the engine's view of our own objects: every managed object is
    /// in the store (sharing the cached copy), so that policy judges every
    /// live object we made and revokes what it now refuses, and rules that
    /// read the kind see it.
    fn mirror(&mut self, id: &ObjectId, object: Option<&Arc<Value>>) {
        let gk = gk_of(id.kind);
        let key = id.store_key();
        match object {
            Some(o) => {
                if self.store.insert_shared(o.clone()).is_err() {
                    tracing::debug!(object = %id, "not mirrored into the store");
                }
            }
            None => {
                self.store.remove(gk, &key);
            }
        }
    }

    /// Learns what a write did as soon as it is answered: the object as
    /// the API server returned it, or that it is gone. The watch events
    /// that follow confirm it (or are older, and ignored).
    pub fn learn(&mut self, learned: Learned) -> bool {
        match learned {
            Learned::Applied(live) => match live.id().cloned() {
                Some(id) => self.upsert_live(id, live),
                None => false,
            },
            // Only the object deleted: not one made again since.
            Learned::Deleted(id, uid) => {
                let same = self
                    .owned
                    .get(&id)
                    .is_some_and(|l| uid.is_none() || l.uid() == uid.as_deref());
                same && self.remove_owned(&id)
            }
        }
    }

    /// Whether the rules, owned-object and allow-list watches have listed:
    /// before that nothing is written.
    pub fn base_synced(&self) -> bool {
        self.rules_listing.synced
            && self.tenants_listing.synced
            && OutputKind::ALL
                .iter()
                .all(|k| self.owned_listing.get(k).is_some_and(|l| l.synced))
            && (self.allow_name.is_none() || self.allow_listing.synced)
    }

    /// Whether a list is in progress: a watch (re)started and has not yet
    /// received all of it. Its end is a change that asks for a pass.
    pub fn listing(&self) -> bool {
        self.rules_listing.buffer.is_some()
            || self.tenants_listing.buffer.is_some()
            || self.allow_listing.buffer.is_some()
            || !self.relisting.is_empty()
            || self.kinds.values().any(|w| w.seen.is_some())
    }

    /// Whether every rule kind has either listed or been found unserved:
    /// the initial sync is done (readiness) and pruning is allowed.
    pub fn kinds_settled(&self) -> bool {
        self.kinds
            .values()
            .all(|w| w.unresolved.is_some() || self.listed(w).0)
    }

    /// Whether a rule kind has listed, and the last list error. The output
    /// kinds are fed by their own watches (every object of the kind), not
    /// by a second one.
    fn listed<'a>(&'a self, w: &'a KindWatch) -> (bool, Option<&'a String>) {
        match output_kind(&w.interest.gk) {
            Some(k) => self
                .owned_listing
                .get(&k)
                .map_or((false, None), |l| (l.synced, l.error.as_ref())),
            None => (w.listing.synced, w.listing.error.as_ref()),
        }
    }

    /// What a reconcile sees: the rules, the caches, and the allow-list and
    /// holds computed once by the caller ([`World::allow_rules`],
    /// [`World::holds`]); deletions only once every watch has listed.
    pub fn snapshot<'a>(
        &'a self,
        allow: Option<&'a crate::policy::AllowList>,
        holds: &'a BTreeMap<String, Hold>,
    ) -> super::sync::Snapshot<'a> {
        super::sync::Snapshot {
            rules: &self.rules,
            observed: &self.store,
            owned: &self.owned,
            foreign: &self.foreign,
            forged: &self.forged,
            holds,
            allow,
            prune: self.kinds_settled(),
        }
    }

    /// The allow-list, when `--allow-clusterrole` is set and found.
    pub fn allow_rules(&self) -> Option<crate::policy::AllowList> {
        self.allow
            .as_ref()
            .map(crate::policy::AllowList::from_cluster_role)
    }

    /// Rules not to evaluate now, and why.
    pub fn holds(&self) -> BTreeMap<String, Hold> {
        let mut out = BTreeMap::new();
        if let Some(name) = &self.allow_name
            && self.allow.is_none()
        {
            for rule in self.rules.keys() {
                out.insert(
                    rule.clone(),
                    Hold::AllowListNotFound(format!(
                        "the allow-list ClusterRole {name:?} (--allow-clusterrole) does not exist; no rule is evaluated"
                    )),
                );
            }
            return out;
        }
        for (rule, (spec, kinds)) in &self.rule_kinds {
            let mut not_served = Vec::new();
            let mut failed = Vec::new();
            let mut waiting = Vec::new();
            for gk in kinds {
                match self.kinds.get(gk) {
                    Some(KindWatch {
                        unresolved: Some(why),
                        ..
                    }) => not_served.push(why.clone()),
                    Some(w) if !self.listed(w).0 => match self.listed(w).1 {
                        Some(e) => failed.push(format!("cannot list {gk}: {e}")),
                        None => waiting.push(gk.to_string()),
                    },
                    Some(_) => {}
                    None => waiting.push(gk.to_string()),
                }
            }
            let hold = if !not_served.is_empty() {
                Some(Hold::KindNotServed(not_served.join("; ")))
            } else if !failed.is_empty() {
                Some(Hold::WatchFailed(failed.join("; ")))
            } else if !waiting.is_empty() {
                Some(Hold::WaitingForSync(format!(
                    "waiting for the first list of {}",
                    waiting.join(", ")
                )))
            } else {
                None
            };
            let hold = hold.or_else(|| {
                (self.slow.get(rule) == Some(spec)).then(|| {
                    Hold::SlowLane(
                        "slower than --slow-rule-seconds: evaluated in the slow lane".to_string(),
                    )
                })
            });
            if let Some(h) = hold {
                out.insert(rule.clone(), h);
            }
        }
        self.hold_readers_of_waiting(&mut out);
        out
    }

    /// Moves rules to the slow lane (see [`Hold::SlowLane`]): they stay
    /// there while their spec stays the same. Returning one to the main
    /// pass would render it whole there again, and a rule still slow would
    /// hold that pass up to `--slow-rule-seconds` every time.
    pub fn move_to_slow_lane(&mut self, rules: impl IntoIterator<Item = String>) {
        for name in rules {
            if let Some(r) = self.rules.get(&name) {
                self.slow.insert(name, r.spec.clone());
            }
        }
        let rules = &self.rules;
        self.slow
            .retain(|name, spec| rules.get(name).is_some_and(|r| r.spec == *spec));
    }

    /// Makes `into` hold what the store holds, object for object (shared,
    /// not copied): the slow lane evaluates its own copy while the world
    /// goes on taking events, and one kept up to date this way keeps a
    /// journal of only what changed, so the slow lane renders again only
    /// what that touches. `kinds`: the kinds copied last time, updated.
    /// Whether anything changed.
    pub fn copy_store(&self, into: &mut ObjectStore, kinds: &mut BTreeSet<GroupKind>) -> bool {
        let mut now: BTreeSet<GroupKind> = self.kinds.keys().cloned().collect();
        now.extend(OutputKind::ALL.iter().map(|k| gk_of(*k).clone()));
        let mut changed = false;
        for gk in kinds.difference(&now) {
            changed |= into.list(gk).next().is_some();
            into.clear_kind(gk);
        }
        for gk in &now {
            let gone: Vec<_> = into
                .entries(gk)
                .filter(|(k, _)| self.store.get_shared(gk, k).is_none())
                .map(|(k, _)| k.clone())
                .collect();
            for k in gone {
                into.remove(gk, &k);
                changed = true;
            }
            for (k, o) in self.store.entries(gk) {
                if !into.get_shared(gk, k).is_some_and(|x| Arc::ptr_eq(x, o)) {
                    changed |= into.insert_shared(Arc::clone(o)).is_ok();
                }
            }
        }
        *kinds = now;
        changed
    }

    /// A rule that reads (rulesFrom, related objects) what a rule still
    /// waiting for its first lists emits would render from a partial
    /// picture and write its objects again once the picture is whole: it
    /// waits too, so that a first sync writes each object once.
    fn hold_readers_of_waiting(&self, out: &mut BTreeMap<String, Hold>) {
        let emits = |spec: &RbacRuleSpec| -> BTreeSet<GroupKind> {
            spec.outputs
                .iter()
                .map(|o| crate::engine::compile::output_gk(o.kind))
                .collect()
        };
        // What each rule reads itself (not what policy reads for it).
        let reads: BTreeMap<&str, Vec<GroupKind>> = self
            .rule_kinds
            .iter()
            .map(|(rule, (spec, _))| {
                let source = crate::engine::RuleSource {
                    name: rule.clone(),
                    spec: spec.clone(),
                    namespace: super::tenants::namespace_of(rule),
                };
                let kinds = crate::engine::shape::interests(std::slice::from_ref(&source))
                    .into_iter()
                    .map(|i| i.gk)
                    .collect();
                (rule.as_str(), kinds)
            })
            .collect();
        loop {
            // A rule of the slow lane is a producer too: its readers go
            // with it, so that they render from its new outputs, not from
            // what it made before.
            let waiting: BTreeMap<&str, (BTreeSet<GroupKind>, bool)> = out
                .iter()
                .filter(|(_, h)| matches!(h, Hold::WaitingForSync(_) | Hold::SlowLane(_)))
                .filter_map(|(name, h)| {
                    let (spec, _) = self.rule_kinds.get(name)?;
                    Some((name.as_str(), (emits(spec), h.is_slow_lane())))
                })
                .collect();
            let mut more = Vec::new();
            for (rule, read) in &reads {
                if out.contains_key(*rule) {
                    continue;
                }
                let producers: Vec<(&str, bool)> = waiting
                    .iter()
                    .filter(|(_, (kinds, _))| read.iter().any(|gk| kinds.contains(gk)))
                    .map(|(name, (_, slow))| (*name, *slow))
                    .collect();
                if producers.is_empty() {
                    continue;
                }
                let names: Vec<&str> = producers.iter().map(|p| p.0).collect();
                let names = names.join(", ");
                // Waiting for a list wins: the slow lane evaluates only
                // rules that can run now.
                let hold = if producers.iter().all(|p| p.1) {
                    Hold::SlowLane(format!("reads outputs of rules in the slow lane: {names}"))
                } else {
                    Hold::WaitingForSync(format!(
                        "waiting for rules whose outputs it reads: {names}"
                    ))
                };
                more.push((rule.to_string(), hold));
            }
            if more.is_empty() {
                return;
            }
            out.extend(more);
        }
    }

    /// Recomputes the kinds each rule reads and the merged interests.
    pub(super) fn interests(&mut self, manage: ManageLevel) -> BTreeMap<GroupKind, Interest> {
        // The engine checks what bindings and aggregations grant against
        // every ClusterRole and Role (with or without an allow-list, when
        // a rule emits either); with an allow-list, every output: the
        // (empty) placeholder makes the interests include them.
        let options = Options {
            manage,
            allow: self.allow_name.as_ref().map(|_| Default::default()),
            tenancy: self.tenancy.clone(),
            ..Options::default()
        };
        self.rule_kinds
            .retain(|name, _| self.rules.contains_key(name));
        for (name, rule) in &self.rules {
            if self
                .rule_kinds
                .get(name)
                .is_some_and(|(spec, _)| *spec == rule.spec)
            {
                continue;
            }
            let source = RuleSource {
                name: name.clone(),
                spec: rule.spec.clone(),
                namespace: super::tenants::namespace_of(name),
            };
            let kinds = crate::engine::interests(std::slice::from_ref(&source), &options)
                .into_iter()
                .map(|i| i.gk)
                .collect();
            self.rule_kinds
                .insert(name.clone(), (rule.spec.clone(), kinds));
        }
        let sources: Vec<RuleSource> = self
            .rules
            .iter()
            .map(|(name, r)| RuleSource {
                name: name.clone(),
                spec: r.spec.clone(),
                namespace: super::tenants::namespace_of(name),
            })
            .collect();
        crate::engine::interests(&sources, &options)
            .into_iter()
            .map(|i| (i.gk.clone(), i))
            .collect()
    }

    /// Kinds watched or waiting for discovery that `wanted` does not name.
    pub(super) fn kinds_not_in(&self, wanted: &BTreeMap<GroupKind, Interest>) -> Vec<GroupKind> {
        self.kinds
            .keys()
            .filter(|gk| !wanted.contains_key(*gk))
            .cloned()
            .collect()
    }

    /// Stops tracking a kind and drops its objects (of an output kind, the
    /// ones that are not ours).
    pub(super) fn forget_kind(&mut self, gk: &GroupKind) {
        self.kinds.remove(gk);
        self.store.clear_kind(gk);
        if let Some(kind) = output_kind(gk) {
            let ours: Vec<(ObjectId, Option<Arc<Value>>)> = self
                .owned
                .iter()
                .filter(|(id, _)| id.kind == kind)
                .map(|(id, l)| (id.clone(), l.shared().cloned()))
                .collect();
            for (id, o) in ours {
                self.mirror(&id, o.as_ref());
            }
        }
    }

    /// Whether the watch of an output kind must list again now that a rule
    /// reads the kind (its last list kept only the names of objects not
    /// ours); if so, nothing is evaluated until it has. A list still to
    /// come keeps every object by itself.
    pub(super) fn relist_outputs(&mut self, kind: OutputKind) -> bool {
        let listing = self.owned_listing.entry(kind).or_default();
        let again = listing.synced;
        listing.synced = false;
        again
    }

    /// The interest a kind is watched with.
    pub(super) fn interest_of(&self, gk: &GroupKind) -> Option<&Interest> {
        self.kinds.get(gk).map(|w| &w.interest)
    }

    /// Whether a watch on the kind runs.
    pub(super) fn is_watching(&self, gk: &GroupKind) -> bool {
        self.kinds.get(gk).is_some_and(|w| w.watching)
    }

    /// Interests of kinds that were not served when last discovered.
    pub(super) fn unresolved_interests(&self) -> Vec<Interest> {
        self.kinds
            .values()
            .filter(|w| w.unresolved.is_some())
            .map(|w| w.interest.clone())
            .collect()
    }

    /// A fresh epoch for a (re)started watch.
    pub(super) fn next_epoch(&mut self) -> u64 {
        let e = self.next_epoch;
        self.next_epoch += 1;
        e
    }

    /// Records a (re)started watch of `interest` (or why there is none).
    /// Objects of an earlier list stay until the new list replaces them.
    pub(super) fn watch_kind(
        &mut self,
        interest: Interest,
        epoch: u64,
        unresolved: Option<String>,
    ) {
        self.kinds.insert(
            interest.gk.clone(),
            KindWatch {
                interest,
                watching: unresolved.is_none(),
                unresolved,
                epoch,
                listing: Listing::default(),
                seen: None,
            },
        );
    }

    /// Number of kinds watched.
    pub fn watched_kinds(&self) -> usize {
        self.kinds.values().filter(|w| w.watching).count()
    }

    /// Whether some kind waits for rediscovery.
    pub fn has_unresolved(&self) -> bool {
        self.kinds.values().any(|w| w.unresolved.is_some())
    }
}

/// Whether `new` is an older version of `known`: both resourceVersions
/// parse as integers (etcd revisions, as every API server serves them) and
/// `new`'s is lower. Opaque versions never count as older.
fn older(new: &Live, known: &Live) -> bool {
    let rv = |l: &Live| l.resource_version().and_then(|v| v.parse::<u64>().ok());
    matches!((rv(new), rv(known)), (Some(n), Some(k)) if n < k)
}

fn without_managed_fields(mut r: RbacRule) -> RbacRule {
    r.metadata.managed_fields = None;
    r
}

pub(super) fn map_event<A, B>(ev: Event<A>, f: impl Fn(A) -> B) -> Event<B> {
    match ev {
        Event::Apply(o) => Event::Apply(f(o)),
        Event::Delete(o) => Event::Delete(f(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(f(o)),
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::compile::output_gk;
    use crate::engine::output::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};
    use serde_json::json;

    #[test]
    fn a_packed_map_keeps_every_entry_in_order() {
        let mut m: BTreeMap<u32, u32> = (0..5000).rev().map(|i| (i * 2, i)).collect();
        let before: Vec<(u32, u32)> = m.iter().map(|(k, v)| (*k, *v)).collect();
        pack_map(&mut m);
        assert_eq!(m.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>(), before);
        assert_eq!(m.get(&4000), Some(&2000));
        m.insert(1, 1);
        assert_eq!(m.len(), 5001);
        let mut empty: BTreeMap<u32, u32> = BTreeMap::new();
        pack_map(&mut empty);
        assert!(empty.is_empty());
    }

    fn rule(name: &str, generation: i64, kind: &str) -> RbacRule {
        let spec: RbacRuleSpec = serde_json::from_value(json!({
            "trigger": {"apiGroup": "example.org", "kind": kind, "metadataOnly": true},
            "outputs": [{"kind": "ClusterRole", "name": "x-{{trigger.metadata.name}}"}]
        }))
        .expect("spec");
        let mut r = RbacRule::new(name, spec);
        r.metadata.generation = Some(generation);
        r
    }

    /// An event of an output-kind watch, as the watch task makes it; an
    /// object labelled ours without `managedFields` gets the entry our
    /// server-side apply leaves (ours: we made it).
    fn owned(kind: OutputKind, e: Event<Value>) -> Feed {
        Feed::Owned(kind, map_event(e, |o| Live::new(made_by_us(o))))
    }

    /// `o` as our apply leaves it: an `Apply` entry of our field manager
    /// owning every label, annotation and top-level field, when labelled
    /// ours and without `managedFields`.
    fn made_by_us(mut o: Value) -> Value {
        if !crate::engine::output::is_managed(&o) || o["metadata"].get("managedFields").is_some() {
            return o;
        }
        let keys = |v: &Value| -> serde_json::Map<String, Value> {
            v.as_object()
                .into_iter()
                .flat_map(|m| m.keys())
                .map(|k| (format!("f:{k}"), json!({})))
                .collect()
        };
        let mut fields = keys(&o);
        fields.insert(
            "f:metadata".into(),
            json!({"f:labels": keys(&o["metadata"]["labels"]),
                   "f:annotations": keys(&o["metadata"]["annotations"])}),
        );
        o["metadata"]["managedFields"] =
            json!([{"manager": "rbac-rules", "operation": "Apply", "fieldsV1": fields}]);
        o
    }

    fn widget(name: &str) -> Value {
        json!({"apiVersion": "example.org/v1", "kind": "Widget", "metadata": {"name": name}})
    }

    /// Names of the stored objects of `gk`, in store order.
    fn stored_names<'a>(w: &'a World, gk: &GroupKind) -> Vec<&'a str> {
        w.store
            .list(gk)
            .filter_map(|o| o["metadata"]["name"].as_str())
            .collect()
    }

    fn listed(world: &mut World, feed: impl Fn(Event<Value>) -> Feed, objects: Vec<Value>) {
        world.apply(feed(Event::Init));
        for o in objects {
            world.apply(feed(Event::InitApply(o)));
        }
        world.apply(feed(Event::InitDone));
    }

    fn base_world() -> World {
        let mut w = World::new(None);
        w.apply(Feed::Rules(Box::new(Event::Init)));
        w.apply(Feed::Rules(Box::new(Event::InitApply(rule(
            "r", 1, "Widget",
        )))));
        assert!(!w.base_synced());
        w.apply(Feed::Rules(Box::new(Event::InitDone)));
        for k in OutputKind::ALL {
            listed(&mut w, |e| owned(k, e), vec![]);
        }
        // Nothing is written before the tenant rules have listed too.
        assert!(!w.base_synced());
        w.apply(Feed::Tenants(Box::new(Event::Init)));
        w.apply(Feed::Tenants(Box::new(Event::InitDone)));
        assert!(w.base_synced());
        w
    }

    fn watch(w: &mut World, gk: &GroupKind, epoch: u64) {
        let interest = w.interests(ManageLevel::All).remove(gk).expect("interest");
        assert!(interest.metadata_only);
        w.kinds.insert(
            gk.clone(),
            KindWatch {
                interest,
                unresolved: None,
                epoch,
                listing: Listing::default(),
                seen: None,
                watching: true,
            },
        );
    }

    #[test]
    fn an_allow_list_adds_watches_on_every_role() {
        let rbac = |k: &str| GroupKind::new("rbac.authorization.k8s.io", k);
        let mut without = base_world();
        let kinds = without.interests(ManageLevel::All);
        // Its rule emits neither a binding nor an aggregated role.
        assert!(!kinds.contains_key(&rbac("ClusterRole")));

        let mut with = World::new(Some("limits".into()));
        with.apply(Feed::Rules(Box::new(Event::Init)));
        with.apply(Feed::Rules(Box::new(Event::InitApply(rule(
            "r", 1, "Widget",
        )))));
        with.apply(Feed::Rules(Box::new(Event::InitDone)));
        let kinds = with.interests(ManageLevel::All);
        for k in ["ClusterRole", "Role"] {
            let i = kinds
                .get(&rbac(k))
                .expect("watched for the allow-list check");
            assert!(!i.metadata_only, "{k}: rules are needed, not just metadata");
        }
    }

    #[test]
    fn a_new_resource_version_alone_is_not_a_change() {
        let mut w = base_world();
        let gk = GroupKind::new("example.org", "Widget");
        watch(&mut w, &gk, 1);
        let version = |rv: &str, label: &str| {
            let mut o = widget("a");
            o["metadata"]["resourceVersion"] = json!(rv);
            o["metadata"]["labels"] = json!({"l": label});
            o
        };
        listed(
            &mut w,
            |e| Feed::Kind(gk.clone(), 1, e),
            vec![version("1", "x")],
        );
        let key = (String::new(), "a".to_string());
        // A write the watch cut away (a status update) bumps only the
        // resourceVersion: no change, the stored copy stays.
        let c = w.apply(Feed::Kind(gk.clone(), 1, Event::Apply(version("2", "x"))));
        assert!(!c.dirty);
        assert_eq!(w.store.get(&gk, &key), Some(&version("1", "x")));
        // Relisted so: the same.
        let before = w.store.version();
        w.apply(Feed::Kind(gk.clone(), 1, Event::Init));
        w.apply(Feed::Kind(
            gk.clone(),
            1,
            Event::InitApply(version("3", "x")),
        ));
        w.apply(Feed::Kind(gk.clone(), 1, Event::InitDone));
        assert_eq!(w.store.changes_since(before).map(Iterator::count), Some(0));
        assert_eq!(w.store.get(&gk, &key), Some(&version("1", "x")));
        // Anything else that changes is a change, with its resourceVersion.
        let c = w.apply(Feed::Kind(gk.clone(), 1, Event::Apply(version("4", "y"))));
        assert!(c.dirty);
        assert_eq!(w.store.get(&gk, &key), Some(&version("4", "y")));
    }

    #[test]
    fn a_rule_waits_for_its_kind_then_runs() {
        let mut w = base_world();
        let gk = GroupKind::new("example.org", "Widget");
        watch(&mut w, &gk, 1);
        assert!(matches!(w.holds().get("r"), Some(Hold::WaitingForSync(_))));
        assert!(!w.kinds_settled());
        // A list in progress starts no reconcile and the rule stays held;
        // InitDone completes it.
        w.apply(Feed::Kind(gk.clone(), 1, Event::Init));
        let c = w.apply(Feed::Kind(gk.clone(), 1, Event::InitApply(widget("a"))));
        assert!(!c.dirty);
        assert!(matches!(w.holds().get("r"), Some(Hold::WaitingForSync(_))));
        let c = w.apply(Feed::Kind(gk.clone(), 1, Event::InitDone));
        assert!(c.dirty);
        assert_eq!(w.store.list(&gk).count(), 1);
        assert!(w.holds().is_empty());
        // A relist keeps the copy of an unchanged object and sweeps what
        // it no longer holds, at its end.
        w.apply(Feed::Kind(gk.clone(), 1, Event::Apply(widget("b"))));
        let key = |n: &str| (String::new(), n.to_string());
        let a = w.store.get(&gk, &key("a")).expect("a") as *const Value;
        w.apply(Feed::Kind(gk.clone(), 1, Event::Init));
        w.apply(Feed::Kind(gk.clone(), 1, Event::InitApply(widget("a"))));
        assert_eq!(w.store.list(&gk).count(), 2);
        w.apply(Feed::Kind(gk.clone(), 1, Event::InitDone));
        assert_eq!(w.store.list(&gk).count(), 1);
        assert!(std::ptr::eq(a, w.store.get(&gk, &key("a")).expect("a")));
        assert!(w.kinds_settled());
        // Events of a stopped predecessor are ignored.
        let c = w.apply(Feed::Kind(gk.clone(), 0, Event::Apply(widget("b"))));
        assert_eq!(c, Change::default());
        // An unchanged object is not a change.
        let c = w.apply(Feed::Kind(gk.clone(), 1, Event::Apply(widget("a"))));
        assert!(!c.dirty);
    }

    /// The base world plus two rules: "copier" copies the rules of the
    /// ClusterRoles "r" emits; "other" emits a Role nobody reads.
    fn world_with_copier_and_other() -> World {
        let mut w = base_world();
        let spec: RbacRuleSpec = serde_json::from_value(json!({
            "outputs": [{"kind": "ClusterRole", "name": "copied",
                         "rulesFrom": {"clusterRoleNames": ["x-a"]}}]
        }))
        .expect("spec");
        w.apply(Feed::Rules(Box::new(Event::Apply(RbacRule::new(
            "copier", spec,
        )))));
        let spec: RbacRuleSpec = serde_json::from_value(json!({
            "outputs": [{"kind": "Role", "name": "other", "namespace": "default"}]
        }))
        .expect("spec");
        w.apply(Feed::Rules(Box::new(Event::Apply(RbacRule::new(
            "other", spec,
        )))));
        w.interests(ManageLevel::All);
        w
    }

    #[test]
    fn a_rule_reading_what_a_waiting_rule_emits_waits_too() {
        // A rule emitting only what nobody reads ("other") does not wait.
        let mut w = world_with_copier_and_other();
        let gk = GroupKind::new("example.org", "Widget");
        watch(&mut w, &gk, 1);
        let holds = w.holds();
        assert!(matches!(holds.get("r"), Some(Hold::WaitingForSync(_))));
        match holds.get("copier") {
            Some(Hold::WaitingForSync(why)) => assert!(why.contains("r"), "{why}"),
            other => panic!("copier: {other:?}"),
        }
        assert!(!holds.contains_key("other"), "{holds:?}");
        listed(&mut w, |e| Feed::Kind(gk.clone(), 1, e), vec![widget("a")]);
        let holds = w.holds();
        assert!(!holds.contains_key("r"), "{holds:?}");
        assert!(
            !matches!(holds.get("copier"), Some(Hold::WaitingForSync(why)) if why.contains("outputs it reads")),
            "{holds:?}"
        );
    }

    #[test]
    fn a_slow_rule_and_its_readers_go_to_the_slow_lane_until_its_spec_changes() {
        let mut w = world_with_copier_and_other();
        let gk = GroupKind::new("example.org", "Widget");
        watch(&mut w, &gk, 1);
        listed(&mut w, |e| Feed::Kind(gk.clone(), 1, e), vec![widget("a")]);
        watch_whole(&mut w, &output_gk(OutputKind::ClusterRole));
        assert!(w.holds().is_empty(), "{:?}", w.holds());
        w.move_to_slow_lane(["r".to_string(), "gone".to_string()]);
        let holds = w.holds();
        assert!(
            matches!(holds.get("r"), Some(Hold::SlowLane(_))),
            "{holds:?}"
        );
        // The copier reads what "r" emits: it goes with it.
        match holds.get("copier") {
            Some(Hold::SlowLane(why)) => assert!(why.contains("r"), "{why}"),
            other => panic!("copier: {other:?}"),
        }
        assert!(!holds.contains_key("other"), "{holds:?}");
        assert!(!holds.contains_key("gone"), "{holds:?}");
        // The slow lane's copy of the store shares the world's objects, and
        // a copy made again with nothing changed is no change.
        let mut store = ObjectStore::new();
        let mut kinds = BTreeSet::new();
        assert!(w.copy_store(&mut store, &mut kinds));
        let key = (String::new(), "a".to_string());
        assert!(Arc::ptr_eq(
            store.get_shared(&gk, &key).expect("copied"),
            w.store.get_shared(&gk, &key).expect("stored")
        ));
        assert!(!w.copy_store(&mut store, &mut kinds));
        w.apply(Feed::Kind(gk.clone(), 1, Event::Apply(widget("b"))));
        w.apply(Feed::Kind(gk.clone(), 1, Event::Delete(widget("a"))));
        assert!(w.copy_store(&mut store, &mut kinds));
        let names: Vec<String> = store.entries(&gk).map(|(k, _)| k.1.clone()).collect();
        assert_eq!(names, vec!["b"]);
        // A rule waiting for a list is not evaluated by the slow lane: its
        // readers wait too.
        let mut waiting = w.holds();
        waiting.insert("r".into(), Hold::WaitingForSync("x".into()));
        waiting.remove("copier");
        w.hold_readers_of_waiting(&mut waiting);
        assert!(
            matches!(waiting.get("copier"), Some(Hold::WaitingForSync(_))),
            "{waiting:?}"
        );
        // A new spec gets a new chance in the main pass.
        let mut edited = rule("r", 2, "Widget");
        edited.spec.outputs[0].name = "y-{{trigger.metadata.name}}".into();
        w.apply(Feed::Rules(Box::new(Event::Apply(edited))));
        w.interests(ManageLevel::All);
        let holds = w.holds();
        assert!(holds.is_empty(), "{holds:?}");
    }

    #[test]
    fn a_kind_that_stops_being_served_holds_its_rules() {
        let mut w = base_world();
        let gk = GroupKind::new("example.org", "Widget");
        watch(&mut w, &gk, 1);
        listed(&mut w, |e| Feed::Kind(gk.clone(), 1, e), vec![widget("a")]);
        let status = kube::core::Status::failure("gone", "NotFound").with_code(404);
        let err = watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status)));
        let c = w.apply(Feed::Error(Source::Kind(gk.clone(), 1), err));
        assert!(c.lost_kind);
        assert!(matches!(w.holds().get("r"), Some(Hold::KindNotServed(_))));
        // Not served is settled: it does not block readiness or pruning of
        // other rules, and the last list is kept.
        assert!(w.kinds_settled());
        assert_eq!(w.store.list(&gk).count(), 1);
        assert!(w.has_unresolved());
    }

    #[test]
    fn a_failed_list_makes_the_cache_stale() {
        let mut w = base_world();
        let status = kube::core::Status::failure("denied", "Forbidden").with_code(403);
        let err = watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status)));
        w.apply(Feed::Error(Source::Owned(OutputKind::Role), err));
        assert!(!w.base_synced());
        listed(&mut w, |e| owned(OutputKind::Role, e), vec![]);
        assert!(w.base_synced());
    }

    #[test]
    fn a_list_in_progress_is_known_until_its_end() {
        let mut w = base_world();
        assert!(!w.listing());
        w.apply(owned(OutputKind::Role, Event::Init));
        assert!(w.listing());
        w.apply(owned(OutputKind::Role, Event::InitDone));
        assert!(!w.listing());
        w.apply(Feed::Rules(Box::new(Event::Init)));
        assert!(w.listing());
        w.apply(Feed::Rules(Box::new(Event::InitDone)));
        assert!(!w.listing());
    }

    #[test]
    fn status_only_rule_changes_re_render_nothing() {
        let mut w = base_world();
        let mut r = rule("r", 1, "Widget");
        r.status = Some(Default::default());
        let c = w.apply(Feed::Rules(Box::new(Event::Apply(r))));
        assert_eq!(c, Change::default());
        assert!(w.rules["r"].status.is_some());
        let c = w.apply(Feed::Rules(Box::new(Event::Apply(rule("r", 2, "Gadget")))));
        assert!(c.dirty && c.rules);
    }

    #[test]
    fn owned_objects_are_cached_without_managed_fields() {
        let mut w = base_world();
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "x", "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                         "managedFields": [{"manager": "rbac-rules", "operation": "Apply",
                                            "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}}}]}});
        let c = w.apply(owned(OutputKind::ClusterRole, Event::Apply(role.clone())));
        assert!(c.dirty);
        let live = &w.owned[&ObjectId::new(OutputKind::ClusterRole, "", "x")];
        assert!(live.object()["metadata"].get("managedFields").is_none());
        assert!(live.ours().is_some_and(|o| o.labels.contains("a")));
        let c = w.apply(owned(OutputKind::ClusterRole, Event::Delete(role)));
        assert!(c.dirty);
        assert!(w.owned.is_empty());
    }

    #[test]
    fn the_cache_learns_from_writes_and_ignores_older_watch_events() {
        let mut w = base_world();
        let id = ObjectId::new(OutputKind::ClusterRole, "", "x");
        let gk = output_gk(OutputKind::ClusterRole);
        let key = (String::new(), "x".to_string());
        let version = |rv: &str, uid: &str, verbs: Value| {
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "x", "resourceVersion": rv, "uid": uid,
                             "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]})
        };
        let c = w.apply(Feed::Learned(Learned::Applied(Live::new(version(
            "20",
            "u1",
            json!(["get"]),
        )))));
        assert!(c.dirty);
        assert_eq!(w.owned[&id].resource_version(), Some("20"));
        // No rule reads the kind: packed, and not in the engine's store
        // until a plan keeps it without a desired copy.
        assert!(w.owned[&id].is_packed());
        assert!(w.store.get(&gk, &key).is_none());
        assert!(w.unpack([&id]));
        assert!(w.store.get(&gk, &key).is_some());
        // The watch then delivers an event from before the write.
        let c = w.apply(owned(
            OutputKind::ClusterRole,
            Event::Apply(version("12", "u1", json!(["list"]))),
        ));
        assert!(!c.dirty);
        assert_eq!(w.owned[&id].resource_version(), Some("20"));
        // A newer one replaces it.
        let c = w.apply(owned(
            OutputKind::ClusterRole,
            Event::Apply(version("21", "u1", json!(["watch"]))),
        ));
        assert!(c.dirty);
        assert_eq!(w.owned[&id].resource_version(), Some("21"));
        // A delete of another object of the name (made again since) keeps
        // this one; a delete of this one removes it at once.
        assert!(!w.learn(Learned::Deleted(id.clone(), Some("u0".into()))));
        assert!(w.owned.contains_key(&id));
        assert!(w.learn(Learned::Deleted(id.clone(), Some("u1".into()))));
        assert!(w.owned.is_empty());
        assert!(w.store.get(&gk, &key).is_none());
    }

    #[test]
    fn a_missing_allow_list_holds_every_rule() {
        let mut w = World::new(Some("limits".into()));
        listed(
            &mut w,
            |e| Feed::Rules(Box::new(map_event(e, |_| rule("r", 1, "Widget")))),
            vec![json!({})],
        );
        for k in OutputKind::ALL {
            listed(&mut w, |e| owned(k, e), vec![]);
        }
        w.apply(Feed::Tenants(Box::new(Event::Init)));
        w.apply(Feed::Tenants(Box::new(Event::InitDone)));
        assert!(!w.base_synced());
        w.apply(Feed::Allow(Box::new(Event::Init)));
        w.apply(Feed::Allow(Box::new(Event::InitDone)));
        assert!(w.base_synced());
        assert!(matches!(
            w.holds().get("r"),
            Some(Hold::AllowListNotFound(_))
        ));
    }

    fn cluster_role(name: &str, ours: bool) -> Value {
        let labels = if ours {
            json!({MANAGED_BY_LABEL: MANAGED_BY_VALUE})
        } else {
            json!({"app": "other"})
        };
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": labels},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})
    }

    #[test]
    fn other_objects_of_an_output_kind_are_known_by_name_only() {
        let mut w = base_world();
        let gk = output_gk(OutputKind::ClusterRole);
        let id = ObjectId::new(OutputKind::ClusterRole, "", "x");
        listed(
            &mut w,
            |e| owned(OutputKind::ClusterRole, e),
            vec![cluster_role("x", false), cluster_role("ours", true)],
        );
        assert!(w.foreign.contains(&id));
        assert!(!w.owned.contains_key(&id));
        // No rule reads ClusterRoles: none in the engine's store, ours
        // packed in our cache.
        assert!(stored_names(&w, &gk).is_empty());
        assert!(w.owned[&ObjectId::new(OutputKind::ClusterRole, "", "ours")].is_packed());
        // Taking our label off moves an object out of our cache in the same
        // event that names it someone else's; putting it on moves it back.
        let c = w.apply(owned(
            OutputKind::ClusterRole,
            Event::Apply(cluster_role("ours", false)),
        ));
        assert!(c.dirty);
        let ours = ObjectId::new(OutputKind::ClusterRole, "", "ours");
        assert!(w.foreign.contains(&ours) && !w.owned.contains_key(&ours));
        assert_eq!(w.store.list(&gk).count(), 0);
        w.apply(owned(
            OutputKind::ClusterRole,
            Event::Apply(cluster_role("x", true)),
        ));
        assert!(!w.foreign.contains(&id) && w.owned.contains_key(&id));
        // A deleted object frees its name.
        w.apply(owned(
            OutputKind::ClusterRole,
            Event::Delete(cluster_role("ours", false)),
        ));
        assert!(!w.foreign.contains(&ours));
    }

    /// A ClusterRole labelled ours by someone else: its managedFields hold
    /// entries of other managers only (a kubectl create, a server-side
    /// apply under another name).
    fn forged_role(name: &str, manager: &str, operation: &str) -> Value {
        let mut o = cluster_role(name, true);
        o["metadata"]["annotations"] = json!({"rbacrules.io/rule": "r"});
        o["metadata"]["managedFields"] =
            json!([{"manager": manager, "operation": operation, "fieldsV1": {}}]);
        o
    }

    #[test]
    fn objects_others_label_ours_are_foreign_and_reported() {
        let mut w = base_world();
        let gk = output_gk(OutputKind::ClusterRole);
        let spec: RbacRuleSpec = serde_json::from_value(json!({
            "trigger": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole"},
            "outputs": [{"kind": "ClusterRole", "name": "copy-{{trigger.metadata.name}}"}]
        }))
        .expect("spec");
        let mut reader = RbacRule::new("reader", spec);
        reader.metadata.generation = Some(1);
        w.apply(Feed::Rules(Box::new(Event::Apply(reader))));
        let interest = w.interests(ManageLevel::All).remove(&gk).expect("interest");
        let epoch = w.next_epoch();
        w.watch_kind(interest, epoch, None);
        listed(
            &mut w,
            |e| owned(OutputKind::ClusterRole, e),
            vec![
                forged_role("created", "kubectl-create", "Update"),
                forged_role("applied", "kubectl", "Apply"),
                // Our manager's name, but not by apply: not our write.
                forged_role("updated", "rbac-rules", "Update"),
                cluster_role("ours", true),
            ],
        );
        let id = |n: &str| ObjectId::new(OutputKind::ClusterRole, "", n);
        for n in ["created", "applied", "updated"] {
            assert!(!w.owned.contains_key(&id(n)), "{n}");
            assert!(w.foreign.contains(&id(n)), "{n}");
            assert_eq!(w.forged.get(&id(n)), Some(&Some("r".to_string())), "{n}");
            // The engine sees it as anyone's: without the claim.
            let stored = w.store.get(&gk, &id(n).store_key()).expect("stored");
            assert!(!crate::engine::output::is_managed(stored), "{n}");
            assert_eq!(stored["metadata"]["annotations"]["rbacrules.io/rule"], "r");
        }
        assert!(w.owned.contains_key(&id("ours")) && !w.forged.contains_key(&id("ours")));
        let snap_forged = w.snapshot(None, &BTreeMap::new()).forged.len();
        assert_eq!(snap_forged, 3);
        // The label taken off: no longer a claim; deleted: forgotten.
        w.apply(owned(
            OutputKind::ClusterRole,
            Event::Apply(cluster_role("created", false)),
        ));
        assert!(!w.forged.contains_key(&id("created")));
        w.apply(owned(
            OutputKind::ClusterRole,
            Event::Delete(forged_role("applied", "kubectl", "Apply")),
        ));
        assert!(!w.forged.contains_key(&id("applied")) && !w.foreign.contains(&id("applied")));
    }

    #[test]
    fn a_rule_reading_an_output_kind_is_fed_by_the_output_watch() {
        let mut w = base_world();
        let gk = output_gk(OutputKind::ClusterRole);
        listed(
            &mut w,
            |e| owned(OutputKind::ClusterRole, e),
            vec![cluster_role("other", false), cluster_role("ours", true)],
        );
        let spec: RbacRuleSpec = serde_json::from_value(json!({
            "trigger": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole"},
            "outputs": [{"kind": "ClusterRole", "name": "copy-{{trigger.metadata.name}}"}]
        }))
        .expect("spec");
        let mut reader = RbacRule::new("reader", spec);
        reader.metadata.generation = Some(1);
        w.apply(Feed::Rules(Box::new(Event::Apply(reader))));
        let interest = w.interests(ManageLevel::All).remove(&gk).expect("interest");
        let epoch = w.next_epoch();
        w.watch_kind(interest, epoch, None);
        // The last list kept only the others' names: list again first.
        assert!(w.relist_outputs(OutputKind::ClusterRole));
        assert!(!w.base_synced());
        assert!(matches!(
            w.holds().get("reader"),
            Some(Hold::WaitingForSync(_))
        ));
        listed(
            &mut w,
            |e| owned(OutputKind::ClusterRole, e),
            vec![cluster_role("other", false), cluster_role("ours", true)],
        );
        assert!(w.base_synced() && w.kinds_settled());
        // The base rule "r" emits ClusterRoles: until its Widgets are
        // listed, a reader of ClusterRoles waits for it.
        assert!(matches!(
            w.holds().get("reader"),
            Some(Hold::WaitingForSync(why)) if why.contains("outputs it reads")
        ));
        let widgets = GroupKind::new("example.org", "Widget");
        watch(&mut w, &widgets, 9);
        listed(&mut w, |e| Feed::Kind(widgets.clone(), 9, e), vec![]);
        assert!(!w.holds().contains_key("reader"));
        // Others' ClusterRoles are in the store; ours are packed (no rule
        // sees them while a desired copy stands for them) until a plan
        // keeps them, then shared with our cache.
        assert_eq!(stored_names(&w, &gk), vec!["other"]);
        let ours = ObjectId::new(OutputKind::ClusterRole, "", "ours");
        let key = (String::new(), "ours".to_string());
        assert!(w.owned[&ours].is_packed());
        assert!(w.unpack([&ours]));
        assert!(std::ptr::eq(
            w.store.get(&gk, &key).expect("stored"),
            w.owned[&ours].object()
        ));
        // No rule reads them any more: the others go, ours stay.
        w.forget_kind(&gk);
        assert_eq!(stored_names(&w, &gk), vec!["ours"]);
    }

    /// One of our ClusterRoles as the server returns it, with `verbs`.
    fn served_role(rv: &str, verbs: Value) -> Value {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "s", "resourceVersion": rv, "uid": "u-s",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                "annotations": {"rbacrules.io/rule": "r"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "n", "uid": "u-n"}]},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]})
    }

    #[test]
    fn our_objects_stay_packed_where_a_rule_reads_the_kind() {
        let mut w = base_world();
        let kind = OutputKind::ClusterRole;
        let gk = output_gk(kind);
        watch_whole(&mut w, &gk);
        let id = ObjectId::new(kind, "", "s");
        let key = (String::new(), "s".to_string());
        // The response to our write: while our desired copy stands for it,
        // no rule's view shows it and the engine's store holds no copy.
        let c = w.apply(Feed::Learned(Learned::Applied(Live::new(served_role(
            "5",
            json!(["get"]),
        )))));
        assert!(c.dirty);
        assert!(w.owned[&id].is_packed());
        assert!(w.store.get(&gk, &key).is_none());
        // The watch's echo of that version changes nothing.
        let c = w.apply(owned(kind, Event::Apply(served_role("5", json!(["get"])))));
        assert!(!c.dirty);
        assert!(w.owned[&id].is_packed());
        // Its rule is held: the view shows the live copy, so it is in the
        // store before the evaluation (whole: a rule reads the kind).
        assert!(!w.unpack_held(&BTreeMap::new()));
        let holds = BTreeMap::from([("r".to_string(), Hold::WaitingForSync("x".into()))]);
        assert!(w.unpack_held(&holds));
        assert!(!w.unpack_held(&holds));
        let stored = w.store.get(&gk, &key).expect("stored");
        assert_eq!(stored["metadata"]["uid"], "u-s");
        assert_eq!(stored["rules"][0]["verbs"], json!(["get"]));
        // A new version is packed again until a plan or a hold needs it.
        w.apply(owned(kind, Event::Apply(served_role("7", json!(["*"])))));
        assert!(w.owned[&id].is_packed());
        assert!(w.store.get(&gk, &key).is_none());
        assert!(w.unpack_held(&holds));
        assert_eq!(
            w.store.get(&gk, &key).expect("stored")["rules"][0]["verbs"],
            json!(["*"])
        );
    }

    #[test]
    fn our_objects_are_kept_slim_unless_a_rule_reads_the_kind() {
        let mut w = base_world();
        let kind = OutputKind::ClusterRole;
        let id = ObjectId::new(kind, "", "s");
        w.apply(owned(kind, Event::Apply(served_role("5", json!(["get"])))));
        // Packed while a desired copy may stand for it: the plan reads the
        // summary, and the engine's store holds no copy.
        let gk = output_gk(kind);
        let key = (String::new(), "s".to_string());
        assert!(w.owned[&id].is_packed());
        assert!(w.store.get(&gk, &key).is_none());
        assert_eq!(w.owned[&id].rule(), Some("r"));
        // A plan keeps it: policy judges its slim body.
        assert!(w.unpack([&id]));
        let live = &w.owned[&id];
        let meta = live.object()["metadata"].as_object().expect("metadata");
        let mut keys: Vec<&str> = meta.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            vec!["annotations", "labels", "name", "resourceVersion"]
        );
        // What the plan and policy read is still there.
        assert_eq!(live.uid(), Some("u-s"));
        assert_eq!(live.rule(), Some("r"));
        assert!(live.is_managed());
        assert_eq!(live.object()["rules"][0]["verbs"], json!(["get"]));
        // The store the engine judges shares the slim copy.
        assert!(std::ptr::eq(
            w.store.get(&gk, &key).expect("stored"),
            w.owned[&id].object()
        ));
        // A rule reads ClusterRoles: the next copy is packed whole, and
        // unpacked whole when a plan keeps it.
        watch_whole(&mut w, &gk);
        w.apply(owned(kind, Event::Apply(served_role("6", json!(["get"])))));
        assert!(w.owned[&id].is_packed());
        assert!(w.unpack([&id]));
        let whole = &w.owned[&id].object()["metadata"];
        assert_eq!(whole["uid"], "u-s");
        assert_eq!(whole["ownerReferences"][0]["name"], "n");
    }

    #[test]
    fn roles_no_rule_reads_are_packed_until_a_plan_keeps_them() {
        let mut w = base_world();
        let kind = OutputKind::Role;
        let id = ObjectId::new(kind, "n", "s");
        let role = |rv: &str, verbs: Value| {
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "s", "namespace": "n", "resourceVersion": rv, "uid": "u",
                    "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                    "annotations": {"rbacrules.io/rule": "r", "rbacrules.io/trigger": "T/n"}},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]})
        };
        assert!(
            w.apply(owned(kind, Event::Apply(role("5", json!(["get"])))))
                .dirty
        );
        let gk = output_gk(kind);
        let key = ("n".to_string(), "s".to_string());
        let live = &w.owned[&id];
        assert!(live.is_packed());
        assert!(live.shared().is_none());
        assert_eq!(
            (live.rule(), live.trigger(), live.resource_version()),
            (Some("r"), Some("T/n"), Some("5"))
        );
        assert!(w.store.get(&gk, &key).is_none());
        // Compared by digest while packed.
        let mut desired = role("", json!(["get"]));
        desired["metadata"]
            .as_object_mut()
            .expect("metadata")
            .retain(|k, _| k != "resourceVersion" && k != "uid");
        assert!(super::super::live::differences(&desired, &w.owned[&id]).is_empty());
        // A plan keeps it without a desired copy: policy must see its rules.
        assert!(w.unpack([&id]));
        assert!(!w.unpack([&id]));
        let stored = w.store.get(&gk, &key).expect("stored");
        assert_eq!(stored["rules"][0]["verbs"], json!(["get"]));
        // The same version again leaves it unpacked; a new one is packed.
        assert!(
            !w.apply(owned(kind, Event::Apply(role("5", json!(["get"])))))
                .dirty
        );
        assert!(!w.owned[&id].is_packed());
        assert!(
            w.apply(owned(kind, Event::Apply(role("6", json!(["*"])))))
                .dirty
        );
        assert!(w.owned[&id].is_packed());
        assert_eq!(
            super::super::live::differences(&desired, &w.owned[&id]),
            vec!["rules"]
        );
        // Where a rule reads Roles, ours are packed whole (unpacked whole
        // when a plan keeps them).
        watch_whole(&mut w, &gk);
        assert!(
            w.apply(owned(kind, Event::Apply(role("7", json!(["get"])))))
                .dirty
        );
        assert!(w.owned[&id].is_packed());
        assert!(w.unpack([&id]));
        assert_eq!(w.owned[&id].object()["metadata"]["uid"], "u");
        // Others' Roles are kept whole in the store.
        let mut other = role("8", json!(["list"]));
        other["metadata"]["name"] = json!("other");
        other["metadata"]["labels"] = json!({});
        w.apply(owned(kind, Event::Apply(other)));
        let key = ("n".to_string(), "other".to_string());
        assert_eq!(
            w.store.get(&gk, &key).expect("stored")["rules"][0]["verbs"],
            json!(["list"])
        );
    }

    #[test]
    fn a_relist_with_a_changed_body_is_noticed() {
        let mut w = base_world();
        let kind = OutputKind::ClusterRole;
        let id = ObjectId::new(kind, "", "s");
        listed(
            &mut w,
            |e| owned(kind, e),
            vec![served_role("5", json!(["get"]))],
        );
        let desired = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "s", "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                "annotations": {"rbacrules.io/rule": "r"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "n", "uid": "u-n"}]},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]});
        assert!(super::super::live::differences(&desired, &w.owned[&id]).is_empty());
        // Relisted unchanged: nothing to do, the copy is kept.
        let before = w.owned[&id].clone();
        w.apply(owned(kind, Event::Init));
        let c = w.apply(owned(
            kind,
            Event::InitApply(served_role("5", json!(["get"]))),
        ));
        assert!(!c.dirty);
        w.apply(owned(kind, Event::InitDone));
        assert_eq!(before, w.owned[&id]);
        // Edited while the watch was down: the relist brings the new body,
        // and its digest differs from what is wanted.
        w.apply(owned(kind, Event::Init));
        let c = w.apply(owned(
            kind,
            Event::InitApply(served_role("9", json!(["get", "delete"]))),
        ));
        assert!(c.dirty);
        w.apply(owned(kind, Event::InitDone));
        assert_eq!(w.owned[&id].resource_version(), Some("9"));
        assert_eq!(
            super::super::live::differences(&desired, &w.owned[&id]),
            vec!["rules"]
        );
    }

    #[test]
    fn a_relist_keeps_unchanged_copies_and_sweeps_what_is_gone() {
        let mut w = base_world();
        let kind = OutputKind::ClusterRole;
        listed(
            &mut w,
            |e| owned(kind, e),
            vec![
                cluster_role("a", true),
                cluster_role("b", true),
                cluster_role("x", false),
            ],
        );
        let a = ObjectId::new(kind, "", "a");
        let before = w.owned[&a].clone();
        // A relist (after 410 Gone): b was deleted meanwhile, x too.
        w.apply(owned(kind, Event::Init));
        w.apply(owned(kind, Event::InitApply(cluster_role("a", true))));
        // Nothing is removed before the list is complete.
        assert_eq!(w.owned.len(), 2);
        assert!(w.foreign.contains(&ObjectId::new(kind, "", "x")));
        let c = w.apply(owned(kind, Event::InitDone));
        assert!(c.dirty);
        let names: Vec<&str> = w.owned.keys().map(|id| &*id.name).collect();
        assert_eq!(names, vec!["a"]);
        assert!(w.foreign.is_empty());
        // No rule reads ClusterRoles: ours are packed, out of the store.
        assert_eq!(w.store.list(&output_gk(kind)).count(), 0);
        // The unchanged object kept its copy (the plan's memo holds).
        assert_eq!(before, w.owned[&a]);
    }

    #[test]
    fn shed_rules_stay_shed_through_a_relist_of_the_same_version() {
        let mut w = base_world();
        let kind = OutputKind::ClusterRole;
        let mut a = cluster_role("a", true);
        a["metadata"]["uid"] = json!("u-a");
        a["metadata"]["resourceVersion"] = json!("5");
        listed(&mut w, |e| owned(kind, e), vec![a.clone()]);
        let id = ObjectId::new(kind, "", "a");
        // Nothing found equal yet: nothing shed.
        assert_eq!(w.shed_rules(), 0);
        let desired = crate::engine::Manifest::from_value(&a).expect("manifest");
        w.owned[&id].found_equal(&desired);
        assert_eq!(w.shed_rules(), 1);
        assert!(w.owned[&id].rules_shed());
        // The same version listed again keeps the shed copy.
        w.apply(owned(kind, Event::Init));
        w.apply(owned(kind, Event::InitApply(a.clone())));
        w.apply(owned(kind, Event::InitDone));
        assert!(w.owned[&id].rules_shed());
        // A new version is a new copy, whole until a plan finds it equal.
        a["metadata"]["resourceVersion"] = json!("6");
        w.apply(owned(kind, Event::Apply(a.clone())));
        assert!(!w.owned[&id].rules_shed());
        // Unpacked, the shed copy gives back its rules from the desired one.
        let mut l = w.owned[&id].clone();
        l.found_equal(&desired);
        assert!(l.shed_rules() && l.unpack());
        assert_eq!(l.object()["rules"], a["rules"]);
    }

    #[test]
    fn the_deletion_of_an_older_object_keeps_the_one_made_since() {
        let mut w = base_world();
        let kind = OutputKind::ClusterRole;
        let version = |uid: &str, rv: &str| {
            let mut o = cluster_role("x", true);
            o["metadata"]["uid"] = json!(uid);
            o["metadata"]["resourceVersion"] = json!(rv);
            o
        };
        listed(&mut w, |e| owned(kind, e), vec![version("old", "5")]);
        // Re-created: the new copy is learned before the watch reports the
        // deletion of the old one.
        w.apply(Feed::Learned(Learned::Applied(Live::new(version(
            "new", "9",
        )))));
        let c = w.apply(owned(kind, Event::Delete(version("old", "8"))));
        assert!(!c.dirty);
        let id = ObjectId::new(kind, "", "x");
        assert_eq!(w.owned[&id].uid(), Some("new"));
        // Its own deletion removes it.
        w.apply(owned(kind, Event::Delete(version("new", "10"))));
        assert!(w.owned.is_empty());
    }

    /// Makes the world watch `gk` whole, as when a rule reads its bodies.
    fn watch_whole(w: &mut World, gk: &GroupKind) {
        let interest = Interest {
            gk: gk.clone(),
            version: None,
            metadata_only: false,
            fields: None,
        };
        let epoch = w.next_epoch();
        w.watch_kind(interest, epoch, None);
    }

    fn tenant_rule(ns: Option<&str>, name: &str) -> RbacRule {
        let mut r = RbacRule::new(
            name,
            serde_json::from_value(json!({"outputs": []})).unwrap(),
        );
        r.metadata.namespace = ns.map(str::to_string);
        r
    }

    fn list_rules(w: &mut World, tenant: bool, rules: Vec<RbacRule>) {
        let feed = |ev| {
            if tenant {
                Feed::Tenants(Box::new(ev))
            } else {
                Feed::Rules(Box::new(ev))
            }
        };
        w.apply(feed(Event::Init));
        for r in rules {
            w.apply(feed(Event::InitApply(r)));
        }
        w.apply(feed(Event::InitDone));
    }

    /// A relist of either watch replaces only its own kind's rules, and a
    /// tenant rule named like a cluster rule is another rule.
    #[test]
    fn each_watchs_list_replaces_only_its_own_rules() {
        let mut w = World::new(None);
        list_rules(&mut w, false, vec![tenant_rule(None, "r")]);
        list_rules(
            &mut w,
            true,
            vec![
                tenant_rule(Some("team-a"), "r"),
                tenant_rule(Some("team-b"), "r"),
            ],
        );
        let keys = |w: &World| w.rules.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&w), ["r", "team-a/r", "team-b/r"]);
        list_rules(&mut w, false, vec![]);
        assert_eq!(keys(&w), ["team-a/r", "team-b/r"]);
        list_rules(&mut w, true, vec![tenant_rule(Some("team-b"), "r")]);
        assert_eq!(keys(&w), ["team-b/r"]);
        w.apply(Feed::Tenants(Box::new(Event::Delete(tenant_rule(
            Some("team-b"),
            "r",
        )))));
        assert!(w.rules.is_empty());
    }

    /// Without the NamespacedRbacRule kind (its CRD not installed), the
    /// controller is not held up: the tenant list counts as empty, once.
    #[test]
    fn an_unserved_tenant_kind_is_an_empty_list() {
        let mut w = World::new(None);
        list_rules(&mut w, false, vec![tenant_rule(None, "r")]);
        let not_found = || {
            let status = kube::core::Status::failure("not found", "NotFound").with_code(404);
            kube::runtime::watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status)))
        };
        let change = w.apply(Feed::Error(Source::Tenants, not_found()));
        assert!(change.rules);
        assert_eq!(w.rules.keys().collect::<Vec<_>>(), ["r"]);
        // The watcher retries with backoff: again 404, no new pass.
        let again = w.apply(Feed::Error(Source::Tenants, not_found()));
        assert!(!again.rules && !again.dirty);
    }
}
