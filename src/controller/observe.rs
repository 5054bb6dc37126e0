//! Watches and the caches they fill: the RbacRules, our own outputs
//! (label-selected), every kind the rules read (started and stopped as
//! rules come and go), and the allow-list ClusterRole.
//!
//! Each watch runs in its own task and sends [`Feed`] items to the control
//! loop, which owns [`World`] (no locks). Initial lists are buffered and
//! swapped in at `InitDone`, so a re-list never shows a half-empty view.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use futures::StreamExt;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::discovery::{self, ApiGroup};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::apply::api_resource;
use super::plan::{Live, ObjectId};
use super::status::Hold;
use crate::api::{ManageLevel, OutputKind, RbacRule, RbacRuleSpec};
use crate::engine::output::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use crate::engine::store::key_of;
use crate::engine::{Engine, GroupKind, Interest, ObjectStore, Options, RuleSource};

/// What a watch task sends to the control loop.
#[derive(Debug)]
pub enum Feed {
    /// An RbacRule event (boxed: rules are large, other feeds small).
    Rules(Box<Event<RbacRule>>),
    /// An event of a label-selected watch on our outputs.
    Owned(OutputKind, Event<Value>),
    /// An event of a watch on a kind the rules read; `epoch` tells a
    /// restarted watch from its predecessor.
    Kind(GroupKind, u64, Event<Value>),
    /// An event of the allow-list ClusterRole watch.
    Allow(Box<Event<ClusterRole>>),
    /// A watch error.
    Error(Source, watcher::Error),
}

/// Which watch a [`Feed::Error`] comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The RbacRule watch.
    Rules,
    /// An owned-object watch.
    Owned(OutputKind),
    /// A rule-kind watch.
    Kind(GroupKind, u64),
    /// The allow-list watch.
    Allow,
}

/// A task aborted when dropped: stopping a watch is dropping it.
#[derive(Debug)]
pub struct Task(JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
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
    task: Option<Task>,
}

