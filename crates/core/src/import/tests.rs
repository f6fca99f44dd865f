//! The import decisions, case by case: which claims get a pod and when, the pod, scratch space,
//! refusals, and what the pod's state writes back onto the claim.

#[test]
fn insecure_registries_name_registry_and_archive_hosts() {
    let insecure = ["files:8080".to_string(), "reg:5000".to_string()];
    for (endpoint, want) in [
        ("docker://reg:5000/disk:v1", true),
        ("docker://other/disk:v1", false),
        ("oci-archive://files:8080/disk.tar", true),
        ("oci-archive:http://files:8080/disk.tar", true),
        ("oci-archive:https://other/disk.tar", false),
        ("oci-archive:/files:8080/disk.tar", false),
        ("http://files:8080/disk.img", false),
    ] {
        assert_eq!(
            super::pod::insecure_registry(endpoint, &insecure),
            want,
            "{endpoint}"
        );
    }
}

use std::collections::BTreeMap;

use super::*;
use cdi_api::ann;
use cdi_api::config::CDIConfig;
use k8s_openapi::api::core::v1::{LocalObjectReference, PersistentVolumeClaim, Pod};
use serde_json::json;

fn claim(anns: serde_json::Value, phase: &str) -> PersistentVolumeClaim {
    serde_json::from_value(
        json!({"metadata": {"name": "disk", "namespace": "vms", "uid": "pvc-uid",
        "annotations": anns,
        "ownerReferences": [{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "name": "disk", "uid": "dv-uid", "controller": true}]},
        "spec": {"resources": {"requests": {"storage": "10Gi"}}, "storageClassName": "local"},
        "status": {"phase": phase}}),
    )
    .unwrap()
}

#[test]
fn image_labels_are_added_never_overwritten_and_only_when_valid() {
    let current = BTreeMap::from([(
        "instancetype.kubevirt.io/default-instancetype".to_string(),
        "mine".to_string(),
    )]);
    let from_pod: BTreeMap<String, String> = [
        ("instancetype.kubevirt.io/default-instancetype", "u1.small"),
        ("instancetype.kubevirt.io/default-preference", "fedora"),
        ("kubevirt.io/test-test", ""),
        ("bad key.kubevirt.io/x", "v"),
        ("Upper.io/x", "v"),
        ("instancetype.kubevirt.io/long", &"x".repeat(64)),
        ("instancetype.kubevirt.io/spaced", "a b"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let added = labels_to_add(&current, &from_pod);
    assert_eq!(
        added.keys().collect::<Vec<_>>(),
        [
            "instancetype.kubevirt.io/default-preference",
            "kubevirt.io/test-test"
        ]
    );
}

#[test]
fn a_refused_pod_is_said_on_the_claim_until_a_pod_exists() {
    let c = claim(json!({}), "Bound");
    let (anns, reason, message) =
        refused_pod(&c, "importer-disk", "spec.containers[0]: Invalid value");
    assert_eq!(
        message,
        "the worker pod importer-disk for claim vms/disk was refused: \
         spec.containers[0]: Invalid value; check CDIConfig spec.podResourceRequirements and \
         the CDI resource's spec.workload"
    );
    assert_eq!(reason, ERR_CREATING_POD);
    assert_eq!(
        anns.get(ann::RUNNING_CONDITION_REASON).unwrap(),
        ERR_CREATING_POD
    );
    assert_eq!(anns[ann::POD_SCHEDULABLE], "true");
    let (quota, reason, message) = refused_pod(
        &c,
        "importer-disk",
        "pods \"importer-disk\" is forbidden: exceeded quota: small, requested: pods=1, \
         used: pods=1, limited: pods=1",
    );
    assert_eq!(reason, ERR_EXCEEDED_QUOTA);
    assert!(message.ends_with("raise the ResourceQuota of namespace vms or lower CDIConfig spec.podResourceRequirements"), "{message}");
    let refused = claim(serde_json::to_value(&quota).unwrap(), "Bound");
    assert_eq!(refusal_over(&refused).len(), 3);
    assert!(refusal_over(&c).is_empty());
    let refused = claim(serde_json::to_value(&anns).unwrap(), "Bound");
    let over = refusal_over(&refused);
    assert_eq!(over.len(), 3);
    assert!(over.values().all(Option::is_none));
    // Another reason on the Running condition is the pod's own: kept.
    let running = claim(
        json!({(ann::RUNNING_CONDITION): "false", (ann::RUNNING_CONDITION_REASON): "Error"}),
        "Bound",
    );
    assert!(refusal_over(&running).is_empty());
}

#[test]
fn only_the_claims_own_importer_is_read() {
    let c = claim(json!({}), "Bound");
    let pod = |owner: &str, controller: bool| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "importer-disk",
            "ownerReferences": [{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "name": "disk", "uid": owner, "controller": controller}]},
            "status": {"phase": "Pending"}}))
        .unwrap()
    };
    assert_eq!(
        foreign_pod(&c, "importer-disk", &pod("pvc-uid", true)),
        None
    );
    // Owned but not controlled, or someone else's: not ours, with the way out.
    for p in [pod("pvc-uid", false), pod("other", true)] {
        let m = foreign_pod(&c, "importer-disk", &p).unwrap();
        assert!(m.contains("the import starts once that pod is gone"), "{m}");
    }
    let m = foreign_pod(&c, "victim", &pod("other", true)).unwrap();
    assert!(m.contains("remove the annotation"), "{m}");
}

