//! A pod's status from what its containers are doing, by kubelet's rules (phase from the
//! container states and the restart policy, the four pod conditions, container statuses). Pure:
//! the worker keeps the states, this turns them into what the API shows.

use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// How a container ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// The exit status, or 128 + the signal that killed it (as container runtimes report).
    pub exit_code: i32,
    pub signal: Option<i32>,
    /// `Completed`, `Error`, `StartError`.
    pub reason: String,
    pub message: Option<String>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Timestamp,
    pub container_id: Option<String>,
}

/// What a container is doing now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Timestamp,
        ready: bool,
        container_id: String,
    },
    Terminated(Exit),
}

impl State {
    pub fn waiting(reason: &str, message: Option<String>) -> State {
        State::Waiting {
            reason: reason.into(),
            message,
        }
    }
}

/// One container's state with its history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub name: String,
    pub image: String,
    pub state: State,
    pub last: Option<Exit>,
    pub restarts: i32,
}

impl Container {
    pub fn new(name: &str, image: &str, state: State) -> Container {
        Container {
            name: name.into(),
            image: image.into(),
            state,
            last: None,
            restarts: 0,
        }
    }

    fn ready(&self) -> bool {
        matches!(self.state, State::Running { ready: true, .. })
    }

    fn succeeded(&self) -> bool {
        matches!(&self.state, State::Terminated(e) if e.exit_code == 0)
    }
}

/// Everything the status is computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRun {
    pub restart_policy: String,
    pub init: Vec<Container>,
    pub containers: Vec<Container>,
    /// Set once the pod's directory and volumes are ready (its "sandbox").
    pub sandbox_ready: bool,
    pub pod_ip: Ipv4Addr,
    pub host_ip: Ipv4Addr,
    pub start_time: Timestamp,
}

/// Kubelet's phase rule (`getPhase`): pending while an init container has not succeeded or a
/// container has not started; running while one runs or will be restarted; succeeded or failed
/// once all have stopped for good.
pub fn phase(run: &PodRun) -> &'static str {
    let never = run.restart_policy == "Never";
    let mut pending_init = 0;
    let mut failed_init = 0;
    for c in &run.init {
        match &c.state {
            State::Terminated(e) if e.exit_code != 0 => failed_init += 1,
            State::Terminated(_) => {}
            State::Waiting { .. } if c.last.as_ref().is_some_and(|l| l.exit_code != 0) => {
                failed_init += 1
            }
            _ => pending_init += 1,
        }
    }
    if failed_init > 0 && never {
        return "Failed";
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in &run.containers {
        match &c.state {
            State::Running { .. } => running += 1,
            State::Terminated(e) => {
                stopped += 1;
                if e.exit_code == 0 {
                    succeeded += 1;
                }
            }
            // Waiting to be restarted counts as stopped.
            State::Waiting { .. } if c.last.is_some() => stopped += 1,
            State::Waiting { .. } => waiting += 1,
        }
    }
    if pending_init > 0 || waiting > 0 {
        "Pending"
    } else if running > 0 {
        "Running"
    } else if stopped > 0 {
        if run.restart_policy == "Always" {
            "Running"
        } else if stopped == succeeded {
            "Succeeded"
        } else if never {
            "Failed"
        } else {
            "Running"
        }
    } else {
        "Pending"
    }
}

fn time(t: Timestamp) -> Time {
    Time(t)
}

fn exit_state(e: &Exit) -> ContainerStateTerminated {
    ContainerStateTerminated {
        exit_code: e.exit_code,
        signal: e.signal,
        reason: Some(e.reason.clone()),
        message: e.message.clone(),
        started_at: e.started_at.map(time),
        finished_at: Some(time(e.finished_at)),
        container_id: e.container_id.clone(),
    }
}

