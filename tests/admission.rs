//! The admission fence in deploy/admission.yaml: every CEL expression
//! compiles, and each validation admits what the controller writes and
//! refuses what the default denials refuse.

use std::sync::Arc;

use cel::{Context, Env, Value as Cel};
use serde_json::{Value, json};

const CONTROLLER: &str = "system:serviceaccount:rbac-rules-system:rbac-rules";

fn policy() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/admission.yaml"
    ))
    .expect("deploy/admission.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    docs.into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .expect("a ValidatingAdmissionPolicy")
}

fn env() -> Arc<Env> {
    Arc::new(Env::stdlib())
}

/// Evaluates `expr` for a request; `None` where CEL errs (the API server
/// then applies failurePolicy Fail, i.e. refuses).
fn eval(expr: &str, op: &str, user: &str, object: &Value, old: &Value) -> Option<bool> {
    let env = env();
    let program = env
        .compile(expr)
        .unwrap_or_else(|e| panic!("{expr}: {e:?}"));
    let mut ctx = Context::with_env(env);
    ctx.add_variable_from_value(
        "request",
        cel::to_value(json!({"operation": op, "userInfo": {"username": user}})).expect("request"),
    );
    ctx.add_variable_from_value("object", cel::to_value(object).expect("object"));
    ctx.add_variable_from_value("oldObject", cel::to_value(old).expect("oldObject"));
    match program.execute(&ctx) {
        Ok(Cel::Bool(b)) => Some(b),
        _ => None,
    }
}

/// Whether the policy admits the request: a match condition that does not
/// hold lets it through unchecked; otherwise every validation must be true.
/// Returns the messages of the failed validations.
fn admit(op: &str, user: &str, object: &Value, old: &Value) -> Result<(), Vec<String>> {
    let p = policy();
    for m in p["spec"]["matchConditions"]
        .as_array()
        .expect("matchConditions")
    {
        let e = m["expression"].as_str().expect("expression");
        if eval(e, op, user, object, old) != Some(true) {
            return Ok(());
        }
    }
    let failed: Vec<String> = p["spec"]["validations"]
        .as_array()
        .expect("validations")
        .iter()
        .filter(|v| {
            eval(
                v["expression"].as_str().expect("expression"),
                op,
                user,
                object,
                old,
            ) != Some(true)
        })
        .map(|v| v["message"].as_str().unwrap_or_default().to_string())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed)
    }
}

fn write(object: &Value) -> Result<(), Vec<String>> {
    admit("CREATE", CONTROLLER, object, &Value::Null)
}

fn managed(kind: &str, name: &str, extra: Value) -> Value {
    let mut o = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "rbac-rules"}},
    });
    if let (Some(o), Some(extra)) = (o.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            o.insert(k.clone(), v.clone());
        }
    }
    o
}

fn role(rules: Value) -> Value {
    managed("ClusterRole", "widgets:edit", json!({"rules": rules}))
}

fn refused(r: Result<(), Vec<String>>, needle: &str) {
    match r {
        Ok(()) => panic!("admitted, expected a refusal mentioning {needle:?}"),
        Err(messages) => assert!(
            messages.iter().any(|m| m.contains(needle)),
            "refused, but not for {needle:?}: {messages:?}"
        ),
    }
}

#[test]
fn every_expression_compiles() {
    let p = policy();
    let env = env();
    let mut n = 0;
    for list in ["matchConditions", "validations"] {
        for v in p["spec"][list].as_array().expect("list") {
            let e = v["expression"].as_str().expect("expression");
            env.compile(e).unwrap_or_else(|err| panic!("{e}: {err:?}"));
            n += 1;
        }
    }
    assert!(n >= 7, "{n} expressions");
}

#[test]
fn what_the_controller_writes_is_admitted() {
    write(&role(json!([
        {"apiGroups": ["example.org"], "resources": ["widgets", "widgets/status"], "verbs": ["*"]},
        {"apiGroups": ["example.org"], "resources": ["*"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["secrets", "configmaps", "events"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings", "clusterrolebindings"], "verbs": ["*"]},
    ])))
    .expect("a managed role granting within named groups");
    write(&managed(
        "ClusterRole",
        "widgets-admin",
        json!({"aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.org/aggregate-to-admin": "true"}}]}}),
    ))
    .expect("an aggregated role with a label selector");
    write(&managed(
        "ClusterRoleBinding",
        "widgets:system",
        json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "widgets:system"},
               "subjects": [{"kind": "ServiceAccount", "name": "w", "namespace": "w"}]}),
    ))
    .expect("a binding to a generated role");
    admit(
        "DELETE",
        CONTROLLER,
        &Value::Null,
        &managed("Role", "old", json!({"rules": []})),
    )
    .expect("deleting a managed object");
}

