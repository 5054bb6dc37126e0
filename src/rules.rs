//! Reading RbacRule manifests: the built-in set embedded in the binary and
//! rule files given on the command line. Unknown fields are errors here,
//! naming file, rule and field: a typo must not silently change a rule.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::api::{GROUP, RbacRuleSpec};
use crate::engine::RuleSource;
use crate::yaml::{self, Document, YamlError};

/// The built-in rules: every `rules/*.yaml` file (path, text), embedded by
/// the build script.
pub const BUILTIN: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/builtin_rules.rs"));

/// A rule file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Unreadable file or invalid YAML.
    #[error(transparent)]
    Yaml(#[from] YamlError),
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

/// Parses one RbacRule document.
pub fn parse_rule(doc: &Document) -> Result<RuleSource, LoadError> {
    let v = &doc.value;
    let name = v["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let api_version = v["apiVersion"].as_str().unwrap_or_default();
    let kind = v["kind"].as_str().unwrap_or_default();
    if kind != "RbacRule" || api_version != format!("{GROUP}/v1alpha1") {
        return Err(invalid(
            doc,
            &name,
            "",
            format!(
                "expected apiVersion {GROUP}/v1alpha1, kind RbacRule; got {api_version:?}, {kind:?}"
            ),
        ));
    }
    if name.is_empty() {
        return Err(invalid(doc, &name, "metadata.name", "name is required"));
    }
    let spec = v.get("spec").cloned().unwrap_or(Value::Null);
    let mut unknown: Vec<String> = Vec::new();
    let parsed: Result<RbacRuleSpec, _> = serde_path_to_error::deserialize(
        serde_ignored::Deserializer::new(spec, &mut |p: serde_ignored::Path| {
            unknown.push(format!("spec.{}", bracket_indices(&p.to_string())))
        }),
    );
    let typo_hint = unknown
        .first()
        .map(|u| format!(" (unknown field {u}: a typo?)"))
        .unwrap_or_default();
    let spec = parsed.map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            "spec".to_string()
        } else {
            format!("spec.{path}")
        };
        invalid(doc, &name, &field, format!("{}{typo_hint}", e.into_inner()))
    })?;
    if let Some(u) = unknown.first() {
        return Err(invalid(
            doc,
            &name,
            u,
            format!("unknown field {:?}", last_segment(u)),
        ));
    }
    Ok(RuleSource { name, spec })
}

/// `outputs.0.nmae` → `outputs[0].nmae`, the notation of every other error.
fn bracket_indices(path: &str) -> String {
    let mut out = String::new();
    for seg in path.split('.') {
        if !seg.is_empty() && seg.chars().all(|c| c.is_ascii_digit()) {
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
/// `recursive` (`-R`).
pub fn load_tree_with_origins(
    paths: &[PathBuf],
    recursive: bool,
) -> Result<Vec<(String, RuleSource)>, Vec<LoadError>> {
    let docs = yaml::load_tree(paths, recursive).map_err(|e| vec![LoadError::from(e)])?;
    with_origins(&docs)
}

fn with_origins(docs: &[Document]) -> Result<Vec<(String, RuleSource)>, Vec<LoadError>> {
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for d in docs {
        match parse_rule(d) {
            Ok(r) => ok.push((d.origin(), r)),
            Err(e) => bad.push(e),
        }
    }
    if bad.is_empty() { Ok(ok) } else { Err(bad) }
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
