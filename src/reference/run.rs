//! What running a rule gives (the records every later stage reads): one
//! [`Outcome`] per trigger, in trigger order. Plain data, below every
//! stage.
//!
//! Fast twin: `engine/incremental/memo.rs` (`Outcome`, kept with its reads).

use crate::engine::Desired;
use crate::engine::error::{FieldError, FieldWarning};
use crate::engine::store::ObjectKey;

pub(super) type Result<T> = std::result::Result<T, FieldError>;

/// What became of one trigger (or of a static rule's one render).
pub(super) enum Outcome {
    /// The object does not trigger the rule.
    NoMatch,
    /// Testing whether it triggers failed (a condition's template).
    MatchError(FieldError),
    /// Paused or being deleted: its outputs are kept as they are.
    Frozen,
    /// Rendering failed: its outputs are kept as they are.
    Failed(FieldError),
    /// Rendered (nothing, when `require` refused it).
    Rendered(Vec<Desired>),
}

impl Outcome {
    /// The objects rendered.
    pub fn outputs(&self) -> &[Desired] {
        match self {
            Outcome::Rendered(d) => d,
            _ => &[],
        }
    }

    /// Whether its live objects are kept as they are.
    pub fn keeps(&self) -> bool {
        matches!(
            self,
            Outcome::MatchError(_) | Outcome::Frozen | Outcome::Failed(_)
        )
    }

    /// Whether the object triggers the rule (`status.matchedTriggers`).
    pub fn matched(&self) -> bool {
        matches!(
            self,
            Outcome::Frozen | Outcome::Failed(_) | Outcome::Rendered(_)
        )
    }
}

/// One trigger's render.
pub(super) struct TriggerRun {
    /// The trigger's namespace and name; `None` for a static rule.
    pub key: Option<ObjectKey>,
    /// The trigger as provenance names it (`Kind.group/[ns/]name`).
    pub tref: Option<String>,
    pub outcome: Outcome,
    /// What it skipped on purpose, sorted, once each.
    pub warnings: Vec<FieldWarning>,
}

/// One rule's renders, in trigger order.
pub(super) struct RuleRun {
    /// Held back by the caller: nothing rendered, its objects kept.
    pub held: bool,
    pub triggers: Vec<TriggerRun>,
}

impl RuleRun {
    pub fn held() -> Self {
        RuleRun {
            held: true,
            triggers: Vec::new(),
        }
    }

    /// Whether the live objects of trigger `tref` (`None`: the static
    /// set) are kept as they are.
    pub fn keeps(&self, tref: Option<&str>) -> bool {
        self.triggers
            .iter()
            .any(|t| t.tref.as_deref() == tref && t.outcome.keeps())
    }
}
