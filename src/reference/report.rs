//! Reports and the evaluation (docs/rules.md "Errors"): each rule's state,
//! errors, warnings and notices, which of its triggers keep their objects,
//! and the evaluation's desired, contested and revoked objects.
//!
//! An error keeps: a failed trigger's (or rule's) live objects stay as they
//! are. A refusal revokes: the refused object is deleted, its trigger not
//! kept for it.
//!
//! Fast twin: `engine/report.rs`.

use std::collections::BTreeSet;

use super::order::Prepared;
use super::policy::Verdicts;
use super::run::{Outcome, RuleRun};
use super::world::Emitted;
use crate::engine::{
    DesiredSet, EngineError, ErrorKind, Evaluation, OutKey, RuleReport, RuleState,
};

/// Puts the evaluation together.
pub(super) fn assemble(
    prepared: &Prepared,
    runs: &[RuleRun],
    emitted: &Emitted,
    v: Verdicts,
) -> Evaluation {
    let mut reports = prepared.fixed.clone();
    for (idx, (rule, run)) in prepared.rules.iter().zip(runs).enumerate() {
        let report = if run.held {
            RuleReport::new(RuleState::Held)
        } else {
            rule_report(&rule.name, idx, run, emitted, &v)
        };
        reports.insert(rule.name.clone(), report);
    }
    let mut changed: Vec<OutKey> = v
        .desired
        .iter()
        .map(|d| (d.kind, d.namespace.clone(), d.name.clone()))
        .collect();
    changed.sort_by(|a, b| (a.0.as_str(), &a.1, &a.2).cmp(&(b.0.as_str(), &b.1, &b.2)));
    Evaluation {
        desired: DesiredSet::from(v.desired),
        reports: reports.into(),
        contested: v.contested.into_iter().collect(),
        revoked: v.revoked,
        changed,
    }
}

/// The report of a rule that ran.
fn rule_report(
    rule: &str,
    idx: usize,
    run: &RuleRun,
    emitted: &Emitted,
    v: &Verdicts,
) -> RuleReport {
    let mut report = RuleReport::new(RuleState::Evaluated);
    for t in &run.triggers {
        let tref = t.tref.as_deref();
        report
            .warnings
            .extend(t.warnings.iter().map(|w| w.clone().into_engine(rule, tref)));
        if let Outcome::MatchError(e) | Outcome::Failed(e) = &t.outcome {
            report.errors.push(e.clone().into_engine(rule, tref));
        }
        if t.outcome.keeps() {
            keep(&mut report, tref);
        }
        report.notices.extend(
            t.outcome
                .outputs()
                .iter()
                .filter_map(|d| d.no_subjects_notice(rule)),
        );
    }
    report.matched_triggers = run
        .triggers
        .iter()
        .filter(|t| t.key.is_some() && t.outcome.matched())
        .count();
    let conflicts = conflicts_of(idx, emitted);
    for (key, trigger) in &conflicts {
        report.errors.push(conflict(rule, key, trigger.clone()));
        keep(&mut report, trigger.as_deref());
    }
    let mine = |r: &usize| *r == idx;
    let refused: Vec<_> = v.refused.values().filter(|r| mine(&r.rule)).collect();
    for r in &refused {
        report.errors.push(error(
            crate::engine::tenant::refusal_kind(&r.why),
            rule,
            &r.field,
            r.trigger.clone(),
            &r.why,
        ));
    }
    for n in v
        .notices
        .values()
        .filter(|n| n.rule.as_ref().is_some_and(mine))
    {
        report.notices.push(error(
            ErrorKind::UnmanagedAggregation,
            rule,
            &n.field,
            n.trigger.clone(),
            &n.text,
        ));
    }
    let emitted_count: usize = run.triggers.iter().map(|t| t.outcome.outputs().len()).sum();
    report.outputs = emitted_count
        .saturating_sub(conflicts.len())
        .saturating_sub(refused.len());
    report
}

/// Marks a trigger (`None`: the static set) as kept.
fn keep(report: &mut RuleReport, trigger: Option<&str>) {
    match trigger {
        Some(t) => {
            report.kept_triggers.insert(t.to_string());
        }
        None => report.static_kept = true,
    }
}

/// The contested objects rule `idx` emits, each with the trigger that
/// emits it.
fn conflicts_of(idx: usize, emitted: &Emitted) -> BTreeSet<(OutKey, Option<String>)> {
    let mut out = BTreeSet::new();
    for (key, emitters) in emitted.by_key.iter().filter(|(_, es)| es.len() >= 2) {
        for e in emitters.iter().filter(|e| e.rule == idx) {
            out.insert((
                key.clone(),
                e.desired.trigger.as_deref().map(str::to_string),
            ));
        }
    }
    out
}

fn conflict(rule: &str, (kind, ns, name): &OutKey, trigger: Option<String>) -> EngineError {
    let obj = if ns.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {ns}/{name}")
    };
    let message =
        format!("{obj} is emitted by more than one rule or trigger; neither copy is applied");
    error(ErrorKind::Conflict, rule, "spec.outputs", trigger, &message)
}

fn error(
    kind: ErrorKind,
    rule: &str,
    field: &str,
    trigger: Option<String>,
    message: &str,
) -> EngineError {
    EngineError {
        kind,
        rule: rule.to_string(),
        field: field.to_string(),
        trigger,
        message: message.to_string(),
    }
}
