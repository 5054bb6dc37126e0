//! A stand-in API server that keeps state, for tests of the whole control
//! loop: it serves discovery, lists and watches (with resourceVersions and
//! replay from a watch's resourceVersion), server-side applies, deletes,
//! status patches and Events for RbacRules, Namespaces (metadata only) and
//! the four RBAC kinds. Every request is logged; a test can hold applies,
//! add Namespaces while the controller runs, and close (expire) watches.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

/// The error type of response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type of the stand-ins' responses.
pub type RespBody = BoxBody<Bytes, BoxError>;

/// Path of the RbacRule collection.
pub const RULES: &str = "/apis/rbacrules.io/v1alpha1/rbacrules";
/// Path of the NamespacedRbacRule collection (every namespace).
pub const TENANT_RULES: &str = "/apis/rbacrules.io/v1alpha1/namespacedrbacrules";
/// Path of the Namespace collection.
pub const NAMESPACES: &str = "/api/v1/namespaces";
/// Prefix of the RBAC API.
pub const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";

/// The collection (`RBAC/roles`) and the id of one RBAC object path
/// (`RBAC/namespaces/a/roles/x` or `RBAC/clusterroles/x`).
fn rbac_object(path: &str) -> Option<(String, String)> {
    let rest = path.strip_prefix(RBAC)?.strip_prefix('/')?;
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        ["namespaces", _, plural, _] | [plural, _] => {
            Some((format!("{RBAC}/{plural}"), path.to_string()))
        }
        _ => None,
    }
}

struct Watcher {
    tx: mpsc::UnboundedSender<Bytes>,
}

#[derive(Default)]
struct State {
    rv: u64,
    rules: Vec<Value>,
    /// Namespaces as PartialObjectMetadata, by name.
    namespaces: BTreeMap<String, Value>,
    /// RBAC objects by object path.
    rbac: BTreeMap<String, Value>,
    /// Every change: (resourceVersion, collection, watch event line).
    history: Vec<(u64, String, Bytes)>,
    /// Open watches by collection.
    watchers: BTreeMap<String, Vec<Watcher>>,
    /// "METHOD path" of every request ("WATCH path" for watches).
    log: Vec<String>,
    /// Applies answered so far.
    applies: usize,
    /// Applies received and not yet answered, and the most at once.
    in_flight: usize,
    max_in_flight: usize,
}

impl State {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Records a change and sends it to the collection's open watches.
    fn publish(&mut self, collection: &str, kind: &str, object: &Value) {
        let rv = object["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(self.rv);
        let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).expect("json");
        line.push(b'\n');
        let line = Bytes::from(line);
        self.history
            .push((rv, collection.to_string(), line.clone()));
        if let Some(ws) = self.watchers.get_mut(collection) {
            ws.retain(|w| w.tx.send(line.clone()).is_ok());
        }
    }
}

/// `rbac-rules run` as a task: no leader election, metrics on a free
/// port, a short debounce, plus `flags`.
pub struct Controller {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), rbac_rules::controller::Error>>,
}

impl Controller {
    /// Starts the control loop with `client`.
    pub fn start(client: Client, flags: &[&str]) -> Controller {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            run: rbac_rules::controller::RunArgs,
        }
        let mut argv = vec![
            "rbac-rules",
            "--leader-election=false",
            "--metrics-address=127.0.0.1:0",
            "--debounce-ms=50",
            "--identity=test",
        ];
        argv.extend_from_slice(flags);
        let cli = Cli::parse_from(argv);
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(rbac_rules::controller::run_with(client, cli.run, stop_rx));
        Controller { stop, task }
    }

    /// Asks it to stop and waits until it has, successfully.
    pub async fn stop(self) {
        self.stop.send(true).expect("stop");
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("the controller did not stop")
            .expect("controller task")
            .expect("controller result");
    }
}

/// How the stand-in answers.
#[derive(Clone, Debug, Default)]
pub struct Behaviour {
    /// Each apply is answered after this long (its watch event goes out
    /// first, as a real API server's would).
    pub apply_delay: Duration,
    /// Hold the first apply until [`FakeCluster::release`].
    pub hold_first_apply: bool,
}

/// The stand-in and what it observed.
pub struct FakeCluster {
    state: Arc<Mutex<State>>,
    /// Watch events read by the client, by collection.
    read: Arc<Mutex<BTreeMap<String, Arc<AtomicUsize>>>>,
    held: Arc<Notify>,
    release: Arc<Notify>,
    changed: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

/// A JSON response.
pub fn full(status: u16, v: &Value) -> Response<RespBody> {
    let bytes = Bytes::from(serde_json::to_vec(v).expect("json"));
    Response::builder()
        .status(StatusCode::from_u16(status).expect("status"))
        .header("content-type", "application/json")
        .body(Full::new(bytes).map_err(|never| match never {}).boxed())
        .expect("response")
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
        "code": code, "message": format!("{reason} (stand-in)"), "metadata": {}})
}

