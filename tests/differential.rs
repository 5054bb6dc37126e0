//! Differential tests: the incremental engine computes exactly what the
//! reference evaluator (`rbac_rules::reference`, the specification)
//! computes — over every golden case, and over generated clusters and
//! sequences of changes (objects added, changed, deleted; rules added,
//! changed, deleted) with the shipped rule sets and generated rules, the
//! engine evaluating incrementally with one memo carried across steps and
//! rebuilt when the rules change, as the controller does.
//!
//! `DIFFERENTIAL_CASES=N` raises the number of generated sequences.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Parser;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rbac_rules::engine::{Engine, Evaluation, Memo, ObjectStore, Options, RuleSource};
use rbac_rules::render::RenderArgs;
use serde_json::{Value, json};

/// Everything but [`Evaluation::changed`] (incremental only), or where the
/// two differ first.
fn difference(engine: &Evaluation, reference: &Evaluation) -> Option<String> {
    let keys = |e: &Evaluation| -> Vec<String> {
        e.desired
            .iter()
            .map(|d| format!("{} {}/{}", d.kind, d.namespace, d.name))
            .collect()
    };
    if keys(engine) != keys(reference) {
        let (a, b) = (keys(engine), keys(reference));
        let only_engine: Vec<_> = a.iter().filter(|k| !b.contains(k)).collect();
        let only_reference: Vec<_> = b.iter().filter(|k| !a.contains(k)).collect();
        return Some(format!(
            "desired objects differ: only the engine's: {only_engine:?}; only the reference's: {only_reference:?}"
        ));
    }
    for (a, b) in engine.desired.iter().zip(reference.desired.iter()) {
        if a != b {
            return Some(format!(
                "desired object differs:\nengine:    {a:?}\nreference: {b:?}"
            ));
        }
    }
    let names: std::collections::BTreeSet<&String> = engine
        .reports
        .keys()
        .chain(reference.reports.keys())
        .collect();
    for name in names {
        let (a, b) = (engine.reports.get(name), reference.reports.get(name));
        if a != b {
            return Some(format!(
                "report of rule {name:?} differs:\nengine:    {a:#?}\nreference: {b:#?}"
            ));
        }
    }
    if engine.contested != reference.contested {
        return Some(format!(
            "contested differ:\nengine:    {:?}\nreference: {:?}",
            engine.contested, reference.contested
        ));
    }
    if engine.revoked != reference.revoked {
        return Some(format!(
            "revoked differ:\nengine:    {:#?}\nreference: {:#?}",
            engine.revoked, reference.revoked
        ));
    }
    None
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    render: RenderArgs,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A golden case's inputs, loaded as `rbac-rules render` loads them.
fn golden_inputs(case: &Path) -> (Vec<RuleSource>, Options, ObjectStore) {
    let mut argv: Vec<String> = vec!["render".into()];
    for objects in [case.join("objects"), case.join("objects.yaml")] {
        if objects.exists() {
            argv.extend(["--objects".into(), objects.display().to_string()]);
        }
    }
    for rules in [case.join("rules"), case.join("rules.yaml")] {
        if rules.exists() {
            argv.extend(["--rules".into(), rules.display().to_string()]);
        }
    }
    if let Ok(args) = std::fs::read_to_string(case.join("args")) {
        // Paths relative to the crate root, the tests' working directory.
        argv.extend(args.split_whitespace().map(str::to_string));
    }
    let args = Cli::try_parse_from(&argv)
        .expect("the case's args parse")
        .render;
    let rules: Vec<RuleSource> =
        rbac_rules::rules::load_for_command("render", &args.rules, args.recursive)
            .expect("the case's rules load")
            .into_iter()
            .map(|(_, r)| r)
            .collect();
    let mut store = ObjectStore::new();
    rbac_rules::yaml::for_each_in_tree(&args.objects, args.recursive, |_, _, v| {
        store.insert(v).expect("the case's objects load");
    })
    .expect("the case's objects read");
    let allow = args
        .allow
        .as_ref()
        .map(|p| rbac_rules::rules::load_allow(p, &mut store).expect("allow-list"));
    (rules, args.options(allow), store)
}

/// `store` with each object as [`rbac_rules::engine::shape::Shaper`] keeps
/// it for `rules`.
fn shaped(rules: &[RuleSource], store: &ObjectStore) -> ObjectStore {
    use rbac_rules::engine::shape::{Shaper, interests};
    let shaper = Shaper::new(interests(rules));
    let mut out = ObjectStore::new();
    let kinds: Vec<_> = store.kinds().cloned().collect();
    for gk in &kinds {
        for o in store.list(gk) {
            out.insert(shaper.shape(o.clone()))
                .expect("a shaped object loads");
        }
    }
    out
}

/// Every golden case: the engine's evaluation is the reference's, on
/// objects whole and as shaped.
#[test]
fn golden_cases_agree() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("tests/golden"))
        .expect("tests/golden")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() > 10, "golden cases found");
    let mut failures = Vec::new();
    for case in &dirs {
        let (rules, options, store) = golden_inputs(case);
        let engine = Engine::new(&rules, options.clone()).evaluate(&store);
        let reference = rbac_rules::reference::evaluate(&rules, &options, &store);
        assert!(!reference.desired.is_empty() || !reference.reports.is_empty());
        if let Some(d) = difference(&engine, &reference) {
            failures.push(format!("{}: {d}", case.display()));
        }
        // Objects cut to what the rules' readers see (metadataOnly,
        // fields), as the controller and `render` hold them: the same
        // evaluation.
        let shaped = shaped(&rules, &store);
        let engine = Engine::new(&rules, options.clone()).evaluate(&shaped);
        if let Some(d) = difference(&engine, &reference) {
            failures.push(format!("{} (objects shaped): {d}", case.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden case(s) differ:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

// ---------------------------------------------------------------------
// Generated clusters and sequences of changes.
// ---------------------------------------------------------------------

/// The number of generated sequences per seed cluster and rule set
/// (`DIFFERENTIAL_CASES`).
fn cases() -> u32 {
    std::env::var("DIFFERENTIAL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// Coherent clusters to start from: every golden case's objects, every
/// rule test's, the examples'. Their union is the pool objects are added
/// from.
fn seed_clusters() -> Vec<Vec<Value>> {
    let mut files: Vec<PathBuf> = vec![
        root().join("examples/crossplane-cluster.yaml"),
        root().join("docs/tutorial/cluster.yaml"),
        root().join("docs/reference/overview-objects.yaml"),
    ];
    for case in std::fs::read_dir(root().join("tests/golden")).expect("tests/golden") {
        let case = case.expect("entry").path();
        files.extend(
            [case.join("objects"), case.join("objects.yaml")]
                .into_iter()
                .filter(|p| p.exists()),
        );
    }
    files.sort();
    let mut seeds = Vec::new();
    for f in &files {
        let mut objects = Vec::new();
        rbac_rules::yaml::for_each_in_tree(std::slice::from_ref(f), true, |_, _, v| {
            objects.push(v)
        })
        .expect("seed objects read");
        seeds.push(objects);
    }
    rbac_rules::yaml::for_each_in_tree(&[root().join("rules")], true, |_, _, v| {
        if v["kind"] == "RbacRuleTest" {
            seeds.push(v["spec"]["objects"].as_array().cloned().unwrap_or_default());
        }
    })
    .expect("rule tests read");
    seeds.push(generated_objects());
    for objects in &mut seeds {
        objects.retain(|o| {
            o["kind"].is_string() && o["metadata"]["name"].is_string() && o["kind"] != "RbacRule"
        });
    }
    seeds.retain(|s| !s.is_empty());
    seeds
}

/// Objects the generated rules read.
fn generated_objects() -> Vec<Value> {
    let role = |name: &str, labels: Value, rules: Value| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": name, "labels": labels, "uid": format!("u-{name}")}, "rules": rules})
    };
    let ns = |name: &str, labels: Value| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels, "uid": format!("u-{name}"), "creationTimestamp": "2026-01-01T00:00:00Z"}});
    vec![
        ns("team-a", json!({"example.org/team": "a", "tier": "gold"})),
        ns("team-b", json!({"example.org/team": "b"})),
        ns("kube-system", json!({})),
        role(
            "base-view",
            json!({"example.org/aggregate": "true"}),
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]),
        ),
        role(
            "wild",
            json!({"example.org/aggregate": "true"}),
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
        ),
        role(
            "escalating",
            json!({}),
            json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["escalate"]}]),
        ),
        // Third parties' roles a labeller may label into a selection:
        // outside the allow-list, one picked by a label the rule chose, one
        // by an aggregation label.
        role(
            "third-party",
            json!({"tier": "true"}),
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "delete", "patch"]}]),
        ),
        role(
            "labelled-in",
            json!({"rbac.crossplane.io/aggregate-to-edit": "true"}),
            json!([{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}]),
        ),
        // Roles a loop's value selects (`example.org/agg-of`: its name)
        // and copies.
        role(
            "agg-member",
            json!({"example.org/agg-of": "base-view"}),
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]),
        ),
        role(
            "agg-wild",
            json!({"example.org/agg-of": "wild", "tier": "true"}),
            json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}]),
        ),
        // The tenants' default ceiling.
        role(
            "admin",
            json!({}),
            json!([{"apiGroups": ["", "apps"], "resources": ["pods", "configmaps"], "verbs": ["get", "list", "create"]}]),
        ),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "builder", "namespace": "team-b", "uid": "u-sa-b",
                            "creationTimestamp": "2026-01-01T00:00:00Z"}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "worker", "namespace": "team-a", "uid": "u-sa",
                            // The same instant as its Namespace's, with an offset:
                            // "no earlier" holds, compared as instants.
                            "creationTimestamp": "2026-01-01T01:00:00+01:00",
                            "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "team-a", "uid": "u-team-a", "controller": true}]}}),
    ]
}

