//! The development cluster's provisioners, both keeping volumes under a node's data directory,
//! pinned to that node by required node affinity on `kubernetes.io/hostname`. Immediate classes
//! get a volume at once on the node with the fewest; WaitForFirstConsumer classes wait for the
//! scheduler's `selected-node`.
//!
//! - [`Driver::LocalPath`] is the `rancher.io/local-path` of the WaitForFirstConsumer seed:
//!   directories only, no data sources, no CSIDriver object (so CDI takes its host-assisted
//!   paths).
//! - [`Driver::Csi`] behaves like a CSI driver (the cluster creates its CSIDriver object, so CDI
//!   takes the populator paths): Block volumes as files; claims whose data source is another of
//!   its claims are cloned by copying, those whose source is a VolumeSnapshot of its volumes
//!   (see `snapshots`) restored by copying; bound volumes grow when their claim asks for more in
//!   a class that allows expansion. Claims naming any other data source kind stay Pending, as
//!   real external provisioners leave them to a populator.
//! - [`Driver::Shared`] is a second CSI driver (with its CSIDriver object) that fills volumes
//!   from nothing, as NFS-style drivers without clone or snapshot support: CDI's clones from the
//!   CSI-like driver's volumes and snapshots onto its class fall back to host-assisted copies.
//!
//! Pure: [`plan`] decides, [`agent`] creates files, directories and objects.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::json;

use super::nodes::HOSTNAME_LABEL;
use super::pvcontroller::{
    BETA_STORAGE_PROVISIONER, PROVISIONED_BY, SELECTED_NODE, STORAGE_PROVISIONER,
};
pub use super::volumes::{CSI_DRIVER, Driver, NodeDirs, PROVISIONER, SHARED_DRIVER};
use super::volumes::{ours, storage_bytes, volume_node, volume_path};
use super::{Snapshot, name, snapshots};

/// Held on the volumes a provisioner made until it has removed their storage, as
/// external-provisioner does: a volume deleted by hand still gets its directory removed.
pub const PROVISIONER_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// What a new volume starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// An empty directory (Filesystem).
    Directory,
    /// A sparse file of this many bytes (Block).
    BlockFile { bytes: u64 },
    /// A copy of another volume's directory or file (a clone).
    CopyOf { source: PathBuf, bytes: u64 },
}
/// Where volumes go inside a node's data directory unless the class says `nodePath`.
pub const DEFAULT_NODE_PATH: &str = "/opt/local-path-provisioner";

/// One change the provisioner wants made.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Make `path` with its content, then create the volume.
    Provision {
        path: PathBuf,
        content: Content,
        volume: Box<PersistentVolume>,
    },
    /// Remove `path` (directory or file, if it is there), then delete the volume object and
    /// drop the provisioner's finalizer from it.
    Reclaim {
        volume: String,
        path: Option<PathBuf>,
    },
    /// Grow a bound volume to its claim's new request (`allowVolumeExpansion` classes): a block
    /// file is lengthened, the volume's capacity raised (the PV controller then raises the
    /// claim's).
    Expand {
        volume: String,
        namespace: String,
        claim: String,
        path: Option<PathBuf>,
        bytes: u64,
        capacity: String,
    },
    /// Tell the claim's owner why nothing happens (a `ProvisioningFailed` event).
    Refuse {
        namespace: String,
        claim: String,
        message: String,
    },
}

