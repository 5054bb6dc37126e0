//! The observed objects the engine reads, indexed by group and kind.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

/// API group and kind, the identity of a type regardless of version.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKind {
    /// API group; empty for the core group.
    pub group: String,
    /// Kind.
    pub kind: String,
}

impl GroupKind {
    /// A group and kind.
    pub fn new(group: impl Into<String>, kind: impl Into<String>) -> Self {
        GroupKind {
            group: group.into(),
            kind: kind.into(),
        }
    }

    /// The group and kind of an object's `apiVersion` and `kind`.
    pub fn of(obj: &Value) -> Option<GroupKind> {
        let api_version = obj.get("apiVersion")?.as_str()?;
        let kind = obj.get("kind")?.as_str()?;
        Some(GroupKind::new(group_of(api_version), kind))
    }
}

impl fmt::Display for GroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}.{}", self.kind, self.group)
        }
    }
}

/// The group part of an apiVersion (`apps/v1` → `apps`, `v1` → ``).
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("")
}

/// Namespace (empty for cluster-scoped objects) and name.
pub type ObjectKey = (String, String);

/// Namespace and name of an object.
pub fn key_of(obj: &Value) -> Option<ObjectKey> {
    let meta = obj.get("metadata")?;
    let name = meta.get("name")?.as_str()?.to_string();
    let ns = meta
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Some((ns, name))
}

/// `Kind.group/[namespace/]name`: how errors, events and annotations name
/// an object.
pub fn object_ref(obj: &Value) -> String {
    let gk = GroupKind::of(obj)
        .map(|g| g.to_string())
        .unwrap_or_else(|| "?".to_string());
    match key_of(obj) {
        Some((ns, name)) if ns.is_empty() => format!("{gk}/{name}"),
        Some((ns, name)) => format!("{gk}/{ns}/{name}"),
        None => format!("{gk}/?"),
    }
}

/// Objects by group/kind, then by namespace and name. Iteration is sorted,
/// which keeps evaluation deterministic. Objects are shared, not copied,
/// between stores (the engine overlays its own outputs on the cluster's).
#[derive(Clone, Debug, Default)]
pub struct ObjectStore {
    kinds: BTreeMap<GroupKind, BTreeMap<ObjectKey, Arc<Value>>>,
}

impl ObjectStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces an object. Objects without apiVersion, kind or name
    /// are refused with a message saying which is missing.
    pub fn insert(&mut self, obj: Value) -> Result<(), String> {
        self.insert_shared(Arc::new(obj))
    }

    /// Like [`ObjectStore::insert`], for an object shared with others.
    pub fn insert_shared(&mut self, obj: Arc<Value>) -> Result<(), String> {
        let gk = GroupKind::of(&obj).ok_or("object has no apiVersion or kind")?;
        let key = key_of(&obj).ok_or_else(|| format!("{gk} has no metadata.name"))?;
        self.kinds.entry(gk).or_default().insert(key, obj);
        Ok(())
    }

    /// Removes an object; returns it if it was there.
    pub fn remove(&mut self, gk: &GroupKind, key: &ObjectKey) -> Option<Value> {
        self.kinds
            .get_mut(gk)
            .and_then(|m| m.remove(key))
            .map(Arc::unwrap_or_clone)
    }

    /// Drops every object of a kind (a fresh list replaces them).
    pub fn clear_kind(&mut self, gk: &GroupKind) {
        self.kinds.remove(gk);
    }

    /// One object.
    pub fn get(&self, gk: &GroupKind, key: &ObjectKey) -> Option<&Value> {
        self.kinds.get(gk).and_then(|m| m.get(key)).map(|v| &**v)
    }

    /// Every object of a kind, sorted by namespace and name.
    pub fn list(&self, gk: &GroupKind) -> impl Iterator<Item = &Value> {
        self.kinds
            .get(gk)
            .into_iter()
            .flat_map(|m| m.values().map(|v| &**v))
    }

    /// Every object of a kind in one namespace.
    pub fn list_namespace<'a>(
        &'a self,
        gk: &GroupKind,
        ns: &str,
    ) -> impl Iterator<Item = &'a Value> + use<'a> {
        let ns = ns.to_string();
        self.kinds.get(gk).into_iter().flat_map(move |m| {
            let inner = ns.clone();
            m.range((ns.clone(), String::new())..)
                .take_while(move |((n, _), _)| *n == inner)
                .map(|(_, v)| &**v)
        })
    }

    /// Kinds present.
    pub fn kinds(&self) -> impl Iterator<Item = &GroupKind> {
        self.kinds.keys()
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.kinds.values().map(BTreeMap::len).sum()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
