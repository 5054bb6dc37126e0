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
    /// Policy refuses an output: outside the allow-list, or a default
    /// denial (system names, cluster-admin bindings, escalating verbs,
    /// wildcard grants, protected labels, wildcards from data). A refused
    /// object is revoked, unlike one that failed to render.
    EscalationDenied,
    /// Policy refuses a NamespacedRbacRule's output for its namespace's
    /// ceiling alone (what it grants is not covered by the ceiling
    /// ClusterRole, or is escalate, bind or impersonate). Revoked, as any
    /// refusal.
    OverCeiling,
    /// A rule ran over an evaluation limit (see [`super::limits`]).
    LimitExceeded,
    /// Not an error: an aggregated ClusterRole a rule manages collects
    /// roles no rule manages that policy would refuse (someone labelled
    /// them in). Reported as a notice, never refused or revoked.
    UnmanagedAggregation,
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
            ErrorKind::EscalationDenied => "EscalationDenied",
            ErrorKind::OverCeiling => "OverCeiling",
            ErrorKind::LimitExceeded => "LimitExceeded",
            ErrorKind::UnmanagedAggregation => "UnmanagedAggregation",
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
    /// What kind of failure.
    pub kind: ErrorKind,
    /// Field of the rule's spec.
    pub field: String,
    /// Human-readable detail.
    pub message: String,
}

impl FieldError {
    /// An error of `kind` at `field`.
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

/// Longest value a warning quotes: trigger data may be long.
const MAX_WARNING_VALUE: usize = 253;

/// Something a rule skipped on purpose (a `require` condition failed, an
/// `extract` regex did not match with `unmatched: warn`): the rest of the
/// trigger is rendered, so this is not an error.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct EngineWarning {
    /// Name of the RbacRule.
    pub rule: String,
    /// Field of the rule's spec, e.g. `spec.related[1].require[0]`.
    pub field: String,
    /// The trigger being rendered, as `Kind.group/[namespace/]name`.
    pub trigger: Option<String>,
    /// The skipped value, as tested (`(missing)` for a missing field).
    pub value: String,
    /// Why it was skipped.
    pub message: String,
}

impl EngineWarning {
    /// The warning without the rule's name (for an Event on the rule):
    /// `<field> (trigger …): skipped "<value>": <why>`.
    pub fn detail(&self) -> String {
        let trigger = self
            .trigger
            .as_deref()
            .map(|t| format!(" (trigger {t})"))
            .unwrap_or_default();
        // Debug quoting escapes control characters: trigger data never
        // forges log lines.
        format!(
            "{}{trigger}: skipped {:?}: {}",
            self.field, self.value, self.message
        )
    }
}

impl fmt::Display for EngineWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rule {:?}: {}", self.rule, self.detail())
    }
}

/// A warning without rule and trigger yet.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FieldWarning {
    pub field: String,
    pub value: String,
    pub message: String,
}

impl FieldWarning {
    /// A warning on `field` about `value` (shortened when long).
    pub fn new(field: impl Into<String>, value: &str, message: impl Into<String>) -> Self {
        let value = if value.len() > MAX_WARNING_VALUE {
            let mut end = MAX_WARNING_VALUE;
            while !value.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}…", &value[..end])
        } else {
            value.to_string()
        };
        FieldWarning {
            field: field.into(),
            value,
            message: message.into(),
        }
    }

    /// Attaches the rule and trigger.
    pub fn into_engine(self, rule: &str, trigger: Option<&str>) -> EngineWarning {
        EngineWarning {
            rule: rule.to_string(),
            field: self.field,
            trigger: trigger.map(str::to_string),
            value: self.value,
            message: self.message,
        }
    }
}
