//! The kinds the rules read: which ones (the rules' interests), the watch
//! on each (started, restarted with a new epoch, no longer served), and
//! the store of their objects that the watch events keep.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::runtime::watcher::Event;
use serde_json::Value;

use super::World;
use super::listing::{KindWatch, Listing};
use crate::api::ManageLevel;
use crate::controller::live::ObjectId;
use crate::engine::compile::output_kind;
use crate::engine::store::key_of;
use crate::engine::{GroupKind, Interest, Options, RuleSource};

impl World {
    /// Whether `o` changes what the store holds under `k`: a new
    /// resourceVersion alone does not ([`same_but_version`]).
    fn changes_stored(
        &self,
        gk: &GroupKind,
        k: &crate::engine::store::ObjectKey,
        o: &Value,
    ) -> bool {
        // One at a time: the kind may be held packed.
        !self
            .store
            .get_owned(gk, k)
            .is_some_and(|old| same_but_version(&old, o))
    }

    /// An event of the watch on a kind the rules read (of its current
    /// `epoch`; a stopped watch's late events are dropped); whether it
    /// changed the store. As for the output kinds, a list is applied
    /// object by object (an unchanged object keeps its stored copy) and
    /// what it no longer holds is swept at its end, which is also when it
    /// counts as a change.
    pub(super) fn apply_kind_event(
        &mut self,
        gk: &GroupKind,
        epoch: u64,
        ev: Event<Value>,
    ) -> bool {
        let Some(w) = self.kinds.get_mut(gk).filter(|w| w.epoch == epoch) else {
            return false;
        };
        match ev {
            Event::Init => {
                w.seen = Some(BTreeSet::new());
                false
            }
            Event::InitApply(o) => {
                if let Some(k) = key_of(&o) {
                    w.seen.get_or_insert_with(BTreeSet::new).insert(k.clone());
                    if self.changes_stored(gk, &k, &o) {
                        let _ = self.store.insert(o);
                    }
                }
                false
            }
            Event::InitDone => {
                let seen = w.seen.take().unwrap_or_default();
                w.listing.synced = true;
                w.listing.error = None;
                let gone: Vec<_> = self
                    .store
                    .keys(gk)
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                for k in gone {
                    self.store.remove(gk, &k);
                }
                true
            }
            Event::Apply(o) => {
                let differs = key_of(&o).is_some_and(|k| self.changes_stored(gk, &k, &o));
                if differs {
                    let _ = self.store.insert(o);
                }
                differs
            }
            Event::Delete(o) => match key_of(&o) {
                Some(k) => self.store.remove(gk, &k).is_some(),
                None => false,
            },
        }
    }

    /// Recomputes the kinds each rule reads and the merged interests.
    pub(in crate::controller) fn interests(
        &mut self,
        manage: ManageLevel,
    ) -> BTreeMap<GroupKind, Interest> {
        // The engine checks what bindings and aggregations grant against
        // every ClusterRole and Role (with or without an allow-list, when
        // a rule emits either); with an allow-list, every output: the
        // (empty) placeholder makes the interests include them.
        let options = Options {
            manage,
            allow: self.allow_name.as_ref().map(|_| Default::default()),
            tenancy: self.tenancy.clone(),
            ..Options::default()
        };
        self.rule_kinds
            .retain(|name, _| self.rules.contains_key(name));
        for (name, rule) in &self.rules {
            if self
                .rule_kinds
                .get(name)
                .is_some_and(|(spec, _)| *spec == rule.spec)
            {
                continue;
            }
            let source = RuleSource {
                name: name.clone(),
                spec: rule.spec.clone(),
                namespace: crate::controller::tenants::namespace_of(name),
            };
            let kinds = crate::engine::interests(std::slice::from_ref(&source), &options)
                .into_iter()
                .map(|i| i.gk)
                .collect();
            self.rule_kinds
                .insert(name.clone(), (rule.spec.clone(), kinds));
        }
        let sources: Vec<RuleSource> = self
            .rules
            .iter()
            .map(|(name, r)| RuleSource {
                name: name.clone(),
                spec: r.spec.clone(),
                namespace: crate::controller::tenants::namespace_of(name),
            })
            .collect();
        crate::engine::interests(&sources, &options)
            .into_iter()
            .map(|i| (i.gk.clone(), i))
            .collect()
    }

