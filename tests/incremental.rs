//! Incremental evaluation renders only what a change can affect, and always
//! gives the same result as a full evaluation.

use rbac_rules::engine::{Engine, Evaluation, Memo, ObjectStore, Options};
use serde_json::{Value, json};

mod support;
use support::engine::{deployment, namespace, provider, revision, revision_crds, xrd, xrd_crds};

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
    /// The same objects again, every kind held as trees, when `store`
    /// holds some packed.
    plain: Option<ObjectStore>,
}

impl Cluster {
    fn put(&mut self, mut obj: Value) {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        if let Some(plain) = &mut self.plain {
            plain.insert(obj.clone()).expect("valid object");
        }
        self.store.insert(obj).expect("valid object");
    }

    fn remove(&mut self, api_group: &str, kind: &str, ns: &str, name: &str) {
        let gk = rbac_rules::engine::GroupKind::new(api_group, kind);
        let key = (ns.to_string(), name.to_string());
        if let Some(plain) = &mut self.plain {
            plain.remove(&gk, &key);
        }
        self.store.remove(&gk, &key);
    }

    /// The objects as trees: what full evaluations and the test read.
    fn trees(&self) -> &ObjectStore {
        self.plain.as_ref().unwrap_or(&self.store)
    }
}

const XRDS: usize = 8;
const PROVIDERS: usize = 6;
const NAMESPACES: usize = 12;

fn initial() -> Cluster {
    let mut c = Cluster {
        store: ObjectStore::new(),
        rv: 0,
        plain: None,
    };
    for i in 0..XRDS {
        c.put(xrd(i, i % 2 == 0, false));
        xrd_crds(i, true).into_iter().for_each(|o| c.put(o));
    }
    for p in 0..PROVIDERS {
        c.put(provider(p));
        c.put(revision(p, p % 3, "org", 3));
        revision_crds(p, 3).into_iter().for_each(|o| c.put(o));
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
        c.put(d.object.to_value());
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
        let what = match rng.below(12) {
            11 => {
                // Lineage: a type's CRD comes, goes or changes owner.
                let (mut crds, uids) = if rng.chance(50) {
                    let p = rng.below(PROVIDERS);
                    (revision_crds(p, 4), ["pr-0", "pr-1"])
                } else {
                    let i = rng.below(XRDS);
                    (xrd_crds(i, true), ["xrd-0", "xrd-1"])
                };
                let mut crd = crds.swap_remove(rng.below(crds.len()));
                if rng.chance(30) {
                    let name = crd["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    c.remove(
                        "apiextensions.k8s.io",
                        "CustomResourceDefinition",
                        "",
                        &name,
                    );
                    "CRD deleted"
                } else if rng.chance(30) {
                    let other = uids[rng.below(2)];
                    crd["metadata"]["ownerReferences"][0]["uid"] = json!(other);
                    crd["metadata"]["ownerReferences"][0]["controller"] = json!(rng.chance(50));
                    c.put(crd);
                    "CRD owner changed"
                } else if rng.chance(30) {
                    // Taken over: older than its Provider or XRD.
                    crd["metadata"]["creationTimestamp"] = json!("2025-12-31T23:59:59Z");
                    c.put(crd);
                    "CRD older than its owner"
                } else if rng.chance(20) {
                    // An ancestor changes: the Provider re-created later
                    // (its revisions' CRDs now older), or back.
                    let p = rng.below(PROVIDERS);
                    let mut v = provider(p);
                    if rng.chance(50) {
                        v["metadata"]["creationTimestamp"] = json!("2026-01-01T00:02:00Z");
                    }
                    c.put(v);
                    "Provider re-created"
                } else {
                    c.put(crd);
                    "CRD added"
                }
            }
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
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 1, "only team-0 is rendered again");
    // At most its three Roles change, and they do.
    assert!(
        !e.changed.is_empty() && e.changed.len() <= 3,
        "{:?}",
        e.changed
    );
    assert!(e.changed.iter().all(|(_, ns, _)| ns == "team-0"));
    // Nothing changed since: a version check, nothing to report.
    let again = engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 0);
    assert!(again.changed.is_empty());
    assert_eq!(again.desired, e.desired);

    // A new XRD: its two rules render it once each, and the namespaces that
    // accept it (team-2 and team-7 accept xthings10 below) render again.
    c.put(namespace(2, &[10]));
    c.put(namespace(7, &[10, 3]));
    engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 2, "the two annotated namespaces");
    // Its CRDs first: no trigger names them yet, nothing renders.
    xrd_crds(10, true).into_iter().for_each(|o| c.put(o));
    engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 0, "CRDs of no XRD yet");
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

    // Lineage: a CRD of provider-2 loses its controller reference (an
    // inactive revision's kind of reference): the triggers that found it,
    // provider-2 and its family member provider-5, in both provider rules.
    let mut crd = revision_crds(2, 3).swap_remove(0);
    crd["metadata"]["ownerReferences"][0]["controller"] = json!(false);
    c.put(crd);
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(
        memo.renders(),
        4,
        "provider-2 and provider-5, two rules each"
    );
    assert_eq!(e.desired, engine.evaluate(&c.store).desired);
    // An ancestor: provider-1's Provider made again after its CRDs. Every
    // revision reads the Providers (each member dates its own CRDs by its
    // own Provider): all revisions of both rules, and provider-1's types go.
    let mut p1 = provider(1);
    p1["metadata"]["creationTimestamp"] = json!("2026-01-01T00:02:00Z");
    c.put(p1);
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 2 * PROVIDERS, "every revision, two rules");
    assert_eq!(e.desired, engine.evaluate(&c.store).desired);
    // Its family member provider-4 still lends it its own types.
    let edit = e
        .desired
        .iter()
        .find(|d| d.name == "crossplane:provider:provider-1:aggregate-to-edit")
        .map(|d| d.object.to_value().to_string())
        .unwrap_or_default();
    assert!(
        !edit.contains("p1.example.org") && edit.contains("p4.example.org"),
        "provider-1's CRDs are older than its Provider now: {edit}"
    );

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
fn a_new_engine_of_the_same_rules_takes_the_memo_over() {
    let rules = rbac_rules::rules::builtin().expect("built-in rules");
    let c = initial();
    let mut memo = Memo::new();
    let first = Engine::new(&rules, Options::default()).evaluate_incremental(&c.store, &mut memo);
    assert!(memo.renders() > 40);
    // Same rules, new engine (the controller builds one when any RbacRule
    // changes): nothing of them changed, nothing renders again.
    let again = Engine::new(&rules, Options::default()).evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 0);
    assert_eq!(again.desired, first.desired);
    assert_eq!(again.reports, first.reports);
    // Other options: a memo is not trusted across them; it starts over.
    let other = Options {
        waivers: rbac_rules::engine::Waivers {
            escalation_verbs: true,
            ..Default::default()
        },
        ..Options::default()
    };
    Engine::new(&rules, other).evaluate_incremental(&c.store, &mut memo);
    assert!(memo.renders() > 40, "started over: {}", memo.renders());
}

