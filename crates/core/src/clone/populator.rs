//! The clone populator's decisions (upstream's clone populator and planner): a target claim whose
//! `dataSourceRef` is a VolumeCloneSource gets its strategy chosen once (`cdi.kubevirt.io/
//! cloneType`), then goes through the phases of that strategy, written as
//! `cdi.kubevirt.io/clonePhase`. For `copy` (host-assisted): a temporary claim `tmp-pvc-<target
//! uid>` in the source's namespace asks for a copy of the source (`k8s.io/CloneRequest`), the
//! upload and clone controllers fill it, and its volume is handed to the target (Rebind).

use std::collections::BTreeMap;

use cdi_api::populators::{VOLUME_CLONE_SOURCE_KIND, VolumeCloneSource};
use cdi_api::{ann, label};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, TypedObjectReference,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::import::annotations;

/// The temporary claim's name prefix.
pub const TMP_PREFIX: &str = "tmp-pvc";

/// The prefix of the claim a snapshot source is restored into for a host-assisted copy.
pub const TMP_SOURCE_PREFIX: &str = "tmp-source-pvc";
/// The temporary VolumeSnapshot's name prefix.
pub const SNAPSHOT_PREFIX: &str = "tmp-snapshot";
/// The pod that gets a temporary claim of a WaitForFirstConsumer class bound.
pub const PREP_PREFIX: &str = "prep";

/// The phases, as written on the target (upstream's names).
pub mod phase {
    pub const PENDING: &str = "Pending";
    pub const HOST_CLONE: &str = "HostClone";
    pub const CSI_CLONE: &str = "CSIClone";
    pub const SNAPSHOT: &str = "Snapshot";
    pub const SNAPSHOT_CLONE: &str = "SnapshotClone";
    pub const PREP_CLAIM: &str = "PrepClaim";
    pub const REBIND: &str = "Rebind";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const ERROR: &str = "Error";
}

/// The VolumeCloneSource the target's `dataSourceRef` names, when it names one.
pub fn clone_source_name(target: &PersistentVolumeClaim) -> Option<&str> {
    let r = target.spec.as_ref()?.data_source_ref.as_ref()?;
    (r.api_group.as_deref() == Some(cdi_api::GROUP) && r.kind == VOLUME_CLONE_SOURCE_KIND)
        .then_some(r.name.as_str())
}

/// Where the VolumeCloneSource is: `cdi.kubevirt.io/dataSourceNamespace`, else the reference's
/// namespace, else the target's.
pub fn source_namespace(target: &PersistentVolumeClaim) -> String {
    let anns = annotations(target);
    anns.get(ann::DATA_SOURCE_NAMESPACE)
        .filter(|n| !n.is_empty())
        .cloned()
        .or_else(|| {
            target
                .spec
                .as_ref()?
                .data_source_ref
                .as_ref()?
                .namespace
                .clone()
        })
        .unwrap_or_else(|| target.metadata.namespace.clone().unwrap_or_default())
}

/// The temporary claim of a host-assisted copy: `tmp-pvc-<target uid>`.
pub fn tmp_claim_name(target: &PersistentVolumeClaim) -> String {
    format!(
        "{TMP_PREFIX}-{}",
        target.metadata.uid.as_deref().unwrap_or("")
    )
}

/// `tmp-source-pvc-<target uid>`.
pub fn tmp_source_claim_name(target: &PersistentVolumeClaim) -> String {
    format!(
        "{TMP_SOURCE_PREFIX}-{}",
        target.metadata.uid.as_deref().unwrap_or("")
    )
}

/// The claim a VolumeSnapshot source that its target's driver cannot restore is restored into
/// by `class` (one of the snapshot's driver), for a host-assisted copy from it (upstream's
/// temporary source claim): in the snapshot's namespace, ReadWriteOnce (which every driver
/// allows), of the snapshot's volume mode when known (else the target's), at its restore size;
/// found by the target's UID label.
pub fn tmp_source_claim(
    target: &PersistentVolumeClaim,
    source: &VolumeCloneSource,
    class: &str,
    volume_mode: Option<&str>,
    restore_size: &str,
) -> PersistentVolumeClaim {
    let meta = ObjectMeta {
        name: Some(tmp_source_claim_name(target)),
        namespace: source.metadata.namespace.clone(),
        labels: Some(BTreeMap::from([(
            label::OWNED_BY_UID.to_string(),
            target.metadata.uid.clone().unwrap_or_default(),
        )])),
        ..Default::default()
    };
    let target_mode = target.spec.as_ref().and_then(|s| s.volume_mode.clone());
    crate::clone::host::restored_claim(
        meta,
        &source.spec.source.name,
        class,
        Some(vec!["ReadWriteOnce".into()]),
        volume_mode.map(str::to_string).or(target_mode),
        restore_size,
    )
}

