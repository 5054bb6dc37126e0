//! What one rule's evaluator caches while its triggers render, held apart
//! from the functions that decide what a rule means: they ask these
//! methods, named for what they answer, and compute (through a closure)
//! only what is not cached. Every cached value is charged to the budget as
//! computing it was, so a hit fails where and as a full render does.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::Arc;

use k8s_openapi::api::rbac::v1::PolicyRule;
use serde_json::Value;

use super::memo::{
    Assembly, CachedPolicy, Derived, ExtractedEntries, ITEM_CACHE_MAX, ItemCache, ItemVerdict,
    NestedKey, OwnerFilter, Read, RuleMemo, cached_verdict, owner_uids, remember_verdict,
};
use crate::engine::error::{FieldError, FieldWarning};
use crate::engine::fast_hash::HashMap;
use crate::engine::limits;
use crate::engine::related::LineageFact;
use crate::engine::store::key_of;

type Result<T> = std::result::Result<T, FieldError>;

/// A whole template value's expansion in the cache: the template's
/// address, whether data is marked, and the tokens of the vars it reads.
pub(in crate::engine) type ExpansionKey = (usize, bool, Vec<u64>);

/// A related list in the cache: the related set and the addresses of the
/// objects it was computed from (held), sorted.
pub(in crate::engine) type ListKey = (usize, Vec<usize>);

/// A var in the cache: its index and the tokens of the lists it reads.
pub(in crate::engine) type VarKey = (usize, Vec<u64>);

/// One listField source's extracted entries in the cache: the related
/// set, whether templates see only its metadata (1), its address.
pub(in crate::engine) type ExtractKey = (usize, usize, usize);

/// What a related set's conditions read, found once per rule run (the
/// rule's texts do not change).
#[derive(Clone, Copy)]
pub(in crate::engine) struct Shape {
    /// Its `where` conditions read nothing but `item`.
    pub where_item: bool,
    /// Its `require` conditions read nothing but `item`.
    pub require_item: bool,
    /// Its `where` conditions read nothing but `item` and `trigger`.
    pub where_item_trigger: bool,
}

/// The paths of `item` a related set's conditions read, if only by paths.
pub(in crate::engine) type ItemPaths = Rc<Option<Vec<Vec<String>>>>;

/// A nested list template's JSON text and the vars it reads.
type NestedReads = (Arc<str>, Vec<String>);

/// A lookup of related objects: the related set and its rendered
/// namespace, names and selector (as JSON).
type FoundKey = (
    usize,
    Option<String>,
    Option<Arc<BTreeSet<String>>>,
    Option<String>,
);

/// Lookups an [`Inputs::found`] (and [`Inputs::owned`]) keeps before it
/// starts over.
const FOUND_MAX: usize = 1_024;

/// A lookup by owner whose owners several triggers of a rule share (a
/// provider family's members all accept the CRDs of the whole family):
/// the related set, its rendered namespace, names, selector (as JSON),
/// whether names *or* selector, and its owner filter. A filter naming
/// one trigger as controller is never shared, so never kept.
#[derive(PartialEq, Eq, Hash)]
struct OwnedKey {
    set: usize,
    namespace: Option<String>,
    names: Option<Arc<BTreeSet<String>>>,
    selector: Option<String>,
    either: bool,
    owners: SharedOwners,
}

/// The owner filters [`OwnedKey`] keeps, compared by value.
#[derive(PartialEq, Eq, Hash)]
enum SharedOwners {
    AnyOf(Arc<BTreeSet<String>>),
    Lineage(Arc<std::collections::BTreeMap<String, Option<i64>>>),
}

/// What an owner lookup found, in view order, with its hits' interned
/// keys when reads are recorded.
type OwnedFound = (Vec<Arc<Value>>, Option<Arc<BTreeSet<(String, String)>>>);

/// What one rule's evaluator caches: per render (its reads and inputs),
/// per rule run (what its templates and conditions read) and across
/// evaluations (taken from and given back to its [`RuleMemo`]).
#[derive(Default)]
pub(in crate::engine) struct EvalCaches {
    /// Whether to record reads (not for a one-shot memo, which keeps no
    /// read index).
    record: bool,
    /// What the current render looked up (see [`Read`]).
    reads: RefCell<Vec<Read>>,
    /// Verdicts on listField items, cached by the rule's memo.
    items: RefCell<ItemCache>,
    /// Lists and vars shared by renders with the same inputs, cached by the
    /// rule's memo.
    derived: RefCell<Derived>,
    /// What the current render reads that a cached value can be keyed by.
    inputs: RefCell<Inputs>,
    /// Per template value (by address): the vars it reads, when it reads
    /// nothing else (its expansion can then be cached).
    deps: RefCell<HashMap<usize, Option<Vec<String>>>>,
    /// Per nested list template (by address): its JSON text and the vars it
    /// reads, when it reads nothing but vars and the loop variables bound
    /// around it.
    nested: RefCell<HashMap<usize, Option<NestedReads>>>,
    /// Per related set: the paths of `item` its `where` conditions read.
    item_paths: RefCell<HashMap<usize, ItemPaths>>,
    /// Per `forEach` directive (by address): whether nothing in its loop
    /// names the root of the list it runs over.
    unseen: RefCell<HashMap<usize, bool>>,
    /// Per related set: what its conditions read.
    shapes: RefCell<HashMap<usize, Shape>>,
    /// Per var: the related lists it reads, when it reads nothing else.
    var_reads: RefCell<HashMap<usize, Option<Vec<String>>>>,
}

