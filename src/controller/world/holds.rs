//! Which rules not to evaluate now, and why ([`Hold`]): a kind not served
//! or not yet listed, a missing allow-list, the rules they feed, and the
//! slow lane, with the copy of the store it evaluates.

use std::collections::{BTreeMap, BTreeSet};

use super::World;
use super::listing::KindWatch;
use crate::api::RbacRuleSpec;
use crate::controller::status::Hold;
use crate::engine::GroupKind;

impl World {
    /// Rules not to evaluate now, and why.
    pub fn holds(&self) -> BTreeMap<String, Hold> {
        let mut out = BTreeMap::new();
        if let Some(name) = &self.allow_name
            && self.allow.is_none()
        {
            for rule in self.rules.keys() {
                out.insert(
                    rule.clone(),
                    Hold::AllowListNotFound(format!(
                        "the allow-list ClusterRole {name:?} (--allow-clusterrole) does not exist; no rule is evaluated"
                    )),
                );
            }
            return out;
        }
        for (rule, (spec, kinds)) in &self.rule_kinds {
            let mut not_served = Vec::new();
            let mut failed = Vec::new();
            let mut waiting = Vec::new();
            for gk in kinds {
                match self.kinds.get(gk) {
                    Some(KindWatch {
                        unresolved: Some(why),
                        ..
                    }) => not_served.push(why.clone()),
                    Some(w) if !self.listed(w).0 => match self.listed(w).1 {
                        Some(e) => failed.push(format!("cannot list {gk}: {e}")),
                        None => waiting.push(gk.to_string()),
                    },
                    Some(_) => {}
                    None => waiting.push(gk.to_string()),
                }
            }
            let hold = if !not_served.is_empty() {
                Some(Hold::KindNotServed(not_served.join("; ")))
            } else if !failed.is_empty() {
                Some(Hold::WatchFailed(failed.join("; ")))
            } else if !waiting.is_empty() {
                Some(Hold::WaitingForSync(format!(
                    "waiting for the first list of {}",
                    waiting.join(", ")
                )))
            } else {
                None
            };
            let hold = hold.or_else(|| {
                (self.slow.get(rule) == Some(spec)).then(|| {
                    Hold::SlowLane(
                        "slower than --slow-rule-seconds: evaluated in the slow lane".to_string(),
                    )
                })
            });
            if let Some(h) = hold {
                out.insert(rule.clone(), h);
            }
        }
        self.hold_readers_of_waiting(&mut out);
        out
    }

    /// A rule that reads (rulesFrom, related objects) what a rule still
    /// waiting for its first lists emits would render from a partial
    /// picture and write its objects again once the picture is whole: it
    /// waits too, so that a first sync writes each object once.
    pub(super) fn hold_readers_of_waiting(&self, out: &mut BTreeMap<String, Hold>) {
        let emits = |spec: &RbacRuleSpec| -> BTreeSet<GroupKind> {
            spec.outputs
                .iter()
                .map(|o| crate::engine::compile::output_gk(o.kind))
                .collect()
        };
        // What each rule reads itself (not what policy reads for it).
        let reads: BTreeMap<&str, Vec<GroupKind>> = self
            .rule_kinds
            .iter()
            .map(|(rule, (spec, _))| {
                let source = crate::engine::RuleSource {
                    name: rule.clone(),
                    spec: spec.clone(),
                    namespace: crate::controller::tenants::namespace_of(rule),
                };
                let kinds = crate::engine::shape::interests(std::slice::from_ref(&source))
                    .into_iter()
                    .map(|i| i.gk)
                    .collect();
                (rule.as_str(), kinds)
            })
            .collect();
        loop {
            // A rule of the slow lane is a producer too: its readers go
            // with it, so that they render from its new outputs, not from
            // what it made before.
            let waiting: BTreeMap<&str, (BTreeSet<GroupKind>, bool)> = out
                .iter()
                .filter(|(_, h)| matches!(h, Hold::WaitingForSync(_) | Hold::SlowLane(_)))
                .filter_map(|(name, h)| {
                    let (spec, _) = self.rule_kinds.get(name)?;
                    Some((name.as_str(), (emits(spec), h.is_slow_lane())))
                })
                .collect();
            let mut more = Vec::new();
            for (rule, read) in &reads {
                if out.contains_key(*rule) {
                    continue;
                }
                let producers: Vec<(&str, bool)> = waiting
                    .iter()
                    .filter(|(_, (kinds, _))| read.iter().any(|gk| kinds.contains(gk)))
                    .map(|(name, (_, slow))| (*name, *slow))
                    .collect();
                if producers.is_empty() {
                    continue;
                }
                let names: Vec<&str> = producers.iter().map(|p| p.0).collect();
                let names = names.join(", ");
                // Waiting for a list wins: the slow lane evaluates only
                // rules that can run now.
                let hold = if producers.iter().all(|p| p.1) {
                    Hold::SlowLane(format!("reads outputs of rules in the slow lane: {names}"))
                } else {
                    Hold::WaitingForSync(format!(
                        "waiting for rules whose outputs it reads: {names}"
                    ))
                };
                more.push((rule.to_string(), hold));
            }
            if more.is_empty() {
                return;
            }
            out.extend(more);
        }
    }

    /// Moves rules to the slow lane (see [`Hold::SlowLane`]): they stay
    /// there while their spec stays the same. Returning one to the main
    /// pass would render it whole there again, and a rule still slow would
    /// hold that pass up to `--slow-rule-seconds` every time.
    pub fn move_to_slow_lane(&mut self, rules: impl IntoIterator<Item = String>) {
        for name in rules {
            if let Some(r) = self.rules.get(&name) {
                self.slow.insert(name, r.spec.clone());
            }
        }
        let rules = &self.rules;
        self.slow
            .retain(|name, spec| rules.get(name).is_some_and(|r| r.spec == *spec));
    }
}
