//! YAML in and out: multi-document files, `kind: List`, directories, and
//! output in the key order `kubectl` users read (apiVersion, kind, metadata
//! first).

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::Value;

/// The deepest nesting of maps and lists the Kubernetes API server accepts
/// in an object (the object's own braces are level 1): its JSON decoder's
/// limit (Go's `encoding/json` scanner as vendored in sigs.k8s.io/json,
/// `maxNestingDepth`; `maxDepth` in k8s.io/apimachinery/pkg/util/json) and
/// its YAML decoder's (`max_indents`, `max_flow_level`), all 10,000.
/// Inputs as deep are read (a provider's CRD schema is deep); deeper ones
/// are refused, each alone.
pub const MAX_DEPTH: usize = 10_000;

/// A YAML file that cannot be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    /// The file or directory cannot be read.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid YAML.
    #[error("{path}: invalid YAML: {message}")]
    Parse { path: String, message: String },
    /// Serialization failed.
    #[error("cannot write YAML: {0}")]
    Write(String),
}

/// One document of a file, with where it came from.
#[derive(Clone, Debug)]
pub struct Document {
    /// The file.
    pub path: PathBuf,
    /// 1-based position of the document in the file (items of a `List`
    /// share their list's position).
    pub index: usize,
    /// The content.
    pub value: Value,
}

impl Document {
    fn at(path: &Path, index: usize, value: Value) -> Self {
        Document {
            path: path.to_path_buf(),
            index,
            value,
        }
    }

    /// `file.yaml#2`, for messages.
    pub fn origin(&self) -> String {
        format!("{}#{}", self.path.display(), self.index)
    }
}

/// Parser settings for `text`. serde-saphyr's default budget refuses more
/// than 1,024 documents or 250,000 nodes, and a cluster's objects in one
/// file are more than that. Plain data cannot hold more documents, nodes,
/// events or scalar bytes than it has bytes, so those limits scale with the
/// input; the limits against alias and anchor expansion keep their
/// defaults. Nesting (64 by default, 255 in flow style) may go as deep as
/// the API server accepts ([`MAX_DEPTH`]): documents are parsed on the
/// large-stack evaluation thread ([`parse_all`]).
fn options_for(text: &str) -> serde_saphyr::Options {
    let n = text.len();
    let mut budget = serde_saphyr::Budget::default();
    budget.max_documents = budget.max_documents.max(n / 4 + 1);
    budget.max_nodes = budget.max_nodes.max(n + 1);
    budget.max_events = budget.max_events.max(4 * n + 16);
    budget.max_total_scalar_bytes = budget.max_total_scalar_bytes.max(n + 1);
    budget.max_depth = MAX_DEPTH;
    budget.flow_nesting_limit = MAX_DEPTH;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// A document's 1-based position and content, or why it cannot be read.
type Parsed = (usize, Result<Value, YamlError>);

/// The documents of `text`, each with its 1-based position, or the error
/// of each document that cannot be read.
///
/// serde-saphyr recurses once per level (a few KiB each unoptimised), so
/// the parse runs on the evaluation thread and its 256 MiB stack, which
/// holds [`MAX_DEPTH`] levels with room to spare. One bad document (too
/// deep, invalid) fails the parse of the whole stream: the stream is then
/// cut at its document markers and each part parsed alone, so the error
/// names that document and the others are still read.
fn parse_all(path: &Path, text: &str) -> Result<Vec<Parsed>, YamlError> {
    let parse = |text: &str| -> Result<Vec<Value>, String> {
        serde_saphyr::from_multiple_with_options(text, options_for(text)).map_err(|e| {
            let e = e.to_string();
            // serde-saphyr names its depth limit a recursion limit.
            if e.contains("recursion limit") || e.contains("depth") {
                format!(
                    "nests deeper than {MAX_DEPTH} levels, the most the API server accepts: {e}"
                )
            } else {
                e
            }
        })
    };
    let parsed = crate::engine::limits::isolated(|| match parse(text) {
        Ok(docs) => Ok(docs.into_iter().map(Ok).collect::<Vec<_>>()),
        Err(whole) => {
            let parts = split_documents(text);
            if parts.len() < 2 {
                return Err(whole);
            }
            let mut out = Vec::new();
            for part in parts {
                match parse(part) {
                    Ok(docs) => out.extend(docs.into_iter().map(Ok)),
                    Err(e) => out.push(Err(e)),
                }
            }
            Ok(out)
        }
    });
    let fail = |message: String| YamlError::Parse {
        path: path.display().to_string(),
        message,
    };
    let docs = parsed.map_err(&fail)?.map_err(&fail)?;
    Ok(docs
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let index = i + 1;
            let d = d.map_err(|message| YamlError::Parse {
                path: format!("{}#{index}", path.display()),
                message,
            });
            (index, d)
        })
        .collect())
}

