//! `rbac-rules diff`: what `rbac-rules run` would do to the cluster of the
//! current kubeconfig now, without writing anything.
//!
//! It observes with the controller's own watches until every kind has
//! listed, evaluates and plans with the controller's own [`Syncer`], and
//! looks up (GET only) the objects the plan would create, to tell a create
//! from an adoption or a conflict exactly as the writer would
//! ([`apply::adoption`]). Exit codes follow `kubectl diff`: 0 nothing would
//! change, 1 something would, 2 an error.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::api::ManageLevel;
use crate::controller::apply::{self, Gate};
use crate::controller::live::{Live, ObjectId, OwnedFields, is_ours};
use crate::controller::metrics::Metrics;
use crate::controller::plan::{ApplyAction, HeldPrunes, Plan, keep_helm_annotation, mark_adopted};
use crate::controller::sync::{PlanSettings, Syncer};
use crate::controller::watch::Watches;
use crate::controller::world::World;
use crate::engine::Evaluation;

/// Settings of `rbac-rules diff` (the subset of `run`'s that changes the
/// plan).
#[derive(clap::Args, Clone, Debug)]
pub struct DiffArgs {
    /// Highest manage level of rules to run: serviceaccounts, basic or all.
    #[arg(long, env = "RBAC_RULES_MANAGE", default_value = "all", value_parser = crate::parse_manage)]
    pub manage: ManageLevel,
    /// The allow-list ClusterRole, as for `run`.
    #[arg(long, env = "RBAC_RULES_ALLOW_CLUSTERROLE")]
    pub allow_clusterrole: Option<String>,
    /// Show what `run --adopt-existing` would do.
    #[arg(long, env = "RBAC_RULES_ADOPT_EXISTING", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub adopt_existing: bool,
    /// Seconds to wait for every watch to list.
    #[arg(long, default_value_t = 60)]
    pub timeout_seconds: u64,
    /// Default denials switched off, as for `run`.
    #[command(flatten)]
    pub waivers: crate::policy::Waivers,
    /// Evaluation limits, as for `run`.
    #[command(flatten)]
    pub limits: crate::engine::Limits,
    /// Settings rules read as `params.<name>`, as for `run`. Default: the
    /// installed controller's (see --installed-settings).
    #[command(flatten)]
    pub params: crate::params::ParamArgs,
    /// Deletions one rule may make in one pass before they are held, as
    /// for `run`. Default: the installed controller's, else 20.
    #[arg(long, env = "RBAC_RULES_MAX_UNCONFIRMED_PRUNES")]
    pub max_unconfirmed_prunes: Option<usize>,
    /// Read the installed controller's settings (params, allow-list,
    /// --max-unconfirmed-prunes) from its Deployment (labelled
    /// app.kubernetes.io/name=rbac-rules) and use them where the command
    /// line gives none; a setting given that differs is used, with a
    /// warning naming both values. `false`: the command line's only.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub installed_settings: bool,
    /// What tenant rules (NamespacedRbacRules) may read, and their
    /// ceiling, as for `run`.
    #[command(flatten)]
    pub tenancy: crate::engine::tenant::Tenancy,
}

impl DiffArgs {
    /// The settings that change a plan, as `run` builds them
    /// ([`crate::controller::RunArgs::plan_settings`]).
    pub fn plan_settings(&self) -> PlanSettings {
        let mut settings = PlanSettings::of(
            self.manage,
            self.adopt_existing,
            &self.waivers,
            &self.limits,
            &self.params,
        );
        settings.max_unconfirmed_prunes = self.max_unconfirmed_prunes;
        settings.tenancy = self.tenancy.clone();
        settings
    }

    /// The settings of `diff` given no flag (environment variables aside).
    pub fn defaults() -> Self {
        DiffArgs {
            manage: ManageLevel::All,
            allow_clusterrole: None,
            adopt_existing: false,
            timeout_seconds: 60,
            waivers: Default::default(),
            limits: Default::default(),
            params: Default::default(),
            max_unconfirmed_prunes: None,
            installed_settings: true,
            tenancy: Default::default(),
        }
    }

