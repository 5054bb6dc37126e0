//! The incremental engine against the reference evaluator on arbitrary
//! inputs: rule YAML (the built-in rules when it does not parse), a line
//! `---8<---`, object YAML, a line `---8<---`, then bytes that each make
//! one change to the cluster (an object removed, re-added, relabelled,
//! paused, deleting; the desired objects applied; a rule removed). After
//! every change the engine, evaluating incrementally with one memo (a new
//! engine when the rules change), must compute exactly what
//! `rbac_rules::reference::evaluate` computes (all but `changed`).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use rbac_rules::engine::{Engine, Evaluation, GroupKind, Memo, ObjectStore, Options, RuleSource};
use serde_json::{Value, json};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut parts = text.splitn(3, "\n---8<---\n");
    let (rules_text, objects_text) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let changes = parts.next().unwrap_or("").as_bytes();
    let mut rules = match rbac_rules::rules::parse_text(Path::new("fuzz.yaml"), rules_text) {
        Ok(r) if !r.is_empty() => r,
        _ => rbac_rules::rules::builtin().unwrap_or_default(),
    };
    let mut objects: Vec<Value> = Vec::new();
    if let Ok(docs) = rbac_rules::yaml::parse_documents(Path::new("objects.yaml"), objects_text) {
        objects.extend(docs.into_iter().map(|d| d.value));
    }
    let mut store = ObjectStore::new();
    let mut version = 0u64;
    for o in &objects {
        write(&mut store, &mut version, o.clone());
    }
    let options = Options::default();
    let mut engine = Engine::new(&rules, options.clone());
    let mut memo = Memo::new();
    let mut last = compare(&engine, &mut memo, &rules, &options, &store);
    for pair in changes.chunks(2) {
        let (op, arg) = (pair[0], *pair.get(1).unwrap_or(&0) as usize);
        let live: Vec<Value> = store
            .kinds()
            .cloned()
            .collect::<Vec<_>>()
            .iter()
            .flat_map(|gk| store.list(gk).cloned().collect::<Vec<_>>())
            .collect();
        let pick = |xs: &[Value]| (!xs.is_empty()).then(|| xs[arg % xs.len()].clone());
        match op % 7 {
            0 => {
                if let Some(o) = pick(&live) {
                    remove(&mut store, &o);
                }
            }
            1 => {
                if let Some(o) = pick(&objects) {
                    write(&mut store, &mut version, o);
                }
            }
            2 | 3 => {
                if let Some(mut o) = pick(&live) {
                    let field = if op % 7 == 2 { "labels" } else { "annotations" };
                    let key = [
                        "example.org/team",
                        "crossplane.io/paused",
                        "rbac.crossplane.io/aggregate-to-edit",
                        "tier",
                    ][arg % 4];
                    if !o["metadata"][field].is_object() {
                        o["metadata"][field] = json!({});
                    }
                    o["metadata"][field][key] = json!(["true", "a", "payments"][arg % 3]);
                    write(&mut store, &mut version, o);
                }
            }
            4 => {
                if let Some(mut o) = pick(&live) {
                    o["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                    write(&mut store, &mut version, o);
                }
            }
            5 => {
                for (n, d) in last.desired.iter().enumerate() {
                    if (arg >> (n % 8)) & 1 == 1 {
                        let mut o = d.object.to_value();
                        o["metadata"]["uid"] = json!(format!("uid-{}-{}", d.namespace, d.name));
                        write(&mut store, &mut version, o);
                    }
                }
            }
            _ => {
                if !rules.is_empty() {
                    rules.remove(arg % rules.len());
                    engine = Engine::new(&rules, options.clone());
                }
            }
        }
        last = compare(&engine, &mut memo, &rules, &options, &store);
    }
});

/// Evaluates with both and panics where they differ.
fn compare(
    engine: &Engine,
    memo: &mut Memo,
    rules: &[RuleSource],
    options: &Options,
    store: &ObjectStore,
) -> Evaluation {
    let got = engine.evaluate_incremental(store, memo);
    let want = rbac_rules::reference::evaluate(rules, options, store);
    assert_eq!(got.desired, want.desired, "desired objects differ");
    assert_eq!(got.reports, want.reports, "reports differ");
    assert_eq!(got.contested, want.contested, "contested objects differ");
    assert_eq!(got.revoked, want.revoked, "revoked objects differ");
    got
}

/// Writes an object as the API server would: a new resourceVersion.
fn write(store: &mut ObjectStore, version: &mut u64, mut o: Value) {
    *version += 1;
    if let Some(m) = o["metadata"].as_object_mut() {
        m.insert("resourceVersion".into(), json!(version.to_string()));
    }
    let _ = store.insert(o);
}

fn remove(store: &mut ObjectStore, o: &Value) {
    if let (Some(gk), Some(key)) = (GroupKind::of(o), rbac_rules::engine::store::key_of(o)) {
        store.remove(&gk, &key);
    }
}
