//! `crds/` holds exactly what `rbac-rules crd` prints.

mod support;

#[test]
fn committed_crd_matches_generated() {
    let out = support::cli::rbac_rules()
        .arg("crd")
        .output()
        .expect("run rbac-rules crd");
    assert!(
        out.status.success(),
        "crd failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated = String::from_utf8(out.stdout).expect("utf-8");
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crds/rbacrules.rbacrules.io.yaml"
    );
    let committed = std::fs::read_to_string(path).expect("crds/rbacrules.rbacrules.io.yaml exists");
    assert!(
        committed == generated,
        "crds/rbacrules.rbacrules.io.yaml is stale: run `cargo run -- crd > crds/rbacrules.rbacrules.io.yaml`"
    );
}

#[test]
fn crd_is_cluster_scoped_with_status_and_columns() {
    let crd = rbac_rules::crd_yaml().expect("crd yaml");
    let v: serde_json::Value = serde_saphyr::from_str(&crd).expect("valid yaml");
    assert_eq!(v["spec"]["scope"], "Cluster");
    let version = &v["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert!(
        version["subresources"]["status"].is_object(),
        "status subresource"
    );
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .expect("printer columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(columns, ["READY", "REASON", "TRIGGERS", "OBJECTS", "AGE"]);
    // REASON is the Degraded condition's reason: a degraded rule shows in
    // `kubectl get`, not only in `describe`.
    let reason = &version["additionalPrinterColumns"][1];
    assert_eq!(
        reason["jsonPath"],
        ".status.conditions[?(@.type==\"Degraded\")].reason"
    );
    // Structural schemas forbid $ref and additionalProperties: false.
    assert!(!crd.contains("$ref"), "schema must be inlined");
    assert!(!crd.contains("additionalProperties: false"));
}
