//! Engine benchmark: prints figures, asserts nothing about time.
//!
//! cargo test --release --test bench_engine -- --ignored --nocapture
//!
//! The synthetic Crossplane control plane. `large` (the default):
//! 70 ProviderRevisions in families of 7 with 1,000 CRDs in their
//! objectRefs in all, 70 provider Deployments in crossplane-system, 500
//! XRDs of which half have claims, and 2,000 namespaces each accepting the
//! claims of 10 XRDs. BENCH_SCALE=10 gives `xl` (5,000 XRDs, 20,000
//! namespaces); BENCH_CHANGES sets how many changes of each kind are timed
//! (100).

use std::time::{Duration, Instant};

use rbac_rules::engine::{Engine, Memo, ObjectStore, Options};
use serde_json::{Value, json};

/// A size from the environment, or its default.
fn size(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const PROVIDERS: usize = 70;
const FAMILY: usize = 7;
const CRDS: usize = 1000;
const ACCEPTED: usize = 10;

struct Cluster {
    store: ObjectStore,
    rv: u64,
    xrds: usize,
    namespaces: usize,
}

impl Cluster {
    /// Adds or replaces an object with a fresh resourceVersion, as a live
    /// cluster's watch would.
    fn put(&mut self, mut v: Value) {
        self.rv += 1;
        v["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.store.insert(v).expect("insert");
    }
}

fn xrd(i: usize) -> Value {
    let mut v = json!({"apiVersion": "apiextensions.crossplane.io/v1", "kind": "CompositeResourceDefinition",
        "metadata": {"name": format!("xthings{i}.platform.example.org"), "uid": format!("xrd-{i}")},
        "spec": {"group": "platform.example.org", "names": {"kind": format!("XThing{i}"), "plural": format!("xthings{i}")}}});
    if i.is_multiple_of(2) {
        v["spec"]["claimNames"] =
            json!({"kind": format!("Thing{i}"), "plural": format!("things{i}")});
    }
    v
}

/// Revision `p` with `types` of the CRDs (its share of 1,000, plus `extra`).
fn revision(p: usize, extra: usize) -> Value {
    let per = CRDS / PROVIDERS;
    let types = per + usize::from(p < CRDS % PROVIDERS) + extra;
    let refs: Vec<Value> = (0..types)
        .map(|t| {
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                   "name": format!("kind{t}s.svc{p}.aws.example.org")})
        })
        .collect();
    json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
        "metadata": {"name": format!("provider-{p}-abc"), "uid": format!("pr-{p}"),
                     "labels": {"pkg.crossplane.io/provider-family": format!("family-{}", p / FAMILY)}},
        "spec": {"image": format!("xpkg.example.org/org/provider-{p}:v1")},
        "status": {"objectRefs": refs}})
}

/// Namespace `n`, accepting the claims of 10 XRDs (those with claims),
/// shifted by `shift`.
fn namespace(n: usize, xrds: usize, shift: usize) -> Value {
    let claimed = xrds / 2;
    let mut ann = serde_json::Map::new();
    for k in 0..ACCEPTED {
        let x = 2 * ((n + k * 7 + shift) % claimed);
        ann.insert(
            format!("rbac.crossplane.io/xthings{x}.platform.example.org"),
            json!("xrd-claim-accepted"),
        );
    }
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("team-{n}"), "uid": format!("ns-{n}"), "annotations": ann}})
}

fn cluster() -> Cluster {
    let scale = size("BENCH_SCALE", 1);
    let mut c = Cluster {
        store: ObjectStore::new(),
        rv: 0,
        xrds: 500 * scale,
        namespaces: 2000 * scale,
    };
    for i in 0..c.xrds {
        c.put(xrd(i));
    }
    for p in 0..PROVIDERS {
        c.put(revision(p, 0));
        c.put(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": format!("provider-{p}"), "namespace": "crossplane-system",
                         "ownerReferences": [{"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
                                              "name": format!("provider-{p}-abc"), "uid": format!("pr-{p}"), "controller": true}]},
            "spec": {"template": {"spec": {"serviceAccountName": format!("provider-{p}")}}}}));
    }
    for n in 0..c.namespaces {
        let v = namespace(n, c.xrds, 0);
        c.put(v);
    }
    c
}

