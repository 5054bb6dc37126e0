//! Evaluation of compiled rules against observed objects.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::Arc;

use handlebars::Context;
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde_json::{Map, Value, json};

use super::compile::{Body as DirBody, CompiledRule, anchored, directive, output_gk};
use super::error::{EngineError, ErrorKind, FieldError, FieldWarning};
use super::limits;
use super::memo::{Changes, Memo, OutKey, Outcome, Owner, Read, RuleMemo, Signature, TriggerMemo};
use super::output::{self, Body, MANAGED_BY_LABEL, MANAGED_BY_VALUE, Meta};
use super::path::{FieldPath, scalar_text};
use super::store::{GroupKind, ObjectKey, ObjectStore, key_of, object_ref};
use super::template::truthy;
use super::{Desired, Engine, Evaluation, RuleReport, RuleState};
use crate::api::{
    Condition, GROUP, MetadataSource, OutputKind, Related, RulesFrom, Trigger, Unmatched,
};
use crate::policy;

type Result<T> = std::result::Result<T, FieldError>;

/// What rules read: the observed objects, overlaid with the objects earlier
/// rules emitted in this evaluation. Live objects that a successfully
/// evaluated rule manages are hidden, since its fresh output replaces them.
/// A kind, optionally narrowed to one namespace.
type ListKey = (GroupKind, Option<String>);

struct View<'a> {
    observed: &'a ObjectStore,
    overlay: &'a ObjectStore,
    reports: &'a BTreeMap<String, RuleReport>,
    /// Merged lists, built once: the view cannot change while a rule runs,
    /// and a rule lists the same kind once per trigger.
    merged: RefCell<HashMap<ListKey, Rc<Vec<&'a Value>>>>,
    /// ClusterRoles per rendered selector: every trigger of a rule usually
    /// renders the same one.
    selected: RefCell<HashMap<String, Rc<Vec<&'a Value>>>>,
    /// Whether any changed object passes a selector-based read, by the
    /// read's filters: all triggers of a rule usually share them.
    touched: RefCell<HashMap<String, bool>>,
}

impl<'a> View<'a> {
    fn is_output_kind(gk: &GroupKind) -> bool {
        OutputKind::ALL.iter().any(|k| output_gk(*k) == *gk)
    }

    /// A live object superseded by this evaluation's output. The rule being
    /// evaluated has no report yet, so its own live outputs are hidden too:
    /// a rule never reads what it emits.
    fn hidden(&self, obj: &Value) -> bool {
        let meta = &obj["metadata"];
        if !output::is_managed(obj) {
            return false;
        }
        let Some(rule) = meta["annotations"][output::rule_annotation()].as_str() else {
            return false;
        };
        let trigger = meta["annotations"][output::trigger_annotation()].as_str();
        match self.reports.get(rule) {
            // Its rule is gone: the object is about to be pruned.
            None => true,
            Some(r) => {
                r.state == RuleState::Evaluated
                    && !match trigger {
                        Some(t) => r.kept_triggers.contains(t),
                        None => r.static_kept,
                    }
            }
        }
    }

    fn list(&self, gk: &GroupKind, ns: Option<&str>) -> Rc<Vec<&'a Value>> {
        let key = (gk.clone(), ns.map(str::to_string));
        if let Some(hit) = self.merged.borrow().get(&key) {
            return Rc::clone(hit);
        }
        let list = Rc::new(self.build_list(gk, ns));
        self.merged.borrow_mut().insert(key, Rc::clone(&list));
        list
    }

    /// One object as rules see it: this evaluation's output, else the live
    /// object unless it is superseded.
    fn get(&self, gk: &GroupKind, key: &ObjectKey) -> Option<&'a Value> {
        if Self::is_output_kind(gk) {
            if let Some(o) = self.overlay.get(gk, key) {
                return Some(o);
            }
            return self.observed.get(gk, key).filter(|o| !self.hidden(o));
        }
        self.observed.get(gk, key)
    }

    /// Whether a change since the last evaluation can alter what `read`
    /// found: a changed object it found, or a changed object that now
    /// passes its filters.
    fn touches(&self, changes: &Changes, read: &Read) -> bool {
        if changes.all || changes.whole.contains(&read.gk) {
            return true;
        }
        let Some(changed) = changes.keys.get(&read.gk) else {
            return false;
        };
        if read.hits.iter().any(|k| changed.contains(k)) {
            return true;
        }
        let in_scope = |k: &ObjectKey| read.namespace.as_ref().is_none_or(|ns| *ns == k.0);
        if let Some(names) = &read.names {
            let ns = read.namespace.clone().unwrap_or_default();
            for n in names {
                let key = (ns.clone(), n.clone());
                if changed.contains(&key)
                    && self.get(&read.gk, &key).is_some_and(|o| read.passes(o))
                {
                    return true;
                }
            }
            if !read.either {
                // Every object it could find carries one of the names.
                return false;
            }
        }
        if read.names.is_some() && read.selector.is_none() {
            return false;
        }
        // Filters without the names: shared by many triggers, so memoized.
        let cache_key = format!(
            "{}|{:?}|{}|{}",
            read.gk,
            read.namespace,
            serde_json::to_string(&read.selector).unwrap_or_default(),
            read.owner
                .as_ref()
                .map(|o| format!("{}|{:?}|{}", o.uid, o.gk, o.name))
                .unwrap_or_default()
        );
        if let Some(hit) = self.touched.borrow().get(&cache_key) {
            return *hit;
        }
        let hit = changed.iter().filter(|k| in_scope(k)).any(|k| {
            self.get(&read.gk, k)
                .is_some_and(|o| read.passes_unnamed(o))
        });
        self.touched.borrow_mut().insert(cache_key, hit);
        hit
    }

    /// The ClusterRoles that `selector` (validated) matches, memoized by the
    /// selector's content.
    fn selected_cluster_roles(&self, selector: &LabelSelector) -> Rc<Vec<&'a Value>> {
        let key = serde_json::to_string(selector).unwrap_or_default();
        if let Some(hit) = self.selected.borrow().get(&key) {
            return Rc::clone(hit);
        }
        let list = self.list(&output_gk(OutputKind::ClusterRole), None);
        let hits: Rc<Vec<&'a Value>> = Rc::new(
            list.iter()
                .copied()
                .filter(|o| {
                    crate::selector::matches_json(selector, o["metadata"]["labels"].as_object())
                })
                .collect(),
        );
        self.selected.borrow_mut().insert(key, Rc::clone(&hits));
        hits
    }

    fn build_list(&self, gk: &GroupKind, ns: Option<&str>) -> Vec<&'a Value> {
        let observed: Vec<&'a Value> = match ns {
            Some(ns) => self.observed.list_namespace(gk, ns).collect(),
            None => self.observed.list(gk).collect(),
        };
        if !Self::is_output_kind(gk) {
            return observed;
        }
        let mut merged: BTreeMap<ObjectKey, &'a Value> = BTreeMap::new();
        for o in observed {
            if !self.hidden(o)
                && let Some(k) = key_of(o)
            {
                merged.insert(k, o);
            }
        }
        let produced: Vec<&'a Value> = match ns {
            Some(ns) => self.overlay.list_namespace(gk, ns).collect(),
            None => self.overlay.list(gk).collect(),
        };
        for o in produced {
            if let Some(k) = key_of(o) {
                merged.insert(k, o);
            }
        }
        merged.into_values().collect()
    }
}

