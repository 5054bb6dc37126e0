//! The controller (`rbac-rules run`): keeps the cluster equal to what its
//! RbacRule objects say.
//!
//! - [`world`]: the index of what the cluster holds (pure, fed by events);
//! - [`watch`]: the watches (rules, the output kinds, the kinds rules read)
//!   that feed it;
//! - [`sync`]: one reconcile — evaluate ([`crate::engine`]), [`plan`] (pure
//!   diff), [`apply`] (writes), [`status`] (conditions and Events);
//! - [`metrics`]: Prometheus metrics and health endpoints;
//! - [`leader`]: Lease-based leader election.
//!
//! The control loop below owns the caches, debounces watch events into one
//! reconcile and writes only while this replica leads.

pub mod apply;
mod error;
pub mod leader;
pub mod live;
pub mod metrics;
pub mod plan;
pub mod status;
pub mod sync;
pub mod tenants;
pub mod watch;
pub mod wire;
pub mod world;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::Client;
use tokio::sync::mpsc;
use tokio::sync::watch::{self as signal, Receiver};
use tokio::time::Instant;

pub use error::Error;

use crate::api::ManageLevel;
use apply::Gate;
use live::ObjectId;
use metrics::Metrics;
use sync::Syncer;
use watch::Watches;
use world::World;

/// Settings of `rbac-rules run`.
#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    /// Highest manage level of rules to run: serviceaccounts, basic or all.
    #[arg(long, env = "RBAC_RULES_MANAGE", default_value = "all", value_parser = crate::parse_manage)]
    pub manage: ManageLevel,
    /// Address of the /metrics, /healthz and /readyz server.
    #[arg(
        long,
        env = "RBAC_RULES_METRICS_ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_address: std::net::SocketAddr,
    /// Elect a leader through a Lease so that only one replica writes.
    #[arg(long, env = "RBAC_RULES_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Namespace of the leader election Lease (default: the pod's namespace).
    #[arg(long, env = "RBAC_RULES_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Name of the leader election Lease.
    #[arg(long, env = "RBAC_RULES_LEASE_NAME", default_value = "rbac-rules")]
    pub lease_name: String,
    /// A ClusterRole whose rules are the allow-list: no emitted role may
    /// grant more. Unset: no allow-list.
    #[arg(long, env = "RBAC_RULES_ALLOW_CLUSTERROLE")]
    pub allow_clusterrole: Option<String>,
    /// Delay from the first watch event of a burst to the reconcile, in
    /// milliseconds: a burst of events becomes one evaluation.
    #[arg(long, env = "RBAC_RULES_DEBOUNCE_MS", default_value_t = 300)]
    pub debounce_ms: u64,
    /// Seconds between reconciles of the cached state when nothing happens
    /// (a no-op resync sends no request).
    #[arg(long, env = "RBAC_RULES_RESYNC_SECONDS", default_value_t = 300)]
    pub resync_seconds: u64,
    /// Seconds between discovery retries for kinds rules read that the API
    /// server does not serve yet.
    #[arg(long, env = "RBAC_RULES_REDISCOVERY_SECONDS", default_value_t = 30)]
    pub rediscovery_seconds: u64,
    /// Identity in the Lease and in Events (default: $POD_NAME, then
    /// $HOSTNAME).
    #[arg(long, env = "RBAC_RULES_IDENTITY")]
    pub identity: Option<String>,
    /// Also take over existing objects that have no controller and whose
    /// names equal desired outputs (e.g. roles a Helm chart installed;
    /// those get `helm.sh/resource-policy: keep`). Objects controlled by an
    /// output's own trigger are adopted without it; objects controlled by
    /// anything else never. Every adopted object is marked
    /// `rbacrules.io/adopted` and never pruned.
    #[arg(long, env = "RBAC_RULES_ADOPT_EXISTING", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub adopt_existing: bool,
    /// Writes (applies and deletes) in flight at once. Roles are still
    /// written before the bindings that name them, binding deletes before
    /// role deletes; 429s are retried as the API server's `Retry-After`
    /// says.
    #[arg(long, env = "RBAC_RULES_MAX_CONCURRENT_WRITES", default_value_t = apply::DEFAULT_MAX_CONCURRENT_WRITES, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub max_concurrent_writes: usize,
    /// Seconds a rule may take in the main evaluation. A rule that takes
    /// longer moves to the slow lane (until its spec changes): evaluated on
    /// its own thread with the full limits while the main pass writes
    /// every other rule's objects at once; its objects, and those of the
    /// rules reading what it emits, are written when it is done.
    #[arg(long, env = "RBAC_RULES_SLOW_RULE_SECONDS", default_value_t = DEFAULT_SLOW_RULE_SECONDS, value_parser = parse_lane_seconds)]
    pub slow_rule_seconds: f64,
    /// Most objects one rule may prune in one pass without confirmation:
    /// more are held (nothing deleted), reported on the rule (`Degraded`,
    /// reason `PruneHeld`, and an Event) with the token that confirms them
    /// (`kubectl annotate rbacrule NAME rbacrules.io/confirm-prune=TOKEN`).
    /// Revocations (policy refusals) are never held.
    #[arg(long, env = "RBAC_RULES_MAX_UNCONFIRMED_PRUNES", default_value_t = plan::DEFAULT_MAX_UNCONFIRMED_PRUNES)]
    pub max_unconfirmed_prunes: usize,
    /// Default denials to switch off.
    #[command(flatten)]
    pub waivers: crate::policy::Waivers,
    /// Evaluation limits.
    #[command(flatten)]
    pub limits: crate::engine::Limits,
    /// Settings rules read as `params.<name>`.
    #[command(flatten)]
    pub params: crate::params::ParamArgs,
    /// What tenant rules (NamespacedRbacRules) may read, and their ceiling.
    #[command(flatten)]
    pub tenancy: crate::engine::tenant::Tenancy,
}

