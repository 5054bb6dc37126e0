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

/// The resource a request addresses, from the object's kind.
fn resource_of(object: &Value, old: &Value) -> &'static str {
    let kind = if object.is_null() {
        &old["kind"]
    } else {
        &object["kind"]
    };
    match kind.as_str() {
        Some("ClusterRole") => "clusterroles",
        Some("Role") => "roles",
        Some("ClusterRoleBinding") => "clusterrolebindings",
        Some("RoleBinding") => "rolebindings",
        k => panic!("not an RBAC kind: {k:?}"),
    }
}

/// One admission request as the API server hands it to CEL: `request`,
/// `object` (null on DELETE), `oldObject` (null on CREATE) and the policy's
/// `variables`, evaluated in order (one that errs is left out, so any
/// expression reading it errs too, as on the server).
struct Request {
    env: Arc<Env>,
    vars: Vec<(&'static str, cel::Value)>,
    variables: std::collections::HashMap<String, Cel>,
}

impl Request {
    fn new(policy: &Value, op: &str, user: &str, object: &Value, old: &Value) -> Request {
        let resource = resource_of(object, old);
        let mut r = Request {
            env: env(),
            vars: vec![
                (
                    "request",
                    cel::to_value(json!({
                        "operation": op,
                        "userInfo": {"username": user},
                        "resource": {"group": "rbac.authorization.k8s.io", "version": "v1", "resource": resource},
                    }))
                    .expect("request"),
                ),
                ("object", cel::to_value(object).expect("object")),
                ("oldObject", cel::to_value(old).expect("oldObject")),
            ],
            variables: Default::default(),
        };
        for v in policy["spec"]["variables"].as_array().into_iter().flatten() {
            let name = v["name"].as_str().expect("variable name");
            if let Some(value) = r.value(v["expression"].as_str().expect("expression")) {
                r.variables.insert(name.to_string(), value);
            }
        }
        r
    }

    fn value(&self, expr: &str) -> Option<Cel> {
        let program = self
            .env
            .compile(expr)
            .unwrap_or_else(|e| panic!("{expr}: {e:?}"));
        let mut ctx = Context::with_env(self.env.clone());
        for (name, value) in &self.vars {
            ctx.add_variable_from_value(*name, value.clone());
        }
        ctx.add_variable_from_value("variables", self.variables.clone());
        program.execute(&ctx).ok()
    }

    /// `None` where CEL errs (the API server then applies failurePolicy
    /// Fail, i.e. refuses).
    fn eval(&self, expr: &str) -> Option<bool> {
        match self.value(expr) {
            Some(Cel::Bool(b)) => Some(b),
            _ => None,
        }
    }
}

/// Whether the policy admits the request: a match condition that does not
/// hold lets it through unchecked; otherwise every validation must be true.
/// Returns the messages of the failed validations.
fn admit(op: &str, user: &str, object: &Value, old: &Value) -> Result<(), Vec<String>> {
    admit_by(&policy(), op, user, object, old)
}

/// [`admit`] by the policy `p`.
fn admit_by(
    p: &Value,
    op: &str,
    user: &str,
    object: &Value,
    old: &Value,
) -> Result<(), Vec<String>> {
    let request = Request::new(p, op, user, object, old);
    if !matched(p, &request) {
        return Ok(());
    }
    let failed: Vec<String> = p["spec"]["validations"]
        .as_array()
        .expect("validations")
        .iter()
        .filter(|v| request.eval(v["expression"].as_str().expect("expression")) != Some(true))
        .map(|v| v["message"].as_str().unwrap_or_default().to_string())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed)
    }
}

/// Whether every match condition holds.
fn matched(p: &Value, request: &Request) -> bool {
    p["spec"]["matchConditions"]
        .as_array()
        .expect("matchConditions")
        .iter()
        .all(|m| request.eval(m["expression"].as_str().expect("expression")) == Some(true))
}

