//! Leader election on a Lease: only one controller instance acts at a time.

use kube::Client;

/// A leader election Lease.
pub struct Lease {
    pub client: Client,
    pub namespace: String,
    pub name: &'static str,
    pub identity: String,
}

/// Run `work` while this instance holds `lease` (stopping it when the lease is lost, starting
/// it again when held again), until `work` ends or `shutdown` comes; then the lease is given up,
/// so a successor (the next pod of a rolling update) leads at once instead of waiting for it to
/// expire.
pub async fn lead<W, F>(
    lease: Lease,
    leader: impl Fn(bool),
    work: W,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()>
where
    W: Fn() -> F,
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    use kube_lease_manager::LeaseManagerBuilder;
    let manager = LeaseManagerBuilder::new(lease.client, lease.name)
        .with_namespace(&lease.namespace)
        .with_identity(&lease.identity)
        .with_duration(15)
        .with_grace(5)
        .build()
        .await?;
    let (mut leading, task) = manager.watch().await;
    let led = async {
        loop {
            while !*leading.borrow_and_update() {
                leader(false);
                leading.changed().await?;
            }
            tracing::info!(identity = %lease.identity, lease = lease.name, "leading");
            leader(true);
            tokio::select! {
                r = work() => return r,
                _ = async {
                    while *leading.borrow_and_update() {
                        if leading.changed().await.is_err() {
                            break;
                        }
                    }
                } => {
                    tracing::warn!(lease = lease.name, "lost the lease; stopping");
                }
            }
        }
    };
    let outcome = tokio::select! {
        r = led => r,
        _ = shutdown => Ok(()),
    };
    // Closing the channel makes the manager release the lease.
    drop(leading);
    match tokio::time::timeout(std::time::Duration::from_secs(5), task).await {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, lease = lease.name, "giving up the lease"),
        Ok(_) => {}
        Err(_) => tracing::warn!(lease = lease.name, "giving up the lease took too long"),
    }
    outcome
}
