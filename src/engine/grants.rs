//! Grants and policy: what an RBAC object grants (its rules, an
//! aggregated role's selected roles, a binding's role) and whether the
//! default denials, protected labels and the allow-list refuse it.

use std::cell::RefCell;
use std::sync::Arc;

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::compile::gk_of;
use super::fast_hash::HashMap;
use super::manifest::Manifest;
use super::output;
use super::store::ObjectStore;
use super::view::{Seen, View};
use crate::api::OutputKind;
use crate::policy;

/// The rules of an aggregated allow-list: those of the live ClusterRoles
/// its selectors pick, leaving out any a rule manages (an output can never
/// widen the allow-list).
pub(super) fn allow_list_rules(
    observed: &ObjectStore,
    allow: &crate::policy::AllowList,
) -> Vec<PolicyRule> {
    let mut out = Vec::new();
    for role in observed.list(gk_of(OutputKind::ClusterRole)) {
        let labels = role["metadata"]["labels"].as_object();
        if output::is_managed(role) {
            continue;
        }
        if allow
            .selectors
            .iter()
            .any(|s| crate::selector::matches_json(s, labels))
        {
            out.extend(rules_of(role));
        }
    }
    out
}

/// Verdicts on shared rule lists (see [`Judge::judged`]).
pub(super) type JudgedRules =
    HashMap<usize, (Arc<Vec<PolicyRule>>, Arc<(Vec<String>, Option<String>)>)>;

/// What policy judges objects with.
pub(super) struct Judge<'v, 'a> {
    pub view: &'v View<'a>,
    /// Verdicts on rule lists (denials, what the allow-list misses), by
    /// the address of the shared list (held): copies are judged once.
    pub judged: RefCell<JudgedRules>,
    pub waivers: &'v crate::policy::Waivers,
    pub protected: &'v [LabelSelector],
    pub allow: Option<(&'v crate::policy::AllowList, &'v [PolicyRule])>,
}

impl Judge<'_, '_> {
    /// Why policy refuses an emitted object, in compact form.
    pub fn refusal_of(&self, m: &Manifest) -> Option<String> {
        match m.aggregation_rule() {
            // What it aggregates is read through the view, as JSON.
            Some(_) => self.refusal(m.shared_value()),
            None => self.judge(Obj::Compact(m)),
        }
    }

    /// Why policy refuses `obj` (an RBAC object), in compact form.
    pub fn refusal(&self, obj: &Arc<Value>) -> Option<String> {
        self.judge(Obj::Json(obj))
    }

