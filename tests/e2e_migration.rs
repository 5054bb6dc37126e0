//! End-to-end: the switch from Crossplane's RBAC manager to rbac-rules, as
//! docs/migrating-from-crossplane.md describes it, against a real API
//! server.
//!
//! ```sh
//! RBAC_RULES_E2E_KUBECONFIG=<file> cargo test --test e2e_migration -- --ignored --test-threads=1
//! ```
//!
//! The test is `#[ignore]`d: `cargo test` never runs it; run with
//! `--ignored` but without `RBAC_RULES_E2E_KUBECONFIG`, it fails, saying
//! so. It needs what tests/e2e.rs needs (a throwaway cluster, a
//! cluster-admin kubeconfig, the ClusterRole aggregation controller, no
//! Crossplane, no other rbac-rules controller), and the two must not run
//! at the same time.
//!
//! 1. The cluster as Crossplane's chart v2.3.4 (`rbacManager.deploy=true`)
//!    and its RBAC manager leave it: the chart's RBAC objects
//!    (tests/data/crossplane-chart-v2.3.4.yaml plus ClusterRole and
//!    ClusterRoleBinding `crossplane`) with Helm's labels and annotations,
//!    Crossplane's and the manager's Deployments, an XRD and the four roles
//!    the manager made for it, a ProviderRevision with its Deployment and
//!    the three roles and system binding the manager made for it (each with
//!    a controller ownerReference to its owner, no rbac-rules provenance;
//!    the binding names the provider's ServiceAccount in the run's
//!    namespace, as the manager binds a revision's Deployment wherever it
//!    runs), the CRDs Crossplane made for the XRD and the revision (with
//!    ownerReferences to them: the rules' proof of lineage),
//!    an editor and a viewer bound to
//!    `crossplane-edit` and `crossplane-view`; the built-in RbacRules
//!    installed, no controller running.
//! 2. `rbac-rules diff` shows the adoptions and the conflicts (exit 1).
//! 3. The manager is scaled to 0, `rbac-rules run --adopt-existing` starts
//!    and adopts everything in place (same uids, Helm objects get
//!    `helm.sh/resource-policy: keep`).
//! 4. The chart switch to `deploy=false`, done as Helm does it: the
//!    manager's Deployment deleted, every chart object not marked keep
//!    deleted (none may be), ClusterRole `crossplane` replaced by the plain
//!    base role.
//! 5. `rbac-rules diff` exits 0.
//!
//! From step 1 to the end a background probe asks SubjectAccessReviews for
//! an admin (group `crossplane:masters`), the editor, the viewer,
//! Crossplane's ServiceAccount and the provider's, and records every answer that differs from
//! what they had before the switch.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use rbac_rules::api::ManageLevel;
use rbac_rules::render::{RenderArgs, render};
use serde_json::{Value, json};

mod support;
use support::e2e::*;

const KUBECONFIG_VAR: &str = "RBAC_RULES_E2E_KUBECONFIG";
/// Field managers standing in for Helm, Crossplane and this test.
const HELM: &str = "helm";
const CROSSPLANE: &str = "crossplane";
const MANAGER: &str = "rbac-rules-e2e";
const KEEP: &str = "helm.sh/resource-policy";

fn api(client: &Client, ar: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    }
}

async fn get(client: &Client, ar: &ApiResource, ns: Option<&str>, name: &str) -> Option<Value> {
    api(client, ar, ns)
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get {} {name}: {e}", ar.kind))
        .map(|o| serde_json::to_value(o).expect("json"))
}

/// Creates an object as `manager` (deleting a leftover of the same name
/// first, so the object starts exactly as given).
async fn create_fresh(
    client: &Client,
    ar: &ApiResource,
    ns: Option<&str>,
    manager: &str,
    obj: &Value,
) -> Value {
    let name = obj["metadata"]["name"].as_str().expect("name").to_string();
    let a = api(client, ar, ns);
    if get(client, ar, ns, &name).await.is_some() {
        let _ = a.delete(&name, &DeleteParams::foreground()).await;
        eventually(&format!("{} {name} to go", ar.kind), async || {
            match get(client, ar, ns, &name).await {
                None => Ok(()),
                Some(_) => Err("still there".into()),
            }
        })
        .await;
    }
    let o: DynamicObject = serde_json::from_value(obj.clone()).expect("object");
    let pp = PostParams {
        field_manager: Some(manager.to_string()),
        ..PostParams::default()
    };
    let out = a
        .create(&pp, &o)
        .await
        .unwrap_or_else(|e| panic!("create {} {name}: {e}", ar.kind));
    serde_json::to_value(out).expect("json")
}

