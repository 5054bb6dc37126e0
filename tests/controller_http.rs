//! HTTP contract of the controller's reconcile: given rules, observed
//! objects and live managed objects, exactly which requests it sends.
//!
//! Each test drives `Syncer::sync` directly (no watches) against a
//! scripted API server that checks method, path, query, content type and
//! body of every request, then asserts nothing else was sent.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use http::Method;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use rbac_rules::api::OutputKind;
use rbac_rules::api::RbacRuleStatus;
use rbac_rules::controller::apply::Outcome;
use rbac_rules::controller::live::ObjectId;
use rbac_rules::controller::plan::KeepReason;
use rbac_rules::controller::status::Hold;
use rbac_rules::controller::sync::Snapshot;
use serde_json::{Value, json};
use support::api::{
    NO_FOREIGN, NO_FORGED, namespace, owned, pair, rule, rules, snapshot, store, syncer,
};

const ROLES: &str = "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles";
const BINDINGS: &str = "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings";
const RULE_STATUS: &str = "/apis/rbacrules.io/v1alpha1/rbacrules/ns-viewer/status";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

/// A Namespace-triggered rule: a Role and a RoleBinding per namespace.
fn viewer_spec(binding_name: &str, role_name: &str) -> Value {
    json!({
        "trigger": {"kind": "Namespace", "pause": {"annotation": "rbacrules.io/paused"}},
        "outputs": [
            {"kind": "Role", "name": role_name,
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]},
            {"kind": "RoleBinding", "name": binding_name,
             "roleRef": {"kind": "Role", "name": role_name},
             "subjects": [{"kind": "Group", "name": "{{trigger.metadata.name}}-viewers"}]}
        ]
    })
}

fn provenance(rule: &str, trigger: &str) -> Value {
    json!({
        "labels": {"app.kubernetes.io/managed-by": "rbac-rules", "rbacrules.io/rule": rule},
        "annotations": {"rbacrules.io/rule": rule, "rbacrules.io/trigger": trigger},
    })
}

fn owner(ns: &str) -> Value {
    json!([{"apiVersion": "v1", "kind": "Namespace", "name": ns, "uid": format!("{ns}-uid"),
            "controller": true, "blockOwnerDeletion": true}])
}

/// The Role the rule emits for team-a: the exact apply body.
fn role_manifest(name: &str) -> Value {
    let p = provenance("ns-viewer", "Namespace/team-a");
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": "team-a",
                     "labels": p["labels"], "annotations": p["annotations"],
                     "ownerReferences": owner("team-a")},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
    })
}

/// The RoleBinding the rule emits for team-a.
fn binding_manifest(name: &str, role: &str) -> Value {
    let p = provenance("ns-viewer", "Namespace/team-a");
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": "team-a",
                     "labels": p["labels"], "annotations": p["annotations"],
                     "ownerReferences": owner("team-a")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "team-a-viewers"}],
    })
}

/// The Role team-a/viewer held by an object without our label, as the
/// watches report it.
fn viewer_role_taken() -> BTreeSet<ObjectId> {
    BTreeSet::from([ObjectId::new(OutputKind::Role, "team-a", "viewer")])
}

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

/// The status of a healthy rule with one trigger and `objects` objects.
fn ready_status(objects: i64) -> RbacRuleStatus {
    RbacRuleStatus {
        conditions: vec![
            condition("Ready", "True", "Reconciled", "every output is applied"),
            condition("Degraded", "False", "AsExpected", "no problems"),
        ],
        observed_generation: Some(1),
        matched_triggers: 1,
        managed_objects: objects,
    }
}

fn conditions_of(status_patch: &Value) -> BTreeMap<String, (String, String, String)> {
    status_patch["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .map(|c| {
            (
                c["type"].as_str().unwrap_or_default().to_string(),
                (
                    c["status"].as_str().unwrap_or_default().to_string(),
                    c["reason"].as_str().unwrap_or_default().to_string(),
                    c["message"].as_str().unwrap_or_default().to_string(),
                ),
            )
        })
        .collect()
}

#[tokio::test]
async fn creates_role_then_binding_with_server_side_apply_then_status_and_event() {
    let (client, mut server) = pair();
    let rules = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer", "viewer"),
        None,
    )]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let owned = BTreeMap::new();
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(async move {
        // New objects, names no other object holds: one apply each, no read.
        let apply = server
            .next()
            .await
            .expect_create(&format!("{ROLES}/viewer"));
        assert_eq!(apply.body, role_manifest("viewer"));
        apply.echo();
        let apply = server
            .next()
            .await
            .expect_create(&format!("{BINDINGS}/viewer"));
        assert_eq!(apply.body, binding_manifest("viewer", "viewer"));
        apply.echo();

        let status = server.next().await.expect(Method::PATCH, RULE_STATUS);
        assert_eq!(
            status.content_type.as_deref(),
            Some("application/merge-patch+json")
        );
        let conds = conditions_of(&status.body);
        assert_eq!(conds["Ready"].0, "True");
        assert_eq!(conds["Ready"].1, "Reconciled");
        assert_eq!(conds["Degraded"].0, "False");
        assert_eq!(status.body["status"]["observedGeneration"], 1);
        assert_eq!(status.body["status"]["matchedTriggers"], 1);
        assert_eq!(status.body["status"]["managedObjects"], 2);
        let echoed = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": "ns-viewer"}, "spec": viewer_spec("viewer", "viewer"),
            "status": status.body["status"].clone()});
        status.respond(200, echoed);

        let event = server.next().await.expect(Method::POST, EVENTS);
        assert_eq!(event.body["reason"], "Applied");
        assert_eq!(event.body["type"], "Normal");
        assert_eq!(event.body["action"], "Apply");
        assert_eq!(event.body["regarding"]["kind"], "RbacRule");
        assert_eq!(event.body["regarding"]["name"], "ns-viewer");
        assert_eq!(
            event.body["note"],
            "Role team-a/viewer (created); RoleBinding team-a/viewer (created)"
        );
        assert_eq!(event.body["reportingController"], "rbac-rules");
        let body = event.body.clone();
        event.respond(201, body);
        server.done().await;
    });
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
    drop(s);
    scenario.await.expect("scenario");
    assert!(matches!(report.written()[0].outcome, Outcome::Created));
    assert!(matches!(report.written()[1].outcome, Outcome::Created));
    assert!(!report.retry);
}

#[tokio::test]
async fn a_no_op_reconcile_sends_no_request() {
    let (client, server) = pair();
    let rules = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer", "viewer"),
        Some(ready_status(2)),
    )]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    // Live copies as the server returns them: extra server fields, the
    // ServiceAccount-free subjects, empty lists left out.
    let owned = owned(vec![
        role_manifest("viewer"),
        binding_manifest("viewer", "viewer"),
    ]);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(server.done());
    let mut s = syncer(client);
    for _ in 0..3 {
        let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
        assert!(report.plan.is_empty(), "{:?}", report.plan);
        assert_eq!(report.plan.unchanged.len(), 2);
        assert_eq!(report.status_patches, 0);
    }
    drop(s);
    scenario.await.expect("scenario");
}

