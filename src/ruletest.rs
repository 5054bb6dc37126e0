//! `rbac-rules test`: rule tests as files, in the spirit of `kyverno test`.
//!
//! A test (`kind: RbacRuleTest`) names rule files, input objects and
//! expectations: objects that must be rendered (containing the given
//! fields), objects that must not be, errors that must be reported, and
//! access statements checked against the input and output objects with
//! Kubernetes RBAC semantics: bindings → roles → rules, aggregation
//! flattened, rules compared with the "covers" semantics of [`crate::policy`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use serde::Deserialize;
use serde_json::Value;

use crate::api::ManageLevel;
use crate::engine::{Engine, Evaluation, ObjectStore, Options};
use crate::rules::{self, TEST_KIND};
use crate::yaml::{self, Document};

/// Arguments of `test`.
#[derive(clap::Args, Clone, Debug)]
#[command(after_help = "Examples:
  rbac-rules test rules/examples/any-crd/tests
  rbac-rules test my-rules/ --junit results.xml
  rbac-rules test my-rules/tests --allow deploy/controller/allow-list.yaml
  rbac-rules test docs/tutorial/first-hour/tests -o json

A test's rules, objects and allow-list paths are relative to its file; a test
without `spec.rules` runs the built-in rules (noted on stderr).

Exit status: 0 every test passed, 1 a test failed or none was found.")]
pub struct TestArgs {
    /// Test files or directories (searched recursively for documents of
    /// kind RbacRuleTest; other documents are skipped).
    #[arg(required = true, num_args = 1..)]
    pub paths: Vec<PathBuf>,
    /// Also write the results as JUnit XML to this file.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// An allow-list file applied to every test that names none of its own
    /// (`spec.allow`), as `render --allow` applies it: e.g. the Deployment's
    /// deploy/controller/allow-list.yaml.
    #[arg(long, value_name = "FILE")]
    pub allow: Option<PathBuf>,
    /// Settings rules read as `params.<name>`, for every test. A test
    /// whose objects hold the controller's Deployment uses its params (and
    /// the allow-list ClusterRole it names, when among the objects) where
    /// none is given here; one given here that differs is used, with a
    /// warning naming both values.
    #[command(flatten)]
    pub params: crate::params::ParamArgs,
    /// Output format: human lines, or the results as json or yaml data.
    #[arg(short = 'o', long, value_enum, default_value_t = crate::validate::Format::Human)]
    pub output: crate::validate::Format,
}

/// The spec of a test.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TestSpec {
    /// Rule files or directories, relative to the test file; default: the
    /// built-in rules.
    #[serde(default)]
    pub rules: Vec<String>,
    /// Input objects: file paths (relative to the test file) or inline
    /// objects.
    #[serde(default)]
    pub objects: Vec<Value>,
    /// `--manage` level: serviceaccounts, basic or all (default).
    #[serde(default)]
    pub manage: Option<String>,
    /// Default denials to switch off, as the `--allow-*` flags do
    /// (`systemNames`, `clusterAdminBindings`, `escalationVerbs`,
    /// `wildcardAll`).
    #[serde(default)]
    pub waivers: crate::policy::Waivers,
    /// An allow-list file (relative to the test file), read as `render
    /// --allow` reads it: e.g. `deploy/controller/allow-list.yaml` with
    /// the ClusterRoles that extend it, to test rules exactly as the
    /// shipped Deployment runs them.
    #[serde(default, alias = "allowList")]
    pub allow: Option<String>,
    /// Who writes the rules: each NamespacedRbacRule is checked as
    /// admission would check it for this author (`render --as`), against
    /// the RBAC objects of `objects`; what it would refuse fails the test
    /// unless `expect.errors` names it.
    #[serde(default)]
    pub author: Option<crate::delegation::Author>,
    /// What must hold.
    #[serde(default)]
    pub expect: Expect,
}

/// Expectations of a test.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Expect {
    /// Objects that must be rendered: the one with the same kind, namespace
    /// and name must contain every field given (lists compared whole).
    #[serde(default)]
    pub objects: Vec<Value>,
    /// Objects (kind, name, namespace) that must not be rendered.
    #[serde(default)]
    pub absent: Vec<Value>,
    /// Access statements.
    #[serde(default)]
    pub access: Vec<Access>,
    /// Substrings of the errors the render must report (none by default:
    /// any error fails the test).
    #[serde(default)]
    pub errors: Vec<String>,
}

