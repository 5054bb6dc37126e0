//! Related sets (`spec.related[]`, docs/rules.md "Related sets" and
//! "require"): each set found from the trigger (`objects` through the
//! view's read index, or a `listField`'s entries), judged by `where` and
//! `require`, and bound as `related.<name>`; what triggers of one family
//! share (objects, lists, verdicts) is cached.
//!
//! Reference twin: `reference/related.rs`.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::sync::Arc;

use handlebars::Context;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde_json::{Value, json};

use super::compile::Sight;
use super::error::{ErrorKind, FieldError, FieldWarning};
use super::expand::{Evaluator, Result, project, shown, visible, with_item};
use super::incremental::eval::{ExtractKey, ItemPaths, ListKey, Shape};
use super::limits;
use super::memo::{ExtractedEntries, ItemVerdict, Owner, OwnerFilter, Read};
use super::path::{At, FieldPath, keep_fields, leading_keys, list_fields};
use super::store::GroupKind;
use super::store::controller_uid;
use super::template::truthy;
use super::time::creation_time;
use super::view::View;
use crate::api::{Condition, ListFieldQuery, ObjectQuery, Related, Unmatched};

/// A listField's source: a value in the render's context, or a related
/// object as the store holds it (with whether templates see only its
/// metadata), copied only when its entries are extracted.
enum Source<'a> {
    Seen(&'a Value),
    Held(&'a Arc<Value>, Sight<'a>),
}

/// A set of related objects no template reads.
struct HeldSet<'o, 'r> {
    name: &'o String,
    /// The objects as the store holds them.
    objects: Vec<Arc<Value>>,
    /// How much of them the rule sees.
    seen: Sight<'r>,
}

/// A listField's extract.
struct Extract<'r> {
    /// The path of the text in each entry.
    path: FieldPath,
    /// The regex the text must match.
    regex: Cow<'r, regex::Regex>,
    /// What becomes of an entry it does not.
    unmatched: Unmatched,
}

/// A listField result to cache once its set is judged.
struct PendingList {
    key: ListKey,
    /// The budget used before it was computed.
    used_before: usize,
    /// The number of warnings given before it was computed.
    warned_before: usize,
}

/// What `controlledBy` and `notOlderThan` read of an object: its uid
/// (non-empty), its controller's uid and its creation time.
pub(super) struct LineageFact {
    uid: String,
    controller: Option<String>,
    created: Option<i64>,
}

