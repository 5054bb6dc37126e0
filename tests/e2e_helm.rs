//! End-to-end: the Helm path of docs/migrating-from-crossplane.md, and
//! what the chart's values do to the grants people hold, with the real
//! `helm` binary against a real API server.
//!
//! ```sh
//! RBAC_RULES_E2E_KUBECONFIG=<file> cargo test --test e2e_helm -- --ignored --test-threads=1
//! ```
//!
//! The test is `#[ignore]`d: `cargo test` never runs it; run with
//! `--ignored` but without `RBAC_RULES_E2E_KUBECONFIG`, or without a
//! `helm` (the `HELM` variable, else `helm` on PATH), it fails, saying so.
//! It needs what tests/e2e.rs needs (a throwaway cluster, a cluster-admin
//! kubeconfig, the ClusterRole aggregation controller, no Crossplane, no
//! other rbac-rules controller, no release `rbac-rules` in
//! `rbac-rules-system`), and must not run at the same time as the other
//! e2e suites.
//!
//! No Pod runs on the testbed: where the chart's Deployment would run the
//! controller, the test runs `rbac-rules` as a local process with the
//! arguments and environment of the Deployment Helm rendered (so the
//! values' wiring is what runs), impersonating the chart's ServiceAccount
//! (so the chart's RBAC and admission fence are what it meets). When an
//! upgrade changes the Deployment's Pod template, the process is restarted,
//! as a rollout would.
//!
//! 0. A Crossplane stand-in installed as a Helm release (`crossplane`, a
//!    chart written by the test: the RBAC objects of Crossplane's chart
//!    v2.3.4 under `rbacManager.deploy`, ClusterRole and binding
//!    `crossplane`, Crossplane's and the RBAC manager's Deployments), so
//!    Helm's ownership labels and annotations are real; an XRD and a
//!    ProviderRevision with the roles and binding the RBAC manager made for
//!    them; team namespaces whose developers are bound to `crossplane-edit`.
//!    A background probe of SubjectAccessReviews (an admin, the team
//!    developers, a viewer, Crossplane's and the provider's
//!    ServiceAccounts) runs from here to the end and records every answer
//!    that differs from the baseline.
//! 1. The trap the guide warns of: a built-in rule applied with kubectl
//!    first makes `helm install` fail ("cannot be imported into the current
//!    release"); it is deleted again.
//! 2. `helm install -f migration-values.yaml` (the guide's file, read from
//!    the guide: `replicas=0` so nothing runs, `adoptExisting=true`,
//!    `admissionFence=false`) with the Crossplane namespace as
//!    `params.crossplaneNamespace`; `rbac-rules diff` with the values'
//!    settings shows the adoptions and no prune.
//! 3. The RBAC manager scaled to 0; `helm upgrade --reuse-values --set
//!    replicas=2`: the controller runs and adopts everything in place (same
//!    uids).
//! 4. `helm upgrade --reuse-values --set adoptExisting=false --set
//!    admissionFence=true`: the controller, restarted, runs behind the
//!    fence with nothing to do (`diff` exits 0).
//! 5. Crossplane's chart switched (`--set rbacManager.deploy=false`): Helm
//!    keeps every adopted object (`helm.sh/resource-policy: keep`).
//! 6. `helm upgrade --reuse-values --set builtinRules=false`: every
//!    RbacRule gone, every managed object kept with its uid, no DELETE
//!    sent, no prune, revocation or failed write in the controller's log.
//! 7. `helm rollback`: the rules back, every one Ready, the same objects.
//!    Then `kubectl delete rbacrule crossplane-namespace`: the same as 6.
//! 8. `helm uninstall`: the same as 6, and the controller stopped.
//! 9. The rollback of the migration: Helm refuses the chart's objects while
//!    they say `managed-by=rbac-rules`, and `helm rollback` of Crossplane's
//!    release refuses them too; given back to Helm (`managed-by=Helm`),
//!    Crossplane's chart upgraded with `rbacManager.deploy=true` takes them
//!    back in place.
//!
//! At the end the probe must have seen no change at any moment.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use rbac_rules::api::{ManageLevel, RbacRule};
use rbac_rules::render::{RenderArgs, render};
use serde_json::{Value, json};

mod support;
use support::e2e::*;

const KUBECONFIG_VAR: &str = "RBAC_RULES_E2E_KUBECONFIG";
/// Field managers standing in for Crossplane and this test.
const CROSSPLANE: &str = "crossplane";
const MANAGER: &str = "rbac-rules-e2e";
const KEEP: &str = "helm.sh/resource-policy";
const MANAGED_BY: &str = "app.kubernetes.io/managed-by=rbac-rules";
/// The release of rbac-rules and its namespace, as the guide installs it.
const RELEASE: &str = "rbac-rules";
const RELEASE_NS: &str = "rbac-rules-system";
/// The release of the Crossplane stand-in.
const XP_RELEASE: &str = "crossplane";
const XRD_ANNOTATION_VALUE: &str = "xrd-claim-accepted";
const TEAMS: usize = 5;
/// Warnings a controller that is told to let go must never log.
const LOSSES: &[&str] = &["pruned", "write failed", "revoked"];

/// The `helm` binary and the kubeconfig it talks to the cluster with.
struct Helm {
    bin: String,
    kubeconfig: PathBuf,
}

impl Helm {
    /// `HELM`, else `helm` on PATH; fails the test when it does not run.
    fn find(kubeconfig: &Path) -> Helm {
        let bin = std::env::var("HELM")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "helm".into());
        let out = Command::new(&bin).args(["version", "--short"]).output();
        match out {
            Ok(o) if o.status.success() => {
                eprintln!("helm: {bin} {}", String::from_utf8_lossy(&o.stdout).trim())
            }
            Ok(o) => panic!(
                "`{bin} version` failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => panic!(
                "no helm ({bin}: {e}): install Helm 3.8 or newer, or set HELM=<path> \
                 (the header of tests/e2e_helm.rs)"
            ),
        }
        Helm {
            bin,
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }

    /// Runs helm with `args` off the async workers; its stdout, or its
    /// stderr as the error.
    async fn try_run(&self, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args).arg("--kubeconfig").arg(&self.kubeconfig);
        let line = format!("helm {}", args.join(" "));
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .expect("helm task")
            .unwrap_or_else(|e| panic!("run {line}: {e}"));
        eprintln!("helm-e2e: $ {line}: {}", out.status);
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    async fn run(&self, args: &[&str]) -> String {
        self.try_run(args)
            .await
            .unwrap_or_else(|e| panic!("helm {} failed:\n{e}", args.join(" ")))
    }
}

/// The controller process standing in for the chart's Deployment.
impl Controller {
    /// Starts `rbac-rules` with the arguments and environment of the
    /// container of `deployment` (a live Deployment of the chart), its
    /// metrics on a free local port, as the chart's ServiceAccount
    /// (`kubeconfig` impersonates it), Pod name `pod`.
    fn from_deployment(deployment: &Value, kubeconfig: &Path, log: PathBuf, pod: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let args: Vec<String> = container["args"]
            .as_array()
            .expect("the container's args")
            .iter()
            .map(|a| {
                let a = a.as_str().expect("an argument");
                if a.starts_with("--metrics-address") {
                    format!("--metrics-address=127.0.0.1:{port}")
                } else {
                    a.to_string()
                }
            })
            .collect();
        let namespace = deployment["metadata"]["namespace"]
            .as_str()
            .expect("namespace");
        let mut env = Vec::new();
        for e in container["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().expect("env name").to_string();
            let value = match (
                e["value"].as_str(),
                e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
            ) {
                (Some(v), _) => v.to_string(),
                (None, Some("metadata.namespace")) => namespace.to_string(),
                (None, Some("metadata.name")) => pod.to_string(),
                _ => panic!(
                    "the chart's Deployment has an environment variable the test cannot set: {e}"
                ),
            };
            env.push((name, value));
        }
        let out = std::fs::File::create(&log).expect("create controller log");
        let mut cmd = support::cli::rbac_rules();
        cmd.args(&args);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("RBAC_RULES_") || k.starts_with("KUBE_RS_DEBUG_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(env.iter().map(|(k, v)| (k, v)))
            .env("KUBECONFIG", kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("RBAC_RULES_E2E_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out);
        let child = cmd.spawn().expect("start rbac-rules run");
        eprintln!(
            "helm-e2e: controller pid {} as the chart's Deployment ({} {}; {}), log {}",
            child.id(),
            args.join(" "),
            env.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
            port,
            log.display()
        );
        Controller { child, port, log }
    }

    /// DELETE requests the controller sent (`rbac_rules_api_writes_total`).
    async fn deletes(&self) -> f64 {
        self.metric_sum("rbac_rules_api_writes_total{", "action=\"delete\"")
            .await
    }

    /// The log holds none of [`LOSSES`], and no storm of anything failing
    /// about a delete.
    fn assert_log_clean(&self, step: &str) {
        let log = self.log();
        for bad in LOSSES {
            assert!(
                !log.contains(bad),
                "{step}: the controller's log holds {bad:?}:\n{}",
                self.log_tail()
            );
        }
        let failed_deletes = log
            .lines()
            .filter(|l| {
                let l = l.to_lowercase();
                l.contains("delete") && (l.contains("fail") || l.contains("error"))
            })
            .count();
        assert!(
            failed_deletes == 0,
            "{step}: {failed_deletes} log lines of failed deletes:\n{}",
            self.log_tail()
        );
        eprintln!(
            "helm-e2e: {step}: controller log {} lines, none of {LOSSES:?}, {failed_deletes} failed-delete lines",
            log.lines().count()
        );
    }
}

/// One SubjectAccessReview question and the answer it has before the
/// migration.
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

/// Asks the questions in a loop until stopped; records every wrong answer.
/// Dropped unfinished (a failed step), it stops asking.
struct Probe {
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<(u32, Vec<String>)>>,
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
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
            (rounds, wrong)
        });
        Probe {
            stop,
            task: Some(task),
        }
    }

    async fn finish(mut self) -> (u32, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        let task = self.task.take().expect("the probe runs");
        task.await.expect("probe task")
    }
}

struct Run {
    client: Client,
    helm: Helm,
    /// The admin kubeconfig (diff and helm use it) and the controller's,
    /// impersonating the chart's ServiceAccount.
    kubeconfig: PathBuf,
    controller_kubeconfig: PathBuf,
    dir: tempfile::TempDir,
    sfx: String,
    /// Crossplane's namespace (its release, Deployments and provider).
    ns: String,
    teams: Vec<String>,
    group: String,
    xrd: String,
    pr: String,
    pr_group: String,
    viewer: String,
    created: Mutex<Vec<(ApiResource, Option<String>, String)>>,
    /// Every controller process started, in order (the last one runs).
    starts: Mutex<u32>,
}

