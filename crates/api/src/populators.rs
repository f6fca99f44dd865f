//! Volume populator sources referenced by a PVC's `spec.dataSourceRef`.

use k8s_openapi::api::core::v1::TypedLocalObjectReference;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::datavolume::{
    DataVolumeBlankImage, DataVolumeCheckpoint, DataVolumeSourceGcs, DataVolumeSourceHttp,
    DataVolumeSourceImageIo, DataVolumeSourceRegistry, DataVolumeSourceS3, DataVolumeSourceVddk,
};
use crate::enums::ContentType;

/// `dataSourceRef.kind` of an import populator source.
pub const VOLUME_IMPORT_SOURCE_KIND: &str = "VolumeImportSource";
/// `dataSourceRef.kind` of an upload populator source.
pub const VOLUME_UPLOAD_SOURCE_KIND: &str = "VolumeUploadSource";
/// `dataSourceRef.kind` of a clone populator source.
pub const VOLUME_CLONE_SOURCE_KIND: &str = "VolumeCloneSource";

/// VolumeImportSourceSpec defines the Spec field for VolumeImportSource.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "VolumeImportSource",
    namespaced,
    status = "VolumeImportSourceStatus",
    derive = "PartialEq",
    doc = "VolumeImportSource works as a specification to populate PersistentVolumeClaims with data imported from an HTTP/S3/Registry/Blank/ImageIO/VDDK source"
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeImportSourceSpec {
    /// Source is the src of the data to be imported in the target PVC.
    pub source: Option<ImportSourceType>,
    /// Preallocation controls whether storage for the target PVC should be allocated in advance.
    pub preallocation: Option<bool>,
    /// ContentType represents the type of the imported data (Kubevirt or archive).
    pub content_type: Option<ContentType>,
    /// TargetClaim the name of the specific claim to be populated with a multistage import.
    pub target_claim: Option<String>,
    /// Checkpoints is a list of DataVolumeCheckpoints, representing stages in a multistage import.
    pub checkpoints: Option<Vec<DataVolumeCheckpoint>>,
    /// FinalCheckpoint indicates whether the current DataVolumeCheckpoint is the final checkpoint.
    pub final_checkpoint: Option<bool>,
}

/// ImportSourceType contains each one of the source types allowed in a VolumeImportSource.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ImportSourceType {
    pub http: Option<DataVolumeSourceHttp>,
    pub s3: Option<DataVolumeSourceS3>,
    pub registry: Option<DataVolumeSourceRegistry>,
    pub gcs: Option<DataVolumeSourceGcs>,
    pub blank: Option<DataVolumeBlankImage>,
    pub imageio: Option<DataVolumeSourceImageIo>,
    pub vddk: Option<DataVolumeSourceVddk>,
}

/// VolumeImportSourceStatus provides the most recently observed status of the
/// VolumeImportSource (empty upstream).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct VolumeImportSourceStatus {}

/// VolumeUploadSourceSpec defines specification for VolumeUploadSource.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "VolumeUploadSource",
    namespaced,
    status = "VolumeUploadSourceStatus",
    derive = "PartialEq",
    doc = "VolumeUploadSource is a specification to populate PersistentVolumeClaims with upload data"
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeUploadSourceSpec {
    /// ContentType represents the type of the upload data (Kubevirt or archive).
    pub content_type: Option<ContentType>,
    /// Preallocation controls whether storage for the target PVC should be allocated in advance.
    pub preallocation: Option<bool>,
}

/// VolumeUploadSourceStatus provides the most recently observed status of the
/// VolumeUploadSource (empty upstream).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct VolumeUploadSourceStatus {}

/// VolumeCloneSourceSpec defines the Spec field for VolumeCloneSource.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "VolumeCloneSource",
    namespaced,
    derive = "PartialEq",
    doc = "VolumeCloneSource refers to a PVC/VolumeSnapshot of any storageclass/volumemode to be used as the source of a new PVC"
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeCloneSourceSpec {
    /// Source is the src of the data to be cloned to the target PVC (a PersistentVolumeClaim or
    /// a VolumeSnapshot).
    pub source: TypedLocalObjectReference,
    /// Preallocation controls whether storage for the target PVC should be allocated in advance.
    pub preallocation: Option<bool>,
    /// PriorityClassName is the priorityclass for the claim.
    pub priority_class_name: Option<String>,
}
