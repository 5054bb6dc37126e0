//! Engine benchmark: prints figures, asserts nothing about time.
//!
//! cargo test --release --test bench_engine -- --ignored --nocapture
//!
//! A synthetic Crossplane cluster: BENCH_XRDS XRDs (default 300),
//! BENCH_PROVIDERS provider revisions (100) with BENCH_TYPES CRDs each (50),
//! in families of 5, and BENCH_NAMESPACES namespaces (2000) each accepting
//! 3 XRDs.

use std::time::Instant;

use rbac_rules::engine::{Engine, Memo, ObjectStore, Options};
use serde_json::json;

/// A size from the environment (BENCH_XRDS, …), or its default.
fn size(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[allow(non_snake_case)]
fn cluster() -> ObjectStore {
    let (XRDS, PROVIDERS, TYPES, NAMESPACES) = (
        size("BENCH_XRDS", 300),
        size("BENCH_PROVIDERS", 100),
        size("BENCH_TYPES", 50),
        size("BENCH_NAMESPACES", 2000),
    );
    let mut s = ObjectStore::new();
    let mut rv = 0u64;
    // Objects carry resourceVersions, as a live cluster's do.
    let mut add = |mut v: serde_json::Value| {
        rv += 1;
        v["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.insert(v).expect("insert")
    };
    for i in 0..XRDS {
        add(
            json!({"apiVersion": "apiextensions.crossplane.io/v1", "kind": "CompositeResourceDefinition",
            "metadata": {"name": format!("xthings{i}.platform.example.org"), "uid": format!("xrd-{i}")},
            "spec": {"group": "platform.example.org", "names": {"kind": format!("XThing{i}"), "plural": format!("xthings{i}")},
                     "claimNames": {"kind": format!("Thing{i}"), "plural": format!("things{i}")}}}),
        );
    }
    for p in 0..PROVIDERS {
        let refs: Vec<_> = (0..TYPES)
            .map(|t| {
                json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                            "name": format!("kind{t}s.svc{p}.aws.example.org")})
            })
            .collect();
        add(
            json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
            "metadata": {"name": format!("provider-{p}-abc"), "uid": format!("pr-{p}"),
                         "labels": {"pkg.crossplane.io/provider-family": format!("family-{}", p / 5)}},
            "spec": {"image": format!("xpkg.example.org/org/provider-{p}:v1")},
            "status": {"objectRefs": refs}}),
        );
        add(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": format!("provider-{p}"), "namespace": "crossplane-system",
                         "ownerReferences": [{"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
                                              "name": format!("provider-{p}-abc"), "uid": format!("pr-{p}"), "controller": true}]},
            "spec": {"template": {"spec": {"serviceAccountName": format!("provider-{p}")}}}}));
    }
    for n in 0..NAMESPACES {
        let mut ann = serde_json::Map::new();
        for k in 0..3 {
            ann.insert(
                format!(
                    "rbac.crossplane.io/xthings{}.platform.example.org",
                    (n + k * 7) % XRDS
                ),
                json!("xrd-claim-accepted"),
            );
        }
        add(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("team-{n}"), "uid": format!("ns-{n}"), "annotations": ann}}),
        );
    }
    s
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture, preferably --release"]
fn bench_builtin_rules_on_large_cluster() {
    let rules = rbac_rules::rules::builtin().expect("rules");
    let started = Instant::now();
    let store = cluster();
    let build = started.elapsed();
    let started = Instant::now();
    let engine = Engine::new(&rules, Options::default());
    let compile = started.elapsed();
    let mut times = Vec::new();
    let mut outputs = 0;
    for _ in 0..3 {
        let started = Instant::now();
        let eval = engine.evaluate(&store);
        times.push(started.elapsed());
        outputs = eval.desired.len();
        assert_eq!(eval.errors().count(), 0);
    }
    times.sort();
    // Incremental: a warm memo, then no change, then one namespace changed.
    let mut memo = Memo::new();
    engine.evaluate_incremental(&store, &mut memo);
    let started = Instant::now();
    engine.evaluate_incremental(&store, &mut memo);
    let noop = (started.elapsed(), memo.renders());
    let mut changed = store.clone();
    changed
        .insert(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-0", "uid": "ns-0", "resourceVersion": "changed",
            "annotations": {"rbac.crossplane.io/xthings1.platform.example.org": "xrd-claim-accepted"}}}))
        .expect("insert");
    let started = Instant::now();
    engine.evaluate_incremental(&changed, &mut memo);
    let one = (started.elapsed(), memo.renders());
    println!(
        "engine bench: {} objects in, {outputs} objects out; build {:?}, compile {:?}, full evaluate min {:?} / median {:?} / max {:?}; incremental no-op {:?} ({} renders), one namespace changed {:?} ({} renders)",
        store.len(),
        build,
        compile,
        times[0],
        times[1],
        times[2],
        noop.0,
        noop.1,
        one.0,
        one.1
    );
}
