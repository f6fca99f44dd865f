//! The development cluster's node agents: plain Kubernetes components that know nothing about
//! CDI. Decisions are pure functions over the objects; the loops around them read the cluster
//! every pass (level-triggered, no watches) and write what was decided.

/// Run a pass every `$every` until the task is dropped; a failed pass is logged (under the
/// calling agent's target, so in its own log) and the next one starts from what the cluster then
/// holds: the agents are level-triggered.
macro_rules! run_every {
    ($every:expr, $pass:expr) => {
        loop {
            if let Err(e) = $pass.await {
                tracing::warn!(error = %e, "pass failed");
            }
            tokio::time::sleep($every).await;
        }
    };
}

pub mod kubelet;
pub mod localpath;
pub mod nodes;
pub mod protection;
pub mod pvcontroller;
pub mod retry;
pub mod scheduler;
pub mod snapshots;
pub mod vmconsumer;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::ListParams;
use kube::{Api, Client};

/// The first 16 hex digits of the SHA-256 of `text`: names derived from longer ones stay
/// distinct. (SHA-256 through rustls' provider, which the API server's TLS already links.)
pub(crate) fn short_hash(text: &str) -> String {
    let suite = rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let Some(tls13) = suite.tls13() else {
        unreachable!("a TLS 1.3 suite")
    };
    let digest = tls13.common.hash_provider.hash(text.as_bytes());
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `text` made to fit `max` bytes: unchanged when it does, else a readable prefix and the
/// hash of the whole, so two long names that share the prefix still differ.
pub(crate) fn fit(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let hash = short_hash(text);
    format!(
        "{}-{hash}",
        cdi_core::naming::prefix(text, max - hash.len() - 1)
    )
}

pub(crate) use cdi_core::naming::event_name;

/// A suffix for an event that is new each time: the time in nanoseconds, in hex, as kube's
/// recorder uses, and never the same twice in this process.
pub(crate) fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let previous = LAST
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
            Some(now.max(last + 1))
        })
        .unwrap_or(now);
    format!("{:x}", now.max(previous + 1))
}

/// Run file work (copies of volumes, removals) on a blocking thread: a clone of a large volume
/// must not stall the runtime every agent and the API server share.
pub(crate) async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(std::io::Error::other)?
}

fn name<T: kube::Resource>(o: &T) -> &str {
    o.meta().name.as_deref().unwrap_or("")
}

fn namespace<T: kube::Resource>(o: &T) -> &str {
    o.meta().namespace.as_deref().unwrap_or("")
}

/// What the storage agents decide from: every claim, volume, class and node, and the
/// snapshot.storage.k8s.io objects (as JSON: k8s-openapi has no types for them), read in one go.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub claims: Vec<PersistentVolumeClaim>,
    pub volumes: Vec<PersistentVolume>,
    pub classes: Vec<StorageClass>,
    pub nodes: Vec<Node>,
    pub volume_snapshots: Vec<serde_json::Value>,
    pub snapshot_contents: Vec<serde_json::Value>,
    pub snapshot_classes: Vec<serde_json::Value>,
}

async fn list_dynamic(
    client: &Client,
    kind: &str,
    plural: &str,
) -> Result<Vec<serde_json::Value>, kube::Error> {
    let resource = snapshots::agent::resource(kind, plural);
    let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|o| serde_json::to_value(o).ok())
        .collect())
}

async fn list_all<K>(client: &Client) -> Result<Vec<K>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    Ok(Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items)
}

impl Snapshot {
    pub async fn read(client: &Client) -> Result<Snapshot, kube::Error> {
        Ok(Snapshot {
            claims: list_all(client).await?,
            volumes: list_all(client).await?,
            classes: list_all(client).await?,
            nodes: list_all(client).await?,
            volume_snapshots: list_dynamic(client, "VolumeSnapshot", "volumesnapshots").await?,
            snapshot_contents: list_dynamic(
                client,
                "VolumeSnapshotContent",
                "volumesnapshotcontents",
            )
            .await?,
            snapshot_classes: list_dynamic(client, "VolumeSnapshotClass", "volumesnapshotclasses")
                .await?,
        })
    }

    /// With the pods too, for the scheduler.
    pub async fn with_pods(client: &Client) -> Result<(Snapshot, Vec<Pod>), kube::Error> {
        Ok((Snapshot::read(client).await?, list_all(client).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_fit_and_stay_distinct() {
        assert_eq!(fit("short", 255), "short");
        let a = format!("{}a", "x".repeat(300));
        let b = format!("{}b", "x".repeat(300));
        let (fa, fb) = (fit(&a, 255), fit(&b, 255));
        assert!(fa.len() <= 255 && fb.len() <= 255, "{fa}");
        assert!(fa.starts_with(&"x".repeat(200)));
        assert_ne!(fa, fb);
        assert_eq!(fa, fit(&a, 255), "the same name gives the same result");
        // Multi-byte characters are not split.
        assert!(fit(&"é".repeat(200), 255).len() <= 255);
        assert_eq!(short_hash("abc"), "ba7816bf8f01cfea", "SHA-256 of \"abc\"");

        assert_ne!(unique_suffix(), unique_suffix());
    }
}