fn container_status(c: &Container) -> ContainerStatus {
    let (state, container_id, started) = match &c.state {
        State::Waiting { reason, message } => (
            ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.clone()),
                    message: message.clone(),
                }),
                ..Default::default()
            },
            c.last.as_ref().and_then(|l| l.container_id.clone()),
            false,
        ),
        State::Running {
            started_at,
            container_id,
            ..
        } => (
            ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(time(*started_at)),
                }),
                ..Default::default()
            },
            Some(container_id.clone()),
            true,
        ),
        State::Terminated(e) => (
            ContainerState {
                terminated: Some(exit_state(e)),
                ..Default::default()
            },
            e.container_id.clone(),
            false,
        ),
    };
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: String::new(),
        container_id,
        ready: c.ready(),
        started: Some(started),
        restart_count: c.restarts,
        state: Some(state),
        last_state: Some(ContainerState {
            terminated: c.last.as_ref().map(exit_state),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A condition, keeping the previous transition time when its status did not change.
fn condition(
    previous: &[PodCondition],
    now: Timestamp,
    type_: &str,
    ok: bool,
    reason: Option<String>,
    message: Option<String>,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let since = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(time(now));
    PodCondition {
        type_: type_.into(),
        status: status.into(),
        reason,
        message,
        last_transition_time: Some(since),
        ..Default::default()
    }
}

fn names<'a>(cs: impl Iterator<Item = &'a Container>) -> String {
    cs.map(|c| c.name.as_str()).collect::<Vec<_>>().join(" ")
}

/// The pod status to write, given the previous one (for condition transition times).
pub fn pod_status(run: &PodRun, previous: Option<&PodStatus>, now: Timestamp) -> PodStatus {
    let empty = Vec::new();
    let prev = previous
        .and_then(|s| s.conditions.as_ref())
        .unwrap_or(&empty);
    let phase = phase(run);
    let incomplete: Vec<&Container> = run.init.iter().filter(|c| !c.succeeded()).collect();
    let initialized = incomplete.is_empty();
    let unready: Vec<&Container> = run.containers.iter().filter(|c| !c.ready()).collect();
    let (ready_reason, ready_message) = if phase == "Succeeded" || phase == "Failed" {
        (Some("PodCompleted".to_string()), None)
    } else if unready.is_empty() {
        (None, None)
    } else {
        (
            Some("ContainersNotReady".to_string()),
            Some(format!(
                "containers with unready status: [{}]",
                names(unready.iter().copied())
            )),
        )
    };
    let ready = unready.is_empty() && phase == "Running";
    let mut conditions = vec![
        condition(
            prev,
            now,
            "PodReadyToStartContainers",
            run.sandbox_ready,
            None,
            None,
        ),
        if initialized {
            let reason = (phase == "Succeeded" || phase == "Failed") && !run.init.is_empty();
            condition(
                prev,
                now,
                "Initialized",
                true,
                reason.then(|| "PodCompleted".into()),
                None,
            )
        } else {
            condition(
                prev,
                now,
                "Initialized",
                false,
                Some("ContainersNotInitialized".into()),
                Some(format!(
                    "containers with incomplete status: [{}]",
                    names(incomplete.iter().copied())
                )),
            )
        },
        condition(
            prev,
            now,
            "Ready",
            ready,
            ready_reason.clone(),
            ready_message.clone(),
        ),
        condition(
            prev,
            now,
            "ContainersReady",
            ready,
            ready_reason,
            ready_message,
        ),
    ];
    // The scheduler's condition stays as it wrote it.
    conditions.extend(prev.iter().filter(|c| c.type_ == "PodScheduled").cloned());
    let ip = run.sandbox_ready.then(|| run.pod_ip.to_string());
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        host_ip: Some(run.host_ip.to_string()),
        host_ips: Some(vec![k8s_openapi::api::core::v1::HostIP {
            ip: run.host_ip.to_string(),
        }]),
        pod_ip: ip.clone(),
        pod_ips: ip.map(|ip| vec![PodIP { ip }]),
        start_time: Some(time(run.start_time)),
        init_container_statuses: (!run.init.is_empty())
            .then(|| run.init.iter().map(container_status).collect()),
        container_statuses: Some(run.containers.iter().map(container_status).collect()),
        qos_class: previous.and_then(|s| s.qos_class.clone()),
        ..Default::default()
    }
}

