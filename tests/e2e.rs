//! End-to-end: the controller binary against a real API server.
//!
//! ```sh
//! RBAC_RULES_E2E_KUBECONFIG=<file> cargo test --test e2e -- --ignored --test-threads=1
//! ```
//!
//! The test is `#[ignore]`d: `cargo test` lists it as ignored and never
//! runs it. Run with `--ignored` but without `RBAC_RULES_E2E_KUBECONFIG`,
//! it fails, saying so.
//!
//! # What it assumes of the cluster
//!
//! - A **throwaway** cluster, Kubernetes 1.32 or later. A bare control
//!   plane is enough: kube-apiserver with RBAC authorization, and
//!   kube-controller-manager running at least the ClusterRole aggregation,
//!   garbage collector and namespace controllers. No nodes (no pod ever
//!   runs), no Crossplane.
//! - The kubeconfig's current context is a cluster admin (system:masters or
//!   equivalent): it installs CRDs and RBAC, impersonates, and creates
//!   SubjectAccessReviews.
//! - No other rbac-rules controller runs there.
//!
//! # What it changes
//!
//! Installed and left in place (idempotent, so reruns are quick): the
//! RbacRule CRD (`crds/`), the built-in rules (`rules/*.yaml`), stand-in
//! CRDs for Crossplane's ProviderRevision and CompositeResourceDefinition
//! (`tests/e2e/stand-in-crds.yaml`; the suite refuses to run if real
//! Crossplane CRDs of those names exist), the controller's ClusterRoles
//! from `deploy/controller/rbac.yaml`, and the static outputs of the
//! built-in rules (`crossplane`, `crossplane-admin`, ...).
//!
//! Per run, with a random suffix, and deleted at the end even on failure:
//! two namespaces, an XRD, a ProviderRevision and its Deployment, the CRDs
//! a real Crossplane makes for them (ownerReferences to the XRD and the
//! revision: the built-in rules believe a type only with that lineage), a
//! ValidatingAdmissionPolicy and its binding, ClusterRoles, a
//! ClusterRoleBinding and a RoleBinding. What the controller generated for
//! them goes with them (ownerReferences).
//!
//! # What it checks, in order
//!
//! The controller runs as a local process (`rbac-rules run
//! --leader-election=false`) whose kubeconfig impersonates a ServiceAccount
//! bound only to deploy/'s ClusterRole: every step below also proves that
//! the RBAC in deploy/ is enough.
//!
//! 0. the admission fence (deploy/admission.yaml as shipped, matching the
//!    ServiceAccount `rbac-rules` in this run's namespace) refuses an
//!    unlabelled ClusterRole and a binding to cluster-admin written as the
//!    controller; as the controller, which RBAC allows to patch, escalate and
//!    delete ClusterRoles, rewriting, relabelling or deleting `cluster-admin`
//!    (dry run) or an unlabelled ClusterRole someone else made is refused by
//!    the fence and leaves them unchanged; every write of the steps below
//!    passes;
//! 1. the static outputs appear and every built-in rule turns Ready;
//! 2. an XRD gets its four ClusterRoles (provenance, owner, rules), the
//!    aggregated `crossplane-edit` picks them up, and the rule gets an
//!    `Applied` Event;
//! 3. a ProviderRevision with `status.objectRefs` and a Deployment it
//!    controls get their ClusterRoles and the system ClusterRoleBinding to
//!    the Deployment's ServiceAccount;
//! 4. a Namespace annotated to accept the XRD's claims gets Roles
//!    `crossplane-{admin,edit,view}`; a user bound to its `crossplane-edit`
//!    may create claims there and nowhere else (SubjectAccessReview);
//! 5. a Role labelled ours by someone else (a namespace admin) is neither
//!    pruned nor written, and reported on the rule it names; a hand edit
//!    of a generated ClusterRole (rules and a label) is reverted;
//! 6. a restarted controller writes nothing: `rbac_rules_api_writes_total`
//!    stays 0 and no managed object or RbacRule changes resourceVersion;
//! 7. deleting the XRD removes its roles and the claim permission; removing
//!    the Namespace's annotation prunes its Roles; deleting the
//!    ProviderRevision removes its roles, binding and Deployment;
//! 8. the controller never got a 403 (`rbac_rules_reconcile_errors_total`).
//!
//! Set `RBAC_RULES_E2E_LOG` to a `RUST_LOG` filter for the controller
//! (default `info`); its logs are printed when the test fails.

use std::collections::BTreeMap;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use rbac_rules::api::RbacRule;
use rbac_rules::policy;
use serde_json::{Value, json};

mod support;
use support::e2e::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const KUBECONFIG_VAR: &str = "RBAC_RULES_E2E_KUBECONFIG";
/// Field manager of everything the test applies.
const MANAGER: &str = "rbac-rules-e2e";
const MANAGED_BY: &str = "app.kubernetes.io/managed-by=rbac-rules";
/// The ServiceAccount the controller runs as (impersonated).
const CONTROLLER_SA: &str = "rbac-rules";
const XRD_ANNOTATION_VALUE: &str = "xrd-claim-accepted";

fn rules_of(obj: &Value) -> Vec<PolicyRule> {
    serde_json::from_value(obj["rules"].clone()).unwrap_or_default()
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..PolicyRule::default()
    }
}

fn covers(obj: &Value, wanted: &[PolicyRule]) -> Result<(), String> {
    let (ok, missing) = policy::covers(&rules_of(obj), wanted);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{} {} lacks {}",
            obj["kind"].as_str().unwrap_or_default(),
            obj["metadata"]["name"].as_str().unwrap_or_default(),
            serde_json::to_string(&missing).unwrap_or_default()
        ))
    }
}

