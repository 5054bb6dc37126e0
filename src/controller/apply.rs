//! Executing a [`Plan`]: server-side applies and precondition deletes, a
//! bounded number in flight at once.
//!
//! Every write first checks the [`Gate`]: a replica that lost the lease or
//! is shutting down sends nothing more.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use serde_json::Value;

use super::Error;
use super::live::{Live, ObjectId, is_ours};
use super::metrics::Metrics;
use super::plan::{Apply, ApplyAction, Delete, FIELD_MANAGER, Plan, is_helm_released};
use super::wire::Wire;
use crate::api::OutputKind;
use crate::engine::Manifest;
use crate::engine::output::MANAGED_BY_LABEL;

/// How long a found ownership conflict is trusted before the object is
/// looked up again (so a conflict costs one GET per period, not one per
/// reconcile, and a removed foreign object is replaced within it).
pub const CONFLICT_RECHECK: Duration = Duration::from_secs(300);

/// Whether this replica may write: it leads (or runs without election) and
/// is not shutting down.
#[derive(Debug, Default)]
pub struct Gate {
    leader: AtomicBool,
    stopping: AtomicBool,
}

impl Gate {
    /// A gate; `leader` is the initial leadership.
    pub fn new(leader: bool) -> Self {
        Gate {
            leader: AtomicBool::new(leader),
            stopping: AtomicBool::new(false),
        }
    }

    /// Records leadership.
    pub fn set_leader(&self, leader: bool) {
        self.leader.store(leader, Ordering::SeqCst);
    }

    /// Stops all further writes.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Whether this replica holds the lease.
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::SeqCst)
    }

    /// Whether a write may be sent now.
    pub fn open(&self) -> bool {
        self.is_leader() && !self.stopping.load(Ordering::SeqCst)
    }
}

/// Objects known to exist without our provenance, with when we looked.
#[derive(Debug, Default)]
pub struct ConflictMemo {
    seen: BTreeMap<ObjectId, (Instant, String)>,
}

impl ConflictMemo {
    fn get(&self, id: &ObjectId) -> Option<&str> {
        self.seen
            .get(id)
            .filter(|(at, _)| at.elapsed() < CONFLICT_RECHECK)
            .map(|(_, m)| m.as_str())
    }

    /// Forgets objects no longer wanted, and conflicts with objects the
    /// watches saw go (their names are free now).
    fn retain(&mut self, plan: &Plan, foreign: &BTreeSet<ObjectId>) {
        let planned: BTreeSet<&ObjectId> = plan.applies.iter().map(|a| &a.id).collect();
        self.seen
            .retain(|id, _| planned.contains(id) && foreign.contains(id));
    }
}

/// What happened to one planned write.
#[derive(Debug)]
pub enum Outcome {
    /// Created (did not exist).
    Created,
    /// Updated; the parts that differed.
    Updated(Vec<&'static str>),
    /// Binding deleted and re-created with a new roleRef.
    Recreated,
    /// An existing object without our label taken over in place (one
    /// server-side apply); why it was adopted.
    Adopted(String),
    /// Pruned.
    Deleted,
    /// Deleted because policy refuses what it grants (see
    /// `Evaluation::revoked`); why.
    Revoked(String),
    /// Exists without our provenance: left alone. `fresh` is false when the
    /// conflict was remembered rather than looked up now.
    Conflict {
        /// Who seems to manage it.
        message: String,
        /// Newly found (emit an Event) or remembered.
        fresh: bool,
    },
    /// A binding not written because the role it names could not be
    /// written this time (so it never binds a foreign or stale role).
    Blocked(String),
    /// The object changed or vanished under a precondition: re-plan later.
    Raced,
    /// The API server refused or could not be reached (boxed: an outcome
    /// is kept per write of a pass, and most are small).
    Failed(Box<Error>),
    /// Not sent: the gate closed.
    Skipped,
}

impl Outcome {
    /// Whether the object now exists as desired.
    pub fn is_applied(&self) -> bool {
        matches!(
            self,
            Outcome::Created | Outcome::Updated(_) | Outcome::Recreated | Outcome::Adopted(_)
        )
    }

