//! Annotation keys, label keys, finalizers, feature gates and importer environment names.
//!
//! Upstream CDI's controllers talk to each other through annotations on the PVC. These keys are
//! part of the compatibility contract: they live here once and are referred to by name.

/// Annotation keys (`metadata.annotations`).
pub mod ann {
    // --- What to import (DataVolume spec → PVC; read to build the importer environment) ---
    /// Source kind: `http`, `s3`, `gcs`, `registry`, `imageio`, `vddk`, `none` (blank).
    pub const IMPORT_SOURCE: &str = "cdi.kubevirt.io/storage.import.source";
    pub const IMPORT_ENDPOINT: &str = "cdi.kubevirt.io/storage.import.endpoint";
    pub const IMPORT_SECRET: &str = "cdi.kubevirt.io/storage.import.secretName";
    pub const IMPORT_CERT_CONFIG_MAP: &str = "cdi.kubevirt.io/storage.import.certConfigMap";
    pub const IMPORT_INSECURE_SKIP_VERIFY: &str =
        "cdi.kubevirt.io/storage.import.insecureSkipVerify";
    /// Followed by `.N`, one per header.
    pub const IMPORT_EXTRA_HEADERS_PREFIX: &str = "cdi.kubevirt.io/storage.import.extraHeaders";
    /// Followed by `.N`, one per secret holding a header.
    pub const IMPORT_SECRET_EXTRA_HEADERS_PREFIX: &str =
        "cdi.kubevirt.io/storage.import.secretExtraHeaders";
    pub const IMPORT_CHECKSUM: &str = "cdi.kubevirt.io/storage.import.checksum";
    pub const REGISTRY_IMPORT_METHOD: &str = "cdi.kubevirt.io/storage.import.registryImportMethod";
    pub const REGISTRY_IMAGE_STREAM: &str = "cdi.kubevirt.io/storage.import.registryImageStream";
    pub const REGISTRY_IMAGE_ARCHITECTURE: &str =
        "cdi.kubevirt.io/storage.import.registryImageArchitecture";
    pub const DISK_ID: &str = "cdi.kubevirt.io/storage.import.diskId";
    pub const UUID: &str = "cdi.kubevirt.io/storage.import.uuid";
    pub const BACKING_FILE: &str = "cdi.kubevirt.io/storage.import.backingFile";
    pub const THUMBPRINT: &str = "cdi.kubevirt.io/storage.import.vddk.thumbprint";
    pub const VDDK_INIT_IMAGE_URL: &str = "cdi.kubevirt.io/storage.pod.vddk.initimageurl";
    pub const VDDK_EXTRA_ARGS: &str = "cdi.kubevirt.io/storage.pod.vddk.extraargs";
    pub const VDDK_VERSION: &str = "cdi.kubevirt.io/storage.pod.vddk.version";
    pub const VDDK_HOST: &str = "cdi.kubevirt.io/storage.pod.vddk.host";
    /// `kubevirt` or `archive`.
    pub const CONTENT_TYPE: &str = "cdi.kubevirt.io/storage.contentType";
    pub const UPLOAD_REQUEST: &str = "cdi.kubevirt.io/storage.upload.target";
    /// `"<namespace>/<name>"` of a host-assisted clone source.
    pub const CLONE_REQUEST: &str = "k8s.io/CloneRequest";
    pub const CLONE_OF: &str = "k8s.io/CloneOf";

