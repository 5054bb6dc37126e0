//! Dotted field paths such as `spec.claimNames.kind`,
//! `metadata.labels["example.org/team"]` or `status.objectRefs[0].name`.

use std::borrow::Cow;
use std::fmt;

use serde_json::Value;

use super::ErrorKind;
use super::error::FieldError;

/// One step of a [`FieldPath`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// An object key.
    Key(String),
    /// A list index.
    Index(usize),
}

/// The keys `segments` start with, up to the first index: the object
/// path a projection keeps (an index keeps its whole list). Empty when the
/// first segment is an index.
pub fn leading_keys(segments: &[Segment]) -> Vec<String> {
    segments
        .iter()
        .map_while(|s| match s {
            Segment::Key(k) => Some(k.clone()),
            Segment::Index(_) => None,
        })
        .collect()
}

/// A parsed field path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPath {
    segments: Vec<Segment>,
}

impl FieldPath {
    /// A path of these segments.
    pub fn from_segments(segments: Vec<Segment>) -> FieldPath {
        FieldPath { segments }
    }

    /// Parses `a.b["c.d"][0].e`. Quoted keys take `"` or `'`; an empty
    /// path, an empty segment or an unclosed bracket is an error.
    pub fn parse(text: &str) -> Result<FieldPath, String> {
        // Most paths are keys and dots: split, not walked char by char.
        if !text.contains('[') && !text.is_empty() && text.split('.').all(|k| !k.is_empty()) {
            let segments = text.split('.').map(|k| Segment::Key(k.to_string()));
            return Ok(FieldPath {
                segments: segments.collect(),
            });
        }
        let mut segments = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        let mut i = 0;
        let mut expect_key = true;
        while i < chars.len() {
            match chars[i] {
                '.' => {
                    if expect_key {
                        return Err(format!("empty segment at offset {i} in path {text:?}"));
                    }
                    expect_key = true;
                    i += 1;
                    if i == chars.len() {
                        return Err(format!("path {text:?} ends with '.'"));
                    }
                }
                '[' => {
                    let close = chars[i..]
                        .iter()
                        .position(|c| *c == ']')
                        .map(|p| p + i)
                        .ok_or_else(|| format!("unclosed '[' in path {text:?}"))?;
                    let inner: String = chars[i + 1..close].iter().collect();
                    let inner = inner.trim();
                    let quoted = inner.len() >= 2
                        && ((inner.starts_with('"') && inner.ends_with('"'))
                            || (inner.starts_with('\'') && inner.ends_with('\'')));
                    if quoted {
                        segments.push(Segment::Key(inner[1..inner.len() - 1].to_string()));
                    } else if let Ok(n) = inner.parse::<usize>() {
                        segments.push(Segment::Index(n));
                    } else if !inner.is_empty() {
                        // `[key]` without quotes, as in handlebars paths.
                        segments.push(Segment::Key(inner.to_string()));
                    } else {
                        return Err(format!("empty '[]' in path {text:?}"));
                    }
                    expect_key = false;
                    i = close + 1;
                }
                _ => {
                    if !expect_key {
                        return Err(format!(
                            "expected '.' or '[' at offset {i} in path {text:?}"
                        ));
                    }
                    let start = i;
                    while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                        i += 1;
                    }
                    segments.push(Segment::Key(chars[start..i].iter().collect()));
                    expect_key = false;
                }
            }
        }
        if segments.is_empty() {
            return Err("empty path".to_string());
        }
        Ok(FieldPath { segments })
    }

    /// The steps of the path.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The value at this path, if every step exists.
    pub fn get<'a>(&self, value: &'a Value) -> Option<&'a Value> {
        self.segments.iter().try_fold(value, |v, seg| match seg {
            Segment::Key(k) => v.as_object().and_then(|m| m.get(k)),
            Segment::Index(n) => v.as_array().and_then(|a| a.get(*n)),
        })
    }

    /// [`FieldPath::get`], to change the value in place.
    pub fn get_mut<'a>(&self, value: &'a mut Value) -> Option<&'a mut Value> {
        self.segments.iter().try_fold(value, |v, seg| match seg {
            Segment::Key(k) => v.as_object_mut().and_then(|m| m.get_mut(k)),
            Segment::Index(n) => v.as_array_mut().and_then(|a| a.get_mut(*n)),
        })
    }
}

