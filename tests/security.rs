//! Issue 11 and issue 27: each finding, asserting the secure outcome.
//! Offline, through the engine (and `render` for the CLI's refusal), and
//! at the controller where it decides (plan, adoption, status, Events).

use rbac_rules::api::OutputKind;
use rbac_rules::engine::{AllowList, Engine, ErrorKind, Evaluation, Options, RuleSource, Waivers};
use serde_json::{Value, json};

use support::engine::{builtin, rules, store};
mod support;

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
           "metadata": {"name": name, "uid": format!("uid-{name}"),
                        "creationTimestamp": support::engine::OWNER_CREATED},
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
           "metadata": {"name": name, "uid": format!("uid-{name}"),
                        "creationTimestamp": support::engine::REVISION_CREATED,
                        // Controlled by Provider 0 (see support::engine::provider).
                        "ownerReferences": [support::engine::provider_ref(0, true)]},
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
                // The good XRD's CRD, as Crossplane makes it (lineage).
                support::engine::crd(
                    "xbuckets.storage.example.org",
                    "CompositeResourceDefinition",
                    "uid-good",
                    true,
                ),
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
            &[
                provider_revision("provider-evil-1", &[crd, "widgets.example.org"]),
                support::engine::provider(0),
                // The CRD the revision controls (lineage): only it is a type.
                support::engine::crd(
                    "widgets.example.org",
                    "ProviderRevision",
                    "uid-provider-evil-1",
                    true,
                ),
            ],
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
    // Issue 27: a `system:` name is a protected object, whatever the flags.
    let eval = evaluate(
        &rules(rule),
        &[thing("a", json!({"name": "system:x"}))],
        waived,
    );
    assert!(eval.desired.is_empty());
    let e = eval.errors().next().expect("refused");
    assert_eq!(e.kind, ErrorKind::EscalationDenied);
    assert!(e.message.contains("whatever the flags"), "{}", e.message);
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

/// Issue 27: an aggregated ClusterRole is not refused for an unmanaged role
/// someone labelled into it (Kubernetes aggregates that role regardless,
/// and its labeller holds what it grants): the rule gets a notice
/// (`UnmanagedAggregation`), nothing is revoked.
#[test]
fn an_unmanaged_role_labelled_in_is_a_notice_not_a_refusal() {
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
    let live = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "gatherer", "labels": {"app.kubernetes.io/managed-by": "rbac-rules"},
                     "annotations": {"rbacrules.io/rule": "gatherer"}},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.org/power": "true"}}]},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]});
    let allow_role: k8s_openapi::api::rbac::v1::ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "ceiling"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}))
    .expect("role");
    let reader = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "secrets-reader", "labels": {"example.org/power": "true"}},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]});
    for (options, labelled, needle) in [
        (
            Options::default(),
            admin.clone(),
            "cluster-admin equivalent",
        ),
        (
            Options {
                allow: Some(AllowList::from_cluster_role(&allow_role)),
                ..Options::default()
            },
            reader,
            "what the allow-list does not",
        ),
    ] {
        for with_live in [false, true] {
            let mut objects = vec![labelled.clone()];
            if with_live {
                objects.push(live.clone());
            }
            let eval = evaluate(&rules(rule), &objects, options.clone());
            assert!(
                eval.desired.iter().any(|d| d.name == "gatherer"),
                "{needle}: {:?}",
                eval.errors().collect::<Vec<_>>()
            );
            assert!(eval.revoked.is_empty(), "{:?}", eval.revoked);
            assert_eq!(eval.errors().count(), 0);
            let notices: Vec<_> = eval.notices().collect();
            assert_eq!(notices.len(), 1, "{needle}");
            assert_eq!(notices[0].kind, ErrorKind::UnmanagedAggregation);
            assert_eq!(notices[0].rule, "gatherer");
            assert!(
                notices[0].message.contains(needle),
                "{}",
                notices[0].message
            );
            assert!(
                notices[0].message.contains(&format!(
                    "ClusterRole {:?}",
                    labelled["metadata"]["name"].as_str().unwrap_or_default()
                )),
                "{}",
                notices[0].message
            );
        }
    }
    // Without the labelled role, no notice.
    let eval = evaluate(&rules(rule), &[], Options::default());
    assert_eq!(eval.notices().count(), 0);
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
    let run = |extra: &[&str]| support::cli::render_files(&rules_path, &objects_path, extra);
    let out = run(&[]);
    assert_eq!(out.code, Some(1));
    assert!(out.stdout.is_empty());
    let err = out.stderr.as_str();
    assert!(
        err.contains("rule \"binder\": spec.outputs[0] (trigger Namespace/team-a): RoleBinding \"tenant\" binds \"cluster-admin\""),
        "{err}"
    );
    let out = run(&["--allow-cluster-admin-bindings"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr.as_str());
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
        support::cli::render_files(&rules, &objects, &["--allow", &allow.to_string_lossy()])
    };
    for (g, r, ok) in [
        ("['']", "[pods]", true),
        ("[widgets.example.org]", "[widgets]", true),
        ("['']", "[secrets]", false),
        ("[apps]", "[deployments]", false),
    ] {
        let out = run(g, r);
        assert_eq!(
            out.code,
            Some(if ok { 0 } else { 1 }),
            "{g} {r}: {}",
            out.stderr.as_str()
        );
        if !ok {
            assert!(out.stderr.as_str().contains("allow-list"));
        }
    }
}

