//! The `RbacRule` custom resource (`rbacrules.io/v1alpha1`).
//!
//! Doc comments on these types become the CRD's OpenAPI descriptions, so they
//! are written for `kubectl explain` readers.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition as MetaCondition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// API group of the RbacRule kind and prefix of every label and annotation
/// this project writes.
pub const GROUP: &str = "rbacrules.io";

/// An RbacRule says when (a trigger object kind, with filters) and what
/// (ClusterRoles, Roles and bindings rendered from templates) the controller
/// keeps in the cluster. A rule without a trigger emits fixed objects once.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "rbacrules.io",
    version = "v1alpha1",
    kind = "RbacRule",
    plural = "rbacrules",
    shortname = "rbr",
    status = "RbacRuleStatus",
    doc = "An RbacRule: when a trigger object matches, keep these ClusterRoles, Roles and bindings.",
    printcolumn = r#"{"name":"READY","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"REASON","type":"string","description":"The Degraded condition's reason: AsExpected, or what needs a person (an error, a refusal, a notice such as PruneHeld or NotOurs)","jsonPath":".status.conditions[?(@.type==\"Degraded\")].reason"}"#,
    printcolumn = r#"{"name":"TRIGGERS","type":"integer","jsonPath":".status.matchedTriggers"}"#,
    printcolumn = r#"{"name":"OBJECTS","type":"integer","jsonPath":".status.managedObjects"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RbacRuleSpec {
    /// The lowest `--manage` level at which this rule is active:
    /// `serviceaccounts` (roles bound to software), `basic` (plus user-facing
    /// roles) or `all` (plus namespace roles). The controller's `--manage`
    /// flag (default `all`) switches off rules above its level; their objects
    /// are then left alone. Default: `all`.
    #[serde(default, skip_serializing_if = "ManageLevel::is_default")]
    pub manage_level: ManageLevel,

    /// What becomes of this rule's objects when the rule itself is deleted,
    /// as for a managed resource: `Orphan` (the default) leaves every one
    /// of them in place, granting what it granted; `Delete` prunes them.
    /// Either way a policy refusal still revokes, an object that existed
    /// before the controller adopted it and one carrying
    /// `helm.sh/resource-policy: keep` are never deleted, and while the
    /// rule exists an output it no longer emits is pruned.
    #[serde(default, skip_serializing_if = "DeletionPolicy::is_default")]
    pub deletion_policy: DeletionPolicy,

    /// The kind of object that makes this rule emit its outputs: one output
    /// set per matching object. Omit it for a static rule that emits its
    /// outputs exactly once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,

    /// Named sets of objects found from the trigger, evaluated in order and
    /// available to templates as `related.<name>` (a sorted list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub related: Vec<Related>,

    /// Settings of an installation this rule reads as `params.<name>`
    /// (e.g. the namespace a product is installed in), each with its
    /// default. The controller's and `render`'s `--param NAME=VALUE`
    /// overrides a default for every rule that declares it. A value fills
    /// fields like data: it is never a template, a wildcard or a structure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<Param>,

    /// Named values computed once per trigger, after `related`, and
    /// available to templates as `vars.<name>`: an expression used by
    /// several outputs is written and evaluated once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vars: Vec<Var>,

    /// The objects to emit for each trigger (or once, without a trigger).
    pub outputs: Vec<Output>,
}

/// A NamespacedRbacRule is an RbacRule a namespace's own admins may write:
/// the same rule language, read and written only inside its namespace. Its
/// triggers and related objects are objects of its own namespace (a
/// cluster-scoped kind only where the administrator's setting allows it,
/// read-only); its outputs are only Roles and RoleBindings in its own
/// namespace; every output must fit under the namespace's ceiling. At
/// admission its author must hold every permission its rules grant and
/// `bind` on every role it binds (docs/delegation.md).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "rbacrules.io",
    version = "v1alpha1",
    kind = "NamespacedRbacRule",
    plural = "namespacedrbacrules",
    shortname = "nrbr",
    namespaced,
    status = "RbacRuleStatus",
    doc = "A NamespacedRbacRule: an RbacRule confined to its namespace (Roles and RoleBindings only, under the namespace's ceiling).",
    printcolumn = r#"{"name":"READY","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"REASON","type":"string","description":"The Degraded condition's reason: AsExpected, or what needs a person (an error, a refusal such as OverCeiling, a notice)","jsonPath":".status.conditions[?(@.type==\"Degraded\")].reason"}"#,
    printcolumn = r#"{"name":"TRIGGERS","type":"integer","jsonPath":".status.matchedTriggers"}"#,
    printcolumn = r#"{"name":"OBJECTS","type":"integer","jsonPath":".status.managedObjects"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct NamespacedRbacRuleSpec {
    /// The rule: the same fields as an RbacRule's spec.
    #[serde(flatten)]
    pub rule: RbacRuleSpec,
}

