//! Property tests (issue 11): arbitrary trigger objects through the
//! built-in rules and a rule that copies trigger fields into every policy
//! field never panic, never yield a wildcard from data, and never pass an
//! output outside the allow-list; the covers check is reflexive and a rule
//! covers its breakdown. Issue 27: names, labels, selectors and subjects
//! from data never yield a protected object, a protected aggregation, a
//! `system:` User or Group subject, or (unless waived) a binding to
//! everyone.

use k8s_openapi::api::rbac::v1::PolicyRule;
use proptest::prelude::*;
use rbac_rules::engine::{AllowList, Engine, Evaluation, ObjectStore, Options, RuleSource};
use rbac_rules::policy;
use serde_json::{Value, json};

/// Strings made of the characters that matter: wildcards, separators,
/// case, control and non-ASCII characters.
fn hostile() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("*".to_string()),
        Just(String::new()),
        Just("*.*".to_string()),
        Just("secrets".to_string()),
        Just("rbac.authorization.k8s.io".to_string()),
        proptest::string::string_regex("[a-z*./:A-Z0-9\\- é\u{0}\n]{0,12}").expect("regex"),
    ]
}

const COPIER: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: copier}
spec:
  trigger: {apiGroup: example.org, kind: Thing}
  outputs:
  - kind: ClusterRole
    name: "copier-{{trigger.metadata.name}}"
    rules:
    - apiGroups: ["{{trigger.spec.a}}", {forEach: trigger.spec.list, item: "{{item}}"}]
      resources: ["{{trigger.spec.b}}", "{{trigger.spec.a}}/{{trigger.spec.b}}"]
      verbs: ["{{trigger.spec.c}}"]
      resourceNames: ["{{trigger.spec.d}}"]
    - nonResourceURLs: ["/{{trigger.spec.a}}", "{{trigger.spec.d}}"]
      verbs: ["{{trigger.spec.c}}"]
  - kind: RoleBinding
    namespace: default
    name: "copier-{{trigger.metadata.name}}"
    roleRef: {kind: ClusterRole, name: "{{trigger.spec.b}}"}
    subjects: [{kind: User, name: "{{trigger.spec.d}}"}]
"#;

fn rules() -> Vec<RuleSource> {
    let mut r = rbac_rules::rules::builtin().expect("built-in rules");
    r.extend(
        rbac_rules::rules::parse_text(std::path::Path::new("copier.yaml"), COPIER)
            .expect("copier parses"),
    );
    r
}

fn objects(a: &str, b: &str, c: &str, d: &str, list: &[String]) -> Vec<Value> {
    vec![
        json!({"apiVersion": "example.org/v1", "kind": "Thing",
               "metadata": {"name": "t", "uid": "uid-t"},
               "spec": {"a": a, "b": b, "c": c, "d": d, "list": list}}),
        json!({"apiVersion": "apiextensions.crossplane.io/v1", "kind": "CompositeResourceDefinition",
               "metadata": {"name": "xrd", "uid": "uid-xrd"},
               "spec": {"group": a, "names": {"kind": "X", "plural": b},
                        "claimNames": {"kind": "C", "plural": d},
                        "versions": [{"name": "v1", "served": true, "referenceable": true}]}}),
        json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
               "metadata": {"name": "rev", "uid": "uid-rev"},
               "spec": {"image": format!("xpkg.crossplane.io/{c}/provider-x:v1")},
               "status": {"objectRefs": list.iter().chain([a.to_string(), format!("{b}.{a}")].iter())
                   .map(|n| json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "name": n}))
                   .collect::<Vec<_>>()}}),
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "ns", "uid": "uid-ns",
                            "annotations": {format!("rbac.crossplane.io/{a}"): b}}}),
    ]
}

/// Strings with `*` the rules write literally (no template): the only
/// wildcards allowed in the output.
fn literal_wildcards(rules: &[RuleSource]) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) if s.contains('*') && !s.contains("{{") => out.push(s.clone()),
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::Object(m) => m.values().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for r in rules {
        walk(
            &serde_json::to_value(&r.spec.outputs).expect("spec serializes"),
            &mut out,
        );
    }
    out
}

fn evaluate(engine: &Engine, objs: &[Value]) -> Evaluation {
    let mut s = ObjectStore::new();
    for o in objs {
        s.insert(o.clone()).expect("insert");
    }
    engine.evaluate(&s)
}

