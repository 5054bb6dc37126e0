//! Helpers shared by the end-to-end suites (`tests/e2e.rs`,
//! `tests/e2e_migration.rs`): paths, YAML, run names, API resources and
//! polling.

use std::fmt::Display;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read as _, Seek as _};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, GroupVersionKind, Patch, PatchParams};
use rbac_rules::api::RbacRule;
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Longest wait for anything to happen.
pub const TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between two probes.
pub const POLL: Duration = Duration::from_millis(500);

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn read_yaml(rel: &str) -> Vec<Value> {
    let path = root().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {rel}: {e}"));
    rbac_rules::yaml::parse_documents(&path, &text)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|d| d.value)
        .collect()
}

pub fn rule_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(root().join("rules"))
        .expect("read rules/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| format!("rules/{}", p.file_name().expect("name").to_string_lossy()))
        .collect();
    files.sort();
    files
}

/// A short random suffix for this run's names.
pub fn suffix() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.write_u32(std::process::id());
    format!("{:08x}", h.finish() as u32)
}

pub fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

pub fn xrd_ar() -> ApiResource {
    ar(
        "apiextensions.crossplane.io",
        "v1",
        "CompositeResourceDefinition",
        "compositeresourcedefinitions",
    )
}

/// Crossplane's Provider (a stand-in CRD in tests): it controls its
/// revisions, and dates their CRDs.
pub fn provider_ar() -> ApiResource {
    ar("pkg.crossplane.io", "v1", "Provider", "providers")
}

pub fn pr_ar() -> ApiResource {
    ar(
        "pkg.crossplane.io",
        "v1",
        "ProviderRevision",
        "providerrevisions",
    )
}

pub fn cr_ar() -> ApiResource {
    ApiResource::erase::<ClusterRole>(&())
}

pub fn crb_ar() -> ApiResource {
    ApiResource::erase::<ClusterRoleBinding>(&())
}

pub fn role_ar() -> ApiResource {
    ApiResource::erase::<Role>(&())
}

pub fn rb_ar() -> ApiResource {
    ApiResource::erase::<RoleBinding>(&())
}

pub fn ns_ar() -> ApiResource {
    ApiResource::erase::<Namespace>(&())
}

pub fn deploy_ar() -> ApiResource {
    ApiResource::erase::<Deployment>(&())
}

/// Polls `probe` until it returns Ok, for at most [`TIMEOUT`].
pub async fn eventually<T>(
    what: impl Display,
    mut probe: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let last = match probe().await {
            Ok(v) => return v,
            Err(e) => e,
        };
        assert!(
            Instant::now() < deadline,
            "timed out after {TIMEOUT:?} waiting for {what}: {last}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Applies `crds` with field manager `manager` and waits until each is
/// established.
pub async fn apply_crds(client: &Client, manager: &str, crds: &[Value]) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        let name = crd["metadata"]["name"].as_str().expect("name").to_string();
        api.patch(
            &name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(crd),
        )
        .await
        .unwrap_or_else(|e| panic!("apply CRD {name}: {e}"));
        eventually(format!("CRD {name} to be established"), async || {
            let c = api.get(&name).await.map_err(|e| e.to_string())?;
            let established = c
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                Ok(())
            } else {
                Err("not established".into())
            }
        })
        .await;
    }
}

/// Applies the built-in rules (`rules/*.yaml`) with field manager `manager`.
pub async fn apply_builtin_rules(client: &Client, manager: &str) {
    let rules: Api<RbacRule> = Api::all(client.clone());
    for file in rule_files() {
        for doc in read_yaml(&file) {
            let name = doc["metadata"]["name"]
                .as_str()
                .expect("rule name")
                .to_string();
            rules
                .patch(
                    &name,
                    &PatchParams::apply(manager).force(),
                    &Patch::Apply(&doc),
                )
                .await
                .unwrap_or_else(|e| panic!("apply RbacRule {name} from {file}: {e}"));
        }
    }
}

/// Label on the stand-in CRDs of Crossplane's kinds.
pub const STAND_IN: &str = "rbacrules.io/e2e-stand-in";