/// "User alice in namespace team-a can create buckets.a.example.org".
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Access {
    /// A user name.
    pub user: Option<String>,
    /// A group name.
    pub group: Option<String>,
    /// A ServiceAccount, `namespace:name`.
    pub service_account: Option<String>,
    /// More groups the subject is in.
    #[serde(default)]
    pub groups: Vec<String>,
    /// The request's namespace; none for a cluster-wide request.
    pub namespace: Option<String>,
    /// A verb the subject must be allowed.
    pub can: Option<String>,
    /// A verb the subject must be denied.
    pub cannot: Option<String>,
    /// `plural[.group][/subresource]`, e.g. `buckets.a.example.org`,
    /// `secrets`, `pods/log`.
    pub resource: String,
    /// A resource name, for rules with resourceNames.
    pub name: Option<String>,
    /// The resource is on purpose one the test's world does not define (a
    /// type the rules must not create grants for): it is not checked
    /// against the known resources.
    #[serde(default)]
    pub undefined_resource: bool,
}

/// The outcome of one test.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Outcome {
    /// `file#document`.
    pub origin: String,
    /// metadata.name of the test.
    pub name: String,
    /// Why it failed; empty when it passed.
    pub failures: Vec<String>,
}

/// Finds every test under `paths` and runs it.
pub fn run_all(paths: &[PathBuf]) -> Result<Vec<Outcome>, yaml::YamlError> {
    run_all_with(paths, None, &BTreeMap::new())
}

/// [`run_all`], applying the allow-list file `allow` to every test that
/// names none of its own.
pub fn run_all_with(
    paths: &[PathBuf],
    allow: Option<&Path>,
    params: &BTreeMap<String, String>,
) -> Result<Vec<Outcome>, yaml::YamlError> {
    let mut out = Vec::new();
    for doc in yaml::load_tree(paths, true)? {
        if doc.value["kind"] != TEST_KIND {
            continue;
        }
        out.push(run_one_with(&doc, allow, params));
    }
    Ok(out)
}

/// Runs one test document.
pub fn run_one(doc: &Document) -> Outcome {
    run_one_with(doc, None, &BTreeMap::new())
}

/// [`run_one`] with a default allow-list file and params.
pub fn run_one_with(
    doc: &Document,
    allow: Option<&Path>,
    params: &BTreeMap<String, String>,
) -> Outcome {
    let name = doc.value["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let failures = match serde_json::from_value::<TestSpec>(doc.value["spec"].clone()) {
        Ok(spec) => check(&doc.path, &name, &spec, allow, params),
        Err(e) => vec![format!("invalid {TEST_KIND} spec: {e}")],
    };
    Outcome {
        origin: doc.origin(),
        name,
        failures,
    }
}

/// Runs one test: renders its rules on its objects and lists every
/// expectation that does not hold. A test that cannot be set up (its
/// manage level, rules, objects or allow-list) fails with that reason
/// alone.
fn check(
    file: &Path,
    name: &str,
    spec: &TestSpec,
    default_allow: Option<&Path>,
    params: &BTreeMap<String, String>,
) -> Vec<String> {
    let (inputs, eval, admission) = match evaluate(file, name, spec, default_allow, params) {
        Ok(run) => run,
        Err(setup) => return setup,
    };
    let mut failures = Vec::new();
    let e = &spec.expect;
    if e.objects.is_empty() && e.absent.is_empty() && e.access.is_empty() && e.errors.is_empty() {
        failures.push(
            "expect is empty: a test must expect objects, absent, access or errors \
             (a test that expects nothing cannot fail)"
                .to_string(),
        );
    }
    failures.extend(error_failures(&e.errors, &eval, &admission));
    let output: Vec<Value> = eval.desired.iter().map(|d| d.object.to_value()).collect();
    failures.extend(object_failures(e, &output));
    failures.extend(access_failures(&e.access, &inputs, &output));
    failures
}

