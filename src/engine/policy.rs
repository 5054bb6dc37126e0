//! Policy, once every rule has run (docs/rules.md "Outputs and their
//! validation", docs/security.md): conflicts settled (an object two
//! emitters emit is contested), then every emitted and live managed object
//! judged over the final world ([`super::grants`] decides what an object
//! grants and whether it is refused); a refusal revokes. Judges again only
//! what changed and what depends on changed roles, recording each verdict
//! in the memo.
//!
//! Reference twin: `reference/policy.rs`.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::Engine;
use super::chunks::{Chunks, SPLIT_MIN, joined, merge_chunks};
use super::fast_hash::HashSet;
use super::grants::Judge;
use super::incremental::caches::Caches;
use super::kinds::{gk_of, output_gk};
use super::limits;
use super::memo::{Changes, Emit, Emitters, Memo, RuleMemo};
use super::model::Refusal;
use super::model::{Desired, OutKey};
use super::output;
use super::output::selection_key;
use super::store::{GroupKind, ObjectStore};
use super::view::View;
use crate::api::OutputKind;

/// Evaluates every rule, rendering again only what changed since `memo`
/// Outputs found to differ from the ones they replace, as pairs (the old
/// object, the new) by their addresses: policy need not compare them
/// again. Each address named a live object when the pair was noted, and
/// policy looks pairs up with objects alive since then (the old desired
/// one) or held by the emitters (the new one), so a match is those same
/// two objects.
#[derive(Default)]
pub(super) struct Differing(HashSet<(usize, usize)>);

impl Differing {
    /// Notes that `new`, replacing `old`, differs from it.
    pub(super) fn note(&mut self, old: &Arc<Desired>, new: &Arc<Desired>) {
        self.0.insert(Self::pair(old, new));
    }

    /// Whether `new`, replacing `old`, was noted as differing from it.
    fn holds(&self, old: &Arc<Desired>, new: &Arc<Desired>) -> bool {
        self.0.contains(&Self::pair(old, new))
    }

    fn pair(old: &Arc<Desired>, new: &Arc<Desired>) -> (usize, usize) {
        (Arc::as_ptr(old) as usize, Arc::as_ptr(new) as usize)
    }
}

/// Objects two emitters (rules or triggers) both emit: neither copy is
/// desired; every emitter gets a Conflict error and keeps its trigger.
pub(super) fn settle_conflicts(
    memo: &mut Memo,
    touched: &BTreeSet<OutKey>,
    report_dirty: &mut BTreeSet<usize>,
) {
    for key in touched {
        let parts: Vec<(usize, Option<String>)> = match memo.emitters.get(key) {
            Some(es) if es.len() >= 2 => es
                .iter()
                .map(|e| (e.rule, e.desired.trigger.as_deref().map(str::to_string)))
                .collect(),
            _ => Vec::new(),
        };
        let old = memo.contested.get(key).cloned().unwrap_or_default();
        if parts == old {
            continue;
        }
        for (r, t) in old {
            memo.rules[r].conflicts.remove(&(key.clone(), t));
            report_dirty.insert(r);
        }
        for (r, t) in &parts {
            memo.rules[*r].conflicts.insert((key.clone(), t.clone()));
            report_dirty.insert(*r);
        }
        if parts.is_empty() {
            memo.contested.remove(key);
        } else {
            memo.contested.insert(key.clone(), parts);
        }
    }
}

/// What policy decides about one object.
struct Verdict {
    /// The output and why it is refused: rule, trigger, field, why (boxed:
    /// rare, and every object has a verdict).
    refused: Option<Box<Refusal>>,
    desired: Option<Arc<Desired>>,
    /// Why the live managed object is refused, when no desired copy
    /// replaces it.
    live: Option<String>,
    dependent: Option<BTreeSet<String>>,
    /// An aggregated role's notice (see [`Judge::notice`]). Boxed: rare.
    notice: Option<Box<Notice>>,
}

/// A notice on a managed aggregated role.
struct Notice {
    /// Its rule's index, when the rule runs.
    rule: Option<usize>,
    trigger: Option<String>,
    field: String,
    text: String,
}

/// What judging objects reads, shareable between threads.
struct Policy<'a> {
    engine: &'a Engine,
    observed: &'a ObjectStore,
    emitters: &'a Emitters,
    rules: &'a [RuleMemo],
    protected: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector],
    allow_rules: &'a [k8s_openapi::api::rbac::v1::PolicyRule],
}

