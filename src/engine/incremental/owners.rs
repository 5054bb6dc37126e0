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
    /// without a uid), sorted.
    pub(in crate::engine) fn candidates(
        &mut self,
        gk: &GroupKind,
        ns: Option<&str>,
        uids: &[&str],
        observed: &ObjectStore,
    ) -> BTreeSet<ObjectKey> {
        let owners = self.kinds.entry(gk.clone()).or_insert_with(|| {
            let mut k = KindOwners::default();
            for (key, obj) in observed.entries(gk) {
                k.add(key, obj);
            }
            k
        });
        let mut keys = BTreeSet::new();
        for u in uids {
            for key in owners.by_uid.get(*u).into_iter().flatten() {
                if ns.is_none_or(|ns| key.0 == ns) {
                    keys.insert(key.clone());
                }
            }
        }
        keys
    }

    /// Entries held: one per ownerReference of the objects of the kinds
    /// indexed (bounded by the store).
    pub fn entries(&self) -> usize {
        self.kinds.values().map(KindOwners::entries).sum()
    }
}
