//! A clone that can never run says why on its DataVolume: refused before its claim is made when
//! the claim would not fit the source, and in Running when a controller stops it later.

use cdi_api::datavolume::DataVolume;
use cdi_api::enums::{ConditionStatus, DataVolumeConditionReason as Reason};
use cdi_api::{CDIConfig, StorageProfile};
use cdi_core::datavolume::{Plan, Snapshot, decide};
use cdi_core::dvstatus::{Computed, Observed, clone_status};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::{Value, json};

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// A clone of `vms/golden` onto class `local`, asking for `size` through `spec.storage`.
fn cloning(size: &str, status: Value) -> DataVolume {
    from(
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "disk", "namespace": "vms", "uid": "dv-uid"},
        "spec": {"source": {"pvc": {"namespace": "vms", "name": "golden"}},
            "storage": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": size}}}},
        "status": status}),
    )
}

fn running(c: &Computed) -> (ConditionStatus, Option<Reason>, Option<String>) {
    let conditions = c.status.conditions.as_ref().unwrap();
    let r = conditions
        .iter()
        .find(|c| c.type_.as_str() == "Running")
        .unwrap();
    (r.status, r.reason.clone(), r.message.clone())
}

/// The DataVolume with its claim, of a WaitForFirstConsumer class, HonorWaitForFirstConsumer on.
fn observe<'a>(dv: &'a DataVolume, claim: &'a PersistentVolumeClaim) -> Observed<'a> {
    Observed {
        dv,
        claim: Some(claim),
        class_wffc: true,
        honor_wffc: true,
        populated: false,
        progress: None,
        populator: None,
        now: "2026-12-01T12:00:00Z".parse().unwrap(),
    }
}

#[test]
fn a_clone_too_small_for_its_source_makes_no_claim_and_says_why() {
    let classes: [StorageClass; 1] = [from(json!({"metadata": {"name": "local"},
        "provisioner": "csi.cdi-rs.dev", "volumeBindingMode": "WaitForFirstConsumer"}))];
    let profiles: [StorageProfile; 1] = [from(json!({"metadata": {"name": "local"},
        "spec": {}, "status": {"claimPropertySets": [
            {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}]}}))];
    let config: CDIConfig = from(json!({"metadata": {"name": "config"},
        "spec": {"featureGates": ["HonorWaitForFirstConsumer"]}}));
    let source: PersistentVolumeClaim = from(json!({
        "metadata": {"name": "golden", "namespace": "vms"},
        "spec": {"storageClassName": "local", "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}}));
    let decide_for = |dv: &DataVolume| -> Plan {
        decide(&Snapshot {
            dv,
            claim: None,
            prime: None,
            classes: &classes,
            profiles: &profiles,
            csi_drivers: &[],
            config: Some(&config),
            claim_events: &[],
            progress: None,
            first_consumer: None,
            clone_source: Some(&source),
            source_ref_refusal: None,
            clone_refusal: None,
            clone_snapshot: None,
            clone_snapshot_driver: None,
            leftovers: &[],
            worker_image: "cdi-importer",
            now: "2026-12-01T12:00:00Z".parse().unwrap(),
        })
    };
    let refused = decide_for(&cloning("512Mi", json!({})));
    assert!(!refused.creates(), "{refused:?}");
    let status = refused.status.as_ref().unwrap();
    assert_eq!(status.status.phase.as_ref().unwrap().as_str(), "Pending");
    let (is, reason, message) = running(status);
    assert_eq!(is, ConditionStatus::False);
    assert_eq!(reason, Some(Reason::Other("CloneValidationFailed".into())));
    let message = message.unwrap();
    assert!(
        message.starts_with(
            "The clone doesn't meet the validation requirements: target resources requests \
             storage size is smaller than the source"
        ),
        "{message}"
    );
    assert!(
        status
            .events
            .iter()
            .any(|e| e.warning && e.reason == "CloneValidationFailed"),
        "{:?}",
        status.events
    );
    // As large as the source: the claim is made (and waits for its first consumer).
    assert!(decide_for(&cloning("1Gi", json!({}))).creates());
}

#[test]
fn a_clone_that_cannot_run_says_why_in_running() {
    let dv = cloning("1Gi", json!({"phase": "CloneScheduled"}));
    // The clone populator stopped (cloneError): the phase stays, Running says why (reason
    // Error, as upstream's populator writes it).
    let why = "The clone doesn't meet the validation requirements: too small";
    let target: PersistentVolumeClaim = from(json!({
        "metadata": {"name": "disk", "namespace": "vms", "annotations": {
            "volume.kubernetes.io/selected-node": "node-1",
            "cdi.kubevirt.io/clonePhase": "Error", "cdi.kubevirt.io/cloneError": why}},
        "spec": {"dataSourceRef": {"apiGroup": "cdi.kubevirt.io",
            "kind": "VolumeCloneSource", "name": "volume-clone-source-dv-uid"}},
        "status": {"phase": "Pending"}}));
    let stopped = clone_status(&observe(&dv, &target));
    assert_eq!(
        stopped.status.phase.as_ref().unwrap().as_str(),
        "CloneScheduled"
    );
    assert_eq!(
        running(&stopped),
        (
            ConditionStatus::False,
            Some(Reason::Error),
            Some(why.into())
        )
    );
    // The host-assisted copy refused its target: it waits for its first consumer, and Running
    // says what the claim's running condition says, not only an event on the claim.
    let copy: PersistentVolumeClaim = from(json!({
        "metadata": {"name": "disk", "namespace": "vms", "annotations": {
            "k8s.io/CloneRequest": "vms/golden",
            "cdi.kubevirt.io/storage.condition.running": "false",
            "cdi.kubevirt.io/storage.condition.running.reason": "ErrIncompatiblePVC",
            "cdi.kubevirt.io/storage.condition.running.message": "too small"}},
        "status": {"phase": "Pending"}}));
    let waiting = clone_status(&observe(&dv, &copy));
    assert_eq!(
        waiting.status.phase.as_ref().unwrap().as_str(),
        "WaitForFirstConsumer"
    );
    assert_eq!(
        running(&waiting),
        (
            ConditionStatus::False,
            Some(Reason::Other("ErrIncompatiblePVC".into())),
            Some("too small".into())
        )
    );
}
