//! Reading what the commands are given: RbacRule manifests (the built-in
//! set embedded in the binary, and rule files given on the command line)
//! and the allow-list file. Unknown fields are errors here, naming file,
//! rule and field: a typo must not silently change a rule. The commands
//! (`render`, `validate`, `test`, `explain`, `diff`) stand on this module,
//! never it on them.

use std::path::{Path, PathBuf};

use serde_json::Value;

use k8s_openapi::api::rbac::v1::ClusterRole;

use crate::api::{GROUP, RbacRuleSpec};
use crate::engine::{ObjectStore, RuleSource};
use crate::policy::AllowList;
use crate::yaml::{self, Document, YamlError};

/// The built-in rules: every `rules/*.yaml` file (path, text), embedded by
/// the build script.
pub const BUILTIN: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/builtin_rules.rs"));

/// The kind of a rule test (`rbac-rules test`): such documents may sit
/// beside rules, and are not rules.
pub const TEST_KIND: &str = "RbacRuleTest";

/// The kind of a rule a namespace's admins write, confined to its
/// namespace (`NamespacedRbacRule`, src/api.rs).
pub const TENANT_KIND: &str = "NamespacedRbacRule";

/// The kinds of rule documents.
pub const RULE_KINDS: &[&str] = &["RbacRule", TENANT_KIND];

/// Whether a document is a rule test, not a rule.
pub fn is_rule_test(doc: &Document) -> bool {
    doc.value["kind"] == TEST_KIND
}

/// A rule or allow-list file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Unreadable file or invalid YAML.
    #[error(transparent)]
    Yaml(#[from] YamlError),
    /// The allow-list file: a document that is not a ClusterRole, or one
    /// the object store refuses.
    #[error("{path}: {message}")]
    Allow { path: String, message: String },
    /// A document that is not a valid RbacRule.
    #[error("{origin}: {rule}{field}: {message}")]
    Invalid {
        origin: String,
        rule: String,
        field: String,
        message: String,
    },
}

fn invalid(doc: &Document, rule: &str, field: &str, message: impl Into<String>) -> LoadError {
    LoadError::Invalid {
        origin: doc.origin(),
        rule: if rule.is_empty() {
            "RbacRule".to_string()
        } else {
            format!("RbacRule {rule:?}")
        },
        field: if field.is_empty() {
            String::new()
        } else {
            format!(": {field}")
        },
        message: message.into(),
    }
}

/// Parses one RbacRule document; the first problem when there are several.
pub fn parse_rule(doc: &Document) -> Result<RuleSource, LoadError> {
    parse_rule_all(doc).map_err(|mut errs| errs.remove(0))
}

