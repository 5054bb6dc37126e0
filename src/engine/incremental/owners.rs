//! The observed objects of a kind by the uids of their owners: a related
//! set filtered by owner (`controlledByTrigger`, `ownedBy`,
//! `controlledBy`, `notOlderThan`) looks up the objects of its owners
//! instead of walking every object of the kind (the provider and XRD
//! rules read a few of thousands of CRDs). Built for a kind when first
//! asked, kept up to date from the changed keys, so a change costs what
//! changed; it holds one entry per ownerReference of the kinds asked
//! ([`OwnerIndex::entries`]), never more than the store holds.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;

use crate::engine::fast_hash::HashMap;
use crate::engine::store::{GroupKind, ObjectKey, ObjectStore};

/// One kind's objects by owner.
#[derive(Default)]
struct KindOwners {
    /// Objects by the uid of each of their ownerReferences (controller or
    /// not; `""` for a reference without one).
    by_uid: HashMap<Arc<str>, BTreeSet<ObjectKey>>,
    /// The uids each object is listed under, to take it out when it
    /// changes.
    of: HashMap<ObjectKey, Vec<Arc<str>>>,
}

impl KindOwners {
    fn add(&mut self, key: &ObjectKey, obj: &Value) {
        let mut uids: Vec<Arc<str>> = obj["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| Arc::from(r["uid"].as_str().unwrap_or_default()))
            .collect();
        if uids.is_empty() {
            return;
        }
        uids.sort_unstable();
        uids.dedup();
        for u in &uids {
            self.by_uid
                .entry(Arc::clone(u))
                .or_default()
                .insert(key.clone());
        }
        self.of.insert(key.clone(), uids);
    }

    fn remove(&mut self, key: &ObjectKey) {
        for u in self.of.remove(key).unwrap_or_default() {
            if let Some(keys) = self.by_uid.get_mut(&u) {
                keys.remove(key);
                if keys.is_empty() {
                    self.by_uid.remove(&u);
                }
            }
        }
    }

    fn entries(&self) -> usize {
        self.of.values().map(Vec::len).sum()
    }
}

/// The observed objects of the kinds asked, by owner uid (see the module
/// doc).
#[derive(Default)]
pub(crate) struct OwnerIndex {
    kinds: HashMap<GroupKind, KindOwners>,
}

impl OwnerIndex {
    /// Brings the index up to date with `observed` after the store's
    /// changed keys (`changed`): what changed is listed again; when
    /// everything may have changed (`all`), it starts over.
    pub(in crate::engine) fn update(
        &mut self,
        (all, changed): (bool, &HashMap<GroupKind, BTreeSet<ObjectKey>>),
        observed: &ObjectStore,
    ) {
        if all {
            self.kinds.clear();
            return;
        }
        for (gk, owners) in &mut self.kinds {
            for key in changed.get(gk).into_iter().flatten() {
                owners.remove(key);
                if let Some(obj) = observed.get(gk, key) {
                    owners.add(key, obj);
                }
            }
        }
    }

    /// The keys of the objects of kind `gk` (in namespace `ns`, when
    /// given) with an ownerReference of one of `uids` (`""`: a reference
    /// without a uid), sorted; borrowed from the index, not copied (a
    /// family's lookup finds hundreds of CRDs, two strings each).
    pub(in crate::engine) fn candidates(
        &mut self,
        gk: &GroupKind,
        ns: Option<&str>,
        uids: &[&str],
        observed: &ObjectStore,
    ) -> Vec<&ObjectKey> {
        let owners: &KindOwners = self.kinds.entry(gk.clone()).or_insert_with(|| {
            let mut k = KindOwners::default();
            for (key, obj) in observed.entries(gk) {
                k.add(key, obj);
            }
            k
        });
        let mut keys: Vec<&ObjectKey> = Vec::new();
        let mut lists = 0;
        for keys_of in uids.iter().filter_map(|u| owners.by_uid.get(*u)) {
            lists += 1;
            keys.extend(keys_of.iter().filter(|k| ns.is_none_or(|ns| k.0 == ns)));
        }
        // One uid's keys are sorted already; several are merged (an
        // object can name more than one of them).
        if lists > 1 {
            keys.sort_unstable();
            keys.dedup();
        }
        keys
    }

    /// Entries held: one per ownerReference of the objects of the kinds
    /// indexed (bounded by the store).
    pub fn entries(&self) -> usize {
        self.kinds.values().map(KindOwners::entries).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A ConfigMap in `ns` with ownerReferences of `uids`.
    fn owned(ns: &str, name: &str, uids: &[&str]) -> Value {
        let refs: Vec<Value> = uids.iter().map(|u| json!({"uid": u})).collect();
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "ownerReferences": refs},
        })
    }

    /// Objects of several owners are found once each, sorted, only in
    /// the namespace asked; a changed object is found by its new owners.
    #[test]
    fn candidates_of_several_owners_are_sorted_once_each_in_the_namespace_asked() {
        let mut store = ObjectStore::new();
        for o in [
            owned("a", "z", &["u1", "u2"]),
            owned("a", "m", &["u2"]),
            owned("a", "b", &["u1"]),
            owned("b", "c", &["u1"]),
            owned("a", "n", &["u3"]),
        ] {
            assert!(store.insert(o).is_ok());
        }
        let gk = GroupKind::new("", "ConfigMap");
        let mut index = OwnerIndex::default();
        let names = |keys: Vec<&ObjectKey>| -> Vec<String> {
            keys.iter().map(|k| format!("{}/{}", k.0, k.1)).collect()
        };
        let got = names(index.candidates(&gk, None, &["u2", "u1"], &store));
        assert_eq!(got, ["a/b", "a/m", "a/z", "b/c"]);
        let got = names(index.candidates(&gk, Some("a"), &["u1", "u2"], &store));
        assert_eq!(got, ["a/b", "a/m", "a/z"]);
        let got = names(index.candidates(&gk, None, &["u1"], &store));
        assert_eq!(got, ["a/b", "a/z", "b/c"]);
        assert!(index.candidates(&gk, None, &["none"], &store).is_empty());
        // z leaves u1 for u3.
        assert!(store.insert(owned("a", "z", &["u3"])).is_ok());
        let key = ("a".to_string(), "z".to_string());
        let changed: HashMap<GroupKind, BTreeSet<ObjectKey>> =
            [(gk.clone(), BTreeSet::from([key]))].into_iter().collect();
        index.update((false, &changed), &store);
        let got = names(index.candidates(&gk, None, &["u1", "u3"], &store));
        assert_eq!(got, ["a/b", "a/n", "a/z", "b/c"]);
        let got = names(index.candidates(&gk, None, &["u2"], &store));
        assert_eq!(got, ["a/m"]);
    }
}
