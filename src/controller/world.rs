//! The world index: everything the controller knows about the cluster, fed
//! by watch events and read by each reconcile. Pure: no client, no tasks;
//! tested by feeding events ([`World::apply`]).
//!
//! A list never shows a half-empty view: lists of objects are applied
//! object by object (an unchanged object keeps its cached copy) and what a
//! list no longer holds is swept at its end (`InitDone`); lists of rules
//! and of the allow-list are buffered and swapped in then.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;

use super::apply::Learned;
use super::live::{Live, ObjectId};
use super::status::Hold;
use crate::api::{OutputKind, RbacRule, RbacRuleSpec};
pub(super) use crate::engine::compile::output_kind;
use crate::engine::{GroupKind, ObjectStore};

mod holds;
mod kinds;
mod listing;
mod owned;
pub(super) use owned::lane_role;

pub(super) use listing::map_event;
use listing::{KindWatch, Listing, Step, not_found};

/// What a watch task sends to the control loop.
#[derive(Debug)]
pub enum Feed {
    /// An RbacRule event (boxed: rules are large, other feeds small).
    Rules(Box<Event<RbacRule>>),
    /// A NamespacedRbacRule event, the rule carried as an RbacRule with its
    /// namespace ([`super::tenants`]).
    Tenants(Box<Event<RbacRule>>),
    /// An event of the watch on every object of an output kind: ours (with
    /// our managed-by label) are cached, others only by name.
    Owned(OutputKind, Event<Live>),
    /// An event of a watch on a kind the rules read; `epoch` tells a
    /// restarted watch from its predecessor.
    Kind(GroupKind, u64, Event<Value>),
    /// An event of the allow-list ClusterRole watch.
    Allow(Box<Event<ClusterRole>>),
    /// What a write just did (from the write pass, not a watch).
    Learned(Learned),
    /// A watch error.
    Error(Source, watcher::Error),
}

/// Which watch a [`Feed::Error`] comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The RbacRule watch.
    Rules,
    /// The NamespacedRbacRule watch.
    Tenants,
    /// An owned-object watch.
    Owned(OutputKind),
    /// A rule-kind watch.
    Kind(GroupKind, u64),
    /// The allow-list watch.
    Allow,
}

/// Everything the controller knows about the cluster.
#[derive(Default)]
pub struct World {
    /// RbacRules by name, and NamespacedRbacRules by `<namespace>/<name>`
    /// ([`super::tenants::key_of`]).
    pub rules: BTreeMap<String, RbacRule>,
    rules_listing: Listing<RbacRule>,
    tenants_listing: Listing<RbacRule>,
    /// Kinds each rule reads (cached per spec).
    rule_kinds: BTreeMap<String, (RbacRuleSpec, Vec<GroupKind>)>,
    /// Objects of the kinds the rules read.
    pub store: ObjectStore,
    kinds: BTreeMap<GroupKind, KindWatch>,
    next_epoch: u64,
    /// Live objects labelled as ours.
    pub owned: BTreeMap<ObjectId, Live>,
    /// Objects of the output kinds without our label: a desired object of
    /// one of these names is looked up before it is written (adoption or
    /// conflict); every other name is free, so a create needs no read.
    pub foreign: BTreeSet<ObjectId>,
    /// Objects of the output kinds labelled ours that our inventory did not
    /// make ([`Live::is_ours`]), with the rule they name: foreign (neither
    /// pruned, revoked, overwritten nor judged as ours), and reported.
    pub forged: BTreeMap<ObjectId, Option<String>>,
    owned_listing: BTreeMap<OutputKind, Listing<Live>>,
    /// Size of `owned` when it was last packed ([`pack_map`]).
    owned_packed_len: usize,
    /// Per output kind whose list is in progress, the objects it held so far.
    relisting: BTreeMap<OutputKind, BTreeSet<ObjectId>>,
    /// `--allow-clusterrole`, if set.
    allow_name: Option<String>,
    allow: Option<ClusterRole>,
    allow_listing: Listing<ClusterRole>,
    /// Rules moved to the slow lane, with the spec that was slow: a new
    /// spec gets a new chance in the main pass.
    slow: BTreeMap<String, RbacRuleSpec>,
    /// What tenant rules may read (`--tenant-readable-kinds`): part of
    /// what they watch.
    pub tenancy: crate::engine::tenant::Tenancy,
}

