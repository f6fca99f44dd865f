//! What CDI knows about storage provisioners, held as data: the capability table (access and
//! volume modes a provisioner supports, in upstream's order), the advised clone strategies,
//! DataImportCron source formats and minimum claim sizes. A provisioner is added by adding a row.
//!
//! Some provisioners serve different kinds of volume depending on the StorageClass parameters;
//! [`provisioner_key`] maps those to a more specific key (`ebs.csi.aws.com/io2`), exactly as
//! upstream's mappers do.

use std::collections::BTreeMap;

use cdi_api::enums::{
    AccessMode, CloneStrategy, DataImportCronSourceFormat, StorageProfileReason, VolumeMode,
};

/// One (access mode, volume mode) pair a provisioner supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Capability {
    pub access_mode: AccessMode,
    pub volume_mode: VolumeMode,
}

const fn cap(access_mode: AccessMode, volume_mode: VolumeMode) -> Capability {
    Capability {
        access_mode,
        volume_mode,
    }
}

const RWO_FS: Capability = cap(AccessMode::ReadWriteOnce, VolumeMode::Filesystem);
const RWO_BLOCK: Capability = cap(AccessMode::ReadWriteOnce, VolumeMode::Block);
const RWX_FS: Capability = cap(AccessMode::ReadWriteMany, VolumeMode::Filesystem);
const RWX_BLOCK: Capability = cap(AccessMode::ReadWriteMany, VolumeMode::Block);
const ROX_FS: Capability = cap(AccessMode::ReadOnlyMany, VolumeMode::Filesystem);
const ROX_BLOCK: Capability = cap(AccessMode::ReadOnlyMany, VolumeMode::Block);

/// The key a parameter mapper returns when the class parameters match none of its variants.
pub const UNKNOWN_KEY: &str = "UNKNOWN";

/// The provisioner of statically provisioned local volumes; its capabilities come from the
/// existing PersistentVolumes of the class.
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