/// Rules generated from a few shapes, with their choices.
fn generated_rules(choices: &[u8]) -> Vec<RuleSource> {
    let pick = |i: usize, options: &[&'static str]| {
        options[choices.get(i).copied().unwrap_or(0) as usize % options.len()]
    };
    let label = pick(
        0,
        &[
            "example.org/team",
            "tier",
            "example.org/aggregate",
            "rbac.crossplane.io/aggregate-to-edit",
        ],
    );
    let verb = pick(
        1,
        &["get", "escalate", "*", "{{trigger.metadata.name}}", "list"],
    );
    let group = pick(
        2,
        &[
            "\"\"",
            "\"*\"",
            "\"{{default (get trigger \\\"metadata.labels.tier\\\") \\\"x\\\"}}\"",
            "apps",
        ],
    );
    let subject = pick(
        3,
        &[
            "worker",
            "system:masters",
            "{{trigger.metadata.name}}",
            "system:{{trigger.metadata.name}}",
        ],
    );
    let role_ref = pick(
        4,
        &[
            "base-view",
            "cluster-admin",
            "wild",
            "gen-static",
            "escalating",
        ],
    );
    let name = pick(
        5,
        &["gen-{{trigger.metadata.name}}", "gen-static", "shared"],
    );
    // Lineage: which owners the ServiceAccounts' ownerReferences must
    // name, and since when (through the other Namespaces' controllers).
    let lineage = pick(
        6,
        &[
            "controlledByTrigger: true",
            "controlledBy: [trigger]",
            "controlledBy: [trigger], notOlderThan: trigger",
            "notOlderThan: trigger",
            "controlledBy: [trigger, peers], notOlderThan: trigger",
            "ownedBy: [trigger, peers]",
        ],
    );
    // The shapes of real rules (the built-in provider and XRD rules):
    // an output-level forEach, inside it a rule-level forEach, inside that
    // a directive whose items read both loop variables and a var. What the
    // loops run over: a var (cached, its items named by their values), or
    // any other list.
    let outer = pick(
        7,
        &[
            "vars.teams",
            "sort (pluck related.nss \"metadata.name\")",
            "vars.teams",
        ],
    );
    let teams = pick(
        8,
        &[
            "sort (pluck related.nss \"metadata.name\")",
            "list \"red\" \"blue\"",
            "pluck (list trigger) \"metadata.name\"",
            "uniq (append (list trigger.metadata.name) (sort (pluck related.nss \"metadata.name\")))",
        ],
    );
    let groups = pick(
        9,
        &[
            "groupBy (pluck related.nss \"metadata\") \"name\"",
            "groupBy (sortBy (pluck related.sas \"metadata\") \"name\") \"namespace\"",
            "groupBy (pluck related.nss \"metadata\") \"labels.tier\"",
        ],
    );
    let inner = pick(10, &["g.items", "vars.teams", "related.nss"]);
    let yaml = format!(
        r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: gen-nested}}
spec:
  trigger: {{kind: Namespace}}
  related:
  - name: nss
    objects: {{kind: Namespace, metadataOnly: true}}
  - name: sas
    objects: {{kind: ServiceAccount, metadataOnly: true}}
  vars:
  - name: teams
    value: '{teams}'
  - name: groups
    value: '{groups}'
  - name: verb
    value: '"{verb}"'
  outputs:
  - kind: ClusterRole
    forEach: '{outer}'
    as: o
    name: "gen-nested-{{{{trigger.metadata.name}}}}-{{{{o}}}}"
    rules:
    - forEach: vars.groups
      as: g
      item:
        apiGroups: ["{{{{g.key}}}}"]
        resources:
        - forEach: vars.teams
          as: r
          item: "{{{{r}}}}s"
        resourceNames:
        - forEach: {inner}
          as: t
          item: "{{{{o}}}}.{{{{g.key}}}}.{{{{default t.name (default t.metadata.name t)}}}}"
        verbs: ["{{{{vars.verb}}}}"]
    - apiGroups: [""]
      resources: [configmaps]
      resourceNames:
      - forEach: vars.teams
        as: r
        items: ["{{{{o}}}}-{{{{r}}}}", "{{{{r}}}}"]
      verbs: [get]
  - kind: Role
    name: gen-nested
    rules:
    - forEach: vars.groups
      as: g
      item:
        apiGroups: [""]
        resources: [secrets]
        resourceNames:
        - forEach: vars.teams
          as: o
          when: 'ne o g.key'
          item: "{{{{o}}}}.{{{{g.key}}}}"
        verbs: [get]
