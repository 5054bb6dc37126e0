//! Faults converge: the controller's reconcile against an API server that
//! refuses (409), throttles (429 with Retry-After), fails (500), drops a
//! response (what a timeout looks like to the client), and a restart in the
//! middle of a write pass. After each, the next pass finishes the job:
//! nothing lost, nothing written twice, nothing pruned by mistake.

mod support;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use rbac_rules::api::{ManageLevel, RbacRule, RbacRuleStatus};
use rbac_rules::controller::apply::{Gate, Outcome};
use rbac_rules::controller::live::{Live, ObjectId};
use rbac_rules::controller::metrics::Metrics;
use rbac_rules::controller::sync::{SyncReport, Syncer};
use rbac_rules::engine::ObjectStore;
use serde_json::{Value, json};
use support::api::{ApiServer, owned, pair, pair_with_retries, rule, rules, snapshot, syncer};

const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";

/// A static rule: one ClusterRole and the binding to it.
fn spec() -> Value {
    json!({"outputs": [
        {"kind": "ClusterRole", "name": "widgets-view",
         "rules": [{"apiGroups": ["example.org"], "resources": ["widgets"], "verbs": ["get", "list"]}]},
        {"kind": "ClusterRoleBinding", "name": "widgets-view",
         "roleRef": {"kind": "ClusterRole", "name": "widgets-view"},
         "subjects": [{"kind": "Group", "name": "widget-viewers"}]}
    ]})
}

fn role_path() -> String {
    format!("{RBAC}/clusterroles/widgets-view")
}

fn binding_path() -> String {
    format!("{RBAC}/clusterrolebindings/widgets-view")
}

/// What the rule wants, as the apply bodies the controller sends.
fn desired(rules: &BTreeMap<String, RbacRule>) -> Vec<Value> {
    let (client, _server) = pair();
    let mut s = syncer(client);
    let observed = ObjectStore::new();
    let live = BTreeMap::new();
    let holds = BTreeMap::new();
    let (_, plan) = s.evaluate(&snapshot(rules, &observed, &live, &holds));
    plan.applies.into_iter().map(|a| a.body()).collect()
}

/// Live copies of `objects` changed by someone else: every one needs an
/// apply, and none needs an ownership lookup.
fn drifted(objects: &[Value]) -> BTreeMap<ObjectId, Live> {
    owned(
        objects
            .iter()
            .cloned()
            .map(|mut o| {
                if o.get("rules").is_some() {
                    o["rules"] = json!([]);
                } else {
                    o["subjects"] = json!([]);
                }
                o
            })
            .collect(),
    )
}

/// How the scripted server answers the next RBAC request.
enum Answer {
    Ok,
    Fail(u16, &'static str),
    Throttle(u64),
    /// No answer at all: the client sees a transport error.
    Drop,
    /// Answer, then close the gate (the process is stopping).
    OkThenStop(Arc<Gate>),
}

#[derive(Default)]
struct Script {
    answers: Mutex<VecDeque<Answer>>,
    /// "METHOD path" of every RBAC request, in order.
    rbac: Mutex<Vec<String>>,
    /// When each RBAC request arrived (tokio time).
    at: Mutex<Vec<tokio::time::Instant>>,
    /// Bodies of RBAC requests.
    bodies: Mutex<Vec<Value>>,
    /// The last status written per rule.
    status: Mutex<BTreeMap<String, Value>>,
}

impl Script {
    fn with(answers: Vec<Answer>) -> Arc<Self> {
        let s = Script::default();
        *s.answers.lock().expect("lock") = answers.into();
        Arc::new(s)
    }

    fn rbac(&self) -> Vec<String> {
        self.rbac.lock().expect("lock").clone()
    }

