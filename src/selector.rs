//! Kubernetes label selector semantics (`metav1.LabelSelector`).
//!
//! Mirrors apimachinery's `LabelSelectorAsSelector` followed by
//! `Selector.Matches`: `matchLabels` and every `matchExpressions` entry are
//! `ANDed`, an empty selector matches everything, and a selector that the API
//! machinery would refuse to convert is an error rather than a silent
//! "no match".

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// Longest label name (and label value) Kubernetes accepts.
const MAX_NAME_LEN: usize = 63;
/// Longest DNS-1123 subdomain, the limit for a label key prefix.
const MAX_PREFIX_LEN: usize = 253;

/// Why a label selector cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The operator is not one of `In`, `NotIn`, `Exists`, `DoesNotExist`.
    #[error("label selector key {key:?}: {operator:?} is not a valid label selector operator")]
    UnknownOperator {
        /// The requirement's label key.
        key: String,
        /// The operator as written.
        operator: String,
    },
    /// `In` / `NotIn` was given no values.
    #[error("label selector key {key:?} with operator {operator}: values must be non-empty")]
    MissingValues {
        /// The requirement's label key.
        key: String,
        /// The operator as written.
        operator: String,
    },
    /// `Exists` / `DoesNotExist` was given values.
    #[error("label selector key {key:?} with operator {operator}: values must be empty")]
    UnexpectedValues {
        /// The requirement's label key.
        key: String,
        /// The operator as written.
        operator: String,
    },
    /// The key is not a valid qualified label name (`[prefix/]name`).
    #[error("label selector key {key:?} with operator {operator}: invalid label key: {reason}")]
    InvalidKey {
        /// The offending key.
        key: String,
        /// The operator (`In` for `matchLabels` entries).
        operator: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A value is not a valid label value.
    #[error(
        "label selector key {key:?} with operator {operator}: invalid label value {value:?}: {reason}"
    )]
    InvalidValue {
        /// The requirement's label key.
        key: String,
        /// The operator (`In` for `matchLabels` entries).
        operator: String,
        /// The offending value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A requirement operator, parsed from its API spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl Operator {
    fn parse(key: &str, operator: &str) -> Result<Self, SelectorError> {
        match operator {
            "In" => Ok(Self::In),
            "NotIn" => Ok(Self::NotIn),
            "Exists" => Ok(Self::Exists),
            "DoesNotExist" => Ok(Self::DoesNotExist),
            _ => Err(SelectorError::UnknownOperator {
                key: key.to_owned(),
                operator: operator.to_owned(),
            }),
        }
    }

    fn takes_values(self) -> bool {
        matches!(self, Self::In | Self::NotIn)
    }
}

/// Evaluates `selector` against an object's `labels`.
///
/// The whole selector is validated first (like `LabelSelectorAsSelector`),
/// so an invalid selector is an error whatever the labels are.
///
/// # Errors
///
/// Any [`SelectorError`] that [`validate`] reports.
pub fn matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    validate(selector)?;
    Ok(matches_map(selector, labels))
}

/// Evaluates an already [`validate`]d selector against an object's
/// `metadata.labels` as JSON, without copying the labels: the engine matches
/// one selector against many objects and validates it once.
/// Non-text label values never match.
pub fn matches_json(
    selector: &LabelSelector,
    labels: Option<&serde_json::Map<String, serde_json::Value>>,
) -> bool {
    matches_lookup(selector, |key| {
        labels.and_then(|m| m.get(key)).and_then(|v| v.as_str())
    })
}

/// Like [`matches_json`], for labels read through `get` (a label's value
/// by key): evaluates an already [`validate`]d selector.
pub fn matches_lookup<'l>(selector: &LabelSelector, get: impl Fn(&str) -> Option<&'l str>) -> bool {
    let labels_ok = match_labels(selector)
        .iter()
        .all(|(key, value)| get(key) == Some(value.as_str()));
    labels_ok
        && match_expressions(selector).iter().all(|r| {
            let values = requirement_values(r);
            match r.operator.as_str() {
                "In" => get(&r.key).is_some_and(|v| values.iter().any(|x| x == v)),
                "NotIn" => get(&r.key).is_none_or(|v| !values.iter().any(|x| x == v)),
                "Exists" => get(&r.key).is_some(),
                "DoesNotExist" => get(&r.key).is_none(),
                _ => false,
            }
        })
}