/// Everything the controller knows about the cluster.
#[derive(Default)]
pub struct World {
    /// RbacRules by name.
    pub rules: BTreeMap<String, RbacRule>,
    rules_listing: Listing<RbacRule>,
    /// Kinds each rule reads (cached per spec).
    rule_kinds: BTreeMap<String, (RbacRuleSpec, Vec<GroupKind>)>,
    /// Objects of the kinds the rules read.
    pub store: ObjectStore,
    kinds: BTreeMap<GroupKind, KindWatch>,
    next_epoch: u64,
    /// Live objects labelled as ours.
    pub owned: BTreeMap<ObjectId, Live>,
    owned_listing: BTreeMap<OutputKind, Listing<Value>>,
    /// `--allow-clusterrole`, if set.
    allow_name: Option<String>,
    allow: Option<ClusterRole>,
    allow_listing: Listing<ClusterRole>,
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
        let mut change = Change::default();
        match feed {
            Feed::Rules(ev) => match self
                .rules_listing
                .step(map_event(*ev, without_managed_fields))
            {
                Step::Nothing => {}
                Step::Upsert(r) => {
                    let name = r.metadata.name.clone().unwrap_or_default();
                    let same_spec = self.rules.get(&name).is_some_and(|old| {
                        old.spec == r.spec && old.metadata.generation == r.metadata.generation
                    });
                    // A status-only change (often our own patch) re-renders
                    // nothing; the new status is kept for comparison.
                    if !same_spec {
                        change.dirty = true;
                        change.rules = true;
                    }
                    self.rules.insert(name, r);
                }
                Step::Remove(r) => {
                    self.rules
                        .remove(&r.metadata.name.clone().unwrap_or_default());
                    change.dirty = true;
                    change.rules = true;
                }
                Step::Replace(all) => {
                    self.rules = all
                        .into_iter()
                        .map(|r| (r.metadata.name.clone().unwrap_or_default(), r))
                        .collect();
                    change.dirty = true;
                    change.rules = true;
                }
            },
            Feed::Owned(kind, ev) => {
                let listing = self.owned_listing.entry(kind).or_default();
                match listing.step(ev) {
                    Step::Nothing => {}
                    Step::Upsert(o) => {
                        change.dirty = self.upsert_owned(o);
                    }
                    Step::Remove(o) => {
                        if let Some(id) = ObjectId::of(&o) {
                            change.dirty = self.remove_owned(&id);
                        }
                    }
                    Step::Replace(all) => {
                        let stale: Vec<ObjectId> = self
                            .owned
                            .keys()
                            .filter(|id| id.kind == kind)
                            .cloned()
                            .collect();
                        for id in stale {
                            self.remove_owned(&id);
                        }
                        for o in all {
                            self.upsert_owned(o);
                        }
                        change.dirty = true;
                    }
                }
            }
            Feed::Kind(gk, epoch, ev) => {
                let Some(w) = self.kinds.get_mut(&gk).filter(|w| w.epoch == epoch) else {
                    return change;
                };
                match w.listing.step(ev) {
                    Step::Nothing => {}
                    Step::Upsert(o) => {
                        let differs = key_of(&o)
                            .map(|k| self.store.get(&gk, &k) != Some(&o))
                            .unwrap_or(false);
                        if differs {
                            let _ = self.store.insert(o);
                            change.dirty = true;
                        }
                    }
                    Step::Remove(o) => {
                        if let Some(k) = key_of(&o) {
                            change.dirty = self.store.remove(&gk, &k).is_some();
                        }
                    }
                    Step::Replace(all) => {
                        self.store.clear_kind(&gk);
                        for o in all {
                            let _ = self.store.insert(o);
                        }
                        change.dirty = true;
                    }
                }
            }
            Feed::Allow(ev) => match self.allow_listing.step(*ev) {
                Step::Nothing => {}
                Step::Upsert(cr) => {
                    self.allow = Some(cr);
                    change.dirty = true;
                }
                Step::Remove(_) => {
                    self.allow = None;
                    change.dirty = true;
                }
                Step::Replace(all) => {
                    self.allow = all.into_iter().next();
                    change.dirty = true;
                }
            },
            Feed::Error(source, error) => {
                tracing::warn!(?source, error = %error, "watch error");
                match source {
                    Source::Rules => self.rules_listing.fail(&error),
                    Source::Owned(k) => self.owned_listing.entry(k).or_default().fail(&error),
                    Source::Allow => self.allow_listing.fail(&error),
                    Source::Kind(gk, epoch) => {
                        if let Some(w) = self.kinds.get_mut(&gk).filter(|w| w.epoch == epoch) {
                            w.listing.fail(&error);
                            if not_found(&error) {
                                // The CRD went away: stop watching, keep
                                // the last list (no pruning from it while
                                // unresolved) and rediscover later.
                                w.task = None;
                                w.unresolved =
                                    Some(format!("{gk} is no longer served by the API server"));
                                change.lost_kind = true;
                            }
                            change.dirty = true;
                        }
                    }
                }
            }
        }
        change
    }

    fn upsert_owned(&mut self, o: Value) -> bool {
        let Some(id) = ObjectId::of(&o) else {
            return false;
        };
        let live = Live::new(o);
        match self.owned.get(&id) {
            Some(known) if known == &live => return false,
            // A watch event from before a write whose response the cache
            // already learned: older, so nothing to change.
            Some(known) if older(&live, known) => return false,
            _ => {}
        }
        self.mirror(&id, Some(&live.object));
        self.owned.insert(id, live);
        true
    }

    fn remove_owned(&mut self, id: &ObjectId) -> bool {
        self.mirror(id, None);
        self.owned.remove(id).is_some()
    }

    /// Keeps the engine's view of our own objects: where no rule reads the
    /// kind (so no full watch fills the store with it), managed objects are
    /// copied into the store, so that policy judges every live object we
    /// made and revokes what it now refuses.
    fn mirror(&mut self, id: &ObjectId, object: Option<&Value>) {
        let gk = crate::engine::compile::output_gk(id.kind);
        if self.kinds.contains_key(&gk) {
            return;
        }
        let key = (id.namespace.clone(), id.name.clone());
        match object {
            Some(o) => {
                if self.store.insert(o.clone()).is_err() {
                    tracing::debug!(object = %id, "not mirrored into the store");
                }
            }
            None => {
                self.store.remove(&gk, &key);
            }
        }
    }

    /// Learns the outcome of writes at once: objects as the API server
    /// returned them after an apply, and pruned objects gone. The watch
    /// events that follow confirm them (or are older, and ignored).
    pub fn learn(&mut self, written: &[super::apply::Written]) {
        for w in written {
            match (&w.outcome, &w.live) {
                (_, Some(o)) if w.outcome.is_applied() => {
                    self.upsert_owned(o.clone());
                }
                (super::apply::Outcome::Deleted | super::apply::Outcome::Revoked(_), _) => {
                    self.remove_owned(&w.id);
                }
                _ => {}
            }
        }
    }

    /// Whether the rules, owned-object and allow-list watches have listed:
    /// before that nothing is written.
    pub fn base_synced(&self) -> bool {
        self.rules_listing.synced
            && OutputKind::ALL
                .iter()
                .all(|k| self.owned_listing.get(k).is_some_and(|l| l.synced))
            && (self.allow_name.is_none() || self.allow_listing.synced)
    }

    /// Whether every rule kind has either listed or been found unserved:
    /// the initial sync is done (readiness) and pruning is allowed.
    pub fn kinds_settled(&self) -> bool {
        self.kinds
            .values()
            .all(|w| w.unresolved.is_some() || w.listing.synced)
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
        for (rule, (_, kinds)) in &self.rule_kinds {
            let mut not_served = Vec::new();
            let mut failed = Vec::new();
            let mut waiting = Vec::new();
            for gk in kinds {
                match self.kinds.get(gk) {
                    Some(KindWatch {
                        unresolved: Some(why),
                        ..
                    }) => not_served.push(why.clone()),
                    Some(w) if !w.listing.synced => match &w.listing.error {
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
            if let Some(h) = hold {
                out.insert(rule.clone(), h);
            }
        }
        out
    }

    /// Recomputes the kinds each rule reads and the merged interests.
    fn interests(&mut self, manage: ManageLevel) -> BTreeMap<GroupKind, Interest> {
        // With an allow-list, the engine checks what bindings and
        // aggregations grant against every ClusterRole and Role: the
        // (empty) placeholder makes the interests include them.
        let options = Options {
            manage,
            allow: self.allow_name.as_ref().map(|_| Default::default()),
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
            };
            let kinds = Engine::new(std::slice::from_ref(&source), options.clone())
                .interests()
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
            })
            .collect();
        Engine::new(&sources, options)
            .interests()
            .into_iter()
            .map(|i| (i.gk.clone(), i))
            .collect()
    }

    /// Number of kinds watched.
    pub fn watched_kinds(&self) -> usize {
        self.kinds.values().filter(|w| w.task.is_some()).count()
    }

    /// Whether some kind waits for rediscovery.
    pub fn has_unresolved(&self) -> bool {
        self.kinds.values().any(|w| w.unresolved.is_some())
    }
}

