//! The Helm chart (deploy/helm/rbac-rules): its copies of deploy/ are
//! current, `helm lint` passes, and `helm template` renders every object of
//! the kustomize base (`kubectl kustomize deploy/`) equal in substance.
//!
//! Without `helm` on PATH (or `HELM=/path/to/helm`) the helm parts print
//! "skipped" and pass; `.ci/run` installs helm. `UPDATE_HELM=1 cargo test
//! --test helm` rewrites the chart's copies.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const CHART: &str = "deploy/helm/rbac-rules";
const NAMESPACE: &str = "rbac-rules-system";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// deploy/controller files the chart templates by hand.
const TEMPLATED: &[&str] = &["kustomization.yaml", "namespace.yaml", "deployment.yaml"];

/// (chart file, expected content): the copies the chart carries.
fn expected_copies() -> Vec<(PathBuf, String)> {
    let read =
        |p: &Path| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut out = vec![
        (
            root().join(CHART).join("crds/rbacrules.rbacrules.io.yaml"),
            read(&root().join("deploy/crd.yaml")),
        ),
        (
            root().join(CHART).join("files/builtin-rules.yaml"),
            read(&root().join("deploy/builtin-rules.yaml")),
        ),
    ];
    // The admission fence names the controller's user, namespace included.
    out.push((
        root().join(CHART).join("files/admission.yaml"),
        read(&root().join("deploy/admission.yaml")).replace(
            &format!("system:serviceaccount:{NAMESPACE}:"),
            "system:serviceaccount:{{ .Release.Namespace }}:",
        ),
    ));
    // The NamespacedRbacRule CRD, and delegation at admission verbatim.
    out.push((
        root()
            .join(CHART)
            .join("crds/namespacedrbacrules.rbacrules.io.yaml"),
        read(&root().join("deploy/namespaced-crd.yaml")),
    ));
    out.push((
        root().join(CHART).join("files/tenant-admission.yaml"),
        read(&root().join("deploy/tenant-admission.yaml")),
    ));
    // The inventory fence verbatim: the template puts the release's
    // namespace and ServiceAccount into its one exemption.
    out.push((
        root().join(CHART).join("files/inventory-fence.yaml"),
        read(&root().join("deploy/inventory-fence.yaml")),
    ));
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("deploy/controller"))
        .expect("deploy/controller")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !TEMPLATED.iter().any(|t| p.ends_with(t)))
        .collect();
    files.sort();
    for f in files {
        let text = read(&f).replace(
            &format!("namespace: {NAMESPACE}"),
            "namespace: {{ .Release.Namespace }}",
        );
        out.push((
            root()
                .join(CHART)
                .join("files/controller")
                .join(f.file_name().expect("file name")),
            text,
        ));
    }
    out
}

#[test]
fn chart_copies_of_deploy_are_current() {
    let update = std::env::var_os("UPDATE_HELM").is_some_and(|v| !v.is_empty());
    let expected = expected_copies();
    for (path, text) in &expected {
        if update {
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, text).expect("write copy");
            continue;
        }
        let got = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            &got == text,
            "{} differs from deploy/: run UPDATE_HELM=1 cargo test --test helm",
            path.display()
        );
    }
    let dir = root().join(CHART).join("files/controller");
    for e in std::fs::read_dir(&dir).expect("files/controller").flatten() {
        let p = e.path();
        if !expected.iter().any(|(x, _)| x == &p) {
            if update {
                std::fs::remove_file(&p).expect("remove stale copy");
            } else {
                panic!("{} has no source in deploy/controller", p.display());
            }
        }
    }
}

fn helm() -> Option<String> {
    let bin = std::env::var("HELM").unwrap_or_else(|_| "helm".to_string());
    match Command::new(&bin).arg("version").output() {
        Ok(o) if o.status.success() => Some(bin),
        _ => {
            eprintln!(
                "skipped: helm not found (set HELM or put helm on PATH; .ci/run installs it)"
            );
            None
        }
    }
}

fn docs(text: &str, what: &str) -> Vec<Value> {
    rbac_rules::yaml::parse_documents(Path::new(what), text)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .into_iter()
        .map(|d| d.value)
        .collect()
}

