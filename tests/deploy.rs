//! `deploy/`: the kustomize base behind `kubectl apply -k deploy/`.
//!
//! Renders it with `kubectl kustomize deploy/` (kubectl must be on PATH:
//! without it these tests fail, they never skip; `.ci/run` installs it) and
//! checks the objects: kinds and namespaces, the Deployment's hardening,
//! probes and settings (its arguments are parsed by the controller's own
//! `RunArgs`), the RBAC the controller needs — including list/watch on every
//! kind the built-in rules read, computed from the engine — and that the CRD
//! and the built-in RbacRules are exactly `crds/` and `rules/*.yaml`.
//!
//! Kustomize refuses files outside the kustomization root, so `deploy/`
//! holds generated copies of the CRD and of the rules: `deploy/crd.yaml` and
//! `deploy/builtin-rules.yaml`. `UPDATE_DEPLOY=1 cargo test --test deploy`
//! rewrites them from `crds/` and `rules/`, which stay the single source.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Once, OnceLock};

use clap::Parser;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use rbac_rules::controller::RunArgs;
use rbac_rules::engine::{Engine, Interest};
use rbac_rules::policy;
use serde_json::Value;

/// The namespace the base installs the controller into.
const NAMESPACE: &str = "rbac-rules-system";
/// Label selecting ClusterRoles into the controller's aggregated role.
const AGGREGATE_LABEL: &str = "rbacrules.io/aggregate-to-controller";
/// The controller's inventory label: nothing in deploy/ may carry it, or
/// the controller would prune its own installation.
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "rbac-rules");

const CRD_SOURCE: &str = "crds/rbacrules.rbacrules.io.yaml";
const CRD_COPY: &str = "deploy/crd.yaml";
const TENANT_CRD_SOURCE: &str = "crds/namespacedrbacrules.rbacrules.io.yaml";
const TENANT_CRD_COPY: &str = "deploy/namespaced-crd.yaml";
const RULES_COPY: &str = "deploy/builtin-rules.yaml";
const REGENERATE: &str = "UPDATE_DEPLOY=1 cargo test --test deploy";

const NAMESPACED: &[&str] = &[
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
];
const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "RbacRule",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// `rules/*.yaml`, sorted: the files the build script embeds.
fn rule_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("rules"))
        .expect("read rules/")
        .map(|e| e.expect("rules/ entry").path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// What `deploy/crd.yaml` must hold.
fn expected_crd_copy() -> String {
    crd_copy_of(CRD_SOURCE)
}

/// What a copy of the CRD in `source` must hold.
fn crd_copy_of(source: &str) -> String {
    format!(
        "# Generated from {source} (kustomize cannot load files outside deploy/).\n\
         # Do not edit: `{REGENERATE}` rewrites it.\n{}",
        read(source)
    )
}

/// What `deploy/builtin-rules.yaml` must hold: every `rules/*.yaml` file,
/// in name order, as documents of one stream.
fn expected_rules_copy() -> String {
    let mut out = format!(
        "# Generated from rules/*.yaml, the built-in rules (kustomize cannot load files\n\
         # outside deploy/). Do not edit: `{REGENERATE}` rewrites it.\n"
    );
    for f in rule_files() {
        let name = f.file_name().expect("file name").to_string_lossy();
        let text = std::fs::read_to_string(&f).expect("read rule file");
        out.push_str(&format!("---\n# Source: rules/{name}\n{text}"));
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// With `UPDATE_DEPLOY=1`, rewrites the generated copies (once, before
/// anything renders the base).
fn update_copies_if_asked() {
    static UPDATED: Once = Once::new();
    UPDATED.call_once(|| {
        if std::env::var_os("UPDATE_DEPLOY").is_none_or(|v| v.is_empty()) {
            return;
        }
        for (rel, text) in [
            (CRD_COPY, expected_crd_copy()),
            (TENANT_CRD_COPY, crd_copy_of(TENANT_CRD_SOURCE)),
            (RULES_COPY, expected_rules_copy()),
        ] {
            std::fs::write(root().join(rel), text).unwrap_or_else(|e| panic!("write {rel}: {e}"));
            eprintln!("rewrote {rel}");
        }
    });
}

/// `kubectl kustomize <dir>`, parsed.
fn kustomize(dir: &Path) -> Vec<Value> {
    let out = match Command::new("kubectl").arg("kustomize").arg(dir).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "kubectl not found on PATH: tests/deploy.rs renders deploy/ with \
             `kubectl kustomize`; install kubectl (.ci/run does)"
        ),
        Err(e) => panic!("cannot run kubectl: {e}"),
    };
    assert!(
        out.status.success(),
        "`kubectl kustomize {}` failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("kustomize output is UTF-8");
    rbac_rules::yaml::parse_documents(Path::new("kubectl kustomize"), &text)
        .expect("kustomize output is YAML")
        .into_iter()
        .map(|d| d.value)
        .collect()
}

/// The rendered base, parsed: `kubectl kustomize deploy/`, run once.
fn rendered() -> &'static [Value] {
    static RENDERED: OnceLock<Vec<Value>> = OnceLock::new();
    RENDERED.get_or_init(|| {
        update_copies_if_asked();
        kustomize(&root().join("deploy"))
    })
}

fn kind(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or_default()
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

fn of_kind(k: &str) -> Vec<&'static Value> {
    rendered().iter().filter(|o| kind(o) == k).collect()
}

fn one(k: &str) -> &'static Value {
    let all = of_kind(k);
    assert_eq!(all.len(), 1, "exactly one {k} in deploy/");
    all[0]
}

