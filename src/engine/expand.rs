//! Expansion: a matched trigger (or a rule without one) and the view give
//! the rule's outputs — related objects, vars, templates, rulesFrom.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::sync::Arc;

use handlebars::Context;
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde_json::{Map, Value, json};

use super::Engine;
use super::compile::{Body as DirBody, CompiledRule, anchored, directive};
use super::error::{ErrorKind, FieldError, FieldWarning};
use super::incremental::eval::{
    EvalCaches, ExpansionKey, ExtractKey, ItemPaths, ListKey, Shape, VarKey,
};
use super::kinds::output_gk;
use super::limits;
use super::manifest::{Body, Interner, Manifest, Meta, OwnerRef};
use super::memo::{
    AssemblyPart, ExtractedEntries, ItemVerdict, NestedKey, Owner, OwnerFilter, Read,
};
use super::model::Desired;
use super::model::Seen;
use super::output::{self, MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use super::path::{
    At, FieldPath, Segment, fits_fields, keep_fields, leading_keys, list_fields, scalar_text,
};
use super::store::controller_uid;
use super::store::{GroupKind, key_of, object_ref};
use super::template::{mentions, mentions_text, named_reads, truthy};
use super::time::creation_time;
use super::view::View;
use crate::api::{
    Condition, GROUP, ListFieldQuery, ObjectQuery, OutputKind, Related, RulesFrom, Unmatched,
};
use crate::policy;

type Result<T> = std::result::Result<T, FieldError>;

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

/// Removes what templates must not depend on or need not see.
pub(super) fn visible(obj: &Value, seen: Sight<'_>) -> Value {
    let mut v = if seen.metadata_only {
        json!({
            "apiVersion": obj.get("apiVersion").cloned().unwrap_or(Value::Null),
            "kind": obj.get("kind").cloned().unwrap_or(Value::Null),
            "metadata": obj.get("metadata").cloned().unwrap_or(Value::Null),
        })
    } else if let Some(fields) = seen.fields {
        keep_fields(Cow::Borrowed(obj), fields)
    } else {
        obj.clone()
    };
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    v
}

/// [`visible`]`(obj)`, borrowed when that is `obj` itself (no
/// managedFields, and only what is seen): the controller's store holds
/// objects so.
pub(super) fn shown<'o>(obj: &'o Value, seen: Sight<'_>) -> Cow<'o, Value> {
    let bare = obj["metadata"].get("managedFields").is_none()
        && (!seen.metadata_only
            || obj.as_object().is_some_and(|m| {
                m.keys()
                    .all(|k| matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
            }))
        && seen.fields.is_none_or(|f| fits_fields(obj, f));
    if bare {
        Cow::Borrowed(obj)
    } else {
        Cow::Owned(visible(obj, seen))
    }
}

/// The part of [`visible`]`(obj)` at `paths` (lists of object keys): each
/// path's value copied whole where it ends or meets a non-map, missing
/// where `obj` has none. Templates and conditions that read `obj` only by
/// these paths see the same values in it.
pub(super) fn project(obj: &Value, paths: &[Vec<String>], seen: Sight<'_>) -> Value {
    if seen.fields.is_some() {
        // What the paths read of what is seen.
        let base = shown(obj, seen);
        if let Cow::Owned(o) = &base {
            return project(
                o,
                paths,
                Sight {
                    fields: None,
                    ..seen
                },
            );
        }
    }
    let metadata_only = seen.metadata_only;
    let Value::Object(src) = obj else {
        return visible(obj, seen);
    };
    let mut sorted: Vec<&Vec<String>> = paths.iter().collect();
    sorted.sort_by_key(|p| p.len());
    let mut out = Map::new();
    // Paths copied whole: a longer path below one is in it already.
    let mut whole: Vec<&[String]> = Vec::new();
    for p in sorted {
        let Some(first) = p.first() else {
            return visible(obj, seen);
        };
        if whole.iter().any(|w| p.starts_with(w))
            || (metadata_only && !matches!(first.as_str(), "apiVersion" | "kind" | "metadata"))
        {
            continue;
        }
        let (mut from, mut to) = (src, &mut out);
        for (n, k) in p.iter().enumerate() {
            let Some(v) = from.get(k) else { break };
            match v {
                Value::Object(m) if n + 1 < p.len() => {
                    let next = to
                        .entry(k.clone())
                        .or_insert_with(|| Value::Object(Map::new()));
                    let Value::Object(next) = next else { break };
                    from = m;
                    to = next;
                }
                _ => {
                    to.insert(k.clone(), v.clone());
                    whole.push(&p[..=n]);
                    break;
                }
            }
        }
    }
    if let Some(m) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    Value::Object(out)
}

pub(super) fn bind(ctx: &mut Context, name: &str, v: Value) -> Option<Value> {
    ctx.data_mut()
        .as_object_mut()
        .and_then(|m| m.insert(name.to_string(), v))
}

/// A `forEach` result as a list (null is empty).
fn owned_list(field: impl std::fmt::Display, v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(a) => Ok(a),
        Value::Null => Ok(Vec::new()),
        other => Err(FieldError::new(
            ErrorKind::Template,
            field.to_string(),
            format!("forEach must yield a list, got {other}"),
        )),
    }
}

/// Restores what `name` was bound to before and hands back what it is.
fn rebind(ctx: &mut Context, name: &str, old: Option<Value>) -> Value {
    let Some(m) = ctx.data_mut().as_object_mut() else {
        return Value::Null;
    };
    match old {
        Some(o) => m.insert(name.to_string(), o),
        None => m.remove(name),
    }
    .unwrap_or_default()
}

/// Runs `f` with `item` bound as `item` (moved into the context, not
/// copied) and hands it back with the result.
fn with_item<R>(
    ctx: &mut Context,
    item: Value,
    f: impl FnOnce(&Context, &Value) -> R,
) -> (Value, R) {
    if !ctx.data().is_object() {
        // No object to bind into (never so): the item is read unbound.
        let r = f(ctx, &item);
        return (item, r);
    }
    let old = bind(ctx, "item", item);
    let r = f(ctx, ctx.data().get("item").unwrap_or(&Value::Null));
    (rebind(ctx, "item", old), r)
}

pub(super) fn is_deleting(obj: &Value) -> bool {
    obj["metadata"]
        .get("deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// Renders one rule's triggers: what a rule means, with its caches (what
/// exists only for speed) behind one handle.
pub(super) struct Evaluator<'a> {
    pub engine: &'a Engine,
    pub rule: &'a CompiledRule,
    /// What the current render skipped with a warning.
    pub warnings: RefCell<Vec<FieldWarning>>,
    /// What the rule's renders cache and read (see [`EvalCaches`]).
    pub caches: EvalCaches,
}

/// Where an expansion is, passed down [`Evaluator::expand`] (never a mode
/// switched on the evaluator around a call).
#[derive(Clone, Copy)]
pub(super) struct Pass<'s> {
    /// Templated strings are marked as data (policy rules, subjects).
    marked: bool,
    /// Nesting of [`Evaluator::expand_as`]: only whole values (depth 0)
    /// are cached whole, their entries at depth 1.
    depth: usize,
    /// When set, where each entry of the whole list landed in the
    /// result, with its key in the cache if it has one (its policy rules
    /// are then checked entry by entry).
    spans: Option<&'s RefCell<Vec<Span>>>,
    /// The innermost loop variable bound around the value (see [`Loop`]).
    loops: Option<&'s Loop<'s>>,
}

impl<'s> Pass<'s> {
    /// A whole value inside `loops`, its strings unmarked.
    fn plain(loops: Option<&'s Loop<'s>>) -> Pass<'s> {
        Pass {
            marked: false,
            depth: 0,
            spans: None,
            loops,
        }
    }

    /// A whole value inside `loops` whose strings are marked as data.
    fn marked(loops: Option<&'s Loop<'s>>) -> Pass<'s> {
        Pass {
            marked: true,
            ..Pass::plain(loops)
        }
    }

    /// The pass of the values inside this one.
    fn inner(self) -> Pass<'s> {
        Pass {
            depth: self.depth + 1,
            ..self
        }
    }
}

/// A loop variable bound around a value (by a `forEach`), with the token
/// of the cached var its `forEach` runs over and its index there, when it
/// does, and the loops around it: passed down the expansion (see
/// [`Evaluator::nested_key`]), never kept on the evaluator.
#[derive(Clone, Copy)]
pub(super) struct Loop<'s> {
    name: &'s str,
    bound: Option<(u64, usize)>,
    outer: Option<&'s Loop<'s>>,
}

impl<'s> Loop<'s> {
    /// This loop and those around it, innermost first.
    fn chain(&'s self) -> impl Iterator<Item = &'s Loop<'s>> {
        std::iter::successors(Some(self), |l| l.outer)
    }
}

/// A listField's source: a value in the render's context, or a related
/// object as the store holds it (with whether templates see only its
/// metadata), copied only when its entries are extracted.
enum Source<'a> {
    Seen(&'a Value),
    Held(&'a Arc<Value>, Sight<'a>),
}

/// A set of related objects no template reads: its name, the objects as
/// the store holds them, and how much of them the rule sees.
type HeldSet<'o, 'r> = (&'o String, Vec<Arc<Value>>, Sight<'r>);

/// A listField's extract: the path of the text in each entry, the regex
/// it must match, and what becomes of an entry it does not.
type Extract<'r> = (FieldPath, Cow<'r, regex::Regex>, Unmatched);

/// A listField result to cache once its set is judged: its key, and the
/// budget used and warnings given before it was computed.
type PendingList = (ListKey, usize, usize);

/// Where one entry of an expanded list landed (see [`Pass::spans`]).
pub(super) struct Span {
    pub key: Option<ExpansionKey>,
    pub start: usize,
    pub end: usize,
}

