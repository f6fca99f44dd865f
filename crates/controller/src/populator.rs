//! The import and upload populators: claims whose `dataSourceRef` is a VolumeImportSource or a
//! VolumeUploadSource get a PVC prime (cdi-core `populator`), which the import or upload
//! controller fills like any claim of theirs; the target mirrors PVC prime's progress and
//! conditions, and takes over its volume once the work succeeded (the PV's `claimRef` switched,
//! no data copied). The target is never bound to a half-written volume.

use crate::runtime::run::RunAs;
use std::sync::Arc;

use cdi_api::populators::{VolumeImportSource, VolumeUploadSource};
use cdi_core::populator::{self, Readiness, Source, SourceKind};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::cache::Changes;
use crate::runtime::context::Context;
use crate::runtime::error::Error;

/// Re-emit PVC prime's events on the target, prefixed `[prime-…] : ` as upstream does; each
/// once (compared with the target's events in the cache; one copied while the cache has not
/// caught up is counted again by the recorder, not lost).
pub(crate) async fn copy_events(
    ctx: &Context,
    prime: &PersistentVolumeClaim,
    target: &PersistentVolumeClaim,
) {
    let ns = prime.namespace().unwrap_or_default();
    let from = ctx.caches.claim_events(&ns, &prime.name_any());
    if from.is_empty() {
        return;
    }
    let already = ctx.caches.claim_events(&ns, &target.name_any());
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
    let Some((kind, source_name)) = populator::source_of(&target).map(|(k, n)| (k, n.to_string()))
    else {
        return Ok(Action::await_change());
    };
    if target.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = target.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let prime_name = populator::prime_name(&target);
    ctx.caches.ready().await;
    // The store's copy: PVC prime's changes wake its target after the store holds them.
    match ctx.caches.claim(&ns, &prime_name) {
        None => make_prime(&ctx, &target, &claims, kind, &source_name, &prime_name).await,
        Some(prime) => follow_prime(&ctx, &target, &claims, kind, &prime, &prime_name).await,
    }
}

/// No PVC prime yet: unless the target is bound or lost, read its source and, once the
/// target may be populated, create PVC prime.
async fn make_prime(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    claims: &Api<PersistentVolumeClaim>,
    kind: SourceKind,
    source_name: &str,
    prime_name: &str,
) -> Result<Action, Error> {
    let ns = target.namespace().unwrap_or_default();
    // An import source created after its claim wakes nothing here: looked for again slowly.
    let slow = ctx.options.resync * 5;
    // Bound (populated, or by someone else) or lost: there is nothing to make.
    let phase = target.status.as_ref().and_then(|s| s.phase.as_deref());
    let unbound = target
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_none_or(str::is_empty);
    if !unbound || phase == Some("Lost") {
        return Ok(Action::await_change());
    }
    let (import, upload) = match kind {
        SourceKind::Import => (
            Api::<VolumeImportSource>::namespaced(ctx.client.clone(), &ns)
                .get_opt(source_name)
                .await?,
            None,
        ),
        SourceKind::Upload => (
            None,
            Api::<VolumeUploadSource>::namespaced(ctx.client.clone(), &ns)
                .get_opt(source_name)
                .await?,
        ),
    };
    let source = match (&import, &upload) {
        (Some(i), _) => Source::Import(i),
        (_, Some(u)) => Source::Upload(u),
        _ => return Ok(Action::requeue(slow)),
    };
    let class = target
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .filter(|n| !n.is_empty())
        .and_then(|n| ctx.caches.classes.get(&ObjectRef::new(n)));
    let node = match populator::readiness(target, class.as_deref()) {
        // The selected node's annotation changes the target, which wakes this pass.
        Readiness::Wait => return Ok(Action::await_change()),
        Readiness::Refused(message) => {
            ctx.events
                .record(target, true, "ErrClaimNotValid", &message)
                .await;
            return Ok(Action::await_change());
        }
        Readiness::Ready { node } => node,
    };
    // Before PVC prime copies it, while the consumer is still there.
    if crate::placement::record(ctx, target).await? {
        return Ok(Action::await_change());
    }
    create_prime(ctx, target, claims, source, node.as_deref(), prime_name).await?;
    // PVC prime's creation wakes its target.
    Ok(Action::await_change())
}

