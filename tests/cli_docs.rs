//! docs/cli.md holds every command's `--help`, verbatim, between
//! `<!-- help:COMMAND -->` markers: the reference cannot drift from the
//! binary. `UPDATE_DOCS=1 cargo test --test cli_docs` rewrites the blocks
//! (review the diff: a new flag may need prose too).

mod support;

const COMMANDS: &[&str] = &[
    "render",
    "validate",
    "test",
    "explain",
    "controller-role",
    "crd",
    "run",
    "diff",
    "completion",
];

fn help(command: &str) -> String {
    let out = support::cli::rbac_rules()
        .args([command, "--help"])
        .output()
        .expect("run rbac-rules");
    assert!(out.status.success(), "{command} --help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text between a command's markers, and where it is.
fn block(doc: &str, command: &str) -> (usize, usize) {
    let open = format!("<!-- help:{command} -->\n");
    let close = format!("<!-- /help:{command} -->");
    let start = doc
        .find(&open)
        .unwrap_or_else(|| panic!("docs/cli.md has no {open:?} marker"))
        + open.len();
    let end = doc[start..]
        .find(&close)
        .unwrap_or_else(|| panic!("docs/cli.md has no {close:?} marker"))
        + start;
    (start, end)
}

#[test]
fn cli_reference_holds_every_commands_help() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli.md");
    let mut doc = std::fs::read_to_string(&path).expect("docs/cli.md");
    let update = std::env::var_os("UPDATE_DOCS").is_some();
    let mut stale = Vec::new();
    for c in COMMANDS {
        let want = format!("```text\n$ rbac-rules {c} --help\n{}```\n", help(c));
        let (start, end) = block(&doc, c);
        if doc[start..end] != want {
            if update {
                doc.replace_range(start..end, &want);
            } else {
                stale.push(*c);
            }
        }
    }
    if update {
        std::fs::write(&path, doc).expect("write docs/cli.md");
    }
    assert!(
        stale.is_empty(),
        "docs/cli.md is out of date for {stale:?}: run UPDATE_DOCS=1 cargo test --test cli_docs"
    );
}

/// Every command of the binary has a section.
#[test]
fn every_command_is_documented() {
    let out = support::cli::rbac_rules()
        .arg("--help")
        .output()
        .expect("run rbac-rules");
    let top = String::from_utf8_lossy(&out.stdout);
    let listed: Vec<&str> = top
        .split("Commands:\n")
        .nth(1)
        .expect("commands")
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(!listed.is_empty());
    for c in listed {
        assert!(
            COMMANDS.contains(&c),
            "command {c} is missing from docs/cli.md"
        );
    }
}
