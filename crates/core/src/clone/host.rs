//! Host-assisted clone, claim by claim (upstream's clone controller and the clone side of its
//! upload controller): a claim annotated `k8s.io/CloneRequest: <ns>/<name>` gets an upload pod
//! like an upload target (whose server takes only the clone's client certificate), and once that
//! server is ready, a source pod in the source's namespace runs `cdi cloner`, which sends the
//! source volume to it. The claim says `k8s.io/CloneOf` when the copy is complete.

use std::collections::BTreeMap;

use cdi_api::{ann, label};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerPort, EnvVar, EnvVarSource, PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource, Pod, PodAffinity, PodAffinityTerm, Secret,
    SecretKeySelector, Volume, VolumeDevice, VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

use crate::import::{self, Settings, annotations, var};

/// The source pod's container (also its component label value).
pub const CONTAINER: &str = "cdi-clone-source";
/// Where a Filesystem source is mounted (read-only) in the source pod.
pub const SOURCE_MOUNT: &str = "/var/run/cdi/clone/source";
/// The label naming each source pod by itself (upstream's spelling).
pub const CLONE_UNIQUE_ID: &str = "cdi.kubevirt.io/storage.clone.cloneUniqeId";
/// The label naming the source claim's UID on its source pods.
pub const SOURCE_CLAIM_UID: &str = "cdi.kubevirt.io/hostAssistedSourcePodCloneSource";
/// Where the upload server takes a clone.
pub const UPLOAD_PATH: &str = "/v1beta1/upload";
/// The clone controllers' event while a pod writes the source (upstream's reason).
pub const CLONE_SOURCE_IN_USE: &str = "CloneSourceInUse";
/// The event of a copy waiting for its source to be filled (a DataVolume's claim before the
/// DataVolume succeeded), and the start of its message (then the source, `ns/name`).
pub const CLONE_SOURCE_NOT_POPULATED: &str = "CloneSourceNotPopulated";
pub const SOURCE_NOT_POPULATED: &str = "waits for its source to be populated: PVC";
/// Upstream's `MessageCloneValidationFailed`: what a clone that `validate` refuses says, before
/// the reason.
pub const VALIDATION_FAILED: &str = "The clone doesn't meet the validation requirements";

fn get<'a>(anns: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    anns.get(key).map(String::as_str)
}

/// The source a claim is to be a copy of: `k8s.io/CloneRequest` as `(namespace, name)`, the
/// claim's namespace when the value names none.
pub fn clone_request(claim: &PersistentVolumeClaim) -> Option<(String, String)> {
    let value = claim
        .metadata
        .annotations
        .as_ref()?
        .get(ann::CLONE_REQUEST)?;
    let own = claim.metadata.namespace.clone().unwrap_or_default();
    match value.split_once('/') {
        Some((ns, name)) if !name.is_empty() && !name.contains('/') => {
            let ns = if ns.is_empty() { own } else { ns.to_string() };
            Some((ns, name.to_string()))
        }
        None if !value.is_empty() => Some((own, value.clone())),
        _ => None,
    }
}

/// The event reason of a clone refused for want of authorization (no valid clone token).
pub const NOT_AUTHORIZED: &str = "CloneNotAuthorized";

/// The class a snapshot taken by `driver` is restored into for a copy: the first by name of
/// that driver's classes (as upstream picks it), if the driver is known and has one.
pub fn restore_class(
    classes: &[k8s_openapi::api::storage::v1::StorageClass],
    driver: &str,
) -> Option<String> {
    let mut names: Vec<&str> = classes
        .iter()
        .filter(|c| !driver.is_empty() && c.provisioner == driver)
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    names.sort_unstable();
    names.first().map(|n| n.to_string())
}

/// How a snapshot's driver is named in messages.
pub fn driver_name(driver: &str) -> &str {
    if driver.is_empty() {
        "(unknown)"
    } else {
        driver
    }
}

