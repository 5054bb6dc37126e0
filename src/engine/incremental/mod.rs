//! What exists only for speed: what an evaluation remembers for the next
//! ([`memo`]: outcomes, reads and their reverse index) and the caches the
//! world views share ([`caches`]). The stages that decide what a rule
//! means import these; nothing here decides a meaning.

pub mod caches;
pub mod memo;
