//! Golden tests of `rbac-rules render`: each directory under tests/golden/
//! is a case:
//!
//! - `objects.yaml` (or an `objects/` directory): the cluster's objects, or
//!   `--objects PATH` in `args`;
//! - `rules.yaml` or `rules/` (optional): rule files; default the built-ins;
//! - `args` (optional): extra flags on one line, e.g. `--flatten --manage basic`;
//! - `expected.yaml`: the exact stdout; or `expected-stderr.txt`: the
//!   render must fail, with exactly this stderr (refused tenant rules).
//!
//! `UPDATE_GOLDEN=1 cargo test --test golden` rewrites `expected.yaml`;
//! review the diff before committing it.

mod support;

use std::path::{Path, PathBuf};

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("tests/golden exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

fn render(case: &Path) -> (bool, String, String) {
    let mut cmd = support::cli::rbac_rules();
    cmd.arg("render");
    // Cases without objects name theirs in `args` (paths relative to the
    // crate root, the working directory of integration tests).
    for objects in [case.join("objects"), case.join("objects.yaml")] {
        if objects.exists() {
            cmd.arg("--objects").arg(objects);
        }
    }
    for rules in [case.join("rules"), case.join("rules.yaml")] {
        if rules.exists() {
            cmd.arg("--rules").arg(rules);
        }
    }
    if let Ok(args) = std::fs::read_to_string(case.join("args")) {
        cmd.args(args.split_whitespace());
    }
    let out = cmd.output().expect("run rbac-rules");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn golden_cases() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let cases = cases();
    assert!(!cases.is_empty(), "no golden cases found");
    let mut failures = Vec::new();
    for case in &cases {
        let name = case
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let (ok, stdout, stderr) = render(case);
        // A case with `expected-stderr.txt` must fail with exactly that
        // stderr (refusals: render prints nothing on stdout then).
        let stderr_path = case.join("expected-stderr.txt");
        if stderr_path.exists() {
            // Paths as in the repository, wherever it is checked out.
            let stderr = stderr.replace(concat!(env!("CARGO_MANIFEST_DIR"), "/"), "");
            if update {
                std::fs::write(&stderr_path, &stderr).expect("write expected-stderr.txt");
                continue;
            }
            let expected = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            if ok {
                failures.push(format!("{name}: render succeeded; expected it to fail"));
            } else if expected != stderr {
                let diff = first_difference(&expected, &stderr);
                failures.push(format!(
                    "{name}: stderr differs from expected-stderr.txt {diff}"
                ));
            }
            continue;
        }
        if !ok {
            failures.push(format!("{name}: render failed:\n{stderr}"));
            continue;
        }
        let expected_path = case.join("expected.yaml");
        if update {
            std::fs::write(&expected_path, &stdout).expect("write expected.yaml");
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if expected != stdout {
            let diff = first_difference(&expected, &stdout);
            failures.push(format!("{name}: output differs from expected.yaml {diff}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} golden cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

fn first_difference(expected: &str, actual: &str) -> String {
    for (i, (e, a)) in expected.lines().zip(actual.lines()).enumerate() {
        if e != a {
            return format!("at line {}:\n  expected: {e}\n  actual:   {a}", i + 1);
        }
    }
    format!(
        "in length: expected {} lines, got {}",
        expected.lines().count(),
        actual.lines().count()
    )
}
