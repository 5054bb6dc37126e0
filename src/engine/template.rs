//! Handlebars in strict mode, plus expressions and helpers.
//!
//! Templates render to plain strings: no HTML escaping, and a missing
//! variable is an error. An *expression* (`forEach`, `when`) is a handlebars
//! expression — a path or a helper call — evaluated to a JSON value by a
//! capture helper that keeps its argument, so the expression language is
//! exactly the template language. Paths, and calls of the helpers below on
//! paths and literals, are evaluated without handlebars (the same charges,
//! limits and messages); handlebars evaluates everything else.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::LazyLock;

use handlebars::template::{HelperTemplate, Parameter, TemplateElement};
use handlebars::{
    BlockContext, BlockParams, Context, Handlebars, Helper, HelperDef, HelperResult, Output, Path,
    PathSeg, RenderContext, RenderError, RenderErrorReason, Renderable, ScopedJson, Template,
};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::error::ErrorKind;
use super::fast_hash::HashMap;
use super::limits::{self, Limit, Limits};
use super::path::{FieldPath, Segment, leading_keys, scalar_text};

/// A mustache opens with two of these.
const OPEN_BRACE: u8 = b'{';

/// The compiled templates and expressions of every rule.
pub struct Templates {
    hb: Handlebars<'static>,
    /// Templates made of text and plain paths only (`{{trigger.metadata.name}}`,
    /// most templates), by their text: rendered without handlebars.
    simple: HashMap<String, Vec<Part>>,
    /// Expressions that are calls of the helpers below on paths, literals
    /// and such calls (`groupBy (sortBy related.types "plural") "group"`),
    /// by their text: evaluated without handlebars, a value built by an
    /// inner call handed on, not copied.
    calls: HashMap<String, Call>,
    /// Templates of text, paths and such calls (`{{shorten
    /// trigger.metadata.name 63}}`), by their text: rendered without
    /// handlebars.
    called: HashMap<String, Vec<Piece>>,
    /// Expressions by their text: the path each is, when a bare path
    /// (`related.types`), parsed once.
    bare: HashMap<String, Option<FieldPath>>,
    /// Deepest nesting a template may have.
    depth: usize,
    /// Whether the fast paths above are off: every template and expression
    /// goes through handlebars. The reference evaluator renders this way,
    /// so the differential tests check each fast path against handlebars.
    plain: bool,
    /// What was compiled since [`Templates::take_registered`] last took
    /// it: one rule's texts, kept with that rule so that a later engine
    /// that reuses the rule copies exactly them (see [`Templates::copy_from`]).
    registered: Registered,
}

/// The templates and expressions one rule compiled, by their text: what
/// a registry needs to hold for the rule to render. Texts, not parsed
/// trees: a registry that takes a rule over copies these entries from the
/// one the rule was compiled into, so it holds what compiling the rule
/// into it would have put there, and nothing of any other rule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registered {
    /// Templates (not literal), by their text.
    templates: BTreeSet<String>,
    /// Expressions, by their text.
    exprs: BTreeSet<String>,
}

/// A piece of a simple template.
#[derive(Clone)]
enum Part {
    /// Text written as is.
    Text(String),
    /// A path of object keys from the context's root.
    Path(Vec<String>),
}

/// The disabled `log` helper.
fn no_log(
    _: &handlebars::Helper,
    _: &Handlebars,
    _: &handlebars::Context,
    _: &mut handlebars::RenderContext,
    _: &mut dyn handlebars::Output,
) -> handlebars::HelperResult {
    Err(handlebars::RenderErrorReason::Other(
        "the log helper is disabled: it would write object data into the controller's logs".into(),
    )
    .into())
}
/// Why a template or expression does not compile.
pub type CompileError = (ErrorKind, String);

impl Default for Templates {
    fn default() -> Self {
        Self::new()
    }
}

impl Templates {
    /// A registry with strict mode, no escaping, the helpers below and the
    /// default limits.
    pub fn new() -> Self {
        Self::with_limits(&Limits::default())
    }

    /// Like [`Templates::new`], refusing templates nested deeper than
    /// `limits` allow.
    pub fn with_limits(limits: &Limits) -> Self {
        let mut hb = Handlebars::new();
        hb.set_strict_mode(true);
        hb.register_escape_fn(handlebars::no_escape);
        hb.register_helper(CAPTURE, Box::new(CaptureHelper));
        // The built-in `log` would write trigger text into the controller's
        // logs (log injection): replaced by one that refuses.
        hb.register_helper("log", Box::new(no_log));
        // The built-in `each`, with a step charged per iteration.
        hb.register_helper("each", Box::new(EachHelper));
        for (name, allow_missing, f) in HELPERS {
            hb.register_helper(
                name,
                Box::new(ValueHelper {
                    name,
                    allow_missing: *allow_missing,
                    f: *f,
                }),
            );
        }
        Templates {
            hb,
            simple: HashMap::default(),
            calls: HashMap::default(),
            called: HashMap::default(),
            bare: HashMap::default(),
            depth: limits.template_depth,
            plain: false,
            registered: Registered::default(),
        }
    }

    /// Like [`Templates::with_limits`], with every fast path off: what
    /// handlebars itself renders, the meaning the fast paths must keep.
    pub fn plain_with_limits(limits: &Limits) -> Self {
        Templates {
            plain: true,
            ..Self::with_limits(limits)
        }
    }

    /// Whether `text` needs handlebars at all (it has no two opening
    /// braces in a row).
    pub fn is_literal(text: &str) -> bool {
        // A byte scan: `str::contains` sets up a substring searcher per
        // call, and this runs on every string a render expands.
        let b = text.as_bytes();
        !b.iter()
            .zip(b.iter().skip(1))
            .any(|(x, y)| *x == OPEN_BRACE && *y == OPEN_BRACE)
    }

    /// Parses a template once; later renders reuse it.
    pub fn compile(&mut self, text: &str) -> Result<(), CompileError> {
        if Self::is_literal(text) {
            return Ok(());
        }
        if !self.hb.has_template(text) {
            self.register(text)?;
        }
        if !self.registered.templates.contains(text) {
            self.registered.templates.insert(text.to_string());
        }
        Ok(())
    }

    /// Parses an expression once.
    pub fn compile_expr(&mut self, expr: &str) -> Result<(), CompileError> {
        self.compile_expr_once(expr)?;
        if !self.registered.exprs.contains(expr) {
            self.registered.exprs.insert(expr.to_string());
        }
        Ok(())
    }

    /// Takes what was compiled since the last call: one rule's texts,
    /// when called after each rule.
    pub fn take_registered(&mut self) -> Registered {
        std::mem::take(&mut self.registered)
    }

    /// Puts into this registry what `from` holds for the texts `what`
    /// (a rule compiled into `from`), as compiling them here would: the
    /// same parsed trees and fast paths, copied, not parsed again. A text
    /// `from` does not hold (none, for a rule compiled there under the
    /// same limits) is compiled. Both registries must be of one kind
    /// (plain or not) and depth, which the caller checks.
    pub fn copy_from(&mut self, from: &Templates, what: &Registered) -> Result<(), CompileError> {
        for text in &what.templates {
            if !self.copy_template(from, text) {
                self.compile(text)?;
            }
        }
        for expr in &what.exprs {
            let Ok(wrapped) = wrap_expr(expr) else {
                self.compile_expr(expr)?;
                continue;
            };
            let bare = from.bare.get(expr);
            if (!self.plain && bare.is_none()) || !self.copy_template(from, &wrapped) {
                self.compile_expr(expr)?;
                continue;
            }
            if let Some(b) = bare.filter(|_| !self.bare.contains_key(expr)) {
                self.bare.insert(expr.clone(), b.clone());
            }
            if let Some(c) = from
                .calls
                .get(expr)
                .filter(|_| !self.calls.contains_key(expr))
            {
                self.calls.insert(expr.clone(), c.clone());
            }
        }
        Ok(())
    }

    /// Copies the parsed template `text` and its fast path from `from`;
    /// false when `from` does not hold it.
    fn copy_template(&mut self, from: &Templates, text: &str) -> bool {
        if self.hb.has_template(text) {
            return true;
        }
        let Some(tpl) = from.hb.get_template(text) else {
            return false;
        };
        if let Some(parts) = from.simple.get(text) {
            self.simple.insert(text.to_string(), parts.clone());
        }
        if let Some(pieces) = from.called.get(text) {
            self.called.insert(text.to_string(), pieces.clone());
        }
        self.hb.register_template(text, tpl.clone());
        true
    }

    /// Whether templates compiled here and in `other` mean the same:
    /// both plain or neither, nested to the same depth.
    pub fn same_kind(&self, other: &Templates) -> bool {
        self.plain == other.plain && self.depth == other.depth
    }

    /// Every text this registry holds, each under the name of what holds
    /// it (`hb`, `simple`, `called`, `calls`, `bare`), sorted: two
    /// registries that hold the same texts the same ways answer alike.
    pub fn held_texts(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .hb
            .get_templates()
            .keys()
            .map(|k| format!("hb:{k}"))
            .chain(self.simple.keys().map(|k| format!("simple:{k}")))
            .chain(self.called.keys().map(|k| format!("called:{k}")))
            .chain(self.calls.keys().map(|k| format!("calls:{k}")))
            .chain(self.bare.keys().map(|k| format!("bare:{k}")))
            .collect();
        all.sort();
        all
    }

    /// [`Templates::compile_expr`], without noting the text.
    fn compile_expr_once(&mut self, expr: &str) -> Result<(), CompileError> {
        if !self.plain && !self.bare.contains_key(expr) {
            self.bare.insert(expr.to_string(), bare_path(expr));
        }
        let wrapped = wrap_expr(expr).map_err(|e| (ErrorKind::Template, e))?;
        if self.hb.has_template(&wrapped) {
            return Ok(());
        }
        self.register(&wrapped)?;
        let call = self
            .hb
            .get_template(&wrapped)
            .and_then(|t| match &t.elements[..] {
                [TemplateElement::Expression(h)] => match &h.params[..] {
                    [Parameter::Subexpression(sub)] => Call::of(sub.as_element()),
                    _ => None,
                },
                _ => None,
            });
        if let Some(call) = call.filter(|_| !self.plain) {
            self.calls.insert(expr.to_string(), call);
        }
        Ok(())
    }

    /// Checks the nesting before parsing (the parser recurses), parses,
    /// then checks the tree: its depth, and no partials or decorators
    /// (they could recurse without end).
    fn register(&mut self, text: &str) -> Result<(), CompileError> {
        let too_deep = |d: usize| {
            (
                ErrorKind::LimitExceeded,
                Limit::TemplateDepth.message(
                    &Limits {
                        template_depth: self.depth,
                        ..Limits::default()
                    },
                    &format!("the template nests blocks and subexpressions {d} deep"),
                ),
            )
        };
        let d = lexical_depth(text);
        if d > self.depth {
            return Err(too_deep(d));
        }
        let tpl =
            Template::compile(text).map_err(|e| (ErrorKind::Template, template_error_text(&e)))?;
        let d = check_tree(&tpl.elements).map_err(|e| (ErrorKind::Template, e))?;
        if d > self.depth {
            return Err(too_deep(d));
        }
        if self.plain {
            // Every render goes through handlebars.
        } else if let Some(parts) = simple_parts(&tpl.elements) {
            self.simple.insert(text.to_string(), parts);
        } else if let Some(pieces) = called_pieces(&tpl.elements) {
            self.called.insert(text.to_string(), pieces);
        }
        self.hb.register_template(text, tpl);
        Ok(())
    }

    /// Renders a template compiled before. The context is borrowed, not
    /// serialized per call: contexts carry whole related sets. What it
    /// writes is charged to the trigger's budget.
    pub fn render(&self, text: &str, ctx: &Context) -> Result<String, String> {
        self.render_after(None, text, ctx)
    }

    /// [`Templates::render`] into a string that starts with `mark` (not
    /// charged): one string built, not a second to mark the first.
    pub fn render_after(
        &self,
        mark: Option<char>,
        text: &str,
        ctx: &Context,
    ) -> Result<String, String> {
        let mut out = String::new();
        out.extend(mark);
        if Self::is_literal(text) {
            limits::charge(text.len())?;
            out.push_str(text);
            return Ok(out);
        }
        if let Some(rendered) = self
            .simple
            .get(text)
            .and_then(|parts| render_simple(parts, ctx.data(), &mut out))
        {
            return rendered.map(|()| out);
        }
        if let Some(pieces) = self.called.get(text)
            && pieces.iter().all(|p| p.resolves(ctx.data()))
        {
            return render_pieces(pieces, ctx.data(), &mut out)
                .map(|()| out)
                .map_err(|m| limits::tripped().unwrap_or(m));
        }
        let mut written = Charged(out.into_bytes());
        let rendered = self
            .hb
            .render_with_context_to_write(text, ctx, &mut written);
        if let Some(t) = limits::tripped() {
            return Err(t);
        }
        rendered.map_err(|e| render_error_text(&e))?;
        String::from_utf8(written.0).map_err(|e| e.to_string())
    }

    /// The path of an expression that is a bare path of object keys (read
    /// in place by [`Templates::eval_ref`]), if it is one.
    pub fn key_path(&self, expr: &str) -> Option<FieldPath> {
        let path = match self.bare.get(expr) {
            Some(p) => p.clone(),
            None => bare_path(expr),
        };
        path.filter(|p| p.segments().iter().all(|s| matches!(s, Segment::Key(_))))
    }