/// A setting of the installation, read by templates as `params.<name>`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Param {
    /// Name; templates read it as `params.<name>`.
    pub name: String,
    /// The value when `--param` does not give one.
    pub default: String,
    /// A format every value (the default and any `--param`) must have, e.g.
    /// `dnsLabel` for a namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<ValueFormat>,
    /// What the setting means, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A named value: an expression (a path or a helper call, as in
/// `forEach`) evaluated once per trigger. Later vars may use earlier ones.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Var {
    /// Name; templates read it as `vars.<name>`.
    pub name: String,
    /// The expression, e.g. `groupBy related.types "group"`.
    pub value: String,
}

/// How much of the built-in behaviour the controller manages, after the
/// `--manage` flag of the RBAC manager design this project follows.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ManageLevel {
    /// Roles bound to software (service accounts) only.
    #[serde(rename = "serviceaccounts")]
    ServiceAccounts,
    /// Software roles plus the user-facing cluster-wide roles.
    Basic,
    /// Everything, including namespace roles.
    #[default]
    All,
}

impl ManageLevel {
    fn is_default(&self) -> bool {
        *self == ManageLevel::All
    }

    /// The flag spelling of this level.
    pub fn as_str(&self) -> &'static str {
        match self {
            ManageLevel::ServiceAccounts => "serviceaccounts",
            ManageLevel::Basic => "basic",
            ManageLevel::All => "all",
        }
    }
}

impl fmt::Display for ManageLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What becomes of a rule's objects when the rule is deleted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum DeletionPolicy {
    /// Leave them in place (they keep our labels, so a rule emitting them
    /// again takes them back; remove the label
    /// `app.kubernetes.io/managed-by` to release one entirely).
    #[default]
    Orphan,
    /// Prune them.
    Delete,
}

impl DeletionPolicy {
    fn is_default(&self) -> bool {
        *self == DeletionPolicy::Orphan
    }

    /// Its spelling in the spec and in the annotation.
    pub fn as_str(&self) -> &'static str {
        match self {
            DeletionPolicy::Orphan => "Orphan",
            DeletionPolicy::Delete => "Delete",
        }
    }
}

/// Which objects trigger the rule. An object must pass every filter given.
/// Objects being deleted and objects carrying the pause annotation produce
/// nothing new; the controller leaves their existing outputs untouched.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Trigger {
    /// API group of the trigger kind; empty for the core group (Namespace).
    #[serde(default)]
    pub api_group: String,
    /// Kind of the trigger objects, e.g. `Namespace`.
    pub kind: String,
    /// Version the controller watches. Empty: the version the API server
    /// prefers. Matching ignores versions: an object of the group and kind
    /// at any version triggers the rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Label selector the trigger must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Conditions on the trigger's fields; all must hold. Templates in them
    /// see `trigger`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Label or annotation entries to find on the trigger. When set, an
    /// object with no matching entry does not trigger the rule, and the
    /// matches are available to templates as `matches`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_match: Option<MetadataMatch>,
    /// Templates see only `apiVersion`, `kind` and `metadata` of the
    /// trigger; the controller then watches metadata only (less memory).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub metadata_only: bool,
    /// Only these fields of the trigger are seen, besides its `apiVersion`,
    /// `kind` and `metadata` (always seen): dotted paths of object keys,
    /// e.g. `[spec.group, spec.names]`. Templates, conditions and listFields
    /// see nothing else of it, and the controller keeps only what the rules
    /// reading the kind see (a kind's large fields, such as schemas, are
    /// dropped as they arrive). Default: the whole object. Not with
    /// `metadataOnly`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    /// An annotation that pauses the trigger, e.g. `example.org/paused`
    /// = `"true"`. A paused trigger's outputs are neither created, updated
    /// nor deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<PauseAnnotation>,
    /// Conditions a matching trigger must pass to be rendered, tested after
    /// the filters above (templates see `trigger`). A trigger that fails one
    /// renders nothing (its earlier outputs are pruned) and the rule gets a
    /// warning naming the field and value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub require: Vec<Condition>,
}