/// Installs the RbacRule CRD, the stand-in CRDs (refusing to replace a real
/// Crossplane's) and the built-in rules, with field manager `manager`.
pub async fn install_crds_and_rules(client: &Client, manager: &str) {
    let mut all = read_yaml("crds/rbacrules.rbacrules.io.yaml");
    all.extend(stand_in_crds(client).await);
    apply_crds(client, manager, &all).await;
    apply_builtin_rules(client, manager).await;
}

/// Installs only the stand-in CRDs of Crossplane's kinds (refusing to
/// replace a real Crossplane's), with field manager `manager`: for a suite
/// that installs rbac-rules itself (its chart brings the RbacRule CRD).
pub async fn install_stand_in_crds(client: &Client, manager: &str) {
    let crds = stand_in_crds(client).await;
    apply_crds(client, manager, &crds).await;
}

/// The stand-in CRDs, after checking that none of them replaces a real
/// Crossplane's.
async fn stand_in_crds(client: &Client) -> Vec<Value> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let stand_ins = read_yaml("tests/e2e/stand-in-crds.yaml");
    for crd in &stand_ins {
        let name = crd["metadata"]["name"].as_str().expect("name");
        if let Some(live) = crds.get_opt(name).await.expect("get CRD") {
            let ours = live
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(STAND_IN))
                .is_some_and(|v| v == "true");
            assert!(
                ours,
                "CRD {name} exists and is not the test's stand-in: this looks like a real \
                 Crossplane; run the e2e suite on a throwaway cluster"
            );
        }
    }
    stand_ins
}

/// The documents of `rules/<file>`, with the related set `related` of rule
/// `rule` pointed at namespace `ns`, as docs/migrating-from-crossplane.md
/// tells a Crossplane installed outside crossplane-system to do.
pub fn rules_pointed_at_namespace(file: &str, rule: &str, related: &str, ns: &str) -> Vec<Value> {
    let mut docs = read_yaml(&format!("rules/{file}"));
    let doc = docs
        .iter_mut()
        .find(|d| d["metadata"]["name"] == rule)
        .unwrap_or_else(|| panic!("rule {rule} in rules/{file}"));
    let sets = doc["spec"]["related"]
        .as_array_mut()
        .unwrap_or_else(|| panic!("rule {rule} has related sets"));
    let set = sets
        .iter_mut()
        .find(|r| r["name"] == related)
        .unwrap_or_else(|| panic!("rule {rule} has no related set {related}"));
    set["objects"]["namespace"] = Value::from(ns);
    docs
}

/// Points the related set `related` of built-in rule `rule` (in
/// `rules/<file>`) at namespace `ns` on the cluster.
pub async fn point_rule_at_namespace(
    client: &Client,
    manager: &str,
    file: &str,
    rule: &str,
    related: &str,
    ns: &str,
) {
    let doc = rules_pointed_at_namespace(file, rule, related, ns)
        .into_iter()
        .find(|d| d["metadata"]["name"] == rule)
        .unwrap_or_else(|| panic!("rule {rule} in rules/{file}"));
    Api::<RbacRule>::all(client.clone())
        .patch(
            rule,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&doc),
        )
        .await
        .unwrap_or_else(|e| panic!("point {rule} at {ns}: {e}"));
}

/// One type a lineage CRD defines: kind, plural and whether it is
/// namespaced.
pub struct TypeDef<'a> {
    pub kind: &'a str,
    pub plural: &'a str,
    pub namespaced: bool,
}

