//! Directory semantics of `--rules` and `--objects`, like `kubectl apply -f`:
//! a directory's own files are read, sub-directories only with `-R`.

use std::path::Path;

mod support;
use support::cli::{command, output, render_files};

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
    let out = render_files(&root.join("rules"), &root.join("objects"), extra);
    assert_eq!(out.code, Some(0), "render failed: {}", out.stderr);
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&out.stdout).expect("YAML");
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
    let out = render_files(
        &dir.path().join("rules/nested/deep.yaml"),
        &dir.path().join("objects/more/b.yaml"),
        &[],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("name: deep:b"));
}

#[test]
fn the_shipped_rules_directory_holds_only_the_builtin_rules() {
    // `render --rules rules` equals the built-in set: rules/examples and
    // every tests/ directory are below it and not read.
    let run = |args: &[&str]| {
        let out =
            output(command(["render", "--objects", "examples/crossplane-cluster.yaml"]).args(args));
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        out.stdout
    };
    assert_eq!(run(&["--rules", "rules"]), run(&[]));
}