---
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: gen-namespace}}
spec:
  trigger:
    kind: Namespace
    selector: {{matchExpressions: [{{key: "{label}", operator: Exists}}]}}
    pause: {{annotation: example.org/paused}}
  related:
  - name: peers
    objects: {{kind: Namespace, metadataOnly: true}}
  - name: sas
    objects: {{kind: ServiceAccount, namespace: "{{{{trigger.metadata.name}}}}", {lineage}}}
  outputs:
  - kind: Role
    name: "{name}"
    labels: {{"{label}": "true"}}
    rules:
    - {{apiGroups: [{group}], resources: [pods], verbs: ["{verb}"]}}
  - kind: RoleBinding
    forEach: related.sas
    as: sa
    name: "gen-{{{{sa.metadata.name}}}}"
    roleRef: {{kind: ClusterRole, name: "{role_ref}"}}
    subjects: [{{kind: User, name: "{subject}"}}]
---
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: gen-static}}
spec:
  outputs:
  - kind: ClusterRole
    name: gen-static
    labels: {{"{label}": "true"}}
    rules: [{{apiGroups: [""], resources: [configmaps], verbs: ["{verb}"]}}]
  - kind: ClusterRole
    name: gen-shared
    rules: [{{apiGroups: [""], resources: [secrets], verbs: [get]}}]
  - kind: ClusterRole
    name: gen-aggregate
    aggregationRule: {{clusterRoleSelectors: [{{matchLabels: {{"{label}": "true"}}}}, {{matchLabels: {{example.org/aggregate: "true"}}}}]}}
  - kind: ClusterRoleBinding
    name: gen-aggregate
    roleRef: {{kind: ClusterRole, name: gen-aggregate}}
    subjects: [{{kind: Group, name: aggregate-users}}]
---
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: gen-copies}}
spec:
  trigger: {{kind: Namespace}}
  outputs:
  - kind: Role
    name: gen-copy
    rulesFrom:
      clusterRoleSelector: {{matchLabels: {{"{label}": "true"}}}}
      clusterRoleNames: ["{role_ref}"]
  - kind: ClusterRole
    when: 'eq trigger.metadata.name "team-a"'
    name: gen-shared
    rules: [{{apiGroups: [""], resources: [secrets], verbs: [get]}}]
  - kind: ClusterRoleBinding
    when: 'eq trigger.metadata.name "team-b"'
    name: "{name}"
    roleRef: {{kind: ClusterRole, name: "{role_ref}"}}
    subjects: [{{kind: Group, name: "{subject}"}}]
---
# Tenants: the same shapes confined to a namespace, under its ceiling.
apiVersion: rbacrules.io/v1alpha1
kind: NamespacedRbacRule
metadata: {{name: gen-tenant, namespace: team-a}}
spec:
  trigger: {{kind: ServiceAccount}}
  related:
  - name: peers
    objects: {{kind: Namespace, metadataOnly: true}}
  - name: sas
    objects: {{kind: ServiceAccount, {lineage}}}
  outputs:
  - kind: Role
    name: "{name}"
    rules:
    - {{apiGroups: [{group}], resources: [pods], verbs: ["{verb}"]}}
  - kind: RoleBinding
    forEach: related.sas
    as: sa
    name: "t-{{{{sa.metadata.name}}}}-{{{{len related.peers}}}}"
    roleRef: {{kind: ClusterRole, name: "{role_ref}"}}
    subjects: [{{kind: User, name: "{subject}"}}]
  - kind: RoleBinding
    name: own
    roleRef: {{kind: Role, name: "tenant:gen-tenant:{name}"}}
    subjects: [{{kind: Group, name: "system:serviceaccounts:team-a"}}]
---
apiVersion: rbacrules.io/v1alpha1
kind: NamespacedRbacRule
metadata: {{name: gen-tenant, namespace: team-b}}
spec:
  trigger: {{kind: ServiceAccount}}
  outputs:
  - kind: Role
    name: "{name}"
    rules:
    - {{apiGroups: [""], resources: [pods], verbs: ["{verb}"]}}
"#
    );
    rbac_rules::rules::parse_text(Path::new("generated.yaml"), &yaml)
        .expect("generated rules parse")
}

/// The choices of [`loop_rules`]: how many options each has.
const LOOP_CHOICES: [u8; 10] = [3, 4, 3, 3, 3, 2, 2, 4, 2, 2];

/// A rule of the other shapes real rules take, with its choices (see
/// [`LOOP_CHOICES`]): `rulesFrom` (a selector by a loop variable, names by
/// a directive over a var or another list) and aggregation (labels merged
/// by a directive, an `aggregationRule` whose selectors a directive makes)
/// inside an output-level `forEach`; an output-level loop over a var or
/// over a related set, a rule-level loop inside it over a var (maybe
/// binding the outer loop's name again) and a directive inside that over
/// a var, a var of vars and the trigger, a nested list read from a related
/// set (a `listField` of the ServiceAccounts' ownerReferences) or a list
/// of the outer loop's item. The ClusterRoles it writes are labelled so
/// that, applied, they are what its `related.roles` lists next time.
fn loop_rules(choices: &[u8]) -> Vec<RuleSource> {
    let pick = |i: usize, options: &[&'static str]| {
        assert_eq!(options.len(), LOOP_CHOICES[i] as usize);
        options[choices.get(i).copied().unwrap_or(0) as usize % options.len()]
    };
    // A var of related lists only (cached), or of related lists and the
    // trigger, or of another var (neither cached).
    let names = pick(
        0,
        &[
            "sort (pluck related.rolenames \"name\")",
            "list \"base-view\" \"wild\"",
            "pluck related.accts \"name\"",
        ],
    );
    let others = pick(
        1,
        &[
            "vars.names",
            "append vars.names (list trigger.metadata.name)",
            "append (pluck related.nsnames \"name\") (list (default (get trigger \"metadata.uid\") \"no-uid\"))",
            "pluck related.nsnames \"name\"",
        ],
    );
    let outer = pick(
        2,
        &[
            "vars.names",
            "vars.others",
            "sort (pluck related.roles \"metadata.name\")",
        ],
    );
    let copied = pick(3, &["vars.others", "vars.names", "list o \"wild\""]);
    // Over a cached var, a cached related list, or a list computed from
    // one (no token: its items have no ids to key a nested list by).
    let accounts = pick(
        4,
        &[
            "vars.accounts",
            "related.sas",
            "sortBy related.sas \"metadata.name\"",
        ],
    );
    let rule_loop = pick(5, &["vars.names", "vars.others"]);
    // The rule-level loop's name: its own, or the output loop's again.
    let shadow = pick(6, &["g", "sa"]);
    let inner = pick(
        7,
        &[
            "vars.others",
            "vars.names",
            "sort (pluck related.owners \"name\")",
            "list (default sa.name (get sa \"metadata.name\"))",
        ],
    );
    // Aggregation selectors made by a directive, or literal.
    let selectors = pick(
        8,
        &[
            "- forEach: vars.names\n        as: r\n        when: 'ne r o'\n        item: {matchLabels: {example.org/agg-of: \"{{r}}\"}}",
            "- matchLabels: {example.org/agg-of: \"{{o}}\"}",
        ],
    );
    // The loops' outputs: cluster-wide roles, or Roles in the trigger's
    // namespace.
    let sa_kind = pick(9, &["ClusterRole", "Role"]);
    let item = if shadow == "g" {
        "{{t}}.{{g}}.{{default sa.name (get sa \"metadata.name\")}}"
    } else {
        "{{t}}.{{sa}}"
    };
    let inner = if shadow == "sa" && inner.contains("sa.name") {
        "list sa \"x\""
    } else {
        inner
    };
    let yaml = format!(
        r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: gen-loops}}
