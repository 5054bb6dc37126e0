//! Grants and policy: what an RBAC object grants (its rules, an
//! aggregated role's selected roles, a binding's role) and whether the
//! default denials, protected labels and the allow-list refuse it.
//!
//! Reference twin: `reference/judge.rs`.

use std::cell::RefCell;
use std::sync::Arc;

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::fast_hash::HashMap;
use super::kinds::gk_of;
use super::manifest::Manifest;
use super::model::Seen;
use super::output::{self, rules_of, selectors_of};
use super::store::ObjectStore;
use super::view::View;
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

/// Verdicts on bound live roles (see [`Judge::bound`]).
pub(super) type BoundRoles = HashMap<usize, (Arc<Value>, Arc<(Vec<String>, Option<String>)>)>;

/// Verdicts on bound aggregates (see [`Judge::aggregate_verdict`]).
pub(super) type AggregateVerdicts = HashMap<usize, (Arc<Value>, Arc<Vec<String>>)>;

/// What policy judges objects with.
pub(super) struct Judge<'v, 'a> {
    pub view: &'v View<'a>,
    /// Verdicts on rule lists (denials, what the allow-list misses), by
    /// the address of the shared list (held): copies are judged once.
    pub judged: RefCell<JudgedRules>,
    /// Verdicts on live roles no rule manages that bindings name, by the
    /// role's address (held).
    pub bound: RefCell<BoundRoles>,
    /// Why bindings of aggregated roles a rule makes are refused, by the
    /// aggregate's address (held).
    pub aggregates: RefCell<AggregateVerdicts>,
    pub waivers: &'v crate::policy::Waivers,
    pub protected: &'v [LabelSelector],
    pub allow: Option<(&'v crate::policy::AllowList, &'v [PolicyRule])>,
    /// The ceiling of tenant outputs.
    pub ceiling: super::tenant::Ceiling<'v>,
}

impl Judge<'_, '_> {
    /// Why policy refuses an emitted object, in compact form.
    pub fn refusal_of(&self, m: &Manifest) -> Option<String> {
        match m.aggregation_rule() {
            // What it aggregates is read through the view, as JSON.
            Some(_) => self.judge(Obj::Json(m.shared_value()), true),
            None => self.judge(Obj::Compact(m), true),
        }
    }

    /// Why policy refuses `obj`, a live managed RBAC object, in compact
    /// form. A protected object is never refused (nor revoked): no rule
    /// made it, whatever its labels say.
    pub fn refusal(&self, obj: &Arc<Value>) -> Option<String> {
        self.judge(Obj::Json(obj), false)
    }

