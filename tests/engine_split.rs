//! A one-shot evaluation splits a rule's many triggers between two
//! threads: its result must be exactly the sequential (recording)
//! evaluation's — outputs, reports with errors and warnings in trigger
//! order, conflicts and revocations.

use rbac_rules::engine::{Engine, Memo, ObjectStore, Options};
use serde_json::{Value, json};

const XRDS: usize = 8;
const NAMESPACES: usize = 150;

fn xrd(i: usize, claim: bool, paused: bool) -> Value {
    let mut v = json!({"apiVersion": "apiextensions.crossplane.io/v1", "kind": "CompositeResourceDefinition",
        "metadata": {"name": format!("xthings{i}.example.org"), "uid": format!("xrd-{i}")},
        "spec": {"group": "example.org", "names": {"kind": format!("XThing{i}"), "plural": format!("xthings{i}")}}});
    if claim {
        // XRD 3's claim is hostile: its warning comes and goes with it.
        let plural = if i == 3 {
            "*".to_string()
        } else {
            format!("things{i}")
        };
        v["spec"]["claimNames"] = json!({"kind": format!("Thing{i}"), "plural": plural});
    }
    if paused {
        v["metadata"]["annotations"] = json!({"crossplane.io/paused": "true"});
    }
    v
}

fn revision(p: usize, family: usize, org: &str, types: usize) -> Value {
    let mut refs: Vec<Value> = (0..types)
        .map(|t| {
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                         "name": format!("kind{t}s.p{p}.example.org")})
        })
        .collect();
    // Three types come with hostile entries: skipped with warnings, which
    // incremental evaluation must report like a full one.
    if types == 3 {
        for bad in ["*.*", "secrets."] {
            refs.push(json!({"apiVersion": "apiextensions.k8s.io/v1",
                             "kind": "CustomResourceDefinition", "name": bad}));
        }
    }
    json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
        "metadata": {"name": format!("provider-{p}"), "uid": format!("pr-{p}"),
                     "labels": {"pkg.crossplane.io/provider-family": format!("family-{family}")}},
        "spec": {"image": format!("registry.example.org/{org}/provider-{p}:v1")},
        "status": {"objectRefs": refs}})
}

fn deployment(p: usize, sa: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": format!("provider-{p}"), "namespace": "crossplane-system",
                     "ownerReferences": [{"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
                                          "name": format!("provider-{p}"), "uid": format!("pr-{p}"), "controller": true}]},
        "spec": {"template": {"spec": {"serviceAccountName": sa}}}})
}

fn namespace(n: usize, accepted: &[usize]) -> Value {
    let ann: serde_json::Map<String, Value> = accepted
        .iter()
        .map(|i| {
            (
                format!("rbac.crossplane.io/xthings{i}.example.org"),
                json!("xrd-claim-accepted"),
            )
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": format!("team-{n}"), "uid": format!("ns-{n}"), "annotations": ann}})
}

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
