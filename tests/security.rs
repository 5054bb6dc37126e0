//! Issue 11: each finding, asserting the secure outcome. Offline, through
//! the engine (and `render` for the CLI's refusal).

use rbac_rules::api::OutputKind;
use rbac_rules::engine::{AllowList, Engine, ErrorKind, Evaluation, Options, RuleSource, Waivers};
use serde_json::{Value, json};

mod engine_support;
use engine_support::{builtin, rules, store};

fn evaluate(rules: &[RuleSource], objects: &[Value], options: Options) -> Evaluation {
    Engine::new(rules, options).evaluate(&store(objects))
}

const POLICY_FIELDS: [&str; 5] = [
    "apiGroups",
    "resources",
    "verbs",
    "resourceNames",
    "nonResourceURLs",
];

/// Every `*`-bearing entry of the policy fields of the objects rendered for
/// a trigger whose reference contains `trigger`, except verbs (built-in
/// rules write `*` verbs literally).
fn wildcards_from(eval: &Evaluation, trigger: &str) -> Vec<String> {
    let mut out = Vec::new();
    for d in &eval.desired {
        if !d.trigger.as_deref().is_some_and(|t| t.contains(trigger)) {
            continue;
        }
        for r in d.object.to_value()["rules"]
            .as_array()
            .into_iter()
            .flatten()
        {
            for f in POLICY_FIELDS.iter().filter(|f| **f != "verbs") {
                for v in r[*f].as_array().into_iter().flatten() {
                    // The one wildcard the built-in rules write literally
                    // (rules/crossplane-provider.yaml: finalizers of every
                    // type in the revision's groups).
                    if v == "*/finalizers" {
                        continue;
                    }
                    if v.as_str().is_some_and(|s| s.contains('*')) {
                        out.push(format!("{} {}: {f} {v}", d.kind, d.name));
                    }
                }
            }
        }
    }
    out
}

fn xrd(name: &str, group: &str, plural: &str) -> Value {
    json!({"apiVersion": "apiextensions.crossplane.io/v1", "kind": "CompositeResourceDefinition",
           "metadata": {"name": name, "uid": format!("uid-{name}")},
           "spec": {"group": group, "names": {"kind": "X", "plural": plural},
                    "claimNames": {"kind": "C", "plural": plural},
                    "versions": [{"name": "v1", "served": true, "referenceable": true}]}})
}

fn provider_revision(name: &str, crds: &[&str]) -> Value {
    let refs: Vec<Value> = crds
        .iter()
        .map(|c| json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "name": c}))
        .collect();
    json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
           "metadata": {"name": name, "uid": format!("uid-{name}")},
           "spec": {"image": "xpkg.crossplane.io/example/provider-x:v1"},
           "status": {"objectRefs": refs}})
}

/// Finding 1: an XRD's group or plural `*` never becomes a wildcard grant,
/// and a good XRD beside it still renders.
#[test]
fn xrd_wildcards_never_become_grants() {
    for (group, plural) in [
        ("*", "xbuckets"),
        ("example.org", "*"),
        ("*", "*"),
        ("x.*", "xs"),
        ("*.example.org", "xs"),
        ("example.org", "xs/*"),
    ] {
        let eval = evaluate(
            &builtin(),
            &[
                xrd("evil", group, plural),
                xrd("good", "storage.example.org", "xbuckets"),
            ],
            Options::default(),
        );
        let bad = wildcards_from(&eval, "/evil");
        assert!(bad.is_empty(), "group {group:?} plural {plural:?}: {bad:?}");
        assert!(
            eval.desired
                .iter()
                .any(|d| d.name == "crossplane:composite:good:aggregate-to-edit"),
            "the good XRD still renders ({group:?}, {plural:?})"
        );
    }
}

/// Finding 1: ProviderRevision objectRefs `*.*`, `x.*`, `*.apps` … never
/// become wildcard grants.
#[test]
fn provider_object_refs_never_become_wildcards() {
    for crd in [
        "*.*",
        "x.*",
        "*.apps",
        "*.rbac.authorization.k8s.io",
        "widgets.*",
    ] {
        let eval = evaluate(
            &builtin(),
            &[provider_revision(
                "provider-evil-1",
                &[crd, "widgets.example.org"],
            )],
            Options::default(),
        );
        let bad = wildcards_from(&eval, "provider-evil-1");
        assert!(bad.is_empty(), "{crd:?}: {bad:?}");
        // The well-formed type beside it is still granted.
        assert!(
            eval.desired.iter().any(|d| d.name
                == "crossplane:provider:provider-evil-1:aggregate-to-edit"
                && d.object.to_value()["rules"]
                    .to_string()
                    .contains("\"widgets\"")),
            "{crd:?}: the good type is not granted"
        );
    }
}

