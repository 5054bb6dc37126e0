//! The compact, immutable form of an emitted object.
//!
//! A [`Manifest`] keeps an output's parts typed (metadata maps, parsed
//! policy rules, roleRef, subjects) instead of a `serde_json::Value` tree,
//! about a tenth of the memory, and shares a role's rule list with every
//! role copying the same ClusterRoles. It is cheap to clone (one `Arc`),
//! compares by content (pointer first), and serializes to exactly the JSON
//! the API server returns for it (keys in sorted order, empty lists left
//! out), so printing and applying it need no special cases.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::rbac::v1::{AggregationRule, PolicyRule, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

use super::fast_hash::{HashMap, HashSet};
use super::kinds::{RBAC_API_VERSION, RBAC_GROUP};
use crate::api::OutputKind;
use crate::engine::GroupKind;

/// A small map of text (labels, annotations), sorted by key and shared:
/// the outputs of one template usually carry the same labels, and the
/// outputs of one trigger the same annotations (see [`Interner`]).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct StrMap(Arc<[(Arc<str>, Arc<str>)]>);

impl StrMap {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    /// Entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    /// Whether it has no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether both are the same shared map.
    pub fn ptr_eq(a: &StrMap, b: &StrMap) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }

    /// Whether any of `selectors` (validated) selects these labels.
    pub fn selected_by(&self, selectors: &[LabelSelector]) -> bool {
        selectors
            .iter()
            .any(|s| crate::selector::matches_lookup(s, |k| self.get(k)))
    }
}

impl From<BTreeMap<String, String>> for StrMap {
    fn from(m: BTreeMap<String, String>) -> Self {
        StrMap(m.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
    }
}

impl std::borrow::Borrow<[(Arc<str>, Arc<str>)]> for StrMap {
    fn borrow(&self) -> &[(Arc<str>, Arc<str>)] {
        &self.0
    }
}

impl std::fmt::Debug for StrMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// In key order, as a `BTreeMap` of the same entries.
impl Serialize for StrMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.iter() {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// Shares equal strings, maps and ownerReferences between the manifests
/// one rule renders in one evaluation, and equal name sets and selectors
/// between the reads its triggers record.
#[derive(Default)]
pub(crate) struct Interner {
    strings: HashSet<Arc<str>>,
    maps: HashSet<StrMap>,
    names: HashSet<Arc<BTreeSet<String>>>,
    hits: HashSet<Arc<BTreeSet<(String, String)>>>,
    kinds: HashSet<Arc<GroupKind>>,
    selectors: HashMap<String, Arc<LabelSelector>>,
    /// Bytes of text interned since [`Interner::forget_unused`] last ran.
    fresh: usize,
}

/// Text interned between two passes of [`Interner::forget_unused`] at
/// least: each pass walks every entry.
const FORGET_AFTER_BYTES: usize = 1024 * 1024;

impl Interner {
    /// The shared copy of a text.
    pub fn string(&mut self, s: String) -> Arc<str> {
        if let Some(hit) = self.strings.get(s.as_str()) {
            return Arc::clone(hit);
        }
        self.fresh = self.fresh.saturating_add(s.len());
        let s: Arc<str> = s.into();
        self.strings.insert(Arc::clone(&s));
        s
    }

    /// Drops the entries nothing but the interner holds any more (what a
    /// failed or refused render interned), once more than a MiB of text was
    /// interned since the last time: a rule's renders that fail must not
    /// keep their text until the rule ends (bounded evaluation).
    pub fn forget_unused(&mut self) {
        if self.fresh < FORGET_AFTER_BYTES {
            return;
        }
        self.fresh = 0;
        // Maps first: they hold strings.
        self.maps.retain(|m| Arc::strong_count(&m.0) > 1);
        self.strings.retain(|s| Arc::strong_count(s) > 1);
        self.names.retain(|n| Arc::strong_count(n) > 1);
        self.hits.retain(|h| Arc::strong_count(h) > 1);
    }

    /// The shared copy of a map of text.
    pub fn map(&mut self, m: BTreeMap<String, String>) -> StrMap {
        let entries: Vec<(Arc<str>, Arc<str>)> = m
            .into_iter()
            .map(|(k, v)| (self.string(k), self.string(v)))
            .collect();
        if let Some(hit) = self.maps.get(entries.as_slice()) {
            return hit.clone();
        }
        let map = StrMap(entries.into());
        self.maps.insert(map.clone());
        map
    }

    /// The shared copy of a set of names.
    pub fn names(&mut self, names: BTreeSet<String>) -> Arc<BTreeSet<String>> {
        if let Some(hit) = self.names.get(&names) {
            return Arc::clone(hit);
        }
        let names = Arc::new(names);
        self.names.insert(Arc::clone(&names));
        names
    }

    /// The shared copy of a set of objects found (namespace, name).
    pub fn hits(&mut self, hits: BTreeSet<(String, String)>) -> Arc<BTreeSet<(String, String)>> {
        if let Some(hit) = self.hits.get(&hits) {
            return Arc::clone(hit);
        }
        let hits = Arc::new(hits);
        self.hits.insert(Arc::clone(&hits));
        hits
    }

    /// The shared copy of a kind.
    pub fn kind(&mut self, gk: &GroupKind) -> Arc<GroupKind> {
        if let Some(hit) = self.kinds.get(gk) {
            return Arc::clone(hit);
        }
        let gk = Arc::new(gk.clone());
        self.kinds.insert(Arc::clone(&gk));
        gk
    }