    // --- Worker pod state (controller that owns the pod → PVC; DataVolume controller reads) ---
    pub const POD_PHASE: &str = "cdi.kubevirt.io/storage.pod.phase";
    pub const POD_READY: &str = "cdi.kubevirt.io/storage.pod.ready";
    pub const POD_RESTARTS: &str = "cdi.kubevirt.io/storage.pod.restarts";
    pub const POD_SCHEDULABLE: &str = "cdi.kubevirt.io/storage.pod.schedulable";
    pub const RUNNING_CONDITION: &str = "cdi.kubevirt.io/storage.condition.running";
    pub const RUNNING_CONDITION_MESSAGE: &str = "cdi.kubevirt.io/storage.condition.running.message";
    pub const RUNNING_CONDITION_REASON: &str = "cdi.kubevirt.io/storage.condition.running.reason";
    pub const BOUND_CONDITION: &str = "cdi.kubevirt.io/storage.condition.bound";
    pub const BOUND_CONDITION_MESSAGE: &str = "cdi.kubevirt.io/storage.condition.bound.message";
    pub const BOUND_CONDITION_REASON: &str = "cdi.kubevirt.io/storage.condition.bound.reason";
    pub const SOURCE_RUNNING_CONDITION: &str = "cdi.kubevirt.io/storage.condition.source.running";
    pub const SOURCE_RUNNING_CONDITION_MESSAGE: &str =
        "cdi.kubevirt.io/storage.condition.source.running.message";
    pub const SOURCE_RUNNING_CONDITION_REASON: &str =
        "cdi.kubevirt.io/storage.condition.source.running.reason";
    /// `"true"`: do not retry (for example a checksum mismatch); the DataVolume fails.
    pub const IMPORT_FATAL_ERROR: &str = "cdi.kubevirt.io/storage.import.fatalError";
    pub const IMPORT_POD_NAME: &str = "cdi.kubevirt.io/storage.import.importPodName";
    pub const UPLOAD_POD_NAME: &str = "cdi.kubevirt.io/storage.uploadPodName";
    pub const CLONE_SOURCE_POD_NAME: &str = "cdi.kubevirt.io/storage.sourceClonePodName";
    pub const CREATED_BY: &str = "cdi.kubevirt.io/storage.createdByController";
    pub const CREATED_BY_UPLOAD: &str = "cdi.kubevirt.io/storage.createdByUploadController";
    pub const UPLOAD_CLIENT_NAME: &str = "cdi.kubevirt.io/uploadClientName";

    // --- Worker pod behaviour ---
    pub const POD_RETAIN_AFTER_COMPLETION: &str =
        "cdi.kubevirt.io/storage.pod.retainAfterCompletion";
    pub const PRIORITY_CLASS_NAME: &str = "cdi.kubevirt.io/storage.pod.priorityclassname";
    pub const POD_SERVICE_ACCOUNT_NAME: &str = "cdi.kubevirt.io/storage.pod.serviceAccountName";
    pub const REQUIRES_SCRATCH: &str = "cdi.kubevirt.io/storage.import.requiresScratch";
    pub const REQUIRES_DIRECT_IO: &str = "cdi.kubevirt.io/storage.import.requiresDirectIo";
    pub const POD_MULTUS_NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
    pub const POD_MULTUS_DEFAULT_NETWORK: &str = "v1.multus-cni.io/default-network";
    pub const POD_SIDECAR_INJECTION_ISTIO: &str = "sidecar.istio.io/inject";
    pub const POD_SIDECAR_INJECTION_LINKERD: &str = "linkerd.io/inject";
    pub const OPEN_DEFAULT_PORTS: &str = "k8s.ovn.org/open-default-ports";

    // --- Binding, WaitForFirstConsumer, populators ---
    /// Presence means: do not honor WaitForFirstConsumer for this claim.
    pub const IMMEDIATE_BINDING: &str = "cdi.kubevirt.io/storage.bind.immediate.requested";
    /// Set by the scheduler on a WaitForFirstConsumer claim.
    pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
    /// DataVolume override; `"false"` disables the populator path.
    pub const USE_POPULATOR: &str = "cdi.kubevirt.io/storage.usePopulator";
    /// On a claim whose DataVolume is deleted once complete (garbage collection).
    pub const DELETE_AFTER_COMPLETION: &str = "cdi.kubevirt.io/storage.deleteAfterCompletion";
    pub const POPULATOR_KIND: &str = "cdi.kubevirt.io/storage.populator.kind";
    pub const PVC_PRIME_NAME: &str = "cdi.kubevirt.io/storage.populator.pvcPrime";
    pub const POPULATOR_PROGRESS: &str = "cdi.kubevirt.io/storage.populator.progress";
    pub const EXTERNAL_POPULATION: &str = "cdi.kubevirt.io/externalPopulation";
    pub const CLONE_PHASE: &str = "cdi.kubevirt.io/clonePhase";
    pub const CLONE_ERROR: &str = "cdi.kubevirt.io/cloneError";
    pub const CLONE_FALLBACK_REASON: &str = "cdi.kubevirt.io/cloneFallbackReason";
    pub const DATA_SOURCE_NAMESPACE: &str = "cdi.kubevirt.io/dataSourceNamespace";
    pub const CLONE_TYPE: &str = "cdi.kubevirt.io/cloneType";
    pub const EVENT_SOURCE_KIND: &str = "cdi.kubevirt.io/events.source.kind";
    pub const EVENT_SOURCE: &str = "cdi.kubevirt.io/events.source";
    pub const CLONE_TOKEN: &str = "cdi.kubevirt.io/storage.clone.token";
    pub const EXTENDED_CLONE_TOKEN: &str = "cdi.kubevirt.io/storage.extended.clone.token";
    pub const PERMISSIVE_CLONE: &str = "cdi.kubevirt.io/permissiveClone";
    pub const OWNER_UID: &str = "cdi.kubevirt.io/ownerUID";
    pub const OWNER_REF: &str = "cdi.kubevirt.io/storage.ownerRef";
    pub const OWNED_BY_DATA_VOLUME: &str = "cdi.kubevirt.io/ownedByDataVolume";
    pub const CSI_CLONE_REQUEST: &str = "cdi.kubevirt.io/CSICloneRequest";
    pub const SMART_CLONE_REQUEST: &str = "k8s.io/SmartCloneRequest";
    pub const SMART_CLONE_SNAPSHOT: &str = "cdi.kubevirt.io/smartCloneSnapshot";
    /// Upstream's key carries this typo; it must stay as it is.
    pub const VIRTUAL_SIZE: &str = "cdi.Kubervirt.io/virtualSize";
    /// Upstream's key carries this typo; it must stay as it is.
    pub const SOURCE_CAPACITY: &str = "cdi.Kubervirt.io/sourceCapacity";

