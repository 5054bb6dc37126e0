//! Behaviour of the pure engine beyond single renders: isolation of bad
//! rules, what must be kept, determinism, ordering and ownership.

use rbac_rules::api::{ManageLevel, OutputKind};
use rbac_rules::engine::{Engine, ErrorKind, ObjectStore, Options, RuleState};
use serde_json::{Value, json};

mod support;
use support::engine::{rules, store};

fn ns(name: &str, labels: Value, annotations: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": labels, "annotations": annotations}})
}

fn names(eval: &rbac_rules::engine::Evaluation) -> Vec<String> {
    eval.desired
        .iter()
        .map(|d| format!("{}/{}/{}", d.kind, d.namespace, d.name))
        .collect()
}

const GOOD_AND_BAD: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: bad}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: Role
    name: "{{trigger.spec.missing}}"
---
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: broken-template}
spec:
  outputs:
  - kind: ClusterRole
    name: "{{#each}}"
---
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: good}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: Role
    name: reader
    rules:
    - {apiGroups: [""], resources: [pods], verbs: [get]}
"#;

#[test]
fn one_bad_rule_never_stops_the_others_and_keeps_its_objects() {
    let engine = Engine::new(&rules(GOOD_AND_BAD), Options::default());
    let eval = engine.evaluate(&store(&[
        ns("a", json!({}), json!({})),
        ns("b", json!({}), json!({})),
    ]));
    assert_eq!(names(&eval), ["Role/a/reader", "Role/b/reader"]);

    let bad = &eval.reports["bad"];
    assert_eq!(bad.state, RuleState::Evaluated);
    assert_eq!(
        bad.errors.len(),
        2,
        "one error per trigger: {:?}",
        bad.errors
    );
    assert!(
        eval.keeps("bad", Some("Namespace/a")),
        "a failed trigger keeps its objects"
    );
    let broken = &eval.reports["broken-template"];
    assert_eq!(broken.state, RuleState::Failed);
    assert_eq!(broken.errors[0].kind, ErrorKind::Template);
    assert_eq!(broken.errors[0].field, "spec.outputs[0].name");
    assert!(
        eval.keeps("broken-template", None),
        "an invalid rule keeps its objects"
    );

    assert!(
        !eval.keeps("good", Some("Namespace/a")),
        "a good rule's stale objects are pruned"
    );
    assert!(
        !eval.keeps("deleted-rule", None),
        "objects of a deleted rule are pruned"
    );
}

#[test]
fn paused_and_deleting_triggers_keep_their_objects() {
    let yaml = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: r}
spec:
  trigger:
    kind: Namespace
    pause: {annotation: example.org/paused}
  outputs:
  - {kind: Role, name: x}
"#;
    let mut deleting = ns("gone", json!({}), json!({}));
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let objects = [
        ns("paused", json!({}), json!({"example.org/paused": "true"})),
        deleting,
        ns("live", json!({}), json!({"example.org/paused": "false"})),
    ];
    let eval = Engine::new(&rules(yaml), Options::default()).evaluate(&store(&objects));
    assert_eq!(names(&eval), ["Role/live/x"]);
    let rep = &eval.reports["r"];
    assert_eq!(rep.matched_triggers, 3);
    assert!(eval.keeps("r", Some("Namespace/paused")));
    assert!(eval.keeps("r", Some("Namespace/gone")));
    assert!(!eval.keeps("r", Some("Namespace/live")));
}

#[test]
fn evaluation_is_deterministic_whatever_the_input_order() {
    let builtin = rbac_rules::rules::builtin().expect("built-in rules");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/crossplane-cluster.yaml"
    ))
    .expect("example");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("yaml");
    let forward = Engine::new(&builtin, Options::default()).evaluate(&store(&docs));
    let mut reversed_docs = docs.clone();
    reversed_docs.reverse();
    let mut reversed_rules = builtin.clone();
    reversed_rules.reverse();
    let backward =
        Engine::new(&reversed_rules, Options::default()).evaluate(&store(&reversed_docs));
    assert_eq!(forward.desired, backward.desired);
    assert!(!forward.desired.is_empty());
}

