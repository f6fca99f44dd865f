//! The snapshot.storage.k8s.io API as the agents reach it: its group, its version, and its
//! kinds as dynamic resources (k8s-openapi has no types for them).

use kube::api::ApiResource;

pub const GROUP: &str = "snapshot.storage.k8s.io";
pub const API_VERSION: &str = "snapshot.storage.k8s.io/v1";
/// The annotation marking a driver's default VolumeSnapshotClass.
pub const DEFAULT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";

/// The dynamic resource of a snapshot.storage.k8s.io kind.
pub fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: API_VERSION.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}
