//! Turning rendered parts into valid RBAC objects, with Kubernetes' own
//! validation rules for names, labels, policy rules, roleRefs and subjects,
//! so that a bad render fails here, naming the rule's field, instead of at
//! the API server.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::{AggregationRule, PolicyRule, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::{ErrorKind, FieldError};
use super::path::At;
use crate::api::{GROUP, OutputKind};

pub use super::kinds::{RBAC_API_VERSION, RBAC_GROUP};

/// Label on every emitted object; the controller lists by it (its label
/// inventory: what it lists to find objects to prune).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_VALUE: &str = "rbac-rules";

/// Whether an object carries `app.kubernetes.io/managed-by: rbac-rules`:
/// the controller's inventory of what it made.
///
/// The label is a claim, not a proof: anyone who may write an RBAC object
/// may label it so. Where objects are loaded, [`provenance`] tells a claim
/// our inventory made from one someone else wrote, and [`disown`] takes the
/// claim off the latter before the engine sees it; so in the engine's
/// store the label means "ours, or not known to be someone else's".
pub fn is_managed(obj: &Value) -> bool {
    obj["metadata"]["labels"][MANAGED_BY_LABEL].as_str() == Some(MANAGED_BY_VALUE)
}

/// Field manager of every write of the controller (server-side apply): its
/// `Apply` entry in `metadata.managedFields` is what proves that our
/// inventory made an object.
pub const FIELD_MANAGER: &str = "rbac-rules";

/// What a loaded object's inventory claim is worth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provenance {
    /// It carries no claim (not our managed-by label).
    Unclaimed,
    /// Labelled, and its `managedFields` hold an `Apply` entry of our
    /// field manager: our inventory made it (every write of ours is a
    /// server-side apply, in every version of rbac-rules).
    Proven,
    /// Labelled, but its `managedFields` hold no `Apply` entry of ours:
    /// someone else labelled it. Never ours: neither pruned, revoked,
    /// overwritten nor judged as ours; reported.
    Foreign,
    /// Labelled, and the input has no `managedFields` (a dump by
    /// `kubectl get -o yaml`, which leaves them out): nothing tells. Treated
    /// as ours where only a view is at stake; never fatal.
    Unknown,
}

/// The worth of `obj`'s inventory claim, from its `metadata.managedFields`
/// (read before they are dropped).
pub fn provenance(obj: &Value) -> Provenance {
    if !is_managed(obj) {
        return Provenance::Unclaimed;
    }
    match obj["metadata"].get("managedFields") {
        None | Some(Value::Null) => Provenance::Unknown,
        Some(entries) if has_our_apply_entry(entries) => Provenance::Proven,
        Some(_) => Provenance::Foreign,
    }
}

/// Whether a `managedFields` list holds an `Apply` entry of our field
/// manager.
pub fn has_our_apply_entry(entries: &Value) -> bool {
    entries.as_array().is_some_and(|es| {
        es.iter().any(|e| {
            e["manager"].as_str() == Some(FIELD_MANAGER) && e["operation"].as_str() == Some("Apply")
        })
    })
}

/// Takes the inventory claim (our managed-by label) off an object our
/// inventory did not make, so that the engine judges and shows it as
/// anyone's: not hidden behind a rule's output, not revoked, not counted
/// as ours in an aggregation. Whether anything was taken.
pub fn disown(obj: &mut Value) -> bool {
    obj.get_mut("metadata")
        .and_then(|m| m.get_mut("labels"))
        .and_then(Value::as_object_mut)
        .is_some_and(|labels| labels.remove(MANAGED_BY_LABEL).is_some())
}

/// An object as an offline command loads it: one someone else labelled
/// ours (its `managedFields` say so) loses the claim ([`disown`]); what its
/// claim is worth is returned.
pub fn vet_claim(obj: &mut Value) -> Provenance {
    let p = provenance(obj);
    if p == Provenance::Foreign {
        disown(obj);
    }
    p
}

