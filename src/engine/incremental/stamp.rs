//! What an engine is made of, as far as a memo it made can be taken over
//! by another (see the `adopt` module): its rules' stamps, compared text for
//! text, and what a memo taken over must do on its first evaluation.

use std::any::Any;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use crate::api::RbacRuleSpec;
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
    pub(super) content: Arc<str>,
    /// The kinds it emits: when a changed rule's differ, what its live
    /// objects hide changes for both.
    pub(super) produces: BTreeSet<GroupKind>,
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
        let content = serde_json::to_string(&(spec, params)).unwrap_or_else(|_| {
            format!(
                "\u{0}unwritable:{}",
                UNWRITABLE.fetch_add(1, Ordering::Relaxed)
            )
        });
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

/// Tells apart the stamps of specs that cannot be written as text.
static UNWRITABLE: AtomicU64 = AtomicU64::new(0);
