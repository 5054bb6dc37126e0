//! `rbac-rules render`: the engine offline, on YAML files.
//!
//! Success: every emitted object on stdout as a YAML stream, exit 0; what
//! rules skipped on purpose as `warning:` lines on stderr.
//! Any invalid rule, input or render, any output policy refuses
//! (EscalationDenied) and any live managed object in the input that policy
//! would revoke, when its `managedFields` show rbac-rules made it: every
//! error on stderr, nothing on stdout, exit 1.
//!
//! The managed-by label is a claim anyone who may write an RBAC object can
//! make: an object whose `managedFields` show someone else made it is read
//! as anyone's (a warning), and one the input cannot tell (a dump without
//! `managedFields`) that policy would revoke is a warning too. Neither
//! changes the exit status.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use k8s_openapi::api::rbac::v1::ClusterRole;
use serde_json::Value;

use crate::api::{ManageLevel, OutputKind};
use crate::engine::{
    Engine, Evaluation, Manifest, Memo, ObjectStore, Options, RuleSource, store::object_ref,
};
use crate::policy::AllowList;
use crate::rules::{self, LoadError};
use crate::yaml::{self, YamlError};

/// Arguments of `render`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct RenderArgs {
    /// YAML files or directories with the cluster's objects (multi-document
    /// or `kind: List`; `-`: stdin, e.g. from `kubectl get -o yaml`).
    #[arg(long, required = true, num_args = 1..)]
    pub objects: Vec<PathBuf>,
    /// Rule files or directories (`-`: stdin). Default: the built-in
    /// rules, with a note on stderr.
    #[arg(long, num_args = 1..)]
    pub rules: Vec<PathBuf>,
    /// Also fill each aggregated ClusterRole's rules as the Kubernetes
    /// aggregation controller would.
    #[arg(long)]
    pub flatten: bool,
    /// Highest manage level of rules to run: serviceaccounts, basic or all.
    #[arg(long, default_value = "all", value_parser = crate::parse_manage)]
    pub manage: ManageLevel,
    /// A YAML file with a ClusterRole whose rules are the allow-list. When
    /// it is aggregated, the file's other ClusterRoles (and those in
    /// --objects) are what it aggregates.
    #[arg(long)]
    pub allow: Option<PathBuf>,
    /// Default denials to switch off.
    #[command(flatten)]
    pub waivers: crate::policy::Waivers,
    /// Evaluation limits.
    #[command(flatten)]
    pub limits: crate::engine::Limits,

    #[command(flatten)]
    pub tenancy: crate::engine::tenant::Tenancy,

    /// Say what admission would refuse of each NamespacedRbacRule written
    /// by this user: every permission its static rules grant and `bind` on
    /// every role it binds by name must be held in its namespace, as the
    /// RBAC objects in --objects grant them. Refusals are errors.
    #[arg(long = "as", value_name = "USER")]
    pub as_user: Option<String>,

    /// A group of the --as user (repeatable).
    #[arg(long = "as-group", value_name = "GROUP", requires = "as_user")]
    pub as_groups: Vec<String>,
    /// Settings rules read as `params.<name>`.
    #[command(flatten)]
    pub params: crate::params::ParamArgs,
    /// Read directories given to --rules and --objects recursively (like
    /// kubectl's -R); without it only a directory's own files are read.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// Output format: a YAML stream, or JSON (a `kind: List`).
    #[arg(short = 'o', long, value_enum, default_value_t = DataFormat::Yaml)]
    pub output: DataFormat,
    /// Evaluate with the reference evaluator (src/reference/) instead.
    #[arg(long, hide = true)]
    pub reference: bool,
}

/// The format of a command's data on stdout (`-o`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DataFormat {
    /// A multi-document YAML stream.
    #[default]
    Yaml,
    /// JSON: one object, or a `kind: List` of several, as `kubectl -o json`.
    Json,
}

