//! RBAC `PolicyRule` semantics.
//!
//! Follows Kubernetes' own rule comparison (component-helpers
//! `auth/rbac/validation`, used for escalation checks and
//! `kubectl auth reconcile`): a rule is broken into atomic tuples —
//! `(apiGroup, resource, verb[, resourceName])` and `(nonResourceURL, verb)` —
//! and a tuple is covered when a single owner rule allows it.
//!
//! Also emulates the kube-controller-manager `ClusterRole` aggregation
//! controller, so callers can predict the rules of aggregated roles.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::selector::{self, SelectorError};

/// The RBAC wildcard for verbs, API groups and resources.
const ALL: &str = "*";

/// Errors from policy computations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A `ClusterRole`'s `aggregationRule` holds a selector that cannot be
    /// evaluated.
    #[error("ClusterRole {role:?}: invalid aggregationRule clusterRoleSelector: {source}")]
    InvalidAggregationSelector {
        /// Name of the `ClusterRole` holding the selector.
        role: String,
        /// What is wrong with the selector.
        #[source]
        source: SelectorError,
    },
}

/// One atomic permission of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tuple<'a> {
    Resource {
        group: &'a str,
        resource: &'a str,
        verb: &'a str,
        name: Option<&'a str>,
    },
    NonResource {
        url: &'a str,
        verb: &'a str,
    },
}

impl Tuple<'_> {
    /// The tuple as a single-value rule, the shape upstream reports.
    fn to_rule(self) -> PolicyRule {
        match self {
            Tuple::Resource {
                group,
                resource,
                verb,
                name,
            } => PolicyRule {
                api_groups: Some(vec![group.to_owned()]),
                resources: Some(vec![resource.to_owned()]),
                verbs: vec![verb.to_owned()],
                resource_names: name.map(|n| vec![n.to_owned()]),
                non_resource_urls: None,
            },
            Tuple::NonResource { url, verb } => PolicyRule {
                non_resource_urls: Some(vec![url.to_owned()]),
                verbs: vec![verb.to_owned()],
                ..PolicyRule::default()
            },
        }
    }
}

fn list(values: &Option<Vec<String>>) -> &[String] {
    values.as_deref().unwrap_or_default()
}

fn has(values: &[String], wanted: &str) -> bool {
    values.iter().any(|v| v == wanted)
}

/// Expands a rule into its atomic tuples, in list order.
///
/// Like upstream, a rule without apiGroups or without resources yields no
/// resource tuples, and a rule without verbs yields nothing at all.
fn tuples(rule: &PolicyRule) -> Vec<Tuple<'_>> {
    let mut out = Vec::new();
    let names = list(&rule.resource_names);
    for group in list(&rule.api_groups) {
        for resource in list(&rule.resources) {
            for verb in &rule.verbs {
                let resource_tuple = |name| Tuple::Resource {
                    group,
                    resource,
                    verb,
                    name,
                };
                if names.is_empty() {
                    out.push(resource_tuple(None));
                } else {
                    out.extend(names.iter().map(|n| resource_tuple(Some(n.as_str()))));
                }
            }
        }
    }
    for url in list(&rule.non_resource_urls) {
        for verb in &rule.verbs {
            out.push(Tuple::NonResource { url, verb });
        }
    }
    out
}

/// Breaks a rule into equivalent single-value rules: at most one apiGroup,
/// resource, verb and resourceName each, or one nonResourceURL and one verb
/// (upstream `BreakdownRule`).
pub fn breakdown(rule: &PolicyRule) -> Vec<PolicyRule> {
    tuples(rule).into_iter().map(Tuple::to_rule).collect()
}

/// `*` or an exact match; no aliases (so `""` and `"core"` differ).
fn value_covered(owner: &[String], wanted: &str) -> bool {
    has(owner, ALL) || has(owner, wanted)
}

/// `*` covers everything, including subresources; `*/sub` covers `res/sub`.
/// `pods/*` is not a wildcard: it only matches the literal `pods/*`.
fn resource_covered(owner: &[String], wanted: &str) -> bool {
    if has(owner, ALL) || has(owner, wanted) {
        return true;
    }
    match wanted.split_once('/') {
        Some((_, subresource)) => has(owner, &format!("*/{subresource}")),
        None => false,
    }
}

/// Exact match, or a trailing-`*` owner URL covering everything that
/// starts with its prefix (`/api/*` covers `/api/v1` but not `/api`).
pub fn non_resource_url_covers(owner: &str, requested: &str) -> bool {
    owner == requested
        || (owner.ends_with('*') && requested.starts_with(owner.trim_end_matches('*')))
}

/// A tuple without a name needs a name-less owner rule; a named tuple is
/// covered by a name-less owner rule or one listing that name.
fn name_covered(owner: &[String], wanted: Option<&str>) -> bool {
    match wanted {
        None => owner.is_empty(),
        Some(name) => owner.is_empty() || has(owner, name),
    }
}

fn tuple_covered(owner: &PolicyRule, tuple: Tuple<'_>) -> bool {
    let owner_names = list(&owner.resource_names);
    match tuple {
        Tuple::Resource {
            group,
            resource,
            verb,
            name,
        } => {
            value_covered(&owner.verbs, verb)
                && value_covered(list(&owner.api_groups), group)
                && resource_covered(list(&owner.resources), resource)
                && name_covered(owner_names, name)
        }
        // Upstream also demands a name-less owner here: URL tuples carry no
        // resourceName.
        Tuple::NonResource { url, verb } => {
            value_covered(&owner.verbs, verb)
                && name_covered(owner_names, None)
                && list(&owner.non_resource_urls)
                    .iter()
                    .any(|o| non_resource_url_covers(o, url))
        }
    }
}

/// Whether the single `owner` rule allows every tuple of `requested`.
///
/// A requested rule that expands to no tuples (no verbs, or resources
/// without apiGroups) grants nothing and so is covered by anything.
pub fn rule_covers(owner: &PolicyRule, requested: &PolicyRule) -> bool {
    tuples(requested)
        .into_iter()
        .all(|tuple| tuple_covered(owner, tuple))
}

/// Whether the `owner` rule set allows every tuple of every `requested`
/// rule, each tuple by any one owner rule (upstream `Covers`).
///
/// Returns the uncovered tuples as single-value rules, in requested order.
pub fn covers(owner: &[PolicyRule], requested: &[PolicyRule]) -> (bool, Vec<PolicyRule>) {
    let uncovered: Vec<PolicyRule> = requested
        .iter()
        .flat_map(tuples)
        .filter(|&tuple| !owner.iter().any(|rule| tuple_covered(rule, tuple)))
        .map(Tuple::to_rule)
        .collect();
    (uncovered.is_empty(), uncovered)
}

/// Removes repeats, keeping first-appearance order.
fn dedup_keep_order(values: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(values.len());
    for value in values {
        if !out.contains(value) {
            out.push(value.clone());
        }
    }
    out
}

/// Deduplicated list, with "empty" spelled `None`.
fn normalise_list(values: &Option<Vec<String>>) -> Option<Vec<String>> {
    let out = dedup_keep_order(list(values));
    (!out.is_empty()).then_some(out)
}

/// Deduplicates every list of a rule and turns empty lists into `None`.
pub fn normalise(rule: &PolicyRule) -> PolicyRule {
    PolicyRule {
        api_groups: normalise_list(&rule.api_groups),
        non_resource_urls: normalise_list(&rule.non_resource_urls),
        resource_names: normalise_list(&rule.resource_names),
        resources: normalise_list(&rule.resources),
        verbs: dedup_keep_order(&rule.verbs),
    }
}

fn sorted_set(values: &[String]) -> Vec<String> {
    let mut out = values.to_vec();
    out.sort();
    out.dedup();
    out
}

/// Which rules may be merged by unioning one of their lists.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum MergeKey {
    /// No nonResourceURLs: same groups, verbs and names → union resources.
    Resource {
        groups: Vec<String>,
        verbs: Vec<String>,
        names: Vec<String>,
    },
    /// Only nonResourceURLs and verbs: same verbs → union URLs.
    NonResource { verbs: Vec<String> },
}

