//! The covers check on arbitrary policy rules (JSON: two lists of
//! PolicyRule): never panics, is reflexive, and a rule covers its
//! breakdown.
#![no_main]

use k8s_openapi::api::rbac::v1::PolicyRule;
use libfuzzer_sys::fuzz_target;
use rbac_rules::policy;

fuzz_target!(|data: &[u8]| {
    let Ok((a, b)) = serde_json::from_slice::<(Vec<PolicyRule>, Vec<PolicyRule>)>(data) else {
        return;
    };
    assert!(policy::covers(&a, &a).0);
    let _ = policy::covers(&a, &b);
    let _ = policy::denied_grants(&b, &policy::Waivers::default());
    for r in &a {
        for part in policy::breakdown(r) {
            assert!(policy::rule_covers(r, &part));
        }
    }
    let _ = policy::compact(&a);
});