/// Provenance and ownership of a generated object.
fn check_generated(obj: &Value, rule: &str, owner_uid: Option<&str>) -> Result<(), String> {
    let meta = &obj["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    if meta["labels"]["app.kubernetes.io/managed-by"] != "rbac-rules" {
        return Err(format!("{name}: no managed-by label"));
    }
    if meta["annotations"]["rbacrules.io/rule"] != rule {
        return Err(format!(
            "{name}: rule annotation {} (want {rule})",
            meta["annotations"]["rbacrules.io/rule"]
        ));
    }
    if let Some(uid) = owner_uid {
        if meta["annotations"]["rbacrules.io/trigger"]
            .as_str()
            .is_none()
        {
            return Err(format!("{name}: no trigger annotation"));
        }
        let owned = meta["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["uid"] == uid && r["controller"] == true);
        if !owned {
            return Err(format!(
                "{name}: not controlled by {uid}: {}",
                meta["ownerReferences"]
            ));
        }
    }
    Ok(())
}

/// One object the test created, deleted at the end.
struct Created {
    ar: ApiResource,
    namespace: Option<String>,
    name: String,
}

/// The running controller process; killed when dropped.
struct Controller {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Controller {
    /// Starts `rbac-rules run` with Crossplane's namespace set to
    /// `crossplane_ns` (`--param crossplaneNamespace`): this run's, never
    /// the default `crossplane-system`.
    fn start(kubeconfig: &Path, log: PathBuf, crossplane_ns: &str) -> Controller {
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
            "rbac-rules-e2e",
            "--param",
            &format!("crossplaneNamespace={crossplane_ns}"),
        ]);
        // Only what this test sets: no stray RBAC_RULES_* setting or kube-rs
        // debug override from the caller's environment.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("RBAC_RULES_") || k.starts_with("KUBE_RS_DEBUG_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("KUBECONFIG", kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("RBAC_RULES_E2E_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("RBAC_RULES_LOG_FORMAT", "text")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out);
        let child = cmd.spawn().expect("start rbac-rules run");
        eprintln!(
            "started controller pid {} on 127.0.0.1:{port}, log {}",
            child.id(),
            log.display()
        );
        Controller { child, port, log }
    }

    /// GET on the metrics server: status code and body.
    async fn get(&self, path: &str) -> Result<(u16, String), String> {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
            .await
            .map_err(|_| "read timed out".to_string())?
            .map_err(|e| format!("read: {e}"))?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("not an HTTP response: {text:?}"))?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((code, body))
    }

    fn exited(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(format!("the controller exited: {status}")),
            Ok(None) => Ok(()),
            Err(e) => Err(format!("cannot check the controller: {e}")),
        }
    }

    /// Waits for /readyz (every watch listed).
    async fn wait_ready(&mut self) {
        eventually("the controller's /readyz", async || {
            if let Err(e) = self.exited() {
                panic!("{e}\n{}", self.log_tail());
            }
            match self.get("/readyz").await? {
                (200, _) => Ok(()),
                (code, body) => Err(format!("{code} {body}")),
            }
        })
        .await;
    }

    async fn metrics(&self) -> String {
        match self.get("/metrics").await {
            Ok((200, body)) => body,
            other => panic!("GET /metrics: {other:?}"),
        }
    }

    /// SIGTERM, then SIGKILL after 10 s.
    fn stop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
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
        eprintln!("controller did not stop on SIGTERM: killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = f.seek(SeekFrom::Start(len.saturating_sub(16_000)));
            let _ = f.read_to_string(&mut text);
        }
        format!(
            "--- controller log {} (tail) ---\n{text}--- end of log ---",
            self.log.display()
        )
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sum of the samples of one metric (any labels) in a Prometheus text.
fn metric_sum(text: &str, name: &str) -> f64 {
    metric_lines(text, name)
        .iter()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn metric_lines<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .collect()
}

/// Everything one run uses.
struct Ctx {
    client: Client,
    dir: tempfile::TempDir,
    /// Namespace of the Deployment and of the controller's ServiceAccount.
    ns: String,
    /// The Namespace that accepts the XRD's claims.
    claims_ns: String,
    /// The XRD's group (its composite and claim kinds).
    group: String,
    xrd: String,
    /// The ProviderRevision and the group of its CRDs.
    pr: String,
    pr_group: String,
    user: String,
    created: Mutex<Vec<Created>>,
}

