//! What of an observed object the engine keeps: only what some rule may
//! read. Memory follows the rules, not the cluster: a CRD's schema (tens to
//! hundreds of KB) is dropped as it is loaded when every rule reads only
//! CRDs' metadata.

use serde_json::Value;

use super::RuleSource;
use super::compile::{Interest, interests_of, merge_interests};
use super::kinds::output_gk;
use super::store::{GroupKind, group_of};
use crate::api::OutputKind;

/// Every kind the rules read, and whether only metadata: the same answer
/// [`super::Engine::interests`] gives, from the rules alone.
///
/// A NamespacedRbacRule reads what its confined spec reads
/// ([`super::tenant::confine`]): Secrets as metadata only, so that no
/// Secret's data is held for it.
pub fn interests(rules: &[RuleSource]) -> Vec<Interest> {
    merge_interests(rules.iter().flat_map(|r| {
        let tenancy = super::tenant::Tenancy::default();
        match super::tenant::confine(&r.name, r.namespace.as_deref(), &r.spec, &tenancy) {
            Ok(spec) => interests_of(&spec),
            // A rule that cannot be confined does not run.
            Err(_) => Vec::new(),
        }
    }))
}

/// The kinds whose objects the store may hold packed
/// ([`super::store::ObjectStore::pack_kinds`]): those every rule reads one
/// object at a time ([`Interest::packable`]: triggers), never an output
/// kind (policy and the live cache read those throughout).
pub fn packable_kinds<'a>(
    interests: impl IntoIterator<Item = &'a Interest>,
) -> std::collections::BTreeSet<GroupKind> {
    interests
        .into_iter()
        .filter(|i| i.packable && super::kinds::output_kind(&i.gk).is_none())
        .map(|i| i.gk.clone())
        .collect()
}

/// Shapes objects to what rules read, by kind.
pub struct Shaper {
    interests: Vec<Interest>,
}

impl Shaper {
    /// A shaper for rules with these interests.
    pub fn new(interests: Vec<Interest>) -> Shaper {
        Shaper { interests }
    }

    /// `obj` as the engine needs it: RBAC objects whole (policy, aggregation
    /// and the live objects rules keep read them); a kind some rule reads
    /// beyond metadata, what its readers see (whole, or the union of their
    /// `fields`); any other kind as its `apiVersion`, `kind` and
    /// `metadata`. Never `metadata.managedFields`, which no rule sees.
    pub fn shape(&self, mut obj: Value) -> Value {
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        let Some(gk) = GroupKind::of(&obj) else {
            return obj;
        };
        if OutputKind::ALL.iter().any(|k| output_gk(*k) == gk) {
            return obj;
        }
        match self.interests.iter().find(|i| i.gk == gk) {
            // Read by some rule: what its readers see.
            Some(i) if !i.metadata_only => i.keep(obj),
            _ => match obj {
                Value::Object(mut m) => {
                    m.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata"));
                    Value::Object(m)
                }
                other => other,
            },
        }
    }
}

impl Shaper {
    /// Whether [`Shaper::shape`] drops the whole top-level field `key` of
    /// an object of `api_version` and `kind`: asked while the object is
    /// parsed, so that the field is never built (a CRD's schema when rules
    /// read CRDs' metadata). The same answer as `shape`'s, field by field:
    /// `apiVersion`, `kind` and `metadata` are never dropped; an RBAC
    /// object keeps every field; a kind read beyond metadata keeps what a
    /// path of its readers' `fields` starts with (all with no `fields`);
    /// any other kind keeps nothing else.
    pub fn drops(&self, api_version: &str, kind: &str, key: &str) -> bool {
        if matches!(key, "apiVersion" | "kind" | "metadata") {
            return false;
        }
        let group = group_of(api_version);
        let is = |gk: &GroupKind| gk.group == group && gk.kind == kind;
        if OutputKind::ALL.iter().any(|k| is(&output_gk(*k))) {
            return false;
        }
        match self.interests.iter().find(|i| is(&i.gk)) {
            Some(i) if !i.metadata_only => match &i.fields {
                Some(paths) => !paths.iter().any(|p| p.first().is_some_and(|f| f == key)),
                None => false,
            },
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn interest(group: &str, kind: &str, metadata_only: bool) -> Interest {
        Interest {
            gk: GroupKind::new(group, kind),
            version: None,
            metadata_only,
            fields: None,
            packable: false,
        }
    }

    #[test]
    fn keeps_what_rules_read() {
        let s = Shaper::new(vec![
            interest("apiextensions.k8s.io", "CustomResourceDefinition", true),
            interest("apps", "Deployment", false),
        ]);
        let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "a.b.c", "managedFields": [{}], "ownerReferences": [{"uid": "u"}]},
            "spec": {"versions": [{"schema": {}}]}});
        assert_eq!(
            s.shape(crd),
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                   "metadata": {"name": "a.b.c", "ownerReferences": [{"uid": "u"}]}})
        );
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "managedFields": [{}]}, "spec": {"replicas": 1}});
        assert_eq!(s.shape(d)["spec"]["replicas"], 1);
        // Nobody reads Secrets: metadata only (still named, still checked).
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"k": "dg=="}});
        assert!(s.shape(secret).get("data").is_none());
        // RBAC objects stay whole.
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "r"}, "rules": [{"verbs": ["get"]}]});
        assert!(s.shape(role).get("rules").is_some());
    }

    /// `drops` answers, field by field, what `shape` keeps of each kind.
    #[test]
    fn drops_what_shape_drops() {
        let mut fielded = interest("example.org", "Revision", false);
        fielded.fields = Some(super::super::path::seen_fields(&[
            "status.objectRefs".into()
        ]));
        let s = Shaper::new(vec![
            interest("apiextensions.k8s.io", "CustomResourceDefinition", true),
            interest("apps", "Deployment", false),
            fielded,
        ]);
        let cases = [
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
            ("apps/v1", "Deployment"),
            ("example.org/v1", "Revision"),
            ("v1", "Secret"),
            ("rbac.authorization.k8s.io/v1", "ClusterRole"),
        ];
        for (api_version, kind) in cases {
            let obj = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "n"},
                "spec": {"a": 1}, "status": {"objectRefs": [], "b": 2}, "rules": [], "data": {}});
            let kept = s.shape(obj.clone());
            for key in obj.as_object().unwrap().keys() {
                assert_eq!(
                    s.drops(api_version, kind, key),
                    kept.get(key).is_none(),
                    "{kind}.{key}"
                );
            }
        }
    }
}
