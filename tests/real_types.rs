//! Rules believe only real types, and tenants bind only what they may:
//! hostile trigger data (tests/golden/*-hostile*) is skipped with a warning
//! naming rule, trigger, field and value, and the rest of the trigger is
//! still rendered. Also the generic language behind it: `require`,
//! `format`, `notRegex`, `in`, `optional` and `extract.unmatched`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

mod support;
use support::engine::{builtin, granted, store};

use rbac_rules::engine::{
    Engine, EngineWarning, Evaluation, Memo, ObjectStore, Options, RuleSource,
};
use serde_json::{Value, json};

fn golden_objects(case: &str) -> ObjectStore {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(case)
        .join("objects.yaml");
    let mut store = ObjectStore::new();
    for doc in rbac_rules::yaml::load_paths(&[path]).expect("objects load") {
        store.insert(doc.value.clone()).expect("object inserts");
    }
    store
}

fn example_rules(dir: &str) -> Vec<RuleSource> {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    rbac_rules::rules::load(&[path]).expect("rules load")
}

fn evaluate(rules: &[RuleSource], store: &ObjectStore) -> Evaluation {
    let eval = Engine::new(rules, Options::default()).evaluate(store);
    let errors: Vec<String> = eval.errors().map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "unexpected errors: {errors:#?}");
    eval
}

/// (rule, field, trigger, value) of every warning.
fn warned(eval: &Evaluation) -> BTreeSet<(String, String, String, String)> {
    eval.warnings()
        .map(|w| {
            (
                w.rule.clone(),
                w.field.clone(),
                w.trigger.clone().unwrap_or_default(),
                w.value.clone(),
            )
        })
        .collect()
}

fn object(eval: &Evaluation, kind: &str, ns: &str, name: &str) -> Value {
    eval.desired
        .iter()
        .find(|d| d.kind.as_str() == kind && d.namespace == ns && d.name == name)
        .unwrap_or_else(|| panic!("{kind} {ns}/{name} is emitted"))
        .object
        .to_value()
}

fn pairs(items: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    items
        .iter()
        .map(|(g, r)| (g.to_string(), r.to_string()))
        .collect()
}

#[test]
fn hostile_xrds_render_nothing_and_are_warned_about() {
    let eval = evaluate(&builtin(), &golden_objects("xrd-hostile"));
    let xrd = "CompositeResourceDefinition.apiextensions.crossplane.io/";
    // Only the good XRD's trigger emits anything.
    let triggers: BTreeSet<&str> = eval
        .desired
        .iter()
        .filter_map(|d| d.trigger.as_deref())
        .collect();
    assert_eq!(
        triggers,
        BTreeSet::from([format!("{xrd}xbuckets.storage.example.org").as_str()])
    );
    let edit = object(
        &eval,
        "ClusterRole",
        "",
        "crossplane:composite:xbuckets.storage.example.org:aggregate-to-edit",
    );
    assert_eq!(
        granted(edit),
        pairs(&[
            ("storage.example.org", "buckets"),
            ("storage.example.org", "buckets/status"),
            ("storage.example.org", "xbuckets"),
            ("storage.example.org", "xbuckets/status"),
        ])
    );
    for rule in ["crossplane-composite-system", "crossplane-composite-users"] {
        let expected: BTreeSet<(String, String, String, String)> = [
            ("spec.trigger.require[0]", "star-group", "*"),
            ("spec.trigger.require[1]", "star-plural", "*"),
            ("spec.trigger.require[0]", "core-secrets", ""),
            (
                "spec.trigger.require[0]",
                "rbac-clusterroles",
                "rbac.authorization.k8s.io",
            ),
            ("spec.trigger.require[0]", "apps-deployments", "apps"),
            ("spec.trigger.require[1]", "upper", "Uppers"),
            ("spec.trigger.require[2]", "xthings.good.example.org", "*"),
        ]
        .iter()
        .map(|(f, t, v)| {
            (
                rule.to_string(),
                f.to_string(),
                format!("{xrd}{t}"),
                v.to_string(),
            )
        })
        .collect();
        let got: BTreeSet<_> = warned(&eval).into_iter().filter(|w| w.0 == rule).collect();
        assert_eq!(got, expected, "warnings of {rule}");
    }
    // The report counts the skipped triggers as matched, and each warning
    // says why.
    let report = &eval.reports["crossplane-composite-users"];
    assert_eq!(report.matched_triggers, 8);
    let w: &EngineWarning = report
        .warnings
        .iter()
        .find(|w| w.value == "*" && w.field == "spec.trigger.require[0]")
        .expect("a warning about group *");
    assert!(w.message.contains("API group"), "{}", w.message);
    let text = w.to_string();
    assert!(
        text.contains("rule \"crossplane-composite-users\"")
            && text.contains("star-group")
            && text.contains("skipped \"*\""),
        "{text}"
    );
}