impl Evaluator<'_> {
    /// A fresh start for the render of `trigger` (`None`: the static set).
    pub(super) fn start(&self, trigger: Option<Arc<Value>>) {
        self.warnings.borrow_mut().clear();
        self.caches.start(trigger);
    }

    /// The warnings of the render just done, sorted and de-duplicated.
    pub(super) fn take_warnings(&self) -> Vec<FieldWarning> {
        let mut w = self.warnings.take();
        w.sort();
        w.dedup();
        w
    }

    pub(super) fn base_context(&self) -> Context {
        Context::from(
            json!({"rule": {"name": self.rule.name}, "related": {}, "params": self.rule.params}),
        )
    }

    /// The regex of `text`: the rule's compiled one, borrowed (a clone of a
    /// `Regex` starts with no match cache, and building one costs more
    /// than a short match), else compiled now (a templated pattern).
    pub(super) fn regex(&self, field: At<'_>, text: &str) -> Result<Cow<'_, regex::Regex>> {
        match self.rule.regexes.get(text) {
            Some(r) => Ok(Cow::Borrowed(r)),
            None => anchored(text).map(Cow::Owned).map_err(|e| {
                FieldError::new(
                    ErrorKind::Regex,
                    field.to_string(),
                    format!("invalid regular expression {text:?}: {e}"),
                )
            }),
        }
    }

    fn tpl(&self, field: impl std::fmt::Display, text: &str, ctx: &Context) -> Result<String> {
        self.engine
            .templates
            .render(text, ctx)
            .map_err(|e| template_error(field, e))
    }

    fn expr<'c>(
        &self,
        field: impl std::fmt::Display,
        text: &str,
        ctx: &'c Context,
    ) -> Result<Cow<'c, Value>> {
        self.engine
            .templates
            .eval_ref(text, ctx)
            .map_err(|e| template_error(field, e))
    }

    pub(super) fn condition(
        &self,
        field: At<'_>,
        c: &Condition,
        subject: &Value,
        ctx: &Context,
    ) -> Result<bool> {
        Ok(self.test(field, c, subject, ctx)?.0)
    }

    /// A `require` condition: `Some(warning)` when it fails.
    pub(super) fn check(
        &self,
        field: At<'_>,
        c: &Condition,
        subject: &Value,
        ctx: &Context,
    ) -> Result<Option<FieldWarning>> {
        let (ok, shown) = self.test(field, c, subject, ctx)?;
        if ok {
            return Ok(None);
        }
        let message = match (&c.message, c.format) {
            (Some(m), _) => m.clone(),
            (None, Some(f)) => format!("not a valid {}", f.as_str()),
            (None, None) => "does not pass the condition".to_string(),
        };
        Ok(Some(FieldWarning::new(field.to_string(), &shown, message)))
    }

    /// Whether the condition holds, and the tested value as a warning
    /// shows it.
    fn test(
        &self,
        field: At<'_>,
        c: &Condition,
        subject: &Value,
        ctx: &Context,
    ) -> Result<(bool, String)> {
        const MISSING: &str = "(missing)";
        let actual: Option<String> = match (&c.path, &c.value) {
            (Some(p), _) => {
                let path = FieldPath::parse(p).map_err(|e| {
                    FieldError::new(ErrorKind::InvalidRule, format!("{field}.path"), e)
                })?;
                let v = path.get(subject).filter(|v| !v.is_null());
                let shown = match v {
                    None => MISSING.to_string(),
                    Some(x) => scalar_text(x).unwrap_or_else(|| x.to_string()),
                };
                if let Some(want) = c.exists {
                    return Ok((v.is_some() == want, shown));
                }
                if v.is_none() && c.optional {
                    return Ok((true, shown));
                }
                v.and_then(scalar_text)
            }
            (None, Some(t)) => Some(self.tpl(At::Key(&field, "value"), t, ctx)?),
            (None, None) => None,
        };
        let shown = actual.clone().unwrap_or_else(|| MISSING.to_string());
        let ok = self.holds(field, c, actual.as_deref(), ctx)?;
        Ok((ok, shown))
    }

    /// Whether the operator holds for the tested text (None: missing).
    fn holds(
        &self,
        field: At<'_>,
        c: &Condition,
        actual: Option<&str>,
        ctx: &Context,
    ) -> Result<bool> {
        if let Some(e) = &c.equals {
            let want = self.tpl(At::Key(&field, "equals"), e, ctx)?;
            return Ok(actual == Some(want.as_str()));
        }
        if let Some(e) = &c.not_equals {
            let want = self.tpl(At::Key(&field, "notEquals"), e, ctx)?;
            return Ok(actual != Some(want.as_str()));
        }
        if let Some(list) = &c.one_of {
            let one_of = At::Key(&field, "oneOf");
            for (i, e) in list.iter().enumerate() {
                let want = self.tpl(At::Index(&one_of, i), e, ctx)?;
                if actual == Some(want.as_str()) {
                    return Ok(true);
                }
            }
            return Ok(false);
        }
        if let Some(r) = &c.regex {
            let at = At::Key(&field, "regex");
            let text = self.tpl(at, r, ctx)?;
            let re = self.regex(at, &text)?;
            return Ok(actual.is_some_and(|a| re.is_match(a)));
        }
        if let Some(r) = &c.not_regex {
            let at = At::Key(&field, "notRegex");
            let text = self.tpl(at, r, ctx)?;
            let re = self.regex(at, &text)?;
            return Ok(!actual.is_some_and(|a| re.is_match(a)));
        }
        if let Some(e) = &c.in_list {
            let Some(a) = actual else { return Ok(false) };
            let list = self.list_of(At::Key(&field, "in"), e, ctx)?;
            return Ok(list.iter().any(|x| scalar_text(x).as_deref() == Some(a)));
        }
        if let Some(f) = c.format {
            return Ok(actual.is_some_and(|a| super::format::check(f, a)));
        }
        Ok(false)
    }

    /// Expands a template value: strings rendered, list directives run,
    /// `$merge` maps merged.
    fn expand(&self, v: &Value, ctx: &mut Context, field: At<'_>, pass: Pass<'_>) -> Result<Value> {
        self.expand_as(v, ctx, field, pass, false)
    }

    /// [`Evaluator::expand`]; `checked_only`: the whole value is only ever
    /// checked, never read again (an output's policy rules, cached checked
    /// beside it), so its expansion is cached as null, not copied.
    fn expand_as(
        &self,
        v: &Value,
        ctx: &mut Context,
        field: At<'_>,
        pass: Pass<'_>,
        checked_only: bool,
    ) -> Result<Value> {
        let key = match v {
            Value::Array(_) | Value::Object(_) if pass.depth == 0 => {
                self.expansion_key(v, false, pass.marked)
            }
            _ => None,
        };
        if let Some(cached) = key.as_ref().and_then(|k| self.caches.cached_expansion(k)) {
            return Ok(cached);
        }
        let nested = if key.is_none() && pass.depth >= 1 {
            self.nested_key(v, ctx.data(), pass)
        } else {
            None
        };
        if let Some(cached) = nested
            .as_ref()
            .and_then(|k| self.caches.cached_nested_list(k))
        {
            return Ok(cached);
        }
        let before = limits::used();
        let out = self.expand_value(v, ctx, field, pass.inner());
        if let Ok(value) = &out {
            self.caches
                .remember_expansion(key, nested, value, checked_only, before);
        }
        out
    }

    /// The key of a nested list built by a `forEach` (the `resources` of
    /// each API group's rule) in the cache: when it reads nothing but vars
    /// (each cached) and loop variables that each run over a cached var. Keyed
    /// by its text, not its place, so the roles that render the same list
    /// (edit, system, view) build it once; and by the values of its loop
    /// variables, not their places, so when a family's types change, only
    /// the API groups whose types changed build theirs again. It can read
    /// nothing else: a loop variable's index is an `@` path, which gives
    /// no key.
    fn nested_key(&self, v: &Value, data: &Value, pass: Pass<'_>) -> Option<NestedKey> {
        let Value::Array(items) = v else { return None };
        if !items.iter().any(|x| x.get("forEach").is_some()) {
            return None;
        }
        let loops = pass.loops?;
        if loops.chain().any(|l| l.name == "vars") {
            return None;
        }
        // A name bound twice shows only its inner value: the outer one's
        // value is not in the context to name.
        if loops
            .chain()
            .any(|l| l.outer.is_some_and(|o| o.chain().any(|m| m.name == l.name)))
        {
            return None;
        }
        let mut bound = Vec::with_capacity(loops.chain().count());
        self.loop_ids(loops, data, &mut bound)?;
        self.caches.nested_key(v, pass.marked, bound, || {
            let mut roots: Vec<&str> = vec!["vars"];
            roots.extend(loops.chain().map(|l| l.name));
            self.vars_read(v, false, &mut roots)
        })
    }

    /// Each loop variable bound around a value with the id of its value,
    /// outermost first: `None` when one does not run over a cached var.
    fn loop_ids(&self, l: &Loop<'_>, data: &Value, ids: &mut Vec<(String, u64)>) -> Option<()> {
        if let Some(outer) = l.outer {
            self.loop_ids(outer, data, ids)?;
        }
        let (token, index) = l.bound?;
        let id = self.caches.content_id(token, index, data.get(l.name)?);
        ids.push((l.name.to_string(), id));
        Some(())
    }

    /// An output's policy rules checked before from the same cached
    /// expansion, charging the budget what expanding charged.
    fn cached_policy(&self, v: &Value, pass: Pass<'_>) -> Option<super::memo::CachedPolicy> {
        if pass.depth != 0 || !matches!(v, Value::Array(_) | Value::Object(_)) {
            return None;
        }
        let key = self.expansion_key(v, false, pass.marked)?;
        self.caches.checked_policy(&key)
    }

    /// The key of a whole template value's expansion in the cache: when
    /// it reads nothing but vars (each cached, by its token) and its own
    /// loop variables.
    fn expansion_key(&self, v: &Value, entry: bool, marked: bool) -> Option<ExpansionKey> {
        self.caches
            .expansion_key(v, marked, || self.vars_read(v, entry, &mut vec!["vars"]))
    }

    /// The vars a template value (`entry`: an entry of a list, maybe a
    /// directive) reads, when it reads nothing but vars and the loop
    /// variables in `roots`.
    fn vars_read<'v>(
        &self,
        v: &'v Value,
        entry: bool,
        roots: &mut Vec<&'v str>,
    ) -> Option<Vec<String>> {
        let mut texts: Vec<&str> = Vec::new();
        let ok = if entry {
            self.collect_item(v, roots, &mut texts)
        } else {
            self.collect_texts(v, roots, &mut texts)
        };
        if !ok {
            return None;
        }
        let names: Vec<&str> = self
            .rule
            .spec
            .vars
            .iter()
            .map(|v| v.name.as_str())
            .collect();
        // An output forEach may bind `vars` to something else.
        let shadowed = self
            .rule
            .spec
            .outputs
            .iter()
            .any(|o| o.for_each.is_some() && o.as_name.as_deref().unwrap_or("item") == "vars");
        if shadowed {
            return None;
        }
        named_reads(&texts, "vars", &names)
    }

    /// Gathers the templates and expressions of a value into `texts`;
    /// false when one reads anything but `roots`.
    fn collect_texts<'v>(
        &self,
        v: &'v Value,
        roots: &mut Vec<&'v str>,
        texts: &mut Vec<&'v str>,
    ) -> bool {
        let t = &self.engine.templates;
        match v {
            Value::String(s) => {
                texts.push(s);
                t.reads_within(s, roots)
            }
            Value::Array(items) => items
                .iter()
                .all(|item| self.collect_item(item, roots, texts)),
            Value::Object(m) => m.iter().all(|(k, x)| {
                texts.push(k);
                t.reads_within(k, roots) && self.collect_texts(x, roots, texts)
            }),
            _ => true,
        }
    }

    /// [`Evaluator::collect_texts`] for one entry of a list: a directive
    /// or a value.
    fn collect_item<'v>(
        &self,
        item: &'v Value,
        roots: &mut Vec<&'v str>,
        texts: &mut Vec<&'v str>,
    ) -> bool {
        let t = &self.engine.templates;
        match directive(item) {
            Ok(Some(d)) => {
                let exprs = d.for_each.iter().chain(d.when.iter());
                for e in exprs {
                    texts.push(e);
                    if !t.expr_reads_within(e, roots) {
                        return false;
                    }
                }
                let body = match d.body {
                    DirBody::Item(b) | DirBody::Items(b) => b,
                };
                let scoped = d.for_each.is_some();
                if scoped {
                    roots.push(d.as_name.unwrap_or("item"));
                }
                let ok = self.collect_texts(body, roots, texts);
                if scoped {
                    roots.pop();
                }
                ok
            }
            Ok(None) => self.collect_texts(item, roots, texts),
            Err(_) => false,
        }
    }

    /// Records where an entry of the outermost list landed, when asked
    /// (see [`Pass::spans`]).
    fn span(&self, key: Option<ExpansionKey>, start: usize, end: usize, pass: Pass<'_>) {
        if pass.depth != 1 {
            return;
        }
        if let Some(spans) = pass.spans {
            spans.borrow_mut().push(Span { key, start, end });
        }
    }

    fn expand_value(
        &self,
        v: &Value,
        ctx: &mut Context,
        field: At<'_>,
        pass: Pass<'_>,
    ) -> Result<Value> {
        // Every expanded value is charged: nested forEach multiply.
        if let Value::String(s) = v {
            return self.expand_string(s, ctx, &|| field.to_string(), pass.marked);
        }
        limited(field, limits::charge_node())?;
        match v {
            Value::Array(items) => {
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    // An entry of a whole value that is not cached as a
                    // whole (it reads the trigger elsewhere) may be.
                    let key = (pass.depth == 1)
                        .then(|| self.expansion_key(item, true, pass.marked))
                        .flatten();
                    let start = out.len();
                    if let Some(key) = &key
                        && self.caches.reuse_entry(key, pass.spans.is_some(), &mut out)
                    {
                        if matches!(directive(item), Ok(Some(_))) {
                            limited(
                                At::Index(&field, i),
                                limits::check_list(out.len(), "the expanded list"),
                            )?;
                        }
                        self.span(Some(key.clone()), start, out.len(), pass);
                        continue;
                    }
                    let before = limits::used();
                    if let Value::String(s) = item {
                        // A plain string (never a directive), as `entry`
                        // expands it: its field is spelled only on error.
                        let at = || format!("{field}[{i}]");
                        out.push(self.expand_string(s, ctx, &at, pass.marked)?);
                        limits::check_list(out.len(), "the expanded list")
                            .map_err(|m| FieldError::new(ErrorKind::LimitExceeded, at(), m))?;
                    } else {
                        self.entry(item, i, field, ctx, &mut out, pass)?;
                    }
                    if let Some(key) = &key {
                        let by_entry = pass.spans.is_some();
                        self.caches
                            .remember_entry(key.clone(), &out[start..], by_entry, before);
                    }
                    self.span(key, start, out.len(), pass);
                }
                Ok(Value::Array(out))
            }
            Value::Object(map) => self.expand_map(map, ctx, field, pass),
            other => Ok(other.clone()),
        }
    }

    /// Expands a template string (marked as data when asked); `field`
    /// names it in an error.
    fn expand_string(
        &self,
        s: &str,
        ctx: &Context,
        field: &dyn Fn() -> String,
        marked: bool,
    ) -> Result<Value> {
        // Every expanded value is charged: nested forEach multiply.
        limits::charge_node().map_err(|m| FieldError::new(ErrorKind::LimitExceeded, field(), m))?;
        let mark =
            (marked && !super::template::Templates::is_literal(s)).then_some(output::DATA_MARK);
        let text = self
            .engine
            .templates
            .render_after(mark, s, ctx)
            .map_err(|e| template_error(field(), e))?;
        Ok(Value::String(text))
    }

    /// Expands one entry of a list into `out`: a value, or a directive's
    /// values.
    fn entry(
        &self,
        item: &Value,
        i: usize,
        field: At<'_>,
        ctx: &mut Context,
        out: &mut Vec<Value>,
        pass: Pass<'_>,
    ) -> Result<()> {
        let f = At::Index(&field, i);
        let d = directive(item)
            .map_err(|m| FieldError::new(ErrorKind::InvalidRule, f.to_string(), m))?;
        let Some(d) = d else {
            out.push(self.expand(item, ctx, f, pass)?);
            return Ok(());
        };
        let f_when = At::Key(&f, "when");
        let f_body = match d.body {
            DirBody::Item(_) => At::Key(&f, "item"),
            DirBody::Items(_) => At::Key(&f, "items"),
        };
        let emit = |this: &Self, ctx: &mut Context, out: &mut Vec<Value>, pass: Pass<'_>| {
            if let Some(w) = d.when
                && !truthy(&*this.expr(f_when, w, ctx)?)
            {
                return Ok(());
            }
            match d.body {
                DirBody::Item(b) => out.push(this.expand(b, ctx, f_body, pass)?),
                DirBody::Items(b) => match this.expand(b, ctx, f_body, pass)? {
                    Value::Array(xs) => out.extend(xs),
                    other => out.push(other),
                },
            }
            Ok::<(), FieldError>(())
        };
        match d.for_each {
            None => emit(self, ctx, out, pass)?,
            Some(e) => {
                let var = d.as_name.unwrap_or("item");
                let body = match d.body {
                    DirBody::Item(b) | DirBody::Items(b) => b,
                };
                // Found once per directive, not per render: `root` is
                // always its expression's.
                let unseen = |root: &str| {
                    self.caches.unseen(item, || {
                        !d.when.is_some_and(|w| mentions_text(w, root)) && !mentions(body, root)
                    })
                };
                let scope = Loop {
                    name: var,
                    bound: None,
                    outer: pass.loops,
                };
                self.for_each(At::Key(&f, "forEach"), e, scope, unseen, ctx, |ctx, l| {
                    emit(
                        self,
                        ctx,
                        out,
                        Pass {
                            loops: Some(l),
                            ..pass
                        },
                    )
                })?;
            }
        }
        limited(f, limits::check_list(out.len(), "the expanded list"))
    }

    /// Expands a map: keys rendered, `$merge` maps merged.
    fn expand_map(
        &self,
        map: &Map<String, Value>,
        ctx: &mut Context,
        field: At<'_>,
        pass: Pass<'_>,
    ) -> Result<Value> {
        let mut out = Map::new();
        for (k, val) in map {
            if k == "$merge" {
                let merged = self.expand(val, ctx, At::Key(&field, "$merge"), pass)?;
                for (j, part) in merged.as_array().into_iter().flatten().enumerate() {
                    let Value::Object(pm) = part else {
                        return Err(FieldError::new(
                            ErrorKind::InvalidRule,
                            format!("{field}.$merge[{j}]"),
                            "must render to a map",
                        ));
                    };
                    for (pk, pv) in pm {
                        if out
                            .insert(pk.clone(), pv.clone())
                            .is_some_and(|old| old != *pv)
                        {
                            return Err(FieldError::new(
                                ErrorKind::InvalidOutput,
                                format!("{field}.$merge[{j}]"),
                                format!("key {pk:?} is given twice with different values"),
                            ));
                        }
                    }
                }
                continue;
            }
            let key = self.tpl(At::Quoted(&field, k), k, ctx)?;
            let val = self.expand(val, ctx, At::Key(&field, k), pass)?;
            if out.insert(key.clone(), val).is_some() {
                return Err(FieldError::new(
                    ErrorKind::InvalidOutput,
                    field.to_string(),
                    format!("key {key:?} is rendered twice"),
                ));
            }
        }
        Ok(Value::Object(out))
    }

    /// Runs `each` once per entry of a `forEach` list, bound as the
    /// variable of `scope` (whose loop it is handed). A list read in place
    /// by a bare path whose root nothing in the loop names (`unseen`) is
    /// lent: moved out of the context for the loop and put back after,
    /// not copied.
    fn for_each(
        &self,
        field: At<'_>,
        e: &str,
        scope: Loop<'_>,
        unseen: impl Fn(&str) -> bool,
        ctx: &mut Context,
        mut each: impl FnMut(&mut Context, &Loop<'_>) -> Result<()>,
    ) -> Result<()> {
        let var = scope.name;
        let path = self
            .engine
            .templates
            .key_path(e)
            .filter(|p| match p.segments().first() {
                Some(Segment::Key(root)) => root != var && unseen(root),
                _ => false,
            });
        let v = self.expr(field, e, ctx)?;
        if let Value::Array(a) = &*v {
            limited(field, limits::check_list(a.len(), "the forEach list"))?;
        }
        let lent = match (&path, &v) {
            (Some(_), Cow::Borrowed(found @ Value::Array(_))) => Some(*found as *const Value),
            _ => None,
        };
        let (list, path) = match (lent, path) {
            (Some(ptr), Some(path)) => {
                drop(v);
                match path.get_mut(ctx.data_mut()) {
                    Some(slot) if std::ptr::eq(&*slot, ptr) => match std::mem::take(slot) {
                        Value::Array(a) => (a, Some(path)),
                        _ => (Vec::new(), None),
                    },
                    // Never so (the same walk): read as any list.
                    _ => (self.list_of(field, e, ctx)?, None),
                }
            }
            _ => (owned_list(field, v.into_owned())?, None),
        };
        // Over a cached var: each item is named by the var's token and its
        // index (for the keys of nested lists, see `nested_key`).
        let token = e
            .trim()
            .strip_prefix("vars.")
            .filter(|n| self.rule.spec.vars.iter().any(|v| v.name == *n))
            .and_then(|n| self.caches.var_token(n));
        let mut back = Vec::with_capacity(if path.is_some() { list.len() } else { 0 });
        let mut items = list.into_iter();
        let mut result = Ok(());
        // Bound once for the whole loop: each item is moved into the slot
        // and back out, not inserted and removed under a new key.
        let old = bind(ctx, var, Value::Null);
        for (n, x) in items.by_ref().enumerate() {
            match ctx.data_mut().get_mut(var) {
                Some(slot) => *slot = x,
                // No object to bind into (never so): read unbound, as
                // `with_item` does.
                None => drop(x),
            }
            let bound = Loop {
                bound: token.map(|t| (t, n)),
                ..scope
            };
            let r = each(ctx, &bound);
            let x = ctx
                .data_mut()
                .get_mut(var)
                .map(std::mem::take)
                .unwrap_or_default();
            if path.is_some() {
                back.push(x);
            }
            if r.is_err() {
                result = r;
                break;
            }
        }
        rebind(ctx, var, old);
        if let Some(path) = path {
            back.extend(items);
            if let Some(slot) = path.get_mut(ctx.data_mut()) {
                *slot = Value::Array(back);
            }
        }
        result
    }

    /// Evaluates a `forEach` expression: a list (null is empty).
    fn list_of(&self, field: At<'_>, e: &str, ctx: &Context) -> Result<Vec<Value>> {
        let v = self.expr(field, e, ctx)?;
        // Checked before a borrowed list is copied.
        if let Value::Array(a) = &*v {
            limited(field, limits::check_list(a.len(), "the forEach list"))?;
        }
        owned_list(field, v.into_owned())
    }

    /// A list of texts, expanded inside `loops`.
    fn strings(
        &self,
        field: At<'_>,
        v: &Value,
        ctx: &mut Context,
        loops: Option<&Loop<'_>>,
    ) -> Result<Vec<String>> {
        match self.expand(v, ctx, field, Pass::plain(loops))? {
            Value::Array(a) => a
                .into_iter()
                .enumerate()
                .map(|(i, x)| {
                    scalar_text(&x).ok_or_else(|| {
                        FieldError::new(
                            ErrorKind::InvalidOutput,
                            format!("{field}[{i}]"),
                            "must render to text",
                        )
                    })
                })
                .collect(),
            _ => Err(FieldError::new(
                ErrorKind::InvalidOutput,
                field.to_string(),
                "must render to a list",
            )),
        }
    }

    fn selector(&self, field: At<'_>, sel: &LabelSelector, ctx: &Context) -> Result<LabelSelector> {
        let mut out = LabelSelector::default();
        if let Some(ml) = &sel.match_labels {
            let mut m = BTreeMap::new();
            let labels = At::Key(&field, "matchLabels");
            for (k, v) in ml {
                let f = At::Quoted(&labels, k);
                m.insert(self.tpl(f, k, ctx)?, self.tpl(f, v, ctx)?);
            }
            out.match_labels = Some(m);
        }
        if let Some(exprs) = &sel.match_expressions {
            let mut rendered = Vec::new();
            let exprs_at = At::Key(&field, "matchExpressions");
            for (i, e) in exprs.iter().enumerate() {
                let f = At::Index(&exprs_at, i);
                let values_at = At::Key(&f, "values");
                let values = match &e.values {
                    Some(vs) => Some(
                        vs.iter()
                            .enumerate()
                            .map(|(j, v)| self.tpl(At::Index(&values_at, j), v, ctx))
                            .collect::<Result<Vec<_>>>()?,
                    ),
                    None => None,
                };
                rendered.push(LabelSelectorRequirement {
                    key: self.tpl(At::Key(&f, "key"), &e.key, ctx)?,
                    operator: e.operator.clone(),
                    values,
                });
            }
            out.match_expressions = Some(rendered);
        }
        crate::selector::validate(&out)
            .map_err(|e| FieldError::new(ErrorKind::Selector, field.to_string(), e.to_string()))?;
        Ok(out)
    }

    fn related(
        &self,
        i: usize,
        rel: &Related,
        ctx: &mut Context,
        trigger: Option<&Value>,
        view: &View,
    ) -> Result<Vec<Value>> {
        let related_at = At::Field("spec.related");
        let f = At::Index(&related_at, i);
        if let Some(w) = &rel.when
            && !truthy(&*self.expr(At::Key(&f, "when"), w, ctx)?)
        {
            return Ok(Vec::new());
        }
        // A listField item's JSON text, by position (empty otherwise).
        let mut keys: Vec<String> = Vec::new();
        // Whether the listField's conditions were judged already.
        let mut judged = false;
        // The related objects as the store holds them, by position.
        let mut arcs: Option<Vec<Arc<Value>>> = None;
        // Where a listField result computed here is cached: its key, and
        // the budget and warnings before it.
        let mut keep: Option<PendingList> = None;
        let mut items: Vec<Value> = if let Some(q) = &rel.objects {
            let (gk, ns, read) = self.related_read(q, f, ctx, trigger, view)?;
            let found = self.find_related(i, &gk, ns, read, view);
            let found: Vec<&Arc<Value>> = found.iter().collect();
            let seen = self.rule.related_seen(i);
            if let Some(items) = self.cached_objects(i, rel, &found, seen, ctx) {
                return items;
            }
            arcs = Some(found.iter().map(|o| Arc::clone(o)).collect());
            found.into_iter().map(|o| visible(o, seen)).collect()
        } else if let Some(l) = &rel.list_field {
            match self.list_field(i, rel, l, f, ctx, &mut keys, &mut judged, &mut keep)? {
                ControlFlow::Break(done) => return Ok(done),
                ControlFlow::Continue(items) => items,
            }
        } else {
            Vec::new()
        };
        if !judged && !rel.filter.is_empty() {
            items = self.where_items(i, rel, f, ctx, items, &mut keys, &mut arcs)?;
        }
        if !judged && !rel.require.is_empty() {
            items = self.require_items(i, rel, f, ctx, items, &keys)?;
        }
        if self.rule.presence.contains(&rel.name) {
            // Read only by its truth (judged on the objects above): nulls
            // stand for them, as in `cached_objects`.
            items = vec![Value::Null; items.len()];
        }
        self.remember_related(rel, arcs, keep);
        Ok(items)
    }

    /// The items that pass the set's `where`: conditions of the item
    /// alone judged once per entry text. `keys` and `arcs` follow.
    #[allow(clippy::too_many_arguments)]
    fn where_items(
        &self,
        i: usize,
        rel: &Related,
        f: At<'_>,
        ctx: &mut Context,
        items: Vec<Value>,
        keys: &mut Vec<String>,
        arcs: &mut Option<Vec<Arc<Value>>>,
    ) -> Result<Vec<Value>> {
        // Conditions of the item alone are judged once per entry text.
        let cached = !keys.is_empty() && self.reads_of(i, rel).where_item;
        let mut passed = Vec::with_capacity(items.len());
        let mut passed_keys = Vec::new();
        let mut passed_arcs = Vec::new();
        for (n, item) in items.into_iter().enumerate() {
            let key = keys.get(n).filter(|_| cached);
            // Bound by move, taken back after: no copy per item.
            let (item, ok) = with_item(ctx, item, |ctx, item| {
                self.item_verdict((i, false), key, || {
                    self.stage_verdict(false, f, rel, item, ctx)
                })
            });
            if matches!(ok?, ItemVerdict::Where(true)) {
                passed.push(item);
                if let Some(k) = keys.get_mut(n) {
                    passed_keys.push(std::mem::take(k));
                }
                if let Some(a) = arcs.as_ref().and_then(|a| a.get(n)) {
                    passed_arcs.push(Arc::clone(a));
                }
            }
        }
        *keys = passed_keys;
        if arcs.is_some() {
            *arcs = Some(passed_arcs);
        }
        Ok(passed)
    }

    /// The items that pass the set's `require`; one that fails is a
    /// warning.
    fn require_items(
        &self,
        i: usize,
        rel: &Related,
        f: At<'_>,
        ctx: &mut Context,
        items: Vec<Value>,
        keys: &[String],
    ) -> Result<Vec<Value>> {
        let cached = !keys.is_empty() && self.reads_of(i, rel).require_item;
        let mut passed = Vec::with_capacity(items.len());
        for (n, item) in items.into_iter().enumerate() {
            let key = keys.get(n).filter(|_| cached);
            let (item, verdict) = with_item(ctx, item, |ctx, item| {
                self.item_verdict((i, true), key, || {
                    self.stage_verdict(true, f, rel, item, ctx)
                })
            });
            match verdict? {
                ItemVerdict::Require(Some(w)) => self.warnings.borrow_mut().push(w),
                _ => passed.push(item),
            }
        }
        Ok(passed)
    }

    /// Keeps for the triggers after this one what the set found: its
    /// objects as the store holds them, and a listField's result.
    fn remember_related(
        &self,
        rel: &Related,
        arcs: Option<Vec<Arc<Value>>>,
        keep: Option<PendingList>,
    ) {
        if let Some(a) = arcs {
            // (`require` drops objects not followed here: such a set
            // keys no listField.)
            if rel.require.is_empty() {
                self.caches.keep_objects(&rel.name, a);
            }
        }
        if let Some((key, bytes, warned)) = keep {
            let warnings = self.warnings.borrow()[warned..].to_vec();
            let bytes = limits::used().saturating_sub(bytes);
            self.caches
                .reserve_list(&rel.name, key, warnings, bytes, false);
        }
    }

    /// A related query rendered for this trigger: its kind, namespace, and
    /// the read it makes (names, selector, owner filter), its hits not yet
    /// known.
    fn related_read(
        &self,
        q: &ObjectQuery,
        f: At<'_>,
        ctx: &mut Context,
        trigger: Option<&Value>,
        view: &View,
    ) -> Result<(GroupKind, Option<String>, Read)> {
        let gk = GroupKind::new(&q.api_group, &q.kind);
        let ns = match &q.namespace {
            Some(t) => Some(self.tpl(At::Key(&f, "objects.namespace"), t, ctx)?),
            None => None,
        };
        let names: Option<BTreeSet<String>> = match &q.names {
            Some(n) => Some(
                self.strings(At::Key(&f, "objects.names"), n, ctx, None)?
                    .into_iter()
                    .collect(),
            ),
            None => None,
        };
        let selector = match &q.selector {
            Some(s) => Some(self.selector(At::Key(&f, "objects.selector"), s, ctx)?),
            None => None,
        };
        // Cached reads share their names and selector with the other
        // triggers' (the same for most triggers of a rule).
        let (read_gk, namespace, names, selector) = if self.caches.records() {
            let mut shared = view.interner.borrow_mut();
            (
                shared.kind(&gk),
                ns.clone().map(|n| shared.string(n)),
                names.map(|n| shared.names(n)),
                selector.map(|s| shared.selector(s)),
            )
        } else {
            (
                Arc::new(gk.clone()),
                ns.as_deref().map(Arc::from),
                names.map(Arc::new),
                selector.map(Arc::new),
            )
        };
        let read = Read {
            gk: read_gk,
            namespace,
            names,
            selector,
            either: false,
            owner: if q.controlled_by_trigger {
                // Without a trigger nothing is controlled by it.
                Some(OwnerFilter::Controller(trigger.map(Owner::of).unwrap_or(
                    Owner {
                        uid: "\u{0}none".into(),
                        gk: None,
                        name: String::new(),
                    },
                )))
            } else if !q.owned_by.is_empty() {
                Some(OwnerFilter::AnyOf(Arc::new(self.owner_uids(
                    &q.owned_by,
                    trigger,
                    ctx,
                ))))
            } else if !q.controlled_by.is_empty() || q.not_older_than.is_some() {
                Some(OwnerFilter::Lineage(Arc::new(
                    self.lineage_owners(q, trigger, ctx),
                )))
            } else {
                None
            },
            hits: Arc::default(),
        };
        Ok((gk, ns, read))
    }

    /// The objects a rendered related query finds (looked up once per
    /// rule and filters), its read recorded with what it hit.
    fn find_related(
        &self,
        i: usize,
        gk: &GroupKind,
        ns: Option<String>,
        read: Read,
        view: &View,
    ) -> Vec<Arc<Value>> {
        // The same lookup by another trigger of this rule finds the
        // same objects: cached for this evaluation (the view does not
        // change while one rule runs).
        self.caches.found_objects(
            (i, ns),
            read,
            |ns, read| look_up(gk, ns, read, view),
            |keys| view.interner.borrow_mut().hits(keys),
        )
    }

    /// A related set read from a listField: the entries of the sets it
    /// names, extracted, united and (when they read only the item)
    /// judged. `Break` when the list is cached from another trigger.
    #[allow(clippy::too_many_arguments)]
    fn list_field(
        &self,
        i: usize,
        rel: &Related,
        l: &ListFieldQuery,
        f: At<'_>,
        ctx: &mut Context,
        keys: &mut Vec<String>,
        judged: &mut bool,
        keep: &mut Option<PendingList>,
    ) -> Result<ControlFlow<Vec<Value>, Vec<Value>>> {
        let path = FieldPath::parse(&l.path).map_err(|e| {
            FieldError::new(ErrorKind::InvalidRule, format!("{f}.listField.path"), e)
        })?;
        let default_of = ["trigger".to_string()];
        let of = if l.of.is_empty() {
            &default_of[..]
        } else {
            &l.of[..]
        };
        let (cached, conditions_ok) = self.whole_list(i, rel, of, keep);
        if let Some(v) = cached {
            return Ok(ControlFlow::Break(v));
        }
        let held = self.held_sets(of);
        let trigger = self.caches.trigger();
        let sources = self.sources_of(of, ctx.data(), trigger.as_ref(), &held);
        let parts = self.extracted_parts(i, f, l, &path, sources)?;
        let items = self.union_items(i, rel, f, ctx, &parts, conditions_ok, keys)?;
        *judged = conditions_ok;
        Ok(ControlFlow::Continue(items))
    }

    /// A listField's list cached whole for another trigger reading the
    /// same source objects (items are de-duplicated and sorted), when its
    /// conditions read only the item; else, when it can be cached, its key
    /// in `keep`. And whether its conditions read only the item.
    fn whole_list(
        &self,
        i: usize,
        rel: &Related,
        of: &[String],
        keep: &mut Option<PendingList>,
    ) -> (Option<Vec<Value>>, bool) {
        let sources = self.caches.list_sources(of);
        let shape = self.reads_of(i, rel);
        let conditions_ok = shape.where_item && shape.require_item;
        if let (Some(addrs), true) = (sources, conditions_ok) {
            let key = (i, addrs);
            let read = !self.rule.unread.contains(&rel.name);
            if let Some(v) = self.caches.lend_list(&rel.name, &key, read, &self.warnings) {
                return (Some(v), conditions_ok);
            }
            *keep = Some((key, limits::used(), self.warnings.borrow().len()));
        }
        (None, conditions_ok)
    }

    /// The objects of the sets a listField names that no template reads,
    /// as the store holds them (with how much of them templates see):
    /// copied (as templates would see them) only when their entries are
    /// extracted afresh.
    fn held_sets<'o>(&self, of: &'o [String]) -> Vec<HeldSet<'o, '_>> {
        of.iter()
            .filter(|name| self.rule.unread.contains(*name))
            .filter_map(|name| {
                let seen = self.rule.related_seen_named(name)?;
                Some((name, self.caches.objects_of(name)?, seen))
            })
            .collect()
    }

    /// A listField's sources, read in place (only the items kept are
    /// copied): each with the store's object it was copied from, when
    /// known, by how much of it templates see and its address (its
    /// extracted entries are cached by these: a trigger in its own family
    /// shares them).
    fn sources_of<'s>(
        &'s self,
        of: &'s [String],
        data: &'s Value,
        trigger: Option<&'s Arc<Value>>,
        held: &'s [HeldSet<'s, 's>],
    ) -> Vec<(Source<'s>, Option<(usize, usize)>)> {
        let mut sources: Vec<(Source, Option<(usize, usize)>)> = Vec::new();
        // A one-shot render keeps nothing: no addresses.
        let pin = |o: &Arc<Value>| self.caches.pin(o);
        for name in of {
            if name == "trigger" {
                // Read where the store holds it: templates may
                // see only the parts of it they read.
                let seen = self
                    .rule
                    .spec
                    .trigger
                    .as_ref()
                    .map(|_| self.rule.trigger_seen());
                if let Some((o, m)) = trigger.zip(seen) {
                    let addr = pin(o).map(|a| (m.key(), a));
                    sources.push((Source::Held(o, m), addr));
                }
            } else if let Some((_, objs, seen)) = held.iter().find(|h| h.0 == name) {
                for o in objs {
                    let addr = pin(o).map(|a| (seen.key(), a));
                    sources.push((Source::Held(o, *seen), addr));
                }
            } else {
                let Some(values) = data["related"][name.as_str()].as_array() else {
                    continue;
                };
                match self.rule.related_seen_named(name) {
                    Some(seen) => self.caches.pin_related(name, values.len(), |n, addr| {
                        let addr = addr.map(|a| (seen.key(), a));
                        sources.push((Source::Seen(&values[n]), addr));
                    }),
                    None => sources.extend(values.iter().map(|v| (Source::Seen(v), None))),
                }
            }
        }
        sources
    }

    /// Each listField source's extracted entries (cached ones shared, not
    /// copied).
    fn extracted_parts(
        &self,
        i: usize,
        f: At<'_>,
        l: &ListFieldQuery,
        path: &FieldPath,
        sources: Vec<(Source<'_>, Option<(usize, usize)>)>,
    ) -> Result<Vec<Arc<ExtractedEntries>>> {
        let extract = self.list_extract(f, l)?;
        let fields = list_fields(f, &l.fields)?;
        let mut parts: Vec<Arc<ExtractedEntries>> = Vec::with_capacity(sources.len());
        // One source's list is cached whole (by its address) already.
        let several = sources.len() > 1;
        for (src, addr) in sources {
            let cache = addr.filter(|_| several).map(|(seen, a)| (i, seen, a));
            parts.push(self.source_entries(f, src, cache, path, extract.as_ref(), &fields));
        }
        Ok(parts)
    }

    /// The union of a listField's entries by text, read in place; judged
    /// by text here when its conditions read only the item, else with each
    /// item's text in `keys` for the judging after.
    #[allow(clippy::too_many_arguments)]
    fn union_items(
        &self,
        i: usize,
        rel: &Related,
        f: At<'_>,
        ctx: &mut Context,
        parts: &[Arc<ExtractedEntries>],
        conditions_ok: bool,
        keys: &mut Vec<String>,
    ) -> Result<Vec<Value>> {
        let mut union: Vec<(&str, &Value)> = parts
            .iter()
            .flat_map(|p| p.iter().map(|(t, v)| (t.as_str(), v)))
            .collect();
        union.sort_unstable_by(|a, b| a.0.cmp(b.0));
        union.dedup_by(|a, b| a.0 == b.0);
        if conditions_ok {
            // Judged by text, as below, without binding a copy of an
            // item whose verdicts are cached.
            let items = self.judge_entries(i, rel, f, &union, ctx)?;
            Ok(items)
        } else {
            let (texts, items): (Vec<String>, Vec<Value>) = union
                .into_iter()
                .map(|(t, v)| (t.to_string(), v.clone()))
                .unzip();
            *keys = texts;
            Ok(items)
        }
    }

    /// A listField's extract: its path and regex, compiled.
    fn list_extract(&self, f: At<'_>, l: &ListFieldQuery) -> Result<Option<Extract<'_>>> {
        Ok(match &l.extract {
            Some(x) => Some((
                FieldPath::parse(&x.path).map_err(|e| {
                    FieldError::new(
                        ErrorKind::InvalidRule,
                        format!("{f}.listField.extract.path"),
                        e,
                    )
                })?,
                self.regex(At::Key(&f, "listField.extract.regex"), &x.regex)?,
                x.unmatched,
            )),
            None => None,
        })
    }

    /// One listField source's entries: the list at `path` (a map there is
    /// one entry), each entry extracted by `extract`; cached under `cache`
    /// (and taken from there when cached before).
    fn source_entries(
        &self,
        f: At<'_>,
        src: Source<'_>,
        cache: Option<ExtractKey>,
        path: &FieldPath,
        extract: Option<&Extract<'_>>,
        fields: &[Vec<String>],
    ) -> Arc<ExtractedEntries> {
        self.caches.extracted(cache, &self.warnings, || {
            Arc::new(self.extract_entries(f, src, path, extract, fields))
        })
    }

    /// One listField source's entries, extracted afresh.
    fn extract_entries(
        &self,
        f: At<'_>,
        src: Source<'_>,
        path: &FieldPath,
        extract: Option<&Extract<'_>>,
        fields: &[Vec<String>],
    ) -> ExtractedEntries {
        let mut mine: Vec<(String, Value)> = Vec::new();
        let src: Cow<Value> = match src {
            Source::Seen(v) => Cow::Borrowed(v),
            Source::Held(o, seen) => shown(o, seen),
        };
        // A list's items are its entries; a map at the path is
        // one entry (e.g. the `metadata` of each related object).
        let entries: &[Value] = match path.get(&src) {
            Some(Value::Array(a)) => a,
            Some(m @ Value::Object(_)) => std::slice::from_ref(m),
            _ => &[],
        };
        for entry in entries {
            let item = match &extract {
                None => keep_fields(Cow::Borrowed(entry), fields),
                Some((xp, re, unmatched)) => {
                    let text = xp.get(entry).and_then(Value::as_str);
                    let caps = text.and_then(|t| re.captures(t));
                    let (Value::Object(m), Some(caps)) = (entry, caps) else {
                        match unmatched {
                            Unmatched::Drop => {}
                            Unmatched::Keep => {
                                let item = keep_fields(Cow::Borrowed(entry), fields);
                                mine.push((json_text(&item), item));
                            }
                            Unmatched::Warn => {
                                let shown = match (entry, text) {
                                    (Value::Object(_), Some(t)) => t.to_string(),
                                    (Value::Object(_), None) => "(missing)".to_string(),
                                    _ => entry.to_string(),
                                };
                                self.warnings.borrow_mut().push(FieldWarning::new(
                                    format!("{f}.listField.extract"),
                                    &shown,
                                    "does not match the extract regex",
                                ));
                            }
                        }
                        continue;
                    };
                    let mut m = m.clone();
                    for name in re.capture_names().flatten() {
                        if let Some(c) = caps.name(name) {
                            m.insert(name.to_string(), json!(c.as_str()));
                        }
                    }
                    keep_fields(Cow::Owned(Value::Object(m)), fields)
                }
            };
            mine.push((json_text(&item), item));
        }
        mine
    }

    /// The uids `ownedBy` names: the trigger's and those of the objects of
    /// the named earlier sets (as kept after their conditions).
    fn owner_uids(
        &self,
        of: &[String],
        trigger: Option<&Value>,
        ctx: &Context,
    ) -> BTreeSet<String> {
        let uid = |o: &Value| {
            o["metadata"]["uid"]
                .as_str()
                .filter(|u| !u.is_empty())
                .map(str::to_string)
        };
        let mut uids = BTreeSet::new();
        for name in of {
            if name == "trigger" {
                uids.extend(trigger.and_then(uid));
            } else if self
                .caches
                .with_objects(name, |objs| uids.extend(objs.iter().filter_map(|o| uid(o))))
                .is_none()
                && let Some(items) = ctx.data()["related"][name.as_str()].as_array()
            {
                uids.extend(items.iter().filter_map(uid));
            }
        }
        uids
    }

    /// The controllers `controlledBy` and `notOlderThan` accept, by uid,
    /// each with the creation time of its controlling ancestor in the
    /// `notOlderThan` set (walking up controller references through the
    /// trigger and the sets `controlledBy` names; a uid names the first
    /// object with it, ancestors first). Computed once per render, so the
    /// filter reads the found object alone (as the read index asks).
    fn lineage_owners(
        &self,
        q: &ObjectQuery,
        trigger: Option<&Value>,
        ctx: &Context,
    ) -> BTreeMap<String, Option<i64>> {
        // (uid, controller's uid, creation time) of each object of a set.
        type Fact = (String, Option<String>, Option<i64>);
        let fact = |o: &Value| -> Option<Fact> {
            let uid = o["metadata"]["uid"].as_str().filter(|u| !u.is_empty())?;
            Some((
                uid.to_string(),
                controller_uid(o).map(str::to_string),
                creation_time(o),
            ))
        };
        let facts = |name: &str| -> Vec<Fact> {
            if name == "trigger" {
                return trigger.and_then(fact).into_iter().collect();
            }
            self.caches
                .with_objects(name, |objs| objs.iter().filter_map(|o| fact(o)).collect())
                .or_else(|| {
                    let items = ctx.data()["related"][name].as_array()?;
                    Some(items.iter().filter_map(fact).collect())
                })
                .unwrap_or_default()
        };
        let allowed: Option<Vec<String>> = (!q.controlled_by.is_empty()).then(|| {
            let all = q.controlled_by.iter().flat_map(|n| facts(n));
            all.map(|(u, _, _)| u).collect()
        });
        let Some(set) = &q.not_older_than else {
            return allowed.into_iter().flatten().map(|u| (u, None)).collect();
        };
        // uid -> (an ancestor?, controller's uid, creation time).
        let mut nodes: BTreeMap<String, (bool, Option<String>, Option<i64>)> = BTreeMap::new();
        for (u, c, t) in facts(set) {
            nodes.entry(u).or_insert((true, c, t));
        }
        let through = std::iter::once("trigger").chain(
            q.controlled_by
                .iter()
                .map(String::as_str)
                .filter(|n| *n != "trigger"),
        );
        for name in through {
            for (u, c, t) in facts(name) {
                nodes.entry(u).or_insert((false, c, t));
            }
        }
        let ancestor_time = |start: &str| -> Option<i64> {
            let mut seen = BTreeSet::new();
            let mut at = start;
            loop {
                if !seen.insert(at) {
                    return None;
                }
                let (ancestor, controller, created) = nodes.get(at)?;
                if *ancestor {
                    return *created;
                }
                at = controller.as_deref()?;
            }
        };
        let candidates: Vec<String> = match allowed {
            Some(a) => a,
            None => nodes.keys().cloned().collect(),
        };
        candidates
            .into_iter()
            .filter_map(|u| ancestor_time(&u).map(|t| (u, Some(t))))
            .collect()
    }

    /// What related set `i`'s conditions read. A condition that reads
    /// nothing but `item` has a verdict that follows from the item's text
    /// alone.
    fn reads_of(&self, i: usize, rel: &Related) -> Shape {
        let all = |cs: &[Condition], roots: &[&str]| cs.iter().all(|c| self.reads_within(c, roots));
        self.caches.shape(i, || Shape {
            where_item: all(&rel.filter, &["item"]),
            require_item: all(&rel.require, &["item"]),
            where_item_trigger: all(&rel.filter, &["item", "trigger"]),
        })
    }

    /// Whether a condition reads nothing but `roots`.
    fn reads_within(&self, c: &Condition, roots: &[&str]) -> bool {
        let t = &self.engine.templates;
        [&c.value, &c.equals, &c.not_equals, &c.regex, &c.not_regex]
            .into_iter()
            .flatten()
            .chain(c.one_of.iter().flatten())
            .all(|text| t.reads_within(text, roots))
            && c.in_list
                .as_ref()
                .is_none_or(|e| t.expr_reads_within(e, roots))
    }

    /// Related objects whose `where` reads only the object and the
    /// trigger: each verdict is cached by both objects' addresses, and the
    /// list of those cached by their addresses, so a family's revisions
    /// judge and copy each other once. `None` when the set is not such.
    fn cached_objects(
        &self,
        i: usize,
        rel: &Related,
        found: &[&Arc<Value>],
        seen: Sight<'_>,
        ctx: &mut Context,
    ) -> Option<Result<Vec<Value>>> {
        if !rel.require.is_empty() || !self.reads_of(i, rel).where_item_trigger {
            return None;
        }
        let passed = self
            .caches
            .judged_objects(i, found, |o| self.object_passes(i, rel, o, seen, ctx));
        let passed = match passed {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        // Read only by reference (a listField's source): not copied.
        let hollow = self.rule.unread.contains(&rel.name);
        // Read only by its truth: nulls stand for its objects.
        let truth = self.rule.presence.contains(&rel.name);
        let items =
            self.caches
                .objects_list((i, &rel.name), passed, hollow, &self.warnings, |passed| {
                    if truth {
                        vec![Value::Null; passed.len()]
                    } else {
                        passed.iter().map(|o| visible(o, seen)).collect()
                    }
                });
        Some(Ok(items))
    }

    /// Whether related object `o` passes set `i`'s `where` (conditions
    /// that read only the object and the trigger): judged on a copy of
    /// what they read of it.
    fn object_passes(
        &self,
        i: usize,
        rel: &Related,
        o: &Arc<Value>,
        seen: Sight<'_>,
        ctx: &mut Context,
    ) -> Result<bool> {
        let related_at = At::Field("spec.related");
        let f = At::Index(&related_at, i);
        // Only what the conditions read of it is copied.
        let projected = self.item_paths(i, &rel.filter);
        let item = match &*projected {
            Some(paths) => project(o, paths, seen),
            None => visible(o, seen),
        };
        let judge = |ctx: &Context, item: &Value| {
            for (j, c) in rel.filter.iter().enumerate() {
                if !self.condition(At::Index(&At::Key(&f, "where"), j), c, item, ctx)? {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        let (_, ok) = with_item(ctx, item, judge);
        #[cfg(debug_assertions)]
        if projected.is_some() {
            // The projection judges as the whole object does
            // (on a budget of its own).
            let _budget = limits::start(&self.engine.options.limits);
            let (_, whole) = with_item(ctx, visible(o, seen), judge);
            debug_assert_eq!(ok, whole, "a projection of {} judged apart", o);
        }
        ok
    }

    /// The entries of a listField (its union, by text) its conditions keep,
    /// copied; judged as the stages below judge them (all `where`
    /// verdicts, then `require` on those kept), each verdict by the entry's
    /// text, and an entry bound to `item` only to be judged afresh.
    fn judge_entries(
        &self,
        i: usize,
        rel: &Related,
        f: At<'_>,
        union: &[(&str, &Value)],
        ctx: &mut Context,
    ) -> Result<Vec<Value>> {
        let mut passed: Vec<(&str, &Value)> = Vec::with_capacity(union.len());
        if rel.filter.is_empty() {
            passed.extend_from_slice(union);
        } else {
            for &(text, item) in union {
                let verdict = self.verdict_by_text((i, false), text, item, ctx, |ctx, item| {
                    self.stage_verdict(false, f, rel, item, ctx)
                })?;
                if matches!(verdict, ItemVerdict::Where(true)) {
                    passed.push((text, item));
                }
            }
        }
        let mut out = Vec::with_capacity(passed.len());
        for (text, item) in passed {
            if rel.require.is_empty() {
                out.push(item.clone());
                continue;
            }
            let verdict = self.verdict_by_text((i, true), text, item, ctx, |ctx, item| {
                self.stage_verdict(true, f, rel, item, ctx)
            })?;
            match verdict {
                ItemVerdict::Require(Some(w)) => self.warnings.borrow_mut().push(w),
                _ => out.push(item.clone()),
            }
        }
        Ok(out)
    }

    /// [`Evaluator::item_verdict`] for an entry read in place: bound to
    /// `item` (a copy) only when judged afresh.
    fn verdict_by_text(
        &self,
        slot: (usize, bool),
        text: &str,
        item: &Value,
        ctx: &mut Context,
        run: impl FnOnce(&Context, &Value) -> Result<ItemVerdict>,
    ) -> Result<ItemVerdict> {
        self.caches
            .item_verdict(slot, text, || with_item(ctx, item.clone(), run).1)
    }

    /// A related set's `where` conditions on one item (in order), or with
    /// `require` its `require` conditions: the warning of the first failed.
    fn stage_verdict(
        &self,
        require: bool,
        f: At<'_>,
        rel: &Related,
        item: &Value,
        ctx: &Context,
    ) -> Result<ItemVerdict> {
        if require {
            for (j, c) in rel.require.iter().enumerate() {
                if let Some(w) = self.check(At::Index(&At::Key(&f, "require"), j), c, item, ctx)? {
                    return Ok(ItemVerdict::Require(Some(w)));
                }
            }
            return Ok(ItemVerdict::Require(None));
        }
        for (j, c) in rel.filter.iter().enumerate() {
            if !self.condition(At::Index(&At::Key(&f, "where"), j), c, item, ctx)? {
                return Ok(ItemVerdict::Where(false));
            }
        }
        Ok(ItemVerdict::Where(true))
    }

    /// The paths of `item` related set `i`'s conditions read, when they
    /// read it only by paths of object keys (see [`project`]); `None`
    /// otherwise. Found once per rule run.
    fn item_paths(&self, i: usize, conditions: &[Condition]) -> ItemPaths {
        self.caches
            .item_paths(i, || self.condition_paths(conditions))
    }

    fn condition_paths(&self, conditions: &[Condition]) -> Option<Vec<Vec<String>>> {
        let t = &self.engine.templates;
        let mut paths = Vec::new();
        for c in conditions {
            if let Some(p) = &c.path {
                let path = FieldPath::parse(p).ok()?;
                let keys = leading_keys(path.segments());
                if keys.is_empty() {
                    return None;
                }
                paths.push(keys);
            }
            let templates = [&c.value, &c.equals, &c.not_equals, &c.regex, &c.not_regex];
            for text in templates
                .into_iter()
                .flatten()
                .chain(c.one_of.iter().flatten())
            {
                paths.extend(t.paths_under(text, "item")?);
            }
            if let Some(e) = &c.in_list {
                paths.extend(t.expr_paths_under(e, "item")?);
            }
        }
        Some(paths)
    }

    /// One stage's verdict on an item: from the cache when `key` (the
    /// item's text) is given and was judged before, charging the budget
    /// what judging it charged; else judged by `run` (errors not cached).
    fn item_verdict(
        &self,
        slot: (usize, bool),
        key: Option<&String>,
        run: impl FnOnce() -> Result<ItemVerdict>,
    ) -> Result<ItemVerdict> {
        match key {
            Some(key) => self.caches.item_verdict(slot, key, run),
            None => run(),
        }
    }

    /// Renders every output for one trigger (or the static set), then
    /// takes back the cached values it lent to `ctx`.
    pub(super) fn render(
        &self,
        ctx: &mut Context,
        trigger: Option<&Value>,
        view: &View,
    ) -> Result<Vec<Desired>> {
        let out = self.render_lent(ctx, trigger, view);
        if let Ok(outs) = &out {
            self.note_input(ctx, outs);
        }
        self.caches.take_back(ctx.data_mut());
        out
    }

    /// Notes what the trigger read (itself and its related objects, as the
    /// rule sees them), which its outputs may amplify (`limits::admit`):
    /// measured only when the outputs hold more than the floor, which
    /// needs no input (a walk of every trigger's related sets would cost
    /// each trigger the size of sets the triggers share).
    fn note_input(&self, ctx: &Context, outs: &[Desired]) {
        let floor = self.engine.options.limits.output_floor_per_trigger;
        let mut held = 0usize;
        for d in outs {
            held = held.saturating_add(limits::manifest_weight(&d.object));
            if held > floor {
                let data = ctx.data();
                limits::note_input(
                    limits::weight(&data["trigger"])
                        .saturating_add(limits::weight(&data["related"])),
                );
                return;
            }
        }
    }

    /// A var's key in the cache: when its expression reads nothing but
    /// related lists, each of them cached (by its token).
    fn var_key(&self, i: usize, expr: &str) -> Option<VarKey> {
        self.caches.var_key(i, || {
            if !self.engine.templates.expr_reads_only(expr, "related") {
                return None;
            }
            let names: Vec<&str> = self
                .rule
                .spec
                .related
                .iter()
                .map(|r| r.name.as_str())
                .collect();
            named_reads(&[expr], "related", &names)
        })
    }

    /// A var's value: cached, or evaluated (and cached when it has a key).
    fn var_value(&self, i: usize, name: &str, expr: &str, ctx: &Context) -> Result<Value> {
        let vars_at = At::Field("spec.vars");
        let at = At::Index(&vars_at, i);
        let field = At::Key(&at, "value");
        let key = self.var_key(i, expr);
        self.caches
            .var(name, key, || Ok(self.expr(field, expr, ctx)?.into_owned()))
    }

    /// Renders the related sets, then the vars, then the outputs, each
    /// stage reading the ones before it in the context.
    fn render_lent(
        &self,
        ctx: &mut Context,
        trigger: Option<&Value>,
        view: &View,
    ) -> Result<Vec<Desired>> {
        self.bind_related(ctx, trigger, view)?;
        self.bind_vars(ctx)?;
        self.outputs(ctx, trigger, view)
    }

    /// Binds each related set as `related.<name>`, in order.
    fn bind_related(&self, ctx: &mut Context, trigger: Option<&Value>, view: &View) -> Result<()> {
        for (i, rel) in self.rule.spec.related.iter().enumerate() {
            let set = self.related(i, rel, ctx, trigger, view)?;
            if let Some(r) = ctx
                .data_mut()
                .get_mut("related")
                .and_then(Value::as_object_mut)
            {
                r.insert(rel.name.clone(), Value::Array(set));
            }
        }
        Ok(())
    }

    /// Binds each var as `vars.<name>`, in order.
    fn bind_vars(&self, ctx: &mut Context) -> Result<()> {
        bind(ctx, "vars", Value::Object(Map::new()));
        let vars_at = At::Field("spec.vars");
        for (i, v) in self.rule.spec.vars.iter().enumerate() {
            let at = At::Index(&vars_at, i);
            let value = self.var_value(i, &v.name, &v.value, ctx)?;
            if let Value::Array(a) = &value {
                limited(
                    At::Key(&at, "value"),
                    limits::check_list(a.len(), format_args!("var {:?}", v.name)),
                )?;
            }
            if let Some(vars) = ctx
                .data_mut()
                .get_mut("vars")
                .and_then(Value::as_object_mut)
            {
                vars.insert(v.name.clone(), value);
            }
        }
        Ok(())
    }

    /// Renders every output (once, or per entry of its `forEach`).
    fn outputs(
        &self,
        ctx: &mut Context,
        trigger: Option<&Value>,
        view: &View,
    ) -> Result<Vec<Desired>> {
        let mut out: Vec<Desired> = Vec::new();
        for (i, o) in self.rule.spec.outputs.iter().enumerate() {
            // Spelled once per rule (never missing: one per output).
            let field: Arc<str> = match self.rule.output_fields.get(i) {
                Some(f) => Arc::clone(f),
                None => format!("spec.outputs[{i}]").into(),
            };
            let f: &str = &field;
            let one = |this: &Self,
                       ctx: &mut Context,
                       out: &mut Vec<Desired>,
                       loops: Option<&Loop<'_>>| {
                if let Some(w) = &o.when
                    && !truthy(&*this.expr(At::Key(&At::Field(f), "when"), w, ctx)?)
                {
                    return Ok(());
                }
                let d = this.object(&field, o, ctx, (trigger, view), loops)?;
                if let Some(prev) = out
                    .iter()
                    .find(|p| p.kind == d.kind && p.namespace == d.namespace && p.name == d.name)
                {
                    if prev.object != d.object {
                        return Err(FieldError::new(
                            ErrorKind::Conflict,
                            f,
                            format!(
                                "{} {:?} is emitted twice with different content",
                                d.kind, d.name
                            ),
                        ));
                    }
                    return Ok(());
                }
                out.push(d);
                limited(f, limits::check_objects(out.len()))
            };
            match &o.for_each {
                None => one(self, ctx, &mut out, None)?,
                Some(e) => {
                    let var = o.as_name.as_deref().unwrap_or("item");
                    // An output is not one template value to search for
                    // the list's name: its list is always copied.
                    let scope = Loop {
                        name: var,
                        bound: None,
                        outer: None,
                    };
                    self.for_each(
                        At::Key(&At::Field(f), "forEach"),
                        e,
                        scope,
                        |_| false,
                        ctx,
                        |ctx, l| one(self, ctx, &mut out, Some(l)),
                    )?;
                }
            }
        }
        Ok(out)
    }

    /// One output of a trigger: its metadata, then a role's rules or a
    /// binding's roleRef and subjects, checked as Kubernetes would;
    /// expanded inside `loops` (an output's `forEach`).
    fn object(
        &self,
        field: &Arc<str>,
        o: &crate::api::Output,
        ctx: &mut Context,
        (trigger, view): (Option<&Value>, &View),
        loops: Option<&Loop<'_>>,
    ) -> Result<Desired> {
        let f: &str = field;
        // Field names are built once: most are read only by an error.
        let at = At::Field(f);
        let name_field = At::Key(&at, "name");
        let name = self.tpl(name_field, &o.name, ctx)?;
        output::validate_name(name_field, &name)?;
        super::tenant::check_output_name(&self.rule.name, o.kind, name_field, &name)?;
        let namespace = self.object_namespace(&at, o, ctx, trigger)?;
        let (labels, annotations, tref) = self.object_marks(&at, o, ctx, trigger, loops)?;
        // A `*` from data: the object is refused (and revoked) after the
        // render, not failed.
        let mut refusal = None;
        let body = if o.kind.is_role() {
            self.role_body(&at, o, ctx, (view, loops), &mut refusal)?
        } else {
            self.binding_body(&at, o, ctx, loops, &mut refusal)?
        };
        let mut shared = view.interner.borrow_mut();
        // Shared by the objects of a rule, an output, a trigger.
        let rule = shared.string(self.rule.name.clone());
        let field = Arc::clone(field);
        let trigger_ref = tref.map(|r| shared.string(r));
        let meta = Meta {
            name: name.clone(),
            namespace: namespace.clone(),
            labels: shared.map(labels),
            annotations: shared.map(annotations),
            owner: trigger.and_then(|t| owner_reference(t, namespace.as_deref(), &mut shared)),
        };
        drop(shared);
        let object = Manifest::new(o.kind, meta, body);
        output::validate_object_size(at, &object)?;
        Ok(Desired {
            kind: o.kind,
            namespace: namespace.unwrap_or_default(),
            name,
            rule,
            trigger: trigger_ref,
            field,
            refusal,
            object,
        })
    }

    /// An output's namespace: rendered, or the trigger's (none for a
    /// cluster-scoped kind).
    fn object_namespace(
        &self,
        at: &At<'_>,
        o: &crate::api::Output,
        ctx: &mut Context,
        trigger: Option<&Value>,
    ) -> Result<Option<String>> {
        let f = at;
        Ok(if o.kind.namespaced() {
            let ns = match &o.namespace {
                Some(t) => self.tpl(At::Key(at, "namespace"), t, ctx)?,
                None => default_namespace(trigger).ok_or_else(|| {
                    FieldError::new(
                        ErrorKind::InvalidRule,
                        format!("{f}.namespace"),
                        format!(
                            "a {} needs a namespace: the trigger has none, so give one",
                            o.kind
                        ),
                    )
                })?,
            };
            output::validate_namespace(At::Key(at, "namespace"), &ns)?;
            Some(ns)
        } else {
            None
        })
    }

    /// An output's labels and annotations: rendered, checked, with the
    /// engine's provenance added; and the trigger's reference.
    #[allow(clippy::type_complexity)]
    fn object_marks(
        &self,
        at: &At<'_>,
        o: &crate::api::Output,
        ctx: &mut Context,
        trigger: Option<&Value>,
        loops: Option<&Loop<'_>>,
    ) -> Result<(
        BTreeMap<String, String>,
        BTreeMap<String, String>,
        Option<String>,
    )> {
        let labels_field = At::Key(at, "labels");
        let annotations_field = At::Key(at, "annotations");
        let mut labels = BTreeMap::new();
        if let Some(l) = &o.labels {
            labels = output::string_map(
                labels_field,
                &self.expand(l, ctx, labels_field, Pass::plain(loops))?,
            )?;
        }
        let mut annotations = BTreeMap::new();
        if let Some(a) = &o.annotations {
            annotations = output::string_map(
                annotations_field,
                &self.expand(a, ctx, annotations_field, Pass::plain(loops))?,
            )?;
        }
        for k in labels.keys().chain(annotations.keys()) {
            let reserved = k
                .strip_prefix(GROUP)
                .is_some_and(|rest| rest.starts_with('/'));
            if reserved || k == MANAGED_BY_LABEL {
                return Err(FieldError::new(
                    ErrorKind::InvalidRule,
                    labels_field.to_string(),
                    format!("key {k:?} is reserved for provenance"),
                ));
            }
        }
        for (k, v) in &labels {
            output::validate_key(labels_field, k)?;
            output::validate_label_value(labels_field, k, v)?;
        }
        for k in annotations.keys() {
            output::validate_key(annotations_field, k)?;
        }
        labels.insert(MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string());
        labels.insert(
            output::rule_label(),
            super::tenant::rule_label_value(&self.rule.name),
        );
        annotations.insert(output::rule_annotation(), self.rule.name.clone());
        if self.rule.spec.deletion_policy == crate::api::DeletionPolicy::Delete {
            annotations.insert(
                output::deletion_policy_annotation(),
                crate::api::DeletionPolicy::Delete.as_str().to_string(),
            );
        }
        // Spelled once: the annotation and the object's provenance.
        let tref = trigger.map(object_ref);
        if let Some(r) = &tref {
            annotations.insert(output::trigger_annotation(), r.clone());
        }
        output::validate_annotations_size(annotations_field, &annotations)?;
        Ok((labels, annotations, tref))
    }

    /// A role's body: its rules (rendered, and copied by rulesFrom) and
    /// aggregation rule.
    fn role_body(
        &self,
        at: &At<'_>,
        o: &crate::api::Output,
        ctx: &mut Context,
        (view, loops): (&View, Option<&Loop<'_>>),
        refusal: &mut Option<FieldError>,
    ) -> Result<Body> {
        let f = at;
        let namespaced = o.kind.namespaced();
        let mut rules: Arc<Vec<PolicyRule>> = match &o.rules {
            Some(r) => {
                let pass = Pass::marked(loops);
                self.rendered_rules(At::Key(at, "rules"), r, (namespaced, pass), ctx, refusal)?
            }
            None => Arc::new(Vec::new()),
        };
        if let Some(rf) = &o.rules_from {
            let roles = self.rules_from(&format!("{f}.rulesFrom"), rf, ctx, (view, loops))?;
            if rules.is_empty() {
                // Copies only: the same roles give the same rules,
                // shared (namespaces accepting the same types).
                rules = view.copied_rules(&roles, namespaced);
            } else {
                let mut all = rules.to_vec();
                for role in &roles {
                    all.extend(view.role_rules(*role).iter().cloned());
                }
                if namespaced {
                    all = policy::without_non_resource_urls(&all);
                }
                rules = Arc::new(policy::compact(&all));
            }
        }
        let aggregation = match &o.aggregation_rule {
            Some(a) => Some(output::aggregation_rule(
                At::Key(at, "aggregationRule"),
                &self.expand(a, ctx, At::Key(at, "aggregationRule"), Pass::plain(loops))?,
            )?),
            None => None,
        };
        Ok(Body::Role { rules, aggregation })
    }

    /// A role's rendered rules, checked (a cached expansion's checked
    /// rules reused).
    fn rendered_rules(
        &self,
        field: At<'_>,
        r: &Value,
        (namespaced, pass): (bool, Pass<'_>),
        ctx: &mut Context,
        refusal: &mut Option<FieldError>,
    ) -> Result<Arc<Vec<PolicyRule>>> {
        let cached = self.cached_policy(r, pass);
        let key = self.expansion_key(r, false, pass.marked);
        // Not cached as a whole: its entries' checked rules may be.
        let by_entry = cached.is_none() && key.is_none() && r.is_array();
        let spans = RefCell::new(Vec::new());
        let whole = Pass {
            spans: by_entry.then_some(&spans),
            ..pass
        };
        // Cached whole, it is read again only through its
        // checked rules (cached below, or the expansion dropped).
        let expanded = match cached {
            Some(_) => Ok(Value::Null),
            None => self.expand_as(r, ctx, field, whole, key.is_some()),
        };
        let spans = by_entry.then(|| spans.into_inner());
        Ok(match cached {
            Some((rules, r)) => {
                *refusal = r;
                rules
            }
            None => {
                let mut expanded = expanded?;
                let shared = spans.and_then(|spans| {
                    self.entry_policies(field, &mut expanded, &spans, namespaced)
                });
                if let Some(shared) = shared {
                    let (rules, r) = shared?;
                    *refusal = r;
                    rules
                } else {
                    let checked = output::check_marked_rules(field, &mut expanded).and_then(|r| {
                        output::policy_rules(field, expanded, namespaced)
                            .map(|rules| (Arc::new(rules), r))
                    });
                    let (rules, r) = match checked {
                        Ok(c) => c,
                        Err(e) => {
                            // Cached as null: never without its
                            // checked rules.
                            if let Some(key) = &key {
                                self.caches.forget_expansion(key);
                            }
                            return Err(e);
                        }
                    };
                    *refusal = r;
                    // Checked once for the outputs of a cached expansion.
                    if let Some(key) = key {
                        self.caches.remember_checked_policy(key, &rules, refusal);
                    }
                    rules
                }
            }
        })
    }

    /// A binding's body: its roleRef, checked against its kind, and its
    /// subjects.
    fn binding_body(
        &self,
        at: &At<'_>,
        o: &crate::api::Output,
        ctx: &mut Context,
        loops: Option<&Loop<'_>>,
        refusal: &mut Option<FieldError>,
    ) -> Result<Body> {
        let f = at;
        let rr = o.role_ref.as_ref().ok_or_else(|| {
            FieldError::new(
                ErrorKind::InvalidRule,
                format!("{f}.roleRef"),
                "a binding needs roleRef",
            )
        })?;
        let role_kind = self.tpl(At::Key(at, "roleRef.kind"), &rr.kind, ctx)?;
        let role_name = self.tpl(At::Key(at, "roleRef.name"), &rr.name, ctx)?;
        let allowed: &[&str] = if o.kind == OutputKind::ClusterRoleBinding {
            &["ClusterRole"]
        } else {
            &["ClusterRole", "Role"]
        };
        if !allowed.contains(&role_kind.as_str()) {
            return Err(FieldError::new(
                ErrorKind::InvalidOutput,
                format!("{f}.roleRef.kind"),
                format!(
                    "a {} may reference {}, not {role_kind:?}",
                    o.kind,
                    allowed.join(" or ")
                ),
            ));
        }
        output::validate_name(At::Key(at, "roleRef.name"), &role_name)?;
        let subjects = match &o.subjects {
            Some(s) => {
                // Names from data are marked: never a `system:` one.
                let pass = Pass::marked(loops);
                let expanded = self.expand(s, ctx, At::Key(at, "subjects"), pass);
                let (subjects, r) =
                    output::marked_subjects(At::Key(at, "subjects"), expanded?, o.kind)?;
                *refusal = refusal.take().or(r);
                subjects
            }
            None => Vec::new(),
        };
        Ok(Body::Binding {
            role_kind,
            role_name,
            subjects,
        })
    }

    /// The policy rules of an expanded rule list and its refusal, checked
    /// entry by entry of its template (`spans`) in the order, and with the
    /// errors, of a check of the whole list: an entry in the cache
    /// with rules checked before (no refusal) reuses them (its items may be
    /// left out of `expanded`), the others are checked here. `None` when
    /// the spans do not cover the list (never so without a cached entry).
    fn entry_policies(
        &self,
        field: At<'_>,
        expanded: &mut Value,
        spans: &[Span],
        namespaced: bool,
    ) -> Option<Result<super::memo::CachedPolicy>> {
        let Value::Array(items) = expanded else {
            return None;
        };
        if spans.last().map_or(0, |s| s.end) != items.len() {
            return None;
        }
        let cached: Vec<Option<Arc<Vec<PolicyRule>>>> = spans
            .iter()
            .map(|s| s.key.as_ref().and_then(|k| self.caches.entry_rules(k)))
            .collect();
        // Put together before from the same parts: shared, not copied.
        // Only a list with cached entries is worth keeping (its triggers
        // share them); one whose entries all read the trigger is not. A
        // list put together without a refusal had every cached entry's rules
        // checked and cached: its parts are the entries' keys and the other
        // entries' text (taken before the check strips its marks).
        let keyed = spans.iter().any(|s| s.key.is_some());
        let assembly = keyed.then(|| {
            let parts = spans.iter().map(|s| match &s.key {
                Some(key) => AssemblyPart::Cached(key.clone()),
                None => AssemblyPart::Text(
                    items
                        .get(s.start..s.end)
                        .and_then(|part| serde_json::to_string(part).ok())
                        .unwrap_or_default(),
                ),
            });
            (namespaced, parts.collect::<Vec<_>>())
        });
        // Found only when every cached entry's checked rules are cached now.
        let all_cached = spans
            .iter()
            .zip(&cached)
            .all(|(s, k)| s.key.is_none() || k.is_some());
        if let Some(rules) = assembly
            .as_ref()
            .filter(|_| all_cached)
            .and_then(|a| self.caches.assembled_rules(a))
        {
            return Some(Ok((rules, None)));
        }
        let mut refusal = None;
        let mut refused = vec![false; spans.len()];
        for (n, s) in spans.iter().enumerate() {
            if cached[n].is_some() {
                continue;
            }
            let part = items.get_mut(s.start..s.end)?;
            match output::check_marked_items(field, s.start, part) {
                Err(e) => return Some(Err(e)),
                Ok(Some(r)) => {
                    refused[n] = true;
                    refusal.get_or_insert(r);
                }
                Ok(None) => {}
            }
        }
        let mut rules = Vec::with_capacity(items.len());
        for (n, s) in spans.iter().enumerate() {
            if let Some(k) = &cached[n] {
                rules.extend(k.iter().cloned());
                continue;
            }
            let part = items.get_mut(s.start..s.end)?;
            output::strip_marked_items(part);
            let checked = match output::policy_items(field, s.start, part, namespaced) {
                Ok(c) => c,
                Err(e) => return Some(Err(e)),
            };
            if let Some(key) = s.key.as_ref().filter(|_| !refused[n]) {
                self.caches.remember_entry_rules(key, &checked);
            }
            rules.extend(checked);
        }
        let rules = Arc::new(rules);
        if let Some(a) = assembly.filter(|_| refusal.is_none()) {
            self.caches.remember_assembled(a, &rules);
        }
        Some(Ok((rules, refusal)))
    }

    /// Rules of the ClusterRoles named or selected, in name order.
    fn rules_from<'v>(
        &self,
        f: &str,
        rf: &RulesFrom,
        ctx: &mut Context,
        (view, loops): (&View<'v>, Option<&Loop<'_>>),
    ) -> Result<Vec<Seen<'v>>> {
        let names: BTreeSet<String> = match &rf.cluster_role_names {
            Some(n) => self
                .strings(At::Key(&At::Field(f), "clusterRoleNames"), n, ctx, loops)?
                .into_iter()
                .collect(),
            None => BTreeSet::new(),
        };
        let selector = match &rf.cluster_role_selector {
            Some(s) => {
                Some(self.selector(At::Key(&At::Field(f), "clusterRoleSelector"), s, ctx)?)
            }
            None => None,
        };
        let gk = output_gk(OutputKind::ClusterRole);
        // Read in compact form: no JSON of the roles is built.
        let mut chosen: BTreeMap<&str, Seen<'v>> = BTreeMap::new();
        for n in &names {
            if let Some(role) = view.get_seen(&gk, &(String::new(), n.clone())) {
                chosen.insert(n.as_str(), role);
            }
        }
        if let Some(s) = &selector {
            for role in view.selected_cluster_roles(s).iter().copied() {
                chosen.insert(role.name(), role);
            }
        }
        if !self.caches.records() {
            return Ok(self.copied_sources(f, chosen, &names, view));
        }
        // Roles found by name are reached through `names` when they
        // change: only those the selector found are cached as hits (left
        // out or not: a change to one may put it in).
        let hits = chosen
            .keys()
            .filter(|n| !names.contains(**n))
            .map(|n| (String::new(), (*n).to_string()))
            .collect();
        let roles = self.copied_sources(f, chosen, &names, view);
        // Shared with the reads of other triggers that made the same.
        let mut shared = view.interner.borrow_mut();
        let names = shared.names(names);
        let selector = selector.map(|s| shared.selector(s));
        let hits = shared.hits(hits);
        let gk = shared.kind(&gk);
        drop(shared);
        self.caches.record_read(Read {
            gk,
            namespace: None,
            hits,
            names: Some(names),
            selector,
            either: true,
            owner: None,
        });
        Ok(roles)
    }
}

impl Evaluator<'_> {
    /// The sources a copy (`rulesFrom`) takes, in name order: all but
    /// those left out, each with a warning — a role no rule manages that
    /// only the selector found (its labels are data, not the rule
    /// author's choice), and a role whose rules policy would refuse
    /// ([`crate::policy::copy_refusal`]), so that neither refuses the copy
    /// of the others.
    fn copied_sources<'v>(
        &self,
        f: &str,
        chosen: BTreeMap<&str, Seen<'v>>,
        names: &BTreeSet<String>,
        view: &View<'v>,
    ) -> Vec<Seen<'v>> {
        let mut kept = Vec::with_capacity(chosen.len());
        for (name, role) in chosen {
            // A live role is a rule's when it carries our label and names
            // its rule (a label alone is what anyone may write).
            let managed = match role {
                Seen::Emitted(_) => true,
                Seen::Observed(o) => {
                    super::grants::ours(o)
                        && o["metadata"]["annotations"][output::rule_annotation()].is_string()
                }
            };
            let why: Option<Cow<'_, str>> = if !managed && !names.contains(name) {
                Some(Cow::Borrowed(policy::LEFT_OUT_UNMANAGED))
            } else {
                view.copy_refusal(&view.role_rules(role))
                    .map(|why| Cow::Owned(format!("{}{why}", policy::LEFT_OUT_REFUSED)))
            };
            match why {
                Some(why) => self
                    .warnings
                    .borrow_mut()
                    .push(FieldWarning::new(f, name, why)),
                None => kept.push(role),
            }
        }
        kept
    }
}