    /// Whether the write changed an object: applied, or deleted.
    pub fn is_write(&self) -> bool {
        self.is_applied() || matches!(self, Outcome::Deleted | Outcome::Revoked(_))
    }
}

/// One planned write and its outcome, borrowed from a pass's report (see
/// `SyncReport::written`): the object and rule are the plan's.
#[derive(Clone, Copy, Debug)]
pub struct Written<'a> {
    /// The object.
    pub id: &'a ObjectId,
    /// The rule that wanted (or owned) it.
    pub rule: &'a str,
    /// What happened.
    pub outcome: &'a Outcome,
}

impl<'a> Written<'a> {
    /// Each write of `plan` (applies, then deletes) with its outcome in
    /// `outcomes` (the same order).
    pub fn of(plan: &'a Plan, outcomes: &'a [Outcome]) -> impl Iterator<Item = Written<'a>> {
        plan.applies
            .iter()
            .map(|a| (&a.id, &*a.rule))
            .chain(plan.deletes.iter().map(|d| (&d.id, d.rule.as_str())))
            .zip(outcomes)
            .map(|((id, rule), outcome)| Written { id, rule, outcome })
    }
}

/// What a write teaches the cache, handed over as soon as the API server
/// answers (so a reconcile before the watch event writes nothing twice).
#[derive(Debug)]
pub enum Learned {
    /// The object as the API server returned it after an apply.
    Applied(Live),
    /// The object was deleted (the uid of the deleted object, if known).
    Deleted(ObjectId, Option<String>),
}

/// Where a pass's writes go and what they are told.
pub struct Writes<'a> {
    /// How writes are sent.
    pub options: &'a WriteOptions,
    /// Objects of the output kinds without our label (from the watches):
    /// only a create of one of those names is looked up first.
    pub foreign: &'a BTreeSet<ObjectId>,
    /// Told what each write changed, as soon as it is answered.
    pub learn: Option<&'a (dyn Fn(Learned) + Send + Sync)>,
}

/// The ApiResource of an RBAC kind.
pub fn api_resource(kind: OutputKind) -> ApiResource {
    match kind {
        OutputKind::ClusterRole => ApiResource::erase::<ClusterRole>(&()),
        OutputKind::Role => ApiResource::erase::<Role>(&()),
        OutputKind::ClusterRoleBinding => ApiResource::erase::<ClusterRoleBinding>(&()),
        OutputKind::RoleBinding => ApiResource::erase::<RoleBinding>(&()),
    }
}

/// Reads one RBAC object by id; `None` when it does not exist.
pub async fn get_existing(client: &Client, id: &ObjectId) -> Result<Option<Value>, Error> {
    match api_for(client, id).get_opt(&id.name).await {
        Ok(found) => Ok(found.map(|o| serde_json::to_value(&o).unwrap_or_default())),
        Err(source) => Err(Error::Api {
            action: "get",
            object: id.to_string(),
            source,
        }),
    }
}

fn api_for(client: &Client, id: &ObjectId) -> Api<DynamicObject> {
    api_of(client, id)
}

/// The API of an object's kind, whatever type its objects are read as.
fn api_of<
    K: kube::Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
>(
    client: &Client,
    id: &ObjectId,
) -> Api<K> {
    let ar = api_resource(id.kind);
    if id.kind.namespaced() {
        Api::namespaced_with(client.clone(), &id.namespace, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    }
}

/// How writes are sent.
#[derive(Clone, Debug)]
pub struct WriteOptions {
    /// Take over existing objects without a controller (`--adopt-existing`).
    pub adopt_existing: bool,
    /// Writes in flight at once (`--max-concurrent-writes`, at least 1).
    pub max_concurrent: usize,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            adopt_existing: false,
            max_concurrent: DEFAULT_MAX_CONCURRENT_WRITES,
        }
    }
}

/// Default of `--max-concurrent-writes`.
pub const DEFAULT_MAX_CONCURRENT_WRITES: usize = 16;

