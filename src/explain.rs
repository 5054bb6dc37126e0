//! `rbac-rules explain`: why an object is rendered, and what a subject may
//! do and through which bindings and aggregations, offline on `render`'s
//! inputs.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{Value, json};

use crate::api::ManageLevel;
use crate::engine::{Engine, ObjectStore, Options};
use crate::ruletest::{Access, Subject, World};
use crate::{rules, yaml};

/// Arguments of `explain`.
#[derive(clap::Args, Clone, Debug)]
#[command(after_help = "Examples:
  rbac-rules explain --objects cluster.yaml --rules my-rules/ rolebinding/db-owners -n team-a
  rbac-rules explain --objects cluster.yaml --rules my-rules/ ClusterRole/databases.data.acme.io-edit
  rbac-rules explain --objects cluster.yaml --rules my-rules/ --as serviceaccount:acme-system:db-operator
  rbac-rules explain --objects cluster.yaml --rules my-rules/ --as system:serviceaccount:acme-system:db-operator
  rbac-rules explain --objects cluster.yaml --rules my-rules/ --as group:team-a -o json

Exit status: 0 explained, 1 nothing matches or an input is invalid.")]
pub struct ExplainArgs {
    /// YAML files or directories with the cluster's objects (`-`: stdin).
    #[arg(long, required = true, num_args = 1..)]
    pub objects: Vec<PathBuf>,
    /// Rule files or directories. Default: the built-in rules, with a note
    /// on stderr.
    #[arg(long, num_args = 1..)]
    pub rules: Vec<PathBuf>,
    /// Read directories recursively (like kubectl's -R).
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// Highest manage level of rules to run: serviceaccounts, basic or all.
    #[arg(long, default_value = "all", value_parser = crate::parse_manage)]
    pub manage: ManageLevel,
    /// A rendered object, as kubectl names it: `kind/name` (any case, plural
    /// or `kind.group`), with `-n` for a namespaced one; or
    /// `Kind/namespace/name`.
    #[arg(value_name = "KIND/NAME", conflicts_with = "as_subject")]
    pub target: Option<String>,
    /// The same as the positional KIND/NAME.
    #[arg(long, conflicts_with_all = ["as_subject", "target"])]
    pub object: Option<String>,
    /// The namespace of a namespaced object (Role, RoleBinding).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// A subject: `user:NAME`, `group:NAME`, `serviceaccount:NS:NAME`, or a
    /// user name as kubectl's --as takes it (`system:serviceaccount:NS:NAME`
    /// is that ServiceAccount, as Kubernetes authenticates it).
    #[arg(long = "as", id = "as_subject")]
    pub as_subject: Option<String>,
    /// Output format: the explanation as text, or as json or yaml data.
    #[arg(short = 'o', long, value_enum, default_value_t = crate::validate::Format::Human)]
    pub output: crate::validate::Format,
}

/// Explains, returning the text to print or an error message.
pub fn explain(args: &ExplainArgs) -> Result<String, String> {
    explain_data(args).map(|(text, _)| text)
}

/// Explains: the text to print, and the same as data (`-o json|yaml`).
pub fn explain_data(args: &ExplainArgs) -> Result<(String, Value), String> {
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
    let render_errors: Vec<String> = eval.errors().map(|e| e.to_string()).collect();
    for e in &render_errors {
        text.push_str(&format!("note: render error: {e}\n"));
    }
    let output: Vec<Value> = eval.desired.iter().map(|d| d.object.to_value()).collect();
    let mut data = if let Some(spec) = args.target.as_ref().or(args.object.as_ref()) {
        let target = parse_target(spec, args.namespace.as_deref())?;
        let (t, d) = explain_object(&target, &loaded, &inputs, &output)?;
        text.push_str(&t);
        d
    } else if let Some(spec) = &args.as_subject {
        let (t, d) = explain_subject(spec, &inputs, &output)?;
        text.push_str(&t);
        d
    } else {
        return Err(
            "error: name an object (KIND/NAME, with -n for a namespaced one) or a subject \
             (--as)"
                .to_string(),
        );
    };
    if !render_errors.is_empty()
        && let Some(m) = data.as_object_mut()
    {
        m.insert("renderErrors".to_string(), json!(render_errors));
    }
    Ok((text, data))
}

/// An object to explain: kind as Kubernetes spells it, namespace, name.
struct Target {
    kind: &'static str,
    namespace: String,
    name: String,
}

