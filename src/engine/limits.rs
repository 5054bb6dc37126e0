//! Bounds on evaluation: no rule can abort the process, hang it, or take
//! the memory and time the other rules need.
//!
//! Template nesting is checked when a rule is compiled. The other limits
//! are a *budget* per trigger (or per static output set), kept in a
//! thread-local while that trigger renders: helpers, `#each` iterations,
//! rendered text and list expansion charge it, so even one render stops
//! when it runs over. Evaluation itself runs on a pooled thread with a large
//! stack ([`isolated`]), where a panic becomes an error.
//!
//! Above the trigger, a [`Scope`] keeps the running totals of the rule
//! being evaluated and of the whole evaluation: the bytes and objects the
//! engine *holds* as outputs (kept between evaluations, so an incremental
//! evaluation counts what earlier ones kept) and the wall time spent. A
//! trigger whose outputs would take a total over its limit, or that renders
//! after its rule's or the evaluation's time is up, fails with
//! `LimitExceeded`: the offender is the trigger that crossed the line, and
//! its live objects are preserved, as after any error.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::manifest::{Body, Manifest};
use super::model::Desired;

use serde_json::Value;

/// Default of [`Limits::template_depth`].
pub const DEFAULT_TEMPLATE_DEPTH: usize = 32;
/// Default of [`Limits::list_length`].
pub const DEFAULT_LIST_LENGTH: usize = 10_000;
/// Default of [`Limits::bytes_per_trigger`]: 16 MiB.
pub const DEFAULT_BYTES_PER_TRIGGER: usize = 16 * 1024 * 1024;
/// Default of [`Limits::objects_per_trigger`].
pub const DEFAULT_OBJECTS_PER_TRIGGER: usize = 10_000;
/// Default of [`Limits::seconds_per_trigger`].
pub const DEFAULT_SECONDS_PER_TRIGGER: f64 = 10.0;
/// Default of [`Limits::bytes_per_rule`]: 32 MiB (see docs/security.md,
/// "Bounded evaluation", for how the defaults keep the controller within
/// its Deployment's memory limit).
pub const DEFAULT_BYTES_PER_RULE: usize = 32 * 1024 * 1024;
/// Default of [`Limits::bytes_per_evaluation`]: 48 MiB.
pub const DEFAULT_BYTES_PER_EVALUATION: usize = 48 * 1024 * 1024;
/// Default of [`Limits::objects_per_rule`].
pub const DEFAULT_OBJECTS_PER_RULE: usize = 50_000;
/// Default of [`Limits::objects_per_evaluation`].
pub const DEFAULT_OBJECTS_PER_EVALUATION: usize = 100_000;
/// Default of [`Limits::seconds_per_rule`].
pub const DEFAULT_SECONDS_PER_RULE: f64 = 20.0;
/// Default of [`Limits::seconds_per_evaluation`].
pub const DEFAULT_SECONDS_PER_EVALUATION: f64 = 60.0;
/// Highest template depth a flag may ask for: deeper trees would need
/// more stack than the evaluation thread has.
pub const MAX_TEMPLATE_DEPTH: usize = 256;
/// Stack of the evaluation thread: only touched pages are committed.
pub(crate) const EVAL_STACK_BYTES: usize = 256 * 1024 * 1024;
/// What a JSON value costs besides its text, for the byte budget.
const NODE_BYTES: usize = 32;