/// The merge bucket of a normalised rule; `None` for mixed rules (resource
/// fields and nonResourceURLs together), which are never merged.
fn merge_key(rule: &PolicyRule) -> Option<MergeKey> {
    let verbs = sorted_set(&rule.verbs);
    if rule.non_resource_urls.is_none() {
        return Some(MergeKey::Resource {
            groups: sorted_set(list(&rule.api_groups)),
            verbs,
            names: sorted_set(list(&rule.resource_names)),
        });
    }
    let url_only =
        rule.api_groups.is_none() && rule.resources.is_none() && rule.resource_names.is_none();
    url_only.then_some(MergeKey::NonResource { verbs })
}

/// Appends `extra`'s values missing from `target`, keeping order.
fn union_into(target: &mut Option<Vec<String>>, extra: &Option<Vec<String>>) {
    let mut merged = target.take().unwrap_or_default();
    for value in list(extra) {
        if !merged.contains(value) {
            merged.push(value.clone());
        }
    }
    *target = (!merged.is_empty()).then_some(merged);
}

/// Merges every rule into the first earlier rule with the same key.
/// Exact, because the unioned list is the only dimension that differs.
fn merge_rules(rules: Vec<PolicyRule>) -> Vec<PolicyRule> {
    let mut out: Vec<PolicyRule> = Vec::with_capacity(rules.len());
    // Key → index into `out`; a BTreeMap keeps everything deterministic.
    let mut slots: BTreeMap<MergeKey, usize> = BTreeMap::new();
    for rule in rules {
        let Some(key) = merge_key(&rule) else {
            out.push(rule);
            continue;
        };
        match (slots.get(&key), &key) {
            (Some(&i), MergeKey::Resource { .. }) => {
                union_into(&mut out[i].resources, &rule.resources);
            }
            (Some(&i), MergeKey::NonResource { .. }) => {
                union_into(&mut out[i].non_resource_urls, &rule.non_resource_urls);
            }
            (None, _) => {
                slots.insert(key, out.len());
                out.push(rule);
            }
        }
    }
    out
}

/// Whether the rule grants anything at all.
fn grants_something(rule: &PolicyRule) -> bool {
    !tuples(rule).is_empty()
}

/// Whether `rules[i]` is redundant: some other rule covers it, and either
/// it does not cover that rule back or that rule comes first.
fn is_redundant(rules: &[PolicyRule], i: usize) -> bool {
    // Rules that grant nothing are "covered" by anything; keep them so the
    // API server still gets to reject them instead of hiding the mistake.
    if !grants_something(&rules[i]) {
        return false;
    }
    rules.iter().enumerate().any(|(j, other)| {
        j != i && rule_covers(other, &rules[i]) && (j < i || !rule_covers(&rules[i], other))
    })
}

/// Semantic, deterministic de-duplication of a rule list.
///
/// 1. normalise each rule ([`normalise`]);
/// 2. merge resource rules with the same apiGroups, verbs and resourceNames
///    sets by unioning resources, and nonResourceURL-only rules with the
///    same verbs set by unioning URLs (first-appearance order);
/// 3. drop every rule covered by another single rule ([`rule_covers`]);
///    of two rules covering each other the earlier is kept. Rules that
///    grant nothing (no verbs, or resources without apiGroups) are kept.
///
/// The result allows exactly what the input allows, keeps first-appearance
/// order and is idempotent.
pub fn compact(rules: &[PolicyRule]) -> Vec<PolicyRule> {
    let merged = merge_rules(rules.iter().map(normalise).collect());
    (0..merged.len())
        .filter(|&i| !is_redundant(&merged, i))
        .map(|i| merged[i].clone())
        .collect()
}

/// Rules fit for a namespaced Role, whose API rejects nonResourceURLs:
/// nonResourceURL-only rules are dropped, mixed rules lose the field.
/// Every returned rule has `non_resource_urls == None`.
pub fn without_non_resource_urls(rules: &[PolicyRule]) -> Vec<PolicyRule> {
    rules
        .iter()
        .filter(|rule| {
            list(&rule.non_resource_urls).is_empty() || !list(&rule.resources).is_empty()
        })
        .map(|rule| PolicyRule {
            non_resource_urls: None,
            ..rule.clone()
        })
        .collect()
}

/// Go's `equality.Semantic.DeepEqual` for lists: nil equals empty.
fn same_list(a: &Option<Vec<String>>, b: &Option<Vec<String>>) -> bool {
    list(a) == list(b)
}

/// Exact rule equality as the aggregation controller sees it.
fn same_rule(a: &PolicyRule, b: &PolicyRule) -> bool {
    a.verbs == b.verbs
        && same_list(&a.api_groups, &b.api_groups)
        && same_list(&a.resources, &b.resources)
        && same_list(&a.resource_names, &b.resource_names)
        && same_list(&a.non_resource_urls, &b.non_resource_urls)
}

fn role_name(role: &ClusterRole) -> &str {
    role.metadata.name.as_deref().unwrap_or_default()
}

fn selectors(role: &ClusterRole) -> Option<&[LabelSelector]> {
    role.aggregation_rule
        .as_ref()
        .map(|rule| rule.cluster_role_selectors.as_deref().unwrap_or_default())
}

/// Checks every aggregation selector up front, so `aggregate` fails
/// before doing any work and matching can no longer fail.
fn validate_selectors(roles: &[ClusterRole]) -> Result<(), PolicyError> {
    for role in roles {
        for selector in selectors(role).unwrap_or_default() {
            selector::validate(selector).map_err(|source| {
                PolicyError::InvalidAggregationSelector {
                    role: role_name(role).to_owned(),
                    source,
                }
            })?;
        }
    }
    Ok(())
}

/// Indices of the roles `selector` picks for role `me`, sorted by name
/// (ties by input order); `me` itself is never picked.
fn selected_roles(roles: &[ClusterRole], me: usize, selector: &LabelSelector) -> Vec<usize> {
    let mut picked: Vec<usize> = (0..roles.len())
        .filter(|&i| i != me && role_name(&roles[i]) != role_name(&roles[me]))
        .filter(|&i| {
            // Selectors were validated, so an error cannot happen here.
            selector::matches_opt(selector, roles[i].metadata.labels.as_ref()).unwrap_or(false)
        })
        .collect();
    picked.sort_by(|&a, &b| role_name(&roles[a]).cmp(role_name(&roles[b])));
    picked
}

/// One controller sync of role `me`: the union of the selected roles'
/// current rules, per selector in name order, exact duplicates removed.
fn aggregated_rules(
    roles: &[ClusterRole],
    me: usize,
    selectors: &[LabelSelector],
) -> Vec<PolicyRule> {
    let mut out: Vec<PolicyRule> = Vec::new();
    for selector in selectors {
        for i in selected_roles(roles, me, selector) {
            for rule in roles[i].rules.as_deref().unwrap_or_default() {
                if !out.iter().any(|seen| same_rule(seen, rule)) {
                    out.push(rule.clone());
                }
            }
        }
    }
    out
}

/// Runs one sync of every aggregated role in input order, each seeing the
/// updates before it (as the real controller's sequential syncs do).
/// Returns whether anything changed.
fn aggregation_pass(roles: &mut [ClusterRole]) -> bool {
    let mut changed = false;
    for me in 0..roles.len() {
        let Some(sels) = selectors(&roles[me]) else {
            continue;
        };
        let fresh = Some(aggregated_rules(roles, me, sels));
        if roles[me].rules != fresh {
            roles[me].rules = fresh;
            changed = true;
        }
    }
    changed
}

