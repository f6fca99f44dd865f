//! The import populator's decisions (docs/design.md#the-populators; upstream's populator base and import
//! populator): when a target claim can be populated, PVC prime, what flows from PVC prime back
//! to the target, and when the finished volume is handed over.

use std::collections::BTreeMap;

use cdi_api::datavolume::DataVolumeSource;
use cdi_api::populators::{
    VOLUME_IMPORT_SOURCE_KIND, VOLUME_UPLOAD_SOURCE_KIND, VolumeImportSource, VolumeUploadSource,
};
use cdi_api::{ann, label};

use crate::import::annotations;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The node the scheduler chose for a claim's first consumer; an empty value is none.
pub fn selected_node(anns: &BTreeMap<String, String>) -> Option<&str> {
    anns.get(ann::SELECTED_NODE)
        .map(String::as_str)
        .filter(|n| !n.is_empty())
}

/// Upstream's `shouldBeMarkedPendingPopulation`: a claim of a WaitForFirstConsumer class with no
/// node chosen yet and no immediate binding asked for waits for its first consumer.
pub fn waits_for_first_consumer(anns: &BTreeMap<String, String>, class_wffc: bool) -> bool {
    class_wffc && selected_node(anns).is_none() && !anns.contains_key(ann::IMMEDIATE_BINDING)
}

/// The annotations PVC prime's worker writes that the target mirrors (upstream's list).
pub const MIRRORED: [&str; 12] = [
    ann::POD_PHASE,
    ann::POD_READY,
    ann::POD_RESTARTS,
    ann::PREALLOCATION_REQUESTED,
    ann::PREALLOCATION_APPLIED,
    ann::CURRENT_CHECKPOINT,
    ann::MULTISTAGE_IMPORT_DONE,
    ann::RUNNING_CONDITION,
    ann::RUNNING_CONDITION_MESSAGE,
    ann::RUNNING_CONDITION_REASON,
    ann::POD_SCHEDULABLE,
    ann::IMPORT_FATAL_ERROR,
];

/// What a populator's own claim (PVC prime, a clone's temporary claim) takes from its target for
/// its worker pods: where the target's consumer placed it (the inherited tolerations), and the
/// pods' priority, ServiceAccount and networks.
pub const PASSED_TO_WORKER: [&str; 6] = [
    cdi_api::ext::WORKER_TOLERATIONS,
    cdi_api::ext::WORKER_PLACEMENT,
    ann::PRIORITY_CLASS_NAME,
    ann::POD_SERVICE_ACCOUNT_NAME,
    ann::POD_MULTUS_NETWORKS,
    ann::POD_MULTUS_DEFAULT_NETWORK,
];

/// The populator sources of this controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// VolumeImportSource: PVC prime is an import claim.
    Import,
    /// VolumeUploadSource: PVC prime is an upload target.
    Upload,
}

/// The kind and name of the populator source the target claim's `dataSourceRef` names in its
/// namespace, when it is one of this controller's.
pub fn source_of(target: &PersistentVolumeClaim) -> Option<(SourceKind, &str)> {
    let r = target.spec.as_ref()?.data_source_ref.as_ref()?;
    if r.api_group.as_deref() != Some(cdi_api::GROUP) || r.namespace.is_some() {
        return None;
    }
    let kind = match r.kind.as_str() {
        VOLUME_IMPORT_SOURCE_KIND => SourceKind::Import,
        VOLUME_UPLOAD_SOURCE_KIND => SourceKind::Upload,
        _ => return None,
    };
    Some((kind, r.name.as_str()))
}

/// The target claim's VolumeImportSource, when its `dataSourceRef` names one in its namespace.
pub fn import_source_name(target: &PersistentVolumeClaim) -> Option<&str> {
    match source_of(target)? {
        (SourceKind::Import, name) => Some(name),
        _ => None,
    }
}

/// A populator source, as read.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    Import(&'a VolumeImportSource),
    Upload(&'a VolumeUploadSource),
}

/// PVC prime's name: `prime-<target uid>`.
pub fn prime_name(target: &PersistentVolumeClaim) -> String {
    format!(
        "{}-{}",
        cdi_api::name::PVC_PRIME_PREFIX,
        target.metadata.uid.as_deref().unwrap_or("")
    )
}

/// Whether population can start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Not yet (no class yet, or a WaitForFirstConsumer class and no selected node).
    Wait,
    /// Go: PVC prime goes on this node when the class waits for a first consumer.
    Ready { node: Option<String> },
    /// Never: the message says why.
    Refused(String),
}

