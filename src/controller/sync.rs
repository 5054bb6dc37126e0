//! One reconcile: observed snapshot → engine → plan → writes → status and
//! Events. Driven by the watch loop, and directly by tests (no watches).
//!
//! What gets re-rendered: every reconcile re-runs the whole (pure, cheap)
//! engine over the cached objects, but writes only objects whose desired
//! content differs from the live cache. So a Namespace annotation change
//! writes that namespace's Roles and bindings; a new custom resource kind
//! writes the ClusterRoles rendered for it and the Roles of namespaces that
//! reference it; a ClusterRole change writes the Roles that copy rules from
//! it. A resync of an unchanged cluster sends no request at all (statuses
//! are compared before patching, Events come only from writes and new
//! problems).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::runtime::events::{Event, Recorder, Reporter};

use super::apply::{self, ConflictMemo, Gate, Outcome, WriteOptions, Written};
use super::live::{Live, ObjectId};
use super::metrics::Metrics;
use super::plan::{self, KeepReason, Plan};
use super::status::{self, Hold, RuleInputs};
use crate::api::{ManageLevel, RbacRule, RbacRuleSpec, RbacRuleStatus};
use crate::engine::limits::Limit;
use crate::engine::{Engine, Evaluation, Limits, Memo, ObjectStore, Options, RuleSource};
use crate::policy::{AllowList, Waivers};

/// Name of this controller in Events.
pub const CONTROLLER_NAME: &str = "rbac-rules";

/// What one reconcile sees.
pub struct Snapshot<'a> {
    /// The RbacRule objects, by name (with their current status).
    pub rules: &'a BTreeMap<String, RbacRule>,
    /// Objects of the kinds the rules read.
    pub observed: &'a ObjectStore,
    /// Live objects carrying our managed-by label.
    pub owned: &'a BTreeMap<ObjectId, Live>,
    /// Objects of the output kinds without our label: creating one of these
    /// names looks it up first (adoption or conflict); other creates do not.
    pub foreign: &'a BTreeSet<ObjectId>,
    /// Objects of the output kinds labelled ours that our inventory did not
    /// make, with the rule each names: among `foreign` (never pruned,
    /// revoked or overwritten), and reported on that rule.
    pub forged: &'a BTreeMap<ObjectId, Option<String>>,
    /// Rules not to evaluate now, and why; their objects are left alone.
    pub holds: &'a BTreeMap<String, Hold>,
    /// The allow-list, when `--allow-clusterrole` is set and found.
    pub allow: Option<&'a AllowList>,
    /// Whether deletions are allowed (every watch has listed).
    pub prune: bool,
}

/// What one reconcile did.
#[derive(Debug)]
pub struct SyncReport {
    /// The writes planned.
    pub plan: Plan,
    /// Their outcomes, in plan order (applies, then deletes); see
    /// [`SyncReport::written`].
    pub outcomes: Vec<Outcome>,
    /// Status patches sent.
    pub status_patches: usize,
    /// Whether something should be retried soon (a failed or raced write).
    pub retry: bool,
}

/// Compiled rules, reused while rules and allow-list stay the same.
/// What the compiled engine depends on: rule specs, allow-list, held rules,
/// and whether a slow lane shares the evaluation's totals.
type EngineKey = (
    Vec<(String, RbacRuleSpec)>,
    Option<AllowList>,
    BTreeSet<String>,
    bool,
);

/// The per-evaluation totals (bytes and objects held) split between the
/// main pass and the slow lane while one exists: (main, slow lane). The
/// two evaluations run at once, and together they hold no more than one
/// evaluation may; every other limit is the same in both, so a rule's
/// outcome does not depend on its lane.
pub fn split_totals(limits: &Limits) -> (Limits, Limits) {
    let mut slow = limits.clone();
    slow.bytes_per_evaluation = limits.bytes_per_evaluation / 2;
    slow.objects_per_evaluation = limits.objects_per_evaluation / 2;
    let mut main = limits.clone();
    main.bytes_per_evaluation -= slow.bytes_per_evaluation;
    main.objects_per_evaluation -= slow.objects_per_evaluation;
    (main, slow)
}

struct CachedEngine {
    key: EngineKey,
    engine: Engine,
    /// What the last evaluation rendered: the next renders only what the
    /// changes since touch.
    memo: Memo,
    /// When the memo was last started afresh (see [`RETRY_TOTALS`]).
    fresh: Instant,
}

/// How long a trigger shed by a rule's or the evaluation's total of bytes
/// or objects (`limits::shed`) waits, at least, before it is tried again
/// with every other (the memo starts afresh): room may have been made
/// since, by other triggers that went or shrank, and the memo keeps a shed
/// trigger failed until then. Every resync or watch event after it brings
/// the retry.
pub const RETRY_TOTALS: std::time::Duration = std::time::Duration::from_secs(300);