/// `text` cut before each line that starts a document (`---` alone or
/// followed by a space); a part without content is dropped. YAML forbids
/// such a line inside a document, so the cut never splits one.
fn split_documents(text: &str) -> Vec<&str> {
    let mut starts = vec![0];
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches(['\n', '\r']);
        if at > 0 && (body == "---" || body.starts_with("--- ") || body.starts_with("---\t")) {
            starts.push(at);
        }
        at += line.len();
    }
    starts.push(text.len());
    starts
        .windows(2)
        .map(|w| &text[w[0]..w[1]])
        .filter(|part| {
            part.lines().any(|l| {
                let l = l.trim();
                !l.is_empty() && !l.starts_with('#') && l != "---" && l != "..."
            })
        })
        .collect()
}

/// Parses a multi-document YAML text; empty documents are skipped and
/// `kind: List` documents are replaced by their items.
pub fn parse_documents(path: &Path, text: &str) -> Result<Vec<Document>, YamlError> {
    let mut out = Vec::new();
    for_each_document(path, text, |index, value| {
        out.push(Document::at(path, index, value));
    })?;
    Ok(out)
}

/// Whether a document is a list of objects (`kind: List`, `kind: FooList`
/// with `items`).
fn is_list(doc: &Value) -> bool {
    let kind = doc.get("kind").and_then(Value::as_str);
    kind == Some("List") || kind.is_some_and(|k| k.ends_with("List")) && doc.get("items").is_some()
}

/// Hands each document of `text` to `each` (with its 1-based position),
/// items of lists one by one, moving them: nothing is copied, and the
/// caller keeps only what it builds from them. Empty documents are skipped.
/// A document that cannot be read (invalid, or nested deeper than
/// [`MAX_DEPTH`]) is refused alone: the others are handed over, then the
/// first such error, naming the file and the document, is returned.
///
/// The whole text is parsed first: serde-saphyr's streaming reader parses
/// about a third slower than its string parser, and the text is small
/// beside the objects parsed from it.
pub fn for_each_document(
    path: &Path,
    text: &str,
    mut each: impl FnMut(usize, Value),
) -> Result<(), YamlError> {
    let mut refused = None;
    for (index, doc) in parse_all(path, text)? {
        let doc = match doc {
            Ok(doc) => doc,
            // The first bad document is the error; the others are read.
            Err(e) => {
                refused.get_or_insert(e);
                continue;
            }
        };
        if doc.is_null() {
            continue;
        }
        if !is_list(&doc) {
            each(index, doc);
            continue;
        }
        if let Value::Object(mut m) = doc
            && let Some(Value::Array(items)) = m.remove("items")
        {
            for item in items {
                each(index, item);
            }
        }
    }
    refused.map_or(Ok(()), Err)
}

