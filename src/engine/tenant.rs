//! Tenant rules (NamespacedRbacRule, docs/rules.md "Namespaced rules"):
//! a rule a namespace's own admins write, confined to that namespace.
//!
//! Both evaluators stand on this one file, so they cannot differ on it:
//!
//! - [`confine`] turns a tenant rule's spec into the spec that runs, before
//!   it is compiled: every read is pinned to the rule's namespace (a
//!   trigger condition on `metadata.namespace`, every `objects` query's
//!   `namespace`), cluster-scoped kinds only where
//!   [`Tenancy::readable_kinds`] lists them (and then only the
//!   cluster-scoped objects), Secrets as metadata only; outputs are only
//!   Roles and RoleBindings in the rule's namespace, named under the
//!   rule's own prefix ([`output_prefix`]). What the rule cannot be made
//!   to mean is a compile error of the rule (`InvalidRule`).
//! - [`check_output_name`]: a cluster rule may not write a Role or
//!   RoleBinding under the reserved [`TENANT_PREFIX`], so no cluster rule
//!   and no tenant rule ever write the same object, by construction.
//! - [`Ceiling`]: every output of a tenant (by its name, [`is_tenant_output`])
//!   is judged against the namespace's ceiling: what it grants (a Role its
//!   rules, a RoleBinding the rules of the role it binds) must be covered
//!   by the ceiling ClusterRole's rules (aggregation resolved), and may not
//!   include `escalate`, `bind` or `impersonate`. What goes over is refused
//!   alone ([`ErrorKind::OverCeiling`]).
//!
//! Cluster data is data here too: the namespace and rule names written into
//! the confined spec are DNS names (no template syntax can occur in them).

use std::borrow::Cow;
use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::error::{ErrorKind, FieldError};
use super::kinds::gk_of;
use super::store::{GroupKind, ObjectStore};
use crate::api::{Condition, OutputKind, RbacRuleSpec};

/// The prefix every tenant output's name starts with:
/// `tenant:<rule>:<name>`. Reserved: a cluster rule's Role or RoleBinding
/// may not carry it ([`check_output_name`]).
pub const TENANT_PREFIX: &str = "tenant:";

/// The Namespace label by which an administrator chooses the ceiling
/// ClusterRole of that namespace (Namespace labels are the cluster
/// administrator's: the `admin` role cannot patch Namespaces).
pub const CEILING_LABEL: &str = "rbacrules.io/tenant-ceiling";

/// The ceiling ClusterRole when neither the flag nor the label names one.
pub const DEFAULT_CEILING: &str = "admin";

/// Kinds whose data a tenant rule never reads: it sees their metadata only.
pub const SENSITIVE_KINDS: &[(&str, &str)] = &[("", "Secret")];

/// How a refusal for the ceiling starts (see [`refusal_kind`]).
const OVER_CEILING: &str = "over the namespace's ceiling: ";

/// The administrator's settings for tenant rules (NamespacedRbacRules);
/// flags of `render` and `run`, with an environment variable each.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct Tenancy {
    /// Cluster-scoped kinds NamespacedRbacRules may read, as `Kind[.group]`,
    /// comma-separated (e.g. `Namespace,ClusterIssuer.cert-manager.io`):
    /// read-only, the cluster-scoped objects of the kind only. Default:
    /// none.
    #[arg(long = "tenant-readable-kinds", env = "RBAC_RULES_TENANT_READABLE_KINDS",
          default_value = "", value_parser = parse_kinds)]
    pub readable_kinds: BTreeSet<GroupKind>,
    /// The ClusterRole whose rules are the ceiling of every
    /// NamespacedRbacRule's outputs (minus escalate, bind and impersonate),
    /// in a namespace without the label rbacrules.io/tenant-ceiling.
    #[arg(long = "tenant-ceiling", env = "RBAC_RULES_TENANT_CEILING",
          default_value = DEFAULT_CEILING)]
    pub ceiling: String,
}

impl Default for Tenancy {
    fn default() -> Self {
        Tenancy {
            readable_kinds: BTreeSet::new(),
            ceiling: DEFAULT_CEILING.to_string(),
        }
    }
}

/// Parses `--tenant-readable-kinds`: `Kind[.group]`, comma-separated.
pub fn parse_kinds(s: &str) -> Result<BTreeSet<GroupKind>, String> {
    let mut out = BTreeSet::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (kind, group) = part.split_once('.').unwrap_or((part, ""));
        if kind.is_empty() || !kind.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!("{part:?} is not Kind or Kind.group"));
        }
        out.insert(GroupKind::new(group, kind));
    }
    Ok(out)
}

// A tenant rule's engine name is part of the data model (the limits read
// it too): `model::{rule_name, rule_namespace}`.
pub use super::model::{rule_name, rule_namespace};

