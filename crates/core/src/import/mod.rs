//! The import controller's decisions (docs/design.md#the-import-flow; upstream's PVC-level import controller): which
//! claims get an importer pod, the pod itself, and what the pod's state writes back onto the
//! claim's annotations.

use std::collections::BTreeMap;

use cdi_api::config::{CDIConfig, ImportProxy, NodePlacement};
use cdi_api::{FailureReason, TerminationMessage, ann, env, label};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, ContainerStateTerminated, EnvVar, EnvVarSource,
    LocalObjectReference, PersistentVolumeClaim, Pod, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext, Toleration, Volume,
    VolumeDevice, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// Where the importer finds its volume.
pub const DATA_MOUNT: &str = "/data";
pub const BLOCK_DEVICE: &str = "/dev/cdi-block-volume";
pub const DATA_VOLUME_NAME: &str = "cdi-data-vol";
pub const CERT_DIR: &str = "/certs";
/// Where a GCS source's Secret is mounted, and the key file in it (upstream's paths).
pub const GOOGLE_CREDENTIALS_DIR: &str = "/google";
pub const GOOGLE_CREDENTIALS_FILE: &str = "/google/credentials.json";
/// The GCS Secret's volume (upstream's `SecretVolName`).
const SECRET_VOLUME_NAME: &str = "cdi-secret-vol";
/// Where the scratch claim is mounted when the importer asked for one.
pub const SCRATCH_MOUNT: &str = "/scratch";
pub const SCRATCH_VOLUME_NAME: &str = "cdi-scratch-vol";
/// The importer's container name, also its component label value.
pub const CONTAINER: &str = "importer";
/// The metrics port's name; controllers scrape progress from it.
pub const METRICS_PORT_NAME: &str = "metrics";
pub const METRICS_PORT: i32 = 8443;
/// The message of a running worker pod's Running condition.
pub const POD_RUNNING_REASON: &str = "Pod is running";

fn get<'a>(anns: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    anns.get(key).map(String::as_str)
}

/// The claim's annotations (empty when it has none).
pub fn annotations(claim: &PersistentVolumeClaim) -> BTreeMap<String, String> {
    claim.metadata.annotations.clone().unwrap_or_default()
}

/// Whether the import controller works on this claim at all: it names an import source or
/// endpoint and is not populated by someone else.
pub fn is_import_claim(claim: &PersistentVolumeClaim) -> bool {
    let anns = annotations(claim);
    (anns.contains_key(ann::IMPORT_ENDPOINT) || anns.contains_key(ann::IMPORT_SOURCE))
        && !anns.contains_key(ann::EXTERNAL_POPULATION)
}

/// The import is complete: the worker pod succeeded.
pub fn is_complete(claim: &PersistentVolumeClaim) -> bool {
    get(&annotations(claim), ann::POD_PHASE) == Some("Succeeded")
}

/// WaitForFirstConsumer is honoured for this claim: the gate is on and nobody asked for
/// immediate binding.
pub fn honors_wffc(claim: &PersistentVolumeClaim, gate_on: bool) -> bool {
    gate_on && !annotations(claim).contains_key(ann::IMMEDIATE_BINDING)
}

/// What to do with an import claim that has no importer pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Nothing: done, failed for good, being deleted, or not this controller's.
    Nothing,
    /// Wait for the claim to be bound by its first consumer (docs/design.md#the-waitforfirstconsumer-handshake: no pod before).
    WaitForConsumer,
    /// Create the importer pod.
    CreatePod,
}

/// The decision for a claim without a pod.
pub fn next(claim: &PersistentVolumeClaim, gate_on: bool) -> Next {
    next_for(claim, gate_on, is_import_claim(claim))
}

