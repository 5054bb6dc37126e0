//! A slow rule never holds back other rules' writes. In the control loop
//! (against the stand-in API server of `tests/support/cluster.rs`), a rule
//! that takes longer than `--slow-rule-seconds` in the main evaluation
//! moves to the slow lane: the main pass writes every other rule's objects
//! at once, and the slow rule's objects (or its `LimitExceeded` errors, past
//! its own limits) follow when it is done — on the first reconcile and on
//! every later change. A single reconcile ([`Syncer::sync`], against the
//! scripted API server of `tests/support`, which records when each request
//! arrives) bounds each rule's wall time by `--max-seconds-per-rule`.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Method;
use rbac_rules::controller::sync::Syncer;
use rbac_rules::engine::Limits;
use serde_json::{Value, json};
use support::api::{ApiServer, namespace, owned, pair, rule, rules, snapshot, store, syncer};

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

mod control_loop {
    //! The whole control loop: the slow lane.

    use std::time::{Duration, Instant};

    use kube::Api;
    use rbac_rules::api::RbacRule;
    use serde_json::{Value, json};

    use super::support::cluster::{Behaviour, Controller, FakeCluster};

    /// The slow lane's bound in these tests (`--slow-rule-seconds`).
    const LANE: &str = "--slow-rule-seconds=0.2";

