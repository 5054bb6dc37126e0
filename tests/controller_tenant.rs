//! HTTP contract of the controller for tenant rules (NamespacedRbacRule):
//! a tenant rule's status goes to the namespaced object's status
//! subresource, its Events to its namespace about it, and a failure of
//! one rule's writes touches only that rule.
//!
//! Tenant rules are carried as RbacRules with their namespace, keyed
//! `<namespace>/<name>` (`rbac_rules::controller::tenants`).

mod support;

use std::collections::BTreeMap;

use http::Method;
use rbac_rules::api::RbacRule;
use rbac_rules::controller::status::Hold;
use rbac_rules::controller::tenants;
use serde_json::{Value, json};
use support::api::{namespace, pair, rule, snapshot, store, syncer};

const TENANT_STATUS: &str =
    "/apis/rbacrules.io/v1alpha1/namespaces/team-a/namespacedrbacrules/delegate/status";
const TENANT_EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/team-a/events";
const CLUSTER_STATUS: &str = "/apis/rbacrules.io/v1alpha1/rbacrules/z-cluster/status";
const DEFAULT_EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
const ROLES: &str = "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles/";

/// A tenant rule `team-a/delegate` as the tenant watch hands it over.
fn tenant(spec: Value) -> RbacRule {
    let mut r = rule("delegate", spec, None);
    r.metadata.namespace = Some("team-a".into());
    r
}

fn static_role() -> Value {
    json!({"outputs": [{"kind": "Role", "name": "pod-reader",
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]}]})
}

/// The namespace's ceiling: an `admin` ClusterRole (here: pods only).
fn admin_role() -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "admin", "uid": "admin-uid"},
        "rules": [{"apiGroups": [""], "resources": ["pods", "pods/exec"],
                   "verbs": ["get", "list", "watch", "create"]}]})
}

fn by_key(list: Vec<RbacRule>) -> BTreeMap<String, RbacRule> {
    list.into_iter().map(|r| (tenants::key_of(&r), r)).collect()
}

fn not_served() -> Hold {
    Hold::KindNotServed("Incident.example.org is not served by the API server".into())
}

/// The Event's subject is the NamespacedRbacRule itself, in its namespace.
fn assert_regarding_tenant(event: &Value) {
    assert_eq!(
        event["regarding"],
        json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "NamespacedRbacRule",
               "namespace": "team-a", "name": "delegate", "uid": "delegate-uid"}),
        "{event}"
    );
    assert_eq!(event["metadata"]["namespace"], "team-a", "{event}");
    assert_eq!(event["reportingController"], "rbac-rules");
}

#[tokio::test]
async fn a_held_tenant_rules_status_and_event_go_to_the_namespaced_object() {
    let (client, mut server) = pair();
    let rules = by_key(vec![tenant(static_role())]);
    assert!(rules.contains_key("team-a/delegate"));
    let observed = store(vec![]);
    let owned = BTreeMap::new();
    let holds = BTreeMap::from([("team-a/delegate".to_string(), not_served())]);
    let scenario = tokio::spawn(async move {
        let status = server.next().await.expect(Method::PATCH, TENANT_STATUS);
        assert_eq!(
            status.content_type.as_deref(),
            Some("application/merge-patch+json")
        );
        let conds = &status.body["status"]["conditions"];
        let degraded = conds
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Degraded"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(degraded["status"], "True", "{}", status.body);
        assert_eq!(degraded["reason"], "KindNotServed", "{}", status.body);
        assert_eq!(status.body["status"]["observedGeneration"], 1);
        let echoed = json!({"apiVersion": "rbacrules.io/v1alpha1",
            "kind": "NamespacedRbacRule",
            "metadata": {"name": "delegate", "namespace": "team-a"},
            "spec": static_role(), "status": status.body["status"].clone()});
        status.respond(200, echoed);

        let event = server.next().await.expect(Method::POST, TENANT_EVENTS);
        assert_eq!(event.body["reason"], "KindNotServed");
        assert_eq!(event.body["type"], "Warning");
        assert_regarding_tenant(&event.body);
        let body = event.body.clone();
        event.respond(201, body);
        server.done().await;
    });
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
    drop(s);
    scenario.await.expect("scenario");
    assert!(!report.retry);
}

