//! The controller: observes the cluster, runs the engine, applies, prunes
//! and reports. (Being written.)

use crate::api::ManageLevel;

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
}

/// Runs the controller until SIGTERM or ctrl-c.
pub async fn run(_args: RunArgs) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    Err("the controller is not built yet".into())
}
