//! Engine benchmark: prints figures, asserts nothing about time.
//!
//! cargo test --release --test bench_engine -- --ignored --nocapture
//!
//! A synthetic Crossplane cluster: XRDS XRDs, PROVIDERS provider revisions
//! with TYPES CRDs each (in families of 5), and NAMESPACES namespaces each
//! accepting 3 XRDs.

use std::time::Instant;

use rbac_rules::engine::{Engine, ObjectStore, Options};
use serde_json::json;

const XRDS: usize = 300;
const PROVIDERS: usize = 100;
const TYPES: usize = 50;
const NAMESPACES: usize = 2000;

fn cluster() -> ObjectStore {
    let mut s = ObjectStore::new();
    let mut add = |v| s.insert(v).expect("insert");
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
    println!(
        "engine bench: {} objects in, {outputs} objects out; build {:?}, compile {:?}, evaluate min {:?} / median {:?} / max {:?}",
        store.len(),
        build,
        compile,
        times[0],
        times[1],
        times[2]
    );
}
