//! Bounds on evaluation: no rule can abort the process, hang it, or take
//! the memory and time the other rules need, and a bound falls on whoever
//! amplifies, never on whoever happens to render last.
//!
//! Template nesting is checked when a rule is compiled. The other limits
//! are a *budget* per trigger (or per static output set), kept in a
//! thread-local while that trigger renders: helpers, `#each` iterations,
//! rendered text and list expansion charge it, so even one render stops
//! when it runs over. Evaluation itself runs on a pooled thread with a large
//! stack ([`isolated`]), where a panic becomes an error.
//!
//! What a trigger's outputs may *hold* is bounded relative to what it read
//! (its **amplification**, [`admit`]): at most a floor plus a factor times
//! the bytes of the trigger and its related objects as the rule sees them.
//! A trigger over it fails alone, whatever the others hold.
//!
//! Above the triggers, the totals of a rule and of the whole evaluation
//! (bytes and objects held) are a **guard**, not a queue: when a total is
//! over its limit, [`shed`] picks the heaviest triggers (most bytes held,
//! then most objects; ties by rule and trigger name) until it fits, a pure
//! function of the evaluation's outputs that the engine and the reference
//! both apply. The evaluation's byte limit defaults to a share of the
//! container's memory limit ([`memory_limit`]). A shed trigger fails with
//! `LimitExceeded` and its live objects are preserved, as after any error.
//! Time limits of a rule and of an evaluation keep their running
//! deadlines.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;
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
/// Default of [`Limits::output_amplification`]: a trigger's outputs may
/// hold this many times the bytes it read, above the floor.
pub const DEFAULT_OUTPUT_AMPLIFICATION: usize = 64;
/// Default of [`Limits::output_floor_per_trigger`]: 1 MiB held, whatever
/// the trigger read.
pub const DEFAULT_OUTPUT_FLOOR_PER_TRIGGER: usize = 1024 * 1024;
/// The share of the memory limit ([`memory_limit`]) the evaluation's outputs
/// may hold, as [`held`] counts them, by default: one in
/// `MEMORY_SHARE_DIVISOR` (see docs/security.md, "Bounded evaluation", for
/// the measurement that sets it).
pub const MEMORY_SHARE_DIVISOR: usize = 2;
/// The evaluation's byte limit when no memory limit can be read.
pub const FALLBACK_BYTES_PER_EVALUATION: usize = 256 * 1024 * 1024;
/// Default of [`Limits::seconds_per_rule`].
pub const DEFAULT_SECONDS_PER_RULE: f64 = 20.0;
/// Default of [`Limits::seconds_per_evaluation`].
pub const DEFAULT_SECONDS_PER_EVALUATION: f64 = 60.0;
/// Highest template depth a flag may ask for: deeper trees would need
/// more stack than the evaluation thread has.
pub const MAX_TEMPLATE_DEPTH: usize = 256;
/// Stack of the evaluation thread: only touched pages are committed.
pub(crate) const EVAL_STACK_BYTES: usize = 256 * 1024 * 1024;
/// `--max-bytes-per-namespace` by default: 32 MiB, room for 2000 Roles
/// and RoleBindings of 16 KiB each (a team's roles are far smaller).
const DEFAULT_BYTES_PER_NAMESPACE: &str = "33554432";
/// `--max-objects-per-namespace` by default: a namespace whose rules make
/// a Role and a RoleBinding per trigger for 1000 triggers.
const DEFAULT_OBJECTS_PER_NAMESPACE: &str = "2000";