/// The limits of one evaluation; the flags of `render` and `run` (with an
/// environment variable each for `run`).
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct Limits {
    /// Deepest nesting of blocks ({{#if}}, {{#each}}, {{else if}} chains) and
    /// subexpressions in one template or expression. Checked when a rule is
    /// compiled.
    #[arg(long = "max-template-depth", env = "RBAC_RULES_MAX_TEMPLATE_DEPTH",
          default_value_t = DEFAULT_TEMPLATE_DEPTH,
          value_parser = parse_depth)]
    pub template_depth: usize,
    /// Longest list a forEach iterates, a var holds or a helper returns.
    #[arg(long = "max-list-length", env = "RBAC_RULES_MAX_LIST_LENGTH",
          default_value_t = DEFAULT_LIST_LENGTH)]
    pub list_length: usize,
    /// Bytes one trigger may render: template output, helper results and
    /// expanded values (about 32 bytes per JSON value plus its text).
    #[arg(long = "max-bytes-per-trigger", env = "RBAC_RULES_MAX_BYTES_PER_TRIGGER",
          default_value_t = DEFAULT_BYTES_PER_TRIGGER)]
    pub bytes_per_trigger: usize,
    /// Objects one rule may emit for one trigger.
    #[arg(long = "max-objects-per-trigger", env = "RBAC_RULES_MAX_OBJECTS_PER_TRIGGER",
          default_value_t = DEFAULT_OBJECTS_PER_TRIGGER)]
    pub objects_per_trigger: usize,
    /// Wall time one rule may spend on one trigger, in seconds.
    #[arg(long = "max-seconds-per-trigger", env = "RBAC_RULES_MAX_SECONDS_PER_TRIGGER",
          default_value_t = DEFAULT_SECONDS_PER_TRIGGER, value_parser = parse_seconds)]
    pub seconds_per_trigger: f64,
    /// Bytes one rule's outputs may hold, over all its triggers (about 32
    /// bytes per value plus its text).
    #[arg(long = "max-bytes-per-rule", env = "RBAC_RULES_MAX_BYTES_PER_RULE",
          default_value_t = DEFAULT_BYTES_PER_RULE)]
    pub bytes_per_rule: usize,
    /// Bytes all rules' outputs may hold together.
    #[arg(long = "max-bytes-per-evaluation", env = "RBAC_RULES_MAX_BYTES_PER_EVALUATION",
          default_value_t = DEFAULT_BYTES_PER_EVALUATION)]
    pub bytes_per_evaluation: usize,
    /// Objects one rule may emit, over all its triggers.
    #[arg(long = "max-objects-per-rule", env = "RBAC_RULES_MAX_OBJECTS_PER_RULE",
          default_value_t = DEFAULT_OBJECTS_PER_RULE)]
    pub objects_per_rule: usize,
    /// Objects all rules may emit together.
    #[arg(long = "max-objects-per-evaluation", env = "RBAC_RULES_MAX_OBJECTS_PER_EVALUATION",
          default_value_t = DEFAULT_OBJECTS_PER_EVALUATION)]
    pub objects_per_evaluation: usize,
    /// Wall time one rule may spend rendering in one evaluation, in seconds.
    #[arg(long = "max-seconds-per-rule", env = "RBAC_RULES_MAX_SECONDS_PER_RULE",
          default_value_t = DEFAULT_SECONDS_PER_RULE, value_parser = parse_seconds)]
    pub seconds_per_rule: f64,
    /// Wall time one evaluation of all rules may take, in seconds.
    #[arg(long = "max-seconds-per-evaluation", env = "RBAC_RULES_MAX_SECONDS_PER_EVALUATION",
          default_value_t = DEFAULT_SECONDS_PER_EVALUATION, value_parser = parse_seconds)]
    pub seconds_per_evaluation: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            template_depth: DEFAULT_TEMPLATE_DEPTH,
            list_length: DEFAULT_LIST_LENGTH,
            bytes_per_trigger: DEFAULT_BYTES_PER_TRIGGER,
            objects_per_trigger: DEFAULT_OBJECTS_PER_TRIGGER,
            seconds_per_trigger: DEFAULT_SECONDS_PER_TRIGGER,
            bytes_per_rule: DEFAULT_BYTES_PER_RULE,
            bytes_per_evaluation: DEFAULT_BYTES_PER_EVALUATION,
            objects_per_rule: DEFAULT_OBJECTS_PER_RULE,
            objects_per_evaluation: DEFAULT_OBJECTS_PER_EVALUATION,
            seconds_per_rule: DEFAULT_SECONDS_PER_RULE,
            seconds_per_evaluation: DEFAULT_SECONDS_PER_EVALUATION,
        }
    }
}

impl Limits {
    /// These limits with the per-rule and per-evaluation bytes and objects
    /// `factor` times higher: for runs that knowingly go past what the
    /// shipped Deployment's memory holds (the bench's `xl` scenario).
    pub fn with_totals_times(mut self, factor: usize) -> Limits {
        self.bytes_per_rule = self.bytes_per_rule.saturating_mul(factor);
        self.bytes_per_evaluation = self.bytes_per_evaluation.saturating_mul(factor);
        self.objects_per_rule = self.objects_per_rule.saturating_mul(factor);
        self.objects_per_evaluation = self.objects_per_evaluation.saturating_mul(factor);
        self
    }
}

fn parse_depth(s: &str) -> Result<usize, String> {
    let v: usize = s.parse().map_err(|e| format!("{e}"))?;
    if !(1..=MAX_TEMPLATE_DEPTH).contains(&v) {
        return Err(format!("must be from 1 to {MAX_TEMPLATE_DEPTH}"));
    }
    Ok(v)
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if !(v > 0.0 && v <= 86_400.0) {
        return Err("must be more than 0 and at most 86400".to_string());
    }
    Ok(v)
}

