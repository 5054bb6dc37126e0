//! Validation and compilation of rules: every template, expression, regular
//! expression and selector is checked once, before any object is rendered,
//! and every error names the field of the rule's spec.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use regex::Regex;
use serde_json::Value;

/// Directives are parsed in [`super::directive`]; this path stays for callers.
pub use super::directive::{Body, Directive, directive};
use super::error::{ErrorKind, FieldError};
use super::fast_hash::HashMap;
use super::incremental::keys::Derivation;
/// Kind facts live in [`super::kinds`]; these paths stay for callers.
pub use super::kinds::{gk_of, output_gk, output_kind};
use super::path::FieldPath;
use super::store::GroupKind;
use super::template::{Templates, mentions_text, named_reads, trigger_paths};
use crate::api::{
    Condition, ListFieldQuery, ObjectQuery, Output, OutputKind, RbacRuleSpec, Trigger,
};

/// Names templates may not use for loop variables or related sets.
pub const RESERVED: &[&str] = &[
    "rule", "trigger", "matches", "related", "vars", "item", "params",
];

/// How much of an object a rule's trigger or related set sees.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sight<'a> {
    /// Only `apiVersion`, `kind` and `metadata` (`metadataOnly`).
    pub metadata_only: bool,
    /// Only these paths (`fields`, with `apiVersion`, `kind` and
    /// `metadata`); `None`: every path.
    pub fields: Option<&'a [Vec<String>]>,
    /// Which view of its rule this is, when a view of fields (cache keys
    /// tell views of one object apart by it): see [`Sight::key`].
    pub id: usize,
}

impl Sight<'_> {
    /// The whole object, or its metadata only, with no `fields`.
    #[cfg(test)]
    pub fn plain(metadata_only: bool) -> Sight<'static> {
        Sight {
            metadata_only,
            fields: None,
            id: 0,
        }
    }

    /// A number for this view in cache keys: 0 whole, 1 metadata only,
    /// else its own.
    pub fn key(&self) -> usize {
        if self.metadata_only {
            1
        } else if self.fields.is_some() {
            self.id
        } else {
            0
        }
    }
}

/// A rule that passed validation.
pub struct CompiledRule {
    pub name: String,
    pub spec: RbacRuleSpec,
    /// Regular expressions by their source text (anchored to the whole value).
    pub regexes: HashMap<String, Regex>,
    /// Kinds the rule reads, and how: its trigger, related objects,
    /// rulesFrom. The one source of both the controller's watches
    /// ([`super::Engine::interests`]) and incremental invalidation.
    pub interests: Vec<Interest>,
    /// The kinds of `interests`.
    pub consumes: BTreeSet<GroupKind>,
    /// Kinds the rule emits.
    pub produces: BTreeSet<GroupKind>,
    /// What its cached lists and vars are computed from, as JSON: rules
    /// that agree on some share those values (see [`Derivation::common`]).
    pub derivation: Derivation,
    /// Related object sets no template or expression reads (only a
    /// listField's `of` names them): their objects are read where the
    /// store holds them, never copied into the render's context.
    pub unread: BTreeSet<String>,
    /// Related object sets read only by their truth (a `when` whose whole
    /// text is `related.<name>`): the render's context holds as many nulls
    /// as the set has objects, not copies of them.
    pub presence: BTreeSet<String>,
    /// The paths below `trigger` its texts read, when they read it only by
    /// such paths: the trigger is bound to templates as those parts of it
    /// (see [`super::expand::project`]), not copied whole.
    pub trigger_paths: Option<Vec<Vec<String>>>,
    /// What of its trigger the rule sees, when it names `fields`
    /// ([`super::path::seen_fields`]); `None`: all it may see.
    pub trigger_fields: Option<Vec<Vec<String>>>,
    /// The same of each related set of objects, by position.
    pub related_fields: Vec<Option<Vec<Vec<String>>>>,
    /// Each output's field (`spec.outputs[i]`), spelled once: every
    /// object an output emits names it.
    pub output_fields: Vec<std::sync::Arc<str>>,
    /// The values of the params it declares (`params.<name>`): defaults,
    /// then [`CompiledRule::set_params`].
    pub params: serde_json::Map<String, Value>,
    /// The templates and expressions it compiled: what an engine that
    /// reuses the rule copies into its registry (set by `order::prepare`).
    pub registered: std::sync::Arc<super::template::Registered>,
}

impl CompiledRule {
    /// How much of its trigger the rule sees.
    pub(super) fn trigger_seen(&self) -> Sight<'_> {
        Sight {
            metadata_only: self.spec.trigger.as_ref().is_some_and(|t| t.metadata_only),
            fields: self.trigger_fields.as_deref(),
            id: 2,
        }
    }

    /// How much of the objects of related set `i` the rule sees.
    pub(super) fn related_seen(&self, i: usize) -> Sight<'_> {
        let q = self.spec.related.get(i).and_then(|r| r.objects.as_ref());
        Sight {
            metadata_only: q.is_some_and(|q| q.metadata_only),
            fields: self.related_fields.get(i).and_then(Option::as_deref),
            id: 3 + i,
        }
    }

    /// [`CompiledRule::related_seen`] of the set of objects named `name`.
    pub(super) fn related_seen_named(&self, name: &str) -> Option<Sight<'_>> {
        let i = self
            .spec
            .related
            .iter()
            .position(|r| r.name == name && r.objects.is_some())?;
        Some(self.related_seen(i))
    }

    /// Gives the declared params the installation's values (`--param`);
    /// the others keep their defaults. A value without the declared
    /// format is an error of the rule, naming the param, the value, the
    /// format and where the value was given (`origins`).
    pub fn set_params(
        &mut self,
        given: &BTreeMap<String, String>,
        origins: &BTreeMap<String, crate::params::Origin>,
    ) -> Result<(), FieldError> {
        for (i, p) in self.spec.params.iter().enumerate() {
            let Some(v) = given.get(&p.name) else {
                continue;
            };
            if let Some(f) = p.format
                && !super::format::check(f, v)
            {
                return Err(FieldError::new(
                    ErrorKind::InvalidRule,
                    format!("spec.params[{i}]"),
                    format!(
                        "param {}: {v:?} (from {}) is not a valid {}",
                        p.name,
                        origins
                            .get(&p.name)
                            .unwrap_or(&crate::params::Origin::Flag)
                            .describe(&p.name),
                        f.as_str()
                    ),
                ));
            }
            self.params.insert(p.name.clone(), Value::String(v.clone()));
        }
        self.derivation = Derivation::of(&self.spec, &self.params);
        Ok(())
    }
}