/// Runs reconciles with one client. Keeps the compiled engine and the
/// ownership-conflict memo between runs.
pub struct Syncer {
    client: Client,
    recorder: Recorder,
    metrics: Metrics,
    gate: std::sync::Arc<Gate>,
    manage: ManageLevel,
    engine: Option<CachedEngine>,
    conflicts: ConflictMemo,
    /// Per rule, the warnings already published as Events.
    warned: BTreeMap<String, BTreeSet<String>>,
    writes: WriteOptions,
    /// Default denials switched off.
    waivers: Waivers,
    params: std::collections::BTreeMap<String, String>,
    param_origins: std::collections::BTreeMap<String, crate::params::Origin>,
    limits: Limits,
    /// See [`RETRY_TOTALS`].
    retry_totals: std::time::Duration,
    /// `--slow-rule-seconds`: a rule's time in the main evaluation, past
    /// which the control loop moves it to the slow lane. `None`: no lane
    /// (the rule's own limits alone).
    lane: Option<f64>,
    /// `--max-unconfirmed-prunes`: more prunes of one rule in a pass are
    /// held until confirmed ([`plan::hold_mass_prunes`]).
    max_unconfirmed_prunes: usize,
    tenancy: crate::engine::tenant::Tenancy,
}

/// What of the controller's settings changes a plan. `run` and `diff` build
/// their syncer from the same settings ([`Syncer::planning`]), so `diff`
/// plans exactly what `run` would write.
#[derive(Clone, Debug, Default)]
pub struct PlanSettings {
    /// Highest manage level of rules to run.
    pub manage: ManageLevel,
    /// Take over existing uncontrolled objects named like desired outputs.
    pub adopt_existing: bool,
    /// Default denials switched off.
    pub waivers: Waivers,
    /// Evaluation limits.
    pub limits: Limits,
    /// The installation's params (`--param NAME=VALUE`).
    pub params: std::collections::BTreeMap<String, String>,
    /// Where each param was given, for messages.
    pub param_origins: std::collections::BTreeMap<String, crate::params::Origin>,
    /// `--max-unconfirmed-prunes` (`None`: its default).
    pub max_unconfirmed_prunes: Option<usize>,
    /// What tenant rules may read, and their ceiling.
    pub tenancy: crate::engine::tenant::Tenancy,
}

impl PlanSettings {
    /// The settings from the flags `run` and `diff` share.
    pub fn of(
        manage: ManageLevel,
        adopt_existing: bool,
        waivers: &Waivers,
        limits: &Limits,
        params: &crate::params::ParamArgs,
    ) -> Self {
        PlanSettings {
            manage,
            adopt_existing,
            waivers: waivers.clone(),
            limits: limits.clone(),
            params: params.map(),
            param_origins: params.origins(),
            max_unconfirmed_prunes: None,
            tenancy: crate::engine::tenant::Tenancy::default(),
        }
    }
}

