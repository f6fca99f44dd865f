//! String-valued enums that serialise exactly as upstream's Go string constants.
//!
//! Two flavours:
//! - `closed`: the CRD schema lists the allowed values (upstream validates them with
//!   `+kubebuilder:validation:Enum`), so an unknown value is an error.
//! - `open`: upstream stores a free string (phases, reasons). An unknown value read from the
//!   cluster is kept in `Other` so a newer upstream cannot break our watchers.

use std::borrow::Cow;

macro_rules! string_enum {
    (@common $name:ident { $( $variant:ident = $value:literal ),+ }) => {
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
        impl $name {
            /// Every value upstream defines, in upstream's order.
            pub const KNOWN: &'static [$name] = &[$($name::$variant),+];
            /// The exact upstream string values, in upstream's order.
            pub const VALUES: &'static [&'static str] = &[$($value),+];
        }
    };

    (
        $(#[$meta:meta])*
        closed enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }
        impl $name {
            /// The upstream string value.
            pub const fn as_str(&self) -> &'static str {
                match self { $( $name::$variant => $value, )+ }
            }
        }
        impl std::str::FromStr for $name {
            type Err = $crate::enums::UnknownValue;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $( $value => Ok($name::$variant), )+
                    other => Err($crate::enums::UnknownValue {
                        what: stringify!($name),
                        value: other.to_string(),
                        allowed: $name::VALUES,
                    }),
                }
            }
        }
        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> { stringify!($name).into() }
            fn inline_schema() -> bool { true }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                $crate::enums::enum_schema($name::VALUES)
            }
        }
        string_enum!(@common $name { $( $variant = $value ),+ });
    };

    (
        $(#[$meta:meta])*
        open enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this version of cdi-rs does not know, kept verbatim.
            Other(String),
        }
        impl $name {
            /// The upstream string value.
            pub fn as_str(&self) -> &str {
                match self { $( $name::$variant => $value, )+ $name::Other(s) => s.as_str() }
            }
        }
        impl std::str::FromStr for $name {
            type Err = std::convert::Infallible;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Ok(match s {
                    $( $value => $name::$variant, )+
                    other => $name::Other(other.to_string()),
                })
            }
        }
        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> { stringify!($name).into() }
            fn inline_schema() -> bool { true }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string" })
            }
        }
        string_enum!(@common $name { $( $variant = $value ),+ });
    };
}

/// A value outside a closed set of upstream strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownValue {
    pub what: &'static str,
    pub value: String,
    pub allowed: &'static [&'static str],
}

impl std::fmt::Display for UnknownValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown {} {:?}: expected one of {}",
            self.what,
            self.value,
            self.allowed.join(", ")
        )
    }
}

impl std::error::Error for UnknownValue {}

pub(crate) fn enum_schema(values: &[&str]) -> schemars::Schema {
    let values: Vec<Cow<'_, str>> = values.iter().map(|v| Cow::Borrowed(*v)).collect();
    schemars::json_schema!({ "type": "string", "enum": values })
}

string_enum! {
    /// `status.phase` of a DataVolume.
    open enum DataVolumePhase {
        Pending = "Pending",
        PvcBound = "PVCBound",
        ImportScheduled = "ImportScheduled",
        ImportInProgress = "ImportInProgress",
        CloneScheduled = "CloneScheduled",
        CloneInProgress = "CloneInProgress",
        SnapshotForSmartCloneInProgress = "SnapshotForSmartCloneInProgress",
        CloneFromSnapshotSourceInProgress = "CloneFromSnapshotSourceInProgress",
        /// Defined by upstream's API, never set by its controllers.
        SmartClonePvcInProgress = "SmartClonePVCInProgress",
        CsiCloneInProgress = "CSICloneInProgress",
        /// Defined by upstream's API, never set by its controllers.
        ExpansionInProgress = "ExpansionInProgress",
        /// Defined by upstream's API, never set by its controllers.
        NamespaceTransferInProgress = "NamespaceTransferInProgress",
        UploadScheduled = "UploadScheduled",
        UploadReady = "UploadReady",
        WaitForFirstConsumer = "WaitForFirstConsumer",
        PendingPopulation = "PendingPopulation",
        Succeeded = "Succeeded",
        Failed = "Failed",
        Unknown = "Unknown",
        Paused = "Paused",
        PrepClaimInProgress = "PrepClaimInProgress",
        RebindInProgress = "RebindInProgress",
    }
}