fn get(k: &str, n: &str) -> &'static Value {
    rendered()
        .iter()
        .find(|o| kind(o) == k && name(o) == n)
        .unwrap_or_else(|| panic!("{k} {n} is not in deploy/"))
}

fn parse_file(rel: &str) -> Vec<Value> {
    rbac_rules::yaml::parse_documents(Path::new(rel), &read(rel))
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|d| d.value)
        .collect()
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

/// The resource (plural) of a kind, as Kubernetes guesses it for CRDs
/// without an explicit plural: the library's guess, which
/// `rbac-rules controller-role` uses too.
fn plural(kind: &str) -> String {
    rbac_rules::rules::guess_plural(kind)
}

fn builtin() -> Vec<rbac_rules::engine::RuleSource> {
    rbac_rules::rules::builtin().expect("built-in rules load")
}

/// Every kind the built-in rules read (triggers and related objects).
fn builtin_interests() -> Vec<Interest> {
    Engine::new(&builtin(), Default::default()).interests()
}

/// The bound ClusterRole's rules after aggregation, as the aggregation
/// controller would fill them from the ClusterRoles in deploy/.
fn controller_cluster_rules() -> Vec<PolicyRule> {
    let binding = one("ClusterRoleBinding");
    let role_name = binding["roleRef"]["name"].as_str().expect("roleRef.name");
    assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
    let roles: Vec<ClusterRole> = of_kind("ClusterRole")
        .into_iter()
        .map(|o| serde_json::from_value(o.clone()).expect("valid ClusterRole"))
        .collect();
    let aggregated = policy::aggregate(&roles).expect("valid aggregation selectors");
    let bound = aggregated
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(role_name))
        .unwrap_or_else(|| panic!("the binding's ClusterRole {role_name} is not in deploy/"));
    bound.rules.clone().unwrap_or_default()
}