/// The decision for a claim without its worker pod, for any worker kind: `ours` says the claim
/// is that kind's to fill.
pub fn next_for(claim: &PersistentVolumeClaim, gate_on: bool, ours: bool) -> Next {
    let anns = annotations(claim);
    if !ours
        || is_complete(claim)
        || get(&anns, ann::IMPORT_FATAL_ERROR) == Some("true")
        || claim.metadata.deletion_timestamp.is_some()
    {
        return Next::Nothing;
    }
    let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if honors_wffc(claim, gate_on) && !bound {
        return Next::WaitForConsumer;
    }
    Next::CreatePod
}

/// The importer pod's name for a claim: `importer-<claim>`, shortened as upstream shortens it
/// when the claim's name is long.
pub fn pod_name(claim: &PersistentVolumeClaim) -> String {
    let anns = annotations(claim);
    match get(&anns, ann::IMPORT_POD_NAME) {
        Some(n) if crate::naming::is_object_name(n) => n.to_string(),
        _ => crate::naming::resource_name(
            cdi_api::name::IMPORTER_POD_PREFIX,
            claim.metadata.name.as_deref().unwrap_or(""),
        ),
    }
}

/// The UID the importer reports progress under: the claim's only owner (its DataVolume, or the
/// target claim for PVC prime), else the claim's own.
pub fn owner_uid(claim: &PersistentVolumeClaim) -> String {
    match claim.metadata.owner_references.as_deref() {
        Some([only]) => only.uid.clone(),
        _ => claim.metadata.uid.clone().unwrap_or_default(),
    }
}

/// Cluster settings the pod is made with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    pub image: String,
    pub pull_policy: String,
    /// `-v=N` for the importer.
    pub verbosity: u32,
    pub resources: Option<ResourceRequirements>,
    /// The overhead for the claim's class (CDIConfig status), as written there.
    pub filesystem_overhead: String,
    /// CDIConfig's default preallocation, used when the claim has no request of its own.
    pub preallocation: bool,
    pub import_proxy: Option<ImportProxy>,
    /// The CDI resource's `spec.workload`: where worker pods may run.
    pub placement: Option<NodePlacement>,
    /// Tolerations inherited from the claim's first consumer (docs/design.md#worker-pods-follow-the-first-consumer), added to the workload's.
    pub inherited: Vec<Toleration>,
    /// CDIConfig's `spec.insecureRegistries`: registries (host[:port]) whose TLS is not
    /// checked.
    pub insecure_registries: Vec<String>,
    /// CDIConfig's effective `imagePullSecrets` (status): what every worker pod pulls its image
    /// with, as upstream's.
    pub image_pull_secrets: Vec<LocalObjectReference>,
}

/// Who makes the importer pod (the controller's own settings).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Worker {
    pub image: String,
    pub pull_policy: String,
    pub verbosity: u32,
}

impl Settings {
    /// The settings for `claim`'s importer: the worker's, CDIConfig's effective values (status)
    /// for the claim's class and volume mode, and the CDI resource's placement.
    pub fn for_claim(
        worker: &Worker,
        cfg: Option<&CDIConfig>,
        claim: &PersistentVolumeClaim,
        placement: Option<NodePlacement>,
    ) -> Settings {
        let status = cfg.and_then(|c| c.status.as_ref());
        let spec = claim.spec.as_ref();
        let class = spec.and_then(|s| s.storage_class_name.as_deref());
        let mode = crate::size::resolve_volume_mode(spec.and_then(|s| s.volume_mode.as_deref()));
        Settings {
            image: worker.image.clone(),
            pull_policy: worker.pull_policy.clone(),
            verbosity: worker.verbosity,
            resources: status.and_then(|s| s.default_pod_resource_requirements.clone()),
            filesystem_overhead: crate::render::filesystem_overhead(cfg, class, mode).to_string(),
            preallocation: status.and_then(|s| s.preallocation).unwrap_or(false),
            import_proxy: status.and_then(|s| s.import_proxy.clone()),
            placement,
            // An unreadable record inherits nothing; the controller says so.
            inherited: crate::placement::for_worker(claim, cfg).unwrap_or_default(),
            insecure_registries: cfg
                .and_then(|c| c.spec.insecure_registries.clone())
                .unwrap_or_default(),
            image_pull_secrets: status
                .and_then(|s| s.image_pull_secrets.clone())
                .unwrap_or_default()
                .into_iter()
                .filter(|r| !r.name.is_empty())
                .collect(),
        }
    }
}

