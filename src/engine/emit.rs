//! Emitting: runs the rules in order over the view, keeps who emits what,
//! settles conflicts, applies policy and assembles the evaluation — each
//! by the difference from the last evaluation made with the same memo.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::ScopedJoinHandle;

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::Engine;
use super::compile::CompiledRule;
use super::error::{EngineError, ErrorKind};
use super::expand::Evaluator;
use super::fast_hash::HashSet;
use super::grants::{Judge, allow_list_rules};
use super::incremental::caches::Caches;
use super::incremental::eval::EvalCaches;
use super::kinds::{gk_of, output_gk};
use super::limits;
use super::memo::{Changes, Emit, Emitters, Memo, Outcome, RuleMemo, TKey, TriggerMemo};
use super::model::{Desired, DesiredSet, Evaluation, OutKey, RuleReport, RuleState};
use super::output;
use super::output::selection_key;
use super::store::{GroupKind, ObjectStore, key_of, object_ref};
use super::view::View;
use crate::api::OutputKind;

/// One trigger's outputs before and after it was rendered again.
struct Delta {
    /// Shared by its outputs' emitters.
    trigger: Arc<TKey>,
    before: Vec<Arc<Desired>>,
    after: Vec<Arc<Desired>>,
}

/// Evaluates every rule, rendering again only what changed since `memo`
/// was made (everything, for an empty or foreign memo).
pub(super) fn evaluate(engine: &Engine, observed: &ObjectStore, memo: &mut Memo) -> Evaluation {
    // A one-shot memo has no read index to find what a change affects.
    let fresh = memo.engine != engine.id || (memo.one_shot && memo.seen.is_some());
    if !fresh
        && memo.seen == Some(observed.version())
        && let Some(last) = &memo.last
    {
        // Nothing changed: a version check.
        memo.renders = 0;
        return last.clone();
    }
    // Replaced below; dropped now, its reports (the memo's, shared) are
    // updated in place unless an evaluation returned before holds them.
    memo.last = None;
    let mut changes = changes_since(observed, memo, fresh);
    if let Some(adopted) = memo.adopted.take() {
        // Taken over from the engine of the rules before a change.
        changes.rules = adopted.rules;
        changes.whole.extend(adopted.whole);
    }
    let allow_rules = refresh_allow_rules(engine, observed, memo, &mut changes);
    memo.caches
        .owners
        .get_mut()
        .update((changes.all, &changes.keys), observed);
    let previous = memo.desired.clone();
    let mut report_dirty: BTreeSet<usize> = BTreeSet::new();
    if changes.all {
        start_over(engine, memo, &mut report_dirty);
    }
    if allow_rules.is_some() {
        memo.allow_rules = allow_rules;
    }
    memo.renders = 0;
    // The evaluation's clock, and what the outputs cached from earlier
    // evaluations hold (see `limits::Scope`).
    let _scope = limits::evaluation(
        &engine.options.limits,
        memo.rules.iter().map(|r| r.held).sum(),
    );
    // After everything changed the memo starts empty, so every output is
    // new and what the outputs touched is every emitted key: policy judges
    // those all anyway, and only contested keys need settling. Tracked per
    // output only for an incremental evaluation.
    let mut touched: BTreeSet<OutKey> = BTreeSet::new();
    // Outputs found to differ from the ones they replace, by the two
    // objects' addresses: policy need not compare them again. Each address
    // named a live object when the pair was made, and policy looks pairs up
    // with objects alive since then (the old desired one) or held by the
    // emitters (the new one), so a match is those same two objects.
    let mut differing: HashSet<(usize, usize)> = HashSet::default();

    run_rules(
        engine,
        observed,
        memo,
        &mut changes,
        &mut touched,
        &mut differing,
        &mut report_dirty,
    );
    if changes.all {
        let contested: BTreeSet<OutKey> = memo.emitters.contested().cloned().collect();
        settle_conflicts(memo, &contested, &mut report_dirty);
    } else {
        settle_conflicts(memo, &touched, &mut report_dirty);
    }
    let judged = apply_policy(
        engine,
        observed,
        memo,
        &touched,
        &differing,
        &changes,
        &mut report_dirty,
    );

    update_reports(engine, memo, report_dirty);
    let changed = changed_keys(&previous, memo, touched, judged, changes.all);
    prune_rules_cache(memo);
    memo.seen = Some(observed.version());
    let evaluation = Evaluation {
        desired: memo.desired.clone(),
        reports: Arc::clone(&memo.reports),
        contested: memo.contested.keys().cloned().collect(),
        revoked: memo.revoked.clone(),
        changed,
    };
    // A one-shot memo never returns its last result (it renders again).
    if !memo.one_shot {
        memo.last = Some(Evaluation {
            changed: Vec::new(),
            ..evaluation.clone()
        });
    }
    evaluation
}