/// The rules with one output of `rule` given an annotation of value `v`.
fn changed_rules(
    rules: &[rbac_rules::engine::RuleSource],
    rule: &str,
    output: usize,
    v: &str,
) -> Vec<rbac_rules::engine::RuleSource> {
    let mut rules = rules.to_vec();
    let r = rules.iter_mut().find(|r| r.name == rule).expect("the rule");
    r.spec.outputs[output].annotations = Some(json!({"example.org/change": v}));
    rules
}

#[test]
fn a_changed_rule_renders_its_triggers_only() {
    let rules = rbac_rules::rules::builtin().expect("built-in rules");
    let mut c = initial();
    let mut memo = Memo::new();
    let first = Engine::new(&rules, Options::default()).evaluate_incremental(&c.store, &mut memo);
    apply(&mut c, &first);
    Engine::new(&rules, Options::default()).evaluate_incremental(&c.store, &mut memo);

    // A static rule: its one output set, one object changed.
    let changed = changed_rules(&rules, "crossplane-core", 0, "1");
    let engine = Engine::new(&changed, Options::default());
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 1, "crossplane-core's static set");
    assert_eq!(e.changed.len(), 1, "{:?}", e.changed);
    assert_same(1, "static rule changed", &e, &engine.evaluate(&c.store));

    // A rule with a trigger per XRD: every XRD's, nothing else.
    let changed = changed_rules(&changed, "crossplane-composite-system", 0, "2");
    let engine = Engine::new(&changed, Options::default());
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), XRDS, "one per XRD");
    assert!(!e.changed.is_empty() && e.changed.len() <= XRDS);
    assert_same(2, "trigger rule changed", &e, &engine.evaluate(&c.store));

    // Back as they were: the same renders again, and the first result.
    let engine = Engine::new(&rules, Options::default());
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 1 + XRDS);
    assert_same(3, "rules as before", &e, &engine.evaluate(&c.store));

    // A rule gone (or one more): the rules differ, everything again.
    let fewer: Vec<_> = rules
        .iter()
        .filter(|r| r.name != "crossplane-core")
        .cloned()
        .collect();
    let engine = Engine::new(&fewer, Options::default());
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert!(memo.renders() > 40, "started over: {}", memo.renders());
    assert_same(4, "a rule gone", &e, &engine.evaluate(&c.store));
}

#[test]
fn rule_changes_mixed_with_cluster_changes_agree_with_full_evaluations() {
    let rules = rbac_rules::rules::builtin().expect("built-in rules");
    let mut c = initial();
    let mut memo = Memo::new();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut current = rules.clone();
    let names: Vec<String> = rules.iter().map(|r| r.name.clone()).collect();
    for step in 0..24 {
        if rng.chance(50) {
            // One output of one rule annotated anew (or as it was).
            let name = &names[rng.below(names.len())];
            let outputs = current
                .iter()
                .find(|r| &r.name == name)
                .map(|r| r.spec.outputs.len())
                .unwrap_or(0);
            if outputs > 0 {
                current = changed_rules(
                    &current,
                    name,
                    rng.below(outputs),
                    &rng.below(3).to_string(),
                );
            }
        } else if rng.chance(50) {
            let n = rng.below(NAMESPACES);
            c.put(namespace(n, &[rng.below(XRDS), rng.below(XRDS)]));
        } else {
            let p = rng.below(PROVIDERS);
            c.put(revision(p, p % 3, "org", 2 + rng.below(2)));
        }
        let engine = Engine::new(&current, Options::default());
        let inc = engine.evaluate_incremental(&c.store, &mut memo);
        let full = engine.evaluate(&c.store);
        assert_same(step, "rules or cluster changed", &inc, &full);
        if rng.chance(50) {
            apply(&mut c, &inc);
        }
    }
}