/// The current render's inputs, for the keys of [`Derived`] values.
#[derive(Default)]
struct Inputs {
    /// The trigger, as the store holds it.
    trigger: Option<Arc<Value>>,
    /// Each related object set's objects, as the store holds them.
    objects: HashMap<String, Vec<Arc<Value>>>,
    /// Tokens of the related lists taken from (or put into) the cache,
    /// by name.
    list_tokens: HashMap<String, u64>,
    /// Tokens of the vars taken from (or put into) the cache, by name.
    var_tokens: HashMap<String, u64>,
    /// Cached values lent to the context, to take back after the render.
    lent: Vec<Lent>,
    /// Related objects found by a lookup, by the lookup's filters but its
    /// owner: the view does not change while one rule runs, and a rule's
    /// triggers look for the same objects.
    found: HashMap<FoundKey, Found>,
    /// Objects found by owner, for the lookups whose owners are shared
    /// by triggers ([`OwnedKey`]): looked up, and their hits interned,
    /// once per rule run instead of once per trigger.
    owned: HashMap<OwnedKey, OwnedFound>,
    /// What lineage filters read of a related set's objects, by the set's
    /// name and the objects' addresses: the same for every trigger that
    /// found the same objects.
    lineage: HashMap<(String, Vec<usize>), Arc<Vec<LineageFact>>>,
}

impl Inputs {
    /// A fresh start for the render of `trigger`.
    fn start(&mut self, trigger: Option<Arc<Value>>) {
        self.trigger = trigger;
        self.objects.clear();
        self.list_tokens.clear();
        self.var_tokens.clear();
        self.lent.clear();
    }
}

/// A cached value lent to a render's context.
enum Lent {
    /// `related.<name>`.
    List(String, ListKey),
    /// `vars.<name>`.
    Var(String, VarKey),
}

/// The objects one lookup finds before its owner filter, in view order,
/// and (built when first asked) their positions by the uid of their
/// controller, with those of controllers without a uid apart.
struct Found {
    objects: Vec<Arc<Value>>,
    by_owner: Option<OwnerIndex>,
    /// Positions of `objects` by the uid of each of their ownerReferences.
    by_any_owner: Option<HashMap<String, Vec<usize>>>,
    /// The interned keys of `objects`, when a read without an owner
    /// filter recorded them (every trigger's read of it hits the same).
    hits: Option<Arc<BTreeSet<(String, String)>>>,
}

type OwnerIndex = (HashMap<String, Vec<usize>>, Vec<usize>);

/// The key a lookup by owner is kept under for the rule run, when its
/// owner filter can be another trigger's too (see [`OwnedKey`]).
fn owned_key(set: usize, ns: Option<&String>, read: &Read) -> Option<OwnedKey> {
    let owners = match read.owner.as_ref()? {
        OwnerFilter::AnyOf(uids) => SharedOwners::AnyOf(Arc::clone(uids)),
        OwnerFilter::Lineage(owners) => SharedOwners::Lineage(Arc::clone(owners)),
        OwnerFilter::Controller(_) => return None,
    };
    Some(OwnedKey {
        set,
        namespace: ns.cloned(),
        names: read.names.clone(),
        selector: read.selector_text(),
        either: read.either,
        owners,
    })
}

impl EvalCaches {
    /// Fresh caches (`record`: whether reads are recorded).
    pub fn new(record: bool) -> EvalCaches {
        EvalCaches {
            record,
            ..EvalCaches::default()
        }
    }

    /// The caches a rule's memo kept, taken over for this run.
    pub fn from_memo(record: bool, rm: &mut RuleMemo) -> EvalCaches {
        EvalCaches {
            record,
            items: RefCell::new(std::mem::take(&mut rm.items)),
            derived: RefCell::new(std::mem::take(&mut rm.derived)),
            deps: RefCell::new(std::mem::take(&mut rm.deps)),
            unseen: RefCell::new(std::mem::take(&mut rm.unseen)),
            ..EvalCaches::default()
        }
    }

