//! An in-process, counting stand-in for the Kubernetes API server: just
//! what `rbac-rules run` sends, served as a [`tower::Service`] for
//! `kube::Client::new(service, "default")`.
//!
//! Serves discovery for its kinds ([`BASE_RESOURCES`] and those given to
//! [`FakeApi::new`]), lists and
//! watches (from a resourceVersion, with label and `metadata.name` field
//! selectors, full or metadata-only by the `Accept` header), GET,
//! server-side apply PATCH (stores the applied object with a
//! `managedFields` entry for its field manager, bumps the resourceVersion
//! only on change and tells the watches), DELETE, RbacRule status patches
//! and Events. Every request is counted by verb and kind.
//!
//! Not a Kubernetes clone: no validation, no defaulting, no merging of
//! several field managers (an apply replaces the object), no aggregation
//! controller, no consistent snapshot across the pages of a list (a watch
//! from the first page's version replays what changed meanwhile).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::synth::Names;

/// Errors of response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of every response.
pub type RespBody = BoxBody<Bytes, BoxError>;

/// One kind the stand-in serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resource {
    /// API group ("" for core).
    pub group: &'static str,
    /// Version.
    pub version: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Plural, as in the path.
    pub plural: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

const fn res(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
) -> Resource {
    Resource {
        group,
        version,
        kind,
        plural,
        namespaced,
    }
}

/// Kinds always served: core kinds rules read, the RBAC kinds, RbacRule,
/// Events and Leases.
pub const BASE_RESOURCES: &[Resource] = &[
    res("", "v1", "Namespace", "namespaces", false),
    res("apps", "v1", "Deployment", "deployments", true),
    res(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
    ),
    res(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        false,
    ),
    res(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        false,
    ),
    res("rbac.authorization.k8s.io", "v1", "Role", "roles", true),
    res(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        true,
    ),
    res("rbacrules.io", "v1alpha1", "RbacRule", "rbacrules", false),
    // Tenant rules: none in the benchmarks, but the controller watches them.
    res(
        "rbacrules.io",
        "v1alpha1",
        "NamespacedRbacRule",
        "namespacedrbacrules",
        true,
    ),
    res("events.k8s.io", "v1", "Event", "events", true),
    res("coordination.k8s.io", "v1", "Lease", "leases", true),
];

/// The API group of RBAC objects, whose writes are the ones that count.
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// The RBAC kinds.
const RBAC_KINDS: [&str; 4] = ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"];

/// The generated control plane's own kinds (packages, their revisions and
/// XRDs).
pub fn resources_of(names: &'static Names) -> Vec<Resource> {
    [
        (
            &names.revision.api_version,
            &names.revision.kind,
            &names.revision.plural,
        ),
        (
            &names.definition.api_version,
            &names.definition.kind,
            &names.definition.plural,
        ),
        (
            &names.package.api_version,
            &names.package.kind,
            &names.package.plural,
        ),
    ]
    .into_iter()
    .map(|(api_version, kind, plural)| {
        let (group, version) = split_api_version(api_version);
        res(group, version, kind, plural, false)
    })
    .collect()
}

/// Requests counted by the stand-in.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    /// Server-side applies, by kind.
    pub applies: BTreeMap<String, u64>,
    /// Deletes, by kind.
    pub deletes: BTreeMap<String, u64>,
    /// GETs of one object, by kind.
    pub gets: BTreeMap<String, u64>,
    /// List requests (pages), by kind.
    pub lists: BTreeMap<String, u64>,
    /// Watches opened, by kind.
    pub watches: BTreeMap<String, u64>,
    /// Status patches of RbacRules.
    pub status_patches: u64,
    /// Events written (POST or PATCH).
    pub events: u64,
    /// Requests the stand-in does not serve.
    pub unserved: u64,
}

impl Counts {
    /// Applies and deletes of RBAC objects: the writes the issue counts.
    pub fn rbac_writes(&self) -> u64 {
        let rbac = |m: &BTreeMap<String, u64>| -> u64 {
            m.iter()
                .filter(|(k, _)| RBAC_KINDS.contains(&k.as_str()))
                .map(|(_, n)| n)
                .sum()
        };
        rbac(&self.applies) + rbac(&self.deletes)
    }
}

