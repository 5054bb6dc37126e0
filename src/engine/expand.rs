//! The expansion core: one rule's [`Evaluator`] (its caches and the
//! warnings of the render at hand), what a rule sees of an object
//! ([`visible`], [`shown`], [`project`]), the render context's bindings,
//! and [`Evaluator::render`], which runs one trigger's stages in order —
//! related sets (`related.rs`), then vars (`vars.rs`), then outputs
//! (`outputs.rs`) — with template values in `values.rs` and conditions in
//! `conditions.rs`.
//!
//! Reference twin: `reference/trigger.rs` (`Render`, `visible`, `bind`).

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;

use handlebars::Context;
use serde_json::{Map, Value, json};

use super::Engine;
use super::compile::{CompiledRule, Sight, anchored};
use super::error::{ErrorKind, FieldError, FieldWarning};
use super::incremental::eval::{EvalCaches, ExpansionKey};
use super::incremental::keys::Loop;
use super::limits;
use super::model::Desired;
use super::path::{At, field_value, fits_fields, keep_fields};
use super::view::View;

pub(super) type Result<T> = std::result::Result<T, FieldError>;

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
    if let Some(fields) = seen.fields {
        // Read of the object itself when that reads the same: no copy of
        // what is seen first (a revision's whole metadata, per related
        // object judged and per trigger rendered).
        if obj.is_object()
            && let Some(direct) = seen_paths(obj, paths, fields)
        {
            return project(
                obj,
                &direct,
                Sight {
                    fields: None,
                    ..seen
                },
            );
        }
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

/// `paths` as [`project`] reads them of what `fields` let be seen of
/// `obj` (see [`visible`]), when reading them of `obj` itself finds the
/// same: each path lies inside a field whose value `obj` holds (its
/// parents maps), so the seen copy holds that value and the maps above it
/// as `obj` does; a path under a key no field starts with, or inside the
/// only field under its key when `obj` lacks that field, reads nothing
/// seen and is left out. `None` when a path is wider than a field or
/// beside one under the same key (it would read the seen copy's maps), or
/// inside a field `obj` lacks while other fields share its key: the copy
/// is made then.
fn seen_paths(
    obj: &Value,
    paths: &[Vec<String>],
    fields: &[Vec<String>],
) -> Option<Vec<Vec<String>>> {
    let mut direct = Vec::with_capacity(paths.len());
    for p in paths {
        if p.is_empty() {
            return None;
        }
        if let Some(f) = fields.iter().find(|f| p.starts_with(f)) {
            let (last, parents) = f.split_last()?;
            // What the seen copy holds of `f`: what `keep_fields` keeps.
            let held = obj
                .as_object()
                .and_then(|m| field_value(m, parents, last))
                .is_some();
            if held {
                direct.push(p.clone());
            } else if fields.iter().filter(|g| g.first() == p.first()).count() > 1 {
                // Another field may hold maps above this one's place.
                return None;
            }
            // Else the only field under its key, not held: nothing seen.
        } else if fields.iter().any(|f| f.first() == p.first()) {
            // Wider than a field, or beside one under the same key: it
            // would read the seen copy's maps.
            return None;
        }
    }
    Some(direct)
}

pub(super) fn bind(ctx: &mut Context, name: &str, v: Value) -> Option<Value> {
    ctx.data_mut()
        .as_object_mut()
        .and_then(|m| m.insert(name.to_string(), v))
}

/// Restores what `name` was bound to before and hands back what it is.
pub(super) fn rebind(ctx: &mut Context, name: &str, old: Option<Value>) -> Value {
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
pub(super) fn with_item<R>(
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
    pub(super) marked: bool,
    /// Nesting of [`Evaluator::expand_as`]: only whole values (depth 0)
    /// are cached whole, their entries at depth 1.
    pub(super) depth: usize,
    /// When set, where each entry of the whole list landed in the
    /// result, with its key in the cache if it has one (its policy rules
    /// are then checked entry by entry).
    pub(super) spans: Option<&'s RefCell<Vec<Span>>>,
    /// The innermost loop variable bound around the value (see [`Loop`]).
    pub(super) loops: Option<&'s Loop<'s>>,
}

impl<'s> Pass<'s> {
    /// A whole value inside `loops`, its strings unmarked.
    pub(super) fn plain(loops: Option<&'s Loop<'s>>) -> Pass<'s> {
        Pass {
            marked: false,
            depth: 0,
            spans: None,
            loops,
        }
    }

    /// A whole value inside `loops` whose strings are marked as data.
    pub(super) fn marked(loops: Option<&'s Loop<'s>>) -> Pass<'s> {
        Pass {
            marked: true,
            ..Pass::plain(loops)
        }
    }

    /// The pass of the values inside this one.
    pub(super) fn inner(self) -> Pass<'s> {
        Pass {
            depth: self.depth + 1,
            ..self
        }
    }
}

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

    pub(super) fn tpl(
        &self,
        field: impl std::fmt::Display,
        text: &str,
        ctx: &Context,
    ) -> Result<String> {
        self.engine
            .templates
            .render(text, ctx)
            .map_err(|e| template_error(field, e))
    }

    pub(super) fn expr<'c>(
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
}

