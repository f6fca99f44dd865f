//! The kubelet of each node: runs the pods bound to its node as host processes (see `images` for
//! what runs, `setup` for how volumes and configuration reach them, `worker` for a pod's life),
//! gives each pod an address of its own from the node's `podCIDR` (in 127.0.0.0/8, all local),
//! and finishes their deletion: the API server only marks a pod on a node as deleted; its kubelet
//! stops the containers and then deletes it with a zero grace period.

mod config;
pub(crate) mod events;
pub mod images;
pub mod probe;
pub mod setup;
pub mod status;
pub mod worker;

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use tokio::sync::watch;

pub use config::{KubeletConfig, PodEnv};
pub use images::ImageMap;
pub use status::Backoff;

use setup::PodDir;

/// The first free address of `cidr` (`a.b.c.d/n`) from the `start`th on (wrapping), skipping
/// the network, the node's own (the first host) and the broadcast addresses. The kubelet starts
/// at a random place: development clusters running side by side on one machine share
/// 127.0.0.0/8, and two pods of theirs on one address and port would not both listen.
pub fn allocate(cidr: &str, used: &BTreeSet<Ipv4Addr>, start: u32) -> Option<Ipv4Addr> {
    let (base, bits) = cidr.split_once('/')?;
    let base: Ipv4Addr = base.parse().ok()?;
    let bits: u32 = bits.parse().ok().filter(|b| *b <= 30)?;
    let size = 1u32 << (32 - bits);
    let net = u32::from(base) & !(size - 1);
    let hosts = size - 3;
    (0..hosts)
        .map(|i| Ipv4Addr::from(net + 2 + (start % hosts + i) % hosts))
        .find(|ip| !used.contains(ip))
}

/// The node's address: its InternalIP.
fn internal_ip(node: &Node) -> Option<Ipv4Addr> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")?
        .address
        .parse()
        .ok()
}

struct Worker {
    stop: watch::Sender<Option<Duration>>,
    task: tokio::task::JoinHandle<()>,
    ip: Ipv4Addr,
    dir: PodDir,
}

/// One node's kubelet.
pub struct Kubelet {
    client: Client,
    node: String,
    dir: PathBuf,
    config: KubeletConfig,
    every: Duration,
    workers: HashMap<String, Worker>,
    /// Wakes the agents when a worker ends (set when run by `run`).
    poke: Option<crate::agents::Changes>,
}

fn grace(pod: &Pod) -> Duration {
    let secs = pod
        .metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30);
    Duration::from_secs(secs.max(0) as u64)
}

impl Kubelet {
    /// The kubelet of `node`, keeping pod directories under `dir/pods`.
    pub fn new(
        client: Client,
        node: &str,
        dir: PathBuf,
        config: KubeletConfig,
        every: Duration,
    ) -> Kubelet {
        Kubelet {
            client,
            node: node.into(),
            dir,
            config,
            every,
            workers: HashMap::new(),
            poke: None,
        }
    }

    async fn delete_now(&self, pod: &Pod) -> Result<(), kube::Error> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or("");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        match api
            .delete(name, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => {
                tracing::info!(pod = %format!("{ns}/{name}"), node = %self.node, "deleted pod")
            }
            // Someone else finished it meanwhile.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    fn pod_dir(&self, uid: &str) -> PodDir {
        pod_dir(&self.dir, uid)
    }

    /// Remove a pod's directory, unless its uid could name anything but one directory below
    /// `pods` (the worker refuses such a pod before making anything).
    fn remove_pod_dir(&self, uid: &str) {
        if setup::bad_component(uid).is_none() {
            let _ = std::fs::remove_dir_all(self.pod_dir(uid).0);
        }
    }

