//! Issue 41, point 3: aggregates and copies are judged by what they grant
//! (docs/security.md, "Who writes what": the rows "Whoever may label
//! ClusterRoles" and "Whoever may write RbacRules").
//!
//! - A binding of an aggregated ClusterRole a rule makes is judged by what
//!   the roles no rule manages that it aggregates grant: refused (and
//!   revoked) when one breaks a default denial, or misses the allow-list
//!   and was picked by a label the rule chose.
//! - A copy (`rulesFrom`) leaves out a source no rule manages that only the
//!   selector found, and a source policy refuses, with a warning each; the
//!   other sources are copied, in every namespace.

use k8s_openapi::api::rbac::v1::PolicyRule;
use proptest::prelude::*;
use rbac_rules::api::OutputKind;
use rbac_rules::engine::{AllowList, Engine, ErrorKind, Evaluation, Options, RuleSource};
use serde_json::{Value, json};

use support::engine::{builtin, rules, shipped_allow_list, store};
mod support;

fn evaluate(rules: &[RuleSource], objects: &[Value], options: Options) -> Evaluation {
    Engine::new(rules, options).evaluate(&store(objects))
}

fn cluster_role(name: &str, labels: Value, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
           "metadata": {"name": name, "labels": labels, "uid": format!("uid-{name}")},
           "rules": rules})
}

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": {"example.org/team": name}}})
}

fn with_allow(allow: AllowList) -> Options {
    Options {
        allow: Some(allow),
        ..Options::default()
    }
}

/// Argo CD's application controller role, as its manifests install it.
fn argocd_application_controller() -> Value {
    cluster_role(
        "argocd-application-controller",
        json!({"app.kubernetes.io/component": "application-controller",
               "app.kubernetes.io/name": "argocd-application-controller",
               "app.kubernetes.io/part-of": "argocd"}),
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
               {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
    )
}

/// Argo CD's server role: not `*` verbs, but get, patch and delete on
/// everything (outside any sensible allow-list).
fn argocd_server() -> Value {
    cluster_role(
        "argocd-server",
        json!({"app.kubernetes.io/component": "server",
               "app.kubernetes.io/name": "argocd-server",
               "app.kubernetes.io/part-of": "argocd"}),
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["delete", "get", "patch"]}]),
    )
}

/// Crossplane's RBAC manager role, as its chart installs it: it writes
/// roles and bindings for others, so it holds escalate and bind.
fn crossplane_rbac_manager() -> Value {
    cluster_role(
        "crossplane-rbac-manager",
        json!({"app": "crossplane", "app.kubernetes.io/component": "cloud-infrastructure-controller",
               "app.kubernetes.io/part-of": "crossplane", "helm.sh/chart": "crossplane-2.3.4"}),
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles", "roles"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "escalate", "bind"]},
               {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterrolebindings", "rolebindings"],
                "verbs": ["*"]}]),
    )
}

/// A rule that aggregates the ClusterRoles `selector` picks and binds the
/// aggregate cluster-wide and in a namespace.
fn aggregate_and_bind(selector: &str) -> Vec<RuleSource> {
    rules(&format!(
        r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: gatherer}}
spec:
  outputs:
  - kind: ClusterRole
    name: gathered
    aggregationRule:
      clusterRoleSelectors: [{{matchLabels: {selector}}}]
  - kind: ClusterRoleBinding
    name: gathered
    roleRef: {{kind: ClusterRole, name: gathered}}
    subjects: [{{kind: Group, name: platform}}]
  - kind: RoleBinding
    namespace: team-a
    name: gathered
    roleRef: {{kind: ClusterRole, name: gathered}}
    subjects: [{{kind: Group, name: team-a}}]
"#
    ))
}

fn desired(eval: &Evaluation, kind: OutputKind, name: &str) -> bool {
    eval.desired
        .iter()
        .any(|d| d.kind == kind && d.name == name)
}

fn revoked(eval: &Evaluation, kind: OutputKind, ns: &str, name: &str) -> Option<String> {
    eval.revoked
        .get(&(kind, ns.to_string(), name.to_string()))
        .cloned()
}