    /// The shared copy of a selector.
    pub fn selector(&mut self, selector: LabelSelector) -> Arc<LabelSelector> {
        let key = serde_json::to_string(&selector).unwrap_or_default();
        Arc::clone(
            self.selectors
                .entry(key)
                .or_insert_with(|| Arc::new(selector)),
        )
    }

    /// A controller ownerReference, its strings shared.
    pub fn owner(&mut self, api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerRef {
        let mut s = |x: &str| self.string(x.to_string());
        OwnerRef::Controller {
            api_version: s(api_version),
            kind: s(kind),
            name: s(name),
            uid: s(uid),
        }
    }
}

/// The one ownerReference of an emitted object.
#[derive(Clone, Debug, PartialEq)]
pub enum OwnerRef {
    /// A controller reference (`controller` and `blockOwnerDeletion`
    /// true), as the engine makes to a trigger: four shared strings
    /// instead of a JSON map per object.
    Controller {
        /// apiVersion.
        api_version: Arc<str>,
        /// kind.
        kind: Arc<str>,
        /// name.
        name: Arc<str>,
        /// uid.
        uid: Arc<str>,
    },
    /// Any other, as [`Manifest::from_value`] read it.
    Other(Arc<Value>),
}

impl OwnerRef {
    /// Reads an ownerReference: compact when it is a controller
    /// reference with exactly the fields the engine writes.
    pub fn from_value(v: &Value) -> OwnerRef {
        let text = |k: &str| v[k].as_str();
        let flags = v["controller"] == Value::Bool(true)
            && v["blockOwnerDeletion"] == Value::Bool(true)
            && v.as_object().is_some_and(|m| m.len() == 6);
        match (text("apiVersion"), text("kind"), text("name"), text("uid")) {
            (Some(a), Some(k), Some(n), Some(u)) if flags => OwnerRef::Controller {
                api_version: a.into(),
                kind: k.into(),
                name: n.into(),
                uid: u.into(),
            },
            _ => OwnerRef::Other(Arc::new(v.clone())),
        }
    }
}

/// Keys in sorted order, as a `serde_json::Map` keeps them.
impl Serialize for OwnerRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            OwnerRef::Controller {
                api_version,
                kind,
                name,
                uid,
            } => {
                let mut m = s.serialize_map(Some(6))?;
                m.serialize_entry("apiVersion", &**api_version)?;
                m.serialize_entry("blockOwnerDeletion", &true)?;
                m.serialize_entry("controller", &true)?;
                m.serialize_entry("kind", &**kind)?;
                m.serialize_entry("name", &**name)?;
                m.serialize_entry("uid", &**uid)?;
                m.end()
            }
            OwnerRef::Other(v) => v.serialize(s),
        }
    }
}

/// Metadata of an emitted object.
#[derive(Clone, Debug, PartialEq)]
pub struct Meta {
    /// metadata.name.
    pub name: String,
    /// metadata.namespace (namespaced kinds only).
    pub namespace: Option<String>,
    /// metadata.labels.
    pub labels: StrMap,
    /// metadata.annotations.
    pub annotations: StrMap,
    /// The one ownerReference, if any.
    pub owner: Option<OwnerRef>,
}

/// What an emitted object carries besides metadata.
#[derive(Clone, Debug)]
pub enum Body {
    /// A role's rules (empty for an aggregated ClusterRole), shared.
    Role {
        /// Its policy rules.
        rules: Arc<Vec<PolicyRule>>,
        /// Its aggregationRule (ClusterRoles only).
        aggregation: Option<AggregationRule>,
    },
    /// A binding's roleRef (kind, name) and subjects.
    Binding {
        /// roleRef.kind.
        role_kind: String,
        /// roleRef.name.
        role_name: String,
        /// Its subjects.
        subjects: Vec<Subject>,
    },
}

/// Rule lists shared by the roles that render alike compare by address
/// first (`PolicyRule` is not `Eq`, so `Arc`'s own `==` never does).
impl PartialEq for Body {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (
                Body::Role { rules, aggregation },
                Body::Role {
                    rules: r,
                    aggregation: a,
                },
            ) => (Arc::ptr_eq(rules, r) || rules == r) && aggregation == a,
            (
                Body::Binding {
                    role_kind,
                    role_name,
                    subjects,
                },
                Body::Binding {
                    role_kind: k,
                    role_name: n,
                    subjects: s,
                },
            ) => role_kind == k && role_name == n && subjects == s,
            _ => false,
        }
    }
}

struct Inner {
    kind: OutputKind,
    meta: Meta,
    body: Body,
    /// The JSON form, built only when something reads the object as JSON
    /// (a rule reading emitted ClusterRoles), then kept.
    value: OnceLock<Arc<Value>>,
}

/// An emitted RBAC object (see the module doc).
#[derive(Clone)]
pub struct Manifest(Arc<Inner>);

impl Manifest {
    /// Assembles a manifest from its parts.
    pub fn new(kind: OutputKind, meta: Meta, body: Body) -> Self {
        Manifest(Arc::new(Inner {
            kind,
            meta,
            body,
            value: OnceLock::new(),
        }))
    }