    /// Gives back to the rule's memo what it keeps, bounded; `changed`:
    /// some trigger's outcome changed; `objects_changed`: the objects
    /// changed in this evaluation (each can leave one cached pin dead). Its derived values and item verdicts
    /// are kept, pruned of what was computed from objects gone, for a later
    /// rule of this evaluation to take over (`handed_on`) or for the next
    /// evaluation (the first rule of its chain takes them back, see
    /// `keys::chain_tails`): a change computes again only what it reaches.
    /// A one-shot memo hands on only item verdicts, and frees the rest.
    pub fn store_into(
        &self,
        rm: &mut RuleMemo,
        (one_shot, handed_on): (bool, bool),
        (changed, objects_changed): (bool, usize),
    ) {
        let items = self.items.take();
        let derived = self.derived.take();
        rm.deps = self.deps.take();
        rm.unseen = self.unseen.take();
        self.inputs.take();
        if one_shot && !handed_on {
            #[cfg(test)]
            {
                rm.freed = Some((derived, items));
            }
            return;
        }
        rm.items = items;
        // Entries of items gone are never looked up again: bounded by starting over.
        if rm.items.values().map(HashMap::len).sum::<usize>() > ITEM_CACHE_MAX {
            rm.items.clear();
        }
        if !one_shot {
            rm.derived = derived;
            if changed {
                rm.derived.prune_after(objects_changed);
            }
        }
    }

    /// A fresh start for the render of `trigger`: no reads, no inputs.
    pub fn start(&self, trigger: Option<Arc<Value>>) {
        self.reads.borrow_mut().clear();
        self.inputs.borrow_mut().start(trigger);
    }

    /// Whether reads are recorded (for the read index).
    pub fn records(&self) -> bool {
        self.record
    }

    /// Records a read of the current render.
    pub fn record_read(&self, read: Read) {
        self.reads.borrow_mut().push(read);
    }

    /// The reads the render made, without the spare room of their growth
    /// (cached per trigger until it renders again).
    pub fn take_reads(&self) -> Vec<Read> {
        let mut reads = self.reads.take();
        reads.shrink_to_fit();
        reads
    }

    /// Starts the cached derived values over when they hold more than `max`
    /// bytes (see [`Derived::bound_bytes`]).
    pub fn bound_bytes(&self, max: usize) {
        self.derived.borrow_mut().bound_bytes(max);
    }

    /// The trigger being rendered, as the store holds it.
    pub fn trigger(&self) -> Option<Arc<Value>> {
        self.inputs.borrow().trigger.clone()
    }

    /// What related set `i`'s conditions read (`of` finds it once).
    pub fn shape(&self, i: usize, of: impl FnOnce() -> Shape) -> Shape {
        if let Some(s) = self.shapes.borrow().get(&i) {
            return *s;
        }
        let shape = of();
        self.shapes.borrow_mut().insert(i, shape);
        shape
    }

    /// The paths of `item` related set `i`'s conditions read (`of` finds
    /// them once).
    pub fn item_paths(&self, i: usize, of: impl FnOnce() -> Option<Vec<Vec<String>>>) -> ItemPaths {
        if let Some(p) = self.item_paths.borrow().get(&i) {
            return Rc::clone(p);
        }
        let p = Rc::new(of());
        self.item_paths.borrow_mut().insert(i, Rc::clone(&p));
        p
    }

    /// Whether nothing in the loop of the `forEach` directive `d` names
    /// the root of its list (`of` finds it once per directive).
    pub fn unseen(&self, d: &Value, of: impl FnOnce() -> bool) -> bool {
        let key = d as *const Value as usize;
        if let Some(u) = self.unseen.borrow().get(&key) {
            return *u;
        }
        let u = of();
        self.unseen.borrow_mut().insert(key, u);
        u
    }

    /// The key of the template value `v`'s expansion: when it reads
    /// nothing but vars (`reads`, found once per value), each cached.
    pub fn expansion_key(
        &self,
        v: &Value,
        marked: bool,
        reads: impl FnOnce() -> Option<Vec<String>>,
    ) -> Option<ExpansionKey> {
        let addr = v as *const Value as usize;
        let mut deps = self.deps.borrow_mut();
        let vars = deps.entry(addr).or_insert_with(reads).as_ref()?;
        Some((addr, marked, self.var_tokens(vars)?))
    }

    /// The tokens of these cached vars, when each is cached.
    fn var_tokens(&self, vars: &[String]) -> Option<Vec<u64>> {
        let inputs = self.inputs.borrow();
        vars.iter()
            .map(|d| inputs.var_tokens.get(d.as_str()).copied())
            .collect()
    }

    /// The token of the cached var `name` of this render, if cached.
    pub fn var_token(&self, name: &str) -> Option<u64> {
        self.inputs.borrow().var_tokens.get(name).copied()
    }

    /// The id of the value a loop over the cached var `token` bound at
    /// `index` (see [`Derived::content_id`]).
    pub fn content_id(&self, token: u64, index: usize, value: &Value) -> u64 {
        self.derived.borrow_mut().content_id(token, index, value)
    }

