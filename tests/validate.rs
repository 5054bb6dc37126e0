//! `rbac-rules validate`: each lint's message, exit status and formats.

mod support;
use support::cli::run_in;

struct Run {
    code: Option<i32>,
    /// Everything printed: findings and summary (stderr), data (stdout).
    stdout: String,
    /// Standard output alone: only `-o json|yaml` writes there.
    data: String,
}

fn rule(name: &str, body: &str) -> String {
    format!(
        "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRule\nmetadata:\n  name: {name}\nspec:\n{body}"
    )
}

/// A rule triggered by CRDs (a built-in kind with a schema) emitting one
/// ClusterRole whose resource and verbs are given.
fn crd_rule(resource: &str, verbs: &str) -> String {
    rule(
        "crd-roles",
        &format!(
            "  trigger:\n    apiGroup: apiextensions.k8s.io\n    kind: CustomResourceDefinition\n  outputs:\n  - kind: ClusterRole\n    name: \"crd:{{{{trigger.metadata.name}}}}\"\n    rules:\n    - apiGroups: [\"{{{{trigger.spec.group}}}}\"]\n      resources: [\"{resource}\"]\n      verbs: {verbs}\n"
        ),
    )
}

fn validate(rules: &str, objects: Option<&str>, extra: &[&str]) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules_path = dir.path().join("rules.yaml");
    std::fs::write(&rules_path, rules).expect("write rules");
    let mut cmd = support::cli::rbac_rules();
    cmd.arg("validate").arg("--rules").arg(&rules_path);
    if let Some(o) = objects {
        let p = dir.path().join("objects.yaml");
        std::fs::write(&p, o).expect("write objects");
        cmd.arg("--objects").arg(p);
    }
    let out = cmd.args(extra).output().expect("run rbac-rules");
    let data = String::from_utf8_lossy(&out.stdout).into_owned();
    Run {
        code: out.status.code(),
        stdout: format!("{}{data}", String::from_utf8_lossy(&out.stderr)),
        data,
    }
}

fn assert_has(r: &Run, code: i32, needles: &[&str]) {
    assert_eq!(r.code, Some(code), "exit status; output:\n{}", r.stdout);
    for n in needles {
        assert!(r.stdout.contains(n), "output lacks {n:?}:\n{}", r.stdout);
    }
}

#[test]
fn a_clean_rule_passes() {
    let r = validate(
        &crd_rule("{{trigger.spec.names.plural}}", "[get, list]"),
        None,
        &[],
    );
    assert_has(&r, 0, &["0 error(s), 0 warning(s)"]);
}

#[test]
fn a_misspelt_trigger_field_suggests_the_field() {
    let r = validate(
        &crd_rule("{{trigger.spec.nmes.plural}}", "[get]"),
        None,
        &[],
    );
    assert_has(
        &r,
        1,
        &[
            "error: ",
            "RbacRule \"crd-roles\": spec.outputs[0].rules[0].resources[0]: trigger.spec.nmes.plural: \
             CustomResourceDefinition.apiextensions.k8s.io has no field spec.nmes \
             (did you mean trigger.spec.names?)",
            "1 error(s), 0 warning(s)",
        ],
    );
}

const WIDGET_CRD: &str = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.example.org\nspec:\n  group: example.org\n  names: {kind: Widget, plural: widgets}\n  scope: Cluster\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        properties:\n          spec:\n            type: object\n            properties:\n              owner: {type: string}\n              tier: {type: string}\n";

fn widget_rule(read: &str) -> String {
    rule(
        "widgets",
        &format!(
            "  trigger:\n    apiGroup: example.org\n    kind: Widget\n  outputs:\n  - kind: ClusterRole\n    name: \"widget:{{{{trigger.metadata.name}}}}\"\n    rules:\n    - apiGroups: [example.org]\n      resources: [widgets]\n      resourceNames: [\"{read}\"]\n      verbs: [get]\n"
        ),
    )
}

#[test]
fn custom_kinds_are_checked_against_their_crd() {
    let ok = validate(
        &widget_rule("{{trigger.spec.owner}}-{{trigger.metadata.name}}"),
        Some(WIDGET_CRD),
        &[],
    );
    assert_has(&ok, 0, &["0 error(s), 0 warning(s)"]);
    let bad = validate(&widget_rule("{{trigger.spec.ownr}}"), Some(WIDGET_CRD), &[]);
    assert_has(
        &bad,
        1,
        &[
            "trigger.spec.ownr: Widget.example.org has no field spec.ownr (did you mean trigger.spec.owner?)",
        ],
    );
}