/// Kubelet's restart back-off: the shared back-off with kubelet's own figures.
pub use crate::agents::retry::Backoff;

/// Whether a container that ended this way starts again.
pub fn restarts(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// The termination message: the file's content (at most 4096 bytes), else, for a failed
/// container with `FallbackToLogsOnError`, the end of its log (80 lines, 2048 bytes at most).
pub fn termination_message(
    file: &[u8],
    policy: Option<&str>,
    exit_code: i32,
    log: &[u8],
) -> Option<String> {
    const MAX_FILE: usize = 4096;
    const MAX_LOG_BYTES: usize = 2048;
    const MAX_LOG_LINES: usize = 80;
    if !file.is_empty() {
        let end = file.len().min(MAX_FILE);
        return Some(String::from_utf8_lossy(&file[..end]).into_owned());
    }
    if policy != Some("FallbackToLogsOnError") || exit_code == 0 || log.is_empty() {
        return None;
    }
    let mut tail = &log[log.len().saturating_sub(MAX_LOG_BYTES)..];
    let trimmed = tail.strip_suffix(b"\n").unwrap_or(tail);
    let newlines: Vec<usize> = trimmed
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i)
        .collect();
    if newlines.len() >= MAX_LOG_LINES {
        tail = &tail[newlines[newlines.len() - MAX_LOG_LINES] + 1..];
    }
    Some(String::from_utf8_lossy(tail).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2026-11-30T12:00:00Z".parse().unwrap()
    }

    fn exit(code: i32) -> Exit {
        Exit {
            exit_code: code,
            signal: None,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: None,
            started_at: Some(now()),
            finished_at: now(),
            container_id: Some("process://1".into()),
        }
    }

    fn running(ready: bool) -> State {
        State::Running {
            started_at: now(),
            ready,
            container_id: "process://1".into(),
        }
    }

    fn run(policy: &str, containers: Vec<State>) -> PodRun {
        PodRun {
            restart_policy: policy.into(),
            init: Vec::new(),
            containers: containers
                .into_iter()
                .enumerate()
                .map(|(i, s)| Container::new(&format!("c{i}"), "img", s))
                .collect(),
            sandbox_ready: true,
            pod_ip: Ipv4Addr::new(127, 2, 0, 2),
            host_ip: Ipv4Addr::new(127, 2, 0, 1),
            start_time: now(),
        }
    }

    #[test]
    fn phases_follow_kubelet() {
        let creating = State::waiting("ContainerCreating", None);
        assert_eq!(phase(&run("Always", vec![creating.clone()])), "Pending");
        assert_eq!(
            phase(&run("Always", vec![running(false), creating])),
            "Pending"
        );
        assert_eq!(phase(&run("Always", vec![running(true)])), "Running");
        let done = State::Terminated(exit(0));
        let failed = State::Terminated(exit(1));
        assert_eq!(phase(&run("Never", vec![done.clone()])), "Succeeded");
        assert_eq!(phase(&run("OnFailure", vec![done.clone()])), "Succeeded");
        assert_eq!(
            phase(&run("Never", vec![done.clone(), failed.clone()])),
            "Failed"
        );
        assert_eq!(phase(&run("OnFailure", vec![failed.clone()])), "Running");
        assert_eq!(phase(&run("Always", vec![done])), "Running");
        // Back-off after a failure: stopped, not waiting.
        let mut r = run("Always", vec![State::waiting("CrashLoopBackOff", None)]);
        r.containers[0].last = Some(exit(2));
        assert_eq!(phase(&r), "Running");
    }

    #[test]
    fn init_containers_hold_the_pod() {
        let mut r = run("Never", vec![State::waiting("PodInitializing", None)]);
        r.init = vec![Container::new("init", "img", running(false))];
        assert_eq!(phase(&r), "Pending");
        let status = pod_status(&r, None, now());
        let initialized = status
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Initialized")
            .unwrap();
        assert_eq!(initialized.status, "False");
        assert_eq!(
            initialized.message.as_deref(),
            Some("containers with incomplete status: [init]")
        );
        r.init[0].state = State::Terminated(exit(1));
        assert_eq!(phase(&r), "Failed");
        r.restart_policy = "OnFailure".into();
        r.init[0].state = State::waiting("CrashLoopBackOff", None);
        r.init[0].last = Some(exit(1));
        assert_eq!(phase(&r), "Pending");
    }

    #[test]
    fn conditions_and_statuses() {
        let r = run("Always", vec![running(true), running(false)]);
        let s = pod_status(&r, None, now());
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("127.2.0.2"));
        let conds = s.conditions.clone().unwrap();
        let ready = conds.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(
            ready.message.as_deref(),
            Some("containers with unready status: [c1]")
        );
        let statuses = s.container_statuses.unwrap();
        assert!(statuses[0].ready && !statuses[1].ready);
        assert_eq!(statuses[0].started, Some(true));
        // Transition times survive when nothing changed.
        let later: Timestamp = "2026-11-30T12:05:00Z".parse().unwrap();
        let mut previous = pod_status(&r, None, now());
        previous.conditions.as_mut().unwrap().push(PodCondition {
            type_: "PodScheduled".into(),
            status: "True".into(),
            ..Default::default()
        });
        let again = pod_status(&r, Some(&previous), later);
        let conds = again.conditions.unwrap();
        assert!(
            conds
                .iter()
                .filter(|c| c.type_ != "PodScheduled")
                .all(|c| c.last_transition_time == Some(Time(now())))
        );
        assert!(conds.iter().any(|c| c.type_ == "PodScheduled"));
        let done = pod_status(&run("Never", vec![State::Terminated(exit(0))]), None, now());
        let ready = done
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("False", Some("PodCompleted"))
        );
    }

    #[test]
    fn no_address_before_the_sandbox() {
        let mut r = run("Always", vec![State::waiting("ContainerCreating", None)]);
        r.sandbox_ready = false;
        let s = pod_status(&r, None, now());
        assert_eq!(s.pod_ip, None);
        assert_eq!(s.host_ip.as_deref(), Some("127.2.0.1"));
    }

    #[test]
    fn backoff_doubles_to_the_cap() {
        let b = Backoff::KUBELET;
        let secs: Vec<u64> = (1..=7).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(secs, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(b.delay(1000).as_secs(), 300);
        assert!(restarts("Always", 0) && restarts("OnFailure", 1));
        assert!(!restarts("OnFailure", 0) && !restarts("Never", 1));
    }

    #[test]
    fn termination_messages() {
        assert_eq!(
            termination_message(b"done", None, 0, b"log").as_deref(),
            Some("done")
        );
        assert_eq!(termination_message(b"", None, 1, b"log"), None);
        let fallback = Some("FallbackToLogsOnError");
        assert_eq!(termination_message(b"", fallback, 0, b"log"), None);
        assert_eq!(
            termination_message(b"", fallback, 1, b"oops\n").as_deref(),
            Some("oops\n")
        );
        let many: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let tail = termination_message(b"", fallback, 1, many.as_bytes()).unwrap();
        assert!(tail.starts_with("line 20\n") && tail.ends_with("line 99\n"));
        let long = vec![b'x'; 5000];
        assert_eq!(
            termination_message(b"", fallback, 1, &long).unwrap().len(),
            2048
        );
        assert_eq!(
            termination_message(&long, None, 0, b"").unwrap().len(),
            4096
        );
    }
}
