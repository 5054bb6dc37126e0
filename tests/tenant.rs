//! NamespacedRbacRules (docs/rules.md "Namespaced rules"): a tenant's
//! outputs never leave its namespace nor exceed its ceiling, a tenant never
//! changes another tenant's or a cluster rule's outputs, a refusal hits the
//! refused output alone (reason `OverCeiling`), per-namespace budgets shed
//! that namespace's triggers only, and both evaluators agree throughout.

use std::path::Path;

use k8s_openapi::api::rbac::v1::PolicyRule;
use proptest::prelude::*;
use serde_json::Value;

use rbac_rules::engine::tenant::Tenancy;
use rbac_rules::engine::{
    Engine, ErrorKind, Evaluation, GroupKind, ObjectStore, Options, RuleSource,
};

/// The cluster of the tenant golden cases: team-a under `admin`, team-b
/// under `tenant-small` (its Namespace's label).
fn cluster() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/tenant-basic/objects.yaml");
    let mut out = Vec::new();
    rbac_rules::yaml::for_each_in_tree(&[path], false, |_, _, v| out.push(v)).expect("objects");
    out
}

fn store_of(objects: &[Value]) -> ObjectStore {
    let mut store = ObjectStore::new();
    for o in objects {
        store.insert(o.clone()).expect("object loads");
    }
    store
}

fn rules(yaml: &str) -> Vec<RuleSource> {
    rbac_rules::rules::parse_text(Path::new("tenant-test.yaml"), yaml).expect("rules parse")
}

/// The engine's evaluation, checked equal to the reference's.
fn evaluate(rules: &[RuleSource], options: &Options, store: &ObjectStore) -> Evaluation {
    let got = Engine::new(rules, options.clone()).evaluate(store);
    let want = rbac_rules::reference::evaluate(rules, options, store);
    assert_eq!(got.desired, want.desired, "desired objects differ");
    assert_eq!(*got.reports, *want.reports, "reports differ");
    assert_eq!(got.revoked, want.revoked, "revocations differ");
    assert_eq!(got.contested, want.contested, "contested objects differ");
    got
}

fn rules_of(v: &Value) -> Vec<PolicyRule> {
    serde_json::from_value(v["rules"].clone()).unwrap_or_default()
}

/// The ceiling's rules of a namespace of [`cluster`], read independently
/// of the engine.
fn ceiling(objects: &[Value], namespace: &str) -> Vec<PolicyRule> {
    let name = if namespace == "team-b" {
        "tenant-small"
    } else {
        "admin"
    };
    objects
        .iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == name)
        .map(rules_of)
        .unwrap_or_default()
}

/// What a desired tenant object grants: a Role its rules; a RoleBinding the
/// rules of the role it binds, emitted or live.
fn grants(objects: &[Value], eval: &Evaluation, obj: &Value) -> Vec<PolicyRule> {
    if obj["kind"] == "Role" {
        return rules_of(obj);
    }
    let (kind, name) = (&obj["roleRef"]["kind"], &obj["roleRef"]["name"]);
    let ns = if kind == "Role" {
        obj["metadata"]["namespace"].clone()
    } else {
        Value::Null
    };
    let same = |o: &Value| {
        o["kind"] == *kind && o["metadata"]["name"] == *name && o["metadata"]["namespace"] == ns
    };
    let emitted = eval.desired.iter().map(|d| d.object.to_value());
    emitted
        .chain(objects.iter().cloned())
        .filter(|o| same(o))
        .flat_map(|o| rules_of(&o))
        .collect()
}

/// Every desired object of a tenant rule: in its namespace, a Role or
/// RoleBinding named under its prefix, granting only what the ceiling
/// covers and nothing escalating, binding no reserved subject.
fn assert_confined(objects: &[Value], eval: &Evaluation) {
    for d in eval.desired.iter() {
        let Some((ns, local)) = d.rule.split_once('/') else {
            continue;
        };
        let obj = d.object.to_value();
        let what = format!("{} {}/{} of {}", d.kind, d.namespace, d.name, d.rule);
        assert!(
            matches!(obj["kind"].as_str(), Some("Role" | "RoleBinding")),
            "{what}"
        );
        assert_eq!(d.namespace, ns, "{what} left its namespace");
        assert!(d.name.starts_with(&format!("tenant:{local}:")), "{what}");
        let g = grants(objects, eval, &obj);
        let (covered, missing) = rbac_rules::policy::covers(&ceiling(objects, ns), &g);
        assert!(covered, "{what} exceeds its ceiling: {missing:?}");
        assert!(
            rbac_rules::policy::escalating_grants(&g).is_empty(),
            "{what} escalates"
        );
        for s in obj["subjects"].as_array().into_iter().flatten() {
            let name = s["name"].as_str().unwrap_or_default();
            let own = name == format!("system:serviceaccounts:{ns}");
            assert!(
                s["kind"] == "ServiceAccount" || own || !name.starts_with("system:"),
                "{what} binds {name}"
            );
        }
    }
}

