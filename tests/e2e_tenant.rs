//! End-to-end: delegation (NamespacedRbacRule) on a real API server.
//!
//! ```sh
//! RBAC_RULES_E2E_KUBECONFIG=<file> cargo test --test e2e_tenant -- --ignored --test-threads=1
//! ```
//!
//! `#[ignore]`d like the other e2e suites (tests/e2e_keep.rs): a throwaway
//! cluster with the ClusterRole aggregation controller, a cluster-admin
//! kubeconfig, no other rbac-rules controller; never at the same time as
//! another e2e suite (hold `flock /tmp/testbed.lock` on the shared
//! testbed).
//!
//! Installed: both CRDs, `deploy/controller/tenant-rbac.yaml` (namespace
//! admins may write NamespacedRbacRules) and `deploy/tenant-admission.yaml`
//! (the author must hold what a rule grants). The controller runs as a
//! local process with the admin kubeconfig. Namespaces A and B; `alice` is
//! bound to `admin` in A, `bob` to a custom Role in A that may write rules
//! and exec into pods but not read Secrets, `carol` to `admin` in B.
//!
//! 1. Alice's on-call rule (exec into pods for a group) is admitted and
//!    works: its Role and RoleBinding appear under its tenant names and a
//!    SubjectAccessReview for a member of the group says yes in A, no in B.
//! 2. Refused at admission with a clear message: Secrets by bob (who cannot
//!    read them), `escalate`, a binding of `cluster-admin`, a ClusterRole
//!    output, a Role in namespace B, and bob's later edit of alice's rule.
//! 3. Refused at evaluation, with the rule's status (`OverCeiling` or
//!    `EscalationDenied`) and a Warning Event in A about the rule: a
//!    binding of a `system:masters` subject, and `escalate` filled in by
//!    trigger data (the same trigger's other output stays).
//! 4. Nothing else changed: carol's rule's objects in B, and a cluster
//!    rule's Role in A, keep their uid and resourceVersion; nothing of
//!    the refused rules exists.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};

mod support;
use support::e2e::*;

const KUBECONFIG_VAR: &str = "RBAC_RULES_E2E_KUBECONFIG";
const MANAGER: &str = "rbac-rules-e2e";

fn nrbr_ar() -> ApiResource {
    ar(
        "rbacrules.io",
        "v1alpha1",
        "NamespacedRbacRule",
        "namespacedrbacrules",
    )
}

fn rbacrule_ar() -> ApiResource {
    ar("rbacrules.io", "v1alpha1", "RbacRule", "rbacrules")
}

fn vap_ar() -> ApiResource {
    ar(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
    )
}

fn vapb_ar() -> ApiResource {
    ar(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
    )
}

fn event_ar() -> ApiResource {
    ar("events.k8s.io", "v1", "Event", "events")
}

/// The controller as a local process; stopped when dropped.
struct Controller {
    child: Child,
    log: PathBuf,
    port: u16,
}

impl Controller {
    fn start(kubeconfig: &Path, log: PathBuf) -> Controller {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let out = std::fs::File::create(&log).expect("create controller log");
        let mut cmd = support::cli::rbac_rules();
        cmd.args([
            "run",
            "--leader-election=false",
            "--metrics-address",
            &format!("127.0.0.1:{port}"),
            "--identity",
            "rbac-rules-e2e-tenant",
            "--debounce-ms",
            "100",
        ]);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("RBAC_RULES_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .env("RBAC_RULES_LOG_FORMAT", "text")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out);
        let child = cmd.spawn().expect("start rbac-rules run");
        eprintln!(
            "started controller pid {}, log {}",
            child.id(),
            log.display()
        );
        Controller { child, log, port }
    }

    /// Waits until `/readyz` answers 200: the first sync is done.
    async fn wait_ready(&mut self) {
        let port = self.port;
        eventually("the controller's /readyz", async || {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the controller exited: {status}");
            }
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map_err(|e| format!("connect: {e}"))?;
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            s.write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .await
                .map_err(|e| format!("write: {e}"))?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf)
                .await
                .map_err(|e| format!("read: {e}"))?;
            let text = String::from_utf8_lossy(&buf);
            if text.starts_with("HTTP/1.1 200") {
                Ok(())
            } else {
                Err(text.lines().next().unwrap_or_default().to_string())
            }
        })
        .await;
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(80)..].join("\n");
            eprintln!("--- controller log (tail) ---\n{tail}\n--- end ---");
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn client_as(kubeconfig: &Path, user: Option<&str>) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig)
        .unwrap_or_else(|e| panic!("{KUBECONFIG_VAR}={}: {e}", kubeconfig.display()));
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("client configuration");
    if let Some(user) = user {
        config.auth_info.impersonate = Some(user.to_string());
    }
    Client::try_from(config).expect("client")
}

