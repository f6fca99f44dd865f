//! The DataVolume decision, row by row: new claims on each path, clones and snapshots, adoption,
//! what a Pending claim waits for, first-consumer pods, finalizers and polling.

use super::bound::with_annotations;
use super::*;
use crate::source::Refusal;
use cdi_api::ann;
use cdi_api::config::CDIConfig;
use cdi_api::storageprofile::StorageProfile;
use k8s_openapi::api::core::v1::{Event as ClaimEvent, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

fn dv(source: Value, annotations: Value) -> DataVolume {
    let mut spec = json!({"storage": {"accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "local"}});
    if source.is_null() {
        spec["storage"]["dataSourceRef"] =
            json!({"apiGroup": "example.com", "kind": "Blob", "name": "b"});
    } else {
        spec["source"] = source;
    }
    serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume", "metadata": {"name": "disk", "namespace": "vms",
        "uid": "dv-uid", "annotations": annotations}, "spec": spec}))
    .unwrap()
}

fn http() -> Value {
    json!({"http": {"url": "http://images.local/disk.qcow2"}})
}

fn class(binding: &str) -> StorageClass {
    serde_json::from_value(json!({"metadata": {"name": "local"},
        "provisioner": "csi.cdi-rs.dev", "volumeBindingMode": binding}))
    .unwrap()
}

fn claim(phase: &str, owner: Option<&str>, anns: Value) -> PersistentVolumeClaim {
    let owners: Vec<Value> = owner
        .map(|uid| {
            json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "name": "disk", "uid": uid, "controller": true})
        })
        .into_iter()
        .collect();
    serde_json::from_value(json!({"metadata": {"name": "disk", "namespace": "vms",
        "uid": "claim-uid", "ownerReferences": owners, "annotations": anns},
        "spec": {"storageClassName": "local"}, "status": {"phase": phase}}))
    .unwrap()
}

fn config(gates: &[&str]) -> CDIConfig {
    serde_json::from_value(json!({"metadata": {"name": "config"},
        "spec": {"featureGates": gates}}))
    .unwrap()
}

/// The observed world of one row.
struct World {
    classes: Vec<StorageClass>,
    profiles: Vec<StorageProfile>,
    drivers: Vec<String>,
    config: CDIConfig,
    events: Vec<ClaimEvent>,
    leftovers: Vec<Leftover>,
}

impl World {
    fn new(binding: &str, csi: bool) -> World {
        let profile = serde_json::from_value(json!({"metadata": {"name": "local"},
            "spec": {}, "status": {"claimPropertySets": [
                {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}]}}))
        .unwrap();
        World {
            classes: vec![class(binding)],
            profiles: vec![profile],
            drivers: if csi {
                vec!["csi.cdi-rs.dev".into()]
            } else {
                Vec::new()
            },
            config: config(&["HonorWaitForFirstConsumer"]),
            events: Vec::new(),
            leftovers: Vec::new(),
        }
    }

    fn decide(&self, dv: &DataVolume, claim: Option<&PersistentVolumeClaim>) -> Plan {
        self.decide_with(dv, claim, None)
    }

    fn decide_with(
        &self,
        dv: &DataVolume,
        claim: Option<&PersistentVolumeClaim>,
        first_consumer: Option<&Pod>,
    ) -> Plan {
        self.decide_from_snapshot(dv, claim, first_consumer, None)
    }

    /// With the VolumeSnapshot a snapshot clone names (taken by the world's driver).
    fn decide_from_snapshot(
        &self,
        dv: &DataVolume,
        claim: Option<&PersistentVolumeClaim>,
        first_consumer: Option<&Pod>,
        snapshot: Option<&Value>,
    ) -> Plan {
        decide(&Snapshot {
            dv,
            claim,
            prime: None,
            classes: &self.classes,
            profiles: &self.profiles,
            csi_drivers: &self.drivers,
            config: Some(&self.config),
            claim_events: &self.events,
            progress: None,
            first_consumer,
            clone_source: None,
            source_ref_refusal: None,
            clone_refusal: None,
            clone_snapshot: snapshot,
            clone_snapshot_driver: Some("csi.cdi-rs.dev"),
            leftovers: &self.leftovers,
            worker_image: "cdi-importer",
            now: "2026-12-01T12:00:00Z".parse().unwrap(),
        })
    }
}

