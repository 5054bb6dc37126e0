//! `bench --kubeconfig PATH`: the controller phases against a real API
//! server, with the same report keys as the stand-in's where they exist.
//!
//! 1. installs what the scenario needs (server-side apply, idempotent): the
//!    RbacRule CRD, stand-in CRDs of the trigger kinds
//!    (`tests/e2e/stand-in-crds.yaml`), the built-in rules, and the
//!    scenario's objects, owners first: a dependent's ownerReference takes
//!    its owner's real uid (the garbage collector deletes dependents of
//!    absent uids), and the revisions' objectRefs go through `/status`;
//! 2. renders the objects as they are live (real uids): the outputs to
//!    expect, and the objects `kubectl` applies in step 5;
//! 3. runs `rbac-rules run` (the binary beside it, the kubeconfig, leader election
//!    off) and times it until every expected output is on the server;
//!    then a resync, a forced relist (`--relist-command`, e.g. restarting
//!    the API server), namespace changes, and a restart of the controller.
//!    Writes come from the controller's `rbac_rules_api_writes_total`, and
//!    are cross-checked with the outputs' resourceVersions; peak RSS is
//!    VmHWM of the child;
//! 4. stops the controller and deletes the outputs;
//! 5. applies the same outputs with `--kubectl-parallel` concurrent
//!    `kubectl apply --server-side` processes and times them.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser as _;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

use super::synth::{ChangeKind, Names, Plane, Versions};
use super::{BenchArgs, BenchError, Controller, RESYNC, memory_mib, ms, passes, progress};

/// Field manager of everything the bench installs.
const MANAGER: &str = "rbac-rules-bench";
/// Field manager of the `kubectl` comparison.
const KUBECTL_MANAGER: &str = "rbac-rules-bench-kubectl";
/// Requests in flight while installing the scenario.
const INSTALL_PARALLEL: usize = 16;
/// The stand-in CRDs of the kinds the built-in rules trigger on.
const STAND_INS: &str = include_str!("../../tests/e2e/stand-in-crds.yaml");
/// Their marker label: a CRD of those names without it is a real one.
const STAND_IN_LABEL: &str = "rbacrules.io/e2e-stand-in";

fn other(e: impl std::fmt::Display) -> BenchError {
    BenchError::Other(e.to_string())
}

/// A client of the kubeconfig's current context.
async fn client(path: &Path) -> Result<kube::Client, BenchError> {
    let kc = Kubeconfig::read_from(path)
        .map_err(|e| BenchError::Other(format!("kubeconfig {}: {e}", path.display())))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| BenchError::Other(format!("kubeconfig {}: {e}", path.display())))?;
    kube::Client::try_from(config).map_err(other)
}

/// The API resource of an object's apiVersion and kind.
fn resource(obj: &Value, names: &Names) -> Result<ApiResource, BenchError> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind = obj["kind"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let plural = match kind {
        k if k == names.revision.kind => names.revision.plural.clone(),
        k if k == names.definition.kind => names.definition.plural.clone(),
        k if k == names.package.kind => names.package.plural.clone(),
        "Namespace" | "Deployment" | "CustomResourceDefinition" | "RbacRule" => {
            format!("{}s", kind.to_lowercase())
        }
        other => {
            return Err(BenchError::Other(format!(
                "the bench does not install objects of kind {other}"
            )));
        }
    };
    Ok(ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, kind),
        &plural,
    ))
}

