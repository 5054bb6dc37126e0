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
    /// When they hold the controller's Deployment, its params and
    /// allow-list (the ClusterRole it names, from the same objects) are
    /// used (see --installed-settings).
    #[arg(long, required_unless_present = "live", num_args = 1..)]
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
    /// A group the --as subject is also in, as kubectl's --as-group
    /// (repeat for more). A ServiceAccount is in system:serviceaccounts
    /// and system:serviceaccounts:NS without it; every authenticated
    /// subject in system:authenticated.
    #[arg(long = "as-group", value_name = "GROUP")]
    pub as_group: Vec<String>,
    /// Ask the cluster of the current kubeconfig (or --kubeconfig,
    /// --context): whether the --as subject can do --verb on --resource
    /// (with -n for a namespaced request), as `kubectl auth can-i` does
    /// (a SubjectAccessReview), and which objects of rbac-rules grant it
    /// (rule and trigger), or would grant it once the rules' outputs are
    /// applied.
    #[arg(long, requires_all = ["as_subject", "verb", "resource"], conflicts_with_all = ["target", "object"])]
    pub live: bool,
    /// With --live: the verb asked (get, list, create, ...).
    #[arg(long, requires = "live")]
    pub verb: Option<String>,
    /// With --live: the resource asked, `plural[.group][/subresource]`,
    /// e.g. `secrets`, `deployments.apps`, `pods/log`.
    #[arg(long, requires = "live")]
    pub resource: Option<String>,
    /// With --live: the resource's name, when the request names one.
    #[arg(long, requires = "live")]
    pub resource_name: Option<String>,
    /// Settings rules read as `params.<name>`, as for `render`. Default:
    /// the installed controller's (see --installed-settings).
    #[command(flatten)]
    pub params: crate::params::ParamArgs,
    /// Read the installed controller's settings (params, allow-list) from
    /// its Deployment (in --objects; with --live, in the cluster) and use
    /// them where the command line gives none; a setting given that
    /// differs is used, with a warning naming both values. `false`: the
    /// command line's only.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub installed_settings: bool,
    /// The cluster of --live.
    #[command(flatten)]
    pub cluster: crate::diff::ClusterArgs,
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
    let settings = offline_settings(args, &inputs);
    for w in &settings.warnings {
        eprintln!("{w}");
    }
    let engine = Engine::new(
        &sources,
        Options {
            manage: args.manage,
            params: settings.params,
            allow: settings.allow,
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
        let (t, d) = explain_subject(spec, &args.as_group, &inputs, &output)?;
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

/// What an offline explanation evaluates with: params and allow-list,
/// and the warnings and notes to print (stderr) about where they came from.
struct Settings {
    params: std::collections::BTreeMap<String, String>,
    allow: Option<crate::policy::AllowList>,
    warnings: Vec<String>,
}

/// The params and allow-list of an offline explanation: the command
/// line's, completed by the installed controller's when its Deployment is
/// among the objects (its allow-list ClusterRole read from them too).
fn offline_settings(args: &ExplainArgs, inputs: &[Value]) -> Settings {
    let given = args.params.map();
    let mut out = Settings {
        params: given.clone(),
        allow: None,
        warnings: Vec::new(),
    };
    if !args.installed_settings {
        return out;
    }
    let installed = match crate::installed::from_objects(inputs) {
        Ok(i) => i,
        Err(why) => {
            out.warnings.push(format!(
                "note: the installed controller's settings could not be found in the objects ({why}): \
                 evaluating with the command line's params only and no allow-list"
            ));
            return out;
        }
    };
    let (params, warnings) = crate::installed::merge_params(&given, &installed);
    out.params = params;
    out.warnings
        .extend(warnings.into_iter().map(|w| format!("warning: {w}")));
    out.warnings.extend(
        crate::installed::unknown_notes(&installed)
            .into_iter()
            .map(|n| format!("note: {n}")),
    );
    if let Some(name) = &installed.allow_clusterrole {
        let role = inputs
            .iter()
            .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == name.as_str())
            .and_then(|o| {
                serde_json::from_value::<k8s_openapi::api::rbac::v1::ClusterRole>(o.clone()).ok()
            });
        match role {
            Some(r) => out.allow = Some(crate::policy::AllowList::from_cluster_role(&r)),
            None => out.warnings.push(format!(
                "note: the installed controller's allow-list ClusterRole {name:?} (Deployment {}) \
                 is not in the objects: evaluating without an allow-list",
                installed.deployment
            )),
        }
    }
    out
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
    groups: &[String],
    inputs: &[Value],
    output: &[Value],
) -> Result<(String, Value), String> {
    let mut a = parse_subject(spec)?;
    a.groups.extend(groups.iter().cloned());
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

/// One way a live binding grants a request: the binding, its role, and
/// for an aggregated ClusterRole the members that grant it; each with the
/// rule and trigger of rbac-rules that made it, when it did.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Grant {
    /// `ClusterRoleBinding name` or `RoleBinding ns/name`.
    pub binding: String,
    /// `ClusterRole name` or `Role ns/name`.
    pub role: String,
    /// The binding's origin (rule, trigger), if rbac-rules made it.
    pub binding_origin: Option<Origin>,
    /// The role's origin, if rbac-rules made it.
    pub role_origin: Option<Origin>,
    /// The ClusterRoles aggregated into the role that grant the request.
    pub members: Vec<(String, Option<Origin>)>,
}

impl Grant {
    /// Whether an object of rbac-rules is on the way.
    pub fn managed(&self) -> bool {
        self.binding_origin.is_some()
            || self.role_origin.is_some()
            || self.members.iter().any(|(_, o)| o.is_some())
    }

    fn text(&self) -> String {
        let origin = |o: &Option<Origin>| {
            o.as_ref()
                .map(|o| format!(" [{}]", o.show()))
                .unwrap_or_default()
        };
        let mut t = format!(
            "{}{} → {}{}\n",
            self.binding,
            origin(&self.binding_origin),
            self.role,
            origin(&self.role_origin)
        );
        for (m, o) in &self.members {
            t.push_str(&format!(
                "      aggregated from ClusterRole {m}{}\n",
                origin(o)
            ));
        }
        t
    }
}

/// The rule and trigger of rbac-rules an object carries.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Origin {
    /// The RbacRule.
    pub rule: String,
    /// The trigger, `Kind.group/[ns/]name` (none: a static output).
    pub trigger: Option<String>,
}

