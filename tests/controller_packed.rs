//! Roles no rule reads are cached packed (their body as JSON, only their
//! identity and provenance in the engine's view). A packed Role that no
//! desired copy stands for is unpacked, so that policy still judges it:
//! a live Role of a paused trigger that grants what policy refuses is
//! revoked by the running controller.

mod support;

use std::time::Duration;

use serde_json::json;
use support::cluster::{Behaviour, Controller, FakeCluster, RBAC};

#[tokio::test]
async fn a_packed_role_kept_for_a_paused_trigger_is_still_judged_and_revoked() {
    let rule = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
    "metadata": {"name": "ns-viewer", "uid": "ns-viewer-uid", "generation": 1, "resourceVersion": "1"},
    "spec": {
        "trigger": {"kind": "Namespace", "metadataOnly": true,
                    "pause": {"annotation": "rbacrules.io/paused"}},
        "outputs": [
            {"kind": "Role", "name": "viewer",
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}
        ]
    }});
    let (client, fake) = FakeCluster::start(
        vec![rule],
        &["team-a".to_string(), "team-b".to_string()],
        Behaviour {
            apply_delay: Duration::ZERO,
            hold_first_apply: false,
        },
    );
    fake.annotate_namespace("team-a", json!({"rbacrules.io/paused": "true"}));
    // Ours by provenance, kept as it is while its trigger is paused, and
    // granting everything: policy refuses it.
    let hostile = format!("{RBAC}/namespaces/team-a/roles/viewer");
    fake.put_ours(
        &hostile,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "viewer", "namespace": "team-a",
                "labels": {"app.kubernetes.io/managed-by": "rbac-rules", "rbacrules.io/rule": "ns-viewer"},
                "annotations": {"rbacrules.io/rule": "ns-viewer", "rbacrules.io/trigger": "Namespace/team-a"}},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
    );
    let controller = Controller::start(client, &[]);
    let made = format!("{RBAC}/namespaces/team-b/roles/viewer");
    fake.until(
        Duration::from_secs(20),
        "the hostile Role revoked, team-b's made",
        |f| {
            let rbac = f.rbac();
            !rbac.contains_key(&hostile) && rbac.contains_key(&made)
        },
    )
    .await;
    controller.stop().await;
    let log = fake.log();
    assert!(log.contains(&format!("DELETE {hostile}")), "{log:#?}");
    // Kept, never re-applied: only revoked.
    assert!(!log.contains(&format!("PATCH {hostile}")), "{log:#?}");
}

/// Our own objects are packed even where a rule reads the kind: while a
/// desired copy stands for one, no rule's view shows the live copy. One
/// that no desired copy stands for (here: its trigger is paused) is visible
/// to the rules after it; the pass that finds it packed is dropped and
/// planned again with its body, so a reader never writes a narrower copy
/// in between.
#[tokio::test]
async fn a_reader_of_a_kept_cluster_role_never_writes_without_its_rules() {
    let base = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
    "metadata": {"name": "a-base", "uid": "a-base-uid", "generation": 1, "resourceVersion": "1"},
    "spec": {
        "trigger": {"kind": "Namespace", "metadataOnly": true,
                    "pause": {"annotation": "rbacrules.io/paused"}},
        "outputs": [
            {"kind": "ClusterRole", "name": "base-{{trigger.metadata.name}}",
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}
        ]
    }});
    let reader = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
    "metadata": {"name": "b-reader", "uid": "b-reader-uid", "generation": 1, "resourceVersion": "1"},
    "spec": {
        "trigger": {"kind": "Namespace", "metadataOnly": true},
        "outputs": [
            {"kind": "Role", "name": "copy",
             "rulesFrom": {"clusterRoleNames": ["base-{{trigger.metadata.name}}"]}}
        ]
    }});
    let (client, fake) = FakeCluster::start(
        vec![base, reader],
        &["team-a".to_string(), "team-b".to_string()],
        Behaviour {
            apply_delay: Duration::ZERO,
            hold_first_apply: false,
        },
    );
    fake.annotate_namespace("team-a", json!({"rbacrules.io/paused": "true"}));
    // Made by the first rule before its trigger was paused: kept as it is.
    let kept = format!("{RBAC}/clusterroles/base-team-a");
    fake.put_ours(
        &kept,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "base-team-a",
                "labels": {"app.kubernetes.io/managed-by": "rbac-rules"},
                "annotations": {"rbacrules.io/rule": "a-base", "rbacrules.io/trigger": "Namespace/team-a"}},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
    );
    let controller = Controller::start(client, &[]);
    let copy = |ns: &str| format!("{RBAC}/namespaces/{ns}/roles/copy");
    fake.until(Duration::from_secs(20), "both copies made", |f| {
        let rbac = f.rbac();
        rbac.contains_key(&copy("team-a")) && rbac.contains_key(&copy("team-b"))
    })
    .await;
    // Let any further pass run.
    tokio::time::sleep(Duration::from_millis(500)).await;
    controller.stop().await;
    let rbac = fake.rbac();
    for ns in ["team-a", "team-b"] {
        assert_eq!(
            rbac[&copy(ns)]["rules"],
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
            "{ns}"
        );
    }
    let log = fake.log();
    let writes = |path: &str| {
        log.iter()
            .filter(|l| **l == format!("PATCH {path}"))
            .count()
    };
    // Written once, with the kept role's rules; the kept role never.
    assert_eq!(writes(&copy("team-a")), 1, "{log:#?}");
    assert_eq!(writes(&kept), 0, "{log:#?}");
}