/// Resident and peak memory of this process (Linux), in MiB.
fn memory() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| format!("{} MiB", kb / 1024))
            .unwrap_or_else(|| "?".into())
    };
    format!("RSS {}, peak {}", field("VmRSS:"), field("VmHWM:"))
}

fn median_and_p99(mut t: Vec<Duration>) -> (Duration, Duration) {
    t.sort();
    let p99 = t[(t.len() * 99 / 100).min(t.len() - 1)];
    (t[t.len() / 2], p99)
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture, preferably --release"]
fn bench_builtin_rules_on_large_cluster() {
    let rules = rbac_rules::rules::builtin().expect("rules");
    let started = Instant::now();
    let mut c = cluster();
    let build = started.elapsed();
    let started = Instant::now();
    let engine = Engine::new(&rules, Options::default());
    let compile = started.elapsed();
    // The memo first, so that the memory figures are its own (evaluations
    // run on a thread of their own; freed memory stays with the process).
    println!("memory with the store: {}", memory());
    let mut memo = Memo::new();
    let warm = engine.evaluate_incremental(&c.store, &mut memo);
    let bytes: usize = warm
        .desired
        .iter()
        .map(|d| d.object.to_string().len())
        .sum();
    println!(
        "memory with a warm memo: {}; desired manifests {} MiB as JSON text",
        memory(),
        bytes >> 20
    );
    drop(warm);
    let mut times = Vec::new();
    let mut outputs = 0;
    for _ in 0..3 {
        let started = Instant::now();
        let eval = engine.evaluate(&c.store);
        times.push(started.elapsed());
        outputs = eval.desired.len();
        assert_eq!(eval.errors().count(), 0);
    }
    times.sort();
    println!(
        "engine bench: {} objects in, {outputs} objects out; build {build:?}, compile {compile:?}, full evaluate min {:?} / median {:?} / max {:?}",
        c.store.len(),
        times[0],
        times[1],
        times[2],
    );

    // Incremental: the warm memo; each change is made to the same store,
    // as the controller's watches do, then evaluated.
    let changes = size("BENCH_CHANGES", 100);
    let mut noop = Vec::new();
    for _ in 0..changes {
        let started = Instant::now();
        engine.evaluate_incremental(&c.store, &mut memo);
        noop.push(started.elapsed());
        assert_eq!(memo.renders(), 0);
    }
    let mut kinds: Vec<(&str, Vec<Duration>, usize)> = Vec::new();
    let mut timed = |name: &'static str, c: &mut Cluster, change: &dyn Fn(&mut Cluster, usize)| {
        let mut t = Vec::new();
        let mut renders = 0;
        for k in 0..changes {
            change(c, k);
            let started = Instant::now();
            engine.evaluate_incremental(&c.store, &mut memo);
            t.push(started.elapsed());
            renders = renders.max(memo.renders());
        }
        kinds.push((name, t, renders));
    };
    timed("namespace annotation", &mut c, &|c, k| {
        let n = (k * 37) % c.namespaces;
        let v = namespace(n, c.xrds, k + 1);
        c.put(v);
    });
    timed("XRD added", &mut c, &|c, k| {
        let i = c.xrds + 1 + 2 * k;
        c.put(xrd(i));
    });
    timed("revision objectRefs", &mut c, &|c, k| {
        c.put(revision(k % PROVIDERS, 1 + k % 3));
    });
    let (m, p) = median_and_p99(noop);
    println!("incremental no change: median {m:?}, p99 {p:?}");
    for (name, t, renders) in kinds {
        let (m, p) = median_and_p99(t);
        println!("incremental {name}: median {m:?}, p99 {p:?}, at most {renders} renders");
    }
}
