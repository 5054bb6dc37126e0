//! `rbac-rules diff` exit codes that need no cluster: an unreachable API
//! server is an error (2), never "no changes" (0).

mod support;

#[test]
fn an_unreachable_cluster_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("config");
    // Port 1 on localhost: connection refused.
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'http://127.0.0.1:1'}\nusers:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
    )
    .expect("write kubeconfig");
    let out = support::cli::rbac_rules()
        .args(["diff", "--timeout-seconds", "1"])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("RBAC_RULES_ADOPT_EXISTING")
        .output()
        .expect("run rbac-rules");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("error: the watches did not list within 1 s"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}