/// Emulates the `ClusterRole` aggregation controller over a set of roles.
///
/// Every role with an `aggregationRule` gets as `rules` the union of the
/// rules of every *other* role matching any of its `clusterRoleSelectors`
/// (per selector, matched roles visited by name), exact duplicates removed
/// and no semantic merging. Its own prior `rules` are ignored, as the
/// controller overwrites them, and are always set to `Some` (possibly
/// empty). Aggregated roles selecting aggregated roles are iterated to a
/// fixpoint (at most `roles.len() + 1` passes); cycles resolve to the
/// least fixpoint. Other roles are returned unchanged, all in input order.
///
/// # Errors
///
/// [`PolicyError::InvalidAggregationSelector`], naming the role, when any
/// `clusterRoleSelectors` entry is invalid (see [`selector::validate`]).
pub fn aggregate(roles: &[ClusterRole]) -> Result<Vec<ClusterRole>, PolicyError> {
    validate_selectors(roles)?;
    let mut out = roles.to_vec();
    // Start aggregated roles empty so stale rules cannot feed themselves
    // back through a cycle of aggregated roles.
    for role in out
        .iter_mut()
        .filter(|role| role.aggregation_rule.is_some())
    {
        role.rules = Some(Vec::new());
    }
    for _ in 0..=roles.len() {
        if !aggregation_pass(&mut out) {
            break;
        }
    }
    Ok(out)
}

/// Verbs of resource requests: the API verbs and the special verbs of RBAC
/// (`bind`, `escalate`, `impersonate`), Pod Security (`use`) and
/// certificates (`approve`, `sign`, `attest`).
pub const RESOURCE_VERBS: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "escalate",
    "bind",
    "impersonate",
    "use",
    "approve",
    "sign",
    "attest",
];

/// Verbs of non-resource URL requests beyond those of resources.
pub const NON_RESOURCE_VERBS: &[&str] = &["post", "put", "head", "options"];

/// Every verb Kubernetes knows, without the wildcard.
pub fn known_verbs() -> impl Iterator<Item = &'static str> {
    RESOURCE_VERBS.iter().chain(NON_RESOURCE_VERBS).copied()
}

