//! VolumeSnapshots of the CSI-like driver's volumes: what the external-snapshotter (the common
//! snapshot controller and the driver's sidecar) does on a real cluster. A snapshot is a copy of
//! the volume's directory or block file (sparse), kept under the node's `csi/snapshots/`; its
//! VolumeSnapshotContent carries the copy's location as `snapshotHandle` (relative to the node
//! data root) and the source's size as `restoreSize`. Claims restore from a snapshot through the
//! provisioner (`localpath::plan`). Deleting a snapshot deletes its content and the copy when the
//! content's `deletionPolicy` is Delete.
//!
//! Pure: [`plan`] decides, [`agent`] copies and writes.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::{Value, json};

pub use super::snapshot_api::{API_VERSION, DEFAULT_CLASS, GROUP};
use super::volumes::{CSI_DRIVER, Driver, NodeDirs, ours, storage_bytes, volume_node, volume_path};
use super::{Snapshot, name};

/// One change to make.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Copy `from` to `to`, then create `content` and give it `status`.
    Take {
        from: PathBuf,
        to: PathBuf,
        content: Value,
        status: Value,
    },
    /// Write a VolumeSnapshot's status (bound to its content, or an error).
    Status {
        namespace: String,
        name: String,
        status: Value,
    },
    /// Remove the copy, then the content object.
    Delete {
        content: String,
        path: Option<PathBuf>,
    },
}

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter().fold(v, |v, k| &v[*k]).as_str().unwrap_or("")
}

/// Where a content's copy is: its handle below the node data root, never outside it.
pub fn handle_path(dirs: &NodeDirs, handle: &str) -> Option<PathBuf> {
    let rel = std::path::Path::new(handle);
    let inside = !handle.is_empty()
        && rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
    inside.then(|| dirs.root.join(rel))
}

/// The VolumeSnapshot status a ready content gives.
fn bound_status(content: &Value) -> Value {
    let st = &content["status"];
    let nanos = st["creationTime"].as_i64().unwrap_or(0);
    let created = k8s_openapi::jiff::Timestamp::from_nanosecond(nanos as i128)
        .map(|t| t.to_string())
        .unwrap_or_default();
    let bytes = st["restoreSize"].as_i64().unwrap_or(0);
    json!({
        "boundVolumeSnapshotContentName": s(content, &["metadata", "name"]),
        "creationTime": created,
        "readyToUse": st["readyToUse"].as_bool().unwrap_or(false),
        "restoreSize": k8s_rules::Quantity::from_bytes_binary(bytes).to_string(),
    })
}

fn error_status(message: String, now: &str) -> Value {
    json!({"readyToUse": false, "error": {"message": message, "time": now}})
}

/// Whether the snapshot's status already says this (errors compared by message only).
fn same_status(current: &Value, wanted: &Value) -> bool {
    if wanted.get("error").is_some() {
        current["error"]["message"] == wanted["error"]["message"]
    } else {
        [
            "boundVolumeSnapshotContentName",
            "readyToUse",
            "restoreSize",
            "creationTime",
        ]
        .iter()
        .all(|k| current[*k] == wanted[*k])
            && current.get("error").is_none_or(Value::is_null)
    }
}

/// The driver's snapshot class for a snapshot: the named one, or the driver's default.
fn class_for<'a>(classes: &'a [Value], named: Option<&str>) -> Result<Option<&'a Value>, String> {
    match named {
        Some(n) => match classes.iter().find(|c| s(c, &["metadata", "name"]) == n) {
            Some(c) if s(c, &["driver"]) == CSI_DRIVER => Ok(Some(c)),
            Some(_) => Ok(None),
            None => Err(format!(
                "failed to get input parameters to create snapshot: volumesnapshotclass.{GROUP} \"{n}\" not found"
            )),
        },
        None => {
            let defaults: Vec<&Value> = classes
                .iter()
                .filter(|c| {
                    s(c, &["driver"]) == CSI_DRIVER
                        && s(c, &["metadata", "annotations", DEFAULT_CLASS]) == "true"
                })
                .collect();
            match defaults.as_slice() {
                [one] => Ok(Some(*one)),
                [] => Err(format!(
                    "cannot find default snapshot class for driver {CSI_DRIVER}: name one in \
                     spec.volumeSnapshotClassName or mark one with {DEFAULT_CLASS}: \"true\""
                )),
                _ => Err(format!(
                    "{} default snapshot classes were found for driver {CSI_DRIVER}",
                    defaults.len()
                )),
            }
        }
    }
}

