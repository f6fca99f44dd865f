//! A local-path provisioner (the `rancher.io/local-path` of the WaitForFirstConsumer seed): each
//! volume is a directory under a node's data directory, pinned to that node by required node
//! affinity on `kubernetes.io/hostname`. Immediate classes get a volume at once on the node with
//! the fewest; WaitForFirstConsumer classes wait for the scheduler's `selected-node`. No
//! CSIDriver object exists for it, so CDI treats its classes as non-CSI (host-assisted paths).
//! Pure: [`plan`] decides, [`agent`] creates directories and objects.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::json;

use super::nodes::HOSTNAME_LABEL;
use super::pvcontroller::{
    BETA_STORAGE_PROVISIONER, PROVISIONED_BY, SELECTED_NODE, STORAGE_PROVISIONER,
};

/// The provisioner name classes use.
pub const PROVISIONER: &str = "rancher.io/local-path";
/// Where volumes go inside a node's data directory unless the class says `nodePath`.
pub const DEFAULT_NODE_PATH: &str = "/opt/local-path-provisioner";

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

/// One change the provisioner wants made.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Make `dir`, then create the volume.
    Provision {
        dir: PathBuf,
        volume: Box<PersistentVolume>,
    },
    /// Remove `dir` (if it is there), then delete the volume object.
    Reclaim {
        volume: String,
        dir: Option<PathBuf>,
    },
    /// Tell the claim's owner why nothing happens (a `ProvisioningFailed` event).
    Refuse {
        namespace: String,
        claim: String,
        message: String,
    },
}

fn meta_str<'a>(
    o: &'a impl kube::Resource,
    f: impl Fn(&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<&'a String>,
) -> &'a str {
    f(o.meta()).map(String::as_str).unwrap_or("")
}

fn name(o: &impl kube::Resource) -> &str {
    meta_str(o, |m| m.name.as_ref())
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
    Ok(dirs.node(node).join(inside).join(folder))
}

fn selected_node(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(SELECTED_NODE)
        .map(String::as_str)
}

fn volume_node(v: &PersistentVolume) -> Option<&str> {
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

fn ours(v: &PersistentVolume) -> bool {
    v.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROVISIONED_BY))
        .is_some_and(|p| p == PROVISIONER)
}

/// The volume a claim of ours gets on `node`.
fn volume_for(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &str,
    dir: &Path,
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
    let value = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": format!("pvc-{uid}"), "annotations": {PROVISIONED_BY: PROVISIONER}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": spec.access_modes.unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
            "volumeMode": "Filesystem",
            "storageClassName": name(class),
            "persistentVolumeReclaimPolicy": class.reclaim_policy.as_deref().unwrap_or("Delete"),
            "hostPath": {"path": dir.to_string_lossy(), "type": "DirectoryOrCreate"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": claim.metadata.namespace, "name": claim.metadata.name, "uid": uid},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}]}},
        },
    });
    serde_json::from_value(value).expect("a PersistentVolume")
}

/// Everything the provisioner would do, given the cluster's claims, volumes, classes and nodes.
pub fn plan(
    dirs: &NodeDirs,
    claims: &[PersistentVolumeClaim],
    volumes: &[PersistentVolume],
    classes: &[StorageClass],
    nodes: &[Node],
) -> Vec<Action> {
    let mut out = Vec::new();
    // How many of our volumes each node holds, for spreading Immediate volumes.
    let mut load: BTreeMap<&str, usize> = nodes.iter().map(|n| (name(n), 0)).collect();
    for v in volumes.iter().filter(|v| ours(v)) {
        if let Some(n) = volume_node(v).and_then(|n| load.get_mut(n)) {
            *n += 1;
        }
    }
    for c in claims {
        let spec = c.spec.as_ref();
        let class_name = spec.and_then(|s| s.storage_class_name.as_deref());
        let Some(class) = classes
            .iter()
            .find(|k| Some(name(*k)) == class_name && k.provisioner == PROVISIONER)
        else {
            continue;
        };
        let unbound = spec
            .and_then(|s| s.volume_name.as_deref())
            .is_none_or(str::is_empty);
        let phase = c.status.as_ref().and_then(|s| s.phase.as_deref());
        if !unbound || phase == Some("Lost") || c.metadata.deletion_timestamp.is_some() {
            continue;
        }
        // As external provisioners do: only claims the PV controller handed to us.
        let handed = c.metadata.annotations.as_ref().is_some_and(|a| {
            [STORAGE_PROVISIONER, BETA_STORAGE_PROVISIONER]
                .iter()
                .any(|k| a.get(*k).map(String::as_str) == Some(PROVISIONER))
        });
        if !handed {
            continue;
        }
        let uid = c.metadata.uid.as_deref().unwrap_or("");
        let pv_name = format!("pvc-{uid}");
        if volumes.iter().any(|v| name(v) == pv_name) {
            continue;
        }
        let refuse = |message: String| Action::Refuse {
            namespace: c.metadata.namespace.clone().unwrap_or_default(),
            claim: name(c).into(),
            message,
        };
        if spec.and_then(|s| s.volume_mode.as_deref()) == Some("Block") {
            out.push(refuse(format!(
                "{PROVISIONER} makes only Filesystem volumes; use a class whose provisioner \
                 supports Block for claim {:?}",
                name(c)
            )));
            continue;
        }
        if spec.is_some_and(|s| s.data_source.is_some() || s.data_source_ref.is_some()) {
            // As the original: it cannot fill a volume from a source, so it does not try.
            continue;
        }
        let wffc = class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
        let node = if wffc {
            match selected_node(c) {
                Some(n) => n.to_string(),
                None => continue,
            }
        } else {
            match load.iter().min_by_key(|(n, count)| (**count, **n)) {
                Some((n, _)) => n.to_string(),
                None => {
                    out.push(refuse("no nodes to put a local-path volume on".into()));
                    continue;
                }
            }
        };
        match volume_dir(dirs, &node, class, &pv_name, c) {
            Ok(dir) => {
                if let Some(n) = load.get_mut(node.as_str()) {
                    *n += 1;
                }
                let volume = Box::new(volume_for(c, class, &node, &dir));
                out.push(Action::Provision { dir, volume });
            }
            Err(message) => out.push(refuse(message)),
        }
    }
    for v in volumes.iter().filter(|v| ours(v)) {
        let released = v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
        let policy = v
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref());
        if released && policy == Some("Delete") && v.metadata.deletion_timestamp.is_none() {
            let dir = v
                .spec
                .as_ref()
                .and_then(|s| s.host_path.as_ref())
                .map(|h| PathBuf::from(&h.path))
                // Never remove anything outside the node data directories.
                .filter(|d| d.starts_with(&dirs.root));
            out.push(Action::Reclaim {
                volume: name(v).into(),
                dir,
            });
        }
    }
    out
}

