//! Objects as the API server sends them (watch and list items, apply
//! responses), read straight into what the caches keep: the body as
//! one JSON tree without `managedFields`, and what our field manager owns.
//! No typed copy of the metadata and no tree of the other managers'
//! `managedFields` is built on the way (they were most of the transient
//! memory of a list).

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::ApiResource;
use kube::core::DynamicResourceScope;
use serde::de::{
    self, Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use serde_json::value::RawValue;
use serde_json::{Map, Number, Value};

use super::live::{Live, OwnedFields};
use super::plan::FIELD_MANAGER;
use crate::yaml::MAX_DEPTH;

/// One object of an output kind as received. `meta` holds only what the
/// watcher reads (name, namespace, resourceVersion).
#[derive(Clone, Debug)]
pub struct Wire {
    meta: ObjectMeta,
    /// The body, metadata without `managedFields` included.
    body: Map<String, Value>,
    /// Our `Apply` entry of `managedFields`, read while deserializing.
    ours: Option<OwnedFields>,
    /// The object nests deeper than the API server accepts
    /// ([`MAX_DEPTH`]): only its metadata was kept.
    too_deep: bool,
}

impl Wire {
    /// Why the object cannot be kept, naming it; `None` when it can. An
    /// object nested deeper than [`MAX_DEPTH`] is refused alone: the list
    /// or watch it came in goes on (kube's decoder would have failed them).
    pub fn refusal(&self, ar: &ApiResource) -> Option<String> {
        if !self.too_deep {
            return None;
        }
        let name = self.meta.name.as_deref().unwrap_or("(no name)");
        let at = match self.meta.namespace.as_deref() {
            Some(ns) => format!("{ns}/{name}"),
            None => name.to_string(),
        };
        Some(format!(
            "{} {at}: nests deeper than {MAX_DEPTH} levels, the most the API server accepts; the object is ignored",
            ar.kind
        ))
    }

    /// The cached form: apiVersion and kind from discovery (list items
    /// lack them), summarised and packed ([`Live::from_parts`]).
    pub fn into_live(self, ar: &ApiResource) -> Live {
        let mut body = self.body;
        body.insert("apiVersion".into(), Value::String(ar.api_version.clone()));
        body.insert("kind".into(), Value::String(ar.kind.clone()));
        Live::from_parts(Value::Object(body), self.ours)
    }

    /// The object as the engine's store keeps it: apiVersion and kind from
    /// discovery, no `managedFields`.
    pub fn into_value(self, ar: &ApiResource) -> Value {
        let mut body = self.body;
        body.insert("apiVersion".into(), Value::String(ar.api_version.clone()));
        body.insert("kind".into(), Value::String(ar.kind.clone()));
        Value::Object(body)
    }
}

impl Resource for Wire {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

/// An object's metadata as a metadata-only list or watch sends it
/// (`PartialObjectMetadata`), read as [`Wire`] reads objects: kube's
/// `PartialObjectMeta` parses every `managedFields` entry's `fieldsV1`,
/// which for a CRD with a deep schema is as deep as the schema, and past
/// serde_json's limit failed the whole list.
#[derive(Clone, Debug)]
pub struct WireMeta(pub Wire);

impl Resource for WireMeta {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn metadata_api() -> bool {
        true
    }

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        Wire::group(dt)
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        Wire::version(dt)
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        Wire::kind(dt)
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        Wire::api_version(dt)
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        Wire::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.0.meta
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.meta
    }
}

impl<'de> Deserialize<'de> for WireMeta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Wire::deserialize(d).map(WireMeta)
    }
}

impl<'de> Deserialize<'de> for Wire {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(WireVisitor)
    }
}

struct WireVisitor;

thread_local! {
    /// The paths the objects [`Wire`] reads on this thread keep, while
    /// [`keeping`] runs.
    static KEEP: RefCell<Option<Arc<[Vec<String>]>>> = const { RefCell::new(None) };
}