/// An annotation key and value that mark a trigger as paused.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PauseAnnotation {
    /// Annotation key.
    pub annotation: String,
    /// Value that means paused. Default: `"true"`.
    #[serde(default = "default_true_string")]
    pub value: String,
}

fn default_true_string() -> String {
    "true".to_string()
}

/// Finds entries of the trigger's labels or annotations by regular
/// expressions over key and value. Both expressions must match the whole
/// key or value. Each match is available to templates as an item of
/// `matches` with `key`, `value` and every named capture group of both
/// expressions, sorted by key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetadataMatch {
    /// Where to look: `annotations` (default) or `labels`.
    #[serde(default)]
    pub source: MetadataSource,
    /// Regular expression the whole key must match, e.g.
    /// `rbac\.example\.org/(?P<kind>.+)`.
    pub key: String,
    /// Regular expression the whole value must match. Default: any value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// Which metadata map a [`MetadataMatch`] reads.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MetadataSource {
    /// `metadata.annotations`.
    #[default]
    Annotations,
    /// `metadata.labels`.
    Labels,
}

/// A test on one value. The value is either a field of the object under test
/// (`path`) or a rendered template (`value`); exactly one operator is given.
/// Operands are templates too. A missing field fails every operator except
/// `exists: false`, `notEquals` and `notRegex`; with `optional` it passes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Dotted field path, e.g. `spec.claimNames.kind` or
    /// `metadata.labels["example.org/team"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A template whose rendered text is tested instead of a field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The value equals this text (numbers and booleans compare as text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<String>,
    /// The value is missing or differs from this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_equals: Option<String>,
    /// The value is one of these texts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<String>>,
    /// The whole value matches this regular expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// The field is present and not null (true) or absent (false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exists: Option<bool>,
    /// The value is missing or its whole text does not match this regular
    /// expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_regex: Option<String>,
    /// An expression yielding a list: the value's text equals the text of
    /// one of its entries, e.g. `pluck related.roles "metadata.name"`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "in")]
    pub in_list: Option<String>,
    /// The value's text is a well-formed name of this kind (see
    /// [`ValueFormat`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<ValueFormat>,
    /// With `path`: a missing (or null) field passes the condition.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// Why the condition exists, shown in the warning when a `require`
    /// condition skips an entry or a trigger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Kinds of names a condition's `format` checks.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ValueFormat {
    /// An RFC 1123 label: at most 63 lowercase letters, digits and `-`,
    /// alphanumeric at both ends (a namespace, a resource's plural).
    DnsLabel,
    /// An RFC 1123 subdomain: dot-separated labels, at most 253 characters.
    DnsSubdomain,
    /// An API group a CustomResourceDefinition may define: a DNS subdomain
    /// with at least one dot, not reserved for Kubernetes (`k8s.io`,
    /// `kubernetes.io` and their subdomains).
    CustomGroup,
    /// A CustomResourceDefinition name `<plural>.<group>`: a `dnsLabel`
    /// plural and a `customGroup` group.
    CrdName,
}

impl ValueFormat {
    /// The name used in rules.
    pub fn as_str(&self) -> &'static str {
        match self {
            ValueFormat::DnsLabel => "dnsLabel",
            ValueFormat::DnsSubdomain => "dnsSubdomain",
            ValueFormat::CustomGroup => "customGroup",
            ValueFormat::CrdName => "crdName",
        }
    }
}

/// A named set of related objects, found from the trigger. Give exactly one
/// source: `objects` (objects in the cluster) or `listField` (entries of a
/// list field of the trigger or of earlier related sets).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Related {
    /// Name of the set; templates read it as `related.<name>`.
    pub name: String,
    /// An expression; when it is false the set is empty (e.g. when the
    /// trigger lacks the label a selector needs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Objects in the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<ObjectQuery>,
    /// Entries of a list field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list_field: Option<ListFieldQuery>,
    /// Conditions every item must pass. Templates see `trigger`, earlier
    /// `related` sets and `item`, the candidate; `path` reads the candidate.
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "where")]
    pub filter: Vec<Condition>,
    /// Conditions every item must pass after `where`, like `where`; an item
    /// that fails one is skipped with a warning naming the field and value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub require: Vec<Condition>,
}