#[tokio::test]
async fn drift_is_repaired_with_one_apply() {
    let (client, mut server) = pair();
    let rules = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer", "viewer"),
        Some(ready_status(2)),
    )]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let mut edited = role_manifest("viewer");
    edited["rules"][0]["verbs"] = json!(["*"]);
    // Someone else's label on our object is not drift.
    edited["metadata"]["labels"]["team"] = json!("a");
    let owned = owned(vec![edited, binding_manifest("viewer", "viewer")]);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(async move {
        // In our cache already: no ownership GET, straight to the apply.
        let apply = server.next().await.expect_apply(&format!("{ROLES}/viewer"));
        assert_eq!(apply.body, role_manifest("viewer"));
        apply.echo();
        let event = server.next().await.expect(Method::POST, EVENTS);
        assert_eq!(event.body["reason"], "Applied");
        assert_eq!(event.body["note"], "Role team-a/viewer (rules)");
        let body = event.body.clone();
        event.respond(201, body);
        server.done().await;
    });
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
    drop(s);
    scenario.await.expect("scenario");
    assert_eq!(report.plan.applies.len(), 1);
    assert!(matches!(&report.written()[0].outcome, Outcome::Updated(p) if p == &vec!["rules"]));
}

#[tokio::test]
async fn prunes_only_managed_objects_nothing_wants_with_preconditions() {
    let (client, mut server) = pair();
    let rules = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer", "viewer"),
        Some(ready_status(2)),
    )]);
    let observed = store(vec![
        namespace("team-a", json!({})),
        namespace("team-b", json!({"rbacrules.io/paused": "true"})),
    ]);
    // An output the rule no longer emits, one of a deleted rule, one of a
    // paused trigger, and one without a rule annotation.
    let mut stale = role_manifest("old-viewer");
    stale["metadata"]["uid"] = json!("old-uid");
    stale["metadata"]["resourceVersion"] = json!("42");
    // (Its rule asked for deletion: the default, Orphan, keeps it; see
    // tests/controller_keep.rs.)
    let mut orphan = role_manifest("from-deleted-rule");
    orphan["metadata"]["annotations"]["rbacrules.io/rule"] = json!("deleted-rule");
    orphan["metadata"]["annotations"]["rbacrules.io/deletion-policy"] = json!("Delete");
    orphan["metadata"]["labels"]["rbacrules.io/rule"] = json!("deleted-rule");
    let mut paused = role_manifest("viewer");
    paused["metadata"]["namespace"] = json!("team-b");
    paused["metadata"]["annotations"]["rbacrules.io/trigger"] = json!("Namespace/team-b");
    let mut no_rule = role_manifest("mystery");
    no_rule["metadata"]["annotations"] = json!({});
    let owned = owned(vec![
        role_manifest("viewer"),
        binding_manifest("viewer", "viewer"),
        stale,
        orphan,
        paused,
        no_rule,
    ]);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(async move {
        let del = server
            .next()
            .await
            .expect(Method::DELETE, &format!("{ROLES}/from-deleted-rule"));
        assert_eq!(
            del.body["preconditions"]["uid"],
            "from-deleted-rule-live-uid"
        );
        assert_eq!(del.body["preconditions"]["resourceVersion"], "5");
        del.deleted();
        let del = server
            .next()
            .await
            .expect(Method::DELETE, &format!("{ROLES}/old-viewer"));
        assert_eq!(
            del.body["preconditions"],
            json!({"uid": "old-uid", "resourceVersion": "42"})
        );
        del.deleted();
        // The paused trigger's Role stays; managedObjects counts it.
        let status = server.next().await.expect(Method::PATCH, RULE_STATUS);
        assert_eq!(status.body["status"]["managedObjects"], 3);
        assert_eq!(status.body["status"]["matchedTriggers"], 2);
        let body = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": "ns-viewer"}, "spec": viewer_spec("viewer", "viewer")});
        status.respond(200, body);
        let event = server.next().await.expect(Method::POST, EVENTS);
        assert_eq!(event.body["reason"], "Pruned");
        assert_eq!(event.body["note"], "Role team-a/old-viewer");
        let body = event.body.clone();
        event.respond(201, body);
        server.done().await;
    });
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
    drop(s);
    scenario.await.expect("scenario");
    let kept: BTreeMap<String, KeepReason> = report
        .plan
        .kept
        .iter()
        .map(|(id, _, r)| (id.to_string(), *r))
        .collect();
    assert_eq!(
        kept,
        BTreeMap::from([
            ("Role team-a/mystery".to_string(), KeepReason::NoProvenance),
            ("Role team-b/viewer".to_string(), KeepReason::Kept),
        ])
    );
}

#[tokio::test]
async fn a_renamed_binding_is_created_before_the_old_one_is_deleted() {
    let (client, mut server) = pair();
    let rules = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer-v2", "viewer"),
        Some(ready_status(2)),
    )]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let owned = owned(vec![
        role_manifest("viewer"),
        binding_manifest("viewer", "viewer"),
    ]);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(async move {
        let apply = server
            .next()
            .await
            .expect_create(&format!("{BINDINGS}/viewer-v2"));
        assert_eq!(apply.body, binding_manifest("viewer-v2", "viewer"));
        apply.echo();
        server
            .next()
            .await
            .expect(Method::DELETE, &format!("{BINDINGS}/viewer"))
            .deleted();
        let event = server.next().await.expect(Method::POST, EVENTS);
        assert_eq!(event.body["reason"], "Applied");
        let body = event.body.clone();
        event.respond(201, body);
        let event = server.next().await.expect(Method::POST, EVENTS);
        assert_eq!(event.body["reason"], "Pruned");
        assert_eq!(event.body["note"], "RoleBinding team-a/viewer");
        let body = event.body.clone();
        event.respond(201, body);
        server.done().await;
    });
    let mut s = syncer(client);
    s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
    drop(s);
    scenario.await.expect("scenario");
}