/// Expand a `pathPattern` the way the Go template of the original does, for the fields that
/// make sense here: `.PVName`, `.PVC.Namespace`, `.PVC.Name`, `.PVC.Labels.<k>`,
/// `.PVC.Annotations.<k>`.
pub fn expand_pattern(
    pattern: &str,
    pv_name: &str,
    claim: &PersistentVolumeClaim,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = pattern;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("pathPattern {pattern:?} has an unclosed {{{{"))?;
        let field = after[..end].trim();
        let meta = &claim.metadata;
        let lookup = |map: &Option<BTreeMap<String, String>>, key: &str| {
            map.as_ref()
                .and_then(|m| m.get(key))
                .cloned()
                .unwrap_or_default()
        };
        let value = match field {
            ".PVName" => pv_name.to_string(),
            ".PVC.Namespace" => meta.namespace.clone().unwrap_or_default(),
            ".PVC.Name" => meta.name.clone().unwrap_or_default(),
            f if f.starts_with(".PVC.Labels.") => lookup(&meta.labels, &f[12..]),
            f if f.starts_with(".PVC.Annotations.") => lookup(&meta.annotations, &f[17..]),
            other => {
                return Err(format!(
                    "pathPattern {pattern:?} uses {other:?}; known fields are .PVName, \
                     .PVC.Namespace, .PVC.Name, .PVC.Labels.<key> and .PVC.Annotations.<key>"
                ));
            }
        };
        out.push_str(&value);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    let path = Path::new(&out);
    if out.is_empty()
        || path.is_absolute()
        || path
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(format!(
            "pathPattern {pattern:?} gives {out:?}, which is not a relative path inside nodePath"
        ));
    }
    Ok(out)
}

/// The directory on the host for a volume of `claim` on `node`.
fn volume_dir(
    dirs: &NodeDirs,
    node: &str,
    class: &StorageClass,
    pv_name: &str,
    claim: &PersistentVolumeClaim,
) -> Result<PathBuf, String> {
    let params = class.parameters.clone().unwrap_or_default();
    let node_path = params
        .get("nodePath")
        .map(String::as_str)
        .unwrap_or(DEFAULT_NODE_PATH);
    let node_path = Path::new(node_path);
    if !node_path.is_absolute() || node_path.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "nodePath {node_path:?} of class {:?} must be an absolute path without \"..\"",
            name(class)
        ));
    }
    let folder = match params.get("pathPattern") {
        Some(p) => expand_pattern(p, pv_name, claim)?,
        None => format!(
            "{pv_name}_{}_{}",
            claim.metadata.namespace.as_deref().unwrap_or(""),
            name(claim)
        ),
    };
    let inside = node_path.strip_prefix("/").unwrap_or(node_path);
    // A claim's name alone may be 253 bytes: each component is made to fit the filesystem's.
    let folder: PathBuf = Path::new(&folder)
        .components()
        .map(|c| super::fit(&c.as_os_str().to_string_lossy(), NAME_MAX))
        .collect();
    Ok(dirs.node(node).join(inside).join(folder))
}

/// The longest file name Linux filesystems take, in bytes.
const NAME_MAX: usize = 255;

fn selected_node(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(SELECTED_NODE)
        .map(String::as_str)
}

fn requested_bytes(claim: &PersistentVolumeClaim) -> u64 {
    storage_bytes(
        claim
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref()?.requests.as_ref()),
    )
}

/// The volume a claim of ours gets on `node`.
fn volume_for(
    driver: Driver,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &str,
    path: &Path,
) -> PersistentVolume {
    let spec = claim.spec.clone().unwrap_or_default();
    let size = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| "0".into());
    let uid = claim.metadata.uid.as_deref().unwrap_or("");
    let pv_name = format!("pvc-{uid}");
    let mode = spec.volume_mode.as_deref().unwrap_or("Filesystem");
    let (source_key, source) = match driver {
        Driver::LocalPath => (
            "hostPath",
            json!({"path": path.to_string_lossy(), "type": "DirectoryOrCreate"}),
        ),
        Driver::Csi | Driver::Shared => (
            "csi",
            json!({"driver": driver.name(), "volumeHandle": pv_name,
                "volumeAttributes": {"path": path.to_string_lossy()}}),
        ),
    };
    let value = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "annotations": {PROVISIONED_BY: driver.name()},
            "finalizers": [PROVISIONER_FINALIZER]},
        "spec": {
            source_key: source,
            "capacity": {"storage": size},
            "accessModes": spec.access_modes.unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
            "volumeMode": mode,
            "storageClassName": name(class),
            "persistentVolumeReclaimPolicy": class.reclaim_policy.as_deref().unwrap_or("Delete"),
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": claim.metadata.namespace, "name": claim.metadata.name, "uid": uid},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}]}},
        },
    });
    serde_json::from_value(value).expect("a PersistentVolume")
}

