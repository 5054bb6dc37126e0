//! What exists only for speed: what an evaluation remembers for the next
//! ([`memo`]: outcomes, reads and their reverse index), the caches the
//! world views share ([`caches`], with the index of observed objects by
//! owner, [`owners`]) and those one rule's evaluator keeps while its
//! triggers render ([`eval`]); what an engine is made of ([`stamp`]), by
//! which a new engine of the same rules takes a memo over ([`adopt`]). The
//! stages that decide what a rule means import these; nothing here decides
//! a meaning.

pub mod adopt;
pub mod caches;
pub mod eval;
pub mod keys;
pub mod memo;
pub mod owners;
pub mod stamp;