/// Evaluates every rule, re-rendering only what changed since `memo` was
/// made (everything, for an empty or foreign memo).
pub(super) fn evaluate(engine: &Engine, observed: &ObjectStore, memo: &mut Memo) -> Evaluation {
    let reset = memo.adopt(engine.id);
    let mut changes = memo.observe(observed);
    changes.all = reset;
    memo.renders = 0;
    let previously_contested = std::mem::take(&mut memo.contested);
    let mut reports = engine.fixed_reports.clone();
    let mut overlay = ObjectStore::new();
    let mut produced: BTreeMap<OutKey, Desired> = BTreeMap::new();
    let mut contested: BTreeSet<OutKey> = BTreeSet::new();

    for rule in &engine.rules {
        if engine.options.held.contains(&rule.name) {
            memo.rules.remove(&rule.name);
            let report = RuleReport::new(RuleState::Held);
            note_signature(memo, &mut changes, rule, &report);
            reports.insert(rule.name.clone(), report);
            continue;
        }
        let view = View {
            observed,
            overlay: &overlay,
            reports: &reports,
            merged: RefCell::default(),
            selected: RefCell::default(),
            touched: RefCell::default(),
        };
        let prev = memo.rules.remove(&rule.name).unwrap_or_default();
        let evaluator = Evaluator {
            engine,
            rule,
            reads: RefCell::default(),
            warnings: RefCell::default(),
            mark: Cell::new(false),
        };
        let (rule_memo, dirty, renders) = evaluator.run(&view, prev, &changes);
        memo.renders += renders;
        let (mut report, sets) = assemble(&rule.name, &rule_memo);
        memo.rules.insert(rule.name.clone(), rule_memo);
        for (kind, ns, name) in dirty {
            changes.add(&output_gk(kind), (ns, name));
        }
        let mut conflicts: Vec<(String, Option<String>, OutKey)> = Vec::new();
        // What this rule changed in the overlay, applied after it ran.
        let mut added: Vec<OutKey> = Vec::new();
        let mut removed: Vec<OutKey> = Vec::new();
        for (trigger, outs) in sets {
            for d in outs {
                let key = (d.kind, d.namespace.clone(), d.name.clone());
                if contested.contains(&key) {
                    conflicts.push((rule.name.clone(), trigger.clone(), key));
                    continue;
                }
                if let Some(prev) = produced.get(&key) {
                    conflicts.push((rule.name.clone(), trigger.clone(), key.clone()));
                    conflicts.push((prev.rule.clone(), prev.trigger.clone(), key.clone()));
                    produced.remove(&key);
                    removed.push(key.clone());
                    contested.insert(key);
                    continue;
                }
                report.outputs += 1;
                added.push(key.clone());
                produced.insert(key, d);
            }
        }
        note_signature(memo, &mut changes, rule, &report);
        reports.insert(rule.name.clone(), report);
        for (rname, trigger, key) in conflicts {
            if let Some(rep) = reports.get_mut(&rname) {
                let (kind, ns, name) = &key;
                let obj = if ns.is_empty() {
                    format!("{kind} {name}")
                } else {
                    format!("{kind} {ns}/{name}")
                };
                rep.errors.push(EngineError {
                    kind: ErrorKind::Conflict,
                    rule: rname.clone(),
                    field: "spec.outputs".into(),
                    trigger: trigger.clone(),
                    message: format!(
                        "{obj} is emitted by more than one rule or trigger; neither copy is applied"
                    ),
                });
                match &trigger {
                    Some(t) => {
                        rep.kept_triggers.insert(t.clone());
                    }
                    None => rep.static_kept = true,
                }
            }
        }
        // Later rules read what this one emitted (and no longer see what
        // turned out to be contested).
        for (kind, ns, name) in removed {
            overlay.remove(&output_gk(kind), &(ns.clone(), name.clone()));
            changes.add(&output_gk(kind), (ns, name));
        }
        for key in added {
            if previously_contested.contains(&key) {
                changes.add(&output_gk(key.0), (key.1.clone(), key.2.clone()));
            }
            if let Some(d) = produced.get(&key) {
                // Manifests always carry apiVersion, kind and name.
                let _ = overlay.insert_shared(Arc::clone(&d.object));
            }
        }
    }
    memo.contested = contested.clone();
    let revoked = check_policy(
        &engine.options,
        observed,
        &overlay,
        &mut produced,
        &mut reports,
        &mut memo.verdicts,
    );

    let mut desired: Vec<Desired> = produced.into_values().collect();
    desired.sort_by(|a, b| {
        (a.kind.as_str(), &a.namespace, &a.name).cmp(&(b.kind.as_str(), &b.namespace, &b.name))
    });
    Evaluation {
        desired,
        reports,
        contested,
        revoked,
    }
}

/// Policy, once every rule has run, over the final view (live objects and
/// all outputs), so it adds no ordering between rules: the default denials
/// ([`crate::policy::Waivers`]), protected aggregation labels, and the
/// allow-list, judged on what an object *grants* — a role its rules (and,
/// aggregated, the rules of every role it selects), a binding the rules of
/// the role it names (a binding to a role that does not exist yet grants
/// nothing and passes; the role is checked once it exists).
///
/// A refused output is dropped, its rule gets an EscalationDenied error,
/// and, unlike a failed render, its trigger is *not* kept: the object is
/// revoked. Live managed objects that policy now refuses are revoked too,
/// whatever keeps them. Returns what is revoked, with why.
fn check_policy(
    options: &super::Options,
    observed: &ObjectStore,
    overlay: &ObjectStore,
    produced: &mut BTreeMap<OutKey, Desired>,
    reports: &mut BTreeMap<String, RuleReport>,
    verdicts: &mut HashMap<usize, (Arc<Value>, Option<String>)>,
) -> BTreeMap<OutKey, String> {
    let view = View {
        observed,
        overlay,
        reports,
        merged: RefCell::default(),
        selected: RefCell::default(),
        touched: RefCell::default(),
    };
    let mut protected = options.protected.clone();
    let allow = options.allow.as_ref().map(|a| {
        protected.extend(a.selectors.iter().cloned());
        let rules = if a.is_aggregated() {
            allow_list_rules(observed, a)
        } else {
            a.rules.clone()
        };
        (a, rules)
    });
    let judge = Judge {
        view: &view,
        waivers: &options.waivers,
        protected: &protected,
        allow: allow.as_ref().map(|(a, r)| (*a, r.as_slice())),
    };
    let previous = std::mem::take(verdicts);
    // Refused outputs: the field to name, and why.
    let mut refused: BTreeMap<OutKey, (String, String)> = BTreeMap::new();
    for (key, d) in produced.iter() {
        if let Some(e) = &d.refusal {
            let why = format!("{} {:?}: {}", d.kind, d.name, e.message);
            refused.insert(key.clone(), (e.field.clone(), why));
        } else if let Some(why) = judge.cached(&d.object, &previous, verdicts) {
            refused.insert(key.clone(), (d.field.clone(), why));
        }
    }
    let mut revoked = BTreeMap::new();
    for kind in OutputKind::ALL {
        for obj in observed.list(&output_gk(kind)) {
            if !output::is_managed(obj) {
                continue;
            }
            let Some((ns, name)) = key_of(obj) else {
                continue;
            };
            let key = (kind, ns, name);
            // A desired copy that passes replaces it.
            if produced.contains_key(&key) && !refused.contains_key(&key) {
                continue;
            }
            if let Some(why) = judge.refusal(obj) {
                revoked.insert(key, why);
            }
        }
    }
    drop(view);
    for (key, (field, message)) in refused {
        let Some(d) = produced.remove(&key) else {
            continue;
        };
        if let Some(rep) = reports.get_mut(&d.rule) {
            rep.outputs = rep.outputs.saturating_sub(1);
            rep.errors.push(EngineError {
                kind: ErrorKind::EscalationDenied,
                rule: d.rule.clone(),
                field,
                trigger: d.trigger.clone(),
                message: message.clone(),
            });
        }
        revoked.insert(key, message);
    }
    revoked
}