/// The value of an output's `rbacrules.io/rule` label: the rule's name,
/// a tenant rule's `/` written `.` (a label value holds no `/`), shortened
/// to 63 characters. The annotation of the same key holds the exact name.
pub fn rule_label_value(rule: &str) -> String {
    super::template::shorten(&rule.replace('/', "."), 63)
}

/// What every output name of the tenant rule `name` (its own
/// metadata.name) starts with.
pub fn output_prefix(name: &str) -> String {
    format!("{TENANT_PREFIX}{name}:")
}

/// Whether an object is a tenant's output (and so under a ceiling): a
/// Role or RoleBinding whose name carries the reserved prefix.
pub fn is_tenant_output(kind: &str, name: &str) -> bool {
    matches!(kind, "Role" | "RoleBinding") && name.starts_with(TENANT_PREFIX)
}

/// Refuses a cluster rule's Role or RoleBinding named under the reserved
/// prefix: only tenant rules write such names, so the two never collide.
pub fn check_output_name(
    rule: &str,
    kind: OutputKind,
    field: impl std::fmt::Display,
    name: &str,
) -> Result<(), FieldError> {
    if rule_namespace(rule).is_none() && kind.namespaced() && name.starts_with(TENANT_PREFIX) {
        return Err(FieldError::new(
            ErrorKind::InvalidOutput,
            field.to_string(),
            format!(
                "{kind} name {name:?} starts with {TENANT_PREFIX:?}, which is reserved for the outputs of NamespacedRbacRules"
            ),
        ));
    }
    Ok(())
}

/// The reason a refusal is reported with: [`ErrorKind::OverCeiling`] when
/// the ceiling is all that refuses it, otherwise `EscalationDenied`.
pub fn refusal_kind(why: &str) -> ErrorKind {
    if why.starts_with(OVER_CEILING) {
        ErrorKind::OverCeiling
    } else {
        ErrorKind::EscalationDenied
    }
}

fn bad(field: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError::new(ErrorKind::InvalidRule, field, message)
}

/// The condition that pins a trigger to the rule's namespace, or, for a
/// readable cluster-scoped kind, to cluster-scoped objects.
fn pin(namespace: Option<&str>) -> Condition {
    Condition {
        path: Some("metadata.namespace".to_string()),
        equals: namespace.map(str::to_string),
        exists: namespace.is_none().then_some(false),
        ..Condition::default()
    }
}

/// The spec a rule runs with: a cluster rule's as written; a tenant
/// rule's confined to its namespace (see the module doc), or the reasons
/// it cannot be.
pub fn confine<'s>(
    name: &str,
    namespace: Option<&str>,
    spec: &'s RbacRuleSpec,
    tenancy: &Tenancy,
) -> Result<Cow<'s, RbacRuleSpec>, Vec<FieldError>> {
    let Some(ns) = namespace else {
        // `/` marks a tenant rule's name: a cluster rule may not pose as one
        // (the API server refuses it in a name; a file could hold it).
        if name.contains('/') {
            return Err(vec![bad(
                "metadata.name",
                "an RbacRule's name holds no '/' (a NamespacedRbacRule is named <namespace>/<name>)",
            )]);
        }
        return Ok(Cow::Borrowed(spec));
    };
    let mut errors = Vec::new();
    let local = match name.split_once('/') {
        Some((n, local)) if n == ns && !local.is_empty() && !local.contains(':') => local,
        _ => {
            return Err(vec![bad(
                "metadata.name",
                format!("a NamespacedRbacRule's engine name is <namespace>/<name> ({ns}/...)"),
            )]);
        }
    };
    if let Err(e) = super::output::validate_namespace("metadata.namespace", ns) {
        return Err(vec![e]);
    }
    let readable = |group: &str, kind: &str| {
        tenancy
            .readable_kinds
            .contains(&GroupKind::new(group, kind))
    };
    let sensitive = |group: &str, kind: &str| SENSITIVE_KINDS.contains(&(group, kind));
    let mut spec = spec.clone();
    if let Some(t) = &mut spec.trigger {
        let cluster = readable(&t.api_group, &t.kind);
        t.conditions.push(pin((!cluster).then_some(ns)));
        if sensitive(&t.api_group, &t.kind) {
            if !t.fields.is_empty() {
                errors.push(bad(
                    "spec.trigger.fields",
                    format!("a NamespacedRbacRule sees {}s as metadata only", t.kind),
                ));
            }
            t.metadata_only = true;
        }
    }
    for (i, r) in spec.related.iter_mut().enumerate() {
        let Some(q) = &mut r.objects else { continue };
        let f = format!("spec.related[{i}].objects");
        let cluster = readable(&q.api_group, &q.kind);
        match q.namespace.as_deref() {
            None => {}
            Some(written) if written == ns && !cluster => {}
            Some(_) => errors.push(bad(
                format!("{f}.namespace"),
                format!(
                    "a NamespacedRbacRule reads only its own namespace ({ns:?}){}: omit namespace",
                    if cluster {
                        format!(" and the cluster-scoped {}s", q.kind)
                    } else {
                        String::new()
                    }
                ),
            )),
        }
        // "" lists the cluster-scoped objects of the kind only.
        q.namespace = Some(if cluster {
            String::new()
        } else {
            ns.to_string()
        });
        if sensitive(&q.api_group, &q.kind) {
            if !q.fields.is_empty() {
                errors.push(bad(
                    format!("{f}.fields"),
                    format!("a NamespacedRbacRule sees {}s as metadata only", q.kind),
                ));
            }
            q.metadata_only = true;
        }
    }
    let prefix = output_prefix(local);
    for (i, o) in spec.outputs.iter_mut().enumerate() {
        let f = format!("spec.outputs[{i}]");
        if !matches!(o.kind, OutputKind::Role | OutputKind::RoleBinding) {
            errors.push(bad(
                format!("{f}.kind"),
                format!(
                    "a NamespacedRbacRule writes only Roles and RoleBindings in its own namespace, not a {}",
                    o.kind
                ),
            ));
        }
        match o.namespace.as_deref() {
            None => {}
            Some(written) if written == ns => {}
            Some(_) => errors.push(bad(
                format!("{f}.namespace"),
                format!(
                    "a NamespacedRbacRule writes only in its own namespace ({ns:?}): omit namespace"
                ),
            )),
        }
        o.namespace = Some(ns.to_string());
        if o.rules_from.is_some() {
            errors.push(bad(
                format!("{f}.rulesFrom"),
                "a NamespacedRbacRule cannot copy ClusterRoles (it does not read them): write the rules",
            ));
        }
        o.name = format!("{prefix}{}", o.name);
    }
    if errors.is_empty() {
        Ok(Cow::Owned(spec))
    } else {
        Err(errors)
    }
}

