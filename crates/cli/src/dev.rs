//! `cdi dev`: the embedded development cluster.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use kubesim::agents::kubelet::ImageMap;
use kubesim::agents::nodes::{NodeConfig, default_nodes, parse_nodes};
use kubesim::apiserver::{self, ApiServer};
use kubesim::cluster;

fn default_dir() -> PathBuf {
    std::env::temp_dir().join("cdi-dev")
}

#[derive(clap::Subcommand)]
pub enum DevCommand {
    /// Start the development cluster in the background: API server, three nodes, scheduler,
    /// PV controller, local-path and two CSI provisioners (classes `local-path`, the default,
    /// `csi`, which clones, snapshots and grows, and `shared`, which does none of that; all
    /// WaitForFirstConsumer), a kubelet per node that runs pods as host processes, and a
    /// KubeVirt-like consumer of VirtualMachines.
    Up {
        /// State directory: kubeconfig, pid file, logs/ (one per component), nodes/ (data).
        #[arg(long, default_value_os_t = default_dir())]
        dir: PathBuf,
        /// Where the API server listens (port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:6443")]
        addr: SocketAddr,
        /// Run in this process instead of in the background.
        #[arg(long)]
        foreground: bool,
        /// Run containers of image NAME (its last path segment, no tag: `cdi-importer` for
        /// `quay.io/kubevirt/cdi-importer:v1.60`) as PROGRAM [ARGS...] followed by the container's
        /// args. Repeatable. `cdi-importer` runs `cdi importer` unless mapped here.
        #[arg(long = "image", value_name = "NAME=PROGRAM [ARGS...]", value_parser = parse_image)]
        images: Vec<(String, Vec<String>)>,
        /// The nodes, from a YAML list of `{name, labels, taints: ["key=value:Effect"], cpu,
        /// memory, pods}` instead of the default three.
        #[arg(long, value_name = "FILE")]
        nodes: Option<PathBuf>,
        /// Install CDI inside the cluster too, as a cluster admin would (the manifests of `cdi
        /// install`, then the example CDI resource): the operator runs `cdi controller`
        /// (Deployment `cdi-deployment`), the token API `cdi apiserver` (`cdi-apiserver`) and
        /// `cdi upload-proxy` (`cdi-uploadproxy`, whose address CDIConfig gives) in namespace
        /// `cdi`, each under its own ServiceAccount, so that `cdi image-upload` works with no
        /// other setup.
        #[arg(long)]
        cdi: bool,
        /// Append every authorization decision of the API server to `logs/audit.log` (one
        /// audit.k8s.io/v1 Event per line, as kube-apiserver's `--audit-log-path` writes them):
        /// what each component and user was allowed and refused.
        #[arg(long)]
        audit_log: bool,
    },
    /// Print a kubeconfig for the development cluster: the admin's, or with `--user` one for a
    /// user who may do only what RBAC grants NAME and its groups (a token the running cluster
    /// accepts from then on, until it stops).
    Kubeconfig {
        #[arg(long, default_value_os_t = default_dir())]
        dir: PathBuf,
        /// The user's name.
        #[arg(long, value_name = "NAME")]
        user: Option<String>,
        /// A group of the user (repeatable).
        #[arg(long = "group", value_name = "GROUP", requires = "user")]
        groups: Vec<String>,
    },
    /// Stop the development cluster started by `cdi dev up`.
    Down {
        #[arg(long, default_value_os_t = default_dir())]
        dir: PathBuf,
    },
    /// The virt-launcher stand-in the kubelet runs for a VM's pod (image `virt-launcher`): checks
    /// that each disk image exists, reports its format and virtual size, then runs until stopped.
    Launcher {
        /// The VM's name.
        #[arg(long)]
        name: String,
        /// A disk, as NAME=PATH (the image file of a Filesystem volume, or the Block device).
        #[arg(long = "disk", value_name = "NAME=PATH")]
        disks: Vec<String>,
    },
    /// Run the embedded Kubernetes API server and write a kubeconfig for kubectl and kube-rs.
    Apiserver {
        /// Where to listen (port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:6443")]
        addr: SocketAddr,
        /// Where to write the kubeconfig (the admin's token and the CA to trust).
        #[arg(long, default_value_os_t = std::env::temp_dir().join("cdi-dev").join("kubeconfig"))]
        kubeconfig: PathBuf,
    },
}

