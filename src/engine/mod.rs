//! The pure rule engine: (rules, observed objects) → desired objects.
//!
//! No Kubernetes client here. Evaluation is deterministic: rules run in
//! dependency order (ties by name), objects are read in sorted order, and the
//! result is sorted by kind, namespace and name.
//!
//! Where things are: `order` prepares the rules ([`compile`] checks
//! each once), for the engine and the reference alike; `trigger` matches
//! a rule's triggers and `expand` renders each, one stage per file named
//! as its twin in `src/reference/`: `related`, `vars`, `outputs`, with
//! `values` (template values) and `conditions` ([`template`] is the
//! template language and the one place that knows what a template reads);
//! [`output`] validates what is rendered; `grants` judges it against the
//! default denials and the allow-list ([`crate::policy`]). `emit::evaluate`
//! holds one evaluation's steps in one place: the rules in order over the
//! world `view`, then `policy`, then `report`. [`kinds`] holds the facts
//! of the emitted kinds. What exists only for speed lives in `incremental`
//! (the memo, its read index, the views' caches and the evaluator's),
//! which imports no stage.
//!
//! Words: *preserved* — a live object left as it is because its rule or
//! trigger erred, paused, is deleting or is held (an error never deletes
//! what a good rule made); *cached* — a value remembered between triggers
//! or evaluations only so as not to compute it again. (The public
//! `RuleReport::kept_triggers`, `static_kept` and `Evaluation::keeps` keep
//! their names: they mean preserved.)

mod chunks;
pub mod compile;
mod conditions;
mod directive;
mod emit;
pub mod error;
mod expand;
mod fast_hash;
pub mod format;
mod grants;
mod incremental;
pub mod kinds;
pub mod limits;
pub mod manifest;
mod model;
pub(crate) mod order;
pub mod output;
mod outputs;
pub mod packed;
pub mod path;
mod policy;
mod related;
mod report;
pub mod shape;
pub mod store;
pub mod template;
pub mod tenant;
pub mod time;
mod trigger;
mod values;
mod vars;
mod view;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use fast_hash::HashMap;
use incremental::memo;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

pub use error::{EngineError, EngineWarning, ErrorKind};
pub use limits::Limits;
pub use manifest::{Manifest, OwnerRef, StrMap};
pub use memo::Memo;
pub use model::{Desired, DesiredSet, Evaluation, OutKey, RuleReport, RuleState};
pub use store::{GroupKind, ObjectStore};

use crate::api::{ManageLevel, OutputKind, RbacRuleSpec};
pub use crate::policy::{AllowList, Waivers};
pub use compile::Interest;
use compile::{CompiledRule, merge_interests};
use template::Templates;

/// A rule as handed to the engine. Two equal sources compile to the
/// same rule under the same options ([`Engine::with_previous`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RuleSource {
    /// metadata.name of the RbacRule.
    pub name: String,
    /// Its spec.
    pub spec: RbacRuleSpec,
    /// `None` for a cluster RbacRule; the namespace of a
    /// NamespacedRbacRule, which confines what the rule reads and writes to
    /// that namespace and puts its outputs under the namespace's ceiling.
    pub namespace: Option<String>,
}

/// Settings of one evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Rules above this level are inactive.
    pub manage: ManageLevel,
    /// The allow-list: when set, every emitted policy rule must be covered
    /// by it, and so must what a live role no rule manages that an emitted
    /// binding references grants; otherwise the output is refused
    /// ([`ErrorKind::EscalationDenied`]).
    /// An aggregated allow-list is read through its selectors, over the
    /// live ClusterRoles no rule manages.
    pub allow: Option<AllowList>,
    /// Default denials switched off (all active by default).
    pub waivers: Waivers,
    /// Selectors of aggregated ClusterRoles that outputs must not feed: no
    /// output may carry labels one of them selects. By default the
    /// controller's own role ([`controller_aggregation_selector`]); the
    /// allow-list's selectors are added to these.
    pub protected: Vec<LabelSelector>,
    /// Rules the caller holds back (e.g. a kind they read is not watched
    /// yet): not evaluated, their live objects preserved and visible to others.
    pub held: BTreeSet<String>,
    /// Bounds on template nesting, lists, bytes, objects and time.
    pub limits: Limits,
    /// The installation's settings (`--param NAME=VALUE`): each overrides
    /// the default of the param of that name in every rule declaring it.
    pub params: BTreeMap<String, String>,
    /// Where each of [`Options::params`] was given (a flag or an
    /// environment variable), named when its value is refused; a param
    /// missing here is named as `--param`.
    pub param_origins: BTreeMap<String, crate::params::Origin>,
    /// The administrator's settings for NamespacedRbacRules: the
    /// cluster-scoped kinds they may read and the default ceiling.
    pub tenancy: tenant::Tenancy,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            manage: ManageLevel::default(),
            allow: None,
            waivers: Waivers::default(),
            protected: vec![controller_aggregation_selector()],
            held: BTreeSet::new(),
            limits: Limits::default(),
            params: BTreeMap::new(),
            param_origins: BTreeMap::new(),
            tenancy: tenant::Tenancy::default(),
        }
    }
}

