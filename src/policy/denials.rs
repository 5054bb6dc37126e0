//! The default denials: what no output may grant or touch whatever its
//! rule says (cluster-admin equivalents, escalating verbs, protected
//! names, labels and subjects), each switched off only by its waiver.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::rbac::*;

/// The default denials, each switched off by its own flag. All `false`
/// (every denial active) by default.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Waivers {
    /// Kept so that existing settings still parse; allows nothing: an
    /// object named `system:*` is protected, refused whatever the flags.
    #[arg(long = "allow-system-names", env = "RBAC_RULES_ALLOW_SYSTEM_NAMES")]
    pub system_names: bool,
    /// Allow bindings to `cluster-admin` and to `system:*` roles.
    #[arg(
        long = "allow-cluster-admin-bindings",
        env = "RBAC_RULES_ALLOW_CLUSTER_ADMIN_BINDINGS"
    )]
    pub cluster_admin_bindings: bool,
    /// Allow grants of `escalate` and `bind` on roles and of `impersonate`.
    #[arg(
        long = "allow-escalation-verbs",
        env = "RBAC_RULES_ALLOW_ESCALATION_VERBS"
    )]
    pub escalation_verbs: bool,
    /// Allow `*` verbs on `*` resources in `*` API groups (cluster-admin).
    #[arg(long = "allow-wildcard-all", env = "RBAC_RULES_ALLOW_WILDCARD_ALL")]
    pub wildcard_all: bool,
    /// Allow bindings to everyone: the groups `system:authenticated`,
    /// `system:unauthenticated`, `system:serviceaccounts` and the user
    /// `system:anonymous`.
    #[arg(
        long = "allow-everyone-bindings",
        env = "RBAC_RULES_ALLOW_EVERYONE_BINDINGS"
    )]
    pub everyone_bindings: bool,
}

/// Names Kubernetes reserves for its own roles and bindings.
pub fn is_system_name(name: &str) -> bool {
    name.starts_with("system:")
}

/// The subjects that name everyone, or every workload: every request,
/// authenticated or not, or every ServiceAccount of the cluster. By name,
/// for a `User` or a `Group` subject.
const EVERYONE: &[&str] = &[
    "system:authenticated",
    "system:unauthenticated",
    "system:anonymous",
    "system:serviceaccounts",
];

/// Whether a subject of `kind` named `name` is everyone ([`EVERYONE`]):
/// refused by default whatever wrote it ([`Waivers::everyone_bindings`]).
pub fn is_everyone(kind: &str, name: &str) -> bool {
    matches!(kind, "User" | "Group") && EVERYONE.contains(&name)
}

/// Whether a `User` or `Group` subject named `name` is one Kubernetes
/// reserves (`system:`): a rule may write one literally, but a value from
/// data never names one (ServiceAccount subjects are named without it).
pub fn is_system_subject(kind: &str, name: &str) -> bool {
    matches!(kind, "User" | "Group") && is_system_name(name)
}

/// The controller's own name: its ClusterRoles, bindings, leader-election
/// Role and allow-list are named this or `rbac-rules:*`
/// (deploy/controller/rbac.yaml, allow-list.yaml).
pub const CONTROLLER_NAME: &str = "rbac-rules";

/// The label Kubernetes puts on its bootstrap RBAC objects, and its value.
pub const BOOTSTRAP_LABEL: (&str, &str) = ("kubernetes.io/bootstrapping", "rbac-defaults");

/// Kubernetes' bootstrap ClusterRoles (and the ClusterRoleBinding
/// `cluster-admin`) without a `system:` name.
const BOOTSTRAP_NAMES: &[&str] = &["cluster-admin", "admin", "edit", "view"];

/// Label keys by which Kubernetes' bootstrap roles aggregate into each
/// other (`admin` ← `edit` ← `view`).
const BOOTSTRAP_AGGREGATION_LABELS: &[&str] = &[
    "rbac.authorization.k8s.io/aggregate-to-admin",
    "rbac.authorization.k8s.io/aggregate-to-edit",
    "rbac.authorization.k8s.io/aggregate-to-view",
];

/// Why an RBAC object of `kind` named `name` is protected: never emitted,
/// adopted, aggregated, revoked or pruned, whatever the input and the
/// flags. Kubernetes' bootstrap objects (`system:*`, and the ClusterRoles
/// `cluster-admin`, `admin`, `edit`, `view`) and the controller's own
/// ([`CONTROLLER_NAME`], `rbac-rules:*`). By name only; see
/// [`protected_by_labels`] for the bootstrap label.
pub fn protected_name(kind: &str, name: &str) -> Option<&'static str> {
    if is_system_name(name) {
        return Some("a name Kubernetes reserves for itself (system:)");
    }
    let cluster_scoped = matches!(kind, "ClusterRole" | "ClusterRoleBinding");
    if cluster_scoped && BOOTSTRAP_NAMES.contains(&name) {
        return Some("one of Kubernetes' bootstrap RBAC objects");
    }
    if name == CONTROLLER_NAME
        || name
            .strip_prefix(CONTROLLER_NAME)
            .is_some_and(|rest| rest.starts_with(':'))
    {
        return Some("one of the controller's own RBAC objects (rbac-rules, rbac-rules:*)");
    }
    None
}

