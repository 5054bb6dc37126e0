//! The caches the world views share across rules and evaluations: parsed
//! role rules, their default denials, copied rule lists and ClusterRole
//! selections. Keyed by the addresses of shared values, each entry holds
//! (strongly or weakly) what it is keyed by, so an address is never
//! reused while its entry lives.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::{Arc, Weak};

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use crate::engine::fast_hash::HashMap;
use crate::engine::store::ObjectKey;

/// Parsed rules of roles, by the address of the shared manifest (held, so
/// the address cannot be reused while cached).
pub(crate) type RulesCache = HashMap<usize, (Arc<Value>, Arc<Vec<PolicyRule>>)>;

/// Shared rule lists (a role's own, or a copy).
pub(crate) type Rules = Arc<Vec<PolicyRule>>;

/// Rules copied from a list of roles, by whether the copy is namespaced
/// and the addresses of the roles' rule lists (weakly held: the address
/// is not reused while the entry lives, and the entry keeps no list alive).
pub(crate) type CopiesCache = HashMap<(bool, Vec<usize>), (Vec<Weak<Vec<PolicyRule>>>, Rules)>;

/// Default denials a role's own rules break (see [`crate::policy::denials`]).
pub(crate) type Denials = crate::policy::Denied;

/// A value worked out once per shared rule list, by the list's address.
/// The list is held weakly: the entry keeps no list alive, and an entry
/// whose list is gone is never read (its address may have been reused by
/// another list: [`PerRuleList::get_or_make`] checks it is the same list)
/// and is dropped by [`PerRuleList::prune`].
pub(crate) struct PerRuleList<V>(HashMap<usize, (Weak<Vec<PolicyRule>>, V)>);

impl<V> Default for PerRuleList<V> {
    fn default() -> Self {
        PerRuleList(HashMap::default())
    }
}

impl<V: Clone> PerRuleList<V> {
    /// The value for `rules`, made by `make` the first time.
    pub(crate) fn get_or_make(cell: &RefCell<Self>, rules: &Rules, make: impl FnOnce() -> V) -> V {
        let at = Arc::as_ptr(rules) as usize;
        if let Some((held, v)) = cell.borrow().0.get(&at)
            && std::ptr::eq(held.as_ptr(), Arc::as_ptr(rules))
        {
            return v.clone();
        }
        let v = make();
        cell.borrow_mut()
            .0
            .insert(at, (Arc::downgrade(rules), v.clone()));
        v
    }
}

impl<V> PerRuleList<V> {
    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Drops the entries whose rule list no one holds any more.
    pub(crate) fn prune(&mut self) {
        self.0.retain(|_, (held, _)| held.strong_count() > 0);
    }
}

/// Denials of roles, per rule list.
pub(crate) type DenialsCache = PerRuleList<Arc<Denials>>;

/// Why a copy leaves a source out (`None`: copied), per the source's rule
/// list; see [`crate::policy::copy_refusal`]. Valid for one allow-list: a
/// memo whose allow-list's rules change starts afresh.
pub(crate) type CopyVerdicts = PerRuleList<Option<Arc<str>>>;

/// The ClusterRoles some selectors (any of them) pick, as one reader sees
/// them; kept up to date from the changed keys, so a selection costs what
/// changed.
pub(crate) struct Selection {
    /// Names it in [`ReaderSelections::member_of`].
    pub id: u64,
    pub selectors: Vec<LabelSelector>,
    pub members: BTreeSet<ObjectKey>,
    /// Members that break a default denial: all an aggregated role's
    /// verdict needs to visit without an allow-list.
    pub noisy: BTreeSet<ObjectKey>,
    /// Live members protected by their name or labels (Kubernetes'
    /// bootstrap roles, the controller's own): all the check that an
    /// aggregate selects none of them needs to visit, kept with the
    /// membership so a change costs what it changes, not the selection.
    pub protected: BTreeSet<ObjectKey>,
    /// Members whose own rules grant what the allow-list does not (none
    /// without an allow-list): with [`Selection::noisy`], all that an
    /// aggregate's verdict under an allow-list needs to visit. Valid for
    /// one allow-list, as the caches are (a change of its rules starts
    /// the memo afresh).
    pub outside: BTreeSet<ObjectKey>,
}

/// Whether the allow-list leaves some of a rule list uncovered, per rule
/// list. Valid for one allow-list, as [`CopyVerdicts`].
pub(crate) type UncoveredCache = PerRuleList<bool>;

