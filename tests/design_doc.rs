//! The examples of Crossplane's RBAC manager design document
//! (shared/seeds/000), checked against what the built-in rules render for
//! the document's example cluster (examples/crossplane-cluster.yaml).
//!
//! Crossplane's shipped behaviour differs from the draft document in known
//! ways (/status subresources, finalizers, event and lease rules, composites
//! in namespace roles), so each check says which direction must hold:
//! `covers` — we grant at least what the document shows; `within` — we
//! grant nothing beyond what the document shows plus the listed extras.

use std::path::PathBuf;

use k8s_openapi::api::rbac::v1::PolicyRule;
use rbac_rules::api::ManageLevel;
use rbac_rules::policy::covers;
use rbac_rules::render::{RenderArgs, render};
use serde_json::Value;

fn rendered() -> Vec<Value> {
    let args = RenderArgs {
        objects: vec![PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/crossplane-cluster.yaml"
        ))],
        rules: vec![],
        flatten: true,
        manage: ManageLevel::All,
        allow: None,
        recursive: false,
    };
    let text = render(&args).expect("the example renders");
    serde_saphyr::from_multiple::<Value>(&text).expect("valid YAML")
}

fn find<'a>(objs: &'a [Value], kind: &str, ns: &str, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| {
            o["kind"] == kind
                && o["metadata"]["name"] == name
                && o["metadata"]["namespace"].as_str().unwrap_or_default() == ns
        })
        .unwrap_or_else(|| panic!("{kind} {ns}/{name} not rendered"))
}

fn rules_of(o: &Value) -> Vec<PolicyRule> {
    serde_json::from_value(o["rules"].clone()).expect("rules parse")
}

/// Rules written in the design document, as YAML.
fn doc(yaml: &str) -> Vec<PolicyRule> {
    serde_saphyr::from_str(yaml).expect("document rules parse")
}

fn assert_covers(name: &str, ours: &[PolicyRule], theirs: &[PolicyRule]) {
    let (ok, missing) = covers(ours, theirs);
    assert!(
        ok,
        "{name} lacks what the design document grants: {missing:?}"
    );
}

fn assert_within(name: &str, ours: &[PolicyRule], allowed: &[PolicyRule]) {
    let (ok, extra) = covers(allowed, ours);
    assert!(
        ok,
        "{name} grants more than the design document allows: {extra:?}"
    );
}

const XR_EDIT: &str = r#"
- apiGroups: [xr.example.org]
  resources: [examplecomposites, examplecomposites/status, exampleclaims, exampleclaims/status]
  verbs: ["*"]
"#;

#[test]
fn crossplane_role_flattened() {
    let objs = rendered();
    let ours = rules_of(find(&objs, "ClusterRole", "", "crossplane"));
    let theirs = doc(r#"
- {apiGroups: [""], resources: [events], verbs: [create]}
- {apiGroups: [""], resources: [secrets], verbs: [get, create, update]}
- {apiGroups: [apiextensions.k8s.io], resources: [customresourcedefinitions], verbs: [get, create, update, delete]}
- {apiGroups: [apiextensions.crossplane.io, pkg.crossplane.io], resources: ["*"], verbs: ["*"]}
- {apiGroups: [xr.example.org], resources: [examplecomposites, examplecomposites/status, exampleclaims, exampleclaims/status], verbs: ["*"]}
- {apiGroups: [provider.example.org], resources: [examplemanageds, exampleproviderconfigs], verbs: ["*"]}
"#);
    assert_covers("crossplane", &ours, &theirs);
    // Beyond the document: /status of provider types and finalizers, as
    // Crossplane ships them.
    let extras = doc(r#"
- {apiGroups: [provider.example.org], resources: [examplemanageds/status, exampleproviderconfigs/status], verbs: ["*"]}
- {apiGroups: [xr.example.org], resources: [examplecomposites/finalizers, exampleclaims/finalizers], verbs: [update]}
"#);
    assert_within("crossplane", &ours, &[theirs, extras].concat());
}

#[test]
fn provider_system_role_and_binding() {
    let objs = rendered();
    let system = rules_of(find(
        &objs,
        "ClusterRole",
        "",
        "crossplane:provider:7f63e3661:system",
    ));
    let theirs = doc(r#"
- apiGroups: [provider.example.org]
  resources: [examplemanageds, examplemanageds/status, exampleproviderconfigs, exampleproviderconfigs/status]
  verbs: [get, list, watch, update, patch]
- {apiGroups: [""], resources: [events], verbs: [create]}
- {apiGroups: [""], resources: [secrets], verbs: [get, create, update]}
"#);
    assert_covers("provider system role", &system, &theirs);
    // Never delete on its own types: Crossplane's system verbs exclude it.
    let delete =
        doc("[{apiGroups: [provider.example.org], resources: [examplemanageds], verbs: [delete]}]");
    assert!(
        !covers(&system, &delete).0,
        "system role must not delete managed resources"
    );

    let binding = find(
        &objs,
        "ClusterRoleBinding",
        "",
        "crossplane:provider:7f63e3661:system",
    );
    assert_eq!(
        binding["roleRef"],
        serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "crossplane:provider:7f63e3661:system"})
    );
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"apiGroup": "", "kind": "ServiceAccount", "name": "crossplane-provider-7f63e3661", "namespace": "crossplane-system"}])
    );
}

