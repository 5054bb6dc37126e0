//! RbacRule status and Events: computed from the evaluation and the write
//! outcomes, written only when they change.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, api::Patch, api::PatchParams};
use serde_json::json;

use super::Error;
use super::apply::{Outcome, Written};
use super::plan::HeldPrunes;
use crate::api::{ManageLevel, RbacRule, RbacRuleStatus};
use crate::engine::{EngineError, EngineWarning, RuleReport, RuleState};

/// Condition type: every output of the rule is applied.
pub const READY: &str = "Ready";
/// Condition type: something is wrong (evaluation, watch, conflict, API).
pub const DEGRADED: &str = "Degraded";

/// Longest condition message we write (the API allows 32768).
const MAX_MESSAGE: usize = 4000;
/// Longest Event note (the API allows 1 kB).
const MAX_NOTE: usize = 1000;

/// Why a rule was not evaluated this time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// A kind it reads is not served by the API server (CRD not installed
    /// yet, or discovery failed). Retried by periodic rediscovery.
    KindNotServed(String),
    /// A watch it needs has not (re)listed yet, or its last list failed.
    WaitingForSync(String),
    /// The list of a kind it reads failed (e.g. forbidden); retried.
    WatchFailed(String),
    /// The `--allow-clusterrole` ClusterRole does not exist.
    AllowListNotFound(String),
    /// The rule is slow (or reads what a slow rule emits): the main pass
    /// leaves it to the slow lane, which evaluates, writes and reports it
    /// on its own (`--slow-rule-seconds`).
    SlowLane(String),
}

impl Hold {
    /// Condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Hold::KindNotServed(_) => "KindNotServed",
            Hold::WaitingForSync(_) => "WaitingForSync",
            Hold::WatchFailed(_) => "WatchFailed",
            Hold::AllowListNotFound(_) => "AllowListNotFound",
            Hold::SlowLane(_) => "SlowLane",
        }
    }

    /// Human-readable detail.
    pub fn message(&self) -> &str {
        match self {
            Hold::KindNotServed(m)
            | Hold::WaitingForSync(m)
            | Hold::WatchFailed(m)
            | Hold::AllowListNotFound(m)
            | Hold::SlowLane(m) => m,
        }
    }

    /// Whether it makes the rule Degraded (a wait for a list does not).
    pub fn degrades(&self) -> bool {
        !matches!(self, Hold::WaitingForSync(_) | Hold::SlowLane(_))
    }

    /// Whether the slow lane evaluates the rule (and reports it): the main
    /// pass neither writes its objects nor its status.
    pub fn is_slow_lane(&self) -> bool {
        matches!(self, Hold::SlowLane(_))
    }
}

/// One problem to report: reason and message.
type Problem = (&'static str, String);

fn describe(e: &EngineError) -> String {
    match &e.trigger {
        Some(t) => format!("{} (trigger {t}): {}", e.field, e.message),
        None => format!("{}: {}", e.field, e.message),
    }
}

/// Everything needed to compute one rule's status.
pub struct RuleInputs<'a> {
    /// The engine's report; None when the rule was held.
    pub report: Option<&'a RuleReport>,
    /// Why the rule was held, if it was.
    pub hold: Option<&'a Hold>,
    /// This reconcile's writes for the rule.
    pub writes: &'a [Written<'a>],
    /// Objects of the rule that exist now.
    pub managed: i64,
    /// The controller's `--manage` level.
    pub manage: ManageLevel,
    /// Objects labelled ours, naming this rule, that our inventory did not
    /// make (one message each): left alone, and a notice.
    pub foreign_claims: &'a [String],
    /// Its prunes held until confirmed in this pass, if any.
    pub held_prunes: Option<&'a HeldPrunes>,
}

/// Computes a rule's status. `None`: leave the current status as it is (a
/// rule waiting for a re-list keeps what it had).
pub fn compute(rule: &RbacRule, inputs: &RuleInputs<'_>, now: &Time) -> Option<RbacRuleStatus> {
    if keeps_status(rule, inputs) {
        return None;
    }
    let current = rule.status.as_ref();
    let generation = rule.metadata.generation;
    let (problems, not_ready) = problems_of(rule, inputs);
    let (ready_cond, degraded_cond) = conditions(problems, notices_of(rule, inputs), not_ready);
    let cond = |type_: &str, value: CondValue| condition(current, type_, value, generation, now);
    Some(RbacRuleStatus {
        conditions: vec![cond(READY, ready_cond), cond(DEGRADED, degraded_cond)],
        observed_generation: generation,
        matched_triggers: inputs
            .report
            .map(|r| r.matched_triggers as i64)
            .or_else(|| current.map(|s| s.matched_triggers))
            .unwrap_or(0),
        managed_objects: inputs.managed,
    })
}