/// A claim the VolumeSnapshot `snapshot` (of the claim's namespace) is restored into by `class`
/// (of the snapshot's driver) at `restore_size`, for a host-assisted copy from it: named, placed
/// and annotated as `meta` says, labelled so (see [`restored_for_copy`]).
pub fn restored_claim(
    mut meta: ObjectMeta,
    snapshot: &str,
    class: &str,
    access_modes: Option<Vec<String>>,
    volume_mode: Option<String>,
    restore_size: &str,
) -> PersistentVolumeClaim {
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimSpec, TypedLocalObjectReference, VolumeResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let labels = meta.labels.get_or_insert_default();
    labels.insert(label::APP.into(), label::APP_VALUE.into());
    labels.insert(
        label::COMPONENT.into(),
        label::SNAPSHOT_FALLBACK_COMPONENT.into(),
    );
    PersistentVolumeClaim {
        metadata: meta,
        spec: Some(PersistentVolumeClaimSpec {
            access_modes,
            volume_mode,
            storage_class_name: Some(class.into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(restore_size.into()),
                )])),
                ..Default::default()
            }),
            data_source: Some(TypedLocalObjectReference {
                api_group: Some("snapshot.storage.k8s.io".into()),
                kind: "VolumeSnapshot".into(),
                name: snapshot.into(),
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// The VolumeSnapshot a claim was restored from for a host-assisted copy of it (labelled so by
/// the DataVolume controller or the clone populator), if it is such a claim.
pub fn restored_for_copy(claim: &PersistentVolumeClaim) -> Option<String> {
    let labelled = claim
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(cdi_api::label::COMPONENT))
        .is_some_and(|v| v == cdi_api::label::SNAPSHOT_FALLBACK_COMPONENT);
    let source = claim.spec.as_ref()?.data_source.as_ref()?;
    (labelled && source.kind == "VolumeSnapshot").then(|| source.name.clone())
}

/// The copy is complete (`k8s.io/CloneOf`).
pub fn is_done(claim: &PersistentVolumeClaim) -> bool {
    annotations(claim).contains_key(ann::CLONE_OF)
}

/// The common name the target's upload server takes for this clone (upstream's
/// `<srcNs>/<src>-<ns>/<claim>`): only this clone's source pod holds a certificate for it.
pub fn client_name(source: &(String, String), claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}-{}/{}",
        source.0,
        source.1,
        claim.metadata.namespace.as_deref().unwrap_or(""),
        claim.metadata.name.as_deref().unwrap_or("")
    )
}

/// The source pod's name: `<claim uid>-source-pod`.
pub fn source_pod_name(claim: &PersistentVolumeClaim) -> String {
    format!("{}-source-pod", claim.metadata.uid.as_deref().unwrap_or(""))
}

fn storage_request(claim: &PersistentVolumeClaim) -> Option<i64> {
    let q = claim
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")?;
    crate::quantity::Quantity::try_from(q)
        .ok()
        .map(|q| q.value())
}

fn volume_mode(claim: &PersistentVolumeClaim) -> crate::size::VolumeMode {
    crate::size::resolve_volume_mode(claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()))
}

fn content_type(claim: &PersistentVolumeClaim) -> String {
    match get(&annotations(claim), ann::CONTENT_TYPE) {
        Some(c) if !c.is_empty() => c.to_string(),
        _ => "kubevirt".to_string(),
    }
}

