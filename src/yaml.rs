//! YAML in and out: multi-document files, `kind: List`, directories, and
//! output in the key order `kubectl` users read (apiVersion, kind, metadata
//! first).

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::Value;

/// The deepest nesting of maps and lists the Kubernetes API server accepts
/// in an object (the object's own braces are level 1): its JSON decoder's
/// limit (Go's `encoding/json` scanner as vendored in sigs.k8s.io/json,
/// `maxNestingDepth`; `maxDepth` in k8s.io/apimachinery/pkg/util/json) and
/// its YAML decoder's (`max_indents`, `max_flow_level`), all 10,000.
/// Inputs as deep are read (a provider's CRD schema is deep); deeper ones
/// are refused, each alone.
pub const MAX_DEPTH: usize = 10_000;

/// The nesting the parser reads. Each object is then held to
/// [`MAX_DEPTH`] itself: a `List` adds two levels around its items
/// (`kubectl get -o yaml`), so an item as deep as the API server allows is
/// read, and one a few levels deeper is refused alone, not the list.
/// Deeper still, the document is refused whole. Not more: the parser takes
/// about 5 KiB of stack per level (optimised), which grows on the heap
/// ([`Node`]) and is freed after: about 50 MB at this depth.
const PARSE_DEPTH: usize = MAX_DEPTH + 16;

/// Whether an object nests deeper than [`MAX_DEPTH`] (the object's own
/// braces are level 1). Iterative, and stops at the first level too deep.
pub fn too_deep(v: &Value) -> bool {
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        match v {
            Value::Object(_) | Value::Array(_) if d > MAX_DEPTH => return true,
            Value::Object(m) => stack.extend(m.values().map(|c| (c, d + 1))),
            Value::Array(a) => stack.extend(a.iter().map(|c| (c, d + 1))),
            _ => {}
        }
    }
    false
}

/// Drops a value without recursion: one refused for its depth is deeper
/// than a small stack holds.
fn dismantle(v: Value) {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) => stack.extend(m.into_iter().map(|(_, x)| x)),
            Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
}

/// A YAML file that cannot be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    /// The file or directory cannot be read.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid YAML.
    #[error("{path}: invalid YAML: {message}")]
    Parse { path: String, message: String },
    /// A document (or an item of a list) nests deeper than the API server
    /// accepts.
    #[error("{path}: {item}nests deeper than {MAX_DEPTH} levels, the most the API server accepts")]
    TooDeep {
        /// `file#document`.
        path: String,
        /// `item N of the list ` when the object is a list's item.
        item: String,
    },
    /// Serialization failed.
    #[error("cannot write YAML: {0}")]
    Write(String),
}

/// One document of a file, with where it came from.
#[derive(Clone, Debug)]
pub struct Document {
    /// The file.
    pub path: PathBuf,
    /// 1-based position of the document in the file (items of a `List`
    /// share their list's position).
    pub index: usize,
    /// The content.
    pub value: Value,
}

impl Document {
    fn at(path: &Path, index: usize, value: Value) -> Self {
        Document {
            path: path.to_path_buf(),
            index,
            value,
        }
    }

    /// `file.yaml#2`, for messages.
    pub fn origin(&self) -> String {
        format!("{}#{}", self.path.display(), self.index)
    }
}

/// Parser settings for `text`. serde-saphyr's default budget refuses more
/// than 1,024 documents or 250,000 nodes, and a cluster's objects in one
/// file are more than that. Plain data cannot hold more documents, nodes,
/// events or scalar bytes than it has bytes, so those limits scale with the
/// input; the limits against alias and anchor expansion keep their
/// defaults. Nesting (64 by default, 255 in flow style) may go as deep as
/// the API server accepts ([`MAX_DEPTH`]): documents are parsed on the
/// large-stack evaluation thread ([`parse_all`]).
fn options_for(text: &str) -> serde_saphyr::Options {
    options_for_len(text.len())
}

/// [`options_for`] a text of `n` bytes.
fn options_for_len(n: usize) -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_documents = budget.max_documents.max(n / 4 + 1);
    budget.max_nodes = budget.max_nodes.max(n + 1);
    budget.max_events = budget.max_events.max(4 * n + 16);
    budget.max_total_scalar_bytes = budget.max_total_scalar_bytes.max(n + 1);
    budget.max_depth = PARSE_DEPTH;
    budget.flow_nesting_limit = PARSE_DEPTH;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// Whether a top-level field of an object may be dropped as the object is
/// parsed, asked with the object's `apiVersion`, `kind` and the field's
/// name once both are read (a field before them is kept): what no reader
/// of the kind sees is then never built. Lists (`kind: …List`) are never
/// cut.
pub type Prune = dyn Fn(&str, &str, &str) -> bool + Send + Sync;

/// A document as parsed: its content and the deepest nesting of maps and
/// lists in it (the document's own braces are level 1), fields dropped by
/// [`Prune`] included.
struct Parsed {
    value: Value,
    deepest: usize,
}

/// A document not handed on (one read again after a later one failed) is
/// dropped without recursion, as it may be deep.
impl Drop for Parsed {
    fn drop(&mut self) {
        dismantle(std::mem::take(&mut self.value));
    }
}

/// A document's 1-based position and what was read, or why it cannot be.
type Handed = (usize, Result<Parsed, YamlError>);

/// The message of a parse error: serde-saphyr names its depth limit a
/// recursion limit.
fn parse_message(e: &serde_saphyr::Error) -> String {
    let e = e.to_string();
    if e.contains("recursion limit") || e.contains("depth") {
        format!("nests deeper than {MAX_DEPTH} levels, the most the API server accepts: {e}")
    } else {
        e
    }
}

/// The documents of `text`, each with its 1-based position, or the error
/// of each document that cannot be read.
///
/// The whole stream is parsed at once, each document handed on as it is
/// complete: what is held is the text and what the caller keeps, never
/// every document parsed at once. A large text is parsed on a thread of
/// its own, a few documents ahead of `each`; a larger one in parts on
/// threads of their own ([`parse_parts`]), read as the whole stream is. One
/// bad document (too deep, invalid) stops the parse of the stream: the
/// stream is then cut at its document markers and each part parsed alone,
/// so the error names that document and the others are still read.
fn parse_all(
    path: &Path,
    text: &str,
    parts: &[&str],
    prune: Option<&Arc<Prune>>,
    mut each: impl FnMut(Handed),
) -> Result<(), YamlError> {
    let handed = Cell::new(0);
    let mut hand = |d: Parsed| {
        handed.set(handed.get() + 1);
        each((handed.get(), Ok(d)));
    };
    let read = match parse_parts(parts, prune, &mut hand) {
        Some(read) => read,
        // Parts read as the stream would not be: the stream, past the
        // documents the parts handed on.
        None => parse_ahead(text, prune, handed.get(), &mut hand),
    };
    let read_before = read.read;
    read.kept.into_iter().for_each(&mut hand);
    let Err(whole) = read.result else {
        return Ok(());
    };
    let parts = split_documents(text);
    if parts.len() < 2 {
        // One document: it is the one named.
        let at = if parts.is_empty() { "" } else { "#1" };
        return Err(YamlError::Parse {
            path: format!("{}{at}", path.display()),
            message: whole,
        });
    }
    // The documents read before the bad one were handed on: the parts are
    // counted from the start, and handed on past them.
    let mut at = 0;
    for part in parts {
        let read = parse_stream(part, prune, None, 0);
        let docs = read.kept.into_iter().map(Ok);
        for d in docs.chain(read.result.err().map(Err)) {
            at += 1;
            if at <= read_before {
                continue;
            }
            let d = d.map_err(|message| YamlError::Parse {
                path: format!("{}#{at}", path.display()),
                message,
            });
            each((at, d));
        }
    }
    Ok(())
}