fn assert_covers(owner: &[PolicyRule], wanted: &[PolicyRule], what: &str) {
    let (ok, missing) = policy::covers(owner, wanted);
    assert!(
        ok,
        "{what} lacks: {}",
        missing
            .iter()
            .map(|r| serde_json::to_string(r).expect("json"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

fn controller_container() -> &'static Value {
    let containers = one("Deployment")["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

fn env_value<'a>(container: &'a Value, var: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == var)
}

/// The container's `run` settings, parsed by the controller's own flags
/// (so an argument the binary would refuse fails here too). Settings given
/// by environment variables are read from the container's env.
fn run_args() -> RunArgs {
    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }
    let c = controller_container();
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("container args")
        .iter()
        .map(|a| a.as_str().expect("string arg"))
        .collect();
    assert_eq!(
        args.first(),
        Some(&"run"),
        "the container runs `rbac-rules run`"
    );
    let mut parsed =
        Run::try_parse_from(std::iter::once("rbac-rules run").chain(args[1..].iter().copied()))
            .unwrap_or_else(|e| panic!("the Deployment's arguments are refused: {e}"))
            .args;
    if let Some(v) = env_value(c, "RBAC_RULES_METRICS_ADDRESS").and_then(|e| e["value"].as_str()) {
        parsed.metrics_address = v.parse().expect("RBAC_RULES_METRICS_ADDRESS");
    }
    if let Some(v) = env_value(c, "RBAC_RULES_ALLOW_CLUSTERROLE").and_then(|e| e["value"].as_str())
    {
        parsed.allow_clusterrole = Some(v.to_string());
    }
    if let Some(v) = env_value(c, "RBAC_RULES_LEADER_ELECTION").and_then(|e| e["value"].as_str()) {
        parsed.leader_election = v.parse().expect("RBAC_RULES_LEADER_ELECTION");
    }
    parsed
}

#[test]
fn generated_copies_match_crds_and_rules() {
    update_copies_if_asked();
    for (rel, expected, source) in [
        (CRD_COPY, expected_crd_copy(), CRD_SOURCE),
        (
            TENANT_CRD_COPY,
            crd_copy_of(TENANT_CRD_SOURCE),
            TENANT_CRD_SOURCE,
        ),
        (RULES_COPY, expected_rules_copy(), "rules/*.yaml"),
    ] {
        let committed = std::fs::read_to_string(root().join(rel)).unwrap_or_default();
        assert!(
            committed == expected,
            "{rel} is not a current copy of {source}: run `{REGENERATE}`"
        );
    }
    // The copy holds what the binary embeds: the same files.
    let embedded: Vec<&str> = rbac_rules::rules::BUILTIN.iter().map(|(p, _)| *p).collect();
    let on_disk: Vec<String> = rule_files()
        .iter()
        .map(|f| format!("rules/{}", f.file_name().expect("name").to_string_lossy()))
        .collect();
    assert_eq!(embedded, on_disk, "the binary embeds exactly rules/*.yaml");
}

#[test]
fn objects_kinds_and_namespaces() {
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for o in rendered() {
        *kinds.entry(kind(o)).or_default() += 1;
        let k = kind(o);
        let ns = o["metadata"]["namespace"].as_str();
        if NAMESPACED.contains(&k) {
            assert_eq!(ns, Some(NAMESPACE), "{k} {} namespace", name(o));
        } else if CLUSTER_SCOPED.contains(&k) {
            assert_eq!(ns, None, "cluster-scoped {k} {} has a namespace", name(o));
        } else {
            panic!(
                "{k} {}: unexpected kind (classify it in tests/deploy.rs)",
                name(o)
            );
        }
        assert_ne!(
            o["metadata"]["labels"][MANAGED_BY.0].as_str(),
            Some(MANAGED_BY.1),
            "{k} {} carries the controller's inventory label: it would be pruned",
            name(o)
        );
    }
    assert_eq!(
        kinds.get("CustomResourceDefinition"),
        Some(&2),
        "the RbacRule and NamespacedRbacRule CRDs: {kinds:?}"
    );
    for k in [
        "Namespace",
        "ServiceAccount",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ] {
        assert_eq!(kinds.get(k), Some(&1), "one {k}: {kinds:?}");
    }
    assert!(
        kinds.get("ClusterRole").is_some_and(|n| *n >= 2),
        "{kinds:?}"
    );
    assert_eq!(name(one("Namespace")), NAMESPACE);
}

#[test]
fn crd_is_exactly_crds_dir() {
    for (source_file, crd) in [
        (CRD_SOURCE, "rbacrules.rbacrules.io"),
        (TENANT_CRD_SOURCE, "namespacedrbacrules.rbacrules.io"),
    ] {
        let source = parse_file(source_file);
        assert_eq!(source.len(), 1);
        assert!(
            get("CustomResourceDefinition", crd) == &source[0],
            "the CRD {crd} in deploy/ differs from {source_file}: run `{REGENERATE}`"
        );
    }
}

/// Delegation: the controller reads tenant rules everywhere and writes
/// their status; namespace admins (only they) may write them, through a
/// ClusterRole aggregated into `admin` that grants nothing else but `bind`
/// on `view` and `edit`, whose permissions `admin` holds; the admission
/// policy is in the base.
#[test]
fn tenant_rules_are_read_by_the_controller_and_written_by_namespace_admins() {
    let rules = controller_cluster_rules();
    assert_covers(
        &rules,
        &[
            rule(
                &["rbacrules.io"],
                &["namespacedrbacrules"],
                &["get", "list", "watch"],
            ),
            rule(
                &["rbacrules.io"],
                &["namespacedrbacrules/status"],
                &["patch"],
            ),
        ],
        "the controller's ClusterRole",
    );
    let tenant = get("ClusterRole", "rbac-rules:tenant-admin");
    let labels = &tenant["metadata"]["labels"];
    assert_eq!(
        labels["rbac.authorization.k8s.io/aggregate-to-admin"],
        "true"
    );
    for other in ["aggregate-to-edit", "aggregate-to-view"] {
        assert!(labels[format!("rbac.authorization.k8s.io/{other}")].is_null());
    }
    assert!(labels[AGGREGATE_LABEL].is_null(), "not the controller's");
    let granted: Vec<PolicyRule> = serde_json::from_value(tenant["rules"].clone()).expect("rules");
    assert_eq!(
        granted,
        vec![
            rule(
                &["rbacrules.io"],
                &["namespacedrbacrules"],
                &[
                    "get",
                    "list",
                    "watch",
                    "create",
                    "update",
                    "patch",
                    "delete",
                    "deletecollection"
                ],
            ),
            PolicyRule {
                resource_names: Some(vec!["view".into(), "edit".into()]),
                ..rule(&["rbac.authorization.k8s.io"], &["clusterroles"], &["bind"])
            },
        ]
    );
    let policy = get("ValidatingAdmissionPolicy", "rbac-rules-tenant-grants");
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    let binding = get(
        "ValidatingAdmissionPolicyBinding",
        "rbac-rules-tenant-grants",
    );
    assert_eq!(
        binding["spec"]["validationActions"],
        serde_json::json!(["Deny"])
    );
}

#[test]
fn rbac_rules_are_exactly_the_builtin_rules() {
    let mut expected: BTreeMap<String, Value> = BTreeMap::new();
    for f in rule_files() {
        let rel = format!("rules/{}", f.file_name().expect("name").to_string_lossy());
        for doc in parse_file(&rel) {
            assert!(
                expected.insert(name(&doc).to_string(), doc).is_none(),
                "duplicate rule name in rules/"
            );
        }
    }
    let deployed: BTreeMap<String, Value> = of_kind("RbacRule")
        .into_iter()
        .map(|o| (name(o).to_string(), o.clone()))
        .collect();
    assert_eq!(
        deployed.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "RbacRules in deploy/ vs rules/*.yaml: run `{REGENERATE}`"
    );
    for (n, want) in &expected {
        assert!(
            &deployed[n] == want,
            "RbacRule {n} in deploy/ differs from rules/: run `{REGENERATE}`"
        );
    }
    let builtin: BTreeSet<String> = builtin().into_iter().map(|r| r.name).collect();
    assert_eq!(
        builtin,
        expected.keys().cloned().collect(),
        "the embedded built-in rules"
    );
}

#[test]
fn deployment_is_hardened() {
    let d = one("Deployment");
    let pod = &d["spec"]["template"]["spec"];
    let c = controller_container();
    assert_eq!(pod["automountServiceAccountToken"], true);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert!(
        pod["securityContext"]["runAsUser"]
            .as_i64()
            .is_some_and(|u| u > 0),
        "a non-root numeric user (the image may not name one)"
    );
    assert!(pod["hostNetwork"].is_null() && pod["hostPID"].is_null());
    let sc = &c["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_ne!(sc["runAsNonRoot"], false);
    assert_ne!(sc["privileged"], true);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert!(sc["capabilities"]["add"].is_null(), "no capability added");
    for bound in ["requests", "limits"] {
        for res in ["cpu", "memory"] {
            assert!(
                c["resources"][bound][res].is_string(),
                "resources.{bound}.{res} is set"
            );
        }
    }
}

#[test]
fn deployment_runs_the_controller_with_leader_election() {
    let d = one("Deployment");
    let pod = &d["spec"]["template"]["spec"];
    let c = controller_container();
    let args = run_args();
    // The image: `rbac-rules` at the crate's version (users override it
    // with `images:`).
    assert_eq!(
        c["image"],
        format!("rbac-rules:{}", env!("CARGO_PKG_VERSION")),
        "image name and tag"
    );
    // More than one replica only with leader election.
    let replicas = d["spec"]["replicas"].as_i64().unwrap_or(1);
    assert!(replicas >= 2, "replicas: {replicas}");
    assert!(
        args.leader_election,
        "several replicas need leader election"
    );
    // The Lease namespace and identity come from the downward API.
    let field_ref = |var: &str| {
        env_value(c, var)
            .and_then(|e| e["valueFrom"]["fieldRef"]["fieldPath"].as_str())
            .unwrap_or_else(|| panic!("env {var} from the downward API"))
    };
    assert_eq!(field_ref("POD_NAMESPACE"), "metadata.namespace");
    assert_eq!(field_ref("POD_NAME"), "metadata.name");
    assert_eq!(
        field_ref("RBAC_RULES_LEASE_NAMESPACE"),
        "metadata.namespace"
    );
    assert!(
        args.lease_namespace.is_none(),
        "lease namespace from the env"
    );
    // The pod's selector labels match the template.
    let selector = d["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels");
    for (k, v) in selector {
        assert_eq!(&d["spec"]["template"]["metadata"]["labels"][k], v, "{k}");
    }
    assert_eq!(pod["serviceAccountName"], name(one("ServiceAccount")));
}

/// The container port a probe or Service names (by name or number).
fn container_port(container: &Value, port: &Value) -> i64 {
    if let Some(n) = port.as_i64() {
        return n;
    }
    let wanted = port.as_str().expect("port name or number");
    container["ports"]
        .as_array()
        .expect("container ports")
        .iter()
        .find(|p| p["name"] == wanted)
        .and_then(|p| p["containerPort"].as_i64())
        .unwrap_or_else(|| panic!("no container port named {wanted}"))
}

#[test]
fn probes_and_service_use_the_metrics_address() {
    let c = controller_container();
    let address: SocketAddr = run_args().metrics_address;
    assert!(
        address.ip().is_unspecified(),
        "the metrics server must listen on every interface for probes: {address}"
    );
    let port = i64::from(address.port());
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe} path");
        assert_eq!(container_port(c, &get["port"]), port, "{probe} port");
        assert!(
            get["scheme"].is_null() || get["scheme"] == "HTTP",
            "{probe} scheme"
        );
    }
    let svc = one("Service");
    let ports = svc["spec"]["ports"].as_array().expect("service ports");
    assert!(
        ports
            .iter()
            .any(|p| container_port(c, &p["targetPort"]) == port),
        "the Service targets the metrics port"
    );
    let pod_labels = &one("Deployment")["spec"]["template"]["metadata"]["labels"];
    for (k, v) in svc["spec"]["selector"].as_object().expect("selector") {
        assert_eq!(&pod_labels[k], v, "Service selector {k}");
    }
}

#[test]
fn service_account_is_bound() {
    let sa = one("ServiceAccount");
    let subject = (name(sa), NAMESPACE);
    let binds_sa = |b: &Value| {
        b["subjects"].as_array().is_some_and(|s| {
            s.iter().any(|s| {
                s["kind"] == "ServiceAccount"
                    && s["name"] == subject.0
                    && s["namespace"] == subject.1
            })
        })
    };
    assert!(
        binds_sa(one("ClusterRoleBinding")),
        "ClusterRoleBinding subject"
    );
    assert!(binds_sa(one("RoleBinding")), "RoleBinding subject");
    assert_eq!(
        one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"],
        subject.0
    );
}

#[test]
fn cluster_role_covers_what_the_controller_does() {
    let rules = controller_cluster_rules();
    let rbac = "rbac.authorization.k8s.io";
    let kinds = [
        "clusterroles",
        "roles",
        "clusterrolebindings",
        "rolebindings",
    ];
    assert_covers(
        &rules,
        &[
            rule(&["rbacrules.io"], &["rbacrules"], &["get", "list", "watch"]),
            rule(&["rbacrules.io"], &["rbacrules/status"], &["patch"]),
            rule(
                &[rbac],
                &kinds,
                &["get", "list", "watch", "create", "patch", "delete"],
            ),
            rule(&[rbac], &["clusterroles", "roles"], &["escalate", "bind"]),
            rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
        ],
        "the controller's ClusterRole",
    );
}

#[test]
fn cluster_role_reads_every_kind_the_builtin_rules_read() {
    let rules = controller_cluster_rules();
    let interests = builtin_interests();
    assert!(!interests.is_empty());
    let wanted: Vec<PolicyRule> = interests
        .iter()
        .map(|i| rule(&[&i.gk.group], &[&plural(&i.gk.kind)], &["list", "watch"]))
        .collect();
    assert_covers(
        &rules,
        &wanted,
        "the controller's ClusterRole (list/watch of kinds the built-in rules read)",
    );
    // What `rbac-rules controller-role` prints for the built-in rules is
    // what the shipped role grants.
    let printed: Vec<PolicyRule> = serde_json::from_value(
        rbac_rules::rules::controller_role(&builtin(), "rbac-rules:builtin-rules", &[])["rules"]
            .clone(),
    )
    .expect("policy rules");
    assert_covers(
        &rules,
        &printed,
        "the controller's ClusterRole (controller-role)",
    );
    // Outputs are owned by their trigger with blockOwnerDeletion:
    // OwnerReferencesPermissionEnforcement wants update on its finalizers.
    let triggers: BTreeSet<(String, String)> = builtin()
        .into_iter()
        .filter_map(|r| r.spec.trigger)
        .map(|t| (t.api_group, t.kind))
        .collect();
    assert!(!triggers.is_empty());
    let finalizers: Vec<PolicyRule> = triggers
        .iter()
        .map(|(g, k)| rule(&[g], &[&format!("{}/finalizers", plural(k))], &["update"]))
        .collect();
    assert_covers(
        &rules,
        &finalizers,
        "the controller's ClusterRole (update on trigger finalizers)",
    );
}

#[test]
fn controller_roles_grant_no_wildcards() {
    // The allow-list is a bound, not a grant (nothing binds it: see
    // the_allow_list_is_on_and_bounds_the_builtin_rules).
    let allow_list = run_args().allow_clusterrole;
    let roles = of_kind("ClusterRole")
        .into_iter()
        .filter(|r| Some(name(r)) != allow_list.as_deref())
        .chain(of_kind("Role"))
        .collect::<Vec<_>>();
    for r in roles {
        for pr in r["rules"].as_array().into_iter().flatten() {
            for field in ["apiGroups", "resources", "verbs"] {
                assert!(
                    !pr[field]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|v| v.as_str().is_some_and(|s| s.contains('*'))),
                    "{} {} grants a wildcard in {field}",
                    kind(r),
                    name(r)
                );
            }
        }
    }
    // The aggregated role selects by our label only.
    let bound = one("ClusterRoleBinding")["roleRef"]["name"]
        .as_str()
        .expect("roleRef.name");
    let selectors = &get("ClusterRole", bound)["aggregationRule"]["clusterRoleSelectors"];
    assert_eq!(
        selectors,
        &serde_json::json!([{"matchLabels": {AGGREGATE_LABEL: "true"}}])
    );
    assert!(
        get("ClusterRole", bound)["rules"].is_null(),
        "the aggregated role carries no rules: the aggregation controller owns them"
    );
}