/// Parses one RbacRule document, reporting every unknown field.
pub fn parse_rule_all(doc: &Document) -> Result<RuleSource, Vec<LoadError>> {
    let v = &doc.value;
    let name = v["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let api_version = v["apiVersion"].as_str().unwrap_or_default();
    let kind = v["kind"].as_str().unwrap_or_default();
    if !RULE_KINDS.contains(&kind) || api_version != format!("{GROUP}/v1alpha1") {
        return Err(vec![invalid(
            doc,
            &name,
            "",
            format!(
                "expected apiVersion {GROUP}/v1alpha1, kind RbacRule or {TENANT_KIND}; got {api_version:?}, {kind:?}"
            ),
        )]);
    }
    if name.is_empty() {
        return Err(vec![invalid(
            doc,
            &name,
            "metadata.name",
            "name is required",
        )]);
    }
    // A NamespacedRbacRule is named `<namespace>/<name>` in the engine
    // (docs/rules.md "Namespaced rules").
    let namespace = match (kind, v["metadata"]["namespace"].as_str()) {
        (TENANT_KIND, Some(ns)) if !ns.is_empty() => {
            if let Err(e) = crate::engine::output::validate_namespace("metadata.namespace", ns) {
                return Err(vec![invalid(doc, &name, "metadata.namespace", e.message)]);
            }
            Some(ns.to_string())
        }
        (TENANT_KIND, _) => {
            return Err(vec![invalid(
                doc,
                &name,
                "metadata.namespace",
                "a NamespacedRbacRule needs metadata.namespace: the namespace it reads and writes",
            )]);
        }
        _ => None,
    };
    let name = match &namespace {
        Some(ns) => crate::engine::tenant::rule_name(ns, &name),
        None => name,
    };
    let spec = v.get("spec").cloned().unwrap_or(Value::Null);
    let mut unknown: Vec<String> = Vec::new();
    let parsed: Result<RbacRuleSpec, _> = serde_path_to_error::deserialize(
        serde_ignored::Deserializer::new(spec, &mut |p: serde_ignored::Path| {
            unknown.push(format!("spec.{}", yaml_path(&p.to_string())))
        }),
    );
    let typo_hint = unknown
        .first()
        .map(|u| match suggest_field(u) {
            Some(s) => format!(" (unknown field {u}: did you mean {s:?}?)"),
            None => format!(" (unknown field {u}: a typo?)"),
        })
        .unwrap_or_default();
    let spec = parsed.map_err(|e| {
        let path = yaml_path(&e.path().to_string());
        let field = if path.is_empty() {
            "spec".to_string()
        } else {
            format!("spec.{path}")
        };
        let message = humanize(&e.into_inner().to_string());
        vec![invalid(doc, &name, &field, format!("{message}{typo_hint}"))]
    })?;
    if !unknown.is_empty() {
        return Err(unknown
            .iter()
            .map(|u| {
                let hint = suggest_field(u)
                    .map(|s| format!(" (did you mean {s:?}?)"))
                    .unwrap_or_default();
                invalid(
                    doc,
                    &name,
                    u,
                    format!("unknown field {:?}{hint}", last_segment(u)),
                )
            })
            .collect());
    }
    Ok(RuleSource {
        name,
        spec,
        namespace,
    })
}

/// A deserializer path as written in YAML: `outputs.0.nmae` →
/// `outputs[0].nmae`; the `?` an optional value adds is dropped.
fn yaml_path(path: &str) -> String {
    let mut out = String::new();
    for seg in path.split('.') {
        if seg.is_empty() || seg == "?" {
            continue;
        }
        if seg.chars().all(|c| c.is_ascii_digit()) {
            out.push_str(&format!("[{seg}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(seg);
        }
    }
    out
}

fn last_segment(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}

/// Serde's wording for people: no backticked Rust names.
fn humanize(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown variant `")
        && let Some((got, expected)) = rest.split_once("`, expected one of ")
    {
        let options: Vec<String> = expected
            .split(", ")
            .map(|o| o.trim_matches('`').to_string())
            .collect();
        let hint = closest(got, options.iter().map(String::as_str))
            .map(|s| format!(" (did you mean {s:?}?)"))
            .unwrap_or_default();
        return format!(
            "unknown value {got:?}: expected one of {}{hint}",
            options.join(", ")
        );
    }
    if let Some(rest) = message.strip_prefix("invalid type: ")
        && let Some((got, expected)) = rest.split_once(", expected ")
    {
        let got = match got {
            "sequence" => "a list".to_string(),
            "map" => "a map".to_string(),
            other => other.to_string(),
        };
        return format!("expected {expected}, got {got}");
    }
    if let Some(rest) = message.strip_prefix("missing field `")
        && let Some(field) = rest.strip_suffix('`')
    {
        return format!("missing field {field:?}");
    }
    message.to_string()
}

/// The closest of `candidates` to `word`, when close enough to be a typo.
fn closest<'a>(word: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(2);
    candidates
        .map(|c| {
            (
                strsim::levenshtein(&word.to_lowercase(), &c.to_lowercase()),
                c,
            )
        })
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, c)| c)
}

