//! The allow-list: when set, every emitted grant must be covered by it.

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::rbac::*;

/// An API group that only a CustomResourceDefinition can define: a DNS
/// subdomain with a dot, not a Kubernetes group (`*.k8s.io`,
/// `*.kubernetes.io`). The same test as the rule language's
/// `format: customGroup`.
pub fn is_custom_group(group: &str) -> bool {
    crate::engine::format::is_custom_group(group)
}

/// Annotation on the allow-list ClusterRole that lets grants on custom
/// (CRD) API groups pass.
pub const ALLOW_CUSTOM_GROUPS_ANNOTATION: &str = "rbacrules.io/allow-custom-groups";

/// The allow-list: a ClusterRole's rules, or, when it is aggregated, the
/// rules of the ClusterRoles its selectors pick.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AllowList {
    /// The role's own rules (ignored when `selectors` is not empty).
    pub rules: Vec<PolicyRule>,
    /// The role's `aggregationRule` selectors: its effective rules are
    /// those of the roles they select, and no output may carry labels
    /// they select.
    pub selectors: Vec<LabelSelector>,
    /// Grants whose API groups are all custom groups pass
    /// ([`ALLOW_CUSTOM_GROUPS_ANNOTATION`]).
    pub custom_groups: bool,
}

impl AllowList {
    /// The allow-list a ClusterRole describes.
    pub fn from_cluster_role(role: &ClusterRole) -> AllowList {
        AllowList {
            rules: role.rules.clone().unwrap_or_default(),
            selectors: selectors(role).map(<[_]>::to_vec).unwrap_or_default(),
            custom_groups: role
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ALLOW_CUSTOM_GROUPS_ANNOTATION))
                .is_some_and(|v| v == "true"),
        }
    }

    /// Whether the allow-list is aggregated.
    pub fn is_aggregated(&self) -> bool {
        !self.selectors.is_empty()
    }

    /// The tuples of `requested` that `effective` (the allow-list's rules)
    /// does not cover, as single-value rules; with `custom_groups`, a tuple
    /// in a custom API group passes.
    pub fn uncovered(&self, effective: &[PolicyRule], requested: &[PolicyRule]) -> Vec<PolicyRule> {
        let (_, missing) = covers(effective, requested);
        missing
            .into_iter()
            .filter(|r| {
                !(self.custom_groups
                    && r.non_resource_urls.is_none()
                    && list(&r.api_groups).iter().all(|g| is_custom_group(g)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::policy::tests::rule;

    #[test]
    fn custom_groups() {
        assert!(is_custom_group("example.org"));
        assert!(!is_custom_group("apps"));
        assert!(!is_custom_group("rbac.authorization.k8s.io"));
        assert!(!is_custom_group("x.kubernetes.io"));
        assert!(!is_custom_group("*.example.org"));
        let a = AllowList {
            custom_groups: true,
            ..AllowList::default()
        };
        assert!(
            a.uncovered(&[], &[rule(&["example.org"], &["widgets"], &["get"])])
                .is_empty()
        );
        assert_eq!(
            a.uncovered(&[], &[rule(&["apps"], &["deployments"], &["get"])])
                .len(),
            1
        );
    }
}
