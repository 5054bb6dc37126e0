//! `validate` on everything the project ships as a rule: the built-in
//! rules, every example rule set, every rule file under docs/, and every
//! rule snippet of the Markdown docs. None may have an error; the only
//! warnings are the true ones listed here (a kind whose CRD is not at hand,
//! a label value that can be too long), so a new warning — a false
//! positive of `validate` or a mistake in a doc — fails.

mod support;

use std::path::{Path, PathBuf};

use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Warnings known to be true: (where, text of the warning).
const TRUE_WARNINGS: &[(&str, &str)] = &[
    // Example sets for systems whose CRDs this repository does not carry.
    (
        "rules/examples/package-isolation/",
        ".packages.crossplane.io: not built in",
    ),
    (
        "rules/examples/package-isolation/",
        ".platform.example.org: not built in",
    ),
    (
        "rules/examples/config-sync",
        ".configsync.gke.io: not built in",
    ),
    // The reference overview labels outputs with a trigger's full name,
    // which may be longer than a label value may be: the doc says so.
    (
        "overview-rule.yaml#1",
        "spec.outputs[0].labels.example.org/widget: \"{{trigger.metadata.name}}\" can render 253 characters",
    ),
];

/// The CRDs the shipped rules read: the e2e stand-ins (Crossplane's
/// kinds), the first-hour tutorial's, and the docs' `Widget` (any fields).
fn crd_objects(dir: &Path) -> Vec<PathBuf> {
    let widget = dir.join("widget-crd.yaml");
    std::fs::write(
        &widget,
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.example.org}\nspec:\n  group: example.org\n  names: {kind: Widget, plural: widgets}\n  scope: Namespaced\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        x-kubernetes-preserve-unknown-fields: true\n",
    )
    .expect("write widget CRD");
    let mut out = vec![root().join("tests/e2e"), widget];
    let first_hour = root().join("docs/tutorial/first-hour/crds.yaml");
    if first_hour.exists() {
        out.push(first_hour);
    }
    out
}

/// Runs `validate` on `rules` with `objects`; the findings as JSON.
fn validate(rules: &[PathBuf], objects: &[PathBuf], recursive: bool) -> Vec<Value> {
    let mut cmd = support::cli::rbac_rules();
    cmd.current_dir(root())
        .arg("validate")
        .arg("--rules")
        .args(rules);
    cmd.arg("--objects").args(objects).args(["-o", "json"]);
    if recursive {
        cmd.arg("-R");
    }
    let out = cmd.output().expect("run rbac-rules");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str::<Vec<Value>>(&text)
        .unwrap_or_else(|e| panic!("{rules:?}: not JSON ({e}): {text}"))
}

fn unexpected(findings: &[Value]) -> Vec<String> {
    findings
        .iter()
        .filter(|f| {
            let origin = f["origin"].as_str().unwrap_or_default();
            let message = format!(
                "{}: {}",
                f["field"].as_str().unwrap_or_default(),
                f["message"].as_str().unwrap_or_default()
            );
            f["severity"] == "error"
                || !TRUE_WARNINGS
                    .iter()
                    .any(|(file, text)| origin.contains(file) && message.contains(text))
        })
        .map(|f| f.to_string())
        .collect()
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(p);
        }
    }
}

#[test]
fn the_built_in_and_example_rules_validate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = crd_objects(dir.path());
    // One rule set per run: example sets may reuse a built-in rule's name.
    let mut sets = vec![root().join("rules")];
    let mut examples: Vec<PathBuf> = std::fs::read_dir(root().join("rules/examples"))
        .expect("rules/examples")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    examples.sort();
    sets.extend(examples);
    for set in sets {
        // Example sets with sub-directories (any-crd/allow-list) in full.
        let recursive = set != root().join("rules");
        let findings = validate(std::slice::from_ref(&set), &objects, recursive);
        let bad = unexpected(&findings);
        assert!(bad.is_empty(), "{}:\n{}", set.display(), bad.join("\n"));
    }
}

#[test]
fn every_rule_file_under_docs_validates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = crd_objects(dir.path());
    let mut files = Vec::new();
    yaml_files(&root().join("docs"), &mut files);
    let mut checked = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        if !text.contains("kind: RbacRule\n") {
            continue;
        }
        checked += 1;
        // Each file alone: the tutorial's steps are one rule at three stages.
        let findings = validate(std::slice::from_ref(&f), &objects, false);
        let bad = unexpected(&findings);
        assert!(bad.is_empty(), "{}:\n{}", f.display(), bad.join("\n"));
    }
    assert!(checked >= 4, "only {checked} rule files found under docs/");
}

