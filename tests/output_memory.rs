//! Emitted objects share what they have in common instead of holding
//! copies: rule lists copied from ClusterRoles, labels, annotations and
//! ownerReferences. Memory at scale depends on it (issue 9).

use std::sync::Arc;

use rbac_rules::api::OutputKind;
use rbac_rules::engine::{Engine, Evaluation, Manifest, Options, OwnerRef, StrMap};
use serde_json::{Value, json};

mod support;
use support::engine::{rules, store};

const RULES: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: bases}
spec:
  outputs:
  - kind: ClusterRole
    name: widgets-edit
    labels: {example.org/ns-edit: "true"}
    rules:
    - {apiGroups: [example.org], resources: [widgets, widgets/status], verbs: [get, list, update]}
  - kind: ClusterRole
    name: gadgets-edit
    labels: {example.org/ns-edit: "true"}
    rules:
    - {apiGroups: [example.org], resources: [gadgets], verbs: [get, list, update]}
---
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: per-namespace}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: Role
    name: edit
    rulesFrom:
      clusterRoleSelector:
        matchLabels: {example.org/ns-edit: "true"}
  - kind: Role
    name: widgets
    rulesFrom:
      clusterRoleNames: [widgets-edit]
"#;

fn ns(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "uid": format!("uid-{name}")}})
}

fn evaluate() -> Evaluation {
    let engine = Engine::new(&rules(RULES), Options::default());
    let eval = engine.evaluate(&store(&[ns("a"), ns("b")]));
    assert_eq!(
        eval.errors().count(),
        0,
        "{:?}",
        eval.errors().collect::<Vec<_>>()
    );
    eval
}

fn object(eval: &Evaluation, kind: OutputKind, ns: &str, name: &str) -> Manifest {
    let key = (kind, ns.to_string(), name.to_string());
    eval.desired
        .get(&key)
        .unwrap_or_else(|| panic!("{key:?} is desired"))
        .object
        .clone()
}

fn rules_of(m: &Manifest) -> Arc<Vec<k8s_openapi::api::rbac::v1::PolicyRule>> {
    Arc::clone(m.rules().expect("a role"))
}

#[test]
fn roles_copying_cluster_roles_share_their_rule_lists() {
    let eval = evaluate();
    let widgets = object(&eval, OutputKind::ClusterRole, "", "widgets-edit");
    let (edit_a, edit_b) = (
        object(&eval, OutputKind::Role, "a", "edit"),
        object(&eval, OutputKind::Role, "b", "edit"),
    );
    // Two ClusterRoles merged: one list for every Role copying the same.
    assert_eq!(rules_of(&edit_a).len(), 1);
    assert_eq!(
        rules_of(&edit_a)[0].resources.as_deref(),
        Some(
            &[
                "gadgets".to_string(),
                "widgets".into(),
                "widgets/status".into()
            ][..]
        )
    );
    assert!(Arc::ptr_eq(&rules_of(&edit_a), &rules_of(&edit_b)));
    // One ClusterRole copied as it is: its own list, not a copy.
    for ns in ["a", "b"] {
        let copy = object(&eval, OutputKind::Role, ns, "widgets");
        assert_eq!(rules_of(&copy), rules_of(&widgets));
        assert!(Arc::ptr_eq(&rules_of(&copy), &rules_of(&widgets)), "{ns}");
    }
}

#[test]
fn outputs_share_labels_annotations_and_owners() {
    let eval = evaluate();
    let edit_a = object(&eval, OutputKind::Role, "a", "edit");
    let widgets_a = object(&eval, OutputKind::Role, "a", "widgets");
    let edit_b = object(&eval, OutputKind::Role, "b", "edit");
    // One template's labels, whatever the trigger.
    assert_eq!(
        edit_a.labels().get("app.kubernetes.io/managed-by"),
        Some("rbac-rules")
    );
    assert!(StrMap::ptr_eq(edit_a.labels(), edit_b.labels()));
    assert!(StrMap::ptr_eq(edit_a.labels(), widgets_a.labels()));
    // One trigger's annotations and owner, whatever the output.
    assert_eq!(
        edit_a.annotations().get("rbacrules.io/trigger"),
        Some("Namespace/a")
    );
    assert!(StrMap::ptr_eq(
        edit_a.annotations(),
        widgets_a.annotations()
    ));
    assert!(!StrMap::ptr_eq(edit_a.annotations(), edit_b.annotations()));
    let uid = |m: &Manifest| match m.meta().owner.clone() {
        Some(OwnerRef::Controller { uid, .. }) => uid,
        other => panic!("a controller reference to the Namespace: {other:?}"),
    };
    assert!(Arc::ptr_eq(&uid(&edit_a), &uid(&widgets_a)));
    assert_eq!(&*uid(&edit_b), "uid-b");
    assert_eq!(
        edit_b.to_value()["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Namespace", "name": "b", "uid": "uid-b",
                "controller": true, "blockOwnerDeletion": true}])
    );
    // Sharing never shows in the JSON.
    assert_eq!(
        edit_a.to_value()["metadata"]["annotations"],
        json!({"rbacrules.io/rule": "per-namespace", "rbacrules.io/trigger": "Namespace/a"})
    );
}