/// An open watch.
struct Watch {
    res: Resource,
    selector: Selector,
    metadata_only: bool,
    tx: mpsc::UnboundedSender<Bytes>,
}

/// One stored change, for watches that start from an older version.
struct Change {
    rv: u64,
    res: Resource,
    kind: &'static str,
    object: Arc<Value>,
}

/// Objects of one kind by (namespace, name).
type Objects = BTreeMap<(String, String), Arc<Value>>;

#[derive(Default)]
struct State {
    rv: u64,
    /// By (group, plural).
    objects: BTreeMap<(&'static str, &'static str), Objects>,
    log: Vec<Change>,
    watches: Vec<Watch>,
    /// Watches from this resourceVersion or older are refused as expired.
    expired_up_to: u64,
    counts: Counts,
}

/// The stand-in. Clones share one state.
#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    resources: Arc<Vec<Resource>>,
}

impl FakeApi {
    /// An empty API server of [`BASE_RESOURCES`] and `extra` kinds.
    pub fn new(extra: Vec<Resource>) -> Self {
        let mut resources = BASE_RESOURCES.to_vec();
        resources.extend(extra);
        FakeApi {
            state: Arc::default(),
            resources: Arc::new(resources),
        }
    }

    /// The kind of a plural.
    fn resource(&self, plural: &str) -> Option<Resource> {
        self.resources.iter().find(|r| r.plural == plural).copied()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the state half-written: every
        // mutation below completes under the lock.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates or replaces an object as another client would (not
    /// counted): a new resourceVersion, a uid when it has none, an event
    /// for the watches. Objects of kinds not served are refused.
    pub fn put(&self, object: Value) -> Result<(), String> {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let (group, _) = split_api_version(api_version);
        let res = self
            .resources
            .iter()
            .find(|r| r.group == group && r.kind == kind)
            .ok_or_else(|| format!("the stand-in does not serve {kind} of {api_version:?}"))?;
        let name = object["metadata"]["name"]
            .as_str()
            .ok_or("object has no metadata.name")?
            .to_string();
        let ns = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut state = self.lock();
        state.store(*res, ns, name, object);
        Ok(())
    }

    /// Removes an object as another client would (not counted).
    pub fn remove(&self, plural: &str, namespace: &str, name: &str) -> bool {
        let Some(res) = self.resource(plural) else {
            return false;
        };
        self.lock()
            .delete(res, namespace.to_string(), name.to_string())
            .is_some()
    }

    /// One object.
    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let res = self.resource(plural)?;
        self.lock()
            .objects
            .get(&(res.group, res.plural))?
            .get(&(namespace.to_string(), name.to_string()))
            .map(|o| (**o).clone())
    }

    /// How many objects of a plural are stored.
    pub fn len(&self, plural: &str) -> usize {
        let Some(res) = self.resource(plural) else {
            return 0;
        };
        self.lock()
            .objects
            .get(&(res.group, res.plural))
            .map_or(0, BTreeMap::len)
    }

    /// Whether no object of a plural is stored.
    pub fn is_empty(&self, plural: &str) -> bool {
        self.len(plural) == 0
    }

    /// Every stored RBAC object carrying a label `key=value`.
    pub fn rbac_objects_labelled(&self, key: &str, value: &str) -> usize {
        let state = self.lock();
        state
            .objects
            .iter()
            .filter(|((g, _), _)| *g == RBAC_GROUP)
            .flat_map(|(_, m)| m.values())
            .filter(|o| o["metadata"]["labels"][key].as_str() == Some(value))
            .count()
    }

    /// The counts so far.
    pub fn counts(&self) -> Counts {
        self.lock().counts.clone()
    }

    /// Ends every open watch (the API server's watch timeout, or a restart
    /// of it): clients watch again from their last resourceVersion.
    pub fn close_watches(&self) {
        self.lock().watches.clear();
    }

