//! `rbac-rules explain`: why an object is rendered, and what a subject may
//! do and through which bindings and aggregations, offline on `render`'s
//! inputs.

use std::path::PathBuf;
use std::process::ExitCode;

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{Value, json};

use crate::api::ManageLevel;
use crate::engine::output::selectors_of;
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
        .map(|d| {
            // Someone else's object labelled ours is read as anyone's.
            let mut v = d.value;
            crate::engine::output::vet_claim(&mut v);
            v
        })
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

/// The name of an object (empty when it has none).
fn name_of(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

/// The namespace of an object (empty for a cluster-wide one).
fn namespace_of(o: &Value) -> &str {
    o["metadata"]["namespace"].as_str().unwrap_or_default()
}

/// What is missing when no rendered object matches: the same name in
/// other namespaces, or the names rendered of that kind there.
fn not_rendered(t: &Target, output: &[Value], inputs: &[Value]) -> String {
    let of_kind: Vec<&Value> = output.iter().filter(|o| o["kind"] == t.kind).collect();
    let mut text = format!("error: no rule renders {} from these objects", t.show());
    let elsewhere: Vec<String> = of_kind
        .iter()
        .filter(|o| name_of(o) == t.name)
        .map(|o| namespace_of(o).to_string())
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
        .any(|o| o["kind"] == t.kind && name_of(o) == t.name && namespace_of(o) == t.namespace);
    if live {
        text.push_str("; it is in the input objects, but no rule renders it (not managed)");
    }
    let mut near: Vec<String> = of_kind
        .iter()
        .filter(|o| namespace_of(o) == t.namespace)
        .map(|o| name_of(o).to_string())
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

/// Why an object is rendered: the rule and trigger that made it, the
/// rule's outputs whose name template could have named it, and, for a
/// ClusterRole, the aggregated ClusterRoles that gather it.
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
        return Err(namespace_missing(kind, name, output));
    }
    let found = output
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name && namespace_of(o) == ns);
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
    // A NamespacedRbacRule's: which namespace's admins wrote it.
    if let Some((rule_ns, local)) = rule.split_once('/') {
        t.push_str(&format!(
            "\n  from:     NamespacedRbacRule {local} in namespace {rule_ns}"
        ));
        data["ruleNamespace"] = json!(rule_ns);
    }
    t.push('\n');
    t.push_str(&format!(
        "  trigger:  {}\n",
        trigger.unwrap_or("none (a static rule)")
    ));
    let templates = origin
        .map(|(origin, source)| {
            // A tenant rule's template renders the name without its prefix.
            let rendered = match rule.split_once('/') {
                Some((_, local)) => name
                    .strip_prefix(&crate::engine::tenant::output_prefix(local))
                    .unwrap_or(name),
                None => name,
            };
            templates_naming(origin, source, kind, rendered)
        })
        .unwrap_or_default();
    for m in &templates {
        let line = m.line.map(|l| format!(", line {l}")).unwrap_or_default();
        t.push_str(&format!(
            "  template: spec.outputs[{}] name {:?}{line}\n",
            m.index, m.name
        ));
    }
    data["templates"] = json!(
        templates
            .iter()
            .map(TemplateMatch::data)
            .collect::<Vec<_>>()
    );
    if kind == "ClusterRole" {
        let by = aggregated_into(o, inputs, output);
        if !by.is_empty() {
            t.push_str(&format!("  aggregated into: {}\n", by.join(", ")));
        }
        data["aggregatedInto"] = json!(by);
    }
    Ok((t, data))
}

/// The error for a Role or RoleBinding named without a namespace, with the
/// namespaces where one of that name is rendered.
fn namespace_missing(kind: &str, name: &str, output: &[Value]) -> String {
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
    format!("error: {kind}/{name}: a {kind} lives in a namespace: add -n NAMESPACE{hint}")
}

/// An output of a rule whose name template could have rendered the object.
struct TemplateMatch {
    /// Its index in `spec.outputs`.
    index: usize,
    /// Its name template.
    name: String,
    /// The line of the rule file where the template is written.
    line: Option<usize>,
}

impl TemplateMatch {
    fn data(&self) -> Value {
        json!({
            "field": format!("spec.outputs[{}]", self.index),
            "name": self.name,
            "line": self.line,
        })
    }
}

/// The outputs of the rule `source` (read from `origin`) of this kind whose
/// name template could render `name`.
fn templates_naming(
    origin: &str,
    source: &crate::engine::RuleSource,
    kind: &str,
    name: &str,
) -> Vec<TemplateMatch> {
    let mut found = Vec::new();
    for (index, out) in source.spec.outputs.iter().enumerate() {
        let v = serde_json::to_value(out).unwrap_or(Value::Null);
        if v["kind"] != kind {
            continue;
        }
        let tmpl = v["name"].as_str().unwrap_or_default();
        if !could_render(tmpl, name) {
            continue;
        }
        found.push(TemplateMatch {
            index,
            name: tmpl.to_string(),
            line: template_line(origin, &source.name, tmpl),
        });
    }
    found
}

/// The aggregated ClusterRoles, in the input or the output, whose selectors
/// pick the ClusterRole `role`: sorted, each once.
fn aggregated_into(role: &Value, inputs: &[Value], output: &[Value]) -> Vec<String> {
    let mut by: Vec<String> = inputs
        .iter()
        .chain(output)
        .filter(|agg| agg["kind"] == "ClusterRole" && picks(&selectors_of(agg), role))
        .map(|agg| name_of(agg).to_string())
        .collect();
    by.sort();
    by.dedup();
    by
}