const COPY: &str = r#"
# Named to sort before the producer: order comes from dependencies, not names.
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: a-copier}
spec:
  trigger: {kind: Namespace, metadataOnly: true}
  outputs:
  - kind: Role
    name: copied
    rulesFrom:
      clusterRoleSelector:
        matchLabels: {example.org/copy: "true"}
---
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: z-producer}
spec:
  trigger: {apiGroup: example.org, kind: Widget}
  outputs:
  - kind: ClusterRole
    name: "widget:{{trigger.metadata.name}}"
    labels: {example.org/copy: "true"}
    rules:
    - {apiGroups: [example.org], resources: ["{{trigger.metadata.name}}"], verbs: [get]}
    - {nonResourceURLs: [/healthz], verbs: [get]}
"#;

fn widget(name: &str) -> Value {
    json!({"apiVersion": "example.org/v1", "kind": "Widget", "metadata": {"name": name, "uid": format!("w-{name}")}})
}

/// The rules of Role `name`.
fn role_rules(eval: &rbac_rules::engine::Evaluation, name: &str) -> Value {
    support::engine::rules_of(eval, OutputKind::Role, name)
}

#[test]
fn roles_copy_cluster_roles_emitted_in_the_same_evaluation() {
    let eval = Engine::new(&rules(COPY), Options::default())
        .evaluate(&store(&[ns("t", json!({}), json!({})), widget("gears")]));
    // nonResourceURLs are dropped: Roles cannot carry them.
    assert_eq!(
        role_rules(&eval, "copied"),
        json!([{"apiGroups": ["example.org"], "resources": ["gears"], "verbs": ["get"]}])
    );
}

#[test]
fn stale_managed_cluster_roles_are_not_copied() {
    // The live cluster still has the role of a Widget that is gone; the
    // producer evaluated fine, so its stale output is about to be pruned and
    // must not leak into Roles.
    let stale = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "widget:old", "labels": {"example.org/copy": "true", "app.kubernetes.io/managed-by": "rbac-rules"},
                     "annotations": {"rbacrules.io/rule": "z-producer", "rbacrules.io/trigger": "Widget.example.org/old"}},
        "rules": [{"apiGroups": ["example.org"], "resources": ["old"], "verbs": ["*"]}]});
    let unmanaged = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "hand-made", "labels": {"example.org/copy": "true"}},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]});
    let eval = Engine::new(&rules(COPY), Options::default()).evaluate(&store(&[
        ns("t", json!({}), json!({})),
        widget("gears"),
        stale,
        unmanaged,
    ]));
    // Issue 41: a hand-made role only the selector found is left out (its
    // labels are data), with a warning; it was copied before.
    assert_eq!(
        role_rules(&eval, "copied"),
        json!([{"apiGroups": ["example.org"], "resources": ["gears"], "verbs": ["get"]}]),
        "neither hand-made roles the selector finds nor stale managed ones are copied"
    );
    assert!(
        eval.warnings()
            .any(|w| w.value == "hand-made" && w.message.contains("no rule manages it")),
        "{:?}",
        eval.warnings().collect::<Vec<_>>()
    );
}

#[test]
fn metadata_only_triggers_see_no_spec() {
    let yaml = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: m}
spec:
  trigger: {apiGroup: example.org, kind: Widget, metadataOnly: true}
  outputs:
  - {kind: ClusterRole, name: "w:{{trigger.spec.size}}"}
"#;
    let mut w = widget("big");
    w["spec"] = json!({"size": "xl"});
    let eval = Engine::new(&rules(yaml), Options::default()).evaluate(&store(&[w]));
    let err = &eval.reports["m"].errors[0];
    assert!(err.message.contains("missing variable"), "{err}");
}

#[test]
fn owner_references_only_where_kubernetes_allows_them() {
    let yaml = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: o}