    fn unanswered(&self) -> usize {
        self.answers.lock().expect("lock").len()
    }
}

/// Serves requests until the client is gone: RBAC requests by the script,
/// status patches and Events accepted.
fn serve(mut server: ApiServer, script: Arc<Script>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(r) = server.next_opt().await {
            if r.path.starts_with(RBAC) {
                script
                    .rbac
                    .lock()
                    .expect("lock")
                    .push(format!("{} {}", r.method, r.path));
                script
                    .at
                    .lock()
                    .expect("lock")
                    .push(tokio::time::Instant::now());
                script.bodies.lock().expect("lock").push(r.body.clone());
                let answer = script.answers.lock().expect("lock").pop_front();
                match answer {
                    Some(Answer::Ok) if r.method == http::Method::DELETE => r.deleted(),
                    Some(Answer::Ok) => r.echo(),
                    Some(Answer::Fail(code, reason)) => r.fail(code, reason),
                    Some(Answer::Throttle(secs)) => r.throttle(429, secs),
                    Some(Answer::Drop) => drop(r),
                    Some(Answer::OkThenStop(gate)) => {
                        gate.stop();
                        r.echo()
                    }
                    None => panic!("unscripted request {} {}", r.method, r.path),
                }
            } else if r.path.ends_with("/status") {
                let name = r
                    .path
                    .trim_end_matches("/status")
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                script
                    .status
                    .lock()
                    .expect("lock")
                    .insert(name.clone(), r.body["status"].clone());
                let body = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
                    "metadata": {"name": name}, "spec": spec(), "status": r.body["status"]});
                r.respond(200, body);
            } else if r.path.contains("/events") {
                let body = r.body.clone();
                r.respond(201, body);
            } else {
                panic!("unexpected request {} {}", r.method, r.path);
            }
        }
    })
}

/// The rule as the API server has it after the status writes so far.
fn rule_with_written_status(script: &Script, status: Option<RbacRuleStatus>) -> RbacRule {
    let written = script.status.lock().expect("lock").get("widgets").cloned();
    let status = written
        .map(|s| serde_json::from_value(s).expect("status"))
        .or(status);
    rule("widgets", spec(), status)
}

async fn sync_once(
    s: &mut Syncer,
    rules: &BTreeMap<String, RbacRule>,
    live: &BTreeMap<ObjectId, Live>,
) -> SyncReport {
    let observed = ObjectStore::new();
    let holds = BTreeMap::new();
    s.sync(&snapshot(rules, &observed, live, &holds)).await
}

fn outcomes(report: &SyncReport) -> Vec<(String, String)> {
    report
        .written()
        .iter()
        .map(|w| (w.id.to_string(), format!("{:?}", w.outcome)))
        .collect()
}

/// After the faults, the live state is what the rule wants: one more pass
/// sends no write at all.
async fn converged(rules: &BTreeMap<String, RbacRule>, wanted: &[Value]) {
    let (client, server) = pair();
    let script = Script::with(vec![]);
    let task = serve(server, script.clone());
    let mut s = syncer(client);
    let report = sync_once(&mut s, rules, &owned(wanted.to_vec())).await;
    drop(s);
    task.await.expect("server");
    assert!(report.plan.is_empty(), "{:?}", report.plan);
    assert_eq!(script.rbac(), Vec::<String>::new());
}

#[tokio::test]
async fn a_409_on_apply_holds_the_binding_back_and_the_next_pass_converges() {
    let rules = rules(vec![rule("widgets", spec(), None)]);
    let wanted = desired(&rules);
    let live = drifted(&wanted);
    let (client, server) = pair();
    let script = Script::with(vec![Answer::Fail(409, "Conflict"), Answer::Ok, Answer::Ok]);
    let task = serve(server, script.clone());
    let mut s = syncer(client);

    let first = sync_once(&mut s, &rules, &live).await;
    assert!(first.retry, "a refused write asks for a retry");
    // The binding waits for its role: it never binds a role we failed to write.
    assert_eq!(script.rbac(), vec![format!("PATCH {}", role_path())]);
    assert!(
        matches!(first.written()[1].outcome, Outcome::Blocked(_)),
        "{:?}",
        outcomes(&first)
    );
    let status = script.status.lock().expect("lock")["widgets"].clone();
    assert!(
        status.to_string().contains("Degraded"),
        "the failure is reported: {status}"
    );

    let rules2 = rules_map(rule_with_written_status(&script, None));
    let second = sync_once(&mut s, &rules2, &live).await;
    assert!(!second.retry, "{:?}", outcomes(&second));
    assert_eq!(
        script.rbac(),
        vec![
            format!("PATCH {}", role_path()),
            format!("PATCH {}", role_path()),
            format!("PATCH {}", binding_path()),
        ],
        "each object written once more, in order, nothing deleted"
    );
    drop(s);
    task.await.expect("server");
    assert_eq!(script.unanswered(), 0);
    converged(&rules2, &wanted).await;
}