/// Capabilities by provisioner key, in upstream's order within each key.
pub const CAPABILITIES: &[(&str, &[Capability])] = &[
    ("kubevirt.io.hostpath-provisioner", &[RWO_FS]),
    ("kubevirt.io.hostpath-provisioner/overlay", &[RWX_FS]),
    ("kubevirt.io/hostpath-provisioner", &[RWO_FS]),
    ("k8s.io/minikube-hostpath", &[RWO_FS]),
    ("nfs.csi.k8s.io", &[RWX_FS]),
    ("k8s-sigs.io/nfs-subdir-external-provisioner", &[RWX_FS]),
    ("kubernetes.io/rbd", &[RWX_BLOCK, RWO_BLOCK, RWO_FS]),
    ("rbd.csi.ceph.com", &[RWX_BLOCK, RWO_BLOCK, RWO_FS]),
    (
        "rook-ceph.rbd.csi.ceph.com",
        &[RWX_BLOCK, RWO_BLOCK, RWO_FS],
    ),
    (
        "openshift-storage.rbd.csi.ceph.com",
        &[RWX_BLOCK, RWO_BLOCK, RWO_FS],
    ),
    ("cephfs.csi.ceph.com", &[RWX_FS, RWO_FS]),
    ("rook-ceph.cephfs.csi.ceph.com", &[RWX_FS, RWO_FS]),
    ("openshift-storage.cephfs.csi.ceph.com", &[RWX_FS, RWO_FS]),
    (
        "linstor.csi.linbit.com",
        &[RWX_BLOCK, RWO_BLOCK, RWO_FS, ROX_BLOCK, ROX_FS],
    ),
    (
        "csi-unity.dellemc.com",
        &[RWX_BLOCK, RWO_BLOCK, RWO_FS, ROX_BLOCK, ROX_FS],
    ),
    ("csi-unity.dellemc.com/nfs", &[RWX_FS, RWO_FS, ROX_FS]),
    (
        "csi-vxflexos.dellemc.com",
        &[RWX_BLOCK, RWO_BLOCK, RWO_FS, ROX_BLOCK, ROX_FS],
    ),
    ("csi-vxflexos.dellemc.com/nfs", &[RWX_FS, RWO_FS, ROX_FS]),
    ("csi-isilon.dellemc.com", &[RWX_FS, RWO_FS, ROX_FS]),
    (
        "csi-powermax.dellemc.com",
        &[RWX_BLOCK, RWO_BLOCK, RWO_FS, ROX_BLOCK],
    ),
    ("csi-powermax.dellemc.com/nfs", &[RWX_FS, RWO_FS, ROX_FS]),
    (
        "csi-powerstore.dellemc.com",
        &[RWX_BLOCK, RWO_BLOCK, RWO_FS, ROX_BLOCK],
    ),
    ("csi-powerstore.dellemc.com/nfs", &[RWX_FS, RWO_FS, ROX_FS]),
    ("kubernetes.io/storageos", &[RWO_FS]),
    ("storageos", &[RWO_FS]),
    ("kubernetes.io/aws-ebs", &[RWO_BLOCK]),
    ("ebs.csi.aws.com", &[RWO_BLOCK]),
    ("ebs.csi.aws.com/io1", &[RWO_BLOCK]),
    ("ebs.csi.aws.com/io2", &[RWX_BLOCK, RWO_BLOCK, RWO_FS]),
    ("ebs.csi.aws.com/gp", &[RWO_BLOCK]),
    ("efs.csi.aws.com", &[RWX_FS, RWO_FS]),
    ("kubernetes.io/azure-disk", &[RWO_BLOCK]),
    ("disk.csi.azure.com", &[RWO_BLOCK]),
    ("kubernetes.io/azure-file", &[RWX_FS]),
    ("file.csi.azure.com", &[RWX_FS]),
    ("kubernetes.io/gce-pd", &[RWO_BLOCK, RWO_FS]),
    ("pd.csi.storage.gke.io", &[RWO_BLOCK, RWO_FS]),
    (
        "pd.csi.storage.gke.io/hyperdisk",
        &[RWX_BLOCK, RWO_BLOCK, RWO_FS],
    ),
    ("hspc.csi.hitachi.com", &[RWX_BLOCK, RWO_BLOCK, RWO_FS]),
    ("csi.hpe.com", &[RWX_BLOCK, RWO_BLOCK, RWO_FS]),
    ("spectrumscale.csi.ibm.com", &[RWX_FS, RWO_FS]),
    ("block.csi.ibm.com", &[RWX_BLOCK, RWO_BLOCK, RWO_FS]),
    ("vpc.block.csi.ibm.io", &[RWO_BLOCK, RWO_FS]),
    ("vpc.file.csi.ibm.io", &[RWX_FS, RWO_FS]),
    ("vpc.file.csi.ibm.io/dp2", &[RWX_FS, RWO_FS]),
    ("vpc.file.csi.ibm.io/dp2-rwo", &[RWO_FS]),
    ("vpc.file.csi.ibm.io/rfs", &[RWX_FS, RWO_FS]),
    ("vpc.file.csi.ibm.io/rfs-rwo", &[RWO_FS]),
    ("kubernetes.io/portworx-volume/nfs", &[RWX_FS, RWO_FS]),
    (
        "kubernetes.io/portworx-volume",
        &[RWX_BLOCK, RWX_FS, RWO_BLOCK, RWO_FS],
    ),
    ("pxd.portworx.com/nfs", &[RWX_FS, RWO_FS]),
    ("pxd.portworx.com", &[RWX_BLOCK, RWX_FS, RWO_BLOCK, RWO_FS]),
    (
        "pxd.portworx.com/pure_block",
        &[RWX_BLOCK, RWO_BLOCK, RWO_FS],
    ),
    ("pxd.portworx.com/pure_fa_file", &[RWX_FS, RWO_FS]),
    ("csi.trident.netapp.io/ontap-nas", &[RWX_FS, RWO_FS]),
    ("csi.trident.netapp.io/ontap-san", &[RWX_BLOCK]),
    ("csi.trident.netapp.io/gcnv-flex", &[RWX_FS, RWO_FS]),
    ("topolvm.cybozu.com", &[RWO_BLOCK, RWO_FS]),
    ("topolvm.io", &[RWO_BLOCK, RWO_FS]),
    ("cinder.csi.openstack.org", &[RWO_BLOCK, RWO_FS]),
    ("manila.csi.openstack.org", &[RWX_FS]),
    ("csi.ovirt.org", &[RWO_BLOCK, RWO_FS]),
    (
        "infinibox-csi-driver/iscsiorfibrechannel",
        &[RWX_BLOCK, RWO_BLOCK, RWO_FS],
    ),
    ("infinibox-csi-driver/nvme", &[RWX_BLOCK, RWO_BLOCK, RWO_FS]),
    ("infinibox-csi-driver/nfs", &[RWX_FS, RWO_FS]),
    ("csi.vsphere.vmware.com", &[RWO_BLOCK, RWO_FS]),
    ("csi.vsphere.vmware.com/nfs", &[RWX_FS, RWO_BLOCK, RWO_FS]),
    (
        "csi.huawei.com",
        &[RWX_BLOCK, RWO_BLOCK, RWO_FS, ROX_BLOCK, ROX_FS],
    ),
    ("csi.huawei.com/nfs", &[RWX_FS, RWO_FS, ROX_FS]),
    (
        "kubesan.gitlab.io",
        &[RWX_BLOCK, ROX_BLOCK, RWO_BLOCK, RWO_FS],
    ),
    ("driver.longhorn.io", &[RWO_BLOCK]),
    ("driver.longhorn.io/migratable", &[RWX_BLOCK, RWO_BLOCK]),
    ("driver.longhorn.io/nfs", &[RWX_FS, RWO_FS]),
    ("driver.longhorn.io/fs", &[RWO_FS]),
    (
        "blockvolume.csi.oraclecloud.com",
        &[RWX_BLOCK, RWO_BLOCK, RWO_FS],
    ),
    (
        "csi.san.synology.com/iscsi",
        &[RWX_BLOCK, RWO_BLOCK, RWO_FS],
    ),
    ("csi.san.synology.com/nfs", &[RWX_FS, RWO_FS]),
    ("csi.san.synology.com/smb", &[RWX_FS, RWO_FS]),
    ("directpv-min-io", &[RWO_FS]),
];