impl Origin {
    /// The rule and trigger an object of rbac-rules names; none for an
    /// object without our label, or labelled by someone else (its
    /// `managedFields` hold no `Apply` entry of ours): a claim anyone can
    /// write is not believed.
    fn of(o: &Value) -> Option<Origin> {
        use crate::engine::output::{Provenance, provenance};
        if matches!(provenance(o), Provenance::Unclaimed | Provenance::Foreign) {
            return None;
        }
        let ann = &o["metadata"]["annotations"];
        let rule = ann["rbacrules.io/rule"].as_str()?;
        Some(Origin {
            rule: rule.to_string(),
            trigger: ann["rbacrules.io/trigger"].as_str().map(str::to_string),
        })
    }

    fn show(&self) -> String {
        match &self.trigger {
            Some(t) => format!("rule {}, trigger {t}", self.rule),
            None => format!("rule {}", self.rule),
        }
    }
}

/// A request as `kubectl auth can-i` puts it.
#[derive(Clone, Debug)]
pub struct Request {
    /// The verb.
    pub verb: String,
    /// The API group (`""`: core).
    pub group: String,
    /// The resource's plural.
    pub resource: String,
    /// The subresource, if any.
    pub subresource: Option<String>,
    /// The resource's name, if any.
    pub name: Option<String>,
    /// The namespace (`None`: cluster-wide).
    pub namespace: Option<String>,
}

impl Request {
    /// `plural[.group][/subresource]` and the rest.
    pub fn parse(
        verb: &str,
        resource: &str,
        name: Option<&str>,
        namespace: Option<&str>,
    ) -> Request {
        let (resource, sub) = match resource.split_once('/') {
            Some((r, s)) => (r, Some(s.to_string())),
            None => (resource, None),
        };
        let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
        Request {
            verb: verb.to_string(),
            group: group.to_string(),
            resource: plural.to_string(),
            subresource: sub,
            name: name.map(str::to_string),
            namespace: namespace.map(str::to_string),
        }
    }

