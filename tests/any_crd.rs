//! rules/examples/any-crd: roles for custom types only, and the aggregated
//! allow-list a team extends with its own grants.

mod support;
use support::cli::run;

fn crd(name: &str) -> String {
    format!(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: {name}, uid: u-{name}, labels: {{rbacrules.io/generate-roles: \"true\"}}}}\n"
    )
}

/// A labelled CRD of Kubernetes' own API (or not a `<plural>.<group>` of a
/// custom group) renders nothing, with a warning naming it; a custom one
/// renders its roles.
#[test]
fn only_custom_types_are_believed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let refused = [
        "customresourcedefinitions.apiextensions.k8s.io",
        "things.storage.k8s.io",
        "policies.k8s.io",
        "gizmos.x.kubernetes.io",
        "kubernetes.io",
        "nodot",
        "Widgets.example.org",
    ];
    let mut text = crd("widgets.example.org");
    for name in refused {
        text.push_str("---\n");
        text.push_str(&crd(name));
    }
    let objects = dir.path().join("crds.yaml");
    std::fs::write(&objects, text).expect("write");
    let (code, out, err) = run(&[
        "render",
        "--rules",
        "rules/examples/any-crd",
        "--objects",
        objects.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, Some(0), "{err}");
    for suffix in ["admin", "edit", "view"] {
        assert!(
            out.contains(&format!("name: widgets.example.org-{suffix}\n")),
            "{out}"
        );
    }
    for name in refused {
        assert!(
            !out.contains(&format!("name: {name}-")),
            "{name} got roles:\n{out}"
        );
        assert!(
            err.contains(&format!("skipped \"{name}\": not a custom type")),
            "no warning for {name}:\n{err}"
        );
    }
}

/// The aggregated allow-list's first member is the shipped allow-list.
#[test]
fn the_aggregated_allow_list_starts_from_the_shipped_one() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| -> Vec<serde_json::Value> {
        serde_saphyr::from_multiple(&std::fs::read_to_string(root.join(p)).expect("read"))
            .expect("YAML")
    };
    let shipped = read("deploy/controller/allow-list.yaml");
    let aggregated = read("rules/examples/any-crd/allow-list/aggregated-allow-list.yaml");
    assert_eq!(
        aggregated[0]["metadata"]["name"],
        shipped[0]["metadata"]["name"]
    );
    assert_eq!(
        aggregated[0]["metadata"]["annotations"],
        shipped[0]["metadata"]["annotations"]
    );
    let label = &aggregated[0]["aggregationRule"]["clusterRoleSelectors"][0]["matchLabels"];
    assert_eq!(label["rbacrules.io/aggregate-to-allow-list"], "true");
    assert_eq!(aggregated[1]["rules"], shipped[0]["rules"]);
    assert_eq!(
        aggregated[1]["metadata"]["labels"]["rbacrules.io/aggregate-to-allow-list"],
        "true"
    );
}

/// render --allow with the aggregated allow-list: the team's rule is
/// refused until its grants join the allow-list, then rendered.
#[test]
fn a_team_extends_the_allow_list_with_its_own_grants() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = dir.path().join("ns.yaml");
    std::fs::write(
        &ns,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: nightly, uid: u1, labels: {example.org/batch: \"true\", example.org/team: data}}\n",
    )
    .expect("write");
    let base = [
        "render",
        "--rules",
        "rules/examples/any-crd/allow-list/job-runners.yaml",
        "--allow",
        "rules/examples/any-crd/allow-list/aggregated-allow-list.yaml",
        "--objects",
        ns.to_str().expect("utf-8"),
    ];
    let (code, out, err) = run(&base);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        err.contains("grants what the allow-list does not: 10 grants: [batch] jobs"),
        "{err}"
    );
    let mut with_team = base.to_vec();
    with_team.push("rules/examples/any-crd/allow-list/team-grants.yaml");
    let (code, out, err) = run(&with_team);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("kind: Role\nmetadata:\n  name: job-runner\n  namespace: nightly"),
        "{out}"
    );
}