impl RunArgs {
    /// The settings that change a plan (what `diff` shares with `run`).
    pub fn plan_settings(&self) -> sync::PlanSettings {
        let mut settings = sync::PlanSettings::of(
            self.manage,
            self.adopt_existing,
            &self.waivers,
            &self.limits,
            &self.params,
        );
        settings.max_unconfirmed_prunes = Some(self.max_unconfirmed_prunes);
        settings.tenancy = self.tenancy.clone();
        settings
    }
}

/// Default of `--slow-rule-seconds`.
pub const DEFAULT_SLOW_RULE_SECONDS: f64 = 1.0;

fn parse_lane_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if !(v > 0.0 && v <= 86_400.0) {
        return Err("must be more than 0 and at most 86400".to_string());
    }
    Ok(v)
}

/// Longest wait before retrying failed writes.
const MAX_RETRY: Duration = Duration::from_secs(120);
/// First wait before retrying failed writes.
const FIRST_RETRY: Duration = Duration::from_secs(2);
/// Longest a pass waits for lists in progress to end.
const MAX_LIST_WAIT: Duration = Duration::from_secs(10);

/// Runs the controller until SIGTERM or ctrl-c.
pub async fn run(args: RunArgs) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let client = Client::try_default().await.map_err(Error::Client)?;
    let (stop_tx, stop_rx) = signal::channel(false);
    let signals = tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });
    let result = run_with(client, args, stop_rx).await;
    signals.abort();
    result.map_err(Into::into)
}

/// Runs the controller with a given client until `stop` turns true: serves
/// metrics and health, competes for the lease (when enabled), watches and
/// reconciles. On stop: no further writes, then the lease is released.
pub async fn run_with(client: Client, args: RunArgs, stop: Receiver<bool>) -> Result<(), Error> {
    let metrics = Metrics::new();
    let ready = Arc::new(AtomicBool::new(false));
    let server = metrics::serve(
        args.metrics_address,
        metrics.clone(),
        ready.clone(),
        wait_true(stop.clone()),
    )
    .await?;
    let server = tokio::spawn(server);

    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("POD_NAME").ok())
        .or_else(|| std::env::var("HOSTNAME").ok());
    let gate = Arc::new(Gate::new(!args.leader_election));
    // Close the gate the moment stop is asked: a reconcile in flight stops
    // between two writes instead of finishing.
    let stopper = {
        let gate = gate.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            wait_true(stop).await;
            gate.stop();
        })
    };
    let lease = if args.leader_election {
        let namespace = args
            .lease_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        Some(
            leader::Lease::start(
                client.clone(),
                &namespace,
                &args.lease_name,
                identity.clone(),
            )
            .await?,
        )
    } else {
        metrics.leader.set(1);
        None
    };

    let ctx = Ctx {
        args: &args,
        client,
        metrics,
        gate: gate.clone(),
        ready,
        identity,
    };
    let result = control_loop(ctx, lease.as_ref().map(leader::Lease::receiver), stop).await;
    // Stop writing first, then give the lease back.
    gate.stop();
    stopper.abort();
    if let Some(l) = lease {
        l.release().await;
    }
    let _ = server.await;
    result
}