#[test]
fn other_users_are_not_matched() {
    let cluster_admin_binding = json!({
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "someone"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
    });
    admit("CREATE", "admin", &cluster_admin_binding, &Value::Null).expect("not the controller");
    admit(
        "CREATE",
        "system:serviceaccount:other:rbac-rules",
        &cluster_admin_binding,
        &Value::Null,
    )
    .expect("another namespace's account");
    refused(write(&cluster_admin_binding), "managed-by");
}

#[test]
fn only_labelled_objects() {
    let mut o = role(json!([]));
    o["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "helm"});
    refused(write(&o), "managed-by");
    o["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("labels");
    refused(write(&o), "managed-by");
    refused(admit("DELETE", CONTROLLER, &Value::Null, &o), "managed-by");
}

#[test]
fn no_system_names_and_no_bindings_to_cluster_admin_or_system_roles() {
    refused(
        write(&managed(
            "ClusterRole",
            "system:controller:x",
            json!({"rules": []}),
        )),
        "system:*",
    );
    for target in [
        "cluster-admin",
        "system:masters-role",
        "system:controller:job-controller",
    ] {
        refused(
            write(&managed(
                "RoleBinding",
                "tenant",
                json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": target}}),
            )),
            "cluster-admin or system:*",
        );
    }
}

#[test]
fn no_escalate_bind_or_impersonate_including_through_wildcards() {
    let cases = [
        json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["escalate"]}),
        json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["bind"]}),
        json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["*"], "verbs": ["*"]}),
        json!({"apiGroups": ["*"], "resources": ["clusterroles"], "verbs": ["*"]}),
        json!({"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["*"]}),
        json!({"apiGroups": [""], "resources": ["users", "groups"], "verbs": ["impersonate"]}),
        json!({"apiGroups": [""], "resources": ["*"], "verbs": ["impersonate"]}),
        json!({"apiGroups": ["authentication.k8s.io"], "resources": ["userextras/*"], "verbs": ["impersonate"]}),
        json!({"apiGroups": ["authentication.k8s.io"], "resources": ["uids"], "verbs": ["*"]}),
    ];
    for rule in cases {
        refused(
            write(&role(json!([rule.clone()]))),
            "escalate, bind or impersonate",
        );
    }
}

#[test]
fn nothing_cluster_admin_equivalent() {
    refused(
        write(&role(
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
        )),
        "every verb",
    );
    // `*` within a named group stays allowed.
    write(&role(
        json!([{"apiGroups": ["example.org"], "resources": ["*"], "verbs": ["*"]}]),
    ))
    .expect("a named group");
}

#[test]
fn no_aggregation_into_the_controller_or_of_everything() {
    let mut o = role(json!([]));
    o["metadata"]["labels"]["rbacrules.io/aggregate-to-controller"] = json!("true");
    refused(write(&o), "aggregate into its own role");
    for selector in [
        json!({}),
        json!({"matchLabels": {}}),
        json!({"matchLabels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}),
        json!({"matchExpressions": [{"key": "kubernetes.io/bootstrapping", "operator": "Exists"}]}),
        json!({"matchLabels": {"rbacrules.io/aggregate-to-controller": "true"}}),
    ] {
        refused(
            write(&managed(
                "ClusterRole",
                "everything",
                json!({"aggregationRule": {"clusterRoleSelectors": [selector]}}),
            )),
            "aggregate into its own role",
        );
    }
}

/// Everything the built-in rules emit — on the shipped example and on a
/// cluster as Crossplane's chart leaves it — passes the fence: the fence and
/// the engine's default denials agree on what the controller writes.
#[test]
fn every_builtin_output_is_admitted() {
    use rbac_rules::render::{RenderArgs, render};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for objects in [
        "examples/crossplane-cluster.yaml",
        "tests/golden/crossplane-chart-deploy-false/objects.yaml",
    ] {
        let text = render(&RenderArgs {
            objects: vec![root.join(objects)],
            ..Default::default()
        })
        .expect("the built-in rules render");
        let outputs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
        assert!(outputs.len() > 10, "{objects}: {} objects", outputs.len());
        for o in &outputs {
            if let Err(refused) = write(o) {
                panic!(
                    "{objects}: {} {} refused by the fence: {refused:?}",
                    o["kind"], o["metadata"]["name"]
                );
            }
        }
    }
}