/// Whether the rule's current status stays as it is: the slow lane reports
/// its rules itself, and a rule waiting for a list keeps what it had.
fn keeps_status(rule: &RbacRule, inputs: &RuleInputs<'_>) -> bool {
    if inputs.hold.is_some_and(Hold::is_slow_lane) {
        return true;
    }
    if let Some(h @ Hold::WaitingForSync(_)) = inputs.hold
        && rule
            .status
            .as_ref()
            .is_some_and(|s| !s.conditions.is_empty())
    {
        tracing::debug!(rule = %rule.metadata.name.as_deref().unwrap_or_default(), reason = h.message(), "status kept while waiting for a list");
        return true;
    }
    false
}

/// The rule's problems (its hold or errors, then its failed writes), and
/// why it is not Ready without a problem (a hold that does not degrade,
/// an inactive rule).
fn problems_of(rule: &RbacRule, inputs: &RuleInputs<'_>) -> (Vec<Problem>, Option<Problem>) {
    let mut problems: Vec<Problem> = Vec::new();
    let mut not_ready: Option<Problem> = None;
    match (inputs.hold, inputs.report) {
        (Some(h), _) => {
            if h.degrades() {
                problems.push((h.reason(), h.message().to_string()));
            } else {
                not_ready = Some((h.reason(), h.message().to_string()));
            }
        }
        (None, Some(r)) if r.state == RuleState::Inactive => {
            not_ready = Some((
                "Inactive",
                format!(
                    "manageLevel {} is above the controller's --manage {}; its objects are left alone",
                    rule.spec.manage_level, inputs.manage
                ),
            ));
        }
        (None, Some(r)) => {
            problems.extend(r.errors.iter().map(|e| (e.kind.reason(), describe(e))));
        }
        (None, None) => {}
    }
    for w in inputs.writes {
        match w.outcome {
            Outcome::Conflict { message, .. } => problems.push(("Conflict", message.clone())),
            Outcome::Failed(e) => problems.push((e.reason(), e.to_string())),
            Outcome::Blocked(why) => problems.push(("RoleNotWritten", why.clone())),
            _ => {}
        }
    }
    (problems, not_ready)
}

/// The evaluated rule's notices: they need a person but are no failure
/// (Degraded, not un-Ready).
fn notices_of(rule: &RbacRule, inputs: &RuleInputs<'_>) -> Vec<Problem> {
    let mut out: Vec<Problem> = match (inputs.hold, inputs.report) {
        (None, Some(r)) => r
            .notices
            .iter()
            .map(|e| (e.kind.reason(), describe(e)))
            .collect(),
        _ => Vec::new(),
    };
    out.extend(
        inputs
            .foreign_claims
            .iter()
            .map(|m| (FOREIGN_CLAIM, m.clone())),
    );
    // Held prunes need a person's decision: first, so the condition's
    // reason says it.
    if let Some(h) = inputs.held_prunes {
        let name = rule.metadata.name.as_deref().unwrap_or_default();
        out.insert(0, (PRUNE_HELD, h.message(name)));
    }
    out
}

/// Condition reason of an object labelled ours, naming the rule, that our
/// inventory did not make.
pub const FOREIGN_CLAIM: &str = "NotOurs";

/// Degraded reason and Event reason of held prunes.
pub const PRUNE_HELD: &str = "PruneHeld";

/// A condition's (status, reason, message).
type CondValue = (&'static str, &'static str, String);

