//! A one-shot evaluation splits a rule's many triggers between two
//! threads: its result must be exactly the sequential (recording)
//! evaluation's — outputs, reports with errors and warnings in trigger
//! order, conflicts and revocations.

use rbac_rules::engine::{Engine, Memo, ObjectStore, Options};
use serde_json::{Value, json};

mod support;
use support::engine::{deployment, namespace, revision, xrd};

const XRDS: usize = 8;
const NAMESPACES: usize = 150;

fn store() -> ObjectStore {
    let mut s = ObjectStore::new();
    let mut put = |mut o: Value, rv: usize| {
        o["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.insert(o).expect("valid object");
    };
    let mut rv = 0;
    let mut next = || {
        rv += 1;
        rv
    };
    // Claims on half the XRDs; XRD 3's is hostile (a warning per reader).
    for i in 0..XRDS {
        put(xrd(i, i % 2 == 0 || i == 3, false), next());
    }
    for p in 0..6 {
        put(revision(p, p % 3, "org", 3), next());
        put(deployment(p, &format!("sa-{p}")), next());
    }
    for n in 0..NAMESPACES {
        put(namespace(n, &[n % XRDS, (n + 3) % XRDS]), next());
    }
    s
}

#[test]
fn a_split_one_shot_evaluation_equals_the_sequential_one() {
    let rules = rbac_rules::rules::builtin().expect("built-in rules");
    let engine = Engine::new(&rules, Options::default());
    let store = store();
    let split = engine.evaluate_incremental(&store, &mut Memo::one_shot());
    let sequential = engine.evaluate_incremental(&store, &mut Memo::new());
    // The split path is taken: some rule has well over 64 triggers.
    assert!(
        split
            .reports
            .values()
            .any(|r| r.matched_triggers >= NAMESPACES),
        "no rule matched every namespace"
    );
    assert!(split.warnings().count() > 0, "no warnings to compare");
    assert!(split.desired.len() > NAMESPACES);
    assert!(
        split.desired == sequential.desired,
        "desired objects differ"
    );
    assert_eq!(split.reports, sequential.reports);
    assert_eq!(split.contested, sequential.contested);
    assert_eq!(split.revoked, sequential.revoked);
    // And deterministic from one one-shot run to the next.
    let again = engine.evaluate(&store);
    assert!(again.desired == split.desired);
    assert_eq!(again.reports, split.reports);
}
