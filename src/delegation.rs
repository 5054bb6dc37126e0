//! What admission would refuse of a NamespacedRbacRule for its author
//! (`render --as`, a rule test's `author:`), offline, from the RBAC objects
//! of the input: the first of the two layers of delegation
//! (docs/rules.md "Namespaced rules"; the ValidatingAdmissionPolicy is the
//! same check on a real API server).
//!
//! The author must hold, in the rule's namespace, every permission the
//! rule's *static* rules grant (each literal entry of an output's `rules`,
//! judged as RBAC covers it) and `bind` on every role it binds by a literal
//! name, exactly as deploy/tenant-admission.yaml checks it: the verb on
//! every name (resourceNames are not narrowed), no `bind` for a Role the
//! same rule emits whose every entry is literal, at most
//! [`MAX_ADMISSION_CHECKS`] checks. What templates fill in at run time
//! cannot be judged here: the ceiling judges it at evaluation (the second
//! layer).

use k8s_openapi::api::rbac::v1::PolicyRule;
use serde_json::Value;

use crate::api::OutputKind;
use crate::engine::RuleSource;
use crate::engine::template::Templates;

/// The kinds of the RBAC objects the check reads.
pub const RBAC_KINDS: &[&str] = &["ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"];

/// An author: a user name and the groups they are in
/// (`system:authenticated` is added, as the API server does).
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Author {
    /// The user name (`system:serviceaccount:NS:NAME` for a ServiceAccount).
    pub user: String,
    /// Groups.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// Whether a value holds no template anywhere (and so is known before any
/// data is read).
fn literal(v: &Value) -> bool {
    match v {
        Value::String(s) => Templates::is_literal(s),
        Value::Array(a) => a.iter().all(literal),
        Value::Object(m) => m
            .iter()
            .all(|(k, v)| Templates::is_literal(k) && literal(v)),
        _ => true,
    }
}

/// What admission would refuse of the tenant rule `rule` written by an
/// author (`who`) holding `held` in the rule's namespace, one line each;
/// empty when it would admit it (a cluster rule is not a tenant's: nothing
/// to check). What an author holds is read from RBAC objects by
/// [`crate::ruletest::admission_refusals`], the offline authorizer's side.
pub fn refusals(rule: &RuleSource, held: &[PolicyRule], who: &str) -> Vec<String> {
    let Some(ns) = rule.namespace.as_deref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    // The names of this rule's Roles whose every entry is static: binding
    // one needs no `bind`, its every permission being checked here already
    // (Kubernetes' own rule; the admission policy's `staticRoles`).
    let short = rule
        .name
        .split_once('/')
        .map_or(rule.name.as_str(), |(_, n)| n);
    let own_static: Vec<String> = rule
        .spec
        .outputs
        .iter()
        .filter(|o| {
            o.kind == OutputKind::Role
                && o.for_each.is_none()
                && Templates::is_literal(&o.name)
                && o.rules
                    .as_ref()
                    .and_then(Value::as_array)
                    .is_some_and(|rs| rs.iter().all(|e| static_entry(e).is_some()))
        })
        .map(|o| format!("{}{}", crate::engine::tenant::output_prefix(short), o.name))
        .collect();
    // How many authorization checks admission makes: one per literal group
    // x resource x verb, one per `bind`. The API server's CEL cost allows
    // so few per request that the policy refuses a rule needing more.
    let mut checks = 0usize;
    let mut separators = false;
    for (i, o) in rule.spec.outputs.iter().enumerate() {
        let f = format!("spec.outputs[{i}]");
        for (j, entry) in o
            .rules
            .iter()
            .flat_map(|r| r.as_array())
            .flatten()
            .enumerate()
        {
            if o.kind != OutputKind::Role {
                continue;
            }
            let Some(requested) = static_entry(entry) else {
                continue;
            };
            checks += requested.api_groups.as_ref().map_or(0, Vec::len)
                * requested.resources.as_ref().map_or(0, Vec::len)
                * requested.verbs.len();
            separators |= requested
                .api_groups
                .iter()
                .chain(requested.resources.iter())
                .flatten()
                .chain(requested.verbs.iter())
                .any(|v| v.contains(['|', ';']));
            // As admission checks it: the verb on every name (the
            // authorizer is asked without resourceNames), stricter than
            // RBAC's own coverage.
            let requested = PolicyRule {
                resource_names: None,
                ..requested
            };
            let (_, missing) = crate::policy::covers(held, std::slice::from_ref(&requested));
            if !missing.is_empty() {
                out.push(format!(
                    "{f}.rules[{j}]: {who} does not hold, in namespace {ns:?}, {}: no one grants what they do not hold",
                    crate::policy::describe_all(&missing)
                ));
            }
        }
        if o.kind != OutputKind::RoleBinding {
            continue;
        }
        let Some(r) = &o.role_ref else { continue };
        if !Templates::is_literal(&r.kind) || !Templates::is_literal(&r.name) {
            continue;
        }
        if r.kind == "Role" && own_static.contains(&r.name) {
            continue;
        }
        checks += 1;
        separators |= r.name.contains(['|', ';']);
        let resource = if r.kind == "Role" {
            "roles"
        } else {
            "clusterroles"
        };
        let bind = PolicyRule {
            api_groups: Some(vec!["rbac.authorization.k8s.io".to_string()]),
            resources: Some(vec![resource.to_string()]),
            verbs: vec!["bind".to_string()],
            resource_names: Some(vec![r.name.clone()]),
            non_resource_urls: None,
        };
        if !crate::policy::covers(held, std::slice::from_ref(&bind)).0 {
            out.push(format!(
                "{f}.roleRef: {who} may not bind {} {:?} in namespace {ns:?} (bind on {resource} is needed)",
                r.kind, r.name
            ));
        }
    }
    if separators {
        out.push(
            "spec.outputs: apiGroups, resources, verbs and roleRef names may not contain '|' or ';' (admission refuses them)"
                .to_string(),
        );
    }
    if checks > MAX_ADMISSION_CHECKS {
        out.push(format!(
            "spec.outputs: admission makes at most {MAX_ADMISSION_CHECKS} permission checks per NamespacedRbacRule and this one needs {checks}: split it into several rules"
        ));
    }
    out
}

/// The most authorization checks the admission policy makes for one rule
/// (deploy/tenant-admission.yaml: the API server's CEL cost allows few per
/// request).
pub const MAX_ADMISSION_CHECKS: usize = 20;

/// An entry of a Role's `rules` whose every field is literal (no template,
/// no directive), as the policy rule it grants; `None` for one only the
/// evaluation-time ceiling can judge.
fn static_entry(entry: &Value) -> Option<PolicyRule> {
    let directive = crate::engine::compile::directive(entry)
        .ok()
        .flatten()
        .is_some();
    if !literal(entry) || directive {
        return None;
    }
    let rule = serde_json::from_value::<PolicyRule>(entry.clone()).ok()?;
    (rule.api_groups.is_some() && rule.resources.is_some()).then_some(rule)
}