/// The bound volume of a claim, if it is one of the CSI-like driver's.
fn our_volume<'a>(
    cluster: &'a Snapshot,
    claim: &PersistentVolumeClaim,
) -> Option<&'a PersistentVolume> {
    let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let volume = claim.spec.as_ref()?.volume_name.as_deref()?;
    let pv = cluster.volumes.iter().find(|v| name(*v) == volume)?;
    (bound && ours(Driver::Csi, pv)).then_some(pv)
}

/// Everything the snapshotter would do now.
pub fn plan(dirs: &NodeDirs, cluster: &Snapshot, now: k8s_openapi::jiff::Timestamp) -> Vec<Action> {
    let mut out = Vec::new();
    for snap in &cluster.volume_snapshots {
        if !snap["metadata"]["deletionTimestamp"].is_null() {
            continue;
        }
        out.extend(plan_snapshot(dirs, cluster, snap, now));
    }
    // Contents whose snapshot is gone: Delete removes them and their copy; Retain keeps both.
    for c in &cluster.snapshot_contents {
        if s(c, &["spec", "driver"]) != CSI_DRIVER || s(c, &["spec", "deletionPolicy"]) != "Delete"
        {
            continue;
        }
        let r = &c["spec"]["volumeSnapshotRef"];
        let exists = cluster.volume_snapshots.iter().any(|v| {
            s(v, &["metadata", "namespace"]) == s(r, &["namespace"])
                && s(v, &["metadata", "name"]) == s(r, &["name"])
                && (s(r, &["uid"]).is_empty() || s(v, &["metadata", "uid"]) == s(r, &["uid"]))
        });
        if !exists {
            out.push(Action::Delete {
                content: s(c, &["metadata", "name"]).into(),
                path: handle_path(dirs, s(c, &["status", "snapshotHandle"])),
            });
        }
    }
    out
}

