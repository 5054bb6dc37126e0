//! Outputs (`spec.outputs[]`, docs/rules.md "Outputs and their
//! validation", "rulesFrom", "Provenance", "ownerReferences"): each output
//! rendered once or per `forEach` item, its metadata, a role's rules (and
//! `rulesFrom` copies) or a binding's roleRef and subjects, checked as
//! Kubernetes would ([`super::output`] holds those checks, shared with the
//! reference).
//!
//! Reference twin: `reference/outputs.rs`.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use handlebars::Context;
use k8s_openapi::api::rbac::v1::PolicyRule;
use serde_json::{Value, json};

use super::error::{ErrorKind, FieldError, FieldWarning};
use super::expand::{Evaluator, Pass, Result, Span, limited};
use super::incremental::keys::Loop;
use super::kinds::output_gk;
use super::limits;
use super::manifest::{Body, Interner, Manifest, Meta, OwnerRef};
use super::memo::{AssemblyPart, Read};
use super::model::Desired;
use super::model::Seen;
use super::output::{self, MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use super::path::At;
use super::store::{GroupKind, key_of, object_ref};
use super::template::truthy;
use super::view::View;
use crate::api::{GROUP, OutputKind, RulesFrom};
use crate::policy;

/// Role and RoleBinding default to the trigger's namespace, or to the
/// trigger itself when it is a Namespace.
fn default_namespace(trigger: Option<&Value>) -> Option<String> {
    let t = trigger?;
    let (ns, name) = key_of(t)?;
    if !ns.is_empty() {
        return Some(ns);
    }
    let gk = GroupKind::of(t)?;
    (gk.group.is_empty() && gk.kind == "Namespace").then_some(name)
}

/// A controller ownerReference to the trigger, where Kubernetes allows it:
/// the trigger has a uid, and is cluster-scoped or in the object's namespace.
fn owner_reference(
    trigger: &Value,
    namespace: Option<&str>,
    shared: &mut Interner,
) -> Option<OwnerRef> {
    let meta = &trigger["metadata"];
    let uid = meta["uid"].as_str().filter(|u| !u.is_empty())?;
    let trigger_ns = meta["namespace"].as_str().unwrap_or_default();
    if !trigger_ns.is_empty() && namespace != Some(trigger_ns) {
        return None;
    }
    let (api_version, kind, name) = (&trigger["apiVersion"], &trigger["kind"], &meta["name"]);
    Some(match (api_version.as_str(), kind.as_str(), name.as_str()) {
        (Some(a), Some(k), Some(n)) => shared.owner(a, k, n, uid),
        // Not an object the API server serves: kept as it is.
        _ => OwnerRef::Other(Arc::new(json!({
            "apiVersion": api_version,
            "kind": kind,
            "name": name,
            "uid": uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }))),
    })
}

impl Evaluator<'_> {
    /// Renders every output (once, or per entry of its `forEach`).
    pub(super) fn outputs(
        &self,
        ctx: &mut Context,
        trigger: Option<&Value>,
        view: &View,
    ) -> Result<Vec<Desired>> {
        let mut out: Vec<Desired> = Vec::new();
        for (i, o) in self.rule.spec.outputs.iter().enumerate() {
            // Spelled once per rule (never missing: one per output).
            let field: Arc<str> = match self.rule.output_fields.get(i) {
                Some(f) => Arc::clone(f),
                None => format!("spec.outputs[{i}]").into(),
            };
            let f: &str = &field;
            let one = |this: &Self,
                       ctx: &mut Context,
                       out: &mut Vec<Desired>,
                       loops: Option<&Loop<'_>>| {
                if let Some(w) = &o.when
                    && !truthy(&*this.expr(At::Key(&At::Field(f), "when"), w, ctx)?)
                {
                    return Ok(());
                }
                let d = this.object(&field, o, ctx, (trigger, view), loops)?;
                if let Some(prev) = out
                    .iter()
                    .find(|p| p.kind == d.kind && p.namespace == d.namespace && p.name == d.name)
                {
                    if prev.object != d.object {
                        return Err(FieldError::new(
                            ErrorKind::Conflict,
                            f,
                            format!(
                                "{} {:?} is emitted twice with different content",
                                d.kind, d.name
                            ),
                        ));
                    }
                    return Ok(());
                }
                out.push(d);
                limited(f, limits::check_objects(out.len()))
            };
            match &o.for_each {
                None => one(self, ctx, &mut out, None)?,
                Some(e) => {
                    let var = o.as_name.as_deref().unwrap_or("item");
                    // An output is not one template value to search for
                    // the list's name: its list is always copied.
                    let scope = Loop {
                        name: var,
                        bound: None,
                        outer: None,
                    };
                    self.for_each(
                        At::Key(&At::Field(f), "forEach"),
                        e,
                        scope,
                        |_| false,
                        ctx,
                        |ctx, l| one(self, ctx, &mut out, Some(l)),
                    )?;
                }
            }
        }
        Ok(out)
    }

    /// One output of a trigger: its metadata, then a role's rules or a
    /// binding's roleRef and subjects, checked as Kubernetes would;
    /// expanded inside `loops` (an output's `forEach`).
    fn object(
        &self,
        field: &Arc<str>,
        o: &crate::api::Output,
        ctx: &mut Context,
        (trigger, view): (Option<&Value>, &View),
        loops: Option<&Loop<'_>>,
    ) -> Result<Desired> {
        let f: &str = field;
        // Field names are built once: most are read only by an error.
        let at = At::Field(f);
        let name_field = At::Key(&at, "name");
        let name = self.tpl(name_field, &o.name, ctx)?;
        output::validate_name(name_field, &name)?;
        super::tenant::check_output_name(&self.rule.name, o.kind, name_field, &name)?;
        let namespace = self.object_namespace(&at, o, ctx, trigger)?;
        let (labels, annotations, tref) = self.object_marks(&at, o, ctx, trigger, loops)?;
        // A `*` from data: the object is refused (and revoked) after the
        // render, not failed.
        let mut refusal = None;
        let body = if o.kind.is_role() {
            self.role_body(&at, o, ctx, (view, loops), &mut refusal)?
        } else {
            self.binding_body(&at, o, ctx, loops, &mut refusal)?
        };
        let mut shared = view.interner.borrow_mut();
        // Shared by the objects of a rule, an output, a trigger.
        let rule = shared.string(self.rule.name.clone());
        let field = Arc::clone(field);
        let trigger_ref = tref.map(|r| shared.string(r));
        let meta = Meta {
            name: name.clone(),
            namespace: namespace.clone(),
            labels: shared.map(labels),
            annotations: shared.map(annotations),
            owner: trigger.and_then(|t| owner_reference(t, namespace.as_deref(), &mut shared)),
        };
        drop(shared);
        let object = Manifest::new(o.kind, meta, body);
        output::validate_object_size(at, &object)?;
        Ok(Desired {
            kind: o.kind,
            namespace: namespace.unwrap_or_default(),
            name,
            rule,
            trigger: trigger_ref,
            field,
            refusal,
            object,
        })
    }

    /// An output's namespace: rendered, or the trigger's (none for a
    /// cluster-scoped kind).
    fn object_namespace(
        &self,
        at: &At<'_>,
        o: &crate::api::Output,
        ctx: &mut Context,
        trigger: Option<&Value>,
    ) -> Result<Option<String>> {
        let f = at;
        Ok(if o.kind.namespaced() {
            let ns = match &o.namespace {
                Some(t) => self.tpl(At::Key(at, "namespace"), t, ctx)?,
                None => default_namespace(trigger).ok_or_else(|| {
                    FieldError::new(
                        ErrorKind::InvalidRule,
                        format!("{f}.namespace"),
                        format!(
                            "a {} needs a namespace: the trigger has none, so give one",
                            o.kind
                        ),
                    )
                })?,
            };
            output::validate_namespace(At::Key(at, "namespace"), &ns)?;
            Some(ns)
        } else {
            None
        })
    }

    /// An output's labels and annotations: rendered, checked, with the
    /// engine's provenance added; and the trigger's reference.
    #[allow(clippy::type_complexity)]
    fn object_marks(
        &self,
        at: &At<'_>,
        o: &crate::api::Output,
        ctx: &mut Context,
        trigger: Option<&Value>,
        loops: Option<&Loop<'_>>,
    ) -> Result<(
        BTreeMap<String, String>,
        BTreeMap<String, String>,
        Option<String>,
    )> {
        let labels_field = At::Key(at, "labels");
        let annotations_field = At::Key(at, "annotations");
        let mut labels = BTreeMap::new();
        if let Some(l) = &o.labels {
            labels = output::string_map(
                labels_field,
                &self.expand(l, ctx, labels_field, Pass::plain(loops))?,
            )?;
        }
        let mut annotations = BTreeMap::new();
        if let Some(a) = &o.annotations {
            annotations = output::string_map(
                annotations_field,
                &self.expand(a, ctx, annotations_field, Pass::plain(loops))?,
            )?;
        }
        for k in labels.keys().chain(annotations.keys()) {
            let reserved = k
                .strip_prefix(GROUP)
                .is_some_and(|rest| rest.starts_with('/'));
            if reserved || k == MANAGED_BY_LABEL {
                return Err(FieldError::new(
                    ErrorKind::InvalidRule,
                    labels_field.to_string(),
                    format!("key {k:?} is reserved for provenance"),
                ));
            }
        }
        for (k, v) in &labels {
            output::validate_key(labels_field, k)?;
            output::validate_label_value(labels_field, k, v)?;
        }
        for k in annotations.keys() {
            output::validate_key(annotations_field, k)?;
        }
        labels.insert(MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string());
        labels.insert(
            output::rule_label(),
            super::tenant::rule_label_value(&self.rule.name),
        );
        annotations.insert(output::rule_annotation(), self.rule.name.clone());
        if self.rule.spec.deletion_policy == crate::api::DeletionPolicy::Delete {
            annotations.insert(
                output::deletion_policy_annotation(),
                crate::api::DeletionPolicy::Delete.as_str().to_string(),
            );
        }
        // Spelled once: the annotation and the object's provenance.
        let tref = trigger.map(object_ref);
        if let Some(r) = &tref {
            annotations.insert(output::trigger_annotation(), r.clone());
        }
        output::validate_annotations_size(annotations_field, &annotations)?;
        Ok((labels, annotations, tref))
    }

    /// A role's body: its rules (rendered, and copied by rulesFrom) and
    /// aggregation rule.
    fn role_body(
        &self,
        at: &At<'_>,
        o: &crate::api::Output,
        ctx: &mut Context,
        (view, loops): (&View, Option<&Loop<'_>>),
        refusal: &mut Option<FieldError>,
    ) -> Result<Body> {
        let f = at;
        let namespaced = o.kind.namespaced();
        let mut rules: Arc<Vec<PolicyRule>> = match &o.rules {
            Some(r) => {
                let pass = Pass::marked(loops);
                self.rendered_rules(At::Key(at, "rules"), r, (namespaced, pass), ctx, refusal)?
            }
            None => Arc::new(Vec::new()),
        };
        if let Some(rf) = &o.rules_from {
            let roles = self.rules_from(&format!("{f}.rulesFrom"), rf, ctx, (view, loops))?;
            if rules.is_empty() {
                // Copies only: the same roles give the same rules,
                // shared (namespaces accepting the same types).
                rules = view.copied_rules(&roles, namespaced);
            } else {
                let mut all = rules.to_vec();
                for role in &roles {
                    all.extend(view.role_rules(*role).iter().cloned());
                }
                if namespaced {
                    all = policy::without_non_resource_urls(&all);
                }
                rules = Arc::new(policy::compact(&all));
            }
        }
        let aggregation = match &o.aggregation_rule {
            Some(a) => Some(output::aggregation_rule(
                At::Key(at, "aggregationRule"),
                &self.expand(a, ctx, At::Key(at, "aggregationRule"), Pass::plain(loops))?,
            )?),
            None => None,
        };
        Ok(Body::Role { rules, aggregation })
    }

    /// A role's rendered rules, checked (a cached expansion's checked
    /// rules reused).
    fn rendered_rules(
        &self,
        field: At<'_>,
        r: &Value,
        (namespaced, pass): (bool, Pass<'_>),
        ctx: &mut Context,
        refusal: &mut Option<FieldError>,
    ) -> Result<Arc<Vec<PolicyRule>>> {
        let cached = self.cached_policy(r, pass);
        let key = self.expansion_key(r, false, pass.marked);
        // Not cached as a whole: its entries' checked rules may be.
        let by_entry = cached.is_none() && key.is_none() && r.is_array();
        let spans = RefCell::new(Vec::new());
        let whole = Pass {
            spans: by_entry.then_some(&spans),
            ..pass
        };
        // Cached whole, it is read again only through its
        // checked rules (cached below, or the expansion dropped).
        let expanded = match cached {
            Some(_) => Ok(Value::Null),
            None => self.expand_as(r, ctx, field, whole, key.is_some()),
        };
        let spans = by_entry.then(|| spans.into_inner());
        Ok(match cached {
            Some((rules, r)) => {
                *refusal = r;
                rules
            }
            None => {
                let mut expanded = expanded?;
                let shared = spans.and_then(|spans| {
                    self.entry_policies(field, &mut expanded, &spans, namespaced)
                });
                if let Some(shared) = shared {
                    let (rules, r) = shared?;
                    *refusal = r;
                    rules
                } else {
                    let checked = output::check_marked_rules(field, &mut expanded).and_then(|r| {
                        output::policy_rules(field, expanded, namespaced)
                            .map(|rules| (Arc::new(rules), r))
                    });
                    let (rules, r) = match checked {
                        Ok(c) => c,
                        Err(e) => {
                            // Cached as null: never without its
                            // checked rules.
                            if let Some(key) = &key {
                                self.caches.forget_expansion(key);
                            }
                            return Err(e);
                        }
                    };
                    *refusal = r;
                    // Checked once for the outputs of a cached expansion.
                    if let Some(key) = key {
                        self.caches.remember_checked_policy(key, &rules, refusal);
                    }
                    rules
                }
            }
        })
    }

    /// A binding's body: its roleRef, checked against its kind, and its
    /// subjects.
    fn binding_body(
        &self,
        at: &At<'_>,
        o: &crate::api::Output,
        ctx: &mut Context,
        loops: Option<&Loop<'_>>,
        refusal: &mut Option<FieldError>,
    ) -> Result<Body> {
        let f = at;
        let rr = o.role_ref.as_ref().ok_or_else(|| {
            FieldError::new(
                ErrorKind::InvalidRule,
                format!("{f}.roleRef"),
                "a binding needs roleRef",
            )
        })?;
        let role_kind = self.tpl(At::Key(at, "roleRef.kind"), &rr.kind, ctx)?;
        let role_name = self.tpl(At::Key(at, "roleRef.name"), &rr.name, ctx)?;
        let allowed: &[&str] = if o.kind == OutputKind::ClusterRoleBinding {
            &["ClusterRole"]
        } else {
            &["ClusterRole", "Role"]
        };
        if !allowed.contains(&role_kind.as_str()) {
            return Err(FieldError::new(
                ErrorKind::InvalidOutput,
                format!("{f}.roleRef.kind"),
                format!(
                    "a {} may reference {}, not {role_kind:?}",
                    o.kind,
                    allowed.join(" or ")
                ),
            ));
        }
        output::validate_name(At::Key(at, "roleRef.name"), &role_name)?;
        let subjects = match &o.subjects {
            Some(s) => {
                // Names from data are marked: never a `system:` one.
                let pass = Pass::marked(loops);
                let expanded = self.expand(s, ctx, At::Key(at, "subjects"), pass);
                let (subjects, r) =
                    output::marked_subjects(At::Key(at, "subjects"), expanded?, o.kind)?;
                *refusal = refusal.take().or(r);
                subjects
            }
            None => Vec::new(),
        };
        Ok(Body::Binding {
            role_kind,
            role_name,
            subjects,
        })
    }

    /// The policy rules of an expanded rule list and its refusal, checked
    /// entry by entry of its template (`spans`) in the order, and with the
    /// errors, of a check of the whole list: an entry in the cache
    /// with rules checked before (no refusal) reuses them (its items may be
    /// left out of `expanded`), the others are checked here. `None` when
    /// the spans do not cover the list (never so without a cached entry).
    fn entry_policies(
        &self,
        field: At<'_>,
        expanded: &mut Value,
        spans: &[Span],
        namespaced: bool,
    ) -> Option<Result<super::memo::CachedPolicy>> {
        let Value::Array(items) = expanded else {
            return None;
        };
        if spans.last().map_or(0, |s| s.end) != items.len() {
            return None;
        }
        let cached: Vec<Option<Arc<Vec<PolicyRule>>>> = spans
            .iter()
            .map(|s| s.key.as_ref().and_then(|k| self.caches.entry_rules(k)))
            .collect();
        // Put together before from the same parts: shared, not copied.
        // Only a list with cached entries is worth keeping (its triggers
        // share them); one whose entries all read the trigger is not. A
        // list put together without a refusal had every cached entry's rules
        // checked and cached: its parts are the entries' keys and the other
        // entries' text (taken before the check strips its marks).
        let keyed = spans.iter().any(|s| s.key.is_some());
        let assembly = keyed.then(|| {
            let parts = spans.iter().map(|s| match &s.key {
                Some(key) => AssemblyPart::Cached(key.clone()),
                None => AssemblyPart::Text(
                    items
                        .get(s.start..s.end)
                        .and_then(|part| serde_json::to_string(part).ok())
                        .unwrap_or_default(),
                ),
            });
            (namespaced, parts.collect::<Vec<_>>())
        });
        // Found only when every cached entry's checked rules are cached now.
        let all_cached = spans
            .iter()
            .zip(&cached)
            .all(|(s, k)| s.key.is_none() || k.is_some());
        if let Some(rules) = assembly
            .as_ref()
            .filter(|_| all_cached)
            .and_then(|a| self.caches.assembled_rules(a))
        {
            return Some(Ok((rules, None)));
        }
        let mut refusal = None;
        let mut refused = vec![false; spans.len()];
        for (n, s) in spans.iter().enumerate() {
            if cached[n].is_some() {
                continue;
            }
            let part = items.get_mut(s.start..s.end)?;
            match output::check_marked_items(field, s.start, part) {
                Err(e) => return Some(Err(e)),
                Ok(Some(r)) => {
                    refused[n] = true;
                    refusal.get_or_insert(r);
                }
                Ok(None) => {}
            }
        }
        let mut rules = Vec::with_capacity(items.len());
        for (n, s) in spans.iter().enumerate() {
            if let Some(k) = &cached[n] {
                rules.extend(k.iter().cloned());
                continue;
            }
            let part = items.get_mut(s.start..s.end)?;
            output::strip_marked_items(part);
            let checked = match output::policy_items(field, s.start, part, namespaced) {
                Ok(c) => c,
                Err(e) => return Some(Err(e)),
            };
            if let Some(key) = s.key.as_ref().filter(|_| !refused[n]) {
                self.caches.remember_entry_rules(key, &checked);
            }
            rules.extend(checked);
        }
        let rules = Arc::new(rules);
        if let Some(a) = assembly.filter(|_| refusal.is_none()) {
            self.caches.remember_assembled(a, &rules);
        }
        Some(Ok((rules, refusal)))
    }

    /// Rules of the ClusterRoles named or selected, in name order.
    fn rules_from<'v>(
        &self,
        f: &str,
        rf: &RulesFrom,
        ctx: &mut Context,
        (view, loops): (&View<'v>, Option<&Loop<'_>>),
    ) -> Result<Vec<Seen<'v>>> {
        let names: BTreeSet<String> = match &rf.cluster_role_names {
            Some(n) => self
                .strings(At::Key(&At::Field(f), "clusterRoleNames"), n, ctx, loops)?
                .into_iter()
                .collect(),
            None => BTreeSet::new(),
        };
        let selector = match &rf.cluster_role_selector {
            Some(s) => {
                Some(self.selector(At::Key(&At::Field(f), "clusterRoleSelector"), s, ctx)?)
            }
            None => None,
        };
        let gk = output_gk(OutputKind::ClusterRole);
        // Read in compact form: no JSON of the roles is built.
        let mut chosen: BTreeMap<&str, Seen<'v>> = BTreeMap::new();
        for n in &names {
            if let Some(role) = view.get_seen(&gk, &(String::new(), n.clone())) {
                chosen.insert(n.as_str(), role);
            }
        }
        if let Some(s) = &selector {
            for role in view.selected_cluster_roles(s).iter().copied() {
                chosen.insert(role.name(), role);
            }
        }
        if !self.caches.records() {
            return Ok(self.copied_sources(f, chosen, &names, view));
        }
        // Roles found by name are reached through `names` when they
        // change: only those the selector found are cached as hits (left
        // out or not: a change to one may put it in).
        let hits = chosen
            .keys()
            .filter(|n| !names.contains(**n))
            .map(|n| (String::new(), (*n).to_string()))
            .collect();
        let roles = self.copied_sources(f, chosen, &names, view);
        // Shared with the reads of other triggers that made the same.
        let mut shared = view.interner.borrow_mut();
        let names = shared.names(names);
        let selector = selector.map(|s| shared.selector(s));
        let hits = shared.hits(hits);
        let gk = shared.kind(&gk);
        drop(shared);
        self.caches.record_read(Read {
            gk,
            namespace: None,
            hits,
            names: Some(names),
            selector,
            either: true,
            owner: None,
        });
        Ok(roles)
    }

    /// The sources a copy (`rulesFrom`) takes, in name order: all but
    /// those left out, each with a warning — a role no rule manages that
    /// only the selector found (its labels are data, not the rule
    /// author's choice), and a role whose rules policy would refuse
    /// ([`crate::policy::copy_refusal`]), so that neither refuses the copy
    /// of the others.
    fn copied_sources<'v>(
        &self,
        f: &str,
        chosen: BTreeMap<&str, Seen<'v>>,
        names: &BTreeSet<String>,
        view: &View<'v>,
    ) -> Vec<Seen<'v>> {
        let mut kept = Vec::with_capacity(chosen.len());
        for (name, role) in chosen {
            // A live role is a rule's when it carries our label and names
            // its rule (a label alone is what anyone may write).
            let managed = match role {
                Seen::Emitted(_) => true,
                Seen::Observed(o) => {
                    super::grants::ours(o)
                        && o["metadata"]["annotations"][output::rule_annotation()].is_string()
                }
            };
            let why: Option<Cow<'_, str>> = if !managed && !names.contains(name) {
                Some(Cow::Borrowed(policy::LEFT_OUT_UNMANAGED))
            } else {
                view.copy_refusal(&view.role_rules(role))
                    .map(|why| Cow::Owned(format!("{}{why}", policy::LEFT_OUT_REFUSED)))
            };
            match why {
                Some(why) => self
                    .warnings
                    .borrow_mut()
                    .push(FieldWarning::new(f, name, why)),
                None => kept.push(role),
            }
        }
        kept
    }
}