impl Run {
    fn api(&self, ar: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
        match ns {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, ar),
            None => Api::all_with(self.client.clone(), ar),
        }
    }

    async fn get(&self, ar: &ApiResource, ns: Option<&str>, name: &str) -> Option<Value> {
        self.api(ar, ns)
            .get_opt(name)
            .await
            .unwrap_or_else(|e| panic!("get {} {name}: {e}", ar.kind))
            .map(|o| serde_json::to_value(o).expect("json"))
    }

    /// Creates `obj` as field manager `manager` and remembers it for the
    /// clean-up.
    async fn create(&self, ar: &ApiResource, ns: Option<&str>, manager: &str, obj: Value) -> Value {
        let name = obj["metadata"]["name"].as_str().expect("name").to_string();
        let o: DynamicObject = serde_json::from_value(obj).expect("object");
        let pp = PostParams {
            field_manager: Some(manager.to_string()),
            ..PostParams::default()
        };
        let out = self
            .api(ar, ns)
            .create(&pp, &o)
            .await
            .unwrap_or_else(|e| panic!("create {} {name}: {e}", ar.kind));
        self.created
            .lock()
            .expect("lock")
            .push((ar.clone(), ns.map(str::to_string), name));
        serde_json::to_value(out).expect("json")
    }

    /// uid of every object carrying rbac-rules' inventory label, by
    /// "Kind ns/name".
    async fn inventory(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let lp = ListParams::default().labels(MANAGED_BY);
        for ar in [cr_ar(), crb_ar(), role_ar(), rb_ar()] {
            for o in self.api(&ar, None).list(&lp).await.expect("list") {
                out.insert(
                    format!(
                        "{} {}/{}",
                        ar.kind,
                        o.metadata.namespace.unwrap_or_default(),
                        o.metadata.name.unwrap_or_default()
                    ),
                    o.metadata.uid.unwrap_or_default(),
                );
            }
        }
        out
    }

    fn dev(&self, i: usize) -> String {
        format!("dev-{i}-{}", self.sfx)
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
        let g = self.group.as_str();
        let p = self.pr_group.as_str();
        let admin = format!("admin-{}", self.sfx);
        let masters = ["crossplane:masters"];
        let sa = format!("system:serviceaccount:{}:crossplane", self.ns);
        let provider = format!("system:serviceaccount:{}:provider-helm", self.ns);
        let sa_groups = ["system:serviceaccounts"];
        let xp = Some(self.ns.as_str());
        let mut out = vec![
            q(
                &admin,
                &masters,
                None,
                "create",
                "apiextensions.crossplane.io",
                "compositions",
                true,
            ),
            q(&admin, &masters, None, "delete", g, "widgets", true),
            q(
                &admin,
                &masters,
                Some(&self.teams[0]),
                "create",
                "rbac.authorization.k8s.io",
                "rolebindings",
                true,
            ),
            q(&self.viewer, &[], None, "list", g, "widgets", true),
            q(&self.viewer, &[], None, "create", g, "widgets", false),
            q(&self.viewer, &[], None, "list", p, "gadgets", true),
            q(&sa, &sa_groups, None, "update", g, "widgets", true),
            q(
                &sa,
                &sa_groups,
                Some(&self.teams[1]),
                "update",
                g,
                "widgetclaims",
                true,
            ),
            q(
                &sa,
                &sa_groups,
                None,
                "create",
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                true,
            ),
            q(&sa, &sa_groups, xp, "create", "", "events", true),
            q(&sa, &sa_groups, None, "update", p, "gadgets", true),
            q(&provider, &sa_groups, None, "update", p, "gadgets", true),
            q(&provider, &sa_groups, None, "delete", p, "gadgets", false),
        ];
        for (i, t) in self.teams.iter().enumerate() {
            let dev = self.dev(i);
            let other = &self.teams[(i + 1) % self.teams.len()];
            out.push(q(&dev, &[], Some(t), "create", g, "widgetclaims", true));
            out.push(q(&dev, &[], Some(t), "get", "", "secrets", true));
            out.push(q(
                &dev,
                &[],
                Some(other),
                "create",
                g,
                "widgetclaims",
                false,
            ));
        }
        out
    }

    /// The live Deployment of the rbac-rules release.
    async fn deployment(&self) -> Value {
        self.get(&deploy_ar(), Some(RELEASE_NS), RELEASE)
            .await
            .expect("the chart's Deployment")
    }

    /// Starts the controller as the chart's Deployment says.
    async fn start_controller(&self) -> Controller {
        let n = {
            let mut s = self.starts.lock().expect("lock");
            *s += 1;
            *s
        };
        let d = self.deployment().await;
        let mut c = Controller::from_deployment(
            &d,
            &self.controller_kubeconfig,
            self.dir.path().join(format!("controller-{n}.log")),
            &format!("rbac-rules-{n}"),
        );
        c.wait_ready().await;
        c
    }

    /// `rbac-rules diff` as the guide runs it (the values' allow-list and
    /// params): exit code and stdout.
    async fn diff(&self, adopt: bool) -> (i32, String) {
        let mut cmd = support::cli::rbac_rules();
        cmd.args([
            "diff",
            "--allow-clusterrole",
            "rbac-rules:allow-list",
            "--param",
            &format!("crossplaneNamespace={}", self.ns),
        ]);
        if adopt {
            cmd.arg("--adopt-existing");
        }
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("RBAC_RULES_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "warn");
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .expect("diff task")
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
}

/// Writes the Crossplane stand-in chart into `dir`: what Crossplane's
/// chart v2.3.4 installs that matters here, under the same value
/// `rbacManager.deploy`.
fn write_crossplane_chart(dir: &Path) -> PathBuf {
    let chart = dir.join("crossplane");
    std::fs::create_dir_all(chart.join("templates")).expect("chart dir");
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: crossplane\nversion: 2.3.4\nappVersion: \"2.3.4\"\n\
         description: A stand-in of Crossplane's chart (tests/e2e_helm.rs)\n",
    )
    .expect("Chart.yaml");
    std::fs::write(chart.join("values.yaml"), "rbacManager:\n  deploy: true\n")
        .expect("values.yaml");
    // The deploy=true-only RBAC objects, one JSON document each (JSON is
    // YAML, and holds no template braces).
    let mut base_rules = Value::Null;
    let mut docs = Vec::new();
    for mut o in read_yaml("tests/data/crossplane-chart-v2.3.4.yaml") {
        if let Some(m) = o["metadata"].as_object_mut() {
            m.remove("annotations");
        }
        if o["metadata"]["name"] == "crossplane:system:aggregate-to-crossplane" {
            base_rules = o["rules"].clone();
        }
        docs.push(serde_json::to_string(&o).expect("json"));
    }
    assert!(base_rules.is_array(), "the base rules");
    let labels = json!({"app": "crossplane", "app.kubernetes.io/name": "crossplane",
        "app.kubernetes.io/part-of": "crossplane"});
    let aggregated = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "crossplane", "labels": labels},
        "aggregationRule": {"clusterRoleSelectors": [
            {"matchLabels": {"rbac.crossplane.io/aggregate-to-crossplane": "true"}}]}});
    let plain = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "crossplane", "labels": labels}, "rules": base_rules});
    let deployment = |name: &str, app: &str, sa: &str| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name,
                "labels": {"app": app, "release": "crossplane", "app.kubernetes.io/name": "crossplane"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                "template": {"metadata": {"labels": {"app": app}},
                    "spec": {"serviceAccountName": sa,
                        "containers": [{"name": "c", "image": "example.invalid/crossplane:v2.3.4"}]}}}})
        .to_string()
    };
    let sa = |name: &str| {
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
            .to_string()
    };
    let template = format!(
        "{sa_xp}\n---\n{dep_xp}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n\
         metadata: {{name: crossplane, labels: {{app: crossplane}}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: crossplane}}\n\
         subjects: [{{kind: ServiceAccount, name: crossplane, namespace: {{{{ .Release.Namespace }}}}}}]\n\
         ---\n\
         {{{{- if .Values.rbacManager.deploy }}}}\n{aggregated}\n{{{{- else }}}}\n{plain}\n{{{{- end }}}}\n\
         {{{{- if .Values.rbacManager.deploy }}}}\n---\n{sa_rm}\n---\n{dep_rm}\n---\n{chart}\n{{{{- end }}}}\n",
        sa_xp = sa("crossplane"),
        dep_xp = deployment("crossplane", "crossplane", "crossplane"),
        sa_rm = sa("rbac-manager"),
        dep_rm = deployment(
            "crossplane-rbac-manager",
            "crossplane-rbac-manager",
            "rbac-manager"
        ),
        chart = docs.join("\n---\n"),
    );
    std::fs::write(chart.join("templates/crossplane.yaml"), template).expect("template");
    chart
}