impl Ctx {
    fn api(&self, ar: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
        match ns {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, ar),
            None => Api::all_with(self.client.clone(), ar),
        }
    }

    fn remember(&self, ar: ApiResource, namespace: Option<&str>, name: &str) {
        self.created.lock().expect("lock").push(Created {
            ar,
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        });
    }

    async fn get(
        &self,
        ar: &ApiResource,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, String> {
        self.api(ar, ns)
            .get_opt(name)
            .await
            .map(|o| o.map(|o| serde_json::to_value(o).expect("json")))
            .map_err(|e| format!("get {} {name}: {e}", ar.kind))
    }

    async fn must_get(
        &self,
        ar: &ApiResource,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, String> {
        self.get(ar, ns, name)
            .await?
            .ok_or_else(|| format!("{} {name} does not exist", ar.kind))
    }

    async fn create(&self, ar: &ApiResource, ns: Option<&str>, obj: Value) -> Value {
        let name = obj["metadata"]["name"].as_str().expect("name").to_string();
        let obj: DynamicObject = serde_json::from_value(obj).expect("object");
        let out = self
            .api(ar, ns)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("create {} {name}: {e}", ar.kind));
        self.remember(ar.clone(), ns, &name);
        serde_json::to_value(out).expect("json")
    }

    async fn apply(&self, ar: &ApiResource, ns: Option<&str>, obj: &Value) -> Value {
        let name = obj["metadata"]["name"].as_str().expect("name");
        let out = self
            .api(ar, ns)
            .patch(
                name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(obj),
            )
            .await
            .unwrap_or_else(|e| panic!("apply {} {name}: {e}", ar.kind));
        serde_json::to_value(out).expect("json")
    }

    async fn delete(&self, ar: &ApiResource, ns: Option<&str>, name: &str) {
        match self
            .api(ar, ns)
            .delete(name, &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("delete {} {name}: {e}", ar.kind),
        }
    }

    async fn wait_gone(&self, ar: &ApiResource, ns: Option<&str>, name: &str) {
        eventually(
            format!("{} {name} to disappear", ar.kind),
            async || match self.get(ar, ns, name).await? {
                None => Ok(()),
                Some(_) => Err("still there".into()),
            },
        )
        .await;
    }

    /// Whether `user` may `verb` `group/resource` in `namespace` (None:
    /// cluster-wide), asked of the API server's authorizer.
    async fn may(
        &self,
        user: &str,
        groups: &[&str],
        ns: Option<&str>,
        verb: &str,
        group: &str,
        resource: &str,
    ) -> Result<bool, String> {
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.to_string()),
                groups: Some(groups.iter().map(|g| g.to_string()).collect()),
                resource_attributes: Some(ResourceAttributes {
                    namespace: ns.map(str::to_string),
                    verb: Some(verb.to_string()),
                    group: Some(group.to_string()),
                    resource: Some(resource.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let out = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &sar)
            .await
            .map_err(|e| format!("create SubjectAccessReview: {e}"))?;
        Ok(out.status.is_some_and(|s| s.allowed))
    }

    fn controller_user(&self) -> String {
        format!("system:serviceaccount:{}:{CONTROLLER_SA}", self.ns)
    }

    /// resourceVersion of every managed RBAC object and every RbacRule.
    async fn versions(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let lp = ListParams::default().labels(MANAGED_BY);
        for ar in [cr_ar(), crb_ar(), role_ar(), rb_ar()] {
            let list = self
                .api(&ar, None)
                .list(&lp)
                .await
                .unwrap_or_else(|e| panic!("list {}: {e}", ar.plural));
            for o in list {
                out.insert(
                    format!(
                        "{} {}/{}",
                        ar.kind,
                        o.metadata.namespace.unwrap_or_default(),
                        o.metadata.name.unwrap_or_default()
                    ),
                    o.metadata.resource_version.unwrap_or_default(),
                );
            }
        }
        let rules = Api::<RbacRule>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .expect("list rbacrules");
        for r in rules {
            out.insert(
                format!("RbacRule {}", r.metadata.name.unwrap_or_default()),
                r.metadata.resource_version.unwrap_or_default(),
            );
        }
        out
    }

    /// Waits until nothing managed changes for a few seconds.
    async fn settled_versions(&self) -> BTreeMap<String, String> {
        let mut last = self.versions().await;
        eventually("managed objects to settle", async || {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let now = self.versions().await;
            if now == last {
                Ok(now)
            } else {
                let changed = diff(&last, &now);
                last = now;
                Err(format!("still changing: {changed}"))
            }
        })
        .await
    }
}

fn diff(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> String {
    let mut out = Vec::new();
    for (k, v) in a {
        match b.get(k) {
            None => out.push(format!("{k} deleted")),
            Some(w) if w != v => out.push(format!("{k} {v} -> {w}")),
            _ => {}
        }
    }
    for k in b.keys().filter(|k| !a.contains_key(*k)) {
        out.push(format!("{k} created"));
    }
    out.join(", ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a throwaway cluster: RBAC_RULES_E2E_KUBECONFIG=<file> cargo test --test e2e -- --ignored --test-threads=1"]
async fn controller_end_to_end() {
    let Some(path) = std::env::var_os(KUBECONFIG_VAR).filter(|p| !p.is_empty()) else {
        panic!(
            "{KUBECONFIG_VAR} not set: a throwaway cluster's admin kubeconfig (see the header of tests/e2e.rs)"
        );
    };
    let kubeconfig = Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("{KUBECONFIG_VAR}={}: {e}", path.to_string_lossy()));
    let config = Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
        .await
        .expect("a client configuration from the kubeconfig");
    let client = Client::try_from(config).expect("a client");
    let version = client
        .apiserver_version()
        .await
        .expect("API server version");
    eprintln!(
        "API server {}.{} ({})",
        version.major, version.minor, version.git_version
    );

    let sfx = suffix();
    let ctx = Ctx {
        client,
        dir: tempfile::tempdir().expect("temp dir"),
        ns: format!("rbac-rules-e2e-{sfx}"),
        claims_ns: format!("rbac-rules-e2e-{sfx}-claims"),
        group: format!("e2e-{sfx}.example.org"),
        xrd: format!("widgets.e2e-{sfx}.example.org"),
        pr: format!("provider-e2e-{sfx}-0a1b2c3d"),
        pr_group: format!("provider-e2e-{sfx}.example.org"),
        user: format!("e2e-user-{sfx}"),
        created: Mutex::new(Vec::new()),
    };
    eprintln!("run {sfx}: namespaces {} and {}", ctx.ns, ctx.claims_ns);

    let mut controller: Option<Controller> = None;
    let result = AssertUnwindSafe(scenario(&ctx, &kubeconfig, &mut controller))
        .catch_unwind()
        .await;
    if let Some(c) = controller.as_mut() {
        if result.is_err() {
            eprintln!("{}", c.log_tail());
        }
        c.stop();
    }
    cleanup(&ctx).await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// Deletes what this run created, newest first; reports, never fails.
async fn cleanup(ctx: &Ctx) {
    let created = std::mem::take(&mut *ctx.created.lock().expect("lock"));
    for c in created.iter().rev() {
        let api = ctx.api(&c.ar, c.namespace.as_deref());
        match api.delete(&c.name, &DeleteParams::background()).await {
            Ok(_) => eprintln!("cleanup: deleted {} {}", c.ar.kind, c.name),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => eprintln!("cleanup: cannot delete {} {}: {e}", c.ar.kind, c.name),
        }
    }
}

async fn scenario(ctx: &Ctx, kubeconfig: &Kubeconfig, controller: &mut Option<Controller>) {
    install(ctx).await;
    let sa_kubeconfig = controller_identity(ctx, kubeconfig).await;
    install_fence(ctx).await;
    *controller = Some(Controller::start(
        &sa_kubeconfig,
        ctx.dir.path().join("controller-1.log"),
        &ctx.ns,
    ));
    controller.as_mut().expect("controller").wait_ready().await;

    fence_refuses(ctx, &sa_kubeconfig).await;
    fence_protects(ctx, &sa_kubeconfig).await;
    static_outputs(ctx).await;
    let xrd_uid = xrd(ctx).await;
    let (pr_uid, deployment) = provider_revision(ctx).await;
    namespace_and_claims(ctx).await;
    forged_role_is_left_alone(ctx).await;
    edit_is_reverted(ctx).await;
    no_forbidden(controller.as_ref().expect("controller")).await;
    restart_writes_nothing(ctx, controller, &sa_kubeconfig).await;
    deletions(ctx, &xrd_uid, &pr_uid, &deployment).await;
    no_forbidden(controller.as_ref().expect("controller")).await;
}

/// CRDs (ours and the stand-ins), the built-in rules, the controller's
/// ClusterRoles from deploy/, and this run's namespaces.
async fn install(ctx: &Ctx) {
    // The provider's Deployment lives in this run's namespace: Crossplane
    // in a namespace other than crossplane-system, one setting
    // (`Controller::start`), the rules as shipped.
    install_crds_and_rules(&ctx.client, MANAGER).await;

    for ns in [&ctx.ns, &ctx.claims_ns] {
        ctx.create(
            &ns_ar(),
            None,
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": ns, "labels": {"rbacrules.io/e2e": "true"}}}),
        )
        .await;
    }
}

/// Binds deploy/'s ClusterRole to a ServiceAccount of this run and writes a
/// kubeconfig that impersonates it: the controller gets exactly the
/// permissions of an installation from deploy/.
async fn controller_identity(ctx: &Ctx, kubeconfig: &Kubeconfig) -> PathBuf {
    let rbac = read_yaml("deploy/controller/rbac.yaml");
    let cluster_roles: Vec<&Value> = rbac.iter().filter(|o| o["kind"] == "ClusterRole").collect();
    for cr in &cluster_roles {
        ctx.apply(&cr_ar(), None, cr).await;
    }
    let bound = rbac
        .iter()
        .find(|o| o["kind"] == "ClusterRoleBinding")
        .and_then(|b| b["roleRef"]["name"].as_str())
        .expect("deploy/controller/rbac.yaml binds a ClusterRole")
        .to_string();
    ctx.create(
        &crb_ar(),
        None,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": ctx.ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": bound},
            "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER_SA, "namespace": ctx.ns}],
        }),
    )
    .await;
    // The aggregation controller fills the bound role from the labelled ones.
    let wanted: Vec<PolicyRule> = cluster_roles
        .iter()
        .filter(|cr| cr["aggregationRule"].is_null())
        .flat_map(|cr| rules_of(cr))
        .collect();
    eventually(
        format!("ClusterRole {bound} to be aggregated (is kube-controller-manager's clusterrole-aggregation controller running?)"),
        async || covers(&ctx.must_get(&cr_ar(), None, &bound).await?, &wanted),
    )
    .await;
    let user = ctx.controller_user();
    let groups = [
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{}", ctx.ns),
        "system:authenticated".to_string(),
    ];
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    eventually(
        "the controller's ServiceAccount to be authorized",
        async || {
            if ctx
                .may(
                    &user,
                    &groups,
                    None,
                    "list",
                    "pkg.crossplane.io",
                    "providerrevisions",
                )
                .await?
            {
                Ok(())
            } else {
                Err("not yet allowed".into())
            }
        },
    )
    .await;

    let path = ctx.dir.path().join("controller.kubeconfig");
    write_impersonating(kubeconfig, &user, &path);

    // Check that it really acts as the ServiceAccount.
    let sa_client = Client::try_from(
        Config::from_custom_kubeconfig(
            Kubeconfig::read_from(&path).expect("read the controller's kubeconfig"),
            &KubeConfigOptions::default(),
        )
        .await
        .expect("config"),
    )
    .expect("client");
    let review = Api::<SelfSubjectReview>::all(sa_client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview as the controller");
    let seen = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username);
    assert_eq!(seen.as_deref(), Some(user.as_str()), "impersonation");
    path
}

