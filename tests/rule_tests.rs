//! `rbac-rules test`: the shipped rule tests (rules/tests and every
//! rules/examples/<set>/tests) pass, and the runner reports failures.

use std::path::{Path, PathBuf};
use std::process::Command;

struct Run {
    code: Option<i32>,
    stdout: String,
}

fn run_tests(args: &[&std::ffi::OsStr]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_rbac-rules"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("test")
        .args(args)
        .output()
        .expect("run rbac-rules");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
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
