//! Prometheus metrics and the `/metrics`, `/healthz`, `/readyz` server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::Error;

/// Labels of the errors counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// A bounded reason: an engine reason (`TemplateError`, `Conflict`, ...)
    /// or an API error label (`api_forbidden`, ...).
    pub reason: String,
}

/// Labels of the writes counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// ClusterRole, Role, ClusterRoleBinding, RoleBinding or RbacRule.
    pub kind: String,
    /// `apply`, `delete` or `status`.
    pub action: String,
}

/// Every metric the controller exports. Names carry the `rbac_rules_`
/// prefix; counters get `_total` from the encoder.
#[derive(Clone)]
pub struct Metrics {
    /// `rbac_rules_reconciles_total`: reconciles run (as leader).
    pub reconciles: Counter,
    /// `rbac_rules_reconcile_errors_total{reason}`: every rule error of
    /// the evaluation, once per pass that plans writes (a rule that stays
    /// broken adds one per reconcile: resyncs and events included), each
    /// write that failed, and each fresh write conflict.
    pub errors: Family<ReasonLabels, Counter>,
    /// `rbac_rules_api_writes_total{kind,action}`: writes sent.
    pub writes: Family<WriteLabels, Counter>,
    /// `rbac_rules_render_duration_seconds`: engine evaluation time.
    pub render_duration: Histogram,
    /// `rbac_rules_renders_total`: trigger output sets rendered; evaluation
    /// is incremental, so this grows with changes, not with cluster size.
    pub renders: Counter,
    /// `rbac_rules_managed_objects`: live objects carrying our label.
    pub managed_objects: Gauge,
    /// `rbac_rules_foreign_claims`: live RBAC objects labelled
    /// app.kubernetes.io/managed-by=rbac-rules that rbac-rules did not make
    /// (left alone, reported).
    pub foreign_claims: Gauge,
    /// `rbac_rules_watched_kinds`: kinds watched for the rules.
    pub watched_kinds: Gauge,
    /// `rbac_rules_leader`: 1 while this replica holds the lease.
    pub leader: Gauge,
    /// `rbac_rules_held_prunes`: deletions held by
    /// `--max-unconfirmed-prunes` in the last pass (reason `PruneHeld`),
    /// waiting for the rule's confirm annotation.
    pub held_prunes: Gauge,
    registry: Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("rbac_rules");
        let reconciles = Counter::default();
        let errors = Family::<ReasonLabels, Counter>::default();
        let writes = Family::<WriteLabels, Counter>::default();
        let render_duration = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        let renders = Counter::default();
        let managed_objects = Gauge::default();
        let watched_kinds = Gauge::default();
        let foreign_claims = Gauge::default();
        let leader = Gauge::default();
        let held_prunes = Gauge::default();
        registry.register(
            "reconciles",
            "Reconciles run by the leader",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Rule errors, conflicts and failed API calls, by reason",
            errors.clone(),
        );
        registry.register(
            "api_writes",
            "Writes sent to the API server, by kind and action",
            writes.clone(),
        );
        registry.register(
            "render_duration_seconds",
            "Time to evaluate every rule",
            render_duration.clone(),
        );
        registry.register(
            "renders",
            "Trigger output sets rendered (unchanged ones are reused)",
            renders.clone(),
        );
        registry.register(
            "managed_objects",
            "Live RBAC objects labelled app.kubernetes.io/managed-by=rbac-rules",
            managed_objects.clone(),
        );
        registry.register(
            "foreign_claims",
            "Live RBAC objects labelled app.kubernetes.io/managed-by=rbac-rules that rbac-rules did not make (left alone)",
            foreign_claims.clone(),
        );
        registry.register(
            "watched_kinds",
            "Kinds watched for the rules' triggers and related objects",
            watched_kinds.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            leader.clone(),
        );
        registry.register(
            "held_prunes",
            "Deletions held by --max-unconfirmed-prunes in the last pass, waiting for confirmation",
            held_prunes.clone(),
        );
        Metrics {
            reconciles,
            errors,
            writes,
            render_duration,
            renders,
            managed_objects,
            foreign_claims,
            watched_kinds,
            leader,
            held_prunes,
            registry: Arc::new(registry),
        }
    }

    /// Counts one error.
    pub fn error(&self, reason: &str) {
        self.errors
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts one write.
    pub fn write(&self, kind: &str, action: &str) {
        self.writes
            .get_or_create(&WriteLabels {
                kind: kind.to_string(),
                action: action.to_string(),
            })
            .inc();
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Shared by the HTTP handlers.
#[derive(Clone)]
struct Http {
    metrics: Metrics,
    ready: Arc<AtomicBool>,
}

/// The HTTP routes: `/metrics`, `/healthz` (the process serves) and
/// `/readyz` (the initial sync is done; non-leaders are ready too).
pub fn router(metrics: Metrics, ready: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(serve_ready))
        .with_state(Http { metrics, ready })
}

async fn serve_metrics(State(h): State<Http>) -> impl IntoResponse {
    match h.metrics.encode() {
        Ok(text) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "cannot encode metrics".to_string(),
        ),
    }
}

