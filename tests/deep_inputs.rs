//! Inputs nested as deep as the Kubernetes API server accepts (10,000
//! levels, the object's own braces being level 1) are read: by `render`,
//! and by the controller's watches through kube's real client and decoder
//! (over `tower_test`'s mock). One object deeper than that is refused
//! alone, named; the list or file it came in is still read.
//!
//! Deep values are built, measured and dropped here without recursion
//! (a test thread has 2 MiB of stack); only the code under test recurses.

mod support;

use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use http::{Request, Response};
use kube::api::{Api, ApiResource};
use kube::client::Body;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource};
use rbac_rules::controller::wire::{Wire, WireMeta};
use serde_json::{Value, json};
use tower_test::mock::Handle;

/// The API server's limit, and the one the project reads to.
const MAX_DEPTH: usize = rbac_rules::yaml::MAX_DEPTH;

fn widgets() -> ApiResource {
    ApiResource {
        group: "example.org".into(),
        version: "v1".into(),
        api_version: "example.org/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

/// JSON text of `levels` maps nested as `{"a":{"a":…{}…}}` (levels ≥ 1).
fn nested_text(levels: usize) -> String {
    let mut s = String::with_capacity(6 * levels);
    for _ in 1..levels {
        s.push_str("{\"a\":");
    }
    s.push_str("{}");
    for _ in 1..levels {
        s.push('}');
    }
    s
}

/// A Widget whose whole nesting is `depth` levels: `spec` holds the rest,
/// and another manager's `fieldsV1` is as deep as the object, as the API
/// server records it.
fn widget_text(name: &str, rv: u64, depth: usize) -> String {
    let inner = nested_text(depth - 1);
    format!(
        r#"{{"apiVersion":"example.org/v1","kind":"Widget","metadata":{{"name":"{name}","namespace":"team-a","uid":"{name}-uid","resourceVersion":"{rv}","labels":{{"x":"y"}},"managedFields":[{{"manager":"kubectl","operation":"Update","apiVersion":"example.org/v1","fieldsType":"FieldsV1","fieldsV1":{inner}}}]}},"spec":{inner}}}"#
    )
}

/// `levels` maps nested as `{"a":{"a":…{}…}}`, built without recursion.
fn nested_value(levels: usize) -> Value {
    // Not `json!({"a": v})`: that copies `v` (to_value), each time.
    let mut v = Value::Object(serde_json::Map::new());
    for _ in 1..levels {
        v = Value::Object(serde_json::Map::from_iter([("a".to_string(), v)]));
    }
    v
}

/// The deepest nesting of `v` (a scalar is 0, `{}` is 1), iteratively.
fn depth(v: &Value) -> usize {
    let mut max = 0;
    let mut stack = vec![(v, 1)];
    while let Some((v, d)) = stack.pop() {
        match v {
            Value::Object(m) => {
                max = max.max(d);
                stack.extend(m.values().map(|x| (x, d + 1)));
            }
            Value::Array(a) => {
                max = max.max(d);
                stack.extend(a.iter().map(|x| (x, d + 1)));
            }
            _ => {}
        }
    }
    max
}

/// Drops a value without recursion.
fn dismantle(v: Value) {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) => stack.extend(m.into_iter().map(|(_, x)| x)),
            Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
}

fn mock() -> (Client, Handle<Request<Body>, Response<Body>>) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), handle)
}

fn ok(text: String) -> Response<Body> {
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(Body::from(text.into_bytes()))
        .expect("response")
}