#[test]
fn lease_role_in_the_controller_namespace() {
    let binding = one("RoleBinding");
    assert_eq!(binding["roleRef"]["kind"], "Role");
    let role_name = binding["roleRef"]["name"].as_str().expect("roleRef.name");
    let role: Role = serde_json::from_value(get("Role", role_name).clone()).expect("Role");
    assert_eq!(role.metadata.namespace.as_deref(), Some(NAMESPACE));
    assert_covers(
        &role.rules.unwrap_or_default(),
        &[rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "create", "patch"],
        )],
        "the leader election Role",
    );
}

#[test]
fn plural_guess() {
    for (k, p) in [
        ("Namespace", "namespaces"),
        ("Deployment", "deployments"),
        ("ProviderRevision", "providerrevisions"),
        (
            "CompositeResourceDefinition",
            "compositeresourcedefinitions",
        ),
        ("Policy", "policies"),
        ("Gateway", "gateways"),
        ("Ingress", "ingresses"),
    ] {
        assert_eq!(plural(k), p);
    }
}

/// The allow-list ships on: the Deployment names a ClusterRole of deploy/
/// that nothing binds, the built-in rules render through it on the shipped
/// example and the chart-mode cluster, and a grant on a built-in group it
/// does not list is refused.
#[test]
fn the_allow_list_is_on_and_bounds_the_builtin_rules() {
    use rbac_rules::render::{RenderArgs, render};

    let allow_name = run_args()
        .allow_clusterrole
        .expect("the Deployment sets RBAC_RULES_ALLOW_CLUSTERROLE");
    let allow = get("ClusterRole", &allow_name);
    assert!(
        allow["aggregationRule"].is_null(),
        "a plain role: what it allows is what it says"
    );
    for b in of_kind("ClusterRoleBinding")
        .into_iter()
        .chain(of_kind("RoleBinding"))
    {
        assert_ne!(
            b["roleRef"]["name"].as_str(),
            Some(allow_name.as_str()),
            "{} binds the allow-list",
            name(b)
        );
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let allow_file = dir.path().join("allow.yaml");
    std::fs::write(&allow_file, serde_json::to_string(allow).expect("json")).expect("write");
    let args = |objects: Vec<PathBuf>, rules: Vec<PathBuf>| RenderArgs {
        objects,
        rules,
        allow: Some(allow_file.clone()),
        ..Default::default()
    };
    for objects in [
        "examples/crossplane-cluster.yaml",
        "tests/golden/crossplane-chart-deploy-false/objects.yaml",
    ] {
        let out = render(&args(vec![root().join(objects)], vec![]));
        assert!(
            out.is_ok(),
            "the built-in rules on {objects} pass the shipped allow-list: {:?}",
            out.err().map(|e| e.to_string())
        );
    }
    // A rule of one's own: custom groups pass, built-in groups not listed
    // are refused.
    let rule = |name: &str, group: &str, resource: &str| {
        format!(
            "apiVersion: rbacrules.io/v1alpha1\nkind: RbacRule\nmetadata: {{name: {name}}}\n\
             spec:\n  outputs:\n  - kind: ClusterRole\n    name: {name}\n    rules:\n\
             \x20   - {{apiGroups: [\"{group}\"], resources: [{resource}], verbs: [get]}}\n"
        )
    };
    let custom = dir.path().join("custom.yaml");
    std::fs::write(&custom, rule("widgets", "example.org", "widgets")).expect("write");
    let empty = dir.path().join("objects.yaml");
    std::fs::write(&empty, "").expect("write");
    render(&args(vec![empty.clone()], vec![custom])).expect("a custom group passes");
    let jobs = dir.path().join("jobs.yaml");
    std::fs::write(&jobs, rule("jobs", "batch", "jobs")).expect("write");
    let refused = render(&args(vec![empty], vec![jobs]))
        .expect_err("batch jobs are not in the allow-list")
        .to_string();
    assert!(
        refused.contains("EscalationDenied") || refused.contains("allow-list"),
        "{refused}"
    );
}

/// Copies the directory tree `from` to `to` (regular files only).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read dir") {
        let p = e.expect("entry").path();
        let target = to.join(p.file_name().expect("name"));
        if p.is_dir() {
            copy_tree(&p, &target);
        } else {
            std::fs::copy(&p, &target).expect("copy");
        }
    }
}