    /// The key of the nested list template `v` (see [`NestedKey`]): its
    /// text and the vars it reads (`reads`, found once per template), each
    /// cached, and its loop variables' ids (`bound`).
    pub fn nested_key(
        &self,
        v: &Value,
        marked: bool,
        bound: Vec<(String, u64)>,
        reads: impl FnOnce() -> Option<Vec<String>>,
    ) -> Option<NestedKey> {
        let addr = v as *const Value as usize;
        let mut nested = self.nested.borrow_mut();
        let (text, vars) = nested
            .entry(addr)
            .or_insert_with(|| {
                let read = reads()?;
                Some((Arc::from(serde_json::to_string(v).ok()?), read))
            })
            .as_ref()?;
        Some((Arc::clone(text), marked, self.var_tokens(vars)?, bound))
    }

    /// A whole value's expansion cached before (see [`Derived::expansion`]).
    pub fn cached_expansion(&self, key: &ExpansionKey) -> Option<Value> {
        self.derived.borrow().expansion(key)
    }

    /// A nested list cached before (see [`Derived::nested_list`]).
    pub fn cached_nested_list(&self, key: &NestedKey) -> Option<Value> {
        self.derived.borrow().nested_list(key)
    }

    /// Caches `value`, expanded since `before` (the budget used then), under
    /// its nested list key and its whole value key (as null when it is
    /// only ever `checked_only`).
    pub fn remember_expansion(
        &self,
        key: Option<ExpansionKey>,
        nested: Option<NestedKey>,
        value: &Value,
        checked_only: bool,
        before: usize,
    ) {
        let mut derived = self.derived.borrow_mut();
        if let Some(nk) = nested {
            derived.remember_nested_list(nk, value.clone(), before);
        }
        if let Some(key) = key {
            let cached = if checked_only {
                Value::Null
            } else {
                value.clone()
            };
            derived.remember_expansion(key, cached, before);
        }
    }

    /// Appends to `out` the cached expansion of one list entry, charging
    /// what expanding it charged: a copy, or (`by_entry`: its policy rules
    /// are checked entry by entry, and were checked before) placeholders.
    /// False when there is none to use.
    pub fn reuse_entry(&self, key: &ExpansionKey, by_entry: bool, out: &mut Vec<Value>) -> bool {
        let derived = self.derived.borrow();
        // Its policy rules were checked before: a list whose rules are
        // checked entry by entry needs no copy (and keeps none).
        let placeholder = by_entry && matches!(derived.policies.get(key), Some((_, None)));
        let Some((Value::Array(cached), bytes)) = derived.expansions.get(key) else {
            return false;
        };
        // A copy is used only when it holds no placeholder (null); charged
        // only when used.
        let usable = placeholder || !cached.iter().any(Value::is_null);
        if !usable || limits::charge(*bytes).is_err() {
            return false;
        }
        if placeholder {
            out.resize(out.len() + cached.len(), Value::Null);
        } else {
            out.extend(cached.iter().cloned());
        }
        true
    }

    /// Caches one list entry's expansion (`expanded`), computed since
    /// `before`. Checked entry by entry (`by_entry`), it is read again only
    /// as placeholders (with its checked rules): nulls, which no other
    /// read takes for a copy.
    pub fn remember_entry(
        &self,
        key: ExpansionKey,
        expanded: &[Value],
        by_entry: bool,
        before: usize,
    ) {
        let bytes = limits::used().saturating_sub(before);
        let cached = if by_entry {
            vec![Value::Null; expanded.len()]
        } else {
            expanded.to_vec()
        };
        self.derived
            .borrow_mut()
            .expansions
            .insert(key, (Value::Array(cached), bytes));
    }

    /// An output's policy rules checked before from the same cached
    /// expansion (see [`Derived::checked_policy`]).
    pub fn checked_policy(&self, key: &ExpansionKey) -> Option<CachedPolicy> {
        self.derived.borrow().checked_policy(key)
    }

    /// Keeps the policy rules checked from a cached expansion, for the
    /// outputs that expand the same (when the expansion is cached).
    pub fn remember_checked_policy(
        &self,
        key: ExpansionKey,
        rules: &Arc<Vec<PolicyRule>>,
        refusal: &Option<FieldError>,
    ) {
        let mut derived = self.derived.borrow_mut();
        if derived.expansions.contains_key(&key) {
            derived
                .policies
                .insert(key, (Arc::clone(rules), refusal.clone()));
        }
    }

    /// Drops a cached expansion whose rules failed their check (cached as
    /// null, it is never kept without its checked rules).
    pub fn forget_expansion(&self, key: &ExpansionKey) {
        self.derived.borrow_mut().expansions.remove(key);
    }

    /// The checked rules of a cached list entry, when checked before
    /// without a refusal.
    pub fn entry_rules(&self, key: &ExpansionKey) -> Option<Arc<Vec<PolicyRule>>> {
        match self.derived.borrow().policies.get(key) {
            Some((rules, None)) => Some(Arc::clone(rules)),
            _ => None,
        }
    }