    /// Ends every open watch and refuses to resume any from a version
    /// before now ("410 Gone: too old resource version", as after etcd
    /// compaction): clients list every kind again.
    pub fn expire_watches(&self) {
        let mut state = self.lock();
        state.watches.clear();
        state.expired_up_to = state.rv;
        // Lists from now on return a newer version, which watches may use.
        state.rv += 1;
    }

    /// Answers one request.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<RespBody>
    where
        B: http_body::Body<Data = Bytes>,
    {
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let query = parse_query(req.uri().query().unwrap_or_default());
        let metadata_only = req
            .headers()
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("as=PartialObjectMetadata"));
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return status(400, "BadRequest", "unreadable body"),
        };
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", &format!("body: {e}")),
            }
        };
        if method == http::Method::GET
            && let Some(resp) = discovery(&path, &self.resources)
        {
            return resp;
        }
        let Some(target) = Target::parse(&path, &self.resources) else {
            self.lock().counts.unserved += 1;
            return status(404, "NotFound", &format!("{path} is not served"));
        };
        let kind = target.res.kind.to_string();
        let mut state = self.lock();
        match (method.as_str(), &target.name) {
            ("GET", None) if query.get("watch").is_some_and(|w| w == "true" || w == "1") => {
                *state.counts.watches.entry(kind).or_default() += 1;
                let from = query
                    .get("resourceVersion")
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(state.rv);
                let selector = Selector::parse(&query);
                let (tx, rx) = mpsc::unbounded_channel();
                if from <= state.expired_up_to {
                    let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                        "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
                        "message": format!("too old resource version: {from} ({})", state.expired_up_to + 1)}});
                    let mut line = serde_json::to_vec(&gone).unwrap_or_default();
                    line.push(b'\n');
                    let _ = tx.send(Bytes::from(line));
                    // The sender drops here: the stream ends after the error.
                    return streaming(rx);
                }
                for c in state
                    .log
                    .iter()
                    .filter(|c| c.rv > from && c.res == target.res)
                {
                    if selector.matches(&c.object) {
                        let _ = tx.send(event_line(c.kind, &c.object, metadata_only));
                    }
                }
                state.watches.push(Watch {
                    res: target.res,
                    selector,
                    metadata_only,
                    tx,
                });
                streaming(rx)
            }
            ("GET", None) => {
                *state.counts.lists.entry(kind).or_default() += 1;
                let selector = Selector::parse(&query);
                // Pages of `limit` items; the continue token holds the first
                // page's version (which every page reports, so that a watch
                // from it replays what changed meanwhile) and an offset.
                let (rv, offset) = query
                    .get("continue")
                    .and_then(|c| c.split_once('/'))
                    .and_then(|(r, o)| Some((r.parse().ok()?, o.parse().ok()?)))
                    .unwrap_or((state.rv, 0usize));
                let limit = query
                    .get("limit")
                    .and_then(|l| l.parse::<usize>().ok())
                    .filter(|l| *l > 0)
                    .unwrap_or(usize::MAX);
                let mut matching = state
                    .objects
                    .get(&(target.res.group, target.res.plural))
                    .into_iter()
                    .flat_map(|m| m.iter())
                    .filter(|((ns, _), _)| target.namespace.as_ref().is_none_or(|t| t == ns))
                    .filter(|(_, o)| selector.matches(o))
                    .skip(offset);
                let items: Vec<Value> = matching
                    .by_ref()
                    .take(limit)
                    .map(|(_, o)| {
                        if metadata_only {
                            partial(o)
                        } else {
                            (**o).clone()
                        }
                    })
                    .collect();
                let more = matching.next().is_some();
                let (api_version, list_kind) = if metadata_only {
                    (
                        "meta.k8s.io/v1".to_string(),
                        "PartialObjectMetadataList".to_string(),
                    )
                } else {
                    (api_version(&target.res), format!("{}List", target.res.kind))
                };
                let mut meta = json!({"resourceVersion": rv.to_string()});
                if more {
                    meta["continue"] = json!(format!("{rv}/{}", offset + items.len()));
                }
                ok(&json!({"apiVersion": api_version, "kind": list_kind,
                    "metadata": meta, "items": items}))
            }
            ("GET", Some(name)) => {
                *state.counts.gets.entry(kind).or_default() += 1;
                match state.find(&target, name) {
                    Some(o) => ok(&o),
                    None => not_found(&target, name),
                }
            }
            ("PATCH", Some(name)) if target.subresource.as_deref() == Some("status") => {
                state.counts.status_patches += 1;
                let Some(mut o) = state.find(&target, name) else {
                    return not_found(&target, name);
                };
                o["status"] = body["status"].clone();
                let ns = target.namespace.clone().unwrap_or_default();
                let stored = state.store(target.res, ns, name.clone(), o);
                ok(&stored)
            }
            ("POST" | "PATCH", _) if target.res.kind == "Event" => {
                state.counts.events += 1;
                ok(&body)
            }
            ("PATCH", Some(name)) => {
                *state.counts.applies.entry(kind).or_default() += 1;
                let manager = query.get("fieldManager").cloned().unwrap_or_default();
                let ns = target.namespace.clone().unwrap_or_default();
                let mut o = body;
                o["metadata"]["managedFields"] = managed_fields(&o, &manager);
                let stored = state.store(target.res, ns, name.clone(), o);
                ok(&stored)
            }
            ("DELETE", Some(name)) => {
                *state.counts.deletes.entry(kind).or_default() += 1;
                let ns = target.namespace.clone().unwrap_or_default();
                match state.delete(target.res, ns, name.clone()) {
                    Some(o) => ok(&o),
                    None => not_found(&target, name),
                }
            }
            _ => {
                state.counts.unserved += 1;
                status(
                    405,
                    "MethodNotAllowed",
                    &format!("{method} {path} is not served"),
                )
            }
        }
    }
}

