//! What a worker pod's state writes back onto its claim (upstream's `updatePvcFromPod`): the
//! Running condition, restarts, phase and schedulability, why it failed (or was killed), and
//! the labels and annotation patches that reach the claim.

use std::collections::BTreeMap;

use cdi_api::{FailureReason, TerminationMessage, ann};
use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, Pod, PodStatus};

use super::claim::get;

/// The message of a running worker pod's Running condition.
pub const POD_RUNNING_REASON: &str = "Pod is running";

/// What the pod's state means beyond the annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The import cannot succeed by retrying (checksum mismatch): delete the pod, fail.
    pub fatal: bool,
    /// The importer exited with an error: a Warning event with this message on the claim.
    pub failed: Option<String>,
    /// The pod succeeded: the import is complete.
    pub complete: bool,
    /// Labels the importer reported (added to the claim once complete).
    pub labels: BTreeMap<String, String>,
}

/// Write the pod's state onto the claim's annotations (upstream's `updatePvcFromPod` and
/// `setAnnotationsFromPodWithPrefix`). Unlike upstream, a container waiting in
/// CrashLoopBackOff reports its last termination, so a failing import says why between restarts.
pub fn update_from_pod(anns: &mut BTreeMap<String, String>, pod: &Pod) -> Outcome {
    update_from_worker(anns, pod, ann::IMPORT_POD_NAME)
}

/// [`update_from_pod`] for any worker pod, whose name goes under `pod_name_key`.
pub fn update_from_worker(
    anns: &mut BTreeMap<String, String>,
    pod: &Pod,
    pod_name_key: &str,
) -> Outcome {
    let status = pod.status.clone().unwrap_or_default();
    let containers = status.container_statuses.clone().unwrap_or_default();
    let first = containers.first();
    let term_state = first.and_then(|c| c.state.as_ref()?.terminated.clone());
    let seen = Seen {
        // Who the pod's messages name.
        who: if pod_name_key == ann::UPLOAD_POD_NAME {
            "upload server"
        } else {
            "importer"
        },
        restarted: pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) != Some("Never"),
        term_msg: term_state
            .as_ref()
            .filter(|t| t.exit_code == 0)
            .and_then(|t| t.message.as_deref())
            .map(TerminationMessage::parse),
        term_state,
    };
    let mut out = Outcome::default();
    if let Some(c) = first {
        record_restarts(anns, c);
        let all_running = containers
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
        record_container(anns, c, all_running, &seen, &mut out);
    }
    // A failure the importer says no retry can mend: the pod is done, the import failed.
    if let Some(m) = seen.term_msg.as_ref().filter(|m| m.is_fatal()) {
        record_fatal(anns, m, &mut out);
    }
    let scratch = seen
        .term_msg
        .as_ref()
        .and_then(|m| m.scratch_space_required)
        == Some(true);
    anns.insert(
        pod_name_key.into(),
        pod.metadata.name.clone().unwrap_or_default(),
    );
    if !scratch && !out.fatal {
        anns.insert(
            ann::POD_PHASE.into(),
            status.phase.clone().unwrap_or_default(),
        );
    }
    record_schedulable(anns, &status);
    out.complete = !out.fatal && anns.get(ann::POD_PHASE).map(String::as_str) == Some("Succeeded");
    out
}

/// The worker pod as [`update_from_worker`] reads it: who its messages name, whether it
/// restarts, and how its first container ended (the message only of a clean exit).
struct Seen {
    who: &'static str,
    restarted: bool,
    term_state: Option<ContainerStateTerminated>,
    term_msg: Option<TerminationMessage>,
}

/// The container's restart count, unless the claim already says more.
fn record_restarts(anns: &mut BTreeMap<String, String>, c: &ContainerStatus) {
    let restarts: i32 = anns
        .get(ann::POD_RESTARTS)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    if c.restart_count >= restarts {
        anns.insert(ann::POD_RESTARTS.into(), c.restart_count.to_string());
    }
}

/// The claim's Running condition.
fn set_running(anns: &mut BTreeMap<String, String>, running: &str, message: &str, reason: &str) {
    anns.insert(ann::RUNNING_CONDITION.into(), running.into());
    anns.insert(ann::RUNNING_CONDITION_MESSAGE.into(), message.into());
    anns.insert(ann::RUNNING_CONDITION_REASON.into(), reason.into());
}