/// Sets a test up and renders it: its input objects and the evaluation, or
/// why it could not be set up.
fn evaluate(
    file: &Path,
    name: &str,
    spec: &TestSpec,
    default_allow: Option<&Path>,
    given: &BTreeMap<String, String>,
) -> Result<(Vec<Value>, Evaluation, Vec<String>), Vec<String>> {
    let base = file.parent().unwrap_or(Path::new("."));
    let manage = match spec.manage.as_deref().map(crate::parse_manage) {
        None => ManageLevel::All,
        Some(Ok(m)) => m,
        Some(Err(e)) => return Err(vec![format!("manage: {e}")]),
    };
    let paths: Vec<PathBuf> = spec.rules.iter().map(|r| base.join(r)).collect();
    let rule_sources = match rules::load_for_command(&format!("test {name}"), &paths, false) {
        Ok(r) => r.into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
        Err(errs) => return Err(errs.iter().map(|e| e.to_string()).collect()),
    };
    let inputs = test_objects(base, &spec.objects).map_err(|e| vec![e])?;
    let mut store = ObjectStore::new();
    for o in &inputs {
        if let Err(e) = store.insert(o.clone()) {
            return Err(vec![format!("objects: {e}")]);
        }
    }
    // The test's own allow-list, else the one given to every test.
    let allow_file = match (&spec.allow, default_allow) {
        (Some(p), _) => Some(base.join(p)),
        (None, Some(p)) => Some(p.to_path_buf()),
        (None, None) => None,
    };
    let mut allow = match allow_file {
        None => None,
        Some(p) => match rules::load_allow(&p, &mut store) {
            Ok(a) => Some(a),
            Err(e) => return Err(vec![format!("allow: {e}")]),
        },
    };
    // The installed controller's settings, when its Deployment is among
    // the test's objects.
    let mut params = given.clone();
    if let Ok(installed) = crate::installed::from_objects(&inputs) {
        let (merged, warnings) = crate::installed::merge_params(given, &installed);
        for w in warnings {
            eprintln!("warning: test {name}: {w}");
        }
        params = merged;
        let role = installed.allow_clusterrole.as_ref().and_then(|n| {
            inputs
                .iter()
                .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == n.as_str())
        });
        if allow.is_none()
            && let Some(r) = role.and_then(|r| serde_json::from_value(r.clone()).ok())
        {
            allow = Some(crate::policy::AllowList::from_cluster_role(&r));
        }
    }
    let engine = Engine::new(
        &rule_sources,
        Options {
            manage,
            allow,
            waivers: spec.waivers.clone(),
            params,
            ..Options::default()
        },
    );
    let eval = engine.evaluate(&store);
    // What admission would refuse of the author's tenant rules.
    let admission = match &spec.author {
        Some(author) => rule_sources
            .iter()
            .flat_map(|r| {
                admission_refusals(r, &inputs, author)
                    .into_iter()
                    .map(move |why| {
                        format!(
                            "admission would refuse NamespacedRbacRule {:?}: {why}",
                            r.name
                        )
                    })
            })
            .collect(),
        None => Vec::new(),
    };
    Ok((inputs, eval, admission))
}

/// A test's input objects: each entry a file (relative to the test's
/// folder `base`) or an inline object.
fn test_objects(base: &Path, objects: &[Value]) -> Result<Vec<Value>, String> {
    let mut inputs: Vec<Value> = Vec::new();
    for o in objects {
        match o {
            Value::String(p) => match yaml::load_paths(&[base.join(p)]) {
                Ok(docs) => inputs.extend(docs.into_iter().map(|d| d.value)),
                Err(e) => return Err(e.to_string()),
            },
            other => inputs.push(other.clone()),
        }
    }
    Ok(inputs)
}

/// Each expected error no render error contains; with none expected, every
/// render error is a failure.
fn error_failures(expected: &[String], eval: &Evaluation, admission: &[String]) -> Vec<String> {
    let mut errors: Vec<String> = eval.errors().map(|e| e.to_string()).collect();
    errors.extend(admission.iter().cloned());
    let mut failures = Vec::new();
    for want in expected {
        if !errors.iter().any(|e| e.contains(want.as_str())) {
            failures.push(format!("no error contains {want:?}; errors: {errors:?}"));
        }
    }
    if expected.is_empty() {
        failures.extend(errors.iter().map(|e| format!("render error: {e}")));
    }
    failures
}

/// Each expected object not rendered or rendered otherwise (its first
/// differing field), and each unwanted object rendered.
fn object_failures(expect: &Expect, output: &[Value]) -> Vec<String> {
    let mut failures = Vec::new();
    for want in &expect.objects {
        let key = object_key(want);
        match output.iter().find(|o| object_key(o) == key) {
            None => failures.push(format!(
                "expected object {} was not rendered",
                show_key(&key)
            )),
            Some(got) => {
                if let Some(path) = first_difference(want, got, String::new()) {
                    failures.push(format!(
                        "object {} differs at {path}: expected {}, rendered {}",
                        show_key(&key),
                        compact(lookup(want, &path)),
                        compact(lookup(got, &path))
                    ));
                }
            }
        }
    }
    for unwanted in &expect.absent {
        let key = object_key(unwanted);
        if output.iter().any(|o| object_key(o) == key) {
            failures.push(format!("object {} was rendered", show_key(&key)));
        }
    }
    failures
}