const BAD_REFS: &[&str] = &[
    "*.*",
    "x.*",
    "*.rbac.authorization.k8s.io",
    "*.apps",
    "secrets.",
    "pods.core",
    "clusterroles.rbac.authorization.k8s.io",
    "foo.bar.k8s.io",
];

#[test]
fn hostile_object_refs_are_skipped_and_the_good_one_rendered() {
    let eval = evaluate(&builtin(), &golden_objects("provider-hostile-objectrefs"));
    let trigger = "ProviderRevision.pkg.crossplane.io/provider-evil-5555";
    for rule in ["crossplane-provider-system", "crossplane-provider-users"] {
        // Lineage: the revision's objectRefs are not read at all; of the
        // CRDs it owns, those in a Kubernetes group are skipped with a
        // warning. The CRDs it names but does not own (the controller's
        // own type, another tool's, another provider's) are never granted.
        let mut expected: BTreeSet<(String, String, String, String)> = BTreeSet::new();
        for v in ["foo.bar.k8s.io", "nodes.x.kubernetes.io"] {
            expected.insert((
                rule.to_string(),
                "spec.related[3].require[0]".to_string(),
                trigger.to_string(),
                v.to_string(),
            ));
        }
        let got: BTreeSet<_> = warned(&eval).into_iter().filter(|w| w.0 == rule).collect();
        assert_eq!(got, expected, "warnings of {rule}");
    }
    let good = pairs(&[
        ("good.example.org", "widgets"),
        ("good.example.org", "widgets/status"),
    ]);
    for role in ["aggregate-to-edit", "aggregate-to-view"] {
        let name = format!("crossplane:provider:provider-evil-5555:{role}");
        assert_eq!(granted(object(&eval, "ClusterRole", "", &name)), good);
    }
    let system = granted(object(
        &eval,
        "ClusterRole",
        "",
        "crossplane:provider:provider-evil-5555:system",
    ));
    // Only the fixed grants of the rule itself beside the good type.
    let groups: BTreeSet<&str> = system.iter().map(|(g, _)| g.as_str()).collect();
    assert_eq!(
        groups,
        BTreeSet::from([
            "",
            "coordination.k8s.io",
            "events.k8s.io",
            "good.example.org"
        ])
    );
    assert!(!system.iter().any(|(g, r)| g == "*" || (r == "*")));
}

#[test]
fn package_isolation_believes_only_crd_names_and_binds_in_crossplane_system() {
    let rules = example_rules("rules/examples/package-isolation");
    let eval = evaluate(
        &rules,
        &golden_objects("examples-package-isolation-hostile"),
    );
    let cluster = "ClusterPackageInstall.packages.crossplane.io/provider-evil";
    let values: BTreeSet<String> = eval
        .warnings()
        .filter(|w| {
            w.rule == "package-isolation-cluster-package-users"
                && w.trigger.as_deref() == Some(cluster)
                && w.field == "spec.related[3].require[0]"
        })
        .map(|w| w.value.clone())
        .collect();
    let mut expected: BTreeSet<String> = BAD_REFS.iter().map(|s| s.to_string()).collect();
    expected.insert("(missing)".to_string());
    assert_eq!(values, expected);
    // dependsOnCRDs are checked too.
    assert!(eval.warnings().any(|w| {
        w.rule == "package-isolation-cluster-package-system"
            && w.field == "spec.related[4].require[0]"
            && w.value == "*.*"
    }));
    // Lineage: a well-formed name is believed only when the package manager
    // labelled its CRD for this install's scope (and namespace).
    let unproven = |rule: &str, trigger: &str, field: &str| -> BTreeSet<String> {
        eval.warnings()
            .filter(|w| w.rule == rule && w.trigger.as_deref() == Some(trigger) && w.field == field)
            .map(|w| w.value.clone())
            .collect()
    };
    assert_eq!(
        unproven(
            "package-isolation-cluster-package-users",
            cluster,
            "spec.related[3].require[1]"
        ),
        BTreeSet::from([
            "certificates.cert-manager.io".to_string(),
            "ghosts.nowhere.example.org".to_string()
        ])
    );
    assert_eq!(
        unproven(
            "package-isolation-cluster-package-system",
            cluster,
            "spec.related[4].require[1]"
        ),
        BTreeSet::from(["secretstores.vault.example.org".to_string()])
    );
    let tenant = "PackageInstall.packages.crossplane.io/team-b/tenant-pkg";
    assert_eq!(
        unproven(
            "package-isolation-namespace-package-users",
            tenant,
            "spec.related[4].require[1]"
        ),
        BTreeSet::from([
            "certificates.cert-manager.io".to_string(),
            "secretstores.vault.example.org".to_string()
        ])
    );
    for role in ["admin", "edit", "view"] {
        let name = format!("package:evil:provider-evil:v1:{role}");
        assert_eq!(
            granted(object(&eval, "ClusterRole", "", &name)),
            pairs(&[("good.example.org", "widgets")])
        );
    }
    let system = granted(object(
        &eval,
        "ClusterRole",
        "",
        "package:evil:provider-evil:v1:system",
    ));
    let custom: BTreeSet<&str> = system
        .iter()
        .map(|(g, _)| g.as_str())
        .filter(|g| !["", "events.k8s.io"].contains(g))
        .collect();
    assert_eq!(
        custom,
        BTreeSet::from(["dep.example.org", "good.example.org"])
    );
    // The ServiceAccount namespace is the rule's, not spec.namespace.
    let binding = eval
        .desired
        .iter()
        .find(|d| d.kind.as_str() == "ClusterRoleBinding" && d.rule.ends_with("system"))
        .expect("the system binding");
    assert_eq!(
        binding.object.to_value()["subjects"],
        json!([{"apiGroup": "", "kind": "ServiceAccount", "name": "provider-evil", "namespace": "crossplane-system"}])
    );
    // The tenant's package: only its good CRD.
    assert_eq!(
        granted(object(
            &eval,
            "ClusterRole",
            "",
            "package:team-b:tenant:pkg:v1:view"
        )),
        pairs(&[("good.example.org", "tenants")])
    );
}

