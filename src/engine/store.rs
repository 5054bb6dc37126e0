//! The observed objects the engine reads, indexed by group and kind.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// The uid of `obj`'s controller: its only ownerReference with
/// `controller: true`, when that has a uid. Kubernetes refuses a second
/// controller reference, so data with two proves nothing. Lineage
/// (`controlledBy`, `notOlderThan`) rests on it, in both evaluators.
pub fn controller_uid(obj: &Value) -> Option<&str> {
    let mut controllers = obj["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["controller"].as_bool() == Some(true));
    match (controllers.next(), controllers.next()) {
        (Some(r), None) => r["uid"].as_str().filter(|u| !u.is_empty()),
        _ => None,
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
    // Put together by hand: one allocation, as each render names its trigger.
    fn text<'v>(v: &'v Value, k: &str) -> Option<&'v str> {
        v.get(k).and_then(Value::as_str)
    }
    let kind = text(obj, "kind").zip(text(obj, "apiVersion"));
    let meta = obj.get("metadata").unwrap_or(&Value::Null);
    let name = text(meta, "name");
    let ns = name.and(text(meta, "namespace")).unwrap_or_default();
    let mut out = String::with_capacity(64);
    match kind {
        Some((kind, api_version)) => {
            out.push_str(kind);
            let group = group_of(api_version);
            if !group.is_empty() {
                out.push('.');
                out.push_str(group);
            }
        }
        None => out.push('?'),
    }
    out.push('/');
    if !ns.is_empty() {
        out.push_str(ns);
        out.push('/');
    }
    out.push_str(name.unwrap_or("?"));
    out
}

/// Objects by group/kind, then by namespace and name. Iteration is sorted,
/// which keeps evaluation deterministic. Objects are shared, not copied,
/// between stores (the engine overlays its own outputs on the cluster's).
///
/// Every mutation that changes an object is journaled under a generation
/// number, so an incremental evaluation asks what changed since the
/// generation it last saw instead of walking every object. A clone is a
/// new store with a journal of its own.
///
/// Each kind's index is shared, copy on write, by the stores that hold the
/// same objects of it (a clone, or one that [`ObjectStore::follow`]s
/// another): the controller's slow lane evaluates the world's store as it
/// was, while the world goes on changing its own, without a copy of every
/// key of every kind.
#[derive(Debug)]
pub struct ObjectStore {
    kinds: BTreeMap<GroupKind, Arc<Kind>>,
    /// Identity of this store's history (see [`ObjectStore::changes_since`]).
    id: u64,
    /// Generation: counts the changes.
    generation: u64,
    /// Changed objects, oldest first, with the generation of the change;
    /// kinds by their place in `journal_kinds` (a few kinds, thousands of
    /// entries: no copy of the kind's strings per entry).
    journal: Vec<(u64, u32, ObjectKey)>,
    /// The kinds the journal names.
    journal_kinds: Vec<GroupKind>,
    /// Generations up to this one were dropped from the journal.
    floor: u64,
}

/// One kind's objects by namespace and name.
type Kind = BTreeMap<ObjectKey, Arc<Value>>;

static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(1);

impl Default for ObjectStore {
    fn default() -> Self {
        ObjectStore {
            kinds: BTreeMap::new(),
            id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
            generation: 0,
            journal: Vec::new(),
            journal_kinds: Vec::new(),
            floor: 0,
        }
    }
}

impl Clone for ObjectStore {
    fn clone(&self) -> Self {
        ObjectStore {
            kinds: self.kinds.clone(),
            ..ObjectStore::default()
        }
    }
}