fn api(client: &Client, ar: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    }
}

async fn apply(client: &Client, ar: &ApiResource, ns: Option<&str>, obj: &Value) {
    let name = obj["metadata"]["name"].as_str().expect("name");
    api(client, ar, ns)
        .patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {} {name}: {e}", ar.kind));
}

async fn get(client: &Client, ar: &ApiResource, ns: Option<&str>, name: &str) -> Option<Value> {
    api(client, ar, ns)
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get {} {name}: {e}", ar.kind))
        .map(|o| serde_json::to_value(o).expect("json"))
}

/// Creates a NamespacedRbacRule as `client`'s user: the API server's
/// answer (Err: its message).
async fn create_rule(client: &Client, ns: &str, name: &str, outputs: Value) -> Result<(), String> {
    create_rule_spec(client, ns, name, json!({ "outputs": outputs })).await
}

async fn create_rule_spec(
    client: &Client,
    ns: &str,
    name: &str,
    spec: Value,
) -> Result<(), String> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rbacrules.io/v1alpha1", "kind": "NamespacedRbacRule",
        "metadata": {"name": name, "namespace": ns}, "spec": spec}))
    .expect("object");
    api(client, &nrbr_ar(), Some(ns))
        .create(&PostParams::default(), &obj)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn refused_with(r: Result<(), String>, needle: &str) {
    match r {
        Ok(()) => panic!("admitted; expected a refusal saying {needle:?}"),
        Err(e) => assert!(
            e.contains(needle) && e.contains("rbac-rules-tenant-grants"),
            "refused, but not by the tenant policy saying {needle:?}: {e}"
        ),
    }
}

async fn may(
    client: &Client,
    user: &str,
    groups: &[&str],
    ns: &str,
    verb: &str,
    resource: &str,
    sub: Option<&str>,
) -> bool {
    let sar = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: Some(groups.iter().map(|g| g.to_string()).collect()),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(ns.to_string()),
                verb: Some(verb.to_string()),
                resource: Some(
                    resource
                        .split_once('.')
                        .map_or(resource, |(r, _)| r)
                        .to_string(),
                ),
                group: resource.split_once('.').map(|(_, g)| g.to_string()),
                subresource: sub.map(str::to_string),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &sar)
        .await
        .expect("SubjectAccessReview")
        .status
        .is_some_and(|s| s.allowed)
}

/// The Degraded condition of a tenant rule: (status, reason, message).
async fn degraded(client: &Client, ns: &str, name: &str) -> Option<(String, String, String)> {
    let r = get(client, &nrbr_ar(), Some(ns), name).await?;
    r["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Degraded")
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("status"), s("reason"), s("message"))
        })
}