    /// Keeps a list entry's checked rules (no refusal).
    pub fn remember_entry_rules(&self, key: &ExpansionKey, rules: &[PolicyRule]) {
        self.derived
            .borrow_mut()
            .policies
            .insert(key.clone(), (Arc::new(rules.to_vec()), None));
    }

    /// A role's rules put together before from the same parts.
    pub fn assembled_rules(&self, a: &Assembly) -> Option<Arc<Vec<PolicyRule>>> {
        self.derived.borrow().assembled.get(a).map(Arc::clone)
    }

    /// Keeps a role's rules put together from these parts.
    pub fn remember_assembled(&self, a: Assembly, rules: &Arc<Vec<PolicyRule>>) {
        self.derived
            .borrow_mut()
            .assembled
            .insert(a, Arc::clone(rules));
    }

    /// Holds `obj` and gives its address, for a key; `None` when reads
    /// are not recorded (a one-shot render keeps nothing).
    pub fn pin(&self, obj: &Arc<Value>) -> Option<usize> {
        self.record.then(|| self.derived.borrow_mut().pin(obj))
    }

    /// Calls `each` with the position and pinned address (see
    /// [`EvalCaches::pin`]) of each of `len` values of related set `name`:
    /// an address only when the set's objects as the store holds them are
    /// known and as many.
    pub fn pin_related(&self, name: &str, len: usize, mut each: impl FnMut(usize, Option<usize>)) {
        let inputs = self.inputs.borrow();
        let objs = inputs.objects.get(name).filter(|o| o.len() == len);
        let mut derived = self.derived.borrow_mut();
        for n in 0..len {
            let addr = objs
                .and_then(|o| o.get(n))
                .and_then(|o| self.record.then(|| derived.pin(o)));
            each(n, addr);
        }
    }

    /// The objects a listField reads, when each is one the store holds
    /// (the trigger, related objects): their addresses (held), sorted and
    /// de-duplicated.
    pub fn list_sources(&self, of: &[String]) -> Option<Vec<usize>> {
        let inputs = self.inputs.borrow();
        let mut derived = self.derived.borrow_mut();
        let mut addrs: Vec<usize> = Vec::new();
        for name in of {
            if name == "trigger" {
                addrs.push(derived.pin(inputs.trigger.as_ref()?));
            } else {
                for o in inputs.objects.get(name)? {
                    addrs.push(derived.pin(o));
                }
            }
        }
        addrs.sort_unstable();
        addrs.dedup();
        Some(addrs)
    }

    /// Related set `name`'s objects as the store holds them (as kept
    /// after their conditions), when known.
    pub fn objects_of(&self, name: &str) -> Option<Vec<Arc<Value>>> {
        self.inputs.borrow().objects.get(name).cloned()
    }

    /// `f` of related set `name`'s objects as the store holds them, when
    /// known.
    pub fn with_objects<R>(&self, name: &str, f: impl FnOnce(&[Arc<Value>]) -> R) -> Option<R> {
        self.inputs.borrow().objects.get(name).map(|o| f(o))
    }

    /// What lineage filters read of related set `name`'s objects (as kept
    /// for this render), worked out by `facts` once per rule run for the
    /// same objects; `None` when the set's objects are not kept.
    pub fn lineage_facts(
        &self,
        name: &str,
        facts: impl FnOnce(&[Arc<Value>]) -> Vec<LineageFact>,
    ) -> Option<Arc<Vec<LineageFact>>> {
        let mut inputs = self.inputs.borrow_mut();
        let objects = inputs.objects.get(name)?;
        let key = (
            name.to_string(),
            objects.iter().map(|o| Arc::as_ptr(o) as usize).collect(),
        );
        if let Some(hit) = inputs.lineage.get(&key) {
            return Some(Arc::clone(hit));
        }
        let made = Arc::new(facts(objects));
        if inputs.lineage.len() >= FOUND_MAX {
            inputs.lineage.clear();
        }
        inputs.lineage.insert(key, Arc::clone(&made));
        Some(made)
    }

    /// Keeps related set `name`'s objects as the store holds them, for the
    /// listFields and `ownedBy` that read them.
    pub fn keep_objects(&self, name: &str, objects: Vec<Arc<Value>>) {
        self.inputs
            .borrow_mut()
            .objects
            .insert(name.to_string(), objects);
    }

    /// A cached related list, lent to the render, with what computing it
    /// warned (into `warnings`) and charged; `None` when there is none,
    /// when it was cached hollow and `read` (templates read it), or when
    /// the budget cannot pay for it.
    pub fn lend_list(
        &self,
        name: &str,
        key: &ListKey,
        read: bool,
        warnings: &RefCell<Vec<FieldWarning>>,
    ) -> Option<Vec<Value>> {
        let mut derived = self.derived.borrow_mut();
        let (v, warned, token) = derived.lend_list(key, read)?;
        warnings.borrow_mut().extend(warned.iter().cloned());
        let mut inputs = self.inputs.borrow_mut();
        inputs.list_tokens.insert(name.to_string(), token);
        inputs.lent.push(Lent::List(name.to_string(), key.clone()));
        Some(v)
    }