/// Starts and stops watches: owns the client and the feed sender.
pub struct Watches {
    client: Client,
    tx: mpsc::UnboundedSender<Feed>,
    manage: ManageLevel,
    base: Vec<Task>,
}

impl Watches {
    /// Starts the RbacRule, owned-object and allow-list watches.
    pub fn start(
        client: Client,
        tx: mpsc::UnboundedSender<Feed>,
        manage: ManageLevel,
        allow_name: Option<&str>,
    ) -> Self {
        let mut base = Vec::new();
        base.push(spawn(
            Api::<RbacRule>::all(client.clone()),
            watcher::Config::default(),
            tx.clone(),
            |ev| Feed::Rules(Box::new(ev)),
            || Source::Rules,
        ));
        let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}");
        for kind in OutputKind::ALL {
            let ar = api_resource(kind);
            let api = Api::<DynamicObject>::all_with(client.clone(), &ar);
            base.push(spawn(
                api,
                watcher::Config::default().labels(&selector),
                tx.clone(),
                move |ev| Feed::Owned(kind, map_event(ev, |o| to_value(&o, &ar, false))),
                move || Source::Owned(kind),
            ));
        }
        if let Some(name) = allow_name {
            base.push(spawn(
                Api::<ClusterRole>::all(client.clone()),
                watcher::Config::default().fields(&format!("metadata.name={name}")),
                tx.clone(),
                |ev| Feed::Allow(Box::new(ev)),
                || Source::Allow,
            ));
        }
        Watches {
            client,
            tx,
            manage,
            base,
        }
    }

    /// Brings the rule-kind watches in line with the rules: starts watches
    /// for new kinds (after discovery), restarts changed ones, stops and
    /// forgets kinds no rule reads any more.
    pub async fn reconcile_kinds(&mut self, world: &mut World) {
        let wanted = world.interests(self.manage);
        let gone: Vec<GroupKind> = world
            .kinds
            .keys()
            .filter(|gk| !wanted.contains_key(*gk))
            .cloned()
            .collect();
        for gk in gone {
            tracing::info!(kind = %gk, "no rule reads this kind any more: watch stopped");
            world.kinds.remove(&gk);
            world.store.clear_kind(&gk);
        }
        let mut groups: BTreeMap<String, Result<ApiGroup, String>> = BTreeMap::new();
        for (gk, interest) in wanted {
            let unchanged = world.kinds.get(&gk).is_some_and(|w| w.interest == interest);
            if unchanged {
                continue;
            }
            self.start_kind(world, &mut groups, interest).await;
        }
        tracing::debug!(
            kinds = world.kinds.len(),
            base = self.base.len(),
            "watches reconciled"
        );
    }

    /// Retries discovery of kinds that were not served.
    pub async fn rediscover(&mut self, world: &mut World) -> bool {
        let pending: Vec<Interest> = world
            .kinds
            .values()
            .filter(|w| w.unresolved.is_some())
            .map(|w| w.interest.clone())
            .collect();
        let mut groups = BTreeMap::new();
        let mut started = false;
        for interest in pending {
            started |= self.start_kind(world, &mut groups, interest).await;
        }
        started
    }

    async fn start_kind(
        &mut self,
        world: &mut World,
        groups: &mut BTreeMap<String, Result<ApiGroup, String>>,
        interest: Interest,
    ) -> bool {
        let gk = interest.gk.clone();
        let epoch = world.next_epoch;
        world.next_epoch += 1;
        let resolved = resolve(&self.client, groups, &interest).await;
        // Keep the old objects until the new list replaces them.
        let listing = Listing::default();
        let (task, unresolved) = match resolved {
            Ok(ar) => {
                tracing::info!(kind = %gk, version = %ar.version, metadata_only = interest.metadata_only, "watching");
                (
                    Some(self.watch_kind(&ar, &gk, epoch, interest.metadata_only)),
                    None,
                )
            }
            Err(why) => {
                tracing::warn!(kind = %gk, reason = %why, "kind not watched; will retry");
                (None, Some(why))
            }
        };
        let started = task.is_some();
        world.kinds.insert(
            gk,
            KindWatch {
                interest,
                unresolved,
                epoch,
                listing,
                task,
            },
        );
        started
    }

    fn watch_kind(
        &self,
        ar: &ApiResource,
        gk: &GroupKind,
        epoch: u64,
        metadata_only: bool,
    ) -> Task {
        let source_gk = gk.clone();
        let source = move || Source::Kind(source_gk.clone(), epoch);
        let tx = self.tx.clone();
        if metadata_only {
            // Only metadata is fetched and cached: no CRD bodies in memory.
            let api = Api::<PartialObjectMeta<DynamicObject>>::all_with(self.client.clone(), ar);
            spawn(
                api,
                watcher::Config::default(),
                tx,
                kind_feed(gk.clone(), epoch, ar.clone()),
                source,
            )
        } else {
            let api = Api::<DynamicObject>::all_with(self.client.clone(), ar);
            spawn(
                api,
                watcher::Config::default(),
                tx,
                kind_feed(gk.clone(), epoch, ar.clone()),
                source,
            )
        }
    }
}

