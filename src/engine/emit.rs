//! One evaluation, step by step ([`evaluate`]): what changed since the
//! memo's evaluation, the rules run in order over the view (each rendering
//! again only the triggers a change reaches) keeping who emits what, then
//! policy ([`super::policy`]) and the reports ([`super::report`]) — each by
//! the difference from the last evaluation made with the same memo.
//!
//! Reference twin: `reference/mod.rs` (`evaluate`) and `reference/trigger.rs`
//! (`run_rule`).

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::rbac::v1::PolicyRule;

use super::Engine;
use super::chunks::{Chunks, SPLIT_MIN, joined, merge_chunks};
use super::compile::CompiledRule;
use super::error::ErrorKind;
use super::expand::Evaluator;
use super::fast_hash::HashSet;
use super::grants::allow_list_rules;
use super::incremental::caches::Caches;
use super::incremental::eval::EvalCaches;
use super::kinds::{gk_of, output_gk};
use super::limits;
use super::memo::{Changes, Emit, Emitters, Memo, Outcome, RuleMemo, TKey, TriggerMemo};
use super::model::{Desired, Evaluation, OutKey};
use super::policy::{Differing, apply_policy, settle_conflicts};
use super::report::{changed_keys, update_reports};
use super::store::{GroupKind, ObjectStore, object_ref};
use super::view::View;
use crate::api::OutputKind;

/// One trigger's outputs before and after it was rendered again.
struct Delta {
    /// Shared by its outputs' emitters.
    trigger: Arc<TKey>,
    before: Vec<Arc<Desired>>,
    after: Vec<Arc<Desired>>,
}

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
    // Outputs found to differ from the ones they replace.
    let mut differing = Differing::default();

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
    let roles_changed = changes.touches(&gk);
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
    differing: &mut Differing,
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
    evaluator.caches.store_into(
        rm,
        (one_shot, handed_on),
        (!deltas.is_empty(), changes.objects_changed()),
    );
    deltas
}

/// The rendered triggers, in order: `None` for one that is gone.
type Rendered = Vec<Option<RenderedTrigger>>;

/// One rendered trigger.
struct RenderedTrigger {
    /// Its reference (`None`: the static set).
    tref: Option<String>,
    memo: TriggerMemo,
}

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
                let mut keys: Vec<TKey> = view.keys(tgk).into_iter().map(Some).collect();
                if !keys.is_sorted_by(|a, b| a < b) {
                    keys.sort_unstable();
                    keys.dedup();
                }
                listed = Some(keys);
            } else if full {
                for (k, _) in rm.triggers.iter() {
                    dirty.insert(Some(k.clone()));
                }
                dirty.extend(view.keys(tgk).into_iter().map(Some));
            } else if let Some(keys) = changes.keys.get(tgk) {
                dirty.extend(keys.iter().cloned().map(Some));
            }
        }
    }
    if !full {
        for gk in &rule.consumes {
            if let Some(keys) = changes.keys.get(gk) {
                for k in keys {
                    if !shadowed(gk, k, view, changes) {
                        rm.index.affected(gk, k, view, &mut dirty);
                    }
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

/// Whether the change of a live object (the store's, not a render's) is
/// hidden from the reader by an earlier rule's output of that name, which
/// no render changed in this evaluation: the reader sees that output, as
/// it did in the last evaluation (the controller's own writes coming back
/// through its watches cost no render).
fn shadowed(gk: &GroupKind, key: &super::store::ObjectKey, view: &View, changes: &Changes) -> bool {
    let Some(kind) = super::kinds::output_kind(gk) else {
        return false;
    };
    matches!(view.get_seen(gk, key), Some(super::model::Seen::Emitted(_)))
        && !changes.emitted.contains(&(kind, key.clone()))
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
        let old: Option<RenderedTrigger> = match &t {
            None => rm
                .static_set
                .take()
                .map(|memo| RenderedTrigger { tref: None, memo }),
            Some(_) if listed_all => None,
            Some(k) => rm.triggers.remove(k).map(|(r, memo)| RenderedTrigger {
                tref: Some(r),
                memo,
            }),
        };
        if old.is_none() && new.is_none() {
            continue;
        }
        // Read as before (a family member re-rendered for another's
        // change): the index already says so, and keeps the old reads.
        let mut same_reads = None;
        let mut before = Vec::new();
        if let Some(RenderedTrigger { tref, memo: mut m }) = old {
            if new.as_ref().is_some_and(|n| n.memo.reads == m.reads) {
                same_reads = Some(std::mem::take(&mut m.reads));
            } else {
                rm.index.remove(&t, &m.reads);
            }
            count(rm, &t, tref.as_deref(), &m, false);
            before = m.outcome.outputs().to_vec();
        }
        let mut after = Vec::new();
        if let Some(RenderedTrigger { tref, memo: mut m }) = new {
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
) -> Option<RenderedTrigger> {
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
                return Some(RenderedTrigger {
                    tref: None,
                    memo: shed_memo(m),
                });
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
            Some(RenderedTrigger {
                tref: None,
                memo: TriggerMemo {
                    outcome,
                    bytes,
                    reads: evaluator.caches.take_reads(),
                    warnings: evaluator.take_warnings(),
                },
            })
        }
        // Owned: a kind read only as triggers is held packed, and read
        // back for this render alone.
        (Some(k), Some(trigger), Some(tgk)) => view.get_owned(tgk, k).map(|obj| {
            let obj = &obj;
            let tref = object_ref(obj);
            if let Some(m) = shed.and_then(|s| s.get(&Some(tref.clone()))) {
                return RenderedTrigger {
                    tref: Some(tref),
                    memo: shed_memo(m),
                };
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
            RenderedTrigger {
                tref: Some(tref),
                memo: TriggerMemo {
                    outcome,
                    bytes,
                    reads: evaluator.caches.take_reads(),
                    warnings: evaluator.take_warnings(),
                },
            }
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
    differing: &mut Differing,
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
            changes.add_emitted(key.0, gk_of(key.0), (key.1.clone(), key.2.clone()));
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
            differing.note(a, b);
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
            differing.note(a, b);
        }
        set(key, new.copied());
    }
}

/// Outputs of one trigger paired in place by [`apply_delta`] at most (the
/// check that each is emitted once is quadratic).
const PAIRED_MAX: usize = 16;

/// Drops parsed rules, and what was worked out per rule list, that no
/// object holds any more, once the caches have doubled.
fn prune_rules_cache(memo: &mut Memo) {
    let c = &mut memo.caches;
    let (rules, copies) = (c.rules.get_mut(), c.copies.get_mut());
    let (denials, verdicts) = (c.denials.get_mut(), c.copy_verdicts.get_mut());
    let uncovered = c.uncovered.get_mut();
    let size = rules.len() + copies.len() + denials.len() + verdicts.len() + uncovered.len();
    if size > 2 * memo.rules_cache_pruned.max(1024) {
        // Copies and the per-list values hold their rule lists weakly.
        copies.retain(|_, (held, _)| held.iter().all(|h| h.strong_count() > 0));
        rules.retain(|_, (held, _)| Arc::strong_count(held) > 1);
        denials.prune();
        verdicts.prune();
        uncovered.prune();
        memo.rules_cache_pruned =
            rules.len() + copies.len() + denials.len() + verdicts.len() + uncovered.len();
    }
}