async fn wait_true(mut rx: Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; ctrl-c only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// What the control loop works with, set up once by [`run_with`].
struct Ctx<'a> {
    args: &'a RunArgs,
    client: Client,
    metrics: Metrics,
    /// Closed while not leading or when stopping: no write passes it.
    gate: Arc<Gate>,
    /// Set once the initial sync is done (/readyz).
    ready: Arc<AtomicBool>,
    /// Identity in Events.
    identity: Option<String>,
}

/// An empty world and the watches that feed it through `tx`: how `run`
/// and `diff` start observing the cluster.
pub fn observe(
    client: &Client,
    tx: mpsc::UnboundedSender<world::Feed>,
    manage: ManageLevel,
    allow_clusterrole: Option<String>,
) -> (World, Watches) {
    let watches = Watches::start(client.clone(), tx, manage, allow_clusterrole.as_deref());
    (World::new(allow_clusterrole), watches)
}

/// The control loop: feed watch events into the world, reconcile after a
/// quiet period, resync and rediscover periodically, follow leadership.
async fn control_loop(
    ctx: Ctx<'_>,
    mut leader: Option<Receiver<bool>>,
    stop: Receiver<bool>,
) -> Result<(), Error> {
    // Unbounded: every watch task keeps reading its stream whatever the
    // loop does, so the API server never closes a watch as unresponsive.
    // The loop itself goes on applying events to the world while a write
    // pass runs beside it (the queue stays short), and the pass reports
    // what each write did through the same queue.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let learned = tx.clone();
    let (mut world, watches) = observe(
        &ctx.client,
        tx,
        ctx.args.manage,
        ctx.args.allow_clusterrole.clone(),
    );
    world.tenancy = ctx.args.tenancy.clone();
    let mut resync = ticker(ctx.args.resync_seconds);
    let mut rediscovery = ticker(ctx.args.rediscovery_seconds);
    let mut l = Loop::new(ctx, world, watches, learned);

    loop {
        let wake = l
            .due
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            _ = wait_true(stop.clone()), if !l.stopping => {
                if l.running.is_none() {
                    break;
                }
                l.stopping = true;
            }
            feed = rx.recv() => {
                let Some(feed) = feed else { break };
                l.take_in(feed).await;
            }
            // Never plan over a queue holding what a finished pass learned
            // (or any event): the plan would see those objects as missing
            // or stale and write them again.
            _ = tokio::time::sleep_until(wake), if l.due.is_some() && l.running.is_none() && rx.is_empty() => {
                l.on_due();
            }
            finished = slow_lane_done(&mut l.slow.running), if l.slow.running.is_some() => {
                l.slow_lane_evaluated(finished);
            }
            _ = std::future::ready(()), if l.slow_lane_writable() && rx.is_empty() => {
                l.write_slow_lane();
            }
            done = pass_done(&mut l.running), if l.running.is_some() => {
                if l.pass_ended(done) {
                    break;
                }
            }
            _ = resync.tick() => {
                l.due.get_or_insert_with(Instant::now);
            }
            _ = rediscovery.tick(), if l.world.has_unresolved() => {
                l.rediscover().await;
            }
            changed = leader_changed(&mut leader) => {
                l.follow_leader(changed)?;
            }
        }
    }
    drop(l);
    Ok(())
}