/// Advised clone strategy by provisioner key.
pub const ADVISED_CLONE_STRATEGY: &[(&str, CloneStrategy)] = &[
    ("csi-vxflexos.dellemc.com", CloneStrategy::CsiClone),
    ("csi-isilon.dellemc.com", CloneStrategy::CsiClone),
    ("csi-powermax.dellemc.com", CloneStrategy::CsiClone),
    ("csi-powerstore.dellemc.com", CloneStrategy::Copy),
    ("hspc.csi.hitachi.com", CloneStrategy::CsiClone),
    ("csi.hpe.com", CloneStrategy::CsiClone),
    ("spectrumscale.csi.ibm.com", CloneStrategy::CsiClone),
    ("block.csi.ibm.com", CloneStrategy::CsiClone),
    ("vpc.block.csi.ibm.io", CloneStrategy::Copy),
    ("vpc.file.csi.ibm.io", CloneStrategy::Snapshot),
    ("vpc.file.csi.ibm.io/dp2", CloneStrategy::Snapshot),
    ("vpc.file.csi.ibm.io/dp2-rwo", CloneStrategy::Snapshot),
    ("vpc.file.csi.ibm.io/rfs", CloneStrategy::Snapshot),
    ("vpc.file.csi.ibm.io/rfs-rwo", CloneStrategy::Snapshot),
    ("rbd.csi.ceph.com", CloneStrategy::CsiClone),
    ("rook-ceph.rbd.csi.ceph.com", CloneStrategy::CsiClone),
    (
        "openshift-storage.rbd.csi.ceph.com",
        CloneStrategy::CsiClone,
    ),
    ("cephfs.csi.ceph.com", CloneStrategy::CsiClone),
    ("rook-ceph.cephfs.csi.ceph.com", CloneStrategy::CsiClone),
    (
        "openshift-storage.cephfs.csi.ceph.com",
        CloneStrategy::CsiClone,
    ),
    ("pxd.portworx.com/nfs", CloneStrategy::CsiClone),
    ("pxd.portworx.com", CloneStrategy::CsiClone),
    ("pxd.portworx.com/pure_block", CloneStrategy::CsiClone),
    ("pxd.portworx.com/pure_fa_file", CloneStrategy::CsiClone),
    ("topolvm.cybozu.com", CloneStrategy::Copy),
    ("topolvm.io", CloneStrategy::Copy),
    (
        "infinibox-csi-driver/iscsiorfibrechannel",
        CloneStrategy::CsiClone,
    ),
    ("infinibox-csi-driver/nvme", CloneStrategy::CsiClone),
    ("infinibox-csi-driver/nfs", CloneStrategy::CsiClone),
    ("csi.trident.netapp.io/ontap-nas", CloneStrategy::Snapshot),
    ("csi.trident.netapp.io/ontap-san", CloneStrategy::Snapshot),
    ("csi.trident.netapp.io/gcnv-flex", CloneStrategy::Snapshot),
    ("kubesan.gitlab.io", CloneStrategy::CsiClone),
    ("pd.csi.storage.gke.io", CloneStrategy::Snapshot),
    ("pd.csi.storage.gke.io/hyperdisk", CloneStrategy::Snapshot),
    ("csi.san.synology.com/iscsi", CloneStrategy::CsiClone),
    ("csi.san.synology.com/nfs", CloneStrategy::CsiClone),
    ("csi.san.synology.com/smb", CloneStrategy::CsiClone),
    ("blockvolume.csi.oraclecloud.com", CloneStrategy::CsiClone),
];