    // --- Adoption and pre-population ---
    pub const POPULATED_FOR: &str = "cdi.kubevirt.io/storage.populatedFor";
    pub const PRE_POPULATED: &str = "cdi.kubevirt.io/storage.prePopulated";
    pub const CHECK_STATIC_VOLUME: &str = "cdi.kubevirt.io/storage.checkStaticVolume";
    pub const PERSISTENT_VOLUME_LIST: &str = "cdi.kubevirt.io/storage.persistentVolumeList";
    pub const ALLOW_CLAIM_ADOPTION: &str = "cdi.kubevirt.io/allowClaimAdoption";
    pub const CREATED_FOR_DATA_VOLUME: &str = "cdi.kubevirt.io/createdForDataVolume";

    // --- Preallocation, multi-stage, misc ---
    pub const PREALLOCATION_REQUESTED: &str = "cdi.kubevirt.io/storage.preallocation.requested";
    pub const PREALLOCATION_APPLIED: &str = "cdi.kubevirt.io/storage.preallocation";
    pub const PREVIOUS_CHECKPOINT: &str = "cdi.kubevirt.io/storage.checkpoint.previous";
    pub const CURRENT_CHECKPOINT: &str = "cdi.kubevirt.io/storage.checkpoint.current";
    pub const FINAL_CHECKPOINT: &str = "cdi.kubevirt.io/storage.checkpoint.final";
    /// Followed by `.<checkpoint>`.
    pub const CHECKPOINTS_COPIED_PREFIX: &str = "cdi.kubevirt.io/storage.checkpoint.copied";
    pub const CURRENT_POD_ID: &str = "cdi.kubevirt.io/storage.checkpoint.pod.id";
    pub const MULTISTAGE_IMPORT_DONE: &str = "cdi.kubevirt.io/storage.checkpoint.done";
    pub const SOURCE_VOLUME_MODE: &str = "cdi.kubevirt.io/storage.import.sourceVolumeMode";
    pub const ADVISED_RESTORE_SIZE: &str = "cdi.kubevirt.io/storage.import.advisedRestoreSize";
    pub const CONFIG_AUTHORITY: &str = "cdi.kubevirt.io/configAuthority";
    pub const CUSTOMIZER_IDENTIFIER: &str = "cdi.kubevirt.io/customizer-identifier";
    pub const OBJECT_TRANSFER_NAME: &str = "cdi.kubevirt.io/objectTransferName";

    // --- StorageClass and StorageProfile ---
    /// On a StorageClass: `copy`, `snapshot` or `csi-clone`.
    pub const CLONE_STRATEGY: &str = "cdi.kubevirt.io/clone-strategy";
    pub const DEFAULT_STORAGE_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
    pub const DEFAULT_VIRT_STORAGE_CLASS: &str = "storageclass.kubevirt.io/is-default-virt-class";
    pub const DEFAULT_SNAPSHOT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";
    pub const MINIMUM_SUPPORTED_PVC_SIZE: &str = "cdi.kubevirt.io/minimumSupportedPvcSize";
    pub const USE_READ_WRITE_ONCE_FOR_DATA_IMPORT_CRON: &str =
        "cdi.kubevirt.io/useReadWriteOnceForDataImportCron";
    pub const SNAPSHOT_CLASS_FOR_DATA_IMPORT_CRON: &str =
        "cdi.kubevirt.io/snapshotClassForDataImportCron";

