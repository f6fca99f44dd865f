//! The clone strategy for a PVC source (docs/cloning.md#clone-strategies): which of snapshot, csi-clone and host-assisted
//! copy a clone uses, and why it fell back to copy when it did.
//!
//! The clone decisions live here: the strategy (this module), the host-assisted copy
//! ([`host`]), the clone populator ([`populator`]) and a clone waiting for its source
//! ([`wait`]).

pub mod host;
pub mod populator;
pub mod wait;

use cdi_api::enums::CloneStrategy;

use crate::storageprofile::{SnapshotClassInfo, snapshot_class_for};

/// One side of a clone, reduced to what the strategy depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneClaim {
    pub namespace: String,
    pub name: String,
    /// The CSI driver: the bound PV's driver, else the StorageClass's provisioner; `None` when
    /// neither is known (no class).
    pub driver: Option<String>,
    pub volume_mode: cdi_api::VolumeMode,
    /// `spec.resources.requests.storage` in bytes.
    pub request: i64,
    /// What that request holds for a disk image (less the filesystem overhead on a Filesystem
    /// volume): what sizes are compared by, so a Filesystem source fits a Block target of its
    /// image's size.
    pub usable: i64,
    /// `status.capacity.storage` in bytes, once bound.
    pub capacity: Option<i64>,
}

/// What the target side's cluster says.
#[derive(Debug, Clone, Default)]
pub struct CloneEnvironment<'a> {
    /// The target claim's StorageClass exists (by name).
    pub target_class: Option<&'a str>,
    pub target_class_exists: bool,
    /// The target class allows volume expansion.
    pub allow_volume_expansion: bool,
    /// `CDI.spec.cloneStrategyOverride`.
    pub strategy_override: Option<CloneStrategy>,
    /// The target StorageProfile's `status.cloneStrategy`.
    pub profile_strategy: Option<CloneStrategy>,
    /// The target StorageProfile's `spec.snapshotClass`.
    pub profile_snapshot_class: Option<&'a str>,
    pub snapshot_classes: &'a [SnapshotClassInfo],
    /// `cdi.kubevirt.io/permissiveClone` on the target: skip the size check.
    pub permissive: bool,
}

/// Why a faster strategy was not possible; each is a warning event on the target claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackReason {
    NoVolumeSnapshotClass,
    IncompatibleProvisioners,
    IncompatibleVolumeModes,
    NoVolumeExpansion,
    /// A VolumeSnapshot source taken by another driver than the target class's.
    NoProvisionerMatch,
}

impl FallbackReason {
    /// The event reason upstream emits.
    pub const fn reason(self) -> &'static str {
        match self {
            FallbackReason::NoVolumeSnapshotClass => "NoVolumeSnapshotClass",
            FallbackReason::IncompatibleProvisioners => "IncompatibleProvisioners",
            FallbackReason::IncompatibleVolumeModes => "IncompatibleVolumeModes",
            FallbackReason::NoVolumeExpansion => "NoVolumeExpansion",
            FallbackReason::NoProvisionerMatch => "NoProvisionerMatch",
        }
    }

    /// The event message upstream emits (also written to `cdi.kubevirt.io/cloneFallbackReason`).
    pub const fn message(self) -> &'static str {
        match self {
            FallbackReason::NoVolumeSnapshotClass => "No compatible volumesnapshotclass found",
            FallbackReason::IncompatibleProvisioners => "Provisioners are incompatible",
            FallbackReason::IncompatibleVolumeModes => {
                "The volume modes of source and target are incompatible"
            }
            FallbackReason::NoVolumeExpansion => "No volume expansion is possible",
            FallbackReason::NoProvisionerMatch => {
                "The storageclass provisioner does not match the volumesnapshotcontent driver"
            }
        }
    }
}

/// The chosen strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClonePlan {
    pub strategy: CloneStrategy,
    /// Set when the preferred strategy was not possible and `copy` was chosen instead.
    pub fallback: Option<FallbackReason>,
    /// The VolumeSnapshotClass a snapshot clone uses.
    pub snapshot_class: Option<String>,
}

/// Why no strategy can be chosen yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloneError {
    #[error(
        "clone target {target}: it has no StorageClass; set spec.storage.storageClassName or mark a class as default"
    )]
    NoTargetClass { target: String },
    #[error(
        "clone target {target}: StorageClass {class} does not exist; create it or choose another"
    )]
    TargetClassMissing { target: String, class: String },
    #[error(
        "clone target {target}: the source pvc {source_claim} doesn't exist; create it, or fix spec.source.pvc"
    )]
    SourceMissing {
        target: String,
        source_claim: String,
    },
    #[error(
        "clone target {target}: target resources requests storage size is smaller than the source {target_size} < {source_size}; ask for at least the source's size"
    )]
    TargetTooSmall {
        target: String,
        target_size: i64,
        source_size: i64,
    },
    #[error(
        "clone target {target}: the source {source_claim} has no capacity yet; it must be bound before a {strategy} clone"
    )]
    SourceUnbound {
        target: String,
        source_claim: String,
        strategy: CloneStrategy,
    },
}

