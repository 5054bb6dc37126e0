//! The quick screen of the cache keys, the memo and its read index for
//! mutation testing (CONTRIBUTING.md, "Mutation testing of the cache
//! keys"): the incremental engine, one memo carried across a sequence of
//! changes, must compute what the reference computes — over a fixed
//! selection of `tests/differential.rs`'s generated shapes (taken from
//! that file as a module, so the shapes are the same) with a fixed seed,
//! and over sequences written for what a key could leave out (rules of
//! different triggers, a loop over no cached var, a selection that gains
//! and loses a role). In well under a minute on a debug build, where
//! `differential` and `incremental` take minutes: a mutant it misses is
//! run again with those before it is called missed.
//!
//! No test harness (`harness = false` in Cargo.toml): the `#[test]`s of
//! `differential.rs` would run a second time in this binary. `main` runs
//! each check (or those whose names contain an argument) and fails if one
//! fails.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::Instant;

use rbac_rules::engine::{Engine, GroupKind, Memo, ObjectStore, Options, RuleSource};
use serde_json::{Value, json};

#[path = "differential.rs"]
#[allow(dead_code, unused_imports)]
mod differential;

use differential::screen;

/// The checks, by name.
const CHECKS: &[(&str, fn())] = &[
    ("nested_loop_shapes", nested_loop_shapes),
    ("loop_copy_and_aggregation_shapes", loop_shapes),
    ("generated_shapes", generated_shapes),
    ("builtin_rules", builtin_rules),
    (
        "rules_of_one_trigger_share_only_what_they_define_alike",
        rules_of_one_trigger_share_only_what_they_define_alike,
    ),
    (
        "rules_of_one_trigger_share_no_list_they_define_apart",
        rules_of_one_trigger_share_no_list_they_define_apart,
    ),
    (
        "rules_of_different_triggers_share_no_derived_list",
        rules_of_different_triggers_share_no_derived_list,
    ),
    (
        "a_nested_list_is_keyed_by_a_loop_over_no_cached_var",
        a_nested_list_is_keyed_by_a_loop_over_no_cached_var,
    ),
    (
        "an_aggregate_is_judged_again_when_its_selection_gains_or_loses_a_role",
        an_aggregate_is_judged_again_when_its_selection_gains_or_loses_a_role,
    ),
];

/// The seed of the generated change sequences: the screen must catch
/// the same mutants on every run.
const SEED: &str = "4242";