/// Each access statement that names an unknown verb or resource, or does
/// not hold in the world of the input and output objects.
fn access_failures(access: &[Access], inputs: &[Value], output: &[Value]) -> Vec<String> {
    if access.is_empty() {
        return Vec::new();
    }
    let world = World::new(inputs, output);
    let known = KnownResources::new(inputs, output);
    access
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            known
                .check(a)
                .and_then(|()| world.check(a))
                .err()
                .map(|e| format!("access[{i}]: {e}"))
        })
        .collect()
}

/// `plural` for the core group, else `plural.group`.
fn full_name(plural: &str, group: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

/// What an access statement may name: the verbs Kubernetes knows, the
/// resources of its built-in API, of the CustomResourceDefinitions in the
/// test's objects and of the roles in its input and output. A statement
/// naming anything else is a typo that would make `cannot` pass for the
/// wrong reason.
pub(crate) struct KnownResources {
    /// `plural` (core group) or `plural.group`.
    names: std::collections::BTreeSet<String>,
    /// Kind (lowercase) → `plural.group`, to answer `resource: Database`.
    kinds: BTreeMap<String, String>,
    /// The subresources of the CRDs that declare their versions, and those
    /// roles name: `plural.group` → `status`, `scale`, …
    subresources: BTreeMap<String, std::collections::BTreeSet<String>>,
}

/// Resources of Kubernetes' built-in API, by group.
const BUILTIN_RESOURCES: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "bindings",
            "componentstatuses",
            "configmaps",
            "endpoints",
            "events",
            "limitranges",
            "namespaces",
            "nodes",
            "persistentvolumeclaims",
            "persistentvolumes",
            "pods",
            "podtemplates",
            "replicationcontrollers",
            "resourcequotas",
            "secrets",
            "serviceaccounts",
            "services",
            "users",
            "groups",
            "userextras",
            "uids",
        ],
    ),
    (
        "apps",
        &[
            "controllerrevisions",
            "daemonsets",
            "deployments",
            "replicasets",
            "statefulsets",
        ],
    ),
    ("batch", &["cronjobs", "jobs"]),
    ("autoscaling", &["horizontalpodautoscalers"]),
    ("policy", &["poddisruptionbudgets"]),
    (
        "rbac.authorization.k8s.io",
        &[
            "clusterrolebindings",
            "clusterroles",
            "rolebindings",
            "roles",
        ],
    ),
    ("apiextensions.k8s.io", &["customresourcedefinitions"]),
    ("apiregistration.k8s.io", &["apiservices"]),
    (
        "admissionregistration.k8s.io",
        &[
            "mutatingwebhookconfigurations",
            "validatingwebhookconfigurations",
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
            "mutatingadmissionpolicies",
            "mutatingadmissionpolicybindings",
        ],
    ),
    ("coordination.k8s.io", &["leases"]),
    ("events.k8s.io", &["events"]),
    ("discovery.k8s.io", &["endpointslices"]),
    (
        "networking.k8s.io",
        &["ingressclasses", "ingresses", "networkpolicies"],
    ),
    ("node.k8s.io", &["runtimeclasses"]),
    ("scheduling.k8s.io", &["priorityclasses"]),
    (
        "storage.k8s.io",
        &[
            "csidrivers",
            "csinodes",
            "csistoragecapacities",
            "storageclasses",
            "volumeattachments",
        ],
    ),
    ("certificates.k8s.io", &["certificatesigningrequests"]),
    (
        "authentication.k8s.io",
        &["tokenreviews", "userextras", "uids"],
    ),
    (
        "authorization.k8s.io",
        &[
            "localsubjectaccessreviews",
            "selfsubjectaccessreviews",
            "selfsubjectrulesreviews",
            "subjectaccessreviews",
        ],
    ),
    (
        "flowcontrol.apiserver.k8s.io",
        &["flowschemas", "prioritylevelconfigurations"],
    ),
];