/// `tmp-snapshot-<target uid>`.
pub fn tmp_snapshot_name(target: &PersistentVolumeClaim) -> String {
    format!(
        "{SNAPSHOT_PREFIX}-{}",
        target.metadata.uid.as_deref().unwrap_or("")
    )
}

/// `prep-<target uid>`.
pub fn prep_pod_name(target: &PersistentVolumeClaim) -> String {
    format!(
        "{PREP_PREFIX}-{}",
        target.metadata.uid.as_deref().unwrap_or("")
    )
}

/// A VolumeSnapshot's `status.restoreSize` in bytes (the object, or its `data` beside the
/// metadata), once the snapshot has one.
pub fn restore_size(snapshot: &serde_json::Value) -> Option<i64> {
    snapshot["status"]["restoreSize"]
        .as_str()
        .and_then(|q| q.parse::<crate::quantity::Quantity>().ok())
        .map(|q| q.value())
}

/// How the temporary claim gets its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill<'a> {
    /// Host-assisted: the upload and clone controllers copy the source into it.
    Copy,
    /// Host-assisted, from the named claim of the source's namespace (a snapshot source
    /// restored for the copy).
    CopyOf(&'a str),
    /// The CSI driver clones the source claim into it (`dataSourceRef` the claim).
    CsiClone,
    /// The CSI driver restores the named VolumeSnapshot into it.
    Restore(&'a str),
}

/// The temporary VolumeSnapshot of the source (upstream's snapshot phase), in the source's
/// namespace, labelled with the target's UID.
pub fn tmp_snapshot(
    target: &PersistentVolumeClaim,
    source_ns: &str,
    source_name: &str,
    class: Option<&str>,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {
            "name": tmp_snapshot_name(target),
            "namespace": source_ns,
            "labels": {
                label::APP: label::APP_VALUE,
                label::OWNED_BY_UID: target.metadata.uid.as_deref().unwrap_or(""),
            },
        },
        "spec": {
            "source": {"persistentVolumeClaimName": source_name},
            "volumeSnapshotClassName": class,
        },
    })
}

/// The pod that makes the scheduler bind a temporary claim of a WaitForFirstConsumer class
/// (upstream's prep pod): it mounts nothing, names the claim, and exits.
pub fn prep_pod(
    target: &PersistentVolumeClaim,
    tmp: &PersistentVolumeClaim,
    image: &str,
) -> k8s_openapi::api::core::v1::Pod {
    use k8s_openapi::api::core::v1::{
        Container, PersistentVolumeClaimVolumeSource, Pod, PodSpec, Volume,
    };
    let node = annotations(tmp).get(ann::SELECTED_NODE).cloned();
    Pod {
        metadata: ObjectMeta {
            name: Some(prep_pod_name(target)),
            namespace: tmp.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (label::APP.to_string(), label::APP_VALUE.to_string()),
                (
                    label::COMPONENT.to_string(),
                    label::POPULATOR_PREP_COMPONENT.to_string(),
                ),
                (
                    label::OWNED_BY_UID.to_string(),
                    target.metadata.uid.clone().unwrap_or_default(),
                ),
            ])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "dummy".into(),
                image: Some(image.into()),
                command: Some(vec!["/bin/sh".into(), "-c".into(), "exit 0".into()]),
                security_context: Some(crate::import::worker_security_context()),
                ..Default::default()
            }],
            volumes: Some(vec![Volume {
                name: "claim".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: tmp.metadata.name.clone().unwrap_or_default(),
                    read_only: None,
                }),
                ..Default::default()
            }]),
            node_name: node,
            restart_policy: Some("Never".into()),
            enable_service_links: Some(false),
            automount_service_account_token: Some(false),
            ..Default::default()
        }),
        status: None,
    }
}

/// The target claim the temporary claim `tmp` works for (its `events.source`), as
/// `(namespace, name)`.
pub fn target_of(tmp: &PersistentVolumeClaim) -> Option<(String, String)> {
    let anns = tmp.metadata.annotations.as_ref()?;
    if anns.get(ann::POPULATOR_KIND).map(String::as_str) != Some(VOLUME_CLONE_SOURCE_KIND) {
        return None;
    }
    let (ns, name) = anns.get(ann::EVENT_SOURCE)?.split_once('/')?;
    Some((ns.to_string(), name.to_string()))
}

