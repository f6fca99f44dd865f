//! Pods the import may not use: one the API server refused (said on the claim until a pod
//! exists), and one found under the claim's pod name that the claim does not control.

use std::collections::BTreeMap;

use cdi_api::ann;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use super::claim::{annotations, get};

/// The reason on the claim when the API server refused its importer pod.
pub const ERR_CREATING_POD: &str = "ErrCreatingPod";

/// Upstream's reason when a ResourceQuota refused it.
pub const ERR_EXCEEDED_QUOTA: &str = "ErrExceededQuota";

/// The reason for the API server's refusal `why` of a worker pod: upstream's `ErrExceededQuota`
/// for a quota's (`exceeded quota:`), `ErrCreatingPod` otherwise.
pub fn refusal_reason(why: &str) -> &'static str {
    if why.contains("exceeded quota:") {
        ERR_EXCEEDED_QUOTA
    } else {
        ERR_CREATING_POD
    }
}

/// The claim's Running condition when its worker pod was refused (a bad CDIConfig resource
/// setting, the CDI resource's placement, a ResourceQuota), whence it reaches the DataVolume;
/// the reason and the message.
pub fn refused_pod(
    claim: &PersistentVolumeClaim,
    pod_name: &str,
    why: &str,
) -> (BTreeMap<String, String>, &'static str, String) {
    let ns = claim.metadata.namespace.as_deref().unwrap_or("");
    let name = claim.metadata.name.as_deref().unwrap_or("");
    let reason = refusal_reason(why);
    let fix = if reason == ERR_EXCEEDED_QUOTA {
        format!(
            "raise the ResourceQuota of namespace {ns} or lower CDIConfig \
             spec.podResourceRequirements"
        )
    } else {
        "check CDIConfig spec.podResourceRequirements and the CDI resource's spec.workload".into()
    };
    let message =
        format!("the worker pod {pod_name} for claim {ns}/{name} was refused: {why}; {fix}");
    let anns = [
        (ann::RUNNING_CONDITION, "false"),
        (ann::RUNNING_CONDITION_MESSAGE, message.as_str()),
        (ann::RUNNING_CONDITION_REASON, reason),
        // No pod waits to be scheduled now: an earlier pod's trouble would hide the refusal
        // (the DataVolume's Running condition says Unschedulable before anything else).
        (ann::POD_SCHEDULABLE, "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    (anns, reason, message)
}

/// Once the importer pod exists, an earlier refusal is over: its Running condition goes (the
/// pod's own state speaks from now on). Empty when there was none.
pub fn refusal_over(claim: &PersistentVolumeClaim) -> BTreeMap<String, Option<String>> {
    let anns = annotations(claim);
    if !matches!(
        get(&anns, ann::RUNNING_CONDITION_REASON),
        Some(ERR_CREATING_POD | ERR_EXCEEDED_QUOTA)
    ) {
        return BTreeMap::new();
    }
    [
        ann::RUNNING_CONDITION,
        ann::RUNNING_CONDITION_MESSAGE,
        ann::RUNNING_CONDITION_REASON,
    ]
    .into_iter()
    .map(|k| (k.to_string(), None))
    .collect()
}

/// Why `pod` (found under the name the claim gives) is not the claim's importer, if it is not:
/// the name comes from an annotation anyone can write, so only a pod the claim controls is read,
/// and deleted.
pub fn foreign_pod(claim: &PersistentVolumeClaim, pod_name: &str, pod: &Pod) -> Option<String> {
    let ours = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == claim.metadata.uid.as_ref());
    if ours {
        return None;
    }
    let ns = claim.metadata.namespace.as_deref().unwrap_or("");
    let name = claim.metadata.name.as_deref().unwrap_or("");
    // The controller writes the name it derives onto the claim too; only another name was put
    // there by someone else.
    let derived = crate::naming::resource_name(cdi_api::name::IMPORTER_POD_PREFIX, name);
    Some(if pod_name != derived {
        format!(
            "pod {pod_name} named by {} on claim {ns}/{name} is not this claim's importer; \
             remove the annotation to let the controller name its own",
            ann::IMPORT_POD_NAME
        )
    } else {
        format!(
            "pod {pod_name} is not the importer of claim {ns}/{name}; the import starts once \
             that pod is gone"
        )
    })
}
