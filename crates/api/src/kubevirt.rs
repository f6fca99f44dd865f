//! The subset of KubeVirt's `kubevirt.io/v1` VirtualMachine and VirtualMachineInstance that the
//! first-consumer handshake needs. Every field not modelled here is kept in `extra`, so a
//! read-modify-write never drops what KubeVirt (or a user) put there.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, Toleration, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_with::skip_serializing_none;

use crate::datavolume::DataVolumeTemplateSpec;

/// Fields this crate does not model, kept verbatim.
pub type Extra = BTreeMap<String, Value>;

/// Annotation on KubeVirt's temporary pod that binds WaitForFirstConsumer claims.
pub const EPHEMERAL_PROVISIONING_ANNOTATION: &str = "kubevirt.io/ephemeral-provisioning";
/// Label on objects KubeVirt creates for a VirtualMachine: the VM's uid.
pub const CREATED_BY_LABEL: &str = "kubevirt.io/created-by";
/// Node label KubeVirt adds to every launcher pod's nodeSelector.
pub const SCHEDULABLE_NODE_LABEL: &str = "kubevirt.io/schedulable";
/// VMI condition type while a temporary pod provisions WaitForFirstConsumer claims.
pub const CONDITION_PROVISIONING: &str = "Provisioning";

/// VirtualMachine handles the VirtualMachineInstance it owns and the DataVolumes of its
/// `dataVolumeTemplates`.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachine",
    namespaced,
    status = "VirtualMachineStatus",
    derive = "PartialEq",
    shortname = "vm",
    shortname = "vms",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineSpec {
    /// Deprecated by KubeVirt in favour of `runStrategy`, still widely used.
    pub running: Option<bool>,
    /// Always, RerunOnFailure, Manual, Halted, Once or WaitAsReceiver.
    pub run_strategy: Option<String>,
    pub template: Option<VirtualMachineInstanceTemplateSpec>,
    pub data_volume_templates: Option<Vec<DataVolumeTemplateSpec>>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// The template of the VirtualMachineInstance a VirtualMachine creates.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct VirtualMachineInstanceTemplateSpec {
    pub metadata: Option<ObjectMeta>,
    pub spec: Option<VirtualMachineInstanceSpec>,
}

/// VirtualMachineStatus: the modelled part plus everything else.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    pub printable_status: Option<String>,
    pub ready: Option<bool>,
    pub created: Option<bool>,
    pub conditions: Option<Vec<Value>>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// VirtualMachineInstance is what runs the virtual machine: its launcher pod is the consumer of
/// the VM's claims.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachineInstance",
    namespaced,
    status = "VirtualMachineInstanceStatus",
    derive = "PartialEq",
    shortname = "vmi",
    shortname = "vmis",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceSpec {
    pub node_selector: Option<BTreeMap<String, String>>,
    pub affinity: Option<Affinity>,
    pub tolerations: Option<Vec<Toleration>>,
    pub scheduler_name: Option<String>,
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    pub priority_class_name: Option<String>,
    pub volumes: Option<Vec<Volume>>,
    /// The virtual hardware; passed through untouched.
    pub domain: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A volume of a VirtualMachineInstance; only the claim-backed kinds are modelled.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub name: String,
    pub data_volume: Option<DataVolumeVolumeSource>,
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl Volume {
    /// The claim this volume mounts, if it is claim-backed (a DataVolume's claim has its name).
    pub fn claim_name(&self) -> Option<&str> {
        self.data_volume
            .as_ref()
            .map(|d| d.name.as_str())
            .or_else(|| {
                self.persistent_volume_claim
                    .as_ref()
                    .map(|p| p.claim_name.as_str())
            })
    }
}

/// A DataVolume used as a VMI volume.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct DataVolumeVolumeSource {
    pub name: String,
    pub hotpluggable: Option<bool>,
}

/// A PersistentVolumeClaim used as a VMI volume.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeClaimVolumeSource {
    pub claim_name: String,
    pub read_only: Option<bool>,
    pub hotpluggable: Option<bool>,
}

/// VirtualMachineInstanceStatus: the modelled part plus everything else.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceStatus {
    pub phase: Option<String>,
    pub node_name: Option<String>,
    pub conditions: Option<Vec<Value>>,
    #[serde(flatten)]
    pub extra: Extra,
}