#[test]
fn an_unknown_trigger_kind_is_a_warning_and_an_error_when_strict() {
    let r = validate(&widget_rule("{{trigger.spec.ownr}}"), None, &[]);
    assert_has(
        &r,
        0,
        &[
            "warning: ",
            "spec.trigger.kind: unknown trigger kind Widget.example.org: not built in, and no \
             CustomResourceDefinition in --objects defines it",
            "0 error(s), 1 warning(s)",
        ],
    );
    let strict = validate(&widget_rule("x"), None, &["--strict"]);
    assert_has(&strict, 1, &["unknown trigger kind Widget.example.org"]);
}

#[test]
fn an_unknown_verb_suggests_the_known_one() {
    let r = validate(&crd_rule("x", "[gett, list]"), None, &[]);
    assert_has(
        &r,
        1,
        &[
            "spec.outputs[0].rules[0].verbs[0]: unknown verb \"gett\" (did you mean \"get\"?); \
             a custom verb must be listed in the rule's annotation rbacrules.io/custom-verbs",
        ],
    );
    assert!(!r.stdout.contains("verbs[1]"), "{}", r.stdout);
}

#[test]
fn a_custom_verb_is_declared_by_annotation() {
    let text = crd_rule("x", "[frobnicate]").replace(
        "  name: crd-roles\n",
        "  name: crd-roles\n  annotations:\n    rbacrules.io/custom-verbs: \"frobnicate, twiddle\"\n",
    );
    assert_has(&validate(&text, None, &[]), 0, &["0 error(s)"]);
}

#[test]
fn a_parse_error_is_reported_with_its_field() {
    let r = validate(&crd_rule("{{trigger.spec.names.plural", "[get]"), None, &[]);
    assert_has(
        &r,
        1,
        &[
            "RbacRule \"crd-roles\": spec.outputs[0].rules[0].resources[0]: ",
            "(line 1, column ",
        ],
    );
    assert!(r.stdout.contains("1 error(s)"), "{}", r.stdout);
}

#[test]
fn unknown_helpers_and_wrong_arity() {
    let r = validate(
        &crd_rule(
            "{{shortn trigger.spec.names.plural 20}}-{{default trigger.metadata.name}}",
            "[get]",
        ),
        None,
        &[],
    );
    assert_has(
        &r,
        1,
        &[
            "unknown helper \"shortn\" (did you mean \"shorten\"?)",
            "helper default: takes 2 argument(s), got 1",
        ],
    );
}

/// The suggestions come from the helpers the engine registers: `json`,
/// which an older hand-kept list missed, is one.
#[test]
fn unknown_helpers_are_matched_against_every_registered_helper() {
    let r = validate(&crd_rule("{{jsn trigger.spec}}", "[get]"), None, &[]);
    assert_has(&r, 1, &["unknown helper \"jsn\" (did you mean \"json\"?)"]);
}

#[test]
fn long_label_values_are_flagged() {
    let text = crd_rule("x", "[get]").replace(
        "    rules:\n",
        "    labels:\n      example.org/crd: \"{{trigger.metadata.name}}\"\n      example.org/short: \"{{shorten trigger.metadata.name 40}}\"\n    rules:\n",
    );
    let r = validate(&text, None, &[]);
    assert_has(
        &r,
        0,
        &[
            "warning: ",
            "spec.outputs[0].labels.example.org/crd: \"{{trigger.metadata.name}}\" can render 253 characters, more than the 63",
        ],
    );
    assert!(!r.stdout.contains("example.org/short"), "{}", r.stdout);
}

#[test]
fn json_output() {
    let r = validate(&crd_rule("x", "[gett]"), None, &["--output", "json"]);
    assert_eq!(r.code, Some(1));
    let v: serde_json::Value = serde_json::from_str(&r.data).expect("JSON on stdout alone");
    assert_eq!(v[0]["severity"], "error");
    assert_eq!(v[0]["rule"], "crd-roles");
    assert_eq!(v[0]["field"], "spec.outputs[0].rules[0].verbs[0]");
}