    /// These settings completed by the installed controller's: its params,
    /// allow-list and `--max-unconfirmed-prunes` where none is given, the
    /// given ones where they are (with a warning each where they differ).
    /// Returns the warnings.
    pub fn with_installed(&mut self, installed: &crate::installed::Installed) -> Vec<String> {
        let (params, mut warnings) = crate::installed::merge_params(&self.params.map(), installed);
        self.params = crate::params::ParamArgs {
            params: params.into_iter().collect(),
            env: Vec::new(),
        };
        let (allow, w) =
            crate::installed::merge_allow(self.allow_clusterrole.as_deref(), installed);
        self.allow_clusterrole = allow;
        warnings.extend(w);
        match (self.max_unconfirmed_prunes, installed.max_unconfirmed_prunes) {
            (Some(g), Some(i)) if g != i => warnings.push(format!(
                "--max-unconfirmed-prunes {g} differs from the installed controller's {i} (Deployment {}); using {g}",
                installed.deployment
            )),
            (None, i) => self.max_unconfirmed_prunes = i,
            _ => {}
        }
        if let Some(m) = &installed.manage
            && crate::parse_manage(m).ok() != Some(self.manage)
        {
            warnings.push(format!(
                "--manage {} differs from the installed controller's {m} (Deployment {}); using {}",
                self.manage.as_str(),
                installed.deployment,
                self.manage.as_str()
            ));
        }
        warnings.extend(crate::installed::unknown_notes(installed));
        warnings
    }
}

/// Which cluster a command talks to, as kubectl's flags say it.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ClusterArgs {
    /// The kubeconfig file. Default: $KUBECONFIG, ~/.kube/config, or the
    /// Pod's service account in a cluster.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use. Default: its current context.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl ClusterArgs {
    /// Whether neither flag is given (the client is then kube's default).
    pub fn is_default(&self) -> bool {
        self.kubeconfig.is_none() && self.context.is_none()
    }

    /// A client for the cluster these flags name.
    pub async fn client(&self) -> Result<Client, DiffError> {
        if self.is_default() {
            return Client::try_default()
                .await
                .map_err(|e| DiffError::Controller(crate::controller::Error::Client(e)));
        }
        let options = kube::config::KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match &self.kubeconfig {
            Some(path) => {
                let file = kube::config::Kubeconfig::read_from(path)
                    .map_err(|e| DiffError::Config(format!("{}: {e}", path.display())))?;
                kube::Config::from_custom_kubeconfig(file, &options).await
            }
            None => kube::Config::from_kubeconfig(&options).await,
        }
        .map_err(|e| DiffError::Config(e.to_string()))?;
        Client::try_from(config)
            .map_err(|e| DiffError::Controller(crate::controller::Error::Client(e)))
    }
}

/// Why `diff` could not tell.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// The controller's client or a read failed.
    #[error(transparent)]
    Controller(#[from] crate::controller::Error),
    /// The watches did not list in time.
    #[error(
        "the watches did not list within {0} s (is every kind the rules read served and readable?)"
    )]
    Timeout(u64),
    /// An object could not be printed.
    #[error(transparent)]
    Yaml(#[from] crate::yaml::YamlError),
    /// The kubeconfig or context given cannot be used.
    #[error("kubeconfig: {0}")]
    Config(String),
}

/// What `run` would do to one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// Create it (no object of the name exists).
    Create,
    /// Take over an existing object without our label, in place.
    Adopt,
    /// Apply differences to an object we manage.
    Update,
    /// Delete and re-create a binding whose roleRef changed.
    Recreate,
    /// Leave an existing object alone (not ours, not adoptable).
    Conflict,
    /// Delete a managed object nothing wants any more.
    Prune,
}

impl Change {
    fn verb(self) -> &'static str {
        match self {
            Change::Create => "create",
            Change::Adopt => "adopt",
            Change::Update => "update",
            Change::Recreate => "re-create",
            Change::Conflict => "conflict",
            Change::Prune => "prune",
        }
    }
}

/// One object `run` would act on.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// What it would do.
    pub change: Change,
    /// The object.
    pub id: ObjectId,
    /// The rule that wants (or made) it.
    pub rule: String,
    /// Why (adoptions and conflicts).
    pub note: Option<String>,
    /// The object now, if it exists (server fields removed).
    pub before: Option<Value>,
    /// The object after the write, if it would exist.
    pub after: Option<Value>,
}