/// Whether the source can be copied into the target (upstream's `validateCloneAndSourcePVC` and
/// `ValidateCanCloneSourceAndTargetSpec`): the same content type; volume modes that differ only
/// for disk images; and unless the target is permissive, room in the target for what the source
/// can hold (each side's usable space after its class's filesystem overhead). The message names
/// both claims and the fix.
pub fn validate(
    source: &PersistentVolumeClaim,
    target: &PersistentVolumeClaim,
    source_overhead: crate::size::Overhead,
    target_overhead: crate::size::Overhead,
) -> Result<(), String> {
    let name = |c: &PersistentVolumeClaim| {
        format!(
            "{}/{}",
            c.metadata.namespace.as_deref().unwrap_or(""),
            c.metadata.name.as_deref().unwrap_or("")
        )
    };
    let (from, to) = (content_type(source), content_type(target));
    if from != to {
        return Err(format!(
            "source contentType ({from}) and target contentType ({to}) do not match: clone {} into a claim of contentType {from}",
            name(source)
        ));
    }
    let (source_mode, target_mode) = (volume_mode(source), volume_mode(target));
    if source_mode != target_mode && from != "kubevirt" {
        return Err(format!(
            "Source and target volume modes do not match, and content type is not kubevirt: {} is {source_mode:?}, {} is {target_mode:?}",
            name(source),
            name(target)
        ));
    }
    if annotations(target).contains_key(ann::PERMISSIVE_CLONE) {
        return Ok(());
    }
    let usable = |c: &PersistentVolumeClaim, overhead| {
        Some(crate::size::image_space(
            volume_mode(c),
            storage_request(c)?,
            overhead,
        ))
    };
    match (
        usable(source, source_overhead),
        usable(target, target_overhead),
    ) {
        (Some(s), Some(t)) if s > t => Err(format!(
            "target resources requests storage size is smaller than the source: {} can hold {t} bytes, {} holds up to {s}; ask for a larger target",
            name(target),
            name(source)
        )),
        (Some(_), Some(_)) => Ok(()),
        _ => Err(format!(
            "source/target missing storage resource requests: {} and {} both need spec.resources.requests.storage",
            name(source),
            name(target)
        )),
    }
}

/// `validate` with each side's filesystem overhead from `config` (by its class and volume mode):
/// what the clone populator and the host-assisted copy judge a target by, also judged on the
/// claim a clone DataVolume is about to make, so a clone that can never run is refused before
/// its claim waits for ever with only a warning event.
pub fn validate_with(
    source: &PersistentVolumeClaim,
    target: &PersistentVolumeClaim,
    config: Option<&cdi_api::config::CDIConfig>,
) -> Result<(), String> {
    let overhead = |c: &PersistentVolumeClaim| {
        let class = c
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref());
        crate::render::filesystem_overhead(config, class, volume_mode(c))
    };
    validate(source, target, overhead(source), overhead(target))
}

/// Why the source cannot be read now: a pod (not a clone source pod) has it mounted writable.
pub fn source_in_use(source: &PersistentVolumeClaim, pods: &[Pod]) -> Option<String> {
    let claim = source.metadata.name.as_deref()?;
    pods.iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
                && p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(label::COMPONENT))
                    != Some(&label::CLONE_SOURCE_COMPONENT.to_string())
        })
        .find(|p| {
            let Some(spec) = p.spec.as_ref() else {
                return false;
            };
            spec.volumes.iter().flatten().any(|v| {
                let Some(c) = v.persistent_volume_claim.as_ref() else {
                    return false;
                };
                c.claim_name == claim
                    && c.read_only != Some(true)
                    && spec.containers.iter().any(|ctr| {
                        ctr.volume_devices
                            .iter()
                            .flatten()
                            .any(|d| d.name == v.name)
                            || ctr
                                .volume_mounts
                                .iter()
                                .flatten()
                                .any(|m| m.name == v.name && m.read_only != Some(true))
                    })
            })
        })
        .map(|p| {
            format!(
                "pod {}/{} using PersistentVolumeClaim {claim}",
                p.metadata.namespace.as_deref().unwrap_or(""),
                p.metadata.name.as_deref().unwrap_or("")
            )
        })
}

fn secret_var(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: None,
            }),
            ..Default::default()
        }),
    }
}

fn expression(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.into(),
            operator: "In".into(),
            values: Some(vec![value.into()]),
        }]),
        match_labels: None,
    }
}

