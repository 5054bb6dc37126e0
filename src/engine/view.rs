//! The world view: what a rule reads — the observed objects, overlaid with
//! the objects the rules before it emitted in this evaluation.
//!
//! An emitted object is visible when exactly one earlier rule (or trigger)
//! emits it; two emitters contest it and neither copy is seen. A live
//! object that a rule manages is hidden when that rule ran before and its
//! fresh output replaces it (its trigger is not preserved, the object is not
//! contested); a rule never reads what it emits itself.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::{Arc, LazyLock};

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::Engine;
use super::fast_hash::HashMap;
use super::incremental::caches::{Caches, Denials, PerRuleList, Rules, Selection};
use super::kinds::{gk_of, output_kind};
use super::manifest::Interner;
use super::memo::{Emit, Emitters, Lookup, Read, RuleMemo};
use super::model::Seen;
use super::output;
use super::store::{GroupKind, ObjectKey, ObjectStore};
use crate::api::OutputKind;

/// A kind, optionally narrowed to one namespace.
type ListKey = (GroupKind, Option<String>);

/// Objects seen, by key.
type SeenList<'a> = Vec<(ObjectKey, Seen<'a>)>;

/// What one rule (or policy, after every rule) sees.
pub(super) struct View<'a> {
    pub observed: &'a ObjectStore,
    pub emitters: &'a Emitters,
    /// Every rule's memo (the reader's own slot is empty while it runs).
    pub rules: &'a [RuleMemo],
    pub engine: &'a Engine,
    /// The rule reading (its index in evaluation order); `None` for policy.
    pub reader: Option<usize>,
    /// The caches it reads and fills: the memo's, or its own on another
    /// thread.
    pub caches: &'a Caches,
    /// Merged lists, built once per view: a rule lists the same kind once
    /// per trigger.
    merged: RefCell<HashMap<ListKey, Rc<Vec<&'a Arc<Value>>>>>,
    /// ClusterRoles per rendered selector: every trigger of a rule usually
    /// renders the same one.
    selected: RefCell<HashMap<String, Rc<Vec<Seen<'a>>>>>,
    /// Every ClusterRole seen, for selections (see [`View::selected`]).
    cluster_roles: RefCell<Option<Rc<SeenList<'a>>>>,
    /// Shares metadata between the manifests the reader emits.
    pub interner: RefCell<Interner>,
    /// The allow-list's effective rules (an aggregated list's as this
    /// evaluation read them): what copies are judged by.
    pub allow_rules: &'a [PolicyRule],
}

impl<'a> View<'a> {
    /// A view of the rule `reader` over the memo's other rules, with its
    /// own caches instead of the memo's.
    pub fn detached(
        observed: &'a ObjectStore,
        emitters: &'a Emitters,
        rules: &'a [RuleMemo],
        engine: &'a Engine,
        reader: Option<usize>,
        (caches, allow_rules): (&'a Caches, &'a [PolicyRule]),
    ) -> Self {
        View {
            observed,
            emitters,
            rules,
            engine,
            reader,
            caches,
            allow_rules,
            merged: RefCell::default(),
            selected: RefCell::default(),
            cluster_roles: RefCell::default(),
            interner: RefCell::default(),
        }
    }

    pub fn new(
        observed: &'a ObjectStore,
        memo: &'a super::memo::Memo,
        engine: &'a Engine,
        reader: Option<usize>,
    ) -> Self {
        View::detached(
            observed,
            &memo.emitters,
            &memo.rules,
            engine,
            reader,
            (&memo.caches, memo.allow_rules()),
        )
    }

