//! `rbac-rules bench`: figures for issue 9 (scale) on synthetic Crossplane
//! control planes ([`synth`]).

pub mod fake_api;
pub mod synth;