/// Whether a `system:` subject names the ServiceAccounts of `namespace`
/// (`system:serviceaccounts:<ns>`, `system:serviceaccount:<ns>:<name>`),
/// which a namespace's admins may bind.
fn own_system_subject(kind: &str, name: &str, namespace: &str) -> bool {
    match kind {
        "Group" => name.strip_prefix("system:serviceaccounts:") == Some(namespace),
        "User" => name
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'))
            .is_some_and(|(ns, sa)| ns == namespace && !sa.is_empty() && !sa.contains(':')),
        _ => false,
    }
}

/// The ceiling of tenant outputs, judged on what is observed (the API
/// server's objects, never an output of this evaluation: what a rule makes
/// cannot raise a ceiling). Both evaluators judge with it.
pub struct Ceiling<'o> {
    observed: &'o ObjectStore,
    tenancy: &'o Tenancy,
}

impl<'o> Ceiling<'o> {
    /// The ceiling over `observed` with the administrator's settings.
    pub fn new(observed: &'o ObjectStore, tenancy: &'o Tenancy) -> Self {
        Ceiling { observed, tenancy }
    }

    /// The name of the ceiling ClusterRole of `namespace`: its Namespace's
    /// [`CEILING_LABEL`], or the setting.
    pub fn role_of(&self, namespace: &str) -> String {
        let gk = GroupKind::new("", "Namespace");
        // One at a time: Namespaces may be held packed.
        let labelled = self
            .observed
            .get_owned(&gk, &(String::new(), namespace.to_string()))
            .and_then(|n| {
                n["metadata"]["labels"][CEILING_LABEL]
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
            });
        labelled.unwrap_or_else(|| self.tenancy.ceiling.clone())
    }

    /// The rules of the ceiling ClusterRole `name`, aggregation resolved
    /// (its own rules and those of the observed ClusterRoles its selectors
    /// pick); `None` when it does not exist.
    pub fn rules_of(&self, name: &str) -> Option<Vec<PolicyRule>> {
        let gk = gk_of(OutputKind::ClusterRole);
        let role = self.observed.get(gk, &(String::new(), name.to_string()))?;
        Some(self.with_members(role))
    }