/// Why an object whose label `kubernetes.io/bootstrapping` is `value` is
/// protected: Kubernetes made it (see [`protected_name`]).
pub fn protected_by_labels(bootstrapping: Option<&str>) -> Option<&'static str> {
    (bootstrapping == Some(BOOTSTRAP_LABEL.1)).then_some(
        "one of Kubernetes' bootstrap RBAC objects (kubernetes.io/bootstrapping: rbac-defaults)",
    )
}

/// Why an RBAC object is protected, by kind, name and labels (read through
/// `label`): [`protected_name`], then [`protected_by_labels`].
pub fn protected_object<'l>(
    kind: &str,
    name: &str,
    label: impl Fn(&str) -> Option<&'l str>,
) -> Option<&'static str> {
    protected_name(kind, name).or_else(|| protected_by_labels(label(BOOTSTRAP_LABEL.0)))
}

/// The labels protected ClusterRoles carry (those Kubernetes and
/// deploy/controller give them): an aggregation selector that matches one
/// of these sets would aggregate a protected role, whether or not the
/// role exists where the selector is judged (offline, say).
pub fn protected_label_sets() -> Vec<BTreeMap<String, String>> {
    let set = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let mut out = vec![
        set(&[BOOTSTRAP_LABEL]),
        set(&[("app.kubernetes.io/name", CONTROLLER_NAME)]),
        set(&[
            ("app.kubernetes.io/name", CONTROLLER_NAME),
            ("app.kubernetes.io/part-of", CONTROLLER_NAME),
            ("rbacrules.io/aggregate-to-controller", "true"),
        ]),
    ];
    for key in BOOTSTRAP_AGGREGATION_LABELS {
        out.push(set(&[BOOTSTRAP_LABEL, (key, "true")]));
    }
    out
}

/// Prefixes of the label keys protected objects are installed with (by
/// Kubernetes, by deploy/ or its Helm chart): a selector that picks a
/// protected role by these picks it by what it is; by any other label, by
/// what someone added to it.
const INSTALLED_LABEL_PREFIXES: &[&str] = &[
    "kubernetes.io/",
    "rbac.authorization.k8s.io/",
    "app.kubernetes.io/",
    "helm.sh/",
    "rbacrules.io/",
];

/// Whether any of these (validated) aggregation selectors selects a
/// protected role by the labels it was installed with (see
/// [`INSTALLED_LABEL_PREFIXES`]), given its labels.
pub fn selects_by_installed_labels<'l>(
    selectors: &[LabelSelector],
    labels: impl Iterator<Item = (&'l str, &'l str)>,
) -> bool {
    let installed: BTreeMap<String, String> = labels
        .filter(|(k, _)| INSTALLED_LABEL_PREFIXES.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    selectors
        .iter()
        .any(|s| crate::selector::matches_map(s, &installed))
}

/// Whether any of these (validated) aggregation selectors would select a
/// protected ClusterRole by the labels those carry
/// ([`protected_label_sets`]): an empty selector, the bootstrap label, the
/// bootstrap roles' aggregation labels, the controller's labels.
pub fn selects_protected_labels(selectors: &[LabelSelector]) -> bool {
    let sets = protected_label_sets();
    selectors.iter().any(|s| {
        sets.iter()
            .any(|labels| crate::selector::matches_map(s, labels))
    })
}

/// A permission that, once granted, lets the holder grant more than it
/// has: `(group, resource, verb)`; a resource ending in `/` is a prefix.
const ESCALATING: &[(&str, &str, &str)] = &[
    ("rbac.authorization.k8s.io", "roles", "escalate"),
    ("rbac.authorization.k8s.io", "clusterroles", "escalate"),
    ("rbac.authorization.k8s.io", "roles", "bind"),
    ("rbac.authorization.k8s.io", "clusterroles", "bind"),
    ("", "users", "impersonate"),
    ("", "groups", "impersonate"),
    ("", "serviceaccounts", "impersonate"),
    ("authentication.k8s.io", "userextras/", "impersonate"),
    ("authentication.k8s.io", "uids", "impersonate"),
];

/// Whether a resource entry of a granted rule reaches `target` (a prefix
/// when it ends in `/`), with RBAC's `*` and `*/sub` wildcards.
fn resource_reaches(entry: &str, target: &str) -> bool {
    if entry == ALL || entry == target {
        return true;
    }
    match target.strip_suffix('/') {
        Some(prefix) => {
            entry
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('/'))
                || entry.starts_with("*/")
        }
        None => false,
    }
}