/// The stream `text` parsed whole, its first `skip` documents dropped:
/// a large text on a thread of its own, each document handed to `hand` as
/// it is complete; a small one here, its documents kept.
fn parse_ahead(
    text: &str,
    prune: Option<&Arc<Prune>>,
    skip: usize,
    hand: &mut impl FnMut(Parsed),
) -> Stream {
    if text.len() <= PARSE_AHEAD_ABOVE {
        return parse_stream(text, prune, None, skip);
    }
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel(PARSE_AHEAD);
        let parser = std::thread::Builder::new()
            .name("yaml".into())
            .stack_size(PARSE_STACK)
            .spawn_scoped(s, move || {
                parser_thread_started();
                parse_stream(text, prune, Some(tx), skip)
            });
        match parser {
            Ok(parser) => {
                rx.iter().for_each(&mut *hand);
                // The parser's panic is this thread's, as if parsed here.
                parser
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p))
            }
            Err(_) => parse_stream(text, prune, None, skip),
        }
    })
}

/// The stream cut in parts ([`cut_for_threads`]), parsed on a few threads
/// at once, each taking every few parts in turn and at most one part
/// parsed ahead of the reader: each part's documents are handed to `hand`
/// in order once the part is read and shown to read as the stream would
/// there. The first part is the stream's start, read with the stream's
/// options and budget; a later one must have no error and no anchor or
/// alias (anchors belong to a document, alias limits count over the
/// stream), and the parts' budget counts summed so far must be within the
/// stream's budget (what the stream would have counted by then). `None`
/// at the first part that is not: the documents handed on are then the
/// stream's first ones, and the caller parses the stream past them.
fn parse_parts(
    parts: &[&str],
    prune: Option<&Arc<Prune>>,
    hand: &mut impl FnMut(Parsed),
) -> Option<Stream> {
    let [first, rest @ ..] = parts else {
        return None;
    };
    if rest.is_empty() {
        return Some(parse_ahead(first, prune, 0, hand));
    }
    let whole: usize = parts.iter().map(|p| p.len()).sum();
    let budget = options_for_len(whole).budget.unwrap_or_default();
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, PARTS_MAX)
        .min(parts.len());
    std::thread::scope(|s| {
        let mut from = Vec::with_capacity(workers);
        for w in 0..workers {
            // One part parsed ahead: what is held is a few parts' documents.
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let mine: Vec<&str> = parts.iter().copied().skip(w).step_by(workers).collect();
            std::thread::Builder::new()
                .name("yaml".into())
                .stack_size(PARSE_STACK)
                .spawn_scoped(s, move || {
                    parser_thread_started();
                    for part in mine {
                        // The reader is gone when a part did not fit.
                        if tx.send(parse_part(part, whole, prune)).is_err() {
                            return;
                        }
                    }
                })
                .ok()?;
            from.push(rx);
        }
        let mut read = Stream::new(prune, None, 0);
        let mut total: Option<serde_saphyr::budget::BudgetReport> = None;
        for i in 0..parts.len() {
            // A parser that panicked sent nothing: the scope resumes its
            // panic here once the reader returns.
            let part = from[i % workers].recv().ok()?;
            let report = part.report.as_ref()?;
            let fits = part.result.is_ok()
                && (i == 0 || report.aliases == 0 && report.anchors == 0)
                && match total.as_mut() {
                    None => {
                        total = Some(report.clone());
                        report.breached.is_none()
                    }
                    Some(_) => add_report(&mut total, Some(report)),
                }
                && total.as_ref().is_some_and(|t| within(t, &budget));
            if !fits {
                return None;
            }
            read.read += part.read;
            part.kept.into_iter().for_each(&mut *hand);
        }
        Some(read)
    })
}

/// A later part of a stream cut by [`cut_for_threads`], its documents
/// kept, its budget the whole stream's (`whole` bytes).
fn parse_part(part: &str, whole: usize, prune: Option<&Arc<Prune>>) -> Stream {
    let mut read = Stream::new(prune, None, 0);
    read.run(part, options_for_len(whole));
    read
}

/// Adds a part's budget report to the parts' `total`; `false` when a
/// report is missing.
fn add_report(
    total: &mut Option<serde_saphyr::budget::BudgetReport>,
    part: Option<&serde_saphyr::budget::BudgetReport>,
) -> bool {
    let (Some(t), Some(p)) = (total.as_mut(), part) else {
        return false;
    };
    t.events = t.events.saturating_add(p.events);
    t.documents = t.documents.saturating_add(p.documents);
    t.nodes = t.nodes.saturating_add(p.nodes);
    t.total_scalar_bytes = t.total_scalar_bytes.saturating_add(p.total_scalar_bytes);
    t.total_comment_bytes = t.total_comment_bytes.saturating_add(p.total_comment_bytes);
    t.merge_keys = t.merge_keys.saturating_add(p.merge_keys);
    t.max_depth = t.max_depth.max(p.max_depth);
    p.breached.is_none()
}

/// Whether the parts' summed counts are within the stream's budget: what
/// the stream counts as it goes, the parts counted from zero each. Anchors
/// and aliases are the first part's alone (later parts have none), so
/// their limits held for the stream as they did for the first part.
fn within(t: &serde_saphyr::budget::BudgetReport, b: &serde_saphyr::Budget) -> bool {
    t.breached.is_none()
        && t.events <= b.max_events
        && t.documents <= b.max_documents
        && t.nodes <= b.max_nodes
        && t.total_scalar_bytes <= b.max_total_scalar_bytes
        && t.total_comment_bytes <= b.max_total_comment_bytes
        && t.merge_keys <= b.max_merge_keys
}

/// The size of a part of a stream parsed in parts; a stream smaller than
/// two is parsed whole.
const PART_MIN: usize = 1 << 20;

/// Threads that parse a stream's parts at most.
const PARTS_MAX: usize = 4;

/// `text` cut in parts of about [`PART_MIN`] bytes when this machine has
/// more than one processor, each cut before a line that is exactly the
/// document marker `---`: YAML forbids such a line inside a document (in
/// any scalar, block or quoted, too), so the parser sees the same
/// documents in the parts as in the whole. Not cut: a text with a
/// directive (a line starting with `%`: `%TAG` and `%YAML` belong to the
/// document after them). A text not cut is one part.
fn cut_for_threads(text: &str) -> Vec<&str> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads < 2 {
        return vec![text];
    }
    cut_at_markers(text, text.len() / PART_MIN)
}

/// `text` cut in `n` parts of about equal size before lines that are
/// exactly `---` ([`cut_for_threads`]); fewer when there are not so many
/// such lines, one when the text has a directive.
fn cut_at_markers(text: &str, n: usize) -> Vec<&str> {
    if n < 2 || text.starts_with('%') || text.contains("\n%") {
        return vec![text];
    }
    let mut parts = Vec::with_capacity(n);
    let mut start = 0;
    for i in 1..n {
        let Some(at) = marker_after(text, (text.len() / n * i).max(start + 1)) else {
            break;
        };
        parts.push(&text[start..at]);
        start = at;
    }
    parts.push(&text[start..]);
    parts
}

/// Where the first line at or after byte `from` that is exactly `---`
/// starts (not the text's first line).
fn marker_after(text: &str, from: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut from = from.max(1);
    if from > text.len() {
        return None;
    }
    while !text.is_char_boundary(from - 1) {
        from += 1;
    }
    loop {
        let at = from - 1 + text.get(from - 1..)?.find("\n---")? + 1;
        let after = &bytes[at + 3..];
        if after.is_empty() || after.starts_with(b"\n") || after.starts_with(b"\r\n") {
            return Some(at);
        }
        from = at + 3;
    }
}

/// What each parsing thread runs first: set once by the binary
/// ([`on_parser_thread`]).
static PARSER_THREAD: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Has each thread that parses YAML run `start` first: the binary's
/// per-thread allocator settings (a batch command's thread cache, which
/// jemalloc turns on per thread).
pub fn on_parser_thread(start: fn()) {
    let _ = PARSER_THREAD.set(start);
}

/// Runs the binary's [`on_parser_thread`] hook on this new thread.
fn parser_thread_started() {
    if let Some(start) = PARSER_THREAD.get() {
        start();
    }
}

/// Texts longer than this are parsed on a thread of their own, ahead of
/// their reader.
const PARSE_AHEAD_ABOVE: usize = 256 << 10;

/// Documents parsed ahead of their reader, at most.
const PARSE_AHEAD: usize = 16;

