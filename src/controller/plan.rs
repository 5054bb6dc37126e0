//! The pure diff: (evaluation, live managed objects) → the writes to make.
//!
//! No client here. A desired object is written only when its semantic
//! content differs from the live copy (see [`differences`]), so a resync of
//! an unchanged cluster plans nothing, and a change to one trigger plans
//! writes for exactly the objects whose rendering changed.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use crate::api::OutputKind;
use crate::engine::output::{adopted_annotation, deletion_policy_annotation};
use crate::engine::{Desired, Evaluation, Manifest};

use super::live::{Live, ObjectId, differences, digest};

/// Field manager of every write, and the manager whose managedFields entry
/// says which labels and annotations are ours (and that the object is).
pub use crate::engine::output::FIELD_MANAGER;

/// Annotation Helm 3 puts on every object of a release.
pub const HELM_RELEASE_ANNOTATION: &str = "meta.helm.sh/release-name";
/// Annotation telling Helm to leave an object behind when a release no
/// longer contains it.
pub const HELM_RESOURCE_POLICY: &str = "helm.sh/resource-policy";

/// Adds `helm.sh/resource-policy: keep` to a desired manifest when the
/// existing object was installed by Helm: once adopted, a chart upgrade
/// that drops it must not delete it. Called on adoption and on every later
/// plan (the live object still carries Helm's annotation), so our applies
/// keep the annotation instead of removing it.
pub fn keep_helm_annotation(desired: &mut Value, existing: &Value) {
    if is_helm_released(existing) {
        add_helm_keep(desired);
    }
}

/// Whether `existing` carries Helm's release annotation.
pub fn is_helm_released(existing: &Value) -> bool {
    existing["metadata"]["annotations"][HELM_RELEASE_ANNOTATION].is_string()
}

fn add_helm_keep(desired: &mut Value) {
    add_annotation(desired, HELM_RESOURCE_POLICY, "keep");
}

/// Marks a manifest as adopted ([`adopted_annotation`]).
pub fn mark_adopted(desired: &mut Value) {
    add_annotation(desired, &adopted_annotation(), "true");
}

fn add_annotation(desired: &mut Value, key: &str, value: &str) {
    let Some(meta) = desired.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let annotations = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(a) = annotations.as_object_mut() {
        a.insert(key.into(), Value::String(value.into()));
    }
}

/// Why an object is applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApplyAction {
    /// Not among our live objects: the writer first checks that no object
    /// without our provenance has the name, then creates it.
    Create,
    /// Ours and different; the parts that differ.
    Update(Vec<&'static str>),
    /// A binding whose roleRef changed. roleRef is immutable, so the live
    /// binding is deleted (with uid and resourceVersion preconditions) and
    /// the new one applied right after: the subjects lose the binding for
    /// one round-trip. Rules that rename bindings instead get no gap, since
    /// new objects are applied before old ones are pruned.
    Recreate {
        /// uid of the live binding.
        uid: Option<String>,
        /// resourceVersion of the live binding.
        resource_version: Option<String>,
    },
}

/// One server-side apply.
#[derive(Clone, Debug, PartialEq)]
pub struct Apply {
    /// The object.
    pub id: ObjectId,
    /// Rule that wants it (the desired object's shared text).
    pub rule: std::sync::Arc<str>,
    /// The manifest to send, shared with the evaluation: its JSON body is
    /// built only when it is sent ([`Apply::body`]), so a pass of thousands
    /// of writes never holds them all as JSON at once.
    pub object: Manifest,
    /// Whether to add Helm's keep annotation (see [`keep_helm_annotation`]):
    /// the live object carries Helm's release annotation.
    pub keep_helm: bool,
    /// Whether to add the adopted mark ([`adopted_annotation`]): the object
    /// existed before the controller took it over, so it is never pruned.
    /// Set on adoption, kept on every later apply (the live object has it).
    pub adopted: bool,
    /// Why.
    pub action: ApplyAction,
}

impl Apply {
    /// The body to send: the manifest, with Helm's keep annotation when
    /// [`Apply::keep_helm`].
    pub fn body(&self) -> Value {
        let mut v = self.object.to_value();
        if self.keep_helm {
            add_helm_keep(&mut v);
        }
        if self.adopted {
            mark_adopted(&mut v);
        }
        v
    }

    /// Whether the body differs from the manifest (sent as [`Apply::body`]).
    pub fn marked(&self) -> bool {
        self.keep_helm || self.adopted
    }
}

/// One deletion of a managed object nothing wants any more.
#[derive(Clone, Debug, PartialEq)]
pub struct Delete {
    /// The object.
    pub id: ObjectId,
    /// The rule named in its provenance.
    pub rule: String,
    /// uid precondition.
    pub uid: Option<String>,
    /// resourceVersion precondition: a concurrent edit (for example someone
    /// taking the object over by removing our label) makes the delete fail
    /// instead of destroying it.
    pub resource_version: Option<String>,
    /// Set when policy refuses the object (why): it is deleted whatever
    /// would keep it.
    pub revoked: Option<String>,
}