/// Upstream's `claimReadyForPopulation`.
pub fn readiness(target: &PersistentVolumeClaim, class: Option<&StorageClass>) -> Readiness {
    let name = target.metadata.name.as_deref().unwrap_or("");
    let ns = target.metadata.namespace.as_deref().unwrap_or("");
    let Some(class_name) = target
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
    else {
        return Readiness::Wait;
    };
    if class_name.is_empty() {
        return Readiness::Refused(format!(
            "PVC {ns}/{name} has empty storage class name; a populator needs a class whose provisioner can create the volume"
        ));
    }
    let Some(class) = class else {
        return Readiness::Refused(format!("storage class {class_name} not found"));
    };
    let anns = annotations(target);
    if class.provisioner.starts_with("kubernetes.io/")
        && !anns.contains_key("pv.kubernetes.io/migrated-to")
    {
        return Readiness::Refused(format!(
            "can't use populator for PVC {ns}/{name} with in-tree storage class {}",
            class.provisioner
        ));
    }
    if class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer") {
        if waits_for_first_consumer(&anns, true) {
            return Readiness::Wait;
        }
        return Readiness::Ready {
            node: selected_node(&anns).map(str::to_string),
        };
    }
    Readiness::Ready { node: None }
}

/// PVC prime for `target` (docs/design.md#the-populators): the same access modes, size, class and volume mode
/// without the data source, immediate binding, the selected node copied, what `source` asks of
/// its worker (an import's source annotations, or the upload target mark), owned by the target,
/// excluded from backups.
pub fn prime_claim(
    target: &PersistentVolumeClaim,
    source: Source<'_>,
    node: Option<&str>,
    preallocation_default: bool,
) -> PersistentVolumeClaim {
    let spec = target.spec.clone().unwrap_or_default();
    let target_anns = annotations(target);
    let mut anns = BTreeMap::from([(ann::IMMEDIATE_BINDING.to_string(), String::new())]);
    if let Some(n) = node {
        anns.insert(ann::SELECTED_NODE.into(), n.into());
    }
    if let Some(v) = target_anns.get(ann::POD_RETAIN_AFTER_COMPLETION) {
        anns.insert(ann::POD_RETAIN_AFTER_COMPLETION.into(), v.clone());
    }
    for key in PASSED_TO_WORKER {
        if let Some(v) = target_anns.get(key) {
            anns.insert(key.into(), v.clone());
        }
    }
    let (kind, content_type, preallocation) = match source {
        Source::Import(i) => (
            VOLUME_IMPORT_SOURCE_KIND,
            i.spec.content_type,
            i.spec.preallocation,
        ),
        Source::Upload(u) => (
            VOLUME_UPLOAD_SOURCE_KIND,
            u.spec.content_type,
            u.spec.preallocation,
        ),
    };
    anns.insert(ann::POPULATOR_KIND.into(), kind.into());
    anns.insert(
        ann::CONTENT_TYPE.into(),
        content_type.unwrap_or_default().as_str().into(),
    );
    anns.insert(
        ann::PREALLOCATION_REQUESTED.into(),
        preallocation.unwrap_or(preallocation_default).to_string(),
    );
    match source {
        // PVC prime is an upload target: the upload controller gives it its upload pod.
        Source::Upload(_) => {
            anns.insert(ann::UPLOAD_REQUEST.into(), String::new());
        }
        // PVC prime is an import claim: the import controller gives it its importer.
        Source::Import(import) => {
            let from = import.spec.source.clone().unwrap_or_default();
            let as_dv = DataVolumeSource {
                http: from.http,
                s3: from.s3,
                registry: from.registry,
                gcs: from.gcs,
                blank: from.blank,
                imageio: from.imageio,
                vddk: from.vddk,
                ..Default::default()
            };
            crate::render::source_annotations(&as_dv, &mut anns);
            if !anns.contains_key(ann::IMPORT_SOURCE) {
                anns.insert(ann::IMPORT_SOURCE.into(), "none".into());
            }
        }
    }
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(prime_name(target)),
            namespace: target.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (label::APP.to_string(), label::APP_VALUE.to_string()),
                (
                    label::EXCLUDE_FROM_VELERO_BACKUP.to_string(),
                    "true".to_string(),
                ),
            ])),
            annotations: Some(anns),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "PersistentVolumeClaim".into(),
                name: target.metadata.name.clone().unwrap_or_default(),
                uid: target.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: spec.access_modes,
            resources: spec.resources,
            storage_class_name: spec.storage_class_name,
            volume_mode: spec.volume_mode,
            ..Default::default()
        }),
        status: None,
    }
}

