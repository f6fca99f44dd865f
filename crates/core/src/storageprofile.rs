//! StorageProfile resolution: what a profile's status says for its StorageClass, in upstream's
//! order of precedence (docs/design.md#storage-profiles).

use std::collections::BTreeMap;

use cdi_api::ann;
use cdi_api::enums::{
    AccessMode, CloneStrategy, ConditionStatus, DataImportCronSourceFormat, StorageProfileReason,
};
use cdi_api::storageprofile::{ClaimPropertySet, StorageProfileSpec, StorageProfileStatus};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::capabilities::{self, Capability, NO_PROVISIONER};

/// A VolumeSnapshotClass as far as the decisions need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotClassInfo {
    pub name: String,
    pub driver: String,
    /// Annotated `snapshot.storage.kubernetes.io/is-default-class: "true"`.
    pub is_default: bool,
}

/// A PersistentVolume of a `kubernetes.io/no-provisioner` class, reduced to what it offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticVolume {
    pub access_modes: Vec<AccessMode>,
    pub volume_mode: cdi_api::VolumeMode,
}

/// Why a profile cannot be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error(
        "StorageProfile {profile}: each claimPropertySet must provide both volumeMode and accessModes; set both in spec.claimPropertySets[{index}]"
    )]
    IncompleteClaimPropertySet { profile: String, index: usize },
    #[error(
        "StorageProfile {profile}: spec.snapshotClass {name} is for driver {driver}, not for the class's provisioner {provisioner}"
    )]
    SnapshotClassDriverMismatch {
        profile: String,
        name: String,
        driver: String,
        provisioner: String,
    },
    #[error(
        "StorageProfile {profile}: spec.snapshotClass {name} does not exist; create it or remove the field"
    )]
    SnapshotClassMissing { profile: String, name: String },
}

/// What the StorageProfile controller should write for one StorageClass.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedProfile {
    pub provisioner: String,
    /// The table key the class maps to (for diagnostics: `cdi doctor` shows it).
    pub key: String,
    pub claim_property_sets: Vec<ClaimPropertySet>,
    pub clone_strategy: Option<CloneStrategy>,
    pub data_import_cron_source_format: DataImportCronSourceFormat,
    pub snapshot_class: Option<String>,
    /// The `Recognized` condition.
    pub recognized: (ConditionStatus, StorageProfileReason, &'static str),
    /// Annotations to add when absent (upstream never overwrites them).
    pub default_annotations: BTreeMap<String, String>,
}

/// The snapshot class for clones of volumes of `provisioner`: the one named in the profile (it
/// must exist and match the driver), else the default-annotated class for the driver, else the
/// first by name.
pub fn snapshot_class_for(
    profile: &str,
    provisioner: &str,
    named: Option<&str>,
    classes: &[SnapshotClassInfo],
) -> Result<Option<String>, ProfileError> {
    if let Some(name) = named {
        let class = classes.iter().find(|c| c.name == name).ok_or_else(|| {
            ProfileError::SnapshotClassMissing {
                profile: profile.to_string(),
                name: name.to_string(),
            }
        })?;
        if class.driver != provisioner {
            return Err(ProfileError::SnapshotClassDriverMismatch {
                profile: profile.to_string(),
                name: name.to_string(),
                driver: class.driver.clone(),
                provisioner: provisioner.to_string(),
            });
        }
        return Ok(Some(name.to_string()));
    }
    let candidates: Vec<&SnapshotClassInfo> =
        classes.iter().filter(|c| c.driver == provisioner).collect();
    if let Some(default) = candidates.iter().find(|c| c.is_default) {
        return Ok(Some(default.name.clone()));
    }
    Ok(candidates.iter().map(|c| c.name.clone()).min())
}

fn sets_from(caps: &[Capability]) -> Vec<ClaimPropertySet> {
    caps.iter()
        .map(|c| ClaimPropertySet::new([c.access_mode], c.volume_mode))
        .collect()
}