    /// Reads an RBAC object given as JSON (as [`Manifest::to_value`]
    /// writes it); fields a manifest does not carry are left out. For
    /// tests and tools; the engine builds manifests from their parts.
    pub fn from_value(v: &Value) -> Result<Self, String> {
        let kind = v["kind"].as_str().unwrap_or_default();
        let kind =
            OutputKind::parse(kind).ok_or_else(|| format!("{kind:?} is not an RBAC kind"))?;
        let md = &v["metadata"];
        let map = |m: &Value| -> Result<BTreeMap<String, String>, String> {
            match m {
                Value::Null => Ok(BTreeMap::new()),
                m => serde_json::from_value(m.clone()).map_err(|e| e.to_string()),
            }
        };
        let meta = Meta {
            name: md["name"].as_str().unwrap_or_default().to_string(),
            namespace: md["namespace"].as_str().map(str::to_string),
            labels: map(&md["labels"])?.into(),
            annotations: map(&md["annotations"])?.into(),
            owner: md["ownerReferences"].get(0).map(OwnerRef::from_value),
        };
        let parse = |field: &str| -> Result<Option<Value>, String> {
            Ok(v.get(field).filter(|x| !x.is_null()).cloned())
        };
        let body = if kind.is_role() {
            let rules: Vec<PolicyRule> = match parse("rules")? {
                Some(r) => serde_json::from_value(r).map_err(|e| e.to_string())?,
                None => Vec::new(),
            };
            let aggregation = match parse("aggregationRule")? {
                Some(a) => Some(serde_json::from_value(a).map_err(|e| e.to_string())?),
                None => None,
            };
            Body::Role {
                rules: Arc::new(rules),
                aggregation,
            }
        } else {
            let subjects = match parse("subjects")? {
                Some(s) => serde_json::from_value(s).map_err(|e| e.to_string())?,
                None => Vec::new(),
            };
            Body::Binding {
                role_kind: v["roleRef"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                role_name: v["roleRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                subjects,
            }
        };
        Ok(Manifest::new(kind, meta, body))
    }

    /// Its kind.
    pub fn kind(&self) -> OutputKind {
        self.0.kind
    }

    /// Its metadata.
    pub fn meta(&self) -> &Meta {
        &self.0.meta
    }

    /// metadata.name.
    pub fn name(&self) -> &str {
        &self.0.meta.name
    }

    /// metadata.labels.
    pub fn labels(&self) -> &StrMap {
        &self.0.meta.labels
    }

    /// metadata.annotations.
    pub fn annotations(&self) -> &StrMap {
        &self.0.meta.annotations
    }

    /// Its body.
    pub fn body(&self) -> &Body {
        &self.0.body
    }

    /// A role's rules (shared); `None` for a binding.
    pub fn rules(&self) -> Option<&Arc<Vec<PolicyRule>>> {
        match &self.0.body {
            Body::Role { rules, .. } => Some(rules),
            Body::Binding { .. } => None,
        }
    }

    /// An aggregated ClusterRole's aggregationRule.
    pub fn aggregation_rule(&self) -> Option<&AggregationRule> {
        match &self.0.body {
            Body::Role { aggregation, .. } => aggregation.as_ref(),
            Body::Binding { .. } => None,
        }
    }

    /// A binding's roleRef kind and name.
    pub fn role_ref(&self) -> Option<(&str, &str)> {
        match &self.0.body {
            Body::Binding {
                role_kind,
                role_name,
                ..
            } => Some((role_kind, role_name)),
            Body::Role { .. } => None,
        }
    }

    /// Whether both are the same shared manifest.
    pub fn ptr_eq(a: &Manifest, b: &Manifest) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }

    /// The object as a JSON value, built afresh (nothing kept).
    pub fn to_value(&self) -> Value {
        match self.0.value.get() {
            Some(v) => (**v).clone(),
            None => serde_json::to_value(self).unwrap_or(Value::Null),
        }
    }

    /// The shared JSON value, if a reader had it built.
    pub(super) fn kept_value(&self) -> Option<&Arc<Value>> {
        self.0.value.get()
    }

    /// The object as a shared JSON value, built once and kept: for the
    /// engine's readers of emitted objects.
    pub(super) fn shared_value(&self) -> &Arc<Value> {
        self.0
            .value
            .get_or_init(|| Arc::new(serde_json::to_value(self).unwrap_or(Value::Null)))
    }

    /// The canonical JSON text (sorted keys, no spaces): the bytes of
    /// `serde_json::to_vec` of [`Manifest::to_value`].
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

impl PartialEq for Manifest {
    fn eq(&self, other: &Self) -> bool {
        Manifest::ptr_eq(self, other)
            || (self.0.kind == other.0.kind
                && self.0.meta == other.0.meta
                && self.0.body == other.0.body)
    }
}

impl std::fmt::Debug for Manifest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", String::from_utf8_lossy(&self.to_json()))
    }
}

impl std::fmt::Display for Manifest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// Keys are written in sorted order, as a `serde_json::Map` keeps them.
impl Serialize for Manifest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.write(s, false)
    }
}

/// A manifest serialized in Kubernetes' key order (see
/// [`Manifest::kube_ordered`]).
pub struct KubeOrdered<'a> {
    manifest: &'a Manifest,
}

impl Serialize for KubeOrdered<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.manifest.write(s, true)
    }
}

