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
use std::collections::BTreeMap;
use std::sync::Arc;

use super::memo::{Derived, ItemCache, Memo};
use super::stamp::{Adopted, EngineStamp};
use crate::engine::model::RuleReport;

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
    // names are the same; their errors may not be). A second rule of a
    // runnable rule's name is one of them, but the report under that name
    // is the runnable one's, as when an evaluation starts afresh (its
    // rules' reports are made after the fixed ones).
    let reports = Arc::make_mut(&mut memo.reports);
    for (name, report) in fixed {
        if !stamp.rules.iter().any(|r| r.name == *name) {
            reports.insert(name.clone(), report.clone());
        }
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