spec:
  trigger: {apiGroup: example.org, kind: Gadget}
  outputs:
  - {kind: Role, name: same-ns}
  - {kind: Role, name: other-ns, namespace: elsewhere}
  - {kind: ClusterRole, name: "cluster-{{trigger.metadata.name}}"}
"#;
    let gadget = json!({"apiVersion": "example.org/v1", "kind": "Gadget", "metadata": {"name": "g", "namespace": "home", "uid": "g-1"}});
    let eval = Engine::new(&rules(yaml), Options::default()).evaluate(&store(&[gadget]));
    let owner = |name: &str| {
        eval.desired
            .iter()
            .find(|d| d.name == name)
            .map(|d| d.object.to_value()["metadata"]["ownerReferences"].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(
        owner("same-ns"),
        json!([{"apiVersion": "example.org/v1", "kind": "Gadget", "name": "g", "uid": "g-1", "controller": true, "blockOwnerDeletion": true}])
    );
    assert_eq!(
        owner("other-ns"),
        Value::Null,
        "a namespaced owner cannot own objects elsewhere"
    );
    assert_eq!(
        owner("cluster-g"),
        Value::Null,
        "a namespaced owner cannot own cluster-scoped objects"
    );
    let d = eval
        .desired
        .iter()
        .find(|d| d.name == "same-ns")
        .expect("same-ns");
    assert_eq!(
        d.object.to_value()["metadata"]["annotations"]["rbacrules.io/trigger"],
        "Gadget.example.org/home/g"
    );
    assert_eq!(
        d.object.to_value()["metadata"]["labels"]["rbacrules.io/rule"],
        "o"
    );
}

#[test]
fn for_each_outputs_and_merged_labels() {
    let yaml = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: each}
spec:
  trigger: {apiGroup: example.org, kind: Widget}
  related:
  - name: spaces
    objects: {kind: Namespace, selector: {matchLabels: {widget: "{{trigger.metadata.name}}"}}}
  outputs:
  - kind: ClusterRole
    name: "widget:{{trigger.metadata.name}}"
    labels:
      example.org/kind: widget
      $merge:
      - forEach: related.spaces
        as: s
        item: {"namespace.example.org/{{s.metadata.name}}": "true"}
  - kind: Role
    forEach: related.spaces
    as: s
    when: 'ne s.metadata.name "skip"'
    name: widget-user
    namespace: "{{s.metadata.name}}"
"#;
    let objects = [
        widget("w"),
        ns("n1", json!({"widget": "w"}), json!({})),
        ns("n2", json!({"widget": "w"}), json!({})),
        ns("skip", json!({"widget": "w"}), json!({})),
        ns("other", json!({"widget": "v"}), json!({})),
    ];
    let eval = Engine::new(&rules(yaml), Options::default()).evaluate(&store(&objects));
    assert_eq!(
        names(&eval),
        [
            "ClusterRole//widget:w",
            "Role/n1/widget-user",
            "Role/n2/widget-user"
        ]
    );
    let labels = &eval
        .desired
        .iter()
        .next()
        .expect("an object")
        .object
        .to_value()["metadata"]["labels"];
    assert_eq!(labels["namespace.example.org/n1"], "true");
    assert_eq!(labels["namespace.example.org/skip"], "true");
    assert!(labels.get("namespace.example.org/other").is_none());
}

#[test]
fn two_triggers_emitting_one_object_conflict_and_keep() {
    let yaml = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: clash}
spec:
  trigger: {kind: Namespace}
  outputs:
  - {kind: ClusterRole, name: "same-for-all"}
"#;
    let eval = Engine::new(&rules(yaml), Options::default()).evaluate(&store(&[
        ns("a", json!({}), json!({})),
        ns("b", json!({}), json!({})),
    ]));
    assert!(eval.desired.is_empty());
    assert!(eval.contested.contains(&(
        OutputKind::ClusterRole,
        String::new(),
        "same-for-all".to_string()
    )));
    assert!(
        eval.reports["clash"]
            .errors
            .iter()
            .all(|e| e.kind == ErrorKind::Conflict)
    );
    assert!(eval.keeps("clash", Some("Namespace/a")) && eval.keeps("clash", Some("Namespace/b")));
}