impl<'a> Policy<'a> {
    /// Policy's view (after every rule) with caches of its own.
    fn detached(&self, caches: &'a Caches) -> View<'a> {
        View::detached(
            self.observed,
            self.emitters,
            self.rules,
            self.engine,
            None,
            (caches, self.allow_rules),
        )
    }

    /// The verdicts on `keys`, in their order, over `view`.
    fn verdicts(&self, keys: &Chunks<&OutKey>, view: &View) -> Vec<(usize, Vec<Verdict>)> {
        keys.run(self.judge_each(view))
    }

    /// Judges one object at a time over `view`.
    fn judge_each<'v>(&'v self, view: &'v View<'_>) -> impl FnMut(&&OutKey) -> Verdict + 'v {
        let options = &self.engine.options;
        let judge = Judge {
            view,
            waivers: &options.waivers,
            protected: self.protected,
            allow: options.allow.as_ref().map(|a| (a, self.allow_rules)),
            judged: Default::default(),
            bound: Default::default(),
            aggregates: Default::default(),
            ceiling: super::tenant::Ceiling::new(self.observed, &options.tenancy),
        };
        move |&key: &&OutKey| self.verdict(&judge, key)
    }

    /// What policy decides about the object `key`: its one emitter's
    /// output (contested objects have none) and the live managed object.
    fn verdict(&self, judge: &Judge<'_, '_>, key: &OutKey) -> Verdict {
        let cand = self
            .emitters
            .get(key)
            .filter(|es| es.len() == 1)
            .and_then(|es| es.first());
        let refused = cand.and_then(|e| refusal_of(judge, e));
        let desired = cand
            .filter(|_| refused.is_none())
            .map(|e| Arc::clone(&e.desired));
        let live = self
            .observed
            .get_shared(gk_of(key.0), &(key.1.clone(), key.2.clone()))
            .filter(|o| output::is_managed(o));
        let live_why = match (&desired, live) {
            (None, Some(l)) => judge.refusal(l),
            _ => None,
        };
        let dependent = dependencies(key, cand, live.map(|l| &**l));
        // An aggregated role a rule manages that collects roles nobody
        // manages: reported on its rule, never refused for them.
        let notice = match (&desired, live) {
            (Some(d), _) if d.object.aggregation_rule().is_some() => {
                judge.notice(d.object.shared_value()).map(|text| Notice {
                    rule: cand.map(|e| e.rule),
                    trigger: d.trigger.as_deref().map(str::to_string),
                    field: d.field.to_string(),
                    text,
                })
            }
            // Preserved live (no output refused in its place).
            (None, Some(l))
                if refused.is_none()
                    && live_why.is_none()
                    && l.get("aggregationRule").is_some() =>
            {
                judge.notice(l).map(|n| self.live_notice(l, n))
            }
            _ => None,
        };
        Verdict {
            refused,
            desired,
            live: live_why,
            dependent,
            notice: notice.map(Box::new),
        }
    }

    /// A notice on a preserved live aggregated role, on the rule and
    /// trigger its annotations name.
    fn live_notice(&self, live: &Value, text: String) -> Notice {
        let annotations = &live["metadata"]["annotations"];
        let rule = annotations[output::rule_annotation()]
            .as_str()
            .and_then(|r| self.engine.rule_index(r));
        let trigger = annotations[output::trigger_annotation()]
            .as_str()
            .map(str::to_string);
        Notice {
            rule,
            trigger,
            field: "spec.outputs".to_string(),
            text,
        }
    }
}

/// Why an emitted output is refused: the refusal rendering found (a `*`
/// from data) or policy's judgment of the object; `None` when it passes.
fn refusal_of(judge: &Judge<'_, '_>, e: &Emit) -> Option<Box<Refusal>> {
    let d = &e.desired;
    let why = match &d.refusal {
        Some(err) => Some((
            err.field.clone(),
            format!("{} {:?}: {}", d.kind, d.name, err.message),
        )),
        None => judge
            .refusal_of(&d.object)
            .map(|why| (d.field.to_string(), why)),
    };
    why.map(|(field, why)| {
        Box::new(Refusal {
            rule: e.rule,
            trigger: d.trigger.as_deref().map(str::to_string),
            field,
            why,
        })
    })
}