/// What a JSON value costs besides its text, for the byte budget.
const NODE_BYTES: usize = 32;
/// How a limit that may be off (`none`) is held: no total reaches it.
pub const NO_LIMIT: usize = usize::MAX;

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
    /// Bytes a trigger's outputs may hold, above the floor, per byte of
    /// what it read (the trigger and its related objects as the rule sees
    /// them): a trigger that amplifies more fails alone.
    #[arg(long = "max-output-amplification", env = "RBAC_RULES_MAX_OUTPUT_AMPLIFICATION",
          default_value_t = DEFAULT_OUTPUT_AMPLIFICATION)]
    pub output_amplification: usize,
    /// Bytes any trigger's outputs may hold, whatever it read (the floor
    /// of --max-output-amplification).
    #[arg(long = "output-floor-bytes-per-trigger",
          env = "RBAC_RULES_OUTPUT_FLOOR_BYTES_PER_TRIGGER",
          default_value_t = DEFAULT_OUTPUT_FLOOR_PER_TRIGGER)]
    pub output_floor_per_trigger: usize,
    /// Bytes one rule's outputs may hold, over all its triggers (about 32
    /// bytes per value plus its text); over it, the rule's heaviest
    /// triggers are shed first. `none`: no limit.
    #[arg(long = "max-bytes-per-rule", env = "RBAC_RULES_MAX_BYTES_PER_RULE",
          default_value = "none", value_parser = parse_bound)]
    pub bytes_per_rule: usize,
    /// Bytes all rules' outputs may hold together; over it, the heaviest
    /// triggers of any rule are shed first. `auto`: half the container's
    /// memory limit (cgroup memory.max), or of the machine's memory.
    #[arg(long = "max-bytes-per-evaluation", env = "RBAC_RULES_MAX_BYTES_PER_EVALUATION",
          default_value = "auto", value_parser = parse_evaluation_bytes)]
    pub bytes_per_evaluation: usize,
    /// Objects one rule may emit, over all its triggers; over it, the
    /// triggers with the most objects are shed first. `none`: no limit.
    #[arg(long = "max-objects-per-rule", env = "RBAC_RULES_MAX_OBJECTS_PER_RULE",
          default_value = "none", value_parser = parse_bound)]
    pub objects_per_rule: usize,
    /// Objects all rules may emit together (shed as for the rule's).
    /// `none`: no limit.
    #[arg(long = "max-objects-per-evaluation", env = "RBAC_RULES_MAX_OBJECTS_PER_EVALUATION",
          default_value = "none", value_parser = parse_bound)]
    pub objects_per_evaluation: usize,
    /// Bytes the outputs of all NamespacedRbacRules of one namespace may
    /// hold together; over it, that namespace's heaviest triggers are shed
    /// first (other namespaces and cluster rules are not touched).
    /// `none`: no limit.
    #[arg(long = "max-bytes-per-namespace", env = "RBAC_RULES_MAX_BYTES_PER_NAMESPACE",
          default_value = DEFAULT_BYTES_PER_NAMESPACE, value_parser = parse_bound)]
    pub bytes_per_namespace: usize,
    /// Objects all NamespacedRbacRules of one namespace may emit together
    /// (shed as for the bytes). `none`: no limit.
    #[arg(long = "max-objects-per-namespace", env = "RBAC_RULES_MAX_OBJECTS_PER_NAMESPACE",
          default_value = DEFAULT_OBJECTS_PER_NAMESPACE, value_parser = parse_bound)]
    pub objects_per_namespace: usize,
    /// Wall time one rule may spend rendering in one evaluation, in seconds.
    #[arg(long = "max-seconds-per-rule", env = "RBAC_RULES_MAX_SECONDS_PER_RULE",
          default_value_t = DEFAULT_SECONDS_PER_RULE, value_parser = parse_seconds)]
    pub seconds_per_rule: f64,
    /// Wall time all NamespacedRbacRules of one namespace may spend
    /// rendering in one evaluation together, in seconds: past it, the
    /// trigger rendering fails and so does every later trigger of that
    /// namespace's rules in that evaluation (other namespaces and cluster
    /// rules go on).
    #[arg(long = "max-seconds-per-namespace", env = "RBAC_RULES_MAX_SECONDS_PER_NAMESPACE",
          default_value_t = DEFAULT_SECONDS_PER_RULE, value_parser = parse_seconds)]
    pub seconds_per_namespace: f64,
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
            output_amplification: DEFAULT_OUTPUT_AMPLIFICATION,
            output_floor_per_trigger: DEFAULT_OUTPUT_FLOOR_PER_TRIGGER,
            bytes_per_rule: NO_LIMIT,
            bytes_per_evaluation: auto_bytes_per_evaluation(),
            objects_per_rule: NO_LIMIT,
            objects_per_evaluation: NO_LIMIT,
            bytes_per_namespace: 32 * 1024 * 1024,
            objects_per_namespace: 2000,
            seconds_per_rule: DEFAULT_SECONDS_PER_RULE,
            seconds_per_namespace: DEFAULT_SECONDS_PER_RULE,
            seconds_per_evaluation: DEFAULT_SECONDS_PER_EVALUATION,
        }
    }
}

/// A count or size, or `none` (no limit).
fn parse_bound(s: &str) -> Result<usize, String> {
    match s {
        "none" => Ok(NO_LIMIT),
        _ => s.parse().map_err(|e| format!("{e} (a number, or none)")),
    }
}

/// [`Limits::bytes_per_evaluation`]: a number, `auto` or `none`.
fn parse_evaluation_bytes(s: &str) -> Result<usize, String> {
    match s {
        "auto" => Ok(auto_bytes_per_evaluation()),
        _ => parse_bound(s).map_err(|e| format!("{e}, or auto")),
    }
}

