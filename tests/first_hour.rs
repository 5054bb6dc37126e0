//! The first hour of a platform team, as docs/tutorial.md walks it: roles
//! for its own CRDs (databases.data.acme.io, caches.data.acme.io), owners
//! from a namespace annotation, an operator ServiceAccount bound to status
//! updates; then validate, render, test, explain and controller-role, each
//! command exactly as the tutorial gives it.

mod support;
use support::cli::run;

const DIR: &str = "docs/tutorial/first-hour";

fn path(file: &str) -> String {
    format!("{DIR}/{file}")
}

#[test]
fn validate_is_clean() {
    let (code, out, err) = run(&[
        "validate",
        "--rules",
        &path("rules.yaml"),
        "--objects",
        &path("crds.yaml"),
        "--strict",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("0 error(s), 0 warning(s)"), "{err}");
}

#[test]
fn render_grants_owners_and_the_operator() {
    let (code, out, err) = run(&[
        "render",
        "--rules",
        &path("rules.yaml"),
        "--objects",
        &path("cluster.yaml"),
        &path("crds.yaml"),
        "--allow",
        "deploy/controller/allow-list.yaml",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&out).expect("YAML");
    let names: Vec<String> = docs
        .iter()
        .map(|d| {
            format!(
                "{} {}/{}",
                d["kind"].as_str().unwrap_or_default(),
                d["metadata"]["namespace"].as_str().unwrap_or_default(),
                d["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            "ClusterRole /acme-data:operator",
            "ClusterRoleBinding /acme-data:operator",
            "Role team-a/acme-data-owner",
            "RoleBinding team-a/acme-data-owners",
        ],
        "team-b has no owners annotation: nothing there"
    );
    let binding = &docs[3];
    assert_eq!(binding["subjects"][0]["name"], "team-a-admins");
    assert_eq!(binding["subjects"][1]["name"], "dba");
}

#[test]
fn the_tests_pass() {
    let (code, out, err) = run(&["test", &path("tests")]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("2 passed, 0 failed, 2 total"), "{out}");
}

#[test]
fn explain_the_operator_and_an_owner_binding() {
    let objects = [path("cluster.yaml"), path("crds.yaml")];
    let rules = path("rules.yaml");
    let (code, out, err) = run(&[
        "explain",
        "--as",
        "system:serviceaccount:acme-system:db-operator",
        "--objects",
        &objects[0],
        &objects[1],
        "--rules",
        &rules,
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("ServiceAccount acme-system/db-operator\n"),
        "{out}"
    );
    assert!(
        out.contains("get,update,patch databases/status,caches/status (group \"data.acme.io\")"),
        "{out}"
    );
    let (code, out, err) = run(&[
        "explain",
        "rolebinding/acme-data-owners",
        "-n",
        "team-a",
        "--objects",
        &objects[0],
        "--rules",
        &rules,
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("rule:     acme-data-owners (docs/tutorial/first-hour/rules.yaml#1)"),
        "{out}"
    );
    assert!(out.contains("trigger:  Namespace/team-a"), "{out}");
}

#[test]
fn the_controller_role_for_the_rules() {
    let (code, out, err) = run(&[
        "controller-role",
        "--rules",
        &path("rules.yaml"),
        "--name",
        "rbac-rules:acme-data",
    ]);
    assert_eq!(code, Some(0), "{err}");
    // The owners rule reads namespaces; the static rule reads nothing.
    assert!(
        out.contains("  - namespaces\n") && out.contains("  - namespaces/finalizers\n"),
        "{out}"
    );
    assert!(!out.contains("data.acme.io"), "{out}");
}

/// The mistakes of a first hour are caught, each with the fix.
#[test]
fn first_hour_mistakes_are_caught() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules = std::fs::read_to_string(root.join(DIR).join("rules.yaml")).expect("rules");
    let typo = dir.path().join("rules.yaml");
    std::fs::write(
        &typo,
        rules
            .replace("metadata.annotations[\"data.acme.io/owners\"]", "metadata.anotations[\"data.acme.io/owners\"]")
            .replace("kind: ClusterRoleBinding\n    name: acme-data:operator\n    roleRef:\n      kind: ClusterRole", "kind: ClusterRoleBinding\n    name: acme-data:operator\n    roleRef:\n      kind: Clusterrole"),
    )
    .expect("write");
    let (code, _, err) = run(&["validate", "--rules", typo.to_str().expect("utf-8")]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("path metadata.anotations[\"data.acme.io/owners\"]: Namespace has no field metadata.anotations (did you mean metadata.annotations?)"), "{err}");
    assert!(
        err.contains("unknown roleRef kind \"Clusterrole\" (did you mean \"ClusterRole\"?)"),
        "{err}"
    );
}