/// One of the limits, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// [`Limits::template_depth`].
    TemplateDepth,
    /// [`Limits::list_length`].
    ListLength,
    /// [`Limits::bytes_per_trigger`].
    Bytes,
    /// [`Limits::objects_per_trigger`].
    Objects,
    /// [`Limits::seconds_per_trigger`].
    Time,
    /// [`Limits::bytes_per_rule`].
    BytesPerRule,
    /// [`Limits::bytes_per_evaluation`].
    BytesPerEvaluation,
    /// [`Limits::objects_per_rule`].
    ObjectsPerRule,
    /// [`Limits::objects_per_evaluation`].
    ObjectsPerEvaluation,
    /// [`Limits::seconds_per_rule`].
    TimePerRule,
    /// [`Limits::seconds_per_evaluation`].
    TimePerEvaluation,
}

impl Limit {
    /// The flag that sets it.
    pub fn flag(self) -> &'static str {
        match self {
            Limit::TemplateDepth => "--max-template-depth",
            Limit::ListLength => "--max-list-length",
            Limit::Bytes => "--max-bytes-per-trigger",
            Limit::Objects => "--max-objects-per-trigger",
            Limit::Time => "--max-seconds-per-trigger",
            Limit::BytesPerRule => "--max-bytes-per-rule",
            Limit::BytesPerEvaluation => "--max-bytes-per-evaluation",
            Limit::ObjectsPerRule => "--max-objects-per-rule",
            Limit::ObjectsPerEvaluation => "--max-objects-per-evaluation",
            Limit::TimePerRule => "--max-seconds-per-rule",
            Limit::TimePerEvaluation => "--max-seconds-per-evaluation",
        }
    }

    /// The limits on a rule's or the evaluation's totals of bytes and
    /// objects: which triggers fit them depends on the others'.
    pub const TOTALS: [Limit; 4] = [
        Limit::BytesPerRule,
        Limit::BytesPerEvaluation,
        Limit::ObjectsPerRule,
        Limit::ObjectsPerEvaluation,
    ];

    /// Whether an error is a trigger left out by one of [`Limit::TOTALS`].
    pub fn left_out_by_a_total(e: &super::EngineError) -> bool {
        e.kind == super::ErrorKind::LimitExceeded
            && Limit::TOTALS
                .iter()
                .any(|l| e.message.contains(&format!("{})", l.flag())))
    }

    /// The message of an error: what happened, the limit and its flag.
    pub fn message(self, limits: &Limits, what: &str) -> String {
        let value = match self {
            Limit::TemplateDepth => limits.template_depth.to_string(),
            Limit::ListLength => limits.list_length.to_string(),
            Limit::Bytes => limits.bytes_per_trigger.to_string(),
            Limit::Objects => limits.objects_per_trigger.to_string(),
            Limit::Time => format!("{}s", limits.seconds_per_trigger),
            Limit::BytesPerRule => limits.bytes_per_rule.to_string(),
            Limit::BytesPerEvaluation => limits.bytes_per_evaluation.to_string(),
            Limit::ObjectsPerRule => limits.objects_per_rule.to_string(),
            Limit::ObjectsPerEvaluation => limits.objects_per_evaluation.to_string(),
            Limit::TimePerRule => format!("{}s", limits.seconds_per_rule),
            Limit::TimePerEvaluation => format!("{}s", limits.seconds_per_evaluation),
        };
        format!("limit exceeded: {what} (limit {value}, {})", self.flag())
    }
}

/// What one trigger has used so far.
struct Budget {
    limits: Limits,
    bytes: usize,
    deadline: Instant,
    /// Whose deadline `deadline` is: the trigger's, its rule's or the
    /// evaluation's, whichever comes first.
    deadline_of: Limit,
    ticks: u32,
    /// The first limit hit: every later charge fails with it too, so the
    /// render unwinds at once and the error names the limit.
    tripped: Option<String>,
}

thread_local! {
    static BUDGET: RefCell<Option<Budget>> = const { RefCell::new(None) };
}

/// The budget of one trigger while it lives; the previous one is restored
/// when it is dropped.
pub(crate) struct BudgetGuard {
    prev: Option<Budget>,
}

impl Drop for BudgetGuard {
    fn drop(&mut self) {
        let prev = self.prev.take();
        BUDGET.with(|b| *b.borrow_mut() = prev);
    }
}

