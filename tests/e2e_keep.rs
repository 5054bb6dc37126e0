//! End-to-end: nothing is lost unless asked for, against a real API
//! server.
//!
//! ```sh
//! RBAC_RULES_E2E_KUBECONFIG=<file> cargo test --test e2e_keep -- --ignored --test-threads=1
//! ```
//!
//! The test is `#[ignore]`d: `cargo test` never runs it; run with
//! `--ignored` but without `RBAC_RULES_E2E_KUBECONFIG`, it fails, saying
//! so. It needs what tests/e2e.rs needs (a throwaway cluster, a
//! cluster-admin kubeconfig, the ClusterRole aggregation and garbage
//! collector controllers, no Crossplane, no other rbac-rules controller),
//! and must not run at the same time as the other e2e suites.
//!
//! The controller runs as a local process with the admin kubeconfig,
//! `--adopt-existing` and `--max-unconfirmed-prunes 2`. Set up: the
//! built-in rules, an XRD, a ProviderRevision with its Deployment,
//! Crossplane's Deployment, four team namespaces accepting the XRD's
//! claims, a ClusterRole `crossplane-browse` made by "Helm" before the
//! controller (adopted), and users bound to the generated roles. A probe
//! of SubjectAccessReviews (an admin, two users, a browser, Crossplane's
//! and the provider's ServiceAccounts) is asked before and after each step;
//! every managed object's uid is recorded.
//!
//! 1. `kubectl delete rbacrule crossplane-namespace` (default policy
//!    Orphan): no object deleted or replaced, every answer the same, no
//!    DELETE sent (`rbac_rules_api_writes_total{action="delete"}`).
//! 2. Every other built-in RbacRule deleted, as `helm upgrade --set
//!    builtinRules=false` (or `helm uninstall`, whose RbacRules go while
//!    the controller may still run) does: the same, and the controller's
//!    log holds no prune and no failed write.
//! 3. The built-in rules applied again (`builtinRules=true`): every rule
//!    Ready, its objects taken back, the same uids, no DELETE.
//! 4. A rule of `deletionPolicy: Delete` whose output is renamed in the four
//!    team namespaces: the four prunes are held (over 2), reported in its
//!    `Degraded` condition (reason `PruneHeld`) with the token; the
//!    annotation `rbacrules.io/confirm-prune=<token>` lets them go;
//!    deleting the rule deletes its objects (it asked for it).
//! 5. The controller stopped (SIGTERM, as on uninstall): nothing deleted.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
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
use rbac_rules::api::RbacRule;
use serde_json::{Value, json};

mod support;
use support::e2e::*;

const KUBECONFIG_VAR: &str = "RBAC_RULES_E2E_KUBECONFIG";
const MANAGER: &str = "rbac-rules-e2e";
const MANAGED_BY: &str = "app.kubernetes.io/managed-by=rbac-rules";
const XRD_ANNOTATION_VALUE: &str = "xrd-claim-accepted";
const TEAMS: usize = 4;

/// The running controller process; stopped when dropped.
impl Controller {
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
            "rbac-rules-e2e-keep",
            "--param",
            &format!("crossplaneNamespace={crossplane_ns}"),
            "--adopt-existing",
            "--max-unconfirmed-prunes",
            "2",
            "--debounce-ms",
            "100",
        ]);
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

    /// Sum of `rbac_rules_api_writes_total` samples whose labels contain
    /// `label`.
    async fn writes(&self, label: &str) -> f64 {
        self.metric_sum("rbac_rules_api_writes_total{", label).await
    }
}

struct Created {
    ar: ApiResource,
    namespace: Option<String>,
    name: String,
}

struct Ctx {
    client: Client,
    dir: tempfile::TempDir,
    sfx: String,
    /// Crossplane's namespace (its Deployment and the provider's).
    ns: String,
    teams: Vec<String>,
    group: String,
    xrd: String,
    pr: String,
    pr_group: String,
    created: Mutex<Vec<Created>>,
}