/// What one write needs, borrowed for the length of a pass.
struct Writer<'a> {
    client: &'a Client,
    gate: &'a Gate,
    metrics: &'a Metrics,
    memo: &'a ConflictMemo,
    foreign: &'a BTreeSet<ObjectId>,
    adopt_existing: bool,
    learn: Option<&'a (dyn Fn(Learned) + Send + Sync)>,
}

/// One apply's result: the outcome and a newly found conflict to remember.
struct Applied {
    outcome: Outcome,
    conflict: Option<String>,
}

impl Applied {
    fn outcome(outcome: Outcome) -> Self {
        Applied {
            outcome,
            conflict: None,
        }
    }
}

/// Sends the plan's writes and reports each outcome, in plan order
/// (applies, then deletes; see [`Written::of`]). A failed write does not stop the others.
///
/// Writes go out up to `options.max_concurrent` at a time, in four waves
/// whose order matters: role applies, then binding applies (a binding
/// whose role could not be written waits), then binding deletes, then role
/// deletes. Within a wave order does not matter; a re-created binding is
/// deleted and applied within one write. The gate is checked before every
/// request. Retries of 429 (API priority and fairness), 503 and 504 with
/// `Retry-After` are the client's: `Client::try_default` installs kube's
/// retry layer.
///
/// Only a create of a name `writes.foreign` holds is looked up first;
/// every other create is one apply.
pub async fn execute(
    client: &Client,
    gate: &Gate,
    metrics: &Metrics,
    plan: &Plan,
    memo: &mut ConflictMemo,
    writes: &Writes<'_>,
) -> Vec<Outcome> {
    memo.retain(plan, writes.foreign);
    let limit = writes.options.max_concurrent.max(1);
    let writer = Writer {
        client,
        gate,
        metrics,
        memo,
        foreign: writes.foreign,
        adopt_existing: writes.options.adopt_existing,
        learn: writes.learn,
    };
    let writer = &writer;
    // The outcomes in plan order, each filled in place as its answer comes
    // (whatever the order): no list of answers beside it, and no copy of
    // the plan's ids and rule names.
    let mut out: Vec<Outcome> = std::iter::repeat_with(|| Outcome::Skipped)
        .take(plan.applies.len() + plan.deletes.len())
        .collect();
    // Newly found conflicts, by position, remembered once the pass is done.
    let mut conflicts: Vec<(usize, String)> = Vec::new();
    let mut answer = |i: usize, r: Applied, out: &mut [Outcome]| {
        if let Some(message) = r.conflict {
            conflicts.push((i, message));
        }
        out[i] = r.outcome;
    };
    // Roles first: bindings wait for the roles they name.
    let roles = indices(&plan.applies, |a| a.id.kind.is_role());
    let apply = |i: usize| async move { (i, writer.apply(&plan.applies[i]).await) };
    bounded(limit, roles, apply, |(i, r)| answer(i, r, &mut out)).await;
    // Roles planned but not written: bindings naming them wait.
    let unwritten: BTreeSet<&ObjectId> = plan
        .applies
        .iter()
        .zip(&out)
        .filter(|(a, o)| a.id.kind.is_role() && !o.is_applied())
        .map(|(a, _)| &a.id)
        .collect();
    let bindings = indices(&plan.applies, |a| !a.id.kind.is_role());
    let unwritten = &unwritten;
    let apply = |i: usize| async move {
        let a = &plan.applies[i];
        let blocked = role_ref(&a.id, &a.object).filter(|r| unwritten.contains(r));
        let result = match blocked {
            Some(role) => Applied::outcome(Outcome::Blocked(format!(
                "{} is not written: the {role} it names was not written",
                a.id
            ))),
            None => writer.apply(a).await,
        };
        (i, result)
    };
    bounded(limit, bindings, apply, |(i, r)| answer(i, r, &mut out)).await;
    // Bindings go before the roles they name (the plan sorts them so).
    let first_delete = plan.applies.len();
    for wave in [false, true] {
        let deletes = indices(&plan.deletes, |d| d.id.kind.is_role() == wave);
        let delete = |i: usize| async move { (i, writer.delete(&plan.deletes[i]).await) };
        bounded(limit, deletes, delete, |(i, o)| {
            out[first_delete + i] = o;
        })
        .await;
    }
    for (i, message) in conflicts {
        memo.seen
            .insert(plan.applies[i].id.clone(), (Instant::now(), message));
    }
    for w in Written::of(plan, &out) {
        log_outcome(w.id, w.outcome);
    }
    out
}