fn parse_image(rule: &str) -> Result<(String, Vec<String>), String> {
    ImageMap::parse_rule(rule)
}

/// The images the kubelets run: cdi-rs's pod programs are subcommands of this executable.
pub(crate) fn image_map(extra: &[(String, Vec<String>)]) -> anyhow::Result<ImageMap> {
    let exe = std::env::current_exe().context("finding the cdi executable")?;
    let exe = exe.to_string_lossy().into_owned();
    let mut map = ImageMap::default()
        .with("cdi-importer", vec![exe.clone(), "importer".into()])
        .with(
            "cdi-uploadserver",
            vec![exe.clone(), "upload-server".into()],
        )
        .with("cdi-cloner", vec![exe.clone(), "cloner".into()])
        .with("cdi-controller", vec![exe.clone(), "controller".into()])
        .with("cdi-uploadproxy", vec![exe.clone(), "upload-proxy".into()])
        .with("cdi-apiserver", vec![exe.clone(), "apiserver".into()])
        .with("cdi-operator", vec![exe.clone(), "operator".into()])
        .with("virt-launcher", vec![exe, "dev".into(), "launcher".into()]);
    for (name, argv) in extra {
        map = map.with(name, argv.clone());
    }
    Ok(map)
}

fn read_nodes(file: Option<&Path>) -> anyhow::Result<Vec<NodeConfig>> {
    let Some(file) = file else {
        return Ok(default_nodes());
    };
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    parse_nodes(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))
}

pub fn run(command: &DevCommand) -> anyhow::Result<()> {
    match command {
        DevCommand::Up {
            dir,
            addr,
            foreground: true,
            images,
            nodes,
            cdi,
            audit_log,
        } => up_here(
            dir,
            *addr,
            image_map(images)?,
            read_nodes(nodes.as_deref())?,
            *cdi,
            *audit_log,
        ),
        DevCommand::Up {
            dir,
            addr,
            foreground: false,
            images,
            nodes,
            cdi,
            audit_log,
        } => {
            // Checked here, so a bad file is reported in this terminal.
            read_nodes(nodes.as_deref())?;
            let nodes = match nodes {
                Some(n) => Some(std::path::absolute(n).context("finding the nodes file")?),
                None => None,
            };
            up_in_background(dir, *addr, images, nodes.as_deref(), *cdi, *audit_log)
        }
        DevCommand::Down { dir } => down(dir),
        DevCommand::Kubeconfig { dir, user, groups } => {
            print!("{}", user_kubeconfig(dir, user.as_deref(), groups)?);
            Ok(())
        }
        DevCommand::Launcher { name, disks } => crate::launcher::run(name, disks),
        DevCommand::Apiserver { addr, kubeconfig } => {
            let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
            runtime.block_on(async {
                let server = ApiServer::new();
                let (bound, task) = server
                    .serve(*addr)
                    .await
                    .map_err(|e| anyhow::anyhow!("listening on {addr}: {e}"))?;
                if let Some(dir) = kubeconfig.parent() {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                }
                let url = format!("https://{bound}");
                apiserver::write_private(kubeconfig, &server.kubeconfig(&url))
                    .with_context(|| format!("writing {}", kubeconfig.display()))?;
                println!("API server: {url}");
                println!("kubeconfig: {}", kubeconfig.display());
                println!(
                    "try: KUBECONFIG={} kubectl get namespaces",
                    kubeconfig.display()
                );
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = task => {}
                }
                Ok(())
            })
        }
    }
}

