//! The objects of the output kinds: ours cached (packed, slim, unpacked
//! when a plan or a hold needs their bodies) and mirrored into the store,
//! others known by name, forged ones reported; what a write did is learned
//! as soon as it is answered.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::runtime::watcher::Event;
use serde_json::Value;

use super::World;
use super::listing::Step;
use crate::api::OutputKind;
use crate::controller::apply::Learned;
use crate::controller::live::{Live, ObjectId};
use crate::controller::status::Hold;
use crate::engine::compile::gk_of;

impl World {
    /// An event of an output kind's watch; whether it changed the cache.
    /// A list is applied object by object, and what it no longer holds
    /// swept at its end: unchanged objects keep their cached copy (no
    /// second copy of thousands of objects during a relist, and the plan's
    /// memo stays valid).
    pub(super) fn apply_owned_event(&mut self, kind: OutputKind, ev: Event<Live>) -> bool {
        match ev {
            Event::Init => {
                self.relisting.insert(kind, BTreeSet::new());
                false
            }
            Event::InitApply(o) => {
                if let Some(id) = o.id() {
                    // The cached key's text, when known: a relist of
                    // thousands of objects adds no second copy of names.
                    let id = match self.owned.get_key_value(id) {
                        Some((known, _)) => known.clone(),
                        None => id.clone(),
                    };
                    self.relisting.entry(kind).or_default().insert(id);
                }
                self.upsert_rbac(o)
            }
            Event::InitDone => {
                let seen = self.relisting.remove(&kind).unwrap_or_default();
                let listing = self.owned_listing.entry(kind).or_default();
                listing.synced = true;
                listing.error = None;
                let gone: Vec<ObjectId> = self
                    .owned
                    .keys()
                    .chain(self.foreign.iter())
                    .filter(|id| id.kind == kind && !seen.contains(*id))
                    .cloned()
                    .collect();
                for id in gone {
                    self.forget_rbac(&id);
                }
                true
            }
            ev => {
                let listing = self.owned_listing.entry(kind).or_default();
                match listing.step(ev) {
                    Step::Upsert(o) => self.upsert_rbac(o),
                    Step::Remove(o) => {
                        // The deletion of an older object of the name (a
                        // binding re-created with a new roleRef, whose new
                        // copy the cache already learned) keeps the new one.
                        let newer =
                            |l: &Live| matches!((l.uid(), o.uid()), (Some(a), Some(b)) if a != b);
                        match o.id() {
                            Some(id) if !self.owned.get(id).is_some_and(newer) => {
                                self.forget_rbac(id)
                            }
                            _ => false,
                        }
                    }
                    Step::Nothing | Step::Replace(_) => false,
                }
            }
        }
    }

    /// An object of an output kind as a watch delivers it: ours is cached,
    /// anyone else's only named (taking our label off an object makes it
    /// someone else's).
    /// An object of an output kind is gone: from our cache, the names, and
    /// the store.
    fn forget_rbac(&mut self, id: &ObjectId) -> bool {
        self.forged.remove(id);
        let foreign = self.foreign.remove(id);
        let owned = self.remove_owned(id);
        let key = id.store_key();
        let read = self.store.remove(gk_of(id.kind), &key).is_some();
        owned || foreign || read
    }

    fn upsert_rbac(&mut self, mut o: Live) -> bool {
        let Some(id) = o.id().cloned() else {
            return false;
        };
        if o.is_ours() {
            self.forged.remove(&id);
            let foreign = self.foreign.remove(&id);
            return self.upsert_live(id, o) || foreign;
        }
        // Labelled ours by someone else: anyone's, and reported.
        let forged = o.is_managed();
        if forged {
            self.note_forged(&id, o.rule());
        } else {
            self.forged.remove(&id);
        }
        let owned = self.remove_owned(&id);
        let gk = gk_of(id.kind);
        let mut read = false;
        // Kept whole only where a rule reads the kind (rules copied from
        // ClusterRoles, an allow-list), else only its name is.
        if self.kinds.contains_key(gk) {
            o.unpack();
            let key = id.store_key();
            if let Some(object) = o.shared() {
                // The engine sees it without the claim, as anyone's.
                let object = match forged {
                    true => {
                        let mut copy = Value::clone(object);
                        crate::engine::output::disown(&mut copy);
                        Arc::new(copy)
                    }
                    false => Arc::clone(object),
                };
                if self.store.get(gk, &key) != Some(&*object) {
                    read = self.store.insert_shared(object).is_ok();
                }
            }
        }
        self.foreign.insert(id) || owned || read
    }