/// What changed since the memo's evaluation: the store's journal, or
/// everything (a fresh memo, or a journal that no longer reaches back).
fn changes_since(observed: &ObjectStore, memo: &Memo, fresh: bool) -> Changes {
    let mut changes = Changes::default();
    let journal = if fresh {
        None
    } else {
        memo.seen.and_then(|v| observed.changes_since(v))
    };
    match journal {
        Some(it) => {
            for (gk, key) in it {
                changes.add(gk, key.clone());
            }
        }
        None => changes.all = true,
    }
    changes
}

/// The allow-list's effective rules, when they must be (re)computed: at
/// first, and for an aggregated list when ClusterRoles changed. Copies and
/// policy are judged by them, so when they differ from the memo's,
/// everything is evaluated again (`changes.all`): an allow-list changes
/// rarely.
fn refresh_allow_rules(
    engine: &Engine,
    observed: &ObjectStore,
    memo: &Memo,
    changes: &mut Changes,
) -> Option<Vec<PolicyRule>> {
    let allow = engine.options.allow.as_ref()?;
    let gk = output_gk(OutputKind::ClusterRole);
    let roles_changed = changes.whole(&gk) || changes.keys.get(&gk).is_some_and(|k| !k.is_empty());
    let known = memo.allow_rules.is_some() && !changes.all;
    if known && !(allow.is_aggregated() && roles_changed) {
        return None;
    }
    let rules = if allow.is_aggregated() {
        allow_list_rules(observed, allow)
    } else {
        allow.rules.clone()
    };
    if memo.allow_rules.as_ref() != Some(&rules) {
        changes.all = true;
    }
    // Set again after a fresh start too (which empties the memo).
    Some(rules)
}

/// Starts the memo afresh for this engine: every rule's report is made anew.
fn start_over(engine: &Engine, memo: &mut Memo, report_dirty: &mut BTreeSet<usize>) {
    *memo = Memo {
        engine: engine.id,
        rules: (0..engine.rules.len())
            .map(|_| RuleMemo::default())
            .collect(),
        reports: Arc::new(engine.fixed_reports.clone()),
        one_shot: memo.one_shot,
        // Shed triggers stay shed until the caller starts a new memo.
        shed: std::mem::take(&mut memo.shed),
        ..Memo::default()
    };
    report_dirty.extend(0..engine.rules.len());
}

/// Runs every rule not held, in order, on what changed: each one's deltas
/// update the emitters and reach the rules after it.
fn run_rules(
    engine: &Engine,
    observed: &ObjectStore,
    memo: &mut Memo,
    changes: &mut Changes,
    touched: &mut BTreeSet<OutKey>,
    differing: &mut HashSet<(usize, usize)>,
    report_dirty: &mut BTreeSet<usize>,
) {
    let held = |idx: usize| engine.options.held.contains(&engine.rules[idx].name);
    // The rule each rule not held takes its derived values from; the last
    // of a chain keeps them for the next evaluation (see `Derived`).
    let derivations: Vec<_> = engine.rules.iter().map(|r| &r.derivation).collect();
    let takes: Vec<_> = (0..engine.rules.len())
        .map(|idx| (!held(idx)).then(|| super::incremental::keys::derived_from(&derivations, idx)))
        .map(Option::flatten)
        .collect();
    let mut handed_on = vec![false; engine.rules.len()];
    for (from, _) in takes.iter().flatten() {
        handed_on[*from] = true;
    }
    // What each namespace's tenant rules spent rendering so far.
    let mut namespace_time: BTreeMap<&str, std::time::Duration> = BTreeMap::new();
    let tails = super::incremental::keys::chain_tails(&takes, &handed_on);
    for (idx, rule) in engine.rules.iter().enumerate() {
        if held(idx) {
            continue;
        }
        let mut rm = std::mem::take(&mut memo.rules[idx]);
        if let Some((from, common)) = takes[idx] {
            super::memo::share_derived(&mut rm, &mut memo.rules[from], common);
        } else if let Some(tail) = tails[idx]
            && let Some(common) = derivations[idx].common(derivations[tail])
        {
            // What the chain kept from the last evaluation.
            super::memo::share_derived(&mut rm, &mut memo.rules[tail], common);
        }
        let before = rm.signature.clone();
        // A tenant rule renders within what is left of its namespace's time.
        let tenant = super::tenant::rule_namespace(&rule.name);
        let started = std::time::Instant::now();
        let _namespace_scope = tenant.map(|ns| {
            let budget =
                std::time::Duration::from_secs_f64(engine.options.limits.seconds_per_namespace);
            let spent = namespace_time.get(ns).copied().unwrap_or_default();
            limits::namespace(budget.saturating_sub(spent))
        });
        let deltas = run_rule(
            engine,
            (idx, rule, handed_on[idx]),
            observed,
            memo,
            &mut rm,
            changes,
        );
        if let Some(ns) = tenant {
            *namespace_time.entry(ns).or_default() += started.elapsed();
        }
        if !deltas.is_empty() {
            report_dirty.insert(idx);
        }
        memo.renders += deltas.len();
        for d in deltas {
            apply_delta(idx, d, &mut memo.emitters, touched, differing, changes);
        }
        if rm.signature != before {
            // Which live objects of this rule are hidden changed.
            changes.whole.extend(rule.produces.iter().cloned());
        }
        memo.rules[idx] = rm;
    }
}