string_enum! {
    /// Condition types of a DataVolume.
    open enum DataVolumeConditionType {
        Ready = "Ready",
        Bound = "Bound",
        Running = "Running",
    }
}

string_enum! {
    /// `status` of any condition, as `corev1.ConditionStatus`.
    closed enum ConditionStatus {
        True = "True",
        False = "False",
        Unknown = "Unknown",
    }
}

string_enum! {
    /// Reasons upstream writes on DataVolume conditions.
    open enum DataVolumeConditionReason {
        Bound = "Bound",
        Pending = "Pending",
        ClaimLost = "ClaimLost",
        NotFound = "NotFound",
        TransferRunning = "TransferRunning",
        Completed = "Completed",
        Unschedulable = "Unschedulable",
        ImportPaused = "ImportPaused",
        AwaitingVddk = "AwaitingVDDK",
        Error = "Error",
    }
}

string_enum! {
    /// What the imported data is: a disk image, or a tar archive to unpack.
    closed enum ContentType {
        KubeVirt = "kubevirt",
        Archive = "archive",
    }
}

// The macro-built enum cannot take `#[derive(Default)]`.
#[allow(clippy::derivable_impls)]
impl Default for ContentType {
    fn default() -> Self {
        ContentType::KubeVirt
    }
}

string_enum! {
    /// How a registry image is pulled.
    closed enum RegistryPullMethod {
        Pod = "pod",
        Node = "node",
    }
}

string_enum! {
    /// How CDI clones a volume.
    closed enum CloneStrategy {
        /// Host-assisted: a source pod streams the data into an upload server.
        Copy = "copy",
        Snapshot = "snapshot",
        CsiClone = "csi-clone",
    }
}

string_enum! {
    /// The form of the sources a DataImportCron produces.
    closed enum DataImportCronSourceFormat {
        Snapshot = "snapshot",
        Pvc = "pvc",
    }
}

string_enum! {
    closed enum DataImportCronGarbageCollect {
        Never = "Never",
        Outdated = "Outdated",
    }
}

string_enum! {
    closed enum DataImportCronRetentionPolicy {
        None = "None",
        All = "All",
    }
}

string_enum! {
    closed enum UninstallStrategy {
        RemoveWorkloads = "RemoveWorkloads",
        BlockUninstallIfWorkloadsExist = "BlockUninstallIfWorkloadsExist",
    }
}

string_enum! {
    closed enum PullPolicy {
        Always = "Always",
        IfNotPresent = "IfNotPresent",
        Never = "Never",
    }
}

string_enum! {
    /// Patch flavours for `spec.customizeComponents.patches` of the CDI resource.
    closed enum PatchType {
        Json = "json",
        Merge = "merge",
        Strategic = "strategic",
    }
}

string_enum! {
    /// Kubernetes volume modes as they appear in claim property sets.
    closed enum VolumeMode {
        Block = "Block",
        Filesystem = "Filesystem",
    }
}

string_enum! {
    /// Kubernetes access modes as they appear in claim property sets.
    closed enum AccessMode {
        ReadWriteOnce = "ReadWriteOnce",
        ReadOnlyMany = "ReadOnlyMany",
        ReadWriteMany = "ReadWriteMany",
        ReadWriteOncePod = "ReadWriteOncePod",
    }
}