#[tokio::test]
async fn a_changed_role_ref_deletes_then_applies_the_binding() {
    let (client, mut server) = pair();
    let rules = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer", "viewer2"),
        Some(ready_status(2)),
    )]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    // The Role of the old name is pruned; the binding keeps its name but
    // names the new Role.
    let owned = owned(vec![
        role_manifest("viewer"),
        binding_manifest("viewer", "viewer"),
    ]);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(async move {
        server
            .next()
            .await
            .expect_create(&format!("{ROLES}/viewer2"))
            .echo();
        // roleRef is immutable: delete (guarded by uid and version), then
        // apply right away.
        let del = server
            .next()
            .await
            .expect(Method::DELETE, &format!("{BINDINGS}/viewer"));
        assert_eq!(
            del.body["preconditions"],
            json!({"uid": "viewer-live-uid", "resourceVersion": "5"})
        );
        del.deleted();
        let apply = server
            .next()
            .await
            .expect_apply(&format!("{BINDINGS}/viewer"));
        assert_eq!(apply.body, binding_manifest("viewer", "viewer2"));
        apply.echo();
        // Then the old Role goes.
        server
            .next()
            .await
            .expect(Method::DELETE, &format!("{ROLES}/viewer"))
            .deleted();
        for reason in ["Applied", "Pruned"] {
            let event = server.next().await.expect(Method::POST, EVENTS);
            assert_eq!(event.body["reason"], reason);
            let body = event.body.clone();
            event.respond(201, body);
        }
        server.done().await;
    });
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
    drop(s);
    scenario.await.expect("scenario");
    assert!(matches!(report.written()[1].outcome, Outcome::Recreated));
}

#[tokio::test]
async fn an_unmanaged_object_of_the_same_name_is_left_alone_and_reported() {
    let (client, mut server) = pair();
    let rules = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer", "viewer"),
        None,
    )]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let owned = BTreeMap::new();
    let holds = BTreeMap::new();
    let taken = viewer_role_taken();
    let scenario = tokio::spawn(async move {
        server
            .next()
            .await
            .expect(Method::GET, &format!("{ROLES}/viewer"))
            .respond(
                200,
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "viewer", "namespace": "team-a", "uid": "theirs",
                             "labels": {"app.kubernetes.io/managed-by": "helm"}},
                "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
            );
        // No apply of the Role, and the binding that would bind the
        // foreign Role is not written either.
        let status = server.next().await.expect(Method::PATCH, RULE_STATUS);
        let conds = conditions_of(&status.body);
        assert_eq!(conds["Ready"].0, "False");
        assert_eq!(conds["Degraded"].0, "True");
        assert_eq!(conds["Degraded"].1, "Conflict");
        assert!(
            conds["Degraded"].2.contains("Role team-a/viewer exists without the app.kubernetes.io/managed-by=rbac-rules label (it is managed by \"helm\")"),
            "{}",
            conds["Degraded"].2
        );
        assert_eq!(status.body["status"]["managedObjects"], 0);
        let body = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": "ns-viewer"}, "spec": viewer_spec("viewer", "viewer")});
        status.respond(200, body);
        let event = server.next().await.expect(Method::POST, EVENTS);
        assert_eq!(event.body["reason"], "Conflict");
        assert_eq!(event.body["type"], "Warning");
        let body = event.body.clone();
        event.respond(201, body);
        server.done().await;
    });
    let mut s = syncer(client);
    let report = s
        .sync(&Snapshot {
            foreign: &taken,
            forged: &NO_FORGED,
            ..snapshot(&rules, &observed, &owned, &holds)
        })
        .await;
    drop(s);
    scenario.await.expect("scenario");
    assert!(matches!(
        report.written()[0].outcome,
        Outcome::Conflict { fresh: true, .. }
    ));
    assert!(matches!(report.written()[1].outcome, Outcome::Blocked(_)));
}

#[tokio::test]
async fn a_known_conflict_is_not_looked_up_again() {
    let (client, mut server) = pair();
    let rules1 = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer", "viewer"),
        None,
    )]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let owned = BTreeMap::new();
    let holds = BTreeMap::new();
    let taken = viewer_role_taken();
    let (tx, rx) = tokio::sync::oneshot::channel::<Value>();
    let scenario = tokio::spawn(async move {
        server
            .next()
            .await
            .expect(Method::GET, &format!("{ROLES}/viewer"))
            .respond(
                200,
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "viewer", "namespace": "team-a"}}),
            );
        let status = server.next().await.expect(Method::PATCH, RULE_STATUS);
        let _ = tx.send(status.body["status"].clone());
        let body = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": "ns-viewer"}, "spec": viewer_spec("viewer", "viewer")});
        status.respond(200, body);
        let event = server.next().await.expect(Method::POST, EVENTS);
        let body = event.body.clone();
        event.respond(201, body);
        // Second reconcile: nothing at all.
        server.done().await;
    });
    let mut s = syncer(client);
    let snap = Snapshot {
        rules: &rules1,
        observed: &observed,
        owned: &owned,
        foreign: &taken,
        forged: &NO_FORGED,
        holds: &holds,
        allow: None,
        prune: true,
    };
    s.sync(&snap).await;
    // The watch brings the patched status back.
    let written: RbacRuleStatus =
        serde_json::from_value(rx.await.expect("status")).expect("status JSON");
    let rules2 = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer", "viewer"),
        Some(written),
    )]);
    let report = s
        .sync(&Snapshot {
            rules: &rules2,
            ..snap
        })
        .await;
    assert!(matches!(
        report.written()[0].outcome,
        Outcome::Conflict { fresh: false, .. }
    ));
    assert_eq!(report.status_patches, 0);
    drop(s);
    scenario.await.expect("scenario");
}

#[tokio::test]
async fn nothing_is_written_without_the_lease() {
    let (client, server) = pair();
    let rules = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer", "viewer"),
        None,
    )]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let owned = owned(vec![role_manifest("stale")]);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(server.done());
    let gate = std::sync::Arc::new(rbac_rules::controller::apply::Gate::new(false));
    let mut s = rbac_rules::controller::sync::Syncer::new(
        client,
        rbac_rules::api::ManageLevel::All,
        rbac_rules::controller::metrics::Metrics::new(),
        gate,
        None,
    );
    let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
    // Planned, not sent.
    assert_eq!(report.plan.applies.len(), 2);
    assert_eq!(report.plan.deletes.len(), 1);
    assert!(report.written().is_empty());
    drop(s);
    scenario.await.expect("scenario");
}

