//! The objects a DataVolume makes besides its claim, and their names: the populators' sources
//! (VolumeImportSource, VolumeUploadSource, VolumeCloneSource) and the claim a snapshot is
//! restored into for a host-assisted copy.

use std::collections::BTreeMap;

use cdi_api::ann;
use cdi_api::datavolume::DataVolume;
use cdi_api::populators::{
    ImportSourceType, VolumeCloneSource, VolumeCloneSourceSpec, VolumeImportSource,
    VolumeImportSourceSpec, VolumeUploadSource, VolumeUploadSourceSpec,
};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::refs::{clone_source_of, owner_reference, snapshot_source_of};

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
    crate::clone::host::restored_claim(
        meta,
        &snapshot.1,
        class,
        target_spec.access_modes,
        target_spec.volume_mode,
        restore_size,
    )
}
