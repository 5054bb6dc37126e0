//! Related sets (`spec.related[]`, docs/rules.md "Related sets" and
//! "require"): named lists found from the trigger, in order, each bound as
//! `related.<name>` for later sets, vars and outputs.
//!
//! A set whose `when` is false is empty. `objects` lists objects of one
//! kind the rule sees (narrowed by `namespace`, `names`, `selector`,
//! `controlledByTrigger`, `controlledBy`, `notOlderThan`, `ownedBy`);
//! `listField` takes the entries of a list field of the trigger or earlier
//! sets (with `extract` captures), de-duplicated and sorted by their JSON
//! text. Then every item must pass
//! `where` (else dropped) and `require` (else dropped with a warning).
//!
//! Fast twin: `engine/related.rs`.

use std::borrow::Cow;
use std::collections::BTreeSet;

use handlebars::Context;
use serde_json::Value;

use super::run::Result;
use super::trigger::{Render, add_captures, bind, regex, unbind, visible};
use crate::api::{ListFieldQuery, ObjectQuery, Related, Unmatched};
use crate::engine::error::{FieldError, FieldWarning};
use crate::engine::path::{FieldPath, keep_fields, list_fields};
use crate::engine::store::{controller_uid, group_of};
use crate::engine::{ErrorKind, GroupKind};

