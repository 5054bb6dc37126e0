//! `rbac-rules validate`: an offline lint of rule files.
//!
//! Beyond what loading a rule checks (its shape, every template, expression,
//! regex and selector, via the engine's compile), it finds what would only
//! show as "renders nothing" in a cluster: unknown helpers and wrong helper
//! arities, unknown verbs, `trigger.` field paths the trigger kind's schema
//! does not have (built-in kinds from k8s-openapi, CRDs from `--objects`),
//! and label values that can render too long.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;

use handlebars::template::{HelperTemplate, Parameter, Template, TemplateElement};
use serde::Serialize;
use serde_json::{Value, json};

use crate::engine::template::Templates;
use crate::rules;
use crate::yaml::{self, Document, YamlError};

/// The RbacRule annotation that declares custom verbs (comma-separated):
/// a literal verb that [`crate::policy::is_known_verb`] does not know is an error unless
/// listed here, so a typo such as `gett` is caught.
pub const CUSTOM_VERBS_ANNOTATION: &str = "rbacrules.io/custom-verbs";

/// Label values: at most 63 characters.
const LABEL_LIMIT: usize = 63;

/// Output format of `validate`: findings are diagnostics (stderr) unless
/// asked for as data (stdout).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One line per finding, on stderr, as `render` reports errors.
    #[default]
    Human,
    /// A JSON array of findings, on stdout.
    Json,
    /// A YAML list of findings, on stdout.
    Yaml,
}

/// Arguments of `validate`.
#[derive(clap::Args, Clone, Debug)]
#[command(after_help = "Examples:
  rbac-rules validate --rules rules/examples/any-crd
  rbac-rules validate --rules my-rules/ --objects crds.yaml --strict
  cat rule.yaml | rbac-rules validate --rules - -o json

Exit status: 0 no errors (warnings allowed unless --strict), 1 errors found.")]
pub struct ValidateArgs {
    /// Rule files or directories (`-`: standard input). Default: the
    /// built-in rules, with a note on stderr.
    #[arg(long, num_args = 1..)]
    pub rules: Vec<PathBuf>,
    /// YAML files or directories with objects; the CustomResourceDefinitions
    /// among them give the schemas of custom trigger and related kinds.
    #[arg(long, num_args = 1..)]
    pub objects: Vec<PathBuf>,
    /// Read directories recursively (like kubectl's -R).
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// Treat warnings as errors.
    #[arg(long)]
    pub strict: bool,
    /// Output format: human (stderr), json or yaml (stdout).
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Human)]
    pub output: Format,
}

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The rule is wrong.
    Error,
    /// The rule may be wrong.
    Warning,
}