/// Whether Kubernetes knows `verb` (the wildcard `*` included).
pub fn is_known_verb(verb: &str) -> bool {
    verb == "*" || known_verbs().any(|v| v == verb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::rbac::v1::AggregationRule;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use pretty_assertions::assert_eq;

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    /// A resource rule.
    fn res(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
        PolicyRule {
            api_groups: Some(strings(groups)),
            resources: Some(strings(resources)),
            verbs: strings(verbs),
            ..PolicyRule::default()
        }
    }

    /// A resource rule restricted to resourceNames.
    fn named(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
        PolicyRule {
            resource_names: Some(strings(names)),
            ..res(groups, resources, verbs)
        }
    }

    /// A nonResourceURL rule.
    fn urls(urls: &[&str], verbs: &[&str]) -> PolicyRule {
        PolicyRule {
            non_resource_urls: Some(strings(urls)),
            verbs: strings(verbs),
            ..PolicyRule::default()
        }
    }

    fn assert_covers(
        owner: &[PolicyRule],
        requested: &[PolicyRule],
        covered: bool,
        uncovered: &[PolicyRule],
    ) {
        assert_eq!(covers(owner, requested), (covered, uncovered.to_vec()));
    }

    // ---- upstream policy_comparator_test.go cases ----

    #[test]
    fn covers_exact_match() {
        let rules = [res(&["v1"], &["builds"], &["get"])];
        assert_covers(&rules, &rules, true, &[]);
    }

    #[test]
    fn covers_subresource_wildcard() {
        assert_covers(
            &[res(&["v1"], &["*/scale"], &["get"])],
            &[res(&["v1"], &["foo/scale"], &["get"])],
            true,
            &[],
        );
    }

    #[test]
    fn covers_multiple_rules_covering_single_rule() {
        assert_covers(
            &[
                res(&["v1"], &["deployments"], &["delete"]),
                res(&["v1"], &["builds"], &["delete"]),
                res(&["v1"], &["builds", "deployments"], &["update"]),
            ],
            &[res(
                &["v1"],
                &["builds", "deployments"],
                &["delete", "update"],
            )],
            true,
            &[],
        );
    }

    fn per_group_rules() -> Vec<PolicyRule> {
        ["group1", "group2"]
            .iter()
            .flat_map(|g| {
                [
                    res(&[g], &["deployments"], &["delete"]),
                    res(&[g], &["builds"], &["delete"]),
                    res(&[g], &["builds", "deployments"], &["update"]),
                ]
            })
            .collect()
    }

    #[test]
    fn covers_multiple_api_groups_covering_single_rule() {
        assert_covers(
            &per_group_rules(),
            &[res(
                &["group1", "group2"],
                &["builds", "deployments"],
                &["delete", "update"],
            )],
            true,
            &[],
        );
    }

    #[test]
    fn covers_single_api_groups_covering_multiple() {
        assert_covers(
            &[res(
                &["group1", "group2"],
                &["builds", "deployments"],
                &["delete", "update"],
            )],
            &per_group_rules(),
            true,
            &[],
        );
    }

    #[test]
    fn covers_missing_single_verb_resource_combination() {
        assert_covers(
            &[
                res(&["v1"], &["builds", "deployments"], &["delete", "update"]),
                res(&["v1"], &["pods"], &["delete"]),
            ],
            &[res(
                &["v1"],
                &["builds", "deployments", "pods"],
                &["delete", "update"],
            )],
            false,
            &[res(&["v1"], &["pods"], &["update"])],
        );
    }

    #[test]
    fn covers_api_group_star() {
        let star = [res(&["*"], &["roles"], &["get"])];
        assert_covers(
            &star,
            &[res(&["group1", "group2"], &["roles"], &["get"])],
            true,
            &[],
        );
        assert_covers(&star, &star, true, &[]);
        // An enumeration never covers the wildcard itself.
        assert_covers(
            &[res(&["dummy-group"], &["roles"], &["get"])],
            &star,
            false,
            &star,
        );
    }

    #[test]
    fn covers_verb_star() {
        let star = [res(&["v1"], &["roles"], &["*"])];
        assert_covers(
            &star,
            &[res(&["v1"], &["roles"], &["watch", "list"])],
            true,
            &[],
        );
        assert_covers(&star, &star, true, &[]);
        let enumerated = [res(
            &["v1"],
            &["roles"],
            &["get", "list", "watch", "create", "update", "delete", "exec"],
        )];
        assert_covers(&enumerated, &star, false, &star);
    }

    #[test]
    fn covers_resource_star() {
        let star = [res(&["v1"], &["*"], &["get"])];
        assert_covers(
            &star,
            &[res(&["v1"], &["resourcegroup:deployments"], &["get"])],
            true,
            &[],
        );
        assert_covers(&star, &star, true, &[]);
        assert_covers(
            &[res(
                &["v1"],
                &["roles", "resourcegroup:deployments"],
                &["get"],
            )],
            &star,
            false,
            &star,
        );
    }

    #[test]
    fn covers_resource_name_empty_covering_names() {
        assert_covers(
            &[named(&["v1"], &["pods"], &["get"], &[])],
            &[named(&["v1"], &["pods"], &["get"], &["foo", "bar"])],
            true,
            &[],
        );
    }

    #[test]
    fn names_do_not_cover_name_less_request() {
        assert_covers(
            &[named(&["v1"], &["pods"], &["get"], &["foo", "bar"])],
            &[named(&["v1"], &["pods"], &["get"], &[])],
            false,
            &[res(&["v1"], &["pods"], &["get"])],
        );
    }

    #[test]
    fn covers_non_resource_urls() {
        let apis = [urls(&["/apis"], &["*"])];
        assert_covers(&apis, &apis, true, &[]);
        assert_covers(
            &[urls(&["*"], &["*"])],
            &[urls(&["/apis", "/apis/v1", "/"], &["*"])],
            true,
            &[],
        );
    }

    #[test]
    fn covers_non_resource_url_star_after_prefix() {
        let owner = [urls(&["/apis/*"], &["*"])];
        assert_covers(
            &owner,
            &[urls(&["/apis", "/apis/v1"], &["get"])],
            false,
            &[urls(&["/apis"], &["get"])],
        );
        assert_covers(
            &owner,
            &[urls(&["/apis/v1/foo", "/apis/v1"], &["get"])],
            true,
            &[],
        );
    }

    #[test]
    fn covers_non_resource_urls_with_other_fields() {
        let mixed = PolicyRule {
            non_resource_urls: Some(strings(&["/apis"])),
            ..res(&["v1"], &["builds"], &["get"])
        };
        assert_covers(
            std::slice::from_ref(&mixed),
            std::slice::from_ref(&mixed),
            true,
            &[],
        );
        assert_covers(
            &[res(&["v1"], &["builds"], &["get"])],
            &[mixed],
            false,
            &[urls(&["/apis"], &["get"])],
        );
    }

    #[test]
    fn non_resource_url_covers_table() {
        let cases = [
            ("*", "", true),
            ("*", "/", true),
            ("*", "/api", true),
            ("/*", "", false),
            ("/*", "/", true),
            ("/*", "/foo", true),
            ("/api", "/api", true),
            ("/apis", "/api", false),
            ("/api/v1", "/api", false),
            ("/api/v1", "/api/v1", true),
            ("/api/*", "/api/v1", true),
            ("/api/*", "/api", false),
            ("/api/*/*", "/api/v1", false),
            ("/*/v1/*", "/api/v1", false),
        ];
        for (owner, requested, want) in cases {
            assert_eq!(
                non_resource_url_covers(owner, requested),
                want,
                "owner {owner:?} requested {requested:?}"
            );
        }
    }

    // ---- further semantics ----

    #[test]
    fn resource_wildcard_covers_subresources() {
        assert!(rule_covers(
            &res(&[""], &["*"], &["get"]),
            &res(&[""], &["pods/log", "pods"], &["get"])
        ));
    }

    #[test]
    fn subresource_star_prefix_is_not_a_wildcard() {
        let owner = res(&[""], &["pods/*"], &["get"]);
        assert!(!rule_covers(&owner, &res(&[""], &["pods/log"], &["get"])));
        assert!(!rule_covers(&owner, &res(&[""], &["pods"], &["get"])));
        // It only covers the literal string.
        assert!(rule_covers(&owner, &res(&[""], &["pods/*"], &["get"])));
    }

    #[test]
    fn star_subresource_covers_only_that_subresource() {
        let owner = res(&[""], &["*/status"], &["get"]);
        assert!(rule_covers(&owner, &res(&[""], &["pods/status"], &["get"])));
        assert!(rule_covers(
            &owner,
            &res(&[""], &["nodes/status"], &["get"])
        ));
        assert!(!rule_covers(&owner, &res(&[""], &["pods"], &["get"])));
        assert!(!rule_covers(&owner, &res(&[""], &["pods/log"], &["get"])));
    }

    #[test]
    fn no_group_aliases() {
        let core = res(&[""], &["pods"], &["get"]);
        assert!(!rule_covers(&core, &res(&["core"], &["pods"], &["get"])));
        assert!(!rule_covers(&core, &res(&["apps"], &["pods"], &["get"])));
    }

    #[test]
    fn names_must_be_listed() {
        let owner = named(&[""], &["secrets"], &["get"], &["a", "b"]);
        assert!(rule_covers(
            &owner,
            &named(&[""], &["secrets"], &["get"], &["b"])
        ));
        assert!(!rule_covers(
            &owner,
            &named(&[""], &["secrets"], &["get"], &["b", "c"])
        ));
        assert_eq!(
            covers(&[owner], &[named(&[""], &["secrets"], &["get"], &["c"])]),
            (false, vec![named(&[""], &["secrets"], &["get"], &["c"])])
        );
    }

    #[test]
    fn named_owner_does_not_cover_urls() {
        // Upstream: URL tuples carry no name, so the owner must have none.
        let owner = PolicyRule {
            resource_names: Some(strings(&["x"])),
            ..urls(&["/healthz"], &["get"])
        };
        assert!(!rule_covers(&owner, &urls(&["/healthz"], &["get"])));
    }

    #[test]
    fn rule_covers_needs_one_rule_for_all_tuples() {
        let owner = res(
            &["apps"],
            &["deployments", "statefulsets"],
            &["get", "list"],
        );
        assert!(rule_covers(
            &owner,
            &res(&["apps"], &["deployments"], &["list", "get"])
        ));
        assert!(!rule_covers(
            &owner,
            &res(&["apps"], &["deployments"], &["get", "watch"])
        ));
    }

    #[test]
    fn empty_request_is_covered() {
        let nothing = PolicyRule {
            verbs: vec![],
            ..res(&[""], &["pods"], &[])
        };
        assert!(rule_covers(&urls(&["/x"], &["get"]), &nothing));
        assert_eq!(covers(&[], &[nothing]), (true, vec![]));
        assert_eq!(covers(&[], &[]), (true, vec![]));
    }

    #[test]
    fn breakdown_yields_single_value_rules() {
        let rule = PolicyRule {
            non_resource_urls: Some(strings(&["/x"])),
            ..named(&["a"], &["r1", "r2"], &["get"], &["n"])
        };
        assert_eq!(
            breakdown(&rule),
            vec![
                named(&["a"], &["r1"], &["get"], &["n"]),
                named(&["a"], &["r2"], &["get"], &["n"]),
                urls(&["/x"], &["get"]),
            ]
        );
    }

    // ---- compact ----

    #[test]
    fn compact_drops_rule_covered_by_another() {
        let broad = res(&[""], &["pods"], &["get", "list"]);
        let narrow = res(&[""], &["pods"], &["get"]);
        assert_eq!(
            compact(&[broad.clone(), narrow.clone()]),
            vec![broad.clone()]
        );
        // The covering rule keeps its own position.
        let all = res(&["*"], &["*"], &["*"]);
        assert_eq!(
            compact(&[narrow, urls(&["/x"], &["get"]), all.clone()]),
            vec![urls(&["/x"], &["get"]), all]
        );
    }

    #[test]
    fn compact_keeps_earlier_of_mutually_covering_rules() {
        // Different groups sets (so not merged) but equivalent thanks to `*`.
        let a = res(&["*"], &["pods"], &["get"]);
        let b = res(&["*", "apps"], &["pods"], &["get"]);
        assert_eq!(compact(&[a.clone(), b.clone()]), vec![a.clone()]);
        assert_eq!(compact(&[b.clone(), a]), vec![b]);
    }

    #[test]
    fn compact_merges_resources_of_same_groups_and_verbs() {
        let rules = [
            res(&[""], &["pods"], &["get", "list"]),
            res(&["apps"], &["deployments"], &["get"]),
            res(&[""], &["secrets"], &["list", "get"]),
            res(&[""], &["pods", "configmaps"], &["get", "list", "get"]),
        ];
        assert_eq!(
            compact(&rules),
            vec![
                res(&[""], &["pods", "secrets", "configmaps"], &["get", "list"]),
                res(&["apps"], &["deployments"], &["get"]),
            ]
        );
    }

    #[test]
    fn compact_does_not_merge_named_with_name_less() {
        let plain = res(&[""], &["pods"], &["get"]);
        let secret = named(&[""], &["secrets"], &["get"], &["token"]);
        assert_eq!(
            compact(&[plain.clone(), secret.clone()]),
            vec![plain.clone(), secret.clone()]
        );
        // Same names set does merge.
        let cm = named(&[""], &["configmaps"], &["get"], &["token"]);
        assert_eq!(
            compact(&[secret, plain, cm]),
            vec![
                named(&[""], &["secrets", "configmaps"], &["get"], &["token"]),
                res(&[""], &["pods"], &["get"]),
            ]
        );
    }

    #[test]
    fn compact_drops_named_rule_covered_by_name_less() {
        let secret = named(&[""], &["secrets"], &["get"], &["token"]);
        let all_secrets = res(&[""], &["secrets"], &["get", "list"]);
        assert_eq!(compact(&[secret, all_secrets.clone()]), vec![all_secrets]);
    }

    #[test]
    fn compact_merges_and_covers_non_resource_urls() {
        let rules = [
            urls(&["/healthz"], &["get"]),
            urls(&["/metrics"], &["get"]),
            urls(&["/api/v1"], &["get", "post"]),
            urls(&["/api/*"], &["*"]),
            urls(&["/livez", "/healthz"], &["get"]),
        ];
        assert_eq!(
            compact(&rules),
            vec![
                urls(&["/healthz", "/metrics", "/livez"], &["get"]),
                urls(&["/api/*"], &["*"]),
            ]
        );
    }

    #[test]
    fn compact_normalises_lists() {
        let messy = PolicyRule {
            api_groups: Some(strings(&["", ""])),
            resources: Some(strings(&["pods", "pods"])),
            verbs: strings(&["get", "get"]),
            resource_names: Some(vec![]),
            non_resource_urls: Some(vec![]),
        };
        assert_eq!(compact(&[messy]), vec![res(&[""], &["pods"], &["get"])]);
    }

    #[test]
    fn compact_keeps_mixed_rules_unmerged() {
        let mixed = PolicyRule {
            non_resource_urls: Some(strings(&["/x"])),
            ..res(&[""], &["pods"], &["get"])
        };
        let plain = res(&[""], &["secrets"], &["get"]);
        assert_eq!(compact(&[mixed.clone(), plain.clone()]), vec![mixed, plain]);
    }

    #[test]
    fn compact_keeps_rules_that_grant_nothing() {
        let no_verbs = res(&[""], &["pods"], &[]);
        let broad = res(&["*"], &["*"], &["*"]);
        assert_eq!(
            compact(&[broad.clone(), no_verbs.clone()]),
            vec![broad, no_verbs]
        );
    }

    fn sample_rule_sets() -> Vec<Vec<PolicyRule>> {
        vec![
            vec![],
            vec![
                res(&[""], &["pods"], &["get"]),
                res(&[""], &["pods/log"], &["get"]),
                res(&[""], &["*/log"], &["get"]),
                res(&["", "apps"], &["pods"], &["get", "list"]),
                named(&[""], &["secrets"], &["get"], &["a", "b", "a"]),
                named(&[""], &["secrets"], &["get"], &["b"]),
                urls(&["/metrics"], &["get"]),
                urls(&["/metrics", "/*"], &["get"]),
            ],
            vec![
                res(&["*"], &["deployments"], &["*"]),
                res(&["apps", "*"], &["deployments"], &["*", "get"]),
                res(&["apps"], &["deployments", "replicasets"], &["get"]),
                res(&["apps"], &["statefulsets"], &["get"]),
                res(&["batch"], &["jobs"], &["create"]),
                res(&["batch"], &["cronjobs"], &["create"]),
                res(&["batch"], &["jobs"], &["create", "delete"]),
                urls(&["/healthz"], &["get"]),
            ],
            vec![
                res(&["apps"], &["deployments"], &["get", "list", "watch"]),
                res(&["apps"], &["*"], &["get", "list", "watch"]),
                res(&["apps"], &["daemonsets"], &["watch", "list", "get"]),
                PolicyRule {
                    non_resource_urls: Some(strings(&["/version"])),
                    ..res(&[""], &["nodes"], &["get"])
                },
            ],
        ]
    }

    #[test]
    fn compact_is_idempotent_and_deterministic() {
        for rules in sample_rule_sets() {
            let once = compact(&rules);
            assert_eq!(compact(&once), once);
            assert_eq!(compact(&rules), once);
        }
    }

    #[test]
    fn compact_preserves_permissions() {
        for rules in sample_rule_sets() {
            let compacted = compact(&rules);
            assert_eq!(covers(&compacted, &rules), (true, vec![]));
            assert_eq!(covers(&rules, &compacted), (true, vec![]));
            assert!(compacted.len() <= rules.len());
        }
    }

    // ---- without_non_resource_urls ----

    #[test]
    fn without_non_resource_urls_drops_and_strips() {
        let mixed = PolicyRule {
            non_resource_urls: Some(strings(&["/x"])),
            ..res(&[""], &["pods"], &["get"])
        };
        let empty_urls = PolicyRule {
            non_resource_urls: Some(vec![]),
            ..res(&[""], &["secrets"], &["get"])
        };
        let rules = [
            urls(&["/healthz"], &["get"]),
            mixed,
            res(&["apps"], &["deployments"], &["list"]),
            empty_urls,
        ];
        assert_eq!(
            without_non_resource_urls(&rules),
            vec![
                res(&[""], &["pods"], &["get"]),
                res(&["apps"], &["deployments"], &["list"]),
                res(&[""], &["secrets"], &["get"]),
            ]
        );
    }

    // ---- aggregate ----

    fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    fn leaf(name: &str, label: (&str, &str), rules: Vec<PolicyRule>) -> ClusterRole {
        ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: labels(&[label]),
                ..ObjectMeta::default()
            },
            rules: Some(rules),
            aggregation_rule: None,
        }
    }

    fn select(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: labels(pairs),
            match_expressions: None,
        }
    }

    fn aggregator(name: &str, selectors: Option<Vec<LabelSelector>>) -> ClusterRole {
        ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            rules: None,
            aggregation_rule: Some(AggregationRule {
                cluster_role_selectors: selectors,
            }),
        }
    }

    fn rules_of(roles: &[ClusterRole], name: &str) -> Option<Vec<PolicyRule>> {
        roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))
            .and_then(|r| r.rules.clone())
    }

    fn aggregated(roles: &[ClusterRole]) -> Vec<ClusterRole> {
        match aggregate(roles) {
            Ok(out) => out,
            Err(err) => panic!("aggregate failed: {err}"),
        }
    }

    #[test]
    fn aggregate_unions_in_name_order() {
        let zeta = res(&[""], &["pods"], &["get"]);
        let alpha = res(&[""], &["secrets"], &["get"]);
        let roles = [
            aggregator("view", Some(vec![select(&[("agg", "view")])])),
            leaf("zeta", ("agg", "view"), vec![zeta.clone()]),
            leaf("alpha", ("agg", "view"), vec![alpha.clone()]),
            leaf("other", ("agg", "edit"), vec![res(&["*"], &["*"], &["*"])]),
        ];
        let out = aggregated(&roles);
        assert_eq!(rules_of(&out, "view"), Some(vec![alpha, zeta]));
        // Everything else is untouched, order preserved.
        assert_eq!(out[1..], roles[1..]);
        assert_eq!(out.len(), roles.len());
    }

    #[test]
    fn aggregate_visits_selectors_in_order() {
        let a = res(&[""], &["a"], &["get"]);
        let b = res(&[""], &["b"], &["get"]);
        let roles = [
            aggregator(
                "agg",
                Some(vec![select(&[("k", "second")]), select(&[("k", "first")])]),
            ),
            leaf("a", ("k", "first"), vec![a.clone()]),
            leaf("b", ("k", "second"), vec![b.clone()]),
        ];
        assert_eq!(rules_of(&aggregated(&roles), "agg"), Some(vec![b, a]));
    }

    #[test]
    fn aggregate_removes_exact_duplicates_only() {
        let get_pods = res(&[""], &["pods"], &["get"]);
        let same_with_empty_names = named(&[""], &["pods"], &["get"], &[]);
        let reordered = res(&[""], &["pods", "secrets"], &["get"]);
        let reordered_2 = res(&[""], &["secrets", "pods"], &["get"]);
        let roles = [
            leaf("a", ("agg", "x"), vec![get_pods.clone(), reordered.clone()]),
            leaf(
                "b",
                ("agg", "x"),
                vec![same_with_empty_names, reordered_2.clone()],
            ),
            aggregator("x", Some(vec![select(&[("agg", "x")])])),
        ];
        assert_eq!(
            rules_of(&aggregated(&roles), "x"),
            Some(vec![get_pods, reordered, reordered_2])
        );
    }

    #[test]
    fn aggregate_reaches_fixpoint_through_two_levels() {
        let leaf_rule = res(&["apps"], &["deployments"], &["get"]);
        let own = res(&[""], &["configmaps"], &["list"]);
        let mut middle = aggregator("middle", Some(vec![select(&[("agg", "middle")])]));
        middle.metadata.labels = labels(&[("agg", "top")]);
        // Stale rules on aggregated roles are replaced.
        middle.rules = Some(vec![res(&["stale"], &["stale"], &["stale"])]);
        let roles = [
            aggregator("top", Some(vec![select(&[("agg", "top")])])),
            middle,
            leaf("direct", ("agg", "top"), vec![own.clone()]),
            leaf("leaf", ("agg", "middle"), vec![leaf_rule.clone()]),
        ];
        let out = aggregated(&roles);
        assert_eq!(rules_of(&out, "middle"), Some(vec![leaf_rule.clone()]));
        assert_eq!(rules_of(&out, "top"), Some(vec![own, leaf_rule]));
        assert_eq!(aggregated(&out), out);
    }

    #[test]
    fn aggregate_cycle_gets_least_fixpoint() {
        let a_rule = res(&[""], &["a"], &["get"]);
        let b_rule = res(&[""], &["b"], &["get"]);
        let mut a = aggregator("a", Some(vec![select(&[("to", "a")])]));
        a.metadata.labels = labels(&[("to", "b")]);
        a.rules = Some(vec![res(&["stale"], &["stale"], &["stale"])]);
        let mut b = aggregator("b", Some(vec![select(&[("to", "b")])]));
        b.metadata.labels = labels(&[("to", "a")]);
        let roles = [
            a,
            b,
            leaf("la", ("to", "a"), vec![a_rule.clone()]),
            leaf("lb", ("to", "b"), vec![b_rule.clone()]),
        ];
        let out = aggregated(&roles);
        for name in ["a", "b"] {
            let mut got = rules_of(&out, name).unwrap_or_default();
            got.sort_by_key(|r| r.resources.clone());
            assert_eq!(got, vec![a_rule.clone(), b_rule.clone()], "role {name}");
        }
    }

    #[test]
    fn aggregate_excludes_self() {
        let mut agg = aggregator("self", Some(vec![select(&[("agg", "x")])]));
        agg.metadata.labels = labels(&[("agg", "x")]);
        let other = res(&[""], &["pods"], &["get"]);
        let roles = [agg, leaf("other", ("agg", "x"), vec![other.clone()])];
        assert_eq!(rules_of(&aggregated(&roles), "self"), Some(vec![other]));
    }

    #[test]
    fn aggregate_with_no_selectors_aggregates_nothing() {
        let roles = [
            aggregator("none", None),
            aggregator("empty", Some(vec![])),
            leaf("l", ("agg", "x"), vec![res(&[""], &["pods"], &["get"])]),
        ];
        let out = aggregated(&roles);
        assert_eq!(rules_of(&out, "none"), Some(vec![]));
        assert_eq!(rules_of(&out, "empty"), Some(vec![]));
    }

    #[test]
    fn aggregate_empty_selector_selects_every_other_role() {
        let pods = res(&[""], &["pods"], &["get"]);
        let roles = [
            aggregator("all", Some(vec![LabelSelector::default()])),
            leaf("l", ("any", "thing"), vec![pods.clone()]),
        ];
        assert_eq!(rules_of(&aggregated(&roles), "all"), Some(vec![pods]));
    }

    #[test]
    fn aggregate_rejects_invalid_selector_naming_role() {
        let bad = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "agg".to_owned(),
                    operator: "In".to_owned(),
                    values: None,
                },
            ]),
        };
        let roles = [aggregator("broken", Some(vec![bad]))];
        let err = aggregate(&roles).err();
        assert_eq!(
            err,
            Some(PolicyError::InvalidAggregationSelector {
                role: "broken".to_owned(),
                source: SelectorError::MissingValues {
                    key: "agg".to_owned(),
                    operator: "In".to_owned(),
                },
            })
        );
        let message = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("\"broken\""), "{message}");
    }
}