    fn rule(name: &str, spec: Value) -> Value {
        json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": name, "uid": format!("{name}-uid"), "generation": 1,
                         "resourceVersion": "1"},
            "spec": spec})
    }

    /// A rule that spends `iterations` empty loop turns on each Namespace
    /// and then emits its Role `slow` there.
    fn slow(iterations: usize) -> Value {
        let outer = iterations / 1000;
        let xs: Vec<String> = (0..1000).map(|i| format!("i{i}")).collect();
        let ys: Vec<String> = (0..outer.max(1)).map(|i| format!("j{i}")).collect();
        json!({
            "trigger": {"kind": "Namespace", "metadataOnly": true},
            "vars": [
                {"name": "xs", "value": format!("split \"{}\" \",\"", xs.join(","))},
                {"name": "ys", "value": format!("split \"{}\" \",\"", ys.join(","))}
            ],
            "outputs": [{"kind": "Role",
                "name": "slow{{#each vars.ys}}{{#each @root.vars.xs}}{{/each}}{{/each}}",
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}],
        })
    }

    /// A rule that never ends a trigger within its limits (10^9 empty
    /// loop turns per Namespace).
    fn endless() -> Value {
        let mut spec = super::slow();
        spec["trigger"]["metadataOnly"] = json!(true);
        spec
    }

    fn fast() -> Value {
        json!({
            "trigger": {"kind": "Namespace", "metadataOnly": true},
            "outputs": [{"kind": "Role", "name": "reader",
                         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}],
        })
    }

    /// Positions in the request log of the applies of Roles named `name`
    /// (in `namespace`, when given).
    fn applies(log: &[String], name: &str, namespace: Option<&str>) -> Vec<usize> {
        log.iter()
            .enumerate()
            .filter(|(_, l)| {
                l.starts_with("PATCH ")
                    && l.ends_with(&format!("/roles/{name}"))
                    && namespace.is_none_or(|ns| l.contains(&format!("/namespaces/{ns}/")))
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// The status of rule `name` as the stand-in holds it, as JSON.
    async fn status_of(api: &Api<RbacRule>, name: &str) -> Value {
        let list = api.list(&Default::default()).await.expect("rules");
        let rule = list
            .items
            .into_iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))
            .expect("rule");
        serde_json::to_value(&rule.status).expect("json")
    }

    /// Waits up to `limit` until rule `name`'s status satisfies `done`.
    async fn until_status(
        api: &Api<RbacRule>,
        name: &str,
        limit: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let status = status_of(api, name).await;
            if done(&status) {
                return status;
            }
            assert!(Instant::now() < deadline, "{name}: {status}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether a status says Ready True.
    fn ready(status: &Value) -> bool {
        status["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    }

    fn roles(fake: &FakeCluster, name: &str) -> usize {
        fake.rbac()
            .keys()
            .filter(|p| p.ends_with(&format!("/roles/{name}")))
            .count()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_fast_rules_writes_never_wait_for_the_slow_lane() {
        const NAMESPACES: usize = 6;
        // About 0.5 s per Namespace in a debug build on an idle machine
        // (1 s and more when loaded): 3 s in all, 15 times the lane's 0.2 s.
        let rules = vec![rule("a-slow", slow(1_500_000)), rule("fast", fast())];
        let names: Vec<String> = (0..NAMESPACES).map(|i| format!("ns-{i:02}")).collect();
        let (client, fake) = FakeCluster::start(rules, &names, Behaviour::default());
        let start = Instant::now();
        let flags = [
            LANE,
            "--max-seconds-per-trigger=120",
            "--max-seconds-per-rule=300",
            "--max-seconds-per-evaluation=600",
        ];
        let controller = Controller::start(client.clone(), &flags);
        fake.until(Duration::from_secs(60), "every fast Role", |f| {
            roles(f, "reader") == NAMESPACES
        })
        .await;
        let fast_done = start.elapsed();
        fake.until(Duration::from_secs(300), "every slow Role", |f| {
            roles(f, "slow") == NAMESPACES
        })
        .await;
        let slow_done = start.elapsed();
        let log = fake.log();
        let fast_at = applies(&log, "reader", None);
        let slow_at = applies(&log, "slow", None);
        // Each object written once, and every fast one before any slow one:
        // the first reconcile did not wait for the slow rule.
        assert_eq!(fast_at.len(), NAMESPACES, "{log:#?}");
        assert_eq!(slow_at.len(), NAMESPACES, "{log:#?}");
        assert!(
            fast_at.iter().max() < slow_at.iter().min(),
            "a slow Role was written before a fast one: {log:#?}"
        );
        // Both rules report Ready once done.
        let api: Api<RbacRule> = Api::all(client.clone());
        for name in ["a-slow", "fast"] {
            until_status(&api, name, Duration::from_secs(30), ready).await;
        }

        // A new Namespace, which both rules read: the fast Role for it is
        // written before the slow one, each once, nothing else is written.
        let before = fake.log().len();
        let again = Instant::now();
        fake.add_namespace("ns-new");
        fake.until(Duration::from_secs(30), "the fast Role in ns-new", |f| {
            applies(&f.log(), "reader", Some("ns-new")).len() == 1
        })
        .await;
        let fast_again = again.elapsed();
        fake.until(Duration::from_secs(120), "the slow Role in ns-new", |f| {
            applies(&f.log(), "slow", Some("ns-new")).len() == 1
        })
        .await;
        let slow_again = again.elapsed();
        // Let any further pass run: it must write nothing.
        tokio::time::sleep(Duration::from_secs(1)).await;
        controller.stop().await;
        let log = fake.log();
        let new = &log[before..];
        let fast_new = applies(new, "reader", None);
        let slow_new = applies(new, "slow", None);
        assert_eq!(fast_new.len(), 1, "{new:#?}");
        assert_eq!(slow_new.len(), 1, "{new:#?}");
        assert!(fast_new[0] < slow_new[0], "{new:#?}");
        // Nothing else is written or deleted.
        let other = |l: &&String| {
            l.starts_with("DELETE")
                || (l.starts_with("PATCH") && l.contains("/roles/") && !l.contains("/ns-new/"))
        };
        assert_eq!(new.iter().filter(other).count(), 0, "{new:#?}");

        // A restart writes nothing but what changed: a Namespace added as it
        // starts. Its slow Role comes from a slow lane that has rendered
        // every Namespace, so any other write would have come before it.
        let before = fake.log().len();
        let controller = Controller::start(client.clone(), &flags);
        fake.add_namespace("ns-late");
        fake.until(Duration::from_secs(300), "the Roles in ns-late", |f| {
            let log = f.log();
            applies(&log[before..], "reader", Some("ns-late")).len() == 1
                && applies(&log[before..], "slow", Some("ns-late")).len() == 1
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        controller.stop().await;
        let log = fake.log();
        let restart = &log[before..];
        let writes: Vec<&String> = restart
            .iter()
            .filter(|l| {
                l.starts_with("DELETE") || (l.starts_with("PATCH") && l.contains("/roles/"))
            })
            .collect();
        assert_eq!(writes.len(), 2, "{restart:#?}");
        assert!(writes[0].ends_with("ns-late/roles/reader"), "{restart:#?}");
        assert!(writes[1].ends_with("ns-late/roles/slow"), "{restart:#?}");
        eprintln!(
            "first reconcile: fast Roles written by {fast_done:?}, slow ones by {slow_done:?}; \
             new Namespace: fast Role by {fast_again:?}, slow one by {slow_again:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rule_reading_a_slow_rules_outputs_goes_with_it_and_writes_once() {
        const NAMESPACES: usize = 4;
        // The slow rule emits a ClusterRole per Namespace; "copier" copies
        // its rules into a Role there (it reads what the slow rule emits).
        let mut slow_cr = slow(1_500_000);
        slow_cr["outputs"] = json!([{"kind": "ClusterRole",
            "name": "slow-{{trigger.metadata.name}}{{#each vars.ys}}{{#each @root.vars.xs}}{{/each}}{{/each}}",
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}]);
        let copier = json!({
            "trigger": {"kind": "Namespace", "metadataOnly": true},
            "outputs": [{"kind": "Role", "name": "copy",
                "rulesFrom": {"clusterRoleNames": ["slow-{{trigger.metadata.name}}"]}}],
        });
        let rules = vec![
            rule("a-slow", slow_cr),
            rule("copier", copier),
            rule("fast", fast()),
        ];
        let names: Vec<String> = (0..NAMESPACES).map(|i| format!("ns-{i:02}")).collect();
        let (client, fake) = FakeCluster::start(rules, &names, Behaviour::default());
        let controller = Controller::start(
            client,
            &[
                LANE,
                "--max-seconds-per-trigger=120",
                "--max-seconds-per-rule=300",
            ],
        );
        fake.until(Duration::from_secs(300), "every copied Role", |f| {
            roles(f, "copy") == NAMESPACES
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        controller.stop().await;
        let log = fake.log();
        let fast_at = applies(&log, "reader", None);
        let copy_at = applies(&log, "copy", None);
        let slow_at: Vec<usize> = log
            .iter()
            .enumerate()
            .filter(|(_, l)| l.starts_with("PATCH ") && l.contains("/clusterroles/slow-"))
            .map(|(i, _)| i)
            .collect();
        // Each written once: the copier never rendered from the slow rule's
        // missing outputs (it would have written an empty Role first).
        assert_eq!(fast_at.len(), NAMESPACES, "{log:#?}");
        assert_eq!(copy_at.len(), NAMESPACES, "{log:#?}");
        assert_eq!(slow_at.len(), NAMESPACES, "{log:#?}");
        // The fast rule did not wait for either.
        let later = copy_at.iter().chain(&slow_at).min();
        assert!(fast_at.iter().max() < later, "{log:#?}");
        for (path, role) in fake.rbac() {
            if path.ends_with("/roles/copy") {
                assert_eq!(
                    role["rules"],
                    json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
                    "{path}"
                );
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_rule_past_its_own_limit_is_reported_and_holds_no_one_back() {
        const NAMESPACES: usize = 4;
        let rules = vec![rule("a-slow", endless()), rule("fast", fast())];
        let names: Vec<String> = (0..NAMESPACES).map(|i| format!("ns-{i:02}")).collect();
        let (client, fake) = FakeCluster::start(rules, &names, Behaviour::default());
        let controller = Controller::start(
            client.clone(),
            &[
                LANE,
                "--max-seconds-per-trigger=1",
                "--max-seconds-per-rule=3",
            ],
        );
        fake.until(Duration::from_secs(60), "every fast Role", |f| {
            roles(f, "reader") == NAMESPACES
        })
        .await;
        let fast_writes = fake.log().len();
        // Its errors are reported once the slow lane is cut off by the
        // rule's own limit (3 s), long after the fast Roles were written.
        let api: Api<RbacRule> = Api::all(client);
        let status = until_status(&api, "a-slow", Duration::from_secs(120), |s| {
            s.to_string().contains("LimitExceeded")
        })
        .await;
        // Let any further pass run: nothing of the slow rule is written.
        tokio::time::sleep(Duration::from_secs(1)).await;
        controller.stop().await;
        let log = fake.log();
        let fast_at = applies(&log, "reader", None);
        assert_eq!(fast_at.len(), NAMESPACES, "{log:#?}");
        assert!(fast_at.iter().all(|i| *i < fast_writes), "{log:#?}");
        assert!(applies(&log, "slow", None).is_empty(), "{log:#?}");
        assert!(log.iter().all(|l| !l.starts_with("DELETE")), "{log:#?}");
        // Its errors name the rule's own limit, not the lane's.
        let text = status.to_string();
        assert!(text.contains("LimitExceeded"), "{text}");
        assert!(text.contains("--max-seconds-per-rule"), "{text}");
        assert!(text.contains("limit 3s"), "{text}");
        assert!(!text.contains("0.2s"), "{text}");
    }
}
