//! StorageProfile: CDI's recommendation for claims of one StorageClass (same name).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::enums::{
    AccessMode, CloneStrategy, ConditionStatus, DataImportCronSourceFormat, StorageProfileReason,
    VolumeMode,
};

/// StorageProfileSpec defines specification for StorageProfile.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "StorageProfile",
    status = "StorageProfileStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "StorageProfile provides a CDI specific recommendation for storage parameters"
)]
#[serde(rename_all = "camelCase")]
pub struct StorageProfileSpec {
    /// CloneStrategy defines the preferred method for performing a CDI clone.
    pub clone_strategy: Option<CloneStrategy>,
    /// ClaimPropertySets is a provided set of properties applicable to PVC.
    #[schemars(length(max = 8))]
    pub claim_property_sets: Option<Vec<ClaimPropertySet>>,
    /// DataImportCronSourceFormat defines the format of the DataImportCron-created disk image
    /// sources.
    pub data_import_cron_source_format: Option<DataImportCronSourceFormat>,
    /// SnapshotClass is optional specific VolumeSnapshotClass for CloneStrategySnapshot.
    pub snapshot_class: Option<String>,
}

/// StorageProfileStatus provides the most recently observed status of the StorageProfile.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageProfileStatus {
    /// The StorageClass name for which capabilities are defined.
    pub storage_class: Option<String>,
    /// The Storage class provisioner plugin name.
    pub provisioner: Option<String>,
    /// CloneStrategy defines the preferred method for performing a CDI clone.
    pub clone_strategy: Option<CloneStrategy>,
    /// ClaimPropertySets computed from the spec and detected in the system.
    #[schemars(length(max = 8))]
    pub claim_property_sets: Option<Vec<ClaimPropertySet>>,
    /// DataImportCronSourceFormat defines the format of the DataImportCron-created disk image
    /// sources.
    pub data_import_cron_source_format: Option<DataImportCronSourceFormat>,
    /// SnapshotClass is optional specific VolumeSnapshotClass for CloneStrategySnapshot.
    pub snapshot_class: Option<String>,
    /// Conditions: `Recognized`.
    pub conditions: Option<Vec<StorageProfileCondition>>,
}

/// ClaimPropertySet is a set of properties applicable to PVC.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimPropertySet {
    /// AccessModes contains the desired access modes the volume should have.
    #[schemars(length(max = 4))]
    pub access_modes: Vec<AccessMode>,
    /// VolumeMode defines what type of volume is required by the claim.
    pub volume_mode: VolumeMode,
}

impl ClaimPropertySet {
    pub fn new(
        access_modes: impl IntoIterator<Item = AccessMode>,
        volume_mode: VolumeMode,
    ) -> Self {
        ClaimPropertySet {
            access_modes: access_modes.into_iter().collect(),
            volume_mode,
        }
    }
}

/// The condition type on a StorageProfile telling whether its provisioner is known.
pub const CONDITION_RECOGNIZED: &str = "Recognized";

/// A condition on a StorageProfile.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageProfileCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    pub last_transition_time: Option<Time>,
    pub last_heartbeat_time: Option<Time>,
    pub reason: Option<StorageProfileReason>,
    pub message: Option<String>,
}