impl State {
    fn find(&self, t: &Target, name: &str) -> Option<Value> {
        self.objects
            .get(&(t.res.group, t.res.plural))?
            .get(&(t.namespace.clone().unwrap_or_default(), name.to_string()))
            .map(|o| (**o).clone())
    }

    /// Stores an object: keeps uid and creationTimestamp of the stored one;
    /// a new resourceVersion and a watch event only when it changed.
    fn store(&mut self, res: Resource, ns: String, name: String, mut o: Value) -> Value {
        let key = (ns.clone(), name.clone());
        let old = self
            .objects
            .get(&(res.group, res.plural))
            .and_then(|m| m.get(&key))
            .cloned();
        if let Some(m) = o.as_object_mut() {
            m.insert("apiVersion".into(), json!(api_version(&res)));
            m.insert("kind".into(), json!(res.kind));
        }
        let meta = &mut o["metadata"];
        meta["name"] = json!(name);
        if res.namespaced {
            meta["namespace"] = json!(ns);
        }
        let keep = |f: &str, default: Value| {
            old.as_ref()
                .map(|o| o["metadata"][f].clone())
                .filter(|v| !v.is_null())
                .unwrap_or(default)
        };
        if meta["uid"].is_null() {
            meta["uid"] = keep("uid", json!(format!("uid-{}-{ns}-{name}", res.plural)));
        }
        meta["creationTimestamp"] = keep("creationTimestamp", json!("2026-01-01T00:00:00Z"));
        if let Some(old) = &old {
            meta["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
            if **old == o {
                return o;
            }
        }
        self.rv += 1;
        o["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let o = Arc::new(o);
        self.objects
            .entry((res.group, res.plural))
            .or_default()
            .insert(key, o.clone());
        let kind = if old.is_some() { "MODIFIED" } else { "ADDED" };
        self.tell(res, kind, o.clone());
        Arc::unwrap_or_clone(o)
    }

    fn delete(&mut self, res: Resource, ns: String, name: String) -> Option<Value> {
        let o = self
            .objects
            .get_mut(&(res.group, res.plural))?
            .remove(&(ns, name))?;
        self.rv += 1;
        let mut gone = (*o).clone();
        gone["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let gone = Arc::new(gone);
        self.tell(res, "DELETED", gone.clone());
        Some(Arc::unwrap_or_clone(gone))
    }

    /// Logs a change and sends it to the matching watches (dropping closed
    /// ones).
    fn tell(&mut self, res: Resource, kind: &'static str, object: Arc<Value>) {
        self.watches.retain(|w| {
            if w.res != res || !w.selector.matches(&object) {
                return !w.tx.is_closed();
            }
            w.tx.send(event_line(kind, &object, w.metadata_only))
                .is_ok()
        });
        self.log.push(Change {
            rv: self.rv,
            res,
            kind,
            object,
        });
    }
}

/// What a request path names.
struct Target {
    res: Resource,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl Target {
    fn parse(path: &str, resources: &[Resource]) -> Option<Target> {
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match segs.as_slice() {
            ["api", v, rest @ ..] => ("", *v, rest),
            ["apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => return None,
        };
        let find = |plural: &str| {
            resources
                .iter()
                .find(|r| r.group == group && r.version == version && r.plural == plural)
                .copied()
        };
        let owned = |s: &[&str], i: usize| s.get(i).map(|x| x.to_string());
        match rest {
            ["namespaces", ns, plural, more @ ..] if find(plural).is_some_and(|r| r.namespaced) => {
                Some(Target {
                    res: find(plural)?,
                    namespace: Some(ns.to_string()),
                    name: owned(more, 0),
                    subresource: owned(more, 1),
                })
            }
            [plural, more @ ..] => Some(Target {
                res: find(plural)?,
                namespace: None,
                name: owned(more, 0),
                subresource: owned(more, 1),
            }),
            _ => None,
        }
    }
}

/// A label selector (`k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated)
/// and a `metadata.name=` field selector.
#[derive(Default)]
struct Selector {
    labels: Vec<(String, Option<String>, bool)>,
    name: Option<String>,
}

impl Selector {
    fn parse(query: &BTreeMap<String, String>) -> Selector {
        let mut s = Selector::default();
        for term in query
            .get("labelSelector")
            .into_iter()
            .flat_map(|l| l.split(','))
            .filter(|t| !t.is_empty())
        {
            let parsed = if let Some((k, v)) = term.split_once("!=") {
                (k.to_string(), Some(v.to_string()), false)
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (k.to_string(), Some(v.to_string()), true)
            } else if let Some(k) = term.strip_prefix('!') {
                (k.to_string(), None, false)
            } else {
                (term.to_string(), None, true)
            };
            s.labels.push(parsed);
        }
        s.name = query
            .get("fieldSelector")
            .and_then(|f| f.strip_prefix("metadata.name="))
            .map(str::to_string);
        s
    }

    fn matches(&self, o: &Value) -> bool {
        let labels = &o["metadata"]["labels"];
        self.labels.iter().all(|(k, v, positive)| {
            let have = labels[k.as_str()].as_str();
            let hit = match v {
                Some(v) => have == Some(v.as_str()),
                None => have.is_some(),
            };
            hit == *positive
        }) && self
            .name
            .as_ref()
            .is_none_or(|n| o["metadata"]["name"].as_str() == Some(n.as_str()))
    }
}

/// A `managedFields` entry saying the manager applied every field the
/// object has (the field set of a server-side apply).
fn managed_fields(o: &Value, manager: &str) -> Value {
    let keys = |v: &Value| -> serde_json::Map<String, Value> {
        v.as_object()
            .into_iter()
            .flat_map(|m| m.keys())
            .map(|k| (format!("f:{k}"), json!({})))
            .collect()
    };
    let meta = &o["metadata"];
    let mut fields_meta = serde_json::Map::new();
    fields_meta.insert("f:labels".into(), Value::Object(keys(&meta["labels"])));
    fields_meta.insert(
        "f:annotations".into(),
        Value::Object(keys(&meta["annotations"])),
    );
    let owners: serde_json::Map<String, Value> = meta["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["uid"].as_str())
        .map(|uid| (format!("k:{}", json!({"uid": uid})), json!({})))
        .collect();
    fields_meta.insert("f:ownerReferences".into(), Value::Object(owners));
    let mut fields: serde_json::Map<String, Value> = o
        .as_object()
        .into_iter()
        .flat_map(|m| m.keys())
        .filter(|k| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
        .map(|k| (format!("f:{k}"), json!({})))
        .collect();
    fields.insert("f:metadata".into(), Value::Object(fields_meta));
    json!([{"manager": manager, "operation": "Apply", "apiVersion": o["apiVersion"],
        "fieldsType": "FieldsV1", "fieldsV1": fields}])
}

/// Discovery documents: `/api`, `/api/v1`, `/apis`, `/apis/<group>/<version>`.
fn discovery(path: &str, served: &[Resource]) -> Option<Response<RespBody>> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let resources = |group: &str, version: &str| -> Vec<Value> {
        served
            .iter()
            .filter(|r| r.group == group && r.version == version)
            .map(|r| {
                json!({"name": r.plural, "singularName": r.kind.to_lowercase(),
                "namespaced": r.namespaced, "kind": r.kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]})
            })
            .collect()
    };
    let body = match segs.as_slice() {
        ["api"] => {
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        }
        ["api", "v1"] => json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": "v1", "resources": resources("", "v1")}),
        ["apis"] => {
            let mut groups: BTreeMap<&str, &str> = BTreeMap::new();
            for r in served.iter().filter(|r| !r.group.is_empty()) {
                groups.insert(r.group, r.version);
            }
            let groups: Vec<Value> = groups
                .iter()
                .map(|(g, v)| {
                    let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
                    json!({"name": g, "versions": [gv], "preferredVersion": gv})
                })
                .collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        }
        ["apis", g, v] => json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": format!("{g}/{v}"), "resources": resources(g, v)}),
        _ => return None,
    };
    Some(ok(&body))
}

fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}

fn api_version(r: &Resource) -> String {
    if r.group.is_empty() {
        r.version.to_string()
    } else {
        format!("{}/{}", r.group, r.version)
    }
}

/// An object as PartialObjectMetadata.
fn partial(o: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": o["metadata"]})
}

/// A watch event as the API server writes it: `type` before `object` (a
/// JSON map would sort `object` first).
fn event_line(kind: &str, o: &Value, metadata_only: bool) -> Bytes {
    let object = if metadata_only { partial(o) } else { o.clone() };
    let mut line = format!(r#"{{"type":{}, "object":"#, json!(kind)).into_bytes();
    line.extend(serde_json::to_vec(&object).unwrap_or_default());
    line.extend(b"}\n");
    Bytes::from(line)
}

fn parse_query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

/// Percent-decoding of a query component (`+` is a space).
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn ok(v: &Value) -> Response<RespBody> {
    respond(200, v)
}

fn respond(code: u16, v: &Value) -> Response<RespBody> {
    let bytes = Bytes::from(serde_json::to_vec(v).unwrap_or_default());
    let mut r = Response::new(Full::new(bytes).map_err(|never| match never {}).boxed());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn status(code: u16, reason: &str, message: &str) -> Response<RespBody> {
    respond(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "reason": reason, "message": message, "code": code}),
    )
}

fn not_found(t: &Target, name: &str) -> Response<RespBody> {
    status(
        404,
        "NotFound",
        &format!("{}.{} {name:?} not found", t.res.plural, t.res.group),
    )
}

/// A watch response: one JSON line per event, open until the stand-in
/// drops the sender.
fn streaming(rx: mpsc::UnboundedReceiver<Bytes>) -> Response<RespBody> {
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, BoxError>(http_body::Frame::data(b)), rx))
    });
    let mut r = Response::new(StreamBody::new(frames).boxed());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

impl<B> tower::Service<Request<B>> for FakeApi
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<RespBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(req).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_kinds_namespaces_and_subresources() {
        let t = Target::parse(
            "/apis/rbac.authorization.k8s.io/v1/namespaces/a/roles/r",
            BASE_RESOURCES,
        )
        .expect("role");
        assert_eq!(
            (t.res.kind, t.namespace.as_deref(), t.name.as_deref()),
            ("Role", Some("a"), Some("r"))
        );
        let t = Target::parse("/api/v1/namespaces/team-1", BASE_RESOURCES).expect("namespace");
        assert_eq!(
            (t.res.kind, t.namespace, t.name.as_deref()),
            ("Namespace", None, Some("team-1"))
        );
        let t = Target::parse(
            "/apis/rbacrules.io/v1alpha1/rbacrules/x/status",
            BASE_RESOURCES,
        )
        .expect("status");
        assert_eq!(t.subresource.as_deref(), Some("status"));
        assert!(Target::parse("/apis/nope.io/v1/things", BASE_RESOURCES).is_none());
    }

