//! What the controller knows of the RBAC objects it may write: their
//! identity ([`ObjectId`]), the fields it owns ([`OwnedFields`]) and a
//! compact copy of each live object ([`Live`]: digests of its content,
//! shared interned parts, packed bodies unpacked on demand), so that memory
//! follows what is written, not what the API server returns.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::{Map, Value, json};

use crate::api::OutputKind;
use crate::engine::output::{
    RBAC_API_VERSION, adopted_annotation, rule_annotation, trigger_annotation,
};
use crate::engine::store::ObjectKey;
use crate::engine::{Manifest, OutKey};

use crate::engine::output::FIELD_MANAGER;

/// Identity of an RBAC object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId {
    /// Kind. Its order (ClusterRole, Role, ClusterRoleBinding, RoleBinding)
    /// is the write order: roles before the bindings that name them.
    pub kind: OutputKind,
    /// Namespace; empty for cluster-scoped kinds.
    pub namespace: Arc<str>,
    /// Name.
    pub name: Arc<str>,
}

impl ObjectId {
    /// An id. Its text is shared by its clones: the live cache holds each
    /// id twice (the key and the object's own), thousands at once.
    pub fn new(
        kind: OutputKind,
        namespace: impl Into<Arc<str>>,
        name: impl Into<Arc<str>>,
    ) -> Self {
        ObjectId {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The id of an RBAC object's manifest, if it is one.
    pub fn of(obj: &Value) -> Option<ObjectId> {
        if obj.get("apiVersion")?.as_str()? != RBAC_API_VERSION {
            return None;
        }
        let kind = OutputKind::parse(obj.get("kind")?.as_str()?)?;
        let meta = obj.get("metadata")?;
        Some(ObjectId::new(
            kind,
            meta.get("namespace")
                .and_then(Value::as_str)
                .unwrap_or_default(),
            meta.get("name")?.as_str()?,
        ))
    }

    /// Its key in the engine's store: namespace and name.
    pub fn store_key(&self) -> ObjectKey {
        (self.namespace.to_string(), self.name.to_string())
    }

    /// Its key among the engine's outputs: kind, namespace and name.
    pub fn out_key(&self) -> OutKey {
        (self.kind, self.namespace.to_string(), self.name.to_string())
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// The fields our field manager set on a live object, read from its
/// `managedFields` entry: what a server-side apply that leaves a field out
/// would remove.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct OwnedFields {
    /// Label keys.
    pub labels: Keys,
    /// Annotation keys.
    pub annotations: Keys,
    /// uids of ownerReferences.
    pub owner_uids: Uids,
    /// Top-level fields (`rules`, `aggregationRule`, `subjects`, ...).
    pub top: Keys,
}

/// A few uids, sorted: one per ownerReference of an object (a set of
/// one is most of the memory of a `BTreeSet`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Uids(Box<[Box<str>]>);

impl Uids {
    /// Whether `uid` is one of them.
    pub fn contains(&self, uid: &str) -> bool {
        self.0.binary_search_by(|u| (**u).cmp(uid)).is_ok()
    }

    /// Each, in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|u| &**u)
    }
}

impl<S: Into<Box<str>>> FromIterator<S> for Uids {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut all: Vec<Box<str>> = iter.into_iter().map(Into::into).collect();
        all.sort_unstable();
        all.dedup();
        Uids(all.into())
    }
}

/// A set of field names, shared by every object that has the same one
/// (see [`intern`]): thousands of our objects own the same few sets.
pub type Keys = Arc<BTreeSet<String>>;

/// The one shared copy of `keys`. The sets are few (one per shape of
/// output), so the table stays small for the life of the process.
fn intern(keys: BTreeSet<String>) -> Keys {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static TABLE: OnceLock<Mutex<HashSet<Keys>>> = OnceLock::new();
    let table = TABLE.get_or_init(Mutex::default);
    let Ok(mut table) = table.lock() else {
        return Arc::new(keys);
    };
    if let Some(k) = table.get(&keys) {
        return Arc::clone(k);
    }
    let k = Arc::new(keys);
    table.insert(Arc::clone(&k));
    k
}

impl OwnedFields {
    /// Reads our `Apply` entry of `metadata.managedFields`; `None` when there
    /// is none (an object created by someone else, or a test fixture).
    pub fn from_managed_fields(obj: &Value) -> Option<OwnedFields> {
        let entry = obj["metadata"]["managedFields"]
            .as_array()?
            .iter()
            .find(|e| {
                e["manager"].as_str() == Some(FIELD_MANAGER)
                    && e["operation"].as_str() == Some("Apply")
            })?;
        Some(Self::from_fields_v1(&entry["fieldsV1"]))
    }

    /// Like [`OwnedFields::from_managed_fields`], from typed entries (a
    /// watched object's metadata, before it is turned into JSON).
    pub fn from_entries(entries: &[ManagedFieldsEntry]) -> Option<OwnedFields> {
        let entry = entries.iter().find(|e| {
            e.manager.as_deref() == Some(FIELD_MANAGER) && e.operation.as_deref() == Some("Apply")
        })?;
        let fields = entry.fields_v1.as_ref().map(|f| &f.0);
        Some(Self::from_fields_v1(fields.unwrap_or(&Value::Null)))
    }