/// uid and resourceVersion of every RBAC object of `ns`, by "Kind/name".
async fn rbac_in(client: &Client, ns: &str) -> BTreeMap<String, (String, String)> {
    let mut out = BTreeMap::new();
    for ar in [role_ar(), rb_ar()] {
        for o in api(client, &ar, Some(ns))
            .list(&ListParams::default())
            .await
            .expect("list")
        {
            out.insert(
                format!("{}/{}", ar.kind, o.metadata.name.unwrap_or_default()),
                (
                    o.metadata.uid.unwrap_or_default(),
                    o.metadata.resource_version.unwrap_or_default(),
                ),
            );
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a throwaway cluster: RBAC_RULES_E2E_KUBECONFIG=<file> cargo test --test e2e_tenant -- --ignored --test-threads=1"]
async fn tenants_grant_only_what_they_hold_and_reach_nothing_else() {
    let Some(path) = std::env::var_os(KUBECONFIG_VAR).filter(|p| !p.is_empty()) else {
        panic!("{KUBECONFIG_VAR} not set: a throwaway cluster's admin kubeconfig");
    };
    let path = PathBuf::from(path);
    let admin = client_as(&path, None).await;
    let sfx = suffix();
    let a = format!("tenant-a-{sfx}");
    let b = format!("tenant-b-{sfx}");
    let dir = tempfile::tempdir().expect("temp dir");

    // Install what delegation needs.
    let mut crds = read_yaml("crds/rbacrules.rbacrules.io.yaml");
    crds.extend(read_yaml("crds/namespacedrbacrules.rbacrules.io.yaml"));
    apply_crds(&admin, MANAGER, &crds).await;
    for o in read_yaml("deploy/controller/tenant-rbac.yaml") {
        apply(&admin, &cr_ar(), None, &o).await;
    }
    for o in read_yaml("deploy/tenant-admission.yaml") {
        let ar = if o["kind"] == "ValidatingAdmissionPolicy" {
            vap_ar()
        } else {
            vapb_ar()
        };
        apply(&admin, &ar, None, &o).await;
    }
    for ns in [&a, &b] {
        apply(
            &admin,
            &ns_ar(),
            None,
            &json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns}}),
        )
        .await;
    }
    let bind = |ns: &str, name: &str, kind: &str, role: &str, user: &str| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    };
    apply(
        &admin,
        &rb_ar(),
        Some(&a),
        &bind(&a, "alice-admin", "ClusterRole", "admin", "alice"),
    )
    .await;
    apply(
        &admin,
        &rb_ar(),
        Some(&b),
        &bind(&b, "carol-admin", "ClusterRole", "admin", "carol"),
    )
    .await;
    // Bob may write rules and exec into pods, but not read Secrets.
    apply(&admin, &role_ar(), Some(&a), &json!({"apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role", "metadata": {"name": "rule-writer", "namespace": a},
        "rules": [
            {"apiGroups": ["rbacrules.io"], "resources": ["namespacedrbacrules"],
             "verbs": ["get", "list", "watch", "create", "update", "patch"]},
            {"apiGroups": [""], "resources": ["pods", "pods/exec"], "verbs": ["get", "list", "create"]}]}))
    .await;
    apply(
        &admin,
        &rb_ar(),
        Some(&a),
        &bind(&a, "bob-writer", "Role", "rule-writer", "bob"),
    )
    .await;
    // A cluster rule's Role in A: a tenant may not touch it.
    apply(
        &admin,
        &rbacrule_ar(),
        None,
        &json!({"apiVersion": "rbacrules.io/v1alpha1",
        "kind": "RbacRule", "metadata": {"name": format!("cluster-{sfx}")},
        "spec": {"outputs": [{"kind": "Role", "name": "cluster-made", "namespace": a,
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}]}}),
    )
    .await;

    let alice = client_as(&path, Some("alice")).await;
    let bob = client_as(&path, Some("bob")).await;
    let carol = client_as(&path, Some("carol")).await;
    // Aggregation into `admin` takes a moment.
    eventually("alice may write NamespacedRbacRules", async || {
        if may(
            &admin,
            "alice",
            &[],
            &a,
            "create",
            "namespacedrbacrules.rbacrules.io",
            None,
        )
        .await
        {
            Ok(())
        } else {
            Err("not yet".to_string())
        }
    })
    .await;

    let mut controller = Controller::start(&path, dir.path().join("controller.log"));
    controller.wait_ready().await;

    // 1. What alice holds, she may grant; it works.
    let on_call = json!([
        {"kind": "Role", "name": "incident-exec",
         "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]},
                   {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]},
        {"kind": "RoleBinding", "name": "incident-exec",
         "roleRef": {"kind": "Role", "name": "tenant:on-call:incident-exec"},
         "subjects": [{"kind": "Group", "name": "team-a-oncall", "apiGroup": "rbac.authorization.k8s.io"}]}
    ]);
    create_rule(&alice, &a, "on-call", on_call.clone())
        .await
        .expect("alice's on-call rule is admitted");
    create_rule(
        &carol,
        &b,
        "readers",
        json!([
        {"kind": "Role", "name": "pod-reader",
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}]),
    )
    .await
    .expect("carol's rule in B is admitted");
    eventually("the on-call Role and RoleBinding", async || {
        let role = get(&admin, &role_ar(), Some(&a), "tenant:on-call:incident-exec").await;
        let binding = get(&admin, &rb_ar(), Some(&a), "tenant:on-call:incident-exec").await;
        let b_role = get(&admin, &role_ar(), Some(&b), "tenant:readers:pod-reader").await;
        let cluster = get(&admin, &role_ar(), Some(&a), "cluster-made").await;
        match (role, binding, b_role, cluster) {
            (Some(_), Some(_), Some(_), Some(_)) => Ok(()),
            other => Err(format!("{:?}", other.0.is_some())),
        }
    })
    .await;
    assert!(
        may(
            &admin,
            "dave",
            &["team-a-oncall"],
            &a,
            "create",
            "pods",
            Some("exec")
        )
        .await
    );
    assert!(
        !may(
            &admin,
            "dave",
            &["team-a-oncall"],
            &b,
            "create",
            "pods",
            Some("exec")
        )
        .await
    );
    assert!(
        !may(
            &admin,
            "dave",
            &["team-a-oncall"],
            &a,
            "get",
            "secrets",
            None
        )
        .await
    );
    eventually("on-call Ready", async || {
        match degraded(&admin, &a, "on-call").await {
            Some((s, _, _)) if s == "False" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let before_b = rbac_in(&admin, &b).await;
    let cluster_made = get(&admin, &role_ar(), Some(&a), "cluster-made")
        .await
        .expect("the cluster rule's Role");

    // 2. Refused at admission, saying what is missing.
    let secrets = json!([{"kind": "Role", "name": "secrets",
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}]);
    refused_with(
        create_rule(&bob, &a, "bob-secrets", secrets.clone()).await,
        &format!("you lack get on secrets in namespace {a}"),
    );
    refused_with(
        create_rule(
            &alice,
            &a,
            "escalate",
            json!([{"kind": "Role", "name": "esc",
            "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"],
                       "verbs": ["escalate"]}]}]),
        )
        .await,
        "you lack escalate on roles.rbac.authorization.k8s.io",
    );
    refused_with(
        create_rule(&alice, &a, "root", json!([{"kind": "RoleBinding", "name": "root",
            "roleRef": {"kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "User", "name": "mallory", "apiGroup": "rbac.authorization.k8s.io"}]}])).await,
        "you lack bind on clusterroles.rbac.authorization.k8s.io cluster-admin",
    );
    refused_with(
        create_rule(
            &alice,
            &a,
            "cluster-wide",
            json!([{"kind": "ClusterRole", "name": "mine",
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}]),
        )
        .await,
        "emits only Roles and RoleBindings",
    );
    refused_with(
        create_rule(
            &alice,
            &a,
            "elsewhere",
            json!([{"kind": "Role", "name": "there",
            "namespace": b,
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}]),
        )
        .await,
        "stays in its namespace",
    );
    // A later edit by a weaker user: bob adds Secrets to alice's rule.
    let mut rule = get(&bob, &nrbr_ar(), Some(&a), "on-call")
        .await
        .expect("bob reads the rule");
    rule["spec"]["outputs"][0]["rules"]
        .as_array_mut()
        .expect("rules")
        .push(json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}));
    let edited: DynamicObject = serde_json::from_value(rule).expect("object");
    let edit = api(&bob, &nrbr_ar(), Some(&a))
        .replace("on-call", &PostParams::default(), &edited)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
    refused_with(edit, "you lack get on secrets");

    // 3. Refused at evaluation: what admission cannot see.
    create_rule(&alice, &a, "masters", json!([{"kind": "RoleBinding", "name": "masters",
        "roleRef": {"kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "Group", "name": "system:masters", "apiGroup": "rbac.authorization.k8s.io"}]}]))
    .await
    .expect("admitted: subjects are the ceiling's");
    apply(
        &admin,
        &ar("", "v1", "ConfigMap", "configmaps"),
        Some(&a),
        &json!({"apiVersion": "v1",
        "kind": "ConfigMap", "metadata": {"name": "ask", "namespace": a, "labels": {"ask": "yes"}},
        "data": {"verb": "escalate"}}),
    )
    .await;
    create_rule_spec(
        &alice,
        &a,
        "templated",
        json!({
        "trigger": {"kind": "ConfigMap", "selector": {"matchLabels": {"ask": "yes"}}},
        "outputs": [
            {"kind": "Role", "name": "fine-{{trigger.metadata.name}}",
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
            {"kind": "Role", "name": "asked-{{trigger.metadata.name}}",
             "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"],
                        "verbs": ["{{trigger.data.verb}}"]}]}]}),
    )
    .await
    .expect("admitted: the verb is data");
    for rule in ["masters", "templated"] {
        let (_, reason, message) = eventually(
            format!("{rule} refused at evaluation"),
            async || match degraded(&admin, &a, rule).await {
                Some((s, r, m))
                    if s == "True" && (r == "OverCeiling" || r == "EscalationDenied") =>
                {
                    Ok((s, r, m))
                }
                other => Err(format!("{other:?}")),
            },
        )
        .await;
        eprintln!("{rule}: {reason}: {message}");
        eventually(format!("a Warning Event about {rule} in {a}"), async || {
            let events = api(&admin, &event_ar(), Some(&a))
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let found = events.items.iter().any(|e| {
                let v = serde_json::to_value(e).unwrap_or_default();
                v["regarding"]["kind"] == "NamespacedRbacRule"
                    && v["regarding"]["name"] == rule
                    && v["type"] == "Warning"
                    && v["reason"] == reason.as_str()
            });
            if found {
                Ok(())
            } else {
                Err(format!("{} events", events.items.len()))
            }
        })
        .await;
    }
    assert!(
        get(&admin, &rb_ar(), Some(&a), "tenant:masters:masters")
            .await
            .is_none()
    );
    assert!(
        get(&admin, &role_ar(), Some(&a), "tenant:templated:asked-ask")
            .await
            .is_none()
    );
    assert!(
        get(&admin, &role_ar(), Some(&a), "tenant:templated:fine-ask")
            .await
            .is_some(),
        "the same trigger's other output stays"
    );

    // 4. Nothing else changed.
    assert_eq!(rbac_in(&admin, &b).await, before_b, "tenant B's objects");
    let now = get(&admin, &role_ar(), Some(&a), "cluster-made")
        .await
        .expect("the cluster rule's Role");
    assert_eq!(now["metadata"]["uid"], cluster_made["metadata"]["uid"]);
    assert_eq!(
        now["metadata"]["resourceVersion"],
        cluster_made["metadata"]["resourceVersion"]
    );
    for name in ["secrets", "esc", "root", "mine", "there"] {
        assert!(
            get(
                &admin,
                &role_ar(),
                Some(&a),
                &format!("tenant:bob-secrets:{name}")
            )
            .await
            .is_none()
        );
        assert!(get(&admin, &role_ar(), Some(&b), name).await.is_none());
    }
    assert!(get(&admin, &cr_ar(), None, "mine").await.is_none());
    let log = controller.log();
    assert!(!log.contains("panicked"), "{log}");
}
