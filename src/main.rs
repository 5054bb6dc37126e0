//! The `rbac-rules` command: `crd`, `render`, `run`, `diff`, ….

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use rbac_rules::controller::RunArgs;
use rbac_rules::diff::{ClusterArgs, DiffArgs};
use rbac_rules::render::RenderArgs;

/// `rbac-rules --version`: the crate version and the git revision built.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("RBAC_RULES_GIT_REVISION"),
    ")"
);

/// A rule-driven Kubernetes RBAC controller.
///
/// RbacRule objects say when (a trigger kind) and what (role and binding
/// templates); `run` keeps a cluster's RBAC equal to them, the other
/// commands work offline on YAML files. Data (YAML, JSON) goes to stdout;
/// errors, warnings and notes go to stderr.
#[derive(Parser, Debug)]
#[command(
    name = "rbac-rules",
    version = VERSION,
    about,
    long_about,
    after_help = "Examples:
  rbac-rules render --objects cluster.yaml
  rbac-rules validate --rules my-rules/ --objects crds.yaml
  rbac-rules test my-rules/tests
  rbac-rules explain rolebinding/db-owners -n team-a --objects cluster.yaml --rules my-rules/
  rbac-rules completion bash > /etc/bash_completion.d/rbac-rules

Docs: docs/cli.md (every command, flag and exit status)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Log format of the commands that log (`run`, `diff`).
#[derive(clap::Args, Debug, Clone, Copy)]
struct Logging {
    /// Log format.
    #[arg(long, env = "RBAC_RULES_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the RbacRule CustomResourceDefinition as YAML (or the
    /// NamespacedRbacRule one, or both).
    #[command(after_help = "Examples:
  rbac-rules crd > crds/rbacrules.rbacrules.io.yaml
  rbac-rules crd --namespaced > crds/namespacedrbacrules.rbacrules.io.yaml
  rbac-rules crd --all | kubectl apply -f -")]
    Crd {
        /// The NamespacedRbacRule CRD (tenant rules) instead.
        #[arg(long, conflicts_with = "all")]
        namespaced: bool,
        /// Both CRDs, as two documents of one stream.
        #[arg(long)]
        all: bool,
    },
    /// Run the engine offline on YAML files and print the objects it emits.
    #[command(after_help = "Examples:
  rbac-rules render --objects examples/
  rbac-rules render --rules rules/examples/any-crd --objects cluster.yaml --flatten
  kubectl get namespaces,crds -o yaml | rbac-rules render --rules my-rules/ --objects -
  rbac-rules render --rules my-rules/ --objects cluster.yaml --allow deploy/controller/allow-list.yaml -o json

Exit status: 0 rendered (warnings on stderr), 1 an invalid rule or input, an
evaluation error or a policy refusal (every error on stderr, nothing on stdout).")]
    Render(RenderArgs),
    /// Run the controller against a cluster (the current kubeconfig, or
    /// in-cluster config in a Pod).
    #[command(after_help = "Examples:
  rbac-rules run
  rbac-rules run --kubeconfig ~/.kube/staging --context admin@staging --leader-election=false
  rbac-rules run --allow-clusterrole rbac-rules:allow-list --log-format json

Exit status: 0 stopped by SIGTERM or ctrl-c, 1 the controller could not start
or stopped on an error. Every flag has an RBAC_RULES_* environment variable.")]
    Run {
        #[command(flatten)]
        cluster: ClusterArgs,
        #[command(flatten)]
        logging: Logging,
        #[command(flatten)]
        args: RunArgs,
    },
    /// Show what `run` would change in a cluster, without writing.
    #[command(after_help = "Examples:
  rbac-rules diff
  rbac-rules diff --context admin@staging --allow-clusterrole rbac-rules:allow-list

Exit status: 0 nothing would change, 1 something would, 2 error (as `diff`).")]
    Diff {
        #[command(flatten)]
        cluster: ClusterArgs,
        #[command(flatten)]
        logging: Logging,
        #[command(flatten)]
        args: DiffArgs,
    },
    /// Lint rule files offline: shapes, templates, helpers, verbs, kinds,
    /// field paths, duplicate names.
    Validate(rbac_rules::validate::ValidateArgs),
    /// Run rule tests (kind RbacRuleTest): expected objects, errors and
    /// access.
    Test(rbac_rules::ruletest::TestArgs),
    /// Explain a rendered object's origin, or what a subject may do.
    Explain(rbac_rules::explain::ExplainArgs),
    /// Print the ClusterRole the controller needs to watch the kinds a rule
    /// set reads (labelled to aggregate into the controller's role).
    #[command(after_help = "Examples:
  rbac-rules controller-role --rules my-rules/ --objects crds.yaml --name rbac-rules:acme-data
  rbac-rules controller-role --rules my-rules/ | kubectl apply -f -

Exit status: 0 printed, 1 a rule file is invalid.")]
    ControllerRole(ControllerRoleArgs),
    /// Print a shell completion script.
    #[command(after_help = "Examples:
  rbac-rules completion bash > ~/.local/share/bash-completion/completions/rbac-rules
  rbac-rules completion zsh > \"${fpath[1]}/_rbac-rules\"
  rbac-rules completion fish > ~/.config/fish/completions/rbac-rules.fish")]
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Arguments of `controller-role`.
#[derive(clap::Args, Debug)]
struct ControllerRoleArgs {
    /// Rule files or directories (`-`: stdin). Default: the built-in rules,
    /// with a note on stderr.
    #[arg(long, num_args = 1..)]
    rules: Vec<std::path::PathBuf>,
    /// YAML files or directories with the CustomResourceDefinitions of the
    /// kinds read (their plurals; without one a plural is guessed).
    #[arg(long, num_args = 1..)]
    objects: Vec<std::path::PathBuf>,
    /// Read directories recursively (like kubectl's -R).
    #[arg(short = 'R', long)]
    recursive: bool,
    /// Name of the ClusterRole.
    #[arg(long, default_value = "rbac-rules:rules")]
    name: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = rbac_rules::render::DataFormat::Yaml)]
    output: rbac_rules::render::DataFormat,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal (and never with NO_COLOR): logs written to
    // a file or a pipe stay plain text.
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
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
/// falls by about 1.5 MiB, and `render`'s two threads take as long. No
/// thread caches: each thread kept freed blocks of every size class for
/// itself; without them the controller's resident memory at `large` on a
/// real server is about 1 MiB less, for 10–20% more time in `render`.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; 57] = b"dirty_decay_ms:0,muzzy_decay_ms:0,narenas:1,tcache:false\0";