    /// Records an object labelled ours that our inventory did not make,
    /// logging it when it is new or names another rule (the pass reports
    /// it on the rule it names, and counts it).
    fn note_forged(&mut self, id: &ObjectId, rule: Option<&str>) {
        let rule = rule.map(str::to_string);
        if self.forged.get(id) != Some(&rule) {
            tracing::warn!(
                object = %id,
                rule = rule.as_deref().unwrap_or_default(),
                "labelled app.kubernetes.io/managed-by=rbac-rules, but rbac-rules did not make it (no Apply entry of its field manager): not ours, left alone"
            );
            self.forged.insert(id.clone(), rule);
        }
    }

    /// Caches one of our objects.
    fn upsert_live(&mut self, id: ObjectId, mut live: Live) -> bool {
        // Nothing reads the body of our object while a desired copy stands
        // for it: policy judges that copy, and the engine's view shows a
        // rule that copy or nothing, never our live one (see
        // `engine::view`). Packed then, and out of the engine's store,
        // until a plan keeps it without a desired copy ([`World::unpack`])
        // or its rule is held ([`World::unpack_held`]). Where no rule reads
        // the kind, only what policy reads is kept.
        let read = self.kinds.contains_key(gk_of(id.kind));
        if !read {
            live.slim();
        }
        live.pack();
        match self.owned.get(&id) {
            Some(known) if known == &live => return false,
            // A watch event from before a write whose response the cache
            // already learned: older, so nothing to change.
            Some(known) if older(&live, known) => return false,
            // The version already known (perhaps unpacked since): nothing
            // changed. Where a rule reads the kind, an unpacked copy may be
            // slim: the new one replaces it. A whole unpacked copy (a held
            // rule's, one a plan kept) stays in the store as it is: a relist
            // takes nothing out that the next pass puts back (each a change
            // the engine's readers would render again).
            Some(known)
                if (!read || known.is_packed() || !known.is_slim())
                    && known.same_version(&live) =>
            {
                return false;
            }
            _ => {}
        }
        self.mirror(&id, live.shared());
        self.foreign.remove(&id);
        if self.owned.insert(id, live).is_none()
            && self.owned.len() >= (self.owned_packed_len + self.owned_packed_len / 4).max(1024)
        {
            pack_map(&mut self.owned);
            self.owned_packed_len = self.owned.len();
        }
        true
    }

