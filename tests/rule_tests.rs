//! `rbac-rules test`: the shipped rule tests (rules/tests and every
//! rules/examples/<set>/tests) pass, and the runner reports failures.

use std::path::{Path, PathBuf};

mod support;
use support::cli::Run;

fn run_tests(args: &[&std::ffi::OsStr]) -> Run {
    support::cli::output(support::cli::command(["test"]).args(args))
}

/// rules/tests and rules/examples/*/tests.
fn shipped_test_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![root.join("rules/tests")];
    let mut sets: Vec<PathBuf> = std::fs::read_dir(root.join("rules/examples"))
        .expect("rules/examples")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    sets.sort();
    for set in sets {
        let tests = set.join("tests");
        assert!(
            tests.is_dir(),
            "example rule set {} ships no tests/ directory",
            set.display()
        );
        dirs.push(tests);
    }
    dirs
}

#[test]
fn every_shipped_rule_test_passes() {
    for dir in shipped_test_dirs() {
        let r = run_tests(&[dir.as_os_str()]);
        assert_eq!(r.code, Some(0), "{}:\n{}", dir.display(), r.stdout);
        assert!(r.stdout.contains(" 0 failed"), "{}", r.stdout);
        assert!(
            !r.stdout.contains("\n0 passed"),
            "no tests found: {}",
            r.stdout
        );
    }
}

const FAILING: &str = r#"apiVersion: rbacrules.io/v1alpha1
kind: RbacRuleTest
metadata: {name: passes}
spec:
  rules: [rules.yaml]
  objects:
  - {apiVersion: v1, kind: Namespace, metadata: {name: team-a, uid: u-1}}
  expect:
    objects:
    - kind: Role
      metadata: {namespace: team-a, name: reader}
      rules: [{apiGroups: [""], resources: [configmaps], verbs: [get]}]
    access:
    - {group: readers, namespace: team-a, can: get, resource: configmaps}
    - {group: readers, namespace: team-b, cannot: get, resource: configmaps}
    - {user: alice, namespace: team-a, cannot: get, resource: configmaps}
---
apiVersion: rbacrules.io/v1alpha1
kind: RbacRuleTest
metadata: {name: fails}
spec:
  rules: [rules.yaml]
  objects:
  - {apiVersion: v1, kind: Namespace, metadata: {name: team-a, uid: u-1}}
  expect:
    objects:
    - kind: Role
      metadata: {namespace: team-a, name: reader}
      rules: [{apiGroups: [""], resources: [configmaps], verbs: [list]}]
    absent:
    - {kind: RoleBinding, metadata: {namespace: team-a, name: readers}}
    access:
    - {group: readers, namespace: team-a, cannot: get, resource: configmaps}
    - {group: readers, namespace: team-a, can: delete, resource: configmaps}
"#;

const RULES: &str = r#"apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: readers}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: Role
    name: reader
    namespace: "{{trigger.metadata.name}}"
    rules: [{apiGroups: [""], resources: [configmaps], verbs: [get]}]
  - kind: RoleBinding
    name: readers
    namespace: "{{trigger.metadata.name}}"
    roleRef: {kind: Role, name: reader}
    subjects: [{kind: Group, name: readers}]
"#;

#[test]
fn failures_are_reported_per_test_with_a_summary_and_junit() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), RULES).expect("write");
    std::fs::write(dir.path().join("test.yaml"), FAILING).expect("write");
    let junit = dir.path().join("junit.xml");
    let file = dir.path().join("test.yaml");
    let r = run_tests(&[file.as_os_str(), "--junit".as_ref(), junit.as_os_str()]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    let f = file.display();
    for needle in [
        format!("ok   {f}#1: passes"),
        format!("FAIL {f}#2: fails"),
        "object Role team-a/reader differs at rules: expected [{\"apiGroups\":[\"\"],\"resources\":[\"configmaps\"],\"verbs\":[\"list\"]}]".to_string(),
        "object RoleBinding team-a/readers was rendered".to_string(),
        "access[0]: Group readers can get configmaps in namespace team-a, through RoleBinding team-a/readers → Role reader".to_string(),
        "access[1]: Group readers cannot delete configmaps in namespace team-a: no binding grants it".to_string(),
        "1 passed, 1 failed, 2 total".to_string(),
    ] {
        assert!(r.stdout.contains(&needle), "lacks {needle:?}:\n{}", r.stdout);
    }
    let xml = std::fs::read_to_string(&junit).expect("junit written");
    assert!(
        xml.contains("<testsuite name=\"rbac-rules\" tests=\"2\" failures=\"1\">"),
        "{xml}"
    );
    assert!(xml.contains("name=\"passes\"/>"), "{xml}");
    assert!(
        xml.contains("<failure message=\"object Role team-a/reader differs"),
        "{xml}"
    );
}