/// What one VolumeSnapshot needs now: its status once bound to a ready content (pre-provisioned
/// or taken), its copy taken, or why it cannot be, in its status. Snapshots of other drivers'
/// classes and volumes are left alone.
fn plan_snapshot(
    dirs: &NodeDirs,
    cluster: &Snapshot,
    snap: &Value,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<Action> {
    let now_text = now.to_string();
    let ns = s(snap, &["metadata", "namespace"]);
    let snap_name = s(snap, &["metadata", "name"]);
    let uid = s(snap, &["metadata", "uid"]);
    let set_status = |status: Value| {
        (!same_status(&snap["status"], &status)).then(|| Action::Status {
            namespace: ns.into(),
            name: snap_name.into(),
            status,
        })
    };
    // Pre-provisioned: bind to the named content if it is ours and points back here.
    let pre = s(snap, &["spec", "source", "volumeSnapshotContentName"]);
    if !pre.is_empty() {
        let content = cluster.snapshot_contents.iter().find(|c| {
            s(c, &["metadata", "name"]) == pre
                && s(c, &["spec", "driver"]) == CSI_DRIVER
                && s(c, &["spec", "volumeSnapshotRef", "name"]) == snap_name
                && s(c, &["spec", "volumeSnapshotRef", "namespace"]) == ns
        });
        return content.and_then(|c| set_status(bound_status(c)));
    }
    let claim_name = s(snap, &["spec", "source", "persistentVolumeClaimName"]);
    let content_name = format!("snapcontent-{uid}");
    if let Some(c) = cluster
        .snapshot_contents
        .iter()
        .find(|c| s(c, &["metadata", "name"]) == content_name)
    {
        return (c["status"]["readyToUse"] == true)
            .then(|| set_status(bound_status(c)))
            .flatten();
    }
    let named = snap["spec"]["volumeSnapshotClassName"].as_str();
    let claim = cluster
        .claims
        .iter()
        .find(|c| c.metadata.namespace.as_deref() == Some(ns) && name(*c) == claim_name);
    let volume = claim.and_then(|c| our_volume(cluster, c));
    // Ours when our class is named, or when no class is named and the volume is ours.
    let class = match class_for(&cluster.snapshot_classes, named) {
        Ok(Some(c)) => c,
        Ok(None) => return None,
        Err(message) => {
            return (volume.is_some() || named.is_some())
                .then(|| set_status(error_status(message, &now_text)))
                .flatten();
        }
    };
    let Some(claim) = claim else {
        let message = format!(
            "failed to get input parameters to create snapshot {snap_name}: \
             persistentvolumeclaims \"{claim_name}\" not found"
        );
        return set_status(error_status(message, &now_text));
    };
    let Some(volume) = volume else {
        let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let message = if bound {
            format!(
                "the volume of claim \"{claim_name}\" is not one of {CSI_DRIVER}'s: \
                 snapshot class \"{}\" cannot snapshot it",
                s(class, &["metadata", "name"])
            )
        } else {
            format!(
                "the PVC {claim_name} is not yet bound to a PV, will not attempt to take a snapshot"
            )
        };
        return set_status(error_status(message, &now_text));
    };
    take(dirs, snap, class, volume, &content_name, now)
}

/// Taking the snapshot: a copy of `volume`'s data under its node's `csi/snapshots/`, and the
/// VolumeSnapshotContent (named `content_name`) that says where it is and what it restores to.
fn take(
    dirs: &NodeDirs,
    snap: &Value,
    class: &Value,
    volume: &PersistentVolume,
    content_name: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<Action> {
    let (Some(from), Some(node)) = (volume_path(volume), volume_node(volume)) else {
        return None;
    };
    let spec = volume.spec.clone().unwrap_or_default();
    let mode = spec
        .volume_mode
        .clone()
        .unwrap_or_else(|| "Filesystem".into());
    let file = if mode == "Block" {
        format!("{content_name}.img")
    } else {
        content_name.to_string()
    };
    let to = dirs.node(node).join("csi").join("snapshots").join(file);
    let handle = to
        .strip_prefix(&dirs.root)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bytes = storage_bytes(spec.capacity.as_ref());
    let volume_handle = spec
        .csi
        .as_ref()
        .map(|c| c.volume_handle.clone())
        .unwrap_or_default();
    let content = json!({
        "apiVersion": API_VERSION, "kind": "VolumeSnapshotContent",
        "metadata": {"name": content_name},
        "spec": {
            "deletionPolicy": class["deletionPolicy"].as_str().unwrap_or("Delete"),
            "driver": CSI_DRIVER,
            "source": {"volumeHandle": volume_handle},
            "sourceVolumeMode": mode,
            "volumeSnapshotClassName": s(class, &["metadata", "name"]),
            "volumeSnapshotRef": {"apiVersion": API_VERSION, "kind": "VolumeSnapshot",
                "name": s(snap, &["metadata", "name"]),
                "namespace": s(snap, &["metadata", "namespace"]),
                "uid": s(snap, &["metadata", "uid"])},
        },
    });
    let status = json!({
        "snapshotHandle": handle,
        "creationTime": now.as_nanosecond() as i64,
        "readyToUse": true,
        "restoreSize": bytes,
    });
    Some(Action::Take {
        from,
        to,
        content,
        status,
    })
}

/// The snapshotter as a loop over the API server.
pub mod agent {
    use std::collections::HashSet;
    use std::time::{Duration, Instant};

    use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
    use kube::{Api, Client};
    use serde_json::json;

    use super::{API_VERSION, Action, plan};
    use crate::agents::Reader;
    use crate::agents::retry::{Backoff, Retries, warn};
    pub use crate::agents::snapshot_api::resource;
    use crate::agents::volume_data::{copy_tree, remove};
    use crate::agents::volumes::NodeDirs;

    pub async fn apply(
        client: &Client,
        action: &Action,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let contents: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &resource("VolumeSnapshotContent", "volumesnapshotcontents"),
        );
        match action {
            Action::Take {
                from,
                to,
                content,
                status,
            } => {
                let (from_dir, to_dir) = (from.clone(), to.clone());
                crate::agents::off_runtime(move || {
                    if let Some(parent) = to_dir.parent() {
                        std::fs::create_dir_all(parent)?;
                    }
                    // A copy left by a pass that stopped before the object was made.
                    remove(&to_dir)?;
                    copy_tree(&from_dir, &to_dir)
                })
                .await?;
                let object: DynamicObject = serde_json::from_value(content.clone())?;
                let name = object.metadata.name.clone().unwrap_or_default();
                contents.create(&PostParams::default(), &object).await?;
                contents
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": status})),
                    )
                    .await?;
            }
            Action::Status {
                namespace,
                name,
                status,
            } => {
                let snapshots: Api<DynamicObject> = Api::namespaced_with(
                    client.clone(),
                    namespace,
                    &resource("VolumeSnapshot", "volumesnapshots"),
                );
                // The whole status: an error goes once the snapshot is bound.
                let mut status = status.clone();
                if status.get("error").is_none() {
                    status["error"] = serde_json::Value::Null;
                }
                snapshots
                    .patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": status})),
                    )
                    .await?;
            }
            Action::Delete { content, path } => {
                if let Some(path) = path.clone() {
                    crate::agents::off_runtime(move || remove(&path)).await?;
                }
                contents.delete(content, &DeleteParams::default()).await?;
            }
        }
        Ok(())
    }

    /// What a failing action is about: the back-off's key and the event's object and reason.
    fn subject(action: &Action) -> Option<(String, serde_json::Value, &'static str)> {
        match action {
            Action::Take { content, .. } => {
                let r = &content["spec"]["volumeSnapshotRef"];
                let uid = r["uid"].as_str()?;
                let involved = json!({"apiVersion": API_VERSION, "kind": "VolumeSnapshot",
                    "namespace": r["namespace"], "name": r["name"], "uid": uid});
                Some((uid.to_string(), involved, "SnapshotCreationFailed"))
            }
            Action::Delete { content, .. } => {
                let involved = json!({"apiVersion": API_VERSION,
                    "kind": "VolumeSnapshotContent", "name": content});
                Some((
                    format!("VolumeSnapshotContent/{content}"),
                    involved,
                    "SnapshotDeleteError",
                ))
            }
            Action::Status { .. } => None,
        }
    }

    /// The snapshotter: its state is what failed, and when to try it again (a failing copy
    /// is not redone every pass).
    pub struct Snapshotter {
        client: Client,
        reader: Reader,
        dirs: NodeDirs,
        retries: Retries,
    }

    impl Snapshotter {
        /// A snapshotter reading straight from the API.
        pub fn new(client: Client, dirs: NodeDirs) -> Snapshotter {
            Snapshotter {
                reader: Reader::Api(client.clone()),
                client,
                dirs,
                retries: Retries::new(Backoff::default()),
            }
        }

        pub async fn pass(&mut self) -> Result<(), kube::Error> {
            let client = &self.client;
            let cluster = self.reader.read().await?;
            let actions = plan(&self.dirs, &cluster, k8s_openapi::jiff::Timestamp::now());
            let subjects: Vec<_> = actions.iter().map(subject).collect();
            let live: HashSet<&str> = subjects.iter().flatten().map(|s| s.0.as_str()).collect();
            self.retries.retain(|k| live.contains(k));
            let now = Instant::now();
            for (action, subject) in actions.iter().zip(&subjects) {
                if let Some((key, ..)) = subject
                    && !self.retries.due(key, "", now)
                {
                    continue;
                }
                let what = match action {
                    Action::Take { to, .. } => format!("snapshot copied to {}", to.display()),
                    Action::Status {
                        namespace, name, ..
                    } => format!("status of volumesnapshot {namespace}/{name}"),
                    Action::Delete { content, .. } => format!("deleted {content}"),
                };
                match (apply(client, action).await, subject) {
                    (Ok(()), subject) => {
                        if let Some((key, ..)) = subject {
                            self.retries.succeeded(key);
                        }
                        tracing::info!("{what}")
                    }
                    (Err(e), None) => tracing::warn!(error = %e, "failed: {what}"),
                    (Err(e), Some((key, involved, reason))) => {
                        let (failures, retry_in) = self.retries.failed(key, "", now);
                        tracing::warn!(error = %e, failures, ?retry_in, "failed: {what}");
                        let message = match action {
                            Action::Take { from, to, .. } => format!(
                                "failed to take snapshot: copying {} to {}: {e}",
                                from.display(),
                                to.display()
                            ),
                            _ => format!("failed to delete snapshot content: {e}"),
                        };
                        if let Err(e) =
                            warn(client, "csi-snapshotter", involved, reason, &message).await
                        {
                            tracing::warn!(error = %e, "posting an event");
                        }
                    }
                }
            }
            Ok(())
        }
    }

    pub async fn run(
        client: Client,
        dirs: NodeDirs,
        changes: crate::agents::Changes,
        every: Duration,
    ) {
        let mut snapshotter = Snapshotter::new(client.clone(), dirs);
        snapshotter.reader = Reader::Shared(client, changes.clone());
        run_on_change!(changes.subscribe(), every, snapshotter.pass())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_stay_below_the_root() {
        let dirs = NodeDirs {
            root: "/srv/nodes".into(),
        };
        assert_eq!(
            handle_path(&dirs, "node-1/csi/snapshots/snapcontent-1.img"),
            Some(PathBuf::from(
                "/srv/nodes/node-1/csi/snapshots/snapcontent-1.img"
            ))
        );
        for bad in ["", "/etc/passwd", "../x", "node-1/../../x"] {
            assert_eq!(handle_path(&dirs, bad), None, "{bad}");
        }
    }

    #[test]
    fn errors_are_rewritten_only_when_the_message_changes() {
        let a = error_status("m".into(), "t1");
        let b = error_status("m".into(), "t2");
        assert!(same_status(&a, &b));
        assert!(!same_status(&a, &error_status("other".into(), "t1")));
        let content = json!({"metadata": {"name": "c"}, "status": {"readyToUse": true,
            "restoreSize": 1073741824i64, "creationTime": 0}});
        let bound = bound_status(&content);
        assert_eq!(bound["restoreSize"], "1Gi");
        assert!(!same_status(&a, &bound));
        assert!(same_status(&bound, &bound));
    }
}