/// What the stand-in received: "METHOD path?query accept=…".
type Log = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// Serves lists (`items`, JSON texts) and watches, the first of which
/// sends `events` (JSON lines); later watches stay open and quiet.
fn serve(
    mut handle: Handle<Request<Body>, Response<Body>>,
    list_kind: &'static str,
    items: Vec<String>,
    events: Vec<String>,
) -> (tokio::task::JoinHandle<()>, Log) {
    let log = Log::default();
    let seen = log.clone();
    let task = tokio::spawn(async move {
        let mut events = Some(events);
        while let Some((req, send)) = handle.next_request().await {
            let query = req.uri().query().unwrap_or_default().to_string();
            let accept = req
                .headers()
                .get("accept")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            seen.lock().expect("log").push(format!(
                "{} {}?{query} accept={accept}",
                req.method(),
                req.uri().path()
            ));
            if query.contains("watch=true") {
                let lines = events.take().unwrap_or_default();
                if lines.is_empty() {
                    // Nothing more: the watch stays open, quiet.
                    std::mem::forget(send);
                    continue;
                }
                send.send_response(ok(lines.join("\n") + "\n"));
            } else {
                send.send_response(ok(format!(
                    r#"{{"apiVersion":"v1","kind":"{list_kind}","metadata":{{"resourceVersion":"10"}},"items":[{}]}}"#,
                    items.join(",")
                )));
            }
        }
    });
    (task, log)
}

/// Events of `stream` until `n` objects (InitApply or Apply) arrived.
async fn objects<K>(
    stream: &mut (impl futures::Stream<Item = Result<Event<K>, watcher::Error>> + Unpin),
    n: usize,
) -> Vec<K> {
    let mut out = Vec::new();
    while out.len() < n {
        let ev = tokio::time::timeout(std::time::Duration::from_secs(20), stream.next())
            .await
            .expect("an event in time")
            .expect("the stream goes on");
        match ev {
            Ok(Event::InitApply(o) | Event::Apply(o)) => out.push(o),
            Ok(_) => {}
            Err(e) => panic!("watch error: {e}"),
        }
    }
    out
}

#[tokio::test]
async fn a_watch_event_with_a_200_level_object_arrives_whole() {
    let ar = widgets();
    let event = format!(
        r#"{{"type":"ADDED","object":{}}}"#,
        widget_text("deep", 11, 200)
    );
    // What kube reads a dynamic object with refuses it (serde_json's
    // recursion limit): the case this test is about.
    assert!(
        serde_json::from_str::<kube::core::WatchEvent<kube::api::DynamicObject>>(&event).is_err()
    );
    let (client, handle) = mock();
    let (server, _) = serve(
        handle,
        "WidgetList",
        vec![widget_text("flat", 5, 3)],
        vec![event],
    );
    let mut stream = watcher(
        Api::<Wire>::all_with(client, &ar),
        watcher::Config::default(),
    )
    .boxed();
    let got = objects(&mut stream, 2).await;
    drop(stream);
    let [flat, deep] = <[Wire; 2]>::try_from(got).expect("two objects");
    assert!(flat.refusal(&ar).is_none() && deep.refusal(&ar).is_none());
    let deep = deep.into_value(&ar);
    assert_eq!(depth(&deep), 200);
    assert_eq!(depth(&deep["spec"]), 199);
    assert_eq!(deep["metadata"]["name"], "deep");
    assert_eq!(deep["metadata"]["labels"], json!({"x": "y"}));
    assert!(deep["metadata"].get("managedFields").is_none());
    let expected = nested_value(199);
    assert_eq!(deep["spec"], expected);
    let flat = flat.into_value(&ar);
    assert_eq!(flat["spec"], json!({"a": {}}));
    server.abort();
}