#[test]
fn render_errors_fail_a_test_unless_expected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad_rules = RULES.replace("name: reader\n", "name: \"{{trigger.metadata.nope}}\"\n");
    std::fs::write(dir.path().join("rules.yaml"), bad_rules).expect("write");
    let test = |expect: &str| {
        format!(
            "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRuleTest\nmetadata: {{name: t}}\nspec:\n  rules: [rules.yaml]\n  objects:\n  - {{apiVersion: v1, kind: Namespace, metadata: {{name: team-a, uid: u-1}}}}\n  expect: {expect}\n"
        )
    };
    let file = dir.path().join("t.yaml");
    std::fs::write(&file, test("{}")).expect("write");
    let r = run_tests(&[file.as_os_str()]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert!(
        r.stdout
            .contains("render error: rule \"readers\": spec.outputs[0].name"),
        "{}",
        r.stdout
    );
    std::fs::write(&file, test("{errors: [\"missing variable\"]}")).expect("write");
    let r = run_tests(&[file.as_os_str()]);
    assert_eq!(r.code, Some(0), "{}", r.stdout);
}

/// Writes a test file (and a rule file beside it) in a temporary
/// directory and runs `rbac-rules test` on it.
fn run_one(rules: &str, test: &str) -> (Run, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), rules).expect("write rules");
    std::fs::write(dir.path().join("test.yaml"), test).expect("write test");
    let r = run_tests(&[dir.path().join("test.yaml").as_os_str()]);
    (r, dir)
}

/// A Namespace-triggered rule binding the operator ServiceAccount to
/// status updates of databases.data.acme.io.
const DB_RULES: &str = "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRule\nmetadata: {name: db-status}\nspec:\n  trigger: {kind: Namespace}\n  outputs:\n  - kind: Role\n    name: db-status\n    rules:\n    - {apiGroups: [data.acme.io], resources: [databases/status], verbs: [get, update, patch]}\n  - kind: RoleBinding\n    name: db-status\n    roleRef: {kind: Role, name: db-status}\n    subjects: [{kind: ServiceAccount, name: db-operator, namespace: acme-system}]\n";

fn db_test(access: &str) -> String {
    format!(
        "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRuleTest\nmetadata: {{name: t}}\nspec:\n  rules: [rules.yaml]\n  objects:\n  - {{apiVersion: v1, kind: Namespace, metadata: {{name: team-a, uid: u1}}}}\n  - apiVersion: apiextensions.k8s.io/v1\n    kind: CustomResourceDefinition\n    metadata: {{name: databases.data.acme.io}}\n    spec: {{group: data.acme.io, names: {{kind: Database, plural: databases, singular: database}}, versions: [{{name: v1, subresources: {{status: {{}}}}}}]}}\n  expect:\n    access:\n{access}"
    )
}

#[test]
fn access_statements_name_real_verbs_and_resources() {
    let ok = db_test(
        "    - {serviceAccount: 'acme-system:db-operator', namespace: team-a, can: update, resource: databases.data.acme.io/status}\n    - {serviceAccount: 'acme-system:db-operator', namespace: team-a, cannot: create, resource: databases.data.acme.io}\n",
    );
    let (r, _d) = run_one(DB_RULES, &ok);
    assert_eq!(r.code, Some(0), "{}", r.stdout);
    for (statement, needle) in [
        (
            "{serviceAccount: 'acme-system:db-operator', namespace: team-a, cannot: craete, resource: databases.data.acme.io}",
            "unknown verb \"craete\" (did you mean \"create\"?)",
        ),
        (
            "{serviceAccount: 'acme-system:db-operator', namespace: team-a, cannot: delete, resource: databses.data.acme.io}",
            "unknown resource \"databses.data.acme.io\" (did you mean \"databases.data.acme.io\"?)",
        ),
        (
            "{serviceAccount: 'acme-system:db-operator', namespace: team-a, cannot: delete, resource: Database}",
            "unknown resource \"Database\" (did you mean \"databases.data.acme.io\"?)",
        ),
        (
            "{user: bob, cannot: get, resource: secret}",
            "unknown resource \"secret\" (did you mean \"secrets\"?)",
        ),
        (
            "{serviceAccount: 'acme-system:db-operator', namespace: team-a, cannot: update, resource: databases.data.acme.io/staus}",
            "unknown subresource \"staus\" of databases.data.acme.io (did you mean \"status\"?)",
        ),
    ] {
        let (r, _d) = run_one(DB_RULES, &db_test(&format!("    - {statement}\n")));
        assert_eq!(r.code, Some(1), "{statement} passed:\n{}", r.stdout);
        assert!(r.stdout.contains(needle), "{statement}:\n{}", r.stdout);
    }
}