    fn rule(&self) -> PolicyRule {
        PolicyRule {
            api_groups: Some(vec![self.group.clone()]),
            resources: Some(vec![match &self.subresource {
                Some(s) => format!("{}/{s}", self.resource),
                None => self.resource.clone(),
            }]),
            verbs: vec![self.verb.clone()],
            resource_names: self.name.clone().map(|n| vec![n]),
            non_resource_urls: None,
        }
    }

    fn show(&self) -> String {
        let group = if self.group.is_empty() {
            String::new()
        } else {
            format!(".{}", self.group)
        };
        let sub = self
            .subresource
            .as_ref()
            .map(|s| format!("/{s}"))
            .unwrap_or_default();
        let name = self
            .name
            .as_ref()
            .map(|n| format!(" {n}"))
            .unwrap_or_default();
        let scope = match &self.namespace {
            Some(ns) => format!(" in namespace {ns}"),
            None => " cluster-wide".to_string(),
        };
        format!("{} {}{group}{sub}{name}{scope}", self.verb, self.resource)
    }

    /// The SubjectAccessReview asking this for `subject`.
    fn review(&self, subject: &Subject) -> Value {
        let (user, groups) = subject.identity();
        let mut attrs = json!({"verb": self.verb, "group": self.group, "resource": self.resource});
        if let Some(s) = &self.subresource {
            attrs["subresource"] = json!(s);
        }
        if let Some(n) = &self.name {
            attrs["name"] = json!(n);
        }
        if let Some(ns) = &self.namespace {
            attrs["namespace"] = json!(ns);
        }
        let mut spec = json!({"resourceAttributes": attrs, "groups": groups});
        if let Some(u) = user {
            spec["user"] = json!(u);
        }
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
    }
}

/// Every binding among `objects` that names `subject` and whose role
/// grants `req` (aggregated ClusterRoles filled from their members).
pub(crate) fn grants_of(objects: &[Value], subject: &Subject, req: &Request) -> Vec<Grant> {
    let world = World::new(objects, &[]);
    let wanted = req.rule();
    let covers = |rules: Option<&Vec<PolicyRule>>| {
        rules
            .into_iter()
            .flatten()
            .any(|r| crate::policy::rule_covers(r, &wanted))
    };
    let find = |kind: &str, ns: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && namespace_of(o) == ns && o["metadata"]["name"] == name)
    };
    let mut out = Vec::new();
    for b in &world.bindings {
        let kind = b["kind"].as_str().unwrap_or_default();
        let bns = namespace_of(b);
        if kind == "RoleBinding" && Some(bns) != req.namespace.as_deref() {
            continue;
        }
        let subjects = b["subjects"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if !subjects.iter().any(|x| subject.matches(x, bns)) {
            continue;
        }
        let role_kind = b["roleRef"]["kind"].as_str().unwrap_or("ClusterRole");
        let role_name = b["roleRef"]["name"].as_str().unwrap_or_default();
        let (rules, role_obj, role) = if role_kind == "Role" {
            (
                world.roles.get(&(bns.to_string(), role_name.to_string())),
                find("Role", bns, role_name),
                format!("Role {bns}/{role_name}"),
            )
        } else {
            (
                world.cluster_roles.get(role_name),
                find("ClusterRole", "", role_name),
                format!("ClusterRole {role_name}"),
            )
        };
        if !covers(rules) {
            continue;
        }
        let members = role_obj
            .filter(|r| r.get("aggregationRule").is_some())
            .map(|agg| {
                let selectors = selectors_of(agg);
                objects
                    .iter()
                    .filter(|o| o["kind"] == "ClusterRole" && name_of(o) != role_name)
                    .filter(|o| picks(&selectors, o))
                    .filter(|o| {
                        let rules: Vec<PolicyRule> =
                            serde_json::from_value(o["rules"].clone()).unwrap_or_default();
                        covers(Some(&rules))
                    })
                    .map(|o| (name_of(o).to_string(), Origin::of(o)))
                    .collect()
            })
            .unwrap_or_default();
        let at = if bns.is_empty() {
            name_of(b).to_string()
        } else {
            format!("{bns}/{}", name_of(b))
        };
        out.push(Grant {
            binding: format!("{kind} {at}"),
            role,
            binding_origin: Origin::of(b),
            role_origin: role_obj.and_then(Origin::of),
            members,
        });
    }
    out
}