/// One SubjectAccessReview question and the answer it had before the
/// switch.
#[derive(Clone, Debug)]
struct Question {
    who: String,
    groups: Vec<String>,
    namespace: Option<String>,
    verb: &'static str,
    group: String,
    resource: &'static str,
    allowed: bool,
}

async fn ask(client: &Client, q: &Question) -> Result<bool, String> {
    let sar = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(q.who.clone()),
            groups: Some(q.groups.clone()),
            resource_attributes: Some(ResourceAttributes {
                namespace: q.namespace.clone(),
                verb: Some(q.verb.to_string()),
                group: Some(q.group.clone()),
                resource: Some(q.resource.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &sar)
        .await
        .map(|r| r.status.is_some_and(|s| s.allowed))
        .map_err(|e| format!("SubjectAccessReview: {e}"))
}

/// Every question answered as expected, or the first that is not.
async fn access(client: &Client, questions: &[Question]) -> Result<(), String> {
    for q in questions {
        let got = ask(client, q).await?;
        if got != q.allowed {
            return Err(format!(
                "{} {} {}/{} in {:?}: allowed={got}, expected {}",
                q.who, q.verb, q.group, q.resource, q.namespace, q.allowed
            ));
        }
    }
    Ok(())
}

struct Run {
    client: Client,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
    ns: String,
    group: String,
    xrd: String,
    /// The ProviderRevision and the group of its types.
    pr: String,
    pr_group: String,
    editor: String,
    viewer: String,
    /// (kind, namespace, name) of what this run created, deleted at the end.
    created: Mutex<Vec<(ApiResource, Option<String>, String)>>,
}

impl Run {
    fn remember(&self, ar: ApiResource, ns: Option<&str>, name: &str) {
        self.created
            .lock()
            .expect("lock")
            .push((ar, ns.map(str::to_string), name.to_string()));
    }

    fn questions(&self) -> Vec<Question> {
        let q =
            |who: &str, groups: &[&str], ns: Option<&str>, verb, group: &str, resource, allowed| {
                Question {
                    who: who.to_string(),
                    groups: groups.iter().map(|g| g.to_string()).collect(),
                    namespace: ns.map(str::to_string),
                    verb,
                    group: group.to_string(),
                    resource,
                    allowed,
                }
            };
        let (g, ns) = (self.group.as_str(), Some(self.ns.as_str()));
        let admin = format!("e2e-admin-{}", self.ns);
        let sa = format!("system:serviceaccount:{}:crossplane", self.ns);
        let sa_groups = ["system:serviceaccounts"];
        let p = self.pr_group.as_str();
        let provider = format!("system:serviceaccount:{}:provider-mig", self.ns);
        vec![
            q(
                &admin,
                &["crossplane:masters"],
                None,
                "create",
                "apiextensions.crossplane.io",
                "compositions",
                true,
            ),
            q(
                &admin,
                &["crossplane:masters"],
                ns,
                "create",
                "rbac.authorization.k8s.io",
                "rolebindings",
                true,
            ),
            q(
                &admin,
                &["crossplane:masters"],
                None,
                "delete",
                g,
                "widgets",
                true,
            ),
            q(&self.editor, &[], ns, "create", g, "widgetclaims", true),
            q(
                &self.editor,
                &[],
                None,
                "create",
                "apiextensions.crossplane.io",
                "compositions",
                true,
            ),
            q(
                &self.editor,
                &[],
                ns,
                "create",
                "rbac.authorization.k8s.io",
                "rolebindings",
                false,
            ),
            q(&self.viewer, &[], ns, "list", g, "widgetclaims", true),
            q(&self.viewer, &[], ns, "create", g, "widgetclaims", false),
            q(&self.viewer, &[], ns, "get", "", "secrets", false),
            q(&sa, &sa_groups, None, "update", g, "widgets", true),
            q(&sa, &sa_groups, ns, "update", g, "widgetclaims", true),
            q(
                &sa,
                &sa_groups,
                None,
                "create",
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                true,
            ),
            q(&sa, &sa_groups, ns, "create", "", "events", true),
            q(
                &sa,
                &sa_groups,
                None,
                "create",
                "pkg.crossplane.io",
                "providerrevisions",
                true,
            ),
            q(&sa, &sa_groups, None, "update", p, "gadgets", true),
            q(&self.editor, &[], None, "create", p, "gadgets", true),
            q(&self.viewer, &[], None, "list", p, "gadgets", true),
            q(&self.viewer, &[], None, "delete", p, "gadgets", false),
            q(&provider, &sa_groups, None, "update", p, "gadgets", true),
            q(&provider, &sa_groups, None, "delete", p, "gadgets", false),
        ]
    }
}

/// Asks the questions in a loop until stopped; records every wrong answer.
struct Probe {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Probe {
    fn start(client: Client, questions: Vec<Question>) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut wrong = Vec::new();
            let mut rounds = 0u32;
            while !flag.load(Ordering::SeqCst) {
                for q in &questions {
                    match ask(&client, q).await {
                        Ok(a) if a == q.allowed => {}
                        Ok(a) => wrong.push(format!("round {rounds}: {q:?} answered {a}")),
                        Err(e) => wrong.push(format!("round {rounds}: {e}")),
                    }
                }
                rounds += 1;
            }
            eprintln!(
                "access probe: {rounds} rounds of {} questions",
                questions.len()
            );
            wrong
        });
        Probe { stop, task }
    }

    async fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("probe task")
    }
}

