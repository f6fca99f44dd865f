//! The DataVolume decision: a snapshot of what the controller observed goes in, a plan comes out
//! (the claim to create or adopt, annotations to write, companion objects, the status, the
//! events, when to look again). The controller only observes and executes.
//!
//! What differs between source kinds is one [`Kind`]: import (http and blank, classic or through
//! the populator), upload and external population today; clone and snapshot are more kinds, not
//! branches of these.

use std::collections::BTreeMap;

use cdi_api::config::CDIConfig;
use cdi_api::datavolume::DataVolume;
use cdi_api::enums::DataVolumePhase as Phase;
use cdi_api::populators::{
    ImportSourceType, VolumeCloneSource, VolumeCloneSourceSpec, VolumeImportSource,
    VolumeImportSourceSpec, VolumeUploadSource, VolumeUploadSourceSpec,
};
use cdi_api::storageprofile::StorageProfile;
use cdi_api::{ann, gate};
use k8s_openapi::api::core::v1::{Event as ClaimEvent, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;

use crate::claims::{adoptable, claim_made_for, owned_by, populated_for};
use crate::dvstatus::{self, Computed, Event, External, Observed};
use crate::render::{self, RenderContext, RenderedClaim};
use crate::source::{self, Filled, Refusal};
use cdi_api::datavolume::SourceKind;

/// The component the controller reports its events as; its own events on a claim are not what
/// the claim waits for.
pub const COMPONENT: &str = "cdi-controller";

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
    /// Objects made for this DataVolume outside what it owns (see [`made_for`]): the claim a
    /// snapshot was restored into for a copy, whenever it exists; while the DataVolume holds
    /// its finalizer and is being deleted or succeeded, also its VolumeCloneSource.
    pub leftovers: &'a [Leftover],
    /// The image worker pods run (the first consumer's too).
    pub worker_image: &'a str,
    pub now: Timestamp,
}

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

/// Whether an object was made for `dv`: owned by it, or (in another namespace) naming it by
/// `ownedByDataVolume` and, when it says so, by its uid.
pub fn made_for(dv: &DataVolume, meta: &ObjectMeta) -> bool {
    let uid = dv.metadata.uid.as_deref();
    if meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| Some(o.uid.as_str()) == uid)
    {
        return true;
    }
    let anns = meta.annotations.as_ref();
    let named = format!(
        "{}/{}",
        dv.metadata.namespace.as_deref().unwrap_or(""),
        dv.metadata.name.as_deref().unwrap_or("")
    );
    anns.and_then(|a| a.get(ann::OWNED_BY_DATA_VOLUME)) == Some(&named)
        && anns
            .and_then(|a| a.get(ann::OWNER_UID))
            .is_none_or(|u| Some(u.as_str()) == uid)
}

/// Whether the DataVolume holds `cdi.kubevirt.io/dataVolumeFinalizer`.
pub fn holds_finalizer(dv: &DataVolume) -> bool {
    dv.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == cdi_api::finalizer::DATA_VOLUME)
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
    fn idle() -> Plan {
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

    fn stopped(status: Computed, requeue: Requeue) -> Plan {
        Plan {
            status: Some(status),
            requeue,
            ..Plan::idle()
        }
    }

    /// Whether the plan creates anything (the controller checks first that the DataVolume still
    /// exists: a cached one may have just been deleted).
    pub fn creates(&self) -> bool {
        !self.create.is_empty()
            || matches!(self.claim, ClaimStep::Create(_))
            || matches!(self.first_consumer, Some(PodStep::Create(_)))
    }
}

/// What a source kind decides; everything else about a DataVolume is shared.
pub trait Kind {
    /// Objects the claim needs before it is created.
    fn companions(&self, dv: &DataVolume, rendered: &RenderedClaim) -> Vec<Companion>;
    /// The status from what was observed (the claim is the DataVolume's, or none yet).
    fn status(&self, o: &Observed<'_>, s: &Snapshot<'_>) -> Computed;
    /// Companions to delete once the status says the work is done.
    fn finished(
        &self,
        dv: &DataVolume,
        claim: &PersistentVolumeClaim,
        status: &Computed,
    ) -> Vec<Leftover>;
}

/// Import (http, blank): an importer pod fills the claim, or PVC prime through the populator.
pub struct Import;

/// External population: what the claim's `dataSourceRef` names fills it.
pub struct ExternalPopulation;

/// Upload: an upload pod takes the image from the upload proxy into the claim, or into PVC prime
/// through the populator.
pub struct Upload;

