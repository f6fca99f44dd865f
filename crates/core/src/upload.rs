//! The upload controller's decisions (docs/design.md#the-upload-flow; upstream's PVC-level upload controller): which
//! claims get an upload pod, the pod (`cdi-upload-<claim>`, upstream's name, environment and
//! labels), its Service and certificate Secret, and what the pod's state writes back onto the
//! claim (`storage.pod.phase`, `storage.pod.ready`).

use std::collections::BTreeMap;

use cdi_api::{ann, label};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, HTTPGetAction, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource,
    Pod, Probe, Secret, SecretVolumeSource, Service, ServicePort, ServiceSpec, Volume,
    VolumeDevice, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::{ByteString, jiff::Timestamp};

use crate::import::{self, Next, Outcome, Settings, annotations};

/// The upload pod's name prefix: `cdi-upload-<claim>`.
pub const POD_PREFIX: &str = "cdi-upload";
/// The upload server's container name (also its component label value).
pub const CONTAINER: &str = "cdi-upload-server";
pub const PORT: i32 = 8443;
/// Where the certificate Secret is mounted, and its files.
pub const CERT_VOLUME: &str = "tls-config";
pub const CERT_DIR: &str = "/etc/tls/";
/// The label the upload Service selects its pod by.
pub const SERVICE_LABEL: &str = "service";
/// The client common name the upload server accepts for uploads (the upload proxy's).
pub const CLIENT_NAME: &str = "client.upload-server.cdi.kubevirt.io";
/// Where the upload pod's scratch claim is mounted.
pub const SCRATCH_MOUNT: &str = import::SCRATCH_MOUNT;

fn get<'a>(anns: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    anns.get(key).map(String::as_str)
}

/// Whether the upload controller works on this claim: it is an upload target or a host-assisted
/// clone's target (whose source pod sends it the source), not both, and not populated by
/// someone else.
pub fn is_upload_claim(claim: &PersistentVolumeClaim) -> bool {
    let anns = annotations(claim);
    (anns.contains_key(ann::UPLOAD_REQUEST) != anns.contains_key(ann::CLONE_REQUEST))
        && !anns.contains_key(ann::EXTERNAL_POPULATION)
        && !anns.contains_key(ann::IMPORT_ENDPOINT)
}

/// Upstream's refusal of a claim that is both: an upload target and a clone target; and of one
/// an importer fills (an upload server beside it would be a second writer).
pub fn both_upload_and_clone(claim: &PersistentVolumeClaim) -> Option<String> {
    let anns = annotations(claim);
    if anns.contains_key(ann::UPLOAD_REQUEST) && anns.contains_key(ann::IMPORT_ENDPOINT) {
        return Some(format!(
            "PVC has both import and upload annotations: claim {}/{} is filled by its import; remove {}",
            claim.metadata.namespace.as_deref().unwrap_or(""),
            claim.metadata.name.as_deref().unwrap_or(""),
            ann::UPLOAD_REQUEST
        ));
    }
    (anns.contains_key(ann::UPLOAD_REQUEST) && anns.contains_key(ann::CLONE_REQUEST)).then(|| {
        format!(
            "PVC has both clone and upload annotations: claim {}/{} can be filled by one of {} and {}; remove one",
            claim.metadata.namespace.as_deref().unwrap_or(""),
            claim.metadata.name.as_deref().unwrap_or(""),
            ann::UPLOAD_REQUEST,
            ann::CLONE_REQUEST
        )
    })
}

/// The claim is a host-assisted clone's target.
pub fn is_clone_target(claim: &PersistentVolumeClaim) -> bool {
    annotations(claim).contains_key(ann::CLONE_REQUEST)
}

/// The upload is complete: the upload pod succeeded.
pub fn is_complete(claim: &PersistentVolumeClaim) -> bool {
    import::is_complete(claim)
}

/// The decision for an upload claim without a pod: as for an import (nothing before the claim is
/// bound when WaitForFirstConsumer is honoured).
pub fn next(claim: &PersistentVolumeClaim, gate_on: bool) -> Next {
    import::next_for(claim, gate_on, is_upload_claim(claim))
}

/// The upload pod's name: the one recorded on the claim when it is a valid name, else
/// `cdi-upload-<claim>`, shortened as upstream shortens it.
pub fn pod_name(claim: &PersistentVolumeClaim) -> String {
    match get(&annotations(claim), ann::UPLOAD_POD_NAME) {
        Some(n) if crate::naming::is_object_name(n) => n.to_string(),
        _ => crate::naming::resource_name(POD_PREFIX, claim.metadata.name.as_deref().unwrap_or("")),
    }
}