impl DataFormat {
    /// Kubernetes objects in this format.
    pub fn write(&self, objects: &[Value]) -> Result<String, YamlError> {
        match self {
            DataFormat::Yaml => yaml::to_yaml_stream(objects),
            DataFormat::Json => {
                let v = match objects {
                    [one] => one.clone(),
                    many => serde_json::json!({
                        "apiVersion": "v1",
                        "kind": "List",
                        "items": many,
                    }),
                };
                serde_json::to_string_pretty(&v)
                    .map(|t| t + "\n")
                    .map_err(|e| YamlError::Write(e.to_string()))
            }
        }
    }
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
    /// Invalid rules or evaluation errors, one per line.
    #[error("{}", .0.join("\n"))]
    Evaluation(Vec<String>),
}

/// Runs `render` and returns the YAML stream.
pub fn render(args: &RenderArgs) -> Result<String, RenderError> {
    render_with_warnings(args).map(|(out, _)| out)
}

/// Runs `render`: the YAML stream and the warnings (what rules skipped on
/// purpose), each `warning: <file>: <warning>`.
pub fn render_with_warnings(args: &RenderArgs) -> Result<(String, Vec<String>), RenderError> {
    let mut out = Vec::new();
    let warnings = render_to(args, &mut out)?;
    let out = String::from_utf8(out).map_err(|e| YamlError::Write(e.to_string()))?;
    Ok((out, warnings))
}

/// Runs `render`, writing the YAML stream to `out` as it is produced
/// (nothing is written when the render fails); returns the warnings.
pub fn render_to(args: &RenderArgs, out: &mut impl Write) -> Result<Vec<String>, RenderError> {
    let rendered = prepare(args)?;
    rendered.write_to(out)?;
    Ok(rendered.warnings)
}

/// A successful render, ready to print: the evaluation's objects are
/// printed from where the engine keeps them, not copied.
pub struct Rendered {
    eval: Evaluation,
    /// `--flatten`: aggregated ClusterRoles with their rules filled, by name.
    filled: HashMap<String, Value>,
    /// What rules skipped on purpose, each `warning: <file>: <warning>`.
    pub warnings: Vec<String>,
    /// The evaluation's memo (see [`prepare`]).
    _memo: Memo,
    /// The objects read, kept with the result for the same reason.
    _store: ObjectStore,
}

impl Rendered {
    /// The evaluation rendered.
    pub fn evaluation(&self) -> &Evaluation {
        &self.eval
    }

    /// Writes every object as a multi-document YAML stream, sorted by kind,
    /// namespace and name.
    pub fn write_to(&self, out: &mut impl Write) -> Result<(), YamlError> {
        // Ok: filled by --flatten; Err: as emitted.
        let objects: Vec<Result<&Value, Manifest>> = self
            .eval
            .desired
            .iter()
            .map(|d| match d.kind {
                OutputKind::ClusterRole => self.filled.get(&d.name).ok_or(d.object.clone()),
                _ => Err(d.object.clone()),
            })
            .collect();
        yaml::write_stream(&objects, out)
    }
}

impl Rendered {
    /// Writes every object, in the order of [`Rendered::write_to`], as one
    /// JSON `kind: List`.
    pub fn write_json(&self, out: &mut impl Write) -> Result<(), YamlError> {
        let mut text = Vec::new();
        self.write_to(&mut text)?;
        let text = String::from_utf8(text).map_err(|e| YamlError::Write(e.to_string()))?;
        let objects: Vec<Value> = yaml::parse_documents(std::path::Path::new("-"), &text)?
            .into_iter()
            .map(|d| d.value)
            .collect();
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
        serde_json::to_writer_pretty(&mut *out, &list)
            .map_err(|e| YamlError::Write(e.to_string()))?;
        writeln!(out).map_err(|e| YamlError::Write(e.to_string()))
    }
}

impl RenderArgs {
    /// The evaluation options these arguments ask for, with the allow-list
    /// loaded from `--allow` (it adds its roles to the store).
    pub fn options(&self, allow: Option<AllowList>) -> Options {
        Options {
            manage: self.manage,
            allow,
            waivers: self.waivers.clone(),
            limits: self.limits.clone(),
            params: self.params.map(),
            param_origins: self.params.origins(),
            tenancy: self.tenancy.clone(),
            ..Options::default()
        }
    }
}