impl Syncer {
    /// A syncer writing through `client` while `gate` is open.
    pub fn new(
        client: Client,
        manage: ManageLevel,
        metrics: Metrics,
        gate: std::sync::Arc<Gate>,
        instance: Option<String>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: CONTROLLER_NAME.to_string(),
                instance,
            },
        );
        Syncer {
            client,
            recorder,
            metrics,
            gate,
            manage,
            engine: None,
            conflicts: ConflictMemo::default(),
            warned: BTreeMap::new(),
            writes: WriteOptions::default(),
            waivers: Waivers::default(),
            params: std::collections::BTreeMap::new(),
            param_origins: std::collections::BTreeMap::new(),
            limits: Limits::default(),
            retry_totals: RETRY_TOTALS,
            lane: None,
            max_unconfirmed_prunes: plan::DEFAULT_MAX_UNCONFIRMED_PRUNES,
            tenancy: crate::engine::tenant::Tenancy::default(),
        }
    }

    /// A syncer planning with `settings`, writing through `client` while
    /// `gate` is open (a closed gate: one that plans and writes nothing).
    pub fn planning(
        client: Client,
        settings: &PlanSettings,
        metrics: Metrics,
        gate: std::sync::Arc<Gate>,
        instance: Option<String>,
    ) -> Self {
        Syncer::new(client, settings.manage, metrics, gate, instance)
            .adopt_existing(settings.adopt_existing)
            .with_waivers(settings.waivers.clone())
            .with_limits(settings.limits.clone())
            .with_params(settings.params.clone(), settings.param_origins.clone())
            .with_tenancy(settings.tenancy.clone())
            .max_unconfirmed_prunes(
                settings
                    .max_unconfirmed_prunes
                    .unwrap_or(plan::DEFAULT_MAX_UNCONFIRMED_PRUNES),
            )
    }

    /// Holds the prunes of a rule that would prune more than `n` objects
    /// in one pass until they are confirmed on the rule (see
    /// [`plan::hold_mass_prunes`]); revocations are never held.
    pub fn max_unconfirmed_prunes(mut self, n: usize) -> Self {
        self.max_unconfirmed_prunes = n;
        self
    }

    /// Bounds each rule's time in this syncer's evaluations by `seconds`
    /// (below `--max-seconds-per-rule`): a rule that takes longer is named
    /// by [`Pass::slow_rules`], for the control loop to move to the slow
    /// lane and evaluate again without it.
    pub fn with_slow_lane(mut self, seconds: f64) -> Self {
        self.lane = Some(seconds);
        self.engine = None;
        self
    }

    /// Whether the lane bound is below the rule's own time limit (else
    /// there is no lane: a rule cut off is cut off by its own limit).
    fn lane_bound(&self) -> Option<f64> {
        self.lane.filter(|l| *l < self.limits.seconds_per_rule)
    }

    /// The plan of `evaluation` against `snap`'s live objects, with the
    /// rules in `held` left alone and mass prunes held until confirmed.
    fn plan_of(
        &self,
        evaluation: &Evaluation,
        snap: &Snapshot<'_>,
        held: &BTreeSet<String>,
    ) -> plan::Plan {
        let mut plan = plan::plan(evaluation, snap.owned, held, snap.prune);
        plan::hold_mass_prunes(
            &mut plan,
            self.max_unconfirmed_prunes,
            snap.rules,
            evaluation,
            snap.owned,
        );
        plan
    }

    /// Plans the slow lane's evaluation (see [`SlowLane`]) against the
    /// live objects of `snap`: only the rules of `lane` are written and
    /// reported, every other rule is held (its objects left alone).
    pub fn prepare_slow(
        &mut self,
        evaluation: Evaluation,
        snap: &Snapshot<'_>,
        lane: &BTreeSet<String>,
    ) -> Pass {
        let held: BTreeSet<String> = snap
            .rules
            .keys()
            .filter(|r| !lane.contains(*r))
            .cloned()
            .collect();
        let plan = self.plan_of(&evaluation, snap, &held);
        let foreign = plan
            .applies
            .iter()
            .filter(|a| a.action == plan::ApplyAction::Create && snap.foreign.contains(&a.id))
            .map(|a| a.id.clone())
            .collect();
        let rules = snap
            .rules
            .iter()
            .filter(|(n, _)| lane.contains(*n))
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect();
        Pass {
            evaluation,
            plan,
            claims: Claims::of(snap.forged, Some(lane)),
            rules,
            holds: BTreeMap::new(),
            foreign,
            slow: Vec::new(),
            every_rule: false,
        }
    }

    /// Tries triggers left out by a rule's or the evaluation's total again
    /// `after` their evaluation at the soonest (default [`RETRY_TOTALS`]).
    pub fn retry_totals_after(mut self, after: std::time::Duration) -> Self {
        self.retry_totals = after;
        self
    }

    /// Also adopts existing objects without a controller whose names equal
    /// desired outputs (`--adopt-existing`); objects controlled by an
    /// output's own trigger are adopted either way.
    pub fn adopt_existing(mut self, on: bool) -> Self {
        self.writes.adopt_existing = on;
        self
    }

    /// Sends up to `n` writes at once (at least one).
    pub fn max_concurrent_writes(mut self, n: usize) -> Self {
        self.writes.max_concurrent = n.max(1);
        self
    }

    /// The same syncer with the administrator's settings for tenant rules.
    pub fn with_tenancy(mut self, tenancy: crate::engine::tenant::Tenancy) -> Self {
        self.tenancy = tenancy;
        self.engine = None;
        self
    }

    /// The installation's settings rules read as `params.<name>`.
    pub fn with_params(
        mut self,
        params: std::collections::BTreeMap<String, String>,
        origins: std::collections::BTreeMap<String, crate::params::Origin>,
    ) -> Self {
        self.params = params;
        self.param_origins = origins;
        self.engine = None;
        self
    }

    /// Switches off the default denials `waivers` names.
    pub fn with_waivers(mut self, waivers: Waivers) -> Self {
        self.waivers = waivers;
        self.engine = None;
        self
    }

    /// The same syncer evaluating with `limits`.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self.engine = None;
        self
    }

    fn engine(
        &mut self,
        rules: &BTreeMap<String, RbacRule>,
        holds: &BTreeMap<String, Hold>,
        allow: Option<&AllowList>,
    ) -> &mut CachedEngine {
        let key = (
            rules
                .iter()
                .map(|(n, r)| (n.clone(), r.spec.clone()))
                .collect::<Vec<_>>(),
            allow.cloned(),
            holds.keys().cloned().collect::<BTreeSet<String>>(),
            holds.values().any(Hold::is_slow_lane),
        );
        let cached = match self.engine.take() {
            Some(c) if c.key == key => c,
            previous => {
                let sources = sources_of(&key);
                // A setting no rule reads is most likely a misspelt name
                // (`render` refuses it; the controller's rules change
                // while it runs, so it says so each time they do).
                for name in crate::params::undeclared(&self.params, sources.iter().map(|s| &s.spec))
                {
                    let from = self
                        .param_origins
                        .get(name)
                        .unwrap_or(&crate::params::Origin::Flag)
                        .describe(name);
                    tracing::warn!(param = %name, %from, "no rule declares this param: its value is not used");
                }
                tracing::debug!(rules = sources.len(), "compiling rules");
                let mut limits = if key.3 {
                    split_totals(&self.limits).0
                } else {
                    self.limits.clone()
                };
                if let Some(lane) = self.lane.filter(|l| *l < limits.seconds_per_rule) {
                    limits.seconds_per_rule = lane;
                }
                // Held rules are not evaluated; their live objects stay
                // visible to the rules that copy from them.
                let options = Options {
                    manage: self.manage,
                    allow: key.1.clone(),
                    held: key.2.clone(),
                    waivers: self.waivers.clone(),
                    limits,
                    params: self.params.clone(),
                    param_origins: self.param_origins.clone(),
                    tenancy: self.tenancy.clone(),
                    ..Options::default()
                };
                // Only new and changed rules compile.
                let engine = match &previous {
                    Some(p) => Engine::with_previous(&p.engine, &sources, options),
                    None => Engine::new(&sources, options),
                };
                CachedEngine {
                    key,
                    engine,
                    // Taken over by the new engine where its rules are the
                    // same (a changed rule renders again, not all).
                    memo: previous.map(|c| c.memo).unwrap_or_default(),
                    fresh: Instant::now(),
                }
            }
        };
        self.engine.insert(cached)
    }

    /// Evaluates the snapshot and returns the evaluation and the plan,
    /// without writing.
    pub fn evaluate(&mut self, snap: &Snapshot<'_>) -> (Evaluation, Plan) {
        let held: BTreeSet<String> = snap.holds.keys().cloned().collect();
        let started = Instant::now();
        let retry_totals = self.retry_totals;
        let cached = self.engine(snap.rules, snap.holds, snap.allow);
        let mut evaluation = cached
            .engine
            .evaluate_incremental(snap.observed, &mut cached.memo);
        if cached.fresh.elapsed() >= retry_totals
            && evaluation.errors().any(Limit::left_out_by_a_total)
        {
            // The next evaluation renders everything again, in order.
            tracing::info!("triggers shed by a total: the next evaluation renders all again");
            cached.memo = Memo::new();
            cached.fresh = Instant::now();
        }
        // Nothing here reads it, and after a first evaluation it names
        // every output: not held through the write pass.
        evaluation.changed = Vec::new();
        let renders = cached.memo.renders();
        self.metrics.renders.inc_by(renders as u64);
        self.metrics
            .render_duration
            .observe(started.elapsed().as_secs_f64());
        tracing::debug!(renders, "evaluated");
        // The live objects remember what this plan finds equal.
        let plan = self.plan_of(&evaluation, snap, &held);
        (evaluation, plan)
    }

    /// One reconcile: evaluate, write the differences, update statuses and
    /// publish Events. Writes nothing while the gate is closed.
    pub async fn sync(&mut self, snap: &Snapshot<'_>) -> SyncReport {
        let pass = self.prepare(snap);
        self.write(pass, None).await
    }

    /// The first half of a reconcile: evaluates the snapshot and plans,
    /// keeping what the writes and statuses need, so that the world the
    /// snapshot borrows can go on taking watch events while they are sent.
    pub fn prepare(&mut self, snap: &Snapshot<'_>) -> Pass {
        // The engine runs on a thread of its own; this worker hands its
        // other tasks (watches, metrics, lease) to another while it waits.
        let (evaluation, plan) = off_runtime(|| self.evaluate(snap));
        // Only the names a create needs to look at.
        let foreign = plan
            .applies
            .iter()
            .filter(|a| a.action == plan::ApplyAction::Create && snap.foreign.contains(&a.id))
            .map(|a| a.id.clone())
            .collect();
        // Rules that ran out of the lane's time: their cut-off triggers
        // are no errors of theirs (the slow lane renders them in full).
        let slow = match self.lane_bound() {
            Some(_) => evaluation
                .reports
                .iter()
                .filter(|(_, r)| r.errors.iter().any(cut_by_lane))
                .map(|(n, _)| n.clone())
                .collect(),
            None => Vec::new(),
        };
        Pass {
            evaluation,
            plan,
            claims: Claims::of(snap.forged, None),
            rules: snap.rules.clone(),
            holds: snap.holds.clone(),
            foreign,
            slow,
            every_rule: true,
        }
    }

    /// The second half of a reconcile: sends the planned writes (telling
    /// `learn` what each did as soon as it is answered), then updates
    /// statuses and publishes Events. Writes nothing while the gate is
    /// closed.
    pub async fn write(
        &mut self,
        pass: Pass,
        learn: Option<&(dyn Fn(apply::Learned) + Send + Sync)>,
    ) -> SyncReport {
        let Pass {
            evaluation,
            plan,
            claims,
            rules,
            holds,
            foreign,
            slow: _,
            every_rule,
        } = pass;
        let mut report = SyncReport {
            plan,
            outcomes: Vec::new(),
            status_patches: 0,
            retry: false,
        };
        if !self.gate.open() {
            return report;
        }
        self.count_pass(&evaluation, &report.plan);
        if every_rule {
            self.metrics.foreign_claims.set(claims.total as i64);
        }
        let writes = apply::Writes {
            options: &self.writes,
            foreign: &foreign,
            learn,
        };
        report.outcomes = apply::execute(
            &self.client,
            &self.gate,
            &self.metrics,
            &report.plan,
            &mut self.conflicts,
            &writes,
        )
        .await;
        report.retry = self.count_outcomes(&report.outcomes);
        let managed = managed_counts(&report);
        self.metrics
            .managed_objects
            .set(managed.values().sum::<i64>());
        // A slow lane's pass names only its rules: the others stay.
        if every_rule {
            self.warned.retain(|n, _| rules.contains_key(n));
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        for (name, rule) in &rules {
            // The slow lane reports its rules itself.
            if holds.get(name).is_some_and(Hold::is_slow_lane) {
                continue;
            }
            let facts = RuleFacts {
                evaluation: &evaluation,
                holds: &holds,
                managed: &managed,
                claims: &claims,
            };
            let (new_status, events) = self.feedback(name, rule, &report, &facts, &now);
            if !self.gate.open() {
                break;
            }
            if let Some(s) = &new_status {
                self.patch_status(name, rule, s, &mut report).await;
            }
            status::publish(&self.recorder, rule, &events).await;
        }
        report
    }

    /// Counts a pass about to write, and the evaluation's errors by kind.
    fn count_pass(&self, evaluation: &Evaluation, plan: &Plan) {
        self.metrics.reconciles.inc();
        for e in evaluation.errors() {
            self.metrics.error(e.kind.reason());
        }
        let held: usize = plan.held_prunes.values().map(|h| h.objects.len()).sum();
        self.metrics
            .held_prunes
            .set(i64::try_from(held).unwrap_or(i64::MAX));
        let deferred = plan
            .kept
            .iter()
            .filter(|k| k.2 == KeepReason::PruneDeferred)
            .count();
        if deferred > 0 {
            tracing::info!(deferred, "prunes deferred until every watch has listed");
        }
    }

    /// Counts the failed writes; whether one of them asks for a retry
    /// (failed or raced).
    fn count_outcomes(&self, outcomes: &[Outcome]) -> bool {
        let mut retry = false;
        for outcome in outcomes {
            match outcome {
                Outcome::Failed(e) => {
                    self.metrics.error(e.metric_label());
                    retry = true;
                }
                Outcome::Conflict { fresh: true, .. } => self.metrics.error("Conflict"),
                Outcome::Raced => retry = true,
                _ => {}
            }
        }
        retry
    }

    /// A rule's new status (None: unchanged) and the Events this pass
    /// owes it; remembers the warnings it publishes.
    fn feedback(
        &mut self,
        name: &str,
        rule: &RbacRule,
        report: &SyncReport,
        facts: &RuleFacts<'_>,
        now: &Time,
    ) -> (Option<RbacRuleStatus>, Vec<Event>) {
        let writes: Vec<Written> = Written::of(&report.plan, &report.outcomes)
            .filter(|w| w.rule == name)
            .collect();
        let inputs = RuleInputs {
            report: facts.evaluation.reports.get(name),
            hold: facts.holds.get(name),
            writes: &writes,
            managed: facts.managed.get(name).copied().unwrap_or(0),
            manage: self.manage,
            foreign_claims: facts
                .claims
                .by_rule
                .get(name)
                .map(Vec::as_slice)
                .unwrap_or_default(),
            held_prunes: report.plan.held_prunes.get(name),
        };
        let new_status = status::compute(rule, &inputs, now);
        let mut events = status::events(rule, &writes, new_status.as_ref());
        events.extend(status::held_prunes_event(rule, inputs.held_prunes, &events));
        let seen = self.warned.entry(name.to_string()).or_default();
        events.extend(status::skipped_event(inputs.report, seen));
        (new_status, events)
    }

    /// Patches a rule's status when it changed, counting it in `report`
    /// (a failure asks for a retry). `&mut`: a `Syncer` is not `Sync`, and
    /// the write pass's future must be `Send`.
    async fn patch_status(
        &mut self,
        name: &str,
        rule: &RbacRule,
        new_status: &RbacRuleStatus,
        report: &mut SyncReport,
    ) {
        match status::patch(&self.client, rule, new_status).await {
            Ok(true) => {
                report.status_patches += 1;
                let kind = match rule.metadata.namespace {
                    Some(_) => super::tenants::KIND,
                    None => "RbacRule",
                };
                self.metrics.write(kind, "status");
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(rule = %name, error = %e, "cannot update status");
                self.metrics.error(e.metric_label());
                report.retry = true;
            }
        }
    }
}

