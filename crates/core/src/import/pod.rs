//! The importer pod (upstream's `makeImporterPodSpec`): its environment from the claim's
//! annotations, the volumes its source needs (certificates, extra headers, a GCS key, scratch)
//! and its container, on the spec every worker pod shares.

use std::collections::BTreeMap;

use cdi_api::{ann, env, label};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, PersistentVolumeClaim, Pod, SecretKeySelector,
    Volume, VolumeDevice, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::claim::{annotations, get, owner_uid, pod_name};
use super::scratch::{SCRATCH_MOUNT, SCRATCH_VOLUME_NAME, scratch_name};
use super::settings::Settings;
use super::worker::{
    BLOCK_DEVICE, DATA_MOUNT, DATA_VOLUME_NAME, METRICS_PORT, METRICS_PORT_NAME, controlled_by,
    var, worker_pod_annotations, worker_pod_spec, worker_security_context,
};

pub const CERT_DIR: &str = "/certs";

/// Where a GCS source's Secret is mounted, and the key file in it (upstream's paths).
pub const GOOGLE_CREDENTIALS_DIR: &str = "/google";

pub const GOOGLE_CREDENTIALS_FILE: &str = "/google/credentials.json";

/// The GCS Secret's volume (upstream's `SecretVolName`).
const SECRET_VOLUME_NAME: &str = "cdi-secret-vol";

/// The importer's container name, also its component label value.
pub const CONTAINER: &str = "importer";

/// The importer pod for `claim` (upstream's `makeImporterPodSpec`): owned by the claim,
/// restartPolicy OnFailure, restricted security context, the claim at `/data` or as the block
/// device, upstream's environment built from the claim's annotations.
pub fn importer_pod(claim: &PersistentVolumeClaim, s: &Settings) -> Pod {
    let anns = annotations(claim);
    let source = match get(&anns, ann::IMPORT_SOURCE) {
        Some(src) if !src.is_empty() => src.to_string(),
        _ => "http".into(),
    };
    let secret = get(&anns, ann::IMPORT_SECRET).unwrap_or("").to_string();
    let mut parts = Parts {
        envs: environment(claim, &anns, &source, s),
        volumes: vec![claim_volume(
            DATA_VOLUME_NAME,
            claim.metadata.name.clone().unwrap_or_default(),
        )],
        mounts: Vec::new(),
    };
    if !secret.is_empty() && source != "gcs" {
        parts
            .envs
            .push(secret_var(env::ACCESS_KEY_ID, &secret, "accessKeyId"));
        parts
            .envs
            .push(secret_var(env::SECRET_KEY, &secret, "secretKey"));
    }
    parts.add_certificates(&anns);
    parts.add_extra_headers(&anns);
    // A GCS key is a file (upstream's mount and variable), not key/secret variables.
    if !secret.is_empty() && source == "gcs" {
        parts.add_gcs_key(secret);
    }
    if get(&anns, ann::REQUIRES_SCRATCH) == Some("true") {
        parts.add_scratch(claim);
    }
    let container = container(claim, s, parts.envs, parts.mounts);
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(claim)),
            namespace: claim.metadata.namespace.clone(),
            annotations: Some(worker_pod_annotations(&anns, ann::CREATED_BY)),
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
        spec: Some(worker_pod_spec(claim, s, vec![container], parts.volumes)),
        status: None,
    }
}