/// A clone's content: a copy of another of the driver's claims in the namespace, once bound.
fn clone_source(
    driver: Driver,
    cluster: &Snapshot,
    c: &PersistentVolumeClaim,
    source_name: &str,
    block: bool,
    bytes: u64,
) -> Result<Option<Content>, String> {
    let ns = c.metadata.namespace.as_deref().unwrap_or("");
    let Some(src) = cluster
        .claims
        .iter()
        .find(|o| o.metadata.namespace.as_deref() == Some(ns) && name(*o) == source_name)
    else {
        return Err(format!("source claim {source_name:?} does not exist"));
    };
    let src_volume = src
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .and_then(|v| cluster.volumes.iter().find(|pv| name(*pv) == v))
        .filter(|_| src.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"));
    // Wait for the source to be bound.
    let Some(src_volume) = src_volume else {
        return Ok(None);
    };
    let src_mode = src_volume
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    let src_bytes = storage_bytes(src_volume.spec.as_ref().and_then(|s| s.capacity.as_ref()));
    if !ours(driver, src_volume) {
        return Err(format!(
            "source claim {source_name:?} is not a volume of {CSI_DRIVER}, which clones only its own"
        ));
    }
    if src_mode != (if block { "Block" } else { "Filesystem" }) {
        return Err(format!(
            "source claim {source_name:?} is {src_mode}; a clone must have the same volume mode"
        ));
    }
    if src_bytes > bytes {
        return Err(format!(
            "claim {:?} asks for less than its source {source_name:?} holds",
            name(c)
        ));
    }
    Ok(volume_path(src_volume).map(|source| Content::CopyOf { source, bytes }))
}

/// A restore's content: a copy of a ready VolumeSnapshot of the driver's in the namespace.
fn restore_source(
    dirs: &NodeDirs,
    cluster: &Snapshot,
    c: &PersistentVolumeClaim,
    snapshot: &str,
    block: bool,
    bytes: u64,
) -> Result<Option<Content>, String> {
    let ns = c.metadata.namespace.as_deref().unwrap_or("");
    let text = |v: &serde_json::Value, k: &[&str]| {
        k.iter()
            .fold(v, |v, k| &v[*k])
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let Some(snap) = cluster.volume_snapshots.iter().find(|v| {
        text(v, &["metadata", "namespace"]) == ns && text(v, &["metadata", "name"]) == snapshot
    }) else {
        return Err(format!(
            "error getting handle for DataSource Type VolumeSnapshot by Name {snapshot}: \
             volumesnapshots.{} {snapshot:?} not found",
            snapshots::GROUP
        ));
    };
    if snap["status"]["readyToUse"] != true {
        return Ok(None);
    }
    let content_name = text(snap, &["status", "boundVolumeSnapshotContentName"]);
    let Some(content) = cluster
        .snapshot_contents
        .iter()
        .find(|k| text(k, &["metadata", "name"]) == content_name)
    else {
        return Ok(None);
    };
    if text(content, &["spec", "driver"]) != CSI_DRIVER {
        return Err(format!(
            "snapshot {snapshot:?} was taken by {}; {CSI_DRIVER} restores only its own",
            text(content, &["spec", "driver"])
        ));
    }
    let mode = text(content, &["spec", "sourceVolumeMode"]);
    let want = if block { "Block" } else { "Filesystem" };
    if !mode.is_empty() && mode != want {
        return Err(format!(
            "snapshot {snapshot:?} is of a {mode} volume; claim {:?} asks for {want}",
            name(c)
        ));
    }
    let restore = content["status"]["restoreSize"].as_u64().unwrap_or(0);
    if restore > bytes {
        return Err(format!(
            "requested volume size {bytes} is less than the size {restore} for the source \
             snapshot {snapshot}"
        ));
    }
    let handle = text(content, &["status", "snapshotHandle"]);
    match snapshots::handle_path(dirs, &handle) {
        Some(source) => Ok(Some(Content::CopyOf { source, bytes })),
        None => Err(format!(
            "snapshot {snapshot:?} has no usable handle ({handle:?})"
        )),
    }
}

/// Bound claims of the CSI-like driver asking for more than their volume holds, in classes
/// that allow expansion (the API server refuses the request otherwise).
fn expansions(cluster: &Snapshot) -> Vec<Action> {
    let mut out = Vec::new();
    for c in &cluster.claims {
        let Some(volume_name) = c.spec.as_ref().and_then(|s| s.volume_name.as_deref()) else {
            continue;
        };
        let Some(v) = cluster
            .volumes
            .iter()
            .find(|v| name(*v) == volume_name && ours(Driver::Csi, v))
        else {
            continue;
        };
        let class_name = c
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref());
        let expandable = cluster
            .classes
            .iter()
            .find(|k| Some(name(*k)) == class_name)
            .is_some_and(|k| k.allow_volume_expansion == Some(true));
        let bytes = requested_bytes(c);
        let has = storage_bytes(v.spec.as_ref().and_then(|s| s.capacity.as_ref()));
        if !expandable || bytes <= has {
            continue;
        }
        let capacity = c
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref()?.requests.as_ref()?.get("storage"))
            .map(|q| q.0.clone())
            .unwrap_or_default();
        out.push(Action::Expand {
            volume: volume_name.into(),
            namespace: c.metadata.namespace.clone().unwrap_or_default(),
            claim: name(c).into(),
            path: volume_path(v),
            bytes,
            capacity,
        });
    }
    out
}