const GROUPS: &[&str] = &[
    "\"\"",
    "apps",
    "\"*\"",
    "rbac.authorization.k8s.io",
    "example.org",
];
const RESOURCES: &[&str] = &[
    "pods",
    "pods/exec",
    "secrets",
    "nodes",
    "\"*\"",
    "roles",
    "incidents",
    "\"{{trigger.metadata.name}}\"",
];
const VERBS: &[&str] = &[
    "get",
    "list",
    "create",
    "\"*\"",
    "escalate",
    "bind",
    "impersonate",
    "delete",
];
const ROLE_REFS: &[(&str, &str)] = &[
    ("ClusterRole", "admin"),
    ("ClusterRole", "tenant-small"),
    ("ClusterRole", "read-everything"),
    ("ClusterRole", "cluster-admin"),
    ("ClusterRole", "admin-core"),
    ("ClusterRole", "missing"),
    ("Role", "tenant:hostile:r0"),
    ("Role", "tenant:hostile:r1"),
    ("Role", "oncall"),
];
const SUBJECTS: &[(&str, &str)] = &[
    ("User", "alice"),
    ("Group", "system:masters"),
    ("Group", "system:serviceaccounts:team-a"),
    ("Group", "system:serviceaccounts:team-b"),
    ("User", "system:anonymous"),
    ("Group", "{{trigger.metadata.name}}"),
];
const NAMESPACES: &[&str] = &["", "team-a", "team-b"];

/// One generated output: a Role of a few rules, or a RoleBinding.
#[derive(Clone, Debug)]
enum Out {
    Role(Vec<(usize, usize, usize)>, usize),
    Binding(usize, usize, usize),
}

fn out() -> impl Strategy<Value = Out> {
    prop_oneof![
        (
            prop::collection::vec((0..GROUPS.len(), 0..RESOURCES.len(), 0..VERBS.len()), 1..3),
            0..NAMESPACES.len()
        )
            .prop_map(|(r, ns)| Out::Role(r, ns)),
        (0..ROLE_REFS.len(), 0..SUBJECTS.len(), 0..NAMESPACES.len())
            .prop_map(|(r, s, ns)| Out::Binding(r, s, ns)),
    ]
}

/// A hostile tenant rule of `namespace` from generated outputs (named
/// `r0`, `r1`, … and `b0`, …), triggered by Incidents or static.
fn tenant_rule(namespace: &str, outs: &[Out], triggered: bool) -> String {
    let mut y = format!(
        "apiVersion: rbacrules.io/v1alpha1\nkind: NamespacedRbacRule\nmetadata: {{name: hostile, namespace: {namespace}}}\nspec:\n"
    );
    if triggered {
        y.push_str("  trigger: {apiGroup: example.org, kind: Incident}\n");
    }
    y.push_str("  outputs:\n");
    let ns = |i: usize| match NAMESPACES[i] {
        "" => String::new(),
        n => format!(", namespace: {n}"),
    };
    for (i, o) in outs.iter().enumerate() {
        match o {
            Out::Role(rules, n) => {
                y.push_str(&format!("  - {{kind: Role, name: r{i}{}, rules: [", ns(*n)));
                for (g, r, v) in rules {
                    y.push_str(&format!(
                        "{{apiGroups: [{}], resources: [{}], verbs: [{}]}},",
                        GROUPS[*g], RESOURCES[*r], VERBS[*v]
                    ));
                }
                y.push_str("]}\n");
            }
            Out::Binding(r, s, n) => {
                let (rk, rn) = ROLE_REFS[*r];
                let (sk, sn) = SUBJECTS[*s];
                y.push_str(&format!(
                    "  - {{kind: RoleBinding, name: b{i}{}, roleRef: {{kind: {rk}, name: \"{rn}\"}}, subjects: [{{kind: {sk}, name: \"{sn}\", apiGroup: rbac.authorization.k8s.io}}]}}\n",
                    ns(*n)
                ));
            }
        }
    }
    y
}