/// A timer ticking every `seconds` (at least one); a late tick delays the
/// next ones rather than bursting.
fn ticker(seconds: u64) -> tokio::time::Interval {
    let mut t = tokio::time::interval(Duration::from_secs(seconds.max(1)));
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// The running pass's end (never, while none runs).
async fn pass_done(running: &mut Option<RunningPass>) -> Result<PassDone, tokio::task::JoinError> {
    match running.as_mut() {
        Some(pass) => pass.await,
        None => std::future::pending().await,
    }
}

/// The slow lane's run's end (never, while none runs).
async fn slow_lane_done(
    running: &mut Option<tokio::sync::oneshot::Receiver<SlowDone>>,
) -> Result<SlowDone, tokio::sync::oneshot::error::RecvError> {
    match running.as_mut() {
        Some(rx) => rx.await,
        None => std::future::pending().await,
    }
}

/// The next change of leadership (never, without leader election); an
/// error when the lease task ended.
async fn leader_changed(
    leader: &mut Option<Receiver<bool>>,
) -> Result<bool, signal::error::RecvError> {
    match leader.as_mut() {
        Some(rx) => rx.changed().await.map(|_| *rx.borrow()),
        None => std::future::pending().await,
    }
}

/// What the control loop keeps between its turns: the world and its
/// watches, the syncer and the pass it writes, the slow lane, and when
/// the next pass is due.
struct Loop<'a> {
    ctx: Ctx<'a>,
    settings: sync::PlanSettings,
    world: World,
    watches: Watches,
    /// Where a write pass reports what each write did (the watches' queue).
    learned: mpsc::UnboundedSender<world::Feed>,
    slow: SlowLaneRuns,
    /// The syncer while no pass holds it: it is lent to the running pass
    /// (a task of its own, beside the loop) and comes back with its report.
    idle: Option<Syncer>,
    running: Option<RunningPass>,
    /// Asked to stop while a pass runs: the pass finishes first (the gate
    /// is closed, so it sends nothing more) — never cut between the delete
    /// and the apply of a re-created binding.
    stopping: bool,
    debounce: Duration,
    /// When the next pass is due.
    due: Option<Instant>,
    /// Since when a due pass has waited for lists in progress.
    list_wait: Option<Instant>,
    /// The wait before failed writes are retried (doubled up to
    /// [`MAX_RETRY`] while they keep failing).
    retry: Duration,
}

impl<'a> Loop<'a> {
    fn new(
        ctx: Ctx<'a>,
        world: World,
        watches: Watches,
        learned: mpsc::UnboundedSender<world::Feed>,
    ) -> Self {
        let settings = ctx.args.plan_settings();
        let debounce = Duration::from_millis(ctx.args.debounce_ms);
        let mut l = Loop {
            ctx,
            settings,
            world,
            watches,
            learned,
            slow: SlowLaneRuns::default(),
            idle: None,
            running: None,
            stopping: false,
            debounce,
            due: None,
            list_wait: None,
            retry: FIRST_RETRY,
        };
        l.idle = Some(l.new_syncer());
        l
    }

    fn new_syncer(&self) -> Syncer {
        let ctx = &self.ctx;
        Syncer::planning(
            ctx.client.clone(),
            &self.settings,
            ctx.metrics.clone(),
            ctx.gate.clone(),
            ctx.identity.clone(),
        )
        .max_concurrent_writes(ctx.args.max_concurrent_writes)
        .with_slow_lane(ctx.args.slow_rule_seconds)
    }

    /// Makes a pass due a debounce from now, unless one is due already:
    /// debounced from the first event of a burst, so the latency is
    /// bounded even under a steady stream of events.
    fn due_soon(&mut self) {
        let debounce = self.debounce;
        self.due.get_or_insert_with(|| Instant::now() + debounce);
    }

    /// Applies a watch event (or what a write learned) to the world: a
    /// change of the rules starts and stops watches, any change makes a
    /// pass due.
    async fn take_in(&mut self, feed: world::Feed) {
        let change = self.world.apply(feed);
        if change.lost_kind {
            self.watches.stop_unwatched(&self.world);
        }
        if change.rules {
            self.watches.reconcile_kinds(&mut self.world).await;
            self.ctx
                .metrics
                .watched_kinds
                .set(self.world.watched_kinds() as i64);
        }
        if change.dirty || change.rules {
            self.due_soon();
        }
    }

    /// Kinds the API server did not serve are looked up again; one found
    /// makes a pass due.
    async fn rediscover(&mut self) {
        if self.watches.rediscover(&mut self.world).await {
            self.ctx
                .metrics
                .watched_kinds
                .set(self.world.watched_kinds() as i64);
            self.due_soon();
        }
    }

    /// A pass is due: once lists in progress ended, the initial sync is
    /// done and this replica may write, the main pass is planned and
    /// started.
    fn on_due(&mut self) {
        if self.waits_for_lists() {
            return;
        }
        self.due = None;
        if !self.world.base_synced() {
            return;
        }
        if self.world.kinds_settled() && !self.ctx.ready.swap(true, Ordering::SeqCst) {
            tracing::info!(
                kinds = self.world.watched_kinds(),
                rules = self.world.rules.len(),
                "initial sync done"
            );
        }
        if !self.ctx.gate.open() {
            return;
        }
        let Some(syncer) = self.idle.take() else {
            return;
        };
        self.start_main_pass(syncer);
    }

