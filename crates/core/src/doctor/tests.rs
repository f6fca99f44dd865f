//! The doctor's causes, each from the scene that shows it, in the order they are looked for.

use super::*;
use serde_json::{Value, json};

/// The stuck cases of the issue tracker (sources, restarts, refusals, long messages).
mod stuck;

fn of<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// A DataVolume `disk` in `vms` on class `local-path-wffc` with `status`.
fn dv(annotations: Value, status: Value) -> DataVolume {
    of(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "disk", "namespace": "vms", "uid": "dv-uid",
                     "annotations": annotations},
        "spec": {"source": {"http": {"url": "http://h/d.qcow2"}},
                 "pvc": {"storageClassName": "local-path-wffc",
                         "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}},
        "status": status,
    }))
}

fn status(phase: &str, running: (&str, &str, &str)) -> Value {
    json!({"phase": phase, "progress": "N/A", "conditions": [
        {"type": "Running", "status": running.0, "reason": running.1, "message": running.2},
    ]})
}

fn claim(phase: &str, annotations: Value) -> PersistentVolumeClaim {
    of(json!({
        "metadata": {"name": "disk", "namespace": "vms", "uid": "claim-uid",
                     "annotations": annotations},
        "spec": {"storageClassName": "local-path-wffc", "volumeName": "pv-1"},
        "status": {"phase": phase},
    }))
}

fn class(name: &str, mode: &str, default: bool) -> StorageClass {
    let anns = if default {
        json!({"storageclass.kubernetes.io/is-default-class": "true"})
    } else {
        json!({})
    };
    of(json!({"metadata": {"name": name, "annotations": anns},
              "provisioner": "rancher.io/local-path", "volumeBindingMode": mode}))
}

fn pod(name: &str, cdi: bool, spec: Value, status: Value) -> Pod {
    let labels = if cdi {
        json!({"app": "containerized-data-importer"})
    } else {
        json!({})
    };
    let mut spec = spec;
    spec["containers"] = json!([{"name": "c"}]);
    spec["volumes"] = json!([{"name": "v", "persistentVolumeClaim": {"claimName": "disk"}}]);
    of(
        json!({"metadata": {"name": name, "namespace": "vms", "labels": labels},
              "spec": spec, "status": status}),
    )
}

fn unschedulable_status(message: &str) -> Value {
    json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
           "reason": "Unschedulable", "message": message}]})
}

fn tainted_node() -> Node {
    of(
        json!({"metadata": {"name": "node-2", "labels": {"kubernetes.io/hostname": "node-2"}},
              "spec": {"taints": [{"key": "virt-local", "value": "true",
                                   "effect": "NoSchedule"}]}}),
    )
}

fn config(gates: Value, annotations: Value) -> CDIConfig {
    of(
        json!({"metadata": {"name": "config", "annotations": annotations},
              "spec": {"featureGates": gates}}),
    )
}

struct World {
    dv: DataVolume,
    claims: Vec<PersistentVolumeClaim>,
    classes: Vec<StorageClass>,
    profiles: Vec<StorageProfile>,
    config: CDIConfig,
    pods: Vec<Pod>,
    nodes: Vec<Node>,
    events: Vec<Event>,
    data_sources: Vec<DataSource>,
}

impl World {
    fn new(dv: DataVolume) -> World {
        World {
            dv,
            claims: vec![],
            classes: vec![
                class("local-path-wffc", "WaitForFirstConsumer", false),
                class("local-path", "WaitForFirstConsumer", true),
            ],
            profiles: vec![],
            config: config(json!(["HonorWaitForFirstConsumer"]), json!({})),
            pods: vec![],
            nodes: vec![tainted_node()],
            events: vec![],
            data_sources: vec![],
        }
    }

    fn diagnose(&self) -> Diagnosis {
        diagnose(&Scene {
            dv: &self.dv,
            claims: &self.claims,
            volumes: &[],
            classes: &self.classes,
            profiles: &self.profiles,
            config: Some(&self.config),
            cdi: None,
            pods: &self.pods,
            nodes: &self.nodes,
            events: &self.events,
            data_sources: &self.data_sources,
        })
    }
}

#[test]
fn a_failed_data_volume_is_final_and_says_why() {
    let w = World::new(dv(
        json!({}),
        status("Failed", ("False", "Error", "checksum mismatch: sha256 …")),
    ));
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::Failed);
    assert_eq!(d.summary, "failed for good: checksum mismatch: sha256 …");
    assert!(
        d.explanation.contains("kubectl delete dv -n vms disk"),
        "{d:?}"
    );
}