impl KnownResources {
    pub(crate) fn new(inputs: &[Value], outputs: &[Value]) -> Self {
        let mut known = KnownResources {
            names: BUILTIN_RESOURCES
                .iter()
                .flat_map(|(group, plurals)| plurals.iter().map(|p| full_name(p, group)))
                .collect(),
            kinds: BTreeMap::new(),
            subresources: BTreeMap::new(),
        };
        let mut role_subresources: Vec<(String, String)> = Vec::new();
        for o in inputs.iter().chain(outputs) {
            match o["kind"].as_str() {
                Some("CustomResourceDefinition") => known.add_crd(o),
                Some("ClusterRole" | "Role") => role_subresources.extend(known.add_role(o)),
                _ => {}
            }
        }
        // A role's subresource counts only for a CRD that lists its own.
        for (base, sub) in role_subresources {
            if let Some(subs) = known.subresources.get_mut(&base) {
                subs.insert(sub);
            }
        }
        known
    }

    /// A CustomResourceDefinition's resource, its kind and singular name,
    /// and the subresources its versions declare.
    fn add_crd(&mut self, o: &Value) {
        let n = &o["spec"]["names"];
        let group = o["spec"]["group"].as_str().unwrap_or_default();
        // A CRD's name is `<plural>.<group>`, even when the test gives only
        // its metadata.
        let name = o["metadata"]["name"]
            .as_str()
            .map(str::to_string)
            .or_else(|| n["plural"].as_str().map(|p| full_name(p, group)));
        let Some(name) = name else {
            return;
        };
        if let Some(k) = n["kind"].as_str() {
            self.kinds.insert(k.to_lowercase(), name.clone());
        }
        if let Some(s) = n["singular"].as_str() {
            self.kinds.insert(s.to_lowercase(), name.clone());
        }
        // Only a CRD that lists its versions says which subresources it has.
        if let Some(versions) = o["spec"]["versions"].as_array() {
            let subs = self.subresources.entry(name.clone()).or_default();
            for v in versions {
                if let Some(m) = v["subresources"].as_object() {
                    subs.extend(m.keys().cloned());
                }
            }
        }
        self.names.insert(name);
    }

    /// The resources a role's rules name (wildcards aside); returns the
    /// subresources they name, `(plural.group, subresource)`.
    fn add_role(&mut self, o: &Value) -> Vec<(String, String)> {
        let rules: Vec<PolicyRule> = serde_json::from_value(o["rules"].clone()).unwrap_or_default();
        let mut subresources = Vec::new();
        for r in rules {
            for g in r.api_groups.iter().flatten() {
                for res in r.resources.iter().flatten() {
                    let (plural, sub) = res.split_once('/').unwrap_or((res, ""));
                    if g != "*" && plural != "*" {
                        self.names.insert(full_name(plural, g));
                        if !sub.is_empty() {
                            subresources.push((full_name(plural, g), sub.to_string()));
                        }
                    }
                }
            }
        }
        subresources
    }

    /// Whether the statement's verb and resource are real.
    pub(crate) fn check(&self, a: &Access) -> Result<(), String> {
        if let Some(verb) = a.can.as_ref().or(a.cannot.as_ref())
            && !crate::policy::is_known_verb(verb)
        {
            let hint = closest(verb, crate::policy::known_verbs())
                .map(|v| format!(" (did you mean {v:?}?)"))
                .unwrap_or_default();
            return Err(format!(
                "unknown verb {verb:?}{hint}: a statement about a verb Kubernetes does not know \
                 holds for the wrong reason"
            ));
        }
        let (resource, sub) = a
            .resource
            .split_once('/')
            .unwrap_or((a.resource.as_str(), ""));
        if resource == "*" || a.undefined_resource {
            return Ok(());
        }
        if self.names.contains(resource) {
            let known = self.subresources.get(resource);
            return match known {
                Some(subs) if !sub.is_empty() && sub != "*" && !subs.contains(sub) => {
                    let hint = closest(sub, subs.iter().map(String::as_str))
                        .map(|s| format!(" (did you mean {s:?}?)"))
                        .unwrap_or_default();
                    let list: Vec<&str> = subs.iter().map(String::as_str).collect();
                    Err(format!(
                        "unknown subresource {sub:?} of {resource}{hint}: its \
                         CustomResourceDefinition declares {}",
                        if list.is_empty() {
                            "none".to_string()
                        } else {
                            list.join(", ")
                        }
                    ))
                }
                _ => Ok(()),
            };
        }
        let hint = self
            .kinds
            .get(&resource.to_lowercase())
            .map(String::as_str)
            .or_else(|| closest(resource, self.names.iter().map(String::as_str)))
            .map(|r| format!(" (did you mean {r:?}?)"))
            .unwrap_or_default();
        Err(format!(
            "unknown resource {resource:?}{hint}: write `plural.group` (`plural` for the core \
             group) of a built-in resource or of a CustomResourceDefinition in the test's \
             objects (or mark a type that must not exist `undefinedResource: true`)"
        ))
    }
}