#[test]
fn provider_and_composite_edit_roles() {
    let objs = rendered();
    let edit = find(
        &objs,
        "ClusterRole",
        "",
        "crossplane:provider:7f63e3661:aggregate-to-edit",
    );
    assert_eq!(
        edit["metadata"]["labels"]["rbac.crossplane.io/aggregate-to-crossplane"],
        "true"
    );
    assert_eq!(
        edit["metadata"]["labels"]["rbac.crossplane.io/aggregate-to-edit"],
        "true"
    );
    assert_covers(
        "provider edit role",
        &rules_of(edit),
        &doc(
            "[{apiGroups: [provider.example.org], resources: [examplemanageds, exampleproviderconfigs], verbs: ['*']}]",
        ),
    );

    let xr = find(
        &objs,
        "ClusterRole",
        "",
        "crossplane:composite:examplecomposites.xr.example.org:aggregate-to-edit",
    );
    assert_eq!(
        xr["metadata"]["labels"]["rbac.crossplane.io/aggregate-to-edit"],
        "true"
    );
    assert_eq!(
        xr["metadata"]["labels"]["rbac.crossplane.io/aggregate-to-ns-edit"],
        "true"
    );
    // The document's rbac.crossplane.io/xrd label is gone (crossplane#6316).
    assert!(
        xr["metadata"]["labels"]
            .get("rbac.crossplane.io/xrd")
            .is_none()
    );
    let ours = rules_of(xr);
    assert_covers("composite edit role", &ours, &doc(XR_EDIT));
    assert_within("composite edit role", &ours, &doc(XR_EDIT));
}

