//! A write pass never stalls the watches. While the API server holds the
//! controller's first apply, a watch streams more events than any fixed
//! buffer holds; the controller must keep reading the stream (the API
//! server closes a watch whose client stops reading), and after the pass it
//! writes every new object exactly once.
//!
//! The server here streams the watch body chunk by chunk through a channel
//! of one: a push only completes when the controller reads.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod support;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt as _, StreamBody};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use support::cluster::{BoxError, Controller, RespBody, full};
use tokio::sync::{mpsc, oneshot};

/// More than the 1,024 events the controller once buffered.
const EVENTS: usize = 1_500;

fn streaming(rx: mpsc::Receiver<Bytes>) -> Response<RespBody> {
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, BoxError>(Frame::data(b)), rx))
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(http_body_util::BodyExt::boxed(StreamBody::new(frames)))
        .expect("response")
}

fn param<'a>(req: &'a Request<Body>, key: &str) -> Option<&'a str> {
    req.uri()
        .query()?
        .split('&')
        .find_map(|p| p.strip_prefix(key)?.strip_prefix('='))
}

fn ns(name: &str, rv: usize) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": name, "uid": format!("{name}-uid"), "resourceVersion": rv.to_string()}})
}

#[tokio::test]
async fn watches_are_drained_while_a_write_is_held() {
    let spec = json!({
        "trigger": {"kind": "Namespace", "metadataOnly": true},
        "outputs": [{"kind": "Role", "name": "viewer",
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}]
    });
    let rule = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
        "metadata": {"name": "ns-viewer", "uid": "ns-viewer-uid", "generation": 1, "resourceVersion": "3"},
        "spec": spec});
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<RespBody>>();
    let client = Client::new(service, "default");
    let roles: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let server = {
        let roles = roles.clone();
        tokio::spawn(async move {
            let mut parked = Vec::new();
            let mut streamed = false;
            // Fires once every event has been read by the controller.
            let (drained_tx, drained_rx) = oneshot::channel::<()>();
            let mut drained_tx = Some(drained_tx);
            let mut drained_rx = Some(drained_rx);
            // Fires when the first write arrives: the stream starts then, so
            // every event comes while that write is in flight.
            let (held_tx, held_rx) = oneshot::channel::<()>();
            let mut held_tx = Some(held_tx);
            let mut held_rx = Some(held_rx);
            let list = |kind: &str, items: Vec<Value>| {
                json!({"apiVersion": "v1", "kind": kind,
                "metadata": {"resourceVersion": "10"}, "items": items})
            };
            while let Some((req, send)) = handle.next_request().await {
                let path = req.uri().path().to_string();
                let method = req.method().to_string();
                if param(&req, "watch") == Some("true") {
                    if path == "/api/v1/namespaces" && !streamed {
                        streamed = true;
                        let (tx, rx) = mpsc::channel::<Bytes>(1);
                        send.send_response(streaming(rx));
                        let done = drained_tx.take();
                        let held = held_rx.take();
                        tokio::spawn(async move {
                            if let Some(held) = held {
                                let _ = held.await;
                            }
                            for i in 0..EVENTS {
                                let line = json!({"type": "ADDED", "object": ns(&format!("team-{i:04}"), 100 + i)});
                                let mut bytes = serde_json::to_vec(&line).expect("json");
                                bytes.push(b'\n');
                                if tx.send(Bytes::from(bytes)).await.is_err() {
                                    return;
                                }
                            }
                            if let Some(d) = done {
                                let _ = d.send(());
                            }
                            // Keep the watch open.
                            std::future::pending::<()>().await;
                        });
                    } else {
                        parked.push(send);
                    }
                    continue;
                }
                let body = req.into_body().collect().await.expect("body").to_bytes();
                let body: Value = if body.is_empty() {
                    Value::Null
                } else {
                    serde_json::from_slice(&body).expect("json body")
                };
                match (method.as_str(), path.as_str()) {
                    ("GET", "/apis/rbacrules.io/v1alpha1/rbacrules") => {
                        send.send_response(full(200, &list("RbacRuleList", vec![rule.clone()])))
                    }
                    // No tenant rules.
                    ("GET", "/apis/rbacrules.io/v1alpha1/namespacedrbacrules") => {
                        send.send_response(full(200, &list("NamespacedRbacRuleList", vec![])))
                    }
                    ("GET", "/api") => send.send_response(full(
                        200,
                        &json!({"kind": "APIVersions",
                        "versions": ["v1"], "serverAddressByClientCIDRs": []}),
                    )),
                    ("GET", "/api/v1") => send.send_response(full(
                        200,
                        &json!({"kind": "APIResourceList",
                        "groupVersion": "v1", "resources": [{"name": "namespaces",
                        "singularName": "namespace", "namespaced": false, "kind": "Namespace",
                        "verbs": ["get", "list", "watch"]}]}),
                    )),
                    ("GET", "/api/v1/namespaces") => send.send_response(full(
                        200,
                        &json!({
                        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                        "metadata": {"resourceVersion": "10"}, "items": [ns("team-a", 5)]}),
                    )),
                    ("GET", p) if p.contains("/namespaces/") => send.send_response(full(
                        404,
                        &json!({
                        "kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": 404, "message": "not found", "metadata": {}}),
                    )),
                    ("GET", p) if p.starts_with("/apis/rbac.authorization.k8s.io/") => {
                        send.send_response(full(200, &list("List", vec![])))
                    }
                    ("PATCH", p) if p.contains("/roles/") => {
                        let mut obj = body.clone();
                        obj["metadata"]["uid"] = json!(format!("{p}-uid"));
                        obj["metadata"]["resourceVersion"] = json!("5000");
                        *roles
                            .lock()
                            .expect("lock")
                            .entry(p.to_string())
                            .or_default() += 1;
                        match drained_rx.take() {
                            // The first write is held until the controller
                            // has read the whole watch stream.
                            Some(drained) => {
                                if let Some(h) = held_tx.take() {
                                    let _ = h.send(());
                                }
                                tokio::spawn(async move {
                                    let read =
                                        tokio::time::timeout(Duration::from_secs(20), drained)
                                            .await;
                                    assert!(
                                        matches!(read, Ok(Ok(()))),
                                        "the watch stalled while a write was in flight"
                                    );
                                    send.send_response(full(200, &obj));
                                });
                            }
                            None => send.send_response(full(200, &obj)),
                        }
                    }
                    ("PATCH", p) if p.ends_with("/status") => {
                        let mut obj = rule.clone();
                        obj["status"] = body["status"].clone();
                        send.send_response(full(200, &obj))
                    }
                    ("POST" | "PATCH", p) if p.contains("/events") => {
                        send.send_response(full(201, &body))
                    }
                    (m, p) => panic!("unexpected request {m} {p}"),
                }
            }
            drop(parked);
        })
    };
    let controller = Controller::start(client, &[]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while roles.lock().expect("lock").len() < EVENTS + 1 {
        assert!(
            !server.is_finished(),
            "the server stopped: {:?}",
            roles.lock().expect("lock").len()
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {} Roles written",
            roles.lock().expect("lock").len(),
            EVENTS + 1
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    controller.stop().await;
    let roles = roles.lock().expect("lock").clone();
    let twice: Vec<_> = roles.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "written more than once: {twice:?}");
    assert_eq!(roles.len(), EVENTS + 1);
}

/// The stall contract: the API server answers every apply slowly and holds
/// the first one; while that write pass is in flight, Namespace events keep
/// arriving and the Role watch is closed with 410 Gone. The controller keeps
/// reading its watches (every event is read before the held write is
/// answered), lists the Roles again and watches on, and its cache then
/// equals the server: every Role is written exactly once, none is read
/// first, none deleted, and a later pass (for one more Namespace) writes
/// only that Namespace's Role.
#[tokio::test]
async fn a_slow_write_pass_keeps_draining_and_recovers_an_expired_watch() {
    use support::cluster::{Behaviour, FakeCluster, NAMESPACES, RBAC};

    const FIRST: usize = 20;
    const DURING: usize = 300;
    let roles = format!("{RBAC}/roles");
    let rule = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
    "metadata": {"name": "ns-viewer", "uid": "ns-viewer-uid", "generation": 1, "resourceVersion": "1"},
    "spec": {
        "trigger": {"kind": "Namespace", "metadataOnly": true},
        "outputs": [{"kind": "Role", "name": "viewer",
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}]
    }});
    let names: Vec<String> = (0..FIRST).map(|i| format!("team-{i:03}")).collect();
    let (client, fake) = FakeCluster::start(
        vec![rule],
        &names,
        Behaviour {
            apply_delay: Duration::from_millis(2),
            hold_first_apply: true,
        },
    );
    let controller = Controller::start(client, &["--max-concurrent-writes=4"]);
    tokio::time::timeout(Duration::from_secs(20), fake.first_apply_held())
        .await
        .expect("no write pass started");

    // While the pass is held: events keep coming, and the Role watch goes.
    let role_lists = |f: &FakeCluster| {
        f.log()
            .iter()
            .filter(|l| **l == format!("GET {roles}"))
            .count()
    };
    let lists_before = role_lists(&fake);
    for i in 0..DURING {
        fake.add_namespace(&format!("later-{i:03}"));
    }
    fake.expire_watches(&roles);
    fake.until(
        Duration::from_secs(20),
        "every Namespace event read while a write is held",
        |f| f.read(NAMESPACES) >= DURING,
    )
    .await;
    fake.until(
        Duration::from_secs(20),
        "the Roles listed again and watched while a write is held",
        |f| role_lists(f) > lists_before && f.watching(&roles) == 1,
    )
    .await;
    fake.release();

    fake.until(Duration::from_secs(20), "a Role per Namespace", |f| {
        f.rbac().len() == FIRST + DURING
    })
    .await;
    // A later pass writes only what changed: one more Namespace, one Role.
    fake.add_namespace("sentinel");
    fake.until(Duration::from_secs(20), "the sentinel's Role", |f| {
        f.rbac().len() == FIRST + DURING + 1
    })
    .await;
    controller.stop().await;

    let log = fake.log();
    let mut writes: BTreeMap<&str, usize> = BTreeMap::new();
    for line in &log {
        if let Some(path) = line.strip_prefix("PATCH ").filter(|p| p.starts_with(RBAC)) {
            *writes.entry(path).or_default() += 1;
        }
    }
    let twice: Vec<_> = writes.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "written more than once: {twice:?}");
    assert_eq!(writes.len(), FIRST + DURING + 1);
    let reads: Vec<_> = log
        .iter()
        .filter(|l| l.starts_with(&format!("GET {RBAC}/namespaces/")))
        .collect();
    assert!(reads.is_empty(), "read before writing: {reads:?}");
    assert!(!log.iter().any(|l| l.starts_with("DELETE")), "{log:#?}");
}