/// The parsing thread's stack; deeper documents go on in heap segments
/// ([`Node`]).
const PARSE_STACK: usize = 16 << 20;

/// What [`parse_stream`] read.
struct Stream {
    /// Fields dropped as parsed.
    prune: Option<Arc<Prune>>,
    /// Where each document goes as it is complete; `None`: kept.
    to: Option<std::sync::mpsc::SyncSender<Parsed>>,
    /// The first documents, dropped as read (handed on before).
    skip: usize,
    /// Documents read (skipped ones too).
    read: usize,
    /// Documents read, when not sent.
    kept: Vec<Parsed>,
    /// The error that stopped the stream.
    result: Result<(), String>,
    /// What the parser counted against its budget.
    report: Option<serde_saphyr::budget::BudgetReport>,
    /// Whether this read checks duplicate keys itself ([`Seen`]), serde-saphyr
    /// passing them through.
    check: bool,
    /// Whether the stream is first read with that check ([`Stream::run`]);
    /// `false`: read with serde-saphyr's own check alone (tests compare).
    check_first: bool,
    /// Whether the stream was read again after the first read failed.
    read_again: bool,
}

thread_local! {
    /// The stream being parsed on this thread: serde-saphyr builds each
    /// document ([`Read`]) and hands it to a collection ([`Sink`]) with no
    /// way to pass them a context but this.
    static STREAM: RefCell<Option<Stream>> = const { RefCell::new(None) };
}

/// Parses the stream `text`, each document sent on `to` as it is complete
/// or, without `to`, kept; the first `skip` documents dropped.
fn parse_stream(
    text: &str,
    prune: Option<&Arc<Prune>>,
    to: Option<std::sync::mpsc::SyncSender<Parsed>>,
    skip: usize,
) -> Stream {
    let mut read = Stream::new(prune, to, skip);
    read.run(text, options_for(text));
    read
}

impl Stream {
    fn new(
        prune: Option<&Arc<Prune>>,
        to: Option<std::sync::mpsc::SyncSender<Parsed>>,
        skip: usize,
    ) -> Self {
        Stream {
            prune: prune.cloned(),
            to,
            skip,
            read: 0,
            kept: Vec::new(),
            result: Ok(()),
            report: None,
            check: false,
            check_first: true,
            read_again: false,
        }
    }

    /// Parses `text` with `options` into this stream (documents, error,
    /// budget report).
    ///
    /// First with serde-saphyr's duplicate keys and merge keys (`<<`)
    /// passed through to [`Node`] and [`Skip`], which refuse any key that
    /// might repeat one of its mapping or be a merge key ([`Seen`]): its
    /// duplicate-key fingerprints are a tenth of the parse. Whatever fails
    /// that read (such a key, or any other error) is read again past the
    /// documents already handed on, with serde-saphyr's own checks and merge
    /// keys: errors, duplicate keys and merges read exactly as they always
    /// did, the check only decides which read gives them.
    ///
    /// The first read's check is written here, not taken from a crate:
    /// serde-saphyr's policies either fingerprint every key (refuse, first
    /// or last wins) or check nothing (pass through), and a check outside
    /// the parser must sit in this reader's own visitors to see the keys of
    /// fields dropped as parsed. It only ever sends a stream to
    /// serde-saphyr's check, never accepts what that check refuses.
    fn run(&mut self, text: &str, options: serde_saphyr::Options) {
        let mut r = Ok(());
        if self.check_first {
            let mut first = options.clone();
            first.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::PassThrough;
            first.merge_keys = serde_saphyr::MergeKeyPolicy::AsOrdinary;
            r = self.run_once(text, first, true);
        }
        if !self.check_first || r.is_err() {
            self.read_again = self.check_first;
            self.skip = self.skip.max(self.read);
            self.read = 0;
            r = self.run_once(text, options, false);
        }
        // The receiver's end: it sees the stream end.
        self.to = None;
        if let Err(e) = r {
            self.result = Err(parse_message(&e));
        }
    }

    /// One read of `text` ([`Stream::run`]); `check`: keys checked by
    /// [`Seen`].
    fn run_once(
        &mut self,
        text: &str,
        mut options: serde_saphyr::Options,
        check: bool,
    ) -> Result<(), serde_saphyr::Error> {
        let report = Rc::new(RefCell::new(None));
        let to = Rc::clone(&report);
        options.budget_report_cb = Some(Rc::new(RefCell::new(
            move |r: serde_saphyr::budget::BudgetReport| {
                *to.borrow_mut() = Some(r);
            },
        )));
        self.check = check;
        let this = std::mem::replace(self, Stream::new(None, None, 0));
        // A stream parsed within another's (on the same thread) finds its
        // own, and the outer one's back after.
        let outer = STREAM.with(|s| s.replace(Some(this)));
        let r = serde_saphyr::from_str_multiple_with_options::<Read, Sink>(text, options);
        // Always there: only this function takes it.
        if let Some(done) = STREAM.with(|s| s.replace(outer)) {
            *self = done;
        }
        self.report = report.borrow_mut().take();
        r.map(|_| ())
    }
}

/// Where serde-saphyr puts each document: the [`STREAM`]'s receiver, or
/// its kept documents.
#[derive(Default)]
struct Sink;

impl Extend<Read> for Sink {
    fn extend<I: IntoIterator<Item = Read>>(&mut self, docs: I) {
        for mut doc in docs {
            let parsed = Parsed {
                value: std::mem::take(&mut doc.value),
                deepest: doc.deepest,
            };
            STREAM.with(|s| {
                let mut s = s.borrow_mut();
                let Some(s) = s.as_mut() else {
                    return;
                };
                s.read += 1;
                if s.read <= s.skip {
                    return;
                }
                match &s.to {
                    // The receiver is gone only when it panicked; what it
                    // would not take is dropped (without recursion).
                    Some(to) => {
                        let _ = to.send(parsed);
                    }
                    None => s.kept.push(parsed),
                }
            });
        }
    }
}

/// One document, read as a JSON value by [`Node`].
struct Read {
    value: Value,
    deepest: usize,
}

/// Documents read before a later one fails are dropped by the parser:
/// without recursion, as they may be deep.
impl Drop for Read {
    fn drop(&mut self) {
        dismantle(std::mem::take(&mut self.value));
    }
}

impl<'de> serde::Deserialize<'de> for Read {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (prune, check) = STREAM.with(|s| {
            s.borrow()
                .as_ref()
                .map_or((None, false), |s| (s.prune.clone(), s.check))
        });
        let deepest = Cell::new(0);
        let keys = RefCell::new(Vec::new());
        let node = Node {
            depth: 1,
            deepest: &deepest,
            prune: prune.as_deref(),
            check,
            keys: &keys,
        };
        let value = serde::de::DeserializeSeed::deserialize(node, d)?;
        Ok(Read {
            value,
            deepest: deepest.get(),
        })
    }
}

/// Stack left (bytes) below which reading goes on in a new heap segment
/// of [`SEGMENT`], checked every [`GROW_EVERY`] levels: a level of
/// serde-saphyr and this visitor takes about 5 KiB optimised, a few times
/// that unoptimised, so the red zone holds that many levels either way.
const RED_ZONE: usize = 1024 * 1024;
const SEGMENT: usize = 8 * 1024 * 1024;
const GROW_EVERY: usize = 16;

/// A value of a document at `depth` (the document's own braces are 1),
/// read as serde_json's own visitor reads one. Nesting is counted (the
/// deepest level into `deepest`, an error past [`PARSE_DEPTH`]), and every
/// [`GROW_EVERY`] levels the stack left is checked, reading going on on
/// the heap when it runs low (stacker, as rustc does): documents as deep
/// as [`PARSE_DEPTH`] read on any thread, a test's 2 MiB or the main
/// thread's 8 MiB. At level 1, fields `prune` drops are read by [`Skip`]
/// and never built.
#[derive(Clone, Copy)]
struct Node<'a> {
    depth: usize,
    deepest: &'a Cell<usize>,
    prune: Option<&'a Prune>,
    /// Keys checked by [`Seen`] ([`Stream::run`]).
    check: bool,
    /// The hashes of the keys of the mappings being read ([`Seen`]).
    keys: &'a RefCell<Vec<u64>>,
}