/// The objects a read finds, whatever their owners: looked up by name
/// when named in one namespace (or cluster-scoped), else listed.
fn look_up(gk: &GroupKind, ns: Option<&String>, read: &Read, view: &View) -> Vec<Arc<Value>> {
    let unowned = Read {
        owner: None,
        ..read.clone()
    };
    match (&read.names, ns) {
        // Named in one namespace (or cluster-scoped): looked
        // up, not listed.
        (Some(names), Some(ns)) => names
            .iter()
            .filter_map(|n| view.get_shared(gk, &(ns.clone(), n.clone())))
            .filter(|o| unowned.passes(o))
            .cloned()
            .collect(),
        _ => view
            .list(gk, ns.map(String::as_str))
            .iter()
            .filter(|o| unowned.passes(o))
            .map(|o| Arc::clone(o))
            .collect(),
    }
}

/// A value's compact JSON text, as its `Display` writes it but without
/// the formatter in between (an entry's text is its key).
fn json_text(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| v.to_string())
}

/// A render error: `LimitExceeded` when the trigger ran over a limit
/// (whatever failed first), else a template error.
fn template_error(field: impl std::fmt::Display, message: String) -> FieldError {
    match limits::tripped() {
        Some(t) => FieldError::new(ErrorKind::LimitExceeded, field.to_string(), t),
        None => FieldError::new(ErrorKind::Template, field.to_string(), message),
    }
}