/// Reports of the rules whose outcomes changed, made again.
fn update_reports(engine: &Engine, memo: &mut Memo, report_dirty: BTreeSet<usize>) {
    for idx in report_dirty {
        let rule = &engine.rules[idx];
        let report = if engine.options.held.contains(&rule.name) {
            RuleReport::new(RuleState::Held)
        } else {
            build_report(&rule.name, &memo.rules[idx])
        };
        Arc::make_mut(&mut memo.reports).insert(rule.name.clone(), report);
    }
}

/// The desired objects that changed since `previous`, in key order.
fn changed_keys(
    previous: &DesiredSet,
    memo: &Memo,
    touched: BTreeSet<OutKey>,
    judged: Vec<(Arc<OutKey>, bool)>,
    all: bool,
) -> Vec<OutKey> {
    let changed: Vec<OutKey> = if previous.is_empty() {
        // Every desired object is new (all came from verdicts just made).
        let mut keys: Vec<OutKey> = memo
            .desired
            .iter()
            .map(|d| (d.kind, d.namespace.clone(), d.name.clone()))
            .collect();
        // Sorted by kind name, then namespace and name: a stable sort by
        // kind gives the keys' order.
        keys.sort_by_key(|k| k.0);
        keys
    } else {
        if all {
            let mut candidates: BTreeSet<OutKey> = touched;
            candidates.extend(judged.into_iter().map(|(k, _)| Arc::unwrap_or_clone(k)));
            candidates.extend(
                previous
                    .iter()
                    .map(|d| (d.kind, d.namespace.clone(), d.name.clone())),
            );
            candidates
                .into_iter()
                .filter(
                    |k| match (previous.get_shared(k), memo.desired.get_shared(k)) {
                        (None, None) => false,
                        (Some(a), Some(b)) => !Arc::ptr_eq(a, b) && **a != **b,
                        _ => true,
                    },
                )
                .collect()
        } else {
            // Every output a rule touched was judged (in key order), and
            // judging told which of them changed.
            debug_assert!(
                touched
                    .iter()
                    .all(|k| judged.binary_search_by(|(j, _)| (**j).cmp(k)).is_ok())
            );
            judged
                .into_iter()
                .filter(|(_, differs)| *differs)
                .map(|(k, _)| Arc::unwrap_or_clone(k))
                .collect()
        }
    };
    changed
}

/// Renders again the triggers of one rule that the changes reach;
/// `handed_on`: a later rule takes over its derived values.
fn run_rule(
    engine: &Engine,
    (idx, rule, handed_on): (usize, &CompiledRule, bool),
    observed: &ObjectStore,
    memo: &Memo,
    rm: &mut RuleMemo,
    changes: &Changes,
) -> Vec<Delta> {
    let one_shot = memo.one_shot;
    let view = View::new(observed, memo, engine, Some(idx));
    view.refresh_selections(changes);
    let evaluator = new_evaluator(engine, rule, EvalCaches::from_memo(!one_shot, rm));
    let trigger_gk = rule
        .spec
        .trigger
        .as_ref()
        .map(|t| GroupKind::new(&t.api_group, &t.kind));
    let (dirty, listed_all) = dirty_triggers((idx, rule), trigger_gk.as_ref(), rm, &view, changes);
    // The rule's clock; what the triggers rendered again held is given
    // back (their renders count anew).
    let _rule_scope = limits::rule();
    limits::replaced(
        dirty
            .iter()
            .filter_map(|t| match t {
                None => rm.static_set.as_ref(),
                Some(k) => rm.triggers.get(k).map(|(_, m)| m),
            })
            .map(|m| m.bytes)
            .sum(),
    );
    let rendered = render_dirty(
        engine,
        idx,
        rule,
        trigger_gk.as_ref(),
        observed,
        memo,
        changes,
        (&evaluator, &view),
        &dirty,
    );
    let deltas = apply_rendered(rm, dirty, rendered, listed_all, one_shot);
    // What the evaluator cached goes back to the rule's memo, bounded.
    evaluator
        .caches
        .store_into(rm, (one_shot, handed_on), !deltas.is_empty());
    deltas
}

/// One rendered trigger: its reference and its memo, `None` when it is
/// gone.
type Rendered = Vec<Option<(Option<String>, TriggerMemo)>>;