    /// Holds packed the objects of the kinds every rule in `wanted` reads
    /// one at a time (as triggers): the Namespaces of a cluster, above all,
    /// are a compact text each instead of a JSON tree
    /// ([`crate::engine::packed`]).
    pub(in crate::controller) fn pack_kinds(&mut self, wanted: &BTreeMap<GroupKind, Interest>) {
        self.store
            .pack_kinds(crate::engine::shape::packable_kinds(wanted.values()));
    }

    /// Kinds watched or waiting for discovery that `wanted` does not name.
    pub(in crate::controller) fn kinds_not_in(
        &self,
        wanted: &BTreeMap<GroupKind, Interest>,
    ) -> Vec<GroupKind> {
        self.kinds
            .keys()
            .filter(|gk| !wanted.contains_key(*gk))
            .cloned()
            .collect()
    }

    /// Stops tracking a kind and drops its objects (of an output kind, the
    /// ones that are not ours).
    pub(in crate::controller) fn forget_kind(&mut self, gk: &GroupKind) {
        self.kinds.remove(gk);
        self.store.clear_kind(gk);
        if let Some(kind) = output_kind(gk) {
            let ours: Vec<(ObjectId, Option<Arc<Value>>)> = self
                .owned
                .iter()
                .filter(|(id, _)| id.kind == kind)
                .map(|(id, l)| (id.clone(), l.shared().cloned()))
                .collect();
            for (id, o) in ours {
                self.mirror(&id, o.as_ref());
            }
        }
    }

    /// The interest a kind is watched with.
    pub(in crate::controller) fn interest_of(&self, gk: &GroupKind) -> Option<&Interest> {
        self.kinds.get(gk).map(|w| &w.interest)
    }

    /// Whether a watch on the kind runs.
    pub(in crate::controller) fn is_watching(&self, gk: &GroupKind) -> bool {
        self.kinds.get(gk).is_some_and(|w| w.watching)
    }

    /// Interests of kinds that were not served when last discovered.
    pub(in crate::controller) fn unresolved_interests(&self) -> Vec<Interest> {
        self.kinds
            .values()
            .filter(|w| w.unresolved.is_some())
            .map(|w| w.interest.clone())
            .collect()
    }

    /// A fresh epoch for a (re)started watch.
    pub(in crate::controller) fn next_epoch(&mut self) -> u64 {
        let e = self.next_epoch;
        self.next_epoch += 1;
        e
    }

    /// Records a (re)started watch of `interest` (or why there is none).
    /// Objects of an earlier list stay until the new list replaces them.
    pub(in crate::controller) fn watch_kind(
        &mut self,
        interest: Interest,
        epoch: u64,
        unresolved: Option<String>,
    ) {
        self.kinds.insert(
            interest.gk.clone(),
            KindWatch {
                interest,
                watching: unresolved.is_none(),
                unresolved,
                epoch,
                listing: Listing::default(),
                seen: None,
            },
        );
    }

    /// Number of kinds watched.
    pub fn watched_kinds(&self) -> usize {
        self.kinds.values().filter(|w| w.watching).count()
    }

    /// Whether some kind waits for rediscovery.
    pub fn has_unresolved(&self) -> bool {
        self.kinds.values().any(|w| w.unresolved.is_some())
    }
}

/// Whether `new` differs from `old` in `metadata.resourceVersion` alone:
/// the server bumps it on every write, also of what the watch cut away (a
/// status update of a kind read by `fields` or `metadataOnly`). Such an
/// event changes nothing a rule sees, so the stored copy stays: rules see
/// the resourceVersion of the last version that changed anything else.
fn same_but_version(old: &Value, new: &Value) -> bool {
    let (Some(a), Some(b)) = (old.as_object(), new.as_object()) else {
        return old == new;
    };
    fn meta(m: &serde_json::Map<String, Value>) -> Option<&serde_json::Map<String, Value>> {
        m.get("metadata").and_then(Value::as_object)
    }
    // Entries besides resourceVersion, all of them equal.
    let same =
        |x: &serde_json::Map<String, Value>, y: &serde_json::Map<String, Value>, skip: &str| {
            let n = |m: &serde_json::Map<String, Value>| m.keys().filter(|k| *k != skip).count();
            n(x) == n(y) && x.iter().all(|(k, v)| k == skip || y.get(k) == Some(v))
        };
    same(a, b, "metadata")
        && match (meta(a), meta(b)) {
            (Some(x), Some(y)) => same(x, y, "resourceVersion"),
            _ => a.get("metadata") == b.get("metadata"),
        }
}