    /// The annotation key for the `n`th extra header (`…extraHeaders.N`).
    pub fn extra_header(n: usize) -> String {
        format!("{IMPORT_EXTRA_HEADERS_PREFIX}.{n}")
    }

    /// The annotation key for the `n`th secret extra header (`…secretExtraHeaders.N`).
    pub fn secret_extra_header(n: usize) -> String {
        format!("{IMPORT_SECRET_EXTRA_HEADERS_PREFIX}.{n}")
    }
}

/// cdi-rs's own annotations, for what upstream does not have: under `cdi-rs.dev/`, never
/// `cdi.kubevirt.io/`, so they cannot collide with a future upstream key.
pub mod ext {
    /// On a DataVolume or CDIConfig: `"cdi"` places worker pods as upstream does (only the CDI
    /// resource's `spec.workload`), without the first consumer's tolerations.
    pub const WORKER_PLACEMENT: &str = "cdi-rs.dev/worker-placement";
    /// On a claim: the tolerations its worker pods inherited from the consumer that bound it
    /// (JSON), kept when the consumer is gone.
    pub const WORKER_TOLERATIONS: &str = "cdi-rs.dev/worker-tolerations";
    /// On a DataVolume: a pod scheduling template (YAML or JSON); cdi-rs runs a temporary pod
    /// with it that binds the WaitForFirstConsumer claim where the template places it.
    pub const FIRST_CONSUMER: &str = "cdi-rs.dev/first-consumer";
    /// Label on that temporary pod: the DataVolume it binds the claim for.
    pub const FIRST_CONSUMER_FOR: &str = "cdi-rs.dev/first-consumer-for";
    /// On a clone target: the VolumeSnapshotClass chosen with the snapshot strategy (upstream
    /// looks it up again when it takes the snapshot; here it is chosen once, with the strategy).
    pub const CLONE_SNAPSHOT_CLASS: &str = "cdi-rs.dev/clone-snapshot-class";
}

/// Label keys and fixed label values (`metadata.labels`).
pub mod label {
    pub const APP: &str = "app";
    pub const APP_VALUE: &str = "containerized-data-importer";
    /// `cdi.kubevirt.io=<component>` on CDI's worker pods and services.
    pub const COMPONENT: &str = "cdi.kubevirt.io";
    pub const IMPORTER_COMPONENT: &str = "importer";
    pub const UPLOAD_SERVER_COMPONENT: &str = "cdi-upload-server";
    pub const CLONE_SOURCE_COMPONENT: &str = "cdi-clone-source";
    pub const POPULATOR_PREP_COMPONENT: &str = "cdi-populator-prep";
    /// The claim a snapshot is restored into for a host-assisted copy of it.
    pub const SNAPSHOT_FALLBACK_COMPONENT: &str =
        "cdi-clone-from-snapshot-source-host-assisted-fallback-pvc";
    /// Pods scraped for progress.
    pub const PROMETHEUS: &str = "prometheus.cdi.kubevirt.io";
    pub const UPLOAD_TARGET: &str = "cdi.kubevirt.io/uploadTarget";
    pub const DATA_IMPORT_CRON: &str = "cdi.kubevirt.io/dataImportCron";
    pub const APPLY_STORAGE_PROFILE: &str = "cdi.kubevirt.io/applyStorageProfile";
    pub const OWNED_BY_UID: &str = "cdi.kubevirt.io/OwnedByUID";
    /// Suppresses the "volume filling up" alert on Filesystem claims, whose disk image fills them.
    pub const KUBE_PERSISTENT_VOLUME_FILLING_UP_SUPPRESS: &str =
        "alerts.k8s.io/KubePersistentVolumeFillingUp";
    pub const KUBE_PERSISTENT_VOLUME_FILLING_UP_SUPPRESS_VALUE: &str = "disabled";
    /// On PVC prime, scratch and temporary claims.
    pub const EXCLUDE_FROM_VELERO_BACKUP: &str = "velero.io/exclude-from-backup";
    pub const DYNAMIC_CREDENTIALS_SUPPORT: &str = "kubevirt.io/dynamic-credentials-support";
    pub const DEFAULT_INSTANCETYPE: &str = "instancetype.kubevirt.io/default-instancetype";
    pub const DEFAULT_INSTANCETYPE_KIND: &str =
        "instancetype.kubevirt.io/default-instancetype-kind";
    pub const DEFAULT_PREFERENCE: &str = "instancetype.kubevirt.io/default-preference";
    pub const DEFAULT_PREFERENCE_KIND: &str = "instancetype.kubevirt.io/default-preference-kind";
}