/// The triggers of a rule to render again, in order, and whether they
/// are all of them listed afresh (then the rule caches no trigger yet).
fn dirty_triggers(
    (idx, rule): (usize, &CompiledRule),
    trigger_gk: Option<&GroupKind>,
    rm: &RuleMemo,
    view: &View,
    changes: &Changes,
) -> (Vec<TKey>, bool) {
    let full = changes.all
        || changes.rules.contains(&idx)
        || rule.consumes.iter().any(|gk| changes.whole(gk));
    let mut dirty: BTreeSet<TKey> = BTreeSet::new();
    // Everything rendered afresh: the triggers in the view's order (sorted
    // by namespace and name), with no set built.
    let mut listed: Option<Vec<TKey>> = None;
    match trigger_gk {
        None => {
            if full || rm.static_set.is_none() {
                dirty.insert(None);
            }
        }
        Some(tgk) => {
            if full && rm.triggers.is_empty() {
                let mut keys: Vec<TKey> = view.list(tgk, None).iter().map(|o| key_of(o)).collect();
                keys.retain(Option::is_some);
                if !keys.is_sorted_by(|a, b| a < b) {
                    keys.sort_unstable();
                    keys.dedup();
                }
                listed = Some(keys);
            } else if full {
                for (k, _) in rm.triggers.iter() {
                    dirty.insert(Some(k.clone()));
                }
                for o in view.list(tgk, None).iter() {
                    if let Some(k) = key_of(o) {
                        dirty.insert(Some(k));
                    }
                }
            } else if let Some(keys) = changes.keys.get(tgk) {
                dirty.extend(keys.iter().cloned().map(Some));
            }
        }
    }
    if !full {
        for gk in &rule.consumes {
            if let Some(keys) = changes.keys.get(gk) {
                for k in keys {
                    rm.index.affected(gk, k, view, &mut dirty);
                }
            }
        }
    }

    // Listed: the rule has no trigger cached, so there is none to take out, and
    // the new ones are built into the map at once, in order.
    let listed_all = listed.is_some();
    let dirty: Vec<TKey> = match listed {
        Some(keys) => keys,
        None => dirty.into_iter().collect(),
    };
    (dirty, listed_all)
}

/// Renders the dirty triggers: a large one-shot set on two threads, else
/// on this one, in order.
#[allow(clippy::too_many_arguments)]
fn render_dirty(
    engine: &Engine,
    idx: usize,
    rule: &CompiledRule,
    tgk: Option<&GroupKind>,
    observed: &ObjectStore,
    memo: &Memo,
    changes: &Changes,
    (evaluator, view): (&Evaluator, &View),
    dirty: &[TKey],
) -> Rendered {
    let one_shot = memo.one_shot;
    let scope = limits::current();
    let shed = memo.shed.get(&rule.name);
    let one =
        |ev: &Evaluator, v: &View, t: &TKey| render_trigger(engine, (rule, shed), tgk, ev, v, t);
    let split: Option<Rendered> =
        (one_shot && tgk.is_some() && dirty.len() >= SPLIT_MIN).then(|| {
            // A one-shot render's triggers read only the store and earlier
            // rules: another thread, with its own view and caches, shares
            // them out chunk by chunk, merged back in trigger order.
            let chunks = Chunks::new(dirty);
            let shared = &chunks;
            let (emitters, rules, allow_rules) =
                (&memo.emitters, memo.rules.as_slice(), memo.allow_rules());
            std::thread::scope(|s| {
                // The evaluation thread's large stack: renders recurse.
                let other = std::thread::Builder::new()
                    .name("rbac-rules-eval".to_string())
                    .stack_size(limits::EVAL_STACK_BYTES)
                    .spawn_scoped(s, move || {
                        let _scope = limits::enter(scope);
                        let caches = Caches::default();
                        let view = View::detached(
                            observed,
                            emitters,
                            rules,
                            engine,
                            Some(idx),
                            (&caches, allow_rules),
                        );
                        view.refresh_selections(changes);
                        let ev = new_evaluator(engine, rule, EvalCaches::new(false));
                        shared.run(|t| one(&ev, &view, t))
                    });
                let mine = chunks.run(|t| one(evaluator, view, t));
                merge_chunks(mine, joined(other))
            })
        });
    match split {
        Some(split) => split,
        None => dirty.iter().map(|t| one(evaluator, view, t)).collect(),
    }
}

