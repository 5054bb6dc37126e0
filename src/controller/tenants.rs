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
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, Patch, PatchParams};
use kube::runtime::watcher::Event;
use kube::{Client, Resource};
use serde_json::json;

use super::Error;
use super::wire::Wire;
use super::world::{Feed, Source};
use crate::api::{NamespacedRbacRule, RbacRule, RbacRuleSpec, RbacRuleStatus};

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

/// A NamespacedRbacRule event, each rule typed alone (as for RbacRules):
/// one that cannot be read is reported and left out; its deletion still
/// counts, by namespace and name.
pub fn feed(ev: Event<Wire>, ar: &ApiResource) -> Feed {
    let typed = |w: Wire| -> Result<RbacRule, String> {
        if let Some(why) = w.refusal(ar) {
            return Err(why);
        }
        let value = w.into_value(ar);
        let at = format!(
            "{}/{}",
            value["metadata"]["namespace"].as_str().unwrap_or_default(),
            value["metadata"]["name"].as_str().unwrap_or_default()
        );
        let rule: NamespacedRbacRule = serde_json::from_value(value)
            .map_err(|e| format!("{KIND} {at}: cannot be read: {e}"))?;
        if rule
            .metadata
            .namespace
            .as_deref()
            .unwrap_or_default()
            .is_empty()
        {
            return Err(format!("{KIND} {at}: has no namespace"));
        }
        Ok(carrier(rule))
    };
    let ev = match ev {
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
        Event::Apply(w) => match typed(w) {
            Ok(r) => Event::Apply(r),
            Err(why) => return refused(why),
        },
        Event::InitApply(w) => match typed(w) {
            Ok(r) => Event::InitApply(r),
            Err(why) => return refused(why),
        },
        Event::Delete(w) => match typed(w.clone()) {
            Ok(r) => Event::Delete(r),
            Err(_) => match gone(w, ar) {
                Some(r) => Event::Delete(r),
                None => return refused(format!("a deleted {KIND} without a name")),
            },
        },
    };
    Feed::Tenants(Box::new(ev))
}

/// The deletion of a tenant rule that cannot be read whole: its metadata
/// is what a deletion needs.
fn gone(w: Wire, ar: &ApiResource) -> Option<RbacRule> {
    let meta: ObjectMeta =
        serde_json::from_value(w.into_value(ar).get("metadata")?.clone()).ok()?;
    meta.name.as_ref()?;
    meta.namespace.as_ref()?;
    let mut rule = RbacRule::new(
        "",
        RbacRuleSpec {
            manage_level: Default::default(),
            deletion_policy: Default::default(),
            trigger: None,
            related: Vec::new(),
            params: Vec::new(),
            vars: Vec::new(),
            outputs: Vec::new(),
        },
    );
    rule.metadata = meta;
    Some(rule)
}

fn refused(why: String) -> Feed {
    tracing::warn!(source = "NamespacedRbacRules", reason = %why, "object refused");
    Feed::Error(
        Source::Tenants,
        kube::runtime::watcher::Error::WatchFailed(kube::Error::SerdeError(
            <serde_json::Error as serde::de::Error>::custom(why),
        )),
    )
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

    fn rule(ns: Option<&str>, name: &str) -> RbacRule {
        let mut r = RbacRule::new(
            name,
            serde_json::from_value(json!({"outputs": []})).unwrap(),
        );
        r.metadata.namespace = ns.map(str::to_string);
        r
    }

    fn list(w: &mut super::super::world::World, tenant: bool, rules: Vec<RbacRule>) {
        let feed = |ev| {
            if tenant {
                Feed::Tenants(Box::new(ev))
            } else {
                Feed::Rules(Box::new(ev))
            }
        };
        w.apply(feed(Event::Init));
        for r in rules {
            w.apply(feed(Event::InitApply(r)));
        }
        w.apply(feed(Event::InitDone));
    }

    /// A relist of either watch replaces only its own kind's rules, and a
    /// tenant rule named like a cluster rule is another rule.
    #[test]
    fn each_watchs_list_replaces_only_its_own_rules() {
        let mut w = super::super::world::World::new(None);
        list(&mut w, false, vec![rule(None, "r")]);
        list(
            &mut w,
            true,
            vec![rule(Some("team-a"), "r"), rule(Some("team-b"), "r")],
        );
        let keys = |w: &super::super::world::World| w.rules.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&w), ["r", "team-a/r", "team-b/r"]);
        list(&mut w, false, vec![]);
        assert_eq!(keys(&w), ["team-a/r", "team-b/r"]);
        list(&mut w, true, vec![rule(Some("team-b"), "r")]);
        assert_eq!(keys(&w), ["team-b/r"]);
        w.apply(Feed::Tenants(Box::new(Event::Delete(rule(
            Some("team-b"),
            "r",
        )))));
        assert!(w.rules.is_empty());
    }

    /// Without the NamespacedRbacRule kind (its CRD not installed), the
    /// controller is not held up: the tenant list counts as empty, once.
    #[test]
    fn an_unserved_tenant_kind_is_an_empty_list() {
        let mut w = super::super::world::World::new(None);
        list(&mut w, false, vec![rule(None, "r")]);
        let not_found = || {
            let status = kube::core::Status::failure("not found", "NotFound").with_code(404);
            kube::runtime::watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status)))
        };
        let change = w.apply(Feed::Error(Source::Tenants, not_found()));
        assert!(change.rules);
        assert_eq!(w.rules.keys().collect::<Vec<_>>(), ["r"]);
        // The watcher retries with backoff: again 404, no new pass.
        let again = w.apply(Feed::Error(Source::Tenants, not_found()));
        assert!(!again.rules && !again.dirty);
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