#[tokio::test]
async fn a_failed_status_write_of_a_tenant_rule_touches_only_that_rule() {
    let (client, mut server) = pair();
    let mut cluster = rule("z-cluster", static_role(), None);
    cluster.metadata.namespace = None;
    let rules = by_key(vec![tenant(static_role()), cluster]);
    let observed = store(vec![]);
    let owned = BTreeMap::new();
    let holds = BTreeMap::from([
        ("team-a/delegate".to_string(), not_served()),
        ("z-cluster".to_string(), not_served()),
    ]);
    let scenario = tokio::spawn(async move {
        // The tenant's status write fails (its namespace's quota, a
        // webhook, ...): its Event still goes out, and the cluster rule
        // after it is reported as usual.
        let status = server.next().await.expect(Method::PATCH, TENANT_STATUS);
        status.respond(
            500,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "message": "etcd is sad", "reason": "InternalError", "code": 500}),
        );
        let event = server.next().await.expect(Method::POST, TENANT_EVENTS);
        assert_regarding_tenant(&event.body);
        let body = event.body.clone();
        event.respond(201, body);

        let status = server.next().await.expect(Method::PATCH, CLUSTER_STATUS);
        let echoed = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": "z-cluster"}, "spec": static_role(),
            "status": status.body["status"].clone()});
        status.respond(200, echoed);
        let event = server.next().await.expect(Method::POST, DEFAULT_EVENTS);
        assert_eq!(event.body["regarding"]["kind"], "RbacRule");
        assert_eq!(event.body["regarding"]["name"], "z-cluster");
        assert!(event.body["regarding"].get("namespace").is_none());
        let body = event.body.clone();
        event.respond(201, body);
        server.done().await;
    });
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
    drop(s);
    scenario.await.expect("scenario");
    assert!(report.retry, "the failed status write is retried");
    assert_eq!(report.status_patches, 1);
}

#[tokio::test]
async fn a_tenant_rules_role_is_applied_in_its_namespace_then_its_status_and_event() {
    let (client, mut server) = pair();
    let rules = by_key(vec![tenant(static_role())]);
    let observed = store(vec![namespace("team-a", json!({})), admin_role()]);
    let owned = BTreeMap::new();
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(async move {
        // Written under the engine's tenant name (no one else's name can be
        // it), in the rule's namespace.
        let apply = server
            .next()
            .await
            .expect_create(&format!("{ROLES}tenant:delegate:pod-reader"));
        assert_eq!(apply.body["metadata"]["namespace"], "team-a");
        assert_eq!(
            apply.body["metadata"]["annotations"]["rbacrules.io/rule"],
            "team-a/delegate"
        );
        assert_eq!(
            apply.body["rules"],
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}])
        );
        apply.echo();

        let status = server.next().await.expect(Method::PATCH, TENANT_STATUS);
        assert_eq!(status.body["status"]["managedObjects"], 1);
        let ready = status.body["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(ready["status"], "True", "{}", status.body);
        let echoed = json!({"apiVersion": "rbacrules.io/v1alpha1",
            "kind": "NamespacedRbacRule",
            "metadata": {"name": "delegate", "namespace": "team-a"},
            "spec": static_role(), "status": status.body["status"].clone()});
        status.respond(200, echoed);

        let event = server.next().await.expect(Method::POST, TENANT_EVENTS);
        assert_eq!(event.body["reason"], "Applied");
        assert_regarding_tenant(&event.body);
        let body = event.body.clone();
        event.respond(201, body);
        server.done().await;
    });
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
    drop(s);
    scenario.await.expect("scenario");
    assert!(!report.retry);
}

#[tokio::test]
async fn a_tenant_output_over_the_ceiling_is_refused_with_its_status_and_an_event_in_its_namespace()
{
    let (client, mut server) = pair();
    let secrets = json!({"outputs": [{"kind": "Role", "name": "secret-reader",
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}]});
    let rules = by_key(vec![tenant(secrets.clone())]);
    let observed = store(vec![namespace("team-a", json!({})), admin_role()]);
    let owned = BTreeMap::new();
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(async move {
        // No write of the Role: only the rule's status and a Warning.
        let status = server.next().await.expect(Method::PATCH, TENANT_STATUS);
        let degraded = status.body["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Degraded"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(degraded["status"], "True", "{}", status.body);
        assert_eq!(degraded["reason"], "OverCeiling", "{}", status.body);
        assert!(
            degraded["message"]
                .as_str()
                .is_some_and(|m| m.contains("tenant:delegate:secret-reader")),
            "{}",
            status.body
        );
        let echoed = json!({"apiVersion": "rbacrules.io/v1alpha1",
            "kind": "NamespacedRbacRule",
            "metadata": {"name": "delegate", "namespace": "team-a"},
            "spec": secrets, "status": status.body["status"].clone()});
        status.respond(200, echoed);

        let event = server.next().await.expect(Method::POST, TENANT_EVENTS);
        assert_eq!(event.body["reason"], "OverCeiling");
        assert_eq!(event.body["type"], "Warning");
        assert_regarding_tenant(&event.body);
        let body = event.body.clone();
        event.respond(201, body);
        server.done().await;
    });
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
    drop(s);
    scenario.await.expect("scenario");
    assert!(report.plan.applies.is_empty(), "nothing written");
}