/// The Running condition from the first container's state: running, an image that cannot be
/// pulled, waiting for another reason, or ended (now, or before a CrashLoopBackOff restart).
fn record_container(
    anns: &mut BTreeMap<String, String>,
    c: &ContainerStatus,
    all_running: bool,
    seen: &Seen,
    out: &mut Outcome,
) {
    let state = c.state.clone().unwrap_or_default();
    let waiting = state.waiting.as_ref();
    let waiting_reason = waiting.and_then(|w| w.reason.as_deref()).unwrap_or("");
    if all_running {
        set_running(anns, "true", "", POD_RUNNING_REASON);
    } else if matches!(
        waiting_reason,
        "ImagePullBackOff" | "ErrImagePull" | "InvalidImageName"
    ) {
        let image = &c.image;
        set_running(
            anns,
            "false",
            &format!("failed to pull image: {image}"),
            "ImagePullFailed",
        );
    } else if waiting.is_some() && waiting_reason != "CrashLoopBackOff" {
        let message = waiting.and_then(|w| w.message.as_deref()).unwrap_or("");
        set_running(anns, "false", message, waiting_reason);
    } else {
        // Terminated now, or waiting to be restarted after a termination.
        let last = c.last_state.as_ref().and_then(|s| s.terminated.clone());
        if let Some(t) = seen.term_state.clone().or(last) {
            record_ended(anns, &t, seen, out);
        }
    }
}

/// What an ended container said: it needs scratch space, it finished (with preallocation and
/// labels), or, without a message, why it ended; a non-zero exit is a failure to report.
fn record_ended(
    anns: &mut BTreeMap<String, String>,
    t: &ContainerStateTerminated,
    seen: &Seen,
    out: &mut Outcome,
) {
    let reason = t.reason.clone().unwrap_or_default();
    match &seen.term_msg {
        Some(m) if m.scratch_space_required == Some(true) => {
            anns.insert(ann::REQUIRES_SCRATCH.into(), "true".into());
            set_running(
                anns,
                "false",
                "Scratch space required",
                "Scratch space required",
            );
        }
        Some(m) => {
            if m.preallocation_applied == Some(true) {
                anns.insert(ann::PREALLOCATION_APPLIED.into(), "true".into());
            }
            let message = said(m);
            set_running(anns, "false", &message, known_reason(&message, &reason));
            out.labels = m.labels.clone().unwrap_or_default();
        }
        None => {
            let message = exit_message(t, seen.restarted, seen.who);
            set_running(anns, "false", &message, known_reason(&message, &reason));
        }
    }
    if t.exit_code != 0 {
        out.failed = Some(exit_message(t, seen.restarted, seen.who));
    }
}

/// A failure no retry can mend: the pod phase is Failed, the import fatally so, and why.
fn record_fatal(anns: &mut BTreeMap<String, String>, m: &TerminationMessage, out: &mut Outcome) {
    let message = said(m);
    anns.insert(ann::POD_PHASE.into(), "Failed".into());
    anns.insert(ann::IMPORT_FATAL_ERROR.into(), "true".into());
    anns.insert(ann::RUNNING_CONDITION.into(), "false".into());
    anns.insert(ann::RUNNING_CONDITION_MESSAGE.into(), message.clone());
    let reason = match m.reason {
        Some(FailureReason::ChecksumMismatch) => "ChecksumError".to_string(),
        Some(r) => format!("{r:?}"),
        None => String::new(),
    };
    anns.insert(ann::RUNNING_CONDITION_REASON.into(), reason);
    out.fatal = true;
    out.failed = Some(message);
}

/// Whether the pod can be scheduled: false only while it is Pending and the scheduler said it
/// is Unschedulable.
fn record_schedulable(anns: &mut BTreeMap<String, String>, status: &PodStatus) {
    let unschedulable = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"));
    let pending = anns.get(ann::POD_PHASE).map(String::as_str) == Some("Pending");
    anns.insert(
        ann::POD_SCHEDULABLE.into(),
        if pending && unschedulable {
            "false"
        } else {
            "true"
        }
        .into(),
    );
}

