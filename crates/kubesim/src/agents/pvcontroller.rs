//! The PersistentVolume controller, as kube-controller-manager runs it for the cases the
//! development cluster needs: bind Pending claims to Available volumes that fit, complete the
//! binding of volumes whose `claimRef` names a claim (pre-bound, provisioned or rebound by
//! hand), mark claims `Lost` when their volume goes away or is given to another claim, and move
//! volumes to `Released` (or `Failed`) when their claim is deleted. Pure: [`reconcile`] turns
//! what it sees into [`Action`]s and the loop in [`agent`] applies them; every decision is
//! level-triggered, so passes converge whatever was missed.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

pub use super::placement::misfit;
use super::placement::{selector_matches, storage};
use super::{Snapshot, name, namespace};

/// Set on a claim once the controller has finished binding it.
pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// Set on whichever side the controller (not a user) bound.
pub const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// Set by a provisioner on the volumes it created; it then owns their deletion.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Set on a claim that waits for a provisioner: which one (and the beta key, still read).
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Set by the scheduler on claims of WaitForFirstConsumer classes.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// One change the controller wants made.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Point the volume at a claim (`uid` filled in once the claim is known).
    SetClaimRef {
        volume: String,
        namespace: String,
        claim: String,
        uid: String,
        by_controller: bool,
    },
    /// Forget the claim a volume was bound to by this controller, making it Available again.
    ClearClaimRef { volume: String },
    /// Set `spec.volumeName` on the claim.
    BindClaim {
        namespace: String,
        claim: String,
        volume: String,
        by_controller: bool,
    },
    ClaimStatus {
        namespace: String,
        claim: String,
        phase: &'static str,
        /// From the bound volume; cleared otherwise.
        capacity: Option<BTreeMap<String, K8sQuantity>>,
        access_modes: Option<Vec<String>>,
    },
    VolumeStatus {
        volume: String,
        phase: &'static str,
        message: Option<String>,
    },
    /// Tell the claim's owner what it waits for, as kube's PV controller does
    /// (`WaitForFirstConsumer`: "waiting for first consumer to be created before binding";
    /// `ProvisioningFailed` when its class does not exist).
    ClaimEvent {
        namespace: String,
        claim: String,
        uid: String,
        reason: &'static str,
        message: String,
        warning: bool,
    },
    /// Say which provisioner the claim waits for.
    AnnotateProvisioner {
        namespace: String,
        claim: String,
        provisioner: String,
    },
}

fn uid<T: kube::Resource>(o: &T) -> &str {
    o.meta().uid.as_deref().unwrap_or("")
}

fn annotation<'a, T: kube::Resource>(o: &'a T, key: &str) -> Option<&'a str> {
    o.meta().annotations.as_ref()?.get(key).map(String::as_str)
}

fn is_wffc(claim: &PersistentVolumeClaim, classes: &[StorageClass]) -> bool {
    let class = claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref());
    classes.iter().any(|c| {
        Some(name(c)) == class && c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
    })
}

/// Whether the volume can be used on the node the scheduler picked for the claim.
fn reachable_from(volume: &PersistentVolume, node: &str, nodes: &[Node]) -> bool {
    let Some(required) = volume
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    else {
        return true;
    };
    nodes
        .iter()
        .find(|n| name(*n) == node)
        .is_some_and(|n| selector_matches(required, n))
}

fn claim_ref_of(volume: &PersistentVolume) -> Option<(&str, &str, &str)> {
    let r = volume.spec.as_ref()?.claim_ref.as_ref()?;
    Some((
        r.namespace.as_deref().unwrap_or(""),
        r.name.as_deref().unwrap_or(""),
        r.uid.as_deref().unwrap_or(""),
    ))
}