impl Target {
    fn show(&self) -> String {
        if self.namespace.is_empty() {
            format!("{}/{}", self.kind, self.name)
        } else {
            format!("{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// The kind a user wrote, as kubectl accepts it: any case, singular or
/// plural, with or without `.rbac.authorization.k8s.io`, or a short name.
fn parse_kind(text: &str) -> Option<&'static str> {
    let lower = text.to_lowercase();
    let bare = lower
        .strip_suffix(".rbac.authorization.k8s.io")
        .unwrap_or(&lower);
    crate::api::OutputKind::ALL
        .iter()
        .map(|k| k.as_str())
        .find(|k| {
            let k_lower = k.to_lowercase();
            bare == k_lower || bare == format!("{k_lower}s")
        })
}

fn parse_target(spec: &str, namespace: Option<&str>) -> Result<Target, String> {
    let parts: Vec<&str> = spec.split('/').collect();
    let (kind, ns, name) = match parts.as_slice() {
        [k, n] => (*k, namespace.unwrap_or_default(), *n),
        [k, ns, n] => {
            if let Some(flag) = namespace.filter(|f| f != ns) {
                return Err(format!(
                    "error: {spec:?} names namespace {ns:?} but -n says {flag:?}"
                ));
            }
            (*k, *ns, *n)
        }
        _ => {
            return Err(format!(
                "error: {spec:?}: expected KIND/NAME (with -n NAMESPACE for a Role or \
                 RoleBinding), e.g. rolebinding/viewer -n team-a"
            ));
        }
    };
    let Some(kind) = parse_kind(kind) else {
        return Err(format!(
            "error: {spec:?}: unknown kind {kind:?}: rules render ClusterRole, Role, \
             ClusterRoleBinding and RoleBinding (any case, singular or plural)"
        ));
    };
    let namespaced = matches!(kind, "Role" | "RoleBinding");
    if !namespaced && !ns.is_empty() {
        return Err(format!(
            "error: {spec:?}: a {kind} is cluster-wide: it has no namespace (drop -n)"
        ));
    }
    Ok(Target {
        kind,
        namespace: ns.to_string(),
        name: name.to_string(),
    })
}

/// What is missing when no rendered object matches: the same name in
/// other namespaces, or the names rendered of that kind there.
fn not_rendered(t: &Target, output: &[Value], inputs: &[Value]) -> String {
    let of_kind: Vec<&Value> = output.iter().filter(|o| o["kind"] == t.kind).collect();
    let ns_of = |o: &Value| {
        o["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let name_of = |o: &Value| {
        o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let mut text = format!("error: no rule renders {} from these objects", t.show());
    let elsewhere: Vec<String> = of_kind
        .iter()
        .filter(|o| name_of(o) == t.name)
        .map(|o| ns_of(o))
        .collect();
    if !elsewhere.is_empty() {
        text.push_str(&format!(
            "; a {} {:?} is rendered in namespace(s) {}: give -n",
            t.kind,
            t.name,
            elsewhere.join(", ")
        ));
        return text;
    }
    let live = inputs
        .iter()
        .any(|o| o["kind"] == t.kind && name_of(o) == t.name && ns_of(o) == t.namespace);
    if live {
        text.push_str("; it is in the input objects, but no rule renders it (not managed)");
    }
    let mut near: Vec<String> = of_kind
        .iter()
        .filter(|o| ns_of(o) == t.namespace)
        .map(|o| name_of(o))
        .collect();
    near.sort();
    if near.is_empty() {
        let scope = if t.namespace.is_empty() {
            String::new()
        } else {
            format!(" in namespace {}", t.namespace)
        };
        text.push_str(&format!("; the rules render no {}{scope}", t.kind));
    } else {
        let closest = near
            .iter()
            .min_by_key(|n| strsim::levenshtein(n, &t.name))
            .cloned()
            .unwrap_or_default();
        let shown: Vec<&str> = near.iter().take(10).map(String::as_str).collect();
        let more = if near.len() > 10 {
            format!(" and {} more", near.len() - 10)
        } else {
            String::new()
        };
        text.push_str(&format!(
            "; closest: {closest:?}; rendered there: {}{more}",
            shown.join(", ")
        ));
    }
    text
}

fn explain_object(
    target: &Target,
    loaded: &[(String, crate::engine::RuleSource)],
    inputs: &[Value],
    output: &[Value],
) -> Result<(String, Value), String> {
    let (kind, ns, name) = (target.kind, target.namespace.as_str(), target.name.as_str());
    let spec = if ns.is_empty() {
        format!("{kind}/{name}")
    } else {
        format!("{kind}/{ns}/{name}")
    };
    if ns.is_empty() && matches!(kind, "Role" | "RoleBinding") {
        let mut at: Vec<&str> = output
            .iter()
            .filter(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .filter_map(|o| o["metadata"]["namespace"].as_str())
            .collect();
        at.sort();
        let hint = if at.is_empty() {
            String::new()
        } else {
            format!(" ({kind} {name:?} is rendered in {})", at.join(", "))
        };
        return Err(format!(
            "error: {kind}/{name}: a {kind} lives in a namespace: add -n NAMESPACE{hint}"
        ));
    }
    let found = output.iter().find(|o| {
        o["kind"] == kind
            && o["metadata"]["name"] == name
            && o["metadata"]["namespace"].as_str().unwrap_or_default() == ns
    });
    let Some(o) = found else {
        return Err(not_rendered(target, output, inputs));
    };
    let ann = &o["metadata"]["annotations"];
    let rule = ann["rbacrules.io/rule"].as_str().unwrap_or_default();
    let trigger = ann["rbacrules.io/trigger"].as_str();
    let mut t = format!("{spec}\n  rule:     {rule}");
    let origin = loaded.iter().find(|(_, r)| r.name == rule);
    let mut data = json!({
        "object": {"kind": kind, "namespace": ns, "name": name},
        "rule": rule,
        "origin": origin.map(|(o, _)| o.as_str()),
        "trigger": trigger,
        "templates": [],
        "aggregatedInto": [],
    });
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
            if let Some(list) = data["templates"].as_array_mut() {
                list.push(json!({
                    "field": format!("spec.outputs[{i}]"),
                    "name": tmpl,
                    "line": template_line(origin, rule, tmpl),
                }));
            }
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
        data["aggregatedInto"] = json!(by);
    }
    Ok((t, data))
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

fn explain_subject(
    spec: &str,
    inputs: &[Value],
    output: &[Value],
) -> Result<(String, Value), String> {
    let a = parse_subject(spec)?;
    let subject = Subject::of(&a).map_err(|e| format!("error: --as {spec:?}: {e}"))?;
    let world = World::new(inputs, output);
    let mut t = format!("{}\n", subject.show);
    let mut any = false;
    let mut bindings_data: Vec<Value> = Vec::new();
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
        bindings_data.push(json!({
            "binding": {"kind": kind, "namespace": bns, "name": bname},
            "namespace": if kind == "RoleBinding" { Some(bns) } else { None },
            "roleRef": {"kind": role_kind, "name": role},
            "aggregates": if role_kind == "ClusterRole" {
                aggregated_from(role, inputs, output)
            } else {
                Vec::new()
            },
            "rules": rules,
            "roleFound": rules.is_some(),
        }));
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
        // What the bindings do name, nearest first: a typo shows.
        let kind = if a.service_account.is_some() {
            "ServiceAccount"
        } else if a.group.is_some() {
            "Group"
        } else {
            "User"
        };
        let mut named: Vec<String> = world
            .bindings
            .iter()
            .flat_map(|b| {
                let bns = b["metadata"]["namespace"].as_str().unwrap_or_default();
                b["subjects"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|x| x["kind"] == kind)
                    .map(move |x| {
                        let name = x["name"].as_str().unwrap_or_default();
                        match x["namespace"]
                            .as_str()
                            .or(Some(bns).filter(|n| !n.is_empty()))
                        {
                            Some(ns) if kind == "ServiceAccount" => format!("{ns}/{name}"),
                            _ => name.to_string(),
                        }
                    })
            })
            .collect();
        named.sort();
        named.dedup();
        if !named.is_empty() {
            let me = subject
                .show
                .split_once(' ')
                .map(|(_, n)| n)
                .unwrap_or_default();
            named.sort_by_key(|n| strsim::levenshtein(n, me));
            let shown: Vec<&str> = named.iter().take(5).map(String::as_str).collect();
            t.push_str(&format!(
                "  {kind}s the bindings name, nearest first: {}\n",
                shown.join(", ")
            ));
        }
    }
    let (kind, name) = subject.show.split_once(' ').unwrap_or(("", &subject.show));
    let data = json!({
        "subject": {"kind": kind, "name": name},
        "bindings": bindings_data,
    });
    Ok((t, data))
}

/// A subject as `--as` takes it. A user name `system:serviceaccount:NS:NAME`
/// is the ServiceAccount Kubernetes authenticates under it (with its
/// groups), whether written bare or after `user:`.
fn parse_subject(spec: &str) -> Result<Access, String> {
    let mut a = Access::default();
    let (prefix, rest) = spec.split_once(':').unwrap_or(("", spec));
    let user = match prefix.to_lowercase().as_str() {
        "user" => rest,
        "group" => {
            a.group = Some(rest.to_string());
            return Ok(a);
        }
        "serviceaccount" | "sa" => {
            let sa = rest.replacen('/', ":", 1);
            if !sa.contains(':') {
                return Err(format!(
                    "error: --as {spec:?}: expected serviceaccount:NAMESPACE:NAME"
                ));
            }
            a.service_account = Some(sa);
            return Ok(a);
        }
        // kubectl's --as: a user name.
        _ => spec,
    };
    if let Some(sa) = user.strip_prefix("system:serviceaccount:") {
        if sa.split(':').count() != 2 || sa.split(':').any(str::is_empty) {
            return Err(format!(
                "error: --as {spec:?}: a ServiceAccount user name is \
                 system:serviceaccount:NAMESPACE:NAME"
            ));
        }
        a.service_account = Some(sa.to_string());
    } else if user.is_empty() {
        return Err(format!(
            "error: --as {spec:?}: expected user:NAME, group:NAME or serviceaccount:NS:NAME"
        ));
    } else {
        a.user = Some(user.to_string());
    }
    Ok(a)
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
    match explain_data(args) {
        Ok((text, data)) => {
            let out = match args.output {
                crate::validate::Format::Human => Ok(text),
                crate::validate::Format::Json => serde_json::to_string_pretty(&data)
                    .map(|t| t + "\n")
                    .map_err(|e| e.to_string()),
                crate::validate::Format::Yaml => yaml::to_yaml(&data).map_err(|e| e.to_string()),
            };
            match out {
                Ok(t) => print!("{t}"),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