/// A rule author who selects third parties' roles by the labels they were
/// installed with, and binds the aggregate, has both bindings refused and
/// revoked, the reason naming the role and what it grants; with or
/// without the shipped allow-list. The aggregate itself is kept (Kubernetes
/// fills it whatever this controller does), with a notice.
#[test]
fn binding_an_aggregate_of_third_party_roles_is_refused() {
    for (selector, role, needle) in [
        (
            r#"{app.kubernetes.io/part-of: argocd}"#,
            argocd_application_controller(),
            "cluster-admin equivalent",
        ),
        (
            r#"{app: crossplane}"#,
            crossplane_rbac_manager(),
            "clusterroles: escalate",
        ),
    ] {
        let name = role["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for options in [Options::default(), with_allow(shipped_allow_list())] {
            let eval = evaluate(
                &aggregate_and_bind(selector),
                std::slice::from_ref(&role),
                options,
            );
            assert!(desired(&eval, OutputKind::ClusterRole, "gathered"));
            assert!(
                !desired(&eval, OutputKind::ClusterRoleBinding, "gathered"),
                "{name}"
            );
            assert!(
                !desired(&eval, OutputKind::RoleBinding, "gathered"),
                "{name}"
            );
            for (kind, ns) in [
                (OutputKind::ClusterRoleBinding, ""),
                (OutputKind::RoleBinding, "team-a"),
            ] {
                let why = revoked(&eval, kind, ns, "gathered").expect("revoked");
                assert!(why.contains(&format!("ClusterRole {name:?}")), "{why}");
                assert!(why.contains("no rule manages it"), "{why}");
                assert!(why.contains(needle), "{why}");
            }
            let errors: Vec<_> = eval.errors().collect();
            assert_eq!(errors.len(), 2, "{errors:?}");
            assert!(
                errors
                    .iter()
                    .all(|e| e.kind == ErrorKind::EscalationDenied && e.rule == "gatherer")
            );
        }
    }
}

/// Argo CD's server role breaks no default denial but grants patch and
/// delete on everything: under the shipped allow-list, a binding of an
/// aggregate that picks it by its installed labels is refused; without an
/// allow-list the default denials alone judge, and it passes.
#[test]
fn a_third_party_role_outside_the_allow_list_refuses_the_binding_that_picks_it() {
    let rules = aggregate_and_bind(r#"{app.kubernetes.io/part-of: argocd}"#);
    let eval = evaluate(&rules, &[argocd_server()], with_allow(shipped_allow_list()));
    let why = revoked(&eval, OutputKind::ClusterRoleBinding, "", "gathered").expect("revoked");
    assert!(why.contains("\"argocd-server\""), "{why}");
    assert!(why.contains("what the allow-list does not"), "{why}");
    let eval = evaluate(&rules, &[argocd_server()], Options::default());
    assert!(desired(&eval, OutputKind::ClusterRoleBinding, "gathered"));
}

/// The shipped Crossplane rules bind crossplane-admin to
/// crossplane:masters. Someone who labels an escalating role into it
/// (Kubernetes lets them only if they hold escalate, bind or `*` already:
/// an admin in all but name) gets the binding refused and revoked — this
/// controller never writes a binding that grants that. Someone who labels
/// in a role that only misses the allow-list (a powerful user, not an
/// admin) revokes nothing: crossplane-admin's users keep their access, and
/// the rule gets a notice naming the role.
#[test]
fn a_role_labelled_into_a_shipped_crossplane_aggregate() {
    let options = with_allow(shipped_allow_list());
    let escalating = cluster_role(
        "someones-rbac-writer",
        json!({"rbac.crossplane.io/aggregate-to-admin": "true"}),
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind", "escalate"]}]),
    );
    let eval = evaluate(&builtin(), &[escalating], options.clone());
    assert!(desired(&eval, OutputKind::ClusterRole, "crossplane-admin"));
    let why = revoked(
        &eval,
        OutputKind::ClusterRoleBinding,
        "",
        "crossplane-admin",
    )
    .expect("revoked");
    assert!(why.contains("\"someones-rbac-writer\""), "{why}");
    assert!(why.contains("escalate"), "{why}");

    let jobs = cluster_role(
        "batch-jobs",
        json!({"rbac.crossplane.io/aggregate-to-admin": "true"}),
        json!([{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["*"]}]),
    );
    let eval = evaluate(&builtin(), &[jobs], options);
    assert!(desired(
        &eval,
        OutputKind::ClusterRoleBinding,
        "crossplane-admin"
    ));
    assert!(eval.revoked.is_empty(), "{:?}", eval.revoked);
    let notices: Vec<_> = eval.notices().collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0].kind, ErrorKind::UnmanagedAggregation);
    assert!(notices[0].message.contains("\"batch-jobs\""));
}