#[test]
fn manage_levels_switch_rules_off() {
    let builtin = rbac_rules::rules::builtin().expect("built-in rules");
    for (level, inactive) in [
        (
            ManageLevel::ServiceAccounts,
            vec![
                "crossplane-composite-users",
                "crossplane-namespace",
                "crossplane-provider-users",
                "crossplane-user-roles",
            ],
        ),
        (
            ManageLevel::Basic,
            vec!["crossplane-namespace", "crossplane-namespace-base"],
        ),
        (ManageLevel::All, vec![]),
    ] {
        let eval = Engine::new(
            &builtin,
            Options {
                manage: level,
                ..Options::default()
            },
        )
        .evaluate(&ObjectStore::new());
        let mut off: Vec<&str> = eval
            .reports
            .iter()
            .filter(|(_, r)| r.state == RuleState::Inactive)
            .map(|(n, _)| n.as_str())
            .collect();
        off.sort();
        let mut want = inactive.clone();
        if level == ManageLevel::ServiceAccounts {
            want.push("crossplane-namespace-base");
            want.sort();
        }
        assert_eq!(off, want, "inactive rules at {level}");
        assert!(eval.keeps(want.first().copied().unwrap_or("none"), None) || want.is_empty());
    }
}

#[test]
fn interests_name_every_kind_the_rules_read() {
    let builtin = rbac_rules::rules::builtin().expect("built-in rules");
    let engine = Engine::new(&builtin, Options::default());
    // The same answer without an engine.
    assert_eq!(
        rbac_rules::engine::interests(&builtin, &Options::default()),
        engine.interests()
    );
    let kinds: Vec<(String, bool)> = engine
        .interests()
        .into_iter()
        .map(|i| (i.gk.to_string(), i.metadata_only))
        .collect();
    assert_eq!(
        kinds,
        [
            ("Namespace".to_string(), true),
            (
                "CompositeResourceDefinition.apiextensions.crossplane.io".to_string(),
                false
            ),
            // Lineage: only CRDs' metadata (ownerReferences) is read.
            (
                "CustomResourceDefinition.apiextensions.k8s.io".to_string(),
                true
            ),
            ("Deployment.apps".to_string(), false),
            // Lineage: a revision's CRDs are no older than its Provider
            // (metadata only).
            ("Provider.pkg.crossplane.io".to_string(), true),
            ("ProviderRevision.pkg.crossplane.io".to_string(), false),
            ("ClusterRole.rbac.authorization.k8s.io".to_string(), false),
            // Policy judges the bindings by what a live role grants.
            ("Role.rbac.authorization.k8s.io".to_string(), false),
        ]
    );
}

#[test]
fn held_rules_keep_their_objects_visible_to_copiers() {
    let live = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "widget:gears", "labels": {"example.org/copy": "true", "app.kubernetes.io/managed-by": "rbac-rules"},
                     "annotations": {"rbacrules.io/rule": "z-producer", "rbacrules.io/trigger": "Widget.example.org/gears"}},
        "rules": [{"apiGroups": ["example.org"], "resources": ["gears"], "verbs": ["get"]}]});
    let options = Options {
        held: ["z-producer".to_string()].into(),
        ..Options::default()
    };
    // The Widget kind is not observed (its watch is not synced): the
    // producer is held, and the copier still sees its live role.
    let eval =
        Engine::new(&rules(COPY), options).evaluate(&store(&[ns("t", json!({}), json!({})), live]));
    assert_eq!(eval.reports["z-producer"].state, RuleState::Held);
    assert!(eval.keeps("z-producer", Some("Widget.example.org/gears")));
    assert_eq!(
        role_rules(&eval, "copied"),
        json!([{"apiGroups": ["example.org"], "resources": ["gears"], "verbs": ["get"]}])
    );
}