/// Label by which the controller's own ClusterRole aggregates its
/// permissions (deploy/controller/rbac.yaml).
pub const CONTROLLER_AGGREGATION_LABEL: &str = "rbacrules.io/aggregate-to-controller";

/// The selector of the controller's own aggregated ClusterRole: no output
/// may carry a label it selects, or a rule could widen the controller.
pub fn controller_aggregation_selector() -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(
            CONTROLLER_AGGREGATION_LABEL.to_string(),
            "true".to_string(),
        )])),
        match_expressions: None,
    }
}

/// Rules compiled once, evaluated against any number of observed states.
pub struct Engine {
    /// Identity for memos (see [`Memo`]).
    id: u64,
    templates: Templates,
    /// Valid rules in evaluation order.
    rules: Vec<Arc<CompiledRule>>,
    /// Reports for rules that cannot run (invalid, cyclic, inactive).
    fixed_reports: BTreeMap<String, RuleReport>,
    /// Index in `rules` by name.
    index: HashMap<String, usize>,
    options: Options,
    /// What it is made of: a memo another engine of the same rules made
    /// is taken over ([`Engine::take_over`]).
    stamp: Arc<incremental::stamp::EngineStamp>,
    /// The rules it was made from: a later engine
    /// ([`Engine::with_previous`]) takes each rule whose source is the
    /// same as compiled here.
    sources: Vec<Arc<RuleSource>>,
    /// How many rules it compiled (the others it took from its
    /// predecessor).
    compiled: usize,
}

impl Engine {
    /// Compiles the rules. Invalid rules are reported, not fatal: the others
    /// still run. Compiles on a thread of its own ([`limits::isolated`]).
    pub fn new(sources: &[RuleSource], options: Options) -> Engine {
        Self::build(sources, options, None)
    }

    /// [`Engine::new`] for rules that changed since `previous` was made:
    /// a rule whose source (name, namespace, spec) is the same, compared
    /// whole, under the same options, is taken from `previous` as it was
    /// compiled (with its templates, copied into this engine's registry:
    /// it holds what compiling every rule afresh puts there, nothing of a
    /// rule gone or changed), so only new and changed rules compile. The
    /// engine is the one [`Engine::new`] makes, and takes over the memo
    /// `previous` made as that one does.
    pub fn with_previous(previous: &Engine, sources: &[RuleSource], options: Options) -> Engine {
        Self::build(sources, options, Some(previous))
    }

    /// How many rules this engine compiled: all its valid and invalid
    /// active rules for [`Engine::new`], the new and changed ones for
    /// [`Engine::with_previous`].
    pub fn rules_compiled(&self) -> usize {
        self.compiled
    }

    /// Every template and expression text the engine's registry holds,
    /// each named by where it is held, sorted: what two engines of the
    /// same rules and options hold alike, however they were made.
    pub fn template_texts(&self) -> Vec<String> {
        self.templates.held_texts()
    }

    fn build(sources: &[RuleSource], options: Options, previous: Option<&Engine>) -> Engine {
        let prepared = limits::isolated(|| {
            let earlier = previous.map(|p| order::Earlier {
                sources: &p.sources,
                options: &p.options,
                rules: &p.rules,
                templates: &p.templates,
            });
            order::prepare_after(
                sources,
                &options,
                Templates::with_limits(&options.limits),
                earlier,
            )
        });
        match prepared {
            Ok(p) => Engine {
                id: memo::next_engine_id(),
                stamp: stamp_of(&p.rules, &p.fixed, &options, previous),
                index: index_of(&p.rules),
                templates: p.templates,
                rules: p.rules,
                fixed_reports: p.fixed,
                options,
                sources: shared_sources(sources, previous),
                compiled: p.compiled,
            },
            Err(e) => {
                tracing::error!(error = %e, "compiling the rules failed");
                let mut fixed_reports = BTreeMap::new();
                for src in sources {
                    fixed_reports.insert(src.name.clone(), internal_failure(&src.name, &e));
                }
                Engine {
                    id: memo::next_engine_id(),
                    stamp: stamp_of(&[], &fixed_reports, &options, None),
                    templates: Templates::with_limits(&options.limits),
                    rules: Vec::new(),
                    fixed_reports,
                    index: HashMap::default(),
                    options,
                    // Nothing compiled here to take.
                    sources: Vec::new(),
                    compiled: sources.len(),
                }
            }
        }
    }