/// The VolumeUploadSource the populator path's claim names (`volume-upload-source-<uid>`), owned
/// by the DataVolume.
pub fn upload_source(dv: &DataVolume) -> VolumeUploadSource {
    let name = format!(
        "{}-{}",
        cdi_api::name::VOLUME_UPLOAD_SOURCE_PREFIX,
        dv.metadata.uid.as_deref().unwrap_or("")
    );
    let mut object = VolumeUploadSource::new(
        &name,
        VolumeUploadSourceSpec {
            content_type: dv.spec.content_type,
            preallocation: dv.spec.preallocation,
        },
    );
    object.metadata.namespace = dv.metadata.namespace.clone();
    object.metadata.owner_references = owner_reference(dv).map(|o| vec![o]);
    object
}

/// Clone (`source.pvc`): a host-assisted copy into the claim, or through the clone populator
/// (which may also use a CSI clone or a snapshot) into PVC prime.
pub struct Clone;

/// The claim a clone DataVolume copies, as `(namespace, name)`: its own namespace when
/// `source.pvc.namespace` is empty.
pub fn clone_source_of(dv: &DataVolume) -> Option<(String, String)> {
    let pvc = dv.spec.source.as_ref()?.pvc.as_ref()?;
    let ns = if pvc.namespace.is_empty() {
        dv.metadata.namespace.clone().unwrap_or_default()
    } else {
        pvc.namespace.clone()
    };
    Some((ns, pvc.name.clone()))
}

/// The VolumeSnapshot a snapshot clone DataVolume restores (`spec.source.snapshot`), as
/// `(namespace, name)`: its own namespace when it names none.
pub fn snapshot_source_of(dv: &DataVolume) -> Option<(String, String)> {
    let s = dv.spec.source.as_ref()?.snapshot.as_ref()?;
    let ns = if s.namespace.is_empty() {
        dv.metadata.namespace.clone().unwrap_or_default()
    } else {
        s.namespace.clone()
    };
    Some((ns, s.name.clone()))
}

/// The claim a snapshot clone off the populator path restores the snapshot into, and copies
/// from (upstream's `<uid>-host-assisted-source-pvc`), in the snapshot's namespace.
pub fn snapshot_fallback_name(dv: &DataVolume) -> String {
    format!(
        "{}-host-assisted-source-pvc",
        dv.metadata.uid.as_deref().unwrap_or("")
    )
}

/// That claim: the snapshot restored by a class of its driver, at its restore size, with the
/// target's access and volume modes; owned by the DataVolume in its namespace, else naming it.
pub fn snapshot_fallback_claim(
    dv: &DataVolume,
    target: &PersistentVolumeClaim,
    snapshot: &(String, String),
    class: &str,
    restore_size: &str,
) -> PersistentVolumeClaim {
    let target_spec = target.spec.clone().unwrap_or_default();
    let own_ns = dv.metadata.namespace.clone().unwrap_or_default();
    let mut meta = ObjectMeta {
        name: Some(snapshot_fallback_name(dv)),
        namespace: Some(snapshot.0.clone()),
        annotations: Some(BTreeMap::from([(
            ann::OWNER_UID.to_string(),
            dv.metadata.uid.clone().unwrap_or_default(),
        )])),
        ..Default::default()
    };
    if snapshot.0 == own_ns {
        meta.owner_references = owner_reference(dv).map(|o| vec![o]);
    } else if let Some(a) = meta.annotations.as_mut() {
        a.insert(
            ann::OWNED_BY_DATA_VOLUME.into(),
            format!("{own_ns}/{}", dv.metadata.name.as_deref().unwrap_or("")),
        );
    }
    crate::hostclone::restored_claim(
        meta,
        &snapshot.1,
        class,
        target_spec.access_modes,
        target_spec.volume_mode,
        restore_size,
    )
}

/// The name of a clone DataVolume's VolumeCloneSource: `volume-clone-source-<uid>`.
pub fn clone_source_name(dv: &DataVolume) -> String {
    format!(
        "{}-{}",
        cdi_api::name::VOLUME_CLONE_SOURCE_PREFIX,
        dv.metadata.uid.as_deref().unwrap_or("")
    )
}