/// `rbac-rules diff` with the test's kubeconfig: exit code and stdout.
fn diff(kubeconfig: &Path, adopt: bool) -> (i32, String) {
    let mut cmd = support::cli::rbac_rules();
    cmd.arg("diff");
    if adopt {
        cmd.arg("--adopt-existing");
    }
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("RBAC_RULES_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run rbac-rules diff");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = out.status.code().unwrap_or(-1);
    assert!(
        code == 0 || code == 1,
        "diff failed ({code}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code, stdout)
}

struct Controller(Child);

impl Controller {
    fn start(kubeconfig: &Path, log: &Path) -> Controller {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let out = std::fs::File::create(log).expect("log file");
        let mut cmd = support::cli::rbac_rules();
        cmd.args([
            "run",
            "--leader-election=false",
            "--adopt-existing",
            "--metrics-address",
            &format!("127.0.0.1:{port}"),
        ]);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("RBAC_RULES_") {
                cmd.env_remove(k);
            }
        }
        let child = cmd
            .env("KUBECONFIG", kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("RBAC_RULES_E2E_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out)
            .spawn()
            .expect("start rbac-rules run");
        Controller(child)
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The chart's RBAC objects as Helm leaves them for a release `crossplane`
/// in `ns`: the deploy=true-only objects (test data) plus `crossplane`.
fn chart_objects(ns: &str) -> Vec<Value> {
    let mut objs = read_yaml("tests/data/crossplane-chart-v2.3.4.yaml");
    objs.push(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "crossplane", "labels": {"app": "crossplane"}},
        "aggregationRule": {"clusterRoleSelectors": [
            {"matchLabels": {"rbac.crossplane.io/aggregate-to-crossplane": "true"}}]}}),
    );
    objs.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "crossplane", "labels": {"app": "crossplane"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "crossplane"},
        "subjects": [{"kind": "ServiceAccount", "name": "crossplane", "namespace": ns}]}));
    for o in &mut objs {
        let meta = &mut o["metadata"];
        for (k, v) in [
            ("helm.sh/chart", "crossplane-2.3.4"),
            ("app.kubernetes.io/managed-by", "Helm"),
            (
                "app.kubernetes.io/component",
                "cloud-infrastructure-controller",
            ),
            ("app.kubernetes.io/part-of", "crossplane"),
            ("app.kubernetes.io/name", "crossplane"),
            ("app.kubernetes.io/instance", "crossplane"),
            ("app.kubernetes.io/version", "2.3.4"),
        ] {
            meta["labels"][k] = json!(v);
        }
        meta["annotations"] = json!({"meta.helm.sh/release-name": "crossplane",
                                     "meta.helm.sh/release-namespace": ns});
    }
    objs
}

