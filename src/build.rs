//! Build script: embeds every `rules/*.yaml` file (the built-in rule set)
//! into the binary. Generated rather than listed by hand so that the source
//! names no rule file: the built-in set is data, and `src/` stays generic.
//! Also records the git revision for `--version` (`unknown` without git).

use std::fmt::Write as _;
use std::path::PathBuf;

/// The short git revision: `RBAC_RULES_GIT_REVISION` when set (an image
/// build has no `.git`), else `git rev-parse`, else `unknown`.
fn git_revision(root: &std::path::Path) -> String {
    println!("cargo:rerun-if-env-changed=RBAC_RULES_GIT_REVISION");
    if let Ok(rev) = std::env::var("RBAC_RULES_GIT_REVISION")
        && !rev.trim().is_empty()
    {
        return rev.trim().to_string();
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    // HEAD moves on commit and checkout; in a worktree it is not under .git/.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let dir = root.join(dir);
        println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
        if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
            let common = git(&["rev-parse", "--git-common-dir"])
                .map(|c| root.join(c))
                .unwrap_or_else(|| dir.clone());
            println!("cargo:rerun-if-changed={}", common.join(head_ref).display());
        }
    }
    git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_string())
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    println!(
        "cargo:rustc-env=RBAC_RULES_GIT_REVISION={}",
        git_revision(&root)
    );
    let dir = root.join("rules");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    let mut out = String::from("&[\n");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let rel = f.strip_prefix(&root).unwrap_or(f).display().to_string();
        let _ = writeln!(
            out,
            "    ({rel:?}, include_str!({:?})),",
            f.display().to_string()
        );
    }
    out.push_str("]\n");
    let target =
        PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("builtin_rules.rs");
    if let Err(e) = std::fs::write(&target, out) {
        panic!("cannot write {}: {e}", target.display());
    }
}