#[test]
fn scratch_is_made_while_the_importer_waits_for_it() {
    let pending: Pod = serde_json::from_value(json!({"metadata": {"name": "importer-disk"},
            "status": {"phase": "Pending"}}))
    .unwrap();
    let asked = claim(json!({(ann::REQUIRES_SCRATCH): "true"}), "Bound");
    assert!(wants_scratch(&asked, &pending));
    assert!(!wants_scratch(&claim(json!({}), "Bound"), &pending));
    let mut running = pending.clone();
    running.status.as_mut().unwrap().phase = Some("Running".into());
    assert!(!wants_scratch(&asked, &running));
    let before = annotations(&claim(json!({}), "Bound"));
    let after = annotations(&asked);
    assert!(scratch_just_requested(&before, &after));
    assert!(!scratch_just_requested(&after, &after));
}

#[test]
fn annotation_patches_carry_only_changes() {
    let pairs = |p: &[(&str, &str)]| -> BTreeMap<String, String> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let current = pairs(&[("a", "1"), ("b", "2"), ("user", "x")]);
    let wanted = pairs(&[("a", "1"), ("b", "3"), ("c", "4")]);
    let some = |v: &str| Some(v.to_string());
    let kept = annotation_patch(&current, &wanted, false);
    assert_eq!(
        kept,
        [("b".to_string(), some("3")), ("c".to_string(), some("4"))].into()
    );
    let mirrored = annotation_patch(&current, &wanted, true);
    assert_eq!(mirrored.get("user"), Some(&None));
    assert_eq!(mirrored.len(), 3);
    assert!(annotation_patch(&current, &current, true).is_empty());
}

#[test]
fn settings_follow_the_claims_class_and_mode() {
    let cfg: CDIConfig = serde_json::from_value(json!({"metadata": {"name": "config"},
        "spec": {}, "status": {"filesystemOverhead": {"global": "0.06",
            "storageClass": {"local": "0.1"}}, "preallocation": true,
            "scratchSpaceStorageClass": "scratch",
            "imagePullSecrets": [{"name": "worker-pull"}, {"name": ""}]}}))
    .unwrap();
    let worker = Worker {
        image: "importer".into(),
        pull_policy: "Always".into(),
        verbosity: 3,
    };
    let fs = claim(json!({}), "Bound");
    let s = Settings::for_claim(&worker, Some(&cfg), &fs, None);
    assert_eq!(s.filesystem_overhead, "0.1");
    let pull: Vec<&str> = s
        .image_pull_secrets
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(pull, ["worker-pull"], "an empty name is no secret");
    assert!(s.preallocation);
    assert_eq!((s.image.as_str(), s.verbosity), ("importer", 3));
    // A block device has no filesystem to leave room for.
    let mut block = fs.clone();
    block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    let s = Settings::for_claim(&worker, Some(&cfg), &block, None);
    assert_eq!(s.filesystem_overhead, "0");
}