#[test]
fn a_cluster_role_copying_cluster_roles_never_reads_its_own_outputs() {
    let yaml = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: self}
spec:
  trigger: {kind: Namespace}
  outputs:
  - kind: ClusterRole
    name: "copy:{{trigger.metadata.name}}"
    labels: {example.org/copy: "true"}
    rulesFrom:
      clusterRoleSelector:
        matchLabels: {example.org/copy: "true"}
      # A role no rule manages is copied when named (issue 41: one only
      # the selector finds is left out).
      clusterRoleNames: [base]
"#;
    let base = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "base", "labels": {"example.org/copy": "true"}},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]});
    // Its own output from an earlier evaluation is live too.
    let previous = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "copy:a", "labels": {"example.org/copy": "true", "app.kubernetes.io/managed-by": "rbac-rules"},
                     "annotations": {"rbacrules.io/rule": "self", "rbacrules.io/trigger": "Namespace/a"}},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}]});
    let eval = Engine::new(&rules(yaml), Options::default()).evaluate(&store(&[
        ns("a", json!({}), json!({})),
        ns("b", json!({}), json!({})),
        base,
        previous,
    ]));
    assert_eq!(
        eval.errors().count(),
        0,
        "no self-cycle: {:?}",
        eval.errors().collect::<Vec<_>>()
    );
    for d in &eval.desired {
        assert_eq!(
            d.object.to_value()["rules"],
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
            "{}",
            d.name
        );
    }
}

#[test]
fn interests_by_rule_are_per_rule() {
    let all = rules(COPY);
    let kinds = |r: &str| {
        let one: Vec<_> = all.iter().filter(|s| s.name == r).cloned().collect();
        let interests = Engine::new(&one, Options::default()).interests();
        assert_eq!(
            rbac_rules::engine::interests(&one, &Options::default()),
            interests
        );
        interests
            .iter()
            .map(|i| i.gk.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        kinds("a-copier"),
        ["Namespace", "ClusterRole.rbac.authorization.k8s.io"]
    );
    assert_eq!(kinds("z-producer"), ["Widget.example.org"]);
}

#[test]
fn an_xrd_with_the_longest_possible_name_gets_its_roles() {
    // XRD names are CRD names: up to 253 characters. Role names built from
    // them exceed 253, which Kubernetes allows for RBAC objects.
    // A real group: DNS labels of at most 63 characters (the rules refuse
    // anything else), 200 characters in all.
    let group = format!("{0}.{0}.{1}.example.org", "g".repeat(63), "g".repeat(60));
    assert_eq!(group.len(), 200);
    let name = format!("{}.{group}", "x".repeat(253 - group.len() - 1));
    assert_eq!(name.len(), 253);
    let xrd = json!({"apiVersion": "apiextensions.crossplane.io/v1", "kind": "CompositeResourceDefinition",
        "metadata": {"name": name, "uid": "xrd-long", "creationTimestamp": support::engine::OWNER_CREATED},
        "spec": {"group": group, "names": {"kind": "XLong", "plural": "x".repeat(253 - group.len() - 1)}}});
    let crd = support::engine::crd(&name, "CompositeResourceDefinition", "xrd-long", true);
    let builtin = rbac_rules::rules::builtin().expect("built-in rules");
    let eval = Engine::new(&builtin, Options::default()).evaluate(&store(&[xrd, crd]));
    assert_eq!(
        eval.errors().count(),
        0,
        "{:?}",
        eval.errors().collect::<Vec<_>>()
    );
    let roles: Vec<&str> = eval
        .desired
        .iter()
        .filter(|d| d.name.contains(&name))
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(roles.len(), 4, "{roles:?}");
    assert!(roles.iter().all(|r| r.len() > 253));
}

#[test]
fn vars_are_computed_once_per_trigger_and_shared_by_outputs() {
    let yaml = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: v}
spec:
  trigger: {apiGroup: example.org, kind: Widget}
  vars:
  - {name: owner, value: 'default (get trigger "metadata.labels.team") "nobody"'}
  - {name: prefix, value: 'concat "widget:" vars.owner'}
  outputs:
  - {kind: ClusterRole, name: "{{vars.prefix}}:{{trigger.metadata.name}}:view"}
  - {kind: ClusterRole, name: "{{vars.prefix}}:{{trigger.metadata.name}}:edit"}
"#;
    let mut w = widget("w1");
    w["metadata"]["labels"] = json!({"team": "blue"});
    let eval = Engine::new(&rules(yaml), Options::default()).evaluate(&store(&[w, widget("w2")]));
    assert_eq!(
        names(&eval),
        [
            "ClusterRole//widget:blue:w1:edit",
            "ClusterRole//widget:blue:w1:view",
            "ClusterRole//widget:nobody:w2:edit",
            "ClusterRole//widget:nobody:w2:view"
        ]
    );
}