/// Everything the provisioner would do, given the cluster's claims, volumes, classes and nodes.
pub fn plan(driver: Driver, dirs: &NodeDirs, cluster: &Snapshot) -> Vec<Action> {
    let mut out = Vec::new();
    // How many of our volumes each node holds, for spreading Immediate volumes.
    let mut load: BTreeMap<&str, usize> = cluster.nodes.iter().map(|n| (name(n), 0)).collect();
    for v in cluster.volumes.iter().filter(|v| ours(driver, v)) {
        if let Some(n) = volume_node(v).and_then(|n| load.get_mut(n)) {
            *n += 1;
        }
    }
    for c in &cluster.claims {
        let Some(class) = handed_to(driver, cluster, c) else {
            continue;
        };
        match provision(driver, dirs, cluster, c, class, &mut load) {
            Ok(Some(action)) => out.push(action),
            Ok(None) => {}
            Err(message) => out.push(Action::Refuse {
                namespace: c.metadata.namespace.clone().unwrap_or_default(),
                claim: name(c).into(),
                message,
            }),
        }
    }
    if driver == Driver::Csi {
        out.extend(expansions(cluster));
    }
    for v in cluster.volumes.iter().filter(|v| ours(driver, v)) {
        if reclaiming(v) {
            // Never remove anything outside the node data directories.
            let path = volume_path(v)
                .filter(|d| d.starts_with(&dirs.root))
                .filter(|_| deletes(v));
            out.push(Action::Reclaim {
                volume: name(v).into(),
                path,
            });
        }
    }
    out
}

/// The name of the volume made for a claim.
fn volume_name_for(claim: &PersistentVolumeClaim) -> String {
    format!("pvc-{}", claim.metadata.uid.as_deref().unwrap_or(""))
}

fn is_block(claim: &PersistentVolumeClaim) -> bool {
    claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block")
}

/// The class of `c` when `driver` is to provision it: a claim of one of its classes, unbound,
/// neither Lost nor being deleted, handed to it by the PV controller, and without the volume
/// made for it yet.
fn handed_to<'a>(
    driver: Driver,
    cluster: &'a Snapshot,
    c: &PersistentVolumeClaim,
) -> Option<&'a StorageClass> {
    let spec = c.spec.as_ref();
    let class_name = spec.and_then(|s| s.storage_class_name.as_deref());
    let class = cluster
        .classes
        .iter()
        .find(|k| Some(name(*k)) == class_name && k.provisioner == driver.name())?;
    let unbound = spec
        .and_then(|s| s.volume_name.as_deref())
        .is_none_or(str::is_empty);
    let phase = c.status.as_ref().and_then(|s| s.phase.as_deref());
    if !unbound || phase == Some("Lost") || c.metadata.deletion_timestamp.is_some() {
        return None;
    }
    // As external provisioners do: only claims the PV controller handed to us.
    let handed = c.metadata.annotations.as_ref().is_some_and(|a| {
        [STORAGE_PROVISIONER, BETA_STORAGE_PROVISIONER]
            .iter()
            .any(|k| a.get(*k).map(String::as_str) == Some(driver.name()))
    });
    let pv_name = volume_name_for(c);
    let made = cluster.volumes.iter().any(|v| name(v) == pv_name);
    (handed && !made).then_some(class)
}