/// What a pass knows of every rule, besides its writes.
struct RuleFacts<'a> {
    evaluation: &'a Evaluation,
    holds: &'a BTreeMap<String, Hold>,
    /// Objects per rule that exist after the writes.
    managed: &'a BTreeMap<String, i64>,
    /// Objects others labelled ours, by the rule they name.
    claims: &'a Claims,
}

/// Objects of the output kinds labelled ours that our inventory did not
/// make: what each rule is told (a notice: its Degraded condition and a
/// Warning Event), and how many there are (`rbac_rules_foreign_claims`;
/// one naming no rule is logged when the world first sees it).
#[derive(Debug, Default)]
struct Claims {
    /// Rule → one message per object naming it.
    by_rule: BTreeMap<String, Vec<String>>,
    /// Every such object.
    total: usize,
}

impl Claims {
    /// Objects named per rule, at most: a condition shows five problems,
    /// and whoever writes the objects must not make every pass build a
    /// message per object.
    const SHOWN: usize = 5;

    /// The claims of `forged`; only those naming a rule of `only`, when
    /// given (a slow lane's pass reports its own rules).
    fn of(forged: &BTreeMap<ObjectId, Option<String>>, only: Option<&BTreeSet<String>>) -> Self {
        let mut by_rule: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut more: BTreeMap<&str, usize> = BTreeMap::new();
        for (id, rule) in forged {
            let Some(rule) = rule else { continue };
            if only.is_some_and(|o| !o.contains(rule)) {
                continue;
            }
            let shown = by_rule.entry(rule.clone()).or_default();
            if shown.len() < Self::SHOWN {
                shown.push(crate::engine::output::foreign_claim_message(
                    &id.to_string(),
                    Some(rule),
                ));
            } else {
                *more.entry(rule).or_default() += 1;
            }
        }
        for (rule, n) in more {
            if let Some(shown) = by_rule.get_mut(rule) {
                shown.push(format!(
                    "{n} more objects labelled app.kubernetes.io/managed-by=rbac-rules name rule {rule:?} but were not made by rbac-rules: left alone"
                ));
            }
        }
        Claims {
            by_rule,
            total: forged.len(),
        }
    }
}

