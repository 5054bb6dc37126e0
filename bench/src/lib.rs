//! `rbac-rules-bench`: the figures of issue 9 (scale) on synthetic control
//! planes ([`synth`], described by `bench/control-plane.yaml`), printed as
//! one JSON object. A workspace member of its own, not part of the shipped
//! library or binary.
//!
//! Each phase runs in a child process of the same binary (hidden
//! `--phase`), so that its peak RSS (VmHWM of /proc/self/status, Linux
//! only; elsewhere `null`) is its own:
//!
//! - `render`, `floor`: `render` of the generated YAML with the built-in
//!   rules, and with an empty rules directory (reading and printing only);
//! - `incremental`: [`Engine::evaluate_incremental`] with a warm [`Memo`]
//!   over 100 changes of each [`ChangeKind`];
//! - `controller`: [`rbac_rules::controller::run_with`] (leader election off,
//!   short debounce, 2-second resync) against the counting API stand-in ([`fake_api`]),
//!   which this process serves over HTTP on 127.0.0.1 so that the child's
//!   memory is the controller's alone. A child stops when its stdin closes.

pub mod fake_api;
mod real;
pub mod synth;

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser as _;
use serde_json::{Value, json};

use fake_api::FakeApi;
use rbac_rules::engine::{Engine, Evaluation, Memo, ObjectStore, Options};
use synth::{ChangeKind, Names, Plane, Scenario, Sizes, Versions};

/// Arguments of `rbac-rules-bench`.
#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Size of the synthetic control plane.
    #[arg(long, value_enum, default_value = "small")]
    pub scenario: Scenario,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Override the scenario's sizes (each knob alone; the rest stay the
    /// scenario's).
    #[command(flatten)]
    pub knobs: Knobs,
    /// Changes of each kind timed by the incremental phase.
    #[arg(long, default_value_t = 100)]
    pub changes: usize,
    /// Leave out the controller phases (render and engine figures only).
    #[arg(long)]
    pub skip_controller: bool,
    /// Time only this kind of change (to profile one).
    #[arg(long, value_enum)]
    pub only: Option<ChangeKind>,
    /// Write the scenario's objects as one YAML stream to this file and
    /// stop (to profile `render` or apply them to a cluster by hand).
    #[arg(long, value_name = "PATH")]
    pub write_objects: Option<PathBuf>,
    /// Run the controller phases against the API server of this kubeconfig
    /// (a throwaway cluster; its current context a cluster admin) instead
    /// of the in-process stand-in: installs the RbacRule CRD, stand-in
    /// CRDs of the trigger kinds, the built-in rules and the scenario's
    /// objects, runs `rbac-rules run`, and compares with `kubectl apply`.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: a shell command that forces the controller's
    /// watches to relist (e.g. one restarting the API server), run after
    /// the initial sync; without it only the resync timer runs.
    #[arg(long, value_name = "COMMAND", requires = "kubeconfig")]
    pub relist_command: Option<String>,
    /// With --kubeconfig: concurrent `kubectl apply --server-side`
    /// processes applying the same outputs, for comparison (0: none).
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub kubectl_parallel: usize,
    /// With --kubeconfig: one more argument for `rbac-rules run` (repeat
    /// it; e.g. `--controller-arg=--slow-rule-seconds=0.001`), after the
    /// bench's own, so that it overrides them.
    #[arg(
        long,
        value_name = "ARG",
        allow_hyphen_values = true,
        requires = "kubeconfig"
    )]
    pub controller_arg: Vec<String>,
    /// Internal: run one phase and print its figures as JSON.
    #[arg(long, value_enum, hide = true)]
    pub phase: Option<Phase>,
    /// Internal: the generated objects file of the render phases.
    #[arg(long, hide = true)]
    pub objects_file: Option<PathBuf>,
    /// Internal: the stand-in's URL for the controller phase.
    #[arg(long, hide = true)]
    pub api_url: Option<String>,
    /// Internal: the controller's metrics address.
    #[arg(long, hide = true)]
    pub metrics_address: Option<String>,
}