/// The default denials, each switched off by its own flag. All `false`
/// (every denial active) by default.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Waivers {
    /// Kept so that existing settings still parse; allows nothing: an
    /// object named `system:*` is protected, refused whatever the flags.
    #[arg(long = "allow-system-names", env = "RBAC_RULES_ALLOW_SYSTEM_NAMES")]
    pub system_names: bool,
    /// Allow bindings to `cluster-admin` and to `system:*` roles.
    #[arg(
        long = "allow-cluster-admin-bindings",
        env = "RBAC_RULES_ALLOW_CLUSTER_ADMIN_BINDINGS"
    )]
    pub cluster_admin_bindings: bool,
    /// Allow grants of `escalate` and `bind` on roles and of `impersonate`.
    #[arg(
        long = "allow-escalation-verbs",
        env = "RBAC_RULES_ALLOW_ESCALATION_VERBS"
    )]
    pub escalation_verbs: bool,
    /// Allow `*` verbs on `*` resources in `*` API groups (cluster-admin).
    #[arg(long = "allow-wildcard-all", env = "RBAC_RULES_ALLOW_WILDCARD_ALL")]
    pub wildcard_all: bool,
    /// Allow bindings to everyone: the groups `system:authenticated`,
    /// `system:unauthenticated`, `system:serviceaccounts` and the user
    /// `system:anonymous`.
    #[arg(
        long = "allow-everyone-bindings",
        env = "RBAC_RULES_ALLOW_EVERYONE_BINDINGS"
    )]
    pub everyone_bindings: bool,
}