/// Resolve a profile for `class`. `static_volumes` are the PVs of the class (used only for
/// `kubernetes.io/no-provisioner`), `snapshot_classes` every VolumeSnapshotClass.
pub fn resolve(
    class: &StorageClass,
    spec: &StorageProfileSpec,
    snapshot_classes: &[SnapshotClassInfo],
    static_volumes: &[StaticVolume],
) -> Result<ResolvedProfile, ProfileError> {
    let name = class.metadata.name.clone().unwrap_or_default();
    let provisioner = class.provisioner.clone();
    let params = class.parameters.clone().unwrap_or_default();
    let key = capabilities::provisioner_key(&provisioner, &params);
    let claim_property_sets = claim_property_sets(&name, &key, spec, static_volumes)?;
    let snapshot_class = snapshot_class_for(
        &name,
        &provisioner,
        spec.snapshot_class.as_deref(),
        snapshot_classes,
    )?;
    let clone_strategy = clone_strategy(class, spec, &key, snapshot_class.is_some());
    let data_import_cron_source_format = spec.data_import_cron_source_format.unwrap_or_else(|| {
        match capabilities::advised_source_format(&key) {
            Some(DataImportCronSourceFormat::Snapshot) if snapshot_class.is_some() => {
                DataImportCronSourceFormat::Snapshot
            }
            _ => DataImportCronSourceFormat::Pvc,
        }
    });
    Ok(ResolvedProfile {
        provisioner,
        recognized: recognized(&key),
        default_annotations: default_annotations(&key),
        key,
        claim_property_sets,
        clone_strategy,
        data_import_cron_source_format,
        snapshot_class,
    })
}

/// claimPropertySets: the spec's wholesale, else the table's, one set per capability (for
/// `kubernetes.io/no-provisioner`, what the class's volumes offer).
fn claim_property_sets(
    name: &str,
    key: &str,
    spec: &StorageProfileSpec,
    static_volumes: &[StaticVolume],
) -> Result<Vec<ClaimPropertySet>, ProfileError> {
    Ok(match spec.claim_property_sets.as_deref() {
        Some(sets) if !sets.is_empty() => {
            if let Some(index) = sets.iter().position(|s| s.access_modes.is_empty()) {
                return Err(ProfileError::IncompleteClaimPropertySet {
                    profile: name.to_string(),
                    index,
                });
            }
            sets.to_vec()
        }
        _ if key == NO_PROVISIONER => {
            // Upstream dedups through a map (random order); first-seen order is deterministic.
            let mut caps: Vec<Capability> = Vec::new();
            for volume in static_volumes {
                for mode in &volume.access_modes {
                    let c = Capability {
                        access_mode: *mode,
                        volume_mode: volume.volume_mode,
                    };
                    if !caps.contains(&c) {
                        caps.push(c);
                    }
                }
            }
            sets_from(&caps)
        }
        _ => capabilities::capabilities(key)
            .map(sets_from)
            .unwrap_or_default(),
    })
}

/// cloneStrategy: spec → class annotation → advised/default (snapshot needs a class).
fn clone_strategy(
    class: &StorageClass,
    spec: &StorageProfileSpec,
    key: &str,
    has_snapshot_class: bool,
) -> Option<CloneStrategy> {
    let annotation = class
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(cdi_api::ann::CLONE_STRATEGY));
    if let Some(strategy) = spec.clone_strategy {
        Some(strategy)
    } else if let Some(value) = annotation {
        // Upstream turns an unknown annotation value into an empty strategy; we leave it unset.
        value.parse().ok()
    } else {
        let default = if has_snapshot_class {
            CloneStrategy::Snapshot
        } else {
            CloneStrategy::Copy
        };
        let strategy = capabilities::advised_clone_strategy(key).unwrap_or(default);
        Some(
            if strategy == CloneStrategy::Snapshot && !has_snapshot_class {
                CloneStrategy::Copy
            } else {
                strategy
            },
        )
    }
}

/// The `Recognized` condition: whether the provisioner (and its parameters) are in the table.
fn recognized(key: &str) -> (ConditionStatus, StorageProfileReason, &'static str) {
    let reason = capabilities::recognition(key);
    match reason {
        StorageProfileReason::RecognizedProvisioner => {
            (ConditionStatus::True, reason, "Provisioner is recognized")
        }
        StorageProfileReason::UnrecognizedStorageClassParameters => (
            ConditionStatus::False,
            reason,
            "Storage class parameters are not recognized",
        ),
        _ => (
            ConditionStatus::False,
            reason,
            "Provisioner is not recognized",
        ),
    }
}

