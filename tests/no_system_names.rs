//! The engine and controller know nothing about the systems whose RBAC they
//! manage: Crossplane, Config Sync and OLM behaviour lives in rule files
//! (`rules/`, `rules/examples/`), never in `src/`. This test fails on any
//! source file under `src/` that names one of them, listing every
//! `file:line` so that the name can be moved into a rule or made generic.

use std::path::{Path, PathBuf};

/// Names that must not appear in `src/`, matched case-insensitively
/// anywhere in a line.
const SUBSTRINGS: &[&str] = &[
    "crossplane",
    "configsync",
    "config sync",
    "config-sync",
    "configmanagement",
    "operator lifecycle",
    "kubebuilder",
    "gke.io",
];

/// Short names matched case-insensitively as whole words only (not inside
/// a longer word such as "holm").
const WORDS: &[&str] = &["olm"];

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("readable directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            source_files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Whether `word` occurs in `line` (both lowercase) with no ASCII letter,
/// digit or underscore on either side.
fn has_word(line: &str, word: &str) -> bool {
    let is_word_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    line.match_indices(word).any(|(i, _)| {
        let before = line[..i].chars().next_back();
        let after = line[i + word.len()..].chars().next();
        !before.is_some_and(is_word_char) && !after.is_some_and(is_word_char)
    })
}

/// The forbidden names found in one line.
fn offences(line: &str) -> Vec<&'static str> {
    let lower = line.to_lowercase();
    let mut found: Vec<&'static str> = SUBSTRINGS
        .iter()
        .copied()
        .filter(|s| lower.contains(s))
        .collect();
    found.extend(WORDS.iter().copied().filter(|w| has_word(&lower, w)));
    found
}

#[test]
fn matcher_finds_names_and_spares_other_words() {
    assert_eq!(offences("see Crossplane's RBAC manager"), ["crossplane"]);
    assert_eq!(
        offences("CONFIG SYNC and Config-Sync"),
        ["config sync", "config-sync"]
    );
    assert_eq!(
        offences("label configsync.gke.io/sync-kind"),
        ["configsync", "gke.io"]
    );
    assert_eq!(offences("an OLM bundle"), ["olm"]);
    assert_eq!(offences("olm_operator"), Vec::<&str>::new());
    assert_eq!(offences("Holmes and holmium"), Vec::<&str>::new());
    assert_eq!(offences("a generic controller"), Vec::<&str>::new());
}

#[test]
fn sources_name_no_managed_system() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    assert!(!files.is_empty(), "no files under {}", src.display());
    let mut found = Vec::new();
    for file in &files {
        // Non-UTF-8 files cannot hold a readable name; skip them.
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let shown = file
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(file);
        for (n, line) in text.lines().enumerate() {
            let names = offences(line);
            if !names.is_empty() {
                found.push(format!(
                    "{}:{}: {} in: {}",
                    shown.display(),
                    n + 1,
                    names.join(", "),
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "{} line(s) under src/ name a system whose behaviour belongs in rules/:\n{}",
        found.len(),
        found.join("\n")
    );
}