/// Sizes that override a scenario's, one by one: to build the shapes of
/// a real cluster (a platform's namespaces and claims, a provider family).
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct Knobs {
    /// Namespaces.
    #[arg(long, value_name = "N")]
    pub namespaces: Option<usize>,
    /// Claim-bearing XRDs each namespace accepts claims of.
    #[arg(long, value_name = "N")]
    pub claims_per_namespace: Option<usize>,
    /// XRDs (half of them with claimNames).
    #[arg(long, value_name = "N")]
    pub xrds: Option<usize>,
    /// Provider revisions.
    #[arg(long, value_name = "N")]
    pub revisions: Option<usize>,
    /// Revisions per provider family (each member's roles list the types
    /// of its whole family).
    #[arg(long, value_name = "N")]
    pub family_size: Option<usize>,
    /// CRDs the revisions list, all together.
    #[arg(long, value_name = "N")]
    pub crds: Option<usize>,
}

impl Knobs {
    /// `sizes` with these knobs set.
    pub fn apply(&self, mut sizes: Sizes) -> Sizes {
        let set = |v: &mut usize, k: Option<usize>| {
            if let Some(k) = k {
                *v = k;
            }
        };
        set(&mut sizes.namespaces, self.namespaces);
        set(&mut sizes.accepted_per_namespace, self.claims_per_namespace);
        set(&mut sizes.xrds, self.xrds);
        set(&mut sizes.revisions, self.revisions);
        set(&mut sizes.family_size, self.family_size);
        set(&mut sizes.crds, self.crds);
        sizes
    }

    /// The knobs set, as arguments for a child phase.
    fn args(&self) -> Vec<String> {
        [
            ("namespaces", self.namespaces),
            ("claims-per-namespace", self.claims_per_namespace),
            ("xrds", self.xrds),
            ("revisions", self.revisions),
            ("family-size", self.family_size),
            ("crds", self.crds),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| format!("--{k}={v}")))
        .collect()
    }
}

/// A phase run in a child process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    /// `render` with the built-in rules.
    Render,
    /// `render` with no rules: reading and printing only.
    Floor,
    /// The incremental engine.
    Incremental,
    /// The controller, until its stdin closes.
    Controller,
}

/// Why a bench failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Generating or writing the input.
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    /// A render failed.
    #[error("render failed: {0}")]
    Render(#[from] rbac_rules::render::RenderError),
    /// A child process failed.
    #[error("phase {phase}: {message}")]
    Phase { phase: String, message: String },
    /// Anything else, said in words.
    #[error("{0}")]
    Other(String),
}