/// The cluster once the rules' outputs are applied: each replaces the
/// live object of its kind, namespace and name.
fn with_desired(live: &[Value], desired: Vec<Value>) -> Vec<Value> {
    let key = |o: &Value| {
        (
            o["kind"].as_str().unwrap_or_default().to_string(),
            namespace_of(o).to_string(),
            name_of(o).to_string(),
        )
    };
    let replaced: std::collections::BTreeSet<_> = desired.iter().map(key).collect();
    live.iter()
        .filter(|o| !replaced.contains(&key(o)))
        .cloned()
        .chain(desired)
        .collect()
}

/// The live RBAC objects (every namespace), as JSON with kind set.
async fn live_rbac(client: &kube::Client) -> Result<Vec<Value>, String> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    async fn list<K>(client: &kube::Client, kind: &str) -> Result<Vec<Value>, String>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
        <K as kube::Resource>::DynamicType: Default,
    {
        let api: kube::Api<K> = kube::Api::all(client.clone());
        typed(api, kind).await
    }
    async fn list_cluster<K>(client: &kube::Client, kind: &str) -> Result<Vec<Value>, String>
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
        <K as kube::Resource>::DynamicType: Default,
    {
        let api: kube::Api<K> = kube::Api::all(client.clone());
        typed(api, kind).await
    }
    async fn typed<K>(api: kube::Api<K>, kind: &str) -> Result<Vec<Value>, String>
    where
        K: kube::Resource
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let items = api
            .list(&kube::api::ListParams::default())
            .await
            .map_err(|e| format!("cannot list {kind}s: {e}"))?
            .items;
        Ok(items
            .iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .map(|mut v| {
                v["apiVersion"] = json!("rbac.authorization.k8s.io/v1");
                v["kind"] = json!(kind);
                v
            })
            .collect())
    }
    let mut out = list_cluster::<ClusterRole>(client, "ClusterRole").await?;
    out.extend(list_cluster::<ClusterRoleBinding>(client, "ClusterRoleBinding").await?);
    out.extend(list::<Role>(client, "Role").await?);
    out.extend(list::<RoleBinding>(client, "RoleBinding").await?);
    Ok(out)
}

/// `explain --live`: asks the API server whether the subject may do the
/// request (a SubjectAccessReview), then names the live objects of
/// rbac-rules that grant it, or, when none does, those the rules' outputs
/// would grant it through once applied (evaluated as `diff` does, with the
/// installed controller's settings). Returns the text and the same as data.
pub async fn explain_live(
    client: kube::Client,
    args: &ExplainArgs,
) -> Result<(String, Value), String> {
    let spec = args.as_subject.as_deref().unwrap_or_default();
    let mut access = parse_subject(spec)?;
    access.groups.extend(args.as_group.iter().cloned());
    let subject = Subject::of(&access).map_err(|e| format!("error: --as {spec:?}: {e}"))?;
    let req = Request::parse(
        args.verb.as_deref().unwrap_or_default(),
        args.resource.as_deref().unwrap_or_default(),
        args.resource_name.as_deref(),
        args.namespace.as_deref(),
    );
    let mut diff_args = crate::diff::DiffArgs::defaults();
    diff_args.manage = args.manage;
    diff_args.params = args.params.clone();
    if args.installed_settings {
        match crate::installed::from_cluster(&client).await {
            Ok(installed) => {
                for w in diff_args.with_installed(&installed) {
                    eprintln!("warning: {w}");
                }
            }
            Err(why) => eprintln!(
                "note: the installed controller's settings could not be found ({why}): \
                 using the command line's only"
            ),
        }
    }
    // The truth, from the API server.
    let api: kube::Api<k8s_openapi::api::authorization::v1::SubjectAccessReview> =
        kube::Api::all(client.clone());
    let review: k8s_openapi::api::authorization::v1::SubjectAccessReview =
        serde_json::from_value(req.review(&subject)).map_err(|e| format!("error: {e}"))?;
    let answer = api
        .create(&kube::api::PostParams::default(), &review)
        .await
        .map_err(|e| format!("error: SubjectAccessReview: {e}"))?;
    let status = answer.status.unwrap_or_default();
    let allowed = status.allowed && !status.denied.unwrap_or(false);
    let reason = status.reason.unwrap_or_default();
    let mut t = format!(
        "{} {} {} (SubjectAccessReview{})\n",
        subject.show,
        if allowed { "CAN" } else { "CANNOT" },
        req.show(),
        if reason.is_empty() {
            String::new()
        } else {
            format!(": {reason}")
        }
    );
    let live = live_rbac(&client)
        .await
        .map_err(|e| format!("error: {e}"))?;
    let grants = grants_of(&live, &subject, &req);
    let managed: Vec<&Grant> = grants.iter().filter(|g| g.managed()).collect();
    for g in &grants {
        let how = if g.managed() {
            "granted by"
        } else {
            "granted by (not rbac-rules')"
        };
        t.push_str(&format!("  {how}: {}", g.text()));
    }
    let mut would = Vec::new();
    if managed.is_empty() {
        let desired = crate::diff::desired(client.clone(), &diff_args)
            .await
            .map_err(|e| format!("error: {e}"))?;
        would = grants_of(&with_desired(&live, desired), &subject, &req)
            .into_iter()
            .filter(Grant::managed)
            .collect();
        for g in &would {
            t.push_str(&format!(
                "  WOULD be granted by (not yet applied): {}",
                g.text()
            ));
        }
        if grants.is_empty() && would.is_empty() {
            t.push_str("  no binding, live or rendered by the rules, grants it\n");
        } else if would.is_empty() {
            t.push_str("  no object of rbac-rules grants it, nor would\n");
        }
    }
    if allowed && grants.is_empty() {
        t.push_str("  (allowed by something other than RBAC bindings: another authorizer, or a group the subject has that --as-group does not give)\n");
    }
    let data = json!({
        "subject": subject.show,
        "request": req.show(),
        "allowed": allowed,
        "reason": reason,
        "grantedBy": grants,
        "wouldBeGrantedBy": would,
    });
    Ok((t, data))
}

