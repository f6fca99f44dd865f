//! What differs between source kinds: one [`Kind`] each (import, upload, clone, external
//! population) says which companions its claim needs, its status, and what goes once its work
//! is done.

use cdi_api::datavolume::DataVolume;
use cdi_api::enums::DataVolumePhase as Phase;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::dvstatus::{self, Computed, External, Observed};
use crate::render::RenderedClaim;
use crate::source::{Filled, Refusal};

use super::companions::{clone_source, import_source, import_source_name, upload_source};
use super::plan::{Companion, Leftover};
use super::snapshot::Snapshot;

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

/// Clone (`source.pvc`): a host-assisted copy into the claim, or through the clone populator
/// (which may also use a CSI clone or a snapshot) into PVC prime.
pub struct Clone;

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
        let waiting = o.claim.filter(|_| !o.populated).and_then(|c| {
            crate::clone::wait::waiting_for_source(o.dv, c, s.clone_source.is_some())
        });
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
pub(super) fn turns_succeeded(dv: &DataVolume, status: &Computed) -> bool {
    let said = dv.status.as_ref().and_then(|s| s.phase.as_ref()) == Some(&Phase::Succeeded);
    status.status.phase == Some(Phase::Succeeded) && !said
}

pub(super) fn class_of<'a>(
    s: &Snapshot<'a>,
    claim: Option<&PersistentVolumeClaim>,
) -> Option<&'a StorageClass> {
    let name = claim?.spec.as_ref()?.storage_class_name.as_deref()?;
    s.classes
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
}
