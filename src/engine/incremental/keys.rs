//! The keys of what an evaluation caches, derived from a rule's spec and
//! templates: which rules may share cached values ([`Derivation`]), and
//! the keys of cached expansions ([`expansion_key`]) and nested lists
//! ([`nested_key`]), from what a template value reads.

use serde_json::Value;

use super::eval::{EvalCaches, ExpansionKey};
use super::memo::NestedKey;
use crate::api::RbacRuleSpec;
use crate::engine::directive::{Body as DirBody, directive};
use crate::engine::template::{Templates, named_reads};

/// What a key is derived from: the rule's templates and spec, and the
/// caches of its evaluator (the tokens of its cached vars).
pub(in crate::engine) struct Of<'a> {
    /// The engine's templates (what each text reads).
    pub templates: &'a Templates,
    /// The rule's spec (its vars' names, its outputs' loop variables).
    pub spec: &'a RbacRuleSpec,
    /// The rule's evaluator's caches (the tokens of its cached vars).
    pub caches: &'a EvalCaches,
}

/// A rule's trigger, related sets and vars, each as JSON text.
#[derive(Clone, Debug, Default)]
pub struct Derivation {
    trigger: String,
    related: Vec<String>,
    vars: Vec<String>,
}

impl Derivation {
    /// With the values of its params: two rules share cached values only
    /// when their params agree too.
    pub fn of(spec: &RbacRuleSpec, params: &serde_json::Map<String, Value>) -> Derivation {
        fn text<T: serde::Serialize>(v: &T) -> String {
            serde_json::to_string(v).unwrap_or_default()
        }
        Derivation {
            trigger: format!("{}|{}", text(&spec.trigger), text(params)),
            related: spec.related.iter().map(text).collect(),
            vars: spec.vars.iter().map(text).collect(),
        }
    }

    /// How many leading related sets and vars two rules of the same
    /// trigger define alike: a cached value of one (keyed by their index)
    /// is the other's below those. `None` when they share nothing.
    pub fn common(&self, other: &Derivation) -> Option<(usize, usize)> {
        let lead = |a: &[String], b: &[String]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
        let related = lead(&self.related, &other.related);
        (self.trigger == other.trigger && related > 0)
            .then(|| (related, lead(&self.vars, &other.vars)))
    }
}

/// The rule whose cached lists, vars and item verdicts rule `idx` takes
/// before it runs, with how many leading related sets and vars the two
/// define alike: the nearest rule before it that shares some
/// (`derivations`: every rule's, in evaluation order).
pub(in crate::engine) fn derived_from(
    derivations: &[&Derivation],
    idx: usize,
) -> Option<(usize, (usize, usize))> {
    let d = derivations.get(idx)?;
    (0..idx)
        .rev()
        .find_map(|j| d.common(derivations[j]).map(|c| (j, c)))
}

/// For each rule that starts a chain of rules sharing derived values
/// (`takes`: the rule each takes from, see [`derived_from`]): the last
/// rule of its chain, which keeps the chain's values when the evaluation
/// ends; the first takes them back when the next one starts, so a
/// change computes again only what it reaches. `handed_on`: whether a
/// later rule takes a rule's values.
pub(in crate::engine) fn chain_tails(
    takes: &[Option<(usize, (usize, usize))>],
    handed_on: &[bool],
) -> Vec<Option<usize>> {
    let root = |mut i: usize| {
        while let Some(Some((from, _))) = takes.get(i) {
            i = *from;
        }
        i
    };
    let mut tails = vec![None; takes.len()];
    for (i, t) in takes.iter().enumerate() {
        if t.is_some() && !handed_on.get(i).copied().unwrap_or(true) {
            let r = root(i);
            if let Some(slot) = tails.get_mut(r) {
                *slot = Some(slot.map_or(i, |last: usize| last.max(i)));
            }
        }
    }
    tails
}

/// A loop variable bound around a value (by a `forEach`), with the token
/// of the cached var its `forEach` runs over and its index there, when it
/// does, and the loops around it: passed down the expansion (see
/// [`nested_key`]), never kept on the evaluator.
#[derive(Clone, Copy)]
pub(in crate::engine) struct Loop<'s> {
    /// The variable's name.
    pub name: &'s str,
    /// The token of the cached var its `forEach` runs over, and the index.
    pub bound: Option<(u64, usize)>,
    /// The loop around it.
    pub outer: Option<&'s Loop<'s>>,
}