#[test]
fn a_one_shot_memo_renders_everything_each_time() {
    let rules = rbac_rules::rules::builtin().expect("built-in rules");
    let mut c = initial();
    let engine = Engine::new(&rules, Options::default());
    let mut memo = Memo::one_shot();
    let first = engine.evaluate_incremental(&c.store, &mut memo);
    let all = memo.renders();
    assert!(all > 0);
    // It kept no read index: after a change, everything again, and the
    // same result as a full evaluation.
    c.put(namespace(0, &[1, 2]));
    let again = engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), all);
    assert_same(1, "one-shot", &again, &engine.evaluate(&c.store));
    assert!(first.desired != again.desired);
}

/// Every rule set the project ships, loaded as the CLI loads a directory:
/// the built-in rules (rules/), and each example (rules/examples/*/), with
/// the objects of its rule tests as the pool random changes draw from.
/// The waivers its tests ask for (some examples bind cluster-admin on purpose).
type RuleSet = (
    String,
    Vec<rbac_rules::engine::RuleSource>,
    Vec<Value>,
    rbac_rules::engine::Waivers,
);

fn rule_sets() -> Vec<RuleSet> {
    use std::path::PathBuf;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules");
    let mut dirs = vec![(root.clone(), root.join("tests"))];
    let mut examples: Vec<PathBuf> = std::fs::read_dir(root.join("examples"))
        .expect("rules/examples")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    examples.sort();
    for e in examples {
        dirs.push((e.clone(), e.join("tests")));
    }
    let mut out = Vec::new();
    for (dir, tests) in dirs {
        let rules: Vec<_> =
            rbac_rules::rules::load_tree_with_origins(std::slice::from_ref(&dir), false)
                .unwrap_or_else(|e| panic!("{}: {e:?}", dir.display()))
                .into_iter()
                .map(|(_, r)| r)
                .collect();
        assert!(!rules.is_empty(), "{}: no rules", dir.display());
        let docs = rbac_rules::yaml::load_tree(&[tests], true).expect("rule tests");
        let mut pool: Vec<Value> = Vec::new();
        let mut waivers = rbac_rules::engine::Waivers::default();
        for d in docs.iter().filter(|d| d.value["kind"] == "RbacRuleTest") {
            if let Some(w) = d.value["spec"].get("waivers") {
                waivers = serde_json::from_value(w.clone()).expect("waivers");
            }
            for o in d.value["spec"]["objects"].as_array().into_iter().flatten() {
                // Inline, or a file beside the test.
                let objects = match o.as_str() {
                    Some(file) => {
                        let path = d.path.parent().expect("test dir").join(file);
                        rbac_rules::yaml::load_paths(&[path])
                            .expect("object file")
                            .into_iter()
                            .map(|d| d.value)
                            .collect()
                    }
                    None => vec![o.clone()],
                };
                for o in objects {
                    if !pool.contains(&o) {
                        pool.push(o);
                    }
                }
            }
        }
        assert!(!pool.is_empty(), "{}: no test objects", dir.display());
        out.push((dir.display().to_string(), rules, pool, waivers));
    }
    out
}