fn vap_ar() -> ApiResource {
    ar(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
    )
}

fn vap_binding_ar() -> ApiResource {
    ar(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
    )
}

/// deploy/admission.yaml, named for this run: it matches the ServiceAccount
/// `rbac-rules` in any namespace, so this run's controller (in this run's
/// namespace) is fenced as installed, with no edit. Every write of the
/// controller in the steps that follow passes the fence on a real API
/// server.
async fn install_fence(ctx: &Ctx) {
    let name = fence_name(ctx);
    for mut doc in read_yaml("deploy/admission.yaml") {
        doc["metadata"]["name"] = json!(name);
        if doc["kind"] == "ValidatingAdmissionPolicy" {
            ctx.create(&vap_ar(), None, doc).await;
        } else {
            doc["spec"]["policyName"] = json!(name);
            ctx.create(&vap_binding_ar(), None, doc).await;
        }
    }
}

fn fence_name(ctx: &Ctx) -> String {
    format!("rbac-rules-fence-{}", ctx.ns)
}

/// A client acting as the controller's ServiceAccount.
async fn controller_client(sa_kubeconfig: &Path) -> Client {
    Client::try_from(
        Config::from_custom_kubeconfig(
            Kubeconfig::read_from(sa_kubeconfig).expect("the controller's kubeconfig"),
            &KubeConfigOptions::default(),
        )
        .await
        .expect("config"),
    )
    .expect("client")
}

/// As the controller's ServiceAccount (which RBAC allows to create and
/// bind any role), writes the fence must refuse: an unlabelled ClusterRole
/// and a labelled binding to cluster-admin.
async fn fence_refuses(ctx: &Ctx, sa_kubeconfig: &Path) {
    let client = controller_client(sa_kubeconfig).await;
    let probe = format!("{}-fence-probe", ctx.ns);
    let cases = [
        (
            cr_ar(),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": probe}, "rules": []}),
            "app.kubernetes.io/managed-by=rbac-rules",
        ),
        (
            crb_ar(),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": probe, "labels": {"app.kubernetes.io/managed-by": "rbac-rules"}},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": ctx.user}]}),
            "cluster-admin",
        ),
    ];
    for (ar, obj, needle) in cases {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let obj: DynamicObject = serde_json::from_value(obj).expect("object");
        // The policy takes effect a moment after it is created.
        eventually(
            format!("the fence to refuse {} {probe}", ar.kind),
            async || match api.create(&PostParams::default(), &obj).await {
                Ok(_) => {
                    let _ = api.delete(&probe, &DeleteParams::default()).await;
                    Err("admitted".into())
                }
                Err(kube::Error::Api(s)) if s.message.contains(needle) => Ok(()),
                Err(e) => Err(format!("refused, but not by the fence: {e}")),
            },
        )
        .await;
    }
}

/// As the controller's ServiceAccount, which RBAC allows to patch, escalate
/// and delete any ClusterRole: rewriting (server-side apply with the
/// controller's label and benign rules, or a patch adding the label only)
/// and deleting `cluster-admin` or an unlabelled ClusterRole someone else
/// made are refused by the fence, and both stay as they were.
/// `cluster-admin` is tried with dryRun (admission runs all the same), so a
/// fence that failed would not break the cluster.
async fn fence_protects(ctx: &Ctx, sa_kubeconfig: &Path) {
    let client = controller_client(sa_kubeconfig).await;
    let user = ctx.controller_user();
    let groups = ["system:serviceaccounts", "system:authenticated"];
    for verb in ["patch", "delete", "escalate"] {
        assert!(
            ctx.may(
                &user,
                &groups,
                None,
                verb,
                "rbac.authorization.k8s.io",
                "clusterroles"
            )
            .await
            .expect("SubjectAccessReview"),
            "RBAC lets the controller {verb} ClusterRoles: only the fence stands in the way"
        );
    }
    let theirs = format!("{}-theirs", ctx.ns);
    ctx.create(
        &cr_ar(),
        None,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": theirs},
               "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}),
    )
    .await;
    let fence = fence_name(ctx);
    let api: Api<DynamicObject> = Api::all_with(client, &cr_ar());
    for (name, dry_run) in [(theirs.as_str(), false), ("cluster-admin", true)] {
        let before = ctx.must_get(&cr_ar(), None, name).await.expect("the role");
        let fenced = |what: &str, r: Result<String, kube::Error>| match r {
            Ok(out) => panic!("the controller's identity may {what} ClusterRole {name}: {out}"),
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(&fence) => {}
            Err(e) => panic!("{what} ClusterRole {name}: refused, but not by the fence: {e}"),
        };
        let rewrite = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "rbac-rules"}},
            "rules": [{"apiGroups": ["example.org"], "resources": ["widgets"], "verbs": ["get"]}]});
        let mut apply = PatchParams::apply("rbac-rules").force();
        apply.dry_run = dry_run;
        fenced(
            "rewrite",
            api.patch(name, &apply, &Patch::Apply(&rewrite))
                .await
                .map(|o| format!("{:?}", o.metadata.labels)),
        );
        let label_only = PatchParams {
            dry_run,
            ..PatchParams::default()
        };
        fenced(
            "label",
            api.patch(
                name,
                &label_only,
                &Patch::Merge(
                    json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": "rbac-rules"}}}),
                ),
            )
            .await
            .map(|o| format!("{:?}", o.metadata.labels)),
        );
        let delete = DeleteParams {
            dry_run,
            ..DeleteParams::default()
        };
        fenced(
            "delete",
            api.delete(name, &delete)
                .await
                .map(|_| "deleted".to_string()),
        );
        let after = ctx.must_get(&cr_ar(), None, name).await.expect("the role");
        assert_eq!(
            (
                &before["metadata"]["uid"],
                &before["metadata"]["resourceVersion"]
            ),
            (
                &after["metadata"]["uid"],
                &after["metadata"]["resourceVersion"]
            ),
            "ClusterRole {name} changed"
        );
    }
}

