//! Template values (docs/rules.md "Templates", "Expressions: forEach and
//! when", "List directives and $merge"): strings rendered (marked as data
//! where asked), list directives run, `$merge` maps merged; whole values
//! and nested lists cached by their keys (`incremental::keys`).
//!
//! Reference twin: `reference/values.rs`.

use std::borrow::Cow;

use handlebars::Context;
use serde_json::{Map, Value};

use super::compile::{Body as DirBody, directive};
use super::error::{ErrorKind, FieldError};
use super::expand::{Evaluator, Pass, Result, Span, bind, limited, rebind, template_error};
use super::incremental::eval::ExpansionKey;
use super::incremental::keys::{self, Loop};
use super::limits;
use super::memo::NestedKey;
use super::output;
use super::path::{At, Segment, scalar_text};
use super::template::{mentions, mentions_text, truthy};

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

impl Evaluator<'_> {
    /// Expands a template value: strings rendered, list directives run,
    /// `$merge` maps merged.
    pub(super) fn expand(
        &self,
        v: &Value,
        ctx: &mut Context,
        field: At<'_>,
        pass: Pass<'_>,
    ) -> Result<Value> {
        self.expand_as(v, ctx, field, pass, false)
    }

    /// [`Evaluator::expand`]; `checked_only`: the whole value is only ever
    /// checked, never read again (an output's policy rules, cached checked
    /// beside it), so its expansion is cached as null, not copied.
    pub(super) fn expand_as(
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

    /// The key of a nested list in the cache (see [`keys::nested_key`]).
    fn nested_key(&self, v: &Value, data: &Value, pass: Pass<'_>) -> Option<NestedKey> {
        let of = keys::Of {
            templates: &self.engine.templates,
            spec: &self.rule.spec,
            caches: &self.caches,
        };
        keys::nested_key(&of, v, data, pass.marked, pass.loops?)
    }

    /// An output's policy rules checked before from the same cached
    /// expansion, charging the budget what expanding charged.
    pub(super) fn cached_policy(
        &self,
        v: &Value,
        pass: Pass<'_>,
    ) -> Option<super::memo::CachedPolicy> {
        if pass.depth != 0 || !matches!(v, Value::Array(_) | Value::Object(_)) {
            return None;
        }
        let key = self.expansion_key(v, false, pass.marked)?;
        self.caches.checked_policy(&key)
    }

    /// The key of a whole template value's expansion in the cache (see
    /// [`keys::expansion_key`]).
    pub(super) fn expansion_key(
        &self,
        v: &Value,
        entry: bool,
        marked: bool,
    ) -> Option<ExpansionKey> {
        let of = keys::Of {
            templates: &self.engine.templates,
            spec: &self.rule.spec,
            caches: &self.caches,
        };
        keys::expansion_key(&of, v, entry, marked)
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
    pub(super) fn for_each(
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
    pub(super) fn list_of(&self, field: At<'_>, e: &str, ctx: &Context) -> Result<Vec<Value>> {
        let v = self.expr(field, e, ctx)?;
        // Checked before a borrowed list is copied.
        if let Value::Array(a) = &*v {
            limited(field, limits::check_list(a.len(), "the forEach list"))?;
        }
        owned_list(field, v.into_owned())
    }

    /// A list of texts, expanded inside `loops`.
    pub(super) fn strings(
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
}