    /// The fields a `fieldsV1` set names.
    pub(super) fn from_fields_v1(fields: &Value) -> OwnedFields {
        let keys = |v: &Value| -> BTreeSet<String> {
            v.as_object()
                .into_iter()
                .flat_map(|m| m.keys())
                .filter_map(|k| k.strip_prefix("f:").map(str::to_string))
                .collect()
        };
        let owner_uids = fields["f:metadata"]["f:ownerReferences"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.keys())
            .filter_map(|k| k.strip_prefix("k:"))
            .filter_map(|k| serde_json::from_str::<Value>(k).ok())
            .filter_map(|k| k["uid"].as_str().map(str::to_string))
            .collect();
        OwnedFields {
            labels: intern(keys(&fields["f:metadata"]["f:labels"])),
            annotations: intern(keys(&fields["f:metadata"]["f:annotations"])),
            owner_uids,
            top: intern(keys(fields)),
        }
    }
}

/// A digest of one compared part of an object (its normal form, see
/// [`normalize`]): equal digests, equal content.
pub type Digest = [u8; 16];

pub(super) fn digest(v: &Value) -> Digest {
    use sha2::Digest as _;
    let bytes = serde_json::to_vec(v).unwrap_or_default();
    let full = sha2::Sha256::digest(&bytes);
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// The parts of an RBAC object the plan compares besides labels and
/// annotations, as digests: a live object is compared without its body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Content {
    rules: Option<Digest>,
    aggregation_rule: Option<Digest>,
    role_ref: Option<Digest>,
    subjects: Option<Digest>,
    /// One digest per ownerReference.
    owner_refs: Box<[Digest]>,
    /// Labels and annotations, all of them (what tells one version of a
    /// live object from another when the server gives no resourceVersion).
    meta: Digest,
}

impl Content {
    /// The compared parts of a manifest or a live object; absent and empty
    /// are the same (`None`).
    pub fn of(obj: &Value) -> Content {
        let part = |name: &str| {
            let n = field(obj, name);
            (!n.is_null()).then(|| digest(&n))
        };
        let refs: Vec<Value> = obj["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .map(normalize)
            .collect();
        Content {
            rules: part("rules"),
            aggregation_rule: part("aggregationRule"),
            role_ref: part("roleRef"),
            subjects: part("subjects"),
            owner_refs: {
                // Sorted: compared as a set.
                let mut d: Vec<Digest> = refs.iter().map(digest).collect();
                d.sort_unstable();
                d.dedup();
                d.into()
            },
            meta: digest(&json!([
                obj["metadata"]["labels"],
                obj["metadata"]["annotations"]
            ])),
        }
    }
}

/// Labels or annotations of a live object, sorted by key: what the plan,
/// provenance and the Helm check read, kept without the body.
/// Keys and values are shared text ([`share_text`]): thousands of live
/// objects carry the same few keys, and the outputs of one trigger or rule
/// the same values.
type Pairs = Box<[(Arc<str>, Arc<str>)]>;

fn pairs(map: Option<&Map<String, Value>>) -> Pairs {
    // A JSON map iterates in key order: the pairs come sorted.
    map.into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((share_text(k), share_text(v.as_str()?))))
        .collect()
}

fn lookup<'a>(pairs: &'a Pairs, key: &str) -> Option<&'a str> {
    pairs
        .binary_search_by(|(k, _)| (**k).cmp(key))
        .ok()
        .map(|i| &*pairs[i].1)
}

/// A live RBAC object of an output kind, as cached from the watches: what
/// the plan compares (digests, labels and annotations, not the body) and,
/// where something reads it, the body the engine reads. Thousands are held
/// at once, so what equal objects have alike is shared: labels,
/// annotations and owned fields ([`Meta`]), and the packed parts of a body.
#[derive(Clone, Debug, PartialEq)]
pub struct Live {
    /// Its identity, when it is an RBAC object.
    id: Option<ObjectId>,
    /// The body without `managedFields`, shared with the engine's store
    /// (one copy in memory, not one per cache); `None` while packed
    /// ([`Live::pack`]). The world keeps only [`Live::slim`] of it where
    /// policy alone reads it.
    object: Option<Arc<Value>>,
    /// Labels, annotations and what our field manager owns (shared).
    meta: Arc<Meta>,
    /// metadata.uid.
    uid: Option<Box<str>>,
    /// metadata.resourceVersion.
    resource_version: Option<Box<str>>,
    /// metadata.creationTimestamp, when in the API server's form: kept
    /// apart so that the packed rest of equal objects is shared (on a
    /// real server it was the only part of most bodies unique to each).
    created: Option<Stamp>,
    /// The compared parts, as digests.
    content: Content,
    /// The body as JSON while `object` is `None` ([`Live::pack`]).
    packed: Option<Packed>,
    /// The desired copy the last plan found equal to this version.
    equal: EqualTo,
}

/// The plan's memo, kept with the live version it is about: the desired
/// copy the last plan found equal to it. The engine reuses the shared copy
/// of an output it did not re-render, and a live object changes version
/// only when it changed (a new [`Live`], starting empty); so a pass
/// compares only the objects whose desired copy or live version is new,
/// and a resync or a change to one trigger costs a pointer comparison per
/// object. Holding the desired copy keeps its address from being reused.
/// Not part of the object's value (equality ignores it).
#[derive(Debug, Default)]
struct EqualTo(std::sync::Mutex<Equal>);

/// What [`EqualTo`] holds: the desired copy equal to the live version
/// now, and the last one found equal to it. A later plan may find the
/// version no longer equal (the desired copy changed), but what was equal
/// to it stays so: the body's `rules` are given back from it
/// ([`Live::shed_rules`]). The last, not the first: any copy found equal
/// has the same content (by digest), and an evaluation that renders again
/// (a new engine, a slow lane's) makes new copies; held, the first would
/// keep every output of the earlier one alive beside the memo's.
#[derive(Clone, Debug, Default)]
struct Equal {
    now: Option<Manifest>,
    once: Option<Manifest>,
}

impl EqualTo {
    fn get(&self) -> Option<Manifest> {
        self.0.lock().ok().and_then(|m| m.now.clone())
    }

    /// A desired copy once found equal to this version (the last).
    fn once(&self) -> Option<Manifest> {
        self.0.lock().ok().and_then(|m| m.once.clone())
    }

    fn set(&self, desired: Option<&Manifest>) {
        if let Ok(mut m) = self.0.lock() {
            m.now = desired.cloned();
            if desired.is_some() {
                m.once = desired.cloned();
            }
        }
    }
}

impl Clone for EqualTo {
    fn clone(&self) -> Self {
        let equal = self.0.lock().map(|m| m.clone()).unwrap_or_default();
        EqualTo(std::sync::Mutex::new(equal))
    }
}

impl PartialEq for EqualTo {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// What the plan, provenance and the Helm check read of a live object's
/// metadata, shared by every object with equal ones (the outputs of one
/// trigger and shape): one copy per trigger, not per object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Meta {
    /// metadata.labels.
    labels: Pairs,
    /// metadata.annotations.
    annotations: Pairs,
    /// What our field manager owns on it, when known.
    ours: Option<OwnedFields>,
}

/// A packed body: the JSON of what the summary does not hold (shared by
/// equal objects), and of `rules` (shared); `restore` says which fields
/// the summary gives back ([`Live::unpack`]).
#[derive(Clone, Debug, PartialEq)]
struct Packed {
    rest: Arc<[u8]>,
    rules: Option<Arc<[u8]>>,
    restore: u16,
}

/// A timestamp as the API server writes it (`2026-01-02T03:04:05Z`, RFC
/// 3339 in UTC, whole seconds), held as its fourteen digits in one number:
/// no allocation per object, and the summary grows by eight bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp(std::num::NonZeroU64);