/// `o` as the API server hands it to admission: Role and ClusterRole carry
/// `rules` without omitempty, so a role without rules (an aggregated one)
/// arrives as `rules: null`.
fn as_served(o: &Value) -> Value {
    let mut o = o.clone();
    if matches!(o["kind"].as_str(), Some("ClusterRole" | "Role")) && o.get("rules").is_none() {
        o["rules"] = Value::Null;
    }
    o
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
    for list in ["matchConditions", "variables", "validations"] {
        for v in p["spec"][list].as_array().expect("list") {
            let e = v["expression"].as_str().expect("expression");
            env.compile(e).unwrap_or_else(|err| panic!("{e}: {err:?}"));
            n += 1;
        }
    }
    assert!(n >= 9, "{n} expressions");
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
fn only_the_controllers_service_account_is_matched_in_any_namespace() {
    let cluster_admin_binding = json!({
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "someone"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
    });
    for user in [
        "admin",
        "system:admin",
        "system:serviceaccount:rbac-rules-system:default",
        "system:serviceaccount:rbac-rules-system:rbac-rules-other",
        "system:serviceaccount:rbac-rules-system:other-rbac-rules",
        "system:serviceaccount:rbac-rules:crossplane",
        "rbac-rules",
    ] {
        admit("CREATE", user, &cluster_admin_binding, &Value::Null)
            .unwrap_or_else(|e| panic!("{user} is not the controller, yet refused: {e:?}"));
    }
    refused(write(&cluster_admin_binding), "managed-by");
    // Installed in another namespace, the controller is fenced there too.
    for ns in ["other", "platform-rbac", "kube-system"] {
        refused(
            admit(
                "CREATE",
                &format!("system:serviceaccount:{ns}:rbac-rules"),
                &cluster_admin_binding,
                &Value::Null,
            ),
            "managed-by",
        );
    }
}

/// UPDATE and DELETE are judged by the old object as well: the controller
/// may not take, relabel, overwrite or delete what it did not make.
#[test]
fn update_and_delete_check_the_old_object() {
    let ours = role(json!([]));
    let mut unlabelled = ours.clone();
    unlabelled["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("labels");
    let mut helm = ours.clone();
    helm["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "Helm"});
    admit("UPDATE", CONTROLLER, &ours, &ours).expect("updating its own object");
    admit("DELETE", CONTROLLER, &Value::Null, &ours).expect("deleting its own object");
    for theirs in [&unlabelled, &helm] {
        // A benign, labelled new version over someone else's object.
        refused(admit("UPDATE", CONTROLLER, &ours, theirs), "managed-by");
        refused(
            admit("DELETE", CONTROLLER, &Value::Null, theirs),
            "managed-by",
        );
        // Giving up its own label is refused too.
        refused(admit("UPDATE", CONTROLLER, theirs, &ours), "managed-by");
    }
    // Other users still may do all of that.
    admit("UPDATE", "admin", &ours, &unlabelled).expect("not the controller");
    admit("DELETE", "admin", &Value::Null, &unlabelled).expect("not the controller");
}

/// What no version of the object may be, whatever labels it carries.
fn protected() -> Vec<Value> {
    let mut out = Vec::new();
    for name in [
        "cluster-admin",
        "admin",
        "edit",
        "view",
        "system:aggregate-to-edit",
        "system:controller:clusterrole-aggregation-controller",
        "system:basic-user",
    ] {
        out.push(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": []}),
        );
    }
    for name in [
        "cluster-admin",
        "system:basic-user",
        "system:public-info-viewer",
    ] {
        out.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "widgets"},
            "subjects": []}));
    }
    // Bootstrap objects by their label, whatever their name.
    out.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "extension-apiserver-authentication-reader", "namespace": "kube-system",
                     "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
        "rules": []}));
    out.push(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "widgets", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
        "rules": []}),
    );
    // The controller's own, by name, as deploy/ installs them.
    for file in [
        "deploy/controller/rbac.yaml",
        "deploy/controller/allow-list.yaml",
    ] {
        let text =
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
                .expect(file);
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
        assert!(!docs.is_empty(), "{file}");
        out.extend(docs);
    }
    out
}

/// Benign writes of `o`: no rules, no aggregation, the controller's label
/// beside its own labels and (unless a label is what protects it) instead
/// of them.
fn labelled_benign(o: &Value) -> Vec<Value> {
    let mut o = o.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("aggregationRule");
        if m.contains_key("rules") {
            m.insert("rules".into(), json!([]));
        }
    }
    let mut out = Vec::new();
    let by_label = o["metadata"]["labels"]
        .get("kubernetes.io/bootstrapping")
        .is_some();
    if !by_label {
        let mut only = o.clone();
        only["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "rbac-rules"});
        out.push(only);
    }
    o["metadata"]["labels"]["app.kubernetes.io/managed-by"] = json!("rbac-rules");
    out.push(o);
    out
}

#[test]
fn protected_objects_are_never_written_nor_deleted_whatever_their_labels() {
    let objects = protected();
    let names: Vec<&str> = objects
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    for own in [
        "rbac-rules",
        "rbac-rules:controller",
        "rbac-rules:builtin-rules",
        "rbac-rules:allow-list",
        "rbac-rules:leader-election",
    ] {
        assert!(
            names.contains(&own),
            "{own} in deploy/controller: {names:?}"
        );
    }
    let needle = "protected objects";
    for live in &objects {
        let what = format!("{} {}", live["kind"], live["metadata"]["name"]);
        for ours in labelled_benign(live) {
            for (op, new, old) in [
                ("CREATE", &ours, &Value::Null),
                // A benign new version over the live one, as it is ...
                ("UPDATE", &ours, live),
                // ... or as if the controller had labelled it before.
                ("UPDATE", &ours, &ours),
                ("DELETE", &Value::Null, live),
                ("DELETE", &Value::Null, &ours),
            ] {
                match admit(op, CONTROLLER, new, old) {
                    Ok(()) => panic!("{op} of {what} admitted: {new} over {old}"),
                    Err(m) => assert!(
                        m.iter().any(|m| m.contains(needle)),
                        "{op} of {what} refused, but not as protected: {m:?}"
                    ),
                }
            }
            admit("UPDATE", "admin", &ours, live).expect("other users are not fenced");
        }
    }
}