#[test]
fn a_succeeded_data_volume_is_fine_while_its_consumers_fit() {
    let mut w = World::new(dv(
        json!({}),
        status("Succeeded", ("False", "Completed", "")),
    ));
    w.claims = vec![claim(
        "Bound",
        json!({"volume.kubernetes.io/selected-node": "node-1"}),
    )];
    w.pods = vec![pod("vm", false, json!({}), json!({"phase": "Running"}))];
    assert_eq!(w.diagnose().cause, Cause::Succeeded);
}

#[test]
fn a_consumer_kept_off_the_volumes_node_names_why_the_volume_is_there() {
    let blocked = pod(
        "virt-launcher-vm",
        false,
        json!({"nodeSelector": {"kubernetes.io/hostname": "node-3"}}),
        unschedulable_status(
            "0/3 nodes are available: 1 node(s) had volume node affinity conflict",
        ),
    );
    // Immediate binding on a WaitForFirstConsumer class.
    let mut w = World::new(dv(
        json!({"cdi.kubevirt.io/storage.bind.immediate.requested": "true"}),
        status("Succeeded", ("False", "Completed", "")),
    ));
    w.claims = vec![claim(
        "Bound",
        json!({"volume.kubernetes.io/selected-node": "node-1",
               "cdi.kubevirt.io/storage.bind.immediate.requested": "true"}),
    )];
    w.pods = vec![blocked.clone()];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::ImmediateBind);
    assert_eq!(
        d.summary,
        "pod virt-launcher-vm using claim disk cannot be scheduled where the volume is (node-1)"
    );
    assert!(
        d.explanation.contains("volume node affinity conflict"),
        "{d:?}"
    );
    assert!(d.explanation.contains("--force-bind"), "{d:?}");

    // The gate off.
    let mut w = World::new(dv(
        json!({}),
        status("Succeeded", ("False", "Completed", "")),
    ));
    w.claims = vec![claim(
        "Bound",
        json!({"volume.kubernetes.io/selected-node": "node-1"}),
    )];
    w.config = config(json!([]), json!({}));
    w.pods = vec![blocked.clone()];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::GateOff);
    assert!(d.explanation.contains("HonorWaitForFirstConsumer"), "{d:?}");

    // Neither: the volume is where it is, and the pod must go there.
    w.config = config(json!(["HonorWaitForFirstConsumer"]), json!({}));
    assert_eq!(w.diagnose().cause, Cause::ConsumerBlocked);
}

#[test]
fn no_class_and_no_default_is_named() {
    let mut d = dv(json!({}), status("Pending", ("False", "", "")));
    d.spec.pvc.as_mut().unwrap().storage_class_name = None;
    let mut w = World::new(d);
    w.classes = vec![class("local-path", "WaitForFirstConsumer", false)];
    let found = w.diagnose();
    assert_eq!(found.cause, Cause::NoDefaultStorageClass);
    assert!(
        found
            .explanation
            .contains("storageclass.kubernetes.io/is-default-class"),
        "{found:?}"
    );
    // With a default class, something else.
    w.classes = vec![class("local-path", "WaitForFirstConsumer", true)];
    assert_ne!(w.diagnose().cause, Cause::NoDefaultStorageClass);
}

#[test]
fn a_profile_without_claim_property_sets_is_named_with_its_provisioner() {
    let message = "StorageProfile local-path-wffc has no claimPropertySets: set \
                   spec.storage.accessModes in DataVolume vms/disk or fill the profile's \
                   spec.claimPropertySets";
    let w = World::new(dv(
        json!({}),
        status("Pending", ("False", "ErrClaimNotValid", message)),
    ));
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::ProfileWithoutClaimPropertySets);
    assert_eq!(
        d.summary,
        "StorageProfile local-path-wffc has no claimPropertySets"
    );
    assert!(d.explanation.contains("rancher.io/local-path"), "{d:?}");
    assert!(
        d.explanation
            .contains("kubectl patch storageprofile local-path-wffc")
    );
}

#[test]
fn a_provisioner_failing_is_quoted_from_its_event() {
    let mut w = World::new(dv(
        json!({}),
        status("ImportScheduled", ("False", "Pending", "")),
    ));
    w.claims = vec![claim("Pending", json!({}))];
    w.events = vec![of(json!({
        "metadata": {"name": "e1", "namespace": "vms"},
        "involvedObject": {"kind": "PersistentVolumeClaim", "name": "disk"},
        "reason": "ProvisioningFailed", "type": "Warning",
        "message": "storageclass.storage.k8s.io \"gone\" not found",
    }))];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::ProvisioningFailed);
    assert!(d.summary.contains("\"gone\" not found"), "{d:?}");
}

