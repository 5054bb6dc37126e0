//! The `rbac-rules` command: `crd`, `render`, `run`, `diff`, … and `bench`.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use rbac_rules::controller::RunArgs;
use rbac_rules::diff::DiffArgs;
use rbac_rules::render::RenderArgs;

/// `rbac-rules --version`: the crate version and the git revision built.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("RBAC_RULES_GIT_REVISION"),
    ")"
);

/// A rule-driven Kubernetes RBAC controller.
#[derive(Parser, Debug)]
#[command(name = "rbac-rules", version = VERSION, about)]
struct Cli {
    /// Log format.
    #[arg(long, env = "RBAC_RULES_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the RbacRule CustomResourceDefinition as YAML.
    Crd,
    /// Run the engine offline on YAML files and print the objects it emits.
    Render(RenderArgs),
    /// Run the controller against the cluster of the current kubeconfig.
    Run(RunArgs),
    /// Show what `run` would change in the cluster of the current
    /// kubeconfig, without writing: exit 0 nothing, 1 something, 2 error.
    Diff(DiffArgs),
    /// Lint rule files offline: templates, helpers, verbs, trigger fields.
    Validate(rbac_rules::validate::ValidateArgs),
    /// Run rule tests (kind RbacRuleTest): expected objects and access.
    Test(rbac_rules::ruletest::TestArgs),
    /// Explain a rendered object's origin, or what a subject may do.
    Explain(rbac_rules::explain::ExplainArgs),
    /// Measure render, incremental and controller figures on a synthetic
    /// control plane of the built-in rules' kinds (build with --release).
    Bench(rbac_rules::bench::BenchArgs),
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// jemalloc, not the system allocator: rendering is mostly small
/// allocations, and at the bench's `large` scenario jemalloc renders in
/// about 20% less time than glibc's malloc at the same peak RSS (`xl`: 3.0
/// s against 3.6–4.1 s, 330 against 360 MiB).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its start: freed pages go back to the
/// system at once instead of after ten seconds. A controller's peaks (the
/// initial sync, a relist) are transient, and pages kept for reuse count in
/// its resident memory: at `large` its peak RSS falls from 122–130 to
/// about 100 MiB, with no measurable cost to `render`. One arena, not four
/// per core: each arena keeps partly used pages of every size class of its
/// own, and the controller's threads (workers, the engine's blocking
/// thread, watches) each took one; at `large` the controller's peak RSS
/// falls by about 1.5 MiB, and `render`'s two threads take as long.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; 44] = b"dirty_decay_ms:0,muzzy_decay_ms:0,narenas:1\0";

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::Crd => match rbac_rules::crd_yaml() {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Render(args) => rbac_rules::render::main(&args),
        Command::Diff(args) => match runtime() {
            Ok(rt) => ExitCode::from(rt.block_on(rbac_rules::diff::run(&args))),
            Err(e) => {
                eprintln!("error: cannot start the async runtime: {e}");
                ExitCode::from(2)
            }
        },
        Command::Validate(args) => rbac_rules::validate::main(&args),
        Command::Test(args) => rbac_rules::ruletest::main(&args),
        Command::Explain(args) => rbac_rules::explain::main(&args),
        Command::Bench(args) => rbac_rules::bench::main(&args),
        Command::Run(args) => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(rbac_rules::controller::run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "controller stopped");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// The async runtime of `run` and `diff`: their tasks wait on the network
/// (watches, writes) and the engine runs on a thread of its own
/// (`block_in_place`), so two workers serve them on any machine. Tokio's
/// default, one per core, gives a large node dozens of threads, each with
/// its stack and the allocator's per-thread caches.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Objects as deep as the API server accepts (10,000 levels) are
        // decoded, cloned and dropped on these threads: about 3.6 MiB of
        // stack at the deepest (release), more than tokio's 2 MiB. Only
        // the pages a deep object touches are resident.
        .thread_stack_size(16 * 1024 * 1024)
        .enable_all()
        .build()
}