fn lineage_fact(o: &Value) -> Option<LineageFact> {
    let uid = o["metadata"]["uid"].as_str().filter(|u| !u.is_empty())?;
    Some(LineageFact {
        uid: uid.to_string(),
        controller: controller_uid(o).map(str::to_string),
        created: creation_time(o),
    })
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

impl Evaluator<'_> {
    /// Binds each related set as `related.<name>`, in order.
    pub(super) fn bind_related(
        &self,
        ctx: &mut Context,
        trigger: Option<&Value>,
        view: &View,
    ) -> Result<()> {
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

    pub(super) fn selector(
        &self,
        field: At<'_>,
        sel: &LabelSelector,
        ctx: &Context,
    ) -> Result<LabelSelector> {
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
        if let Some(PendingList {
            key,
            used_before,
            warned_before,
        }) = keep
        {
            let warnings = self.warnings.borrow()[warned_before..].to_vec();
            let bytes = limits::used().saturating_sub(used_before);
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
                Some(OwnerFilter::Controller(Box::new(
                    trigger.map(Owner::of).unwrap_or(Owner {
                        uid: "\u{0}none".into(),
                        gk: None,
                        name: String::new(),
                    }),
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
            (
                |ns, read| look_up(gk, ns, read, view),
                |ns, read| view.owned(gk, ns.map(String::as_str), read),
            ),
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
            *keep = Some(PendingList {
                key,
                used_before: limits::used(),
                warned_before: self.warnings.borrow().len(),
            });
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
                Some(HeldSet {
                    name,
                    objects: self.caches.objects_of(name)?,
                    seen,
                })
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
            } else if let Some(h) = held.iter().find(|h| h.name == name) {
                for o in &h.objects {
                    let addr = pin(o).map(|a| (h.seen.key(), a));
                    sources.push((Source::Held(o, h.seen), addr));
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
            Some(x) => Some(Extract {
                path: FieldPath::parse(&x.path).map_err(|e| {
                    FieldError::new(
                        ErrorKind::InvalidRule,
                        format!("{f}.listField.extract.path"),
                        e,
                    )
                })?,
                regex: self.regex(At::Key(&f, "listField.extract.regex"), &x.regex)?,
                unmatched: x.unmatched,
            }),
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
                Some(Extract {
                    path: xp,
                    regex: re,
                    unmatched,
                }) => {
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
        // The facts of each set: those of a set the caches hold are worked
        // out once per rule run (a family's members all read the same
        // Providers and family), the trigger's and the context's here.
        let facts = |name: &str| -> Arc<Vec<LineageFact>> {
            if name == "trigger" {
                return Arc::new(trigger.and_then(lineage_fact).into_iter().collect());
            }
            self.caches
                .lineage_facts(name, |objs| {
                    objs.iter().filter_map(|o| lineage_fact(o)).collect()
                })
                .or_else(|| {
                    let items = ctx.data()["related"][name].as_array()?;
                    Some(Arc::new(items.iter().filter_map(lineage_fact).collect()))
                })
                .unwrap_or_default()
        };
        // Each set `controlledBy` names, worked out once for both uses.
        let controlled: Vec<(&str, Arc<Vec<LineageFact>>)> = q
            .controlled_by
            .iter()
            .map(|n| (n.as_str(), facts(n)))
            .collect();
        let allowed: Option<Vec<String>> = (!controlled.is_empty()).then(|| {
            let uids = controlled.iter().flat_map(|(_, f)| f.iter());
            uids.map(|f| f.uid.clone()).collect()
        });
        let Some(set) = &q.not_older_than else {
            return allowed.into_iter().flatten().map(|u| (u, None)).collect();
        };
        // The trigger first, then the other sets `controlledBy` names.
        let trigger_facts = match controlled.iter().find(|(n, _)| *n == "trigger") {
            Some((_, f)) => Arc::clone(f),
            None => facts("trigger"),
        };
        let through = controlled
            .iter()
            .filter(|(n, _)| *n != "trigger")
            .map(|(_, f)| (false, Arc::clone(f)));
        // Held here so the map below borrows their text.
        let held: Vec<(bool, Arc<Vec<LineageFact>>)> = [(true, facts(set)), (false, trigger_facts)]
            .into_iter()
            .chain(through)
            .collect();
        // uid -> (an ancestor?, controller's uid, creation time); the
        // first object with a uid names it, ancestors first.
        let mut nodes: BTreeMap<&str, (bool, Option<&str>, Option<i64>)> = BTreeMap::new();
        for (ancestor, facts) in &held {
            for f in facts.iter() {
                nodes.entry(f.uid.as_str()).or_insert((
                    *ancestor,
                    f.controller.as_deref(),
                    f.created,
                ));
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
                at = (*controller)?;
            }
        };
        let candidates: Vec<String> = match allowed {
            Some(a) => a,
            None => nodes.keys().map(|u| u.to_string()).collect(),
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
    /// trigger: each verdict is cached by both objects' addresses (by the
    /// object's alone when the `where` reads only the object), and the
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
        let shape = self.reads_of(i, rel);
        if !rel.require.is_empty() || !shape.where_item_trigger {
            return None;
        }
        let passed = if rel.filter.is_empty() {
            // No `where`: every object passes, none is judged (a copy of
            // each, per trigger, was most of a revision's change).
            Ok(self.caches.pinned_objects(found))
        } else {
            // A `where` that reads only the item judges it once for every
            // trigger, a changed trigger included.
            self.caches
                .judged_objects((i, !shape.where_item), found, |o| {
                    self.object_passes(i, rel, o, seen, ctx)
                })
        };
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
            // A limit (time, budget) may cut either judgement short: only
            // two finished judgements must agree.
            if let (Ok(projection), Ok(whole)) = (&ok, &whole) {
                debug_assert_eq!(projection, whole, "a projection of {} judged apart", o);
            }
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
}