/// Why a live managed object is left as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepReason {
    /// Its rule failed, is inactive, or its trigger is paused, deleting or
    /// failed to render (`Evaluation::keeps`).
    Kept,
    /// Its rule waits for a watch (kind not served or not yet listed).
    Held,
    /// Two rules or triggers emit it.
    Contested,
    /// Carries our label but no rule annotation: provenance unknown.
    NoProvenance,
    /// Would be pruned, but the view is incomplete.
    PruneDeferred,
    /// A protected object (Kubernetes' bootstrap RBAC, the controller's
    /// own; see [`crate::policy::protected_object`]) that carries our label:
    /// never written, pruned or revoked, whatever its labels say.
    Protected,
    /// Its rule is gone and did not ask for deletion (`deletionPolicy:
    /// Orphan`, the default): left in place, granting what it granted.
    Orphaned,
    /// Carries `helm.sh/resource-policy: keep`: never pruned.
    ResourcePolicyKeep,
    /// Existed before the controller adopted it: released, never pruned.
    Adopted,
    /// One of more prunes of its rule in one pass than
    /// `--max-unconfirmed-prunes`: held until confirmed on the rule
    /// ([`CONFIRM_PRUNE_ANNOTATION`]).
    PruneHeld,
}

/// Why the object `id` (with labels read through `label`) is protected:
/// never written, adopted, pruned or revoked by the controller.
pub fn protected<'l>(
    id: &ObjectId,
    label: impl Fn(&str) -> Option<&'l str>,
) -> Option<&'static str> {
    crate::policy::protected_object(id.kind.as_str(), &id.name, label)
}

/// How many desired objects are already equal to the live ones, per rule:
/// counts, not a list (on a resync or a restart, every object is one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unchanged(BTreeMap<String, usize>);

impl Unchanged {
    /// Counts one more of `rule`'s objects.
    fn add(&mut self, rule: &str) {
        match self.0.get_mut(rule) {
            Some(n) => *n += 1,
            None => {
                self.0.insert(rule.to_string(), 1);
            }
        }
    }

    /// How many in all.
    pub fn len(&self) -> usize {
        self.0.values().sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many per rule, by rule name.
    pub fn per_rule(&self) -> impl Iterator<Item = (&str, usize)> {
        self.0.iter().map(|(r, n)| (r.as_str(), *n))
    }
}

/// The writes one reconcile makes, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Applies: roles before bindings (ObjectId order).
    pub applies: Vec<Apply>,
    /// Deletes, after every apply: bindings before roles.
    pub deletes: Vec<Delete>,
    /// Desired objects already equal to the live ones, counted by rule.
    pub unchanged: Unchanged,
    /// Live managed objects left alone, with their rule (if any).
    pub kept: Vec<(ObjectId, Option<String>, KeepReason)>,
    /// Per rule, the prunes held until confirmed ([`hold_mass_prunes`]).
    pub held_prunes: BTreeMap<String, HeldPrunes>,
}

impl Plan {
    /// Whether the plan writes nothing.
    pub fn is_empty(&self) -> bool {
        self.applies.is_empty() && self.deletes.is_empty()
    }
}

/// Computes the writes that make the live managed objects equal to the
/// evaluation.
///
/// - `held`: rules whose objects must not be touched at all (they were not
///   evaluated because a watch they need is not synced).
/// - `prune`: whether deletions are allowed; false while the view may be
///   incomplete. Applies are still planned.
///
/// Each live object found equal remembers the desired copy it equals, so
/// the next plan compares only what changed since (see [`Live`]).
pub fn plan(
    evaluation: &Evaluation,
    live: &BTreeMap<ObjectId, Live>,
    held: &BTreeSet<String>,
    prune: bool,
) -> Plan {
    let mut out = Plan::default();
    // Borrowed from the evaluation: no copy of every name per pass.
    let mut wanted: std::collections::HashSet<(OutputKind, &str, &str)> =
        std::collections::HashSet::with_capacity(evaluation.desired.len());
    for d in evaluation.desired.iter() {
        wanted.insert((d.kind, d.namespace.as_str(), d.name.as_str()));
        plan_desired(d, live, &mut out);
    }
    out.applies.sort_by(|a, b| a.id.cmp(&b.id));
    // Held for the whole write pass: no spare half of a doubled capacity
    // (thousands of entries on a first sync or a restart).
    out.applies.shrink_to_fit();

    for (id, l) in live {
        if wanted.contains(&(id.kind, &*id.namespace, &*id.name)) || !l.is_managed() {
            continue;
        }
        plan_unwanted(evaluation, id, l, held, prune, &mut out);
    }
    // Bindings go before the roles they name.
    out.deletes
        .sort_by(|a, b| b.id.kind.cmp(&a.id.kind).then(a.id.cmp(&b.id)));
    out
}

/// Plans one desired object: unchanged, an apply (create, update or
/// re-creation), or kept when it is protected.
fn plan_desired(d: &Desired, live: &BTreeMap<ObjectId, Live>, out: &mut Plan) {
    let id = ObjectId::new(d.kind, d.namespace.clone(), d.name.clone());
    // Policy refuses these already; the writer never trusts that alone.
    let live_label = |k: &str| live.get(&id).and_then(|l| l.label(k));
    if let Some(why) =
        protected(&id, |k| d.object.labels().get(k)).or_else(|| protected(&id, live_label))
    {
        tracing::error!(object = %id, reason = why, "a protected object is desired: not written");
        if live.contains_key(&id) {
            out.kept
                .push((id, Some(d.rule.to_string()), KeepReason::Protected));
        }
        return;
    }
    let adopted = live.get(&id).is_some_and(Live::is_adopted);
    let (action, keep_helm) = match live.get(&id) {
        None => (ApplyAction::Create, false),
        Some(l) => match change_of(d, l) {
            Some(change) => change,
            None => {
                out.unchanged.add(&d.rule);
                return;
            }
        },
    };
    out.applies.push(Apply {
        id,
        rule: d.rule.clone(),
        object: d.object.clone(),
        keep_helm,
        adopted,
        action,
    });
}

