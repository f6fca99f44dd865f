//! The development cluster put together: the API server on a loopback address, the nodes, a
//! default `local-path` class and the agents, all in this process. `cdi dev up` runs this.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::agents::kubelet::{self, KubeletConfig};
use crate::agents::localpath::{self, Driver, NodeDirs};
use crate::agents::nodes::{NodeConfig, default_nodes};
use crate::agents::{Changes, protection, pvcontroller, scheduler, snapshots};
use crate::apiserver::{self, ApiServer};

/// What to start.
#[derive(Debug, Clone)]
pub struct Config {
    pub addr: SocketAddr,
    /// Kubeconfig, node data directories (`nodes/<name>`).
    pub dir: PathBuf,
    pub nodes: Vec<NodeConfig>,
    /// How often each agent looks at the cluster.
    pub every: Duration,
    /// What the kubelets run.
    pub kubelet: KubeletConfig,
    /// Where the API server appends its authorization decisions, if anywhere.
    pub audit_log: Option<PathBuf>,
    /// What the composer adds: kinds, and agents that act on them.
    pub extras: Extras,
}

/// An agent added to the cluster's own: started with the others on the in-process client and
/// the shared [`Changes`], and stopped with them.
pub type AgentFn = std::sync::Arc<
    dyn Fn(Client, Changes, Duration) -> futures::future::BoxFuture<'static, ()> + Send + Sync,
>;

/// What a composer adds to the simulated cluster: custom resource definitions made at start,
/// kinds whose changes wake the agents, and agents of its own (a stand-in for another project's
/// controller, such as a VM runtime consuming claims).
#[derive(Clone, Default)]
pub struct Extras {
    pub crds: Vec<CustomResourceDefinition>,
    pub watch: Vec<kube::api::ApiResource>,
    pub agents: Vec<AgentFn>,
}

impl std::fmt::Debug for Extras {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extras")
            .field("crds", &self.crds.len())
            .field("watch", &self.watch)
            .field("agents", &self.agents.len())
            .finish()
    }
}

impl Config {
    pub fn new(dir: PathBuf, addr: SocketAddr) -> Config {
        Config {
            addr,
            dir,
            nodes: default_nodes(),
            every: Duration::from_millis(200),
            kubelet: KubeletConfig::default(),
            audit_log: None,
            extras: Extras::default(),
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// The static tokens the API server accepts besides the admin's and ServiceAccounts'
    /// (`cdi dev kubeconfig --user` adds to it).
    pub fn token_file(&self) -> PathBuf {
        token_file(&self.dir)
    }
}

/// The token file of the cluster whose state is in `dir`.
pub fn token_file(dir: &std::path::Path) -> PathBuf {
    dir.join("tokens.csv")
}

/// A running cluster; dropping it stops the agents and the server.
pub struct Running {
    pub url: String,
    pub kubeconfig: PathBuf,
    pub server: ApiServer,
    /// An in-process client (no network).
    pub client: Client,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    kubelets: Kubelets,
}

impl Running {
    /// Wait until the server task ends (it does not, unless it fails).
    pub async fn serve_forever(&mut self) {
        if let Some(server) = self.tasks.first_mut() {
            let _ = server.await;
        }
    }
}

impl Running {
    /// Restart every node's kubelet, as a crash of the node agent with its containers would:
    /// the pods' processes are killed, and the new kubelets start the pods again.
    pub async fn restart_kubelets(&mut self) {
        self.kubelets.restart().await;
        tracing::info!(target: "kubesim::agents::kubelet", "restarted every kubelet");
    }

    /// Stop the agents and the server, and wait until they are gone: the kubelets' pods are
    /// killed by then.
    pub async fn stop(mut self) {
        let mut tasks = std::mem::take(&mut self.tasks);
        tasks.append(&mut self.kubelets.tasks);
        abort_all(tasks).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in self.tasks.iter().chain(&self.kubelets.tasks) {
            t.abort();
        }
    }
}

/// The class the seed's example uses, made the default: volumes wait for their first consumer.
fn default_class() -> StorageClass {
    serde_json::from_value(json!({
        "metadata": {"name": "local-path",
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": localpath::PROVISIONER,
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
    }))
    .expect("a StorageClass")
}

/// The CSI-like driver's class, also WaitForFirstConsumer; its volumes can grow.
fn csi_class() -> StorageClass {
    serde_json::from_value(json!({
        "metadata": {"name": "csi"},
        "provisioner": localpath::CSI_DRIVER,
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
        "allowVolumeExpansion": true,
    }))
    .expect("a StorageClass")
}

/// The second CSI driver's class: it fills volumes from nothing and does not grow them.
fn shared_class() -> StorageClass {
    serde_json::from_value(json!({
        "metadata": {"name": "shared"},
        "provisioner": localpath::SHARED_DRIVER,
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
    }))
    .expect("a StorageClass")
}

/// The CSI-like driver's default VolumeSnapshotClass (CDI's snapshot clones look for one).
fn snapshot_class() -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": snapshots::API_VERSION, "kind": "VolumeSnapshotClass",
        "metadata": {"name": "csi-snapclass",
            "annotations": {snapshots::DEFAULT_CLASS: "true"}},
        "driver": localpath::CSI_DRIVER,
        "deletionPolicy": "Delete",
    }))
    .expect("a VolumeSnapshotClass")
}