/// Files named by `paths`, as `kubectl apply -f` reads them: files as
/// given; a directory's `.yaml`, `.yml` and `.json` files in name order, and
/// its sub-directories only when `recursive` (kubectl's `-R`). A rule set's
/// `tests/` sub-directory is thus never read as rules or objects.
pub fn expand_paths(paths: &[PathBuf], recursive: bool) -> Result<Vec<PathBuf>, YamlError> {
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).map_err(|e| YamlError::Io {
            path: p.display().to_string(),
            source: e,
        })?;
        if meta.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| YamlError::Io {
                    path: p.display().to_string(),
                    source: e,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            entries.sort();
            let (dirs, files): (Vec<PathBuf>, Vec<PathBuf>) =
                entries.into_iter().partition(|e| e.is_dir());
            for f in files {
                if matches!(
                    f.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml" | "json")
                ) {
                    out.push(f);
                }
            }
            if recursive {
                out.extend(expand_paths(&dirs, true)?);
            }
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// Reads every document under `paths`; directories are not recursed into.
pub fn load_paths(paths: &[PathBuf]) -> Result<Vec<Document>, YamlError> {
    load_tree(paths, false)
}

/// Reads every document under `paths`, recursing into sub-directories when
/// `recursive`.
pub fn load_tree(paths: &[PathBuf], recursive: bool) -> Result<Vec<Document>, YamlError> {
    let mut out = Vec::new();
    for_each_in_tree(paths, recursive, |path, index, value| {
        out.push(Document::at(path, index, value));
    })?;
    Ok(out)
}

/// Like [`load_tree`], handing each document to `each` (file, 1-based
/// position, content) as it is parsed instead of collecting them.
pub fn for_each_in_tree(
    paths: &[PathBuf],
    recursive: bool,
    mut each: impl FnMut(&Path, usize, Value),
) -> Result<(), YamlError> {
    for f in expand_paths(paths, recursive)? {
        let text = std::fs::read_to_string(&f).map_err(|e| YamlError::Io {
            path: f.display().to_string(),
            source: e,
        })?;
        for_each_document(&f, &text, |index, value| each(&f, index, value))?;
    }
    Ok(())
}

/// Key order: these first, in this order, then the rest alphabetically.
const TOP_ORDER: &[&str] = &["apiVersion", "kind", "metadata", "spec"];
const META_ORDER: &[&str] = &[
    "name",
    "namespace",
    "labels",
    "annotations",
    "ownerReferences",
];

/// Serializes a JSON value with Kubernetes-style key order at the top and
/// in `metadata`; nested maps keep sorted order.
struct Ordered<'a> {
    value: &'a Value,
    order: &'static [&'static str],
}

impl Serialize for Ordered<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Value::Object(m) = self.value else {
            return self.value.serialize(s);
        };
        let mut keys: Vec<&String> = m.keys().collect();
        let rank = |k: &str| {
            self.order
                .iter()
                .position(|o| *o == k)
                .unwrap_or(self.order.len())
        };
        keys.sort_by(|a, b| (rank(a), a.as_str()).cmp(&(rank(b), b.as_str())));
        let mut map = s.serialize_map(Some(keys.len()))?;
        for k in keys {
            let v = &m[k.as_str()];
            if self.order == TOP_ORDER && k == "metadata" {
                map.serialize_entry(
                    k,
                    &Ordered {
                        value: v,
                        order: META_ORDER,
                    },
                )?;
            } else {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}

/// One value as YAML.
pub fn to_yaml<T: Serialize>(value: &T) -> Result<String, YamlError> {
    let v = serde_json::to_value(value).map_err(|e| YamlError::Write(e.to_string()))?;
    let mut out = String::new();
    push_yaml(&mut out, &v)?;
    Ok(out)
}

/// Appends a JSON value as YAML, serialized in place (no copy).
fn push_yaml(out: &mut String, v: &Value) -> Result<(), YamlError> {
    serde_saphyr::to_fmt_writer(
        out,
        &Ordered {
            value: v,
            order: TOP_ORDER,
        },
    )
    .map_err(|e| YamlError::Write(e.to_string()))
}

/// Objects as a multi-document YAML stream.
pub fn to_yaml_stream(values: &[Value]) -> Result<String, YamlError> {
    let refs: Vec<&Value> = values.iter().collect();
    let mut out = Vec::new();
    write_stream(&refs, &mut out)?;
    String::from_utf8(out).map_err(|e| YamlError::Write(e.to_string()))
}

/// Objects per batch of [`write_stream`].
const BATCH: usize = 256;

/// Writes objects as a multi-document YAML stream (each preceded by
/// `---`), batch by batch, so a large stream is never built in memory.
/// Printing thousands of objects is mostly serializing them: a second
/// thread serializes every other batch while this one writes; the order
/// is the given one.
pub fn write_stream<D: Doc>(values: &[D], out: &mut impl std::io::Write) -> Result<(), YamlError> {
    let write = |out: &mut dyn std::io::Write, text: &str| {
        out.write_all(text.as_bytes())
            .map_err(|e| YamlError::Write(e.to_string()))
    };
    if values.len() <= BATCH {
        return write(out, &batch(values)?);
    }
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        s.spawn(move || {
            for chunk in values.chunks(BATCH).skip(1).step_by(2) {
                // The receiver is gone only when writing failed.
                if tx.send(batch(chunk)).is_err() {
                    return;
                }
            }
        });
        for (i, chunk) in values.chunks(BATCH).enumerate() {
            let text = if i % 2 == 0 {
                batch(chunk)?
            } else {
                rx.recv()
                    .map_err(|_| YamlError::Write("the serializing thread stopped".into()))??
            };
            write(out, &text)?;
        }
        Ok(())
    })
}

