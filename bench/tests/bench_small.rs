//! CI check of issue 9's write counts: runs `rbac-rules-bench --scenario
//! small --json` and asserts counts only, never timings.
//!
//! - the initial sync writes each desired object once (`objects_out`);
//! - a resync with nothing changed (watches closed and re-opened, resync
//!   timer) and a restart over the same state write nothing;
//! - a namespace annotation change writes its namespace's three Roles at
//!   most (crossplane-admin, -edit, -view);
//! - no change touches more outputs than it affects: `touched_bound`, from
//!   rules/crossplane-provider.yaml (a revision's three ClusterRoles list
//!   the types of its whole family, so a change of one revision's
//!   objectRefs touches 3 × family size) and per kind below.

use std::process::Command;

use serde_json::Value;

#[test]
fn bench_small_write_counts() {
    let out = Command::new(env!("CARGO_BIN_EXE_rbac-rules-bench"))
        // Fewer timed changes than the default 100: a debug build.
        .args(["--scenario", "small", "--json", "--changes", "15"])
        .output()
        .expect("run rbac-rules-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed:\n{stderr}");
    let r: Value = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
    let n = |k: &str| {
        r[k].as_u64()
            .unwrap_or_else(|| panic!("{k} missing from {r:#}"))
    };
    let objects_out = n("objects_out");
    // small: 50 XRDs × 4 + 7 revisions × 4 + 100 namespaces × 3 + 15 fixed.
    assert_eq!(objects_out, 543, "{r:#}");
    assert_eq!(n("initial_sync_writes"), objects_out, "{r:#}");
    assert_eq!(n("resync_writes"), 0, "{r:#}");
    assert_eq!(n("restart_writes"), 0, "{r:#}");
    let per_ns = n("writes_per_namespace_change");
    assert!((1..=3).contains(&per_ns), "{per_ns} writes: {r:#}");
    // 7 revisions in one family: 3 × 7.
    assert_eq!(n("touched_bound"), 21);
    assert!(
        n("max_objects_touched_per_change") <= n("touched_bound"),
        "{r:#}"
    );
    // Each kind of change touches something, and no more than it affects.
    for (kind, most) in [
        ("namespace_annotation", 3),
        ("xrd_added", 4),
        ("revision_object_refs", 21),
    ] {
        let t = r["max_objects_touched"][kind].as_u64();
        assert!(
            t.is_some_and(|t| (1..=most).contains(&t)),
            "{kind}: {t:?} in {r:#}"
        );
    }
    // Namespaces and revisions held packed, as the controller holds them,
    // and read one at a time through every kind of change.
    assert!(
        r["incremental_packed_kinds"]
            .as_array()
            .is_some_and(|k| k.contains(&serde_json::json!("Namespace"))),
        "{r:#}"
    );
    assert!(n("incremental_packed_bytes") > 0, "{r:#}");
    assert_eq!(n("incremental_trees_read_back"), 0, "{r:#}");
    assert_eq!(r["api_requests"]["unserved"], 0, "{r:#}");
    assert_eq!(r["api_requests"]["deletes"], serde_json::json!({}), "{r:#}");
}