/// The upload Service's name for the pod (a DNS label: upstream's
/// `GetServiceNameFromResourceName`).
pub fn service_name(pod_name: &str) -> String {
    crate::naming::label_name(pod_name)
}

/// The names the upload server's certificate is valid for: its Service in every form a client
/// in the cluster uses.
pub fn server_names(namespace: &str, service: &str) -> Vec<String> {
    vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// The URL the upload proxy posts `path` to for the upload claim `claim` of `namespace`
/// (upstream's `GetUploadServerURL`).
pub fn server_url(namespace: &str, claim: &str, path: &str) -> String {
    let service = service_name(&crate::naming::resource_name(POD_PREFIX, claim));
    format!("https://{service}.{namespace}.svc:{PORT}{path}")
}

fn component_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (label::APP.into(), label::APP_VALUE.into()),
        (
            label::COMPONENT.into(),
            label::UPLOAD_SERVER_COMPONENT.into(),
        ),
    ])
}

/// The upload pod for `claim` (upstream's `makeUploadPodSpec`): owned by the claim, the
/// certificate Secret (named as the pod) at `/etc/tls/`, the claim at `/data` or as the block
/// device, upstream's environment, a readiness probe on `/healthz`, and `DEADLINE` (RFC 3339)
/// after which an unused server ends. The scratch claim is at `/scratch` only once a server
/// asked for it (upstream gives every upload one; raw and qcow2 stream without).
pub fn upload_pod(claim: &PersistentVolumeClaim, s: &Settings, deadline: Timestamp) -> Pod {
    let anns = annotations(claim);
    let name = pod_name(claim);
    let container = upload_container(claim, s, deadline);
    let volumes = upload_volumes(claim, &name);
    let mut pod_anns = import::worker_pod_annotations(&anns, ann::CREATED_BY_UPLOAD);
    pod_anns.insert(
        "k8s.ovn.org/open-default-ports".into(),
        format!(r#"[{{"protocol":"tcp","port":{PORT}}}]"#),
    );
    let mut labels = component_labels();
    labels.insert(SERVICE_LABEL.into(), service_name(&name));
    labels.insert(
        label::UPLOAD_TARGET.into(),
        claim.metadata.uid.clone().unwrap_or_default(),
    );
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: claim.metadata.namespace.clone(),
            annotations: Some(pod_anns),
            labels: Some(labels),
            owner_references: Some(vec![import::controlled_by(
                "PersistentVolumeClaim",
                &claim.metadata,
            )]),
            ..Default::default()
        },
        spec: Some(import::worker_pod_spec(claim, s, vec![container], volumes)),
        status: None,
    }
}

/// The upload server's environment: its certificates, the overhead and size to write, the
/// client it accepts, preallocation, and its deadline.
fn environment(claim: &PersistentVolumeClaim, s: &Settings, deadline: Timestamp) -> Vec<EnvVar> {
    let anns = annotations(claim);
    let size = claim
        .spec
        .as_ref()
        .and_then(|sp| sp.resources.as_ref()?.requests.as_ref()?.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_default();
    let preallocation = match get(&anns, ann::PREALLOCATION_REQUESTED) {
        Some(v) => v == "true",
        None => s.preallocation,
    };
    vec![
        import::var("TLS_KEY_FILE", format!("{CERT_DIR}tls.key")),
        import::var("TLS_CERT_FILE", format!("{CERT_DIR}tls.crt")),
        import::var("CLIENT_CERT_FILE", format!("{CERT_DIR}ca.crt")),
        import::var(
            cdi_api::env::FILESYSTEM_OVERHEAD,
            s.filesystem_overhead.clone(),
        ),
        import::var("UPLOAD_IMAGE_SIZE", size),
        import::var(
            "CLIENT_NAME",
            get(&anns, ann::UPLOAD_CLIENT_NAME).unwrap_or(CLIENT_NAME),
        ),
        import::var(cdi_api::env::PREALLOCATION, preallocation.to_string()),
        import::var("DEADLINE", deadline.to_string()),
    ]
}

/// The upload server container: the certificates, the claim as the block device (its
/// destination) or at `/data`, scratch space once asked for, the readiness probe.
fn upload_container(claim: &PersistentVolumeClaim, s: &Settings, deadline: Timestamp) -> Container {
    let mut env = environment(claim, s, deadline);
    let block = claim.spec.as_ref().and_then(|sp| sp.volume_mode.as_deref()) == Some("Block");
    let mut mounts = vec![VolumeMount {
        name: CERT_VOLUME.into(),
        mount_path: CERT_DIR.into(),
        ..Default::default()
    }];
    let mut devices = None;
    if block {
        devices = Some(vec![VolumeDevice {
            name: import::DATA_VOLUME_NAME.into(),
            device_path: import::BLOCK_DEVICE.into(),
        }]);
        env.push(import::var("DESTINATION", import::BLOCK_DEVICE));
    } else {
        mounts.push(VolumeMount {
            name: import::DATA_VOLUME_NAME.into(),
            mount_path: import::DATA_MOUNT.into(),
            ..Default::default()
        });
    }
    if wants_scratch(claim) {
        mounts.push(VolumeMount {
            name: import::SCRATCH_VOLUME_NAME.into(),
            mount_path: SCRATCH_MOUNT.into(),
            ..Default::default()
        });
    }
    Container {
        name: CONTAINER.into(),
        image: Some(s.image.clone()),
        image_pull_policy: Some(s.pull_policy.clone()).filter(|p| !p.is_empty()),
        args: Some(vec![format!("-v={}", s.verbosity)]),
        env: Some(env),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz".into()),
                port: IntOrString::Int(PORT),
                scheme: Some("HTTPS".into()),
                ..Default::default()
            }),
            initial_delay_seconds: Some(2),
            period_seconds: Some(5),
            ..Default::default()
        }),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_devices: devices,
        volume_mounts: Some(mounts),
        resources: s.resources.clone(),
        security_context: Some(import::worker_security_context()),
        ..Default::default()
    }
}