/// A rule that copies trigger fields into every policy field.
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
    - apiGroups: ["{{trigger.spec.group}}"]
      resources: ["{{trigger.spec.resource}}", {forEach: trigger.spec.more, item: "{{item}}"}]
      verbs: ["{{trigger.spec.verb}}"]
      resourceNames: ["{{trigger.spec.name}}"]
    - nonResourceURLs: ["{{trigger.spec.url}}"]
      verbs: [get]
    - apiGroups: [example.org]
      resources: ["*"]
      verbs: ["*"]
"#;

fn thing(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "example.org/v1", "kind": "Thing",
           "metadata": {"name": name, "uid": format!("uid-{name}")}, "spec": spec})
}

fn thing_spec() -> Value {
    json!({"group": "example.org", "resource": "widgets", "more": ["gadgets"], "verb": "get",
           "name": "one", "url": "/healthz"})
}

/// Values are data: `*` from a trigger is refused, naming rule, field and
/// trigger; a literal `*` in the rule stays a wildcard.
#[test]
fn data_is_never_a_wildcard_literal_is() {
    let ok = evaluate(
        &rules(COPIER),
        &[thing("a", thing_spec())],
        Options::default(),
    );
    assert!(
        ok.errors().next().is_none(),
        "{:?}",
        ok.errors().collect::<Vec<_>>()
    );
    assert_eq!(ok.desired.len(), 1);
    assert_eq!(
        ok.desired
            .iter()
            .next()
            .expect("an object")
            .object
            .to_value()["rules"][2]["resources"],
        json!(["*"])
    );

    for (key, value, field) in [
        ("group", json!("*"), "spec.outputs[0].rules[0].apiGroups[0]"),
        (
            "resource",
            json!("*"),
            "spec.outputs[0].rules[0].resources[0]",
        ),
        (
            "resource",
            json!("pods/*"),
            "spec.outputs[0].rules[0].resources[0]",
        ),
        (
            "more",
            json!(["*"]),
            "spec.outputs[0].rules[0].resources[1]",
        ),
        ("verb", json!("*"), "spec.outputs[0].rules[0].verbs[0]"),
        (
            "name",
            json!("*"),
            "spec.outputs[0].rules[0].resourceNames[0]",
        ),
        (
            "url",
            json!("/*"),
            "spec.outputs[0].rules[1].nonResourceURLs[0]",
        ),
        (
            "url",
            json!("*"),
            "spec.outputs[0].rules[1].nonResourceURLs[0]",
        ),
    ] {
        let mut spec = thing_spec();
        spec[key] = value.clone();
        let eval = evaluate(&rules(COPIER), &[thing("a", spec)], Options::default());
        let errs: Vec<_> = eval.errors().collect();
        assert_eq!(errs.len(), 1, "{key}={value}: {errs:?}");
        assert_eq!(errs[0].kind, ErrorKind::EscalationDenied, "{key}={value}");
        assert_eq!(errs[0].field, field, "{key}={value}");
        assert_eq!(errs[0].trigger.as_deref(), Some("Thing.example.org/a"));
        assert!(eval.desired.is_empty());
        // A refusal, not a failure: the object is revoked, not kept.
        assert!(
            eval.revoked
                .contains_key(&(OutputKind::ClusterRole, String::new(), "copier-a".into())),
            "{key}={value}: {:?}",
            eval.revoked
        );
        assert!(!eval.keeps("copier", Some("Thing.example.org/a")));
    }
}