/// The spec with the names that are not templates taken out: each related
/// set's own, and a listField's sources (`of`).
fn without_names(spec: &RbacRuleSpec) -> Option<Value> {
    let mut v = serde_json::to_value(spec).ok()?;
    // Param declarations are not texts (their values are data).
    if let Some(m) = v.as_object_mut() {
        m.remove("params");
    }
    for r in v
        .get_mut("related")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(m) = r.as_object_mut() {
            m.remove("name");
        }
        if let Some(m) = r.get_mut("listField").and_then(Value::as_object_mut) {
            m.remove("of");
        }
        // Names of sets, not texts: the engine reads their uids itself.
        if let Some(m) = r.get_mut("objects").and_then(Value::as_object_mut) {
            m.remove("ownedBy");
            m.remove("controlledBy");
            m.remove("notOlderThan");
        }
    }
    Some(v)
}

/// Every text of `spec` (from [`without_names`]) a render could read the
/// context by: each string and map key below the spec's fields (their own
/// names are not texts: one is `related`), with the key of the map a
/// string is the value of (`None` for keys and list items).
fn spec_texts(spec: &Value) -> Vec<(Option<&str>, &str)> {
    fn texts<'v>(v: &'v Value, key: Option<&'v str>, out: &mut Vec<(Option<&'v str>, &'v str)>) {
        match v {
            Value::String(s) => out.push((key, s)),
            Value::Array(a) => a.iter().for_each(|x| texts(x, None, out)),
            Value::Object(m) => m.iter().for_each(|(k, x)| {
                out.push((None, k));
                texts(x, Some(k), out);
            }),
            _ => {}
        }
    }
    let mut all = Vec::new();
    for x in spec.as_object().into_iter().flat_map(|m| m.values()) {
        texts(x, None, &mut all);
    }
    all
}

/// The related object sets nothing reads but a listField's `of`: none
/// when any text could read `related` as a whole or by an unknown name
/// (`texts` from [`spec_texts`], none of which reads the whole context).
fn unread_related(spec: &RbacRuleSpec, texts: &[&str]) -> BTreeSet<String> {
    let sets = spec
        .related
        .iter()
        .filter(|r| r.objects.is_some())
        .map(|r| r.name.as_str());
    let names: Vec<&str> = spec.related.iter().map(|r| r.name.as_str()).collect();
    match named_reads(texts, "related", &names) {
        Some(read) => sets
            .filter(|n| !read.iter().any(|r| r == n))
            .map(str::to_string)
            .collect(),
        None => BTreeSet::new(),
    }
}

/// The related object sets whose every read is a truth test: each text
/// (from [`spec_texts`]) that reads one is a `when` whose whole text is
/// `related.<name>`, and no listField's `of`, `ownedBy`, `controlledBy` or
/// `notOlderThan` names it (those read its objects).
fn presence_related(spec: &RbacRuleSpec, all: &[(Option<&str>, &str)]) -> BTreeSet<String> {
    let names: Vec<&str> = spec.related.iter().map(|r| r.name.as_str()).collect();
    let mut truth = BTreeSet::new();
    let mut other: BTreeSet<String> = spec
        .related
        .iter()
        .flat_map(|r| {
            let of = r.list_field.iter().flat_map(|l| l.of.iter());
            let owners = r.objects.iter().flat_map(|q| {
                let lineage = q.controlled_by.iter().chain(&q.not_older_than);
                q.owned_by.iter().chain(lineage)
            });
            of.chain(owners).cloned()
        })
        .collect();
    for &(key, text) in all {
        let Some(read) = named_reads(&[text], "related", &names) else {
            return BTreeSet::new();
        };
        for name in read {
            if key == Some("when") && text.trim().strip_prefix("related.") == Some(name.as_str()) {
                truth.insert(name);
            } else {
                other.insert(name);
            }
        }
    }
    spec.related
        .iter()
        .filter(|r| r.objects.is_some() && truth.contains(&r.name) && !other.contains(&r.name))
        .map(|r| r.name.clone())
        .collect()
}

/// A kind the rules read, and how: what the controller must watch.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Interest {
    /// Group and kind.
    pub gk: GroupKind,
    /// A version named by a rule, if any.
    pub version: Option<String>,
    /// Whether metadata is all any rule reads of this kind.
    pub metadata_only: bool,
    /// The paths every rule reading this kind sees of its objects, when
    /// each reader names them (`fields`, or `metadataOnly`): `apiVersion`,
    /// `kind`, `metadata` and the union of the named fields. `None`: some
    /// rule sees objects whole.
    pub fields: Option<Vec<Vec<String>>>,
    /// Whether every reader reads this kind's objects one at a time, by
    /// key: as its rule's trigger (rendered again only when it changes),
    /// or as the tenancy ceiling's Namespace. Then the controller's store
    /// holds them packed ([`super::store::ObjectStore::pack_kinds`]); a
    /// related set lists a kind and reads its objects many times over.
    pub packable: bool,
}

impl Interest {
    /// Whether one watch serves both: the same kind, version and fields
    /// (how the store holds the objects is no matter of the watch).
    pub fn watched_as(&self, other: &Interest) -> bool {
        (&self.gk, &self.version, self.metadata_only, &self.fields)
            == (
                &other.gk,
                &other.version,
                other.metadata_only,
                &other.fields,
            )
    }