/// YAML printed on this thread, by a key, with what keeps the key's
/// meaning while it is cached (a weak hold on the shared value whose
/// address it is, so the address is not reused).
type KeptYaml<K, H> = HashMap<K, (H, Arc<str>)>;

/// A weak hold on a shared [`StrMap`]'s entries.
type HeldMap = std::sync::Weak<[(Arc<str>, Arc<str>)]>;

thread_local! {
    /// Shared rule lists, by address.
    static RULES_YAML: std::cell::RefCell<KeptYaml<usize, std::sync::Weak<Vec<PolicyRule>>>> =
        std::cell::RefCell::default();
    /// Labels (`true`) and annotations (`false`), by the shared map's
    /// address, as in `metadata`.
    static MAPS_YAML: std::cell::RefCell<KeptYaml<(usize, bool), HeldMap>> =
        std::cell::RefCell::default();
    /// Controller references, by their apiVersion, kind, name and uid, as
    /// in `metadata`.
    static OWNERS_YAML: std::cell::RefCell<KeptYaml<[Arc<str>; 4], ()>> =
        std::cell::RefCell::default();
}

/// Entries kept per thread and cache before it starts over.
const KEPT_YAML_MAX: usize = 4096;

/// The YAML kept under `key` while `holds` its entry, else made (`None`
/// from `make`: not to be printed in parts) and kept.
fn kept_yaml<K: std::hash::Hash + Eq, H>(
    cache: &'static std::thread::LocalKey<std::cell::RefCell<KeptYaml<K, H>>>,
    key: K,
    holds: impl Fn(&H) -> bool,
    make: impl FnOnce() -> Result<Option<(H, String)>, String>,
) -> Result<Option<Arc<str>>, String> {
    let hit = cache.with_borrow(|c| {
        c.get(&key)
            .filter(|(held, _)| holds(held))
            .map(|(_, y)| Arc::clone(y))
    });
    if hit.is_some() {
        return Ok(hit);
    }
    let Some((held, y)) = make()? else {
        return Ok(None);
    };
    let y: Arc<str> = y.into();
    cache.with_borrow_mut(|c| {
        if c.len() >= KEPT_YAML_MAX {
            c.clear();
        }
        c.insert(key, (held, Arc::clone(&y)));
    });
    Ok(Some(y))
}

/// Appends `text` (YAML of a top-level map) as it prints nested `spaces`
/// deep: each line indented, empty lines left empty. Exact for text with
/// no block scalar of a multi-line string: the serializer indents every
/// other line (a folded long string's too) by its depth alone.
fn push_indented(out: &mut String, text: &str, spaces: &str) {
    for line in text.split_inclusive('\n') {
        if line != "\n" {
            out.push_str(spaces);
        }
        out.push_str(line);
    }
}

/// YAML of a one-entry top-level map `{key: value}`.
fn entry_yaml<T: Serialize + ?Sized>(key: &str, value: &T) -> Result<String, String> {
    struct One<'a, T: ?Sized>(&'a str, &'a T);
    impl<T: Serialize + ?Sized> Serialize for One<'_, T> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut m = s.serialize_map(Some(1))?;
            m.serialize_entry(self.0, self.1)?;
            m.end()
        }
    }
    let mut y = String::new();
    serde_saphyr::to_fmt_writer(&mut y, &One(key, value)).map_err(|e| e.to_string())?;
    Ok(y)
}

/// Whether the serializer prints `s` as a map value as it is (plain):
/// a conservative test for names and namespaces, which nearly always
/// pass it (a lowercase start, then lowercase letters, digits, `.`, `-`
/// and `:` not last; no short word, which could read as a boolean or
/// null). Others go to the serializer.
fn plain_value(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() <= 80
        && b.first().is_some_and(u8::is_ascii_lowercase)
        && b.last() != Some(&b':')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b".:-".contains(c))
        && !(b.len() <= 5 && b.iter().all(u8::is_ascii_lowercase))
}

/// Appends `key: value` nested two spaces deep (under `metadata`).
fn push_meta_field(out: &mut String, key: &str, value: &str) -> Result<(), String> {
    if plain_value(value) {
        out.push_str("  ");
        out.push_str(key);
        out.push_str(": ");
        out.push_str(value);
        out.push('\n');
    } else {
        push_indented(out, &entry_yaml(key, value)?, "  ");
    }
    Ok(())
}

/// Whether strings print on one line (see [`push_indented`]).
fn one_line<'a>(mut texts: impl Iterator<Item = &'a str>) -> bool {
    texts.all(|t| !t.contains('\n'))
}