/// The VolumeCloneSource the populator path's claim names (`volume-clone-source-<uid>`), in
/// the source's namespace: owned by the DataVolume there, else naming it by annotation. Its
/// source is the claim, or the VolumeSnapshot, the DataVolume clones.
pub fn clone_source(dv: &DataVolume) -> Option<VolumeCloneSource> {
    let (snapshot, (ns, name)) = match clone_source_of(dv) {
        Some(claim) => (false, claim),
        None => (true, snapshot_source_of(dv)?),
    };
    let mut object = VolumeCloneSource::new(
        &clone_source_name(dv),
        VolumeCloneSourceSpec {
            source: if snapshot {
                k8s_openapi::api::core::v1::TypedLocalObjectReference {
                    api_group: Some("snapshot.storage.k8s.io".into()),
                    kind: "VolumeSnapshot".into(),
                    name,
                }
            } else {
                k8s_openapi::api::core::v1::TypedLocalObjectReference {
                    api_group: None,
                    kind: "PersistentVolumeClaim".into(),
                    name,
                }
            },
            preallocation: dv.spec.preallocation,
            priority_class_name: dv
                .spec
                .priority_class_name
                .clone()
                .filter(|p| !p.is_empty()),
        },
    );
    if dv.metadata.namespace.as_deref() == Some(ns.as_str()) {
        object.metadata.owner_references = owner_reference(dv).map(|o| vec![o]);
    } else {
        object.metadata.annotations = Some(BTreeMap::from([(
            ann::OWNED_BY_DATA_VOLUME.to_string(),
            format!(
                "{}/{}",
                dv.metadata.namespace.as_deref().unwrap_or(""),
                dv.metadata.name.as_deref().unwrap_or("")
            ),
        )]));
    }
    object.metadata.namespace = Some(ns);
    Some(object)
}

/// The VolumeImportSource of a DataVolume: `volume-import-source-<uid>`.
pub fn import_source_name(dv: &DataVolume) -> String {
    format!(
        "{}-{}",
        cdi_api::name::VOLUME_IMPORT_SOURCE_PREFIX,
        dv.metadata.uid.as_deref().unwrap_or("")
    )
}

/// The VolumeImportSource the populator path's claim names, owned by the DataVolume.
pub fn import_source(dv: &DataVolume) -> VolumeImportSource {
    let source = dv.spec.source.clone().unwrap_or_default();
    let mut object = VolumeImportSource::new(
        &import_source_name(dv),
        VolumeImportSourceSpec {
            source: Some(ImportSourceType {
                http: source.http,
                s3: source.s3,
                registry: source.registry,
                gcs: source.gcs,
                blank: source.blank,
                ..Default::default()
            }),
            content_type: dv.spec.content_type,
            preallocation: dv.spec.preallocation,
            ..Default::default()
        },
    );
    object.metadata.namespace = dv.metadata.namespace.clone();
    object.metadata.owner_references = owner_reference(dv).map(|o| vec![o]);
    object
}

/// The DataVolume as its objects' controller.
pub fn owner_reference(dv: &DataVolume) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: format!("{}/{}", cdi_api::GROUP, cdi_api::VERSION),
        kind: "DataVolume".into(),
        name: dv.metadata.name.clone()?,
        uid: dv.metadata.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

impl Kind for Import {
    fn companions(&self, dv: &DataVolume, rendered: &RenderedClaim) -> Vec<Companion> {
        if rendered.use_populator {
            vec![Companion::ImportSource(Box::new(import_source(dv)))]
        } else {
            Vec::new()
        }
    }

    fn status(&self, o: &Observed<'_>, s: &Snapshot<'_>) -> Computed {
        let populating = o
            .claim
            .and_then(crate::populator::import_source_name)
            .is_some();
        dvstatus::import_status(&Observed {
            populator: populating.then_some(s.prime),
            ..o.clone()
        })
    }

    fn finished(
        &self,
        dv: &DataVolume,
        claim: &PersistentVolumeClaim,
        status: &Computed,
    ) -> Vec<Leftover> {
        let populating = crate::populator::import_source_name(claim).is_some();
        if populating && turns_succeeded(dv, status) {
            vec![Leftover::ImportSource {
                namespace: dv.metadata.namespace.clone().unwrap_or_default(),
                name: import_source_name(dv),
            }]
        } else {
            Vec::new()
        }
    }
}

impl Kind for Upload {
    fn companions(&self, dv: &DataVolume, rendered: &RenderedClaim) -> Vec<Companion> {
        if rendered.use_populator {
            vec![Companion::UploadSource(Box::new(upload_source(dv)))]
        } else {
            Vec::new()
        }
    }

    fn status(&self, o: &Observed<'_>, s: &Snapshot<'_>) -> Computed {
        let populating = o
            .claim
            .and_then(|c| c.spec.as_ref()?.data_source_ref.as_ref())
            .is_some_and(|r| r.kind == cdi_api::populators::VOLUME_UPLOAD_SOURCE_KIND);
        dvstatus::upload_status(&Observed {
            populator: populating.then_some(s.prime),
            ..o.clone()
        })
    }

    fn finished(&self, _: &DataVolume, _: &PersistentVolumeClaim, _: &Computed) -> Vec<Leftover> {
        Vec::new()
    }
}

impl Kind for Clone {
    fn companions(&self, dv: &DataVolume, rendered: &RenderedClaim) -> Vec<Companion> {
        match clone_source(dv) {
            Some(source) if rendered.use_populator => {
                vec![Companion::CloneSource(Box::new(source))]
            }
            _ => Vec::new(),
        }
    }