fn ar_of(obj: &Value) -> ApiResource {
    if obj["kind"] == "ClusterRole" {
        cr_ar()
    } else {
        crb_ar()
    }
}

fn name_of(obj: &Value) -> String {
    obj["metadata"]["name"].as_str().expect("name").to_string()
}

/// The roles and bindings Crossplane's RBAC manager makes for `objects`:
/// the output of the built-in rules `rules` (they match it), without
/// rbac-rules' provenance. The rules must be pointed at the namespace the
/// run's Deployments live in: the manager binds the ServiceAccount of a
/// revision's Deployment in whatever namespace it finds it, and the rules
/// as shipped look in crossplane-system only (rendered as shipped, the
/// provider's system binding had no subject, and the provider's
/// ServiceAccount no access before the switch).
fn manager_roles(dir: &Path, objects: &[Value], rules: &[Value]) -> Vec<Value> {
    let input = dir.join("objects.yaml");
    let docs: Vec<String> = objects
        .iter()
        .map(|o| serde_json::to_string(o).expect("json"))
        .collect();
    std::fs::write(&input, docs.join("\n---\n")).expect("write objects");
    let rules_file = dir.join("manager-rules.yaml");
    let docs: Vec<String> = rules
        .iter()
        .map(|o| serde_json::to_string(o).expect("json"))
        .collect();
    std::fs::write(&rules_file, docs.join("\n---\n")).expect("write rules");
    let text = render(&RenderArgs {
        objects: vec![input],
        rules: vec![rules_file],
        flatten: false,
        manage: ManageLevel::All,
        allow: None,
        ..Default::default()
    })
    .expect("render the manager's roles");
    let mut roles = serde_saphyr::from_multiple::<Value>(&text).expect("yaml");
    for r in &mut roles {
        let meta = r["metadata"].as_object_mut().expect("metadata");
        meta.remove("annotations");
        if let Some(labels) = meta.get_mut("labels").and_then(Value::as_object_mut) {
            labels.retain(|k, _| {
                k != "app.kubernetes.io/managed-by" && !k.starts_with("rbacrules.io/")
            });
        }
    }
    roles
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a throwaway cluster: RBAC_RULES_E2E_KUBECONFIG=<file> cargo test --test e2e_migration -- --ignored --test-threads=1"]
async fn switch_from_crossplanes_rbac_manager_without_a_gap() {
    let Some(path) = std::env::var_os(KUBECONFIG_VAR).filter(|p| !p.is_empty()) else {
        panic!(
            "{KUBECONFIG_VAR} not set: a throwaway cluster's admin kubeconfig (see the header of tests/e2e_migration.rs)"
        );
    };
    let kubeconfig =
        Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("{KUBECONFIG_VAR}: {e}"));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("client configuration");
    let sfx = suffix();
    let run = Run {
        client: Client::try_from(config).expect("client"),
        kubeconfig: PathBuf::from(&path),
        dir: tempfile::tempdir().expect("temp dir"),
        ns: format!("rbac-rules-mig-{sfx}"),
        group: format!("mig-{sfx}.example.org"),
        xrd: format!("widgets.mig-{sfx}.example.org"),
        pr: format!("provider-mig-{sfx}-0a1b2c3d"),
        pr_group: format!("provider-mig-{sfx}.example.org"),
        editor: format!("e2e-editor-{sfx}"),
        viewer: format!("e2e-viewer-{sfx}"),
        created: Mutex::new(Vec::new()),
    };
    let log = run.dir.path().join("controller.log");
    let mut controller = None;
    let result = std::panic::AssertUnwindSafe(scenario(&run, &mut controller, &log))
        .catch_unwind()
        .await;
    drop(controller.take());
    if result.is_err() {
        eprintln!(
            "--- controller log ---\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let created = std::mem::take(&mut *run.created.lock().expect("lock"));
    for (ar, ns, name) in created.iter().rev() {
        match api(&run.client, ar, ns.as_deref())
            .delete(name, &DeleteParams::background())
            .await
        {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => eprintln!("cleanup: {} {name}: {e}", ar.kind),
        }
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

async fn scenario(run: &Run, controller: &mut Option<Controller>, log: &Path) {
    let client = &run.client;
    // 1. The cluster as the chart and the manager leave it.
    install_crds_and_rules(client, MANAGER).await;
    for name in ["crossplane:rbac-rules"] {
        let _ = api(client, &crb_ar(), None)
            .delete(name, &DeleteParams::background())
            .await;
        let _ = api(client, &cr_ar(), None)
            .delete(name, &DeleteParams::background())
            .await;
    }
    let ns = run.ns.as_str();
    create_fresh(
        client,
        &ns_ar(),
        None,
        MANAGER,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )
    .await;
    run.remember(ns_ar(), None, ns);
    // Crossplane and its providers run in this run's namespace: point the
    // rules that bind their ServiceAccounts there, as the guide says.
    for (file, rule, related) in [
        (
            "crossplane-core.yaml",
            "crossplane-serviceaccount",
            "deployments",
        ),
        (
            "crossplane-provider.yaml",
            "crossplane-provider-system",
            "deployments",
        ),
    ] {
        point_rule_at_namespace(client, MANAGER, file, rule, related, ns).await;
    }
    for (name, app, sa) in [
        ("crossplane", "crossplane", "crossplane"),
        (
            "crossplane-rbac-manager",
            "crossplane-rbac-manager",
            "rbac-manager",
        ),
    ] {
        create_fresh(client, &deploy_ar(), Some(ns), HELM, &json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns,
                "labels": {"app": app, "release": "crossplane", "app.kubernetes.io/name": "crossplane"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                "template": {"metadata": {"labels": {"app": app}},
                    "spec": {"serviceAccountName": sa,
                        "containers": [{"name": "c", "image": "example.invalid/crossplane:v2.3.4"}]}}}})).await;
    }
    let chart = chart_objects(ns);
    let mut uids = Vec::new();
    for o in &chart {
        let live = create_fresh(client, &ar_of(o), None, HELM, o).await;
        uids.push((ar_of(o), name_of(o), live["metadata"]["uid"].clone()));
    }
    let xrd = create_fresh(
        client,
        &xrd_ar(),
        None,
        MANAGER,
        &json!({
        "apiVersion": "apiextensions.crossplane.io/v1", "kind": "CompositeResourceDefinition",
        "metadata": {"name": run.xrd},
        "spec": {"group": run.group, "names": {"kind": "Widget", "plural": "widgets"},
            "claimNames": {"kind": "WidgetClaim", "plural": "widgetclaims"},
            "versions": [{"name": "v1alpha1", "served": true, "referenceable": true}]}}),
    )
    .await;
    run.remember(xrd_ar(), None, &run.xrd);
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
    let mut inputs = vec![xrd.clone()];
    for crd in lineage_crds(client, CROSSPLANE, &xrd, &run.group, &types, true).await {
        run.remember(
            crd_ar(),
            None,
            crd["metadata"]["name"].as_str().expect("name"),
        );
        inputs.push(crd);
    }
    let mut made = manager_roles(
        run.dir.path(),
        &inputs,
        &read_yaml("rules/crossplane-xrd.yaml"),
    );
    assert_eq!(made.len(), 4, "the manager's four XRD roles");
    // A provider: its Provider (made first: the rules believe only CRDs no
    // older than it), a revision with two types and the Deployment it
    // controls.
    let provider = create_fresh(
        client,
        &provider_ar(),
        None,
        MANAGER,
        &json!({
        "apiVersion": "pkg.crossplane.io/v1", "kind": "Provider",
        "metadata": {"name": run.pr},
        "spec": {"package": "xpkg.example.org/mig/provider-mig:v0.1.0"}}),
    )
    .await;
    run.remember(provider_ar(), None, &run.pr);
    create_fresh(
        client,
        &pr_ar(),
        None,
        MANAGER,
        &json!({
        "apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
        "metadata": {"name": run.pr, "ownerReferences": [{
            "apiVersion": "pkg.crossplane.io/v1", "kind": "Provider", "name": run.pr,
            "uid": provider["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"image": "xpkg.example.org/mig/provider-mig:v0.1.0",
                 "desiredState": "Active", "revision": 1}}),
    )
    .await;
    run.remember(pr_ar(), None, &run.pr);
    let crd = |plural: &str| {
        json!({"apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition", "name": format!("{plural}.{}", run.pr_group)})
    };
    let pr = api(client, &pr_ar(), None)
        .patch_status(
            &run.pr,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"objectRefs": [crd("gadgets"), crd("providerconfigs")]}}),
            ),
        )
        .await
        .expect("the ProviderRevision's status");
    let pr = serde_json::to_value(pr).expect("json");
    let deployment = create_fresh(client, &deploy_ar(), Some(ns), CROSSPLANE, &json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": run.pr, "namespace": ns, "ownerReferences": [{
            "apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision", "name": run.pr,
            "uid": pr["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "provider-mig"}},
            "template": {"metadata": {"labels": {"app": "provider-mig"}},
                "spec": {"serviceAccountName": "provider-mig",
                    "containers": [{"name": "p", "image": "xpkg.example.org/mig/provider-mig:v0.1.0"}]}}}})).await;
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
    // The Provider too: the rules believe a CRD only when it is no older
    // than the Provider of the revision that controls it.
    let mut inputs = vec![provider.clone(), pr.clone(), deployment];
    for crd in lineage_crds(client, CROSSPLANE, &pr, &run.pr_group, &types, true).await {
        run.remember(
            crd_ar(),
            None,
            crd["metadata"]["name"].as_str().expect("name"),
        );
        inputs.push(crd);
    }
    let provider = manager_roles(
        run.dir.path(),
        &inputs,
        &rules_pointed_at_namespace(
            "crossplane-provider.yaml",
            "crossplane-provider-system",
            "deployments",
            ns,
        ),
    );
    assert_eq!(
        provider.len(),
        4,
        "edit, view and system roles and the system binding"
    );
    let system = provider
        .iter()
        .find(|o| o["kind"] == "ClusterRoleBinding")
        .expect("the system binding");
    let subjects: Vec<(&Value, &Value, &Value)> = system["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| (&s["kind"], &s["name"], &s["namespace"]))
        .collect();
    assert_eq!(
        subjects,
        [(&json!("ServiceAccount"), &json!("provider-mig"), &json!(ns))],
        "the manager binds the provider's ServiceAccount"
    );
    made.extend(provider);
    for r in &made {
        let live = create_fresh(client, &ar_of(r), None, CROSSPLANE, r).await;
        uids.push((ar_of(r), name_of(r), live["metadata"]["uid"].clone()));
    }
    for (user, role) in [
        (&run.editor, "crossplane-edit"),
        (&run.viewer, "crossplane-view"),
    ] {
        let name = format!("{user}-{role}");
        create_fresh(client, &crb_ar(), None, MANAGER, &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})).await;
        run.remember(crb_ar(), None, &name);
    }
    let questions = run.questions();
    eventually(
        "the access Crossplane's chart and manager give",
        async || access(client, &questions).await,
    )
    .await;
    let probe = Probe::start(client.clone(), questions.clone());

    // 2. What would change.
    let (code, out) = diff(&run.kubeconfig, false);
    assert_eq!(code, 1, "{out}");
    let edit_role = format!("crossplane:composite:{}:aggregate-to-edit", run.xrd);
    assert!(
        out.contains(&format!("adopt ClusterRole {edit_role} ")),
        "{out}"
    );
    assert!(
        out.contains("conflict ClusterRole crossplane-admin "),
        "{out}"
    );
    assert!(out.contains("--adopt-existing"), "{out}");
    let (_, out) = diff(&run.kubeconfig, true);
    assert!(out.contains("adopt ClusterRole crossplane-admin "), "{out}");
    // Nothing of Crossplane's is pruned (leftovers of other runs may be).
    for (ar, name, _) in &uids {
        let line = format!("prune {} {name} ", ar.kind);
        assert!(!out.contains(&line), "{out}");
    }

    // 3. Stop the manager; run rbac-rules with adoption.
    api(client, &deploy_ar(), Some(ns))
        .patch(
            "crossplane-rbac-manager",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .expect("scale the RBAC manager to 0");
    *controller = Some(Controller::start(&run.kubeconfig, log));
    eventually("every object adopted in place", async || {
        for (ar, name, uid) in &uids {
            let o = get(client, ar, None, name)
                .await
                .ok_or(format!("{name} gone"))?;
            if &o["metadata"]["uid"] != uid {
                return Err(format!("{} {name} was re-created", ar.kind));
            }
            let ours = o["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "rbac-rules";
            if name == "crossplane" {
                if ours {
                    return Err(format!("{} crossplane taken from the chart", ar.kind));
                }
                continue;
            }
            if !ours {
                return Err(format!("{} {name} not adopted yet", ar.kind));
            }
            let helm = o["metadata"]["annotations"]["meta.helm.sh/release-name"].is_string();
            if helm != (o["metadata"]["annotations"][KEEP] == "keep") {
                return Err(format!(
                    "{} {name}: keep annotation {}",
                    ar.kind, o["metadata"]["annotations"]
                ));
            }
        }
        let b = get(client, &crb_ar(), None, "crossplane:rbac-rules")
            .await
            .ok_or("no crossplane:rbac-rules binding")?;
        if b["subjects"]
            != json!([{"kind": "ServiceAccount", "name": "crossplane", "namespace": ns}])
        {
            return Err(format!("crossplane:rbac-rules subjects {}", b["subjects"]));
        }
        let r = get(client, &cr_ar(), None, "crossplane:rbac-rules")
            .await
            .ok_or("no crossplane:rbac-rules role")?;
        let fills = r["rules"]
            .as_array()
            .is_some_and(|rs| rs.iter().any(|x| x["apiGroups"] == json!([run.group])));
        if fills {
            Ok(())
        } else {
            Err("crossplane:rbac-rules not aggregated yet".into())
        }
    })
    .await;

    // 4. helm upgrade --set rbacManager.deploy=false, as Helm does it.
    api(client, &deploy_ar(), Some(ns))
        .delete("crossplane-rbac-manager", &DeleteParams::background())
        .await
        .expect("delete the RBAC manager");
    for o in chart.iter().filter(|o| name_of(o) != "crossplane") {
        let live = get(client, &ar_of(o), None, &name_of(o))
            .await
            .expect("chart object");
        assert_eq!(
            live["metadata"]["annotations"][KEEP],
            "keep",
            "Helm would delete {} {}",
            o["kind"],
            name_of(o)
        );
    }
    let base = &chart
        .iter()
        .find(|o| name_of(o) == "crossplane:system:aggregate-to-crossplane")
        .expect("base role")["rules"];
    let mut plain = get(client, &cr_ar(), None, "crossplane")
        .await
        .expect("crossplane role");
    plain
        .as_object_mut()
        .expect("object")
        .remove("aggregationRule");
    if let Some(m) = plain["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    plain["rules"] = base.clone();
    let plain: DynamicObject = serde_json::from_value(plain).expect("object");
    api(client, &cr_ar(), None)
        .replace(
            "crossplane",
            &PostParams {
                field_manager: Some(HELM.into()),
                ..PostParams::default()
            },
            &plain,
        )
        .await
        .expect("ClusterRole crossplane as a plain role");

    // 5. Converged; nobody lost anything at any moment.
    eventually("rbac-rules diff to exit 0", async || {
        match diff(&run.kubeconfig, false) {
            (0, _) => Ok(()),
            (_, out) => Err(out),
        }
    })
    .await;
    access(client, &questions)
        .await
        .expect("access after the switch");
    let wrong = probe.finish().await;
    assert!(
        wrong.is_empty(),
        "access changed during the switch:\n{}",
        wrong.join("\n")
    );
}
