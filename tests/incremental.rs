//! Incremental evaluation renders only what a change can affect, and always
//! gives the same result as a full evaluation.

use rbac_rules::engine::{Engine, Evaluation, Memo, ObjectStore, Options};
use serde_json::{Value, json};

/// A small deterministic generator (xorshift), so failures replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

struct Cluster {
    store: ObjectStore,
    rv: u64,
}

impl Cluster {
    fn put(&mut self, mut obj: Value) {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.store.insert(obj).expect("valid object");
    }

    fn remove(&mut self, api_group: &str, kind: &str, ns: &str, name: &str) {
        let gk = rbac_rules::engine::GroupKind::new(api_group, kind);
        self.store.remove(&gk, &(ns.to_string(), name.to_string()));
    }
}

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

const XRDS: usize = 8;
const PROVIDERS: usize = 6;
const NAMESPACES: usize = 12;

fn initial() -> Cluster {
    let mut c = Cluster {
        store: ObjectStore::new(),
        rv: 0,
    };
    for i in 0..XRDS {
        c.put(xrd(i, i % 2 == 0, false));
    }
    for p in 0..PROVIDERS {
        c.put(revision(p, p % 3, "org", 3));
        c.put(deployment(p, &format!("sa-{p}")));
    }
    for n in 0..NAMESPACES {
        c.put(namespace(n, &[n % XRDS, (n + 3) % XRDS]));
    }
    c
}

fn assert_same(step: usize, what: &str, inc: &Evaluation, full: &Evaluation) {
    if inc.desired != full.desired {
        let first = inc
            .desired
            .iter()
            .zip(&full.desired)
            .find(|(a, b)| a != b)
            .map(|(a, b)| format!("incremental: {}\nfull:        {}", a.object, b.object))
            .unwrap_or_else(|| {
                format!(
                    "{} objects against {}",
                    inc.desired.len(),
                    full.desired.len()
                )
            });
        panic!("step {step} ({what}): desired objects differ; first difference:\n{first}");
    }
    assert_eq!(
        inc.reports, full.reports,
        "step {step} ({what}): reports differ"
    );
    assert_eq!(
        inc.contested, full.contested,
        "step {step} ({what}): contested objects differ"
    );
    assert_eq!(
        inc.revoked, full.revoked,
        "step {step} ({what}): revoked objects differ"
    );
}

/// Writes the desired objects into the cluster, as the controller would,
/// so that live managed objects take part (the engine hides superseded ones).
fn apply(c: &mut Cluster, eval: &Evaluation) {
    for d in &eval.desired {
        c.put((*d.object).clone());
    }
}

#[test]
fn incremental_equals_full_on_random_changes() {
    let rules = rbac_rules::rules::builtin().expect("built-in rules");
    let engine = Engine::new(&rules, Options::default());
    let mut c = initial();
    let mut memo = Memo::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let first = engine.evaluate_incremental(&c.store, &mut memo);
    assert_same(0, "initial", &first, &engine.evaluate(&c.store));
    // Hostile objectRefs: warnings take part in the comparison.
    assert!(first.warnings().count() > 0);
    apply(&mut c, &first);

    for step in 1..=300 {
        let what = match rng.below(11) {
            0 => {
                let n = rng.below(NAMESPACES);
                let accepted: Vec<usize> = (0..rng.below(4)).map(|_| rng.below(XRDS + 2)).collect();
                c.put(namespace(n, &accepted));
                "namespace annotations"
            }
            1 => {
                let i = rng.below(XRDS);
                if rng.chance(30) {
                    c.remove(
                        "apiextensions.crossplane.io",
                        "CompositeResourceDefinition",
                        "",
                        &format!("xthings{i}.example.org"),
                    );
                    "XRD deleted"
                } else if rng.chance(10) {
                    // Hostile data: refused, never a wildcard grant.
                    let mut v = xrd(i, rng.chance(50), false);
                    v["spec"]["group"] = json!("*");
                    c.put(v);
                    "XRD turned hostile"
                } else {
                    c.put(xrd(i, rng.chance(50), rng.chance(15)));
                    "XRD changed"
                }
            }
            2 => {
                let p = rng.below(PROVIDERS);
                let org = if rng.chance(20) { "other" } else { "org" };
                c.put(revision(p, rng.below(3), org, rng.below(4)));
                "revision changed"
            }
            3 => {
                let p = rng.below(PROVIDERS);
                if rng.chance(40) {
                    c.remove(
                        "apps",
                        "Deployment",
                        "crossplane-system",
                        &format!("provider-{p}"),
                    );
                    "deployment deleted"
                } else {
                    c.put(deployment(p, &format!("sa-{}", rng.below(3))));
                    "deployment changed"
                }
            }
            4 => {
                // Drift: someone edits a generated role.
                let roles: Vec<Value> = c
                    .store
                    .list(&rbac_rules::engine::GroupKind::new(
                        "rbac.authorization.k8s.io",
                        "ClusterRole",
                    ))
                    .cloned()
                    .collect();
                if let Some(mut r) = roles.get(rng.below(roles.len().max(1))).cloned() {
                    r["rules"] = json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
                    c.put(r);
                }
                "live role edited"
            }
            5 => {
                // A hand-made role that namespace roles copy by label.
                if rng.chance(50) {
                    c.put(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                        "metadata": {"name": "extra-ns-edit", "labels": {"rbac.crossplane.io/aggregate-to-ns-edit": "true", "rbac.crossplane.io/base-of-ns-edit": "true"}},
                        "rules": [{"apiGroups": [""], "resources": [format!("configmaps{}", rng.below(3))], "verbs": ["get"]}]}));
                    "hand-made base role"
                } else {
                    c.remove(
                        "rbac.authorization.k8s.io",
                        "ClusterRole",
                        "",
                        "extra-ns-edit",
                    );
                    "hand-made base role deleted"
                }
            }
            6 => {
                // Someone else's role squatting on a generated name.
                let i = rng.below(XRDS);
                c.put(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": {"name": format!("crossplane:composite:xthings{i}.example.org:aggregate-to-edit")},
                    "rules": [{"apiGroups": ["example.org"], "resources": ["squat"], "verbs": ["get"]}]}));
                "unmanaged role on a generated name"
            }
            7 => {
                let n = rng.below(NAMESPACES);
                let mut ns = namespace(n, &[rng.below(XRDS)]);
                if rng.chance(50) {
                    ns["metadata"]["annotations"]["crossplane.io/paused"] = json!("true");
                } else {
                    ns["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                }
                c.put(ns);
                "namespace paused or deleting"
            }
            8 => {
                c.remove(
                    "",
                    "Namespace",
                    "",
                    &format!("team-{}", rng.below(NAMESPACES)),
                );
                "namespace deleted"
            }
            _ => {
                // The controller applied the last evaluation's objects.
                let e = engine.evaluate(&c.store);
                apply(&mut c, &e);
                "outputs applied"
            }
        };
        let inc = engine.evaluate_incremental(&c.store, &mut memo);
        let full = engine.evaluate(&c.store);
        assert_same(step, what, &inc, &full);
    }
}

