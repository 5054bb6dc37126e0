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

/// The nesting the parser reads. Each object is then held to
/// [`MAX_DEPTH`] itself ([`too_deep`]): a `List` adds two levels around its
/// items (`kubectl get -o yaml`), so an item as deep as the API server
/// allows is read, and one a few levels deeper is refused alone, not the
/// list. Deeper still, the document is refused whole. Not more: the
/// parser takes about 5 KiB of stack per level (optimised), which grows on
/// the heap ([`Node`]) and is freed after: about 50 MB at this depth.
const PARSE_DEPTH: usize = MAX_DEPTH + 16;

/// Whether an object nests deeper than [`MAX_DEPTH`] (the object's own
/// braces are level 1). Iterative, and stops at the first level too deep.
pub fn too_deep(v: &Value) -> bool {
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Object(m) => Box::new(m.values()),
            Value::Array(a) => Box::new(a.iter()),
            _ => continue,
        };
        if d > MAX_DEPTH {
            return true;
        }
        stack.extend(children.map(|c| (c, d + 1)));
    }
    false
}

/// Drops a value without recursion: one refused for its depth is deeper
/// than a small stack holds.
fn dismantle(v: Value) {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) => stack.extend(m.into_iter().map(|(_, x)| x)),
            Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
}

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
    /// A document (or an item of a list) nests deeper than the API server
    /// accepts.
    #[error("{path}: {item}nests deeper than {MAX_DEPTH} levels, the most the API server accepts")]
    TooDeep {
        /// `file#document`.
        path: String,
        /// `item N of the list ` when the object is a list's item.
        item: String,
    },
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
    budget.max_depth = PARSE_DEPTH;
    budget.flow_nesting_limit = PARSE_DEPTH;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// A document's 1-based position and content, or why it cannot be read.
type Parsed = (usize, Result<Value, YamlError>);

/// The documents of `text`, each with its 1-based position, or the error
/// of each document that cannot be read.
///
/// One bad document (too deep, invalid) fails the parse of the whole
/// stream: the stream is then cut at its document markers and each part
/// parsed alone, so the error names that document and the others are
/// still read.
fn parse_all(path: &Path, text: &str, mut each: impl FnMut(Parsed)) -> Result<(), YamlError> {
    let parse =
        |text: &str| -> Result<Vec<Value>, String> {
            serde_saphyr::from_multiple_with_options::<Read>(text, options_for(text))
            .map(|docs| docs.into_iter().map(|mut d| std::mem::take(&mut d.0)).collect())
            .map_err(|e| {
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
    let mut index = 0;
    let mut hand = |d: Result<Value, String>| {
        index += 1;
        let d = d.map_err(|message| YamlError::Parse {
            path: format!("{}#{index}", path.display()),
            message,
        });
        each((index, d));
    };
    // A large stream (a cluster's objects) is read document by document,
    // each handed on before the next is parsed: what is held is the text
    // and what the caller keeps, never every document parsed at once.
    let whole = if text.len() > STREAM_ABOVE {
        Err(String::new())
    } else {
        parse(text)
    };
    match whole {
        Ok(docs) => docs.into_iter().for_each(|d| hand(Ok(d))),
        Err(whole) => {
            let parts = split_documents(text);
            if parts.len() < 2 && !whole.is_empty() {
                // One document: it is the one named.
                let at = if parts.is_empty() { "" } else { "#1" };
                return Err(YamlError::Parse {
                    path: format!("{}{at}", path.display()),
                    message: whole,
                });
            }
            for part in parts {
                match parse(part) {
                    Ok(docs) => docs.into_iter().for_each(|d| hand(Ok(d))),
                    Err(e) => hand(Err(e)),
                }
            }
        }
    }
    Ok(())
}

/// Texts longer than this are parsed document by document.
const STREAM_ABOVE: usize = 4 << 20;

/// One document, read as a JSON value by [`Node`].
struct Read(Value);

/// Documents read before a later one fails are dropped by the parser:
/// without recursion, as they may be deep.
impl Drop for Read {
    fn drop(&mut self) {
        dismantle(std::mem::take(&mut self.0));
    }
}

impl<'de> serde::Deserialize<'de> for Read {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::DeserializeSeed::deserialize(Node, d).map(Read)
    }
}

/// Stack left (bytes) below which reading goes on in a new heap segment
/// of [`SEGMENT`]: a level of serde-saphyr and this visitor takes about
/// 5 KiB optimised, a few times that unoptimised.
const RED_ZONE: usize = 256 * 1024;
const SEGMENT: usize = 8 * 1024 * 1024;

/// A value of a document, read as serde_json's own visitor reads one, but
/// each level checks the stack left and continues on the heap when it runs
/// low (stacker, as rustc does): documents as deep as [`PARSE_DEPTH`] read
/// on any thread, a test's 2 MiB or the main thread's 8 MiB.
#[derive(Clone, Copy)]
struct Node;

impl<'de> serde::de::DeserializeSeed<'de> for Node {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        stacker::maybe_grow(RED_ZONE, SEGMENT, || d.deserialize_any(self))
    }
}

impl<'de> serde::de::Visitor<'de> for Node {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Value, E> {
        serde_json::Number::from_i128(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("integer {v} out of range")))
    }

    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Value, E> {
        serde_json::Number::from_u128(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("integer {v} out of range")))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        serde::de::DeserializeSeed::deserialize(self, d)
    }

    fn visit_newtype_struct<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        serde::de::DeserializeSeed::deserialize(self, d)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(self)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let v = map.next_value_seed(self)?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
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
    parse_all(path, text, |(index, doc)| {
        let doc = match doc {
            Ok(doc) => doc,
            // The first bad document is the error; the others are read.
            Err(e) => {
                refused.get_or_insert(e);
                return;
            }
        };
        if doc.is_null() {
            return;
        }
        let deep = |item: String| YamlError::TooDeep {
            path: format!("{}#{index}", path.display()),
            item,
        };
        if !is_list(&doc) {
            if too_deep(&doc) {
                refused.get_or_insert(deep(String::new()));
                dismantle(doc);
            } else {
                each(index, doc);
            }
            return;
        }
        if let Value::Object(mut m) = doc
            && let Some(Value::Array(items)) = m.remove("items")
        {
            for (i, item) in items.into_iter().enumerate() {
                if too_deep(&item) {
                    refused.get_or_insert(deep(format!("item {} of the list ", i + 1)));
                    dismantle(item);
                } else {
                    each(index, item);
                }
            }
        }
    })?;
    refused.map_or(Ok(()), Err)
}