/// Writes `kubeconfig` to `path` with its current user acting as `user`
/// (`as:`): same server and credentials, the impersonated user's
/// permissions. Paths in it are absolute already (`Kubeconfig::read_from`).
fn write_impersonating(kubeconfig: &Kubeconfig, user: &str, path: &Path) {
    let mut kc = kubeconfig.clone();
    let context_name = kc
        .current_context
        .clone()
        .expect("the kubeconfig has a current-context");
    let user_name = kc
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.clone())
        .expect("the current context names a user");
    let auth = kc
        .auth_infos
        .iter_mut()
        .find(|a| a.name == user_name)
        .and_then(|a| a.auth_info.as_mut())
        .expect("the current context's user");
    auth.impersonate = Some(user.to_string());
    // A ServiceAccount's groups follow from its name.
    auth.impersonate_groups = None;
    auth.impersonate_uid = None;
    auth.impersonate_user_extra = None;
    std::fs::write(
        path,
        rbac_rules::yaml::to_yaml(&kc).expect("kubeconfig as YAML"),
    )
    .expect("write the controller's kubeconfig");
}

async fn rule_ready(ctx: &Ctx, name: &str) -> Result<RbacRule, String> {
    let r = Api::<RbacRule>::all(ctx.client.clone())
        .get(name)
        .await
        .map_err(|e| format!("get RbacRule {name}: {e}"))?;
    let conditions = r
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let cond = |t: &str| conditions.iter().find(|c| c.type_ == t);
    match (cond("Ready"), cond("Degraded")) {
        (Some(ready), Some(degraded)) if ready.status == "True" && degraded.status == "False" => {
            Ok(r)
        }
        _ => Err(format!(
            "RbacRule {name} not Ready: {}",
            serde_json::to_string(&conditions).unwrap_or_default()
        )),
    }
}

async fn static_outputs(ctx: &Ctx) {
    for (name, rule) in [
        // The chart owns `crossplane`; the rules aggregate under their own name.
        ("crossplane:rbac-rules", "crossplane-serviceaccount"),
        (
            "crossplane:system:aggregate-to-crossplane",
            "crossplane-core",
        ),
        ("crossplane-admin", "crossplane-user-roles"),
        ("crossplane-edit", "crossplane-user-roles"),
        ("crossplane-view", "crossplane-user-roles"),
        ("crossplane-browse", "crossplane-user-roles"),
        (
            "crossplane:aggregate-to-ns-edit",
            "crossplane-namespace-base",
        ),
    ] {
        eventually(format!("ClusterRole {name}"), async || {
            check_generated(&ctx.must_get(&cr_ar(), None, name).await?, rule, None)
        })
        .await;
    }
    eventually("ClusterRoleBinding crossplane-admin", async || {
        check_generated(
            &ctx.must_get(&crb_ar(), None, "crossplane-admin").await?,
            "crossplane-user-roles",
            None,
        )
    })
    .await;
    // Every rule reads kinds the controller may list: all turn Ready (a
    // forbidden list would hold a rule as Degraded/WatchFailed).
    for file in rule_files() {
        for doc in read_yaml(&file) {
            let name = doc["metadata"]["name"].as_str().expect("name").to_string();
            eventually(format!("RbacRule {name} Ready"), async || {
                rule_ready(ctx, &name).await.map(|_| ())
            })
            .await;
        }
    }
}

/// An XRD offering a claim: four ClusterRoles, aggregated into the
/// user-facing roles, and an Event on the rule. Returns the XRD's uid.
async fn xrd(ctx: &Ctx) -> String {
    let xrd = ctx
        .create(
            &xrd_ar(),
            None,
            json!({
                "apiVersion": "apiextensions.crossplane.io/v1",
                "kind": "CompositeResourceDefinition",
                "metadata": {"name": ctx.xrd},
                "spec": {
                    "group": ctx.group,
                    "names": {"kind": "Widget", "plural": "widgets"},
                    "claimNames": {"kind": "WidgetClaim", "plural": "widgetclaims"},
                    "versions": [{"name": "v1alpha1", "served": true, "referenceable": true}],
                },
            }),
        )
        .await;
    let uid = xrd["metadata"]["uid"].as_str().expect("uid").to_string();
    // The CRDs Crossplane's XRD controller makes, controlled by the XRD.
    let types = [
        TypeDef {
            kind: "Widget",
            plural: "widgets",
            namespaced: false,
        },
        TypeDef {
            kind: "WidgetClaim",
            plural: "widgetclaims",
            namespaced: true,
        },
    ];
    for crd in lineage_crds(&ctx.client, MANAGER, &xrd, &ctx.group, &types, true).await {
        ctx.remember(
            crd_ar(),
            None,
            crd["metadata"]["name"].as_str().expect("name"),
        );
    }
    let g = ctx.group.as_str();
    let all = ["*"];
    let read = ["get", "list", "watch"];
    for (suffix, rule, wanted) in [
        (
            "aggregate-to-crossplane",
            "crossplane-composite-system",
            vec![
                rule(&[g], &["widgets", "widgets/status", "widgetclaims"], &all),
                rule(
                    &[g],
                    &["widgets/finalizers", "widgetclaims/finalizers"],
                    &["update"],
                ),
            ],
        ),
        (
            "aggregate-to-edit",
            "crossplane-composite-users",
            vec![rule(
                &[g],
                &["widgets", "widgetclaims", "widgetclaims/status"],
                &all,
            )],
        ),
        (
            "aggregate-to-view",
            "crossplane-composite-users",
            vec![rule(&[g], &["widgets", "widgetclaims"], &read)],
        ),
        (
            "aggregate-to-browse",
            "crossplane-composite-users",
            vec![rule(&[g], &["widgets"], &read)],
        ),
    ] {
        let name = format!("crossplane:composite:{}:{suffix}", ctx.xrd);
        eventually(format!("ClusterRole {name}"), async || {
            let o = ctx.must_get(&cr_ar(), None, &name).await?;
            check_generated(&o, rule, Some(&uid))?;
            covers(&o, &wanted)
        })
        .await;
    }
    // Browsers never see claims.
    let browse = ctx
        .must_get(
            &cr_ar(),
            None,
            &format!("crossplane:composite:{}:aggregate-to-browse", ctx.xrd),
        )
        .await
        .expect("browse role");
    assert!(
        covers(&browse, &[rule(&[g], &["widgetclaims"], &["get"])]).is_err(),
        "the browse role grants claims: {browse}"
    );
    // Native aggregation picks the roles up by their labels.
    eventually(
        "crossplane-edit to aggregate the XRD's edit role",
        async || {
            covers(
                &ctx.must_get(&cr_ar(), None, "crossplane-edit").await?,
                &[rule(&[g], &["widgetclaims"], &["create"])],
            )
        },
    )
    .await;
    eventually(
        "crossplane:rbac-rules to aggregate the XRD's system role",
        async || {
            covers(
                &ctx.must_get(&cr_ar(), None, "crossplane:rbac-rules")
                    .await?,
                &[rule(&[g], &["widgets"], &["update"])],
            )
        },
    )
    .await;
    // Status and Events on the rule.
    eventually("crossplane-composite-users to count the XRD", async || {
        let r = rule_ready(ctx, "crossplane-composite-users").await?;
        let s = r.status.unwrap_or_default();
        if s.matched_triggers >= 1 && s.managed_objects >= 3 {
            Ok(())
        } else {
            Err(format!("status {s:?}"))
        }
    })
    .await;
    let events: Api<Event> = Api::namespaced(ctx.client.clone(), "default");
    eventually(
        "an Applied Event on RbacRule crossplane-composite-users",
        async || {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| format!("list events: {e}"))?;
            let found = list.items.iter().any(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("RbacRule")
                        && r.name.as_deref() == Some("crossplane-composite-users")
                }) && e.reason.as_deref() == Some("Applied")
                    && e.note.as_deref().is_some_and(|n| n.contains(&ctx.xrd))
            });
            if found {
                Ok(())
            } else {
                Err("no such Event yet".into())
            }
        },
    )
    .await;
    uid
}