impl SyncReport {
    /// Each planned write with its outcome, in plan order.
    pub fn written(&self) -> Vec<Written<'_>> {
        Written::of(&self.plan, &self.outcomes).collect()
    }
}

/// A reconcile between its plan and its writes: everything the writes,
/// statuses and Events need, owned (nothing borrowed from the world).
#[derive(Debug)]
pub struct Pass {
    evaluation: Evaluation,
    plan: Plan,
    /// Objects others labelled ours, to report.
    claims: Claims,
    rules: BTreeMap<String, RbacRule>,
    holds: BTreeMap<String, Hold>,
    /// The planned creates whose names objects without our label hold.
    foreign: BTreeSet<ObjectId>,
    /// Rules that ran out of `--slow-rule-seconds`.
    slow: Vec<String>,
    /// Whether `rules` holds every rule (not a slow lane's pass).
    every_rule: bool,
}

impl Pass {
    /// The planned writes.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Rules whose time in this evaluation ran past the slow lane's bound
    /// ([`Syncer::with_slow_lane`]): the pass must not be written, but
    /// evaluated again with them in the slow lane.
    pub fn slow_rules(&self) -> &[String] {
        &self.slow
    }
}

/// Whether an error is a trigger cut off by a rule's time in an
/// evaluation whose per-rule time is the slow lane's bound.
fn cut_by_lane(e: &crate::engine::EngineError) -> bool {
    e.kind == crate::engine::ErrorKind::LimitExceeded
        && e.message
            .contains(&format!("{})", Limit::TimePerRule.flag()))
}