#[tokio::test]
async fn a_metadata_only_watch_reads_a_crd_with_deep_managed_fields() {
    let crds = ApiResource {
        group: "apiextensions.k8s.io".into(),
        version: "v1".into(),
        api_version: "apiextensions.k8s.io/v1".into(),
        kind: "CustomResourceDefinition".into(),
        plural: "customresourcedefinitions".into(),
    };
    // A CRD with a deep schema: its managedFields are as deep.
    let meta = |name: &str| {
        format!(
            r#"{{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{{"name":"{name}","uid":"{name}-uid","resourceVersion":"4","ownerReferences":[{{"apiVersion":"pkg.crossplane.io/v1","kind":"ProviderRevision","name":"p-1","uid":"rev-uid","controller":true}}],"managedFields":[{{"manager":"crossplane","operation":"Apply","fieldsType":"FieldsV1","fieldsV1":{}}}]}}}}"#,
            nested_text(300)
        )
    };
    // kube's PartialObjectMeta parses every fieldsV1: its list fails whole.
    let list = format!(
        r#"{{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadataList","metadata":{{}},"items":[{}]}}"#,
        meta("buckets.s3.example.org")
    );
    assert!(
        serde_json::from_str::<
            kube::core::ObjectList<kube::core::PartialObjectMeta<kube::api::DynamicObject>>,
        >(&list)
        .is_err()
    );
    let (client, handle) = mock();
    let (server, log) = serve(
        handle,
        "PartialObjectMetadataList",
        vec![
            meta("buckets.s3.example.org"),
            meta("queues.sqs.example.org"),
        ],
        vec![],
    );
    let mut stream = watcher(
        Api::<WireMeta>::all_with(client, &crds),
        watcher::Config::default(),
    )
    .boxed();
    let got = objects(&mut stream, 2).await;
    drop(stream);
    let names: Vec<Value> = got
        .into_iter()
        .map(|m| {
            assert!(m.0.refusal(&crds).is_none());
            let v = m.0.into_value(&crds);
            assert_eq!(v["kind"], "CustomResourceDefinition");
            assert!(v["metadata"].get("managedFields").is_none());
            assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "rev-uid");
            v["metadata"]["name"].clone()
        })
        .collect();
    assert_eq!(
        names,
        [
            json!("buckets.s3.example.org"),
            json!("queues.sqs.example.org")
        ]
    );
    server.abort();
    // Metadata only was asked for.
    let seen = log.lock().expect("log").clone();
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(|r| r.contains("as=PartialObjectMetadata")),
        "{seen:#?}"
    );
}

#[tokio::test]
async fn one_object_past_the_api_servers_limit_is_refused_alone() {
    let ar = widgets();
    let (client, handle) = mock();
    let (server, _) = serve(
        handle,
        "WidgetList",
        vec![
            widget_text("at-limit", 3, MAX_DEPTH),
            widget_text("too-deep", 4, MAX_DEPTH + 1),
            widget_text("flat", 5, 3),
        ],
        vec![format!(
            r#"{{"type":"MODIFIED","object":{}}}"#,
            widget_text("too-deep", 12, MAX_DEPTH + 5)
        )],
    );
    let mut stream = watcher(
        Api::<Wire>::all_with(client, &ar),
        watcher::Config::default(),
    )
    .boxed();
    let got = objects(&mut stream, 4).await;
    drop(stream);
    let mut refusals = Vec::new();
    for w in got {
        let name = w.meta().name.clone().unwrap_or_default();
        let why = w.refusal(&ar);
        let v = w.into_value(&ar);
        match name.as_str() {
            "at-limit" => {
                assert_eq!(why, None);
                assert_eq!(depth(&v), MAX_DEPTH);
            }
            "flat" => assert_eq!((why, v["spec"].clone()), (None, json!({"a": {}}))),
            "too-deep" => {
                let why = why.expect("refused");
                assert!(
                    why.contains("Widget team-a/too-deep") && why.contains("10000"),
                    "{why}"
                );
                refusals.push(why);
                // Only what names it is kept.
                assert_eq!(
                    v["metadata"],
                    json!({"name": "too-deep", "namespace": "team-a", "uid": "too-deep-uid",
                        "resourceVersion": v["metadata"]["resourceVersion"].clone()})
                );
                assert!(v.get("spec").is_none());
            }
            other => panic!("unexpected object {other}"),
        }
        dismantle(v);
    }
    // In the list and in a watch event.
    assert_eq!(refusals.len(), 2);
    server.abort();
}