/// The source pod for `claim` (upstream's `MakeCloneSourcePodSpec`): in the source's namespace,
/// the source mounted read-only (or as the device), its client certificate from the Secret of
/// its name, upstream's environment for `cdi cloner`, and affinity for the upload pod's node (an
/// RWO source: required on the node of the other source pods of the same source).
pub fn source_pod(
    claim: &PersistentVolumeClaim,
    source: &PersistentVolumeClaim,
    s: &Settings,
    server_ca_pem: &str,
) -> Pod {
    let anns = annotations(claim);
    let name = source_pod_name(claim);
    let claim_ns = claim.metadata.namespace.clone().unwrap_or_default();
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    let source_uid = source.metadata.uid.clone().unwrap_or_default();
    let container = source_container(claim, source, s, server_ca_pem);
    let volumes = vec![Volume {
        name: import::DATA_VOLUME_NAME.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: source.metadata.name.clone().unwrap_or_default(),
            read_only: Some(false),
        }),
        ..Default::default()
    }];
    let mut spec = import::worker_pod_spec(claim, s, vec![container], volumes);
    // The source pod goes where the source is, never to the target's node.
    spec.node_name = None;
    spec.affinity = Some(near_upload_pod(
        spec.affinity.take().unwrap_or_default(),
        claim,
        source,
    ));
    if !mounts_any(&spec) {
        // fsGroup only matters for a mounted filesystem.
        if let Some(sc) = spec.security_context.as_mut() {
            sc.fs_group = None;
        }
    }
    let mut pod_anns = import::worker_pod_annotations(&anns, ann::CREATED_BY);
    pod_anns.insert(ann::OWNER_REF.into(), format!("{claim_ns}/{claim_name}"));
    Pod {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: source.metadata.namespace.clone(),
            annotations: Some(pod_anns),
            labels: Some(BTreeMap::from([
                (label::APP.into(), label::APP_VALUE.into()),
                (
                    label::COMPONENT.into(),
                    label::CLONE_SOURCE_COMPONENT.into(),
                ),
                (CLONE_UNIQUE_ID.into(), name),
                (label::PROMETHEUS.into(), "true".into()),
                (SOURCE_CLAIM_UID.into(), source_uid),
            ])),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The `cdi cloner` container: where to send the data and with which certificates, for whom,
/// and the source as the block device or mounted read-only.
fn source_container(
    claim: &PersistentVolumeClaim,
    source: &PersistentVolumeClaim,
    s: &Settings,
    server_ca_pem: &str,
) -> Container {
    let anns = annotations(claim);
    let name = source_pod_name(claim);
    let claim_ns = claim.metadata.namespace.clone().unwrap_or_default();
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    let owner_uid = get(&anns, ann::OWNER_UID)
        .map(str::to_string)
        .unwrap_or_else(|| import::owner_uid(claim));
    let mut env = vec![
        secret_var("CLIENT_KEY", &name, "tls.key"),
        secret_var("CLIENT_CERT", &name, "tls.crt"),
        var("SERVER_CA_CERT", server_ca_pem),
        var(
            "UPLOAD_URL",
            crate::upload::server_url(&claim_ns, &claim_name, UPLOAD_PATH),
        ),
        var(cdi_api::env::OWNER_UID, owner_uid),
        var(
            cdi_api::env::PREALLOCATION,
            get(&anns, ann::PREALLOCATION_REQUESTED).unwrap_or("false"),
        ),
    ];
    let (mut mounts, mut devices) = (None, None);
    if volume_mode(source) == crate::size::VolumeMode::Block {
        env.push(var("VOLUME_MODE", "block"));
        env.push(var("MOUNT_POINT", import::BLOCK_DEVICE));
        devices = Some(vec![VolumeDevice {
            name: import::DATA_VOLUME_NAME.into(),
            device_path: import::BLOCK_DEVICE.into(),
        }]);
    } else {
        env.push(var("VOLUME_MODE", "filesystem"));
        env.push(var("MOUNT_POINT", SOURCE_MOUNT));
        mounts = Some(vec![VolumeMount {
            name: import::DATA_VOLUME_NAME.into(),
            mount_path: SOURCE_MOUNT.into(),
            read_only: Some(true),
            ..Default::default()
        }]);
    }
    Container {
        name: CONTAINER.into(),
        image: Some(s.image.clone()),
        image_pull_policy: Some(s.pull_policy.clone()).filter(|p| !p.is_empty()),
        args: Some(vec![format!("-v={}", s.verbosity)]),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some(import::METRICS_PORT_NAME.into()),
            container_port: import::METRICS_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: mounts,
        volume_devices: devices,
        resources: s.resources.clone(),
        security_context: Some(import::worker_security_context()),
        ..Default::default()
    }
}

/// `affinity` with the source pod preferring the upload pod's node, and, for a source only
/// ReadWriteOnce, required on the node of the other source pods of the same source.
fn near_upload_pod(
    mut affinity: Affinity,
    claim: &PersistentVolumeClaim,
    source: &PersistentVolumeClaim,
) -> Affinity {
    let hostname = "kubernetes.io/hostname".to_string();
    let source_uid = source.metadata.uid.clone().unwrap_or_default();
    let rwo_only = source
        .spec
        .as_ref()
        .and_then(|sp| sp.access_modes.as_deref())
        == Some(&["ReadWriteOnce".to_string()][..]);
    let pod_affinity = affinity
        .pod_affinity
        .get_or_insert_with(PodAffinity::default);
    if rwo_only {
        pod_affinity
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(PodAffinityTerm {
                label_selector: Some(expression(SOURCE_CLAIM_UID, &source_uid)),
                namespaces: Some(vec![source.metadata.namespace.clone().unwrap_or_default()]),
                topology_key: hostname.clone(),
                ..Default::default()
            });
    }
    pod_affinity
        .preferred_during_scheduling_ignored_during_execution
        .get_or_insert_with(Vec::new)
        .push(WeightedPodAffinityTerm {
            weight: 100,
            pod_affinity_term: PodAffinityTerm {
                label_selector: Some(expression(
                    label::UPLOAD_TARGET,
                    claim.metadata.uid.as_deref().unwrap_or(""),
                )),
                namespaces: Some(vec![claim.metadata.namespace.clone().unwrap_or_default()]),
                topology_key: hostname,
                ..Default::default()
            },
        });
    affinity
}

fn mounts_any(spec: &k8s_openapi::api::core::v1::PodSpec) -> bool {
    spec.containers
        .iter()
        .any(|c| c.volume_mounts.as_ref().is_some_and(|m| !m.is_empty()))
}

/// The source pod's client certificate (`tls.crt`, `tls.key`), owned by the pod so that it goes
/// with it.
pub fn client_secret(pod: &Pod, cert_pem: &str, key_pem: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            annotations: Some(BTreeMap::from([(ann::CREATED_BY.into(), "yes".into())])),
            labels: Some(BTreeMap::from([
                (label::APP.into(), label::APP_VALUE.into()),
                (
                    label::COMPONENT.into(),
                    label::CLONE_SOURCE_COMPONENT.into(),
                ),
            ])),
            owner_references: Some(vec![import::controlled_by("Pod", &pod.metadata)]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            ("tls.crt".into(), ByteString(cert_pem.as_bytes().to_vec())),
            ("tls.key".into(), ByteString(key_pem.as_bytes().to_vec())),
        ])),
        type_: Some("kubernetes.io/tls".into()),
        ..Default::default()
    }
}