/// The log file of each component, by the tracing targets its code logs under (the protection
/// agent beside the PV controller, as both run in kube-controller-manager).
const COMPONENT_LOGS: &[(&str, &[&str])] = &[
    ("apiserver.log", &["kubesim::apiserver"]),
    ("scheduler.log", &["kubesim::agents::scheduler"]),
    (
        "pv-controller.log",
        &[
            "kubesim::agents::pvcontroller",
            "kubesim::agents::protection",
        ],
    ),
    ("provisioners.log", &["kubesim::agents::localpath"]),
    ("kubelet.log", &["kubesim::agents::kubelet"]),
    ("snapshotter.log", &["kubesim::agents::snapshots"]),
    ("vm-consumer.log", &["cdi_dev::vmconsumer"]),
    (
        "controller-manager.log",
        &["kubesim::agents::workloads", "kubesim::agents::services"],
    ),
];

fn pid_file(dir: &Path) -> PathBuf {
    dir.join("cdi-dev.pid")
}

/// The pid of the cluster running for `dir`, if one is (a stale pid file is not).
fn running(dir: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pid_file(dir))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // The pid may have been reused since: check it is still our process.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let ours = args.contains(&b"--foreground".as_slice()) && args.contains(&b"up".as_slice());
    ours.then_some(pid)
}

/// Refuse when a cluster already runs for `dir`; make its log directory.
fn prepare(dir: &Path) -> anyhow::Result<PathBuf> {
    if let Some(pid) = running(dir) {
        bail!(
            "a development cluster is already up in {} (pid {pid}); run `cdi dev down --dir {}` first",
            dir.display(),
            dir.display()
        );
    }
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    Ok(logs)
}

fn up_here(
    dir: &Path,
    addr: SocketAddr,
    images: ImageMap,
    nodes: Vec<NodeConfig>,
    cdi: bool,
    audit_log: bool,
) -> anyhow::Result<()> {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;

    let logs = prepare(dir)?;
    let mut layers = Vec::new();
    for (file, targets) in COMPONENT_LOGS {
        let path = logs.join(file);
        let f = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        layers.push(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(f))
                .with_filter(
                    Targets::new().with_targets(targets.iter().map(|t| (*t, tracing::Level::INFO))),
                )
                .boxed(),
        );
    }
    tracing_subscriber::registry().with(layers).try_init()?;

    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(async {
        let mut config = cdi_dev::cluster_config(dir.to_path_buf(), addr, images);
        config.nodes = nodes;
        config.audit_log = audit_log.then(|| logs.join("audit.log"));
        let mut running = cluster::start(&config).await?;
        if cdi {
            install_cdi(&running.client)
                .await
                .context("installing CDI in the cluster")?;
        }
        std::fs::write(pid_file(dir), format!("{}\n", std::process::id()))
            .with_context(|| format!("writing {}", pid_file(dir).display()))?;
        println!("API server: {}", running.url);
        println!("kubeconfig: {}", running.kubeconfig.display());
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate())?;
        // SIGUSR1: a node-agent crash on demand, for fault tests.
        let mut restart = signal(SignalKind::user_defined1())?;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = terminate.recv() => break,
                _ = restart.recv() => running.restart_kubelets().await,
                _ = running.serve_forever() => break,
            }
        }
        // The pods' processes go with the cluster.
        running.stop().await;
        let _ = std::fs::remove_file(pid_file(dir));
        Ok(())
    })
}