/// Names Kubernetes reserves for its own roles and bindings.
pub fn is_system_name(name: &str) -> bool {
    name.starts_with("system:")
}

/// The subjects that name everyone, or every workload: every request,
/// authenticated or not, or every ServiceAccount of the cluster. By name,
/// for a `User` or a `Group` subject.
const EVERYONE: &[&str] = &[
    "system:authenticated",
    "system:unauthenticated",
    "system:anonymous",
    "system:serviceaccounts",
];

/// Whether a subject of `kind` named `name` is everyone ([`EVERYONE`]):
/// refused by default whatever wrote it ([`Waivers::everyone_bindings`]).
pub fn is_everyone(kind: &str, name: &str) -> bool {
    matches!(kind, "User" | "Group") && EVERYONE.contains(&name)
}

/// Whether a `User` or `Group` subject named `name` is one Kubernetes
/// reserves (`system:`): a rule may write one literally, but a value from
/// data never names one (ServiceAccount subjects are named without it).
pub fn is_system_subject(kind: &str, name: &str) -> bool {
    matches!(kind, "User" | "Group") && is_system_name(name)
}

/// The controller's own name: its ClusterRoles, bindings, leader-election
/// Role and allow-list are named this or `rbac-rules:*`
/// (deploy/controller/rbac.yaml, allow-list.yaml).
pub const CONTROLLER_NAME: &str = "rbac-rules";

/// The label Kubernetes puts on its bootstrap RBAC objects, and its value.
pub const BOOTSTRAP_LABEL: (&str, &str) = ("kubernetes.io/bootstrapping", "rbac-defaults");

/// Kubernetes' bootstrap ClusterRoles (and the ClusterRoleBinding
/// `cluster-admin`) without a `system:` name.
const BOOTSTRAP_NAMES: &[&str] = &["cluster-admin", "admin", "edit", "view"];

/// Label keys by which Kubernetes' bootstrap roles aggregate into each
/// other (`admin` ← `edit` ← `view`).
const BOOTSTRAP_AGGREGATION_LABELS: &[&str] = &[
    "rbac.authorization.k8s.io/aggregate-to-admin",
    "rbac.authorization.k8s.io/aggregate-to-edit",
    "rbac.authorization.k8s.io/aggregate-to-view",
];

/// Why an RBAC object of `kind` named `name` is protected: never emitted,
/// adopted, aggregated, revoked or pruned, whatever the input and the
/// flags. Kubernetes' bootstrap objects (`system:*`, and the ClusterRoles
/// `cluster-admin`, `admin`, `edit`, `view`) and the controller's own
/// ([`CONTROLLER_NAME`], `rbac-rules:*`). By name only; see
/// [`protected_by_labels`] for the bootstrap label.
pub fn protected_name(kind: &str, name: &str) -> Option<&'static str> {
    if is_system_name(name) {
        return Some("a name Kubernetes reserves for itself (system:)");
    }
    let cluster_scoped = matches!(kind, "ClusterRole" | "ClusterRoleBinding");
    if cluster_scoped && BOOTSTRAP_NAMES.contains(&name) {
        return Some("one of Kubernetes' bootstrap RBAC objects");
    }
    if name == CONTROLLER_NAME
        || name
            .strip_prefix(CONTROLLER_NAME)
            .is_some_and(|rest| rest.starts_with(':'))
    {
        return Some("one of the controller's own RBAC objects (rbac-rules, rbac-rules:*)");
    }
    None
}