    /// The emitters of `key` this view sees: those of rules before the
    /// reader.
    fn emitters_of(&self, kind: OutputKind, key: &ObjectKey) -> impl Iterator<Item = &'a Emit> {
        let before = self.reader.unwrap_or(usize::MAX);
        self.emitters
            .get_parts(kind, key)
            .into_iter()
            .flatten()
            .filter(move |e| e.rule < before)
    }

    /// Whether a live managed object is superseded by this evaluation's
    /// output (see the module doc).
    pub fn hidden(&self, obj: &Value, contested: bool) -> bool {
        if !output::is_managed(obj) {
            return false;
        }
        let meta = &obj["metadata"];
        let Some(rule) = meta["annotations"][output::rule_annotation()].as_str() else {
            return false;
        };
        let trigger = meta["annotations"][output::trigger_annotation()].as_str();
        match self.engine.rule_index(rule) {
            Some(r) => {
                if self.reader.is_some_and(|i| r >= i) {
                    // Not run yet (or the reader itself): about to be
                    // replaced or pruned.
                    return true;
                }
                if self.engine.options.held.contains(rule) {
                    return false;
                }
                let sig = &self.rules[r].signature;
                let preserved = match trigger {
                    Some(t) => sig.preserved.contains(t),
                    None => sig.static_preserved,
                };
                !preserved && !contested
            }
            // Failed or inactive rules keep their objects; a rule that
            // is gone has its objects pruned.
            None => !self.engine.fixed_reports.contains_key(rule),
        }
    }

    /// One object as the reader sees it: emitted or observed.
    pub fn get_seen(&self, gk: &GroupKind, key: &ObjectKey) -> Option<Seen<'a>> {
        let Some(kind) = output_kind(gk) else {
            return self.observed.get_shared(gk, key).map(Seen::Observed);
        };
        let mut seen = self.emitters_of(kind, key);
        let first = seen.next();
        let contested = match (first, seen.next()) {
            (Some(e), None) => return Some(Seen::Emitted(&e.desired.object)),
            (Some(_), Some(_)) => true,
            _ => false,
        };
        self.observed
            .get_shared(gk, key)
            .filter(|o| !self.hidden(o, contested))
            .map(Seen::Observed)
    }

    /// An object seen as JSON: an emitted one's is built on first read
    /// and cached with it.
    pub fn json(&self, seen: Seen<'a>) -> &'a Arc<Value> {
        match seen {
            Seen::Observed(o) => o,
            Seen::Emitted(m) => m.shared_value(),
        }
    }

    /// One object as the reader sees it.
    pub fn get_shared(&self, gk: &GroupKind, key: &ObjectKey) -> Option<&'a Arc<Value>> {
        self.get_seen(gk, key).map(|s| self.json(s))
    }

    /// One object as the reader sees it, owned: how a trigger is read. A
    /// kind held packed ([`ObjectStore::pack_kinds`]) is read back for this
    /// reader alone.
    pub fn get_owned(&self, gk: &GroupKind, key: &ObjectKey) -> Option<Arc<Value>> {
        if output_kind(gk).is_none() {
            return self.observed.get_owned(gk, key);
        }
        self.get_shared(gk, key).cloned()
    }

    /// The keys of every object of a kind the reader sees, sorted by
    /// namespace and name: of a kind that is not emitted, the store's,
    /// without reading an object.
    pub fn keys(&self, gk: &GroupKind) -> Vec<ObjectKey> {
        if output_kind(gk).is_none() {
            return self.observed.keys(gk).cloned().collect();
        }
        self.list(gk, None)
            .iter()
            .filter_map(|o| super::store::key_of(o))
            .collect()
    }

    /// One object as the reader sees it, for a check made once: an
    /// emitted one's JSON is built afresh and not cached with it (unless
    /// some reader had it cached already).
    pub fn get_value(&self, gk: &GroupKind, key: &ObjectKey) -> Option<Cow<'a, Value>> {
        Some(match self.get_seen(gk, key)? {
            Seen::Observed(o) => Cow::Borrowed(&**o),
            Seen::Emitted(m) => match m.kept_value() {
                Some(v) => Cow::Borrowed(&**v),
                None => Cow::Owned(m.to_value()),
            },
        })
    }

    /// Every object of a kind (in a namespace) the reader sees, sorted by
    /// namespace and name.
    pub fn list(&self, gk: &GroupKind, ns: Option<&str>) -> Rc<Vec<&'a Arc<Value>>> {
        let key = (gk.clone(), ns.map(str::to_string));
        if let Some(hit) = self.merged.borrow().get(&key) {
            return Rc::clone(hit);
        }
        let list = Rc::new(self.build_list(gk, ns));
        self.merged.borrow_mut().insert(key, Rc::clone(&list));
        list
    }

    fn build_list(&self, gk: &GroupKind, ns: Option<&str>) -> Vec<&'a Arc<Value>> {
        let Some(kind) = output_kind(gk) else {
            return match ns {
                Some(ns) => self
                    .observed
                    .entries_namespace(gk, ns)
                    .map(|(_, o)| o)
                    .collect(),
                None => self.observed.entries(gk).map(|(_, o)| o).collect(),
            };
        };
        self.output_keys(kind, ns)
            .iter()
            .filter_map(|k| self.get_shared(gk, k))
            .collect()
    }

    /// The observed objects of kind `gk` (in `ns`) that pass `read`,
    /// looked up by their owners (see [`super::incremental::owners`]), in
    /// view order: `None` when the read has no owner to look up by, or is
    /// of an emitted kind (the rules' outputs overlay it).
    pub fn owned(&self, gk: &GroupKind, ns: Option<&str>, read: &Read) -> Option<Vec<Arc<Value>>> {
        if output_kind(gk).is_some() {
            return None;
        }
        let uids = read.owner.as_ref()?.index_uids()?;
        let mut owners = self.caches.owners.borrow_mut();
        let keys = owners.candidates(gk, ns, &uids, self.observed);
        Some(
            keys.into_iter()
                .filter_map(|k| self.observed.get_shared(gk, k))
                .filter(|o| read.passes(o))
                .cloned()
                .collect(),
        )
    }

    /// Every ClusterRole this view sees, by key, built once per view.
    fn cluster_roles(&self) -> Rc<SeenList<'a>> {
        if let Some(hit) = &*self.cluster_roles.borrow() {
            return Rc::clone(hit);
        }
        let gk = gk_of(OutputKind::ClusterRole);
        let all: Vec<(ObjectKey, Seen<'a>)> = self
            .output_keys(OutputKind::ClusterRole, None)
            .into_iter()
            .filter_map(|k| self.get_seen(gk, &k).map(|s| (k, s)))
            .collect();
        let all = Rc::new(all);
        *self.cluster_roles.borrow_mut() = Some(Rc::clone(&all));
        all
    }

    /// The keys of every observed or emitted object of an output kind (in
    /// a namespace), sorted: both are kept sorted, so they are merged
    /// rather than collected into a set.
    fn output_keys(&self, kind: OutputKind, ns: Option<&str>) -> Vec<ObjectKey> {
        let gk = gk_of(kind);
        let observed: Vec<(&String, &String)> = match ns {
            Some(ns) => self
                .observed
                .entries_namespace(gk, ns)
                .map(|(k, _)| (&k.0, &k.1))
                .collect(),
            None => self
                .observed
                .entries(gk)
                .map(|(k, _)| (&k.0, &k.1))
                .collect(),
        };
        let start = (kind, ns.unwrap_or_default().to_string(), String::new());
        let mut emitted = self
            .emitters
            .range_from(start)
            .take_while(|(k, n, _)| *k == kind && ns.is_none_or(|ns| ns == n))
            .map(|(_, n, name)| (n, name))
            .peekable();
        let mut observed = observed.into_iter().peekable();
        let mut keys = Vec::new();
        loop {
            let next = match (observed.peek(), emitted.peek()) {
                (Some((on, oname)), Some((en, ename))) => {
                    match (on.as_str(), oname.as_str()).cmp(&(en.as_str(), ename.as_str())) {
                        std::cmp::Ordering::Less => observed.next(),
                        std::cmp::Ordering::Greater => emitted.next(),
                        std::cmp::Ordering::Equal => {
                            emitted.next();
                            observed.next()
                        }
                    }
                }
                (Some(_), None) => observed.next(),
                (None, Some(_)) => emitted.next(),
                (None, None) => break,
            };
            if let Some((n, name)) = next {
                keys.push((n.clone(), name.clone()));
            }
        }
        keys
    }

    /// The ClusterRoles that `selector` (validated) matches, memoized by the
    /// selector's content.
    pub fn selected_cluster_roles(&self, selector: &LabelSelector) -> Rc<Vec<Seen<'a>>> {
        let key = serde_json::to_string(selector).unwrap_or_default();
        if let Some(hit) = self.selected.borrow().get(&key) {
            return Rc::clone(hit);
        }
        let hits = Rc::new(self.selected(std::slice::from_ref(selector)));
        self.selected.borrow_mut().insert(key, Rc::clone(&hits));
        hits
    }

    /// The ClusterRoles any of `selectors` matches, in name order. The
    /// first call for some selectors lists every ClusterRole; later ones
    /// (in later evaluations too) reuse the cached selection.
    pub fn selected(&self, selectors: &[LabelSelector]) -> Vec<Seen<'a>> {
        self.selected_part(selectors, |sel| sel.members.iter().collect())
    }

    /// Makes the selection of `selectors` (not cached yet) and caches it,
    /// filed in the reader's index.
    fn make_selection(&self, json: Arc<str>, selectors: &[LabelSelector]) {
        let mut members = Vec::new();
        let mut noisy = Vec::new();
        let mut protected = Vec::new();
        let mut outside = Vec::new();
        // Matched by their labels: no JSON built for emitted roles.
        for (k, seen) in self.cluster_roles().iter() {
            if !seen.selected_by(selectors) {
                continue;
            }
            if self.breaks_denials(*seen) {
                noisy.push(k.clone());
            }
            if is_protected_role(*seen) {
                protected.push(k.clone());
            }
            if self.outside_allow_list(*seen) {
                outside.push(k.clone());
            }
            members.push(k.clone());
        }
        // In key order already: the sets are built at once, not key by key.
        let members: BTreeSet<ObjectKey> = members.into_iter().collect();
        let mut all = self.caches.selections.borrow_mut();
        let mine = all.entry(self.reader).or_default();
        mine.next += 1;
        let id = mine.next;
        for k in &members {
            mine.member_of.entry(k.clone()).or_default().push(id);
        }
        let sel = Selection {
            id,
            selectors: selectors.to_vec(),
            members,
            noisy: noisy.into_iter().collect(),
            protected: protected.into_iter().collect(),
            outside: outside.into_iter().collect(),
        };
        mine.add(json, sel);
    }

    /// Brings this reader's cached selections up to date with the changed
    /// ClusterRoles; returns the selections (by JSON) a change reached.
    ///
    /// A changed role is checked only against the selections that hold it
    /// and those the reader's index files under one of its labels (or
    /// that select on no label it must carry): a selection left out can
    /// neither hold it nor match it (see [`SelectionIndex`]), so the cost
    /// follows the change, not the number of selections.
    ///
    /// [`SelectionIndex`]: super::incremental::caches::SelectionIndex
    pub fn refresh_selections(&self, changes: &super::memo::Changes) -> BTreeSet<String> {
        let gk = gk_of(OutputKind::ClusterRole);
        let mut reached = BTreeSet::new();
        let mut all = self.caches.selections.borrow_mut();
        let Some(mine) = all.get_mut(&self.reader) else {
            return reached;
        };
        if changes.whole(gk) {
            reached.extend(mine.by_json.keys().map(|k| k.to_string()));
            mine.clear();
            return reached;
        }
        let Some(keys) = changes.keys.get(gk) else {
            return reached;
        };
        let mut visited = 0;
        for k in keys {
            let obj = self.get_seen(gk, k);
            let labels = obj.map(seen_labels);
            let candidates = mine.candidates(k, labels.as_ref().map(|l| l.iter().copied()));
            visited += candidates.len() as u64;
            // Worked out for a role some selection holds, once.
            let noisy = std::cell::OnceCell::new();
            let outside = std::cell::OnceCell::new();
            let mut ids = mine.member_of.remove(k).unwrap_or_default();
            for id in candidates {
                let Some(json) = mine.by_id.get(&id) else {
                    continue;
                };
                let Some(sel) = mine.by_json.get_mut(json) else {
                    continue;
                };
                let now = obj.is_some_and(|o| o.selected_by(&sel.selectors));
                let was = ids.contains(&sel.id);
                debug_assert_eq!(was, sel.members.contains(k));
                if now && !was {
                    sel.members.insert(k.clone());
                    ids.push(sel.id);
                } else if !now && was {
                    sel.members.remove(k);
                    ids.retain(|i| *i != sel.id);
                }
                if now && *noisy.get_or_init(|| obj.is_some_and(|o| self.breaks_denials(o))) {
                    sel.noisy.insert(k.clone());
                } else if was {
                    sel.noisy.remove(k);
                }
                if now && obj.is_some_and(is_protected_role) {
                    sel.protected.insert(k.clone());
                } else if was {
                    sel.protected.remove(k);
                }
                if now && *outside.get_or_init(|| obj.is_some_and(|o| self.outside_allow_list(o))) {
                    sel.outside.insert(k.clone());
                } else if was {
                    sel.outside.remove(k);
                }
                if now || was {
                    reached.insert(json.to_string());
                }
            }
            if !ids.is_empty() {
                mine.member_of.insert(k.clone(), ids);
            }
        }
        drop(all);
        self.count(|w| w.selections_visited += visited);
        reached
    }

    /// Adds to the work counted with the caches.
    fn count(&self, f: impl FnOnce(&mut super::incremental::caches::SelectionWork)) {
        let mut w = self.caches.work.get();
        f(&mut w);
        self.caches.work.set(w);
    }

    /// The members of a selection that break a default denial, in name
    /// order.
    pub fn noisy_selected(&self, selectors: &[LabelSelector]) -> Vec<Seen<'a>> {
        self.selected_part(selectors, |sel| sel.noisy.iter().collect())
    }

    /// The members of a selection that policy may refuse an aggregate (or
    /// its binding) for, in name order: those that break a default denial
    /// and, under an allow-list, those granting what it does not cover.
    /// Kept with the selection, so asking costs what they are, not every
    /// member.
    pub fn refusable_selected(&self, selectors: &[LabelSelector]) -> Vec<Seen<'a>> {
        if self.engine.options.allow.is_none() {
            return self.noisy_selected(selectors);
        }
        // Both sets are in key order: their union gives each key once.
        self.selected_part(selectors, |sel| sel.noisy.union(&sel.outside).collect())
    }

    /// The live members of a selection protected by their name or labels
    /// ([`is_protected_role`]), in name order: kept with the selection,
    /// so asking costs what they are, not every member.
    pub fn protected_selected(&self, selectors: &[LabelSelector]) -> Vec<Seen<'a>> {
        self.selected_part(selectors, |sel| sel.protected.iter().collect())
    }

    /// The key of the selection of `selectors` (its JSON), the selection
    /// made first if it is not cached yet.
    fn selection(&self, selectors: &[LabelSelector]) -> Arc<str> {
        let key = serde_json::to_string(selectors).unwrap_or_default();
        let known = self
            .caches
            .selections
            .borrow()
            .get(&self.reader)
            .and_then(|m| m.by_json.get_key_value(key.as_str()))
            .map(|(k, _)| Arc::clone(k));
        match known {
            Some(k) => k,
            None => {
                let key: Arc<str> = key.into();
                self.make_selection(Arc::clone(&key), selectors);
                key
            }
        }
    }

    /// The members of a selection that `part` picks from the sets kept
    /// with it, the selection made first if it is not cached yet.
    fn selected_part(
        &self,
        selectors: &[LabelSelector],
        part: impl FnOnce(&Selection) -> Vec<&ObjectKey>,
    ) -> Vec<Seen<'a>> {
        let key = self.selection(selectors);
        let gk = gk_of(OutputKind::ClusterRole);
        let all = self.caches.selections.borrow();
        let Some(sel) = all.get(&self.reader).and_then(|m| m.by_json.get(&*key)) else {
            return Vec::new();
        };
        let keys = part(sel);
        self.count(|w| w.members_visited += keys.len() as u64);
        keys.into_iter()
            .filter_map(|k| self.get_seen(gk, k))
            .collect()
    }

    /// Whether a live role's own rules grant what the allow-list does not
    /// cover (never without an allow-list), worked out once per shared
    /// rule list. Emitted roles are judged themselves.
    fn outside_allow_list(&self, role: Seen<'_>) -> bool {
        let Some(allow) = &self.engine.options.allow else {
            return false;
        };
        if matches!(role, Seen::Emitted(_)) {
            return false;
        }
        let rules = self.role_rules(role);
        if rules.is_empty() {
            return false;
        }
        PerRuleList::get_or_make(&self.caches.uncovered, &rules, || {
            !allow.uncovered(self.allow_rules, &rules).is_empty()
        })
    }

    /// Whether a role's own rules break a default denial.
    fn breaks_denials(&self, role: Seen<'_>) -> bool {
        !self
            .denials_of(&self.role_rules(role), &self.engine.options.waivers)
            .is_empty()
    }

    /// The default denials a rule list breaks, worked out once per shared
    /// list.
    pub fn denials_of(&self, rules: &Rules, waivers: &crate::policy::Waivers) -> Arc<Denials> {
        PerRuleList::get_or_make(&self.caches.denials, rules, || {
            Arc::new(crate::policy::denials(rules, waivers))
        })
    }

    /// The rules a role gets by copying `roles` (in this order): theirs,
    /// without nonResourceURLs when `namespaced`, compacted — worked out
    /// once per list of shared rule lists, so that roles copying the same
    /// ClusterRoles share one list.
    pub fn copied_rules(&self, roles: &[Seen<'a>], namespaced: bool) -> Rules {
        let lists: Vec<Rules> = roles.iter().map(|r| self.role_rules(*r)).collect();
        let key: (bool, Vec<usize>) = (
            namespaced,
            lists.iter().map(|r| Arc::as_ptr(r) as usize).collect(),
        );
        if let Some((held, rules)) = self.caches.copies.borrow().get(&key)
            && held.len() == lists.len()
            && held
                .iter()
                .zip(&lists)
                .all(|(h, r)| std::ptr::eq(h.as_ptr(), Arc::as_ptr(r)))
        {
            return Arc::clone(rules);
        }
        let mut rules = Vec::new();
        for list in &lists {
            rules.extend(list.iter().cloned());
        }
        if namespaced {
            rules = crate::policy::without_non_resource_urls(&rules);
        }
        let rules = crate::policy::compact(&rules);
        // A copy equal to one of its sources (one role, or roles adding
        // nothing to another) is that source's list, shared.
        let rules = match lists.iter().find(|l| ***l == rules) {
            Some(same) => Arc::clone(same),
            None => Arc::new(rules),
        };
        let held = lists.iter().map(Arc::downgrade).collect();
        self.caches
            .copies
            .borrow_mut()
            .insert(key, (held, Arc::clone(&rules)));
        rules
    }

    /// Why a ClusterRole granting `rules` is left out of a copy
    /// ([`crate::policy::copy_refusal`]), worked out once per shared list.
    pub fn copy_refusal(&self, rules: &Rules) -> Option<Arc<str>> {
        PerRuleList::get_or_make(&self.caches.copy_verdicts, rules, || {
            let options = &self.engine.options;
            let allow = options.allow.as_ref().map(|a| (a, self.allow_rules));
            crate::policy::copy_refusal(rules, &options.waivers, allow).map(Into::into)
        })
    }

    /// A role's own rules: an emitted role's as it holds them (none for an
    /// aggregated ClusterRole, whose rules are not its own), an observed
    /// one's parsed once per shared object.
    pub fn role_rules(&self, role: Seen<'_>) -> Rules {
        match role {
            Seen::Emitted(m) => match (m.rules(), m.aggregation_rule()) {
                (Some(r), None) => Arc::clone(r),
                // One shared empty list: its verdicts are cached once.
                _ => {
                    static NONE: LazyLock<Rules> = LazyLock::new(Rules::default);
                    Arc::clone(&NONE)
                }
            },
            Seen::Observed(o) => self.rules_of(o),
        }
    }

    /// A role's rules, from the cache when there, else parsed and not cached:
    /// for an object judged once (most roles are read by nothing else).
    pub fn rules_of_transient(&self, role: &Arc<Value>) -> Rules {
        let at = Arc::as_ptr(role) as usize;
        if let Some((held, rules)) = self.caches.rules.borrow().get(&at)
            && Arc::ptr_eq(held, role)
        {
            return Arc::clone(rules);
        }
        Arc::new(output::rules_of(role))
    }

    /// An observed role's rules, parsed once per shared object.
    pub fn rules_of(&self, role: &Arc<Value>) -> Rules {
        let at = Arc::as_ptr(role) as usize;
        if let Some((held, rules)) = self.caches.rules.borrow().get(&at)
            && Arc::ptr_eq(held, role)
        {
            return Arc::clone(rules);
        }
        let rules = Arc::new(output::rules_of(role));
        self.caches
            .rules
            .borrow_mut()
            .insert(at, (Arc::clone(role), Arc::clone(&rules)));
        rules
    }
}

