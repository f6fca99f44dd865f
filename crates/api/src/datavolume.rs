//! DataVolume: the user's request for a populated PersistentVolumeClaim.

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaimSpec, TypedLocalObjectReference, TypedObjectReference,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::enums::{
    ConditionStatus, ContentType, DataVolumeConditionReason, DataVolumeConditionType,
    DataVolumePhase, RegistryPullMethod,
};

/// DataVolumeSpec defines the DataVolume type specification.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "DataVolume",
    namespaced,
    status = "DataVolumeStatus",
    derive = "PartialEq",
    shortname = "dv",
    shortname = "dvs",
    category = "all",
    doc = "DataVolume is an abstraction on top of PersistentVolumeClaims to allow easy population of those PersistentVolumeClaims with relation to VirtualMachines",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "The phase the data volume is in"
    ),
    printcolumn(
        name = "Progress",
        type_ = "string",
        json_path = ".status.progress",
        description = "Transfer progress in percentage if known, N/A otherwise"
    ),
    printcolumn(
        name = "Restarts",
        type_ = "integer",
        json_path = ".status.restartCount",
        description = "The number of times the transfer has been restarted."
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSpec {
    /// Source is the src of the data for the requested DataVolume.
    pub source: Option<DataVolumeSource>,
    /// SourceRef is an indirect reference to the source of data for the requested DataVolume.
    pub source_ref: Option<DataVolumeSourceRef>,
    /// PVC is the PVC specification, used verbatim.
    pub pvc: Option<PersistentVolumeClaimSpec>,
    /// Storage is the requested storage specification, completed from the StorageProfile.
    pub storage: Option<StorageSpec>,
    /// PriorityClassName for Importer, Cloner and Uploader pod.
    pub priority_class_name: Option<String>,
    /// ServiceAccountName for Importer and Uploader pod.
    pub service_account_name: Option<String>,
    /// DataVolumeContentType options: "kubevirt", "archive".
    pub content_type: Option<ContentType>,
    /// Checkpoints is a list of DataVolumeCheckpoints, representing stages in a multistage import.
    pub checkpoints: Option<Vec<DataVolumeCheckpoint>>,
    /// FinalCheckpoint indicates whether the current DataVolumeCheckpoint is the final checkpoint.
    pub final_checkpoint: Option<bool>,
    /// Preallocation controls whether storage for DataVolumes should be allocated in advance.
    pub preallocation: Option<bool>,
}

/// StorageSpec defines the Storage type specification.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// AccessModes contains the desired access modes the volume should have.
    pub access_modes: Option<Vec<String>>,
    /// A label query over volumes to consider for binding.
    pub selector: Option<LabelSelector>,
    /// Resources represents the minimum resources the volume should have.
    pub resources: Option<VolumeResourceRequirements>,
    /// VolumeName is the binding reference to the PersistentVolume backing this claim.
    pub volume_name: Option<String>,
    /// Name of the StorageClass required by the claim.
    pub storage_class_name: Option<String>,
    /// volumeMode defines what type of volume is required by the claim ("Block", "Filesystem",
    /// or "FromStorageProfile").
    pub volume_mode: Option<String>,
    /// An existing VolumeSnapshot, PVC or populator object to create the volume from.
    pub data_source: Option<TypedLocalObjectReference>,
    /// The object from which to populate the volume with data.
    pub data_source_ref: Option<TypedObjectReference>,
}

/// The `volumeMode` value asking CDI to choose from the StorageProfile.
pub const VOLUME_MODE_FROM_STORAGE_PROFILE: &str = "FromStorageProfile";

/// DataVolumeCheckpoint defines a stage in a warm migration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct DataVolumeCheckpoint {
    /// Previous is the identifier of the snapshot from the previous checkpoint.
    pub previous: String,
    /// Current is the identifier of the snapshot created for this checkpoint.
    pub current: String,
}

/// DataVolumeSource represents the source for our Data Volume: exactly one kind is set.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSource {
    pub http: Option<DataVolumeSourceHttp>,
    pub s3: Option<DataVolumeSourceS3>,
    pub gcs: Option<DataVolumeSourceGcs>,
    pub registry: Option<DataVolumeSourceRegistry>,
    pub pvc: Option<DataVolumeSourcePvc>,
    pub upload: Option<DataVolumeSourceUpload>,
    pub blank: Option<DataVolumeBlankImage>,
    pub imageio: Option<DataVolumeSourceImageIo>,
    pub vddk: Option<DataVolumeSourceVddk>,
    pub snapshot: Option<DataVolumeSourceSnapshot>,
}

/// The kind of a source, named as its field in `spec.source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Http,
    S3,
    Gcs,
    Registry,
    Pvc,
    Upload,
    Blank,
    ImageIo,
    Vddk,
    Snapshot,
}