fn phase(plan: &Plan) -> &str {
    plan.status
        .as_ref()
        .and_then(|s| s.status.phase.as_ref())
        .map(|p| p.as_str())
        .unwrap_or("")
}

fn reasons(plan: &Plan) -> Vec<&str> {
    let status_events = plan.status.iter().flat_map(|s| s.events.iter());
    plan.events
        .iter()
        .chain(status_events)
        .map(|e| e.reason.as_str())
        .collect()
}

#[test]
fn a_snapshot_clone_waits_for_a_ready_snapshot_then_is_restored_or_copied() {
    let decide = |world: &World, d: &DataVolume, snapshot: Option<&Value>| {
        world.decide_from_snapshot(d, None, None, snapshot)
    };
    let csi = World::new("Immediate", true);
    let mut d = dv(
        json!({"snapshot": {"namespace": "", "name": "snap"}}),
        json!({}),
    );
    d.spec.storage.as_mut().unwrap().resources = None;
    let missing = decide(&csi, &d, None);
    assert_eq!(phase(&missing), "Pending");
    assert!(reasons(&missing).contains(&"CloneWithoutSource"));
    assert!(!missing.creates());
    let unready = json!({"status": {"readyToUse": false}});
    let waiting = decide(&csi, &d, Some(&unready));
    assert!(reasons(&waiting).contains(&"SnapshotNotReady"));
    assert!(!waiting.creates());
    let ready = json!({"status": {"readyToUse": true, "restoreSize": "1Gi"}});
    let plan = decide(&csi, &d, Some(&ready));
    let ClaimStep::Create(claim) = &plan.claim else {
        panic!("the claim is made: {plan:?}");
    };
    let spec = claim.spec.as_ref().unwrap();
    assert_eq!(
        spec.data_source_ref.as_ref().unwrap().kind,
        "VolumeCloneSource"
    );
    let asked = crate::quantity::Quantity::try_from(
        &spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"],
    )
    .unwrap()
    .value();
    assert!(asked >= 1 << 30, "sized from the restore size: {asked}");
    let Some(Companion::CloneSource(vcs)) = plan.create.first() else {
        panic!("a VolumeCloneSource: {plan:?}");
    };
    assert_eq!(vcs.spec.source.kind, "VolumeSnapshot");
    assert_eq!(vcs.spec.source.name, "snap");
    // No CSI driver object for the class: no populator. The snapshot is restored into a
    // claim of a class of its driver, which the DataVolume's claim copies.
    let plain = World::new("Immediate", false);
    let plan = decide(&plain, &d, Some(&ready));
    let Some(Companion::RestoreClaim(restore)) = plan.create.first() else {
        panic!("a claim to restore into: {plan:?}");
    };
    assert_eq!(
        restore.metadata.name.as_deref(),
        Some("dv-uid-host-assisted-source-pvc")
    );
    let spec = restore.spec.as_ref().unwrap();
    assert_eq!(spec.storage_class_name.as_deref(), Some("local"));
    assert_eq!(spec.data_source.as_ref().unwrap().name, "snap");
    let ClaimStep::Create(claim) = &plan.claim else {
        panic!("the claim is made: {plan:?}");
    };
    assert_eq!(
        claim.metadata.annotations.as_ref().unwrap()[ann::CLONE_REQUEST],
        "vms/dv-uid-host-assisted-source-pvc"
    );
}