#[tokio::test]
async fn held_rules_and_an_incomplete_view_never_delete() {
    let (client, mut server) = pair();
    let rules = rules(vec![
        // Three objects: the deferred prune still exists.
        rule(
            "ns-viewer",
            viewer_spec("viewer", "viewer"),
            Some(ready_status(3)),
        ),
        rule(
            "waits-for-crd",
            json!({"trigger": {"apiGroup": "example.org", "kind": "Widget"},
                   "outputs": [{"kind": "ClusterRole", "name": "widget-{{trigger.metadata.name}}",
                                "rules": [{"apiGroups": ["example.org"], "resources": ["widgets"], "verbs": ["get"]}]}]}),
            None,
        ),
    ]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let mut widget_role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": provenance("waits-for-crd", "Widget.example.org/w1"),
    });
    widget_role["metadata"]["name"] = json!("widget-w1");
    let owned = owned(vec![
        role_manifest("viewer"),
        binding_manifest("viewer", "viewer"),
        role_manifest("stale"),
        widget_role,
    ]);
    let holds = BTreeMap::from([(
        "waits-for-crd".to_string(),
        Hold::KindNotServed(
            "Widget.example.org is not served by the API server (is its CRD installed?)".into(),
        ),
    )]);
    let scenario = tokio::spawn(async move {
        // Only the held rule's status: Degraded, KindNotServed.
        let status = server.next().await.expect(
            Method::PATCH,
            "/apis/rbacrules.io/v1alpha1/rbacrules/waits-for-crd/status",
        );
        let conds = conditions_of(&status.body);
        assert_eq!(conds["Degraded"].0, "True");
        assert_eq!(conds["Degraded"].1, "KindNotServed");
        assert_eq!(conds["Ready"].1, "KindNotServed");
        assert_eq!(status.body["status"]["managedObjects"], 1);
        let body = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": "waits-for-crd"}, "spec": {"outputs": []}});
        status.respond(200, body);
        let event = server.next().await.expect(Method::POST, EVENTS);
        assert_eq!(event.body["reason"], "KindNotServed");
        assert_eq!(event.body["type"], "Warning");
        let body = event.body.clone();
        event.respond(201, body);
        server.done().await;
    });
    let mut s = syncer(client);
    let report = s
        .sync(&Snapshot {
            rules: &rules,
            observed: &observed,
            owned: &owned,
            foreign: &NO_FOREIGN,
            forged: &NO_FORGED,
            holds: &holds,
            allow: None,
            prune: false,
        })
        .await;
    drop(s);
    scenario.await.expect("scenario");
    assert!(report.plan.deletes.is_empty());
    let kept: BTreeMap<ObjectId, KeepReason> = report
        .plan
        .kept
        .iter()
        .map(|(id, _, r)| (id.clone(), *r))
        .collect();
    assert_eq!(
        kept,
        BTreeMap::from([
            (
                ObjectId::new(OutputKind::ClusterRole, "", "widget-w1"),
                KeepReason::Held
            ),
            (
                ObjectId::new(OutputKind::Role, "team-a", "stale"),
                KeepReason::PruneDeferred
            ),
        ])
    );
}

#[tokio::test]
async fn cluster_scoped_outputs_and_aggregated_roles_without_rules() {
    let (client, mut server) = pair();
    let spec = json!({
        "outputs": [
            {"kind": "ClusterRole", "name": "widgets-view",
             "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.org/aggregate-to-view": "true"}}]}},
            {"kind": "ClusterRoleBinding", "name": "widgets-view",
             "roleRef": {"kind": "ClusterRole", "name": "widgets-view"},
             "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "tools"}]}
        ]
    });
    let rules = rules(vec![rule("static", spec, None)]);
    let observed = store(vec![]);
    // The aggregated role exists and the aggregation controller filled its
    // rules: not a difference. The binding is new.
    let labels =
        json!({"app.kubernetes.io/managed-by": "rbac-rules", "rbacrules.io/rule": "static"});
    let annotations = json!({"rbacrules.io/rule": "static"});
    let owned = owned(vec![json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "widgets-view", "labels": labels, "annotations": annotations},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.org/aggregate-to-view": "true"}}]},
        "rules": [{"apiGroups": ["example.org"], "resources": ["widgets"], "verbs": ["get"]}],
    })]);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(async move {
        let path = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/widgets-view";
        let apply = server.next().await.expect_create(path);
        assert_eq!(
            apply.body,
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "widgets-view", "labels": labels, "annotations": annotations},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "widgets-view"},
                "subjects": [{"apiGroup": "", "kind": "ServiceAccount", "name": "reader", "namespace": "tools"}],
            })
        );
        apply.echo();
        let status = server.next().await.expect(
            Method::PATCH,
            "/apis/rbacrules.io/v1alpha1/rbacrules/static/status",
        );
        assert_eq!(status.body["status"]["managedObjects"], 2);
        assert_eq!(status.body["status"]["matchedTriggers"], 0);
        let body = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": "static"}, "spec": {"outputs": []}});
        status.respond(200, body);
        let event = server.next().await.expect(Method::POST, EVENTS);
        assert_eq!(
            event.body["note"],
            "ClusterRoleBinding widgets-view (created)"
        );
        let body = event.body.clone();
        event.respond(201, body);
        server.done().await;
    });
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
    drop(s);
    scenario.await.expect("scenario");
    assert_eq!(report.plan.unchanged.len(), 1);
}

#[tokio::test]
async fn a_failed_apply_is_reported_and_retried() {
    let (client, mut server) = pair();
    let rules = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer", "viewer"),
        Some(ready_status(2)),
    )]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let mut edited = role_manifest("viewer");
    edited["rules"] = json!([]);
    let owned = owned(vec![edited, binding_manifest("viewer", "viewer")]);
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(async move {
        server
            .next()
            .await
            .expect_apply(&format!("{ROLES}/viewer"))
            .respond(403, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "Forbidden", "code": 403, "message": "roles is forbidden: escalation", "metadata": {}}));
        let status = server.next().await.expect(Method::PATCH, RULE_STATUS);
        let conds = conditions_of(&status.body);
        assert_eq!(conds["Degraded"].1, "Forbidden");
        assert!(
            conds["Degraded"].2.contains("apply Role team-a/viewer"),
            "{}",
            conds["Degraded"].2
        );
        let body = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": "ns-viewer"}, "spec": viewer_spec("viewer", "viewer")});
        status.respond(200, body);
        let event = server.next().await.expect(Method::POST, EVENTS);
        assert_eq!(event.body["type"], "Warning");
        assert_eq!(event.body["reason"], "Forbidden");
        let body = event.body.clone();
        event.respond(201, body);
        server.done().await;
    });
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
    drop(s);
    scenario.await.expect("scenario");
    assert!(report.retry);
}

