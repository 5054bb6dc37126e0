//! Error messages for rule authors: field paths as written in the YAML,
//! suggestions for unknown fields and values, no Rust or handlebars
//! internals, every failing trigger and every unknown field reported.

mod support;

/// `render` of the rule `r` with this `spec` over two Namespaces: it must
/// fail; its stderr.
fn render(spec: &str) -> String {
    let r = support::cli::render(
        &format!(
            "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRule\nmetadata: {{name: r}}\nspec:\n{spec}"
        ),
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, uid: u1}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: b, uid: u2}\n",
        &[],
    );
    assert_eq!(r.code, Some(1));
    assert!(r.stdout.is_empty());
    r.stderr
}

fn assert_clean(stderr: &str) {
    for internal in [
        "?.",
        "`",
        "Option<",
        "Vec<",
        "trailing_tilde",
        "sequence",
        "variant",
    ] {
        assert!(
            !stderr.contains(internal),
            "{internal:?} leaks in:\n{stderr}"
        );
    }
}

#[test]
fn every_unknown_field_with_its_yaml_path_and_a_suggestion() {
    let e = render(
        "  trigger:\n    kind: Namespace\n    selecter: {matchLabels: {a: b}}\n    pasue: {annotation: x}\n  outputs: []\n",
    );
    assert!(e.contains("rules.yaml#1: RbacRule \"r\": spec.trigger.selecter: unknown field \"selecter\" (did you mean \"selector\"?)"), "{e}");
    assert!(e.contains("rules.yaml#1: RbacRule \"r\": spec.trigger.pasue: unknown field \"pasue\" (did you mean \"pause\"?)"), "{e}");
    assert_clean(&e);
}

#[test]
fn an_unknown_value_lists_the_choices() {
    let e = render("  trigger: {kind: Namespace}\n  outputs:\n  - kind: Rolee\n    name: x\n");
    assert!(e.contains("spec.outputs[0].kind: unknown value \"Rolee\": expected one of ClusterRole, Role, ClusterRoleBinding, RoleBinding (did you mean \"Role\"?)"), "{e}");
    assert_clean(&e);
}

#[test]
fn a_wrong_type_says_what_was_expected() {
    let e =
        render("  trigger: {kind: Namespace}\n  outputs:\n  - kind: ClusterRole\n    name: [x]\n");
    assert!(
        e.contains("spec.outputs[0].name: expected a string, got a list"),
        "{e}"
    );
    assert_clean(&e);
}

#[test]
fn a_missing_field_points_at_the_typo() {
    let e = render("  outputs:\n  - kind: Role\n    nme: r\n");
    assert!(e.contains("spec.outputs[0]: missing field \"name\" (unknown field spec.outputs[0].nme: did you mean \"name\"?)"), "{e}");
    assert_clean(&e);
}

#[test]
fn a_template_syntax_error_names_no_parser_rule() {
    let e = render(
        "  trigger: {kind: Namespace}\n  outputs:\n  - kind: ClusterRole\n    name: \"x-{{trigger.metadata.name\"\n",
    );
    assert!(e.contains("spec.outputs[0].name: invalid template syntax: an unclosed or malformed {{ }} expression (line 1, column "), "{e}");
    assert_clean(&e);
}

#[test]
fn every_failing_trigger_is_reported() {
    let e = render(
        "  trigger: {kind: Namespace}\n  outputs:\n  - kind: ClusterRole\n    name: \"x-{{trigger.metadata.nope}}\"\n",
    );
    assert!(
        e.contains(
            "spec.outputs[0].name (trigger Namespace/a): missing variable trigger.metadata.nope"
        ),
        "{e}"
    );
    assert!(
        e.contains(
            "spec.outputs[0].name (trigger Namespace/b): missing variable trigger.metadata.nope"
        ),
        "{e}"
    );
    assert_clean(&e);
}

#[test]
fn a_list_field_s_field_with_a_list_index_is_named() {
    let e = render(
        "  trigger: {kind: Namespace}\n  related:\n  - name: refs\n    listField: {path: metadata, fields: [name, \"owners[0]\"]}\n  outputs:\n  - kind: ClusterRole\n    name: x\n",
    );
    assert!(
        e.contains("spec.related[0].listField.fields[1]: a field is a path of object keys; [0] in \"owners[0]\" is a list index"),
        "{e}"
    );
    assert_clean(&e);
}