impl SourceKind {
    /// The field name in `spec.source`.
    pub const fn field(self) -> &'static str {
        match self {
            SourceKind::Http => "http",
            SourceKind::S3 => "s3",
            SourceKind::Gcs => "gcs",
            SourceKind::Registry => "registry",
            SourceKind::Pvc => "pvc",
            SourceKind::Upload => "upload",
            SourceKind::Blank => "blank",
            SourceKind::ImageIo => "imageio",
            SourceKind::Vddk => "vddk",
            SourceKind::Snapshot => "snapshot",
        }
    }
}

impl DataVolumeSource {
    /// The kinds that are set, in field order. Valid sources have exactly one.
    pub fn kinds(&self) -> Vec<SourceKind> {
        let set = [
            (self.http.is_some(), SourceKind::Http),
            (self.s3.is_some(), SourceKind::S3),
            (self.gcs.is_some(), SourceKind::Gcs),
            (self.registry.is_some(), SourceKind::Registry),
            (self.pvc.is_some(), SourceKind::Pvc),
            (self.upload.is_some(), SourceKind::Upload),
            (self.blank.is_some(), SourceKind::Blank),
            (self.imageio.is_some(), SourceKind::ImageIo),
            (self.vddk.is_some(), SourceKind::Vddk),
            (self.snapshot.is_some(), SourceKind::Snapshot),
        ];
        set.into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, k)| k)
            .collect()
    }
}

/// DataVolumeSourcePVC provides the parameters to create a Data Volume from an existing PVC.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct DataVolumeSourcePvc {
    /// The namespace of the source PVC.
    pub namespace: String,
    /// The name of the source PVC.
    pub name: String,
}

/// DataVolumeSourceSnapshot provides the parameters to create a Data Volume from an existing
/// VolumeSnapshot.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct DataVolumeSourceSnapshot {
    /// The namespace of the source VolumeSnapshot.
    pub namespace: String,
    /// The name of the source VolumeSnapshot.
    pub name: String,
}

/// DataVolumeBlankImage provides the parameters to create a new raw blank image for the PVC.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct DataVolumeBlankImage {}

/// DataVolumeSourceUpload provides the parameters to create a Data Volume by uploading the source.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct DataVolumeSourceUpload {}

/// DataVolumeSourceS3 provides the parameters to create a Data Volume from an S3 source.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSourceS3 {
    /// URL is the url of the S3 source.
    pub url: String,
    /// SecretRef provides the secret reference needed to access the S3 source.
    pub secret_ref: Option<String>,
    /// CertConfigMap is a configmap reference, containing a Certificate Authority(CA) public key.
    pub cert_config_map: Option<String>,
}

/// DataVolumeSourceGCS provides the parameters to create a Data Volume from a GCS source.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSourceGcs {
    /// URL is the url of the GCS source.
    pub url: String,
    /// SecretRef provides the secret reference needed to access the GCS source.
    pub secret_ref: Option<String>,
}

/// DataVolumeSourceRegistry provides the parameters to create a Data Volume from a registry
/// source.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSourceRegistry {
    /// URL is the url of the registry source (starting with the scheme: docker, oci-archive).
    pub url: Option<String>,
    /// ImageStream is the name of image stream for import.
    pub image_stream: Option<String>,
    /// PullMethod can be either "pod" (default import), or "node" (node docker cache based
    /// import).
    pub pull_method: Option<RegistryPullMethod>,
    /// SecretRef provides the secret reference needed to access the Registry source.
    pub secret_ref: Option<String>,
    /// CertConfigMap provides a reference to the Registry certs.
    pub cert_config_map: Option<String>,
    /// Platform describes the minimum runtime requirements of the image.
    pub platform: Option<PlatformOptions>,
}

/// PlatformOptions describes the minimum runtime requirements of an image.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct PlatformOptions {
    /// Architecture specifies the image target CPU architecture.
    pub architecture: Option<String>,
}

/// Registry URL scheme for a registry pull.
pub const REGISTRY_SCHEME_DOCKER: &str = "docker";
/// Registry URL scheme for an OCI archive.
pub const REGISTRY_SCHEME_OCI_ARCHIVE: &str = "oci-archive";