/// The slow lane's own evaluation state: rules that take longer than
/// `--slow-rule-seconds` are evaluated here, on a thread of their own and
/// with the full limits, while the main pass holds them (their live
/// objects kept and visible to every other rule and to policy) and writes
/// everything else at once. Every other rule is held here: their live
/// objects are what exists.
pub struct SlowLane {
    /// What the engine was compiled from (rules, allow-list, held rules).
    key: EngineKey,
    engine: Option<Engine>,
    memo: Memo,
    /// The world's store as the lane last saw it: each kind's index
    /// shared with the world's until the world changes it
    /// ([`ObjectStore::follow`]).
    pub store: ObjectStore,
}

impl Default for SlowLane {
    fn default() -> Self {
        SlowLane {
            key: (Vec::new(), None, BTreeSet::new(), true),
            engine: None,
            memo: Memo::new(),
            store: ObjectStore::new(),
        }
    }
}

impl SlowLane {
    /// Whether evaluating `rules` under `options` needs a new engine (and
    /// so a render of everything).
    pub fn stale(&self, rules: &BTreeMap<String, RbacRule>, options: &Options) -> bool {
        self.engine.is_none() || self.key != key_of(rules, options)
    }

    /// Evaluates `rules` under `options` over [`SlowLane::store`]: only
    /// the rules `options.held` leaves out render, incrementally.
    pub fn evaluate(&mut self, rules: &BTreeMap<String, RbacRule>, options: Options) -> Evaluation {
        let key = key_of(rules, &options);
        if self.engine.is_none() || self.key != key {
            let sources = sources_of(&key);
            // The memo is kept: the new engine takes it over where its
            // rules are the same.
            self.engine = Some(match &self.engine {
                Some(p) => Engine::with_previous(p, &sources, options),
                None => Engine::new(&sources, options),
            });
            self.key = key;
        }
        match &self.engine {
            Some(engine) => {
                let mut evaluation = engine.evaluate_incremental(&self.store, &mut self.memo);
                // The memo has read the journal through: nothing else
                // reads it.
                self.store.forget_through(self.store.version());
                evaluation.changed = Vec::new();
                evaluation
            }
            None => Evaluation {
                desired: Default::default(),
                reports: Default::default(),
                contested: BTreeSet::new(),
                revoked: BTreeMap::new(),
                changed: Vec::new(),
            },
        }
    }
}

/// The engine's rule sources, from the rules its key names.
fn sources_of(key: &EngineKey) -> Vec<RuleSource> {
    key.0
        .iter()
        .map(|(name, spec)| RuleSource {
            name: name.clone(),
            spec: spec.clone(),
            namespace: super::tenants::namespace_of(name),
        })
        .collect()
}

fn key_of(rules: &BTreeMap<String, RbacRule>, options: &Options) -> EngineKey {
    (
        rules
            .iter()
            .map(|(n, r)| (n.clone(), r.spec.clone()))
            .collect(),
        options.allow.clone(),
        options.held.clone(),
        true,
    )
}