    /// Whether a template compiled before reads nothing but `root` (paths
    /// under it, by [`element_reads`]) and calls nothing but the pure
    /// helpers below, outside blocks: its text then depends only on that
    /// value. Other helpers, blocks and reads of everything answer false.
    pub fn reads_only(&self, text: &str, root: &str) -> bool {
        self.reads_within(text, &[root])
    }

    /// [`Templates::reads_only`] for any of several roots.
    pub fn reads_within(&self, text: &str, roots: &[&str]) -> bool {
        if Self::is_literal(text) {
            return true;
        }
        self.hb
            .get_template(text)
            .is_some_and(|t| pure_calls(&t.elements) && element_reads(&t.elements).within(roots))
    }

    /// The paths below `root` a template compiled before reads (`item.spec.image`
    /// → `["spec", "image"]`, by [`element_reads`]), each up to its first
    /// index; `None` when it reads `root` whole or everything, or is not
    /// compiled.
    pub fn paths_under(&self, text: &str, root: &str) -> Option<Vec<Vec<String>>> {
        if Self::is_literal(text) {
            return Some(Vec::new());
        }
        element_reads(&self.hb.get_template(text)?.elements).keys_under(root)
    }

    /// [`Templates::paths_under`] for an expression compiled before.
    pub fn expr_paths_under(&self, expr: &str, root: &str) -> Option<Vec<Vec<String>>> {
        self.paths_under(&wrap_expr(expr).ok()?, root)
    }

    /// [`Templates::reads_within`] for an expression compiled before.
    pub fn expr_reads_within(&self, expr: &str, roots: &[&str]) -> bool {
        wrap_expr(expr).is_ok_and(|w| self.reads_within(&w, roots))
    }

    /// [`Templates::reads_only`] for an expression compiled before.
    pub fn expr_reads_only(&self, expr: &str, root: &str) -> bool {
        wrap_expr(expr).is_ok_and(|w| self.reads_only(&w, root))
    }

    /// Evaluates an expression compiled before to a JSON value, borrowing
    /// from the context where it can: a bare path (`related.types`) is read
    /// in place, so `when` tests and loops over large related sets copy
    /// nothing they do not keep. A bare path that is missing yields null.
    pub fn eval_ref<'c>(&self, expr: &str, ctx: &'c Context) -> Result<Cow<'c, Value>, String> {
        let parsed;
        let path = match self.bare.get(expr) {
            Some(p) => p.as_ref(),
            None if self.plain => None,
            None => {
                parsed = bare_path(expr);
                parsed.as_ref()
            }
        };
        if let Some(path) = path {
            match navigate(ctx.data(), path) {
                Nav::Found(v) => return Ok(Cow::Borrowed(v)),
                Nav::Missing => return Ok(Cow::Owned(Value::Null)),
                // Lists and scalars on the way: handlebars' own rules apply.
                Nav::Other => {}
            }
        }
        if let Some(call) = self.calls.get(expr)
            && call.resolves(ctx.data())
        {
            let value = call.eval(ctx.data());
            if let Some(t) = limits::tripped() {
                return Err(t);
            }
            return value.map(|v| Cow::Owned(v.into_owned()));
        }
        let wrapped = wrap_expr(expr)?;
        CAPTURED.with(|c| c.borrow_mut().take());
        let rendered = self.hb.render_with_context(&wrapped, ctx);
        if let Some(t) = limits::tripped() {
            return Err(t);
        }
        rendered.map_err(|e| render_error_text(&e))?;
        Ok(Cow::Owned(
            CAPTURED
                .with(|c| c.borrow_mut().take())
                .unwrap_or(Value::Null),
        ))
    }
}

/// The parts of a template that is only text and plain paths of two or
/// more keys (`{{a.b}}`: one name alone could be a helper's); `None` for
/// anything else.
fn simple_parts(elements: &[TemplateElement]) -> Option<Vec<Part>> {
    elements
        .iter()
        .map(|e| match e {
            TemplateElement::RawString(t) => Some(Part::Text(t.clone())),
            TemplateElement::Expression(h)
                if !h.block
                    && h.params.is_empty()
                    && h.hash.is_empty()
                    && h.block_param.is_none() =>
            {
                let Parameter::Path(Path::Relative((segs, _))) = &h.name else {
                    return None;
                };
                let keys: Vec<String> = segs
                    .iter()
                    .map(|s| match s {
                        PathSeg::Named(k) => Some(k.clone()),
                        _ => None,
                    })
                    .collect::<Option<_>>()?;
                (keys.len() >= 2).then_some(Part::Path(keys))
            }
            _ => None,
        })
        .collect()
}

/// Renders a simple template when every path leads to text, charging what
/// it writes as handlebars would; `None` (nothing charged) otherwise, for
/// handlebars to render with its own rules and messages.
fn render_simple(parts: &[Part], data: &Value, out: &mut String) -> Option<Result<(), String>> {
    fn text<'a>(p: &'a Part, data: &'a Value) -> Option<&'a str> {
        match p {
            Part::Text(t) => Some(t),
            Part::Path(keys) => {
                let mut cur = data;
                for k in keys {
                    cur = cur.as_object()?.get(k)?;
                }
                cur.as_str()
            }
        }
    }
    // Most simple templates have a few parts: their texts are found on
    // the stack, then written with one reservation and one charge (the
    // charge fails exactly when charging part by part would).
    let mut inline = [""; 8];
    let mut spilled = Vec::new();
    let texts: &mut [&str] = match inline.get_mut(..parts.len()) {
        Some(t) => t,
        None => {
            spilled.resize(parts.len(), "");
            &mut spilled
        }
    };
    for (slot, p) in texts.iter_mut().zip(parts) {
        *slot = text(p, data)?;
    }
    let total = texts.iter().map(|t| t.len()).sum();
    if let Err(e) = limits::charge(total) {
        return Some(Err(e));
    }
    out.reserve(total);
    for t in texts.iter() {
        out.push_str(t);
    }
    Some(Ok(()))
}

/// A piece of a template rendered without handlebars.
#[derive(Clone)]
enum Piece {
    /// Text written as is.
    Text(String),
    /// A path of object keys from the context's root, leading to text.
    Path(FieldPath),
    /// A helper call, its value written as handlebars writes values.
    Call(Call),
}

impl Piece {
    /// Whether the piece renders as handlebars would render it here: paths
    /// lead to text, calls resolve (see [`Call::resolves`]).
    fn resolves(&self, data: &Value) -> bool {
        match self {
            Piece::Text(_) => true,
            Piece::Path(p) => matches!(navigate(data, p), Nav::Found(Value::String(_))),
            Piece::Call(c) => c.resolves(data),
        }
    }
}

/// The pieces of a template of text, plain paths and calls of the helpers
/// below, with at least one call; `None` for anything else.
fn called_pieces(elements: &[TemplateElement]) -> Option<Vec<Piece>> {
    let pieces = elements
        .iter()
        .map(|e| match e {
            TemplateElement::RawString(t) => Some(Piece::Text(t.clone())),
            TemplateElement::Expression(h) => match (&h.name, h.params.is_empty()) {
                (Parameter::Path(path), true) if h.hash.is_empty() && !h.block => {
                    path_keys(path).map(Piece::Path)
                }
                _ => Call::of(e).map(Piece::Call),
            },
            _ => None,
        })
        .collect::<Option<Vec<Piece>>>()?;
    pieces
        .iter()
        .any(|p| matches!(p, Piece::Call(_)))
        .then_some(pieces)
}

/// Renders pieces that resolve, charging what it writes as handlebars
/// would (each piece once).
fn render_pieces(pieces: &[Piece], data: &Value, out: &mut String) -> Result<(), String> {
    for p in pieces {
        let text: Cow<'_, str> = match p {
            Piece::Text(t) => Cow::Borrowed(t),
            Piece::Path(path) => match navigate(data, path) {
                Nav::Found(v) => Cow::Owned(json_render(v)),
                _ => Cow::Borrowed(""),
            },
            Piece::Call(c) => Cow::Owned(json_render(&*c.eval(data)?)),
        };
        limits::charge(text.len())?;
        out.push_str(&text);
    }
    Ok(())
}

/// A value as handlebars writes it (its `JsonRender`).
fn json_render(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(json_render).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(_) => "[object]".to_string(),
    }
}

/// The object keys of a plain relative path (no `this`, `../` or `@`).
fn path_keys(path: &Path) -> Option<FieldPath> {
    let Path::Relative((segs, _)) = path else {
        return None;
    };
    segs.iter()
        .map(|s| match s {
            PathSeg::Named(k) => Some(Segment::Key(k.clone())),
            _ => None,
        })
        .collect::<Option<Vec<Segment>>>()
        .map(FieldPath::from_segments)
}

/// A writer that charges what it is given to the trigger's budget.
struct Charged(Vec<u8>);

impl std::io::Write for Charged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        limits::charge(buf.len()).map_err(std::io::Error::other)?;
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An upper bound of a template's nesting, from its text alone: `{{#`
/// and `{{^x` open a level, `{{else x}}` adds one until the block closes,
/// `{{/` closes, and parentheses nest within a mustache. Comments are
/// skipped. Cheap and without recursion, so it runs before the parser.
fn lexical_depth(text: &str) -> usize {
    let b = text.as_bytes();
    let mut i = 0;
    let mut open: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let mut max = 0usize;
    while let Some(p) = text[i..].find("{{") {
        let mut j = i + p + 2;
        while j < b.len() && matches!(b[j], b'{' | b'~' | b' ' | b'\t' | b'\n' | b'\r') {
            j += 1;
        }
        let rest = &text[j..];
        if rest.starts_with('!') {
            let end = if rest.starts_with("!--") {
                "--}}"
            } else {
                "}}"
            };
            i = rest.find(end).map_or(b.len(), |e| j + e + end.len());
            continue;
        }
        let after = |s: &str| {
            rest[s.len()..]
                .trim_start()
                .starts_with(|c: char| c != '}' && c != '~')
        };
        if rest.starts_with('#') || (rest.starts_with('^') && after("^")) {
            open.push(1);
            depth += 1;
        } else if rest.starts_with('/') {
            depth = depth.saturating_sub(open.pop().unwrap_or(0));
        } else if rest.starts_with("else")
            && rest[4..].starts_with(char::is_whitespace)
            && after("else")
            && let Some(top) = open.last_mut()
        {
            *top += 1;
            depth += 1;
        }
        // Parentheses up to the end of this mustache, outside quotes.
        let mut parens = 0usize;
        let mut quote: Option<u8> = None;
        let mut k = j;
        while k < b.len() {
            let c = b[k];
            match quote {
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None => match c {
                    b'"' | b'\'' => quote = Some(c),
                    b'(' => {
                        parens += 1;
                        max = max.max(depth + parens);
                    }
                    b')' => parens = parens.saturating_sub(1),
                    b'}' if b.get(k + 1) == Some(&b'}') => break,
                    _ => {}
                },
            }
            k += 1;
        }
        max = max.max(depth);
        i = k.min(b.len());
    }
    max
}

/// The depth of a parsed template (blocks, inverse chains and
/// subexpressions); an error for partials and decorators.
fn check_tree(elements: &[TemplateElement]) -> Result<usize, String> {
    let mut max = 0;
    for e in elements {
        let d = match e {
            TemplateElement::HelperBlock(h)
            | TemplateElement::Expression(h)
            | TemplateElement::HtmlExpression(h) => {
                let mut d = params_depth(&h.params, &h.hash)?;
                for t in h.template.iter().chain(h.inverse.iter()) {
                    d = d.max(check_tree(&t.elements)?);
                }
                if matches!(e, TemplateElement::HelperBlock(_)) {
                    d += 1;
                }
                d
            }
            TemplateElement::PartialExpression(_) | TemplateElement::PartialBlock(_) => {
                return Err("partials ({{> name}}) are not supported".to_string());
            }
            TemplateElement::DecoratorExpression(_) | TemplateElement::DecoratorBlock(_) => {
                return Err(
                    "decorators and inline partials ({{* }}, {{#* }}) are not supported"
                        .to_string(),
                );
            }
            TemplateElement::RawString(_) | TemplateElement::Comment(_) => 0,
            _ => return Err("unsupported template element".to_string()),
        };
        max = max.max(d);
    }
    Ok(max)
}

/// Whether these elements call nothing but the pure helpers below (and the
/// capture of an expression), outside any block: their text then depends
/// on what they read ([`element_reads`]) and nothing else.
fn pure_calls(elements: &[TemplateElement]) -> bool {
    elements.iter().all(|e| match e {
        TemplateElement::RawString(_) | TemplateElement::Comment(_) => true,
        TemplateElement::Expression(h) | TemplateElement::HtmlExpression(h) => {
            let bare = h.params.is_empty() && h.hash.is_empty();
            let name_ok = match &h.name {
                Parameter::Name(n) => {
                    bare || n == CAPTURE || HELPERS.iter().any(|(name, _, _)| name == n)
                }
                Parameter::Path(_) => bare,
                _ => false,
            };
            name_ok
                && h.params.iter().chain(h.hash.values()).all(|p| match p {
                    Parameter::Subexpression(s) => pure_calls(std::slice::from_ref(s.as_element())),
                    _ => true,
                })
        }
        _ => false,
    })
}