    fn judge(&self, obj: Obj) -> Option<String> {
        let kind = obj.kind();
        let name = obj.name();
        // Spelled only when something is refused.
        let what = lazy(|f| write!(f, "{kind} {name:?}"));
        let mut why: Vec<String> = Vec::new();
        if !self.waivers.system_names && policy::is_system_name(name) {
            why.push(format!(
                "{what} has a name reserved for Kubernetes (system:)"
            ));
        }
        if obj.protected(self.protected) {
            why.push(format!(
                "{what} carries labels that aggregate it into a protected ClusterRole (the controller's or the allow-list's)"
            ));
        }
        let aggregated = obj
            .json()
            .is_some_and(|o| o.get("aggregationRule").is_some());
        let grants = lazy(|f| {
            if aggregated {
                write!(f, "{what} aggregates roles that grant")
            } else {
                write!(f, "{what} grants")
            }
        });
        if let Some((role_kind, role_name)) = obj.role_ref() {
            if !self.waivers.cluster_admin_bindings
                && (role_name == "cluster-admin" || policy::is_system_name(role_name))
            {
                why.push(format!("{what} binds {role_name:?}"));
            }
            // Only the allow-list judges what a bound role grants: the
            // denials judge roles where they are written.
            if let Some((allow, effective)) = self.allow {
                let role = match role_kind {
                    "Role" => self.view.get_seen(
                        gk_of(OutputKind::Role),
                        &(obj.namespace().to_string(), role_name.to_string()),
                    ),
                    _ => self.view.get_seen(
                        gk_of(OutputKind::ClusterRole),
                        &(String::new(), role_name.to_string()),
                    ),
                };
                let rules = role.map(|r| self.grants(r)).unwrap_or_default();
                let missing = allow.uncovered(effective, &rules);
                if !missing.is_empty() {
                    why.push(format!(
                        "{what} binds role {role_name:?}, which grants what the allow-list does not: {}",
                        shown(&missing)
                    ));
                }
            }
        } else if let (Obj::Json(o), true) = (&obj, aggregated) {
            if self.allow.is_none() {
                // Judged by the kept denials of each role below.
                push_denials(&mut why, &grants, &self.aggregated_denials(o));
            } else {
                let granted = self.grants(Seen::Observed(o));
                push_denials(
                    &mut why,
                    &grants,
                    &policy::denied_grants(&granted, self.waivers),
                );
                self.push_uncovered(&mut why, &grants, &granted);
            }
        } else {
            // A role's own rules: judged once per shared rule list.
            let rules = match &obj {
                Obj::Json(o) => self.view.rules_of_transient(o),
                Obj::Compact(m) => m.rules().cloned().unwrap_or_default(),
            };
            let at = Arc::as_ptr(&rules) as usize;
            let hit = self
                .judged
                .borrow()
                .get(&at)
                .filter(|(held, _)| Arc::ptr_eq(held, &rules))
                .map(|(_, v)| Arc::clone(v));
            let verdict = hit.unwrap_or_else(|| {
                let denied = policy::denied_grants(&rules, self.waivers);
                let missing = match self.allow {
                    Some((allow, effective)) if !rules.is_empty() => {
                        let missing = allow.uncovered(effective, &rules);
                        (!missing.is_empty()).then(|| shown(&missing))
                    }
                    _ => None,
                };
                let v = Arc::new((denied, missing));
                self.judged
                    .borrow_mut()
                    .insert(at, (Arc::clone(&rules), Arc::clone(&v)));
                v
            });
            push_denials(&mut why, &grants, &verdict.0);
            if let Some(m) = &verdict.1 {
                why.push(format!("{grants} what the allow-list does not: {m}"));
            }
        }
        (!why.is_empty()).then(|| why.join("; "))
    }

    fn push_uncovered(
        &self,
        why: &mut Vec<String>,
        grants: &dyn std::fmt::Display,
        granted: &[PolicyRule],
    ) {
        if let Some((allow, effective)) = self.allow
            && !granted.is_empty()
        {
            let missing = allow.uncovered(effective, granted);
            if !missing.is_empty() {
                why.push(format!(
                    "{grants} what the allow-list does not: {}",
                    shown(&missing)
                ));
            }
        }
    }

    /// What a role grants: its rules, and for an aggregated ClusterRole the
    /// rules of the roles it selects now.
    fn grants(&self, role: Seen<'_>) -> Vec<PolicyRule> {
        let mut rules = match role {
            Seen::Observed(o) => self.view.rules_of_transient(o).to_vec(),
            emitted => self.view.role_rules(emitted).to_vec(),
        };
        if let Some(selectors) = role.aggregation_selectors() {
            let name = role.name();
            for other in self.view.selected(&selectors) {
                if other.name() != name {
                    rules.extend(self.view.role_rules(other).iter().cloned());
                }
            }
        }
        rules
    }

    /// The default denials an aggregated role breaks, from those of its
    /// own rules and of each role it aggregates (kept per role): the same
    /// as [`policy::denied_grants`] over all their rules.
    fn aggregated_denials(&self, role: &Arc<Value>) -> Vec<String> {
        let mut wildcards = Vec::new();
        let mut escalating: Vec<String> = Vec::new();
        // Roles that break no denial add nothing: only the others are
        // visited.
        let name = role["metadata"]["name"].as_str().unwrap_or_default();
        let others = self
            .view
            .noisy_selected(&selectors_of(role))
            .into_iter()
            .filter(|o| o.name() != name)
            .map(|o| self.view.role_rules(o));
        for rules in std::iter::once(self.view.rules_of(role)).chain(others) {
            let d = self.view.denials_of(&rules, self.waivers);
            wildcards.extend(d.0.iter().cloned());
            for e in &d.1 {
                if !escalating.contains(e) {
                    escalating.push(e.clone());
                }
            }
        }
        wildcards.extend(escalating);
        wildcards
    }
}