/// Rules of others: a cluster rule writing Roles in both namespaces and a
/// well-behaved tenant of each namespace.
const OTHERS: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: cluster}
spec:
  trigger: {apiGroup: example.org, kind: Incident}
  outputs:
  - kind: Role
    name: "incident-{{trigger.metadata.name}}"
    rules: [{apiGroups: [""], resources: [configmaps], verbs: [get]}]
  - kind: RoleBinding
    name: "incident-{{trigger.metadata.name}}"
    roleRef: {kind: Role, name: "incident-{{trigger.metadata.name}}"}
    subjects: [{kind: Group, name: sre}]
---
apiVersion: rbacrules.io/v1alpha1
kind: NamespacedRbacRule
metadata: {name: oncall, namespace: team-a}
spec:
  trigger: {apiGroup: example.org, kind: Incident}
  outputs:
  - kind: Role
    name: "exec-{{trigger.metadata.name}}"
    rules: [{apiGroups: [""], resources: [pods/exec], verbs: [create]}]
---
apiVersion: rbacrules.io/v1alpha1
kind: NamespacedRbacRule
metadata: {name: oncall, namespace: team-b}
spec:
  trigger: {apiGroup: example.org, kind: Incident}
  outputs:
  - kind: Role
    name: "logs-{{trigger.metadata.name}}"
    rules: [{apiGroups: [""], resources: [pods/log], verbs: [get]}]
"#;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// No tenant output ever leaves its namespace or exceeds its ceiling,
    /// whatever the tenant writes or data fills in; and the others'
    /// outputs and reports are exactly what they are without the hostile
    /// tenant.
    #[test]
    fn tenant_outputs_stay_confined_and_touch_no_one_else(
        outs in prop::collection::vec(out(), 1..5),
        in_b in any::<bool>(),
        triggered in any::<bool>(),
    ) {
        let objects = cluster();
        let store = store_of(&objects);
        let options = Options::default();
        let others = rules(OTHERS);
        let before = evaluate(&others, &options, &store);
        let ns = if in_b { "team-b" } else { "team-a" };
        let mut all = others.clone();
        all.extend(rules(&tenant_rule(ns, &outs, triggered)));
        let after = evaluate(&all, &options, &store);
        assert_confined(&objects, &after);
        let hostile = format!("{ns}/hostile");
        let theirs = |e: &Evaluation| -> Vec<String> {
            e.desired.iter().filter(|d| *d.rule != *hostile).map(|d| format!("{:?}", d)).collect()
        };
        prop_assert_eq!(theirs(&before), theirs(&after));
        for r in &others {
            prop_assert_eq!(before.reports.get(&r.name), after.reports.get(&r.name), "report of {}", r.name);
        }
        // Nothing of the others' is revoked or contested for the tenant.
        for (k, why) in &after.revoked {
            prop_assert!(k.2.starts_with("tenant:hostile:") || before.revoked.get(k) == Some(why), "{:?}", k);
        }
        prop_assert_eq!(&before.contested, &after.contested);
    }
}

#[test]
fn over_the_ceiling_is_refused_alone_with_its_reason() {
    let objects = cluster();
    let store = store_of(&objects);
    let r = rules(
        r#"
apiVersion: rbacrules.io/v1alpha1
kind: NamespacedRbacRule
metadata: {name: greedy, namespace: team-a}
spec:
  trigger: {apiGroup: example.org, kind: Incident}
  outputs:
  - kind: Role
    name: fits
    rules: [{apiGroups: [""], resources: [pods/exec], verbs: [create]}]
  - kind: Role
    name: nodes
    rules: [{apiGroups: [""], resources: [nodes], verbs: [get]}]
  - kind: RoleBinding
    name: everything
    roleRef: {kind: ClusterRole, name: read-everything}
    subjects: [{kind: User, name: mallory}]
  - kind: RoleBinding
    name: fits
    roleRef: {kind: Role, name: "tenant:greedy:fits"}
    subjects: [{kind: Group, name: "system:serviceaccounts:team-a"}]
"#,
    );
    let eval = evaluate(&r, &Options::default(), &store);
    let names: Vec<String> = eval
        .desired
        .iter()
        .map(|d| format!("{} {}", d.kind, d.name))
        .collect();
    assert_eq!(
        names,
        ["Role tenant:greedy:fits", "RoleBinding tenant:greedy:fits"]
    );
    let report = &eval.reports["team-a/greedy"];
    let over: Vec<(&str, ErrorKind)> = report
        .errors
        .iter()
        .map(|e| (e.field.as_str(), e.kind))
        .collect();
    assert_eq!(
        over,
        [
            ("spec.outputs[1]", ErrorKind::OverCeiling),
            ("spec.outputs[2]", ErrorKind::OverCeiling)
        ],
        "{:?}",
        report.errors
    );
    assert_eq!(ErrorKind::OverCeiling.reason(), "OverCeiling");
    assert!(eval.revoked.keys().any(|k| k.2 == "tenant:greedy:nodes"));
    // A live copy of a refused output is revoked whatever keeps it.
    assert!(
        report.errors[0]
            .message
            .contains("ceiling ClusterRole \"admin\"")
    );
}

