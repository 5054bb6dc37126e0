//! `explain` on a dump reads the installed controller's settings from its
//! Deployment in the dump: a provider's ServiceAccount, bound by the
//! controller running with `crossplaneNamespace=xp-system`, was told "it
//! can do nothing" by an explain that rendered with the default namespace
//! (the rendered binding, with no subjects, replaced the live one).

mod support;

use support::cli::{command, output};

const CLUSTER: &str = "tests/golden/crossplane-in-another-namespace/objects.yaml";

/// The controller's Deployment, with its param as the chart sets it.
fn controller(param: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: rbac-rules, namespace: rbac-rules-system, labels: {{app.kubernetes.io/name: rbac-rules}}}}
spec:
  template:
    spec:
      containers:
      - name: controller
        image: ghcr.io/example/rbac-rules:0.1.0
        args: [run, --metrics-address=0.0.0.0:8080]
        env:
        - {{name: RBAC_RULES_PARAM_crossplaneNamespace, value: {param}}}
"
    )
}

/// The live binding the controller made (in the dump, as `kubectl get -o
/// yaml` shows it).
const LIVE_BINDING: &str = "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: crossplane:provider:provider-nop-1a2b3c:system
  labels: {app.kubernetes.io/managed-by: rbac-rules}
  annotations: {rbacrules.io/rule: crossplane-provider-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: crossplane:provider:provider-nop-1a2b3c:system}
subjects:
- {kind: ServiceAccount, name: provider-nop, namespace: xp-system}
";

fn dump(dir: &std::path::Path, deployment: Option<&str>) -> std::path::PathBuf {
    let mut text = std::fs::read_to_string(support::cli::root().join(CLUSTER)).expect("cluster");
    text.push_str("\n---\n");
    text.push_str(LIVE_BINDING);
    if let Some(d) = deployment {
        text.push_str("---\n");
        text.push_str(d);
    }
    let path = dir.join("dump.yaml");
    std::fs::write(&path, text).expect("write dump");
    path
}

fn explain(objects: &std::path::Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let mut args = vec![
        "explain".to_string(),
        "--objects".into(),
        objects.display().to_string(),
        "--manage".into(),
        "serviceaccounts".into(),
        "--as".into(),
        "system:serviceaccount:xp-system:provider-nop".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    output(&mut command(args)).parts()
}

#[test]
fn explain_uses_the_installed_controllers_params_from_the_dump() {
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = dump(dir.path(), Some(&controller("xp-system")));
    let (code, out, err) = explain(&objects, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(
            "cluster-wide: ClusterRoleBinding crossplane:provider:provider-nop-1a2b3c:system"
        ),
        "{out}\n{err}"
    );
    assert!(!out.contains("it can do nothing"), "{out}");
    assert!(!err.contains("could not be found"), "{err}");
}

#[test]
fn a_param_given_that_differs_is_used_with_a_warning_naming_both() {
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = dump(dir.path(), Some(&controller("xp-system")));
    let (code, out, err) = explain(
        &objects,
        &["--param", "crossplaneNamespace=crossplane-system"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("warning: --param crossplaneNamespace=\"crossplane-system\" differs from the installed controller's crossplaneNamespace=\"xp-system\" (Deployment rbac-rules-system/rbac-rules)"),
        "{err}"
    );
    // With the wrong namespace the binding is rendered with no subjects.
    assert!(out.contains("it can do nothing"), "{out}");
}

#[test]
fn without_the_deployment_it_says_the_settings_were_not_found() {
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = dump(dir.path(), None);
    let (code, out, err) = explain(&objects, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("note: the installed controller's settings could not be found in the objects (no Deployment running `rbac-rules run` found)"),
        "{err}"
    );
    assert!(out.contains("it can do nothing"), "{out}");
    // The param on the command line does what the Deployment would.
    let (_, out, _) = explain(&objects, &["--param", "crossplaneNamespace=xp-system"]);
    assert!(
        out.contains("ClusterRoleBinding crossplane:provider:provider-nop-1a2b3c:system"),
        "{out}"
    );
}

#[test]
fn as_group_adds_a_group_to_the_subject() {
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = dir.path().join("o.yaml");
    std::fs::write(
        &objects,
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ops}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects:
- {kind: Group, name: ops, apiGroup: rbac.authorization.k8s.io}
",
    )
    .expect("write");
    let (_, out, _) = explain(&objects, &[]);
    assert!(out.contains("it can do nothing"), "{out}");
    let (code, out, err) = explain(&objects, &["--as-group", "ops"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("ClusterRoleBinding ops → ClusterRole view"),
        "{out}"
    );
}

/// `rbac-rules test`: `--param` for every test, and the installed
/// controller's params when its Deployment is among a test's objects.
#[test]
fn test_takes_params_and_the_deployment_among_its_objects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = support::cli::root().join(CLUSTER);
    let write = |name: &str, extra_objects: &str| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!(
                "apiVersion: rbacrules.io/v1alpha1
kind: RbacRuleTest
metadata: {{name: provider-bound-in-xp-system}}
spec:
  manage: serviceaccounts
  objects:
  - {cluster}
{extra_objects}  expect:
    access:
    - {{serviceAccount: \"xp-system:provider-nop\", can: get, resource: secrets, namespace: team-a}}
",
                cluster = cluster.display()
            ),
        )
        .expect("write test");
        path
    };
    let plain = write("plain.yaml", "");
    let deployment = dir.path().join("controller.yaml");
    std::fs::write(&deployment, controller("xp-system")).expect("write deployment");
    let with_deployment = write(
        "with-deployment.yaml",
        &format!("  - {}\n", deployment.display()),
    );

    let run = |args: &[&std::path::Path], extra: &[&str]| {
        let mut a: Vec<String> = vec!["test".into()];
        a.extend(args.iter().map(|p| p.display().to_string()));
        a.extend(extra.iter().map(|s| s.to_string()));
        output(&mut command(a)).parts()
    };
    let (code, out, _) = run(&[&plain], &[]);
    assert_eq!(code, Some(1), "the default namespace binds no one: {out}");
    let (code, out, err) = run(&[&plain], &["--param", "crossplaneNamespace=xp-system"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let (code, out, err) = run(&[&with_deployment], &[]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let (_, _, err) = run(
        &[&with_deployment],
        &["--param", "crossplaneNamespace=crossplane-system"],
    );
    assert!(
        err.contains("differs from the installed controller's crossplaneNamespace=\"xp-system\""),
        "{err}"
    );
}
