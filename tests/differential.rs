//! Differential tests: the incremental engine computes exactly what the
//! reference evaluator (`rbac_rules::reference`, the specification)
//! computes — over every golden case, and over generated clusters and
//! sequences of changes (objects added, changed, deleted; rules added,
//! changed, deleted) with the shipped rule sets and generated rules, the
//! engine evaluating incrementally with one memo carried across steps and
//! rebuilt when the rules change, as the controller does.
//!
//! `DIFFERENTIAL_CASES=N` raises the number of generated sequences.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Parser;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rbac_rules::engine::{Engine, Evaluation, Memo, ObjectStore, Options, RuleSource};
use rbac_rules::render::RenderArgs;
use serde_json::{Value, json};

/// Everything but [`Evaluation::changed`] (incremental only), or where the
/// two differ first.
fn difference(engine: &Evaluation, reference: &Evaluation) -> Option<String> {
    let keys = |e: &Evaluation| -> Vec<String> {
        e.desired
            .iter()
            .map(|d| format!("{} {}/{}", d.kind, d.namespace, d.name))
            .collect()
    };
    if keys(engine) != keys(reference) {
        let (a, b) = (keys(engine), keys(reference));
        let only_engine: Vec<_> = a.iter().filter(|k| !b.contains(k)).collect();
        let only_reference: Vec<_> = b.iter().filter(|k| !a.contains(k)).collect();
        return Some(format!(
            "desired objects differ: only the engine's: {only_engine:?}; only the reference's: {only_reference:?}"
        ));
    }
    for (a, b) in engine.desired.iter().zip(reference.desired.iter()) {
        if a != b {
            return Some(format!(
                "desired object differs:\nengine:    {a:?}\nreference: {b:?}"
            ));
        }
    }
    let names: std::collections::BTreeSet<&String> = engine
        .reports
        .keys()
        .chain(reference.reports.keys())
        .collect();
    for name in names {
        let (a, b) = (engine.reports.get(name), reference.reports.get(name));
        if a != b {
            return Some(format!(
                "report of rule {name:?} differs:\nengine:    {a:#?}\nreference: {b:#?}"
            ));
        }
    }
    if engine.contested != reference.contested {
        return Some(format!(
            "contested differ:\nengine:    {:?}\nreference: {:?}",
            engine.contested, reference.contested
        ));
    }
    if engine.revoked != reference.revoked {
        return Some(format!(
            "revoked differ:\nengine:    {:#?}\nreference: {:#?}",
            engine.revoked, reference.revoked
        ));
    }
    None
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    render: RenderArgs,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A golden case's inputs, loaded as `rbac-rules render` loads them.
fn golden_inputs(case: &Path) -> (Vec<RuleSource>, Options, ObjectStore) {
    let mut argv: Vec<String> = vec!["render".into()];
    for objects in [case.join("objects"), case.join("objects.yaml")] {
        if objects.exists() {
            argv.extend(["--objects".into(), objects.display().to_string()]);
        }
    }
    for rules in [case.join("rules"), case.join("rules.yaml")] {
        if rules.exists() {
            argv.extend(["--rules".into(), rules.display().to_string()]);
        }
    }
    if let Ok(args) = std::fs::read_to_string(case.join("args")) {
        // Paths relative to the crate root, the tests' working directory.
        argv.extend(args.split_whitespace().map(str::to_string));
    }
    let args = Cli::try_parse_from(&argv)
        .expect("the case's args parse")
        .render;
    let rules: Vec<RuleSource> =
        rbac_rules::rules::load_for_command("render", &args.rules, args.recursive)
            .expect("the case's rules load")
            .into_iter()
            .map(|(_, r)| r)
            .collect();
    let mut store = ObjectStore::new();
    rbac_rules::yaml::for_each_in_tree(&args.objects, args.recursive, |_, _, v| {
        store.insert(v).expect("the case's objects load");
    })
    .expect("the case's objects read");
    let allow = args
        .allow
        .as_ref()
        .map(|p| rbac_rules::render::load_allow(p, &mut store).expect("allow-list"));
    let options = Options {
        manage: args.manage,
        allow,
        waivers: args.waivers.clone(),
        limits: args.limits.clone(),
        params: args.params.map(),
        ..Options::default()
    };
    (rules, options, store)
}

/// Every golden case: the engine's evaluation is the reference's.
#[test]
fn golden_cases_agree() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("tests/golden"))
        .expect("tests/golden")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() > 10, "golden cases found");
    let mut failures = Vec::new();
    for case in &dirs {
        let (rules, options, store) = golden_inputs(case);
        let engine = Engine::new(&rules, options.clone()).evaluate(&store);
        let reference = rbac_rules::reference::evaluate(&rules, &options, &store);
        assert!(!reference.desired.is_empty() || !reference.reports.is_empty());
        if let Some(d) = difference(&engine, &reference) {
            failures.push(format!("{}: {d}", case.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden case(s) differ:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
