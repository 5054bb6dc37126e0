//! Policy over RBAC grants, in three parts: what a grant means and covers
//! ([`rbac`]: Kubernetes' own rule semantics and role aggregation), what no
//! output may do ([`denials`]: the default denials and their waivers), and
//! what an installation allows ([`allow`]: the allow-list). Every public
//! item is re-exported here: callers name `crate::policy::X`.

pub mod allow;
pub mod denials;
pub mod effective;
pub mod rbac;

pub use allow::*;
pub use denials::*;
pub use effective::*;
pub use rbac::*;

/// What the tests of each part build rules with.
#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::api::rbac::v1::PolicyRule;

    /// A resource rule of these groups, resources and verbs.
    pub(crate) fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
        PolicyRule {
            api_groups: Some(groups.iter().map(|s| s.to_string()).collect()),
            resources: Some(resources.iter().map(|s| s.to_string()).collect()),
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            ..PolicyRule::default()
        }
    }
}