/// Puts the rendered triggers in the rule's memo and its read index:
/// the deltas, before and after, of the outputs of each.
fn apply_rendered(
    rm: &mut RuleMemo,
    dirty: Vec<TKey>,
    rendered: Rendered,
    listed_all: bool,
    one_shot: bool,
) -> Vec<Delta> {
    let mut deltas = Vec::with_capacity(dirty.len());
    let mut fresh_triggers = Vec::new();
    for (t, new) in dirty.into_iter().zip(rendered) {
        let old: Option<(Option<String>, TriggerMemo)> = match &t {
            None => rm.static_set.take().map(|m| (None, m)),
            Some(_) if listed_all => None,
            Some(k) => rm.triggers.remove(k).map(|(r, m)| (Some(r), m)),
        };
        if old.is_none() && new.is_none() {
            continue;
        }
        // Read as before (a family member re-rendered for another's
        // change): the index already says so, and keeps the old reads.
        let mut same_reads = None;
        let mut before = Vec::new();
        if let Some((tref, mut m)) = old {
            if new.as_ref().is_some_and(|(_, n)| n.reads == m.reads) {
                same_reads = Some(std::mem::take(&mut m.reads));
            } else {
                rm.index.remove(&t, &m.reads);
            }
            count(rm, &t, tref.as_deref(), &m, false);
            before = m.outcome.outputs().to_vec();
        }
        let mut after = Vec::new();
        if let Some((tref, mut m)) = new {
            if let Some(reads) = same_reads {
                m.reads = reads;
            } else if !one_shot {
                // A one-shot evaluator records no reads: nothing to index.
                rm.index.add(&t, &m.reads);
            }
            count(rm, &t, tref.as_deref(), &m, true);
            after = m.outcome.outputs().to_vec();
            match &t {
                None => rm.static_set = Some(m),
                Some(k) if listed_all => {
                    fresh_triggers.push((k.clone(), (tref.unwrap_or_default(), m)));
                }
                Some(k) => {
                    rm.triggers.insert(k.clone(), (tref.unwrap_or_default(), m));
                }
            }
        }
        deltas.push(Delta {
            trigger: Arc::new(t),
            before,
            after,
        });
    }
    if listed_all {
        rm.triggers = fresh_triggers.into_iter().collect();
    }
    deltas
}

/// Triggers of one rule a one-shot render splits between two threads.
const SPLIT_MIN: usize = 64;

/// Items two threads share out: each takes the next [`CHUNK`] until none
/// are left, so the slower one (colder caches, descheduled) takes fewer
/// and neither waits long for the other.
struct Chunks<'a, I> {
    items: &'a [I],
    next: AtomicUsize,
}

/// Items a thread takes at a time from [`Chunks`].
const CHUNK: usize = 8;

impl<'a, I> Chunks<'a, I> {
    fn new(items: &'a [I]) -> Self {
        Chunks {
            items,
            next: AtomicUsize::new(0),
        }
    }

    /// Maps chunks until none are left: each with the index of its first
    /// item.
    fn run<R>(&self, mut f: impl FnMut(&I) -> R) -> Done<R> {
        let mut done = Vec::new();
        loop {
            let start = self.next.fetch_add(CHUNK, Ordering::Relaxed);
            if start >= self.items.len() {
                return done;
            }
            let end = (start + CHUNK).min(self.items.len());
            done.push((start, self.items[start..end].iter().map(&mut f).collect()));
        }
    }
}

/// The chunks one thread did: each chunk's first index and its results.
type Done<R> = Vec<(usize, Vec<R>)>;

/// The chunks a second thread did: none when it could not start (this
/// thread then took every chunk); its panic goes on as this thread's.
fn joined<R>(other: std::io::Result<ScopedJoinHandle<'_, Done<R>>>) -> Done<R> {
    match other {
        Ok(handle) => handle
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        Err(_) => Vec::new(),
    }
}

/// Two threads' results from [`Chunks::run`], in item order.
fn merge_chunks<R>(mut a: Done<R>, b: Done<R>) -> Vec<R> {
    a.extend(b);
    a.sort_unstable_by_key(|(start, _)| *start);
    // Sized at once: collecting a flat_map would grow it by doubling.
    let mut out = Vec::with_capacity(a.iter().map(|(_, r)| r.len()).sum());
    for (_, r) in a {
        out.extend(r);
    }
    out
}

/// A rule's evaluator over its caches.
fn new_evaluator<'a>(
    engine: &'a Engine,
    rule: &'a CompiledRule,
    caches: EvalCaches,
) -> Evaluator<'a> {
    Evaluator {
        engine,
        rule,
        warnings: RefCell::default(),
        caches,
    }
}