/// `render` reports a live managed object in the input that policy
/// refuses: the controller would revoke it. An error when the input shows
/// rbac-rules made it (its managedFields hold our Apply entry); a warning,
/// exit 0, when the input cannot tell (a dump without managedFields: the
/// label alone is anyone's to set).
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
    let escalator = |managed_fields: &str| {
        format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: old-escalator\n  labels: {{app.kubernetes.io/managed-by: rbac-rules}}\n  annotations: {{rbacrules.io/rule: r}}\n{managed_fields}rules:\n- {{apiGroups: [rbac.authorization.k8s.io], resources: [clusterroles], verbs: [escalate]}}\n"
        )
    };
    std::fs::write(
        &objects,
        escalator("  managedFields: [{manager: rbac-rules, operation: Apply, fieldsV1: {}}]\n"),
    )
    .expect("write");
    let out = support::cli::render_files(&rules, &objects, &[]);
    assert_eq!(out.code, Some(1));
    let err = out.stderr.as_str();
    let why =
        "ClusterRole \"old-escalator\" grants [rbac.authorization.k8s.io] clusterroles: escalate";
    assert!(
        err.contains(&format!("revoked: live ClusterRole old-escalator: {why}")),
        "{err}"
    );
    // As `kubectl get -o yaml` dumps it: no managedFields.
    std::fs::write(&objects, escalator("")).expect("write");
    let out = support::cli::render_files(&rules, &objects, &[]);
    assert_eq!(out.code, Some(0), "{}", out.stderr.as_str());
    assert!(out.stdout.as_str().contains("name: fine"));
    let err = out.stderr.as_str();
    assert!(!err.contains("error:"), "{err}");
    assert!(
        err.contains("warning: live ClusterRole old-escalator is labelled")
            && err.contains(&format!(
                "if rbac-rules made it, the controller revokes it ({why})"
            )),
        "{err}"
    );
}

// ---------------------------------------------------------------------
// Issue 27, second round.
// ---------------------------------------------------------------------

/// The shipped allow-list (deploy/controller/allow-list.yaml).
fn shipped_allow_list() -> AllowList {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/controller/allow-list.yaml");
    let text = std::fs::read_to_string(&path).expect("allow-list");
    let docs = rbac_rules::yaml::parse_documents(&path, &text).expect("parses");
    let role = docs
        .into_iter()
        .find(|d| d.value["kind"] == "ClusterRole")
        .expect("a ClusterRole");
    AllowList::from_cluster_role(&serde_json::from_value(role.value).expect("ClusterRole"))
}

/// An RbacRule author's ClusterRole, labelled to aggregate into
/// crossplane-edit, with `rules` (YAML flow) and the name from a Thing.
fn aggregating_leaf(rules_yaml: &str) -> Vec<RuleSource> {
    rules(&format!(
        r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: leaf}}
spec:
  trigger: {{apiGroup: example.org, kind: Thing}}
  outputs:
  - kind: ClusterRole
    name: "{{{{trigger.spec.name}}}}"
    labels: {{rbac.crossplane.io/aggregate-to-edit: "true"}}
    rules: {rules_yaml}
"#
    ))
}

fn key(kind: OutputKind, ns: &str, name: &str) -> (OutputKind, String, String) {
    (kind, ns.to_string(), name.to_string())
}

/// Issue 27, finding 3: an output refused by a default denial or the
/// allow-list, labelled into crossplane-edit, is refused alone:
/// crossplane-edit stays desired and is never revoked, live or not, in a
/// full and in an incremental evaluation.
#[test]
fn a_refused_leaf_never_takes_its_aggregate_with_it() {
    let cases: [(&str, &str, Options); 4] = [
        (
            "escalate",
            "[{apiGroups: [rbac.authorization.k8s.io], resources: [clusterroles], verbs: [escalate]}]",
            Options::default(),
        ),
        (
            "all",
            "[{apiGroups: ['*'], resources: ['*'], verbs: ['*']}]",
            Options::default(),
        ),
        (
            "nodes",
            "[{apiGroups: [''], resources: [nodes], verbs: [delete]}]",
            Options {
                allow: Some(shipped_allow_list()),
                ..Options::default()
            },
        ),
        (
            "system:leaf",
            "[{apiGroups: [example.org], resources: [things], verbs: [get]}]",
            Options::default(),
        ),
    ];
    for (leaf_name, leaf_rules, options) in cases {
        let mut all_rules = builtin();
        all_rules.extend(aggregating_leaf(leaf_rules));
        let trigger = thing("evil", json!({"name": leaf_name}));
        let engine = Engine::new(&all_rules, options.clone());
        // Crossplane's roles as they are live (managed, from a first pass).
        let before = engine.evaluate(&store(&[]));
        let live: Vec<Value> = before
            .desired
            .iter()
            .filter(|d| d.name.starts_with("crossplane"))
            .map(|d| d.object.to_value())
            .collect();
        assert!(
            live.iter()
                .any(|o| o["metadata"]["name"] == "crossplane-edit")
        );
        let mut objects = live.clone();
        objects.push(trigger.clone());
        let full = engine.evaluate(&store(&objects));
        let edit = key(OutputKind::ClusterRole, "", "crossplane-edit");
        assert!(
            full.desired.get(&edit).is_some(),
            "{leaf_name}: crossplane-edit desired: {:?}",
            full.errors().collect::<Vec<_>>()
        );
        assert!(
            !full.revoked.contains_key(&edit),
            "{leaf_name}: {:?}",
            full.revoked
        );
        let leaf = key(OutputKind::ClusterRole, "", leaf_name);
        assert!(full.desired.get(&leaf).is_none(), "{leaf_name} is refused");
        assert!(full.revoked.contains_key(&leaf), "{leaf_name}");
        // Only the leaf is refused.
        let refused: Vec<_> = full
            .errors()
            .filter(|e| e.kind == ErrorKind::EscalationDenied)
            .collect();
        assert_eq!(refused.len(), 1, "{leaf_name}: {refused:?}");
        assert_eq!(refused[0].rule, "leaf");
        assert_eq!(full.revoked.len(), 1, "{leaf_name}: {:?}", full.revoked);

        // Incrementally: the leaf's trigger arrives after a first pass.
        let mut memo = rbac_rules::engine::Memo::new();
        let mut s = store(&live);
        let first = engine.evaluate_incremental(&s, &mut memo);
        assert!(first.desired.get(&edit).is_some());
        s.insert(trigger).expect("inserts");
        let second = engine.evaluate_incremental(&s, &mut memo);
        assert_eq!(second.desired, full.desired, "{leaf_name}: incremental");
        assert_eq!(second.revoked, full.revoked, "{leaf_name}: incremental");
    }
}

