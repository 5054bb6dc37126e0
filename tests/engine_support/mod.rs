//! Helpers shared by the engine-level test suites: rules from YAML text,
//! the built-in rules, and a store of objects.

#![allow(dead_code)]

use rbac_rules::engine::{ObjectStore, RuleSource};
use serde_json::Value;

/// Rules parsed from `yaml` (named `test.yaml` in messages).
pub fn rules(yaml: &str) -> Vec<RuleSource> {
    rbac_rules::rules::parse_text(std::path::Path::new("test.yaml"), yaml).expect("rules parse")
}

/// The built-in rules (rules/*.yaml).
pub fn builtin() -> Vec<RuleSource> {
    rbac_rules::rules::builtin().expect("built-in rules load")
}

/// A store holding `objects`.
pub fn store(objects: &[Value]) -> ObjectStore {
    let mut s = ObjectStore::new();
    for o in objects {
        s.insert(o.clone()).expect("object inserts");
    }
    s
}