/// Whether the worker pod goes once it is done.
pub fn delete_pod_when_done(anns: &BTreeMap<String, String>) -> bool {
    get(anns, ann::POD_RETAIN_AFTER_COMPLETION) != Some("true")
        || get(anns, ann::REQUIRES_SCRATCH) == Some("true")
}

/// Upstream's short message for a claim too small for its image (the importer's own detail
/// follows it).
const TOO_SMALL: &str = "DataVolume too small to contain image";

/// What the importer said, as the condition message shows it.
/// Upstream's `simplifyKnownMessage`: an image that could not be pulled from its registry is
/// ImagePullFailed whatever the container's own reason.
fn known_reason<'a>(message: &str, reason: &'a str) -> &'a str {
    if message.contains("failed to pull image") {
        "ImagePullFailed"
    } else {
        reason
    }
}

fn said(m: &TerminationMessage) -> String {
    let text = m.message.as_deref().unwrap_or("");
    match m.reason {
        Some(FailureReason::ImageTooLarge | FailureReason::NoSpace) => {
            format!("{TOO_SMALL}: {text}")
        }
        _ => text.to_string(),
    }
}

/// The signal that ended a container, if one did. Runtimes report a signal as 128 + its
/// number; a message then is only the log's tail.
pub fn signal_of(t: &ContainerStateTerminated) -> Option<i32> {
    t.signal
        .filter(|s| *s > 0)
        .or((t.exit_code > 128 && t.exit_code < 160).then(|| t.exit_code - 128))
}

/// The name of a signal that ends containers, as ` (SIGKILL)`; empty for others.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        9 => " (SIGKILL)",
        15 => " (SIGTERM)",
        6 => " (SIGABRT)",
        11 => " (SIGSEGV)",
        2 => " (SIGINT)",
        _ => "",
    }
}

/// What a terminated importer said, or, when it could not say anything (killed by a signal, out
/// of memory), what happened to it: an empty message explains nothing.
fn exit_message(t: &ContainerStateTerminated, restarts: bool, who: &str) -> String {
    let said = said(&TerminationMessage::parse(
        t.message.as_deref().unwrap_or(""),
    ));
    let said = said.trim_end();
    let then = match (restarts, who) {
        (false, _) => "",
        // An upload is the client's to send again.
        (true, "upload server") => "; it restarts for the upload to be sent again",
        (true, _) => "; it restarts and resumes",
    };
    if t.reason.as_deref() == Some("OOMKilled") {
        return format!(
            "the {who} was killed for exceeding its memory limit (OOMKilled){then}; raise \
             CDIConfig spec.podResourceRequirements if it happens again"
        );
    }
    match signal_of(t) {
        Some(sig) if t.exit_code != 0 => {
            let name = signal_name(sig);
            format!("the {who} was killed by signal {sig}{name}{then}")
        }
        _ if !said.is_empty() || t.exit_code == 0 => said.to_string(),
        _ => format!(
            "the {who} exited with code {} without a message{then}; see its log",
            t.exit_code
        ),
    }
}

/// The labels an import's termination message asks for (a registry image's `*_KUBEVIRT_IO_*`
/// environment) that the claim gets: those it does not have yet (upstream never overwrites
/// one), and only valid ones, since an image can say anything and one bad label would make
/// the API server refuse the whole patch.
pub fn labels_to_add(
    current: &BTreeMap<String, String>,
    from_pod: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    from_pod
        .iter()
        .filter(|(k, v)| !current.contains_key(*k) && label_key(k) && label_value(v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A label name: at most 63 of `[A-Za-z0-9._-]`, starting and ending with a letter or digit.
fn label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric())
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)))
}

/// A label key: a name, behind an optional DNS subdomain prefix and `/`.
fn label_key(k: &str) -> bool {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && part.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    prefix_ok && !name.is_empty() && label_value(name)
}

/// The merge patch of annotations turning `current` into `wanted`: changed and new keys, and
/// with `remove_others` the keys `wanted` leaves out (`None`). Empty when nothing changes.
pub fn annotation_patch(
    current: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
    remove_others: bool,
) -> BTreeMap<String, Option<String>> {
    let mut patch: BTreeMap<String, Option<String>> = wanted
        .iter()
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    if remove_others {
        for k in current.keys().filter(|k| !wanted.contains_key(*k)) {
            patch.insert(k.clone(), None);
        }
    }
    patch
}