const BINDER_LITERAL: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: literal}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: RoleBinding
    name: "literal-{{trigger.metadata.annotations.n}}"
    roleRef: {kind: ClusterRole, name: view}
    subjects: [{kind: "{{trigger.metadata.annotations.kind}}", name: SUBJECT}]
"#;

/// Issue 27: a binding to everyone (`system:authenticated`,
/// `system:unauthenticated`, `system:serviceaccounts`, `system:anonymous`)
/// is refused whatever wrote the subject, unless waived.
#[test]
fn bindings_to_everyone_are_refused_whatever_the_source() {
    for (kind, subject) in [
        ("Group", "system:authenticated"),
        ("Group", "system:unauthenticated"),
        ("Group", "system:serviceaccounts"),
        ("User", "system:anonymous"),
    ] {
        let literal = rules(&BINDER_LITERAL.replace("SUBJECT", subject));
        let mut n = ns("team-a", "view");
        n["metadata"]["annotations"]["kind"] = json!(kind);
        n["metadata"]["annotations"]["n"] = json!("1");
        let eval = evaluate(&literal, std::slice::from_ref(&n), Options::default());
        assert!(eval.desired.is_empty(), "{kind} {subject}");
        let e = eval.errors().next().expect("refused");
        assert_eq!(e.kind, ErrorKind::EscalationDenied);
        assert!(e.message.contains("binds everyone"), "{}", e.message);
        assert!(e.message.contains(subject), "{}", e.message);
        let waived = Options {
            waivers: Waivers {
                everyone_bindings: true,
                ..Waivers::default()
            },
            ..Options::default()
        };
        let eval = evaluate(&literal, std::slice::from_ref(&n), waived);
        assert_eq!(eval.desired.len(), 1, "{kind} {subject} waived");
    }
}

const SUBJECT_FROM_DATA: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: tenant}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: RoleBinding
    name: tenant
    roleRef: {kind: ClusterRole, name: view}
    subjects:
    - {kind: "{{trigger.metadata.annotations.kind}}", name: "{{trigger.metadata.annotations.subject}}"}
"#;

/// Issue 27: a User or Group subject whose name comes from data never
/// names a `system:` user or group, for every rule, whatever the flags;
/// a literal one is the rule author's; ServiceAccounts are fine.
#[test]
fn subjects_from_data_never_name_system_users_or_groups() {
    let all_waived = Options {
        waivers: Waivers {
            system_names: true,
            cluster_admin_bindings: true,
            escalation_verbs: true,
            wildcard_all: true,
            everyone_bindings: true,
        },
        ..Options::default()
    };
    for (kind, subject, ok) in [
        ("Group", "system:masters", false),
        ("User", "system:admin", false),
        ("User", "system:kube-controller-manager", false),
        ("Group", "system:authenticated", false),
        ("Group", "system:serviceaccounts:team-a", false),
        ("User", "system:serviceaccount:kube-system:default", false),
        ("Group", "developers", true),
        ("User", "alice@example.org", true),
        ("User", "system-alice", true),
    ] {
        for options in [Options::default(), all_waived.clone()] {
            let mut n = ns("team-a", "view");
            n["metadata"]["annotations"]["kind"] = json!(kind);
            n["metadata"]["annotations"]["subject"] = json!(subject);
            let eval = evaluate(&rules(SUBJECT_FROM_DATA), &[n], options);
            assert_eq!(eval.desired.len() == 1, ok, "{kind} {subject}");
            if !ok {
                let e = eval.errors().next().expect("refused");
                assert_eq!(e.kind, ErrorKind::EscalationDenied, "{kind} {subject}");
                assert!(e.message.contains("comes from data"), "{}", e.message);
                assert!(e.field.contains("subjects[0].name"), "{}", e.field);
                assert!(eval.revoked.contains_key(&key(
                    OutputKind::RoleBinding,
                    "team-a",
                    "tenant"
                )));
            }
        }
    }
    // A name put together from data and a literal part is data.
    let partial = SUBJECT_FROM_DATA.replace(
        "\"{{trigger.metadata.annotations.subject}}\"",
        "\"system:{{trigger.metadata.annotations.subject}}\"",
    );
    let mut n = ns("team-a", "view");
    n["metadata"]["annotations"]["kind"] = json!("Group");
    n["metadata"]["annotations"]["subject"] = json!("masters");
    assert!(
        evaluate(&rules(&partial), &[n], Options::default())
            .desired
            .is_empty()
    );
    // A literal system: group (not everyone) is the rule author's.
    let literal = rules(&BINDER_LITERAL.replace("SUBJECT", "system:serviceaccounts:team-a"));
    let mut n = ns("team-a", "view");
    n["metadata"]["annotations"]["kind"] = json!("Group");
    n["metadata"]["annotations"]["n"] = json!("1");
    assert_eq!(
        evaluate(&literal, &[n], Options::default()).desired.len(),
        1
    );
}