#[test]
fn the_shipped_rules_have_no_errors() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = support::cli::rbac_rules()
        .current_dir(root)
        // The e2e stand-in CRDs give the Crossplane trigger kinds a schema.
        .args([
            "validate",
            "--rules",
            "rules",
            "-R",
            "--objects",
            "tests/e2e",
        ])
        .output()
        .expect("run rbac-rules");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.lines().any(|l| l.starts_with("0 error(s)")), "{text}");
    // What each rule reads of its trigger is among its `fields`.
    assert!(!text.contains("fields are ["), "{text}");
}

/// A CRD of the first-hour path: `databases.data.acme.io`, namespaced.
const DATABASE_CRD: &str = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: databases.data.acme.io\nspec:\n  group: data.acme.io\n  names: {kind: Database, plural: databases, singular: database}\n  scope: Namespaced\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        properties:\n          spec:\n            type: object\n            properties:\n              engine: {type: string}\n              group: {type: string}\n";

fn crd_trigger_rule(kind: &str, conditions: &str) -> String {
    rule(
        "crd-conditions",
        &format!(
            "  trigger:\n    apiGroup: apiextensions.k8s.io\n    kind: {kind}\n{conditions}  outputs:\n  - kind: ClusterRole\n    name: \"crd:{{{{trigger.metadata.name}}}}\"\n    rules:\n    - apiGroups: [\"{{{{trigger.spec.group}}}}\"]\n      resources: [\"{{{{trigger.spec.names.plural}}}}\"]\n      verbs: [get]\n"
        ),
    )
}

#[test]
fn a_misspelt_condition_path_warns_with_the_field_it_meant() {
    let r = validate(
        &crd_trigger_rule(
            "CustomResourceDefinition",
            "    conditions:\n    - {path: spec.grop, equals: data.acme.io}\n",
        ),
        None,
        &[],
    );
    assert_has(
        &r,
        0,
        &[
            "warning: ",
            "spec.trigger.conditions[0].path: path spec.grop: \
             CustomResourceDefinition.apiextensions.k8s.io has no field spec.grop \
             (did you mean spec.group?)",
            "0 error(s), 1 warning(s)",
        ],
    );
    assert_has(
        &validate(
            &crd_trigger_rule(
                "CustomResourceDefinition",
                "    require:\n    - {path: spec.scpe, equals: Namespaced}\n",
            ),
            None,
            &["--strict"],
        ),
        1,
        &["spec.trigger.require[0].path", "(did you mean spec.scope?)"],
    );
    // Correct paths, bracketed keys included, pass.
    let ok = validate(
        &crd_trigger_rule(
            "CustomResourceDefinition",
            "    conditions:\n    - {path: spec.group, equals: data.acme.io}\n    - {path: 'metadata.labels[\"example.org/team\"]', exists: true}\n    - {path: 'metadata.annotations.[example.org/owner]', exists: true}\n    - {path: 'spec.versions[0].name', exists: true}\n",
        ),
        None,
        &[],
    );
    assert_has(&ok, 0, &["0 error(s), 0 warning(s)"]);
}

#[test]
fn a_misspelt_where_path_warns_against_the_related_kind() {
    let text = rule(
        "owners",
        "  trigger: {kind: Namespace}\n  related:\n  - name: dbs\n    objects: {apiGroup: data.acme.io, kind: Database, namespace: '{{trigger.metadata.name}}'}\n    where:\n    - {path: spec.engnie, equals: postgres}\n    - {value: '{{item.spec.grup}}', equals: x}\n  outputs:\n  - kind: Role\n    name: dbs\n    rules:\n    - apiGroups: [data.acme.io]\n      resources: [databases]\n      resourceNames: {forEach: 'pluck related.dbs \"metadata.name\"', as: n, item: '{{n}}'}\n      verbs: [get]\n",
    );
    let r = validate(&text, Some(DATABASE_CRD), &[]);
    assert_has(
        &r,
        0,
        &[
            "spec.related[0].where[0].path: path spec.engnie: Database.data.acme.io has no field \
             spec.engnie (did you mean spec.engine?)",
            "item.spec.grup: Database.data.acme.io has no field spec.grup (did you mean item.spec.group?)",
        ],
    );
}

#[test]
fn the_tutorial_validates_clean() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = support::cli::rbac_rules()
        .current_dir(root)
        .args(["validate", "--rules", "docs/tutorial/team-roles.yaml"])
        .output()
        .expect("run rbac-rules");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("0 error(s), 0 warning(s)"), "{text}");
}