impl<'a> Node<'a> {
    /// A map or list at this level: counted, refused past [`PARSE_DEPTH`].
    fn enter<E: serde::de::Error>(self) -> Result<Node<'a>, E> {
        if self.depth > PARSE_DEPTH {
            return Err(E::custom(format!(
                "nesting depth exceeds {PARSE_DEPTH} levels"
            )));
        }
        if self.depth > self.deepest.get() {
            self.deepest.set(self.depth);
        }
        Ok(Node {
            depth: self.depth + 1,
            deepest: self.deepest,
            prune: None,
            check: self.check,
            keys: self.keys,
        })
    }

    /// `read` at this level, on a new stack segment when this one runs low.
    fn grow<R>(self, read: impl FnOnce() -> R) -> R {
        if self.depth.is_multiple_of(GROW_EVERY) {
            stacker::maybe_grow(RED_ZONE, SEGMENT, read)
        } else {
            read()
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Node<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.grow(|| d.deserialize_any(self))
    }
}

impl<'de> serde::de::Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Value, E> {
        serde_json::Number::from_i128(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("integer {v} out of range")))
    }

    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Value, E> {
        serde_json::Number::from_u128(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("integer {v} out of range")))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        serde::de::DeserializeSeed::deserialize(self, d)
    }

    fn visit_newtype_struct<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        serde::de::DeserializeSeed::deserialize(self, d)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.enter()?;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(inner)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inner = self.enter()?;
        let mut out = serde_json::Map::new();
        // The keys dropped, and the integers read, when checked.
        let mut dropped: Vec<String> = Vec::new();
        let mut ints = Vec::new();
        while let Some(k) = map.next_key::<String>()? {
            if self.check
                && (out.contains_key(&k)
                    || dropped.contains(&k)
                    || !Seen::admits_scalar(&mut ints, &k))
            {
                return Err(check_failed());
            }
            if self.drops(&out, &k) {
                map.next_value_seed(Skip(inner))?;
                if self.check {
                    dropped.push(k);
                }
                continue;
            }
            let v = map.next_value_seed(inner)?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

impl Node<'_> {
    /// Whether field `key` of the object read so far as `out` is dropped:
    /// once its `apiVersion` and `kind` are read, and it is no list.
    fn drops(&self, out: &serde_json::Map<String, Value>, key: &str) -> bool {
        let Some(prune) = self.prune else {
            return false;
        };
        match (out.get("apiVersion"), out.get("kind")) {
            (Some(Value::String(api_version)), Some(Value::String(kind))) => {
                !kind.ends_with("List") && prune(api_version, kind, key)
            }
            _ => false,
        }
    }
}

/// A value read and dropped as it is read (a field [`Prune`] drops):
/// nesting counted and the stack grown as [`Node`] does, nothing built.
#[derive(Clone, Copy)]
struct Skip<'a>(Node<'a>);

impl<'de> serde::de::DeserializeSeed<'de> for Skip<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.0.grow(|| d.deserialize_any(self))
    }
}

impl<'de> serde::de::Visitor<'de> for Skip<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_i128<E>(self, _: i128) -> Result<(), E> {
        Ok(())
    }

    fn visit_u128<E>(self, _: u128) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        serde::de::DeserializeSeed::deserialize(self, d)
    }

    fn visit_newtype_struct<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        serde::de::DeserializeSeed::deserialize(self, d)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = Skip(self.0.enter()?);
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let inner = Skip(self.0.enter()?);
        if !self.0.check {
            while map.next_key_seed(inner)?.is_some() {
                map.next_value_seed(inner)?;
            }
            return Ok(());
        }
        let mut seen = Seen::new(self.0.keys);
        while let Some(key) = map.next_key_seed(SkipKey)? {
            if !seen.admits(&key) {
                return Err(check_failed());
            }
            map.next_value_seed(inner)?;
        }
        Ok(())
    }
}

/// The error of a key [`Seen`] does not admit: the stream is then read
/// again with serde-saphyr's own checks ([`Stream::run`]), whose error (or
/// none) is the one given.
fn check_failed<E: serde::de::Error>() -> E {
    E::custom("a mapping key to check with serde-saphyr's own duplicate-key check")
}

/// A key of a mapping [`Skip`] reads, when keys are checked: its text, as
/// [`Node`] reads a key (a string). A key serde-saphyr does not hand as one
/// (null, a mapping, a list, `!!int 1`) fails the first read
/// ([`Stream::run`]), and is read again as before.
#[derive(Clone, Copy)]
struct SkipKey;

impl<'de> serde::de::DeserializeSeed<'de> for SkipKey {
    type Value = Cow<'de, str>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for SkipKey {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string key")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// The keys of one mapping read so far, when a read checks keys itself
/// ([`Stream::run`]): it admits a key only when serde-saphyr's
/// duplicate-key check could not find that key equal to an earlier one
/// and it is no merge key. serde-saphyr compares a key by its text and
/// tag, and a plain integer by its value (`0xB` is `11`); so a key is not
/// admitted when its text is an earlier key's text, when it reads as an
/// integer an earlier key reads as ([`int_key`]), or when it is `<<`.
/// What is not admitted may still be no
/// duplicate (`1` and `"1"`, `a` and `!t a`): it is then read again with
/// serde-saphyr's own check, which tells.
///
/// A key is recorded by its hash, on a stack the document's mappings
/// share (nothing allocated per mapping); two keys of one hash are taken
/// as equal, which only sends a rare pair to serde-saphyr's check. A
/// mapping of many keys has a set of its own.
struct Seen<'s> {
    /// The hashes of the keys of this mapping, from `start` (those of
    /// the mappings it is in below).
    stack: &'s RefCell<Vec<u64>>,
    start: usize,
    /// The hashes of this mapping's keys, once many.
    set: Option<std::collections::HashSet<u64, foldhash::fast::FixedState>>,
    /// The integers the keys may read as.
    ints: Vec<(bool, u128)>,
}

/// Keys of a mapping [`Seen`] compares one by one; more go in a set.
const SEEN_LINEAR: usize = 32;

/// The hash of a key ([`Seen`]).
fn key_hash(key: &str) -> u64 {
    std::hash::BuildHasher::hash_one(&foldhash::fast::FixedState::with_seed(0x42), key)
}

impl<'s> Seen<'s> {
    /// A mapping's keys, recorded above those of the mappings it is in.
    fn new(stack: &'s RefCell<Vec<u64>>) -> Self {
        let start = stack.borrow().len();
        Seen {
            stack,
            start,
            set: None,
            ints: Vec::new(),
        }
    }

    /// Whether `key` is admitted; it is recorded.
    fn admits(&mut self, key: &str) -> bool {
        if !Self::admits_scalar(&mut self.ints, key) {
            return false;
        }
        let hash = key_hash(key);
        if let Some(set) = self.set.as_mut() {
            return set.insert(hash);
        }
        let mut stack = self.stack.borrow_mut();
        if stack
            .get(self.start..)
            .is_some_and(|keys| keys.contains(&hash))
        {
            return false;
        }
        stack.push(hash);
        if stack.len() - self.start > SEEN_LINEAR {
            self.set = Some(stack.drain(self.start..).collect());
        }
        true
    }

    /// Whether a key's text is no merge key and reads as no integer an
    /// earlier key of its mapping reads as (recorded in `ints`).
    fn admits_scalar(ints: &mut Vec<(bool, u128)>, key: &str) -> bool {
        if key == "<<" {
            return false;
        }
        let Some(n) = int_key(key) else {
            return true;
        };
        if ints.contains(&n) {
            return false;
        }
        ints.push(n);
        true
    }
}

/// The mapping is read: its keys leave the stack.
impl Drop for Seen<'_> {
    fn drop(&mut self) {
        self.stack.borrow_mut().truncate(self.start);
    }
}

