//! Reports and the evaluation (docs/rules.md "Errors"): each rule's report
//! from its remembered outcomes, conflicts, refusals and notices, made
//! again only for the rules whose outcomes changed, and which desired
//! objects changed since the last evaluation.
//!
//! Reference twin: `reference/report.rs`.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::Engine;
use super::error::{EngineError, ErrorKind};
use super::memo::{Memo, Outcome, RuleMemo};
use super::model::{DesiredSet, OutKey, RuleReport, RuleState};
use super::policy::Judged;

/// Reports of the rules whose outcomes changed, made again.
pub(super) fn update_reports(engine: &Engine, memo: &mut Memo, report_dirty: BTreeSet<usize>) {
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
pub(super) fn changed_keys(
    previous: &DesiredSet,
    memo: &Memo,
    touched: BTreeSet<OutKey>,
    judged: Vec<Judged>,
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
            candidates.extend(judged.into_iter().map(|j| Arc::unwrap_or_clone(j.key)));
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
                    .all(|k| judged.binary_search_by(|j| (*j.key).cmp(k)).is_ok())
            );
            judged
                .into_iter()
                .filter(|j| j.changed)
                .map(|j| Arc::unwrap_or_clone(j.key))
                .collect()
        }
    };
    changed
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