/// Values from data must be names of their kind: no built-in-looking
/// grammar, no unknown verbs, no malformed groups or URLs.
#[test]
fn data_values_must_be_names_of_their_kind() {
    for (key, value) in [
        ("group", "Example.org"),
        ("group", "a..b"),
        ("group", "example.org "),
        ("resource", "Widgets"),
        ("resource", "a/b/c"),
        ("resource", "widgets.example.org"),
        ("verb", "frobnicate"),
        ("verb", "GET"),
        ("name", "a/b"),
        ("name", ""),
        ("url", "healthz"),
        ("url", "/a b"),
    ] {
        let mut spec = thing_spec();
        spec[key] = json!(value);
        let eval = evaluate(&rules(COPIER), &[thing("a", spec)], Options::default());
        assert!(eval.desired.is_empty(), "{key}={value:?} was accepted");
        assert!(eval.errors().next().is_some(), "{key}={value:?}");
    }
    // A custom verb written literally is fine.
    let literal = COPIER.replace("verbs: [get]", "verbs: [frobnicate]");
    let eval = evaluate(
        &rules(&literal),
        &[thing("a", thing_spec())],
        Options::default(),
    );
    assert_eq!(
        eval.desired.len(),
        1,
        "{:?}",
        eval.errors().collect::<Vec<_>>()
    );
}

/// A RepoSync-like rule: the tenant picks the role by annotation.
const BINDER: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: binder}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: RoleBinding
    name: tenant
    roleRef: {kind: ClusterRole, name: "{{trigger.metadata.annotations.role}}"}
    subjects: [{kind: ServiceAccount, name: syncer, namespace: "{{trigger.metadata.name}}"}]
"#;

fn ns(name: &str, role: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "uid": format!("uid-{name}"), "annotations": {"role": role}}})
}

/// Finding 3: no binding to cluster-admin or system:* roles unless waived.
#[test]
fn bindings_to_cluster_admin_or_system_roles_are_refused() {
    for role in [
        "cluster-admin",
        "system:aggregate-to-edit",
        "system:masters",
    ] {
        let eval = evaluate(&rules(BINDER), &[ns("team-a", role)], Options::default());
        assert!(eval.desired.is_empty(), "{role}");
        let errs: Vec<_> = eval.errors().collect();
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].kind, ErrorKind::EscalationDenied);
        assert!(
            errs[0]
                .message
                .contains(&format!("RoleBinding \"tenant\" binds {role:?}")),
            "{}",
            errs[0].message
        );
        assert_eq!(errs[0].trigger.as_deref(), Some("Namespace/team-a"));
        assert!(eval.revoked.contains_key(&(
            OutputKind::RoleBinding,
            "team-a".into(),
            "tenant".into()
        )));
        let waived = Options {
            waivers: Waivers {
                cluster_admin_bindings: true,
                ..Waivers::default()
            },
            ..Options::default()
        };
        let eval = evaluate(&rules(BINDER), &[ns("team-a", role)], waived);
        assert_eq!(eval.desired.len(), 1, "{role} with the waiver");
    }
    let eval = evaluate(&rules(BINDER), &[ns("team-a", "view")], Options::default());
    assert_eq!(eval.desired.len(), 1);
}

/// Finding 3: no object named system:*.
#[test]
fn system_names_are_refused() {
    let rule = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: namer}
spec:
  trigger: {apiGroup: example.org, kind: Thing}
  outputs:
  - kind: ClusterRole
    name: "{{trigger.spec.name}}"
    rules: [{apiGroups: [example.org], resources: [things], verbs: [get]}]
"#;
    let eval = evaluate(
        &rules(rule),
        &[
            thing("a", json!({"name": "system:controller:x"})),
            thing("b", json!({"name": "fine"})),
        ],
        Options::default(),
    );
    let names: Vec<_> = eval.desired.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["fine"]);
    let e = eval.errors().next().expect("an error");
    assert_eq!(e.kind, ErrorKind::EscalationDenied);
    assert!(e.message.contains("system:"), "{}", e.message);
    let waived = Options {
        waivers: Waivers {
            system_names: true,
            ..Waivers::default()
        },
        ..Options::default()
    };
    let eval = evaluate(
        &rules(rule),
        &[thing("a", json!({"name": "system:x"}))],
        waived,
    );
    assert_eq!(eval.desired.len(), 1);
}

fn role_rule(groups: &str, resources: &str, verbs: &str) -> Vec<RuleSource> {
    rules(&format!(
        r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: granter}}
spec:
  outputs:
  - kind: ClusterRole
    name: x
    rules: [{{apiGroups: {groups}, resources: {resources}, verbs: {verbs}}}]
"#
    ))
}