impl Render<'_> {
    /// Computes every related set into `related.<name>`.
    pub fn related_sets(&mut self, ctx: &mut Context) -> Result<()> {
        for (i, rel) in self.rule.spec.related.iter().enumerate() {
            let set = self.related_set(&format!("spec.related[{i}]"), rel, ctx)?;
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

    fn related_set(&mut self, f: &str, rel: &Related, ctx: &mut Context) -> Result<Vec<Value>> {
        if let Some(w) = &rel.when
            && !self.truthy(&format!("{f}.when"), w, ctx)?
        {
            return Ok(Vec::new());
        }
        let candidates = if let Some(q) = &rel.objects {
            self.objects(f, q, ctx)?
        } else if let Some(l) = &rel.list_field {
            self.list_field(f, l, ctx)?
        } else {
            Vec::new()
        };
        let mut kept = Vec::new();
        for item in candidates {
            if self.passes_where(f, rel, &item, ctx)? {
                kept.push(item);
            }
        }
        let mut set = Vec::new();
        for item in kept {
            match self.fails_require(f, rel, &item, ctx)? {
                Some(w) => self.warnings.push(w),
                None => set.push(item),
            }
        }
        Ok(set)
    }

    /// Whether `item` (bound as `item`) passes every `where` condition.
    fn passes_where(
        &self,
        f: &str,
        rel: &Related,
        item: &Value,
        ctx: &mut Context,
    ) -> Result<bool> {
        let old = bind(ctx, "item", item.clone());
        let mut result = Ok(true);
        for (j, c) in rel.filter.iter().enumerate() {
            match self.condition(&format!("{f}.where[{j}]"), c, item, ctx) {
                Ok(true) => {}
                other => {
                    result = other;
                    break;
                }
            }
        }
        unbind(ctx, "item", old);
        result
    }

    /// The warning of the first `require` condition `item` fails.
    fn fails_require(
        &self,
        f: &str,
        rel: &Related,
        item: &Value,
        ctx: &mut Context,
    ) -> Result<Option<FieldWarning>> {
        let old = bind(ctx, "item", item.clone());
        let mut result = Ok(None);
        for (j, c) in rel.require.iter().enumerate() {
            result = self.check(&format!("{f}.require[{j}]"), c, item, ctx);
            if !matches!(result, Ok(None)) {
                break;
            }
        }
        unbind(ctx, "item", old);
        result
    }

    /// `objects`: the objects of one kind the rule sees, narrowed.
    fn objects(&self, f: &str, q: &ObjectQuery, ctx: &mut Context) -> Result<Vec<Value>> {
        let gk = GroupKind::new(&q.api_group, &q.kind);
        let ns = match &q.namespace {
            Some(t) => Some(self.tpl(&format!("{f}.objects.namespace"), t, ctx)?),
            None => None,
        };
        let names: Option<BTreeSet<String>> = match &q.names {
            Some(n) => Some(
                self.strings(&format!("{f}.objects.names"), n, ctx)?
                    .into_iter()
                    .collect(),
            ),
            None => None,
        };
        let selector = match &q.selector {
            Some(s) => Some(self.selector(&format!("{f}.objects.selector"), s, ctx)?),
            None => None,
        };
        let owners = self.owner_uids(&q.owned_by, ctx);
        let controllers = self.owner_uids(&q.controlled_by, ctx);
        let lineage = q
            .not_older_than
            .as_ref()
            .map(|s| self.lineage(s, &q.controlled_by, ctx));
        let passes = |o: &Value| {
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            let labels = o["metadata"]["labels"].as_object();
            names.as_ref().is_none_or(|n| n.contains(name))
                && selector
                    .as_ref()
                    .is_none_or(|s| crate::selector::matches_json(s, labels))
                && (!q.controlled_by_trigger || self.trigger.is_some_and(|t| controls(t, o)))
                && (q.owned_by.is_empty() || owner_refs(o).any(|u| owners.contains(u)))
                && (q.controlled_by.is_empty()
                    || controller_uid(o).is_some_and(|u| controllers.contains(u)))
                && lineage.as_ref().is_none_or(|l| l.not_older(o))
        };
        let found = self.world.list(&gk, ns.as_deref());
        Ok(found
            .into_iter()
            .filter(|o| passes(o))
            .map(|o| visible(o, q.metadata_only, &q.fields))
            .collect())
    }

    /// The uids `ownedBy` names: the trigger's and those of the objects of
    /// the named earlier sets.
    fn owner_uids(&self, of: &[String], ctx: &Context) -> BTreeSet<String> {
        let mut uids = BTreeSet::new();
        for name in of {
            if name == "trigger" {
                uids.extend(self.trigger.and_then(uid_of));
            } else if let Some(items) = ctx.data()["related"][name.as_str()].as_array() {
                uids.extend(items.iter().filter_map(uid_of));
            }
        }
        uids
    }

    /// The objects `notOlderThan` walks: those of `set` (its ancestors)
    /// and those the walk passes through (the trigger and the objects of
    /// the sets `controlledBy` names).
    fn lineage(&self, set: &str, through: &[String], ctx: &Context) -> Lineage {
        let objects_of = |name: &str| -> Vec<Value> {
            if name == "trigger" {
                self.trigger.into_iter().cloned().collect()
            } else {
                ctx.data()["related"][name]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            }
        };
        let ancestors = objects_of(set);
        let mut held = objects_of("trigger");
        for name in through.iter().filter(|n| *n != "trigger") {
            held.extend(objects_of(name));
        }
        Lineage { ancestors, held }
    }

    /// `listField`: the entries of the list at `path` in each object of
    /// `of`, extended with `extract`'s captures, cut to `fields`, sorted by
    /// their JSON text and de-duplicated.
    fn list_field(&mut self, f: &str, l: &ListFieldQuery, ctx: &Context) -> Result<Vec<Value>> {
        let path = FieldPath::parse(&l.path).map_err(|e| {
            FieldError::new(ErrorKind::InvalidRule, format!("{f}.listField.path"), e)
        })?;
        let extract = match &l.extract {
            Some(x) => Some((
                FieldPath::parse(&x.path).map_err(|e| {
                    FieldError::new(
                        ErrorKind::InvalidRule,
                        format!("{f}.listField.extract.path"),
                        e,
                    )
                })?,
                regex(self.rule, &format!("{f}.listField.extract.regex"), &x.regex)?,
                x.unmatched,
            )),
            None => None,
        };
        let fields = list_fields(f, &l.fields)?;
        let mut entries: Vec<(String, Value)> = Vec::new();
        for source in self.list_sources(&l.of, ctx) {
            let list: &[Value] = match path.get(&source) {
                Some(Value::Array(a)) => a,
                Some(m @ Value::Object(_)) => std::slice::from_ref(m),
                _ => &[],
            };
            for entry in list {
                let item = match &extract {
                    None => Some(entry.clone()),
                    Some((xp, re, unmatched)) => self.extracted(f, entry, xp, re, *unmatched),
                };
                // `fields`: only the named values of each entry.
                let item = item.map(|i| keep_fields(Cow::Owned(i), &fields));
                if let Some(item) = item {
                    entries.push((serde_json::to_string(&item).unwrap_or_default(), item));
                }
            }
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|a, b| a.0 == b.0);
        Ok(entries.into_iter().map(|(_, v)| v).collect())
    }

    /// The objects a listField reads: the trigger as templates see it
    /// and/or the items of earlier sets (default: the trigger).
    fn list_sources(&self, of: &[String], ctx: &Context) -> Vec<Value> {
        let default_of = ["trigger".to_string()];
        let of = if of.is_empty() { &default_of[..] } else { of };
        let mut sources = Vec::new();
        for name in of {
            if name == "trigger" {
                if let (Some(t), Some(trigger)) = (self.trigger, &self.rule.spec.trigger) {
                    sources.push(visible(t, trigger.metadata_only, &trigger.fields));
                }
            } else if let Some(items) = ctx.data()["related"][name.as_str()].as_array() {
                sources.extend(items.iter().cloned());
            }
        }
        sources
    }

    /// One entry with `extract`'s captures added; an entry that does not
    /// match is dropped, kept as it is, or dropped with a warning.
    fn extracted(
        &mut self,
        f: &str,
        entry: &Value,
        path: &FieldPath,
        re: &regex::Regex,
        unmatched: Unmatched,
    ) -> Option<Value> {
        let text = path.get(entry).and_then(Value::as_str);
        let caps = text.and_then(|t| re.captures(t));
        let (Value::Object(m), Some(caps)) = (entry, caps) else {
            match unmatched {
                Unmatched::Drop => {}
                Unmatched::Keep => return Some(entry.clone()),
                Unmatched::Warn => {
                    let shown = match (entry, text) {
                        (Value::Object(_), Some(t)) => t.to_string(),
                        (Value::Object(_), None) => "(missing)".to_string(),
                        _ => entry.to_string(),
                    };
                    let field = format!("{f}.listField.extract");
                    let w = FieldWarning::new(field, &shown, "does not match the extract regex");
                    self.warnings.push(w);
                }
            }
            return None;
        };
        let mut m = m.clone();
        add_captures(&mut m, re, &caps);
        Some(Value::Object(m))
    }
}

/// What `notOlderThan` reads: the objects of its set, and those a walk
/// up controller ownerReferences may pass through.
struct Lineage {
    ancestors: Vec<Value>,
    held: Vec<Value>,
}

impl Lineage {
    /// Whether `obj` was created no earlier than its controlling ancestor:
    /// walking up controller references by uid, the first object that is
    /// one of `ancestors` (each uid names the first object with it,
    /// ancestors before the others).
    fn not_older(&self, obj: &Value) -> bool {
        let find = |uid: &str| {
            let has = |o: &&Value| o["metadata"]["uid"].as_str() == Some(uid);
            match self.ancestors.iter().find(has) {
                Some(a) => Some((a, true)),
                None => self.held.iter().find(has).map(|h| (h, false)),
            }
        };
        let Some(created) = crate::engine::time::creation_time(obj) else {
            return false;
        };
        let mut seen = BTreeSet::new();
        let mut at = controller_uid(obj);
        while let Some(uid) = at {
            if !seen.insert(uid) {
                return false;
            }
            match find(uid) {
                Some((a, true)) => {
                    return crate::engine::time::creation_time(a).is_some_and(|t| created >= t);
                }
                Some((h, false)) => at = controller_uid(h),
                None => return false,
            }
        }
        false
    }
}

fn uid_of(o: &Value) -> Option<String> {
    o["metadata"]["uid"]
        .as_str()
        .filter(|u| !u.is_empty())
        .map(str::to_string)
}

/// The non-empty uids of `obj`'s ownerReferences.
fn owner_refs(obj: &Value) -> impl Iterator<Item = &str> {
    let refs = obj["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten();
    refs.filter_map(|r| r["uid"].as_str())
        .filter(|u| !u.is_empty())
}

/// Whether `obj` has a controller ownerReference to `owner`: by uid when
/// both have one, else by group, kind and name.
fn controls(owner: &Value, obj: &Value) -> bool {
    let owner_uid = owner["metadata"]["uid"].as_str().unwrap_or_default();
    let owner_gk = GroupKind::of(owner);
    let owner_name = owner["metadata"]["name"].as_str().unwrap_or_default();
    let refs = obj["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten();
    refs.filter(|r| r["controller"].as_bool() == Some(true))
        .any(|r| {
            let uid = r["uid"].as_str().unwrap_or_default();
            if !uid.is_empty() && !owner_uid.is_empty() {
                return uid == owner_uid;
            }
            let gk = GroupKind::new(
                group_of(r["apiVersion"].as_str().unwrap_or_default()),
                r["kind"].as_str().unwrap_or_default(),
            );
            Some(gk) == owner_gk && r["name"].as_str() == Some(owner_name)
        })
}
