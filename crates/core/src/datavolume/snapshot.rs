//! What the controller observed for one DataVolume: the [`Snapshot`] the decision reads.

use cdi_api::config::CDIConfig;
use cdi_api::datavolume::DataVolume;
use cdi_api::storageprofile::StorageProfile;
use k8s_openapi::api::core::v1::{Event as ClaimEvent, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;

use crate::source::Refusal;

use super::plan::Leftover;

/// What the controller observed for one DataVolume.
#[derive(Debug, Clone)]
pub struct Snapshot<'a> {
    pub dv: &'a DataVolume,
    /// The claim named like the DataVolume, whoever's it is.
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// PVC prime, when the claim is filled through the populator and prime exists.
    pub prime: Option<&'a PersistentVolumeClaim>,
    pub classes: &'a [StorageClass],
    pub profiles: &'a [StorageProfile],
    /// The names of the CSIDriver objects (the provisioners that are CSI drivers).
    pub csi_drivers: &'a [String],
    pub config: Option<&'a CDIConfig>,
    /// The events on the claim: while it is Pending, the latest says what binding waits for.
    pub claim_events: &'a [ClaimEvent],
    /// Progress read from the running worker pod ("NN.NN%").
    pub progress: Option<String>,
    /// The temporary pod of a first-consumer template (docs/design.md#a-first-consumer-without-kubevirt), when it exists.
    pub first_consumer: Option<&'a Pod>,
    /// The claim a clone copies (`spec.source.pvc`), when it exists.
    pub clone_source: Option<&'a PersistentVolumeClaim>,
    /// Why the DataVolume's `sourceRef` stands for no source now (its DataSource is missing or
    /// not ready). A resolved `sourceRef` comes as `dv` with `spec.source` filled in.
    pub source_ref_refusal: Option<&'a Refusal>,
    /// Why a clone from another namespace may not read its source (no valid clone token), as
    /// the controller found checking the token.
    pub clone_refusal: Option<&'a Refusal>,
    /// The VolumeSnapshot a snapshot clone restores (`spec.source.snapshot`), when it exists.
    pub clone_snapshot: Option<&'a serde_json::Value>,
    /// The CSI driver that took that snapshot (its VolumeSnapshotContent's), when known.
    pub clone_snapshot_driver: Option<&'a str>,
    /// Objects made for this DataVolume outside what it owns (see
    /// [`made_for`](super::refs::made_for)): the claim a snapshot was restored into for a copy,
    /// whenever it exists; while the DataVolume holds its finalizer and is being deleted or
    /// succeeded, also its VolumeCloneSource.
    pub leftovers: &'a [Leftover],
    /// The image worker pods run (the first consumer's too).
    pub worker_image: &'a str,
    pub now: Timestamp,
}