/// Turns the controller's plan into entries. `existing` holds, for every
/// object the plan would create, what a GET found (`None`: absent).
pub fn entries(
    plan: &Plan,
    owned: &BTreeMap<ObjectId, Live>,
    existing: &BTreeMap<ObjectId, Option<Value>>,
    adopt_existing: bool,
) -> Vec<Entry> {
    let mut out = Vec::new();
    // The world keeps most live bodies packed (JSON null through
    // `Live::object`): a diff shows them whole, so each object the plan
    // touches is unpacked here, on a copy.
    let unpacked: BTreeMap<&ObjectId, Live> = plan
        .applies
        .iter()
        .map(|a| &a.id)
        .chain(plan.deletes.iter().map(|d| &d.id))
        .filter_map(|id| {
            let live = owned.get(id)?;
            live.is_packed().then(|| {
                let mut l = live.clone();
                l.unpack();
                (id, l)
            })
        })
        .collect();
    let owned = |id: &ObjectId| unpacked.get(id).or_else(|| owned.get(id));
    for a in &plan.applies {
        let entry = |change, note, before: Option<Value>, after| Entry {
            change,
            id: a.id.clone(),
            rule: a.rule.to_string(),
            note,
            before: before.map(|b| clean(&b)),
            after,
        };
        let live = owned(&a.id);
        let body = a.body();
        out.push(match (&a.action, existing.get(&a.id).cloned().flatten()) {
            (ApplyAction::Create, Some(found)) if !is_ours(&found) => {
                match apply::adoption(&a.id, &body, &found, adopt_existing) {
                    Ok(why) => {
                        let mut desired = body.clone();
                        keep_helm_annotation(&mut desired, &found);
                        mark_adopted(&mut desired);
                        let after = applied(&found, None, &desired);
                        entry(Change::Adopt, Some(why), Some(found), Some(after))
                    }
                    Err(why) => entry(Change::Conflict, Some(why), Some(found), None),
                }
            }
            // Ours already (the cache lagged): an update.
            (ApplyAction::Create, Some(found)) => {
                let ours = OwnedFields::from_managed_fields(&found);
                let after = applied(&found, ours.as_ref(), &body);
                entry(Change::Update, None, Some(found), Some(after))
            }
            (ApplyAction::Create, None) => entry(Change::Create, None, None, Some(clean(&body))),
            (action, _) => {
                let change = match action {
                    ApplyAction::Recreate { .. } => Change::Recreate,
                    _ => Change::Update,
                };
                let before = live.map(|l| l.object().clone());
                let after = match live {
                    Some(l) if change == Change::Update => applied(l.object(), l.ours(), &body),
                    _ => clean(&body),
                };
                entry(change, None, before, Some(after))
            }
        });
    }
    for d in &plan.deletes {
        out.push(Entry {
            change: Change::Prune,
            id: d.id.clone(),
            rule: d.rule.clone(),
            note: None,
            before: owned(&d.id).map(|l| clean(l.object())),
            after: None,
        });
    }
    out
}

/// 0 when nothing would be written, 1 otherwise (conflicts write nothing).
pub fn exit_code(entries: &[Entry]) -> u8 {
    u8::from(entries.iter().any(|e| e.change != Change::Conflict))
}

/// The report: one section per object (a unified diff of its YAML), then a
/// summary line.
pub fn format(entries: &[Entry], unchanged: usize) -> Result<String, DiffError> {
    format_report(entries, unchanged, &BTreeMap::new())
}