/// What keeping selections cost, counted (never timed) so tests can hold
/// a change to what it changes.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct SelectionWork {
    /// Selections a changed ClusterRole was checked against.
    pub selections_visited: u64,
    /// Members read out of cached selections (or matched by a new one).
    pub members_visited: u64,
}

/// Selections by reader (`None`: policy).
pub(crate) type Selections = HashMap<Option<usize>, ReaderSelections>;

/// One reader's selections, by the selectors' JSON.
#[derive(Default)]
pub(crate) struct ReaderSelections {
    pub by_json: HashMap<Arc<str>, Selection>,
    /// Each selection's JSON by its id (shared with [`Self::by_json`]).
    pub by_id: HashMap<u64, Arc<str>>,
    /// The selections (by id) each ClusterRole is a member of: a changed
    /// role is looked for only in those and in the ones [`Self::index`]
    /// says it can join.
    pub member_of: HashMap<ObjectKey, Vec<u64>>,
    /// The selections by what they select on, so a changed role visits
    /// only those that can match it, not every selection.
    pub index: SelectionIndex,
    /// The last id given.
    pub next: u64,
}

impl ReaderSelections {
    /// `k` no longer a member of selection `id`.
    pub(crate) fn forget(&mut self, k: &ObjectKey, id: u64) {
        if let Some(ids) = self.member_of.get_mut(k) {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                self.member_of.remove(k);
            }
        }
    }

    /// Adds a selection (its id given by the caller), indexed.
    pub(crate) fn add(&mut self, json: Arc<str>, sel: Selection) {
        self.index.add(sel.id, &sel.selectors);
        self.by_id.insert(sel.id, Arc::clone(&json));
        if let Some(old) = self.by_json.insert(json, sel) {
            // (Never so: a known selection is returned, not made again.)
            self.index.remove(old.id, &old.selectors);
            self.by_id.remove(&old.id);
            for k in &old.members {
                self.forget(k, old.id);
            }
        }
    }

    /// Forgets every selection.
    pub(crate) fn clear(&mut self) {
        let next = self.next;
        *self = ReaderSelections {
            next,
            ..ReaderSelections::default()
        };
    }

    /// The selections (by id, sorted, once each) a ClusterRole `k` with
    /// `labels` (its labels now; `None`: gone) may have to be added to or
    /// taken out of: those that hold it, and those the index says its
    /// labels can match. Exact: a selection left out neither holds it nor
    /// can match it.
    pub(crate) fn candidates<'l>(
        &self,
        k: &ObjectKey,
        labels: Option<impl Iterator<Item = (&'l str, &'l str)>>,
    ) -> Vec<u64> {
        let mut ids: Vec<u64> = self.member_of.get(k).cloned().unwrap_or_default();
        if let Some(labels) = labels {
            self.index.matching(labels, &mut ids);
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// Selections by what they select on. A selection matches a role only
/// when one of its selectors does, and a selector only when every one of
/// its requirements holds; so a selector is filed under one requirement
/// that names a label the role must carry (its *anchor*):
///
/// - a `matchLabels` entry `k: v`, or an `In` requirement on `k` (filed
///   under each of its values): the role carries `k` with that value;
/// - an `Exists` requirement on `k`: the role carries `k`.
///
/// A selector with no such requirement (empty, or only `NotIn` and
/// `DoesNotExist`) can match a role without any label it names: its
/// selection is in [`SelectionIndex::always`], checked for every changed
/// role. A selection is filed under the anchor of each of its selectors,
/// so a role any of them can match finds it. An invalid selector matches
/// nothing, so filing it anywhere is exact too.
#[derive(Default)]
pub(crate) struct SelectionIndex {
    /// By a label key a matching role carries.
    by_key: HashMap<Box<str>, KeyFiling>,
    /// Selections one of whose selectors has no anchor.
    always: BTreeSet<u64>,
}

/// The selections filed under one label key.
#[derive(Default)]
struct KeyFiling {
    /// Those whose anchor is the key whatever its value (`Exists`).
    any: Vec<u64>,
    /// Those whose anchor is the key with one value.
    values: HashMap<Box<str>, Vec<u64>>,
}

impl KeyFiling {
    fn is_empty(&self) -> bool {
        self.any.is_empty() && self.values.is_empty()
    }
}

/// Where a selector is filed (see [`SelectionIndex`]).
enum Anchor<'s> {
    /// A key with one of these values.
    Labels(&'s str, Vec<&'s str>),
    /// A key, whatever its value.
    Key(&'s str),
    /// Nothing a matching role must carry.
    None,
}

/// A selector's anchor: its first `matchLabels` entry, else its first
/// `In` or `Exists` requirement.
fn anchor(s: &LabelSelector) -> Anchor<'_> {
    if let Some((k, v)) = s.match_labels.iter().flatten().next() {
        return Anchor::Labels(k, vec![v]);
    }
    for e in s.match_expressions.iter().flatten() {
        match e.operator.as_str() {
            // `In` with no values is invalid (matches nothing): filed
            // nowhere, which is exact.
            "In" => {
                let values = e.values.iter().flatten().map(String::as_str).collect();
                return Anchor::Labels(&e.key, values);
            }
            "Exists" => return Anchor::Key(&e.key),
            _ => {}
        }
    }
    Anchor::None
}

/// Adds `id` to `ids` once.
fn file(ids: &mut Vec<u64>, id: u64) {
    if !ids.contains(&id) {
        ids.push(id);
    }
}

impl SelectionIndex {
    /// Files selection `id` under the anchor of each of `selectors`.
    fn add(&mut self, id: u64, selectors: &[LabelSelector]) {
        for s in selectors {
            match anchor(s) {
                Anchor::Labels(k, values) => {
                    let filing = self.by_key.entry(k.into()).or_default();
                    for v in values {
                        file(filing.values.entry(v.into()).or_default(), id);
                    }
                }
                Anchor::Key(k) => file(&mut self.by_key.entry(k.into()).or_default().any, id),
                Anchor::None => {
                    self.always.insert(id);
                }
            }
        }
    }

    /// Takes selection `id` out, from where `selectors` filed it.
    fn remove(&mut self, id: u64, selectors: &[LabelSelector]) {
        for s in selectors {
            let (k, values) = match anchor(s) {
                Anchor::Labels(k, values) => (k, Some(values)),
                Anchor::Key(k) => (k, None),
                Anchor::None => {
                    self.always.remove(&id);
                    continue;
                }
            };
            let Some(filing) = self.by_key.get_mut(k) else {
                continue;
            };
            match values {
                Some(values) => {
                    for v in values {
                        if let Some(ids) = filing.values.get_mut(v) {
                            ids.retain(|i| *i != id);
                            if ids.is_empty() {
                                filing.values.remove(v);
                            }
                        }
                    }
                }
                None => filing.any.retain(|i| *i != id),
            }
            if filing.is_empty() {
                self.by_key.remove(k);
            }
        }
    }

    /// Adds to `ids` every selection a role with `labels` can match.
    fn matching<'l>(&self, labels: impl Iterator<Item = (&'l str, &'l str)>, ids: &mut Vec<u64>) {
        ids.extend(self.always.iter().copied());
        for (k, v) in labels {
            if let Some(filing) = self.by_key.get(k) {
                ids.extend(filing.any.iter().copied());
                if let Some(hit) = filing.values.get(v) {
                    ids.extend(hit.iter().copied());
                }
            }
        }
    }

    /// Filings it holds (a selection counted once per key and value it is
    /// filed under).
    pub(crate) fn entries(&self) -> usize {
        self.by_key
            .values()
            .map(|f| f.any.len() + f.values.values().map(Vec::len).sum::<usize>())
            .sum::<usize>()
            + self.always.len()
    }
}