/// Objects of one kind in the cluster, narrowed by owner, namespace, names
/// and labels.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectQuery {
    /// API group; empty for the core group.
    #[serde(default)]
    pub api_group: String,
    /// Kind, e.g. `Deployment`.
    pub kind: String,
    /// Version the controller watches. Empty: the preferred version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Templates see only `apiVersion`, `kind` and `metadata` of these
    /// objects; the controller then watches metadata only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub metadata_only: bool,
    /// Only these fields of each object are seen, besides its `apiVersion`,
    /// `kind` and `metadata` (always seen): dotted paths of object keys, as
    /// the trigger's `fields`. Default: the whole object. Not with
    /// `metadataOnly`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    /// Only objects whose controller ownerReference points at the trigger
    /// (by uid; by kind and name when either has no uid).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub controlled_by_trigger: bool,
    /// Only objects whose controller ownerReference (`controller: true`,
    /// matched by uid) is the trigger or an object of one of these earlier
    /// related sets of objects: `trigger` and/or set names. Other
    /// ownerReferences are ignored: some controllers add them to objects
    /// they did not make. An object with more than one controller
    /// reference has none. Not with `controlledByTrigger` or `ownedBy`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub controlled_by: Vec<String>,
    /// Only objects created no earlier than their controlling ancestor in
    /// this set (`trigger` or the name of an earlier related set of
    /// objects): the first of its objects met walking controller
    /// ownerReferences (by uid) up from the object, through the trigger and
    /// the objects of the sets `controlledBy` names. Compared by
    /// `metadata.creationTimestamp`, which only the API server sets: an
    /// object that existed before its ancestor was taken over, not made by
    /// it. No such ancestor, or a timestamp missing or not RFC 3339: not
    /// kept. Not with `controlledByTrigger` or `ownedBy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_older_than: Option<String>,
    /// Only objects with an ownerReference (controller or not, matched by
    /// uid) to one of these: `trigger` and/or names of earlier related sets
    /// of objects (any of their objects). Weak proof of lineage: some
    /// controllers add non-controller ownerReferences to objects they did
    /// not make (`validate` warns); prefer `controlledBy` with
    /// `notOlderThan`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owned_by: Vec<String>,
    /// Template: only objects in this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Only objects with one of these names: a template list (see
    /// `outputs[].rules` for the list syntax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::template_list_schema")]
    pub names: Option<Value>,
    /// Label selector with templated values (matchLabels values and
    /// matchExpressions values are rendered first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// Entries of a list field, each extended with the named captures of an
/// optional regular expression. Entries whose field does not match the
/// expression are dropped, kept or warned about (`extract.unmatched`).
/// Duplicates are removed; the result is sorted.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListFieldQuery {
    /// Dotted path of the list, e.g. `status.objectRefs`.
    pub path: String,
    /// Objects to read the list from: `trigger` and/or names of earlier
    /// related sets. Default: `[trigger]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub of: Vec<String>,
    /// Extracts named captures from a field of each entry; they are added
    /// to the entry (see `unmatched` for entries whose field does not match).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extract: Option<Extract>,
    /// Keeps only these fields of each entry (after `extract`): dotted
    /// paths of object keys, e.g. `[name, plural, group]`. The rest of each
    /// entry is dropped as it is read, so a rule that reads a few fields of
    /// large entries holds only those; a path an entry lacks is left out,
    /// and an entry that is not a map is kept whole. Default: every field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
}

/// A regular expression applied to a field of each list entry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Extract {
    /// Dotted path of the field within the entry, e.g. `name`.
    pub path: String,
    /// Regular expression with named groups, matched against the whole
    /// field, e.g. `(?P<plural>[^.]+)\.(?P<group>.+)`.
    pub regex: String,
    /// What becomes of an entry whose field does not match: `drop`
    /// (default), `keep` (without captures) or `warn` (dropped with a
    /// warning).
    #[serde(default, skip_serializing_if = "Unmatched::is_drop")]
    pub unmatched: Unmatched,
}

/// What `extract` does with an entry it cannot match.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Unmatched {
    /// Dropped silently.
    #[default]
    Drop,
    /// Kept as it is, without captures (for `where` or `require` to judge).
    Keep,
    /// Dropped with a warning.
    Warn,
}

impl Unmatched {
    fn is_drop(&self) -> bool {
        *self == Unmatched::Drop
    }
}

