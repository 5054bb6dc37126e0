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
    fake.put_rbac(
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