async fn serve_ready(State(h): State<Http>) -> impl IntoResponse {
    if h.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "initial sync not done")
    }
}

/// Binds the address; the returned future serves until `shutdown` resolves.
pub async fn serve(
    address: SocketAddr,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<impl std::future::Future<Output = ()>, Error> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| Error::Serve { address, source })?;
    tracing::info!(%address, "serving /metrics, /healthz and /readyz");
    trace_memory_from_env();
    Ok(serve_on(listener, metrics, ready, shutdown))
}

/// Serves the routes on a bound listener until `shutdown` resolves.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    if let Err(e) = axum::serve(listener, router(metrics, ready))
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!(error = %e, "metrics server stopped");
    }
}

/// With `RBAC_RULES_MEMTRACE=MS` set, a thread prints the process's
/// resident memory to stderr every MS milliseconds (`memtrace ms=.. rss=..
/// anon=.. file=.. hwm=..`, KiB from `/proc/self/status`): how the bench
/// and a person find where the controller's memory goes over time, beside
/// its logs. Off by default; Linux only (elsewhere it prints nothing).
fn trace_memory_from_env() {
    let Some(every) = std::env::var("RBAC_RULES_MEMTRACE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
    else {
        return;
    };
    let start = std::time::Instant::now();
    let spawned = std::thread::Builder::new()
        .name("memtrace".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            loop {
                let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
                    return;
                };
                let field = |name: &str| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix(name))
                        .and_then(|rest| {
                            rest.trim()
                                .trim_end_matches("kB")
                                .trim()
                                .parse::<u64>()
                                .ok()
                        })
                        .unwrap_or(0)
                };
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis());
                eprintln!(
                    "memtrace ms={} unix_ms={now} rss={} anon={} file={} hwm={}",
                    start.elapsed().as_millis(),
                    field("VmRSS:"),
                    field("RssAnon:"),
                    field("RssFile:"),
                    field("VmHWM:"),
                );
                std::thread::sleep(std::time::Duration::from_millis(every));
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "RBAC_RULES_MEMTRACE: cannot start the sampler");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(address: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn health_readiness_and_metrics() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let metrics = Metrics::new();
        let ready = Arc::new(AtomicBool::new(false));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_on(listener, metrics.clone(), ready.clone(), async {
            let _ = rx.await;
        }));
        assert!(get(address, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(address, "/readyz").await.starts_with("HTTP/1.1 503"));
        ready.store(true, Ordering::Relaxed);
        assert!(get(address, "/readyz").await.starts_with("HTTP/1.1 200"));

        metrics.reconciles.inc();
        metrics.write("Role", "apply");
        metrics.error("Conflict");
        metrics.render_duration.observe(0.002);
        metrics.managed_objects.set(7);
        metrics.foreign_claims.set(2);
        let text = get(address, "/metrics").await;
        for line in [
            "rbac_rules_reconciles_total 1",
            "rbac_rules_api_writes_total{kind=\"Role\",action=\"apply\"} 1",
            "rbac_rules_reconcile_errors_total{reason=\"Conflict\"} 1",
            "rbac_rules_render_duration_seconds_count 1",
            "rbac_rules_managed_objects 7",
            "rbac_rules_foreign_claims 2",
            "rbac_rules_leader 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        let _ = tx.send(());
        server.await.expect("server");
    }
}