/// Keys of the objects whose desired copy differs between two evaluations.
fn differences(
    before: &Evaluation,
    after: &Evaluation,
) -> Vec<(rbac_rules::api::OutputKind, String, String)> {
    let index = |e: &Evaluation| -> std::collections::BTreeMap<_, _> {
        e.desired
            .iter()
            .map(|d| ((d.kind, d.namespace.clone(), d.name.clone()), d.clone()))
            .collect()
    };
    let (b, a) = (index(before), index(after));
    let mut keys: Vec<_> = b.keys().chain(a.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    keys.into_iter().filter(|k| b.get(k) != a.get(k)).collect()
}

fn gk_of(o: &Value) -> rbac_rules::engine::GroupKind {
    rbac_rules::engine::GroupKind::of(o).expect("apiVersion and kind")
}

fn key_of(o: &Value) -> (String, String) {
    (
        o["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// Label and annotation pairs seen in the pool and in the outputs: what
/// selectors, metadata matches and pauses can key on.
fn metadata_pairs(pool: &[Value], eval: &Evaluation, field: &str) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = Vec::new();
    let outputs: Vec<Value> = eval.desired.iter().map(|d| d.object.to_value()).collect();
    for o in pool.iter().chain(&outputs) {
        for (k, v) in o["metadata"][field].as_object().into_iter().flatten() {
            if !out.iter().any(|(ok, ov)| ok == k && ov == v) {
                out.push((k.clone(), v.clone()));
            }
        }
    }
    out.push(("crossplane.io/paused".into(), json!("true")));
    out
}

/// Every shipped rule set, on its tests' objects changed at random: the
/// incremental evaluation equals a full one. The incremental side reads a
/// store holding the kinds read only as triggers packed, as the
/// controller's does; the full side reads every object as a tree.
#[test]
fn incremental_equals_full_for_every_shipped_rule_set() {
    let mut packed_sets = 0;
    for (set, rules, pool, waivers) in rule_sets() {
        let options = Options {
            waivers,
            ..Options::default()
        };
        let engine = Engine::new(&rules, options);
        let mut store = ObjectStore::new();
        let packed = rbac_rules::engine::shape::packable_kinds(&engine.interests());
        packed_sets += usize::from(!packed.is_empty());
        store.pack_kinds(packed);
        let mut c = Cluster {
            store,
            rv: 0,
            plain: Some(ObjectStore::new()),
        };
        let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ set.len() as u64);
        for o in &pool {
            if rng.chance(70) {
                c.put(o.clone());
            }
        }
        let mut memo = Memo::new();
        let mut previous = engine.evaluate(c.trees());
        let first = engine.evaluate_incremental(&c.store, &mut memo);
        assert_same(0, &format!("{set}: initial"), &first, &previous);
        assert_eq!(
            first.changed,
            differences(&Evaluation::default(), &previous)
        );
        // The run must exercise something: outputs, and changes to them.
        let (mut outputs, mut changed) = (previous.desired.len(), 0);
        for step in 1..=150 {
            let present: Vec<Value> = pool
                .iter()
                .filter_map(|o| c.trees().get(&gk_of(o), &key_of(o)).cloned())
                .collect();
            let pick =
                |rng: &mut Rng, from: &[Value]| from.get(rng.below(from.len().max(1))).cloned();
            let what = match rng.below(10) {
                0 | 1 => {
                    let o = pick(&mut rng, &pool).expect("pool");
                    c.put(o);
                    "object (re)created as in the tests"
                }
                2 => match pick(&mut rng, &present) {
                    Some(o) => {
                        let gk = gk_of(&o);
                        let (ns, name) = key_of(&o);
                        c.remove(&gk.group, &gk.kind, &ns, &name);
                        "object deleted"
                    }
                    None => "nothing to delete",
                },
                3 | 4 => {
                    let field = if rng.chance(50) {
                        "labels"
                    } else {
                        "annotations"
                    };
                    let pairs = metadata_pairs(&pool, &previous, field);
                    match pick(&mut rng, &present) {
                        Some(mut o) => {
                            if rng.chance(30) {
                                o["metadata"][field] = json!({});
                            } else {
                                let (k, v) = pairs[rng.below(pairs.len())].clone();
                                o["metadata"][field][k] = v;
                            }
                            c.put(o);
                            "labels or annotations changed"
                        }
                        None => "nothing to relabel",
                    }
                }
                5 => match (pick(&mut rng, &present), pick(&mut rng, &pool)) {
                    (Some(mut o), Some(owner)) => {
                        if rng.chance(30) {
                            o["metadata"]["ownerReferences"] = json!([]);
                        } else {
                            o["metadata"]["ownerReferences"] = json!([{
                                "apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                                "controller": true}]);
                        }
                        c.put(o);
                        "ownerReferences changed"
                    }
                    _ => "nothing to own",
                },
                6 => {
                    // A hand-made ClusterRole with labels selectors key on.
                    let pairs = metadata_pairs(&pool, &previous, "labels");
                    let mut labels = serde_json::Map::new();
                    for _ in 0..1 + rng.below(3) {
                        let (k, v) = pairs[rng.below(pairs.len())].clone();
                        labels.insert(k, v);
                    }
                    let name = format!("hand-made-{}", rng.below(3));
                    if rng.chance(25) {
                        c.remove("rbac.authorization.k8s.io", "ClusterRole", "", &name);
                        "hand-made role deleted"
                    } else {
                        c.put(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                            "metadata": {"name": name, "labels": labels},
                            "rules": [{"apiGroups": [""], "resources": [format!("things{}", rng.below(3))], "verbs": ["get"]}]}));
                        "hand-made role with selected labels"
                    }
                }
                7 => match (pick(&mut rng, &present), pick(&mut rng, &pool)) {
                    // Another test object's spec and status on this one.
                    (Some(mut o), Some(other)) if gk_of(&o) == gk_of(&other) => {
                        o["spec"] = other["spec"].clone();
                        o["status"] = other["status"].clone();
                        c.put(o);
                        "spec and status swapped"
                    }
                    _ => "nothing to swap",
                },
                8 => {
                    // Drift on a live managed object.
                    let live: Vec<Value> = previous
                        .desired
                        .iter()
                        .filter_map(|d| {
                            let o = d.object.to_value();
                            c.trees().get(&gk_of(&o), &key_of(&o)).cloned()
                        })
                        .collect();
                    match pick(&mut rng, &live) {
                        Some(mut o) if o.get("rules").is_some() => {
                            o["rules"] =
                                json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
                            c.put(o);
                            "live role edited"
                        }
                        Some(mut o) => {
                            o["metadata"]["annotations"] = json!({});
                            c.put(o);
                            "live object's provenance removed"
                        }
                        None => "nothing live",
                    }
                }
                _ => {
                    apply(&mut c, &previous);
                    "outputs applied"
                }
            };
            let inc = engine.evaluate_incremental(&c.store, &mut memo);
            let full = engine.evaluate(c.trees());
            let label = format!("{set}: {what}");
            assert_same(step, &label, &inc, &full);
            assert_eq!(
                inc.changed,
                differences(&previous, &full),
                "step {step} ({label}): changed"
            );
            outputs = outputs.max(full.desired.len());
            changed += inc.changed.len();
            previous = full;
        }
        assert!(
            outputs > 0 && changed > 0,
            "{set}: {outputs} outputs, {changed} changes"
        );
        // Read one at a time: no packed kind was read back whole.
        assert_eq!(
            c.store.trees_read_back(),
            0,
            "{set}: packed kinds read back"
        );
    }
    // The built-in rules read Namespaces and revisions only as triggers.
    assert!(packed_sets > 0);
}

/// OwnerReferences of every object in the store.
fn owner_references(store: &ObjectStore) -> usize {
    store
        .kinds()
        .cloned()
        .collect::<Vec<_>>()
        .iter()
        .flat_map(|gk| store.list(gk))
        .map(|o| {
            o["metadata"]["ownerReferences"]
                .as_array()
                .map_or(0, Vec::len)
        })
        .sum()
}

#[test]
fn what_the_memo_keeps_between_evaluations_is_bounded_by_the_cluster() {
    let rules = rbac_rules::rules::builtin().expect("built-in rules");
    let mut c = initial();
    let mut memo = Memo::new();
    let engine = Engine::new(&rules, Options::default());
    engine.evaluate_incremental(&c.store, &mut memo);
    // The index by owner holds one entry per ownerReference of the kinds
    // read by owner (CRDs, Deployments), never more than the cluster has.
    let kept = memo.owner_index_entries();
    assert!(
        kept > 0 && kept <= owner_references(&c.store),
        "{kept} of {}",
        owner_references(&c.store)
    );
    // Changed and removed CRDs are taken out, not piled up.
    for round in 0..20 {
        let p = round % PROVIDERS;
        let mut crds = revision_crds(p, 3);
        crds[0]["metadata"]["ownerReferences"][0]["uid"] = json!(format!("other-{round}"));
        crds.into_iter().for_each(|o| c.put(o));
        if round % 3 == 0 {
            c.remove(
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
                "",
                &format!("kind1s.p{p}.example.org"),
            );
        }
        let e = engine.evaluate_incremental(&c.store, &mut memo);
        assert_same(round, "CRDs changed", &e, &engine.evaluate(&c.store));
        assert!(memo.owner_index_entries() <= owner_references(&c.store));
    }
    // The rules' texts, compared when a new engine comes: as large as the
    // rules, whatever the cluster.
    let stamp = memo.rule_stamp_bytes();
    let texts: usize = rules
        .iter()
        .map(|r| serde_json::to_string(&r.spec).map_or(0, |t| t.len()))
        .sum();
    assert!(
        stamp >= texts / 2 && stamp <= 2 * texts + 4096,
        "{stamp} for {texts}"
    );
}

#[test]
fn each_kind_of_change_renders_what_it_reaches() {
    let rules = rbac_rules::rules::builtin().expect("built-in rules");
    let mut c = initial();
    let mut memo = Memo::new();
    let engine = Engine::new(&rules, Options::default());
    let first = engine.evaluate_incremental(&c.store, &mut memo);
    apply(&mut c, &first);
    engine.evaluate_incremental(&c.store, &mut memo);
    let full = |c: &Cluster| Engine::new(&rules, Options::default()).evaluate(&c.store);

    // A revision lists one more type, made with it: its family (provider-1
    // and provider-4) in both provider rules; their roles list the type.
    let mut crd = support::engine::crd("kind9s.p1.example.org", "ProviderRevision", "pr-1", true);
    crd["metadata"]["ownerReferences"]
        .as_array_mut()
        .expect("references")
        .push(support::engine::provider_ref(1, false));
    c.put(crd);
    let mut r = revision(1, 1, "org", 3);
    r["status"]["objectRefs"]
        .as_array_mut()
        .expect("refs")
        .push(json!({"apiVersion": "apiextensions.k8s.io/v1",
                     "kind": "CustomResourceDefinition", "name": "kind9s.p1.example.org"}));
    c.put(r);
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 2 * 2, "two family members, two rules");
    assert!(
        !e.changed.is_empty() && e.changed.len() <= 3 * 2,
        "{:?}",
        e.changed
    );
    assert_same(1, "revision objectRefs", &e, &full(&c));

    // A CRD the revision controls, not in its objectRefs: the same.
    let mut crd = support::engine::crd("kind8s.p1.example.org", "ProviderRevision", "pr-1", true);
    crd["metadata"]["ownerReferences"]
        .as_array_mut()
        .expect("references")
        .push(support::engine::provider_ref(1, false));
    c.put(crd);
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 2 * 2, "two family members, two rules");
    assert!(
        !e.changed.is_empty() && e.changed.len() <= 3 * 2,
        "{:?}",
        e.changed
    );
    assert_same(2, "CRD added", &e, &full(&c));

    // A CRD no revision or XRD controls: nothing renders.
    c.put(support::engine::crd(
        "others.example.org",
        "Widget",
        "w-1",
        true,
    ));
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 0, "read by no trigger");
    assert!(e.changed.is_empty());
}