/// The positions of the items `keep` selects.
fn indices<T>(items: &[T], keep: impl Fn(&T) -> bool) -> Vec<usize> {
    (0..items.len()).filter(|i| keep(&items[*i])).collect()
}

/// Runs `job` for each index, at most `limit` at once, handing each
/// result to `done` in completion order. Each job is made only when it
/// starts: a pass of thousands of writes holds `limit` requests in memory,
/// not one per write.
async fn bounded<F: Future>(
    limit: usize,
    jobs: Vec<usize>,
    job: impl FnMut(usize) -> F,
    mut done: impl FnMut(F::Output),
) {
    stream::iter(jobs)
        .map(job)
        .buffer_unordered(limit)
        .for_each(|out| {
            done(out);
            std::future::ready(())
        })
        .await
}

impl Writer<'_> {
    async fn apply(&self, a: &Apply) -> Applied {
        if !self.gate.open() {
            return Applied::outcome(Outcome::Skipped);
        }
        let mut live = None;
        let outcome = apply_one(self, a, &mut live).await;
        if let (Some(learn), Some(live), true) = (self.learn, live, outcome.is_applied()) {
            learn(Learned::Applied(live));
        }
        // A conflict found now (not remembered) is remembered.
        let conflict = match &outcome {
            Outcome::Conflict {
                message,
                fresh: true,
            } => Some(message.clone()),
            _ => None,
        };
        Applied { outcome, conflict }
    }

    async fn delete(&self, d: &Delete) -> Outcome {
        if !self.gate.open() {
            return Outcome::Skipped;
        }
        match delete_one(
            self.client,
            self.metrics,
            &d.id,
            d.uid.clone(),
            d.resource_version.clone(),
        )
        .await
        {
            Ok(()) => {
                if let Some(learn) = self.learn {
                    learn(Learned::Deleted(d.id.clone(), d.uid.clone()));
                }
                match &d.revoked {
                    Some(why) => Outcome::Revoked(why.clone()),
                    None => Outcome::Deleted,
                }
            }
            Err(e) if e.is_gone_or_changed() => Outcome::Raced,
            Err(e) => Outcome::Failed(Box::new(e)),
        }
    }
}

/// The role a binding manifest names, as an id.
fn role_ref(id: &ObjectId, object: &Manifest) -> Option<ObjectId> {
    if id.kind.is_role() {
        return None;
    }
    let (kind, name) = object.role_ref()?;
    let kind = OutputKind::parse(kind)?;
    let namespace = if kind.namespaced() {
        id.namespace.clone()
    } else {
        Arc::from("")
    };
    Some(ObjectId::new(kind, namespace, name))
}

fn log_outcome(id: &ObjectId, outcome: &Outcome) {
    match outcome {
        Outcome::Created => tracing::info!(object = %id, "created"),
        Outcome::Updated(parts) => tracing::info!(object = %id, changed = ?parts, "updated"),
        Outcome::Recreated => tracing::info!(object = %id, "re-created with a new roleRef"),
        Outcome::Adopted(why) => tracing::info!(object = %id, reason = %why, "adopted"),
        Outcome::Deleted => tracing::info!(object = %id, "pruned"),
        Outcome::Revoked(why) => tracing::warn!(object = %id, %why, "revoked: policy refuses it"),
        Outcome::Conflict { message, fresh } => {
            if *fresh {
                tracing::warn!(object = %id, %message, "not ours: left alone");
            }
        }
        Outcome::Raced => tracing::info!(object = %id, "changed concurrently; will re-plan"),
        Outcome::Blocked(why) => tracing::warn!(object = %id, reason = %why, "binding not written"),
        Outcome::Failed(e) => tracing::warn!(object = %id, error = %e, "write failed"),
        Outcome::Skipped => tracing::debug!(object = %id, "write skipped: not leading"),
    }
}