#[test]
fn near_names_are_not_protected() {
    // Cluster-wide names only: a namespaced Role may be called `edit`.
    write(&managed("Role", "edit", json!({"rules": []}))).expect("a Role named edit");
    write(&managed(
        "RoleBinding",
        "admin",
        json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "edit"}}),
    ))
    .expect("a RoleBinding named admin");
    for name in [
        "crossplane-edit",
        "crossplane:rbac-rules",
        "rbac-rules-widgets",
        "widgets:system",
        "editor",
    ] {
        write(&managed("ClusterRole", name, json!({"rules": []})))
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
    }
}

#[test]
fn no_binding_to_everyone() {
    for subject in [
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}),
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:unauthenticated"}),
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:anonymous"}),
    ] {
        let binding = managed(
            "RoleBinding",
            "tenant",
            json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "widgets-view"},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}, subject]}),
        );
        refused(write(&binding), "everyone");
    }
    write(&managed(
        "RoleBinding",
        "tenant",
        json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "widgets-view"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "team-a"},
                            {"kind": "ServiceAccount", "name": "default", "namespace": "a"}]}),
    ))
    .expect("named subjects");
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
        // Negative requirements alone match cluster-admin and every other
        // role without that label.
        json!({"matchExpressions": [{"key": "example.org/x", "operator": "DoesNotExist"}]}),
        json!({"matchExpressions": [{"key": "example.org/x", "operator": "NotIn", "values": ["a"]}]}),
        json!({"matchExpressions": []}),
        // The labels the bootstrap roles carry to aggregate into admin,
        // edit and view (system:aggregate-to-edit grants impersonate on
        // ServiceAccounts).
        json!({"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}}),
        json!({"matchExpressions": [{"key": "rbac.authorization.k8s.io/aggregate-to-admin", "operator": "Exists"}]}),
        // The controller's own roles.
        json!({"matchLabels": {"app.kubernetes.io/name": "rbac-rules"}}),
        json!({"matchLabels": {"app.kubernetes.io/part-of": "rbac-rules", "example.org/x": "y"}}),
        json!({"matchExpressions": [{"key": "app.kubernetes.io/part-of", "operator": "Exists"}]}),
        json!({"matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In", "values": ["crossplane", "rbac-rules"]}]}),
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
    // Positive requirements on other labels are fine, negative ones beside
    // them too.
    for selector in [
        json!({"matchExpressions": [{"key": "example.org/aggregate-to-admin", "operator": "Exists"}]}),
        json!({"matchExpressions": [
            {"key": "example.org/aggregate-to-admin", "operator": "In", "values": ["true"]},
            {"key": "example.org/legacy", "operator": "DoesNotExist"}]}),
        json!({"matchLabels": {"app.kubernetes.io/name": "crossplane"}}),
    ] {
        write(&as_served(&managed(
            "ClusterRole",
            "widgets-admin",
            json!({"aggregationRule": {"clusterRoleSelectors": [selector.clone()]}}),
        )))
        .unwrap_or_else(|e| panic!("{selector}: {e:?}"));
    }
    // Turning a benign aggregated role of its own into one that selects the
    // bootstrap roles is refused as well.
    let benign = managed(
        "ClusterRole",
        "widgets-admin",
        json!({"aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.org/aggregate-to-admin": "true"}}]}}),
    );
    let mut bad = benign.clone();
    bad["aggregationRule"]["clusterRoleSelectors"] =
        json!([{"matchLabels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}]);
    refused(
        admit("UPDATE", CONTROLLER, &bad, &benign),
        "aggregate into its own role",
    );
    admit("UPDATE", CONTROLLER, &benign, &bad).expect("repairing its own role");
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
        for o in &outputs.iter().map(as_served).collect::<Vec<_>>() {
            // Created, re-applied, deleted.
            for (op, new, old) in [
                ("CREATE", o, &Value::Null),
                ("UPDATE", o, o),
                ("DELETE", &Value::Null, o),
            ] {
                if let Err(refused) = admit(op, CONTROLLER, new, old) {
                    panic!(
                        "{objects}: {op} {} {} refused by the fence: {refused:?}",
                        o["kind"], o["metadata"]["name"]
                    );
                }
            }
        }
    }
}

/// Seen on a real API server: an aggregated ClusterRole reaches CEL with
/// `rules: null`, and a validation iterating over it erred, refusing every
/// aggregated role the controller wrote.
#[test]
fn a_role_without_rules_as_the_server_presents_it() {
    let aggregated = as_served(&managed(
        "ClusterRole",
        "widgets-admin",
        json!({"aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.org/aggregate-to-admin": "true"}}]}}),
    ));
    assert!(aggregated["rules"].is_null() && aggregated.get("rules").is_some());
    write(&aggregated).expect("created");
    admit("UPDATE", CONTROLLER, &aggregated, &aggregated).expect("re-applied");
    admit("DELETE", CONTROLLER, &Value::Null, &aggregated).expect("deleted");
    write(&as_served(&managed("Role", "empty", json!({})))).expect("a Role without rules");
}