/// The output kind, namespace and name of an RBAC object.
pub fn out_key(obj: &Value) -> Option<(OutputKind, String, String)> {
    let group = obj["apiVersion"].as_str()?.split_once('/')?.0;
    if group != RBAC_GROUP {
        return None;
    }
    let kind = OutputKind::parse(obj["kind"].as_str()?)?;
    let meta = &obj["metadata"];
    let ns = meta["namespace"].as_str().unwrap_or_default().to_string();
    Some((kind, ns, meta["name"].as_str()?.to_string()))
}

/// `Kind namespace/name` (or `Kind name`) of an object, for messages.
pub fn describe_object(obj: &Value) -> String {
    let kind = obj["kind"].as_str().unwrap_or("object");
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    match obj["metadata"]["namespace"].as_str() {
        Some(ns) if !ns.is_empty() => format!("{kind} {ns}/{name}"),
        _ => format!("{kind} {name}"),
    }
}

/// What an object labelled ours (naming `rule`, if it does) claims.
fn claim_of(rule: Option<&str>) -> String {
    match rule {
        Some(r) => format!("labelled {MANAGED_BY_LABEL}={MANAGED_BY_VALUE} and naming rule {r:?}"),
        None => format!("labelled {MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"),
    }
}

/// The report of an object labelled ours (`what`: `Kind [ns/]name`) that
/// our inventory did not make: what it claims and what is done with it.
pub fn foreign_claim_message(what: &str, rule: Option<&str>) -> String {
    format!(
        "{what} is {}, but rbac-rules did not make it (its managedFields hold no Apply entry of field manager {FIELD_MANAGER:?}): not ours, left alone — neither pruned, revoked nor overwritten; remove the label, or delete it if it should not exist",
        claim_of(rule)
    )
}

/// The report of an object labelled ours in an input without
/// `managedFields`, where nothing shows who made it.
pub fn unverified_claim_message(what: &str) -> String {
    format!(
        "{what} is {}; the input does not show who made it (no managedFields: dump with `kubectl get --show-managed-fields`)",
        claim_of(None)
    )
}

/// Provenance keys, all under `rbacrules.io/`.
pub fn rule_label() -> String {
    [GROUP, "/rule"].concat()
}
/// Annotation with the full rule name (the label may be shortened).
pub fn rule_annotation() -> String {
    [GROUP, "/rule"].concat()
}
/// Annotation naming the trigger as `Kind.group/[namespace/]name`.
pub fn trigger_annotation() -> String {
    [GROUP, "/trigger"].concat()
}
/// Annotation `Delete` on the outputs of a rule whose `deletionPolicy` is
/// `Delete`: read from the live object once the rule is gone (absent:
/// `Orphan`, the objects stay).
pub fn deletion_policy_annotation() -> String {
    [GROUP, "/deletion-policy"].concat()
}
/// Annotation the controller puts on an object it adopted (it existed
/// before): never pruned, whatever the rule's deletion policy.
pub fn adopted_annotation() -> String {
    [GROUP, "/adopted"].concat()
}

fn invalid(field: impl std::fmt::Display, msg: impl Into<String>) -> FieldError {
    FieldError::new(ErrorKind::InvalidOutput, field.to_string(), msg)
}

/// RBAC object names are path segments: not empty, `.` or `..`, no `/` or
/// `%`. Kubernetes sets no length limit on them (unlike DNS names), and
/// rules rely on that: roles named after a 253-character object (a CRD
/// name, say) plus a prefix and suffix are longer than 253.
pub fn validate_name(field: impl std::fmt::Display, name: &str) -> Result<(), FieldError> {
    if name.is_empty() {
        return Err(invalid(&field, "rendered name is empty"));
    }
    if name == "." || name == ".." {
        return Err(invalid(&field, format!("name {name:?} is not allowed")));
    }
    if let Some(c) = name.chars().find(|c| *c == '/' || *c == '%') {
        return Err(invalid(
            &field,
            format!("name {name:?} may not contain {c:?}"),
        ));
    }
    Ok(())
}

/// Namespaces are DNS-1123 labels.
pub fn validate_namespace(field: impl std::fmt::Display, ns: &str) -> Result<(), FieldError> {
    let ok = !ns.is_empty()
        && ns.len() <= 63
        && ns
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !ns.starts_with('-')
        && !ns.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(invalid(
            &field,
            format!(
                "namespace {ns:?} is not a valid DNS label (lowercase, digits, '-', at most 63)"
            ),
        ))
    }
}

