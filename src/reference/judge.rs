//! What an RBAC object grants, and whether policy refuses it
//! (docs/security.md; the checks themselves are [`crate::policy`]'s).
//!
//! Fast twin: `engine/grants.rs`.

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::world::World;
use super::world::rules_of;
use crate::api::OutputKind;
use crate::engine::compile::gk_of;
use crate::engine::output;
use crate::engine::tenant::Ceiling;
use crate::policy::{self, AllowList, Waivers};

/// How policy judges: the waivers, protected selectors and allow-list.
pub(super) struct Judge<'w, 'a> {
    pub world: &'w World<'a>,
    pub waivers: &'w Waivers,
    /// No output may carry labels these select.
    pub protected: Vec<LabelSelector>,
    /// The allow-list and the rules it allows.
    pub allow: Option<(&'w AllowList, Vec<PolicyRule>)>,
    /// The ceiling of tenant outputs.
    pub ceiling: Ceiling<'w>,
}

fn text<'v>(v: &'v Value, key: &str) -> &'v str {
    v[key].as_str().unwrap_or_default()
}

impl Judge<'_, '_> {
    /// Why policy refuses `obj`, emitted (`emitted`) or a live managed
    /// object; `None` when it passes. A protected live object is never
    /// refused: no rule made it, whatever its labels say.
    pub fn refusal(&self, obj: &Value, emitted: bool) -> Option<String> {
        let kind = text(obj, "kind");
        let meta = &obj["metadata"];
        let name = text(meta, "name");
        let what = format!("{kind} {name:?}");
        let mut why: Vec<String> = Vec::new();
        if let Some(p) = policy::protected_object(kind, name, |k| meta["labels"][k].as_str()) {
            if !emitted {
                return None;
            }
            why.push(format!(
                "{what} is {p}: never written by a rule, whatever the flags"
            ));
        }
        let labels = meta["labels"].as_object();
        if self
            .protected
            .iter()
            .any(|s| crate::selector::matches_json(s, labels))
        {
            why.push(format!(
                "{what} carries labels that aggregate it into a protected ClusterRole (the controller's or the allow-list's)"
            ));
        }
        if kind.ends_with("Binding") {
            self.binding_refusals(obj, &what, &mut why);
        } else if obj.get("aggregationRule").is_some() {
            self.aggregation_refusals(obj, &what, emitted, &mut why);
        } else {
            self.grants_refusals(&rules_of(obj), &format!("{what} grants"), &mut why);
        }
        // Last: a refusal for the ceiling alone is reported as such.
        why.extend(self.ceiling_refusal(obj));
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// Why a tenant output goes over its namespace's ceiling: a role by
    /// its rules, a binding by what the role it binds grants as this world
    /// sees it (emitted or live, aggregation resolved) and as it is live.
    fn ceiling_refusal(&self, obj: &Value) -> Option<String> {
        let kind = text(obj, "kind");
        let meta = &obj["metadata"];
        let role_ref = kind
            .ends_with("Binding")
            .then(|| (text(&obj["roleRef"], "kind"), text(&obj["roleRef"], "name")));
        let bound = |rk: OutputKind, ns: &str, rn: &str| {
            let key = (ns.to_string(), rn.to_string());
            let mut rules = Vec::new();
            if let Some(seen) = self.world.seen(gk_of(rk), &key) {
                rules.extend(self.ceiling.with_members(seen.json()));
            }
            if let Some(live) = self.world.observed.get(gk_of(rk), &key) {
                rules.extend(self.ceiling.with_members(live));
            }
            rules
        };
        self.ceiling.refusal(
            (kind, text(meta, "namespace"), text(meta, "name")),
            || rules_of(obj),
            role_ref,
            || {
                let subjects = obj["subjects"].as_array().into_iter().flatten();
                subjects
                    .map(|s| (text(s, "kind").to_string(), text(s, "name").to_string()))
                    .collect()
            },
            bound,
        )
    }

    /// Denials and allow-list misses of rules `grants` grants.
    fn grants_refusals(&self, rules: &[PolicyRule], grants: &str, why: &mut Vec<String>) {
        push_denials(why, grants, &policy::denied_grants(rules, self.waivers));
        if let Some(m) = self.uncovered(rules) {
            why.push(format!("{grants} what the allow-list does not: {m}"));
        }
    }

    /// What the allow-list does not cover of `rules`, shown.
    fn uncovered(&self, rules: &[PolicyRule]) -> Option<String> {
        let (allow, effective) = self.allow.as_ref()?;
        if rules.is_empty() {
            return None;
        }
        let missing = allow.uncovered(effective, rules);
        (!missing.is_empty()).then(|| policy::describe_all(&missing))
    }

    /// A binding: to `cluster-admin` or `system:*`, to everyone, or to a
    /// live role no rule manages that grants what policy refuses.
    fn binding_refusals(&self, obj: &Value, what: &str, why: &mut Vec<String>) {
        let (role_kind, role_name) = (text(&obj["roleRef"], "kind"), text(&obj["roleRef"], "name"));
        let named = role_name == "cluster-admin" || policy::is_system_name(role_name);
        if !self.waivers.cluster_admin_bindings && named {
            why.push(format!("{what} binds {role_name:?}"));
        }
        let subjects = obj["subjects"].as_array().into_iter().flatten();
        let everyone = subjects
            .map(|s| (text(s, "kind"), text(s, "name")))
            .find(|(k, n)| policy::is_everyone(k, n));
        if !self.waivers.everyone_bindings
            && let Some((k, n)) = everyone
        {
            why.push(format!(
                "{what} binds everyone: {k} {n:?} (switch: --allow-everyone-bindings)"
            ));
        }
        let (gk, ns) = match role_kind {
            "Role" => (
                gk_of(OutputKind::Role),
                text(&obj["metadata"], "namespace").to_string(),
            ),
            _ => (gk_of(OutputKind::ClusterRole), String::new()),
        };
        let key = (ns, role_name.to_string());
        let Some(role) = self.world.observed.get(gk, &key).filter(|r| !ours(r)) else {
            // A managed or emitted aggregate: by what it aggregates.
            if let Some(agg) = self.world.seen(gk, &key).map(|s| s.json())
                && agg.get("aggregationRule").is_some()
            {
                self.aggregate_refusals(agg, what, role_name, why);
            }
            return;
        };
        let bound = format!("{what} binds role {role_name:?}, which grants");
        let rules = self.unmanaged_grants(role);
        if !named {
            push_denials(why, &bound, &policy::denied_grants(&rules, self.waivers));
        }
        if let Some(m) = self.uncovered(&rules) {
            why.push(format!("{bound} what the allow-list does not: {m}"));
        }
    }

    /// A binding of an aggregated ClusterRole a rule makes (`agg`), by
    /// what it aggregates that no rule manages: a role that breaks a
    /// default denial, or misses the allow-list and was picked by a label
    /// the rule chose (not one that only asks for aggregation), refuses
    /// the binding ([`crate::policy::effective`]).
    fn aggregate_refusals(&self, agg: &Value, what: &str, role_name: &str, why: &mut Vec<String>) {
        let mut found: Vec<String> = Vec::new();
        for m in self.selected_live(&selectors_of(agg)) {
            let member = text(&m["metadata"], "name");
            if ours(m) || member == role_name {
                continue;
            }
            let rules = rules_of(m);
            let mut grants = policy::denied_grants(&rules, self.waivers);
            let joined = policy::joined_by_aggregation_label(
                &selectors_of(agg),
                m["metadata"]["labels"].as_object(),
            );
            if !joined && let Some(missing) = self.uncovered(&rules) {
                grants.push(format!("what the allow-list does not: {missing}"));
            }
            if !grants.is_empty() {
                found.push(format!(
                    "ClusterRole {member:?} (no rule manages it), which grants {}",
                    grants.join("; ")
                ));
            }
        }
        if let Some(text) = policy::describe_members(&found) {
            why.push(format!(
                "{what} binds role {role_name:?}, which aggregates {text}"
            ));
        }
    }

    /// What a live role no rule manages grants: its rules, or, aggregated,
    /// those of the unmanaged live roles it selects.
    fn unmanaged_grants(&self, role: &Value) -> Vec<PolicyRule> {
        if role.get("aggregationRule").is_none() {
            return rules_of(role);
        }
        let name = text(&role["metadata"], "name");
        let members = self.selected_live(&selectors_of(role));
        members
            .into_iter()
            .filter(|o| !ours(o) && text(&o["metadata"], "name") != name)
            .flat_map(rules_of)
            .collect()
    }

    /// An aggregated ClusterRole: selecting bootstrap or protected roles,
    /// and, when a rule wrote it, its own rules.
    fn aggregation_refusals(&self, obj: &Value, what: &str, emitted: bool, why: &mut Vec<String>) {
        let selectors = selectors_of(obj);
        if policy::selects_protected_labels(&selectors) {
            why.push(format!(
                "{what} has an aggregationRule that selects Kubernetes' bootstrap roles or the controller's own (an empty selector, kubernetes.io/bootstrapping, rbac.authorization.k8s.io/aggregate-to-*, rbac-rules' labels)"
            ));
        } else if let Some(p) = self.protected_member(&selectors, text(&obj["metadata"], "name")) {
            why.push(format!(
                "{what} has an aggregationRule that selects the protected ClusterRole {p:?} by the labels it was installed with"
            ));
        }
        if emitted {
            self.grants_refusals(&rules_of(obj), &format!("{what} grants"), why);
        }
    }

    /// A live protected ClusterRole that `selectors` pick by the labels it
    /// was installed with.
    fn protected_member(&self, selectors: &[LabelSelector], me: &str) -> Option<String> {
        self.selected_live(selectors).into_iter().find_map(|o| {
            let name = text(&o["metadata"], "name");
            let labels = o["metadata"]["labels"].as_object();
            let protected = name != me
                && policy::protected_object("ClusterRole", name, |k| {
                    labels.and_then(|l| l.get(k)).and_then(Value::as_str)
                })
                .is_some();
            let installed = labels
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)));
            (protected && policy::selects_by_installed_labels(selectors, installed))
                .then(|| name.to_string())
        })
    }

    /// The live (not emitted) ClusterRoles policy sees that any of
    /// `selectors` selects, by name.
    fn selected_live(&self, selectors: &[LabelSelector]) -> Vec<&Value> {
        let roles = self.world.cluster_roles.iter().filter_map(|s| s.observed());
        roles.filter(|o| selects(selectors, o)).collect()
    }

    /// For an aggregated ClusterRole: the roles no rule manages that it
    /// aggregates and that policy would refuse (someone labelled them in).
    pub fn notice(&self, role: &Value) -> Option<String> {
        role.get("aggregationRule")?;
        let name = text(&role["metadata"], "name");
        let mut found: Vec<String> = Vec::new();
        let mut count = 0;
        for m in self.selected_live(&selectors_of(role)) {
            let member = text(&m["metadata"], "name");
            if ours(m) || member == name {
                continue;
            }
            let rules = rules_of(m);
            let mut why = policy::denied_grants(&rules, self.waivers);
            if let Some(missing) = self.uncovered(&rules) {
                why.push(format!("what the allow-list does not: {missing}"));
            }
            if why.is_empty() {
                continue;
            }
            count += 1;
            if found.len() < 3 {
                let shown: Vec<&str> = why.iter().take(3).map(String::as_str).collect();
                found.push(format!(
                    "ClusterRole {member:?}, which grants {}",
                    shown.join("; ")
                ));
            }
        }
        if count == 0 {
            return None;
        }
        let more = if count > found.len() {
            format!(" (and {} more)", count - found.len())
        } else {
            String::new()
        };
        Some(format!(
            "ClusterRole {name:?} aggregates roles no rule manages that policy would refuse: {}{more}; kept, not revoked: whoever labelled them into it holds what they grant, and Kubernetes aggregates them regardless — remove the label or the role",
            found.join("; ")
        ))
    }
}

/// Whether a live RBAC object is the controller's: it carries our label
/// and is not protected.
pub(super) fn ours(o: &Value) -> bool {
    let (kind, name) = (text(o, "kind"), text(&o["metadata"], "name"));
    output::is_managed(o)
        && policy::protected_object(kind, name, |k| o["metadata"]["labels"][k].as_str()).is_none()
}

fn push_denials(why: &mut Vec<String>, grants: &str, denied: &[String]) {
    if !denied.is_empty() {
        why.push(format!("{grants} {}", denied.join("; ")));
    }
}

fn selects(selectors: &[LabelSelector], obj: &Value) -> bool {
    let labels = obj["metadata"]["labels"].as_object();
    selectors
        .iter()
        .any(|s| crate::selector::matches_json(s, labels))
}

/// The selectors of an aggregated ClusterRole.
fn selectors_of(role: &Value) -> Vec<LabelSelector> {
    let selectors = role["aggregationRule"]["clusterRoleSelectors"]
        .as_array()
        .into_iter()
        .flatten();
    selectors
        .filter_map(|s| serde_json::from_value(s.clone()).ok())
        .collect()
}