#[test]
fn repo_sync_tenants_bind_only_the_allow_set() {
    let rules = example_rules("rules/examples/config-sync");
    let eval = evaluate(
        &rules,
        &golden_objects("examples-config-sync-repo-sync-hostile"),
    );
    let bound: BTreeSet<String> = eval
        .desired
        .iter()
        .filter(|d| &*d.rule == "configsync-repo-sync")
        .map(|d| {
            let (kind, name) = d.object.role_ref().unwrap_or_default();
            format!("{kind}/{name}")
        })
        .collect();
    assert_eq!(
        bound,
        BTreeSet::from([
            "ClusterRole/configsync.gke.io:ns-reconciler".to_string(),
            "ClusterRole/view".to_string(),
            "ClusterRole/team-deployer".to_string(),
            "Role/deployer".to_string(),
        ])
    );
    let trigger = "RepoSync.configsync.gke.io/team-a/repo-sync".to_string();
    let expected: BTreeSet<(String, String, String, String)> = [
        ("spec.related[1].require[0]", "cluster-admin"),
        ("spec.related[1].require[0]", "system:controller:foo"),
        ("spec.related[1].require[1]", "secret-reader-everywhere"),
        ("spec.related[2].require[0]", "(missing)"),
        ("spec.related[2].require[1]", "system:foo"),
    ]
    .iter()
    .map(|(f, v)| {
        (
            "configsync-repo-sync".to_string(),
            f.to_string(),
            trigger.clone(),
            v.to_string(),
        )
    })
    .collect();
    assert_eq!(warned(&eval), expected);
}

const GENERIC: &str = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: widgets}
spec:
  trigger:
    apiGroup: example.org
    kind: Widget
    require:
    - path: spec.group
      format: customGroup
    - path: spec.extra
      optional: true
      format: dnsLabel
      message: extra must be a label
  related:
  - name: types
    listField:
      path: spec.types
      extract: {path: name, regex: '(?P<plural>[a-z]+)\.(?P<group>.+)', unmatched: warn}
    require:
    - path: group
      in: 'list trigger.spec.group "other.example.org"'
    - path: plural
      notRegex: 'secret.*'
  outputs:
  - kind: ClusterRole
    name: "widget:{{trigger.metadata.name}}"
    rules:
    - forEach: related.types
      as: t
      item: {apiGroups: ["{{t.group}}"], resources: ["{{t.plural}}"], verbs: [get]}
"#;

fn widget(name: &str, group: &str, extra: Option<&str>, types: &[&str]) -> Value {
    let mut spec = json!({"group": group,
        "types": types.iter().map(|t| json!({"name": t})).collect::<Vec<_>>()});
    if let Some(e) = extra {
        spec["extra"] = json!(e);
    }
    json!({"apiVersion": "example.org/v1", "kind": "Widget",
           "metadata": {"name": name, "uid": format!("uid-{name}")}, "spec": spec})
}