#[tokio::test]
async fn a_500_keeps_the_live_object_and_prunes_only_what_nothing_wants() {
    let rules = rules(vec![rule("widgets", spec(), None)]);
    let wanted = desired(&rules);
    let mut live = drifted(&wanted);
    // An object of the same rule that nothing wants any more.
    let mut orphan = wanted[0].clone();
    orphan["metadata"]["name"] = json!("widgets-old");
    live.extend(owned(vec![orphan]));
    let (client, server) = pair();
    let script = Script::with(vec![
        Answer::Fail(500, "InternalError"),
        Answer::Ok,
        Answer::Ok,
        Answer::Ok,
    ]);
    let task = serve(server, script.clone());
    let mut s = syncer(client);

    let first = sync_once(&mut s, &rules, &live).await;
    assert!(first.retry);
    assert_eq!(
        script.rbac(),
        vec![
            format!("PATCH {}", role_path()),
            format!("DELETE {RBAC}/clusterroles/widgets-old"),
        ],
        "the failed role is never deleted; the orphan is"
    );
    // The cache learns the prune from the watch; the failed role is still live.
    live.retain(|id, _| &*id.name != "widgets-old");
    let second = sync_once(&mut s, &rules, &live).await;
    assert!(!second.retry, "{:?}", outcomes(&second));
    assert_eq!(script.rbac().len(), 4);
    assert!(
        script.rbac()[2..]
            .iter()
            .all(|r| r.starts_with("PATCH") && !r.contains("widgets-old")),
        "{:?}",
        script.rbac()
    );
    drop(s);
    task.await.expect("server");
    assert_eq!(script.unanswered(), 0);
}

#[tokio::test]
async fn a_dropped_response_is_a_transport_error_retried_next_pass() {
    let rules = rules(vec![rule("widgets", spec(), None)]);
    let wanted = desired(&rules);
    let live = drifted(&wanted);
    let (client, server) = pair();
    let script = Script::with(vec![Answer::Drop, Answer::Ok, Answer::Ok]);
    let task = serve(server, script.clone());
    let mut s = syncer(client);

    let first = sync_once(&mut s, &rules, &live).await;
    assert!(first.retry);
    assert!(
        matches!(&first.written()[0].outcome, Outcome::Failed(_)),
        "{:?}",
        outcomes(&first)
    );
    assert_eq!(script.rbac().len(), 1, "the binding waits for its role");
    let second = sync_once(&mut s, &rules, &live).await;
    assert!(!second.retry, "{:?}", outcomes(&second));
    assert_eq!(script.rbac().len(), 3);
    drop(s);
    task.await.expect("server");
    assert_eq!(script.unanswered(), 0);
}

/// 429 with Retry-After: the client stack `rbac-rules run` uses (kube's
/// default retry layer) waits what the server asks, then sends the same
/// apply once more; the reconcile sees one successful write.
#[tokio::test(start_paused = true)]
async fn a_429_is_retried_after_the_servers_delay_with_the_same_body() {
    let rules = rules(vec![rule("widgets", spec(), None)]);
    let wanted = desired(&rules);
    let live = drifted(&wanted);
    let (client, server) = pair_with_retries();
    let script = Script::with(vec![Answer::Throttle(7), Answer::Ok, Answer::Ok]);
    let task = serve(server, script.clone());
    let mut s = syncer(client);

    let report = sync_once(&mut s, &rules, &live).await;
    assert!(!report.retry, "{:?}", outcomes(&report));
    assert!(
        report.written().iter().all(|w| w.outcome.is_applied()),
        "{:?}",
        outcomes(&report)
    );
    assert_eq!(
        script.rbac(),
        vec![
            format!("PATCH {}", role_path()),
            format!("PATCH {}", role_path()),
            format!("PATCH {}", binding_path()),
        ]
    );
    let at = script.at.lock().expect("lock").clone();
    assert!(
        at[1] - at[0] >= std::time::Duration::from_secs(7),
        "retried after {:?}, before the server's Retry-After",
        at[1] - at[0]
    );
    let bodies = script.bodies.lock().expect("lock").clone();
    assert_eq!(bodies[0], bodies[1], "the retry sends the same apply");
    drop(s);
    task.await.expect("server");
}