/// A batch of objects as YAML documents.
fn batch<D: Doc>(values: &[D]) -> Result<String, YamlError> {
    let mut text = String::new();
    for v in values {
        text.push_str("---\n");
        v.push_yaml(&mut text)?;
    }
    Ok(text)
}

/// One document of a stream.
pub trait Doc: Sync {
    /// Appends the document as YAML, keys in Kubernetes' order.
    fn push_yaml(&self, out: &mut String) -> Result<(), YamlError>;
}

impl Doc for &Value {
    fn push_yaml(&self, out: &mut String) -> Result<(), YamlError> {
        push_yaml(out, self)
    }
}

/// Printed from its parts, in the order [`TOP_ORDER`] and [`META_ORDER`]
/// give a JSON object (no JSON copy).
impl Doc for crate::engine::Manifest {
    fn push_yaml(&self, out: &mut String) -> Result<(), YamlError> {
        self.push_yaml(out).map_err(YamlError::Write)
    }
}

impl<A: Doc, B: Doc> Doc for Result<A, B> {
    fn push_yaml(&self, out: &mut String) -> Result<(), YamlError> {
        match self {
            Ok(a) => a.push_yaml(out),
            Err(b) => b.push_yaml(out),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stream_of_thousands_of_documents_parses() {
        let docs = 5_000;
        let text: String = (0..docs)
            .map(|i| format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: ns-{i}, labels: {{a: b}}}}\n---\n"))
            .collect();
        let parsed = parse_documents(Path::new("big.yaml"), &text).expect("parses");
        assert_eq!(parsed.len(), docs);
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn lists_and_empty_documents() {
        let text = "---\n---\nkind: List\napiVersion: v1\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n- {apiVersion: v1, kind: Namespace, metadata: {name: b}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: c}\n";
        let docs = parse_documents(Path::new("x.yaml"), text).unwrap();
        let names: Vec<&str> = docs
            .iter()
            .map(|d| d.value["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    #[test]
    fn a_long_stream_keeps_its_order() {
        let values: Vec<Value> = (0..3 * BATCH + 7)
            .map(|i| json!({"kind": "Role", "apiVersion": "v1", "metadata": {"name": format!("r{i}")}}))
            .collect();
        let one_by_one: String = values
            .iter()
            .map(|v| format!("---\n{}", to_yaml(v).unwrap()))
            .collect();
        assert_eq!(to_yaml_stream(&values).unwrap(), one_by_one);
    }

    #[test]
    fn a_manifest_prints_as_its_json_does() {
        let v = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "x", "labels": {"b": "1", "a": "2"}, "annotations": {"z": "y"},
                         "ownerReferences": [{"kind": "K", "name": "n", "uid": "u", "controller": true}]},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"k": "v"}}]}});
        let m = crate::engine::Manifest::from_value(&v).unwrap();
        assert_eq!(m.to_value(), v);
        assert_eq!(batch(&[m]).unwrap(), batch(&[&v]).unwrap());
        let b = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "x", "namespace": "ns", "labels": {"a": "2"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
            "subjects": [{"apiGroup": "", "kind": "ServiceAccount", "name": "s", "namespace": "ns"}]});
        let m = crate::engine::Manifest::from_value(&b).unwrap();
        assert_eq!(batch(&[m]).unwrap(), batch(&[&b]).unwrap());
    }

    #[test]
    fn output_round_trips_and_orders_keys() {
        let v = json!({"rules": [{"verbs": ["*"], "apiGroups": [""], "resources": ["*"]}],
                       "metadata": {"labels": {"a": "true"}, "name": "x:y"},
                       "kind": "ClusterRole", "apiVersion": "rbac.authorization.k8s.io/v1"});
        let text = to_yaml(&v).unwrap();
        assert!(text.starts_with("apiVersion:"), "{text}");
        let back: Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(back, v, "{text}");
    }
}