/// The denials a grant breaks, every one.
fn push_denials(why: &mut Vec<String>, grants: &dyn std::fmt::Display, denied: &[String]) {
    if !denied.is_empty() {
        why.push(format!("{grants} {}", denied.join("; ")));
    }
}

/// An object policy judges: live or emitted (JSON), or an emitted object
/// in compact form (never an aggregated ClusterRole).
enum Obj<'x> {
    Json(&'x Arc<Value>),
    Compact(&'x Manifest),
}

impl Obj<'_> {
    fn json(&self) -> Option<&Arc<Value>> {
        match self {
            Obj::Json(o) => Some(o),
            Obj::Compact(_) => None,
        }
    }

    fn kind(&self) -> &str {
        match self {
            Obj::Json(o) => o["kind"].as_str().unwrap_or_default(),
            Obj::Compact(m) => m.kind().as_str(),
        }
    }

    fn name(&self) -> &str {
        match self {
            Obj::Json(o) => o["metadata"]["name"].as_str().unwrap_or_default(),
            Obj::Compact(m) => m.name(),
        }
    }

    fn namespace(&self) -> &str {
        match self {
            Obj::Json(o) => o["metadata"]["namespace"].as_str().unwrap_or_default(),
            Obj::Compact(m) => m.meta().namespace.as_deref().unwrap_or_default(),
        }
    }

    /// Whether any of `selectors` (validated) selects it by its labels.
    fn protected(&self, selectors: &[LabelSelector]) -> bool {
        match self {
            Obj::Json(o) => {
                let labels = o["metadata"]["labels"].as_object();
                selectors
                    .iter()
                    .any(|s| crate::selector::matches_json(s, labels))
            }
            Obj::Compact(m) => m.labels().selected_by(selectors),
        }
    }

    /// A binding's roleRef kind and name.
    fn role_ref(&self) -> Option<(&str, &str)> {
        match self {
            Obj::Json(o) if o["kind"].as_str().is_some_and(|k| k.ends_with("Binding")) => {
                let r = &o["roleRef"];
                Some((
                    r["kind"].as_str().unwrap_or_default(),
                    r["name"].as_str().unwrap_or_default(),
                ))
            }
            Obj::Json(_) => None,
            Obj::Compact(m) => m.role_ref(),
        }
    }
}

/// Every uncovered permission, compact, with their count.
fn shown(missing: &[PolicyRule]) -> String {
    policy::describe_all(missing)
}

/// A live or emitted role's rules. Live roles were validated by the API
/// server; what does not parse is skipped (and logged) rather than failing
/// every rule that reads the role.
pub(super) fn rules_of(role: &Value) -> Vec<PolicyRule> {
    let name = role["metadata"]["name"].as_str().unwrap_or_default();
    let mut out = Vec::new();
    for (i, r) in role
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        match serde_json::from_value::<PolicyRule>(r.clone()) {
            Ok(p) => out.push(p),
            Err(e) => {
                tracing::warn!(role = name, index = i, error = %e, "skipping unparseable rule")
            }
        }
    }
    out
}

/// The selectors of an aggregated ClusterRole.
pub(super) fn selectors_of(role: &Value) -> Vec<LabelSelector> {
    role["aggregationRule"]["clusterRoleSelectors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| serde_json::from_value(s.clone()).ok())
        .collect()
}

/// For an aggregated ClusterRole, the key of the selection its verdict
/// reads (see [`View::selected`]).
pub(super) fn selection_key(role: &Value) -> Option<String> {
    role.get("aggregationRule")?;
    serde_json::to_string(&selectors_of(role)).ok()
}

/// Text spelled only when it is shown (a verdict's wording, needed only
/// for a refusal): `Display` by `f`.
fn lazy<F>(f: F) -> Lazy<F>
where
    F: Fn(&mut std::fmt::Formatter<'_>) -> std::fmt::Result,
{
    Lazy(f)
}

/// See [`lazy`].
struct Lazy<F>(F);

impl<F> std::fmt::Display for Lazy<F>
where
    F: Fn(&mut std::fmt::Formatter<'_>) -> std::fmt::Result,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (self.0)(f)
    }
}
