//! The command line follows the conventions users know from kubectl and
//! other CLIs: `-` for stdin, `-o yaml|json` for data, data on stdout and
//! diagnostics on stderr, `completion`, examples in every `--help`,
//! `--kubeconfig`/`--context` where a cluster is talked to, flags only
//! where they act.

mod support;
use support::cli::Run as Out;

/// `rbac-rules ARGS` in the crate's root, with `stdin` when given.
fn run(args: &[&str], stdin: Option<&str>) -> Out {
    let mut cmd = support::cli::command(args);
    match stdin {
        Some(text) => support::cli::output_with_stdin(&mut cmd, text),
        None => support::cli::output(&mut cmd),
    }
}

const COMMANDS: &[&str] = &[
    "crd",
    "render",
    "run",
    "diff",
    "validate",
    "test",
    "explain",
    "controller-role",
    "completion",
];

#[test]
fn every_help_has_examples() {
    let top = run(&["--help"], None);
    assert!(top.stdout.contains("Examples:"), "{}", top.stdout);
    for c in COMMANDS {
        let h = run(&[c, "--help"], None);
        assert_eq!(h.code, Some(0), "{c}: {}", h.stderr);
        assert!(
            h.stdout.contains("Examples:\n  rbac-rules "),
            "`{c} --help` shows no example:\n{}",
            h.stdout
        );
        // Every command's help lists itself in its usage.
        assert!(
            h.stdout.contains(&format!("rbac-rules {c}")),
            "{}",
            h.stdout
        );
    }
}

#[test]
fn cluster_flags_only_on_commands_that_talk_to_a_cluster() {
    for c in COMMANDS {
        let h = run(&[c, "--help"], None).stdout;
        // explain talks to a cluster with --live.
        let online = matches!(*c, "run" | "diff" | "explain");
        for (flag, on) in [("--kubeconfig", online), ("--context", online)] {
            assert_eq!(h.contains(flag), on, "{c} --help and {flag}:\n{h}");
        }
        let logs = matches!(*c, "run" | "diff");
        assert_eq!(
            h.contains("--log-format"),
            logs,
            "{c} --help and --log-format:\n{h}"
        );
    }
    let r = run(&["validate", "--log-format", "json"], None);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(
        r.stderr.contains("unexpected argument '--log-format'"),
        "{}",
        r.stderr
    );
}

/// The benchmark is a crate of its own (bench/, `rbac-rules-bench`): the
/// shipped binary has no `bench` command.
#[test]
fn the_shipped_binary_has_no_bench_command() {
    let r = run(&["bench", "--scenario", "small"], None);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(
        r.stderr.contains("unrecognized subcommand 'bench'"),
        "{}",
        r.stderr
    );
}

#[test]
fn diff_reads_the_kubeconfig_it_is_given() {
    let r = run(&["diff", "--kubeconfig", "/nonexistent/kubeconfig"], None);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    assert!(
        r.stderr
            .contains("error: kubeconfig: /nonexistent/kubeconfig"),
        "{}",
        r.stderr
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let kc = dir.path().join("config");
    std::fs::write(
        &kc,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: one, context: {cluster: c, user: u}}]\ncurrent-context: one\n",
    )
    .expect("write");
    let r = run(
        &[
            "diff",
            "--kubeconfig",
            kc.to_str().expect("utf-8"),
            "--context",
            "two",
        ],
        None,
    );
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(
        r.stderr.contains("two"),
        "the missing context is named: {}",
        r.stderr
    );
}

#[test]
fn completion_scripts() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef rbac-rules"),
        ("fish", "complete -c rbac-rules"),
    ] {
        let r = run(&["completion", shell], None);
        assert_eq!(r.code, Some(0), "{shell}: {}", r.stderr);
        assert!(r.stdout.contains(marker), "{shell}:\n{}", r.stdout);
        assert!(r.stdout.contains("controller-role"), "{shell}");
    }
}

const NAMESPACE_RULE: &str = "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRule\nmetadata: {name: ns-readers}\nspec:\n  trigger: {kind: Namespace}\n  outputs:\n  - kind: Role\n    name: reader\n    rules: [{apiGroups: [''], resources: [configmaps], verbs: [get]}]\n";

#[test]
fn render_reads_stdin_and_writes_yaml_or_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, NAMESPACE_RULE).expect("write");
    let ns = "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a, uid: u1}\n";
    let r = run(
        &[
            "render",
            "--rules",
            rules.to_str().expect("utf-8"),
            "--objects",
            "-",
        ],
        Some(ns),
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout
            .starts_with("---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n"),
        "{}",
        r.stdout
    );
    let j = run(
        &[
            "render",
            "--rules",
            rules.to_str().expect("utf-8"),
            "--objects",
            "-",
            "-o",
            "json",
        ],
        Some(ns),
    );
    assert_eq!(j.code, Some(0), "{}", j.stderr);
    let v: serde_json::Value = serde_json::from_str(&j.stdout).expect("JSON");
    assert_eq!(v["kind"], "List");
    assert_eq!(v["items"][0]["kind"], "Role");
    assert_eq!(v["items"][0]["metadata"]["namespace"], "team-a");
    // Rules from stdin too.
    let objects = dir.path().join("ns.yaml");
    std::fs::write(&objects, ns).expect("write");
    let s = run(
        &[
            "render",
            "--rules",
            "-",
            "--objects",
            objects.to_str().expect("utf-8"),
        ],
        Some(NAMESPACE_RULE),
    );
    assert_eq!(s.stdout, r.stdout, "{}", s.stderr);
}