/// Creates (server-side apply as `manager`) the CRDs a real Crossplane
/// makes for `owner` (a live ProviderRevision or XRD): one per type in
/// `group`, each with an ownerReference to the owner's uid (`controller`
/// as given: Crossplane's XRD controller and the active revision set it),
/// waits until they are established and returns them as they are live.
/// The built-in rules believe a type only with this proof of lineage.
pub async fn lineage_crds(
    client: &Client,
    manager: &str,
    owner: &Value,
    group: &str,
    types: &[TypeDef<'_>],
    controller: bool,
) -> Vec<Value> {
    let reference = serde_json::json!({
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": controller,
        "blockOwnerDeletion": true,
    });
    assert!(
        reference["uid"].is_string(),
        "the owner is a live object: {owner}"
    );
    let crds: Vec<Value> = types
        .iter()
        .map(|t| {
            serde_json::json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("{}.{group}", t.plural), "ownerReferences": [reference]},
                "spec": {
                    "group": group,
                    "scope": if t.namespaced { "Namespaced" } else { "Cluster" },
                    "names": {"kind": t.kind, "listKind": format!("{}List", t.kind),
                              "plural": t.plural, "singular": t.kind.to_lowercase()},
                    "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                        "subresources": {"status": {}},
                        "schema": {"openAPIV3Schema": {"type": "object",
                            "x-kubernetes-preserve-unknown-fields": true}}}],
                },
            })
        })
        .collect();
    apply_crds(client, manager, &crds).await;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut live = Vec::new();
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().expect("name");
        let got = api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get CRD {name}: {e}"));
        let mut v = serde_json::to_value(got).expect("json");
        v["apiVersion"] = Value::from("apiextensions.k8s.io/v1");
        v["kind"] = Value::from("CustomResourceDefinition");
        live.push(v);
    }
    live
}

/// The API resource of CustomResourceDefinitions.
pub fn crd_ar() -> ApiResource {
    ApiResource::erase::<CustomResourceDefinition>(&())
}

/// Writes a copy of `kubeconfig` whose current user impersonates `user`
/// (a ServiceAccount's groups follow from its name): the controller run
/// as a local process gets exactly its ServiceAccount's permissions, and
/// the admission fences see its name.
pub fn write_impersonating(kubeconfig: &kube::config::Kubeconfig, user: &str, path: &Path) {
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
    auth.impersonate_groups = None;
    auth.impersonate_uid = None;
    auth.impersonate_user_extra = None;
    std::fs::write(
        path,
        rbac_rules::yaml::to_yaml(&kc).expect("kubeconfig as YAML"),
    )
    .expect("write the impersonating kubeconfig");
}

/// The `rbac-rules run` process of an end-to-end suite: its child process,
/// the local port of its metrics server and its log file. Each suite
/// starts it with its own arguments (`Controller { child, port, log }`)
/// and adds the questions it asks; what every suite asks of it is here.
pub struct Controller {
    pub child: std::process::Child,
    pub port: u16,
    pub log: std::path::PathBuf,
}

impl Controller {
    /// `GET path` on the metrics server: status code and body.
    pub async fn get(&self, path: &str) -> Result<(u16, String), String> {
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

    pub async fn wait_ready(&mut self) {
        eventually("the controller's /readyz", async || {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the controller exited: {status}\n{}", self.log_tail());
            }
            match self.get("/readyz").await? {
                (200, _) => Ok(()),
                (code, body) => Err(format!("{code} {body}")),
            }
        })
        .await;
    }

    /// The metrics text (`GET /metrics`).
    pub async fn metrics(&self) -> String {
        match self.get("/metrics").await {
            Ok((200, body)) => body,
            other => panic!("GET /metrics: {other:?}"),
        }
    }

    /// Sum of the samples of the metric lines starting with `prefix` whose
    /// labels contain `label`.
    pub async fn metric_sum(&self, prefix: &str, label: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .filter(|l| l.starts_with(prefix) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
            + 0.0
    }

    /// Reconciles so far (`rbac_rules_reconciles_total`).
    pub async fn reconciles(&self) -> f64 {
        self.metric_sum("rbac_rules_reconciles_total", "").await
    }

    /// Waits until the controller has reconciled since it had `before`
    /// reconciles (the change seen and written), then a little more.
    pub async fn passes_since(&self, before: f64) {
        eventually("a reconcile", async || {
            let now = self.reconciles().await;
            if now > before {
                Ok(())
            } else {
                Err(format!("{now} reconciles (from {before})"))
            }
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    pub fn stop(&mut self) {
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
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = f.seek(std::io::SeekFrom::Start(len.saturating_sub(16_000)));
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