const COPIES: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: bases}
spec:
  outputs:
  - kind: ClusterRole
    name: base-configmaps
    labels: {example.org/copy: "true"}
    rules: [{apiGroups: [""], resources: [configmaps], verbs: [get, list]}]
  - kind: ClusterRole
    name: base-escalating
    labels: {example.org/copy: "true"}
    rules: [{apiGroups: [rbac.authorization.k8s.io], resources: [roles], verbs: [escalate]}]
  - kind: ClusterRole
    name: base-events
    labels: {example.org/copy: "true"}
    rules: [{apiGroups: [""], resources: [events], verbs: [get]}]
---
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: copies}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: Role
    name: team
    rulesFrom:
      clusterRoleSelector: {matchLabels: {example.org/copy: "true"}}
      clusterRoleNames: [named-reader, named-escalating]
"#;

fn rules_json(eval: &Evaluation, ns: &str, name: &str) -> Value {
    eval.desired
        .iter()
        .find(|d| d.kind == OutputKind::Role && d.namespace == ns && d.name == name)
        .map(|d| d.object.to_value()["rules"].clone())
        .unwrap_or(Value::Null)
}

fn policy_rules(v: &Value) -> Vec<PolicyRule> {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

/// Through `rulesFrom`: a third party's role the selector finds is left out
/// (its labels are data); a refused leaf a rule emits is left out (it is
/// refused alone); a role named in `clusterRoleNames` (the rule author's
/// choice) is copied unless policy refuses it. Every namespace's Role is
/// kept with the other sources, nothing is revoked, and each left-out
/// source is a warning naming it and why.
#[test]
fn copies_leave_out_third_party_and_refused_sources_and_copy_the_rest() {
    let mut objects = vec![namespace("team-a"), namespace("team-b")];
    // A third party's role that someone labelled for the copy.
    let mut argo = argocd_application_controller();
    argo["metadata"]["labels"]["example.org/copy"] = json!("true");
    objects.push(argo);
    // An innocent one: left out all the same (no rule chose it).
    objects.push(cluster_role(
        "innocent-third-party",
        json!({"example.org/copy": "true"}),
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
    ));
    // One that someone labelled as ours too, naming no rule: still no
    // rule's.
    objects.push(cluster_role(
        "forged-ours",
        json!({"example.org/copy": "true", "app.kubernetes.io/managed-by": "rbac-rules"}),
        json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]),
    ));
    objects.push(cluster_role(
        "named-reader",
        json!({}),
        json!([{"apiGroups": [""], "resources": ["services"], "verbs": ["get"]}]),
    ));
    objects.push(cluster_role(
        "named-escalating",
        json!({}),
        json!([{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"]}]),
    ));
    // The copies as the controller wrote them before: live, managed.
    for ns in ["team-a", "team-b"] {
        objects.push(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "team", "namespace": ns, "uid": format!("uid-team-{ns}"),
                         "labels": {"app.kubernetes.io/managed-by": "rbac-rules"},
                         "annotations": {"rbacrules.io/rule": "copies",
                                         "rbacrules.io/trigger": format!("Namespace/{ns}")}},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}),
        );
    }
    for options in [Options::default(), with_allow(shipped_allow_list())] {
        let eval = evaluate(&rules(COPIES), &objects, options);
        // The refused leaf is refused alone.
        assert!(revoked(&eval, OutputKind::ClusterRole, "", "base-escalating").is_some());
        for ns in ["team-a", "team-b"] {
            assert!(
                revoked(&eval, OutputKind::Role, ns, "team").is_none(),
                "{:?}",
                eval.revoked
            );
            let copied = policy_rules(&rules_json(&eval, ns, "team"));
            let want = policy_rules(&json!([
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["services"], "verbs": ["get"]},
            ]));
            let (all, _) = rbac_rules::policy::covers(&copied, &want);
            assert!(all, "{ns}: {copied:?}");
            let (within, extra) = rbac_rules::policy::covers(&want, &copied);
            assert!(
                within,
                "{ns}: copied more than its innocent sources: {extra:?}"
            );
        }
        let warnings: Vec<_> = eval.warnings().filter(|w| w.rule == "copies").collect();
        for (source, why) in [
            ("argocd-application-controller", "no rule manages it"),
            ("innocent-third-party", "no rule manages it"),
            ("forged-ours", "no rule manages it"),
            ("base-escalating", "left out of the copy: it grants"),
            ("named-escalating", "impersonate"),
        ] {
            for ns in ["team-a", "team-b"] {
                assert!(
                    warnings.iter().any(|w| w.value == source
                        && w.message.contains(why)
                        && w.trigger.as_deref().is_some_and(|t| t.ends_with(ns))
                        && w.field == "spec.outputs[0].rulesFrom"),
                    "{source} {ns}: {warnings:?}"
                );
            }
        }
        assert!(
            eval.errors().all(|e| e.rule == "bases"),
            "{:?}",
            eval.errors().collect::<Vec<_>>()
        );
    }
}

