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
pub(super) const ALL: &str = "*";

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

pub(super) fn list(values: &Option<Vec<String>>) -> &[String] {
    values.as_deref().unwrap_or_default()
}

pub(super) fn has(values: &[String], wanted: &str) -> bool {
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
pub(super) fn value_covered(owner: &[String], wanted: &str) -> bool {
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

pub(super) fn selectors(role: &ClusterRole) -> Option<&[LabelSelector]> {
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
