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

/// `rbac-rules crd` with `args`, its standard output.
fn crd_out(args: &[&str]) -> String {
    let out = support::cli::rbac_rules()
        .arg("crd")
        .args(args)
        .output()
        .expect("run rbac-rules crd");
    assert!(
        out.status.success(),
        "crd {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn committed_namespaced_crd_matches_generated() {
    let generated = crd_out(&["--namespaced"]);
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crds/namespacedrbacrules.rbacrules.io.yaml"
    );
    let committed =
        std::fs::read_to_string(path).expect("crds/namespacedrbacrules.rbacrules.io.yaml exists");
    assert!(
        committed == generated,
        "crds/namespacedrbacrules.rbacrules.io.yaml is stale: run `cargo run -- crd --namespaced > crds/namespacedrbacrules.rbacrules.io.yaml`"
    );
    assert_eq!(generated, rbac_rules::namespaced_crd_yaml().expect("yaml"));
}

#[test]
fn crd_all_prints_both_crds_as_one_stream() {
    let all = crd_out(&["--all"]);
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&all).expect("valid yaml");
    let names: Vec<&str> = docs
        .iter()
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["rbacrules.rbacrules.io", "namespacedrbacrules.rbacrules.io"]
    );
    assert_eq!(
        all,
        format!("{}---\n{}", crd_out(&[]), crd_out(&["--namespaced"]))
    );
}

#[test]
fn namespaced_crd_is_namespaced_with_the_rule_schema_status_and_columns() {
    let crd = rbac_rules::namespaced_crd_yaml().expect("crd yaml");
    let v: serde_json::Value = serde_saphyr::from_str(&crd).expect("valid yaml");
    assert_eq!(v["spec"]["scope"], "Namespaced");
    assert_eq!(v["spec"]["names"]["kind"], "NamespacedRbacRule");
    let version = &v["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert!(version["subresources"]["status"].is_object());
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .expect("printer columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(columns, ["READY", "REASON", "TRIGGERS", "OBJECTS", "AGE"]);
    // The same rule language: the spec's properties are an RbacRule's.
    let cluster: serde_json::Value =
        serde_saphyr::from_str(&rbac_rules::crd_yaml().expect("crd")).expect("yaml");
    let props = |v: &serde_json::Value| {
        v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            .clone()
    };
    assert_eq!(props(&v), props(&cluster));
    assert!(!crd.contains("$ref"), "schema must be inlined");
}
