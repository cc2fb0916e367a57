//! Leader election on a `coordination.k8s.io/v1` Lease in the operator's namespace, so that
//! two replicas never reconcile at once. The lease loop is `kube-lease-manager` (maintained,
//! built on kube 5): it creates the Lease if missing, takes it when free or expired, renews it
//! before it expires, and releases it when we stop watching.
use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Seconds a leader's claim lasts without renewal; a standby takes over at most this long
/// after a leader vanished without releasing.
pub const LEASE_SECONDS: u64 = 15;
/// Seconds before expiry at which the leader renews.
pub const RENEW_BEFORE_SECONDS: u64 = 5;

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("leader election on Lease {namespace}/{name}: {source}")]
    Lease {
        namespace: String,
        name: String,
        #[source]
        source: LeaseManagerError,
    },
    #[error("the leader-election task stopped")]
    Stopped,
}

/// A running lease loop.
pub struct Leadership {
    leading: watch::Receiver<bool>,
    task: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
}

impl Leadership {
    /// Starts competing for the Lease `namespace/name` as `identity` (the pod's name).
    pub async fn start(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
    ) -> Result<Self, LeaderError> {
        let manager = LeaseManagerBuilder::new(client, name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(LEASE_SECONDS)
            .with_grace(RENEW_BEFORE_SECONDS)
            .with_field_manager(format!("riverbank-operator-lease-{identity}"))
            .build()
            .await
            .map_err(|source| LeaderError::Lease {
                namespace: namespace.into(),
                name: name.into(),
                source,
            })?;
        let (leading, task) = manager.watch().await;
        Ok(Leadership { leading, task })
    }

    /// Waits until this replica holds the Lease.
    pub async fn acquired(&mut self) -> Result<(), LeaderError> {
        self.leading
            .wait_for(|leading| *leading)
            .await
            .map(|_| ())
            .map_err(|_| LeaderError::Stopped)
    }

    /// A receiver that becomes false when leadership is lost.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// Releases the Lease (if held) so a standby takes over without waiting for expiry.
    pub async fn release(self) {
        let Leadership { leading, task } = self;
        // The loop releases the Lease and ends once every receiver is gone.
        drop(leading);
        match task.await {
            Ok(Ok(_)) => tracing::info!("released the leader Lease"),
            Ok(Err(e)) => tracing::warn!(error = %e, "releasing the leader Lease"),
            Err(e) => tracing::warn!(error = %e, "the leader-election task panicked"),
        }
    }
}

/// Resolves when `leading` turns false (or its sender is gone).
pub async fn lost(mut leading: watch::Receiver<bool>) {
    let _ = leading.wait_for(|leading| !*leading).await;
}