    /// Unpacks the bodies of `kept` objects (those a plan left alone: no
    /// desired copy stands for them), so that policy judges them in the
    /// next evaluation. Whether any was packed. Packed objects are Roles
    /// no rule reads ([`Live::pack`]): while a desired copy stands for one,
    /// policy judges that copy and the plan compares digests.
    pub fn unpack<'a>(&mut self, kept: impl IntoIterator<Item = &'a ObjectId>) -> bool {
        let mut any = false;
        for id in kept {
            let Some(live) = self.owned.get_mut(id) else {
                continue;
            };
            if live.unpack() {
                if !self.kinds.contains_key(gk_of(id.kind)) {
                    live.slim();
                }
                let object = live.shared().cloned();
                self.mirror(id, object.as_ref());
                any = true;
            }
        }
        any
    }

    /// Drops the packed `rules` of our objects a plan found equal to their
    /// desired copy ([`Live::shed_rules`]). How many.
    pub fn shed_rules(&mut self) -> usize {
        self.owned
            .values_mut()
            .map(Live::shed_rules)
            .filter(|shed| *shed)
            .count()
    }

    /// Unpacks our objects of held rules where a rule reads the kind: the
    /// engine's view shows a held rule's live objects (it renders no copy
    /// of them), so they are in the store before the evaluation that holds
    /// the rule. Whether any was packed.
    pub fn unpack_held(&mut self, holds: &BTreeMap<String, Hold>) -> bool {
        self.unpack_held_but(holds, |_, _| false)
    }

    /// [`World::unpack_held`] for the main pass: but the Roles of rules in
    /// the slow lane, which only policy would read there (a rule reading
    /// what a slow rule emits is in the slow lane too, see
    /// [`World::holds`]), and policy judges a Role on its own rules, which
    /// the slow lane judges (its desired copy, or its live body when the
    /// lane's plan keeps it). A binding to a Role it does not see grants
    /// nothing there: what the Role grants is the Role's to pass. Unpacked,
    /// they were a second copy, as JSON trees, of every output the lane
    /// holds (the namespace Roles: most of its bytes). ClusterRoles are
    /// unpacked: an aggregated ClusterRole grants what it selects.
    pub fn unpack_held_for_main(&mut self, holds: &BTreeMap<String, Hold>) -> bool {
        self.unpack_held_but(holds, |id, h| lane_role(id, Some(h)))
    }

    fn unpack_held_but(
        &mut self,
        holds: &BTreeMap<String, Hold>,
        skip: impl Fn(&ObjectId, &Hold) -> bool,
    ) -> bool {
        if holds.is_empty() {
            return false;
        }
        let ids: Vec<ObjectId> = self
            .owned
            .iter()
            .filter(|(id, l)| {
                l.is_packed()
                    && self.kinds.contains_key(gk_of(id.kind))
                    && l.rule()
                        .and_then(|r| holds.get(r))
                        .is_some_and(|h| !skip(id, h))
            })
            .map(|(id, _)| id.clone())
            .collect();
        self.unpack(&ids)
    }

    fn remove_owned(&mut self, id: &ObjectId) -> bool {
        self.mirror(id, None);
        self.owned.remove(id).is_some()
    }

    /// Keeps the engine's view of our own objects: every managed object is
    /// in the store (sharing the cached copy), so that policy judges every
    /// live object we made and revokes what it now refuses, and rules that
    /// read the kind see it.
    pub(super) fn mirror(&mut self, id: &ObjectId, object: Option<&Arc<Value>>) {
        let gk = gk_of(id.kind);
        let key = id.store_key();
        match object {
            Some(o) => {
                if self.store.insert_shared(o.clone()).is_err() {
                    tracing::debug!(object = %id, "not mirrored into the store");
                }
            }
            None => {
                self.store.remove(gk, &key);
            }
        }
    }

    /// Learns what a write did as soon as it is answered: the object as
    /// the API server returned it, or that it is gone. The watch events
    /// that follow confirm it (or are older, and ignored).
    pub fn learn(&mut self, learned: Learned) -> bool {
        match learned {
            Learned::Applied(live) => match live.id().cloned() {
                Some(id) => self.upsert_live(id, live),
                None => false,
            },
            // Only the object deleted: not one made again since.
            Learned::Deleted(id, uid) => {
                let same = self
                    .owned
                    .get(&id)
                    .is_some_and(|l| uid.is_none() || l.uid() == uid.as_deref());
                same && self.remove_owned(&id)
            }
        }
    }

    /// Whether the watch of an output kind must list again now that a rule
    /// reads the kind (its last list kept only the names of objects not
    /// ours); if so, nothing is evaluated until it has. A list still to
    /// come keeps every object by itself.
    pub(in crate::controller) fn relist_outputs(&mut self, kind: OutputKind) -> bool {
        let listing = self.owned_listing.entry(kind).or_default();
        let again = listing.synced;
        listing.synced = false;
        again
    }
}

/// Whether `id` is a Role of a rule `hold` puts in the slow lane: the
/// main pass needs no body of it (see [`World::unpack_held_for_main`]).
pub fn lane_role(id: &ObjectId, hold: Option<&Hold>) -> bool {
    id.kind == OutputKind::Role && hold.is_some_and(Hold::is_slow_lane)
}

/// Whether `new` is an older version of `known`: both resourceVersions
/// parse as integers (etcd revisions, as every API server serves them) and
/// `new`'s is lower. Opaque versions never count as older.
fn older(new: &Live, known: &Live) -> bool {
    let rv = |l: &Live| l.resource_version().and_then(|v| v.parse::<u64>().ok());
    matches!((rv(new), rv(known)), (Some(n), Some(k)) if n < k)
}

/// Rebuilds a map with full nodes. Objects mostly arrive in key order (a
/// write pass answers in plan order), and a B-tree filled at its right
/// edge keeps its nodes about half full: for the live cache, about 2.5 MB
/// of empty slots at `large`. `append` merges by a bulk build that drains
/// the old nodes as it fills new ones, so no second copy is held.
pub(super) fn pack_map<K: Ord, V>(map: &mut BTreeMap<K, V>) {
    let mut old = std::mem::take(map);
    if let Some((k, v)) = old.pop_first() {
        map.insert(k, v);
        map.append(&mut old);
    }
}
