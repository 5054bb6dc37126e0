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

use std::collections::{BTreeMap, BTreeSet};

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
    pub rules: Vec<CompiledRule>,
    /// Reports of the rules that do not run: invalid, cyclic, inactive.
    pub fixed: BTreeMap<String, RuleReport>,
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
pub fn prepare(sources: &[RuleSource], options: &Options, mut templates: Templates) -> Prepared {
    let mut compiled = Vec::new();
    let mut fixed = BTreeMap::new();
    let mut seen = BTreeSet::new();
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
        match compile_one(src, options, &mut templates) {
            Ok(rule) => compiled.push(rule),
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
    let mut slots: Vec<Option<CompiledRule>> = compiled.into_iter().map(Some).collect();
    let rules = order.into_iter().filter_map(|i| slots[i].take()).collect();
    Prepared {
        templates,
        rules,
        fixed,
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