/// Renders one trigger (`None`: the rule's static set); `None` when the
/// trigger is gone.
fn render_trigger(
    engine: &Engine,
    (rule, shed): (&CompiledRule, Option<&BTreeMap<Option<String>, String>>),
    trigger_gk: Option<&GroupKind>,
    evaluator: &Evaluator,
    view: &View,
    t: &TKey,
) -> Option<(Option<String>, TriggerMemo)> {
    // Shed by a total (`limits::shed`): failed, not rendered.
    let shed_memo = |m: &String| TriggerMemo {
        outcome: Outcome::Failed(super::error::FieldError::new(
            ErrorKind::LimitExceeded,
            "spec.outputs",
            m.clone(),
        )),
        bytes: 0,
        reads: evaluator.caches.take_reads(),
        warnings: Vec::new(),
    };
    match (t, &rule.spec.trigger, trigger_gk) {
        (None, _, _) => {
            if let Some(m) = shed.and_then(|s| s.get(&None)) {
                return Some((None, shed_memo(m)));
            }
            let budget = limits::start(&engine.options.limits);
            evaluator.start(None);
            let mut ctx = evaluator.base_context();
            let outcome = match evaluator.render(&mut ctx, None, view) {
                Ok(outs) => Outcome::Rendered(outs.into_iter().map(Arc::new).collect()),
                Err(e) => Outcome::Failed(e),
            };
            let input = limits::input();
            drop(budget);
            let (outcome, bytes) = admitted(outcome, &engine.options.limits, input);
            Some((
                None,
                TriggerMemo {
                    outcome,
                    bytes,
                    reads: evaluator.caches.take_reads(),
                    warnings: evaluator.take_warnings(),
                },
            ))
        }
        (Some(k), Some(trigger), Some(tgk)) => view.get_shared(tgk, k).map(|obj| {
            let tref = object_ref(obj);
            if let Some(m) = shed.and_then(|s| s.get(&Some(tref.clone()))) {
                return (Some(tref), shed_memo(m));
            }
            let budget = limits::start(&engine.options.limits);
            let outcome = evaluator.trigger_outcome(trigger, obj, view);
            let rendered = limits::used();
            let input = limits::input();
            drop(budget);
            if limits::caches_may_have_grown(rendered) {
                evaluator.caches.bound_bytes(super::memo::DERIVED_BYTES_MAX);
            }
            let (outcome, bytes) = admitted(outcome, &engine.options.limits, input);
            if matches!(outcome, Outcome::Failed(_)) {
                // Its text, interned for outputs now gone, goes too.
                view.interner.borrow_mut().forget_unused();
            }
            (
                Some(tref),
                TriggerMemo {
                    outcome,
                    bytes,
                    reads: evaluator.caches.take_reads(),
                    warnings: evaluator.take_warnings(),
                },
            )
        }),
        _ => None,
    }
}

/// A rendered trigger's outputs admitted by its own bound (`limits::admit`:
/// what it may hold for the `input` bytes it read), with the bytes they
/// hold; over it, the trigger fails (`LimitExceeded`) and its outputs go.
fn admitted(outcome: Outcome, limits: &super::Limits, input: usize) -> (Outcome, usize) {
    let Outcome::Rendered(outputs) = outcome else {
        return (outcome, 0);
    };
    match limits::admit(&outputs, limits, input) {
        Ok(bytes) => (Outcome::Rendered(outputs), bytes),
        Err(m) => (
            Outcome::Failed(super::error::FieldError::new(
                ErrorKind::LimitExceeded,
                "spec.outputs",
                m,
            )),
            0,
        ),
    }
}

/// Adds (or, `add` false, takes away) one trigger's outcome to the rule's
/// running counts.
fn count(rm: &mut RuleMemo, t: &TKey, tref: Option<&str>, m: &TriggerMemo, add: bool) {
    let outputs = m.outcome.outputs().len();
    if add {
        rm.emitted += outputs;
        rm.held = rm.held.saturating_add(m.bytes);
        rm.rendered = rm.rendered.saturating_add(m.bytes);
    } else {
        rm.emitted = rm.emitted.saturating_sub(outputs);
        rm.held = rm.held.saturating_sub(m.bytes);
    }
    let Some(key) = t else {
        rm.signature.static_preserved = add && m.preserves();
        return;
    };
    if m.matched() {
        if add {
            rm.matched += 1;
        } else {
            rm.matched = rm.matched.saturating_sub(1);
        }
    }
    if add && m.noted() {
        rm.noted.insert(key.clone());
    } else if !add {
        rm.noted.remove(key);
    }
    if let Some(tref) = tref
        && m.preserves()
    {
        if add {
            rm.signature.preserved.insert(tref.to_string());
        } else {
            rm.signature.preserved.remove(tref);
        }
    }
}

/// Puts one trigger's copy of an object in its emitter list (kept in rule
/// and trigger order), replacing the trigger's old copy; `None` removes it.
fn place(list: &mut Vec<Emit>, rule: usize, trigger: &Arc<TKey>, new: Option<&Arc<Desired>>) {
    list.retain(|e| !(e.rule == rule && e.trigger == *trigger));
    if let Some(n) = new {
        let at = list.partition_point(|e| (e.rule, &e.trigger) < (rule, trigger));
        list.insert(
            at,
            Emit {
                rule,
                trigger: Arc::clone(trigger),
                desired: Arc::clone(n),
            },
        );
    }
}