/// The caches views share across rules and evaluations: the memo keeps
/// one set; a view built away from the memo (on another thread: the
/// memo's caches are not shared between threads) has its own.
#[derive(Default)]
pub(crate) struct Caches {
    pub rules: RefCell<RulesCache>,
    pub denials: RefCell<DenialsCache>,
    pub copies: RefCell<CopiesCache>,
    pub copy_verdicts: RefCell<CopyVerdicts>,
    pub uncovered: RefCell<UncoveredCache>,
    /// What keeping selections cost, for tests.
    pub work: std::cell::Cell<SelectionWork>,
    /// Cached ClusterRole selections, per reader.
    pub selections: RefCell<Selections>,
    /// Observed objects by owner, for related sets filtered by owner.
    pub owners: RefCell<super::owners::OwnerIndex>,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn selector(v: Value) -> LabelSelector {
        serde_json::from_value(v).expect("selector")
    }

    /// A value per rule list is made once per list, and an entry whose
    /// list is gone is dropped by `prune`, never read.
    #[test]
    fn a_value_per_rule_list_is_made_once_and_pruned_with_its_list() {
        let cache = RefCell::new(PerRuleList::<usize>::default());
        let kept: Rules = Arc::new(vec![PolicyRule::default()]);
        let gone: Rules = Arc::new(vec![PolicyRule::default(), PolicyRule::default()]);
        let mut made = 0;
        for _ in 0..3 {
            for list in [&kept, &gone] {
                let v = PerRuleList::get_or_make(&cache, list, || {
                    made += 1;
                    list.len()
                });
                assert_eq!(v, list.len());
            }
        }
        assert_eq!(made, 2, "one per list");
        drop(gone);
        cache.borrow_mut().prune();
        assert_eq!(
            cache.borrow().len(),
            1,
            "the entry of the dropped list goes"
        );
        assert_eq!(PerRuleList::get_or_make(&cache, &kept, || 99), 1);
    }