/// Whether two versions of an object are the same: by resourceVersion,
/// which changes with every write, or by content where there is none
/// (offline renders, tests).
fn same_version(a: &Value, b: &Value) -> bool {
    let rv = |v: &Value| {
        v["metadata"]["resourceVersion"]
            .as_str()
            .filter(|r| !r.is_empty())
            .map(str::to_string)
    };
    match (rv(a), rv(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
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
        let objects = self.kinds.entry(gk.clone()).or_default();
        let old = objects.get(&key);
        if old.is_some_and(|old| Arc::ptr_eq(old, &obj)) {
            // Nothing to write: a shared index stays shared.
            return Ok(());
        }
        let same = old.is_some_and(|old| same_version(old, &obj));
        Arc::make_mut(objects).insert(key.clone(), obj);
        if !same {
            self.journal_change(&gk, key);
        }
        Ok(())
    }

    /// Records a change to one object.
    fn journal_change(&mut self, gk: &GroupKind, key: ObjectKey) {
        self.generation += 1;
        let kind = match self.journal_kinds.iter().position(|k| k == gk) {
            Some(i) => i,
            None => {
                self.journal_kinds.push(gk.clone());
                self.journal_kinds.len() - 1
            }
        };
        self.journal.push((self.generation, kind as u32, key));
        // Bounded: a reader that fell this far behind starts over.
        let bound = 4096 + 2 * self.len();
        if self.journal.len() > bound {
            let drop = self.journal.len() / 2;
            self.floor = self.journal[drop - 1].0;
            self.journal.drain(..drop);
        }
    }

    /// This store's identity and generation: equal pairs mean nothing
    /// changed in between.
    pub fn version(&self) -> (u64, u64) {
        (self.id, self.generation)
    }

    /// Drops the journal up to `version` (a value of
    /// [`ObjectStore::version`]), once every reader has read that far;
    /// else it is held up to its bound (after the first lists alone, one
    /// entry per object). A reader still behind `version` is told nothing
    /// ([`ObjectStore::changes_since`]) and starts over.
    pub fn forget_through(&mut self, version: (u64, u64)) {
        let (id, generation) = version;
        if id != self.id || generation <= self.floor || generation > self.generation {
            return;
        }
        let end = self.journal.partition_point(|(g, _, _)| *g <= generation);
        self.journal.drain(..end);
        self.floor = generation;
        if self.journal.capacity() > 4 * self.journal.len() + 64 {
            self.journal.shrink_to(2 * self.journal.len());
        }
    }

    /// The objects changed since `version` (a value of
    /// [`ObjectStore::version`]), oldest first and possibly repeated, or
    /// `None` when the journal cannot tell (another store, or too old).
    pub fn changes_since(
        &self,
        version: (u64, u64),
    ) -> Option<impl Iterator<Item = (&GroupKind, &ObjectKey)>> {
        let (id, generation) = version;
        if id != self.id || generation < self.floor || generation > self.generation {
            return None;
        }
        let start = self.journal.partition_point(|(g, _, _)| *g <= generation);
        let kinds = &self.journal_kinds;
        Some(
            self.journal[start..]
                .iter()
                .map(|(_, kind, key)| (&kinds[*kind as usize], key)),
        )
    }

    /// Removes an object; returns it if it was there.
    pub fn remove(&mut self, gk: &GroupKind, key: &ObjectKey) -> Option<Value> {
        let objects = self.kinds.get_mut(gk)?;
        if !objects.contains_key(key) {
            return None;
        }
        let gone = Arc::make_mut(objects).remove(key)?;
        self.journal_change(gk, key.clone());
        Some(Arc::unwrap_or_clone(gone))
    }

    /// Drops every object of a kind (a fresh list replaces them).
    pub fn clear_kind(&mut self, gk: &GroupKind) {
        if let Some(gone) = self.kinds.remove(gk) {
            for key in gone.keys() {
                self.journal_change(gk, key.clone());
            }
        }
    }

    /// Replaces every object of a kind with a fresh list (a relist),
    /// journaling only the objects that were added, changed or removed —
    /// unlike [`ObjectStore::clear_kind`] followed by inserts, after which
    /// every object of the kind counts as changed. Objects without
    /// apiVersion, kind or name are skipped and reported.
    pub fn replace_kind(&mut self, gk: &GroupKind, objects: Vec<Arc<Value>>) -> Vec<String> {
        let mut errors = Vec::new();
        let mut fresh: Kind = BTreeMap::new();
        for obj in objects {
            match key_of(&obj) {
                Some(key) if GroupKind::of(&obj).as_ref() == Some(gk) => {
                    fresh.insert(key, obj);
                }
                _ => errors.push(format!("{gk}: object without a name, or of another kind")),
            }
        }
        let old = self.kinds.remove(gk).unwrap_or_default();
        let mut changed: Vec<ObjectKey> = Vec::new();
        for (key, obj) in old.iter() {
            match fresh.get(key) {
                Some(new) if Arc::ptr_eq(obj, new) || same_version(obj, new) => {}
                _ => changed.push(key.clone()),
            }
        }
        changed.extend(fresh.keys().filter(|k| !old.contains_key(*k)).cloned());
        if !fresh.is_empty() {
            self.kinds.insert(gk.clone(), Arc::new(fresh));
        }
        for key in changed {
            self.journal_change(gk, key);
        }
        errors
    }

    /// Makes this store hold what `from` holds, kind for kind, sharing
    /// `from`'s index of each (copy on write: no key or object is copied)
    /// and journaling in its own journal each object that differs, so that
    /// an incremental evaluation of this store renders again only what
    /// changed. A kind whose index is `from`'s already is not looked at.
    /// Whether any object differed.
    pub fn follow(&mut self, from: &ObjectStore) -> bool {
        let mut changed = false;
        let gone: Vec<GroupKind> = self
            .kinds
            .keys()
            .filter(|gk| !from.kinds.contains_key(*gk))
            .cloned()
            .collect();
        for gk in gone {
            changed |= self.kinds.get(&gk).is_some_and(|m| !m.is_empty());
            self.clear_kind(&gk);
        }
        for (gk, theirs) in &from.kinds {
            let ours = self.kinds.get(gk).cloned().unwrap_or_default();
            if Arc::ptr_eq(&ours, theirs) {
                continue;
            }
            let mut differ: Vec<ObjectKey> = ours
                .iter()
                .filter(|(key, obj)| {
                    theirs
                        .get(*key)
                        .is_none_or(|t| !Arc::ptr_eq(obj, t) && !same_version(obj, t))
                })
                .map(|(key, _)| key.clone())
                .collect();
            differ.extend(theirs.keys().filter(|k| !ours.contains_key(*k)).cloned());
            drop(ours);
            self.kinds.insert(gk.clone(), Arc::clone(theirs));
            changed |= !differ.is_empty();
            for key in differ {
                self.journal_change(gk, key);
            }
        }
        changed
    }

    /// Kinds whose index this store shares with `other` (the same one, not
    /// an equal copy): what [`ObjectStore::follow`] and a clone share.
    pub fn shared_kinds(&self, other: &ObjectStore) -> usize {
        self.kinds
            .iter()
            .filter(|(gk, m)| other.kinds.get(*gk).is_some_and(|o| Arc::ptr_eq(m, o)))
            .count()
    }

    /// One object, shared.
    pub fn get_shared(&self, gk: &GroupKind, key: &ObjectKey) -> Option<&Arc<Value>> {
        self.kinds.get(gk).and_then(|m| m.get(key))
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

    /// Every object of a kind with its key, sorted by namespace and name.
    pub fn entries(&self, gk: &GroupKind) -> impl Iterator<Item = (&ObjectKey, &Arc<Value>)> {
        self.kinds.get(gk).into_iter().flat_map(|m| m.iter())
    }

    /// Every object of a kind in one namespace, with its key.
    pub fn entries_namespace<'a>(
        &'a self,
        gk: &GroupKind,
        ns: &str,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)> + use<'a> {
        let ns = ns.to_string();
        self.kinds.get(gk).into_iter().flat_map(move |m| {
            let inner = ns.clone();
            m.range((ns.clone(), String::new())..)
                .take_while(move |((n, _), _)| *n == inner)
        })
    }

    /// Kinds present.
    pub fn kinds(&self) -> impl Iterator<Item = &GroupKind> {
        self.kinds.keys()
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.kinds.values().map(|m| m.len()).sum()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ns(name: &str, rv: &str) -> Arc<Value> {
        Arc::new(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "resourceVersion": rv}}))
    }

    fn changed(s: &ObjectStore, since: (u64, u64)) -> Vec<String> {
        let mut out: Vec<String> = s
            .changes_since(since)
            .expect("journal")
            .map(|(_, k)| k.1.clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    #[test]
    fn the_journal_tells_what_changed_since_a_version() {
        let mut s = ObjectStore::new();
        let gk = GroupKind::new("", "Namespace");
        s.insert_shared(ns("a", "1")).expect("insert");
        s.insert_shared(ns("b", "1")).expect("insert");
        let v = s.version();
        // The same version again is no change.
        s.insert_shared(ns("a", "1")).expect("insert");
        assert_eq!(s.version(), v);
        s.insert_shared(ns("a", "2")).expect("insert");
        s.remove(&gk, &(String::new(), "b".into()));
        assert_eq!(changed(&s, v), ["a", "b"]);
        // A relist journals only the differences.
        let v = s.version();
        let errors = s.replace_kind(&gk, vec![ns("a", "2"), ns("c", "1")]);
        assert!(errors.is_empty());
        assert_eq!(changed(&s, v), ["c"]);
        // Another store, or a clone, cannot answer for this one.
        assert!(s.clone().changes_since(s.version()).is_none());
        assert!(ObjectStore::new().changes_since(v).is_none());
    }

    #[test]
    fn a_follower_shares_each_kinds_index_and_journals_only_what_differs() {
        let mut world = ObjectStore::new();
        let gk = GroupKind::new("", "Namespace");
        world.insert_shared(ns("a", "1")).expect("insert");
        world.insert_shared(ns("b", "1")).expect("insert");
        let mut lane = ObjectStore::new();
        assert!(lane.follow(&world));
        assert_eq!(lane.len(), 2);
        // Shared, not copied: the same index, and no object copied.
        assert_eq!(lane.shared_kinds(&world), 1);
        let a = world
            .get_shared(&gk, &(String::new(), "a".into()))
            .expect("a");
        assert_eq!(Arc::strong_count(a), 1);
        // Nothing changed: nothing to journal, the index not looked at.
        let v = lane.version();
        assert!(!lane.follow(&world));
        assert_eq!(lane.version(), v);
        // The world changes: its index is its own from then on (copy on
        // write), the follower keeps what it saw until it follows again.
        world.insert_shared(ns("a", "2")).expect("insert");
        world.remove(&gk, &(String::new(), "b".into()));
        world.insert_shared(ns("c", "1")).expect("insert");
        assert_eq!(lane.shared_kinds(&world), 0);
        assert_eq!(
            lane.get(&gk, &(String::new(), "a".into())).expect("a")["metadata"]["resourceVersion"],
            "1"
        );
        assert!(lane.get(&gk, &(String::new(), "b".into())).is_some());
        assert!(lane.follow(&world));
        assert_eq!(changed(&lane, v), ["a", "b", "c"]);
        assert_eq!(lane.shared_kinds(&world), 1);
        // A kind gone from the world goes from the follower.
        world.clear_kind(&gk);
        let v = lane.version();
        assert!(lane.follow(&world));
        assert!(lane.is_empty());
        assert_eq!(changed(&lane, v), ["a", "c"]);
    }

    #[test]
    fn a_journal_read_through_is_forgotten_and_a_reader_behind_starts_over() {
        let mut s = ObjectStore::new();
        s.insert_shared(ns("a", "1")).expect("insert");
        let behind = s.version();
        s.insert_shared(ns("b", "1")).expect("insert");
        let read = s.version();
        s.insert_shared(ns("c", "1")).expect("insert");
        s.forget_through(read);
        assert_eq!(s.journal.len(), 1);
        // A reader at the version forgotten through still learns what
        // came after; one behind it cannot be told.
        assert_eq!(changed(&s, read), ["c"]);
        assert!(s.changes_since(behind).is_none());
        // Another store's version, or an older one, forgets nothing.
        s.forget_through(ObjectStore::new().version());
        s.forget_through(behind);
        assert_eq!(changed(&s, read), ["c"]);
        s.forget_through(s.version());
        assert!(s.journal.is_empty());
        assert_eq!(s.changes_since(s.version()).map(Iterator::count), Some(0));
    }
}