fn cluster_role(name: &str, labels: Value, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
           "metadata": {"name": name, "labels": labels}, "rules": rules})
}

/// The live ClusterRoles of deploy/controller/rbac.yaml and Kubernetes'
/// `edit` (aggregated) with a part of system:aggregate-to-edit, and `view`.
fn live_cluster_roles() -> Vec<Value> {
    let bootstrap = json!({"kubernetes.io/bootstrapping": "rbac-defaults"});
    let mut edit = cluster_role(
        "edit",
        json!({"kubernetes.io/bootstrapping": "rbac-defaults",
        "rbac.authorization.k8s.io/aggregate-to-admin": "true"}),
        json!([]),
    );
    edit["aggregationRule"] = json!({"clusterRoleSelectors": [
        {"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}}]});
    let mut controller_agg = cluster_role(
        "rbac-rules",
        json!({"app.kubernetes.io/name": "rbac-rules"}),
        json!([]),
    );
    controller_agg["aggregationRule"] = json!({"clusterRoleSelectors": [
        {"matchLabels": {"rbacrules.io/aggregate-to-controller": "true"}}]});
    vec![
        cluster_role(
            "cluster-admin",
            bootstrap.clone(),
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
        ),
        edit,
        cluster_role(
            "system:aggregate-to-edit",
            json!({"kubernetes.io/bootstrapping": "rbac-defaults",
                   "rbac.authorization.k8s.io/aggregate-to-edit": "true"}),
            json!([{"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]},
                   {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create", "delete"]}]),
        ),
        cluster_role(
            "view",
            json!({"kubernetes.io/bootstrapping": "rbac-defaults",
                   "rbac.authorization.k8s.io/aggregate-to-edit": "true"}),
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]),
        ),
        controller_agg,
        cluster_role(
            "rbac-rules:controller",
            json!({"app.kubernetes.io/name": "rbac-rules", "rbacrules.io/aggregate-to-controller": "true"}),
            json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles", "roles"],
                    "verbs": ["escalate", "bind"]}]),
        ),
    ]
}

/// The Config Sync example rules (rules/examples/config-sync).
fn config_sync_rules() -> Vec<RuleSource> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/examples/config-sync");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).expect("read");
            out.extend(rbac_rules::rules::parse_text(&path, &text).expect("rules parse"));
        }
    }
    out
}

fn root_sync(name: &str, refs: Value) -> Value {
    json!({"apiVersion": "configsync.gke.io/v1beta1", "kind": "RootSync",
           "metadata": {"name": name, "namespace": "config-management-system", "uid": format!("uid-{name}")},
           "spec": {"overrides": {"roleRefs": refs}}})
}

/// Issue 27, finding 5: a binding is judged by what the live role it names
/// grants, with or without an allow-list: a RootSync's roleRefs may not
/// bind `rbac-rules:controller` (escalate, bind), nor `rbac-rules`, which
/// aggregates it, nor `edit` (impersonates ServiceAccounts); `view` is fine.
#[test]
fn bindings_are_judged_by_what_a_live_role_grants() {
    // The shipped allow-list does not cover view's `pods` either.
    for (role, ok_alone, ok_allowed) in [
        ("rbac-rules:controller", false, false),
        ("rbac-rules", false, false),
        ("edit", false, false),
        ("view", true, false),
    ] {
        // The engine's judgement, through a rule that binds whatever role
        // a Namespace names (the Config Sync example below also skips the
        // controller's roles by its own text, before policy sees them).
        let mut objects = live_cluster_roles();
        objects.push(ns("team-a", role));
        for options in [
            Options::default(),
            Options {
                allow: Some(shipped_allow_list()),
                ..Options::default()
            },
        ] {
            let with_allow = options.allow.is_some();
            let ok = if with_allow { ok_allowed } else { ok_alone };
            let eval = evaluate(&rules(BINDER), &objects, options);
            let bindings: Vec<_> = eval
                .desired
                .iter()
                .filter(|d| d.kind == OutputKind::RoleBinding)
                .map(|d| d.name.clone())
                .collect();
            assert_eq!(
                bindings.len() == 1,
                ok,
                "{role} (allow-list {with_allow}): {bindings:?} {:?}",
                eval.errors().collect::<Vec<_>>()
            );
            if !ok {
                let e = eval
                    .errors()
                    .find(|e| e.kind == ErrorKind::EscalationDenied)
                    .expect("refused");
                assert!(
                    e.message
                        .contains(&format!("binds role {role:?}, which grants")),
                    "{}",
                    e.message
                );
            }
        }
    }
    // A RootSync naming them binds none of them either.
    for role in ["rbac-rules:controller", "rbac-rules", "edit"] {
        let mut objects = live_cluster_roles();
        objects.push(root_sync(
            "sync-a",
            json!([{"kind": "ClusterRole", "name": role}]),
        ));
        let eval = evaluate(&config_sync_rules(), &objects, Options::default());
        assert!(
            !eval
                .desired
                .iter()
                .any(|d| d.kind == OutputKind::ClusterRoleBinding && d.name.contains(role)),
            "{role}"
        );
    }
}