/// Finding 3: escalate, bind and impersonate are refused, judged with
/// RBAC's wildcards; cluster-admin equivalents too; `*` within a named
/// group stays allowed.
#[test]
fn escalating_grants_are_refused() {
    let refused = [
        (
            "[rbac.authorization.k8s.io]",
            "[clusterroles]",
            "[escalate]",
            "ClusterRole \"x\" grants [rbac.authorization.k8s.io] clusterroles: escalate",
        ),
        (
            "[rbac.authorization.k8s.io]",
            "[roles]",
            "[bind]",
            "[rbac.authorization.k8s.io] roles: bind",
        ),
        (
            "['']",
            "[users, groups]",
            "[impersonate]",
            "[\"\"] users: impersonate",
        ),
        (
            "['']",
            "[serviceaccounts]",
            "['*']",
            "[\"\"] serviceaccounts: impersonate",
        ),
        (
            "[authentication.k8s.io]",
            "[userextras/scopes]",
            "[impersonate]",
            "userextras/scopes: impersonate",
        ),
        (
            "[authentication.k8s.io]",
            "[uids]",
            "[impersonate]",
            "uids: impersonate",
        ),
        ("['*']", "[roles]", "['*']", "roles: escalate"),
        (
            "[rbac.authorization.k8s.io]",
            "['*']",
            "[bind]",
            "clusterroles: bind",
        ),
        ("['*']", "['*']", "['*']", "cluster-admin equivalent"),
    ];
    for (g, r, v, needle) in refused {
        let eval = evaluate(&role_rule(g, r, v), &[], Options::default());
        assert!(eval.desired.is_empty(), "{g} {r} {v}");
        let e = eval.errors().next().expect("refused");
        assert_eq!(e.kind, ErrorKind::EscalationDenied);
        assert!(e.message.contains(needle), "{g} {r} {v}: {}", e.message);
        let waived = Options {
            waivers: Waivers {
                escalation_verbs: true,
                wildcard_all: true,
                ..Waivers::default()
            },
            ..Options::default()
        };
        assert_eq!(evaluate(&role_rule(g, r, v), &[], waived).desired.len(), 1);
    }
    for (g, r, v) in [
        ("[example.org]", "['*']", "['*']"),
        ("['*']", "[deployments]", "[get]"),
        ("['']", "[pods]", "['*']"),
    ] {
        let eval = evaluate(&role_rule(g, r, v), &[], Options::default());
        assert_eq!(
            eval.desired.len(),
            1,
            "{g} {r} {v}: {:?}",
            eval.errors().collect::<Vec<_>>()
        );
    }
}

/// An aggregated ClusterRole is judged on what it aggregates.
#[test]
fn aggregated_roles_are_judged_on_what_they_select() {
    let rule = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: gatherer}
spec:
  outputs:
  - kind: ClusterRole
    name: gatherer
    aggregationRule:
      clusterRoleSelectors: [{matchLabels: {example.org/power: "true"}}]
"#;
    let admin = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "powerful", "labels": {"example.org/power": "true"}},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]});
    let eval = evaluate(&rules(rule), &[admin], Options::default());
    assert!(eval.desired.is_empty());
    let e = eval.errors().next().expect("refused");
    assert!(
        e.message.contains("aggregates roles that grant"),
        "{}",
        e.message
    );
}

const LABELLER: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: labeller}
spec:
  trigger: {apiGroup: example.org, kind: Thing}
  outputs:
  - kind: ClusterRole
    name: "labelled-{{trigger.metadata.name}}"
    labels:
      "{{trigger.spec.key}}": "true"
    rules: [{apiGroups: [example.org], resources: [things], verbs: [get]}]
"#;