fn params_depth(
    params: &[Parameter],
    hash: &std::collections::HashMap<String, Parameter>,
) -> Result<usize, String> {
    let mut max = 0;
    for p in params.iter().chain(hash.values()) {
        if let Parameter::Subexpression(s) = p {
            max = max.max(1 + check_tree(std::slice::from_ref(s.as_element()))?);
        }
    }
    Ok(max)
}

/// Handlebars' `each`, charging one step per item so that nested loops
/// over large lists stop at the time limit.
struct EachHelper;

impl HelperDef for EachHelper {
    fn call<'reg: 'rc, 'rc>(
        &self,
        h: &Helper<'rc>,
        r: &'reg Handlebars<'reg>,
        ctx: &'rc Context,
        rc: &mut RenderContext<'reg, 'rc>,
        out: &mut dyn Output,
    ) -> HelperResult {
        let value = h
            .param(0)
            .ok_or(RenderErrorReason::ParamNotFoundForIndex("each", 0))?;
        let Some(t) = h.template() else {
            return Ok(());
        };
        let items: Vec<(Value, &Value)> = match value.value() {
            Value::Array(list) if !list.is_empty() || h.inverse().is_none() => list
                .iter()
                .enumerate()
                .map(|(i, v)| (Value::from(i), v))
                .collect(),
            Value::Object(m) if !m.is_empty() || h.inverse().is_none() => m
                .iter()
                .map(|(k, v)| (Value::String(k.clone()), v))
                .collect(),
            _ => {
                return match h.inverse() {
                    Some(inverse) => inverse.render(r, ctx, rc, out),
                    None => Err(RenderError::strict_error(value.relative_path())),
                };
            }
        };
        let is_map = value.value().is_object();
        let mut block = BlockContext::new();
        let base = value.context_path().cloned();
        match &base {
            Some(p) => block.base_path_mut().clone_from(p),
            None => block.set_base_value(value.value().clone()),
        }
        rc.push_block(block);
        let len = items.len();
        for (i, (key, v)) in items.into_iter().enumerate() {
            limits::tick().map_err(RenderErrorReason::Other)?;
            if let Some(block) = rc.block_mut() {
                block.set_local_var("first", Value::Bool(i == 0));
                block.set_local_var("last", Value::Bool(i + 1 == len));
                block.set_local_var("index", Value::from(i));
                if is_map {
                    block.set_local_var("key", key.clone());
                }
                let segment = key.as_str().map_or_else(|| i.to_string(), str::to_string);
                match &base {
                    Some(p) => {
                        let mut path = p.clone();
                        path.push(segment);
                        *block.base_path_mut() = path;
                    }
                    None => block.set_base_value(v.clone()),
                }
                // `as |v|` or `as |v k|`: the item, and the key for a pair.
                let pair = h.block_param_pair();
                if let Some(name) = h.block_param().or(pair.map(|(n, _)| n)) {
                    let mut params = BlockParams::new();
                    match &base {
                        Some(_) => params.add_path(name, Vec::new())?,
                        None => params.add_value(name, v.clone())?,
                    }
                    if let Some((_, key_name)) = pair {
                        params.add_value(key_name, key)?;
                    }
                    block.set_block_params(params);
                }
            }
            t.render(r, ctx, rc, out)?;
        }
        rc.pop_block();
        Ok(())
    }
}

thread_local! {
    /// The value of the expression being evaluated: the capture helper puts
    /// it here instead of printing it, so no JSON text round trip.
    static CAPTURED: RefCell<Option<Value>> = const { RefCell::new(None) };
}

/// Name of the helper that captures an expression's value.
const CAPTURE: &str = "__capture";

/// Stores its argument (null when missing) in [`CAPTURED`]; prints nothing.
struct CaptureHelper;

impl HelperDef for CaptureHelper {
    fn call_inner<'reg: 'rc, 'rc>(
        &self,
        h: &Helper<'rc>,
        _: &'reg Handlebars<'reg>,
        _: &'rc Context,
        _: &mut RenderContext<'reg, 'rc>,
    ) -> Result<ScopedJson<'rc>, RenderError> {
        let v = h
            .param(0)
            .filter(|p| !p.is_value_missing())
            .map(|p| p.value().clone())
            .unwrap_or(Value::Null);
        CAPTURED.with(|c| *c.borrow_mut() = Some(v));
        Ok(ScopedJson::Derived(Value::String(String::new())))
    }
}

/// A plain path expression (`a.b.[c.d]`), which can be read without
/// handlebars; `None` for helper calls, literals, `this`, `@`-variables and
/// `../` parent paths.
fn bare_path(expr: &str) -> Option<FieldPath> {
    let expr = expr.trim();
    let first = expr.chars().next()?;
    if !(first.is_ascii_alphabetic() || first == '_')
        || expr.contains(|c: char| c.is_whitespace() || matches!(c, '(' | ')' | '"' | '\'' | '@'))
        || expr.contains("../")
        || expr == "this"
        || expr.starts_with("this.")
    {
        return None;
    }
    FieldPath::parse(expr).ok()
}

enum Nav<'c> {
    Found(&'c Value),
    Missing,
    Other,
}

/// Walks object keys only; anything else is left to handlebars.
fn navigate<'c>(root: &'c Value, path: &FieldPath) -> Nav<'c> {
    let mut cur = root;
    for seg in path.segments() {
        match (cur, seg) {
            (Value::Object(m), Segment::Key(k)) => match m.get(k) {
                Some(v) => cur = v,
                None => return Nav::Missing,
            },
            (Value::Null, _) => return Nav::Missing,
            _ => return Nav::Other,
        }
    }
    Nav::Found(cur)
}

/// `path` → `{{__capture path}}`; `helper a b` → `{{__capture (helper a b)}}`.
fn wrap_expr(expr: &str) -> Result<String, String> {
    let expr = expr.trim();
    if expr.is_empty() {
        return Err("empty expression".to_string());
    }
    if expr.contains("{{") || expr.contains("}}") {
        return Err("an expression is written without {{ }}".to_string());
    }
    let simple =
        !expr.contains(char::is_whitespace) || (expr.starts_with('(') && expr.ends_with(')'));
    Ok(if simple {
        format!("{{{{{CAPTURE} {expr}}}}}")
    } else {
        format!("{{{{{CAPTURE} ({expr})}}}}")
    })
}

fn template_error_text(e: &handlebars::TemplateError) -> String {
    // The parser's grammar rule names mean nothing to a rule author.
    let reason = match e.reason() {
        handlebars::TemplateErrorReason::InvalidSyntax(_) => {
            "invalid template syntax: an unclosed or malformed {{ }} expression".to_string()
        }
        other => other.to_string(),
    };
    match e.pos() {
        Some((l, c)) => format!("{reason} (line {l}, column {c})"),
        None => reason,
    }
}

fn render_error_text(e: &RenderError) -> String {
    match e.reason() {
        RenderErrorReason::MissingVariable(Some(path)) => format!("missing variable {path}"),
        RenderErrorReason::MissingVariable(None) => "missing variable".to_string(),
        RenderErrorReason::Other(msg) => msg.clone(),
        RenderErrorReason::HelperNotFound(h) => format!("unknown helper {h:?}"),
        other => other.to_string(),
    }
}

/// Truthiness for `when`: false, null, "", 0, [] and {} are false.
pub fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

static NULL: Value = Value::Null;

/// A helper call evaluated without handlebars, as [`ValueHelper`] would:
/// the same ticks, charges, limits and errors. Only calls whose every path
/// is found (or may be missing) are evaluated so; handlebars evaluates the
/// others, to fail with its own messages.
#[derive(Clone)]
struct Call {
    name: &'static str,
    allow_missing: bool,
    f: HelperFn,
    args: Vec<Arg>,
}

/// An argument of a [`Call`].
#[derive(Clone)]
enum Arg {
    /// Object keys from the context's root.
    Path(FieldPath),
    Literal(Value),
    Call(Call),
}

impl Call {
    /// The call an expression element is, when it is a call of a helper
    /// below on plain paths, literals and such calls (no hash arguments).
    fn of(e: &TemplateElement) -> Option<Call> {
        let TemplateElement::Expression(h) = e else {
            return None;
        };
        let Parameter::Name(name) = &h.name else {
            return None;
        };
        let (name, allow_missing, f) = HELPERS.iter().find(|(n, _, _)| n == name)?;
        if !h.hash.is_empty() || h.block || h.template.is_some() || h.block_param.is_some() {
            return None;
        }
        let args = h
            .params
            .iter()
            .map(|p| match p {
                Parameter::Literal(v) => Some(Arg::Literal(v.clone())),
                Parameter::Path(path) => path_keys(path).map(Arg::Path),
                Parameter::Subexpression(sub) => Call::of(sub.as_element()).map(Arg::Call),
                _ => None,
            })
            .collect::<Option<Vec<Arg>>>()?;
        Some(Call {
            name,
            allow_missing: *allow_missing,
            f: *f,
            args,
        })
    }

    /// Whether every path leads to a value (or may be missing): then
    /// [`Call::eval`] says what handlebars would.
    fn resolves(&self, data: &Value) -> bool {
        self.args.iter().all(|a| match a {
            Arg::Literal(_) => true,
            Arg::Path(p) => match navigate(data, p) {
                Nav::Found(_) => true,
                Nav::Missing => self.allow_missing,
                Nav::Other => false,
            },
            Arg::Call(c) => c.resolves(data),
        })
    }

    /// The call's value; the caller checked [`Call::resolves`].
    fn eval<'c>(&'c self, data: &'c Value) -> Result<Cow<'c, Value>, String> {
        let mut args: Vec<Cow<'c, Value>> = Vec::with_capacity(self.args.len());
        for a in &self.args {
            args.push(match a {
                Arg::Literal(v) => Cow::Borrowed(v),
                Arg::Path(p) => match navigate(data, p) {
                    Nav::Found(v) => Cow::Borrowed(v),
                    _ => Cow::Borrowed(&NULL),
                },
                Arg::Call(c) => c.eval(data)?,
            });
        }
        limits::tick()?;
        let v = match (self.name, args.first_mut()) {
            // A list no one else holds is sorted or grouped in place.
            ("sortBy" | "groupBy", Some(Cow::Owned(Value::Array(items)))) => {
                let items = std::mem::take(items);
                // The list's place is held (by null) for the messages'
                // argument numbers.
                let rest: Vec<&Value> = std::iter::once(&NULL)
                    .chain(args[1..].iter().map(|a| &**a))
                    .collect();
                if self.name == "sortBy" {
                    sort_by_owned(items, &rest)
                } else {
                    group_by_owned(items, &rest)
                }
            }
            _ => {
                let refs: Vec<&Value> = args.iter().map(|a| &**a).collect();
                (self.f)(&refs)
            }
        }
        .map_err(|m| format!("helper {}: {m}", self.name))?;
        if let Value::Array(a) = &v {
            limits::check_list(a.len(), format_args!("the list {} returns", self.name))?;
        }
        limits::charge_value(&v)?;
        Ok(Cow::Owned(v))
    }
}

type HelperFn = fn(&[&Value]) -> Result<Value, String>;

/// A helper that maps argument values to a value.
struct ValueHelper {
    name: &'static str,
    /// Whether a missing argument counts as null rather than an error.
    allow_missing: bool,
    f: HelperFn,
}

impl HelperDef for ValueHelper {
    fn call_inner<'reg: 'rc, 'rc>(
        &self,
        h: &Helper<'rc>,
        _: &'reg Handlebars<'reg>,
        _: &'rc Context,
        _: &mut RenderContext<'reg, 'rc>,
    ) -> Result<ScopedJson<'rc>, RenderError> {
        // Arguments are borrowed: a helper often gets a whole related set.
        let mut args: Vec<&Value> = Vec::with_capacity(h.params().len());
        for p in h.params() {
            if p.is_value_missing() {
                if !self.allow_missing {
                    let path = p.relative_path().cloned().unwrap_or_default();
                    return Err(RenderErrorReason::Other(format!(
                        "missing variable {path} (argument of {})",
                        self.name
                    ))
                    .into());
                }
                args.push(&NULL);
            } else {
                args.push(p.value());
            }
        }
        limits::tick().map_err(RenderErrorReason::Other)?;
        let v = (self.f)(&args)
            .map_err(|m| RenderErrorReason::Other(format!("helper {}: {m}", self.name)))?;
        // Results are charged: doubling a value in a chain of vars runs
        // into the byte limit long before memory does.
        if let Value::Array(a) = &v {
            limits::check_list(a.len(), format_args!("the list {} returns", self.name))
                .map_err(RenderErrorReason::Other)?;
        }
        limits::charge_value(&v).map_err(RenderErrorReason::Other)?;
        Ok(ScopedJson::Derived(v))
    }
}

/// Every helper a template may call: this project's ([`HELPERS`]) and the
/// handlebars built-ins rules use. The one list `validate` suggests from.
pub fn helper_names() -> impl Iterator<Item = &'static str> {
    HELPERS
        .iter()
        .map(|(name, _, _)| *name)
        .chain(["eq", "ne", "and", "or", "not", "len", "lookup"])
}