#[test]
fn a_test_without_expectations_fails() {
    let t = "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRuleTest\nmetadata: {name: empty}\nspec:\n  rules: [rules.yaml]\n  objects: [{apiVersion: v1, kind: Namespace, metadata: {name: a}}]\n";
    let (r, _d) = run_one(DB_RULES, t);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert!(
        r.stdout.contains("FAIL") && r.stdout.contains("expect is empty"),
        "{}",
        r.stdout
    );
    let t2 = format!("{t}  expect: {{}}\n");
    let (r, _d) = run_one(DB_RULES, &t2);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
}

/// The shipped Deployment's allow-list, applied in a test as the
/// controller applies it: a RoleBinding of Kubernetes' `edit` is refused,
/// and the refusal names every grant of `edit` the allow-list lacks, with
/// the count, the core group written `""`.
#[test]
fn tests_apply_the_deployments_allow_list() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let allow = root.join("deploy/controller/allow-list.yaml");
    let rules = "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRule\nmetadata: {name: editors}\nspec:\n  trigger: {kind: Namespace}\n  outputs:\n  - kind: RoleBinding\n    name: editors\n    roleRef: {kind: ClusterRole, name: edit}\n    subjects: [{kind: Group, name: editors}]\n";
    let test = format!(
        "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRuleTest\nmetadata: {{name: t}}\nspec:\n  rules: [rules.yaml]\n  allow: {}\n  objects:\n  - {{apiVersion: v1, kind: Namespace, metadata: {{name: team-a, uid: u1}}}}\n  - apiVersion: rbac.authorization.k8s.io/v1\n    kind: ClusterRole\n    metadata: {{name: edit}}\n    rules:\n    - {{apiGroups: [''], resources: [pods, secrets], verbs: [create, delete]}}\n    - {{apiGroups: [apps], resources: [statefulsets], verbs: [create]}}\n  expect:\n    errors: ['binds role \"edit\"']\n    absent: [{{kind: RoleBinding, metadata: {{name: editors, namespace: team-a}}}}]\n",
        allow.display()
    );
    let (r, _d) = run_one(rules, &test);
    assert_eq!(r.code, Some(0), "{}", r.stdout);
    // Without errors expected, the refusal is the failure, in full.
    let (r, _d) = run_one(
        rules,
        &test.replace("    errors: ['binds role \"edit\"']\n", ""),
    );
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert!(
        r.stdout.contains(
            "which grants what the allow-list does not: 3 grants: [\"\"] pods: create,delete; \
             [apps] statefulsets: create"
        ),
        "{}",
        r.stdout
    );
    // Without the allow-list the binding passes.
    let (r, _d) = run_one(
        rules,
        &test
            .replace(&format!("  allow: {}\n", allow.display()), "")
            .replace("    errors: ['binds role \"edit\"']\n", "")
            .replace("absent", "objects"),
    );
    assert_eq!(r.code, Some(0), "{}", r.stdout);
}

/// `test --allow FILE` applies the allow-list to every test without its
/// own, as the Deployment applies it to every rule.
#[test]
fn the_allow_flag_applies_to_every_test() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let allow = root.join("deploy/controller/allow-list.yaml");
    let rules = "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRule\nmetadata: {name: jobs}\nspec:\n  trigger: {kind: Namespace}\n  outputs:\n  - kind: Role\n    name: jobs\n    rules: [{apiGroups: [batch], resources: [jobs], verbs: [create]}]\n";
    let test = "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRuleTest\nmetadata: {name: t}\nspec:\n  rules: [rules.yaml]\n  objects: [{apiVersion: v1, kind: Namespace, metadata: {name: a, uid: u1}}]\n  expect:\n    objects: [{kind: Role, metadata: {name: jobs, namespace: a}}]\n";
    let (r, dir) = run_one(rules, test);
    assert_eq!(r.code, Some(0), "{}", r.stdout);
    let file = dir.path().join("test.yaml");
    let r = run_tests(&[
        file.as_os_str(),
        std::ffi::OsStr::new("--allow"),
        allow.as_os_str(),
    ]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert!(
        r.stdout
            .contains("grants what the allow-list does not: [batch] jobs: create"),
        "{}",
        r.stdout
    );
}