/// No output feeds the controller's own aggregated role, or the allow-list's.
#[test]
fn protected_aggregation_labels_are_refused() {
    let eval = evaluate(
        &rules(LABELLER),
        &[thing(
            "a",
            json!({"key": "rbacrules.io/aggregate-to-controller"}),
        )],
        Options::default(),
    );
    // Reserved for provenance already; refused either way.
    assert!(eval.desired.is_empty());
    assert!(eval.errors().next().is_some());
    let options = Options {
        protected: vec![
            serde_json::from_value(json!({"matchLabels": {"example.org/aggregate-to-me": "true"}}))
                .expect("selector"),
        ],
        ..Options::default()
    };
    let eval = evaluate(
        &rules(LABELLER),
        &[
            thing("a", json!({"key": "example.org/aggregate-to-me"})),
            thing("b", json!({"key": "example.org/aggregate-to-you"})),
        ],
        options,
    );
    let names: Vec<_> = eval.desired.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["labelled-b"]);
    let e = eval.errors().next().expect("refused");
    assert_eq!(e.kind, ErrorKind::EscalationDenied);
    assert!(e.message.contains("protected ClusterRole"), "{}", e.message);

    let allow_role: k8s_openapi::api::rbac::v1::ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "ceiling"},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.org/ceiling": "true"}}]}
    }))
    .expect("role");
    let ceiling_part = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "ceiling-things", "labels": {"example.org/ceiling": "true"}},
        "rules": [{"apiGroups": ["example.org"], "resources": ["things"], "verbs": ["get"]}]});
    let options = Options {
        allow: Some(AllowList::from_cluster_role(&allow_role)),
        ..Options::default()
    };
    let eval = evaluate(
        &rules(LABELLER),
        &[
            thing("a", json!({"key": "example.org/ceiling"})),
            thing("b", json!({"key": "example.org/other"})),
            ceiling_part,
        ],
        options,
    );
    let names: Vec<_> = eval.desired.iter().map(|d| d.name.as_str()).collect();
    // b passes: the aggregated allow-list grants what ceiling-things grants.
    assert_eq!(
        names,
        ["labelled-b"],
        "{:?}",
        eval.errors().collect::<Vec<_>>()
    );
}

/// An aggregated allow-list is read through its selectors; custom groups
/// pass when its annotation says so, built-in groups never do.
#[test]
fn aggregated_allow_list_and_custom_groups() {
    let allow_role: k8s_openapi::api::rbac::v1::ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "ceiling", "annotations": {"rbacrules.io/allow-custom-groups": "true"}},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.org/ceiling": "true"}}]}
    }))
    .expect("role");
    let part = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "ceiling-pods", "labels": {"example.org/ceiling": "true"}},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]});
    let options = Options {
        allow: Some(AllowList::from_cluster_role(&allow_role)),
        ..Options::default()
    };
    for (g, r, ok) in [
        ("['']", "[pods]", true),
        ("['']", "[secrets]", false),
        ("[widgets.example.org]", "['*']", true),
        ("[apps]", "[deployments]", false),
        ("[x.k8s.io]", "[things]", false),
        ("['*']", "[things]", false),
    ] {
        let eval = evaluate(
            &role_rule(g, r, "[get]"),
            std::slice::from_ref(&part),
            options.clone(),
        );
        assert_eq!(
            eval.desired.len() == 1,
            ok,
            "{g} {r}: {:?}",
            eval.errors().collect::<Vec<_>>()
        );
    }
}

/// Finding 4: narrowing the allow-list revokes the live object, and its
/// trigger is not kept for it.
#[test]
fn a_narrowed_allow_list_revokes_the_live_object() {
    let rule = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: reader}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: Role
    name: reader
    rules: [{apiGroups: [""], resources: [secrets], verbs: [get]}]
"#;
    let allow = |resources: &[&str]| AllowList {
        rules: vec![k8s_openapi::api::rbac::v1::PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(resources.iter().map(|s| s.to_string()).collect()),
            verbs: vec!["get".into()],
            ..Default::default()
        }],
        ..AllowList::default()
    };
    let wide = Options {
        allow: Some(allow(&["secrets", "pods"])),
        ..Options::default()
    };
    let first = evaluate(&rules(rule), &[ns("team-a", "view")], wide);
    assert_eq!(first.desired.len(), 1);
    let live = first
        .desired
        .iter()
        .next()
        .expect("an object")
        .object
        .to_value();

    let narrow = Options {
        allow: Some(allow(&["pods"])),
        ..Options::default()
    };
    let second = evaluate(
        &rules(rule),
        &[ns("team-a", "view"), live.clone()],
        narrow.clone(),
    );
    assert!(second.desired.is_empty());
    let key = (OutputKind::Role, "team-a".to_string(), "reader".to_string());
    assert!(second.revoked.contains_key(&key), "{:?}", second.revoked);
    assert!(!second.keeps("reader", Some("Namespace/team-a")));

    // Even when its trigger is paused (kept), a refused live object goes.
    let paused_rule = rule.replace(
        "trigger: {kind: Namespace}",
        "trigger: {kind: Namespace, pause: {annotation: paused}}",
    );
    let mut paused_ns = ns("team-a", "view");
    paused_ns["metadata"]["annotations"]["paused"] = json!("true");
    let third = evaluate(&rules(&paused_rule), &[paused_ns, live], narrow);
    assert!(third.keeps("reader", Some("Namespace/team-a")));
    assert!(third.revoked.contains_key(&key), "{:?}", third.revoked);
}