impl<'s> Loop<'s> {
    /// This loop and those around it, innermost first.
    pub fn chain(&'s self) -> impl Iterator<Item = &'s Loop<'s>> {
        std::iter::successors(Some(self), |l| l.outer)
    }
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
pub(in crate::engine) fn nested_key(
    of: &Of<'_>,
    v: &Value,
    data: &Value,
    marked: bool,
    loops: &Loop<'_>,
) -> Option<NestedKey> {
    let Value::Array(items) = v else { return None };
    if !items.iter().any(|x| x.get("forEach").is_some()) {
        return None;
    }
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
    loop_ids(of, loops, data, &mut bound)?;
    of.caches.nested_key(v, marked, bound, || {
        let mut roots: Vec<&str> = vec!["vars"];
        roots.extend(loops.chain().map(|l| l.name));
        vars_read(of, v, false, &mut roots)
    })
}

/// Each loop variable bound around a value with the id of its value,
/// outermost first: `None` when one does not run over a cached var.
fn loop_ids(of: &Of<'_>, l: &Loop<'_>, data: &Value, ids: &mut Vec<(String, u64)>) -> Option<()> {
    if let Some(outer) = l.outer {
        loop_ids(of, outer, data, ids)?;
    }
    let (token, index) = l.bound?;
    let id = of.caches.content_id(token, index, data.get(l.name)?);
    ids.push((l.name.to_string(), id));
    Some(())
}

/// The key of a whole template value's expansion in the cache: when
/// it reads nothing but vars (each cached, by its token) and its own
/// loop variables.
pub(in crate::engine) fn expansion_key(
    of: &Of<'_>,
    v: &Value,
    entry: bool,
    marked: bool,
) -> Option<ExpansionKey> {
    of.caches
        .expansion_key(v, marked, || vars_read(of, v, entry, &mut vec!["vars"]))
}

/// The vars a template value (`entry`: an entry of a list, maybe a
/// directive) reads, when it reads nothing but vars and the loop
/// variables in `roots`.
fn vars_read<'v>(
    of: &Of<'_>,
    v: &'v Value,
    entry: bool,
    roots: &mut Vec<&'v str>,
) -> Option<Vec<String>> {
    let mut texts: Vec<&str> = Vec::new();
    let ok = if entry {
        collect_item(of, v, roots, &mut texts)
    } else {
        collect_texts(of, v, roots, &mut texts)
    };
    if !ok {
        return None;
    }
    let names: Vec<&str> = of.spec.vars.iter().map(|v| v.name.as_str()).collect();
    // An output forEach may bind `vars` to something else.
    let shadowed = of
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
    of: &Of<'_>,
    v: &'v Value,
    roots: &mut Vec<&'v str>,
    texts: &mut Vec<&'v str>,
) -> bool {
    let t = of.templates;
    match v {
        Value::String(s) => {
            texts.push(s);
            t.reads_within(s, roots)
        }
        Value::Array(items) => items
            .iter()
            .all(|item| collect_item(of, item, roots, texts)),
        Value::Object(m) => m.iter().all(|(k, x)| {
            texts.push(k);
            t.reads_within(k, roots) && collect_texts(of, x, roots, texts)
        }),
        _ => true,
    }
}

/// [`collect_texts`] for one entry of a list: a directive
/// or a value.
fn collect_item<'v>(
    of: &Of<'_>,
    item: &'v Value,
    roots: &mut Vec<&'v str>,
    texts: &mut Vec<&'v str>,
) -> bool {
    let t = of.templates;
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
            let ok = collect_texts(of, body, roots, texts);
            if scoped {
                roots.pop();
            }
            ok
        }
        Ok(None) => collect_texts(of, item, roots, texts),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_rule_of_each_chain_gives_its_values_back_to_the_first() {
        // 0 → 1 → 2, and 3 → 4; 5 alone.
        let takes = [
            None,
            Some((0, (1, 0))),
            Some((1, (2, 1))),
            None,
            Some((3, (1, 0))),
            None,
        ];
        let handed_on = [true, true, false, true, false, false];
        assert_eq!(
            chain_tails(&takes, &handed_on),
            [Some(2), None, None, Some(4), None, None]
        );
        // Two rules take from one: the later keeps the chain's values.
        let takes = [None, Some((0, (1, 0))), Some((0, (1, 0)))];
        assert_eq!(
            chain_tails(&takes, &[true, false, false]),
            [Some(2), None, None]
        );
        // A rule handed on is no tail.
        assert_eq!(
            chain_tails(&[None, Some((0, (1, 0)))], &[true, true]),
            [None, None]
        );
    }

    #[test]
    fn rules_share_the_leading_related_sets_and_vars_they_define_alike() {
        let spec = |related: &str, vars: &str| -> RbacRuleSpec {
            serde_json::from_value(serde_json::json!({
                "trigger": {"kind": "Namespace"},
                "related": [
                    {"name": "a", "objects": {"kind": "ConfigMap"}},
                    {"name": related, "objects": {"kind": "Secret"}},
                ],
                "vars": [{"name": "x", "value": "related.a"}, {"name": vars, "value": "related.a"}],
                "outputs": [],
            }))
            .expect("a spec")
        };
        let params = serde_json::Map::new();
        let d = |r: &str, v: &str| Derivation::of(&spec(r, v), &params);
        assert_eq!(d("b", "y").common(&d("b", "y")), Some((2, 2)));
        assert_eq!(d("b", "y").common(&d("b", "z")), Some((2, 1)));
        assert_eq!(d("b", "y").common(&d("c", "y")), Some((1, 2)));
        let all = [d("b", "y"), d("c", "y"), d("b", "z")];
        let refs: Vec<&Derivation> = all.iter().collect();
        assert_eq!(derived_from(&refs, 0), None);
        assert_eq!(derived_from(&refs, 1), Some((0, (1, 2))));
        assert_eq!(derived_from(&refs, 2), Some((1, (1, 1))));
        let mut other = serde_json::Map::new();
        other.insert("p".into(), serde_json::json!("v"));
        assert_eq!(
            Derivation::of(&spec("b", "y"), &other).common(&d("b", "y")),
            None
        );
    }
}
