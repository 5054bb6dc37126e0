//! `rbac-rules bench`: figures for issue 9 (scale) on synthetic Crossplane
//! control planes ([`synth`]).

pub mod synth;
