//! cdi-api: the `cdi.kubevirt.io` API surface of cdi-rs as Rust types.
//!
//! Every type serialises exactly as upstream CDI's Go types do (field names, optional fields
//! left out when unset), so objects written by upstream tools read back identically. Keys,
//! phases and reasons live here once ([`keys`], [`enums`]) and are referred to by name.
//!
//! No I/O: this crate is data and its schema.

// kube's `printcolumn(...)` attributes repeat `type_ = "string"`; that is not a duplicate.
#![allow(clippy::duplicated_attributes)]

pub mod config;
pub mod crd;
pub mod datasource;
pub mod datavolume;
pub mod enums;
pub mod keys;
pub mod kubevirt;
pub mod populators;
pub mod storageprofile;
pub mod termination;
pub mod transfer;
pub mod upload;

pub use config::{
    CDI, CDIConfig, CDIConfigSpec, CDIConfigStatus, CDISpec, FilesystemOverhead, Percent,
};
pub use datasource::{DataImportCron, DataImportCronSpec, DataSource, DataSourceSpec};
pub use datavolume::{DataVolume, DataVolumeSource, DataVolumeSpec, DataVolumeStatus, StorageSpec};
pub use enums::*;
pub use keys::{ann, env, ext, finalizer, gate, label, name};
pub use kubevirt::{VirtualMachine, VirtualMachineInstance};
pub use populators::{VolumeCloneSource, VolumeImportSource, VolumeUploadSource};
pub use storageprofile::{
    ClaimPropertySet, StorageProfile, StorageProfileSpec, StorageProfileStatus,
};
pub use termination::{FailureReason, TerminationMessage};
pub use transfer::ObjectTransfer;
pub use upload::UploadTokenRequest;

/// The API group of every CDI kind.
pub const GROUP: &str = "cdi.kubevirt.io";
/// The served and stored version.
pub const VERSION: &str = "v1beta1";