/// A live ClusterRole (no rule manages it) with these labels and rules.
fn live_role(name: &str, labels: Value, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
           "metadata": {"name": name, "labels": labels}, "rules": rules})
}

/// An aggregate's check that it selects no protected ClusterRole by the
/// labels it was installed with follows the changes of its selection's
/// protected members (kept with the selection, not found by visiting
/// every member on each change): a protected role that arrives, gains or
/// loses the label, or goes is refused or released at once, as a full
/// evaluation has it, whatever the other members.
#[test]
fn an_aggregate_follows_the_protected_roles_its_selection_gains_and_loses() {
    let rules = support::engine::rules(
        r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: gatherer}
spec:
  outputs:
  - kind: ClusterRole
    name: gatherer
    aggregationRule:
      clusterRoleSelectors: [{matchLabels: {helm.sh/chart: rbac-rules-0.1.0}}]
"#,
    );
    let engine = Engine::new(&rules, Options::default());
    let mut store = ObjectStore::new();
    let pods = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
    for i in 0..50 {
        store
            .insert(live_role(
                &format!("member-{i}"),
                json!({"helm.sh/chart": "rbac-rules-0.1.0"}),
                pods.clone(),
            ))
            .expect("insert");
    }
    let controller = |labels: Value| {
        live_role(
            "rbac-rules:controller",
            labels,
            json!([{"apiGroups": ["rbac.authorization.k8s.io"],
                    "resources": ["clusterroles"], "verbs": ["escalate", "bind"]}]),
        )
    };
    let installed = json!({"app.kubernetes.io/name": "rbac-rules",
                           "helm.sh/chart": "rbac-rules-0.1.0"});
    let mut memo = Memo::new();
    let refused = |e: &Evaluation| {
        e.errors().any(|e| {
            e.message
                .contains("protected ClusterRole \"rbac-rules:controller\"")
        })
    };
    let steps: Vec<(&str, Option<Value>, bool)> = vec![
        ("without it", None, false),
        (
            "it arrives with its installed label",
            Some(installed.clone()),
            true,
        ),
        (
            "it loses the label",
            Some(json!({"app.kubernetes.io/name": "rbac-rules"})),
            false,
        ),
        ("it gains it again", Some(installed), true),
        ("it goes", None, false),
    ];
    for (step, (what, labels, want)) in steps.into_iter().enumerate() {
        match labels {
            Some(l) => {
                store.insert(controller(l)).expect("insert");
            }
            None if step > 0 => {
                store.remove(
                    &rbac_rules::engine::GroupKind::new("rbac.authorization.k8s.io", "ClusterRole"),
                    &(String::new(), "rbac-rules:controller".to_string()),
                );
            }
            None => {}
        }
        let inc = engine.evaluate_incremental(&store, &mut memo);
        let full = engine.evaluate(&store);
        assert_same(step, what, &inc, &full);
        assert_eq!(refused(&inc), want, "{what}");
        assert_eq!(inc.desired.len(), usize::from(!want), "{what}");
    }
}