fn template(helm: &str, set: &[&str]) -> Vec<Value> {
    let mut cmd = Command::new(helm);
    cmd.current_dir(root()).args([
        "template",
        "rbac-rules",
        CHART,
        "--namespace",
        NAMESPACE,
        "--include-crds",
        "--kube-version",
        "1.30.0",
    ]);
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("run helm");
    assert!(
        out.status.success(),
        "helm template failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    docs(&String::from_utf8_lossy(&out.stdout), "helm template")
}

fn key(o: &Value) -> String {
    format!(
        "{} {}/{}",
        o["kind"].as_str().unwrap_or_default(),
        o["metadata"]["namespace"].as_str().unwrap_or_default(),
        o["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// Drops what legitimately differs: Helm's own labels and the image (set by
/// kustomize `images:` and by values respectively).
fn substance(o: &Value) -> Value {
    let mut o = o.clone();
    if let Some(labels) = o["metadata"]["labels"].as_object_mut() {
        for k in [
            "helm.sh/chart",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
        ] {
            labels.remove(k);
        }
    }
    if let Some(cs) = o["spec"]["template"]["spec"]["containers"].as_array_mut() {
        for c in cs {
            if let Some(m) = c.as_object_mut() {
                m.remove("image");
            }
        }
    }
    o
}

/// The standard labels every chart object carries.
const STANDARD_LABELS: &[&str] = &[
    "helm.sh/chart",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
];

/// The chart's object without the standard labels the base's object does
/// not carry (the chart adds them to every object; the base, to some).
fn without_added_labels(chart: &Value, base: &Value) -> Value {
    let mut o = chart.clone();
    if let Some(labels) = o["metadata"]["labels"].as_object_mut() {
        for k in STANDARD_LABELS {
            if base["metadata"]["labels"].get(*k).is_none() {
                labels.remove(*k);
            }
        }
        // As `substance` leaves a base object without labels: null.
        if labels.is_empty() {
            o["metadata"]["labels"] = Value::Null;
        }
    }
    o
}

#[test]
fn chart_lints_and_equals_the_kustomize_base() {
    let Some(helm) = helm() else { return };
    let lint = Command::new(&helm)
        .current_dir(root())
        .args(["lint", "--strict", CHART])
        .output()
        .expect("run helm lint");
    assert!(
        lint.status.success(),
        "helm lint:\n{}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );
    let chart = template(&helm, &[]);
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(root().join("deploy"))
        .output()
        .expect("run kubectl kustomize (kubectl must be on PATH)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let base = docs(
        &String::from_utf8_lossy(&out.stdout),
        "kubectl kustomize deploy/",
    );
    // The release namespace is Helm's (--create-namespace), not the chart's.
    for b in base.iter().filter(|o| o["kind"] != "Namespace") {
        let Some(c) = chart.iter().find(|c| key(c) == key(b)) else {
            panic!("the chart does not render {} of deploy/", key(b));
        };
        pretty_assertions::assert_eq!(
            without_added_labels(&substance(c), b),
            substance(b),
            "{}",
            key(b)
        );
    }
    for c in &chart {
        assert!(
            base.iter().any(|b| key(b) == key(c)),
            "the chart renders {}, which deploy/ does not have",
            key(c)
        );
    }
}

#[test]
fn chart_values_switch_features() {
    let Some(helm) = helm() else { return };
    let off = template(&helm, &["builtinRules=false"]);
    assert!(!off.iter().any(|o| o["kind"] == "RbacRule"));
    assert!(off.iter().any(|o| o["kind"] == "CustomResourceDefinition"));
    let on = template(
        &helm,
        &[
            "serviceMonitor.enabled=true",
            "manage=basic",
            "allowClusterRole=rbac-rules:allow",
            "extraArgs={--debounce-ms=500}",
            "image.repository=registry.example.org/rbac-rules",
            "image.tag=1.2.3",
            "params.crossplaneNamespace=xp-system",
            "maxUnconfirmedPrunes=50",
        ],
    );
    let sm = on
        .iter()
        .find(|o| o["kind"] == "ServiceMonitor")
        .expect("ServiceMonitor");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    let d = on
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("Deployment");
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "registry.example.org/rbac-rules:1.2.3");
    let env = c["env"].as_array().expect("env");
    let var = |n: &str| {
        env.iter()
            .find(|e| e["name"] == n)
            .map(|e| e["value"].clone())
    };
    assert_eq!(var("RBAC_RULES_MANAGE"), Some("basic".into()));
    assert_eq!(
        var("RBAC_RULES_ALLOW_CLUSTERROLE"),
        Some("rbac-rules:allow".into())
    );
    // Crossplane in another namespace: one variable, the param's own.
    assert_eq!(
        var("RBAC_RULES_PARAM_crossplaneNamespace"),
        Some("xp-system".into())
    );
    assert_eq!(var("RBAC_RULES_PARAMS"), None);
    assert_eq!(var("RBAC_RULES_MAX_UNCONFIRMED_PRUNES"), Some("50".into()));
    assert_eq!(
        c["args"].as_array().expect("args").last(),
        Some(&"--debounce-ms=500".into())
    );
    // Adoption: off unless asked for, then the controller's own variable.
    assert_eq!(var("RBAC_RULES_ADOPT_EXISTING"), None);
    let adopting = template(&helm, &["adoptExisting=true", "admissionFence=false"]);
    let d = adopting
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("Deployment");
    let env = &d["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        env.as_array()
            .expect("env")
            .contains(&serde_json::json!({"name": "RBAC_RULES_ADOPT_EXISTING", "value": "true"})),
        "{env}"
    );
    assert!(
        !adopting
            .iter()
            .any(|o| o["kind"] == "ValidatingAdmissionPolicy"
                && o["metadata"]["name"] == "rbac-rules-fence"),
        "admissionFence=false lifts the fence for the adoption"
    );
}

/// `helm template` of the chart with `set`, or helm's error.
fn try_template(helm: &str, chart: &Path, extra: &[&str]) -> Result<String, String> {
    let out = Command::new(helm)
        .current_dir(root())
        .args(["template", "rbac-rules"])
        .arg(chart)
        .args(["--namespace", NAMESPACE])
        .args(extra)
        .output()
        .expect("run helm");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn every_object_carries_the_standard_labels() {
    let Some(helm) = helm() else { return };
    let objects = template(&helm, &["serviceMonitor.enabled=true"]);
    assert!(objects.len() > 15);
    // The admission fence's objects too.
    assert!(
        objects
            .iter()
            .any(|o| o["kind"] == "ValidatingAdmissionPolicyBinding")
    );
    for o in objects
        .iter()
        .filter(|o| o["kind"] != "CustomResourceDefinition")
    {
        let labels = &o["metadata"]["labels"];
        for k in STANDARD_LABELS {
            assert!(
                labels[*k].is_string(),
                "{} lacks the label {k}: {labels}",
                key(o)
            );
        }
        assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm", "{}", key(o));
        assert_eq!(
            labels["app.kubernetes.io/instance"],
            "rbac-rules",
            "{}",
            key(o)
        );
    }
}

#[test]
fn the_chart_needs_kubernetes_1_30() {
    let chart: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root().join(CHART).join("Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("YAML");
    assert_eq!(chart["kubeVersion"], ">=1.30.0-0");
    let Some(helm) = helm() else { return };
    let chart = root().join(CHART);
    let old = try_template(&helm, &chart, &["--kube-version", "1.29.0"]).expect_err("1.29");
    assert!(old.contains("kubeVersion"), "{old}");
    assert!(try_template(&helm, &chart, &["--kube-version", "1.30.0"]).is_ok());
}

#[test]
fn the_schema_refuses_wrong_values() {
    let Some(helm) = helm() else { return };
    let chart = root().join(CHART);
    for (set, why) in [
        ("manage=everything", "manage"),
        ("replica=3", "replica"),
        ("logFormat=xml", "logFormat"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("serviceMonitor.interval=soon", "interval"),
        ("replicas=-1", "replicas"),
        // A param's name becomes part of a variable's name: only names
        // rules can declare.
        ("params.crossplane-namespace=x", "crossplane-namespace"),
        ("params.crossplaneNamespace=3", "params.crossplaneNamespace"),
    ] {
        let err = try_template(&helm, &chart, &["--kube-version", "1.30.0", "--set", set])
            .expect_err(set);
        assert!(err.contains(why), "{set}: {err}");
    }
}

/// Every key of values.yaml is in the schema and in the chart README's
/// values table.
#[test]
fn every_value_is_in_the_schema_and_the_readme() {
    let values: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root().join(CHART).join("values.yaml")).expect("values.yaml"),
    )
    .expect("YAML");
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join(CHART).join("values.schema.json"))
            .expect("values.schema.json"),
    )
    .expect("JSON");
    let readme = std::fs::read_to_string(root().join(CHART).join("README.md")).expect("README");
    // Leaves of maps the README documents key by key; other maps whole.
    const WHOLE: &[&str] = &[
        "resources",
        "podSecurityContext",
        "securityContext",
        "nodeSelector",
        "affinity",
        "podAnnotations",
        "podLabels",
        "serviceAccount.annotations",
        "serviceMonitor.labels",
    ];
    fn walk(
        v: &Value,
        schema: &Value,
        prefix: &str,
        whole: &[&str],
        out: &mut Vec<(String, bool)>,
    ) {
        let Some(m) = v.as_object() else { return };
        for (k, child) in m {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            let sub = &schema["properties"][k];
            out.push((key.clone(), !sub.is_null()));
            if child.is_object() && !whole.contains(&key.as_str()) {
                walk(child, sub, &key, whole, out);
            }
        }
    }
    let mut keys = Vec::new();
    walk(&values, &schema, "", WHOLE, &mut keys);
    assert!(keys.len() > 20);
    for (k, in_schema) in keys {
        assert!(
            in_schema,
            "values.yaml key {k} is not in values.schema.json"
        );
        let nested = values
            .pointer(&format!("/{}", k.replace('.', "/")))
            .is_some_and(|v| v.is_object() && !WHOLE.contains(&k.as_str()));
        if !nested {
            assert!(
                readme.contains(&format!("| `{k}` |")),
                "the chart README's values table lacks {k}"
            );
        }
    }
}

#[test]
fn names_service_account_and_scheduling_follow_the_values() {
    let Some(helm) = helm() else { return };
    let find = |objs: &[Value], kind: &str| -> Value {
        objs.iter()
            .find(|o| o["kind"] == kind)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    let objs = template(
        &helm,
        &[
            "fullnameOverride=rbac",
            "serviceAccount.name=rbac-controller",
            "admissionFence=false",
            "nodeSelector.pool=system",
            "tolerations[0].key=dedicated",
            "tolerations[0].operator=Exists",
            "topologySpreadConstraints[0].maxSkew=1",
            "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
            "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=kubernetes.io/os",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=In",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values[0]=linux",
            "priorityClassName=system-cluster-critical",
        ],
    );
    let d = find(&objs, "Deployment");
    assert_eq!(d["metadata"]["name"], "rbac");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "rbac-controller");
    assert_eq!(pod["nodeSelector"]["pool"], "system");
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert_eq!(pod["topologySpreadConstraints"][0]["maxSkew"], 1);
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert!(pod["affinity"]["nodeAffinity"].is_object(), "{pod}");
    assert!(
        pod["affinity"]["podAntiAffinity"].is_null(),
        "given affinity replaces the default"
    );
    assert_eq!(
        find(&objs, "ServiceAccount")["metadata"]["name"],
        "rbac-controller"
    );
    assert_eq!(find(&objs, "Service")["metadata"]["name"], "rbac-metrics");
    assert_eq!(
        find(&objs, "PodDisruptionBudget")["metadata"]["name"],
        "rbac"
    );
    // Every binding of the controller names the ServiceAccount it runs as.
    let bound: Vec<&Value> = objs
        .iter()
        .filter(|o| o["kind"].as_str().is_some_and(|k| k.ends_with("Binding")))
        .flat_map(|b| b["subjects"].as_array().into_iter().flatten())
        .filter(|s| s["kind"] == "ServiceAccount")
        .collect();
    assert!(!bound.is_empty());
    for s in bound {
        assert_eq!(s["name"], "rbac-controller", "{s}");
        assert_eq!(s["namespace"], NAMESPACE, "{s}");
    }
    // The default: anti-affinity over nodes; no ServiceAccount when one is
    // given; the fence refuses a ServiceAccount it does not name.
    let d = find(&template(&helm, &[]), "Deployment");
    assert!(d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"].is_object());
    let none = template(
        &helm,
        &[
            "serviceAccount.create=false",
            "podDisruptionBudget.enabled=false",
        ],
    );
    assert!(
        !none
            .iter()
            .any(|o| o["kind"] == "ServiceAccount" || o["kind"] == "PodDisruptionBudget")
    );
    let err = try_template(
        &helm,
        &root().join(CHART),
        &[
            "--kube-version",
            "1.30.0",
            "--set",
            "serviceAccount.name=other",
        ],
    )
    .expect_err("the fence names rbac-rules");
    assert!(err.contains("admissionFence"), "{err}");
}

/// NOTES.txt, rendered as Helm renders it after an install: it says the
/// default image is not published and that upgrades leave the CRD alone.
#[test]
fn notes_tell_the_truth() {
    let Some(helm) = helm() else { return };
    // helm template does not render NOTES.txt: render a copy of it as a
    // ConfigMap of a copy of the chart.
    let dir = tempfile::tempdir().expect("tempdir");
    let chart = dir.path().join("rbac-rules");
    let status = Command::new("cp")
        .arg("-r")
        .arg(root().join(CHART))
        .arg(&chart)
        .status()
        .expect("cp");
    assert!(status.success());
    std::fs::rename(chart.join("templates/NOTES.txt"), chart.join("NOTES.txt")).expect("move");
    std::fs::write(
        chart.join("templates/notes-test.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n{{ tpl (.Files.Get \"NOTES.txt\") . | indent 4 }}\n",
    )
    .expect("write");
    let notes = |set: &[&str]| -> String {
        let mut args = vec![
            "--kube-version",
            "1.30.0",
            "--show-only",
            "templates/notes-test.yaml",
        ];
        for s in set {
            args.extend(["--set", s]);
        }
        let text = try_template(&helm, &chart, &args).expect("renders");
        let v: Value = serde_saphyr::from_str(&text).expect("YAML");
        v["data"]["notes"].as_str().expect("notes").to_string()
    };
    let default = notes(&[]);
    assert!(
        default.contains("no image of that\nname is published"),
        "{default}"
    );
    assert!(
        default.contains("docker build -f deploy/Dockerfile"),
        "{default}"
    );
    assert!(
        default.contains("`helm upgrade` does not upgrade the RbacRule CRD"),
        "{default}"
    );
    let built = notes(&["image.repository=registry.example.org/rbac-rules"]);
    assert!(!built.contains("is published"), "{built}");
    assert!(
        built.contains("does not upgrade the RbacRule CRD"),
        "{built}"
    );
    let open = notes(&["allowClusterRole=", "admissionFence=false"]);
    assert!(open.contains("allowClusterRole is empty"), "{open}");
    assert!(open.contains("admissionFence is off"), "{open}");
    assert!(!open.contains("Adoption is on"), "{open}");
    let adopting = notes(&["adoptExisting=true", "admissionFence=false"]);
    assert!(
        adopting.contains("--set adoptExisting=false --set admissionFence=true"),
        "{adopting}"
    );
    // Where the built-in rules look for Crossplane, and that each sentence
    // ends before the next paragraph.
    assert!(
        built.contains("namespace crossplane-system (Crossplane elsewhere: --set\nparams.crossplaneNamespace=NS)."),
        "{built}"
    );
    assert!(built.contains("Orphan)."), "{built}");
    assert!(built.contains(".\n\nLabel the namespace"), "{built}");
    let upbound = notes(&[
        "image.repository=registry.example.org/rbac-rules",
        "params.crossplaneNamespace=upbound-system",
    ]);
    assert!(upbound.contains("namespace upbound-system."), "{upbound}");
    assert!(!upbound.contains("Crossplane elsewhere"), "{upbound}");
}

/// The `RBAC_RULES_PARAM*` variables of the chart's Deployment with `set`.
fn param_env(helm: &str, set: &[&str]) -> Vec<(String, String)> {
    let objects = template(helm, set);
    let d = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("Deployment");
    d["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| {
            let name = e["name"].as_str()?;
            name.starts_with("RBAC_RULES_PARAM").then(|| {
                (
                    name.to_string(),
                    e["value"].as_str().unwrap_or("").to_string(),
                )
            })
        })
        .collect()
}

/// Settings are data: the issue's value (in one variable split at `,` it
/// set a second param and bound Crossplane's role in team-a) stays one
/// value of one variable, and the controller's binary refuses it by its
/// format, naming the variable; nothing is rendered.
#[test]
fn a_param_value_cannot_set_another_param() {
    let Some(helm) = helm() else { return };
    let hostile = "devs,crossplaneNamespace=team-a";
    let env = param_env(
        &helm,
        &[r"params.crossplaneNamespace=devs\,crossplaneNamespace=team-a"],
    );
    assert_eq!(
        env,
        vec![(
            "RBAC_RULES_PARAM_crossplaneNamespace".to_string(),
            hostile.to_string()
        )]
    );
    // Two params: two variables, each value whole (`=` included).
    let env = param_env(
        &helm,
        &[
            "params.crossplaneNamespace=xp-system",
            r"params.other=a=b\,c",
        ],
    );
    assert_eq!(
        env,
        vec![
            (
                "RBAC_RULES_PARAM_crossplaneNamespace".to_string(),
                "xp-system".to_string()
            ),
            ("RBAC_RULES_PARAM_other".to_string(), "a=b,c".to_string()),
        ]
    );
    // What the controller makes of the chart's variable: the value is
    // refused, by name and origin; no role is rendered, none in team-a.
    let env = param_env(
        &helm,
        &[r"params.crossplaneNamespace=devs\,crossplaneNamespace=team-a"],
    );
    let out = Command::new(env!("CARGO_BIN_EXE_rbac-rules"))
        .current_dir(root())
        .args(["render", "--objects", "examples/crossplane-cluster.yaml"])
        .env_remove("RBAC_RULES_PARAMS")
        .envs(env)
        .output()
        .expect("run rbac-rules");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(
        stderr.contains(
            "param crossplaneNamespace: \"devs,crossplaneNamespace=team-a\" (from environment variable RBAC_RULES_PARAM_crossplaneNamespace) is not a valid dnsLabel"
        ),
        "{stderr}"
    );
}

#[test]
fn the_inventory_fence_is_opt_in_and_exempts_only_the_releases_service_account() {
    let Some(helm) = helm() else { return };
    let chart = root().join(CHART);
    let policies = |text: &str| -> Vec<Value> {
        text.split("\n---\n")
            .filter_map(|d| serde_saphyr::from_str::<Value>(d).ok())
            .filter(|o| o["metadata"]["name"] == "rbac-rules-inventory")
            .collect()
    };
    let off = try_template(&helm, &chart, &["--kube-version", "1.30.0"]).expect("template");
    assert!(policies(&off).is_empty(), "on by default");
    let on = try_template(
        &helm,
        &chart,
        &[
            "--kube-version",
            "1.30.0",
            "--namespace",
            "platform-rbac",
            "--set",
            "inventoryFence=true",
        ],
    )
    .expect("template");
    let objs = policies(&on);
    assert_eq!(objs.len(), 2, "the policy and its binding");
    let policy = objs
        .iter()
        .find(|o| o["kind"] == "ValidatingAdmissionPolicy")
        .expect("policy");
    let exemption = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .expect("expression");
    assert!(
        exemption.contains("'system:serviceaccount:platform-rbac:rbac-rules'"),
        "{exemption}"
    );
    assert!(!exemption.contains("rbac-rules-system"), "{exemption}");
    // The validations are the file's, unchanged.
    let file: Vec<Value> = read_docs(&root().join("deploy/inventory-fence.yaml"));
    let original = file
        .iter()
        .find(|o| o["kind"] == "ValidatingAdmissionPolicy")
        .expect("file policy");
    assert_eq!(
        policy["spec"]["validations"],
        original["spec"]["validations"]
    );
}

fn read_docs(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .expect("read")
        .split("\n---\n")
        .filter_map(|d| serde_saphyr::from_str::<Value>(d).ok())
        .collect()
}

/// Delegation at admission is on by default and `tenantAdmission=false`
/// takes exactly its two objects out; the NamespacedRbacRule CRD and the
/// grant to namespace admins stay.
#[test]
fn tenant_admission_follows_its_value() {
    let Some(helm) = helm() else { return };
    let names = |objs: &[Value]| -> Vec<String> {
        objs.iter()
            .filter(|o| {
                o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("tenant"))
            })
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or_default(),
                    o["metadata"]["name"].as_str().unwrap_or_default()
                )
            })
            .collect()
    };
    let on = template(&helm, &[]);
    assert_eq!(
        names(&on),
        [
            "ClusterRole/rbac-rules:tenant-admin",
            "ValidatingAdmissionPolicy/rbac-rules-tenant-grants",
            "ValidatingAdmissionPolicyBinding/rbac-rules-tenant-grants"
        ]
    );
    let off = template(&helm, &["tenantAdmission=false"]);
    assert_eq!(names(&off), ["ClusterRole/rbac-rules:tenant-admin"]);
    assert_eq!(on.len(), off.len() + 2);
}
