//! In-use protection, as kube-controller-manager's pvc-protection and pv-protection controllers
//! run it: a deleted claim stays (Terminating) while a pod that is scheduled and not finished
//! mounts it, and a deleted volume stays while it is Bound, so that nothing a running pod uses
//! is taken from under it. The API server adds the finalizers when the objects are created
//! ([`crate::apiserver::ApiServer::protecting_storage`]); this agent removes them once nothing
//! uses the object. Pure: [`plan`] decides, the loop in [`agent`] writes.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};

use super::{name, namespace};
use crate::apiserver::{PV_PROTECTION, PVC_PROTECTION};

/// A finalizer that may now go.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    ReleaseClaim { namespace: String, claim: String },
    ReleaseVolume { volume: String },
}

fn held<T: kube::Resource>(o: &T, finalizer: &str) -> bool {
    o.meta().deletion_timestamp.is_some()
        && o.meta().finalizers.iter().flatten().any(|f| f == finalizer)
}

/// The claims `pod` mounts, directly or as its generic ephemeral volumes (`<pod>-<volume>`).
fn claims_of(pod: &Pod) -> impl Iterator<Item = String> + '_ {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter_map(move |v| {
            if let Some(c) = &v.persistent_volume_claim {
                Some(c.claim_name.clone())
            } else {
                v.ephemeral
                    .as_ref()
                    .map(|_| format!("{}-{}", name(pod), v.name))
            }
        })
}

/// Whether `pod` keeps the claims it mounts: once scheduled (the kubelet refuses to start a pod
/// whose claim is being deleted) and until it has finished.
fn holds_claims(pod: &Pod) -> bool {
    let scheduled = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let finished = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    scheduled && !finished
}

/// What may be released now.
pub fn plan(
    claims: &[PersistentVolumeClaim],
    volumes: &[PersistentVolume],
    pods: &[Pod],
) -> Vec<Action> {
    let mut out = Vec::new();
    for c in claims.iter().filter(|c| held(*c, PVC_PROTECTION)) {
        let in_use = pods
            .iter()
            .filter(|p| namespace(*p) == namespace(c) && holds_claims(p))
            .any(|p| claims_of(p).any(|n| n == name(c)));
        if !in_use {
            out.push(Action::ReleaseClaim {
                namespace: namespace(c).into(),
                claim: name(c).into(),
            });
        }
    }
    for v in volumes.iter().filter(|v| held(*v, PV_PROTECTION)) {
        let bound = v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        if !bound {
            out.push(Action::ReleaseVolume {
                volume: name(v).into(),
            });
        }
    }
    out
}

/// Remove `finalizer` from the object, if it is still there: a JSON patch that tests the list
/// it read, so that a finalizer someone added meanwhile is never lost (the next pass retries).
pub async fn drop_finalizer<K>(
    api: &kube::Api<K>,
    object: &str,
    finalizer: &str,
) -> kube::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let Some(current) = api.get_opt(object).await? else {
        return Ok(());
    };
    let list = current.meta().finalizers.clone().unwrap_or_default();
    if !list.iter().any(|f| f == finalizer) {
        return Ok(());
    }
    let kept: Vec<&String> = list.iter().filter(|f| *f != finalizer).collect();
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        {"op": "test", "path": "/metadata/finalizers", "value": list},
        {"op": "replace", "path": "/metadata/finalizers", "value": kept},
    ]))
    .map_err(kube::Error::SerdeError)?;
    match api
        .patch(
            object,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::<()>::Json(patch),
        )
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other.map(|_| ()),
    }
}

pub mod agent {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use kube::{Api, Client};

    use super::{Action, drop_finalizer, plan};
    use crate::agents::Reader;
    use crate::apiserver::{PV_PROTECTION, PVC_PROTECTION};

    async fn pass(reader: &Reader, client: &Client) -> Result<(), kube::Error> {
        let cluster = reader.read().await?;
        for action in plan(&cluster.claims, &cluster.volumes, &cluster.pods) {
            let done = match &action {
                Action::ReleaseClaim { namespace, claim } => {
                    let api: Api<PersistentVolumeClaim> =
                        Api::namespaced(client.clone(), namespace);
                    drop_finalizer(&api, claim, PVC_PROTECTION).await
                }
                Action::ReleaseVolume { volume } => {
                    let api: Api<PersistentVolume> = Api::all(client.clone());
                    drop_finalizer(&api, volume, PV_PROTECTION).await
                }
            };
            // A conflict (the object changed since it was read) is decided again next pass.
            match done {
                Ok(()) => tracing::info!(?action, "released"),
                Err(e) => tracing::warn!(error = %e, ?action, "releasing failed"),
            }
        }
        Ok(())
    }

    pub async fn run(client: Client, changes: crate::agents::Changes, every: Duration) {
        let reader = Reader::Shared(client.clone(), changes.clone());
        run_on_change!(changes.subscribe(), every, pass(&reader, &client))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(name: &str, deleting: bool) -> PersistentVolumeClaim {
        let mut meta = json!({"name": name, "namespace": "ns",
            "finalizers": [PVC_PROTECTION]});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(json!({"metadata": meta})).unwrap()
    }

    fn pod(name: &str, ns: &str, claim: &str, node: Option<&str>, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": node, "containers": [{"name": "c"}],
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]},
            "status": {"phase": phase}}))
        .unwrap()
    }

    fn volume(name: &str, phase: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": name, "finalizers": [PV_PROTECTION],
                "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": phase}}))
        .unwrap()
    }

    fn release(claim: &str) -> Action {
        Action::ReleaseClaim {
            namespace: "ns".into(),
            claim: claim.into(),
        }
    }

    #[test]
    fn claims_stay_while_a_running_pod_mounts_them() {
        let claims = [
            claim("used", true),
            claim("free", true),
            claim("kept", false),
        ];
        let pods = [
            pod("runs", "ns", "used", Some("n1"), "Running"),
            pod("kept-user", "ns", "kept", Some("n1"), "Running"),
            // Finished, unscheduled, or in another namespace: none of them holds the claim.
            pod("done", "ns", "free", Some("n1"), "Succeeded"),
            pod("failed", "ns", "free", Some("n1"), "Failed"),
            pod("unscheduled", "ns", "free", None, "Pending"),
            pod("elsewhere", "other", "free", Some("n1"), "Running"),
        ];
        assert_eq!(plan(&claims, &[], &pods), [release("free")]);
        // A generic ephemeral volume's claim is `<pod>-<volume>`.
        let claims = [claim("runs-scratch", true)];
        assert_eq!(plan(&claims, &[], &pods), []);
        assert_eq!(plan(&claims, &[], &pods[2..]), [release("runs-scratch")]);
    }

    #[test]
    fn volumes_stay_while_bound() {
        let volumes = [volume("bound", "Bound"), volume("released", "Released")];
        assert_eq!(
            plan(&[], &volumes, &[]),
            [Action::ReleaseVolume {
                volume: "released".into()
            }]
        );
    }
}