impl Manifest {
    /// The manifest serialized with `apiVersion`, `kind`, `metadata` first
    /// (and name, namespace, labels, annotations, ownerReferences first in
    /// metadata), the rest sorted: as the YAML printer orders keys.
    pub fn kube_ordered(&self) -> KubeOrdered<'_> {
        KubeOrdered { manifest: self }
    }

    /// Appends the manifest as YAML, keys as [`Manifest::kube_ordered`]
    /// orders them, the same bytes as serializing that whole. Printed in
    /// parts: labels, annotations and an ownerReference (shared by the
    /// outputs of one template or trigger) are serialized once per thread
    /// and their text copied after, and so is a shared rule list (the
    /// copies of thousands of Roles). The serializer checks every key and
    /// value for quoting, which was most of the time of printing.
    pub fn push_yaml(&self, out: &mut String) -> Result<(), String> {
        let start = out.len();
        if self.push_parts(out)? {
            return Ok(());
        }
        // A multi-line string: its block scalar's indentation is the
        // serializer's to choose.
        out.truncate(start);
        serde_saphyr::to_fmt_writer(out, &self.kube_ordered()).map_err(|e| e.to_string())
    }

    /// [`Manifest::push_yaml`] in parts; false (with part of it written)
    /// when a string of the metadata spans lines.
    fn push_parts(&self, out: &mut String) -> Result<bool, String> {
        let meta = &self.0.meta;
        let names = std::iter::once(meta.name.as_str()).chain(meta.namespace.as_deref());
        if !one_line(names) {
            return Ok(false);
        }
        out.push_str("apiVersion: ");
        out.push_str(RBAC_API_VERSION);
        out.push_str("\nkind: ");
        out.push_str(self.0.kind.as_str());
        out.push_str("\nmetadata:\n");
        push_meta_field(out, "name", &meta.name)?;
        if let Some(ns) = &meta.namespace {
            push_meta_field(out, "namespace", ns)?;
        }
        for (map, labels) in [(&meta.labels, true), (&meta.annotations, false)] {
            if map.is_empty() {
                continue;
            }
            let key = (Arc::as_ptr(&map.0) as *const u8 as usize, labels);
            let held = |h: &std::sync::Weak<_>| std::ptr::eq(h.as_ptr(), Arc::as_ptr(&map.0));
            let yaml = kept_yaml(&MAPS_YAML, key, held, || {
                if !one_line(map.iter().flat_map(|(k, v)| [k, v])) {
                    return Ok(None);
                }
                let field = if labels { "labels" } else { "annotations" };
                let mut y = String::new();
                push_indented(&mut y, &entry_yaml(field, map)?, "  ");
                Ok(Some((Arc::downgrade(&map.0), y)))
            })?;
            let Some(yaml) = yaml else {
                return Ok(false);
            };
            out.push_str(&yaml);
        }
        match &meta.owner {
            None => {}
            Some(
                o @ OwnerRef::Controller {
                    api_version,
                    kind,
                    name,
                    uid,
                },
            ) => {
                let key = [api_version, kind, name, uid].map(Arc::clone);
                let yaml = kept_yaml(
                    &OWNERS_YAML,
                    key.clone(),
                    |()| true,
                    || {
                        if !one_line(key.iter().map(|s| &**s)) {
                            return Ok(None);
                        }
                        let mut y = String::new();
                        let owners = std::slice::from_ref(o);
                        push_indented(&mut y, &entry_yaml("ownerReferences", owners)?, "  ");
                        Ok(Some(((), y)))
                    },
                )?;
                let Some(yaml) = yaml else {
                    return Ok(false);
                };
                out.push_str(&yaml);
            }
            // Read back from the cluster, not rendered: printed whole.
            Some(OwnerRef::Other(_)) => return Ok(false),
        }
        self.push_body(out)?;
        Ok(true)
    }

    /// Appends what follows `metadata`, at the top level.
    fn push_body(&self, out: &mut String) -> Result<(), String> {
        let text = |e: serde_saphyr::ser::Error| e.to_string();
        let rules = match &self.0.body {
            Body::Role {
                rules,
                aggregation: None,
            } if rules.is_empty() => return Ok(()),
            Body::Role {
                rules,
                aggregation: None,
            } if Arc::strong_count(rules) > 1 => rules,
            _ => return serde_saphyr::to_fmt_writer(out, &BodySer(self)).map_err(text),
        };
        out.push_str("rules:\n");
        let at = Arc::as_ptr(rules) as usize;
        let held = |h: &std::sync::Weak<_>| std::ptr::eq(h.as_ptr(), Arc::as_ptr(rules));
        let yaml = kept_yaml(&RULES_YAML, at, held, || {
            let mut y = String::new();
            serde_saphyr::to_fmt_writer(&mut y, &**rules).map_err(text)?;
            Ok(Some((Arc::downgrade(rules), y)))
        })?;
        // Always made: a rule list prints at the top level, as is.
        if let Some(y) = yaml {
            out.push_str(&y);
        }
        Ok(())
    }

    fn write<S: Serializer>(&self, s: S, kube: bool) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        if !kube && let Some(a) = self.aggregation() {
            m.serialize_entry("aggregationRule", a)?;
        }
        m.serialize_entry("apiVersion", RBAC_API_VERSION)?;
        m.serialize_entry("kind", self.0.kind.as_str())?;
        m.serialize_entry(
            "metadata",
            &MetaSer {
                meta: &self.0.meta,
                kube,
            },
        )?;
        self.write_body(&mut m, kube)?;
        m.end()
    }

    fn aggregation(&self) -> Option<&AggregationRule> {
        match &self.0.body {
            Body::Role { aggregation, .. } => aggregation.as_ref(),
            Body::Binding { .. } => None,
        }
    }

    /// The entries after `metadata` (`aggregationRule` too in Kubernetes'
    /// order, `kube`).
    fn write_body<M: SerializeMap>(&self, m: &mut M, kube: bool) -> Result<(), M::Error> {
        if kube && let Some(a) = self.aggregation() {
            m.serialize_entry("aggregationRule", a)?;
        }
        match &self.0.body {
            Body::Role { rules, aggregation } => {
                if aggregation.is_none() && !rules.is_empty() {
                    m.serialize_entry("rules", &**rules)?;
                }
            }
            Body::Binding {
                role_kind,
                role_name,
                subjects,
            } => {
                m.serialize_entry(
                    "roleRef",
                    &RoleRefSer {
                        kind: role_kind,
                        name: role_name,
                    },
                )?;
                if !subjects.is_empty() {
                    m.serialize_entry("subjects", subjects)?;
                }
            }
        }
        Ok(())
    }
}

