//! Parity with Crossplane's Helm chart v2.3.4 (tests/data/
//! crossplane-chart-v2.3.4.yaml): the built-in rules, run for a cluster
//! where the chart was installed with `rbacManager.deploy=false`, emit what
//! the chart would have installed with `deploy=true` — same names, labels,
//! aggregation and, flattened, the same grants — and never what the chart
//! installs in both modes.

use std::path::PathBuf;

use k8s_openapi::api::rbac::v1::PolicyRule;
use rbac_rules::api::ManageLevel;
use rbac_rules::policy::covers;
use rbac_rules::render::{RenderArgs, render};
use serde_json::Value;

fn path(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(p)
}

/// What the built-in rules emit (flattened) for a cluster with only
/// Crossplane's and its RBAC manager's Deployments.
fn ours() -> Vec<Value> {
    let args = RenderArgs {
        objects: vec![path(
            "tests/golden/crossplane-chart-deploy-false/objects.yaml",
        )],
        rules: vec![],
        flatten: true,
        manage: ManageLevel::All,
        allow: None,
        ..Default::default()
    };
    let text = render(&args).expect("the built-in rules render");
    serde_saphyr::from_multiple::<Value>(&text).expect("valid YAML")
}

fn chart() -> Vec<Value> {
    let text = std::fs::read_to_string(path("tests/data/crossplane-chart-v2.3.4.yaml"))
        .expect("chart test data");
    serde_saphyr::from_multiple::<Value>(&text).expect("valid YAML")
}

fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn rules_of(o: &Value) -> Vec<PolicyRule> {
    serde_json::from_value(o.get("rules").cloned().unwrap_or(Value::Array(vec![])))
        .expect("rules parse")
}

/// The chart's roles as the aggregation controller fills them.
fn chart_flattened(chart: &[Value], role: &Value) -> Vec<PolicyRule> {
    let Some(selectors) = role["aggregationRule"]["clusterRoleSelectors"].as_array() else {
        return rules_of(role);
    };
    let mut out = Vec::new();
    for s in selectors {
        let want = s["matchLabels"].as_object().expect("matchLabels");
        for r in chart {
            let labels = &r["metadata"]["labels"];
            if r["kind"] == "ClusterRole" && want.iter().all(|(k, v)| &labels[k] == v) {
                out.extend(rules_of(r));
            }
        }
    }
    out
}

/// The only grant the chart makes that the rules do not: `impersonate` on
/// serviceaccounts (inside the system role's `serviceaccounts: *`), which
/// the default denials refuse.
fn impersonate() -> PolicyRule {
    serde_json::from_value(serde_json::json!(
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]}
    ))
    .expect("rule")
}

#[test]
fn every_chart_object_is_emitted_with_its_labels_aggregation_and_grants() {
    let ours = ours();
    let chart = chart();
    assert_eq!(chart.len(), 11, "the chart's deploy=true RBAC objects");
    for theirs in &chart {
        let kind = theirs["kind"].as_str().expect("kind");
        let name = theirs["metadata"]["name"].as_str().expect("name");
        let o = find(&ours, kind, name).unwrap_or_else(|| panic!("{kind} {name} not emitted"));
        // Labels: the chart's own, not Helm's bookkeeping.
        for (k, v) in theirs["metadata"]["labels"].as_object().expect("labels") {
            if k.starts_with("app.kubernetes.io/") || k.starts_with("helm.sh/") {
                continue;
            }
            assert_eq!(&o["metadata"]["labels"][k], v, "{kind} {name}: label {k}");
        }
        for k in o["metadata"]["labels"].as_object().expect("labels").keys() {
            assert!(
                theirs["metadata"]["labels"].get(k).is_some()
                    || k == "app.kubernetes.io/managed-by"
                    || k.starts_with("rbacrules.io/"),
                "{kind} {name}: label {k} is not the chart's"
            );
        }
        assert_eq!(
            o.get("aggregationRule"),
            theirs.get("aggregationRule"),
            "{kind} {name}: aggregationRule"
        );
        if kind == "ClusterRoleBinding" {
            assert_eq!(o["roleRef"], theirs["roleRef"], "{name}: roleRef");
            assert_eq!(o["subjects"], theirs["subjects"], "{name}: subjects");
            continue;
        }
        let (mine, chart_rules) = (rules_of(o), deviate(chart_flattened(&chart, theirs)));
        let (ok, extra) = covers(&chart_rules, &mine);
        assert!(ok, "{name} grants more than the chart: {extra:?}");
        let (ok, missing) = covers(&mine, &chart_rules);
        assert!(ok, "{name} lacks what the chart grants: {missing:?}");
    }
}

/// Every verb of serviceaccounts but `impersonate`.
const SERVICEACCOUNT_VERBS: [&str; 8] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// The chart's rules with the one documented deviation: `*` on core
/// serviceaccounts becomes every verb but `impersonate`, which the default
/// denials refuse.
fn deviate(rules: Vec<PolicyRule>) -> Vec<PolicyRule> {
    let mut out = Vec::new();
    for mut r in rules {
        let core = r.api_groups.as_deref() == Some(&["".to_string()][..]);
        let resources = r.resources.clone().unwrap_or_default();
        if core && r.verbs == ["*"] && resources.iter().any(|x| x == "serviceaccounts") {
            let mut sa = r.clone();
            sa.resources = Some(vec!["serviceaccounts".into()]);
            sa.verbs = SERVICEACCOUNT_VERBS.iter().map(|v| v.to_string()).collect();
            out.push(sa);
            r.resources = Some(
                resources
                    .into_iter()
                    .filter(|x| x != "serviceaccounts")
                    .collect(),
            );
        }
        if !r.resources.as_ref().is_some_and(Vec::is_empty) {
            out.push(r);
        }
    }
    out
}

#[test]
fn the_system_role_grants_everything_but_impersonation_on_serviceaccounts() {
    let ours = ours();
    let system = rules_of(
        find(
            &ours,
            "ClusterRole",
            "crossplane:system:aggregate-to-crossplane",
        )
        .expect("system role"),
    );
    assert!(!covers(&system, &[impersonate()]).0);
    let rest: Vec<PolicyRule> = SERVICEACCOUNT_VERBS
        .iter()
        .map(|v| {
            serde_json::from_value(serde_json::json!(
                {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": [v]}
            ))
            .expect("rule")
        })
        .collect();
    assert!(covers(&system, &rest).0);
}

#[test]
fn never_what_the_chart_installs_in_both_modes() {
    let ours = ours();
    assert!(find(&ours, "ClusterRole", "crossplane").is_none());
    assert!(find(&ours, "ClusterRoleBinding", "crossplane").is_none());
}

#[test]
fn crossplanes_service_account_gets_the_aggregated_types_under_a_name_of_its_own() {
    let ours = ours();
    let role = find(&ours, "ClusterRole", "crossplane:rbac-rules").expect("role");
    assert_eq!(
        role["aggregationRule"]["clusterRoleSelectors"],
        serde_json::json!([{"matchLabels": {"rbac.crossplane.io/aggregate-to-crossplane": "true"}}])
    );
    let binding = find(&ours, "ClusterRoleBinding", "crossplane:rbac-rules").expect("binding");
    assert_eq!(binding["roleRef"]["name"], "crossplane:rbac-rules");
    // Crossplane's Deployment (app: crossplane), not the RBAC manager's.
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"apiGroup": "", "kind": "ServiceAccount",
            "name": "crossplane", "namespace": "crossplane-system"}])
    );
}