/// Finds the ApiResource of an interest: the version it names, else the
/// group's preferred version, else any version serving the kind.
async fn resolve(
    client: &Client,
    groups: &mut BTreeMap<String, Result<ApiGroup, String>>,
    interest: &Interest,
) -> Result<ApiResource, String> {
    let gk = &interest.gk;
    if !groups.contains_key(&gk.group) {
        let g = discovery::oneshot::group(client, &gk.group)
            .await
            .map_err(|e| match e {
                kube::Error::Discovery(kube::error::DiscoveryError::MissingApiGroup(_)) => {
                    format!(
                        "API group {:?} is not served (is its CRD installed?)",
                        gk.group
                    )
                }
                other => format!("discovery of API group {:?} failed: {other}", gk.group),
            });
        groups.insert(gk.group.clone(), g);
    }
    let group = match groups.get(&gk.group) {
        Some(Ok(g)) => g,
        Some(Err(e)) => return Err(e.clone()),
        None => return Err(format!("discovery of API group {:?} failed", gk.group)),
    };
    let found = match &interest.version {
        Some(v) => group
            .versioned_resources(v)
            .into_iter()
            .find(|(ar, _)| ar.kind == gk.kind),
        None => group.recommended_kind(&gk.kind).or_else(|| {
            group.versions().find_map(|v| {
                group
                    .versioned_resources(v)
                    .into_iter()
                    .find(|(ar, _)| ar.kind == gk.kind)
            })
        }),
    };
    match found {
        Some((ar, _caps)) => Ok(ar),
        None => Err(match &interest.version {
            Some(v) => format!("{gk} is not served at version {v:?}"),
            None => format!("{gk} is not served by the API server (is its CRD installed?)"),
        }),
    }
}