/// Applies one trigger's changed outputs to who emits what.
fn apply_delta(
    rule: usize,
    d: Delta,
    emitters: &mut Emitters,
    touched: &mut BTreeSet<OutKey>,
    differing: &mut HashSet<(usize, usize)>,
    changes: &mut Changes,
) {
    let key_of_desired = |x: &Desired| (x.kind, x.namespace.clone(), x.name.clone());
    if changes.all && d.before.is_empty() {
        // A fresh memo: every output is new; a key emitted twice by one
        // trigger is its last copy, as below.
        let mut seen: HashSet<(OutputKind, &str, &str)> = HashSet::default();
        for n in d.after.iter().rev() {
            if !seen.insert((n.kind, n.namespace.as_str(), n.name.as_str())) {
                continue;
            }
            emitters.update(Cow::Owned(key_of_desired(n)), |list| {
                place(list, rule, &d.trigger, Some(n));
            });
        }
        return;
    }
    let same_keys = |a: &Desired, b: &Desired| {
        a.kind == b.kind && a.namespace == b.namespace && a.name == b.name
    };
    let mut set = |key: &OutKey, new: Option<&Arc<Desired>>| {
        emitters.update(Cow::Borrowed(key), |list| {
            place(list, rule, &d.trigger, new)
        });
        if !changes.all {
            touched.insert(key.clone());
            // Everything is read again anyway when everything changed.
            changes.add(gk_of(key.0), (key.1.clone(), key.2.clone()));
        }
    };
    // Most renders emit the same objects in the same order as before
    // (and once each): paired in place, no maps built.
    let distinct = |xs: &[Arc<Desired>]| {
        xs.iter()
            .enumerate()
            .all(|(i, x)| xs[..i].iter().all(|y| !same_keys(x, y)))
    };
    if d.before.len() == d.after.len()
        && d.before.len() <= PAIRED_MAX
        && d.before.iter().zip(&d.after).all(|(a, b)| same_keys(a, b))
        && distinct(&d.after)
    {
        for (a, b) in d.before.iter().zip(&d.after) {
            if Arc::ptr_eq(a, b) || **a == **b {
                continue;
            }
            differing.insert((Arc::as_ptr(a) as usize, Arc::as_ptr(b) as usize));
            set(&key_of_desired(b), Some(b));
        }
        return;
    }
    let before: BTreeMap<OutKey, &Arc<Desired>> =
        d.before.iter().map(|x| (key_of_desired(x), x)).collect();
    let after: BTreeMap<OutKey, &Arc<Desired>> =
        d.after.iter().map(|x| (key_of_desired(x), x)).collect();
    let keys: BTreeSet<&OutKey> = before.keys().chain(after.keys()).collect();
    for key in keys {
        let new = after.get(key);
        if let (Some(a), Some(b)) = (before.get(key), new) {
            if ***a == ***b {
                continue;
            }
            differing.insert((Arc::as_ptr(a) as usize, Arc::as_ptr(b) as usize));
        }
        set(key, new.copied());
    }
}

/// Outputs of one trigger paired in place by [`apply_delta`] at most (the
/// check that each is emitted once is quadratic).
const PAIRED_MAX: usize = 16;

/// Objects two emitters (rules or triggers) both emit: neither copy is
/// desired; every emitter gets a Conflict error and keeps its trigger.
fn settle_conflicts(
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

use super::model::Refusal;

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
    /// An aggregated role's notice (see [`Judge::notice`]): its rule (when
    /// it runs), trigger, field and text. Boxed: rare.
    notice: Option<Box<Notice>>,
}

