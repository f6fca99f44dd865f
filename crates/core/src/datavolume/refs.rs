//! What a DataVolume names and what names it: the claim or snapshot a clone copies, the owner
//! reference its objects carry, whether an object was made for it, whether it holds its
//! finalizer. Plain lookups on the DataVolume, used by the decision and by the status, clone
//! and first-consumer modules alike (which is why they live apart from the decision).

use cdi_api::ann;
use cdi_api::datavolume::DataVolume;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

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
