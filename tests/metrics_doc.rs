//! Every metric the controller registers is documented in
//! docs/operations.md (its table of metrics), under the name Prometheus
//! shows: counters with `_total`.

use rbac_rules::controller::metrics::Metrics;

/// The names (as scraped) and types of every registered metric, from the
/// encoder's `# TYPE` lines.
fn registered() -> Vec<(String, String)> {
    let metrics = Metrics::new();
    // A family without a sample is not encoded: give each one.
    metrics.error("Conflict");
    metrics.write("Role", "apply");
    let text = metrics.encode().expect("encode");
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| {
            let scraped = if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            (scraped, kind.to_string())
        })
        .collect()
}

#[test]
fn every_registered_metric_is_in_the_operations_table() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .expect("docs/operations.md");
    let metrics = registered();
    assert!(
        metrics.len() >= 10
            && metrics
                .iter()
                .any(|(n, _)| n == "rbac_rules_api_writes_total"),
        "too few metrics parsed: {metrics:?}"
    );
    let mut missing = Vec::new();
    for (name, kind) in &metrics {
        // A table row: | `name` or | `name{labels}` |, then its type.
        let row = doc.lines().find(|l| {
            l.starts_with(&format!("| `{name}`")) || l.starts_with(&format!("| `{name}{{"))
        });
        match row {
            Some(row) if row.contains(&format!("| {kind} |")) => {}
            _ => missing.push(format!("{name} ({kind})")),
        }
    }
    assert!(
        missing.is_empty(),
        "metrics registered in src/controller/metrics.rs but not in docs/operations.md's table: {missing:?}"
    );
}

#[test]
fn the_held_prunes_gauge_is_exported() {
    assert!(
        registered()
            .iter()
            .any(|(n, k)| n == "rbac_rules_held_prunes" && k == "gauge"),
        "{:?}",
        registered()
    );
}