/// Provisioner keys whose DataImportCron sources are advised to be snapshots (default: pvc).
pub const ADVISED_SNAPSHOT_SOURCE_FORMAT: &[&str] = &[
    "rook-ceph.rbd.csi.ceph.com",
    "openshift-storage.rbd.csi.ceph.com",
    "csi.trident.netapp.io/ontap-nas",
    "csi.trident.netapp.io/ontap-san",
    "csi.trident.netapp.io/gcnv-flex",
    "pd.csi.storage.gke.io",
    "pd.csi.storage.gke.io/hyperdisk",
    "vpc.file.csi.ibm.io",
    "vpc.file.csi.ibm.io/dp2",
    "vpc.file.csi.ibm.io/dp2-rwo",
    "vpc.file.csi.ibm.io/rfs",
    "vpc.file.csi.ibm.io/rfs-rwo",
];

/// The smallest claim some provisioners accept, by provisioner key.
pub const MINIMUM_PVC_SIZE: &[(&str, &str)] = &[
    ("pd.csi.storage.gke.io/hyperdisk", "4Gi"),
    ("ebs.csi.aws.com/io1", "4Gi"),
    ("ebs.csi.aws.com/io2", "4Gi"),
    ("ebs.csi.aws.com/gp", "1Gi"),
    ("csi.san.synology.com/iscsi", "1Gi"),
    ("csi.san.synology.com/nfs", "1Gi"),
    ("csi.san.synology.com/smb", "1Gi"),
    ("csi.trident.netapp.io/gcnv-flex", "1Gi"),
    ("vpc.file.csi.ibm.io/rfs", "1Gi"),
    ("vpc.file.csi.ibm.io/rfs-rwo", "1Gi"),
    ("vpc.file.csi.ibm.io/dp2", "10Gi"),
    ("vpc.file.csi.ibm.io/dp2-rwo", "10Gi"),
    ("xspc.csi.hpe.com", "1Gi"),
    ("hspc.csi.hitachi.com", "1Gi"),
];