/// The closest of `candidates` to `word`, when close enough to be a typo.
fn closest<'a>(word: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(2);
    candidates
        .map(|c| (strsim::levenshtein(&word.to_lowercase(), c), c))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, c)| c)
}

type Key = (String, String, String);

fn object_key(o: &Value) -> Key {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        s(&o["kind"]),
        s(&o["metadata"]["namespace"]),
        s(&o["metadata"]["name"]),
    )
}

fn show_key((kind, ns, name): &Key) -> String {
    if ns.is_empty() {
        format!("{kind}/{name}")
    } else {
        format!("{kind} {ns}/{name}")
    }
}

/// The first path where `got` lacks what `want` has (maps: subset; other
/// values: equal).
fn first_difference(want: &Value, got: &Value, path: String) -> Option<String> {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => w.iter().find_map(|(k, wv)| {
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            match g.get(k) {
                Some(gv) => first_difference(wv, gv, p),
                None => Some(p),
            }
        }),
        (w, g) if w == g => None,
        _ => Some(if path.is_empty() {
            ".".to_string()
        } else {
            path
        }),
    }
}

fn lookup<'a>(v: &'a Value, path: &str) -> &'a Value {
    if path == "." {
        return v;
    }
    let mut cur = v;
    for seg in path.split('.') {
        cur = cur.get(seg).unwrap_or(&Value::Null);
    }
    cur
}

fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// Every role and binding of the input and output, aggregation flattened.
pub(crate) struct World {
    /// ClusterRoles by name, aggregated ones filled.
    pub(crate) cluster_roles: BTreeMap<String, Vec<PolicyRule>>,
    /// Roles by (namespace, name).
    pub(crate) roles: BTreeMap<(String, String), Vec<PolicyRule>>,
    /// RoleBindings and ClusterRoleBindings.
    pub(crate) bindings: Vec<Value>,
}

impl World {
    pub(crate) fn new(inputs: &[Value], outputs: &[Value]) -> Self {
        // The output replaces an input object of the same kind and name.
        let mut all: BTreeMap<Key, &Value> = BTreeMap::new();
        for o in inputs.iter().chain(outputs) {
            all.insert(object_key(o), o);
        }
        let crs: Vec<ClusterRole> = all
            .values()
            .filter(|o| o["kind"] == "ClusterRole")
            .filter_map(|o| serde_json::from_value((*o).clone()).ok())
            .collect();
        let crs = crate::policy::aggregate(&crs).unwrap_or(crs);
        let cluster_roles = crs
            .into_iter()
            .map(|r| {
                (
                    r.metadata.name.unwrap_or_default(),
                    r.rules.unwrap_or_default(),
                )
            })
            .collect();
        let mut roles = BTreeMap::new();
        let mut bindings = Vec::new();
        for ((kind, ns, name), o) in &all {
            match kind.as_str() {
                "Role" => {
                    let rules: Vec<PolicyRule> =
                        serde_json::from_value(o["rules"].clone()).unwrap_or_default();
                    roles.insert((ns.clone(), name.clone()), rules);
                }
                "RoleBinding" | "ClusterRoleBinding" => bindings.push((*o).clone()),
                _ => {}
            }
        }
        World {
            cluster_roles,
            roles,
            bindings,
        }
    }

