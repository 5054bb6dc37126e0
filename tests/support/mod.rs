//! What the integration suites share, written once, one module per kind
//! of test:
//!
//! - [`cli`]: the `rbac-rules` binary run as a user runs it (`render` of
//!   rule and object texts, any command in a directory);
//! - [`engine`]: rules from YAML text, stores of objects, and the objects
//!   of a synthetic Crossplane control plane (XRDs, revisions, CRDs with
//!   their lineage, Deployments, Namespaces);
//! - [`api`]: a scripted API server (each request checked and answered)
//!   for the controller's HTTP contract;
//! - [`cluster`]: a stand-in API server that keeps state, for the whole
//!   control loop;
//! - [`e2e`]: paths, API resources and polling against a real cluster.
//!
//! A suite declares `mod support;` and uses `support::cli::…`,
//! `support::engine::…` and so on.

#![allow(dead_code)]

pub mod api;
pub mod cli;
pub mod cluster;
pub mod e2e;
pub mod engine;