#[test]
fn the_built_in_rules_are_never_used_silently() {
    let r = run(
        &["render", "--objects", "examples/crossplane-cluster.yaml"],
        None,
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("note: render: no rules given: using the built-in rules"),
        "{}",
        r.stderr
    );
    assert!(!r.stdout.contains("note:"), "notes stay off stdout");
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, NAMESPACE_RULE).expect("write");
    let r = run(
        &[
            "render",
            "--rules",
            rules.to_str().expect("utf-8"),
            "--objects",
            "examples/crossplane-cluster.yaml",
        ],
        None,
    );
    assert!(!r.stderr.contains("built-in"), "{}", r.stderr);
}

#[test]
fn a_rule_directory_skips_other_documents_with_a_note() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), NAMESPACE_RULE).expect("write");
    let role = run(
        &[
            "controller-role",
            "--rules",
            dir.path().to_str().expect("utf-8"),
        ],
        None,
    );
    assert_eq!(role.code, Some(0), "{}", role.stderr);
    std::fs::write(dir.path().join("watch.yaml"), &role.stdout).expect("write");
    let ns = dir.path().join("ns.yaml");
    std::fs::write(
        &ns,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a, uid: u1}\n",
    )
    .expect("write");
    let r = run(
        &[
            "render",
            "--rules",
            dir.path().to_str().expect("utf-8"),
            "--objects",
            ns.to_str().expect("utf-8"),
        ],
        None,
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("watch.yaml#1: skipped ClusterRole \"rbac-rules:rules\": not an RbacRule"),
        "{}",
        r.stderr
    );
    // Named as a rule file, it is an error: a file given is meant as rules.
    let r = run(
        &[
            "render",
            "--rules",
            dir.path().join("watch.yaml").to_str().expect("utf-8"),
            "--objects",
            ns.to_str().expect("utf-8"),
        ],
        None,
    );
    assert_eq!(r.code, Some(1), "{}", r.stderr);
}

/// The ClusterRole `controller-role` prints for the built-in rules is what
/// the shipped controller role (deploy/controller/rbac.yaml, aggregated)
/// grants for them.
#[test]
fn controller_role_of_the_built_in_rules_is_shipped() {
    let r = run(&["controller-role", "-o", "json"], None);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let role: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON");
    assert_eq!(
        role["metadata"]["labels"]["rbacrules.io/aggregate-to-controller"],
        "true"
    );
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text =
        std::fs::read_to_string(root.join("deploy/controller/rbac.yaml")).expect("rbac.yaml");
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).expect("yaml");
    let shipped: Vec<k8s_openapi::api::rbac::v1::PolicyRule> = docs
        .iter()
        .filter(|d| {
            d["kind"] == "ClusterRole"
                && d["metadata"]["labels"]["rbacrules.io/aggregate-to-controller"] == "true"
        })
        .flat_map(|d| {
            serde_json::from_value::<Vec<k8s_openapi::api::rbac::v1::PolicyRule>>(
                d["rules"].clone(),
            )
            .unwrap_or_default()
        })
        .collect();
    let wanted: Vec<k8s_openapi::api::rbac::v1::PolicyRule> =
        serde_json::from_value(role["rules"].clone()).expect("rules");
    assert!(!wanted.is_empty());
    let (all, missing) = rbac_rules::policy::covers(&shipped, &wanted);
    assert!(all, "deploy/controller/rbac.yaml lacks {missing:?}");
    // A CRD among the objects gives a custom kind its plural.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("rules.yaml"),
        "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRule\nmetadata: {name: geese}\nspec:\n  trigger: {apiGroup: birds.example.org, kind: Goose}\n  outputs:\n  - {kind: ClusterRole, name: x}\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("crd.yaml"),
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: geese.birds.example.org}\nspec: {group: birds.example.org, names: {kind: Goose, plural: geese}}\n",
    )
    .expect("write");
    let r = run(
        &[
            "controller-role",
            "--rules",
            dir.path().join("rules.yaml").to_str().expect("utf-8"),
            "--objects",
            dir.path().join("crd.yaml").to_str().expect("utf-8"),
            "--name",
            "rbac-rules:birds",
        ],
        None,
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("name: rbac-rules:birds"), "{}", r.stdout);
    assert!(
        r.stdout.contains("- geese\n") && r.stdout.contains("- geese/finalizers\n"),
        "{}",
        r.stdout
    );
}

#[test]
fn test_results_as_data() {
    let r = run(
        &["test", "rules/examples/any-crd/tests", "-o", "json"],
        None,
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON");
    assert!(
        v[0]["name"].is_string() && v[0]["failures"].is_array(),
        "{v}"
    );
}

/// Logs written to a file or a pipe carry no terminal colours: `run`'s
/// error log (no cluster to reach) on a piped stderr is plain text.
#[test]
fn logs_to_a_pipe_have_no_colours() {
    let mut cmd = support::cli::command(["run", "--log-format", "text"]);
    cmd.env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("NO_COLOR");
    let out = support::cli::output(&mut cmd);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("ERROR"), "{}", out.stderr);
    assert!(!out.stderr.contains('\u{1b}'), "{:?}", out.stderr);
}