    /// Whether the due pass waits for lists in progress (putting itself
    /// off): it blocks the loop while it plans, and one planned while lists
    /// stream in (a relist of every watch) would leave them queued, a
    /// second copy of every object listed. It waits for their end (which
    /// asks for a pass), [`MAX_LIST_WAIT`] at most.
    fn waits_for_lists(&mut self) -> bool {
        if !self.world.listing() {
            self.list_wait = None;
            return false;
        }
        if self.list_wait.get_or_insert_with(Instant::now).elapsed() < MAX_LIST_WAIT {
            self.due = Some(Instant::now() + self.debounce.max(Duration::from_millis(50)));
            return true;
        }
        false
    }

    /// Plans the main pass and starts writing it beside the loop; a run
    /// of the slow lane goes with it. A plan that keeps packed objects is
    /// dropped and made again.
    fn start_main_pass(&mut self, mut syncer: Syncer) {
        let (pass, holds) = self.prepare_main(&mut syncer);
        // What the plan found equal needs no rules of its own.
        self.world.shed_rules();
        self.slow.start(&mut self.world, self.ctx.args, &holds);
        // Objects no desired copy stands for are judged on their own
        // bodies: unpacked, and judged in the next pass.
        // But the slow lane's Roles (see `World::unpack_held_for_main`).
        let main_reads = |id: &ObjectId, rule: Option<&String>| {
            !world::lane_role(id, rule.and_then(|r| holds.get(r)))
        };
        if unpack_kept(&mut self.world, pass.plan(), main_reads) {
            // Policy and the rules reading the kind see them only in the
            // next evaluation: this pass is planned without them (it might
            // narrow what a reader copies), so it is dropped and planned
            // again.
            self.idle = Some(syncer);
            self.due = Some(Instant::now());
            return;
        }
        let held = holds.len();
        self.spawn_pass(syncer, pass, held, true);
    }

    /// Evaluates and plans the main pass, and the holds it was planned
    /// with. A rule past `--slow-rule-seconds` goes to the slow lane, and
    /// the pass is evaluated again without it: no rule's output, and no
    /// policy judgment, comes from an evaluation in which a slow rule was
    /// cut off by the lane.
    fn prepare_main(
        &mut self,
        syncer: &mut Syncer,
    ) -> (sync::Pass, std::collections::BTreeMap<String, status::Hold>) {
        let allow = self.world.allow_rules();
        let mut holds = self.world.holds();
        self.world.unpack_held_for_main(&holds);
        let (pass, seen) = loop {
            let seen = self.world.store.version();
            let pass = syncer.prepare(&self.world.snapshot(allow.as_ref(), &holds));
            if pass.slow_rules().is_empty() {
                break (pass, seen);
            }
            let moved = pass.slow_rules().to_vec();
            tracing::info!(rules = ?moved, seconds = self.ctx.args.slow_rule_seconds, "slow rules moved to the slow lane");
            self.world.move_to_slow_lane(moved.iter().cloned());
            holds = self.world.holds();
            if !moved
                .iter()
                .any(|r| holds.get(r).is_some_and(status::Hold::is_slow_lane))
            {
                break (pass, seen);
            }
            // Not written: its outputs go before the next evaluation
            // makes its own (two whole evaluations were held at once).
            drop(pass);
            self.world.unpack_held_for_main(&holds);
        };
        // The main engine's memo has read the journal this far, and
        // nothing else reads it (the slow lane follows the store by its
        // shared indexes, with a journal of its own).
        self.world.store.forget_through(seen);
        (pass, holds)
    }

    /// Starts writing `pass` beside the loop; what each write did comes
    /// back through the watches' queue, the syncer with the report.
    /// `main`: the main pass, not the slow lane's.
    fn spawn_pass(&mut self, mut syncer: Syncer, pass: sync::Pass, held: usize, main: bool) {
        let learned = self.learned.clone();
        self.running = Some(tokio::spawn(async move {
            let learn = move |l: apply::Learned| {
                let _ = learned.send(world::Feed::Learned(l));
            };
            let report = syncer.write(pass, Some(&learn)).await;
            PassDone {
                syncer,
                report,
                held,
                main,
            }
        }));
    }

    /// The slow lane's evaluation ended: its result waits to be written,
    /// and a run asked for meanwhile starts.
    fn slow_lane_evaluated(
        &mut self,
        finished: Result<SlowDone, tokio::sync::oneshot::error::RecvError>,
    ) {
        self.slow.running = None;
        match finished {
            Ok(done) => {
                tracing::info!(rules = ?done.lane, seconds = done.took.as_secs_f64(), "slow lane evaluated");
                self.slow.state = Some(done.state);
                if self.slow.drop_stale(done.main_writes) {
                    // Planned from held rules' objects a main pass has
                    // since written: evaluated again before any write.
                    self.slow.again = true;
                } else {
                    self.slow.ready = Some((done.evaluation, done.lane, done.main_writes));
                }
            }
            Err(_) => tracing::error!("the slow lane's evaluation ended without a result"),
        }
        if std::mem::take(&mut self.slow.again) {
            let holds = self.world.holds();
            self.slow.start(&mut self.world, self.ctx.args, &holds);
        }
    }