impl Stamp {
    /// `text` when it has exactly that form; anything else stays in the
    /// packed body as it is.
    fn of(text: &str) -> Option<Stamp> {
        let bytes = text.as_bytes();
        if bytes.len() != 20 {
            return None;
        }
        let mut digits = 0u64;
        for (i, b) in bytes.iter().enumerate() {
            let sep = match i {
                4 | 7 => Some(b'-'),
                10 => Some(b'T'),
                13 | 16 => Some(b':'),
                19 => Some(b'Z'),
                _ => None,
            };
            match sep {
                Some(c) if *b != c => return None,
                Some(_) => {}
                None if b.is_ascii_digit() => digits = digits * 10 + u64::from(b - b'0'),
                None => return None,
            }
        }
        std::num::NonZeroU64::new(digits).map(Stamp)
    }

    /// The text it was read from.
    fn text(self) -> String {
        let v = self.0.get();
        let part = |div: u64| (v / div) % 100;
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            v / 10_000_000_000,
            part(100_000_000),
            part(1_000_000),
            part(10_000),
            part(100),
            v % 100
        )
    }
}

/// A part of a packed body: a field as it is, or metadata without what
/// the summary holds.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Part<'a> {
    Value(&'a Value),
    Map(BTreeMap<&'a str, &'a Value>),
}

/// Fields of a packed body restored from the summary.
mod restore {
    pub const API_VERSION: u16 = 1;
    pub const KIND: u16 = 2;
    pub const NAME: u16 = 4;
    pub const NAMESPACE: u16 = 8;
    pub const UID: u16 = 16;
    pub const RESOURCE_VERSION: u16 = 32;
    pub const LABELS: u16 = 64;
    pub const ANNOTATIONS: u16 = 128;
    pub const CREATED: u16 = 256;
    /// `rules`, from the desired copy found equal ([`super::Live::shed_rules`]).
    pub const RULES: u16 = 512;
}

/// Values shared by content among those alive: the one copy of a value
/// equal to one already held, else the new one. Entries of dropped copies
/// are swept as the table grows.
struct Table<T: ?Sized> {
    state: std::hash::RandomState,
    map: std::collections::HashMap<u64, Vec<std::sync::Weak<T>>>,
    inserts: usize,
}

type Shared<T> = std::sync::OnceLock<std::sync::Mutex<Table<T>>>;

/// The one shared copy of `value` in `table` (made by `make` if none).
fn share_in<T: ?Sized + std::hash::Hash + Eq, V: std::borrow::Borrow<T>>(
    table: &'static Shared<T>,
    value: V,
    make: impl FnOnce(V) -> Arc<T>,
) -> Arc<T> {
    use std::hash::BuildHasher;
    let table = table.get_or_init(|| {
        std::sync::Mutex::new(Table {
            state: std::hash::RandomState::new(),
            map: std::collections::HashMap::new(),
            inserts: 0,
        })
    });
    let Ok(mut guard) = table.lock() else {
        return make(value);
    };
    let Table {
        state,
        map,
        inserts,
    } = &mut *guard;
    let hash = state.hash_one(value.borrow());
    let bucket = map.entry(hash).or_default();
    bucket.retain(|w| w.strong_count() > 0);
    if let Some(found) = bucket
        .iter()
        .filter_map(std::sync::Weak::upgrade)
        .find(|b| **b == *value.borrow())
    {
        return found;
    }
    let shared = make(value);
    bucket.push(Arc::downgrade(&shared));
    *inserts += 1;
    if *inserts >= map.len().max(1024) {
        *inserts = 0;
        map.retain(|_, b| {
            b.retain(|w| w.strong_count() > 0);
            !b.is_empty()
        });
    }
    shared
}

/// The one shared copy of `bytes` among those alive.
fn share(bytes: Vec<u8>) -> Arc<[u8]> {
    static TABLE: Shared<[u8]> = Shared::new();
    share_in(&TABLE, bytes, Arc::from)
}

/// The one shared copy of a label's or annotation's key or value among
/// those alive.
fn share_text(text: &str) -> Arc<str> {
    static TABLE: Shared<str> = Shared::new();
    share_in(&TABLE, text, Arc::from)
}

/// The one shared copy of `meta` among those alive.
fn share_meta(meta: Meta) -> Arc<Meta> {
    static TABLE: Shared<Meta> = Shared::new();
    share_in(&TABLE, meta, Arc::new)
}

/// What [`Live::slim`] keeps: top-level fields (apiVersion and kind
/// first), and metadata fields.
const SLIM_TOP: [&str; 6] = [
    "apiVersion",
    "kind",
    "rules",
    "aggregationRule",
    "roleRef",
    "subjects",
];
/// What [`Live::slim`] keeps at the top of an aggregated ClusterRole: not
/// its `rules`, which the API server fills from the roles it selects.
const SLIM_TOP_AGGREGATED: [&str; 3] = ["apiVersion", "kind", "aggregationRule"];
const SLIM_META: [&str; 5] = [
    "name",
    "namespace",
    "resourceVersion",
    "labels",
    "annotations",
];

/// JSON null, what [`Live::object`] shows of a packed body.
static NULL: Value = Value::Null;

impl Live {
    /// Summarises a live object: extracts what we own, then strips
    /// `managedFields` (they are large and nothing else reads them). The
    /// body stays whole.
    pub fn new(mut object: Value) -> Live {
        let ours = OwnedFields::from_managed_fields(&object);
        if let Some(m) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        Live::summarise(object, ours)
    }

    /// A received body (without `managedFields`) and what we own of it,
    /// summarised and packed at once (in the watch task, before an event
    /// is queued): the world unpacks it where a rule reads the kind.
    pub(super) fn from_parts(object: Value, ours: Option<OwnedFields>) -> Live {
        let mut live = Live::summarise(object, ours);
        live.pack();
        live
    }

    fn summarise(object: Value, ours: Option<OwnedFields>) -> Live {
        let meta = &object["metadata"];
        let content = Content::of(&object);
        Live {
            id: ObjectId::of(&object),
            uid: meta["uid"].as_str().map(Box::from),
            resource_version: meta["resourceVersion"].as_str().map(Box::from),
            created: meta["creationTimestamp"].as_str().and_then(Stamp::of),
            meta: share_meta(Meta {
                labels: pairs(meta["labels"].as_object()),
                annotations: pairs(meta["annotations"].as_object()),
                ours,
            }),
            content,
            object: Some(Arc::new(object)),
            packed: None,
            equal: EqualTo::default(),
        }
    }

    /// Its identity, when it is an RBAC object.
    pub fn id(&self) -> Option<&ObjectId> {
        self.id.as_ref()
    }

    /// The body (whole or slim); JSON null while packed.
    pub fn object(&self) -> &Value {
        self.object.as_deref().unwrap_or(&NULL)
    }

    /// The shared body, unless packed: what the engine's store holds.
    pub fn shared(&self) -> Option<&Arc<Value>> {
        self.object.as_ref()
    }