/// `explain --live` on a runtime of its own.
fn live_main(args: &ExplainArgs) -> Result<(String, Value), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("error: cannot start the async runtime: {e}"))?;
    rt.block_on(async {
        let client = args
            .cluster
            .client()
            .await
            .map_err(|e| format!("error: {e}"))?;
        explain_live(client, args).await
    })
}

/// The `explain` command.
pub fn main(args: &ExplainArgs) -> ExitCode {
    let result = if args.live {
        live_main(args)
    } else {
        explain_data(args)
    };
    match result {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendered_binding_would_grant_what_the_live_one_does_not_yet() {
        let ours = json!({"app.kubernetes.io/managed-by": "rbac-rules"});
        let role = json!({"kind": "ClusterRole", "metadata": {"name": "p:system", "labels": ours,
            "annotations": {"rbacrules.io/rule": "provider-system"}},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]});
        let binding = |subjects: Value| {
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "p:system", "labels": ours,
                "annotations": {"rbacrules.io/rule": "provider-system",
                                "rbacrules.io/trigger": "ProviderRevision.pkg.example.org/p-1"}},
                "roleRef": {"kind": "ClusterRole", "name": "p:system"}, "subjects": subjects})
        };
        // Live: rendered with the wrong namespace, no subjects.
        let live = vec![role.clone(), binding(json!([]))];
        let a = parse_subject("system:serviceaccount:xp-system:provider-nop").expect("subject");
        let s = Subject::of(&a).expect("subject");
        let req = Request::parse("get", "secrets", None, Some("team-a"));
        assert!(grants_of(&live, &s, &req).is_empty());
        let desired = vec![binding(
            json!([{"kind": "ServiceAccount", "name": "provider-nop", "namespace": "xp-system"}]),
        )];
        let world = with_desired(&live, desired);
        assert_eq!(world.len(), 2, "the rendered binding replaces the live one");
        let g = grants_of(&world, &s, &req);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].binding, "ClusterRoleBinding p:system");
        assert_eq!(
            g[0].binding_origin
                .as_ref()
                .and_then(|o| o.trigger.as_deref()),
            Some("ProviderRevision.pkg.example.org/p-1")
        );
        // Another verb: nothing.
        let req = Request::parse("delete", "secrets", None, Some("team-a"));
        assert!(grants_of(&world, &s, &req).is_empty());
    }
}