/// Runs the bench: every phase, then the report on stdout.
pub fn main(args: &BenchArgs) -> ExitCode {
    let result = match args.phase {
        _ if args.write_objects.is_some() => write_objects(args),
        Some(phase) => run_phase(args, phase).map(|v| println!("{v}")),
        None => run_all(args).and_then(|report| {
            if args.json {
                println!("{report}");
            } else {
                print!("{}", table(&report));
            }
            match report.get("controller_error") {
                Some(e) => Err(BenchError::Phase {
                    phase: "controller".into(),
                    message: e.as_str().unwrap_or_default().to_string(),
                }),
                None => Ok(()),
            }
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--write-objects`: the generated objects, as one YAML stream.
fn write_objects(args: &BenchArgs) -> Result<(), BenchError> {
    match &args.write_objects {
        Some(path) => write_plane(&plane(args)?, path),
        None => Ok(()),
    }
}

/// A plane's objects, as one YAML stream, to `path`.
fn write_plane(plane: &Plane<'_>, path: &std::path::Path) -> Result<(), BenchError> {
    let objs = plane.objects(&mut Versions::default());
    let text =
        rbac_rules::yaml::to_yaml_stream(&objs).map_err(|e| BenchError::Other(e.to_string()))?;
    std::fs::write(path, text).map_err(|source| BenchError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// Peak resident memory of this process in MiB (VmHWM; Linux only).
pub fn peak_rss_mib() -> Option<f64> {
    memory_mib("self", "VmHWM")
}

/// A memory field (`VmHWM`, `VmRSS`) of a process's /proc status, in MiB.
fn memory_mib(pid: &str, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some((kib / 1024.0 * 10.0).round() / 10.0)
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn progress(msg: &str) {
    eprintln!("bench: {msg}");
}

/// The control plane of the scenario, with the knobs set.
pub fn plane(args: &BenchArgs) -> Result<Plane<'static>, BenchError> {
    Ok(Plane {
        names: Names::builtin().map_err(BenchError::Other)?,
        sizes: args.knobs.apply(args.scenario.sizes()),
    })
}

/// Orchestrates the phases and merges their figures.
fn run_all(args: &BenchArgs) -> Result<Value, BenchError> {
    let plane = plane(args)?;
    let sizes = plane.sizes;
    let dir = std::env::temp_dir().join(format!("rbac-rules-bench-{}", std::process::id()));
    let empty = dir.join("no-rules");
    std::fs::create_dir_all(&empty).map_err(|source| BenchError::Write {
        path: empty.display().to_string(),
        source,
    })?;
    let objects_file = dir.join("objects.yaml");
    let result = (|| {
        progress(&format!(
            "{}: generating {} objects",
            args.scenario.name(),
            sizes.objects_in()
        ));
        write_plane(&plane, &objects_file)?;
        let mut report = json!({
            "scenario": args.scenario.name(),
            "input": sizes,
            "objects_in": sizes.objects_in(),
            "peak_rss_source": "VmHWM of /proc/self/status of each phase's child process (Linux)",
        });
        let extra = |phase: &str| {
            vec![
                format!("--phase={phase}"),
                format!("--objects-file={}", objects_file.display()),
            ]
        };
        progress("full render");
        let render = child(args, &extra("render"))?;
        progress("floor (render with no rules)");
        let floor = child(args, &extra("floor"))?;
        progress(&format!(
            "incremental engine, {} changes of each kind",
            args.changes
        ));
        let incremental = child(args, &["--phase=incremental".to_string()])?;
        merge(&mut report, &render);
        report["floor_ms"] = floor["full_render_ms"].clone();
        report["floor_peak_rss_mib"] = floor["peak_rss_mib"].clone();
        if let (Some(f), Some(r)) = (
            floor["full_render_ms"].as_f64(),
            render["full_render_ms"].as_f64(),
        ) && f > 0.0
        {
            report["full_render_over_floor"] = json!((r / f * 100.0).round() / 100.0);
        }
        let mut incremental = incremental;
        if let Some(m) = incremental.as_object_mut()
            && let Some(rss) = m.remove("peak_rss_mib")
        {
            m.insert("incremental_peak_rss_mib".into(), rss);
        }
        merge(&mut report, &incremental);
        if args.skip_controller {
            return Ok(report);
        }
        let objects_out = render["objects_out"].as_u64().unwrap_or(0);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| BenchError::Other(format!("cannot start the async runtime: {e}")))?;
        // The figures so far still print when the controller fails (e.g.
        // killed for its memory); the exit status says it failed.
        let phases = match &args.kubeconfig {
            Some(kubeconfig) => rt.block_on(real::controller_phases(args, kubeconfig, &plane)),
            None => rt.block_on(controller_phases(args, &plane, objects_out)),
        };
        match phases {
            Ok(controller) => merge(&mut report, &controller),
            Err(e) => report["controller_error"] = json!(e.to_string()),
        }
        Ok(report)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn merge(into: &mut Value, from: &Value) {
    if let (Some(a), Some(b)) = (into.as_object_mut(), from.as_object()) {
        for (k, v) in b {
            a.insert(k.clone(), v.clone());
        }
    }
}

/// This binary with `--scenario <s>` and `extra`.
fn command(args: &BenchArgs, extra: &[String]) -> Result<Command, BenchError> {
    let exe = std::env::current_exe()
        .map_err(|e| BenchError::Other(format!("cannot find this program: {e}")))?;
    // A profiler to run each phase under (e.g. `heaptrack -o /tmp/ht`).
    let wrap = std::env::var("RBAC_RULES_BENCH_WRAP").unwrap_or_default();
    let mut words = wrap.split_whitespace();
    let mut cmd = match words.next() {
        Some(tool) => {
            let mut c = Command::new(tool);
            c.args(words).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.arg(format!("--scenario={}", args.scenario.name()))
        .arg(format!("--changes={}", args.changes))
        .args(args.knobs.args())
        .args(args.only.map(|k| format!("--only={}", k.key())))
        .args(extra)
        .stderr(Stdio::inherit());
    // The controller logs every write at info: keep the report readable.
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "warn");
    }
    Ok(cmd)
}

/// The `rbac-rules` binary that the real-server mode runs as the
/// controller: `RBAC_RULES_BIN`, or the one beside this program (cargo
/// builds both into one target directory).
fn rbac_rules_exe() -> Result<PathBuf, BenchError> {
    if let Some(path) = std::env::var_os("RBAC_RULES_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()
        .map_err(|e| BenchError::Other(format!("cannot find this program: {e}")))?;
    let beside = exe.with_file_name(format!("rbac-rules{}", std::env::consts::EXE_SUFFIX));
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(BenchError::Other(format!(
            "{} not found: build it (cargo build --release --workspace) or set RBAC_RULES_BIN",
            beside.display()
        )))
    }
}

/// Runs a phase to its end and parses the JSON it prints.
fn child(args: &BenchArgs, extra: &[String]) -> Result<Value, BenchError> {
    let out = command(args, extra)?
        .stdout(Stdio::piped())
        .output()
        .map_err(|e| BenchError::Other(format!("cannot start a phase: {e}")))?;
    parse_child(extra, out.status.success(), &out.stdout)
}

fn parse_child(extra: &[String], success: bool, stdout: &[u8]) -> Result<Value, BenchError> {
    let phase = extra.first().cloned().unwrap_or_default();
    if !success {
        return Err(BenchError::Phase {
            phase,
            message: "failed (see stderr)".into(),
        });
    }
    // The JSON is the last line: a profiler (RBAC_RULES_BENCH_WRAP) may
    // print before it.
    let last = stdout
        .split(|b| *b == b'\n')
        .rfind(|l| !l.trim_ascii().is_empty())
        .unwrap_or_default();
    serde_json::from_slice(last).map_err(|e| BenchError::Phase {
        phase,
        message: format!("printed no JSON: {e}"),
    })
}

/// One phase, in this (child) process.
fn run_phase(args: &BenchArgs, phase: Phase) -> Result<Value, BenchError> {
    let mut v = match phase {
        Phase::Render | Phase::Floor => render_phase(args, phase == Phase::Floor)?,
        Phase::Incremental => incremental_phase(args)?,
        Phase::Controller => controller_child(args)?,
    };
    v["peak_rss_mib"] = json!(peak_rss_mib());
    Ok(v)
}

/// `render` (parse, evaluate, print) of the objects file, timed.
fn render_phase(args: &BenchArgs, floor: bool) -> Result<Value, BenchError> {
    let file = args
        .objects_file
        .clone()
        .ok_or_else(|| BenchError::Other("--objects-file is required with --phase".into()))?;
    let rules = if floor {
        let empty = file.with_file_name("no-rules");
        vec![empty]
    } else {
        Vec::new()
    };
    let render_args = rbac_rules::render::RenderArgs {
        objects: vec![file],
        rules,
        limits: bench_limits(),
        ..rbac_rules::render::RenderArgs::default()
    };
    // As the CLI does: print through a buffer (here into a counter, not a
    // terminal) and leave freeing to the process exit.
    let started = Instant::now();
    let rendered = rbac_rules::render::prepare(&render_args)?;
    let mut out = std::io::BufWriter::new(Documents::default());
    rendered
        .write_to(&mut out)
        .map_err(|e| BenchError::Other(e.to_string()))?;
    let counted = out
        .into_inner()
        .map_err(|e| BenchError::Other(e.to_string()))?;
    let took = started.elapsed();
    let held = held_figures(rendered.evaluation());
    std::mem::forget(rendered);
    Ok(json!({"full_render_ms": ms(took), "objects_out": counted.documents, "held": held}))
}

/// What the evaluation's outputs hold, as the engine counts it (what its
/// totals compare with their limits), and with the rule lists that outputs
/// share (one `Arc`) counted once: how much of the count is shared.
fn held_figures(eval: &Evaluation) -> Value {
    use rbac_rules::engine::limits::{manifest_weight, rules_weight};
    let (mut counted, mut shared_once) = (0usize, 0usize);
    let mut lists = std::collections::HashSet::new();
    for d in eval.desired.iter() {
        let w = manifest_weight(&d.object);
        counted += w;
        match d.object.rules() {
            Some(r) => {
                let body = rules_weight(r);
                shared_once += w - body;
                if lists.insert(std::sync::Arc::as_ptr(r) as usize) {
                    shared_once += body;
                }
            }
            None => shared_once += w,
        }
    }
    json!({"bytes": counted, "bytes_shared_once": shared_once, "distinct_rule_lists": lists.len()})
}

/// A sink that counts the YAML documents written to it (lines `---`).
#[derive(Default)]
struct Documents {
    documents: usize,
    /// Bytes of the current line seen so far, up to four.
    line: Vec<u8>,
}

impl std::io::Write for Documents {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for &b in buf {
            if b == b'\n' {
                if self.line == b"---" {
                    self.documents += 1;
                }
                self.line.clear();
            } else if self.line.len() < 4 {
                self.line.push(b);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Outputs whose presence or content differ between two evaluations: the
/// engine's own count ([`Evaluation::changed`]), cross-checked against a
/// diff of the two desired sets (a mismatch is a bench failure).
fn touched(before: &Evaluation, after: &Evaluation) -> Result<usize, BenchError> {
    let index = |e: &Evaluation| {
        e.desired
            .iter()
            .map(|d| {
                (
                    (d.kind, d.namespace.clone(), d.name.clone()),
                    d.object.clone(),
                )
            })
            .collect::<BTreeMap<_, _>>()
    };
    let (a, b) = (index(before), index(after));
    let diffed = b
        .iter()
        .filter(|(k, v)| {
            a.get(*k)
                .is_none_or(|old| !rbac_rules::engine::Manifest::ptr_eq(old, v) && old != *v)
        })
        .count()
        + a.keys().filter(|k| !b.contains_key(*k)).count();
    if diffed != after.changed.len() {
        return Err(BenchError::Other(format!(
            "the engine reports {} outputs changed, the desired sets differ in {diffed}",
            after.changed.len()
        )));
    }
    Ok(diffed)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The incremental engine: a warm memo, then `changes` changes of each
/// kind, each evaluated alone.
fn incremental_phase(args: &BenchArgs) -> Result<Value, BenchError> {
    let plane = plane(args)?;
    let sizes = plane.sizes;
    let mut versions = Versions::default();
    let mut rules = rbac_rules::rules::builtin().unwrap_or_default();
    let options = Options {
        limits: bench_limits(),
        ..Options::default()
    };
    let mut engine = Engine::new(&rules, options.clone());
    // Held as the controller holds them: the kinds read only as triggers
    // (Namespaces, revisions) packed.
    let mut store = ObjectStore::new();
    store.pack_kinds(rbac_rules::engine::shape::packable_kinds(
        &engine.interests(),
    ));
    for o in plane.objects(&mut versions) {
        // Generated objects always have apiVersion, kind and name.
        let _ = store.insert(o);
    }
    let mut memo = Memo::new();
    let started = Instant::now();
    let mut last = engine.evaluate_incremental(&store, &mut memo);
    let warm_ms = ms(started.elapsed());
    let mut noop = Vec::new();
    for _ in 0..args.changes.min(20) {
        let started = Instant::now();
        let e = engine.evaluate_incremental(&store, &mut memo);
        noop.push(ms(started.elapsed()));
        last = e;
    }
    noop.sort_by(f64::total_cmp);
    let (mut median, mut p90, mut p99) = (json!({}), json!({}), json!({}));
    let (mut max_touched, mut max_renders) = (json!({}), json!({}));
    let mut overall = 0;
    for kind in ChangeKind::ALL {
        if args.only.is_some_and(|o| o != kind) {
            continue;
        }
        progress(&format!("incremental: {}", kind.key()));
        let mut times = Vec::with_capacity(args.changes);
        // Each evaluation is kept (its desired set shares all but what
        // changed with the one before) and cross-checked after the timed
        // loop: the check walks every output, and run between changes it
        // would leave the next one to start on caches it evicted.
        let mut evaluations = Vec::with_capacity(args.changes);
        let mut renders = 0;
        for i in 0..args.changes {
            for o in plane.change(kind, i, &mut versions) {
                let _ = store.insert(o);
            }
            let started = Instant::now();
            if kind == ChangeKind::RuleChanged {
                // Built again with the rules, as the controller does.
                change_rule(&mut rules, i);
                engine = Engine::with_previous(&engine, &rules, options.clone());
                store.pack_kinds(rbac_rules::engine::shape::packable_kinds(
                    &engine.interests(),
                ));
            }
            let e = engine.evaluate_incremental(&store, &mut memo);
            times.push(ms(started.elapsed()));
            renders = renders.max(memo.renders());
            evaluations.push(e);
        }
        let mut most = 0;
        for e in evaluations {
            most = most.max(touched(&last, &e)?);
            last = e;
        }
        times.sort_by(f64::total_cmp);
        median[kind.key()] = json!(percentile(&times, 0.5));
        p90[kind.key()] = json!(percentile(&times, 0.9));
        p99[kind.key()] = json!(percentile(&times, 0.99));
        max_touched[kind.key()] = json!(most);
        max_renders[kind.key()] = json!(renders);
        overall = overall.max(most);
    }
    Ok(json!({
        "incremental_warm_ms": warm_ms,
        "incremental_noop_ms_median": percentile(&noop, 0.5),
        "incremental_ms_median": median,
        "incremental_ms_p90": p90,
        "incremental_ms_p99": p99,
        "incremental_renders_max": max_renders,
        "incremental_owner_index_entries": memo.owner_index_entries(),
        "incremental_packed_kinds": store.packed_kinds().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "incremental_packed_bytes": store.packed_bytes(),
        // Packed kinds read back whole for a reader of trees: 0 when every
        // reader reads them one object at a time, as it should.
        "incremental_trees_read_back": store.trees_read_back(),
        "max_objects_touched": max_touched,
        "max_objects_touched_per_change": overall,
        "touched_bound": touched_bound(&sizes),
        "touched_source": "Evaluation::changed, cross-checked against a diff of consecutive evaluations' desired objects",
    }))
}

/// The `i`-th change of a rule: the static `crossplane-core` rule's
/// first output gets a new annotation value (one object changes).
fn change_rule(rules: &mut [rbac_rules::engine::RuleSource], i: usize) {
    if let Some(o) = rules
        .iter_mut()
        .find(|r| r.name == "crossplane-core")
        .and_then(|r| r.spec.outputs.first_mut())
    {
        o.annotations = Some(json!({"example.org/bench-change": i.to_string()}));
    }
}

/// The most outputs one change of the bench may touch: a namespace change
/// its 3 Roles, a new XRD its 4 ClusterRoles, a revision change the 3
/// ClusterRoles of each revision of its family.
pub fn touched_bound(sizes: &Sizes) -> usize {
    let (namespace, xrd) = (3, 4);
    namespace
        .max(xrd)
        .max(sizes.max_touched_per_revision_change())
}

/// The controller, as a child: runs until stdin closes, then prints its
/// peak RSS.
fn controller_child(args: &BenchArgs) -> Result<Value, BenchError> {
    let url = args
        .api_url
        .clone()
        .ok_or_else(|| BenchError::Other("--api-url is required with --phase=controller".into()))?;
    let metrics = args
        .metrics_address
        .clone()
        .unwrap_or_else(|| "127.0.0.1:0".into());
    // As `run` does (src/main.rs): two workers on any machine.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| BenchError::Other(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(async move {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| BenchError::Other(format!("--api-url {url:?}: {e}")))?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".into();
        let client = kube::Client::try_from(config)
            .map_err(|e| BenchError::Other(format!("client: {e}")))?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            let _ = stop_tx.send(true);
        });
        rbac_rules::controller::run_with(client, run_args(&metrics), stop_rx)
            .await
            .map_err(|e| BenchError::Other(format!("controller: {e}")))
    })?;
    Ok(json!({}))
}

/// The controller's resync period in the bench.
const RESYNC: Duration = Duration::from_secs(2);

/// The controller's settings: its own flags' defaults but leader election
/// off, a short debounce and a 2-second resync (the resync phase waits for
/// one).
fn run_args(metrics: &str) -> rbac_rules::controller::RunArgs {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        run: rbac_rules::controller::RunArgs,
    }
    let mut run = Cli::parse_from([
        "rbac-rules".to_string(),
        "--leader-election=false".into(),
        format!("--metrics-address={metrics}"),
        "--debounce-ms=50".into(),
        format!("--resync-seconds={}", RESYNC.as_secs()),
        "--identity=bench".into(),
    ])
    .run;
    run.limits = bench_limits();
    run
}

/// The default limits, as `rbac-rules` takes them from the environment
/// (`RBAC_RULES_MAX_*`): the bench measures what the shipped settings do
/// (every scenario renders with nothing shed; docs/performance.md).
fn bench_limits() -> rbac_rules::engine::Limits {
    #[derive(clap::Parser)]
    struct FromEnv {
        #[command(flatten)]
        limits: rbac_rules::engine::Limits,
    }
    use clap::Parser;
    match FromEnv::try_parse_from(["rbac-rules-bench"]) {
        Ok(f) => f.limits,
        Err(e) => {
            progress(&format!(
                "limits from the environment: {e}; using the defaults"
            ));
            rbac_rules::engine::Limits::default()
        }
    }
}

/// A running controller child.
struct Controller {
    child: std::process::Child,
    metrics: String,
}

impl Controller {
    fn start(args: &BenchArgs, url: &str) -> Result<Controller, BenchError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| BenchError::Other(format!("no free port: {e}")))?
            .port();
        let metrics = format!("127.0.0.1:{port}");
        let child = command(
            args,
            &[
                "--phase=controller".into(),
                format!("--api-url={url}"),
                format!("--metrics-address={metrics}"),
            ],
        )?
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| BenchError::Other(format!("cannot start the controller: {e}")))?;
        Ok(Controller { child, metrics })
    }

    /// GETs a path of the controller's metrics server.
    async fn get(&self, path: &str) -> Option<String> {
        let address = self.metrics.clone();
        let path = path.to_string();
        tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(&address).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .ok()?;
            let mut out = String::new();
            s.read_to_string(&mut out).ok()?;
            Some(out)
        })
        .await
        .ok()
        .flatten()
    }

    async fn ready(&self) -> bool {
        self.get("/readyz")
            .await
            .is_some_and(|r| r.starts_with("HTTP/1.1 200"))
    }

    /// `rbac_rules_reconciles_total`: write passes run (`None` when the
    /// metrics do not say).
    async fn reconciles(&self) -> Option<u64> {
        let text = self.get("/metrics").await?;
        text.lines()
            .find_map(|l| l.strip_prefix("rbac_rules_reconciles_total "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Whether the child has exited (it should not before stop).
    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Closes stdin and collects the child's figures.
    async fn stop(mut self) -> Result<Value, BenchError> {
        drop(self.child.stdin.take());
        let out = tokio::task::spawn_blocking(move || self.child.wait_with_output())
            .await
            .map_err(|e| BenchError::Other(e.to_string()))?
            .map_err(|e| BenchError::Other(format!("controller child: {e}")))?;
        parse_child(
            &["--phase=controller".into()],
            out.status.success(),
            &out.stdout,
        )
    }
}

/// How long to wait for anything the controller should do.
fn patience(sizes: &Sizes) -> Duration {
    Duration::from_secs(60) + Duration::from_millis(50 * sizes.objects_in() as u64)
}

/// Waits until `done` holds, the child lives and the deadline is not
/// passed; false when it gave up.
async fn wait_until(
    ctl: &mut Controller,
    deadline: Instant,
    mut done: impl AsyncFnMut(&Controller) -> bool,
) -> bool {
    loop {
        if done(ctl).await {
            return true;
        }
        if ctl.exited() || Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the stand-in's RBAC write count stays still for `quiet`.
async fn settle(api: &FakeApi, quiet: Duration, deadline: Instant) -> u64 {
    let mut last = api.counts().rbac_writes();
    let mut since = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = api.counts().rbac_writes();
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            break;
        }
    }
    last
}

/// Waits for `passes` more write passes of the controller; without the
/// metric, for as many resync periods and one more.
async fn passes(ctl: &mut Controller, passes: u64, deadline: Instant) -> bool {
    let Some(start) = ctl.reconciles().await else {
        tokio::time::sleep(RESYNC * (passes as u32 + 1)).await;
        return true;
    };
    wait_until(ctl, deadline, async |c| {
        c.reconciles().await.is_some_and(|n| n >= start + passes)
    })
    .await
}

/// The controller against the stand-in: initial sync, forced resync,
/// namespace changes, restart.
async fn controller_phases(
    args: &BenchArgs,
    plane: &Plane<'static>,
    objects_out: u64,
) -> Result<Value, BenchError> {
    let sizes = &plane.sizes;
    let api = FakeApi::new(fake_api::resources_of(plane.names));
    for r in rbac_rules::rules::builtin()
        .map_err(|e| BenchError::Other(format!("built-in rules: {e:?}")))?
    {
        let spec = serde_json::to_value(&r.spec).map_err(|e| BenchError::Other(e.to_string()))?;
        api.put(
            json!({"apiVersion": "rbacrules.io/v1alpha1", "kind": "RbacRule",
            "metadata": {"name": r.name, "generation": 1}, "spec": spec}),
        )
        .map_err(BenchError::Other)?;
    }
    let mut versions = Versions::default();
    for o in plane.objects(&mut versions) {
        api.put(o).map_err(BenchError::Other)?;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| BenchError::Other(format!("cannot serve the stand-in: {e}")))?;
    let url = format!(
        "http://{}",
        listener
            .local_addr()
            .map_err(|e| BenchError::Other(e.to_string()))?
    );
    let server = tokio::spawn(
        axum::serve(listener, axum::Router::new().fallback_service(api.clone())).into_future(),
    );
    let label = (
        rbac_rules::engine::output::MANAGED_BY_LABEL,
        rbac_rules::engine::output::MANAGED_BY_VALUE,
    );
    let quiet = Duration::from_millis(1500);

    progress("controller: initial sync");
    let started = Instant::now();
    let mut ctl = Controller::start(args, &url)?;
    let deadline = Instant::now() + patience(sizes);
    let synced = wait_until(&mut ctl, deadline, async |_| {
        api.rbac_objects_labelled(label.0, label.1) as u64 >= objects_out
    })
    .await;
    let initial_sync_ms = ms(started.elapsed());
    let initial = settle(&api, quiet, deadline).await;
    // Resident now, after the initial sync: what the controller keeps.
    let rss_after_sync = memory_mib(&ctl.child.id().to_string(), "VmRSS");
    if !synced {
        progress("controller: the initial sync did not reach objects_out");
    }

    progress("controller: forced resync (every watch expired: relists; resync timer)");
    let lists = api.counts().lists.values().sum::<u64>();
    api.expire_watches();
    passes(&mut ctl, 2, Instant::now() + Duration::from_secs(60)).await;
    let resynced = settle(&api, quiet, Instant::now() + patience(sizes)).await;
    let relists = api.counts().lists.values().sum::<u64>() - lists;

    progress("controller: namespace annotation changes");
    let mut per_change = 0;
    for i in 0..5 {
        let before = api.counts().rbac_writes();
        for o in plane.change(ChangeKind::NamespaceAnnotation, i, &mut versions) {
            api.put(o).map_err(BenchError::Other)?;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        wait_until(&mut ctl, deadline, async |_| {
            api.counts().rbac_writes() > before
        })
        .await;
        let after = settle(&api, quiet, deadline).await;
        per_change = per_change.max(after - before);
    }
    let first = ctl.stop().await?;

    progress("controller: restart over the same state");
    let before_restart = api.counts().rbac_writes();
    let mut ctl = Controller::start(args, &url)?;
    let deadline = Instant::now() + patience(sizes);
    wait_until(&mut ctl, deadline, async |c| c.ready().await).await;
    passes(&mut ctl, 2, deadline).await;
    let restarted = settle(&api, quiet, deadline).await;
    let second = ctl.stop().await?;
    server.abort();
    let counts = api.counts();
    Ok(json!({
        "initial_sync_writes": initial,
        "initial_sync_ms": initial_sync_ms,
        "initial_sync_complete": synced,
        "resync_writes": resynced - initial,
        "resync_relists": relists,
        "writes_per_namespace_change": per_change,
        "restart_writes": restarted - before_restart,
        "controller_peak_rss_mib": first["peak_rss_mib"],
        "controller_restart_peak_rss_mib": second["peak_rss_mib"],
        "controller_rss_after_sync_mib": rss_after_sync,
        "api_requests": counts,
    }))
}

/// The report as a readable table.
fn table(report: &Value) -> String {
    let mut out = String::new();
    let mut row = |k: &str, v: &Value| {
        let v = match v {
            Value::String(s) => s.clone(),
            Value::Null => "-".into(),
            other => other.to_string(),
        };
        out.push_str(&format!("{k:<40} {v}\n"));
    };
    for (k, v) in report.as_object().into_iter().flatten() {
        match v {
            Value::Object(m) if k != "api_requests" => {
                for (sub, v) in m {
                    row(&format!("{k}.{sub}"), v);
                }
            }
            _ => row(k, v),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use clap::Parser as _;

    use super::{BenchArgs, Documents};

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.bench)
    }

    #[test]
    fn real_server_arguments() {
        let a = parse(&[]).expect("defaults");
        assert!(a.kubeconfig.is_none() && a.relist_command.is_none());
        assert_eq!(a.kubectl_parallel, 8);
        let a = parse(&[
            "--scenario=large",
            "--kubeconfig=/k",
            "--relist-command",
            "restart it",
            "--kubectl-parallel=0",
        ])
        .expect("real mode");
        assert_eq!(a.kubeconfig.as_deref(), Some(std::path::Path::new("/k")));
        assert_eq!(a.relist_command.as_deref(), Some("restart it"));
        assert_eq!(a.kubectl_parallel, 0);
        assert!(a.controller_arg.is_empty());
        let a = parse(&[
            "--kubeconfig=/k",
            "--controller-arg",
            "--slow-rule-seconds=0.001",
            "--controller-arg=--x",
        ])
        .expect("controller args");
        assert_eq!(a.controller_arg, ["--slow-rule-seconds=0.001", "--x"]);
        // A relist needs a real server.
        assert!(parse(&["--relist-command=x"]).is_err());
    }

    #[test]
    fn documents_counts_separator_lines_across_writes() {
        let mut d = Documents::default();
        for chunk in ["---\nkind: A\n--", "-\nname: '---x'\n----\n", "---\n"] {
            d.write_all(chunk.as_bytes()).unwrap();
        }
        assert_eq!(d.documents, 3);
    }
}