/// Evaluates the rules on the objects; every error is returned, nothing
/// is printed.
pub fn prepare(args: &RenderArgs) -> Result<Rendered, RenderError> {
    let (rules, origins) = load_rules(args)?;
    let (mut store, claims) = load_objects(args, &rules)?;
    let allow = match &args.allow {
        Some(p) => Some(rules::load_allow(p, &mut store)?),
        None => None,
    };
    let options = args.options(allow);
    let engine = Engine::new(&rules, options.clone());
    // One-shot: no read index; kept with the result (as the store is), so
    // that the CLI, which never frees it (see `main`), does not pay for
    // dropping it.
    let mut memo = Memo::one_shot();
    let eval = match args.reference {
        true => crate::reference::evaluate(&rules, &options, &store),
        false => engine.evaluate_incremental(&store, &mut memo),
    };
    let mut errors = errors_of(&eval, &origins, &claims);
    let mut notes = Vec::new();
    if let Some(user) = &args.as_user {
        let author = crate::delegation::Author {
            user: user.clone(),
            groups: args.as_groups.clone(),
        };
        let rbac = rbac_objects(args)?;
        for r in rules.iter().filter(|r| r.namespace.is_some()) {
            let refused = crate::ruletest::admission_refusals(r, &rbac, &author);
            let origin = origins.get(&r.name).map(String::as_str).unwrap_or("-");
            if refused.is_empty() {
                notes.push(format!(
                    "note: {origin}: admission would admit NamespacedRbacRule {:?} written by user {user:?}",
                    r.name
                ));
            }
            for why in refused {
                errors.push(format!(
                    "error: {origin}: admission would refuse NamespacedRbacRule {:?} written by user {user:?}: {why}",
                    r.name
                ));
            }
        }
    }
    if !errors.is_empty() {
        return Err(RenderError::Evaluation(errors));
    }
    let mut warnings = claims.warnings.clone();
    warnings.extend(notes);
    warnings.extend(unverified_revocations(&eval, &claims));
    warnings.extend(warnings_of(&eval, &origins));
    let filled = if args.flatten {
        flatten(&store, &eval)?
    } else {
        HashMap::new()
    };
    Ok(Rendered {
        eval,
        filled,
        warnings,
        _memo: memo,
        _store: store,
    })
}

/// Rule name → the file it was read from, to name it in messages.
type Origins = BTreeMap<String, String>;

/// The rules `--rules` names (or the built-in ones), with where each was
/// read; a `--param` no rule declares is an error, as its setting would
/// be lost to a typo.
fn load_rules(args: &RenderArgs) -> Result<(Vec<RuleSource>, Origins), RenderError> {
    let loaded =
        rules::load_for_command("render", &args.rules, args.recursive).map_err(|errs| {
            RenderError::Evaluation(errs.iter().map(|e| format!("error: {e}")).collect())
        })?;
    let origins: Origins = loaded
        .iter()
        .map(|(o, r)| (r.name.clone(), o.clone()))
        .collect();
    let rules: Vec<_> = loaded.into_iter().map(|(_, r)| r).collect();
    let params = args.params.map();
    let given = args.params.origins();
    let unknown = crate::params::undeclared(&params, rules.iter().map(|r| &r.spec));
    if !unknown.is_empty() {
        return Err(RenderError::Evaluation(
            unknown
                .iter()
                .map(|k| {
                    let origin = given
                        .get(*k)
                        .unwrap_or(&crate::params::Origin::Flag)
                        .describe(k);
                    format!("error: {origin}: no rule declares a param of this name")
                })
                .collect(),
        ));
    }
    Ok((rules, origins))
}

/// What the input says of the objects labelled ours
/// (`app.kubernetes.io/managed-by: rbac-rules`): a label anyone who may
/// write an RBAC object can set, so a claim, not a proof.
#[derive(Default)]
struct Claims {
    /// Labelled, with no `managedFields` in the input (a dump by `kubectl
    /// get -o yaml`): nothing tells ours from someone else's, so what
    /// policy would revoke of them is a warning, never an error.
    unverified: BTreeSet<crate::engine::OutKey>,
    /// One warning per object whose `managedFields` show rbac-rules did
    /// not make it: loaded without the claim (as anyone's).
    warnings: Vec<String>,
}