/// A limit check's result as an error on `field`.
fn limited(field: impl std::fmt::Display, r: std::result::Result<(), String>) -> Result<()> {
    r.map_err(|m| FieldError::new(ErrorKind::LimitExceeded, field.to_string(), m))
}

/// Role and RoleBinding default to the trigger's namespace, or to the
/// trigger itself when it is a Namespace.
fn default_namespace(trigger: Option<&Value>) -> Option<String> {
    let t = trigger?;
    let (ns, name) = key_of(t)?;
    if !ns.is_empty() {
        return Some(ns);
    }
    let gk = GroupKind::of(t)?;
    (gk.group.is_empty() && gk.kind == "Namespace").then_some(name)
}

/// A controller ownerReference to the trigger, where Kubernetes allows it:
/// the trigger has a uid, and is cluster-scoped or in the object's namespace.
fn owner_reference(
    trigger: &Value,
    namespace: Option<&str>,
    shared: &mut Interner,
) -> Option<OwnerRef> {
    let meta = &trigger["metadata"];
    let uid = meta["uid"].as_str().filter(|u| !u.is_empty())?;
    let trigger_ns = meta["namespace"].as_str().unwrap_or_default();
    if !trigger_ns.is_empty() && namespace != Some(trigger_ns) {
        return None;
    }
    let (api_version, kind, name) = (&trigger["apiVersion"], &trigger["kind"], &meta["name"]);
    Some(match (api_version.as_str(), kind.as_str(), name.as_str()) {
        (Some(a), Some(k), Some(n)) => shared.owner(a, k, n, uid),
        // Not an object the API server serves: kept as it is.
        _ => OwnerRef::Other(Arc::new(json!({
            "apiVersion": api_version,
            "kind": kind,
            "name": name,
            "uid": uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_projection_holds_what_its_paths_read_and_no_more() {
        let obj = json!({
            "apiVersion": "v1", "kind": "K",
            "metadata": {"name": "n", "labels": {"a": "1"}, "managedFields": [{"x": 1}]},
            "spec": {"image": "i", "list": [{"a": 1}], "text": "t", "other": {"deep": 1}},
            "status": {"big": [1, 2, 3]},
        });
        let p = |paths: &[&[&str]], m: bool| {
            let paths: Vec<Vec<String>> = paths
                .iter()
                .map(|p| p.iter().map(|k| k.to_string()).collect())
                .collect();
            project(&obj, &paths, Sight::plain(m))
        };
        assert_eq!(
            p(&[&["spec", "image"], &["spec", "missing", "x"]], false),
            json!({"spec": {"image": "i"}})
        );
        // A list, a text or the end of a path is copied whole; a longer
        // path below it adds nothing.
        assert_eq!(
            p(
                &[
                    &["spec", "list", "0", "a"],
                    &["spec", "text", "x"],
                    &["spec", "other"],
                    &["spec", "other", "deep"]
                ],
                false
            ),
            json!({"spec": {"list": [{"a": 1}], "text": "t", "other": {"deep": 1}}})
        );
        // As `visible`: managedFields gone, only metadata when asked.
        assert_eq!(
            p(&[&["metadata"], &["spec", "image"]], true),
            json!({"metadata": {"name": "n", "labels": {"a": "1"}}})
        );
        assert_eq!(p(&[], false), json!({}));
        assert_eq!(p(&[&[]], false), visible(&obj, Sight::plain(false)));
        // With `fields`: the paths read of what is seen.
        let fields = super::super::path::seen_fields(&["spec.text".into()]);
        let seen = Sight {
            metadata_only: false,
            fields: Some(&fields),
            id: 2,
        };
        let paths = [vec!["spec".to_string()], vec!["status".to_string()]];
        assert_eq!(project(&obj, &paths, seen), json!({"spec": {"text": "t"}}));
        assert_eq!(
            visible(&obj, seen),
            json!({"apiVersion": "v1", "kind": "K",
                "metadata": {"name": "n", "labels": {"a": "1"}}, "spec": {"text": "t"}})
        );
        let kept = visible(&obj, seen);
        assert!(matches!(shown(&kept, seen), Cow::Borrowed(_)));
        assert!(matches!(shown(&obj, seen), Cow::Owned(_)));
    }
}