/// The annotations the table gives a provisioner: its minimum claim size, and whether crons
/// import ReadWriteOnce.
fn default_annotations(key: &str) -> BTreeMap<String, String> {
    let mut default_annotations = BTreeMap::new();
    if let Some(min) = capabilities::minimum_pvc_size(key) {
        default_annotations.insert(
            cdi_api::ann::MINIMUM_SUPPORTED_PVC_SIZE.to_string(),
            min.to_string(),
        );
    }
    if capabilities::read_write_once_for_data_import_cron(key) {
        default_annotations.insert(
            cdi_api::ann::USE_READ_WRITE_ONCE_FOR_DATA_IMPORT_CRON.to_string(),
            "true".to_string(),
        );
    }
    default_annotations
}

/// The labels of upstream's `kubevirt_cdi_storageprofile_info` gauge for one profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    pub storage_class: String,
    pub provisioner: String,
    /// Every claimPropertySet has access modes and a volume mode (an unsupported provisioner
    /// counts as complete: nothing is missing that could be filled).
    pub complete: bool,
    /// The Kubernetes default class.
    pub default: bool,
    /// The default class for virtualization.
    pub virt_default: bool,
    /// A claimPropertySet offers ReadWriteMany.
    pub rwx: bool,
    /// Clones need no copy through pods: a CSI clone of a driver with a CSIDriver object, or a
    /// snapshot with a VolumeSnapshotClass of the driver.
    pub smart_clone: bool,
    /// Not what virtualization wants: no ReadWriteMany (live migration) or no smart clone.
    pub degraded: bool,
}