string_enum! {
    /// Webhook rendering of PVCs labelled `cdi.kubevirt.io/applyStorageProfile`.
    closed enum WebhookPvcRendering {
        Enabled = "Enabled",
        Disabled = "Disabled",
    }
}

string_enum! {
    /// Reasons on a StorageProfile's `Recognized` condition.
    open enum StorageProfileReason {
        RecognizedProvisioner = "RecognizedProvisioner",
        UnrecognizedProvisioner = "UnrecognizedProvisioner",
        UnrecognizedStorageClassParameters = "UnrecognizedStorageClassParameters",
    }
}

string_enum! {
    /// Reasons on a DataSource's `Ready` condition.
    open enum DataSourceReason {
        Ready = "Ready",
        NoSource = "NoSource",
        MaxReferenceDepthReached = "MaxReferenceDepthReached",
        SelfReference = "SelfReference",
        CrossNamespaceReference = "CrossNamespaceReference",
        NotFound = "NotFound",
    }
}

string_enum! {
    open enum DataImportCronConditionType {
        Progressing = "Progressing",
        UpToDate = "UpToDate",
    }
}

string_enum! {
    /// Reasons on a DataImportCron's conditions.
    open enum DataImportCronReason {
        NoDigest = "NoDigest",
        NoImport = "NoImport",
        NotAuthorized = "NotAuthorized",
        Outdated = "Outdated",
        ImportScheduled = "ImportScheduled",
        ImportProgressing = "ImportProgressing",
        UpToDate = "UpToDate",
    }
}

string_enum! {
    open enum ObjectTransferPhase {
        Pending = "Pending",
        Running = "Running",
        Complete = "Complete",
        Error = "Error",
    }
}

string_enum! {
    /// Phase of the CDI installation (controller-lifecycle-operator-sdk).
    open enum CdiPhase {
        Deploying = "Deploying",
        Deployed = "Deployed",
        Deleting = "Deleting",
        Deleted = "Deleted",
        Error = "Error",
        Upgrading = "Upgrading",
    }
}

string_enum! {
    /// OpenShift-style TLS profile names used by `tlsSecurityProfile`.
    closed enum TlsProfileType {
        Old = "Old",
        Intermediate = "Intermediate",
        Modern = "Modern",
        Custom = "Custom",
    }
}

string_enum! {
    closed enum TlsProtocolVersion {
        V10 = "VersionTLS10",
        V11 = "VersionTLS11",
        V12 = "VersionTLS12",
        V13 = "VersionTLS13",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip_as_upstream_strings() {
        for (phase, value) in DataVolumePhase::KNOWN.iter().zip(DataVolumePhase::VALUES) {
            assert_eq!(phase.as_str(), *value);
            let json = serde_json::to_string(phase).unwrap();
            assert_eq!(json, format!("\"{value}\""));
            let back: DataVolumePhase = serde_json::from_str(&json).unwrap();
            assert_eq!(&back, phase);
        }
        assert_eq!(DataVolumePhase::PvcBound.as_str(), "PVCBound");
        assert_eq!(
            DataVolumePhase::CsiCloneInProgress.as_str(),
            "CSICloneInProgress"
        );
    }

    #[test]
    fn open_enums_keep_unknown_values() {
        let p: DataVolumePhase = serde_json::from_str("\"SomethingNew\"").unwrap();
        assert_eq!(p, DataVolumePhase::Other("SomethingNew".into()));
        assert_eq!(serde_json::to_string(&p).unwrap(), "\"SomethingNew\"");
    }

    #[test]
    fn closed_enums_refuse_unknown_values_with_the_allowed_list() {
        let err = serde_json::from_str::<ContentType>("\"tarball\"").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("\"tarball\""), "{msg}");
        assert!(msg.contains("kubevirt, archive"), "{msg}");
        assert_eq!(
            "csi-clone".parse::<CloneStrategy>(),
            Ok(CloneStrategy::CsiClone)
        );
    }
}