/// A `fields` entry (of a listField, trigger or object query): a path of
/// object keys (no `[n]`).
pub fn field_keys(text: &str) -> Result<Vec<String>, String> {
    FieldPath::parse(text)?
        .segments
        .into_iter()
        .map(|s| match s {
            Segment::Key(k) => Ok(k),
            Segment::Index(n) => Err(format!(
                "a field is a path of object keys; [{n}] in {text:?} is a list index"
            )),
        })
        .collect()
}

/// The `fields` of the listField at `at` (e.g. `spec.related[0]`), each as
/// its object keys; the first that is not one is an error naming it.
pub fn list_fields(
    at: impl fmt::Display,
    fields: &[String],
) -> Result<Vec<Vec<String>>, FieldError> {
    fields
        .iter()
        .enumerate()
        .map(|(j, text)| {
            field_keys(text).map_err(|e| {
                FieldError::new(
                    ErrorKind::InvalidRule,
                    format!("{at}.listField.fields[{j}]"),
                    e,
                )
            })
        })
        .collect()
}

/// The paths an object query's or trigger's `fields` keep of each object:
/// `apiVersion`, `kind` and `metadata` always, then the named ones.
/// Unparsable paths are left out (compiling the rule reports them).
pub fn seen_fields(fields: &[String]) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = ["apiVersion", "kind", "metadata"]
        .into_iter()
        .map(|k| vec![k.to_string()])
        .collect();
    out.extend(fields.iter().filter_map(|f| field_keys(f).ok()));
    out.sort();
    out.dedup();
    out
}

/// Whether [`keep_fields`]`(v, paths)` is `v` itself: every value of `v`
/// lies at or below one of `paths` (an empty map below a path's start is
/// not kept, so it does not fit).
pub fn fits_fields(v: &Value, paths: &[Vec<String>]) -> bool {
    fn walk(m: &serde_json::Map<String, Value>, paths: &[&[String]]) -> bool {
        m.iter().all(|(k, v)| {
            let below: Vec<&[String]> = paths
                .iter()
                .filter(|p| p.first() == Some(k))
                .map(|p| &p[1..])
                .collect();
            if below.iter().any(|p| p.is_empty()) {
                return true;
            }
            match v {
                Value::Object(inner) if !below.is_empty() && !inner.is_empty() => {
                    walk(inner, &below)
                }
                _ => false,
            }
        })
    }
    match v {
        Value::Object(m) if !paths.is_empty() => {
            let all: Vec<&[String]> = paths.iter().map(Vec::as_slice).collect();
            walk(m, &all)
        }
        _ => true,
    }
}

/// `entry` with only the values at `paths` (from [`list_fields`]), each at
/// its place: a listField's `fields`. No paths: the entry as it is. A path
/// the entry lacks, or that meets a value that is not a map before its
/// end, keeps nothing; a path under another one is in it already. An entry
/// that is not a map is kept whole.
pub fn keep_fields(entry: Cow<'_, Value>, paths: &[Vec<String>]) -> Value {
    let src = match &*entry {
        Value::Object(src) if !paths.is_empty() => src,
        _ => return entry.into_owned(),
    };
    let mut sorted: Vec<&Vec<String>> = paths.iter().collect();
    sorted.sort_by_key(|p| p.len());
    let mut kept: Vec<&[String]> = Vec::new();
    let mut out = serde_json::Map::new();
    'paths: for p in sorted {
        let Some((last, parents)) = p.split_last() else {
            continue;
        };
        if kept.iter().any(|k| p.starts_with(k)) {
            continue;
        }
        let Some(value) = field_value(src, parents, last) else {
            continue;
        };
        let mut to = &mut out;
        for k in parents {
            let next = to
                .entry(k.clone())
                .or_insert_with(|| Value::Object(serde_json::Map::new()));
            let Value::Object(m) = next else {
                // Cannot be: a shorter path ending here was kept whole.
                continue 'paths;
            };
            to = m;
        }
        to.insert(last.clone(), value.clone());
        kept.push(p);
    }
    Value::Object(out)
}

