//! CDIConfig (the user's configuration, singleton `config`) and CDI (the installation).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::enums::{
    CdiPhase, CloneStrategy, ConditionStatus, PatchType, PullPolicy, TlsProfileType,
    TlsProtocolVersion, UninstallStrategy, WebhookPvcRendering,
};

/// CDIConfigSpec defines specification for user configuration.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "CDIConfig",
    plural = "cdiconfigs",
    status = "CDIConfigStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "CDIConfig provides a user configuration for CDI"
)]
#[serde(rename_all = "camelCase")]
pub struct CDIConfigSpec {
    /// Override the URL used when uploading to a DataVolume.
    #[serde(rename = "uploadProxyURLOverride")]
    pub upload_proxy_url_override: Option<String>,
    /// ImportProxy contains importer pod proxy configuration.
    pub import_proxy: Option<ImportProxy>,
    /// Override the storage class to use for scratch space during transfer operations.
    pub scratch_space_storage_class: Option<String>,
    /// ResourceRequirements describes the compute resource requirements of worker pods.
    pub pod_resource_requirements: Option<ResourceRequirements>,
    /// FeatureGates are a list of specific enabled feature gates.
    pub feature_gates: Option<Vec<String>>,
    /// FilesystemOverhead describes the space reserved for overhead when using Filesystem
    /// volumes. A value is between 0 and 1, if not defined it is 0.06 (6% overhead).
    pub filesystem_overhead: Option<FilesystemOverhead>,
    /// Preallocation controls whether storage for DataVolumes should be allocated in advance.
    pub preallocation: Option<bool>,
    /// InsecureRegistries is a list of TLS disabled registries.
    pub insecure_registries: Option<Vec<String>>,
    /// DataVolumeTTLSeconds is the time in seconds after DataVolume completion it can be garbage
    /// collected. Deprecated: Removed in v1.62.
    #[serde(rename = "dataVolumeTTLSeconds")]
    pub data_volume_ttl_seconds: Option<i32>,
    /// TLSSecurityProfile is used by operators to apply cluster-wide TLS security settings to
    /// operands.
    pub tls_security_profile: Option<TlsSecurityProfile>,
    /// The imagePullSecrets used to pull the container images.
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// LogVerbosity overrides the default verbosity level used to initialize loggers.
    pub log_verbosity: Option<i32>,
    /// WebhookPvcRendering: Enabled (default) or Disabled.
    pub webhook_pvc_rendering: Option<WebhookPvcRendering>,
}

impl CDIConfigSpec {
    /// Whether `gate` is listed in `featureGates`.
    pub fn gate_enabled(&self, gate: &str) -> bool {
        self.feature_gates.iter().flatten().any(|g| g == gate)
    }
}

/// CDIConfigStatus provides the most recently observed status of the CDI Config resource.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CDIConfigStatus {
    /// The calculated upload proxy URL.
    #[serde(rename = "uploadProxyURL")]
    pub upload_proxy_url: Option<String>,
    /// UploadProxyCA is the certificate authority of the upload proxy.
    #[serde(rename = "uploadProxyCA")]
    pub upload_proxy_ca: Option<String>,
    /// ImportProxy contains importer pod proxy configuration.
    pub import_proxy: Option<ImportProxy>,
    /// The calculated storage class to be used for scratch space.
    pub scratch_space_storage_class: Option<String>,
    /// ResourceRequirements describes the compute resource requirements.
    pub default_pod_resource_requirements: Option<ResourceRequirements>,
    /// FilesystemOverhead describes the space reserved for overhead when using Filesystem
    /// volumes, with an entry for every StorageClass.
    pub filesystem_overhead: Option<FilesystemOverhead>,
    /// Preallocation controls whether storage for DataVolumes should be allocated in advance.
    pub preallocation: Option<bool>,
    /// The imagePullSecrets used to pull the container images.
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
}

/// A fraction in `[0, 1]` written as upstream's `Percent`: `"0"`, `"0.06"`, `"0.055"`, `"1"`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[serde(transparent)]
pub struct Percent(pub String);

/// The pattern upstream's CRD enforces on `Percent`.
pub const PERCENT_PATTERN: &str = r"^(0(?:\.\d{1,3})?|1)$";

impl JsonSchema for Percent {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Percent".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": PERCENT_PATTERN,
            "description": "Percent is a string that can only be a value between [0,1)"
        })
    }
}

impl From<&str> for Percent {
    fn from(s: &str) -> Self {
        Percent(s.to_string())
    }
}

/// FilesystemOverhead defines the reserved size for PVCs with VolumeMode: Filesystem.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FilesystemOverhead {
    /// Global is how much space of a Filesystem volume should be reserved for overhead, unless
    /// overridden per storageClass.
    pub global: Option<Percent>,
    /// StorageClass maps a storageClass name to its overhead; it overrides the global value.
    pub storage_class: Option<BTreeMap<String, Percent>>,
}

/// ImportProxy provides the information on how to configure the importer pod proxy.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ImportProxy {
    /// HTTPProxy is the URL of the import proxy for HTTP requests.
    #[serde(rename = "HTTPProxy")]
    pub http_proxy: Option<String>,
    /// HTTPSProxy is the URL of the import proxy for HTTPS requests.
    #[serde(rename = "HTTPSProxy")]
    pub https_proxy: Option<String>,
    /// NoProxy is a comma-separated list of hostnames and/or CIDRs that bypass the proxy.
    #[serde(rename = "noProxy")]
    pub no_proxy: Option<String>,
    /// TrustedCAProxy names a ConfigMap in the cdi namespace holding a CA bundle for the proxy.
    #[serde(rename = "trustedCAProxy")]
    pub trusted_ca_proxy: Option<String>,
}