/// The field the RbacRule schema has where `path` (`spec.trigger.selecter`)
/// names one it does not.
fn suggest_field(path: &str) -> Option<String> {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(crate::api::RbacRule::crd()).ok()?;
    let mut schema = crd
        .pointer("/spec/versions/0/schema/openAPIV3Schema")?
        .clone();
    let segs: Vec<&str> = path.split('.').collect();
    let (last, parents) = segs.split_last()?;
    for seg in parents {
        let name = seg.split('[').next().unwrap_or(seg);
        schema = schema.pointer(&format!("/properties/{name}"))?.clone();
        for _ in 0..seg.matches('[').count() {
            schema = schema.get("items")?.clone();
        }
    }
    let props = schema.get("properties")?.as_object()?;
    closest(last, props.keys().map(String::as_str)).map(str::to_string)
}

/// Parses every document of a text as an RbacRule.
pub fn parse_text(path: &Path, text: &str) -> Result<Vec<RuleSource>, LoadError> {
    yaml::parse_documents(path, text)?
        .iter()
        .map(parse_rule)
        .collect()
}

/// Loads rule files and directories; every invalid rule is reported.
pub fn load(paths: &[PathBuf]) -> Result<Vec<RuleSource>, Vec<LoadError>> {
    Ok(load_with_origins(paths)?
        .into_iter()
        .map(|(_, r)| r)
        .collect())
}

/// Like [`load`], with each rule's origin (`file#document`) for messages.
/// Directories are read like `kubectl apply -f DIR`: their files only.
pub fn load_with_origins(paths: &[PathBuf]) -> Result<Vec<(String, RuleSource)>, Vec<LoadError>> {
    load_tree_with_origins(paths, false)
}

/// Like [`load_with_origins`], recursing into sub-directories when
/// `recursive` (`-R`). Documents of other kinds found in a directory are
/// skipped (see [`load_tree_noted`] for the notes saying so).
pub fn load_tree_with_origins(
    paths: &[PathBuf],
    recursive: bool,
) -> Result<Vec<(String, RuleSource)>, Vec<LoadError>> {
    load_tree_noted(paths, recursive).map(|(rules, _)| rules)
}

/// Rules read for a command, with the notes a user should see on stderr.
pub type Noted = (Vec<(String, RuleSource)>, Vec<String>);

/// Loads rule files and directories. A file named on the command line must
/// hold only RbacRules (and RbacRuleTests); in a directory, documents of
/// other kinds (a ClusterRole, a CRD kept beside the rules) are skipped,
/// each with a note. A document of this project's group with another kind
/// is an error either way: most likely a misspelt RbacRule.
pub fn load_tree_noted(paths: &[PathBuf], recursive: bool) -> Result<Noted, Vec<LoadError>> {
    let mut docs = Vec::new();
    let mut notes = Vec::new();
    for p in paths {
        let in_dir = p.is_dir();
        for d in yaml::load_tree(std::slice::from_ref(p), recursive)
            .map_err(|e| vec![LoadError::from(e)])?
        {
            if in_dir && !is_ours(&d.value) {
                notes.push(format!(
                    "note: {}: skipped {} {:?}: not an RbacRule",
                    d.origin(),
                    d.value["kind"]
                        .as_str()
                        .unwrap_or("a document without kind"),
                    d.value["metadata"]["name"].as_str().unwrap_or_default()
                ));
                continue;
            }
            docs.push(d);
        }
    }
    Ok((with_origins(&docs)?, notes))
}

/// Whether a document claims to be one of this project's kinds: its
/// apiVersion is of our group or its kind is RbacRule.
pub fn is_ours(v: &Value) -> bool {
    v["kind"] == "RbacRule"
        || v["kind"] == TENANT_KIND
        || v["apiVersion"]
            .as_str()
            .is_some_and(|a| a.split('/').next() == Some(GROUP))
}

