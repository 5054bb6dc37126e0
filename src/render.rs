//! `rbac-rules render`: the engine offline, on YAML files.
//!
//! Success: every emitted object on stdout as a YAML stream, exit 0.
//! Any invalid rule, input or render: every error on stderr, nothing on
//! stdout, exit 1.

use std::path::PathBuf;
use std::process::ExitCode;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use serde_json::Value;

use crate::api::ManageLevel;
use crate::engine::{Engine, ObjectStore, Options, store::object_ref};
use crate::rules::{self, LoadError};
use crate::yaml::{self, YamlError};

/// Arguments of `render`.
#[derive(clap::Args, Clone, Debug)]
pub struct RenderArgs {
    /// YAML files or directories with the cluster's objects (multi-document
    /// or `kind: List`).
    #[arg(long, required = true, num_args = 1..)]
    pub objects: Vec<PathBuf>,
    /// Rule files or directories. Default: the built-in rules.
    #[arg(long, num_args = 1..)]
    pub rules: Vec<PathBuf>,
    /// Also fill each aggregated ClusterRole's rules as the Kubernetes
    /// aggregation controller would.
    #[arg(long)]
    pub flatten: bool,
    /// Highest manage level of rules to run: serviceaccounts, basic or all.
    #[arg(long, default_value = "all", value_parser = crate::parse_manage)]
    pub manage: ManageLevel,
    /// A YAML file with a ClusterRole whose rules are the allow-list.
    #[arg(long)]
    pub allow: Option<PathBuf>,
    /// Read directories given to --rules and --objects recursively (like
    /// kubectl's -R); without it only a directory's own files are read.
    #[arg(short = 'R', long)]
    pub recursive: bool,
}

/// Why a render failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// A rule file.
    #[error(transparent)]
    Rules(#[from] LoadError),
    /// An objects file.
    #[error(transparent)]
    Yaml(#[from] YamlError),
    /// An object without apiVersion, kind or name.
    #[error("{origin}: {message}")]
    Object { origin: String, message: String },
    /// The allow-list file.
    #[error("{path}: {message}")]
    Allow { path: String, message: String },
    /// Invalid rules or evaluation errors, one per line.
    #[error("{}", .0.join("\n"))]
    Evaluation(Vec<String>),
}

/// Runs `render` and returns the YAML stream.
pub fn render(args: &RenderArgs) -> Result<String, RenderError> {
    let loaded = if args.rules.is_empty() {
        rules::builtin_with_origins()
    } else {
        rules::load_tree_with_origins(&args.rules, args.recursive)
    }
    .map_err(|errs| {
        RenderError::Evaluation(errs.iter().map(|e| format!("error: {e}")).collect())
    })?;
    let origins: std::collections::BTreeMap<String, String> = loaded
        .iter()
        .map(|(o, r)| (r.name.clone(), o.clone()))
        .collect();
    let rules: Vec<_> = loaded.into_iter().map(|(_, r)| r).collect();
    let mut store = ObjectStore::new();
    for doc in yaml::load_tree(&args.objects, args.recursive)? {
        store
            .insert(doc.value.clone())
            .map_err(|message| RenderError::Object {
                origin: doc.origin(),
                message,
            })?;
    }
    let allow = match &args.allow {
        Some(p) => Some(load_allow(p)?),
        None => None,
    };
    let engine = Engine::new(
        &rules,
        Options {
            manage: args.manage,
            allow,
            ..Options::default()
        },
    );
    let eval = engine.evaluate(&store);
    // Each error names the file the rule came from, then rule and field.
    let errors: Vec<String> = eval
        .errors()
        .map(|e| match origins.get(&e.rule) {
            Some(origin) => format!("error: {origin}: {e}"),
            None => format!("error: {e}"),
        })
        .collect();
    if !errors.is_empty() {
        return Err(RenderError::Evaluation(errors));
    }
    let mut objects: Vec<Value> = eval.desired.iter().map(|d| (*d.object).clone()).collect();
    if args.flatten {
        flatten(&store, &mut objects)?;
    }
    Ok(yaml::to_yaml_stream(&objects)?)
}

/// Fills aggregated ClusterRoles among `objects` from every ClusterRole in
/// the input and the output.
fn flatten(store: &ObjectStore, objects: &mut [Value]) -> Result<(), RenderError> {
    let gk = crate::engine::GroupKind::new("rbac.authorization.k8s.io", "ClusterRole");
    let mut all: Vec<ClusterRole> = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for o in objects.iter().filter(|o| o["kind"] == "ClusterRole") {
        names.insert(
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
        all.push(parse_cluster_role(o)?);
    }
    for o in store.list(&gk) {
        if !names.contains(o["metadata"]["name"].as_str().unwrap_or_default()) {
            all.push(parse_cluster_role(o)?);
        }
    }
    let aggregated = crate::policy::aggregate(&all)
        .map_err(|e| RenderError::Evaluation(vec![format!("error: {e}")]))?;
    for o in objects
        .iter_mut()
        .filter(|o| o["kind"] == "ClusterRole" && o.get("aggregationRule").is_some())
    {
        let name = o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if let Some(r) = aggregated
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name.as_str()))
        {
            let rules =
                serde_json::to_value(r.rules.clone().unwrap_or_default()).unwrap_or(Value::Null);
            if let Some(m) = o.as_object_mut() {
                m.insert("rules".to_string(), rules);
            }
        }
    }
    Ok(())
}

fn parse_cluster_role(o: &Value) -> Result<ClusterRole, RenderError> {
    serde_json::from_value(o.clone()).map_err(|e| RenderError::Object {
        origin: object_ref(o),
        message: format!("not a valid ClusterRole: {e}"),
    })
}

fn load_allow(path: &PathBuf) -> Result<Vec<PolicyRule>, RenderError> {
    let docs = yaml::load_paths(std::slice::from_ref(path))?;
    let mut rules = Vec::new();
    for d in docs {
        let role: ClusterRole =
            serde_json::from_value(d.value.clone()).map_err(|e| RenderError::Allow {
                path: d.origin(),
                message: format!("not a ClusterRole: {e}"),
            })?;
        rules.extend(role.rules.unwrap_or_default());
    }
    Ok(rules)
}

/// The `render` command: prints, or reports errors and fails.
pub fn main(args: &RenderArgs) -> ExitCode {
    match render(args) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(RenderError::Evaluation(lines)) => {
            for l in lines {
                eprintln!("{l}");
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
