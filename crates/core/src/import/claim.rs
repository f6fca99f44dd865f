//! Which claims the import controller works on, and when: an import claim without its pod
//! waits for its first consumer (docs/design.md#the-waitforfirstconsumer-handshake) or gets
//! its importer pod, named and reporting progress as upstream's.

use std::collections::BTreeMap;

use cdi_api::ann;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;

pub(super) fn get<'a>(anns: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    anns.get(key).map(String::as_str)
}

/// The claim's annotations (empty when it has none).
pub fn annotations(claim: &PersistentVolumeClaim) -> BTreeMap<String, String> {
    claim.metadata.annotations.clone().unwrap_or_default()
}

/// Whether the import controller works on this claim at all: it names an import source or
/// endpoint and is not populated by someone else.
pub fn is_import_claim(claim: &PersistentVolumeClaim) -> bool {
    let anns = annotations(claim);
    (anns.contains_key(ann::IMPORT_ENDPOINT) || anns.contains_key(ann::IMPORT_SOURCE))
        && !anns.contains_key(ann::EXTERNAL_POPULATION)
}

/// The import is complete: the worker pod succeeded.
pub fn is_complete(claim: &PersistentVolumeClaim) -> bool {
    get(&annotations(claim), ann::POD_PHASE) == Some("Succeeded")
}

/// WaitForFirstConsumer is honoured for this claim: the gate is on and nobody asked for
/// immediate binding.
pub fn honors_wffc(claim: &PersistentVolumeClaim, gate_on: bool) -> bool {
    gate_on && !annotations(claim).contains_key(ann::IMMEDIATE_BINDING)
}

/// What to do with an import claim that has no importer pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Nothing: done, failed for good, being deleted, or not this controller's.
    Nothing,
    /// Wait for the claim to be bound by its first consumer (docs/design.md#the-waitforfirstconsumer-handshake: no pod before).
    WaitForConsumer,
    /// Create the importer pod.
    CreatePod,
}

/// The decision for a claim without a pod.
pub fn next(claim: &PersistentVolumeClaim, gate_on: bool) -> Next {
    next_for(claim, gate_on, is_import_claim(claim))
}

/// The decision for a claim without its worker pod, for any worker kind: `ours` says the claim
/// is that kind's to fill.
pub fn next_for(claim: &PersistentVolumeClaim, gate_on: bool, ours: bool) -> Next {
    let anns = annotations(claim);
    if !ours
        || is_complete(claim)
        || get(&anns, ann::IMPORT_FATAL_ERROR) == Some("true")
        || claim.metadata.deletion_timestamp.is_some()
    {
        return Next::Nothing;
    }
    let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if honors_wffc(claim, gate_on) && !bound {
        return Next::WaitForConsumer;
    }
    Next::CreatePod
}

/// The importer pod's name for a claim: `importer-<claim>`, shortened as upstream shortens it
/// when the claim's name is long.
pub fn pod_name(claim: &PersistentVolumeClaim) -> String {
    let anns = annotations(claim);
    match get(&anns, ann::IMPORT_POD_NAME) {
        Some(n) if crate::naming::is_object_name(n) => n.to_string(),
        _ => crate::naming::resource_name(
            cdi_api::name::IMPORTER_POD_PREFIX,
            claim.metadata.name.as_deref().unwrap_or(""),
        ),
    }
}

/// The UID the importer reports progress under: the claim's only owner (its DataVolume, or the
/// target claim for PVC prime), else the claim's own.
pub fn owner_uid(claim: &PersistentVolumeClaim) -> String {
    match claim.metadata.owner_references.as_deref() {
        Some([only]) => only.uid.clone(),
        _ => claim.metadata.uid.clone().unwrap_or_default(),
    }
}