/// Provisioner keys whose DataImportCron claims should be ReadWriteOnce.
pub const READ_WRITE_ONCE_FOR_DATA_IMPORT_CRON: &[&str] =
    &["pd.csi.storage.gke.io", "pd.csi.storage.gke.io/hyperdisk"];

/// Provisioners CDI cannot use for its claims (object buckets, snapshot helpers, static local
/// volumes): their profiles count as complete without claim property sets.
pub const UNSUPPORTED_PROVISIONERS: &[&str] = &[
    "openshift-storage.ceph.rook.io/bucket",
    "rook-ceph.ceph.rook.io/bucket",
    "openshift-storage.noobaa.io/obc",
    "stork-snapshot",
    NO_PROVISIONER,
];

fn lookup<'a, T: Copy>(table: &'a [(&'a str, T)], key: &str) -> Option<T> {
    table.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// The lower-cased `csi.storage.k8s.io/fstype` parameter.
fn fs_type(params: &BTreeMap<String, String>) -> String {
    params
        .get("csi.storage.k8s.io/fstype")
        .map(|v| v.to_lowercase())
        .unwrap_or_default()
}

/// Portworx's NFS flavour: `sharedv4_mount_options` lists both `vers=3.0` and `nolock`.
fn portworx_nfs(params: &BTreeMap<String, String>) -> bool {
    let options: Vec<&str> = params
        .get("sharedv4_mount_options")
        .map(|v| v.split(',').collect())
        .unwrap_or_default();
    options.contains(&"vers=3.0") && options.contains(&"nolock")
}

/// The table key for a StorageClass: the provisioner, refined by its parameters for the
/// provisioners that serve several kinds of volume. A mapper's answer is final.
pub fn provisioner_key(provisioner: &str, params: &BTreeMap<String, String>) -> String {
    let param = |name: &str| params.get(name).map(String::as_str).unwrap_or("");
    let keyed = |suffix: &str| format!("{provisioner}/{suffix}");
    match provisioner {
        "kubevirt.io.hostpath-provisioner" if params.contains_key("overlayCSI") => keyed("overlay"),
        "kubernetes.io/portworx-volume" if portworx_nfs(params) => keyed("nfs"),
        "pxd.portworx.com" => match params.get("backend").map(String::as_str) {
            Some("pure_block") => keyed("pure_block"),
            Some("pure_fa_file") => keyed("pure_fa_file"),
            Some(_) => provisioner.to_string(),
            None if portworx_nfs(params) => keyed("nfs"),
            None => provisioner.to_string(),
        },
        "csi.trident.netapp.io" => {
            let backend = param("backendType");
            if backend.starts_with("ontap-nas") {
                keyed("ontap-nas")
            } else if backend.starts_with("ontap-san") {
                keyed("ontap-san")
            } else if backend == "google-cloud-netapp-volumes"
                && param("selector")
                    .split([';', ','])
                    .map(str::trim)
                    .any(|s| s == "performance=flex")
            {
                keyed("gcnv-flex")
            } else {
                UNKNOWN_KEY.to_string()
            }
        }
        "infinibox-csi-driver" => match param("storage_protocol") {
            "iscsi" | "fc" => keyed("iscsiorfibrechannel"),
            "nvme" => keyed("nvme"),
            "nfs" | "nfs_treeq" => keyed("nfs"),
            _ => UNKNOWN_KEY.to_string(),
        },
        "csi.vsphere.vmware.com" if fs_type(params).contains("nfs") => keyed("nfs"),
        "csi-unity.dellemc.com" if param("protocol").to_lowercase() == "nfs" => keyed("nfs"),
        "csi-powerstore.dellemc.com" | "csi-vxflexos.dellemc.com" | "csi-powermax.dellemc.com"
            if fs_type(params) == "nfs" =>
        {
            keyed("nfs")
        }
        "csi.huawei.com" if param("protocol") == "nfs" => keyed("nfs"),
        "driver.longhorn.io" => {
            if param("migratable") == "true" {
                keyed("migratable")
            } else if !param("nfsOptions").is_empty() {
                keyed("nfs")
            } else if !param("fsType").is_empty() {
                keyed("fs")
            } else {
                provisioner.to_string()
            }
        }
        "ebs.csi.aws.com" => match param("type") {
            "io1" => keyed("io1"),
            "io2" => keyed("io2"),
            "gp2" | "gp3" => keyed("gp"),
            _ => provisioner.to_string(),
        },
        "pd.csi.storage.gke.io" => match param("type") {
            "hyperdisk-balanced" | "hyperdisk-balanced-high-availability" => keyed("hyperdisk"),
            _ => provisioner.to_string(),
        },
        "csi.san.synology.com" => match param("protocol") {
            "iscsi" | "" => keyed("iscsi"),
            "smb" => keyed("smb"),
            "nfs" | "nfs_treeq" => keyed("nfs"),
            _ => UNKNOWN_KEY.to_string(),
        },
        "vpc.file.csi.ibm.io" => {
            let rwo = param("vmState") == "true";
            match param("profile") {
                "rfs" if rwo => keyed("rfs-rwo"),
                "rfs" => keyed("rfs"),
                "dp2" if rwo => keyed("dp2-rwo"),
                "dp2" => keyed("dp2"),
                _ => provisioner.to_string(),
            }
        }
        _ => provisioner.to_string(),
    }
}

/// The capabilities the table lists for a key.
pub fn capabilities(key: &str) -> Option<&'static [Capability]> {
    lookup(CAPABILITIES, key)
}

pub fn advised_clone_strategy(key: &str) -> Option<CloneStrategy> {
    lookup(ADVISED_CLONE_STRATEGY, key)
}

pub fn advised_source_format(key: &str) -> Option<DataImportCronSourceFormat> {
    ADVISED_SNAPSHOT_SOURCE_FORMAT
        .contains(&key)
        .then_some(DataImportCronSourceFormat::Snapshot)
}

pub fn minimum_pvc_size(key: &str) -> Option<&'static str> {
    lookup(MINIMUM_PVC_SIZE, key)
}