/// Issue 27: protected objects — Kubernetes' bootstrap roles and bindings
/// and the controller's own — are never emitted, whatever the input and
/// the flags; each is refused alone, with a message saying why.
#[test]
fn protected_objects_are_never_emitted() {
    let kinds_rule = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: namer}
spec:
  trigger: {apiGroup: example.org, kind: Thing}
  outputs:
  - kind: ClusterRole
    name: "{{trigger.spec.name}}"
    when: 'eq trigger.spec.kind "ClusterRole"'
    labels: {"{{trigger.spec.label}}": "{{trigger.spec.value}}"}
    rules: [{apiGroups: [example.org], resources: [things], verbs: [get]}]
  - kind: ClusterRoleBinding
    name: "{{trigger.spec.name}}"
    when: 'eq trigger.spec.kind "ClusterRoleBinding"'
    labels: {"{{trigger.spec.label}}": "{{trigger.spec.value}}"}
    roleRef: {kind: ClusterRole, name: fine}
    subjects: [{kind: Group, name: team}]
  - kind: Role
    namespace: kube-system
    name: "{{trigger.spec.name}}"
    when: 'eq trigger.spec.kind "Role"'
    labels: {"{{trigger.spec.label}}": "{{trigger.spec.value}}"}
    rules: [{apiGroups: [example.org], resources: [things], verbs: [get]}]
"#;
    let all_waived = Options {
        waivers: Waivers {
            system_names: true,
            cluster_admin_bindings: true,
            escalation_verbs: true,
            wildcard_all: true,
            everyone_bindings: true,
        },
        ..Options::default()
    };
    let cases = [
        ("ClusterRole", "cluster-admin", "x", "y"),
        ("ClusterRole", "admin", "x", "y"),
        ("ClusterRole", "edit", "x", "y"),
        ("ClusterRole", "view", "x", "y"),
        ("ClusterRole", "system:controller:x", "x", "y"),
        ("ClusterRole", "rbac-rules", "x", "y"),
        ("ClusterRole", "rbac-rules:allow-list", "x", "y"),
        ("ClusterRole", "rbac-rules:controller", "x", "y"),
        (
            "ClusterRole",
            "looks-fine",
            "kubernetes.io/bootstrapping",
            "rbac-defaults",
        ),
        ("ClusterRoleBinding", "cluster-admin", "x", "y"),
        ("ClusterRoleBinding", "rbac-rules", "x", "y"),
        ("ClusterRoleBinding", "system:basic-user", "x", "y"),
        ("Role", "rbac-rules:leader-election", "x", "y"),
        ("Role", "system:controller:bootstrap-signer", "x", "y"),
        (
            "Role",
            "reader",
            "kubernetes.io/bootstrapping",
            "rbac-defaults",
        ),
    ];
    for options in [Options::default(), all_waived] {
        for (kind, name, label, value) in cases {
            let eval = evaluate(
                &rules(kinds_rule),
                &[
                    thing(
                        "a",
                        json!({"kind": kind, "name": name, "label": label, "value": value}),
                    ),
                    thing(
                        "b",
                        json!({"kind": kind, "name": "fine", "label": "x", "value": "y"}),
                    ),
                ],
                options.clone(),
            );
            let names: Vec<_> = eval.desired.iter().map(|d| d.name.as_str()).collect();
            assert_eq!(names, ["fine"], "{kind} {name} {label}");
            let e = eval.errors().next().expect("refused");
            assert_eq!(e.kind, ErrorKind::EscalationDenied);
            assert!(
                e.message.contains("never written by a rule"),
                "{kind} {name}: {}",
                e.message
            );
            assert_eq!(e.trigger.as_deref(), Some("Thing.example.org/a"));
        }
    }
    // A Role named like a bootstrap ClusterRole is an ordinary Role.
    let eval = evaluate(
        &rules(kinds_rule),
        &[thing(
            "a",
            json!({"kind": "Role", "name": "edit", "label": "x", "value": "y"}),
        )],
        Options::default(),
    );
    assert_eq!(
        eval.desired.len(),
        1,
        "{:?}",
        eval.errors().collect::<Vec<_>>()
    );
}