/// Name, whether missing arguments are null, function. Documented in
/// docs/rules.md; keep the two in step.
const HELPERS: &[(&str, bool, HelperFn)] = &[
    ("json", true, h_json),
    ("get", true, h_get),
    ("default", true, h_default),
    ("list", false, h_list),
    ("concat", false, h_concat),
    ("append", false, h_append),
    ("split", false, h_split),
    ("join", false, h_join),
    ("lower", false, h_lower),
    ("upper", false, h_upper),
    ("replace", false, h_replace),
    ("trim", false, h_trim),
    ("trimPrefix", false, h_trim_prefix),
    ("trimSuffix", false, h_trim_suffix),
    ("hasPrefix", false, h_has_prefix),
    ("hasSuffix", false, h_has_suffix),
    ("contains", false, h_contains),
    ("containsLoose", false, h_contains_loose),
    ("regexMatch", false, h_regex_match),
    ("pluck", false, h_pluck),
    ("uniq", false, h_uniq),
    ("sort", false, h_sort),
    ("sortBy", false, h_sort_by),
    ("groupBy", false, h_group_by),
    ("keys", false, h_keys),
    ("apiGroup", false, h_api_group),
    ("imageRegistry", false, h_image_registry),
    ("imageOrg", false, h_image_org),
    ("hash", false, h_hash),
    ("shorten", false, h_shorten),
];

fn arity(args: &[&Value], min: usize, max: usize) -> Result<(), String> {
    if args.len() < min || args.len() > max {
        if min == max {
            return Err(format!("takes {min} argument(s), got {}", args.len()));
        }
        return Err(format!(
            "takes {min} to {max} arguments, got {}",
            args.len()
        ));
    }
    Ok(())
}

fn text(args: &[&Value], i: usize) -> Result<String, String> {
    match args[i] {
        Value::Null => Ok(String::new()),
        v => scalar_text(v)
            .ok_or_else(|| format!("argument {} must be text, got {}", i + 1, kind_of(v))),
    }
}

fn list<'a>(args: &[&'a Value], i: usize) -> Result<&'a [Value], String> {
    match args[i] {
        Value::Null => Ok(&[]),
        Value::Array(a) => Ok(a),
        v => Err(format!(
            "argument {} must be a list, got {}",
            i + 1,
            kind_of(v)
        )),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

/// `json v`: the value itself (a missing value is null).
fn h_json(args: &[&Value]) -> Result<Value, String> {
    arity(args, 1, 1)?;
    // The caller renders this; a string result must stay JSON text.
    Ok(Value::String(
        serde_json::to_string(&args[0]).map_err(|e| e.to_string())?,
    ))
}

/// `get obj "a.b[0]" [default]`: a field by path, or the default (null).
fn h_get(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 3)?;
    let path = FieldPath::parse(&text(args, 1)?)?;
    let found = path.get(args[0]).filter(|v| !v.is_null()).cloned();
    Ok(found.unwrap_or_else(|| args.get(2).map(|v| (*v).clone()).unwrap_or(Value::Null)))
}

/// `default v d`: `d` when `v` is missing, null or "".
fn h_default(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    Ok(match args[0] {
        Value::Null => args[1].clone(),
        Value::String(s) if s.is_empty() => args[1].clone(),
        v => v.clone(),
    })
}

/// `list a b c`: a list of the arguments.
fn h_list(args: &[&Value]) -> Result<Value, String> {
    limits::check_list(args.len(), "the list list returns")?;
    limits::fits(args.iter().map(|v| limits::weight(v)).sum())?;
    Ok(Value::Array(args.iter().map(|v| (*v).clone()).collect()))
}

/// `concat a b …`: the arguments' text, joined.
fn h_concat(args: &[&Value]) -> Result<Value, String> {
    // The same value given many times would multiply it: checked first.
    limits::fits(args.iter().map(|v| limits::weight(v)).sum())?;
    let mut out = String::new();
    for i in 0..args.len() {
        out.push_str(&text(args, i)?);
    }
    Ok(Value::String(out))
}

/// `append l1 l2 …`: lists concatenated.
fn h_append(args: &[&Value]) -> Result<Value, String> {
    let len: usize = args.iter().filter_map(|v| v.as_array()).map(Vec::len).sum();
    limits::check_list(len, "the list append returns")?;
    limits::fits(args.iter().map(|v| limits::weight(v)).sum())?;
    let mut out = Vec::new();
    for i in 0..args.len() {
        out.extend(list(args, i)?.iter().cloned());
    }
    Ok(Value::Array(out))
}

/// `split s sep [n]`: at most `n` parts (all by default).
fn h_split(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 3)?;
    let s = text(args, 0)?;
    let sep = text(args, 1)?;
    if sep.is_empty() {
        return Err("separator is empty".to_string());
    }
    limits::check_list(
        s.matches(sep.as_str()).count() + 1,
        "the list split returns",
    )?;
    let parts: Vec<Value> = match args.get(2) {
        Some(n) => {
            let n = n.as_u64().ok_or("argument 3 must be a number")? as usize;
            s.splitn(n.max(1), sep.as_str())
                .map(|p| Value::String(p.to_string()))
                .collect()
        }
        None => s
            .split(sep.as_str())
            .map(|p| Value::String(p.to_string()))
            .collect(),
    };
    Ok(Value::Array(parts))
}

/// `join l sep`.
fn h_join(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    let items = list(args, 0)?;
    let sep = text(args, 1)?;
    // A long separator between many items multiplies it.
    limits::fits(limits::weight(args[0]) + sep.len() * items.len())?;
    let parts: Result<Vec<String>, String> = items
        .iter()
        .map(|v| scalar_text(v).ok_or_else(|| format!("cannot join {}", kind_of(v))))
        .collect();
    Ok(Value::String(parts?.join(&sep)))
}

fn h_lower(args: &[&Value]) -> Result<Value, String> {
    arity(args, 1, 1)?;
    Ok(Value::String(text(args, 0)?.to_lowercase()))
}

fn h_upper(args: &[&Value]) -> Result<Value, String> {
    arity(args, 1, 1)?;
    Ok(Value::String(text(args, 0)?.to_uppercase()))
}

/// `replace s from to`: every occurrence.
fn h_replace(args: &[&Value]) -> Result<Value, String> {
    arity(args, 3, 3)?;
    let (s, from, to) = (text(args, 0)?, text(args, 1)?, text(args, 2)?);
    // Every occurrence grows by the replacement: checked before.
    let count = if from.is_empty() {
        s.chars().count() + 1
    } else {
        s.matches(from.as_str()).count()
    };
    limits::fits(s.len() + count * to.len())?;
    Ok(Value::String(s.replace(&from, &to)))
}

/// `trim s`: white space removed at both ends.
fn h_trim(args: &[&Value]) -> Result<Value, String> {
    arity(args, 1, 1)?;
    Ok(Value::String(text(args, 0)?.trim().to_string()))
}

fn h_trim_prefix(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    let s = text(args, 0)?;
    let p = text(args, 1)?;
    Ok(Value::String(
        s.strip_prefix(p.as_str()).unwrap_or(&s).to_string(),
    ))
}

fn h_trim_suffix(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    let s = text(args, 0)?;
    let p = text(args, 1)?;
    Ok(Value::String(
        s.strip_suffix(p.as_str()).unwrap_or(&s).to_string(),
    ))
}

fn h_has_prefix(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    Ok(Value::Bool(text(args, 0)?.starts_with(&text(args, 1)?)))
}

fn h_has_suffix(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    Ok(Value::Bool(text(args, 0)?.ends_with(&text(args, 1)?)))
}

/// `contains list-or-text x`: list membership or substring.
fn h_contains(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    Ok(Value::Bool(match &args[0] {
        Value::Array(items) => items.contains(args[1]),
        _ => text(args, 0)?.contains(&text(args, 1)?),
    }))
}

/// Lowercase letters and digits only: "Safe-Start" and "safestart" agree.
fn loose(s: &str) -> String {
    s.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// `containsLoose list x`: membership ignoring case and punctuation.
fn h_contains_loose(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    let want = loose(&text(args, 1)?);
    Ok(Value::Bool(
        list(args, 0)?
            .iter()
            .filter_map(scalar_text)
            .any(|s| loose(&s) == want),
    ))
}

/// `regexMatch s re`: whether the whole of `s` matches.
fn h_regex_match(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    let (subject, pattern) = (text(args, 0)?, text(args, 1)?);
    let matched = |re: &Result<regex::Regex, String>| match re {
        Ok(re) => Ok(Value::Bool(re.is_match(&subject))),
        Err(e) => Err(e.clone()),
    };
    // A pattern too large to keep is compiled per call, as before.
    let uncached = || matched(&compile_regex_match(&pattern, None).map_err(|e| e.to_string()));
    RECENT_REGEXES.with(|recent| {
        let mut recent = recent.borrow_mut();
        if let Some(at) = recent.iter().position(|(p, _)| *p == pattern) {
            // Kept in front: the pattern of a loop matches every item.
            recent[..=at].rotate_right(1);
            return recent[0].1.as_ref().map_or_else(uncached, matched);
        }
        let re = match compile_regex_match(&pattern, Some(CACHED_REGEX_BYTES)) {
            Err(regex::Error::CompiledTooBig(_)) => None,
            other => Some(other.map_err(|e| e.to_string())),
        };
        let out = re.as_ref().map_or_else(uncached, matched);
        recent.truncate(RECENT_REGEXES_MAX - 1);
        recent.insert(0, (pattern.clone(), re));
        out
    })
}

/// A `regexMatch` pattern as cached: compiled (or its error), or `None`
/// when too large to keep.
type CachedRegex = Option<Result<regex::Regex, String>>;

/// How many `regexMatch` patterns each evaluation thread keeps compiled.
const RECENT_REGEXES_MAX: usize = 4;

/// The compiled size up to which a `regexMatch` pattern is cached (the
/// `regex` crate allows 10 MiB): what the cached ones hold stays small.
const CACHED_REGEX_BYTES: usize = 256 * 1024;

thread_local! {
    /// The `regexMatch` patterns last used on this thread, most recent
    /// first: a template matching each item of a list against one pattern
    /// compiles it once, not per item.
    static RECENT_REGEXES: RefCell<Vec<(String, CachedRegex)>> = const { RefCell::new(Vec::new()) };
}

/// A `regexMatch` pattern compiled to match whole strings, within
/// `size_limit` bytes compiled (the `regex` crate's default if `None`).
fn compile_regex_match(
    pattern: &str,
    size_limit: Option<usize>,
) -> Result<regex::Regex, regex::Error> {
    #[cfg(test)]
    REGEX_COMPILES.with(|n| n.set(n.get() + 1));
    let mut builder = regex::RegexBuilder::new(&format!("^(?:{pattern})$"));
    if let Some(limit) = size_limit {
        builder.size_limit(limit);
    }
    builder.build()
}

// What a template reads: the one place it is worked out. [`reads_of`]
// parses a text and [`element_reads`] walks handlebars' tree; every other
// question (the paths of `trigger`, the names under `related`, whether a
// value names a root, what `validate` checks against schemas) is answered
// from the [`Reads`] they return, never from the text.

/// One path a template reads from the root of its context. The value there
/// is read whole: anything below it may matter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PathRead {
    /// As written (`trigger.metadata.name`, `../vars.x`); for `get obj
    /// "a.b"`, the object's path and the literal joined by a dot.
    pub raw: String,
    /// Its segments from the root: keys, and the indexes of a `get` literal.
    pub segments: Vec<Segment>,
}

/// What a template or expression reads of the context it renders in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reads {
    /// The paths read from the root, in the order written.
    pub paths: Vec<PathRead>,
    /// Whether it reads the whole context, or some of it in a way no path
    /// names (`this` at the root, any `@root` path, a block helper other than
    /// `if`/`unless`/`each`/`with`, a partial): then `paths` are not all
    /// it reads.
    pub whole: bool,
}

impl Reads {
    /// Reads everything.
    fn everything() -> Reads {
        Reads {
            paths: Vec::new(),
            whole: true,
        }
    }

    fn merge(&mut self, other: Reads) {
        self.whole |= other.whole;
        self.paths.extend(other.paths);
    }

    /// Whether it may read `root` (a path under it, or everything).
    pub(crate) fn mentions(&self, root: &str) -> bool {
        self.whole || self.paths.iter().any(|p| p.first_key() == Some(root))
    }

    /// Whether it reads nothing but paths under `roots`.
    fn within(&self, roots: &[&str]) -> bool {
        !self.whole
            && self
                .paths
                .iter()
                .all(|p| p.first_key().is_some_and(|k| roots.contains(&k)))
    }

    /// The keys below `root` each path under it reads, up to its first
    /// index (the value there is read whole); `None` when it reads `root`
    /// whole or everything.
    fn keys_under(&self, root: &str) -> Option<Vec<Vec<String>>> {
        if self.whole {
            return None;
        }
        let mut out = Vec::new();
        for p in self.paths.iter().filter(|p| p.first_key() == Some(root)) {
            let keys = leading_keys(&p.segments[1..]);
            if keys.is_empty() {
                return None;
            }
            out.push(keys);
        }
        Some(out)
    }
}

impl PathRead {
    fn first_key(&self) -> Option<&str> {
        match self.segments.first() {
            Some(Segment::Key(k)) => Some(k),
            _ => None,
        }
    }
}