    /// Every selection a role's labels match is among the candidates the
    /// index gives for it (the index never makes a selection miss a
    /// member), and an unrelated role visits only the selections that
    /// select on no label it must carry.
    #[test]
    fn the_index_gives_every_selection_a_role_can_match() {
        let selectors: Vec<Vec<LabelSelector>> = vec![
            vec![selector(serde_json::json!({"matchLabels": {"a": "1"}}))],
            vec![selector(
                serde_json::json!({"matchLabels": {"a": "2", "b": "1"}}),
            )],
            vec![selector(serde_json::json!({"matchExpressions": [
                {"key": "b", "operator": "In", "values": ["1", "2"]}]}))],
            vec![selector(serde_json::json!({"matchExpressions": [
                {"key": "c", "operator": "Exists"}]}))],
            vec![selector(serde_json::json!({"matchExpressions": [
                {"key": "a", "operator": "NotIn", "values": ["1"]},
                {"key": "b", "operator": "DoesNotExist"}]}))],
            vec![
                selector(serde_json::json!({"matchLabels": {"c": "2"}})),
                selector(serde_json::json!({"matchExpressions": [
                    {"key": "a", "operator": "Exists"}]})),
            ],
            vec![selector(serde_json::json!({}))],
        ];
        let mut r = ReaderSelections::default();
        for (i, s) in selectors.iter().enumerate() {
            let id = i as u64 + 1;
            r.add(
                format!("{i}").into(),
                Selection {
                    id,
                    selectors: s.clone(),
                    members: BTreeSet::new(),
                    noisy: BTreeSet::new(),
                    protected: BTreeSet::new(),
                    outside: BTreeSet::new(),
                },
            );
        }
        let values = ["", "1", "2", "3"];
        let key = (String::new(), "role".to_string());
        // Every combination of labels a, b, c (absent, or one of 3 values).
        for n in 0..4usize.pow(3) {
            let mut labels = BTreeMap::new();
            for (j, k) in ["a", "b", "c"].iter().enumerate() {
                let v = values[(n / 4usize.pow(j as u32)) % 4];
                if !v.is_empty() {
                    labels.insert(k.to_string(), v.to_string());
                }
            }
            let got = r.candidates(
                &key,
                Some(labels.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
            );
            for (i, s) in selectors.iter().enumerate() {
                let matches = s.iter().any(|s| crate::selector::matches_map(s, &labels));
                if matches {
                    assert!(
                        got.contains(&(i as u64 + 1)),
                        "{labels:?}: selection {i} missed"
                    );
                }
            }
        }
        // Labels no selector names: only the selections with a selector
        // that names no label a role must carry.
        let got = r.candidates(&key, Some([("z", "9")].into_iter()));
        assert_eq!(got, vec![5, 7]);
        // One filing per selector and value; taking a selection out
        // empties its filings.
        assert_eq!(r.index.entries(), 1 + 1 + 2 + 1 + 1 + 2 + 1);
        let again = Selection {
            id: 100,
            selectors: selectors[2].clone(),
            members: BTreeSet::new(),
            noisy: BTreeSet::new(),
            protected: BTreeSet::new(),
            outside: BTreeSet::new(),
        };
        r.next = 100;
        r.add("2".into(), again);
        assert_eq!(r.index.entries(), 1 + 1 + 2 + 1 + 1 + 2 + 1);
        assert!(
            r.candidates(&key, Some([("b", "2")].into_iter()))
                .contains(&100)
        );
        assert!(
            !r.candidates(&key, Some([("b", "2")].into_iter()))
                .contains(&3)
        );
    }
}