spec:
  trigger: {{kind: Namespace}}
  related:
  - name: roles
    objects:
      apiGroup: rbac.authorization.k8s.io
      kind: ClusterRole
      metadataOnly: true
      selector: {{matchExpressions: [{{key: example.org/agg-of, operator: Exists}}]}}
  - name: nss
    objects: {{kind: Namespace, metadataOnly: true}}
  - name: sas
    objects: {{kind: ServiceAccount, metadataOnly: true}}
  # Lists of fields of the objects: what a var must read (and read
  # nothing else) to be cached, and a loop over it to key what it nests.
  - name: rolenames
    listField: {{path: metadata, of: [roles], fields: [name]}}
  - name: nsnames
    listField: {{path: metadata, of: [nss], fields: [name]}}
  - name: accts
    listField: {{path: metadata, of: [sas], fields: [name, namespace]}}
  - name: owners
    listField:
      path: metadata.ownerReferences
      of: [sas]
      fields: [name, kind]
  vars:
  - name: names
    value: '{names}'
  - name: others
    value: '{others}'
  - name: accounts
    value: 'sortBy related.accts "name"'
  outputs:
  - kind: Role
    forEach: '{outer}'
    as: o
    name: "gen-copy-{{{{o}}}}"
    rulesFrom:
      clusterRoleSelector: {{matchLabels: {{example.org/agg-of: "{{{{o}}}}"}}}}
      clusterRoleNames:
      - forEach: '{copied}'
        as: r
        when: 'ne r trigger.metadata.name'
        item: "{{{{r}}}}"
  - kind: ClusterRole
    forEach: '{outer}'
    as: o
    name: "gen-agg-{{{{trigger.metadata.name}}}}-{{{{o}}}}"
    labels:
      example.org/aggregate: "true"
      $merge:
      - forEach: vars.others
        as: r
        when: 'eq r o'
        item: {{example.org/agg-of: "{{{{r}}}}"}}
    aggregationRule:
      clusterRoleSelectors:
      {selectors}
      - matchLabels: {{tier: "true"}}
  - kind: {sa_kind}
    forEach: '{accounts}'
    as: sa
    name: "gen-sa-{{{{trigger.metadata.name}}}}-{{{{default sa.name (get sa \"metadata.name\")}}}}"
    rules:
    - forEach: '{rule_loop}'
      as: {shadow}
      item:
        apiGroups: [""]
        resources: [serviceaccounts]
        resourceNames:
        - forEach: '{inner}'
          as: t
          when: 'ne t {shadow}'
          item: '{item}'
        verbs: [get]
    - apiGroups: [""]
      resources: [configmaps]
      resourceNames:
      - forEach: vars.names
        as: r
        items: ["{{{{r}}}}", "{{{{r}}}}.{{{{len vars.others}}}}"]
      verbs: [list]
"#
    );
    rbac_rules::rules::parse_text(Path::new("loops.yaml"), &yaml).expect("loop rules parse")
}

/// One change to the cluster, the rules or the options; numbers choose
/// among what there is when the change is made.
#[derive(Clone, Debug)]
enum Change {
    Add(u16),
    /// Add again an object removed before (deleted and created again).
    Restore(u16),
    Remove(u16),
    Label(u16, u8, bool),
    Annotate(u16, u8, bool),
    Deleting(u16),
    NewUid(u16),
    /// Give object `.0` an ownerReference to object `.1` (a controller one
    /// when `.2`), replacing its first, or remove its references.
    Own(u16, u16, Option<bool>),
    /// Set object `.0`'s creationTimestamp to one of a few (or none).
    Age(u16, u8),
    /// Write (some of) the desired objects, as the controller applies them.
    Apply(u64),
    /// Delete what the controller would prune or revoke.
    Prune,
    /// Someone widens a live managed role.
    Tamper(u16),
    RemoveRule(u16),
    RestoreRule,
    DuplicateRule(u16),
    RuleLevel(u16, u8),
    Manage(u8),
    Hold(u16),
    Waive(u8),
    Allow,
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        3 => any::<u16>().prop_map(Change::Add),
        3 => any::<u16>().prop_map(Change::Restore),
        3 => any::<u16>().prop_map(Change::Remove),
        3 => (any::<u16>(), any::<u8>(), any::<bool>()).prop_map(|(a, b, c)| Change::Label(a, b, c)),
        2 => (any::<u16>(), any::<u8>(), any::<bool>()).prop_map(|(a, b, c)| Change::Annotate(a, b, c)),
        1 => any::<u16>().prop_map(Change::Deleting),
        1 => any::<u16>().prop_map(Change::NewUid),
        2 => (any::<u16>(), any::<u16>(), any::<Option<bool>>()).prop_map(|(a, b, c)| Change::Own(a, b, c)),
        2 => (any::<u16>(), any::<u8>()).prop_map(|(a, b)| Change::Age(a, b)),
        3 => any::<u64>().prop_map(Change::Apply),
        2 => Just(Change::Prune),
        1 => any::<u16>().prop_map(Change::Tamper),
        1 => any::<u16>().prop_map(Change::RemoveRule),
        1 => Just(Change::RestoreRule),
        1 => any::<u16>().prop_map(Change::DuplicateRule),
        1 => (any::<u16>(), any::<u8>()).prop_map(|(a, b)| Change::RuleLevel(a, b)),
        1 => any::<u8>().prop_map(Change::Manage),
        1 => any::<u16>().prop_map(Change::Hold),
        1 => any::<u8>().prop_map(Change::Waive),
        1 => Just(Change::Allow),
    ]
}