fn main() {
    // SAFETY: set before any other thread starts (proptest reads it when
    // each runner is configured).
    unsafe { std::env::set_var("PROPTEST_RNG_SEED", SEED) };
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let started = Instant::now();
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, check) in CHECKS {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        ran += 1;
        let t = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(check));
        let verdict = if outcome.is_ok() { "ok" } else { "FAILED" };
        println!("check {name} ... {verdict} ({:.1?})", t.elapsed());
        if outcome.is_err() {
            failed.push(*name);
        }
    }
    println!(
        "cache_keys: {ran} checks, {} failed, in {:.1?}",
        failed.len(),
        started.elapsed()
    );
    if !failed.is_empty() {
        println!("failed: {failed:?}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------------
// Generated shapes (tests/differential.rs), fewer of them.
// ---------------------------------------------------------------------

/// The nested loop shapes (`generated_rules`' `gen-nested`): every value
/// of each choice (the output loop, the var, the groups, the innermost
/// list), each beside several of the others.
fn nested_loop_shapes() {
    for i in 0..12u8 {
        let c = [
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            i % 3,
            (i / 3) % 4,
            (i + i / 4) % 3,
            (i / 2) % 3,
        ];
        let rules: Vec<RuleSource> = screen::generated_rules(&c)
            .into_iter()
            .filter(|r| r.name == "gen-nested")
            .collect();
        screen::sequences(
            &format!("nested {c:?}"),
            rules,
            &[screen::generated_objects()],
            1,
        );
    }
    let (steps, desired, _) = screen::compared();
    assert!(
        steps > 12 && desired > 0,
        "{steps} steps, {desired} desired"
    );
}

/// The loop, copy and aggregation shapes (`loop_rules`): every value of
/// every choice met.
fn loop_shapes() {
    let runs = 12u8;
    let mut met = vec![std::collections::BTreeSet::new(); screen::LOOP_CHOICES.len()];
    for i in 0..runs {
        let c: Vec<u8> = vec![
            i % 3,
            (i * 5 + 1) % 4,
            (i / 2 + i / 5) % 3,
            (i / 4 + i) % 3,
            (i / 3) % 3,
            (i / 2) % 2,
            u8::from(i % 5 == 0),
            (i / 2 + i) % 4,
            (i / 7) % 2,
            u8::from(i % 4 == 3),
        ];
        for (m, v) in met.iter_mut().zip(&c) {
            m.insert(*v);
        }
        let mut rules = screen::loop_rules(&c);
        rules.extend(
            screen::generated_rules(&[2, 0, 0, 0, 0, 0, 0])
                .into_iter()
                .filter(|r| r.name == "gen-static"),
        );
        screen::sequences(
            &format!("loops {c:?}"),
            rules,
            &[screen::generated_objects()],
            1,
        );
    }
    for (m, k) in met.iter().zip(screen::LOOP_CHOICES) {
        assert_eq!(m.len(), k as usize, "every value of every choice met");
    }
    let (_, desired, _) = screen::compared();
    assert!(desired > 0);
}

/// The generated rules (`generated_rules`) with the built-in namespace
/// rules, for a few choices.
fn generated_shapes() {
    for c in [
        [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 3, 2, 2, 1, 0, 4, 1, 3, 1, 2],
        [3, 2, 1, 1, 3, 2, 5, 2, 2, 2, 1],
    ] {
        let mut rules = screen::generated_rules(&c);
        rules.extend(
            rbac_rules::rules::builtin()
                .expect("built-in rules")
                .into_iter()
                .filter(|r| r.name.contains("namespace")),
        );
        screen::sequences(
            &format!("generated {c:?}"),
            rules,
            &[screen::generated_objects()],
            2,
        );
    }
    let (_, desired, errors) = screen::compared();
    assert!(
        desired > 0 && errors > 0,
        "{desired} desired, {errors} errors"
    );
}

/// The built-in rules over the Crossplane example cluster.
fn builtin_rules() {
    let builtin = rbac_rules::rules::builtin().expect("built-in rules");
    let crossplane: Vec<Vec<Value>> = screen::seed_clusters()
        .into_iter()
        .filter(|s| s.iter().any(|o| o["kind"] == "CompositeResourceDefinition"))
        .take(2)
        .collect();
    assert!(!crossplane.is_empty());
    screen::sequences("built-in", builtin, &crossplane, 2);
    let (_, desired, _) = screen::compared();
    assert!(desired > 0);
}

// ---------------------------------------------------------------------
// Sequences written for what a key could leave out.
// ---------------------------------------------------------------------

/// Rules from YAML text.
fn rules(yaml: &str) -> Vec<RuleSource> {
    rbac_rules::rules::parse_text(Path::new("cache_keys.yaml"), yaml).expect("rules parse")
}

/// A cluster changed step by step, each write with a new
/// resourceVersion, as the API server writes.
struct Cluster {
    store: ObjectStore,
    version: u64,
}

impl Cluster {
    fn new(objects: &[Value]) -> Cluster {
        let mut c = Cluster {
            store: ObjectStore::new(),
            version: 0,
        };
        objects.iter().for_each(|o| c.put(o.clone()));
        c
    }

    fn put(&mut self, mut o: Value) {
        self.version += 1;
        o["metadata"]["resourceVersion"] = json!(self.version.to_string());
        self.store.insert(o).expect("a valid object");
    }

    fn delete(&mut self, o: &Value) {
        let gk = GroupKind::of(o).expect("a kind");
        let key = rbac_rules::engine::store::key_of(o).expect("a key");
        self.store.remove(&gk, &key);
    }
}

/// A change to the cluster, named.
type Step<'a> = (&'a str, Box<dyn Fn(&mut Cluster)>);

/// Runs `steps` (each a change to the cluster, named) on `objects`: after
/// the start and after each, the engine evaluating incrementally with
/// one memo computes what the reference computes. Returns each step's
/// desired objects (kind, namespace, name and the object's JSON), for
/// the checks to assert that the steps reached what they are about.
fn agree(
    what: &str,
    rules: &[RuleSource],
    objects: &[Value],
    steps: Vec<Step<'_>>,
) -> Vec<Vec<String>> {
    let options = Options::default();
    let engine = Engine::new(rules, options.clone());
    let mut memo = Memo::new();
    let mut cluster = Cluster::new(objects);
    let mut seen = Vec::new();
    let start: Step<'_> = ("at first", Box::new(|_| {}));
    for (step, change) in std::iter::once(start).chain(steps) {
        change(&mut cluster);
        let got = engine.evaluate_incremental(&cluster.store, &mut memo);
        let want = rbac_rules::reference::evaluate(rules, &options, &cluster.store);
        if let Some(d) = screen::difference(&got, &want) {
            panic!("{what}: {step}: {d}");
        }
        seen.push(
            got.desired
                .iter()
                .map(|d| {
                    format!(
                        "{} {}/{} {}",
                        d.kind,
                        d.namespace,
                        d.name,
                        d.object.to_value()
                    )
                })
                .collect(),
        );
    }
    seen
}

/// A ServiceAccount with these secrets.
fn account(ns: &str, name: &str, secrets: &[&str]) -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount",
           "metadata": {"name": name, "namespace": ns, "uid": format!("u-{ns}-{name}")},
           "secrets": secrets.iter().map(|s| json!({"name": s})).collect::<Vec<_>>()})
}

fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "uid": format!("u-{name}"), "labels": labels}})
}

/// Two rules of one trigger whose first related set is alike and whose
/// second (a listField over it) and var differ: each keeps its own lists
/// and vars (as `tests/differential.rs`'s test of the same name; kills
/// `Derivation::of::text -> String::new()`).
fn rules_of_one_trigger_share_only_what_they_define_alike() {
    let yaml = differential::sharing_rules_yaml();
    screen::sequences("sharing", rules(&yaml), &[screen::generated_objects()], 8);
    let (_, desired, _) = screen::compared();
    assert!(desired > 0);
}

/// Two rules of one trigger whose first related sets differ (listFields
/// of the trigger's metadata, one keeping its name, the other its uid)
/// and whose second are alike: they share nothing, since a cached list is
/// keyed by its related set's index and its sources (the trigger), not by
/// what the set keeps of them. Kills `Derivation::common`'s leading
/// count with `==` -> `!=` (rules whose first sets differ share as many
/// sets as lead apart).
fn rules_of_one_trigger_share_no_list_they_define_apart() {
    let rule = |name: &str, field: &str| {
        format!(
            r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: {name}}}
spec:
  trigger: {{kind: Namespace}}
  related:
  - name: picked
    listField: {{path: metadata, of: [trigger], fields: [{field}]}}
  - name: sas
    objects: {{kind: ServiceAccount, metadataOnly: true}}
  outputs:
  - kind: Role
    name: {name}
    rules:
    - apiGroups: [""]
      resources: [serviceaccounts]
      resourceNames:
      - forEach: related.picked
        as: x
        item: "{{{{default x.name x.uid}}}}"
      - forEach: related.sas
        as: s
        item: "{{{{s.metadata.name}}}}"
      verbs: [get]
"#
        )
    };
    let yaml = format!("{}---{}", rule("by-name", "name"), rule("by-uid", "uid"));
    let objects = [
        namespace("team-a", json!({})),
        account("team-a", "worker", &[]),
    ];
    let seen = agree(
        "rules of one trigger that define their lists apart",
        &rules(&yaml),
        &objects,
        vec![
            (
                "a namespace more",
                Box::new(|c: &mut Cluster| c.put(namespace("team-b", json!({})))),
            ),
            (
                "an account more",
                Box::new(|c: &mut Cluster| c.put(account("team-b", "builder", &[]))),
            ),
        ],
    );
    let last = seen.last().expect("steps");
    let role = |name: &str| {
        last.iter()
            .find(|d| d.starts_with(&format!("Role team-b/{name} ")))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        resource_names(&role("by-uid")),
        ["u-team-b", "worker", "builder"]
    );
    assert_eq!(
        resource_names(&role("by-name")),
        ["team-b", "worker", "builder"]
    );
}

