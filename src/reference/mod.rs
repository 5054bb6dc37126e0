//! The reference evaluator: the meaning of a rule set, and nothing else.
//!
//! This module is the specification of what the rules in `docs/rules.md`
//! mean. Given the same inputs as [`Engine::new`](crate::engine::Engine::new)
//! and [`Engine::evaluate`](crate::engine::Engine::evaluate) it computes the
//! same [`Evaluation`] — desired objects, per-rule reports (state, errors,
//! warnings, notices), refusals and revocations, contested objects — by the
//! plainest route: no caches, no memo, no address keys, no threads, no
//! mode flags. The incremental engine must agree with it after every
//! change (`tests/differential.rs`, `fuzz/fuzz_targets/differential.rs`);
//! when they differ, the docs decide which one is wrong.
//!
//! The whole flow, one stage per file:
//!
//! 1. [`order`]: every rule is compiled once (an invalid rule gets a
//!    report and does not run), its params set, and the rules ordered so
//!    that a rule reading a kind runs after the rules emitting it.
//! 2. For each rule, in that order, for each trigger object ([`trigger`]:
//!    `trigger.selector`, `conditions`, `metadataMatch`, `pause`,
//!    deletion, `require`) — or once for a static rule:
//!    [`related`] (`related[]`: `when`, `objects`, `listField`, `where`,
//!    `require`), then [`vars`] (`vars[]`), then [`outputs`] (`outputs[]`:
//!    `forEach`, `as`, `when`, `name`, `namespace`, `labels`,
//!    `annotations`, `rules`, `rulesFrom`, `aggregationRule`, `roleRef`,
//!    `subjects`; template lists and `$merge` in [`values`]; operators of
//!    conditions in [`conditions`]). What a rule reads is [`world`]: the
//!    observed objects overlaid with what earlier rules emitted.
//! 3. [`policy`], once every rule has run: conflicts, the default
//!    denials, protected labels and the allow-list over every emitted and
//!    every live managed object; a refusal revokes.
//! 4. [`report`]: each rule's report from what its triggers did.
//!
//! Leaf functions that are themselves meaning are shared with the engine:
//! template rendering and helpers ([`crate::engine::template`]), rule
//! preparation, compilation and ordering (`engine::order`,
//! [`crate::engine::compile`]; the reference passes its own plain
//! templates), field paths, formats, output validation
//! ([`crate::engine::output`]), selectors and RBAC coverage
//! ([`crate::policy`]).
//!
//! Limits: time limits are not meaning and are not applied. The limits of
//! one trigger's render (`--max-list-length`, bytes and objects per
//! trigger, the amplification bound) are not applied either: the reference
//! assumes inputs within them (the differential tests keep their inputs
//! so). The totals of a rule and of the evaluation are applied, as the
//! engine applies them: when one is over its limit, the triggers
//! [`crate::engine::limits::shed`] picks from the outputs fail and every
//! rule runs again without them (again while one is still over, as many
//! times as the engine). The engine's cap on what one pass holds before
//! shedding (a memory stop, in render order) is not applied. The template depth limit is applied, as
//! part of compiling a rule.

mod conditions;
mod judge;
mod order;
mod outputs;
mod policy;
mod related;
mod report;
mod run;
mod trigger;
mod values;
mod vars;
mod world;

use crate::engine::error::FieldError;
use crate::engine::limits::Shed;
use crate::engine::{ErrorKind, Evaluation, ObjectStore, Options, RuleSource};

/// Evaluates `rules` against `observed`: what
/// [`Engine::evaluate`](crate::engine::Engine::evaluate) returns for
/// `Engine::new(rules, options)`, but for [`Evaluation::changed`], which
/// here lists every desired object (as for a fresh memo).
pub fn evaluate(rules: &[RuleSource], options: &Options, observed: &ObjectStore) -> Evaluation {
    let prepared = order::prepare(rules, options);
    let mut all = Shed::new();
    let mut evaluation = evaluate_shedding(&prepared, options, observed, &all);
    for _ in 0..crate::engine::limits::MAX_SHED_PASSES {
        let (shed, _) = crate::engine::limits::shed(evaluation.desired.iter(), &options.limits);
        if shed.is_empty() {
            break;
        }
        for (rule, triggers) in shed {
            all.entry(rule).or_default().extend(triggers);
        }
        evaluation = evaluate_shedding(&prepared, options, observed, &all);
    }
    evaluation
}

/// Every rule run in order, the triggers in `shed` failing with their
/// message instead of rendering; then policy and the reports.
fn evaluate_shedding(
    prepared: &order::Prepared,
    options: &Options,
    observed: &ObjectStore,
    shed: &Shed,
) -> Evaluation {
    let grants = world::Grants::new(observed, options);
    let mut emitted = world::Emitted::default();
    let mut runs: Vec<run::RuleRun> = Vec::new();
    for (idx, rule) in prepared.rules.iter().enumerate() {
        let mut run = if options.held.contains(&rule.name) {
            run::RuleRun::held()
        } else {
            let world = world::World::new(observed, prepared, &emitted, &runs, Some(idx), &grants);
            trigger::run_rule(rule, &prepared.templates, &world)
        };
        if let Some(shed) = shed.get(&rule.name) {
            for t in &mut run.triggers {
                if let Some(message) = shed.get(&t.tref) {
                    t.outcome = run::Outcome::Failed(FieldError::new(
                        ErrorKind::LimitExceeded,
                        "spec.outputs",
                        message.clone(),
                    ));
                    t.warnings = Vec::new();
                }
            }
        }
        emitted.add(idx, &run);
        runs.push(run);
    }
    let world = world::World::new(observed, prepared, &emitted, &runs, None, &grants);
    let verdicts = policy::judge_all(&world, options);
    report::assemble(prepared, &runs, &emitted, verdicts)
}
