//! One pod on one node: prepare its directory, run its init containers one after the other and
//! then its containers side by side as host processes (each in a process group of its own), keep
//! their states, restart them by the restart policy with back-off, probe readiness, and stop them
//! (TERM, the grace period, KILL) when the pod is deleted. A reporter writes the status each time
//! the states change.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container as ContainerSpec, Pod, PodSpec, PodStatus};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::{Notify, watch};

pub use super::events::event_from;

use super::config::PodEnv;
use super::images::{self, ImageMap};
use super::probe;
use super::setup::{self, Blocked, PodDir};
use super::status::{self, Backoff, Container, Exit, PodRun, State};

/// What every pod worker of a node shares.
#[derive(Clone)]
pub struct Ctx {
    pub client: Client,
    pub node: String,
    pub images: ImageMap,
    pub backoff: Backoff,
    pub every: Duration,
    pub host_ip: Ipv4Addr,
    pub dns: Option<Ipv4Addr>,
    pub pod_env: PodEnv,
}

/// `None` while the pod runs; the grace period once it is to stop.
pub type Stop = watch::Receiver<Option<Duration>>;

/// The states, and a signal for the reporter.
struct Shared {
    run: Mutex<PodRun>,
    changed: Notify,
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    Init(usize),
    Main(usize),
}

impl Shared {
    fn update(&self, f: impl FnOnce(&mut PodRun)) {
        let mut run = self.run.lock().unwrap_or_else(|e| e.into_inner());
        let before = run.clone();
        f(&mut run);
        if *run != before {
            self.changed.notify_one();
        }
    }

    fn container(&self, slot: Slot, f: impl FnOnce(&mut Container)) {
        self.update(|run| {
            let c = match slot {
                Slot::Init(i) => run.init.get_mut(i),
                Slot::Main(i) => run.containers.get_mut(i),
            };
            if let Some(c) = c {
                f(c);
            }
        })
    }