/// The cluster, rules and options a sequence has reached.
struct World {
    pool: Vec<Value>,
    store: ObjectStore,
    rules: Vec<RuleSource>,
    removed: Vec<RuleSource>,
    /// Objects removed, and those of the seed cluster: what `Restore` adds.
    gone: Vec<Value>,
    options: Options,
    /// Label and annotation keys and values the changes use.
    labels: Vec<(String, String)>,
    annotations: Vec<(String, String)>,
    /// A counter for resourceVersions and uids.
    version: u64,
    last: Option<Evaluation>,
}

const LEVELS: [rbac_rules::api::ManageLevel; 3] = [
    rbac_rules::api::ManageLevel::ServiceAccounts,
    rbac_rules::api::ManageLevel::Basic,
    rbac_rules::api::ManageLevel::All,
];

fn nth<T>(items: &[T], i: impl Into<u64>) -> Option<&T> {
    (!items.is_empty()).then(|| &items[(i.into() % items.len() as u64) as usize])
}

impl World {
    fn new(pool: Vec<Value>, rules: Vec<RuleSource>, seed: &[Value], initial: &[u16]) -> World {
        let (labels, annotations) = metadata_pool(&pool, &rules);
        let mut w = World {
            pool,
            store: ObjectStore::new(),
            rules,
            removed: Vec::new(),
            gone: seed.to_vec(),
            options: Options::default(),
            labels,
            annotations,
            version: 0,
            last: None,
        };
        for o in seed {
            w.write(o.clone());
        }
        for i in initial {
            w.apply(&Change::Add(*i));
        }
        w
    }

    /// Writes an object as the API server would: a new resourceVersion.
    fn write(&mut self, mut obj: Value) {
        self.version += 1;
        if let Some(m) = obj["metadata"].as_object_mut() {
            m.insert("resourceVersion".into(), json!(self.version.to_string()));
        }
        self.store.insert(obj).expect("a valid object");
    }

    fn objects(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for gk in self.store.kinds().cloned().collect::<Vec<_>>() {
            out.extend(self.store.list(&gk).cloned());
        }
        out
    }

    fn object(&self, i: u16) -> Option<Value> {
        nth(&self.objects(), i).cloned()
    }

    fn remove(&mut self, obj: &Value) {
        let gk = rbac_rules::engine::GroupKind::of(obj).expect("a kind");
        let key = rbac_rules::engine::store::key_of(obj).expect("a key");
        self.store.remove(&gk, &key);
    }

    /// Makes one change; true when the rules or options changed.
    fn apply(&mut self, c: &Change) -> bool {
        match c {
            Change::Add(i) => {
                if let Some(o) = nth(&self.pool, *i).cloned() {
                    self.write(o);
                }
            }
            Change::Restore(i) => {
                if let Some(o) = nth(&self.gone, *i).cloned() {
                    self.write(o);
                }
            }
            Change::Remove(i) => {
                if let Some(o) = self.object(*i) {
                    self.remove(&o);
                    self.gone.push(o);
                }
            }
            Change::Label(i, k, set) | Change::Annotate(i, k, set) => {
                let (field, pool) = match c {
                    Change::Label(..) => ("labels", &self.labels),
                    _ => ("annotations", &self.annotations),
                };
                let (Some(mut o), Some((key, value))) = (self.object(*i), nth(pool, *k).cloned())
                else {
                    return false;
                };
                let map = &mut o["metadata"][field];
                if !map.is_object() {
                    *map = json!({});
                }
                if *set {
                    map[key.as_str()] = json!(value);
                } else if let Some(m) = map.as_object_mut() {
                    m.remove(&key);
                }
                self.write(o);
            }
            Change::Deleting(i) => {
                if let Some(mut o) = self.object(*i) {
                    o["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                    self.write(o);
                }
            }
            Change::NewUid(i) => {
                if let Some(mut o) = self.object(*i) {
                    o["metadata"]["uid"] = json!(format!("uid-{}", self.version));
                    self.write(o);
                }
            }
            Change::Own(i, j, controller) => {
                let (Some(mut o), Some(owner)) = (self.object(*i), self.object(*j)) else {
                    return false;
                };
                match controller {
                    None => {
                        if let Some(m) = o["metadata"].as_object_mut() {
                            m.remove("ownerReferences");
                        }
                    }
                    Some(c) => {
                        let r = json!({"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                       "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                                       "controller": c});
                        let refs = &mut o["metadata"]["ownerReferences"];
                        match refs.as_array_mut() {
                            Some(a) if !a.is_empty() && *c => a[0] = r,
                            Some(a) => a.push(r),
                            None => *refs = json!([r]),
                        }
                    }
                }
                self.write(o);
            }
            Change::Age(i, t) => {
                // Before, at (in two forms) and after the seeds' owners'
                // creation, and not a time.
                const AGES: [&str; 5] = [
                    "2025-06-01T00:00:00Z",
                    "2026-01-01T00:00:00Z",
                    "2026-01-01T01:00:00+01:00",
                    "2026-01-01T00:01:00Z",
                    "yesterday",
                ];
                let Some(mut o) = self.object(*i) else {
                    return false;
                };
                match AGES.get(*t as usize % (AGES.len() + 1)) {
                    Some(a) => o["metadata"]["creationTimestamp"] = json!(a),
                    None => {
                        if let Some(m) = o["metadata"].as_object_mut() {
                            m.remove("creationTimestamp");
                        }
                    }
                }
                self.write(o);
            }
            Change::Apply(bits) => self.apply_desired(*bits),
            Change::Prune => self.prune(),
            Change::Tamper(i) => {
                let roles: Vec<Value> = self
                    .objects()
                    .into_iter()
                    .filter(|o| o["kind"].as_str().is_some_and(|k| k.ends_with("Role")))
                    .collect();
                if let Some(mut o) = nth(&roles, *i).cloned() {
                    o["rules"] = json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
                    self.write(o);
                }
            }
            Change::RemoveRule(i) => {
                if !self.rules.is_empty() {
                    let at = (*i as usize) % self.rules.len();
                    self.removed.push(self.rules.remove(at));
                }
                return true;
            }
            Change::RestoreRule => {
                if let Some(r) = self.removed.pop() {
                    self.rules.push(r);
                }
                return true;
            }
            Change::DuplicateRule(i) => {
                if let Some(r) = nth(&self.rules, *i).cloned() {
                    self.rules.push(RuleSource {
                        name: format!("{}-copy", r.name),
                        spec: r.spec,
                        namespace: r.namespace,
                    });
                }
                return true;
            }
            Change::RuleLevel(i, l) => {
                if !self.rules.is_empty() {
                    let at = (*i as usize) % self.rules.len();
                    self.rules[at].spec.manage_level = LEVELS[*l as usize % 3];
                }
                return true;
            }
            Change::Manage(l) => {
                self.options.manage = LEVELS[*l as usize % 3];
                return true;
            }
            Change::Hold(i) => {
                if let Some(r) = nth(&self.rules, *i) {
                    let name = r.name.clone();
                    if !self.options.held.remove(&name) {
                        self.options.held.insert(name);
                    }
                }
                return true;
            }
            Change::Waive(b) => {
                let w = &mut self.options.waivers;
                match b % 4 {
                    0 => w.wildcard_all = !w.wildcard_all,
                    1 => w.escalation_verbs = !w.escalation_verbs,
                    2 => w.cluster_admin_bindings = !w.cluster_admin_bindings,
                    _ => w.everyone_bindings = !w.everyone_bindings,
                }
                return true;
            }
            Change::Allow => {
                self.options.allow = match self.options.allow {
                    Some(_) => None,
                    None => Some(allow_list()),
                };
                return true;
            }
        }
        false
    }

    /// Writes the desired objects `bits` picks, as the controller applies
    /// them (with a uid), on top of the live ones.
    fn apply_desired(&mut self, bits: u64) {
        let Some(last) = self.last.take() else { return };
        for (n, d) in last.desired.iter().enumerate() {
            if bits & (1 << (n % 64)) != 0 {
                let mut o = d.object.to_value();
                o["metadata"]["uid"] = json!(format!("uid-{}-{}-{}", d.kind, d.namespace, d.name));
                self.write(o);
            }
        }
        self.last = Some(last);
    }

    /// Deletes the managed live objects nothing desires or keeps, and the
    /// revoked ones, as the controller prunes.
    fn prune(&mut self) {
        let Some(last) = self.last.take() else { return };
        for o in self.objects() {
            let Some(kind) = o["kind"]
                .as_str()
                .and_then(rbac_rules::api::OutputKind::parse)
            else {
                continue;
            };
            if !rbac_rules::engine::output::is_managed(&o) {
                continue;
            }
            let ns = o["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let key = (
                kind,
                ns,
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
            let ann = &o["metadata"]["annotations"];
            let rule = ann[rbac_rules::engine::output::rule_annotation()]
                .as_str()
                .unwrap_or_default();
            let trigger = ann[rbac_rules::engine::output::trigger_annotation()].as_str();
            let revoked = last.revoked.contains_key(&key);
            let wanted = last.desired.get(&key).is_some()
                || last.contested.contains(&key)
                || last.keeps(rule, trigger);
            if revoked || !wanted {
                self.remove(&o);
            }
        }
        self.last = Some(last);
    }
}

/// An allow-list: read anything, and write pods and configmaps.
fn allow_list() -> rbac_rules::engine::AllowList {
    let rules = serde_json::from_value(json!([
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": ["*"]},
    ]))
    .expect("policy rules");
    rbac_rules::engine::AllowList {
        rules,
        selectors: Vec::new(),
        custom_groups: false,
    }
}

/// Metadata entries: (key, value).
type Entries = Vec<(String, String)>;

/// Label and annotation entries to set: those the objects carry and the
/// literal ones the rules select or pause by.
fn metadata_pool(pool: &[Value], rules: &[RuleSource]) -> (Entries, Entries) {
    let mut labels = BTreeMap::new();
    let mut annotations = BTreeMap::new();
    for o in pool {
        for (k, v) in o["metadata"]["labels"].as_object().into_iter().flatten() {
            labels.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
        }
        for (k, v) in o["metadata"]["annotations"]
            .as_object()
            .into_iter()
            .flatten()
        {
            if v.as_str().is_some_and(|v| v.len() < 100) {
                annotations.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
            }
        }
    }
    fn walk(
        v: &Value,
        labels: &mut BTreeMap<String, String>,
        annotations: &mut BTreeMap<String, String>,
    ) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if k == "matchLabels" {
                        for (lk, lv) in x.as_object().into_iter().flatten() {
                            if !lk.contains("{{") {
                                labels.insert(
                                    lk.clone(),
                                    lv.as_str().unwrap_or_default().to_string(),
                                );
                            }
                        }
                    }
                    if k == "pause" {
                        let key = x["annotation"].as_str().unwrap_or_default().to_string();
                        annotations.insert(key, x["value"].as_str().unwrap_or("true").to_string());
                    }
                    walk(x, labels, annotations);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, labels, annotations)),
            _ => {}
        }
    }
    for r in rules {
        walk(
            &serde_json::to_value(&r.spec).expect("a spec"),
            &mut labels,
            &mut annotations,
        );
    }
    labels.insert("app.kubernetes.io/managed-by".into(), "rbac-rules".into());
    (
        labels.into_iter().collect(),
        annotations.into_iter().collect(),
    )
}

