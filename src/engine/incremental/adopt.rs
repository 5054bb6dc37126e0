//! A memo kept across a change of the rules: a new engine (an RbacRule
//! changed) takes over its predecessor's memo instead of starting over,
//! so a rule change costs the changed rule's triggers and what their
//! outputs reach, not a full evaluation.
//!
//! Each rule is named by its [`RuleStamp`]: its name and the text of what
//! it compiles from (spec and params). A memo carries the stamps of the
//! engine that made it; a new engine whose runnable rules are the same,
//! in the same order, under the same options, takes it over: a rule whose
//! stamp is unchanged keeps its memo (outcomes, read index, cached
//! values), a changed one keeps its outcomes only to tell what changed and
//! renders every trigger again. Anything else starts over.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

use super::memo::{Derived, ItemCache, Memo};
use crate::api::RbacRuleSpec;
use crate::engine::model::RuleReport;
use crate::engine::store::GroupKind;

/// What an engine is made of, as far as a memo it made can be taken over
/// by another: its runnable rules in evaluation order, the rules it
/// cannot run (whose live objects are preserved, not pruned) and its
/// options (compared by the engine: this module knows no options).
pub struct EngineStamp {
    /// Runnable rules, in evaluation order.
    pub rules: Vec<RuleStamp>,
    /// Rules with a fixed report (invalid, inactive, in a cycle).
    pub fixed: BTreeSet<String>,
    /// The engine's options.
    pub options: Box<dyn Any + Send + Sync>,
}

impl EngineStamp {
    /// Bytes its rules' stamps hold.
    pub fn bytes(&self) -> usize {
        self.rules.iter().map(RuleStamp::bytes).sum()
    }
}

/// What identifies a runnable rule's meaning: its name and the JSON text
/// of its spec (as confined) and params. Compared whole, text for text
/// (no hash an author could aim two rules at).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleStamp {
    /// The rule's name.
    pub name: String,
    /// Its spec and params as JSON text.
    content: Arc<str>,
    /// The kinds it emits: when a changed rule's differ, what its live
    /// objects hide changes for both.
    produces: BTreeSet<GroupKind>,
}

impl RuleStamp {
    /// The stamp of a compiled rule.
    pub fn of(
        name: &str,
        spec: &RbacRuleSpec,
        params: &serde_json::Map<String, Value>,
        produces: &BTreeSet<GroupKind>,
    ) -> RuleStamp {
        // A spec that cannot be written as text (none can) gets a text no
        // other has: never taken for unchanged.
        let content = serde_json::to_string(&(spec, params))
            .unwrap_or_else(|_| format!("\u{0}unwritable:{}", super::memo::next_engine_id()));
        RuleStamp {
            name: name.to_string(),
            content: content.into(),
            produces: produces.clone(),
        }
    }

    /// Bytes the stamp holds (its text and name).
    pub fn bytes(&self) -> usize {
        self.content.len() + self.name.len()
    }
}

/// What a memo taken over by a new engine must do on its first
/// evaluation there: the rules (by index) whose triggers all render
/// again, and the kinds whose live objects' visibility may have changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Changed rules, by their index in evaluation order.
    pub rules: BTreeSet<usize>,
    /// Kinds a changed rule emitted before or emits now, when the two
    /// differ.
    pub whole: Vec<GroupKind>,
}

/// Takes `memo` over for the engine `engine` (made of `stamp`, with
/// `fixed` reports), when the memo's engine ran the same rules in the same
/// order, could not run the same others, and had options `same_options`
/// finds equal. Returns whether it did; a memo not taken over is left as
/// it is (its evaluation starts over).
pub(in crate::engine) fn adopt(
    memo: &mut Memo,
    (engine, stamp): (u64, &Arc<EngineStamp>),
    fixed: &BTreeMap<String, RuleReport>,
    same_options: impl FnOnce(&(dyn Any + Send + Sync)) -> bool,
) -> bool {
    if memo.engine == engine {
        return true;
    }
    let Some(old) = memo.stamp.clone() else {
        return false;
    };
    let adoptable = !memo.one_shot
        && memo.seen.is_some()
        && memo.shed.is_empty()
        && memo.rules.len() == stamp.rules.len()
        && old.rules.len() == stamp.rules.len()
        && old
            .rules
            .iter()
            .zip(&stamp.rules)
            .all(|(a, b)| a.name == b.name)
        && old.fixed == stamp.fixed
        && same_options(&*old.options);
    if !adoptable {
        return false;
    }
    let mut adopted = Adopted::default();
    for (idx, (was, now)) in old.rules.iter().zip(&stamp.rules).enumerate() {
        let rm = &mut memo.rules[idx];
        // Keyed by the addresses of the old engine's templates, which a
        // new engine's may take once the old one is gone.
        rm.deps.clear();
        rm.unseen.clear();
        forget_template_keys(&mut rm.derived);
        if was.content != now.content {
            adopted.rules.insert(idx);
            // Computed by its old definitions.
            rm.derived = Derived::default();
            rm.items = ItemCache::default();
            if was.produces != now.produces {
                adopted
                    .whole
                    .extend(was.produces.iter().chain(&now.produces).cloned());
            }
        }
    }
    memo.engine = engine;
    memo.stamp = Some(Arc::clone(stamp));
    // Rendered again below: the last result is not this engine's.
    memo.last = None;
    // The reports of the rules it cannot run are this engine's (their
    // names are the same; their errors may not be).
    let reports = Arc::make_mut(&mut memo.reports);
    for (name, report) in fixed {
        reports.insert(name.clone(), report.clone());
    }
    memo.adopted = Some(adopted);
    true
}

/// Drops a rule's cached values keyed by a template's address (its
/// expansions, and what was checked or assembled from them).
fn forget_template_keys(d: &mut Derived) {
    d.expansions.clear();
    d.policies.clear();
    d.assembled.clear();
}
