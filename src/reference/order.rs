//! Preparing the rules: compiled once (`spec` validated, templates parsed,
//! `params` given their values), inactive ones (`manageLevel` above
//! `--manage`) set aside, and the rest ordered so that a rule that reads a
//! kind runs after every rule that emits it (ties by name; rules in a
//! cycle do not run).
//!
//! Written once, shared with the engine (`engine/order.rs`): the
//! reference passes its own plain handlebars templates, so that its
//! rendering stays independent of the engine's fast paths.
//!
//! Fast twin: `engine/order.rs`.

use crate::engine::Options;
use crate::engine::RuleSource;
pub(super) use crate::engine::order::Prepared;
use crate::engine::order::prepare as prepare_with;
use crate::engine::template::Templates;

/// Compiles and orders `sources`.
pub(super) fn prepare(sources: &[RuleSource], options: &Options) -> Prepared {
    // Plain handlebars: the engine's fast paths are checked against it.
    prepare_with(
        sources,
        options,
        Templates::plain_with_limits(&options.limits),
    )
}