    /// A role's rules and, aggregated, those of the observed ClusterRoles it
    /// selects: what it grants once the aggregation controller has run.
    pub fn with_members(&self, role: &Value) -> Vec<PolicyRule> {
        let mut rules = super::output::rules_of(role);
        let selectors: Vec<LabelSelector> = role["aggregationRule"]["clusterRoleSelectors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| serde_json::from_value(s.clone()).ok())
            .collect();
        if selectors.is_empty() {
            return rules;
        }
        let me = role["metadata"]["name"].as_str().unwrap_or_default();
        for other in self.observed.list(gk_of(OutputKind::ClusterRole)) {
            let labels = other["metadata"]["labels"].as_object();
            if other["metadata"]["name"].as_str() != Some(me)
                && selectors
                    .iter()
                    .any(|s| crate::selector::matches_json(s, labels))
            {
                rules.extend(super::output::rules_of(other));
            }
        }
        rules
    }

    /// Why the tenant output (kind, namespace, name; a Role's rules
    /// or a binding's role) goes over its namespace's ceiling; `None` when
    /// it fits, or is not a tenant output. `bound` gives what a role seen
    /// by the evaluator grants (a binding's role: emitted or live),
    /// aggregation resolved.
    pub fn refusal(
        &self,
        (kind, namespace, name): (&str, &str, &str),
        own: impl FnOnce() -> Vec<PolicyRule>,
        role_ref: Option<(&str, &str)>,
        subjects: impl FnOnce() -> Vec<(String, String)>,
        bound: impl FnOnce(OutputKind, &str, &str) -> Vec<PolicyRule>,
    ) -> Option<String> {
        if !is_tenant_output(kind, name) {
            return None;
        }
        let mut why = Vec::new();
        if role_ref.is_some() {
            let reserved: Vec<String> = subjects()
                .into_iter()
                .filter(|(k, n)| !own_system_subject(k, n, namespace))
                .filter(|(k, n)| crate::policy::is_system_subject(k, n))
                .map(|(k, n)| format!("{k} {n:?}"))
                .collect();
            if !reserved.is_empty() {
                why.push(format!(
                    "{kind} {name:?} binds {}, a name Kubernetes reserves (a tenant binds only its own namespace's ServiceAccounts by a system: name)",
                    reserved.join(", ")
                ));
            }
        }
        let (grants, what) = match role_ref {
            Some((rk, rn)) => {
                let rk = if rk == "Role" {
                    OutputKind::Role
                } else {
                    OutputKind::ClusterRole
                };
                let ns = if rk == OutputKind::Role {
                    namespace
                } else {
                    ""
                };
                (
                    bound(rk, ns, rn),
                    format!("{kind} {name:?} binds {rk} {rn:?}, which grants"),
                )
            }
            None => (own(), format!("{kind} {name:?} grants")),
        };
        let role = self.role_of(namespace);
        let Some(ceiling) = self.rules_of(&role) else {
            return Some(format!(
                "{OVER_CEILING}{kind} {name:?}: the ceiling ClusterRole {role:?} of namespace {namespace:?} does not exist, so nothing a NamespacedRbacRule writes there passes"
            ));
        };
        let escalating = crate::policy::escalating_grants(&grants);
        if !escalating.is_empty() {
            why.push(format!(
                "{what} {} (never under a ceiling)",
                escalating.join(", ")
            ));
        }
        // Escalating grants are named above: not twice.
        let (_, mut missing) = crate::policy::covers(&ceiling, &grants);
        missing.retain(|r| crate::policy::escalating_grants(std::slice::from_ref(r)).is_empty());
        if !missing.is_empty() {
            why.push(format!(
                "{what} what the ceiling ClusterRole {role:?} does not: {}",
                crate::policy::describe_all(&missing)
            ));
        }
        (!why.is_empty()).then(|| format!("{OVER_CEILING}{}", why.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse() {
        let k = parse_kinds("Namespace,ClusterWidget.example.org").unwrap();
        assert!(k.contains(&GroupKind::new("", "Namespace")));
        assert!(k.contains(&GroupKind::new("example.org", "ClusterWidget")));
        assert!(parse_kinds("a/b").is_err());
    }

    #[test]
    fn reserved_prefix() {
        let f = "spec.outputs[0].name";
        assert!(check_output_name("c", OutputKind::Role, f, "tenant:x:y").is_err());
        assert!(check_output_name("c", OutputKind::ClusterRole, f, "tenant:x").is_ok());
        assert!(check_output_name("ns/r", OutputKind::Role, f, "tenant:r:y").is_ok());
        assert!(is_tenant_output("RoleBinding", "tenant:r:y"));
        assert!(!is_tenant_output("ClusterRoleBinding", "tenant:r:y"));
    }

    #[test]
    fn refusal_kinds() {
        assert_eq!(
            refusal_kind(&format!("{OVER_CEILING}x")),
            ErrorKind::OverCeiling
        );
        assert_eq!(
            refusal_kind("Role \"x\" grants"),
            ErrorKind::EscalationDenied
        );
    }
}