    /// Reserves related list `name`'s entry, filled when the render gives
    /// its value back, with the warnings and bytes computing it gave.
    pub fn reserve_list(
        &self,
        name: &str,
        key: ListKey,
        warnings: Vec<FieldWarning>,
        bytes: usize,
        hollow: bool,
    ) {
        let token = self
            .derived
            .borrow_mut()
            .reserve_list(key.clone(), warnings, bytes, hollow);
        let mut inputs = self.inputs.borrow_mut();
        inputs.list_tokens.insert(name.to_string(), token);
        inputs.lent.push(Lent::List(name.to_string(), key));
    }

    /// The objects of `found` that related set `i`'s `where` keeps,
    /// each verdict (by `judge`) cached by the addresses of the object
    /// and, when the verdict reads it (`by_trigger`), the trigger.
    pub fn judged_objects(
        &self,
        (i, by_trigger): (usize, bool),
        found: &[&Arc<Value>],
        mut judge: impl FnMut(&Arc<Value>) -> Result<bool>,
    ) -> Result<Vec<Arc<Value>>> {
        let trigger = self.trigger().filter(|_| by_trigger);
        let t_addr = trigger
            .as_ref()
            .map_or(0, |t| self.derived.borrow_mut().pin(t));
        let mut passed: Vec<Arc<Value>> = Vec::with_capacity(found.len());
        for o in found {
            let key = (i, self.derived.borrow_mut().pin(o), t_addr);
            let hit = self.derived.borrow().verdicts.get(&key).copied();
            let ok = match hit {
                Some((ok, bytes)) if limits::charge(bytes).is_ok() => ok,
                _ => {
                    let before = limits::used();
                    let ok = judge(o)?;
                    let bytes = limits::used().saturating_sub(before);
                    self.derived.borrow_mut().verdicts.insert(key, (ok, bytes));
                    ok
                }
            };
            if ok {
                passed.push(Arc::clone(o));
            }
        }
        Ok(passed)
    }

    /// The objects of `found`, each pinned as [`EvalCaches::judged_objects`]
    /// pins them: a related set without `where` keeps them all.
    pub fn pinned_objects(&self, found: &[&Arc<Value>]) -> Vec<Arc<Value>> {
        let mut derived = self.derived.borrow_mut();
        found
            .iter()
            .map(|o| {
                derived.pin(o);
                Arc::clone(o)
            })
            .collect()
    }

    /// Related set `name`'s list of the objects `passed` (each pinned by
    /// [`EvalCaches::judged_objects`] or [`EvalCaches::pinned_objects`]):
    /// lent from the cache, else made by `copy` (none when `hollow`:
    /// templates do not read it) and reserved; the objects kept for the
    /// sets after.
    pub fn objects_list(
        &self,
        (i, name): (usize, &str),
        passed: Vec<Arc<Value>>,
        hollow: bool,
        warnings: &RefCell<Vec<FieldWarning>>,
        copy: impl FnOnce(&[Arc<Value>]) -> Vec<Value>,
    ) -> Vec<Value> {
        let key = (i, passed.iter().map(|a| Arc::as_ptr(a) as usize).collect());
        let items = match self.lend_list(name, &key, !hollow, warnings) {
            Some(v) => v,
            None => {
                self.reserve_list(name, key, Vec::new(), 0, hollow);
                if hollow { Vec::new() } else { copy(&passed) }
            }
        };
        self.keep_objects(name, passed);
        items
    }

    /// One listField source's entries: cached under `key` (with what
    /// extracting them warned, replayed into `warnings`), else extracted
    /// by `extract` (cached when `key` is given).
    pub fn extracted(
        &self,
        key: Option<ExtractKey>,
        warnings: &RefCell<Vec<FieldWarning>>,
        extract: impl FnOnce() -> Arc<ExtractedEntries>,
    ) -> Arc<ExtractedEntries> {
        if let Some(key) = &key
            && let Some((entries, warned)) = self.derived.borrow().extracts.get(key)
        {
            warnings.borrow_mut().extend(warned.iter().cloned());
            return Arc::clone(entries);
        }
        let warned = warnings.borrow().len();
        let mine = extract();
        if let Some(key) = key {
            let warned = warnings.borrow()[warned..].to_vec();
            self.derived
                .borrow_mut()
                .extracts
                .insert(key, (Arc::clone(&mine), warned));
        }
        mine
    }

    /// One stage's verdict on a listField item, by its text: cached from
    /// before (charging what judging it charged), else judged by `judge`
    /// (errors not cached).
    pub fn item_verdict(
        &self,
        slot: (usize, bool),
        text: &str,
        judge: impl FnOnce() -> Result<ItemVerdict>,
    ) -> Result<ItemVerdict> {
        if let Some(verdict) = cached_verdict(&self.items.borrow(), slot, text) {
            return Ok(verdict);
        }
        let before = limits::used();
        let verdict = judge()?;
        remember_verdict(&mut self.items.borrow_mut(), slot, text, &verdict, before);
        Ok(verdict)
    }

