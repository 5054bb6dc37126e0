//! A scripted API server for HTTP-contract tests: a `kube::Client` over
//! `tower_test::mock`, and a handle that checks each request (method,
//! path, query, content type, body) and answers it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use rbac_rules::api::{RbacRule, RbacRuleSpec, RbacRuleStatus};
use rbac_rules::controller::apply::Gate;
use rbac_rules::controller::live::{Live, ObjectId};
use rbac_rules::controller::metrics::Metrics;
use rbac_rules::controller::status::Hold;
use rbac_rules::controller::sync::Snapshot;
use rbac_rules::controller::sync::Syncer;
use rbac_rules::engine::ObjectStore;
use serde_json::{Value, json};
use tower_test::mock::{Handle, SendResponse};

/// The API server side of a mock client.
pub struct ApiServer(Handle<Request<Body>, Response<Body>>);

/// One received request, decoded.
pub struct Received {
    /// Method.
    pub method: Method,
    /// Path without the query.
    pub path: String,
    /// Query pairs, in order.
    pub query: Vec<(String, String)>,
    /// Content-Type header.
    pub content_type: Option<String>,
    /// Accept header.
    pub accept: Option<String>,
    /// The body as JSON (Null when empty).
    pub body: Value,
    send: SendResponse<Response<Body>>,
}

impl Received {
    /// Answers with a status code and a JSON body.
    pub fn respond(self, code: u16, body: Value) {
        let bytes = serde_json::to_vec(&body).expect("response body");
        self.respond_bytes(code, bytes);
    }

    /// Answers with a status code and a body of JSON text (one too deep
    /// to build as a value on a test's stack).
    pub fn respond_bytes(self, code: u16, bytes: Vec<u8>) {
        let response = Response::builder()
            .status(StatusCode::from_u16(code).expect("status code"))
            .header("content-type", "application/json")
            .body(Body::from(bytes))
            .expect("response");
        self.send.send_response(response);
    }

    /// Answers with a status code, a `Retry-After` header (seconds) and a
    /// v1 Status body, as API priority and fairness throttles.
    pub fn throttle(self, code: u16, retry_after_seconds: u64) {
        let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "TooManyRequests", "code": code, "message": "too many requests",
            "details": {"retryAfterSeconds": retry_after_seconds}, "metadata": {}});
        let bytes = serde_json::to_vec(&body).expect("response body");
        let response = Response::builder()
            .status(StatusCode::from_u16(code).expect("status code"))
            .header("content-type", "application/json")
            .header("retry-after", retry_after_seconds.to_string())
            .body(Body::from(bytes))
            .expect("response");
        self.send.send_response(response);
    }

    /// Answers with an error status and a v1 Status body of `reason`.
    pub fn fail(self, code: u16, reason: &str) {
        let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": reason, "code": code, "message": format!("{reason} (test)"), "metadata": {}});
        self.respond(code, body);
    }

    /// Answers 200 with the request body echoed (what apply and create
    /// return, near enough).
    pub fn echo(self) {
        let mut body = self.body.clone();
        if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.entry("uid").or_insert(json!("new-uid"));
            meta.entry("resourceVersion").or_insert(json!("1"));
        }
        self.respond(200, body);
    }

    /// Answers 404 NotFound.
    pub fn not_found(self) {
        let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "NotFound", "code": 404, "message": "not found", "metadata": {}});
        self.respond(404, body);
    }

    /// Answers 200 with a v1 Status Success (what DELETE returns).
    pub fn deleted(self) {
        let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Success",
            "code": 200, "metadata": {}});
        self.respond(200, body);
    }

    /// A query parameter.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Asserts method and path, and returns self for more checks.
    pub fn expect(self, method: Method, path: &str) -> Self {
        assert_eq!(
            (&self.method, self.path.as_str()),
            (&method, path),
            "unexpected request (body {})",
            self.body
        );
        self
    }

    /// Asserts a server-side apply of a new object by our field manager,
    /// not forced (a foreign object made meanwhile conflicts instead of
    /// being taken over).
    pub fn expect_create(self, path: &str) -> Self {
        let r = self.expect(Method::PATCH, path);
        assert_eq!(
            r.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
        assert_eq!(
            r.query,
            vec![("fieldManager".to_string(), "rbac-rules".to_string())]
        );
        r
    }

    /// Asserts a server-side apply by our field manager, forced.
    pub fn expect_apply(self, path: &str) -> Self {
        let r = self.expect(Method::PATCH, path);
        assert_eq!(
            r.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
        let mut query = r.query.clone();
        query.sort();
        assert_eq!(
            query,
            vec![
                ("fieldManager".to_string(), "rbac-rules".to_string()),
                ("force".to_string(), "true".to_string()),
            ]
        );
        r
    }
}

impl ApiServer {
    /// The next request; panics when the client is gone or after 5 s.
    pub async fn next(&mut self) -> Received {
        let next = tokio::time::timeout(std::time::Duration::from_secs(5), self.next_opt())
            .await
            .expect("timed out waiting for a request");
        next.expect("the client sent no further request")
    }

    /// The next request, or None once every client is gone.
    pub async fn next_opt(&mut self) -> Option<Received> {
        let (request, send) = self.0.next_request().await?;
        let (parts, body) = request.into_parts();
        let bytes = body.collect().await.expect("request body").to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("JSON request body")
        };
        let query = parts
            .uri
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| match p.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (p.to_string(), String::new()),
            })
            .collect();
        Some(Received {
            method: parts.method,
            path: parts.uri.path().to_string(),
            query,
            content_type: parts
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            accept: parts
                .headers
                .get("accept")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body,
            send,
        })
    }

    /// Asserts the client sends nothing more (every client clone must have
    /// been dropped).
    pub async fn done(mut self) {
        let next = tokio::time::timeout(std::time::Duration::from_secs(5), self.0.next_request())
            .await
            .expect("the client was not dropped");
        if let Some((request, _)) = next {
            panic!("unexpected request: {} {}", request.method(), request.uri());
        }
    }
}