/// What a clone makes in another namespace cannot be owned by the DataVolume: it holds
/// its finalizer from before that is made until it is deleted (once succeeded, or when the
/// DataVolume is deleted first).
#[test]
fn a_clone_from_another_namespace_holds_the_finalizer_until_its_objects_there_are_gone() {
    let mut world = World::new("Immediate", true);
    let ready = json!({"status": {"readyToUse": true, "restoreSize": "1Gi"}});
    let across = dv(
        json!({"snapshot": {"namespace": "golden", "name": "snap"}}),
        json!({}),
    );
    let plan = world.decide_from_snapshot(&across, None, None, Some(&ready));
    let [Companion::CloneSource(vcs)] = plan.create.as_slice() else {
        panic!("{plan:?}")
    };
    assert_eq!(vcs.metadata.namespace.as_deref(), Some("golden"));
    assert_eq!(plan.finalizer, Some(true));
    // In its own namespace the DataVolume owns what it makes: no finalizer.
    let same = dv(
        json!({"snapshot": {"namespace": "", "name": "snap"}}),
        json!({}),
    );
    let plan = world.decide_from_snapshot(&same, None, None, Some(&ready));
    assert!(plan.creates());
    assert_eq!(plan.finalizer, None);
    // Off the populator path the restored claim is made there: the same.
    let plain = World::new("Immediate", false);
    let plan = plain.decide_from_snapshot(&across, None, None, Some(&ready));
    assert!(matches!(
        plan.create.as_slice(),
        [Companion::RestoreClaim(c)] if c.metadata.namespace.as_deref() == Some("golden")
    ));
    assert_eq!(plan.finalizer, Some(true));

    let vcs = Leftover::CloneSource {
        namespace: "golden".into(),
        name: "volume-clone-source-dv-uid".into(),
    };
    let restored = Leftover::RestoreClaim {
        namespace: "golden".into(),
        name: "dv-uid-host-assisted-source-pvc".into(),
    };
    let mut held = across.clone();
    held.metadata.finalizers = Some(vec![cdi_api::finalizer::DATA_VOLUME.into()]);
    // Deleted before it finished: what it made elsewhere goes, then the finalizer.
    let mut deleting = held.clone();
    deleting.metadata.deletion_timestamp = Some(Time("2026-12-01T12:00:00Z".parse().unwrap()));
    world.leftovers = vec![vcs.clone(), restored.clone()];
    let plan = world.decide_from_snapshot(&deleting, None, None, Some(&ready));
    assert_eq!(plan.delete, world.leftovers);
    assert_eq!(plan.finalizer, Some(false));
    assert!(!plan.creates());
    // Without the finalizer a deleted DataVolume is nothing to do.
    deleting.metadata.finalizers = None;
    assert_eq!(
        world.decide_from_snapshot(&deleting, None, None, Some(&ready)),
        Plan::idle()
    );
    // Succeeded: the same.
    let mut target = claim("Bound", Some("dv-uid"), json!({}));
    target.spec.as_mut().unwrap().data_source_ref = Some(
        serde_json::from_value(json!({"apiGroup": "cdi.kubevirt.io",
            "kind": "VolumeCloneSource", "name": "volume-clone-source-dv-uid",
            "namespace": "golden"}))
        .unwrap(),
    );
    let mut done = held.clone();
    done.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
    world.leftovers = vec![vcs.clone()];
    let plan = world.decide_from_snapshot(&done, Some(&target), None, Some(&ready));
    assert_eq!(plan.delete, vec![vcs]);
    assert_eq!(plan.finalizer, Some(false));
    // While it runs, the finalizer stays.
    let mut running = held.clone();
    running.status = Some(serde_json::from_value(json!({"phase": "CloneInProgress"})).unwrap());
    let plan = world.decide_from_snapshot(&running, Some(&target), None, Some(&ready));
    assert_eq!(plan.finalizer, None);
    assert!(plan.delete.is_empty());
}

#[test]
fn made_for_names_the_data_volume_by_owner_or_by_annotation_and_uid() {
    let d = dv(http(), json!({}));
    let meta = |v: Value| -> ObjectMeta { serde_json::from_value(v).unwrap() };
    let owned = meta(
        json!({"ownerReferences": [{"apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume", "name": "disk", "uid": "dv-uid"}]}),
    );
    assert!(made_for(&d, &owned));
    let named = meta(json!({"annotations": {(ann::OWNED_BY_DATA_VOLUME): "vms/disk"}}));
    assert!(made_for(&d, &named));
    // A DataVolume of the same name made later is not the one it was made for.
    let earlier = meta(
        json!({"annotations": {(ann::OWNED_BY_DATA_VOLUME): "vms/disk",
        (ann::OWNER_UID): "old-uid"}}),
    );
    assert!(!made_for(&d, &earlier));
    let other = meta(json!({"annotations": {(ann::OWNED_BY_DATA_VOLUME): "other/disk"}}));
    assert!(!made_for(&d, &other));
}