/// The default of [`Limits::bytes_per_evaluation`]: a share of
/// [`memory_limit`] (one in [`MEMORY_SHARE_DIVISOR`]), or
/// [`FALLBACK_BYTES_PER_EVALUATION`] when none can be read.
pub fn auto_bytes_per_evaluation() -> usize {
    memory_limit().map_or(FALLBACK_BYTES_PER_EVALUATION, |m| m / MEMORY_SHARE_DIVISOR)
}

/// The memory this process may use, read once: the cgroup's limit (v2
/// `memory.max`, or v1 `memory.limit_in_bytes`) when one is set, else the
/// machine's memory (`MemTotal`): `render` on a workstation is bounded by
/// what the machine has, so that a pathological input is shed, with its
/// errors named, rather than swapped or killed.
pub fn memory_limit() -> Option<usize> {
    static LIMIT: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        cgroup_limit(read("/proc/self/cgroup").as_deref(), |p| read(p))
            .or_else(|| mem_total(read("/proc/meminfo").as_deref()?))
    })
}

/// The cgroup memory limit of this process, from `/proc/self/cgroup` and
/// the files `read` returns; `None` when no limit is set ("max", or v1's
/// page-rounded `i64::MAX`).
fn cgroup_limit(cgroups: Option<&str>, read: impl Fn(&str) -> Option<String>) -> Option<usize> {
    let parse = |t: String| -> Option<usize> {
        let v: u64 = t.trim().parse().ok()?;
        // v1 writes "no limit" as i64::MAX rounded down to a page.
        (v < (1 << 62)).then(|| usize::try_from(v).ok()).flatten()
    };
    let lines = cgroups.unwrap_or_default();
    for line in lines.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_end_matches('/');
        if controllers.is_empty() {
            // v2: the limit is the lowest of the path's and its parents'
            // (a container sees its own cgroup as the root).
            let mut at = path.to_string();
            loop {
                if let Some(v) = read(&format!("/sys/fs/cgroup{at}/memory.max")).and_then(parse) {
                    return Some(v);
                }
                match at.rfind('/') {
                    Some(i) if !at.is_empty() => at.truncate(i),
                    _ => break,
                }
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            for dir in [
                format!("/sys/fs/cgroup/memory{path}"),
                "/sys/fs/cgroup/memory".into(),
            ] {
                if let Some(v) = read(&format!("{dir}/memory.limit_in_bytes")).and_then(parse) {
                    return Some(v);
                }
            }
        }
    }
    None
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<usize> {
    let kib: usize = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
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
    /// [`Limits::output_amplification`] (and its floor).
    Amplification,
    /// [`Limits::bytes_per_rule`].
    BytesPerRule,
    /// [`Limits::bytes_per_evaluation`].
    BytesPerEvaluation,
    /// [`Limits::objects_per_rule`].
    ObjectsPerRule,
    /// [`Limits::objects_per_evaluation`].
    ObjectsPerEvaluation,
    /// [`Limits::bytes_per_namespace`].
    BytesPerNamespace,
    /// [`Limits::objects_per_namespace`].
    ObjectsPerNamespace,
    /// [`Limits::seconds_per_rule`].
    TimePerRule,
    /// [`Limits::seconds_per_evaluation`].
    TimePerEvaluation,
    /// [`Limits::seconds_per_namespace`].
    TimePerNamespace,
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
            Limit::Amplification => "--max-output-amplification",
            Limit::BytesPerRule => "--max-bytes-per-rule",
            Limit::BytesPerEvaluation => "--max-bytes-per-evaluation",
            Limit::ObjectsPerRule => "--max-objects-per-rule",
            Limit::ObjectsPerEvaluation => "--max-objects-per-evaluation",
            Limit::BytesPerNamespace => "--max-bytes-per-namespace",
            Limit::ObjectsPerNamespace => "--max-objects-per-namespace",
            Limit::TimePerRule => "--max-seconds-per-rule",
            Limit::TimePerEvaluation => "--max-seconds-per-evaluation",
            Limit::TimePerNamespace => "--max-seconds-per-namespace",
        }
    }

    /// The limits on a rule's or the evaluation's totals of bytes and
    /// objects: which triggers are shed depends on the others'.
    pub const TOTALS: [Limit; 6] = [
        Limit::BytesPerRule,
        Limit::BytesPerEvaluation,
        Limit::ObjectsPerRule,
        Limit::ObjectsPerEvaluation,
        Limit::BytesPerNamespace,
        Limit::ObjectsPerNamespace,
    ];

    /// Whether an error is a trigger shed by one of [`Limit::TOTALS`].
    pub fn left_out_by_a_total(e: &super::EngineError) -> bool {
        e.kind == super::ErrorKind::LimitExceeded
            && Limit::TOTALS
                .iter()
                .any(|l| e.message.contains(&format!("{})", l.flag())))
    }

    /// The message of an error: what happened, the limit and its flag.
    pub fn message(self, limits: &Limits, what: &str) -> String {
        let bound = |v: usize| match v {
            NO_LIMIT => "none".to_string(),
            v => v.to_string(),
        };
        let value = match self {
            Limit::TemplateDepth => limits.template_depth.to_string(),
            Limit::ListLength => limits.list_length.to_string(),
            Limit::Bytes => limits.bytes_per_trigger.to_string(),
            Limit::Objects => limits.objects_per_trigger.to_string(),
            Limit::Time => format!("{}s", limits.seconds_per_trigger),
            Limit::Amplification => format!(
                "{} + {} per byte read",
                limits.output_floor_per_trigger, limits.output_amplification
            ),
            Limit::BytesPerRule => bound(limits.bytes_per_rule),
            Limit::BytesPerEvaluation => bound(limits.bytes_per_evaluation),
            Limit::ObjectsPerRule => bound(limits.objects_per_rule),
            Limit::ObjectsPerEvaluation => bound(limits.objects_per_evaluation),
            Limit::BytesPerNamespace => bound(limits.bytes_per_namespace),
            Limit::ObjectsPerNamespace => bound(limits.objects_per_namespace),
            Limit::TimePerRule => format!("{}s", limits.seconds_per_rule),
            Limit::TimePerEvaluation => format!("{}s", limits.seconds_per_evaluation),
            Limit::TimePerNamespace => format!("{}s", limits.seconds_per_namespace),
        };
        format!("limit exceeded: {what} (limit {value}, {})", self.flag())
    }
}