/// A notice on a managed aggregated role: rule, trigger, field, text.
type Notice = (Option<usize>, Option<String>, String, String);

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
                judge.notice(d.object.shared_value()).map(|n| {
                    let trigger = d.trigger.as_deref().map(str::to_string);
                    (cand.map(|e| e.rule), trigger, d.field.to_string(), n)
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
        (rule, trigger, "spec.outputs".to_string(), text)
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
fn apply_policy(
    engine: &Engine,
    observed: &ObjectStore,
    memo: &mut Memo,
    touched: &BTreeSet<OutKey>,
    differing: &HashSet<(usize, usize)>,
    changes: &Changes,
    report_dirty: &mut BTreeSet<usize>,
) -> Vec<(Arc<OutKey>, bool)> {
    let role_kinds = [
        output_gk(OutputKind::ClusterRole),
        output_gk(OutputKind::Role),
    ];
    // Namespaces: a tenant output's ceiling is named by its Namespace's
    // label.
    let namespace_gk = GroupKind::new("", "Namespace");
    let roles_changed = role_kinds
        .iter()
        .chain([&namespace_gk])
        .any(|gk| changes.whole(gk) || changes.keys.get(gk).is_some_and(|k| !k.is_empty()));
    let all = changes.all;
    let (protected, allow_rules) = allow_list(engine, memo);
    let reached = View::new(observed, memo, engine, None).refresh_selections(changes);
    let keys: Vec<Arc<OutKey>> = if all {
        every_key(observed, memo, touched)
    } else {
        changed_keys_to_judge(memo, touched, changes, roles_changed, &reached)
    };
    let keys_list: Vec<&OutKey> = keys.iter().map(|k| &**k).collect();
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
    keys.into_iter().zip(changed).collect()
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
fn changed_keys_to_judge(
    memo: &Memo,
    touched: &BTreeSet<OutKey>,
    changes: &Changes,
    roles_changed: bool,
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
        let bound = reads.is_empty() && roles_changed;
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
    differing: &HashSet<(usize, usize)>,
) -> bool {
    // What the key held before this evaluation (the memo's desired
    // set changes only here, once per key): the change reported.
    match desired {
        Some(d) if fresh => {
            memo.desired.insert(d);
            true
        }
        Some(d) => match memo.desired.insert(Arc::clone(&d)) {
            Some(old) => {
                !Arc::ptr_eq(&old, &d)
                    && (differing.contains(&(Arc::as_ptr(&old) as usize, Arc::as_ptr(&d) as usize))
                        || *old != *d)
            }
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
    if old.as_ref().map(|(r, n)| (*r, n)) != new.as_ref().map(|n| (n.0, &n.3)) {
        if let Some((Some(r), _)) = old {
            memo.rules[r].notices.remove(key);
            report_dirty.insert(r);
        }
        match new {
            Some((rule, trigger, field, text)) => {
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

/// A rule's report from its remembered outcomes, conflicts and refusals,
/// in trigger order.
fn build_report(rule: &str, rm: &RuleMemo) -> RuleReport {
    let mut report = RuleReport::new(RuleState::Evaluated);
    if let Some(s) = &rm.static_set {
        report
            .warnings
            .extend(s.warnings.iter().map(|w| w.clone().into_engine(rule, None)));
        if let Outcome::Failed(e) | Outcome::MatchError(e) = &s.outcome {
            report.errors.push(e.clone().into_engine(rule, None));
            report.static_kept = true;
        }
        report.notices.extend(
            s.outcome
                .outputs()
                .iter()
                .filter_map(|d| d.no_subjects_notice(rule)),
        );
    }
    for key in &rm.noted {
        let Some((tref, t)) = rm.triggers.get(key) else {
            continue;
        };
        report.warnings.extend(
            t.warnings
                .iter()
                .map(|w| w.clone().into_engine(rule, Some(tref))),
        );
        match &t.outcome {
            Outcome::MatchError(e) | Outcome::Failed(e) => {
                report.errors.push(e.clone().into_engine(rule, Some(tref)));
                report.kept_triggers.insert(tref.clone());
            }
            Outcome::Frozen => {
                report.kept_triggers.insert(tref.clone());
            }
            Outcome::NoMatch | Outcome::Rendered(_) => {}
        }
        report.notices.extend(
            t.outcome
                .outputs()
                .iter()
                .filter_map(|d| d.no_subjects_notice(rule)),
        );
    }
    report.matched_triggers = rm.matched;
    for ((kind, ns, name), trigger) in &rm.conflicts {
        let obj = if ns.is_empty() {
            format!("{kind} {name}")
        } else {
            format!("{kind} {ns}/{name}")
        };
        report.errors.push(EngineError {
            kind: ErrorKind::Conflict,
            rule: rule.to_string(),
            field: "spec.outputs".into(),
            trigger: trigger.clone(),
            message: format!(
                "{obj} is emitted by more than one rule or trigger; neither copy is applied"
            ),
        });
        match trigger {
            Some(t) => {
                report.kept_triggers.insert(t.clone());
            }
            None => report.static_kept = true,
        }
    }
    for r in rm.refused.values() {
        report.errors.push(EngineError {
            kind: super::tenant::refusal_kind(&r.why),
            rule: rule.to_string(),
            field: r.field.clone(),
            trigger: r.trigger.clone(),
            message: r.why.clone(),
        });
    }
    for (trigger, field, text) in rm.notices.values() {
        report.notices.push(EngineError {
            kind: ErrorKind::UnmanagedAggregation,
            rule: rule.to_string(),
            field: field.clone(),
            trigger: trigger.clone(),
            message: text.clone(),
        });
    }
    report.outputs = rm
        .emitted
        .saturating_sub(rm.conflicts.len())
        .saturating_sub(rm.refused.len());
    report
}

/// Drops parsed rules and denials no object holds any more, once the
/// caches have doubled.
fn prune_rules_cache(memo: &mut Memo) {
    let rules = memo.caches.rules.get_mut();
    let denials = memo.caches.denials.get_mut();
    let copies = memo.caches.copies.get_mut();
    let verdicts = memo.caches.copy_verdicts.get_mut();
    let size = rules.len() + denials.len() + copies.len() + verdicts.len();
    if size > 2 * memo.rules_cache_pruned.max(1024) {
        // Copies, denials and copy verdicts hold their rule lists weakly.
        copies.retain(|_, (held, _)| held.iter().all(|h| h.strong_count() > 0));
        rules.retain(|_, (held, _)| Arc::strong_count(held) > 1);
        denials.retain(|_, (held, _)| held.strong_count() > 0);
        verdicts.retain(|_, (held, _)| held.strong_count() > 0);
        memo.rules_cache_pruned = rules.len() + denials.len() + copies.len() + verdicts.len();
    }
}
