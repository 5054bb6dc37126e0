//! Runs the `rbac-rules` binary for the CLI suites: exit code, stdout and
//! stderr, written once.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// `rbac-rules ARGS` in `dir`: exit code, stdout, stderr.
pub fn run_in(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rbac-rules"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run rbac-rules");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `rbac-rules ARGS` in the crate's root (paths relative to it).
pub fn run(args: &[&str]) -> (Option<i32>, String, String) {
    run_in(Path::new(env!("CARGO_MANIFEST_DIR")), args)
}