/// The target's annotations after mirroring PVC prime's (added, changed, or removed when PVC
/// prime dropped them), with the prime's name and `progress` ("100.0%" once its pod succeeded;
/// a reading of 100 before that is held back, as the image may still be converting).
pub fn mirrored(
    target: &PersistentVolumeClaim,
    prime: &PersistentVolumeClaim,
    progress: Option<&str>,
) -> BTreeMap<String, String> {
    let mut out = annotations(target);
    let from = annotations(prime);
    for key in MIRRORED {
        match from.get(key) {
            Some(v) => {
                out.insert(key.into(), v.clone());
            }
            None => {
                out.remove(key);
            }
        }
    }
    out.insert(
        ann::PVC_PRIME_NAME.into(),
        prime.metadata.name.clone().unwrap_or_default(),
    );
    let succeeded = from.get(ann::POD_PHASE).map(String::as_str) == Some("Succeeded");
    let prime_bound = prime.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if succeeded {
        out.insert(ann::POPULATOR_PROGRESS.into(), "100.0%".into());
    } else if let Some(p) = progress.filter(|p| !p.starts_with("100")) {
        out.insert(ann::POPULATOR_PROGRESS.into(), p.into());
    } else if prime_bound && !out.contains_key(ann::POPULATOR_PROGRESS) {
        out.insert(ann::POPULATOR_PROGRESS.into(), "N/A".into());
    }
    out
}

/// The labels PVC prime's import gave it (a registry image's `*_KUBEVIRT_IO_*` environment)
/// that the target lacks, once the import succeeded: the labels PVC prime was made with are
/// its own, not the image's.
pub fn mirrored_labels(
    target: &PersistentVolumeClaim,
    prime: &PersistentVolumeClaim,
) -> BTreeMap<String, String> {
    let done = annotations(prime).get(ann::POD_PHASE).map(String::as_str) == Some("Succeeded");
    if !done {
        return BTreeMap::new();
    }
    let own = [label::APP, label::EXCLUDE_FROM_VELERO_BACKUP];
    let from_import: BTreeMap<String, String> = prime
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !own.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let current = target.metadata.labels.clone().unwrap_or_default();
    crate::import::labels_to_add(&current, &from_import)
}

/// Hand the volume over: PVC prime's import succeeded and the target is not bound yet.
pub fn should_rebind(target: &PersistentVolumeClaim, prime: &PersistentVolumeClaim) -> bool {
    let done = annotations(prime).get(ann::POD_PHASE).map(String::as_str) == Some("Succeeded");
    let target_bound = target
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty());
    done && !target_bound
        && prime
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_some()
}