/// A client and the server it talks to.
pub fn pair() -> (Client, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), ApiServer(handle))
}

/// A client with the retry layer `Client::try_default` installs (kube's
/// `Config::default_retry`): 429, 503 and 504 are retried with backoff,
/// honouring `Retry-After`.
pub fn pair_with_retries() -> (Client, ApiServer) {
    use kube::client::retry::RetryPolicy;
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let service = tower::ServiceBuilder::new()
        .layer(tower::retry::RetryLayer::new(RetryPolicy::server_retry()))
        .service(service);
    (Client::new(service, "default"), ApiServer(handle))
}

/// A syncer that leads (writes allowed).
pub fn syncer(client: Client) -> Syncer {
    Syncer::new(
        client,
        rbac_rules::api::ManageLevel::All,
        Metrics::new(),
        Arc::new(Gate::new(true)),
        Some("test".to_string()),
    )
}

/// An RbacRule object as the API server returns it.
pub fn rule(name: &str, spec: Value, status: Option<RbacRuleStatus>) -> RbacRule {
    let spec: RbacRuleSpec = serde_json::from_value(spec).expect("rule spec");
    let mut r = RbacRule::new(name, spec);
    r.metadata.generation = Some(1);
    r.metadata.uid = Some(format!("{name}-uid"));
    r.metadata.resource_version = Some("10".to_string());
    r.status = status;
    r
}

/// Rules by name.
pub fn rules(list: Vec<RbacRule>) -> BTreeMap<String, RbacRule> {
    list.into_iter()
        .map(|r| (r.metadata.name.clone().unwrap_or_default(), r))
        .collect()
}

/// A Namespace with a uid.
pub fn namespace(name: &str, annotations: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "uid": format!("{name}-uid"), "annotations": annotations}})
}

/// A store of objects.
pub fn store(objects: Vec<Value>) -> ObjectStore {
    let mut s = ObjectStore::new();
    for o in objects {
        s.insert(o).expect("object");
    }
    s
}

/// Live objects as the owned-object watches cache them, with server
/// fields added (uid, resourceVersion, creationTimestamp).
pub fn owned(objects: Vec<Value>) -> BTreeMap<ObjectId, Live> {
    objects
        .into_iter()
        .map(|mut o| {
            let name = o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let meta = o["metadata"].as_object_mut().expect("metadata");
            meta.entry("uid")
                .or_insert(json!(format!("{name}-live-uid")));
            meta.entry("resourceVersion").or_insert(json!("5"));
            meta.insert("creationTimestamp".into(), json!("2026-01-01T00:00:00Z"));
            (ObjectId::of(&o).expect("RBAC object"), Live::new(o))
        })
        .collect()
}

/// No object of the output kinds without our label.
pub static NO_FOREIGN: BTreeSet<ObjectId> = BTreeSet::new();

/// No object labelled ours that we did not make.
pub static NO_FORGED: BTreeMap<ObjectId, Option<String>> = BTreeMap::new();

/// The usual reconcile input: no allow-list, no foreign objects, pruning
/// allowed.
pub fn snapshot<'a>(
    rules: &'a BTreeMap<String, RbacRule>,
    observed: &'a ObjectStore,
    owned: &'a BTreeMap<ObjectId, Live>,
    holds: &'a BTreeMap<String, Hold>,
) -> Snapshot<'a> {
    Snapshot {
        rules,
        observed,
        owned,
        foreign: &NO_FOREIGN,
        forged: &NO_FORGED,
        holds,
        allow: None,
        prune: true,
    }
}