/// Policy rules of the outputs rendered for the hostile triggers.
fn triggered_rules(eval: &Evaluation) -> Vec<(String, PolicyRule)> {
    eval.desired
        .iter()
        .filter(|d| d.trigger.is_some())
        .flat_map(|d| {
            d.object.to_value()["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    (
                        d.name.clone(),
                        serde_json::from_value(r.clone()).expect("emitted rules parse"),
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn data_never_widens_a_grant(
        a in hostile(), b in hostile(), c in hostile(), d in hostile(),
        list in proptest::collection::vec(hostile(), 0..3),
    ) {
        let rules = rules();
        let literal = literal_wildcards(&rules);
        let engine = Engine::new(&rules, Options::default());
        let eval = evaluate(&engine, &objects(&a, &b, &c, &d, &list));
        for (name, r) in triggered_rules(&eval) {
            for v in r.api_groups.iter().flatten()
                .chain(r.resources.iter().flatten())
                .chain(r.resource_names.iter().flatten())
                .chain(r.non_resource_urls.iter().flatten())
                .chain(r.verbs.iter())
            {
                prop_assert!(!v.contains('*') || literal.contains(v), "{name}: {v:?} in {r:?}");
            }
            prop_assert!(!policy::is_wildcard_all(&r), "{name}: {r:?}");
        }
        for d in &eval.desired {
            let object = d.object.to_value();
            let role_ref = object["roleRef"]["name"].as_str().unwrap_or_default();
            prop_assert!(role_ref != "cluster-admin" && !role_ref.starts_with("system:"));
            prop_assert!(!d.name.starts_with("system:"));
        }
    }

    #[test]
    fn every_output_passes_the_allow_list(
        a in hostile(), b in hostile(), c in hostile(), d in hostile(),
    ) {
        let allow = AllowList {
            rules: vec![PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["pods".into()]),
                verbs: vec!["get".into()],
                ..PolicyRule::default()
            }],
            selectors: Vec::new(),
            custom_groups: true,
        };
        let engine = Engine::new(&rules(), Options { allow: Some(allow.clone()), ..Options::default() });
        let eval = evaluate(&engine, &objects(&a, &b, &c, &d, &[]));
        for d in &eval.desired {
            let rules: Vec<PolicyRule> = d.object.to_value()["rules"].as_array().into_iter().flatten()
                .map(|r| serde_json::from_value(r.clone()).expect("rules parse"))
                .collect();
            let missing = allow.uncovered(&allow.rules, &rules);
            prop_assert!(missing.is_empty(), "{} {}: {missing:?}", d.kind, d.name);
        }
    }
}

fn small() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(
        prop_oneof![
            Just("*".to_string()),
            Just(String::new()),
            Just("pods".to_string()),
            Just("pods/log".to_string()),
            Just("*/log".to_string()),
            Just("apps".to_string()),
            Just("get".to_string()),
            Just("/api/*".to_string()),
            Just("/api".to_string()),
        ],
        0..3,
    )
}

fn policy_rule() -> impl Strategy<Value = PolicyRule> {
    (small(), small(), small(), small(), small(), any::<bool>()).prop_map(
        |(g, r, v, n, u, urls)| {
            if urls {
                PolicyRule {
                    non_resource_urls: Some(u),
                    verbs: v,
                    ..PolicyRule::default()
                }
            } else {
                PolicyRule {
                    api_groups: Some(g),
                    resources: Some(r),
                    verbs: v,
                    resource_names: Some(n),
                    non_resource_urls: None,
                }
            }
        },
    )
}

fn pick(values: &'static [&'static str]) -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(
        proptest::sample::select(values).prop_map(str::to_string),
        1..3,
    )
}

/// Rules around the escalating permissions.
fn escalating_rule() -> impl Strategy<Value = PolicyRule> {
    (
        pick(&[
            "*",
            "",
            "rbac.authorization.k8s.io",
            "authentication.k8s.io",
            "apps",
        ]),
        pick(&[
            "*",
            "roles",
            "clusterroles",
            "users",
            "userextras/scopes",
            "*/scopes",
            "uids",
            "pods",
        ]),
        pick(&["*", "escalate", "bind", "impersonate", "get"]),
    )
        .prop_map(|(g, r, v)| PolicyRule {
            api_groups: Some(g),
            resources: Some(r),
            verbs: v,
            ..PolicyRule::default()
        })
}

proptest! {
    #[test]
    fn covers_is_reflexive(r in policy_rule()) {
        prop_assert!(policy::rule_covers(&r, &r));
        prop_assert!(policy::covers(std::slice::from_ref(&r), std::slice::from_ref(&r)).0);
    }

    #[test]
    fn a_rule_covers_its_breakdown_and_back(r in policy_rule()) {
        let parts = policy::breakdown(&r);
        for p in &parts {
            prop_assert!(policy::rule_covers(&r, p), "{r:?} does not cover {p:?}");
        }
        prop_assert!(policy::covers(&parts, std::slice::from_ref(&r)).0);
    }

    #[test]
    fn a_wider_rule_cannot_escape_the_escalation_denial(
        r in escalating_rule(), s in escalating_rule(),
    ) {
        if policy::rule_covers(&s, &r)
            && !policy::escalating_grants(std::slice::from_ref(&r)).is_empty()
        {
            prop_assert!(!policy::escalating_grants(std::slice::from_ref(&s)).is_empty(), "{s:?} covers {r:?}");
        }
    }
}