/// What a verdict depends on besides the object: the selection an
/// aggregated role reads (its notice), or (empty) any role, for a binding
/// (judged by what a live role grants).
///
/// A tenant output is judged again on any change of a role or a Namespace
/// (its ceiling: the ceiling ClusterRole, its members, the Namespace's
/// label).
fn dependencies(
    key: &OutKey,
    cand: Option<&Emit>,
    live: Option<&Value>,
) -> Option<BTreeSet<String>> {
    fn depends(o: &Value, reads: &mut Option<BTreeSet<String>>) {
        if let Some(k) = selection_key(o) {
            reads.get_or_insert_with(BTreeSet::new).insert(k);
        } else if o.get("roleRef").is_some() {
            reads.get_or_insert_with(BTreeSet::new);
        }
    }
    let mut reads = None;
    if super::tenant::is_tenant_output(key.0.as_str(), &key.2) {
        reads.get_or_insert_with(BTreeSet::new);
    }
    if let Some(e) = cand {
        let m = &e.desired.object;
        if m.aggregation_rule().is_some() {
            depends(m.shared_value(), &mut reads);
        } else if m.role_ref().is_some() {
            reads.get_or_insert_with(BTreeSet::new);
        }
    }
    if let Some(l) = live {
        depends(l, &mut reads);
    }
    reads
}

/// Policy, once every rule has run, over the final view (live objects and
/// all outputs), so it adds no ordering between rules: the default denials
/// ([`crate::policy::Waivers`]), protected aggregation labels, and the
/// allow-list, judged on what an object *grants* — a role its rules (and,
/// aggregated, the rules of every role it selects), a binding the rules of
/// the role it names (a binding to a role that does not exist yet grants
/// nothing and passes; the role is checked once it exists).
///
/// A refused output is dropped, its rule gets an EscalationDenied error,
/// and, unlike a failed render, its trigger is *not* preserved: the object is
/// revoked. Live managed objects that policy now refuses are revoked too,
/// whatever keeps them. Judges again only what changed and what depends
/// on changed roles; returns the keys judged (in order), each with whether
/// its desired object changed.
pub(super) fn apply_policy(
    engine: &Engine,
    observed: &ObjectStore,
    memo: &mut Memo,
    touched: &BTreeSet<OutKey>,
    differing: &Differing,
    changes: &Changes,
    report_dirty: &mut BTreeSet<usize>,
) -> Vec<Judged> {
    let roles_changed = RoleChanges::of(changes);
    let all = changes.all;
    let (protected, allow_rules) = allow_list(engine, memo);
    let reached = View::new(observed, memo, engine, None).refresh_selections(changes);
    let keys: Vec<Arc<OutKey>> = if all {
        every_key(observed, memo, touched)
    } else {
        changed_keys_to_judge(memo, touched, changes, roles_changed, &reached)
    };
    let keys_list: Vec<&OutKey> = keys.iter().map(|k| &**k).collect();
    memo.verdicts += keys_list.len() as u64;
    let policy = Policy {
        engine,
        observed,
        emitters: &memo.emitters,
        rules: &memo.rules,
        protected: &protected,
        allow_rules: &allow_rules,
    };
    let chunks = Chunks::new(&keys_list);
    let verdicts: Vec<Verdict> = if memo.one_shot && keys_list.len() >= 2 * SPLIT_MIN {
        // One-shot: another thread, with its own view, shares the objects
        // out; the verdicts are put back in key order.
        std::thread::scope(|s| {
            let other = std::thread::Builder::new()
                .name("rbac-rules-eval".to_string())
                .stack_size(limits::EVAL_STACK_BYTES)
                .spawn_scoped(s, || {
                    let caches = Caches::default();
                    policy.verdicts(&chunks, &policy.detached(&caches))
                });
            let view = View::new(observed, memo, engine, None);
            let mine = policy.verdicts(&chunks, &view);
            merge_chunks(mine, joined(other))
        })
    } else {
        // One thread: collected at once, no chunks to merge.
        let view = View::new(observed, memo, engine, None);
        keys_list.iter().map(policy.judge_each(&view)).collect()
    };

    // After everything changed the memo starts empty: nothing to replace
    // or remove.
    let fresh = changes.all;
    let mut changed = Vec::with_capacity(keys_list.len());
    for (key, v) in keys_list.iter().copied().zip(verdicts) {
        changed.push(record_desired(memo, key, v.desired, fresh, differing));
        record_refusal(memo, key, v.refused, report_dirty);
        record_revoked(memo, key, v.live);
        record_notice(memo, key, v.notice, report_dirty);
        match v.dependent {
            Some(reads) => {
                memo.dependents.insert(key.clone(), reads);
            }
            None => {
                memo.dependents.remove(key);
            }
        }
    }
    keys.into_iter()
        .zip(changed)
        .map(|(key, changed)| Judged { key, changed })
        .collect()
}