/// The report with its held prunes: one section per object, then per rule
/// the prunes `run` would hold (`--max-unconfirmed-prunes`) with the
/// command that confirms them, then the summary line.
pub fn format_report(
    entries: &[Entry],
    unchanged: usize,
    held: &BTreeMap<String, HeldPrunes>,
) -> Result<String, DiffError> {
    let mut out = String::new();
    for e in entries {
        out.push_str(&format!("{} {} (rule {})\n", e.change.verb(), e.id, e.rule));
        if let Some(note) = &e.note {
            out.push_str(&format!("  {note}\n"));
        }
        let before = e.before.as_ref().map(crate::yaml::to_yaml).transpose()?;
        let after = e.after.as_ref().map(crate::yaml::to_yaml).transpose()?;
        if e.change != Change::Conflict {
            out.push_str(&unified(
                &format!("live/{}", e.id),
                before.as_deref().unwrap_or_default(),
                &format!("desired/{}", e.id),
                after.as_deref().unwrap_or_default(),
            ));
        }
    }
    for (rule, h) in held {
        out.push_str(&format!(
            "held prunes (rule {rule}): {} deletions, more than --max-unconfirmed-prunes ({}) in one pass; \
             run deletes nothing of them until confirmed:\n  {}\n",
            h.objects.len(),
            h.max,
            h.confirm_command(rule)
        ));
        for id in &h.objects {
            out.push_str(&format!("  held: {id}\n"));
        }
    }
    let count = |c: Change| entries.iter().filter(|e| e.change == c).count();
    let held_count: usize = held.values().map(|h| h.objects.len()).sum();
    let held_text = if held_count > 0 {
        format!(", {held_count} prunes held")
    } else {
        String::new()
    };
    out.push_str(&format!(
        "{} to create, {} to adopt, {} to update, {} to re-create, {} in conflict, {} to prune{held_text}, {unchanged} unchanged\n",
        count(Change::Create),
        count(Change::Adopt),
        count(Change::Update),
        count(Change::Recreate),
        count(Change::Conflict),
        count(Change::Prune),
    ));
    Ok(out)
}

/// Context lines around each change in a diff.
const CONTEXT: usize = 3;

/// A unified diff of two texts, by lines (empty when equal).
pub fn unified(from: &str, a: &str, to: &str, b: &str) -> String {
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    // Longest common subsequence table: objects are small.
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // The edit script: (tag, line).
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            // Removals before additions, as diff(1) prints them.
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != ' ').collect();
    if changed.is_empty() {
        return String::new();
    }
    let mut out = format!("--- {from}\n+++ {to}\n");
    // Group changes into hunks with CONTEXT lines around them.
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(CONTEXT);
        let mut end = changed[k];
        while k < changed.len() && changed[k] <= end + 2 * CONTEXT {
            end = changed[k];
            k += 1;
        }
        let end = (end + CONTEXT + 1).min(ops.len());
        let old_start = ops[..start].iter().filter(|o| o.0 != '+').count();
        let new_start = ops[..start].iter().filter(|o| o.0 != '-').count();
        let old_len = ops[start..end].iter().filter(|o| o.0 != '+').count();
        let new_len = ops[start..end].iter().filter(|o| o.0 != '-').count();
        out.push_str(&format!(
            "@@ -{},{old_len} +{},{new_len} @@\n",
            old_start + usize::from(old_len > 0),
            new_start + usize::from(new_len > 0)
        ));
        for (tag, line) in &ops[start..end] {
            out.push_str(&format!("{tag}{line}\n"));
        }
    }
    out
}

/// An object without the fields the server manages.
fn clean(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "generation",
            "managedFields",
        ] {
            m.remove(k);
        }
    }
    o
}

/// The object a forced server-side apply of `desired` by our field manager
/// would leave: `ours` are the fields we set before (removed when no
/// longer desired); an aggregated role keeps the aggregator's rules.
fn applied(live: &Value, ours: Option<&OwnedFields>, desired: &Value) -> Value {
    let mut out = clean(live);
    let empty = OwnedFields::default();
    let ours = ours.unwrap_or(&empty);
    for (name, owned) in [("labels", &ours.labels), ("annotations", &ours.annotations)] {
        let want = desired["metadata"][name]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let mut have = out["metadata"][name]
            .as_object()
            .cloned()
            .unwrap_or_default();
        have.retain(|k, _| !owned.contains(k) || want.contains_key(k));
        have.extend(want);
        set_meta(&mut out, name, Value::Object(have));
    }
    let want: Vec<Value> = desired["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut refs: Vec<Value> = out["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    refs.retain(|r| {
        let uid = r["uid"].as_str().unwrap_or_default();
        !ours.owner_uids.contains(uid) && !want.iter().any(|w| w["uid"] == r["uid"])
    });
    refs.extend(want);
    set_meta(&mut out, "ownerReferences", Value::Array(refs));
    let aggregated = desired.get("aggregationRule").is_some();
    for field in ["rules", "aggregationRule", "roleRef", "subjects"] {
        let Some(o) = out.as_object_mut() else { break };
        match desired.get(field) {
            Some(v) => {
                o.insert(field.to_string(), v.clone());
            }
            None if field == "rules" && aggregated => {}
            None if ours.top.contains(field) => {
                o.remove(field);
            }
            None => {}
        }
    }
    out
}

fn set_meta(obj: &mut Value, name: &str, v: Value) {
    let empty = match &v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if empty {
            m.remove(name);
        } else {
            m.insert(name.to_string(), v);
        }
    } else if !empty {
        let mut m = Map::new();
        m.insert(name.to_string(), v);
        obj["metadata"] = Value::Object(m);
    }
}