/// The whole control loop against a fake API server for a rule with
/// `spec`, the Namespaces listed as `namespaces`: discovery, lists,
/// watches, one reconcile, status, Event, then a clean stop. The requests
/// made, and the bodies of the RBAC writes.
async fn control_loop(spec: Value, namespaces: String) -> (Vec<String>, Vec<Value>) {
    use rbac_rules::controller::{RunArgs, run_with};

    let (client, mut server) = pair();
    let metadata_only = spec["trigger"]["metadataOnly"] == true;
    let rule_obj = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
        "metadata": {"name": "ns-viewer", "uid": "ns-viewer-uid", "generation": 1, "resourceVersion": "3"},
        "spec": spec});
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let scenario = tokio::spawn(async move {
        let mut done_tx = Some(done_tx);
        let mut parked = Vec::new();
        let mut log: Vec<String> = Vec::new();
        let mut bodies: Vec<Value> = Vec::new();
        let list = |kind: &str, items: Vec<Value>| json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items});
        while let Some(r) = server.next_opt().await {
            if r.param("watch") == Some("true") {
                // Watches stay open and quiet.
                log.push(format!("WATCH {}", r.path));
                parked.push(r);
                continue;
            }
            log.push(format!("{} {}", r.method, r.path));
            let (method, path) = (r.method.to_string(), r.path.clone());
            match (method.as_str(), path.as_str()) {
                ("GET", "/apis/rbacrules.io/v1alpha1/rbacrules") => {
                    r.respond(200, list("RbacRuleList", vec![rule_obj.clone()]))
                }
                // Tenant rules in every namespace: none here.
                ("GET", "/apis/rbacrules.io/v1alpha1/namespacedrbacrules") => {
                    r.respond(200, list("NamespacedRbacRuleList", vec![]))
                }
                // Every object of the output kinds is listed (ours and the
                // names others hold); no object is looked up one by one.
                ("GET", p)
                    if p.starts_with("/apis/rbac.authorization.k8s.io/v1/")
                        && p.matches('/').count() == 4 =>
                {
                    assert_eq!(r.param("labelSelector"), None);
                    r.respond(200, list("List", vec![]))
                }
                ("GET", "/api") => r.respond(
                    200,
                    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
                ),
                ("GET", "/api/v1") => r.respond(
                    200,
                    json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                        {"name": "namespaces", "singularName": "namespace", "namespaced": false,
                         "kind": "Namespace", "verbs": ["get", "list", "watch"]}]}),
                ),
                ("GET", "/api/v1/namespaces") => {
                    // Metadata only: no Namespace bodies are fetched.
                    let partial = r
                        .accept
                        .as_deref()
                        .is_some_and(|a| a.contains("as=PartialObjectMetadataList"));
                    assert_eq!(partial, metadata_only, "{:?}", r.accept);
                    r.respond_bytes(200, namespaces.clone().into_bytes())
                }
                ("PATCH", p) if p.starts_with("/apis/rbac.authorization.k8s.io/") => {
                    let r = r.expect_create(p);
                    bodies.push(r.body.clone());
                    r.echo()
                }
                ("PATCH", RULE_STATUS) => {
                    let mut obj = rule_obj.clone();
                    obj["status"] = r.body["status"].clone();
                    r.respond(200, obj)
                }
                ("POST", EVENTS) => {
                    let body = r.body.clone();
                    r.respond(201, body);
                    if let Some(tx) = done_tx.take() {
                        let _ = tx.send(());
                    }
                }
                (m, p) => panic!("unexpected request {m} {p}"),
            }
        }
        drop(parked);
        (log, bodies)
    });

    let args = RunArgs {
        manage: rbac_rules::api::ManageLevel::All,
        metrics_address: "127.0.0.1:0".parse().expect("address"),
        leader_election: false,
        lease_namespace: None,
        lease_name: "rbac-rules".into(),
        allow_clusterrole: None,
        debounce_ms: 50,
        resync_seconds: 300,
        rediscovery_seconds: 30,
        identity: Some("test".into()),
        adopt_existing: false,
        max_concurrent_writes: 4,
        slow_rule_seconds: rbac_rules::controller::DEFAULT_SLOW_RULE_SECONDS,
        max_unconfirmed_prunes: rbac_rules::controller::plan::DEFAULT_MAX_UNCONFIRMED_PRUNES,
        waivers: Default::default(),
        limits: Default::default(),
        params: Default::default(),
        tenancy: Default::default(),
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let controller = tokio::spawn(run_with(client, args, stop_rx));
    tokio::time::timeout(std::time::Duration::from_secs(10), done_rx)
        .await
        .expect("the controller did not reconcile in time")
        .expect("scenario ended early");
    stop_tx.send(true).expect("stop");
    tokio::time::timeout(std::time::Duration::from_secs(10), controller)
        .await
        .expect("the controller did not stop")
        .expect("controller task")
        .expect("controller result");
    scenario.await.expect("scenario")
}

/// The whole control loop (metadata-only for the trigger kind).
#[tokio::test]
async fn the_control_loop_lists_discovers_reconciles_and_stops() {
    let mut spec = viewer_spec("viewer", "viewer");
    spec["trigger"]["metadataOnly"] = json!(true);
    let namespaces = json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
        "metadata": {"resourceVersion": "1"},
        "items": [{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": "team-a", "uid": "team-a-uid",
                "managedFields": [{"manager": "kubectl", "operation": "Update"}]}}]});
    let (log, _) = control_loop(spec, namespaces.to_string()).await;
    let writes: Vec<&String> = log
        .iter()
        .filter(|l| !l.starts_with("GET") && !l.starts_with("WATCH"))
        .collect();
    assert_eq!(
        writes,
        vec![
            &format!("PATCH {ROLES}/viewer"),
            &format!("PATCH {BINDINGS}/viewer"),
            &format!("PATCH {RULE_STATUS}"),
            &format!("POST {EVENTS}"),
        ]
    );
    // Each watch is listed before it is watched, and nothing is written
    // before every list is in.
    let first_write = log
        .iter()
        .position(|l| l.starts_with("PATCH"))
        .expect("a write");
    for path in [
        "/apis/rbacrules.io/v1alpha1/rbacrules",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "/apis/rbac.authorization.k8s.io/v1/roles",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "/apis/rbac.authorization.k8s.io/v1/rolebindings",
        "/api/v1/namespaces",
    ] {
        let listed = log.iter().position(|l| l == &format!("GET {path}"));
        assert!(
            listed.is_some_and(|i| i < first_write),
            "{path} not listed first: {log:?}"
        );
    }
}

/// A kind whose readers name `fields` is cut as it is parsed: a part no
/// rule sees is never read (here one nested deeper than any object may be,
/// which would have the whole object refused), and the rule sees its
/// fields.
#[tokio::test]
async fn a_kind_read_by_fields_is_cut_as_it_is_listed() {
    let mut spec = viewer_spec("viewer", "viewer");
    spec["trigger"]["fields"] = json!(["spec.finalizers"]);
    spec["outputs"][0]["annotations"] = json!({"example.org/seen": "{{json trigger}}"});
    // Built as text: too deep for a value on a test's stack.
    let levels = rbac_rules::yaml::MAX_DEPTH + 10;
    let deep = format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
    let namespaces = format!(
        r#"{{"apiVersion":"v1","kind":"NamespaceList","metadata":{{"resourceVersion":"1"}},
        "items":[{{"apiVersion":"v1","kind":"Namespace",
          "metadata":{{"name":"team-a","uid":"team-a-uid",
            "managedFields":[{{"manager":"kubectl","operation":"Update"}}]}},
          "spec":{{"finalizers":["kubernetes"]}},
          "status":{{"phase":"Active","deep":{deep}}}}}]}}"#
    );
    let (log, bodies) = control_loop(spec, namespaces).await;
    assert!(log.contains(&format!("PATCH {ROLES}/viewer")), "{log:?}");
    let role = bodies
        .iter()
        .find(|b| b["kind"] == "Role")
        .expect("the Role is applied");
    let seen: Value = serde_json::from_str(
        role["metadata"]["annotations"]["example.org/seen"]
            .as_str()
            .expect("annotation"),
    )
    .expect("json");
    assert_eq!(
        seen,
        json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "team-a", "uid": "team-a-uid"},
            "spec": {"finalizers": ["kubernetes"]}})
    );
}

