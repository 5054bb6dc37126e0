//! Work a rule's triggers share within one evaluation: the checked policy
//! rules of the entries of a rule list kept in the cache, and the objects of
//! a related lookup (indexed by controller for `controlledByTrigger`). What
//! is shared must render, refuse and fail exactly as a render of its own.

use rbac_rules::api::OutputKind;
use rbac_rules::engine::{Engine, ErrorKind, Evaluation, Memo, Options};
use serde_json::{Value, json};

mod support;
use support::engine::{rules, store};

/// Two literal entries (kept in the cache, checked once) and one that
/// reads its trigger.
const ENTRIES: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: entries}
spec:
  trigger: {apiGroup: example.org, kind: Thing}
  outputs:
  - kind: ClusterRole
    name: "thing:{{trigger.metadata.name}}"
    rules:
    - {apiGroups: [example.org], resources: [things], verbs: [get]}
    - {apiGroups: [example.org], resources: [others, others/status], verbs: [list]}
    - {apiGroups: ["{{trigger.spec.group}}"], resources: [widgets], verbs: [get]}
"#;

fn thing(name: &str, group: &str) -> Value {
    json!({"apiVersion": "example.org/v1", "kind": "Thing",
           "metadata": {"name": name, "uid": format!("uid-{name}")},
           "spec": {"group": group}})
}

/// The rules of ClusterRole `name`.
fn rules_of(eval: &Evaluation, name: &str) -> Value {
    support::engine::rules_of(eval, OutputKind::ClusterRole, name)
}

#[test]
fn kept_entries_check_as_the_whole_list_does() {
    let objects = [
        thing("a", "ok.example.org"),
        thing("b", "*"),
        thing("c", "Not A Group!"),
        thing("d", "other.example.org"),
    ];
    let engine = Engine::new(&rules(ENTRIES), Options::default());
    let mut memo = Memo::new();
    for eval in [
        engine.evaluate(&store(&objects)),
        engine.evaluate_incremental(&store(&objects), &mut memo),
    ] {
        let literal = json!([
            {"apiGroups": ["example.org"], "resources": ["things"], "verbs": ["get"]},
            {"apiGroups": ["example.org"], "resources": ["others", "others/status"], "verbs": ["list"]},
        ]);
        for (name, group) in [("a", "ok.example.org"), ("d", "other.example.org")] {
            let mut want = literal.clone();
            if let Some(list) = want.as_array_mut() {
                list.push(
                    json!({"apiGroups": [group], "resources": ["widgets"], "verbs": ["get"]}),
                );
            }
            // The marks of data are gone from every entry, kept or not.
            assert_eq!(rules_of(&eval, &format!("thing:{name}")), want, "{name}");
        }
        let errors: Vec<_> = eval.errors().collect();
        assert_eq!(errors.len(), 2, "{errors:?}");
        let of = |t: &str| {
            errors
                .iter()
                .find(|e| e.trigger.as_deref() == Some(&format!("Thing.example.org/{t}")))
                .map(|e| (e.kind, e.field.clone()))
        };
        // Fields name the entry's place in the whole list, after the kept
        // entries.
        let field = "spec.outputs[0].rules[2].apiGroups[0]".to_string();
        assert_eq!(of("b"), Some((ErrorKind::EscalationDenied, field.clone())));
        assert_eq!(of("c"), Some((ErrorKind::InvalidOutput, field)));
        assert_eq!(rules_of(&eval, "thing:b"), Value::Null);
        assert_eq!(rules_of(&eval, "thing:c"), Value::Null);
    }
}

