//! Watch plumbing: starts and stops the watches (the RbacRules, every
//! RBAC object of the output kinds, every kind the rules read, and the
//! allow-list ClusterRole). Each runs in its own task and sends
//! [`Feed`] items to the control loop, which owns the [`World`].

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, ApiResource};
use kube::discovery::{self, ApiGroup};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::apply::api_resource;
use super::tenants::KIND as TENANT_KIND;
use super::wire::{Wire, WireMeta, keeping};
use super::world::{Feed, Source, World, map_event, output_kind};
use crate::api::{ManageLevel, NamespacedRbacRule, OutputKind, RbacRule, RbacRuleSpec};
use crate::engine::{GroupKind, Interest};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A task aborted when dropped: stopping a watch is dropping it.
#[derive(Debug)]
pub struct Task(JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts and stops watches: owns the client, the feed sender and the
/// watch tasks (a watch stops when its task is dropped).
pub struct Watches {
    client: Client,
    tx: mpsc::UnboundedSender<Feed>,
    manage: ManageLevel,
    base: Vec<Task>,
    outputs: BTreeMap<OutputKind, Task>,
    kinds: BTreeMap<GroupKind, Task>,
}

impl Watches {
    /// Starts the RbacRule, output-kind and allow-list watches.
    ///
    /// The output kinds are watched whole, not by our label: the world then
    /// knows which names other objects hold, so creating an object needs no
    /// read first, and an object losing our label leaves our cache in the
    /// same event that makes it someone else's.
    pub fn start(
        client: Client,
        tx: mpsc::UnboundedSender<Feed>,
        manage: ManageLevel,
        allow_name: Option<&str>,
    ) -> Self {
        let mut base = Vec::new();
        // Read as any object is ([`Wire`]), then typed one by one: a rule
        // kube's typed decoder cannot read (nested past serde_json's
        // limit in a free-form field) failed the whole list, and so every
        // rule; now it is refused alone.
        let rules = ApiResource::erase::<RbacRule>(&());
        base.push(spawn(
            Api::<Wire>::all_with(client.clone(), &rules),
            watcher::Config::default(),
            None,
            tx.clone(),
            move |ev| rule_feed(ev, &rules),
            || Source::Rules,
        ));
        // Tenant rules in every namespace, read the same way.
        let tenants = ApiResource::erase::<crate::api::NamespacedRbacRule>(&());
        base.push(spawn(
            Api::<Wire>::all_with(client.clone(), &tenants),
            watcher::Config::default(),
            None,
            tx.clone(),
            move |ev| tenant_feed(ev, &tenants),
            || Source::Tenants,
        ));
        let outputs = OutputKind::ALL
            .into_iter()
            .map(|kind| (kind, watch_outputs(&client, &tx, kind)))
            .collect();
        if let Some(name) = allow_name {
            base.push(spawn(
                Api::<ClusterRole>::all(client.clone()),
                watcher::Config::default().fields(&format!("metadata.name={name}")),
                None,
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
            outputs,
            kinds: BTreeMap::new(),
        }
    }

    /// Brings the rule-kind watches in line with the rules: starts watches
    /// for new kinds (after discovery), restarts changed ones, stops and
    /// forgets kinds no rule reads any more.
    pub async fn reconcile_kinds(&mut self, world: &mut World) {
        let wanted = world.interests(self.manage);
        world.pack_kinds(&wanted);
        for gk in world.kinds_not_in(&wanted) {
            tracing::info!(kind = %gk, "no rule reads this kind any more: watch stopped");
            world.forget_kind(&gk);
        }
        self.stop_unwatched(world);
        let mut groups: BTreeMap<String, Result<ApiGroup, String>> = BTreeMap::new();
        for (gk, interest) in wanted {
            if world
                .interest_of(&gk)
                .is_some_and(|i| i.watched_as(&interest))
            {
                continue;
            }
            self.start_kind(world, &mut groups, interest).await;
        }
        tracing::debug!(
            kinds = self.kinds.len(),
            base = self.base.len(),
            "watches reconciled"
        );
    }

    /// Stops the tasks of kinds the world no longer watches (forgotten, or
    /// no longer served).
    pub fn stop_unwatched(&mut self, world: &World) {
        self.kinds.retain(|gk, _| world.is_watching(gk));
    }

    /// Retries discovery of kinds that were not served.
    pub async fn rediscover(&mut self, world: &mut World) -> bool {
        let mut groups = BTreeMap::new();
        let mut started = false;
        for interest in world.unresolved_interests() {
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
        let epoch = world.next_epoch();
        if let Some(kind) = output_kind(&gk) {
            // Already watched whole, by the output-kind watch.
            world.watch_kind(interest, epoch, None);
            if world.relist_outputs(kind) {
                tracing::info!(kind = %gk, "rules read an output kind: listing it again");
                self.outputs
                    .insert(kind, watch_outputs(&self.client, &self.tx, kind));
            }
            return true;
        }
        // The old task stops; its late events carry the old epoch.
        self.kinds.remove(&gk);
        match resolve(&self.client, groups, &interest).await {
            Ok(ar) => {
                tracing::info!(kind = %gk, version = %ar.version, metadata_only = interest.metadata_only, "watching");
                let task = self.watch_kind(&ar, &gk, epoch, &interest);
                self.kinds.insert(gk, task);
                world.watch_kind(interest, epoch, None);
                true
            }
            Err(why) => {
                tracing::warn!(kind = %gk, reason = %why, "kind not watched; will retry");
                world.watch_kind(interest, epoch, Some(why));
                false
            }
        }
    }

    fn watch_kind(
        &self,
        ar: &ApiResource,
        gk: &GroupKind,
        epoch: u64,
        interest: &Interest,
    ) -> Task {
        if interest.metadata_only {
            // Only metadata is fetched and cached: no CRD bodies in memory.
            let api = Api::<WireMeta>::all_with(self.client.clone(), ar);
            self.spawn_kind(api, ar, gk, epoch, None, |m: WireMeta| m.0)
        } else {
            // Read straight into JSON, without managedFields; of a kind
            // whose readers all name `fields`, only what they see is built.
            let api = Api::<Wire>::all_with(self.client.clone(), ar);
            let cut = interest.fields.as_deref().map(Arc::from);
            self.spawn_kind(api, ar, gk, epoch, cut, |w: Wire| w)
        }
    }

    /// One kind's watch task, whatever shape its objects arrive in.
    fn spawn_kind<K>(
        &self,
        api: Api<K>,
        ar: &ApiResource,
        gk: &GroupKind,
        epoch: u64,
        cut: Option<Arc<[Vec<String>]>>,
        wire: fn(K) -> Wire,
    ) -> Task
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        let source_gk = gk.clone();
        let source = move || Source::Kind(source_gk.clone(), epoch);
        let feed_gk = gk.clone();
        let ar = ar.clone();
        let report = source.clone();
        spawn(
            api,
            watcher::Config::default().page_size(KIND_PAGE_SIZE),
            cut,
            self.tx.clone(),
            move |ev| {
                let ev = map_event(ev, wire);
                match refusal(&ev, &ar) {
                    Some(why) => refused(report(), why),
                    None => {
                        Feed::Kind(feed_gk.clone(), epoch, map_event(ev, |o| o.into_value(&ar)))
                    }
                }
            },
            source,
        )
    }
}

/// An RbacRule event, each rule typed alone: one that cannot be read is
/// reported and left out (its deletion still counts, by name).
/// A NamespacedRbacRule event, each rule typed alone (as for RbacRules):
/// one that cannot be read is reported and left out; its deletion still
/// counts, by namespace and name.
pub fn tenant_feed(ev: Event<Wire>, ar: &ApiResource) -> Feed {
    let typed = |w: Wire| -> Result<RbacRule, String> {
        if let Some(why) = w.refusal(ar) {
            return Err(why);
        }
        let value = w.into_value(ar);
        let at = format!(
            "{}/{}",
            value["metadata"]["namespace"].as_str().unwrap_or_default(),
            value["metadata"]["name"].as_str().unwrap_or_default()
        );
        let rule: NamespacedRbacRule = serde_json::from_value(value)
            .map_err(|e| format!("{TENANT_KIND} {at}: cannot be read: {e}"))?;
        if rule
            .metadata
            .namespace
            .as_deref()
            .unwrap_or_default()
            .is_empty()
        {
            return Err(format!("{TENANT_KIND} {at}: has no namespace"));
        }
        Ok(super::tenants::carrier(rule))
    };
    let ev = match ev {
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
        Event::Apply(w) => match typed(w) {
            Ok(r) => Event::Apply(r),
            Err(why) => return tenant_refused(why),
        },
        Event::InitApply(w) => match typed(w) {
            Ok(r) => Event::InitApply(r),
            Err(why) => return tenant_refused(why),
        },
        Event::Delete(w) => match typed(w.clone()) {
            Ok(r) => Event::Delete(r),
            Err(_) => match tenant_gone(w, ar) {
                Some(r) => Event::Delete(r),
                None => return tenant_refused(format!("a deleted {TENANT_KIND} without a name")),
            },
        },
    };
    Feed::Tenants(Box::new(ev))
}

/// The deletion of a tenant rule that cannot be read whole: its metadata
/// is what a deletion needs.
fn tenant_gone(w: Wire, ar: &ApiResource) -> Option<RbacRule> {
    let meta: ObjectMeta =
        serde_json::from_value(w.into_value(ar).get("metadata")?.clone()).ok()?;
    meta.name.as_ref()?;
    meta.namespace.as_ref()?;
    let mut rule = RbacRule::new(
        "",
        RbacRuleSpec {
            manage_level: Default::default(),
            deletion_policy: Default::default(),
            trigger: None,
            related: Vec::new(),
            params: Vec::new(),
            vars: Vec::new(),
            outputs: Vec::new(),
        },
    );
    rule.metadata = meta;
    Some(rule)
}

fn tenant_refused(why: String) -> Feed {
    tracing::warn!(source = "NamespacedRbacRules", reason = %why, "object refused");
    Feed::Error(
        Source::Tenants,
        kube::runtime::watcher::Error::WatchFailed(kube::Error::SerdeError(
            <serde_json::Error as serde::de::Error>::custom(why),
        )),
    )
}

fn rule_feed(ev: Event<Wire>, ar: &ApiResource) -> Feed {
    let typed = |w: Wire| -> Result<RbacRule, String> {
        if let Some(why) = w.refusal(ar) {
            return Err(why);
        }
        let name = w.meta().name.clone().unwrap_or_default();
        serde_json::from_value(w.into_value(ar))
            .map_err(|e| format!("RbacRule {name}: cannot be read: {e}"))
    };
    let ev = match ev {
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
        Event::Apply(w) => match typed(w) {
            Ok(r) => Event::Apply(r),
            Err(why) => return refused(Source::Rules, why),
        },
        Event::InitApply(w) => match typed(w) {
            Ok(r) => Event::InitApply(r),
            Err(why) => return refused(Source::Rules, why),
        },
        Event::Delete(w) if w.refusal(ar).is_none() => match typed(w.clone()) {
            Ok(r) => Event::Delete(r),
            Err(_) => return rule_gone(w, ar),
        },
        Event::Delete(w) => return rule_gone(w, ar),
    };
    Feed::Rules(Box::new(ev))
}

/// The deletion of a rule that cannot be read whole: its name (and the
/// rest of its metadata) is what a deletion needs.
fn rule_gone(w: Wire, ar: &ApiResource) -> Feed {
    let meta = w.into_value(ar).get("metadata").cloned();
    let gone = serde_json::json!({"apiVersion": ar.api_version, "kind": ar.kind,
        "metadata": meta, "spec": {"outputs": []}});
    match serde_json::from_value(gone) {
        Ok(r) => Feed::Rules(Box::new(Event::Delete(r))),
        Err(e) => refused(Source::Rules, format!("a deleted RbacRule: {e}")),
    }
}

/// Why an event's object cannot be kept (see [`Wire::refusal`]); a
/// deletion needs only the object's name, so it always goes through.
fn refusal(ev: &Event<Wire>, ar: &ApiResource) -> Option<String> {
    match ev {
        Event::Apply(o) | Event::InitApply(o) => o.refusal(ar),
        Event::Delete(_) | Event::Init | Event::InitDone => None,
    }
}

/// A refused object, reported as an error of its watch (which goes on):
/// the event is dropped, so the object is as if absent.
fn refused(source: Source, why: String) -> Feed {
    tracing::warn!(?source, reason = %why, "object refused");
    Feed::Error(
        source,
        watcher::Error::WatchFailed(kube::Error::SerdeError(
            <serde_json::Error as serde::de::Error>::custom(why),
        )),
    )
}

/// Objects per page of a list of an output kind. A page is held whole as
/// JSON trees while it is read, and a Role copying many ClusterRoles is
/// tens of kilobytes as a tree: kube's default of 500 made one page of
/// Roles most of the controller's transient memory in a relist. At 50
/// (and read kinds at 100) the controller's peak RSS at `large` is about
/// 0.5 MiB lower than at 100 (and 500).
pub const OUTPUT_PAGE_SIZE: u32 = 50;

/// Objects per page of a list of a kind the rules read: kube's default
/// (500) holds 500 parsed objects at once, and their JSON trees while they
/// wait for the control loop.
pub const KIND_PAGE_SIZE: u32 = 100;

/// The watch of every object of an output kind, read straight into the
/// cached form ([`Wire`]): what our field manager owns is read from the
/// managedFields while they are parsed, and no other entry is kept.
fn watch_outputs(client: &Client, tx: &mpsc::UnboundedSender<Feed>, kind: OutputKind) -> Task {
    let ar = api_resource(kind);
    let api = Api::<Wire>::all_with(client.clone(), &ar);
    spawn(
        api,
        watcher::Config::default().page_size(OUTPUT_PAGE_SIZE),
        None,
        tx.clone(),
        move |ev| match refusal(&ev, &ar) {
            Some(why) => refused(Source::Owned(kind), why),
            None => Feed::Owned(kind, map_event(ev, |o| o.into_live(&ar))),
        },
        move || Source::Owned(kind),
    )
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

/// Runs a watcher (with backoff) in a task, feeding the control loop.
fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    cut: Option<Arc<[Vec<String>]>>,
    tx: mpsc::UnboundedSender<Feed>,
    feed: impl Fn(Event<K>) -> Feed + Send + 'static,
    source: impl Fn() -> Source + Send + 'static,
) -> Task
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    Task(tokio::spawn(async move {
        let mut inner = watcher(api, config).default_backoff().boxed();
        // Bodies are parsed within a poll of the watch: cut there.
        let mut stream = futures::stream::poll_fn(move |cx| match &cut {
            Some(paths) => keeping(paths, || inner.poll_next_unpin(cx)),
            None => inner.poll_next_unpin(cx),
        });
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