#[test]
fn a_namespace_label_chooses_the_ceiling_and_a_missing_ceiling_passes_nothing() {
    let mut objects = cluster();
    let r = rules(
        r#"
apiVersion: rbacrules.io/v1alpha1
kind: NamespacedRbacRule
metadata: {name: exec, namespace: team-b}
spec:
  outputs:
  - kind: Role
    name: exec
    rules: [{apiGroups: [""], resources: [pods/exec], verbs: [create]}]
"#,
    );
    let eval = evaluate(&r, &Options::default(), &store_of(&objects));
    assert!(eval.desired.is_empty(), "tenant-small has no exec");
    assert!(
        eval.errors()
            .any(|e| e.kind == ErrorKind::OverCeiling && e.message.contains("tenant-small"))
    );
    // The label gone: the default ceiling (admin) covers it.
    for o in &mut objects {
        if o["kind"] == "Namespace" && o["metadata"]["name"] == "team-b" {
            o["metadata"]["labels"] = Value::Null;
        }
    }
    let eval = evaluate(&r, &Options::default(), &store_of(&objects));
    assert_eq!(eval.desired.len(), 1);
    // A ceiling that does not exist lets nothing pass.
    let options = Options {
        tenancy: Tenancy {
            ceiling: "nope".into(),
            ..Tenancy::default()
        },
        ..Options::default()
    };
    let eval = evaluate(&r, &options, &store_of(&objects));
    assert!(eval.desired.is_empty());
    assert!(
        eval.errors()
            .any(|e| e.message.contains("\"nope\"") && e.message.contains("does not exist"))
    );
}

#[test]
fn reads_stay_in_the_namespace_and_secrets_show_no_data() {
    let objects = cluster();
    let store = store_of(&objects);
    let r = rules(
        r#"
apiVersion: rbacrules.io/v1alpha1
kind: NamespacedRbacRule
metadata: {name: nosy, namespace: team-a}
spec:
  related:
  - {name: incidents, objects: {apiGroup: example.org, kind: Incident}}
  - {name: secrets, objects: {kind: Secret}}
  - {name: namespaces, objects: {kind: Namespace}}
  - {name: byname, objects: {apiGroup: example.org, kind: Incident, names: [disk-full]}}
  outputs:
  - kind: Role
    name: "i{{len related.incidents}}-s{{len related.secrets}}-n{{len related.namespaces}}-b{{len related.byname}}-{{#each related.secrets}}{{default (get this \"data.password\") \"nodata\"}}{{/each}}"
    rules: []
"#,
    );
    let eval = evaluate(&r, &Options::default(), &store);
    let names: Vec<&str> = eval.desired.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        ["tenant:nosy:i1-s1-n0-b0-nodata"],
        "{:?}",
        eval.errors().collect::<Vec<_>>()
    );
    // An administrator lets tenants read Namespaces: the cluster-scoped
    // objects of that kind, and still only their own namespace's Incidents.
    let options = Options {
        tenancy: Tenancy {
            readable_kinds: [GroupKind::new("", "Namespace")].into_iter().collect(),
            ..Tenancy::default()
        },
        ..Options::default()
    };
    let eval = evaluate(&r, &options, &store);
    let names: Vec<&str> = eval.desired.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["tenant:nosy:i1-s1-n2-b0-nodata"]);
}