/// The roles and bindings Crossplane's RBAC manager makes for `objects`:
/// the output of the built-in rules `rules`, without rbac-rules'
/// provenance (as tests/e2e_migration.rs makes them).
fn manager_roles(dir: &Path, objects: &[Value], rules: &[Value], tag: &str) -> Vec<Value> {
    let write = |name: &str, docs: &[Value]| {
        let path = dir.join(format!("{tag}-{name}.yaml"));
        let text: Vec<String> = docs
            .iter()
            .map(|o| serde_json::to_string(o).expect("json"))
            .collect();
        std::fs::write(&path, text.join("\n---\n")).expect("write");
        path
    };
    let text = render(&RenderArgs {
        objects: vec![write("objects", objects)],
        rules: vec![write("rules", rules)],
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a throwaway cluster and helm: RBAC_RULES_E2E_KUBECONFIG=<file> cargo test --test e2e_helm -- --ignored --test-threads=1"]
async fn the_helm_path_loses_no_grant() {
    let Some(path) = std::env::var_os(KUBECONFIG_VAR).filter(|p| !p.is_empty()) else {
        panic!(
            "{KUBECONFIG_VAR} not set: a throwaway cluster's admin kubeconfig (see the header of tests/e2e_helm.rs)"
        );
    };
    let kubeconfig = Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("{KUBECONFIG_VAR}={}: {e}", path.to_string_lossy()));
    let helm = Helm::find(Path::new(&path));
    let dir = tempfile::tempdir().expect("temp dir");
    let controller_kubeconfig = dir.path().join("controller.kubeconfig");
    write_impersonating(
        &kubeconfig,
        &format!("system:serviceaccount:{RELEASE_NS}:rbac-rules"),
        &controller_kubeconfig,
    );
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("client configuration");
    let sfx = suffix();
    let run = Run {
        client: Client::try_from(config).expect("client"),
        helm,
        kubeconfig: PathBuf::from(&path),
        controller_kubeconfig,
        dir,
        ns: format!("xp-helm-{sfx}"),
        teams: (0..TEAMS)
            .map(|i| format!("helm-e2e-{sfx}-team-{i}"))
            .collect(),
        group: format!("helm-{sfx}.example.org"),
        xrd: format!("widgets.helm-{sfx}.example.org"),
        pr: format!("provider-helm-{sfx}-0a1b2c3d"),
        pr_group: format!("provider-helm-{sfx}.example.org"),
        viewer: format!("viewer-{sfx}"),
        sfx,
        created: Mutex::new(Vec::new()),
        starts: Mutex::new(0),
    };
    let mut controller: Option<Controller> = None;
    let result = AssertUnwindSafe(scenario(&run, &mut controller))
        .catch_unwind()
        .await;
    if let Some(c) = controller.as_mut() {
        if result.is_err() {
            eprintln!("{}", c.log_tail());
        }
        c.stop();
    }
    cleanup(&run).await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

async fn cleanup(run: &Run) {
    let _ = run
        .helm
        .try_run(&["uninstall", RELEASE, "-n", RELEASE_NS])
        .await;
    let _ = run
        .helm
        .try_run(&["uninstall", XP_RELEASE, "-n", &run.ns])
        .await;
    // What Helm keeps and what the rules made, then what the test made.
    let mut names: Vec<(ApiResource, String)> =
        read_yaml("tests/data/crossplane-chart-v2.3.4.yaml")
            .iter()
            .map(|o| (ar_of(o), name_of(o)))
            .collect();
    names.push((cr_ar(), "crossplane:rbac-rules".into()));
    names.push((crb_ar(), "crossplane:rbac-rules".into()));
    for (ar, name) in names {
        let _ = run
            .api(&ar, None)
            .delete(&name, &DeleteParams::background())
            .await;
    }
    let lp = ListParams::default().labels(MANAGED_BY);
    for ar in [cr_ar(), crb_ar()] {
        if let Ok(list) = run.api(&ar, None).list(&lp).await {
            for o in list {
                let name = o.metadata.name.unwrap_or_default();
                if name.contains(&run.sfx) {
                    let _ = run
                        .api(&ar, None)
                        .delete(&name, &DeleteParams::background())
                        .await;
                }
            }
        }
    }
    let created = std::mem::take(&mut *run.created.lock().expect("lock"));
    for (ar, ns, name) in created.iter().rev() {
        match run
            .api(ar, ns.as_deref())
            .delete(name, &DeleteParams::background())
            .await
        {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => eprintln!("cleanup: {} {name}: {e}", ar.kind),
        }
    }
    for ns in [run.ns.as_str(), RELEASE_NS] {
        let _ = run
            .api(&ns_ar(), None)
            .delete(ns, &DeleteParams::background())
            .await;
    }
}

/// Sets up Crossplane (the stand-in release, an XRD, a provider, what the
/// RBAC manager made for them) and the teams; returns the uids of the
/// chart's and the manager's RBAC objects.
async fn setup(run: &Run) -> Vec<(ApiResource, String, Value)> {
    let client = &run.client;
    let ns = run.ns.as_str();
    assert!(
        run.helm
            .try_run(&["status", RELEASE, "-n", RELEASE_NS])
            .await
            .is_err(),
        "a release {RELEASE} exists in {RELEASE_NS}: run on a throwaway cluster"
    );
    install_stand_in_crds(client, MANAGER).await;
    // Crossplane, installed by (a stand-in of) its chart.
    let chart = write_crossplane_chart(run.dir.path());
    let chart = chart.to_string_lossy().into_owned();
    run.helm
        .run(&[
            "install",
            XP_RELEASE,
            &chart,
            "-n",
            ns,
            "--create-namespace",
        ])
        .await;
    let mut uids = Vec::new();
    for o in read_yaml("tests/data/crossplane-chart-v2.3.4.yaml") {
        let live = run
            .get(&ar_of(&o), None, &name_of(&o))
            .await
            .unwrap_or_else(|| panic!("the chart installed {}", name_of(&o)));
        assert_eq!(
            live["metadata"]["annotations"]["meta.helm.sh/release-name"], XP_RELEASE,
            "Helm's own ownership annotation"
        );
        uids.push((ar_of(&o), name_of(&o), live["metadata"]["uid"].clone()));
    }
    for t in &run.teams {
        run.create(
            &ns_ar(),
            None,
            MANAGER,
            json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": t,
                    "annotations": {format!("rbac.crossplane.io/{}", run.xrd): XRD_ANNOTATION_VALUE}}}),
        )
        .await;
    }
    // An XRD, the CRDs Crossplane makes for it, and the manager's roles.
    let xrd = run
        .create(
            &xrd_ar(),
            None,
            MANAGER,
            json!({"apiVersion": "apiextensions.crossplane.io/v1",
                "kind": "CompositeResourceDefinition", "metadata": {"name": run.xrd},
                "spec": {"group": run.group,
                    "names": {"kind": "Widget", "plural": "widgets"},
                    "claimNames": {"kind": "WidgetClaim", "plural": "widgetclaims"},
                    "versions": [{"name": "v1alpha1", "served": true, "referenceable": true}]}}),
        )
        .await;
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
        run.created
            .lock()
            .expect("lock")
            .push((crd_ar(), None, name_of(&crd)));
        inputs.push(crd);
    }
    let mut made = manager_roles(
        run.dir.path(),
        &inputs,
        &read_yaml("rules/crossplane-xrd.yaml"),
        "xrd",
    );
    assert_eq!(made.len(), 4, "the manager's four XRD roles");
    // A provider: Provider, revision, Deployment, CRDs, the manager's roles.
    let package = "xpkg.example.org/helm/provider-helm:v0.1.0";
    let provider = run
        .create(
            &provider_ar(),
            None,
            MANAGER,
            json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "Provider",
                "metadata": {"name": run.pr}, "spec": {"package": package}}),
        )
        .await;
    run.create(
        &pr_ar(),
        None,
        MANAGER,
        json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
            "metadata": {"name": run.pr, "ownerReferences": [{
                "apiVersion": "pkg.crossplane.io/v1", "kind": "Provider", "name": run.pr,
                "uid": provider["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"image": package, "desiredState": "Active", "revision": 1}}),
    )
    .await;
    let crd = |plural: &str| {
        json!({"apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition", "name": format!("{plural}.{}", run.pr_group)})
    };
    let pr = run
        .api(&pr_ar(), None)
        .patch_status(
            &run.pr,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"objectRefs": [crd("gadgets")]}})),
        )
        .await
        .expect("the ProviderRevision's status");
    let pr = serde_json::to_value(pr).expect("json");
    let deployment = run
        .create(
            &deploy_ar(),
            Some(ns),
            CROSSPLANE,
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": run.pr, "namespace": ns, "ownerReferences": [{
                    "apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision", "name": run.pr,
                    "uid": pr["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "provider-helm"}},
                    "template": {"metadata": {"labels": {"app": "provider-helm"}},
                        "spec": {"serviceAccountName": "provider-helm",
                            "containers": [{"name": "p", "image": package}]}}}}),
        )
        .await;
    let types = [TypeDef {
        kind: "Gadget",
        plural: "gadgets",
        namespaced: false,
    }];
    let mut inputs = vec![provider.clone(), pr.clone(), deployment];
    for crd in lineage_crds(client, CROSSPLANE, &pr, &run.pr_group, &types, true).await {
        run.created
            .lock()
            .expect("lock")
            .push((crd_ar(), None, name_of(&crd)));
        inputs.push(crd);
    }
    let provider_roles = manager_roles(
        run.dir.path(),
        &inputs,
        &rules_pointed_at_namespace(
            "crossplane-provider.yaml",
            "crossplane-provider-system",
            "deployments",
            ns,
        ),
        "provider",
    );
    assert_eq!(
        provider_roles.len(),
        4,
        "edit, view and system roles and the system binding"
    );
    made.extend(provider_roles);
    for r in made {
        let live = run.create(&ar_of(&r), None, CROSSPLANE, r.clone()).await;
        uids.push((ar_of(&r), name_of(&r), live["metadata"]["uid"].clone()));
    }
    // People: developers bound to crossplane-edit in their team's
    // namespace, a viewer bound to crossplane-view.
    for (i, t) in run.teams.iter().enumerate() {
        run.create(
            &rb_ar(),
            Some(t),
            MANAGER,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "developers", "namespace": t},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "crossplane-edit"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": run.dev(i)}]}),
        )
        .await;
    }
    run.create(
        &crb_ar(),
        None,
        MANAGER,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("{}-crossplane-view", run.viewer)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "crossplane-view"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": run.viewer}]}),
    )
    .await;
    uids
}