/// The pod's volumes: the certificate Secret named as the pod, the claim, and the scratch claim
/// once asked for.
fn upload_volumes(claim: &PersistentVolumeClaim, pod_name: &str) -> Vec<Volume> {
    let claim_volume = |volume: &str, claim: String| Volume {
        name: volume.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim,
            read_only: Some(false),
        }),
        ..Default::default()
    };
    let mut volumes = vec![
        Volume {
            name: CERT_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(pod_name.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        claim_volume(
            import::DATA_VOLUME_NAME,
            claim.metadata.name.clone().unwrap_or_default(),
        ),
    ];
    if wants_scratch(claim) {
        volumes.push(claim_volume(
            import::SCRATCH_VOLUME_NAME,
            import::scratch_name(claim),
        ));
    }
    volumes
}

/// The upload pod's Service (upstream's `makeUploadServiceSpec`): headless, port 8443 to the pod
/// labelled for it, owned by the claim.
pub fn service(claim: &PersistentVolumeClaim, pod_name: &str) -> Service {
    let name = service_name(pod_name);
    Service {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: claim.metadata.namespace.clone(),
            annotations: Some(BTreeMap::from([(
                ann::CREATED_BY_UPLOAD.into(),
                "yes".into(),
            )])),
            labels: Some(component_labels()),
            owner_references: Some(vec![import::controlled_by(
                "PersistentVolumeClaim",
                &claim.metadata,
            )]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            ports: Some(vec![ServicePort {
                protocol: Some("TCP".into()),
                port: PORT,
                target_port: Some(IntOrString::Int(PORT)),
                ..Default::default()
            }]),
            selector: Some(BTreeMap::from([(SERVICE_LABEL.into(), name)])),
            ..Default::default()
        }),
        status: None,
    }
}

/// The upload server's certificate Secret (named as the pod, owned by it): its certificate and
/// key, and the CA its clients' certificates are signed by.
pub fn cert_secret(pod: &Pod, cert_pem: &str, key_pem: &str, client_ca_pem: &str) -> Secret {
    let data = [
        ("tls.crt", cert_pem),
        ("tls.key", key_pem),
        ("ca.crt", client_ca_pem),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            annotations: Some(BTreeMap::from([(
                ann::CREATED_BY_UPLOAD.into(),
                "yes".into(),
            )])),
            labels: Some(component_labels()),
            owner_references: Some(vec![import::controlled_by("Pod", &pod.metadata)]),
            ..Default::default()
        },
        data: Some(data),
        type_: Some("kubernetes.io/tls".into()),
        ..Default::default()
    }
}

/// An upload server asked for scratch space (the image it was sent does not convert as it
/// streams in): the next upload pod has a scratch claim.
pub fn wants_scratch(claim: &PersistentVolumeClaim) -> bool {
    get(&annotations(claim), ann::REQUIRES_SCRATCH) == Some("true")
}