/// Choose the strategy to clone the claim `source_name` ("namespace/name"; `source` is None when
/// it does not exist) into `target`.
pub fn choose_strategy(
    source_name: &str,
    source: Option<&CloneClaim>,
    target: &CloneClaim,
    env: &CloneEnvironment<'_>,
) -> Result<ClonePlan, CloneError> {
    let target_id = format!("{}/{}", target.namespace, target.name);
    let class =
        env.target_class
            .filter(|c| !c.is_empty())
            .ok_or_else(|| CloneError::NoTargetClass {
                target: target_id.clone(),
            })?;
    if !env.target_class_exists {
        return Err(CloneError::TargetClassMissing {
            target: target_id,
            class: class.to_string(),
        });
    }
    let source = source.ok_or_else(|| CloneError::SourceMissing {
        target: target_id.clone(),
        source_claim: source_name.to_string(),
    })?;
    if !env.permissive && source.usable > target.usable {
        return Err(CloneError::TargetTooSmall {
            target: target_id,
            target_size: target.usable,
            source_size: source.usable,
        });
    }

    let copy = |reason| {
        Ok(ClonePlan {
            strategy: CloneStrategy::Copy,
            fallback: Some(reason),
            snapshot_class: None,
        })
    };
    let strategy = env
        .strategy_override
        .or(env.profile_strategy)
        .unwrap_or(CloneStrategy::Snapshot);
    if strategy == CloneStrategy::Copy {
        return Ok(ClonePlan {
            strategy,
            fallback: None,
            snapshot_class: None,
        });
    }

    let common_driver = match (&source.driver, &target.driver) {
        (Some(a), Some(b)) if a == b => Some(a.clone()),
        _ => None,
    };
    let mut snapshot_class = None;
    if strategy == CloneStrategy::Snapshot {
        let found = common_driver.as_deref().and_then(|driver| {
            snapshot_class_for(
                class,
                driver,
                env.profile_snapshot_class,
                env.snapshot_classes,
            )
            .ok()
            .flatten()
        });
        match found {
            Some(name) => snapshot_class = Some(name),
            None => return copy(FallbackReason::NoVolumeSnapshotClass),
        }
    }
    if common_driver.is_none() {
        return copy(FallbackReason::IncompatibleProvisioners);
    }
    if source.volume_mode != target.volume_mode {
        return copy(FallbackReason::IncompatibleVolumeModes);
    }
    let capacity = source.capacity.ok_or_else(|| CloneError::SourceUnbound {
        target: target_id,
        source_claim: source_name.to_string(),
        strategy,
    })?;
    if capacity < target.request && !env.allow_volume_expansion {
        return copy(FallbackReason::NoVolumeExpansion);
    }
    Ok(ClonePlan {
        strategy,
        fallback: None,
        snapshot_class,
    })
}

/// What a VolumeSnapshot source says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSource {
    /// The CSI driver that took it (its VolumeSnapshotContent's), when known.
    pub driver: Option<String>,
    /// The volume mode of the volume it was taken of, when recorded.
    pub volume_mode: Option<cdi_api::VolumeMode>,
    /// `status.restoreSize` in bytes.
    pub restore_size: i64,
}