    fn status(&self, o: &Observed<'_>, s: &Snapshot<'_>) -> Computed {
        // A source gone before the clone read it: the status says the clone waits for it.
        let waiting = o
            .claim
            .filter(|_| !o.populated)
            .and_then(|c| crate::clonewait::waiting_for_source(o.dv, c, s.clone_source.is_some()));
        match &waiting {
            Some(claim) => dvstatus::clone_status(&Observed {
                claim: Some(claim),
                ..o.clone()
            }),
            None => dvstatus::clone_status(o),
        }
    }

    fn finished(
        &self,
        dv: &DataVolume,
        claim: &PersistentVolumeClaim,
        status: &Computed,
    ) -> Vec<Leftover> {
        let populating = claim
            .spec
            .as_ref()
            .and_then(|s| s.data_source_ref.as_ref())
            .is_some_and(|r| r.kind == cdi_api::populators::VOLUME_CLONE_SOURCE_KIND);
        match clone_source(dv) {
            Some(source) if populating && turns_succeeded(dv, status) => {
                vec![Leftover::CloneSource {
                    namespace: source.metadata.namespace.unwrap_or_default(),
                    name: source.metadata.name.unwrap_or_default(),
                }]
            }
            _ => Vec::new(),
        }
    }
}

impl Kind for ExternalPopulation {
    fn companions(&self, _: &DataVolume, _: &RenderedClaim) -> Vec<Companion> {
        // The claim keeps the dataSourceRef the DataVolume gave it.
        Vec::new()
    }

    fn status(&self, o: &Observed<'_>, s: &Snapshot<'_>) -> Computed {
        let provisioner = class_of(s, o.claim).map(|c| c.provisioner.as_str());
        let csi_driver = provisioner.is_some_and(|p| s.csi_drivers.iter().any(|d| d == p));
        dvstatus::external_status(o, External { csi_driver })
    }

    fn finished(&self, _: &DataVolume, _: &PersistentVolumeClaim, _: &Computed) -> Vec<Leftover> {
        Vec::new()
    }
}

/// Whether this pass says the DataVolume succeeded for the first time. Upstream deletes a
/// populator's source once the DataVolume succeeded: here in that pass, before its status is
/// written (a pass that fails or is cut short leaves the status as it was, and the next pass
/// deletes again).
fn turns_succeeded(dv: &DataVolume, status: &Computed) -> bool {
    let said = dv.status.as_ref().and_then(|s| s.phase.as_ref()) == Some(&Phase::Succeeded);
    status.status.phase == Some(Phase::Succeeded) && !said
}

/// A claim's size: its capacity once bound, else its request.
fn claim_size(claim: &PersistentVolumeClaim) -> Option<i64> {
    let capacity = claim.status.as_ref()?.capacity.as_ref();
    let request = claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref();
    let q = capacity
        .and_then(|c| c.get("storage"))
        .or_else(|| request.and_then(|r| r.get("storage")))?;
    crate::quantity::Quantity::try_from(q)
        .ok()
        .map(|q| q.value())
}

/// The kind that fills the DataVolume. A source that can no longer be read (edited after its
/// claim was made) is judged by the claim it already has: the import kind.
pub fn kind_of(filled: &Result<Filled, Refusal>) -> &'static dyn Kind {
    match filled {
        Ok(Filled::External) => &ExternalPopulation,
        Ok(Filled::Import(cdi_api::datavolume::SourceKind::Upload)) => &Upload,
        Ok(Filled::Import(
            cdi_api::datavolume::SourceKind::Pvc | cdi_api::datavolume::SourceKind::Snapshot,
        )) => &Clone,
        Ok(Filled::Import(_)) | Err(_) => &Import,
    }
}

fn class_of<'a>(
    s: &Snapshot<'a>,
    claim: Option<&PersistentVolumeClaim>,
) -> Option<&'a StorageClass> {
    let name = claim?.spec.as_ref()?.storage_class_name.as_deref()?;
    s.classes
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
}

fn phase_of(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim.status.as_ref()?.phase.as_deref()
}