/// The importer's environment from the claim's annotations and the cluster settings: what to
/// import from and how, where progress goes, the proxy, checkpoints, preallocation.
fn environment(
    claim: &PersistentVolumeClaim,
    anns: &BTreeMap<String, String>,
    source: &str,
    s: &Settings,
) -> Vec<EnvVar> {
    let a = |k: &str| get(anns, k).unwrap_or("").to_string();
    let size = claim
        .spec
        .as_ref()
        .and_then(|sp| sp.resources.as_ref()?.requests.as_ref()?.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_default();
    let preallocation = match get(anns, ann::PREALLOCATION_REQUESTED) {
        Some(v) => v == "true",
        None => s.preallocation,
    };
    let proxy = s.import_proxy.clone().unwrap_or_default();
    vec![
        var(env::SOURCE, source),
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
    ]
}

/// What the importer gets beyond its base environment, in the order it gets it: variables,
/// the pod's volumes and the container's mounts (the claim's own mount or device aside).
struct Parts {
    envs: Vec<EnvVar>,
    volumes: Vec<Volume>,
    mounts: Vec<VolumeMount>,
}

impl Parts {
    /// A volume mounted at `path` in the container.
    fn mount(&mut self, volume: Volume, path: String, read_only: Option<bool>) {
        self.mounts.push(VolumeMount {
            name: volume.name.clone(),
            mount_path: path,
            read_only,
            ..Default::default()
        });
        self.volumes.push(volume);
    }

    /// The ConfigMap of certificates the source is checked against.
    fn add_certificates(&mut self, anns: &BTreeMap<String, String>) {
        let cert_map = get(anns, ann::IMPORT_CERT_CONFIG_MAP).unwrap_or("");
        if cert_map.is_empty() {
            return;
        }
        self.envs.push(var(env::CERT_DIR, CERT_DIR));
        let volume = Volume {
            name: "cdi-cert-vol".into(),
            config_map: Some(k8s_openapi::api::core::v1::ConfigMapVolumeSource {
                name: cert_map.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.mount(volume, CERT_DIR.into(), None);
    }

    /// Extra request headers: plain ones as variables, those in Secrets mounted in order.
    fn add_extra_headers(&mut self, anns: &BTreeMap<String, String>) {
        for (i, header) in indexed(anns, ann::IMPORT_EXTRA_HEADERS_PREFIX)
            .into_iter()
            .enumerate()
        {
            self.envs
                .push(var(&format!("{}{i}", env::EXTRA_HEADER_PREFIX), header));
        }
        for (i, secret) in indexed(anns, ann::IMPORT_SECRET_EXTRA_HEADERS_PREFIX)
            .into_iter()
            .enumerate()
        {
            let volume = secret_volume(format!("sec-extra-header-{i}"), secret);
            self.mount(volume, format!("/extraheaders/{i}"), Some(true));
        }
    }

    /// A GCS source's Secret, mounted where upstream mounts it, its key file named by a variable.
    fn add_gcs_key(&mut self, secret: String) {
        self.envs
            .push(var(env::GOOGLE_CREDENTIALS, GOOGLE_CREDENTIALS_FILE));
        let volume = secret_volume(SECRET_VOLUME_NAME.into(), secret);
        self.mount(volume, GOOGLE_CREDENTIALS_DIR.into(), Some(true));
    }

    /// The scratch claim the importer asked for.
    fn add_scratch(&mut self, claim: &PersistentVolumeClaim) {
        let volume = claim_volume(SCRATCH_VOLUME_NAME, scratch_name(claim));
        self.mount(volume, SCRATCH_MOUNT.into(), None);
    }
}

/// A volume of the claim `claim_name`, writable.
fn claim_volume(name: &str, claim_name: String) -> Volume {
    Volume {
        name: name.into(),
        persistent_volume_claim: Some(
            k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource {
                claim_name,
                read_only: Some(false),
            },
        ),
        ..Default::default()
    }
}

/// A volume of the Secret `secret`.
fn secret_volume(name: String, secret: String) -> Volume {
    Volume {
        name,
        secret: Some(k8s_openapi::api::core::v1::SecretVolumeSource {
            secret_name: Some(secret),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The importer container: the claim as a block device or mounted at `/data` (before the other
/// mounts), the metrics port, the restricted security context.
fn container(
    claim: &PersistentVolumeClaim,
    s: &Settings,
    envs: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
) -> Container {
    let block = claim.spec.as_ref().and_then(|sp| sp.volume_mode.as_deref()) == Some("Block");
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
    Container {
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
    }
}

/// Upstream's `IsInsecureTLS`: a `docker://` image whose registry (host[:port], as written)
/// is listed in CDIConfig's `insecureRegistries`.
pub(super) fn insecure_registry(endpoint: &str, insecure: &[String]) -> bool {
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