/// How a live object must change to equal its desired copy, and whether
/// it keeps Helm's resource policy; `None`: it equals it already (and
/// remembers that, so the next plan compares only what changed since).
fn change_of(d: &Desired, l: &Live) -> Option<(ApplyAction, bool)> {
    if l.is_known_equal(&d.object) {
        return None;
    }
    // Built for the comparison only, dropped after it.
    let mut object = d.object.to_value();
    let keep_helm = l.annotation(HELM_RELEASE_ANNOTATION).is_some();
    if keep_helm {
        add_helm_keep(&mut object);
    }
    if l.is_adopted() {
        mark_adopted(&mut object);
    }
    let diff = differences(&object, l);
    if diff.is_empty() {
        l.set_known_equal(Some(&d.object));
        return None;
    }
    l.set_known_equal(None);
    let action = if diff.contains(&"roleRef") {
        ApplyAction::Recreate {
            uid: l.uid().map(str::to_string),
            resource_version: l.resource_version().map(str::to_string),
        }
    } else {
        ApplyAction::Update(diff)
    };
    Some((action, keep_helm))
}

/// Plans one managed live object no rule wants now: revoked when policy
/// refuses it, kept for a reason, or deleted.
fn plan_unwanted(
    evaluation: &Evaluation,
    id: &ObjectId,
    l: &Live,
    held: &BTreeSet<String>,
    prune: bool,
    out: &mut Plan,
) {
    let rule = l.rule().map(str::to_string);
    // Someone labelled a protected object as ours: it is not.
    if protected(id, |k| l.label(k)).is_some() {
        out.kept.push((id.clone(), rule, KeepReason::Protected));
        return;
    }
    // A refusal revokes: no keep reason saves an object policy refuses
    // (only an incomplete view defers it, like any prune).
    let key = id.out_key();
    if let Some(why) = evaluation.revoked.get(&key).filter(|_| prune) {
        out.deletes.push(Delete {
            id: id.clone(),
            rule: rule.unwrap_or_default(),
            uid: l.uid().map(str::to_string),
            resource_version: l.resource_version().map(str::to_string),
            revoked: Some(why.clone()),
        });
        return;
    }
    let reason = keep_reason(evaluation, id, l, rule.as_deref(), held, prune)
        .or_else(|| rule.as_deref().and_then(|r| prune_guard(evaluation, r, l)));
    match (reason, rule) {
        (Some(reason), rule) => out.kept.push((id.clone(), rule, reason)),
        (None, Some(rule)) => out.deletes.push(Delete {
            id: id.clone(),
            rule,
            uid: l.uid().map(str::to_string),
            resource_version: l.resource_version().map(str::to_string),
            revoked: None,
        }),
        (None, None) => {}
    }
}

/// Why an unwanted live object of `rule` is kept, if it is: contested,
/// of no known rule, of a held rule, kept by its rule's evaluation, or
/// its prune deferred while the view is incomplete.
fn keep_reason(
    evaluation: &Evaluation,
    id: &ObjectId,
    l: &Live,
    rule: Option<&str>,
    held: &BTreeSet<String>,
    prune: bool,
) -> Option<KeepReason> {
    if evaluation.contested.contains(&id.out_key()) {
        return Some(KeepReason::Contested);
    }
    match rule {
        None => Some(KeepReason::NoProvenance),
        Some(r) if held.contains(r) => Some(KeepReason::Held),
        Some(r) if evaluation.keeps(r, l.trigger()) => Some(KeepReason::Kept),
        Some(_) if !prune => Some(KeepReason::PruneDeferred),
        Some(_) => None,
    }
}

/// Why an object its rule no longer wants (not refused by policy) is not
/// pruned, whatever the rule: it carries Helm's `keep` resource policy, it
/// existed before it was adopted, or its rule is gone without asking for
/// deletion. A refusal never reaches here: it revokes first.
fn prune_guard(evaluation: &Evaluation, rule: &str, l: &Live) -> Option<KeepReason> {
    if l.annotation(HELM_RESOURCE_POLICY) == Some("keep") {
        return Some(KeepReason::ResourcePolicyKeep);
    }
    if l.is_adopted() {
        return Some(KeepReason::Adopted);
    }
    // Every rule the engine was given has a report: none, the rule is gone.
    // Its policy is read from the object (absent: Orphan), the spec is gone.
    let gone = !evaluation.reports.contains_key(rule);
    let delete = l.annotation(&deletion_policy_annotation())
        == Some(crate::api::DeletionPolicy::Delete.as_str());
    (gone && !delete).then_some(KeepReason::Orphaned)
}