#[test]
fn user_facing_roles_flattened() {
    let objs = rendered();
    let admin = rules_of(find(&objs, "ClusterRole", "", "crossplane-admin"));
    let admin_doc = doc(r#"
- {apiGroups: [""], resources: [events], verbs: [get, list, watch]}
- {apiGroups: [""], resources: [secrets, namespaces], verbs: ["*"]}
- {apiGroups: [rbac.authorization.k8s.io], resources: [clusterroles], verbs: [get, list, watch]}
- {apiGroups: [rbac.authorization.k8s.io], resources: [clusterrolebindings, rolebindings], verbs: ["*"]}
- {apiGroups: [apiextensions.crossplane.io, pkg.crossplane.io], resources: ["*"], verbs: ["*"]}
- {apiGroups: [xr.example.org], resources: [examplecomposites, examplecomposites/status, exampleclaims, exampleclaims/status], verbs: ["*"]}
- {apiGroups: [provider.example.org], resources: [examplemanageds, exampleproviderconfigs], verbs: ["*"]}
"#);
    let provider_status = doc(
        "[{apiGroups: [provider.example.org], resources: [examplemanageds/status, exampleproviderconfigs/status], verbs: ['*']}]",
    );
    assert_covers("crossplane-admin", &admin, &admin_doc);
    assert_within(
        "crossplane-admin",
        &admin,
        &[admin_doc.clone(), provider_status.clone()].concat(),
    );

    let edit = rules_of(find(&objs, "ClusterRole", "", "crossplane-edit"));
    let edit_doc = doc(r#"
- {apiGroups: [""], resources: [events], verbs: [get, list, watch]}
- {apiGroups: [""], resources: [secrets], verbs: ["*"]}
- {apiGroups: [""], resources: [namespaces], verbs: [get, list, watch]}
- {apiGroups: [apiextensions.crossplane.io, pkg.crossplane.io], resources: ["*"], verbs: ["*"]}
- {apiGroups: [xr.example.org], resources: [examplecomposites, examplecomposites/status, exampleclaims, exampleclaims/status], verbs: ["*"]}
- {apiGroups: [provider.example.org], resources: [examplemanageds, exampleproviderconfigs], verbs: ["*"]}
"#);
    assert_covers("crossplane-edit", &edit, &edit_doc);
    assert_within(
        "crossplane-edit",
        &edit,
        &[edit_doc, provider_status].concat(),
    );
    let bindings = doc(
        "[{apiGroups: [rbac.authorization.k8s.io], resources: [rolebindings], verbs: [create]}]",
    );
    assert!(
        !covers(&edit, &bindings).0,
        "crossplane-edit must not manage bindings"
    );

    let view = rules_of(find(&objs, "ClusterRole", "", "crossplane-view"));
    let view_doc = doc(r#"
- {apiGroups: [""], resources: [events], verbs: [get, list, watch]}
- {apiGroups: [""], resources: [namespaces], verbs: [get, list, watch]}
- {apiGroups: [apiextensions.crossplane.io, pkg.crossplane.io], resources: ["*"], verbs: [get, list, watch]}
- {apiGroups: [xr.example.org], resources: [examplecomposites, examplecomposites/status, exampleclaims, exampleclaims/status], verbs: [get, list, watch]}
- {apiGroups: [provider.example.org], resources: [examplemanageds, exampleproviderconfigs], verbs: [get, list, watch]}
"#);
    assert_covers("crossplane-view", &view, &view_doc);
    let view_status = doc(
        "[{apiGroups: [provider.example.org], resources: [examplemanageds/status, exampleproviderconfigs/status], verbs: [get, list, watch]}]",
    );
    assert_within("crossplane-view", &view, &[view_doc, view_status].concat());

    let browse = rules_of(find(&objs, "ClusterRole", "", "crossplane-browse"));
    let browse_doc = doc(r#"
- {apiGroups: [""], resources: [events], verbs: [get, list, watch]}
- {apiGroups: [apiextensions.crossplane.io], resources: ["*"], verbs: [get, list, watch]}
- {apiGroups: [xr.example.org], resources: [examplecomposites], verbs: [get, list, watch]}
"#);
    assert_covers("crossplane-browse", &browse, &browse_doc);
    let browse_status = doc(
        "[{apiGroups: [xr.example.org], resources: [examplecomposites/status], verbs: [get, list, watch]}]",
    );
    assert_within(
        "crossplane-browse",
        &browse,
        &[browse_doc, browse_status].concat(),
    );

    let binding = find(&objs, "ClusterRoleBinding", "", "crossplane-admin");
    assert_eq!(binding["roleRef"]["name"], "crossplane-admin");
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "crossplane:masters"}])
    );
}

#[test]
fn namespace_roles_of_example() {
    let objs = rendered();
    let cases = [
        (
            "crossplane-admin",
            r#"
- {apiGroups: [""], resources: [events], verbs: [get, list, watch]}
- {apiGroups: [""], resources: [secrets], verbs: ["*"]}
- {apiGroups: [rbac.authorization.k8s.io], resources: [roles], verbs: [get, list, watch]}
- {apiGroups: [rbac.authorization.k8s.io], resources: [rolebindings], verbs: ["*"]}
- {apiGroups: [xr.example.org], resources: [exampleclaims], verbs: ["*"]}
"#,
            XR_EDIT,
        ),
        (
            "crossplane-edit",
            r#"
- {apiGroups: [""], resources: [events], verbs: [get, list, watch]}
- {apiGroups: [""], resources: [secrets], verbs: ["*"]}
- {apiGroups: [xr.example.org], resources: [exampleclaims], verbs: ["*"]}
"#,
            XR_EDIT,
        ),
        (
            "crossplane-view",
            r#"
- {apiGroups: [""], resources: [events], verbs: [get, list, watch]}
- {apiGroups: [xr.example.org], resources: [exampleclaims], verbs: [get, list, watch]}
"#,
            r#"
- apiGroups: [xr.example.org]
  resources: [examplecomposites, examplecomposites/status, exampleclaims, exampleclaims/status]
  verbs: [get, list, watch]
"#,
        ),
    ];
    for (name, theirs, xrd_role) in cases {
        let role = find(&objs, "Role", "example", name);
        let ours = rules_of(role);
        let theirs = doc(theirs);
        assert_covers(name, &ours, &theirs);
        // Copied from the XRD's role: composites too (harmless in a Role,
        // they are cluster-scoped) and /status; nothing else.
        assert_within(name, &ours, &[theirs, doc(xrd_role)].concat());
        assert_eq!(role["metadata"]["ownerReferences"][0]["kind"], "Namespace");
    }
    let secrets = doc("[{apiGroups: [''], resources: [secrets], verbs: [get]}]");
    assert!(
        !covers(
            &rules_of(find(&objs, "Role", "example", "crossplane-view")),
            &secrets
        )
        .0
    );
}