/// The integer (sign, magnitude) a key's text may read as. serde-saphyr
/// compares plain keys that read as integers by value (its default
/// options: no legacy octal), and this is its syntax widened: ASCII
/// padding trimmed, one sign, `0x`/`0o`/`0b` or decimal digits (leading
/// zeros too), underscores anywhere. Every key it reads as an integer
/// gives its value here (zero unsigned); more keys give one than it reads
/// as integers, which only sends them to its own check.
fn int_key(key: &str) -> Option<(bool, u128)> {
    let t = key.trim_matches([' ', '\t', '\r', '\n']);
    let (negative, rest) = match t.as_bytes().first()? {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    if !rest.as_bytes().first()?.is_ascii_digit() {
        return None;
    }
    let (radix, digits) = match rest.get(..2) {
        Some("0x" | "0X") => (16, &rest[2..]),
        Some("0o" | "0O") => (8, &rest[2..]),
        Some("0b" | "0B") => (2, &rest[2..]),
        _ => (10, rest),
    };
    let mut n: u128 = 0;
    let mut digit = false;
    for c in digits.chars() {
        if c == '_' {
            continue;
        }
        n = n
            .checked_mul(u128::from(radix))?
            .checked_add(u128::from(c.to_digit(radix)?))?;
        digit = true;
    }
    digit.then_some((negative && n != 0, n))
}

/// `text` cut before each line that starts a document (`---` alone or
/// followed by a space); a part without content is dropped. YAML forbids
/// such a line inside a document, so the cut never splits one.
fn split_documents(text: &str) -> Vec<&str> {
    let mut starts = vec![0];
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches(['\n', '\r']);
        if at > 0 && (body == "---" || body.starts_with("--- ") || body.starts_with("---\t")) {
            starts.push(at);
        }
        at += line.len();
    }
    starts.push(text.len());
    starts
        .windows(2)
        .map(|w| &text[w[0]..w[1]])
        .filter(|part| {
            part.lines().any(|l| {
                let l = l.trim();
                !l.is_empty() && !l.starts_with('#') && l != "---" && l != "..."
            })
        })
        .collect()
}

/// Parses a multi-document YAML text; empty documents are skipped and
/// `kind: List` documents are replaced by their items.
pub fn parse_documents(path: &Path, text: &str) -> Result<Vec<Document>, YamlError> {
    let mut out = Vec::new();
    for_each_document(path, text, |index, value| {
        out.push(Document::at(path, index, value));
    })?;
    Ok(out)
}

/// Whether a document is a list of objects (`kind: List`, `kind: FooList`
/// with `items`).
fn is_list(doc: &Value) -> bool {
    let kind = doc.get("kind").and_then(Value::as_str);
    kind == Some("List") || kind.is_some_and(|k| k.ends_with("List")) && doc.get("items").is_some()
}

/// Hands each document of `text` to `each` (with its 1-based position),
/// items of lists one by one, moving them: nothing is copied, and the
/// caller keeps only what it builds from them. Empty documents are skipped.
/// A document that cannot be read (invalid, or nested deeper than
/// [`MAX_DEPTH`]) is refused alone: the others are handed over, then the
/// first such error, naming the file and the document, is returned.
///
/// The whole text is parsed from memory: serde-saphyr's streaming reader
/// parses about a third slower than its string parser, and the text is
/// small beside the objects parsed from it.
pub fn for_each_document(
    path: &Path,
    text: &str,
    each: impl FnMut(usize, Value),
) -> Result<(), YamlError> {
    for_each_document_pruned(path, text, None, each)
}

/// [`for_each_document`], the top-level fields `prune` drops never built.
fn for_each_document_pruned(
    path: &Path,
    text: &str,
    prune: Option<&Arc<Prune>>,
    mut each: impl FnMut(usize, Value),
) -> Result<(), YamlError> {
    let mut refused = None;
    parse_all(path, text, &cut_for_threads(text), prune, |(index, doc)| {
        let (doc, deepest) = match doc {
            Ok(mut doc) => (std::mem::take(&mut doc.value), doc.deepest),
            // The first bad document is the error; the others are read.
            Err(e) => {
                refused.get_or_insert(e);
                return;
            }
        };
        if doc.is_null() {
            return;
        }
        let deep = |item: String| YamlError::TooDeep {
            path: format!("{}#{index}", path.display()),
            item,
        };
        if !is_list(&doc) {
            // The parser counted the document's levels.
            if deepest > MAX_DEPTH {
                refused.get_or_insert(deep(String::new()));
                dismantle(doc);
            } else {
                each(index, doc);
            }
            return;
        }
        if let Value::Object(mut m) = doc
            && let Some(Value::Array(items)) = m.remove("items")
        {
            for (i, item) in items.into_iter().enumerate() {
                // An item is two levels below the list's braces.
                if deepest > MAX_DEPTH + 2 && too_deep(&item) {
                    refused.get_or_insert(deep(format!("item {} of the list ", i + 1)));
                    dismantle(item);
                } else {
                    each(index, item);
                }
            }
        }
    })?;
    refused.map_or(Ok(()), Err)
}

/// Files named by `paths`, as `kubectl apply -f` reads them: files as
/// given; a directory's `.yaml`, `.yml` and `.json` files in name order, and
/// its sub-directories only when `recursive` (kubectl's `-R`). A rule set's
/// `tests/` sub-directory is thus never read as rules or objects.
pub fn expand_paths(paths: &[PathBuf], recursive: bool) -> Result<Vec<PathBuf>, YamlError> {
    let mut out = Vec::new();
    for p in paths {
        // `-`: standard input, read where the documents are read.
        if p.as_os_str() == "-" {
            out.push(p.clone());
            continue;
        }
        let meta = std::fs::metadata(p).map_err(|e| YamlError::Io {
            path: p.display().to_string(),
            source: e,
        })?;
        if meta.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| YamlError::Io {
                    path: p.display().to_string(),
                    source: e,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            entries.sort();
            let (dirs, files): (Vec<PathBuf>, Vec<PathBuf>) =
                entries.into_iter().partition(|e| e.is_dir());
            for f in files {
                if matches!(
                    f.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml" | "json")
                ) {
                    out.push(f);
                }
            }
            if recursive {
                out.extend(expand_paths(&dirs, true)?);
            }
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// Reads every document under `paths`; directories are not recursed into.
pub fn load_paths(paths: &[PathBuf]) -> Result<Vec<Document>, YamlError> {
    load_tree(paths, false)
}

/// Reads every document under `paths`, recursing into sub-directories when
/// `recursive`.
pub fn load_tree(paths: &[PathBuf], recursive: bool) -> Result<Vec<Document>, YamlError> {
    let mut out = Vec::new();
    for_each_in_tree(paths, recursive, |path, index, value| {
        out.push(Document::at(path, index, value));
    })?;
    Ok(out)
}

/// Like [`load_tree`], handing each document to `each` (file, 1-based
/// position, content) as it is parsed instead of collecting them.
pub fn for_each_in_tree(
    paths: &[PathBuf],
    recursive: bool,
    each: impl FnMut(&Path, usize, Value),
) -> Result<(), YamlError> {
    for_each_in_tree_pruned(paths, recursive, None, each)
}

/// [`for_each_in_tree`], the top-level fields of objects that `prune`
/// drops never built (what no reader sees: a CRD's schema when only its
/// metadata is read).
pub fn for_each_in_tree_pruned(
    paths: &[PathBuf],
    recursive: bool,
    prune: Option<Arc<Prune>>,
    mut each: impl FnMut(&Path, usize, Value),
) -> Result<(), YamlError> {
    for f in expand_paths(paths, recursive)? {
        let text = read_text(&f)?;
        for_each_document_pruned(&f, &text, prune.as_ref(), |index, value| {
            each(&f, index, value)
        })?;
    }
    Ok(())
}

/// The text of a file, or of standard input for `-` (as kubectl's `-f -`).
pub fn read_text(path: &Path) -> Result<String, YamlError> {
    let io = |e| YamlError::Io {
        path: path.display().to_string(),
        source: e,
    };
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(io)?;
        return Ok(text);
    }
    std::fs::read_to_string(path).map_err(io)
}

/// Key order: these first, in this order, then the rest alphabetically.
const TOP_ORDER: &[&str] = &["apiVersion", "kind", "metadata", "spec"];
const META_ORDER: &[&str] = &[
    "name",
    "namespace",
    "labels",
    "annotations",
    "ownerReferences",
];

/// Serializes a JSON value with Kubernetes-style key order at the top and
/// in `metadata`; nested maps keep sorted order.
struct Ordered<'a> {
    value: &'a Value,
    order: &'static [&'static str],
}

