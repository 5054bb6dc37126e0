//! The synthetic control planes of `rbac-rules-bench` are ones the built-in
//! rules really render from: every kind of output appears, as many as the
//! rules in rules/ say, and nothing is skipped or refused.

use std::path::Path;

use rbac_rules::render::{RenderArgs, render_with_warnings};
use rbac_rules_bench::synth::{Names, Plane, Scenario, Versions};

#[test]
fn small_renders_every_kind_of_output_without_warnings() {
    let plane = Plane {
        names: Names::builtin().expect("bench/control-plane.yaml"),
        sizes: Scenario::Small.sizes(),
    };
    let sizes = plane.sizes;
    let objs = plane.objects(&mut Versions::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("small.yaml");
    std::fs::write(
        &path,
        rbac_rules::yaml::to_yaml_stream(&objs).expect("yaml"),
    )
    .expect("write");
    let args = RenderArgs {
        objects: vec![path],
        ..RenderArgs::default()
    };
    let (out, warnings) = render_with_warnings(&args).expect("render");
    assert!(warnings.is_empty(), "{warnings:?}");
    let docs = rbac_rules::yaml::parse_documents(Path::new("out"), &out).expect("output");
    let count = |kind: &str, prefix: &str| {
        docs.iter()
            .filter(|d| d.value["kind"] == kind)
            .filter(|d| {
                d.value["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .count()
    };
    // Per XRD: four ClusterRoles (crossplane-composite-system and -users).
    assert_eq!(
        count("ClusterRole", "crossplane:composite:"),
        4 * sizes.xrds
    );
    // Per revision: edit, view and system ClusterRoles, system binding.
    assert_eq!(
        count("ClusterRole", "crossplane:provider:"),
        3 * sizes.revisions
    );
    assert_eq!(
        count("ClusterRoleBinding", "crossplane:provider:"),
        sizes.revisions
    );
    // Per namespace: crossplane-admin, -edit and -view Roles.
    assert_eq!(count("Role", "crossplane-"), 3 * sizes.namespaces);
    // A revision's system binding names its provider's ServiceAccount.
    assert!(out.contains("name: package-p3\n"), "{out}");
    // A namespace Role holds the claim types of the XRDs it accepts.
    assert!(out.contains("- thing0s\n"), "{out}");
}