#[test]
fn no_pod_before_the_first_consumer() {
    let c = claim(
        json!({"cdi.kubevirt.io/storage.import.endpoint": "http://x"}),
        "Pending",
    );
    assert_eq!(next(&c, true), Next::WaitForConsumer);
    assert_eq!(next(&c, false), Next::CreatePod);
    let immediate = claim(
        json!({"cdi.kubevirt.io/storage.import.endpoint": "http://x",
        "cdi.kubevirt.io/storage.bind.immediate.requested": ""}),
        "Pending",
    );
    assert_eq!(next(&immediate, true), Next::CreatePod);
    let bound = claim(
        json!({"cdi.kubevirt.io/storage.import.endpoint": "http://x"}),
        "Bound",
    );
    assert_eq!(next(&bound, true), Next::CreatePod);
    let done = claim(
        json!({"cdi.kubevirt.io/storage.import.endpoint": "http://x",
        "cdi.kubevirt.io/storage.pod.phase": "Succeeded"}),
        "Bound",
    );
    assert_eq!(next(&done, true), Next::Nothing);
    let fatal = claim(
        json!({"cdi.kubevirt.io/storage.import.endpoint": "http://x",
        "cdi.kubevirt.io/storage.import.fatalError": "true"}),
        "Bound",
    );
    assert_eq!(next(&fatal, true), Next::Nothing);
    assert_eq!(next(&claim(json!({}), "Bound"), true), Next::Nothing);
}