fn phase_of_volume(v: &PersistentVolume) -> &str {
    v.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn phase_of_claim(c: &PersistentVolumeClaim) -> &str {
    c.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn volume_status(out: &mut Vec<Action>, v: &PersistentVolume, phase: &'static str, msg: &str) {
    let message = (!msg.is_empty()).then(|| msg.to_string());
    let current = v.status.as_ref().and_then(|s| s.message.clone());
    if phase_of_volume(v) != phase || current != message {
        out.push(Action::VolumeStatus {
            volume: name(v).into(),
            phase,
            message,
        });
    }
}

fn claim_status(
    out: &mut Vec<Action>,
    c: &PersistentVolumeClaim,
    phase: &'static str,
    volume: Option<&PersistentVolume>,
) {
    let capacity = volume.and_then(|v| v.spec.as_ref()?.capacity.clone());
    let access_modes = volume.and_then(|v| v.spec.as_ref()?.access_modes.clone());
    let status = c.status.as_ref();
    let same = phase_of_claim(c) == phase
        && status.and_then(|s| s.capacity.clone()) == capacity
        && status.and_then(|s| s.access_modes.clone()) == access_modes;
    if !same {
        out.push(Action::ClaimStatus {
            namespace: namespace(c).into(),
            claim: name(c).into(),
            phase,
            capacity,
            access_modes,
        });
    }
}

/// Everything the controller would change, given all claims, volumes, classes and nodes.
pub fn reconcile(cluster: &Snapshot) -> Vec<Action> {
    let mut out = Vec::new();
    // Volumes given to a claim in this pass, so two claims never get the same one.
    let mut taken: BTreeSet<&str> = BTreeSet::new();
    // Volumes being deleted too: one kept by a finalizer still moves to Released when its claim
    // goes, which is what lets the protection and the provisioner finish with it.
    for v in &cluster.volumes {
        if claim_ref_of(v).is_some() {
            taken.insert(name(v));
        }
        reconcile_volume(v, &cluster.claims, &mut out);
    }
    let by_volume: BTreeMap<&str, &PersistentVolume> =
        cluster.volumes.iter().map(|v| (name(v), v)).collect();
    for c in &cluster.claims {
        if c.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let volume_name = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .unwrap_or("");
        if !volume_name.is_empty() {
            reconcile_named_volume(c, volume_name, &by_volume, &mut out);
            continue;
        }
        if phase_of_claim(c) == "Lost" {
            continue;
        }
        let (ns, cn) = (namespace(c), name(c));
        let claimed_by_a_volume = cluster.volumes.iter().any(|v| {
            claim_ref_of(v).is_some_and(|(rns, rn, ru)| {
                rns == ns && rn == cn && (ru.is_empty() || ru == uid(c))
            })
        });
        if !claimed_by_a_volume {
            find_volume(c, cluster, &mut taken, &mut out);
        }
        claim_status(&mut out, c, "Pending", None);
    }
    out
}

/// A volume's side: complete the binding its `claimRef` names, undo one its claim left, or
/// release it when its claim is gone (by its reclaim policy).
fn reconcile_volume(v: &PersistentVolume, claims: &[PersistentVolumeClaim], out: &mut Vec<Action>) {
    let Some((ns, claim_name, ref_uid)) = claim_ref_of(v) else {
        volume_status(out, v, "Available", "");
        return;
    };
    let found = claims
        .iter()
        .find(|c| namespace(*c) == ns && name(*c) == claim_name);
    match found {
        Some(c) if ref_uid.is_empty() || ref_uid == uid(c) => {
            if ref_uid.is_empty() {
                out.push(Action::SetClaimRef {
                    volume: name(v).into(),
                    namespace: ns.into(),
                    claim: claim_name.into(),
                    uid: uid(c).into(),
                    by_controller: annotation(v, BOUND_BY_CONTROLLER).is_some(),
                });
            }
            let claim_volume = c
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .unwrap_or("");
            if claim_volume.is_empty() {
                // Only a claim that is not Lost may take a volume (as upstream: a Lost
                // claim stays Lost until its owner deletes it).
                if phase_of_claim(c) != "Lost" {
                    out.push(Action::BindClaim {
                        namespace: ns.into(),
                        claim: claim_name.into(),
                        volume: name(v).into(),
                        by_controller: true,
                    });
                }
                volume_status(out, v, "Available", "");
            } else if claim_volume == name(v) {
                volume_status(out, v, "Bound", "");
            } else if annotation(v, BOUND_BY_CONTROLLER).is_some() {
                // The claim went to another volume; we bound this one, so we undo it.
                out.push(Action::ClearClaimRef {
                    volume: name(v).into(),
                });
            } else {
                volume_status(out, v, "Available", "");
            }
        }
        // Pre-bound by a user to a claim that does not exist yet: it waits for it.
        None if ref_uid.is_empty() => volume_status(out, v, "Available", ""),
        // The claim it was bound to is gone (deleted, or deleted and made again).
        _ => release(v, out),
    }
}

/// A volume whose claim is gone: Released for its provisioner (or to keep), Failed when
/// nothing of this cluster can reclaim it.
fn release(v: &PersistentVolume, out: &mut Vec<Action>) {
    let policy = v
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Retain");
    match policy {
        "Retain" => volume_status(out, v, "Released", ""),
        // The provisioner that made it deletes the storage and the object.
        "Delete" if annotation(v, PROVISIONED_BY).is_some() => {
            volume_status(out, v, "Released", "")
        }
        _ => volume_status(
            out,
            v,
            "Failed",
            &format!(
                "no provisioner of this cluster made volume {:?}, so nothing can \
                 reclaim its storage ({policy}); clean it up and delete the \
                 PersistentVolume by hand",
                name(v)
            ),
        ),
    }
}

/// A claim naming its volume: Bound once the volume points back, Lost when the volume went
/// away or to another claim, else Pending (binding a free volume a user pre-bound it to).
fn reconcile_named_volume(
    c: &PersistentVolumeClaim,
    volume_name: &str,
    by_volume: &BTreeMap<&str, &PersistentVolume>,
    out: &mut Vec<Action>,
) {
    let (ns, cn) = (namespace(c), name(c));
    let volume = by_volume.get(volume_name).copied();
    let points_here = volume
        .and_then(claim_ref_of)
        .is_some_and(|(rns, rn, ru)| rns == ns && rn == cn && (ru.is_empty() || ru == uid(c)));
    if points_here {
        claim_status(out, c, "Bound", volume);
    } else if phase_of_claim(c) == "Bound" || phase_of_claim(c) == "Lost" {
        // Its volume was deleted or handed to another claim.
        claim_status(out, c, "Lost", None);
    } else if let Some(v) = volume.filter(|v| claim_ref_of(v).is_none()) {
        // Pre-bound by a user to a free volume: bind it from the volume's side.
        if misfit(c, v).is_none() {
            out.push(Action::SetClaimRef {
                volume: volume_name.into(),
                namespace: ns.into(),
                claim: cn.into(),
                uid: uid(c).into(),
                by_controller: true,
            });
        }
        claim_status(out, c, "Pending", None);
    } else {
        claim_status(out, c, "Pending", None);
    }
}

/// An unbound claim: the smallest free volume that fits (for WaitForFirstConsumer, once a node
/// is selected, one usable there), or else the provisioner it waits for, and what it waits for
/// said in events.
fn find_volume<'a>(
    c: &PersistentVolumeClaim,
    cluster: &'a Snapshot,
    taken: &mut BTreeSet<&'a str>,
    out: &mut Vec<Action>,
) {
    let (ns, cn) = (namespace(c), name(c));
    let classes = &cluster.classes;
    let selected = annotation(c, SELECTED_NODE);
    let wffc = is_wffc(c, classes);
    let best = cluster
        .volumes
        .iter()
        .filter(|v| claim_ref_of(v).is_none() && !taken.contains(name(*v)))
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .filter(|v| misfit(c, v).is_none())
        .filter(|v| !wffc || selected.is_some_and(|n| reachable_from(v, n, &cluster.nodes)))
        .min_by_key(|v| {
            let size = storage(v.spec.as_ref().and_then(|s| s.capacity.as_ref()));
            (size.unwrap_or(0), name(*v).to_string())
        });
    let class = c
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .and_then(|n| classes.iter().find(|k| name(*k) == n));
    let provisioner = class
        .map(|k| k.provisioner.as_str())
        .filter(|p| *p != "kubernetes.io/no-provisioner");
    if let Some(p) = provisioner
        && best.is_none()
        && (!wffc || selected.is_some())
        && annotation(c, STORAGE_PROVISIONER) != Some(p)
    {
        out.push(Action::AnnotateProvisioner {
            namespace: ns.into(),
            claim: cn.into(),
            provisioner: p.into(),
        });
    }
    if wffc && selected.is_none() {
        out.push(Action::ClaimEvent {
            namespace: ns.into(),
            claim: cn.into(),
            uid: uid(c).into(),
            reason: "WaitForFirstConsumer",
            message: "waiting for first consumer to be created before binding".into(),
            warning: false,
        });
    }
    // A class that does not exist: nothing can provision the claim, and kube says so.
    let class_name = c
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .filter(|n| !n.is_empty());
    if let Some(missing) = class_name.filter(|_| class.is_none() && best.is_none()) {
        out.push(Action::ClaimEvent {
            namespace: ns.into(),
            claim: cn.into(),
            uid: uid(c).into(),
            reason: "ProvisioningFailed",
            message: format!("storageclass.storage.k8s.io \"{missing}\" not found"),
            warning: true,
        });
    }
    if let Some(v) = best {
        taken.insert(name(v));
        out.push(Action::SetClaimRef {
            volume: name(v).into(),
            namespace: ns.into(),
            claim: cn.into(),
            uid: uid(c).into(),
            by_controller: true,
        });
        out.push(Action::BindClaim {
            namespace: ns.into(),
            claim: cn.into(),
            volume: name(v).into(),
            by_controller: true,
        });
    }
}

/// The controller as a loop over the API server.
pub mod agent {
    use std::time::Duration;

    use std::collections::HashSet;

    use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
    use kube::api::{Patch, PatchParams};
    use kube::{Api, Client};
    use serde_json::json;

    use super::{
        Action, BETA_STORAGE_PROVISIONER, BIND_COMPLETED, BOUND_BY_CONTROLLER, STORAGE_PROVISIONER,
        reconcile,
    };
    use crate::agents::Reader;

    /// Apply one action.
    pub async fn apply(client: &Client, action: &Action) -> Result<(), kube::Error> {
        let pp = PatchParams::default();
        let volumes: Api<PersistentVolume> = Api::all(client.clone());
        let claims = |ns: &str| Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
        match action {
            Action::SetClaimRef {
                volume,
                namespace,
                claim,
                uid,
                by_controller,
            } => {
                let mut patch = json!({"spec": {"claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace, "name": claim, "uid": uid}}});
                if *by_controller {
                    patch["metadata"] = json!({"annotations": {BOUND_BY_CONTROLLER: "yes"}});
                }
                volumes.patch(volume, &pp, &Patch::Merge(patch)).await?;
            }
            Action::ClearClaimRef { volume } => {
                let patch = json!({"metadata": {"annotations": {BOUND_BY_CONTROLLER: null}}, "spec": {"claimRef": null}});
                volumes.patch(volume, &pp, &Patch::Merge(patch)).await?;
            }
            Action::BindClaim {
                namespace,
                claim,
                volume,
                by_controller,
            } => {
                let mut annotations = json!({BIND_COMPLETED: "yes"});
                if *by_controller {
                    annotations[BOUND_BY_CONTROLLER] = json!("yes");
                }
                let patch = json!({"metadata": {"annotations": annotations}, "spec": {"volumeName": volume}});
                claims(namespace)
                    .patch(claim, &pp, &Patch::Merge(patch))
                    .await?;
            }
            Action::ClaimStatus {
                namespace,
                claim,
                phase,
                capacity,
                access_modes,
            } => {
                let patch = json!({"status": {"phase": phase, "capacity": capacity, "accessModes": access_modes}});
                claims(namespace)
                    .patch_status(claim, &pp, &Patch::Merge(patch))
                    .await?;
            }
            Action::AnnotateProvisioner {
                namespace,
                claim,
                provisioner,
            } => {
                let patch = json!({"metadata": {"annotations": {
                    STORAGE_PROVISIONER: provisioner, BETA_STORAGE_PROVISIONER: provisioner}}});
                claims(namespace)
                    .patch(claim, &pp, &Patch::Merge(patch))
                    .await?;
            }
            Action::ClaimEvent {
                namespace,
                claim,
                uid,
                reason,
                message,
                warning,
            } => {
                let now = jiff::Timestamp::now().to_string();
                let type_ = if *warning { "Warning" } else { "Normal" };
                // One event per claim and reason: the fixed name makes repeats a conflict.
                let event: Event = serde_json::from_value(json!({
                    "metadata": {"name": crate::agents::event_name(claim, &reason.to_lowercase()),
                        "namespace": namespace},
                    "involvedObject": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "namespace": namespace, "name": claim, "uid": uid},
                    "reason": reason, "message": message, "type": type_,
                    "source": {"component": "persistentvolume-controller"},
                    "firstTimestamp": now, "lastTimestamp": now, "count": 1}))
                .map_err(kube::Error::SerdeError)?;
                match Api::<Event>::namespaced(client.clone(), namespace)
                    .create(&Default::default(), &event)
                    .await
                {
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    other => {
                        other?;
                    }
                }
            }
            Action::VolumeStatus {
                volume,
                phase,
                message,
            } => {
                let patch = json!({"status": {"phase": phase, "message": message}});
                volumes
                    .patch_status(volume, &pp, &Patch::Merge(patch))
                    .await?;
            }
        }
        Ok(())
    }

    /// One pass: read everything, apply what [`reconcile`] decides.
    /// `told` remembers the events already posted (claim and reason), so each is posted once,
    /// not each pass.
    pub async fn pass(
        client: &Client,
        told: &mut HashSet<(String, &'static str)>,
    ) -> Result<(), kube::Error> {
        pass_reading(&Reader::Api(client.clone()), client, told).await
    }

    async fn pass_reading(
        reader: &Reader,
        client: &Client,
        told: &mut HashSet<(String, &'static str)>,
    ) -> Result<(), kube::Error> {
        for action in reconcile(&*reader.read().await?) {
            let event_for = match &action {
                Action::ClaimEvent { uid, reason, .. } => {
                    let key = (uid.clone(), *reason);
                    if told.contains(&key) {
                        continue;
                    }
                    Some(key)
                }
                _ => None,
            };
            // One failed write (say a conflict with a user's edit) must not stop the others;
            // the next pass sees the new state and decides again.
            match apply(client, &action).await {
                Ok(()) if event_for.is_some() => {
                    told.extend(event_for);
                }
                Ok(()) => tracing::info!(?action, "applied"),
                Err(e) => tracing::warn!(error = %e, ?action, "pv controller action failed"),
            }
        }
        Ok(())
    }

    /// Run passes until the task is dropped.
    pub async fn run(client: Client, changes: crate::agents::Changes, every: Duration) {
        let mut told = HashSet::new();
        let reader = Reader::Shared(client.clone(), changes.clone());
        run_on_change!(
            changes.subscribe(),
            every,
            pass_reading(&reader, &client, &mut told)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::nodes::default_nodes;
    use serde_json::json;

    fn local_volume(name: &str, node: &str) -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
            "storageClassName": "local", "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"], "local": {"path": "/x"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}}))
        .unwrap()
    }

    fn wffc_claim(selected: Option<&str>) -> PersistentVolumeClaim {
        let annotations = selected.map(|n| json!({SELECTED_NODE: n}));
        serde_json::from_value(json!({"metadata": {"name": "c", "namespace": "default", "uid": "u1", "annotations": annotations}, "spec": {
            "storageClassName": "local", "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}}}))
        .unwrap()
    }

    fn bound_volume(actions: &[Action]) -> Option<&str> {
        actions.iter().find_map(|a| match a {
            Action::BindClaim { volume, .. } => Some(volume.as_str()),
            _ => None,
        })
    }

    #[test]
    fn wait_for_first_consumer_claims_bind_only_where_the_pod_goes() {
        let class: StorageClass = serde_json::from_value(json!({"metadata": {"name": "local"},
            "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"}))
        .unwrap();
        let cluster = |selected: Option<&str>| Snapshot {
            claims: vec![wffc_claim(selected)],
            volumes: vec![
                local_volume("on-1", "node-1"),
                local_volume("on-3", "node-3"),
            ],
            classes: vec![class.clone()],
            nodes: default_nodes()
                .iter()
                .enumerate()
                .map(|(i, n)| n.node(i))
                .collect(),
            ..Default::default()
        };

        let before = reconcile(&cluster(None));
        assert_eq!(bound_volume(&before), None, "{before:?}");
        let after = reconcile(&cluster(Some("node-3")));
        assert_eq!(bound_volume(&after), Some("on-3"));
        let nowhere = reconcile(&cluster(Some("node-2")));
        assert_eq!(bound_volume(&nowhere), None);
    }

    /// A claim of a class that does not exist gets kube's ProvisioningFailed warning; once a
    /// volume of that class name fits, it binds as a static volume instead.
    #[test]
    fn a_missing_class_is_said() {
        let cluster = |volumes: Vec<PersistentVolume>| Snapshot {
            claims: vec![wffc_claim(None)],
            volumes,
            ..Default::default()
        };
        let events: Vec<(&str, String, bool)> = reconcile(&cluster(vec![]))
            .into_iter()
            .filter_map(|a| match a {
                Action::ClaimEvent {
                    reason,
                    message,
                    warning,
                    ..
                } => Some((reason, message, warning)),
                _ => None,
            })
            .collect();
        assert_eq!(
            events,
            [(
                "ProvisioningFailed",
                "storageclass.storage.k8s.io \"local\" not found".to_string(),
                true
            )]
        );
        let actions = reconcile(&cluster(vec![local_volume("v", "node-1")]));
        assert_eq!(bound_volume(&actions), Some("v"));
        assert!(
            !actions
                .iter()
                .any(|a| matches!(a, Action::ClaimEvent { .. })),
            "{actions:?}"
        );
    }

    #[test]
    fn misfits_say_why() {
        let v = local_volume("v", "node-1");
        let mut c = wffc_claim(None);
        assert_eq!(misfit(&c, &v), None);
        c.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteMany".into()]);
        assert_eq!(
            misfit(&c, &v).as_deref(),
            Some("access mode ReadWriteMany is not offered")
        );
        let mut c = wffc_claim(None);
        c.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        assert_eq!(misfit(&c, &v).as_deref(), Some("volume mode differs"));
        let mut c = wffc_claim(None);
        c.spec
            .as_mut()
            .unwrap()
            .resources
            .as_mut()
            .unwrap()
            .requests = Some([("storage".to_string(), K8sQuantity("2Gi".into()))].into());
        assert_eq!(
            misfit(&c, &v).as_deref(),
            Some("capacity is smaller than the claim's request")
        );
    }
}
