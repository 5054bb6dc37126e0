//! Preparing the rules, written once for the engine and the reference:
//! each rule compiled once (`spec` validated, templates parsed, `params`
//! given their values), inactive ones (`manageLevel` above `--manage`) set
//! aside, and the rest ordered so that a rule that reads a kind runs after
//! every rule that emits it (ties by name; rules in a cycle do not run).
//! The caller passes the template set the rules are parsed into: the
//! engine's, or the reference's plain handlebars, so that the reference's
//! rendering stays its own.
//!
//! Reference twin: `reference/order.rs` (which calls [`prepare`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::compile::{self, CompiledRule};
use super::error::{EngineError, ErrorKind};
use super::model::{RuleReport, RuleState};
use super::template::Templates;
use super::{Options, RuleSource, tenant};

/// The rules ready to run.
pub struct Prepared {
    /// Every template of every rule, parsed.
    pub templates: Templates,
    /// The runnable rules, in evaluation order.
    pub rules: Vec<Arc<CompiledRule>>,
    /// Reports of the rules that do not run: invalid, cyclic, inactive.
    pub fixed: BTreeMap<String, RuleReport>,
    /// How many rules were compiled, not taken from an [`Earlier`]
    /// preparation.
    pub compiled: usize,
}

/// An earlier preparation whose compiled rules a new one may take: a
/// rule whose source (name, namespace, spec) is the same, compared whole,
/// under the same options, compiles to the same rule, so it is taken as
/// it is, its templates copied from the registry it was compiled into.
pub struct Earlier<'a> {
    /// The sources it was given.
    pub sources: &'a [Arc<RuleSource>],
    /// Its options.
    pub options: &'a Options,
    /// Its runnable rules.
    pub rules: &'a [Arc<CompiledRule>],
    /// The registry they were compiled into.
    pub templates: &'a Templates,
}

impl<'a> Earlier<'a> {
    /// Its rules by name, each with the source it was compiled from (the
    /// first of several sources of one name is the one compiled).
    fn by_name(&self) -> HashMap<&'a str, (&'a RuleSource, &'a Arc<CompiledRule>)> {
        let mut sources: HashMap<&str, &RuleSource> = HashMap::new();
        for s in self.sources {
            sources.entry(s.name.as_str()).or_insert(&**s);
        }
        self.rules
            .iter()
            .filter_map(|r| Some((r.name.as_str(), (*sources.get(r.name.as_str())?, r))))
            .collect()
    }
}

/// Rule `src` as compiled before, when it was and its source is the same.
fn taken<'r>(
    src: &RuleSource,
    earlier: &HashMap<&str, (&RuleSource, &'r Arc<CompiledRule>)>,
) -> Option<&'r Arc<CompiledRule>> {
    let (was, rule) = earlier.get(src.name.as_str())?;
    (*was == src).then_some(*rule)
}

impl Prepared {
    /// A runnable rule's place in evaluation order.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.rules.iter().position(|r| r.name == name)
    }
}

/// Compiles `sources` into `templates` and orders them: invalid,
/// duplicate, inactive and cyclic rules get a report instead of a place
/// in the order.
pub fn prepare(sources: &[RuleSource], options: &Options, templates: Templates) -> Prepared {
    prepare_after(sources, options, templates, None)
}

/// [`prepare`], taking from `earlier` each rule it compiled from the same
/// source, when its options are these and its registry of the same kind:
/// only new and changed rules compile. What it gives is what [`prepare`]
/// gives, rule for rule and template for template.
pub fn prepare_after(
    sources: &[RuleSource],
    options: &Options,
    mut templates: Templates,
    earlier: Option<Earlier<'_>>,
) -> Prepared {
    let earlier = earlier.filter(|e| e.options == options && e.templates.same_kind(&templates));
    let earlier_rules = earlier.as_ref().map(Earlier::by_name).unwrap_or_default();
    let mut compiled = Vec::new();
    let mut fixed = BTreeMap::new();
    let mut seen = BTreeSet::new();
    let mut count = 0;
    for src in sources {
        if !seen.insert(src.name.clone()) {
            let e = rule_error(
                &src.name,
                ErrorKind::InvalidRule,
                "metadata.name",
                "two rules have this name",
            );
            fixed.insert(src.name.clone(), failed(e));
            continue;
        }
        if src.spec.manage_level > options.manage {
            fixed.insert(src.name.clone(), RuleReport::new(RuleState::Inactive));
            continue;
        }
        if let Some((e, rule)) = earlier
            .as_ref()
            .and_then(|e| Some((e, taken(src, &earlier_rules)?)))
            && templates.copy_from(e.templates, &rule.registered).is_ok()
        {
            // What copying compiled, if anything, is the rule's already.
            templates.take_registered();
            compiled.push(Arc::clone(rule));
            continue;
        }
        count += 1;
        // Only this rule's texts are noted with it.
        templates.take_registered();
        let result = compile_one(src, options, &mut templates);
        let registered = Arc::new(templates.take_registered());
        match result {
            Ok(mut rule) => {
                rule.registered = registered;
                compiled.push(Arc::new(rule));
            }
            Err(report) => {
                fixed.insert(src.name.clone(), report);
            }
        }
    }
    let (order, cycles) = compile::order(&compiled);
    for (i, waits) in &cycles {
        let name = &compiled[*i].name;
        let message = format!(
            "reads kinds emitted by rules that (transitively) read its own outputs: {}",
            waits.join(", ")
        );
        fixed.insert(
            name.clone(),
            failed(rule_error(name, ErrorKind::Cycle, "spec", &message)),
        );
    }
    let mut slots: Vec<Option<Arc<CompiledRule>>> = compiled.into_iter().map(Some).collect();
    let rules = order.into_iter().filter_map(|i| slots[i].take()).collect();
    Prepared {
        templates,
        rules,
        fixed,
        compiled: count,
    }
}

/// One rule compiled with the installation's params, or its report.
fn compile_one(
    src: &RuleSource,
    options: &Options,
    templates: &mut Templates,
) -> Result<CompiledRule, RuleReport> {
    let confined = tenant::confine(
        &src.name,
        src.namespace.as_deref(),
        &src.spec,
        &options.tenancy,
    );
    let errors = match confined.and_then(|spec| compile::compile(&src.name, &spec, templates)) {
        Ok(mut rule) => match rule.set_params(&options.params, &options.param_origins) {
            Ok(()) => return Ok(rule),
            Err(e) => vec![e],
        },
        Err(errors) => errors,
    };
    let mut report = RuleReport::new(RuleState::Failed);
    report.errors = errors
        .into_iter()
        .map(|e| e.into_engine(&src.name, None))
        .collect();
    Err(report)
}

fn rule_error(rule: &str, kind: ErrorKind, field: &str, message: &str) -> EngineError {
    EngineError {
        kind,
        rule: rule.to_string(),
        field: field.to_string(),
        trigger: None,
        message: message.to_string(),
    }
}

fn failed(error: EngineError) -> RuleReport {
    let mut report = RuleReport::new(RuleState::Failed);
    report.errors.push(error);
    report
}
