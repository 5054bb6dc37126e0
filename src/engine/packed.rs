//! Objects held as compact JSON text instead of a tree: what the store keeps
//! of a kind that rules read only as triggers.
//!
//! A trigger is read while its rule renders it and at no other time: the
//! engine renders again only the triggers that changed (or whose reads
//! did), from the store's journal of keys. Holding such an object as a
//! `serde_json::Value` costs a B-tree node (about 640 bytes) per map and an
//! allocation per string; a Namespace accepting 18 claim types is about
//! 7.6 KB as a tree, 1.5 KB as JSON text and 0.35 KB as that text
//! compressed (LZ4: its annotations repeat one prefix and one value). At
//! 20,000 Namespaces the trees were the largest part of the controller's
//! memory. Reading one back takes a few microseconds, paid once per render
//! of that trigger.

use std::sync::Arc;

use serde_json::Value;

/// Objects nested deeper than this stay trees: text read back goes
/// through serde_json's recursive reader, which refuses depth past 128.
const DEPTH_MAX: usize = 64;

/// One object as compact JSON text, compressed, with its resourceVersion
/// (what tells two versions apart without reading the text).
#[derive(Debug)]
pub struct Packed {
    /// The text as an LZ4 block, its length prepended.
    text: Box<[u8]>,
    version: Option<Box<str>>,
}

impl Packed {
    /// `obj` packed; `None` when it is nested too deep to be read back by
    /// serde_json (it stays a tree).
    pub fn pack(obj: &Value) -> Option<Packed> {
        if !within_depth(obj, DEPTH_MAX) {
            return None;
        }
        let json = serde_json::to_vec(obj).ok()?;
        let text = lz4_flex::compress_prepend_size(&json).into_boxed_slice();
        let version = resource_version(obj).map(Box::from);
        Some(Packed { text, version })
    }

    /// The object, read back. Text this module wrote within
    /// [`DEPTH_MAX`] always reads back; `None` would mean it did not.
    pub fn unpack(&self) -> Option<Value> {
        let json = lz4_flex::decompress_size_prepended(&self.text).ok()?;
        serde_json::from_slice(&json).ok()
    }

    /// Its `metadata.resourceVersion`, when it has one.
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// Bytes held (the compressed text).
    pub fn bytes(&self) -> usize {
        self.text.len()
    }
}

/// `metadata.resourceVersion` of `obj`, when it has a non-empty one: what
/// tells two versions of an object apart.
fn resource_version(obj: &Value) -> Option<&str> {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .filter(|r| !r.is_empty())
}

/// Whether `v` nests no deeper than `max` arrays and maps. Recursion
/// bounded by `max`.
fn within_depth(v: &Value, max: usize) -> bool {
    match v {
        Value::Array(items) => max > 0 && items.iter().all(|i| within_depth(i, max - 1)),
        Value::Object(m) => max > 0 && m.values().all(|i| within_depth(i, max - 1)),
        _ => true,
    }
}

/// An object as the store holds it: a tree, shared; or packed text.
#[derive(Clone, Debug)]
pub enum Held {
    /// A JSON tree, handed out by reference.
    Tree(Arc<Value>),
    /// Compact text, read back on each read.
    Packed(Arc<Packed>),
}

impl Held {
    /// `obj` held as `pack` says: packed when asked and not too deep.
    pub fn new(obj: Arc<Value>, pack: bool) -> Held {
        if pack && let Some(p) = Packed::pack(&obj) {
            return Held::Packed(Arc::new(p));
        }
        Held::Tree(obj)
    }

    /// The object as a tree: the shared one, or read back afresh.
    pub fn tree(&self) -> Option<Arc<Value>> {
        match self {
            Held::Tree(v) => Some(Arc::clone(v)),
            Held::Packed(p) => p.unpack().map(Arc::new),
        }
    }

    /// The shared tree, when held as one.
    pub fn as_tree(&self) -> Option<&Arc<Value>> {
        match self {
            Held::Tree(v) => Some(v),
            Held::Packed(_) => None,
        }
    }