/// Annotation on an RbacRule confirming its held prunes: the token its
/// `Degraded` condition (reason `PruneHeld`) names.
pub const CONFIRM_PRUNE_ANNOTATION: &str = "rbacrules.io/confirm-prune";

/// Default of `--max-unconfirmed-prunes`.
pub const DEFAULT_MAX_UNCONFIRMED_PRUNES: usize = 20;

/// The prunes of one rule held in a pass ([`hold_mass_prunes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldPrunes {
    /// What confirms exactly this set: the value of
    /// [`CONFIRM_PRUNE_ANNOTATION`] to put on the rule.
    pub token: String,
    /// The objects, in order.
    pub objects: Vec<ObjectId>,
    /// The limit they exceed.
    pub max: usize,
}

impl HeldPrunes {
    /// What the rule's condition and Event say: what is held and how to
    /// confirm it.
    pub fn message(&self, rule: &str) -> String {
        let shown: Vec<String> = self.objects.iter().take(5).map(|o| o.to_string()).collect();
        let more = match self.objects.len().saturating_sub(shown.len()) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        format!(
            "{} deletions held: more than --max-unconfirmed-prunes ({}) in one pass ({}{more}); \
             nothing is deleted until confirmed: {}",
            self.objects.len(),
            self.max,
            shown.join(", "),
            self.confirm_command(rule)
        )
    }

    /// The kubectl command that confirms these prunes on `rule` (the
    /// engine's name: `<namespace>/<name>` for a NamespacedRbacRule).
    pub fn confirm_command(&self, rule: &str) -> String {
        let target = match rule.split_once('/') {
            Some((ns, name)) => format!("namespacedrbacrule -n {ns} {name}"),
            None => format!("rbacrule {rule}"),
        };
        format!(
            "kubectl annotate {target} --overwrite {CONFIRM_PRUNE_ANNOTATION}={}",
            self.token
        )
    }
}

/// Holds the prunes of every rule that would prune more than `max`
/// objects in this plan, unless the rule confirms exactly that set
/// (its annotation [`CONFIRM_PRUNE_ANNOTATION`] equals the set's token):
/// they become kept ([`KeepReason::PruneHeld`]) and are listed in
/// [`Plan::held_prunes`]. Never held nor counted: revocations (a refusal
/// revokes, however many), the outputs of a trigger that fails its rule's
/// `spec.trigger.require` in `evaluation` (the rule says its data is not
/// to be believed: like a refusal, what was made from it goes), and the
/// prunes of a rule that is gone (only its own `deletionPolicy: Delete`
/// prunes them: the choice was made, and there is no rule left to confirm
/// on). `live` gives each object's trigger.
pub fn hold_mass_prunes(
    plan: &mut Plan,
    max: usize,
    rules: &BTreeMap<String, crate::api::RbacRule>,
    evaluation: &Evaluation,
    live: &BTreeMap<ObjectId, Live>,
) {
    let distrusted = distrusted_triggers(evaluation);
    let holdable = |d: &Delete| {
        d.revoked.is_none()
            && rules.contains_key(&d.rule)
            && !live
                .get(&d.id)
                .and_then(Live::trigger)
                .is_some_and(|t| distrusted.contains(&(d.rule.as_str(), t)))
    };
    let mut per_rule: BTreeMap<&str, Vec<&ObjectId>> = BTreeMap::new();
    for d in plan.deletes.iter().filter(|d| holdable(d)) {
        per_rule.entry(&d.rule).or_default().push(&d.id);
    }
    let mut held: BTreeMap<String, HeldPrunes> = BTreeMap::new();
    for (rule, mut ids) in per_rule {
        if ids.len() <= max {
            continue;
        }
        ids.sort();
        let token = prune_token(&ids);
        let confirmed = rules
            .get(rule)
            .and_then(|r| r.metadata.annotations.as_ref())
            .and_then(|a| a.get(CONFIRM_PRUNE_ANNOTATION))
            .is_some_and(|t| t.trim() == token);
        if confirmed {
            tracing::info!(rule, token, prunes = ids.len(), "mass prune confirmed");
            continue;
        }
        let objects = ids.into_iter().cloned().collect();
        held.insert(
            rule.to_string(),
            HeldPrunes {
                token,
                objects,
                max,
            },
        );
    }
    if held.is_empty() {
        return;
    }
    let deletes = std::mem::take(&mut plan.deletes);
    for d in deletes {
        if held.contains_key(&d.rule) && holdable(&d) {
            plan.kept.push((d.id, Some(d.rule), KeepReason::PruneHeld));
        } else {
            plan.deletes.push(d);
        }
    }
    for (rule, h) in &held {
        tracing::warn!(rule = %rule, prunes = h.objects.len(), max, token = %h.token, "mass prune held until confirmed");
    }
    plan.held_prunes = held;
}

/// (rule, trigger) of every trigger that fails its rule's
/// `spec.trigger.require`: its outputs are pruned at once, never held.
fn distrusted_triggers(evaluation: &Evaluation) -> BTreeSet<(&str, &str)> {
    evaluation
        .reports
        .iter()
        .flat_map(|(rule, r)| {
            r.warnings
                .iter()
                .filter(|w| w.field.starts_with("spec.trigger.require"))
                .filter_map(move |w| Some((rule.as_str(), w.trigger.as_deref()?)))
        })
        .collect()
}

