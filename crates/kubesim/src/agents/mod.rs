//! The development cluster's node agents: plain Kubernetes components that know nothing about
//! CDI. Decisions are pure functions over the objects; the loops around them read the cluster
//! each pass and write what was decided (level-triggered). A pass runs when an object of the
//! kinds they read changed ([`Changes`], watches) or, failing that, every [`RESYNC`]: an idle
//! cluster costs next to nothing.

/// Run passes until the task is dropped: one at once, then one after each change `$wake`
/// reports (at least `$every` apart, so a burst of changes is one pass). A failed pass is
/// logged (under the calling agent's target, so in its own log) and the next one starts from
/// what the cluster then holds. Each pass reads the cluster as it was no earlier than the
/// change that woke it and the end of the previous pass ([`FRESH`]): it sees its own writes.
#[macro_export]
macro_rules! run_on_change {
    ($wake:expr, $every:expr, $pass:expr) => {{
        let mut wake = $wake;
        let mut since = std::time::Instant::now();
        $crate::agents::DUE
            .scope(std::cell::Cell::new(None), async {
                loop {
                    if let Err(e) = $crate::agents::FRESH.scope(since, $pass).await {
                        tracing::warn!(error = %e, "pass failed");
                    }
                    let ended = std::time::Instant::now();
                    since = wake.next($every).await.map_or(ended, |at| at.max(ended));
                }
            })
            .await
    }};
}

tokio::task_local! {
    /// When the agent running in this task wants its next pass at the latest (a retry's time).
    pub static DUE: std::cell::Cell<Option<std::time::Instant>>;
    /// The pass running in this task must read the cluster as of this instant or later.
    pub static FRESH: std::time::Instant;
}

/// Ask for a pass of the agent running this task by `at` even if nothing changes (outside an
/// agent's loop, nothing happens).
pub(crate) fn due_by(at: std::time::Instant) {
    let _ = DUE.try_with(|d| d.set(Some(d.get().map_or(at, |was| was.min(at)))));
}

pub mod kubelet;
pub mod localpath;
pub mod nodes;
mod placement;
pub mod protection;
pub mod pvcontroller;
pub mod retry;
pub mod scheduler;
pub mod services;
mod snapshot_api;
pub mod snapshots;
mod volume_data;
mod volumes;
pub mod workloads;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::broadcast;

/// How long an agent goes without a pass when nothing it watches changed and no retry is due
/// ([`due_by`]): what it waits for is not always an API change (a copy finishing on a thread).
pub const RESYNC: Duration = Duration::from_secs(10);

/// The changes the agents wake on: one watch per kind they read (pods, claims, volumes, classes,
/// nodes, workloads, Services, APIServices, the three snapshot kinds, and the kinds an added
/// agent reads), shared by every agent of the cluster. The watches stop when the last subscriber goes.
#[derive(Clone)]
pub struct Changes {
    /// When each change was seen: a pass woken by it must read the cluster after that.
    tx: broadcast::Sender<Instant>,
    _watches: Arc<Watches>,
    reads: Arc<SharedReads>,
}

/// The last [`Snapshot`] read for the agents, and when its reading began. Every agent wakes on
/// the same change and reads the same kinds; one read serves all of them, so a change costs
/// one list of each kind instead of one per agent.
#[derive(Default)]
struct SharedReads {
    latest: std::sync::Mutex<Option<(Instant, Arc<Snapshot>)>>,
    /// Held while reading: the agents that want a read wait for the one under way.
    reading: tokio::sync::Mutex<()>,
}

impl SharedReads {
    fn fresh(&self, since: Instant) -> Option<Arc<Snapshot>> {
        let latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        latest
            .as_ref()
            .filter(|(began, _)| *began >= since)
            .map(|(_, s)| s.clone())
    }

    /// A snapshot whose reading began at `since` or later: the last one if it did, else a
    /// new one (after the read under way, which may do).
    async fn read(&self, client: &Client, since: Instant) -> Result<Arc<Snapshot>, kube::Error> {
        if let Some(s) = self.fresh(since) {
            return Ok(s);
        }
        let _reading = self.reading.lock().await;
        if let Some(s) = self.fresh(since) {
            return Ok(s);
        }
        let began = Instant::now();
        let snapshot = Arc::new(Snapshot::read(client).await?);
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some((began, snapshot.clone()));
        Ok(snapshot)
    }
}

/// Where an agent's pass reads the cluster: straight from the API (a pass driven by a test
/// sees what the test just wrote), or the cluster's shared reads (the agents' loops).
#[derive(Clone)]
pub enum Reader {
    Api(Client),
    Shared(Client, Changes),
}

impl Reader {
    /// The cluster, as of the start of this pass's freshness ([`FRESH`]) or later.
    pub async fn read(&self) -> Result<Arc<Snapshot>, kube::Error> {
        match self {
            Reader::Api(client) => Ok(Arc::new(Snapshot::read(client).await?)),
            Reader::Shared(client, changes) => {
                let since = FRESH.try_with(|s| *s).unwrap_or_else(|_| Instant::now());
                changes.reads.read(client, since).await
            }
        }
    }
}

