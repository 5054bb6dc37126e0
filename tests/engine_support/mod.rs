//! Kept for suites that still declare `mod engine_support;`: the engine
//! helpers are `support::engine` (tests/support/engine.rs), one copy.

#![allow(dead_code)]

#[path = "../support/engine.rs"]
mod engine;

pub use engine::*;