/// Sends one planned apply: a create (which may meet someone else's
/// object), an update, or a re-creation with a new roleRef.
async fn apply_one(w: &Writer<'_>, a: &Apply, learned: &mut Option<Live>) -> Outcome {
    // Applies read the response straight into the cached form.
    let wire = api_of::<Wire>(w.client, &a.id);
    match &a.action {
        ApplyAction::Create => create_one(w, a, learned).await,
        ApplyAction::Update(parts) => done_or_failed(
            send_apply(&wire, w.metrics, a, true, learned).await,
            Outcome::Updated(parts.clone()),
        ),
        ApplyAction::Recreate {
            uid,
            resource_version,
        } => {
            match delete_one(
                w.client,
                w.metrics,
                &a.id,
                uid.clone(),
                resource_version.clone(),
            )
            .await
            {
                Ok(()) => {}
                // Already gone: create it.
                Err(Error::Api {
                    source: kube::Error::Api(s),
                    ..
                }) if s.code == 404 => {}
                Err(e) if e.is_gone_or_changed() => return Outcome::Raced,
                Err(e) => return Outcome::Failed(Box::new(e)),
            }
            // No gate check between the two: a lost lease must not leave
            // the subjects without their binding.
            done_or_failed(
                send_apply(&wire, w.metrics, a, true, learned).await,
                Outcome::Recreated,
            )
        }
    }
}

/// `done` when the write was sent, else the failure.
fn done_or_failed(sent: Result<(), Error>, done: Outcome) -> Outcome {
    match sent {
        Ok(()) => done,
        Err(e) => Outcome::Failed(Box::new(e)),
    }
}

/// Creates an object: one unforced apply when the watches know the name
/// as free (a 409 means someone made it meanwhile); else, or after the
/// 409, the name's holder is looked at ([`take_over`]).
async fn create_one(w: &Writer<'_>, a: &Apply, learned: &mut Option<Live>) -> Outcome {
    if let Some(message) = w.memo.get(&a.id) {
        return Outcome::Conflict {
            message: message.to_string(),
            fresh: false,
        };
    }
    if !w.foreign.contains(&a.id) {
        // Unforced, so an object another manager made meanwhile conflicts
        // (409) instead of being taken over.
        let wire = api_of::<Wire>(w.client, &a.id);
        match send_apply(&wire, w.metrics, a, false, learned).await {
            Ok(()) => return Outcome::Created,
            Err(Error::Api {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 409 => {}
            Err(e) => return Outcome::Failed(Box::new(e)),
        }
        if !w.gate.open() {
            return Outcome::Skipped;
        }
    }
    take_over(w, a, learned).await
}

/// Someone else's object holds the name of an object to create: adopt it
/// (when [`adoption`] says so) or leave it: a fresh conflict, which the
/// writer remembers. Ours already (the cache lags behind) or gone: applied.
async fn take_over(w: &Writer<'_>, a: &Apply, learned: &mut Option<Live>) -> Outcome {
    let wire = api_of::<Wire>(w.client, &a.id);
    let found = api_for(w.client, &a.id)
        .get_opt(&a.id.name)
        .await
        .map(|o| o.map(|o| serde_json::to_value(&o).unwrap_or_default()));
    match found {
        // Labelled ours by someone else is someone else's: adopted only
        // as anyone's would be.
        Ok(Some(existing)) if !is_ours(&existing) => {
            match adoption(&a.id, &a.body(), &existing, w.adopt_existing) {
                Ok(why) => {
                    if !w.gate.open() {
                        return Outcome::Skipped;
                    }
                    // In place, one apply: no moment without the object,
                    // so nobody loses a permission.
                    let mut adopted = a.clone();
                    adopted.keep_helm |= is_helm_released(&existing);
                    // It existed before: never pruned from now on.
                    adopted.adopted = true;
                    done_or_failed(
                        send_apply(&wire, w.metrics, &adopted, true, learned).await,
                        Outcome::Adopted(why),
                    )
                }
                Err(message) => Outcome::Conflict {
                    message,
                    fresh: true,
                },
            }
        }
        Ok(_) => {
            if !w.gate.open() {
                return Outcome::Skipped;
            }
            done_or_failed(
                send_apply(&wire, w.metrics, a, true, learned).await,
                Outcome::Created,
            )
        }
        Err(source) => Outcome::Failed(Box::new(Error::Api {
            action: "get",
            object: a.id.to_string(),
            source,
        })),
    }
}

/// The controller ownerReference of an object, if any.
fn controller_of(obj: &Value) -> Option<&Value> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["controller"].as_bool() == Some(true))
}