/// The rules of an aggregated allow-list: those of the live ClusterRoles
/// its selectors pick, leaving out any a rule manages (an output can never
/// widen the allow-list).
fn allow_list_rules(observed: &ObjectStore, allow: &crate::policy::AllowList) -> Vec<PolicyRule> {
    let mut out = Vec::new();
    for role in observed.list(&output_gk(OutputKind::ClusterRole)) {
        let labels = role["metadata"]["labels"].as_object();
        if output::is_managed(role) {
            continue;
        }
        if allow
            .selectors
            .iter()
            .any(|s| crate::selector::matches_json(s, labels))
        {
            out.extend(rules_of(role));
        }
    }
    out
}

/// What policy judges objects with.
struct Judge<'v, 'a> {
    view: &'v View<'a>,
    waivers: &'v crate::policy::Waivers,
    protected: &'v [LabelSelector],
    allow: Option<(&'v crate::policy::AllowList, &'v [PolicyRule])>,
}

impl Judge<'_, '_> {
    /// [`Judge::refusal`], reusing last evaluation's verdict on the same
    /// shared manifest when the verdict depends on the object alone: not an
    /// aggregated ClusterRole, not a binding under an allow-list, and no
    /// aggregated allow-list.
    fn cached(
        &self,
        obj: &Arc<Value>,
        previous: &HashMap<usize, (Arc<Value>, Option<String>)>,
        next: &mut HashMap<usize, (Arc<Value>, Option<String>)>,
    ) -> Option<String> {
        let alone = obj.get("aggregationRule").is_none()
            && match self.allow {
                None => true,
                Some((a, _)) => !a.is_aggregated() && obj.get("roleRef").is_none(),
            };
        if !alone {
            return self.refusal(obj);
        }
        let at = Arc::as_ptr(obj) as usize;
        let verdict = match previous.get(&at) {
            Some((held, v)) if Arc::ptr_eq(held, obj) => v.clone(),
            _ => self.refusal(obj),
        };
        next.insert(at, (Arc::clone(obj), verdict.clone()));
        verdict
    }