#[test]
fn an_unknown_trigger_kind_suggests_a_known_one() {
    let r = validate(
        &rule(
            "ns",
            "  trigger: {kind: Namespce}\n  outputs:\n  - kind: ClusterRole\n    name: x\n",
        ),
        None,
        &[],
    );
    assert_has(
        &r,
        0,
        &["unknown trigger kind Namespce (did you mean kind Namespace (core group)?)"],
    );
    let r = validate(
        &rule(
            "dep",
            "  trigger: {kind: Deployment}\n  outputs:\n  - kind: ClusterRole\n    name: x\n",
        ),
        None,
        &[],
    );
    assert_has(
        &r,
        0,
        &["unknown trigger kind Deployment (did you mean kind Deployment, apiGroup apps?)"],
    );
    let r = validate(
        &rule(
            "db",
            "  trigger: {apiGroup: data.acme.io, kind: database}\n  outputs:\n  - kind: ClusterRole\n    name: x\n",
        ),
        Some(DATABASE_CRD),
        &[],
    );
    assert_has(
        &r,
        0,
        &["(did you mean kind Database, apiGroup data.acme.io?)"],
    );
}

#[test]
fn literal_role_ref_and_subject_kinds_are_checked() {
    let r = validate(
        &rule(
            "kinds",
            "  trigger: {kind: Namespace}\n  outputs:\n  - kind: RoleBinding\n    name: b\n    roleRef: {kind: clusterrole, name: view}\n    subjects:\n    - {kind: user, name: bob}\n    - {kind: ServiceAcount, name: bot}\n    - {forEach: 'list \"a\"', as: g, item: {kind: Grop, name: '{{g}}'}}\n    - {kind: Group, name: ok}\n  - kind: ClusterRoleBinding\n    name: c\n    roleRef: {kind: Role, name: view}\n    subjects: [{kind: Group, name: ok}]\n",
        ),
        None,
        &[],
    );
    assert_has(
        &r,
        1,
        &[
            "spec.outputs[0].roleRef.kind: unknown roleRef kind \"clusterrole\" (did you mean \"ClusterRole\"?)",
            "spec.outputs[0].subjects[0].kind: unknown subject kind \"user\" (did you mean \"User\"?)",
            "spec.outputs[0].subjects[1].kind: unknown subject kind \"ServiceAcount\" (did you mean \"ServiceAccount\"?)",
            "spec.outputs[0].subjects[2].item.kind: unknown subject kind \"Grop\" (did you mean \"Group\"?)",
            "spec.outputs[1].roleRef.kind: unknown roleRef kind \"Role\"",
            "5 error(s)",
        ],
    );
}

#[test]
fn a_rule_name_defined_twice_is_an_error_in_validate_render_and_test() {
    let dir = tempfile::tempdir().expect("tempdir");
    let body = "  outputs:\n  - kind: ClusterRole\n    name: NAME\n    rules: [{apiGroups: [''], resources: [configmaps], verbs: [get]}]\n";
    std::fs::write(
        dir.path().join("a.yaml"),
        rule("same", &body.replace("NAME", "a")),
    )
    .expect("write");
    std::fs::write(
        dir.path().join("b.yaml"),
        rule("same", &body.replace("NAME", "b")),
    )
    .expect("write");
    std::fs::write(
        dir.path().join("ns.yaml"),
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n",
    )
    .expect("write");
    std::fs::create_dir(dir.path().join("tests")).expect("mkdir");
    std::fs::write(
        dir.path().join("tests/t.yaml"),
        "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRuleTest\nmetadata: {name: t}\nspec:\n  rules: [../a.yaml, ../b.yaml]\n  expect:\n    objects: [{kind: ClusterRole, metadata: {name: a}}]\n",
    )
    .expect("write");
    let want = "b.yaml#1: RbacRule \"same\": metadata.name: duplicate rule name: a.yaml#1 defines";
    let (code, _, err) = run_in(dir.path(), &["validate", "--rules", "a.yaml", "b.yaml"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(want), "{err}");
    let (code, out, err) = run_in(
        dir.path(),
        &["render", "--rules", ".", "--objects", "ns.yaml"],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("duplicate rule name"), "{err}");
    let (code, out, err) = run_in(dir.path(), &["test", "tests"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("duplicate rule name"), "{out}");
    // The same file named twice is one rule, not a duplicate.
    let (code, _, err) = run_in(dir.path(), &["validate", "--rules", "a.yaml", "a.yaml"]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn findings_are_diagnostics_on_stderr_and_data_only_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("r.yaml"), crd_rule("x", "[gett]")).expect("write");
    let (code, out, err) = run_in(dir.path(), &["validate", "--rules", "r.yaml"]);
    assert_eq!(code, Some(1));
    assert!(out.is_empty(), "stdout: {out}");
    assert!(
        err.contains("unknown verb \"gett\"") && err.contains("1 error(s)"),
        "{err}"
    );
    let (_, out, _) = run_in(dir.path(), &["validate", "--rules", "r.yaml", "-o", "yaml"]);
    assert!(out.contains("severity: error"), "{out}");
}

#[test]
fn a_load_error_is_in_the_json_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("bad.yaml"), "a: [\n").expect("write");
    std::fs::write(dir.path().join("r.yaml"), crd_rule("x", "[gett]")).expect("write");
    let (code, out, _) = run_in(
        dir.path(),
        &[
            "validate",
            "--rules",
            "bad.yaml",
            "missing.yaml",
            "r.yaml",
            "-o",
            "json",
        ],
    );
    assert_eq!(code, Some(1));
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let origins: Vec<&str> = v
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|f| f["origin"].as_str())
        .collect();
    assert!(origins.contains(&"bad.yaml"), "{out}");
    assert!(origins.contains(&"missing.yaml"), "{out}");
    // The readable file is still linted.
    assert!(out.contains("unknown verb"), "{out}");
}