/// Whether an existing object without our label is adopted, and why; or
/// the conflict message when it is not.
///
/// - Its controller is the desired output's own trigger (same uid): adopted
///   by lineage, always (what another controller made for the same owner).
/// - It has another controller: never adopted.
/// - It has none: adopted only with `--adopt-existing`.
pub fn adoption(
    id: &ObjectId,
    desired: &Value,
    existing: &Value,
    adopt_existing: bool,
) -> Result<String, String> {
    if let Some(why) = super::plan::protected(id, |k| existing["metadata"]["labels"][k].as_str()) {
        return Err(format!("{id} is {why}: never adopted"));
    }
    let theirs = controller_of(existing);
    let ours = controller_of(desired).and_then(|o| o["uid"].as_str());
    match theirs {
        Some(c) if c["uid"].as_str().is_some() && c["uid"].as_str() == ours => Ok(format!(
            "{id} is controlled by this output's trigger {}/{}: adopted by lineage",
            c["kind"].as_str().unwrap_or_default(),
            c["name"].as_str().unwrap_or_default()
        )),
        Some(c) => Err(format!(
            "{id} exists without the {MANAGED_BY_LABEL}=rbac-rules label and is controlled by {} {} (uid {}); it is left alone",
            c["kind"].as_str().unwrap_or_default(),
            c["name"].as_str().unwrap_or_default(),
            c["uid"].as_str().unwrap_or_default()
        )),
        None if adopt_existing => Ok(format!(
            "{id} existed without a controller: adopted (--adopt-existing)"
        )),
        None => {
            let by = existing["metadata"]["labels"][MANAGED_BY_LABEL]
                .as_str()
                .map(|m| format!(" (it is managed by {m:?})"))
                .unwrap_or_default();
            Err(format!(
                "{id} exists without the {MANAGED_BY_LABEL}=rbac-rules label{by}; it is left alone (run with --adopt-existing to take it over)"
            ))
        }
    }
}

/// Applies `a`; on success `learned` holds the object the server returned.
/// `force` when the object is ours (or being adopted): our field manager
/// takes any field another manager set on it (drift repair).
async fn send_apply(
    api: &Api<Wire>,
    metrics: &Metrics,
    a: &Apply,
    force: bool,
    learned: &mut Option<Live>,
) -> Result<(), Error> {
    let params = PatchParams::apply(FIELD_MANAGER);
    let params = if force { params.force() } else { params };
    metrics.write(a.id.kind.as_str(), "apply");
    let sent = if a.marked() {
        api.patch(&a.id.name, &params, &Patch::Apply(&a.body()))
            .await
    } else {
        // The manifest serializes itself (the same bytes as its JSON
        // value): no tree of the body is held while the write is in flight.
        api.patch(&a.id.name, &params, &Patch::Apply(&a.object))
            .await
    };
    sent.map(|o| {
        let mut live = o.into_live(&api_resource(a.id.kind));
        live.settle(&a.object, &a.body());
        *learned = Some(live);
    })
    .map_err(|source| Error::Api {
        action: "apply",
        object: a.id.to_string(),
        source,
    })
}

async fn delete_one(
    client: &Client,
    metrics: &Metrics,
    id: &ObjectId,
    uid: Option<String>,
    resource_version: Option<String>,
) -> Result<(), Error> {
    let api = api_for(client, id);
    let params = DeleteParams {
        preconditions: (uid.is_some() || resource_version.is_some()).then_some(Preconditions {
            uid,
            resource_version,
        }),
        ..DeleteParams::default()
    };
    metrics.write(id.kind.as_str(), "delete");
    api.delete(&id.name, &params)
        .await
        .map(|_| ())
        .map_err(|source| Error::Api {
            action: "delete",
            object: id.to_string(),
            source,
        })
}
