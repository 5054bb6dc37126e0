//! `explain --live` against a scripted API server: the exact requests (the
//! installed controller's Deployment, one SubjectAccessReview with the
//! subject's implied groups, the four RBAC lists, nothing written) and
//! which objects of rbac-rules it names as granting the request.

mod support;

use clap::Parser;
use http::Method;
use rbac_rules::explain::{ExplainArgs, explain_live};
use serde_json::{Value, json};
use support::api::pair;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ExplainArgs,
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items})
}

/// An object rbac-rules made: labelled, annotated, and applied by its
/// field manager.
fn managed(mut o: Value, rule: &str, trigger: &str) -> Value {
    o["metadata"]["labels"]["app.kubernetes.io/managed-by"] = json!("rbac-rules");
    o["metadata"]["annotations"] =
        json!({"rbacrules.io/rule": rule, "rbacrules.io/trigger": trigger});
    o["metadata"]["managedFields"] = json!([{"manager": "rbac-rules", "operation": "Apply", "apiVersion": "rbac.authorization.k8s.io/v1"}]);
    o
}

/// The same claim written by someone else (kubectl apply): not believed.
fn forged(o: Value, rule: &str, trigger: &str) -> Value {
    let mut o = managed(o, rule, trigger);
    o["metadata"]["managedFields"] = json!([{"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "rbac.authorization.k8s.io/v1"}]);
    o
}

const SECRETS: &str =
    "[{\"apiGroups\": [\"\"], \"resources\": [\"secrets\"], \"verbs\": [\"get\", \"list\"]}]";

#[tokio::test]
async fn a_service_account_is_reviewed_with_its_groups_and_the_granting_rule_is_named() {
    let (client, mut server) = pair();
    let secrets: Value = serde_json::from_str(SECRETS).expect("rules");
    let scenario = tokio::spawn(async move {
        let r = server
            .next()
            .await
            .expect(Method::GET, "/apis/apps/v1/deployments");
        assert_eq!(
            r.param("labelSelector"),
            Some("app.kubernetes.io%2Fname%3Drbac-rules")
        );
        r.respond(
            200,
            list(
                "DeploymentList",
                vec![json!({"metadata": {"name": "rbac-rules", "namespace": "rbac-rules-system"},
                    "spec": {"selector": {}, "template": {"spec": {"containers": [
                        {"name": "controller", "image": "ghcr.io/x/rbac-rules:1", "args": ["run"],
                         "env": [{"name": "RBAC_RULES_PARAM_crossplaneNamespace", "value": "xp-system"}]}]}}}})],
            ),
        );
        let r = server.next().await.expect(
            Method::POST,
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        );
        let spec = r.body["spec"].clone();
        assert_eq!(
            spec,
            json!({
                "user": "system:serviceaccount:xp-system:provider-nop",
                "groups": ["ops", "system:authenticated", "system:serviceaccounts", "system:serviceaccounts:xp-system"],
                "resourceAttributes": {"verb": "get", "group": "", "resource": "secrets", "namespace": "team-a"}
            })
        );
        let mut answer = r.body.clone();
        answer["status"] = json!({"allowed": true, "reason": "RBAC: allowed by ClusterRoleBinding \"crossplane:provider:p:system\""});
        r.respond(201, answer);
        let r = server.next().await.expect(
            Method::GET,
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        );
        r.respond(
            200,
            list(
                "ClusterRoleList",
                vec![
                    managed(
                        json!({"metadata": {"name": "crossplane:provider:p:system"}, "rules": secrets}),
                        "crossplane-provider-system",
                        "ProviderRevision.pkg.crossplane.io/p-1",
                    ),
                    json!({"metadata": {"name": "ops-view"},
                        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"ops": "true"}}]},
                        "rules": secrets}),
                    managed(
                        json!({"metadata": {"name": "ops-secrets", "labels": {"ops": "true"}}, "rules": secrets}),
                        "ops-roles",
                        "Namespace/team-a",
                    ),
                ],
            ),
        );
        let r = server.next().await.expect(
            Method::GET,
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        );
        r.respond(
            200,
            list(
                "ClusterRoleBindingList",
                vec![
                    managed(
                        json!({"metadata": {"name": "crossplane:provider:p:system"},
                            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "crossplane:provider:p:system"},
                            "subjects": [{"kind": "ServiceAccount", "name": "provider-nop", "namespace": "xp-system"}]}),
                        "crossplane-provider-system",
                        "ProviderRevision.pkg.crossplane.io/p-1",
                    ),
                    // Claims a rule, but rbac-rules did not make it.
                    forged(
                        json!({"metadata": {"name": "forged"},
                            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "crossplane:provider:p:system"},
                            "subjects": [{"kind": "ServiceAccount", "name": "provider-nop", "namespace": "xp-system"}]}),
                        "crossplane-provider-system",
                        "ProviderRevision.pkg.crossplane.io/p-1",
                    ),
                    // Through an implied group, not named in --as.
                    json!({"metadata": {"name": "xp-sas"},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ops-view"},
                        "subjects": [{"kind": "Group", "name": "system:serviceaccounts:xp-system"}]}),
                ],
            ),
        );
        for (path, kind) in [
            ("/apis/rbac.authorization.k8s.io/v1/roles", "RoleList"),
            (
                "/apis/rbac.authorization.k8s.io/v1/rolebindings",
                "RoleBindingList",
            ),
        ] {
            server
                .next()
                .await
                .expect(Method::GET, path)
                .respond(200, list(kind, vec![]));
        }
        server.done().await;
    });
    let args = Cli::parse_from([
        "explain",
        "--live",
        "--as",
        "system:serviceaccount:xp-system:provider-nop",
        "--as-group",
        "ops",
        "--verb",
        "get",
        "--resource",
        "secrets",
        "-n",
        "team-a",
    ])
    .args;
    let (text, data) = explain_live(client, &args).await.expect("explain");
    scenario.await.expect("requests as expected");
    assert_eq!(
        text,
        "ServiceAccount xp-system/provider-nop CAN get secrets in namespace team-a \
         (SubjectAccessReview: RBAC: allowed by ClusterRoleBinding \"crossplane:provider:p:system\")\n\
         \x20 granted by: ClusterRoleBinding crossplane:provider:p:system \
         [rule crossplane-provider-system, trigger ProviderRevision.pkg.crossplane.io/p-1] → \
         ClusterRole crossplane:provider:p:system \
         [rule crossplane-provider-system, trigger ProviderRevision.pkg.crossplane.io/p-1]\n\
         \x20 granted by: ClusterRoleBinding forged → ClusterRole crossplane:provider:p:system \
         [rule crossplane-provider-system, trigger ProviderRevision.pkg.crossplane.io/p-1]\n\
         \x20 granted by: ClusterRoleBinding xp-sas → ClusterRole ops-view\n\
         \x20     aggregated from ClusterRole ops-secrets [rule ops-roles, trigger Namespace/team-a]\n"
    );
    assert_eq!(data["allowed"], true);
    assert_eq!(data["grantedBy"].as_array().map(Vec::len), Some(3));
}