/// Why `pod`, found under the claim's upload pod name, is not its upload pod, if it is not.
pub fn foreign_pod(claim: &PersistentVolumeClaim, pod: &Pod) -> Option<String> {
    let ours = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == claim.metadata.uid.as_ref());
    (!ours).then(|| {
        format!(
            "pod {} is not the upload pod of claim {}/{}; the upload starts once that pod is gone",
            pod.metadata.name.as_deref().unwrap_or(""),
            claim.metadata.namespace.as_deref().unwrap_or(""),
            claim.metadata.name.as_deref().unwrap_or("")
        )
    })
}

/// Upstream's `isPodReady`: every container is ready (and there is one).
pub fn pod_ready(pod: &Pod) -> bool {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or(&[]);
    !statuses.is_empty() && statuses.iter().all(|c| c.ready)
}

/// The server ended because its deadline passed (its termination message says so).
pub fn deadline_passed(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref()?.first())
        .and_then(|c| c.state.as_ref()?.terminated.as_ref()?.message.as_deref())
        .map(cdi_api::TerminationMessage::parse)
        .and_then(|m| m.deadline_passed)
        == Some(true)
}

/// Write the upload pod's state onto the claim's annotations (upstream's upload `reconcilePVC`):
/// the worker's state as for an importer, and whether the server is ready. A server whose
/// deadline passed is no state at all: it is replaced.
pub fn update_from_pod(anns: &mut BTreeMap<String, String>, pod: &Pod) -> Outcome {
    let mut out = import::update_from_worker(anns, pod, ann::UPLOAD_POD_NAME);
    if deadline_passed(pod) {
        anns.insert(ann::POD_PHASE.into(), String::new());
        anns.insert(ann::POD_READY.into(), "false".into());
        out.complete = false;
    } else {
        anns.insert(ann::POD_READY.into(), pod_ready(pod).to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(anns: serde_json::Value, mode: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "disk", "namespace": "vms", "uid": "pvc-uid", "annotations": anns},
            "spec": {"resources": {"requests": {"storage": "10Gi"}}, "volumeMode": mode},
            "status": {"phase": "Bound"}}))
        .unwrap()
    }

    fn env(pod: &Pod) -> BTreeMap<String, String> {
        pod.spec.as_ref().unwrap().containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect()
    }

    fn settings() -> Settings {
        Settings {
            image: "quay.io/kubevirt/cdi-uploadserver:v1".into(),
            filesystem_overhead: "0.06".into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_upload_targets() {
        let target = claim(
            json!({"cdi.kubevirt.io/storage.upload.target": ""}),
            "Filesystem",
        );
        assert!(is_upload_claim(&target));
        assert_eq!(next(&target, true), Next::CreatePod);
        assert!(!is_upload_claim(&claim(json!({}), "Filesystem")));
        assert_eq!(next(&claim(json!({}), "Filesystem"), true), Next::Nothing);
        let external = claim(
            json!({"cdi.kubevirt.io/storage.upload.target": "",
                "cdi.kubevirt.io/externalPopulation": "true"}),
            "Filesystem",
        );
        assert!(!is_upload_claim(&external));
        let clone = claim(json!({"k8s.io/CloneRequest": "src/golden"}), "Filesystem");
        assert!(is_upload_claim(&clone) && is_clone_target(&clone));
        let both = claim(
            json!({"k8s.io/CloneRequest": "src/golden", "cdi.kubevirt.io/storage.upload.target": ""}),
            "Filesystem",
        );
        assert!(!is_upload_claim(&both));
        assert!(
            both_upload_and_clone(&both)
                .unwrap()
                .starts_with("PVC has both clone and upload annotations")
        );
        // An import's claim given the upload annotation (by `image-upload --no-create`): no
        // upload server beside its importer.
        let import = claim(
            json!({"cdi.kubevirt.io/storage.import.endpoint": "http://x/d.img",
                "cdi.kubevirt.io/storage.upload.target": ""}),
            "Filesystem",
        );
        assert!(!is_upload_claim(&import));
        assert!(
            both_upload_and_clone(&import)
                .unwrap()
                .starts_with("PVC has both import and upload annotations")
        );
    }

    #[test]
    fn the_pod_as_upstream_makes_it() {
        let c = claim(
            json!({"cdi.kubevirt.io/storage.upload.target": ""}),
            "Filesystem",
        );
        let deadline: Timestamp = "2026-12-02T12:00:00Z".parse().unwrap();
        let pod = upload_pod(&c, &settings(), deadline);
        assert_eq!(pod.metadata.name.as_deref(), Some("cdi-upload-disk"));
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels["service"], "cdi-upload-disk");
        assert_eq!(labels["cdi.kubevirt.io"], "cdi-upload-server");
        assert_eq!(labels["cdi.kubevirt.io/uploadTarget"], "pvc-uid");
        let e = env(&pod);
        assert_eq!(e["TLS_CERT_FILE"], "/etc/tls/tls.crt");
        assert_eq!(e["CLIENT_CERT_FILE"], "/etc/tls/ca.crt");
        assert_eq!(e["CLIENT_NAME"], CLIENT_NAME);
        assert_eq!(e["UPLOAD_IMAGE_SIZE"], "10Gi");
        assert_eq!(e["FILESYSTEM_OVERHEAD"], "0.06");
        assert_eq!(e["DEADLINE"], "2026-12-02T12:00:00Z");
        assert!(!e.contains_key("DESTINATION"));
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("OnFailure"));
        let mounts: Vec<_> = spec.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(mounts, ["/etc/tls/", "/data"], "no scratch until asked for");
        let asked = claim(
            json!({"cdi.kubevirt.io/storage.upload.target": "",
                "cdi.kubevirt.io/storage.import.requiresScratch": "true"}),
            "Filesystem",
        );
        let spec = upload_pod(&asked, &settings(), deadline).spec.unwrap();
        let scratch = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "cdi-scratch-vol");
        assert_eq!(
            scratch
                .and_then(|v| v.persistent_volume_claim.as_ref())
                .map(|c| c.claim_name.as_str()),
            Some("disk-scratch")
        );
        assert!(
            spec.containers[0]
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path == "/scratch")
        );
        let block = upload_pod(&claim(json!({}), "Block"), &settings(), deadline);
        assert_eq!(env(&block)["DESTINATION"], "/dev/cdi-block-volume");
        assert!(block.spec.unwrap().containers[0].volume_devices.is_some());
    }

    #[test]
    fn service_and_url_agree() {
        let c = claim(json!({}), "Filesystem");
        let svc = service(&c, "cdi-upload-disk");
        assert_eq!(svc.metadata.name.as_deref(), Some("cdi-upload-disk"));
        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.selector.unwrap()["service"], "cdi-upload-disk");
        assert_eq!(
            server_url("vms", "disk", "/v1beta1/upload"),
            "https://cdi-upload-disk.vms.svc:8443/v1beta1/upload"
        );
        // A long claim name: the Service name is a DNS label.
        let long = "d".repeat(100);
        assert!(server_url("vms", &long, "/x").len() < 100);
    }

    #[test]
    fn readiness_and_deadline_reach_the_claim() {
        let pod = |status: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "cdi-upload-disk"},
                "spec": {"containers": [], "restartPolicy": "OnFailure"}, "status": status}))
            .unwrap()
        };
        let running = pod(
            json!({"phase": "Running", "containerStatuses": [{"name": "c",
            "image": "i", "imageID": "", "ready": true, "restartCount": 0,
            "state": {"running": {}}}]}),
        );
        let mut anns = BTreeMap::new();
        update_from_pod(&mut anns, &running);
        assert_eq!(anns[ann::POD_READY], "true");
        assert_eq!(anns[ann::POD_PHASE], "Running");
        assert_eq!(anns[ann::UPLOAD_POD_NAME], "cdi-upload-disk");
        assert!(!anns.contains_key(ann::IMPORT_POD_NAME));
        let late = pod(
            json!({"phase": "Succeeded", "containerStatuses": [{"name": "c",
            "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0,
                "message": "{\"message\":\"Deadline Passed\",\"deadlinePassed\":true}"}}}]}),
        );
        let out = update_from_pod(&mut anns, &late);
        assert_eq!(anns[ann::POD_PHASE], "");
        assert_eq!(anns[ann::POD_READY], "false");
        assert!(!out.complete);
        // A killed server is told as what it is.
        let killed = pod(
            json!({"phase": "Running", "containerStatuses": [{"name": "c",
            "image": "i", "imageID": "", "ready": false, "restartCount": 1,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 137}}}]}),
        );
        let out = update_from_pod(&mut anns, &killed);
        assert_eq!(
            out.failed.as_deref(),
            Some(
                "the upload server was killed by signal 9 (SIGKILL); it restarts for the upload to be sent again"
            )
        );
    }
}