#[test]
fn generic_require_format_in_not_regex_optional_and_unmatched_warn() {
    let rules = rbac_rules::rules::parse_text(Path::new("generic.yaml"), GENERIC).expect("parses");
    let objects = store(&[
        widget(
            "a",
            "a.example.org",
            None,
            &[
                "things.a.example.org",
                "nodot",
                "secrets.a.example.org",
                "x.evil.org",
                "others.other.example.org",
            ],
        ),
        widget("b", "*", None, &["things.a.example.org"]),
        widget("c", "c.example.org", Some("Not A Label"), &[]),
        widget("d", "d.example.org", Some("fine"), &[]),
    ]);
    let eval = evaluate(&rules, &objects);
    let w = |t: &str| format!("Widget.example.org/{t}");
    let expected: BTreeSet<(String, String, String, String)> = [
        ("spec.related[0].listField.extract", w("a"), "nodot"),
        ("spec.related[0].require[1]", w("a"), "secrets"),
        ("spec.related[0].require[0]", w("a"), "evil.org"),
        ("spec.trigger.require[0]", w("b"), "*"),
        ("spec.trigger.require[1]", w("c"), "Not A Label"),
    ]
    .iter()
    .map(|(f, t, v)| {
        (
            "widgets".to_string(),
            f.to_string(),
            t.clone(),
            v.to_string(),
        )
    })
    .collect();
    assert_eq!(warned(&eval), expected);
    let msg = |field: &str| {
        eval.warnings()
            .find(|x| x.field == field)
            .map(|x| x.message.clone())
            .unwrap_or_default()
    };
    assert_eq!(msg("spec.trigger.require[0]"), "not a valid customGroup");
    assert_eq!(msg("spec.trigger.require[1]"), "extra must be a label");
    assert_eq!(
        msg("spec.related[0].listField.extract"),
        "does not match the extract regex"
    );
    // The rest of a trigger still renders; a refused trigger renders nothing
    // and its earlier outputs are not kept (they are pruned).
    assert_eq!(
        granted(object(&eval, "ClusterRole", "", "widget:a")),
        pairs(&[("a.example.org", "things"), ("other.example.org", "others")])
    );
    // d passes its optional check (a label) and renders, with no types.
    assert!(granted(object(&eval, "ClusterRole", "", "widget:d")).is_empty());
    for t in ["b", "c"] {
        assert!(!eval.desired.iter().any(|d| d.name == format!("widget:{t}")));
        assert!(!eval.keeps("widgets", Some(&w(t))));
    }
}

#[test]
fn invalid_conditions_are_rule_errors() {
    let text = r#"
apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {name: bad}
spec:
  trigger:
    kind: Namespace
    require:
    - {path: metadata.name, format: dnsLabel, equals: x}
    - {value: "{{trigger.metadata.name}}", optional: true, format: dnsLabel}
    - {path: metadata.name, notRegex: "("}
    - {path: metadata.name, in: "list ("}
  outputs:
  - kind: ClusterRole
    name: x
"#;
    let rules = rbac_rules::rules::parse_text(Path::new("bad.yaml"), text).expect("parses");
    let eval = Engine::new(&rules, Options::default()).evaluate(&ObjectStore::new());
    let fields: BTreeSet<String> = eval.errors().map(|e| e.field.clone()).collect();
    for f in [
        "spec.trigger.require[0]",
        "spec.trigger.require[1].optional",
        "spec.trigger.require[2].notRegex",
        "spec.trigger.require[3].in",
    ] {
        assert!(fields.contains(f), "{f} not in {fields:?}");
    }
}

#[test]
fn incremental_evaluation_keeps_the_warnings() {
    let rules = builtin();
    let engine = Engine::new(&rules, Options::default());
    let mut objects = golden_objects("provider-hostile-objectrefs");
    let full = engine.evaluate(&objects);
    let mut memo = Memo::new();
    let first = engine.evaluate_incremental(&objects, &mut memo);
    assert_eq!(warned(&first), warned(&full));
    // An unrelated change: the revision's render is reused, and so are its
    // warnings.
    objects
        .insert(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "unrelated"}}))
        .expect("inserts");
    let second = engine.evaluate_incremental(&objects, &mut memo);
    assert_eq!(warned(&second), warned(&engine.evaluate(&objects)));
    assert!(!warned(&second).is_empty());
}

#[test]
fn render_prints_warnings_on_stderr_and_exits_zero() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = support::cli::output(
        support::cli::command(["render", "--objects"])
            .arg(root.join("tests/golden/provider-hostile-objectrefs/objects.yaml")),
    );
    assert_eq!(out.code, Some(0));
    let stderr = out.stderr;
    assert!(
        stderr.lines().any(|l| l.starts_with("warning: rules/crossplane-provider.yaml#1: rule \"crossplane-provider-system\": spec.related[3].require[0] (trigger ProviderRevision.pkg.crossplane.io/provider-evil-5555): skipped \"foo.bar.k8s.io\"")),
        "{stderr}"
    );
    assert!(!stderr.contains("error"), "{stderr}");
    let stdout = out.stdout;
    assert!(stdout.contains("good.example.org"));
    assert!(!stdout.contains("rbac.authorization.k8s.io\n  resources:\n  - \"*\""));
}