/// What the evaluations compared in a test held: the comparison must have
/// met objects, errors, warnings, refusals and conflicts to mean anything.
#[derive(Default, Debug)]
struct Stats {
    steps: usize,
    desired: usize,
    errors: usize,
    warnings: usize,
    revoked: usize,
    contested: usize,
    kept: usize,
    notices: usize,
}

impl Stats {
    fn add(&mut self, e: &Evaluation) {
        self.steps += 1;
        self.desired += e.desired.len();
        self.errors += e.errors().count();
        self.warnings += e.warnings().count();
        self.revoked += e.revoked.len();
        self.contested += e.contested.len();
        self.notices += e.notices().count();
        self.kept += e
            .reports
            .values()
            .map(|r| r.kept_triggers.len())
            .sum::<usize>();
    }
}

thread_local! {
    static STATS: std::cell::RefCell<Stats> = std::cell::RefCell::default();
}

fn stats() -> Stats {
    let s = STATS.with(|s| std::mem::take(&mut *s.borrow_mut()));
    eprintln!("compared: {s:?}");
    s
}

/// Runs change sequences over `rules`: after every step the engine,
/// evaluating incrementally with one memo (a new engine when the rules or
/// options change), must agree with the reference.
fn sequences(name: &str, rules: Vec<RuleSource>, seeds: &[Vec<Value>], cases: u32) {
    let pool: Vec<Value> = seed_clusters().concat();
    // The seed clusters with an object of a kind the rules read, other
    // than the RBAC kinds every cluster has.
    let reads: Vec<rbac_rules::engine::GroupKind> = Engine::new(&rules, Options::default())
        .interests()
        .into_iter()
        .map(|i| i.gk)
        .filter(|gk| gk.group != "rbac.authorization.k8s.io")
        .collect();
    let relevant = |seed: &&Vec<Value>| {
        seed.iter()
            .any(|o| rbac_rules::engine::GroupKind::of(o).is_some_and(|gk| reads.contains(&gk)))
    };
    let seeds: Vec<&Vec<Value>> = seeds.iter().filter(relevant).collect();
    assert!(
        !seeds.is_empty(),
        "{name}: no seed cluster has what the rules read"
    );
    let strategy = (
        prop::collection::vec(any::<u16>(), 0..8),
        prop::collection::vec(change(), 1..6),
    );
    // Every seed cluster, each with its own random changes.
    for seed in seeds {
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            max_shrink_iters: 100,
            ..Config::default()
        });
        let result = runner.run(&strategy, |(initial, changes)| {
            let mut w = World::new(pool.clone(), rules.clone(), seed, &initial);
            if w.rules.iter().any(|r| r.name == "gen-static") {
                generated_objects().into_iter().for_each(|o| w.write(o));
            }
            let mut engine = Engine::new(&w.rules, w.options.clone());
            let mut memo = Memo::new();
            for step in 0..=changes.len() {
                if step > 0 && w.apply(&changes[step - 1]) {
                    engine = Engine::new(&w.rules, w.options.clone());
                }
                let got = engine.evaluate_incremental(&w.store, &mut memo);
                let want = rbac_rules::reference::evaluate(&w.rules, &w.options, &w.store);
                if let Some(d) = difference(&got, &want) {
                    return Err(TestCaseError::fail(format!(
                        "{name}: after step {step} ({:?}): {d}",
                        changes.get(step.wrapping_sub(1))
                    )));
                }
                STATS.with(|s| s.borrow_mut().add(&got));
                w.last = Some(got);
            }
            Ok(())
        });
        if let Err(e) = result {
            panic!("{e}");
        }
    }
}