/// Start the agents against `client`: scheduler, PV controller, in-use protection, snapshotter,
/// the three provisioners (volumes under
/// `dirs`) and a kubelet for each of `nodes` (pods under the node's directory), each looking
/// on each change they watch (at least `every` apart).
pub fn spawn_agents(
    client: &Client,
    dirs: &NodeDirs,
    nodes: &[String],
    kubelet_config: &KubeletConfig,
    every: Duration,
) -> Vec<tokio::task::JoinHandle<()>> {
    let records = crate::agents::services::agent::Records::default();
    let extras = Extras::default();
    let (mut tasks, kubelets) =
        spawn_all(client, dirs, nodes, kubelet_config, every, records, &extras);
    tasks.append(&mut kubelets.into_tasks());
    tasks
}

/// The cluster DNS server, on port 53 of a free address of 127.53.0.0/16 (port 53: the only one
/// a resolv.conf can name). None where this process may not bind it (not root).
async fn start_dns(
    records: crate::agents::services::agent::Records,
) -> Option<(std::net::Ipv4Addr, tokio::task::JoinHandle<()>)> {
    for _ in 0..16 {
        let pick = crate::apiserver::auth::random_hex(2);
        let (a, b) = (
            u8::from_str_radix(&pick[..2], 16).unwrap_or(1).max(1),
            u8::from_str_radix(&pick[2..], 16)
                .unwrap_or(1)
                .clamp(1, 254),
        );
        let ip = std::net::Ipv4Addr::new(127, 53, a, b);
        match tokio::net::UdpSocket::bind((ip, 53)).await {
            Ok(socket) => {
                let task = tokio::spawn(crate::agents::services::agent::serve_dns(socket, records));
                return Some((ip, task));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => {
                tracing::info!(target: "kubesim::agents::services", error = %e,
                    "no cluster DNS: binding port 53 needs root");
                return None;
            }
        }
    }
    None
}

/// The cluster-wide agents' tasks, and the kubelets apart (they can be restarted).
fn spawn_all(
    client: &Client,
    dirs: &NodeDirs,
    nodes: &[String],
    kubelet_config: &KubeletConfig,
    every: Duration,
    dns: crate::agents::services::agent::Records,
    extras: &Extras,
) -> (Vec<tokio::task::JoinHandle<()>>, Kubelets) {
    // One set of watches wakes them all; it goes with the last of them.
    let changes = Changes::start_with(client, &extras.watch);
    let mut tasks = vec![
        tokio::spawn(scheduler::agent::run(
            client.clone(),
            changes.clone(),
            every,
        )),
        tokio::spawn(pvcontroller::agent::run(
            client.clone(),
            changes.clone(),
            every,
        )),
        tokio::spawn(snapshots::agent::run(
            client.clone(),
            dirs.clone(),
            changes.clone(),
            every,
        )),
        tokio::spawn(protection::agent::run(
            client.clone(),
            changes.clone(),
            every,
        )),
        tokio::spawn(crate::agents::workloads::agent::run(
            client.clone(),
            changes.clone(),
            every,
        )),
        tokio::spawn(crate::agents::services::agent::run(
            client.clone(),
            changes.clone(),
            every,
            dns,
        )),
    ];
    for agent in &extras.agents {
        tasks.push(tokio::spawn(agent(client.clone(), changes.clone(), every)));
    }
    for driver in Driver::ALL {
        tasks.push(tokio::spawn(localpath::agent::run(
            client.clone(),
            driver,
            dirs.clone(),
            changes.clone(),
            every,
        )));
    }
    let mut kubelets = Kubelets {
        client: client.clone(),
        dirs: dirs.clone(),
        nodes: nodes.to_vec(),
        config: kubelet_config.clone(),
        changes,
        every,
        tasks: Vec::new(),
    };
    kubelets.spawn();
    (tasks, kubelets)
}

/// The kubelet of every node, and what starting them again takes.
struct Kubelets {
    client: Client,
    dirs: NodeDirs,
    nodes: Vec<String>,
    config: KubeletConfig,
    changes: Changes,
    every: Duration,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Kubelets {
    fn spawn(&mut self) {
        for node in &self.nodes {
            self.tasks.push(tokio::spawn(kubelet::run(
                self.client.clone(),
                node.clone(),
                self.dirs.node(node),
                self.config.clone(),
                self.changes.clone(),
                self.every,
            )));
        }
    }

    /// Stop every kubelet (their pods' processes die with them), wait until they are gone, and
    /// start them again: they find their pods unstarted and start them, as after a node reboot.
    async fn restart(&mut self) {
        abort_all(std::mem::take(&mut self.tasks)).await;
        self.spawn();
    }

    fn into_tasks(self) -> Vec<tokio::task::JoinHandle<()>> {
        self.tasks
    }
}

/// Abort the tasks and wait until every one is gone (a kubelet's pods die as it is dropped).
async fn abort_all(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// Start everything; the kubeconfig is written once the server listens.
pub async fn start(config: &Config) -> anyhow::Result<Running> {
    use anyhow::Context;
    std::fs::create_dir_all(&config.dir)
        .with_context(|| format!("creating {}", config.dir.display()))?;
    // The protection agent runs with the others: claims in use are kept.
    // Tokens of an earlier run mean nothing to this one's users.
    apiserver::write_private(&config.token_file(), "")
        .with_context(|| format!("writing {}", config.token_file().display()))?;
    let dirs = NodeDirs {
        root: config.dir.join("nodes"),
    };
    let server = ApiServer::new()
        .protecting_storage()
        .with_token_file(config.token_file())
        .with_pod_logs(std::sync::Arc::new(dirs.clone()));
    let server = match &config.audit_log {
        Some(path) => server
            .with_audit_log(path)
            .with_context(|| format!("opening the audit log {}", path.display()))?,
        None => server,
    };
    let (bound, server_task) = server
        .serve(config.addr)
        .await
        .with_context(|| format!("listening on {}", config.addr))?;
    let url = format!("https://{bound}");
    tracing::info!(target: "kubesim::apiserver", %url, "API server listening");
    let client = Client::new(server.router(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    for (i, n) in config.nodes.iter().enumerate() {
        let dir = dirs.node(&n.name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        nodes.create(&PostParams::default(), &n.node(i)).await?;
    }
    let classes = Api::<StorageClass>::all(client.clone());
    classes
        .create(&PostParams::default(), &default_class())
        .await?;
    classes.create(&PostParams::default(), &csi_class()).await?;
    classes
        .create(&PostParams::default(), &shared_class())
        .await?;
    // The CSIDriver objects tell CDI the CSI drivers' claims take the populator path.
    for name in [localpath::CSI_DRIVER, localpath::SHARED_DRIVER] {
        let driver: CSIDriver = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"attachRequired": false, "podInfoOnMount": false,
                "volumeLifecycleModes": ["Persistent"]},
        }))?;
        Api::<CSIDriver>::all(client.clone())
            .create(&PostParams::default(), &driver)
            .await?;
    }
    let snapshot_classes: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &snapshots::agent::resource("VolumeSnapshotClass", "volumesnapshotclasses"),
    );
    snapshot_classes
        .create(&PostParams::default(), &snapshot_class())
        .await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in &config.extras.crds {
        crds.create(&PostParams::default(), crd).await?;
    }
    let node_names: Vec<String> = config.nodes.iter().map(|n| n.name.clone()).collect();
    let mut tasks = vec![server_task];
    let records = crate::agents::services::agent::Records::default();
    let mut kubelet = config.kubelet.clone();
    if let Some((ip, dns)) = start_dns(records.clone()).await {
        tracing::info!(target: "kubesim::agents::services", %ip, "cluster DNS listening");
        kubelet.dns = Some(ip);
        tasks.push(dns);
    }
    let (agents, kubelets) = spawn_all(
        &client,
        &dirs,
        &node_names,
        &kubelet,
        config.every,
        records,
        &config.extras,
    );
    tasks.extend(agents);
    let kubeconfig = config.kubeconfig();
    apiserver::write_private(&kubeconfig, &server.kubeconfig(&url))
        .with_context(|| format!("writing {}", kubeconfig.display()))?;
    Ok(Running {
        url,
        kubeconfig,
        server,
        client,
        tasks,
        kubelets,
    })
}