#[test]
fn the_importer_pod() {
    let c = claim(
        json!({"cdi.kubevirt.io/storage.import.endpoint": "http://x/d.qcow2",
        "cdi.kubevirt.io/storage.import.source": "http",
        "cdi.kubevirt.io/storage.import.secretName": "creds",
        "cdi.kubevirt.io/storage.import.certConfigMap": "ca",
        "cdi.kubevirt.io/storage.import.extraHeaders.0": "X-A: 1",
        "cdi.kubevirt.io/storage.import.extraHeaders.1": "X-B: 2",
        "cdi.kubevirt.io/storage.import.checksum": "sha256:00",
        "cdi.kubevirt.io/storage.pod.priorityclassname": "high"}),
        "Bound",
    );
    let s = Settings {
        image: "quay.io/kubevirt/cdi-importer:v1".into(),
        pull_policy: "IfNotPresent".into(),
        verbosity: 1,
        filesystem_overhead: "0.06".into(),
        ..Default::default()
    };
    let pod = importer_pod(&c, &s);
    assert_eq!(pod.metadata.name.as_deref(), Some("importer-disk"));
    assert_eq!(pod.spec.as_ref().unwrap().tolerations, None);
    let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("PersistentVolumeClaim", "pvc-uid", Some(true))
    );
    let spec = pod.spec.unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("OnFailure"));
    assert_eq!(spec.priority_class_name.as_deref(), Some("high"));
    let c0 = &spec.containers[0];
    let envs: BTreeMap<String, Option<String>> = c0
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.value))
        .collect();
    assert_eq!(
        envs["IMPORTER_ENDPOINT"].as_deref(),
        Some("http://x/d.qcow2")
    );
    assert_eq!(envs["IMPORTER_IMAGE_SIZE"].as_deref(), Some("10Gi"));
    assert_eq!(envs["OWNER_UID"].as_deref(), Some("dv-uid"));
    assert_eq!(envs["IMPORTER_CERT_DIR"].as_deref(), Some("/certs"));
    assert_eq!(envs["IMPORTER_EXTRA_HEADER_1"].as_deref(), Some("X-B: 2"));
    assert_eq!(envs["IMPORTER_ACCESS_KEY_ID"], None, "from the secret");
    assert_eq!(envs["PREALLOCATION"].as_deref(), Some("false"));
    let mounts: Vec<&str> = c0
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(mounts, ["/data", "/certs"]);
    assert_eq!(
        c0.termination_message_policy.as_deref(),
        Some("FallbackToLogsOnError")
    );

    // A GCS key is the Secret mounted as a file, as upstream mounts it.
    let mut gcs = c.clone();
    let anns = gcs.metadata.annotations.as_mut().unwrap();
    anns.insert(ann::IMPORT_SOURCE.into(), "gcs".into());
    anns.insert(ann::IMPORT_ENDPOINT.into(), "gs://images/d.qcow2".into());
    let pod = importer_pod(&gcs, &s);
    let spec = pod.spec.unwrap();
    let c0 = &spec.containers[0];
    let envs: BTreeMap<&str, Option<&str>> = c0
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| (e.name.as_str(), e.value.as_deref()))
        .collect();
    assert_eq!(
        envs["GOOGLE_APPLICATION_CREDENTIALS"],
        Some("/google/credentials.json")
    );
    assert!(!envs.contains_key("IMPORTER_ACCESS_KEY_ID"));
    let mounts: Vec<&str> = c0
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(mounts, ["/data", "/certs", "/google"]);
    let vol = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "cdi-secret-vol")
        .unwrap();
    assert_eq!(
        vol.secret.as_ref().unwrap().secret_name.as_deref(),
        Some("creds")
    );

    // CDIConfig's imagePullSecrets reach every worker pod.
    let pulling = Settings {
        image_pull_secrets: vec![LocalObjectReference {
            name: "worker-pull".into(),
        }],
        ..s.clone()
    };
    let spec = importer_pod(&c, &pulling).spec.unwrap();
    assert_eq!(spec.image_pull_secrets.unwrap()[0].name, "worker-pull");
    assert_eq!(importer_pod(&c, &s).spec.unwrap().image_pull_secrets, None);

    let placed = Settings {
        placement: Some(
            serde_json::from_value(json!({"nodeSelector": {"a": "b"},
            "tolerations": [{"key": "virt-local", "operator": "Exists"}]}))
            .unwrap(),
        ),
        ..s.clone()
    };
    let spec = importer_pod(&c, &placed).spec.unwrap();
    assert_eq!(spec.node_selector.unwrap()["a"], "b");
    assert_eq!(
        spec.tolerations.unwrap()[0].key.as_deref(),
        Some("virt-local")
    );

    // The first consumer's recorded tolerations join the workload's (docs/design.md#worker-pods-follow-the-first-consumer).
    let record = json!({"consumer": "virt-launcher-tmp", "node": "node-2",
        "tolerations": [{"key": "virt-local", "operator": "Exists"},
            {"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}]})
    .to_string();
    let mut inheriting = c.clone();
    inheriting
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(cdi_api::ext::WORKER_TOLERATIONS.into(), record);
    let worker = Worker::default();
    let workload = placed.placement.clone();
    let spec = importer_pod(
        &inheriting,
        &Settings::for_claim(&worker, None, &inheriting, workload),
    )
    .spec
    .unwrap();
    let keys: Vec<_> = spec
        .tolerations
        .unwrap()
        .into_iter()
        .filter_map(|t| t.key)
        .collect();
    assert_eq!(keys, ["virt-local", "gpu"]);

    let mut block = c.clone();
    block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    let spec = importer_pod(&block, &s).spec.unwrap();
    let c0 = &spec.containers[0];
    assert_eq!(
        c0.volume_devices.as_ref().unwrap()[0].device_path,
        "/dev/cdi-block-volume"
    );
}

#[test]
fn scratch_space_when_asked() {
    let c = claim(
        json!({"cdi.kubevirt.io/storage.import.endpoint": "http://x",
        "cdi.kubevirt.io/storage.import.requiresScratch": "true",
        "volume.kubernetes.io/selected-node": "node-2"}),
        "Bound",
    );
    let s = Settings {
        image: "i".into(),
        ..Default::default()
    };
    let spec = importer_pod(&c, &s).spec.unwrap();
    let mounts: Vec<&str> = spec.containers[0]
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(mounts, ["/data", "/scratch"]);
    let mut p = importer_pod(&c, &s);
    p.metadata.uid = Some("pod-uid".into());
    let overhead: crate::Overhead = "0.06".parse().unwrap();
    let sc = scratch_claim(&c, &p, Some("fast"), overhead, overhead);
    assert_eq!(sc.metadata.name.as_deref(), Some("disk-scratch"));
    // 10Gi claim → 9.43 GiB usable → inflated by 6% again, rounded up to a MiB.
    let usable = crate::size::usable_space(10 << 30, overhead);
    let want = crate::size::required_space(usable, overhead)
        .and_then(|s| crate::size::round_up(s, crate::MIB))
        .unwrap();
    assert_eq!(
        sc.spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["storage"]
            .0,
        want.to_string()
    );
    assert_eq!(
        sc.metadata.owner_references.as_ref().unwrap()[0].uid,
        "pod-uid"
    );
    assert_eq!(
        sc.metadata.annotations.as_ref().unwrap()["volume.kubernetes.io/selected-node"],
        "node-2"
    );
    assert_eq!(
        sc.metadata.labels.as_ref().unwrap()["velero.io/exclude-from-backup"],
        "true"
    );
}

fn pod(status: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "importer-disk"}, "status": status}))
        .unwrap()
}