/// Whether the fence in `objects` matches requests of `user`: every
/// matchCondition of its ValidatingAdmissionPolicy holds (CEL, as the API
/// server evaluates it), and its binding names that policy.
fn fence_matches(objects: &[Value], user: &str) -> bool {
    use cel::{Context, Env, Value as Cel};
    let policy = objects
        .iter()
        .find(|o| kind(o) == "ValidatingAdmissionPolicy")
        .expect("the fence's ValidatingAdmissionPolicy");
    let binding = objects
        .iter()
        .find(|o| kind(o) == "ValidatingAdmissionPolicyBinding")
        .expect("the fence's ValidatingAdmissionPolicyBinding");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    let env = std::sync::Arc::new(Env::stdlib());
    let conditions = policy["spec"]["matchConditions"]
        .as_array()
        .expect("matchConditions");
    assert!(!conditions.is_empty(), "the fence matches someone");
    conditions.iter().all(|c| {
        let expr = c["expression"].as_str().expect("expression");
        let program = env
            .compile(expr)
            .unwrap_or_else(|e| panic!("{expr}: {e:?}"));
        let mut ctx = Context::with_env(env.clone());
        ctx.add_variable_from_value(
            "request",
            cel::to_value(serde_json::json!({
                "operation": "UPDATE",
                "userInfo": {"username": user},
                "resource": {"group": "rbac.authorization.k8s.io", "version": "v1", "resource": "clusterroles"},
            }))
            .expect("request"),
        );
        matches!(program.execute(&ctx), Ok(Cel::Bool(true)))
    })
}