/// Issue 27: no output aggregates a protected role: a selector that would
/// pick Kubernetes' bootstrap roles or the controller's own (by the labels
/// they carry, whether they exist here or not) is refused, alone.
#[test]
fn protected_roles_are_never_aggregated() {
    let rule = |selector: &str| {
        rules(&format!(
            r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: gatherer}}
spec:
  outputs:
  - kind: ClusterRole
    name: gatherer
    aggregationRule:
      clusterRoleSelectors: [{selector}]
  - kind: ClusterRole
    name: innocent
    rules: [{{apiGroups: [example.org], resources: [things], verbs: [get]}}]
"#
        ))
    };
    for (selector, refused) in [
        ("{}", true),
        (
            "{matchLabels: {kubernetes.io/bootstrapping: rbac-defaults}}",
            true,
        ),
        (
            "{matchExpressions: [{key: kubernetes.io/bootstrapping, operator: Exists}]}",
            true,
        ),
        (
            "{matchLabels: {rbac.authorization.k8s.io/aggregate-to-edit: 'true'}}",
            true,
        ),
        (
            "{matchLabels: {rbac.authorization.k8s.io/aggregate-to-admin: 'true'}}",
            true,
        ),
        (
            "{matchLabels: {rbacrules.io/aggregate-to-controller: 'true'}}",
            true,
        ),
        ("{matchLabels: {app.kubernetes.io/name: rbac-rules}}", true),
        (
            "{matchExpressions: [{key: example.org/x, operator: DoesNotExist}]}",
            true,
        ),
        (
            "{matchLabels: {example.org/aggregate-to-gatherer: 'true'}}",
            false,
        ),
        (
            "{matchLabels: {rbac.authorization.k8s.io/aggregate-to-edit: 'true'}, matchExpressions: [{key: kubernetes.io/bootstrapping, operator: DoesNotExist}]}",
            false,
        ),
    ] {
        for objects in [Vec::new(), live_cluster_roles()] {
            let eval = evaluate(&rule(selector), &objects, Options::default());
            let names: Vec<_> = eval.desired.iter().map(|d| d.name.as_str()).collect();
            let want: &[&str] = if refused {
                &["innocent"]
            } else {
                &["gatherer", "innocent"]
            };
            assert_eq!(
                names,
                want,
                "{selector}: {:?}",
                eval.errors().collect::<Vec<_>>()
            );
            if refused {
                let e = eval.errors().next().expect("refused");
                assert!(e.message.contains("aggregationRule"), "{}", e.message);
            }
        }
    }
}

/// Issue 27: a live protected object labelled as the controller's (with a
/// rule annotation) is never revoked by the engine, nor deleted or written
/// by the controller's plan, nor adopted.
#[test]
fn protected_live_objects_are_never_revoked_pruned_or_adopted() {
    use rbac_rules::controller::apply::adoption;
    use rbac_rules::controller::live::{Live, ObjectId};
    use rbac_rules::controller::plan::{KeepReason, plan};
    let mut hijacked = cluster_role(
        "cluster-admin",
        json!({"kubernetes.io/bootstrapping": "rbac-defaults",
               "app.kubernetes.io/managed-by": "rbac-rules"}),
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    );
    hijacked["metadata"]["annotations"] = json!({"rbacrules.io/rule": "gone"});
    let mut labelled_edit = live_cluster_roles()[1].clone();
    labelled_edit["metadata"]["labels"]["app.kubernetes.io/managed-by"] = json!("rbac-rules");
    labelled_edit["metadata"]["annotations"] = json!({"rbacrules.io/rule": "gone"});
    let objects = vec![hijacked.clone(), labelled_edit.clone()];
    let eval = evaluate(&rules(BINDER), &objects, Options::default());
    assert!(eval.revoked.is_empty(), "{:?}", eval.revoked);

    let live: std::collections::BTreeMap<ObjectId, Live> = objects
        .iter()
        .map(|o| (ObjectId::of(o).expect("id"), Live::new(o.clone())))
        .collect();
    let p = plan(&eval, &live, &Default::default(), true);
    assert!(p.deletes.is_empty(), "{:?}", p.deletes);
    assert!(p.applies.is_empty());
    assert_eq!(
        p.kept
            .iter()
            .filter(|k| k.2 == KeepReason::Protected)
            .count(),
        2
    );

    // --adopt-existing never takes over a protected object, by name or label.
    let desired = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "cluster-admin"}});
    let id = ObjectId::new(OutputKind::ClusterRole, "", "cluster-admin");
    let existing = cluster_role("cluster-admin", json!({}), json!([]));
    let err = adoption(&id, &desired, &existing, true).expect_err("never adopted");
    assert!(err.contains("never adopted"), "{err}");
    let id = ObjectId::new(
        OutputKind::Role,
        "kube-system",
        "extension-apiserver-authentication-reader",
    );
    let existing = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "extension-apiserver-authentication-reader", "namespace": "kube-system",
                     "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}});
    assert!(adoption(&id, &desired, &existing, true).is_err());
    let id = ObjectId::new(OutputKind::ClusterRole, "", "someones-role");
    let existing = cluster_role("someones-role", json!({}), json!([]));
    assert!(adoption(&id, &desired, &existing, true).is_ok());
}

/// Issue 27: a notice on a managed aggregated role (an unmanaged role
/// labelled in) makes the rule Degraded with reason UnmanagedAggregation
/// and a Warning Event, while it stays Ready (every output is applied).
#[test]
fn a_notice_is_a_condition_and_a_warning_event() {
    use rbac_rules::controller::status::{RuleInputs, compute, events};
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
    let powerful = cluster_role(
        "powerful",
        json!({"example.org/power": "true"}),
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"]}]),
    );
    let eval = evaluate(&rules(rule), &[powerful], Options::default());
    let report = eval.reports.get("gatherer").expect("report");
    let crd: rbac_rules::api::RbacRule = serde_json::from_value(json!({
        "apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
        "metadata": {"name": "gatherer", "generation": 1},
        "spec": serde_yaml_spec(rule)}))
    .expect("rule");
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default());
    let status = compute(
        &crd,
        &RuleInputs {
            report: Some(report),
            hold: None,
            writes: &[],
            managed: 1,
            manage: Default::default(),
            foreign_claims: &[],
            held_prunes: None,
        },
        &now,
    )
    .expect("status");
    let cond = |t: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .cloned()
            .expect("condition")
    };
    assert_eq!(cond("Ready").status, "True");
    let degraded = cond("Degraded");
    assert_eq!(degraded.status, "True");
    assert_eq!(degraded.reason, "UnmanagedAggregation");
    assert!(
        degraded.message.contains("\"powerful\""),
        "{}",
        degraded.message
    );
    let evs = events(&crd, &[], Some(&status));
    assert!(
        evs.iter().any(|e| e.reason == "UnmanagedAggregation"
            && matches!(e.type_, kube::runtime::events::EventType::Warning)),
        "{:?}",
        evs.iter().map(|e| &e.reason).collect::<Vec<_>>()
    );
}

