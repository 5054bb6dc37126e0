//! Tenant rules (`NamespacedRbacRule`) in the controller.
//!
//! The controller carries a tenant rule as an [`RbacRule`] whose
//! `metadata.namespace` is the rule's namespace, keyed `<namespace>/<name>`
//! (the key the engine's reports use: `'/'` never occurs in a cluster
//! rule's name, so the two never collide). Everything keyed by rule name
//! (holds, plans, reports, counts) then works unchanged; what differs is
//! where the rule lives: its status goes to the namespaced object's status
//! subresource and its Events to its namespace, about it.
//!
//! The engine confines a tenant rule (reads, outputs, ceiling, budgets):
//! the controller only hands it over with its namespace
//! ([`namespace_of`]).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource};
use serde_json::json;

use super::Error;
use crate::api::{NamespacedRbacRule, RbacRule, RbacRuleStatus};

/// Kind of a tenant rule, as Events and errors name it.
pub const KIND: &str = "NamespacedRbacRule";

/// The key of a rule in the controller's maps and the engine's reports:
/// `<namespace>/<name>` for a tenant rule, the name for a cluster rule.
pub fn key_of(rule: &RbacRule) -> String {
    let name = rule.metadata.name.clone().unwrap_or_default();
    match rule.metadata.namespace.as_deref() {
        Some(ns) => format!("{ns}/{name}"),
        None => name,
    }
}

/// The namespace a rule key names: `Some` for a tenant rule's key
/// (`<namespace>/<name>`), `None` for a cluster rule's.
pub fn namespace_of(key: &str) -> Option<String> {
    key.split_once('/').map(|(ns, _)| ns.to_string())
}

/// Whether a rule key is a tenant rule's.
pub fn is_tenant_key(key: &str) -> bool {
    key.contains('/')
}

/// The controller's carrier of a tenant rule: the same spec and status,
/// the namespaced object's metadata (its namespace says it is a tenant's).
pub fn carrier(rule: NamespacedRbacRule) -> RbacRule {
    RbacRule {
        metadata: rule.metadata,
        spec: rule.spec.rule,
        status: rule.status,
    }
}

/// Writes a tenant rule's status: a merge patch on the status subresource
/// of the NamespacedRbacRule in its namespace.
pub async fn patch_status(
    client: &Client,
    namespace: &str,
    name: &str,
    status: &RbacRuleStatus,
) -> Result<(), Error> {
    let api: Api<NamespacedRbacRule> = Api::namespaced(client.clone(), namespace);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .map_err(|source| Error::Api {
        action: "patch status",
        object: format!("{KIND} {namespace}/{name}"),
        source,
    })?;
    Ok(())
}

/// What a rule's Events are about: the RbacRule, or for a tenant rule the
/// NamespacedRbacRule (so its Events land in the rule's namespace, where
/// the team that wrote it can read them).
pub fn reference(rule: &RbacRule) -> ObjectReference {
    let mut reference = rule.object_ref(&());
    if rule.metadata.namespace.is_some() {
        reference.kind = Some(KIND.to_string());
        reference.api_version = Some(NamespacedRbacRule::api_version(&()).into_owned());
        reference.namespace = rule.metadata.namespace.clone();
    }
    reference
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_tell_tenant_rules_from_cluster_rules() {
        let mut r = RbacRule::new("r", serde_json::from_value(json!({"outputs": []})).unwrap());
        assert_eq!(key_of(&r), "r");
        assert_eq!(namespace_of(&key_of(&r)), None);
        r.metadata.namespace = Some("team-a".into());
        assert_eq!(key_of(&r), "team-a/r");
        assert_eq!(namespace_of("team-a/r").as_deref(), Some("team-a"));
        assert!(is_tenant_key("team-a/r") && !is_tenant_key("r"));
    }

    #[test]
    fn a_tenant_rules_events_are_about_it_in_its_namespace() {
        let mut r = RbacRule::new("r", serde_json::from_value(json!({"outputs": []})).unwrap());
        r.metadata.namespace = Some("team-a".into());
        r.metadata.uid = Some("u1".into());
        let reference = reference(&r);
        assert_eq!(reference.kind.as_deref(), Some(KIND));
        assert_eq!(
            reference.api_version.as_deref(),
            Some("rbacrules.io/v1alpha1")
        );
        assert_eq!(reference.namespace.as_deref(), Some("team-a"));
        assert_eq!(reference.name.as_deref(), Some("r"));
        assert_eq!(reference.uid.as_deref(), Some("u1"));
    }
}