    /// An interest in `gk` by one reader seeing objects as `metadata_only`
    /// and `fields` say, reading them one at a time if `packable`.
    fn of(
        gk: GroupKind,
        version: Option<String>,
        (metadata_only, fields): (bool, &[String]),
        packable: bool,
    ) -> Self {
        let seen = (metadata_only || !fields.is_empty())
            .then(|| super::path::seen_fields(if metadata_only { &[] } else { fields }));
        Interest {
            gk,
            version,
            metadata_only,
            fields: seen,
            packable,
        }
    }

    /// `obj` as the readers of this kind see it, at most: only the paths
    /// of [`Interest::fields`] when each reader names them.
    pub fn keep(&self, obj: Value) -> Value {
        match &self.fields {
            Some(paths) if !super::path::fits_fields(&obj, paths) => {
                super::path::keep_fields(std::borrow::Cow::Owned(obj), paths)
            }
            _ => obj,
        }
    }
}

/// The kinds a rule's spec reads — the trigger, related object queries,
/// the ClusterRoles of rulesFrom — merged per kind.
pub(super) fn interests_of(spec: &RbacRuleSpec) -> Vec<Interest> {
    let mut out = Vec::new();
    if let Some(t) = &spec.trigger {
        out.push(Interest::of(
            GroupKind::new(&t.api_group, &t.kind),
            t.version.clone(),
            (t.metadata_only, &t.fields),
            true,
        ));
    }
    for q in spec.related.iter().filter_map(|rel| rel.objects.as_ref()) {
        out.push(Interest::of(
            GroupKind::new(&q.api_group, &q.kind),
            q.version.clone(),
            (q.metadata_only, &q.fields),
            false,
        ));
    }
    if spec.outputs.iter().any(|o| o.rules_from.is_some()) {
        out.push(Interest::of(
            output_gk(OutputKind::ClusterRole),
            None,
            (false, &[]),
            false,
        ));
    }
    merge_interests(out)
}

/// One interest per kind: metadata-only only if every reader says so, the
/// fields of every reader when each names them, packable only if every
/// reader reads one object at a time; the first version named wins.
pub fn merge_interests(items: impl IntoIterator<Item = Interest>) -> Vec<Interest> {
    let mut out: BTreeMap<GroupKind, Interest> = BTreeMap::new();
    for i in items {
        let e = out.entry(i.gk.clone()).or_insert_with(|| Interest {
            gk: i.gk,
            version: None,
            metadata_only: true,
            fields: Some(Vec::new()),
            packable: true,
        });
        e.metadata_only &= i.metadata_only;
        e.packable &= i.packable;
        e.fields = match (e.fields.take(), i.fields) {
            (Some(mut a), Some(b)) => {
                a.extend(b);
                a.sort();
                a.dedup();
                Some(a)
            }
            _ => None,
        };
        if e.version.is_none() {
            e.version = i.version;
        }
    }
    out.into_values().collect()
}

/// Compiles `text` as a regular expression matching a whole value.
pub fn anchored(text: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!("^(?:{text})$"))
}

struct Compiler<'a> {
    templates: &'a mut Templates,
    regexes: HashMap<String, Regex>,
    errors: Vec<FieldError>,
}