/// DataVolumeSourceHTTP can be either an http or https endpoint, with an optional basic auth
/// user name and password, and an optional configmap containing additional CAs.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSourceHttp {
    /// URL is the URL of the http(s) endpoint.
    pub url: String,
    /// SecretRef A Secret reference, the secret should contain accessKeyId (user name) base64
    /// encoded, and secretKey (password) also base64 encoded.
    pub secret_ref: Option<String>,
    /// CertConfigMap is a configmap reference, containing a Certificate Authority(CA) public key.
    pub cert_config_map: Option<String>,
    /// ExtraHeaders is a list of strings containing extra headers to include with HTTP transfer
    /// requests.
    pub extra_headers: Option<Vec<String>>,
    /// SecretExtraHeaders is a list of Secret references, each containing an extra HTTP header
    /// that may include sensitive information.
    pub secret_extra_headers: Option<Vec<String>>,
    /// Checksum is the expected checksum of the downloaded file, "algorithm:hex" with md5, sha1,
    /// sha256 or sha512.
    pub checksum: Option<String>,
    /// InsecureSkipVerify is a flag to skip certificate verification.
    pub insecure_skip_verify: Option<bool>,
}

/// DataVolumeSourceImageIO provides the parameters to create a Data Volume from an imageio
/// source.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSourceImageIo {
    /// URL is the URL of the ovirt-engine.
    pub url: String,
    /// DiskID provides id of a disk to be imported.
    #[serde(rename = "diskId")]
    pub disk_id: String,
    /// SecretRef provides the secret reference needed to access the ovirt-engine.
    pub secret_ref: Option<String>,
    /// CertConfigMap provides a reference to the CA cert.
    pub cert_config_map: Option<String>,
    /// InsecureSkipVerify is a flag to skip certificate verification.
    pub insecure_skip_verify: Option<bool>,
}

/// DataVolumeSourceVDDK provides the parameters to create a Data Volume from a VMware source.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSourceVddk {
    /// URL is the URL of the vCenter or ESXi host with the VM to migrate.
    pub url: Option<String>,
    /// UUID is the UUID of the virtual machine that the backing file is attached to.
    pub uuid: Option<String>,
    /// BackingFile is the path to the virtual hard disk to migrate from vCenter/ESXi.
    pub backing_file: Option<String>,
    /// Thumbprint is the certificate thumbprint of the vCenter or ESXi host.
    pub thumbprint: Option<String>,
    /// SecretRef provides a reference to a secret containing the username and password.
    pub secret_ref: Option<String>,
    /// CertConfigMap is a reference to a ConfigMap containing the host's CA certificate.
    pub cert_config_map: Option<String>,
    /// InitImageURL is an optional URL to an image containing an extracted VDDK library.
    #[serde(rename = "initImageURL")]
    pub init_image_url: Option<String>,
    /// ExtraArgs is a reference to a ConfigMap containing extra arguments for the VDDK library.
    pub extra_args: Option<String>,
}

/// DataVolumeSourceRef defines an indirect reference to the source of data for the DataVolume.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct DataVolumeSourceRef {
    /// The kind of the source reference, currently only "DataSource" is supported.
    pub kind: String,
    /// The namespace of the source reference, defaults to the DataVolume namespace.
    pub namespace: Option<String>,
    /// The name of the source reference.
    pub name: String,
}

/// The only `sourceRef.kind` upstream supports.
pub const SOURCE_REF_KIND_DATA_SOURCE: &str = "DataSource";

/// DataVolumeStatus contains the current status of the DataVolume.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeStatus {
    /// ClaimName is the name of the underlying PVC used by the DataVolume.
    pub claim_name: Option<String>,
    /// Phase is the current phase of the data volume.
    pub phase: Option<DataVolumePhase>,
    /// Transfer progress: "NN.NN%", or "N/A" when unknown.
    pub progress: Option<String>,
    /// RestartCount is the number of times the pod populating the DataVolume has restarted.
    pub restart_count: Option<i32>,
    pub conditions: Option<Vec<DataVolumeCondition>>,
}

/// DataVolumeCondition represents the state of a data volume condition.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeCondition {
    /// Type of condition: Ready, Bound or Running.
    #[serde(rename = "type")]
    pub type_: DataVolumeConditionType,
    /// Status of the condition, one of True, False, Unknown.
    pub status: ConditionStatus,
    pub last_transition_time: Option<Time>,
    pub last_heartbeat_time: Option<Time>,
    /// Reason for the condition's last transition.
    pub reason: Option<DataVolumeConditionReason>,
    /// Human-readable message indicating details about last transition.
    pub message: Option<String>,
}

/// A DataVolume as embedded in other objects (a VirtualMachine's `dataVolumeTemplates`, a
/// DataImportCron's `template`): `apiVersion`/`kind` optional, `status` kept as given.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeTemplateSpec {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "is_empty_meta")]
    pub metadata: ObjectMeta,
    pub spec: DataVolumeSpec,
    pub status: Option<DataVolumeStatus>,
}

fn is_empty_meta(meta: &ObjectMeta) -> bool {
    *meta == ObjectMeta::default()
}

impl DataVolume {
    /// The DataVolume's `status.phase`, if any.
    pub fn phase(&self) -> Option<&DataVolumePhase> {
        self.status.as_ref().and_then(|s| s.phase.as_ref())
    }
}
