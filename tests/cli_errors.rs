//! Every error path of `render`: non-zero exit, nothing on stdout, and a
//! message naming the file or rule and the field.

use std::path::Path;

mod support;
use support::cli::{Run, command, output, render, render_files};

/// Asserts a failed run whose stderr has every `needle`.
fn assert_fails(r: &Run, needles: &[&str]) {
    assert_eq!(r.code, Some(1), "exit status; stderr: {}", r.stderr);
    assert!(r.stdout.is_empty(), "nothing on stdout, got: {}", r.stdout);
    for n in needles {
        assert!(r.stderr.contains(n), "stderr lacks {n:?}:\n{}", r.stderr);
    }
}

const NAMESPACE: &str =
    "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a\n  uid: u-1\n  labels: {team: a}\n";

fn rule(name: &str, body: &str) -> String {
    format!(
        "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRule\nmetadata:\n  name: {name}\nspec:\n{body}"
    )
}

const TRIGGER: &str = "  trigger:\n    kind: Namespace\n";

#[test]
fn a_good_rule_renders() {
    let r = render(
        &rule(
            "good",
            &format!(
                "{TRIGGER}  outputs:\n  - kind: Role\n    name: reader\n    rules:\n    - {{apiGroups: [''], resources: [pods], verbs: [get]}}\n"
            ),
        ),
        NAMESPACE,
        &[],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("namespace: team-a"), "{}", r.stdout);
}

#[test]
fn bad_handlebars_syntax() {
    let r = render(
        &rule(
            "bad-tpl",
            &format!("{TRIGGER}  outputs:\n  - kind: Role\n    name: \"{{{{#if trigger}}x\"\n"),
        ),
        NAMESPACE,
        &[],
    );
    assert_fails(
        &r,
        &["rules.yaml#1: rule \"bad-tpl\"", "spec.outputs[0].name"],
    );
}

#[test]
fn missing_variable_is_an_error_not_an_empty_string() {
    let r = render(
        &rule(
            "missing-var",
            &format!(
                "{TRIGGER}  outputs:\n  - kind: Role\n    name: \"r-{{{{trigger.spec.nothing}}}}\"\n"
            ),
        ),
        NAMESPACE,
        &[],
    );
    assert_fails(
        &r,
        &[
            "rules.yaml#1: rule \"missing-var\"",
            "spec.outputs[0].name",
            "trigger Namespace/team-a",
            "missing variable",
        ],
    );
}

#[test]
fn unknown_helper() {
    let r = render(
        &rule(
            "helper",
            &format!(
                "{TRIGGER}  outputs:\n  - kind: Role\n    name: \"{{{{frobnicate trigger.metadata.name}}}}\"\n"
            ),
        ),
        NAMESPACE,
        &[],
    );
    assert_fails(
        &r,
        &["rule \"helper\"", "spec.outputs[0].name", "frobnicate"],
    );
}

#[test]
fn bad_regex() {
    let body = "  trigger:\n    kind: Namespace\n    metadataMatch:\n      key: 'example.org/(?P<x>'\n  outputs:\n  - kind: Role\n    name: r\n";
    let r = render(&rule("bad-regex", body), NAMESPACE, &[]);
    assert_fails(
        &r,
        &[
            "rules.yaml#1: rule \"bad-regex\"",
            "spec.trigger.metadataMatch.key",
            "invalid regular expression",
        ],
    );
}

#[test]
fn unknown_field_names_file_rule_and_field() {
    let body = format!("{TRIGGER}  outputs:\n  - kind: Role\n    nmae: r\n    name: r\n");
    let r = render(&rule("typo", &body), NAMESPACE, &[]);
    assert_fails(
        &r,
        &[
            "rules.yaml#1",
            "RbacRule \"typo\"",
            "spec.outputs[0].nmae",
            "unknown field",
        ],
    );
}

#[test]
fn unknown_field_inside_a_rendered_policy_rule() {
    let body = format!(
        "{TRIGGER}  outputs:\n  - kind: Role\n    name: r\n    rules:\n    - {{apiGroups: [''], resource: [pods], verbs: [get]}}\n"
    );
    let r = render(&rule("rule-typo", &body), NAMESPACE, &[]);
    assert_fails(
        &r,
        &[
            "rule \"rule-typo\"",
            "spec.outputs[0].rules[0].resource",
            "unknown field",
        ],
    );
}

#[test]
fn wrong_type_names_the_field() {
    let body = format!("{TRIGGER}  outputs:\n  - kind: Deployment\n    name: r\n");
    let r = render(&rule("kind", &body), NAMESPACE, &[]);
    assert_fails(
        &r,
        &["RbacRule \"kind\"", "spec.outputs[0].kind", "Deployment"],
    );
}

