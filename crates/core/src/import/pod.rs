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
