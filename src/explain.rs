//! `rbac-rules explain`: why an object is rendered, and what a subject may
//! do and through which bindings and aggregations, offline on `render`'s
//! inputs.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::Value;

use crate::api::ManageLevel;
use crate::engine::{Engine, ObjectStore, Options};
use crate::ruletest::{Access, Subject, World};
use crate::{rules, yaml};

/// Arguments of `explain`.
#[derive(clap::Args, Clone, Debug)]
pub struct ExplainArgs {
    /// YAML files or directories with the cluster's objects.
    #[arg(long, required = true, num_args = 1..)]
    pub objects: Vec<PathBuf>,
    /// Rule files or directories. Default: the built-in rules.
    #[arg(long, num_args = 1..)]
    pub rules: Vec<PathBuf>,
    /// Read directories recursively (like kubectl's -R).
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// Highest manage level of rules to run: serviceaccounts, basic or all.
    #[arg(long, default_value = "all", value_parser = crate::parse_manage)]
    pub manage: ManageLevel,
    /// A rendered object: `Kind/name` or `Kind/namespace/name`.
    #[arg(
        long,
        conflicts_with = "as_subject",
        required_unless_present = "as_subject"
    )]
    pub object: Option<String>,
    /// A subject: `user:NAME`, `group:NAME` or `serviceaccount:NS:NAME`.
    #[arg(long = "as", id = "as_subject")]
    pub as_subject: Option<String>,
}

/// Explains, returning the text to print or an error message.
pub fn explain(args: &ExplainArgs) -> Result<String, String> {
    let loaded =
        rules::load_for_command("explain", &args.rules, args.recursive).map_err(|errs| {
            errs.iter()
                .map(|e| format!("error: {e}"))
                .collect::<Vec<_>>()
                .join("\n")
        })?;
    let inputs: Vec<Value> = yaml::load_tree(&args.objects, args.recursive)
        .map_err(|e| format!("error: {e}"))?
        .into_iter()
        .map(|d| d.value)
        .collect();
    let mut store = ObjectStore::new();
    for o in &inputs {
        store
            .insert(o.clone())
            .map_err(|e| format!("error: {}: {e}", crate::engine::store::object_ref(o)))?;
    }
    let sources: Vec<_> = loaded.iter().map(|(_, r)| r.clone()).collect();
    let engine = Engine::new(
        &sources,
        Options {
            manage: args.manage,
            ..Options::default()
        },
    );
    let eval = engine.evaluate(&store);
    let mut text = String::new();
    for e in eval.errors() {
        text.push_str(&format!("note: render error: {e}\n"));
    }
    let output: Vec<Value> = eval.desired.iter().map(|d| d.object.to_value()).collect();
    if let Some(spec) = &args.object {
        text.push_str(&explain_object(spec, &loaded, &inputs, &output)?);
    } else if let Some(spec) = &args.as_subject {
        text.push_str(&explain_subject(spec, &inputs, &output)?);
    }
    Ok(text)
}

