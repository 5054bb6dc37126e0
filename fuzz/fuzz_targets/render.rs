//! Rule parsing and rendering: the input is rule YAML and object YAML
//! separated by a line `---8<---`. Evaluation must never panic, and no
//! emitted policy field may hold a `*` that the rules do not write
//! literally.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rbac_rules::engine::{Engine, ObjectStore, Options};
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (rules_text, objects_text) = text.split_once("\n---8<---\n").unwrap_or((text, ""));
    let Ok(rules) = rbac_rules::rules::parse_text(Path::new("fuzz.yaml"), rules_text) else {
        return;
    };
    let mut store = ObjectStore::new();
    if let Ok(docs) = rbac_rules::yaml::parse_documents(Path::new("objects.yaml"), objects_text) {
        for d in docs {
            let _ = store.insert(d.value);
        }
    }
    let eval = Engine::new(&rules, Options::default()).evaluate(&store);
    for d in &eval.desired {
        for r in d.object["rules"].as_array().into_iter().flatten() {
            for f in ["apiGroups", "resources", "resourceNames", "nonResourceURLs", "verbs"] {
                for v in r[f].as_array().into_iter().flatten() {
                    let v = v.as_str().unwrap_or_default();
                    if v.contains('*') {
                        assert!(rules_text.contains(v), "{v:?} is not written in the rules");
                    }
                }
            }
        }
    }
});