/// Upstream's `computeMetrics`: the profile's labels from its status, its class, the CSIDriver
/// objects' names and the drivers of the VolumeSnapshotClasses. `None` until the status names
/// the class and provisioner.
pub fn info(
    status: &StorageProfileStatus,
    class: &StorageClass,
    csi_drivers: &[String],
    snapshot_drivers: &[String],
) -> Option<Info> {
    let storage_class = status.storage_class.clone()?;
    let provisioner = status.provisioner.clone()?;
    let sets = status.claim_property_sets.as_deref().unwrap_or(&[]);
    // A set without a volume mode does not parse, so only the access modes can be missing.
    let incomplete = sets.is_empty() || sets.iter().any(|s| s.access_modes.is_empty());
    let complete = crate::capabilities::UNSUPPORTED_PROVISIONERS.contains(&provisioner.as_str())
        || !incomplete;
    let annotated = |key: &str| {
        class
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .is_some_and(|v| v == "true")
    };
    let rwx = sets
        .iter()
        .any(|s| s.access_modes.contains(&AccessMode::ReadWriteMany));
    let smart_clone = match status.clone_strategy {
        Some(CloneStrategy::Copy) => false,
        Some(CloneStrategy::CsiClone) => csi_drivers.contains(&provisioner),
        Some(CloneStrategy::Snapshot) | None => snapshot_drivers.contains(&provisioner),
    };
    Some(Info {
        storage_class,
        provisioner,
        complete,
        default: annotated(ann::DEFAULT_STORAGE_CLASS),
        virt_default: annotated(ann::DEFAULT_VIRT_STORAGE_CLASS),
        rwx,
        smart_clone,
        // Upstream spares single-node OpenShift the ReadWriteMany part; cdi-rs knows no such
        // topology.
        degraded: !rwx || !smart_clone,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdi_api::VolumeMode;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn class(
        name: &str,
        provisioner: &str,
        params: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            provisioner: provisioner.into(),
            parameters: Some(
                params
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn snap(name: &str, driver: &str, is_default: bool) -> SnapshotClassInfo {
        SnapshotClassInfo {
            name: name.into(),
            driver: driver.into(),
            is_default,
        }
    }

    #[test]
    fn table_provisioner_gets_one_set_per_capability() {
        let p = resolve(
            &class("ceph", "rbd.csi.ceph.com", &[], &[]),
            &Default::default(),
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(
            p.claim_property_sets,
            vec![
                ClaimPropertySet::new([AccessMode::ReadWriteMany], VolumeMode::Block),
                ClaimPropertySet::new([AccessMode::ReadWriteOnce], VolumeMode::Block),
                ClaimPropertySet::new([AccessMode::ReadWriteOnce], VolumeMode::Filesystem),
            ]
        );
        assert_eq!(p.clone_strategy, Some(CloneStrategy::CsiClone), "advised");
        assert_eq!(p.recognized.0, ConditionStatus::True);
    }

    #[test]
    fn unknown_provisioner_has_no_sets_and_copies() {
        let p = resolve(
            &class("local-path-wffc", "rancher.io/local-path", &[], &[]),
            &Default::default(),
            &[],
            &[],
        )
        .unwrap();
        assert!(p.claim_property_sets.is_empty());
        assert_eq!(p.clone_strategy, Some(CloneStrategy::Copy));
        assert_eq!(
            p.data_import_cron_source_format,
            DataImportCronSourceFormat::Pvc
        );
        assert_eq!(
            p.recognized,
            (
                ConditionStatus::False,
                StorageProfileReason::UnrecognizedProvisioner,
                "Provisioner is not recognized"
            )
        );
    }

    #[test]
    fn clone_strategy_precedence() {
        let spec_copy = StorageProfileSpec {
            clone_strategy: Some(CloneStrategy::Copy),
            ..Default::default()
        };
        let annotated = class(
            "c",
            "rbd.csi.ceph.com",
            &[],
            &[(cdi_api::ann::CLONE_STRATEGY, "snapshot")],
        );
        assert_eq!(
            resolve(&annotated, &spec_copy, &[], &[])
                .unwrap()
                .clone_strategy,
            Some(CloneStrategy::Copy)
        );
        assert_eq!(
            resolve(&annotated, &Default::default(), &[], &[])
                .unwrap()
                .clone_strategy,
            Some(CloneStrategy::Snapshot)
        );
        let bogus = class(
            "c",
            "rbd.csi.ceph.com",
            &[],
            &[(cdi_api::ann::CLONE_STRATEGY, "teleport")],
        );
        assert_eq!(
            resolve(&bogus, &Default::default(), &[], &[])
                .unwrap()
                .clone_strategy,
            None
        );
        // Not in the advised table: snapshot when a class exists for the driver, else copy.
        let plain = class("c", "example.csi.driver", &[], &[]);
        let snaps = [
            snap("b-snap", "example.csi.driver", false),
            snap("a-snap", "example.csi.driver", false),
        ];
        let p = resolve(&plain, &Default::default(), &snaps, &[]).unwrap();
        assert_eq!(
            (p.clone_strategy, p.snapshot_class.as_deref()),
            (Some(CloneStrategy::Snapshot), Some("a-snap"))
        );
        assert_eq!(
            resolve(&plain, &Default::default(), &[], &[])
                .unwrap()
                .clone_strategy,
            Some(CloneStrategy::Copy)
        );
        // Advised snapshot without a snapshot class falls back to copy; advised copy wins over snapshot.
        let gke = class("c", "pd.csi.storage.gke.io", &[], &[]);
        assert_eq!(
            resolve(&gke, &Default::default(), &[], &[])
                .unwrap()
                .clone_strategy,
            Some(CloneStrategy::Copy)
        );
        let topolvm = class("c", "topolvm.io", &[], &[]);
        let snaps = [snap("t", "topolvm.io", true)];
        assert_eq!(
            resolve(&topolvm, &Default::default(), &snaps, &[])
                .unwrap()
                .clone_strategy,
            Some(CloneStrategy::Copy)
        );
    }

    #[test]
    fn snapshot_class_choice() {
        let classes = [
            snap("z", "d", false),
            snap("y", "d", true),
            snap("a", "other", true),
        ];
        assert_eq!(
            snapshot_class_for("p", "d", None, &classes)
                .unwrap()
                .as_deref(),
            Some("y")
        );
        assert_eq!(
            snapshot_class_for("p", "d", Some("z"), &classes)
                .unwrap()
                .as_deref(),
            Some("z")
        );
        let err = snapshot_class_for("p", "d", Some("a"), &classes)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is for driver other"), "{err}");
        let err = snapshot_class_for("p", "d", Some("nope"), &classes)
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not exist"), "{err}");
        assert_eq!(
            snapshot_class_for("p", "none", None, &classes).unwrap(),
            None
        );
    }

    #[test]
    fn spec_sets_win_and_must_be_complete() {
        let sets = vec![ClaimPropertySet::new(
            [AccessMode::ReadWriteOnce],
            VolumeMode::Filesystem,
        )];
        let spec = StorageProfileSpec {
            claim_property_sets: Some(sets.clone()),
            ..Default::default()
        };
        let p = resolve(
            &class("lp", "rancher.io/local-path", &[], &[]),
            &spec,
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(p.claim_property_sets, sets);
        let bad = StorageProfileSpec {
            claim_property_sets: Some(vec![
                sets[0].clone(),
                ClaimPropertySet::new([], VolumeMode::Block),
            ]),
            ..Default::default()
        };
        let err = resolve(
            &class("lp", "rancher.io/local-path", &[], &[]),
            &bad,
            &[],
            &[],
        )
        .unwrap_err();
        assert_eq!(
            err,
            ProfileError::IncompleteClaimPropertySet {
                profile: "lp".into(),
                index: 1
            }
        );
        assert!(err.to_string().contains("spec.claimPropertySets[1]"));
    }

    #[test]
    fn no_provisioner_classes_take_their_volumes_modes() {
        let volumes = [
            StaticVolume {
                access_modes: vec![AccessMode::ReadWriteOnce],
                volume_mode: VolumeMode::Block,
            },
            StaticVolume {
                access_modes: vec![AccessMode::ReadWriteOnce, AccessMode::ReadOnlyMany],
                volume_mode: VolumeMode::Block,
            },
        ];
        let p = resolve(
            &class("local", NO_PROVISIONER, &[], &[]),
            &Default::default(),
            &[],
            &volumes,
        )
        .unwrap();
        assert_eq!(p.claim_property_sets.len(), 2);
        assert_eq!(
            p.recognized.1,
            StorageProfileReason::UnrecognizedProvisioner
        );
    }

    #[test]
    fn minimum_size_and_rwo_annotations() {
        let p = resolve(
            &class("ebs", "ebs.csi.aws.com", &[("type", "io2")], &[]),
            &Default::default(),
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(
            p.default_annotations[cdi_api::ann::MINIMUM_SUPPORTED_PVC_SIZE],
            "4Gi"
        );
        let p = resolve(
            &class("gke", "pd.csi.storage.gke.io", &[], &[]),
            &Default::default(),
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(
            p.default_annotations[cdi_api::ann::USE_READ_WRITE_ONCE_FOR_DATA_IMPORT_CRON],
            "true"
        );
        let p = resolve(
            &class("sy", "csi.san.synology.com", &[("protocol", "ftp")], &[]),
            &Default::default(),
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(
            p.recognized.2,
            "Storage class parameters are not recognized"
        );
    }

    #[test]
    fn info_labels_follow_upstreams_metric() {
        let sc = class(
            "fast",
            "csi.example.com",
            &[],
            &[("storageclass.kubernetes.io/is-default-class", "true")],
        );
        let set = |modes: Vec<AccessMode>| ClaimPropertySet {
            access_modes: modes,
            volume_mode: VolumeMode::Block,
        };
        let mut status = StorageProfileStatus {
            storage_class: Some("fast".into()),
            provisioner: Some("csi.example.com".into()),
            clone_strategy: Some(CloneStrategy::CsiClone),
            claim_property_sets: Some(vec![set(vec![AccessMode::ReadWriteMany])]),
            ..Default::default()
        };
        let drivers = ["csi.example.com".to_string()];
        let i = info(&status, &sc, &drivers, &[]).unwrap();
        assert!(i.complete && i.default && !i.virt_default && i.rwx && i.smart_clone);
        assert!(!i.degraded);
        // A CSI clone without a CSIDriver object is no smart clone; a snapshot needs a class
        // of the driver; a copy never is one.
        assert!(!info(&status, &sc, &[], &[]).unwrap().smart_clone);
        status.clone_strategy = None;
        assert!(info(&status, &sc, &[], &drivers).unwrap().smart_clone);
        status.clone_strategy = Some(CloneStrategy::Copy);
        let i = info(&status, &sc, &drivers, &drivers).unwrap();
        assert!(!i.smart_clone && i.degraded);
        // No sets, or a set without access modes: incomplete, unless the provisioner is one
        // CDI cannot use at all.
        status.claim_property_sets = Some(vec![set(vec![])]);
        assert!(!info(&status, &sc, &[], &[]).unwrap().complete);
        status.claim_property_sets = None;
        status.provisioner = Some("kubernetes.io/no-provisioner".into());
        assert!(info(&status, &sc, &[], &[]).unwrap().complete);
        // Not resolved yet: no series.
        status.provisioner = None;
        assert!(info(&status, &sc, &[], &[]).is_none());
    }
}