/// A restart in the middle of a write pass: the stopping replica writes
/// nothing after the gate closes, and the next one (fresh memory, the
/// cache as the watches see the cluster) writes only what is missing.
#[tokio::test]
async fn a_restart_mid_pass_finishes_the_work_without_writing_twice() {
    let rules = rules(vec![rule("widgets", spec(), None)]);
    let wanted = desired(&rules);
    let live = drifted(&wanted);
    let gate = Arc::new(Gate::new(true));
    let (client, server) = pair();
    let script = Script::with(vec![Answer::OkThenStop(gate.clone()), Answer::Ok]);
    let task = serve(server, script.clone());
    let mut stopping = Syncer::new(
        client.clone(),
        ManageLevel::All,
        Metrics::new(),
        gate.clone(),
        Some("old".into()),
    );
    let first = sync_once(&mut stopping, &rules, &live).await;
    assert_eq!(script.rbac(), vec![format!("PATCH {}", role_path())]);
    assert!(
        matches!(first.written()[1].outcome, Outcome::Skipped),
        "{:?}",
        outcomes(&first)
    );
    drop(stopping);

    // The new process: the role is live as applied, the binding still old.
    let mut after = live.clone();
    after.extend(owned(vec![wanted[0].clone()]));
    let mut restarted = syncer(client);
    let second = sync_once(&mut restarted, &rules, &after).await;
    assert!(!second.retry, "{:?}", outcomes(&second));
    assert_eq!(
        script.rbac(),
        vec![
            format!("PATCH {}", role_path()),
            format!("PATCH {}", binding_path()),
        ],
        "only the missing write is sent"
    );
    drop(restarted);
    task.await.expect("server");
    converged(&rules, &wanted).await;
}

fn rules_map(r: RbacRule) -> BTreeMap<String, RbacRule> {
    rules(vec![r])
}