#[test]
fn a_quota_refusal_names_the_quota_and_the_requirements() {
    let mut w = World::new(dv(
        json!({}),
        status(
            "ImportScheduled",
            (
                "False",
                "ErrCreatingPod",
                "the importer pod importer-disk for claim vms/disk was refused: pods \"importer-disk\" \
         is forbidden: exceeded quota: small, requested: requests.cpu=1, used: \
         requests.cpu=0, limited: requests.cpu=100m; check …",
            ),
        ),
    ));
    w.claims = vec![claim("Bound", json!({}))];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::Quota);
    assert!(d.explanation.contains("limited: requests.cpu=100m"));
    assert!(d.explanation.contains("podResourceRequirements"));
}

#[test]
fn a_claim_a_quota_refuses_is_read_from_the_data_volumes_event() {
    let mut w = World::new(dv(json!({}), status("Pending", ("False", "", ""))));
    w.events = vec![of(json!({
        "metadata": {"name": "e1", "namespace": "vms"},
        "involvedObject": {"kind": "DataVolume", "name": "disk"},
        "reason": "ErrExceededQuota", "type": "Warning",
        "message": "persistentvolumeclaims \"disk\" is forbidden: exceeded quota: storage, \
                    requested: requests.storage=1Gi, used: requests.storage=0, limited: \
                    requests.storage=100Mi",
    }))];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::Quota);
    assert!(
        d.explanation.contains("limited: requests.storage=100Mi"),
        "{d:?}"
    );
}

#[test]
fn a_refused_worker_pod_quotes_the_api_server() {
    let mut w = World::new(dv(
        json!({}),
        status("ImportScheduled", ("False", "Pending", "")),
    ));
    w.claims = vec![claim(
        "Bound",
        json!({
            "cdi.kubevirt.io/storage.condition.running.reason": "ErrCreatingPod",
            "cdi.kubevirt.io/storage.condition.running.message":
                "the importer pod importer-disk for claim vms/disk was refused: Pod \"importer-disk\" is invalid: spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit",
        }),
    )];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::WorkerRefused);
    assert!(
        d.summary
            .contains("must be less than or equal to cpu limit"),
        "{d:?}"
    );
}

#[test]
fn a_missing_or_unready_source_is_waited_for() {
    for reason in [
        "CloneWithoutSource",
        "SnapshotNotReady",
        "DataSourceNotReady",
    ] {
        let w = World::new(dv(
            json!({}),
            status(
                "Pending",
                (
                    "False",
                    reason,
                    "The source pvc golden/fedora doesn't exist",
                ),
            ),
        ));
        let d = w.diagnose();
        assert_eq!(d.cause, Cause::SourceNotReady, "{reason}");
        assert!(d.summary.contains("golden/fedora"));
    }
}

#[test]
fn an_unschedulable_worker_names_the_taint_and_both_fixes() {
    let bound = json!({"volume.kubernetes.io/selected-node": "node-2"});
    let worker = pod(
        "importer-disk",
        true,
        json!({}),
        unschedulable_status(
            "0/3 nodes are available: 1 node(s) had untolerated taint {virt-local: true}",
        ),
    );
    let mut w = World::new(dv(
        json!({"cdi-rs.dev/worker-placement": "cdi"}),
        status("ImportScheduled", ("False", "Unschedulable", "")),
    ));
    let mut opted_out = bound.clone();
    opted_out["cdi-rs.dev/worker-placement"] = json!("cdi");
    w.claims = vec![claim("Bound", opted_out)];
    w.pods = vec![worker.clone()];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::WorkerUnschedulable);
    assert_eq!(
        d.summary,
        "worker pod importer-disk does not tolerate taint virt-local=true:NoSchedule of node \
         node-2, where the claim is"
    );
    assert!(
        d.explanation.contains(
            "kubectl annotate pvc -n vms disk cdi-rs.dev/worker-placement-; kubectl delete \
             pod -n vms importer-disk"
        ),
        "{d:?}"
    );
    assert!(d.explanation.contains(
        r#"kubectl patch cdi cdi --type merge -p '{"spec":{"workload":{"tolerations":[{"key":"virt-local","operator":"Equal","value":"true","effect":"NoSchedule"}]}}}'"#
    ), "{d:?}");

    // Following the consumer (the default), the fix is the consumer's toleration.
    w.dv = dv(
        json!({}),
        status("ImportScheduled", ("False", "Unschedulable", "")),
    );
    w.claims = vec![claim("Bound", bound.clone())];
    let d = w.diagnose();
    assert!(
        d.explanation.contains("give the claim's first consumer"),
        "{d:?}"
    );

    // The cluster opted out.
    w.config = config(
        json!(["HonorWaitForFirstConsumer"]),
        json!({"cdi-rs.dev/worker-placement": "cdi"}),
    );
    let d = w.diagnose();
    assert!(d.explanation.contains("from CDIConfig config"), "{d:?}");

    // A tolerated taint is not blamed; the scheduler's words are.
    let mut tolerant = worker;
    tolerant.spec.as_mut().unwrap().tolerations = Some(vec![of(json!(
        {"key": "virt-local", "operator": "Exists"}
    ))]);
    w.pods = vec![tolerant];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::WorkerUnschedulable);
    assert!(
        d.summary
            .starts_with("worker pod importer-disk cannot be scheduled: 0/3"),
        "{d:?}"
    );
}