    fn judge(&self, obj: Obj, emitted: bool) -> Option<String> {
        let kind = obj.kind();
        let name = obj.name();
        // Spelled only when something is refused.
        let what = lazy(|f| write!(f, "{kind} {name:?}"));
        let mut why: Vec<String> = Vec::new();
        if let Some(p) = policy::protected_object(kind, name, |k| obj.label(k)) {
            if !emitted {
                return None;
            }
            why.push(format!(
                "{what} is {p}: never written by a rule, whatever the flags"
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
        if let Some((role_kind, role_name)) = obj.role_ref() {
            self.judge_binding(&obj, &what, role_kind, role_name, &mut why);
        } else if let (Obj::Json(o), true) = (&obj, aggregated) {
            self.judge_aggregated(o, &what, name, emitted, &mut why);
        } else {
            self.judge_own_rules(&obj, &what, &mut why);
        }
        // Last: a refusal for the ceiling alone is reported as such.
        why.extend(self.ceiling_refusal(&obj));
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// Why a tenant output goes over its namespace's ceiling: a role by
    /// its rules, a binding by what the role it binds grants as the view
    /// sees it (emitted or live, aggregation resolved) and as it is live.
    fn ceiling_refusal(&self, obj: &Obj) -> Option<String> {
        let own = || match obj {
            Obj::Json(o) => rules_of(o),
            Obj::Compact(m) => m.rules().map(|r| r.to_vec()).unwrap_or_default(),
        };
        let bound = |rk: OutputKind, ns: &str, rn: &str| {
            let key = (ns.to_string(), rn.to_string());
            let mut rules = Vec::new();
            if let Some(seen) = self.view.get_seen(gk_of(rk), &key) {
                rules.extend(self.ceiling.with_members(self.view.json(seen)));
            }
            if let Some(live) = self.view.observed.get_shared(gk_of(rk), &key) {
                rules.extend(self.ceiling.with_members(live));
            }
            rules
        };
        self.ceiling.refusal(
            (obj.kind(), obj.namespace(), obj.name()),
            own,
            obj.role_ref(),
            || obj.subjects(),
            bound,
        )
    }

    /// Why a binding is refused: what it binds, to whom, and what the
    /// live role it names grants.
    fn judge_binding(
        &self,
        obj: &Obj,
        what: &impl std::fmt::Display,
        role_kind: &str,
        role_name: &str,
        why: &mut Vec<String>,
    ) {
        if !self.waivers.cluster_admin_bindings
            && (role_name == "cluster-admin" || policy::is_system_name(role_name))
        {
            why.push(format!("{what} binds {role_name:?}"));
        }
        if !self.waivers.everyone_bindings
            && let Some(s) = obj.everyone_subject()
        {
            why.push(format!(
                "{what} binds everyone: {s} (switch: --allow-everyone-bindings)"
            ));
        }
        // What the bound role grants, with or without an allow-list: a
        // live role no rule manages by its rules (aggregated: by what it
        // aggregates); a managed or emitted role is judged itself (and
        // refused alone), and an aggregated one by the roles no rule
        // manages that it aggregates.
        let gk = match role_kind {
            "Role" => gk_of(OutputKind::Role),
            _ => gk_of(OutputKind::ClusterRole),
        };
        let ns = if role_kind == "Role" {
            obj.namespace().to_string()
        } else {
            String::new()
        };
        let key = (ns, role_name.to_string());
        let Some(role) = self.view.observed.get_shared(gk, &key).filter(|r| !ours(r)) else {
            // A managed or emitted aggregate: by what it aggregates.
            if let Some(agg) = self.view.get_seen(gk, &key)
                && let Some(agg) = match agg {
                    Seen::Emitted(m) => m.aggregation_rule().map(|_| m.shared_value()),
                    Seen::Observed(o) => o.get("aggregationRule").map(|_| o),
                }
            {
                let found = self.aggregate_verdict(agg, role_name);
                if let Some(text) = policy::describe_members(&found) {
                    why.push(format!(
                        "{what} binds role {role_name:?}, which aggregates {text}"
                    ));
                }
            }
            return;
        };
        // A live role no rule manages: by what it grants.
        let bound = lazy(|f| write!(f, "{what} binds role {role_name:?}, which grants"));
        let verdict = self.bound_verdict(role);
        // `cluster-admin` and `system:*` have their own denial and
        // switch (above): the allow-list alone judges them here.
        let named = role_name == "cluster-admin" || policy::is_system_name(role_name);
        if !named {
            push_denials(why, &bound, &verdict.0);
        }
        if let Some(m) = &verdict.1 {
            why.push(format!("{bound} what the allow-list does not: {m}"));
        }
    }

    /// Why an aggregated ClusterRole is refused: what its selectors pick,
    /// and the rules a rule wrote into it.
    fn judge_aggregated(
        &self,
        o: &Arc<Value>,
        what: &impl std::fmt::Display,
        name: &str,
        emitted: bool,
        why: &mut Vec<String>,
    ) {
        let selectors = selectors_of(o);
        if policy::selects_protected_labels(&selectors) {
            why.push(format!(
                "{what} has an aggregationRule that selects Kubernetes' bootstrap roles or the controller's own (an empty selector, kubernetes.io/bootstrapping, rbac.authorization.k8s.io/aggregate-to-*, rbac-rules' labels)"
            ));
        } else if let Some(p) = self.protected_member(&selectors, name) {
            why.push(format!(
                "{what} has an aggregationRule that selects the protected ClusterRole {p:?} by the labels it was installed with"
            ));
        }
        // Its own rules, when a rule wrote them: the aggregation
        // controller replaces them, but they are the rule's. What it
        // aggregates is judged role by role where it is written; an
        // unmanaged role labelled in is a notice ([`Judge::notice`]).
        if emitted {
            let own = self.view.rules_of_transient(o);
            let grants = lazy(|f| write!(f, "{what} grants"));
            push_denials(why, &grants, &policy::denied_grants(&own, self.waivers));
            self.push_uncovered(why, &grants, &own);
        }
    }

    /// Why a role is refused for its own rules (judged once per shared
    /// rule list).
    fn judge_own_rules(&self, obj: &Obj, what: &impl std::fmt::Display, why: &mut Vec<String>) {
        let grants = lazy(|f| write!(f, "{what} grants"));
        // A role's own rules: judged once per shared rule list.
        let rules = match obj {
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
        push_denials(why, &grants, &verdict.0);
        if let Some(m) = &verdict.1 {
            why.push(format!("{grants} what the allow-list does not: {m}"));
        }
    }

    /// For an aggregated ClusterRole a rule manages: the roles no rule
    /// manages that it aggregates and that policy would refuse (someone
    /// labelled them in). Not a refusal — the role's rule did not write
    /// that grant, and Kubernetes' aggregation controller would aggregate
    /// them anyway — but reported, in compact form.
    pub fn notice(&self, role: &Arc<Value>) -> Option<String> {
        role.get("aggregationRule")?;
        let name = role["metadata"]["name"].as_str().unwrap_or_default();
        let selectors = selectors_of(role);
        // Only the roles that break a denial or (under an allow-list)
        // grant what it does not cover can matter: the cached selection
        // knows them.
        let members = self.view.refusable_selected(&selectors);
        let mut found: Vec<String> = Vec::new();
        let mut count = 0;
        for m in members {
            let Some(why) = self.unmanaged_member_refusal(m, name, |_| true) else {
                continue;
            };
            count += 1;
            if found.len() < 3 {
                let shown: Vec<&str> = why.iter().take(3).map(String::as_str).collect();
                found.push(format!(
                    "ClusterRole {:?}, which grants {}",
                    m.name(),
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

    /// A live protected ClusterRole that `selectors` pick by the labels it
    /// was installed with ([`policy::selects_by_installed_labels`]): the
    /// rule's choice, unlike a label someone added to it.
    fn protected_member(&self, selectors: &[LabelSelector], me: &str) -> Option<String> {
        // Only the protected members (kept with the selection): visiting
        // every member made an aggregate's verdict cost its selection, so
        // each new member of a large one cost the cluster.
        self.view
            .protected_selected(selectors)
            .into_iter()
            .find_map(|m| {
                let Seen::Observed(o) = m else { return None };
                let labels = o["metadata"]["labels"].as_object();
                let protected = m.name() != me && super::view::is_protected_role(m);
                let installed = labels
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)));
                (protected && policy::selects_by_installed_labels(selectors, installed))
                    .then(|| m.name().to_string())
            })
    }

    /// The denials and what the allow-list misses of a live role no rule
    /// manages, worked out once per role and judge: many bindings name
    /// the same role.
    fn bound_verdict(&self, role: &Arc<Value>) -> Arc<(Vec<String>, Option<String>)> {
        let at = Arc::as_ptr(role) as usize;
        if let Some((held, v)) = self.bound.borrow().get(&at)
            && Arc::ptr_eq(held, role)
        {
            return Arc::clone(v);
        }
        let rules = self.unmanaged_grants(role);
        let denied = policy::denied_grants(&rules, self.waivers);
        let missing = match self.allow {
            Some((allow, effective)) if !rules.is_empty() => {
                let missing = allow.uncovered(effective, &rules);
                (!missing.is_empty()).then(|| shown(&missing))
            }
            _ => None,
        };
        let v = Arc::new((denied, missing));
        self.bound
            .borrow_mut()
            .insert(at, (Arc::clone(role), Arc::clone(&v)));
        v
    }

    /// What a binding of an aggregated ClusterRole a rule makes (`agg`,
    /// named `name`) is refused for: the roles no rule manages that it
    /// aggregates and that break a default denial, or miss the allow-list
    /// when picked by a label the rule chose rather than one that only asks
    /// for aggregation ([`crate::policy::effective`]). Worked out once per
    /// aggregate and judge: every binding of it asks the same.
    fn aggregate_verdict(&self, agg: &Arc<Value>, name: &str) -> Arc<Vec<String>> {
        let at = Arc::as_ptr(agg) as usize;
        if let Some((held, v)) = self.aggregates.borrow().get(&at)
            && Arc::ptr_eq(held, agg)
        {
            return Arc::clone(v);
        }
        let selectors = selectors_of(agg);
        // Only the members that break a denial or (under an allow-list)
        // grant what it does not cover can be refused: the cached
        // selection knows them, so a binding judged again (any role
        // changed) costs those, not every member.
        let members = self.view.refusable_selected(&selectors);
        let mut found = Vec::new();
        for m in members {
            // A member joined only by an aggregation label is judged by the
            // denials alone.
            let judged_by_allow = |o: &Value| {
                !policy::joined_by_aggregation_label(
                    &selectors,
                    o["metadata"]["labels"].as_object(),
                )
            };
            if let Some(grants) = self.unmanaged_member_refusal(m, name, judged_by_allow) {
                found.push(format!(
                    "ClusterRole {:?} (no rule manages it), which grants {}",
                    m.name(),
                    grants.join("; ")
                ));
            }
        }
        let v = Arc::new(found);
        self.aggregates
            .borrow_mut()
            .insert(at, (Arc::clone(agg), Arc::clone(&v)));
        v
    }

    /// Why a member `m` of an aggregate named `name` would be refused, when
    /// no rule manages it (not ours, not the aggregate itself): the default
    /// denials it breaks and, where `judged_by_allow` says so for the live
    /// object, what it grants beyond the allow-list. `None`: nothing.
    fn unmanaged_member_refusal(
        &self,
        m: Seen<'_>,
        name: &str,
        judged_by_allow: impl Fn(&Value) -> bool,
    ) -> Option<Vec<String>> {
        let Seen::Observed(o) = m else { return None };
        if ours(o) || m.name() == name {
            return None;
        }
        let rules = self.view.role_rules(m);
        let mut why: Vec<String> = self
            .view
            .denials_of(&rules, self.waivers)
            .all()
            .cloned()
            .collect();
        if let Some((allow, effective)) = self.allow
            && !rules.is_empty()
            && judged_by_allow(o)
        {
            let missing = allow.uncovered(effective, &rules);
            if !missing.is_empty() {
                why.push(format!("what the allow-list does not: {}", shown(&missing)));
            }
        }
        (!why.is_empty()).then_some(why)
    }

    /// What a live role no rule manages grants: its rules, or, aggregated,
    /// those of the unmanaged roles it selects (managed and emitted ones
    /// are judged themselves, and what they grant passes).
    fn unmanaged_grants(&self, role: &Arc<Value>) -> Vec<PolicyRule> {
        if role.get("aggregationRule").is_none() {
            return self.view.rules_of_transient(role).to_vec();
        }
        let name = role["metadata"]["name"].as_str().unwrap_or_default();
        let mut rules = Vec::new();
        for other in self.view.selected(&selectors_of(role)) {
            if let Seen::Observed(o) = other
                && !ours(o)
                && other.name() != name
            {
                rules.extend(self.view.role_rules(other).iter().cloned());
            }
        }
        rules
    }
}

/// Whether a live RBAC object is the controller's: it carries our label
/// and is not protected (a protected object labelled ours is not, and is
/// judged as anyone's).
pub(super) fn ours(o: &Value) -> bool {
    let kind = o["kind"].as_str().unwrap_or_default();
    let name = o["metadata"]["name"].as_str().unwrap_or_default();
    output::is_managed(o)
        && policy::protected_object(kind, name, |k| o["metadata"]["labels"][k].as_str()).is_none()
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

    /// The value of one of its labels.
    fn label(&self, key: &str) -> Option<&str> {
        match self {
            Obj::Json(o) => o["metadata"]["labels"][key].as_str(),
            Obj::Compact(m) => m.labels().get(key),
        }
    }

    /// A binding's first subject that is everyone
    /// ([`policy::is_everyone`]), as `Kind "name"`.
    fn everyone_subject(&self) -> Option<String> {
        let hit = |kind: &str, name: &str| {
            policy::is_everyone(kind, name).then(|| format!("{kind} {name:?}"))
        };
        match self {
            Obj::Json(o) => o["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .find_map(|s| {
                    hit(
                        s["kind"].as_str().unwrap_or_default(),
                        s["name"].as_str().unwrap_or_default(),
                    )
                }),
            Obj::Compact(m) => match m.body() {
                super::manifest::Body::Binding { subjects, .. } => {
                    subjects.iter().find_map(|s| hit(&s.kind, &s.name))
                }
                super::manifest::Body::Role { .. } => None,
            },
        }
    }

    /// A binding's subjects, kind and name.
    fn subjects(&self) -> Vec<(String, String)> {
        match self {
            Obj::Json(o) => o["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    let t = |k: &str| s[k].as_str().unwrap_or_default().to_string();
                    (t("kind"), t("name"))
                })
                .collect(),
            Obj::Compact(m) => match m.body() {
                super::manifest::Body::Binding { subjects, .. } => subjects
                    .iter()
                    .map(|s| (s.kind.to_string(), s.name.to_string()))
                    .collect(),
                super::manifest::Body::Role { .. } => Vec::new(),
            },
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