/// The labels an import's termination message asks for (a registry image's `*_KUBEVIRT_IO_*`
/// environment) that the claim gets: those it does not have yet (upstream never overwrites
/// one), and only valid ones, since an image can say anything and one bad label would make
/// the API server refuse the whole patch.
pub fn labels_to_add(
    current: &BTreeMap<String, String>,
    from_pod: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    from_pod
        .iter()
        .filter(|(k, v)| !current.contains_key(*k) && label_key(k) && label_value(v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A label name: at most 63 of `[A-Za-z0-9._-]`, starting and ending with a letter or digit.
fn label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric())
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)))
}

/// A label key: a name, behind an optional DNS subdomain prefix and `/`.
fn label_key(k: &str) -> bool {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && part.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    prefix_ok && !name.is_empty() && label_value(name)
}

/// The merge patch of annotations turning `current` into `wanted`: changed and new keys, and
/// with `remove_others` the keys `wanted` leaves out (`None`). Empty when nothing changes.
pub fn annotation_patch(
    current: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
    remove_others: bool,
) -> BTreeMap<String, Option<String>> {
    let mut patch: BTreeMap<String, Option<String>> = wanted
        .iter()
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    if remove_others {
        for k in current.keys().filter(|k| !wanted.contains_key(*k)) {
            patch.insert(k.clone(), None);
        }
    }
    patch
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

/// The owner reference by which a core (`v1`) object of `kind` described by `meta` controls
/// what it owns (deleted with it).
pub fn controlled_by(kind: &str, meta: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: kind.into(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

pub(crate) fn var(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

/// Upstream's `IsInsecureTLS`: a `docker://` image whose registry (host[:port], as written)
/// is listed in CDIConfig's `insecureRegistries`.
fn insecure_registry(endpoint: &str, insecure: &[String]) -> bool {
    let host = match endpoint.strip_prefix("docker://") {
        Some(rest) => rest.split('/').next().unwrap_or(""),
        None => endpoint
            .strip_prefix("oci-archive:")
            .and_then(crate::source::archive_host)
            .unwrap_or(""),
    };
    !host.is_empty() && insecure.iter().any(|h| h == host)
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

/// Extra headers in index order: `…extraHeaders.0`, `.1`, … (a gap ends the list).
fn indexed(anns: &BTreeMap<String, String>, prefix: &str) -> Vec<String> {
    (0..)
        .map_while(|n| anns.get(&format!("{prefix}.{n}")).cloned())
        .collect()
}

/// The importer pod for `claim` (upstream's `makeImporterPodSpec`): owned by the claim,
/// restartPolicy OnFailure, restricted security context, the claim at `/data` or as the block
/// device, upstream's environment built from the claim's annotations.
pub fn importer_pod(claim: &PersistentVolumeClaim, s: &Settings) -> Pod {
    let anns = annotations(claim);
    let name = claim.metadata.name.clone().unwrap_or_default();
    let a = |k: &str| get(&anns, k).unwrap_or("").to_string();
    let size = claim
        .spec
        .as_ref()
        .and_then(|sp| sp.resources.as_ref()?.requests.as_ref()?.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_default();
    let source = match get(&anns, ann::IMPORT_SOURCE) {
        Some(src) if !src.is_empty() => src.to_string(),
        _ => "http".into(),
    };
    let preallocation = match get(&anns, ann::PREALLOCATION_REQUESTED) {
        Some(v) => v == "true",
        None => s.preallocation,
    };
    let proxy = s.import_proxy.clone().unwrap_or_default();
    let mut envs = vec![
        var(env::SOURCE, source.clone()),
        var(env::ENDPOINT, a(ann::IMPORT_ENDPOINT)),
        var(env::CONTENT_TYPE, {
            let c = a(ann::CONTENT_TYPE);
            if c.is_empty() { "kubevirt".into() } else { c }
        }),
        var(env::IMAGE_SIZE, size),
        var(env::OWNER_UID, owner_uid(claim)),
        var(env::FILESYSTEM_OVERHEAD, s.filesystem_overhead.clone()),
        var(
            env::INSECURE_TLS,
            (a(ann::IMPORT_INSECURE_SKIP_VERIFY) == "true"
                || insecure_registry(&a(ann::IMPORT_ENDPOINT), &s.insecure_registries))
            .to_string(),
        ),
        var("IMPORTER_DISK_ID", a(ann::DISK_ID)),
        var("IMPORTER_UUID", a(ann::UUID)),
        var("IMPORTER_PULL_METHOD", a(ann::REGISTRY_IMPORT_METHOD)),
        var("IMPORTER_READY_FILE", ""),
        var("IMPORTER_DONE_FILE", ""),
        var("IMPORTER_BACKING_FILE", a(ann::BACKING_FILE)),
        var("IMPORTER_THUMBPRINT", a(ann::THUMBPRINT)),
        var(env::HTTP_PROXY, proxy.http_proxy.unwrap_or_default()),
        var(env::HTTPS_PROXY, proxy.https_proxy.unwrap_or_default()),
        var(env::NO_PROXY, proxy.no_proxy.unwrap_or_default()),
        var("IMPORTER_CURRENT_CHECKPOINT", a(ann::CURRENT_CHECKPOINT)),
        var("IMPORTER_PREVIOUS_CHECKPOINT", a(ann::PREVIOUS_CHECKPOINT)),
        var("IMPORTER_FINAL_CHECKPOINT", a(ann::FINAL_CHECKPOINT)),
        var(env::PREALLOCATION, preallocation.to_string()),
        var(
            "CACHE_MODE",
            if a(ann::REQUIRES_DIRECT_IO) == "true" {
                "TRYNONE"
            } else {
                ""
            },
        ),
        var(
            "IMPORTER_REGISTRY_IMAGE_ARCHITECTURE",
            a(ann::REGISTRY_IMAGE_ARCHITECTURE),
        ),
        var(env::CHECKSUM, a(ann::IMPORT_CHECKSUM)),
    ];
    let secret = a(ann::IMPORT_SECRET);
    if !secret.is_empty() && source != "gcs" {
        envs.push(secret_var(env::ACCESS_KEY_ID, &secret, "accessKeyId"));
        envs.push(secret_var(env::SECRET_KEY, &secret, "secretKey"));
    }
    let mut volumes = vec![Volume {
        name: DATA_VOLUME_NAME.into(),
        persistent_volume_claim: Some(
            k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource {
                claim_name: name.clone(),
                read_only: Some(false),
            },
        ),
        ..Default::default()
    }];
    let block = claim.spec.as_ref().and_then(|sp| sp.volume_mode.as_deref()) == Some("Block");
    let mut mounts = Vec::new();
    let cert_map = a(ann::IMPORT_CERT_CONFIG_MAP);
    if !cert_map.is_empty() {
        envs.push(var(env::CERT_DIR, CERT_DIR));
        volumes.push(Volume {
            name: "cdi-cert-vol".into(),
            config_map: Some(k8s_openapi::api::core::v1::ConfigMapVolumeSource {
                name: cert_map,
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "cdi-cert-vol".into(),
            mount_path: CERT_DIR.into(),
            ..Default::default()
        });
    }
    for (i, header) in indexed(&anns, ann::IMPORT_EXTRA_HEADERS_PREFIX)
        .into_iter()
        .enumerate()
    {
        envs.push(var(&format!("{}{i}", env::EXTRA_HEADER_PREFIX), header));
    }
    for (i, secret) in indexed(&anns, ann::IMPORT_SECRET_EXTRA_HEADERS_PREFIX)
        .into_iter()
        .enumerate()
    {
        let vol = format!("sec-extra-header-{i}");
        volumes.push(Volume {
            name: vol.clone(),
            secret: Some(k8s_openapi::api::core::v1::SecretVolumeSource {
                secret_name: Some(secret),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: vol,
            mount_path: format!("/extraheaders/{i}"),
            read_only: Some(true),
            ..Default::default()
        });
    }
    // A GCS key is a file (upstream's mount and variable), not key/secret variables.
    if !secret.is_empty() && source == "gcs" {
        envs.push(var(env::GOOGLE_CREDENTIALS, GOOGLE_CREDENTIALS_FILE));
        volumes.push(Volume {
            name: SECRET_VOLUME_NAME.into(),
            secret: Some(k8s_openapi::api::core::v1::SecretVolumeSource {
                secret_name: Some(secret.clone()),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: SECRET_VOLUME_NAME.into(),
            mount_path: GOOGLE_CREDENTIALS_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    if get(&anns, ann::REQUIRES_SCRATCH) == Some("true") {
        volumes.push(Volume {
            name: SCRATCH_VOLUME_NAME.into(),
            persistent_volume_claim: Some(
                k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource {
                    claim_name: scratch_name(claim),
                    read_only: Some(false),
                },
            ),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: SCRATCH_VOLUME_NAME.into(),
            mount_path: SCRATCH_MOUNT.into(),
            ..Default::default()
        });
    }
    let (volume_devices, data_mounts) = if block {
        (
            Some(vec![VolumeDevice {
                name: DATA_VOLUME_NAME.into(),
                device_path: BLOCK_DEVICE.into(),
            }]),
            Vec::new(),
        )
    } else {
        (
            None,
            vec![VolumeMount {
                name: DATA_VOLUME_NAME.into(),
                mount_path: DATA_MOUNT.into(),
                ..Default::default()
            }],
        )
    };
    let container = Container {
        name: CONTAINER.into(),
        image: Some(s.image.clone()),
        image_pull_policy: Some(s.pull_policy.clone()).filter(|p| !p.is_empty()),
        args: Some(vec![format!("-v={}", s.verbosity)]),
        env: Some(envs),
        ports: Some(vec![ContainerPort {
            name: Some(METRICS_PORT_NAME.into()),
            container_port: METRICS_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_devices,
        volume_mounts: Some(data_mounts.into_iter().chain(mounts).collect())
            .filter(|m: &Vec<_>| !m.is_empty()),
        resources: s.resources.clone(),
        security_context: Some(worker_security_context()),
        ..Default::default()
    };
    let pod_anns = worker_pod_annotations(&anns, ann::CREATED_BY);
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(claim)),
            namespace: claim.metadata.namespace.clone(),
            annotations: Some(pod_anns),
            labels: Some(BTreeMap::from([
                (label::APP.into(), label::APP_VALUE.into()),
                (label::COMPONENT.into(), label::IMPORTER_COMPONENT.into()),
                (label::PROMETHEUS.into(), "true".into()),
            ])),
            owner_references: Some(vec![controlled_by(
                "PersistentVolumeClaim",
                &claim.metadata,
            )]),
            ..Default::default()
        },
        spec: Some(worker_pod_spec(claim, s, vec![container], volumes)),
        status: None,
    }
}

/// A worker pod's annotations: `created_by` (the mark of the controller that made it), the
/// pass-through annotations the claim allows, and upstream's defaults for the sidecar injectors.
pub fn worker_pod_annotations(
    anns: &BTreeMap<String, String>,
    created_by: &str,
) -> BTreeMap<String, String> {
    let mut pod_anns = BTreeMap::from([(created_by.to_string(), "yes".to_string())]);
    for key in [ann::POD_MULTUS_NETWORKS, ann::POD_MULTUS_DEFAULT_NETWORK] {
        if let Some(v) = get(anns, key) {
            pod_anns.insert(key.into(), v.into());
        }
    }
    pod_anns.insert(
        ann::POD_SIDECAR_INJECTION_ISTIO.into(),
        get(anns, ann::POD_SIDECAR_INJECTION_ISTIO)
            .unwrap_or("false")
            .into(),
    );
    pod_anns.insert(
        ann::POD_SIDECAR_INJECTION_LINKERD.into(),
        get(anns, ann::POD_SIDECAR_INJECTION_LINKERD)
            .unwrap_or("disabled")
            .into(),
    );
    pod_anns
}

/// What every worker pod of a claim shares (upstream's importer and upload pods alike): restart
/// on failure, the claim's priority class and ServiceAccount, no service links, the CDI
/// resource's placement with inherited tolerations, PVC prime's node, the restricted security
/// context.
pub fn worker_pod_spec(
    claim: &PersistentVolumeClaim,
    s: &Settings,
    containers: Vec<Container>,
    volumes: Vec<Volume>,
) -> PodSpec {
    let anns = annotations(claim);
    PodSpec {
        containers,
        volumes: Some(volumes),
        restart_policy: Some("OnFailure".into()),
        image_pull_secrets: Some(s.image_pull_secrets.clone()).filter(|v| !v.is_empty()),
        priority_class_name: get(&anns, ann::PRIORITY_CLASS_NAME).map(str::to_string),
        service_account_name: get(&anns, ann::POD_SERVICE_ACCOUNT_NAME).map(str::to_string),
        enable_service_links: Some(false),
        node_selector: s.placement.as_ref().and_then(|p| p.node_selector.clone()),
        tolerations: crate::placement::worker_tolerations(
            s.placement.as_ref().and_then(|p| p.tolerations.as_deref()),
            &s.inherited,
        ),
        affinity: s.placement.as_ref().and_then(|p| p.affinity.clone()),
        // PVC prime: the populator's claim goes where its target's consumer was scheduled.
        node_name: get(&anns, ann::POPULATOR_KIND)
            .and(get(&anns, ann::SELECTED_NODE))
            .map(str::to_string),
        security_context: Some(PodSecurityContext {
            fs_group: Some(107),
            run_as_non_root: Some(true),
            run_as_user: Some(107),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The restricted security context of CDI's worker containers (the importer's, the temporary
/// first consumer's): no privilege escalation, no capabilities, the non-root user 107.
pub fn worker_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        run_as_non_root: Some(true),
        run_as_user: Some(107),
        ..Default::default()
    }
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

/// Upstream's short message for a claim too small for its image (the importer's own detail
/// follows it).
const TOO_SMALL: &str = "DataVolume too small to contain image";

/// What the importer said, as the condition message shows it.
/// Upstream's `simplifyKnownMessage`: an image that could not be pulled from its registry is
/// ImagePullFailed whatever the container's own reason.
fn known_reason<'a>(message: &str, reason: &'a str) -> &'a str {
    if message.contains("failed to pull image") {
        "ImagePullFailed"
    } else {
        reason
    }
}

fn said(m: &TerminationMessage) -> String {
    let text = m.message.as_deref().unwrap_or("");
    match m.reason {
        Some(FailureReason::ImageTooLarge | FailureReason::NoSpace) => {
            format!("{TOO_SMALL}: {text}")
        }
        _ => text.to_string(),
    }
}

/// The signal that ended a container, if one did. Runtimes report a signal as 128 + its
/// number; a message then is only the log's tail.
pub fn signal_of(t: &ContainerStateTerminated) -> Option<i32> {
    t.signal
        .filter(|s| *s > 0)
        .or((t.exit_code > 128 && t.exit_code < 160).then(|| t.exit_code - 128))
}

/// The name of a signal that ends containers, as ` (SIGKILL)`; empty for others.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        9 => " (SIGKILL)",
        15 => " (SIGTERM)",
        6 => " (SIGABRT)",
        11 => " (SIGSEGV)",
        2 => " (SIGINT)",
        _ => "",
    }
}

/// What a terminated importer said, or, when it could not say anything (killed by a signal, out
/// of memory), what happened to it: an empty message explains nothing.
fn exit_message(t: &ContainerStateTerminated, restarts: bool, who: &str) -> String {
    let said = said(&TerminationMessage::parse(
        t.message.as_deref().unwrap_or(""),
    ));
    let said = said.trim_end();
    let then = match (restarts, who) {
        (false, _) => "",
        // An upload is the client's to send again.
        (true, "upload server") => "; it restarts for the upload to be sent again",
        (true, _) => "; it restarts and resumes",
    };
    if t.reason.as_deref() == Some("OOMKilled") {
        return format!(
            "the {who} was killed for exceeding its memory limit (OOMKilled){then}; raise \
             CDIConfig spec.podResourceRequirements if it happens again"
        );
    }
    match signal_of(t) {
        Some(sig) if t.exit_code != 0 => {
            let name = signal_name(sig);
            format!("the {who} was killed by signal {sig}{name}{then}")
        }
        _ if !said.is_empty() || t.exit_code == 0 => said.to_string(),
        _ => format!(
            "the {who} exited with code {} without a message{then}; see its log",
            t.exit_code
        ),
    }
}

/// What the pod's state means beyond the annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The import cannot succeed by retrying (checksum mismatch): delete the pod, fail.
    pub fatal: bool,
    /// The importer exited with an error: a Warning event with this message on the claim.
    pub failed: Option<String>,
    /// The pod succeeded: the import is complete.
    pub complete: bool,
    /// Labels the importer reported (added to the claim once complete).
    pub labels: BTreeMap<String, String>,
}

/// Write the pod's state onto the claim's annotations (upstream's `updatePvcFromPod` and
/// `setAnnotationsFromPodWithPrefix`). Unlike upstream, a container waiting in
/// CrashLoopBackOff reports its last termination, so a failing import says why between restarts.
pub fn update_from_pod(anns: &mut BTreeMap<String, String>, pod: &Pod) -> Outcome {
    update_from_worker(anns, pod, ann::IMPORT_POD_NAME)
}

/// [`update_from_pod`] for any worker pod, whose name goes under `pod_name_key`.
pub fn update_from_worker(
    anns: &mut BTreeMap<String, String>,
    pod: &Pod,
    pod_name_key: &str,
) -> Outcome {
    // Who the pod's messages name.
    let who = if pod_name_key == ann::UPLOAD_POD_NAME {
        "upload server"
    } else {
        "importer"
    };
    let mut out = Outcome::default();
    let restarted = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) != Some("Never");
    let status = pod.status.clone().unwrap_or_default();
    let containers = status.container_statuses.clone().unwrap_or_default();
    let first = containers.first();
    let term_state = first.and_then(|c| c.state.as_ref()?.terminated.clone());
    let term_msg: Option<TerminationMessage> = term_state
        .as_ref()
        .filter(|t| t.exit_code == 0)
        .and_then(|t| t.message.as_deref())
        .map(TerminationMessage::parse);

    if let Some(c) = first {
        let restarts: i32 = anns
            .get(ann::POD_RESTARTS)
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        if c.restart_count >= restarts {
            anns.insert(ann::POD_RESTARTS.into(), c.restart_count.to_string());
        }
        let set =
            |anns: &mut BTreeMap<String, String>, running: &str, message: &str, reason: &str| {
                anns.insert(ann::RUNNING_CONDITION.into(), running.into());
                anns.insert(ann::RUNNING_CONDITION_MESSAGE.into(), message.into());
                anns.insert(ann::RUNNING_CONDITION_REASON.into(), reason.into());
            };
        let state = c.state.clone().unwrap_or_default();
        let all_running = containers
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
        let waiting = state.waiting.as_ref();
        let waiting_reason = waiting.and_then(|w| w.reason.as_deref()).unwrap_or("");
        if all_running {
            set(anns, "true", "", POD_RUNNING_REASON);
        } else if matches!(
            waiting_reason,
            "ImagePullBackOff" | "ErrImagePull" | "InvalidImageName"
        ) {
            let image = &c.image;
            set(
                anns,
                "false",
                &format!("failed to pull image: {image}"),
                "ImagePullFailed",
            );
        } else if waiting.is_some() && waiting_reason != "CrashLoopBackOff" {
            let message = waiting.and_then(|w| w.message.as_deref()).unwrap_or("");
            set(anns, "false", message, waiting_reason);
        } else {
            // Terminated now, or waiting to be restarted after a termination.
            let last = c.last_state.as_ref().and_then(|s| s.terminated.clone());
            let ended: Option<ContainerStateTerminated> = term_state.clone().or(last);
            if let Some(t) = ended {
                let reason = t.reason.clone().unwrap_or_default();
                match &term_msg {
                    Some(m) if m.scratch_space_required == Some(true) => {
                        anns.insert(ann::REQUIRES_SCRATCH.into(), "true".into());
                        set(
                            anns,
                            "false",
                            "Scratch space required",
                            "Scratch space required",
                        );
                    }
                    Some(m) => {
                        if m.preallocation_applied == Some(true) {
                            anns.insert(ann::PREALLOCATION_APPLIED.into(), "true".into());
                        }
                        let message = said(m);
                        set(anns, "false", &message, known_reason(&message, &reason));
                        out.labels = m.labels.clone().unwrap_or_default();
                    }
                    None => {
                        let message = exit_message(&t, restarted, who);
                        set(anns, "false", &message, known_reason(&message, &reason));
                    }
                }
                if t.exit_code != 0 {
                    out.failed = Some(exit_message(&t, restarted, who));
                }
            }
        }
    }

    // A failure the importer says no retry can mend: the pod is done, the import failed.
    if let Some(m) = term_msg.as_ref().filter(|m| m.is_fatal()) {
        let message = said(m);
        anns.insert(ann::POD_PHASE.into(), "Failed".into());
        anns.insert(ann::IMPORT_FATAL_ERROR.into(), "true".into());
        anns.insert(ann::RUNNING_CONDITION.into(), "false".into());
        anns.insert(ann::RUNNING_CONDITION_MESSAGE.into(), message.clone());
        let reason = match m.reason {
            Some(FailureReason::ChecksumMismatch) => "ChecksumError".to_string(),
            Some(r) => format!("{r:?}"),
            None => String::new(),
        };
        anns.insert(ann::RUNNING_CONDITION_REASON.into(), reason);
        out.fatal = true;
        out.failed = Some(message);
    }
    let scratch = term_msg.as_ref().and_then(|m| m.scratch_space_required) == Some(true);
    anns.insert(
        pod_name_key.into(),
        pod.metadata.name.clone().unwrap_or_default(),
    );
    let phase = status.phase.clone().unwrap_or_default();
    if !scratch && !out.fatal {
        anns.insert(ann::POD_PHASE.into(), phase.clone());
    }
    let unschedulable = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"));
    let pending = anns.get(ann::POD_PHASE).map(String::as_str) == Some("Pending");
    anns.insert(
        ann::POD_SCHEDULABLE.into(),
        if pending && unschedulable {
            "false"
        } else {
            "true"
        }
        .into(),
    );
    out.complete = !out.fatal && anns.get(ann::POD_PHASE).map(String::as_str) == Some("Succeeded");
    out
}

/// Whether the worker pod goes once it is done.
pub fn delete_pod_when_done(anns: &BTreeMap<String, String>) -> bool {
    get(anns, ann::POD_RETAIN_AFTER_COMPLETION) != Some("true")
        || get(anns, ann::REQUIRES_SCRATCH) == Some("true")
}

#[cfg(test)]
mod tests;