    /// Whether the slow lane's result can be written now (besides an
    /// empty queue): no pass runs, none stops it, and the view is whole.
    fn slow_lane_writable(&self) -> bool {
        self.slow.ready.is_some()
            && self.running.is_none()
            && !self.stopping
            && self.ctx.gate.open()
            && self.idle.is_some()
            && self.world.base_synced()
            && !self.world.listing()
    }

    /// Plans the slow lane's result against the live objects as they are
    /// now, and writes it like a pass of its own.
    fn write_slow_lane(&mut self) {
        let Some((evaluation, lane, main_writes)) = self.slow.ready.take() else {
            return;
        };
        if self.slow.drop_stale(main_writes) {
            let holds = self.world.holds();
            self.slow.start(&mut self.world, self.ctx.args, &holds);
            return;
        }
        let Some(mut syncer) = self.idle.take() else {
            return;
        };
        let holds = self.world.holds();
        // Rules that left the lane since (edited, deleted, waiting for a
        // list) are held: the main pass has them now.
        let lane: std::collections::BTreeSet<String> = lane
            .into_iter()
            .filter(|r| holds.get(r).is_some_and(status::Hold::is_slow_lane))
            .collect();
        if lane.is_empty() {
            self.idle = Some(syncer);
            return;
        }
        let allow = self.world.allow_rules();
        let snapshot = self.world.snapshot(allow.as_ref(), &holds);
        let pass = syncer.prepare_slow(evaluation, &snapshot, &lane);
        self.world.shed_rules();
        let of_lane = |_: &ObjectId, r: Option<&String>| r.is_some_and(|r| lane.contains(r));
        if unpack_kept(&mut self.world, pass.plan(), of_lane) {
            // As for the main pass: policy judges them in the slow lane's
            // next evaluation, planned then.
            self.idle = Some(syncer);
            self.slow.start(&mut self.world, self.ctx.args, &holds);
            return;
        }
        let held = self.world.rules.len() - lane.len();
        self.spawn_pass(syncer, pass, held, false);
    }

    /// A write pass ended: the syncer is back (a new one if the pass
    /// panicked), and failed writes are retried after a wait that grows
    /// while they keep failing. Whether the loop ends (stop was asked).
    fn pass_ended(&mut self, done: Result<PassDone, tokio::task::JoinError>) -> bool {
        self.running = None;
        let PassDone {
            syncer,
            report,
            held,
            main,
        } = match done {
            Ok(done) => done,
            Err(e) => {
                // The pass panicked: start afresh, retry soon.
                tracing::error!(error = %e, "write pass failed");
                self.idle = Some(self.new_syncer());
                self.due = Some(Instant::now() + self.retry);
                return self.stopping;
            }
        };
        self.idle = Some(syncer);
        log_report(&report, held);
        if main && report.outcomes.iter().any(apply::Outcome::is_write) {
            self.slow.main_wrote();
        }
        if self.stopping {
            return true;
        }
        if report.retry {
            self.due = Some(Instant::now() + self.retry);
            self.retry = (self.retry * 2).min(MAX_RETRY);
        } else {
            self.retry = FIRST_RETRY;
        }
        false
    }

    /// Leadership changed: writes follow it, and a new leader reconciles
    /// everything at once. The lease task's end is an error: this replica
    /// can never lead again.
    fn follow_leader(
        &mut self,
        changed: Result<bool, signal::error::RecvError>,
    ) -> Result<(), Error> {
        let ctx = &self.ctx;
        match changed {
            Ok(is_leader) => {
                ctx.gate.set_leader(is_leader);
                ctx.metrics.leader.set(i64::from(is_leader));
                if is_leader {
                    tracing::info!("became leader: reconciling everything");
                    self.due = Some(Instant::now());
                } else {
                    tracing::warn!("lost leadership: writes stopped");
                }
                Ok(())
            }
            Err(_) => {
                ctx.gate.set_leader(false);
                ctx.metrics.leader.set(0);
                tracing::error!("leader election stopped");
                Err(Error::LeaseLost)
            }
        }
    }
}

