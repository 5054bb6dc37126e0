//! Errors of rule evaluation. Every error names the rule and the field of
//! its spec, and the trigger when one was being rendered.

use std::fmt;

/// What went wrong, for metrics labels, condition reasons and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// The rule's spec is malformed (unknown field, missing field, bad value).
    InvalidRule,
    /// A handlebars template failed to parse or render.
    Template,
    /// A regular expression failed to compile.
    Regex,
    /// A label selector is malformed.
    Selector,
    /// A rendered object is not a valid Kubernetes object (name, label, rule).
    InvalidOutput,
    /// Two rules or triggers emit the same object.
    Conflict,
    /// Rules consume each other's outputs in a cycle.
    Cycle,
    /// An emitted permission is outside the controller's allow-list.
    Forbidden,
    /// A rule ran over an evaluation limit (see [`super::limits`]).
    LimitExceeded,
    /// Evaluation failed unexpectedly (a bug): nothing is changed.
    Internal,
}

impl ErrorKind {
    /// CamelCase reason, as used in status conditions and Events.
    pub fn reason(&self) -> &'static str {
        match self {
            ErrorKind::InvalidRule => "InvalidRule",
            ErrorKind::Template => "TemplateError",
            ErrorKind::Regex => "InvalidRegex",
            ErrorKind::Selector => "InvalidSelector",
            ErrorKind::InvalidOutput => "InvalidOutput",
            ErrorKind::Conflict => "Conflict",
            ErrorKind::Cycle => "DependencyCycle",
            ErrorKind::Forbidden => "Forbidden",
            ErrorKind::LimitExceeded => "LimitExceeded",
            ErrorKind::Internal => "InternalError",
        }
    }
}

/// An evaluation error, naming the rule, the field and (when rendering one)
/// the trigger.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct EngineError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// Name of the RbacRule.
    pub rule: String,
    /// Field of the rule's spec, e.g. `spec.outputs[0].name`.
    pub field: String,
    /// The trigger being rendered, as `Kind.group/[namespace/]name`.
    pub trigger: Option<String>,
    /// Human-readable detail.
    pub message: String,
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rule {:?}: {}", self.rule, self.field)?;
        if let Some(t) = &self.trigger {
            write!(f, " (trigger {t})")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// An error without rule and trigger yet: the field and message, filled in
/// by the caller that knows the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub kind: ErrorKind,
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(kind: ErrorKind, field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            kind,
            field: field.into(),
            message: message.into(),
        }
    }

    /// Attaches the rule and trigger.
    pub fn into_engine(self, rule: &str, trigger: Option<&str>) -> EngineError {
        EngineError {
            kind: self.kind,
            rule: rule.to_string(),
            field: self.field,
            trigger: trigger.map(str::to_string),
            message: self.message,
        }
    }
}