/// A forEach list is lent to its loop (not copied) only when nothing in
/// the loop reads it: a loop that does, one after, an inner loop over an
/// entry and a loop that fails half way all still see the whole list.
#[test]
fn for_each_lists_stay_whole_for_whoever_reads_them() {
    let yaml = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: r}
spec:
  trigger: {kind: Namespace}
  vars:
  - {name: xs, value: 'list "cats" "dogs"'}
  - {name: gs, value: 'groupBy (list trigger.metadata) "name"'}
  outputs:
  - kind: Role
    name: x
    rules:
    - forEach: vars.xs
      as: x
      item: {apiGroups: [x.io], resources: ["{{x}}"], verbs: [get]}
    - forEach: vars.xs
      as: x
      item: {apiGroups: [x.io], resources: ['{{x}}{{join vars.xs ""}}'], verbs: [list]}
    - forEach: vars.gs
      as: g
      item:
        apiGroups: ["{{g.key}}.io"]
        resources: [{forEach: g.items, as: t, item: "{{t.name}}"}]
        verbs: [watch]
    - forEach: vars.xs
      as: x
      item: {apiGroups: [x.io], resources: ["{{x}}{{vars.xs.[0]}}"], verbs: [create]}
"#;
    let eval = Engine::new(&rules(yaml), Options::default()).evaluate(&store(&[ns(
        "a",
        json!({}),
        json!({}),
    )]));
    let errors: Vec<_> = eval.errors().collect();
    assert!(errors.is_empty(), "{errors:?}");
    let role = eval.desired.iter().next().expect("one role");
    assert_eq!(
        role.object.to_value()["rules"],
        json!([
            {"apiGroups": ["x.io"], "resources": ["cats"], "verbs": ["get"]},
            {"apiGroups": ["x.io"], "resources": ["dogs"], "verbs": ["get"]},
            {"apiGroups": ["x.io"], "resources": ["catscatsdogs"], "verbs": ["list"]},
            {"apiGroups": ["x.io"], "resources": ["dogscatsdogs"], "verbs": ["list"]},
            {"apiGroups": ["a.io"], "resources": ["a"], "verbs": ["watch"]},
            {"apiGroups": ["x.io"], "resources": ["catscats"], "verbs": ["create"]},
            {"apiGroups": ["x.io"], "resources": ["dogscats"], "verbs": ["create"]},
        ])
    );
}

/// A listField entry judged once is judged the same for every trigger
/// that lists it: each still drops it and warns about it.
#[test]
fn shared_list_entries_warn_for_every_trigger() {
    let yaml = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: r}
spec:
  trigger: {apiGroup: example.org, kind: Widget}
  related:
  - name: types
    listField: {path: spec.refs}
    where:
    - {value: '{{get item "kind" ""}}', equals: Thing}
    require:
    - {path: name, format: dnsLabel, message: not a label}
  outputs:
  - kind: ClusterRole
    name: "w-{{trigger.metadata.name}}"
    rules:
    - apiGroups: [x.io]
      resources: [{forEach: related.types, as: t, item: "{{t.name}}"}]
      verbs: [get]