/// What `text` reads rendered as a template, or (`expr`) evaluated as an
/// expression: the definition of what a template reads, walked over the
/// tree handlebars parses (see [`element_reads`]). `None` when it does not
/// parse so (it is then never rendered so); a text nested deeper than the
/// default limit is not parsed (the parser recurses) and reads everything.
pub(crate) fn reads_of(text: &str, expr: bool) -> Option<Reads> {
    let src: Cow<str> = if expr {
        Cow::Owned(wrap_expr(text).ok()?)
    } else if Templates::is_literal(text) {
        return Some(Reads::default());
    } else {
        Cow::Borrowed(text)
    };
    if lexical_depth(&src) > Limits::default().template_depth {
        return Some(Reads::everything());
    }
    let tpl = Template::compile(&src).ok()?;
    Some(element_reads(&tpl.elements))
}

/// What a text of a rule reads, whichever it is: a template, an
/// expression, or neither (it may be read either way, so both count; one
/// that parses neither way reads everything).
fn text_reads(text: &str) -> Rc<Reads> {
    if let Some(r) = TEXT_READS.with(|m| m.borrow().get(text).cloned()) {
        return r;
    }
    let reads = Rc::new(match (reads_of(text, false), reads_of(text, true)) {
        (None, None) => Reads::everything(),
        (a, b) => {
            let mut all = a.unwrap_or_default();
            all.merge(b.unwrap_or_default());
            all
        }
    });
    TEXT_READS.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= TEXT_READS_MAX {
            m.clear();
        }
        m.insert(text.to_string(), Rc::clone(&reads));
    });
    reads
}

thread_local! {
    /// [`text_reads`] by text, a memo of a pure function: the same texts
    /// of a rule are asked about once per question, per compile and per
    /// value expanded, and parsing them is the cost (the scans it replaces
    /// were substring searches).
    static TEXT_READS: RefCell<HashMap<String, Rc<Reads>>> = RefCell::default();
}

/// Texts whose reads [`TEXT_READS`] holds at most (emptied when full).
const TEXT_READS_MAX: usize = 4096;

/// What parsed elements read (see [`ReadWalk`]).
fn element_reads(elements: &[TemplateElement]) -> Reads {
    let mut walk = ReadWalk {
        reads: Reads::default(),
        frames: vec![Frame::Root],
    };
    walk.elements(elements);
    walk.reads
}

/// Where a relative path resolves: the root of the context, or the value
/// an `each`/`with` block runs on (read whole where it is named).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Frame {
    Root,
    Block,
}

/// A walk over a template's tree, as handlebars resolves its paths: a
/// relative path from the innermost block's value, `../` one block up per
/// step (past the outermost, the innermost: handlebars' own fallback),
/// `@root` from the root. Only `each` and `with` open blocks; `if` and
/// `unless` render in the context they are in, and every inverse (`else`)
/// in the enclosing one. `@index`-like locals come from a block's value.
struct ReadWalk {
    reads: Reads,
    /// The root, then each open `each`/`with` block, innermost last.
    frames: Vec<Frame>,
}

impl ReadWalk {
    fn elements(&mut self, elements: &[TemplateElement]) {
        for e in elements {
            self.element(e);
        }
    }

    fn element(&mut self, e: &TemplateElement) {
        match e {
            TemplateElement::RawString(_) | TemplateElement::Comment(_) => {}
            TemplateElement::Expression(h) | TemplateElement::HtmlExpression(h) => self.call(h),
            TemplateElement::HelperBlock(h) => self.block(h),
            // Partials, decorators: refused at compile; nothing known.
            _ => self.reads.whole = true,
        }
    }

    /// A helper call, or a path (`{{a.b}}`, `{{name}}`: a name alone may
    /// be a helper's, and is counted as a path too).
    fn call(&mut self, h: &HelperTemplate) {
        if h.params.is_empty() && h.hash.is_empty() {
            return self.param(&h.name);
        }
        if !matches!(h.name, Parameter::Name(_)) {
            self.param(&h.name);
        }
        let params = match (&h.name, &h.params[..]) {
            // `get obj "a.b"`: the path below the object, not all of it.
            (
                Parameter::Name(n),
                [
                    Parameter::Path(obj),
                    Parameter::Literal(Value::String(lit)),
                    ..,
                ],
            ) if n == "get" && FieldPath::parse(lit).is_ok() => {
                let below = FieldPath::parse(lit)
                    .map(|p| p.segments().to_vec())
                    .unwrap_or_default();
                self.path(obj, &below, Some(lit));
                &h.params[2..]
            }
            _ => &h.params[..],
        };
        for p in params.iter().chain(h.hash.values()) {
            self.param(p);
        }
    }

    fn block(&mut self, h: &HelperTemplate) {
        for p in h.params.iter().chain(h.hash.values()) {
            self.param(p);
        }
        let name = match &h.name {
            Parameter::Name(n) => n.as_str(),
            _ => "",
        };
        let opens = match name {
            "if" | "unless" => false,
            "each" | "with" => true,
            // What another block runs its body on is not known.
            _ => {
                self.reads.whole = true;
                self.param(&h.name);
                false
            }
        };
        if let Some(t) = &h.template {
            if opens {
                self.frames.push(Frame::Block);
            }
            self.elements(&t.elements);
            if opens {
                self.frames.pop();
            }
        }
        if let Some(t) = &h.inverse {
            self.elements(&t.elements);
        }
    }

    fn param(&mut self, p: &Parameter) {
        match p {
            Parameter::Literal(_) => {}
            // Handlebars reads a name as a path of one key.
            Parameter::Name(n) => {
                let segs = [PathSeg::Named(n.clone())];
                self.relative(&segs, n, &[], None);
            }
            Parameter::Path(path) => self.path(path, &[], None),
            Parameter::Subexpression(s) => self.element(s.as_element()),
            _ => self.reads.whole = true,
        }
    }

    /// A path, and `below` it the segments of a `get` literal (`lit`).
    fn path(&mut self, path: &Path, below: &[Segment], lit: Option<&str>) {
        match path {
            // `@root` alone is a local, not the root; counted as the root.
            Path::Local((_, name, _)) if name == "root" => self.reads.whole = true,
            // `@index`, `@key`, … come from the block's value.
            Path::Local(_) => {}
            Path::Relative((segs, raw)) => self.relative(segs, raw, below, lit),
        }
    }

    fn relative(&mut self, segs: &[PathSeg], raw: &str, below: &[Segment], lit: Option<&str>) {
        let up = segs.iter().take_while(|s| **s == *PATH_UP).count();
        let (frame, rest) = if segs.first() == Some(&*PATH_ROOT) {
            // Listed, and counted as reading everything too: callers stay
            // as cautious with `@root` as the text scans were.
            self.reads.whole = true;
            (Frame::Root, &segs[1..])
        } else {
            let n = self.frames.len();
            let at = if up < n { n - 1 - up } else { n - 1 };
            (self.frames[at], &segs[up..])
        };
        if frame == Frame::Block {
            return;
        }
        let mut segments = Vec::with_capacity(rest.len() + below.len());
        for s in rest {
            match s {
                PathSeg::Named(k) => segments.push(Segment::Key(k.clone())),
                // `@` or `../` further in: not followed.
                _ => {
                    self.reads.whole = true;
                    return;
                }
            }
        }
        segments.extend_from_slice(below);
        if segments.is_empty() {
            self.reads.whole = true;
            return;
        }
        let raw = match lit {
            Some(l) => format!("{raw}.{l}"),
            None => raw.to_string(),
        };
        self.reads.paths.push(PathRead { raw, segments });
    }
}

/// Handlebars' `../` segment, as its parser writes it.
static PATH_UP: LazyLock<PathSeg> = LazyLock::new(|| first_seg("../a"));
/// Handlebars' `@root` segment, as its parser writes it.
static PATH_ROOT: LazyLock<PathSeg> = LazyLock::new(|| first_seg("@root/a"));

/// The first segment of a path handlebars parses (its segment kinds are
/// not public otherwise).
fn first_seg(path: &str) -> PathSeg {
    match Path::parse(path) {
        Ok(Path::Relative((segs, _))) => segs.into_iter().next(),
        _ => None,
    }
    // A name no path segment can equal: never matched.
    .unwrap_or_else(|| PathSeg::Named(String::new()))
}

/// The paths below `trigger` the texts read (`trigger.metadata.name`,
/// `get trigger "spec.image"`), each up to its first index: `None` when one
/// reads it whole or everything. A text counts as a template and as an
/// expression (see [`text_reads`]).
pub(crate) fn trigger_paths(texts: &[&str]) -> Option<Vec<Vec<String>>> {
    let mut paths = Vec::new();
    for t in texts {
        paths.extend(text_reads(t).keys_under("trigger")?);
    }
    paths.sort();
    paths.dedup();
    Some(paths)
}

/// Whether a template value might read `root`: a string (a map key too,
/// read as a template or an expression: nested directives' expressions
/// are strings) reads a path under it, or the whole context.
pub(crate) fn mentions(v: &Value, root: &str) -> bool {
    match v {
        Value::String(s) => mentions_text(s, root),
        Value::Array(a) => a.iter().any(|x| mentions(x, root)),
        Value::Object(m) => m
            .iter()
            .any(|(k, x)| mentions_text(k, root) || mentions(x, root)),
        _ => false,
    }
}

/// [`mentions`] for one text.
pub(crate) fn mentions_text(s: &str, root: &str) -> bool {
    text_reads(s).mentions(root)
}

/// The names read under `root` in `texts` (as `root.<name>`, a name of
/// `names`), sorted; `None` when one reads `root` any other way (whole,
/// or by a name not in `names`) or everything.
pub(crate) fn named_reads(texts: &[&str], root: &str, names: &[&str]) -> Option<Vec<String>> {
    let mut out = BTreeSet::new();
    for t in texts {
        let reads = text_reads(t);
        for keys in reads.keys_under(root)? {
            let name = keys.into_iter().next()?;
            if !names.contains(&name.as_str()) {
                return None;
            }
            out.insert(name);
        }
    }
    Some(out.into_iter().collect())
}

#[cfg(test)]
thread_local! {
    /// `regexMatch` patterns compiled on this thread (tests count them).
    static REGEX_COMPILES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// `pluck list "path"`: the field of each item (items without it skipped).
fn h_pluck(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    let path = FieldPath::parse(&text(args, 1)?)?;
    Ok(Value::Array(
        list(args, 0)?
            .iter()
            .filter_map(|v| path.get(v).cloned())
            .collect(),
    ))
}

/// Orders JSON values: by their JSON text, which is total and stable.
fn sort_key(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `uniq list`: duplicates removed, first appearance kept.
fn h_uniq(args: &[&Value]) -> Result<Value, String> {
    arity(args, 1, 1)?;
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for v in list(args, 0)? {
        if seen.insert(v.to_string()) {
            out.push(v.clone());
        }
    }
    Ok(Value::Array(out))
}

/// `sort list`.
fn h_sort(args: &[&Value]) -> Result<Value, String> {
    arity(args, 1, 1)?;
    let mut items = list(args, 0)?.to_vec();
    items.sort_by_cached_key(sort_key);
    Ok(Value::Array(items))
}

/// `sortBy list "path"`: stable sort by a field (items without it last).
fn h_sort_by(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    let items = list(args, 0)?;
    let order = sort_order(items, &FieldPath::parse(&text(args, 1)?)?);
    Ok(Value::Array(
        order.into_iter().map(|i| items[i].clone()).collect(),
    ))
}

/// [`h_sort_by`] of a list it may take apart (`args[0]` stands in for it).
fn sort_by_owned(items: Vec<Value>, args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    let order = sort_order(&items, &FieldPath::parse(&text(args, 1)?)?);
    Ok(Value::Array(take_in_order(items, order.into_iter())))
}

/// The positions of `items` in a stable sort by the field at `path`
/// (items without it last); keys borrowed, nothing copied.
fn sort_order(items: &[Value], path: &FieldPath) -> Vec<usize> {
    let mut keyed: Vec<((u8, Cow<'_, str>), usize)> = items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let key = match path.get(v) {
                Some(Value::String(s)) => (0, Cow::Borrowed(s.as_str())),
                Some(x) => (0, Cow::Owned(sort_key(x))),
                None => (1, Cow::Borrowed("")),
            };
            (key, i)
        })
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    keyed.into_iter().map(|(_, i)| i).collect()
}

/// The items at `order`'s positions (each once), moved out.
fn take_in_order(items: Vec<Value>, order: impl Iterator<Item = usize>) -> Vec<Value> {
    let mut slots: Vec<Option<Value>> = items.into_iter().map(Some).collect();
    order
        .filter_map(|i| slots.get_mut(i).and_then(Option::take))
        .collect()
}

/// `groupBy list "path"`: `[{key, items}]` sorted by key; items keep their
/// order. Items without the field are skipped.
fn h_group_by(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    let items = list(args, 0)?;
    let groups = group_order(items, &FieldPath::parse(&text(args, 1)?)?);
    Ok(grouped(groups.into_iter().map(|(key, at)| {
        (key, at.into_iter().map(|i| items[i].clone()).collect())
    })))
}

/// [`h_group_by`] of a list it may take apart (`args[0]` stands in for it).
fn group_by_owned(items: Vec<Value>, args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    let groups = group_order(&items, &FieldPath::parse(&text(args, 1)?)?);
    let mut slots: Vec<Option<Value>> = items.into_iter().map(Some).collect();
    Ok(grouped(groups.into_iter().map(|(key, at)| {
        let items = at
            .into_iter()
            .filter_map(|i| slots.get_mut(i).and_then(Option::take))
            .collect();
        (key, items)
    })))
}

/// The positions of `items` by the text of the field at `path`, keys
/// sorted, positions in order; items without it are left out.
fn group_order(items: &[Value], path: &FieldPath) -> BTreeMap<String, Vec<usize>> {
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let key = match path.get(item) {
            Some(Value::String(s)) => Cow::Borrowed(s.as_str()),
            Some(x) => match scalar_text(x) {
                Some(t) => Cow::Owned(t),
                None => continue,
            },
            None => continue,
        };
        // The key is copied only for a new group.
        match groups.get_mut(key.as_ref()) {
            Some(g) => g.push(i),
            None => {
                groups.insert(key.into_owned(), vec![i]);
            }
        }
    }
    groups
}