/// Server-side applies `obj` (and its `status` through `/status`, which
/// the API server ignores on the object itself); returns the live uid.
async fn apply(client: &kube::Client, names: &Names, obj: &Value) -> Result<String, BenchError> {
    let ar = resource(obj, names)?;
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let pp = PatchParams::apply(MANAGER).force();
    let what = |e: kube::Error| BenchError::Other(format!("apply {} {name}: {e}", ar.kind));
    let live = api
        .patch(name, &pp, &Patch::Apply(obj))
        .await
        .map_err(what)?;
    if let Some(status) = obj.get("status") {
        let body = json!({"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                          "metadata": {"name": name}, "status": status});
        api.patch_status(name, &pp, &Patch::Apply(&body))
            .await
            .map_err(what)?;
    }
    live.metadata
        .uid
        .ok_or_else(|| BenchError::Other(format!("{} {name} has no uid", ar.kind)))
}

/// A generated object as it is written to a real server: no uid or
/// resourceVersion (the server's own), owners' uids as `uids` maps them,
/// and what the API server requires of a Deployment (a selector, a
/// container; no replicas: no pod is wanted).
pub fn for_server(obj: &Value, uids: &HashMap<String, String>) -> Value {
    let mut o = obj.clone();
    if let Some(meta) = o["metadata"].as_object_mut() {
        meta.remove("uid");
        meta.remove("resourceVersion");
        // The API server dates each object as it creates it.
        meta.remove("creationTimestamp");
    }
    map_owner_uids(&mut o, uids);
    if o["kind"] == "Deployment" {
        let name = o["metadata"]["name"].clone();
        let labels = json!({"app": name});
        o["spec"]["replicas"] = json!(0);
        o["spec"]["selector"] = json!({"matchLabels": labels});
        o["spec"]["template"]["metadata"] = json!({"labels": labels});
        o["spec"]["template"]["spec"]["containers"] =
            json!([{"name": "package", "image": "registry.example.org/package:v1"}]);
    }
    o
}

/// Rewrites the uids of `obj`'s ownerReferences that `uids` maps.
fn map_owner_uids(obj: &mut Value, uids: &HashMap<String, String>) {
    if let Some(refs) = obj["metadata"]["ownerReferences"].as_array_mut() {
        for r in refs {
            if let Some(uid) = r["uid"].as_str().and_then(|u| uids.get(u)) {
                r["uid"] = json!(uid);
            }
        }
    }
}

/// A generated object as it is live: its own and its owners' uids real.
fn as_live(obj: &Value, uids: &HashMap<String, String>) -> Value {
    let mut o = obj.clone();
    if let Some(uid) = o["metadata"]["uid"].as_str().and_then(|u| uids.get(u)) {
        o["metadata"]["uid"] = json!(uid);
    }
    map_owner_uids(&mut o, uids);
    o
}

/// Applies `objs` with at most [`INSTALL_PARALLEL`] in flight; records
/// each generated uid's live uid in `uids`.
async fn apply_all(
    client: &kube::Client,
    names: &Names,
    objs: &[Value],
    uids: &mut HashMap<String, String>,
) -> Result<(), BenchError> {
    let known = &*uids;
    let done: Vec<(Option<String>, String)> = futures::stream::iter(objs)
        .map(|o| async move {
            let live = apply(client, names, &for_server(o, known)).await?;
            Ok::<_, BenchError>((o["metadata"]["uid"].as_str().map(str::to_string), live))
        })
        .buffer_unordered(INSTALL_PARALLEL)
        .try_collect()
        .await?;
    for (generated, live) in done {
        if let Some(g) = generated {
            uids.insert(g, live);
        }
    }
    Ok(())
}

/// Waits until the CRD `name` is established.
async fn established(client: &kube::Client, name: &str) -> Result<(), BenchError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let crd = api.get(name).await.map_err(other)?;
        let ok = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::Other(format!("CRD {name} not established")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The RbacRule CRD, the stand-ins, the built-in rules and the system
/// namespace. Refuses a cluster with real CRDs of the stand-ins' names.
async fn install_base(client: &kube::Client, names: &Names) -> Result<(), BenchError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let stand_ins = rbac_rules::yaml::parse_documents(Path::new("stand-in-crds.yaml"), STAND_INS)
        .map_err(other)?;
    let ours = rbac_rules::yaml::parse_documents(
        Path::new("rbacrules.yaml"),
        &rbac_rules::crd_yaml().map_err(other)?,
    )
    .map_err(other)?;
    for d in &stand_ins {
        let name = d.value["metadata"]["name"].as_str().unwrap_or_default();
        if let Some(live) = crds.get_opt(name).await.map_err(other)? {
            let marked = live
                .metadata
                .labels
                .and_then(|l| l.get(STAND_IN_LABEL).cloned())
                .is_some_and(|v| v == "true");
            if !marked {
                return Err(BenchError::Other(format!(
                    "CRD {name} exists and is not the bench's stand-in (the real system?): \
                     the bench wants a throwaway cluster"
                )));
            }
        }
    }
    for d in ours.iter().chain(&stand_ins) {
        apply(client, names, &d.value).await?;
    }
    for d in ours.iter().chain(&stand_ins) {
        established(
            client,
            d.value["metadata"]["name"].as_str().unwrap_or_default(),
        )
        .await?;
    }
    for (file, text) in rbac_rules::rules::BUILTIN {
        for d in rbac_rules::yaml::parse_documents(Path::new(file), text).map_err(other)? {
            apply(client, names, &d.value).await?;
        }
    }
    apply(
        client,
        names,
        &json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": names.system_namespace}}),
    )
    .await?;
    Ok(())
}

/// The label selector of the controller's outputs.
fn managed() -> ListParams {
    ListParams::default().labels(&format!(
        "{}={}",
        rbac_rules::engine::output::MANAGED_BY_LABEL,
        rbac_rules::engine::output::MANAGED_BY_VALUE
    ))
}

/// Every managed output on the server: (kind, namespace, name) to
/// resourceVersion. Metadata only.
async fn outputs(client: &kube::Client) -> Result<BTreeMap<String, String>, BenchError> {
    let mut out = BTreeMap::new();
    let lp = managed();
    macro_rules! collect {
        ($t:ty, $kind:literal) => {
            for o in Api::<$t>::all(client.clone())
                .list_metadata(&lp)
                .await
                .map_err(other)?
            {
                let m = o.metadata;
                out.insert(
                    format!(
                        "{}/{}/{}",
                        $kind,
                        m.namespace.unwrap_or_default(),
                        m.name.unwrap_or_default()
                    ),
                    m.resource_version.unwrap_or_default(),
                );
            }
        };
    }
    collect!(ClusterRole, "ClusterRole");
    collect!(ClusterRoleBinding, "ClusterRoleBinding");
    collect!(Role, "Role");
    collect!(RoleBinding, "RoleBinding");
    Ok(out)
}

/// Outputs added, removed or rewritten between two snapshots.
fn changed(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> usize {
    after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .count()
        + before.keys().filter(|k| !after.contains_key(*k)).count()
}

/// The controller's writes by `kind/action`, from its metrics text
/// (`rbac_rules_api_writes_total`).
pub fn writes_by_kind(metrics: &str) -> BTreeMap<String, u64> {
    let label = |labels: &str, key: &str| {
        let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
        let len = labels[start..].find('"')?;
        Some(labels[start..start + len].to_string())
    };
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("rbac_rules_api_writes_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let (Some(kind), Some(action), Ok(n)) = (
            label(labels, "kind"),
            label(labels, "action"),
            value.trim().parse::<f64>(),
        ) else {
            continue;
        };
        *out.entry(format!("{kind}/{action}")).or_insert(0) += n as u64;
    }
    out
}

/// RBAC writes (applies and deletes) in the controller's metrics text.
pub fn rbac_writes(metrics: &str) -> u64 {
    writes_by_kind(metrics)
        .iter()
        .filter(|(k, _)| {
            let (kind, action) = k.split_once('/').unwrap_or_default();
            ["ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"].contains(&kind)
                && ["apply", "delete"].contains(&action)
        })
        .map(|(_, n)| n)
        .sum()
}

/// `rbac-rules run` as a child, killed when dropped.
struct Run {
    ctl: Controller,
}

impl Run {
    fn start(kubeconfig: &Path, extra: &[String]) -> Result<Run, BenchError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| BenchError::Other(format!("no free port: {e}")))?
            .port();
        let metrics = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(super::rbac_rules_exe()?);
        cmd.args([
            "run".to_string(),
            "--leader-election=false".into(),
            format!("--metrics-address={metrics}"),
            format!("--resync-seconds={}", RESYNC.as_secs()),
            "--identity=bench".into(),
        ])
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        let child = cmd
            .spawn()
            .map_err(|e| BenchError::Other(format!("cannot start the controller: {e}")))?;
        Ok(Run {
            ctl: Controller { child, metrics },
        })
    }

    fn pid(&self) -> String {
        self.ctl.child.id().to_string()
    }

    async fn writes(&self) -> Option<u64> {
        Some(rbac_writes(&self.ctl.get("/metrics").await?))
    }

    async fn writes_by_kind(&self) -> Value {
        match self.ctl.get("/metrics").await {
            Some(text) => json!(writes_by_kind(&text)),
            None => Value::Null,
        }
    }

    /// Waits until the write count stays still for `quiet`; the count.
    async fn settle(&mut self, quiet: Duration, deadline: Instant) -> u64 {
        let mut last = self.writes().await.unwrap_or(0);
        let mut since = Instant::now();
        while Instant::now() < deadline && !self.ctl.exited() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = self.writes().await.unwrap_or(last);
            if now != last {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= quiet {
                break;
            }
        }
        last
    }

    /// Stops it (SIGTERM, then SIGKILL after 10 s); its peak RSS.
    async fn stop(mut self) -> Option<f64> {
        let peak = memory_mib(&self.pid(), "VmHWM");
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid()])
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.ctl.exited() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        peak
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if !self.ctl.exited() {
            let _ = self.ctl.child.kill();
        }
        let _ = self.ctl.child.wait();
    }
}