    /// A runnable rule's index in evaluation order.
    fn rule_index(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// Kinds the runnable rules read, merged per kind (see [`interests`]).
    pub fn interests(&self) -> Vec<Interest> {
        interests_of_rules(&self.rules, &self.options)
    }

    /// Evaluates every rule against the observed objects.
    pub fn evaluate(&self, observed: &ObjectStore) -> Evaluation {
        self.evaluate_incremental(observed, &mut Memo::one_shot())
    }

    /// Evaluates every rule, rendering again only the triggers that what
    /// changed since the last call with `memo` can affect. The result is
    /// the same as [`Engine::evaluate`]'s.
    ///
    /// Runs on a thread of its own with a large stack; should it panic
    /// anyway, every rule fails with an `Internal` error (so every live
    /// object is preserved) and the memo starts afresh.
    pub fn evaluate_incremental(&self, observed: &ObjectStore, memo: &mut Memo) -> Evaluation {
        match limits::isolated(|| self.guarded(observed, &mut *memo)) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "evaluation failed");
                *memo = Memo::new();
                let mut reports = self.fixed_reports.clone();
                for r in &self.rules {
                    reports.insert(r.name.clone(), internal_failure(&r.name, &e));
                }
                Evaluation {
                    desired: DesiredSet::default(),
                    reports: std::sync::Arc::new(reports),
                    contested: BTreeSet::new(),
                    revoked: BTreeMap::new(),
                    changed: Vec::new(),
                }
            }
        }
    }
}

impl Engine {
    /// Evaluates, then sheds the heaviest triggers while a rule's or the
    /// evaluation's total is over its limit ([`limits::shed`], which the
    /// reference applies too): they fail, and the evaluation is made again
    /// from a fresh memo without them, so that what later rules read is
    /// what is kept; again while what it keeps is still over (triggers a
    /// pass cut off at its cap, `limits::PASS_CAP_FACTOR`, render then), at
    /// most [`limits::MAX_SHED_PASSES`] times. Shed triggers stay shed until
    /// the memo starts afresh.
    fn guarded(&self, observed: &ObjectStore, memo: &mut Memo) -> Evaluation {
        self.take_over(memo);
        let mut evaluation = emit::evaluate(self, observed, memo);
        let limits = &self.options.limits;
        let namespaces: Vec<Option<&str>> = self
            .rules
            .iter()
            .map(|r| tenant::rule_namespace(&r.name))
            .collect();
        for _ in 0..limits::MAX_SHED_PASSES {
            if memo.within_totals(limits, &namespaces) {
                break;
            }
            let (shed, held) = limits::shed(evaluation.desired.iter(), limits);
            if shed.is_empty() {
                memo.measured(held);
                break;
            }
            drop(evaluation);
            let mut all = std::mem::take(&mut memo.shed);
            for (rule, triggers) in shed {
                all.entry(rule).or_default().extend(triggers);
            }
            *memo = Memo {
                shed: all,
                one_shot: memo.one_shot,
                ..Memo::default()
            };
            evaluation = emit::evaluate(self, observed, memo);
        }
        memo.stamp = Some(Arc::clone(&self.stamp));
        evaluation
    }

    /// Takes over a memo another engine made, when its rules are these
    /// (see [`incremental::adopt`]): a changed rule renders again, the
    /// others keep what they cached. Otherwise the evaluation starts over.
    fn take_over(&self, memo: &mut Memo) {
        let same_options = |o: &(dyn std::any::Any + Send + Sync)| {
            o.downcast_ref::<Options>() == Some(&self.options)
        };
        incremental::adopt::adopt(
            memo,
            (self.id, &self.stamp),
            &self.fixed_reports,
            same_options,
        );
    }
}