/// `[{key, items}]` of groups in order.
fn grouped(groups: impl Iterator<Item = (String, Vec<Value>)>) -> Value {
    Value::Array(
        groups
            .map(|(key, items)| {
                let mut m = Map::new();
                m.insert("key".to_string(), Value::String(key));
                m.insert("items".to_string(), Value::Array(items));
                Value::Object(m)
            })
            .collect(),
    )
}

/// `keys map`: sorted keys.
fn h_keys(args: &[&Value]) -> Result<Value, String> {
    arity(args, 1, 1)?;
    match &args[0] {
        Value::Object(m) => Ok(Value::Array(m.keys().cloned().map(Value::String).collect())),
        Value::Null => Ok(Value::Array(Vec::new())),
        v => Err(format!("argument 1 must be a map, got {}", kind_of(v))),
    }
}

/// `apiGroup "apps/v1"` → `apps`; `apiGroup "v1"` → `` (core).
fn h_api_group(args: &[&Value]) -> Result<Value, String> {
    arity(args, 1, 1)?;
    let api_version = text(args, 0)?;
    Ok(Value::String(
        api_version
            .rsplit_once('/')
            .map(|(g, _)| g.to_string())
            .unwrap_or_default(),
    ))
}

/// Splits an image reference into registry and repository path, the way
/// container tooling does: the first component is a registry when it has a
/// `.` or `:` or is `localhost`; otherwise the registry is `docker.io`.
/// Tag and digest are dropped.
pub fn split_image(image: &str) -> (String, String) {
    let without_digest = image.split('@').next().unwrap_or(image);
    let (first, rest) = match without_digest.split_once('/') {
        Some((f, r)) if f.contains('.') || f.contains(':') || f == "localhost" => {
            (f.to_string(), r.to_string())
        }
        _ => ("docker.io".to_string(), without_digest.to_string()),
    };
    // A tag is a `:` after the last `/`.
    let repo = match rest.rsplit_once('/') {
        Some((head, last)) => [head, "/", last.split(':').next().unwrap_or(last)].concat(),
        None => rest.split(':').next().unwrap_or(&rest).to_string(),
    };
    (first, repo)
}

/// `imageRegistry img`: e.g. `registry.example.org`.
fn h_image_registry(args: &[&Value]) -> Result<Value, String> {
    arity(args, 1, 1)?;
    Ok(Value::String(split_image(&text(args, 0)?).0))
}

/// `imageOrg img`: registry and first path segment, e.g.
/// `registry.example.org/team`.
fn h_image_org(args: &[&Value]) -> Result<Value, String> {
    arity(args, 1, 1)?;
    let (registry, repo) = split_image(&text(args, 0)?);
    let org = repo.split('/').next().unwrap_or_default();
    Ok(Value::String([registry.as_str(), "/", org].concat()))
}