/// The rules a command runs: those of `paths`, or the built-in rules when
/// none are given. Each note (the built-in rules used, documents skipped)
/// is printed on stderr: nothing implicit is silent.
pub fn load_for_command(
    command: &str,
    paths: &[PathBuf],
    recursive: bool,
) -> Result<Vec<(String, RuleSource)>, Vec<LoadError>> {
    let (rules, notes) = if paths.is_empty() {
        (builtin_with_origins()?, vec![builtin_note(command)])
    } else {
        load_tree_noted(paths, recursive)?
    };
    for n in notes {
        eprintln!("{n}");
    }
    Ok(rules)
}

/// The note printed when a command runs the built-in rules because it was
/// given none.
pub fn builtin_note(command: &str) -> String {
    let how = if command.starts_with("test ") {
        "spec.rules"
    } else {
        "--rules FILE|DIR"
    };
    format!(
        "note: {command}: no rules given: using the built-in rules (rules/*.yaml, embedded \
         in the binary); give {how} for your own"
    )
}

fn with_origins(docs: &[Document]) -> Result<Vec<(String, RuleSource)>, Vec<LoadError>> {
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    // Rule tests (`rbac-rules test`) may sit beside rules under -R.
    let mut seen = std::collections::HashSet::new();
    for d in docs.iter().filter(|d| !is_rule_test(d)) {
        // A file named twice is read once.
        if !seen.insert(d.origin()) {
            continue;
        }
        match parse_rule_all(d) {
            Ok(r) => ok.push((d.origin(), r)),
            Err(e) => bad.extend(e),
        }
    }
    bad.extend(duplicates(docs));
    if bad.is_empty() { Ok(ok) } else { Err(bad) }
}

/// One error per RbacRule whose name an earlier document already used: a
/// cluster holds one object per name, so one would silently replace the
/// other. The same document read twice (a file named twice) is not a
/// duplicate.
pub fn duplicates(docs: &[Document]) -> Vec<LoadError> {
    let mut first: std::collections::HashMap<&str, String> = std::collections::HashMap::new();
    let mut out = Vec::new();
    let mut names: Vec<(String, &Document)> = Vec::new();
    for d in docs {
        let Some(name) = d.value["metadata"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
        else {
            continue;
        };
        // Tenant rules are unique per namespace.
        match (
            d.value["kind"].as_str(),
            d.value["metadata"]["namespace"].as_str(),
        ) {
            (Some("RbacRule"), _) => names.push((name.to_string(), d)),
            (Some(TENANT_KIND), Some(ns)) => {
                names.push((crate::engine::tenant::rule_name(ns, name), d))
            }
            _ => {}
        }
    }
    for (name, d) in &names {
        let (name, d) = (name.as_str(), *d);
        match first.get(name) {
            None => {
                first.insert(name, d.origin());
            }
            Some(origin) if *origin == d.origin() => {}
            Some(origin) => out.push(invalid(
                d,
                name,
                "metadata.name",
                format!(
                    "duplicate rule name: {origin} defines an RbacRule {name:?} too; \
                     rule names are unique in a cluster (rename one)"
                ),
            )),
        }
    }
    out
}

/// The built-in rules with their origins (`rules/<file>#document`).
pub fn builtin_with_origins() -> Result<Vec<(String, RuleSource)>, Vec<LoadError>> {
    let mut docs = Vec::new();
    for (file, text) in BUILTIN {
        docs.extend(
            yaml::parse_documents(Path::new(file), text).map_err(|e| vec![LoadError::from(e)])?,
        );
    }
    with_origins(&docs)
}

/// The built-in rules.
pub fn builtin() -> Result<Vec<RuleSource>, Vec<LoadError>> {
    Ok(builtin_with_origins()?
        .into_iter()
        .map(|(_, r)| r)
        .collect())
}

/// The ClusterRole the controller needs to watch what `rules` read: list
/// and watch of every kind they read (triggers, related objects, the
/// ClusterRoles of rulesFrom), and update on the finalizers of trigger
/// kinds (outputs are owned by their trigger with blockOwnerDeletion, which
/// the OwnerReferencesPermissionEnforcement admission plugin checks). It is
/// labelled to aggregate into the controller's own ClusterRole. A kind's
/// plural comes from its CustomResourceDefinition among `objects`, else it
/// is guessed as Kubernetes guesses it.
pub fn controller_role(rules: &[RuleSource], name: &str, objects: &[Value]) -> Value {
    use std::collections::BTreeMap;
    let mut plurals: BTreeMap<(String, String), String> = BTreeMap::new();
    for o in objects
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
    {
        let s = &o["spec"];
        if let (Some(g), Some(k), Some(p)) = (
            s["group"].as_str(),
            s["names"]["kind"].as_str(),
            s["names"]["plural"].as_str(),
        ) {
            plurals.insert((g.to_string(), k.to_string()), p.to_string());
        }
    }
    let plural = |group: &str, kind: &str| {
        plurals
            .get(&(group.to_string(), kind.to_string()))
            .cloned()
            .unwrap_or_else(|| guess_plural(kind))
    };
    let engine = crate::engine::Engine::new(rules, Default::default());
    // By group: the resources to list and watch, and the finalizers.
    let mut watch: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for i in engine.interests() {
        watch
            .entry(i.gk.group.clone())
            .or_default()
            .insert(plural(&i.gk.group, &i.gk.kind));
    }
    let mut finalizers: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for t in rules.iter().filter_map(|r| r.spec.trigger.as_ref()) {
        finalizers
            .entry(t.api_group.clone())
            .or_default()
            .insert(format!("{}/finalizers", plural(&t.api_group, &t.kind)));
    }
    let mut policy = Vec::new();
    for (group, resources) in &watch {
        policy.push(serde_json::json!({
            "apiGroups": [group],
            "resources": resources,
            "verbs": ["list", "watch"],
        }));
    }
    for (group, resources) in &finalizers {
        policy.push(serde_json::json!({
            "apiGroups": [group],
            "resources": resources,
            "verbs": ["update"],
        }));
    }
    serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/part-of": "rbac-rules",
                format!("{GROUP}/aggregate-to-controller"): "true",
            },
        },
        "rules": policy,
    })
}