#[test]
fn a_clone_waits_for_its_source_sizes_from_it_and_says_its_phases() {
    let world = World::new("Immediate", false);
    let mut d = dv(
        json!({"pvc": {"namespace": "vms", "name": "fedora"}}),
        json!({}),
    );
    d.spec.storage.as_mut().unwrap().resources = None;
    let mut across = d.clone();
    across
        .spec
        .source
        .as_mut()
        .unwrap()
        .pvc
        .as_mut()
        .unwrap()
        .namespace = "golden".into();
    // What the controller finds of a clone from another namespace with no token.
    let not_authorized = Refusal {
        reason: "CloneNotAuthorized",
        message: "no clone token".into(),
    };
    let decide = |d: &DataVolume, claim: Option<&PersistentVolumeClaim>, source| {
        let from = clone_source_of(d).unwrap().0;
        decide(&Snapshot {
            dv: d,
            claim,
            prime: None,
            classes: &world.classes,
            profiles: &world.profiles,
            csi_drivers: &world.drivers,
            config: Some(&world.config),
            claim_events: &world.events,
            progress: None,
            first_consumer: None,
            clone_source: source,
            source_ref_refusal: None,
            clone_refusal: (from == "golden").then_some(&not_authorized),
            clone_snapshot: None,
            clone_snapshot_driver: None,
            leftovers: &[],
            worker_image: "cdi-importer",
            now: "2026-12-01T12:00:00Z".parse().unwrap(),
        })
    };
    // From another namespace: refused before anything is made or read (no clone token).
    let refused = decide(&across, None, None);
    assert_eq!(phase(&refused), "Pending");
    assert!(
        reasons(&refused).contains(&"CloneNotAuthorized"),
        "{refused:?}"
    );
    assert!(!refused.creates());

    let waiting = decide(&d, None, None);
    assert_eq!(phase(&waiting), "Pending");
    assert!(
        reasons(&waiting).contains(&"CloneWithoutSource"),
        "{waiting:?}"
    );
    assert!(!waiting.creates());

    let source: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "fedora", "namespace": "vms"},
        "spec": {"resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound", "capacity": {"storage": "2Gi"}}}))
    .unwrap();
    let plan = decide(&d, None, Some(&source));
    let ClaimStep::Create(made) = &plan.claim else {
        panic!("{plan:?}")
    };
    // Not a CSI class: the host-assisted copy onto the claim itself, holding what the
    // source's capacity holds for a disk image: with the overhead on top again, no larger
    // than the source (clones of clones do not grow).
    assert_eq!(
        made.metadata.annotations.as_ref().unwrap()[ann::CLONE_REQUEST],
        "vms/fedora"
    );
    let request = &made
        .spec
        .as_ref()
        .unwrap()
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()["storage"];
    let bytes = crate::quantity::Quantity::try_from(request)
        .unwrap()
        .value();
    assert!(
        bytes <= 2 << 30 && bytes > (2 << 30) - (2 << 20),
        "{request:?}"
    );
    assert!(plan.create.is_empty());

    let with = |anns: Value| {
        let mut c = claim("Bound", Some("dv-uid"), anns);
        c.metadata
            .annotations
            .get_or_insert_default()
            .insert(ann::CLONE_REQUEST.into(), "vms/fedora".into());
        c
    };
    for (pod, want, event) in [
        (json!({}), "CloneScheduled", Some("CloneScheduled")),
        (
            json!({"cdi.kubevirt.io/storage.pod.phase": "Running"}),
            "CloneInProgress",
            Some("CloneInProgress"),
        ),
        (
            json!({"cdi.kubevirt.io/storage.pod.phase": "Succeeded"}),
            "CloneInProgress",
            None,
        ),
        (
            json!({"cdi.kubevirt.io/storage.pod.phase": "Succeeded", "k8s.io/CloneOf": "true"}),
            "Succeeded",
            Some("CloneSucceeded"),
        ),
    ] {
        let plan = decide(&d, Some(&with(pod)), Some(&source));
        assert_eq!(phase(&plan), want);
        if let Some(e) = event {
            assert!(reasons(&plan).contains(&e), "{want}: {:?}", reasons(&plan));
        }
    }
    let done = decide(
        &d,
        Some(&with(
            json!({"cdi.kubevirt.io/storage.pod.phase": "Succeeded", "k8s.io/CloneOf": "true"}),
        )),
        Some(&source),
    );
    let message = done
        .status
        .unwrap()
        .events
        .into_iter()
        .find(|e| e.reason == "CloneSucceeded")
        .unwrap()
        .message;
    assert_eq!(message, "Successfully cloned from vms/fedora into vms/disk");
    // The source deleted before the copy read it: the phase stays, and Running says the
    // clone waits for it (its event once); once copied, a deleted source is no concern.
    let gone = decide(
        &d,
        Some(&with(
            json!({"cdi.kubevirt.io/storage.pod.phase": "Running"}),
        )),
        None,
    );
    assert_eq!(phase(&gone), "CloneInProgress");
    let running = gone
        .status
        .as_ref()
        .and_then(|s| s.status.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_.as_str() == "Running"))
        .unwrap();
    assert_eq!(
        running.reason.as_ref().map(|r| r.as_str()),
        Some("CloneWithoutSource")
    );
    assert!(
        running
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("The source pvc vms/fedora doesn't exist")),
        "{running:?}"
    );
    assert!(reasons(&gone).contains(&"CloneWithoutSource"), "{gone:?}");
    let copied = json!({"cdi.kubevirt.io/storage.pod.phase": "Succeeded",
                        "k8s.io/CloneOf": "true"});
    let done = decide(&d, Some(&with(copied)), None);
    assert_eq!(phase(&done), "Succeeded");
    assert!(!reasons(&done).contains(&"CloneWithoutSource"));

    // Through the populator (a CSI class): a VolumeCloneSource in the source's namespace,
    // and the phases from the claim's clonePhase.
    let csi = World::new("Immediate", true);
    let plan = super::decide(&Snapshot {
        classes: &csi.classes,
        csi_drivers: &csi.drivers,
        ..Snapshot {
            dv: &d,
            claim: None,
            prime: None,
            classes: &world.classes,
            profiles: &world.profiles,
            csi_drivers: &world.drivers,
            config: Some(&world.config),
            claim_events: &world.events,
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
        }
    });
    let [Companion::CloneSource(vcs)] = plan.create.as_slice() else {
        panic!("{plan:?}")
    };
    assert_eq!(vcs.metadata.namespace.as_deref(), Some("vms"));
    assert_eq!(
        vcs.metadata.name.as_deref(),
        Some("volume-clone-source-dv-uid")
    );
    assert_eq!(vcs.spec.source.name, "fedora");
    assert_eq!(
        vcs.metadata.owner_references.as_ref().unwrap()[0].uid,
        "dv-uid"
    );
    let populating = |clone_phase: &str, claim_phase: &str| {
        let mut c = claim(
            claim_phase,
            Some("dv-uid"),
            json!({ann::CLONE_PHASE: clone_phase}),
        );
        c.spec.as_mut().unwrap().data_source_ref =
            Some(k8s_openapi::api::core::v1::TypedObjectReference {
                api_group: Some("cdi.kubevirt.io".into()),
                kind: "VolumeCloneSource".into(),
                name: "volume-clone-source-dv-uid".into(),
                namespace: None,
            });
        phase(&decide(&d, Some(&c), Some(&source))).to_string()
    };
    assert_eq!(populating("Pending", "Pending"), "CloneScheduled");
    assert_eq!(populating("HostClone", "Pending"), "CloneInProgress");
    assert_eq!(populating("Rebind", "Bound"), "RebindInProgress");
    assert_eq!(populating("Succeeded", "Bound"), "Succeeded");
}