    /// Keeps of the body only what the plan and the engine's policy read
    /// of an object no rule reads: apiVersion, kind, name, namespace,
    /// resourceVersion, labels, annotations, and the RBAC fields (`rules`,
    /// `aggregationRule`, `roleRef`, `subjects`). uid and the compared
    /// parts stay in the summary. Idempotent; nothing while packed.
    ///
    /// An aggregated ClusterRole keeps no `rules`: the API server fills
    /// them from the roles it selects, policy judges those roles (never
    /// these rules), and the plan compares them by the summary's digest.
    /// They are the largest bodies the controller writes: the aggregate
    /// of every type's rules.
    pub fn slim(&mut self) {
        let aggregated = self
            .object
            .as_deref()
            .is_some_and(|o| o.get("aggregationRule").is_some());
        if aggregated {
            self.keep(&SLIM_TOP_AGGREGATED, &SLIM_META);
        } else {
            self.keep(&SLIM_TOP, &SLIM_META);
        }
    }

    /// Keeps the body as JSON bytes only (a fraction of its size as a
    /// tree): the plan reads the summary, and nothing else reads the body
    /// while a desired copy stands for the object. What the summary holds
    /// (apiVersion, kind, name, namespace, uid, resourceVersion, labels,
    /// annotations) is left out, so the rest is shared by equal objects;
    /// the `rules` are packed apart and shared by every packed object with
    /// the same list (namespace Roles copy the same ClusterRoles).
    /// Idempotent.
    pub fn pack(&mut self) {
        use restore::*;
        let Some(map) = self.object.as_deref().and_then(Value::as_object) else {
            return;
        };
        let mut restore = 0;
        // Only what the summary gives back exactly is left out.
        let texts = |v: &Value| {
            v.as_object()
                .is_some_and(|m| m.values().all(Value::is_string))
        };
        let mut meta: Option<BTreeMap<&str, &Value>> = None;
        if let Some(m) = map.get("metadata").and_then(Value::as_object) {
            let mut rest = BTreeMap::new();
            for (k, v) in m {
                let bit = match (k.as_str(), &self.id) {
                    ("name", Some(id)) if v.as_str() == Some(&*id.name) => NAME,
                    ("namespace", Some(id))
                        if !id.namespace.is_empty() && v.as_str() == Some(&id.namespace) =>
                    {
                        NAMESPACE
                    }
                    ("uid", _) if v.as_str().is_some() && v.as_str() == self.uid() => UID,
                    ("resourceVersion", _)
                        if v.as_str().is_some() && v.as_str() == self.resource_version() =>
                    {
                        RESOURCE_VERSION
                    }
                    ("creationTimestamp", _)
                        if v.as_str().and_then(Stamp::of).is_some()
                            && v.as_str().and_then(Stamp::of) == self.created =>
                    {
                        CREATED
                    }
                    ("labels", _) if texts(v) => LABELS,
                    ("annotations", _) if texts(v) => ANNOTATIONS,
                    _ => 0,
                };
                if bit == 0 {
                    rest.insert(k.as_str(), v);
                }
                restore |= bit;
            }
            meta = Some(rest);
        }
        let mut rest: BTreeMap<&str, Part<'_>> = BTreeMap::new();
        for (k, v) in map {
            match k.as_str() {
                "rules" => {}
                "metadata" if meta.is_some() => {}
                "apiVersion" | "kind" if self.id.is_some() => {
                    // ObjectId::of read both from the body.
                    restore |= if k == "kind" { KIND } else { API_VERSION };
                }
                _ => {
                    rest.insert(k.as_str(), Part::Value(v));
                }
            }
        }
        if let Some(m) = meta {
            rest.insert("metadata", Part::Map(m));
        }
        let Ok(rest) = serde_json::to_vec(&rest) else {
            return;
        };
        let rules = match map.get("rules").map(serde_json::to_vec) {
            None => None,
            Some(Ok(bytes)) => Some(share(bytes)),
            Some(Err(_)) => return,
        };
        self.packed = Some(Packed {
            rest: share(rest),
            rules,
            restore,
        });
        self.object = None;
    }

    /// Brings back the body [`Live::pack`] kept as JSON; whether it was
    /// packed.
    pub fn unpack(&mut self) -> bool {
        let Some(packed) = self.packed.take() else {
            return false;
        };
        match self.unpacked(&packed) {
            Ok(v) => {
                self.object = Some(Arc::new(v));
                true
            }
            Err(e) => {
                // Bytes this process wrote: cannot happen; keep them.
                tracing::warn!(error = %e, "cannot unpack a cached object");
                self.packed = Some(packed);
                false
            }
        }
    }