/// Runs `f` (a poll of one kind's watch) with the objects [`Wire`] reads
/// cut to `paths` (paths of object keys) as they are parsed: what no path
/// reaches is skipped, never built, so a list page of large objects (types
/// with their schemas) costs what is kept of it.
pub fn keeping<R>(paths: &Arc<[Vec<String>]>, f: impl FnOnce() -> R) -> R {
    /// Puts back what was set, also when `f` unwinds.
    struct Restore(Option<Arc<[Vec<String>]>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let old = self.0.take();
            KEEP.with(|k| *k.borrow_mut() = old);
        }
    }
    let _restore = Restore(KEEP.with(|k| k.replace(Some(Arc::clone(paths)))));
    f()
}

/// The rest of each path in `paths` that starts with `key`.
fn tails(paths: &[impl AsRef<[String]>], key: &str) -> Vec<Vec<String>> {
    paths
        .iter()
        .map(AsRef::as_ref)
        .filter(|p: &&[String]| p.first().is_some_and(|k| k == key))
        .map(|p| p[1..].to_vec())
        .collect()
}

/// A value of which only `paths` (none empty) are kept, as
/// [`crate::engine::path::keep_fields`] keeps them: `None` when nothing
/// is (a value that is not a map, or a map without any of them).
struct Pick<'a> {
    paths: Vec<Vec<String>>,
    level: usize,
    too_deep: &'a Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for Pick<'_> {
    type Value = Option<Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<Value>, D::Error> {
        if self.level > SHALLOW {
            // Deep down: read whole (without the recursion limit), then cut.
            let whole = Deep::at(self.level, self.too_deep).deserialize(d)?;
            return Ok(match whole {
                Value::Object(_) => {
                    let kept = crate::engine::path::keep_fields(Cow::Owned(whole), &self.paths);
                    kept.as_object()
                        .is_some_and(|m| !m.is_empty())
                        .then_some(kept)
                }
                _ => None,
            });
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Pick<'_> {
    type Value = Option<Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Option<Value>, E> {
        Ok(None)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Option<Value>, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Option<Value>, E> {
        Ok(None)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Option<Value>, E> {
        Ok(None)
    }

    fn visit_str<E>(self, _: &str) -> Result<Option<Value>, E> {
        Ok(None)
    }

    fn visit_none<E>(self) -> Result<Option<Value>, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Option<Value>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<Value>, D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<Value>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Value>, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let below = tails(&self.paths, &key);
            if below.is_empty() {
                map.next_value::<IgnoredAny>()?;
            } else if below.iter().any(|p| p.is_empty()) {
                let value = map.next_value_seed(Deep::at(self.level + 1, self.too_deep))?;
                out.insert(key, value);
            } else {
                let seed = Pick {
                    paths: below,
                    level: self.level + 1,
                    too_deep: self.too_deep,
                };
                if let Some(value) = map.next_value_seed(seed)? {
                    out.insert(key, value);
                }
            }
        }
        Ok((!out.is_empty()).then_some(Value::Object(out)))
    }
}

impl<'de> Visitor<'de> for WireVisitor {
    type Value = Wire;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Wire, A::Error> {
        let keep = KEEP.with(|k| k.borrow().clone());
        let mut body = Map::new();
        let mut ours = None;
        let too_deep = Cell::new(false);
        while let Some(key) = map.next_key::<String>()? {
            if key == "metadata" {
                let meta: Option<Meta> = map.next_value_seed(MetaSeed(&too_deep))?;
                if let Some(meta) = meta {
                    ours = meta.ours;
                    body.insert(key, Value::Object(meta.rest));
                }
            } else {
                // The object's own braces are level 1.
                let below = keep.as_deref().map(|paths| tails(paths, &key));
                match below {
                    // No reader sees it: skipped, never built.
                    Some(below) if below.is_empty() => {
                        map.next_value::<IgnoredAny>()?;
                    }
                    Some(below) if !below.iter().any(|p| p.is_empty()) => {
                        let seed = Pick {
                            paths: below,
                            level: 2,
                            too_deep: &too_deep,
                        };
                        if let Some(value) = map.next_value_seed(seed)? {
                            body.insert(key, value);
                        }
                    }
                    _ => {
                        let value = map.next_value_seed(Deep::at(2, &too_deep))?;
                        body.insert(key, value);
                    }
                }
            }
        }
        let text = |k: &str| {
            body.get("metadata")
                .and_then(|m| m.get(k))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let meta = ObjectMeta {
            name: text("name"),
            namespace: text("namespace"),
            resource_version: text("resourceVersion"),
            ..ObjectMeta::default()
        };
        if too_deep.get() {
            // Refused: only what names it is kept, nothing read half.
            let mut kept = Map::new();
            for k in ["name", "namespace", "uid", "resourceVersion"] {
                if let Some(v) = text(k) {
                    kept.insert(k.to_string(), Value::String(v));
                }
            }
            body = Map::from_iter([("metadata".to_string(), Value::Object(kept))]);
        }
        Ok(Wire {
            meta,
            body,
            ours,
            too_deep: too_deep.get(),
        })
    }
}

/// `metadata`: every field as JSON but `managedFields`, of which only our
/// entry is read.
struct Meta {
    rest: Map<String, Value>,
    ours: Option<OwnedFields>,
}

/// Reads `metadata` (or null), marking `too_deep` as [`Deep`] does.
struct MetaSeed<'a>(&'a Cell<bool>);

impl<'de> DeserializeSeed<'de> for MetaSeed<'_> {
    type Value = Option<Meta>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<Meta>, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for MetaSeed<'_> {
    type Value = Option<Meta>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("object metadata")
    }

    fn visit_none<E: de::Error>(self) -> Result<Option<Meta>, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<Meta>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<Meta>, D::Error> {
        d.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Meta>, A::Error> {
        let mut rest = Map::new();
        let mut ours = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "managedFields" {
                let found: Option<Ours> = map.next_value()?;
                ours = found.and_then(|o| o.0);
            } else {
                let value = map.next_value_seed(Deep::at(3, self.0))?;
                rest.insert(key, value);
            }
        }
        Ok(Some(Meta { rest, ours }))
    }
}