impl Compiler<'_> {
    fn err(&mut self, kind: ErrorKind, field: impl Into<String>, msg: impl Into<String>) {
        self.errors.push(FieldError::new(kind, field, msg));
    }

    /// A list of paths of object keys at `at` (`at[j]`): each one that is
    /// not is an error.
    fn key_paths(&mut self, at: &str, paths: &[String]) {
        for (j, p) in paths.iter().enumerate() {
            if let Err(e) = super::path::field_keys(p) {
                self.err(ErrorKind::InvalidRule, format!("{at}[{j}]"), e);
            }
        }
    }

    /// A trigger's or object query's `fields` (at `at`): paths of object
    /// keys, and not beside `metadataOnly`.
    fn fields(&mut self, at: &str, fields: &[String], metadata_only: bool) {
        self.key_paths(&format!("{at}.fields"), fields);
        if metadata_only && !fields.is_empty() {
            self.err(
                ErrorKind::InvalidRule,
                format!("{at}.fields"),
                "give at most one of metadataOnly and fields (metadataOnly sees metadata only)",
            );
        }
    }

    fn template(&mut self, field: &str, text: &str) {
        if let Err((kind, e)) = self.templates.compile(text) {
            self.err(kind, field, e);
        }
    }

    fn expr(&mut self, field: &str, text: &str) {
        if let Err((kind, e)) = self.templates.compile_expr(text) {
            self.err(kind, field, e);
        }
    }

    /// A regex given literally is compiled now; a templated one is checked
    /// as a template and compiled after rendering.
    fn regex(&mut self, field: &str, text: &str) {
        if !Templates::is_literal(text) {
            self.template(field, text);
            return;
        }
        match anchored(text) {
            Ok(re) => {
                self.regexes.insert(text.to_string(), re);
            }
            Err(e) => self.err(
                ErrorKind::Regex,
                field,
                format!("invalid regular expression: {e}"),
            ),
        }
    }

    fn path(&mut self, field: &str, text: &str) {
        if let Err(e) = FieldPath::parse(text) {
            self.err(ErrorKind::InvalidRule, field, e);
        }
    }

    fn identifier(&mut self, field: &str, name: &str) {
        let ok = !name.is_empty()
            && name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            self.err(
                ErrorKind::InvalidRule,
                field,
                format!("{name:?} is not a valid variable name (letters, digits, _)"),
            );
        } else if RESERVED.contains(&name) && field.ends_with(".as") {
            self.err(
                ErrorKind::InvalidRule,
                field,
                format!("{name:?} is reserved"),
            );
        }
    }

    fn condition(&mut self, field: &str, c: &Condition) {
        match (&c.path, &c.value) {
            (Some(p), None) => self.path(&format!("{field}.path"), p),
            (None, Some(v)) => self.template(&format!("{field}.value"), v),
            _ => self.err(
                ErrorKind::InvalidRule,
                field,
                "give exactly one of path and value",
            ),
        }
        let ops = [
            c.equals.is_some(),
            c.not_equals.is_some(),
            c.one_of.is_some(),
            c.regex.is_some(),
            c.exists.is_some(),
            c.not_regex.is_some(),
            c.in_list.is_some(),
            c.format.is_some(),
        ];
        if ops.iter().filter(|b| **b).count() != 1 {
            self.err(
                ErrorKind::InvalidRule,
                field,
                "give exactly one of equals, notEquals, oneOf, regex, notRegex, in, format, exists",
            );
        }
        if c.optional && (c.path.is_none() || c.exists.is_some()) {
            self.err(
                ErrorKind::InvalidRule,
                format!("{field}.optional"),
                "optional needs path (and no exists)",
            );
        }
        if c.exists.is_some() && c.path.is_none() {
            self.err(
                ErrorKind::InvalidRule,
                format!("{field}.exists"),
                "exists needs path",
            );
        }
        if let Some(t) = &c.equals {
            self.template(&format!("{field}.equals"), t);
        }
        if let Some(t) = &c.not_equals {
            self.template(&format!("{field}.notEquals"), t);
        }
        for (i, t) in c.one_of.iter().flatten().enumerate() {
            self.template(&format!("{field}.oneOf[{i}]"), t);
        }
        if let Some(r) = &c.regex {
            self.regex(&format!("{field}.regex"), r);
        }
        if let Some(r) = &c.not_regex {
            self.regex(&format!("{field}.notRegex"), r);
        }
        if let Some(e) = &c.in_list {
            self.expr(&format!("{field}.in"), e);
        }
    }

    fn selector(&mut self, field: &str, sel: &LabelSelector) {
        for (k, v) in sel.match_labels.iter().flatten() {
            self.template(&format!("{field}.matchLabels[{k:?}]"), k);
            self.template(&format!("{field}.matchLabels[{k:?}]"), v);
        }
        for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
            let f = format!("{field}.matchExpressions[{i}]");
            self.template(&format!("{f}.key"), &e.key);
            if !matches!(
                e.operator.as_str(),
                "In" | "NotIn" | "Exists" | "DoesNotExist"
            ) {
                self.err(
                    ErrorKind::Selector,
                    format!("{f}.operator"),
                    format!("unknown operator {:?}", e.operator),
                );
            }
            for (j, v) in e.values.iter().flatten().enumerate() {
                self.template(&format!("{f}.values[{j}]"), v);
            }
        }
    }

    /// Walks a template value: strings are templates, `{forEach, as, when,
    /// item|items}` list entries are directives, `$merge` merges maps.
    fn tvalue(&mut self, field: &str, v: &Value) {
        match v {
            Value::String(s) => self.template(field, s),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let f = format!("{field}[{i}]");
                    match directive(item) {
                        Ok(Some(d)) => {
                            if let Some(e) = d.for_each {
                                self.expr(&format!("{f}.forEach"), e);
                            }
                            if let Some(a) = d.as_name {
                                self.identifier(&format!("{f}.as"), a);
                            }
                            if let Some(w) = d.when {
                                self.expr(&format!("{f}.when"), w);
                            }
                            match d.body {
                                Body::Item(b) => self.tvalue(&format!("{f}.item"), b),
                                Body::Items(b) => self.tvalue(&format!("{f}.items"), b),
                            }
                        }
                        Ok(None) => self.tvalue(&f, item),
                        Err(msg) => self.err(ErrorKind::InvalidRule, f, msg),
                    }
                }
            }
            Value::Object(map) => {
                for (k, val) in map {
                    if k == "$merge" {
                        if !val.is_array() {
                            self.err(
                                ErrorKind::InvalidRule,
                                format!("{field}.$merge"),
                                "$merge takes a list of maps",
                            );
                        }
                        self.tvalue(&format!("{field}.$merge"), val);
                    } else {
                        self.template(&format!("{field}[{k:?}]"), k);
                        self.tvalue(&format!("{field}.{k}"), val);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Validates and compiles one rule; templates go into `templates`. Each
/// part of the spec is checked in turn (errors in the spec's order), and a
/// rule without errors is compiled with what the engine works out once.
pub fn compile(
    name: &str,
    spec: &RbacRuleSpec,
    templates: &mut Templates,
) -> Result<CompiledRule, Vec<FieldError>> {
    let mut c = Compiler {
        templates,
        regexes: HashMap::default(),
        errors: Vec::new(),
    };
    if let Some(t) = &spec.trigger {
        check_trigger(&mut c, t);
    }
    check_related(&mut c, spec);
    check_params(&mut c, spec);
    check_vars(&mut c, spec);
    check_outputs(&mut c, spec);
    if c.errors.is_empty() {
        Ok(compiled(name, spec, c.regexes))
    } else {
        Err(c.errors)
    }
}

/// Checks the trigger.
fn check_trigger(c: &mut Compiler, t: &Trigger) {
    if t.kind.is_empty() {
        c.err(
            ErrorKind::InvalidRule,
            "spec.trigger.kind",
            "kind is required",
        );
    }
    if let Some(sel) = &t.selector {
        // Trigger selectors are literal: nothing to render them from.
        if let Err(e) = crate::selector::validate(sel) {
            c.err(ErrorKind::Selector, "spec.trigger.selector", e.to_string());
        }
    }
    for (i, cond) in t.conditions.iter().enumerate() {
        c.condition(&format!("spec.trigger.conditions[{i}]"), cond);
    }
    for (i, cond) in t.require.iter().enumerate() {
        c.condition(&format!("spec.trigger.require[{i}]"), cond);
    }
    if let Some(m) = &t.metadata_match {
        c.regex("spec.trigger.metadataMatch.key", &m.key);
        if !Templates::is_literal(&m.key) {
            c.err(
                ErrorKind::InvalidRule,
                "spec.trigger.metadataMatch.key",
                "must not be a template",
            );
        }
        if let Some(v) = &m.value {
            c.regex("spec.trigger.metadataMatch.value", v);
            if !Templates::is_literal(v) {
                c.err(
                    ErrorKind::InvalidRule,
                    "spec.trigger.metadataMatch.value",
                    "must not be a template",
                );
            }
        }
    }
    if let Some(p) = &t.pause
        && p.annotation.is_empty()
    {
        c.err(
            ErrorKind::InvalidRule,
            "spec.trigger.pause.annotation",
            "annotation is required",
        );
    }
    c.fields("spec.trigger", &t.fields, t.metadata_only);
}

/// Checks the related sets: names, and each set's query or list field.
fn check_related(c: &mut Compiler, spec: &RbacRuleSpec) {
    let mut related_names: BTreeSet<&str> = BTreeSet::new();
    for (i, r) in spec.related.iter().enumerate() {
        let f = format!("spec.related[{i}]");
        c.identifier(&format!("{f}.name"), &r.name);
        if !related_names.insert(r.name.as_str()) {
            c.err(
                ErrorKind::InvalidRule,
                format!("{f}.name"),
                format!("duplicate related name {:?}", r.name),
            );
        }
        if let Some(w) = &r.when {
            c.expr(&format!("{f}.when"), w);
        }
        match (&r.objects, &r.list_field) {
            (Some(q), None) => check_objects_query(c, spec, i, &f, q),
            (None, Some(l)) => check_list_field(c, spec, i, &f, l),
            _ => c.err(
                ErrorKind::InvalidRule,
                f.clone(),
                "give exactly one of objects and listField",
            ),
        }
        for (j, cond) in r.filter.iter().enumerate() {
            c.condition(&format!("{f}.where[{j}]"), cond);
        }
        for (j, cond) in r.require.iter().enumerate() {
            c.condition(&format!("{f}.require[{j}]"), cond);
        }
    }
}

/// Checks a related set's query of objects (set `i`, at `f`).
fn check_objects_query(c: &mut Compiler, spec: &RbacRuleSpec, i: usize, f: &str, q: &ObjectQuery) {
    if q.kind.is_empty() {
        c.err(
            ErrorKind::InvalidRule,
            format!("{f}.objects.kind"),
            "kind is required",
        );
    }
    if q.controlled_by_trigger && spec.trigger.is_none() {
        c.err(
            ErrorKind::InvalidRule,
            format!("{f}.objects.controlledByTrigger"),
            "needs a trigger",
        );
    }
    c.fields(&format!("{f}.objects"), &q.fields, q.metadata_only);
    let filters = [
        (q.controlled_by_trigger, "controlledByTrigger"),
        (!q.owned_by.is_empty(), "ownedBy"),
        (
            !q.controlled_by.is_empty() || q.not_older_than.is_some(),
            if q.controlled_by.is_empty() {
                "notOlderThan"
            } else {
                "controlledBy"
            },
        ),
    ];
    let given: Vec<&str> = filters
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
    if let [_, second, ..] = given[..] {
        c.err(
            ErrorKind::InvalidRule,
            format!("{f}.objects.{second}"),
            "give at most one of controlledByTrigger, ownedBy and controlledBy (with notOlderThan)",
        );
    }
    // Set names: the trigger or an earlier related set of objects.
    let known = |of: &str| {
        if of == "trigger" {
            spec.trigger.is_some()
        } else {
            spec.related[..i]
                .iter()
                .any(|p| p.name == of && p.objects.is_some())
        }
    };
    let named = q
        .owned_by
        .iter()
        .enumerate()
        .map(|(j, of)| (format!("{f}.objects.ownedBy[{j}]"), of))
        .chain(
            q.controlled_by
                .iter()
                .enumerate()
                .map(|(j, of)| (format!("{f}.objects.controlledBy[{j}]"), of)),
        )
        .chain(
            q.not_older_than
                .iter()
                .map(|of| (format!("{f}.objects.notOlderThan"), of)),
        );
    for (field, of) in named {
        if !known(of) {
            c.err(
                ErrorKind::InvalidRule,
                field,
                format!("{of:?} is neither the trigger nor an earlier related set of objects"),
            );
        }
    }
    if let Some(ns) = &q.namespace {
        c.template(&format!("{f}.objects.namespace"), ns);
    }
    if let Some(n) = &q.names {
        c.tvalue(&format!("{f}.objects.names"), n);
    }
    if let Some(s) = &q.selector {
        c.selector(&format!("{f}.objects.selector"), s);
    }
}

/// Checks a related set's list field (set `i`, at `f`).
fn check_list_field(c: &mut Compiler, spec: &RbacRuleSpec, i: usize, f: &str, l: &ListFieldQuery) {
    c.path(&format!("{f}.listField.path"), &l.path);
    for (j, of) in l.of.iter().enumerate() {
        let known = if of == "trigger" {
            spec.trigger.is_some()
        } else {
            spec.related[..i].iter().any(|p| &p.name == of)
        };
        if !known {
            c.err(
                ErrorKind::InvalidRule,
                format!("{f}.listField.of[{j}]"),
                format!("{of:?} is neither the trigger nor an earlier related set"),
            );
        }
    }
    if l.of.is_empty() && spec.trigger.is_none() {
        c.err(
            ErrorKind::InvalidRule,
            format!("{f}.listField.of"),
            "a static rule must name the sets to read",
        );
    }
    c.key_paths(&format!("{f}.listField.fields"), &l.fields);
    if let Some(x) = &l.extract {
        c.path(&format!("{f}.listField.extract.path"), &x.path);
        c.regex(&format!("{f}.listField.extract.regex"), &x.regex);
        if !Templates::is_literal(&x.regex) {
            c.err(
                ErrorKind::InvalidRule,
                format!("{f}.listField.extract.regex"),
                "must not be a template",
            );
        }
    }
}

/// Checks the params: names and defaults.
fn check_params(c: &mut Compiler, spec: &RbacRuleSpec) {
    let mut param_names: BTreeSet<&str> = BTreeSet::new();
    for (i, p) in spec.params.iter().enumerate() {
        let f = format!("spec.params[{i}]");
        c.identifier(&format!("{f}.name"), &p.name);
        if !param_names.insert(p.name.as_str()) {
            c.err(
                ErrorKind::InvalidRule,
                format!("{f}.name"),
                format!("duplicate param name {:?}", p.name),
            );
        }
        if let Some(fmt) = p.format
            && !super::format::check(fmt, &p.default)
        {
            c.err(
                ErrorKind::InvalidRule,
                format!("{f}.default"),
                format!("{:?} is not a valid {}", p.default, fmt.as_str()),
            );
        }
    }
}

/// Checks the vars: names and expressions.
fn check_vars(c: &mut Compiler, spec: &RbacRuleSpec) {
    let mut var_names: BTreeSet<&str> = BTreeSet::new();
    for (i, v) in spec.vars.iter().enumerate() {
        let f = format!("spec.vars[{i}]");
        c.identifier(&format!("{f}.name"), &v.name);
        if !var_names.insert(v.name.as_str()) {
            c.err(
                ErrorKind::InvalidRule,
                format!("{f}.name"),
                format!("duplicate var name {:?}", v.name),
            );
        }
        c.expr(&format!("{f}.value"), &v.value);
    }
}

/// Checks the outputs: at least one, each its templates and then the
/// fields its kind takes.
fn check_outputs(c: &mut Compiler, spec: &RbacRuleSpec) {
    if spec.outputs.is_empty() {
        c.err(
            ErrorKind::InvalidRule,
            "spec.outputs",
            "at least one output is required",
        );
    }
    for (i, o) in spec.outputs.iter().enumerate() {
        let f = format!("spec.outputs[{i}]");
        check_output_meta(c, &f, o);
        check_output_kind_fields(c, &f, o);
        check_output_kind_values(c, &f, o);
    }
}

/// Checks an output's loop, condition, name, namespace, labels and
/// annotations.
fn check_output_meta(c: &mut Compiler, f: &str, o: &Output) {
    if let Some(e) = &o.for_each {
        c.expr(&format!("{f}.forEach"), e);
    }
    if let Some(a) = &o.as_name {
        c.identifier(&format!("{f}.as"), a);
        if o.for_each.is_none() {
            c.err(
                ErrorKind::InvalidRule,
                format!("{f}.as"),
                "as needs forEach",
            );
        }
    }
    if let Some(w) = &o.when {
        c.expr(&format!("{f}.when"), w);
    }
    c.template(&format!("{f}.name"), &o.name);
    if let Some(ns) = &o.namespace {
        if !o.kind.namespaced() {
            c.err(
                ErrorKind::InvalidRule,
                format!("{f}.namespace"),
                format!("a {} has no namespace", o.kind),
            );
        }
        c.template(&format!("{f}.namespace"), ns);
    }
    for (field, v) in [("labels", &o.labels), ("annotations", &o.annotations)] {
        if let Some(v) = v {
            if !v.is_object() {
                c.err(
                    ErrorKind::InvalidRule,
                    format!("{f}.{field}"),
                    "must be a map",
                );
            }
            c.tvalue(&format!("{f}.{field}"), v);
        }
    }
}

/// Checks the fields only some kinds take (rules, rulesFrom,
/// aggregationRule, roleRef, subjects) and their values.
fn check_output_kind_fields(c: &mut Compiler, f: &str, o: &Output) {
    let is_role = o.kind.is_role();
    let only = |c: &mut Compiler, present: bool, field: &str, allowed: bool, what: &str| {
        if present && !allowed {
            c.err(
                ErrorKind::InvalidRule,
                format!("{f}.{field}"),
                format!("only {what} take {field}"),
            );
        }
    };
    only(
        &mut *c,
        o.rules.is_some(),
        "rules",
        is_role,
        "ClusterRoles and Roles",
    );
    only(
        &mut *c,
        o.rules_from.is_some(),
        "rulesFrom",
        is_role,
        "ClusterRoles and Roles",
    );
    only(
        &mut *c,
        o.aggregation_rule.is_some(),
        "aggregationRule",
        o.kind == OutputKind::ClusterRole,
        "ClusterRoles",
    );
    only(
        &mut *c,
        o.role_ref.is_some(),
        "roleRef",
        !is_role,
        "bindings",
    );
    only(
        &mut *c,
        o.subjects.is_some(),
        "subjects",
        !is_role,
        "bindings",
    );
    if !is_role && o.role_ref.is_none() {
        c.err(
            ErrorKind::InvalidRule,
            format!("{f}.roleRef"),
            "a binding needs roleRef",
        );
    }
    if o.aggregation_rule.is_some() && (o.rules.is_some() || o.rules_from.is_some()) {
        c.err(
            ErrorKind::InvalidRule,
            format!("{f}.aggregationRule"),
            "an aggregated ClusterRole takes no rules or rulesFrom: the aggregation controller owns its rules",
        );
    }
}

/// Checks the values of the fields only some kinds take.
fn check_output_kind_values(c: &mut Compiler, f: &str, o: &Output) {
    if let Some(v) = &o.rules {
        if !v.is_array() {
            c.err(
                ErrorKind::InvalidRule,
                format!("{f}.rules"),
                "must be a list",
            );
        }
        c.tvalue(&format!("{f}.rules"), v);
    }
    if let Some(rf) = &o.rules_from {
        if rf.cluster_role_names.is_none() && rf.cluster_role_selector.is_none() {
            c.err(
                ErrorKind::InvalidRule,
                format!("{f}.rulesFrom"),
                "give clusterRoleNames, clusterRoleSelector or both",
            );
        }
        if let Some(n) = &rf.cluster_role_names {
            if !n.is_array() {
                c.err(
                    ErrorKind::InvalidRule,
                    format!("{f}.rulesFrom.clusterRoleNames"),
                    "must be a list",
                );
            }
            c.tvalue(&format!("{f}.rulesFrom.clusterRoleNames"), n);
        }
        if let Some(s) = &rf.cluster_role_selector {
            c.selector(&format!("{f}.rulesFrom.clusterRoleSelector"), s);
        }
    }
    if let Some(a) = &o.aggregation_rule {
        c.tvalue(&format!("{f}.aggregationRule"), a);
    }
    if let Some(r) = &o.role_ref {
        c.template(&format!("{f}.roleRef.kind"), &r.kind);
        c.template(&format!("{f}.roleRef.name"), &r.name);
    }
    if let Some(s) = &o.subjects {
        if !s.is_array() {
            c.err(
                ErrorKind::InvalidRule,
                format!("{f}.subjects"),
                "must be a list",
            );
        }
        c.tvalue(&format!("{f}.subjects"), s);
    }
}

/// A rule without errors, compiled: what it reads, what it emits, and
/// what the engine works out of its texts once.
fn compiled(name: &str, spec: &RbacRuleSpec, regexes: HashMap<String, Regex>) -> CompiledRule {
    let interests = interests_of(spec);
    let stripped = without_names(spec);
    // A text that could read the whole context reads every set and
    // the whole trigger.
    let keyed = stripped
        .as_ref()
        .map(spec_texts)
        .filter(|all| !all.iter().any(|(_, t)| mentions_text(t, "\u{0}")));
    let texts: Option<Vec<&str>> = keyed.as_ref().map(|k| k.iter().map(|(_, t)| *t).collect());
    let unread = texts
        .as_deref()
        .map(|t| unread_related(spec, t))
        .unwrap_or_default();
    let presence = keyed
        .as_deref()
        .map(|k| presence_related(spec, k))
        .unwrap_or_default();
    let trigger_paths = texts.as_deref().and_then(trigger_paths);
    let params: serde_json::Map<String, Value> = spec
        .params
        .iter()
        .map(|p| (p.name.clone(), Value::String(p.default.clone())))
        .collect();
    CompiledRule {
        derivation: Derivation::of(spec, &params),
        unread,
        presence,
        trigger_paths,
        trigger_fields: spec
            .trigger
            .as_ref()
            .filter(|t| !t.fields.is_empty())
            .map(|t| super::path::seen_fields(&t.fields)),
        related_fields: spec
            .related
            .iter()
            .map(|r| {
                r.objects
                    .as_ref()
                    .filter(|q| !q.fields.is_empty())
                    .map(|q| super::path::seen_fields(&q.fields))
            })
            .collect(),
        output_fields: (0..spec.outputs.len())
            .map(|i| format!("spec.outputs[{i}]").into())
            .collect(),
        params,
        name: name.to_string(),
        spec: spec.clone(),
        regexes,
        registered: Default::default(),
        consumes: interests.iter().map(|i| i.gk.clone()).collect(),
        interests,
        produces: spec.outputs.iter().map(|o| output_gk(o.kind)).collect(),
    }
}

/// Orders rules so that every rule runs after the rules whose output kinds
/// it reads. Ties go by name. A rule never reads its own outputs (the view
/// hides them), so it does not depend on itself. Returns the order (indices)
/// and, for rules caught in a cycle (which cannot run), the rules they wait on.
pub fn order(rules: &[std::sync::Arc<CompiledRule>]) -> (Vec<usize>, BTreeMap<usize, Vec<String>>) {
    let n = rules.len();
    // deps[b] = rules that must run before b.
    let mut deps: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    for (b, rb) in rules.iter().enumerate() {
        for (a, ra) in rules.iter().enumerate() {
            if a != b && ra.produces.intersection(&rb.consumes).next().is_some() {
                deps[b].insert(a);
            }
        }
    }
    let mut by_name: Vec<usize> = (0..n).collect();
    by_name.sort_by(|x, y| rules[*x].name.cmp(&rules[*y].name));
    let mut done = vec![false; n];
    let mut out = Vec::with_capacity(n);
    loop {
        let next = by_name
            .iter()
            .copied()
            .find(|&i| !done[i] && deps[i].iter().all(|&d| done[d]));
        match next {
            Some(i) => {
                done[i] = true;
                out.push(i);
            }
            None => break,
        }
    }
    let stuck: Vec<usize> = by_name.iter().copied().filter(|&i| !done[i]).collect();
    let mut cycles = BTreeMap::new();
    for &i in &stuck {
        let waits: Vec<String> = deps[i]
            .iter()
            .filter(|&&d| !done[d])
            .map(|&d| rules[d].name.clone())
            .collect();
        cycles.insert(i, waits);
    }
    (out, cycles)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(texts: &[&str]) -> Option<Vec<String>> {
        trigger_paths(texts).map(|ps| ps.iter().map(|p| p.join(".")).collect())
    }

    #[test]
    fn a_kind_is_kept_as_the_union_of_what_its_readers_see() {
        let gk = || GroupKind::new("example.org", "Widget");
        let reader = |m: bool, f: &[&str]| {
            let f: Vec<String> = f.iter().map(|s| s.to_string()).collect();
            Interest::of(gk(), None, (m, &f), false)
        };
        let obj = serde_json::json!({"apiVersion": "example.org/v1", "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"group": "g", "schema": {"big": 1}, "names": {"plural": "ws"}},
            "status": {"x": 1}});
        let merged = |rs: Vec<Interest>| merge_interests(rs).remove(0);
        // Fields and metadata-only readers: the union of their fields.
        let i = merged(vec![
            reader(false, &["spec.group"]),
            reader(true, &[]),
            reader(false, &["spec.names.plural", "spec.group"]),
        ]);
        assert!(!i.metadata_only);
        assert_eq!(
            i.keep(obj.clone()),
            serde_json::json!({"apiVersion": "example.org/v1", "kind": "Widget",
                "metadata": {"name": "w"}, "spec": {"group": "g", "names": {"plural": "ws"}}})
        );
        // One reader of the whole object: whole.
        let i = merged(vec![reader(false, &["spec.group"]), reader(false, &[])]);
        assert_eq!(i.fields, None);
        assert_eq!(i.keep(obj.clone()), obj);
        // Metadata-only readers only: metadata-only.
        let i = merged(vec![reader(true, &[]), reader(true, &[])]);
        assert!(i.metadata_only);
    }

    #[test]
    fn the_trigger_is_read_by_paths_of_keys_and_get_with_a_literal_path() {
        let read = paths(&[
            "example:{{trigger.metadata.name}}:edit",
            "{{shorten trigger.metadata.name 63}}",
            "trigger.metadata.labels.[example.org/family]",
            r#"{{imageOrg (get trigger "spec.image" "")}}"#,
            r#"containsLoose (get trigger "status.items[0].name") "x""#,
            "{{#each trigger.status.refs}}{{name}}{{/each}}",
            "{{trigger.metadata/namespace}}",
            "{{~trigger.spec.a~}}",
            // Bracketed segments are keys like any other.
            "{{[trigger].spec.b}} {{trigger.[spec].c}}",
            r#"{{get trigger 'spec.d'}}"#,
            // Other names: not the trigger.
            "{{vars.trigger}} {{triggers.a}} {{@trigger}} {{x-trigger}} a trigger-b",
            r#"{{default x "trigger"}}"#,
        ]);
        assert_eq!(
            read,
            Some(
                [
                    "metadata.labels.example.org/family",
                    "metadata.name",
                    "metadata.namespace",
                    "spec.a",
                    "spec.b",
                    "spec.c",
                    "spec.d",
                    "spec.image",
                    "status.items",
                    "status.refs",
                ]
                .map(String::from)
                .to_vec()
            )
        );
    }

    #[test]
    fn the_trigger_read_whole_or_by_a_computed_path_is_bound_whole() {
        for text in [
            "{{json trigger}}",
            "trigger",
            "{{#with trigger}}{{metadata.name}}{{/with}}",
            r#"{{get trigger (concat "spec." "a")}}"#,
            r#"{{lookup trigger "metadata"}}"#,
            "{{this.trigger}}",
            "{{#each trigger.list}}{{../trigger}}{{/each}}",
            "{{@root.trigger.a}}",
        ] {
            assert_eq!(paths(&[text]), None, "{text}");
        }
    }

    /// Every built-in rule, compiled, by name.
    fn compiled_builtins() -> Vec<(String, CompiledRule)> {
        let sources = crate::rules::builtin().expect("built-in rules");
        let mut templates = Templates::new();
        sources
            .iter()
            .map(|s| {
                let rule = compile(&s.name, &s.spec, &mut templates).expect("compiles");
                (s.name.clone(), rule)
            })
            .collect()
    }

    #[test]
    fn builtin_rules_see_only_what_they_read_of_their_triggers() {
        let mut read = BTreeMap::new();
        for (name, rule) in compiled_builtins() {
            if rule.spec.trigger.is_some() {
                let paths = rule
                    .trigger_paths
                    .map(|ps| ps.iter().map(|p| p.join(".")).collect::<Vec<_>>());
                read.insert(name, paths);
            }
        }
        // Every built-in rule with a trigger reads it only by paths (some
        // by none: templates then see an empty trigger).
        assert!(!read.is_empty());
        for (name, paths) in &read {
            assert!(paths.is_some(), "{name}: {paths:?}");
        }
        // A rule that reads `get trigger "spec.image"` sees that path.
        assert!(
            read.values()
                .flatten()
                .any(|p| p.iter().any(|x| x == "spec.image"))
        );
    }

    /// The sets of a rule whose reads are all truth tests.
    fn presence_of(rule: &str) -> Vec<String> {
        let sources = crate::rules::parse_text(std::path::Path::new("r.yaml"), rule)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let s = sources.first().expect("one rule");
        let mut templates = Templates::new();
        let rule = compile(&s.name, &s.spec, &mut templates).expect("compiles");
        rule.presence.into_iter().collect()
    }

    #[test]
    fn a_set_read_only_by_when_is_read_by_its_truth() {
        let rule = |outputs: &str| {
            format!(
                r#"apiVersion: rbacrules.io/v1alpha1
kind: RbacRule
metadata: {{name: r}}
spec:
  trigger: {{apiGroup: example.org, kind: Widget}}
  related:
  - name: a
    objects: {{apiGroup: example.org, kind: Part}}
  - name: b
    when: related.a
    objects: {{apiGroup: example.org, kind: Part}}
  - name: c
    objects: {{apiGroup: example.org, kind: Part}}
  - name: d
    listField: {{path: metadata, of: [c]}}
  - name: e
    objects: {{apiGroup: example.org, kind: Part}}
  - name: f
    when: related.e
    objects: {{apiGroup: example.org, kind: Part, ownedBy: [e]}}
  - name: g
    objects: {{apiGroup: example.org, kind: Part}}
  - name: h
    when: related.g
    objects: {{apiGroup: example.org, kind: Part, controlledBy: [g], notOlderThan: c}}
  outputs:
  - kind: ClusterRole
    when: related.b
    name: "x-{{{{trigger.metadata.name}}}}"
    rules:
    - when: related.c
      item: {{apiGroups: [""], resources: [pods], verbs: [get]}}
{outputs}"#
            )
        };
        // `a` and `b` only by `when`; `c` is a listField's source and a
        // `notOlderThan` set, `e` and `g` owner sets: their objects are
        // read.
        assert_eq!(presence_of(&rule("")), ["a", "b"]);
        // Any other read of a set copies it.
        for (text, left) in [
            ("{{json related.a}}", vec!["b"]),
            ("{{related.b.length}}", vec!["a"]),
            ("{{#each related.a}}{{/each}}", vec!["b"]),
            ("{{@root.related}}", vec![]),
        ] {
            let more =
                format!("  - kind: ClusterRole\n    name: \"y\"\n    labels: {{l: \"{text}\"}}\n");
            assert_eq!(presence_of(&rule(&more)), left, "{text}");
        }
        // A `when` that reads more than the set's truth is not a truth test.
        let more = "  - kind: ClusterRole\n    name: yy\n    when: related.a.0.metadata\n";
        assert_eq!(presence_of(&rule(more)), ["b"]);
    }

    #[test]
    fn the_builtin_xrd_rules_read_their_crds_by_truth_only() {
        let mut found = BTreeSet::new();
        for (name, rule) in compiled_builtins() {
            found.extend(rule.presence.iter().map(|n| format!("{name}/{n}")));
        }
        assert!(found.iter().any(|n| n.ends_with("/xrCrd")), "{found:?}");
        assert!(found.iter().any(|n| n.ends_with("/claimCrd")), "{found:?}");
        // The provider rules' sets feed listFields, controlledBy and
        // notOlderThan, which read their objects: not counts.
        assert!(
            !found.iter().any(|n| n.ends_with("/family")
                || n.ends_with("/crds")
                || n.ends_with("/providers"))
        );
    }
}
