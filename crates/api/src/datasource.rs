//! DataSource (a named golden image) and DataImportCron (its scheduled refresh).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::datavolume::{DataVolumeSourcePvc, DataVolumeSourceSnapshot, DataVolumeTemplateSpec};
use crate::enums::{
    ConditionStatus, DataImportCronConditionType, DataImportCronGarbageCollect,
    DataImportCronRetentionPolicy, DataImportCronSourceFormat,
};

/// DataSourceSpec defines specification for DataSource.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "DataSource",
    namespaced,
    status = "DataSourceStatus",
    derive = "PartialEq",
    shortname = "das",
    category = "all",
    doc = "DataSource references an import/clone source for a DataVolume"
)]
#[serde(rename_all = "camelCase")]
pub struct DataSourceSpec {
    /// Source is the source of the data referenced by the DataSource.
    pub source: DataSourceSource,
}

/// DataSourceSource represents the source for our DataSource.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataSourceSource {
    pub pvc: Option<DataVolumeSourcePvc>,
    pub snapshot: Option<DataVolumeSourceSnapshot>,
    /// A reference to another DataSource; the chain may be at most one deep.
    pub data_source: Option<DataSourceRefSourceDataSource>,
}

/// DataSourceRefSourceDataSource serves as a reference to another DataSource.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct DataSourceRefSourceDataSource {
    /// The namespace of the source DataSource.
    pub namespace: String,
    /// The name of the source DataSource.
    pub name: String,
}

/// DataSourceStatus provides the most recently observed status of the DataSource.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataSourceStatus {
    /// Source is the current source of the data referenced by the DataSource.
    pub source: Option<DataSourceSource>,
    pub conditions: Option<Vec<DataSourceCondition>>,
}

/// The condition type of a DataSource that is ready to be consumed.
pub const DATA_SOURCE_READY: &str = "Ready";

/// DataSourceCondition represents the state of a data source condition.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataSourceCondition {
    /// Type of condition: Ready.
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    pub last_transition_time: Option<Time>,
    pub last_heartbeat_time: Option<Time>,
    pub reason: Option<String>,
    pub message: Option<String>,
}

/// DataImportCronSpec defines specification for DataImportCron.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "DataImportCron",
    namespaced,
    status = "DataImportCronStatus",
    derive = "PartialEq",
    shortname = "dic",
    shortname = "dics",
    category = "all",
    doc = "DataImportCron defines a cron job for recurring polling/importing disk images as PVCs into a golden image namespace",
    printcolumn(
        name = "Format",
        type_ = "string",
        json_path = ".status.sourceFormat",
        description = "The format in which created sources are saved"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DataImportCronSpec {
    /// Template specifies template for the DVs to be created.
    pub template: DataVolumeTemplateSpec,
    /// Schedule specifies in cron format when and how often to look for new imports.
    pub schedule: String,
    /// GarbageCollect specifies whether old PVCs should be cleaned up after a new PVC is
    /// imported: "Outdated" (default) or "Never".
    pub garbage_collect: Option<DataImportCronGarbageCollect>,
    /// Number of import PVCs to keep when garbage collecting. Default is 3.
    pub imports_to_keep: Option<i32>,
    /// ManagedDataSource specifies the name of the corresponding DataSource this cron will
    /// manage. DataSource has to be in the same namespace.
    pub managed_data_source: String,
    /// RetentionPolicy specifies whether the created DataVolumes and DataSources are retained
    /// when their DataImportCron is deleted. Default is RetainAll.
    pub retention_policy: Option<DataImportCronRetentionPolicy>,
    /// The ServiceAccount for the poller pod.
    pub service_account_name: Option<String>,
}

/// DataImportCronStatus provides the most recently observed status of the DataImportCron.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataImportCronStatus {
    /// CurrentImports are the imports in progress.
    pub current_imports: Option<Vec<ImportStatus>>,
    /// LastImportedPVC is the last imported PVC.
    #[serde(rename = "lastImportedPVC")]
    pub last_imported_pvc: Option<DataVolumeSourcePvc>,
    /// LastExecutionTimestamp is the time of the last polling.
    pub last_execution_timestamp: Option<Time>,
    /// LastImportTimestamp is the time of the last import.
    pub last_import_timestamp: Option<Time>,
    /// SourceFormat defines the format of the DataImportCron-created disk image sources.
    pub source_format: Option<DataImportCronSourceFormat>,
    pub conditions: Option<Vec<DataImportCronCondition>>,
}

/// ImportStatus of a currently in progress import (upstream's capitalised field names).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ImportStatus {
    /// DataVolumeName is the currently in progress import DataVolume.
    #[serde(rename = "DataVolumeName")]
    pub data_volume_name: String,
    /// Digest of the currently imported image.
    #[serde(rename = "Digest")]
    pub digest: String,
}

/// DataImportCronCondition represents the state of a data import cron condition.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataImportCronCondition {
    /// Type of condition: Progressing, UpToDate.
    #[serde(rename = "type")]
    pub type_: DataImportCronConditionType,
    pub status: ConditionStatus,
    pub last_transition_time: Option<Time>,
    pub last_heartbeat_time: Option<Time>,
    pub reason: Option<String>,
    pub message: Option<String>,
}