#[test]
fn rendered_namespace_over_limits() {
    let body = format!(
        "{TRIGGER}  outputs:\n  - kind: Role\n    name: r\n    namespace: \"{{{{trigger.metadata.name}}}}-{}\"\n",
        "x".repeat(60)
    );
    let r = render(&rule("long-namespace", &body), NAMESPACE, &[]);
    assert_fails(
        &r,
        &[
            "rules.yaml#1: rule \"long-namespace\"",
            "spec.outputs[0].namespace",
            "trigger Namespace/team-a",
            "at most 63",
        ],
    );
}

#[test]
fn rendered_invalid_name() {
    let body = format!(
        "{TRIGGER}  outputs:\n  - kind: ClusterRole\n    name: \"a/{{{{trigger.metadata.name}}}}\"\n"
    );
    let r = render(&rule("slash", &body), NAMESPACE, &[]);
    assert_fails(
        &r,
        &[
            "rules.yaml#1: rule \"slash\"",
            "spec.outputs[0].name",
            "may not contain '/'",
        ],
    );
}

#[test]
fn rendered_label_value_over_63() {
    let body = format!(
        "{TRIGGER}  outputs:\n  - kind: ClusterRole\n    name: r-{{{{trigger.metadata.name}}}}\n    labels:\n      example.org/owner: \"{{{{trigger.metadata.name}}}}-{}\"\n",
        "y".repeat(60)
    );
    let r = render(&rule("long-label", &body), NAMESPACE, &[]);
    assert_fails(
        &r,
        &[
            "rule \"long-label\"",
            "spec.outputs[0].labels",
            "example.org/owner",
            "at most 63",
        ],
    );
}

#[test]
fn rendered_invalid_label_key() {
    let body = format!(
        "{TRIGGER}  outputs:\n  - kind: ClusterRole\n    name: r-{{{{trigger.metadata.name}}}}\n    labels:\n      \"Bad Key/{{{{trigger.metadata.name}}}}\": \"true\"\n"
    );
    let r = render(&rule("bad-key", &body), NAMESPACE, &[]);
    assert_fails(
        &r,
        &[
            "rule \"bad-key\"",
            "spec.outputs[0].labels",
            "Bad Key/team-a",
        ],
    );
}

#[test]
fn invalid_selector_operator() {
    let body = "  trigger:\n    kind: Namespace\n    selector:\n      matchExpressions:\n      - {key: team, operator: Maybe}\n  outputs:\n  - kind: Role\n    name: r\n";
    let r = render(&rule("selector", body), NAMESPACE, &[]);
    assert_fails(&r, &["rule \"selector\"", "spec.trigger.selector", "Maybe"]);
}

#[test]
fn two_rules_emitting_one_object_conflict_on_both() {
    let out = "  outputs:\n  - kind: ClusterRole\n    name: shared\n";
    let rules = format!("{}---\n{}", rule("first", out), rule("second", out));
    let r = render(&rules, NAMESPACE, &[]);
    assert_fails(
        &r,
        &[
            "rules.yaml#1: rule \"first\"",
            "rules.yaml#2: rule \"second\"",
            "ClusterRole shared is emitted by more than one rule",
        ],
    );
}

#[test]
fn dependency_cycle_is_reported() {
    // Each emits ClusterRoles and copies rules from ClusterRoles.
    let body = "  outputs:\n  - kind: ClusterRole\n    name: NAME\n    rulesFrom:\n      clusterRoleNames: [other]\n";
    let rules = format!(
        "{}---\n{}",
        rule("loop-a", &body.replace("NAME", "a")),
        rule("loop-b", &body.replace("NAME", "b"))
    );
    let r = render(&rules, NAMESPACE, &[]);
    assert_fails(
        &r,
        &[
            "rules.yaml#1: rule \"loop-a\"",
            "rules.yaml#2: rule \"loop-b\"",
            "read its own outputs",
        ],
    );
}

