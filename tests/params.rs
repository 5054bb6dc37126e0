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

// Settings are data: one param per flag or per variable, the value whole.

/// A rule with two params without a format, each copied into an
/// annotation: what a value sets shows there.
const TWO: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: two}
spec:
  params:
  - {name: first, default: one}
  - {name: second, default: two}
  outputs:
  - kind: ClusterRole
    name: settings
    annotations:
      example.org/first: "{{params.first}}"
      example.org/second: "{{params.second}}"
    rules: []
"#;

/// `render` of [`TWO`] with `args` and the environment `env` (and no
/// inherited RBAC_RULES_PARAM* variable): status, stdout, stderr.
fn render_two(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let rule = dir.path().join("two.yaml");
    std::fs::write(&rule, TWO).expect("write rule");
    let objects = dir.path().join("objects.yaml");
    std::fs::write(&objects, "").expect("write objects");
    let mut cmd = support::cli::rbac_rules();
    cmd.args(["render", "-o", "json", "--rules"])
        .arg(&rule)
        .arg("--objects")
        .arg(&objects)
        .args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("RBAC_RULES_PARAM") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("run rbac-rules");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The annotations `first` and `second` of the rendered role.
fn settings(stdout: &str) -> (String, String) {
    let list: serde_json::Value = serde_json::from_str(stdout).expect("json");
    let role = list["items"]
        .as_array()
        .and_then(|i| i.iter().find(|o| o["metadata"]["name"] == "settings"))
        .expect("the role")
        .clone();
    let a = &role["metadata"]["annotations"];
    let text = |k: &str| a[k].as_str().unwrap_or_default().to_string();
    (text("example.org/first"), text("example.org/second"))
}

#[test]
fn a_flag_value_with_a_comma_and_an_equals_sign_is_one_value() {
    let (code, out, err) = render_two(&["--param", "first=a,second=evil"], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        settings(&out),
        ("a,second=evil".to_string(), "two".to_string())
    );
}

#[test]
fn a_variable_value_with_a_comma_and_an_equals_sign_is_one_value() {
    let hostile = "a,second=evil\nsecond=worse";
    let (code, out, err) = render_two(&[], &[("RBAC_RULES_PARAM_first", hostile)]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(settings(&out), (hostile.to_string(), "two".to_string()));
}

#[test]
fn each_param_has_its_own_variable_in_the_rules_spelling() {
    let (code, out, err) = render_two(
        &[],
        &[
            ("RBAC_RULES_PARAM_first", "1"),
            ("RBAC_RULES_PARAM_second", "2"),
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(settings(&out), ("1".to_string(), "2".to_string()));
    // The same as the flags.
    let (_, flags, _) = render_two(&["--param", "first=1", "--param", "second=2"], &[]);
    assert_eq!(out, flags);
}

#[test]
fn a_flag_wins_over_the_variable_of_the_same_param() {
    let (code, out, err) = render_two(
        &["--param", "first=flag"],
        &[("RBAC_RULES_PARAM_first", "env")],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(settings(&out).0, "flag");
}

#[test]
fn the_old_comma_separated_variable_is_refused_naming_its_replacement() {
    let (code, out, err) = render_two(&[], &[("RBAC_RULES_PARAMS", "first=a,second=b")]);
    assert_eq!(code, Some(1));
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("RBAC_RULES_PARAMS is no longer read"), "{err}");
    assert!(err.contains("RBAC_RULES_PARAM_first=a"), "{err}");
    assert!(err.contains("--param NAME=VALUE"), "{err}");
}

#[test]
fn a_param_given_twice_or_misnamed_is_refused() {
    let (code, out, err) = render_two(&["--param", "first=a", "--param", "first=b"], &[]);
    assert_eq!(code, Some(1));
    assert!(out.is_empty());
    assert!(err.contains("--param first: given twice"), "{err}");
    let (code, _, err) = render_two(&["--param", "first.x=a"], &[]);
    assert_eq!(code, Some(2), "a usage error");
    assert!(err.contains("\"first.x=a\""), "{err}");
    let (code, _, err) = render_two(&[], &[("RBAC_RULES_PARAM_first-x", "a")]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("environment variable RBAC_RULES_PARAM_first-x"),
        "{err}"
    );
    let (code, _, err) = render_two(&[], &[("RBAC_RULES_PARAM_thrid", "a")]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("environment variable RBAC_RULES_PARAM_thrid: no rule declares"),
        "{err}"
    );
}

/// The issue's value: in one variable split at `,` it set a second param
/// and bound Crossplane's own role in team-a. Now it is one value, refused
/// by the param's format, with an error naming the param, the value, the
/// format and where it was given; nothing is printed.
#[test]
fn a_hostile_value_is_refused_by_the_format_naming_it_and_its_origin() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let hostile = "devs,crossplaneNamespace=team-a";
    for (flag, env, origin) in [
        (
            Some(format!("crossplaneNamespace={hostile}")),
            None,
            "--param crossplaneNamespace",
        ),
        (
            None,
            Some(("RBAC_RULES_PARAM_crossplaneNamespace", hostile)),
            "environment variable RBAC_RULES_PARAM_crossplaneNamespace",
        ),
    ] {
        let mut cmd = support::cli::rbac_rules();
        cmd.args(["render", "--objects"])
            .arg(root.join("examples/crossplane-cluster.yaml"))
            .env_remove("RBAC_RULES_PARAMS")
            .env_remove("RBAC_RULES_PARAM_crossplaneNamespace");
        if let Some(f) = &flag {
            cmd.args(["--param", f]);
        }
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run rbac-rules");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(out.stdout.is_empty(), "nothing rendered");
        let expected = format!(
            "param crossplaneNamespace: \"devs,crossplaneNamespace=team-a\" (from {origin}) is not a valid dnsLabel"
        );
        assert!(stderr.contains(&expected), "{stderr}");
        assert!(!stderr.contains("team-a\" is"), "{stderr}");
    }
}

#[test]
fn the_engine_names_where_a_refused_value_came_from() {
    let mut opts = options(&[("ns", "devs,ns=team-a")]);
    opts.param_origins
        .insert("ns".into(), rbac_rules::params::Origin::Env);
    let eval = Engine::new(&rules(RULE), opts.clone()).evaluate(&store(&[deployment("team-a")]));
    let e = eval.errors().next().expect("an error");
    assert_eq!(e.kind, ErrorKind::InvalidRule);
    assert_eq!(
        e.message,
        "param ns: \"devs,ns=team-a\" (from environment variable RBAC_RULES_PARAM_ns) is not a valid dnsLabel"
    );
    // No output of the rule: nothing reads team-a's Deployment.
    assert!(eval.desired.iter().all(|d| d.name != "reader"));
    // The reference agrees.
    let reference =
        rbac_rules::reference::evaluate(&rules(RULE), &opts, &store(&[deployment("team-a")]));
    assert_eq!(
        reference.errors().next().map(|e| e.message.clone()),
        Some(e.message.clone())
    );
}

/// `run` and `diff` read their params before anything starts: the old
/// variable stops them at once, naming its replacement (no cluster is
/// contacted: the kubeconfig points nowhere).
#[test]
fn run_and_diff_refuse_the_old_variable_before_starting() {
    for (command, code) in [("run", 1), ("diff", 2)] {
        let out = support::cli::rbac_rules()
            .arg(command)
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env(
                "RBAC_RULES_PARAMS",
                "crossplaneNamespace=devs,crossplaneNamespace=team-a",
            )
            .output()
            .expect("run rbac-rules");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{command}: {stderr}");
        assert!(
            stderr.contains("RBAC_RULES_PARAMS is no longer read"),
            "{command}: {stderr}"
        );
        assert!(
            stderr.contains("RBAC_RULES_PARAM_crossplaneNamespace=devs"),
            "{command}: {stderr}"
        );
    }
}
