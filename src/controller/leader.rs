//! Lease-based leader election (kube-lease-manager): only the holder of
//! the Lease writes; others watch and stay ready.

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Error;

/// A running election.
pub struct Lease {
    receiver: watch::Receiver<bool>,
    task: JoinHandle<Result<LeaseManager, kube_lease_manager::LeaseManagerError>>,
}

impl Lease {
    /// Creates the Lease if needed and starts competing for it.
    pub async fn start(
        client: Client,
        namespace: &str,
        name: &str,
        identity: Option<String>,
    ) -> Result<Lease, Error> {
        let mut builder = LeaseManagerBuilder::new(client, name).with_namespace(namespace);
        if let Some(id) = identity {
            builder = builder.with_identity(id);
        }
        let manager = builder.build().await?;
        let (receiver, task) = manager.watch().await;
        tracing::info!(%namespace, %name, "leader election started");
        Ok(Lease { receiver, task })
    }

    /// A receiver of leadership changes (true: this replica leads).
    pub fn receiver(&self) -> watch::Receiver<bool> {
        self.receiver.clone()
    }

    /// Gives the Lease up: closing every receiver makes the manager task
    /// release it and end.
    pub async fn release(self) {
        let Lease { receiver, task } = self;
        drop(receiver);
        match tokio::time::timeout(std::time::Duration::from_secs(5), task).await {
            Ok(Ok(Ok(_))) => tracing::info!("lease released"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "cannot release the lease"),
            Ok(Err(e)) => tracing::warn!(error = %e, "lease task failed"),
            Err(_) => tracing::warn!("lease release timed out"),
        }
    }
}