#[test]
fn a_new_datavolume_gets_its_claim_on_the_path_its_class_allows() {
    let d = dv(http(), json!({}));
    // No CSI driver: the classic path, no companion.
    let plan = World::new("Immediate", false).decide(&d, None);
    let ClaimStep::Create(c) = &plan.claim else {
        panic!("no claim created: {plan:?}");
    };
    assert_eq!(c.metadata.name.as_deref(), Some("disk"));
    assert!(plan.create.is_empty());
    assert_eq!(
        plan.dv_annotations.get(ann::USE_POPULATOR),
        Some(&Some("false".into()))
    );
    assert_eq!(phase(&plan), "Pending");
    // The new claim's changes wake the controller: no looking again on a timer.
    assert_eq!(plan.requeue, Requeue::OnChange);
    assert!(plan.creates());
    // A CSI driver: the populator path, through a VolumeImportSource made first.
    let plan = World::new("Immediate", true).decide(&d, None);
    let [Companion::ImportSource(source)] = plan.create.as_slice() else {
        panic!("no import source: {plan:?}");
    };
    assert_eq!(
        source.metadata.name.as_deref(),
        Some("volume-import-source-dv-uid")
    );
    assert_eq!(
        plan.dv_annotations.get(ann::USE_POPULATOR),
        Some(&Some("true".into()))
    );
}

