//! Outputs (`spec.outputs[]`, docs/rules.md "Outputs and their
//! validation", "rulesFrom", "Provenance", "ownerReferences"): each output
//! renders one object, or one per `forEach` item for which `when` holds,
//! checked against Kubernetes' own validation. Within one trigger the
//! same object twice is emitted once, or, with different content, is a
//! `Conflict` of the trigger.
//!
//! Fast twin: `engine/outputs.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use handlebars::Context;
use serde_json::Value;

use super::run::Result;
use super::trigger::Render;
use super::values::Marked;
use super::world::Seen;
use crate::api::{DeletionPolicy, GROUP, Output, OutputKind, RulesFrom};
use crate::engine::compile::gk_of;
use crate::engine::error::{FieldError, FieldWarning};
use crate::engine::manifest::{Body, Meta, OwnerRef};
use crate::engine::output::{self, MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use crate::engine::store::{key_of, object_ref};
use crate::engine::tenant;
use crate::engine::{Desired, ErrorKind, GroupKind, Manifest};
use crate::policy;

impl Render<'_> {
    /// Renders every output, in order.
    pub fn outputs(&self, ctx: &mut Context) -> Result<Vec<Desired>> {
        let mut out: Vec<Desired> = Vec::new();
        for (i, o) in self.rule.spec.outputs.iter().enumerate() {
            let f = format!("spec.outputs[{i}]");
            let mut one = |ctx: &mut Context| self.one_output(&f, o, ctx, &mut out);
            match &o.for_each {
                None => one(ctx)?,
                Some(e) => {
                    let var = o.as_name.as_deref().unwrap_or("item");
                    self.for_each(&format!("{f}.forEach"), e, var, ctx, one)?;
                }
            }
        }
        Ok(out)
    }

    /// One object of an output, when its `when` holds, added to `out`.
    fn one_output(
        &self,
        f: &str,
        o: &Output,
        ctx: &mut Context,
        out: &mut Vec<Desired>,
    ) -> Result<()> {
        if let Some(w) = &o.when
            && !self.truthy(&format!("{f}.when"), w, ctx)?
        {
            return Ok(());
        }
        let d = self.object(f, o, ctx)?;
        let same_key =
            |p: &&Desired| p.kind == d.kind && p.namespace == d.namespace && p.name == d.name;
        match out.iter().find(same_key) {
            Some(prev) if prev.object != d.object => {
                let message = format!(
                    "{} {:?} is emitted twice with different content",
                    d.kind, d.name
                );
                Err(FieldError::new(ErrorKind::Conflict, f, message))
            }
            Some(_) => Ok(()),
            None => {
                out.push(d);
                Ok(())
            }
        }
    }

    /// Renders and validates one object.
    fn object(&self, f: &str, o: &Output, ctx: &mut Context) -> Result<Desired> {
        let name = self.tpl(&format!("{f}.name"), &o.name, ctx)?;
        output::validate_name(format!("{f}.name"), &name)?;
        tenant::check_output_name(&self.rule.name, o.kind, format!("{f}.name"), &name)?;
        let namespace = self.namespace(f, o, ctx)?;
        let (labels, annotations) = self.metadata(f, o, ctx)?;
        let (body, refusal) = if o.kind.is_role() {
            self.role_body(f, o, ctx)?
        } else {
            self.binding_body(f, o, ctx)?
        };
        let meta = Meta {
            name: name.clone(),
            namespace: namespace.clone(),
            labels: labels.into(),
            annotations: annotations.into(),
            owner: self
                .trigger
                .and_then(|t| owner_reference(t, namespace.as_deref())),
        };
        let object = Manifest::new(o.kind, meta, body);
        output::validate_object_size(f, &object)?;
        Ok(Desired {
            kind: o.kind,
            namespace: namespace.unwrap_or_default(),
            name,
            rule: self.rule.name.as_str().into(),
            trigger: self.trigger.map(|t| object_ref(t).into()),
            field: f.into(),
            refusal,
            object,
        })
    }

    /// `namespace` (Role, RoleBinding): rendered, or the trigger's
    /// namespace, or the trigger's name when it is a Namespace.
    fn namespace(&self, f: &str, o: &Output, ctx: &Context) -> Result<Option<String>> {
        if !o.kind.namespaced() {
            return Ok(None);
        }
        let ns = match &o.namespace {
            Some(t) => self.tpl(&format!("{f}.namespace"), t, ctx)?,
            None => default_namespace(self.trigger).ok_or_else(|| {
                let message = format!(
                    "a {} needs a namespace: the trigger has none, so give one",
                    o.kind
                );
                FieldError::new(ErrorKind::InvalidRule, format!("{f}.namespace"), message)
            })?,
        };
        output::validate_namespace(format!("{f}.namespace"), &ns)?;
        Ok(Some(ns))
    }

    /// Labels and annotations, validated, with the provenance added.
    fn metadata(
        &self,
        f: &str,
        o: &Output,
        ctx: &mut Context,
    ) -> Result<(BTreeMap<String, String>, BTreeMap<String, String>)> {
        let labels_at = format!("{f}.labels");
        let annotations_at = format!("{f}.annotations");
        let mut labels = BTreeMap::new();
        if let Some(l) = &o.labels {
            labels = output::string_map(&labels_at, &self.expand(l, ctx, &labels_at, Marked::No)?)?;
        }
        let mut annotations = BTreeMap::new();
        if let Some(a) = &o.annotations {
            let expanded = self.expand(a, ctx, &annotations_at, Marked::No)?;
            annotations = output::string_map(&annotations_at, &expanded)?;
        }
        for k in labels.keys().chain(annotations.keys()) {
            let reserved = k
                .strip_prefix(GROUP)
                .is_some_and(|rest| rest.starts_with('/'));
            if reserved || k == MANAGED_BY_LABEL {
                let message = format!("key {k:?} is reserved for provenance");
                return Err(FieldError::new(ErrorKind::InvalidRule, labels_at, message));
            }
        }
        for (k, v) in &labels {
            output::validate_key(&labels_at, k)?;
            output::validate_label_value(&labels_at, k, v)?;
        }
        for k in annotations.keys() {
            output::validate_key(&annotations_at, k)?;
        }
        labels.insert(MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string());
        labels.insert(
            output::rule_label(),
            tenant::rule_label_value(&self.rule.name),
        );
        annotations.insert(output::rule_annotation(), self.rule.name.clone());
        if self.rule.spec.deletion_policy == DeletionPolicy::Delete {
            annotations.insert(
                output::deletion_policy_annotation(),
                DeletionPolicy::Delete.as_str().to_string(),
            );
        }
        if let Some(t) = self.trigger {
            annotations.insert(output::trigger_annotation(), object_ref(t));
        }
        output::validate_annotations_size(&annotations_at, &annotations)?;
        Ok((labels, annotations))
    }

    /// A role's rules (its own, then `rulesFrom`'s) and aggregationRule;
    /// with a refusal when a value from data was a wildcard.
    fn role_body(
        &self,
        f: &str,
        o: &Output,
        ctx: &mut Context,
    ) -> Result<(Body, Option<FieldError>)> {
        let namespaced = o.kind.namespaced();
        let mut refusal = None;
        let mut rules = Vec::new();
        if let Some(r) = &o.rules {
            let at = format!("{f}.rules");
            let mut expanded = self.expand(r, ctx, &at, Marked::AsData)?;
            refusal = output::check_marked_rules(&at, &mut expanded)?;
            rules = output::policy_rules(&at, expanded, namespaced)?;
        }
        if let Some(rf) = &o.rules_from {
            for role in self.rules_from(&format!("{f}.rulesFrom"), rf, ctx)? {
                rules.extend_from_slice(&role.rules());
            }
            if namespaced {
                rules = policy::without_non_resource_urls(&rules);
            }
            rules = policy::compact(&rules);
        }
        let aggregation = match &o.aggregation_rule {
            Some(a) => {
                let at = format!("{f}.aggregationRule");
                Some(output::aggregation_rule(
                    &at,
                    &self.expand(a, ctx, &at, Marked::No)?,
                )?)
            }
            None => None,
        };
        Ok((
            Body::Role {
                rules: Arc::new(rules),
                aggregation,
            },
            refusal,
        ))
    }

    /// `rulesFrom`: the ClusterRoles the rule sees named by
    /// `clusterRoleNames` or selected by `clusterRoleSelector`, by name,
    /// but those left out (each with a warning): a role no rule manages
    /// that only the selector found (its labels are data, not the rule
    /// author's choice), and a role whose rules policy would refuse
    /// ([`crate::policy::copy_refusal`]).
    fn rules_from(&self, f: &str, rf: &RulesFrom, ctx: &mut Context) -> Result<Vec<Seen<'_>>> {
        let names = match &rf.cluster_role_names {
            Some(n) => self.strings(&format!("{f}.clusterRoleNames"), n, ctx)?,
            None => Vec::new(),
        };
        let selector = match &rf.cluster_role_selector {
            Some(s) => Some(self.selector(&format!("{f}.clusterRoleSelector"), s, ctx)?),
            None => None,
        };
        let mut chosen: BTreeMap<String, Seen> = BTreeMap::new();
        let gk = gk_of(OutputKind::ClusterRole);
        for n in &names {
            if let Some(role) = self.world.seen(gk, &(String::new(), n.clone())) {
                chosen.insert(n.clone(), role);
            }
        }
        if let Some(s) = &selector {
            for role in self.world.selected_cluster_roles(s) {
                let name = role.json()["metadata"]["name"].as_str().unwrap_or_default();
                chosen.insert(name.to_string(), role);
            }
        }
        let mut kept = Vec::new();
        for (name, role) in chosen {
            // A live role is a rule's when it carries our label and names
            // its rule (a label alone is what anyone may write).
            let managed = role.observed().is_none_or(|o| {
                super::judge::ours(o)
                    && o["metadata"]["annotations"][output::rule_annotation()].is_string()
            });
            let why = if !managed && !names.contains(&name) {
                Some(crate::policy::LEFT_OUT_UNMANAGED.to_string())
            } else {
                self.world
                    .grants
                    .copy_refusal(&role.rules())
                    .map(|why| format!("{}{why}", crate::policy::LEFT_OUT_REFUSED))
            };
            match why {
                Some(why) => self
                    .left_out
                    .borrow_mut()
                    .push(FieldWarning::new(f, &name, why)),
                None => kept.push(role),
            }
        }
        Ok(kept)
    }

    /// A binding's roleRef and subjects; with a refusal when a subject's
    /// name from data names a `system:` user or group.
    fn binding_body(
        &self,
        f: &str,
        o: &Output,
        ctx: &mut Context,
    ) -> Result<(Body, Option<FieldError>)> {
        let rr = o.role_ref.as_ref().ok_or_else(|| {
            FieldError::new(
                ErrorKind::InvalidRule,
                format!("{f}.roleRef"),
                "a binding needs roleRef",
            )
        })?;
        let role_kind = self.tpl(&format!("{f}.roleRef.kind"), &rr.kind, ctx)?;
        let role_name = self.tpl(&format!("{f}.roleRef.name"), &rr.name, ctx)?;
        let allowed: &[&str] = match o.kind {
            OutputKind::ClusterRoleBinding => &["ClusterRole"],
            _ => &["ClusterRole", "Role"],
        };
        if !allowed.contains(&role_kind.as_str()) {
            let message = format!(
                "a {} may reference {}, not {role_kind:?}",
                o.kind,
                allowed.join(" or ")
            );
            return Err(FieldError::new(
                ErrorKind::InvalidOutput,
                format!("{f}.roleRef.kind"),
                message,
            ));
        }
        output::validate_name(format!("{f}.roleRef.name"), &role_name)?;
        let (subjects, refusal) = match &o.subjects {
            Some(s) => {
                let at = format!("{f}.subjects");
                output::marked_subjects(&at, self.expand(s, ctx, &at, Marked::AsData)?, o.kind)?
            }
            None => (Vec::new(), None),
        };
        Ok((
            Body::Binding {
                role_kind,
                role_name,
                subjects,
            },
            refusal,
        ))
    }
}