/// The objects `--objects` names, each cut to what the rules read and put
/// in the store as it is parsed (never all parsed documents and the store
/// at once); the first object the store refuses is the error. Objects
/// others labelled ours lose the claim ([`crate::engine::output::vet_claim`]).
fn load_objects(
    args: &RenderArgs,
    rules: &[RuleSource],
) -> Result<(ObjectStore, Claims), RenderError> {
    use crate::engine::output::{self, Provenance};
    let mut store = ObjectStore::new();
    let mut claims = Claims::default();
    let mut refused: Option<RenderError> = None;
    let shaper = std::sync::Arc::new(crate::engine::shape::Shaper::new(
        crate::engine::shape::interests(rules),
    ));
    // What no rule reads is dropped as it is parsed (never built), the rest
    // shaped below.
    let prune = std::sync::Arc::clone(&shaper);
    let prune: std::sync::Arc<yaml::Prune> =
        std::sync::Arc::new(move |a: &str, k: &str, f: &str| prune.drops(a, k, f));
    yaml::for_each_in_tree_pruned(
        &args.objects,
        args.recursive,
        Some(prune),
        |path, index, mut value| {
            if refused.is_some() {
                return;
            }
            match output::vet_claim(&mut value) {
                Provenance::Foreign => {
                    let rule = value["metadata"]["annotations"][output::rule_annotation()].as_str();
                    let text =
                        output::foreign_claim_message(&output::describe_object(&value), rule);
                    claims
                        .warnings
                        .push(format!("warning: {}#{index}: {text}", path.display()));
                }
                Provenance::Unknown => {
                    if let Some(key) = output::out_key(&value) {
                        claims.unverified.insert(key);
                    }
                }
                Provenance::Proven | Provenance::Unclaimed => {}
            }
            if let Err(message) = store.insert(shaper.shape(value)) {
                refused = Some(RenderError::Object {
                    origin: format!("{}#{index}", path.display()),
                    message,
                });
            }
        },
    )?;
    match refused {
        Some(e) => Err(e),
        None => Ok((store, claims)),
    }
}

/// The RBAC objects of `--objects`, whole (the store keeps only what rules
/// read): what `--as` reads the author's permissions from.
fn rbac_objects(args: &RenderArgs) -> Result<Vec<Value>, RenderError> {
    let mut out = Vec::new();
    yaml::for_each_in_tree(&args.objects, args.recursive, |_, _, value| {
        if value["kind"]
            .as_str()
            .is_some_and(|k| crate::delegation::RBAC_KINDS.contains(&k))
        {
            out.push(value);
        }
    })?;
    Ok(out)
}

/// `Kind name` or `Kind namespace/name`.
fn show_key(kind: &OutputKind, ns: &str, name: &str) -> String {
    if ns.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {ns}/{name}")
    }
}

/// The live objects policy would revoke that the input cannot show are
/// ours: warnings. Someone else may have labelled them (the controller then
/// leaves them alone), so they never fail a render.
fn unverified_revocations(eval: &Evaluation, claims: &Claims) -> Vec<String> {
    eval.revoked
        .iter()
        .filter(|(key, _)| claims.unverified.contains(*key))
        .map(|((kind, ns, name), why)| {
            let text = crate::engine::output::unverified_claim_message(&format!(
                "live {}",
                show_key(kind, ns, name)
            ));
            format!(
                "warning: {text}: if rbac-rules made it, the controller revokes it ({why}); if not, it leaves it alone"
            )
        })
        .collect()
}

/// Every error, each naming the file its rule came from, then rule and
/// field; and every live object in the input that policy would revoke
/// (the controller would delete it) and no error already names, when the
/// input shows rbac-rules made it (see [`Claims::unverified`]).
fn errors_of(eval: &Evaluation, origins: &Origins, claims: &Claims) -> Vec<String> {
    let mut errors: Vec<String> = eval
        .errors()
        .map(|e| with_origin("error", origins, &e.rule, e))
        .collect();
    let refused_outputs: BTreeSet<&str> = eval
        .errors()
        .filter(|e| {
            matches!(
                e.kind,
                crate::engine::ErrorKind::EscalationDenied | crate::engine::ErrorKind::OverCeiling
            )
        })
        .map(|e| e.message.as_str())
        .collect();
    for ((kind, ns, name), why) in &eval.revoked {
        if refused_outputs.contains(why.as_str()) {
            continue;
        }
        if claims
            .unverified
            .contains(&(*kind, ns.to_string(), name.to_string()))
        {
            continue;
        }
        let obj = show_key(kind, ns, name);
        errors.push(format!("error: revoked: live {obj}: {why}"));
    }
    errors
}

