//! The settings of the installed controller, so that `diff`, `explain` and
//! `test` evaluate as it does: its params (`--param NAME=VALUE` arguments
//! and `RBAC_RULES_PARAM_<name>` variables), its allow-list ClusterRole
//! (`--allow-clusterrole`, `RBAC_RULES_ALLOW_CLUSTERROLE`), its manage level
//! and its `--max-unconfirmed-prunes`, read from its Deployment (in the
//! cluster, or in a dump given with `--objects`).
//!
//! A Deployment is data: only the container that runs `rbac-rules run` is
//! read, each setting whole, exactly as the controller's own parser reads
//! its arguments and environment ([`crate::params::parse_param`]). A value
//! the Deployment takes from elsewhere (`valueFrom`, `envFrom`) cannot be
//! known here and is reported, never guessed.

use std::collections::BTreeMap;

use serde_json::Value;

/// The label every controller Deployment carries (deploy/ and the chart).
pub const NAME_LABEL: &str = "app.kubernetes.io/name=rbac-rules";

/// What the installed controller runs with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Installed {
    /// The Deployment read, `namespace/name`, for messages.
    pub deployment: String,
    /// Its params by name (a flag wins over the variable, as in `run`).
    pub params: BTreeMap<String, String>,
    /// Its allow-list ClusterRole, if any.
    pub allow_clusterrole: Option<String>,
    /// Its `--manage` level as written, if set.
    pub manage: Option<String>,
    /// Its `--max-unconfirmed-prunes`, if set.
    pub max_unconfirmed_prunes: Option<usize>,
    /// Settings it takes from elsewhere (`valueFrom`, `envFrom`), which
    /// cannot be read from the Deployment: named in a note.
    pub unknown: Vec<String>,
}

/// The container of a Deployment that runs the controller: its first
/// argument is `run` (the image's entrypoint is `rbac-rules`).
fn controller_container(d: &Value) -> Option<&Value> {
    d["spec"]["template"]["spec"]["containers"]
        .as_array()?
        .iter()
        .find(|c| {
            let first = c["args"][0].as_str().or(c["command"][1].as_str());
            first == Some("run")
                && c["image"]
                    .as_str()
                    .is_some_and(|i| i.contains("rbac-rules"))
        })
}

/// Whether an object is a Deployment of the controller.
pub fn is_controller(o: &Value) -> bool {
    o["kind"] == "Deployment"
        && o["apiVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("apps/"))
        && controller_container(o).is_some()
}

/// The controller's settings as its Deployment gives them; `None` when the
/// Deployment runs no `rbac-rules run` container.
pub fn from_deployment(d: &Value) -> Option<Installed> {
    let c = controller_container(d)?;
    let mut out = Installed {
        deployment: format!(
            "{}/{}",
            d["metadata"]["namespace"].as_str().unwrap_or_default(),
            d["metadata"]["name"].as_str().unwrap_or_default()
        ),
        ..Installed::default()
    };
    // Environment first: a flag wins over its variable.
    let mut env_params = BTreeMap::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let Some(name) = e["name"].as_str() else {
            continue;
        };
        let value = e["value"].as_str();
        let ours = name.starts_with(crate::params::ENV_PREFIX)
            || matches!(
                name,
                "RBAC_RULES_ALLOW_CLUSTERROLE"
                    | "RBAC_RULES_MANAGE"
                    | "RBAC_RULES_MAX_UNCONFIRMED_PRUNES"
            );
        if !ours {
            continue;
        }
        if e.get("valueFrom").is_some() {
            out.unknown
                .push(format!("environment variable {name} (valueFrom)"));
            continue;
        }
        // No value: the variable is set, empty.
        let value = value.unwrap_or_default();
        set_env(&mut out, &mut env_params, name, value);
    }
    if c["envFrom"].as_array().is_some_and(|a| !a.is_empty()) {
        out.unknown
            .push("envFrom (variables from a ConfigMap or Secret)".to_string());
    }
    out.params = env_params;
    let args: Vec<&str> = c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut i = 0;
    while i < args.len() {
        let (flag, inline) = match args[i].split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v)),
            _ => (args[i], None),
        };
        let takes = matches!(
            flag,
            "--param" | "--allow-clusterrole" | "--manage" | "--max-unconfirmed-prunes"
        );
        let value = match inline {
            Some(v) => Some(v),
            None if takes => {
                i += 1;
                args.get(i).copied()
            }
            None => None,
        };
        match (flag, value) {
            ("--param", Some(v)) => {
                if let Ok((k, v)) = crate::params::parse_param(v) {
                    out.params.insert(k, v);
                }
            }
            ("--allow-clusterrole", Some(v)) => out.allow_clusterrole = Some(v.to_string()),
            ("--manage", Some(v)) => out.manage = Some(v.to_string()),
            ("--max-unconfirmed-prunes", Some(v)) => {
                out.max_unconfirmed_prunes = v.parse().ok();
            }
            _ => {}
        }
        i += 1;
    }
    if out.allow_clusterrole.as_deref() == Some("") {
        out.allow_clusterrole = None;
    }
    Some(out)
}