/// The Ready and Degraded conditions' values: Ready follows the first
/// problem (else `not_ready`), Degraded lists the problems and notices.
fn conditions(
    mut problems: Vec<Problem>,
    notices: Vec<Problem>,
    not_ready: Option<Problem>,
) -> (CondValue, CondValue) {
    let reconciled = || ("True", "Reconciled", "every output is applied".to_string());
    let as_expected = || ("False", "AsExpected", "no problems".to_string());
    let ready_problem = problems.first().cloned();
    problems.extend(notices);
    let Some((reason, _)) = problems.first() else {
        return match not_ready {
            Some((reason, message)) => (("False", reason, message), as_expected()),
            None => (reconciled(), as_expected()),
        };
    };
    let mut text = problems
        .iter()
        .take(5)
        .map(|(_, m)| m.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    if problems.len() > 5 {
        text.push_str(&format!("; and {} more", problems.len() - 5));
    }
    let text = truncate(&text, MAX_MESSAGE);
    let ready = match (ready_problem, not_ready) {
        (Some((r, m)), _) => ("False", r, m),
        (None, Some((r, m))) => ("False", r, m),
        (None, None) => reconciled(),
    };
    (ready, ("True", *reason, text))
}

/// One condition of the status, keeping its transition time while its
/// status stays the same.
fn condition(
    current: Option<&RbacRuleStatus>,
    type_: &str,
    (status, reason, message): CondValue,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let previous = current.and_then(|s| s.conditions.iter().find(|c| c.type_ == type_));
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => now.clone(),
    };
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: truncate(&message, MAX_MESSAGE),
        observed_generation: generation,
        last_transition_time,
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Writes the status with a merge patch on the status subresource, only
/// when it differs from the current one.
pub async fn patch(
    client: &Client,
    rule: &RbacRule,
    status: &RbacRuleStatus,
) -> Result<bool, Error> {
    if rule.status.as_ref() == Some(status) {
        return Ok(false);
    }
    let name = rule.metadata.name.clone().unwrap_or_default();
    if let Some(ns) = &rule.metadata.namespace {
        super::tenants::patch_status(client, ns, &name, status).await?;
        return Ok(true);
    }
    let api: Api<RbacRule> = Api::all(client.clone());
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .map_err(|source| Error::Api {
        action: "patch status",
        object: format!("RbacRule {name}"),
        source,
    })?;
    Ok(true)
}

/// Events for one rule from this reconcile: one per reason, listing the
/// objects (Events are about the RbacRule; a single object also goes in
/// `related`). Nothing on a reconcile that wrote nothing and found nothing
/// new.
pub fn events(
    rule: &RbacRule,
    writes: &[Written<'_>],
    new_status: Option<&RbacRuleStatus>,
) -> Vec<Event> {
    let mut groups: BTreeMap<(&'static str, &'static str, bool), Vec<String>> = BTreeMap::new();
    for w in writes {
        let key = match w.outcome {
            Outcome::Created | Outcome::Updated(_) | Outcome::Recreated => {
                ("Applied", "Apply", false)
            }
            Outcome::Adopted(_) => ("Adopted", "Adopt", false),
            Outcome::Deleted => ("Pruned", "Prune", false),
            Outcome::Revoked(_) => ("Revoked", "Revoke", true),
            Outcome::Conflict { fresh: true, .. } => ("Conflict", "Apply", true),
            Outcome::Failed(e) => (e.reason(), "Write", true),
            Outcome::Conflict { fresh: false, .. }
            | Outcome::Blocked(_)
            | Outcome::Raced
            | Outcome::Skipped => continue,
        };
        let text = match w.outcome {
            Outcome::Created => format!("{} (created)", w.id),
            Outcome::Updated(parts) => format!("{} ({})", w.id, parts.join(", ")),
            Outcome::Recreated => format!("{} (re-created: roleRef changed)", w.id),
            Outcome::Adopted(why) => why.clone(),
            Outcome::Revoked(why) => format!("{} deleted: {why}", w.id),
            Outcome::Failed(e) => e.to_string(),
            Outcome::Conflict { message, .. } => message.clone(),
            _ => w.id.to_string(),
        };
        groups.entry(key).or_default().push(text);
    }
    let mut out: Vec<Event> = groups
        .into_iter()
        .map(|((reason, action, warning), items)| Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            note: Some(truncate(&items.join("; "), MAX_NOTE)),
            action: action.to_string(),
            secondary: None,
        })
        .collect();
    // A newly Degraded rule (or a new reason) gets one Warning.
    let degraded = |s: Option<&RbacRuleStatus>| {
        s.and_then(|s| s.conditions.iter().find(|c| c.type_ == DEGRADED))
            .filter(|c| c.status == "True")
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    if let Some((reason, message)) = degraded(new_status)
        && degraded(rule.status.as_ref()).as_ref() != Some(&(reason.clone(), message.clone()))
        && !out.iter().any(|e| e.reason == reason)
    {
        out.push(Event {
            type_: EventType::Warning,
            reason,
            note: Some(truncate(&message, MAX_NOTE)),
            action: "Evaluate".to_string(),
            secondary: None,
        });
    }
    out
}

/// A Warning Event `PruneHeld` for prunes held in this pass, unless one is
/// among `events` already or the rule's status names this very set (its
/// token): once per held set, saying what is held and how to confirm.
pub fn held_prunes_event(
    rule: &RbacRule,
    held: Option<&HeldPrunes>,
    events: &[Event],
) -> Option<Event> {
    let h = held?;
    let told = rule.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == DEGRADED && c.message.contains(&h.token))
    });
    if told || events.iter().any(|e| e.reason == PRUNE_HELD) {
        return None;
    }
    let name = rule.metadata.name.as_deref().unwrap_or_default();
    Some(Event {
        type_: EventType::Warning,
        reason: PRUNE_HELD.to_string(),
        note: Some(truncate(&h.message(name), MAX_NOTE)),
        action: "Prune".to_string(),
        secondary: None,
    })
}