/// The whole control loop against a fake API server that keeps what is
/// applied: the Namespace watch and the Role watch answer 410 Gone (the
/// watcher must list again), the ClusterRole watch is dropped (it must
/// watch again). The controller recovers, sees the second Namespace that
/// only the relist shows, writes each Role exactly once and deletes nothing.
#[tokio::test]
async fn gone_and_dropped_watches_relist_without_duplicate_writes_or_prunes() {
    use clap::Parser;
    use rbac_rules::controller::{RunArgs, run_with};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    let spec = json!({
        "trigger": {"kind": "Namespace", "metadataOnly": true},
        "outputs": [{"kind": "Role", "name": "viewer",
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}]
    });
    let rule_obj = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
        "metadata": {"name": "ns-viewer", "uid": "ns-viewer-uid", "generation": 1, "resourceVersion": "3"},
        "spec": spec});
    let (client, mut server) = pair();
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let roles: Arc<Mutex<BTreeMap<String, Value>>> = Arc::default();
    let scenario = {
        let log = log.clone();
        let roles = roles.clone();
        tokio::spawn(async move {
            let mut parked = Vec::new();
            let mut watched: BTreeMap<String, usize> = BTreeMap::new();
            let mut namespace_lists = 0;
            let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
                "message": "too old resource version: 1 (50)"}});
            let list = |kind: &str, rv: &str, items: Vec<Value>| {
                json!({"apiVersion": "v1", "kind": kind,
                "metadata": {"resourceVersion": rv}, "items": items})
            };
            let ns = |name: &str| {
                json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": {"name": name, "uid": format!("{name}-uid"), "resourceVersion": "40"}})
            };
            while let Some(r) = server.next_opt().await {
                let path = r.path.clone();
                if r.param("watch") == Some("true") {
                    let n = watched.entry(path.clone()).or_default();
                    *n += 1;
                    log.lock().expect("lock").push(format!("WATCH {path}"));
                    match (path.as_str(), *n) {
                        ("/api/v1/namespaces", 1)
                        | ("/apis/rbac.authorization.k8s.io/v1/roles", 1) => {
                            r.respond(200, gone.clone())
                        }
                        // An empty 200: the server closed the watch.
                        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", 1) => {
                            r.respond(200, Value::Null)
                        }
                        _ => parked.push(r),
                    }
                    continue;
                }
                log.lock()
                    .expect("lock")
                    .push(format!("{} {path}", r.method));
                match (r.method.as_str(), path.as_str()) {
                    ("GET", "/apis/rbacrules.io/v1alpha1/rbacrules") => {
                        r.respond(200, list("RbacRuleList", "3", vec![rule_obj.clone()]))
                    }
                    // No tenant rules.
                    ("GET", "/apis/rbacrules.io/v1alpha1/namespacedrbacrules") => {
                        r.respond(200, list("NamespacedRbacRuleList", "3", vec![]))
                    }
                    ("GET", "/apis/rbac.authorization.k8s.io/v1/roles") => {
                        let items = roles.lock().expect("lock").values().cloned().collect();
                        r.respond(200, list("RoleList", "60", items))
                    }
                    ("GET", p) if p.contains("/namespaces/") => {
                        // A look at one object before creating it.
                        let found = roles.lock().expect("lock").get(p).cloned();
                        match found {
                            Some(obj) => r.respond(200, obj),
                            None => r.not_found(),
                        }
                    }
                    ("GET", p) if p.starts_with("/apis/rbac.authorization.k8s.io/v1/") => {
                        r.respond(200, list("List", "60", vec![]))
                    }
                    ("GET", "/api") => r.respond(
                        200,
                        json!({"kind": "APIVersions",
                        "versions": ["v1"], "serverAddressByClientCIDRs": []}),
                    ),
                    ("GET", "/api/v1") => r.respond(
                        200,
                        json!({"kind": "APIResourceList",
                        "groupVersion": "v1", "resources": [{"name": "namespaces",
                        "singularName": "namespace", "namespaced": false, "kind": "Namespace",
                        "verbs": ["get", "list", "watch"]}]}),
                    ),
                    ("GET", "/api/v1/namespaces") => {
                        namespace_lists += 1;
                        // Only the relist shows team-b (created while the
                        // watch was gone).
                        let items = if namespace_lists == 1 {
                            vec![ns("team-a")]
                        } else {
                            vec![ns("team-a"), ns("team-b")]
                        };
                        r.respond(
                            200,
                            json!({"apiVersion": "meta.k8s.io/v1",
                            "kind": "PartialObjectMetadataList",
                            "metadata": {"resourceVersion": "50"}, "items": items}),
                        )
                    }
                    ("PATCH", p) if p.contains("/roles/") => {
                        let mut obj = r.body.clone();
                        obj["metadata"]["uid"] = json!(format!("{p}-uid"));
                        obj["metadata"]["resourceVersion"] = json!("61");
                        // As the API server records our apply.
                        obj["metadata"]["managedFields"] =
                            json!([support::cluster::our_apply_entry(&obj)]);
                        roles
                            .lock()
                            .expect("lock")
                            .insert(p.to_string(), obj.clone());
                        r.respond(200, obj)
                    }
                    ("PATCH", "/apis/rbacrules.io/v1alpha1/rbacrules/ns-viewer/status") => {
                        let mut obj = rule_obj.clone();
                        obj["status"] = r.body["status"].clone();
                        r.respond(200, obj)
                    }
                    ("POST" | "PATCH", p) if p.contains("/events") => {
                        let body = r.body.clone();
                        r.respond(201, body)
                    }
                    (m, p) => panic!("unexpected request {m} {p}"),
                }
            }
            drop(parked);
        })
    };

    let cli = Cli::parse_from([
        "rbac-rules",
        "--leader-election=false",
        "--metrics-address=127.0.0.1:0",
        "--debounce-ms=50",
        "--identity=test",
    ]);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let controller = tokio::spawn(run_with(client, cli.run, stop_rx));
    // Until both Roles are in, then a quiet second more to catch any
    // duplicate write.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while roles.lock().expect("lock").len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not converged: {:?}",
            log.lock().expect("lock")
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    stop_tx.send(true).expect("stop");
    tokio::time::timeout(std::time::Duration::from_secs(10), controller)
        .await
        .expect("the controller did not stop")
        .expect("controller task")
        .expect("controller result");
    scenario.await.expect("scenario");

    let log = log.lock().expect("lock").clone();
    let count = |line: &str| log.iter().filter(|l| l.as_str() == line).count();
    let role_a = "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles/viewer";
    let role_b = "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/team-b/roles/viewer";
    assert_eq!((count(role_a), count(role_b)), (1, 1), "{log:#?}");
    assert!(!log.iter().any(|l| l.starts_with("DELETE")), "{log:#?}");
    assert!(
        count("GET /api/v1/namespaces") >= 2,
        "relisted after 410: {log:#?}"
    );
    assert!(
        count("GET /apis/rbac.authorization.k8s.io/v1/roles") >= 2,
        "relisted after 410: {log:#?}"
    );
    assert!(
        count("WATCH /apis/rbac.authorization.k8s.io/v1/clusterroles") >= 2,
        "watched again after the drop: {log:#?}"
    );
}