"#;
    let refs = json!([{"kind": "Thing", "name": "good"}, {"kind": "Thing", "name": "BAD"},
                      {"kind": "Other", "name": "other"}]);
    let widget = |name: &str| {
        json!({"apiVersion": "example.org/v1", "kind": "Widget",
               "metadata": {"name": name}, "spec": {"refs": refs}})
    };
    let eval =
        Engine::new(&rules(yaml), Options::default()).evaluate(&store(&[widget("a"), widget("b")]));
    assert_eq!(eval.errors().count(), 0);
    for d in &eval.desired {
        assert_eq!(
            d.object.to_value()["rules"],
            json!([{"apiGroups": ["x.io"], "resources": ["good"], "verbs": ["get"]}]),
            "{}",
            d.name
        );
    }
    let warned: Vec<_> = eval.reports["r"]
        .warnings
        .iter()
        .map(|w| (w.trigger.clone(), w.value.clone()))
        .collect();
    assert_eq!(
        warned,
        [
            (Some("Widget.example.org/a".to_string()), "BAD".to_string()),
            (Some("Widget.example.org/b".to_string()), "BAD".to_string()),
        ]
    );
}

/// A rule reading parts of its Widget trigger in every way templates can;
/// `NAME` and `EXTRA` (more output fields) are filled in by the test.
const TRIGGER_PARTS: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: NAME}
spec:
  trigger: {apiGroup: example.org, kind: Widget}
  related:
  - {name: refs, listField: {path: status.refs}}
  outputs:
  - kind: ClusterRole
    when: trigger.spec.on
    name: 'NAME:{{trigger.metadata.name}}:{{trigger.spec.a.b}}:{{get trigger "spec.c" "none"}}'
    labels: {size: '{{trigger.metadata.labels.[example.org/size]}}'}EXTRA
    rules:
    - apiGroups: [example.org]
      resources:
      - {forEach: trigger.spec.kinds, as: k, item: "{{k}}"}
      - {forEach: related.refs, item: "{{item.name}}"}
      verbs: [get]
"#;

/// Templates see the parts of the trigger they read (the engine binds only
/// those): the same rule reading the trigger whole renders the same.
#[test]
fn templates_see_every_part_of_the_trigger_they_read() {
    let rule =
        |name: &str, extra: &str| TRIGGER_PARTS.replace("NAME", name).replace("EXTRA", extra);
    let whole = format!(
        "{}---{}",
        rule("parts", ""),
        rule("whole", "\n    annotations: {all: '{{json trigger}}'}")
    );
    let mut w = widget("w1");
    w["metadata"]["labels"] = json!({"example.org/size": "xl"});
    w["spec"] = json!({"on": true, "a": {"b": "deep"}, "c": "see", "kinds": ["gadgets", "gizmos"]});
    w["status"] = json!({"refs": [{"name": "widgets"}, {"name": "sprockets"}]});
    let eval = Engine::new(&rules(&whole), Options::default()).evaluate(&store(&[w]));
    assert!(
        eval.reports.values().all(|r| r.errors.is_empty()),
        "{:?}",
        eval.reports
    );
    let get = |name: &str| {
        eval.desired
            .iter()
            .find(|d| d.name == name)
            .map(|d| d.object.to_value())
            .unwrap_or(Value::Null)
    };
    let parts = get("parts:w1:deep:see");
    let whole = get("whole:w1:deep:see");
    assert_eq!(parts["metadata"]["labels"]["size"], "xl");
    assert_eq!(
        parts["rules"],
        json!([{"apiGroups": ["example.org"], "resources": ["gadgets", "gizmos", "sprockets", "widgets"], "verbs": ["get"]}])
    );
    assert_eq!(parts["rules"], whole["rules"]);
    assert_eq!(whole["metadata"]["labels"]["size"], "xl");
}
