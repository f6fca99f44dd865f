//! What the volume drivers of this cluster share: their names ([`Driver`]), where each node
//! keeps its data ([`NodeDirs`]), and what a PersistentVolume says about its data (its host
//! path, its node, its size, and which driver made it).

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use super::nodes::HOSTNAME_LABEL;
use super::pvcontroller::PROVISIONED_BY;

/// The provisioner name local-path classes use.
pub const PROVISIONER: &str = "rancher.io/local-path";
/// The CSI-like driver's name (its classes' provisioner, and its CSIDriver object).
pub const CSI_DRIVER: &str = "csi.cdi-rs.dev";
/// The second CSI driver's name: it neither clones nor restores.
pub const SHARED_DRIVER: &str = "shared.cdi-rs.dev";
/// Which provisioner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    LocalPath,
    Csi,
    Shared,
}

impl Driver {
    pub const ALL: [Driver; 3] = [Driver::LocalPath, Driver::Csi, Driver::Shared];

    pub fn name(self) -> &'static str {
        match self {
            Driver::LocalPath => PROVISIONER,
            Driver::Csi => CSI_DRIVER,
            Driver::Shared => SHARED_DRIVER,
        }
    }
}

/// Where each node's data directory is: `root/<node name>`.
#[derive(Debug, Clone)]
pub struct NodeDirs {
    pub root: PathBuf,
}

impl NodeDirs {
    pub fn node(&self, node: &str) -> PathBuf {
        self.root.join(node)
    }
}

pub(crate) fn volume_node(v: &PersistentVolume) -> Option<&str> {
    let term = v
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms
        .first()?;
    let req = term
        .match_expressions
        .as_ref()?
        .iter()
        .find(|r| r.key == HOSTNAME_LABEL)?;
    req.values.as_ref()?.first().map(String::as_str)
}

pub(crate) fn ours(driver: Driver, v: &PersistentVolume) -> bool {
    v.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROVISIONED_BY))
        .is_some_and(|p| p == driver.name())
}

/// Where a volume keeps its data on the host: hostPath, local, or a CSI driver's path.
pub(crate) fn volume_path(v: &PersistentVolume) -> Option<PathBuf> {
    let spec = v.spec.as_ref()?;
    if let Some(h) = &spec.host_path {
        return Some(PathBuf::from(&h.path));
    }
    if let Some(l) = &spec.local {
        return Some(PathBuf::from(&l.path));
    }
    spec.csi
        .as_ref()
        .filter(|c| c.driver == CSI_DRIVER || c.driver == SHARED_DRIVER)?
        .volume_attributes
        .as_ref()?
        .get("path")
        .map(PathBuf::from)
}

/// The `storage` entry of a requests or capacity map, in bytes.
pub(crate) fn storage_bytes(map: Option<&BTreeMap<String, K8sQuantity>>) -> u64 {
    map.and_then(|m| m.get("storage"))
        .and_then(|q| k8s_rules::Quantity::try_from(q).ok())
        .map_or(0, |q| q.value().max(0) as u64)
}