    /// The body `packed` and the summary stand for.
    fn unpacked(&self, packed: &Packed) -> Result<Value, serde_json::Error> {
        use restore::*;
        let mut v: Value = serde_json::from_slice(&packed.rest)?;
        let Some(map) = v.as_object_mut() else {
            return Ok(v);
        };
        let has = |bit: u16| packed.restore & bit != 0;
        if let Some(rules) = &packed.rules {
            map.insert("rules".into(), serde_json::from_slice(rules)?);
        } else if has(RULES) {
            // Shed while a desired copy was found equal: its rules are
            // these (compared by digest).
            let Some(equal) = self.equal.once() else {
                return Err(serde::de::Error::custom(
                    "shed rules without a desired copy",
                ));
            };
            if let Some(rules) = equal.to_value().get_mut("rules").map(Value::take) {
                map.insert("rules".into(), rules);
            }
        }
        let text = |s: &str| Value::String(s.to_string());
        let object = |pairs: &Pairs| {
            Value::Object(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), text(v)))
                    .collect(),
            )
        };
        if let Some(id) = &self.id {
            if has(API_VERSION) {
                map.insert("apiVersion".into(), text(RBAC_API_VERSION));
            }
            if has(KIND) {
                map.insert("kind".into(), text(id.kind.as_str()));
            }
        }
        if let Some(Value::Object(m)) = map.get_mut("metadata") {
            let fields = [
                (NAME, "name", self.id.as_ref().map(|id| text(&id.name))),
                (
                    NAMESPACE,
                    "namespace",
                    self.id.as_ref().map(|id| text(&id.namespace)),
                ),
                (UID, "uid", self.uid().map(text)),
                (
                    RESOURCE_VERSION,
                    "resourceVersion",
                    self.resource_version().map(text),
                ),
                (
                    CREATED,
                    "creationTimestamp",
                    self.created.map(|s| text(&s.text())),
                ),
                (LABELS, "labels", Some(object(&self.meta.labels))),
                (
                    ANNOTATIONS,
                    "annotations",
                    Some(object(&self.meta.annotations)),
                ),
            ];
            for (bit, key, value) in fields {
                if let (true, Some(value)) = (has(bit), value) {
                    m.insert(key.into(), value);
                }
            }
        }
        Ok(v)
    }

    /// The shared bytes of a packed body's rest (tests: what is shared).
    #[cfg(test)]
    pub(super) fn packed_rest(&self) -> Option<Arc<[u8]>> {
        self.packed.as_ref().map(|p| Arc::clone(&p.rest))
    }

    /// Drops the packed body's `rules` once a plan found a desired copy
    /// equal to this version: that copy has the same rules, and holds
    /// them anyway (the namespace Roles' lists, each namespace's own, were
    /// most of the live cache). [`Live::unpack`] takes them from it.
    /// Whether anything was dropped.
    pub fn shed_rules(&mut self) -> bool {
        if self.packed.as_ref().is_none_or(|p| p.rules.is_none()) {
            return false;
        }
        match self.equal.once() {
            Some(equal) => self.shed_rules_as(&equal.to_value()),
            None => false,
        }
    }

    /// [`Live::shed_rules`], given the JSON of the desired copy once found
    /// equal to this version.
    fn shed_rules_as(&mut self, equal: &Value) -> bool {
        let Some(packed) = self.packed.as_mut() else {
            return false;
        };
        if packed.rules.is_none() {
            return false;
        }
        // Only where the copy has these rules: an aggregated ClusterRole's
        // desired copy has none (the API server fills them).
        let rules = field(equal, "rules");
        if rules.is_null() || self.content.rules != Some(digest(&rules)) {
            return false;
        }
        packed.rules = None;
        packed.restore |= restore::RULES;
        true
    }

    /// Judges an apply's response against the manifest sent, as the next
    /// plan would: when equal, that is remembered and the body's `rules`
    /// are shed at once. A write pass of thousands of objects then never
    /// holds each rule list twice (in the response and in the desired
    /// copy) until the plan after it.
    /// `body` is what was sent for `object` (with the marks a plan adds).
    pub fn settle(&mut self, object: &Manifest, body: &Value) {
        // One JSON copy of what was sent serves the comparison and the
        // shedding: a response is fresh, so the copy sent is the first
        // found equal to it (the one its rules are given back from).
        if differences(body, self).is_empty() {
            self.equal.set(Some(object));
            self.shed_rules_as(body);
        }
    }

    /// Whether the last plan found this version equal to `desired`, the
    /// very copy (a pointer comparison: nothing is compared again).
    pub fn is_known_equal(&self, desired: &Manifest) -> bool {
        self.equal
            .get()
            .is_some_and(|e| Manifest::ptr_eq(&e, desired))
    }

    /// Remembers the desired copy a plan found equal to this version, or
    /// forgets it (`None`) when the plan found a difference.
    pub fn set_known_equal(&self, desired: Option<&Manifest>) {
        self.equal.set(desired);
    }

    /// The desired copy the body's shed `rules` are given back from.
    #[cfg(test)]
    pub(super) fn once_equal(&self) -> Option<Manifest> {
        self.equal.once()
    }

    /// Remembers `desired` as equal to this version, as a plan does.
    #[cfg(test)]
    pub(super) fn found_equal(&self, desired: &Manifest) {
        self.equal.set(Some(desired));
    }

    /// The desired copy the last plan found equal to this version.
    #[cfg(test)]
    pub(super) fn known_equal(&self) -> Option<Manifest> {
        self.equal.get()
    }

    /// Whether the packed body's `rules` were shed.
    #[cfg(test)]
    pub(super) fn rules_shed(&self) -> bool {
        self.packed.as_ref().is_some_and(|p| p.rules.is_none())
    }

    /// Whether the body (unpacked) may be only what [`Live::slim`] keeps:
    /// a slim body has no uid (the summary holds it), and every body the
    /// API server serves has one. No flag: the cache holds thousands.
    pub fn is_slim(&self) -> bool {
        self.object
            .as_deref()
            .is_some_and(|o| o["metadata"].get("uid").is_none())
    }

    /// Whether the body is packed.
    pub fn is_packed(&self) -> bool {
        self.packed.is_some()
    }

    /// Keeps the top-level fields `top` (besides metadata) and the metadata
    /// fields `meta`; whether anything was dropped. Only what is kept is
    /// copied (the body may be shared with the engine's store).
    fn keep(&mut self, top: &[&str], meta: &[&str]) -> bool {
        let Some(object) = self.object.as_mut() else {
            return false;
        };
        let Some(map) = object.as_object() else {
            return false;
        };
        let old_meta = map.get("metadata").and_then(Value::as_object);
        let extra = map
            .keys()
            .any(|k| k != "metadata" && !top.contains(&k.as_str()))
            || old_meta.is_some_and(|m| m.keys().any(|k| !meta.contains(&k.as_str())));
        if !extra {
            return false;
        }
        // Ours alone (a fresh event): trimmed in place.
        if let Some(Value::Object(map)) = Arc::get_mut(object) {
            map.retain(|k, _| k == "metadata" || top.contains(&k.as_str()));
            if let Some(Value::Object(m)) = map.get_mut("metadata") {
                m.retain(|k, _| meta.contains(&k.as_str()));
            }
            return true;
        }
        let Some(map) = object.as_object() else {
            return false;
        };
        let old_meta = map.get("metadata").and_then(Value::as_object);
        let mut out: Map<String, Value> = map
            .iter()
            .filter(|(k, _)| top.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(m) = old_meta {
            let m: Map<String, Value> = m
                .iter()
                .filter(|(k, _)| meta.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            out.insert("metadata".into(), Value::Object(m));
        }
        *object = Arc::new(Value::Object(out));
        true
    }

    /// Whether `other` is the same version of the object: the same uid,
    /// resourceVersion and compared content.
    pub fn same_version(&self, other: &Live) -> bool {
        self.resource_version.is_some()
            && self.resource_version == other.resource_version
            && self.uid == other.uid
            && self.content == other.content
    }

    /// Whether it carries our managed-by label (a claim anyone who may
    /// write the object can make; see [`Live::is_ours`]).
    pub fn is_managed(&self) -> bool {
        self.label(crate::engine::output::MANAGED_BY_LABEL)
            == Some(crate::engine::output::MANAGED_BY_VALUE)
    }

    /// Whether our inventory made it: it carries our label and its
    /// `managedFields` an `Apply` entry of our field manager (every write
    /// of ours is one). An object someone else labelled ours has no such
    /// entry, unless its writer applied it under our manager's name (the
    /// admission fence's `rbac-rules-inventory` policy refuses that label
    /// to everyone but the controller).
    pub fn is_ours(&self) -> bool {
        self.is_managed() && self.ours().is_some()
    }

    /// A label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        lookup(&self.meta.labels, key)
    }

    /// An annotation's value.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        lookup(&self.meta.annotations, key)
    }

    /// The rule annotation (provenance), if present.
    pub fn rule(&self) -> Option<&str> {
        self.annotation(&rule_annotation())
    }

    /// The trigger annotation, if present.
    pub fn trigger(&self) -> Option<&str> {
        self.annotation(&trigger_annotation())
    }

    /// Whether the controller adopted it: it existed before
    /// ([`adopted_annotation`]).
    pub fn is_adopted(&self) -> bool {
        self.annotation(&adopted_annotation()).is_some()
    }

    /// What our field manager owns on it, when known.
    pub fn ours(&self) -> Option<&OwnedFields> {
        self.meta.ours.as_ref()
    }

    /// metadata.uid.
    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    /// metadata.resourceVersion.
    pub fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }
}

