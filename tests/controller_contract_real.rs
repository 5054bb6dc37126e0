//! HTTP contract of the controller for what a real API server showed
//! (tests/e2e.rs on the control plane of ../shared/testbed, kube-apiserver
//! v1.32) and the scripted server of tests/controller_http.rs did not
//! model:
//!
//! - Role and ClusterRole carry `rules` without omitempty: a role with no
//!   rules (written as `rules: []`, or aggregated with nothing to
//!   aggregate yet) comes back as `"rules": null`. That is no drift.
//! - The admission fence (deploy/admission.yaml) answers a refused write
//!   with 403 Forbidden, and with 422 Invalid when one of its expressions
//!   errs; the message names the ValidatingAdmissionPolicy. The refused
//!   role's binding is held back and the fence's words reach the rule's
//!   condition and Event.

mod support;

use std::collections::BTreeMap;

use http::Method;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use rbac_rules::api::RbacRuleStatus;
use serde_json::{Value, json};
use support::api::{owned, pair, rule, rules, snapshot, store, syncer};

const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
const CLUSTER_ROLES: &str = "/apis/rbac.authorization.k8s.io/v1/clusterroles";
const STATUS: &str = "/apis/rbacrules.io/v1alpha1/rbacrules/static/status";

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: Some(1),
        last_transition_time: Time("2026-01-01T00:00:00Z".parse().expect("timestamp")),
    }
}

/// The status of a healthy static rule managing `objects` objects.
fn ready_status(objects: i64) -> RbacRuleStatus {
    RbacRuleStatus {
        conditions: vec![
            condition("Ready", "True", "Reconciled", "every output is applied"),
            condition("Degraded", "False", "AsExpected", "no problems"),
        ],
        observed_generation: Some(1),
        matched_triggers: 0,
        managed_objects: objects,
    }
}

fn provenance() -> (Value, Value) {
    (
        json!({"app.kubernetes.io/managed-by": "rbac-rules", "rbacrules.io/rule": "static"}),
        json!({"rbacrules.io/rule": "static"}),
    )
}

/// A ClusterRole as the real server returns it: `rules: null` when empty.
fn served_cluster_role(name: &str, aggregation: Option<Value>) -> Value {
    let (labels, annotations) = provenance();
    let mut o = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "rules": null,
    });
    if let Some(a) = aggregation {
        o["aggregationRule"] = a;
    }
    o
}

#[tokio::test]
async fn roles_without_rules_served_as_null_are_not_drift() {
    let (client, server) = pair();
    let aggregation = json!({"clusterRoleSelectors": [{"matchLabels": {"example.org/aggregate-to-admin": "true"}}]});
    let spec = json!({
        "outputs": [
            {"kind": "ClusterRole", "name": "widgets-admin", "aggregationRule": aggregation},
            {"kind": "ClusterRole", "name": "widgets-none", "rules": []},
        ]
    });
    let rules = rules(vec![rule("static", spec, Some(ready_status(2)))]);
    let observed = store(vec![]);
    let owned = owned(vec![
        served_cluster_role("widgets-admin", Some(aggregation.clone())),
        served_cluster_role("widgets-none", None),
    ]);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(server.done());
    let mut s = syncer(client);
    for _ in 0..2 {
        let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
        assert!(report.plan.is_empty(), "{:?}", report.plan);
        assert_eq!(report.plan.unchanged.len(), 2);
        assert_eq!(report.status_patches, 0);
    }
    drop(s);
    scenario.await.expect("scenario");
}

/// The bodies kube-apiserver v1.32 sent when the fence refused a write
/// (403) and when one of its expressions erred (422).
fn fence_refusal(code: u16, role: &str) -> (Value, &'static str) {
    let policy = "ValidatingAdmissionPolicy 'rbac-rules-fence' with binding 'rbac-rules-fence' denied request";
    let (reason, why) = match code {
        403 => (
            "Forbidden",
            "the rbac-rules controller may not grant escalate, bind or impersonate".to_string(),
        ),
        _ => (
            "Invalid",
            "expression 'object.rules.all(r, r.verbs.size() > 0)' resulted in error: got 'types.Null', expected iterable type".to_string(),
        ),
    };
    let cause = format!("{policy}: {why}");
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("clusterroles.rbac.authorization.k8s.io \"{role}\" is forbidden: {cause}"),
        "reason": reason,
        "details": {"name": role, "group": "rbac.authorization.k8s.io", "kind": "clusterroles",
                    "causes": [{"message": cause}]},
        "code": code,
    });
    (body, reason)
}

async fn refused_role_holds_back_its_binding(code: u16) {
    let (client, mut server) = pair();
    let spec = json!({
        "outputs": [
            {"kind": "ClusterRole", "name": "widgets-admin",
             "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.org/aggregate-to-admin": "true"}}]}},
            {"kind": "ClusterRoleBinding", "name": "widgets-admin",
             "roleRef": {"kind": "ClusterRole", "name": "widgets-admin"},
             "subjects": [{"kind": "Group", "name": "widget-admins"}]}
        ]
    });
    let rules = rules(vec![rule("static", spec, None)]);
    let observed = store(vec![]);
    let owned = owned(vec![]);
    let holds = BTreeMap::new();
    let (body, reason) = fence_refusal(code, "widgets-admin");
    let scenario = tokio::spawn(async move {
        server
            .next()
            .await
            .expect_create(&format!("{CLUSTER_ROLES}/widgets-admin"))
            .respond(code, body);
        // No binding to a role that is not there: straight to the status.
        let status = server.next().await.expect(Method::PATCH, STATUS);
        let conditions = status.body["status"]["conditions"].clone();
        let reply = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": "static"}, "spec": {"outputs": []}});
        status.respond(200, reply);
        let mut events = Vec::new();
        while let Some(e) = server.next_opt().await {
            let e = e.expect(Method::POST, EVENTS);
            events.push(e.body.clone());
            let b = e.body.clone();
            e.respond(201, b);
        }
        (conditions, events)
    });
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
    drop(s);
    let (conditions, events) = scenario.await.expect("scenario");
    assert!(report.retry, "a refused write is tried again");
    let degraded = conditions
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "Degraded")
        .unwrap_or_else(|| panic!("a Degraded condition: {conditions}"))
        .clone();
    assert_eq!(degraded["status"], "True", "{degraded}");
    assert_eq!(degraded["reason"], reason, "{degraded}");
    let message = degraded["message"].as_str().expect("message");
    for needle in [
        "ClusterRole widgets-admin",
        "ValidatingAdmissionPolicy 'rbac-rules-fence'",
        "ClusterRoleBinding widgets-admin",
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
    let warning = events
        .iter()
        .find(|e| e["type"] == "Warning" && e["reason"] == reason)
        .unwrap_or_else(|| panic!("a Warning Event {reason}: {events:?}"));
    let note = warning["note"].as_str().expect("note");
    assert!(
        note.contains("ClusterRole widgets-admin") && note.contains("rbac-rules-fence"),
        "{note}"
    );
}

#[tokio::test]
async fn a_role_the_fence_forbids_holds_back_its_binding_and_names_the_fence() {
    refused_role_holds_back_its_binding(403).await;
}

#[tokio::test]
async fn a_role_the_fence_cannot_evaluate_holds_back_its_binding_and_names_the_fence() {
    refused_role_holds_back_its_binding(422).await;
}