#[test]
fn refusals_set_a_phase_and_create_nothing() {
    let world = World::new("Immediate", false);
    let rows = [
        // (source, profile exists, phase, reason)
        (json!({}), true, "Failed", "ErrInvalidSource"),
        (
            json!({"imageio": {"url": "https://engine/api", "diskId": "d"}}),
            true,
            "Pending",
            "ErrUnsupportedSource",
        ),
        (http(), false, "Pending", "ErrClaimNotValid"),
    ];
    for (source, profile_exists, want_phase, want_reason) in rows {
        let d = dv(source.clone(), json!({}));
        let mut w = World::new("Immediate", false);
        if !profile_exists {
            w.profiles.clear();
        }
        let plan = w.decide(&d, None);
        assert_eq!(phase(&plan), want_phase, "{source}");
        assert_eq!(reasons(&plan), vec![want_reason], "{source}");
        assert!(!plan.creates(), "{source}");
        assert_eq!(plan.requeue, Requeue::OnChange);
    }
    // Being deleted: nothing at all.
    let mut d = dv(http(), json!({}));
    d.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    assert_eq!(world.decide(&d, None), Plan::idle());
}

#[test]
fn a_claim_that_is_not_the_datavolumes_is_adopted_only_when_allowed() {
    let world = World::new("Immediate", false);
    let foreign = claim("Bound", None, json!({}));
    let d = dv(http(), json!({}));
    let plan = world.decide(&d, Some(&foreign));
    assert_eq!(phase(&plan), "Pending");
    assert_eq!(reasons(&plan), vec!["ErrResourceExists"]);
    assert_eq!(plan.claim, ClaimStep::Keep);

    let d = dv(http(), json!({(ann::ALLOW_CLAIM_ADOPTION): "true"}));
    let plan = world.decide(&d, Some(&foreign));
    let ClaimStep::Adopt(owners) = &plan.claim else {
        panic!("not adopted: {plan:?}");
    };
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].uid, "dv-uid");
    assert_eq!(
        plan.claim_annotations.get(ann::POPULATED_FOR),
        Some(&Some("disk".into()))
    );
    assert_eq!(phase(&plan), "Succeeded");
    assert!(reasons(&plan).contains(&"Bound"));

    // Someone else's claim on its way out: replaced once gone, looked at again soon.
    let mut leaving = foreign.clone();
    leaving.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    let plan = world.decide(&d, Some(&leaving));
    assert_eq!(reasons(&plan), vec!["ErrClaimBeingDeleted"]);
    assert_eq!(plan.requeue, Requeue::Soon);
}

fn event(message: &str, component: &str, at: &str) -> ClaimEvent {
    serde_json::from_value(json!({"metadata": {"name": format!("e-{at}")},
        "involvedObject": {"name": "disk", "uid": "claim-uid"},
        "source": {"component": component}, "message": message,
        "lastTimestamp": at}))
    .unwrap()
}

