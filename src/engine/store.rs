//! The observed objects the engine reads, indexed by group and kind.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use serde_json::Value;

use super::packed::Held;

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
///
/// The kinds named by [`ObjectStore::pack_kinds`] (those rules read only
/// as triggers) are held as compact text ([`super::packed`]): read them
/// with [`ObjectStore::get_owned`] and [`ObjectStore::keys`]. The other
/// readers still see them, as trees read back once per kind and kept until
/// the kind changes ([`ObjectStore::trees_read_back`] counts those).
#[derive(Debug)]
pub struct ObjectStore {
    kinds: BTreeMap<GroupKind, Arc<Kind>>,
    /// The kinds held packed.
    packs: BTreeSet<GroupKind>,
    /// How many times a packed kind was read back whole for a reader of
    /// trees (see [`ObjectStore::trees_read_back`]).
    read_back: AtomicU64,
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
#[derive(Debug, Default)]
struct Kind {
    objects: BTreeMap<ObjectKey, Held>,
    /// How many of them are packed: with none, every reader of trees reads
    /// `objects` in place.
    packed: usize,
    /// Every object as a tree, read back on the first read of a tree of a
    /// kind holding packed ones; dropped with any change.
    trees: OnceLock<BTreeMap<ObjectKey, Arc<Value>>>,
}

impl Clone for Kind {
    fn clone(&self) -> Self {
        Kind {
            objects: self.objects.clone(),
            packed: self.packed,
            trees: OnceLock::new(),
        }
    }
}

impl Kind {
    /// Adds or replaces one object; the one it replaced.
    fn insert(&mut self, key: ObjectKey, held: Held) -> Option<Held> {
        self.packed += usize::from(held.is_packed());
        let old = self.objects.insert(key, held);
        self.forgot(old)
    }

    /// Removes one object.
    fn remove(&mut self, key: &ObjectKey) -> Option<Held> {
        let old = self.objects.remove(key);
        self.forgot(old)
    }

    fn forgot(&mut self, old: Option<Held>) -> Option<Held> {
        self.packed -= usize::from(old.as_ref().is_some_and(Held::is_packed));
        self.trees.take();
        old
    }

    fn len(&self) -> usize {
        self.objects.len()
    }

    fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(1);

impl Default for ObjectStore {
    fn default() -> Self {
        ObjectStore {
            kinds: BTreeMap::new(),
            packs: BTreeSet::new(),
            read_back: AtomicU64::new(0),
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
            packs: self.packs.clone(),
            ..ObjectStore::default()
        }
    }
}

/// Whether two versions of an object are the same: by resourceVersion,
/// which changes with every write, or by content where there is none
/// (offline renders, tests).
fn same_version(a: &Held, b: &Held) -> bool {
    if a.ptr_eq(b) {
        return true;
    }
    match (a.version(), b.version()) {
        (Some(x), Some(y)) => x == y,
        _ => a.tree() == b.tree(),
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

    /// Like [`ObjectStore::insert`], for an object shared with others (a
    /// kind held packed keeps it as text, not shared).
    pub fn insert_shared(&mut self, obj: Arc<Value>) -> Result<(), String> {
        let gk = GroupKind::of(&obj).ok_or("object has no apiVersion or kind")?;
        let key = key_of(&obj).ok_or_else(|| format!("{gk} has no metadata.name"))?;
        let pack = self.packs.contains(&gk);
        let objects = self.kinds.entry(gk.clone()).or_default();
        let old = objects.objects.get(&key);
        if old
            .and_then(Held::as_tree)
            .is_some_and(|old| Arc::ptr_eq(old, &obj))
        {
            // Nothing to write: a shared index stays shared.
            return Ok(());
        }
        let held = Held::new(obj, pack);
        let same = old.is_some_and(|old| same_version(old, &held));
        Arc::make_mut(objects).insert(key.clone(), held);
        if !same {
            self.journal_change(&gk, key);
        }
        Ok(())
    }

    /// Holds the objects of `kinds` packed from now on, and those of every
    /// other kind as trees (each object held the other way is converted;
    /// nothing is journaled: no object changed). The controller packs the
    /// kinds its rules read only as triggers
    /// ([`super::compile::Interest::packable`]).
    pub fn pack_kinds(&mut self, kinds: BTreeSet<GroupKind>) {
        if kinds == self.packs {
            return;
        }
        for (gk, objects) in &mut self.kinds {
            let pack = kinds.contains(gk);
            if pack == self.packs.contains(gk) && (pack || objects.packed == 0) {
                continue;
            }
            let mut fresh = Kind::default();
            for (k, h) in &objects.objects {
                fresh.insert(k.clone(), h.repacked(pack));
            }
            *objects = Arc::new(fresh);
        }
        self.packs = kinds;
    }

    /// The kinds held packed.
    pub fn packed_kinds(&self) -> &BTreeSet<GroupKind> {
        &self.packs
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
        if !objects.objects.contains_key(key) {
            return None;
        }
        let gone = Arc::make_mut(objects).remove(key)?;
        self.journal_change(gk, key.clone());
        match gone {
            Held::Tree(v) => Some(Arc::unwrap_or_clone(v)),
            packed => packed.tree().map(Arc::unwrap_or_clone),
        }
    }

    /// Drops every object of a kind (a fresh list replaces them).
    pub fn clear_kind(&mut self, gk: &GroupKind) {
        if let Some(gone) = self.kinds.remove(gk) {
            for key in gone.objects.keys() {
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
        let pack = self.packs.contains(gk);
        let mut fresh = Kind::default();
        for obj in objects {
            match key_of(&obj) {
                Some(key) if GroupKind::of(&obj).as_ref() == Some(gk) => {
                    fresh.insert(key, Held::new(obj, pack));
                }
                _ => errors.push(format!("{gk}: object without a name, or of another kind")),
            }
        }
        let old = self.kinds.remove(gk).unwrap_or_default();
        let mut changed: Vec<ObjectKey> = Vec::new();
        for (key, obj) in old.objects.iter() {
            match fresh.objects.get(key) {
                Some(new) if same_version(obj, new) => {}
                _ => changed.push(key.clone()),
            }
        }
        changed.extend(
            fresh
                .objects
                .keys()
                .filter(|k| !old.objects.contains_key(*k))
                .cloned(),
        );
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
                .objects
                .iter()
                .filter(|(key, obj)| {
                    theirs
                        .objects
                        .get(*key)
                        .is_none_or(|t| !same_version(obj, t))
                })
                .map(|(key, _)| key.clone())
                .collect();
            differ.extend(
                theirs
                    .objects
                    .keys()
                    .filter(|k| !ours.objects.contains_key(*k))
                    .cloned(),
            );
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

    /// One kind's objects as trees: in place when none is packed, else
    /// read back once (see [`ObjectStore::trees_read_back`]).
    fn trees(&self, gk: &GroupKind) -> Option<Trees<'_>> {
        let kind = self.kinds.get(gk)?;
        if kind.packed == 0 {
            return Some(Trees::InPlace(&kind.objects));
        }
        Some(Trees::ReadBack(kind.trees.get_or_init(|| {
            self.read_back.fetch_add(1, Ordering::Relaxed);
            kind.objects
                .iter()
                .filter_map(|(k, h)| Some((k.clone(), h.tree()?)))
                .collect()
        })))
    }

    /// How many times a kind held packed was read back whole because a
    /// reader asked for its objects as shared trees ([`ObjectStore::get`],
    /// [`ObjectStore::list`], …) rather than one at a time
    /// ([`ObjectStore::get_owned`]): what a packed kind should never need.
    pub fn trees_read_back(&self) -> u64 {
        self.read_back.load(Ordering::Relaxed)
    }

    /// One object, shared.
    pub fn get_shared(&self, gk: &GroupKind, key: &ObjectKey) -> Option<&Arc<Value>> {
        let kind = self.kinds.get(gk)?;
        match kind.objects.get(key)? {
            Held::Tree(v) => Some(v),
            Held::Packed(_) => match self.trees(gk)? {
                Trees::ReadBack(t) => t.get(key),
                Trees::InPlace(_) => None,
            },
        }
    }

    /// One object.
    pub fn get(&self, gk: &GroupKind, key: &ObjectKey) -> Option<&Value> {
        self.get_shared(gk, key).map(|v| &**v)
    }

    /// One object, owned: a packed one is read back for this reader alone
    /// and is gone when it lets go (the way to read a kind held packed).
    pub fn get_owned(&self, gk: &GroupKind, key: &ObjectKey) -> Option<Arc<Value>> {
        self.kinds.get(gk)?.objects.get(key)?.tree()
    }

    /// The keys of a kind's objects, sorted by namespace and name.
    pub fn keys(&self, gk: &GroupKind) -> impl Iterator<Item = &ObjectKey> {
        self.kinds
            .get(gk)
            .into_iter()
            .flat_map(|m| m.objects.keys())
    }

    /// Every object of a kind, sorted by namespace and name.
    pub fn list(&self, gk: &GroupKind) -> impl Iterator<Item = &Value> {
        self.entries(gk).map(|(_, v)| &**v)
    }

    /// Every object of a kind in one namespace.
    pub fn list_namespace<'a>(
        &'a self,
        gk: &GroupKind,
        ns: &str,
    ) -> impl Iterator<Item = &'a Value> + use<'a> {
        self.entries_namespace(gk, ns).map(|(_, v)| &**v)
    }

    /// Every object of a kind with its key, sorted by namespace and name.
    pub fn entries(&self, gk: &GroupKind) -> impl Iterator<Item = (&ObjectKey, &Arc<Value>)> {
        self.trees(gk).into_iter().flat_map(Trees::all)
    }

    /// Every object of a kind in one namespace, with its key.
    pub fn entries_namespace<'a>(
        &'a self,
        gk: &GroupKind,
        ns: &str,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)> + use<'a> {
        let ns = ns.to_string();
        self.trees(gk)
            .into_iter()
            .flat_map(move |t| t.namespace(ns.clone()))
    }

    /// Kinds present.
    pub fn kinds(&self) -> impl Iterator<Item = &GroupKind> {
        self.kinds.keys()
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.kinds.values().map(|m| m.len()).sum()
    }

    /// Bytes of packed text held (for memory reports).
    pub fn packed_bytes(&self) -> usize {
        self.kinds
            .values()
            .flat_map(|k| k.objects.values())
            .map(|h| match h {
                Held::Packed(p) => p.bytes(),
                Held::Tree(_) => 0,
            })
            .sum()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One kind's objects as trees: where they are held as such, or read back.
#[derive(Clone, Copy)]
enum Trees<'a> {
    InPlace(&'a BTreeMap<ObjectKey, Held>),
    ReadBack(&'a BTreeMap<ObjectKey, Arc<Value>>),
}

impl<'a> Trees<'a> {
    /// Every object with its key. In place, every object is a tree.
    fn all(self) -> Box<dyn Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)> + 'a> {
        match self {
            Trees::InPlace(m) => Box::new(m.iter().filter_map(|(k, h)| Some((k, h.as_tree()?)))),
            Trees::ReadBack(m) => Box::new(m.iter()),
        }
    }

    /// The objects of one namespace with their keys.
    fn namespace(
        self,
        ns: String,
    ) -> Box<dyn Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)> + 'a> {
        match self {
            Trees::InPlace(m) => {
                Box::new(in_namespace(m, ns).filter_map(|(k, h)| Some((k, h.as_tree()?))))
            }
            Trees::ReadBack(m) => Box::new(in_namespace(m, ns)),
        }
    }
}

/// The entries of `m` in namespace `ns` (keys sort by namespace first).
fn in_namespace<V>(
    m: &BTreeMap<ObjectKey, V>,
    ns: String,
) -> impl Iterator<Item = (&ObjectKey, &V)> {
    m.range((ns.clone(), String::new())..)
        .take_while(move |((n, _), _)| *n == ns)
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

    #[test]
    fn a_packed_kind_is_read_one_object_at_a_time_and_journals_as_a_tree_would() {
        let gk = GroupKind::new("", "Namespace");
        let key = |n: &str| (String::new(), n.to_string());
        let mut s = ObjectStore::new();
        s.insert_shared(ns("a", "1")).expect("insert");
        s.pack_kinds(BTreeSet::from([gk.clone()]));
        // Converted where it lies: no object changed, nothing journaled.
        let v = s.version();
        s.insert_shared(ns("b", "1")).expect("insert");
        assert_eq!(changed(&s, v), ["b"]);
        assert!(s.packed_bytes() > 0);
        // The same version again is no change, packed or not.
        let v = s.version();
        s.insert_shared(ns("a", "1")).expect("insert");
        assert_eq!(s.version(), v);
        s.insert_shared(ns("a", "2")).expect("insert");
        assert_eq!(changed(&s, v), ["a"]);
        // Read one at a time: keys, and an owned copy of each.
        assert_eq!(
            s.keys(&gk).map(|k| k.1.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(s.get_owned(&gk, &key("a")), Some(ns("a", "2")));
        assert_eq!(s.get_owned(&gk, &key("c")), None);
        assert_eq!(s.trees_read_back(), 0);
        // A reader of trees still sees every object, read back once for
        // all such reads until the kind changes.
        assert_eq!(s.get(&gk, &key("b")), Some(&*ns("b", "1")));
        assert_eq!(s.list(&gk).count(), 2);
        assert_eq!(s.list_namespace(&gk, "").count(), 2);
        assert_eq!(s.entries_namespace(&gk, "x").count(), 0);
        assert_eq!(s.trees_read_back(), 1);
        s.insert_shared(ns("c", "1")).expect("insert");
        assert_eq!(s.entries(&gk).count(), 3);
        assert_eq!(s.trees_read_back(), 2);
        // Removed: the object as it was.
        assert_eq!(s.remove(&gk, &key("c")), Some((*ns("c", "1")).clone()));
        // A relist of equal versions journals nothing.
        let v = s.version();
        assert!(
            s.replace_kind(&gk, vec![ns("a", "2"), ns("b", "1")])
                .is_empty()
        );
        assert_eq!(changed(&s, v), Vec::<String>::new());
        // A follower shares the packed index; unpacked, the same objects.
        let mut lane = ObjectStore::new();
        assert!(lane.follow(&s));
        assert_eq!(lane.get_owned(&gk, &key("b")), Some(ns("b", "1")));
        s.pack_kinds(BTreeSet::new());
        assert_eq!(s.packed_bytes(), 0);
        let reads = s.trees_read_back();
        assert_eq!(s.get(&gk, &key("a")), Some(&*ns("a", "2")));
        assert_eq!(s.trees_read_back(), reads);
        assert!(!lane.follow(&s), "the same versions: nothing differs");
    }
}