#[test]
fn a_crash_loop_quotes_the_last_error() {
    let mut w = World::new(dv(
        json!({}),
        status(
            "ImportInProgress",
            ("False", "Error", "Unable to connect to http data source"),
        ),
    ));
    w.claims = vec![claim("Bound", json!({}))];
    w.pods = vec![pod(
        "importer-disk",
        true,
        json!({}),
        json!({
            "phase": "Running",
            "containerStatuses": [{"name": "importer", "image": "i", "imageID": "", "ready": false,
                "restartCount": 3,
                "lastState": {"terminated": {"exitCode": 1,
                    "message": "Unable to connect to http data source: connection refused"}},
                "state": {"waiting": {"reason": "CrashLoopBackOff"}}}],
        }),
    )];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::CrashLoop);
    assert_eq!(
        d.summary,
        "worker pod importer-disk restarted 3 times: Unable to connect to http data source: \
         connection refused"
    );
}

#[test]
fn without_a_consumer_it_says_what_would_be_one() {
    let mut w = World::new(dv(
        json!({}),
        status("WaitForFirstConsumer", ("False", "", "")),
    ));
    w.claims = vec![claim("Pending", json!({}))];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::WaitingForConsumer);
    assert!(d.explanation.contains("cdi-rs.dev/first-consumer"));
    assert!(d.explanation.contains("local-path-wffc"));

    // A consumer that is scheduled is no problem.
    w.pods = vec![pod("vm", false, json!({}), json!({"phase": "Pending"}))];
    assert_ne!(w.diagnose().cause, Cause::WaitingForConsumer);

    // One that fits nowhere is.
    let mut first = pod(
        "disk-first-consumer",
        true,
        json!({}),
        unschedulable_status(
            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector",
        ),
    );
    first
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(ext::FIRST_CONSUMER_FOR.into(), "disk".into());
    w.pods = vec![first];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::ConsumerUnschedulable);
    assert!(
        d.explanation.contains("cdi-rs.dev/first-consumer template"),
        "{d:?}"
    );

    // A template that is no template.
    w.pods = vec![];
    w.dv = dv(
        json!({"cdi-rs.dev/first-consumer": "[1, 2]"}),
        status("WaitForFirstConsumer", ("False", "", "")),
    );
    assert_eq!(w.diagnose().cause, Cause::FirstConsumerTemplate);
}

#[test]
fn uploads_clones_and_progress() {
    let mut w = World::new(dv(
        json!({}),
        status("UploadReady", ("True", "Pod is running", "")),
    ));
    w.claims = vec![claim("Bound", json!({}))];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::UploadWaiting);
    assert!(
        d.explanation
            .contains("cdi image-upload dv disk -n vms --no-create")
    );

    w.dv = dv(json!({}), status("CloneInProgress", ("True", "", "")));
    w.claims = vec![claim(
        "Bound",
        json!({"cdi.kubevirt.io/cloneFallbackReason":
        "no VolumeSnapshotClass for the driver"}),
    )];
    assert_eq!(w.diagnose().cause, Cause::CloneFallback);

    w.claims = vec![claim("Bound", json!({}))];
    let d = w.diagnose();
    assert_eq!(d.cause, Cause::Progressing);
    assert_eq!(d.summary, "CloneInProgress, progress N/A");
}

#[test]
fn whatever_the_status_holds_the_doctor_answers() {
    let mut d: DataVolume = of(json!({
        "metadata": {"name": "odd", "namespace": "vms"},
        "spec": {},
        "status": {"phase": "SomethingNew", "conditions": [
            {"type": "Running", "status": "Unknown", "reason": "Whatever", "message": "?"}]},
    }));
    let w = World::new(d.clone());
    let found = w.diagnose();
    assert_eq!(found.cause, Cause::Pending);
    assert!(
        found.explanation.contains("Running=Unknown Whatever ?"),
        "{found:?}"
    );
    d.status = None;
    let w = World::new(d);
    assert!(
        w.diagnose()
            .explanation
            .contains("is the CDI controller running?")
    );
}
