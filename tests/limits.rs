//! No rule can abort, hang or starve the process: each hostile rule below is
//! an error on that rule (naming the limit and its flag), the process exits
//! normally, and a good rule beside it still renders.
//!
//! Each case runs the CLI first, so that a regression shows up as a crashed
//! child (exit 134, a signal) rather than an aborted test process, then the
//! library, to see the good rule's outputs and the kept trigger.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rbac_rules::controller::apply::Gate;
use rbac_rules::controller::metrics::Metrics;
use rbac_rules::controller::sync::Syncer;
use rbac_rules::engine::{Engine, ErrorKind, Evaluation, Limits, ObjectStore, Options, RuleSource};
use serde_json::json;
use support::{namespace, owned, pair, rule, rules, snapshot, store};

const NAMESPACE: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a\n  uid: u-1\n";
const TRIGGER_REF: &str = "Namespace/team-a";

const GOOD: &str = r#"apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: good}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: Role
    name: reader
    rules:
    - {apiGroups: [""], resources: [pods], verbs: [get]}
"#;

/// The rule `bad`, triggered by every Namespace, with `body` under spec.
fn bad(body: &str) -> String {
    format!(
        "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRule\nmetadata: {{name: bad}}\nspec:\n  trigger: {{kind: Namespace}}\n{body}"
    )
}

