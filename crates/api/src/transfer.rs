//! ObjectTransfer: moves a PVC or DataVolume between namespaces (deprecated upstream, kept so
//! existing objects read back unchanged).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::enums::{ConditionStatus, ObjectTransferPhase};

/// ObjectTransferSpec specifies the source/target of the transfer.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "ObjectTransfer",
    status = "ObjectTransferStatus",
    derive = "PartialEq",
    shortname = "ot",
    shortname = "ots",
    doc = "ObjectTransfer is the cluster scoped object transfer resource",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "The phase of the ObjectTransfer"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Complete\")].status",
        description = "Latest status from the conditions"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ObjectTransferSpec {
    pub source: TransferSource,
    pub target: TransferTarget,
    pub parent_name: Option<String>,
}

/// TransferSource is the source of an ObjectTransfer.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransferSource {
    pub api_version: Option<String>,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub required_annotations: Option<BTreeMap<String, String>>,
}

/// TransferTarget is the target of an ObjectTransfer.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct TransferTarget {
    pub namespace: Option<String>,
    pub name: Option<String>,
}

/// ObjectTransferStatus is the status of the ObjectTransfer.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ObjectTransferStatus {
    pub data: Option<BTreeMap<String, String>>,
    pub phase: Option<ObjectTransferPhase>,
    pub conditions: Option<Vec<ObjectTransferCondition>>,
}

/// ObjectTransferCondition contains condition data.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectTransferCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    pub last_transition_time: Option<Time>,
    pub last_heartbeat_time: Option<Time>,
    pub reason: Option<String>,
    pub message: Option<String>,
}