/// Every managed object of `before` is there with its uid, and every
/// answer is what it was.
async fn unchanged(run: &Run, before: &BTreeMap<String, String>, step: &str) {
    let now = run.inventory().await;
    let lost: Vec<_> = before
        .iter()
        .filter(|(k, uid)| now.get(*k) != Some(uid))
        .map(|(k, _)| k.clone())
        .collect();
    assert!(lost.is_empty(), "{step}: deleted or replaced: {lost:?}");
    access(&run.client, &run.questions())
        .await
        .unwrap_or_else(|e| panic!("{step}: access changed: {e}"));
    eprintln!(
        "helm-e2e: {step}: {} managed objects kept with their uids, {} answers unchanged",
        before.len(),
        run.questions().len()
    );
}

async fn rules_ready(run: &Run) {
    let rules: Api<RbacRule> = Api::all(run.client.clone());
    for file in rule_files() {
        for doc in read_yaml(&file) {
            let name = doc["metadata"]["name"].as_str().expect("name").to_string();
            eventually(format!("RbacRule {name} Ready"), async || {
                let r = rules.get(&name).await.map_err(|e| e.to_string())?;
                let ready = r.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
                if ready {
                    Ok(())
                } else {
                    Err(format!("{:?}", r.status))
                }
            })
            .await;
        }
    }
}