/// One problem found in a rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Error or warning.
    pub severity: Severity,
    /// `file#document`.
    pub origin: String,
    /// The rule's name (empty when it has none).
    pub rule: String,
    /// Field of the rule, as written in the YAML (`spec.outputs[0].name`).
    pub field: String,
    /// What is wrong, and the fix where obvious.
    pub message: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{sev}: {}", self.origin)?;
        if !self.rule.is_empty() {
            write!(f, ": RbacRule {:?}", self.rule)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Lints the rules of `args`. A file that cannot be read or parsed is a
/// finding like any other: the other files are still linted.
pub fn validate(args: &ValidateArgs) -> Result<Vec<Finding>, YamlError> {
    Ok(validate_noted(args).0)
}

/// [`validate`], with the notes (built-in rules used, documents skipped)
/// a user sees on stderr.
pub fn validate_noted(args: &ValidateArgs) -> (Vec<Finding>, Vec<String>) {
    let mut findings = Vec::new();
    let mut notes = Vec::new();
    let docs: Vec<Document> = if args.rules.is_empty() {
        notes.push(rules::builtin_note("validate"));
        let mut docs = Vec::new();
        for (file, text) in rules::BUILTIN {
            match yaml::parse_documents(std::path::Path::new(file), text) {
                Ok(d) => docs.extend(d),
                Err(e) => findings.push(load_finding(file, &e)),
            }
        }
        docs
    } else {
        read_documents(&args.rules, args.recursive, true, &mut findings, &mut notes)
    };
    let objects = read_documents(
        &args.objects,
        args.recursive,
        false,
        &mut findings,
        &mut notes,
    );
    let schemas = Schemas::new(&objects);
    // Rule tests (`rbac-rules test`) are not rules.
    let docs: Vec<Document> = docs
        .into_iter()
        .filter(|d| !rules::is_rule_test(d))
        .collect();
    for doc in &docs {
        lint_document(doc, &schemas, &mut findings);
    }
    for e in rules::duplicates(&docs) {
        if let rules::LoadError::Invalid {
            origin,
            rule,
            field,
            message,
        } = e
        {
            findings.push(Finding {
                severity: Severity::Error,
                origin,
                rule: rule
                    .trim_start_matches("RbacRule ")
                    .trim_matches('"')
                    .to_string(),
                field: field.trim_start_matches(": ").to_string(),
                message,
            });
        }
    }
    findings.sort_by(|a, b| {
        (&a.origin, &a.field, a.severity, &a.message)
            .cmp(&(&b.origin, &b.field, b.severity, &b.message))
    });
    findings.dedup();
    (findings, notes)
}

/// The documents under `paths`, file by file: an unreadable file or
/// invalid YAML becomes an error finding. With `rules`, documents of other
/// kinds found in a directory are skipped with a note.
fn read_documents(
    paths: &[PathBuf],
    recursive: bool,
    rules: bool,
    findings: &mut Vec<Finding>,
    notes: &mut Vec<String>,
) -> Vec<Document> {
    let mut out = Vec::new();
    for p in paths {
        let in_dir = p.is_dir();
        let files = match yaml::expand_paths(std::slice::from_ref(p), recursive) {
            Ok(f) => f,
            Err(e) => {
                findings.push(load_finding(&p.display().to_string(), &e));
                continue;
            }
        };
        for f in files {
            let docs = match yaml::read_text(&f).and_then(|t| yaml::parse_documents(&f, &t)) {
                Ok(d) => d,
                Err(e) => {
                    findings.push(load_finding(&f.display().to_string(), &e));
                    continue;
                }
            };
            for d in docs {
                if rules && in_dir && !rules::is_ours(&d.value) {
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
                out.push(d);
            }
        }
    }
    out
}

/// A file that cannot be read or parsed, as a finding.
fn load_finding(origin: &str, e: &YamlError) -> Finding {
    let text = e.to_string();
    let message = text
        .strip_prefix(&format!("{origin}: "))
        .unwrap_or(&text)
        .to_string();
    Finding {
        severity: Severity::Error,
        origin: origin.to_string(),
        rule: String::new(),
        field: String::new(),
        message,
    }
}

/// The `validate` command: findings (on stderr, or as data on stdout with
/// `-o json|yaml`), a summary on stderr; exit 1 on errors (or warnings
/// under `--strict`).
pub fn main(args: &ValidateArgs) -> ExitCode {
    let (findings, notes) = validate_noted(args);
    for n in &notes {
        eprintln!("{n}");
    }
    let errors = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count();
    let warnings = findings.len() - errors;
    let data = match args.output {
        Format::Human => {
            for f in &findings {
                eprintln!("{f}");
            }
            Ok(None)
        }
        Format::Json => serde_json::to_string_pretty(&findings)
            .map(|t| Some(t + "\n"))
            .map_err(|e| e.to_string()),
        Format::Yaml => yaml::to_yaml(&findings)
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
    eprintln!("{errors} error(s), {warnings} warning(s)");
    if errors > 0 || (args.strict && warnings > 0) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Lints one RbacRule document: each check below in turn.
fn lint_document(doc: &Document, schemas: &Schemas, out: &mut Vec<Finding>) {
    let name = doc.value["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut push = |severity: Severity, field: &str, message: String| {
        out.push(Finding {
            severity,
            origin: doc.origin(),
            rule: name.clone(),
            field: field.to_string(),
            message,
        })
    };
    if !lint_loads(doc, &mut push) {
        return;
    }
    let spec = &doc.value["spec"];
    let trigger = TriggerKind::of(spec, schemas, &mut push);
    lint_unseen_condition_paths(spec, &trigger, &mut push);
    if let Some(schema) = &trigger.schema {
        lint_trigger_condition_paths(spec, &trigger, schema, &mut push);
        lint_list_field_paths(spec, &trigger, schema, &mut push);
    }
    let related = related_schemas(spec, schemas, &mut push);
    lint_binding_kinds(spec, &mut push);
    let mut strings = Vec::new();
    collect_strings(spec, "spec", false, &mut strings);
    for s in &strings {
        lint_text(s, &trigger, &related, &mut push);
    }
    lint_verbs(doc, spec, &mut push);
    lint_weak_lineage(spec, &mut push);
}

/// `ownedBy` believes any ownerReference, and controllers add
/// non-controller ones to objects they did not make (a package manager
/// may, for every existing object an inactive package names): a warning,
/// pointing at the proof no later writer can forge.
fn lint_weak_lineage(spec: &Value, push: &mut impl FnMut(Severity, &str, String)) {
    let related = spec["related"].as_array().into_iter().flatten();
    for (i, r) in related.enumerate() {
        let owned_by = &r["objects"]["ownedBy"];
        if owned_by.as_array().is_some_and(|a| !a.is_empty()) {
            push(
                Severity::Warning,
                &format!("spec.related[{i}].objects.ownedBy"),
                "ownedBy believes non-controller ownerReferences, which others can add to \
                 objects they did not make; prove lineage with controlledBy and notOlderThan"
                    .to_string(),
            );
        }
    }
}

/// Whether the document loads as a rule (else its errors are reported and
/// nothing more is checked); the engine's compile errors are reported too.
fn lint_loads(doc: &Document, push: &mut impl FnMut(Severity, &str, String)) -> bool {
    let source = match rules::parse_rule_all(doc) {
        Ok(s) => s,
        Err(errs) => {
            for e in errs {
                match &e {
                    rules::LoadError::Invalid { field, message, .. } => push(
                        Severity::Error,
                        field.trim_start_matches(": "),
                        message.clone(),
                    ),
                    other => push(Severity::Error, "", other.to_string()),
                }
            }
            return false;
        }
    };
    let mut templates = Templates::new();
    // A NamespacedRbacRule is checked as it runs: confined to its
    // namespace (with the default settings: no cluster-scoped kind
    // readable).
    let confined = crate::engine::tenant::confine(
        &source.name,
        source.namespace.as_deref(),
        &source.spec,
        &crate::engine::tenant::Tenancy::default(),
    );
    let compiled = confined.and_then(|spec| {
        crate::engine::compile::compile(&source.name, &spec, &mut templates).map(|_| ())
    });
    if let Err(errs) = compiled {
        for e in errs {
            push(Severity::Error, &e.field, e.message);
        }
    }
    true
}

/// The trigger's kind, and its schema when known: what paths of the
/// trigger are checked against.
struct TriggerKind<'a> {
    group: &'a str,
    kind: &'a str,
    schema: Option<Value>,
    /// Rules see its apiVersion, kind and metadata only.
    metadata_only: bool,
    /// Rules see only these paths of it (`fields`, with apiVersion, kind
    /// and metadata).
    fields: Option<Vec<Vec<String>>>,
}

impl<'a> TriggerKind<'a> {
    /// The trigger of `spec`; an unknown kind is warned about.
    fn of(
        spec: &'a Value,
        schemas: &Schemas,
        push: &mut impl FnMut(Severity, &str, String),
    ) -> TriggerKind<'a> {
        let trigger = &spec["trigger"];
        let kind = trigger["kind"].as_str().unwrap_or_default();
        let group = trigger["apiGroup"].as_str().unwrap_or_default();
        let schema = if kind.is_empty() {
            None
        } else {
            let version = trigger["version"].as_str().unwrap_or_default();
            let s = schemas.get(group, kind, version);
            if s.is_none() {
                let hint = schemas.did_you_mean(group, kind);
                push(
                    Severity::Warning,
                    "spec.trigger.kind",
                    format!(
                        "unknown trigger kind {}{hint}: not built in, and no \
                         CustomResourceDefinition in --objects defines it; its fields are not \
                         checked (a typo here matches nothing)",
                        kind_ref(group, kind)
                    ),
                );
            }
            s
        };
        TriggerKind {
            group,
            kind,
            schema,
            metadata_only: trigger["metadataOnly"] == true,
            fields: trigger["fields"]
                .as_array()
                .filter(|f| !f.is_empty())
                .map(|f| {
                    let named: Vec<String> = f
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect();
                    crate::engine::path::seen_fields(&named)
                }),
        }
    }
}

/// A metadata-only trigger, or one with `fields`, shows conditions only
/// what it sees: a path elsewhere reads nothing.
fn lint_unseen_condition_paths(
    spec: &Value,
    kind: &TriggerKind,
    push: &mut impl FnMut(Severity, &str, String),
) {
    let trigger = &spec["trigger"];
    for list in ["conditions", "require"] {
        for (i, c) in trigger[list].as_array().into_iter().flatten().enumerate() {
            if let Some(text) = c["path"].as_str()
                && let Some(msg) = unseen(kind, text, &["path ", text].concat())
            {
                push(
                    Severity::Warning,
                    &format!("spec.trigger.{list}[{i}].path"),
                    msg,
                );
            }
        }
    }
}

/// The trigger's condition paths, against its schema.
fn lint_trigger_condition_paths(
    spec: &Value,
    trigger: &TriggerKind,
    schema: &Value,
    push: &mut impl FnMut(Severity, &str, String),
) {
    for list in ["conditions", "require"] {
        let conditions = spec["trigger"][list].as_array().into_iter().flatten();
        for (i, c) in conditions.enumerate() {
            if let Some(msg) = check_condition_path(schema, trigger.group, trigger.kind, c) {
                push(
                    Severity::Warning,
                    &format!("spec.trigger.{list}[{i}].path"),
                    msg,
                );
            }
        }
    }
}

/// A list field read from the trigger, against its schema.
fn lint_list_field_paths(
    spec: &Value,
    trigger: &TriggerKind,
    schema: &Value,
    push: &mut impl FnMut(Severity, &str, String),
) {
    for (i, r) in spec["related"].as_array().into_iter().flatten().enumerate() {
        let lf = &r["listField"];
        let of: Vec<&str> = lf["of"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if let Some(text) = lf["path"].as_str()
            && (of.is_empty() || of.contains(&"trigger"))
            && let Some(msg) = check_condition_path(
                schema,
                trigger.group,
                trigger.kind,
                &json!({ "path": text }),
            )
        {
            push(
                Severity::Warning,
                &format!("spec.related[{i}].listField.path"),
                msg.replace("the condition can never hold", "the list is always empty"),
            );
        }
    }
}

/// The schemas of related sets of objects (group, kind, schema) by index,
/// their `where`/`require` paths checked against them; an unknown kind is
/// warned about.
fn related_schemas(
    spec: &Value,
    schemas: &Schemas,
    push: &mut impl FnMut(Severity, &str, String),
) -> BTreeMap<usize, (String, String, Value)> {
    let mut related = BTreeMap::new();
    for (i, r) in spec["related"].as_array().into_iter().flatten().enumerate() {
        let q = &r["objects"];
        let (Some(kind), group) = (
            q["kind"].as_str(),
            q["apiGroup"].as_str().unwrap_or_default(),
        ) else {
            continue;
        };
        let Some(rs) = schemas.get(group, kind, q["version"].as_str().unwrap_or_default()) else {
            if !Templates::is_literal(kind) || kind.is_empty() {
                continue;
            }
            let hint = schemas.did_you_mean(group, kind);
            push(
                Severity::Warning,
                &format!("spec.related[{i}].objects.kind"),
                format!(
                    "unknown kind {}{hint}: not built in, and no CustomResourceDefinition in \
                     --objects defines it; its fields are not checked",
                    kind_ref(group, kind)
                ),
            );
            continue;
        };
        for list in ["where", "require"] {
            for (j, c) in r[list].as_array().into_iter().flatten().enumerate() {
                if let Some(msg) = check_condition_path(&rs, group, kind, c) {
                    push(
                        Severity::Warning,
                        &format!("spec.related[{i}].{list}[{j}].path"),
                        msg,
                    );
                }
            }
        }
        related.insert(i, (group.to_string(), kind.to_string(), rs));
    }
    related
}

/// One template or expression: its helper calls, the trigger paths it
/// reads (metadata-only, schema), `item` paths in a related set's
/// conditions, and a label value's length.
fn lint_text(
    s: &Source,
    trigger: &TriggerKind,
    related: &BTreeMap<usize, (String, String, Value)>,
    push: &mut impl FnMut(Severity, &str, String),
) {
    let parsed = match analyze(&s.text, s.expr) {
        Ok(p) => p,
        // The engine's compile reported it.
        Err(_) => return,
    };
    for (helper, argc) in &parsed.calls {
        if let Some(msg) = probe_helper(helper, *argc) {
            push(Severity::Error, &s.field, msg);
        }
    }
    for (raw, segs) in &parsed.paths {
        if segs.first().map(String::as_str) == Some("trigger")
            && segs.len() > 1
            && let Some(msg) = unseen(trigger, &segs[1..].join("."), raw)
        {
            push(Severity::Warning, &s.field, msg);
        }
    }
    if let Some(schema) = &trigger.schema {
        for (raw, segs) in &parsed.paths {
            if let Some(msg) = check_trigger_path(schema, trigger.group, trigger.kind, raw, segs) {
                push(Severity::Error, &s.field, msg);
            }
        }
    }
    if let Some((group, kind, rs)) = related_index(&s.field)
        .filter(|_| s.field.contains(".where[") || s.field.contains(".require["))
        .and_then(|i| related.get(&i))
    {
        lint_item_paths(&s.field, &parsed, group, kind, rs, push);
    }
    if s.limited
        && let Some(msg) = length_risk(&s.text, &parsed, trigger.kind)
    {
        push(Severity::Warning, &s.field, msg);
    }
}

/// The `item` paths a related set's condition reads, against the schema
/// of its kind.
fn lint_item_paths(
    field: &str,
    parsed: &Parsed,
    group: &str,
    kind: &str,
    schema: &Value,
    push: &mut impl FnMut(Severity, &str, String),
) {
    for (raw, segs) in &parsed.paths {
        if segs.first().map(String::as_str) != Some("item") {
            continue;
        }
        if let Some((missing, fix)) = missing_field(schema, &segs[1..]) {
            let hint = fix
                .map(|f| format!(" (did you mean item.{f}?)"))
                .unwrap_or_default();
            push(
                Severity::Warning,
                field,
                format!(
                    "{raw}: {} has no field {missing}{hint}",
                    kind_ref(group, kind)
                ),
            );
        }
    }
}

/// Verbs: known to Kubernetes, or custom ones the rule's annotation lists.
fn lint_verbs(doc: &Document, spec: &Value, push: &mut impl FnMut(Severity, &str, String)) {
    let custom: BTreeSet<String> = doc.value["metadata"]["annotations"][CUSTOM_VERBS_ANNOTATION]
        .as_str()
        .unwrap_or_default()
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    for (field, verb) in verbs(spec) {
        if !crate::policy::is_known_verb(&verb) && !custom.contains(&verb) {
            let hint = suggest(&verb, crate::policy::known_verbs())
                .map(|s| format!(" (did you mean {s:?}?)"))
                .unwrap_or_default();
            push(
                Severity::Error,
                &field,
                format!(
                    "unknown verb {verb:?}{hint}; a custom verb must be listed in the rule's \
                     annotation {CUSTOM_VERBS_ANNOTATION}"
                ),
            );
        }
    }
}

fn kind_ref(group: &str, kind: &str) -> String {
    if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    }
}

/// A string of the spec that is a template or an expression.
struct Source {
    field: String,
    text: String,
    expr: bool,
    /// A label value: at most 63 characters.
    limited: bool,
}

/// Every template and expression under `v`, with its field path.
fn collect_strings(v: &Value, field: &str, in_vars: bool, out: &mut Vec<Source>) {
    match v {
        Value::String(s) => {
            let key = field.rsplit('.').next().unwrap_or_default();
            let expr =
                matches!(key, "forEach" | "when") || (in_vars && key == "value" && !s.is_empty());
            if expr || !Templates::is_literal(s) {
                // Label values of outputs (selectors match, they emit nothing).
                let limited = field.starts_with("spec.outputs[")
                    && field.contains(".labels.")
                    && !field.contains(".selector")
                    && !field.contains("Selector");
                out.push(Source {
                    field: field.to_string(),
                    text: s.clone(),
                    expr,
                    limited,
                });
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                collect_strings(item, &format!("{field}[{i}]"), in_vars, out);
            }
        }
        Value::Object(m) => {
            for (k, item) in m {
                let in_vars = in_vars || (field == "spec" && k == "vars");
                collect_strings(item, &format!("{field}.{k}"), in_vars, out);
            }
        }
        _ => {}
    }
}

/// Literal verbs of the outputs' policy rules, with their field paths.
fn verbs(spec: &Value) -> Vec<(String, String)> {
    fn walk(v: &Value, field: &str, in_verbs: bool, out: &mut Vec<(String, String)>) {
        match v {
            Value::String(s) if in_verbs && Templates::is_literal(s) => {
                out.push((field.to_string(), s.clone()))
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{field}[{i}]"), in_verbs, out);
                }
            }
            Value::Object(m) => {
                for (k, item) in m {
                    // Inside verbs only a directive's item(s) are verbs.
                    let next = if in_verbs {
                        matches!(k.as_str(), "item" | "items")
                    } else {
                        k == "verbs"
                    };
                    walk(item, &format!("{field}.{k}"), next, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&spec["outputs"], "spec.outputs", false, &mut out);
    out
}

/// What a template or expression uses.
#[derive(Default)]
struct Parsed {
    /// Helper calls: name and number of arguments.
    calls: Vec<(String, usize)>,
    /// Paths read from the root of the context (the engine's own answer,
    /// [`crate::engine::template::reads_of`]): as written, and their
    /// segments.
    paths: Vec<(String, Vec<String>)>,
    /// `shorten`/`hash` bounds: the largest literal length argument seen.
    bounded: bool,
}

/// Parses a template (or an expression) and lists what it uses.
fn analyze(text: &str, expr: bool) -> Result<Parsed, String> {
    let src = if expr {
        format!("{{{{{text}}}}}")
    } else {
        text.to_string()
    };
    let t = Template::compile(&src).map_err(|e| e.to_string())?;
    let mut p = Parsed::default();
    walk_template(&t, &mut p);
    p.paths = root_paths(text, expr);
    Ok(p)
}

/// The paths a template (or an expression) reads from the root, as written
/// and by segments.
fn root_paths(text: &str, expr: bool) -> Vec<(String, Vec<String>)> {
    crate::engine::template::reads_of(text, expr)
        .into_iter()
        .flat_map(|r| r.paths)
        .map(|p| (p.raw, p.segments.iter().map(segment_text).collect()))
        .collect()
}

/// Gathers the helper calls of a template.
fn walk_template(t: &Template, p: &mut Parsed) {
    for e in &t.elements {
        match e {
            TemplateElement::Expression(h) | TemplateElement::HtmlExpression(h) => {
                walk_helper(h, p)
            }
            TemplateElement::HelperBlock(h) => {
                p.calls.push((param_name(&h.name), h.params.len()));
                for a in &h.params {
                    walk_param(a, p);
                }
                for t in h.template.iter().chain(h.inverse.iter()) {
                    walk_template(t, p);
                }
            }
            _ => {}
        }
    }
}

fn param_name(p: &Parameter) -> String {
    match p {
        Parameter::Name(n) => n.clone(),
        Parameter::Path(handlebars::Path::Relative((_, raw))) => raw.clone(),
        _ => String::new(),
    }
}

fn walk_helper(h: &HelperTemplate, p: &mut Parsed) {
    if h.params.is_empty() && h.hash.is_empty() {
        // `{{a.b}}`: a path, not a call.
        return;
    }
    let name = param_name(&h.name);
    if matches!(name.as_str(), "shorten" | "hash") {
        p.bounded = true;
    }
    p.calls.push((name, h.params.len()));
    for a in h.params.iter().chain(h.hash.values()) {
        walk_param(a, p);
    }
}

fn walk_param(a: &Parameter, p: &mut Parsed) {
    if let Parameter::Subexpression(s) = a
        && let TemplateElement::Expression(h) = s.as_element()
    {
        walk_helper(h, p);
    }
}

/// Calls a helper with `argc` null arguments: an unknown helper or a wrong
/// number of arguments shows; other complaints (types) need real values.
fn probe_helper(name: &str, argc: usize) -> Option<String> {
    if name.is_empty() {
        return None;
    }
    let mut t = Templates::new();
    let args = vec!["null"; argc].join(" ");
    let text = format!("{{{{#if true}}}}{{{{{name} {args}}}}}{{{{/if}}}}");
    t.compile(&text).ok()?;
    let ctx = handlebars::Context::wraps(json!({})).ok()?;
    let err = t.render(&text, &ctx).err()?;
    if err.contains("unknown helper") {
        let hint = suggest(name, crate::engine::template::helper_names())
            .map(|s| format!(" (did you mean {s:?}?)"))
            .unwrap_or_default();
        return Some(format!(
            "unknown helper {name:?}{hint}; docs/rules.md lists the helpers"
        ));
    }
    if err.contains("argument(s), got") || err.contains("arguments, got") {
        let detail = err.rsplit(": ").next().unwrap_or(&err);
        return Some(format!("helper {name}: {detail}"));
    }
    None
}

/// The closest of `candidates` to `word`, when close enough to be a typo.
fn suggest<'a>(word: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(2);
    candidates
        .map(|c| (strsim::levenshtein(word, c), c))
        .filter(|(d, c)| *d <= limit && *d > 0 && !c.is_empty())
        .min()
        .map(|(_, c)| c)
}

/// A template that can render a label value over 63
/// characters: one that reads something unbounded without `shorten`/`hash`.
fn length_risk(text: &str, p: &Parsed, trigger_kind: &str) -> Option<String> {
    if p.bounded {
        return None;
    }
    let mut max = 0usize;
    let literal = Template::compile(text).ok()?;
    for e in &literal.elements {
        match e {
            TemplateElement::RawString(s) => max += s.chars().count(),
            TemplateElement::Expression(h) | TemplateElement::HtmlExpression(h) => {
                let path = if h.params.is_empty() {
                    param_name(&h.name)
                } else {
                    String::new()
                };
                max += match path.as_str() {
                    "trigger.metadata.namespace" => LABEL_LIMIT,
                    "trigger.metadata.name" if trigger_kind == "Namespace" => LABEL_LIMIT,
                    "trigger.metadata.name" => 253,
                    "rule.name" => 253,
                    _ => return Some(unbounded_message(text)),
                };
            }
            _ => return Some(unbounded_message(text)),
        }
    }
    (max > LABEL_LIMIT).then(|| {
        format!(
            "{text:?} can render {max} characters, more than the {LABEL_LIMIT} Kubernetes allows \
             here; wrap what it reads in shorten (e.g. {{{{shorten trigger.metadata.name 40}}}})"
        )
    })
}

fn unbounded_message(text: &str) -> String {
    format!(
        "{text:?} reads a value of unbounded length and can render more than the {LABEL_LIMIT} \
         characters Kubernetes allows here; wrap it in shorten or hash"
    )
}

/// A CRD version: name, whether it is the storage version, its schema.
type CrdVersion = (String, bool, Value);

/// Schemas of trigger kinds: built-in ones and CRDs from `--objects`.
struct Schemas {
    /// (group, kind) → every version of the CRD seen.
    crds: BTreeMap<(String, String), Vec<CrdVersion>>,
    /// (group, kind) → the CRD's plural and singular names.
    names: BTreeMap<(String, String), Vec<String>>,
}

/// The built-in kinds whose schemas [`builtin_schema`] knows.
const BUILTIN_KINDS: &[(&str, &str)] = &[
    ("", "Namespace"),
    ("", "ConfigMap"),
    ("", "Secret"),
    ("", "ServiceAccount"),
    ("", "Service"),
    ("", "Pod"),
    ("", "Node"),
    ("apps", "Deployment"),
    ("apps", "StatefulSet"),
    ("apps", "DaemonSet"),
    ("apps", "ReplicaSet"),
    ("batch", "Job"),
    ("batch", "CronJob"),
    ("rbac.authorization.k8s.io", "ClusterRole"),
    ("rbac.authorization.k8s.io", "Role"),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io", "RoleBinding"),
    ("apiextensions.k8s.io", "CustomResourceDefinition"),
];

impl Schemas {
    fn new(objects: &[Document]) -> Self {
        let mut crds: BTreeMap<(String, String), Vec<CrdVersion>> = BTreeMap::new();
        let mut names: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for d in objects {
            let o = &d.value;
            if o["kind"] != "CustomResourceDefinition" {
                continue;
            }
            let group = o["spec"]["group"].as_str().unwrap_or_default().to_string();
            let kind = o["spec"]["names"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            names
                .entry((group.clone(), kind.clone()))
                .or_default()
                .extend(
                    ["plural", "singular"]
                        .iter()
                        .filter_map(|n| o["spec"]["names"][n].as_str())
                        .map(str::to_string),
                );
            for v in o["spec"]["versions"].as_array().into_iter().flatten() {
                let schema = v["schema"]["openAPIV3Schema"].clone();
                crds.entry((group.clone(), kind.clone()))
                    .or_default()
                    .push((
                        v["name"].as_str().unwrap_or_default().to_string(),
                        v["storage"].as_bool().unwrap_or(false),
                        schema,
                    ));
            }
        }
        Schemas { crds, names }
    }

    /// ` (did you mean …?)` naming the known kind closest to `kind`, or
    /// nothing: the tail of an unknown-kind warning.
    fn did_you_mean(&self, group: &str, kind: &str) -> String {
        self.suggest_kind(group, kind)
            .map(|h| format!(" (did you mean {h}?)"))
            .unwrap_or_default()
    }

    /// The known kind closest to `kind` (a typo, the wrong case, a plural,
    /// the right kind in another group), as the fields to write.
    fn suggest_kind(&self, group: &str, kind: &str) -> Option<String> {
        let mut known: Vec<(String, String)> = BUILTIN_KINDS
            .iter()
            .map(|(g, k)| (g.to_string(), k.to_string()))
            .collect();
        known.extend(self.crds.keys().cloned());
        let show = |g: &str, k: &str| {
            if g.is_empty() {
                format!("kind {k} (core group)")
            } else {
                format!("kind {k}, apiGroup {g}")
            }
        };
        // The kind exists, in another group (or in another case).
        if let Some((g, k)) = known
            .iter()
            .find(|(g, k)| k.eq_ignore_ascii_case(kind) && (g != group || k != kind))
        {
            return Some(show(g, k));
        }
        // A plural or singular resource name of a CRD.
        for ((g, k), names) in &self.names {
            if names.iter().any(|n| n.eq_ignore_ascii_case(kind)) {
                return Some(show(g, k));
            }
        }
        let in_group: Vec<&str> = known
            .iter()
            .filter(|(g, _)| g == group)
            .map(|(_, k)| k.as_str())
            .collect();
        if let Some(k) = suggest(kind, in_group.iter().copied()) {
            return Some(show(group, k));
        }
        // A built-in kind with the group left out or wrong (a custom
        // group's unknown kind is not likened to a built-in one).
        let builtin_group = !group.contains('.') || group.ends_with(".k8s.io");
        if !builtin_group {
            return None;
        }
        suggest(kind, BUILTIN_KINDS.iter().map(|(_, k)| *k)).and_then(|k| {
            BUILTIN_KINDS
                .iter()
                .find(|(_, kk)| *kk == k)
                .map(|(g, k)| show(g, k))
        })
    }

    /// The schema of a kind (root holding `$defs` for references), CRDs
    /// first: a CRD in `--objects` describes the cluster at hand.
    fn get(&self, group: &str, kind: &str, version: &str) -> Option<Value> {
        if let Some(versions) = self.crds.get(&(group.to_string(), kind.to_string())) {
            let pick = versions
                .iter()
                .find(|(v, _, _)| v == version)
                .or_else(|| versions.iter().find(|(_, storage, _)| *storage))
                .or_else(|| versions.first());
            return pick.map(|(_, _, s)| s.clone());
        }
        builtin_schema(group, kind)
    }
}

/// Schemas of common built-in kinds, from k8s-openapi.
fn builtin_schema(group: &str, kind: &str) -> Option<Value> {
    use k8s_openapi::api::{apps, batch, core, rbac};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
    macro_rules! schema {
        ($t:ty) => {
            serde_json::to_value(schemars::schema_for!($t)).ok()
        };
    }
    match (group, kind) {
        ("", "Namespace") => schema!(core::v1::Namespace),
        ("", "ConfigMap") => schema!(core::v1::ConfigMap),
        ("", "Secret") => schema!(core::v1::Secret),
        ("", "ServiceAccount") => schema!(core::v1::ServiceAccount),
        ("", "Service") => schema!(core::v1::Service),
        ("", "Pod") => schema!(core::v1::Pod),
        ("", "Node") => schema!(core::v1::Node),
        ("apps", "Deployment") => schema!(apps::v1::Deployment),
        ("apps", "StatefulSet") => schema!(apps::v1::StatefulSet),
        ("apps", "DaemonSet") => schema!(apps::v1::DaemonSet),
        ("apps", "ReplicaSet") => schema!(apps::v1::ReplicaSet),
        ("batch", "Job") => schema!(batch::v1::Job),
        ("batch", "CronJob") => schema!(batch::v1::CronJob),
        ("rbac.authorization.k8s.io", "ClusterRole") => schema!(rbac::v1::ClusterRole),
        ("rbac.authorization.k8s.io", "Role") => schema!(rbac::v1::Role),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            schema!(rbac::v1::ClusterRoleBinding)
        }
        ("rbac.authorization.k8s.io", "RoleBinding") => schema!(rbac::v1::RoleBinding),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            schema!(apiext::CustomResourceDefinition)
        }
        _ => None,
    }
}

/// ObjectMeta's schema: CRD schemas leave `metadata` open.
fn object_meta_schema() -> Option<Value> {
    serde_json::to_value(schemars::schema_for!(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta
    ))
    .ok()
}

/// A path of the trigger the rule does not see (outside `metadataOnly`'s
/// metadata, or outside its `fields`): it reads nothing.
fn unseen(trigger: &TriggerKind, path: &str, shown: &str) -> Option<String> {
    if trigger.metadata_only {
        return beyond_metadata(path, shown);
    }
    let fields = trigger.fields.as_ref()?;
    let keys: Vec<String> = crate::engine::path::FieldPath::parse(path)
        .ok()?
        .segments()
        .iter()
        .map(segment_text)
        .collect();
    // Seen: at or below a field, or above one (a map holding it).
    let seen = fields
        .iter()
        .any(|f| keys.starts_with(f) || f.starts_with(&keys));
    (!seen).then(|| {
        let named: Vec<String> = fields
            .iter()
            .map(|f| f.join("."))
            .filter(|f| !matches!(f.as_str(), "apiVersion" | "kind" | "metadata"))
            .collect();
        format!(
            "{shown}: the trigger's fields are [{}]: rules see those, apiVersion, kind and \
             metadata only, so {} is never there (add it to spec.trigger.fields)",
            named.join(", "),
            keys.join(".")
        )
    })
}

/// With `metadataOnly: true`, a path of the trigger outside `apiVersion`,
/// `kind` and `metadata` (`spec.group`) reads nothing.
fn beyond_metadata(path: &str, shown: &str) -> Option<String> {
    let first = crate::engine::path::FieldPath::parse(path)
        .ok()
        .and_then(|p| p.segments().first().map(segment_text))?;
    (!matches!(first.as_str(), "apiVersion" | "kind" | "metadata")).then(|| {
        format!(
            "{shown}: the trigger is metadataOnly: rules see its apiVersion, kind and metadata \
             only, so {first} is never there (read metadata, or drop metadataOnly)"
        )
    })
}

fn segment_text(s: &crate::engine::path::Segment) -> String {
    match s {
        crate::engine::path::Segment::Key(k) => k.clone(),
        crate::engine::path::Segment::Index(n) => n.to_string(),
    }
}

/// The index of the related set a field of the spec belongs to
/// (`spec.related[2].where[0].value` → 2).
fn related_index(field: &str) -> Option<usize> {
    field
        .strip_prefix("spec.related[")?
        .split_once(']')?
        .0
        .parse()
        .ok()
}

/// A condition's literal `path` checked against the schema of the object
/// it reads (the trigger, or a related object).
fn check_condition_path(schema: &Value, group: &str, kind: &str, c: &Value) -> Option<String> {
    let text = c["path"].as_str()?;
    let path = crate::engine::path::FieldPath::parse(text).ok()?;
    let segs: Vec<String> = path.segments().iter().map(segment_text).collect();
    let (missing, fix) = missing_field(schema, &segs)?;
    let hint = fix
        .map(|f| format!(" (did you mean {f}?)"))
        .unwrap_or_default();
    Some(format!(
        "path {text}: {} has no field {missing}{hint}; the condition can never hold",
        kind_ref(group, kind)
    ))
}

/// Where a path inside an object leaves its kind's schema: the path up to
/// the first field the schema lacks, and the closest field there written
/// as a whole path. `None`: the path is fine or cannot be checked.
fn missing_field(schema: &Value, segs: &[String]) -> Option<(String, Option<String>)> {
    let first = segs.first()?;
    // Every object has these, whether or not a CRD's schema lists them.
    if matches!(first.as_str(), "apiVersion" | "kind") && segs.len() == 1 {
        return None;
    }
    let meta;
    let (root, start) = if first == "metadata" && schema_is_open(schema, "metadata") {
        meta = object_meta_schema()?;
        (&meta, 1)
    } else {
        (schema, 0)
    };
    let (depth, candidates) = walk_schema(root, root, &segs[start..])?;
    let at = start + depth;
    let missing = segs[..=at].join(".");
    let fix = suggest(&segs[at], candidates.iter().map(String::as_str)).map(|s| {
        let mut fixed: Vec<&str> = segs[..at].iter().map(String::as_str).collect();
        fixed.push(s);
        fixed.join(".")
    });
    Some((missing, fix))
}

/// Literal `roleRef.kind` and subject kinds of the outputs: Kubernetes
/// knows `ClusterRole`/`Role` and `User`/`Group`/`ServiceAccount` only,
/// spelt exactly so.
fn lint_binding_kinds(spec: &Value, push: &mut impl FnMut(Severity, &str, String)) {
    const ROLE_KINDS: &[&str] = &["ClusterRole", "Role"];
    const SUBJECT_KINDS: &[&str] = &["User", "Group", "ServiceAccount"];
    let mut check = |field: &str, kind: &Value, known: &[&str], what: &str| {
        let Some(k) = kind.as_str().filter(|k| Templates::is_literal(k)) else {
            return;
        };
        if known.contains(&k) {
            return;
        }
        let hint = known
            .iter()
            .find(|c| c.eq_ignore_ascii_case(k))
            .copied()
            .or_else(|| suggest(k, known.iter().copied()))
            .map(|s| format!(" (did you mean {s:?}?)"))
            .unwrap_or_default();
        push(
            Severity::Error,
            field,
            format!(
                "unknown {what} kind {k:?}{hint}: expected one of {}",
                known.join(", ")
            ),
        );
    };
    for (i, out) in spec["outputs"].as_array().into_iter().flatten().enumerate() {
        let role_kinds: &[&str] = if out["kind"] == "ClusterRoleBinding" {
            &ROLE_KINDS[..1]
        } else {
            ROLE_KINDS
        };
        check(
            &format!("spec.outputs[{i}].roleRef.kind"),
            &out["roleRef"]["kind"],
            role_kinds,
            "roleRef",
        );
        fn subjects<'a>(v: &'a Value, field: String, out: &mut Vec<(String, &'a Value)>) {
            for (j, item) in v.as_array().into_iter().flatten().enumerate() {
                let f = format!("{field}[{j}]");
                if item.get("item").is_some() {
                    out.push((format!("{f}.item.kind"), &item["item"]["kind"]));
                } else if let Some(items) = item.get("items") {
                    subjects(items, format!("{f}.items"), out);
                } else {
                    out.push((format!("{f}.kind"), &item["kind"]));
                }
            }
        }
        let mut found = Vec::new();
        subjects(
            &out["subjects"],
            format!("spec.outputs[{i}].subjects"),
            &mut found,
        );
        for (field, kind) in found {
            check(&field, kind, SUBJECT_KINDS, "subject");
        }
    }
}

/// Checks a path the template reads against the trigger kind's schema.
fn check_trigger_path(
    schema: &Value,
    group: &str,
    kind: &str,
    raw: &str,
    segs: &[String],
) -> Option<String> {
    if segs.first().map(String::as_str) != Some("trigger") || segs.len() < 2 {
        return None;
    }
    let rest = &segs[1..];
    let meta;
    let (root, start) = if rest[0] == "metadata" && schema_is_open(schema, "metadata") {
        meta = object_meta_schema()?;
        (&meta, 1)
    } else {
        (schema, 0)
    };
    let (depth, candidates) = walk_schema(root, root, &rest[start..])?;
    let at = start + depth;
    let missing = rest[..=at].join(".");
    let hint = suggest(&rest[at], candidates.iter().map(String::as_str))
        .map(|s| {
            let mut fixed: Vec<&str> = rest[..at].iter().map(String::as_str).collect();
            fixed.push(s);
            format!(" (did you mean trigger.{}?)", fixed.join("."))
        })
        .unwrap_or_default();
    Some(format!(
        "{raw}: {} has no field {missing}{hint}",
        kind_ref(group, kind)
    ))
}

/// Whether `schema` leaves a top-level property without sub-properties.
fn schema_is_open(schema: &Value, prop: &str) -> bool {
    let p = &schema["properties"][prop];
    p.is_null() || (p.get("properties").is_none() && p.get("$ref").is_none())
}

fn resolve<'a>(root: &'a Value, mut s: &'a Value) -> &'a Value {
    for _ in 0..32 {
        match s.get("$ref").and_then(Value::as_str) {
            Some(r) => match root.pointer(r.trim_start_matches('#')) {
                Some(t) => s = t,
                None => return s,
            },
            None => return s,
        }
    }
    s
}

/// Follows `segs` through a schema. `None`: the path is fine (or cannot be
/// checked); `Some((i, names))`: segment `i` is not a field, `names` are
/// the fields there.
fn walk_schema(root: &Value, schema: &Value, segs: &[String]) -> Option<(usize, Vec<String>)> {
    let seg = segs.first()?;
    let s = resolve(root, schema);
    if s["x-kubernetes-preserve-unknown-fields"] == true {
        return None;
    }
    // Alternatives (nullable wrappers): fine if any branch has the path.
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(branches) = s.get(key).and_then(Value::as_array) {
            let mut best: Option<(usize, Vec<String>)> = None;
            for b in branches {
                let b = resolve(root, b);
                if b["type"] == "null" {
                    continue;
                }
                match walk_schema(root, b, segs) {
                    None => return None,
                    Some(found) => {
                        if best.as_ref().is_none_or(|(d, _)| found.0 > *d) {
                            best = Some(found);
                        }
                    }
                }
            }
            return best;
        }
    }
    let next = |child: &Value| walk_schema(root, child, &segs[1..]).map(|(d, c)| (d + 1, c));
    if seg.chars().all(|c| c.is_ascii_digit())
        && let Some(items) = s.get("items")
    {
        return next(items);
    }
    if let Some(child) = s.get("properties").and_then(|p| p.get(seg.as_str())) {
        return next(child);
    }
    match s.get("additionalProperties") {
        Some(Value::Object(_)) => return next(&s["additionalProperties"]),
        Some(Value::Bool(true)) => return None,
        _ => {}
    }
    let props: Vec<String> = s
        .get("properties")
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    if props.is_empty() && !is_scalar(s) {
        // A free-form object: nothing to check against.
        return None;
    }
    Some((0, props))
}

fn is_scalar(s: &Value) -> bool {
    let scalar = |t: &Value| {
        matches!(
            t.as_str(),
            Some("string" | "integer" | "number" | "boolean")
        )
    };
    match &s["type"] {
        Value::Array(ts) => ts.iter().all(|t| scalar(t) || t == "null"),
        t => scalar(t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(s: &Value, group: &str, kind: &str, raw: &str) -> Option<String> {
        let paths = root_paths(&format!("{{{{{raw}}}}}"), false);
        let (raw, segs) = &paths[0];
        check_trigger_path(s, group, kind, raw, segs)
    }

    #[test]
    fn namespace_schema_knows_metadata_and_spec() {
        let s = builtin_schema("", "Namespace").expect("schema");
        assert_eq!(check(&s, "", "Namespace", "trigger.metadata.name"), None);
        assert_eq!(
            check(&s, "", "Namespace", "trigger.metadata.labels.team"),
            None
        );
        let msg = check(&s, "", "Namespace", "trigger.metadata.nme").expect("typo");
        assert!(msg.contains("did you mean trigger.metadata.name?"), "{msg}");
        let d = builtin_schema("apps", "Deployment").expect("schema");
        assert_eq!(
            check(
                &d,
                "apps",
                "Deployment",
                "trigger.spec.template.spec.serviceAccountName"
            ),
            None
        );
        let msg = check(&d, "apps", "Deployment", "trigger.spec.replica").expect("typo");
        assert_eq!(
            check(&s, "", "Namespace", "trigger.metadata.labels.[a.b/c]"),
            None
        );
        assert!(msg.contains("trigger.spec.replicas"), "{msg}");
    }

    #[test]
    fn helper_probe_finds_unknown_helpers_and_arity() {
        assert_eq!(probe_helper("shorten", 2), None);
        let msg = probe_helper("shortn", 2).expect("unknown");
        assert!(msg.contains("did you mean \"shorten\""), "{msg}");
        let msg = probe_helper("default", 3).expect("arity");
        assert!(msg.contains("takes 2 argument(s), got 3"), "{msg}");
    }
}