#[test]
fn a_change_re_renders_only_what_depends_on_it() {
    let rules = rbac_rules::rules::builtin().expect("built-in rules");
    let engine = Engine::new(&rules, Options::default());
    let mut c = initial();
    let mut memo = Memo::new();
    let first = engine.evaluate_incremental(&c.store, &mut memo);
    let all = memo.renders();
    // 7 static sets... every trigger of every rule: far more than below.
    assert!(all > 40, "first evaluation renders everything: {all}");
    apply(&mut c, &first);
    engine.evaluate_incremental(&c.store, &mut memo);

    // Nothing changed: nothing rendered.
    engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 0, "a no-op evaluation renders nothing");

    // One namespace's annotations: that namespace's Roles only.
    c.put(namespace(0, &[1, 2]));
    engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 1, "only team-0 is rendered again");

    // A new XRD: its two rules render it once each, and the namespaces that
    // accept it (team-2 and team-7 accept xthings10 below) render again.
    c.put(namespace(2, &[10]));
    c.put(namespace(7, &[10, 3]));
    engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 2, "the two annotated namespaces");
    c.put(xrd(10, true, false));
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(
        memo.renders(),
        2 + 2,
        "the XRD in two rules, then team-2 and team-7"
    );
    assert_eq!(e.desired, engine.evaluate(&c.store).desired);

    // A Deployment of one provider: that provider's system rule only.
    c.put(deployment(1, "renamed"));
    engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 1, "provider-1's binding only");

    // A live ClusterRole that namespace Roles copy from (drift on a
    // generated role): the namespaces copying it, not the others.
    let name = "crossplane:composite:xthings1.example.org:aggregate-to-edit";
    let gk = rbac_rules::engine::GroupKind::new("rbac.authorization.k8s.io", "ClusterRole");
    let mut live = c
        .store
        .get(&gk, &(String::new(), name.to_string()))
        .cloned()
        .expect("applied role");
    live["rules"] = json!([]);
    c.put(live);
    engine.evaluate_incremental(&c.store, &mut memo);
    // Hidden (superseded by this evaluation's own output), so copiers are
    // re-rendered conservatively but the result cannot change.
    assert!(
        memo.renders() <= NAMESPACES,
        "at most the namespaces: {}",
        memo.renders()
    );
}

#[test]
fn a_new_engine_starts_over() {
    let rules = rbac_rules::rules::builtin().expect("built-in rules");
    let c = initial();
    let mut memo = Memo::new();
    Engine::new(&rules, Options::default()).evaluate_incremental(&c.store, &mut memo);
    let all = memo.renders();
    // Same rules, new engine (as after a rule change): a memo is never
    // trusted across engines.
    Engine::new(&rules, Options::default()).evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), all);
}