/// Runs a shell command (the forced relist); fails on a non-zero status.
fn shell(cmd: &str) -> Result<(), BenchError> {
    let status = Command::new("sh")
        .args(["-c", cmd])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| BenchError::Other(format!("{cmd}: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(BenchError::Other(format!("{cmd}: {status}")))
    }
}

/// Waits until the API server answers again.
async fn server_back(client: &kube::Client, deadline: Instant) -> bool {
    while Instant::now() < deadline {
        if client.apiserver_version().await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}

/// Namespaces of e2e runs (label `rbacrules.io/e2e`): another controller
/// may be writing there, and for the bench's objects too.
async fn e2e_namespaces(client: &kube::Client) -> usize {
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .list_metadata(&ListParams::default().labels("rbacrules.io/e2e"))
        .await
        .map_or(0, |l| l.items.len())
}

/// Deletes every managed output; waits until none is left.
async fn delete_outputs(client: &kube::Client) -> Result<(), BenchError> {
    let lp = managed();
    let dp = DeleteParams::background();
    Api::<ClusterRoleBinding>::all(client.clone())
        .delete_collection(&dp, &lp)
        .await
        .map_err(other)?;
    Api::<ClusterRole>::all(client.clone())
        .delete_collection(&dp, &lp)
        .await
        .map_err(other)?;
    let namespaces: std::collections::BTreeSet<String> = outputs(client)
        .await?
        .keys()
        .filter_map(|k| k.split('/').nth(1).filter(|ns| !ns.is_empty()))
        .map(str::to_string)
        .collect();
    let (dp, lp) = (&dp, &lp);
    futures::stream::iter(&namespaces)
        .map(|ns| async move {
            Api::<RoleBinding>::namespaced(client.clone(), ns)
                .delete_collection(dp, lp)
                .await
                .map_err(other)?;
            Api::<Role>::namespaced(client.clone(), ns)
                .delete_collection(dp, lp)
                .await
                .map_err(other)?;
            Ok::<_, BenchError>(())
        })
        .buffer_unordered(INSTALL_PARALLEL)
        .try_collect::<()>()
        .await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !outputs(client).await?.is_empty() {
        if Instant::now() > deadline {
            return Err(BenchError::Other(
                "managed outputs left after delete".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// `parallel` concurrent `kubectl apply --server-side` of `objects`
/// (dealt round-robin, so each file keeps roles before bindings); the
/// wall time.
fn kubectl_apply(
    kubeconfig: &Path,
    dir: &Path,
    objects: &[Value],
    parallel: usize,
) -> Result<Duration, BenchError> {
    let parallel = parallel.max(1);
    let mut files = Vec::new();
    for i in 0..parallel {
        let chunk: Vec<Value> = objects.iter().skip(i).step_by(parallel).cloned().collect();
        if chunk.is_empty() {
            continue;
        }
        let path = dir.join(format!("kubectl-{i}.yaml"));
        let text = rbac_rules::yaml::to_yaml_stream(&chunk).map_err(other)?;
        std::fs::write(&path, text).map_err(|source| BenchError::Write {
            path: path.display().to_string(),
            source,
        })?;
        files.push(path);
    }
    let started = Instant::now();
    let children = files
        .iter()
        .map(|f| {
            Command::new("kubectl")
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .args(["apply", "--server-side", "--force-conflicts"])
                .arg(format!("--field-manager={KUBECTL_MANAGER}"))
                .arg("-f")
                .arg(f)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| BenchError::Other(format!("cannot run kubectl: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut failed = 0;
    for mut c in children {
        if !c.wait().is_ok_and(|s| s.success()) {
            failed += 1;
        }
    }
    let took = started.elapsed();
    if failed > 0 {
        return Err(BenchError::Other(format!("{failed} kubectl apply failed")));
    }
    Ok(took)
}

/// `render`'s arguments alone, parsed from a command line and the
/// environment.
#[derive(clap::Parser)]
struct RenderCli {
    #[command(flatten)]
    render: rbac_rules::render::RenderArgs,
}

/// The scenario's objects as they are live, rendered with the built-in
/// rules: the outputs to expect.
fn render_live(dir: &Path, live: &[Value]) -> Result<Vec<Value>, BenchError> {
    let path = dir.join("live-objects.yaml");
    let text = rbac_rules::yaml::to_yaml_stream(live).map_err(other)?;
    std::fs::write(&path, text).map_err(|source| BenchError::Write {
        path: path.display().to_string(),
        source,
    })?;
    // Parsed as `rbac-rules render` parses its command line, so that the
    // `RBAC_RULES_MAX_*` limits in the environment apply here as they do to
    // the controller (which inherits it).
    let args = RenderCli::try_parse_from([
        OsStr::new("render"),
        OsStr::new("--objects"),
        path.as_os_str(),
    ])
    .map_err(other)?
    .render;
    let rendered = rbac_rules::render::prepare(&args)?;
    let mut out = Vec::new();
    rendered.write_to(&mut out).map_err(other)?;
    let out = String::from_utf8(out).map_err(other)?;
    Ok(rbac_rules::yaml::parse_documents(Path::new("render"), &out)
        .map_err(other)?
        .into_iter()
        .map(|d| d.value)
        .collect())
}

/// Seconds of patience for the controller on a real server.
fn patience(plane: &Plane<'_>) -> Duration {
    2 * super::patience(&plane.sizes)
}

/// The controller phases against the server of `kubeconfig`.
pub(super) async fn controller_phases(
    args: &BenchArgs,
    kubeconfig: &Path,
    plane: &Plane<'static>,
) -> Result<Value, BenchError> {
    let names = plane.names;
    let client = client(kubeconfig).await?;
    let version = client.apiserver_version().await.map_err(other)?;
    let dir = tempfile_dir()?;
    let others = e2e_namespaces(&client).await;
    if others > 0 {
        progress(&format!(
            "warning: {others} e2e namespaces on the server: an e2e run's controller may write too"
        ));
    }

    progress("real server: installing CRDs, rules and the scenario's objects");
    let started = Instant::now();
    install_base(&client, names).await?;
    let mut versions = Versions::default();
    let objects = plane.objects(&mut versions);
    let is = |o: &Value, k: &str| o["kind"] == k;
    // Packages first: their revisions' ownerReferences name their uids,
    // and the API server dates each object as it is created (a CRD must
    // be no older than its package or XRD).
    let (packages, objects): (Vec<Value>, Vec<Value>) = objects
        .into_iter()
        .partition(|o| is(o, &names.package.kind));
    let (owners, rest): (Vec<Value>, Vec<Value>) = objects
        .into_iter()
        .partition(|o| is(o, &names.revision.kind) || is(o, &names.definition.kind));
    let (crds, rest): (Vec<Value>, Vec<Value>) = rest
        .into_iter()
        .partition(|o| is(o, "CustomResourceDefinition"));
    let mut uids = HashMap::new();
    apply_all(&client, names, &packages, &mut uids).await?;
    apply_all(&client, names, &owners, &mut uids).await?;
    apply_all(&client, names, &rest, &mut uids).await?;
    let crds_started = Instant::now();
    apply_all(&client, names, &crds, &mut uids).await?;
    let crds_ms = ms(crds_started.elapsed());
    let setup_ms = ms(started.elapsed());
    let live: Vec<Value> = packages
        .iter()
        .chain(&owners)
        .chain(&rest)
        .chain(&crds)
        .map(|o| as_live(o, &uids))
        .collect();
    let expected = render_live(&dir, &live)?;
    drop(live);
    let objects_out = expected.len();
    let quiet = Duration::from_secs(3);
    // Outputs of an earlier run: the initial sync then writes what differs.
    let leftover = outputs(&client).await?.len();

    progress(&format!(
        "real server: controller initial sync ({objects_out} outputs expected, {leftover} present)"
    ));
    let started = Instant::now();
    let mut run = Run::start(kubeconfig, &args.controller_arg)?;
    let deadline = Instant::now() + patience(plane);
    let mut synced = false;
    while !run.ctl.exited() && Instant::now() < deadline {
        // The metrics gate the (heavier) list of outputs.
        let wrote = run.writes().await.unwrap_or(0) as usize;
        if wrote + leftover >= objects_out && outputs(&client).await?.len() >= objects_out {
            synced = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let initial_sync_ms = ms(started.elapsed());
    let initial = run.settle(quiet, deadline).await;
    let initial_by_kind = run.writes_by_kind().await;
    let rss_after_sync = memory_mib(&run.pid(), "VmRSS");
    let peak_after_sync = memory_mib(&run.pid(), "VmHWM");
    if !synced {
        progress("real server: the initial sync did not reach objects_out");
    }
    let snapshot = outputs(&client).await?;

    progress("real server: resync (timer)");
    passes(&mut run.ctl, 2, Instant::now() + Duration::from_secs(60)).await;
    let resynced = run.settle(quiet, Instant::now() + patience(plane)).await;

    let mut relist_writes = Value::Null;
    let mut relisted = resynced;
    if let Some(cmd) = &args.relist_command {
        progress(&format!("real server: forced relist: {cmd}"));
        // A loaded machine may miss the testbed's start-up deadline once
        // (up.sh then stops what it started): the command is run again.
        if let Err(e) = shell(cmd) {
            progress(&format!(
                "real server: the relist command failed ({e}); once more"
            ));
            shell(cmd)?;
        }
        let deadline = Instant::now() + Duration::from_secs(180);
        if !server_back(&client, deadline).await {
            return Err(BenchError::Other(
                "the API server is not back after the relist command".into(),
            ));
        }
        // Long enough for the watches to fail, back off and relist.
        tokio::time::sleep(Duration::from_secs(15)).await;
        passes(&mut run.ctl, 2, deadline).await;
        relisted = run.settle(quiet, Instant::now() + patience(plane)).await;
        relist_writes = json!(relisted - resynced);
    }
    let after_resync = outputs(&client).await?;
    let peak_after_relist = memory_mib(&run.pid(), "VmHWM");

    progress("real server: namespace annotation changes");
    let mut per_change = 0;
    let mut before = relisted;
    for i in 0..5 {
        for o in plane.change(ChangeKind::NamespaceAnnotation, i, &mut versions) {
            apply(&client, names, &for_server(&o, &uids)).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while run.writes().await.unwrap_or(0) <= before
            && Instant::now() < deadline
            && !run.ctl.exited()
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let after = run.settle(quiet, deadline).await;
        per_change = per_change.max(after - before);
        before = after;
    }
    let first_peak = run.stop().await;
    let before_restart = outputs(&client).await?;

    progress("real server: restart over the same state");
    let mut run = Run::start(kubeconfig, &args.controller_arg)?;
    let deadline = Instant::now() + patience(plane);
    super::wait_until(&mut run.ctl, deadline, async |c| c.ready().await).await;
    passes(&mut run.ctl, 2, deadline).await;
    let restarted = run.settle(quiet, deadline).await;
    let after_restart = outputs(&client).await?;
    let second_peak = run.stop().await;

    let mut report = json!({
        "controller_args": args.controller_arg,
        "claims_per_namespace": plane.sizes.accepted_per_namespace,
        "namespaces": plane.sizes.namespaces,
        "server": {"kind": "real", "version": version.git_version,
                   "kubeconfig": kubeconfig.display().to_string(),
                   "e2e_namespaces_present": others},
        "objects_out_live": objects_out,
        "setup_ms": setup_ms,
        "setup_crds_ms": crds_ms,
        "initial_sync_writes": initial,
        "initial_sync_writes_by_kind": initial_by_kind,
        "initial_sync_ms": initial_sync_ms,
        "initial_sync_complete": synced,
        "resync_writes": relisted - initial,
        "resync_outputs_changed": changed(&snapshot, &after_resync),
        "relist_command": args.relist_command,
        "relist_writes": relist_writes,
        "writes_per_namespace_change": per_change,
        "restart_writes": restarted,
        "restart_outputs_changed": changed(&before_restart, &after_restart),
        "controller_peak_rss_mib": first_peak,
        "controller_peak_rss_after_sync_mib": peak_after_sync,
        "controller_peak_rss_after_relist_mib": peak_after_relist,
        "controller_restart_peak_rss_mib": second_peak,
        "controller_rss_after_sync_mib": rss_after_sync,
        "writes_source": "rbac_rules_api_writes_total (RBAC kinds, apply and delete) of the controller's /metrics; *_outputs_changed: managed outputs whose resourceVersion changed",
    });

    if args.kubectl_parallel > 0 {
        progress("real server: deleting the outputs for the kubectl comparison");
        delete_outputs(&client).await?;
        progress(&format!(
            "real server: {}-way kubectl apply --server-side of {objects_out} outputs",
            args.kubectl_parallel
        ));
        let took = kubectl_apply(kubeconfig, &dir, &expected, args.kubectl_parallel)?;
        let applied = outputs(&client).await?.len();
        let kubectl_ms = ms(took);
        report["kubectl_parallel"] = json!(args.kubectl_parallel);
        report["kubectl_apply_ms"] = json!(kubectl_ms);
        report["kubectl_outputs_present"] = json!(applied);
        if kubectl_ms > 0.0 {
            report["initial_sync_over_kubectl"] =
                json!((initial_sync_ms / kubectl_ms * 100.0).round() / 100.0);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report)
}

/// A fresh temporary directory.
fn tempfile_dir() -> Result<PathBuf, BenchError> {
    let dir = std::env::temp_dir().join(format!(
        "rbac-rules-bench-real-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::Scenario;

    fn plane() -> Plane<'static> {
        Plane {
            names: Names::builtin().expect("names"),
            sizes: Scenario::Small.sizes(),
        }
    }

    #[test]
    fn objects_for_a_server_carry_live_owner_uids_and_no_server_fields() {
        let pl = plane();
        let objs = pl.objects(&mut Versions::default());
        let dep = objs
            .iter()
            .find(|o| o["kind"] == "Deployment")
            .expect("a Deployment");
        let owner = dep["metadata"]["ownerReferences"][0]["uid"]
            .as_str()
            .expect("owner uid")
            .to_string();
        let uids = HashMap::from([(owner, "live-uid".to_string())]);
        let out = for_server(dep, &uids);
        assert_eq!(out["metadata"]["ownerReferences"][0]["uid"], "live-uid");
        assert!(out["metadata"].get("uid").is_none());
        assert!(out["metadata"].get("resourceVersion").is_none());
        // What apps/v1 validation requires; no pod wanted.
        assert_eq!(out["spec"]["replicas"], 0);
        let labels = &out["spec"]["selector"]["matchLabels"];
        assert_eq!(&out["spec"]["template"]["metadata"]["labels"], labels);
        assert!(out["spec"]["template"]["spec"]["containers"][0]["image"].is_string());
        // The field the rules read stays.
        assert_eq!(
            out["spec"]["template"]["spec"]["serviceAccountName"],
            dep["spec"]["template"]["spec"]["serviceAccountName"]
        );
        // A CRD keeps its spec; only its owner's uid changes.
        let crd = objs
            .iter()
            .find(|o| o["kind"] == "CustomResourceDefinition")
            .expect("a CRD");
        let out = for_server(crd, &HashMap::new());
        assert_eq!(out["spec"], crd["spec"]);
        assert_eq!(
            out["metadata"]["ownerReferences"],
            crd["metadata"]["ownerReferences"]
        );
    }

    #[test]
    fn live_objects_take_their_own_and_their_owners_uids() {
        let pl = plane();
        let objs = pl.objects(&mut Versions::default());
        let crd = objs
            .iter()
            .find(|o| o["kind"] == "CustomResourceDefinition")
            .expect("a CRD");
        let own = crd["metadata"]["uid"].as_str().expect("uid").to_string();
        let owner = crd["metadata"]["ownerReferences"][0]["uid"]
            .as_str()
            .expect("owner uid")
            .to_string();
        let uids = HashMap::from([(own, "a".to_string()), (owner, "b".to_string())]);
        let live = as_live(crd, &uids);
        assert_eq!(live["metadata"]["uid"], "a");
        assert_eq!(live["metadata"]["ownerReferences"][0]["uid"], "b");
    }

    #[test]
    fn every_generated_kind_has_a_resource() {
        let pl = plane();
        for o in pl.objects(&mut Versions::default()) {
            let ar = resource(&o, pl.names).expect("resource");
            assert_eq!(ar.kind, o["kind"].as_str().expect("kind"));
            assert_eq!(
                ar.api_version,
                o["apiVersion"].as_str().expect("apiVersion")
            );
        }
        let ns = resource(&json!({"apiVersion": "v1", "kind": "Namespace"}), pl.names)
            .expect("namespace");
        assert_eq!((ns.group.as_str(), ns.plural.as_str()), ("", "namespaces"));
        assert!(resource(&json!({"apiVersion": "v1", "kind": "Pod"}), pl.names).is_err());
    }

    #[test]
    fn rbac_writes_sums_rbac_applies_and_deletes_only() {
        let text = "# HELP x\n\
            rbac_rules_api_writes_total{kind=\"ClusterRole\",action=\"apply\"} 5\n\
            rbac_rules_api_writes_total{kind=\"Role\",action=\"delete\"} 2\n\
            rbac_rules_api_writes_total{kind=\"RbacRule\",action=\"status\"} 7\n\
            rbac_rules_api_writes_total{kind=\"RoleBinding\",action=\"status\"} 1\n\
            rbac_rules_reconciles_total 3\n";
        assert_eq!(rbac_writes(text), 7);
        assert_eq!(rbac_writes("rbac_rules_reconciles_total 3\n"), 0);
        let by = writes_by_kind(text);
        assert_eq!(by.get("RbacRule/status"), Some(&7));
        assert_eq!(by.get("ClusterRole/apply"), Some(&5));
        assert_eq!(by.len(), 4);
    }

    #[test]
    fn changed_counts_rewritten_added_and_removed() {
        let a: BTreeMap<String, String> = [("x", "1"), ("y", "2"), ("z", "3")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut b = a.clone();
        assert_eq!(changed(&a, &b), 0);
        b.insert("y".into(), "9".into());
        b.remove("z");
        b.insert("w".into(), "1".into());
        assert_eq!(changed(&a, &b), 3);
    }
}
