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

use super::memo::{Changes, OwnerFilter};
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
    /// Brings the index up to date with `observed` after `changes` (the
    /// store's changed keys): what changed is listed again; when
    /// everything may have changed, it starts over.
    pub(in crate::engine) fn update(&mut self, changes: &Changes, observed: &ObjectStore) {
        if changes.all {
            self.kinds.clear();
            return;
        }
        for (gk, owners) in &mut self.kinds {
            for key in changes.keys.get(gk).into_iter().flatten() {
                owners.remove(key);
                if let Some(obj) = observed.get(gk, key) {
                    owners.add(key, obj);
                }
            }
        }
    }

    /// The keys of the objects of kind `gk` (in namespace `ns`, when
    /// given) that may pass `owner`, sorted: every object that does, and
    /// maybe others; `None` when the filter names no uid to look up by
    /// (a controller matched by kind and name).
    pub(in crate::engine) fn candidates(
        &mut self,
        gk: &GroupKind,
        ns: Option<&str>,
        owner: &OwnerFilter,
        observed: &ObjectStore,
    ) -> Option<BTreeSet<ObjectKey>> {
        let uids: Vec<&str> = match owner {
            // A reference without a uid matches by kind and name.
            OwnerFilter::Controller(o) if !o.uid.is_empty() => vec![o.uid.as_str(), ""],
            OwnerFilter::Controller(_) => return None,
            // Only references with a uid count.
            OwnerFilter::AnyOf(uids) => uids.iter().map(String::as_str).collect(),
            // Only a controller with a uid counts.
            OwnerFilter::Lineage(owners) => owners.keys().map(String::as_str).collect(),
        };
        let owners = self.kinds.entry(gk.clone()).or_insert_with(|| {
            let mut k = KindOwners::default();
            for (key, obj) in observed.entries(gk) {
                k.add(key, obj);
            }
            k
        });
        let mut keys = BTreeSet::new();
        for u in uids {
            for key in owners.by_uid.get(u).into_iter().flatten() {
                if ns.is_none_or(|ns| key.0 == ns) {
                    keys.insert(key.clone());
                }
            }
        }
        Some(keys)
    }

    /// Entries held: one per ownerReference of the objects of the kinds
    /// indexed (bounded by the store).
    pub fn entries(&self) -> usize {
        self.kinds.values().map(KindOwners::entries).sum()
    }
}