/// Why an object whose label `kubernetes.io/bootstrapping` is `value` is
/// protected: Kubernetes made it (see [`protected_name`]).
pub fn protected_by_labels(bootstrapping: Option<&str>) -> Option<&'static str> {
    (bootstrapping == Some(BOOTSTRAP_LABEL.1)).then_some(
        "one of Kubernetes' bootstrap RBAC objects (kubernetes.io/bootstrapping: rbac-defaults)",
    )
}

/// Why an RBAC object is protected, by kind, name and labels (read through
/// `label`): [`protected_name`], then [`protected_by_labels`].
pub fn protected_object<'l>(
    kind: &str,
    name: &str,
    label: impl Fn(&str) -> Option<&'l str>,
) -> Option<&'static str> {
    protected_name(kind, name).or_else(|| protected_by_labels(label(BOOTSTRAP_LABEL.0)))
}

/// The labels protected ClusterRoles carry (those Kubernetes and
/// deploy/controller give them): an aggregation selector that matches one
/// of these sets would aggregate a protected role, whether or not the
/// role exists where the selector is judged (offline, say).
pub fn protected_label_sets() -> Vec<BTreeMap<String, String>> {
    let set = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let mut out = vec![
        set(&[BOOTSTRAP_LABEL]),
        set(&[("app.kubernetes.io/name", CONTROLLER_NAME)]),
        set(&[
            ("app.kubernetes.io/name", CONTROLLER_NAME),
            ("app.kubernetes.io/part-of", CONTROLLER_NAME),
            ("rbacrules.io/aggregate-to-controller", "true"),
        ]),
    ];
    for key in BOOTSTRAP_AGGREGATION_LABELS {
        out.push(set(&[BOOTSTRAP_LABEL, (key, "true")]));
    }
    out
}

/// Prefixes of the label keys protected objects are installed with (by
/// Kubernetes, by deploy/ or its Helm chart): a selector that picks a
/// protected role by these picks it by what it is; by any other label, by
/// what someone added to it.
const INSTALLED_LABEL_PREFIXES: &[&str] = &[
    "kubernetes.io/",
    "rbac.authorization.k8s.io/",
    "app.kubernetes.io/",
    "helm.sh/",
    "rbacrules.io/",
];

/// Whether any of these (validated) aggregation selectors selects a
/// protected role by the labels it was installed with (see
/// [`INSTALLED_LABEL_PREFIXES`]), given its labels.
pub fn selects_by_installed_labels<'l>(
    selectors: &[LabelSelector],
    labels: impl Iterator<Item = (&'l str, &'l str)>,
) -> bool {
    let installed: BTreeMap<String, String> = labels
        .filter(|(k, _)| INSTALLED_LABEL_PREFIXES.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    selectors
        .iter()
        .any(|s| crate::selector::matches_map(s, &installed))
}

/// Whether any of these (validated) aggregation selectors would select a
/// protected ClusterRole by the labels those carry
/// ([`protected_label_sets`]): an empty selector, the bootstrap label, the
/// bootstrap roles' aggregation labels, the controller's labels.
pub fn selects_protected_labels(selectors: &[LabelSelector]) -> bool {
    let sets = protected_label_sets();
    selectors.iter().any(|s| {
        sets.iter()
            .any(|labels| crate::selector::matches_map(s, labels))
    })
}

/// A permission that, once granted, lets the holder grant more than it
/// has: `(group, resource, verb)`; a resource ending in `/` is a prefix.
const ESCALATING: &[(&str, &str, &str)] = &[
    ("rbac.authorization.k8s.io", "roles", "escalate"),
    ("rbac.authorization.k8s.io", "clusterroles", "escalate"),
    ("rbac.authorization.k8s.io", "roles", "bind"),
    ("rbac.authorization.k8s.io", "clusterroles", "bind"),
    ("", "users", "impersonate"),
    ("", "groups", "impersonate"),
    ("", "serviceaccounts", "impersonate"),
    ("authentication.k8s.io", "userextras/", "impersonate"),
    ("authentication.k8s.io", "uids", "impersonate"),
];

/// Whether a resource entry of a granted rule reaches `target` (a prefix
/// when it ends in `/`), with RBAC's `*` and `*/sub` wildcards.
fn resource_reaches(entry: &str, target: &str) -> bool {
    if entry == ALL || entry == target {
        return true;
    }
    match target.strip_suffix('/') {
        Some(prefix) => {
            entry
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('/'))
                || entry.starts_with("*/")
        }
        None => false,
    }
}

/// Compact form of a permission: `[group] resource: verb`.
fn compact_permission(group: &str, resource: &str, verb: &str) -> String {
    let group = if group.is_empty() { "\"\"" } else { group };
    format!("[{group}] {resource}: {verb}")
}

/// The escalating permissions (escalate/bind on roles, impersonate) that
/// `rules` grant, judged as RBAC does (`*` counts), in compact form.
pub fn escalating_grants(rules: &[PolicyRule]) -> Vec<String> {
    let mut out = Vec::new();
    for rule in rules {
        for &(group, resource, verb) in ESCALATING {
            if !value_covered(&rule.verbs, verb) || !value_covered(list(&rule.api_groups), group) {
                continue;
            }
            for entry in list(&rule.resources) {
                if resource_reaches(entry, resource) {
                    let shown = if resource.ends_with('/') {
                        entry.as_str()
                    } else {
                        resource
                    };
                    let p = compact_permission(group, shown, verb);
                    if !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
    }
    out
}

/// Whether a rule is cluster-admin's: `*` verbs on `*` resources in `*`
/// API groups (`*` within a named group is not).
pub fn is_wildcard_all(rule: &PolicyRule) -> bool {
    has(&rule.verbs, ALL) && has(list(&rule.api_groups), ALL) && has(list(&rule.resources), ALL)
}

/// Compact form of a rule for messages: `[groups] resources: verbs`.
pub fn describe(rule: &PolicyRule) -> String {
    if let Some(urls) = rule.non_resource_urls.as_ref().filter(|u| !u.is_empty()) {
        return format!("{}: {}", urls.join(","), rule.verbs.join(","));
    }
    // The core group is written `""`, as in YAML: `[]` would read as none.
    let groups: Vec<&str> = list(&rule.api_groups)
        .iter()
        .map(|g| if g.is_empty() { "\"\"" } else { g.as_str() })
        .collect();
    let mut s = format!("[{}] {}", groups.join(","), list(&rule.resources).join(","));
    if let Some(names) = rule.resource_names.as_ref().filter(|n| !n.is_empty()) {
        s.push_str(&format!(" (names {})", names.join(",")));
    }
    s.push_str(&format!(": {}", rule.verbs.join(",")));
    s
}

/// Every rule of `rules` in compact form, those differing only in verbs
/// merged, preceded by how many there are when more than one: a refusal
/// names everything it refuses.
pub fn describe_all(rules: &[PolicyRule]) -> String {
    let mut merged: Vec<PolicyRule> = Vec::new();
    for r in rules {
        match merged.iter_mut().find(|m| {
            m.api_groups == r.api_groups
                && m.resources == r.resources
                && m.resource_names == r.resource_names
                && m.non_resource_urls == r.non_resource_urls
        }) {
            Some(m) => {
                for v in &r.verbs {
                    if !m.verbs.contains(v) {
                        m.verbs.push(v.clone());
                    }
                }
            }
            None => merged.push(r.clone()),
        }
    }
    let text: Vec<String> = merged.iter().map(describe).collect();
    match rules.len() {
        0 | 1 => text.join("; "),
        n => format!("{n} grants: {}", text.join("; ")),
    }
}

/// Why `rules` (what an object grants) breaks a default denial, in compact
/// form; empty when they pass.
pub fn denied_grants(rules: &[PolicyRule], waivers: &Waivers) -> Vec<String> {
    let mut out = Vec::new();
    if !waivers.wildcard_all {
        out.extend(
            rules
                .iter()
                .filter(|r| is_wildcard_all(r))
                .map(|r| format!("{} (cluster-admin equivalent)", describe(r))),
        );
    }
    if !waivers.escalation_verbs {
        out.extend(escalating_grants(rules));
    }
    out
}

/// An API group that only a CustomResourceDefinition can define: a DNS
/// subdomain with a dot, not a Kubernetes group (`*.k8s.io`,
/// `*.kubernetes.io`). The same test as the rule language's
/// `format: customGroup`.
pub fn is_custom_group(group: &str) -> bool {
    crate::engine::format::is_custom_group(group)
}

/// Annotation on the allow-list ClusterRole that lets grants on custom
/// (CRD) API groups pass.
pub const ALLOW_CUSTOM_GROUPS_ANNOTATION: &str = "rbacrules.io/allow-custom-groups";

/// The allow-list: a ClusterRole's rules, or, when it is aggregated, the
/// rules of the ClusterRoles its selectors pick.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AllowList {
    /// The role's own rules (ignored when `selectors` is not empty).
    pub rules: Vec<PolicyRule>,
    /// The role's `aggregationRule` selectors: its effective rules are
    /// those of the roles they select, and no output may carry labels
    /// they select.
    pub selectors: Vec<LabelSelector>,
    /// Grants whose API groups are all custom groups pass
    /// ([`ALLOW_CUSTOM_GROUPS_ANNOTATION`]).
    pub custom_groups: bool,
}

impl AllowList {
    /// The allow-list a ClusterRole describes.
    pub fn from_cluster_role(role: &ClusterRole) -> AllowList {
        AllowList {
            rules: role.rules.clone().unwrap_or_default(),
            selectors: selectors(role).map(<[_]>::to_vec).unwrap_or_default(),
            custom_groups: role
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ALLOW_CUSTOM_GROUPS_ANNOTATION))
                .is_some_and(|v| v == "true"),
        }
    }

    /// Whether the allow-list is aggregated.
    pub fn is_aggregated(&self) -> bool {
        !self.selectors.is_empty()
    }

    /// The tuples of `requested` that `effective` (the allow-list's rules)
    /// does not cover, as single-value rules; with `custom_groups`, a tuple
    /// in a custom API group passes.
    pub fn uncovered(&self, effective: &[PolicyRule], requested: &[PolicyRule]) -> Vec<PolicyRule> {
        let (_, missing) = covers(effective, requested);
        missing
            .into_iter()
            .filter(|r| {
                !(self.custom_groups
                    && r.non_resource_urls.is_none()
                    && list(&r.api_groups).iter().all(|g| is_custom_group(g)))
            })
            .collect()
    }
}