/// One access question: (who, groups, namespace, verb, group, resource).
type Question = (String, Vec<String>, Option<String>, String, String, String);

impl Ctx {
    fn api(&self, ar: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
        match ns {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, ar),
            None => Api::all_with(self.client.clone(), ar),
        }
    }

    async fn create(&self, ar: &ApiResource, ns: Option<&str>, obj: Value) -> Value {
        let name = obj["metadata"]["name"].as_str().expect("name").to_string();
        let obj: DynamicObject = serde_json::from_value(obj).expect("object");
        let out = self
            .api(ar, ns)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("create {} {name}: {e}", ar.kind));
        self.created.lock().expect("lock").push(Created {
            ar: ar.clone(),
            namespace: ns.map(str::to_string),
            name,
        });
        serde_json::to_value(out).expect("json")
    }

    async fn get(&self, ar: &ApiResource, ns: Option<&str>, name: &str) -> Option<Value> {
        self.api(ar, ns)
            .get_opt(name)
            .await
            .unwrap_or_else(|e| panic!("get {} {name}: {e}", ar.kind))
            .map(|o| serde_json::to_value(o).expect("json"))
    }

    /// uid of every managed RBAC object, by "Kind ns/name".
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

    async fn may(&self, q: &Question) -> bool {
        let (user, groups, ns, verb, group, resource) = q;
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.clone()),
                groups: Some(groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    namespace: ns.clone(),
                    verb: Some(verb.clone()),
                    group: Some(group.clone()),
                    resource: Some(resource.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &sar)
            .await
            .expect("SubjectAccessReview")
            .status
            .is_some_and(|s| s.allowed)
    }

    /// The access every user and ServiceAccount of the setup holds.
    fn questions(&self) -> Vec<Question> {
        let q = |user: &str, groups: &[&str], ns: Option<&str>, verb: &str, g: &str, r: &str| {
            (
                user.to_string(),
                groups.iter().map(|s| s.to_string()).collect(),
                ns.map(str::to_string),
                verb.to_string(),
                g.to_string(),
                r.to_string(),
            )
        };
        let team = Some(self.teams[0].as_str());
        let g = self.group.as_str();
        let crossplane = format!("system:serviceaccount:{}:crossplane", self.ns);
        let provider = format!("system:serviceaccount:{}:provider-e2e", self.ns);
        let mut out = vec![
            q(
                "admin-e2e",
                &["crossplane:masters"],
                None,
                "create",
                "apiextensions.crossplane.io",
                "compositions",
            ),
            q("alice-e2e", &[], team, "create", g, "widgetclaims"),
            q("bob-e2e", &[], team, "create", g, "widgetclaims"),
            q("bob-e2e", &[], team, "get", "", "secrets"),
            q(
                "carol-e2e",
                &[],
                None,
                "list",
                "apiextensions.crossplane.io",
                "compositions",
            ),
            q(&crossplane, &[], None, "create", g, "widgets"),
            q(&provider, &[], None, "update", &self.pr_group, "gadgets"),
        ];
        for t in &self.teams {
            out.push(q("bob-e2e", &[], Some(t), "list", g, "widgetclaims"));
        }
        out
    }

    async fn answers(&self) -> Vec<bool> {
        let mut out = Vec::new();
        for q in self.questions() {
            out.push(self.may(&q).await);
        }
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a throwaway cluster: RBAC_RULES_E2E_KUBECONFIG=<file> cargo test --test e2e_keep -- --ignored --test-threads=1"]
async fn nothing_is_lost_unless_asked_for() {
    let Some(path) = std::env::var_os(KUBECONFIG_VAR).filter(|p| !p.is_empty()) else {
        panic!("{KUBECONFIG_VAR} not set: a throwaway cluster's admin kubeconfig");
    };
    let kubeconfig = Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("{KUBECONFIG_VAR}={}: {e}", path.to_string_lossy()));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("client configuration");
    let client = Client::try_from(config).expect("client");
    let sfx = suffix();
    let ctx = Ctx {
        client,
        dir: tempfile::tempdir().expect("temp dir"),
        ns: format!("keep-e2e-{sfx}"),
        teams: (0..TEAMS)
            .map(|i| format!("keep-e2e-{sfx}-team-{i}"))
            .collect(),
        group: format!("keep-{sfx}.example.org"),
        xrd: format!("widgets.keep-{sfx}.example.org"),
        pr: format!("provider-keep-{sfx}-0a1b2c3d"),
        pr_group: format!("provider-keep-{sfx}.example.org"),
        sfx,
        created: Mutex::new(Vec::new()),
    };
    let mut controller: Option<Controller> = None;
    let result = AssertUnwindSafe(scenario(&ctx, Path::new(&path), &mut controller))
        .catch_unwind()
        .await;
    if let Some(c) = controller.as_mut() {
        if result.is_err() {
            eprintln!("{}", c.log_tail());
        }
        c.stop();
    }
    let created = std::mem::take(&mut *ctx.created.lock().expect("lock"));
    for c in created.iter().rev() {
        let _ = ctx
            .api(&c.ar, c.namespace.as_deref())
            .delete(&c.name, &DeleteParams::background())
            .await;
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

async fn scenario(ctx: &Ctx, kubeconfig: &Path, controller: &mut Option<Controller>) {
    setup(ctx).await;
    *controller = Some(Controller::start(
        kubeconfig,
        ctx.dir.path().join("controller.log"),
        &ctx.ns,
    ));
    let c = controller.as_mut().expect("controller");
    c.wait_ready().await;
    every_rule_ready(ctx).await;
    // The Helm-made role is adopted, marked, and kept by Helm's policy.
    eventually("crossplane-browse adopted", async || {
        let o = ctx
            .get(&cr_ar(), None, "crossplane-browse")
            .await
            .ok_or("gone")?;
        let a = &o["metadata"]["annotations"];
        match (
            a["rbacrules.io/adopted"].as_str(),
            a["helm.sh/resource-policy"].as_str(),
        ) {
            (Some("true"), Some("keep")) => Ok(()),
            _ => Err(format!("annotations {a}")),
        }
    })
    .await;
    let questions = ctx.questions();
    let baseline = eventually("every user's access", async || {
        let a = ctx.answers().await;
        if a.iter().all(|x| *x) {
            Ok(a)
        } else {
            let no: Vec<_> = questions
                .iter()
                .zip(&a)
                .filter(|(_, x)| !**x)
                .map(|(q, _)| format!("{q:?}"))
                .collect();
            Err(format!("denied: {no:?}"))
        }
    })
    .await;
    let before = ctx.inventory().await;
    let deletes = c.writes("action=\"delete\"").await;
    assert_eq!(deletes, 0.0);
    eprintln!(
        "keep: set up: {} managed objects, {} access questions all allowed",
        before.len(),
        baseline.len()
    );

    // 1. One rule deleted, default policy.
    let rules: Api<RbacRule> = Api::all(ctx.client.clone());
    let n = c.reconciles().await;
    rules
        .delete("crossplane-namespace", &DeleteParams::default())
        .await
        .expect("delete RbacRule crossplane-namespace");
    c.passes_since(n).await;
    unchanged(
        ctx,
        c,
        &before,
        &baseline,
        "kubectl delete rbacrule crossplane-namespace",
    )
    .await;

    // 2. Every built-in rule gone (builtinRules=false, helm uninstall).
    let n = c.reconciles().await;
    for r in rules.list(&ListParams::default()).await.expect("rules") {
        let name = r.metadata.name.unwrap_or_default();
        rules
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete RbacRule {name}: {e}"));
    }
    c.passes_since(n).await;
    unchanged(
        ctx,
        c,
        &before,
        &baseline,
        "every built-in RbacRule deleted",
    )
    .await;
    let log = c.log();
    for bad in ["pruned", "write failed", "revoked"] {
        assert!(
            !log.contains(bad),
            "the controller's log holds {bad:?}:\n{}",
            c.log_tail()
        );
    }

    // 3. The rules back: their objects taken back as they are.
    let n = c.reconciles().await;
    apply_builtin_rules(&ctx.client, MANAGER).await;
    every_rule_ready(ctx).await;
    c.passes_since(n).await;
    unchanged(ctx, c, &before, &baseline, "built-in rules applied again").await;

    // 4. A rule that asks for deletion, and a mass prune held.
    delete_policy_and_hold(ctx, c).await;
    unchanged(ctx, c, &before, &baseline, "a Delete rule's life").await;

    // 5. The controller stopped: nothing deleted.
    c.stop();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = ctx.inventory().await;
    assert_eq!(after, before, "the controller's stop deleted nothing");
    assert_eq!(ctx.answers().await, baseline);
    eprintln!(
        "keep: controller stopped: {} objects, same uids; every answer the same",
        after.len()
    );
}

/// Every managed object of `before` exists with its uid, every answer is
/// what it was, no DELETE was sent except the ones counted by step 4.
async fn unchanged(
    ctx: &Ctx,
    c: &Controller,
    before: &BTreeMap<String, String>,
    baseline: &[bool],
    step: &str,
) {
    let now = ctx.inventory().await;
    let lost: Vec<_> = before
        .iter()
        .filter(|(k, uid)| now.get(*k) != Some(uid))
        .map(|(k, _)| k.clone())
        .collect();
    assert!(lost.is_empty(), "{step}: deleted or replaced: {lost:?}");
    let answers = ctx.answers().await;
    assert_eq!(answers, baseline, "{step}: access changed");
    let deletes = c.writes("action=\"delete\"").await;
    eprintln!(
        "keep: {step}: {} of {} objects kept with their uids, {} access answers unchanged, {deletes:.0} DELETEs sent in all",
        before.len() - lost.len(),
        before.len(),
        answers.len()
    );
}

async fn every_rule_ready(ctx: &Ctx) {
    for file in rule_files() {
        for doc in read_yaml(&file) {
            let name = doc["metadata"]["name"].as_str().expect("name").to_string();
            eventually(format!("RbacRule {name} Ready"), async || {
                let r = Api::<RbacRule>::all(ctx.client.clone())
                    .get(&name)
                    .await
                    .map_err(|e| e.to_string())?;
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

async fn delete_policy_and_hold(ctx: &Ctx, c: &Controller) {
    let rules: Api<RbacRule> = Api::all(ctx.client.clone());
    let name = format!("keep-e2e-{}", ctx.sfx);
    let rule = |role: &str| {
        json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": name},
            "spec": {"deletionPolicy": "Delete",
                "trigger": {"kind": "Namespace",
                    "selector": {"matchLabels": {"keep-e2e": ctx.sfx.clone()}}},
                "outputs": [{"kind": "Role", "name": role,
                    "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}]}})
    };
    let apply = |doc: Value| {
        let rules = rules.clone();
        let name = name.clone();
        async move {
            rules
                .patch(
                    &name,
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(&doc),
                )
                .await
                .expect("apply the rule");
        }
    };
    let roles_named = async |role: &str| -> usize {
        let mut n = 0;
        for t in &ctx.teams {
            if ctx.get(&role_ar(), Some(t), role).await.is_some() {
                n += 1;
            }
        }
        n
    };
    apply(rule("keep-e2e-a")).await;
    eventually("four Roles keep-e2e-a", async || {
        match roles_named("keep-e2e-a").await {
            n if n == TEAMS => Ok(()),
            n => Err(format!("{n}")),
        }
    })
    .await;
    let deletes_before = c.writes("action=\"delete\"").await;

    // Renamed: four new Roles, four prunes of one rule: held (over 2).
    apply(rule("keep-e2e-b")).await;
    eventually("four Roles keep-e2e-b", async || {
        match roles_named("keep-e2e-b").await {
            n if n == TEAMS => Ok(()),
            n => Err(format!("{n}")),
        }
    })
    .await;
    let message = eventually("the PruneHeld condition", async || {
        let r = rules.get(&name).await.map_err(|e| e.to_string())?;
        r.status
            .as_ref()
            .and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == "Degraded" && c.reason == "PruneHeld")
            })
            .map(|c| c.message.clone())
            .ok_or_else(|| format!("{:?}", r.status))
    })
    .await;
    let n = c.reconciles().await;
    // Any event brings a pass: the hold stands in every pass.
    rules
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"rbacrules.io/confirm-prune": "not-the-token"}}})),
        )
        .await
        .expect("a wrong token");
    c.passes_since(n).await;
    assert_eq!(roles_named("keep-e2e-a").await, TEAMS, "held: {message}");
    assert_eq!(c.writes("action=\"delete\"").await, deletes_before);
    let token = message
        .rsplit("rbacrules.io/confirm-prune=")
        .next()
        .expect("token")
        .trim()
        .to_string();
    eprintln!("keep: held: {message}");

    // Confirmed: the four go.
    rules
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"rbacrules.io/confirm-prune": token}}}),
            ),
        )
        .await
        .expect("confirm");
    eventually("the confirmed prunes", async || {
        match roles_named("keep-e2e-a").await {
            0 => Ok(()),
            n => Err(format!("{n} left")),
        }
    })
    .await;
    assert_eq!(
        c.writes("action=\"delete\"").await,
        deletes_before + TEAMS as f64
    );

    // The rule deleted: it asked for deletion.
    rules
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the Delete rule");
    eventually(
        "the Delete rule's Roles pruned",
        async || match roles_named("keep-e2e-b").await {
            0 => Ok(()),
            n => Err(format!("{n} left")),
        },
    )
    .await;
    eprintln!(
        "keep: deletionPolicy Delete: {TEAMS} prunes held until confirmed, then pruned; the rule deleted: its {TEAMS} Roles pruned"
    );
}