/// What follows `metadata` in Kubernetes' order, as a map of its own
/// (never empty: see [`Manifest::push_body`]).
struct BodySer<'a>(&'a Manifest);

impl Serialize for BodySer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        self.0.write_body(&mut m, true)?;
        m.end()
    }
}

struct MetaSer<'a> {
    meta: &'a Meta,
    kube: bool,
}

impl Serialize for MetaSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let meta = self.meta;
        let mut m = s.serialize_map(None)?;
        if self.kube {
            m.serialize_entry("name", &meta.name)?;
            if let Some(ns) = &meta.namespace {
                m.serialize_entry("namespace", ns)?;
            }
        }
        let (labels, annotations) = (
            (!meta.labels.is_empty()).then_some(&meta.labels),
            (!meta.annotations.is_empty()).then_some(&meta.annotations),
        );
        // Sorted: annotations before labels; Kubernetes: labels first.
        let pair = if self.kube {
            [("labels", labels), ("annotations", annotations)]
        } else {
            [("annotations", annotations), ("labels", labels)]
        };
        for (k, v) in pair {
            if let Some(v) = v {
                m.serialize_entry(k, v)?;
            }
        }
        if !self.kube {
            m.serialize_entry("name", &meta.name)?;
            if let Some(ns) = &meta.namespace {
                m.serialize_entry("namespace", ns)?;
            }
        }
        if let Some(o) = &meta.owner {
            m.serialize_entry("ownerReferences", std::slice::from_ref(o))?;
        }
        m.end()
    }
}

struct RoleRefSer<'a> {
    kind: &'a str,
    name: &'a str,
}