/// An object policy judged (see [`apply_policy`]).
pub(super) struct Judged {
    pub(super) key: Arc<OutKey>,
    /// Whether its desired object changed.
    pub(super) changed: bool,
}

/// The selectors no output may feed, and the allow-list's effective rules
/// (brought up to date at the start of the evaluation).
fn allow_list(engine: &Engine, memo: &Memo) -> (Vec<LabelSelector>, Vec<PolicyRule>) {
    let options = &engine.options;
    let mut protected = options.protected.clone();
    if let Some(a) = &options.allow {
        protected.extend(a.selectors.iter().cloned());
    }
    (protected, memo.allow_rules().to_vec())
}

/// Every key policy judges after everything changed: collected, then
/// sorted once.
fn every_key(observed: &ObjectStore, memo: &Memo, touched: &BTreeSet<OutKey>) -> Vec<Arc<OutKey>> {
    // Every key: collected, then sorted once. Emitted keys are shared
    // with the emitters, and a live object's key is copied only when
    // nothing emits it.
    let mut keys: Vec<Arc<OutKey>> = touched.iter().cloned().map(Arc::new).collect();
    keys.extend(memo.emitters.shared_keys().cloned());
    for kind in OutputKind::ALL {
        for (k, _) in observed.entries(gk_of(kind)) {
            if memo.emitters.get_parts(kind, k).is_none() {
                keys.push(Arc::new((kind, k.0.clone(), k.1.clone())));
            }
        }
    }
    keys.extend(memo.refused.keys().cloned().map(Arc::new));
    keys.extend(memo.live_revoked.keys().cloned().map(Arc::new));
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// The keys an incremental evaluation judges: what changed, and the
/// dependents a change reached.
/// Which roles (and Namespaces) changed: what decides which bindings and
/// tenant outputs are judged again.
struct RoleChanges<'c> {
    /// Some ClusterRole.
    cluster_roles: bool,
    /// Every Role, as a whole.
    all_roles: bool,
    /// The Roles that changed, by namespace and name.
    roles: Option<&'c BTreeSet<super::store::ObjectKey>>,
    /// Some Namespace (a tenant output's ceiling is named by its label).
    namespaces: bool,
}

impl<'c> RoleChanges<'c> {
    fn of(changes: &'c Changes) -> Self {
        let role = output_gk(OutputKind::Role);
        RoleChanges {
            cluster_roles: changes.touches(&output_gk(OutputKind::ClusterRole)),
            all_roles: changes.whole(&role),
            roles: changes.keys.get(&role).filter(|k| !k.is_empty()),
            namespaces: changes.touches(&GroupKind::new("", "Namespace")),
        }
    }

    /// Some role changed.
    fn any_role(&self) -> bool {
        self.cluster_roles || self.all_roles || self.roles.is_some()
    }

    /// Whether the verdict of `key`, which depends on what the roles grant
    /// (a binding: the role it names; a tenant output: its ceiling), can
    /// have changed. A ClusterRoleBinding names a ClusterRole (Kubernetes
    /// refuses any other `roleRef.kind`); a RoleBinding a ClusterRole or a
    /// Role of its own namespace; a ClusterRole read by an aggregate can
    /// be any. So a Role changed in one namespace judges again that
    /// namespace's RoleBindings, not every binding of the cluster.
    fn reach(&self, key: &OutKey) -> bool {
        let (kind, namespace, name) = key;
        if super::tenant::is_tenant_output(kind.as_str(), name) {
            return self.any_role() || self.namespaces;
        }
        match kind {
            OutputKind::ClusterRoleBinding => self.cluster_roles,
            OutputKind::RoleBinding => {
                self.cluster_roles
                    || self.all_roles
                    || self.roles.is_some_and(|keys| {
                        keys.range((namespace.clone(), String::new())..)
                            .next()
                            .is_some_and(|(ns, _)| ns == namespace)
                    })
            }
            _ => self.any_role(),
        }
    }
}