/// The token of a set of prunes: 12 hex digits of a digest of the sorted
/// ids, so that a confirmation confirms that set and no other.
fn prune_token(ids: &[&ObjectId]) -> String {
    let text: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let d = digest(&Value::from(text));
    d[..6].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::output::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, RBAC_API_VERSION};
    use crate::engine::{RuleReport, RuleState};
    use serde_json::json;
    use std::sync::Arc;

    fn report(state: RuleState, kept: &[&str]) -> RuleReport {
        RuleReport {
            kept_triggers: kept.iter().map(|t| t.to_string()).collect(),
            ..RuleReport::new(state)
        }
    }

    /// The reports of an evaluation where rule `r` ran and keeps nothing.
    fn r_evaluated() -> Arc<BTreeMap<String, RuleReport>> {
        Arc::new(BTreeMap::from([(
            "r".to_string(),
            report(RuleState::Evaluated, &[]),
        )]))
    }

    fn manifest(kind: OutputKind, ns: &str, name: &str, rule: &str, trigger: &str) -> Value {
        let mut meta = json!({"name": name,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
            "annotations": {"rbacrules.io/rule": rule, "rbacrules.io/trigger": trigger}});
        if !ns.is_empty() {
            meta["namespace"] = json!(ns);
        }
        let mut o =
            json!({"apiVersion": RBAC_API_VERSION, "kind": kind.as_str(), "metadata": meta});
        if !kind.is_role() {
            o["roleRef"] = json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "r"});
        }
        o
    }

    fn desired(kind: OutputKind, ns: &str, name: &str, rule: &str, trigger: &str) -> Desired {
        Desired {
            kind,
            namespace: ns.into(),
            name: name.into(),
            rule: rule.into(),
            trigger: Some(trigger.into()),
            field: "spec.outputs[0]".into(),
            refusal: None,
            object: crate::engine::Manifest::from_value(&manifest(kind, ns, name, rule, trigger))
                .expect("a manifest"),
        }
    }

    fn live_of(objects: Vec<Value>) -> BTreeMap<ObjectId, Live> {
        objects
            .into_iter()
            .map(|o| (ObjectId::of(&o).expect("id"), Live::new(o)))
            .collect()
    }

    #[test]
    fn rules_found_equal_to_a_desired_copy_are_shed_and_given_back_from_it() {
        let rules = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
        let with_rules = |rules: &Value| {
            let mut o = manifest(OutputKind::Role, "a", "x", "r", "T/a");
            o["rules"] = rules.clone();
            o
        };
        let mut body = with_rules(&rules);
        body["metadata"]["uid"] = json!("u");
        body["metadata"]["resourceVersion"] = json!("3");
        let evaluation = |rules: &Value| {
            let mut d = desired(OutputKind::Role, "a", "x", "r", "T/a");
            d.object = crate::engine::Manifest::from_value(&with_rules(rules)).expect("manifest");
            Evaluation {
                desired: [d].into_iter().collect(),
                reports: r_evaluated(),
                ..Evaluation::default()
            }
        };
        let id = ObjectId::new(OutputKind::Role, "a", "x");
        let mut lives = BTreeMap::from([(id.clone(), Live::new(body.clone()))]);
        let l = lives.get_mut(&id).expect("live");
        l.pack();
        // Not yet found equal: kept.
        assert!(!l.shed_rules());
        let p = plan(&evaluation(&rules), &lives, &BTreeSet::new(), true);
        assert_eq!(p.unchanged.len(), 1);
        let l = lives.get_mut(&id).expect("live");
        assert!(l.shed_rules());
        assert!(l.rules_shed());
        assert!(!l.shed_rules(), "once");
        // An evaluation that renders again (a new engine, the slow lane's)
        // makes a new, equal copy: the live object holds that one, not the
        // first beside it (no second copy of every output kept alive).
        let first = l.once_equal().expect("equal copy");
        let again = evaluation(&rules);
        let p = plan(&again, &lives, &BTreeSet::new(), true);
        assert_eq!(p.unchanged.len(), 1);
        let now = lives
            .get(&id)
            .and_then(Live::once_equal)
            .expect("equal copy");
        let fresh = &again.desired.iter().next().expect("desired").object;
        assert!(crate::engine::Manifest::ptr_eq(&now, fresh));
        assert!(!crate::engine::Manifest::ptr_eq(&now, &first));
        drop(first);
        let l = lives.get_mut(&id).expect("live");
        // Its rules are still given back, from the new copy.
        assert!(l.unpack());
        assert_eq!(l.object(), &body);
        l.pack();
        assert!(l.shed_rules());
        // The desired copy changes: this version is no longer equal to it,
        // and its body is still whole.
        let other = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]);
        let p = plan(&evaluation(&other), &lives, &BTreeSet::new(), true);
        assert_eq!(p.applies.len(), 1);
        let l = lives.get_mut(&id).expect("live");
        assert!(l.known_equal().is_none());
        assert!(l.unpack());
        assert_eq!(l.object(), &body);
        // A desired copy without rules (an aggregated ClusterRole's) sheds
        // nothing: the server's rules are the body's own.
        let mut agg = manifest(OutputKind::ClusterRole, "", "agg", "r", "T/a");
        agg["rules"] = rules.clone();
        agg["aggregationRule"] = json!({"clusterRoleSelectors": [{"matchLabels": {"a": "b"}}]});
        let mut l = Live::new(agg.clone());
        l.pack();
        let mut wanted = agg.clone();
        if let Some(m) = wanted.as_object_mut() {
            m.remove("rules");
        }
        let m = crate::engine::Manifest::from_value(&wanted).expect("manifest");
        l.set_known_equal(Some(&m));
        assert!(!l.shed_rules());
        assert!(l.unpack());
        assert_eq!(l.object(), &agg);
    }

    #[test]
    fn an_apply_response_equal_to_what_was_sent_is_settled_at_once() {
        let rules = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
        let mut sent = manifest(OutputKind::Role, "a", "x", "r", "T/a");
        sent["rules"] = rules.clone();
        let object = crate::engine::Manifest::from_value(&sent).expect("manifest");
        let apply = Apply {
            id: ObjectId::new(OutputKind::Role, "a", "x"),
            rule: "r".into(),
            object: object.clone(),
            keep_helm: false,
            adopted: false,
            action: ApplyAction::Create,
        };
        // The server's answer: what was sent, with what the server adds.
        let mut answer = sent.clone();
        answer["metadata"]["uid"] = json!("u");
        answer["metadata"]["resourceVersion"] = json!("3");
        let mut l = Live::new(answer.clone());
        l.pack();
        l.settle(&apply.object, &apply.body());
        assert!(l.rules_shed());
        assert!(l.is_known_equal(&object));
        // The next plan takes it as equal without comparing bodies, and
        // the body comes back whole from the copy sent.
        let id = apply.id.clone();
        let lives = BTreeMap::from([(id.clone(), l)]);
        let mut d = desired(OutputKind::Role, "a", "x", "r", "T/a");
        d.object = object.clone();
        let evaluation = Evaluation {
            desired: [d].into_iter().collect(),
            reports: r_evaluated(),
            ..Evaluation::default()
        };
        let p = plan(&evaluation, &lives, &BTreeSet::new(), true);
        assert!(p.applies.is_empty());
        let mut l = lives.into_values().next().expect("live");
        assert!(l.unpack());
        assert_eq!(l.object(), &answer);
        // An answer that differs (another manager's rule merged in) is
        // neither remembered nor shed: the next plan writes it again.
        let mut merged = answer.clone();
        merged["rules"] =
            json!([rules[0], {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]);
        let mut l = Live::new(merged);
        l.pack();
        l.settle(&apply.object, &apply.body());
        assert!(!l.rules_shed());
        assert!(l.known_equal().is_none());
    }

    #[test]
    fn protected_objects_are_never_written_or_deleted() {
        let evaluation = Evaluation {
            desired: vec![
                desired(OutputKind::ClusterRole, "", "edit", "r", "T/a"),
                desired(OutputKind::ClusterRole, "", "x", "r", "T/a"),
            ]
            .into(),
            reports: r_evaluated(),
            contested: BTreeSet::new(),
            revoked: BTreeMap::new(),
            changed: Vec::new(),
        };
        // `x` is ours, but someone gave it the bootstrap label; a managed
        // `cluster-admin` of a rule that is gone.
        let mut x = manifest(OutputKind::ClusterRole, "", "x", "r", "T/a");
        x["metadata"]["labels"]["kubernetes.io/bootstrapping"] = json!("rbac-defaults");
        let live = live_of(vec![
            x,
            manifest(OutputKind::ClusterRole, "", "cluster-admin", "gone", "T/a"),
        ]);
        let p = plan(&evaluation, &live, &BTreeSet::new(), true);
        assert!(p.applies.is_empty(), "{:?}", p.applies);
        assert!(p.deletes.is_empty(), "{:?}", p.deletes);
        let kept: Vec<_> = p
            .kept
            .iter()
            .filter(|k| k.2 == KeepReason::Protected)
            .map(|k| &*k.0.name)
            .collect();
        assert_eq!(kept, ["x", "cluster-admin"]);
    }

    #[test]
    fn writes_are_ordered_roles_first_and_deletes_bindings_first() {
        let evaluation = Evaluation {
            desired: vec![
                desired(OutputKind::RoleBinding, "a", "b", "r", "T/a"),
                desired(OutputKind::ClusterRoleBinding, "", "b", "r", "T/a"),
                desired(OutputKind::Role, "a", "x", "r", "T/a"),
                desired(OutputKind::ClusterRole, "", "x", "r", "T/a"),
            ]
            .into(),
            reports: r_evaluated(),
            contested: BTreeSet::new(),
            revoked: BTreeMap::new(),
            changed: Vec::new(),
        };
        let live = live_of(vec![
            manifest(OutputKind::ClusterRole, "", "old", "r", "T/a"),
            manifest(OutputKind::RoleBinding, "a", "old", "r", "T/a"),
            manifest(OutputKind::Role, "a", "old", "r", "T/a"),
            manifest(OutputKind::ClusterRoleBinding, "", "old", "r", "T/a"),
        ]);
        let p = plan(&evaluation, &live, &BTreeSet::new(), true);
        let kinds = |ids: Vec<&ObjectId>| ids.iter().map(|i| i.kind).collect::<Vec<_>>();
        assert_eq!(
            kinds(p.applies.iter().map(|a| &a.id).collect()),
            vec![
                OutputKind::ClusterRole,
                OutputKind::Role,
                OutputKind::ClusterRoleBinding,
                OutputKind::RoleBinding
            ]
        );
        assert_eq!(
            kinds(p.deletes.iter().map(|d| &d.id).collect()),
            vec![
                OutputKind::RoleBinding,
                OutputKind::ClusterRoleBinding,
                OutputKind::Role,
                OutputKind::ClusterRole
            ]
        );
        assert!(p.applies.iter().all(|a| a.action == ApplyAction::Create));
    }

    #[test]
    fn what_is_left_alone() {
        let mut contested = BTreeSet::new();
        contested.insert((OutputKind::Role, "a".to_string(), "both".to_string()));
        let evaluation = Evaluation {
            desired: vec![].into(),
            reports: BTreeMap::from([
                ("r".to_string(), report(RuleState::Evaluated, &["T/paused"])),
                ("failed".to_string(), report(RuleState::Failed, &[])),
                ("inactive".to_string(), report(RuleState::Inactive, &[])),
            ])
            .into(),
            contested,
            revoked: BTreeMap::new(),
            changed: Vec::new(),
        };
        let mut foreign = manifest(OutputKind::Role, "a", "foreign", "r", "T/a");
        foreign["metadata"]["labels"] = json!({});
        // A gone rule's object is pruned only when the rule asked for it.
        let mut gone_delete = manifest(OutputKind::Role, "a", "gone-delete", "gone-rule", "T/a");
        gone_delete["metadata"]["annotations"][deletion_policy_annotation()] = json!("Delete");
        let live = live_of(vec![
            gone_delete,
            manifest(OutputKind::Role, "a", "both", "r", "T/a"),
            manifest(OutputKind::Role, "a", "paused", "r", "T/paused"),
            manifest(OutputKind::Role, "a", "failed", "failed", "T/a"),
            manifest(OutputKind::Role, "a", "inactive", "inactive", "T/a"),
            manifest(OutputKind::Role, "a", "held", "held", "T/a"),
            manifest(OutputKind::Role, "a", "gone", "gone-rule", "T/a"),
            manifest(OutputKind::Role, "a", "stale", "r", "T/a"),
            foreign,
        ]);
        let held = BTreeSet::from(["held".to_string()]);
        let p = plan(&evaluation, &live, &held, true);
        let deleted: Vec<&str> = p.deletes.iter().map(|d| &*d.id.name).collect();
        assert_eq!(deleted, vec!["gone-delete", "stale"]);
        let kept: BTreeMap<&str, KeepReason> =
            p.kept.iter().map(|(id, _, r)| (&*id.name, *r)).collect();
        assert_eq!(
            kept,
            BTreeMap::from([
                ("both", KeepReason::Contested),
                ("failed", KeepReason::Kept),
                ("gone", KeepReason::Orphaned),
                ("held", KeepReason::Held),
                ("inactive", KeepReason::Kept),
                ("paused", KeepReason::Kept),
            ])
        );
        // An incomplete view defers the prunes.
        let p = plan(&evaluation, &live, &held, false);
        assert!(p.deletes.is_empty());
        assert_eq!(
            p.kept
                .iter()
                .filter(|k| k.2 == KeepReason::PruneDeferred)
                .count(),
            3
        );
    }

    #[test]
    fn revocations_are_never_held_nor_counted_in_a_mass() {
        let mut revoked = BTreeMap::new();
        for n in ["r1", "r2", "r3"] {
            revoked.insert(
                (OutputKind::Role, "a".to_string(), n.to_string()),
                "refused".to_string(),
            );
        }
        let evaluation = Evaluation {
            desired: vec![].into(),
            reports: r_evaluated(),
            contested: BTreeSet::new(),
            revoked,
            changed: Vec::new(),
        };
        let live = live_of(
            ["r1", "r2", "r3", "p1", "p2"]
                .iter()
                .map(|n| manifest(OutputKind::Role, "a", n, "r", "T/a"))
                .collect(),
        );
        let spec: crate::api::RbacRuleSpec =
            serde_json::from_value(json!({"outputs": []})).expect("spec");
        let rules = BTreeMap::from([("r".to_string(), crate::api::RbacRule::new("r", spec))]);
        let names =
            |p: &Plan| -> Vec<String> { p.deletes.iter().map(|d| d.id.name.to_string()).collect() };
        // Two prunes: at the limit, they go with the three revocations.
        let mut p = plan(&evaluation, &live, &BTreeSet::new(), true);
        hold_mass_prunes(&mut p, 2, &rules, &evaluation, &live);
        assert_eq!(names(&p), vec!["p1", "p2", "r1", "r2", "r3"]);
        assert!(p.held_prunes.is_empty());
        // Below it: the prunes are held, the revocations still go.
        let mut p = plan(&evaluation, &live, &BTreeSet::new(), true);
        hold_mass_prunes(&mut p, 1, &rules, &evaluation, &live);
        assert_eq!(names(&p), vec!["r1", "r2", "r3"]);
        assert_eq!(p.held_prunes["r"].objects.len(), 2);
        assert!(
            p.kept
                .iter()
                .all(|k| k.2 == KeepReason::PruneHeld && k.0.name.starts_with('p'))
        );
    }

    #[test]
    fn an_adopted_helm_object_keeps_the_resource_policy_annotation() {
        let evaluation = Evaluation {
            desired: vec![desired(OutputKind::ClusterRole, "", "x", "r", "T/a")].into(),
            reports: r_evaluated(),
            contested: BTreeSet::new(),
            revoked: BTreeMap::new(),
            changed: Vec::new(),
        };
        // As adopted: Helm's annotation, and the keep annotation we applied.
        let mut adopted = manifest(OutputKind::ClusterRole, "", "x", "r", "T/a");
        adopted["metadata"]["annotations"][HELM_RELEASE_ANNOTATION] = json!("platform");
        adopted["metadata"]["annotations"][HELM_RESOURCE_POLICY] = json!("keep");
        adopted["metadata"]["managedFields"] = json!([{"manager": FIELD_MANAGER,
            "operation": "Apply", "fieldsV1": {"f:metadata": {"f:annotations": {
                "f:rbacrules.io/rule": {}, "f:rbacrules.io/trigger": {},
                "f:helm.sh/resource-policy": {}}}}}]);
        let p = plan(
            &evaluation,
            &live_of(vec![adopted.clone()]),
            &BTreeSet::new(),
            true,
        );
        assert!(p.applies.is_empty(), "{:?}", p.applies);
        assert_eq!(p.unchanged.len(), 1);
        // Someone removed it: the next apply puts it back.
        adopted["metadata"]["annotations"]
            .as_object_mut()
            .expect("annotations")
            .remove(HELM_RESOURCE_POLICY);
        let p = plan(&evaluation, &live_of(vec![adopted]), &BTreeSet::new(), true);
        assert_eq!(
            p.applies[0].action,
            ApplyAction::Update(vec!["annotations"])
        );
        assert_eq!(
            p.applies[0].body()["metadata"]["annotations"][HELM_RESOURCE_POLICY],
            "keep"
        );
        // Not a Helm object: never added.
        let p = plan(
            &evaluation,
            &live_of(vec![manifest(OutputKind::ClusterRole, "", "x", "r", "T/a")]),
            &BTreeSet::new(),
            true,
        );
        assert!(p.applies.is_empty());
    }

    #[test]
    fn only_changed_copies_are_compared_again() {
        let y = desired(OutputKind::Role, "a", "y", "r", "T/a");
        let of = |x: Desired| Evaluation {
            desired: [x, y.clone()].into_iter().collect(),
            reports: r_evaluated(),
            ..Evaluation::default()
        };
        let evaluation = of(desired(OutputKind::Role, "a", "x", "r", "T/a"));
        let mut live = live_of(vec![
            manifest(OutputKind::Role, "a", "x", "r", "T/a"),
            manifest(OutputKind::Role, "a", "y", "r", "T/a"),
        ]);
        let p = plan(&evaluation, &live, &BTreeSet::new(), true);
        assert_eq!((p.applies.len(), p.unchanged.len()), (0, 2));
        assert!(live.values().all(|l| l.known_equal().is_some()));
        // Someone edits y: its new live copy is compared and repaired.
        let mut edited = manifest(OutputKind::Role, "a", "y", "r", "T/a");
        edited["rules"] = json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]);
        live.insert(ObjectId::new(OutputKind::Role, "a", "y"), Live::new(edited));
        let p = plan(&evaluation, &live, &BTreeSet::new(), true);
        let ids: Vec<&str> = p.applies.iter().map(|a| &*a.id.name).collect();
        assert_eq!(ids, vec!["y"]);
        assert_eq!(p.applies[0].action, ApplyAction::Update(vec!["rules"]));
        assert_eq!(p.unchanged.len(), 1);
        // A re-rendered but equal desired copy is compared and found equal.
        let x = desired(OutputKind::Role, "a", "x", "r", "T/a");
        let fresh = x.object.clone();
        let again = of(x);
        live.insert(
            ObjectId::new(OutputKind::Role, "a", "y"),
            Live::new(manifest(OutputKind::Role, "a", "y", "r", "T/a")),
        );
        let p = plan(&again, &live, &BTreeSet::new(), true);
        assert!(p.applies.is_empty(), "{:?}", p.applies);
        let remembered = live[&ObjectId::new(OutputKind::Role, "a", "x")].known_equal();
        assert!(remembered.is_some_and(|r| Manifest::ptr_eq(&r, &fresh)));
    }

    #[test]
    fn a_changed_role_ref_recreates_the_binding() {
        let evaluation = Evaluation {
            desired: vec![desired(OutputKind::RoleBinding, "a", "b", "r", "T/a")].into(),
            reports: r_evaluated(),
            contested: BTreeSet::new(),
            revoked: BTreeMap::new(),
            changed: Vec::new(),
        };
        let mut old = manifest(OutputKind::RoleBinding, "a", "b", "r", "T/a");
        old["roleRef"]["name"] = json!("previous");
        old["metadata"]["uid"] = json!("u");
        old["metadata"]["resourceVersion"] = json!("9");
        let p = plan(&evaluation, &live_of(vec![old]), &BTreeSet::new(), true);
        assert_eq!(
            p.applies[0].action,
            ApplyAction::Recreate {
                uid: Some("u".into()),
                resource_version: Some("9".into())
            }
        );
    }
}