/// An error keeps: a template error leaves nothing revoked.
#[test]
fn an_error_keeps_and_revokes_nothing() {
    let rule = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: reader}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: Role
    name: "{{trigger.metadata.annotations.missing}}"
    rules: [{apiGroups: [""], resources: [pods], verbs: [get]}]
"#;
    let live = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "old", "namespace": "team-a",
                     "labels": {"app.kubernetes.io/managed-by": "rbac-rules"},
                     "annotations": {"rbacrules.io/rule": "reader", "rbacrules.io/trigger": "Namespace/team-a"}},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]});
    let eval = evaluate(
        &rules(rule),
        &[ns("team-a", "view"), live],
        Options::default(),
    );
    assert!(eval.keeps("reader", Some("Namespace/team-a")));
    assert!(eval.revoked.is_empty());
}

/// Finding 6: subject names are validated.
#[test]
fn subject_names_are_validated() {
    let rule = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: subj}
spec:
  trigger: {apiGroup: example.org, kind: Thing}
  outputs:
  - kind: ClusterRoleBinding
    name: "b-{{trigger.metadata.name}}"
    roleRef: {kind: ClusterRole, name: view}
    subjects: [{kind: "{{trigger.spec.kind}}", name: "{{trigger.spec.name}}", namespace: "{{trigger.spec.ns}}"}]
"#;
    for (kind, name, ok) in [
        ("User", "alice", true),
        ("User", "", false),
        ("User", "evil\nname", false),
        ("Group", "x\u{7}", false),
        ("ServiceAccount", "Not_A_Name", false),
        ("ServiceAccount", "good-sa", true),
    ] {
        let eval = evaluate(
            &rules(rule),
            &[thing(
                "a",
                json!({"kind": kind, "name": name, "ns": if kind == "ServiceAccount" { "default" } else { "" }}),
            )],
            Options::default(),
        );
        assert_eq!(eval.desired.len() == 1, ok, "{kind} {name:?}");
    }
}

/// Finding 6: `{{log}}` does not write trigger text.
#[test]
fn the_log_helper_is_disabled() {
    let rule = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: logger}
spec:
  trigger: {apiGroup: example.org, kind: Thing}
  outputs:
  - kind: ClusterRole
    name: "x{{log trigger.spec.text}}"
"#;
    let eval = evaluate(
        &rules(rule),
        &[thing("a", json!({"text": "\nFAKE LOG LINE"}))],
        Options::default(),
    );
    assert!(eval.desired.is_empty());
    let e = eval.errors().next().expect("an error");
    assert!(
        e.message.contains("log helper is disabled"),
        "{}",
        e.message
    );
}

/// Finding 6: many duplicate subjects are collapsed, in order.
#[test]
fn duplicate_subjects_are_collapsed() {
    let rule = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: dups}
spec:
  trigger: {apiGroup: example.org, kind: Thing}
  outputs:
  - kind: ClusterRoleBinding
    name: b
    roleRef: {kind: ClusterRole, name: view}
    subjects:
    - forEach: trigger.spec.users
      item: {kind: User, name: "{{item}}"}
"#;
    // Below --max-list-length (10,000 by default).
    let users: Vec<String> = (0..9_000).map(|i| format!("u{}", i % 7)).collect();
    let eval = evaluate(
        &rules(rule),
        &[thing("a", json!({"users": users}))],
        Options::default(),
    );
    assert_eq!(eval.desired.len(), 1);
    let subjects = eval
        .desired
        .iter()
        .next()
        .expect("an object")
        .object
        .to_value()["subjects"]
        .as_array()
        .expect("subjects")
        .len();
    assert_eq!(subjects, 7);
}