/// The source pod's state as the claim's `storage.condition.source.running*` annotations (and
/// its restarts), as upstream writes them; whether it has ended.
pub fn update_from_source_pod(anns: &mut BTreeMap<String, String>, pod: &Pod) -> bool {
    let mut seen = BTreeMap::new();
    import::update_from_worker(&mut seen, pod, ann::CLONE_SOURCE_POD_NAME);
    for (from, to) in [
        (ann::RUNNING_CONDITION, ann::SOURCE_RUNNING_CONDITION),
        (
            ann::RUNNING_CONDITION_MESSAGE,
            ann::SOURCE_RUNNING_CONDITION_MESSAGE,
        ),
        (
            ann::RUNNING_CONDITION_REASON,
            ann::SOURCE_RUNNING_CONDITION_REASON,
        ),
    ] {
        if let Some(v) = seen.get(from) {
            anns.insert(to.into(), v.clone());
        }
    }
    if let Some(r) = seen.get(ann::POD_RESTARTS) {
        let known: i32 = get(anns, ann::POD_RESTARTS)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if r.parse::<i32>().is_ok_and(|r| r > known) {
            anns.insert(ann::POD_RESTARTS.into(), r.clone());
        }
    }
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(
        ns: &str,
        name: &str,
        anns: serde_json::Value,
        size: &str,
        mode: &str,
    ) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("{name}-uid"), "annotations": anns},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": mode,
                "resources": {"requests": {"storage": size}}}}))
        .unwrap()
    }

    #[test]
    fn the_request_names_the_source() {
        let c = |v: &str| {
            claim(
                "dst",
                "t",
                json!({"k8s.io/CloneRequest": v}),
                "1Gi",
                "Filesystem",
            )
        };
        assert_eq!(
            clone_request(&c("src/golden")),
            Some(("src".into(), "golden".into()))
        );
        assert_eq!(
            clone_request(&c("golden")),
            Some(("dst".into(), "golden".into()))
        );
        assert_eq!(
            clone_request(&c("/golden")),
            Some(("dst".into(), "golden".into()))
        );
        assert_eq!(clone_request(&c("a/b/c")), None);
        assert_eq!(clone_request(&c("src/")), None);
        let target = c("src/golden");
        assert_eq!(
            client_name(&clone_request(&target).unwrap(), &target),
            "src/golden-dst/t"
        );
    }

    #[test]
    fn validation_as_upstream() {
        let zero = crate::size::Overhead::ZERO;
        let src = claim("s", "golden", json!({}), "10Gi", "Filesystem");
        let same = claim("d", "t", json!({}), "10Gi", "Filesystem");
        assert_eq!(validate(&src, &same, zero, zero), Ok(()));
        let small = claim("d", "t", json!({}), "5Gi", "Filesystem");
        let err = validate(&src, &small, zero, zero).unwrap_err();
        assert!(
            err.starts_with("target resources requests storage size is smaller than the source"),
            "{err}"
        );
        let permissive = claim(
            "d",
            "t",
            json!({"cdi.kubevirt.io/permissiveClone": "true"}),
            "5Gi",
            "Filesystem",
        );
        assert_eq!(validate(&src, &permissive, zero, zero), Ok(()));
        // A Block target of the Filesystem source's request holds what the source can.
        let block = claim("d", "t", json!({}), "10Gi", "Block");
        let overhead = crate::size::Overhead::from_thousandths(60).unwrap();
        assert_eq!(validate(&src, &block, overhead, zero), Ok(()));
        let archive = claim(
            "d",
            "t",
            json!({"cdi.kubevirt.io/storage.contentType": "archive"}),
            "10Gi",
            "Filesystem",
        );
        assert!(
            validate(&src, &archive, zero, zero)
                .unwrap_err()
                .contains("do not match")
        );
        let archive_src = claim(
            "s",
            "golden",
            json!({"cdi.kubevirt.io/storage.contentType": "archive"}),
            "10Gi",
            "Filesystem",
        );
        let archive_block = claim(
            "d",
            "t",
            json!({"cdi.kubevirt.io/storage.contentType": "archive"}),
            "10Gi",
            "Block",
        );
        assert!(
            validate(&archive_src, &archive_block, zero, zero)
                .unwrap_err()
                .contains("volume modes do not match")
        );
    }

    /// Each side is judged by what its own class's filesystem leaves for a disk image: the
    /// rule a clone DataVolume's claim is checked by before it is made, and again later.
    #[test]
    fn each_side_has_its_own_class_overhead() {
        let config: cdi_api::config::CDIConfig = serde_json::from_value(json!({
            "metadata": {"name": "config"}, "spec": {},
            "status": {"filesystemOverhead": {"global": "0", "storageClass": {"slow": "0.25"}}}}))
        .unwrap();
        // 10Gi of a Filesystem on `slow` holds 8Gi of image.
        let mut src = claim("s", "golden", json!({}), "10Gi", "Filesystem");
        src.spec.as_mut().unwrap().storage_class_name = Some("slow".into());
        let block = |size: &str| claim("d", "t", json!({}), size, "Block");
        assert_eq!(validate_with(&src, &block("8Gi"), Some(&config)), Ok(()));
        let err = validate_with(&src, &block("8191Mi"), Some(&config)).unwrap_err();
        assert!(
            err.starts_with("target resources requests storage size is smaller than the source"),
            "{err}"
        );
        // A Filesystem target on a class without overhead: its request is all image.
        let files = claim("d", "t", json!({}), "8Gi", "Filesystem");
        assert_eq!(validate_with(&src, &files, Some(&config)), Ok(()));
    }

    #[test]
    fn the_source_pod_as_upstream_makes_it() {
        let target = claim(
            "dst",
            "tmp-pvc-1",
            json!({"k8s.io/CloneRequest": "src/golden", "cdi.kubevirt.io/ownerUID": "dv-uid",
                "cdi.kubevirt.io/storage.preallocation.requested": "false",
                "cdi.kubevirt.io/storage.populator.kind": "VolumeCloneSource",
                "volume.kubernetes.io/selected-node": "node-2"}),
            "10Gi",
            "Filesystem",
        );
        let source = claim("src", "golden", json!({}), "10Gi", "Filesystem");
        let s = Settings {
            image: "cdi-cloner".into(),
            ..Default::default()
        };
        let pod = source_pod(&target, &source, &s, "CA PEM");
        assert_eq!(
            pod.metadata.name.as_deref(),
            Some("tmp-pvc-1-uid-source-pod")
        );
        assert_eq!(pod.metadata.namespace.as_deref(), Some("src"));
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels["cdi.kubevirt.io"], "cdi-clone-source");
        assert_eq!(labels[SOURCE_CLAIM_UID], "golden-uid");
        assert_eq!(
            pod.metadata.annotations.as_ref().unwrap()[ann::OWNER_REF],
            "dst/tmp-pvc-1"
        );
        let spec = pod.spec.unwrap();
        assert_eq!(
            spec.node_name, None,
            "the source pod goes where the source is"
        );
        let c = &spec.containers[0];
        let env: BTreeMap<_, _> = c
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.clone()))
            .collect();
        assert_eq!(
            env["UPLOAD_URL"].value.as_deref(),
            Some("https://cdi-upload-tmp-pvc-1.dst.svc:8443/v1beta1/upload")
        );
        assert_eq!(env["OWNER_UID"].value.as_deref(), Some("dv-uid"));
        assert_eq!(env["MOUNT_POINT"].value.as_deref(), Some(SOURCE_MOUNT));
        assert_eq!(env["VOLUME_MODE"].value.as_deref(), Some("filesystem"));
        assert_eq!(env["SERVER_CA_CERT"].value.as_deref(), Some("CA PEM"));
        let key = env["CLIENT_KEY"]
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            (key.name.as_str(), key.key.as_str()),
            ("tmp-pvc-1-uid-source-pod", "tls.key")
        );
        assert_eq!(c.volume_mounts.as_ref().unwrap()[0].read_only, Some(true));
        let affinity = spec.affinity.unwrap().pod_affinity.unwrap();
        assert_eq!(
            affinity
                .required_during_scheduling_ignored_during_execution
                .unwrap()
                .len(),
            1
        );

        let block_source = claim("src", "golden", json!({}), "10Gi", "Block");
        let pod = source_pod(&target, &block_source, &s, "CA PEM");
        let spec = pod.spec.unwrap();
        assert!(spec.containers[0].volume_devices.is_some());
        assert_eq!(spec.security_context.unwrap().fs_group, None);
    }

    #[test]
    fn a_source_in_use_is_named() {
        let source = claim("src", "golden", json!({}), "10Gi", "Filesystem");
        let pod = |name: &str, read_only: bool, component: &str, phase: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "src",
                "labels": {"cdi.kubevirt.io": component}},
                "spec": {"containers": [{"name": "c", "volumeMounts": [{"name": "v", "mountPath": "/d", "readOnly": read_only}]}],
                    "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "golden"}}]},
                "status": {"phase": phase}}))
            .unwrap()
        };
        assert_eq!(
            source_in_use(&source, &[pod("reader", true, "", "Running")]),
            None
        );
        assert_eq!(
            source_in_use(
                &source,
                &[pod("other", false, "cdi-clone-source", "Running")]
            ),
            None
        );
        assert_eq!(
            source_in_use(&source, &[pod("done", false, "", "Succeeded")]),
            None
        );
        assert_eq!(
            source_in_use(&source, &[pod("vm", false, "", "Running")]).as_deref(),
            Some("pod src/vm using PersistentVolumeClaim golden")
        );
    }
}