/// `managedFields`, read one entry at a time: our `Apply` entry's fields,
/// the others dropped as soon as read.
struct Ours(Option<OwnedFields>);

impl<'de> Deserialize<'de> for Ours {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(OursVisitor)
    }
}

struct OursVisitor;

/// One `managedFields` entry: other fields are skipped, and `fieldsV1` is
/// read only for our entry (another manager's fields of a deep object are
/// as deep as the object), as [`Deep`] reads values: through the caller's
/// deserializer, so also when serde buffered the object (a watch event
/// whose `object` comes before its `type`; raw text cannot be taken from
/// a buffer), and as text past [`SHALLOW`] levels.
struct Entry {
    manager: Option<String>,
    operation: Option<String>,
    fields: Option<Value>,
    /// `fieldsV1` nests deeper than [`MAX_DEPTH`] (read as null).
    too_deep: bool,
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(EntryVisitor)
    }
}

struct EntryVisitor;

impl<'de> Visitor<'de> for EntryVisitor {
    type Value = Entry;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a managedFields entry")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entry, A::Error> {
        let mut e = Entry {
            manager: None,
            operation: None,
            fields: None,
            too_deep: false,
        };
        // fieldsV1's braces sit at level 5 of the object (object,
        // metadata, managedFields, entry, fieldsV1).
        let too_deep = Cell::new(false);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "manager" => e.manager = map.next_value()?,
                "operation" => e.operation = map.next_value()?,
                // The API server writes `manager` first: another's
                // fields are skipped unread.
                "fieldsV1" if e.manager.as_deref().is_some_and(|m| m != FIELD_MANAGER) => {
                    map.next_value::<IgnoredAny>()?;
                }
                "fieldsV1" => {
                    e.fields = Some(map.next_value_seed(Deep::at(5, &too_deep))?);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        e.too_deep = too_deep.get();
        Ok(e)
    }
}