fn explain_object(
    spec: &str,
    loaded: &[(String, crate::engine::RuleSource)],
    inputs: &[Value],
    output: &[Value],
) -> Result<String, String> {
    let parts: Vec<&str> = spec.split('/').collect();
    let (kind, ns, name) = match parts.as_slice() {
        [k, n] => (*k, "", *n),
        [k, ns, n] => (*k, *ns, *n),
        _ => {
            return Err(format!(
                "error: --object {spec:?}: expected Kind/name or Kind/namespace/name"
            ));
        }
    };
    let found = output.iter().find(|o| {
        o["kind"] == kind
            && o["metadata"]["name"] == name
            && o["metadata"]["namespace"].as_str().unwrap_or_default() == ns
    });
    let Some(o) = found else {
        return Err(format!("error: no rule renders {spec} from these objects"));
    };
    let ann = &o["metadata"]["annotations"];
    let rule = ann["rbacrules.io/rule"].as_str().unwrap_or_default();
    let trigger = ann["rbacrules.io/trigger"].as_str();
    let mut t = format!("{spec}\n  rule:     {rule}");
    let origin = loaded.iter().find(|(_, r)| r.name == rule);
    if let Some((origin, _)) = origin {
        t.push_str(&format!(" ({origin})"));
    }
    t.push('\n');
    t.push_str(&format!(
        "  trigger:  {}\n",
        trigger.unwrap_or("none (a static rule)")
    ));
    if let Some((origin, source)) = origin {
        for (i, out) in source.spec.outputs.iter().enumerate() {
            let v = serde_json::to_value(out).unwrap_or(Value::Null);
            if v["kind"] != kind {
                continue;
            }
            let tmpl = v["name"].as_str().unwrap_or_default();
            if !could_render(tmpl, name) {
                continue;
            }
            let line = template_line(origin, rule, tmpl)
                .map(|l| format!(", line {l}"))
                .unwrap_or_default();
            t.push_str(&format!(
                "  template: spec.outputs[{i}] name {tmpl:?}{line}\n"
            ));
        }
    }
    if kind == "ClusterRole" {
        let labels = o["metadata"]["labels"].as_object();
        let mut by: Vec<String> = Vec::new();
        for agg in inputs.iter().chain(output) {
            if agg["kind"] != "ClusterRole" {
                continue;
            }
            let selectors = agg["aggregationRule"]["clusterRoleSelectors"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let selected = selectors.iter().any(|s| {
                serde_json::from_value(s.clone())
                    .map(|sel| crate::selector::matches_json(&sel, labels))
                    .unwrap_or(false)
            });
            if selected {
                by.push(
                    agg["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                );
            }
        }
        by.sort();
        by.dedup();
        if !by.is_empty() {
            t.push_str(&format!("  aggregated into: {}\n", by.join(", ")));
        }
    }
    Ok(t)
}

/// Whether a name template can render `name`: its literal parts, in order,
/// with anything where a `{{…}}` stands.
fn could_render(template: &str, name: &str) -> bool {
    let mut pattern = String::from("^");
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        pattern.push_str(&regex::escape(&rest[..start]));
        pattern.push_str(".*");
        rest = rest[start..]
            .find("}}")
            .map_or("", |end| &rest[start + end + 2..]);
    }
    pattern.push_str(&regex::escape(rest));
    pattern.push('$');
    regex::Regex::new(&pattern).is_ok_and(|re| re.is_match(name))
}

/// The line of a rule file where an output's name template is written.
fn template_line(origin: &str, rule: &str, template: &str) -> Option<usize> {
    let file = origin.rsplit_once('#').map(|(f, _)| f).unwrap_or(origin);
    let text = std::fs::read_to_string(file).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_start().starts_with("name:") && l.contains(rule))?;
    lines[start + 1..]
        .iter()
        .position(|l| l.trim_start().starts_with("name:") && l.contains(template))
        .map(|i| start + i + 2)
}

fn explain_subject(spec: &str, inputs: &[Value], output: &[Value]) -> Result<String, String> {
    let mut a = Access::default();
    match spec.split_once(':') {
        Some(("user", n)) => a.user = Some(n.to_string()),
        Some(("group", n)) => a.group = Some(n.to_string()),
        Some(("serviceaccount", n)) => a.service_account = Some(n.to_string()),
        _ => {
            return Err(format!(
                "error: --as {spec:?}: expected user:NAME, group:NAME or serviceaccount:NS:NAME"
            ));
        }
    }
    let subject = Subject::of(&a).map_err(|e| format!("error: --as {spec:?}: {e}"))?;
    let world = World::new(inputs, output);
    let mut t = format!("{}\n", subject.show);
    let mut any = false;
    for b in &world.bindings {
        let kind = b["kind"].as_str().unwrap_or_default();
        let bns = b["metadata"]["namespace"].as_str().unwrap_or_default();
        let subjects = b["subjects"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if !subjects.iter().any(|x| subject.matches(x, bns)) {
            continue;
        }
        any = true;
        let role_kind = b["roleRef"]["kind"].as_str().unwrap_or("ClusterRole");
        let role = b["roleRef"]["name"].as_str().unwrap_or_default();
        let scope = if kind == "RoleBinding" {
            format!("in namespace {bns}")
        } else {
            "cluster-wide".to_string()
        };
        let bname = b["metadata"]["name"].as_str().unwrap_or_default();
        t.push_str(&format!("  {scope}: {kind} {bname} → {role_kind} {role}\n"));
        if role_kind == "ClusterRole" {
            let sources = aggregated_from(role, inputs, output);
            if !sources.is_empty() {
                t.push_str(&format!("    aggregates: {}\n", sources.join(", ")));
            }
        }
        let rules = if role_kind == "Role" {
            world.roles.get(&(bns.to_string(), role.to_string()))
        } else {
            world.cluster_roles.get(role)
        };
        match rules {
            None => t.push_str("    (role not found: grants nothing)\n"),
            Some(rs) => {
                for r in rs {
                    let list = |v: &Option<Vec<String>>| v.clone().unwrap_or_default().join(",");
                    if let Some(urls) = &r.non_resource_urls {
                        t.push_str(&format!(
                            "    {} nonResourceURLs {}\n",
                            r.verbs.join(","),
                            urls.join(",")
                        ));
                    } else {
                        let names = r
                            .resource_names
                            .as_ref()
                            .map(|n| format!(" names {}", n.join(",")))
                            .unwrap_or_default();
                        t.push_str(&format!(
                            "    {} {} (group {:?}){names}\n",
                            r.verbs.join(","),
                            list(&r.resources),
                            list(&r.api_groups)
                        ));
                    }
                }
            }
        }
    }
    if !any {
        t.push_str("  no binding names this subject: it can do nothing\n");
    }
    Ok(t)
}

/// The ClusterRoles an aggregated ClusterRole gathers, by its selectors.
fn aggregated_from(role: &str, inputs: &[Value], output: &[Value]) -> Vec<String> {
    let all: Vec<&Value> = inputs
        .iter()
        .chain(output)
        .filter(|o| o["kind"] == "ClusterRole")
        .collect();
    let Some(agg) = all.iter().rev().find(|o| o["metadata"]["name"] == role) else {
        return Vec::new();
    };
    let selectors: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector> =
        agg["aggregationRule"]["clusterRoleSelectors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| serde_json::from_value(s.clone()).ok())
            .collect();
    let mut names: Vec<String> = all
        .iter()
        .filter(|o| {
            let labels = o["metadata"]["labels"].as_object();
            selectors
                .iter()
                .any(|s| crate::selector::matches_json(s, labels))
        })
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
        .filter(|n| n != role)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The `explain` command.
pub fn main(args: &ExplainArgs) -> ExitCode {
    match explain(args) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