    /// Var `i`'s key: when its expression reads nothing but related lists
    /// (`reads`, found once per var), each of them cached.
    pub fn var_key(&self, i: usize, reads: impl FnOnce() -> Option<Vec<String>>) -> Option<VarKey> {
        let mut var_reads = self.var_reads.borrow_mut();
        let read = var_reads.entry(i).or_insert_with(reads).as_ref()?;
        let inputs = self.inputs.borrow();
        // A list read that is not cached leaves the var uncached.
        let deps = read
            .iter()
            .map(|n| inputs.list_tokens.get(n.as_str()).copied())
            .collect::<Option<Vec<u64>>>()?;
        (!deps.is_empty()).then_some((i, deps))
    }

    /// Var `name`'s value: lent from the cache under `key`, else computed
    /// by `compute` (and cached when it has a key).
    pub fn var(
        &self,
        name: &str,
        key: Option<VarKey>,
        compute: impl FnOnce() -> Result<Value>,
    ) -> Result<Value> {
        if let Some(key) = &key {
            let mut derived = self.derived.borrow_mut();
            if let Some(e) = derived.vars.get_mut(key)
                && e.value.is_some()
                && limits::charge(e.bytes).is_ok()
                && let Some(v) = e.value.take()
            {
                let mut inputs = self.inputs.borrow_mut();
                inputs.var_tokens.insert(name.to_string(), e.token);
                inputs.lent.push(Lent::Var(name.to_string(), key.clone()));
                return Ok(v);
            }
        }
        let before = limits::used();
        let value = compute()?;
        if let Some(key) = key {
            let bytes = limits::used().saturating_sub(before);
            let token = self.derived.borrow_mut().reserve_var(key.clone(), bytes);
            let mut inputs = self.inputs.borrow_mut();
            inputs.var_tokens.insert(name.to_string(), token);
            inputs.lent.push(Lent::Var(name.to_string(), key));
        }
        Ok(value)
    }

    /// Puts the values lent to the render's context (`data`) back in the
    /// cache; one that is not where it was lent (never so) is dropped from
    /// the cache.
    pub fn take_back(&self, data: &mut Value) {
        let lent = std::mem::take(&mut self.inputs.borrow_mut().lent);
        if lent.is_empty() {
            return;
        }
        let mut derived = self.derived.borrow_mut();
        for l in lent {
            let (root, name) = match &l {
                Lent::List(n, _) => ("related", n),
                Lent::Var(n, _) => ("vars", n),
            };
            let v = data
                .get_mut(root)
                .and_then(|r| r.get_mut(name.as_str()))
                .map(std::mem::take)
                .filter(|v| !v.is_null());
            match l {
                Lent::List(_, key) => match (v, derived.lists.get_mut(&key)) {
                    (Some(v), Some(e)) => e.value = Some(v),
                    _ => {
                        derived.lists.remove(&key);
                    }
                },
                Lent::Var(_, key) => match (v, derived.vars.get_mut(&key)) {
                    (Some(v), Some(e)) => e.value = Some(v),
                    _ => {
                        derived.vars.remove(&key);
                    }
                },
            }
        }
    }

    /// The objects a rendered related query (`read`, of related set `i` in
    /// namespace `ns`) finds: looked up by `look_up` once per rule and
    /// filters, then filtered by owner; its read recorded with what it hit
    /// (`intern` shares the hits' keys).
    /// A read filtered by owner is looked up by owner (`by_owner`, which
    /// finds what passes all its filters, `None` when it cannot): what a
    /// render of one trigger reads, not every object of the kind.
    pub fn found_objects(
        &self,
        (i, ns): (usize, Option<String>),
        mut read: Read,
        (look_up, by_owner): (
            impl FnOnce(Option<&String>, &Read) -> Vec<Arc<Value>>,
            impl FnOnce(Option<&String>, &Read) -> Option<Vec<Arc<Value>>>,
        ),
        intern: impl Fn(BTreeSet<(String, String)>) -> Arc<BTreeSet<(String, String)>>,
    ) -> Vec<Arc<Value>> {
        if read.owner.is_some() {
            let shared = owned_key(i, ns.as_ref(), &read);
            let hit = shared
                .as_ref()
                .and_then(|k| self.inputs.borrow().owned.get(k).cloned());
            let found = match hit {
                Some(hit) => Some(hit),
                None => by_owner(ns.as_ref(), &read).map(|found| {
                    let hits = self
                        .record
                        .then(|| intern(found.iter().filter_map(|o| key_of(o)).collect()));
                    if let Some(k) = shared {
                        let owned = &mut self.inputs.borrow_mut().owned;
                        if owned.len() >= FOUND_MAX {
                            owned.clear();
                        }
                        owned.insert(k, (found.clone(), hits.clone()));
                    }
                    (found, hits)
                }),
            };
            if let Some((found, hits)) = found {
                if let Some(hits) = hits {
                    read.hits = hits;
                    self.record_read(read);
                }
                return found;
            }
        }
        // By the set (its kind) and its rendered filters: no text of the
        // kind built per render.
        let lookup: FoundKey = (i, ns.clone(), read.names.clone(), read.selector_text());
        let mut inputs = self.inputs.borrow_mut();
        if !inputs.found.contains_key(&lookup) {
            let objects = look_up(ns.as_ref(), &read);
            if inputs.found.len() >= FOUND_MAX {
                inputs.found.clear();
            }
            inputs.found.insert(
                lookup.clone(),
                Found {
                    objects,
                    by_owner: None,
                    by_any_owner: None,
                    hits: None,
                },
            );
        }
        let (found, hits) = match inputs.found.get_mut(&lookup) {
            None => (Vec::new(), None),
            Some(f) => self.owned(f, &read, &intern),
        };
        drop(inputs);
        if self.record {
            read.hits = match hits {
                Some(h) => h,
                None => intern(found.iter().filter_map(|o| key_of(o)).collect()),
            };
            self.record_read(read);
        }
        found
    }