/// What one trigger has used so far.
struct Budget {
    limits: Limits,
    bytes: usize,
    /// Bytes of what the trigger read: itself and its related objects, as
    /// the rule sees them ([`note_input`]).
    input: usize,
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
        input: 0,
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

/// Notes what the trigger read: `n` bytes of it and its related objects.
pub(crate) fn note_input(n: usize) {
    BUDGET.with(|b| {
        if let Some(b) = b.borrow_mut().as_mut() {
            b.input = b.input.saturating_add(n);
        }
    });
}

/// Bytes the trigger read so far (0 outside a trigger).
pub(crate) fn input() -> usize {
    BUDGET.with(|b| b.borrow().as_ref().map_or(0, |b| b.input))
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
        Limit::TimePerNamespace => {
            "the NamespacedRbacRules of this namespace took too long to render together (this trigger was cut off)"
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

/// What the outputs of one pass may hold, counted whole, before the pass
/// stops holding more: this many times `--max-bytes-per-evaluation`. The
/// guard sheds after the pass ([`shed`]); this bounds the pass itself, in
/// case many triggers each within their own bound add up to far more.
pub const PASS_CAP_FACTOR: usize = 4;

/// Evaluations made again, at most, each without the triggers shed so far
/// (see [`shed`]).
pub const MAX_SHED_PASSES: usize = 8;

/// The deadlines a trigger renders under (its evaluation's and its
/// rule's), and what the evaluation's outputs hold so far, counted whole.
#[derive(Clone, Debug)]
pub(crate) struct Scope {
    limits: Limits,
    evaluation: Instant,
    rule: Option<Instant>,
    /// A tenant rule's: when its namespace's time is up.
    namespace: Option<Instant>,
    held: Arc<std::sync::atomic::AtomicUsize>,
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

/// Starts an evaluation's clock on this thread; `held`: what the outputs
/// kept from earlier evaluations hold, counted whole.
pub(crate) fn evaluation(limits: &Limits, held: usize) -> ScopeGuard {
    install(Some(Scope {
        limits: limits.clone(),
        evaluation: Instant::now() + Duration::from_secs_f64(limits.seconds_per_evaluation),
        rule: None,
        namespace: None,
        held: Arc::new(std::sync::atomic::AtomicUsize::new(held)),
    }))
}

/// Gives back what outputs about to be rendered again (or gone) held.
pub(crate) fn replaced(bytes: usize) {
    if let Some(s) = current() {
        let _ = s.held.fetch_update(
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
            |h| Some(h.saturating_sub(bytes)),
        );
    }
}

/// Renders a tenant rule under its namespace's time: `left` of it remain.
pub(crate) fn namespace(left: Duration) -> ScopeGuard {
    let scope = current().map(|s| Scope {
        namespace: Some(Instant::now() + left),
        ..s
    });
    install(scope)
}

/// Starts a rule's clock within the evaluation on this thread.
pub(crate) fn rule() -> ScopeGuard {
    let scope = current().map(|s| Scope {
        rule: Some(Instant::now() + Duration::from_secs_f64(s.limits.seconds_per_rule)),
        ..s
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
        let mut at = (s.evaluation, Limit::TimePerEvaluation);
        if let Some(r) = s.rule
            && r < at.0
        {
            at = (r, Limit::TimePerRule);
        }
        if let Some(n) = s.namespace
            && n < at.0
        {
            at = (n, Limit::TimePerNamespace);
        }
        Some(at)
    })
}

/// Admits a trigger's rendered outputs: the bytes they hold, or as an error
/// of that trigger alone the amplification bound they break (they hold
/// more than `limits.output_floor_per_trigger` plus
/// `limits.output_amplification` times `input`, the bytes the trigger
/// read), or the time that is up. What other triggers hold plays no part.
pub(crate) fn admit(
    outputs: &[Arc<Desired>],
    limits: &Limits,
    input: usize,
) -> Result<usize, String> {
    if let Some((at, of)) = scope_deadline()
        && Instant::now() > at
    {
        return Err(time_message(limits, of));
    }
    let bytes = held(outputs);
    let bound = amplification_bound(limits, input);
    if bytes > bound {
        return Err(Limit::Amplification.message(
            limits,
            &format!(
                "the trigger's outputs would hold {bytes} bytes, more than {bound} for the {input} bytes it read (itself and its related objects)"
            ),
        ));
    }
    if let Some(s) = current() {
        let cap = limits.bytes_per_evaluation.saturating_mul(PASS_CAP_FACTOR);
        let before = s.held.fetch_add(bytes, std::sync::atomic::Ordering::SeqCst);
        if before.saturating_add(bytes) > cap {
            replaced(bytes);
            return Err(Limit::BytesPerEvaluation.message(
                limits,
                &format!(
                    "the evaluation's outputs, counted whole, would pass {PASS_CAP_FACTOR} times the limit with this trigger's {bytes} bytes before the heaviest are shed: this trigger was cut off, and is tried again once they are"
                ),
            ));
        }
    }
    Ok(bytes)
}

/// What a trigger that read `input` bytes may hold.
pub fn amplification_bound(limits: &Limits, input: usize) -> usize {
    limits
        .output_floor_per_trigger
        .saturating_add(limits.output_amplification.saturating_mul(input))
}

/// A trigger of a rule, as the evaluation's outputs name it: the rule, and
/// the trigger's reference (`None`: the rule's static set).
type TriggerId = (Arc<str>, Option<Arc<str>>);

/// Shed triggers: per rule, per trigger reference (`None`: the static
/// set), the message each fails with.
pub type Shed = BTreeMap<String, BTreeMap<Option<String>, String>>;

/// One trigger's outputs, for [`shed`].
#[derive(Debug, Default)]
struct Held {
    /// What they hold, each object whole: how heavy the trigger is.
    bytes: usize,
    objects: usize,
    /// What they hold besides their rule lists.
    own: usize,
    /// Their rule lists, by index in the evaluation's distinct lists.
    lists: Vec<usize>,
}

/// What a set of triggers holds together: every object's own bytes, and
/// each distinct rule list once, however many objects carry it.
struct Pool<'a> {
    /// The bytes of each distinct rule list.
    list_bytes: &'a [usize],
    /// Per distinct list, how many objects of the pool carry it.
    carried: Vec<u32>,
    bytes: usize,
    objects: usize,
}

impl<'a> Pool<'a> {
    fn new(list_bytes: &'a [usize]) -> Self {
        Pool {
            list_bytes,
            carried: vec![0; list_bytes.len()],
            bytes: 0,
            objects: 0,
        }
    }

    fn add(&mut self, h: &Held) {
        self.bytes = self.bytes.saturating_add(h.own);
        self.objects = self.objects.saturating_add(h.objects);
        for &l in &h.lists {
            if self.carried[l] == 0 {
                self.bytes = self.bytes.saturating_add(self.list_bytes[l]);
            }
            self.carried[l] += 1;
        }
    }

    fn remove(&mut self, h: &Held) {
        self.bytes = self.bytes.saturating_sub(h.own);
        self.objects = self.objects.saturating_sub(h.objects);
        for &l in &h.lists {
            self.carried[l] = self.carried[l].saturating_sub(1);
            if self.carried[l] == 0 {
                self.bytes = self.bytes.saturating_sub(self.list_bytes[l]);
            }
        }
    }
}

/// The triggers to shed so that every rule's and the evaluation's totals
/// fit their limits, each with the error message it fails with, and the
/// bytes the evaluation's outputs hold after: a pure function of the
/// outputs (`desired`, as an evaluation returns them).
///
/// What a total counts is what the outputs really hold: rule lists with
/// the same content count once (the engine shares them between objects:
/// a provider family's roles, Namespaces accepting the same types), by
/// content, so that how the evaluator happened to share them plays no
/// part. Per rule first, then for the evaluation, each total over its
/// limit sheds its heaviest triggers (most bytes held, its objects whole,
/// for a byte limit; most objects for an object limit; ties by the other
/// measure, then the first by rule and trigger name) until it fits: the
/// trigger that amplifies goes, never the one that happens to come last.
/// Both evaluators call it, so they shed the same triggers.
pub fn shed<'a>(desired: impl Iterator<Item = &'a Desired>, limits: &Limits) -> (Shed, usize) {
    use std::hash::{Hash, Hasher};
    type Rules = Vec<k8s_openapi::api::rbac::v1::PolicyRule>;
    // Distinct lists by content (hashed once per shared list).
    let mut by_address: std::collections::HashMap<*const Rules, usize> =
        std::collections::HashMap::new();
    let mut by_hash: std::collections::HashMap<u64, Vec<(usize, &'a Arc<Rules>)>> =
        std::collections::HashMap::new();
    let mut list_bytes: Vec<usize> = Vec::new();
    let mut by_trigger: BTreeMap<TriggerId, Held> = BTreeMap::new();
    for d in desired {
        let h = by_trigger
            .entry((Arc::clone(&d.rule), d.trigger.clone()))
            .or_default();
        let whole = manifest_weight(&d.object);
        h.bytes = h.bytes.saturating_add(whole);
        h.objects += 1;
        let Some(rules) = d.object.rules() else {
            h.own = h.own.saturating_add(whole);
            continue;
        };
        let body = rules_weight(rules);
        h.own = h.own.saturating_add(whole.saturating_sub(body));
        let id = *by_address.entry(Arc::as_ptr(rules)).or_insert_with(|| {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            for r in rules.iter() {
                (&r.api_groups, &r.resources, &r.verbs).hash(&mut hasher);
                (&r.resource_names, &r.non_resource_urls).hash(&mut hasher);
            }
            let same = by_hash.entry(hasher.finish()).or_default();
            match same
                .iter()
                .find(|(_, other)| other.as_slice() == rules.as_slice())
            {
                Some((id, _)) => *id,
                None => {
                    list_bytes.push(body);
                    same.push((list_bytes.len() - 1, rules));
                    list_bytes.len() - 1
                }
            }
        });
        h.lists.push(id);
    }
    let mut out = BTreeMap::new();
    let mut rules: BTreeMap<Arc<str>, Vec<(&TriggerId, &Held)>> = BTreeMap::new();
    for (id, h) in &by_trigger {
        rules.entry(Arc::clone(&id.0)).or_default().push((id, h));
    }
    let rule_limits = (
        (limits.bytes_per_rule, Limit::BytesPerRule),
        (limits.objects_per_rule, Limit::ObjectsPerRule),
    );
    let mut kept: Vec<(&TriggerId, &Held)> = Vec::new();
    // Tenant rules' triggers by namespace: a namespace over its budget
    // sheds its own heaviest, never another's or a cluster rule's.
    let mut namespaces: BTreeMap<&str, Vec<(&TriggerId, &Held)>> = BTreeMap::new();
    for (_, triggers) in rules {
        let (k, _) = shed_over(triggers, &list_bytes, rule_limits, limits, &mut out);
        for t in k {
            match super::model::rule_namespace(&t.0.0) {
                Some(ns) => namespaces.entry(ns).or_default().push(t),
                None => kept.push(t),
            }
        }
    }
    let namespace_limits = (
        (limits.bytes_per_namespace, Limit::BytesPerNamespace),
        (limits.objects_per_namespace, Limit::ObjectsPerNamespace),
    );
    for (_, triggers) in namespaces {
        let (k, _) = shed_over(triggers, &list_bytes, namespace_limits, limits, &mut out);
        kept.extend(k);
    }
    let evaluation_limits = (
        (limits.bytes_per_evaluation, Limit::BytesPerEvaluation),
        (limits.objects_per_evaluation, Limit::ObjectsPerEvaluation),
    );
    let (_, held) = shed_over(kept, &list_bytes, evaluation_limits, limits, &mut out);
    let mut shed = Shed::new();
    for ((rule, trigger), message) in out {
        shed.entry(rule.to_string())
            .or_default()
            .insert(trigger.map(|t| t.to_string()), message);
    }
    (shed, held)
}

/// Sheds from `triggers` (heaviest first) until what they hold together
/// fits `max` (bytes, objects); returns the ones kept and the bytes they
/// hold. Shed ones go into `out` with their message.
fn shed_over<'a>(
    mut triggers: Vec<(&'a TriggerId, &'a Held)>,
    list_bytes: &[usize],
    max: ((usize, Limit), (usize, Limit)),
    limits: &Limits,
    out: &mut BTreeMap<TriggerId, String>,
) -> (Vec<(&'a TriggerId, &'a Held)>, usize) {
    let mut pool = Pool::new(list_bytes);
    for (_, h) in &triggers {
        pool.add(h);
    }
    let ((max_bytes, bytes_limit), (max_objects, objects_limit)) = max;
    for by_bytes in [true, false] {
        let over = |p: &Pool| match by_bytes {
            true => p.bytes > max_bytes,
            false => p.objects > max_objects,
        };
        if !over(&pool) {
            continue;
        }
        // Lightest first, so that the heaviest are popped off the end;
        // among equals the first in name order is shed first.
        triggers.sort_by(|(ia, a), (ib, b)| {
            let key = |h: &Held| match by_bytes {
                true => (h.bytes, h.objects),
                false => (h.objects, h.bytes),
            };
            key(a).cmp(&key(b)).then_with(|| ib.cmp(ia))
        });
        while over(&pool) {
            let Some((id, h)) = triggers.pop() else { break };
            pool.remove(h);
            let message = match by_bytes {
                true => bytes_limit.message(
                    limits,
                    &format!(
                        "this trigger's outputs, {} bytes, are the heaviest while the total is over its limit (shed, heaviest first)",
                        h.bytes
                    ),
                ),
                false => objects_limit.message(
                    limits,
                    &format!(
                        "this trigger's {} objects are the most while the total is over its limit (shed, most first)",
                        h.objects
                    ),
                ),
            };
            out.insert(id.clone(), message);
        }
    }
    (triggers, pool.bytes)
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
            n = n.saturating_add(rules_weight(rules));
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

/// What a role's rules hold, as [`manifest_weight`] counts them.
pub fn rules_weight(rules: &[k8s_openapi::api::rbac::v1::PolicyRule]) -> usize {
    let strs = |xs: &Option<Vec<String>>| {
        xs.iter()
            .flatten()
            .fold(NODE_BYTES, |n, x| n.saturating_add(NODE_BYTES + x.len()))
    };
    rules.iter().fold(0usize, |n, r| {
        n.saturating_add(
            NODE_BYTES
                + strs(&r.api_groups)
                + strs(&r.resources)
                + NODE_BYTES
                + r.verbs.iter().map(|v| NODE_BYTES + v.len()).sum::<usize>()
                + strs(&r.resource_names)
                + strs(&r.non_resource_urls),
        )
    })
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
    fn amplification_is_bounded_per_trigger_by_what_it_read() {
        let limits = Limits {
            output_amplification: 10,
            output_floor_per_trigger: 100,
            ..Limits::default()
        };
        assert_eq!(amplification_bound(&limits, 0), 100);
        assert_eq!(amplification_bound(&limits, 50), 600);
        // Nothing emitted is always admitted, and holds nothing.
        assert_eq!(admit(&[], &limits, 0), Ok(0));
    }

    /// A Role of `rule` for `trigger` whose rules list `resources`.
    fn role(rule: &str, trigger: &str, name: &str, resources: usize) -> Desired {
        let res: Vec<String> = (0..resources).map(|i| format!("things{i}")).collect();
        let object = Manifest::from_value(&json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": "ns"},
            "rules": [{"apiGroups": ["example.org"], "resources": res, "verbs": ["get"]}],
        }))
        .expect("a role");
        Desired {
            kind: crate::api::OutputKind::Role,
            namespace: "ns".into(),
            name: name.into(),
            rule: rule.into(),
            trigger: Some(trigger.into()),
            field: "spec.outputs[0]".into(),
            refusal: None,
            object,
        }
    }

    #[test]
    fn shedding_counts_equal_rule_lists_once_and_sheds_the_heaviest_first() {
        let outputs = [
            role("r", "T/b", "big-b", 400),
            role("r", "T/a", "big-a", 400),
            role("r", "T/c", "small", 2),
            role("q", "T/d", "mid", 100),
        ];
        let w = |d: &Desired| manifest_weight(&d.object);
        let list = |d: &Desired| rules_weight(d.object.rules().expect("rules"));
        let whole: usize = outputs.iter().map(w).sum();
        // The two big lists are equal: held once.
        let held = whole - list(&outputs[0]);
        let unlimited = Limits::default();
        let (shed0, measured) = shed(outputs.iter(), &unlimited);
        assert!(shed0.is_empty());
        assert_eq!(measured, held);
        // A byte under: one of the two equal big ones goes, the first by
        // name; the list it shares stays held by the other.
        let own_a = w(&outputs[1]) - list(&outputs[1]);
        let tight = Limits {
            bytes_per_evaluation: held - 1,
            ..Limits::default()
        };
        let (s, after) = shed(outputs.iter(), &tight);
        let shed_of = |s: &Shed, r: &str| -> Vec<Option<String>> {
            s.get(r)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default()
        };
        assert_eq!(shed_of(&s, "r"), [Some("T/a".to_string())]);
        assert_eq!(after, held - own_a);
        assert!(s["r"][&Some("T/a".to_string())].contains("--max-bytes-per-evaluation"));
        // Tighter: shedding a frees too little, so b goes too, and with it
        // the list; the lighter rule keeps its trigger.
        let tighter = Limits {
            bytes_per_evaluation: held - own_a - 1,
            ..Limits::default()
        };
        let (s, after) = shed(outputs.iter(), &tighter);
        assert_eq!(
            shed_of(&s, "r"),
            [Some("T/a".to_string()), Some("T/b".to_string())]
        );
        assert!(shed_of(&s, "q").is_empty());
        assert_eq!(after, w(&outputs[2]) + w(&outputs[3]));
        // Per rule: only r's triggers are weighed against r's limit.
        let per_rule = Limits {
            bytes_per_rule: w(&outputs[3]) + 1,
            ..Limits::default()
        };
        let (s, _) = shed(outputs.iter(), &per_rule);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s["r"].len(), 2);
        // By objects: the trigger with the most goes.
        let mut many = outputs.to_vec();
        many.push(role("q", "T/d", "mid-2", 1));
        let by_objects = Limits {
            objects_per_evaluation: 4,
            ..Limits::default()
        };
        let (s, _) = shed(many.iter(), &by_objects);
        assert_eq!(s.len(), 1);
        assert!(s["q"][&Some("T/d".to_string())].contains("--max-objects-per-evaluation"));
        // The same outputs in another order: the same answer.
        many.reverse();
        assert_eq!(shed(many.iter(), &by_objects).0, s);
    }