fn load(dir: &str) -> Vec<RuleSource> {
    let rules = rbac_rules::rules::load_for_command("differential", &[root().join(dir)], false)
        .expect("rules load");
    rules.into_iter().map(|(_, r)| r).collect()
}

#[test]
fn builtin_rules_agree_over_change_sequences() {
    let builtin = rbac_rules::rules::builtin().expect("built-in rules");
    sequences("built-in", builtin, &seed_clusters(), cases());
    let s = stats();
    assert!(s.desired > 0 && s.errors > 0 && s.kept > 0, "{s:?}");
}

#[test]
fn example_rule_sets_agree_over_change_sequences() {
    let seeds = seed_clusters();
    for dir in [
        "rules/examples/any-crd",
        "rules/examples/config-sync",
        "rules/examples/package-isolation",
    ] {
        sequences(dir, load(dir), &seeds, cases());
    }
    let mut compat = load("rules/examples/config-sync");
    compat.extend(load("rules/examples/config-sync-compat"));
    sequences("config-sync-compat", compat, &seeds, cases());
    let s = stats();
    assert!(s.desired > 0 && s.errors > 0, "{s:?}");
}

#[test]
fn generated_rules_agree_over_change_sequences() {
    let mut runner = TestRunner::new(Config {
        cases: 4,
        failure_persistence: None,
        ..Config::default()
    });
    let choices = prop::collection::vec(any::<u8>(), 11);
    let mut seen = Vec::new();
    for _ in 0..6 * cases() {
        let c = choices.new_tree(&mut runner).expect("choices").current();
        seen.push(c.clone());
        let mut rules = generated_rules(&c);
        rules.extend(
            rbac_rules::rules::builtin()
                .expect("built-in rules")
                .into_iter()
                .filter(|r| r.name.contains("namespace")),
        );
        let seeds = [generated_objects()];
        sequences(&format!("generated {c:?}"), rules, &seeds, 4 * cases());
    }
    assert!(!seen.is_empty());
    let s = stats();
    assert!(
        s.desired > 0 && s.errors > 0 && s.revoked > 0 && s.contested > 0 && s.notices > 0,
        "{s:?}"
    );
}

/// Every shape of nested loops the generator makes (an output-level
/// forEach over a var or another list, a rule-level forEach inside it, a
/// directive inside that reading both loop variables and a var), each
/// over change sequences: a cached nested list is keyed by every loop
/// bound around it, so the Role rendered for one item of an output's
/// forEach never gets the resourceNames of another.
#[test]
fn nested_loop_shapes_agree_over_change_sequences() {
    let mut shapes = 0;
    for outer in 0..3u8 {
        for teams in 0..4u8 {
            for groups in 0..3u8 {
                for inner in 0..3u8 {
                    let c = [0, 0, 0, 0, 0, 0, 0, outer, teams, groups, inner];
                    let rules: Vec<RuleSource> = generated_rules(&c)
                        .into_iter()
                        .filter(|r| r.name == "gen-nested")
                        .collect();
                    assert_eq!(rules.len(), 1);
                    sequences(
                        &format!("nested {c:?}"),
                        rules,
                        &[generated_objects()],
                        cases(),
                    );
                    shapes += 1;
                }
            }
        }
    }
    assert_eq!(shapes, 108);
    let s = stats();
    assert!(s.desired > 0 && s.errors > 0, "{s:?}");
}

/// The other shapes of real rules ([`loop_rules`]): `rulesFrom` and
/// aggregation inside an output-level forEach, output-level loops over
/// vars and related sets, rule-level loops inside them (one binding the
/// outer loop's name again) and directives inside those over vars, vars of
/// vars and the trigger, a listField and the outer item; each over change
/// sequences (ClusterRoles selected, labelled, copied, widened and written
/// back; ServiceAccounts and their owners; Namespaces). Every value of
/// every choice is met, each beside several values of the others.
///
/// A var of a listField and the trigger (`others`, the third choice) read
/// inside the loops is cached only because its expression reads nothing
/// but related lists: a var key that forgets the trigger (`var_key` in
/// `src/engine/expand.rs` without its `expr_reads_only(expr, "related")`
/// check) serves one Namespace's value to the next, and this test fails
/// at once (`loops [0, 2, 2, 2, 0, 1, 0, 1, 1]`, step 0: another trigger's
/// uid in `gen-sa-builder`'s resourceNames).
#[test]
fn loop_copy_and_aggregation_shapes_agree_over_change_sequences() {
    // Every combination of what decides whether a nested list is cached
    // and by what (the var `names`, the output loop over a var or a
    // related set, the rule-level loop, the innermost list); the other
    // choices turn with it.
    let runs = 48;
    let mut met = vec![std::collections::BTreeSet::new(); LOOP_CHOICES.len()];
    for i in 0..runs {
        let c: Vec<u8> = vec![
            i % 3,
            (i * 5 + 1) % 4,
            (i / 2 + i / 5) % 3,
            (i / 4 + i) % 3,
            (i / 3) % 3,
            (i / 9) % 2,
            u8::from(i % 5 == 0),
            (i / 18 + i) % 4,
            (i / 7) % 2,
            u8::from(i % 4 == 3),
        ];
        for (m, v) in met.iter_mut().zip(&c) {
            m.insert(*v);
        }
        let mut rules = loop_rules(&c);
        // A rule that aggregates what the loops label, and roles to copy.
        rules.extend(
            generated_rules(&[2, 0, 0, 0, 0, 0, 0])
                .into_iter()
                .filter(|r| r.name == "gen-static"),
        );
        sequences(
            &format!("loops {c:?}"),
            rules,
            &[generated_objects()],
            cases(),
        );
    }
    for (m, k) in met.iter().zip(LOOP_CHOICES) {
        assert_eq!(m.len(), k as usize, "every value of every choice met");
    }
    let s = stats();
    assert!(s.desired > 0 && s.errors > 0 && s.revoked > 0, "{s:?}");
}

