//! Effective grants: what an aggregated ClusterRole or a copy (`rulesFrom`)
//! really grants is the union of the roles it selects, managed or not, so
//! the parts someone else wrote are judged too (docs/security.md, "Who
//! writes what").
//!
//! Two writers meet in a selection. The rule author writes the selector
//! (grammar); whoever may label ClusterRoles decides which roles carry the
//! selected labels (data). Kubernetes lets the second label a role only
//! when they hold everything it grants (or `escalate`): its RBAC storage
//! checks every ClusterRole write, a label-only update included, against
//! the writer's own permissions (pkg/registry/rbac/clusterrole/policybased,
//! `ConfirmNoEscalation`). So:
//!
//! - a role that breaks a default denial (cluster-admin equivalents,
//!   escalate, bind, impersonate) can only be labelled in by someone who
//!   already holds that, an admin in all but name: judged against the
//!   binding of the aggregate whoever put it there;
//! - a role that only misses the allow-list may have been labelled in by a
//!   powerful but not all-powerful user: it counts against the binding
//!   when the rule's selector picks it by a label the rule chose
//!   ([`joined_by_aggregation_label`] false), and is a notice when it joined
//!   through a label whose only meaning is "aggregate me" (`…/aggregate-to-*`),
//!   which its writer put there to join.
//!
//! A copy is the controller's own write, so it can leave sources out:
//! see [`copy_refusal`].

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{Map, Value};

use super::{AllowList, Waivers, denied_grants, describe_all};

/// The name part of a label key that marks a role for aggregation, by
/// Kubernetes' convention (`rbac.authorization.k8s.io/aggregate-to-edit`,
/// `rbac.example.org/aggregate-to-ns-view`).
const AGGREGATION_KEY_PREFIX: &str = "aggregate-to-";

/// Whether a label key is an aggregation label: its name part (after the
/// last `/`) starts with `aggregate-to-`.
pub fn is_aggregation_key(key: &str) -> bool {
    key.rsplit('/')
        .next()
        .is_some_and(|name| name.starts_with(AGGREGATION_KEY_PREFIX))
}

/// Whether a role with `labels` is picked by one of `selectors` (validated)
/// whose every key is an aggregation label ([`is_aggregation_key`]): it
/// joined the aggregate by a label that only asks for aggregation, put on
/// it by whoever wrote the role (who holds what it grants), rather than
/// being picked by a label it carries for another purpose, which is the
/// rule author's choice.
pub fn joined_by_aggregation_label(
    selectors: &[LabelSelector],
    labels: Option<&Map<String, Value>>,
) -> bool {
    selectors.iter().any(|s| {
        let keys = s.match_labels.iter().flatten().map(|(k, _)| k.as_str());
        let keys = keys.chain(s.match_expressions.iter().flatten().map(|e| e.key.as_str()));
        let mut any = false;
        let mut all = true;
        for k in keys {
            any = true;
            all &= is_aggregation_key(k);
        }
        any && all && crate::selector::matches_json(s, labels)
    })
}

/// Why a source of a copy that no rule manages and that only
/// `clusterRoleSelector` found is left out (a warning's text).
pub const LEFT_OUT_UNMANAGED: &str = "selected by clusterRoleSelector, but no rule manages it: left out of the copy (a label is data, not the rule's choice; name the role in clusterRoleNames to copy it)";

/// The start of why a source whose rules policy refuses is left out of a
/// copy (a warning's text); what it grants follows.
pub const LEFT_OUT_REFUSED: &str = "left out of the copy: it grants ";

/// Why the rules of a ClusterRole may not be copied into another role by
/// `rulesFrom`: the default denials they break and what the allow-list
/// (its effective rules given) does not cover of them; `None` when they
/// pass. Judged source by source, so a refused source is left out of the
/// copy and the others are copied: the denials and the allow-list judge
/// each granted tuple on its own, so the union of sources that pass
/// passes.
pub fn copy_refusal(
    rules: &[PolicyRule],
    waivers: &Waivers,
    allow: Option<(&AllowList, &[PolicyRule])>,
) -> Option<String> {
    let mut why = denied_grants(rules, waivers);
    if let Some((allow, effective)) = allow
        && !rules.is_empty()
    {
        let missing = allow.uncovered(effective, rules);
        if !missing.is_empty() {
            why.push(format!(
                "what the allow-list does not: {}",
                describe_all(&missing)
            ));
        }
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// Members an aggregate's binding is refused for, listed (the first
/// three, then how many more); `None` when there are none.
pub fn describe_members(found: &[String]) -> Option<String> {
    const SHOWN: usize = 3;
    let (first, rest) = found.split_at(found.len().min(SHOWN));
    match (first, rest.len()) {
        ([], _) => None,
        (first, 0) => Some(first.join("; ")),
        (first, more) => Some(format!("{} (and {more} more)", first.join("; "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::rule;

    fn sel(v: Value) -> LabelSelector {
        serde_json::from_value(v).expect("selector")
    }

    #[test]
    fn aggregation_keys() {
        assert!(is_aggregation_key("rbac.example.org/aggregate-to-edit"));
        assert!(is_aggregation_key("aggregate-to-team"));
        assert!(!is_aggregation_key("app.kubernetes.io/part-of"));
        assert!(!is_aggregation_key("aggregate-to-x/name"));
    }

    #[test]
    fn joined_by_aggregation_labels_only() {
        let labels = serde_json::json!({
            "rbac.example.org/aggregate-to-edit": "true",
            "app.kubernetes.io/part-of": "argocd",
        });
        let labels = labels.as_object();
        let channel =
            sel(serde_json::json!({"matchLabels": {"rbac.example.org/aggregate-to-edit": "true"}}));
        let chosen =
            sel(serde_json::json!({"matchLabels": {"app.kubernetes.io/part-of": "argocd"}}));
        let mixed = sel(serde_json::json!({"matchLabels": {
            "rbac.example.org/aggregate-to-edit": "true",
            "app.kubernetes.io/part-of": "argocd",
        }}));
        assert!(joined_by_aggregation_label(
            std::slice::from_ref(&channel),
            labels
        ));
        assert!(!joined_by_aggregation_label(
            std::slice::from_ref(&chosen),
            labels
        ));
        assert!(!joined_by_aggregation_label(&[mixed], labels));
        assert!(joined_by_aggregation_label(
            &[chosen, channel.clone()],
            labels
        ));
        assert!(!joined_by_aggregation_label(&[channel], None));
        assert!(!joined_by_aggregation_label(
            &[sel(serde_json::json!({}))],
            labels
        ));
    }

    #[test]
    fn copies_are_judged_by_source() {
        let w = Waivers::default();
        assert!(copy_refusal(&[rule(&["apps"], &["deployments"], &["get"])], &w, None).is_none());
        let why = copy_refusal(&[rule(&["*"], &["*"], &["*"])], &w, None).expect("refused");
        assert!(why.contains("cluster-admin equivalent"), "{why}");
        let allow = AllowList {
            rules: vec![rule(&["apps"], &["deployments"], &["get"])],
            ..AllowList::default()
        };
        let a = Some((&allow, allow.rules.as_slice()));
        assert!(copy_refusal(&[rule(&["apps"], &["deployments"], &["get"])], &w, a).is_none());
        let why = copy_refusal(&[rule(&["batch"], &["jobs"], &["get"])], &w, a).expect("refused");
        assert!(why.contains("allow-list"), "{why}");
    }
}