#[test]
fn triggers_of_other_namespaces_do_not_trigger() {
    let objects = cluster();
    let r = rules(
        r#"
apiVersion: rbacrules.io/v1alpha1
kind: NamespacedRbacRule
metadata: {name: each, namespace: team-a}
spec:
  trigger: {apiGroup: example.org, kind: Incident}
  outputs:
  - {kind: Role, name: "{{trigger.metadata.namespace}}-{{trigger.metadata.name}}", rules: []}
"#,
    );
    let eval = evaluate(&r, &Options::default(), &store_of(&objects));
    let names: Vec<&str> = eval.desired.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["tenant:each:team-a-db-down"]);
    assert_eq!(eval.reports["team-a/each"].matched_triggers, 1);
}

#[test]
fn a_namespace_over_its_budget_sheds_its_own_triggers_only() {
    let mut objects = cluster();
    for i in 0..4 {
        objects.push(serde_json::json!({"apiVersion": "example.org/v1", "kind": "Incident",
            "metadata": {"name": format!("i{i}"), "namespace": "team-a", "uid": format!("u-i{i}")}}));
    }
    let store = store_of(&objects);
    let mut options = Options::default();
    options.limits.objects_per_namespace = 4;
    let r = rules(OTHERS);
    let eval = evaluate(&r, &options, &store);
    let count = |rule: &str| eval.desired.iter().filter(|d| &*d.rule == rule).count();
    // team-a's tenant has 5 triggers of one object each: one is shed.
    assert_eq!(count("team-a/oncall"), 4);
    assert!(
        eval.reports["team-a/oncall"]
            .errors
            .iter()
            .all(|e| e.kind == ErrorKind::LimitExceeded
                && e.message.contains("--max-objects-per-namespace"))
    );
    assert_eq!(eval.reports["team-a/oncall"].errors.len(), 1);
    // Cluster rules and team-b are not touched.
    assert_eq!(count("cluster"), 12);
    assert_eq!(count("team-b/oncall"), 1);
    assert!(eval.reports["cluster"].errors.is_empty());
}

#[test]
fn the_author_must_hold_what_the_rule_grants() {
    let objects = cluster();
    let rbac: Vec<Value> = objects
        .iter()
        .filter(|o| o["apiVersion"] == "rbac.authorization.k8s.io/v1")
        .cloned()
        .collect();
    let r = rules(
        r#"
apiVersion: rbacrules.io/v1alpha1
kind: NamespacedRbacRule
metadata: {name: oncall, namespace: team-a}
spec:
  outputs:
  - kind: Role
    name: exec
    rules:
    - {apiGroups: [""], resources: [pods/exec], verbs: [create]}
    - {apiGroups: [""], resources: ["{{params.r}}"], verbs: [get]}
  - kind: RoleBinding
    name: admins
    roleRef: {kind: ClusterRole, name: admin}
    subjects: [{kind: Group, name: devs}]
"#,
    );
    let author = |user: &str, groups: &[&str]| rbac_rules::delegation::Author {
        user: user.to_string(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    };
    // alice (admin in team-a) holds exec but not bind on ClusterRoles.
    let alice = rbac_rules::ruletest::admission_refusals(&r[0], &rbac, &author("alice", &[]));
    assert_eq!(alice.len(), 1, "{alice:?}");
    assert!(alice[0].starts_with("spec.outputs[1].roleRef"));
    // bob, in devs (pods read only): exec refused too; the templated rule
    // is left to the ceiling.
    let bob = rbac_rules::ruletest::admission_refusals(&r[0], &rbac, &author("bob", &["devs"]));
    assert_eq!(bob.len(), 2, "{bob:?}");
    assert!(bob[0].starts_with("spec.outputs[0].rules[0]") && bob[0].contains("pods/exec"));
}

#[test]
fn loading_names_a_tenant_rule_by_its_namespace() {
    let r = rules(
        "apiVersion: rbacrules.io/v1alpha1\nkind: NamespacedRbacRule\nmetadata: {name: x, namespace: team-a}\nspec:\n  outputs: [{kind: Role, name: r, rules: []}]\n",
    );
    assert_eq!(r[0].name, "team-a/x");
    assert_eq!(r[0].namespace.as_deref(), Some("team-a"));
    let missing = rbac_rules::rules::parse_text(
        Path::new("t.yaml"),
        "apiVersion: rbacrules.io/v1alpha1\nkind: NamespacedRbacRule\nmetadata: {name: x}\nspec:\n  outputs: [{kind: Role, name: r, rules: []}]\n",
    );
    assert!(
        missing
            .unwrap_err()
            .to_string()
            .contains("metadata.namespace")
    );
    let label = rbac_rules::engine::tenant::rule_label_value("team-a/x");
    assert_eq!(label, "team-a.x");
    // A cluster rule cannot pose as a tenant's by its name.
    let poser = rules(
        "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRule\nmetadata: {name: team-a/x}\nspec:\n  outputs: [{kind: Role, name: \"tenant:x:r\", namespace: team-a, rules: []}]\n",
    );
    let eval = evaluate(&poser, &Options::default(), &store_of(&cluster()));
    assert!(eval.desired.is_empty());
    assert!(
        eval.errors()
            .any(|e| e.kind == ErrorKind::InvalidRule && e.field == "metadata.name")
    );
}

#[test]
fn a_rule_tests_author_is_checked_as_admission_would() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/tenant-basic");
    let test = |author: &str, errors: &str| {
        let text = format!(
            "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRuleTest\nmetadata: {{name: t}}\nspec:\n  rules: [../tenant-author-refused/rules.yaml]\n  objects: [objects.yaml]\n  author: {author}\n  expect:\n    errors: {errors}\n"
        );
        let docs =
            rbac_rules::yaml::parse_documents(&dir.join("t.yaml"), &text).expect("test parses");
        rbac_rules::ruletest::run_one(&docs[0]).failures
    };
    // bob may not write it: admission's refusals are the test's errors.
    assert!(
        test(
            "{user: bob, groups: [devs]}",
            "[\"admission would refuse\", \"bind ClusterRole\"]"
        )
        .is_empty()
    );
    // Expecting no error, bob's test fails, naming what he lacks.
    let failures = test("{user: bob, groups: [devs]}", "[]");
    assert!(
        failures.iter().any(|f| f.contains("pods/exec")),
        "{failures:?}"
    );
}