// ---------------------------------------------------------------------
// The inventory fence (deploy/inventory-fence.yaml): nobody but the
// controller puts its inventory keys on an RBAC object.
// ---------------------------------------------------------------------

fn inventory_policy() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/inventory-fence.yaml"
    ))
    .expect("deploy/inventory-fence.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    let policy = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .expect("a ValidatingAdmissionPolicy")
        .clone();
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .expect("its binding");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    policy
}

/// A namespace admin's write, as the inventory fence judges it.
fn tenant_write(op: &str, user: &str, object: &Value, old: &Value) -> Result<(), Vec<String>> {
    admit_by(&inventory_policy(), op, user, object, old)
}

fn tenant_role(labels: Value, annotations: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "mine", "namespace": "team-a", "labels": labels, "annotations": annotations},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})
}

/// Identities a namespace admin has or can act as (an SA it creates, named
/// like the controller's, in its own namespace), and other writers.
const OTHERS: [&str; 6] = [
    "alice",
    "system:admin",
    "system:serviceaccount:team-a:default",
    "system:serviceaccount:team-a:rbac-rules",
    "system:serviceaccount:rbac-rules-system:default",
    "system:serviceaccount:kube-system:clusterrole-aggregation-controller",
];

#[test]
fn every_inventory_expression_compiles_and_deletes_are_not_fenced() {
    let p = inventory_policy();
    let env = env();
    for list in ["matchConditions", "validations"] {
        for v in p["spec"][list].as_array().expect("list") {
            let e = v["expression"].as_str().expect("expression");
            env.compile(e).unwrap_or_else(|err| panic!("{e}: {err:?}"));
        }
    }
    // Taking an object out of the inventory by deleting it stays anyone's
    // right (RBAC decides).
    assert_eq!(
        p["spec"]["matchConstraints"]["resourceRules"][0]["operations"],
        json!(["CREATE", "UPDATE"])
    );
}