/// TLSSecurityProfile (OpenShift style): one of the predefined profiles, or a custom one.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSecurityProfile {
    /// Type is one of Old, Intermediate, Modern or Custom.
    #[serde(rename = "type")]
    pub type_: Option<TlsProfileType>,
    pub old: Option<PredefinedTlsProfile>,
    pub intermediate: Option<PredefinedTlsProfile>,
    pub modern: Option<PredefinedTlsProfile>,
    pub custom: Option<CustomTlsProfile>,
}

/// The body of `old`, `intermediate` and `modern`: empty, the name says it all.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct PredefinedTlsProfile {}

/// A custom TLS profile: the ciphers and the minimum TLS version.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomTlsProfile {
    pub ciphers: Option<Vec<String>>,
    #[serde(rename = "minTLSVersion")]
    pub min_tls_version: Option<TlsProtocolVersion>,
}

/// CDISpec defines our specification for the CDI installation.
#[skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "CDI",
    plural = "cdis",
    status = "CDIStatus",
    derive = "PartialEq",
    shortname = "cdi",
    shortname = "cdis",
    doc = "CDI is the CDI Operator CRD",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase")
)]
#[serde(rename_all = "camelCase")]
pub struct CDISpec {
    /// PullPolicy describes a policy for if/when to pull a container image.
    pub image_pull_policy: Option<PullPolicy>,
    /// CDIUninstallStrategy defines the state to leave CDI on uninstall.
    pub uninstall_strategy: Option<UninstallStrategy>,
    /// Selectors and tolerations that should apply to cdi infrastructure components.
    pub infra: Option<ComponentConfig>,
    /// Restrict on which nodes CDI workload pods will be scheduled.
    pub workload: Option<NodePlacement>,
    pub customize_components: Option<CustomizeComponents>,
    /// Clone strategy override: should we use a host-assisted copy even if snapshots are
    /// available?
    pub clone_strategy_override: Option<CloneStrategy>,
    /// CDIConfig at CDI level.
    pub config: Option<CDIConfigSpec>,
    /// Certificate configuration.
    pub cert_config: Option<CdiCertConfig>,
    /// PriorityClass of the CDI control plane.
    pub priority_class: Option<String>,
}

/// NodePlacement describes node scheduling configuration.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePlacement {
    pub node_selector: Option<BTreeMap<String, String>>,
    pub affinity: Option<Affinity>,
    pub tolerations: Option<Vec<Toleration>>,
}

/// ComponentConfig defines the scheduling and replicas configuration for CDI components.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentConfig {
    pub node_selector: Option<BTreeMap<String, String>>,
    pub affinity: Option<Affinity>,
    pub tolerations: Option<Vec<Toleration>>,
    /// DeploymentReplicas set Replicas for cdi-deployment.
    pub deployment_replicas: Option<i32>,
    /// ApiserverReplicas set Replicas for cdi-apiserver.
    pub api_server_replicas: Option<i32>,
    /// UploadproxyReplicas set Replicas for cdi-uploadproxy.
    pub upload_proxy_replicas: Option<i32>,
}

/// CustomizeComponents defines patches for components deployed by the CDI operator.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct CustomizeComponents {
    pub patches: Option<Vec<CustomizeComponentsPatch>>,
    /// Configure the value used for deployment and daemonset resources.
    pub flags: Option<Flags>,
}

/// Flags replace all flags of a component container's command.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Flags {
    pub api: Option<BTreeMap<String, String>>,
    pub controller: Option<BTreeMap<String, String>>,
    pub upload_proxy: Option<BTreeMap<String, String>>,
}

/// CustomizeComponentsPatch defines a patch for some resource.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomizeComponentsPatch {
    #[schemars(length(min = 1))]
    pub resource_name: String,
    #[schemars(length(min = 1))]
    pub resource_type: String,
    pub patch: String,
    #[serde(rename = "type")]
    pub type_: PatchType,
}

/// CDICertConfig has the CertConfigs for CDI.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct CdiCertConfig {
    /// CA configuration: CA certs are kept in the CA bundle as long as they are valid.
    pub ca: Option<CertConfig>,
    /// Server configuration: certs are rotated and discarded.
    pub server: Option<CertConfig>,
    /// Client configuration: certs are rotated and discarded.
    pub client: Option<CertConfig>,
}

/// CertConfig contains the tunables for TLS certificates (durations such as "48h").
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertConfig {
    /// The requested lifetime of the certificate.
    pub duration: Option<String>,
    /// How long before `notAfter` renewal begins.
    pub renew_before: Option<String>,
}

/// CDIStatus defines the status of the installation.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CDIStatus {
    pub phase: Option<CdiPhase>,
    pub conditions: Option<Vec<OperatorCondition>>,
    pub operator_version: Option<String>,
    pub target_version: Option<String>,
    pub observed_version: Option<String>,
}

/// A condition in the custom-resource-status style the CDI operator uses.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperatorCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub last_heartbeat_time: Option<Time>,
    pub last_transition_time: Option<Time>,
}
