//! What the DataVolume decision hands the controller: the [`Plan`] and its steps (the claim,
//! the companions made before it, the first-consumer pod, what to delete, when to look again).

use std::collections::BTreeMap;

use cdi_api::datavolume::DataVolume;
use cdi_api::enums::DataVolumePhase as Phase;
use cdi_api::populators::{VolumeCloneSource, VolumeImportSource, VolumeUploadSource};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;

use crate::dvstatus::{self, Computed, Event};
use crate::source::Refusal;

/// What to do about the DataVolume's temporary first-consumer pod.
#[derive(Debug, Clone, PartialEq)]
pub enum PodStep {
    /// Create it, after the claim.
    Create(Box<Pod>),
    /// Delete it (by name): its work is done.
    Delete(String),
}

/// What to do about the claim itself.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimStep {
    Keep,
    /// Create it, after the companions.
    Create(Box<PersistentVolumeClaim>),
    /// Take it over: these owner references, and marked populated for the DataVolume.
    Adopt(Vec<OwnerReference>),
}

/// An object a source kind needs besides the claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Companion {
    ImportSource(Box<VolumeImportSource>),
    UploadSource(Box<VolumeUploadSource>),
    /// In the source's namespace.
    CloneSource(Box<VolumeCloneSource>),
    /// The claim a snapshot is restored into for a host-assisted copy, in the snapshot's
    /// namespace.
    RestoreClaim(Box<PersistentVolumeClaim>),
}

/// An object made for a DataVolume that goes when its work is done or the DataVolume goes.
/// Those in other namespaces cannot be owned by it: the DataVolume holds the finalizer
/// `cdi.kubevirt.io/dataVolumeFinalizer` while they may exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leftover {
    ImportSource { namespace: String, name: String },
    CloneSource { namespace: String, name: String },
    RestoreClaim { namespace: String, name: String },
}

/// When to look at the DataVolume again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// A watch event will say when something changed.
    OnChange,
    /// Soon (the controller's resync): what is awaited sends this DataVolume no watch event
    /// (progress read from a pod, events on a Pending claim, a claim held by someone else).
    Soon,
}

/// The decision: applied in this order by the controller.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Created before the claim (the claim names them).
    pub create: Vec<Companion>,
    pub claim: ClaimStep,
    /// Merged into the claim's annotations (`None` removes).
    pub claim_annotations: BTreeMap<String, Option<String>>,
    /// Merged into the DataVolume's annotations.
    pub dv_annotations: BTreeMap<String, Option<String>>,
    /// Added (`Some(true)`, before anything is created) or removed (`Some(false)`, after the
    /// deletions) : the DataVolume's finalizer.
    pub finalizer: Option<bool>,
    /// Objects to delete (the work they served is done, or the DataVolume goes).
    pub delete: Vec<Leftover>,
    /// The status to write (written only when it differs from the DataVolume's).
    pub status: Option<Computed>,
    /// Events recorded before the status' own (render warnings, adoption).
    pub events: Vec<Event>,
    /// The first-consumer pod, after the claim.
    pub first_consumer: Option<PodStep>,
    pub requeue: Requeue,
}

impl Plan {
    pub(super) fn idle() -> Plan {
        Plan {
            create: Vec::new(),
            claim: ClaimStep::Keep,
            claim_annotations: BTreeMap::new(),
            dv_annotations: BTreeMap::new(),
            finalizer: None,
            delete: Vec::new(),
            status: None,
            events: Vec::new(),
            first_consumer: None,
            requeue: Requeue::OnChange,
        }
    }

    pub(super) fn stopped(status: Computed, requeue: Requeue) -> Plan {
        Plan {
            status: Some(status),
            requeue,
            ..Plan::idle()
        }
    }

    /// The pass stops at a refusal: the DataVolume says it in `phase`, nothing is made.
    pub(super) fn refused(
        dv: &DataVolume,
        refusal: &Refusal,
        phase: Phase,
        now: Timestamp,
        requeue: Requeue,
    ) -> Plan {
        Plan::stopped(dvstatus::refused_status(dv, refusal, phase, now), requeue)
    }

    /// Whether the plan creates anything (the controller checks first that the DataVolume still
    /// exists: a cached one may have just been deleted).
    pub fn creates(&self) -> bool {
        !self.create.is_empty()
            || matches!(self.claim, ClaimStep::Create(_))
            || matches!(self.first_consumer, Some(PodStep::Create(_)))
    }
}