/// jemalloc's default decay (freed pages kept ten seconds for reuse) and
/// this thread's cache of freed blocks, for the batch commands (`render`,
/// `diff`, `test`, …): they run for seconds and exit, and returning every
/// freed page at once (the controller's [`MALLOC_CONF`]) cost `render` of
/// `large` most of its system time, a third of its whole (see
/// docs/performance.md). Their peak RSS is the same. The options read at
/// start stay the controller's, the long-running command, whose memory is
/// held to them; a batch command changes them here, before it allocates
/// much. Best effort: a setting refused leaves that one as it was.
fn batch_allocator() {
    use tikv_jemalloc_ctl::{arenas, raw};
    const DEFAULT_DECAY_MS: isize = 10_000;
    let arenas = arenas::narenas::read().unwrap_or(1);
    for i in 0..arenas {
        let name = format!("arena.{i}.dirty_decay_ms\0");
        // SAFETY: the value's type is the setting's (ssize_t).
        let _ = unsafe { raw::write(name.as_bytes(), DEFAULT_DECAY_MS) };
    }
    // SAFETY: as above, for arenas made later; and a bool for the cache.
    let _ = unsafe { raw::write(b"arenas.dirty_decay_ms\0", DEFAULT_DECAY_MS) };
    let _ = unsafe { raw::write(b"thread.tcache.enabled\0", true) };
    // The threads that parse YAML (src/yaml.rs) allocate as much as this
    // one: without their caches they contend for the one arena.
    rbac_rules::yaml::on_parser_thread(|| {
        // SAFETY: as above.
        let _ = unsafe { raw::write(b"thread.tcache.enabled\0", true) };
    });
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Run { .. }) {
        batch_allocator();
    }
    match cli.command {
        Command::Crd { namespaced, all } => print_crd(namespaced, all),
        Command::Render(mut args) => {
            init_logging(LogFormat::Text);
            if let Err(e) = args.params.read_environment() {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
            rbac_rules::render::main(&args)
        }
        Command::Diff {
            cluster,
            logging,
            mut args,
        } => {
            init_logging(logging.log_format);
            if let Err(e) = args.params.read_environment() {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
            diff(&cluster, &args)
        }
        Command::Validate(args) => rbac_rules::validate::main(&args),
        Command::Test(mut args) => {
            init_logging(LogFormat::Text);
            if let Err(e) = args.params.read_environment() {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
            rbac_rules::ruletest::main(&args)
        }
        Command::Explain(mut args) => {
            init_logging(LogFormat::Text);
            if let Err(e) = args.params.read_environment() {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
            rbac_rules::explain::main(&args)
        }
        Command::ControllerRole(args) => controller_role(&args),
        Command::Completion { shell } => completion(shell),
        Command::Run {
            cluster,
            logging,
            mut args,
        } => {
            init_logging(logging.log_format);
            // Settings are read once, before anything starts: a bad one
            // stops the controller here, with its name, not later.
            if let Err(e) = args.params.read_environment() {
                tracing::error!(error = %e, "cannot start");
                return ExitCode::FAILURE;
            }
            for (name, origin) in args.params.origins() {
                tracing::info!(param = %name, from = %origin.describe(&name), "param set");
            }
            run(cluster, args)
        }
    }
}

/// `crd`: the RbacRule CustomResourceDefinition as YAML, the
/// NamespacedRbacRule one, or both.
fn print_crd(namespaced: bool, all: bool) -> ExitCode {
    let text = if all {
        rbac_rules::crd_yaml()
            .and_then(|c| rbac_rules::namespaced_crd_yaml().map(|n| format!("{c}---\n{n}")))
    } else if namespaced {
        rbac_rules::namespaced_crd_yaml()
    } else {
        rbac_rules::crd_yaml()
    };
    print_or_fail(text)
}

/// Prints a command's text, or its error on stderr and fails.
fn print_or_fail(text: Result<String, impl std::fmt::Display>) -> ExitCode {
    match text {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `diff`: its own exit status, or 2 when it cannot start.
fn diff(cluster: &ClusterArgs, args: &DiffArgs) -> ExitCode {
    match runtime() {
        Ok(rt) => ExitCode::from(rt.block_on(rbac_rules::diff::run(args, cluster))),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::from(2)
        }
    }
}

/// `completion`: the shell's completion script on stdout.
fn completion(shell: clap_complete::Shell) -> ExitCode {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "rbac-rules", &mut script);
    use std::io::Write;
    match std::io::stdout().write_all(&script) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) is not an error worth a message.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `run`: the controller until it stops; a stop is logged and fails.
fn run(cluster: ClusterArgs, args: RunArgs) -> ExitCode {
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run_controller(cluster, args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "controller stopped");
            ExitCode::FAILURE
        }
    }
}

/// `run`: the controller on the client `--kubeconfig`/`--context` name,
/// or on the default one (kubeconfig, else in-cluster) as before.
async fn run_controller(
    cluster: ClusterArgs,
    args: RunArgs,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if cluster.is_default() {
        return rbac_rules::controller::run(args).await;
    }
    let client = cluster.client().await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let signals = tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });
    let result = rbac_rules::controller::run_with(client, args, stop_rx).await;
    signals.abort();
    result.map_err(Into::into)
}

/// SIGTERM (the kubelet stopping the Pod) or ctrl-c.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// `controller-role`: the ClusterRole for the kinds the rules read.
fn controller_role(args: &ControllerRoleArgs) -> ExitCode {
    let loaded =
        match rbac_rules::rules::load_for_command("controller-role", &args.rules, args.recursive) {
            Ok(l) => l,
            Err(errs) => {
                for e in errs {
                    eprintln!("error: {e}");
                }
                return ExitCode::FAILURE;
            }
        };
    let objects = match rbac_rules::yaml::load_tree(&args.objects, args.recursive) {
        Ok(d) => d.into_iter().map(|d| d.value).collect::<Vec<_>>(),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rules: Vec<_> = loaded.into_iter().map(|(_, r)| r).collect();
    let role = rbac_rules::rules::controller_role(&rules, &args.name, &objects);
    print_or_fail(args.output.write(std::slice::from_ref(&role)))
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