#[test]
fn triggers_whose_entries_expand_alike_share_one_rule_list() {
    let engine = Engine::new(&rules(ENTRIES), Options::default());
    let mut objects = vec![
        thing("a", "ok.example.org"),
        thing("b", "other.example.org"),
        thing("c", "ok.example.org"),
    ];
    let mut memo = Memo::new();
    let shared = |eval: &Evaluation| {
        let list = |name: &str| {
            eval.desired
                .get(&(
                    OutputKind::ClusterRole,
                    String::new(),
                    format!("thing:{name}"),
                ))
                .and_then(|d| d.object.rules().cloned())
        };
        match (list("a"), list("b"), list("c")) {
            (Some(a), Some(b), Some(c)) => (
                std::sync::Arc::ptr_eq(&a, &c),
                std::sync::Arc::ptr_eq(&a, &b),
            ),
            other => panic!("a role is missing: {other:?}"),
        }
    };
    let first = engine.evaluate_incremental(&store(&objects), &mut memo);
    // a and c render the same entries: one list; b its own.
    assert_eq!(shared(&first), (true, false));
    // Rendered again after a change, c still takes a's list; a list put
    // together before is not a grant for other entries.
    objects[2] = thing("c", "other.example.org");
    objects.push(thing("d", "*"));
    let second = engine.evaluate_incremental(&store(&objects), &mut memo);
    assert_eq!(rules_of(&second, "thing:c"), rules_of(&second, "thing:b"));
    assert_eq!(rules_of(&second, "thing:d"), Value::Null);
    assert_eq!(second.errors().count(), 1);
    assert_eq!(second.desired, engine.evaluate(&store(&objects)).desired);
    objects[2] = thing("c", "ok.example.org");
    let third = engine.evaluate_incremental(&store(&objects), &mut memo);
    assert_eq!(shared(&third), (true, false));
    assert_eq!(third.desired, engine.evaluate(&store(&objects)).desired);
}

const OWNED: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: owned}
spec:
  trigger: {apiGroup: example.org, kind: Thing}
  related:
  - name: deployments
    objects: {apiGroup: apps, kind: Deployment, namespace: sys, controlledByTrigger: true}
  outputs:
  - kind: ClusterRoleBinding
    name: "thing:{{trigger.metadata.name}}"
    roleRef: {kind: ClusterRole, name: view}
    subjects:
    - forEach: related.deployments
      as: d
      item: {kind: ServiceAccount, name: "{{d.spec.template.spec.serviceAccountName}}", namespace: sys}
"#;

/// A Deployment in `ns` with these ownerReferences.
fn deployment(name: &str, ns: &str, owners: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "ownerReferences": owners},
           "spec": {"template": {"spec": {"serviceAccountName": format!("sa-{name}")}}}})
}

fn controller(thing: &str, uid: &str, controls: bool) -> Value {
    json!({"apiVersion": "example.org/v1", "kind": "Thing", "name": thing, "uid": uid, "controller": controls})
}

fn subjects_of(eval: &Evaluation, name: &str) -> Vec<String> {
    eval.desired
        .iter()
        .find(|d| d.kind == OutputKind::ClusterRoleBinding && d.name == name)
        .map(|d| d.object.to_value()["subjects"].clone())
        .and_then(|s| s.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|s| s["name"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn owned_lookups_find_each_triggers_own_objects() {
    let mut objects = vec![
        thing("t1", "x.example.org"),
        thing("t2", "x.example.org"),
        deployment("d1", "sys", json!([controller("t1", "uid-t1", true)])),
        deployment("d2", "sys", json!([controller("t2", "uid-t2", true)])),
        // A controller without a uid is matched by kind and name.
        deployment("d3", "sys", json!([controller("t2", "", true)])),
        // Not the controller; another namespace.
        deployment("d4", "sys", json!([controller("t1", "uid-t1", false)])),
        deployment("d5", "other", json!([controller("t1", "uid-t1", true)])),
        // Two controllers (invalid in Kubernetes, still read).
        deployment(
            "d6",
            "sys",
            json!([controller("t1", "uid-t1", true), controller("t2", "", true)]),
        ),
    ];
    let engine = Engine::new(&rules(OWNED), Options::default());
    let mut memo = Memo::new();
    let eval = engine.evaluate_incremental(&store(&objects), &mut memo);
    assert_eq!(subjects_of(&eval, "thing:t1"), ["sa-d1", "sa-d6"]);
    assert_eq!(subjects_of(&eval, "thing:t2"), ["sa-d2", "sa-d3", "sa-d6"]);

    // d3 loses its controller: the next evaluation looks again.
    objects[4] = deployment("d3", "sys", json!([]));
    let eval = engine.evaluate_incremental(&store(&objects), &mut memo);
    assert_eq!(subjects_of(&eval, "thing:t2"), ["sa-d2", "sa-d6"]);
    assert_eq!(
        eval.desired,
        engine.evaluate(&store(&objects)).desired,
        "incremental equals full"
    );
}
