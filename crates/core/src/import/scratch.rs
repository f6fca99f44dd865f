//! Scratch space: when an importer asks for it, the claim it gets (owned by the pod, sized for
//! the whole image: docs/design.md#the-size-math) and where it is mounted.

use std::collections::BTreeMap;

use cdi_api::config::CDIConfig;
use cdi_api::{ann, label};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::claim::{annotations, get};
use super::worker::controlled_by;

/// Where the scratch claim is mounted when the importer asked for one.
pub const SCRATCH_MOUNT: &str = "/scratch";

pub const SCRATCH_VOLUME_NAME: &str = "cdi-scratch-vol";

/// The importer asked for scratch space and waits for it: its scratch claim is made.
pub fn wants_scratch(claim: &PersistentVolumeClaim, pod: &Pod) -> bool {
    let pending = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending");
    pending && get(&annotations(claim), ann::REQUIRES_SCRATCH) == Some("true")
}

/// The pod's latest state asks for scratch space for the first time (`before` is the claim's
/// annotations, `after` them with the pod's state): the pod is done for now.
pub fn scratch_just_requested(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> bool {
    get(after, ann::REQUIRES_SCRATCH) == Some("true")
        && get(before, ann::REQUIRES_SCRATCH) != Some("true")
}

/// Where the scratch claim an importer asked for is made: CDIConfig's scratch class, else the
/// target's; the overheads of both (the scratch claim holds the whole image, converted after).
pub fn scratch_for(
    claim: &PersistentVolumeClaim,
    pod: &Pod,
    cfg: Option<&CDIConfig>,
) -> PersistentVolumeClaim {
    let target_class = claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone());
    let scratch_class = cfg
        .and_then(|c| c.status.as_ref())
        .and_then(|s| s.scratch_space_storage_class.clone())
        .filter(|c| !c.is_empty())
        .or(target_class.clone());
    let fs = crate::size::VolumeMode::Filesystem;
    let target_overhead = crate::render::filesystem_overhead(cfg, target_class.as_deref(), fs);
    let scratch_overhead = crate::render::filesystem_overhead(cfg, scratch_class.as_deref(), fs);
    scratch_claim(
        claim,
        pod,
        scratch_class.as_deref(),
        target_overhead,
        scratch_overhead,
    )
}

/// The scratch claim's name: `<claim>-scratch`, shortened when the claim's name is long.
pub fn scratch_name(claim: &PersistentVolumeClaim) -> String {
    crate::naming::resource_name(claim.metadata.name.as_deref().unwrap_or(""), "scratch")
}

/// The scratch claim for `claim`'s importer `pod` (upstream's `createScratchPvcForPod`): owned by
/// the pod, ReadWriteOnce Filesystem, big enough for the image at the target's usable size plus
/// the scratch class's overhead (docs/design.md#the-size-math), excluded from backups, placed like the target.
pub fn scratch_claim(
    claim: &PersistentVolumeClaim,
    pod: &Pod,
    class: Option<&str>,
    target_overhead: crate::Overhead,
    scratch_overhead: crate::Overhead,
) -> PersistentVolumeClaim {
    let request = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref()?.requests.as_ref()?.get("storage"))
        .and_then(|q| crate::Quantity::try_from(q).ok())
        .map(|q| q.value())
        .unwrap_or(0);
    let usable = crate::size::usable_space(request, target_overhead);
    // Past what a quantity holds only for a hostile request: then ask for that much.
    let size = crate::size::required_space(usable, scratch_overhead)
        .and_then(|s| crate::size::round_up(s, crate::MIB))
        .unwrap_or(i64::MAX);
    let mut anns: BTreeMap<String, String> = annotations(claim)
        .into_iter()
        .filter(|(k, _)| k.starts_with("kubevirt.io/") || k == ann::SELECTED_NODE)
        .collect();
    anns.insert(ann::IMMEDIATE_BINDING.into(), String::new());
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(scratch_name(claim)),
            namespace: claim.metadata.namespace.clone(),
            annotations: Some(anns),
            labels: Some(BTreeMap::from([
                (label::APP.into(), label::APP_VALUE.into()),
                (label::EXCLUDE_FROM_VELERO_BACKUP.into(), "true".into()),
            ])),
            owner_references: Some(vec![controlled_by("Pod", &pod.metadata)]),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: class.map(str::to_string),
            resources: Some(k8s_openapi::api::core::v1::VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(size.to_string()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}