fn set_env(out: &mut Installed, params: &mut BTreeMap<String, String>, name: &str, value: &str) {
    if let Some(p) = name.strip_prefix(crate::params::ENV_PREFIX) {
        if crate::params::is_name(p) {
            params.insert(p.to_string(), value.to_string());
        }
        return;
    }
    match name {
        "RBAC_RULES_ALLOW_CLUSTERROLE" => out.allow_clusterrole = Some(value.to_string()),
        "RBAC_RULES_MANAGE" => out.manage = Some(value.to_string()),
        _ => out.max_unconfirmed_prunes = value.parse().ok(),
    }
}

/// The controller's settings from the objects of a dump: the one
/// controller Deployment there, else why none is used.
pub fn from_objects(objects: &[Value]) -> Result<Installed, String> {
    one_of(objects.iter().filter(|o| is_controller(o)).collect())
}

/// The settings of the one controller Deployment among `found`.
fn one_of(found: Vec<&Value>) -> Result<Installed, String> {
    match found.as_slice() {
        [] => Err("no Deployment running `rbac-rules run` found".to_string()),
        [d] => from_deployment(d).ok_or_else(|| "no controller container".to_string()),
        many => Err(format!(
            "{} Deployments run `rbac-rules run` ({}): none is used",
            many.len(),
            many.iter()
                .map(|d| format!(
                    "{}/{}",
                    d["metadata"]["namespace"].as_str().unwrap_or_default(),
                    d["metadata"]["name"].as_str().unwrap_or_default()
                ))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The controller's settings from the cluster: the Deployments labelled
/// [`NAME_LABEL`] in every namespace (one LIST).
pub async fn from_cluster(client: &kube::Client) -> Result<Installed, String> {
    use k8s_openapi::api::apps::v1::Deployment;
    let api: kube::Api<Deployment> = kube::Api::all(client.clone());
    let list = api
        .list(&kube::api::ListParams::default().labels(NAME_LABEL))
        .await
        .map_err(|e| format!("cannot list Deployments labelled {NAME_LABEL}: {e}"))?;
    let values: Vec<Value> = list
        .items
        .iter()
        .filter_map(|d| serde_json::to_value(d).ok())
        .map(|mut v| {
            // Typed objects are listed without apiVersion and kind.
            v["apiVersion"] = "apps/v1".into();
            v["kind"] = "Deployment".into();
            v
        })
        .collect();
    one_of(values.iter().filter(|o| is_controller(o)).collect())
}

/// Params for a command: the installed controller's, with those given on
/// the command line (`given`, by name) in their place; a warning for each
/// one that differs, naming both values.
pub fn merge_params(
    given: &BTreeMap<String, String>,
    installed: &Installed,
) -> (BTreeMap<String, String>, Vec<String>) {
    let mut out = installed.params.clone();
    let mut warnings = Vec::new();
    for (k, v) in given {
        match installed.params.get(k) {
            Some(i) if i != v => warnings.push(format!(
                "--param {k}={v:?} differs from the installed controller's {k}={i:?} (Deployment {}); using {v:?}",
                installed.deployment
            )),
            None => warnings.push(format!(
                "--param {k}={v:?}: the installed controller (Deployment {}) does not set {k}; using {v:?}",
                installed.deployment
            )),
            _ => {}
        }
        out.insert(k.clone(), v.clone());
    }
    (out, warnings)
}

/// The allow-list ClusterRole for a command: the one given, else the
/// installed controller's; a warning when both are set and differ.
pub fn merge_allow(given: Option<&str>, installed: &Installed) -> (Option<String>, Vec<String>) {
    match (given, installed.allow_clusterrole.as_deref()) {
        (Some(g), Some(i)) if g != i => (
            Some(g.to_string()),
            vec![format!(
                "--allow-clusterrole {g:?} differs from the installed controller's {i:?} (Deployment {}); using {g:?}",
                installed.deployment
            )],
        ),
        (Some(g), _) => (Some(g.to_string()), Vec::new()),
        (None, i) => (i.map(str::to_string), Vec::new()),
    }
}

/// Notes on what could not be read from the Deployment.
pub fn unknown_notes(installed: &Installed) -> Vec<String> {
    installed
        .unknown
        .iter()
        .map(|u| {
            format!(
                "the installed controller (Deployment {}) takes {u} from elsewhere: not read here; give it on the command line",
                installed.deployment
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(args: Value, env: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "rbac-rules", "namespace": "rbac-rules-system"},
        "spec": {"template": {"spec": {"containers": [
            {"name": "sidecar", "image": "busybox", "args": ["run", "--param=x=evil"]},
            {"name": "controller", "image": "ghcr.io/x/rbac-rules:1", "args": args, "env": env}
        ]}}}})
    }

    #[test]
    fn reads_flags_and_variables_as_run_does() {
        let d = deployment(
            json!([
                "run",
                "--param",
                "productNamespace=xp",
                "--param=a=b,c=d",
                "--max-unconfirmed-prunes=5"
            ]),
            json!([
                {"name": "RBAC_RULES_PARAM_productNamespace", "value": "from-env"},
                {"name": "RBAC_RULES_PARAM_other", "value": "o"},
                {"name": "RBAC_RULES_ALLOW_CLUSTERROLE", "value": "rbac-rules:allow-list"},
                {"name": "RBAC_RULES_MANAGE", "value": "basic"},
                {"name": "RBAC_RULES_PARAM_secret", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
            ]),
        );
        let i = from_objects(&[d]).expect("found");
        assert_eq!(i.deployment, "rbac-rules-system/rbac-rules");
        assert_eq!(
            i.params,
            BTreeMap::from([
                ("a".to_string(), "b,c=d".to_string()),
                ("productNamespace".to_string(), "xp".to_string()),
                ("other".to_string(), "o".to_string()),
            ])
        );
        assert_eq!(
            i.allow_clusterrole.as_deref(),
            Some("rbac-rules:allow-list")
        );
        assert_eq!(i.manage.as_deref(), Some("basic"));
        assert_eq!(i.max_unconfirmed_prunes, Some(5));
        assert_eq!(
            i.unknown,
            vec!["environment variable RBAC_RULES_PARAM_secret (valueFrom)".to_string()]
        );
    }

    #[test]
    fn the_command_line_wins_with_a_warning_naming_both() {
        let i = Installed {
            deployment: "ns/d".into(),
            params: BTreeMap::from([("productNamespace".into(), "xp".into())]),
            allow_clusterrole: Some("rbac-rules:allow-list".into()),
            ..Installed::default()
        };
        let (p, w) = merge_params(&BTreeMap::new(), &i);
        assert_eq!(p["productNamespace"], "xp");
        assert!(w.is_empty());
        let given = BTreeMap::from([("productNamespace".into(), "product-system".into())]);
        let (p, w) = merge_params(&given, &i);
        assert_eq!(p["productNamespace"], "product-system");
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("\"product-system\"") && w[0].contains("\"xp\"") && w[0].contains("ns/d"),
            "{w:?}"
        );
        let (a, w) = merge_allow(None, &i);
        assert_eq!(a.as_deref(), Some("rbac-rules:allow-list"));
        assert!(w.is_empty());
        let (a, w) = merge_allow(Some("mine"), &i);
        assert_eq!(a.as_deref(), Some("mine"));
        assert!(w[0].contains("\"mine\"") && w[0].contains("\"rbac-rules:allow-list\""));
    }

    #[test]
    fn none_or_two_controllers_are_said_so() {
        assert!(from_objects(&[]).unwrap_err().contains("no Deployment"));
        let d = deployment(json!(["run"]), json!([]));
        let mut e = d.clone();
        e["metadata"]["namespace"] = json!("other");
        let err = from_objects(&[d, e]).unwrap_err();
        assert!(
            err.contains("2 Deployments") && err.contains("other/rbac-rules"),
            "{err}"
        );
    }
}