#[test]
fn a_rule_change_compiles_only_the_changed_rule() {
    let rules = rbac_rules::rules::builtin().expect("built-in rules");
    let mut c = initial();
    let mut memo = Memo::new();
    let engine = Engine::new(&rules, Options::default());
    assert_eq!(engine.rules_compiled(), rules.len());
    let first = engine.evaluate_incremental(&c.store, &mut memo);
    apply(&mut c, &first);
    engine.evaluate_incremental(&c.store, &mut memo);

    // One rule changed: it alone compiles; the engine holds the templates
    // a fresh one does (none of the old rule's, no other's twice) and
    // evaluates as a fresh one, rendering the changed rule's triggers only.
    let changed = changed_rules(&rules, "crossplane-core", 0, "1");
    let next = Engine::with_previous(&engine, &changed, Options::default());
    assert_eq!(next.rules_compiled(), 1);
    let fresh = Engine::new(&changed, Options::default());
    assert_eq!(next.template_texts(), fresh.template_texts());
    let e = next.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), 1, "crossplane-core's static set");
    assert_eq!(e.changed.len(), 1, "{:?}", e.changed);
    assert_same(1, "reused rules", &e, &fresh.evaluate(&c.store));
    drop(engine);

    // A rule whose templates change: the new text is compiled, the old
    // one is not kept, and its triggers render with the new one.
    let mut templated = changed.clone();
    let r = templated
        .iter_mut()
        .find(|r| r.name == "crossplane-composite-system")
        .expect("the rule");
    r.spec.outputs[0].annotations =
        Some(json!({"example.org/of": "{{shorten trigger.metadata.name 40}}"}));
    let after = Engine::with_previous(&next, &templated, Options::default());
    assert_eq!(after.rules_compiled(), 1);
    let fresh = Engine::new(&templated, Options::default());
    assert_eq!(after.template_texts(), fresh.template_texts());
    assert!(
        after
            .template_texts()
            .iter()
            .any(|t| t.contains("shorten trigger.metadata.name 40"))
    );
    let e = after.evaluate_incremental(&c.store, &mut memo);
    assert_eq!(memo.renders(), XRDS, "one per XRD");
    assert_same(2, "templates changed", &e, &fresh.evaluate(&c.store));

    // Back as they were: the templates of the changed text are gone again.
    let back = Engine::with_previous(&after, &changed, Options::default());
    assert_eq!(back.rules_compiled(), 1);
    assert_eq!(
        back.template_texts(),
        Engine::new(&changed, Options::default()).template_texts()
    );
    assert!(
        !back
            .template_texts()
            .iter()
            .any(|t| t.contains("shorten trigger.metadata.name 40"))
    );

    // The same rules: nothing compiles. Other options: everything does
    // (params and limits change what a rule compiles to).
    let same = Engine::with_previous(&back, &changed, Options::default());
    assert_eq!(same.rules_compiled(), 0);
    let other = Options {
        params: [("crossplaneNamespace".to_string(), "other".to_string())].into(),
        ..Options::default()
    };
    let again = Engine::with_previous(&same, &changed, other.clone());
    assert_eq!(again.rules_compiled(), changed.len());
    assert_eq!(
        again.template_texts(),
        Engine::new(&changed, other).template_texts()
    );

    // A rule moved into a namespace is another rule's source: compiled.
    let mut moved = changed.clone();
    moved[0].namespace = Some("team-a".into());
    let tenant = Engine::with_previous(&same, &moved, Options::default());
    assert_eq!(tenant.rules_compiled(), 1);
}

#[test]
fn rule_changes_through_reused_engines_agree_with_full_evaluations() {
    let rules = rbac_rules::rules::builtin().expect("built-in rules");
    let mut c = initial();
    let mut memo = Memo::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut current = rules.clone();
    let names: Vec<String> = rules.iter().map(|r| r.name.clone()).collect();
    let mut engine = Engine::new(&current, Options::default());
    for step in 0..16 {
        let name = &names[rng.below(names.len())];
        let outputs = current
            .iter()
            .find(|r| &r.name == name)
            .map(|r| r.spec.outputs.len())
            .unwrap_or(0);
        if outputs > 0 {
            current = changed_rules(
                &current,
                name,
                rng.below(outputs),
                &rng.below(3).to_string(),
            );
        }
        if rng.chance(50) {
            let p = rng.below(PROVIDERS);
            c.put(revision(p, p % 3, "org", 2 + rng.below(2)));
        }
        engine = Engine::with_previous(&engine, &current, Options::default());
        assert!(engine.rules_compiled() <= 1, "step {step}");
        let inc = engine.evaluate_incremental(&c.store, &mut memo);
        let fresh = Engine::new(&current, Options::default());
        assert_eq!(
            engine.template_texts(),
            fresh.template_texts(),
            "step {step}"
        );
        assert_same(step, "reused engine", &inc, &fresh.evaluate(&c.store));
        if rng.chance(50) {
            apply(&mut c, &inc);
        }
    }
}

