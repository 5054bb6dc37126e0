//! Mapping keys as input YAML is read: a key repeated in its mapping is
//! refused, named by file, document and line, wherever it is (a kept
//! field, a nested or flow mapping, a list's item, a field no rule reads
//! and that is dropped as parsed), in a small stream and in one large
//! enough to be parsed in parts; merge keys (`<<`), anchors and aliases,
//! and keys that only look alike read as they always did. The reader
//! checks keys itself first and leaves anything it doubts to
//! serde-saphyr's own check (src/yaml.rs): these pin what a user sees.

mod support;

use std::path::Path;

use rbac_rules::yaml::parse_documents;
use serde_json::{Value, json};

/// Documents of about 2 KiB each: this many make a stream that is cut in
/// parts and parsed by several threads (src/yaml.rs, above 2 MiB).
const LARGE: usize = 3000;

/// `LARGE` Namespaces, document `at` (1-based) replaced by `doc`.
fn large_with(at: usize, doc: &str) -> String {
    let pad = "x".repeat(2000);
    let mut text = String::new();
    for i in 1..=LARGE {
        if i == at {
            text.push_str(doc);
            continue;
        }
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns-{i}\n  annotations: {{pad: {pad}}}\n"
        ));
    }
    assert!(text.len() > 4 << 20);
    text
}

/// The error `render --rules EMPTY` gives for `text`, and its exit code.
fn render_error(dir: &Path, file: &str, text: &str) -> (Option<i32>, Vec<String>) {
    let path = dir.join(file);
    std::fs::write(&path, text).expect("write");
    let rules = dir.join("no-rules");
    std::fs::create_dir_all(&rules).expect("mkdir");
    let out = support::cli::rbac_rules()
        .args(["render", "--objects"])
        .arg(&path)
        .arg("--rules")
        .arg(&rules)
        .output()
        .expect("run rbac-rules");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors = stderr
        .lines()
        .filter(|l| l.starts_with("error:"))
        .map(|l| l.replace(&format!("{}", dir.display()), "DIR"))
        .collect();
    (out.status.code(), errors)
}

/// A repeated key is refused, named by its document and the line within
/// it, in a kept field, a nested flow mapping, a list's item and a CRD's
/// `spec` (dropped as parsed when no rule reads it): small and large.
#[test]
fn a_repeated_key_is_refused_with_its_document_and_line_wherever_it_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  name: b\n",
            "line 6 column 3: duplicate mapping key: name",
        ),
        (
            "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  labels: {k: 1, k: 2}\n",
            "line 6 column 18: duplicate mapping key: k",
        ),
        (
            "---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Namespace\n  metadata: {name: b, name: c}\n",
            "line 7 column 23: duplicate mapping key: name",
        ),
        (
            "---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: a.x.io}\nspec:\n  group: x.io\n  names: {kind: A, kind: B}\n",
            "line 7 column 20: duplicate mapping key: kind",
        ),
        (
            "---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: a.x.io}\nspec: {group: x.io}\nspec: {group: y.io}\n",
            "line 6 column 1: duplicate mapping key: spec",
        ),
        (
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  0xB: a\n  11: b\n",
            "line 7 column 3: duplicate mapping key",
        ),
        (
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  'a': a\n  \"a\": b\n",
            "line 7 column 3: duplicate mapping key: a",
        ),
    ];
    for (doc, want) in cases {
        let small =
            format!("---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: first}}\n{doc}");
        let (code, errors) = render_error(dir.path(), "small.yaml", &small);
        assert_eq!(code, Some(1), "{doc}: {errors:?}");
        assert_eq!(errors.len(), 1, "{doc}: {errors:?}");
        let head = format!("error: DIR/small.yaml#2: invalid YAML: error: {want}");
        assert!(errors[0].starts_with(&head), "{doc}: {errors:?}");

        let at = LARGE - 100;
        let (code, errors) = render_error(dir.path(), "large.yaml", &large_with(at, doc));
        assert_eq!(code, Some(1), "{doc}: {errors:?}");
        assert_eq!(errors.len(), 1, "{doc}: {errors:?}");
        let head = format!("error: DIR/large.yaml#{at}: invalid YAML: error: {want}");
        assert!(errors[0].starts_with(&head), "{doc}: {errors:?}");
    }
}

/// Merge keys, anchors and aliases, and keys that are not the same key to
/// YAML (`1` and `"1"`, `a` and `!t a`), read as before: in a small
/// stream and in a later part of a large one.
#[test]
fn merge_keys_aliases_and_keys_only_alike_read_as_before() {
    let doc = "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, labels: &l {a: b}}\ndata:\n  <<: [*l, {c: d, e: f}]\n  e: g\n  m:\n    <<: {x: 1}\n    z: w\n  n: {1: one, \"2\": two}\n  t: {a: 1, !t b: 2}\n";
    let want = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c", "labels": {"a": "b"}},
        "data": {"a": "b", "c": "d", "e": "g", "m": {"x": 1, "z": "w"},
                 "n": {"1": "one", "2": "two"}, "t": {"a": 1, "b": 2}},
    });
    let small = format!("---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: first}}\n{doc}");
    let at = LARGE - 100;
    for (text, index) in [(small, 2), (large_with(at, doc), at)] {
        let docs = parse_documents(Path::new("k.yaml"), &text).expect("read");
        let found: Vec<(usize, &Value)> = docs
            .iter()
            .filter(|d| d.value["kind"] == "ConfigMap")
            .map(|d| (d.index, &d.value))
            .collect();
        assert_eq!(found, [(index, &want)]);
    }
}

/// A key that looks alike but is not the same (`1` and `"1"`) is read
/// as it always was: the later value wins in the JSON object.
#[test]
fn keys_alike_in_text_but_not_to_yaml_are_not_refused() {
    for text in [
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {1: a, \"1\": b}\n"
            .to_string(),
        large_with(
            LARGE - 1,
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {1: a, \"1\": b}\n",
        ),
    ] {
        let docs = parse_documents(Path::new("k.yaml"), &text).expect("read");
        let cm = docs
            .iter()
            .find(|d| d.value["kind"] == "ConfigMap")
            .expect("the ConfigMap");
        assert_eq!(cm.value["data"], json!({"1": "b"}));
    }
}