/// A ProviderRevision with two CRDs in its status and a Deployment it
/// controls. Returns its uid and the Deployment's name.
async fn provider_revision(ctx: &Ctx) -> (String, String) {
    // Its Provider, the revision's controller, made first: the built-in
    // rules believe only CRDs no older than it.
    let provider = ctx
        .create(
            &provider_ar(),
            None,
            json!({
                "apiVersion": "pkg.crossplane.io/v1",
                "kind": "Provider",
                "metadata": {"name": ctx.pr},
                "spec": {"package": "xpkg.example.org/e2e/provider-e2e:v0.1.0"},
            }),
        )
        .await;
    let pr = ctx
        .create(
            &pr_ar(),
            None,
            json!({
                "apiVersion": "pkg.crossplane.io/v1",
                "kind": "ProviderRevision",
                "metadata": {"name": ctx.pr, "labels": {"pkg.crossplane.io/package": "provider-e2e"},
                             "ownerReferences": [{
                                 "apiVersion": "pkg.crossplane.io/v1", "kind": "Provider",
                                 "name": ctx.pr, "uid": provider["metadata"]["uid"],
                                 "controller": true, "blockOwnerDeletion": true}]},
                "spec": {
                    "image": "xpkg.example.org/e2e/provider-e2e:v0.1.0",
                    "desiredState": "Active",
                    "revision": 1,
                },
            }),
        )
        .await;
    let uid = pr["metadata"]["uid"].as_str().expect("uid").to_string();
    // status is a subresource: written separately, as Crossplane does.
    let crd = |plural: &str| {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "name": format!("{plural}.{}", ctx.pr_group)})
    };
    ctx.api(&pr_ar(), None)
        .patch_status(
            &ctx.pr,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"objectRefs": [crd("gadgets"), crd("providerconfigs")]}}),
            ),
        )
        .await
        .expect("patch the ProviderRevision's status");
    // The CRDs Crossplane's package manager installs, owned by the active
    // revision.
    let types = [
        TypeDef {
            kind: "Gadget",
            plural: "gadgets",
            namespaced: false,
        },
        TypeDef {
            kind: "ProviderConfig",
            plural: "providerconfigs",
            namespaced: false,
        },
    ];
    for crd in lineage_crds(&ctx.client, MANAGER, &pr, &ctx.pr_group, &types, true).await {
        ctx.remember(
            crd_ar(),
            None,
            crd["metadata"]["name"].as_str().expect("name"),
        );
    }
    let deployment = format!("provider-e2e-{}", ctx.pr);
    let labels = json!({"app": "provider-e2e"});
    ctx.create(
        &deploy_ar(),
        Some(&ctx.ns),
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": deployment,
                "namespace": ctx.ns,
                "ownerReferences": [{
                    "apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
                    "name": ctx.pr, "uid": uid, "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "provider-e2e",
                        "containers": [{"name": "provider", "image": "xpkg.example.org/e2e/provider-e2e:v0.1.0"}],
                    },
                },
            },
        }),
    )
    .await;

    let g = ctx.pr_group.as_str();
    let types = [
        "gadgets",
        "gadgets/status",
        "providerconfigs",
        "providerconfigs/status",
    ];
    for (suffix, rule, wanted) in [
        (
            "aggregate-to-edit",
            "crossplane-provider-system",
            vec![rule(&[g], &types, &["*"])],
        ),
        (
            "system",
            "crossplane-provider-system",
            vec![
                rule(
                    &[g],
                    &types,
                    &["get", "list", "watch", "update", "patch", "create"],
                ),
                rule(&[g], &["gadgets/finalizers"], &["update"]),
            ],
        ),
        (
            "aggregate-to-view",
            "crossplane-provider-users",
            vec![rule(&[g], &types, &["get", "list", "watch"])],
        ),
    ] {
        let name = format!("crossplane:provider:{}:{suffix}", ctx.pr);
        eventually(format!("ClusterRole {name}"), async || {
            let o = ctx.must_get(&cr_ar(), None, &name).await?;
            check_generated(&o, rule, Some(&uid))?;
            covers(&o, &wanted)
        })
        .await;
    }
    let binding = format!("crossplane:provider:{}:system", ctx.pr);
    eventually(
        format!("ClusterRoleBinding {binding} to the provider's ServiceAccount"),
        async || {
            let b = ctx.must_get(&crb_ar(), None, &binding).await?;
            check_generated(&b, "crossplane-provider-system", Some(&uid))?;
            if b["roleRef"]["name"] != binding.as_str() {
                return Err(format!("roleRef {}", b["roleRef"]));
            }
            // Exactly the Deployment's ServiceAccount (apiGroup "" may be
            // omitted on the way back).
            let subjects: Vec<(&Value, &Value, &Value)> = b["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| (&s["kind"], &s["name"], &s["namespace"]))
                .collect();
            let want = (
                &json!("ServiceAccount"),
                &json!("provider-e2e"),
                &json!(ctx.ns),
            );
            if subjects == [want] {
                Ok(())
            } else {
                Err(format!("subjects {}", b["subjects"]))
            }
        },
    )
    .await;
    (uid, deployment)
}

