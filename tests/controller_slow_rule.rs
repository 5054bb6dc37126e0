//! A slow rule does not hold back other rules' writes: the evaluation
//! bounds each rule's wall time (`--max-seconds-per-rule`), the triggers
//! cut off are `LimitExceeded` errors of the slow rule (its objects kept),
//! and what they failed on is remembered, so a later reconcile renders only
//! what changed. The reconcile runs against the scripted API server of
//! `tests/support`, which records when each request arrives.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Method;
use rbac_rules::controller::sync::Syncer;
use rbac_rules::engine::Limits;
use serde_json::{Value, json};
use support::{ApiServer, namespace, owned, pair, rule, rules, snapshot, store, syncer};

/// Namespaces the rules trigger on.
const NAMESPACES: usize = 12;
/// Time the slow rule spends on each trigger (its per-trigger limit).
const PER_TRIGGER: f64 = 1.0;
/// The slow rule's time in one evaluation.
const PER_RULE: f64 = 1.5;

/// One request as it arrived: when (since the test started), method, path
/// and the `rbacrules.io/rule` label of its body.
#[derive(Clone, Debug)]
struct Seen {
    at: Duration,
    method: Method,
    path: String,
    rule: Option<String>,
    body: Value,
}

/// Answers every request (applies echoed, statuses and Events accepted)
/// and records it, until the client is gone.
fn serve(mut server: ApiServer, start: Instant, log: Arc<Mutex<Vec<Seen>>>) {
    tokio::spawn(async move {
        while let Some(r) = server.next_opt().await {
            let seen = Seen {
                at: start.elapsed(),
                method: r.method.clone(),
                path: r.path.clone(),
                rule: r.body["metadata"]["labels"]["rbacrules.io/rule"]
                    .as_str()
                    .map(str::to_string),
                body: r.body.clone(),
            };
            log.lock().expect("log").push(seen);
            match r.method {
                Method::DELETE => r.deleted(),
                Method::GET => r.not_found(),
                _ => r.echo(),
            }
        }
    });
}

fn slow() -> Value {
    // 10^9 iterations of an empty body per trigger: only time stops it.
    let csv: Vec<String> = (0..1000).map(|i| format!("i{i}")).collect();
    json!({
        "trigger": {"kind": "Namespace"},
        "vars": [{"name": "xs", "value": format!("split \"{}\" \",\"", csv.join(","))}],
        "outputs": [{"kind": "Role", "name": "x{{#each vars.xs}}{{#each @root.vars.xs}}{{#each @root.vars.xs}}{{/each}}{{/each}}{{/each}}"}],
    })
}

fn fast() -> Value {
    json!({
        "trigger": {"kind": "Namespace"},
        "outputs": [{"kind": "Role", "name": "reader",
                     "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}],
    })
}

fn limits() -> Limits {
    Limits {
        seconds_per_trigger: PER_TRIGGER,
        seconds_per_rule: PER_RULE,
        ..Limits::default()
    }
}

/// The fast rule's Role applies in `log`, by namespace, with when each
/// arrived.
fn fast_writes(log: &[Seen]) -> Vec<(String, Duration)> {
    log.iter()
        .filter(|s| s.method == Method::PATCH && s.rule.as_deref() == Some("fast"))
        .map(|s| {
            let ns = s.body["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (ns, s.at)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_rule_does_not_hold_back_the_fast_rules_writes() {
    // The slow rule sorts first, so it is evaluated first: unbounded, it
    // would take NAMESPACES × PER_TRIGGER = 12 s before anything is written.
    let rules = rules(vec![
        rule("a-slow", slow(), None),
        rule("fast", fast(), None),
    ]);
    let mut objects: Vec<Value> = (0..NAMESPACES)
        .map(|i| namespace(&format!("ns-{i:02}"), json!({})))
        .collect();
    let observed = store(objects.clone());
    let holds = std::collections::BTreeMap::new();
    let no_live = owned(vec![]);

    let (client, server) = pair();
    let log = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    serve(server, start, log.clone());
    let mut s: Syncer = syncer(client).with_limits(limits());

    let report = s.sync(&snapshot(&rules, &observed, &no_live, &holds)).await;
    let took = start.elapsed();

    // Every fast Role was written, each well before the slow rule alone
    // would have finished (12 s): the slow rule had PER_RULE seconds.
    let seen = log.lock().expect("log").clone();
    let writes = fast_writes(&seen);
    assert_eq!(writes.len(), NAMESPACES, "{:?}", report.plan.applies);
    let unbounded = Duration::from_secs_f64(NAMESPACES as f64 * PER_TRIGGER);
    let last = writes.iter().map(|(_, at)| *at).max().expect("a write");
    assert!(
        last < unbounded * 2 / 3,
        "the fast rule's last write came at {last:?}, the slow rule alone takes {unbounded:?}"
    );
    assert!(took < unbounded, "the reconcile took {took:?}");
    // Nothing of the slow rule was written or deleted; its triggers are
    // errors of the slow rule, reported on its status.
    assert!(
        seen.iter()
            .all(|s| s.rule.as_deref() != Some("a-slow") || s.path.ends_with("/status")),
        "{seen:?}"
    );
    assert!(seen.iter().all(|s| s.method != Method::DELETE));
    let status = seen
        .iter()
        .find(|s| s.path.ends_with("/rbacrules/a-slow/status"))
        .expect("the slow rule's status");
    let text = status.body.to_string();
    assert!(text.contains("LimitExceeded"), "{text}");
    assert!(text.contains("--max-seconds-per-rule"), "{text}");

    // A new Namespace: the next reconcile renders that trigger alone (the
    // slow rule's other triggers stay as they failed), so the fast rule's
    // write for it waits at most one trigger's time of the slow rule.
    let live: Vec<Value> = seen
        .iter()
        .filter(|s| s.method == Method::PATCH && s.rule.as_deref() == Some("fast"))
        .map(|s| s.body.clone())
        .collect();
    let live = owned(live);
    objects.push(namespace("ns-new", json!({})));
    let observed = store(objects);
    let before = log.lock().expect("log").len();
    let again = Instant::now();
    let report = s.sync(&snapshot(&rules, &observed, &live, &holds)).await;
    let took = again.elapsed();
    let seen = log.lock().expect("log").clone();
    let writes = fast_writes(&seen[before..]);
    assert_eq!(
        writes.iter().map(|(ns, _)| ns.as_str()).collect::<Vec<_>>(),
        vec!["ns-new"],
        "{:?}",
        report.plan.applies
    );
    assert!(
        took < Duration::from_secs_f64(PER_RULE + 2.0),
        "the second reconcile took {took:?}"
    );
}