/// The resourceNames of the first rule of a role as [`agree`] shows it.
fn resource_names(shown: &str) -> Vec<String> {
    let json = shown.find('{').map_or("null", |at| &shown[at..]);
    let role: Value = serde_json::from_str(json).unwrap_or_default();
    role["rules"][0]["resourceNames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect()
}

/// Two rules whose related sets are written alike but whose triggers
/// differ (one sees its ServiceAccount whole, the other only its
/// metadata): a listField of the trigger's `secrets` is the secrets for
/// one and nothing for the other, though both read the same object (a
/// list is keyed by its sources' addresses). Rules share derived values
/// only when their triggers are alike (`Derivation::common`): one that
/// took the other's list would name secrets its trigger does not show,
/// or lose those it does. Kills `Derivation::common`'s trigger
/// comparison `==` -> `!=` (rules of different triggers share).
fn rules_of_different_triggers_share_no_derived_list() {
    let rule = |name: &str, trigger: &str| {
        format!(
            r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: {name}}}
spec:
  trigger: {trigger}
  related:
  - name: tokens
    listField: {{path: secrets, of: [trigger], fields: [name]}}
  outputs:
  - kind: Role
    name: "{name}-{{{{trigger.metadata.name}}}}"
    rules:
    - apiGroups: [""]
      resources: [secrets]
      resourceNames:
      - none
      - forEach: related.tokens
        as: t
        item: "{{{{t.name}}}}"
      verbs: [get]
"#
        )
    };
    let yaml = format!(
        "{}---{}---{}",
        rule("whole", "{kind: ServiceAccount}"),
        rule(
            "seen-metadata",
            "{kind: ServiceAccount, metadataOnly: true}"
        ),
        rule("whole-again", "{kind: ServiceAccount}"),
    );
    let objects = [
        namespace("team-a", json!({})),
        account("team-a", "worker", &["tok-1"]),
        account("team-a", "builder", &["tok-2", "tok-3"]),
    ];
    let seen = agree(
        "rules of different triggers",
        &rules(&yaml),
        &objects,
        vec![
            (
                "a secret more",
                Box::new(|c: &mut Cluster| c.put(account("team-a", "worker", &["tok-1", "tok-4"]))),
            ),
            (
                "an account more",
                Box::new(|c: &mut Cluster| c.put(account("team-a", "deployer", &["tok-5"]))),
            ),
            (
                "an account goes",
                Box::new(|c: &mut Cluster| c.delete(&account("team-a", "builder", &[]))),
            ),
        ],
    );
    // What the steps are about: the whole account's secrets named, the
    // metadata's not.
    let last = seen.last().expect("steps");
    let role = |name: &str| {
        last.iter()
            .find(|d| d.starts_with(&format!("Role team-a/{name} ")))
            .cloned()
            .unwrap_or_default()
    };
    assert!(role("whole-worker").contains("tok-4"), "{last:#?}");
    assert!(role("whole-again-deployer").contains("tok-5"), "{last:#?}");
    assert!(!role("seen-metadata-worker").contains("tok-"), "{last:#?}");
}

/// A nested list (`resourceNames` built by a `forEach` over a cached var)
/// inside an output loop over a list that is no var (so its items have no
/// ids): the list reads the loop's variable, so it cannot be cached by
/// the var alone. Each role of the loop names its own item. Kills a
/// `loop_ids` that skips a loop over no cached var (leaves it out of the
/// key instead of giving no key).
fn a_nested_list_is_keyed_by_a_loop_over_no_cached_var() {
    let yaml = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: colours}