    #[test]
    fn the_memory_limit_comes_from_the_cgroup_then_the_machine() {
        let files = |v2: Option<&'static str>, v1: Option<&'static str>| {
            move |p: &str| -> Option<String> {
                match p {
                    "/sys/fs/cgroup/kubepods/pod1/c1/memory.max" => v2.map(str::to_string),
                    "/sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes" => {
                        v1.map(str::to_string)
                    }
                    _ => None,
                }
            }
        };
        let v2 = Some("0::/kubepods/pod1/c1\n");
        assert_eq!(
            cgroup_limit(v2, files(Some("536870912\n"), None)),
            Some(512 << 20)
        );
        assert_eq!(cgroup_limit(v2, files(Some("max\n"), None)), None);
        let v1 = Some("5:memory:/kubepods/pod1\n4:cpu,cpuacct:/x\n");
        assert_eq!(
            cgroup_limit(v1, files(None, Some("1073741824"))),
            Some(1 << 30)
        );
        // v1's "no limit".
        assert_eq!(
            cgroup_limit(v1, files(None, Some("9223372036854771712"))),
            None
        );
        assert_eq!(mem_total("MemTotal:       16384 kB\n"), Some(16 << 20));
        assert!(auto_bytes_per_evaluation() > 0);
    }

    #[test]
    fn a_trigger_started_after_its_rules_time_is_up_fails_at_once() {
        let limits = Limits {
            seconds_per_rule: 0.001,
            ..Limits::default()
        };
        let _e = evaluation(&limits, 0);
        let _r = rule();
        std::thread::sleep(Duration::from_millis(5));
        let _t = start(&limits);
        let e = charge(1).unwrap_err();
        assert!(e.contains("--max-seconds-per-rule"), "{e}");
        let e = admit(&[], &limits, 0).unwrap_err();
        assert!(e.contains("--max-seconds-per-rule"), "{e}");
    }

    #[test]
    fn scopes_restore_and_outside_one_nothing_is_limited() {
        assert!(current().is_none());
        {
            let _e = evaluation(&Limits::default(), 0);
            assert!(current().is_some_and(|s| s.rule.is_none()));
            {
                let _r = rule();
                assert!(current().is_some_and(|s| s.rule.is_some()));
            }
            assert!(current().is_some_and(|s| s.rule.is_none()));
        }
        assert!(current().is_none());
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