/// What rules skipped on purpose, then the notices (an unmanaged role
/// labelled into an emitted aggregated role): no error, but said.
fn warnings_of(eval: &Evaluation, origins: &Origins) -> Vec<String> {
    eval.warnings()
        .map(|w| with_origin("warning", origins, &w.rule, w))
        .chain(
            eval.notices()
                .map(|n| with_origin("warning", origins, &n.rule, n)),
        )
        .collect()
}

/// `level: <file>: message`, or `level: message` for a rule of no file.
fn with_origin(
    level: &str,
    origins: &Origins,
    rule: &str,
    message: impl std::fmt::Display,
) -> String {
    match origins.get(rule) {
        Some(origin) => format!("{level}: {origin}: {message}"),
        None => format!("{level}: {message}"),
    }
}

/// Aggregated ClusterRoles among the outputs, with their rules filled from
/// every ClusterRole in the input and the output, by name.
fn flatten(store: &ObjectStore, eval: &Evaluation) -> Result<HashMap<String, Value>, RenderError> {
    let gk = crate::engine::GroupKind::new("rbac.authorization.k8s.io", "ClusterRole");
    let outputs: Vec<Value> = eval
        .desired
        .iter()
        .filter(|d| d.kind == OutputKind::ClusterRole)
        .map(|d| d.object.to_value())
        .collect();
    let mut all: Vec<ClusterRole> = Vec::new();
    let mut names = BTreeSet::new();
    for o in &outputs {
        names.insert(o["metadata"]["name"].as_str().unwrap_or_default());
        all.push(parse_cluster_role(o)?);
    }
    for o in store.list(&gk) {
        if !names.contains(o["metadata"]["name"].as_str().unwrap_or_default()) {
            all.push(parse_cluster_role(o)?);
        }
    }
    let aggregated = crate::policy::aggregate(&all)
        .map_err(|e| RenderError::Evaluation(vec![format!("error: {e}")]))?;
    let mut filled = HashMap::new();
    for o in outputs
        .into_iter()
        .filter(|o| o.get("aggregationRule").is_some())
    {
        let name = o["metadata"]["name"].as_str().unwrap_or_default();
        if let Some(r) = aggregated
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))
        {
            let rules =
                serde_json::to_value(r.rules.clone().unwrap_or_default()).unwrap_or(Value::Null);
            let mut o = o.clone();
            if let Some(m) = o.as_object_mut() {
                m.insert("rules".to_string(), rules);
            }
            filled.insert(name.to_string(), o);
        }
    }
    Ok(filled)
}

fn parse_cluster_role(o: &Value) -> Result<ClusterRole, RenderError> {
    serde_json::from_value(o.clone()).map_err(|e| RenderError::Object {
        origin: object_ref(o),
        message: format!("not a valid ClusterRole: {e}"),
    })
}

/// The `render` command: prints, or reports errors and fails.
pub fn main(args: &RenderArgs) -> ExitCode {
    match prepare(args) {
        Ok(rendered) => {
            for w in &rendered.warnings {
                eprintln!("{w}");
            }
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let written = match args.output {
                DataFormat::Yaml => rendered.write_to(&mut out),
                DataFormat::Json => rendered.write_json(&mut out),
            }
            .and_then(|()| out.flush().map_err(|e| YamlError::Write(e.to_string())));
            // The process ends here: freeing thousands of objects one by
            // one would only delay the exit.
            std::mem::forget(rendered);
            match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The library path (`render`, through `render_to`) prints what the
    /// command prints: here a golden case with flattened roles.
    #[test]
    fn render_in_process_matches_the_golden_output() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let case = root.join("tests/golden/examples-any-crd-flatten");
        let args = RenderArgs {
            objects: vec![case.join("objects.yaml")],
            rules: vec![case.join("rules.yaml"), root.join("rules/examples/any-crd")],
            flatten: true,
            ..RenderArgs::default()
        };
        let expected = std::fs::read_to_string(case.join("expected.yaml")).expect("golden file");
        assert_eq!(render(&args).expect("renders"), expected);
    }
}