/// What labellers may write: ClusterRoles with any of these labels and
/// rules.
const LABELS: [(&str, &str); 4] = [
    ("example.org/pick", "true"),
    ("rbac.crossplane.io/aggregate-to-edit", "true"),
    ("app.kubernetes.io/part-of", "argocd"),
    ("example.org/copy", "true"),
];

fn grant(i: u8) -> Value {
    match i % 6 {
        0 => json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}),
        1 => json!({"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}),
        2 => json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}),
        3 => {
            json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"]})
        }
        4 => json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "patch"]}),
        _ => json!({"apiGroups": [""], "resources": ["events"], "verbs": ["list"]}),
    }
}

const SELECTING: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: selecting}
spec:
  outputs:
  - kind: ClusterRole
    name: agg-pick
    aggregationRule: {clusterRoleSelectors: [{matchLabels: {example.org/pick: "true"}}]}
  - kind: ClusterRole
    name: agg-channel
    aggregationRule: {clusterRoleSelectors: [{matchLabels: {rbac.crossplane.io/aggregate-to-edit: "true"}}]}
  - kind: ClusterRole
    name: agg-argo
    aggregationRule: {clusterRoleSelectors: [{matchLabels: {app.kubernetes.io/part-of: argocd}}]}
  - kind: ClusterRole
    name: emitted-leaf
    labels: {example.org/copy: "true", example.org/pick: "true"}
    rules: [{apiGroups: [""], resources: [configmaps], verbs: [list]}]
  - kind: ClusterRoleBinding
    name: agg-pick
    roleRef: {kind: ClusterRole, name: agg-pick}
    subjects: [{kind: Group, name: pickers}]
  - kind: ClusterRoleBinding
    name: agg-channel
    roleRef: {kind: ClusterRole, name: agg-channel}
    subjects: [{kind: Group, name: editors}]
  - kind: RoleBinding
    namespace: team-a
    name: agg-argo
    roleRef: {kind: ClusterRole, name: agg-argo}
    subjects: [{kind: Group, name: argo}]
---
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: copying}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: Role
    name: copy
    rulesFrom:
      clusterRoleSelector: {matchLabels: {example.org/copy: "true"}}
      clusterRoleNames: [role-0]
"#;

fn selectors_of(agg: &Value) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector> {
    serde_json::from_value(agg["aggregationRule"]["clusterRoleSelectors"].clone())
        .unwrap_or_default()
}