/// Nobody but the controller creates an object with our keys, adds them
/// or changes them; writes that keep them, take them off or carry none
/// pass.
#[test]
fn nobody_but_the_controller_puts_our_keys_on_an_object() {
    let ours = tenant_role(
        json!({"app.kubernetes.io/managed-by": "rbac-rules", "rbacrules.io/rule": "ns-viewer"}),
        json!({"rbacrules.io/rule": "ns-viewer", "rbacrules.io/trigger": "Namespace/team-a"}),
    );
    let plain = tenant_role(json!({"app": "mine"}), json!({}));
    let label_only = tenant_role(
        json!({"app.kubernetes.io/managed-by": "rbac-rules"}),
        json!({}),
    );
    let annotation_only = tenant_role(json!({}), json!({"rbacrules.io/rule": "ns-viewer"}));
    let trigger_only = tenant_role(
        json!({}),
        json!({"rbacrules.io/trigger": "Namespace/team-b"}),
    );
    let mut repointed = ours.clone();
    repointed["metadata"]["annotations"]["rbacrules.io/rule"] = json!("another-rule");
    let mut relabelled = ours.clone();
    relabelled["metadata"]["labels"]["rbacrules.io/rule"] = json!("another-rule");
    let mut widened = ours.clone();
    widened["rules"] = json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]);
    let mut extra_label = ours.clone();
    extra_label["metadata"]["labels"]["team"] = json!("a");
    let helm = tenant_role(json!({"app.kubernetes.io/managed-by": "Helm"}), json!({}));
    for user in OTHERS {
        for forged in [&ours, &label_only, &annotation_only, &trigger_only] {
            refused(
                tenant_write("CREATE", user, forged, &Value::Null),
                "rbac-rules controller",
            );
            refused(
                tenant_write("UPDATE", user, forged, &plain),
                "rbac-rules controller",
            );
        }
        refused(
            tenant_write("UPDATE", user, &ours, &helm),
            "managed-by=rbac-rules",
        );
        refused(
            tenant_write("UPDATE", user, &repointed, &ours),
            "rbacrules.io/rule",
        );
        refused(
            tenant_write("UPDATE", user, &relabelled, &ours),
            "rbacrules.io/rule",
        );
        // Kept as they are: the aggregation controller, the garbage
        // collector, a label of someone else's, drift the controller undoes.
        for kept in [&ours, &widened, &extra_label] {
            tenant_write("UPDATE", user, kept, &ours)
                .unwrap_or_else(|e| panic!("{user}: keeping our keys refused: {e:?}"));
        }
        // Taken off, or never ours.
        for theirs in [&plain, &helm] {
            tenant_write("UPDATE", user, theirs, &ours)
                .unwrap_or_else(|e| panic!("{user}: taking our keys off refused: {e:?}"));
            tenant_write("CREATE", user, theirs, &Value::Null)
                .unwrap_or_else(|e| panic!("{user}: a plain Role refused: {e:?}"));
        }
    }
    // The controller itself is not matched: its writes are the other
    // fence's (deploy/admission.yaml).
    let controller = "system:serviceaccount:rbac-rules-system:rbac-rules";
    tenant_write("CREATE", controller, &ours, &Value::Null).expect("the controller");
    tenant_write("UPDATE", controller, &repointed, &ours).expect("the controller");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// Over any labels and annotations a tenant writes on a new object: the
    /// fence admits it exactly when it carries none of our keys.
    #[test]
    fn a_tenants_new_object_is_admitted_iff_it_claims_nothing(
        labels in proptest::collection::btree_map(
            proptest::sample::select(vec!["app.kubernetes.io/managed-by", "rbacrules.io/rule",
                "rbacrules.io/trigger", "app", "rbacrules.io/aggregate-to-controller"]),
            proptest::sample::select(vec!["rbac-rules", "Helm", "x"]), 0..4),
        annotations in proptest::collection::btree_map(
            proptest::sample::select(vec!["rbacrules.io/rule", "rbacrules.io/trigger", "note"]),
            proptest::sample::select(vec!["ns-viewer", "x"]), 0..3),
        user in proptest::sample::select(OTHERS.to_vec()),
    ) {
        let role = tenant_role(json!(labels), json!(annotations));
        let claims = labels.get("app.kubernetes.io/managed-by") == Some(&"rbac-rules")
            || labels.contains_key("rbacrules.io/rule")
            || labels.contains_key("rbacrules.io/trigger")
            || annotations.contains_key("rbacrules.io/rule")
            || annotations.contains_key("rbacrules.io/trigger");
        let admitted = tenant_write("CREATE", user, &role, &Value::Null).is_ok();
        proptest::prop_assert_eq!(admitted, !claims, "{} {}", user, role);
    }
}

// ---------------------------------------------------------------------
// Delegation at admission (deploy/tenant-admission.yaml): the author of a
// NamespacedRbacRule must hold every permission its static rules grant
// and `bind` on every role it binds by name. The interpreter has no
// `authorizer`: each authorization chain is replaced by the answer of a
// table of what the author holds (RBAC matching with `*`), computed from
// the checks the policy's own variables list. The real authorizer is
// proven on a real API server by tests/e2e_tenant.rs.
// ---------------------------------------------------------------------

/// Authorization checks the policy may make: one validation each.
const TENANT_CHECKS: usize = 20;

fn tenant_policy() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/tenant-admission.yaml"
    ))
    .expect("deploy/tenant-admission.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    let policy = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .expect("a ValidatingAdmissionPolicy")
        .clone();
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .expect("its binding");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    policy
}

fn tenant_env() -> Arc<Env> {
    let mut env = Env::stdlib();
    env.add_extension(cel::extensions::strings)
        .expect("strings extension");
    Arc::new(env)
}

/// The authorization chain of validation `i`, exactly as every one of them
/// is written (tests assert the policy holds it verbatim).
fn authz_chain(i: usize) -> String {
    format!(
        "authorizer.group(variables.checks[{i}][0])\n  .resource(variables.checks[{i}][1]).subresource(variables.checks[{i}][2])\n  .namespace(variables.ns).name(variables.checks[{i}][3])\n  .check(variables.checks[{i}][4]).allowed()"
    )
}

/// What an author holds in the rule's namespace: (groups, resources,
/// verbs, resourceNames) with RBAC's `*`; a subresource is `res/sub`.
type Held = Vec<(
    Vec<&'static str>,
    Vec<&'static str>,
    Vec<&'static str>,
    Vec<&'static str>,
)>;

/// Whether `held` allows one check [group, resource, subresource, name,
/// verb], as the RBAC authorizer decides.
fn allows(held: &Held, c: &[String]) -> bool {
    let resource = if c[2].is_empty() {
        c[1].clone()
    } else {
        format!("{}/{}", c[1], c[2])
    };
    held.iter().any(|(groups, resources, verbs, names)| {
        let has = |l: &[&str], v: &str| l.iter().any(|x| *x == "*" || *x == v);
        has(groups, &c[0])
            && (resources.contains(&"*") || resources.iter().any(|r| *r == resource))
            && has(verbs, &c[4])
            && (names.is_empty() || (!c[3].is_empty() && names.iter().any(|n| *n == c[3])))
    })
}

