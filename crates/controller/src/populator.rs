//! The import populator: claims whose `dataSourceRef` is a VolumeImportSource get a PVC prime
//! (cdi-core `populator`), which the import controller fills like any import claim; the target
//! mirrors PVC prime's progress and conditions, and takes over its volume once the import
//! succeeded (the PV's `claimRef` switched, no data copied). The target is never bound to a
//! half-written volume.

use std::sync::Arc;

use cdi_api::populators::VolumeImportSource;
use cdi_core::populator::{self, Readiness};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::{Context, Error};

/// Re-emit PVC prime's events on the target, prefixed `[prime-…] : ` as upstream does; each
/// once (the target's events are read once per pass, not once per copied event).
async fn copy_events(ctx: &Context, prime: &PersistentVolumeClaim, target: &PersistentVolumeClaim) {
    let ns = prime.namespace().unwrap_or_default();
    let api: Api<Event> = Api::namespaced(ctx.client.clone(), &ns);
    let list = |name: String| {
        let api = api.clone();
        async move {
            api.list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
                .await
                .map(|l| l.items)
        }
    };
    let (Ok(from), Ok(already)) = (list(prime.name_any()).await, list(target.name_any()).await)
    else {
        return;
    };
    for e in from {
        let (Some(reason), Some(message)) = (e.reason, e.message) else {
            continue;
        };
        let text = format!("[{}] : {message}", prime.name_any());
        let copied = already.iter().any(|t| {
            t.involved_object.uid == target.metadata.uid
                && t.reason.as_deref() == Some(reason.as_str())
                // As recorded: cut to what events.k8s.io keeps.
                && t.message.as_deref() == Some(crate::events::truncate(&text))
        });
        if !copied {
            let warning = e.type_.as_deref() == Some("Warning");
            ctx.events.record(target, warning, &reason, &text).await;
        }
    }
}

/// One pass over a target claim: PVC prime, the mirrored state, the rebind.
pub async fn reconcile(
    target: Arc<PersistentVolumeClaim>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let Some(source_name) = populator::import_source_name(&target).map(str::to_string) else {
        return Ok(Action::await_change());
    };
    if target.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = target.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let prime_name = populator::prime_name(&target);
    let resync = ctx.options.resync;
    // What PVC prime waits for (provisioning, a consumer) is said in its events, which wake
    // nothing here: they are copied on a slower timer than progress.
    let slow = resync * 5;
    let Some(prime) = claims.get_opt(&prime_name).await? else {
        let sources: Api<VolumeImportSource> = Api::namespaced(ctx.client.clone(), &ns);
        let Some(source) = sources.get_opt(&source_name).await? else {
            return Ok(Action::requeue(slow));
        };
        ctx.caches.ready().await;
        let class = target
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref())
            .filter(|n| !n.is_empty())
            .and_then(|n| ctx.caches.classes.get(&ObjectRef::new(n)));
        let node = match populator::readiness(&target, class.as_deref()) {
            // The selected node's annotation changes the target, which wakes this pass.
            Readiness::Wait => return Ok(Action::requeue(slow)),
            Readiness::Refused(message) => {
                ctx.events
                    .record(target.as_ref(), true, "ErrClaimNotValid", &message)
                    .await;
                return Ok(Action::await_change());
            }
            Readiness::Ready { node } => node,
        };
        // Before PVC prime copies it, while the consumer is still there.
        if crate::placement::record(&ctx, &target).await? {
            return Ok(Action::await_change());
        }
        let phase = target.status.as_ref().and_then(|s| s.phase.as_deref());
        let unbound = target
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_none_or(str::is_empty);
        if unbound
            && phase != Some("Lost")
            && crate::still_current(&ctx.client, target.as_ref()).await?
        {
            let preallocation = ctx
                .caches
                .config()
                .and_then(|c| c.status?.preallocation)
                .unwrap_or(false);
            let prime = populator::prime_claim(&target, &source, node.as_deref(), preallocation);
            match claims.create(&PostParams::default(), &prime).await {
                Ok(_) => {
                    tracing::info!(target = %format!("{ns}/{}", target.name_any()), prime = %prime_name, "created PVC prime");
                    ctx.events
                        .record(
                            target.as_ref(),
                            false,
                            "CreatedPVCPrimeSuccessfully",
                            "PVC Prime created successfully",
                        )
                        .await;
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        return Ok(Action::requeue(resync));
    };

    // Progress from the import pod of PVC prime, which reports under the target's UID.
    let mut progress = None;
    if let Some(pod_name) = prime.annotations().get(cdi_api::ann::IMPORT_POD_NAME) {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        if let Some(pod) = pods.get_opt(pod_name).await?
            && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        {
            let uid = target.metadata.uid.clone().unwrap_or_default();
            progress = crate::progress::import_progress(&ctx.http, &pod, &uid).await;
        }
    }
    let wanted = populator::mirrored(&target, &prime, progress.as_deref());
    let patch = cdi_core::import::annotation_patch(target.annotations(), &wanted, true);
    if !patch.is_empty() {
        claims
            .patch(
                &target.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"annotations": patch}})),
            )
            .await?;
    }
    copy_events(&ctx, &prime, &target).await;

    if populator::should_rebind(&target, &prime) {
        let volume = prime
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        let claim_ref = json!({"spec": {"claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "namespace": ns, "name": target.name_any(), "uid": target.metadata.uid,
            "resourceVersion": null}}});
        Api::<PersistentVolume>::all(ctx.client.clone())
            .patch(&volume, &PatchParams::default(), &Patch::Merge(&claim_ref))
            .await?;
        tracing::info!(target = %format!("{ns}/{}", target.name_any()), volume = %volume, "rebound the volume to the target");
        ctx.events
            .record(
                target.as_ref(),
                false,
                "ImportSucceeded",
                &format!("Import into {} succeeded", target.name_any()),
            )
            .await;
    }
    let target_bound = target.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if target_bound && populator::delete_prime(&prime) {
        match claims.delete(&prime_name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(prime = %prime_name, "deleted PVC prime"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(Action::await_change());
    }
    let prime_bound = prime.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    Ok(if progress.is_some() {
        Action::requeue(resync)
    } else if !prime_bound {
        Action::requeue(slow)
    } else {
        // The worker's end reaches PVC prime's annotations, whose change wakes the target.
        Action::await_change()
    })
}

fn error_policy(target: Arc<PersistentVolumeClaim>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(claim = %target.name_any(), error = %error, "populator reconcile failed");
    Action::requeue(ctx.options.resync)
}

/// Run the populator over claims; PVC prime's changes reach its target through the owner link.
pub async fn run(ctx: Context) -> anyhow::Result<()> {
    let client = ctx.client.clone();
    Controller::new(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .run(
        |o, c| {
            let metrics = c.metrics.clone();
            let object = format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any());
            async move { crate::guarded(&metrics, "populator", &object, reconcile(o, c)).await }
        },
        error_policy,
        Arc::new(ctx),
    )
    .for_each(|r| async move {
        if let Err(e) = r {
            tracing::debug!(error = %e, "populator");
        }
    })
    .await;
    Ok(())
}