/// Upstream's `UpdatePVCBoundConditionFromEvents`: while the claim is Pending, its latest event
/// (what binding waits for: "waiting for first consumer to be created before binding") becomes
/// its Bound condition annotations, which reach the DataVolume; once Bound they go. The changes
/// to make, none when nothing changes.
pub fn bound_condition(
    claim: &PersistentVolumeClaim,
    events: &[ClaimEvent],
) -> BTreeMap<String, Option<String>> {
    let anns = claim.metadata.annotations.clone().unwrap_or_default();
    let mut changes = BTreeMap::new();
    match phase_of(claim) {
        Some("Bound") if anns.contains_key(ann::BOUND_CONDITION) => {
            for k in [
                ann::BOUND_CONDITION,
                ann::BOUND_CONDITION_REASON,
                ann::BOUND_CONDITION_MESSAGE,
            ] {
                changes.insert(k.to_string(), None);
            }
        }
        Some("Pending") => {
            // With a PVC prime, only its re-emitted events count, without their prefix.
            let prime = anns.get(ann::PVC_PRIME_NAME).map(|p| format!("[{p}] : "));
            let latest = events
                .iter()
                .filter(|e| e.involved_object.uid == claim.metadata.uid)
                // What binding waits for is said by the PV controller and provisioners (copied
                // from PVC prime by the populator); the controller's own warnings on the claim
                // (a refused importer pod) are not that, and would outlive their cause there.
                .filter(|e| prime.is_some() || !reported_by_controller(e))
                .filter(|e| {
                    prime.as_ref().is_none_or(|p| {
                        e.message.as_deref().is_some_and(|m| m.contains(p.as_str()))
                    })
                })
                .max_by_key(|e| seen(e));
            let Some(mut message) = latest.and_then(|e| e.message.clone()) else {
                return changes;
            };
            if let Some(p) = &prime
                && let Some(at) = message.find(p.as_str())
            {
                message = message[at + p.len()..].to_string();
            }
            if anns.get(ann::BOUND_CONDITION_MESSAGE) != Some(&message) {
                changes.insert(ann::BOUND_CONDITION.into(), Some("false".into()));
                changes.insert(ann::BOUND_CONDITION_REASON.into(), Some("Pending".into()));
                changes.insert(ann::BOUND_CONDITION_MESSAGE.into(), Some(message));
            }
        }
        _ => {}
    }
    changes
}

/// The controller's own event: by its source (core/v1) or its reporting controller
/// (events.k8s.io, whose core view has no source).
fn reported_by_controller(e: &ClaimEvent) -> bool {
    e.source.as_ref().and_then(|s| s.component.as_deref()) == Some(COMPONENT)
        || e.reporting_component.as_deref() == Some(COMPONENT)
}

/// When an event was last seen, as kube's printer says: a series' last observation, else the
/// last timestamp, else the event time (events.k8s.io events carry only that).
fn seen(e: &ClaimEvent) -> Option<Timestamp> {
    e.series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref())
        .map(|t| t.0)
        .or(e.last_timestamp.as_ref().map(|t| t.0))
        .or(e.event_time.as_ref().map(|t| t.0))
}

/// Apply annotation changes to a copy of `claim`: what the next observation will see.
fn with_annotations(
    claim: &PersistentVolumeClaim,
    changes: &BTreeMap<String, Option<String>>,
) -> PersistentVolumeClaim {
    let mut claim = claim.clone();
    let anns = claim.metadata.annotations.get_or_insert_default();
    for (k, v) in changes {
        match v {
            Some(v) => anns.insert(k.clone(), v.clone()),
            None => anns.remove(k),
        };
    }
    claim
}

/// Upstream's validateClone, before the claim is made: a claim the clone from `source` could
/// never fill (too small, another content type) is not made; the DataVolume waits, saying why,
/// instead of a claim that waits for ever with only a warning event on it.
fn clone_refusal(
    s: &Snapshot<'_>,
    source: Option<&PersistentVolumeClaim>,
    claim: &PersistentVolumeClaim,
) -> Option<Plan> {
    let why = crate::hostclone::validate_with(source?, claim, s.config).err()?;
    let refusal = Refusal {
        reason: "CloneValidationFailed",
        message: format!("{}: {why}", crate::hostclone::VALIDATION_FAILED),
    };
    let status = dvstatus::refused_status(s.dv, &refusal, Phase::Pending, s.now);
    // A source elsewhere wakes nothing here.
    Some(Plan::stopped(status, Requeue::Soon))
}