/// Files named by `paths`, as `kubectl apply -f` reads them: files as
/// given; a directory's `.yaml`, `.yml` and `.json` files in name order, and
/// its sub-directories only when `recursive` (kubectl's `-R`). A rule set's
/// `tests/` sub-directory is thus never read as rules or objects.
pub fn expand_paths(paths: &[PathBuf], recursive: bool) -> Result<Vec<PathBuf>, YamlError> {
    let mut out = Vec::new();
    for p in paths {
        // `-`: standard input, read where the documents are read.
        if p.as_os_str() == "-" {
            out.push(p.clone());
            continue;
        }
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
        let text = read_text(&f)?;
        for_each_document(&f, &text, |index, value| each(&f, index, value))?;
    }
    Ok(())
}

/// The text of a file, or of standard input for `-` (as kubectl's `-f -`).
pub fn read_text(path: &Path) -> Result<String, YamlError> {
    let io = |e| YamlError::Io {
        path: path.display().to_string(),
        source: e,
    };
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(io)?;
        return Ok(text);
    }
    std::fs::read_to_string(path).map_err(io)
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

    /// A flow-style object nesting `levels` levels in all.
    fn object(name: &str, levels: usize) -> String {
        let inner = levels - 1;
        format!(
            "{{\"kind\": \"ConfigMap\", \"metadata\": {{\"name\": \"{name}\"}}, \"data\": {}{{}}{}}}",
            "{\"a\": ".repeat(inner - 1),
            "}".repeat(inner - 1)
        )
    }

    /// What `for_each_document` hands over: (position, name, depth), each
    /// value dropped without recursion (this thread's stack is small).
    fn read(text: &str) -> (Vec<(usize, String, bool)>, Option<String>) {
        let mut got = Vec::new();
        let r = for_each_document(Path::new("deep.yaml"), text, |i, v| {
            let name = v["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            got.push((i, name, too_deep(&v)));
            dismantle(v);
        });
        (got, r.err().map(|e| e.to_string()))
    }

    #[test]
    fn documents_as_deep_as_the_api_server_accepts_are_read_and_deeper_ones_refused_alone() {
        let text = format!(
            "{}\n---\n{}\n---\n{}\n---\n{}\n",
            object("at-limit", MAX_DEPTH),
            object("one-more", MAX_DEPTH + 1),
            object("far-more", MAX_DEPTH + 50),
            object("flat", 3)
        );
        let (got, err) = read(&text);
        assert_eq!(
            got,
            [(1, "at-limit".into(), false), (4, "flat".into(), false)]
        );
        let err = err.expect("an error");
        assert!(
            err.starts_with("deep.yaml#2: nests deeper than 10000 levels"),
            "{err}"
        );
    }

    #[test]
    fn a_list_item_as_deep_as_the_api_server_accepts_is_read_and_a_deeper_one_refused_alone() {
        let text = format!(
            "{{\"kind\": \"List\", \"items\": [{}, {}, {}]}}\n",
            object("at-limit", MAX_DEPTH),
            object("one-more", MAX_DEPTH + 1),
            object("flat", 3)
        );
        let (got, err) = read(&text);
        assert_eq!(
            got,
            [(1, "at-limit".into(), false), (1, "flat".into(), false)]
        );
        let err = err.expect("an error");
        assert!(
            err.starts_with("deep.yaml#1: item 2 of the list nests deeper than 10000"),
            "{err}"
        );
    }

    #[test]
    fn depth_counts_the_objects_own_braces() {
        let mut v = json!({});
        for _ in 1..MAX_DEPTH {
            v = Value::Object(serde_json::Map::from_iter([("a".to_string(), v)]));
        }
        assert!(!too_deep(&v));
        let v = Value::Array(vec![v]);
        assert!(too_deep(&v));
        dismantle(v);
        assert!(!too_deep(&json!("scalar")) && !too_deep(&json!([[]])));
    }

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