    fn snapshot(&self) -> PodRun {
        self.run.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Everything needed to start one container.
#[derive(Debug, Clone)]
struct Launch {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    root: PathBuf,
    termination_log: PathBuf,
    /// Where its runs' logs go, one file per run.
    logs: PathBuf,
    /// The host directory of the volume mounted at the ServiceAccount path, which the process
    /// sees there for real where the kubelet can give it a mount namespace.
    service_account: Option<PathBuf>,
    /// The pod's resolver configuration, seen at `/etc/resolv.conf` likewise.
    resolv_conf: Option<PathBuf>,
}

/// Kills what is left of a process group when dropped (the pod's worker was stopped or
/// aborted), as a container runtime kills the container's cgroup.
struct Group(i32);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

fn full_name(pod: &Pod) -> (String, String) {
    (
        pod.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Post an event about the pod, as kubelet does (`kubectl describe pod` shows them).
pub async fn event(client: &Client, pod: &Pod, type_: &str, reason: &str, message: &str) {
    event_from(client, "kubelet", pod, type_, reason, message).await
}

async fn prepare(ctx: &Ctx, pod: &Pod, dir: &PodDir, ip: Ipv4Addr) -> Result<Vec<Launch>, Blocked> {
    // Before anything is made from the pod's names and paths.
    setup::check(pod)?;
    let volumes = setup::volumes(&ctx.client, pod, dir, ip, ctx.host_ip).await?;
    let resolv_conf = setup::resolv_conf(pod, dir, ctx.dns)
        .map_err(|e| Blocked::Config(format!("writing the pod's resolv.conf: {e}")))?;
    let spec = pod.spec.clone().unwrap_or_default();
    let (_, name) = full_name(pod);
    let PodEnv {
        root: root_env,
        ip: ip_env,
        capacity: capacity_env,
    } = &ctx.pod_env;
    let mut out = Vec::new();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        let mut env = setup::environment(&ctx.client, pod, c, ip, ctx.host_ip).await?;
        let root = dir.root(&c.name);
        let termination_log = setup::root(dir, c, &volumes)?;
        let defined = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let argv = images::argv(
            &ctx.images,
            c.image.as_deref().unwrap_or(""),
            c.command.as_deref().unwrap_or_default(),
            c.args.as_deref().unwrap_or_default(),
            &defined,
            &|program: &str| program.starts_with('/') && std::path::Path::new(program).is_file(),
        )
        .map_err(Blocked::Image)?;
        if defined("PATH").is_none() {
            env.insert(
                0,
                (
                    "PATH".into(),
                    std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
                ),
            );
        }
        env.push(("HOSTNAME".into(), name.clone()));
        // A home of its own, as an image gives one: not the host user's (whose ~/.kube/config
        // would win over an in-cluster client's mounted token).
        if !env.iter().any(|(k, _)| k == "HOME") {
            env.push(("HOME".into(), root.to_string_lossy().into_owned()));
        }
        env.push((root_env.clone(), root.to_string_lossy().into_owned()));
        env.push((ip_env.clone(), ip.to_string()));
        let capacities = setup::capacities(c, &volumes);
        if !capacities.is_empty() {
            env.push((capacity_env.clone(), capacities));
        }
        let service_account = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path.trim_end_matches('/') == SERVICE_ACCOUNT_DIR)
            .map(|m| dir.volume(&m.name));
        out.push(Launch {
            argv,
            env,
            root,
            termination_log,
            logs: dir.logs(&c.name),
            service_account,
            resolv_conf: resolv_conf.clone(),
        });
    }
    Ok(out)
}

/// Wait until the pod is to stop; the grace period (none when the kubelet dropped the pod).
async fn stopping(stop: &mut Stop) -> Duration {
    match stop.wait_for(|s| s.is_some()).await {
        Ok(grace) => grace.unwrap_or_default(),
        Err(_) => Duration::ZERO,
    }
}

fn is_stopping(stop: &Stop) -> bool {
    stop.has_changed().is_err() || stop.borrow().is_some()
}

/// TERM to the process group, the grace period, then KILL.
async fn terminate(
    child: &mut tokio::process::Child,
    pid: i32,
    grace: Duration,
) -> std::io::Result<ExitStatus> {
    use rustix::process::{Pid, Signal, kill_process_group};
    if let Some(pid) = Pid::from_raw(pid) {
        let _ = kill_process_group(pid, Signal::TERM);
        if let Ok(status) = tokio::time::timeout(grace, child.wait()).await {
            return status;
        }
        let _ = kill_process_group(pid, Signal::KILL);
    }
    child.wait().await
}

/// The tail of a log file, for `FallbackToLogsOnError`.
fn log_tail(path: &std::path::Path) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(4096)));
    let mut out = Vec::new();
    let _ = f.read_to_end(&mut out);
    out
}

fn exit_of(
    status: std::io::Result<ExitStatus>,
    spec: &ContainerSpec,
    launch: &Launch,
    instance: u32,
    started_at: Timestamp,
    container_id: String,
) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    let (exit_code, signal) = match &status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => (code, None),
            (None, Some(sig)) => (128 + sig, Some(sig)),
            (None, None) => (255, None),
        },
        Err(_) => (255, None),
    };
    let file = setup::read_termination_log(&launch.termination_log);
    let mut message = status::termination_message(
        &file,
        spec.termination_message_policy.as_deref(),
        exit_code,
        &log_tail(&launch.log(instance)),
    );
    if let Err(e) = &status {
        message = Some(format!("waiting for the process: {e}"));
    }
    Exit {
        exit_code,
        signal,
        reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
        message,
        started_at: Some(started_at),
        finished_at: Timestamp::now(),
        container_id: Some(container_id),
    }
}