/// Install CDI as a cluster admin would: the operator's manifests (what `cdi install --print`
/// prints), then the example CDI resource, waiting until the operator reports it Deployed; then
/// CDI's `spec.config` names the upload proxy's Service address (a cluster IP this machine
/// reaches) as where uploads go.
pub(crate) async fn install_cdi(client: &kube::Client) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Service;
    use kube::Api;
    use kube::api::{Patch, PatchParams};
    let release = cdi_core::install::Release::tagged(
        crate::install::REGISTRY,
        env!("CARGO_PKG_VERSION"),
        "cdi",
    );
    let operator = cdi_core::install::operator_manifests(&release);
    let cdi = cdi_core::install::example_cdi();
    let name = crate::install::apply_all(client, &operator, &cdi).await?;
    crate::install::wait_deployed(client, &name, std::time::Duration::from_secs(120)).await?;
    let proxy = Api::<Service>::namespaced(client.clone(), "cdi")
        .get(cdi_core::install::UPLOAD_PROXY)
        .await?;
    let ip = proxy.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
    Api::<cdi_api::config::CDI>::all(client.clone())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"config": {
                "uploadProxyURLOverride": format!("https://{ip}")}}})),
        )
        .await?;
    // The controller copies it into CDIConfig; clients read it there.
    let url = format!("https://{ip}");
    let copied = move |c: Option<&cdi_api::config::CDIConfig>| {
        c.and_then(|c| c.status.as_ref()?.upload_proxy_url.as_deref()) == Some(url.as_str())
    };
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        kube::runtime::wait::await_condition(
            Api::<cdi_api::config::CDIConfig>::all(client.clone()),
            cdi_api::name::CDI_CONFIG,
            copied,
        ),
    )
    .await
    .context("CDIConfig did not take the upload proxy's address from the CDI resource")??;
    Ok(())
}

/// Set CDIConfig's feature gates as an admin would: through the CDI resource's `spec.config` when
/// an operator installed CDI (it is CDIConfig's authority then), else in CDIConfig; returns once
/// CDIConfig holds them.
pub(crate) async fn set_feature_gates(client: &kube::Client, gates: &[&str]) -> anyhow::Result<()> {
    use cdi_api::config::{CDI, CDIConfig};
    use kube::Api;
    use kube::api::{ListParams, Patch, PatchParams};
    let cdis = Api::<CDI>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    match cdis.items.first() {
        Some(cdi) => {
            let patch = serde_json::json!({"spec": {"config": {"featureGates": gates}}});
            Api::<CDI>::all(client.clone())
                .patch(
                    &cdi.metadata.name.clone().unwrap_or_default(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
        }
        None => {
            let patch = serde_json::json!({"spec": {"featureGates": gates}});
            Api::<CDIConfig>::all(client.clone())
                .patch(
                    cdi_api::name::CDI_CONFIG,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
        }
    }
    let want: Vec<String> = gates.iter().map(|g| g.to_string()).collect();
    let held = move |c: Option<&CDIConfig>| {
        c.is_some_and(|c| c.spec.feature_gates.clone().unwrap_or_default() == want)
    };
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        kube::runtime::wait::await_condition(
            Api::<CDIConfig>::all(client.clone()),
            cdi_api::name::CDI_CONFIG,
            held,
        ),
    )
    .await
    .context("CDIConfig did not take the feature gates")??;
    Ok(())
}

/// The admin kubeconfig of the cluster up in `dir`, or one for `user` in `groups` with a fresh
/// token added to the cluster's token file.
fn user_kubeconfig(dir: &Path, user: Option<&str>, groups: &[String]) -> anyhow::Result<String> {
    if running(dir).is_none() {
        bail!(
            "no development cluster is up in {}: start one with `cdi dev up --dir {}`",
            dir.display(),
            dir.display()
        );
    }
    let admin_path = dir.join("kubeconfig");
    let admin = std::fs::read_to_string(&admin_path)
        .with_context(|| format!("reading {}", admin_path.display()))?;
    let Some(user) = user else {
        return Ok(admin);
    };
    // The token file is comma-separated, one user per line.
    for name in std::iter::once(user).chain(groups.iter().map(String::as_str)) {
        if name.trim().is_empty() || name.contains([',', '"', '\n', '\r']) {
            bail!(
                "{name:?} cannot be a user or group name here: it is empty or holds a comma, quote or newline"
            );
        }
    }
    let parsed: serde_json::Value = serde_saphyr::from_str(&admin)
        .with_context(|| format!("reading {}", admin_path.display()))?;
    let cluster = &parsed["clusters"][0]["cluster"];
    let url = cluster["server"].as_str().unwrap_or_default();
    let ca = cluster["certificate-authority-data"]
        .as_str()
        .map(|data| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .map(|pem| String::from_utf8_lossy(&pem).into_owned())
        })
        .transpose()
        .with_context(|| format!("reading the CA of {}", admin_path.display()))?;
    let token = apiserver::auth::random_hex(24);
    let line = apiserver::auth::token_line(&token, user, groups);
    let tokens = cluster::token_file(dir);
    {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&tokens)
            .with_context(|| format!("opening {}", tokens.display()))?;
        file.write_all(line.as_bytes())
            .with_context(|| format!("writing {}", tokens.display()))?;
    }
    Ok(apiserver::kubeconfig(
        url,
        ca.as_deref(),
        &apiserver::KubeconfigUser::Token(&token),
    ))
}