/// An object as the caches store it: apiVersion and kind from discovery
/// (list items lack them, metadata-only responses erase them), and without
/// Whether `new` is an older version of `known`: both resourceVersions
/// parse as integers (etcd revisions, as every API server serves them) and
/// `new`'s is lower. Opaque versions never count as older.
fn older(new: &Live, known: &Live) -> bool {
    let rv = |l: &Live| l.resource_version().and_then(|v| v.parse::<u64>().ok());
    matches!((rv(new), rv(known)), (Some(n), Some(k)) if n < k)
}

/// managedFields when `strip` (owned objects keep them until [`Live::new`]
/// has read which fields are ours).
fn to_value<K: serde::Serialize>(obj: &K, ar: &ApiResource, strip: bool) -> Value {
    let mut v = serde_json::to_value(obj).unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(ar.api_version.clone()));
        m.insert("kind".into(), Value::String(ar.kind.clone()));
    }
    if strip && let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    v
}

fn without_managed_fields(mut r: RbacRule) -> RbacRule {
    r.metadata.managed_fields = None;
    r
}

/// Turns watch events of one kind (full or metadata-only objects) into
/// feed items, as JSON with apiVersion and kind and without managedFields.
fn kind_feed<K: serde::Serialize>(
    gk: GroupKind,
    epoch: u64,
    ar: ApiResource,
) -> impl Fn(Event<K>) -> Feed + Send + 'static {
    move |ev| {
        Feed::Kind(
            gk.clone(),
            epoch,
            map_event(ev, |o| to_value(&o, &ar, true)),
        )
    }
}

fn map_event<A, B>(ev: Event<A>, f: impl Fn(A) -> B) -> Event<B> {
    match ev {
        Event::Apply(o) => Event::Apply(f(o)),
        Event::Delete(o) => Event::Delete(f(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(f(o)),
        Event::InitDone => Event::InitDone,
    }
}

/// Runs a watcher (with backoff) in a task, feeding the control loop.
fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    tx: mpsc::UnboundedSender<Feed>,
    feed: impl Fn(Event<K>) -> Feed + Send + 'static,
    source: impl Fn() -> Source + Send + 'static,
) -> Task
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    Task(tokio::spawn(async move {
        let mut stream = watcher(api, config).default_backoff().boxed();
        while let Some(item) = stream.next().await {
            let msg = match item {
                Ok(ev) => feed(ev),
                Err(e) => Feed::Error(source(), e),
            };
            if tx.send(msg).is_err() {
                return;
            }
        }
    }))
}