/// Rules making one aggregated ClusterRole per Namespace, each selecting
/// the roles labelled with its namespace's name, and a binding of it.
const PER_TEAM_AGGREGATES: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: teams}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: ClusterRole
    name: "team-{{trigger.metadata.name}}"
    aggregationRule:
      clusterRoleSelectors: [{matchLabels: {example.org/team: "{{trigger.metadata.name}}"}}]
  - kind: ClusterRoleBinding
    name: "team-{{trigger.metadata.name}}"
    roleRef: {kind: ClusterRole, name: "team-{{trigger.metadata.name}}"}
    subjects: [{kind: Group, name: "{{trigger.metadata.name}}"}]
"#;

/// A Namespace of this name.
fn plain_namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

/// The selections one changed ClusterRole is checked against, over
/// `rounds` changes of a role labelled into one team's aggregate (moved
/// from team to team, and changed in place), with `teams` aggregates in
/// all; every evaluation agrees with a full one.
fn selections_visited_per_change(teams: usize, rounds: usize) -> (u64, usize) {
    let rules = support::engine::rules(PER_TEAM_AGGREGATES);
    let engine = Engine::new(&rules, Options::default());
    let mut c = Cluster {
        store: ObjectStore::new(),
        rv: 0,
        plain: None,
    };
    for t in 0..teams {
        c.put(plain_namespace(&format!("t{t}")));
    }
    let wide = json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
    let pods = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
    c.put(live_role(
        "member",
        json!({"example.org/team": "t0"}),
        pods.clone(),
    ));
    let mut memo = Memo::new();
    let first = engine.evaluate_incremental(&c.store, &mut memo);
    assert_same(0, "initial", &first, &engine.evaluate(&c.store));
    let before = memo.selections_visited();
    for round in 1..=rounds {
        let team = format!("t{}", round % 3);
        // Every other round it breaks a default denial: its aggregate's
        // notice and binding follow.
        let grants = if round % 2 == 0 { &wide } else { &pods };
        c.put(live_role(
            "member",
            json!({"example.org/team": team}),
            grants.clone(),
        ));
        let inc = engine.evaluate_incremental(&c.store, &mut memo);
        assert_same(round, "member changed", &inc, &engine.evaluate(&c.store));
        let refused = inc
            .errors()
            .any(|e| e.message.contains("ClusterRole \"member\""));
        assert_eq!(refused, round % 2 == 0, "round {round}: {team}");
    }
    (
        memo.selections_visited() - before,
        memo.selection_index_entries(),
    )
}

/// A changed ClusterRole is checked only against the selections that hold
/// it or can match its labels (the index by what selections select on),
/// not every cached selection: the count is the same with 4 aggregates
/// or 120, and the index holds one filing per selection.
#[test]
fn a_changed_cluster_role_visits_only_the_selections_that_can_hold_it() {
    let rounds = 6;
    let (few, few_index) = selections_visited_per_change(4, rounds);
    let (many, many_index) = selections_visited_per_change(120, rounds);
    // Each change: the selection it leaves and the one it joins, in
    // policy's reader (no rule reads ClusterRoles here).
    assert!(few > 0, "the changes were seen");
    assert_eq!(
        few, many,
        "selections visited grew with unrelated selections"
    );
    assert!(
        many <= 2 * rounds as u64,
        "{many} visits for {rounds} changes"
    );
    assert_eq!(few_index, 4);
    assert_eq!(many_index, 120);
}

/// Under an allow-list, a binding of an aggregate judged again (any
/// ClusterRole changed) visits only the members that can earn a refusal
/// (breaking a default denial, or granting what the allow-list does not
/// cover), kept with the selection, not every member: the count is the
/// same with 5 covered members or 150. The refusal names the uncovered
/// member as a full evaluation does.
#[test]
fn an_allow_list_verdict_visits_only_the_members_outside_it() {
    fn visits(covered: usize) -> u64 {
        let rules = support::engine::rules(PER_TEAM_AGGREGATES);
        let allow: Vec<k8s_openapi::api::rbac::v1::PolicyRule> = serde_json::from_value(
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]),
        )
        .expect("policy rules");
        let options = Options {
            allow: Some(rbac_rules::engine::AllowList {
                rules: allow,
                selectors: Vec::new(),
                custom_groups: false,
            }),
            ..Options::default()
        };
        let engine = Engine::new(&rules, options);
        let mut c = Cluster {
            store: ObjectStore::new(),
            rv: 0,
            plain: None,
        };
        c.put(plain_namespace("a"));
        let pods = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
        let secrets = json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]);
        for i in 0..covered {
            c.put(live_role(
                &format!("covered-{i}"),
                json!({"example.org/team": "a"}),
                pods.clone(),
            ));
        }
        c.put(live_role(
            "uncovered",
            json!({"example.org/team": "a"}),
            secrets,
        ));
        let mut memo = Memo::new();
        let first = engine.evaluate_incremental(&c.store, &mut memo);
        assert_same(0, "initial", &first, &engine.evaluate(&c.store));
        let before = memo.selection_members_visited();
        for round in 1..=4 {
            // A role nobody selects changes: bindings are judged again.
            c.put(live_role(
                "elsewhere",
                json!({"example.org/round": round.to_string()}),
                pods.clone(),
            ));
            let inc = engine.evaluate_incremental(&c.store, &mut memo);
            assert_same(
                round,
                "unrelated role changed",
                &inc,
                &engine.evaluate(&c.store),
            );
            assert!(
                inc.errors()
                    .any(|e| e.message.contains("ClusterRole \"uncovered\"")),
                "round {round}: the binding of team-a is refused for the uncovered member"
            );
            assert!(
                !inc.errors().any(|e| e.message.contains("covered-0")),
                "round {round}: covered members are not named"
            );
        }
        memo.selection_members_visited() - before
    }
    let few = visits(5);
    let many = visits(150);
    assert!(few > 0, "the binding was judged again");
    assert_eq!(few, many, "members visited grew with covered members");
}