/// `[A-Za-z0-9]` at both ends, `-_.` and alphanumerics inside, ≤ 63.
fn is_qualified_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn is_dns_subdomain(s: &str) -> bool {
    // One pass over the bytes (run on every name from data): a label
    // starts after a dot (or at the start) and may not start or end with
    // '-' or be empty.
    if s.is_empty() || s.len() > 253 {
        return false;
    }
    let mut prev = b'.';
    for &c in s.as_bytes() {
        let ok = match c {
            b'a'..=b'z' | b'0'..=b'9' => true,
            b'-' => prev != b'.',
            b'.' => prev != b'.' && prev != b'-',
            _ => false,
        };
        if !ok {
            return false;
        }
        prev = c;
    }
    prev != b'.' && prev != b'-'
}

/// Label and annotation keys: optional DNS-subdomain prefix, `/`, name.
pub fn validate_key(field: impl std::fmt::Display, key: &str) -> Result<(), FieldError> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return Err(invalid(
            &field,
            format!("key {key:?}: prefix {p:?} is not a DNS subdomain of at most 253 characters"),
        ));
    }
    if !is_qualified_name_part(name) {
        return Err(invalid(
            &field,
            format!(
                "key {key:?}: name part must be 1-63 characters, alphanumeric at both ends, '-', '_' or '.' inside (it is {})",
                name.len()
            ),
        ));
    }
    Ok(())
}

/// Label values: empty, or ≤ 63 with the name-part rules.
pub fn validate_label_value(
    field: impl std::fmt::Display,
    key: &str,
    value: &str,
) -> Result<(), FieldError> {
    if value.is_empty() || is_qualified_name_part(value) {
        return Ok(());
    }
    Err(invalid(
        &field,
        format!(
            "label {key:?}: value {value:?} is {} characters; values must be at most 63, alphanumeric at both ends, '-', '_' or '.' inside (use the shorten or hash helper)",
            value.len()
        ),
    ))
}

/// Kubernetes' limit on an object's annotations together: the sum of
/// every key's and value's length (apimachinery's
/// `TotalAnnotationSizeLimitB`).
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// Largest object the engine emits, as JSON: 1 MiB. etcd refuses requests
/// over 1.5 MiB by default (`--max-request-bytes`), and what the API
/// server stores is more than what the controller sends (managedFields,
/// its own metadata), so an object near 1.5 MiB would be refused at the
/// API server on every try; 1 MiB leaves that room.
pub const MAX_OBJECT_BYTES: usize = 1024 * 1024;

/// An object's annotations (the provenance ones included, as the API
/// server sees them) within [`MAX_ANNOTATIONS_BYTES`] together.
pub fn validate_annotations_size<'a>(
    field: impl std::fmt::Display,
    annotations: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), FieldError> {
    let total = annotations
        .into_iter()
        .fold(0usize, |n, (k, v)| n.saturating_add(k.len() + v.len()));
    if total > MAX_ANNOTATIONS_BYTES {
        return Err(invalid(
            &field,
            format!(
                "the annotations take {total} bytes together; Kubernetes allows at most {MAX_ANNOTATIONS_BYTES}"
            ),
        ));
    }
    Ok(())
}

/// A whole object within [`MAX_OBJECT_BYTES`] as JSON. Most objects are
/// far smaller than the bound [`super::limits::manifest_weight`] gives
/// (a JSON character per byte of text, at most 6 for an escaped one):
/// those are not serialized to be measured.
pub fn validate_object_size(
    field: impl std::fmt::Display,
    m: &super::manifest::Manifest,
) -> Result<(), FieldError> {
    if super::limits::manifest_weight(m).saturating_mul(6) <= MAX_OBJECT_BYTES {
        return Ok(());
    }
    /// Counts what is written, keeps nothing.
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, m).map_err(|e| invalid(&field, e.to_string()))?;
    if count.0 > MAX_OBJECT_BYTES {
        return Err(invalid(
            &field,
            format!(
                "the object is {} bytes as JSON; the engine emits at most {MAX_OBJECT_BYTES} (the API server's storage refuses objects much larger)",
                count.0
            ),
        ));
    }
    Ok(())
}