    fn check(&self, a: &Access) -> Result<(), String> {
        let (verb, want) = match (&a.can, &a.cannot) {
            (Some(v), None) => (v, true),
            (None, Some(v)) => (v, false),
            _ => return Err("give exactly one of can and cannot".to_string()),
        };
        let subject = Subject::of(a)?;
        let (resource, sub) = match a.resource.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (a.resource.as_str(), None),
        };
        let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
        let requested = PolicyRule {
            api_groups: Some(vec![group.to_string()]),
            resources: Some(vec![match sub {
                Some(s) => format!("{plural}/{s}"),
                None => plural.to_string(),
            }]),
            verbs: vec![verb.clone()],
            resource_names: a.name.clone().map(|n| vec![n]),
            non_resource_urls: None,
        };
        let via = self.allowed_by(&subject, a.namespace.as_deref(), &requested);
        let scope = match &a.namespace {
            Some(ns) => format!(" in namespace {ns}"),
            None => " cluster-wide".to_string(),
        };
        match (want, via) {
            (true, Some(_)) | (false, None) => Ok(()),
            (true, None) => Err(format!(
                "{} cannot {verb} {}{scope}: no binding grants it",
                subject.show, a.resource
            )),
            (false, Some(b)) => Err(format!(
                "{} can {verb} {}{scope}, through {b}",
                subject.show, a.resource
            )),
        }
    }

    /// The binding that allows the request, if any.
    fn allowed_by(&self, s: &Subject, ns: Option<&str>, req: &PolicyRule) -> Option<String> {
        for b in &self.bindings {
            let kind = b["kind"].as_str().unwrap_or_default();
            let bns = b["metadata"]["namespace"].as_str().unwrap_or_default();
            if kind == "RoleBinding" && Some(bns) != ns {
                continue;
            }
            let subjects = b["subjects"].as_array().map(Vec::as_slice).unwrap_or(&[]);
            if !subjects.iter().any(|x| s.matches(x, bns)) {
                continue;
            }
            let role_name = b["roleRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let rules = match b["roleRef"]["kind"].as_str() {
                Some("Role") => self.roles.get(&(bns.to_string(), role_name.clone())),
                _ => self.cluster_roles.get(&role_name),
            };
            if rules
                .into_iter()
                .flatten()
                .any(|r| crate::policy::rule_covers(r, req))
            {
                let name = b["metadata"]["name"].as_str().unwrap_or_default();
                let at = if bns.is_empty() {
                    name.to_string()
                } else {
                    format!("{bns}/{name}")
                };
                return Some(format!(
                    "{kind} {at} → {} {role_name}",
                    b["roleRef"]["kind"].as_str().unwrap_or("ClusterRole")
                ));
            }
        }
        None
    }
}

/// Who asks: a user name, groups, and a ServiceAccount identity.
pub(crate) struct Subject {
    user: Option<String>,
    groups: Vec<String>,
    service_account: Option<(String, String)>,
    /// `User alice`, for messages.
    pub(crate) show: String,
}

impl Subject {
    pub(crate) fn of(a: &Access) -> Result<Self, String> {
        let mut groups = a.groups.clone();
        let s = match (&a.user, &a.group, &a.service_account) {
            (Some(u), None, None) => {
                groups.push("system:authenticated".to_string());
                Subject {
                    user: Some(u.clone()),
                    groups,
                    service_account: None,
                    show: format!("User {u}"),
                }
            }
            (None, Some(g), None) => {
                groups.push(g.clone());
                Subject {
                    user: None,
                    groups,
                    service_account: None,
                    show: format!("Group {g}"),
                }
            }
            (None, None, Some(sa)) => {
                let (ns, name) = sa
                    .split_once(':')
                    .ok_or_else(|| format!("serviceAccount {sa:?}: expected namespace:name"))?;
                groups.extend([
                    "system:authenticated".to_string(),
                    "system:serviceaccounts".to_string(),
                    format!("system:serviceaccounts:{ns}"),
                ]);
                Subject {
                    user: Some(format!("system:serviceaccount:{ns}:{name}")),
                    groups,
                    service_account: Some((ns.to_string(), name.to_string())),
                    show: format!("ServiceAccount {ns}/{name}"),
                }
            }
            _ => return Err("give exactly one of user, group and serviceAccount".to_string()),
        };
        Ok(s)
    }

    /// The user name and groups the API server authenticates this subject
    /// with (a SubjectAccessReview's `user` and `groups`).
    pub(crate) fn identity(&self) -> (Option<&str>, &[String]) {
        (self.user.as_deref(), &self.groups)
    }

    /// Whether a binding subject names this subject (`binding_ns`: the
    /// default namespace of a RoleBinding's ServiceAccount subjects).
    pub(crate) fn matches(&self, x: &Value, binding_ns: &str) -> bool {
        let name = x["name"].as_str().unwrap_or_default();
        match x["kind"].as_str() {
            Some("User") => self.user.as_deref() == Some(name),
            Some("Group") => self.groups.iter().any(|g| g == name),
            Some("ServiceAccount") => {
                let ns = x["namespace"].as_str().unwrap_or(binding_ns);
                self.service_account
                    .as_ref()
                    .is_some_and(|(sns, sname)| sns == ns && sname == name)
            }
            _ => false,
        }
    }
}