/// Decide what to do about a DataVolume.
pub fn decide(s: &Snapshot<'_>) -> Plan {
    let dv = s.dv;
    let name = dv.metadata.name.clone().unwrap_or_default();
    if dv.metadata.deletion_timestamp.is_some() {
        // What it owns goes with it; what it made elsewhere goes before its finalizer.
        let mut plan = Plan::idle();
        if holds_finalizer(dv) {
            plan.delete = s.leftovers.to_vec();
            plan.finalizer = Some(false);
        }
        return plan;
    }
    if let Some(c) = s.claim
        && c.metadata.deletion_timestamp.is_some()
        && !owned_by(c, dv)
    {
        // Left by an earlier DataVolume of this name (or by no DataVolume) and still in use:
        // neither adopted nor reported as this DataVolume's, and replaced once it is gone.
        let refusal = Refusal {
            reason: "ErrClaimBeingDeleted",
            message: format!(
                "PVC {name} is being deleted and is not this DataVolume's (a pod may still use \
                 it); a new claim is made once it is gone"
            ),
        };
        let status = dvstatus::claim_taken_status(dv, &refusal, s.now);
        return Plan::stopped(status, Requeue::Soon);
    }
    if let Some(refusal) = s.source_ref_refusal
        && !claim_made_for(s.claim, dv)
    {
        let status = dvstatus::refused_status(dv, refusal, Phase::Pending, s.now);
        // A DataSource's changes do not wake its DataVolumes.
        return Plan::stopped(status, Requeue::Soon);
    }
    let filled = source::check(dv);
    if !claim_made_for(s.claim, dv)
        && let Err(refusal) = &filled
    {
        // A source a later version may fill waits (Pending); a malformed one fails.
        let phase = if refusal.reason == source::UNSUPPORTED_SOURCE {
            Phase::Pending
        } else {
            Phase::Failed
        };
        let status = dvstatus::refused_status(dv, refusal, phase, s.now);
        return Plan::stopped(status, Requeue::OnChange);
    }
    let kind = kind_of(&filled);
    let mut plan = Plan::idle();
    let created;
    let observed_claim;
    let mut populated = false;
    match s.claim {
        None => {
            let mut clone_size = None;
            let mut pvc_source = None;
            if matches!(filled, Ok(Filled::Import(SourceKind::Pvc)))
                && let Some((src_ns, src_name)) = clone_source_of(dv)
            {
                if let Some(refusal) = s.clone_refusal {
                    let status = dvstatus::refused_status(dv, refusal, Phase::Pending, s.now);
                    return Plan::stopped(status, Requeue::OnChange);
                }
                // Upstream waits for the source before making the claim, and sizes from it.
                let Some(source) = s.clone_source else {
                    let refusal =
                        crate::clonewait::source_missing(dv, (src_ns.as_str(), src_name.as_str()));
                    let status = dvstatus::refused_status(dv, &refusal, Phase::Pending, s.now);
                    // A claim made in another namespace wakes nothing here.
                    return Plan::stopped(status, Requeue::Soon);
                };
                pvc_source = Some(source);
                // What it holds for a disk image (a Filesystem source's space less its
                // overhead): the target adds its own overhead, and a Block target needs none.
                clone_size = claim_size(source).map(|bytes| {
                    let spec = source.spec.as_ref();
                    let mode = crate::size::resolve_volume_mode(
                        spec.and_then(|s| s.volume_mode.as_deref()),
                    );
                    let class = spec.and_then(|s| s.storage_class_name.as_deref());
                    let overhead = render::filesystem_overhead(s.config, class, mode);
                    crate::size::image_space(mode, bytes, overhead)
                });
            }
            let snapshot_source = matches!(filled, Ok(Filled::Import(SourceKind::Snapshot)))
                .then(|| snapshot_source_of(dv))
                .flatten();
            if let Some((src_ns, src_name)) = &snapshot_source {
                if let Some(refusal) = s.clone_refusal {
                    let status = dvstatus::refused_status(dv, refusal, Phase::Pending, s.now);
                    return Plan::stopped(status, Requeue::OnChange);
                }
                let id = format!("{}/{name}", dv.metadata.namespace.as_deref().unwrap_or(""));
                let waiting = |reason, message: String| {
                    let refusal = Refusal { reason, message };
                    let status = dvstatus::refused_status(dv, &refusal, Phase::Pending, s.now);
                    // Snapshots are not watched: looked at again on a timer.
                    Plan::stopped(status, Requeue::Soon)
                };
                let Some(snapshot) = s.clone_snapshot else {
                    return waiting(
                        "CloneWithoutSource",
                        format!(
                            "The source snapshot {src_ns}/{src_name} doesn't exist; DataVolume {id} is cloned once it does"
                        ),
                    );
                };
                let restore_size = crate::clonepop::restore_size(snapshot);
                if snapshot["status"]["readyToUse"] != true || restore_size.is_none() {
                    return waiting(
                        "SnapshotNotReady",
                        format!(
                            "The source snapshot {src_ns}/{src_name} is not ready to use yet; DataVolume {id} is cloned once it is"
                        ),
                    );
                }
                clone_size = restore_size;
            }
            let rendered = match render::render_claim(
                dv,
                &RenderContext {
                    storage_classes: s.classes,
                    storage_profiles: s.profiles,
                    config: s.config,
                    csi_drivers: s.csi_drivers,
                    clone_size,
                },
            ) {
                Ok(r) => r,
                Err(e) => {
                    let refusal = Refusal {
                        reason: "ErrClaimNotValid",
                        // Render errors name the DataVolume themselves.
                        message: e.to_string(),
                    };
                    let status = dvstatus::refused_status(dv, &refusal, Phase::Pending, s.now);
                    return Plan::stopped(status, Requeue::OnChange);
                }
            };
            if let Some(refused) = clone_refusal(s, pvc_source, &rendered.claim) {
                return refused;
            }
            let mut rendered = rendered;
            if let Some(snapshot) = &snapshot_source
                && !rendered.use_populator
            {
                // Off the populator path (upstream's legacy snapshot clone): the snapshot is
                // restored into a claim of a class of its driver, which the claim copies.
                let driver = s.clone_snapshot_driver.unwrap_or("");
                let Some(class) = crate::hostclone::restore_class(s.classes, driver) else {
                    let refusal = Refusal {
                        reason: "CloneValidationFailed",
                        message: format!(
                            "DataVolume {}/{name}: no StorageClass of the CSI driver {} of VolumeSnapshot {}/{} to restore it into for a copy; create one",
                            dv.metadata.namespace.as_deref().unwrap_or(""),
                            crate::hostclone::driver_name(driver),
                            snapshot.0,
                            snapshot.1
                        ),
                    };
                    let status = dvstatus::refused_status(dv, &refusal, Phase::Pending, s.now);
                    return Plan::stopped(status, Requeue::Soon);
                };
                let restore_size = s
                    .clone_snapshot
                    .and_then(|v| v["status"]["restoreSize"].as_str())
                    .unwrap_or("0");
                let restore =
                    snapshot_fallback_claim(dv, &rendered.claim, snapshot, &class, restore_size);
                rendered
                    .claim
                    .metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(
                        ann::CLONE_REQUEST.into(),
                        format!("{}/{}", snapshot.0, snapshot_fallback_name(dv)),
                    );
                plan.create.push(Companion::RestoreClaim(Box::new(restore)));
            }
            plan.events.extend(
                rendered
                    .warnings
                    .iter()
                    .map(|w| Event::warning("SizeWarning", w.clone())),
            );
            plan.create.extend(kind.companions(dv, &rendered));
            // As upstream: the DataVolume says which path it took.
            let path = rendered.use_populator.to_string();
            if dv
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ann::USE_POPULATOR))
                != Some(&path)
            {
                plan.dv_annotations
                    .insert(ann::USE_POPULATOR.into(), Some(path));
            }
            // The status is that of the claim as the API server will hold it: Pending.
            let mut claim = rendered.claim;
            claim.status.get_or_insert_default().phase = Some("Pending".into());
            plan.claim = ClaimStep::Create(Box::new(claim.clone()));
            created = claim;
            observed_claim = Some(&created);
        }
        Some(c) => {
            let owned = owned_by(c, dv);
            populated = populated_for(c, dv);
            let has_controller = c
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.controller == Some(true));
            if owned {
                plan.claim_annotations = bound_condition(c, s.claim_events);
            } else if !has_controller && adoptable(c, dv, s.config) {
                let mut owners = c.metadata.owner_references.clone().unwrap_or_default();
                owners.extend(owner_reference(dv));
                plan.claim = ClaimStep::Adopt(owners);
                plan.claim_annotations
                    .insert(ann::POPULATED_FOR.into(), Some(name.clone()));
                plan.events.push(Event::normal(
                    "Bound",
                    format!("Adopted existing claim {name}"),
                ));
                populated = true;
            } else if !populated {
                let refusal = Refusal {
                    reason: "ErrResourceExists",
                    message: format!(
                        "Resource \"{name}\" already exists and is not managed by DataVolume; \
                         delete the claim, or annotate the DataVolume {} to adopt it",
                        ann::PRE_POPULATED
                    ),
                };
                // The status records the event once, when it first says so.
                let status = dvstatus::claim_taken_status(dv, &refusal, s.now);
                return Plan::stopped(status, Requeue::OnChange);
            }
            created = with_annotations(c, &plan.claim_annotations);
            observed_claim = Some(&created);
        }
    }
    let class = class_of(s, observed_claim);
    let class_wffc =
        class.and_then(|c| c.volume_binding_mode.as_deref()) == Some("WaitForFirstConsumer");
    let observed = Observed {
        dv,
        claim: observed_claim,
        class_wffc,
        honor_wffc: s
            .config
            .is_some_and(|c| c.spec.gate_enabled(gate::HONOR_WAIT_FOR_FIRST_CONSUMER)),
        populated,
        progress: s.progress.clone(),
        populator: None,
        now: s.now,
    };
    let status = kind.status(&observed, s);
    if let Some(c) = observed_claim {
        plan.delete = kind.finished(dv, c, &status);
        // A snapshot restored for a copy goes once the copy is done.
        if crate::hostclone::is_done(c) {
            plan.delete.extend(
                s.leftovers
                    .iter()
                    .filter(|l| matches!(l, Leftover::RestoreClaim { .. }))
                    .cloned(),
            );
        }
        placement(s, c, status.status.phase.as_ref(), &mut plan);
    }
    finalizer(s, &mut plan);
    // Progress is read from the running worker (an importer, or a copy's source pod), which
    // sends no events when it changes (as upstream: only while it runs). A scheduled worker's start, the claim's binding and the
    // claim's events all wake this controller: looking again without one would only cost,
    // for every DataVolume waiting its turn.
    let in_progress =
        |p: Option<&Phase>| matches!(p, Some(Phase::ImportInProgress | Phase::CloneInProgress));
    let running = in_progress(dv.status.as_ref().and_then(|s| s.phase.as_ref()))
        || in_progress(status.status.phase.as_ref());
    plan.requeue = if running {
        Requeue::Soon
    } else {
        Requeue::OnChange
    };
    plan.status = Some(status);
    plan
}