/// One object to emit. String fields are handlebars templates rendered in
/// strict mode: a missing variable is an error, never an empty string.
/// Templates see `rule` (`name`), `trigger` (the object, absent for static
/// rules), `matches`, `related.<name>` and loop variables.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Output {
    /// `ClusterRole`, `Role`, `ClusterRoleBinding` or `RoleBinding`.
    pub kind: OutputKind,
    /// An expression: emit one object per item of the list it yields, with
    /// the item bound to the name given by `as`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<String>,
    /// Loop variable name for `forEach`. Default: `item`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "as")]
    pub as_name: Option<String>,
    /// An expression; the object is emitted only when it is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Template for `metadata.name`.
    pub name: String,
    /// Template for `metadata.namespace` (Role and RoleBinding only).
    /// Default for those kinds: the trigger's namespace, or the trigger's
    /// name when the trigger is a Namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Labels: keys and values are templates; a `$merge` key takes a
    /// template list of maps merged in (e.g. one label per namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::template_map_schema")]
    pub labels: Option<Value>,
    /// Annotations, templated like `labels`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::template_map_schema")]
    pub annotations: Option<Value>,
    /// PolicyRules (ClusterRole, Role) as a template list: every string is
    /// a template, and a list item of the form `{forEach, as, when, item}`
    /// expands to zero or more items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::template_list_schema")]
    pub rules: Option<Value>,
    /// Approximated aggregation: the rules of the ClusterRoles selected here
    /// (observed ones and those emitted by other rules) are appended to
    /// `rules`, de-duplicated by RBAC coverage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules_from: Option<RulesFrom>,
    /// ClusterRole aggregationRule as a template (clusterRoleSelectors).
    /// An aggregated ClusterRole is emitted without a `rules` field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::template_object_schema")]
    pub aggregation_rule: Option<Value>,
    /// Binding roleRef: `kind` (ClusterRole or Role) and `name` templates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_ref: Option<RoleRefTemplate>,
    /// Binding subjects as a template list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::template_list_schema")]
    pub subjects: Option<Value>,
}

/// Kinds of object a rule can emit.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
pub enum OutputKind {
    /// rbac.authorization.k8s.io/v1 ClusterRole.
    #[default]
    ClusterRole,
    /// rbac.authorization.k8s.io/v1 Role.
    Role,
    /// rbac.authorization.k8s.io/v1 ClusterRoleBinding.
    ClusterRoleBinding,
    /// rbac.authorization.k8s.io/v1 RoleBinding.
    RoleBinding,
}

impl OutputKind {
    /// Every kind, in output sort order.
    pub const ALL: [OutputKind; 4] = [
        OutputKind::ClusterRole,
        OutputKind::ClusterRoleBinding,
        OutputKind::Role,
        OutputKind::RoleBinding,
    ];

    /// The Kubernetes kind name.
    pub fn as_str(&self) -> &'static str {
        match self {
            OutputKind::ClusterRole => "ClusterRole",
            OutputKind::Role => "Role",
            OutputKind::ClusterRoleBinding => "ClusterRoleBinding",
            OutputKind::RoleBinding => "RoleBinding",
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn namespaced(&self) -> bool {
        matches!(self, OutputKind::Role | OutputKind::RoleBinding)
    }

    /// Whether this kind is a role (carries rules) rather than a binding.
    pub fn is_role(&self) -> bool {
        matches!(self, OutputKind::Role | OutputKind::ClusterRole)
    }

    /// Parses a Kubernetes kind name.
    pub fn parse(kind: &str) -> Option<OutputKind> {
        OutputKind::ALL.into_iter().find(|k| k.as_str() == kind)
    }
}

impl fmt::Display for OutputKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where approximated aggregation copies rules from. ClusterRoles matching
/// any of `names` or `selector` contribute their rules; names that do not
/// exist contribute nothing.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RulesFrom {
    /// ClusterRole names, as a template list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::template_list_schema")]
    pub cluster_role_names: Option<Value>,
    /// Label selector over ClusterRoles, with templated values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_role_selector: Option<LabelSelector>,
}

/// A binding's roleRef; `apiGroup` is always rbac.authorization.k8s.io.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleRefTemplate {
    /// Template: `ClusterRole` or `Role`.
    pub kind: String,
    /// Template for the role name.
    pub name: String,
}

/// What the controller last did with a rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RbacRuleStatus {
    /// `Ready` (all outputs applied) and `Degraded` (an evaluation, watch,
    /// conflict or API error; the message says which).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<MetaCondition>,
    /// The generation of the spec these conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Number of objects that currently trigger the rule.
    #[serde(default)]
    pub matched_triggers: i64,
    /// Number of objects the rule currently manages.
    #[serde(default)]
    pub managed_objects: i64,
}

/// Schema of a template list: any list (items are templates or directives).
pub(crate) fn template_list_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": { "x-kubernetes-preserve-unknown-fields": true }
    })
}

/// Schema of a template map: string keys, template values, `$merge` lists.
pub(crate) fn template_map_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Schema of a template object.
pub(crate) fn template_object_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}