fn xrd_and_crd(levels: usize) -> String {
    // A schema of `levels` nested properties (two YAML levels each).
    let mut schema = String::new();
    let mut pad = "        ".to_string();
    for i in 0..levels {
        schema.push_str(&format!(
            "{pad}type: object\n{pad}properties:\n{pad}  f{i}:\n"
        ));
        pad.push_str("    ");
    }
    schema.push_str(&format!("{pad}type: string\n"));
    format!(
        "apiVersion: apiextensions.crossplane.io/v1
kind: CompositeResourceDefinition
metadata:
  name: xwidgets.example.org
  uid: xrd-uid
  creationTimestamp: \"2026-01-01T00:00:00Z\"
spec:
  group: example.org
  names: {{kind: XWidget, plural: xwidgets}}
  versions:
  - name: v1
    served: true
    referenceable: true
    schema:
      openAPIV3Schema:
{schema}---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: xwidgets.example.org
  creationTimestamp: \"2026-01-01T00:01:00Z\"
  uid: crd-uid
  ownerReferences:
  - {{apiVersion: apiextensions.crossplane.io/v1, kind: CompositeResourceDefinition, name: xwidgets.example.org, uid: xrd-uid, controller: true, blockOwnerDeletion: true}}
spec:
  group: example.org
  names: {{kind: XWidget, plural: xwidgets}}
  scope: Cluster
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
{schema}"
    )
}

fn render(dir: &Path, file: &str, text: &str) -> std::process::Output {
    let path = dir.join(file);
    std::fs::write(&path, text).expect("write");
    support::cli::rbac_rules()
        .args(["render", "--objects"])
        .arg(&path)
        .output()
        .expect("run rbac-rules")
}

#[test]
fn render_reads_xrds_with_40_and_300_level_schemas() {
    let dir = tempfile::tempdir().expect("tempdir");
    for levels in [40, 300] {
        let out = render(dir.path(), "xrd.yaml", &xrd_and_crd(levels));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{levels} levels: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for role in ["edit", "view", "browse"] {
            assert!(
                stdout.contains(&format!(
                    "name: crossplane:composite:xwidgets.example.org:aggregate-to-{role}"
                )),
                "{levels} levels: no {role} role"
            );
        }
    }
}

/// A ConfigMap whose whole nesting is `levels`, in flow style.
fn config_map(name: &str, levels: usize) -> String {
    format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"{name}\",\"namespace\":\"a\"}},\"data\":{}}}\n",
        nested_text(levels - 1)
    )
}

#[test]
fn render_reads_the_api_servers_depth_and_refuses_one_deeper_document_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let at_limit = render(dir.path(), "at-limit.json", &config_map("d", MAX_DEPTH));
    assert!(
        at_limit.status.success(),
        "{}",
        String::from_utf8_lossy(&at_limit.stderr)
    );
    // A good XRD, a document one level too deep, a Namespace.
    let text = format!(
        "{}---\n{}---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: after}}\n",
        xrd_and_crd(40),
        config_map("too-deep", MAX_DEPTH + 1)
    );
    let out = render(dir.path(), "mixed.yaml", &text);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let first = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default();
    // Documents 1 and 2 are the XRD and its CRD: the third is named.
    assert!(
        first.contains("mixed.yaml#3:") && first.contains("nests deeper than 10000 levels"),
        "{stderr}"
    );
    assert!(!stderr.contains("mixed.yaml#1") && !stderr.contains("mixed.yaml#4"));
}

