//! The `rbac-rules-bench` command: the figures of render, the incremental
//! engine and the controller on a synthetic control plane
//! ([`rbac_rules_bench`]). Not shipped: build it from this repository.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};

/// Measure render, incremental and controller figures on a synthetic
/// control plane of the built-in rules' kinds (build with --release).
#[derive(Parser, Debug)]
#[command(
    name = "rbac-rules-bench",
    version,
    after_help = "Examples:
  cargo run -p rbac-rules-bench -- --scenario small --json
  cargo build --release --workspace && target/release/rbac-rules-bench --scenario large

docs/performance.md has the targets, the current figures and how to measure."
)]
struct Cli {
    /// Log format (the controller phase logs).
    #[arg(long, env = "RBAC_RULES_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(flatten)]
    args: rbac_rules_bench::BenchArgs,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    rbac_rules_bench::main(&cli.args)
}

/// The allocator and its options of the shipped binary (src/main.rs of
/// the root crate, which says why): the figures are the product's.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// As the shipped binary's `_rjem_malloc_conf`.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; 57] = b"dirty_decay_ms:0,muzzy_decay_ms:0,narenas:1,tcache:false\0";