/// The ```yaml blocks of a Markdown text.
fn yaml_blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for line in text.lines() {
        match &mut cur {
            None if line.trim_start().starts_with("```yaml") => cur = Some(String::new()),
            Some(block) if line.trim_start().starts_with("```") => {
                out.push(std::mem::take(block));
                cur = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    out
}

/// A snippet as rule text: a whole RbacRule as it is; a spec fragment
/// (`trigger:`, `outputs:`, … at the top) inside a rule of its own, with
/// a stand-in output when it shows none. `None`: not a rule snippet (a
/// `where:` list, a test, an object).
fn as_rule(block: &str, n: usize) -> Option<String> {
    if block.contains("kind: RbacRule\n") {
        return Some(block.to_string());
    }
    let v: Value = serde_saphyr::from_str(block).ok()?;
    let m = v.as_object()?;
    const SPEC: &[&str] = &["manageLevel", "trigger", "related", "vars", "outputs"];
    if m.is_empty() || !m.keys().all(|k| SPEC.contains(&k.as_str())) {
        return None;
    }
    let mut spec = v.clone();
    match spec.get_mut("outputs").and_then(Value::as_array_mut) {
        // A fragment may leave out what it is not about: the name.
        Some(outputs) => {
            for o in outputs.iter_mut().filter_map(Value::as_object_mut) {
                o.entry("name").or_insert_with(|| "snippet".into());
            }
        }
        None => {
            spec["outputs"] = serde_json::json!([{"kind": "ClusterRole", "name": "snippet"}]);
        }
    }
    let rule = serde_json::json!({
        "apiVersion": "rbacrules.io/v1alpha1",
        "kind": "RbacRule",
        "metadata": {"name": format!("snippet-{n}")},
        "spec": spec,
    });
    Some(serde_json::to_string(&rule).expect("JSON is YAML"))
}

#[test]
fn every_rule_snippet_of_the_docs_validates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = crd_objects(dir.path());
    let mut docs = vec![root().join("README.md")];
    let mut files = Vec::new();
    fn md(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                md(&p, out);
            } else if p.extension().is_some_and(|e| e == "md") {
                out.push(p);
            }
        }
    }
    md(&root().join("docs"), &mut files);
    files.sort();
    docs.extend(files);
    if root().join("CONTRIBUTING.md").exists() {
        docs.push(root().join("CONTRIBUTING.md"));
    }
    let mut checked = 0;
    for doc in docs {
        let text = std::fs::read_to_string(&doc).expect("read");
        for (i, block) in yaml_blocks(&text).iter().enumerate() {
            let Some(rule) = as_rule(block, i) else {
                continue;
            };
            checked += 1;
            let name = format!(
                "{}-block{i}.yaml",
                doc.file_name().and_then(|n| n.to_str()).unwrap_or("doc")
            );
            let file = dir.path().join(&name);
            std::fs::write(&file, &rule).expect("write snippet");
            let findings = validate(std::slice::from_ref(&file), &objects, false);
            let bad: Vec<String> = unexpected(&findings)
                .into_iter()
                // The reference overview is a doc block too.
                .filter(|f| {
                    !(f.contains("can render 253 characters") && f.contains("example.org/widget"))
                })
                .collect();
            assert!(
                bad.is_empty(),
                "{} yaml block {i}:\n{rule}\n{}",
                doc.display(),
                bad.join("\n")
            );
        }
    }
    assert!(
        checked >= 5,
        "only {checked} rule snippets found in the docs"
    );
}

/// The anchors of a Markdown file's headings, as GitHub makes them.
fn anchors(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            code = !code;
        }
        if !code && line.starts_with('#') {
            let h = line.trim_start_matches('#').trim().to_lowercase();
            out.push(
                h.chars()
                    .filter(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '_' | '-'))
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect(),
            );
        }
    }
    out
}

/// Every relative link of the README, CONTRIBUTING, the CHANGELOG, docs/
/// and the chart's README points at a file that exists (and a heading
/// that exists, for a `#anchor` into Markdown): moving a page breaks no
/// link.
#[test]
fn relative_links_resolve() {
    let mut files = vec![
        root().join("README.md"),
        root().join("CONTRIBUTING.md"),
        root().join("CHANGELOG.md"),
        root().join("deploy/helm/rbac-rules/README.md"),
    ];
    fn md(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                md(&p, out);
            } else if p.extension().is_some_and(|e| e == "md") {
                out.push(p);
            }
        }
    }
    md(&root().join("docs"), &mut files);
    let link = regex::Regex::new(r"\]\(([^)\s]+)\)").expect("regex");
    let mut broken = Vec::new();
    for f in files.iter().filter(|f| f.exists()) {
        let text = std::fs::read_to_string(f).expect("read");
        // Links inside code blocks are not links.
        let mut prose = String::new();
        let mut code = false;
        for line in text.lines() {
            if line.starts_with("```") {
                code = !code;
                continue;
            }
            if !code {
                prose.push_str(line);
                prose.push('\n');
            }
        }
        for c in link.captures_iter(&prose) {
            let target = &c[1];
            if target.starts_with("http") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
            let file = if path.is_empty() {
                f.clone()
            } else {
                f.parent().expect("parent").join(path)
            };
            if !file.exists() {
                broken.push(format!("{}: {target}", f.display()));
                continue;
            }
            if !anchor.is_empty() && file.extension().is_some_and(|e| e == "md") {
                let text = std::fs::read_to_string(&file).expect("read");
                if !anchors(&text).iter().any(|a| a == anchor) {
                    broken.push(format!("{}: {target} (no such heading)", f.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