/// An annotated Namespace gets Roles; a user bound to one may create
/// claims there only.
async fn namespace_and_claims(ctx: &Ctx) {
    ctx.api(&ns_ar(), None)
        .patch(
            &ctx.claims_ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                format!("rbac.crossplane.io/{}", ctx.xrd): XRD_ANNOTATION_VALUE,
            }}})),
        )
        .await
        .expect("annotate the claims namespace");
    let ns_uid = ctx
        .must_get(&ns_ar(), None, &ctx.claims_ns)
        .await
        .expect("claims namespace")["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    let g = ctx.group.as_str();
    for (name, wanted) in [
        (
            "crossplane-admin",
            vec![
                rule(&[g], &["widgetclaims"], &["*"]),
                rule(&["rbac.authorization.k8s.io"], &["rolebindings"], &["*"]),
            ],
        ),
        (
            "crossplane-edit",
            vec![
                rule(&[g], &["widgetclaims"], &["*"]),
                rule(&[""], &["secrets"], &["*"]),
            ],
        ),
        (
            "crossplane-view",
            vec![rule(&[g], &["widgetclaims"], &["get", "list", "watch"])],
        ),
    ] {
        eventually(format!("Role {}/{name}", ctx.claims_ns), async || {
            let o = ctx.must_get(&role_ar(), Some(&ctx.claims_ns), name).await?;
            check_generated(&o, "crossplane-namespace", Some(&ns_uid))?;
            covers(&o, &wanted)
        })
        .await;
    }

    ctx.create(
        &rb_ar(),
        Some(&ctx.claims_ns),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "e2e-claimer", "namespace": ctx.claims_ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "crossplane-edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": ctx.user}],
        }),
    )
    .await;
    let user = ctx.user.as_str();
    let authenticated = ["system:authenticated"];
    eventually(
        format!(
            "{user} to be allowed to create widgetclaims in {}",
            ctx.claims_ns
        ),
        async || match ctx
            .may(
                user,
                &authenticated,
                Some(&ctx.claims_ns),
                "create",
                g,
                "widgetclaims",
            )
            .await?
        {
            true => Ok(()),
            false => Err("denied".into()),
        },
    )
    .await;
    for ns in [Some(ctx.ns.as_str()), Some("default"), None] {
        let allowed = ctx
            .may(user, &authenticated, ns, "create", g, "widgetclaims")
            .await
            .expect("SubjectAccessReview");
        assert!(
            !allowed,
            "{user} may create widgetclaims in {}",
            ns.unwrap_or("every namespace")
        );
    }
}

/// A Role a namespace admin labels as the controller's, naming one of its
/// rules and triggers (created with a plain POST: its managedFields hold no
/// Apply entry of the field manager rbac-rules) is never pruned nor
/// written, and the rule it names reports it (`NotOurs`); deleted, the
/// rule is Ready again.
async fn forged_role_is_left_alone(ctx: &Ctx) {
    let ns = ctx.claims_ns.as_str();
    let name = "e2e-forged";
    let created = ctx
        .create(
            &role_ar(),
            Some(ns),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": name, "namespace": ns,
                    "labels": {"app.kubernetes.io/managed-by": "rbac-rules",
                               "rbacrules.io/rule": "crossplane-namespace"},
                    "annotations": {"rbacrules.io/rule": "crossplane-namespace",
                                    "rbacrules.io/trigger": format!("Namespace/{ns}")}},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}),
        )
        .await;
    let rv = created["metadata"]["resourceVersion"].clone();
    eventually(
        format!("RbacRule crossplane-namespace to report Role {ns}/{name}"),
        async || {
            let r = Api::<RbacRule>::all(ctx.client.clone())
                .get("crossplane-namespace")
                .await
                .map_err(|e| e.to_string())?;
            let conditions = r.status.map(|s| s.conditions).unwrap_or_default();
            match conditions.iter().find(|c| c.type_ == "Degraded") {
                Some(c) if c.message.contains(&format!("Role {ns}/{name}")) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let now = ctx
        .must_get(&role_ar(), Some(ns), name)
        .await
        .expect("the forged Role is left in place");
    assert_eq!(now["metadata"]["resourceVersion"], rv, "written: {now}");
    ctx.api(&role_ar(), Some(ns))
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete the forged Role");
    eventually("RbacRule crossplane-namespace Ready again", async || {
        rule_ready(ctx, "crossplane-namespace").await.map(|_| ())
    })
    .await;
}

/// A hand edit of a generated ClusterRole is reverted.
async fn edit_is_reverted(ctx: &Ctx) {
    let name = format!("crossplane:composite:{}:aggregate-to-view", ctx.xrd);
    let label = "rbac.crossplane.io/aggregate-to-view";
    let before = ctx
        .must_get(&cr_ar(), None, &name)
        .await
        .expect("view role");
    let edited = ctx
        .api(&cr_ar(), None)
        .patch(
            &name,
            &PatchParams {
                field_manager: Some("rbac-rules-e2e-editor".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({
                "metadata": {"labels": {label: "false"}},
                "rules": [{"apiGroups": [ctx.group], "resources": ["widgets"], "verbs": ["get"]}],
            })),
        )
        .await
        .expect("edit the generated role");
    let edited = serde_json::to_value(edited).expect("json");
    assert_ne!(edited["rules"], before["rules"], "the edit took");
    eventually(format!("ClusterRole {name} to be restored"), async || {
        let now = ctx.must_get(&cr_ar(), None, &name).await?;
        if now["rules"] == before["rules"] && now["metadata"]["labels"][label] == "true" {
            Ok(())
        } else {
            Err(format!(
                "rules {} label {}",
                now["rules"], now["metadata"]["labels"][label]
            ))
        }
    })
    .await;
}

/// No API request of the controller was refused: the RBAC in deploy/
/// suffices (a refused list shows as a Degraded rule instead, checked by
/// [`rule_ready`]).
async fn no_forbidden(controller: &Controller) {
    let metrics = controller.metrics().await;
    let forbidden: Vec<&str> = metric_lines(&metrics, "rbac_rules_reconcile_errors_total")
        .into_iter()
        .filter(|l| l.contains("reason=\"api_forbidden\""))
        .collect();
    assert!(
        metric_sum(&forbidden.join("\n"), "rbac_rules_reconcile_errors_total") == 0.0,
        "the controller was refused: {forbidden:?}"
    );
}

/// A restarted controller finds everything in place and writes nothing.
async fn restart_writes_nothing(ctx: &Ctx, controller: &mut Option<Controller>, kubeconfig: &Path) {
    let before = ctx.settled_versions().await;
    if let Some(mut c) = controller.take() {
        c.stop();
    }
    let mut c = Controller::start(kubeconfig, ctx.dir.path().join("controller-2.log"), &ctx.ns);
    c.wait_ready().await;
    eventually("the restarted controller's first reconcile", async || {
        let m = c.metrics().await;
        if metric_sum(&m, "rbac_rules_reconciles_total") >= 1.0 {
            Ok(())
        } else {
            Err("no reconcile yet".into())
        }
    })
    .await;
    // Let the reconcile finish its writes and status updates, if any.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let metrics = c.metrics().await;
    *controller = Some(c);
    let writes = metric_sum(&metrics, "rbac_rules_api_writes_total");
    assert!(
        writes == 0.0,
        "the restarted controller wrote: {:?}",
        metric_lines(&metrics, "rbac_rules_api_writes_total")
    );
    let after = ctx.versions().await;
    assert!(
        before == after,
        "objects changed across the restart: {}",
        diff(&before, &after)
    );
}

/// Deleting triggers removes what they produced.
async fn deletions(ctx: &Ctx, xrd_uid: &str, pr_uid: &str, deployment: &str) {
    let g = ctx.group.as_str();
    // The XRD: its roles go (garbage collection or prune) and the
    // namespace Role stops granting its claims.
    ctx.delete(&xrd_ar(), None, &ctx.xrd).await;
    for suffix in [
        "aggregate-to-crossplane",
        "aggregate-to-edit",
        "aggregate-to-view",
        "aggregate-to-browse",
    ] {
        ctx.wait_gone(
            &cr_ar(),
            None,
            &format!("crossplane:composite:{}:{suffix}", ctx.xrd),
        )
        .await;
    }
    let user = ctx.user.as_str();
    eventually(
        format!(
            "{user} to lose widgetclaims in {} ({xrd_uid} deleted)",
            ctx.claims_ns
        ),
        async || match ctx
            .may(
                user,
                &["system:authenticated"],
                Some(&ctx.claims_ns),
                "create",
                g,
                "widgetclaims",
            )
            .await?
        {
            false => Ok(()),
            true => Err("still allowed".into()),
        },
    )
    .await;

    // The Namespace stops accepting claims: the controller prunes the Roles
    // (the Namespace lives on, so no garbage collection here).
    ctx.api(&ns_ar(), None)
        .patch(
            &ctx.claims_ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                format!("rbac.crossplane.io/{}", ctx.xrd): null,
            }}})),
        )
        .await
        .expect("remove the namespace's annotation");
    for name in ["crossplane-admin", "crossplane-edit", "crossplane-view"] {
        ctx.wait_gone(&role_ar(), Some(&ctx.claims_ns), name).await;
    }

    // The ProviderRevision: its roles, its binding and its Deployment go.
    ctx.delete(&pr_ar(), None, &ctx.pr).await;
    for suffix in ["aggregate-to-edit", "system", "aggregate-to-view"] {
        ctx.wait_gone(
            &cr_ar(),
            None,
            &format!("crossplane:provider:{}:{suffix}", ctx.pr),
        )
        .await;
    }
    ctx.wait_gone(
        &crb_ar(),
        None,
        &format!("crossplane:provider:{}:system", ctx.pr),
    )
    .await;
    ctx.wait_gone(&deploy_ar(), Some(&ctx.ns), deployment).await;
    eprintln!(
        "deleted XRD {xrd_uid} and ProviderRevision {pr_uid}: everything they produced is gone"
    );
}