/// Runs `rbac-rules render` on rule and object files.
fn render_cli(
    rules: &std::path::Path,
    objects: &std::path::Path,
    extra: &[&str],
) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_rbac-rules"))
        .arg("render")
        .arg("--rules")
        .arg(rules)
        .arg("--objects")
        .arg(objects)
        .args(extra)
        .output()
        .expect("run rbac-rules")
}

/// `render` refuses offline with exit 1 and the same message.
#[test]
fn render_refuses_with_exit_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules_path = dir.path().join("rules.yaml");
    let objects_path = dir.path().join("objects.yaml");
    std::fs::write(&rules_path, BINDER).expect("write");
    std::fs::write(
        &objects_path,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a, annotations: {role: cluster-admin}}\n",
    )
    .expect("write");
    let run = |extra: &[&str]| render_cli(&rules_path, &objects_path, extra);
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("rule \"binder\": spec.outputs[0] (trigger Namespace/team-a): RoleBinding \"tenant\" binds \"cluster-admin\""),
        "{err}"
    );
    let out = run(&["--allow-cluster-admin-bindings"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `render --allow` with an aggregated allow-list file: the other
/// ClusterRoles in the file are what it aggregates; the custom-groups
/// annotation lets CRD groups pass, never built-in ones.
#[test]
fn render_reads_an_aggregated_allow_list_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let allow = dir.path().join("allow.yaml");
    std::fs::write(
        &allow,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: ceiling\n  annotations: {rbacrules.io/allow-custom-groups: \"true\"}\naggregationRule:\n  clusterRoleSelectors: [{matchLabels: {example.org/ceiling: \"true\"}}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: ceiling-pods\n  labels: {example.org/ceiling: \"true\"}\nrules:\n- {apiGroups: [''], resources: [pods], verbs: [get]}\n",
    )
    .expect("write");
    let objects = dir.path().join("objects.yaml");
    std::fs::write(
        &objects,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n",
    )
    .expect("write");
    let run = |groups: &str, resources: &str| {
        let rules = dir.path().join("rules.yaml");
        std::fs::write(
            &rules,
            format!("apiVersion: rbacrules.io/v1alpha1\nkind: RbacRule\nmetadata: {{name: r}}\nspec:\n  outputs:\n  - kind: ClusterRole\n    name: x\n    rules: [{{apiGroups: {groups}, resources: {resources}, verbs: [get]}}]\n"),
        )
        .expect("write");
        render_cli(&rules, &objects, &["--allow", &allow.to_string_lossy()])
    };
    for (g, r, ok) in [
        ("['']", "[pods]", true),
        ("[widgets.example.org]", "[widgets]", true),
        ("['']", "[secrets]", false),
        ("[apps]", "[deployments]", false),
    ] {
        let out = run(g, r);
        assert_eq!(
            out.status.code(),
            Some(if ok { 0 } else { 1 }),
            "{g} {r}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if !ok {
            assert!(String::from_utf8_lossy(&out.stderr).contains("allow-list"));
        }
    }
}

/// `render` reports a live managed object in the input that policy
/// refuses: the controller would revoke it.
#[test]
fn render_reports_live_objects_it_would_revoke() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRule\nmetadata: {name: r}\nspec:\n  outputs:\n  - kind: ClusterRole\n    name: fine\n    rules: [{apiGroups: [''], resources: [pods], verbs: [get]}]\n",
    )
    .expect("write");
    let objects = dir.path().join("objects.yaml");
    std::fs::write(
        &objects,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: old-escalator\n  labels: {app.kubernetes.io/managed-by: rbac-rules}\n  annotations: {rbacrules.io/rule: r}\nrules:\n- {apiGroups: [rbac.authorization.k8s.io], resources: [clusterroles], verbs: [escalate]}\n",
    )
    .expect("write");
    let out = render_cli(&rules, &objects, &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("revoked: live ClusterRole old-escalator: ClusterRole \"old-escalator\" grants [rbac.authorization.k8s.io] clusterroles: escalate"),
        "{err}"
    );
}