#[test]
fn allow_list_forbids_wider_roles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let allow = dir.path().join("allow.yaml");
    std::fs::write(
        &allow,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: ceiling}\nrules:\n- {apiGroups: [''], resources: [pods, configmaps], verbs: [get, list, watch]}\n",
    )
    .expect("write allow");
    let body = format!(
        "{TRIGGER}  outputs:\n  - kind: Role\n    name: r\n    rules:\n    - {{apiGroups: [''], resources: [secrets], verbs: [get]}}\n"
    );
    let allow_arg = allow.to_string_lossy().into_owned();
    let r = render(
        &rule("too-wide", &body),
        NAMESPACE,
        &["--allow", &allow_arg],
    );
    assert_fails(
        &r,
        &[
            "rule \"too-wide\"",
            "spec.outputs[0]",
            "allow-list",
            "secrets",
        ],
    );

    let narrow = format!(
        "{TRIGGER}  outputs:\n  - kind: Role\n    name: r\n    rules:\n    - {{apiGroups: [''], resources: [pods], verbs: [get]}}\n"
    );
    let ok = render(
        &rule("narrow", &narrow),
        NAMESPACE,
        &["--allow", &allow_arg],
    );
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
}

#[test]
fn every_invalid_rule_is_reported_not_just_the_first() {
    let rules = format!(
        "{}---\n{}",
        rule("one", "  outputs:\n  - kind: Role\n    nme: r\n"),
        rule("two", "  outputs:\n  - kind: Role\n    nmae: r\n")
    );
    let r = render(&rules, NAMESPACE, &[]);
    assert_fails(
        &r,
        &[
            "RbacRule \"one\"",
            "missing field \"name\" (unknown field spec.outputs[0].nme: did you mean \"name\"?)",
            "RbacRule \"two\"",
            "spec.outputs[0].nmae",
        ],
    );
}

#[test]
fn invalid_objects_yaml() {
    let r = render(
        &rule("ok", "  outputs:\n  - kind: ClusterRole\n    name: r\n"),
        "kind: [unclosed\n",
        &[],
    );
    assert_fails(&r, &["objects.yaml", "invalid YAML"]);
}

#[test]
fn object_without_name() {
    let r = render(
        &rule("ok", "  outputs:\n  - kind: ClusterRole\n    name: r\n"),
        "apiVersion: v1\nkind: Namespace\nmetadata: {}\n",
        &[],
    );
    assert_fails(&r, &["objects.yaml#1", "metadata.name"]);
}

#[test]
fn missing_objects_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        rule("ok", "  outputs:\n  - kind: ClusterRole\n    name: r\n"),
    )
    .expect("write");
    let r = render_files(&rules, &dir.path().join("nope.yaml"), &[]);
    assert_fails(&r, &["nope.yaml"]);
}

#[test]
fn not_an_rbac_rule() {
    let r = render(NAMESPACE, NAMESPACE, &[]);
    assert_fails(
        &r,
        &[
            "rules.yaml#1",
            "expected apiVersion rbacrules.io/v1alpha1, kind RbacRule",
        ],
    );
}

const CLUSTER_ADMIN: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: cluster-admin\n  labels: {example.org/power: \"true\"}\nrules:\n- {apiGroups: ['*'], resources: ['*'], verbs: ['*']}\n- {nonResourceURLs: ['*'], verbs: ['*']}\n";

/// An allow-list file granting reads of pods and configmaps.
fn narrow_allow(dir: &Path) -> String {
    let allow = dir.join("allow.yaml");
    std::fs::write(
        &allow,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: ceiling}\nrules:\n- {apiGroups: [''], resources: [pods, configmaps], verbs: [get, list, watch]}\n",
    )
    .expect("write allow");
    allow.to_string_lossy().into_owned()
}

#[test]
fn allow_list_refuses_a_binding_to_a_powerful_role() {
    let dir = tempfile::tempdir().expect("tempdir");
    let allow = narrow_allow(dir.path());
    let body = "  outputs:\n  - kind: ClusterRoleBinding\n    name: sneaky\n    roleRef: {kind: ClusterRole, name: cluster-admin}\n    subjects:\n    - {kind: Group, name: everyone}\n";
    let objects = format!("{NAMESPACE}---\n{CLUSTER_ADMIN}");
    // The default denial switched off: the allow-list still refuses.
    let r = render(
        &rule("binder", body),
        &objects,
        &["--allow", &allow, "--allow-cluster-admin-bindings"],
    );
    assert_fails(
        &r,
        &[
            "rules.yaml#1: rule \"binder\"",
            "ClusterRoleBinding \"sneaky\" binds role \"cluster-admin\"",
            "allow-list",
        ],
    );
    // Without the allow-list the default denial refuses it.
    let denied = render(&rule("binder", body), &objects, &[]);
    assert_fails(
        &denied,
        &["ClusterRoleBinding \"sneaky\" binds \"cluster-admin\""],
    );
    // Both off: it renders.
    let ok = render(
        &rule("binder", body),
        &objects,
        &["--allow-cluster-admin-bindings"],
    );
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
}

