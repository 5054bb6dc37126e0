//! Build script: embeds every `rules/*.yaml` file (the built-in rule set)
//! into the binary. Generated rather than listed by hand so that the source
//! names no rule file: the built-in set is data, and `src/` stays generic.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
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