/// A rule that takes every name, label, subject and selector from its
/// trigger (issue 27).
const NAMER: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: namer}
spec:
  trigger: {apiGroup: example.org, kind: Named}
  outputs:
  - kind: ClusterRole
    name: "{{trigger.spec.name}}"
    labels: {"{{trigger.spec.key}}": "{{trigger.spec.value}}"}
    rules: [{apiGroups: [example.org], resources: [things], verbs: [get]}]
  - kind: ClusterRole
    name: "agg-{{trigger.metadata.name}}"
    aggregationRule:
      clusterRoleSelectors: [{matchLabels: {"{{trigger.spec.key}}": "{{trigger.spec.value}}"}}]
  - kind: Role
    namespace: kube-system
    name: "{{trigger.spec.name}}"
    labels: {"{{trigger.spec.key}}": "{{trigger.spec.value}}"}
    rules: [{apiGroups: [example.org], resources: [things], verbs: [get]}]
  - kind: ClusterRoleBinding
    name: "{{trigger.spec.name}}"
    roleRef: {kind: ClusterRole, name: "{{trigger.spec.role}}"}
    subjects:
    - {kind: "{{trigger.spec.kind}}", name: "{{trigger.spec.subject}}"}
    - {kind: Group, name: "{{trigger.spec.name}}"}
"#;

/// Names, label keys and values an attacker would try.
fn protected_ish() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(vec![
            "cluster-admin",
            "admin",
            "edit",
            "view",
            "system:masters",
            "system:authenticated",
            "system:unauthenticated",
            "system:anonymous",
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:serviceaccount:kube-system:default",
            "system:controller:x",
            "system:aggregate-to-edit",
            "rbac-rules",
            "rbac-rules:allow-list",
            "rbac-rules:controller",
            "rbac-rules-x",
            "kubernetes.io/bootstrapping",
            "rbac-defaults",
            "rbac.authorization.k8s.io/aggregate-to-edit",
            "rbacrules.io/aggregate-to-controller",
            "app.kubernetes.io/name",
            "true",
            "fine",
        ])
        .prop_map(str::to_string),
        proptest::string::string_regex("(system:|rbac-rules:)?[a-z:.\\-]{1,10}").expect("regex"),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Whatever the data and the flags: no protected object (by name or
    /// bootstrap label), no aggregation of a protected role, no `system:`
    /// User or Group subject from data, and (unless waived) no binding to
    /// everyone.
    #[test]
    fn data_never_names_a_system_subject_or_a_protected_object(
        name in protected_ish(), key in protected_ish(), value in protected_ish(),
        role in protected_ish(), subject in protected_ish(),
        kind in proptest::sample::select(vec!["User", "Group", "ServiceAccount"]),
        waived in any::<bool>(),
    ) {
        let rules = rbac_rules::rules::parse_text(std::path::Path::new("namer.yaml"), NAMER)
            .expect("namer parses");
        let waivers = rbac_rules::engine::Waivers {
            system_names: waived,
            cluster_admin_bindings: waived,
            escalation_verbs: waived,
            wildcard_all: waived,
            everyone_bindings: waived,
        };
        let engine = Engine::new(&rules, Options { waivers, ..Options::default() });
        let trigger = json!({"apiVersion": "example.org/v1", "kind": "Named",
            "metadata": {"name": "n", "uid": "uid-n"},
            "spec": {"name": name, "key": key, "value": value, "role": role,
                     "subject": subject, "kind": kind}});
        let eval = evaluate(&engine, &[trigger]);
        for d in &eval.desired {
            let o = d.object.to_value();
            let kind_name = o["kind"].as_str().unwrap_or_default();
            prop_assert!(
                policy::protected_object(kind_name, &d.name, |k| o["metadata"]["labels"][k].as_str()).is_none(),
                "{} {} {:?}", d.kind, d.name, o["metadata"]["labels"]
            );
            if let Some(selectors) = o["aggregationRule"]["clusterRoleSelectors"].as_array() {
                let selectors: Vec<_> = selectors.iter()
                    .map(|s| serde_json::from_value(s.clone()).expect("selector"))
                    .collect();
                prop_assert!(!policy::selects_protected_labels(&selectors), "{}: {selectors:?}", d.name);
            }
            for s in o["subjects"].as_array().into_iter().flatten() {
                let (k, n) = (s["kind"].as_str().unwrap_or_default(), s["name"].as_str().unwrap_or_default());
                prop_assert!(!policy::is_system_subject(k, n), "{}: {k} {n}", d.name);
                prop_assert!(waived || !policy::is_everyone(k, n), "{}: {k} {n}", d.name);
            }
        }
    }
}