    /// What a lookup found that passes `read`'s owner filter (through an
    /// index by owner built once per lookup); unfiltered, with the keys
    /// of what it hit, interned once per lookup.
    #[allow(clippy::type_complexity)]
    fn owned(
        &self,
        f: &mut Found,
        read: &Read,
        intern: &impl Fn(BTreeSet<(String, String)>) -> Arc<BTreeSet<(String, String)>>,
    ) -> (Vec<Arc<Value>>, Option<Arc<BTreeSet<(String, String)>>>) {
        let found = match &read.owner {
            None => {
                let hits = self.record.then(|| {
                    Arc::clone(f.hits.get_or_insert_with(|| {
                        intern(f.objects.iter().filter_map(|o| key_of(o)).collect())
                    }))
                });
                return (f.objects.clone(), hits);
            }
            Some(OwnerFilter::AnyOf(uids)) => {
                let by_uid = f
                    .by_any_owner
                    .get_or_insert_with(|| any_owner_index(&f.objects));
                let at = uids.iter().filter_map(|u| by_uid.get(u.as_str())).flatten();
                passing_at(&f.objects, at, read)
            }
            Some(OwnerFilter::Lineage(owners)) => {
                let (by_uid, _) = f.by_owner.get_or_insert_with(|| owner_index(&f.objects));
                let at = owners
                    .keys()
                    .filter_map(|u| by_uid.get(u.as_str()))
                    .flatten();
                passing_at(&f.objects, at, read)
            }
            Some(OwnerFilter::Controller(owner)) if !owner.uid.is_empty() => {
                let (by_uid, loose) = f.by_owner.get_or_insert_with(|| owner_index(&f.objects));
                let at = by_uid
                    .get(owner.uid.as_str())
                    .into_iter()
                    .flatten()
                    .chain(loose.iter());
                passing_at(&f.objects, at, read)
            }
            Some(_) => f
                .objects
                .iter()
                .filter(|o| read.passes(o))
                .cloned()
                .collect(),
        };
        (found, None)
    }
}

/// Positions of `objects` by the uid of each controller ownerReference;
/// those with a controller without a uid (matched by kind and name) apart.
fn owner_index(objects: &[Arc<Value>]) -> OwnerIndex {
    let mut by_uid: HashMap<String, Vec<usize>> = HashMap::default();
    let mut loose = Vec::new();
    for (n, o) in objects.iter().enumerate() {
        let controllers = o["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["controller"].as_bool() == Some(true));
        for r in controllers {
            match r["uid"].as_str().unwrap_or_default() {
                "" => loose.push(n),
                uid => by_uid.entry(uid.to_string()).or_default().push(n),
            }
        }
    }
    (by_uid, loose)
}

/// The objects at positions `at` (in view order, each once) that pass
/// `read`'s filters.
fn passing_at<'a>(
    objects: &[Arc<Value>],
    at: impl Iterator<Item = &'a usize>,
    read: &Read,
) -> Vec<Arc<Value>> {
    let mut at: Vec<usize> = at.copied().collect();
    at.sort_unstable();
    at.dedup();
    at.into_iter()
        .filter_map(|n| objects.get(n))
        .filter(|o| read.passes(o))
        .cloned()
        .collect()
}

/// Positions of `objects` by the uid of each of their ownerReferences
/// (controller or not).
fn any_owner_index(objects: &[Arc<Value>]) -> HashMap<String, Vec<usize>> {
    let mut by_uid: HashMap<String, Vec<usize>> = HashMap::default();
    for (n, o) in objects.iter().enumerate() {
        for uid in owner_uids(o) {
            by_uid.entry(uid.to_string()).or_default().push(n);
        }
    }
    by_uid
}