/// Starts the budget of one trigger on this thread. Its clock stops at
/// the trigger's time limit, or earlier when its rule's or the
/// evaluation's time is up first (already up: the first charge fails).
pub(crate) fn start(limits: &Limits) -> BudgetGuard {
    let now = Instant::now();
    let mut deadline = now + Duration::from_secs_f64(limits.seconds_per_trigger);
    let mut deadline_of = Limit::Time;
    if let Some((at, of)) = scope_deadline()
        && at < deadline
    {
        (deadline, deadline_of) = (at, of);
    }
    let tripped = (now > deadline).then(|| time_message(limits, deadline_of));
    let budget = Budget {
        limits: limits.clone(),
        bytes: 0,
        deadline,
        deadline_of,
        ticks: 0,
        tripped,
    };
    BudgetGuard {
        prev: BUDGET.with(|b| b.borrow_mut().replace(budget)),
    }
}

/// Runs `f` on the current budget; no budget (outside a trigger), no limit.
fn with_budget(f: impl FnOnce(&mut Budget) -> Result<(), String>) -> Result<(), String> {
    BUDGET.with(|b| match b.borrow_mut().as_mut() {
        None => Ok(()),
        Some(budget) => {
            if let Some(t) = &budget.tripped {
                return Err(t.clone());
            }
            let r = f(budget);
            if let Err(e) = &r {
                budget.tripped = Some(e.clone());
            }
            r
        }
    })
}

/// The limit this trigger ran over, if any.
pub(crate) fn tripped() -> Option<String> {
    BUDGET.with(|b| b.borrow().as_ref().and_then(|b| b.tripped.clone()))
}

/// Bytes charged to this trigger so far (0 outside a trigger).
pub(crate) fn used() -> usize {
    BUDGET.with(|b| b.borrow().as_ref().map_or(0, |b| b.bytes))
}

/// One step of work: checks the clock now and then.
pub(crate) fn tick() -> Result<(), String> {
    with_budget(step)
}

/// Steps between two reads of the clock: a step is a template rendered
/// or a value expanded (microseconds at most), and a trigger's time limit
/// is in seconds.
const STEPS_PER_CLOCK_READ: u32 = 128;

fn step(b: &mut Budget) -> Result<(), String> {
    b.ticks = b.ticks.wrapping_add(1);
    if b.ticks.is_multiple_of(STEPS_PER_CLOCK_READ) && Instant::now() > b.deadline {
        return Err(time_message(&b.limits, b.deadline_of));
    }
    Ok(())
}

/// The error of a time limit reached.
fn time_message(limits: &Limits, of: Limit) -> String {
    let what = match of {
        Limit::TimePerRule => "the rule took too long to render (this trigger was cut off)",
        Limit::TimePerEvaluation => {
            "the evaluation took too long (this trigger was cut off when the time was up)"
        }
        _ => "the trigger took too long to render",
    };
    of.message(limits, what)
}

/// Charges `n` bytes to the trigger (and counts a step).
pub(crate) fn charge(n: usize) -> Result<(), String> {
    with_budget(|b| {
        step(b)?;
        b.bytes = b.bytes.saturating_add(n);
        if b.bytes > b.limits.bytes_per_trigger {
            return Err(Limit::Bytes.message(&b.limits, "the trigger renders too much"));
        }
        Ok(())
    })
}

/// Whether `n` more bytes would still fit, before they are made: for
/// helpers whose result can be much larger than their arguments.
pub(crate) fn fits(n: usize) -> Result<(), String> {
    with_budget(|b| {
        if b.bytes.saturating_add(n) > b.limits.bytes_per_trigger {
            return Err(Limit::Bytes.message(&b.limits, "the trigger renders too much"));
        }
        Ok(())
    })
}

/// Charges a JSON value (about what it takes in memory).
pub(crate) fn charge_value(v: &Value) -> Result<(), String> {
    charge(weight(v))
}

/// Charges one expanded JSON node.
pub(crate) fn charge_node() -> Result<(), String> {
    charge(NODE_BYTES)
}

/// Checks a list's length; `what` says which list.
pub(crate) fn check_list(len: usize, what: impl std::fmt::Display) -> Result<(), String> {
    with_budget(|b| {
        if len > b.limits.list_length {
            return Err(Limit::ListLength.message(&b.limits, &format!("{what} has {len} items")));
        }
        Ok(())
    })
}

