//! Writes are pipelined: a pass keeps up to `--max-concurrent-writes`
//! applies in flight, and still writes every Role before any binding (a
//! binding never names a role that is not there yet), each object once and
//! none read first.

mod support;

use std::time::Duration;

use serde_json::json;
use support::cluster::{Behaviour, Controller, FakeCluster, RBAC};

#[tokio::test]
async fn a_pass_keeps_several_writes_in_flight_and_roles_go_first() {
    const NAMESPACES: usize = 30;
    const LIMIT: usize = 4;
    let rule = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
    "metadata": {"name": "ns-viewer", "uid": "ns-viewer-uid", "generation": 1, "resourceVersion": "1"},
    "spec": {
        "trigger": {"kind": "Namespace", "metadataOnly": true},
        "outputs": [
            {"kind": "Role", "name": "viewer",
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
            {"kind": "RoleBinding", "name": "viewer",
             "roleRef": {"kind": "Role", "name": "viewer"},
             "subjects": [{"kind": "Group", "name": "viewers"}]}
        ]
    }});
    let names: Vec<String> = (0..NAMESPACES).map(|i| format!("team-{i:02}")).collect();
    let (client, fake) = FakeCluster::start(
        vec![rule],
        &names,
        Behaviour {
            apply_delay: Duration::from_millis(5),
            hold_first_apply: false,
        },
    );
    let limit = format!("--max-concurrent-writes={LIMIT}");
    let controller = Controller::start(client, &[&limit]);
    fake.until(
        Duration::from_secs(20),
        "a Role and a binding per Namespace",
        |f| f.rbac().len() == 2 * NAMESPACES,
    )
    .await;
    controller.stop().await;

    let most = fake.max_in_flight();
    assert!(
        most > 1 && most <= LIMIT,
        "{most} applies in flight at most"
    );
    let log = fake.log();
    let position = |pred: &dyn Fn(&str) -> bool| -> Vec<usize> {
        log.iter()
            .enumerate()
            .filter(|(_, l)| pred(l))
            .map(|(i, _)| i)
            .collect()
    };
    let roles_answered = position(&|l| l.starts_with("ANSWERED PATCH") && l.contains("/roles/"));
    let bindings_sent = position(&|l| l.starts_with("PATCH") && l.contains("/rolebindings/"));
    assert_eq!(
        (roles_answered.len(), bindings_sent.len()),
        (NAMESPACES, NAMESPACES),
        "each object written once: {log:#?}"
    );
    assert!(
        roles_answered.iter().max() < bindings_sent.iter().min(),
        "a binding was sent before every Role was written: {log:#?}"
    );
    let reads = position(&|l| l.starts_with(&format!("GET {RBAC}/namespaces/")));
    assert!(reads.is_empty(), "read before writing: {log:#?}");
}