/// The resource (plural) of a kind, as Kubernetes guesses it for a CRD
/// without an explicit plural (`UnsafeGuessKindToResource`).
pub fn guess_plural(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    if lower.ends_with('s') || lower.ends_with("ch") || lower.ends_with("sh") {
        format!("{lower}es")
    } else if let Some(stem) = lower.strip_suffix('y')
        && !stem.ends_with(['a', 'e', 'i', 'o', 'u'])
    {
        format!("{stem}ies")
    } else {
        format!("{lower}s")
    }
}

/// The allow-list file: the union of its ClusterRoles' rules or, when one
/// is aggregated, that one (the others go into the object store, for its
/// selectors to find). `render --allow` and a rule test's `allow` read it.
pub fn load_allow(path: &PathBuf, store: &mut ObjectStore) -> Result<AllowList, LoadError> {
    let docs = yaml::load_paths(std::slice::from_ref(path))?;
    let mut roles = Vec::new();
    for d in docs {
        let role: ClusterRole =
            serde_json::from_value(d.value.clone()).map_err(|e| LoadError::Allow {
                path: d.origin(),
                message: format!("not a ClusterRole: {e}"),
            })?;
        roles.push((d, role));
    }
    if let Some(i) = roles.iter().position(|(_, r)| r.aggregation_rule.is_some()) {
        let allow = AllowList::from_cluster_role(&roles[i].1);
        for (j, (d, _)) in roles.into_iter().enumerate() {
            if j != i {
                store
                    .insert(d.value.clone())
                    .map_err(|message| LoadError::Allow {
                        path: d.origin(),
                        message,
                    })?;
            }
        }
        return Ok(allow);
    }
    let mut allow = AllowList::default();
    for (_, role) in &roles {
        let one = AllowList::from_cluster_role(role);
        allow.rules.extend(one.rules);
        allow.custom_groups |= one.custom_groups;
    }
    Ok(allow)
}