impl<'de> Visitor<'de> for OursVisitor {
    type Value = Ours;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of managedFields entries")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ours, A::Error> {
        let mut ours = None;
        while let Some(e) = seq.next_element::<Entry>()? {
            if ours.is_none()
                && e.manager.as_deref() == Some(FIELD_MANAGER)
                && e.operation.as_deref() == Some("Apply")
            {
                if e.too_deep {
                    return Err(de::Error::custom(format!(
                        "nests deeper than {MAX_DEPTH} levels, the most the API server accepts"
                    )));
                }
                ours = Some(OwnedFields::from_fields_v1(
                    e.fields.as_ref().unwrap_or(&Value::Null),
                ));
            }
        }
        Ok(Ours(ours))
    }
}

/// Levels read through the caller's deserializer before the rest of a
/// value is taken as text and read by [`read_fresh`]. kube decodes with
/// serde_json, whose recursion limit (128, counted from the watch event or
/// list around the object) refuses a deep object, and in a list every
/// object with it; text is scanned without recursion or limit.
const SHALLOW: usize = 64;

/// Stack left (bytes) below which [`read_fresh`] continues on a new
/// segment, and the size of a segment: a level takes well under 4 KiB
/// even unoptimised.
const RED_ZONE: usize = 128 * 1024;
const SEGMENT: usize = 4 * 1024 * 1024;

/// Reads a value whose maps and lists sit at nesting `level` (the object's
/// own braces are level 1); a map or list deeper than [`MAX_DEPTH`] sets
/// `too_deep` and the value reads as null (what is left of it is skipped).
#[derive(Clone, Copy)]
struct Deep<'a> {
    level: usize,
    /// Read from text by [`read_fresh`] (no recursion limit), not by the
    /// caller's deserializer.
    fresh: bool,
    too_deep: &'a Cell<bool>,
}

impl<'a> Deep<'a> {
    fn at(level: usize, too_deep: &'a Cell<bool>) -> Self {
        Deep {
            level,
            fresh: false,
            too_deep,
        }
    }

    fn inner(self) -> Self {
        Deep {
            level: self.level + 1,
            ..self
        }
    }
}

/// Parses JSON text whose maps and lists sit at nesting `level` without
/// serde_json's recursion limit; past [`MAX_DEPTH`] it sets `too_deep` and
/// reads null. The recursion never overflows the stack: each level checks
/// the stack left and goes on in a new heap segment when it runs low
/// (stacker, the crate rustc uses for the same). This needs no
/// large-stack thread, so kube's decoder can call it from any task.
fn read_fresh(text: &str, level: usize, too_deep: &Cell<bool>) -> Result<Value, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    let read = Deep {
        level,
        fresh: true,
        too_deep,
    }
    .deserialize(&mut de);
    match read {
        Ok(v) => de.end().map(|()| v).map_err(|e| e.to_string()),
        // The depth error stopped the parse: the value is refused.
        Err(_) if too_deep.get() => Ok(Value::Null),
        Err(e) => Err(e.to_string()),
    }
}

