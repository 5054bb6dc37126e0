//! Rule parameters: settings of an installation (`--param NAME=VALUE`) that
//! rules declare with a default and read as `params.<name>` — data, never
//! grammar.

use std::collections::BTreeMap;

use rbac_rules::engine::{Engine, ErrorKind, Options};
use serde_json::json;

mod support;
use support::engine::{rules, store};

const RULE: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: p}
spec:
  params:
  - {name: ns, default: tools, format: dnsLabel}
  - {name: group, default: example.org}
  related:
  - name: apps
    objects: {apiGroup: apps, kind: Deployment, namespace: "{{params.ns}}"}
  outputs:
  - kind: ClusterRole
    name: "reader"
    labels: {example.org/ns: "{{params.ns}}"}
    rules:
    - apiGroups: ["{{params.group}}"]
      resources: [things]
      verbs: [get]
  - kind: ClusterRoleBinding
    name: "reader"
    roleRef: {kind: ClusterRole, name: reader}
    subjects:
    - forEach: related.apps
      as: d
      item: {kind: ServiceAccount, name: "{{d.metadata.name}}", namespace: "{{d.metadata.namespace}}"}
"#;

fn options(params: &[(&str, &str)]) -> Options {
    Options {
        params: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        ..Options::default()
    }
}

fn deployment(ns: &str) -> serde_json::Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": format!("app-{ns}"), "namespace": ns, "uid": ns}})
}

fn subjects(params: &[(&str, &str)]) -> serde_json::Value {
    let eval = Engine::new(&rules(RULE), options(params))
        .evaluate(&store(&[deployment("tools"), deployment("xp")]));
    assert_eq!(
        eval.errors().count(),
        0,
        "{:?}",
        eval.errors().collect::<Vec<_>>()
    );
    eval.desired
        .iter()
        .find(|d| d.name == "reader" && !d.kind.is_role())
        .map(|d| d.object.to_value()["subjects"].clone())
        .unwrap_or_default()
}

#[test]
fn a_param_has_its_default_and_the_installation_overrides_it() {
    assert_eq!(subjects(&[])[0]["namespace"], "tools");
    assert_eq!(subjects(&[("ns", "xp")])[0]["namespace"], "xp");
    assert_eq!(subjects(&[("ns", "xp")]).as_array().map(Vec::len), Some(1));
}

#[test]
fn a_value_without_the_declared_format_fails_the_rule() {
    let eval = Engine::new(&rules(RULE), options(&[("ns", "Not_A_Label")])).evaluate(&store(&[]));
    let e = eval.errors().next().expect("an error");
    assert_eq!(e.kind, ErrorKind::InvalidRule);
    assert_eq!(e.field, "spec.params[0]");
    assert!(e.message.contains("Not_A_Label"), "{e}");
}

#[test]
fn a_param_value_is_data_never_grammar() {
    // A template in a value is text, and a wildcard from a value is refused.
    let eval = Engine::new(&rules(RULE), options(&[("group", "*")])).evaluate(&store(&[]));
    assert!(
        eval.errors().any(|e| e.kind == ErrorKind::EscalationDenied),
        "{:?}",
        eval.errors().collect::<Vec<_>>()
    );
    assert!(
        eval.desired
            .iter()
            .all(|d| d.name != "reader" || !d.kind.is_role())
    );
    let eval = Engine::new(
        &rules(RULE),
        options(&[("group", "{{rule.name}}.example.org")]),
    )
    .evaluate(&store(&[]));
    assert!(
        eval.errors().count() > 0,
        "a template in a value is not rendered"
    );
    assert!(
        eval.desired
            .iter()
            .all(|d| !d.object.to_value().to_string().contains("p.example.org"))
    );
}

#[test]
fn params_is_a_reserved_loop_variable() {
    let yaml = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: r}
spec:
  outputs:
  - {kind: ClusterRole, forEach: "list 1", as: params, name: x, rules: []}
"#;
    let eval = Engine::new(&rules(yaml), Options::default()).evaluate(&store(&[]));
    assert!(
        eval.errors().any(|e| e.field == "spec.outputs[0].as"),
        "{:?}",
        eval.errors().collect::<Vec<_>>()
    );
}

#[test]
fn render_refuses_a_param_no_rule_declares() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = support::cli::rbac_rules()
        .args(["render", "--objects"])
        .arg(root.join("examples/crossplane-cluster.yaml"))
        .args(["--param", "crossplaneNamespce=xp-system"])
        .output()
        .expect("run rbac-rules");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--param crossplaneNamespce: no rule declares"),
        "{stderr}"
    );
}