/// The tenant policy's verdict on `op` of `rule` (a NamespacedRbacRule) by
/// an author holding `held`: the messages of the failed validations.
fn tenant_admit(op: &str, rule: &Value, held: &Held) -> Result<(), Vec<String>> {
    let p = tenant_policy();
    let env = tenant_env();
    let base: Vec<(&str, Cel)> = vec![
        (
            "request",
            cel::to_value(json!({"operation": op, "userInfo": {"username": "alice"},
                "resource": {"group": "rbacrules.io", "version": "v1alpha1",
                             "resource": "namespacedrbacrules"}}))
            .expect("request"),
        ),
        ("object", cel::to_value(rule).expect("object")),
    ];
    let run = |expr: &str, variables: &std::collections::HashMap<String, Cel>| -> Option<Cel> {
        let program = env
            .compile(expr)
            .unwrap_or_else(|e| panic!("{expr}: {e:?}"));
        let mut ctx = Context::with_env(env.clone());
        for (name, value) in &base {
            ctx.add_variable_from_value(*name, value.clone());
        }
        ctx.add_variable_from_value("variables", variables.clone());
        program.execute(&ctx).ok()
    };
    let mut variables = std::collections::HashMap::new();
    for v in p["spec"]["variables"].as_array().expect("variables") {
        let name = v["name"].as_str().expect("name");
        if let Some(value) = run(v["expression"].as_str().expect("expression"), &variables) {
            variables.insert(name.to_string(), value);
        }
    }
    // The checks, as the policy lists them, answered from `held`.
    let checks: Vec<Vec<String>> = variables
        .get("checks")
        .map(|c| {
            let Cel::List(rows) = c else {
                panic!("checks is not a list: {c:?}")
            };
            rows.iter()
                .map(|row| match row {
                    Cel::List(cells) => cells
                        .iter()
                        .map(|cell| match cell {
                            Cel::String(s) => s.to_string(),
                            other => panic!("a check's cell is not a string: {other:?}"),
                        })
                        .collect(),
                    other => panic!("a check is not a list: {other:?}"),
                })
                .collect()
        })
        .unwrap_or_default();
    let answers: Vec<bool> = checks
        .iter()
        .map(|c| c.len() == 5 && allows(held, c))
        .collect();
    let mut failed = Vec::new();
    for (i, v) in p["spec"]["validations"]
        .as_array()
        .expect("validations")
        .iter()
        .enumerate()
    {
        let mut expr = v["expression"].as_str().expect("expression").to_string();
        let index = i.checked_sub(4);
        if let Some(k) = index {
            let chain = authz_chain(k);
            assert!(
                expr.contains(&chain),
                "validation {i} is not check {k}: {expr}"
            );
            let answer = answers.get(k).copied().unwrap_or(false);
            expr = expr.replace(&chain, if answer { "true" } else { "false" });
        }
        if run(&expr, &variables).and_then(|v| match v {
            Cel::Bool(b) => Some(b),
            _ => None,
        }) != Some(true)
        {
            let message = match v["messageExpression"].as_str() {
                Some(m) => match run(m, &variables) {
                    Some(Cel::String(s)) => s.to_string(),
                    other => panic!("messageExpression of validation {i} gave {other:?}"),
                },
                None => v["message"].as_str().unwrap_or_default().to_string(),
            };
            failed.push(message);
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed)
    }
}

fn tenant_rule(outputs: Value) -> Value {
    json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "NamespacedRbacRule",
        "metadata": {"name": "on-call", "namespace": "team-a"},
        "spec": {"outputs": outputs}})
}