/// Observes the cluster as the controller does, evaluates, plans and looks
/// up the objects to create. Writes nothing: the controller's own steps up
/// to its write pass ([`observe`], [`planner`], [`Syncer::evaluate`]),
/// then, where `run` would write, a GET.
pub async fn diff(client: Client, args: &DiffArgs) -> Result<(Vec<Entry>, usize), DiffError> {
    let r = report(client, args).await?;
    Ok((r.entries, r.unchanged))
}

/// What `diff` found: the objects `run` would act on, how many it would
/// leave unchanged, and the prunes it would hold, by rule.
#[derive(Debug)]
pub struct Report {
    /// One per object `run` would act on.
    pub entries: Vec<Entry>,
    /// Desired objects already as desired.
    pub unchanged: usize,
    /// Prunes held by `--max-unconfirmed-prunes`, by rule.
    pub held: BTreeMap<String, HeldPrunes>,
}

/// [`diff`] with the held prunes.
pub async fn report(client: Client, args: &DiffArgs) -> Result<Report, DiffError> {
    let (world, watches) = observe(&client, args).await?;
    let allow = world.allow_rules();
    let holds = world.holds();
    let snap = world.snapshot(allow.as_ref(), &holds);
    let (evaluation, plan) = planner(client.clone(), args).evaluate(&snap);
    report_problems(&evaluation, &holds);
    report_foreign_claims(&world.forged);
    let mut existing = BTreeMap::new();
    for a in &plan.applies {
        // As the writer: only names the watches saw taken by another
        // object need a look.
        if a.action == ApplyAction::Create && world.foreign.contains(&a.id) {
            existing.insert(a.id.clone(), apply::get_existing(&client, &a.id).await?);
        }
    }
    drop(watches);
    Ok(Report {
        entries: entries(&plan, &world.owned, &existing, args.adopt_existing),
        unchanged: plan.unchanged.len(),
        held: plan.held_prunes.clone(),
    })
}

/// The objects `run` would want now (its evaluation's desired set, as
/// JSON): what `explain --live` reads to say what the rules would grant
/// before their outputs are applied.
pub async fn desired(client: Client, args: &DiffArgs) -> Result<Vec<Value>, DiffError> {
    let (world, watches) = observe(&client, args).await?;
    let allow = world.allow_rules();
    let holds = world.holds();
    let snap = world.snapshot(allow.as_ref(), &holds);
    let (evaluation, _) = planner(client, args).evaluate(&snap);
    drop(watches);
    Ok(evaluation
        .desired
        .iter()
        .map(|d| d.object.to_value())
        .collect())
}

/// The cluster as `run` sees it: the controller's world, fed by its
/// watches until every kind the rules read has listed (or the timeout).
/// The watches are returned so that they run until the caller is done.
async fn observe(client: &Client, args: &DiffArgs) -> Result<(World, Watches), DiffError> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (mut world, mut watches) =
        crate::controller::observe(client, tx, args.manage, args.allow_clusterrole.clone());
    // What tenant rules may read is part of what is watched, as in `run`.
    world.tenancy = args.tenancy.clone();
    let wait = tokio::time::sleep(Duration::from_secs(args.timeout_seconds));
    tokio::pin!(wait);
    while !(world.base_synced() && world.kinds_settled()) {
        tokio::select! {
            feed = rx.recv() => {
                let Some(feed) = feed else { break };
                if world.apply(feed).rules {
                    watches.reconcile_kinds(&mut world).await;
                }
            }
            _ = &mut wait => return Err(DiffError::Timeout(args.timeout_seconds)),
        }
    }
    Ok((world, watches))
}

/// The controller's syncer with `run`'s settings that change the plan, and
/// a closed gate: it evaluates and plans exactly as `run` does, and can
/// write nothing.
fn planner(client: Client, args: &DiffArgs) -> Syncer {
    Syncer::planning(
        client,
        &args.plan_settings(),
        Metrics::new(),
        Arc::new(Gate::new(false)),
        None,
    )
}