/// The built-in rules on an example cluster converge: after the first
/// reconcile's applies are live (as the API server returns them, with the
/// aggregation controller's rules filled in and our managedFields), the
/// next reconcile plans no write. Pure: no request is sent.
#[tokio::test]
async fn builtin_rules_converge_with_no_second_write() {
    use rbac_rules::controller::live::Live;
    use rbac_rules::controller::plan::FIELD_MANAGER;

    let (client, server) = pair();
    let scenario = tokio::spawn(server.done());
    let rules = rules(
        rbac_rules::rules::builtin()
            .expect("built-in rules")
            .into_iter()
            .map(|src| {
                let mut r = rbac_rules::api::RbacRule::new(&src.name, src.spec);
                r.metadata.generation = Some(1);
                r
            })
            .collect(),
    );
    let docs = rbac_rules::yaml::load_paths(&["examples/crossplane-cluster.yaml".into()])
        .expect("example cluster");
    let cluster: Vec<Value> = docs.into_iter().map(|d| d.value).collect();
    let observed = store(cluster.clone());
    let holds = BTreeMap::new();
    let mut s = syncer(client);
    let (evaluation, first) = s.evaluate(&Snapshot {
        rules: &rules,
        observed: &observed,
        owned: &BTreeMap::new(),
        foreign: &NO_FOREIGN,
        forged: &NO_FORGED,
        holds: &holds,
        allow: None,
        prune: true,
    });
    assert!(
        evaluation.errors().next().is_none(),
        "{:?}",
        evaluation.errors().collect::<Vec<_>>()
    );
    assert!(first.applies.len() > 10, "{}", first.applies.len());

    // What the server holds after those applies.
    let mut live_objects = Vec::new();
    for (i, a) in first.applies.iter().enumerate() {
        let mut o = a.body();
        let meta = o["metadata"].as_object_mut().expect("metadata");
        let keys = |m: Option<&Value>| -> Value {
            let mut f = serde_json::Map::new();
            for k in m
                .and_then(Value::as_object)
                .into_iter()
                .flat_map(|m| m.keys())
            {
                f.insert(format!("f:{k}"), json!({}));
            }
            Value::Object(f)
        };
        let fields = json!({"f:metadata": {"f:labels": keys(meta.get("labels")),
                                           "f:annotations": keys(meta.get("annotations"))}});
        meta.insert("uid".into(), json!(format!("uid-{i}")));
        meta.insert("resourceVersion".into(), json!(format!("{}", 100 + i)));
        meta.insert(
            "managedFields".into(),
            json!([{"manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": fields}]),
        );
        if o.get("aggregationRule").is_some() {
            o["rules"] =
                json!([{"apiGroups": ["example.org"], "resources": ["things"], "verbs": ["get"]}]);
        }
        live_objects.push(o);
    }
    let owned: BTreeMap<ObjectId, Live> = live_objects
        .iter()
        .map(|o| (ObjectId::of(o).expect("id"), Live::new(o.clone())))
        .collect();
    let mut with_outputs = cluster;
    with_outputs.extend(live_objects);
    let observed = store(with_outputs);
    let (again, second) = s.evaluate(&Snapshot {
        rules: &rules,
        observed: &observed,
        owned: &owned,
        foreign: &NO_FOREIGN,
        forged: &NO_FORGED,
        holds: &holds,
        allow: None,
        prune: true,
    });
    assert!(
        second.is_empty(),
        "{:#?}",
        second
            .applies
            .iter()
            .map(|a| (&a.id, &a.action))
            .collect::<Vec<_>>()
    );
    assert_eq!(second.unchanged.len(), first.applies.len());
    assert_eq!(again.desired, evaluation.desired);
    drop(s);
    scenario.await.expect("scenario");
}

/// A Role named like the rule's output that someone else made, without
/// our label.
fn foreign_role(owner_refs: Value, labels: Value, annotations: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "viewer", "namespace": "team-a", "uid": "theirs",
                     "resourceVersion": "3", "labels": labels, "annotations": annotations,
                     "ownerReferences": owner_refs},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})
}

/// Runs one reconcile of the viewer rule for team-a where the Role already
/// exists as `existing`, expecting it to be adopted with `body`; the
/// binding is new. Returns the notes of the Events, by reason.
async fn adopt_scenario(
    existing: Value,
    adopt_flag: bool,
    mut body: Value,
) -> BTreeMap<String, String> {
    // Every adoption marks the object: it existed before, never pruned.
    body["metadata"]["annotations"]["rbacrules.io/adopted"] = json!("true");
    let (client, mut server) = pair();
    let rules = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer", "viewer"),
        None,
    )]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let owned = BTreeMap::new();
    let holds = BTreeMap::new();
    let taken = viewer_role_taken();
    let scenario = tokio::spawn(async move {
        server
            .next()
            .await
            .expect(Method::GET, &format!("{ROLES}/viewer"))
            .respond(200, existing);
        // Adopted in place: one forced apply by our field manager, no delete.
        let apply = server.next().await.expect_apply(&format!("{ROLES}/viewer"));
        assert_eq!(apply.param("fieldManager"), Some("rbac-rules"));
        assert_eq!(apply.param("force"), Some("true"));
        assert_eq!(apply.body, body);
        assert_eq!(
            apply.body["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "rbac-rules"
        );
        assert_eq!(
            apply.body["metadata"]["labels"]["rbacrules.io/rule"],
            "ns-viewer"
        );
        apply.echo();
        server
            .next()
            .await
            .expect_create(&format!("{BINDINGS}/viewer"))
            .echo();
        let status = server.next().await.expect(Method::PATCH, RULE_STATUS);
        let conds = conditions_of(&status.body);
        assert_eq!(conds["Ready"].0, "True", "{conds:?}");
        assert_eq!(status.body["status"]["managedObjects"], 2);
        let echoed = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": "ns-viewer"}, "spec": viewer_spec("viewer", "viewer"),
            "status": status.body["status"].clone()});
        status.respond(200, echoed);
        let mut notes = BTreeMap::new();
        for _ in 0..2 {
            let event = server.next().await.expect(Method::POST, EVENTS);
            assert_eq!(event.body["type"], "Normal");
            notes.insert(
                event.body["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                event.body["note"].as_str().unwrap_or_default().to_string(),
            );
            let body = event.body.clone();
            event.respond(201, body);
        }
        server.done().await;
        notes
    });
    let mut s = syncer(client).adopt_existing(adopt_flag);
    let report = s
        .sync(&Snapshot {
            foreign: &taken,
            forged: &NO_FORGED,
            ..snapshot(&rules, &observed, &owned, &holds)
        })
        .await;
    drop(s);
    let notes = scenario.await.expect("scenario");
    assert!(matches!(report.written()[0].outcome, Outcome::Adopted(_)));
    assert!(matches!(report.written()[1].outcome, Outcome::Created));
    assert!(!report.retry);
    notes
}