/// Unpacks the live objects a plan keeps for the rules `of_scope` says
/// (a deferred prune is no keep: it goes once the view is whole); whether
/// any was packed.
fn unpack_kept(
    world: &mut World,
    planned: &plan::Plan,
    of_scope: impl Fn(&ObjectId, Option<&String>) -> bool,
) -> bool {
    let kept = planned
        .kept
        .iter()
        .filter(|k| k.2 != plan::KeepReason::PruneDeferred && of_scope(&k.0, k.1.as_ref()));
    world.unpack(kept.map(|(id, _, _)| id))
}

/// A write pass running beside the loop.
type RunningPass = tokio::task::JoinHandle<PassDone>;

/// What a write pass gives back.
struct PassDone {
    syncer: Syncer,
    report: sync::SyncReport,
    /// How many rules were held.
    held: usize,
    /// Whether it was the main pass (not the slow lane's).
    main: bool,
}

/// What the slow lane's thread gives back.
struct SlowDone {
    state: sync::SlowLane,
    evaluation: crate::engine::Evaluation,
    /// The rules it evaluated.
    lane: std::collections::BTreeSet<String>,
    took: Duration,
    /// [`SlowLaneRuns::main_writes`] when it started.
    main_writes: u64,
}

/// The slow lane's runs, as the control loop keeps them (see
/// [`sync::SlowLane`]): at most one at a time, on a thread of its own.
#[derive(Default)]
struct SlowLaneRuns {
    /// The evaluation state while no run holds it.
    state: Option<sync::SlowLane>,
    /// The run in progress.
    running: Option<tokio::sync::oneshot::Receiver<SlowDone>>,
    /// A main pass started while a run was in progress: run again after.
    again: bool,
    /// The last result, until it is planned and written, with
    /// [`SlowLaneRuns::main_writes`] when its run started.
    ready: Option<(
        crate::engine::Evaluation,
        std::collections::BTreeSet<String>,
        u64,
    )>,
    /// Main passes that wrote something: the lane reads the held rules'
    /// objects as they are live, so a result planned before such a pass
    /// may copy what it has since replaced.
    main_writes: u64,
    /// Results dropped in a row as stale (see [`SlowLaneRuns::drop_stale`]).
    dropped: u32,
}

/// Stale results the lane drops in a row at most: past it one is written
/// (a later run corrects it), so that main passes that keep writing do
/// not starve the lane's rules.
const MAX_STALE_DROPS: u32 = 3;

impl SlowLaneRuns {
    /// A main pass wrote objects.
    fn main_wrote(&mut self) {
        self.main_writes += 1;
    }

    /// Whether a result whose run started at `main_writes` is to be
    /// dropped: a main pass wrote since, and fewer than
    /// [`MAX_STALE_DROPS`] results were dropped in a row.
    fn drop_stale(&mut self, main_writes: u64) -> bool {
        if main_writes == self.main_writes || self.dropped >= MAX_STALE_DROPS {
            self.dropped = 0;
            return false;
        }
        self.dropped += 1;
        true
    }

    /// Starts a run of the slow lane over the world as it is, if some rule
    /// is in the lane; after a run in progress when there is one. Every
    /// main pass asks for one: what it re-plans (live objects edited,
    /// failed writes) is what the slow lane's plan needs too, and with
    /// nothing changed the run renders nothing.
    /// `holds`: the world's, as [`World::holds`] computed them just now.
    fn start(
        &mut self,
        world: &mut World,
        args: &RunArgs,
        holds: &std::collections::BTreeMap<String, status::Hold>,
    ) {
        let lane: std::collections::BTreeSet<String> = holds
            .iter()
            .filter(|(_, h)| h.is_slow_lane())
            .map(|(n, _)| n.clone())
            .collect();
        if lane.is_empty() {
            if world.listing() {
                // Its rules may only wait for a list (a relist of every
                // watch when the API server comes back): what it kept
                // (engine, memo, store) stays, or it would render all
                // again after, a second whole working set beside the main
                // pass's. Not a reason to wait for the lists to run: a
                // watch that keeps failing (a kind not served) keeps a
                // list in progress for good.
                return;
            }
            // No slow rule: nothing kept for one.
            self.state = None;
            self.ready = None;
            return;
        }
        if self.running.is_some() {
            self.again = true;
            return;
        }
        // Every other rule is held: their live objects are what exists,
        // for the rules of the lane and for policy.
        let others: std::collections::BTreeMap<String, status::Hold> = world
            .rules
            .keys()
            .filter(|r| !lane.contains(*r))
            .map(|r| (r.clone(), status::Hold::SlowLane(String::new())))
            .collect();
        world.unpack_held(&others);
        let options = crate::engine::Options {
            manage: args.manage,
            allow: world.allow_rules(),
            held: others.into_keys().collect(),
            waivers: args.waivers.clone(),
            limits: sync::split_totals(&args.limits).1,
            params: args.params.map(),
            param_origins: args.params.origins(),
            tenancy: args.tenancy.clone(),
            ..crate::engine::Options::default()
        };
        let mut state = self.state.take().unwrap_or_default();
        // The world's store as it is now, shared (each kind's index copy
        // on write): no copy of it, and the lane's journal names only what
        // changed since its last run.
        state.store.follow(&world.store);
        let rules = world.rules.clone();
        let main_writes = self.main_writes;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("rbac-rules-slow-lane".to_string())
            .spawn(move || {
                let started = std::time::Instant::now();
                let evaluation = state.evaluate(&rules, options);
                let _ = tx.send(SlowDone {
                    state,
                    evaluation,
                    lane,
                    took: started.elapsed(),
                    main_writes,
                });
            });
        match spawned {
            Ok(_) => self.running = Some(rx),
            Err(e) => tracing::error!(error = %e, "cannot start the slow lane's thread"),
        }
    }
}

