//! What a Pending claim waits for, as its Bound condition annotations (upstream's
//! `UpdatePVCBoundConditionFromEvents`), and the claim as those changes leave it.

use std::collections::BTreeMap;

use cdi_api::ann;
use k8s_openapi::api::core::v1::{Event as ClaimEvent, PersistentVolumeClaim};
use k8s_openapi::jiff::Timestamp;

/// The component the controller reports its events as; its own events on a claim are not what
/// the claim waits for.
pub const COMPONENT: &str = "cdi-controller";

/// Upstream's `UpdatePVCBoundConditionFromEvents`: while the claim is Pending, its latest event
/// (what binding waits for: "waiting for first consumer to be created before binding") becomes
/// its Bound condition annotations, which reach the DataVolume; once Bound they go. The changes
/// to make, none when nothing changes.
pub fn bound_condition(
    claim: &PersistentVolumeClaim,
    events: &[ClaimEvent],
) -> BTreeMap<String, Option<String>> {
    let anns = claim.metadata.annotations.clone().unwrap_or_default();
    let mut changes = BTreeMap::new();
    match phase_of(claim) {
        Some("Bound") if anns.contains_key(ann::BOUND_CONDITION) => {
            for k in [
                ann::BOUND_CONDITION,
                ann::BOUND_CONDITION_REASON,
                ann::BOUND_CONDITION_MESSAGE,
            ] {
                changes.insert(k.to_string(), None);
            }
        }
        Some("Pending") => {
            // With a PVC prime, only its re-emitted events count, without their prefix.
            let prime = anns.get(ann::PVC_PRIME_NAME).map(|p| format!("[{p}] : "));
            let latest = events
                .iter()
                .filter(|e| e.involved_object.uid == claim.metadata.uid)
                // What binding waits for is said by the PV controller and provisioners (copied
                // from PVC prime by the populator); the controller's own warnings on the claim
                // (a refused importer pod) are not that, and would outlive their cause there.
                .filter(|e| prime.is_some() || !reported_by_controller(e))
                .filter(|e| {
                    prime.as_ref().is_none_or(|p| {
                        e.message.as_deref().is_some_and(|m| m.contains(p.as_str()))
                    })
                })
                .max_by_key(|e| seen(e));
            let Some(mut message) = latest.and_then(|e| e.message.clone()) else {
                return changes;
            };
            if let Some(p) = &prime
                && let Some(at) = message.find(p.as_str())
            {
                message = message[at + p.len()..].to_string();
            }
            if anns.get(ann::BOUND_CONDITION_MESSAGE) != Some(&message) {
                changes.insert(ann::BOUND_CONDITION.into(), Some("false".into()));
                changes.insert(ann::BOUND_CONDITION_REASON.into(), Some("Pending".into()));
                changes.insert(ann::BOUND_CONDITION_MESSAGE.into(), Some(message));
            }
        }
        _ => {}
    }
    changes
}

/// The controller's own event: by its source (core/v1) or its reporting controller
/// (events.k8s.io, whose core view has no source).
fn reported_by_controller(e: &ClaimEvent) -> bool {
    e.source.as_ref().and_then(|s| s.component.as_deref()) == Some(COMPONENT)
        || e.reporting_component.as_deref() == Some(COMPONENT)
}

/// When an event was last seen, as kube's printer says: a series' last observation, else the
/// last timestamp, else the event time (events.k8s.io events carry only that).
fn seen(e: &ClaimEvent) -> Option<Timestamp> {
    e.series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref())
        .map(|t| t.0)
        .or(e.last_timestamp.as_ref().map(|t| t.0))
        .or(e.event_time.as_ref().map(|t| t.0))
}

pub(super) fn phase_of(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim.status.as_ref()?.phase.as_deref()
}

/// Apply annotation changes to a copy of `claim`: what the next observation will see.
pub(super) fn with_annotations(
    claim: &PersistentVolumeClaim,
    changes: &BTreeMap<String, Option<String>>,
) -> PersistentVolumeClaim {
    let mut claim = claim.clone();
    let anns = claim.metadata.annotations.get_or_insert_default();
    for (k, v) in changes {
        match v {
            Some(v) => anns.insert(k.clone(), v.clone()),
            None => anns.remove(k),
        };
    }
    claim
}