/// Compact form of a permission: `[group] resource: verb`.
fn compact_permission(group: &str, resource: &str, verb: &str) -> String {
    let group = if group.is_empty() { "\"\"" } else { group };
    format!("[{group}] {resource}: {verb}")
}

/// The escalating permissions (escalate/bind on roles, impersonate) that
/// `rules` grant, judged as RBAC does (`*` counts), in compact form.
pub fn escalating_grants(rules: &[PolicyRule]) -> Vec<String> {
    let mut out = Vec::new();
    for rule in rules {
        for &(group, resource, verb) in ESCALATING {
            if !value_covered(&rule.verbs, verb) || !value_covered(list(&rule.api_groups), group) {
                continue;
            }
            for entry in list(&rule.resources) {
                if resource_reaches(entry, resource) {
                    let shown = if resource.ends_with('/') {
                        entry.as_str()
                    } else {
                        resource
                    };
                    let p = compact_permission(group, shown, verb);
                    if !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
    }
    out
}

/// Whether a rule is cluster-admin's: `*` verbs on `*` resources in `*`
/// API groups (`*` within a named group is not).
pub fn is_wildcard_all(rule: &PolicyRule) -> bool {
    has(&rule.verbs, ALL) && has(list(&rule.api_groups), ALL) && has(list(&rule.resources), ALL)
}

/// Compact form of a rule for messages: `[groups] resources: verbs`.
pub fn describe(rule: &PolicyRule) -> String {
    if let Some(urls) = rule.non_resource_urls.as_ref().filter(|u| !u.is_empty()) {
        return format!("{}: {}", urls.join(","), rule.verbs.join(","));
    }
    // The core group is written `""`, as in YAML: `[]` would read as none.
    let groups: Vec<&str> = list(&rule.api_groups)
        .iter()
        .map(|g| if g.is_empty() { "\"\"" } else { g.as_str() })
        .collect();
    let mut s = format!("[{}] {}", groups.join(","), list(&rule.resources).join(","));
    if let Some(names) = rule.resource_names.as_ref().filter(|n| !n.is_empty()) {
        s.push_str(&format!(" (names {})", names.join(",")));
    }
    s.push_str(&format!(": {}", rule.verbs.join(",")));
    s
}

/// Every rule of `rules` in compact form, those differing only in verbs
/// merged, preceded by how many there are when more than one: a refusal
/// names everything it refuses.
pub fn describe_all(rules: &[PolicyRule]) -> String {
    let mut merged: Vec<PolicyRule> = Vec::new();
    for r in rules {
        match merged.iter_mut().find(|m| {
            m.api_groups == r.api_groups
                && m.resources == r.resources
                && m.resource_names == r.resource_names
                && m.non_resource_urls == r.non_resource_urls
        }) {
            Some(m) => {
                for v in &r.verbs {
                    if !m.verbs.contains(v) {
                        m.verbs.push(v.clone());
                    }
                }
            }
            None => merged.push(r.clone()),
        }
    }
    let text: Vec<String> = merged.iter().map(describe).collect();
    match rules.len() {
        0 | 1 => text.join("; "),
        n => format!("{n} grants: {}", text.join("; ")),
    }
}

/// The default denials a list of grants breaks, each in compact form.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Denied {
    /// Cluster-admin equivalents (`*` on `*` in `*`).
    pub wildcards: Vec<String>,
    /// Grants that escalate (see [`escalating_grants`]).
    pub escalating: Vec<String>,
}

impl Denied {
    /// Whether no default denial is broken.
    pub fn is_empty(&self) -> bool {
        self.wildcards.is_empty() && self.escalating.is_empty()
    }

    /// Every broken denial: cluster-admin equivalents first.
    pub fn all(&self) -> impl Iterator<Item = &String> {
        self.wildcards.iter().chain(&self.escalating)
    }
}

/// The default denials `rules` (what an object grants) break, under
/// `waivers`: the one definition of the default denials.
pub fn denials(rules: &[PolicyRule], waivers: &Waivers) -> Denied {
    let wildcards = if waivers.wildcard_all {
        Vec::new()
    } else {
        rules
            .iter()
            .filter(|r| is_wildcard_all(r))
            .map(|r| format!("{} (cluster-admin equivalent)", describe(r)))
            .collect()
    };
    let escalating = if waivers.escalation_verbs {
        Vec::new()
    } else {
        escalating_grants(rules)
    };
    Denied {
        wildcards,
        escalating,
    }
}

/// Why `rules` (what an object grants) breaks a default denial, in compact
/// form; empty when they pass.
pub fn denied_grants(rules: &[PolicyRule], waivers: &Waivers) -> Vec<String> {
    let Denied {
        mut wildcards,
        escalating,
    } = denials(rules, waivers);
    wildcards.extend(escalating);
    wildcards
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::policy::tests::rule;

    #[test]
    fn escalation_is_judged_with_wildcards() {
        let w = Waivers::default();
        assert!(denied_grants(&[rule(&["apps"], &["deployments"], &["*"])], &w).is_empty());
        assert!(denied_grants(&[rule(&["example.org"], &["*"], &["*"])], &w).is_empty());
        let e = denied_grants(
            &[rule(
                &["rbac.authorization.k8s.io"],
                &["clusterroles"],
                &["escalate"],
            )],
            &w,
        );
        assert_eq!(e, ["[rbac.authorization.k8s.io] clusterroles: escalate"]);
        assert!(!denied_grants(&[rule(&["*"], &["roles"], &["*"])], &w).is_empty());
        assert!(!denied_grants(&[rule(&[""], &["*"], &["impersonate"])], &w).is_empty());
        assert!(
            !denied_grants(
                &[rule(
                    &["authentication.k8s.io"],
                    &["userextras/scopes"],
                    &["impersonate"]
                )],
                &w
            )
            .is_empty()
        );
        assert!(!denied_grants(&[rule(&["*"], &["*"], &["*"])], &w).is_empty());
        let all = Waivers {
            escalation_verbs: true,
            wildcard_all: true,
            ..Waivers::default()
        };
        assert!(denied_grants(&[rule(&["*"], &["*"], &["*"])], &all).is_empty());
    }

    #[test]
    fn protected_objects_by_name_and_label() {
        for (kind, name) in [
            ("ClusterRole", "cluster-admin"),
            ("ClusterRole", "admin"),
            ("ClusterRole", "edit"),
            ("ClusterRole", "view"),
            ("ClusterRoleBinding", "cluster-admin"),
            ("ClusterRole", "system:aggregate-to-edit"),
            ("RoleBinding", "system:controller:bootstrap-signer"),
            ("ClusterRole", "rbac-rules"),
            ("ClusterRole", "rbac-rules:allow-list"),
            ("ClusterRoleBinding", "rbac-rules"),
            ("Role", "rbac-rules:leader-election"),
        ] {
            assert!(protected_name(kind, name).is_some(), "{kind} {name}");
        }
        for (kind, name) in [
            ("Role", "edit"),
            ("RoleBinding", "view"),
            ("ClusterRole", "rbac-rules-extra"),
            ("ClusterRole", "example:rbac-rules"),
            ("ClusterRole", "editor"),
        ] {
            assert!(protected_name(kind, name).is_none(), "{kind} {name}");
        }
        assert!(
            protected_object("Role", "x", |k| (k == BOOTSTRAP_LABEL.0)
                .then_some("rbac-defaults"))
            .is_some()
        );
        assert!(
            protected_object("Role", "x", |k| (k == BOOTSTRAP_LABEL.0).then_some("other"))
                .is_none()
        );
    }

    #[test]
    fn everyone_and_system_subjects() {
        assert!(is_everyone("Group", "system:authenticated"));
        assert!(is_everyone("Group", "system:unauthenticated"));
        assert!(is_everyone("Group", "system:serviceaccounts"));
        assert!(is_everyone("User", "system:anonymous"));
        assert!(!is_everyone("Group", "system:serviceaccounts:team-a"));
        assert!(!is_everyone("ServiceAccount", "system:authenticated"));
        assert!(is_system_subject("Group", "system:masters"));
        assert!(!is_system_subject("ServiceAccount", "system:x"));
        assert!(!is_system_subject("User", "alice"));
    }

    #[test]
    fn selectors_of_protected_roles() {
        let sel = |v: serde_json::Value| -> LabelSelector {
            serde_json::from_value(v).expect("selector")
        };
        for s in [
            serde_json::json!({}),
            serde_json::json!({"matchLabels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}),
            serde_json::json!({"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}),
            serde_json::json!({"matchLabels": {"rbacrules.io/aggregate-to-controller": "true"}}),
            serde_json::json!({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}),
        ] {
            assert!(selects_protected_labels(&[sel(s.clone())]), "{s}");
        }
        for s in [
            serde_json::json!({"matchLabels": {"rbac.example.org/aggregate-to-edit": "true"}}),
            serde_json::json!({"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"},
                "matchExpressions": [{"key": "kubernetes.io/bootstrapping", "operator": "DoesNotExist"}]}),
        ] {
            assert!(!selects_protected_labels(&[sel(s.clone())]), "{s}");
        }
    }
}