/// The temporary claim (upstream's host-clone claim): the target's class, size, access and
/// volume modes without its data source, in the source's namespace, asking for a copy of the
/// source; bound at once on the target's node (when its class waits for a first consumer);
/// found by the target's UID label, as it can have no owner in another namespace.
pub fn tmp_claim(
    target: &PersistentVolumeClaim,
    source: &VolumeCloneSource,
    node: Option<&str>,
    preallocation_default: bool,
    fill: Fill<'_>,
) -> PersistentVolumeClaim {
    let spec = target.spec.clone().unwrap_or_default();
    let target_anns = annotations(target);
    let uid = target.metadata.uid.clone().unwrap_or_default();
    let ns = source
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| target.metadata.namespace.clone().unwrap_or_default());
    let copied = match fill {
        Fill::Copy => Some(source.spec.source.name.as_str()),
        Fill::CopyOf(claim) => Some(claim),
        Fill::CsiClone | Fill::Restore(_) => None,
    };
    let mut anns = BTreeMap::from([
        (ann::IMMEDIATE_BINDING.to_string(), String::new()),
        (ann::OWNER_UID.into(), uid.clone()),
        (ann::POD_RESTARTS.into(), "0".into()),
        (ann::POPULATOR_KIND.into(), VOLUME_CLONE_SOURCE_KIND.into()),
        (
            ann::EVENT_SOURCE_KIND.into(),
            "PersistentVolumeClaim".into(),
        ),
        (
            ann::EVENT_SOURCE.into(),
            format!(
                "{}/{}",
                target.metadata.namespace.as_deref().unwrap_or(""),
                target.metadata.name.as_deref().unwrap_or("")
            ),
        ),
        (
            ann::PREALLOCATION_REQUESTED.into(),
            source
                .spec
                .preallocation
                .unwrap_or(preallocation_default)
                .to_string(),
        ),
    ]);
    if let Some(n) = node {
        anns.insert(ann::SELECTED_NODE.into(), n.into());
    }
    // Only a host-assisted copy asks the upload and clone controllers for a copy.
    if let Some(claim) = copied {
        anns.insert(ann::CLONE_REQUEST.into(), format!("{ns}/{claim}"));
    }
    let kept = [
        ann::CONTENT_TYPE,
        ann::POD_RETAIN_AFTER_COMPLETION,
        ann::PERMISSIVE_CLONE,
    ];
    for key in crate::populator::PASSED_TO_WORKER.iter().chain(&kept) {
        if let Some(v) = target_anns.get(*key) {
            anns.insert(key.to_string(), v.clone());
        }
    }
    // The VolumeCloneSource's priority class, when it names one.
    if let Some(pc) = source
        .spec
        .priority_class_name
        .as_deref()
        .filter(|p| !p.is_empty())
    {
        anns.insert(ann::PRIORITY_CLASS_NAME.into(), pc.into());
    }
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(tmp_claim_name(target)),
            namespace: Some(ns),
            labels: Some(BTreeMap::from([
                (label::APP.to_string(), label::APP_VALUE.to_string()),
                (label::OWNED_BY_UID.to_string(), uid),
                (
                    label::EXCLUDE_FROM_VELERO_BACKUP.to_string(),
                    "true".to_string(),
                ),
            ])),
            annotations: Some(anns),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: spec.access_modes,
            resources: spec.resources,
            storage_class_name: spec.storage_class_name,
            volume_mode: spec.volume_mode,
            data_source_ref: match fill {
                Fill::Copy | Fill::CopyOf(_) => None,
                Fill::CsiClone => Some(TypedObjectReference {
                    api_group: None,
                    kind: "PersistentVolumeClaim".into(),
                    name: source.spec.source.name.clone(),
                    namespace: None,
                }),
                Fill::Restore(snapshot) => Some(TypedObjectReference {
                    api_group: Some("snapshot.storage.k8s.io".into()),
                    kind: "VolumeSnapshot".into(),
                    name: snapshot.into(),
                    namespace: None,
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// Raise the claim's storage request to `bytes` when it asks for less. A driver clones or
/// restores a volume no smaller than its source: the temporary claim asks for at least that
/// (upstream sizes it by the source), and a target that asked for less, since it holds the
/// source's disk image, takes the larger volume.
pub fn at_least(claim: &mut PersistentVolumeClaim, bytes: i64) {
    use k8s_openapi::api::core::v1::VolumeResourceRequirements;
    let requests = claim
        .spec
        .get_or_insert_default()
        .resources
        .get_or_insert_with(VolumeResourceRequirements::default)
        .requests
        .get_or_insert_default();
    let asked = requests
        .get("storage")
        .and_then(|q| crate::Quantity::try_from(q).ok())
        .map_or(0, |q| q.value());
    if asked < bytes {
        requests.insert("storage".into(), crate::Quantity::from_bytes(bytes).into());
    }
}

/// The copy into the temporary claim is complete: the clone controller said so, and it is
/// preallocated when that was asked for (upstream's host-clone phase).
pub fn host_clone_done(tmp: &PersistentVolumeClaim) -> bool {
    let anns = annotations(tmp);
    let preallocated = anns.get(ann::PREALLOCATION_REQUESTED).map(String::as_str) != Some("true")
        || anns.get(ann::PREALLOCATION_APPLIED).map(String::as_str) == Some("true");
    anns.contains_key(ann::CLONE_OF) && preallocated
}

/// What the target mirrors of the temporary claim while the copy runs (its worker's state) and
/// the progress; written over the target's annotations.
pub fn mirrored(
    target: &PersistentVolumeClaim,
    tmp: &PersistentVolumeClaim,
    progress: Option<&str>,
) -> BTreeMap<String, String> {
    let mut out = annotations(target);
    let from = annotations(tmp);
    for key in [
        ann::POD_RESTARTS,
        ann::RUNNING_CONDITION,
        ann::RUNNING_CONDITION_MESSAGE,
        ann::RUNNING_CONDITION_REASON,
        ann::PREALLOCATION_APPLIED,
        ann::CLONE_OF,
    ] {
        if let Some(v) = from.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    if host_clone_done(tmp) {
        out.insert(ann::POPULATOR_PROGRESS.into(), "100.0%".into());
    } else if let Some(p) = progress {
        out.insert(ann::POPULATOR_PROGRESS.into(), p.into());
    }
    out
}

/// The target's annotations at the end: Succeeded, complete progress, the running condition
/// upstream writes for a finished clone.
pub fn succeeded(target: &PersistentVolumeClaim) -> BTreeMap<String, String> {
    let mut out = annotations(target);
    out.remove(ann::CLONE_ERROR);
    for (k, v) in [
        (ann::CLONE_PHASE, phase::SUCCEEDED),
        (ann::POPULATOR_PROGRESS, "100.0%"),
        (ann::RUNNING_CONDITION, "false"),
        (ann::RUNNING_CONDITION_MESSAGE, "Clone Complete"),
        (ann::RUNNING_CONDITION_REASON, "Completed"),
    ] {
        out.insert(k.into(), v.into());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn target(anns: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "disk", "namespace": "vms", "uid": "t-uid", "annotations": anns},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "csi", "volumeMode": "Block",
                "resources": {"requests": {"storage": "10Gi"}},
                "dataSourceRef": {"apiGroup": "cdi.kubevirt.io", "kind": "VolumeCloneSource",
                    "name": "volume-clone-source-dv"}}}))
        .unwrap()
    }

    fn vcs() -> VolumeCloneSource {
        serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "VolumeCloneSource", "metadata": {"name": "volume-clone-source-dv", "namespace": "vms"},
            "spec": {"source": {"kind": "PersistentVolumeClaim", "name": "golden"}}}))
        .unwrap()
    }

    #[test]
    fn the_temporary_claim_asks_for_a_copy_for_its_target() {
        let t = target(json!({"cdi.kubevirt.io/storage.contentType": "kubevirt"}));
        assert_eq!(clone_source_name(&t), Some("volume-clone-source-dv"));
        assert_eq!(source_namespace(&t), "vms");
        let tmp = tmp_claim(&t, &vcs(), Some("node-2"), false, Fill::Copy);
        assert_eq!(tmp.metadata.name.as_deref(), Some("tmp-pvc-t-uid"));
        assert_eq!(tmp.metadata.namespace.as_deref(), Some("vms"));
        let anns = tmp.metadata.annotations.clone().unwrap();
        assert_eq!(anns[ann::CLONE_REQUEST], "vms/golden");
        assert_eq!(anns[ann::SELECTED_NODE], "node-2");
        assert_eq!(anns[ann::OWNER_UID], "t-uid");
        assert_eq!(anns[ann::CONTENT_TYPE], "kubevirt");
        assert_eq!(anns[ann::PREALLOCATION_REQUESTED], "false");
        assert_eq!(tmp.metadata.labels.unwrap()[label::OWNED_BY_UID], "t-uid");
        let spec = tmp.spec.unwrap();
        assert!(spec.data_source_ref.is_none());
        assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
        assert_eq!(
            target_of(&tmp_claim(&t, &vcs(), None, false, Fill::Copy)),
            Some(("vms".into(), "disk".into()))
        );
        let clone = tmp_claim(&t, &vcs(), None, false, Fill::CsiClone);
        assert!(
            !clone
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(ann::CLONE_REQUEST)
        );
        assert_eq!(
            clone
                .spec
                .as_ref()
                .unwrap()
                .data_source_ref
                .as_ref()
                .unwrap()
                .name,
            "golden"
        );
        // A snapshot another driver took: restored by its own class, then copied from there.
        let restored = tmp_source_claim(&t, &vcs(), "csi", Some("Filesystem"), "1Gi");
        assert_eq!(
            restored.metadata.name.as_deref(),
            Some("tmp-source-pvc-t-uid")
        );
        assert_eq!(restored.metadata.namespace.as_deref(), Some("vms"));
        assert!(crate::clone::host::restored_for_copy(&restored).is_some());
        let spec = restored.spec.unwrap();
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(spec.storage_class_name.as_deref(), Some("csi"));
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
        let copy = tmp_claim(
            &t,
            &vcs(),
            None,
            false,
            Fill::CopyOf("tmp-source-pvc-t-uid"),
        );
        assert_eq!(
            copy.metadata.annotations.unwrap()[ann::CLONE_REQUEST],
            "vms/tmp-source-pvc-t-uid"
        );
        assert!(copy.spec.unwrap().data_source_ref.is_none());
        let restore = tmp_claim(&t, &vcs(), None, false, Fill::Restore("tmp-snapshot-t-uid"));
        // Never smaller than what it restores or clones; a larger target keeps its size.
        let asked = |c: &PersistentVolumeClaim| {
            let r = &c.spec.as_ref().unwrap().resources.as_ref().unwrap();
            crate::Quantity::try_from(&r.requests.as_ref().unwrap()["storage"])
                .unwrap()
                .value()
        };
        let mut raised = restore.clone();
        at_least(&mut raised, 12 << 30);
        assert_eq!(asked(&raised), 12 << 30);
        at_least(&mut raised, 1 << 30);
        assert_eq!(asked(&raised), 12 << 30);
        let r = restore.spec.unwrap().data_source_ref.unwrap();
        assert_eq!(
            (r.kind.as_str(), r.name.as_str()),
            ("VolumeSnapshot", "tmp-snapshot-t-uid")
        );
        let snap = tmp_snapshot(&t, "vms", "golden", Some("csi-snapclass"));
        assert_eq!(
            snap["spec"]["source"]["persistentVolumeClaimName"],
            "golden"
        );
        assert_eq!(snap["metadata"]["labels"][label::OWNED_BY_UID], "t-uid");
        let prep = prep_pod(&t, &clone, "cdi-cloner");
        assert_eq!(prep.metadata.name.as_deref(), Some("prep-t-uid"));
        let across = target(json!({"cdi.kubevirt.io/dataSourceNamespace": "golden"}));
        assert_eq!(source_namespace(&across), "golden");
    }

    #[test]
    fn done_when_copied_and_preallocated_as_asked() {
        let t = target(json!({}));
        let mut tmp = tmp_claim(&t, &vcs(), None, true, Fill::Copy);
        assert!(!host_clone_done(&tmp));
        let anns = tmp.metadata.annotations.as_mut().unwrap();
        anns.insert(ann::CLONE_OF.into(), "true".into());
        assert!(
            !host_clone_done(&tmp),
            "preallocation asked and not applied"
        );
        tmp.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ann::PREALLOCATION_APPLIED.into(), "true".into());
        assert!(host_clone_done(&tmp));
        let m = mirrored(&t, &tmp, Some("50.00%"));
        assert_eq!(m[ann::POPULATOR_PROGRESS], "100.0%");
        assert_eq!(succeeded(&t)[ann::CLONE_PHASE], "Succeeded");
    }
}