/// The spec of the single RbacRule in `yaml`, as JSON.
fn serde_yaml_spec(yaml: &str) -> Value {
    let docs =
        rbac_rules::yaml::parse_documents(std::path::Path::new("t.yaml"), yaml).expect("yaml");
    docs[0].value["spec"].clone()
}

/// Issue 27: the incremental path decides as the full one when what a
/// bound live role grants changes, and when an unmanaged role is labelled
/// into (or out of) a managed aggregated role.
#[test]
fn bound_roles_and_notices_follow_changes_incrementally() {
    let gatherer = r#"
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
    let mut all = rules(BINDER);
    all.extend(rules(gatherer));
    let benign = cluster_role(
        "target",
        json!({}),
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
    );
    let escalating = cluster_role(
        "target",
        json!({}),
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["bind"]}]),
    );
    let powerful = cluster_role(
        "powerful",
        json!({"example.org/power": "true"}),
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    );
    let gk = rbac_rules::engine::GroupKind::new("rbac.authorization.k8s.io", "ClusterRole");
    let engine = Engine::new(&all, Options::default());
    let mut memo = rbac_rules::engine::Memo::new();
    let mut s = store(&[ns("team-a", "target"), benign.clone()]);
    let binding = key(OutputKind::RoleBinding, "team-a", "tenant");
    // (step, binding desired, notices)
    let steps: Vec<(&str, bool, usize)> = vec![
        ("benign", true, 0),
        ("escalating", false, 0),
        ("powerful labelled in", false, 1),
        ("powerful gone", false, 0),
        ("benign again", true, 0),
    ];
    for (step, bound, notices) in steps {
        match step {
            "escalating" => s.insert(escalating.clone()).expect("insert"),
            "powerful labelled in" => s.insert(powerful.clone()).expect("insert"),
            "powerful gone" => {
                s.remove(&gk, &(String::new(), "powerful".to_string()));
            }
            "benign again" => s.insert(benign.clone()).expect("insert"),
            _ => {}
        }
        let inc = engine.evaluate_incremental(&s, &mut memo);
        let full = engine.evaluate(&s);
        assert_eq!(inc.desired, full.desired, "{step}");
        assert_eq!(inc.revoked, full.revoked, "{step}");
        assert_eq!(inc.reports, full.reports, "{step}");
        assert_eq!(inc.desired.get(&binding).is_some(), bound, "{step}");
        assert_eq!(inc.notices().count(), notices, "{step}");
        assert!(
            inc.desired
                .get(&key(OutputKind::ClusterRole, "", "gatherer"))
                .is_some()
        );
    }
}