impl Serialize for Ordered<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Value::Object(m) = self.value else {
            return self.value.serialize(s);
        };
        let mut keys: Vec<&String> = m.keys().collect();
        let rank = |k: &str| {
            self.order
                .iter()
                .position(|o| *o == k)
                .unwrap_or(self.order.len())
        };
        keys.sort_by(|a, b| (rank(a), a.as_str()).cmp(&(rank(b), b.as_str())));
        let mut map = s.serialize_map(Some(keys.len()))?;
        for k in keys {
            let v = &m[k.as_str()];
            if self.order == TOP_ORDER && k == "metadata" {
                map.serialize_entry(
                    k,
                    &Ordered {
                        value: v,
                        order: META_ORDER,
                    },
                )?;
            } else {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}

/// One value as YAML.
pub fn to_yaml<T: Serialize>(value: &T) -> Result<String, YamlError> {
    let v = serde_json::to_value(value).map_err(|e| YamlError::Write(e.to_string()))?;
    let mut out = String::new();
    push_yaml(&mut out, &v)?;
    Ok(out)
}

/// Appends a JSON value as YAML, serialized in place (no copy).
fn push_yaml(out: &mut String, v: &Value) -> Result<(), YamlError> {
    serde_saphyr::to_fmt_writer(
        out,
        &Ordered {
            value: v,
            order: TOP_ORDER,
        },
    )
    .map_err(|e| YamlError::Write(e.to_string()))
}

/// Objects as a multi-document YAML stream.
pub fn to_yaml_stream(values: &[Value]) -> Result<String, YamlError> {
    let refs: Vec<&Value> = values.iter().collect();
    let mut out = Vec::new();
    write_stream(&refs, &mut out)?;
    String::from_utf8(out).map_err(|e| YamlError::Write(e.to_string()))
}

/// Objects per batch of [`write_stream`].
const BATCH: usize = 256;

/// Writes objects as a multi-document YAML stream (each preceded by
/// `---`), batch by batch, so a large stream is never built in memory.
/// Printing thousands of objects is mostly serializing them: a second
/// thread serializes every other batch while this one writes; the order
/// is the given one.
pub fn write_stream<D: Doc>(values: &[D], out: &mut impl std::io::Write) -> Result<(), YamlError> {
    let write = |out: &mut dyn std::io::Write, text: &str| {
        out.write_all(text.as_bytes())
            .map_err(|e| YamlError::Write(e.to_string()))
    };
    if values.len() <= BATCH {
        return write(out, &batch(values)?);
    }
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        s.spawn(move || {
            for chunk in values.chunks(BATCH).skip(1).step_by(2) {
                // The receiver is gone only when writing failed.
                if tx.send(batch(chunk)).is_err() {
                    return;
                }
            }
        });
        for (i, chunk) in values.chunks(BATCH).enumerate() {
            let text = if i % 2 == 0 {
                batch(chunk)?
            } else {
                rx.recv()
                    .map_err(|_| YamlError::Write("the serializing thread stopped".into()))??
            };
            write(out, &text)?;
        }
        Ok(())
    })
}

/// A batch of objects as YAML documents.
fn batch<D: Doc>(values: &[D]) -> Result<String, YamlError> {
    let mut text = String::new();
    for v in values {
        text.push_str("---\n");
        v.push_yaml(&mut text)?;
    }
    Ok(text)
}

/// One document of a stream.
pub trait Doc: Sync {
    /// Appends the document as YAML, keys in Kubernetes' order.
    fn push_yaml(&self, out: &mut String) -> Result<(), YamlError>;
}

impl Doc for &Value {
    fn push_yaml(&self, out: &mut String) -> Result<(), YamlError> {
        push_yaml(out, self)
    }
}

/// Printed from its parts, in the order [`TOP_ORDER`] and [`META_ORDER`]
/// give a JSON object (no JSON copy).
impl Doc for crate::engine::Manifest {
    fn push_yaml(&self, out: &mut String) -> Result<(), YamlError> {
        self.push_yaml(out).map_err(YamlError::Write)
    }
}