spec:
  trigger: {kind: Namespace}
  related:
  - name: nss
    objects: {kind: Namespace, metadataOnly: true}
  - name: nsnames
    listField: {path: metadata, of: [nss], fields: [name]}
  vars:
  - name: names
    value: 'sort (pluck related.nsnames "name")'
  outputs:
  - kind: ClusterRole
    forEach: 'list "red" "blue" trigger.metadata.name'
    as: o
    name: "colour-{{trigger.metadata.name}}-{{o}}"
    rules:
    - apiGroups: [""]
      resources: [configmaps]
      resourceNames:
      - forEach: vars.names
        as: r
        item: "{{o}}.{{r}}"
      verbs: [get]
  - kind: ClusterRole
    forEach: related.nss
    as: ns
    name: "each-{{trigger.metadata.name}}-{{ns.metadata.name}}"
    rules:
    - apiGroups: [""]
      resources: [secrets]
      resourceNames:
      - forEach: vars.names
        as: r
        item: "{{ns.metadata.name}}.{{r}}"
      verbs: [get]
"#;
    let objects = [
        namespace("team-a", json!({})),
        namespace("team-b", json!({})),
    ];
    let seen = agree(
        "a loop over no cached var",
        &rules(yaml),
        &objects,
        vec![
            (
                "a namespace more",
                Box::new(|c: &mut Cluster| c.put(namespace("team-c", json!({})))),
            ),
            (
                "a namespace goes",
                Box::new(|c: &mut Cluster| c.delete(&namespace("team-a", json!({})))),
            ),
        ],
    );
    let first = &seen[0];
    let role = |name: &str| {
        first
            .iter()
            .find(|d| d.contains(&format!("/{name} ")))
            .cloned()
            .unwrap_or_default()
    };
    assert!(
        role("colour-team-a-blue").contains("blue.team-b"),
        "{first:#?}"
    );
    assert!(!role("colour-team-a-blue").contains("red."), "{first:#?}");
    assert!(
        role("each-team-a-team-b").contains("team-b.team-a"),
        "{first:#?}"
    );
}

/// An aggregate (its `aggregationRule` selects ClusterRoles by a label)
/// is judged again when a ClusterRole joins or leaves its selection: a
/// wildcard role labelled in makes it refused (revoked), labelled out
/// releases it. The selection's members change, so the selection is
/// reached (`View::refresh_selections`); kills its `now || was` ->
/// `now && was` (only a role that stays in reaches it).
fn an_aggregate_is_judged_again_when_its_selection_gains_or_loses_a_role() {
    let yaml = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: gatherer}
spec:
  outputs:
  - kind: ClusterRole
    name: gatherer
    aggregationRule:
      clusterRoleSelectors: [{matchLabels: {example.org/gather: "true"}}]
  - kind: ClusterRoleBinding
    name: gatherer
    roleRef: {kind: ClusterRole, name: gatherer}
    subjects: [{kind: Group, name: gatherers}]
"#;
    let role = |name: &str, labels: Value, rules: Value| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": name, "uid": format!("u-{name}"), "labels": labels},
               "rules": rules})
    };
    let pods = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
    let all = json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
    let gather = json!({"example.org/gather": "true"});
    let objects = [
        role("member", gather.clone(), pods.clone()),
        role("wild", json!({}), all.clone()),
    ];
    let (g, a) = (gather.clone(), all.clone());
    let (a2, p2) = (all.clone(), pods.clone());
    let seen = agree(
        "an aggregate's selection",
        &rules(yaml),
        &objects,
        vec![
            (
                "the wildcard role labelled in",
                Box::new(move |c: &mut Cluster| c.put(role("wild", g.clone(), a.clone()))),
            ),
            (
                "labelled out",
                Box::new(move |c: &mut Cluster| c.put(role("wild", json!({}), a2.clone()))),
            ),
            (
                "the member goes",
                Box::new(move |c: &mut Cluster| c.delete(&role("member", json!({}), p2.clone()))),
            ),
        ],
    );
    // The binding of the aggregate is what a wildcard member refuses.
    let bound = |s: &Vec<String>| {
        s.iter()
            .any(|d| d.starts_with("ClusterRoleBinding /gatherer "))
    };
    let held: Vec<bool> = seen.iter().map(bound).collect();
    assert_eq!(held, [true, false, true, true], "{seen:#?}");
}