#[test]
fn what_a_pending_claim_waits_for_reaches_the_datavolume() {
    let mut world = World::new("WaitForFirstConsumer", false);
    world.events = vec![
        event(
            "waiting for first consumer to be created before binding",
            "persistentvolume-controller",
            "2026-12-01T11:00:00Z",
        ),
        // The controller's own warning is not what binding waits for, newer or not.
        event(
            "the importer pod was refused",
            COMPONENT,
            "2026-12-01T11:30:00Z",
        ),
        // Nor when it was recorded through events.k8s.io (no source, a reporting controller, an
        // event time only).
        serde_json::from_value(json!({"metadata": {"name": "e-recorded"},
            "involvedObject": {"name": "disk", "uid": "claim-uid"},
            "reportingComponent": COMPONENT, "message": "pod refused again",
            "eventTime": "2026-12-01T11:45:00.000000Z"}))
        .unwrap(),
    ];
    let d = dv(http(), json!({}));
    let pending = claim("Pending", Some("dv-uid"), json!({}));
    let plan = world.decide(&d, Some(&pending));
    assert_eq!(
        plan.claim_annotations.get(ann::BOUND_CONDITION_MESSAGE),
        Some(&Some(
            "waiting for first consumer to be created before binding".into()
        ))
    );
    assert_eq!(phase(&plan), "WaitForFirstConsumer");
    // The claim's next events wake the controller (it watches claims' events).
    assert_eq!(plan.requeue, Requeue::OnChange);
    let bound = plan
        .status
        .as_ref()
        .and_then(|s| s.status.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_.as_str() == "Bound"))
        .and_then(|c| c.message.clone());
    assert_eq!(
        bound.as_deref(),
        Some("target PVC disk Pending and waiting for first consumer to be created before binding")
    );
    // Said already: nothing to write. Bound: the annotations go.
    let said = with_annotations(&pending, &plan.claim_annotations);
    assert!(bound_condition(&said, &world.events).is_empty());
    let mut bound = said.clone();
    bound.status.as_mut().unwrap().phase = Some("Bound".into());
    let gone = bound_condition(&bound, &world.events);
    assert_eq!(gone.len(), 3);
    assert!(gone.values().all(Option::is_none));
}

#[test]
fn a_first_consumer_template_gets_a_temporary_pod_until_its_work_is_done() {
    let world = World::new("WaitForFirstConsumer", false);
    let template =
        json!({(cdi_api::ext::FIRST_CONSUMER): "nodeSelector: {kubernetes.io/hostname: node-3}"});
    let d = dv(http(), template.clone());
    let pending = claim("Pending", Some("dv-uid"), json!({}));
    let plan = world.decide(&d, Some(&pending));
    assert_eq!(phase(&plan), "WaitForFirstConsumer");
    let Some(PodStep::Create(pod)) = &plan.first_consumer else {
        panic!("no pod: {plan:?}");
    };
    assert!(plan.creates());
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(
        spec.node_selector.as_ref().unwrap()["kubernetes.io/hostname"],
        "node-3"
    );
    assert_eq!(spec.containers[0].image.as_deref(), Some("cdi-importer"));
    // Without the annotation, or once a consumer chose the node: none.
    let plain = dv(http(), json!({}));
    assert_eq!(world.decide(&plain, Some(&pending)).first_consumer, None);
    let selected = claim(
        "Pending",
        Some("dv-uid"),
        json!({(ann::SELECTED_NODE): "node-3"}),
    );
    assert_eq!(world.decide(&d, Some(&selected)).first_consumer, None);
    // Unschedulable: the scheduler's reason, on the DataVolume.
    let mut waiting = pod.as_ref().clone();
    waiting.status = serde_json::from_value(json!({"phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."}]}))
    .unwrap();
    let plan = world.decide_with(&d, Some(&pending), Some(&waiting));
    assert_eq!(plan.first_consumer, None);
    let event = plan
        .events
        .iter()
        .find(|e| e.reason == crate::first_consumer::UNSCHEDULABLE)
        .expect("the scheduler's reason");
    assert!(
        event.message.contains("0/3 nodes are available"),
        "{}",
        event.message
    );
    assert!(
        event.message.contains("DataVolume vms/disk"),
        "{}",
        event.message
    );
    // Bound, but what worker pods inherit not yet recorded: kept; recorded: deleted.
    let bound = claim(
        "Bound",
        Some("dv-uid"),
        json!({(ann::SELECTED_NODE): "node-3"}),
    );
    let plan = world.decide_with(&d, Some(&bound), Some(&waiting));
    assert_eq!(phase(&plan), "PVCBound");
    assert_eq!(plan.first_consumer, None);
    let recorded = claim(
        "Bound",
        Some("dv-uid"),
        json!({(ann::SELECTED_NODE): "node-3",
            (cdi_api::ext::WORKER_TOLERATIONS): "{\"node\":\"node-3\"}"}),
    );
    assert_eq!(
        world
            .decide_with(&d, Some(&recorded), Some(&waiting))
            .first_consumer,
        Some(PodStep::Delete("disk-first-consumer".into()))
    );
    // An unknown placement: said.
    let odd = dv(
        http(),
        json!({(cdi_api::ext::WORKER_PLACEMENT): "upstream"}),
    );
    let plan = world.decide(&odd, Some(&pending));
    assert!(reasons(&plan).contains(&crate::placement::ERR_PLACEMENT));
    // An invalid template: said, no pod.
    let bad = dv(
        http(),
        json!({(cdi_api::ext::FIRST_CONSUMER): "containers: []"}),
    );
    let plan = world.decide(&bad, Some(&pending));
    assert_eq!(plan.first_consumer, None);
    assert!(reasons(&plan).contains(&crate::first_consumer::ERR_TEMPLATE));
}

