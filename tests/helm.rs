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
        pretty_assertions::assert_eq!(substance(c), substance(b), "{}", key(b));
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
    assert_eq!(
        c["args"].as_array().expect("args").last(),
        Some(&"--debounce-ms=500".into())
    );
}