#[test]
fn a_namespace_out_of_time_fails_its_own_triggers_only() {
    let store = store_of(&cluster());
    let mut options = Options::default();
    options.limits.seconds_per_namespace = 0.0;
    // Time is not meaning: the engine alone applies it.
    let eval = Engine::new(&rules(OTHERS), options).evaluate(&store);
    for tenant in ["team-a/oncall", "team-b/oncall"] {
        let errors = &eval.reports[tenant].errors;
        assert!(!errors.is_empty(), "{tenant}");
        assert!(
            errors.iter().all(|e| e.kind == ErrorKind::LimitExceeded
                && e.message.contains("--max-seconds-per-namespace")),
            "{errors:?}"
        );
    }
    assert!(eval.reports["cluster"].errors.is_empty());
    assert_eq!(
        eval.desired
            .iter()
            .filter(|d| &*d.rule == "cluster")
            .count(),
        4
    );
}

/// A tenant rule moved to another namespace and back, through engines
/// each built from the one before (as the controller builds them): the
/// last renders it where it is now, as a fresh engine does, never as an
/// earlier engine compiled it for another namespace (a NamespacedRbacRule
/// is named `<namespace>/<name>`, and an engine takes over a rule, or
/// shares its source, only by an equal name and spec).
#[test]
fn a_tenant_rule_moved_and_moved_back_is_confined_where_it_is() {
    let store = store_of(&cluster());
    let at = |ns: &str| {
        rules(&format!(
            "apiVersion: rbacrules.io/v1alpha1\nkind: NamespacedRbacRule\nmetadata: {{name: mover, namespace: {ns}}}\nspec:\n  outputs:\n  - {{kind: Role, name: reader, rules: [{{apiGroups: [\"\"], resources: [configmaps], verbs: [get]}}]}}\n"
        ))
    };
    let options = Options::default();
    let a = Engine::new(&at("team-a"), options.clone());
    let b = Engine::with_previous(&a, &at("team-b"), options.clone());
    let back = Engine::with_previous(&b, &at("team-a"), options.clone());
    let got = back.evaluate(&store);
    let want = Engine::new(&at("team-a"), options).evaluate(&store);
    assert!(
        got.desired.iter().any(|d| d.namespace == "team-a"),
        "the rule's Role is in team-a: {:?}",
        got.reports
    );
    assert_eq!(got.desired, want.desired);
    assert_eq!(*got.reports, *want.reports);
}