/// The volume to make for `c` now (counted on its node in `load`); `Ok(None)` while it waits
/// (for its source, its node, or an old volume's reclaim), `Err` why it cannot be made.
fn provision(
    driver: Driver,
    dirs: &NodeDirs,
    cluster: &Snapshot,
    c: &PersistentVolumeClaim,
    class: &StorageClass,
    load: &mut BTreeMap<&str, usize>,
) -> Result<Option<Action>, String> {
    let block = is_block(c);
    if block && driver == Driver::LocalPath {
        return Err(format!(
            "{PROVISIONER} makes only Filesystem volumes; use a class whose provisioner \
             supports Block (such as {CSI_DRIVER}) for claim {:?}",
            name(c)
        ));
    }
    let Some(content) = content(driver, dirs, cluster, c, block, requested_bytes(c))? else {
        return Ok(None);
    };
    let Some(node) = node_for(c, class, load)? else {
        return Ok(None);
    };
    let Some(path) = volume_location(driver, dirs, &node, class, c, &cluster.volumes)? else {
        return Ok(None);
    };
    if let Some(n) = load.get_mut(node.as_str()) {
        *n += 1;
    }
    let volume = Box::new(volume_for(driver, c, class, &node, &path));
    Ok(Some(Action::Provision {
        path,
        content,
        volume,
    }))
}

/// What a new volume of `c` starts with: empty (a directory, or a block file of `bytes`), or a
/// copy of the claim or snapshot its data source names once that is ready. `Ok(None)` while
/// the source is not ready, and for data sources that are not this driver's to fill (other
/// kinds are a populator's).
fn content(
    driver: Driver,
    dirs: &NodeDirs,
    cluster: &Snapshot,
    c: &PersistentVolumeClaim,
    block: bool,
    bytes: u64,
) -> Result<Option<Content>, String> {
    // dataSourceRef wins; the older dataSource says the same in fewer words.
    let source = c
        .spec
        .as_ref()
        .and_then(|s| match (&s.data_source_ref, &s.data_source) {
            (Some(r), _) => Some((
                r.kind.clone(),
                r.api_group.clone().unwrap_or_default(),
                r.name.clone(),
                r.namespace.clone(),
            )),
            (None, Some(d)) => Some((
                d.kind.clone(),
                d.api_group.clone().unwrap_or_default(),
                d.name.clone(),
                None,
            )),
            (None, None) => None,
        });
    let Some((kind, group, source_name, source_ns)) = source else {
        return Ok(Some(if block {
            Content::BlockFile { bytes }
        } else {
            Content::Directory
        }));
    };
    // Local-path cannot fill a volume from anything; other kinds are a populator's.
    let known = matches!(
        (kind.as_str(), group.as_str()),
        ("PersistentVolumeClaim", "") | ("VolumeSnapshot", snapshots::GROUP)
    );
    if driver == Driver::LocalPath || !known {
        return Ok(None);
    }
    if driver == Driver::Shared {
        return Err(format!(
            "{SHARED_DRIVER} does not clone volumes or restore snapshots: claim {:?} \
             names {kind} {source_name:?}",
            name(c)
        ));
    }
    let ns = c.metadata.namespace.as_deref().unwrap_or("");
    if source_ns.as_deref().is_some_and(|s| s != ns) {
        return Err(format!(
            "claim {:?} fills from another namespace, which needs a ReferenceGrant; \
             the development cluster does not support those",
            name(c)
        ));
    }
    if kind == "VolumeSnapshot" {
        restore_source(dirs, cluster, c, &source_name, block, bytes)
    } else {
        clone_source(driver, cluster, c, &source_name, block, bytes)
    }
}