#[test]
fn rules_from_stdin() {
    let out = support::cli::output_with_stdin(
        &mut support::cli::command(["validate", "--rules", "-"]),
        &crd_rule("x", "[gett]"),
    );
    let err = out.stderr;
    assert_eq!(out.code, Some(1), "{err}");
    assert!(err.contains("error: -#1: RbacRule \"crd-roles\""), "{err}");
}

#[test]
fn omitted_rules_and_skipped_documents_are_noted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, _, err) = run_in(dir.path(), &["validate"]);
    assert!(
        err.contains("note: validate: no rules given: using the built-in rules"),
        "{err}"
    );
    std::fs::write(dir.path().join("r.yaml"), format!("{}---\n{}", crd_rule("x", "[get]"), "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: watcher}\n")).expect("write");
    let (code, _, err) = run_in(dir.path(), &["validate", "--rules", "."]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("r.yaml#2: skipped ClusterRole \"watcher\": not an RbacRule"),
        "{err}"
    );
}

#[test]
fn a_metadata_only_trigger_read_beyond_its_metadata_warns() {
    let text = rule(
        "mo",
        "  trigger:\n    apiGroup: apiextensions.k8s.io\n    kind: CustomResourceDefinition\n    metadataOnly: true\n    conditions:\n    - {path: spec.group, equals: x.io}\n    - {path: 'metadata.labels[\"a/b\"]', exists: true}\n  outputs:\n  - kind: ClusterRole\n    name: \"a-{{trigger.spec.group}}-{{trigger.metadata.name}}\"\n",
    );
    let r = validate(&text, None, &[]);
    assert_has(
        &r,
        0,
        &[
            "spec.trigger.conditions[0].path: path spec.group: the trigger is metadataOnly",
            "spec.outputs[0].name: trigger.spec.group: the trigger is metadataOnly",
            "0 error(s), 2 warning(s)",
        ],
    );
}

#[test]
fn a_trigger_read_beyond_its_fields_warns() {
    let text = rule(
        "fl",
        "  trigger:\n    apiGroup: apiextensions.k8s.io\n    kind: CustomResourceDefinition\n    fields: [spec.names]\n    conditions:\n    - {path: spec.group, equals: x.io}\n    - {path: spec.names.plural, exists: true}\n  outputs:\n  - kind: ClusterRole\n    name: \"a-{{get trigger \\\"status.acceptedNames\\\"}}-{{trigger.spec}}-{{trigger.metadata.name}}\"\n",
    );
    let r = validate(&text, None, &[]);
    assert_has(
        &r,
        0,
        &[
            "spec.trigger.conditions[0].path: path spec.group: the trigger's fields are [spec.names]",
            "so spec.group is never there (add it to spec.trigger.fields)",
            "spec.outputs[0].name: trigger.status.acceptedNames: the trigger's fields are [spec.names]",
            "0 error(s), 2 warning(s)",
        ],
    );
}