    /// Why policy refuses `obj` (an RBAC object), in compact form.
    fn refusal(&self, obj: &Value) -> Option<String> {
        let kind = obj["kind"].as_str().unwrap_or_default();
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let what = format!("{kind} {name:?}");
        let mut why: Vec<String> = Vec::new();
        if !self.waivers.system_names && policy::is_system_name(name) {
            why.push(format!(
                "{what} has a name reserved for Kubernetes (system:)"
            ));
        }
        let labels = obj["metadata"]["labels"].as_object();
        if self
            .protected
            .iter()
            .any(|s| crate::selector::matches_json(s, labels))
        {
            why.push(format!(
                "{what} carries labels that aggregate it into a protected ClusterRole (the controller's or the allow-list's)"
            ));
        }
        let granted: Vec<PolicyRule> = if kind.ends_with("Binding") {
            let role_ref = &obj["roleRef"];
            let role_name = role_ref["name"].as_str().unwrap_or_default();
            if !self.waivers.cluster_admin_bindings
                && (role_name == "cluster-admin" || policy::is_system_name(role_name))
            {
                why.push(format!("{what} binds {role_name:?}"));
            }
            // Only the allow-list judges what a bound role grants: the
            // denials judge roles where they are written.
            if let Some((allow, effective)) = self.allow {
                let role = match role_ref["kind"].as_str() {
                    Some("Role") => {
                        let ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
                        self.view.get(
                            &output_gk(OutputKind::Role),
                            &(ns.to_string(), role_name.to_string()),
                        )
                    }
                    _ => self.view.get(
                        &output_gk(OutputKind::ClusterRole),
                        &(String::new(), role_name.to_string()),
                    ),
                };
                let rules = role.map(|r| self.grants(r)).unwrap_or_default();
                let missing = allow.uncovered(effective, &rules);
                if !missing.is_empty() {
                    why.push(format!(
                        "{what} binds role {role_name:?}, which grants what the allow-list does not: {}",
                        shown(&missing)
                    ));
                }
            }
            Vec::new()
        } else {
            self.grants(obj)
        };
        let grants = if obj.get("aggregationRule").is_some() {
            format!("{what} aggregates roles that grant")
        } else {
            format!("{what} grants")
        };
        let denied = policy::denied_grants(&granted, self.waivers);
        if !denied.is_empty() {
            let shown: Vec<&str> = denied.iter().take(3).map(String::as_str).collect();
            why.push(format!("{grants} {}", shown.join("; ")));
        }
        if let Some((allow, effective)) = self.allow
            && !granted.is_empty()
        {
            let missing = allow.uncovered(effective, &granted);
            if !missing.is_empty() {
                why.push(format!(
                    "{grants} what the allow-list does not: {}",
                    shown(&missing)
                ));
            }
        }
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// What a role grants: its rules, and for an aggregated ClusterRole the
    /// rules of the roles it selects now.
    fn grants(&self, role: &Value) -> Vec<PolicyRule> {
        let mut rules = rules_of(role);
        if role.get("aggregationRule").is_some() {
            rules.extend(aggregated_rules(self.view, role));
        }
        rules
    }
}

/// The first few uncovered permissions, compact.
fn shown(missing: &[PolicyRule]) -> String {
    missing
        .iter()
        .take(3)
        .map(policy::describe)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A live or emitted role's rules. Live roles were validated by the API
/// server; what does not parse is skipped (and logged) rather than failing
/// every rule that reads the role.
fn rules_of(role: &Value) -> Vec<PolicyRule> {
    let name = role["metadata"]["name"].as_str().unwrap_or_default();
    let mut out = Vec::new();
    for (i, r) in role
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        match serde_json::from_value::<PolicyRule>(r.clone()) {
            Ok(p) => out.push(p),
            Err(e) => {
                tracing::warn!(role = name, index = i, error = %e, "skipping unparseable rule")
            }
        }
    }
    out
}

/// The rules the aggregation controller would give `role`: those of every
/// other ClusterRole its selectors match, as they are now.
fn aggregated_rules(view: &View, role: &Value) -> Vec<PolicyRule> {
    let name = role["metadata"]["name"].as_str().unwrap_or_default();
    let selectors: Vec<LabelSelector> = role["aggregationRule"]["clusterRoleSelectors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| serde_json::from_value(s.clone()).ok())
        .collect();
    let mut out = Vec::new();
    for other in view.list(&output_gk(OutputKind::ClusterRole), None).iter() {
        if other["metadata"]["name"].as_str() == Some(name) {
            continue;
        }
        let labels = other["metadata"]["labels"].as_object();
        if selectors
            .iter()
            .any(|s| crate::selector::matches_json(s, labels))
        {
            out.extend(rules_of(other));
        }
    }
    out
}

/// Removes what templates must not depend on or need not see.
fn visible(obj: &Value, metadata_only: bool) -> Value {
    let mut v = if metadata_only {
        json!({
            "apiVersion": obj.get("apiVersion").cloned().unwrap_or(Value::Null),
            "kind": obj.get("kind").cloned().unwrap_or(Value::Null),
            "metadata": obj.get("metadata").cloned().unwrap_or(Value::Null),
        })
    } else {
        obj.clone()
    };
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    v
}

fn bind(ctx: &mut Context, name: &str, v: Value) -> Option<Value> {
    ctx.data_mut()
        .as_object_mut()
        .and_then(|m| m.insert(name.to_string(), v))
}

fn unbind(ctx: &mut Context, name: &str, old: Option<Value>) {
    if let Some(m) = ctx.data_mut().as_object_mut() {
        match old {
            Some(o) => {
                m.insert(name.to_string(), o);
            }
            None => {
                m.remove(name);
            }
        }
    }
}

fn is_deleting(obj: &Value) -> bool {
    obj["metadata"]
        .get("deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

struct Evaluator<'a> {
    engine: &'a Engine,
    rule: &'a CompiledRule,
    /// What the current render looked up (see [`Read`]).
    reads: RefCell<Vec<Read>>,
    /// What the current render skipped with a warning.
    warnings: RefCell<Vec<FieldWarning>>,
    /// Whether templated strings are marked as data (policy rules).
    mark: Cell<bool>,
}

type Sets = Vec<(Option<String>, Vec<Desired>)>;

/// Records what a rule's reports mean for other rules' views: when it
/// changes (a trigger paused, the rule held), every kind it emits counts as
/// changed for the rules after it.
fn note_signature(
    memo: &mut Memo,
    changes: &mut Changes,
    rule: &CompiledRule,
    report: &RuleReport,
) {
    let sig = Signature {
        state: report.state,
        kept_triggers: report.kept_triggers.clone(),
        static_kept: report.static_kept,
    };
    if memo.signatures.get(&rule.name) != Some(&sig) {
        changes.whole.extend(rule.produces.iter().cloned());
        memo.signatures.insert(rule.name.clone(), sig);
    }
}

/// A rule's report and output sets from its trigger outcomes, in trigger
/// order.
fn assemble(rule: &str, memo: &RuleMemo) -> (RuleReport, Sets) {
    let mut report = RuleReport::new(RuleState::Evaluated);
    let mut sets = Vec::new();
    if let Some(s) = &memo.static_set {
        report
            .warnings
            .extend(s.warnings.iter().map(|w| w.clone().into_engine(rule, None)));
        match &s.outcome {
            Outcome::Rendered(d) => sets.push((None, d.clone())),
            Outcome::Failed(e) | Outcome::MatchError(e) => {
                report.errors.push(e.clone().into_engine(rule, None));
                report.static_kept = true;
            }
            Outcome::NoMatch | Outcome::Frozen => {}
        }
    }
    for (tref, t) in memo.triggers.values() {
        report.warnings.extend(
            t.warnings
                .iter()
                .map(|w| w.clone().into_engine(rule, Some(tref))),
        );
        match &t.outcome {
            Outcome::NoMatch => {}
            Outcome::MatchError(e) => {
                report.errors.push(e.clone().into_engine(rule, Some(tref)));
                report.kept_triggers.insert(tref.clone());
            }
            Outcome::Frozen => {
                report.matched_triggers += 1;
                report.kept_triggers.insert(tref.clone());
            }
            Outcome::Failed(e) => {
                report.matched_triggers += 1;
                report.errors.push(e.clone().into_engine(rule, Some(tref)));
                report.kept_triggers.insert(tref.clone());
            }
            Outcome::Rendered(d) => {
                report.matched_triggers += 1;
                sets.push((Some(tref.clone()), d.clone()));
            }
        }
    }
    (report, sets)
}

/// Keys of the objects that differ between two output sets.
fn differing(before: &[Desired], after: &[Desired], dirty: &mut Vec<OutKey>) {
    let index = |ds: &[Desired]| -> BTreeMap<OutKey, usize> {
        ds.iter()
            .enumerate()
            .map(|(i, d)| ((d.kind, d.namespace.clone(), d.name.clone()), i))
            .collect()
    };
    let (b, a) = (index(before), index(after));
    for (k, i) in &b {
        if a.get(k)
            .is_none_or(|j| after[*j].object != before[*i].object)
        {
            dirty.push(k.clone());
        }
    }
    for k in a.keys() {
        if !b.contains_key(k) {
            dirty.push(k.clone());
        }
    }
}

impl Evaluator<'_> {
    /// Every trigger's outcome, reusing `prev` where nothing it depends on
    /// changed. Returns the new memo, the emitted objects that differ from
    /// last time, and how many output sets were rendered.
    fn run(
        &self,
        view: &View,
        mut prev: RuleMemo,
        changes: &Changes,
    ) -> (RuleMemo, Vec<OutKey>, usize) {
        let mut memo = RuleMemo::default();
        let mut dirty = Vec::new();
        let mut renders = 0;
        let untouched = |m: &TriggerMemo| !m.reads.iter().any(|r| view.touches(changes, r));
        let Some(trigger) = &self.rule.spec.trigger else {
            let reuse = prev
                .static_set
                .take()
                .filter(|m| !changes.all && untouched(m));
            let entry = match reuse {
                Some(m) => m,
                None => {
                    renders += 1;
                    let budget = limits::start(&self.engine.options.limits);
                    let mut ctx = self.base_context();
                    let outcome = match self.render(&mut ctx, None, view) {
                        Ok(outs) => Outcome::Rendered(outs),
                        Err(e) => Outcome::Failed(e),
                    };
                    drop(budget);
                    let before = prev
                        .static_set
                        .as_ref()
                        .map(|m| m.outcome.outputs())
                        .unwrap_or_default();
                    differing(before, outcome.outputs(), &mut dirty);
                    TriggerMemo {
                        outcome,
                        reads: self.reads.take(),
                        warnings: self.take_warnings(),
                    }
                }
            };
            memo.static_set = Some(entry);
            return (memo, dirty, renders);
        };
        let gk = GroupKind::new(&trigger.api_group, &trigger.kind);
        for obj in view.list(&gk, None).iter().copied() {
            let Some(key) = key_of(obj) else { continue };
            let old = prev.triggers.remove(&key);
            if let Some((tref, m)) = &old
                && !changes.contains(&gk, &key)
                && untouched(m)
            {
                memo.triggers.insert(key, (tref.clone(), m.clone()));
                continue;
            }
            renders += 1;
            let tref = object_ref(obj);
            let budget = limits::start(&self.engine.options.limits);
            let outcome = self.trigger_outcome(trigger, obj, view);
            drop(budget);
            let before = old
                .as_ref()
                .map(|(_, m)| m.outcome.outputs())
                .unwrap_or_default();
            differing(before, outcome.outputs(), &mut dirty);
            memo.triggers.insert(
                key,
                (
                    tref,
                    TriggerMemo {
                        outcome,
                        reads: self.reads.take(),
                        warnings: self.take_warnings(),
                    },
                ),
            );
        }
        // Triggers that are gone: their objects are gone from the output.
        for (_, (_, m)) in prev.triggers {
            differing(m.outcome.outputs(), &[], &mut dirty);
        }
        (memo, dirty, renders)
    }

    /// Matches and renders one candidate trigger.
    fn trigger_outcome(&self, trigger: &Trigger, obj: &Value, view: &View) -> Outcome {
        self.reads.borrow_mut().clear();
        self.warnings.borrow_mut().clear();
        let seen = visible(obj, trigger.metadata_only);
        let mut ctx = self.base_context();
        bind(&mut ctx, "trigger", seen.clone());
        let matches = match self.trigger_matches(trigger, &seen, &mut ctx) {
            Ok(None) => return Outcome::NoMatch,
            Ok(Some(m)) => m,
            Err(e) => return Outcome::MatchError(e),
        };
        let paused = trigger.pause.as_ref().is_some_and(|p| {
            obj["metadata"]["annotations"][p.annotation.as_str()].as_str() == Some(p.value.as_str())
        });
        if paused || is_deleting(obj) {
            return Outcome::Frozen;
        }
        // A trigger whose data the rule does not believe renders nothing:
        // its earlier outputs go, with a warning rather than an error.
        for (i, c) in trigger.require.iter().enumerate() {
            match self.check(&format!("spec.trigger.require[{i}]"), c, &seen, &ctx) {
                Ok(None) => {}
                Ok(Some(w)) => {
                    self.warnings.borrow_mut().push(w);
                    return Outcome::Rendered(Vec::new());
                }
                Err(e) => return Outcome::Failed(e),
            }
        }
        if let Some(m) = matches {
            bind(&mut ctx, "matches", Value::Array(m));
        }
        match self.render(&mut ctx, Some(obj), view) {
            Ok(outs) => Outcome::Rendered(outs),
            Err(e) => Outcome::Failed(e),
        }
    }

    /// The warnings of the render just done, sorted and de-duplicated.
    fn take_warnings(&self) -> Vec<FieldWarning> {
        let mut w = self.warnings.take();
        w.sort();
        w.dedup();
        w
    }

    fn base_context(&self) -> Context {
        Context::from(json!({"rule": {"name": self.rule.name}, "related": {}}))
    }

    /// `Ok(None)`: no match. `Ok(Some(matches))`: a match, with the
    /// metadata matches when the trigger asks for them.
    fn trigger_matches(
        &self,
        t: &Trigger,
        obj: &Value,
        ctx: &mut Context,
    ) -> Result<Option<Option<Vec<Value>>>> {
        if let Some(sel) = &t.selector
            && !crate::selector::matches_json(sel, obj["metadata"]["labels"].as_object())
        {
            return Ok(None);
        }
        for (i, c) in t.conditions.iter().enumerate() {
            if !self.condition(&format!("spec.trigger.conditions[{i}]"), c, obj, ctx)? {
                return Ok(None);
            }
        }
        let Some(mm) = &t.metadata_match else {
            return Ok(Some(None));
        };
        let source = match mm.source {
            MetadataSource::Annotations => "annotations",
            MetadataSource::Labels => "labels",
        };
        let key_re = self.regex("spec.trigger.metadataMatch.key", &mm.key)?;
        let val_re = match &mm.value {
            Some(v) => Some(self.regex("spec.trigger.metadataMatch.value", v)?),
            None => None,
        };
        let mut found = Vec::new();
        if let Some(m) = obj["metadata"][source].as_object() {
            // serde_json maps are sorted by key: matches come out sorted.
            for (k, v) in m {
                let Some(v) = v.as_str() else { continue };
                let Some(kc) = key_re.captures(k) else {
                    continue;
                };
                let mut entry = Map::new();
                entry.insert("key".into(), json!(k));
                entry.insert("value".into(), json!(v));
                for name in key_re.capture_names().flatten() {
                    if let Some(c) = kc.name(name) {
                        entry.insert(name.to_string(), json!(c.as_str()));
                    }
                }
                if let Some(vre) = &val_re {
                    let Some(vc) = vre.captures(v) else { continue };
                    for name in vre.capture_names().flatten() {
                        if let Some(c) = vc.name(name) {
                            entry.insert(name.to_string(), json!(c.as_str()));
                        }
                    }
                }
                found.push(Value::Object(entry));
            }
        }
        Ok(if found.is_empty() {
            None
        } else {
            Some(Some(found))
        })
    }

    fn regex(&self, field: &str, text: &str) -> Result<regex::Regex> {
        match self.rule.regexes.get(text) {
            Some(r) => Ok(r.clone()),
            None => anchored(text).map_err(|e| {
                FieldError::new(
                    ErrorKind::Regex,
                    field,
                    format!("invalid regular expression {text:?}: {e}"),
                )
            }),
        }
    }

    fn tpl(&self, field: &str, text: &str, ctx: &Context) -> Result<String> {
        self.engine
            .templates
            .render(text, ctx)
            .map_err(|e| template_error(field, e))
    }

    fn expr<'c>(&self, field: &str, text: &str, ctx: &'c Context) -> Result<Cow<'c, Value>> {
        self.engine
            .templates
            .eval_ref(text, ctx)
            .map_err(|e| template_error(field, e))
    }