// Parts of the harness that need no cluster: run by plain `cargo test`.

#[tokio::test]
async fn impersonating_kubeconfig_keeps_server_and_credentials() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("ca.crt"), "not a real CA").expect("write");
    let original = dir.path().join("admin.kubeconfig");
    std::fs::write(
        &original,
        "apiVersion: v1
kind: Config
current-context: admin@e2e
clusters:
- name: e2e
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: ca.crt
contexts:
- name: other
  context: {cluster: e2e, user: other}
- name: admin@e2e
  context: {cluster: e2e, user: admin, namespace: kube-system}
users:
- name: other
  user: {token: other-token}
- name: admin
  user: {token: admin-token}
",
    )
    .expect("write");
    let kc = Kubeconfig::read_from(&original).expect("read");
    let written = dir.path().join("controller.kubeconfig");
    write_impersonating(&kc, "system:serviceaccount:ns:rbac-rules", &written);
    let back = Kubeconfig::read_from(&written).expect("read back");
    let config = Config::from_custom_kubeconfig(back.clone(), &KubeConfigOptions::default())
        .await
        .expect("a usable config");
    assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
    assert_eq!(
        config.auth_info.impersonate.as_deref(),
        Some("system:serviceaccount:ns:rbac-rules")
    );
    assert_eq!(config.default_namespace, "kube-system");
    let user = |name: &str| {
        back.auth_infos
            .iter()
            .find(|a| a.name == name)
            .and_then(|a| a.auth_info.clone())
            .expect("user")
    };
    assert!(user("other").impersonate.is_none(), "other users untouched");
    assert!(user("admin").token.is_some(), "credentials kept");
    let ca = back.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.certificate_authority.clone())
        .expect("CA path");
    assert_eq!(
        Path::new(&ca),
        dir.path().join("ca.crt"),
        "absolute CA path"
    );
}

#[test]
fn metric_parsing() {
    let text = "# HELP rbac_rules_api_writes Writes\n\
                # TYPE rbac_rules_api_writes counter\n\
                rbac_rules_api_writes_total{kind=\"Role\",action=\"apply\"} 2\n\
                rbac_rules_api_writes_total{kind=\"RbacRule\",action=\"status\"} 1\n\
                rbac_rules_api_writes_totalx 7\n\
                rbac_rules_reconciles_total 3\n";
    assert_eq!(metric_sum(text, "rbac_rules_api_writes_total"), 3.0);
    assert_eq!(metric_sum(text, "rbac_rules_reconciles_total"), 3.0);
    assert_eq!(metric_sum(text, "rbac_rules_managed_objects"), 0.0);
}

#[test]
fn fixtures_parse() {
    let stand_ins = read_yaml("tests/e2e/stand-in-crds.yaml");
    let names: Vec<&str> = stand_ins
        .iter()
        .map(|c| c["metadata"]["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        names,
        [
            "providerrevisions.pkg.crossplane.io",
            "compositeresourcedefinitions.apiextensions.crossplane.io",
            "providers.pkg.crossplane.io"
        ]
    );
    for crd in &stand_ins {
        let crd: CustomResourceDefinition =
            serde_json::from_value(crd.clone()).expect("a valid CRD");
        assert_eq!(crd.spec.scope, "Cluster");
        let plural = &crd.spec.names.plural;
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(format!("{plural}.{}", crd.spec.group).as_str())
        );
    }
    // The kinds the built-in rules trigger on are the stand-ins' kinds (or
    // built in to Kubernetes).
    let served: Vec<(String, String)> = stand_ins
        .iter()
        .map(|c| {
            (
                c["spec"]["group"].as_str().expect("group").to_string(),
                c["spec"]["names"]["kind"]
                    .as_str()
                    .expect("kind")
                    .to_string(),
            )
        })
        .collect();
    for r in rbac_rules::rules::builtin().expect("built-in rules") {
        if let Some(t) = r.spec.trigger
            && !t.api_group.is_empty()
        {
            assert!(
                served.contains(&(t.api_group.clone(), t.kind.clone())),
                "rule {} triggers on {}.{}: add a stand-in CRD",
                r.name,
                t.kind,
                t.api_group
            );
        }
    }
    // deploy/ binds one ClusterRole the test binds too.
    let rbac = read_yaml("deploy/controller/rbac.yaml");
    assert!(rbac.iter().any(|o| o["kind"] == "ClusterRoleBinding"));
}