/// A Warning Event `Skipped` for the warnings of `report` not reported
/// before (`seen` holds what was, and is updated): what the rule skipped on
/// purpose, e.g. trigger data that names no real type. Nothing when no
/// warning is new.
pub fn skipped_event(report: Option<&RuleReport>, seen: &mut BTreeSet<String>) -> Option<Event> {
    let now: BTreeSet<String> = report
        .map(|r| r.warnings.iter().map(EngineWarning::detail).collect())
        .unwrap_or_default();
    let fresh: Vec<&str> = now.difference(seen).map(String::as_str).collect();
    let event = (!fresh.is_empty()).then(|| Event {
        type_: EventType::Warning,
        reason: "Skipped".to_string(),
        note: Some(truncate(&fresh.join("; "), MAX_NOTE)),
        action: "Evaluate".to_string(),
        secondary: None,
    });
    *seen = now;
    event
}

/// Publishes Events on the RbacRule (events.k8s.io/v1, namespace
/// `default` since the rule is cluster-scoped), or on the
/// NamespacedRbacRule in its namespace.
pub async fn publish(recorder: &Recorder, rule: &RbacRule, events: &[Event]) {
    let reference = super::tenants::reference(rule);
    for e in events {
        if let Err(err) = recorder.publish(e, &reference).await {
            tracing::warn!(rule = ?rule.metadata.name, reason = %e.reason, error = %err, "cannot publish event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(values: &[&str]) -> RuleReport {
        let mut r = RuleReport::new(RuleState::Evaluated);
        r.warnings = values
            .iter()
            .map(|v| EngineWarning {
                rule: "r".into(),
                field: "spec.related[1].require[0]".into(),
                trigger: Some("Widget.example.org/w".into()),
                value: v.to_string(),
                message: "not a valid crdName".into(),
            })
            .collect();
        r
    }

    /// A binding rendered with no subjects (the engine's `NoSubjects`
    /// notice) makes the rule Degraded with that reason, still Ready, and
    /// a Warning Event says it once.
    #[test]
    fn a_binding_without_subjects_is_a_degraded_reason_and_an_event() {
        let spec: crate::api::RbacRuleSpec = serde_json::from_value(json!({
            "trigger": {"apiGroup": "pkg.example.org", "kind": "ProviderRevision"},
            "outputs": [{"kind": "ClusterRole", "name": "x"}]
        }))
        .expect("spec");
        let mut rule = RbacRule::new("provider-system", spec);
        rule.metadata.generation = Some(1);
        let mut r = RuleReport::new(RuleState::Evaluated);
        r.notices.push(EngineError {
            kind: crate::engine::ErrorKind::NoSubjects,
            rule: "provider-system".into(),
            field: "spec.outputs[2]".into(),
            trigger: Some("ProviderRevision.pkg.example.org/p-1".into()),
            message: "ClusterRoleBinding example:provider:p-1:system is rendered with no subjects"
                .into(),
        });
        let inputs = RuleInputs {
            report: Some(&r),
            hold: None,
            writes: &[],
            managed: 3,
            manage: ManageLevel::All,
            foreign_claims: &[],
            held_prunes: None,
        };
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let status = compute(&rule, &inputs, &now).expect("a status");
        let cond = |t: &str| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == t)
                .cloned()
                .expect("condition")
        };
        assert_eq!(cond("Ready").status, "True");
        let degraded = cond("Degraded");
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "NoSubjects")
        );
        assert!(
            degraded.message.contains("rendered with no subjects"),
            "{}",
            degraded.message
        );
        let events = events(&rule, &[], Some(&status));
        assert!(
            events
                .iter()
                .any(|e| e.reason == "NoSubjects" && matches!(e.type_, EventType::Warning)),
            "{:?}",
            events.iter().map(|e| &e.reason).collect::<Vec<_>>()
        );
    }

    #[test]
    fn skipped_events_only_for_new_warnings() {
        let mut seen = BTreeSet::new();
        let e = skipped_event(Some(&report(&["*.*"])), &mut seen).expect("a first event");
        assert_eq!(e.reason, "Skipped");
        assert!(matches!(e.type_, EventType::Warning));
        let note = e.note.unwrap_or_default();
        assert!(
            note.contains(
                "spec.related[1].require[0] (trigger Widget.example.org/w): skipped \"*.*\""
            ),
            "{note}"
        );
        // The same warning again: no Event; a new one: only it.
        assert!(skipped_event(Some(&report(&["*.*"])), &mut seen).is_none());
        let e = skipped_event(Some(&report(&["*.*", "x.*"])), &mut seen).expect("a new event");
        let note = e.note.unwrap_or_default();
        assert!(
            note.contains("\"x.*\"") && !note.contains("\"*.*\""),
            "{note}"
        );
        // Gone and back: reported again.
        assert!(skipped_event(Some(&report(&[])), &mut seen).is_none());
        assert!(skipped_event(Some(&report(&["*.*"])), &mut seen).is_some());
    }
}