fn selected(
    selectors: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector],
    o: &Value,
) -> bool {
    let labels = o["metadata"]["labels"].as_object();
    selectors
        .iter()
        .any(|s| rbac_rules::selector::matches_json(s, labels))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Over labellers' writes (live ClusterRoles no rule manages, with
    /// random labels and rules, some escalating, some outside the
    /// allow-list): no desired binding's effective grant breaks a default
    /// denial, nor misses the allow-list through a role picked by a label
    /// the rule chose; no copy holds a left-out source's grant, and every
    /// innocent source (a rule's, or one the rule names) is copied.
    #[test]
    fn labellers_never_widen_a_binding_or_a_copy_past_policy(
        written in prop::collection::vec((prop::collection::vec(any::<bool>(), 4), prop::collection::vec(any::<u8>(), 1..3)), 0..6),
        allow in any::<bool>(),
    ) {
        let allow_list = shipped_allow_list();
        let options = if allow { with_allow(allow_list.clone()) } else { Options::default() };
        let mut objects = vec![namespace("team-a"), namespace("team-b")];
        for (i, (labels, grants)) in written.iter().enumerate() {
            let labels: serde_json::Map<String, Value> = LABELS
                .iter()
                .zip(labels)
                .filter(|(_, on)| **on)
                .map(|((k, v), _)| (k.to_string(), json!(v)))
                .collect();
            let rules: Vec<Value> = grants.iter().map(|g| grant(*g)).collect();
            objects.push(cluster_role(&format!("role-{i}"), Value::Object(labels), json!(rules)));
        }
        let eval = evaluate(&rules(SELECTING), &objects, options.clone());
        let effective = options.allow.as_ref().map(|a| (a, a.rules.as_slice()));
        let waivers = &options.waivers;
        let passes = |rules: &[PolicyRule]| rbac_rules::policy::copy_refusal(rules, waivers, effective).is_none();
        let live: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "ClusterRole").collect();
        // Bindings of aggregates.
        for d in &eval.desired {
            let v = d.object.to_value();
            if !d.kind.as_str().ends_with("Binding") {
                continue;
            }
            let role = v["roleRef"]["name"].as_str().unwrap_or_default();
            let agg = eval.desired.iter().find(|a| a.kind == OutputKind::ClusterRole && a.name == role);
            let Some(agg) = agg.map(|a| a.object.to_value()) else { continue };
            let selectors = selectors_of(&agg);
            for m in live.iter().filter(|m| selected(&selectors, m)) {
                let rules = policy_rules(&m["rules"]);
                prop_assert!(rbac_rules::policy::denied_grants(&rules, waivers).is_empty(),
                    "binding {} grants a denial through {}", d.name, m["metadata"]["name"]);
                let joined = rbac_rules::policy::joined_by_aggregation_label(&selectors, m["metadata"]["labels"].as_object());
                if !joined {
                    prop_assert!(passes(&rules),
                        "binding {} misses the allow-list through {}", d.name, m["metadata"]["name"]);
                }
            }
        }
        // Copies.
        let leaf = policy_rules(&json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]));
        let mut innocent: Vec<PolicyRule> = leaf.clone();
        let mut guilty: Vec<Vec<PolicyRule>> = Vec::new();
        for m in &live {
            let rules = policy_rules(&m["rules"]);
            let named = m["metadata"]["name"] == "role-0";
            if named && passes(&rules) {
                innocent.extend(rules);
            } else if selected(&selectors_of(&json!({"aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.org/copy": "true"}}]}})), m) || named {
                guilty.push(rules);
            }
        }
        for ns in ["team-a", "team-b"] {
            let copied = policy_rules(&rules_json(&eval, ns, "copy"));
            prop_assert!(revoked(&eval, OutputKind::Role, ns, "copy").is_none());
            prop_assert!(rbac_rules::policy::covers(&copied, &innocent).0, "{ns}: innocent sources not copied: {copied:?}");
            prop_assert!(rbac_rules::policy::covers(&innocent, &copied).0, "{ns}: copied more than the innocent sources: {copied:?}");
            for g in &guilty {
                let (_, missing) = rbac_rules::policy::covers(&innocent, g);
                if !missing.is_empty() {
                    prop_assert!(!rbac_rules::policy::covers(&copied, &missing).0, "{ns}: a left-out source's grant was copied");
                }
            }
        }
        // The engine agrees with the reference here too.
        let want = rbac_rules::reference::evaluate(&rules(SELECTING), &options, &store(&objects));
        prop_assert_eq!(&eval.desired, &want.desired);
        prop_assert_eq!(&eval.revoked, &want.revoked);
    }
}