/// Lowercase hex SHA-256 of `s`, cut to `n` characters.
pub fn short_hash(s: &str, n: usize) -> String {
    let digest = Sha256::digest(s.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex.chars().take(n.clamp(1, 64)).collect()
}

/// `hash s [n]`: stable short hash (default 10 hex characters).
fn h_hash(args: &[&Value]) -> Result<Value, String> {
    arity(args, 1, 2)?;
    let n = match args.get(1) {
        Some(v) => v.as_u64().ok_or("argument 2 must be a number")? as usize,
        None => 10,
    };
    Ok(Value::String(short_hash(&text(args, 0)?, n)))
}

/// Keeps `s` when it fits in `max`; otherwise a prefix, `-` and a 10-hex
/// hash of the whole, within `max`, ending in an alphanumeric (so the
/// result stays a valid label value or name).
pub fn shorten(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let hash = short_hash(s, 10);
    let keep = max.saturating_sub(hash.len() + 1);
    let mut prefix: String = s.chars().take(keep).collect();
    while prefix.len() > keep {
        prefix.pop();
    }
    let prefix = prefix.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if prefix.is_empty() {
        hash
    } else {
        format!("{prefix}-{hash}")
    }
}

/// `shorten s max`.
fn h_shorten(args: &[&Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    let max = args[1].as_u64().ok_or("argument 2 must be a number")? as usize;
    if max < 11 {
        return Err("max must be at least 11".to_string());
    }
    Ok(Value::String(shorten(&text(args, 0)?, max)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn literal_exactly_when_no_opening_braces() {
        let mut texts = vec![String::new()];
        for len in 1..=6 {
            let longer: Vec<String> = texts
                .iter()
                .filter(|t| t.chars().count() == len - 1)
                .flat_map(|t| ["{", "}", "a", "é"].map(|c| format!("{t}{c}")))
                .collect();
            texts.extend(longer);
        }
        assert_eq!(texts.len(), 5461);
        for t in &texts {
            assert_eq!(Templates::is_literal(t), !t.contains("{{"), "{t:?}");
        }
    }

    fn render(t: &str, ctx: Value) -> Result<String, String> {
        let mut tpl = Templates::new();
        tpl.compile(t).map_err(|e| e.1)?;
        tpl.render(t, &Context::from(ctx))
    }

    fn eval(e: &str, ctx: Value) -> Result<Value, String> {
        let mut tpl = Templates::new();
        tpl.compile_expr(e).map_err(|e| e.1)?;
        tpl.eval_ref(e, &Context::from(ctx)).map(Cow::into_owned)
    }

    /// An expression's value through handlebars alone and through the
    /// direct evaluation of calls, each with its own budget.
    fn both_ways(e: &str, ctx: &Value) -> (Result<Value, String>, Result<Value, String>) {
        let mut tpl = Templates::new();
        if let Err(err) = tpl.compile_expr(e) {
            return (Err(err.1.clone()), Err(err.1));
        }
        let ctx = Context::from(ctx.clone());
        let direct = {
            let _budget = limits::start(&Limits::default());
            tpl.eval_ref(e, &ctx).map(Cow::into_owned)
        };
        assert!(tpl.calls.contains_key(e), "{e} is not a direct call");
        tpl.calls.clear();
        let _budget = limits::start(&Limits::default());
        let hb = tpl.eval_ref(e, &ctx).map(Cow::into_owned);
        (direct, hb)
    }

    #[test]
    fn calls_evaluate_as_handlebars_does() {
        let ctx = json!({
            "related": {"types": [
                {"plural": "bs", "group": "g2"}, {"plural": "as", "group": "g1"},
                {"plural": "cs", "group": "g2"}, {"group": "g3"}, {"plural": 7, "group": 1},
            ]},
            "trigger": {"metadata": {"name": "Name-1", "labels": {"a.b/c": "x"}},
                        "spec": {"image": "reg.io/org/pkg:v1"}, "status": {"capabilities": ["safe-start"]}},
            "n": null, "s": "text", "m": {"k": "v"},
        });
        let cases = [
            r#"groupBy (sortBy related.types "plural") "group""#,
            r#"sortBy related.types "plural""#,
            r#"groupBy related.types "group""#,
            r#"groupBy (sortBy related.types "plural") "missing""#,
            r#"sortBy (sortBy related.types "group") "plural""#,
            r#"containsLoose (get trigger "status.capabilities") "safe-start""#,
            r#"imageOrg (get trigger "spec.image" "")"#,
            r#"shorten trigger.metadata.name 3"#,
            r#"default (get trigger "spec.nothing") "fallback""#,
            r#"lower trigger.metadata.name"#,
            r#"get trigger.metadata.labels "a.b/c""#,
            r#"pluck (sortBy related.types "plural") "plural""#,
            r#"keys m"#,
            r#"list s n 1 true"#,
            r#"get n "x""#,
            r#"lower this.s"#,
            // Errors: arity, argument types, missing paths, the helper's own.
            r#"sortBy related.types"#,
            r#"sortBy related.types "plural" "extra""#,
            r#"groupBy (sortBy related.types "plural")"#,
            r#"groupBy (sortBy related.types "plural") m"#,
            r#"sortBy s "plural""#,
            r#"sortBy related.nothing "plural""#,
            r#"lower trigger.nothing"#,
            r#"lower (get trigger "nothing.deeper")"#,
            r#"regexMatch s "(""#,
            r#"keys s"#,
            r#"shorten trigger.metadata.name "x""#,
        ];
        for e in cases {
            let (direct, hb) = both_ways(e, &ctx);
            assert_eq!(direct, hb, "{e}");
        }
        // Paths handlebars resolves by its own rules are left to it.
        let mut tpl = Templates::new();
        for e in [r#"lower related.types.0.plural"#, r#"lower @root.s"#] {
            tpl.compile_expr(e).ok();
        }
        let data = Context::from(ctx.clone());
        assert!(
            !tpl.calls
                .get(r#"lower related.types.0.plural"#)
                .is_some_and(|c| c.resolves(data.data()))
        );
        assert!(!tpl.calls.contains_key(r#"lower @root.s"#));
    }

    #[test]
    fn a_regex_match_pattern_is_compiled_once_for_a_loop() {
        let compiles = || REGEX_COMPILES.with(std::cell::Cell::get);
        let mut tpl = Templates::new();
        let data = Context::from(json!({"xs": ["abc", "abbbc", "ac", "xabc", "abcx", "abc"]}));
        let _budget = limits::start(&Limits::default());
        // What a template renders (its error's text), and how many
        // patterns rendering it compiled.
        let mut run = |t: &str| {
            tpl.compile(t).unwrap();
            let before = compiles();
            let out = tpl.render(t, &data).map_err(|e| e.to_string());
            (out, compiles() - before)
        };
        let t = r#"{{#each xs}}{{#if (regexMatch this "ab+c")}}y{{else}}n{{/if}}{{/each}}"#;
        assert_eq!(run(t), (Ok("yynnny".to_string()), 1));
        // Patterns used in turn stay compiled.
        let t = r#"{{#each xs}}{{regexMatch this "a.*"}}{{regexMatch this "b"}}{{/each}}"#;
        let want = "truefalsetruefalsetruefalsefalsefalsetruefalsetruefalse";
        assert_eq!(run(t), (Ok(want.to_string()), 2));
        // An invalid one fails each time, compiled once.
        let t = r#"{{#each xs}}{{regexMatch this "("}}{{/each}}"#;
        let runs = [run(t), run(t), run(t)];
        let err = &runs[0].0;
        assert!(
            err.as_ref().is_err_and(|e| e.contains("regex parse error")),
            "{err:?}"
        );
        assert!(runs.iter().all(|r| r.0 == *err));
        assert_eq!(runs.iter().map(|r| r.1).sum::<usize>(), 1);
        // More patterns than are cached: the oldest is compiled again.
        let n: usize = ["p1", "p2", "p3", "p4", "p5", "p1"]
            .iter()
            .map(|p| run(&format!(r#"{{{{regexMatch "p1" "{p}"}}}}"#)).1)
            .sum();
        assert_eq!(n, 6);
        // A pattern too large to keep is compiled per call, as before
        // (and tried within the limit once).
        let t = r#"{{#each xs}}{{regexMatch this "\\w{8}abc|abc"}}{{/each}}"#;
        let want = "truefalsefalsefalsefalsetrue";
        assert_eq!(run(t), (Ok(want.to_string()), 7));
    }

    #[test]
    fn templates_with_calls_render_as_handlebars_does() {
        let ctx = json!({
            "item": {"kind": "CustomResourceDefinition", "apiVersion": "apiextensions.k8s.io/v1",
                     "spec": {"image": "reg.io/org/pkg:v1"}, "n": 3, "b": false, "z": null},
            "trigger": {"metadata": {"name": "a-very-long-name-that-goes-on-and-on"}},
            "d": {"spec": {}},
            "xs": [1, "two", {"k": "v"}, [3, null]],
        });
        let cases = [
            r#"{{get item "kind" ""}}.{{apiGroup (get item "apiVersion" "")}}"#,
            r#"{{imageOrg item.spec.image}}"#,
            r#"x-{{shorten trigger.metadata.name 10}}-y"#,
            r#"{{default (get d "spec.template.spec.serviceAccountName") "default"}}"#,
            r#"{{item.kind}}/{{lower item.kind}}"#,
            r#"{{get item "n"}} {{get item "b"}} [{{get item "z"}}] {{get item "spec"}}"#,
            r#"{{list 1 "a" xs}}"#,
            r#"{{sortBy xs "k"}}"#,
            // Errors and paths handlebars answers alone.
            r#"{{lower item.nothing}}"#,
            r#"{{item.nothing}}-{{lower item.kind}}"#,
            r#"{{item.n}}-{{lower item.kind}}"#,
            r#"{{shorten trigger.metadata.name "x"}}"#,
            r#"{{regexMatch item.kind "("}}"#,
        ];
        for t in cases {
            let mut tpl = Templates::new();
            tpl.compile(t).unwrap();
            let data = Context::from(ctx.clone());
            let run = |tpl: &Templates| {
                let _budget = limits::start(&Limits::default());
                let out = tpl.render(t, &data);
                (out, limits::used())
            };
            let direct = run(&tpl);
            tpl.called.clear();
            assert_eq!(direct, run(&tpl), "{t}");
        }
        let mut tpl = Templates::new();
        tpl.compile(r#"{{imageOrg item.spec.image}}"#).unwrap();
        assert!(tpl.called.contains_key(r#"{{imageOrg item.spec.image}}"#));
    }

    #[test]
    fn paths_under_a_root_are_its_key_paths_or_none() {
        let mut tpl = Templates::new();
        let paths = |tpl: &mut Templates, t: &str| {
            tpl.compile(t).unwrap();
            tpl.paths_under(t, "item")
        };
        assert_eq!(
            paths(&mut tpl, r#"{{imageOrg item.spec.image}}-{{trigger.x}}"#),
            Some(vec![vec!["spec".to_string(), "image".to_string()]])
        );
        // `get` with a literal path reads below its object.
        assert_eq!(
            paths(&mut tpl, r#"{{get item.metadata.labels.[a.b/c] "x"}}"#),
            Some(vec![vec![
                "metadata".to_string(),
                "labels".to_string(),
                "a.b/c".to_string(),
                "x".to_string()
            ]])
        );
        assert_eq!(
            paths(&mut tpl, r#"{{get item "spec.containers[0].image"}}"#),
            Some(vec![vec!["spec".to_string(), "containers".to_string()]])
        );
        // A block's body reads below the value the block runs on.
        assert_eq!(
            paths(&mut tpl, r#"{{#each item.spec}}{{this}}{{/each}}"#),
            Some(vec![vec!["spec".to_string()]])
        );
        assert_eq!(paths(&mut tpl, "plain"), Some(Vec::new()));
        // An index is a key handlebars looks up in a list: the list is
        // copied whole where the path meets it.
        assert_eq!(
            paths(&mut tpl, r#"{{item.spec.[0]}}"#),
            Some(vec![vec!["spec".to_string(), "0".to_string()]])
        );
        // Read whole, or in a way a projection cannot follow.
        for t in [
            r#"{{json item}}"#,
            r#"{{get item (concat "spec" ".image")}}"#,
            r#"{{#with item}}{{spec.image}}{{/with}}"#,
            r#"{{#each item.spec}}{{../this}}{{/each}}"#,
            r#"{{@root.item.x}}"#,
            r#"{{this}}"#,
        ] {
            assert_eq!(paths(&mut tpl, t), None, "{t}");
        }
    }

    #[test]
    fn calls_charge_as_handlebars_does() {
        let items: Vec<Value> = (0..200)
            .map(|i| json!({"plural": format!("p{i}"), "group": format!("g{}", i % 7)}))
            .collect();
        let ctx = json!({"xs": items});
        let e = r#"groupBy (sortBy xs "plural") "group""#;
        let mut tpl = Templates::new();
        tpl.compile_expr(e).unwrap();
        let data = Context::from(ctx);
        let charged = |tpl: &Templates| {
            let _budget = limits::start(&Limits::default());
            tpl.eval_ref(e, &data).unwrap();
            limits::used()
        };
        let direct = charged(&tpl);
        tpl.calls.clear();
        assert_eq!(direct, charged(&tpl));
        assert!(direct > 0);
        // Over a budget both fail alike.
        let mut tpl = Templates::new();
        tpl.compile_expr(e).unwrap();
        let small = Limits {
            bytes_per_trigger: direct / 2,
            ..Limits::default()
        };
        let over = |tpl: &Templates| {
            let _budget = limits::start(&small);
            tpl.eval_ref(e, &data).map(Cow::into_owned)
        };
        let direct = over(&tpl);
        tpl.calls.clear();
        assert!(direct.is_err());
        assert_eq!(direct, over(&tpl));
    }

    #[test]
    fn sort_by_is_stable_and_group_by_keeps_order() {
        let items = json!({"xs": [
            {"n": "b", "k": 1}, {"k": 2}, {"n": "a", "k": 3}, {"n": 10, "k": 4},
            {"n": "b", "k": 5}, {"n": "a", "k": 6},
        ]});
        let sorted = eval(r#"sortBy xs "n""#, items.clone());
        let ks: Vec<i64> = sorted
            .iter()
            .flat_map(|v| v.as_array().into_iter().flatten())
            .filter_map(|v| v["k"].as_i64())
            .collect();
        // By text ("10" < "a" < "b"), equal keys in their order, none last.
        assert_eq!(ks, [4, 3, 6, 1, 5, 2]);
        let grouped = eval(r#"groupBy xs "n""#, items);
        assert_eq!(
            grouped,
            Ok(json!([
                {"key": "10", "items": [{"n": 10, "k": 4}]},
                {"key": "a", "items": [{"n": "a", "k": 3}, {"n": "a", "k": 6}]},
                {"key": "b", "items": [{"n": "b", "k": 1}, {"n": "b", "k": 5}]},
            ]))
        );
    }

    /// Only templates whose every path lies under the root, through pure
    /// helpers, count as reading nothing else.
    #[test]
    fn reads_only_sees_every_path() {
        let mut tpl = Templates::new();
        let cases = [
            ("plain text", true),
            ("{{item.name}}", true),
            ("{{item}}", true),
            (
                r#"{{get item "kind" ""}}.{{apiGroup (get item "apiVersion" "")}}"#,
                true,
            ),
            ("{{item.name}}-{{trigger.metadata.name}}", false),
            (r#"{{imageOrg (get trigger "spec.image" "")}}"#, false),
            ("{{items.name}}", false),
            // `this` at the top is the root: the same value.
            ("{{this.item.name}}", true),
            // Past the outermost block, `../` is the root (handlebars'
            // fallback): the same value.
            ("{{../item.name}}", true),
            ("{{../trigger.name}}", false),
            ("{{@root.item.name}}", false),
            ("{{#if item.name}}{{trigger}}{{/if}}", false),
            ("{{#each item.list}}x{{/each}}", false),
            ("{{lookup item trigger}}", false),
        ];
        for (t, want) in cases {
            tpl.compile(t).unwrap();
            assert_eq!(tpl.reads_only(t, "item"), want, "{t}");
        }
        tpl.compile_expr("pluck item.list \"name\"").unwrap();
        assert!(tpl.expr_reads_only("pluck item.list \"name\"", "item"));
        tpl.compile_expr("related.roles").unwrap();
        assert!(!tpl.expr_reads_only("related.roles", "item"));
        assert!(!tpl.reads_only("{{item.never.compiled}}", "item"));
    }

    /// Templates of text and plain paths skip handlebars, and render
    /// exactly as handlebars does; anything else is left to handlebars.
    #[test]
    fn simple_templates_render_as_handlebars_does() {
        let ctx = Context::from(json!({
            "trigger": {"metadata": {"name": "n1", "labels": {"a.b/c": "v"}}, "n": 3, "z": null},
            "item": {"plural": "things"}, "name": "top"
        }));
        let cases = [
            ("{{trigger.metadata.name}}", true),
            ("x-{{ trigger.metadata.name }}:{{item.plural}}-y", true),
            ("{{trigger.metadata.labels.[a.b/c]}}", true),
            ("a {{~ item.plural ~}} b", true),
            ("{{trigger.n}}", true),
            ("{{trigger.z}}", true),
            ("{{trigger.metadata.nope}}", true),
            ("{{name}}", false),
            ("{{this.name}}", false),
            ("{{lower item.plural}}", false),
            ("{{{item.plural}}}", false),
            ("{{#if name}}{{item.plural}}{{/if}}", false),
        ];
        let mut tpl = Templates::new();
        for (t, simple) in cases {
            tpl.compile(t).unwrap();
            assert_eq!(tpl.simple.contains_key(t), simple, "{t}");
            let direct = tpl
                .hb
                .render_with_context(t, &ctx)
                .map_err(|e| render_error_text(&e));
            assert_eq!(tpl.render(t, &ctx), direct, "{t}");
        }
        assert_eq!(
            tpl.render("a {{~ item.plural ~}} b", &ctx).unwrap(),
            "athingsb"
        );
        assert_eq!(
            tpl.render("{{trigger.metadata.labels.[a.b/c]}}", &ctx)
                .unwrap(),
            "v"
        );
    }

    #[test]
    fn strict_mode_rejects_missing_variables() {
        let err = render("x-{{trigger.spec.nope}}", json!({"trigger": {"spec": {}}})).unwrap_err();
        assert!(err.contains("missing variable"), "{err}");
        assert!(err.contains("trigger.spec.nope"), "{err}");
    }

    #[test]
    fn no_html_escaping() {
        assert_eq!(render("{{a}}", json!({"a": "<'&\">"})).unwrap(), "<'&\">");
    }

    #[test]
    fn expressions_yield_values() {
        let ctx =
            json!({"a": [{"g": "x", "p": 1}, {"g": "y", "p": 2}, {"g": "x", "p": 3}], "b": {}});
        assert_eq!(
            eval("groupBy a \"g\"", ctx.clone()).unwrap(),
            json!([{"key": "x", "items": [{"g": "x", "p": 1}, {"g": "x", "p": 3}]},
                   {"key": "y", "items": [{"g": "y", "p": 2}]}])
        );
        assert_eq!(eval("b.missing", ctx.clone()).unwrap(), Value::Null);
        // A field of a list is an authoring error, not a missing value.
        assert!(eval("a.missing", ctx.clone()).is_err());
        assert_eq!(eval("pluck a \"p\"", ctx).unwrap(), json!([1, 2, 3]));
    }

    #[test]
    fn helpers_reject_missing_arguments_except_lenient_ones() {
        let err = eval("lower a.b", json!({"a": {}})).unwrap_err();
        assert!(err.contains("missing variable"), "{err}");
        assert_eq!(
            eval("default a.b \"z\"", json!({"a": {}})).unwrap(),
            json!("z")
        );
        assert_eq!(eval("get a \"b.c\" 3", json!({"a": {}})).unwrap(), json!(3));
    }

    #[test]
    fn trim_and_split_read_lists_written_by_hand() {
        assert_eq!(
            render(
                "{{#each (split s \",\")}}[{{trim this}}]{{/each}}",
                json!({"s": "sre, auditors ,dev"})
            )
            .unwrap(),
            "[sre][auditors][dev]"
        );
    }

    #[test]
    fn image_parsing() {
        assert_eq!(
            split_image("registry.example.org/team/widget-operator:v1.2"),
            ("registry.example.org".into(), "team/widget-operator".into())
        );
        assert_eq!(
            split_image("nginx:1.2"),
            ("docker.io".into(), "nginx".into())
        );
        assert_eq!(
            split_image("localhost:5000/org/img@sha256:abc"),
            ("localhost:5000".into(), "org/img".into())
        );
        assert_eq!(
            eval(
                "imageOrg \"xpkg.upbound.io/upbound/provider-aws-ec2:v1\"",
                json!({})
            )
            .unwrap(),
            json!("xpkg.upbound.io/upbound")
        );
    }

    #[test]
    fn contains_loose_ignores_case_and_punctuation() {
        let ctx = json!({"c": ["SafeStart"]});
        assert_eq!(
            eval("containsLoose c \"safe-start\"", ctx).unwrap(),
            json!(true)
        );
        assert_eq!(
            eval("containsLoose c \"safe-stop\"", json!({"c": ["SafeStart"]})).unwrap(),
            json!(false)
        );
    }

    #[test]
    fn shorten_keeps_short_and_hashes_long() {
        assert_eq!(shorten("abc", 63), "abc");
        let long = "a".repeat(70) + ".example.org";
        let s = shorten(&long, 63);
        assert_eq!(s.len(), 63);
        assert!(s.ends_with(&short_hash(&long, 10)));
        assert_ne!(shorten(&(long.clone() + "x"), 63), s);
        // Never ends the prefix in punctuation.
        let dotted = format!("{}.{}", "b".repeat(51), "c".repeat(20));
        assert!(!shorten(&dotted, 63).contains(".-"));
    }

    #[test]
    fn bad_templates_are_reported() {
        let mut tpl = Templates::new();
        assert!(tpl.compile("{{#each x}}").is_err());
        assert!(tpl.compile_expr("{{x}}").is_err());
        let err = render("{{nosuch a}}", json!({"a": 1})).unwrap_err();
        assert!(err.contains("nosuch"), "{err}");
    }

    #[test]
    fn each_behaves_like_handlebars() {
        let ctx = json!({"l": ["a", "b"], "m": {"x": 1, "y": 2}, "e": []});
        assert_eq!(
            render("{{#each l}}{{@index}}{{this}}{{#if @first}}F{{/if}}{{#if @last}}L{{/if}};{{/each}}", ctx.clone()).unwrap(),
            "0aF;1bL;"
        );
        assert_eq!(
            render("{{#each m}}{{@key}}={{this}},{{/each}}", ctx.clone()).unwrap(),
            "x=1,y=2,"
        );
        assert_eq!(
            render("{{#each m as |v k|}}{{k}}{{v}}{{/each}}", ctx.clone()).unwrap(),
            "x1y2"
        );
        assert_eq!(
            render(
                "{{#each (split \"p,q\" \",\") as |s|}}[{{s}}]{{/each}}",
                ctx.clone()
            )
            .unwrap(),
            "[p][q]"
        );
        assert_eq!(
            render("{{#each e}}x{{else}}none{{/each}}", ctx.clone()).unwrap(),
            "none"
        );
        assert_eq!(render("{{#each l}}{{../m.x}}{{/each}}", ctx).unwrap(), "11");
    }

    #[test]
    fn nesting_is_limited_at_compile_time() {
        let mut tpl = Templates::with_limits(&Limits {
            template_depth: 3,
            ..Limits::default()
        });
        assert!(
            tpl.compile("{{#if a}}{{#if b}}{{#if c}}x{{/if}}{{/if}}{{/if}}")
                .is_ok()
        );
        let (kind, msg) = tpl
            .compile("{{#if a}}{{#if b}}{{#if c}}{{#if d}}x{{/if}}{{/if}}{{/if}}{{/if}}")
            .unwrap_err();
        assert_eq!(kind, ErrorKind::LimitExceeded);
        assert!(msg.contains("--max-template-depth"), "{msg}");
        // Subexpressions and else-if chains count too; siblings do not.
        assert!(tpl.compile_expr("list (list (list (list 1)))").is_err());
        assert!(
            tpl.compile("{{#if a}}1{{else if b}}2{{else if c}}3{{else if d}}4{{/if}}")
                .is_err()
        );
        assert!(
            tpl.compile("{{#if a}}1{{/if}}{{#if b}}2{{/if}}{{#if c}}3{{/if}}{{#if d}}4{{/if}}")
                .is_ok()
        );
        // Quoted parentheses and comments are not nesting.
        assert!(
            tpl.compile("{{concat \"((((\" a}}{{!-- {{#if}}{{#if}}{{#if}}{{#if}} --}}")
                .is_ok()
        );
        // Too deep for the parser's stack is refused before parsing.
        let deep = "{{#if a}}".repeat(100_000) + &"{{/if}}".repeat(100_000);
        assert_eq!(tpl.compile(&deep).unwrap_err().0, ErrorKind::LimitExceeded);
    }

    #[test]
    fn partials_and_decorators_are_refused() {
        let mut tpl = Templates::new();
        for t in [
            "{{> p}}",
            "{{#*inline \"p\"}}{{> p}}{{/inline}}{{> p}}",
            "{{#> layout}}x{{/layout}}",
            "{{*decorator}}",
        ] {
            let (kind, msg) = tpl.compile(t).unwrap_err();
            assert_eq!(kind, ErrorKind::Template, "{t}");
            assert!(msg.contains("not supported"), "{t}: {msg}");
        }
    }

    #[test]
    fn helpers_and_output_charge_the_budget() {
        let limits = Limits {
            list_length: 3,
            bytes_per_trigger: 1000,
            ..Limits::default()
        };
        let _g = limits::start(&limits);
        let err = eval("list 1 2 3 4", json!({})).unwrap_err();
        assert!(err.contains("--max-list-length"), "{err}");
        drop(_g);
        let _g = limits::start(&limits);
        let err = eval("replace s \"x\" s", json!({"s": "x".repeat(40)})).unwrap_err();
        assert!(err.contains("--max-bytes-per-trigger"), "{err}");
        drop(_g);
        let _g = limits::start(&limits);
        let err = eval("split s \",\"", json!({"s": ",,,"})).unwrap_err();
        assert!(err.contains("--max-list-length"), "{err}");
        drop(_g);
        let _g = limits::start(&limits);
        let err = render(
            "{{#each l}}{{#each @root.l}}{{@root.s}}{{/each}}{{/each}}",
            json!({"l": [1, 2, 3], "s": "x".repeat(200)}),
        )
        .unwrap_err();
        assert!(err.contains("--max-bytes-per-trigger"), "{err}");
    }

    /// Names read, joined by commas.
    fn names(v: Option<Vec<String>>) -> Option<String> {
        v.map(|v| v.join(","))
    }

    fn trigger(texts: &[&str]) -> Option<Vec<String>> {
        trigger_paths(texts).map(|ps| ps.iter().map(|p| p.join(".")).collect())
    }

    /// Block helpers: `each`/`with` bodies read below the value they run
    /// on, `if` bodies and every `else` read where the block is.
    #[test]
    fn reads_follow_the_context_blocks_open() {
        let sets = ["a", "b", "c"];
        let related = |t: &str| names(named_reads(&[t], "related", &sets));
        // Inside `with`, `related` is the set's own field, not the root's
        // (the text scan saw `related` read whole).
        assert_eq!(
            related("{{#with related.a}}{{related}}{{/with}}"),
            Some("a".to_string())
        );
        assert_eq!(
            related("{{#each related.a}}{{name}}{{else}}{{related.b.x}}{{/each}}"),
            Some("a,b".to_string())
        );
        assert_eq!(
            related("{{#if related.a}}{{related.c}}{{else if x}}{{related.b}}{{/if}}"),
            Some("a,b,c".to_string())
        );
        // `this` in a block is the block's value, not the whole context.
        assert!(!mentions_text(
            "{{#each related.a}}{{this}}{{/each}}",
            "vars"
        ));
        assert!(mentions_text("{{this}}", "vars"));
        assert!(mentions_text("{{#if x}}{{this}}{{/if}}", "vars"));
        // A block of another helper: what its body reads is not known.
        assert!(mentions_text("{{#lower x}}{{name}}{{/lower}}", "vars"));
        assert_eq!(
            trigger(&["{{#with trigger}}{{metadata.name}}{{/with}}"]),
            None
        );
        // Hash values are read.
        assert_eq!(related("{{f x=related.c y=1}}"), Some("c".to_string()));
        assert_eq!(trigger(&["{{f 1 all=trigger}}"]), None);
    }

    /// `../` climbs one `each`/`with` per step; past the outermost it is
    /// the root (handlebars' own fallback, shown rendering).
    #[test]
    fn parent_paths_resolve_as_handlebars_resolves_them() {
        let t = "{{#each related.a}}{{#each items}}{{../related.c}}/{{../../related.b}}{{/each}}{{/each}}";
        let ctx = json!({"related": {
            "a": [{"items": [1], "related": {"c": "inner"}}],
            "b": "outer-b",
            "c": "outer-c",
        }});
        assert_eq!(render(t, ctx).as_deref(), Ok("inner/outer-b"));
        assert_eq!(
            names(named_reads(&[t], "related", &["a", "b", "c"])),
            Some("a,b".to_string())
        );
        assert_eq!(
            render("{{../x}}", json!({"x": "root"})).as_deref(),
            Ok("root")
        );
        assert_eq!(
            trigger(&["{{../trigger.spec}}"]),
            Some(vec!["spec".to_string()])
        );
        assert_eq!(
            trigger(&["{{#each trigger.list}}{{../trigger}}{{/each}}"]),
            None
        );
        let reads = reads_of("{{#with x}}{{../trigger.spec.a}}{{/with}}", false);
        let paths: Vec<&str> = reads
            .iter()
            .flat_map(|r| r.paths.iter().map(|p| p.raw.as_str()))
            .collect();
        assert_eq!(paths, ["x", "../trigger.spec.a"]);
    }

    /// Bracketed segments, subexpressions and `get` with a literal path.
    #[test]
    fn reads_through_brackets_subexpressions_and_get() {
        let sets = ["my set", "a", "b"];
        let related = |t: &str| names(named_reads(&[t], "related", &sets));
        // The scan could not name a bracketed set.
        assert_eq!(
            related("{{related.[my set].x}}"),
            Some("my set".to_string())
        );
        assert_eq!(related("{{related.[other]}}"), None);
        assert_eq!(
            related("{{shorten (concat related.a.x (lower related.b.y)) 10}}"),
            Some("a,b".to_string())
        );
        // `get` with a literal path reads below its object.
        assert_eq!(
            related(r#"{{get related "a.items[0]"}}"#),
            Some("a".to_string())
        );
        assert_eq!(related(r#"{{get related (lower "a")}}"#), None);
        assert_eq!(
            trigger(&[r#"{{default (get trigger "spec.x[0].y") "-"}}"#]),
            Some(vec!["spec.x".to_string()])
        );
        let reads = reads_of(r#"get trigger "spec.containers[0].image""#, true);
        let read = reads.as_ref().and_then(|r| r.paths.first());
        assert_eq!(
            read.map(|p| (p.raw.as_str(), p.segments.len())),
            Some(("trigger.spec.containers[0].image", 5))
        );
    }

    /// A text of a rule counts as a template and as an expression; one
    /// that is neither, or is nested too deep to parse, reads everything.
    #[test]
    fn texts_read_either_way_and_unparsable_ones_read_everything() {
        // An expression reads the trigger whole; a template's text does not.
        assert_eq!(trigger(&["trigger"]), None);
        assert_eq!(trigger(&["{{x}} trigger"]), Some(Vec::new()));
        assert_eq!(trigger(&["{{x"]), None);
        let deep = format!("{}x{}", "(".repeat(5000), ")".repeat(5000));
        assert_eq!(trigger(&[deep.as_str()]), None);
        assert!(mentions_text(&deep, "anything"));
        // Locals are the block's; `@root` counts as everything.
        assert!(!mentions_text("{{#each x}}{{@index}}{{/each}}", "vars"));
        assert!(mentions_text("{{@root.x}}", "vars"));
        assert!(mentions(&json!({"k": ["{{vars.a}}"]}), "vars"));
        assert!(mentions(&json!({"{{vars.a}}": 1}), "vars"));
        assert!(!mentions(&json!({"k": ["{{varsx.a}}"]}), "vars"));
    }

    /// The memo of texts' reads answers as a parse does, and stays bounded.
    #[test]
    fn text_reads_are_remembered_within_a_bound() {
        let text = "{{related.a.x}}";
        let first = text_reads(text);
        assert!(Rc::ptr_eq(&first, &text_reads(text)));
        assert_eq!(Some(&*first), reads_of(text, false).as_ref());
        for i in 0..=TEXT_READS_MAX {
            text_reads(&format!("{{{{vars.v{i}}}}}"));
        }
        assert!(TEXT_READS.with(|m| m.borrow().len()) <= TEXT_READS_MAX);
        assert_eq!(*text_reads(text), *first);
    }

    /// What the walk says a template reads is all that its render depends
    /// on: rendered with only those parts of `trigger` (as the engine binds
    /// it) and without the `related` sets it does not name, every template
    /// renders exactly as with everything (or fails the same way).
    #[test]
    fn a_template_renders_the_same_from_what_it_reads() {
        let ctx = json!({
            "trigger": {
                "metadata": {"name": "n", "namespace": "ns", "labels": {"a.b/c": "v", "x": "y"}},
                "spec": {"image": "r/o/i:1", "list": [{"name": "p", "tags": ["t1"]}, {"name": "q", "tags": []}],
                         "map": {"k1": "v1", "k2": "v2"}, "flag": true, "empty": []},
            },
            "related": {"a": [{"name": "ra", "related": {"b": "own"}}], "b": {"x": "bx"}, "c": "cc"},
            "vars": {"v": "vv"},
        });
        let templates = [
            "{{trigger.metadata.name}}/{{trigger.metadata.labels.[a.b/c]}}",
            "{{#each trigger.spec.list}}{{name}}{{#each tags}}{{this}}{{../name}}{{/each}}{{/each}}",
            "{{#each trigger.spec.list}}{{@index}}{{../trigger.metadata.name}}{{/each}}",
            "{{#each trigger.spec.map}}{{@key}}={{this}};{{/each}}",
            "{{#with trigger.metadata}}{{name}}{{../trigger.spec.image}}{{/with}}",
            "{{#if trigger.spec.flag}}{{trigger.metadata.namespace}}{{else}}{{trigger.nope}}{{/if}}",
            "{{#each trigger.spec.empty}}x{{else}}{{trigger.metadata.labels.x}}{{/each}}",
            "{{#unless trigger.spec.flag}}a{{else if trigger.spec.image}}{{imageOrg trigger.spec.image}}{{/unless}}",
            r#"{{get trigger "spec.list[1].name"}}{{get trigger "metadata.labels" "-"}}"#,
            r#"{{shorten (concat (lower trigger.metadata.name) "-" (get trigger "spec.image")) 12}}"#,
            r#"{{lookup trigger.metadata.labels "x"}}{{json trigger.spec.map}}"#,
            "{{trigger.metadata/namespace}}{{[trigger].spec.[image]}}{{this.trigger.metadata.name}}",
            "{{#each related.a}}{{name}}{{related.b}}{{../related.c}}{{/each}}",
            "{{#with related.b}}{{x}}{{/with}}{{vars.v}}",
            "{{trigger.metadata.missing}}",
            "{{#each trigger.spec.list}}{{#with this}}{{name}}{{/with}}{{/each}}",
        ];
        let sets = ["a", "b", "c"];
        for t in templates {
            let whole = render(t, ctx.clone());
            let Some(paths) = trigger_paths(&[t]) else {
                panic!("{t}: the trigger is read by paths");
            };
            let mut seen = ctx.clone();
            seen["trigger"] = crate::engine::expand::project(
                &ctx["trigger"],
                &paths,
                crate::engine::compile::Sight::plain(false),
            );
            let named = named_reads(&[t], "related", &sets);
            if let (Some(named), Some(m)) = (&named, seen["related"].as_object_mut()) {
                m.retain(|k, _| named.contains(k));
            }
            assert_eq!(render(t, seen), whole, "{t}: {paths:?} {named:?}");
        }
    }
}