/// Create PVC prime for a target that still exists (one created already is fine), and say so.
async fn create_prime(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    claims: &Api<PersistentVolumeClaim>,
    source: Source<'_>,
    node: Option<&str>,
    prime_name: &str,
) -> Result<(), Error> {
    if crate::objects::live(&ctx.client, target).await?.is_none() {
        return Ok(());
    }
    let ns = target.namespace().unwrap_or_default();
    let preallocation = ctx
        .caches
        .config()
        .and_then(|c| c.status?.preallocation)
        .unwrap_or(false);
    let prime = populator::prime_claim(target, source, node, preallocation);
    match claims.create(&PostParams::default(), &prime).await {
        Ok(_) => {
            tracing::info!(target = %format!("{ns}/{}", target.name_any()), prime = %prime_name, "created PVC prime");
            ctx.events
                .record(
                    target,
                    false,
                    "CreatedPVCPrimeSuccessfully",
                    "PVC Prime created successfully",
                )
                .await;
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// PVC prime there: mirror its state on the target, hand its volume over once it is done,
/// and delete it once the target is bound.
async fn follow_prime(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    claims: &Api<PersistentVolumeClaim>,
    kind: SourceKind,
    prime: &PersistentVolumeClaim,
    prime_name: &str,
) -> Result<Action, Error> {
    let progress = mirror(ctx, target, claims, prime).await?;
    if populator::should_rebind(target, prime) {
        rebind(ctx, target, kind, prime).await?;
    }
    let target_bound = target.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if target_bound && populator::delete_prime(prime) {
        match claims.delete(prime_name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(prime = %prime_name, "deleted PVC prime"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(Action::await_change());
    }
    // Progress is read on a timer; everything else (PVC prime's binding, its events, the
    // worker's end on its annotations) wakes the target.
    Ok(if progress.is_some() {
        Action::requeue(ctx.options.resync)
    } else {
        Action::await_change()
    })
}

/// Mirror PVC prime's progress, annotations, labels and events on the target; the progress
/// read, if any.
async fn mirror(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    claims: &Api<PersistentVolumeClaim>,
    prime: &PersistentVolumeClaim,
) -> Result<Option<String>, Error> {
    let ns = target.namespace().unwrap_or_default();
    // Progress from the import pod of PVC prime, which reports under the target's UID.
    let mut progress = None;
    if let Some(pod_name) = prime.annotations().get(cdi_api::ann::IMPORT_POD_NAME)
        && let Some(pod) = ctx.caches.pod(&ns, pod_name)
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    {
        let uid = target.metadata.uid.clone().unwrap_or_default();
        progress = crate::progress::import_progress(&ctx.http, &pod, &uid).await;
    }
    let wanted = populator::mirrored(target, prime, progress.as_deref());
    let patch = cdi_core::import::annotation_patch(target.annotations(), &wanted, true);
    let labels = populator::mirrored_labels(target, prime);
    if !patch.is_empty() || !labels.is_empty() {
        claims
            .patch(
                &target.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"annotations": patch, "labels": labels}})),
            )
            .await?;
    }
    copy_events(ctx, prime, target).await;
    Ok(progress)
}

/// Hand PVC prime's volume over to the target and say the import or upload succeeded.
async fn rebind(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    kind: SourceKind,
    prime: &PersistentVolumeClaim,
) -> Result<(), Error> {
    let volume = prime
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    crate::objects::hand_over(&ctx.client, &volume, target).await?;
    let (reason, message) = match kind {
        SourceKind::Import => (
            "ImportSucceeded",
            format!("Import into {} succeeded", target.name_any()),
        ),
        SourceKind::Upload => (
            "UploadSucceeded",
            format!("Successfully uploaded into {}", target.name_any()),
        ),
    };
    ctx.events.record(target, false, reason, &message).await;
    Ok(())
}

/// The cache subscriptions the populator is woken by.
pub struct Triggers {
    targets: Changes<PersistentVolumeClaim>,
    primes: Changes<PersistentVolumeClaim>,
    events: Changes<Event>,
}

impl Triggers {
    pub fn subscribe(feeds: &mut crate::cache::Feeds) -> Triggers {
        Triggers {
            targets: feeds.claims.subscribe(),
            primes: feeds.claims.subscribe(),
            events: feeds.events.subscribe(),
        }
    }
}

/// Run the populator over claims; PVC prime's changes reach its target through the owner link.
pub async fn run(ctx: Context, triggers: Triggers) -> anyhow::Result<()> {
    // The runner waits for the store's first list itself, which only one waiter may do.
    ctx.caches.ready().await;
    let claims = ctx.caches.claims.clone();
    Controller::for_shared_stream(triggers.targets, ctx.caches.claims.clone())
        .owns_shared_stream(triggers.primes)
        // PVC prime's events (what its binding waits for) are copied to its target.
        .watches_shared_stream(triggers.events, move |e: Arc<Event>| {
            let o = &e.involved_object;
            let prime =
                claims.get(&ObjectRef::new(o.name.as_deref()?).within(o.namespace.as_deref()?))?;
            let owner = prime
                .owner_references()
                .iter()
                .find(|r| r.controller == Some(true) && r.kind == "PersistentVolumeClaim")?;
            Some(ObjectRef::new(&owner.name).within(o.namespace.as_deref()?))
        })
        .run_as("populator", ctx.metrics.clone(), Arc::new(ctx), reconcile)
        .await;
    Ok(())
}