/// The strategy for a VolumeSnapshot source (upstream's `computeStrategyForSourceSnapshot`):
/// `snapshot` (restored by the driver) when the target's class is of the driver that took it,
/// the restored volume can grow to the target's request, and its volume mode is the target's;
/// else a host-assisted `copy` from a claim it is restored into, for the first reason that fails.
pub fn snapshot_strategy(
    snapshot: &SnapshotSource,
    target: &CloneClaim,
    allow_volume_expansion: bool,
) -> ClonePlan {
    let fallback = if snapshot.driver.is_none() || snapshot.driver != target.driver {
        Some(FallbackReason::NoProvisionerMatch)
    } else if snapshot.restore_size < target.request && !allow_volume_expansion {
        Some(FallbackReason::NoVolumeExpansion)
    } else if snapshot
        .volume_mode
        .is_some_and(|m| m != target.volume_mode)
    {
        Some(FallbackReason::IncompatibleVolumeModes)
    } else {
        None
    };
    ClonePlan {
        strategy: if fallback.is_some() {
            CloneStrategy::Copy
        } else {
            CloneStrategy::Snapshot
        },
        fallback,
        snapshot_class: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdi_api::VolumeMode;

    #[test]
    fn a_snapshot_is_restored_by_its_own_driver_else_copied_from_a_restored_claim() {
        let target = CloneClaim {
            namespace: "vms".into(),
            name: "disk".into(),
            driver: Some("csi.example".into()),
            volume_mode: VolumeMode::Filesystem,
            request: 2 << 30,
            usable: 2 << 30,
            capacity: None,
        };
        let snapshot = SnapshotSource {
            driver: Some("csi.example".into()),
            volume_mode: Some(VolumeMode::Filesystem),
            restore_size: 1 << 30,
        };
        let chosen = |s: &SnapshotSource, t: &CloneClaim, grows| {
            let plan = snapshot_strategy(s, t, grows);
            (plan.strategy, plan.fallback)
        };
        assert_eq!(
            chosen(&snapshot, &target, true),
            (CloneStrategy::Snapshot, None)
        );
        let other = SnapshotSource {
            driver: Some("nfs.example".into()),
            ..snapshot.clone()
        };
        let unknown = SnapshotSource {
            driver: None,
            ..snapshot.clone()
        };
        for s in [&other, &unknown] {
            assert_eq!(
                chosen(s, &target, true),
                (
                    CloneStrategy::Copy,
                    Some(FallbackReason::NoProvisionerMatch)
                )
            );
        }
        assert_eq!(
            chosen(&snapshot, &target, false),
            (CloneStrategy::Copy, Some(FallbackReason::NoVolumeExpansion))
        );
        let same_size = CloneClaim {
            request: 1 << 30,
            ..target.clone()
        };
        assert_eq!(
            chosen(&snapshot, &same_size, false),
            (CloneStrategy::Snapshot, None)
        );
        let block = CloneClaim {
            volume_mode: VolumeMode::Block,
            ..target.clone()
        };
        assert_eq!(
            chosen(&snapshot, &block, true),
            (
                CloneStrategy::Copy,
                Some(FallbackReason::IncompatibleVolumeModes)
            )
        );
        // A snapshot that does not say its volume's mode is taken to be of the target's.
        let unsaid = SnapshotSource {
            volume_mode: None,
            ..snapshot.clone()
        };
        assert_eq!(
            chosen(&unsaid, &block, true),
            (CloneStrategy::Snapshot, None)
        );
    }

    const GI: i64 = 1 << 30;

    fn claim(
        name: &str,
        driver: Option<&str>,
        mode: VolumeMode,
        request: i64,
        capacity: Option<i64>,
    ) -> CloneClaim {
        CloneClaim {
            namespace: "ns".into(),
            name: name.into(),
            driver: driver.map(str::to_string),
            volume_mode: mode,
            request,
            usable: request,
            capacity,
        }
    }

    /// Sizes are compared by what the volumes hold for a disk image: a Filesystem source's
    /// request includes its filesystem's overhead, which a Block target does not need.
    #[test]
    fn a_filesystem_source_fits_a_block_target_of_its_images_size() {
        let env = CloneEnvironment {
            target_class: Some("csi"),
            target_class_exists: true,
            profile_strategy: Some(CloneStrategy::CsiClone),
            ..Default::default()
        };
        let source = CloneClaim {
            usable: GI,
            ..claim(
                "src",
                Some("d"),
                VolumeMode::Filesystem,
                GI + GI / 16,
                Some(2 * GI),
            )
        };
        let fits = claim("t", Some("d"), VolumeMode::Block, GI, None);
        let plan = choose_strategy("ns/src", Some(&source), &fits, &env).unwrap();
        assert_eq!(plan.fallback, Some(FallbackReason::IncompatibleVolumeModes));
        let short = claim("t", Some("d"), VolumeMode::Block, GI - (1 << 20), None);
        assert!(matches!(
            choose_strategy("ns/src", Some(&source), &short, &env),
            Err(CloneError::TargetTooSmall { .. })
        ));
    }

    fn snap(name: &str, driver: &str) -> SnapshotClassInfo {
        SnapshotClassInfo {
            name: name.into(),
            driver: driver.into(),
            is_default: false,
        }
    }

    #[test]
    fn the_planner_table() {
        let fs = VolumeMode::Filesystem;
        let snaps = [snap("csi-snap", "csi.example")];
        let src = claim("src", Some("csi.example"), fs, 10 * GI, Some(10 * GI));
        let tgt = claim("tgt", Some("csi.example"), fs, 10 * GI, None);
        let base = CloneEnvironment {
            target_class: Some("csi"),
            target_class_exists: true,
            snapshot_classes: &snaps,
            ..Default::default()
        };
        struct Case<'a> {
            what: &'a str,
            source: CloneClaim,
            target: CloneClaim,
            env: CloneEnvironment<'a>,
            want: (CloneStrategy, Option<FallbackReason>),
        }
        let cases = vec![
            Case {
                what: "default is snapshot",
                source: src.clone(),
                target: tgt.clone(),
                env: base.clone(),
                want: (CloneStrategy::Snapshot, None),
            },
            Case {
                what: "no snapshot class",
                source: src.clone(),
                target: tgt.clone(),
                env: CloneEnvironment {
                    snapshot_classes: &[],
                    ..base.clone()
                },
                want: (
                    CloneStrategy::Copy,
                    Some(FallbackReason::NoVolumeSnapshotClass),
                ),
            },
            Case {
                what: "override wins over the profile",
                source: src.clone(),
                target: tgt.clone(),
                env: CloneEnvironment {
                    strategy_override: Some(CloneStrategy::Copy),
                    profile_strategy: Some(CloneStrategy::CsiClone),
                    ..base.clone()
                },
                want: (CloneStrategy::Copy, None),
            },
            Case {
                what: "profile csi-clone",
                source: src.clone(),
                target: tgt.clone(),
                env: CloneEnvironment {
                    profile_strategy: Some(CloneStrategy::CsiClone),
                    ..base.clone()
                },
                want: (CloneStrategy::CsiClone, None),
            },
            Case {
                what: "different drivers",
                source: claim("src", Some("other.csi"), fs, 10 * GI, Some(10 * GI)),
                target: tgt.clone(),
                env: CloneEnvironment {
                    profile_strategy: Some(CloneStrategy::CsiClone),
                    ..base.clone()
                },
                want: (
                    CloneStrategy::Copy,
                    Some(FallbackReason::IncompatibleProvisioners),
                ),
            },
            Case {
                what: "different volume modes",
                source: claim(
                    "src",
                    Some("csi.example"),
                    VolumeMode::Block,
                    10 * GI,
                    Some(10 * GI),
                ),
                target: tgt.clone(),
                env: base.clone(),
                want: (
                    CloneStrategy::Copy,
                    Some(FallbackReason::IncompatibleVolumeModes),
                ),
            },
            Case {
                what: "larger target without expansion",
                source: src.clone(),
                target: claim("tgt", Some("csi.example"), fs, 20 * GI, None),
                env: base.clone(),
                want: (CloneStrategy::Copy, Some(FallbackReason::NoVolumeExpansion)),
            },
            Case {
                what: "larger target with expansion",
                source: src.clone(),
                target: claim("tgt", Some("csi.example"), fs, 20 * GI, None),
                env: CloneEnvironment {
                    allow_volume_expansion: true,
                    ..base.clone()
                },
                want: (CloneStrategy::Snapshot, None),
            },
        ];
        for case in cases {
            let plan = choose_strategy("ns/src", Some(&case.source), &case.target, &case.env)
                .unwrap_or_else(|e| panic!("{}: {e}", case.what));
            assert_eq!((plan.strategy, plan.fallback), case.want, "{}", case.what);
        }
    }

    #[test]
    fn requirements_that_stop_the_clone() {
        let fs = VolumeMode::Filesystem;
        let src = claim("src", Some("d"), fs, 10 * GI, Some(10 * GI));
        let small = claim("tgt", Some("d"), fs, 5 * GI, None);
        let env = CloneEnvironment {
            target_class: Some("c"),
            target_class_exists: true,
            ..Default::default()
        };
        let err = choose_strategy("ns/src", Some(&src), &small, &env).unwrap_err();
        assert!(
            err.to_string()
                .contains("smaller than the source 5368709120 < 10737418240"),
            "{err}"
        );
        let permissive = CloneEnvironment {
            permissive: true,
            strategy_override: Some(CloneStrategy::Copy),
            ..env.clone()
        };
        assert_eq!(
            choose_strategy("ns/src", Some(&src), &small, &permissive)
                .unwrap()
                .strategy,
            CloneStrategy::Copy
        );
        let err = choose_strategy("ns/src", None, &small, &env).unwrap_err();
        assert!(
            err.to_string()
                .contains("the source pvc ns/src doesn't exist"),
            "{err}"
        );
        let missing = CloneEnvironment {
            target_class_exists: false,
            ..env.clone()
        };
        assert!(
            choose_strategy("ns/src", Some(&src), &src, &missing)
                .unwrap_err()
                .to_string()
                .contains("StorageClass c does not exist")
        );
        let none = CloneEnvironment {
            target_class: None,
            ..env
        };
        assert!(matches!(
            choose_strategy("ns/src", Some(&src), &src, &none),
            Err(CloneError::NoTargetClass { .. })
        ));
    }

    #[test]
    fn fallback_messages_are_upstreams() {
        assert_eq!(
            FallbackReason::NoVolumeSnapshotClass.message(),
            "No compatible volumesnapshotclass found"
        );
        assert_eq!(
            FallbackReason::IncompatibleProvisioners.reason(),
            "IncompatibleProvisioners"
        );
    }
}