/// Converts a rendered map of text to a string map.
pub fn string_map(
    field: impl std::fmt::Display,
    v: &Value,
) -> Result<BTreeMap<String, String>, FieldError> {
    let Value::Object(m) = v else {
        return Err(invalid(&field, "must render to a map"));
    };
    let mut out = BTreeMap::new();
    for (k, val) in m {
        let s = match val {
            Value::String(s) => s.clone(),
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => n.to_string(),
            other => {
                return Err(invalid(
                    format!("{field}.{k}"),
                    format!("must be text, got {other}"),
                ));
            }
        };
        out.insert(k.clone(), s);
    }
    Ok(out)
}

/// Deserializes a rendered value into a Kubernetes type, refusing unknown
/// fields (a typo like `resource:` must not silently widen or narrow a role).
pub fn strict<T: DeserializeOwned>(
    field: impl std::fmt::Display,
    v: &Value,
) -> Result<T, FieldError> {
    // Read in place: `&Value` is a deserializer, no copy of the value.
    strict_from(&field, v)
}

/// [`strict`] from a value given up: its strings are moved into the
/// result, not copied.
pub fn strict_owned<T: DeserializeOwned>(
    field: impl std::fmt::Display,
    v: Value,
) -> Result<T, FieldError> {
    strict_from(&field, v)
}

fn strict_from<'de, T: DeserializeOwned, D>(
    field: impl std::fmt::Display,
    v: D,
) -> Result<T, FieldError>
where
    D: serde::Deserializer<'de, Error = serde_json::Error>,
{
    let mut unknown = Vec::new();
    let parsed: Result<T, _> = serde_ignored::deserialize(v, |p| unknown.push(p.to_string()));
    let parsed = parsed.map_err(|e| invalid(&field, e.to_string()))?;
    if let Some(u) = unknown.first() {
        return Err(invalid(
            format!("{field}.{u}"),
            format!("unknown field {u:?}"),
        ));
    }
    Ok(parsed)
}

/// Kubernetes' PolicyRule validation (pkg/apis/rbac/validation).
pub fn validate_policy_rule(
    field: impl std::fmt::Display,
    r: &PolicyRule,
    namespaced: bool,
) -> Result<(), FieldError> {
    let empty = |o: &Option<Vec<String>>| o.as_ref().is_none_or(Vec::is_empty);
    if r.verbs.is_empty() {
        return Err(invalid(format!("{field}.verbs"), "verbs must not be empty"));
    }
    if !empty(&r.non_resource_urls) {
        if namespaced {
            return Err(invalid(
                format!("{field}.nonResourceURLs"),
                "namespaced Roles may not have nonResourceURLs",
            ));
        }
        if !empty(&r.api_groups) || !empty(&r.resources) {
            return Err(invalid(
                &field,
                "a rule may not cover both resources and nonResourceURLs",
            ));
        }
        return Ok(());
    }
    if r.api_groups.is_none() || empty(&r.api_groups) {
        return Err(invalid(
            format!("{field}.apiGroups"),
            "resource rules need at least one apiGroup (\"\" is the core group)",
        ));
    }
    if empty(&r.resources) {
        return Err(invalid(
            format!("{field}.resources"),
            "resource rules need at least one resource",
        ));
    }
    Ok(())
}

/// Prefix the engine puts on every policy-rule string rendered from a
/// template containing `{{`: such a value came from data and must be a
/// plain name of its kind (see [`check_marked_rules`]).
pub const DATA_MARK: char = '\u{0}';

/// The lists of a policy rule whose entries rendered from data are
/// checked, with their field names.
#[derive(Clone, Copy)]
enum RuleList {
    ApiGroups,
    Resources,
    Verbs,
    ResourceNames,
    NonResourceUrls,
}