/// Like [`matches_json`], for labels held as a map of text: evaluates an
/// already [`validate`]d selector without validating it again.
pub fn matches_map(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    match_labels(selector)
        .iter()
        .all(|(key, value)| labels.get(key.as_str()) == Some(value))
        && match_expressions(selector)
            .iter()
            .all(|requirement| requirement_matches(requirement, labels))
}

/// Like [`matches()`], for `ObjectMeta.labels`-style optional maps: `None`
/// means "no labels".
///
/// # Errors
///
/// Any [`SelectorError`] that [`validate`] reports.
pub fn matches_opt(
    selector: &LabelSelector,
    labels: Option<&BTreeMap<String, String>>,
) -> Result<bool, SelectorError> {
    // An empty map allocates nothing, so this costs nothing for `None`.
    let empty = BTreeMap::new();
    matches(selector, labels.unwrap_or(&empty))
}

/// Checks that `selector` could be converted by `LabelSelectorAsSelector`:
/// known operators, value counts per operator, and valid label keys and
/// values. Reports the first problem in `matchLabels` then
/// `matchExpressions` order.
///
/// # Errors
///
/// The first problem found, naming the key and operator.
pub fn validate(selector: &LabelSelector) -> Result<(), SelectorError> {
    for (key, value) in match_labels(selector) {
        // matchLabels entries are `key In (value)` requirements upstream.
        validate_key(key, "In")?;
        validate_value(key, "In", value)?;
    }
    for requirement in match_expressions(selector) {
        validate_requirement(requirement)?;
    }
    Ok(())
}

fn match_labels(selector: &LabelSelector) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    selector.match_labels.as_ref().unwrap_or(&EMPTY)
}

fn match_expressions(selector: &LabelSelector) -> &[LabelSelectorRequirement] {
    selector.match_expressions.as_deref().unwrap_or_default()
}

fn requirement_values(requirement: &LabelSelectorRequirement) -> &[String] {
    requirement.values.as_deref().unwrap_or_default()
}

fn validate_requirement(requirement: &LabelSelectorRequirement) -> Result<(), SelectorError> {
    let key = requirement.key.as_str();
    let op_name = requirement.operator.as_str();
    // Operator first: upstream rejects an unknown operator before looking at
    // the key.
    let operator = Operator::parse(key, op_name)?;
    validate_key(key, op_name)?;
    let values = requirement_values(requirement);
    if operator.takes_values() && values.is_empty() {
        return Err(SelectorError::MissingValues {
            key: key.to_owned(),
            operator: op_name.to_owned(),
        });
    }
    if !operator.takes_values() && !values.is_empty() {
        return Err(SelectorError::UnexpectedValues {
            key: key.to_owned(),
            operator: op_name.to_owned(),
        });
    }
    for value in values {
        validate_value(key, op_name, value)?;
    }
    Ok(())
}

/// Evaluates one already-validated requirement.
fn requirement_matches(
    requirement: &LabelSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let actual = labels.get(requirement.key.as_str());
    let values = requirement_values(requirement);
    let in_values = |value: &String| values.contains(value);
    match Operator::parse(&requirement.key, &requirement.operator) {
        Ok(Operator::In) => actual.is_some_and(in_values),
        // NotIn also matches objects that lack the key entirely.
        Ok(Operator::NotIn) => !actual.is_some_and(in_values),
        Ok(Operator::Exists) => actual.is_some(),
        Ok(Operator::DoesNotExist) => actual.is_none(),
        // Unreachable after validate(); never match rather than panic.
        Err(_) => false,
    }
}

fn validate_key(key: &str, operator: &str) -> Result<(), SelectorError> {
    qualified_name_problem(key).map_or(Ok(()), |reason| {
        Err(SelectorError::InvalidKey {
            key: key.to_owned(),
            operator: operator.to_owned(),
            reason,
        })
    })
}

fn validate_value(key: &str, operator: &str, value: &str) -> Result<(), SelectorError> {
    label_value_problem(value).map_or(Ok(()), |reason| {
        Err(SelectorError::InvalidValue {
            key: key.to_owned(),
            operator: operator.to_owned(),
            value: value.to_owned(),
            reason,
        })
    })
}

/// Describes why `key` is not a qualified name (`[dns-subdomain/]name`).
fn qualified_name_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Some("prefix part must be non-empty".to_owned());
        }
        if let Some(problem) = dns_subdomain_problem(prefix) {
            return Some(format!("prefix part {problem}"));
        }
    }
    if name.is_empty() {
        return Some("name part must be non-empty".to_owned());
    }
    if name.len() > MAX_NAME_LEN {
        return Some(format!(
            "name part must be no more than {MAX_NAME_LEN} characters"
        ));
    }
    if !is_label_token(name) {
        return Some(
            "name part must consist of alphanumeric characters, '-', '_' or '.', \
             and must start and end with an alphanumeric character"
                .to_owned(),
        );
    }
    None
}