#[tokio::test]
async fn an_object_controlled_by_the_outputs_trigger_is_adopted_without_a_flag() {
    let existing = foreign_role(
        owner("team-a"),
        json!({"other.example/aggregate": "true"}),
        json!({}),
    );
    let notes = adopt_scenario(existing, false, role_manifest("viewer")).await;
    assert!(
        notes["Adopted"].contains("Role team-a/viewer is controlled by this output's trigger Namespace/team-a: adopted by lineage"),
        "{notes:?}"
    );
    assert_eq!(notes["Applied"], "RoleBinding team-a/viewer (created)");
}

#[tokio::test]
async fn with_adopt_existing_a_helm_object_without_controller_is_adopted_and_kept_by_helm() {
    let existing = foreign_role(
        Value::Null,
        json!({"app.kubernetes.io/managed-by": "Helm"}),
        json!({"meta.helm.sh/release-name": "crossplane",
               "meta.helm.sh/release-namespace": "crossplane-system"}),
    );
    let mut body = role_manifest("viewer");
    body["metadata"]["annotations"]["helm.sh/resource-policy"] = json!("keep");
    let notes = adopt_scenario(existing, true, body).await;
    assert!(notes["Adopted"].contains("--adopt-existing"), "{notes:?}");
}

/// One reconcile where the Role exists as `existing` and must be left
/// alone; returns the Degraded condition's message.
async fn conflict_scenario(existing: Value, adopt_flag: bool) -> String {
    let (client, mut server) = pair();
    let rules = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer", "viewer"),
        None,
    )]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let owned = BTreeMap::new();
    let holds = BTreeMap::new();
    let taken = viewer_role_taken();
    let scenario = tokio::spawn(async move {
        server
            .next()
            .await
            .expect(Method::GET, &format!("{ROLES}/viewer"))
            .respond(200, existing);
        // No apply, no delete; the binding waits for its role.
        let status = server.next().await.expect(Method::PATCH, RULE_STATUS);
        let conds = conditions_of(&status.body);
        assert_eq!(conds["Degraded"].0, "True");
        assert_eq!(conds["Degraded"].1, "Conflict");
        let body = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": "ns-viewer"}, "spec": viewer_spec("viewer", "viewer")});
        status.respond(200, body);
        let event = server.next().await.expect(Method::POST, EVENTS);
        assert_eq!(event.body["reason"], "Conflict");
        let body = event.body.clone();
        event.respond(201, body);
        server.done().await;
        conds["Degraded"].2.clone()
    });
    let mut s = syncer(client).adopt_existing(adopt_flag);
    let report = s
        .sync(&Snapshot {
            foreign: &taken,
            forged: &NO_FORGED,
            ..snapshot(&rules, &observed, &owned, &holds)
        })
        .await;
    drop(s);
    let message = scenario.await.expect("scenario");
    assert!(matches!(
        report.written()[0].outcome,
        Outcome::Conflict { fresh: true, .. }
    ));
    assert!(matches!(report.written()[1].outcome, Outcome::Blocked(_)));
    message
}

#[tokio::test]
async fn an_object_controlled_by_another_object_is_never_adopted() {
    let other = json!([{"apiVersion": "v1", "kind": "Namespace", "name": "other",
        "uid": "other-uid", "controller": true, "blockOwnerDeletion": true}]);
    let message = conflict_scenario(foreign_role(other, json!({}), json!({})), true).await;
    assert!(
        message.contains("Role team-a/viewer exists without the app.kubernetes.io/managed-by=rbac-rules label and is controlled by Namespace other (uid other-uid)"),
        "{message}"
    );
    assert!(!message.contains("--adopt-existing"), "{message}");
}

#[tokio::test]
async fn without_the_flag_an_object_without_controller_stays_in_conflict_naming_the_flag() {
    let existing = foreign_role(
        Value::Null,
        json!({"app.kubernetes.io/managed-by": "Helm"}),
        json!({"meta.helm.sh/release-name": "crossplane"}),
    );
    let message = conflict_scenario(existing, false).await;
    assert!(
        message.contains("(it is managed by \"Helm\"); it is left alone (run with --adopt-existing to take it over)"),
        "{message}"
    );
}

#[tokio::test]
async fn diff_observes_plans_and_looks_up_without_writing() {
    use rbac_rules::diff::{Change, DiffArgs, diff, exit_code};

    let (client, mut server) = pair();
    let mut spec = viewer_spec("viewer", "viewer");
    spec["trigger"]["metadataOnly"] = json!(true);
    let rule_obj = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
        "metadata": {"name": "ns-viewer", "uid": "ns-viewer-uid", "generation": 1, "resourceVersion": "3"},
        "spec": spec});
    let scenario = tokio::spawn(async move {
        let mut parked = Vec::new();
        let list = |kind: &str, items: Vec<Value>| json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items});
        while let Some(r) = server.next_opt().await {
            if r.param("watch") == Some("true") {
                parked.push(r);
                continue;
            }
            let (method, path) = (r.method.to_string(), r.path.clone());
            match (method.as_str(), path.as_str()) {
                ("GET", "/apis/rbacrules.io/v1alpha1/rbacrules") => {
                    r.respond(200, list("RbacRuleList", vec![rule_obj.clone()]))
                }
                ("GET", "/apis/rbacrules.io/v1alpha1/namespacedrbacrules") => {
                    r.respond(200, list("NamespacedRbacRuleList", vec![]))
                }
                // The Role the other controller made is listed with the
                // rest: only its name is looked up.
                ("GET", "/apis/rbac.authorization.k8s.io/v1/roles") => r.respond(
                    200,
                    list("RoleList", vec![json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                        "metadata": {"name": "viewer", "namespace": "team-a", "uid": "theirs"}})]),
                ),
                ("GET", p)
                    if p.starts_with("/apis/rbac.authorization.k8s.io/v1/")
                        && p.matches('/').count() == 4 =>
                {
                    r.respond(200, list("List", vec![]))
                }
                // The Role exists, made for the same Namespace by another
                // controller: adopted by lineage.
                ("GET", p) if p == format!("{ROLES}/viewer") => r.respond(
                    200,
                    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                        "metadata": {"name": "viewer", "namespace": "team-a", "uid": "theirs",
                                     "ownerReferences": owner("team-a")},
                        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
                ),
                ("GET", "/api") => r.respond(
                    200,
                    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
                ),
                ("GET", "/api/v1") => r.respond(
                    200,
                    json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                        {"name": "namespaces", "singularName": "namespace", "namespaced": false,
                         "kind": "Namespace", "verbs": ["get", "list", "watch"]}]}),
                ),
                ("GET", "/api/v1/namespaces") => r.respond(
                    200,
                    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                        "metadata": {"resourceVersion": "1"},
                        "items": [{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                            "metadata": {"name": "team-a", "uid": "team-a-uid"}}]}),
                ),
                // diff never writes.
                (m, p) => panic!("unexpected request {m} {p}"),
            }
        }
        drop(parked);
    });
    let args = DiffArgs {
        manage: rbac_rules::api::ManageLevel::All,
        allow_clusterrole: None,
        adopt_existing: false,
        timeout_seconds: 10,
        waivers: Default::default(),
        limits: Default::default(),
        params: Default::default(),
        max_unconfirmed_prunes: None,
        installed_settings: false,
        tenancy: Default::default(),
    };
    let (entries, unchanged) = diff(client, &args).await.expect("diff");
    scenario.abort();
    let changes: Vec<(Change, String)> = entries
        .iter()
        .map(|e| (e.change, e.id.to_string()))
        .collect();
    assert_eq!(
        changes,
        vec![
            (Change::Adopt, "Role team-a/viewer".to_string()),
            (Change::Create, "RoleBinding team-a/viewer".to_string()),
        ]
    );
    assert_eq!(unchanged, 0);
    // What the adoption's apply would leave: our manifest exactly, marked
    // as adopted (it existed before: never pruned).
    let mut adopted = role_manifest("viewer");
    adopted["metadata"]["annotations"]["rbacrules.io/adopted"] = json!("true");
    assert_eq!(entries[0].after.as_ref().expect("after"), &adopted);
    assert_eq!(exit_code(&entries), 1);
}