/// Every object of a cluster changed, deleted and created again, one at a
/// time, with one memo throughout: a change to what a lookup found, or
/// will find by name, reaches the rules that read it.
#[test]
fn every_object_changed_deleted_and_created_again_agrees() {
    let mut crossplane = Vec::new();
    let path = root().join("examples/crossplane-cluster.yaml");
    rbac_rules::yaml::for_each_in_tree(&[path], false, |_, _, v| crossplane.push(v)).expect("read");
    let mut generated = generated_rules(&[3, 2, 1, 1, 3, 0, 4]);
    generated.extend(
        generated_rules(&[0, 0, 0, 0, 0, 0, 2])
            .into_iter()
            .map(|mut r| {
                r.name = format!("{}-2", r.name);
                r
            }),
    );
    let cases = [
        (
            "built-in",
            rbac_rules::rules::builtin().expect("built-in rules"),
            crossplane,
        ),
        ("generated", generated, generated_objects()),
    ];
    for (name, rules, seed) in cases {
        let mut w = World::new(Vec::new(), rules, &seed, &[]);
        let engine = Engine::new(&w.rules, w.options.clone());
        let mut memo = Memo::new();
        let mut compare = |w: &World, what: &str| {
            let got = engine.evaluate_incremental(&w.store, &mut memo);
            let want = rbac_rules::reference::evaluate(&w.rules, &w.options, &w.store);
            if let Some(d) = difference(&got, &want) {
                panic!("{name}: {what}: {d}");
            }
            STATS.with(|s| s.borrow_mut().add(&got));
        };
        compare(&w, "at first");
        for o in &seed {
            let what = format!("{} {}", o["kind"], o["metadata"]["name"]);
            w.write(touched(o));
            compare(&w, &format!("{what} changed"));
            w.remove(o);
            compare(&w, &format!("{what} deleted"));
            w.write(o.clone());
            compare(&w, &format!("{what} created again"));
        }
    }
    let s = stats();
    assert!(s.desired > 0 && s.steps > 10, "{s:?}");
}

/// `o` with a label more and, for a role, a wider grant.
fn touched(o: &Value) -> Value {
    let mut o = o.clone();
    if !o["metadata"]["labels"].is_object() {
        o["metadata"]["labels"] = json!({});
    }
    o["metadata"]["labels"]["differential/touched"] = json!("true");
    if o["kind"].as_str().is_some_and(|k| k.ends_with("Role")) {
        o["rules"] =
            json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]);
    }
    o
}

/// The tenant golden cases' NamespacedRbacRules (confined reads, the
/// ceiling by a Namespace's label, refusals, compile errors) with cluster
/// rules beside them: both evaluators agree after every change.
#[test]
fn tenant_rule_sets_agree_over_change_sequences() {
    let seeds = seed_clusters();
    let mut all = Vec::new();
    for case in [
        "tests/golden/tenant-basic",
        "tests/golden/tenant-over-ceiling",
        "tests/golden/tenant-cross-namespace",
    ] {
        let rules = load(&format!("{case}/rules.yaml"));
        assert!(rules.iter().any(|r| r.namespace.is_some()), "{case}");
        sequences(case, rules.clone(), &seeds, cases());
        for r in rules {
            if !all.iter().any(|a: &RuleSource| a.name == r.name) {
                all.push(r);
            }
        }
    }
    sequences("tenant rules together", all, &seeds, cases());
    let s = stats();
    assert!(s.desired > 0 && s.errors > 0 && s.revoked > 0, "{s:?}");
}

/// Two rules of one trigger whose first related set is alike and whose
/// second (a listField over it) and var differ (also screened by
/// tests/cache_keys.rs).
pub fn sharing_rules_yaml() -> String {
    let rule = |name: &str, field: &str| {
        format!(
            r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: {name}}}
spec:
  trigger: {{kind: Namespace}}
  related:
  - name: sas
    objects: {{kind: ServiceAccount, metadataOnly: true}}
  - name: picked
    listField: {{path: metadata, of: [sas], fields: [{field}]}}
  vars:
  - name: v
    value: 'pluck related.picked "{field}"'
  outputs:
  - kind: Role
    name: {name}
    rules:
    - apiGroups: [""]
      resources: [serviceaccounts]
      resourceNames:
      - forEach: vars.v
        as: x
        item: "{{{{x}}}}"
      verbs: [get]
"#
        )
    };
    format!(
        "{}---{}",
        rule("share-a", "name"),
        rule("share-b", "namespace")
    )
}

/// Rules of one trigger keep their own lists and vars. Rules share cached
/// values only up to what they define alike (`Derivation`); one that took
/// the other's list or var would render the names where the namespaces
/// belong.
#[test]
fn rules_of_one_trigger_share_only_what_they_define_alike() {
    let yaml = sharing_rules_yaml();
    let rules =
        rbac_rules::rules::parse_text(Path::new("sharing.yaml"), &yaml).expect("rules parse");
    sequences("sharing", rules, &[generated_objects()], 8 * cases());
    let s = stats();
    assert!(s.desired > 0, "{s:?}");
}

// ---------------------------------------------------------------------
// For tests/cache_keys.rs, the quick screen of the cache keys for
// mutation testing (CONTRIBUTING.md), which takes this file as a module.
// ---------------------------------------------------------------------

/// What `tests/cache_keys.rs` takes from this file: the same generated
/// shapes and change sequences (it runs fewer of them; this file runs
/// them all).
#[allow(dead_code)]
pub(crate) mod screen {
    use super::{RuleSource, Value};

    /// [`super::LOOP_CHOICES`].
    pub(crate) const LOOP_CHOICES: [u8; 10] = super::LOOP_CHOICES;

    /// [`super::generated_rules`].
    pub(crate) fn generated_rules(choices: &[u8]) -> Vec<RuleSource> {
        super::generated_rules(choices)
    }

    /// [`super::loop_rules`].
    pub(crate) fn loop_rules(choices: &[u8]) -> Vec<RuleSource> {
        super::loop_rules(choices)
    }

    /// [`super::generated_objects`].
    pub(crate) fn generated_objects() -> Vec<Value> {
        super::generated_objects()
    }

    /// [`super::seed_clusters`].
    pub(crate) fn seed_clusters() -> Vec<Vec<Value>> {
        super::seed_clusters()
    }

    /// [`super::sequences`].
    pub(crate) fn sequences(name: &str, rules: Vec<RuleSource>, seeds: &[Vec<Value>], cases: u32) {
        super::sequences(name, rules, seeds, cases)
    }

    /// [`super::difference`].
    pub(crate) fn difference(
        engine: &super::Evaluation,
        reference: &super::Evaluation,
    ) -> Option<String> {
        super::difference(engine, reference)
    }

    /// What the sequences since the last call compared: (steps, desired
    /// objects, errors).
    pub(crate) fn compared() -> (usize, usize, usize) {
        let s = super::stats();
        (s.steps, s.desired, s.errors)
    }
}
