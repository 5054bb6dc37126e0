//! Engine benchmark: prints figures, asserts nothing about time.
//!
//! cargo test --release -p rbac-rules-bench --test bench_engine -- --ignored --nocapture
//!
//! In one process, without the child processes and the controller of
//! `rbac-rules-bench`: the synthetic control plane of its `large` scenario
//! (src/synth.rs; BENCH_SCENARIO=xl for `xl`), full evaluations, and
//! incremental evaluation after each of BENCH_CHANGES (100) changes of
//! every kind.

use std::time::{Duration, Instant};

use rbac_rules::engine::{Engine, Memo, ObjectStore, Options};
use rbac_rules_bench::synth::{ChangeKind, Names, Plane, Scenario, Versions};

/// A size from the environment, or its default.
fn size(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The scenario's control plane, and the store of its objects.
fn cluster(versions: &mut Versions) -> (Plane<'static>, ObjectStore) {
    let scenario = match std::env::var("BENCH_SCENARIO").as_deref() {
        Ok("xl") => Scenario::Xl,
        Ok("small") => Scenario::Small,
        _ => Scenario::Large,
    };
    let plane = Plane {
        names: Names::builtin().expect("bench/control-plane.yaml"),
        sizes: scenario.sizes(),
    };
    let mut store = ObjectStore::new();
    for o in plane.objects(versions) {
        store.insert(o).expect("insert");
    }
    (plane, store)
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
    let mut versions = Versions::default();
    let (plane, mut store) = cluster(&mut versions);
    let build = started.elapsed();
    let started = Instant::now();
    let engine = Engine::new(&rules, Options::default());
    let compile = started.elapsed();
    // The memo first, so that the memory figures are its own (evaluations
    // run on a thread of their own; freed memory stays with the process).
    println!("memory with the store: {}", memory());
    let mut memo = Memo::new();
    let warm = engine.evaluate_incremental(&store, &mut memo);
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
        let eval = engine.evaluate(&store);
        times.push(started.elapsed());
        outputs = eval.desired.len();
        assert_eq!(eval.errors().count(), 0);
    }
    times.sort();
    println!(
        "engine bench: {} objects in, {outputs} objects out; build {build:?}, compile {compile:?}, full evaluate min {:?} / median {:?} / max {:?}",
        store.len(),
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
        engine.evaluate_incremental(&store, &mut memo);
        noop.push(started.elapsed());
        assert_eq!(memo.renders(), 0);
    }
    let (m, p) = median_and_p99(noop);
    println!("incremental no change: median {m:?}, p99 {p:?}");
    for kind in ChangeKind::ALL {
        if kind == ChangeKind::RuleChanged {
            // It builds the engine again: `rbac-rules-bench` times it.
            continue;
        }
        let mut t = Vec::new();
        let mut renders = 0;
        for k in 0..changes {
            for o in plane.change(kind, k, &mut versions) {
                store.insert(o).expect("insert");
            }
            let started = Instant::now();
            engine.evaluate_incremental(&store, &mut memo);
            t.push(started.elapsed());
            renders = renders.max(memo.renders());
        }
        let (m, p) = median_and_p99(t);
        println!(
            "incremental {}: median {m:?}, p99 {p:?}, at most {renders} renders",
            kind.key()
        );
    }
}
