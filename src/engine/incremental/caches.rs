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

/// Denials of roles, by the address of their rule list (weakly held).
pub(crate) type DenialsCache = HashMap<usize, (Weak<Vec<PolicyRule>>, Arc<Denials>)>;

/// Why a copy leaves a source out (`None`: copied), by the address of the
/// source's rule list (weakly held); see [`crate::policy::copy_refusal`].
/// Valid for one allow-list: a memo whose allow-list's rules change starts
/// afresh.
pub(crate) type CopyVerdicts = HashMap<usize, (Weak<Vec<PolicyRule>>, Option<Arc<str>>)>;

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
}

/// Selections by reader (`None`: policy).
pub(crate) type Selections = HashMap<Option<usize>, ReaderSelections>;

/// One reader's selections, by the selectors' JSON.
#[derive(Default)]
pub(crate) struct ReaderSelections {
    pub by_json: HashMap<String, Selection>,
    /// The selections (by id) each ClusterRole is a member of: a changed
    /// role is looked for only in those.
    pub member_of: HashMap<ObjectKey, Vec<u64>>,
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
    /// Cached ClusterRole selections, per reader.
    pub selections: RefCell<Selections>,
    /// Observed objects by owner, for related sets filtered by owner.
    pub owners: RefCell<super::owners::OwnerIndex>,
}