/// Probe readiness for as long as the container runs.
async fn readiness(
    shared: Arc<Shared>,
    slot: Slot,
    spec: ContainerSpec,
    ip: Ipv4Addr,
    ctx: Ctx,
    pod: Pod,
) {
    let Some(p) = spec.readiness_probe.clone() else {
        return;
    };
    let timing = probe::Timing::of(&p);
    let check = match probe::check(&spec, &p, IpAddr::V4(ip)) {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("Readiness probe of container {}: {e}", spec.name);
            event(&ctx.client, &pod, "Warning", "Unhealthy", &msg).await;
            return;
        }
    };
    tokio::time::sleep(timing.initial_delay).await;
    let mut tracker = probe::Tracker::default();
    // One event per distinct failure, not one per period.
    let mut last_failure: Option<String> = None;
    loop {
        let result = probe::run(&check, timing.timeout).await;
        match &result {
            Err(e) if last_failure.as_ref() != Some(e) => {
                let msg = format!("Readiness probe failed: {e}");
                event(&ctx.client, &pod, "Warning", "Unhealthy", &msg).await;
                last_failure = Some(e.clone());
            }
            Err(_) => {}
            Ok(()) => last_failure = None,
        }
        if tracker.record(result.is_ok(), &timing) {
            let ready = tracker.ready;
            shared.container(slot, |c| {
                if let State::Running { ready: r, .. } = &mut c.state {
                    *r = ready;
                }
            });
        }
        tokio::time::sleep(timing.period).await;
    }
}

/// One pod's worker: what its containers share.
struct PodWork {
    ctx: Ctx,
    pod: Pod,
    shared: Arc<Shared>,
    ip: Ipv4Addr,
}

/// How a container's life ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Succeeded,
    Failed,
    Stopped,
}

/// Run one container until it ends for good: restarts per policy (init containers only after a
/// failure), back-off between starts.
async fn run_container(
    work: &PodWork,
    slot: Slot,
    spec: &ContainerSpec,
    launch: &Launch,
    mut stop: Stop,
) -> Ended {
    let PodWork {
        ctx, pod, shared, ..
    } = work;
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_else(|| "Always".into());
    let (ns, name) = full_name(pod);
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut restarts = 0;
    loop {
        if is_stopping(&stop) {
            return Ended::Stopped;
        }
        let exit = run_once(work, slot, spec, launch, restarts, &mut stop).await;
        let again = match slot {
            Slot::Init(_) => exit.exit_code != 0 && policy != "Never",
            Slot::Main(_) => status::restarts(&policy, exit.exit_code),
        };
        if is_stopping(&stop) || !again {
            let code = exit.exit_code;
            shared.container(slot, |c| c.state = State::Terminated(exit));
            return match (is_stopping(&stop), code) {
                (true, _) => Ended::Stopped,
                (false, 0) => Ended::Succeeded,
                (false, _) => Ended::Failed,
            };
        }
        restarts += 1;
        let delay = ctx.backoff.delay(restarts);
        let message = format!(
            "back-off {delay:?} restarting failed container={} pod={name}_{ns}({uid})",
            spec.name
        );
        shared.container(slot, |c| {
            c.last = Some(exit.clone());
            c.restarts = i32::try_from(restarts).unwrap_or(i32::MAX);
            c.state = State::waiting("CrashLoopBackOff", Some(message));
        });
        event(
            &ctx.client,
            pod,
            "Warning",
            "BackOff",
            &format!(
                "Back-off restarting failed container {} in pod {name}_{ns}({uid})",
                spec.name
            ),
        )
        .await;
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stopping(&mut stop) => {
                shared.container(slot, |c| c.state = State::Terminated(exit));
                return Ended::Stopped;
            }
        }
    }
}