/// The provisioner as a loop over the API server.
pub mod agent {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::StorageClass;
    use kube::api::{DeleteParams, ListParams, PostParams};
    use kube::{Api, Client};
    use serde_json::json;

    use super::{Action, NodeDirs, PROVISIONER, plan};

    /// Apply one action; `false` when it had been done already (the event exists).
    pub async fn apply(
        client: &Client,
        action: &Action,
    ) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
        let volumes: Api<PersistentVolume> = Api::all(client.clone());
        match action {
            Action::Provision { dir, volume } => {
                std::fs::create_dir_all(dir)?;
                volumes.create(&PostParams::default(), volume).await?;
            }
            Action::Reclaim { volume, dir } => {
                if let Some(dir) = dir {
                    match std::fs::remove_dir_all(dir) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                        _ => {}
                    }
                }
                volumes.delete(volume, &DeleteParams::default()).await?;
            }
            Action::Refuse {
                namespace,
                claim,
                message,
            } => {
                let events: Api<Event> = Api::namespaced(client.clone(), namespace);
                let now = jiff::Timestamp::now()
                    .round(jiff::Unit::Second)
                    .map(|t| t.to_string())
                    .unwrap_or_default();
                // One event per claim and reason: a fixed name makes repeats a harmless conflict.
                let event = json!({"metadata": {"name": format!("{claim}.local-path-provisioning-failed")},
                    "involvedObject": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace, "name": claim},
                    "reason": "ProvisioningFailed", "message": message, "type": "Warning",
                    "source": {"component": PROVISIONER}, "firstTimestamp": now, "lastTimestamp": now, "count": 1});
                let event: Event = serde_json::from_value(event)?;
                match events.create(&PostParams::default(), &event).await {
                    Err(kube::Error::Api(e)) if e.code == 409 => return Ok(false),
                    other => {
                        other?;
                    }
                }
            }
        }
        Ok(true)
    }

    /// One pass: read everything, apply what [`plan`] decides.
    pub async fn pass(client: &Client, dirs: &NodeDirs) -> Result<(), kube::Error> {
        let lp = ListParams::default();
        let claims = Api::<PersistentVolumeClaim>::all(client.clone())
            .list(&lp)
            .await?
            .items;
        let volumes = Api::<PersistentVolume>::all(client.clone())
            .list(&lp)
            .await?
            .items;
        let classes = Api::<StorageClass>::all(client.clone())
            .list(&lp)
            .await?
            .items;
        let nodes = Api::<Node>::all(client.clone()).list(&lp).await?.items;
        for action in plan(dirs, &claims, &volumes, &classes, &nodes) {
            match apply(client, &action).await {
                Ok(true) => match &action {
                    Action::Provision { dir, volume } => {
                        let name = volume.metadata.name.as_deref().unwrap_or("");
                        tracing::info!(volume = name, dir = %dir.display(), "provisioned");
                    }
                    Action::Reclaim { volume, dir } => {
                        tracing::info!(volume, ?dir, "deleted");
                    }
                    Action::Refuse {
                        namespace,
                        claim,
                        message,
                    } => {
                        tracing::warn!(claim = %format!("{namespace}/{claim}"), message, "refused");
                    }
                },
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, ?action, "local-path action failed"),
            }
        }
        Ok(())
    }

    /// Run passes until the task is dropped.
    pub async fn run(client: Client, dirs: NodeDirs, every: Duration) {
        loop {
            if let Err(e) = pass(&client, &dirs).await {
                tracing::warn!(error = %e, "local-path pass failed");
            }
            tokio::time::sleep(every).await;
        }
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