/// The user the controller runs as in `objects`: its Deployment's
/// ServiceAccount, which must exist there and be what the ClusterRoleBinding
/// binds.
fn controller_user(objects: &[Value]) -> String {
    let d = objects
        .iter()
        .find(|o| kind(o) == "Deployment")
        .expect("the Deployment");
    let ns = d["metadata"]["namespace"].as_str().expect("namespace");
    let sa = d["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName");
    assert!(
        objects.iter().any(|o| kind(o) == "ServiceAccount"
            && name(o) == sa
            && o["metadata"]["namespace"] == ns),
        "ServiceAccount {ns}/{sa}"
    );
    let bound = objects
        .iter()
        .filter(|o| kind(o) == "ClusterRoleBinding")
        .flat_map(|b| b["subjects"].as_array().into_iter().flatten())
        .any(|s| s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == ns);
    assert!(bound, "a ClusterRoleBinding binds {ns}/{sa}");
    format!("system:serviceaccount:{ns}:{sa}")
}

/// The fence follows the namespace the controller is installed in, both
/// ways of moving it: an overlay with `namespace:` over deploy/, and an edit
/// of `namespace:` in deploy/controller/kustomization.yaml. It still matches
/// no one else there.
#[test]
fn the_fence_follows_the_controllers_namespace() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The base itself.
    let base = rendered();
    assert_eq!(
        controller_user(base),
        format!("system:serviceaccount:{NAMESPACE}:rbac-rules")
    );
    let mut installs: Vec<(String, Vec<Value>)> = vec![("deploy/".into(), base.to_vec())];
    // An overlay (kustomize refuses absolute paths: the base is copied
    // beside it).
    copy_tree(&root().join("deploy"), &dir.path().join("base"));
    let overlay = dir.path().join("overlay");
    std::fs::create_dir_all(&overlay).expect("mkdir");
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         namespace: platform-rbac\nresources:\n- ../base\n",
    )
    .expect("write overlay");
    installs.push((
        "an overlay with namespace: platform-rbac".into(),
        kustomize(&overlay),
    ));
    // The documented edit.
    let edited = dir.path().join("edited");
    copy_tree(&root().join("deploy"), &edited);
    let k = edited.join("controller/kustomization.yaml");
    let text = std::fs::read_to_string(&k).expect("read");
    let needle = format!("namespace: {NAMESPACE}\n");
    assert!(text.contains(&needle), "{text}");
    std::fs::write(&k, text.replace(&needle, "namespace: team-rbac\n")).expect("write");
    installs.push((
        "deploy/controller with namespace: team-rbac".into(),
        kustomize(&edited),
    ));

    for (how, objects) in &installs {
        let user = controller_user(objects);
        if how != "deploy/" {
            assert!(
                !user.contains(NAMESPACE),
                "{how}: still in {NAMESPACE}: {user}"
            );
        }
        assert!(
            fence_matches(objects, &user),
            "{how}: the fence does not match the controller's ServiceAccount {user}: \
             it would let every write of the controller through"
        );
        let ns = user.split(':').nth(2).expect("namespace");
        for other in [
            format!("system:serviceaccount:{ns}:default"),
            format!("system:serviceaccount:{ns}:rbac-rules-metrics"),
            "admin".to_string(),
            "system:kube-controller-manager".to_string(),
        ] {
            assert!(
                !fence_matches(objects, &other),
                "{how}: the fence matches {other}"
            );
        }
    }
}