/// Checks the number of objects emitted for one trigger.
pub(crate) fn check_objects(n: usize) -> Result<(), String> {
    with_budget(|b| {
        if n > b.limits.objects_per_trigger {
            return Err(Limit::Objects.message(
                &b.limits,
                &format!(
                    "the trigger emits more than {} objects",
                    b.limits.objects_per_trigger
                ),
            ));
        }
        Ok(())
    })
}

/// Running totals of a rule, or of a whole evaluation: what the outputs
/// hold, and when the time is up. Shared by the threads that render it.
#[derive(Debug)]
struct Totals {
    bytes: AtomicUsize,
    objects: AtomicUsize,
    deadline: Instant,
    /// Whether a trigger's outputs were refused for a total (of this rule,
    /// or of the evaluation while this rule rendered).
    refused: std::sync::atomic::AtomicBool,
}

impl Totals {
    fn new(bytes: usize, objects: usize, seconds: f64) -> Arc<Totals> {
        Arc::new(Totals {
            bytes: AtomicUsize::new(bytes),
            objects: AtomicUsize::new(objects),
            deadline: Instant::now() + Duration::from_secs_f64(seconds),
            refused: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Adds `bytes` and `objects` unless that takes a total over its
    /// limit: then nothing is added and the limit is returned.
    fn take(&self, bytes: usize, objects: usize, max: (usize, usize)) -> Result<(), usize> {
        let b = self.bytes.fetch_add(bytes, Ordering::SeqCst);
        let o = self.objects.fetch_add(objects, Ordering::SeqCst);
        let over = if b.saturating_add(bytes) > max.0 {
            Some(0)
        } else if o.saturating_add(objects) > max.1 {
            Some(1)
        } else {
            None
        };
        match over {
            None => Ok(()),
            Some(which) => {
                self.give_back(bytes, objects);
                Err(which)
            }
        }
    }

    fn give_back(&self, bytes: usize, objects: usize) {
        // Never below zero: a total is a sum of what was added.
        let _ = self
            .bytes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| {
                Some(b.saturating_sub(bytes))
            });
        let _ = self
            .objects
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |o| {
                Some(o.saturating_sub(objects))
            });
    }
}

/// The totals a trigger renders under: its evaluation's and its rule's.
#[derive(Clone, Debug)]
pub(crate) struct Scope {
    limits: Limits,
    evaluation: Arc<Totals>,
    rule: Option<Arc<Totals>>,
}

thread_local! {
    static SCOPE: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

/// A scope while it lives; the previous one is restored when dropped.
pub(crate) struct ScopeGuard {
    prev: Option<Scope>,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        let prev = self.prev.take();
        SCOPE.with(|s| *s.borrow_mut() = prev);
    }
}

fn install(scope: Option<Scope>) -> ScopeGuard {
    ScopeGuard {
        prev: SCOPE.with(|s| std::mem::replace(&mut *s.borrow_mut(), scope)),
    }
}

/// Starts an evaluation's totals on this thread: `bytes` and `objects`
/// are what the outputs kept from earlier evaluations hold.
pub(crate) fn evaluation(limits: &Limits, bytes: usize, objects: usize) -> ScopeGuard {
    install(Some(Scope {
        limits: limits.clone(),
        evaluation: Totals::new(bytes, objects, limits.seconds_per_evaluation),
        rule: None,
    }))
}

/// Starts a rule's totals within the evaluation on this thread. `unchanged`:
/// what the rule's outputs that stay as they are hold (bytes, objects);
/// `replaced`: what the outputs of the triggers about to render again
/// held, given back to the evaluation (their renders charge it anew).
pub(crate) fn rule(unchanged: (usize, usize), replaced: (usize, usize)) -> ScopeGuard {
    let current = current();
    let scope = current.map(|s| {
        s.evaluation.give_back(replaced.0, replaced.1);
        Scope {
            rule: Some(Totals::new(
                unchanged.0,
                unchanged.1,
                s.limits.seconds_per_rule,
            )),
            ..s
        }
    });
    install(scope)
}

/// The scope of this thread, to carry to another thread rendering the
/// same rule ([`enter`]).
pub(crate) fn current() -> Option<Scope> {
    SCOPE.with(|s| s.borrow().clone())
}

/// Renders under `scope` on this thread while the guard lives.
pub(crate) fn enter(scope: Option<Scope>) -> ScopeGuard {
    install(scope)
}

/// The earliest of the rule's and the evaluation's deadlines, with its
/// limit.
fn scope_deadline() -> Option<(Instant, Limit)> {
    SCOPE.with(|s| {
        let s = s.borrow();
        let s = s.as_ref()?;
        let mut at = (s.evaluation.deadline, Limit::TimePerEvaluation);
        if let Some(r) = &s.rule
            && r.deadline < at.0
        {
            at = (r.deadline, Limit::TimePerRule);
        }
        Some(at)
    })
}

/// Admits a trigger's rendered outputs into the rule's and the
/// evaluation's totals: the bytes they hold, or the limit they would take
/// a total over (or the time that is up) as an error of that trigger.
/// Outside an evaluation (no scope): always admitted.
pub(crate) fn admit(outputs: &[Arc<Desired>]) -> Result<usize, String> {
    let Some(scope) = current() else {
        return Ok(held(outputs));
    };
    let limits = &scope.limits;
    if let Some((at, of)) = scope_deadline()
        && Instant::now() > at
    {
        return Err(time_message(limits, of));
    }
    let bytes = held(outputs);
    let objects = outputs.len();
    let refused = || {
        if let Some(rule) = &scope.rule {
            rule.refused.store(true, Ordering::SeqCst);
        }
    };
    if let Some(rule) = &scope.rule
        && let Err(which) = rule.take(
            bytes,
            objects,
            (limits.bytes_per_rule, limits.objects_per_rule),
        )
    {
        refused();
        return Err(if which == 0 {
            Limit::BytesPerRule.message(
                limits,
                &format!("the rule's outputs would hold more bytes with this trigger's {bytes}"),
            )
        } else {
            Limit::ObjectsPerRule.message(
                limits,
                &format!("the rule would emit more objects with this trigger's {objects}"),
            )
        });
    }
    if let Err(which) = scope.evaluation.take(
        bytes,
        objects,
        (limits.bytes_per_evaluation, limits.objects_per_evaluation),
    ) {
        if let Some(rule) = &scope.rule {
            rule.give_back(bytes, objects);
        }
        refused();
        return Err(if which == 0 {
            Limit::BytesPerEvaluation.message(
                limits,
                &format!("all rules' outputs would hold more bytes with this trigger's {bytes}"),
            )
        } else {
            Limit::ObjectsPerEvaluation.message(
                limits,
                &format!("all rules would emit more objects with this trigger's {objects}"),
            )
        });
    }
    Ok(bytes)
}

/// Whether the rule rendering on this thread had a trigger refused for
/// a total (bytes or objects, of the rule or of the evaluation).
pub(crate) fn rule_refused() -> bool {
    SCOPE.with(|s| {
        s.borrow()
            .as_ref()
            .and_then(|s| s.rule.as_ref())
            .is_some_and(|r| r.refused.load(Ordering::SeqCst))
    })
}

/// Gives back to the rule's and the evaluation's totals what admitted
/// outputs held (bytes, objects each), as they are dropped unused.
pub(crate) fn give_back(admitted: impl Iterator<Item = (usize, usize)>) {
    let Some(scope) = current() else { return };
    for (bytes, objects) in admitted {
        if let Some(rule) = &scope.rule {
            rule.give_back(bytes, objects);
        }
        scope.evaluation.give_back(bytes, objects);
    }
}

thread_local! {
    /// Bytes rendered on this thread since a rule's cached values were last
    /// measured ([`caches_may_have_grown`]).
    static RENDERED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Rendering between two measures of a rule's cached values: they can grow
/// by no more than what was rendered (and charged) meanwhile.
const RENDERED_PER_MEASURE: usize = 4 * 1024 * 1024;

/// Notes that a trigger rendered `bytes`; true when the cached values may
/// have grown by [`RENDERED_PER_MEASURE`] since they were last measured.
pub(crate) fn caches_may_have_grown(bytes: usize) -> bool {
    RENDERED.with(|r| {
        let n = r.get().saturating_add(bytes);
        let due = n >= RENDERED_PER_MEASURE;
        r.set(if due { 0 } else { n });
        due
    })
}

/// What emitted objects hold in memory, as [`weight`] counts a value:
/// per object its text (names, labels, annotations, rules, subjects) and
/// a node cost per value. A rule list shared by several objects is
/// counted for each: an upper bound.
pub fn held(outputs: &[Arc<Desired>]) -> usize {
    outputs
        .iter()
        .fold(0usize, |n, d| n.saturating_add(manifest_weight(&d.object)))
}

/// [`held`] of one object.
pub fn manifest_weight(m: &Manifest) -> usize {
    let strs = |xs: &Option<Vec<String>>| {
        xs.iter()
            .flatten()
            .fold(NODE_BYTES, |n, x| n.saturating_add(NODE_BYTES + x.len()))
    };
    let meta = m.meta();
    let mut n = 8 * NODE_BYTES + meta.name.len() + meta.namespace.as_ref().map_or(0, String::len);
    for (k, v) in meta.labels.iter().chain(meta.annotations.iter()) {
        n = n.saturating_add(NODE_BYTES + k.len() + v.len());
    }
    if meta.owner.is_some() {
        n = n.saturating_add(8 * NODE_BYTES + 256);
    }
    match m.body() {
        Body::Role { rules, aggregation } => {
            for r in rules.iter() {
                n = n.saturating_add(
                    NODE_BYTES
                        + strs(&r.api_groups)
                        + strs(&r.resources)
                        + NODE_BYTES
                        + r.verbs.iter().map(|v| NODE_BYTES + v.len()).sum::<usize>()
                        + strs(&r.resource_names)
                        + strs(&r.non_resource_urls),
                );
            }
            if let Some(a) = aggregation {
                for sel in a.cluster_role_selectors.iter().flatten() {
                    n = n.saturating_add(NODE_BYTES);
                    for (k, v) in sel.match_labels.iter().flatten() {
                        n = n.saturating_add(NODE_BYTES + k.len() + v.len());
                    }
                    for e in sel.match_expressions.iter().flatten() {
                        n = n.saturating_add(
                            2 * NODE_BYTES + e.key.len() + e.operator.len() + strs(&e.values),
                        );
                    }
                }
            }
        }
        Body::Binding {
            role_kind,
            role_name,
            subjects,
        } => {
            n = n.saturating_add(2 * NODE_BYTES + role_kind.len() + role_name.len());
            for s in subjects {
                n = n.saturating_add(
                    4 * NODE_BYTES
                        + s.kind.len()
                        + s.name.len()
                        + s.namespace.as_ref().map_or(0, String::len)
                        + s.api_group.as_ref().map_or(0, String::len),
                );
            }
        }
    }
    n
}

/// About what a value takes in memory: a node cost per value plus its
/// text. Iterative: values may be deep.
pub fn weight(v: &Value) -> usize {
    let mut total = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        total = total.saturating_add(NODE_BYTES);
        match v {
            Value::String(s) => total = total.saturating_add(s.len()),
            Value::Array(a) => stack.extend(a.iter()),
            Value::Object(m) => {
                for (k, x) in m {
                    total = total.saturating_add(k.len());
                    stack.push(x);
                }
            }
            _ => {}
        }
    }
    total
}

/// Runs `f` on an evaluation thread with a large stack, so that deep (but
/// bounded) recursion cannot overflow the caller's stack, and a panic
/// becomes an error instead of ending the process.
///
/// One such thread is kept for the process ([`pooled_thread`]): a thread
/// started per call cost a small incremental evaluation half its time or
/// more (the start, first touches of its stack pages, the allocator's
/// empty per-thread cache). A call made while it is busy (tests evaluate
/// side by side; an evaluation that calls this) starts a thread of its own.
pub fn isolated<R: Send>(f: impl FnOnce() -> R + Send) -> Result<R, String> {
    if let Some((free, pool)) = pooled_thread() {
        let claimed = match free.try_lock() {
            Ok(g) => Some(g),
            // Never so (a panic is caught inside), and harmless.
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if let Some(_claimed) = claimed {
            return pool.install(|| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
                    .map_err(|p| panic_text(&*p))
            });
        }
    }
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name("rbac-rules-eval".to_string())
            .stack_size(EVAL_STACK_BYTES)
            .spawn_scoped(s, f)
            .map_err(|e| format!("cannot start the evaluation thread: {e}"))?;
        handle.join().map_err(|p| panic_text(&*p))
    })
}