#[test]
fn pod_states_become_annotations() {
    let mut anns = BTreeMap::new();
    let running = pod(
        json!({"phase": "Running", "containerStatuses": [{"name": "importer", "image": "i",
        "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]}),
    );
    update_from_pod(&mut anns, &running);
    assert_eq!(anns[ann::RUNNING_CONDITION], "true");
    assert_eq!(anns[ann::POD_PHASE], "Running");
    assert_eq!(anns[ann::IMPORT_POD_NAME], "importer-disk");

    // Between restarts, the last failure explains.
    let crashing = pod(
        json!({"phase": "Running", "containerStatuses": [{"name": "importer", "image": "i",
        "imageID": "", "ready": false, "restartCount": 2,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
            "message": "Unable to connect to http data source: HTTP 404\n"}}}]}),
    );
    let out = update_from_pod(&mut anns, &crashing);
    assert_eq!(anns[ann::RUNNING_CONDITION], "false");
    assert_eq!(
        anns[ann::RUNNING_CONDITION_MESSAGE],
        "Unable to connect to http data source: HTTP 404"
    );
    assert_eq!(anns[ann::RUNNING_CONDITION_REASON], "Error");
    assert_eq!(anns[ann::POD_RESTARTS], "2");
    assert!(out.failed.is_some() && !out.fatal);

    let done = pod(
        json!({"phase": "Succeeded", "containerStatuses": [{"name": "importer", "image": "i",
        "imageID": "", "ready": false, "restartCount": 2,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed",
            "message": "{\"message\":\"Import Complete\",\"preallocationApplied\":false}"}}}]}),
    );
    let out = update_from_pod(&mut anns, &done);
    assert!(out.complete);
    assert_eq!(anns[ann::RUNNING_CONDITION_MESSAGE], "Import Complete");
    assert_eq!(anns[ann::RUNNING_CONDITION_REASON], "Completed");
    assert_eq!(anns[ann::POD_PHASE], "Succeeded");

    let mut anns = BTreeMap::new();
    let mismatch = pod(
        json!({"phase": "Succeeded", "containerStatuses": [{"name": "importer", "image": "i",
        "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed",
            "message": "{\"message\":\"Unable to process data: checksum mismatch: expected sha256 0 got 1\"}"}}}]}),
    );
    // Without a reason (upstream's importer), the text is not read for one.
    let out = update_from_pod(&mut anns, &mismatch);
    assert!(!out.fatal);
    let mismatch = pod(
        json!({"phase": "Succeeded", "containerStatuses": [{"name": "importer", "image": "i",
        "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed",
            "message": "{\"message\":\"Unable to process data: checksum mismatch\",\"reason\":\"ChecksumMismatch\"}"}}}]}),
    );
    let mut anns = BTreeMap::new();
    let out = update_from_pod(&mut anns, &mismatch);
    assert!(out.fatal && !out.complete);
    assert_eq!(anns[ann::POD_PHASE], "Failed");
    assert_eq!(anns[ann::IMPORT_FATAL_ERROR], "true");
    assert_eq!(anns[ann::RUNNING_CONDITION_REASON], "ChecksumError");
    let refused = pod(
        json!({"phase": "Succeeded", "containerStatuses": [{"name": "importer", "image": "i",
        "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed",
            "message": "{\"message\":\"Unable to process data: invalid qcow2 image: backing file\",\"reason\":\"ImageRefused\"}"}}}]}),
    );
    let mut anns = BTreeMap::new();
    let out = update_from_pod(&mut anns, &refused);
    assert!(out.fatal && !out.complete);
    assert_eq!(
        (
            anns[ann::RUNNING_CONDITION_REASON].as_str(),
            anns[ann::RUNNING_CONDITION_MESSAGE].as_str()
        ),
        (
            "ImageRefused",
            "Unable to process data: invalid qcow2 image: backing file"
        )
    );

    let mut anns = BTreeMap::new();
    let unschedulable = pod(
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
        "reason": "Unschedulable"}]}),
    );
    update_from_pod(&mut anns, &unschedulable);
    assert_eq!(anns[ann::POD_SCHEDULABLE], "false");

    let mut anns = BTreeMap::new();
    let small = pod(
        json!({"phase": "Running", "containerStatuses": [{"name": "importer", "image": "i",
        "imageID": "", "ready": false, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
            "message": "{\"message\":\"Unable to process data: writing disk.img: No space left on device (os error 28)\",\"reason\":\"NoSpace\"}"}}}]}),
    );
    let out = update_from_pod(&mut anns, &small);
    assert_eq!(
        anns[ann::RUNNING_CONDITION_MESSAGE],
        "DataVolume too small to contain image: Unable to process data: writing disk.img: No space left on device (os error 28)"
    );
    assert!(!out.fatal);
}