async fn no_rules_left(run: &Run) {
    let rules: Api<RbacRule> = Api::all(run.client.clone());
    eventually("every RbacRule gone", async || {
        let left = rules
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        if left.items.is_empty() {
            Ok(())
        } else {
            Err(format!("{} RbacRules left", left.items.len()))
        }
    })
    .await;
}

async fn diff_settles(run: &Run, adopt: bool) {
    eventually("rbac-rules diff to exit 0", async || {
        match run.diff(adopt).await {
            (0, _) => Ok(()),
            (_, out) => Err(out),
        }
    })
    .await;
}

async fn scenario(run: &Run, controller: &mut Option<Controller>) {
    let client = &run.client;
    let ns = run.ns.as_str();
    let chart_objects = setup(run).await;
    let questions = run.questions();
    eventually(
        "the access Crossplane's chart and manager give",
        async || access(client, &questions).await,
    )
    .await;
    let probe = Probe::start(client.clone(), questions.clone());
    eprintln!(
        "helm-e2e: set up: Crossplane release in {ns}, {} chart and manager objects, {} teams, {} access questions",
        chart_objects.len(),
        run.teams.len(),
        questions.len()
    );
    let chart = deploy_chart();
    let xp_chart = run
        .dir
        .path()
        .join("crossplane")
        .to_string_lossy()
        .into_owned();
    let param = format!("params.crossplaneNamespace={ns}");

    // 1. `kubectl apply -f rules/` first makes the install fail.
    let rule = &read_yaml("rules/crossplane-xrd.yaml")[0];
    let crds = read_yaml("crds/rbacrules.rbacrules.io.yaml");
    apply_crds(client, MANAGER, &crds).await;
    let rules: Api<RbacRule> = Api::all(client.clone());
    rules
        .patch(
            &name_of(rule),
            &PatchParams::apply("kubectl").force(),
            &Patch::Apply(rule),
        )
        .await
        .expect("kubectl apply a built-in rule");
    let err = run
        .helm
        .try_run(&[
            "install",
            RELEASE,
            &chart,
            "-n",
            RELEASE_NS,
            "--create-namespace",
            "--set",
            "replicas=0",
        ])
        .await
        .expect_err("helm install over a kubectl-applied rule");
    assert!(
        err.contains("cannot be imported into the current release"),
        "{err}"
    );
    rules
        .delete(&name_of(rule), &DeleteParams::default())
        .await
        .expect("delete the kubectl-applied rule");
    no_rules_left(run).await;

    // 2. Installed with nothing running (the guide's values file, the
    // image left as it is: no Pod runs here); diff.
    let values = guide_values(run.dir.path());
    let d = &values["image"];
    assert!(d.is_object(), "the guide's values set the image");
    let values_file = run.dir.path().join("migration-values.yaml");
    run.helm
        .run(&[
            "install",
            RELEASE,
            &chart,
            "-n",
            RELEASE_NS,
            "--create-namespace",
            "-f",
            &values_file.to_string_lossy(),
            "--set",
            &param,
            "--set",
            "logFormat=text",
        ])
        .await;
    let d = run.deployment().await;
    assert_eq!(d["spec"]["replicas"], 0, "the guide's install runs nothing");
    assert!(
        run.get(
            &ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk(
                    "admissionregistration.k8s.io",
                    "v1",
                    "ValidatingAdmissionPolicy"
                ),
                "validatingadmissionpolicies",
            ),
            None,
            "rbac-rules-fence"
        )
        .await
        .is_none(),
        "admissionFence=false: no fence while adopting"
    );
    let (code, out) = run.diff(true).await;
    assert_eq!(code, 1, "{out}");
    let edit_role = format!("crossplane:composite:{}:aggregate-to-edit", run.xrd);
    for line in [
        format!("adopt ClusterRole {edit_role} "),
        "adopt ClusterRole crossplane-admin ".to_string(),
        "adopt ClusterRoleBinding crossplane-admin ".to_string(),
        "create ClusterRoleBinding crossplane:rbac-rules ".to_string(),
    ] {
        assert!(out.contains(&line), "diff lacks {line:?}:\n{out}");
    }
    for (ar, name, _) in &chart_objects {
        let line = format!("prune {} {name} ", ar.kind);
        assert!(!out.contains(&line), "{out}");
    }
    let (_, out) = run.diff(false).await;
    assert!(
        out.contains("conflict ClusterRole crossplane-admin "),
        "{out}"
    );
    access(client, &questions)
        .await
        .expect("access after install");

    // 3. The RBAC manager stopped; the controller runs and adopts.
    run.api(&deploy_ar(), Some(ns))
        .patch(
            "crossplane-rbac-manager",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .expect("scale the RBAC manager to 0");
    run.helm
        .run(&[
            "upgrade",
            RELEASE,
            &chart,
            "-n",
            RELEASE_NS,
            "--reuse-values",
            "--set",
            "replicas=2",
        ])
        .await;
    *controller = Some(run.start_controller().await);
    eventually("every object adopted in place", async || {
        for (ar, name, uid) in &chart_objects {
            let o = run
                .get(ar, None, name)
                .await
                .ok_or(format!("{name} gone"))?;
            if &o["metadata"]["uid"] != uid {
                return Err(format!("{} {name} was re-created", ar.kind));
            }
            if o["metadata"]["labels"]["app.kubernetes.io/managed-by"] != "rbac-rules" {
                return Err(format!("{} {name} not adopted yet", ar.kind));
            }
            let helm = o["metadata"]["annotations"]["meta.helm.sh/release-name"].is_string();
            if helm != (o["metadata"]["annotations"][KEEP] == "keep") {
                return Err(format!(
                    "{} {name}: annotations {}",
                    ar.kind, o["metadata"]["annotations"]
                ));
            }
        }
        let b = run
            .get(&crb_ar(), None, "crossplane:rbac-rules")
            .await
            .ok_or("no crossplane:rbac-rules binding")?;
        if b["subjects"]
            != json!([{"kind": "ServiceAccount", "name": "crossplane", "namespace": ns}])
        {
            return Err(format!("crossplane:rbac-rules subjects {}", b["subjects"]));
        }
        Ok(())
    })
    .await;
    for name in ["crossplane"] {
        for ar in [cr_ar(), crb_ar()] {
            let o = run.get(&ar, None, name).await.expect("crossplane");
            assert_eq!(
                o["metadata"]["labels"]["app.kubernetes.io/managed-by"], "Helm",
                "{} crossplane stays Helm's",
                ar.kind
            );
        }
    }
    rules_ready(run).await;
    diff_settles(run, true).await;

    // 4. Adoption off, the fence back: the controller restarted with the
    // Deployment's new environment has nothing to do.
    run.helm
        .run(&[
            "upgrade",
            RELEASE,
            &chart,
            "-n",
            RELEASE_NS,
            "--reuse-values",
            "--set",
            "adoptExisting=false",
            "--set",
            "admissionFence=true",
        ])
        .await;
    let d = run.deployment().await;
    let env = &d["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        !env.to_string().contains("RBAC_RULES_ADOPT_EXISTING"),
        "adoptExisting=false: {env}"
    );
    if let Some(mut c) = controller.take() {
        c.assert_log_clean("adoption");
        c.stop();
    }
    *controller = Some(run.start_controller().await);
    rules_ready(run).await;
    diff_settles(run, false).await;

    // 5. Crossplane's chart switch: every adopted object kept.
    run.helm
        .run(&[
            "upgrade",
            XP_RELEASE,
            &xp_chart,
            "-n",
            ns,
            "--reuse-values",
            "--set",
            "rbacManager.deploy=false",
        ])
        .await;
    for (ar, name, uid) in &chart_objects {
        let o = run.get(ar, None, name).await;
        assert_eq!(
            o.as_ref().map(|o| &o["metadata"]["uid"]),
            Some(uid),
            "the chart switch deleted or replaced {} {name}",
            ar.kind
        );
    }
    assert!(
        run.get(&deploy_ar(), Some(ns), "crossplane-rbac-manager")
            .await
            .is_none(),
        "the chart switch removes the RBAC manager"
    );
    let plain = run
        .get(&cr_ar(), None, "crossplane")
        .await
        .expect("crossplane");
    assert!(plain["aggregationRule"].is_null(), "{plain}");
    diff_settles(run, false).await;
    access(client, &questions)
        .await
        .expect("access after the chart switch");
    let before = run.inventory().await;
    let c = controller.as_mut().expect("controller");
    assert_eq!(c.deletes().await, 0.0, "no DELETE so far");
    c.assert_log_clean("chart switch");

    // 6. builtinRules=false: the rules go, their objects stay.
    let n = c.reconciles().await;
    run.helm
        .run(&[
            "upgrade",
            RELEASE,
            &chart,
            "-n",
            RELEASE_NS,
            "--reuse-values",
            "--set",
            "builtinRules=false",
        ])
        .await;
    no_rules_left(run).await;
    c.passes_since(n).await;
    unchanged(run, &before, "helm upgrade --set builtinRules=false").await;
    assert_eq!(c.deletes().await, 0.0, "builtinRules=false sent DELETEs");
    c.assert_log_clean("builtinRules=false");

    // 7. helm rollback: the rules back, their objects the same.
    let n = c.reconciles().await;
    run.helm.run(&["rollback", RELEASE, "-n", RELEASE_NS]).await;
    rules_ready(run).await;
    c.passes_since(n).await;
    unchanged(run, &before, "helm rollback").await;
    diff_settles(run, false).await;
    assert_eq!(c.deletes().await, 0.0, "helm rollback sent DELETEs");

    // 7b. `kubectl delete rbacrule` of a rule of the release: the same.
    let n = c.reconciles().await;
    Api::<RbacRule>::all(client.clone())
        .delete("crossplane-namespace", &DeleteParams::default())
        .await
        .expect("kubectl delete rbacrule crossplane-namespace");
    c.passes_since(n).await;
    unchanged(run, &before, "kubectl delete rbacrule crossplane-namespace").await;
    assert_eq!(
        c.deletes().await,
        0.0,
        "kubectl delete rbacrule sent DELETEs"
    );
    c.assert_log_clean("kubectl delete rbacrule");

    // 8. helm uninstall: the same; the Pods (here: the process) stop.
    run.helm
        .run(&["uninstall", RELEASE, "-n", RELEASE_NS])
        .await;
    no_rules_left(run).await;
    eventually("the chart's Deployment gone", async || {
        match run.get(&deploy_ar(), Some(RELEASE_NS), RELEASE).await {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(c.deletes().await, 0.0, "helm uninstall sent DELETEs");
    c.stop();
    c.assert_log_clean("helm uninstall");
    unchanged(run, &before, "helm uninstall").await;
    let kept = run
        .get(&cr_ar(), None, "crossplane-admin")
        .await
        .expect("kept");
    assert_eq!(kept["metadata"]["annotations"][KEEP], "keep");

    // 9. The migration rolled back: the chart's objects given back to Helm,
    // the RBAC manager on again. Helm refuses them while they say
    // managed-by=rbac-rules.
    let deploy_again = [
        "upgrade",
        XP_RELEASE,
        &xp_chart,
        "-n",
        ns,
        "--reuse-values",
        "--set",
        "rbacManager.deploy=true",
    ];
    let err = run
        .helm
        .try_run(&deploy_again)
        .await
        .expect_err("Helm takes no object labelled managed-by=rbac-rules");
    assert!(err.contains("invalid ownership metadata"), "{err}");
    for o in read_yaml("tests/data/crossplane-chart-v2.3.4.yaml") {
        run.api(&ar_of(&o), None)
            .patch(
                &name_of(&o),
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": "Helm"}}}),
                ),
            )
            .await
            .unwrap_or_else(|e| panic!("label {} Helm's: {e}", name_of(&o)));
    }
    // `helm rollback` to the deploy=true revision is no way back: Helm 3.8
    // refuses objects the current revision does not hold ("no ClusterRole
    // with the name ... found"), so the guide upgrades instead.
    match run
        .helm
        .try_run(&["rollback", XP_RELEASE, "1", "-n", ns])
        .await
    {
        Ok(_) => eprintln!("helm-e2e: helm rollback crossplane 1 worked with this helm"),
        Err(e) => {
            assert!(e.contains("no ClusterRole with the name"), "{e}");
            run.helm.run(&deploy_again).await;
        }
    }
    for (ar, name, uid) in &chart_objects {
        let o = run.get(ar, None, name).await;
        assert_eq!(
            o.as_ref().map(|o| &o["metadata"]["uid"]),
            Some(uid),
            "the rollback deleted or replaced {} {name}",
            ar.kind
        );
    }
    let crossplane = run
        .get(&cr_ar(), None, "crossplane")
        .await
        .expect("crossplane");
    assert!(crossplane["aggregationRule"].is_object(), "{crossplane}");
    eventually("access after the rollback", async || {
        access(client, &questions).await
    })
    .await;

    let (rounds, wrong) = probe.finish().await;
    eprintln!(
        "helm-e2e: access probe: {rounds} rounds of {} questions, {} wrong",
        questions.len(),
        wrong.len()
    );
    assert!(rounds > 0);
    assert!(
        wrong.is_empty(),
        "access changed during the Helm path:\n{}",
        wrong.join("\n")
    );
}

/// The values file of the guide's Helm path (the YAML block starting
/// `# migration-values.yaml` in docs/migrating-from-crossplane.md), written
/// to `dir/migration-values.yaml`; its values, checked to be the
/// migration's.
fn guide_values(dir: &Path) -> Value {
    let doc = std::fs::read_to_string(root().join("docs/migrating-from-crossplane.md"))
        .expect("read the guide");
    let start = doc
        .find("```yaml\n# migration-values.yaml\n")
        .expect("the guide's values file")
        + "```yaml\n".len();
    let len = doc[start..]
        .find("```")
        .expect("the end of the values file");
    let text = &doc[start..start + len];
    std::fs::write(dir.join("migration-values.yaml"), text).expect("write the values file");
    let values: Value = serde_saphyr::from_str(text).expect("the guide's values are YAML");
    assert_eq!(values["replicas"], 0, "{text}");
    assert_eq!(values["adoptExisting"], true, "{text}");
    assert_eq!(values["admissionFence"], false, "{text}");
    values
}

/// The chart's directory.
fn deploy_chart() -> String {
    root()
        .join("deploy/helm/rbac-rules")
        .to_string_lossy()
        .into_owned()
}