/// The read index looks objects up through the view.
impl<'a> Lookup<'a> for View<'a> {
    fn get_seen(&self, gk: &GroupKind, key: &ObjectKey) -> Option<Seen<'a>> {
        View::get_seen(self, gk, key)
    }

    fn get_value(&self, gk: &GroupKind, key: &ObjectKey) -> Option<Cow<'a, Value>> {
        View::get_value(self, gk, key)
    }
}

/// A role's labels (text values only: others never match a selector).
fn seen_labels<'s>(role: Seen<'s>) -> Vec<(&'s str, &'s str)> {
    match role {
        Seen::Emitted(m) => m.labels().iter().collect(),
        Seen::Observed(o) => o["metadata"]["labels"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
            .collect(),
    }
}

/// Whether a ClusterRole is a live one protected by its name or labels
/// ([`crate::policy::protected_object`]): what an aggregate may not select
/// by the labels it was installed with.
pub(crate) fn is_protected_role(role: Seen<'_>) -> bool {
    let Seen::Observed(o) = role else {
        return false;
    };
    let labels = o["metadata"]["labels"].as_object();
    crate::policy::protected_object("ClusterRole", role.name(), |k| {
        labels.and_then(|l| l.get(k)).and_then(Value::as_str)
    })
    .is_some()
}