/// A binding is judged by what the role it names grants, so a role change
/// judges bindings again; but only those that can name that role: a
/// ClusterRoleBinding a ClusterRole, a RoleBinding a ClusterRole or a Role
/// of its own namespace. A Namespace's claim types changing (its three
/// Roles) judges those three Roles, not every binding of the cluster.
#[test]
fn a_role_change_judges_again_only_the_bindings_that_can_name_it() {
    let mut rules = rbac_rules::rules::builtin().expect("built-in rules");
    rules.extend(support::engine::rules(
        r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: helper-binding}
spec:
  outputs:
  - kind: RoleBinding
    name: use-helper
    namespace: team-0
    roleRef: {kind: Role, name: helper}
    subjects: [{kind: Group, name: helpers}]
"#,
    ));
    let engine = Engine::new(&rules, Options::default());
    let mut c = initial();
    let helper = |ns: &str, rules: Value| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "helper", "namespace": ns}, "rules": rules})
    };
    let pods = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
    let everything = json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
    c.put(helper("team-0", pods.clone()));
    c.put(helper("team-1", pods.clone()));
    let mut memo = Memo::new();
    let first = engine.evaluate_incremental(&c.store, &mut memo);
    assert_same(0, "initial", &first, &engine.evaluate(&c.store));
    apply(&mut c, &first);
    let first = engine.evaluate_incremental(&c.store, &mut memo);
    let bindings = first
        .desired
        .iter()
        .filter(|d| d.object.to_value().get("roleRef").is_some())
        .count();
    assert!(bindings > 3, "{bindings} bindings");
    let binding = |e: &Evaluation| {
        e.desired
            .iter()
            .any(|d| d.object.to_value()["metadata"]["name"] == "use-helper")
    };
    assert!(binding(&first));

    // A Namespace accepts other claim types: its three Roles change, and
    // only they are judged.
    let before = memo.verdicts();
    c.put(namespace(2, &[1, 5, 6]));
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert_same(1, "namespace", &e, &engine.evaluate(&c.store));
    assert_eq!(e.changed.len(), 3, "{:?}", e.changed);
    assert_eq!(memo.verdicts() - before, 3);

    // A Role of another namespace: judged itself (a live object), but no
    // binding here can name it.
    let before = memo.verdicts();
    c.put(helper("team-1", everything.clone()));
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert_same(2, "other namespace's role", &e, &engine.evaluate(&c.store));
    assert_eq!(memo.verdicts() - before, 1);
    assert!(binding(&e));

    // The Role it names now grants everything: it and the binding are
    // judged, and the binding refused.
    let before = memo.verdicts();
    c.put(helper("team-0", everything));
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert_same(3, "named role", &e, &engine.evaluate(&c.store));
    assert_eq!(memo.verdicts() - before, 2);
    assert!(!binding(&e));

    // And given back when it grants what it did.
    c.put(helper("team-0", pods));
    let e = engine.evaluate_incremental(&c.store, &mut memo);
    assert_same(4, "named role again", &e, &engine.evaluate(&c.store));
    assert!(binding(&e));
}

/// Two rules of one name (rule directories can hold them; a cluster
/// cannot): the report under that name is the runnable rule's, whether the
/// evaluation starts afresh or a new engine of the same rules takes the
/// memo over.
#[test]
fn a_memo_taken_over_reports_a_duplicated_rule_as_a_fresh_evaluation_does() {
    let rule = support::engine::rules(
        r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: r}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: Role
    name: x
    rules: [{apiGroups: [""], resources: [pods], verbs: [get]}]
"#,
    )
    .remove(0);
    let copy = rbac_rules::engine::RuleSource {
        name: "r-copy".into(),
        ..rule.clone()
    };
    let rules = vec![rule, copy.clone(), copy];
    let mut c = initial();
    c.put(plain_namespace("a"));
    let options = Options::default();
    let mut memo = Memo::new();
    let first = Engine::new(&rules, options.clone()).evaluate_incremental(&c.store, &mut memo);
    let fresh = Engine::new(&rules, options.clone()).evaluate(&c.store);
    assert_same(0, "first", &first, &fresh);
    let report = |e: &Evaluation| e.reports.get("r-copy").map(|r| r.state);
    assert_eq!(
        report(&fresh),
        Some(rbac_rules::engine::RuleState::Evaluated)
    );
    let again = Engine::new(&rules, options.clone()).evaluate_incremental(&c.store, &mut memo);
    assert_same(1, "taken over", &again, &fresh);
    let reference = rbac_rules::reference::evaluate(&rules, &options, &c.store);
    assert_eq!(again.reports, reference.reports);
}