/// The value [`keep_fields`] keeps of `src` at the path `parents` then
/// `last`: there only when each of `parents` is a map.
pub fn field_value<'v>(
    src: &'v serde_json::Map<String, Value>,
    parents: &[String],
    last: &str,
) -> Option<&'v Value> {
    parents
        .iter()
        .try_fold(src, |m, k| m.get(k)?.as_object())
        .and_then(|m| m.get(last))
}

/// Text form of a scalar for comparisons: strings as they are, numbers and
/// booleans as JSON text; `None` for null, lists and maps.
pub fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A field of a rule's spec as expansion reaches it, spelled (by
/// `Display`) only when an error names it: most values expand without one.
#[derive(Clone, Copy)]
pub enum At<'a> {
    /// A field spelled out.
    Field(&'a str),
    /// A field spelled by whoever passed it.
    Of(&'a dyn std::fmt::Display),
    /// `parent[i]`.
    Index(&'a At<'a>, usize),
    /// `parent.key`.
    Key(&'a At<'a>, &'a str),
    /// `parent["key"]`: a map's key as written.
    Quoted(&'a At<'a>, &'a str),
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Field(s) => f.write_str(s),
            At::Of(d) => d.fmt(f),
            At::Index(p, i) => write!(f, "{p}[{i}]"),
            At::Key(p, k) => write!(f, "{p}.{k}"),
            At::Quoted(p, k) => write!(f, "{p}[{k:?}]"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lookup<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
        FieldPath::parse(path).ok().and_then(|p| p.get(value))
    }

    fn keys(texts: &[&str]) -> Vec<Vec<String>> {
        texts.iter().map(|t| field_keys(t).unwrap()).collect()
    }

    #[test]
    fn keep_fields_keeps_only_the_named_values_at_their_places() {
        let entry = json!({"name": "gadgets.example.org", "plural": "gadgets",
            "ownerReferences": [{"uid": "u"}], "labels": {"a": "1", "b": "2"}, "n": 3});
        assert_eq!(
            keep_fields(
                Cow::Borrowed(&entry),
                &keys(&["name", "plural", "labels.b", "missing", "name.deeper"])
            ),
            json!({"name": "gadgets.example.org", "plural": "gadgets", "labels": {"b": "2"}})
        );
        // A path under a kept one adds nothing; order does not matter.
        assert_eq!(
            keep_fields(Cow::Borrowed(&entry), &keys(&["labels.a", "labels"])),
            json!({"labels": {"a": "1", "b": "2"}})
        );
        assert_eq!(
            keep_fields(Cow::Borrowed(&entry), &keys(&["zzz"])),
            json!({})
        );
        // No fields: the whole entry.
        assert_eq!(keep_fields(Cow::Borrowed(&entry), &[]), entry);
        // Not a map: kept whole.
        assert_eq!(
            keep_fields(Cow::Owned(json!("text")), &keys(&["name"])),
            json!("text")
        );
        assert_eq!(
            field_keys(r#"metadata.labels["a.b/c"]"#).unwrap(),
            vec!["metadata", "labels", "a.b/c"]
        );
        assert!(
            field_keys("refs[0].name")
                .unwrap_err()
                .contains("list index")
        );
        assert!(field_keys("").is_err());
    }

    #[test]
    fn parses_and_reads_paths() {
        let v = json!({"metadata": {"labels": {"a.b/c": "x"}}, "list": [{"n": 1}]});
        assert_eq!(lookup(&v, r#"metadata.labels["a.b/c"]"#), Some(&json!("x")));
        assert_eq!(lookup(&v, "metadata.labels['a.b/c']"), Some(&json!("x")));
        assert_eq!(lookup(&v, "metadata.labels.[a.b/c]"), Some(&json!("x")));
        assert_eq!(lookup(&v, "list[0].n"), Some(&json!(1)));
        assert_eq!(lookup(&v, "list[1].n"), None);
        assert_eq!(lookup(&v, "metadata.missing"), None);
    }

    #[test]
    fn rejects_malformed_paths() {
        for bad in ["", ".a", "a..b", "a.", "a[", "a[]", "a[0]b"] {
            assert!(FieldPath::parse(bad).is_err(), "{bad:?} should not parse");
        }
    }
}