#[cfg(test)]
mod denial_tests {
    use super::*;

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
        PolicyRule {
            api_groups: Some(groups.iter().map(|s| s.to_string()).collect()),
            resources: Some(resources.iter().map(|s| s.to_string()).collect()),
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            ..PolicyRule::default()
        }
    }

    #[test]
    fn escalation_is_judged_with_wildcards() {
        let w = Waivers::default();
        assert!(denied_grants(&[rule(&["apps"], &["deployments"], &["*"])], &w).is_empty());
        assert!(denied_grants(&[rule(&["example.org"], &["*"], &["*"])], &w).is_empty());
        let e = denied_grants(
            &[rule(
                &["rbac.authorization.k8s.io"],
                &["clusterroles"],
                &["escalate"],
            )],
            &w,
        );
        assert_eq!(e, ["[rbac.authorization.k8s.io] clusterroles: escalate"]);
        assert!(!denied_grants(&[rule(&["*"], &["roles"], &["*"])], &w).is_empty());
        assert!(!denied_grants(&[rule(&[""], &["*"], &["impersonate"])], &w).is_empty());
        assert!(
            !denied_grants(
                &[rule(
                    &["authentication.k8s.io"],
                    &["userextras/scopes"],
                    &["impersonate"]
                )],
                &w
            )
            .is_empty()
        );
        assert!(!denied_grants(&[rule(&["*"], &["*"], &["*"])], &w).is_empty());
        let all = Waivers {
            escalation_verbs: true,
            wildcard_all: true,
            ..Waivers::default()
        };
        assert!(denied_grants(&[rule(&["*"], &["*"], &["*"])], &all).is_empty());
    }

    #[test]
    fn protected_objects_by_name_and_label() {
        for (kind, name) in [
            ("ClusterRole", "cluster-admin"),
            ("ClusterRole", "admin"),
            ("ClusterRole", "edit"),
            ("ClusterRole", "view"),
            ("ClusterRoleBinding", "cluster-admin"),
            ("ClusterRole", "system:aggregate-to-edit"),
            ("RoleBinding", "system:controller:bootstrap-signer"),
            ("ClusterRole", "rbac-rules"),
            ("ClusterRole", "rbac-rules:allow-list"),
            ("ClusterRoleBinding", "rbac-rules"),
            ("Role", "rbac-rules:leader-election"),
        ] {
            assert!(protected_name(kind, name).is_some(), "{kind} {name}");
        }
        for (kind, name) in [
            ("Role", "edit"),
            ("RoleBinding", "view"),
            ("ClusterRole", "rbac-rules-extra"),
            ("ClusterRole", "example:rbac-rules"),
            ("ClusterRole", "editor"),
        ] {
            assert!(protected_name(kind, name).is_none(), "{kind} {name}");
        }
        assert!(
            protected_object("Role", "x", |k| (k == BOOTSTRAP_LABEL.0)
                .then_some("rbac-defaults"))
            .is_some()
        );
        assert!(
            protected_object("Role", "x", |k| (k == BOOTSTRAP_LABEL.0).then_some("other"))
                .is_none()
        );
    }

    #[test]
    fn everyone_and_system_subjects() {
        assert!(is_everyone("Group", "system:authenticated"));
        assert!(is_everyone("Group", "system:unauthenticated"));
        assert!(is_everyone("Group", "system:serviceaccounts"));
        assert!(is_everyone("User", "system:anonymous"));
        assert!(!is_everyone("Group", "system:serviceaccounts:team-a"));
        assert!(!is_everyone("ServiceAccount", "system:authenticated"));
        assert!(is_system_subject("Group", "system:masters"));
        assert!(!is_system_subject("ServiceAccount", "system:x"));
        assert!(!is_system_subject("User", "alice"));
    }

    #[test]
    fn selectors_of_protected_roles() {
        let sel = |v: serde_json::Value| -> LabelSelector {
            serde_json::from_value(v).expect("selector")
        };
        for s in [
            serde_json::json!({}),
            serde_json::json!({"matchLabels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}),
            serde_json::json!({"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}),
            serde_json::json!({"matchLabels": {"rbacrules.io/aggregate-to-controller": "true"}}),
            serde_json::json!({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}),
        ] {
            assert!(selects_protected_labels(&[sel(s.clone())]), "{s}");
        }
        for s in [
            serde_json::json!({"matchLabels": {"rbac.example.org/aggregate-to-edit": "true"}}),
            serde_json::json!({"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"},
                "matchExpressions": [{"key": "kubernetes.io/bootstrapping", "operator": "DoesNotExist"}]}),
        ] {
            assert!(!selects_protected_labels(&[sel(s.clone())]), "{s}");
        }
    }

    #[test]
    fn custom_groups() {
        assert!(is_custom_group("example.org"));
        assert!(!is_custom_group("apps"));
        assert!(!is_custom_group("rbac.authorization.k8s.io"));
        assert!(!is_custom_group("x.kubernetes.io"));
        assert!(!is_custom_group("*.example.org"));
        let a = AllowList {
            custom_groups: true,
            ..AllowList::default()
        };
        assert!(
            a.uncovered(&[], &[rule(&["example.org"], &["widgets"], &["get"])])
                .is_empty()
        );
        assert_eq!(
            a.uncovered(&[], &[rule(&["apps"], &["deployments"], &["get"])])
                .len(),
            1
        );
    }
}