/// PVC prime may go: it lost its volume to the target (unless kept for debugging).
pub fn delete_prime(prime: &PersistentVolumeClaim) -> bool {
    prime.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost")
        && annotations(prime)
            .get(ann::POD_RETAIN_AFTER_COMPLETION)
            .map(String::as_str)
            != Some("true")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn target(anns: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "disk", "namespace": "vms", "uid": "t-uid",
            "annotations": anns},
            "spec": {"storageClassName": "csi", "accessModes": ["ReadWriteOnce"], "volumeMode": "Block",
                "resources": {"requests": {"storage": "10Gi"}},
                "dataSourceRef": {"apiGroup": "cdi.kubevirt.io", "kind": "VolumeImportSource", "name": "volume-import-source-1"}},
            "status": {"phase": "Pending"}}))
        .unwrap()
    }

    fn class(mode: &str, provisioner: &str) -> StorageClass {
        serde_json::from_value(
            json!({"metadata": {"name": "csi"}, "provisioner": provisioner,
            "volumeBindingMode": mode}),
        )
        .unwrap()
    }

    #[test]
    fn waits_for_the_first_consumer() {
        let wffc = class("WaitForFirstConsumer", "csi.cdi-rs.dev");
        assert_eq!(readiness(&target(json!({})), Some(&wffc)), Readiness::Wait);
        assert_eq!(
            readiness(
                &target(json!({"volume.kubernetes.io/selected-node": "node-2"})),
                Some(&wffc)
            ),
            Readiness::Ready {
                node: Some("node-2".into())
            }
        );
        assert_eq!(
            readiness(
                &target(json!({"cdi.kubevirt.io/storage.bind.immediate.requested": ""})),
                Some(&wffc)
            ),
            Readiness::Ready { node: None }
        );
        let intree = class("Immediate", "kubernetes.io/gce-pd");
        assert!(
            matches!(readiness(&target(json!({})), Some(&intree)), Readiness::Refused(m) if m.contains("in-tree"))
        );
        assert!(
            matches!(readiness(&target(json!({})), None), Readiness::Refused(m) if m.contains("not found"))
        );
        assert_eq!(
            import_source_name(&target(json!({}))),
            Some("volume-import-source-1")
        );
    }

    #[test]
    fn the_images_labels_reach_the_target_once_imported() {
        let mut t = target(json!({}));
        t.metadata.labels = Some(BTreeMap::from([("mine".to_string(), "1".to_string())]));
        let source: VolumeImportSource =
            serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "VolumeImportSource", "metadata": {"name": "volume-import-source-1"},
            "spec": {"source": {"registry": {"url": "docker://r/d:1"}}}}))
            .unwrap();
        let mut p = prime_claim(&t, Source::Import(&source), None, false);
        let labels = p.metadata.labels.get_or_insert_default();
        labels.insert(
            "instancetype.kubevirt.io/default-preference".into(),
            "fedora".into(),
        );
        labels.insert("mine".into(), "2".into());
        assert!(
            mirrored_labels(&t, &p).is_empty(),
            "not before the import ends"
        );
        p.metadata
            .annotations
            .get_or_insert_default()
            .insert(ann::POD_PHASE.into(), "Succeeded".into());
        assert_eq!(
            mirrored_labels(&t, &p),
            BTreeMap::from([(
                "instancetype.kubevirt.io/default-preference".to_string(),
                "fedora".to_string()
            )])
        );
    }

    #[test]
    fn prime_is_the_target_without_its_source() {
        let t = target(json!({"volume.kubernetes.io/selected-node": "node-2",
            "cdi.kubevirt.io/storage.pod.retainAfterCompletion": "true"}));
        let source: VolumeImportSource =
            serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "VolumeImportSource", "metadata": {"name": "volume-import-source-1"},
            "spec": {"source": {"http": {"url": "http://x/d.qcow2", "checksum": "sha256:00"}}}}))
            .unwrap();
        let p = prime_claim(&t, Source::Import(&source), Some("node-2"), false);
        assert_eq!(p.metadata.name.as_deref(), Some("prime-t-uid"));
        let a = p.metadata.annotations.clone().unwrap();
        assert_eq!(a[ann::SELECTED_NODE], "node-2");
        assert_eq!(a[ann::IMPORT_ENDPOINT], "http://x/d.qcow2");
        assert_eq!(a[ann::IMPORT_CHECKSUM], "sha256:00");
        assert_eq!(a[ann::POPULATOR_KIND], "VolumeImportSource");
        assert_eq!(a[ann::POD_RETAIN_AFTER_COMPLETION], "true");
        assert!(a.contains_key(ann::IMMEDIATE_BINDING));
        let spec = p.spec.unwrap();
        assert_eq!(spec.data_source_ref, None);
        assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
        assert_eq!(p.metadata.owner_references.unwrap()[0].uid, "t-uid");
        assert_eq!(
            p.metadata.labels.unwrap()["velero.io/exclude-from-backup"],
            "true"
        );
    }

    #[test]
    fn the_target_mirrors_prime_and_takes_its_volume_when_done() {
        let t = target(json!({"cdi.kubevirt.io/storage.pod.phase": "Pending"}));
        let mut prime: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {"name": "prime-t-uid",
            "annotations": {"cdi.kubevirt.io/storage.pod.phase": "Running", "cdi.kubevirt.io/storage.pod.restarts": "1"}},
            "spec": {"volumeName": "pv-1"}, "status": {"phase": "Bound"}})).unwrap();
        let a = mirrored(&t, &prime, Some("42.00%"));
        assert_eq!(a[ann::POD_PHASE], "Running");
        assert_eq!(a[ann::POD_RESTARTS], "1");
        assert_eq!(a[ann::POPULATOR_PROGRESS], "42.00%");
        assert_eq!(a[ann::PVC_PRIME_NAME], "prime-t-uid");
        // 100 is held back until the pod succeeded.
        assert_eq!(
            mirrored(&t, &prime, Some("100.00%"))[ann::POPULATOR_PROGRESS],
            "N/A"
        );
        assert!(!should_rebind(&t, &prime));
        prime
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ann::POD_PHASE.into(), "Succeeded".into());
        assert_eq!(
            mirrored(&t, &prime, None)[ann::POPULATOR_PROGRESS],
            "100.0%"
        );
        assert!(should_rebind(&t, &prime));
        assert!(!delete_prime(&prime));
        prime.status.as_mut().unwrap().phase = Some("Lost".into());
        assert!(delete_prime(&prime));
    }
}