fn param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|p| p.strip_prefix(key)?.strip_prefix('='))
}

fn list(kind: &str, rv: u64, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": rv.to_string()},
        "items": items})
}

/// A Namespace as a metadata-only list or watch returns it.
pub fn namespace_meta(name: &str, rv: u64) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": name, "uid": format!("{name}-uid"), "resourceVersion": rv.to_string()}})
}

impl FakeCluster {
    /// A client and the stand-in it talks to, holding `rules` (RbacRule
    /// objects) and Namespaces named `namespaces`.
    pub fn start(rules: Vec<Value>, namespaces: &[String], behaviour: Behaviour) -> (Client, Self) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<RespBody>>();
        let client = Client::new(service, "default");
        let mut state = State {
            rules,
            ..State::default()
        };
        for n in namespaces {
            let rv = state.next_rv();
            state.namespaces.insert(n.clone(), namespace_meta(n, rv));
        }
        let state = Arc::new(Mutex::new(state));
        let read: Arc<Mutex<BTreeMap<String, Arc<AtomicUsize>>>> = Arc::default();
        let held = Arc::new(Notify::new());
        let release = Arc::new(Notify::new());
        let changed = Arc::new(Notify::new());
        let task = {
            let (state, read, held, release, changed) = (
                state.clone(),
                read.clone(),
                held.clone(),
                release.clone(),
                changed.clone(),
            );
            tokio::spawn(async move {
                let mut first = behaviour.hold_first_apply;
                while let Some((req, send)) = handle.next_request().await {
                    let path = req.uri().path().to_string();
                    let query = req.uri().query().unwrap_or_default().to_string();
                    let method = req.method().to_string();
                    if param(&query, "watch") == Some("true") {
                        state
                            .lock()
                            .expect("lock")
                            .log
                            .push(format!("WATCH {path}"));
                        let since: u64 = param(&query, "resourceVersion")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        let counter = read
                            .lock()
                            .expect("lock")
                            .entry(path.clone())
                            .or_default()
                            .clone();
                        let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
                        {
                            // Replay what the watch missed since its list,
                            // then follow: atomically, as etcd does.
                            let mut s = state.lock().expect("lock");
                            for (rv, c, line) in &s.history {
                                if *rv > since && *c == path {
                                    let _ = tx.send(line.clone());
                                }
                            }
                            s.watchers.entry(path).or_default().push(Watcher { tx });
                        }
                        let frames = futures::stream::unfold(
                            (rx, counter, changed.clone()),
                            |(mut rx, counter, changed)| async move {
                                let line = rx.recv().await?;
                                counter.fetch_add(1, Ordering::SeqCst);
                                changed.notify_waiters();
                                Some((Ok::<_, BoxError>(Frame::data(line)), (rx, counter, changed)))
                            },
                        );
                        send.send_response(
                            Response::builder()
                                .status(200)
                                .header("content-type", "application/json")
                                .body(BodyExt::boxed(StreamBody::new(frames)))
                                .expect("response"),
                        );
                        continue;
                    }
                    state
                        .lock()
                        .expect("lock")
                        .log
                        .push(format!("{method} {path}"));
                    let body = req.into_body().collect().await.expect("body").to_bytes();
                    let body: Value = if body.is_empty() {
                        Value::Null
                    } else {
                        serde_json::from_slice(&body).expect("json body")
                    };
                    if method == "PATCH" && rbac_object(&path).is_some() {
                        {
                            let mut s = state.lock().expect("lock");
                            s.in_flight += 1;
                            s.max_in_flight = s.max_in_flight.max(s.in_flight);
                        }
                        let hold = std::mem::take(&mut first);
                        let (state, held, release, changed) = (
                            state.clone(),
                            held.clone(),
                            release.clone(),
                            changed.clone(),
                        );
                        let delay = behaviour.apply_delay;
                        tokio::spawn(async move {
                            if hold {
                                let released = release.notified();
                                held.notify_one();
                                released.await;
                            }
                            tokio::time::sleep(delay).await;
                            let obj = apply(&state, &path, body);
                            send.send_response(full(200, &obj));
                            changed.notify_waiters();
                        });
                        continue;
                    }
                    let response = answer(&state, &method, &path, body);
                    send.send_response(response);
                    changed.notify_waiters();
                }
            })
        };
        (
            client,
            FakeCluster {
                state,
                read,
                held,
                release,
                changed,
                task,
            },
        )
    }

    /// Puts an RBAC object at `path` (`RBAC/namespaces/a/roles/x`) as if
    /// someone had made it, with a fresh resourceVersion and a uid.
    pub fn put_rbac(&self, path: &str, mut object: Value) {
        let (collection, id) = rbac_object(path).expect("RBAC object path");
        let mut s = self.state.lock().expect("lock");
        let rv = s.next_rv();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        object["metadata"]["uid"] = json!(format!("{id}-uid"));
        s.rbac.insert(id, object.clone());
        s.publish(&collection, "ADDED", &object);
    }

    /// The RbacRules as stored (with the statuses the controller wrote).
    pub fn rules(&self) -> Vec<Value> {
        self.state.lock().expect("lock").rules.clone()
    }

    /// Puts an RBAC object at `path` as the controller would have made it
    /// (a server-side apply by its field manager): ours.
    pub fn put_ours(&self, path: &str, mut object: Value) {
        object["metadata"]["managedFields"] = json!([our_apply_entry(&object)]);
        self.put_rbac(path, object);
    }

    /// Sets a Namespace's annotations (before the controller lists it).
    pub fn annotate_namespace(&self, name: &str, annotations: Value) {
        let mut s = self.state.lock().expect("lock");
        let rv = s.next_rv();
        let mut ns = namespace_meta(name, rv);
        ns["metadata"]["annotations"] = annotations;
        s.namespaces.insert(name.to_string(), ns);
    }

    /// Adds a Namespace (its watch event goes to the open watches).
    pub fn add_namespace(&self, name: &str) {
        let mut s = self.state.lock().expect("lock");
        let rv = s.next_rv();
        let ns = namespace_meta(name, rv);
        s.namespaces.insert(name.to_string(), ns.clone());
        s.publish(NAMESPACES, "ADDED", &ns);
    }

    /// Ends every open watch of `collection` with 410 Gone ("too old
    /// resource version"), as an API server does to a watch it dropped:
    /// the client must list again.
    pub fn expire_watches(&self, collection: &str) {
        let mut s = self.state.lock().expect("lock");
        let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
            "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
            "message": "too old resource version: 1 (2)"}});
        let mut line = serde_json::to_vec(&gone).expect("json");
        line.push(b'\n');
        for w in s.watchers.remove(collection).unwrap_or_default() {
            let _ = w.tx.send(Bytes::from(line.clone()));
        }
    }

    /// Waits until the first apply is held (with `hold_first_apply`).
    pub async fn first_apply_held(&self) {
        self.held.notified().await;
    }

    /// Answers the held apply.
    pub fn release(&self) {
        self.release.notify_one();
    }

    /// Watch events of `collection` the client has read.
    pub fn read(&self, collection: &str) -> usize {
        self.read
            .lock()
            .expect("lock")
            .get(collection)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }

    /// Number of open watches of `collection`.
    pub fn watching(&self, collection: &str) -> usize {
        self.state
            .lock()
            .expect("lock")
            .watchers
            .get(collection)
            .map_or(0, |w| w.iter().filter(|w| !w.tx.is_closed()).count())
    }

    /// Every request so far, as "METHOD path" ("WATCH path" for watches,
    /// "ANSWERED PATCH path" when an apply is answered).
    pub fn log(&self) -> Vec<String> {
        self.state.lock().expect("lock").log.clone()
    }

    /// Applies answered so far.
    pub fn applies(&self) -> usize {
        self.state.lock().expect("lock").applies
    }

    /// The most applies in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.state.lock().expect("lock").max_in_flight
    }

    /// The RBAC objects the server holds, by path.
    pub fn rbac(&self) -> BTreeMap<String, Value> {
        self.state.lock().expect("lock").rbac.clone()
    }

    /// Waits, up to `limit`, until `done` holds for the stand-in; panics
    /// with the request log otherwise.
    pub async fn until(&self, limit: Duration, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if done(self) {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() && !done(self) {
                panic!("{what}: not reached; requests: {:#?}", self.log());
            }
        }
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A server-side apply: the body becomes the object (with server fields),
/// and its watch event goes out before the response.
fn apply(state: &Mutex<State>, path: &str, body: Value) -> Value {
    let (collection, _) = rbac_object(path).expect("RBAC path");
    let mut s = state.lock().expect("lock");
    let rv = s.next_rv();
    let existed = s.rbac.get(path).cloned();
    let mut obj = body;
    obj["metadata"]["uid"] = existed
        .as_ref()
        .map(|e| e["metadata"]["uid"].clone())
        .unwrap_or_else(|| json!(format!("{path}-uid")));
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    obj["metadata"]["managedFields"] = json!([our_apply_entry(&obj)]);
    s.rbac.insert(path.to_string(), obj.clone());
    s.applies += 1;
    s.in_flight -= 1;
    s.log.push(format!("ANSWERED PATCH {path}"));
    let kind = if existed.is_some() {
        "MODIFIED"
    } else {
        "ADDED"
    };
    s.publish(&collection, kind, &obj);
    obj
}

/// The `managedFields` entry a server-side apply by the controller leaves:
/// its field manager, `Apply`, and the fields it set (labels, annotations
/// and top-level fields), as the API server records them.
pub fn our_apply_entry(obj: &Value) -> Value {
    let keys = |v: &Value| -> serde_json::Map<String, Value> {
        v.as_object()
            .into_iter()
            .flat_map(|m| m.keys())
            .map(|k| (format!("f:{k}"), json!({})))
            .collect()
    };
    let mut fields = serde_json::Map::new();
    for (k, v) in obj.as_object().into_iter().flatten() {
        if !matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            let sub = if v.is_object() {
                Value::Object(keys(v))
            } else {
                json!({})
            };
            fields.insert(format!("f:{k}"), sub);
        }
    }
    fields.insert(
        "f:metadata".into(),
        json!({"f:labels": keys(&obj["metadata"]["labels"]),
               "f:annotations": keys(&obj["metadata"]["annotations"])}),
    );
    json!({"manager": "rbac-rules", "operation": "Apply", "apiVersion": "rbac.authorization.k8s.io/v1",
           "fieldsType": "FieldsV1", "fieldsV1": fields})
}