/// Both rules in one file, bad first.
fn rules_text(bad_rule: &str) -> String {
    format!("{bad_rule}---\n{GOOD}")
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn render(rules: &str, extra: &[&str]) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules_path = dir.path().join("rules.yaml");
    let objects_path = dir.path().join("objects.yaml");
    std::fs::write(&rules_path, rules).expect("write rules");
    std::fs::write(&objects_path, NAMESPACE).expect("write objects");
    let out = Command::new(env!("CARGO_BIN_EXE_rbac-rules"))
        .arg("render")
        .arg("--rules")
        .arg(&rules_path)
        .arg("--objects")
        .arg(&objects_path)
        .args(extra)
        .output()
        .expect("run rbac-rules");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `render` exits 1 (not a crash), prints nothing, and names every needle.
fn assert_cli_fails(r: &Run, needles: &[&str]) {
    assert_eq!(
        r.code,
        Some(1),
        "exit status (None: killed by a signal); stderr: {}",
        r.stderr
    );
    assert!(r.stdout.is_empty(), "nothing on stdout, got: {}", r.stdout);
    for n in needles {
        assert!(r.stderr.contains(n), "stderr lacks {n:?}:\n{}", r.stderr);
    }
}

fn evaluate(rules: &str, options: Options) -> Evaluation {
    let sources: Vec<RuleSource> =
        rbac_rules::rules::parse_text(std::path::Path::new("rules.yaml"), rules)
            .expect("rules parse");
    let mut store = ObjectStore::new();
    store
        .insert(json!({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": "team-a", "uid": "u-1"}}))
        .expect("insert");
    Engine::new(&sources, options).evaluate(&store)
}

/// The good rule rendered; the bad one has one error of `kind` whose
/// message has `needle`, and its trigger's live objects are kept.
fn assert_isolated(eval: &Evaluation, kind: ErrorKind, needle: &str, at_trigger: bool) {
    let good: Vec<_> = eval.desired.iter().filter(|d| &*d.rule == "good").collect();
    assert_eq!(good.len(), 1, "the good rule still renders");
    assert_eq!(good[0].name, "reader");
    assert!(eval.desired.iter().all(|d| &*d.rule != "bad"));
    let report = &eval.reports["bad"];
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    let e = &report.errors[0];
    assert_eq!(e.kind, kind, "{e}");
    assert!(e.message.contains(needle), "{e}");
    if at_trigger {
        assert_eq!(e.trigger.as_deref(), Some(TRIGGER_REF), "{e}");
    }
    assert!(
        eval.keeps("bad", Some(TRIGGER_REF)),
        "an error keeps what the trigger made before"
    );
    assert!(eval.reports["good"].errors.is_empty());
}

#[test]
fn a_recursive_inline_partial_is_refused_when_compiled() {
    let rule = bad(
        "  outputs:\n  - kind: Role\n    name: '{{#*inline \"r\"}}{{> r}}{{/inline}}{{> r}}'\n",
    );
    let text = rules_text(&rule);
    assert_cli_fails(
        &render(&text, &[]),
        &["rule \"bad\"", "spec.outputs[0].name", "not supported"],
    );
    assert_isolated(
        &evaluate(&text, Options::default()),
        ErrorKind::Template,
        "not supported",
        false,
    );
}

#[test]
fn a_plain_partial_is_refused_too() {
    let text = rules_text(&bad(
        "  outputs:\n  - kind: Role\n    name: 'x{{> other}}'\n",
    ));
    assert_cli_fails(&render(&text, &[]), &["rule \"bad\"", "partials"]);
}

#[test]
fn five_thousand_nested_ifs_exceed_the_template_depth() {
    let name = format!("{}x{}", "{{#if true}}".repeat(5000), "{{/if}}".repeat(5000));
    let text = rules_text(&bad(&format!(
        "  outputs:\n  - kind: Role\n    name: '{name}'\n"
    )));
    assert_cli_fails(
        &render(&text, &[]),
        &[
            "rule \"bad\"",
            "spec.outputs[0].name",
            "limit exceeded",
            "--max-template-depth",
        ],
    );
    assert_isolated(
        &evaluate(&text, Options::default()),
        ErrorKind::LimitExceeded,
        "--max-template-depth",
        false,
    );
}

#[test]
fn deeply_nested_subexpressions_exceed_the_template_depth() {
    let expr = format!("{}1{}", "(list ".repeat(5000), ")".repeat(5000));
    let text = rules_text(&bad(&format!(
        "  vars:\n  - name: deep\n    value: '{expr}'\n  outputs:\n  - kind: Role\n    name: x\n"
    )));
    assert_cli_fails(
        &render(&text, &[]),
        &["rule \"bad\"", "spec.vars[0].value", "--max-template-depth"],
    );
}

/// `vars` v0 … v40, each `helper vars.prev vars.prev`.
fn doubling(helper: &str, first: &str) -> String {
    let mut body = format!("  vars:\n  - name: v0\n    value: '{first}'\n");
    for i in 1..=40 {
        body.push_str(&format!(
            "  - name: v{i}\n    value: '{helper} vars.v{} vars.v{}'\n",
            i - 1,
            i - 1
        ));
    }
    body.push_str("  outputs:\n  - kind: Role\n    name: x\n");
    bad(&body)
}

/// A trigger-level limit: the CLI fails naming rule, trigger, `field` and
/// `flag`; the library keeps the good rule and the bad trigger's objects.
fn assert_trigger_limit(text: &str, field: &str, flag: &str) {
    assert_cli_fails(
        &render(text, &[]),
        &["rule \"bad\"", "(trigger Namespace/team-a)", field, flag],
    );
    assert_isolated(
        &evaluate(text, Options::default()),
        ErrorKind::LimitExceeded,
        flag,
        true,
    );
}

#[test]
fn a_list_doubled_forty_times_exceeds_the_list_length() {
    let text = rules_text(&doubling("append", "list \"a\" \"b\""));
    assert_trigger_limit(&text, "spec.vars[", "--max-list-length");
}

#[test]
fn a_nested_list_doubled_forty_times_exceeds_the_bytes() {
    // Two items at the top, 2^40 values inside: the list length alone
    // would not see it.
    let text = rules_text(&doubling("list", "list \"a\" \"b\""));
    assert_trigger_limit(&text, "spec.vars[", "--max-bytes-per-trigger");
}

#[test]
fn a_string_doubled_by_concat_exceeds_the_bytes() {
    let text = rules_text(&doubling("concat", "\"0123456789abcdef\""));
    assert_trigger_limit(&text, "spec.vars[", "--max-bytes-per-trigger");
}

/// A var `n` holding a list of `len` items.
fn items_var(len: usize) -> String {
    let csv: Vec<String> = (0..len).map(|i| format!("i{i}")).collect();
    let csv = csv.join(",");
    format!("  vars:\n  - name: xs\n    value: 'split \"{csv}\" \",\"'\n")
}

#[test]
fn four_nested_for_each_over_two_hundred_items_exceed_the_bytes() {
    let body = format!(
        "{}  outputs:\n  - kind: Role\n    name: x\n    rules:\n    - forEach: vars.xs\n      item:\n      - forEach: vars.xs\n        item:\n        - forEach: vars.xs\n          item:\n          - forEach: vars.xs\n            item: {{apiGroups: [''], resources: [pods], verbs: [get]}}\n",
        items_var(200)
    );
    let text = rules_text(&bad(&body));
    assert_trigger_limit(&text, "spec.outputs[0].rules", "--max-bytes-per-trigger");
}

#[test]
fn flattened_nested_for_each_exceeds_the_list_length() {
    let body = format!(
        "{}  outputs:\n  - kind: Role\n    name: x\n    rules:\n    - apiGroups: ['']\n      verbs: [get]\n      resources:\n      - forEach: vars.xs\n        items:\n        - forEach: vars.xs\n          items:\n          - forEach: vars.xs\n            items: ['p{{{{item}}}}']\n",
        items_var(200)
    );
    let text = rules_text(&bad(&body));
    assert_trigger_limit(
        &text,
        "spec.outputs[0].rules[0].resources",
        "--max-list-length",
    );
}

#[test]
fn nested_each_loops_stop_at_the_time_limit() {
    // 10^9 iterations of an empty body: no bytes, no helper calls; only
    // the time limit stops it (set low so the test stays fast).
    let body = format!(
        "{}  outputs:\n  - kind: Role\n    name: 'x{{{{#each vars.xs}}}}{{{{#each @root.vars.xs}}}}{{{{#each @root.vars.xs}}}}{{{{/each}}}}{{{{/each}}}}{{{{/each}}}}'\n",
        items_var(1000)
    );
    let text = rules_text(&bad(&body));
    assert_cli_fails(
        &render(&text, &["--max-seconds-per-trigger", "0.2"]),
        &[
            "rule \"bad\"",
            "(trigger Namespace/team-a)",
            "--max-seconds-per-trigger",
        ],
    );
}

#[test]
fn too_many_objects_per_trigger() {
    let body = format!(
        "{}  outputs:\n  - kind: Role\n    forEach: vars.xs\n    name: 'r-{{{{item}}}}'\n",
        items_var(20)
    );
    let text = rules_text(&bad(&body));
    let r = render(&text, &["--max-objects-per-trigger", "5"]);
    assert_cli_fails(&r, &["rule \"bad\"", "--max-objects-per-trigger"]);
    let options = Options {
        limits: Limits {
            objects_per_trigger: 5,
            ..Default::default()
        },
        ..Options::default()
    };
    assert_isolated(
        &evaluate(&text, options),
        ErrorKind::LimitExceeded,
        "--max-objects-per-trigger",
        true,
    );
}

#[test]
fn limits_are_set_by_flag_and_a_rule_within_them_renders() {
    let body = format!(
        "{}  outputs:\n  - kind: Role\n    name: x\n    rules:\n    - apiGroups: ['']\n      verbs: [get]\n      resources:\n      - forEach: vars.xs\n        items: ['p{{{{item}}}}']\n",
        items_var(10)
    );
    let text = rules_text(&bad(&body));
    let ok = render(&text, &[]);
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
    assert!(ok.stdout.contains("- pi9"), "{}", ok.stdout);
    assert_cli_fails(
        &render(&text, &["--max-list-length", "9"]),
        &["rule \"bad\"", "has 10 items", "limit 9, --max-list-length"],
    );
    let bad_flag = render(&text, &["--max-template-depth", "0"]);
    assert_eq!(bad_flag.code, Some(2), "clap refuses a depth of 0");
}

/// The controller's reconcile with a rule that would run for ever: the
/// evaluation stops at the time limit, runs off the runtime's worker (a
/// task on the only worker keeps running meanwhile), the good rule's
/// object is planned and the bad rule's live object is kept, not deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn the_controller_evaluates_off_the_runtime_and_keeps_the_bad_rules_objects() {
    let csv: Vec<String> = (0..1000).map(|i| format!("i{i}")).collect();
    let hang = json!({
        "trigger": {"kind": "Namespace"},
        "vars": [{"name": "xs", "value": format!("split \"{}\" \",\"", csv.join(","))}],
        "outputs": [{"kind": "Role", "name": "x{{#each vars.xs}}{{#each @root.vars.xs}}{{#each @root.vars.xs}}{{/each}}{{/each}}{{/each}}"}],
    });
    let good = json!({
        "trigger": {"kind": "Namespace"},
        "outputs": [{"kind": "Role", "name": "reader",
                     "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}],
    });
    let rules = rules(vec![rule("bad", hang, None), rule("good", good, None)]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let live = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "x", "namespace": "team-a",
            "labels": {"app.kubernetes.io/managed-by": "rbac-rules", "rbacrules.io/rule": "bad"},
            "annotations": {"rbacrules.io/rule": "bad", "rbacrules.io/trigger": "Namespace/team-a"}},
        "rules": [],
    });
    let owned = owned(vec![live]);
    let holds = BTreeMap::new();

    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = {
        let ticks = ticks.clone();
        tokio::spawn(async move {
            loop {
                ticks.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        })
    };
    let (client, _server) = pair();
    // Closed gate: the reconcile evaluates and plans, and writes nothing.
    let mut syncer = Syncer::new(
        client,
        rbac_rules::api::ManageLevel::All,
        Metrics::new(),
        Arc::new(Gate::new(false)),
        None,
    )
    .with_limits(Limits {
        seconds_per_trigger: 0.5,
        ..Limits::default()
    });
    let ticks_during = {
        let ticks = ticks.clone();
        tokio::spawn(async move {
            let before = ticks.load(Ordering::SeqCst);
            let report = syncer
                .sync(&snapshot(&rules, &observed, &owned, &holds))
                .await;
            (report, ticks.load(Ordering::SeqCst) - before)
        })
    };
    let (report, during) = ticks_during.await.expect("the reconcile task");
    ticker.abort();
    assert!(during > 0, "the other task ran while the engine evaluated");
    let planned: Vec<(&str, &str)> = report
        .plan
        .applies
        .iter()
        .map(|a| (&*a.rule, a.id.name.as_str()))
        .collect();
    assert_eq!(planned, vec![("good", "reader")]);
    assert!(report.plan.deletes.is_empty(), "{:?}", report.plan.deletes);
    assert!(
        report
            .plan
            .kept
            .iter()
            .any(|k| k.0.name == "x" && k.1.as_deref() == Some("bad")),
        "{:?}",
        report.plan.kept
    );
}