/// One run of a container (its `instance`-th): started, probed for readiness while it runs,
/// stopped when the pod is; how it ended (a failure to start included).
async fn run_once(
    work: &PodWork,
    slot: Slot,
    spec: &ContainerSpec,
    launch: &Launch,
    instance: u32,
    stop: &mut Stop,
) -> Exit {
    let PodWork {
        ctx,
        pod,
        shared,
        ip,
    } = work;
    let _ = setup::empty_termination_log(&launch.termination_log);
    let started_at = Timestamp::now();
    let mut child = match spawn(launch, instance) {
        Ok(child) => child,
        Err(e) => {
            let message = format!("failed to start {:?}: {e}", launch.argv[0]);
            event(
                &ctx.client,
                pod,
                "Warning",
                "Failed",
                &format!("Error: {message}"),
            )
            .await;
            return Exit {
                exit_code: 128,
                signal: None,
                reason: "StartError".into(),
                message: Some(message),
                started_at: None,
                finished_at: Timestamp::now(),
                container_id: None,
            };
        }
    };
    let pid = child.id().map(|p| p as i32).unwrap_or(0);
    let _group = Group(pid);
    let container_id = format!("process://{pid}");
    let ready = spec.readiness_probe.is_none();
    let id = container_id.clone();
    shared.container(slot, move |c| {
        c.state = State::Running {
            started_at,
            ready,
            container_id: id,
        };
    });
    event(
        &ctx.client,
        pod,
        "Normal",
        "Started",
        &format!("Started container {}", spec.name),
    )
    .await;
    let prober = tokio::spawn(readiness(
        shared.clone(),
        slot,
        spec.clone(),
        *ip,
        ctx.clone(),
        pod.clone(),
    ));
    let status = tokio::select! {
        s = child.wait() => s,
        grace = stopping(stop) => {
            event(&ctx.client, pod, "Normal", "Killing", &format!("Stopping container {}", spec.name)).await;
            terminate(&mut child, pid, grace).await
        }
    };
    prober.abort();
    exit_of(status, spec, launch, instance, started_at, container_id)
}

use crate::apiserver::server::SERVICE_ACCOUNT_DIR;

/// Whether this kubelet can give a process a mount namespace of its own (it runs as root and
/// util-linux's `unshare` works here); checked once.
fn can_unshare() -> bool {
    static CAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAN.get_or_init(|| {
        rustix::process::geteuid().is_root()
            && std::fs::create_dir_all("/var/run/secrets").is_ok()
            && std::process::Command::new(UNSHARE)
                .args(["--mount", "--propagation", "private", "true"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
    })
}

const UNSHARE: &str = "/usr/bin/unshare";

/// In a private mount namespace: a tmpfs over `/var/run/secrets` (so nothing shows on the host)
/// with the ServiceAccount volume bound at its path, and the pod's resolv.conf over
/// `/etc/resolv.conf`, each where given; then the container's program, in the same process
/// (`unshare` and `sh` exec).
const IN_NAMESPACE: &str = "set -e; \
    if [ -n \"$CDI_DEV_SA\" ]; then \
      mount -t tmpfs -o mode=0755,size=1m cdi-dev-secrets /var/run/secrets; \
      mkdir -p /var/run/secrets/kubernetes.io/serviceaccount; \
      mount --bind \"$CDI_DEV_SA\" /var/run/secrets/kubernetes.io/serviceaccount; fi; \
    if [ -n \"$CDI_DEV_RESOLV\" ]; then mount --bind \"$CDI_DEV_RESOLV\" /etc/resolv.conf; fi; \
    unset CDI_DEV_SA CDI_DEV_RESOLV; exec \"$@\"";

impl Launch {
    fn log(&self, instance: u32) -> PathBuf {
        self.logs.join(format!("{instance}.log"))
    }
}

fn spawn(launch: &Launch, instance: u32) -> std::io::Result<tokio::process::Child> {
    std::fs::create_dir_all(&launch.logs)?;
    // The run before the previous one is no longer kept.
    if let Some(old) = instance.checked_sub(2) {
        let _ = std::fs::remove_file(launch.log(old));
    }
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(launch.log(instance))?;
    let mut argv: Vec<std::ffi::OsString> = launch.argv.iter().map(Into::into).collect();
    let mut env = launch.env.clone();
    let mounts = [
        ("CDI_DEV_SA", &launch.service_account),
        ("CDI_DEV_RESOLV", &launch.resolv_conf),
    ];
    if mounts.iter().any(|(_, m)| m.is_some()) && can_unshare() {
        let wrapped: Vec<std::ffi::OsString> = vec![
            UNSHARE.into(),
            "--mount".into(),
            "--propagation".into(),
            "private".into(),
            "/bin/sh".into(),
            "-c".into(),
            IN_NAMESPACE.into(),
            "cdi-dev-pod".into(),
        ];
        argv = wrapped.into_iter().chain(argv).collect();
        for (var, path) in mounts {
            if let Some(path) = path {
                env.push((var.into(), path.to_string_lossy().into_owned()));
            }
        }
    }
    tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(&launch.root)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own group, so stopping it reaches what it started.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
}

/// Write the status each time the states change, until `done` and written.
async fn reporter(
    ctx: Ctx,
    pod: Pod,
    shared: Arc<Shared>,
    done: Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::Ordering;
    let (ns, name) = full_name(&pod);
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let mut previous: Option<PodStatus> = pod.status.clone();
    let mut written: Option<PodRun> = None;
    loop {
        let finished = done.load(Ordering::SeqCst);
        let run = shared.snapshot();
        if written.as_ref() != Some(&run) {
            let status = status::pod_status(&run, previous.as_ref(), Timestamp::now());
            let patch = json!({"status": status});
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    previous = Some(status);
                    written = Some(run);
                }
                Err(kube::Error::Api(e)) if e.code == 404 => return,
                Err(e) => {
                    tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "writing the pod's status");
                    tokio::time::sleep(ctx.every).await;
                    continue;
                }
            }
            continue;
        }
        if finished {
            return;
        }
        shared.changed.notified().await;
    }
}