/// What admission would refuse of the tenant rule `rule` written by
/// `author` ([`crate::delegation::refusals`]), with what the author holds
/// in its namespace read from the RBAC objects `rbac` as the offline
/// authorizer reads them.
pub fn admission_refusals(
    rule: &crate::engine::RuleSource,
    rbac: &[Value],
    author: &crate::delegation::Author,
) -> Vec<String> {
    let Some(ns) = rule.namespace.as_deref() else {
        return Vec::new();
    };
    let access = Access {
        user: Some(author.user.clone()),
        groups: author.groups.clone(),
        ..Access::default()
    };
    let subject = match Subject::of(&access) {
        Ok(s) => s,
        Err(e) => return vec![format!("author: {e}")],
    };
    let world = World::new(rbac, &[]);
    let held = held_in(&world, &subject, ns);
    crate::delegation::refusals(rule, &held, &subject.show)
}

/// Every rule `subject` holds in `namespace`: through ClusterRoleBindings
/// and the namespace's RoleBindings.
fn held_in(world: &World, subject: &Subject, namespace: &str) -> Vec<PolicyRule> {
    let mut held = Vec::new();
    for b in &world.bindings {
        let kind = b["kind"].as_str().unwrap_or_default();
        let bns = b["metadata"]["namespace"].as_str().unwrap_or_default();
        if kind == "RoleBinding" && bns != namespace {
            continue;
        }
        let subjects = b["subjects"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if !subjects.iter().any(|x| subject.matches(x, bns)) {
            continue;
        }
        let role = b["roleRef"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let rules = match b["roleRef"]["kind"].as_str() {
            Some("Role") => world.roles.get(&(bns.to_string(), role)),
            _ => world.cluster_roles.get(&role),
        };
        held.extend(rules.into_iter().flatten().cloned());
    }
    held
}

/// JUnit XML for CI systems.
pub fn junit(outcomes: &[Outcome]) -> String {
    let failed = outcomes.iter().filter(|o| !o.failures.is_empty()).count();
    let mut s = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites tests=\"{}\" failures=\"{failed}\">\n  <testsuite name=\"rbac-rules\" tests=\"{}\" failures=\"{failed}\">\n",
        outcomes.len(),
        outcomes.len()
    );
    for o in outcomes {
        s.push_str(&format!(
            "    <testcase classname=\"{}\" name=\"{}\"",
            xml(&o.origin),
            xml(&o.name)
        ));
        if o.failures.is_empty() {
            s.push_str("/>\n");
        } else {
            s.push_str(&format!(
                ">\n      <failure message=\"{}\">{}</failure>\n    </testcase>\n",
                xml(&o.failures[0]),
                xml(&o.failures.join("\n"))
            ));
        }
    }
    s.push_str("  </testsuite>\n</testsuites>\n");
    s
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The `test` command: one line per test, a summary, exit 1 on failures.
pub fn main(args: &TestArgs) -> ExitCode {
    let outcomes = match run_all_with(&args.paths, args.allow.as_deref(), &args.params.map()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let failed = outcomes.iter().filter(|o| !o.failures.is_empty()).count();
    let data = match args.output {
        crate::validate::Format::Human => {
            for o in &outcomes {
                if o.failures.is_empty() {
                    println!("ok   {}: {}", o.origin, o.name);
                } else {
                    println!("FAIL {}: {}", o.origin, o.name);
                    for f in &o.failures {
                        println!("       {f}");
                    }
                }
            }
            println!(
                "{} passed, {failed} failed, {} total",
                outcomes.len() - failed,
                outcomes.len()
            );
            Ok(None)
        }
        crate::validate::Format::Json => serde_json::to_string_pretty(&outcomes)
            .map(|t| Some(t + "\n"))
            .map_err(|e| e.to_string()),
        crate::validate::Format::Yaml => yaml::to_yaml(&outcomes)
            .map(Some)
            .map_err(|e| e.to_string()),
    };
    match data {
        Ok(Some(text)) => print!("{text}"),
        Ok(None) => {}
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(p) = &args.junit
        && let Err(e) = std::fs::write(p, junit(&outcomes))
    {
        eprintln!("error: {}: {e}", p.display());
        return ExitCode::FAILURE;
    }
    if outcomes.is_empty() {
        eprintln!("error: no {TEST_KIND} documents found");
        return ExitCode::FAILURE;
    }
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