/// The namespace `admin` ClusterRole's rules that matter here (a subset of
/// the real one, which tests/e2e_tenant.rs uses).
fn admin() -> Held {
    vec![
        (
            vec![""],
            vec![
                "pods",
                "pods/exec",
                "pods/log",
                "services",
                "configmaps",
                "secrets",
                "serviceaccounts",
            ],
            vec![
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
            vec![],
        ),
        (
            vec!["apps"],
            vec!["deployments", "statefulsets"],
            vec![
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
            vec![],
        ),
        (
            vec!["rbac.authorization.k8s.io"],
            vec!["roles", "rolebindings"],
            vec![
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
            vec![],
        ),
        // What the shipped rbac-rules:tenant-admin adds.
        (
            vec!["rbac.authorization.k8s.io"],
            vec!["clusterroles"],
            vec!["bind"],
            vec!["view", "edit"],
        ),
    ]
}

/// `edit` without secrets: a weaker author.
fn weaker() -> Held {
    vec![(
        vec![""],
        vec!["pods", "pods/exec", "configmaps"],
        vec!["get", "list", "watch", "create"],
        vec![],
    )]
}

fn on_call_outputs() -> Value {
    json!([
        {"kind": "Role", "name": "incident-exec",
         "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]},
                   {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]},
        // The engine writes the Role as tenant:<rule>:<name>, and a binding
        // of it names it so.
        {"kind": "RoleBinding", "name": "incident-exec",
         "roleRef": {"kind": "Role", "name": "tenant:on-call:incident-exec"},
         "subjects": [{"kind": "Group", "name": "{{trigger.spec.onCall}}"}]}
    ])
}

#[test]
fn every_tenant_expression_compiles_and_each_check_is_a_validation_of_its_own() {
    let p = tenant_policy();
    let env = tenant_env();
    for list in ["variables", "validations"] {
        for v in p["spec"][list].as_array().expect("list") {
            for key in ["expression", "messageExpression"] {
                if let Some(e) = v[key].as_str() {
                    env.compile(e).unwrap_or_else(|err| panic!("{e}: {err:?}"));
                }
            }
        }
    }
    let validations = p["spec"]["validations"].as_array().expect("validations");
    assert_eq!(validations.len(), 4 + TENANT_CHECKS);
    for (k, v) in validations[4..].iter().enumerate() {
        // One authorization check per expression: the API server prices
        // one at 350000 of an expression's 1000000.
        let e = v["expression"].as_str().expect("expression");
        assert_eq!(
            e,
            format!("size(variables.checks) <= {k} || {}", authz_chain(k))
        );
        assert_eq!(e.matches("authorizer").count(), 1);
    }
    // And the count the cap refuses above is the number of validations.
    assert_eq!(
        validations[3]["expression"],
        format!("size(variables.checks) <= {TENANT_CHECKS}")
    );
    assert_eq!(
        p["spec"]["matchConstraints"]["resourceRules"][0]["resources"],
        json!(["namespacedrbacrules"])
    );
    assert_eq!(
        p["spec"]["matchConstraints"]["resourceRules"][0]["operations"],
        json!(["CREATE", "UPDATE"])
    );
}

#[test]
fn an_author_may_grant_what_they_hold() {
    tenant_admit("CREATE", &tenant_rule(on_call_outputs()), &admin()).expect("admin holds it");
    tenant_admit("UPDATE", &tenant_rule(on_call_outputs()), &weaker())
        .expect("exec and get pods are held by the weaker author too");
    // Binding `view` and `edit`: the shipped grant of bind on them.
    let ci = json!([{"kind": "RoleBinding", "name": "ci-edit",
        "roleRef": {"kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "ci"}]}]);
    tenant_admit("CREATE", &tenant_rule(ci), &admin()).expect("bind on edit");
    // Entries with a template anywhere, forEach items and templated roleRefs
    // are the ceiling's: nothing to check here (as `render --as`).
    let templated = json!([{"kind": "Role", "name": "{{trigger.metadata.name}}",
        "rules": [{"apiGroups": ["{{trigger.spec.group}}"], "resources": ["{{trigger.spec.kind}}"],
                   "verbs": ["get"]},
                  {"forEach": "trigger.spec.extra", "item": {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}}]},
        {"kind": "RoleBinding", "name": "x", "roleRef": {"kind": "ClusterRole", "name": "{{trigger.spec.role}}"},
         "subjects": []},
        {"kind": "RoleBinding", "name": "y", "roleRef": {"kind": "{{trigger.spec.kind}}", "name": "cluster-admin"},
         "subjects": []},
        {"kind": "Role", "name": "z",
         "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                    "resourceNames": ["{{trigger.metadata.name}}"]}]}]);
    tenant_admit("CREATE", &tenant_rule(templated), &weaker()).expect("nothing literal");
}

#[test]
fn an_author_may_not_grant_what_they_lack_and_the_message_names_it() {
    let secrets = json!([{"kind": "Role", "name": "read-secrets",
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                  {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]}]);
    tenant_admit("CREATE", &tenant_rule(secrets.clone()), &admin()).expect("admin reads secrets");
    refused(
        tenant_admit("CREATE", &tenant_rule(secrets.clone()), &weaker()),
        "you lack get on secrets in namespace team-a",
    );
    // A later edit by a weaker user: the same check.
    refused(
        tenant_admit("UPDATE", &tenant_rule(secrets), &weaker()),
        "you lack get on secrets",
    );
    let escalate = json!([{"kind": "Role", "name": "esc",
        "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]}]}]);
    refused(
        tenant_admit("CREATE", &tenant_rule(escalate), &admin()),
        "you lack escalate on roles.rbac.authorization.k8s.io in namespace team-a",
    );
    // `*` is checked as written: admin lists its verbs.
    let star = json!([{"kind": "Role", "name": "all-pods",
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}]}]);
    refused(
        tenant_admit("CREATE", &tenant_rule(star), &admin()),
        "you lack * on pods",
    );
    let exec = json!([{"kind": "Role", "name": "exec",
        "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}]}]);
    refused(
        tenant_admit(
            "CREATE",
            &tenant_rule(exec),
            &vec![(vec![""], vec!["pods"], vec!["create"], vec![])],
        ),
        "you lack create on pods/exec",
    );
    let cluster_admin = json!([{"kind": "RoleBinding", "name": "root",
        "roleRef": {"kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "User", "name": "mallory"}]}]);
    refused(
        tenant_admit("CREATE", &tenant_rule(cluster_admin), &admin()),
        "you lack bind on clusterroles.rbac.authorization.k8s.io cluster-admin in namespace team-a",
    );
    // A Role of someone else's (not emitted by this rule) needs bind.
    let foreign_role = json!([{"kind": "RoleBinding", "name": "b",
        "roleRef": {"kind": "Role", "name": "deployer"}, "subjects": []}]);
    refused(
        tenant_admit("CREATE", &tenant_rule(foreign_role), &admin()),
        "you lack bind on roles.rbac.authorization.k8s.io deployer",
    );
    // Its own Role, but with a templated rule: its permissions were not
    // all checked, so binding it needs bind too.
    let own_templated = json!([
        {"kind": "Role", "name": "mine",
         "rules": [{"apiGroups": [""], "resources": ["{{trigger.spec.r}}"], "verbs": ["get"]}]},
        {"kind": "RoleBinding", "name": "mine", "roleRef": {"kind": "Role", "name": "tenant:on-call:mine"}, "subjects": []}]);
    refused(
        tenant_admit("CREATE", &tenant_rule(own_templated), &admin()),
        "you lack bind on roles.rbac.authorization.k8s.io tenant:on-call:mine",
    );
    // The unprefixed name is another Role of the namespace, not the rule's.
    refused(
        tenant_admit(
            "CREATE",
            &tenant_rule(json!([
            {"kind": "Role", "name": "mine",
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
            {"kind": "RoleBinding", "name": "mine", "roleRef": {"kind": "Role", "name": "mine"}, "subjects": []}])),
            &admin(),
        ),
        "you lack bind on roles.rbac.authorization.k8s.io mine",
    );
}

#[test]
fn outputs_other_than_roles_and_bindings_or_in_other_namespaces_are_refused() {
    for (outputs, needle) in [
        (
            json!([{"kind": "ClusterRole", "name": "x", "rules": []}]),
            "only Roles and RoleBindings",
        ),
        (
            json!([{"kind": "ClusterRoleBinding", "name": "x",
            "roleRef": {"kind": "ClusterRole", "name": "view"}, "subjects": []}]),
            "only Roles and RoleBindings",
        ),
        (
            json!([{"kind": "Role", "name": "x", "namespace": "team-b", "rules": []}]),
            "stays in its namespace: omit outputs[].namespace or set it to team-a",
        ),
        (
            json!([{"kind": "RoleBinding", "name": "x", "namespace": "{{trigger.metadata.namespace}}",
            "roleRef": {"kind": "ClusterRole", "name": "view"}, "subjects": []}]),
            "stays in its namespace",
        ),
    ] {
        refused(
            tenant_admit("CREATE", &tenant_rule(outputs), &admin()),
            needle,
        );
    }
    let own = json!([{"kind": "Role", "name": "x", "namespace": "team-a", "rules": []}]);
    tenant_admit("CREATE", &tenant_rule(own), &admin()).expect("its own namespace, written out");
}

#[test]
fn separators_in_values_and_too_many_checks_are_refused() {
    let sneaky = json!([{"kind": "Role", "name": "x",
        "rules": [{"apiGroups": [""], "resources": ["pods|exec"], "verbs": ["get"]}]}]);
    refused(
        tenant_admit("CREATE", &tenant_rule(sneaky), &admin()),
        "may not contain '|' or ';'",
    );
    // Realistic sizes fit (18 checks); 2 x 6 + 3 x 3 = 21 is one too many.
    let verbs = json!(["get", "list", "watch", "create", "update", "patch"]);
    let fits = json!([{"kind": "Role", "name": "deployer",
        "rules": [{"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"], "verbs": verbs},
                  {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "update", "patch"]}]}]);
    tenant_admit("CREATE", &tenant_rule(fits), &admin()).expect("18 checks");
    let big = json!([{"kind": "Role", "name": "deployer",
        "rules": [{"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"], "verbs": verbs},
                  {"apiGroups": [""], "resources": ["configmaps", "services", "secrets"], "verbs": ["get", "list", "watch"]}]}]);
    refused(
        tenant_admit("CREATE", &tenant_rule(big), &admin()),
        "at most 20 permission checks at admission",
    );
}