#[test]
fn an_aggregation_that_selects_an_unmanaged_powerful_role_is_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let allow = narrow_allow(dir.path());
    let body = "  outputs:\n  - kind: ClusterRole\n    name: gatherer\n    aggregationRule:\n      clusterRoleSelectors:\n      - matchLabels: {example.org/power: \"true\"}\n";
    let objects = format!("{NAMESPACE}---\n{CLUSTER_ADMIN}");
    // Issue 27: a role no rule manages labelled into an emitted aggregated
    // role is not the rule's doing: a warning (a notice), not a refusal.
    let r = render(&rule("aggregator", body), &objects, &["--allow", &allow]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("name: gatherer"), "{}", r.stdout);
    for needle in [
        "warning: ",
        "rule \"aggregator\"",
        "ClusterRole \"gatherer\" aggregates roles no rule manages",
        "ClusterRole \"cluster-admin\", which grants",
        "cluster-admin equivalent",
    ] {
        assert!(
            r.stderr.contains(needle),
            "stderr lacks {needle:?}:\n{}",
            r.stderr
        );
    }
}

#[test]
fn allow_list_passes_bindings_to_allowed_or_missing_roles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let allow = narrow_allow(dir.path());
    let body = "  outputs:\n  - kind: ClusterRole\n    name: reader\n    rules:\n    - {apiGroups: [''], resources: [pods], verbs: [get]}\n  - kind: ClusterRoleBinding\n    name: reader\n    roleRef: {kind: ClusterRole, name: reader}\n    subjects: [{kind: Group, name: readers}]\n  - kind: ClusterRoleBinding\n    name: later\n    roleRef: {kind: ClusterRole, name: not-yet-there}\n    subjects: [{kind: Group, name: readers}]\n";
    let r = render(&rule("fine", body), NAMESPACE, &["--allow", &allow]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("name: not-yet-there"), "{}", r.stdout);
}

#[test]
fn builtin_rules_render_within_a_realistic_allow_list() {
    let dir = tempfile::tempdir().expect("tempdir");
    let allow = dir.path().join("allow.yaml");
    std::fs::write(
        &allow,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: ceiling}\nrules:\n- apiGroups: ['', rbac.authorization.k8s.io, apiextensions.k8s.io, apiextensions.crossplane.io, pkg.crossplane.io, ops.crossplane.io, protection.crossplane.io, secrets.crossplane.io, apps, extensions, admissionregistration.k8s.io, coordination.k8s.io, events.k8s.io, xr.example.org, provider.example.org]\n  resources: ['*']\n  verbs: ['*']\n",
    )
    .expect("write allow");
    let out = output(
        command([
            "render",
            "--objects",
            "examples/crossplane-cluster.yaml",
            "--allow",
        ])
        .arg(&allow),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // Narrow it (no secrets): the roles granting secrets are refused.
    std::fs::write(
        &allow,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: ceiling}\nrules:\n- apiGroups: [rbac.authorization.k8s.io, apiextensions.k8s.io, apiextensions.crossplane.io, pkg.crossplane.io, xr.example.org, provider.example.org]\n  resources: ['*']\n  verbs: ['*']\n",
    )
    .expect("write allow");
    let out = output(
        command([
            "render",
            "--objects",
            "examples/crossplane-cluster.yaml",
            "--allow",
        ])
        .arg(&allow),
    );
    let stderr = out.stderr;
    assert!(out.code != Some(0));
    assert!(
        stderr.contains("rules/crossplane-core.yaml#1: rule \"crossplane-core\""),
        "{stderr}"
    );
    assert!(stderr.contains("secrets"), "{stderr}");
}

#[test]
fn bad_vars_are_reported() {
    let dup = format!(
        "{TRIGGER}  vars:\n  - {{name: a, value: trigger.metadata.name}}\n  - {{name: a, value: trigger.metadata.uid}}\n  outputs:\n  - {{kind: Role, name: r}}\n"
    );
    let r = render(&rule("dup-var", &dup), NAMESPACE, &[]);
    assert_fails(
        &r,
        &[
            "rules.yaml#1: rule \"dup-var\"",
            "spec.vars[1].name",
            "duplicate var name",
        ],
    );
    let bad = format!(
        "{TRIGGER}  vars:\n  - {{name: a, value: 'nosuchhelper trigger'}}\n  outputs:\n  - {{kind: Role, name: r}}\n"
    );
    let r = render(&rule("bad-var", &bad), NAMESPACE, &[]);
    assert_fails(
        &r,
        &[
            "rule \"bad-var\"",
            "spec.vars[0].value",
            "trigger Namespace/team-a",
            "nosuchhelper",
        ],
    );
}
