//! Directory semantics of `--rules` and `--objects`, like `kubectl apply -f`:
//! a directory's own files are read, sub-directories only with `-R`.

use std::path::Path;
use std::process::Command;

fn rule(name: &str, role: &str) -> String {
    format!(
        "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRule\nmetadata:\n  name: {name}\nspec:\n  trigger:\n    kind: Namespace\n  outputs:\n  - kind: ClusterRole\n    name: \"{role}:{{{{trigger.metadata.name}}}}\"\n    rules:\n    - apiGroups: [\"\"]\n      resources: [configmaps]\n      verbs: [get]\n"
    )
}

fn namespace(name: &str) -> String {
    format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  uid: u-{name}\n")
}

/// A tree: `rules/top.yaml`, `rules/nested/deep.yaml`, `rules/README.md`,
/// `objects/a.yaml`, `objects/more/b.yaml`.
fn tree(root: &Path) {
    let write = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    };
    write("rules/top.yaml", &rule("top", "top"));
    write("rules/nested/deep.yaml", &rule("deep", "deep"));
    write("rules/README.md", "not YAML: never read\n");
    write("objects/a.yaml", &namespace("a"));
    write("objects/more/b.yaml", &namespace("b"));
}

/// The names of the objects `render` prints.
fn render(root: &Path, extra: &[&str]) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_rbac-rules"))
        .arg("render")
        .arg("--rules")
        .arg(root.join("rules"))
        .arg("--objects")
        .arg(root.join("objects"))
        .args(extra)
        .output()
        .expect("run rbac-rules");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "render failed: {stderr}");
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).expect("YAML");
    let mut names: Vec<String> = docs
        .iter()
        .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

#[test]
fn a_directory_is_read_without_its_sub_directories() {
    let dir = tempfile::tempdir().expect("tempdir");
    tree(dir.path());
    assert_eq!(render(dir.path(), &[]), ["top:a"]);
}

#[test]
fn recursive_reads_sub_directories() {
    let dir = tempfile::tempdir().expect("tempdir");
    tree(dir.path());
    let all = ["deep:a", "deep:b", "top:a", "top:b"];
    assert_eq!(render(dir.path(), &["-R"]), all);
    assert_eq!(render(dir.path(), &["--recursive"]), all);
}

#[test]
fn files_are_read_as_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    tree(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_rbac-rules"))
        .arg("render")
        .arg("--rules")
        .arg(dir.path().join("rules/nested/deep.yaml"))
        .arg("--objects")
        .arg(dir.path().join("objects/more/b.yaml"))
        .output()
        .expect("run rbac-rules");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("name: deep:b"));
}

#[test]
fn the_shipped_rules_directory_holds_only_the_builtin_rules() {
    // `render --rules rules` equals the built-in set: rules/examples and
    // every tests/ directory are below it and not read.
    let root = env!("CARGO_MANIFEST_DIR");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_rbac-rules"))
            .current_dir(root)
            .args(["render", "--objects", "examples/crossplane-cluster.yaml"])
            .args(args)
            .output()
            .expect("run rbac-rules");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    assert_eq!(run(&["--rules", "rules"]), run(&[]));
}