/// Objects labelled ours that rbac-rules did not make: left alone (no
/// entry of the diff), a warning each; the exit status is not theirs.
fn report_foreign_claims(forged: &BTreeMap<ObjectId, Option<String>>) {
    for (id, rule) in forged {
        eprintln!(
            "warning: {}",
            crate::engine::output::foreign_claim_message(&id.to_string(), rule.as_deref())
        );
    }
}

fn report_problems(
    evaluation: &Evaluation,
    holds: &BTreeMap<String, crate::controller::status::Hold>,
) {
    for e in evaluation.errors() {
        eprintln!("warning: {e}");
    }
    for n in evaluation.notices() {
        eprintln!("warning: {n}");
    }
    for (rule, hold) in holds {
        eprintln!("warning: rule {rule} is held, its objects are left alone: {hold:?}");
    }
}

/// Runs `rbac-rules diff` against the current kubeconfig: prints the
/// report and returns the exit code (errors on stderr, code 2).
pub async fn run(args: &DiffArgs, cluster: &ClusterArgs) -> u8 {
    let result = async {
        let client = cluster.client().await?;
        let mut args = args.clone();
        if args.installed_settings {
            match crate::installed::from_cluster(&client).await {
                Ok(installed) => {
                    for w in args.with_installed(&installed) {
                        eprintln!("warning: {w}");
                    }
                }
                Err(why) => eprintln!(
                    "note: the installed controller's settings could not be found ({why}): \
                     using the command line's only"
                ),
            }
        }
        let r = report(client, &args).await?;
        Ok::<_, DiffError>((
            format_report(&r.entries, r.unchanged, &r.held)?,
            exit_code(&r.entries),
        ))
    }
    .await;
    match result {
        Ok((text, code)) => {
            print!("{text}");
            code
        }
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::OutputKind;
    use crate::controller::plan::{Apply, Delete};
    use serde_json::json;

    fn role(name: &str, labels: Value, rules: Value) -> Value {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": labels}, "rules": rules})
    }

    fn ours() -> Value {
        json!({"app.kubernetes.io/managed-by": "rbac-rules"})
    }

    fn id(name: &str) -> ObjectId {
        ObjectId::new(OutputKind::ClusterRole, "", name)
    }

    fn apply(name: &str, action: ApplyAction, rules: Value) -> Apply {
        Apply {
            id: id(name),
            rule: "r".into(),
            object: crate::engine::Manifest::from_value(&role(name, ours(), rules)).unwrap(),
            keep_helm: false,
            adopted: false,
            action,
        }
    }

    #[test]
    fn nothing_to_do_exits_zero_with_a_summary_only() {
        let e = entries(&Plan::default(), &BTreeMap::new(), &BTreeMap::new(), false);
        assert!(e.is_empty());
        assert_eq!(exit_code(&e), 0);
        assert_eq!(
            format(&e, 4).expect("format"),
            "0 to create, 0 to adopt, 0 to update, 0 to re-create, 0 in conflict, 0 to prune, 4 unchanged\n"
        );
    }

    #[test]
    fn every_kind_of_change_is_classified_and_diffed() {
        let get = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
        let list = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]);
        let plan = Plan {
            applies: vec![
                apply("new", ApplyAction::Create, get.clone()),
                apply("helm", ApplyAction::Create, get.clone()),
                apply("foreign", ApplyAction::Create, get.clone()),
                apply("changed", ApplyAction::Update(vec!["rules"]), list.clone()),
            ],
            deletes: vec![Delete {
                id: id("stale"),
                rule: "r".into(),
                uid: None,
                resource_version: None,
                revoked: None,
            }],
            ..Plan::default()
        };
        let owned: BTreeMap<ObjectId, Live> = [
            ("changed", role("changed", ours(), get.clone())),
            ("stale", role("stale", ours(), get.clone())),
        ]
        .into_iter()
        .map(|(n, o)| (id(n), Live::new(o)))
        .collect();
        let mut helm = role(
            "helm",
            json!({"app.kubernetes.io/managed-by": "Helm"}),
            get.clone(),
        );
        helm["metadata"]["annotations"] = json!({"meta.helm.sh/release-name": "platform"});
        let mut foreign = role("foreign", json!({}), get.clone());
        foreign["metadata"]["ownerReferences"] =
            json!([{"kind": "X", "name": "x", "uid": "1", "controller": true}]);
        let existing = BTreeMap::from([
            (id("new"), None),
            (id("helm"), Some(helm)),
            (id("foreign"), Some(foreign)),
        ]);

        let without = entries(&plan, &owned, &existing, false);
        let changes: Vec<(Change, &str)> =
            without.iter().map(|e| (e.change, &*e.id.name)).collect();
        assert_eq!(
            changes,
            vec![
                (Change::Create, "new"),
                (Change::Conflict, "helm"),
                (Change::Conflict, "foreign"),
                (Change::Update, "changed"),
                (Change::Prune, "stale"),
            ]
        );
        assert!(
            without[1]
                .note
                .as_deref()
                .is_some_and(|n| n.contains("--adopt-existing"))
        );

        let with = entries(&plan, &owned, &existing, true);
        assert_eq!(with[1].change, Change::Adopt);
        assert_eq!(
            with[2].change,
            Change::Conflict,
            "controlled by another object"
        );
        let after = with[1].after.as_ref().expect("after");
        assert_eq!(
            after["metadata"]["annotations"]["helm.sh/resource-policy"],
            "keep"
        );
        assert_eq!(
            after["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "rbac-rules"
        );
        assert_eq!(exit_code(&with), 1);

        let text = format(&with, 0).expect("format");
        assert!(text.contains("adopt ClusterRole helm (rule r)\n"), "{text}");
        assert!(
            text.contains("-    app.kubernetes.io/managed-by: Helm\n+    app.kubernetes.io/managed-by: rbac-rules\n"),
            "{text}"
        );
        assert!(
            text.contains("+    helm.sh/resource-policy: keep\n"),
            "{text}"
        );
        assert!(
            text.contains("--- live/ClusterRole changed\n+++ desired/ClusterRole changed\n"),
            "{text}"
        );
        assert!(text.contains("-  - get\n+  - list\n"), "{text}");
        assert!(
            text.contains("prune ClusterRole stale (rule r)\n"),
            "{text}"
        );
        assert!(text.ends_with(
            "1 to create, 1 to adopt, 1 to update, 0 to re-create, 1 in conflict, 1 to prune, 0 unchanged\n"
        ));
    }

    #[test]
    fn packed_live_objects_show_their_removed_items_not_null() {
        let get = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
        let list = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]);
        let plan = Plan {
            applies: vec![apply("changed", ApplyAction::Update(vec!["rules"]), list)],
            deletes: vec![Delete {
                id: id("stale"),
                rule: "r".into(),
                uid: None,
                resource_version: None,
                revoked: None,
            }],
            ..Plan::default()
        };
        // As the controller's world holds them: packed.
        let owned: BTreeMap<ObjectId, Live> = ["changed", "stale"]
            .into_iter()
            .map(|n| {
                let mut l = Live::new(role(n, ours(), get.clone()));
                l.pack();
                assert_eq!(l.object(), &Value::Null, "packed");
                (id(n), l)
            })
            .collect();
        let text = format(&entries(&plan, &owned, &BTreeMap::new(), false), 0).expect("format");
        assert!(!text.contains("null"), "{text}");
        assert!(
            text.contains("prune ClusterRole stale (rule r)\n--- live/ClusterRole stale\n"),
            "{text}"
        );
        assert!(text.contains("-rules:\n-- apiGroups:\n"), "{text}");
        assert!(text.contains("-  - get\n+  - list\n"), "{text}");
    }

    #[test]
    fn held_prunes_are_listed_with_their_confirm_token_and_no_colours() {
        let held = BTreeMap::from([(
            "r".to_string(),
            HeldPrunes {
                token: "abc123".into(),
                objects: vec![id("a"), id("b")],
                max: 1,
            },
        )]);
        let text = format_report(&[], 3, &held).expect("format");
        assert_eq!(
            text,
            "held prunes (rule r): 2 deletions, more than --max-unconfirmed-prunes (1) in one pass; \
             run deletes nothing of them until confirmed:\n  \
             kubectl annotate rbacrule r --overwrite rbacrules.io/confirm-prune=abc123\n  \
             held: ClusterRole a\n  held: ClusterRole b\n\
             0 to create, 0 to adopt, 0 to update, 0 to re-create, 0 in conflict, 0 to prune, 2 prunes held, 3 unchanged\n"
        );
        // The report is plain text whatever stdout is: no ANSI escapes.
        assert!(!text.contains('\u{1b}'));
    }

    #[test]
    fn installed_settings_fill_in_and_differences_warn() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: DiffArgs,
        }
        let installed = crate::installed::Installed {
            deployment: "rbac-rules-system/rbac-rules".into(),
            params: BTreeMap::from([("productNamespace".into(), "xp".into())]),
            allow_clusterrole: Some("rbac-rules:allow-list".into()),
            max_unconfirmed_prunes: Some(7),
            ..Default::default()
        };
        let mut a = Cli::parse_from(["x"]).args;
        assert!(a.installed_settings);
        assert!(a.with_installed(&installed).is_empty());
        assert_eq!(a.params.map()["productNamespace"], "xp");
        assert_eq!(
            a.allow_clusterrole.as_deref(),
            Some("rbac-rules:allow-list")
        );
        assert_eq!(a.plan_settings().max_unconfirmed_prunes, Some(7));
        assert_eq!(a.plan_settings().params["productNamespace"], "xp");
        let mut a = Cli::parse_from(["x", "--param", "productNamespace=product-system"]).args;
        let w = a.with_installed(&installed);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("\"product-system\"") && w[0].contains("\"xp\""),
            "{w:?}"
        );
        assert_eq!(a.params.map()["productNamespace"], "product-system");
    }

    #[test]
    fn conflicts_alone_change_nothing() {
        let plan = Plan {
            applies: vec![apply("foreign", ApplyAction::Create, json!([]))],
            ..Plan::default()
        };
        let existing =
            BTreeMap::from([(id("foreign"), Some(role("foreign", json!({}), json!([]))))]);
        let e = entries(&plan, &BTreeMap::new(), &existing, true);
        assert_eq!(e[0].change, Change::Adopt, "no controller, flag on");
        let mut controlled = role("foreign", json!({}), json!([]));
        controlled["metadata"]["ownerReferences"] =
            json!([{"kind": "X", "name": "x", "uid": "1", "controller": true}]);
        let existing = BTreeMap::from([(id("foreign"), Some(controlled))]);
        let e = entries(&plan, &BTreeMap::new(), &existing, true);
        assert_eq!(e[0].change, Change::Conflict);
        assert_eq!(exit_code(&e), 0);
        // A conflict is listed but has no diff.
        assert!(!format(&e, 0).expect("format").contains("---"));
    }

    #[test]
    fn an_adopted_aggregated_role_keeps_the_aggregators_rules_and_foreign_labels() {
        let agg = json!({"clusterRoleSelectors": [{"matchLabels": {"x": "true"}}]});
        let mut desired = role("agg", ours(), Value::Null);
        desired.as_object_mut().expect("object").remove("rules");
        desired["aggregationRule"] = agg.clone();
        let filled = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
        let mut live = role("agg", json!({"team": "a"}), filled.clone());
        live["aggregationRule"] = agg;
        live["metadata"]["uid"] = json!("u");
        let after = applied(&live, None, &desired);
        assert_eq!(after["rules"], filled);
        assert_eq!(after["metadata"]["labels"]["team"], "a");
        assert_eq!(
            after["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "rbac-rules"
        );
        assert!(after["metadata"].get("uid").is_none());
        // A label we set before and no longer want goes.
        let owned = OwnedFields {
            labels: std::sync::Arc::new(["team".to_string()].into()),
            ..OwnedFields::default()
        };
        let after = applied(&live, Some(&owned), &desired);
        assert!(after["metadata"]["labels"].get("team").is_none());
    }

    #[test]
    fn unified_diff_hunks() {
        let a = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n";
        let b = "a\nb\nc\nd\nE\nf\ng\nh\ni\nj\nk\n";
        assert_eq!(
            unified("x", a, "y", b),
            "--- x\n+++ y\n@@ -2,9 +2,10 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n i\n j\n+k\n"
        );
        assert_eq!(unified("x", a, "y", a), "");
        assert_eq!(
            unified("x", "", "y", "a\n"),
            "--- x\n+++ y\n@@ -0,0 +1,1 @@\n+a\n"
        );
    }
}