/// Finalizers CDI puts on objects.
pub mod finalizer {
    pub const IMPORT_IMAGE_STREAM: &str = "cdi.kubevirt.io/importImageStream";
    pub const CLONE_SOURCE: &str = "cdi.kubevirt.io/cloneSource";
    pub const DATA_VOLUME: &str = "cdi.kubevirt.io/dataVolumeFinalizer";
    pub const CLONE_POPULATOR: &str = "cdi.kubevirt.io/clonePopulator";
    pub const OBJECT_TRANSFER: &str = "cdi.kubevirt.io/objectTransfer";
}

/// Feature gates named in `CDIConfig.spec.featureGates`.
pub mod gate {
    /// Do not start worker pods on unbound WaitForFirstConsumer claims.
    pub const HONOR_WAIT_FOR_FIRST_CONSUMER: &str = "HonorWaitForFirstConsumer";
    pub const DATA_VOLUME_CLAIM_ADOPTION: &str = "DataVolumeClaimAdoption";
    /// Deprecated upstream (always on); `webhookPvcRendering: Disabled` turns it off.
    pub const WEBHOOK_PVC_RENDERING: &str = "WebhookPvcRendering";
    pub const BOOTC_IMAGE_IMPORT: &str = "BootcImageImport";
}

/// Environment variable names of the importer pod, as upstream's importer reads them.
pub mod env {
    pub const SOURCE: &str = "IMPORTER_SOURCE";
    pub const ENDPOINT: &str = "IMPORTER_ENDPOINT";
    pub const CONTENT_TYPE: &str = "IMPORTER_CONTENTTYPE";
    pub const IMAGE_SIZE: &str = "IMPORTER_IMAGE_SIZE";
    pub const OWNER_UID: &str = "OWNER_UID";
    pub const FILESYSTEM_OVERHEAD: &str = "FILESYSTEM_OVERHEAD";
    pub const INSECURE_TLS: &str = "INSECURE_TLS";
    pub const CHECKSUM: &str = "IMPORTER_CHECKSUM";
    pub const PREALLOCATION: &str = "PREALLOCATION";
    pub const ACCESS_KEY_ID: &str = "IMPORTER_ACCESS_KEY_ID";
    pub const SECRET_KEY: &str = "IMPORTER_SECRET_KEY";
    pub const CERT_DIR: &str = "IMPORTER_CERT_DIR";
    pub const REGISTRY_IMAGE_ARCHITECTURE: &str = "IMPORTER_REGISTRY_IMAGE_ARCHITECTURE";
    /// A GCS source's service-account key file (the Secret mounted at `/google`).
    pub const GOOGLE_CREDENTIALS: &str = "GOOGLE_APPLICATION_CREDENTIALS";
    /// Followed by a number: `IMPORTER_EXTRA_HEADER_0`, …
    pub const EXTRA_HEADER_PREFIX: &str = "IMPORTER_EXTRA_HEADER_";
    pub const HTTP_PROXY: &str = "http_proxy";
    pub const HTTPS_PROXY: &str = "https_proxy";
    pub const NO_PROXY: &str = "no_proxy";
}

/// Well-known object names.
pub mod name {
    /// The singleton CDIConfig.
    pub const CDI_CONFIG: &str = "config";
    /// Prefix of the importer pod name: `importer-<pvc>`.
    pub const IMPORTER_POD_PREFIX: &str = "importer";
    /// Prefix of PVC prime: `prime-<target pvc uid>`.
    pub const PVC_PRIME_PREFIX: &str = "prime";
    /// Prefix of the VolumeImportSource a DataVolume creates: `volume-import-source-<dv uid>`.
    pub const VOLUME_IMPORT_SOURCE_PREFIX: &str = "volume-import-source";
    pub const VOLUME_UPLOAD_SOURCE_PREFIX: &str = "volume-upload-source";
    pub const VOLUME_CLONE_SOURCE_PREFIX: &str = "volume-clone-source";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexed_header_keys_follow_upstream() {
        assert_eq!(
            ann::extra_header(0),
            "cdi.kubevirt.io/storage.import.extraHeaders.0"
        );
        assert_eq!(
            ann::secret_extra_header(3),
            "cdi.kubevirt.io/storage.import.secretExtraHeaders.3"
        );
    }
}