impl<'de> DeserializeSeed<'de> for Deep<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        if self.too_deep.get() {
            // Refused already: the rest is skipped, not built.
            return IgnoredAny::deserialize(d).map(|_| Value::Null);
        }
        if self.fresh {
            return stacker::maybe_grow(RED_ZONE, SEGMENT, || d.deserialize_any(self));
        }
        if self.level > SHALLOW {
            let raw = Box::<RawValue>::deserialize(d)?;
            return read_fresh(raw.get(), self.level, self.too_deep).map_err(de::Error::custom);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Deep<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
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

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
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

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.enter()?;
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(v) = seq.next_element_seed(self.inner())? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.enter()?;
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let v = map.next_value_seed(self.inner())?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

impl Deep<'_> {
    /// A map or list at this level: past [`MAX_DEPTH`], the value is
    /// refused and the parse of its text stopped.
    fn enter<E: de::Error>(&self) -> Result<(), E> {
        if self.level > MAX_DEPTH {
            self.too_deep.set(true);
            return Err(E::custom(format!("nests deeper than {MAX_DEPTH} levels")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::OutputKind;
    use crate::controller::apply::api_resource;
    use crate::engine::output::RBAC_API_VERSION;

    #[test]
    fn objects_read_while_keeping_paths_are_those_paths_of_the_whole() {
        let deep = (0..300).fold(json!("bottom"), |v, _| json!({ "d": v }));
        let obj = json!({"apiVersion": "x.io/v1", "kind": "X",
            "metadata": {"name": "a", "managedFields": [{"manager": "m"}]},
            "spec": {"group": "g.io", "names": {"plural": "xs", "kind": "X"},
                "versions": [{"name": "v1", "schema": {"deep": deep}}], "scalar": 3,
                "empty": {}, "claimNames": null},
            "status": {"deep": deep}});
        let text = obj.to_string();
        let cases: [&[&str]; 5] = [
            &["spec.group", "spec.names"],
            &[
                "spec.names.plural",
                "spec.scalar.x",
                "spec.empty.x",
                "missing.y",
            ],
            &["spec", "spec.group"],
            &["spec.claimNames", "status.deep.d.d"],
            &[],
        ];
        for fields in cases {
            let named: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
            let paths: Arc<[Vec<String>]> = crate::engine::path::seen_fields(&named).into();
            let wire: Wire = keeping(&paths, || serde_json::from_str(&text)).expect("reads");
            let mut de = serde_json::Deserializer::from_str(&text);
            de.disable_recursion_limit();
            let whole = Value::deserialize(&mut de).expect("json");
            let mut expected = crate::engine::path::keep_fields(Cow::Owned(whole), &paths);
            expected["metadata"]
                .as_object_mut()
                .map(|m| m.remove("managedFields"));
            assert_eq!(Value::Object(wire.body), expected, "{fields:?}");
        }
        // Unset again: the next object is read whole.
        let wire: Wire = serde_json::from_str(&text).expect("reads");
        assert_eq!(wire.body["status"]["deep"], obj["status"]["deep"]);
        assert_eq!(wire.body["spec"], obj["spec"]);
    }

    #[test]
    fn a_received_object_is_summarised_like_its_json() {
        let json = json!({"apiVersion": RBAC_API_VERSION, "kind": "Role",
            "metadata": {"name": "r", "namespace": "n", "resourceVersion": "7",
              "uid": "u1", "labels": {"a": "1"}, "annotations": {"b": "2"},
              "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace",
                "name": "n", "uid": "o1", "controller": true}],
              "managedFields": [
                {"manager": "kubectl", "operation": "Update",
                  "fieldsV1": {"f:metadata": {"f:labels": {"f:x": {}}}}},
                {"manager": FIELD_MANAGER, "operation": "Apply",
                  "apiVersion": RBAC_API_VERSION, "fieldsType": "FieldsV1",
                  "time": "2026-01-01T00:00:00Z",
                  "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}, "f:rules": {}}}]},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]});
        let ar = api_resource(OutputKind::Role);
        let wire: Wire = serde_json::from_value(json.clone()).expect("object");
        assert_eq!(wire.meta().resource_version.as_deref(), Some("7"));
        assert_eq!(wire.meta().namespace.as_deref(), Some("n"));
        let mut live = wire.into_live(&ar);
        assert!(live.is_packed());
        assert_eq!(live.label("a"), Some("1"));
        assert!(live.unpack());
        assert_eq!(live, Live::new(json));
        assert!(live.object()["metadata"].get("managedFields").is_none());
        let ours = live.ours().expect("ours");
        assert!(ours.top.contains("rules"));
        assert!(ours.labels.contains("a") && !ours.labels.contains("x"));
    }

    #[test]
    fn a_watch_event_whose_object_comes_before_its_type_is_read_whole() {
        // serde buffers the object until it reads the tag: a server that
        // writes keys sorted (the bench's stand-in did) once failed every
        // event of an object we applied, and the change was missed.
        let obj = json!({"apiVersion": RBAC_API_VERSION, "kind": "Role",
            "metadata": {"name": "r", "namespace": "n", "resourceVersion": "7",
              "managedFields": [
                {"fieldsV1": {"f:rules": {}}, "manager": "kubectl", "operation": "Update"},
                {"manager": FIELD_MANAGER, "operation": "Apply",
                  "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}, "f:rules": {}}}]},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]});
        let text = format!(r#"{{"object":{obj},"type":"MODIFIED"}}"#);
        let event: kube::api::WatchEvent<Wire> = serde_json::from_str(&text).expect("event");
        let kube::api::WatchEvent::Modified(wire) = event else {
            panic!("a modification");
        };
        let live = wire.into_live(&api_resource(OutputKind::Role));
        let ours = live.ours().expect("ours");
        assert!(ours.top.contains("rules") && ours.labels.contains("a"));
    }

    #[test]
    fn roles_as_a_real_server_sends_them_share_their_packed_rest() {
        // kube-apiserver v1.32: every object has its own creationTimestamp
        // and uid; siblings of one trigger share labels, annotations and
        // ownerReferences.
        let item = |name: &str, created: &str| {
            json!({"metadata": {"name": name, "namespace": "team-1", "uid": format!("uid-{name}"),
                "resourceVersion": "9", "creationTimestamp": created,
                "labels": {"app.kubernetes.io/managed-by": "rbac-rules"},
                "annotations": {"rbacrules.io/rule": "r", "rbacrules.io/trigger": "Namespace/team-1"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "team-1",
                    "uid": "ns-uid", "controller": true, "blockOwnerDeletion": true}],
                "managedFields": [{"manager": FIELD_MANAGER, "operation": "Apply",
                    "apiVersion": RBAC_API_VERSION, "fieldsType": "FieldsV1",
                    "time": created, "fieldsV1": {"f:rules": {}}}]},
              "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})
        };
        let ar = api_resource(OutputKind::Role);
        let read = |name: &str, created: &str| {
            let wire: Wire = serde_json::from_value(item(name, created)).expect("object");
            wire.into_live(&ar)
        };
        let (a, b) = (
            read("a", "2026-11-26T16:34:51Z"),
            read("b", "2026-11-26T16:34:52Z"),
        );
        assert!(a.is_packed() && b.is_packed());
        let (ra, rb) = (
            a.packed_rest().expect("rest"),
            b.packed_rest().expect("rest"),
        );
        assert!(
            std::sync::Arc::ptr_eq(&ra, &rb),
            "one copy of the siblings' rest"
        );
        for (mut live, name, created) in [
            (a, "a", "2026-11-26T16:34:51Z"),
            (b, "b", "2026-11-26T16:34:52Z"),
        ] {
            assert!(live.unpack());
            let mut want = item(name, created);
            want["metadata"]
                .as_object_mut()
                .expect("metadata")
                .remove("managedFields");
            want["apiVersion"] = json!(RBAC_API_VERSION);
            want["kind"] = json!("Role");
            assert_eq!(live.object(), &want);
        }
    }

    #[test]
    fn a_list_item_gets_its_kind_from_discovery_and_others_own_nothing_of_ours() {
        let item = json!({"metadata": {"name": "c", "resourceVersion": "3",
            "managedFields": [{"manager": "kubectl", "operation": "Apply",
              "fieldsV1": {"f:rules": {}}}]},
            "rules": []});
        let ar = api_resource(OutputKind::ClusterRole);
        let wire: Wire = serde_json::from_value(item).expect("object");
        let live = wire.into_live(&ar);
        assert_eq!(
            live.id().map(ToString::to_string),
            Some(
                crate::controller::live::ObjectId::new(OutputKind::ClusterRole, "", "c")
                    .to_string()
            )
        );
        assert!(live.ours().is_none());
        // Bad input is an error, not a panic.
        assert!(serde_json::from_value::<Wire>(json!([1])).is_err());
        assert!(serde_json::from_value::<Wire>(json!({"metadata": {"managedFields": 3}})).is_err());
    }
}