/// A refusal revokes: a live object of a *paused* trigger (kept, never
/// re-rendered) that grants what policy refuses — `*` on everything — is
/// deleted in the next reconcile, with a Warning Event naming why; the
/// binding beside it, which policy allows, stays.
#[tokio::test]
async fn a_live_object_policy_refuses_is_revoked_even_when_its_trigger_is_kept() {
    let (client, mut server) = pair();
    let rules = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer", "viewer"),
        Some(ready_status(2)),
    )]);
    let observed = store(vec![namespace(
        "team-a",
        json!({"rbacrules.io/paused": "true"}),
    )]);
    let mut hostile = role_manifest("viewer");
    hostile["rules"] = json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
    let live = owned(vec![hostile.clone(), binding_manifest("viewer", "viewer")]);
    let holds = BTreeMap::new();
    // The engine judges the live objects it can see (the controller mirrors
    // its own objects into the store it evaluates).
    let mut observed_with_live = observed;
    observed_with_live.insert(hostile).expect("role");
    let scenario = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(r) = server.next_opt().await {
            seen.push(format!("{} {}", r.method, r.path));
            if r.method == Method::DELETE {
                assert_eq!(r.path, format!("{ROLES}/viewer"));
                assert_eq!(r.body["preconditions"]["uid"], "viewer-live-uid");
                r.deleted();
            } else if r.path == EVENTS {
                seen.push(format!(
                    "EVENT {} {}",
                    r.body["type"].as_str().unwrap_or_default(),
                    r.body["reason"].as_str().unwrap_or_default()
                ));
                let body = r.body.clone();
                r.respond(201, body);
            } else if r.path == RULE_STATUS {
                let body = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
                    "metadata": {"name": "ns-viewer"}, "spec": viewer_spec("viewer", "viewer"),
                    "status": r.body["status"]});
                r.respond(200, body);
            } else {
                panic!("unexpected {} {}", r.method, r.path);
            }
        }
        seen
    });
    let mut s = syncer(client);
    let report = s
        .sync(&snapshot(&rules, &observed_with_live, &live, &holds))
        .await;
    drop(s);
    let seen = scenario.await.expect("scenario");
    assert_eq!(
        seen.iter().filter(|l| l.starts_with("DELETE")).count(),
        1,
        "{seen:?}"
    );
    assert!(
        !seen.iter().any(|l| l.contains("/rolebindings/")),
        "the allowed binding is left alone: {seen:?}"
    );
    let revoked: Vec<_> = report
        .written()
        .iter()
        .filter_map(|w| match &w.outcome {
            Outcome::Revoked(why) => Some((w.id.to_string(), why.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(revoked.len(), 1, "{revoked:?}");
    assert!(revoked[0].1.contains('*'), "{revoked:?}");
    assert!(
        seen.iter().any(|l| l == "EVENT Warning Revoked"),
        "a Warning Event: {seen:?}"
    );
}

/// A name the watches have not yet seen taken: the create is one unforced
/// apply; when another manager's object turns out to hold the name (409),
/// it is looked at and left alone like any foreign object, never taken
/// over by force.
#[tokio::test]
async fn an_unseen_foreign_object_conflicts_instead_of_being_taken_over() {
    let (client, mut server) = pair();
    let rules = rules(vec![rule(
        "ns-viewer",
        viewer_spec("viewer", "viewer"),
        None,
    )]);
    let observed = store(vec![namespace("team-a", json!({}))]);
    let owned = BTreeMap::new();
    let holds = BTreeMap::new();
    let scenario = tokio::spawn(async move {
        server
            .next()
            .await
            .expect_create(&format!("{ROLES}/viewer"))
            .fail(409, "Conflict");
        server
            .next()
            .await
            .expect(Method::GET, &format!("{ROLES}/viewer"))
            .respond(
                200,
                foreign_role(
                    Value::Null,
                    json!({"app.kubernetes.io/managed-by": "Helm"}),
                    json!({}),
                ),
            );
        // No forced apply; the binding waits for its role.
        let status = server.next().await.expect(Method::PATCH, RULE_STATUS);
        assert_eq!(conditions_of(&status.body)["Degraded"].1, "Conflict");
        let body = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": "ns-viewer"}, "spec": viewer_spec("viewer", "viewer")});
        status.respond(200, body);
        let event = server.next().await.expect(Method::POST, EVENTS);
        assert_eq!(event.body["reason"], "Conflict");
        let body = event.body.clone();
        event.respond(201, body);
        server.done().await;
    });
    let mut s = syncer(client);
    let report = s.sync(&snapshot(&rules, &observed, &owned, &holds)).await;
    drop(s);
    scenario.await.expect("scenario");
    assert!(matches!(
        report.written()[0].outcome,
        Outcome::Conflict { fresh: true, .. }
    ));
    assert!(matches!(report.written()[1].outcome, Outcome::Blocked(_)));
}
