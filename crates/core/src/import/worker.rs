//! What every worker pod of a claim shares (the importer's, the upload server's, the clone
//! pods', the first consumer's): where the claim is attached, the metrics port, annotations,
//! the pod spec, the restricted security context, owner references and plain variables.

use std::collections::BTreeMap;

use cdi_api::ann;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, PersistentVolumeClaim, PodSecurityContext, PodSpec,
    SeccompProfile, SecurityContext, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::claim::{annotations, get};
use super::settings::Settings;

/// Where the importer finds its volume.
pub const DATA_MOUNT: &str = "/data";

pub const BLOCK_DEVICE: &str = "/dev/cdi-block-volume";

pub const DATA_VOLUME_NAME: &str = "cdi-data-vol";

/// The metrics port's name; controllers scrape progress from it.
pub const METRICS_PORT_NAME: &str = "metrics";

pub const METRICS_PORT: i32 = 8443;

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