/// Issue 27, at the controller: a managed aggregated role that collects an
/// unmanaged role someone labelled in is written, never deleted; the rule
/// gets a Degraded condition (reason UnmanagedAggregation, still Ready) and
/// a Warning Event.
#[tokio::test]
async fn the_controller_keeps_the_aggregate_and_warns() {
    use http::Method;
    let (client, mut server) = support::api::pair();
    let spec = json!({"outputs": [{"kind": "ClusterRole", "name": "gatherer",
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.org/power": "true"}}]}}]});
    let rules = support::api::rules(vec![support::api::rule("gatherer", spec.clone(), None)]);
    let observed = support::api::store(vec![cluster_role(
        "powerful",
        json!({"example.org/power": "true"}),
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    )]);
    let live = support::api::owned(Vec::new());
    let holds = std::collections::BTreeMap::new();
    let scenario = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(r) = server.next_opt().await {
            if r.path.ends_with("/rbacrules/gatherer/status") {
                seen.push(format!("STATUS {}", r.body["status"]["conditions"]));
                let body = json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
                    "metadata": {"name": "gatherer"}, "spec": spec, "status": r.body["status"]});
                r.respond(200, body);
            } else if r.path.ends_with("/events") {
                seen.push(format!(
                    "EVENT {} {}",
                    r.body["type"].as_str().unwrap_or_default(),
                    r.body["reason"].as_str().unwrap_or_default()
                ));
                let body = r.body.clone();
                r.respond(201, body);
            } else {
                seen.push(format!("{} {}", r.method, r.path));
                assert_ne!(r.method, Method::DELETE, "{}", r.path);
                r.echo();
            }
        }
        seen
    });
    let mut s = support::api::syncer(client);
    s.sync(&support::api::snapshot(&rules, &observed, &live, &holds))
        .await;
    drop(s);
    let seen = scenario.await.expect("scenario");
    assert!(
        seen.iter()
            .any(|l| l.starts_with("PATCH") && l.ends_with("/clusterroles/gatherer")),
        "{seen:?}"
    );
    assert!(!seen.iter().any(|l| l.starts_with("DELETE")), "{seen:?}");
    let status = seen
        .iter()
        .find(|l| l.starts_with("STATUS"))
        .expect("a status patch");
    let conditions: Vec<Value> =
        serde_json::from_str(status.trim_start_matches("STATUS ")).expect("conditions");
    let cond = |t: &str| {
        conditions
            .iter()
            .find(|c| c["type"] == t)
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(cond("Ready")["status"], "True", "{status}");
    assert_eq!(cond("Degraded")["status"], "True", "{status}");
    assert_eq!(
        cond("Degraded")["reason"],
        "UnmanagedAggregation",
        "{status}"
    );
    assert!(
        seen.iter()
            .any(|l| l == "EVENT Warning UnmanagedAggregation"),
        "{seen:?}"
    );
}

/// Issue 27: labelling a protected role as ours does not make bindings to
/// it pass unjudged: `edit` labelled managed is still judged by what it
/// grants.
#[test]
fn a_protected_role_labelled_ours_is_still_judged_for_bindings() {
    let mut objects = live_cluster_roles();
    for o in objects.iter_mut() {
        if o["metadata"]["name"] == "edit" {
            o["metadata"]["labels"]["app.kubernetes.io/managed-by"] = json!("rbac-rules");
            o["metadata"]["annotations"] = json!({"rbacrules.io/rule": "gone"});
        }
    }
    objects.push(ns("team-a", "edit"));
    let eval = evaluate(&rules(BINDER), &objects, Options::default());
    assert!(eval.desired.is_empty());
    let e = eval.errors().next().expect("refused");
    assert!(
        e.message
            .contains("binds role \"edit\", which grants [\"\"] serviceaccounts: impersonate"),
        "{}",
        e.message
    );
    assert!(
        eval.revoked.keys().all(|k| k.2 != "edit"),
        "{:?}",
        eval.revoked
    );
}

/// Issue 27: an aggregated output that selects a live protected role by the
/// labels it was installed with (here a Helm chart label on the
/// controller's own role) is refused; one that selects it only through a
/// label someone added to it gets a notice, and is kept.
#[test]
fn a_protected_role_selected_by_its_installed_labels_is_refused() {
    let rule = |selector: &str| {
        rules(&format!(
            r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: gatherer}}
spec:
  outputs:
  - kind: ClusterRole
    name: gatherer
    aggregationRule:
      clusterRoleSelectors: [{selector}]
"#
        ))
    };
    let mut objects = live_cluster_roles();
    for o in objects.iter_mut() {
        if o["metadata"]["name"] == "rbac-rules:controller" {
            o["metadata"]["labels"]["helm.sh/chart"] = json!("rbac-rules-0.1.0");
        }
        if o["metadata"]["name"] == "cluster-admin" {
            o["metadata"]["labels"]["example.org/power"] = json!("true");
        }
    }
    let eval = evaluate(
        &rule("{matchLabels: {helm.sh/chart: rbac-rules-0.1.0}}"),
        &objects,
        Options::default(),
    );
    assert!(eval.desired.is_empty());
    let e = eval.errors().next().expect("refused");
    assert!(
        e.message
            .contains("selects the protected ClusterRole \"rbac-rules:controller\""),
        "{}",
        e.message
    );
    let eval = evaluate(
        &rule("{matchLabels: {example.org/power: 'true'}}"),
        &objects,
        Options::default(),
    );
    assert_eq!(
        eval.desired.len(),
        1,
        "{:?}",
        eval.errors().collect::<Vec<_>>()
    );
    let n = eval.notices().next().expect("a notice");
    assert!(n.message.contains("\"cluster-admin\""), "{}", n.message);
}

/// Issue 27: a live managed aggregated role kept as it is (its trigger
/// paused) is not revoked for an unmanaged role labelled into it either;
/// its rule gets the notice, for that trigger.
#[test]
fn a_kept_live_aggregate_gets_a_notice_not_a_revocation() {
    let rule = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: gatherer}
spec:
  trigger: {kind: Namespace, pause: {annotation: paused}}
  outputs:
  - kind: ClusterRole
    name: "gatherer-{{trigger.metadata.name}}"
    aggregationRule:
      clusterRoleSelectors: [{matchLabels: {example.org/power: "true"}}]
"#;
    let live = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "gatherer-team-a",
                     "labels": {"app.kubernetes.io/managed-by": "rbac-rules", "rbacrules.io/rule": "gatherer"},
                     "annotations": {"rbacrules.io/rule": "gatherer", "rbacrules.io/trigger": "Namespace/team-a"}},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.org/power": "true"}}]},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]});
    let powerful = cluster_role(
        "powerful",
        json!({"example.org/power": "true"}),
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    );
    let mut paused = ns("team-a", "view");
    paused["metadata"]["annotations"]["paused"] = json!("true");
    let eval = evaluate(&rules(rule), &[paused, live, powerful], Options::default());
    assert!(eval.keeps("gatherer", Some("Namespace/team-a")));
    assert!(eval.revoked.is_empty(), "{:?}", eval.revoked);
    let notices: Vec<_> = eval.notices().collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0].trigger.as_deref(), Some("Namespace/team-a"));
    assert!(
        notices[0].message.contains("\"powerful\""),
        "{}",
        notices[0].message
    );
}