    /// Whether it is held as text.
    pub fn is_packed(&self) -> bool {
        matches!(self, Held::Packed(_))
    }

    /// Its `metadata.resourceVersion`, when it has one.
    pub fn version(&self) -> Option<&str> {
        match self {
            Held::Tree(v) => resource_version(v),
            Held::Packed(p) => p.version(),
        }
    }

    /// The same allocation as `other` (then certainly the same object).
    pub fn ptr_eq(&self, other: &Held) -> bool {
        match (self, other) {
            (Held::Tree(a), Held::Tree(b)) => Arc::ptr_eq(a, b),
            (Held::Packed(a), Held::Packed(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Held the other way: packed if `pack` (and not too deep), else a
    /// tree. Unchanged when already so.
    pub fn repacked(&self, pack: bool) -> Held {
        match (self, pack) {
            (Held::Tree(v), true) => Held::new(Arc::clone(v), true),
            (Held::Packed(_), false) => match self.tree() {
                Some(v) => Held::Tree(v),
                None => self.clone(),
            },
            _ => self.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_packed_object_reads_back_as_it_was_with_its_version() {
        let obj = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "a", "resourceVersion": "7",
                "annotations": {"x/y": "1", "é": "\"quoted\""}},
            "spec": {"n": 1.5, "list": [true, null, {"k": []}]}});
        let p = Packed::pack(&obj).expect("packed");
        assert_eq!(p.unpack(), Some(obj.clone()));
        assert_eq!(p.version(), Some("7"));
        assert!(p.bytes() < 200);
        // Annotations that repeat a prefix and a value, as a Namespace's
        // accepting claim types do, take a fraction of their text.
        let annotations: serde_json::Map<String, Value> = (0..18)
            .map(|i| {
                (
                    format!("accepts.example.org/type-{i:05}.example.org"),
                    json!("claim-accepted"),
                )
            })
            .collect();
        let ns = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "team-a", "annotations": annotations}});
        let p = Packed::pack(&ns).expect("packed");
        let text = serde_json::to_vec(&ns).expect("json").len();
        assert!(p.bytes() * 3 < text, "{} of {text} bytes", p.bytes());
        assert_eq!(p.unpack(), Some(ns));
        // No version: none told.
        let bare = json!({"metadata": {"name": "b", "resourceVersion": ""}});
        assert_eq!(Packed::pack(&bare).expect("packed").version(), None);
    }

    #[test]
    fn an_object_nested_too_deep_stays_a_tree() {
        let mut deep = json!("leaf");
        for _ in 0..DEPTH_MAX {
            deep = json!({ "a": deep });
        }
        // DEPTH_MAX maps: packed; one more: a tree.
        assert!(Packed::pack(&deep).is_some());
        let deeper = json!([deep]);
        assert!(Packed::pack(&deeper).is_none());
        let held = Held::new(Arc::new(deeper.clone()), true);
        assert!(!held.is_packed());
        assert_eq!(held.tree().as_deref(), Some(&deeper));
    }

    #[test]
    fn held_objects_turn_from_trees_to_text_and_back() {
        let obj = Arc::new(json!({"metadata": {"name": "a", "resourceVersion": "3"}}));
        let tree = Held::new(Arc::clone(&obj), false);
        assert!(tree.as_tree().is_some_and(|t| Arc::ptr_eq(t, &obj)));
        let packed = tree.repacked(true);
        assert!(packed.is_packed() && packed.as_tree().is_none());
        assert_eq!(packed.version(), Some("3"));
        assert_eq!(tree.version(), Some("3"));
        assert!(packed.ptr_eq(&packed.clone()) && !packed.ptr_eq(&tree));
        let back = packed.repacked(false);
        assert_eq!(back.as_tree().map(|t| &**t), Some(&*obj));
        // Already so: the same allocation.
        assert!(packed.repacked(true).ptr_eq(&packed));
        assert!(tree.repacked(false).ptr_eq(&tree));
    }
}