/// The node a volume of `c` goes on: the scheduler's pick for WaitForFirstConsumer classes
/// (`Ok(None)` until it picks), else the one with fewest of our volumes.
fn node_for(
    c: &PersistentVolumeClaim,
    class: &StorageClass,
    load: &BTreeMap<&str, usize>,
) -> Result<Option<String>, String> {
    if class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer") {
        return Ok(selected_node(c).map(str::to_string));
    }
    match load.iter().min_by_key(|(n, count)| (**count, **n)) {
        Some((n, _)) => Ok(Some(n.to_string())),
        None => Err("no nodes to put a local-path volume on".into()),
    }
}

/// Where on `node` the volume of `c` keeps its data: the class's directory layout for
/// local-path, the driver's directory for the CSI-like ones. `Ok(None)` while a volume being
/// reclaimed still holds that place.
fn volume_location(
    driver: Driver,
    dirs: &NodeDirs,
    node: &str,
    class: &StorageClass,
    c: &PersistentVolumeClaim,
    volumes: &[PersistentVolume],
) -> Result<Option<PathBuf>, String> {
    let pv_name = volume_name_for(c);
    let path = match driver {
        Driver::LocalPath => volume_dir(dirs, node, class, &pv_name, c)?,
        Driver::Csi | Driver::Shared => {
            let file = if is_block(c) {
                format!("{pv_name}.img")
            } else {
                pv_name.clone()
            };
            let dir = if driver == Driver::Csi {
                "csi"
            } else {
                "shared"
            };
            dirs.node(node).join(dir).join(file)
        }
    };
    // A pathPattern gives a claim made again under the same name the directory of its
    // predecessor: wait for that volume's reclaim to remove it rather than share it (or
    // lose the new volume's directory to the old one's removal); one that keeps it is a
    // conflict to show.
    match volumes
        .iter()
        .find(|v| volume_path(v).as_ref() == Some(&path))
    {
        None => Ok(Some(path)),
        Some(v) if reclaiming(v) => Ok(None),
        Some(v) => Err(format!(
            "the directory {} for claim {:?} is still the volume {}'s; delete that volume or \
             change the class's pathPattern",
            path.display(),
            name(c),
            name(v)
        )),
    }
}

/// Whether a volume's storage is to go now: released under Delete, or deleted by hand while no
/// claim holds it (kube's HonorPVReclaimPolicy: the storage goes with it, kept only under a
/// policy that keeps it).
fn reclaiming(v: &PersistentVolume) -> bool {
    let released = v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
    let deleting = v.metadata.deletion_timestamp.is_some();
    let bound = v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let held = v
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == PROVISIONER_FINALIZER);
    (released && !deleting && deletes(v)) || (deleting && held && !bound)
}

/// Whether the volume's reclaim policy removes its storage.
fn deletes(v: &PersistentVolume) -> bool {
    v.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        == Some("Delete")
}

/// The provisioner as a loop over the API server.
pub mod agent {
    use std::collections::HashSet;
    use std::time::{Duration, Instant};

    use k8s_openapi::api::core::v1::{Event, PersistentVolume};
    use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
    use kube::{Api, Client};
    use serde_json::json;

    use super::{Action, Content, Driver, NodeDirs, Snapshot, plan};
    use crate::agents::Reader;
    use crate::agents::retry::{Backoff, Retries, warn};
    use crate::agents::volume_data::{copy_tree, remove};

