//! The doctor on CDI's worker pods: which restarts still count against a pod, and what the API
//! server said when it refused one.

use cdi_api::ann;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use super::Scene;
use crate::import::ERR_CREATING_POD;

/// The restarts that still count against `pod`, and why the container that failed last ended;
/// `None` when none counts. A container restarted before but running and ready now has recovered
/// (an upload server killed once and serving again is no crash loop). Ready says so only behind
/// a readiness probe: without one the kubelet calls a container ready as soon as it starts, also
/// in an importer's brief run between two failures.
pub(super) fn crash_loop(pod: &Pod) -> Option<(i32, Option<String>)> {
    let probed = |name: &str| {
        pod.spec.as_ref().is_some_and(|s| {
            s.containers
                .iter()
                .any(|c| c.name == name && c.readiness_probe.is_some())
        })
    };
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    let mut count = 0;
    let mut last = None;
    for c in statuses.into_iter().flatten() {
        let running = c.state.as_ref().is_some_and(|s| s.running.is_some());
        if running && c.ready && probed(&c.name) {
            continue;
        }
        count += c.restart_count;
        // Ended now, else the end before the restart.
        let ended = c
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .or_else(|| c.last_state.as_ref().and_then(|s| s.terminated.as_ref()));
        if let Some(words) = ended.and_then(super::text::last_words) {
            last = Some(words);
        }
    }
    (count > 0).then_some((count, last))
}

/// What the API server said refusing the worker pod, as a clause: the newest refusal event on
/// the claims or the DataVolume (the API error as the controller got it), else the message of a
/// Running condition whose reason says the pod was refused, the claims' before the DataVolume's
/// (`run`: its reason and message). Never a message under another reason: an earlier pod's
/// scheduling trouble can still be said there.
pub(super) fn refusal(
    s: &Scene<'_>,
    claims: &[&PersistentVolumeClaim],
    run: (&str, &str),
) -> String {
    let mut on: Vec<(&str, &str)> = claims
        .iter()
        .map(|c| ("PersistentVolumeClaim", super::name_of(&c.metadata)))
        .collect();
    on.push(("DataVolume", super::name_of(&s.dv.metadata)));
    let event = super::source::events_on(s, &on, ERR_CREATING_POD)
        .into_iter()
        .find_map(|e| e.message.as_deref());
    let condition = claims.iter().find_map(|c| {
        let a = super::anns(&c.metadata);
        let refused =
            a.get(ann::RUNNING_CONDITION_REASON).map(String::as_str) == Some(ERR_CREATING_POD);
        a.get(ann::RUNNING_CONDITION_MESSAGE)
            .map(String::as_str)
            .filter(|_| refused)
    });
    let on_dv = (run.0 == ERR_CREATING_POD).then_some(run.1);
    [event, condition, on_dv]
        .into_iter()
        .flatten()
        .map(|m| api_error(super::clause(m)))
        .find(|m| !m.is_empty())
        .unwrap_or("no message said")
        .to_string()
}

/// The API server's words in a refusal the controller reported: after `was refused: ` (a worker
/// pod's) or `Error starting pod '…': ` (a clone's source pod), without the controller's advice
/// after them (`; check …`, `; raise …`).
fn api_error(m: &str) -> &str {
    const SOURCE_POD: &str = "Error starting pod '";
    let said = match m.split_once(" was refused: ") {
        Some((_, e)) => e,
        None => m
            .find(SOURCE_POD)
            .and_then(|i| m[i + SOURCE_POD.len()..].split_once("': "))
            .map_or(m, |(_, e)| e),
    };
    match said.rsplit_once("; ") {
        Some((e, advice)) if advice.starts_with("check ") || advice.starts_with("raise ") => e,
        _ => said,
    }
}