/// A task that ends when this is dropped: the pod's helpers end with the pod's own task, also
/// when that is aborted (the kubelet stopping).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often a running pod's Secret and ConfigMap volumes are brought up to date (the kubelet
/// syncs each pod about every minute; a development cluster shows a rotation sooner).
const VOLUME_SYNC: Duration = Duration::from_secs(3);

/// The whole life of a pod on this node.
pub async fn run_pod(ctx: Ctx, pod: Pod, dir: PodDir, ip: Ipv4Addr, mut stop: Stop) {
    let spec = pod.spec.clone().unwrap_or_default();
    let init_specs: Vec<ContainerSpec> = spec.init_containers.clone().unwrap_or_default();
    let shared = Arc::new(Shared {
        run: Mutex::new(first_run(&ctx, &spec, ip)),
        changed: Notify::new(),
    });
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let report = tokio::spawn(reporter(
        ctx.clone(),
        pod.clone(),
        shared.clone(),
        done.clone(),
    ));
    let launches = prepare_until_ready(&ctx, &pod, &dir, ip, &shared, &mut stop).await;
    let _helpers = keep_volumes_current(&ctx, &pod, &dir, launches.is_some());
    if let Some(launches) = launches {
        let (init_launches, main_launches) = launches.split_at(init_specs.len());
        shared.update(|run| {
            run.sandbox_ready = true;
            let reason = if run.init.is_empty() {
                "ContainerCreating"
            } else {
                "PodInitializing"
            };
            for c in run.containers.iter_mut() {
                c.state = State::waiting(reason, None);
            }
            for c in run.init.iter_mut() {
                c.state = State::waiting("PodInitializing", None);
            }
        });
        let work = PodWork {
            ctx: ctx.clone(),
            pod: pod.clone(),
            shared: shared.clone(),
            ip,
        };
        let mut initialized = true;
        for (i, (c, launch)) in init_specs.iter().zip(init_launches).enumerate() {
            let ended = run_container(&work, Slot::Init(i), c, launch, stop.clone()).await;
            if ended != Ended::Succeeded {
                initialized = false;
                break;
            }
        }
        if initialized {
            let runs =
                spec.containers
                    .iter()
                    .zip(main_launches)
                    .enumerate()
                    .map(|(i, (c, launch))| {
                        run_container(&work, Slot::Main(i), c, launch, stop.clone())
                    });
            futures::future::join_all(runs).await;
        }
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    shared.changed.notify_one();
    let _ = report.await;
}

/// The pod's states before anything runs: every container waiting (`PodInitializing` while
/// init containers are to run first, else `ContainerCreating`).
fn first_run(ctx: &Ctx, spec: &PodSpec, ip: Ipv4Addr) -> PodRun {
    let init_specs = spec.init_containers.as_deref().unwrap_or_default();
    let waiting = |reason: &str, c: &ContainerSpec| {
        Container::new(
            &c.name,
            c.image.as_deref().unwrap_or(""),
            State::waiting(reason, None),
        )
    };
    let first = if init_specs.is_empty() {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    PodRun {
        restart_policy: spec
            .restart_policy
            .clone()
            .unwrap_or_else(|| "Always".into()),
        init: init_specs
            .iter()
            .map(|c| waiting("PodInitializing", c))
            .collect(),
        containers: spec.containers.iter().map(|c| waiting(first, c)).collect(),
        sandbox_ready: false,
        pod_ip: ip,
        host_ip: ctx.host_ip,
        start_time: Timestamp::now(),
    }
}

/// Prepare the pod until it can run, saying in its containers' states (and an event, for a
/// mistake in the pod) what it waits for; `None` when it is stopped first.
async fn prepare_until_ready(
    ctx: &Ctx,
    pod: &Pod,
    dir: &PodDir,
    ip: Ipv4Addr,
    shared: &Shared,
    stop: &mut Stop,
) -> Option<Vec<Launch>> {
    let (ns, name) = full_name(pod);
    let mut last_blocked: Option<Blocked> = None;
    loop {
        match prepare(ctx, pod, dir, ip).await {
            Ok(l) => return Some(l),
            Err(blocked) => {
                if last_blocked.as_ref() != Some(&blocked) {
                    tracing::info!(pod = %format!("{ns}/{name}"), reason = blocked.reason(), "{}", blocked.message());
                    if !matches!(blocked, Blocked::Waiting(_)) {
                        event(
                            &ctx.client,
                            pod,
                            "Warning",
                            "Failed",
                            &format!("Error: {}", blocked.message()),
                        )
                        .await;
                    }
                    let (reason, message) = (blocked.reason(), blocked.message().to_string());
                    shared.update(|run| {
                        for c in run.init.iter_mut().take(1).chain(run.containers.iter_mut()) {
                            c.state = State::waiting(reason, Some(message.clone()));
                        }
                    });
                    last_blocked = Some(blocked);
                }
                tokio::select! {
                    _ = tokio::time::sleep(ctx.every * 5) => {}
                    _ = stopping(stop) => return None,
                }
            }
        }
    }
}

/// The tasks that keep a pod's volumes current while it lives: its projected tokens renewed at
/// 80% of their lifetime, and (once it `runs`) its Secret and ConfigMap volumes brought up to
/// date. They end when the returned handles are dropped.
fn keep_volumes_current(ctx: &Ctx, pod: &Pod, dir: &PodDir, runs: bool) -> Vec<AbortOnDrop> {
    let mut helpers = Vec::new();
    if let Some(seconds) = setup::token_lifetime(pod) {
        let (client, pod, dir) = (ctx.client.clone(), pod.clone(), dir.clone());
        helpers.push(AbortOnDrop(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(seconds * 4 / 5)).await;
                setup::renew_tokens(&client, &pod, &dir).await;
            }
        })));
    }
    if runs && setup::has_refreshed_volumes(pod) {
        let (client, pod, dir) = (ctx.client.clone(), pod.clone(), dir.clone());
        helpers.push(AbortOnDrop(tokio::spawn(async move {
            loop {
                tokio::time::sleep(VOLUME_SYNC).await;
                setup::refresh_volumes(&client, &pod, &dir).await;
            }
        })));
    }
    helpers
}