    fn condition(
        &self,
        field: &str,
        c: &Condition,
        subject: &Value,
        ctx: &Context,
    ) -> Result<bool> {
        Ok(self.test(field, c, subject, ctx)?.0)
    }

    /// A `require` condition: `Some(warning)` when it fails.
    fn check(
        &self,
        field: &str,
        c: &Condition,
        subject: &Value,
        ctx: &Context,
    ) -> Result<Option<FieldWarning>> {
        let (ok, shown) = self.test(field, c, subject, ctx)?;
        if ok {
            return Ok(None);
        }
        let message = match (&c.message, c.format) {
            (Some(m), _) => m.clone(),
            (None, Some(f)) => format!("not a valid {}", f.as_str()),
            (None, None) => "does not pass the condition".to_string(),
        };
        Ok(Some(FieldWarning::new(field, &shown, message)))
    }

    /// Whether the condition holds, and the tested value as a warning
    /// shows it.
    fn test(
        &self,
        field: &str,
        c: &Condition,
        subject: &Value,
        ctx: &Context,
    ) -> Result<(bool, String)> {
        const MISSING: &str = "(missing)";
        let actual: Option<String> = match (&c.path, &c.value) {
            (Some(p), _) => {
                let path = FieldPath::parse(p).map_err(|e| {
                    FieldError::new(ErrorKind::InvalidRule, format!("{field}.path"), e)
                })?;
                let v = path.get(subject).filter(|v| !v.is_null());
                let shown = match v {
                    None => MISSING.to_string(),
                    Some(x) => scalar_text(x).unwrap_or_else(|| x.to_string()),
                };
                if let Some(want) = c.exists {
                    return Ok((v.is_some() == want, shown));
                }
                if v.is_none() && c.optional {
                    return Ok((true, shown));
                }
                v.and_then(scalar_text)
            }
            (None, Some(t)) => Some(self.tpl(&format!("{field}.value"), t, ctx)?),
            (None, None) => None,
        };
        let shown = actual.clone().unwrap_or_else(|| MISSING.to_string());
        let ok = self.holds(field, c, actual.as_deref(), ctx)?;
        Ok((ok, shown))
    }

    /// Whether the operator holds for the tested text (None: missing).
    fn holds(
        &self,
        field: &str,
        c: &Condition,
        actual: Option<&str>,
        ctx: &Context,
    ) -> Result<bool> {
        if let Some(e) = &c.equals {
            let want = self.tpl(&format!("{field}.equals"), e, ctx)?;
            return Ok(actual == Some(want.as_str()));
        }
        if let Some(e) = &c.not_equals {
            let want = self.tpl(&format!("{field}.notEquals"), e, ctx)?;
            return Ok(actual != Some(want.as_str()));
        }
        if let Some(list) = &c.one_of {
            for (i, e) in list.iter().enumerate() {
                let want = self.tpl(&format!("{field}.oneOf[{i}]"), e, ctx)?;
                if actual == Some(want.as_str()) {
                    return Ok(true);
                }
            }
            return Ok(false);
        }
        if let Some(r) = &c.regex {
            let text = self.tpl(&format!("{field}.regex"), r, ctx)?;
            let re = self.regex(&format!("{field}.regex"), &text)?;
            return Ok(actual.is_some_and(|a| re.is_match(a)));
        }
        if let Some(r) = &c.not_regex {
            let text = self.tpl(&format!("{field}.notRegex"), r, ctx)?;
            let re = self.regex(&format!("{field}.notRegex"), &text)?;
            return Ok(!actual.is_some_and(|a| re.is_match(a)));
        }
        if let Some(e) = &c.in_list {
            let Some(a) = actual else { return Ok(false) };
            let list = self.list_of(&format!("{field}.in"), e, ctx)?;
            return Ok(list.iter().any(|x| scalar_text(x).as_deref() == Some(a)));
        }
        if let Some(f) = c.format {
            return Ok(actual.is_some_and(|a| super::format::check(f, a)));
        }
        Ok(false)
    }

