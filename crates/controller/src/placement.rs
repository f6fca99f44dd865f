//! Worker pods follow the first consumer (docs/design.md#worker-pods-follow-the-first-consumer): once a claim's node is selected, what its
//! worker pods inherit from the consumer it was selected for is recorded on the claim (cdi-core
//! `placement`), before that consumer can go. Every controller that makes worker pods for a
//! claim records through here first.

use cdi_api::ext;
use cdi_core::import::Next;
use cdi_core::placement;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::runtime::context::Context;
use crate::runtime::error::Error;

/// The claim to make a worker pod for now, if one is due. `next` (the source kind's decision,
/// with the WaitForFirstConsumer gate `gate_on`) must want a pod for the claim as cached; the
/// inheritance from the claim's consumer is recorded first; and the claim as the API server
/// holds it now must still want the same. A claim and its pod come from two watches: a
/// finished import's claim can lag behind its pod's deletion, so the live claim decides (its
/// change wakes the controller again).
pub async fn due_claim(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    gate_on: bool,
    next: fn(&PersistentVolumeClaim, bool) -> Next,
) -> Result<Option<PersistentVolumeClaim>, Error> {
    let wanted = next(claim, gate_on);
    if wanted == Next::Nothing {
        return Ok(None);
    }
    // While the consumer the node was selected for is still there.
    if record(ctx, claim).await? || wanted == Next::WaitForConsumer {
        return Ok(None);
    }
    let Some(live) = crate::objects::live(&ctx.client, claim).await? else {
        return Ok(None);
    };
    Ok((next(&live, gate_on) == wanted).then_some(live))
}

/// The event on the claim saying what its worker pods inherit.
pub const INHERITED: &str = "WorkerTolerationsInherited";
/// The event on the claim when its record is unreadable.
pub const ERR_RECORD: &str = "ErrWorkerTolerations";

/// Record the inheritance on `claim` when it is due. `true` when the claim seen is not the one
/// to go on with: the record was written now (a change to the claim, which reconciles it again
/// with the record in), or already was (the claim seen is older than the API server's).
pub async fn record(ctx: &Context, seen: &PersistentVolumeClaim) -> Result<bool, kube::Error> {
    let config = ctx.caches.config();
    if placement::to_record(seen, config.as_ref()).is_none() {
        return Ok(false);
    }
    // Decided once: a cached claim may predate the record, and a second record made after the
    // consumer went would replace the first with nothing.
    let ns = seen.namespace().unwrap_or_default();
    let claims = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns);
    let Some(claim) = claims.get_opt(&seen.name_any()).await? else {
        return Ok(true);
    };
    let Some(node_name) = placement::to_record(&claim, config.as_ref()) else {
        return Ok(true);
    };
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items;
    let consumer = placement::consumer_of(&claim, &node_name, &pods);
    let node = Api::<Node>::all(ctx.client.clone())
        .get_opt(&node_name)
        .await?;
    let inherited = placement::record(&node_name, consumer, node.as_ref());
    let patch = json!({"metadata": {"annotations": {
        (ext::WORKER_TOLERATIONS): inherited.to_annotation()}}});
    claims
        .patch(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    let line = inherited.describe();
    tracing::info!(claim = %format!("{ns}/{}", claim.name_any()), "worker pods inherit {line}");
    if !inherited.tolerations.is_empty() {
        ctx.events
            .record(
                &claim,
                false,
                INHERITED,
                &format!("Worker pods inherit {line}"),
            )
            .await;
    }
    Ok(true)
}

/// Say on the claim when its record cannot be read (its worker pods then inherit nothing).
pub async fn check(ctx: &Context, claim: &PersistentVolumeClaim) {
    if let Err(message) = placement::for_worker(claim, ctx.caches.config().as_ref()) {
        ctx.events.record(claim, true, ERR_RECORD, &message).await;
    }
}