impl<A: Doc, B: Doc> Doc for Result<A, B> {
    fn push_yaml(&self, out: &mut String) -> Result<(), YamlError> {
        match self {
            Ok(a) => a.push_yaml(out),
            Err(b) => b.push_yaml(out),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stream_of_thousands_of_documents_parses() {
        let docs = 5_000;
        let text: String = (0..docs)
            .map(|i| format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: ns-{i}, labels: {{a: b}}}}\n---\n"))
            .collect();
        let parsed = parse_documents(Path::new("big.yaml"), &text).expect("parses");
        assert_eq!(parsed.len(), docs);
    }

    use super::*;
    use serde_json::json;

    /// A flow-style object nesting `levels` levels in all.
    fn object(name: &str, levels: usize) -> String {
        let inner = levels - 1;
        format!(
            "{{\"kind\": \"ConfigMap\", \"metadata\": {{\"name\": \"{name}\"}}, \"data\": {}{{}}{}}}",
            "{\"a\": ".repeat(inner - 1),
            "}".repeat(inner - 1)
        )
    }

    /// What `for_each_document` hands over: (position, name, depth), each
    /// value dropped without recursion (this thread's stack is small).
    fn read(text: &str) -> (Vec<(usize, String, bool)>, Option<String>) {
        let mut got = Vec::new();
        let r = for_each_document(Path::new("deep.yaml"), text, |i, v| {
            let name = v["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            got.push((i, name, too_deep(&v)));
            dismantle(v);
        });
        (got, r.err().map(|e| e.to_string()))
    }

    #[test]
    fn documents_as_deep_as_the_api_server_accepts_are_read_and_deeper_ones_refused_alone() {
        let text = format!(
            "{}\n---\n{}\n---\n{}\n---\n{}\n",
            object("at-limit", MAX_DEPTH),
            object("one-more", MAX_DEPTH + 1),
            object("far-more", MAX_DEPTH + 50),
            object("flat", 3)
        );
        let (got, err) = read(&text);
        assert_eq!(
            got,
            [(1, "at-limit".into(), false), (4, "flat".into(), false)]
        );
        let err = err.expect("an error");
        assert!(
            err.starts_with("deep.yaml#2: nests deeper than 10000 levels"),
            "{err}"
        );
    }

    #[test]
    fn a_list_item_as_deep_as_the_api_server_accepts_is_read_and_a_deeper_one_refused_alone() {
        let text = format!(
            "{{\"kind\": \"List\", \"items\": [{}, {}, {}]}}\n",
            object("at-limit", MAX_DEPTH),
            object("one-more", MAX_DEPTH + 1),
            object("flat", 3)
        );
        let (got, err) = read(&text);
        assert_eq!(
            got,
            [(1, "at-limit".into(), false), (1, "flat".into(), false)]
        );
        let err = err.expect("an error");
        assert!(
            err.starts_with("deep.yaml#1: item 2 of the list nests deeper than 10000"),
            "{err}"
        );
    }

    #[test]
    fn depth_counts_the_objects_own_braces() {
        let mut v = json!({});
        for _ in 1..MAX_DEPTH {
            v = Value::Object(serde_json::Map::from_iter([("a".to_string(), v)]));
        }
        assert!(!too_deep(&v));
        let v = Value::Array(vec![v]);
        assert!(too_deep(&v));
        dismantle(v);
        assert!(!too_deep(&json!("scalar")) && !too_deep(&json!([[]])));
    }

    /// Fields `prune` drops are never built once `apiVersion` and `kind`
    /// are read; fields before them, lists and what `prune` keeps are
    /// whole; a dropped field still counts to the document's depth.
    #[test]
    fn pruned_fields_are_dropped_as_parsed() {
        let prune: Arc<Prune> = Arc::new(|_: &str, kind: &str, key: &str| {
            kind == "CustomResourceDefinition" && key == "spec"
        });
        let deep_spec = object("x", MAX_DEPTH + 1).replace("\"data\"", "\"spec\"");
        let text = format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: a}}\nspec: {{x: 1}}\n---\n\
             spec: {{x: 2}}\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: b}}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\nspec: {{x: 3}}\n---\n\
             apiVersion: v1\nkind: CustomResourceDefinitionList\nitems: [{{apiVersion: apiextensions.k8s.io/v1, kind: CustomResourceDefinition, metadata: {{name: d}}, spec: {{x: 4}}}}]\n---\n\
             {}\n",
            deep_spec.replace("\"kind\": \"ConfigMap\"", "\"apiVersion\": \"apiextensions.k8s.io/v1\", \"kind\": \"CustomResourceDefinition\"")
        );
        for text in [
            text.clone(),
            format!("{text}{}", "# padding\n".repeat(PARSE_AHEAD_ABOVE / 10)),
        ] {
            let mut got = Vec::new();
            let r = for_each_document_pruned(Path::new("p.yaml"), &text, Some(&prune), |i, v| {
                got.push((
                    i,
                    v["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    v.get("spec").cloned(),
                ));
            });
            assert_eq!(
                got,
                [
                    (1, "a".to_string(), None),
                    (2, "b".to_string(), Some(json!({"x": 2}))),
                    (3, "c".to_string(), Some(json!({"x": 3}))),
                    (4, "d".to_string(), Some(json!({"x": 4}))),
                ]
            );
            let err = r.expect_err("the deep one is refused").to_string();
            assert!(
                err.starts_with("p.yaml#5: nests deeper than 10000"),
                "{err}"
            );
        }
    }

    /// What the documents of `text` read as, cut in `n` parts: (position,
    /// content or error) each.
    fn read_in_parts(text: &str, n: usize) -> Vec<(usize, Result<Value, String>)> {
        let parts = cut_at_markers(text, n);
        assert_eq!(parts.concat(), text);
        let mut got = Vec::new();
        let r = parse_all(Path::new("p.yaml"), text, &parts, None, |(i, d)| {
            got.push((
                i,
                d.map(|mut d| std::mem::take(&mut d.value))
                    .map_err(|e| e.to_string()),
            ))
        });
        if let Err(e) = r {
            got.push((0, Err(e.to_string())));
        }
        got
    }

    /// Reading a stream in parts gives what reading it whole gives: the
    /// same documents, positions and errors, whatever the parts hold
    /// (block scalars, markers with content, comments, empty documents,
    /// anchors and aliases, merge keys, bad and too deep documents).
    #[test]
    fn a_stream_read_in_parts_reads_as_read_whole() {
        let docs = [
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata:\n  s: |\n    ---\n    text\n  t: >-\n    ---\n",
            "--- # a comment\nkind: A\n",
            "--- {kind: B, x: [1, 2]}\n",
            "---\n",
            "---\n# only a comment\n",
            "--- |\nroot block scalar\n",
            "---\nkind: C\nv: &x {a: 1}\nw: *x\n",
            "---\nkind: D\nm:\n  <<: {a: 1}\n  b: 2\n",
            "---\nkind: E\nbad: [\n",
            "---\nkind: F\ntext: \"\u{e9}t\u{e9}\"\n",
            "---\n",
            "---\nkind: G\ndup: 1\ndup: 2\n",
            "---\n...\n",
            "---\nkind: H\n",
        ];
        let nested = format!("---\n{}\n", object("nested", 300));
        let texts: Vec<String> = vec![
            docs.concat(),
            docs.iter()
                .filter(|d| !d.contains("bad"))
                .copied()
                .collect(),
            docs.iter()
                .filter(|d| !d.contains('&') && !d.contains("bad"))
                .copied()
                .collect(),
            docs.iter()
                .filter(|d| !d.contains("bad") && !d.contains("dup"))
                .copied()
                .collect::<String>()
                + &nested,
        ];
        for text in &texts {
            let whole = read_in_parts(text, 1);
            assert!(whole.len() > 5, "{whole:?}");
            for n in 2..=docs.len() + 1 {
                assert_eq!(read_in_parts(text, n), whole, "{n} parts of {text}");
            }
        }
    }

    /// A stream large enough to be parsed in parts: every document handed
    /// on in order, a too deep one in a later part refused alone.
    #[test]
    fn a_large_stream_is_read_in_parts_in_order_and_a_deep_document_refused_alone() {
        let docs = 3 * PART_MIN / 64;
        let mut text: String = (0..docs)
            .map(|i| format!("---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: n{i:08}}}\n"))
            .collect();
        assert!(text.len() >= 2 * PART_MIN && cut_at_markers(&text, 2).len() == 2);
        text.push_str(&format!("---\n{}\n", object("deep", MAX_DEPTH + 1)));
        text.push_str("---\napiVersion: v1\nkind: Namespace\nmetadata: {name: last}\n");
        let (got, err) = read(&text);
        assert_eq!(got.len(), docs + 1);
        assert!(
            got[..docs]
                .iter()
                .enumerate()
                .all(|(i, (at, name, deep))| *at == i + 1 && *name == format!("n{i:08}") && !deep)
        );
        assert_eq!(got[docs], (docs + 2, "last".to_string(), false));
        let err = err.expect("an error");
        let want = format!("deep.yaml#{}: nests deeper than 10000", docs + 1);
        assert!(err.starts_with(&want), "{err}");
    }

    /// What `text` reads as, each document's value (or the error that
    /// stopped it), read as always (`check_first`, keys checked by [`Seen`]
    /// first) or with serde-saphyr's duplicate-key check alone; and whether
    /// it was read again.
    fn read_checked(
        text: &str,
        prune: Option<&Arc<Prune>>,
        check_first: bool,
    ) -> (Vec<Value>, Result<(), String>, bool) {
        let mut s = Stream::new(prune, None, 0);
        s.check_first = check_first;
        s.run(text, options_for(text));
        let docs = s
            .kept
            .iter_mut()
            .map(|d| std::mem::take(&mut d.value))
            .collect();
        (docs, s.result.clone(), s.read_again)
    }

    /// Mappings whose keys are or are not duplicates to serde-saphyr
    /// (`duplicate`: refused), each read at the top, nested, in a field a
    /// prune drops, and in a list.
    const KEYS: &[(&str, bool)] = &[
        ("a: 1\nb: 2\n", false),
        ("a: 1\na: 2\n", true),
        ("m: {x: 1, x: 2}\n", true),
        ("m: {x: 1, y: {x: 2}}\n", false),
        ("a: {b: 1, c: {d: 1}}\nb: 2\nd: 3\nc: 4\n", false),
        ("- {a: 1}\n- a: 1\n  a: 2\n", true),
        ("'a': 1\n\"a\": 2\n", true),
        ("\"a\\x41\": 1\naA: 2\n", true),
        ("1: a\n\"1\": b\n", false),
        ("0xB: a\n11: b\n", true),
        ("0xb: a\n0XB: b\n", true),
        ("+1: a\n1: b\n", true),
        ("-0: a\n0: b\n", true),
        ("-1: a\n1: b\n", false),
        ("1_0: a\n10: b\n", true),
        ("0o7: a\n7: b\n", true),
        ("0b11: a\n3: b\n", true),
        ("010: a\n10: b\n", false),
        ("\"0xB\": a\n11: b\n", false),
        ("340282366920938463463374607431768211456: a\n0: b\n", false),
        ("0x10000000000000000: a\n18446744073709551616: b\n", true),
        ("1.0: a\n1.00: b\n", false),
        ("1.0: a\n1.0: b\n", true),
        ("true: a\n\"true\": b\n", true),
        ("True: a\ntrue: b\n", false),
        ("~: a\nnull: b\n", false),
        ("~: a\n~: b\n", true),
        ("a: 1\n!t a: 2\n", false),
        ("!t a: 1\n!t a: 2\n", true),
        ("!!str a: 1\na: 2\n", true),
        ("1: a\n!!int 1: b\n", true),
        ("!!int 1: a\n1: b\n", true),
        ("!!binary aGk=: 1\nhi: 2\n", false),
        ("? [a, b]\n: 1\n? [a, b]\n: 2\n", true),
        ("? {a: 1, b: 2}\n: 1\n? {b: 2, a: 1}\n: 2\n", true),
        ("? [a]\n: 1\nz: 2\n", false),
        ("? [a]\n: 1\n", false),
        ("x: &k key\n*k : 1\nkey: 2\n", true),
        ("x: &k key\n*k : 1\nother: 2\n", false),
        ("b: &b {a: 1, c: 3}\nm:\n  <<: *b\n  a: 2\n", false),
        ("b: &b {a: 1}\nm:\n  <<: *b\n  <<: {c: 1}\n", false),
        (
            "b: &b {a: 1}\nc: &c {a: 2, d: 1}\nm: {<<: [*b, *c], e: 1}\n",
            false,
        ),
        ("m: {\"<<\": 1, a: 2}\n", false),
        ("m: {\"<<\": 1, \"<<\": 2}\n", true),
        ("m: {!!merge <<: {a: 1}, b: 2}\n", false),
        ("m: {<<: 1}\n", false),
        ("apiVersion: v1\nkind: K\nspec: 1\nspec: 2\n", true),
        ("spec: 1\napiVersion: v1\nkind: K\nspec: 2\n", true),
        ("apiVersion: v1\nkind: K\nspec: 1\n\"spec\": 2\n", true),
    ];

    /// Every mapping of [`KEYS`] reads the same with keys checked first as
    /// with serde-saphyr's own duplicate-key check alone: the same
    /// documents, values (merges), and errors (a duplicate names its line).
    /// Mappings without a key to check are read once; each duplicate is
    /// refused.
    #[test]
    fn keys_checked_first_read_as_serde_saphyrs_check_alone() {
        let prune: Arc<Prune> = Arc::new(|_: &str, _: &str, key: &str| key == "spec");
        let indent =
            |text: &str| -> String { text.lines().map(|l| format!("    {l}\n")).collect() };
        // 40 keys, then one of them again: the set past `SEEN_LINEAR`.
        let many: String = (0..40).map(|i| format!("k{i}: {i}\n")).collect();
        let cases: Vec<(String, bool)> = KEYS
            .iter()
            .map(|(t, d)| (t.to_string(), *d))
            .chain([
                (many.clone(), false),
                (format!("{many}k3: again\n"), true),
                (format!("{many}\"k39\": again\n"), true),
                (format!("{many}k3: {{k3: 1, k4: {{k3: 2}}}}\n"), true),
                (
                    format!("k3: {{{}}}\nk3: 2\n", many.replace('\n', ", ")),
                    true,
                ),
                ("x: 1\ny: 2\non: 3\n".to_string(), false),
            ])
            .collect();
        for (keys, duplicate) in &cases {
            let wraps = [
                keys.clone(),
                format!("apiVersion: v1\nkind: K\nkept:\n{}", indent(keys)),
                format!("apiVersion: v1\nkind: K\nspec:\n{}", indent(keys)),
                format!(
                    "apiVersion: v1\nkind: K\nspec:\n  - x\n  -\n{}",
                    indent(keys)
                ),
                format!(
                    "apiVersion: v1\nkind: K\nmetadata: {{name: a}}\n---\nkind: K\n---\napiVersion: v1\nkind: K\nspec:\n  deeper:\n{}---\nkind: last\n",
                    indent(&indent(keys))
                ),
            ];
            for text in &wraps {
                for prune in [None, Some(&prune)] {
                    let (docs, result, again) = read_checked(text, prune, true);
                    let (want_docs, want_result, _) = read_checked(text, prune, false);
                    assert_eq!(docs, want_docs, "{text}");
                    assert_eq!(result, want_result, "{text}");
                    if *duplicate {
                        // Null keys and `!!int` ones fail as such outside a
                        // pruned field, before they are compared.
                        let err = result.expect_err(text);
                        let odd =
                            text.contains('~') || text.contains("!!int") || text.contains('?');
                        assert!(odd || err.contains("duplicate"), "{text}: {err}");
                    }
                    let plain = !text.contains("<<")
                        && !text.contains('!')
                        && !text.contains('~')
                        && !text.contains('?')
                        && !text.contains("1: a")
                        && !text.contains("010")
                        && !text.contains("0xB\"");
                    if plain && !duplicate {
                        assert!(!again, "read again: {text}");
                    }
                }
            }
        }
    }

    /// A document read again after a later one failed the first read is
    /// handed on once: the documents before it are not repeated.
    #[test]
    fn a_stream_read_again_hands_each_document_on_once() {
        let text = "a: 1\n---\n1: x\n\"1\": z\n---\nb: 2\n";
        let (docs, result, again) = read_checked(text, None, true);
        assert!(again && result.is_ok());
        assert_eq!(docs, [json!({"a": 1}), json!({"1": "z"}), json!({"b": 2})]);
    }

    #[test]
    fn int_keys_read_as_serde_saphyr_reads_integers() {
        assert_eq!(int_key("0xB"), Some((false, 11)));
        assert_eq!(int_key("-0"), Some((false, 0)));
        assert_eq!(int_key("-0b1_0"), Some((true, 2)));
        assert_eq!(int_key(" +7 "), Some((false, 7)));
        for k in ["", "-", "+-1", "0x", "a1", "1a", "0o8", "1.0", ".5"] {
            assert_eq!(int_key(k), None, "{k}");
        }
    }

    #[test]
    fn a_stream_is_cut_before_markers_alone_and_not_when_it_has_directives() {
        let text = "a: 1\n--- x\nb: |\n  ---\n---\nc: 2\n---\r\nd: 3\n";
        assert_eq!(
            cut_at_markers(text, 8),
            ["a: 1\n--- x\nb: |\n  ---\n", "---\nc: 2\n", "---\r\nd: 3\n"]
        );
        assert_eq!(cut_at_markers(text, 1), [text]);
        let text = "%YAML 1.2\n---\na: 1\n---\nb: 2\n";
        assert_eq!(cut_at_markers(text, 4), [text]);
    }

    #[test]
    fn lists_and_empty_documents() {
        let text = "---\n---\nkind: List\napiVersion: v1\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n- {apiVersion: v1, kind: Namespace, metadata: {name: b}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: c}\n";
        let docs = parse_documents(Path::new("x.yaml"), text).unwrap();
        let names: Vec<&str> = docs
            .iter()
            .map(|d| d.value["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    #[test]
    fn a_long_stream_keeps_its_order() {
        let values: Vec<Value> = (0..3 * BATCH + 7)
            .map(|i| json!({"kind": "Role", "apiVersion": "v1", "metadata": {"name": format!("r{i}")}}))
            .collect();
        let one_by_one: String = values
            .iter()
            .map(|v| format!("---\n{}", to_yaml(v).unwrap()))
            .collect();
        assert_eq!(to_yaml_stream(&values).unwrap(), one_by_one);
    }

    #[test]
    fn a_manifest_prints_as_its_json_does() {
        let v = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "x", "labels": {"b": "1", "a": "2"}, "annotations": {"z": "y"},
                         "ownerReferences": [{"kind": "K", "name": "n", "uid": "u", "controller": true}]},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"k": "v"}}]}});
        let m = crate::engine::Manifest::from_value(&v).unwrap();
        assert_eq!(m.to_value(), v);
        assert_eq!(batch(&[m]).unwrap(), batch(&[&v]).unwrap());
        let b = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "x", "namespace": "ns", "labels": {"a": "2"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
            "subjects": [{"apiGroup": "", "kind": "ServiceAccount", "name": "s", "namespace": "ns"}]});
        let m = crate::engine::Manifest::from_value(&b).unwrap();
        assert_eq!(batch(&[m]).unwrap(), batch(&[&b]).unwrap());
    }

    #[test]
    fn output_round_trips_and_orders_keys() {
        let v = json!({"rules": [{"verbs": ["*"], "apiGroups": [""], "resources": ["*"]}],
                       "metadata": {"labels": {"a": "true"}, "name": "x:y"},
                       "kind": "ClusterRole", "apiVersion": "rbac.authorization.k8s.io/v1"});
        let text = to_yaml(&v).unwrap();
        assert!(text.starts_with("apiVersion:"), "{text}");
        let back: Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(back, v, "{text}");
    }
}