/// A render error: `LimitExceeded` when the trigger ran over a limit
/// (whatever failed first), else a template error.
pub(super) fn template_error(field: impl std::fmt::Display, message: String) -> FieldError {
    match limits::tripped() {
        Some(t) => FieldError::new(ErrorKind::LimitExceeded, field.to_string(), t),
        None => FieldError::new(ErrorKind::Template, field.to_string(), message),
    }
}

/// A limit check's result as an error on `field`.
pub(super) fn limited(
    field: impl std::fmt::Display,
    r: std::result::Result<(), String>,
) -> Result<()> {
    r.map_err(|m| FieldError::new(ErrorKind::LimitExceeded, field.to_string(), m))
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

    /// With `fields`, a projection read of the object itself (when
    /// [`seen_paths`] allows) is the projection of the seen copy, for
    /// objects whose fields are maps, texts, empty, missing, and for paths
    /// inside, across, beside and wider than the fields.
    #[test]
    fn a_projection_read_of_the_object_is_that_of_what_is_seen() {
        let specs = [
            json!({"image": "i", "other": {"deep": 1}, "list": [1]}),
            json!({"other": {"deep": 2}}),
            json!({}),
            json!("text"),
            Value::Null,
        ];
        let field_sets: [&[&str]; 7] = [
            &["spec.image"],
            &["spec.image", "spec.other.deep"],
            &["spec"],
            &["spec.other"],
            &["status.phase", "spec.image"],
            &["status.capabilities", "spec.image"],
            &["status.capabilities", "status.phase"],
        ];
        let paths: [&[&str]; 12] = [
            &["status", "capabilities"],
            &["status", "capabilities", "x"],
            &["spec", "image"],
            &["spec", "image", "x"],
            &["spec"],
            &["spec", "other"],
            &["spec", "other", "deep"],
            &["spec", "list", "0"],
            &["metadata", "name"],
            &["metadata", "managedFields"],
            &["status"],
            &["kind"],
        ];
        let mut checked = 0;
        for spec in &specs {
            let mut obj = json!({
                "apiVersion": "v1", "kind": "K",
                "metadata": {"name": "n", "managedFields": [{"x": 1}]},
                "status": {"phase": "p"},
            });
            if !spec.is_null() {
                obj["spec"] = spec.clone();
            }
            for fields in field_sets {
                let texts: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
                let fields = super::super::path::seen_fields(&texts);
                let seen = Sight {
                    metadata_only: false,
                    fields: Some(&fields),
                    id: 2,
                };
                // Every pair of paths.
                for a in 0..paths.len() {
                    for b in a..paths.len() {
                        let read: Vec<Vec<String>> = [paths[a], paths[b]]
                            .iter()
                            .map(|p| p.iter().map(|k| k.to_string()).collect())
                            .collect();
                        let copy = visible(&obj, seen);
                        let unseen = Sight {
                            fields: None,
                            ..seen
                        };
                        assert_eq!(
                            project(&obj, &read, seen),
                            project(&copy, &read, unseen),
                            "{obj} {texts:?} {read:?}"
                        );
                        checked += usize::from(seen_paths(&obj, &read, &fields).is_some());
                    }
                }
            }
        }
        // The direct read is taken for 1,326 of the 2,730: pinned, so that
        // a change of when it is taken (a cost, not a result) is seen.
        assert_eq!(checked, 1_326);
    }
}