impl RuleList {
    const ALL: [(RuleList, &'static str); 5] = [
        (RuleList::ApiGroups, "apiGroups"),
        (RuleList::Resources, "resources"),
        (RuleList::Verbs, "verbs"),
        (RuleList::ResourceNames, "resourceNames"),
        (RuleList::NonResourceUrls, "nonResourceURLs"),
    ];
}

/// Whether `group` is the controller's own API group or a subgroup of it.
fn is_own_group(group: &str) -> bool {
    group
        .strip_suffix(crate::api::GROUP)
        .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
}

/// Whether `value`, rendered from data into the policy-rule list `list`,
/// is a plain name of its kind. Never a wildcard.
fn data_value_problem(list: RuleList, value: &str) -> Option<String> {
    if value.as_bytes().contains(&b'*') {
        return Some(
            "a value from data may not contain '*' (only a literal '*' in the rule is a wildcard)"
                .into(),
        );
    }
    let ok = match list {
        RuleList::ApiGroups => value.is_empty() || is_dns_subdomain(value),
        // By byte: `split_once('/')` sets up a searcher per value.
        RuleList::Resources => match value.bytes().position(|b| b == b'/') {
            Some(i) => {
                super::format::is_dns_label(&value[..i])
                    && super::format::is_dns_label(&value[i + 1..])
            }
            None => super::format::is_dns_label(value),
        },
        // A verb from data: one Kubernetes knows, never `*`.
        RuleList::Verbs => value != "*" && crate::policy::is_known_verb(value),
        RuleList::ResourceNames => {
            validate_name("", value).is_ok() && !value.chars().any(char::is_control)
        }
        RuleList::NonResourceUrls => {
            value.starts_with('/')
                && !value.contains("//")
                && value
                    .chars()
                    .all(|c| c.is_ascii_graphic() && !matches!(c, '%' | '?' | '#'))
        }
    };
    (!ok).then(|| {
        let what = match list {
            RuleList::ApiGroups => "an API group (empty or a DNS subdomain)",
            RuleList::Resources => "a resource (a lowercase DNS label, optionally /subresource)",
            RuleList::Verbs => "a known verb (custom verbs only when written literally)",
            RuleList::ResourceNames => "an object name",
            RuleList::NonResourceUrls => "a non-resource URL path starting with '/'",
        };
        format!("{value:?} from data is not {what}")
    })
}

fn strip_marks(v: &mut Value) {
    match v {
        // In place: the mark is one byte.
        Value::String(s) if s.starts_with(DATA_MARK) => {
            s.remove(0);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_marks),
        Value::Object(m) => m.values_mut().for_each(strip_marks),
        _ => {}
    }
}

/// Checks rendered policy rules whose templated strings carry
/// [`DATA_MARK`]: every marked entry of apiGroups, resources, verbs,
/// resourceNames and nonResourceURLs must be a plain name of its kind, and
/// removes the marks. A malformed name is an error; a `*` from data is a
/// refusal, returned (the first) for the caller to refuse the object with
/// ([`ErrorKind::EscalationDenied`]).
pub fn check_marked_rules(
    field: impl std::fmt::Display,
    v: &mut Value,
) -> Result<Option<FieldError>, FieldError> {
    match v {
        Value::Array(items) => {
            let refusal = check_marked_items(&field, 0, items)?;
            strip_marked_items(items);
            Ok(refusal)
        }
        other => {
            strip_marks(other);
            Ok(None)
        }
    }
}

/// [`check_marked_rules`] for a run of the rendered list that starts at
/// index `base` (named so in errors), leaving the marks in place.
pub fn check_marked_items(
    field: impl std::fmt::Display,
    base: usize,
    items: &[Value],
) -> Result<Option<FieldError>, FieldError> {
    let mut refusal = None;
    for (i, item) in items.iter().enumerate() {
        let Value::Object(m) = item else { continue };
        for (list, key) in RuleList::ALL {
            let Some(Value::Array(values)) = m.get(key) else {
                continue;
            };
            for (j, x) in values.iter().enumerate() {
                let Some(data) = x.as_str().and_then(|s| s.strip_prefix(DATA_MARK)) else {
                    continue;
                };
                // Named only when refused: a data value is the common
                // case (every type a provider's CRDs name), a refusal rare.
                let at = || format!("{field}[{}].{key}[{j}]", base + i);
                if matches!(list, RuleList::ApiGroups) && is_own_group(data) {
                    // A grant on RbacRules makes its holder a rule author:
                    // only a rule's own literal text may give it.
                    let problem = format!(
                        "{data:?} from data is the controller's own API group, never granted from data"
                    );
                    refusal.get_or_insert_with(|| {
                        FieldError::new(ErrorKind::EscalationDenied, at(), problem)
                    });
                    continue;
                }
                let Some(problem) = data_value_problem(list, data) else {
                    continue;
                };
                if !data.contains('*') {
                    return Err(FieldError::new(ErrorKind::InvalidOutput, at(), problem));
                }
                refusal.get_or_insert_with(|| {
                    FieldError::new(ErrorKind::EscalationDenied, at(), problem)
                });
            }
        }
    }
    Ok(refusal)
}

/// Removes the marks of checked rules.
pub fn strip_marked_items(items: &mut [Value]) {
    items.iter_mut().for_each(strip_marks);
}

/// Parses and validates rendered policy rules.
pub fn policy_rules(
    field: impl std::fmt::Display,
    v: Value,
    namespaced: bool,
) -> Result<Vec<PolicyRule>, FieldError> {
    let Value::Array(mut items) = v else {
        return Err(invalid(&field, "must render to a list"));
    };
    policy_items(&field, 0, &mut items, namespaced)
}

/// [`policy_rules`] for a run of the rendered list that starts at index
/// `base` (named so in errors), taking the items (left null).
pub fn policy_items(
    field: impl std::fmt::Display,
    base: usize,
    items: &mut [Value],
    namespaced: bool,
) -> Result<Vec<PolicyRule>, FieldError> {
    let mut rules = Vec::with_capacity(items.len());
    for (i, item) in items.iter_mut().enumerate() {
        let f = At::Index(&At::Of(&field), base + i);
        let r: PolicyRule = strict_owned(f, std::mem::take(item))?;
        validate_policy_rule(f, &r, namespaced)?;
        rules.push(r);
    }
    Ok(rules)
}

/// [`subjects`] of a rendered list whose templated strings carry
/// [`DATA_MARK`]: a `User` or `Group` subject whose name came from data
/// never names a `system:` user or group (a literal one is the rule
/// author's); such a subject is a refusal, returned (the first) for the
/// caller to refuse the object with ([`ErrorKind::EscalationDenied`]).
pub fn marked_subjects(
    field: impl std::fmt::Display,
    mut v: Value,
    kind: OutputKind,
) -> Result<(Vec<Subject>, Option<FieldError>), FieldError> {
    let mut refusal = None;
    for (i, item) in v.as_array().into_iter().flatten().enumerate() {
        let unmarked = |key: &str| {
            item[key]
                .as_str()
                .map(|s| s.strip_prefix(DATA_MARK).unwrap_or(s))
        };
        let Some(name) = item["name"]
            .as_str()
            .and_then(|s| s.strip_prefix(DATA_MARK))
        else {
            continue;
        };
        let subject_kind = unmarked("kind").unwrap_or_default();
        if refusal.is_none() && crate::policy::is_system_subject(subject_kind, name) {
            refusal = Some(FieldError::new(
                ErrorKind::EscalationDenied,
                format!("{field}[{i}].name"),
                format!(
                    "{subject_kind} subject {name:?} comes from data and names a system: {}; only a rule may name one, literally",
                    subject_kind.to_lowercase()
                ),
            ));
        }
    }
    strip_marks(&mut v);
    Ok((subjects(field, &v, kind)?, refusal))
}

/// Parses and validates subjects, filling the apiGroup Kubernetes expects
/// for each kind and dropping exact duplicates.
pub fn subjects(
    field: impl std::fmt::Display,
    v: &Value,
    kind: OutputKind,
) -> Result<Vec<Subject>, FieldError> {
    let Value::Array(items) = v else {
        return Err(invalid(&field, "must render to a list"));
    };
    let mut out: Vec<Subject> = Vec::new();
    let mut seen: BTreeSet<(String, String, String)> = BTreeSet::new();
    for (i, item) in items.iter().enumerate() {
        let f = At::Index(&At::Of(&field), i);
        let mut s: Subject = strict(f, item)?;
        if s.name.is_empty() {
            return Err(invalid(format!("{f}.name"), "subject name is empty"));
        }
        if s.name.chars().any(char::is_control) {
            return Err(invalid(
                format!("{f}.name"),
                format!("subject name {:?} contains control characters", s.name),
            ));
        }
        if s.kind == "ServiceAccount" && !is_dns_subdomain(&s.name) {
            return Err(invalid(
                format!("{f}.name"),
                format!("ServiceAccount name {:?} is not a DNS subdomain", s.name),
            ));
        }
        match s.kind.as_str() {
            "ServiceAccount" => {
                if s.api_group.as_deref().is_some_and(|g| !g.is_empty()) {
                    return Err(invalid(
                        format!("{f}.apiGroup"),
                        "ServiceAccount subjects take apiGroup \"\"",
                    ));
                }
                s.api_group = Some(String::new());
                match s.namespace.as_deref() {
                    Some(ns) if !ns.is_empty() => validate_namespace(At::Key(&f, "namespace"), ns)?,
                    _ if kind == OutputKind::ClusterRoleBinding => {
                        return Err(invalid(
                            format!("{f}.namespace"),
                            "ServiceAccount subjects of a ClusterRoleBinding need a namespace",
                        ));
                    }
                    _ => s.namespace = None,
                }
            }
            "User" | "Group" => {
                if s.api_group.as_deref().is_some_and(|g| g != RBAC_GROUP) {
                    return Err(invalid(
                        format!("{f}.apiGroup"),
                        format!("{} subjects take apiGroup {RBAC_GROUP}", s.kind),
                    ));
                }
                s.api_group = Some(RBAC_GROUP.to_string());
                if s.namespace.as_deref().is_some_and(|n| !n.is_empty()) {
                    return Err(invalid(
                        format!("{f}.namespace"),
                        format!("{} subjects have no namespace", s.kind),
                    ));
                }
                s.namespace = None;
            }
            other => {
                return Err(invalid(
                    format!("{f}.kind"),
                    format!("subject kind {other:?} is not ServiceAccount, User or Group"),
                ));
            }
        }
        let key = (
            s.kind.clone(),
            s.namespace.clone().unwrap_or_default(),
            s.name.clone(),
        );
        if seen.insert(key) {
            out.push(s);
        }
    }
    Ok(out)
}

/// Parses an aggregationRule and checks its selectors.
pub fn aggregation_rule(
    field: impl std::fmt::Display,
    v: &Value,
) -> Result<AggregationRule, FieldError> {
    let a: AggregationRule = strict(&field, v)?;
    for (i, sel) in a.cluster_role_selectors.iter().flatten().enumerate() {
        crate::selector::validate(sel).map_err(|e| {
            FieldError::new(
                ErrorKind::Selector,
                format!("{field}.clusterRoleSelectors[{i}]"),
                e.to_string(),
            )
        })?;
        for (k, val) in sel.match_labels.iter().flatten() {
            validate_key(format!("{field}.clusterRoleSelectors[{i}].matchLabels"), k)?;
            validate_label_value(
                format!("{field}.clusterRoleSelectors[{i}].matchLabels"),
                k,
                val,
            )?;
        }
    }
    Ok(a)
}

/// A live or emitted role's rules. Live roles were validated by the API
/// server; what does not parse is skipped (and logged) rather than failing
/// every rule that reads the role.
pub fn rules_of(role: &Value) -> Vec<PolicyRule> {
    let name = role["metadata"]["name"].as_str().unwrap_or_default();
    let mut out = Vec::new();
    for (i, r) in role
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        match serde_json::from_value::<PolicyRule>(r.clone()) {
            Ok(p) => out.push(p),
            Err(e) => {
                tracing::warn!(role = name, index = i, error = %e, "skipping unparseable rule")
            }
        }
    }
    out
}

