//! Release hygiene: `--version` names the crate version and a revision, and
//! the licence the manifest declares is shipped.

mod support;

#[test]
fn version_prints_crate_version_and_revision() {
    let out = support::cli::rbac_rules()
        .arg("--version")
        .output()
        .expect("run rbac-rules");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let expected = format!("rbac-rules {} (git ", env!("CARGO_PKG_VERSION"));
    assert!(text.starts_with(&expected), "{text}");
    let rev = text
        .trim()
        .trim_start_matches(&expected)
        .trim_end_matches(')');
    assert!(
        rev == "unknown" || (rev.len() >= 7 && rev.chars().all(|c| c.is_ascii_hexdigit())),
        "revision {rev:?}"
    );
}

#[test]
fn license_is_apache_2() {
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{root}/LICENSE")).expect("LICENSE");
    assert!(text.contains("Apache License") && text.contains("Version 2.0, January 2004"));
    assert!(text.contains("END OF TERMS AND CONDITIONS"));
    let changelog = std::fs::read_to_string(format!("{root}/CHANGELOG.md")).expect("CHANGELOG.md");
    assert!(
        changelog.contains(&format!("## {}", env!("CARGO_PKG_VERSION"))),
        "CHANGELOG.md has a section for the crate's version"
    );
}