    /// Expands a template value: strings rendered, list directives run,
    /// `$merge` maps merged.
    fn expand(&self, v: &Value, ctx: &mut Context, field: &str) -> Result<Value> {
        // Every expanded value is charged: nested forEach multiply.
        limited(field, limits::charge_node())?;
        match v {
            Value::String(s) => {
                let text = self.tpl(field, s, ctx)?;
                if self.mark.get() && s.contains("{{") {
                    let mut marked = String::with_capacity(text.len() + 1);
                    marked.push(output::DATA_MARK);
                    marked.push_str(&text);
                    return Ok(Value::String(marked));
                }
                Ok(Value::String(text))
            }
            Value::Array(items) => {
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let f = format!("{field}[{i}]");
                    let d = directive(item)
                        .map_err(|m| FieldError::new(ErrorKind::InvalidRule, &f, m))?;
                    let Some(d) = d else {
                        out.push(self.expand(item, ctx, &f)?);
                        continue;
                    };
                    let emit =
                        |this: &Self, ctx: &mut Context, out: &mut Vec<Value>| -> Result<()> {
                            if let Some(w) = d.when
                                && !truthy(&*this.expr(&format!("{f}.when"), w, ctx)?)
                            {
                                return Ok(());
                            }
                            match d.body {
                                DirBody::Item(b) => {
                                    out.push(this.expand(b, ctx, &format!("{f}.item"))?)
                                }
                                DirBody::Items(b) => {
                                    match this.expand(b, ctx, &format!("{f}.items"))? {
                                        Value::Array(xs) => out.extend(xs),
                                        other => out.push(other),
                                    }
                                }
                            }
                            Ok(())
                        };
                    match d.for_each {
                        None => emit(self, ctx, &mut out)?,
                        Some(e) => {
                            let var = d.as_name.unwrap_or("item");
                            for x in self.list_of(&format!("{f}.forEach"), e, ctx)? {
                                let old = bind(ctx, var, x);
                                let r = emit(self, ctx, &mut out);
                                unbind(ctx, var, old);
                                r?;
                            }
                        }
                    }
                    limited(&f, limits::check_list(out.len(), "the expanded list"))?;
                }
                Ok(Value::Array(out))
            }
            Value::Object(map) => {
                let mut out = Map::new();
                for (k, val) in map {
                    if k == "$merge" {
                        let merged = self.expand(val, ctx, &format!("{field}.$merge"))?;
                        for (j, part) in merged.as_array().into_iter().flatten().enumerate() {
                            let Value::Object(pm) = part else {
                                return Err(FieldError::new(
                                    ErrorKind::InvalidRule,
                                    format!("{field}.$merge[{j}]"),
                                    "must render to a map",
                                ));
                            };
                            for (pk, pv) in pm {
                                if out
                                    .insert(pk.clone(), pv.clone())
                                    .is_some_and(|old| old != *pv)
                                {
                                    return Err(FieldError::new(
                                        ErrorKind::InvalidOutput,
                                        format!("{field}.$merge[{j}]"),
                                        format!("key {pk:?} is given twice with different values"),
                                    ));
                                }
                            }
                        }
                        continue;
                    }
                    let key = self.tpl(&format!("{field}[{k:?}]"), k, ctx)?;
                    let val = self.expand(val, ctx, &format!("{field}.{k}"))?;
                    if out.insert(key.clone(), val).is_some() {
                        return Err(FieldError::new(
                            ErrorKind::InvalidOutput,
                            field,
                            format!("key {key:?} is rendered twice"),
                        ));
                    }
                }
                Ok(Value::Object(out))
            }
            other => Ok(other.clone()),
        }
    }

    /// Evaluates a `forEach` expression: a list (null is empty).
    fn list_of(&self, field: &str, e: &str, ctx: &Context) -> Result<Vec<Value>> {
        let v = self.expr(field, e, ctx)?;
        // Checked before a borrowed list is copied.
        if let Value::Array(a) = &*v {
            limited(field, limits::check_list(a.len(), "the forEach list"))?;
        }
        match v.into_owned() {
            Value::Array(a) => Ok(a),
            Value::Null => Ok(Vec::new()),
            other => Err(FieldError::new(
                ErrorKind::Template,
                field,
                format!("forEach must yield a list, got {other}"),
            )),
        }
    }

    fn strings(&self, field: &str, v: &Value, ctx: &mut Context) -> Result<Vec<String>> {
        match self.expand(v, ctx, field)? {
            Value::Array(a) => a
                .into_iter()
                .enumerate()
                .map(|(i, x)| {
                    scalar_text(&x).ok_or_else(|| {
                        FieldError::new(
                            ErrorKind::InvalidOutput,
                            format!("{field}[{i}]"),
                            "must render to text",
                        )
                    })
                })
                .collect(),
            _ => Err(FieldError::new(
                ErrorKind::InvalidOutput,
                field,
                "must render to a list",
            )),
        }
    }

    fn selector(&self, field: &str, sel: &LabelSelector, ctx: &Context) -> Result<LabelSelector> {
        let mut out = LabelSelector::default();
        if let Some(ml) = &sel.match_labels {
            let mut m = BTreeMap::new();
            for (k, v) in ml {
                let f = format!("{field}.matchLabels[{k:?}]");
                m.insert(self.tpl(&f, k, ctx)?, self.tpl(&f, v, ctx)?);
            }
            out.match_labels = Some(m);
        }
        if let Some(exprs) = &sel.match_expressions {
            let mut rendered = Vec::new();
            for (i, e) in exprs.iter().enumerate() {
                let f = format!("{field}.matchExpressions[{i}]");
                let values = match &e.values {
                    Some(vs) => Some(
                        vs.iter()
                            .enumerate()
                            .map(|(j, v)| self.tpl(&format!("{f}.values[{j}]"), v, ctx))
                            .collect::<Result<Vec<_>>>()?,
                    ),
                    None => None,
                };
                rendered.push(LabelSelectorRequirement {
                    key: self.tpl(&format!("{f}.key"), &e.key, ctx)?,
                    operator: e.operator.clone(),
                    values,
                });
            }
            out.match_expressions = Some(rendered);
        }
        crate::selector::validate(&out)
            .map_err(|e| FieldError::new(ErrorKind::Selector, field, e.to_string()))?;
        Ok(out)
    }

    fn related(
        &self,
        i: usize,
        rel: &Related,
        ctx: &mut Context,
        trigger: Option<&Value>,
        view: &View,
    ) -> Result<Vec<Value>> {
        let f = format!("spec.related[{i}]");
        if let Some(w) = &rel.when
            && !truthy(&*self.expr(&format!("{f}.when"), w, ctx)?)
        {
            return Ok(Vec::new());
        }
        let mut items: Vec<Value> = if let Some(q) = &rel.objects {
            let gk = GroupKind::new(&q.api_group, &q.kind);
            let ns = match &q.namespace {
                Some(t) => Some(self.tpl(&format!("{f}.objects.namespace"), t, ctx)?),
                None => None,
            };
            let names: Option<BTreeSet<String>> = match &q.names {
                Some(n) => Some(
                    self.strings(&format!("{f}.objects.names"), n, ctx)?
                        .into_iter()
                        .collect(),
                ),
                None => None,
            };
            let selector = match &q.selector {
                Some(s) => Some(self.selector(&format!("{f}.objects.selector"), s, ctx)?),
                None => None,
            };
            let mut read = Read {
                gk: gk.clone(),
                namespace: ns.clone(),
                names,
                selector,
                either: false,
                owner: if q.controlled_by_trigger {
                    // Without a trigger nothing is controlled by it.
                    Some(trigger.map(Owner::of).unwrap_or(Owner {
                        uid: "\u{0}none".into(),
                        gk: None,
                        name: String::new(),
                    }))
                } else {
                    None
                },
                hits: BTreeSet::new(),
            };
            let found: Vec<&Value> = view
                .list(&gk, ns.as_deref())
                .iter()
                .copied()
                .filter(|o| read.passes(o))
                .collect();
            read.hits = found.iter().filter_map(|o| key_of(o)).collect();
            self.reads.borrow_mut().push(read);
            found
                .into_iter()
                .map(|o| visible(o, q.metadata_only))
                .collect()
        } else if let Some(l) = &rel.list_field {
            let path = FieldPath::parse(&l.path).map_err(|e| {
                FieldError::new(ErrorKind::InvalidRule, format!("{f}.listField.path"), e)
            })?;
            let default_of = ["trigger".to_string()];
            let of = if l.of.is_empty() {
                &default_of[..]
            } else {
                &l.of[..]
            };
            let mut sources: Vec<Value> = Vec::new();
            for name in of {
                if name == "trigger" {
                    sources.extend(ctx.data().get("trigger").cloned());
                } else {
                    sources.extend(
                        ctx.data()["related"][name.as_str()]
                            .as_array()
                            .cloned()
                            .unwrap_or_default(),
                    );
                }
            }
            let extract = match &l.extract {
                Some(x) => Some((
                    FieldPath::parse(&x.path).map_err(|e| {
                        FieldError::new(
                            ErrorKind::InvalidRule,
                            format!("{f}.listField.extract.path"),
                            e,
                        )
                    })?,
                    self.regex(&format!("{f}.listField.extract.regex"), &x.regex)?,
                    x.unmatched,
                )),
                None => None,
            };
            let mut seen = BTreeMap::new();
            for src in &sources {
                for entry in path
                    .get(src)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let item = match &extract {
                        None => entry.clone(),
                        Some((xp, re, unmatched)) => {
                            let text = xp.get(entry).and_then(Value::as_str);
                            let caps = text.and_then(|t| re.captures(t));
                            let (Value::Object(m), Some(caps)) = (entry, caps) else {
                                match unmatched {
                                    Unmatched::Drop => {}
                                    Unmatched::Keep => {
                                        seen.insert(entry.to_string(), entry.clone());
                                    }
                                    Unmatched::Warn => {
                                        let shown = match (entry, text) {
                                            (Value::Object(_), Some(t)) => t.to_string(),
                                            (Value::Object(_), None) => "(missing)".to_string(),
                                            _ => entry.to_string(),
                                        };
                                        self.warnings.borrow_mut().push(FieldWarning::new(
                                            format!("{f}.listField.extract"),
                                            &shown,
                                            "does not match the extract regex",
                                        ));
                                    }
                                }
                                continue;
                            };
                            let mut m = m.clone();
                            for name in re.capture_names().flatten() {
                                if let Some(c) = caps.name(name) {
                                    m.insert(name.to_string(), json!(c.as_str()));
                                }
                            }
                            Value::Object(m)
                        }
                    };
                    seen.insert(item.to_string(), item);
                }
            }
            seen.into_values().collect()
        } else {
            Vec::new()
        };
        if !rel.filter.is_empty() {
            let mut kept = Vec::with_capacity(items.len());
            for item in items {
                let old = bind(ctx, "item", item.clone());
                let mut ok = Ok(true);
                for (j, c) in rel.filter.iter().enumerate() {
                    ok = self.condition(&format!("{f}.where[{j}]"), c, &item, ctx);
                    if !matches!(ok, Ok(true)) {
                        break;
                    }
                }
                unbind(ctx, "item", old);
                if ok? {
                    kept.push(item);
                }
            }
            items = kept;
        }
        if !rel.require.is_empty() {
            let mut kept = Vec::with_capacity(items.len());
            for item in items {
                let old = bind(ctx, "item", item.clone());
                let mut verdict = Ok(None);
                for (j, c) in rel.require.iter().enumerate() {
                    verdict = self.check(&format!("{f}.require[{j}]"), c, &item, ctx);
                    if !matches!(verdict, Ok(None)) {
                        break;
                    }
                }
                unbind(ctx, "item", old);
                match verdict? {
                    None => kept.push(item),
                    Some(w) => self.warnings.borrow_mut().push(w),
                }
            }
            items = kept;
        }
        Ok(items)
    }

    /// Renders every output for one trigger (or the static set).
    fn render(
        &self,
        ctx: &mut Context,
        trigger: Option<&Value>,
        view: &View,
    ) -> Result<Vec<Desired>> {
        for (i, rel) in self.rule.spec.related.iter().enumerate() {
            let set = self.related(i, rel, ctx, trigger, view)?;
            if let Some(r) = ctx
                .data_mut()
                .get_mut("related")
                .and_then(Value::as_object_mut)
            {
                r.insert(rel.name.clone(), Value::Array(set));
            }
        }
        bind(ctx, "vars", Value::Object(Map::new()));
        for (i, v) in self.rule.spec.vars.iter().enumerate() {
            let field = format!("spec.vars[{i}].value");
            let value = self.expr(&field, &v.value, ctx)?.into_owned();
            if let Value::Array(a) = &value {
                limited(
                    &field,
                    limits::check_list(a.len(), &format!("var {:?}", v.name)),
                )?;
            }
            if let Some(vars) = ctx
                .data_mut()
                .get_mut("vars")
                .and_then(Value::as_object_mut)
            {
                vars.insert(v.name.clone(), value);
            }
        }
        let mut out: Vec<Desired> = Vec::new();
        for (i, o) in self.rule.spec.outputs.iter().enumerate() {
            let f = format!("spec.outputs[{i}]");
            let one = |this: &Self, ctx: &mut Context, out: &mut Vec<Desired>| -> Result<()> {
                if let Some(w) = &o.when
                    && !truthy(&*this.expr(&format!("{f}.when"), w, ctx)?)
                {
                    return Ok(());
                }
                let d = this.object(&f, o, ctx, trigger, view)?;
                if let Some(prev) = out
                    .iter()
                    .find(|p| p.kind == d.kind && p.namespace == d.namespace && p.name == d.name)
                {
                    if prev.object != d.object {
                        return Err(FieldError::new(
                            ErrorKind::Conflict,
                            &f,
                            format!(
                                "{} {:?} is emitted twice with different content",
                                d.kind, d.name
                            ),
                        ));
                    }
                    return Ok(());
                }
                out.push(d);
                limited(&f, limits::check_objects(out.len()))
            };
            match &o.for_each {
                None => one(self, ctx, &mut out)?,
                Some(e) => {
                    let var = o.as_name.as_deref().unwrap_or("item");
                    for x in self.list_of(&format!("{f}.forEach"), e, ctx)? {
                        let old = bind(ctx, var, x);
                        let r = one(self, ctx, &mut out);
                        unbind(ctx, var, old);
                        r?;
                    }
                }
            }
        }
        Ok(out)
    }

    fn object(
        &self,
        f: &str,
        o: &crate::api::Output,
        ctx: &mut Context,
        trigger: Option<&Value>,
        view: &View,
    ) -> Result<Desired> {
        let name = self.tpl(&format!("{f}.name"), &o.name, ctx)?;
        output::validate_name(&format!("{f}.name"), &name)?;
        let namespace = if o.kind.namespaced() {
            let ns = match &o.namespace {
                Some(t) => self.tpl(&format!("{f}.namespace"), t, ctx)?,
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
            output::validate_namespace(&format!("{f}.namespace"), &ns)?;
            Some(ns)
        } else {
            None
        };

        let mut labels = BTreeMap::new();
        if let Some(l) = &o.labels {
            labels = output::string_map(
                &format!("{f}.labels"),
                &self.expand(l, ctx, &format!("{f}.labels"))?,
            )?;
        }
        let mut annotations = BTreeMap::new();
        if let Some(a) = &o.annotations {
            annotations = output::string_map(
                &format!("{f}.annotations"),
                &self.expand(a, ctx, &format!("{f}.annotations"))?,
            )?;
        }
        for k in labels.keys().chain(annotations.keys()) {
            if k.starts_with(&format!("{GROUP}/")) || k == MANAGED_BY_LABEL {
                return Err(FieldError::new(
                    ErrorKind::InvalidRule,
                    format!("{f}.labels"),
                    format!("key {k:?} is reserved for provenance"),
                ));
            }
        }
        for (k, v) in &labels {
            output::validate_key(&format!("{f}.labels"), k)?;
            output::validate_label_value(&format!("{f}.labels"), k, v)?;
        }
        for k in annotations.keys() {
            output::validate_key(&format!("{f}.annotations"), k)?;
        }
        labels.insert(MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string());
        labels.insert(
            output::rule_label(),
            super::template::shorten(&self.rule.name, 63),
        );
        annotations.insert(output::rule_annotation(), self.rule.name.clone());
        if let Some(t) = trigger {
            annotations.insert(output::trigger_annotation(), object_ref(t));
        }
        let owner = trigger.and_then(|t| owner_reference(t, namespace.as_deref()));

        // A `*` from data: the object is refused (and revoked) after the
        // render, not failed.
        let mut refusal = None;
        let body = if o.kind.is_role() {
            let namespaced = o.kind.namespaced();
            let mut rules: Vec<PolicyRule> = match &o.rules {
                Some(r) => {
                    let field = format!("{f}.rules");
                    // Values rendered from templates are marked as data.
                    self.mark.set(true);
                    let expanded = self.expand(r, ctx, &field);
                    self.mark.set(false);
                    let mut expanded = expanded?;
                    refusal = output::check_marked_rules(&field, &mut expanded)?;
                    output::policy_rules(&field, &expanded, namespaced)?
                }
                None => Vec::new(),
            };
            if let Some(rf) = &o.rules_from {
                rules.extend(self.rules_from(&format!("{f}.rulesFrom"), rf, ctx, view)?);
                if namespaced {
                    rules = policy::without_non_resource_urls(&rules);
                }
                rules = policy::compact(&rules);
            }
            let aggregation = match &o.aggregation_rule {
                Some(a) => Some(output::aggregation_rule(
                    &format!("{f}.aggregationRule"),
                    &self.expand(a, ctx, &format!("{f}.aggregationRule"))?,
                )?),
                None => None,
            };
            Body::Role { rules, aggregation }
        } else {
            let rr = o.role_ref.as_ref().ok_or_else(|| {
                FieldError::new(
                    ErrorKind::InvalidRule,
                    format!("{f}.roleRef"),
                    "a binding needs roleRef",
                )
            })?;
            let role_kind = self.tpl(&format!("{f}.roleRef.kind"), &rr.kind, ctx)?;
            let role_name = self.tpl(&format!("{f}.roleRef.name"), &rr.name, ctx)?;
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
            output::validate_name(&format!("{f}.roleRef.name"), &role_name)?;
            let subjects = match &o.subjects {
                Some(s) => output::subjects(
                    &format!("{f}.subjects"),
                    &self.expand(s, ctx, &format!("{f}.subjects"))?,
                    o.kind,
                )?,
                None => Vec::new(),
            };
            Body::Binding {
                role_kind,
                role_name,
                subjects,
            }
        };
        let meta = Meta {
            name: name.clone(),
            namespace: namespace.clone(),
            labels,
            annotations,
            owner,
        };
        Ok(Desired {
            kind: o.kind,
            namespace: namespace.unwrap_or_default(),
            name,
            rule: self.rule.name.clone(),
            trigger: trigger.map(object_ref),
            field: f.to_string(),
            refusal,
            object: Arc::new(output::manifest(o.kind, &meta, &body)?),
        })
    }

    /// Rules of the ClusterRoles named or selected, in name order.
    fn rules_from(
        &self,
        f: &str,
        rf: &RulesFrom,
        ctx: &mut Context,
        view: &View,
    ) -> Result<Vec<PolicyRule>> {
        let names: BTreeSet<String> = match &rf.cluster_role_names {
            Some(n) => self
                .strings(&format!("{f}.clusterRoleNames"), n, ctx)?
                .into_iter()
                .collect(),
            None => BTreeSet::new(),
        };
        let selector = match &rf.cluster_role_selector {
            Some(s) => Some(self.selector(&format!("{f}.clusterRoleSelector"), s, ctx)?),
            None => None,
        };
        let roles = view.list(&output_gk(OutputKind::ClusterRole), None);
        // Sorted by (namespace "", name): names are found by binary search.
        let mut chosen: BTreeMap<&str, &Value> = BTreeMap::new();
        for n in &names {
            if let Ok(i) = roles.binary_search_by(|r| {
                r["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .cmp(n.as_str())
            }) {
                chosen.insert(n.as_str(), roles[i]);
            }
        }
        if let Some(s) = &selector {
            for role in view.selected_cluster_roles(s).iter().copied() {
                chosen.insert(role["metadata"]["name"].as_str().unwrap_or_default(), role);
            }
        }
        self.reads.borrow_mut().push(Read {
            gk: output_gk(OutputKind::ClusterRole),
            namespace: None,
            hits: chosen
                .keys()
                .map(|n| (String::new(), (*n).to_string()))
                .collect(),
            names: Some(names.clone()),
            selector: selector.clone(),
            either: true,
            owner: None,
        });
        let mut out = Vec::new();
        for role in chosen.into_values() {
            out.extend(rules_of(role));
        }
        Ok(out)
    }
}

/// A render error: `LimitExceeded` when the trigger ran over a limit
/// (whatever failed first), else a template error.
fn template_error(field: &str, message: String) -> FieldError {
    match limits::tripped() {
        Some(t) => FieldError::new(ErrorKind::LimitExceeded, field, t),
        None => FieldError::new(ErrorKind::Template, field, message),
    }
}

/// A limit check's result as an error on `field`.
fn limited(field: &str, r: std::result::Result<(), String>) -> Result<()> {
    r.map_err(|m| FieldError::new(ErrorKind::LimitExceeded, field, m))
}

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
fn owner_reference(trigger: &Value, namespace: Option<&str>) -> Option<Value> {
    let meta = &trigger["metadata"];
    let uid = meta["uid"].as_str().filter(|u| !u.is_empty())?;
    let trigger_ns = meta["namespace"].as_str().unwrap_or_default();
    if !trigger_ns.is_empty() && namespace != Some(trigger_ns) {
        return None;
    }
    Some(json!({
        "apiVersion": trigger["apiVersion"],
        "kind": trigger["kind"],
        "name": meta["name"],
        "uid": uid,
        "controller": true,
        "blockOwnerDeletion": true,
    }))
}
