//! rbac-rules: a rule-driven Kubernetes RBAC controller.
//!
//! `RbacRule` objects ([`api`]) say when (a trigger kind) and what (role and
//! binding templates). The pure [`engine`] turns rules and observed objects
//! into desired objects; [`render`] runs it offline on YAML files and
//! [`controller`] keeps a cluster equal to it.

pub mod api;
pub mod controller;
pub mod delegation;
pub mod diff;
pub mod engine;
pub mod explain;
pub mod installed;
pub mod params;
pub mod policy;
pub mod reference;
pub mod render;
pub mod rules;
pub mod ruletest;
pub mod selector;
pub mod validate;
pub mod yaml;

use kube::CustomResourceExt;

/// The RbacRule CRD as YAML, exactly what `crds/` holds.
pub fn crd_yaml() -> Result<String, yaml::YamlError> {
    yaml::to_yaml(&api::RbacRule::crd())
}

/// The NamespacedRbacRule CRD (tenant rules) as YAML, exactly what
/// `crds/namespacedrbacrules.rbacrules.io.yaml` holds.
pub fn namespaced_crd_yaml() -> Result<String, yaml::YamlError> {
    yaml::to_yaml(&api::NamespacedRbacRule::crd())
}

/// Parses a `--manage` value.
pub fn parse_manage(s: &str) -> Result<api::ManageLevel, String> {
    match s {
        "serviceaccounts" => Ok(api::ManageLevel::ServiceAccounts),
        "basic" => Ok(api::ManageLevel::Basic),
        "all" => Ok(api::ManageLevel::All),
        other => Err(format!(
            "{other:?} is not one of serviceaccounts, basic, all"
        )),
    }
}