#[test]
fn fields_beside_metadata_only_or_with_an_index_are_errors() {
    let text = rule(
        "fe",
        "  trigger:\n    kind: Namespace\n    metadataOnly: true\n    fields: [spec.finalizers]\n  related:\n  - name: pods\n    objects:\n      kind: Pod\n      fields: [\"spec.containers[0]\"]\n  outputs:\n  - kind: ClusterRole\n    name: \"a-{{trigger.metadata.name}}\"\n",
    );
    let r = validate(&text, None, &[]);
    assert_has(
        &r,
        1,
        &[
            "spec.trigger.fields: give at most one of metadataOnly and fields",
            "spec.related[0].objects.fields[0]: a field is a path of object keys; [0]",
        ],
    );
}

#[test]
fn a_misspelt_list_field_path_of_the_trigger_warns() {
    let text = rule(
        "versions",
        "  trigger: {apiGroup: apiextensions.k8s.io, kind: CustomResourceDefinition}\n  related:\n  - name: versions\n    listField: {path: spec.versoins}\n  - name: ok\n    listField: {path: spec.versions, of: [trigger]}\n  outputs:\n  - kind: ClusterRole\n    name: \"crd:{{trigger.metadata.name}}\"\n",
    );
    let r = validate(&text, None, &[]);
    assert_has(
        &r,
        0,
        &[
            "spec.related[0].listField.path: path spec.versoins: CustomResourceDefinition.apiextensions.k8s.io has no field spec.versoins (did you mean spec.versions?); the list is always empty",
            "0 error(s), 1 warning(s)",
        ],
    );
}

/// A rule reading Deployments owned by its trigger namespace's objects,
/// with the given ownership filter.
fn lineage_rule(filter: &str) -> String {
    rule(
        "lineage",
        &format!(
            "  trigger:\n    kind: Namespace\n  related:\n  - name: sas\n    objects:\n      kind: ServiceAccount\n      metadataOnly: true\n  - name: deployments\n    objects:\n      apiGroup: apps\n      kind: Deployment\n      metadataOnly: true\n      {filter}\n  outputs:\n  - kind: ClusterRole\n    name: \"ns:{{{{trigger.metadata.name}}}}\"\n    rules:\n    - forEach: related.deployments\n      as: d\n      item:\n        apiGroups: [apps]\n        resources: [deployments]\n        resourceNames: [\"{{{{d.metadata.name}}}}\"]\n        verbs: [get]\n"
        ),
    )
}

#[test]
fn owned_by_is_warned_about_and_controlled_by_is_not() {
    let r = validate(&lineage_rule("ownedBy: [trigger, sas]"), None, &[]);
    assert_has(
        &r,
        0,
        &[
            "spec.related[1].objects.ownedBy",
            "non-controller ownerReferences",
            "controlledBy and notOlderThan",
        ],
    );
    let strict = validate(&lineage_rule("ownedBy: [trigger]"), None, &["--strict"]);
    assert_eq!(strict.code, Some(1), "{}", strict.stdout);
    let r = validate(
        &lineage_rule("controlledBy: [trigger, sas]\n      notOlderThan: trigger"),
        None,
        &["--strict"],
    );
    assert_has(&r, 0, &[]);
    assert!(!r.stdout.contains("ownedBy"), "{}", r.stdout);
}

#[test]
fn lineage_names_only_the_trigger_and_earlier_sets_of_objects() {
    for (filter, field, message) in [
        (
            "controlledBy: [later]",
            "spec.related[1].objects.controlledBy[0]",
            "neither the trigger nor an earlier related set of objects",
        ),
        (
            "notOlderThan: deployments",
            "spec.related[1].objects.notOlderThan",
            "neither the trigger nor an earlier related set of objects",
        ),
        (
            "ownedBy: [sas]\n      notOlderThan: trigger",
            "spec.related[1].objects.notOlderThan",
            "at most one of controlledByTrigger, ownedBy and controlledBy",
        ),
        (
            "controlledByTrigger: true\n      controlledBy: [trigger]",
            "spec.related[1].objects.controlledBy",
            "at most one of controlledByTrigger, ownedBy and controlledBy",
        ),
    ] {
        let r = validate(&lineage_rule(filter), None, &[]);
        assert_has(&r, 1, &[field, message]);
    }
}