pub use crate::engine::output::is_managed;

/// Whether an object as the API server returns it (with its
/// `managedFields`) is ours: labelled, and with an `Apply` entry of our
/// field manager (see [`Live::is_ours`]).
pub fn is_ours(obj: &Value) -> bool {
    crate::engine::output::provenance(obj) == crate::engine::output::Provenance::Proven
}

/// Drops what the API server treats as absent: null, empty lists, empty
/// maps and empty strings in maps (`apiGroup: ""` of a ServiceAccount
/// subject is omitted on the way back). List items are kept as they are:
/// `apiGroups: [""]` means the core group.
pub fn normalize(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, x) in m {
                let n = normalize(x);
                if !is_empty(&n) {
                    out.insert(k.clone(), n);
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

fn field(obj: &Value, name: &str) -> Value {
    let n = normalize(obj.get(name).unwrap_or(&Value::Null));
    if is_empty(&n) { Value::Null } else { n }
}

/// What the plan reads of a desired manifest: its kind, labels,
/// annotations and compared parts. The one place that reads the desired
/// side's representation (besides sending it).
pub struct Wanted<'a> {
    kind: Option<OutputKind>,
    labels: Option<&'a Map<String, Value>>,
    annotations: Option<&'a Map<String, Value>>,
    content: Content,
    /// The uids of the ownerReferences (read on the desired side only: the
    /// digests of the references tell one live version from another).
    owner_uids: Vec<&'a str>,
}

impl<'a> Wanted<'a> {
    /// What `desired` asks for.
    pub fn of(desired: &'a Value) -> Wanted<'a> {
        let meta = &desired["metadata"];
        Wanted {
            kind: desired["kind"].as_str().and_then(OutputKind::parse),
            labels: meta["labels"].as_object(),
            annotations: meta["annotations"].as_object(),
            content: Content::of(desired),
            owner_uids: meta["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["uid"].as_str())
                .collect(),
        }
    }
}

/// Which parts of a live object differ from the desired manifest, by name
/// (`labels`, `annotations`, `ownerReferences`, `rules`, `aggregationRule`,
/// `roleRef`, `subjects`). Empty: nothing to write.
///
/// Only what we set counts: labels and annotations others added are
/// ignored, while ones we set earlier but no longer want count (an apply
/// would remove them). Server-added metadata (uid, resourceVersion,
/// managedFields, ...) is ignored. An aggregated ClusterRole's `rules` belong
/// to the aggregation controller and are never compared. The live side is
/// compared by digest.
pub fn differences(desired: &Value, live: &Live) -> Vec<&'static str> {
    differences_of(&Wanted::of(desired), live)
}

fn differences_of(want: &Wanted<'_>, live: &Live) -> Vec<&'static str> {
    let mut out = Vec::new();
    for (name, wanted, have, owned) in [
        (
            "labels",
            want.labels,
            &live.meta.labels,
            live.ours().map(|o| &o.labels),
        ),
        (
            "annotations",
            want.annotations,
            &live.meta.annotations,
            live.ours().map(|o| &o.annotations),
        ),
    ] {
        let missing = wanted
            .into_iter()
            .flatten()
            .any(|(k, v)| v.as_str().is_none_or(|v| lookup(have, k) != Some(v)));
        let stale = owned
            .into_iter()
            .flat_map(|o| o.iter())
            .any(|k| !wanted.is_some_and(|w| w.contains_key(k)));
        if missing || stale {
            out.push(name);
        }
    }
    let (w, l) = (&want.content, &live.content);
    let missing_owner = w.owner_refs.iter().any(|r| !l.owner_refs.contains(r));
    let stale_owner = live
        .ours()
        .is_some_and(|o| o.owner_uids.iter().any(|u| !want.owner_uids.contains(&u)));
    if missing_owner || stale_owner {
        out.push("ownerReferences");
    }
    let owns = |f: &str| live.ours().is_none_or(|o| o.top.contains(f));
    match want.kind {
        Some(k) if k.is_role() => {
            if w.aggregation_rule.is_none() {
                // Someone else's aggregationRule survives our apply: only
                // one we set counts.
                if l.aggregation_rule.is_some() && owns("aggregationRule") {
                    out.push("aggregationRule");
                }
                if w.rules != l.rules {
                    out.push("rules");
                }
            } else if w.aggregation_rule != l.aggregation_rule {
                out.push("aggregationRule");
            }
        }
        Some(_) => {
            if w.role_ref != l.role_ref {
                out.push("roleRef");
            }
            if w.subjects != l.subjects {
                out.push("subjects");
            }
        }
        None => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::output::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};
    use serde_json::json;

    fn live(v: Value) -> Live {
        Live::new(v)
    }

    fn role(rules: Value) -> Value {
        json!({
            "apiVersion": RBAC_API_VERSION, "kind": "ClusterRole",
            "metadata": {"name": "r", "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
            "rules": rules,
        })
    }

    #[test]
    fn absent_and_empty_lists_are_equal() {
        let desired = json!({
            "apiVersion": RBAC_API_VERSION, "kind": "RoleBinding",
            "metadata": {"name": "b", "namespace": "n"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "x"},
            "subjects": [{"kind": "ServiceAccount", "name": "sa", "apiGroup": ""}],
        });
        // The server drops the empty apiGroup and adds metadata.
        let l = live(json!({
            "apiVersion": RBAC_API_VERSION, "kind": "RoleBinding",
            "metadata": {"name": "b", "namespace": "n", "uid": "u", "resourceVersion": "7",
                         "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "x"},
            "subjects": [{"kind": "ServiceAccount", "name": "sa"}],
        }));
        assert!(differences(&desired, &l).is_empty());

        let no_rules = json!({"apiVersion": RBAC_API_VERSION, "kind": "ClusterRole", "metadata": {"name": "r"}});
        assert!(differences(&no_rules, &live(role(json!([])))).is_empty());
        assert!(differences(&no_rules, &live(role(Value::Null))).is_empty());
        assert_eq!(
            differences(
                &no_rules,
                &live(role(
                    json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}])
                ))
            ),
            vec!["rules"]
        );
    }

    #[test]
    fn policy_rule_empty_fields_and_order() {
        let desired =
            role(json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]));
        let same = role(
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"], "resourceNames": []}]),
        );
        assert!(differences(&desired, &live(same)).is_empty());
        // Verb order is content for an atomic list: an apply would rewrite it.
        let reordered =
            role(json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "get"]}]));
        assert_eq!(differences(&desired, &live(reordered)), vec!["rules"]);
        // The core group "" is a value, not an empty field.
        let other_group =
            role(json!([{"apiGroups": ["apps"], "resources": ["pods"], "verbs": ["get", "list"]}]));
        assert_eq!(differences(&desired, &live(other_group)), vec!["rules"]);
    }

    #[test]
    fn aggregated_roles_ignore_rules_filled_by_the_aggregator() {
        let agg = json!({"clusterRoleSelectors": [{"matchLabels": {"a": "b"}}]});
        let desired = json!({
            "apiVersion": RBAC_API_VERSION, "kind": "ClusterRole",
            "metadata": {"name": "r"}, "aggregationRule": agg,
        });
        let mut l = role(json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]));
        l["aggregationRule"] = agg.clone();
        assert!(differences(&desired, &live(l.clone())).is_empty());
        l["aggregationRule"] = json!({"clusterRoleSelectors": [{"matchLabels": {"a": "c"}}]});
        assert_eq!(differences(&desired, &live(l)), vec!["aggregationRule"]);
    }

    #[test]
    fn only_labels_we_own_count() {
        let desired = json!({
            "apiVersion": RBAC_API_VERSION, "kind": "ClusterRole",
            "metadata": {"name": "r", "labels": {"a": "1"}},
        });
        let mut l = json!({
            "apiVersion": RBAC_API_VERSION, "kind": "ClusterRole",
            "metadata": {"name": "r", "labels": {"a": "1", "other": "x"},
              "managedFields": [{"manager": FIELD_MANAGER, "operation": "Apply",
                "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}}},
                {"manager": "kubectl", "operation": "Update",
                "fieldsV1": {"f:metadata": {"f:labels": {"f:other": {}}}}}]},
        });
        // Someone else's label: no write (an apply would not remove it).
        assert!(differences(&desired, &live(l.clone())).is_empty());
        // A label we set earlier and no longer want: write.
        l["metadata"]["labels"]["gone"] = json!("1");
        l["metadata"]["managedFields"][0]["fieldsV1"]["f:metadata"]["f:labels"]["f:gone"] =
            json!({});
        assert_eq!(differences(&desired, &live(l.clone())), vec!["labels"]);
        // A changed value of ours: write.
        let mut edited = desired.clone();
        edited["metadata"]["labels"]["a"] = json!("2");
        assert_eq!(differences(&edited, &live(l)), vec!["labels"]);
        // Live::new keeps the summary but strips managedFields.
        let l = live(json!({"metadata": {"managedFields": []}}));
        assert!(l.object()["metadata"].get("managedFields").is_none());
    }

    #[test]
    fn live_objects_compare_by_digest_of_their_normal_form() {
        let desired = role(json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]));
        // The server's copy: other metadata, an empty field dropped.
        let mut served = desired.clone();
        served["metadata"]["uid"] = json!("u");
        served["metadata"]["resourceVersion"] = json!("3");
        served["rules"][0]["resourceNames"] = json!([]);
        let l = live(served.clone());
        assert_eq!(l.content, Content::of(&desired));
        assert!(differences(&desired, &l).is_empty());
        // One verb more: another digest, a write.
        served["rules"][0]["verbs"] = json!(["get", "list"]);
        let l = live(served.clone());
        assert_ne!(l.content, Content::of(&desired));
        assert_eq!(differences(&desired, &l), vec!["rules"]);
        // The digest, not the body, decides: a slim copy compares the same.
        let mut slim = live(served);
        slim.slim();
        assert_eq!(differences(&desired, &slim), vec!["rules"]);
        assert_eq!(slim.uid(), Some("u"));
        assert!(slim.object()["metadata"].get("uid").is_none());
    }

    #[test]
    fn slimming_keeps_what_policy_reads_and_is_idempotent() {
        let mut l = live(json!({
            "apiVersion": RBAC_API_VERSION, "kind": "RoleBinding",
            "metadata": {"name": "b", "namespace": "n", "uid": "u", "resourceVersion": "4",
                "generation": 1, "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                "annotations": {"rbacrules.io/rule": "r", "rbacrules.io/trigger": "T/a"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "n", "uid": "x"}]},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "x"},
            "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "n"}],
        }));
        let summary = (l.uid.clone(), l.content.clone());
        l.slim();
        let once = l.shared().cloned().expect("a body");
        assert_eq!(
            *once,
            json!({
                "apiVersion": RBAC_API_VERSION, "kind": "RoleBinding",
                "metadata": {"name": "b", "namespace": "n", "resourceVersion": "4",
                    "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                    "annotations": {"rbacrules.io/rule": "r", "rbacrules.io/trigger": "T/a"}},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "x"},
                "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "n"}],
            })
        );
        assert_eq!((l.uid.clone(), l.content.clone()), summary);
        assert_eq!((l.rule(), l.trigger()), (Some("r"), Some("T/a")));
        l.slim();
        assert!(
            Arc::ptr_eq(&once, l.shared().expect("a body")),
            "a slim copy is kept as it is"
        );
    }

    #[test]
    fn an_aggregated_cluster_role_is_kept_without_the_rules_the_server_filled() {
        let selector = json!({"clusterRoleSelectors": [{"matchLabels": {"a": "b"}}]});
        let filled = json!([{"apiGroups": ["x.io"], "resources": ["ts"], "verbs": ["*"]}]);
        let body = json!({
            "apiVersion": RBAC_API_VERSION, "kind": "ClusterRole",
            "metadata": {"name": "agg", "uid": "u", "resourceVersion": "7",
                "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
            "aggregationRule": selector,
            "rules": filled,
        });
        let mut l = live(body.clone());
        let summary = l.content.clone();
        l.slim();
        assert_eq!(
            *l.object(),
            json!({
                "apiVersion": RBAC_API_VERSION, "kind": "ClusterRole",
                "metadata": {"name": "agg", "resourceVersion": "7",
                    "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
                "aggregationRule": selector,
            })
        );
        // The plan still tells these rules from others by the digest.
        assert_eq!(l.content, summary);
        assert!(l.content.rules.is_some());
        l.pack();
        assert!(l.packed.as_ref().is_some_and(|p| p.rules.is_none()));
        // A role without an aggregationRule keeps its rules.
        let mut plain = body.clone();
        if let Some(m) = plain.as_object_mut() {
            m.remove("aggregationRule");
        }
        let mut l = live(plain);
        l.slim();
        assert_eq!(l.object()["rules"], filled);
    }

    #[test]
    fn packed_objects_share_equal_rule_lists_and_unpack_whole() {
        let rules = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
        let mut a = role(rules.clone());
        a["metadata"]["uid"] = json!("a");
        let mut b = role(rules);
        b["metadata"]["name"] = json!("b");
        let (mut la, mut lb) = (live(a.clone()), live(b.clone()));
        la.pack();
        lb.pack();
        let shared = |l: &Live| l.packed.as_ref().and_then(|p| p.rules.clone());
        let (ra, rb) = (shared(&la).expect("rules"), shared(&lb).expect("rules"));
        assert!(Arc::ptr_eq(&ra, &rb), "one copy of an equal rule list");
        assert!(la.unpack() && lb.unpack());
        assert_eq!((la.object(), lb.object()), (&a, &b));
        // Another list is its own copy.
        let mut c = live(role(
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]),
        ));
        c.pack();
        assert!(!Arc::ptr_eq(&shared(&c).expect("rules"), &ra));
    }

    #[test]
    fn packed_bodies_leave_out_what_the_summary_holds_and_share_the_rest() {
        let body = |name: &str, uid: &str| {
            json!({
                "apiVersion": RBAC_API_VERSION, "kind": "RoleBinding",
                "metadata": {"name": name, "namespace": "n", "uid": uid, "resourceVersion": "4",
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                    "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                    "annotations": {"rbacrules.io/rule": "r", "rbacrules.io/trigger": "T/a"},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "n", "uid": "x"}]},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "x"},
                "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "n"}],
            })
        };
        let (a, b) = (body("a", "ua"), body("b", "ub"));
        let (mut la, mut lb) = (live(a.clone()), live(b.clone()));
        la.pack();
        lb.pack();
        let rest = |l: &Live| l.packed.as_ref().map(|p| p.rest.clone()).expect("packed");
        assert!(
            Arc::ptr_eq(&rest(&la), &rest(&lb)),
            "one copy of equal rests"
        );
        assert!(
            Arc::ptr_eq(&la.meta, &lb.meta),
            "one copy of equal metadata"
        );
        let text = String::from_utf8(rest(&la).to_vec()).expect("utf-8");
        assert!(!text.contains("\"a\"") && !text.contains("ua") && !text.contains("T/a"));
        assert!(la.unpack() && lb.unpack());
        assert_eq!((la.object(), lb.object()), (&a, &b));
        // What the summary cannot give back exactly stays in the body.
        let mut odd = body("c", "uc");
        odd["metadata"]["labels"]["n"] = json!(1);
        odd["metadata"]["annotations"] = json!({});
        let mut lc = live(odd.clone());
        lc.pack();
        assert!(lc.unpack());
        assert_eq!(lc.object(), &odd);
    }

    #[test]
    fn objects_made_at_different_times_share_their_packed_rest() {
        // A real API server stamps every object with its own
        // creationTimestamp: the rest of equal objects is still one copy.
        let body = |name: &str, created: &str| {
            json!({
                "apiVersion": RBAC_API_VERSION, "kind": "Role",
                "metadata": {"name": name, "namespace": "n", "uid": format!("u-{name}"),
                    "resourceVersion": "4", "creationTimestamp": created,
                    "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "n", "uid": "x"}]},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
            })
        };
        let a = body("a", "2026-01-01T00:00:00Z");
        let b = body("b", "2026-11-26T16:34:51Z");
        let (mut la, mut lb) = (live(a.clone()), live(b.clone()));
        la.pack();
        lb.pack();
        let rest = |l: &Live| l.packed.as_ref().map(|p| p.rest.clone()).expect("packed");
        assert!(Arc::ptr_eq(&rest(&la), &rest(&lb)), "one copy of the rest");
        let text = String::from_utf8(rest(&la).to_vec()).expect("utf-8");
        assert!(!text.contains("creationTimestamp"), "{text}");
        assert!(la.unpack() && lb.unpack());
        assert_eq!((la.object(), lb.object()), (&a, &b));
        for t in [
            "2026-01-01T00:00:00Z",
            "0001-12-31T23:59:59Z",
            "9999-09-09T09:09:09Z",
        ] {
            assert_eq!(Stamp::of(t).map(Stamp::text).as_deref(), Some(t));
        }
        // A timestamp in another form (fractional seconds, an offset, not
        // text) stays in the body as it came.
        for odd in [
            json!("2026-01-01T00:00:00.5Z"),
            json!("2026-01-01T00:00:00+01:00"),
            json!("2026-01-01 00:00:00Z"),
            json!("2026-0a-01T00:00:00Z"),
            json!("0000-00-00T00:00:00Z"),
            json!(7),
        ] {
            let mut c = body("c", "");
            c["metadata"]["creationTimestamp"] = odd;
            let mut lc = live(c.clone());
            lc.pack();
            assert!(lc.unpack());
            assert_eq!(lc.object(), &c);
        }
        // Labels and annotations of different objects share their text.
        let mut d = body("d", "2026-01-01T00:00:00Z");
        d["metadata"]["annotations"] = json!({"x": "y"});
        let ld = live(d);
        assert!(!Arc::ptr_eq(&la.meta, &ld.meta));
        let (ka, kd) = (&la.meta.labels[0], &ld.meta.labels[0]);
        assert!(Arc::ptr_eq(&ka.0, &kd.0) && Arc::ptr_eq(&ka.1, &kd.1));
    }

    #[test]
    fn owner_references_compare_by_content() {
        let owner = json!({"apiVersion": "v1", "kind": "Namespace", "name": "n", "uid": "u1",
                           "controller": true, "blockOwnerDeletion": true});
        let mut desired = role(Value::Null);
        desired["metadata"]["ownerReferences"] = json!([owner]);
        let mut l = desired.clone();
        assert!(differences(&desired, &live(l.clone())).is_empty());
        l["metadata"]["ownerReferences"][0]["uid"] = json!("u2");
        assert_eq!(differences(&desired, &live(l)), vec!["ownerReferences"]);
    }
}