    fn make(path: &std::path::Path, content: &Content) -> std::io::Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        match content {
            Content::Directory => std::fs::create_dir_all(path),
            Content::BlockFile { bytes } => std::fs::File::create(path)?.set_len(*bytes),
            Content::CopyOf { source, bytes } => {
                copy_tree(source, path)?;
                if path.is_file() {
                    // A bigger clone of a block volume: the rest reads as zeros.
                    let f = std::fs::OpenOptions::new().write(true).open(path)?;
                    if f.metadata()?.len() < *bytes {
                        f.set_len(*bytes)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Apply one action; a refusal is an error with its message.
    pub async fn apply(
        client: &Client,
        driver: Driver,
        action: &Action,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let volumes: Api<PersistentVolume> = Api::all(client.clone());
        match action {
            Action::Provision {
                path,
                content,
                volume,
            } => {
                let class = volume
                    .spec
                    .as_ref()
                    .and_then(|s| s.storage_class_name.as_deref());
                let (at, what) = (path.clone(), content.clone());
                crate::agents::off_runtime(move || make(&at, &what))
                    .await
                    .map_err(|e| {
                        format!(
                            "failed to provision volume with StorageClass {:?}: making {}: {e}",
                            class.unwrap_or(""),
                            path.display()
                        )
                    })?;
                volumes.create(&PostParams::default(), volume).await?;
            }
            Action::Reclaim { volume, path } => {
                if let Some(path) = path.clone() {
                    crate::agents::off_runtime(move || remove(&path)).await?;
                }
                match volumes.delete(volume, &DeleteParams::default()).await {
                    Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
                    other => {
                        other?;
                    }
                }
                crate::agents::protection::drop_finalizer(
                    &volumes,
                    volume,
                    super::PROVISIONER_FINALIZER,
                )
                .await?;
            }
            Action::Expand {
                volume,
                namespace,
                claim,
                path,
                bytes,
                capacity,
            } => {
                if let Some(path) = path.as_deref().filter(|p| p.is_file()) {
                    let f = std::fs::OpenOptions::new().write(true).open(path)?;
                    if f.metadata()?.len() < *bytes {
                        f.set_len(*bytes)?;
                    }
                }
                let patch = json!({"spec": {"capacity": {"storage": capacity}}});
                volumes
                    .patch(volume, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                let events: Api<Event> = Api::namespaced(client.clone(), namespace);
                let name = crate::agents::event_name(claim, &crate::agents::unique_suffix());
                let event = json!({"metadata": {"name": name},
                    "involvedObject": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace, "name": claim},
                    "reason": "VolumeResizeSuccessful", "message": format!("resize volume {volume} to {capacity} succeeded"),
                    "type": "Normal", "source": {"component": driver.name()}, "count": 1});
                let event: Event = serde_json::from_value(event)?;
                events.create(&PostParams::default(), &event).await?;
            }
            // Said by the event the failure brings.
            Action::Refuse { message, .. } => return Err(message.clone().into()),
        }
        Ok(())
    }

    /// What a failing action is about: the object it is held back for, and how to tell.
    struct Subject {
        /// The object's uid (or kind and name): what the back-off is kept by.
        key: String,
        /// What changes when the object does: a change ends its back-off.
        fingerprint: String,
        involved: serde_json::Value,
        reason: &'static str,
    }

    fn claim_subject(
        cluster: &Snapshot,
        namespace: &str,
        claim: &str,
        reason: &'static str,
    ) -> Option<Subject> {
        let c = cluster.claims.iter().find(|c| {
            c.metadata.namespace.as_deref() == Some(namespace) && super::name(*c) == claim
        })?;
        let uid = c.metadata.uid.clone().unwrap_or_default();
        Some(Subject {
            key: uid.clone(),
            // The spec (its generation), or the node the scheduler picked.
            fingerprint: format!("{:?}/{:?}", c.metadata.generation, super::selected_node(c)),
            involved: json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": namespace, "name": claim, "uid": uid}),
            reason,
        })
    }

    fn subject(cluster: &Snapshot, action: &Action) -> Option<Subject> {
        match action {
            Action::Provision { volume, .. } => {
                let r = volume.spec.as_ref()?.claim_ref.as_ref()?;
                let (ns, claim) = (r.namespace.as_deref()?, r.name.as_deref()?);
                claim_subject(cluster, ns, claim, "ProvisioningFailed")
            }
            Action::Refuse {
                namespace, claim, ..
            } => claim_subject(cluster, namespace, claim, "ProvisioningFailed"),
            Action::Expand {
                namespace, claim, ..
            } => claim_subject(cluster, namespace, claim, "VolumeResizeFailed"),
            Action::Reclaim { volume, .. } => {
                let v = cluster.volumes.iter().find(|v| super::name(*v) == volume)?;
                Some(Subject {
                    key: format!("PersistentVolume/{volume}"),
                    fingerprint: String::new(),
                    involved: json!({"apiVersion": "v1", "kind": "PersistentVolume",
                        "name": volume, "uid": v.metadata.uid}),
                    reason: "VolumeFailedDelete",
                })
            }
        }
    }

    /// A provisioner: the loop's state is what failed, and when to try it again.
    pub struct Provisioner {
        client: Client,
        reader: Reader,
        driver: Driver,
        dirs: NodeDirs,
        retries: Retries,
    }

    impl Provisioner {
        /// A provisioner reading straight from the API.
        pub fn new(client: Client, driver: Driver, dirs: NodeDirs) -> Provisioner {
            Provisioner {
                reader: Reader::Api(client.clone()),
                client,
                driver,
                dirs,
                retries: Retries::new(Backoff::default()),
            }
        }

        /// One pass: read everything, apply what [`plan`] decides, except what failed and
        /// waits out its back-off.
        pub async fn pass(&mut self) -> Result<(), kube::Error> {
            let (client, driver) = (&self.client, self.driver);
            let cluster = self.reader.read().await?;
            let actions = plan(driver, &self.dirs, &cluster);
            let subjects: Vec<Option<Subject>> =
                actions.iter().map(|a| subject(&cluster, a)).collect();
            let live: HashSet<&str> = subjects.iter().flatten().map(|s| s.key.as_str()).collect();
            self.retries.retain(|k| live.contains(k));
            let now = Instant::now();
            for (action, subject) in actions.iter().zip(&subjects) {
                if let Some(s) = subject
                    && !self.retries.due(&s.key, &s.fingerprint, now)
                {
                    continue;
                }
                match apply(client, driver, action).await {
                    Ok(()) => {
                        if let Some(s) = subject {
                            self.retries.succeeded(&s.key);
                        }
                        log_done(driver, action);
                    }
                    Err(e) => {
                        let message = e.to_string();
                        let Some(s) = subject else {
                            tracing::warn!(
                                error = message,
                                driver = driver.name(),
                                ?action,
                                "action failed"
                            );
                            continue;
                        };
                        let (failures, retry_in) = self.retries.failed(&s.key, &s.fingerprint, now);
                        tracing::warn!(
                            error = message,
                            driver = driver.name(),
                            failures,
                            ?retry_in,
                            ?action,
                            "action failed"
                        );
                        if let Err(e) =
                            warn(client, driver.name(), &s.involved, s.reason, &message).await
                        {
                            tracing::warn!(error = %e, "posting an event");
                        }
                    }
                }
            }
            Ok(())
        }
    }

    fn log_done(driver: Driver, action: &Action) {
        match action {
            Action::Provision {
                path,
                content,
                volume,
            } => {
                let name = volume.metadata.name.as_deref().unwrap_or("");
                tracing::info!(driver = driver.name(), volume = name, path = %path.display(), ?content, "provisioned");
            }
            Action::Reclaim { volume, path } => {
                tracing::info!(driver = driver.name(), volume, ?path, "deleted");
            }
            Action::Expand {
                volume, capacity, ..
            } => {
                tracing::info!(driver = driver.name(), volume, capacity, "expanded");
            }
            Action::Refuse { .. } => {}
        }
    }

    /// Run passes until the task is dropped.
    pub async fn run(
        client: Client,
        driver: Driver,
        dirs: NodeDirs,
        changes: crate::agents::Changes,
        every: Duration,
    ) {
        let mut provisioner = Provisioner::new(client.clone(), driver, dirs);
        provisioner.reader = Reader::Shared(client, changes.clone());
        run_on_change!(changes.subscribe(), every, provisioner.pass())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "disk", "namespace": "vms",
            "labels": {"app": "db"}}}))
        .unwrap()
    }

    #[test]
    fn path_patterns_expand_and_stay_inside() {
        let c = claim();
        assert_eq!(
            expand_pattern(
                "{{ .PVC.Namespace }}/{{.PVC.Name}}-{{ .PVC.Labels.app }}",
                "pvc-1",
                &c
            )
            .unwrap(),
            "vms/disk-db"
        );
        assert_eq!(
            expand_pattern("{{ .PVName }}", "pvc-1", &c).unwrap(),
            "pvc-1"
        );
        let escape = expand_pattern("../{{ .PVName }}", "pvc-1", &c).unwrap_err();
        assert!(
            escape.contains("not a relative path inside nodePath"),
            "{escape}"
        );
        let unknown = expand_pattern("{{ .PVC.Spec }}", "pvc-1", &c).unwrap_err();
        assert!(unknown.contains("\".PVC.Spec\""), "{unknown}");
    }
}