const WATCHED: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: gatherer}
spec:
  outputs:
  - kind: ClusterRole
    name: gathered
    aggregationRule:
      clusterRoleSelectors: [{matchLabels: {example.org/pick: "true"}}]
  - kind: ClusterRoleBinding
    name: gathered
    roleRef: {kind: ClusterRole, name: gathered}
    subjects: [{kind: Group, name: platform}]
---
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: copies}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: Role
    name: team
    rulesFrom:
      clusterRoleSelector: {matchLabels: {example.org/copy: "true"}}
      clusterRoleNames: [named]
"#;

/// A labeller's write to a live ClusterRole no rule manages (its labels or
/// its rules) reaches the copies and bindings that select it, and only
/// those: the copies' triggers are rendered again (the aggregate's rule is
/// not: it reads no role), the binding judged again, and the result is a
/// full evaluation's.
#[test]
fn a_labellers_write_rejudges_what_selects_the_role() {
    const NAMESPACES: usize = 5;
    let rules = rules(WATCHED);
    let engine = Engine::new(&rules, Options::default());
    let mut objects: Vec<Value> = (0..NAMESPACES)
        .map(|i| namespace(&format!("team-{i}")))
        .collect();
    objects.push(cluster_role(
        "named",
        json!({}),
        json!([{"apiGroups": [""], "resources": ["services"], "verbs": ["get"]}]),
    ));
    objects.push(cluster_role(
        "bystander",
        json!({}),
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    ));
    let mut s = store(&objects);
    let mut memo = rbac_rules::engine::Memo::new();
    let check = |s: &rbac_rules::engine::ObjectStore, memo: &mut rbac_rules::engine::Memo| {
        let got = engine.evaluate_incremental(s, memo);
        let full = Engine::new(&rules, Options::default()).evaluate(s);
        assert_eq!(got.desired, full.desired);
        assert_eq!(got.revoked, full.revoked);
        assert_eq!(got.reports, full.reports);
        got
    };
    let eval = check(&s, &mut memo);
    assert!(desired(&eval, OutputKind::ClusterRoleBinding, "gathered"));
    let relabel = |s: &mut rbac_rules::engine::ObjectStore, labels: Value, rules: Value| {
        s.insert(cluster_role("bystander", labels, rules))
            .expect("role");
    };

    // Labelled for the copies: every namespace's copy renders again and
    // leaves it out, with a warning; the binding stands.
    relabel(
        &mut s,
        json!({"example.org/copy": "true"}),
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    );
    let eval = check(&s, &mut memo);
    assert_eq!(memo.renders(), NAMESPACES);
    assert_eq!(
        eval.warnings().filter(|w| w.value == "bystander").count(),
        NAMESPACES
    );
    assert!(desired(&eval, OutputKind::ClusterRoleBinding, "gathered"));
    assert_eq!(
        eval.desired
            .iter()
            .filter(|d| d.kind == OutputKind::Role)
            .count(),
        NAMESPACES
    );

    // Labelled into the aggregate instead: the copies render again (it
    // left their selection), the binding is refused.
    relabel(
        &mut s,
        json!({"example.org/pick": "true"}),
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    );
    let eval = check(&s, &mut memo);
    assert_eq!(memo.renders(), NAMESPACES);
    assert_eq!(eval.warnings().count(), 0);
    assert!(revoked(&eval, OutputKind::ClusterRoleBinding, "", "gathered").is_some());

    // Its rules made harmless: nothing renders again (no copy selects
    // it), the binding is judged again and desired.
    relabel(
        &mut s,
        json!({"example.org/pick": "true"}),
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
    );
    let eval = check(&s, &mut memo);
    assert_eq!(memo.renders(), 0);
    assert!(desired(&eval, OutputKind::ClusterRoleBinding, "gathered"));
    assert!(eval.revoked.is_empty());

    // The named source made escalating: the copies render again and leave
    // it out.
    s.insert(cluster_role(
        "named",
        json!({}),
        json!([{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"]}]),
    ))
    .expect("role");
    let eval = check(&s, &mut memo);
    assert_eq!(memo.renders(), NAMESPACES);
    assert_eq!(
        eval.warnings().filter(|w| w.value == "named").count(),
        NAMESPACES
    );
    assert!(eval.revoked.is_empty(), "{:?}", eval.revoked);
}