struct Watches(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Watches {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Send a wake-up for every event of `stream`; an error (a kind whose CRD is not installed yet)
/// is tried again a second later rather than backing off for long.
fn forward<S, T, E>(stream: S, tx: &broadcast::Sender<Instant>) -> tokio::task::JoinHandle<()>
where
    S: futures::Stream<Item = Result<T, E>> + Send + 'static,
    T: Send,
    E: Send,
{
    let tx = tx.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => {
                    let _ = tx.send(Instant::now());
                }
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    })
}

fn watch<K>(client: &Client, tx: &broadcast::Sender<Instant>) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default + Clone + Eq + std::hash::Hash,
{
    forward(
        watcher(Api::<K>::all(client.clone()), watcher::Config::default()),
        tx,
    )
}

impl Changes {
    /// Start the watches of the kinds the agents read.
    pub fn start(client: &Client) -> Changes {
        Changes::start_with(client, &[])
    }

    /// Start the watches, with `extra` kinds besides (those an added agent reads).
    pub fn start_with(client: &Client, extra: &[kube::api::ApiResource]) -> Changes {
        let (tx, _) = broadcast::channel(16);
        let mut tasks = vec![
            watch::<Pod>(client, &tx),
            watch::<PersistentVolumeClaim>(client, &tx),
            watch::<PersistentVolume>(client, &tx),
            watch::<StorageClass>(client, &tx),
            watch::<Node>(client, &tx),
            watch::<k8s_openapi::api::apps::v1::Deployment>(client, &tx),
            watch::<k8s_openapi::api::apps::v1::ReplicaSet>(client, &tx),
            watch::<k8s_openapi::api::core::v1::Service>(client, &tx),
            watch::<k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService>(
                client, &tx,
            ),
        ];
        for resource in extra {
            let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), resource);
            tasks.push(forward(watcher(api, watcher::Config::default()), &tx));
        }
        for (kind, plural) in [
            ("VolumeSnapshot", "volumesnapshots"),
            ("VolumeSnapshotContent", "volumesnapshotcontents"),
            ("VolumeSnapshotClass", "volumesnapshotclasses"),
        ] {
            let resource = snapshot_api::resource(kind, plural);
            let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
            tasks.push(forward(watcher(api, watcher::Config::default()), &tx));
        }
        Changes {
            tx,
            _watches: Arc::new(Watches(tasks)),
            reads: Arc::default(),
        }
    }

    /// Wake every agent: something they read changed outside the API (a pod's worker ended).
    pub fn poke(&self) {
        let _ = self.tx.send(Instant::now());
    }

    /// A subscription for one agent.
    pub fn subscribe(&self) -> Wake {
        Wake {
            rx: self.tx.subscribe(),
            _changes: self.clone(),
        }
    }
}

/// One agent's subscription to [`Changes`].
pub struct Wake {
    rx: broadcast::Receiver<Instant>,
    _changes: Changes,
}

impl Wake {
    /// Wait for a change (or [`RESYNC`]), then `every` more so that a burst is taken at once.
    /// Returns when the last change taken was seen (`None`: none, a resync or a retry).
    pub async fn next(&mut self, every: Duration) -> Option<Instant> {
        let due = DUE.try_with(|d| d.take()).ok().flatten();
        let quiet = due.map_or(RESYNC, |at| {
            at.saturating_duration_since(Instant::now()).min(RESYNC)
        });
        let mut seen = tokio::select! {
            r = self.rx.recv() => match r {
                Ok(at) => Some(at),
                // Missed wake-ups: the changes were made before now.
                Err(broadcast::error::RecvError::Lagged(_)) => Some(Instant::now()),
                Err(broadcast::error::RecvError::Closed) => None,
            },
            _ = tokio::time::sleep(quiet) => None,
        };
        tokio::time::sleep(every).await;
        // What arrived meanwhile is seen by the pass about to run.
        loop {
            match self.rx.try_recv() {
                Ok(at) => seen = Some(seen.map_or(at, |s| s.max(at))),
                Err(broadcast::error::TryRecvError::Lagged(_)) => seen = Some(Instant::now()),
                Err(_) => break,
            }
        }
        seen
    }
}

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
        k8s_rules::naming::prefix(text, max - hash.len() - 1)
    )
}

pub use k8s_rules::naming::event_name;

/// A suffix for an event that is new each time: the time in nanoseconds, in hex, as kube's
/// recorder uses, and never the same twice in this process.
pub fn unique_suffix() -> String {
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

/// What the agents decide from: every claim, volume, class, node and pod, and the
/// snapshot.storage.k8s.io objects (as JSON: k8s-openapi has no types for them), read in one go.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub claims: Vec<PersistentVolumeClaim>,
    pub pods: Vec<Pod>,
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
    let resource = snapshot_api::resource(kind, plural);
    let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|o| serde_json::to_value(o).ok())
        .collect())
}

pub(crate) async fn list_all<K>(client: &Client) -> Result<Vec<K>, kube::Error>
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
            pods: list_all(client).await?,
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
