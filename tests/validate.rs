//! `rbac-rules validate`: each lint's message, exit status and formats.

use std::process::Command;

struct Run {
    code: Option<i32>,
    stdout: String,
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
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rbac-rules"));
    cmd.arg("validate").arg("--rules").arg(&rules_path);
    if let Some(o) = objects {
        let p = dir.path().join("objects.yaml");
        std::fs::write(&p, o).expect("write objects");
        cmd.arg("--objects").arg(p);
    }
    let out = cmd.args(extra).output().expect("run rbac-rules");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
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
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON");
    assert_eq!(v[0]["severity"], "error");
    assert_eq!(v[0]["rule"], "crd-roles");
    assert_eq!(v[0]["field"], "spec.outputs[0].rules[0].verbs[0]");
}

#[test]
fn the_shipped_rules_have_no_errors() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(env!("CARGO_BIN_EXE_rbac-rules"))
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
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.lines().any(|l| l.starts_with("0 error(s)")), "{text}");
}