#[test]
fn external_population_waits_for_its_populator() {
    let d = dv(Value::Null, json!({}));
    let world = World::new("Immediate", true);
    let plan = world.decide(&d, None);
    let ClaimStep::Create(c) = &plan.claim else {
        panic!("no claim: {plan:?}");
    };
    // The claim keeps the DataVolume's dataSourceRef; no import source.
    let data_source_ref = c.spec.as_ref().and_then(|s| s.data_source_ref.as_ref());
    assert_eq!(data_source_ref.map(|r| r.kind.as_str()), Some("Blob"));
    assert!(plan.create.is_empty());
    let mut pending = claim("Pending", Some("dv-uid"), json!({}));
    pending.spec = c.spec.clone();
    assert_eq!(
        phase(&world.decide(&d, Some(&pending))),
        "PendingPopulation"
    );
    let mut bound = pending.clone();
    bound.status.as_mut().unwrap().phase = Some("Bound".into());
    let plan = world.decide(&d, Some(&bound));
    assert_eq!(phase(&plan), "Succeeded");
    assert!(reasons(&plan).contains(&"ExternalPopulationSucceeded"));
    // Without a CSI driver nothing hands the claim to a populator: said, and waiting.
    let plan = World::new("Immediate", false).decide(&d, Some(&pending));
    assert_eq!(phase(&plan), "Pending");
    assert!(reasons(&plan).contains(&"NoCSIDriverForExternalPopulation"));
}

#[test]
fn the_populators_source_goes_once_the_import_succeeded() {
    let world = World::new("Immediate", true);
    let d = dv(http(), json!({}));
    let mut target = claim(
        "Bound",
        Some("dv-uid"),
        json!({(ann::POD_PHASE): "Succeeded"}),
    );
    target.spec.as_mut().unwrap().data_source_ref = Some(
        serde_json::from_value(json!({"apiGroup": "cdi.kubevirt.io",
            "kind": "VolumeImportSource", "name": "volume-import-source-dv-uid"}))
        .unwrap(),
    );
    let plan = world.decide(&d, Some(&target));
    assert_eq!(phase(&plan), "Succeeded");
    assert_eq!(
        plan.delete,
        vec![Leftover::ImportSource {
            namespace: "vms".into(),
            name: "volume-import-source-dv-uid".into()
        }]
    );
    assert_eq!(plan.requeue, Requeue::OnChange);
    // Once the DataVolume says Succeeded, the source is gone: later passes leave it be.
    let mut done = d.clone();
    done.status = plan.status.map(|c| c.status);
    let plan = world.decide(&done, Some(&target));
    assert_eq!(phase(&plan), "Succeeded");
    assert!(plan.delete.is_empty());
}

/// Progress is polled while the worker runs (it sends no events); a worker waiting to be
/// scheduled is not looked at on a timer (its start changes the claim, which wakes us).
#[test]
fn only_a_running_worker_is_polled() {
    let world = World::new("Immediate", false);
    let d = dv(http(), json!({}));
    for (pod_phase, dv_phase, requeue) in [
        ("Pending", "ImportScheduled", Requeue::OnChange),
        ("Running", "ImportInProgress", Requeue::Soon),
        ("Succeeded", "Succeeded", Requeue::OnChange),
    ] {
        let bound = claim(
            "Bound",
            Some("dv-uid"),
            json!({(ann::POD_PHASE): pod_phase, (ann::IMPORT_POD_NAME): "importer-disk"}),
        );
        let plan = world.decide(&d, Some(&bound));
        assert_eq!(phase(&plan), dv_phase);
        assert_eq!(plan.requeue, requeue, "worker {pod_phase}");
    }
}