/// The kinds currently named by rules (for tests and logs).
pub fn kinds_of(world: &World) -> BTreeSet<GroupKind> {
    world.kinds.keys().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    fn widget(name: &str) -> Value {
        json!({"apiVersion": "example.org/v1", "kind": "Widget", "metadata": {"name": name}})
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
            listed(&mut w, |e| Feed::Owned(k, e), vec![]);
        }
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
                task: None,
            },
        );
    }

    #[test]
    fn an_allow_list_adds_watches_on_every_role() {
        let rbac = |k: &str| GroupKind::new("rbac.authorization.k8s.io", k);
        let mut without = base_world();
        let kinds = without.interests(ManageLevel::All);
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
    fn a_rule_waits_for_its_kind_then_runs() {
        let mut w = base_world();
        let gk = GroupKind::new("example.org", "Widget");
        watch(&mut w, &gk, 1);
        assert!(matches!(w.holds().get("r"), Some(Hold::WaitingForSync(_))));
        assert!(!w.kinds_settled());
        // A list in progress changes nothing; InitDone swaps it in.
        w.apply(Feed::Kind(gk.clone(), 1, Event::Init));
        let c = w.apply(Feed::Kind(gk.clone(), 1, Event::InitApply(widget("a"))));
        assert!(!c.dirty);
        assert_eq!(w.store.list(&gk).count(), 0);
        let c = w.apply(Feed::Kind(gk.clone(), 1, Event::InitDone));
        assert!(c.dirty);
        assert_eq!(w.store.list(&gk).count(), 1);
        assert!(w.holds().is_empty());
        assert!(w.kinds_settled());
        // Events of a stopped predecessor are ignored.
        let c = w.apply(Feed::Kind(gk.clone(), 0, Event::Apply(widget("b"))));
        assert_eq!(c, Change::default());
        // An unchanged object is not a change.
        let c = w.apply(Feed::Kind(gk.clone(), 1, Event::Apply(widget("a"))));
        assert!(!c.dirty);
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
        listed(&mut w, |e| Feed::Owned(OutputKind::Role, e), vec![]);
        assert!(w.base_synced());
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
        let c = w.apply(Feed::Owned(
            OutputKind::ClusterRole,
            Event::Apply(role.clone()),
        ));
        assert!(c.dirty);
        let live = &w.owned[&ObjectId::new(OutputKind::ClusterRole, "", "x")];
        assert!(live.object["metadata"].get("managedFields").is_none());
        assert!(live.ours.as_ref().is_some_and(|o| o.labels.contains("a")));
        let c = w.apply(Feed::Owned(OutputKind::ClusterRole, Event::Delete(role)));
        assert!(c.dirty);
        assert!(w.owned.is_empty());
    }

    #[test]
    fn the_cache_learns_from_writes_and_ignores_older_watch_events() {
        use crate::controller::apply::{Outcome, Written};
        let mut w = base_world();
        let id = ObjectId::new(OutputKind::ClusterRole, "", "x");
        let gk = crate::engine::compile::output_gk(OutputKind::ClusterRole);
        let key = (String::new(), "x".to_string());
        let version = |rv: &str, verbs: Value| {
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "x", "resourceVersion": rv,
                             "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]})
        };
        let written = |outcome, live| Written {
            id: id.clone(),
            rule: "r".into(),
            outcome,
            live,
        };
        w.learn(&[written(
            Outcome::Created,
            Some(version("20", json!(["get"]))),
        )]);
        assert_eq!(w.owned[&id].resource_version(), Some("20"));
        // Mirrored into the store the engine judges (no rule reads the kind).
        assert!(w.store.get(&gk, &key).is_some());
        // The watch then delivers an event from before the write.
        let c = w.apply(Feed::Owned(
            OutputKind::ClusterRole,
            Event::Apply(version("12", json!(["list"]))),
        ));
        assert!(!c.dirty);
        assert_eq!(w.owned[&id].resource_version(), Some("20"));
        // A newer one replaces it.
        let c = w.apply(Feed::Owned(
            OutputKind::ClusterRole,
            Event::Apply(version("21", json!(["watch"]))),
        ));
        assert!(c.dirty);
        assert_eq!(w.owned[&id].resource_version(), Some("21"));
        // A failed write teaches nothing; a prune removes at once.
        w.learn(&[written(Outcome::Skipped, Some(version("30", json!([]))))]);
        assert_eq!(w.owned[&id].resource_version(), Some("21"));
        w.learn(&[written(Outcome::Revoked("policy".into()), None)]);
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
            listed(&mut w, |e| Feed::Owned(k, e), vec![]);
        }
        assert!(!w.base_synced());
        w.apply(Feed::Allow(Box::new(Event::Init)));
        w.apply(Feed::Allow(Box::new(Event::InitDone)));
        assert!(w.base_synced());
        assert!(matches!(
            w.holds().get("r"),
            Some(Hold::AllowListNotFound(_))
        ));
    }
}