/// The whole controller (watch, cache, engine, writes) over the stand-in
/// API server: a Namespace whose metadata nests 10,000 levels gets its
/// Role like any other; one nesting 10,001 is refused alone, and the
/// controller goes on (a later Namespace gets its Role too).
///
/// Built optimised (`cargo test --release`), the runtime has the stacks
/// `rbac-rules run` has: 16 MiB workers and an 8 MiB main thread. Debug
/// builds take about five times the stack per level (docs/security.md,
/// "Deep inputs"), so they get 64 MiB.
#[test]
fn the_controller_reads_a_namespace_as_deep_as_the_api_server_allows() {
    use support::cluster::{Behaviour, Controller, FakeCluster, RBAC};
    const MIB: usize = 1024 * 1024;
    let (main, workers) = if cfg!(debug_assertions) {
        (64 * MIB, 64 * MIB)
    } else {
        (8 * MIB, 16 * MIB)
    };
    let run = move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_stack_size(workers)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let rule = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
                "metadata": {"name": "ns-viewer", "uid": "ns-viewer-uid", "generation": 1, "resourceVersion": "1"},
                "spec": {
                    "trigger": {"kind": "Namespace", "metadataOnly": true},
                    "outputs": [{"kind": "Role", "name": "viewer",
                        "annotations": {"example.org/note": "{{get trigger \"metadata.annotations.note\" \"none\"}}"},
                        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}]
                }});
            let names = ["deep", "too-deep", "flat"].map(String::from);
            let (client, fake) = FakeCluster::start(vec![rule], &names, Behaviour::default());
            // metadata is level 2, annotations 3: the rest makes the total.
            fake.annotate_namespace(
                "deep",
                json!({"note": "deep", "x": nested_value(MAX_DEPTH - 3)}),
            );
            fake.annotate_namespace(
                "too-deep",
                json!({"note": "too deep", "x": nested_value(MAX_DEPTH - 2)}),
            );
            let controller = Controller::start(client, &[]);
            let role = |ns: &str| format!("{RBAC}/namespaces/{ns}/roles/viewer");
            fake.until(Duration::from_secs(60), "Roles for deep and flat", |f| {
                let rbac = f.rbac();
                rbac.contains_key(&role("deep")) && rbac.contains_key(&role("flat"))
            })
            .await;
            fake.add_namespace("sentinel");
            fake.until(Duration::from_secs(60), "the sentinel's Role", |f| {
                f.rbac().contains_key(&role("sentinel"))
            })
            .await;
            controller.stop().await;
            let rbac = fake.rbac();
            assert_eq!(
                rbac[&role("deep")]["metadata"]["annotations"]["example.org/note"],
                "deep"
            );
            assert!(!rbac.contains_key(&role("too-deep")), "{:?}", rbac.keys());
            assert_eq!(rbac.len(), 3, "{:?}", rbac.keys());
        });
    };
    std::thread::Builder::new()
        .stack_size(main)
        .spawn(run)
        .expect("thread")
        .join()
        .expect("the test's thread");
}

/// An RbacRule nested 200 levels deep in a free-form field (kube's typed
/// decoder stops at 128, and failed the list of every rule) stops no other
/// rule: the good rule's Roles are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_deep_rule_stops_no_other() {
    use support::cluster::{Behaviour, Controller, FakeCluster, RBAC};
    let rule = |name: &str, rules: Value| {
        json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
        "metadata": {"name": name, "uid": format!("{name}-uid"), "generation": 1, "resourceVersion": "1"},
        "spec": {
            "trigger": {"kind": "Namespace", "metadataOnly": true},
            "outputs": [{"kind": "Role", "name": name, "rules": rules}]
        }})
    };
    let good = rule(
        "good",
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
    );
    let deep = rule(
        "deep",
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "x": nested_value(200)}]),
    );
    let probe = serde_json::to_string(&json!({"kind": "RbacRuleList", "apiVersion": "v1",
        "metadata": {}, "items": [good.clone(), deep.clone()]}))
    .expect("json");
    // kube's typed list of rules refuses it: the case this test is about.
    assert!(
        serde_json::from_str::<kube::core::ObjectList<rbac_rules::api::RbacRule>>(&probe).is_err()
    );
    let (client, fake) = FakeCluster::start(
        vec![deep, good],
        &["team-a".to_string()],
        Behaviour::default(),
    );
    let controller = Controller::start(client, &[]);
    fake.until(Duration::from_secs(30), "the good rule's Role", |f| {
        f.rbac()
            .contains_key(&format!("{RBAC}/namespaces/team-a/roles/good"))
    })
    .await;
    controller.stop().await;
}

/// A stream larger than what is parsed at once (a cluster's objects) is
/// read document by document: every good document is read, and a bad one
/// is named by its position as in a small stream.
#[test]
fn a_large_stream_is_read_document_by_document_with_the_same_positions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pad = "x".repeat(2000);
    let mut text = String::new();
    for i in 0..3000 {
        if i == 1500 {
            text.push_str("---\napiVersion: v1\nkind: Namespace\nmetadata: {name: [unclosed\n");
            continue;
        }
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns-{i}\n  annotations: {{pad: {pad}}}\n"
        ));
    }
    assert!(text.len() > 4 << 20);
    let out = render(dir.path(), "large.yaml", &text);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("large.yaml#1501:"), "{stderr}");
}