/// Describes why `value` is not a valid label value (empty is valid).
fn label_value_problem(value: &str) -> Option<String> {
    if value.len() > MAX_NAME_LEN {
        return Some(format!("must be no more than {MAX_NAME_LEN} characters"));
    }
    if !value.is_empty() && !is_label_token(value) {
        return Some(
            "must consist of alphanumeric characters, '-', '_' or '.', \
             and must start and end with an alphanumeric character"
                .to_owned(),
        );
    }
    None
}

/// Describes why `prefix` is not a DNS-1123 subdomain.
fn dns_subdomain_problem(prefix: &str) -> Option<String> {
    if prefix.len() > MAX_PREFIX_LEN {
        return Some(format!("must be no more than {MAX_PREFIX_LEN} characters"));
    }
    if !prefix.split('.').all(is_dns_label) {
        return Some(
            "must be a lowercase RFC 1123 subdomain (lowercase alphanumeric, '-' or '.', \
             starting and ending with an alphanumeric character)"
                .to_owned(),
        );
    }
    None
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, without a regex engine.
fn is_label_token(text: &str) -> bool {
    let edges_ok = starts_and_ends_with(text, |c| c.is_ascii_alphanumeric());
    edges_ok
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`: one dot-separated part of a subdomain.
fn is_dns_label(part: &str) -> bool {
    let lower_alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    starts_and_ends_with(part, lower_alnum) && part.chars().all(|c| lower_alnum(c) || c == '-')
}

fn starts_and_ends_with(text: &str, allowed: impl Fn(char) -> bool) -> bool {
    match (text.chars().next(), text.chars().last()) {
        (Some(first), Some(last)) => allowed(first) && allowed(last),
        _ => false,
    }
}

#[cfg(test)]
mod json_tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    /// `matches_json` agrees with `matches` on every operator.
    #[test]
    fn json_matcher_agrees_with_matches() {
        let req = |op: &str, vals: &[&str]| LabelSelectorRequirement {
            key: "k".into(),
            operator: op.into(),
            values: if vals.is_empty() {
                None
            } else {
                Some(vals.iter().map(|v| v.to_string()).collect())
            },
        };
        let selectors = [
            LabelSelector {
                match_labels: Some([("a".to_string(), "1".to_string())].into()),
                match_expressions: None,
            },
            LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![req("In", &["x", "y"])]),
            },
            LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![req("NotIn", &["x"])]),
            },
            LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![req("Exists", &[])]),
            },
            LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![req("DoesNotExist", &[])]),
            },
            LabelSelector::default(),
        ];
        let label_sets: [&[(&str, &str)]; 4] =
            [&[], &[("a", "1")], &[("k", "x")], &[("k", "z"), ("a", "2")]];
        for sel in &selectors {
            for set in label_sets {
                let map: BTreeMap<String, String> = set
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                let json: serde_json::Map<String, serde_json::Value> = set
                    .iter()
                    .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
                    .collect();
                assert_eq!(
                    matches(sel, &map).ok(),
                    Some(matches_json(sel, Some(&json))),
                    "{sel:?} on {set:?}"
                );
            }
        }
        assert!(!matches_json(&selectors[0], None));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn expr(key: &str, operator: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.to_owned(),
            operator: operator.to_owned(),
            values: values.map(|vs| vs.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    fn with_exprs(exprs: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(exprs),
            match_labels: None,
        }
    }

    fn with_labels(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_expressions: None,
            match_labels: Some(labels(pairs)),
        }
    }

    #[test]
    fn empty_selector_matches_everything() {
        let empty = LabelSelector::default();
        assert_eq!(matches(&empty, &labels(&[])), Ok(true));
        assert_eq!(matches(&empty, &labels(&[("a", "b")])), Ok(true));
        let empty_lists = LabelSelector {
            match_expressions: Some(vec![]),
            match_labels: Some(BTreeMap::new()),
        };
        assert_eq!(matches(&empty_lists, &labels(&[("a", "b")])), Ok(true));
    }

    #[test]
    fn match_labels_needs_every_pair() {
        let sel = with_labels(&[("app", "web"), ("tier", "front")]);
        assert_eq!(
            matches(
                &sel,
                &labels(&[("app", "web"), ("tier", "front"), ("x", "y")])
            ),
            Ok(true)
        );
        assert_eq!(matches(&sel, &labels(&[("app", "web")])), Ok(false));
        assert_eq!(
            matches(&sel, &labels(&[("app", "web"), ("tier", "back")])),
            Ok(false)
        );
    }

    #[test]
    fn operator_in() {
        let sel = with_exprs(vec![expr("env", "In", Some(&["prod", "staging"]))]);
        assert_eq!(matches(&sel, &labels(&[("env", "prod")])), Ok(true));
        assert_eq!(matches(&sel, &labels(&[("env", "dev")])), Ok(false));
        assert_eq!(matches(&sel, &labels(&[])), Ok(false));
    }

    #[test]
    fn operator_not_in_matches_absent_key() {
        let sel = with_exprs(vec![expr("env", "NotIn", Some(&["prod"]))]);
        assert_eq!(matches(&sel, &labels(&[("env", "dev")])), Ok(true));
        assert_eq!(matches(&sel, &labels(&[])), Ok(true));
        assert_eq!(matches(&sel, &labels(&[("env", "prod")])), Ok(false));
    }

    #[test]
    fn operator_exists() {
        let sel = with_exprs(vec![expr("env", "Exists", None)]);
        assert_eq!(matches(&sel, &labels(&[("env", "")])), Ok(true));
        assert_eq!(matches(&sel, &labels(&[("other", "x")])), Ok(false));
        // An explicit empty list is the same as no values.
        let sel = with_exprs(vec![expr("env", "Exists", Some(&[]))]);
        assert_eq!(matches(&sel, &labels(&[("env", "x")])), Ok(true));
    }

    #[test]
    fn operator_does_not_exist() {
        let sel = with_exprs(vec![expr("env", "DoesNotExist", None)]);
        assert_eq!(matches(&sel, &labels(&[("other", "x")])), Ok(true));
        assert_eq!(matches(&sel, &labels(&[("env", "x")])), Ok(false));
    }

    #[test]
    fn labels_and_expressions_are_anded() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![
                expr("env", "In", Some(&["prod"])),
                expr("legacy", "DoesNotExist", None),
            ]),
        };
        assert_eq!(
            matches(&sel, &labels(&[("app", "web"), ("env", "prod")])),
            Ok(true)
        );
        assert_eq!(
            matches(
                &sel,
                &labels(&[("app", "web"), ("env", "prod"), ("legacy", "1")])
            ),
            Ok(false)
        );
        assert_eq!(matches(&sel, &labels(&[("env", "prod")])), Ok(false));
    }

    #[test]
    fn matches_opt_treats_none_as_no_labels() {
        let sel = with_exprs(vec![expr("env", "DoesNotExist", None)]);
        assert_eq!(matches_opt(&sel, None), Ok(true));
        let present = labels(&[("env", "x")]);
        assert_eq!(matches_opt(&sel, Some(&present)), Ok(false));
    }

    #[test]
    fn in_and_not_in_need_values() {
        for op in ["In", "NotIn"] {
            for values in [None, Some(&[][..])] {
                let sel = with_exprs(vec![expr("env", op, values)]);
                let want = SelectorError::MissingValues {
                    key: "env".to_owned(),
                    operator: op.to_owned(),
                };
                assert_eq!(validate(&sel), Err(want.clone()));
                assert_eq!(matches(&sel, &labels(&[("env", "x")])), Err(want));
            }
        }
    }

    #[test]
    fn exists_and_does_not_exist_take_no_values() {
        for op in ["Exists", "DoesNotExist"] {
            let sel = with_exprs(vec![expr("env", op, Some(&["x"]))]);
            let want = SelectorError::UnexpectedValues {
                key: "env".to_owned(),
                operator: op.to_owned(),
            };
            assert_eq!(validate(&sel), Err(want.clone()));
            assert_eq!(matches(&sel, &labels(&[])), Err(want));
        }
    }

    #[test]
    fn unknown_operator_is_an_error_naming_key_and_operator() {
        // Operators are case-sensitive, as upstream.
        let sel = with_exprs(vec![expr("env", "in", Some(&["x"]))]);
        let err = validate(&sel).err();
        assert_eq!(
            err,
            Some(SelectorError::UnknownOperator {
                key: "env".to_owned(),
                operator: "in".to_owned(),
            })
        );
        let message = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.contains("\"env\"") && message.contains("\"in\""),
            "{message}"
        );
    }

    #[test]
    fn error_even_when_labels_already_fail() {
        // Validation comes before evaluation, like LabelSelectorAsSelector.
        let sel = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![expr("env", "Bogus", None)]),
        };
        assert!(matches(&sel, &labels(&[])).is_err());
    }

    #[test]
    fn invalid_keys_are_rejected() {
        for key in [
            "",
            "has space",
            "-leading",
            "trailing-",
            "/name",
            "Upper.Case/name",
            "a/b/c",
            &"x".repeat(64),
        ] {
            let sel = with_exprs(vec![expr(key, "Exists", None)]);
            assert!(
                matches!(validate(&sel), Err(SelectorError::InvalidKey { .. })),
                "key {key:?} should be invalid"
            );
        }
        for key in [
            "app",
            "app.kubernetes.io/name",
            "rbac.authorization.k8s.io/aggregate-to-view",
            "A_b.c-9",
            &"x".repeat(63),
        ] {
            let sel = with_exprs(vec![expr(key, "Exists", None)]);
            assert_eq!(validate(&sel), Ok(()), "key {key:?} should be valid");
        }
    }

    #[test]
    fn invalid_values_are_rejected() {
        let sel = with_labels(&[("app", "not valid")]);
        assert!(matches!(
            validate(&sel),
            Err(SelectorError::InvalidValue { ref operator, .. }) if operator == "In"
        ));
        let sel = with_exprs(vec![expr("app", "NotIn", Some(&["ok", "-bad"]))]);
        assert!(matches!(
            validate(&sel),
            Err(SelectorError::InvalidValue { ref value, .. }) if value == "-bad"
        ));
        // The empty value is a valid label value.
        let sel = with_labels(&[("app", "")]);
        assert_eq!(matches(&sel, &labels(&[("app", "")])), Ok(true));
    }
}

/// The matcher against kube-core's (`kube::core::Selector`, the label
/// selector semantics the kube crates ship), over random selectors and
/// label maps: wherever a selector is valid they agree, on every way of
/// reading labels.
#[cfg(test)]
mod agreement {
    use super::*;
    use kube::core::SelectorExt;
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    fn key() -> impl Strategy<Value = String> {
        prop::sample::select(vec!["a", "b", "app.kubernetes.io/name", "-bad"])
            .prop_map(String::from)
    }

    fn value() -> impl Strategy<Value = String> {
        prop::sample::select(vec!["", "x", "y", "not valid"]).prop_map(String::from)
    }

    fn requirement() -> impl Strategy<Value = LabelSelectorRequirement> {
        let operator = prop::sample::select(vec!["In", "NotIn", "Exists", "DoesNotExist", "in"]);
        let values = prop::option::of(prop::collection::vec(value(), 0..3));
        (key(), operator, values).prop_map(|(key, operator, values)| LabelSelectorRequirement {
            key,
            operator: operator.to_owned(),
            values,
        })
    }

    fn selector() -> impl Strategy<Value = LabelSelector> {
        (
            prop::option::of(prop::collection::btree_map(key(), value(), 0..3)),
            prop::option::of(prop::collection::vec(requirement(), 0..4)),
        )
            .prop_map(|(match_labels, match_expressions)| LabelSelector {
                match_labels,
                match_expressions,
            })
    }

    /// Labels as a map of text, and the same as JSON with `noise`: keys
    /// whose value is not text (read as absent).
    fn labels() -> impl Strategy<Value = (BTreeMap<String, String>, Vec<String>)> {
        (
            prop::collection::btree_map(key(), value(), 0..4),
            prop::collection::vec(key(), 0..2),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn every_matcher_agrees_with_kube_core((sel, (map, noise)) in (selector(), labels())) {
            let Ok(()) = validate(&sel) else {
                prop_assert!(matches(&sel, &map).is_err());
                return Ok(());
            };
            let kube = kube::core::Selector::try_from(sel.clone());
            prop_assert!(kube.is_ok(), "kube-core refuses a valid selector {sel:?}");
            let want = kube.map(|k| k.matches(&map)).unwrap_or_default();
            let mut json: Map<String, Value> =
                map.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
            for k in noise.iter().filter(|k| !map.contains_key(*k)) {
                json.insert(k.clone(), Value::from(1));
            }
            prop_assert_eq!(matches(&sel, &map), Ok(want), "{:?} on {:?}", sel, map);
            prop_assert_eq!(matches_map(&sel, &map), want);
            prop_assert_eq!(matches_json(&sel, Some(&json)), want);
            prop_assert_eq!(matches_lookup(&sel, |k| map.get(k).map(String::as_str)), want);
            if map.is_empty() {
                prop_assert_eq!(matches_json(&sel, None), want);
                prop_assert_eq!(matches_opt(&sel, None), Ok(want));
            }
        }
    }
}