async fn setup(ctx: &Ctx) {
    install_crds_and_rules(&ctx.client, MANAGER).await;
    ctx.create(
        &ns_ar(),
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ctx.ns}}),
    )
    .await;
    for t in &ctx.teams {
        ctx.create(
            &ns_ar(),
            None,
            json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": t, "labels": {"keep-e2e": ctx.sfx},
                    "annotations": {format!("rbac.crossplane.io/{}", ctx.xrd): XRD_ANNOTATION_VALUE}}}),
        )
        .await;
    }
    // An XRD and the CRDs Crossplane makes for it.
    let xrd = ctx
        .create(
            &xrd_ar(),
            None,
            json!({"apiVersion": "apiextensions.crossplane.io/v1",
                "kind": "CompositeResourceDefinition", "metadata": {"name": ctx.xrd},
                "spec": {"group": ctx.group,
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
    for crd in lineage_crds(&ctx.client, MANAGER, &xrd, &ctx.group, &types, true).await {
        let name = crd["metadata"]["name"].as_str().expect("name").to_string();
        ctx.created.lock().expect("lock").push(Created {
            ar: crd_ar(),
            namespace: None,
            name,
        });
    }
    // A Provider (made first: the rules believe only CRDs no older than
    // it), the ProviderRevision it controls, its CRDs and its Deployment.
    let provider = ctx
        .create(
            &provider_ar(),
            None,
            json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "Provider",
                "metadata": {"name": ctx.pr},
                "spec": {"package": "xpkg.example.org/e2e/provider-e2e:v0.1.0"}}),
        )
        .await;
    let pr = ctx
        .create(
            &pr_ar(),
            None,
            json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
                "metadata": {"name": ctx.pr, "labels": {"pkg.crossplane.io/package": "provider-e2e"},
                    "ownerReferences": [{"apiVersion": "pkg.crossplane.io/v1", "kind": "Provider",
                        "name": ctx.pr, "uid": provider["metadata"]["uid"],
                        "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"image": "xpkg.example.org/e2e/provider-e2e:v0.1.0",
                    "desiredState": "Active", "revision": 1}}),
        )
        .await;
    let crd = |plural: &str| {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "name": format!("{plural}.{}", ctx.pr_group)})
    };
    ctx.api(&pr_ar(), None)
        .patch_status(
            &ctx.pr,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"objectRefs": [crd("gadgets")]}})),
        )
        .await
        .expect("ProviderRevision status");
    let types = [TypeDef {
        kind: "Gadget",
        plural: "gadgets",
        namespaced: false,
    }];
    for crd in lineage_crds(&ctx.client, MANAGER, &pr, &ctx.pr_group, &types, true).await {
        let name = crd["metadata"]["name"].as_str().expect("name").to_string();
        ctx.created.lock().expect("lock").push(Created {
            ar: crd_ar(),
            namespace: None,
            name,
        });
    }
    let pr_uid = pr["metadata"]["uid"].as_str().expect("uid");
    let deployment = |name: &str, sa: &str, labels: Value, owner: Option<Value>| {
        let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ctx.ns, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels},
                    "spec": {"serviceAccountName": sa,
                        "containers": [{"name": "c", "image": "example.org/none:v1"}]}}}});
        if let Some(o) = owner {
            d["metadata"]["ownerReferences"] = json!([o]);
        }
        d
    };
    ctx.create(
        &deploy_ar(),
        Some(&ctx.ns),
        deployment(
            &format!("provider-e2e-{}", ctx.pr),
            "provider-e2e",
            json!({"pkg.crossplane.io/provider": "provider-e2e"}),
            Some(
                json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
                "name": ctx.pr, "uid": pr_uid, "controller": true, "blockOwnerDeletion": true}),
            ),
        ),
    )
    .await;
    ctx.create(
        &deploy_ar(),
        Some(&ctx.ns),
        deployment(
            "crossplane",
            "crossplane",
            json!({"app": "crossplane"}),
            None,
        ),
    )
    .await;
    // crossplane-browse as Crossplane's chart installs it, before rbac-rules.
    if ctx.get(&cr_ar(), None, "crossplane-browse").await.is_none() {
        ctx.create(
            &cr_ar(),
            None,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "crossplane-browse",
                    "labels": {"app.kubernetes.io/managed-by": "Helm"},
                    "annotations": {"meta.helm.sh/release-name": "crossplane",
                        "meta.helm.sh/release-namespace": ctx.ns}},
                "rules": [{"apiGroups": ["apiextensions.crossplane.io"],
                    "resources": ["compositions"], "verbs": ["get", "list", "watch"]}]}),
        )
        .await;
    } else {
        eprintln!(
            "keep: crossplane-browse exists already: run on a fresh cluster to test adoption"
        );
    }
    // Users bound to the generated roles (their bindings are not managed).
    let sfx = &ctx.sfx;
    ctx.create(
        &crb_ar(),
        None,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("keep-e2e-{sfx}-alice")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "crossplane-edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice-e2e"}]}),
    )
    .await;
    ctx.create(
        &crb_ar(),
        None,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("keep-e2e-{sfx}-carol")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "crossplane-browse"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "carol-e2e"}]}),
    )
    .await;
    for t in &ctx.teams {
        ctx.create(
            &rb_ar(),
            Some(t),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "keep-e2e-bob", "namespace": t},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "crossplane-edit"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob-e2e"}]}),
        )
        .await;
    }
}