#[test]
fn a_killed_importer_is_explained() {
    let killed = |state: serde_json::Value| {
        pod(
            json!({"phase": "Running", "containerStatuses": [{"name": "importer", "image": "i",
            "imageID": "", "ready": false, "restartCount": 1,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": state}}]}),
        )
    };
    let mut anns = BTreeMap::new();
    let out = update_from_pod(
        &mut anns,
        &killed(json!({"exitCode": 137, "reason": "Error"})),
    );
    let said = "the importer was killed by signal 9 (SIGKILL); it restarts and resumes";
    assert_eq!(anns[ann::RUNNING_CONDITION_MESSAGE], said);
    assert_eq!(out.failed.as_deref(), Some(said));
    // The log's tail (FallbackToLogsOnError) does not hide the kill.
    update_from_pod(
        &mut anns,
        &killed(json!({"exitCode": 143, "reason": "Error", "message": "progress 40%"})),
    );
    assert_eq!(
        anns[ann::RUNNING_CONDITION_MESSAGE],
        "the importer was killed by signal 15 (SIGTERM); it restarts and resumes"
    );
    let out = update_from_pod(
        &mut anns,
        &killed(json!({"exitCode": 137, "reason": "OOMKilled"})),
    );
    assert!(out.failed.unwrap().contains("memory limit (OOMKilled)"));
    let out = update_from_pod(
        &mut anns,
        &killed(json!({"exitCode": 2, "reason": "Error"})),
    );
    assert_eq!(
        out.failed.as_deref(),
        Some(
            "the importer exited with code 2 without a message; it restarts and resumes; see its log"
        )
    );
    // Hostile states explain without panicking.
    for state in [
        json!({"exitCode": -1}),
        json!({"exitCode": i32::MAX, "signal": -3}),
        json!({"exitCode": 128}),
    ] {
        let out = update_from_pod(&mut anns, &killed(state));
        assert!(!out.failed.unwrap_or_default().is_empty());
    }
}