/// Role and RoleBinding default to the trigger's namespace, or to the
/// trigger itself when it is a Namespace.
fn default_namespace(trigger: Option<&Value>) -> Option<String> {
    let (ns, name) = key_of(trigger?)?;
    if !ns.is_empty() {
        return Some(ns);
    }
    let gk = GroupKind::of(trigger?)?;
    (gk.group.is_empty() && gk.kind == "Namespace").then_some(name)
}

/// A controller ownerReference to the trigger, where Kubernetes allows it:
/// the trigger has a uid, and is cluster-scoped or in the object's namespace.
fn owner_reference(trigger: &Value, namespace: Option<&str>) -> Option<OwnerRef> {
    let meta = &trigger["metadata"];
    let uid = meta["uid"].as_str().filter(|u| !u.is_empty())?;
    let trigger_ns = meta["namespace"].as_str().unwrap_or_default();
    if !trigger_ns.is_empty() && namespace != Some(trigger_ns) {
        return None;
    }
    let (api_version, kind, name) = (&trigger["apiVersion"], &trigger["kind"], &meta["name"]);
    Some(match (api_version.as_str(), kind.as_str(), name.as_str()) {
        (Some(a), Some(k), Some(n)) => OwnerRef::Controller {
            api_version: a.into(),
            kind: k.into(),
            name: n.into(),
            uid: uid.into(),
        },
        _ => OwnerRef::Other(Arc::new(serde_json::json!({
            "apiVersion": api_version,
            "kind": kind,
            "name": name,
            "uid": uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }))),
    })
}