fn changed_keys_to_judge(
    memo: &Memo,
    touched: &BTreeSet<OutKey>,
    changes: &Changes,
    roles_changed: RoleChanges<'_>,
    reached: &BTreeSet<String>,
) -> Vec<Arc<OutKey>> {
    // The changed keys of the output kinds (every output a rule
    // touched is one), shared with the emitters where one emits it;
    // then the dependents a change reached. Sorted, as the kinds and
    // each kind's keys come in order.
    let mut keys: Vec<Arc<OutKey>> = Vec::new();
    for kind in OutputKind::ALL {
        if let Some(changed) = changes.keys.get(gk_of(kind)) {
            keys.extend(
                changed
                    .iter()
                    .map(|k| match memo.emitters.shared_key(kind, k) {
                        Some(shared) => Arc::clone(shared),
                        None => Arc::new((kind, k.0.clone(), k.1.clone())),
                    }),
            );
        }
    }
    // What a rule touched was added to the changes with it.
    debug_assert!(touched.iter().all(|k| {
        changes
            .keys
            .get(gk_of(k.0))
            .is_some_and(|c| c.contains(&(k.1.clone(), k.2.clone())))
    }));
    for (key, reads) in &memo.dependents {
        let bound = reads.is_empty() && roles_changed.reach(key);
        if bound || reads.iter().any(|r| reached.contains(r)) {
            keys.push(Arc::new(key.clone()));
        }
    }
    // In order but for the dependents (a merge of sorted runs).
    keys.sort();
    keys.dedup();
    keys
}

/// Puts a verdict's desired object in the memo's desired set; whether
/// what the key held changed.
fn record_desired(
    memo: &mut Memo,
    key: &OutKey,
    desired: Option<Arc<Desired>>,
    fresh: bool,
    differing: &Differing,
) -> bool {
    // What the key held before this evaluation (the memo's desired
    // set changes only here, once per key): the change reported.
    match desired {
        Some(d) if fresh => {
            memo.desired.insert(d);
            true
        }
        Some(d) => match memo.desired.insert(Arc::clone(&d)) {
            Some(old) => !Arc::ptr_eq(&old, &d) && (differing.holds(&old, &d) || *old != *d),
            None => true,
        },
        None if fresh => false,
        None => memo.desired.remove(key).is_some(),
    }
}

/// Records a verdict's refusal with the memo and its rule.
fn record_refusal(
    memo: &mut Memo,
    key: &OutKey,
    refused: Option<Box<Refusal>>,
    report_dirty: &mut BTreeSet<usize>,
) {
    let new = refused.map(|b| *b);
    if memo.refused.get(key) != new.as_ref() {
        if let Some(old) = memo.refused.remove(key) {
            memo.rules[old.rule].refused.remove(key);
            report_dirty.insert(old.rule);
        }
        if let Some(r) = new {
            memo.rules[r.rule].refused.insert(key.clone(), r.clone());
            report_dirty.insert(r.rule);
            memo.refused.insert(key.clone(), r);
        }
    }
}

/// Records whether the live object is refused, and what is revoked.
fn record_revoked(memo: &mut Memo, key: &OutKey, live: Option<String>) {
    match live {
        Some(why) => {
            memo.live_revoked.insert(key.clone(), why);
        }
        None => {
            memo.live_revoked.remove(key);
        }
    }
    let revoked = memo
        .refused
        .get(key)
        .map(|r| r.why.clone())
        .or_else(|| memo.live_revoked.get(key).cloned());
    match revoked {
        Some(why) => {
            memo.revoked.insert(key.clone(), why);
        }
        None => {
            memo.revoked.remove(key);
        }
    }
}

/// Records an aggregated role's notice with the memo and its rule.
fn record_notice(
    memo: &mut Memo,
    key: &OutKey,
    notice: Option<Box<Notice>>,
    report_dirty: &mut BTreeSet<usize>,
) {
    let old = memo.noticed.get(key).cloned();
    let new = notice.map(|b| *b);
    // The same notice is one of the same rule, text, trigger and field: a
    // role once emitted (its output's field) and now only live (kept; the
    // rule's `spec.outputs`) says where it comes from anew.
    let same = match (&old, &new) {
        (None, None) => true,
        (Some((rule, text)), Some(n)) => {
            *rule == n.rule
                && *text == n.text
                && rule.is_none_or(|r| {
                    memo.rules[r]
                        .notices
                        .get(key)
                        .is_some_and(|(trigger, field, _)| {
                            *trigger == n.trigger && *field == n.field
                        })
                })
        }
        _ => false,
    };
    if !same {
        if let Some((Some(r), _)) = old {
            memo.rules[r].notices.remove(key);
            report_dirty.insert(r);
        }
        match new {
            Some(Notice {
                rule,
                trigger,
                field,
                text,
            }) => {
                if let Some(r) = rule {
                    memo.rules[r]
                        .notices
                        .insert(key.clone(), (trigger, field, text.clone()));
                    report_dirty.insert(r);
                } else {
                    tracing::warn!(object = ?key, notice = %text, "aggregated role of a rule that does not run");
                }
                memo.noticed.insert(key.clone(), (rule, text));
            }
            None => {
                memo.noticed.remove(key);
            }
        }
    }
}