fn log_report(report: &sync::SyncReport, held: usize) {
    let applied = report.outcomes.iter().filter(|o| o.is_applied()).count();
    let deleted = report
        .outcomes
        .iter()
        .filter(|o| matches!(o, apply::Outcome::Deleted | apply::Outcome::Revoked(_)))
        .count();
    if report.plan.is_empty() && report.status_patches == 0 {
        tracing::debug!(
            unchanged = report.plan.unchanged.len(),
            held,
            "reconciled: no changes"
        );
    } else {
        tracing::info!(
            applied,
            deleted,
            unchanged = report.plan.unchanged.len(),
            kept = report.plan.kept.len(),
            status_patches = report.status_patches,
            held,
            "reconciled"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rbac-rules run`'s settings as parsed with no flag.
    fn run_args() -> RunArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        <Cli as clap::Parser>::try_parse_from(["run"])
            .expect("defaults")
            .run
    }

    #[test]
    fn the_slow_lane_keeps_its_state_while_its_rules_wait_for_a_list() {
        let mut world = World::new(None);
        world.apply(world::Feed::Rules(Box::new(
            kube::runtime::watcher::Event::Init,
        )));
        assert!(world.listing());
        let mut lane = SlowLaneRuns {
            state: Some(sync::SlowLane::default()),
            ..SlowLaneRuns::default()
        };
        let args = run_args();
        // Its rule waits for the list (no slow-lane hold now): kept all
        // the same.
        lane.start(&mut world, &args, &std::collections::BTreeMap::new());
        assert!(lane.state.is_some() && lane.running.is_none());
        // The list ends: the lane forgets what no slow rule needs.
        world.apply(world::Feed::Rules(Box::new(
            kube::runtime::watcher::Event::InitDone,
        )));
        assert!(!world.listing());
        lane.start(&mut world, &args, &std::collections::BTreeMap::new());
        assert!(lane.state.is_none());
        // A list that does not end (a watch that keeps failing) does not
        // keep a slow rule from its run.
        world.apply(world::Feed::Rules(Box::new(
            kube::runtime::watcher::Event::Init,
        )));
        let holds = std::collections::BTreeMap::from([(
            "slow".to_string(),
            status::Hold::SlowLane("slow".into()),
        )]);
        lane.start(&mut world, &args, &holds);
        assert!(lane.running.is_some());
    }

    #[test]
    fn a_slow_lane_result_planned_before_a_main_pass_wrote_is_dropped_a_few_times_at_most() {
        let mut lane = SlowLaneRuns::default();
        // Nothing written since the run started: written.
        assert!(!lane.drop_stale(0));
        // A main pass wrote since: dropped (evaluated again), and so
        // again while main passes keep writing, up to the bound.
        lane.main_wrote();
        for _ in 0..MAX_STALE_DROPS {
            assert!(lane.drop_stale(0));
        }
        // Past it one is written, and the count starts over.
        assert!(!lane.drop_stale(0));
        assert!(lane.drop_stale(0));
        // A run started after the last main write is fresh.
        assert!(!lane.drop_stale(lane.main_writes));
        assert!(lane.drop_stale(0));
    }
}