/// Runs blocking work without holding up the runtime's other tasks:
/// `block_in_place` on a multi-threaded runtime (a current-thread runtime,
/// as in tests, has no other worker to hand them to).
fn off_runtime<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Objects per rule that exist after the writes: unchanged and applied
/// desired objects, plus live ones left alone. The plan's lists are
/// disjoint (desired: unchanged or applied; live and unwanted: kept or
/// deleted), so each object counts once without collecting ids.
fn managed_counts(report: &SyncReport) -> BTreeMap<String, i64> {
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    fn bump<'a>(counts: &mut BTreeMap<&'a str, i64>, rule: &'a str) {
        *counts.entry(rule).or_insert(0) += 1;
    }
    for (rule, n) in report.plan.unchanged.per_rule() {
        *counts.entry(rule).or_insert(0) += n as i64;
    }
    for (_, rule, _) in &report.plan.kept {
        if let Some(r) = rule {
            bump(&mut counts, r);
        }
    }
    // In plan order: applies, then deletes (none when nothing was sent).
    let applies = report.plan.applies.len();
    let outcome = |i: usize| report.outcomes.get(i);
    for (i, a) in report.plan.applies.iter().enumerate() {
        let now_ours = match outcome(i) {
            Some(o) if o.is_applied() => true,
            // Not written: it still exists if it existed (planned as an
            // update or re-creation, not a create).
            Some(Outcome::Skipped | Outcome::Raced | Outcome::Failed(_) | Outcome::Blocked(_))
            | None => a.action != plan::ApplyAction::Create,
            Some(_) => false,
        };
        if now_ours {
            bump(&mut counts, &a.rule);
        }
    }
    for (i, d) in report.plan.deletes.iter().enumerate() {
        if !outcome(applies + i)
            .is_some_and(|o| matches!(o, Outcome::Deleted | Outcome::Revoked(_)))
        {
            bump(&mut counts, &d.rule);
        }
    }
    counts
        .into_iter()
        .map(|(rule, n)| (rule.to_string(), n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::OutputKind;

    #[test]
    fn claims_name_a_few_objects_per_rule_and_count_all() {
        let mut forged = BTreeMap::new();
        for i in 0..8 {
            forged.insert(
                ObjectId::new(OutputKind::Role, "team-a", format!("r{i}")),
                Some("ns-viewer".to_string()),
            );
        }
        forged.insert(ObjectId::new(OutputKind::ClusterRole, "", "x"), None);
        forged.insert(
            ObjectId::new(OutputKind::ClusterRole, "", "y"),
            Some("other".to_string()),
        );
        let claims = Claims::of(&forged, None);
        assert_eq!(claims.total, 10);
        let viewer = &claims.by_rule["ns-viewer"];
        assert_eq!(viewer.len(), Claims::SHOWN + 1, "{viewer:?}");
        assert!(
            viewer[0].starts_with("Role team-a/r0 is labelled"),
            "{viewer:?}"
        );
        assert!(
            viewer[Claims::SHOWN].starts_with("3 more objects"),
            "{viewer:?}"
        );
        assert_eq!(claims.by_rule["other"].len(), 1);
        // A slow lane's pass tells only its own rules; the count is the
        // main pass's.
        let lane = BTreeSet::from(["other".to_string()]);
        let claims = Claims::of(&forged, Some(&lane));
        assert_eq!(claims.by_rule.keys().collect::<Vec<_>>(), vec!["other"]);
    }

    fn widget(name: &str, rv: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": "example.org/v1", "kind": "Widget",
            "metadata": {"name": name, "resourceVersion": rv, "uid": format!("u-{name}")}})
    }

    #[test]
    fn the_slow_lane_shares_the_worlds_store_and_renders_again_only_what_changed() {
        let spec: crate::api::RbacRuleSpec = serde_json::from_value(serde_json::json!({
            "trigger": {"apiGroup": "example.org", "kind": "Widget", "metadataOnly": true},
            "outputs": [{"kind": "ClusterRole", "name": "x-{{trigger.metadata.name}}",
                         "rules": [{"apiGroups": ["example.org"], "resources": ["widgets"],
                                    "verbs": ["get"]}]}]
        }))
        .expect("spec");
        let rules = BTreeMap::from([("slow".to_string(), RbacRule::new("slow", spec))]);
        let gk = crate::engine::GroupKind::new("example.org", "Widget");
        let mut world = ObjectStore::new();
        for i in 0..50 {
            world.insert(widget(&format!("w{i}"), "1")).expect("insert");
        }
        let mut lane = SlowLane::default();
        assert!(lane.store.follow(&world));
        let first = lane.evaluate(&rules, Options::default());
        assert_eq!(first.desired.len(), 50);
        // The lane holds the world's index of the kind, not a copy of it:
        // one index, and each object once (the world's reference alone).
        assert_eq!(lane.store.shared_kinds(&world), 1);
        let key = (String::new(), "w0".to_string());
        assert_eq!(
            std::sync::Arc::strong_count(world.get_shared(&gk, &key).expect("w0")),
            1
        );
        assert!(lane.memo.renders() >= 50, "{}", lane.memo.renders());
        // One object changes, one is added: the next run renders those
        // triggers alone.
        world.insert(widget("w7", "2")).expect("insert");
        world.insert(widget("w50", "1")).expect("insert");
        assert_eq!(lane.store.shared_kinds(&world), 0);
        assert!(lane.store.follow(&world));
        let second = lane.evaluate(&rules, Options::default());
        assert_eq!(second.desired.len(), 51);
        assert!(lane.memo.renders() <= 2, "{} renders", lane.memo.renders());
        // The lane's journal is read through: nothing of it is kept.
        assert_eq!(
            lane.store
                .changes_since(lane.store.version())
                .map(Iterator::count),
            Some(0)
        );
        assert!(!lane.store.follow(&world));
    }
}