/// Whether any of an aggregated ClusterRole's selectors picks `role` by its
/// labels.
fn picks(selectors: &[LabelSelector], role: &Value) -> bool {
    let labels = role["metadata"]["labels"].as_object();
    selectors
        .iter()
        .any(|s| crate::selector::matches_json(s, labels))
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

/// What a subject may do: each binding that names it, the role it grants
/// and that role's rules; when none names it, the subjects of its kind the
/// bindings do name, nearest first.
fn explain_subject(
    spec: &str,
    inputs: &[Value],
    output: &[Value],
) -> Result<(String, Value), String> {
    let a = parse_subject(spec)?;
    let subject = Subject::of(&a).map_err(|e| format!("error: --as {spec:?}: {e}"))?;
    let world = World::new(inputs, output);
    let mut t = format!("{}\n", subject.show);
    let mut bindings_data: Vec<Value> = Vec::new();
    for b in &world.bindings {
        let subjects = b["subjects"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if !subjects.iter().any(|x| subject.matches(x, namespace_of(b))) {
            continue;
        }
        let (text, data) = explain_binding(b, &world, inputs, output);
        t.push_str(&text);
        bindings_data.push(data);
    }
    if bindings_data.is_empty() {
        t.push_str("  no binding names this subject: it can do nothing\n");
        t.push_str(&nearest_named(&a, &subject, &world));
    }
    let (kind, name) = subject.show.split_once(' ').unwrap_or(("", &subject.show));
    let data = json!({
        "subject": {"kind": kind, "name": name},
        "bindings": bindings_data,
    });
    Ok((t, data))
}

/// One binding that names the subject: where it applies, the role it
/// refers to (with what that role aggregates) and the role's rules.
fn explain_binding(
    b: &Value,
    world: &World,
    inputs: &[Value],
    output: &[Value],
) -> (String, Value) {
    let kind = b["kind"].as_str().unwrap_or_default();
    let bns = namespace_of(b);
    let bname = name_of(b);
    let role_kind = b["roleRef"]["kind"].as_str().unwrap_or("ClusterRole");
    let role = b["roleRef"]["name"].as_str().unwrap_or_default();
    let scope = if kind == "RoleBinding" {
        format!("in namespace {bns}")
    } else {
        "cluster-wide".to_string()
    };
    let mut t = format!("  {scope}: {kind} {bname} → {role_kind} {role}\n");
    // Which rule made the binding, and for a NamespacedRbacRule, where.
    let made_by = b["metadata"]["annotations"]["rbacrules.io/rule"].as_str();
    match made_by.map(|r| (r, r.split_once('/'))) {
        Some((_, Some((rule_ns, local)))) => t.push_str(&format!(
            "    made by NamespacedRbacRule {local} in namespace {rule_ns}\n"
        )),
        Some((r, None)) => t.push_str(&format!("    made by RbacRule {r}\n")),
        None => {}
    }
    let aggregates = if role_kind == "ClusterRole" {
        aggregated_from(role, inputs, output)
    } else {
        Vec::new()
    };
    if !aggregates.is_empty() {
        t.push_str(&format!("    aggregates: {}\n", aggregates.join(", ")));
    }
    let rules = if role_kind == "Role" {
        world.roles.get(&(bns.to_string(), role.to_string()))
    } else {
        world.cluster_roles.get(role)
    };
    match rules {
        None => t.push_str("    (role not found: grants nothing)\n"),
        Some(rs) => rs.iter().for_each(|r| t.push_str(&rule_line(r))),
    }
    let data = json!({
        "binding": {"kind": kind, "namespace": bns, "name": bname},
        "namespace": if kind == "RoleBinding" { Some(bns) } else { None },
        "roleRef": {"kind": role_kind, "name": role},
        "aggregates": aggregates,
        "rules": rules,
        "roleFound": rules.is_some(),
        "rule": made_by,
    });
    (t, data)
}

/// A role's rule as one indented line: verbs, then the URLs or the
/// resources (with group and names) it grants them on.
fn rule_line(r: &PolicyRule) -> String {
    let list = |v: &Option<Vec<String>>| v.clone().unwrap_or_default().join(",");
    if let Some(urls) = &r.non_resource_urls {
        format!(
            "    {} nonResourceURLs {}\n",
            r.verbs.join(","),
            urls.join(",")
        )
    } else {
        let names = r
            .resource_names
            .as_ref()
            .map(|n| format!(" names {}", n.join(",")))
            .unwrap_or_default();
        format!(
            "    {} {} (group {:?}){names}\n",
            r.verbs.join(","),
            list(&r.resources),
            list(&r.api_groups)
        )
    }
}

/// For a subject no binding names: the subjects of its kind that bindings
/// do name, nearest first, so that a typo shows (empty when there are none).
fn nearest_named(a: &Access, subject: &Subject, world: &World) -> String {
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
            let bns = namespace_of(b);
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
    if named.is_empty() {
        return String::new();
    }
    let me = subject
        .show
        .split_once(' ')
        .map(|(_, n)| n)
        .unwrap_or_default();
    named.sort_by_key(|n| strsim::levenshtein(n, me));
    let shown: Vec<&str> = named.iter().take(5).map(String::as_str).collect();
    format!(
        "  {kind}s the bindings name, nearest first: {}\n",
        shown.join(", ")
    )
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
    let selectors = selectors_of(agg);
    let mut names: Vec<String> = all
        .iter()
        .filter(|o| picks(&selectors, o))
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