fn up_in_background(
    dir: &Path,
    addr: SocketAddr,
    images: &[(String, Vec<String>)],
    nodes: Option<&Path>,
    cdi: bool,
    audit_log: bool,
) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;

    let logs = prepare(dir)?;
    let _ = std::fs::remove_file(pid_file(dir));
    let log_path = logs.join("cdi-dev.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let exe = std::env::current_exe().context("finding the cdi executable")?;
    let mut command = std::process::Command::new(exe);
    command
        .args([
            "dev",
            "up",
            "--foreground",
            "--addr",
            &addr.to_string(),
            "--dir",
        ])
        .arg(dir);
    for (name, argv) in images {
        command
            .arg("--image")
            .arg(format!("{name}={}", argv.join(" ")));
    }
    if let Some(nodes) = nodes {
        command.arg("--nodes").arg(nodes);
    }
    if cdi {
        command.arg("--cdi");
    }
    if audit_log {
        command.arg("--audit-log");
    }
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a Ctrl-C in this terminal later does not stop it.
        .process_group(0)
        .spawn()
        .context("starting the cluster process")?;
    // Installing CDI waits for its operator to deploy it.
    let up_within = Duration::from_secs(if cdi { 180 } else { 10 });
    let started = std::time::Instant::now();
    while started.elapsed() < up_within {
        if let Some(status) = child.try_wait()? {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!(
                "the cluster process exited ({status}) before it was up:\n{}",
                text.trim_end()
            );
        }
        if running(dir).is_some() {
            let kubeconfig = dir.join("kubeconfig");
            println!("kubeconfig: {}", kubeconfig.display());
            println!("logs:       {}", logs.display());
            println!(
                "try: KUBECONFIG={} kubectl get nodes,storageclasses",
                kubeconfig.display()
            );
            println!("stop: cdi dev down --dir {}", dir.display());
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    bail!(
        "the cluster did not come up within {} s; see {}",
        up_within.as_secs(),
        log_path.display()
    )
}

fn down(dir: &Path) -> anyhow::Result<()> {
    use rustix::process::{Pid, Signal, kill_process, test_kill_process};

    let Some(pid) = running(dir) else {
        let _ = std::fs::remove_file(pid_file(dir));
        println!("no development cluster is running in {}", dir.display());
        return Ok(());
    };
    let target = Pid::from_raw(pid).context("a positive pid")?;
    kill_process(target, Signal::TERM).with_context(|| format!("stopping pid {pid}"))?;
    // Stopped once the process is gone or a zombie (its command line empty), not merely once
    // it has removed its pid file: it still shuts down after that.
    let ended = || {
        test_kill_process(target).is_err()
            || std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.is_empty())
    };
    for _ in 0..100 {
        if ended() {
            println!(
                "stopped the development cluster in {} (pid {pid})",
                dir.display()
            );
            let _ = std::fs::remove_file(pid_file(dir));
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    kill_process(target, Signal::KILL).with_context(|| format!("killing pid {pid}"))?;
    let _ = std::fs::remove_file(pid_file(dir));
    println!(
        "killed the development cluster in {} (pid {pid}): it did not stop within 5 s",
        dir.display()
    );
    Ok(())
}