/// The pooled evaluation thread (a pool of one, which runs closures that
/// borrow the caller's data and waits for them), with the lock that claims
/// it; started on first use, `None` when it cannot start.
fn pooled_thread() -> Option<&'static (std::sync::Mutex<()>, rayon::ThreadPool)> {
    static POOLED: std::sync::OnceLock<Option<(std::sync::Mutex<()>, rayon::ThreadPool)>> =
        std::sync::OnceLock::new();
    POOLED
        .get_or_init(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .stack_size(EVAL_STACK_BYTES)
                .thread_name(|_| "rbac-rules-eval".to_string())
                .build()
                .inspect_err(|e| tracing::warn!(error = %e, "cannot keep an evaluation thread"))
                .ok()
                .map(|pool| (std::sync::Mutex::new(()), pool))
        })
        .as_ref()
}

/// A caught panic's message, as an error.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    let msg = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    format!("evaluation panicked: {msg}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn budget_trips_and_stays_tripped() {
        let limits = Limits {
            bytes_per_trigger: 100,
            ..Limits::default()
        };
        let _g = start(&limits);
        assert!(charge(60).is_ok());
        let e = charge(60).unwrap_err();
        assert!(e.contains("--max-bytes-per-trigger"), "{e}");
        // Sticky: even a free step fails now.
        assert!(tick().is_err());
        assert_eq!(tripped(), Some(e));
    }

    #[test]
    fn no_budget_no_limit_and_guards_restore() {
        assert!(charge(usize::MAX).is_ok());
        {
            let _g = start(&Limits {
                list_length: 2,
                ..Limits::default()
            });
            assert!(check_list(3, "x").is_err());
        }
        assert!(check_list(3, "x").is_ok());
        assert_eq!(tripped(), None);
    }

    #[test]
    fn totals_refuse_what_would_go_over_and_keep_what_fits() {
        let limits = Limits {
            bytes_per_rule: 100,
            objects_per_rule: 3,
            bytes_per_evaluation: 150,
            ..Limits::default()
        };
        let _e = evaluation(&limits, 40, 0);
        let _r = rule((0, 0), (0, 0));
        let scope = current().expect("a scope");
        let rule_totals = scope.rule.as_ref().expect("a rule");
        assert!(!rule_refused());
        assert_eq!(rule_totals.take(60, 1, (100, 3)), Ok(()));
        // Over the rule's bytes: nothing added.
        assert_eq!(rule_totals.take(60, 1, (100, 3)), Err(0));
        assert_eq!(rule_totals.bytes.load(Ordering::SeqCst), 60);
        // Over its objects.
        assert_eq!(rule_totals.take(1, 3, (100, 3)), Err(1));
        assert_eq!(rule_totals.objects.load(Ordering::SeqCst), 1);
        rule_totals.give_back(100, 100);
        assert_eq!(
            rule_totals.bytes.load(Ordering::SeqCst),
            0,
            "never below zero"
        );
        // Nothing emitted is always admitted, and holds nothing.
        assert_eq!(admit(&[]), Ok(0));
    }

    #[test]
    fn a_trigger_started_after_its_rules_time_is_up_fails_at_once() {
        let limits = Limits {
            seconds_per_rule: 0.001,
            ..Limits::default()
        };
        let _e = evaluation(&limits, 0, 0);
        let _r = rule((0, 0), (0, 0));
        std::thread::sleep(Duration::from_millis(5));
        let _t = start(&limits);
        let e = charge(1).unwrap_err();
        assert!(e.contains("--max-seconds-per-rule"), "{e}");
        let e = admit(&[]).unwrap_err();
        assert!(e.contains("--max-seconds-per-rule"), "{e}");
    }

    #[test]
    fn scopes_restore_and_outside_one_nothing_is_limited() {
        assert!(current().is_none());
        {
            let _e = evaluation(&Limits::default(), 0, 0);
            assert!(current().is_some_and(|s| s.rule.is_none()));
            {
                let _r = rule((0, 0), (0, 0));
                assert!(current().is_some_and(|s| s.rule.is_some()));
            }
            assert!(current().is_some_and(|s| s.rule.is_none()));
        }
        assert!(current().is_none());
        assert!(!rule_refused());
    }

    #[test]
    fn weight_counts_nodes_and_text() {
        assert_eq!(weight(&json!("abc")), NODE_BYTES + 3);
        assert_eq!(weight(&json!({"k": [1, 2]})), 4 * NODE_BYTES + 1);
    }

    #[test]
    fn isolated_turns_panics_into_errors() {
        let r: Result<(), String> = isolated(|| panic!("boom"));
        assert!(r.unwrap_err().contains("boom"));
        assert_eq!(isolated(|| 7).unwrap(), 7);
        // After a panic, evaluations still run, with a large stack (deeper
        // than a default thread's 2 or 8 MiB).
        let deep = isolated(|| {
            fn down(n: usize) -> usize {
                let pad = std::hint::black_box([n as u8; 1024]);
                if n == 0 {
                    pad[0] as usize
                } else {
                    down(n - 1) + usize::from(pad[1])
                }
            }
            down(16 * 1024)
        });
        assert_eq!(
            deep.unwrap(),
            (1..=16 * 1024).map(|n| n % 256).sum::<usize>()
        );
    }
}