fn answer(state: &Mutex<State>, method: &str, path: &str, body: Value) -> Response<RespBody> {
    let mut s = state.lock().expect("lock");
    let rv = s.rv;
    match (method, path) {
        ("GET", "/api") => full(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        ),
        ("GET", "/api/v1") => full(
            200,
            &json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": "namespaces", "singularName": "namespace", "namespaced": false,
                 "kind": "Namespace", "verbs": ["get", "list", "watch"]}]}),
        ),
        ("GET", RULES) => full(200, &list("RbacRuleList", rv, s.rules.clone())),
        // No tenant rules (tests/controller_tenant.rs has them).
        ("GET", TENANT_RULES) => full(200, &list("NamespacedRbacRuleList", rv, Vec::new())),
        ("GET", NAMESPACES) => {
            let items = s.namespaces.values().cloned().collect();
            let mut l = list("PartialObjectMetadataList", rv, items);
            l["apiVersion"] = json!("meta.k8s.io/v1");
            full(200, &l)
        }
        ("PATCH", p) if p.starts_with(RULES) && p.ends_with("/status") => {
            let name = p
                .trim_end_matches("/status")
                .rsplit('/')
                .next()
                .unwrap_or_default();
            let mut found = None;
            for r in &mut s.rules {
                if r["metadata"]["name"] == name {
                    r["status"] = body["status"].clone();
                    found = Some(r.clone());
                }
            }
            match found {
                Some(r) => full(200, &r),
                None => full(404, &status(404, "NotFound")),
            }
        }
        ("POST" | "PATCH", p) if p.contains("/events") => full(201, &body),
        ("GET", p) if p.starts_with(RBAC) => match rbac_object(p) {
            Some((_, id)) => match s.rbac.get(&id) {
                Some(o) => full(200, o),
                None => full(404, &status(404, "NotFound")),
            },
            None => {
                // A collection: every object under it.
                let plural = p.rsplit('/').next().unwrap_or_default().to_string();
                let items = s
                    .rbac
                    .iter()
                    .filter(|(k, _)| {
                        rbac_object(k).is_some_and(|(c, _)| c.ends_with(&format!("/{plural}")))
                    })
                    .map(|(_, v)| v.clone())
                    .collect();
                full(200, &list("List", rv, items))
            }
        },
        ("DELETE", p) if rbac_object(p).is_some() => {
            let (collection, id) = rbac_object(p).expect("RBAC path");
            match s.rbac.remove(&id) {
                Some(mut o) => {
                    let rv = s.next_rv();
                    o["metadata"]["resourceVersion"] = json!(rv.to_string());
                    s.publish(&collection, "DELETED", &o);
                    full(
                        200,
                        &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200, "metadata": {}}),
                    )
                }
                None => full(404, &status(404, "NotFound")),
            }
        }
        (m, p) => panic!("unexpected request {m} {p}"),
    }
}