/// What a feed item changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Something the engine reads or the plan compares changed.
    pub dirty: bool,
    /// The set of rule specs changed: watches may need to start or stop.
    pub rules: bool,
    /// A kind stopped being served: rediscover it.
    pub lost_kind: bool,
}

impl World {
    /// An empty world; `allow_name` is the `--allow-clusterrole` value.
    pub fn new(allow_name: Option<String>) -> Self {
        World {
            allow_name,
            ..World::default()
        }
    }

    /// Applies one feed item.
    pub fn apply(&mut self, feed: Feed) -> Change {
        let dirty = |dirty| Change {
            dirty,
            ..Change::default()
        };
        match feed {
            Feed::Rules(ev) => self.apply_rule_event(*ev, false),
            Feed::Tenants(ev) => self.apply_rule_event(*ev, true),
            Feed::Owned(kind, ev) => dirty(self.apply_owned_event(kind, ev)),
            Feed::Kind(gk, epoch, ev) => dirty(self.apply_kind_event(&gk, epoch, ev)),
            Feed::Allow(ev) => dirty(self.apply_allow_event(*ev)),
            Feed::Learned(learned) => dirty(self.learn(learned)),
            Feed::Error(source, error) => self.apply_watch_error(source, &error),
        }
    }

    /// An RbacRule event. A status-only change (often our own patch)
    /// re-renders nothing; the new status is kept for comparison.
    /// Tenant rules (`tenant`) come from their own watch and list: a list
    /// of either replaces only its own kind's rules.
    fn apply_rule_event(&mut self, ev: Event<RbacRule>, tenant: bool) -> Change {
        let changed = Change {
            dirty: true,
            rules: true,
            lost_kind: false,
        };
        let listing = if tenant {
            &mut self.tenants_listing
        } else {
            &mut self.rules_listing
        };
        match listing.step(map_event(ev, without_managed_fields)) {
            Step::Nothing => Change::default(),
            Step::Upsert(r) => {
                let name = super::tenants::key_of(&r);
                let same_spec = self.rules.get(&name).is_some_and(|old| {
                    old.spec == r.spec && old.metadata.generation == r.metadata.generation
                });
                // A confirmation of held prunes is read by the next plan.
                let confirm = |r: &RbacRule| {
                    r.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(super::plan::CONFIRM_PRUNE_ANNOTATION).cloned())
                };
                let confirmed = self
                    .rules
                    .get(&name)
                    .is_some_and(|old| confirm(old) != confirm(&r));
                self.rules.insert(name, r);
                match (same_spec, confirmed) {
                    (true, false) => Change::default(),
                    (true, true) => Change {
                        dirty: true,
                        ..Change::default()
                    },
                    (false, _) => changed,
                }
            }
            Step::Remove(r) => {
                self.rules.remove(&super::tenants::key_of(&r));
                changed
            }
            Step::Replace(all) => {
                self.rules
                    .retain(|key, _| super::tenants::is_tenant_key(key) != tenant);
                self.rules
                    .extend(all.into_iter().map(|r| (super::tenants::key_of(&r), r)));
                changed
            }
        }
    }

    /// An event of the allow-list ClusterRole's watch; whether it changed
    /// the allow-list.
    fn apply_allow_event(&mut self, ev: Event<ClusterRole>) -> bool {
        match self.allow_listing.step(ev) {
            Step::Nothing => return false,
            Step::Upsert(cr) => self.allow = Some(cr),
            Step::Remove(_) => self.allow = None,
            Step::Replace(all) => self.allow = all.into_iter().next(),
        }
        true
    }

    /// A watch error: its listing records it. A kind the API server no
    /// longer serves (its CRD went away) stops being watched, keeps its
    /// last list (no pruning from it while unresolved) and is rediscovered
    /// later.
    fn apply_watch_error(&mut self, source: Source, error: &watcher::Error) -> Change {
        tracing::warn!(?source, error = %error, "watch error");
        let mut change = Change::default();
        match source {
            Source::Rules => self.rules_listing.fail(error),
            // No NamespacedRbacRule kind served (its CRD not installed): no
            // tenant rule exists, and the cluster rules go on.
            // (The watcher retries with backoff: a repeated 404 changes
            // nothing.)
            Source::Tenants if not_found(error) => {
                let none = self.tenants_listing.synced
                    && !self.rules.keys().any(|k| super::tenants::is_tenant_key(k));
                if none {
                    // The retry's list (begun with `Init`) ended here.
                    self.tenants_listing.buffer = None;
                    return change;
                }
                self.apply_rule_event(Event::Init, true);
                return self.apply_rule_event(Event::InitDone, true);
            }
            Source::Tenants => self.tenants_listing.fail(error),
            Source::Owned(k) => self.owned_listing.entry(k).or_default().fail(error),
            Source::Allow => self.allow_listing.fail(error),
            Source::Kind(gk, epoch) => {
                if let Some(w) = self.kinds.get_mut(&gk).filter(|w| w.epoch == epoch) {
                    w.listing.fail(error);
                    if matches!(error, watcher::Error::InitialListFailed(_)) {
                        // No list in progress until the retry's `Init`.
                        w.seen = None;
                    }
                    if not_found(error) {
                        w.watching = false;
                        w.seen = None;
                        w.unresolved = Some(format!("{gk} is no longer served by the API server"));
                        change.lost_kind = true;
                    }
                    change.dirty = true;
                }
            }
        }
        change
    }

    /// Whether the rules, owned-object and allow-list watches have listed:
    /// before that nothing is written.
    pub fn base_synced(&self) -> bool {
        self.rules_listing.synced
            && self.tenants_listing.synced
            && OutputKind::ALL
                .iter()
                .all(|k| self.owned_listing.get(k).is_some_and(|l| l.synced))
            && (self.allow_name.is_none() || self.allow_listing.synced)
    }

    /// Whether a list is in progress: a watch (re)started and has not yet
    /// received all of it. Its end is a change that asks for a pass.
    pub fn listing(&self) -> bool {
        self.rules_listing.buffer.is_some()
            || self.tenants_listing.buffer.is_some()
            || self.allow_listing.buffer.is_some()
            || !self.relisting.is_empty()
            || self.kinds.values().any(|w| w.seen.is_some())
    }

    /// Whether every rule kind has either listed or been found unserved:
    /// the initial sync is done (readiness) and pruning is allowed.
    pub fn kinds_settled(&self) -> bool {
        self.kinds
            .values()
            .all(|w| w.unresolved.is_some() || self.listed(w).0)
    }

    /// Whether a rule kind has listed, and the last list error. The output
    /// kinds are fed by their own watches (every object of the kind), not
    /// by a second one.
    fn listed<'a>(&'a self, w: &'a KindWatch) -> (bool, Option<&'a String>) {
        match output_kind(&w.interest.gk) {
            Some(k) => self
                .owned_listing
                .get(&k)
                .map_or((false, None), |l| (l.synced, l.error.as_ref())),
            None => (w.listing.synced, w.listing.error.as_ref()),
        }
    }

    /// What a reconcile sees: the rules, the caches, and the allow-list and
    /// holds computed once by the caller ([`World::allow_rules`],
    /// [`World::holds`]); deletions only once every watch has listed.
    pub fn snapshot<'a>(
        &'a self,
        allow: Option<&'a crate::policy::AllowList>,
        holds: &'a BTreeMap<String, Hold>,
    ) -> super::sync::Snapshot<'a> {
        super::sync::Snapshot {
            rules: &self.rules,
            observed: &self.store,
            owned: &self.owned,
            foreign: &self.foreign,
            forged: &self.forged,
            holds,
            allow,
            prune: self.kinds_settled(),
        }
    }

    /// The allow-list, when `--allow-clusterrole` is set and found.
    pub fn allow_rules(&self) -> Option<crate::policy::AllowList> {
        self.allow
            .as_ref()
            .map(crate::policy::AllowList::from_cluster_role)
    }
}

fn without_managed_fields(mut r: RbacRule) -> RbacRule {
    r.metadata.managed_fields = None;
    r
}

#[cfg(test)]
mod tests;