pub fn read_write_once_for_data_import_cron(key: &str) -> bool {
    READ_WRITE_ONCE_FOR_DATA_IMPORT_CRON.contains(&key)
}

/// Whether the key is known, as the reason of the profile's `Recognized` condition.
pub fn recognition(key: &str) -> StorageProfileReason {
    if key == UNKNOWN_KEY {
        StorageProfileReason::UnrecognizedStorageClassParameters
    } else if capabilities(key).is_some() {
        StorageProfileReason::RecognizedProvisioner
    } else {
        StorageProfileReason::UnrecognizedProvisioner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_tables_have_upstreams_sizes_and_no_duplicate_keys() {
        assert_eq!(CAPABILITIES.len(), 79);
        assert_eq!(ADVISED_CLONE_STRATEGY.len(), 39);
        assert_eq!(ADVISED_SNAPSHOT_SOURCE_FORMAT.len(), 12);
        assert_eq!(MINIMUM_PVC_SIZE.len(), 14);
        for table in [
            CAPABILITIES.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            ADVISED_CLONE_STRATEGY.iter().map(|(k, _)| *k).collect(),
            MINIMUM_PVC_SIZE.iter().map(|(k, _)| *k).collect(),
        ] {
            let mut sorted = table.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), table.len(), "duplicate key");
        }
        for (key, size) in MINIMUM_PVC_SIZE {
            assert!(size.parse::<crate::Quantity>().is_ok(), "{key}: {size}");
        }
    }

    #[test]
    fn order_within_a_key_is_upstreams() {
        assert_eq!(
            capabilities("rbd.csi.ceph.com").unwrap(),
            &[RWX_BLOCK, RWO_BLOCK, RWO_FS]
        );
        assert_eq!(
            capabilities("kubesan.gitlab.io").unwrap(),
            &[RWX_BLOCK, ROX_BLOCK, RWO_BLOCK, RWO_FS]
        );
        assert_eq!(
            capabilities("pxd.portworx.com").unwrap(),
            &[RWX_BLOCK, RWX_FS, RWO_BLOCK, RWO_FS]
        );
        assert_eq!(
            capabilities("csi.huawei.com").unwrap(),
            &[RWX_BLOCK, RWO_BLOCK, RWO_FS, ROX_BLOCK, ROX_FS]
        );
        assert_eq!(
            capabilities("csi.vsphere.vmware.com/nfs").unwrap(),
            &[RWX_FS, RWO_BLOCK, RWO_FS]
        );
        assert!(capabilities("rancher.io/local-path").is_none());
        assert!(capabilities("xspc.csi.hpe.com").is_none());
    }

    #[test]
    fn parameter_mappers() {
        /// (provisioner, parameters, expected key)
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: &[Case] = &[
            ("ebs.csi.aws.com", &[("type", "gp3")], "ebs.csi.aws.com/gp"),
            ("ebs.csi.aws.com", &[("type", "io2")], "ebs.csi.aws.com/io2"),
            ("ebs.csi.aws.com", &[("type", "st1")], "ebs.csi.aws.com"),
            (
                "kubevirt.io.hostpath-provisioner",
                &[("overlayCSI", "")],
                "kubevirt.io.hostpath-provisioner/overlay",
            ),
            (
                "kubevirt.io.hostpath-provisioner",
                &[],
                "kubevirt.io.hostpath-provisioner",
            ),
            (
                "pxd.portworx.com",
                &[("backend", "pure_block")],
                "pxd.portworx.com/pure_block",
            ),
            (
                "pxd.portworx.com",
                &[
                    ("backend", "other"),
                    ("sharedv4_mount_options", "vers=3.0,nolock"),
                ],
                "pxd.portworx.com",
            ),
            (
                "pxd.portworx.com",
                &[("sharedv4_mount_options", "nolock,vers=3.0")],
                "pxd.portworx.com/nfs",
            ),
            (
                "pxd.portworx.com",
                &[("sharedv4_mount_options", "vers=3.0, nolock")],
                "pxd.portworx.com",
            ),
            (
                "kubernetes.io/portworx-volume",
                &[("sharedv4_mount_options", "vers=3.0,nolock")],
                "kubernetes.io/portworx-volume/nfs",
            ),
            (
                "csi.trident.netapp.io",
                &[("backendType", "ontap-nas-economy")],
                "csi.trident.netapp.io/ontap-nas",
            ),
            (
                "csi.trident.netapp.io",
                &[("backendType", "ontap-san")],
                "csi.trident.netapp.io/ontap-san",
            ),
            (
                "csi.trident.netapp.io",
                &[
                    ("backendType", "google-cloud-netapp-volumes"),
                    ("selector", "zone=a ; performance=flex"),
                ],
                "csi.trident.netapp.io/gcnv-flex",
            ),
            (
                "csi.trident.netapp.io",
                &[("backendType", "azure-netapp-files")],
                UNKNOWN_KEY,
            ),
            (
                "infinibox-csi-driver",
                &[("storage_protocol", "fc")],
                "infinibox-csi-driver/iscsiorfibrechannel",
            ),
            ("infinibox-csi-driver", &[], UNKNOWN_KEY),
            (
                "csi.vsphere.vmware.com",
                &[("csi.storage.k8s.io/fstype", "NFS4")],
                "csi.vsphere.vmware.com/nfs",
            ),
            (
                "csi-unity.dellemc.com",
                &[("protocol", "NFS")],
                "csi-unity.dellemc.com/nfs",
            ),
            (
                "csi-powerstore.dellemc.com",
                &[("csi.storage.k8s.io/fstype", "nfs")],
                "csi-powerstore.dellemc.com/nfs",
            ),
            (
                "csi-powermax.dellemc.com",
                &[("csi.storage.k8s.io/fstype", "nfs4")],
                "csi-powermax.dellemc.com",
            ),
            ("csi.huawei.com", &[("protocol", "NFS")], "csi.huawei.com"),
            (
                "csi.huawei.com",
                &[("protocol", "nfs")],
                "csi.huawei.com/nfs",
            ),
            (
                "driver.longhorn.io",
                &[("migratable", "true"), ("nfsOptions", "x")],
                "driver.longhorn.io/migratable",
            ),
            (
                "driver.longhorn.io",
                &[("fsType", "ext4")],
                "driver.longhorn.io/fs",
            ),
            (
                "pd.csi.storage.gke.io",
                &[("type", "hyperdisk-balanced")],
                "pd.csi.storage.gke.io/hyperdisk",
            ),
            ("csi.san.synology.com", &[], "csi.san.synology.com/iscsi"),
            ("csi.san.synology.com", &[("protocol", "ftp")], UNKNOWN_KEY),
            (
                "vpc.file.csi.ibm.io",
                &[("profile", "dp2"), ("vmState", "true")],
                "vpc.file.csi.ibm.io/dp2-rwo",
            ),
            (
                "vpc.file.csi.ibm.io",
                &[("profile", "rfs")],
                "vpc.file.csi.ibm.io/rfs",
            ),
            (
                "vpc.file.csi.ibm.io",
                &[("profile", "tier"), ("vmState", "true")],
                "vpc.file.csi.ibm.io",
            ),
            (
                "rancher.io/local-path",
                &[("nodePath", "/data")],
                "rancher.io/local-path",
            ),
        ];
        for (provisioner, p, want) in cases {
            assert_eq!(
                provisioner_key(provisioner, &params(p)),
                *want,
                "{provisioner} {p:?}"
            );
        }
    }

    #[test]
    fn every_mapped_key_except_unknown_is_in_the_table() {
        // A mapper that produced a key missing from the table would silently lose capabilities.
        let probes: &[(&str, &[(&str, &str)])] = &[
            ("ebs.csi.aws.com", &[("type", "io1")]),
            ("pxd.portworx.com", &[("backend", "pure_fa_file")]),
            ("infinibox-csi-driver", &[("storage_protocol", "nvme")]),
            ("infinibox-csi-driver", &[("storage_protocol", "nfs_treeq")]),
            (
                "csi-vxflexos.dellemc.com",
                &[("csi.storage.k8s.io/fstype", "NFS")],
            ),
            ("driver.longhorn.io", &[("nfsOptions", "vers=4")]),
            ("driver.longhorn.io", &[]),
            ("csi.san.synology.com", &[("protocol", "smb")]),
            (
                "vpc.file.csi.ibm.io",
                &[("profile", "rfs"), ("vmState", "true")],
            ),
        ];
        for (provisioner, p) in probes {
            let key = provisioner_key(provisioner, &params(p));
            assert!(capabilities(&key).is_some(), "{key}");
        }
    }

    #[test]
    fn recognition_reasons() {
        assert_eq!(
            recognition("rbd.csi.ceph.com"),
            StorageProfileReason::RecognizedProvisioner
        );
        assert_eq!(
            recognition(UNKNOWN_KEY),
            StorageProfileReason::UnrecognizedStorageClassParameters
        );
        assert_eq!(
            recognition("rancher.io/local-path"),
            StorageProfileReason::UnrecognizedProvisioner
        );
        assert_eq!(
            recognition(NO_PROVISIONER),
            StorageProfileReason::UnrecognizedProvisioner
        );
    }
}