/// What an engine of these rules, reports and options is made of. A rule
/// taken from `previous` as it was compiled there (the same registered
/// texts, not a copy of them) has the stamp it had there: its text is
/// not written again.
fn stamp_of(
    rules: &[Arc<CompiledRule>],
    fixed_reports: &BTreeMap<String, RuleReport>,
    options: &Options,
    previous: Option<&Engine>,
) -> Arc<incremental::stamp::EngineStamp> {
    let taken = |r: &CompiledRule| {
        let p = previous?;
        let i = p.rule_index(&r.name)?;
        let was = p.rules.get(i)?;
        Arc::ptr_eq(&was.registered, &r.registered)
            .then(|| p.stamp.rules.get(i).cloned())
            .flatten()
    };
    Arc::new(incremental::stamp::EngineStamp {
        rules: rules
            .iter()
            .map(|r| {
                taken(r).unwrap_or_else(|| {
                    incremental::stamp::RuleStamp::of(&r.name, &r.spec, &r.params, &r.produces)
                })
            })
            .collect(),
        fixed: fixed_reports.keys().cloned().collect(),
        options: Box::new(options.clone()),
    })
}

/// Kinds the rules read, merged per kind: what the caller must watch. The
/// answer `Engine::new(sources, options.clone()).interests()` gives, without
/// building an engine: the rules are compiled (only runnable rules read:
/// valid, active, not in a cycle), nothing more.
pub fn interests(sources: &[RuleSource], options: &Options) -> Vec<Interest> {
    let prepared = limits::isolated(|| {
        order::prepare(sources, options, Templates::with_limits(&options.limits)).rules
    });
    match prepared {
        Ok(rules) => interests_of_rules(&rules, options),
        // As an engine that failed to compile: no runnable rule.
        Err(_) => interests_of_rules(&[], options),
    }
}

/// The sources an engine keeps, each shared with `previous`'s when equal
/// (name, namespace, spec): a rule change copies, and its old engine
/// frees, only the changed rule's spec.
fn shared_sources(sources: &[RuleSource], previous: Option<&Engine>) -> Vec<Arc<RuleSource>> {
    let before: HashMap<&str, &Arc<RuleSource>> = previous
        .map(|p| p.sources.iter().map(|s| (s.name.as_str(), s)).collect())
        .unwrap_or_default();
    sources
        .iter()
        .map(|s| match before.get(s.name.as_str()) {
            Some(b) if b.as_ref() == s => Arc::clone(b),
            _ => Arc::new(s.clone()),
        })
        .collect()
}

/// Each rule's index in `rules` (evaluation order), by name.
fn index_of(rules: &[Arc<CompiledRule>]) -> HashMap<String, usize> {
    rules
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.clone(), i))
        .collect()
}

/// Kinds the runnable `rules` read, merged per kind.
fn interests_of_rules(rules: &[Arc<CompiledRule>], options: &Options) -> Vec<Interest> {
    let mut all: Vec<Interest> = rules
        .iter()
        .flat_map(|r| r.interests.iter().cloned())
        .collect();
    // Policy reads the live roles, with or without an allow-list: what
    // a role an emitted binding names grants, what an emitted
    // aggregated role collects, and, under an allow-list, the list's
    // own aggregation.
    // A tenant rule's outputs are judged against a ceiling: a ClusterRole
    // (and what it aggregates) named by its Namespace's label.
    let tenants = rules
        .iter()
        .any(|r| tenant::rule_namespace(&r.name).is_some());
    if tenants {
        all.push(Interest {
            gk: GroupKind::new("", "Namespace"),
            version: None,
            metadata_only: true,
            fields: None,
            // The ceiling reads one Namespace at a time (`get_owned`).
            packable: true,
        });
    }
    let reads_roles = tenants
        || options.allow.is_some()
        || rules.iter().any(|r| {
            r.spec
                .outputs
                .iter()
                .any(|o| !o.kind.is_role() || o.aggregation_rule.is_some())
        });
    if reads_roles {
        for kind in [OutputKind::ClusterRole, OutputKind::Role] {
            all.push(Interest {
                gk: kinds::output_gk(kind),
                version: None,
                metadata_only: false,
                fields: None,
                packable: false,
            });
        }
    }
    merge_interests(all)
}

/// The report of a rule whose evaluation failed unexpectedly.
fn internal_failure(rule: &str, message: &str) -> RuleReport {
    let mut rep = RuleReport::new(RuleState::Failed);
    rep.errors.push(EngineError {
        kind: ErrorKind::Internal,
        rule: rule.to_string(),
        field: "spec".into(),
        trigger: None,
        message: message.to_string(),
    });
    rep
}