    #[test]
    fn selectors_decode_and_match() {
        let q = parse_query("labelSelector=app.kubernetes.io%2Fmanaged-by%3Drbac-rules&watch=1");
        let s = Selector::parse(&q);
        let labelled = json!({"metadata": {"name": "a", "labels": {"app.kubernetes.io/managed-by": "rbac-rules"}}});
        assert!(s.matches(&labelled));
        assert!(!s.matches(&json!({"metadata": {"name": "a"}})));
    }

    /// The JSON body of the stand-in's answer.
    async fn answer(api: &FakeApi, req: Request<Full<Bytes>>) -> Value {
        let body = api.handle(req).await.into_body().collect().await;
        serde_json::from_slice(&body.expect("body").to_bytes()).expect("json")
    }

    #[tokio::test]
    async fn an_unchanged_apply_keeps_the_version_and_tells_no_watch() {
        let api = FakeApi::new(Vec::new());
        let cr = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "x"}, "rules": []});
        let patch = |body: &Value| {
            Request::patch(
                "/apis/rbac.authorization.k8s.io/v1/clusterroles/x?fieldManager=m&force=true",
            )
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("request")
        };
        let first = answer(&api, patch(&cr)).await;
        let second = answer(&api, patch(&cr)).await;
        assert_eq!(
            first["metadata"]["resourceVersion"],
            second["metadata"]["resourceVersion"]
        );
        assert_eq!(first["metadata"]["managedFields"][0]["manager"], "m");
        assert_eq!(api.counts().rbac_writes(), 2);
        assert_eq!(api.lock().log.len(), 1);
    }

    #[tokio::test]
    async fn lists_come_in_pages_of_the_limit() {
        let api = FakeApi::new(Vec::new());
        for n in ["a", "b", "c"] {
            api.put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}))
                .expect("put");
        }
        let list = |uri: String| {
            let api = api.clone();
            async move {
                let req = Request::get(uri)
                    .body(Full::new(Bytes::new()))
                    .expect("request");
                answer(&api, req).await
            }
        };
        let first = list("/api/v1/namespaces?limit=2".into()).await;
        assert_eq!(first["items"].as_array().map(Vec::len), Some(2));
        let token = first["metadata"]["continue"]
            .as_str()
            .expect("continue")
            .to_string();
        let second = list(format!("/api/v1/namespaces?limit=2&continue={token}")).await;
        assert_eq!(second["items"][0]["metadata"]["name"], "c");
        assert!(second["metadata"].get("continue").is_none());
        assert_eq!(
            first["metadata"]["resourceVersion"],
            second["metadata"]["resourceVersion"]
        );
    }

    /// The first line a watch streams.
    async fn first_event(api: &FakeApi, uri: &str) -> Value {
        let req = Request::get(uri)
            .body(Full::new(Bytes::new()))
            .expect("request");
        let mut body = api.handle(req).await.into_body();
        let frame = body.frame().await.expect("a frame").expect("data");
        let data = frame.into_data().expect("data frame");
        serde_json::from_slice(&data).expect("json line")
    }

    #[tokio::test]
    async fn watches_replay_from_their_version_until_expired() {
        let api = FakeApi::new(Vec::new());
        let ns = |name: &str| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        api.put(ns("a")).expect("put");
        api.put(ns("b")).expect("put");
        // From version 1 (after "a"): "b" is replayed.
        let uri = "/api/v1/namespaces?watch=true&resourceVersion=1";
        let ev = first_event(&api, uri).await;
        assert_eq!(ev["type"], "ADDED");
        assert_eq!(ev["object"]["metadata"]["name"], "b");
        api.expire_watches();
        let ev = first_event(&api, uri).await;
        assert_eq!(
            (&ev["type"], &ev["object"]["code"]),
            (&json!("ERROR"), &json!(410))
        );
    }
}