    /// One pass: start workers for new pods, stop those of deleted ones, and delete the pods
    /// whose containers have stopped.
    pub async fn pass(&mut self) -> Result<(), kube::Error> {
        let node = Api::<Node>::all(self.client.clone())
            .get(&self.node)
            .await?;
        let cidr = node.spec.as_ref().and_then(|s| s.pod_cidr.clone());
        let host_ip = internal_ip(&node).unwrap_or(Ipv4Addr::LOCALHOST);
        let pods: Api<Pod> = Api::all(self.client.clone());
        let on_node = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        let listed = pods.list(&on_node).await?.items;
        let mut seen = BTreeSet::new();
        for pod in &listed {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            seen.insert(uid.clone());
            let deleting = pod.metadata.deletion_timestamp.is_some();
            match self.workers.get(&uid) {
                Some(w) if deleting => {
                    if w.stop.borrow().is_none() {
                        let _ = w.stop.send(Some(grace(pod)));
                    }
                    if w.task.is_finished() {
                        self.delete_now(pod).await?;
                        if self.workers.remove(&uid).is_some() {
                            self.remove_pod_dir(&uid);
                        }
                    }
                }
                Some(_) => {}
                None if deleting => {
                    self.delete_now(pod).await?;
                    self.remove_pod_dir(&uid);
                }
                None => {
                    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
                    if matches!(phase, Some("Succeeded" | "Failed")) {
                        continue;
                    }
                    let Some(cidr) = cidr.as_deref() else {
                        tracing::warn!(node = %self.node, "the node has no spec.podCIDR: no pod addresses to give");
                        continue;
                    };
                    let used: BTreeSet<Ipv4Addr> = self.workers.values().map(|w| w.ip).collect();
                    let start = u32::from_str_radix(&crate::apiserver::auth::random_hex(4), 16)
                        .unwrap_or(0);
                    let Some(ip) = allocate(cidr, &used, start) else {
                        tracing::warn!(node = %self.node, cidr, "no free pod address");
                        continue;
                    };
                    let ctx = worker::Ctx {
                        client: self.client.clone(),
                        node: self.node.clone(),
                        images: self.config.images.clone(),
                        backoff: self.config.backoff,
                        every: self.every,
                        host_ip,
                        dns: self.config.dns,
                        pod_env: self.config.pod_env.clone(),
                    };
                    let dir = self.pod_dir(&uid);
                    let (stop, stop_rx) = watch::channel(None);
                    let run = worker::run_pod(ctx, pod.clone(), dir.clone(), ip, stop_rx);
                    let poke = self.poke.clone();
                    // A worker that ended is news for the next pass (its pod may be deleted).
                    let task = tokio::spawn(async move {
                        run.await;
                        if let Some(p) = poke {
                            p.poke();
                        }
                    });
                    tracing::info!(pod = %format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or(""), pod.metadata.name.as_deref().unwrap_or("")), %ip, "starting pod");
                    self.workers.insert(
                        uid,
                        Worker {
                            stop,
                            task,
                            ip,
                            dir,
                        },
                    );
                }
            }
        }
        // Pods deleted at once (grace period 0) by someone else: stop their processes now.
        let gone: Vec<String> = self
            .workers
            .keys()
            .filter(|u| !seen.contains(*u))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(w) = self.workers.remove(&uid) {
                let _ = w.stop.send(Some(Duration::ZERO));
                let dir = (setup::bad_component(&uid).is_none()).then_some(w.dir);
                tokio::spawn(async move {
                    let _ = w.task.await;
                    if let Some(dir) = dir {
                        let _ = std::fs::remove_dir_all(&dir.0);
                    }
                });
            }
        }
        Ok(())
    }
}

impl Drop for Kubelet {
    /// The kubelet going away takes its pods' processes with it (their groups are killed as the
    /// aborted workers drop them).
    fn drop(&mut self) {
        for w in self.workers.values() {
            w.task.abort();
        }
    }
}

/// Run passes for `node` until the task is dropped.
pub async fn run(
    client: Client,
    node: String,
    dir: PathBuf,
    config: KubeletConfig,
    changes: crate::agents::Changes,
    every: Duration,
) {
    let mut kubelet = Kubelet::new(client, &node, dir, config, every);
    kubelet.poke = Some(changes.clone());
    run_on_change!(changes.subscribe(), every, kubelet.pass())
}

/// A pod's directory in its node's directory.
fn pod_dir(node_dir: &std::path::Path, uid: &str) -> PodDir {
    PodDir(node_dir.join("pods").join(uid))
}

/// The kubelets keep containers' logs in the pods' directories: `pods/log` reads them there.
impl crate::apiserver::server::PodLogs for crate::agents::volumes::NodeDirs {
    fn log_file(
        &self,
        node: &str,
        pod_uid: &str,
        container: &str,
        instance: u32,
    ) -> std::path::PathBuf {
        pod_dir(&self.node(node), pod_uid).log(container, instance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_from_the_node_cidr() {
        let mut used = BTreeSet::new();
        let first = allocate("127.2.0.0/16", &used, 0).unwrap();
        assert_eq!(first, Ipv4Addr::new(127, 2, 0, 2));
        used.insert(first);
        assert_eq!(
            allocate("127.2.0.0/16", &used, 0),
            Some(Ipv4Addr::new(127, 2, 0, 3))
        );
        // From a random start, wrapping past the broadcast address to the first host.
        assert_eq!(
            allocate("127.9.0.0/29", &used, 4),
            Some(Ipv4Addr::new(127, 9, 0, 6))
        );
        assert_eq!(
            allocate("127.9.0.0/29", &[Ipv4Addr::new(127, 9, 0, 6)].into(), 4),
            Some(Ipv4Addr::new(127, 9, 0, 2))
        );
        let full: BTreeSet<Ipv4Addr> = (2..7).map(|i| Ipv4Addr::new(127, 9, 0, i)).collect();
        assert_eq!(allocate("127.9.0.0/29", &full, 3), None);
        assert_eq!(allocate("nonsense", &used, 0), None);
    }
}