impl Serialize for RoleRefSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("apiGroup", RBAC_GROUP)?;
        m.serialize_entry("kind", self.kind)?;
        m.serialize_entry("name", self.name)?;
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use serde_json::json;

    fn meta() -> Meta {
        Meta {
            name: "r".into(),
            namespace: Some("ns".into()),
            labels: BTreeMap::from([("b".to_string(), "1".to_string())]).into(),
            annotations: BTreeMap::from([("a".to_string(), "x".to_string())]).into(),
            owner: Some(OwnerRef::from_value(
                &json!({"kind": "Namespace", "name": "ns", "uid": "u"}),
            )),
        }
    }

    #[test]
    fn serializes_as_the_api_server_returns_it() {
        let rules = vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["pods".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }];
        let m = Manifest::new(
            OutputKind::Role,
            meta(),
            Body::Role {
                rules: Arc::new(rules),
                aggregation: None,
            },
        );
        let want = json!({
            "apiVersion": RBAC_API_VERSION, "kind": "Role",
            "metadata": {"name": "r", "namespace": "ns", "labels": {"b": "1"},
                         "annotations": {"a": "x"},
                         "ownerReferences": [{"kind": "Namespace", "name": "ns", "uid": "u"}]},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
        });
        assert_eq!(m.to_value(), want);
        assert_eq!(Manifest::from_value(&want).unwrap(), m);
        // Canonical text: the same bytes as the JSON value's.
        assert_eq!(m.to_json(), serde_json::to_vec(&want).unwrap());
        let empty = Manifest::new(
            OutputKind::ClusterRoleBinding,
            Meta {
                namespace: None,
                owner: None,
                ..meta()
            },
            Body::Binding {
                role_kind: "ClusterRole".into(),
                role_name: "x".into(),
                subjects: Vec::new(),
            },
        );
        assert_eq!(empty.to_value().get("subjects"), None);
        assert_eq!(empty.to_value()["roleRef"]["apiGroup"], RBAC_GROUP);
    }

    #[test]
    fn roles_sharing_rules_print_as_serialized() {
        let rules = Arc::new(vec![PolicyRule {
            api_groups: Some(vec![String::new(), "a.io".into()]),
            resources: Some(vec!["pods".into(), "x/status".into()]),
            verbs: vec!["*".into(), "get".into()],
            ..Default::default()
        }]);
        let role = |name: &str| {
            Manifest::new(
                OutputKind::Role,
                Meta {
                    name: name.into(),
                    ..meta()
                },
                Body::Role {
                    rules: Arc::clone(&rules),
                    aggregation: None,
                },
            )
        };
        for m in [role("a"), role("b"), role("a")] {
            let mut printed = String::new();
            m.push_yaml(&mut printed).unwrap();
            let mut whole = String::new();
            serde_saphyr::to_fmt_writer(&mut whole, &m.kube_ordered()).unwrap();
            assert_eq!(printed, whole);
            assert!(
                printed.contains("rules:\n- apiGroups:\n  - \"\"\n"),
                "{printed}"
            );
        }
    }

    #[test]
    fn controller_references_are_compact_and_print_the_same() {
        let ctl = json!({"apiVersion": "v1", "kind": "Namespace", "name": "ns", "uid": "u",
                         "controller": true, "blockOwnerDeletion": true});
        let o = OwnerRef::from_value(&ctl);
        assert!(matches!(o, OwnerRef::Controller { .. }), "{o:?}");
        assert_eq!(
            serde_json::to_vec(&o).unwrap(),
            serde_json::to_vec(&ctl).unwrap()
        );
        // Anything else is kept as it is.
        for other in [
            json!({"apiVersion": "v1", "kind": "Namespace", "name": "ns", "uid": "u"}),
            json!({"apiVersion": "v1", "kind": "Namespace", "name": "ns", "uid": "u",
                   "controller": false, "blockOwnerDeletion": true}),
        ] {
            let o = OwnerRef::from_value(&other);
            assert!(matches!(o, OwnerRef::Other(_)), "{o:?}");
            assert_eq!(serde_json::to_value(&o).unwrap(), other);
        }
        let mut shared = Interner::default();
        let (a, b) = (
            shared.owner("v1", "Namespace", "ns", "u"),
            shared.owner("v1", "Namespace", "ns", "u"),
        );
        assert_eq!(a, OwnerRef::from_value(&ctl));
        let uid = |o: &OwnerRef| match o {
            OwnerRef::Controller { uid, .. } => Arc::clone(uid),
            OwnerRef::Other(_) => unreachable!(),
        };
        assert!(Arc::ptr_eq(&uid(&a), &uid(&b)));
    }

    #[test]
    fn compares_by_content() {
        let agg = |label: &str| {
            Manifest::new(
                OutputKind::ClusterRole,
                meta(),
                Body::Role {
                    rules: Arc::new(Vec::new()),
                    aggregation: Some(AggregationRule {
                        cluster_role_selectors: Some(vec![LabelSelector {
                            match_labels: Some([(label.to_string(), "true".to_string())].into()),
                            ..Default::default()
                        }]),
                    }),
                },
            )
        };
        let (a, b, c) = (agg("x"), agg("x"), agg("y"));
        assert!(!Manifest::ptr_eq(&a, &b));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.to_json(), serde_json::to_vec(&a.to_value()).unwrap());
        assert!(a.to_value().get("rules").is_none());
        assert_eq!(**a.shared_value(), a.to_value());
    }

    /// Strings that print plain, quoted, escaped, folded (longer than 80
    /// characters, with or without spaces) or as block scalars.
    const AWKWARD: &[&str] = &[
        "plain",
        "",
        "*",
        "true",
        "No",
        "~",
        "null",
        "0x1F",
        "1e3",
        "-",
        "- x",
        "a: b",
        "a:b",
        "#x",
        "a #b",
        "'quoted'",
        "\"dq\"",
        "{x}",
        "[x]",
        "a, b",
        " lead",
        "trail ",
        "tab\tin",
        "cr\rin",
        "bell\u{7}",
        "ünïcødé ✓",
        "&anchor",
        "!tag",
        "%pct",
        "@at",
        "`tick",
        "|pipe",
        ">gt",
        "?q",
        "---",
        "...",
        "CompositeResourceDefinition.apiextensions.example.io/xthing0s.platform.example.org/x",
        "a long value with spaces that goes on past the eighty characters at which the printer folds text",
        "a long value with  double  spaces and a # hash that goes on past eighty characters, folded or quoted",
        "two\nlines",
        "trailing newline\n",
        "\nleading newline",
    ];

    #[test]
    fn printed_in_parts_as_serialized_whole() {
        let print = |m: &Manifest| {
            let mut printed = String::new();
            m.push_yaml(&mut printed).unwrap();
            let mut whole = String::new();
            serde_saphyr::to_fmt_writer(&mut whole, &m.kube_ordered()).unwrap();
            assert_eq!(printed, whole, "{m:?}");
            // Printed from its parts whenever it can be.
            let mut parts = String::new();
            let in_parts = m.push_parts(&mut parts).unwrap();
            if in_parts {
                assert_eq!(parts, whole);
            }
            in_parts
        };
        let rules = Arc::new(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["pods".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }]);
        let mut shared = Interner::default();
        let mut printed = 0;
        for (n, text) in AWKWARD.iter().enumerate() {
            let other = AWKWARD[(n + 7) % AWKWARD.len()];
            let labels = shared.map(BTreeMap::from([
                ("app".to_string(), text.to_string()),
                (format!("k{n}"), other.to_string()),
            ]));
            let annotations = shared.map(BTreeMap::from([(text.to_string(), other.to_string())]));
            let owner = shared.owner("v1", text, other, "u");
            let meta = |name: &str, namespace: Option<&str>| Meta {
                name: name.to_string(),
                namespace: namespace.map(str::to_string),
                labels: labels.clone(),
                annotations: annotations.clone(),
                owner: Some(owner.clone()),
            };
            let bodies = [
                (
                    OutputKind::Role,
                    Body::Role {
                        rules: Arc::clone(&rules),
                        aggregation: None,
                    },
                ),
                (
                    OutputKind::ClusterRole,
                    Body::Role {
                        rules: Arc::new(vec![PolicyRule {
                            verbs: vec![text.to_string()],
                            ..Default::default()
                        }]),
                        aggregation: None,
                    },
                ),
                (
                    OutputKind::ClusterRole,
                    Body::Role {
                        rules: Arc::new(Vec::new()),
                        aggregation: None,
                    },
                ),
                (
                    OutputKind::ClusterRole,
                    Body::Role {
                        rules: Arc::new(Vec::new()),
                        aggregation: Some(AggregationRule {
                            cluster_role_selectors: Some(vec![LabelSelector {
                                match_labels: Some([(text.to_string(), other.to_string())].into()),
                                ..Default::default()
                            }]),
                        }),
                    },
                ),
                (
                    OutputKind::RoleBinding,
                    Body::Binding {
                        role_kind: "ClusterRole".into(),
                        role_name: text.to_string(),
                        subjects: vec![Subject {
                            kind: "ServiceAccount".into(),
                            name: other.to_string(),
                            namespace: Some(text.to_string()),
                            ..Default::default()
                        }],
                    },
                ),
                (
                    OutputKind::ClusterRoleBinding,
                    Body::Binding {
                        role_kind: "ClusterRole".into(),
                        role_name: "r".into(),
                        subjects: Vec::new(),
                    },
                ),
            ];
            for (kind, body) in bodies {
                let namespace = kind.namespaced().then_some(*text);
                // Twice each: printed afresh, then from what was kept.
                for name in [*text, other, *text] {
                    let m = Manifest::new(kind, meta(name, namespace), body.clone());
                    let one_line = !text.contains('\n') && !other.contains('\n');
                    assert_eq!(print(&m), one_line, "{m:?}");
                    printed += 1;
                }
            }
            // Read back from the cluster: another kind of ownerReference.
            let read = Manifest::new(
                OutputKind::Role,
                Meta {
                    owner: Some(OwnerRef::Other(Arc::new(
                        json!({"kind": text, "name": other}),
                    ))),
                    ..meta(other, Some(text))
                },
                Body::Role {
                    rules: Arc::clone(&rules),
                    aggregation: None,
                },
            );
            assert!(!print(&read));
        }
        assert_eq!(printed, AWKWARD.len() * 18);
        // The plain case is printed from its parts (no fallback), and
        // reads as Kubernetes writes it.
        let plain = Manifest::new(
            OutputKind::Role,
            Meta {
                owner: Some(shared.owner("v1", "Namespace", "ns", "u")),
                ..meta()
            },
            Body::Role {
                rules: Arc::clone(&rules),
                aggregation: None,
            },
        );
        let mut parts = String::new();
        assert!(plain.push_parts(&mut parts).unwrap());
        assert_eq!(
            parts,
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: r\n  \
             namespace: ns\n  labels:\n    b: \"1\"\n  annotations:\n    a: x\n  \
             ownerReferences:\n  - apiVersion: v1\n    blockOwnerDeletion: true\n    controller: true\n    \
             kind: Namespace\n    name: ns\n    uid: u\nrules:\n\
             - apiGroups:\n  - \"\"\n  resources:\n  - pods\n  verbs:\n  - get\n"
        );
    }

    #[test]
    fn plain_values_print_as_the_serializer_prints_them() {
        let mut texts: Vec<String> = Vec::new();
        let all: Vec<char> = ('a'..='z').chain('0'..='9').chain(".:-".chars()).collect();
        let few: Vec<char> = "abefilnorstuxy019.:-".chars().collect();
        for a in &all {
            texts.push(a.to_string());
            for b in &all {
                texts.push(format!("{a}{b}"));
            }
        }
        for a in &few {
            for b in &few {
                for c in &few {
                    texts.push(format!("{a}{b}{c}"));
                    for d in "enosy:".chars() {
                        texts.push(format!("{a}{b}{c}{d}"));
                    }
                }
            }
        }
        for word in [
            "null", "true", "false", "yes", "no", "on", "off", "nan", "inf", "y", "n",
        ] {
            for w in [
                word.to_string(),
                word.to_uppercase(),
                format!("{word}s"),
                format!("a{word}"),
            ] {
                texts.push(w);
            }
        }
        texts.push("platform:provider:provider-aws-s3-1a2b3c:aggregate-to-edit".into());
        texts.push("x".repeat(80));
        texts.push("x".repeat(81));
        let mut plain = 0;
        for t in &texts {
            if plain_value(t) {
                plain += 1;
                assert_eq!(
                    entry_yaml("name", t).unwrap(),
                    format!("name: {t}\n"),
                    "{t:?}"
                );
            }
        }
        // Most of them were compared (17,172 of 57,607).
        assert!(plain > 10_000, "{plain} of {}", texts.len());
        assert!(!plain_value("true") && !plain_value("a:") && !plain_value(&"x".repeat(81)));
    }

    #[test]
    fn the_interner_forgets_what_only_it_holds_once_a_mib_came_in() {
        let mut i = Interner::default();
        let kept = i.map(BTreeMap::from([("k".to_string(), "v".repeat(10))]));
        // A refused render's text: nothing but the interner holds it.
        drop(i.map(BTreeMap::from([("k".to_string(), "x".repeat(600_000))])));
        i.forget_unused();
        assert_eq!(
            i.strings.len(),
            3,
            "under a MiB since: nothing forgotten yet"
        );
        drop(i.string("y".repeat(600_000)));
        i.forget_unused();
        // What the kept map holds stays shared; the rest is gone.
        assert_eq!(i.maps.len(), 1);
        assert_eq!(i.strings.len(), 2);
        let again = i.map(BTreeMap::from([("k".to_string(), "v".repeat(10))]));
        assert!(StrMap::ptr_eq(&kept, &again));
    }
}