/// The selectors of an aggregated ClusterRole.
pub fn selectors_of(role: &Value) -> Vec<LabelSelector> {
    role["aggregationRule"]["clusterRoleSelectors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| serde_json::from_value(s.clone()).ok())
        .collect()
}

/// For an aggregated ClusterRole, the key of the selection its verdict
/// reads (see `View::selected`).
pub fn selection_key(role: &Value) -> Option<String> {
    role.get("aggregationRule")?;
    serde_json::to_string(&selectors_of(role)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_follow_rbac_path_segment_rules() {
        assert!(validate_name("f", "platform:widget:x.example.org:aggregate-to-edit").is_ok());
        for bad in ["", ".", "..", "a/b", "a%b"] {
            assert!(validate_name("f", bad).is_err(), "{bad:?}");
        }
        // No length limit, as in Kubernetes' ValidateRBACName.
        assert!(validate_name("f", &"a".repeat(300)).is_ok());
    }

    #[test]
    fn subdomains_as_kubernetes_reads_them() {
        // Kubernetes' IsDNS1123Subdomain: at most 253 characters of
        // dot-separated `[a-z0-9]([-a-z0-9]*[a-z0-9])?` (no 63 per label).
        let expected = |s: &str| {
            !s.is_empty()
                && s.len() <= 253
                && s.split('.').all(|p| {
                    !p.is_empty()
                        && p.bytes()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                        && !p.starts_with('-')
                        && !p.ends_with('-')
                })
        };
        let alphabet = ["a", "9", "-", ".", "A", "_", "é"];
        let mut strings = vec![String::new()];
        for len in 1..=5 {
            let longer: Vec<String> = strings
                .iter()
                .filter(|s| s.chars().count() == len - 1)
                .flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}")))
                .collect();
            strings.extend(longer);
        }
        strings.extend([
            "a".repeat(253),
            "a".repeat(254),
            format!("{}.b", "a".repeat(70)),
        ]);
        assert!(strings.len() > 19_000);
        for s in &strings {
            assert_eq!(is_dns_subdomain(s), expected(s), "{s:?}");
        }
    }

    #[test]
    fn label_rules() {
        assert!(validate_key("f", "rbac.example.org/aggregate-to-edit").is_ok());
        assert!(validate_key("f", "namespace.example.org/team-a").is_ok());
        assert!(validate_key("f", "Bad_Prefix/x").is_err());
        assert!(validate_key("f", &format!("a.io/{}", "x".repeat(64))).is_err());
        assert!(validate_label_value("f", "k", "true").is_ok());
        assert!(validate_label_value("f", "k", "").is_ok());
        let e = validate_label_value("f", "k", &"x".repeat(64)).unwrap_err();
        assert!(e.message.contains("64 characters"), "{}", e.message);
        assert!(validate_label_value("f", "k", "-x").is_err());
    }

    #[test]
    fn policy_rule_validation() {
        let v = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
        assert!(policy_rules("f", v.clone(), true).is_ok());
        let no_group = json!([{"resources": ["pods"], "verbs": ["get"]}]);
        assert!(
            policy_rules("f", no_group, false)
                .unwrap_err()
                .field
                .ends_with("apiGroups")
        );
        let typo = json!([{"apiGroups": [""], "resource": ["pods"], "verbs": ["get"]}]);
        let e = policy_rules("f", typo, false).unwrap_err();
        assert!(e.message.contains("unknown field"), "{}", e.message);
        let url_in_role = json!([{"nonResourceURLs": ["/healthz"], "verbs": ["get"]}]);
        assert!(policy_rules("f", url_in_role.clone(), true).is_err());
        assert!(policy_rules("f", url_in_role, false).is_ok());
    }

    #[test]
    fn subjects_get_kind_defaults_and_checks() {
        let v = json!([
            {"kind": "ServiceAccount", "name": "sa", "namespace": "ns"},
            {"kind": "ServiceAccount", "name": "sa", "namespace": "ns"},
            {"kind": "Group", "name": "g"}
        ]);
        let s = subjects("f", &v, OutputKind::ClusterRoleBinding).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].api_group.as_deref(), Some(RBAC_GROUP));
        let no_ns = json!([{"kind": "ServiceAccount", "name": "sa"}]);
        assert!(subjects("f", &no_ns, OutputKind::ClusterRoleBinding).is_err());
        assert!(subjects("f", &no_ns, OutputKind::RoleBinding).is_ok());
        assert!(
            subjects(
                "f",
                &json!([{"kind": "Robot", "name": "r"}]),
                OutputKind::RoleBinding
            )
            .is_err()
        );
    }
}
