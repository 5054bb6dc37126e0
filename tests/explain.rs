//! `rbac-rules explain`: an object's rule, trigger and template; a subject's
//! bindings, aggregations and rules.

mod support;

/// `explain ARGS` over examples/crossplane-cluster.yaml.
fn explain(args: &[&str]) -> (Option<i32>, String, String) {
    // A positional KIND/NAME goes first: --objects takes every value after it.
    let (first, rest) = match args.first() {
        Some(a) if !a.starts_with('-') => (vec![*a], &args[1..]),
        _ => (Vec::new(), args),
    };
    let mut cmd = support::cli::command(["explain"]);
    cmd.args(first)
        .args(["--objects", "examples/crossplane-cluster.yaml"])
        .args(rest);
    support::cli::output(&mut cmd).parts()
}

#[test]
fn an_object_names_its_rule_trigger_template_and_aggregators() {
    let name =
        "ClusterRole/crossplane:composite:examplecomposites.xr.example.org:aggregate-to-edit";
    let (code, out, err) = explain(&["--object", name]);
    assert_eq!(code, Some(0), "{err}");
    for needle in [
        "  rule:     crossplane-composite-users (rules/crossplane-xrd.yaml#2)\n",
        "  trigger:  CompositeResourceDefinition.apiextensions.crossplane.io/examplecomposites.xr.example.org\n",
        "  template: spec.outputs[0] name \"crossplane:composite:{{trigger.metadata.name}}:aggregate-to-edit\", line ",
        "  aggregated into: crossplane-admin, crossplane-edit\n",
    ] {
        assert!(out.contains(needle), "lacks {needle:?}:\n{out}");
    }
    assert!(
        !out.contains("aggregate-to-view\""),
        "only the matching template:\n{out}"
    );
}

#[test]
fn a_namespaced_object() {
    let (code, out, _) = explain(&["--object", "Role/example/crossplane-edit"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("  trigger:  Namespace/example\n"), "{out}");
}

#[test]
fn an_object_no_rule_renders_is_an_error() {
    let (code, out, err) = explain(&["--object", "ClusterRole/nope"]);
    assert_eq!(code, Some(1));
    assert!(out.is_empty());
    assert!(err.contains("no rule renders ClusterRole/nope"), "{err}");
}

#[test]
fn a_subject_lists_bindings_and_rules() {
    let (code, out, err) = explain(&[
        "--as",
        "serviceaccount:crossplane-system:crossplane-provider-7f63e3661",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("ServiceAccount crossplane-system/crossplane-provider-7f63e3661\n"),
        "{out}"
    );
    assert!(
        out.contains("  cluster-wide: ClusterRoleBinding crossplane:provider:7f63e3661:system → ClusterRole crossplane:provider:7f63e3661:system\n"),
        "{out}"
    );
    assert!(out.contains("examplemanageds"), "{out}");
    let (_, nobody, _) = explain(&["--as", "user:nobody"]);
    assert!(nobody.contains("no binding names this subject"), "{nobody}");
}

#[test]
fn a_subject_through_an_aggregated_role() {
    let dir = tempfile::tempdir().expect("tempdir");
    let binding = dir.path().join("binding.yaml");
    std::fs::write(
        &binding,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: alice-edit}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: crossplane-edit}\nsubjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}]\n",
    )
    .expect("write");
    let (code, out, err) = explain(&[
        "--objects",
        binding.to_str().expect("utf-8"),
        "--as",
        "user:alice",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(
            "  cluster-wide: ClusterRoleBinding alice-edit → ClusterRole crossplane-edit\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("    aggregates: ")
            && out.contains(
                "crossplane:composite:examplecomposites.xr.example.org:aggregate-to-edit"
            ),
        "{out}"
    );
    assert!(out.contains("examplecomposites"), "{out}");
}

#[test]
fn a_service_account_user_name_is_that_service_account() {
    let sa = "crossplane-system:crossplane-provider-7f63e3661";
    let (_, want, _) = explain(&["--as", &format!("serviceaccount:{sa}")]);
    assert!(want.contains("ClusterRoleBinding"), "{want}");
    for spelling in [
        format!("user:system:serviceaccount:{sa}"),
        format!("system:serviceaccount:{sa}"),
    ] {
        let (code, out, err) = explain(&["--as", &spelling]);
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(out, want, "--as {spelling}");
    }
}

#[test]
fn kubectl_spellings_of_an_object() {
    let (_, want, _) = explain(&["--object", "Role/example/crossplane-edit"]);
    assert!(want.contains("  trigger:  Namespace/example\n"), "{want}");
    for args in [
        vec!["role/crossplane-edit", "-n", "example"],
        vec!["roles/crossplane-edit", "--namespace", "example"],
        vec![
            "ROLE.rbac.authorization.k8s.io/crossplane-edit",
            "-n",
            "example",
        ],
        vec!["--object", "role/crossplane-edit", "-n", "example"],
    ] {
        let (code, out, err) = explain(&args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(
            out.contains("  trigger:  Namespace/example\n"),
            "{args:?}: {out}"
        );
    }
}

#[test]
fn what_is_missing_when_nothing_matches() {
    let (code, _, err) = explain(&["role/crossplane-edit"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains(
            "a Role lives in a namespace: add -n NAMESPACE (Role \"crossplane-edit\" is rendered in example)"
        ),
        "{err}"
    );
    let (code, _, err) = explain(&["rolebindng/x", "-n", "example"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("unknown kind \"rolebindng\""), "{err}");
    let (code, _, err) = explain(&["role/crossplane-edt", "-n", "example"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("closest: \"crossplane-edit\""), "{err}");
    let (code, _, err) = explain(&["role/crossplane-edit", "-n", "nowhere"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("is rendered in namespace(s) example: give -n"),
        "{err}"
    );
    let (_, out, _) = explain(&[
        "--as",
        "serviceaccount:crossplane-system:crossplane-provider-7f63e366",
    ]);
    assert!(
        out.contains("ServiceAccounts the bindings name, nearest first: crossplane-system/crossplane-provider-7f63e3661"),
        "{out}"
    );
}

#[test]
fn the_built_in_rules_are_noted() {
    let (_, _, err) = explain(&["--as", "user:nobody"]);
    assert!(
        err.contains("note: explain: no rules given: using the built-in rules"),
        "{err}"
    );
}

#[test]
fn explanations_as_data() {
    let (code, out, err) = explain(&[
        "--as",
        "system:serviceaccount:crossplane-system:crossplane-provider-7f63e3661",
        "-o",
        "json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["subject"]["kind"], "ServiceAccount");
    assert_eq!(
        v["bindings"][0]["roleRef"]["name"],
        "crossplane:provider:7f63e3661:system"
    );
    assert!(v["bindings"][0]["rules"].is_array(), "{v}");
    let (code, out, err) = explain(&["role/crossplane-edit", "-n", "example", "-o", "yaml"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("trigger: Namespace/example\n"), "{out}");
    assert!(out.contains("rule: crossplane-namespace"), "{out}");
}