#[cfg(test)]
mod lane_tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> RbacRule {
        RbacRule::new("x", serde_json::from_value(v).expect("spec"))
    }

    /// A rule emitting an aggregated-to ClusterRole per Widget, and one
    /// copying them by name and by label into a Role per Namespace: the
    /// shape of the built-in rules the slow lane takes at `large`.
    fn lane_rules() -> BTreeMap<String, RbacRule> {
        let users = spec(json!({
            "trigger": {"apiGroup": "example.org", "kind": "Widget", "metadataOnly": true},
            "outputs": [{"kind": "ClusterRole", "name": "agg-{{trigger.metadata.name}}",
                         "labels": {"example.org/agg": "true"},
                         "rules": [{"apiGroups": ["example.org"],
                                    "resources": ["{{trigger.metadata.name}}"],
                                    "verbs": ["get"]}]}]
        }));
        let ns = spec(json!({
            "trigger": {"kind": "Namespace"},
            "outputs": [{"kind": "Role", "name": "team",
                         "rulesFrom": {"clusterRoleSelector": {"matchLabels": {"example.org/agg": "true"}},
                                       "clusterRoleNames": ["agg-w0", "agg-w1"]}}]
        }));
        BTreeMap::from([("a-users".to_string(), users), ("b-ns".to_string(), ns)])
    }

    fn object(api_version: &str, kind: &str, name: &str) -> serde_json::Value {
        json!({"apiVersion": api_version, "kind": kind,
               "metadata": {"name": name, "resourceVersion": "1", "uid": format!("u-{name}")}})
    }

    /// An output as the API server gives it back once applied: its body,
    /// with the server's metadata.
    fn as_served(d: &crate::engine::Desired, rv: usize) -> serde_json::Value {
        let mut v = d.object.to_value();
        let meta = &mut v["metadata"];
        meta["resourceVersion"] = json!(rv.to_string());
        meta["uid"] = json!(format!("uid-{}-{}", d.namespace, d.name));
        meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        v
    }

    #[test]
    fn the_slow_lane_renders_nothing_when_its_own_writes_come_back() {
        let rules = lane_rules();
        let mut world = ObjectStore::new();
        for i in 0..5 {
            world
                .insert(object("example.org/v1", "Widget", &format!("w{i}")))
                .expect("insert");
        }
        for i in 0..20 {
            world
                .insert(object("v1", "Namespace", &format!("team-{i}")))
                .expect("insert");
        }
        let mut lane = SlowLane::default();
        lane.store.follow(&world);
        let first = lane.evaluate(&rules, Options::default());
        assert_eq!(first.desired.len(), 25, "{:?}", first.reports);
        assert_eq!(lane.memo.renders(), 25);
        // The writes come back through the watches: every output is live,
        // as written, with the server's metadata.
        for (rv, d) in first.desired.iter().enumerate() {
            world.insert(as_served(d, 100 + rv)).expect("insert");
        }
        assert!(lane.store.follow(&world));
        let second = lane.evaluate(&rules, Options::default());
        assert_eq!(
            lane.memo.renders(),
            0,
            "renders when its own writes came back"
        );
        assert_eq!(second.desired.len(), 25);
        assert!(second.revoked.is_empty());
        // A relist of the same versions: no change at all.
        assert!(!lane.store.follow(&world));
        lane.evaluate(&rules, Options::default());
        assert_eq!(lane.memo.renders(), 0);
        // A live copy drifts (someone edits it): the readers see the
        // output that stands for it, as a fresh evaluation does.
        let drifted = first
            .desired
            .iter()
            .find(|d| d.name == "agg-w0")
            .expect("agg-w0");
        let mut edited = as_served(drifted, 500);
        edited["rules"] = json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
        edited["metadata"]["labels"] = json!({});
        world.insert(edited).expect("insert");
        assert!(lane.store.follow(&world));
        let third = lane.evaluate(&rules, Options::default());
        assert_eq!(lane.memo.renders(), 0);
        let mut fresh = SlowLane::default();
        fresh.store.follow(&world);
        let whole = fresh.evaluate(&rules, Options::default());
        assert_eq!(
            third.desired.iter().collect::<Vec<_>>(),
            whole.desired.iter().collect::<Vec<_>>()
        );
        assert_eq!(third.revoked, whole.revoked);
        // A Widget changes: its ClusterRole renders again, and the Roles
        // that copy it.
        let mut w = object("example.org/v1", "Widget", "w0");
        w["metadata"]["resourceVersion"] = json!("2");
        w["metadata"]["labels"] = json!({"x": "y"});
        world.insert(w).expect("insert");
        assert!(lane.store.follow(&world));
        lane.evaluate(&rules, Options::default());
        assert_eq!(
            lane.memo.renders(),
            1,
            "the Widget's ClusterRole alone (its content is the same)"
        );
    }
}