/// The finalizer is added before anything is made in another namespace, and removed once the
/// DataVolume succeeded, after what it made elsewhere is deleted.
fn finalizer(s: &Snapshot<'_>, plan: &mut Plan) {
    let dv = s.dv;
    let own = dv.metadata.namespace.as_deref().unwrap_or("");
    let elsewhere = plan.create.iter().any(|c| match c {
        Companion::CloneSource(o) => o.metadata.namespace.as_deref() != Some(own),
        Companion::RestoreClaim(o) => o.metadata.namespace.as_deref() != Some(own),
        Companion::ImportSource(_) | Companion::UploadSource(_) => false,
    });
    let said = |p: Option<&Phase>| p == Some(&Phase::Succeeded);
    let succeeded = said(dv.status.as_ref().and_then(|s| s.phase.as_ref()));
    if holds_finalizer(dv) {
        if succeeded {
            for l in s.leftovers {
                if !plan.delete.contains(l) {
                    plan.delete.push(l.clone());
                }
            }
            plan.finalizer = Some(false);
        }
    } else if elsewhere {
        plan.finalizer = Some(true);
    }
}

/// Placement beyond upstream (docs/design.md#worker-pods-follow-the-first-consumer): an unknown `worker-placement` value is said; the
/// first-consumer pod is made while the DataVolume waits for a consumer and none has chosen the
/// claim's node, and deleted once its work is done (the wait is over and what worker pods
/// inherit from it is recorded).
fn placement(
    s: &Snapshot<'_>,
    claim: &PersistentVolumeClaim,
    phase: Option<&Phase>,
    plan: &mut Plan,
) {
    let dv = s.dv;
    let what = format!(
        "DataVolume {}/{}",
        dv.metadata.namespace.as_deref().unwrap_or(""),
        dv.metadata.name.as_deref().unwrap_or("")
    );
    if let Some(message) =
        crate::placement::placement_refused(dv.metadata.annotations.as_ref(), &what)
    {
        plan.events
            .push(Event::warning(crate::placement::ERR_PLACEMENT, message));
    }
    let waiting = matches!(
        phase,
        Some(Phase::WaitForFirstConsumer | Phase::PendingPopulation)
    );
    let anns = claim.metadata.annotations.as_ref();
    let selected = anns
        .and_then(|a| a.get(ann::SELECTED_NODE))
        .is_some_and(|n| !n.is_empty());
    if let Some(pod) = s.first_consumer {
        let ended = matches!(phase, Some(Phase::Succeeded | Phase::Failed));
        let recorded = anns.is_some_and(|a| a.contains_key(cdi_api::ext::WORKER_TOLERATIONS))
            || !crate::placement::follows_consumer(claim, s.config);
        if ended || (!waiting && recorded) || crate::first_consumer::template(dv).is_none() {
            plan.first_consumer = pod.metadata.name.clone().map(PodStep::Delete);
        } else if let Some(reason) = crate::first_consumer::unschedulable(pod) {
            plan.events.push(Event::warning(
                crate::first_consumer::UNSCHEDULABLE,
                format!(
                    "the first-consumer pod {} of {what} cannot be scheduled: {reason}; \
                     change the {} template, or the nodes",
                    pod.metadata.name.as_deref().unwrap_or(""),
                    cdi_api::ext::FIRST_CONSUMER
                ),
            ));
        }
        return;
    }
    if !waiting || selected || !owned_by(claim, dv) || phase_of(claim) != Some("Pending") {
        return;
    }
    match crate::first_consumer::template(dv) {
        None => {}
        Some(Err(message)) => plan
            .events
            .push(Event::warning(crate::first_consumer::ERR_TEMPLATE, message)),
        Some(Ok(t)) => {
            let name = claim.metadata.name.as_deref().unwrap_or("");
            let pod = crate::first_consumer::pod(dv, name, &t, s.worker_image);
            plan.first_consumer = Some(PodStep::Create(Box::new(pod)));
        }
    }
}

#[cfg(test)]
mod tests;
