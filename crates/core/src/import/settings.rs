//! The cluster settings an importer pod is made with: the controller's own, CDIConfig's
//! effective values for the claim's class, and the CDI resource's placement.

use cdi_api::config::{CDIConfig, ImportProxy, NodePlacement};
use k8s_openapi::api::core::v1::{
    LocalObjectReference, PersistentVolumeClaim, ResourceRequirements, Toleration,
};

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
