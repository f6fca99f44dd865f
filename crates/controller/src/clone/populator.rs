//! The clone populator: claims whose `dataSourceRef` is a VolumeCloneSource. The strategy is
//! chosen once (cdi-core `clone::choose_strategy`, recorded as `cdi.kubevirt.io/cloneType` with
//! any fallback's reason), then the strategy's phases run, each written as
//! `cdi.kubevirt.io/clonePhase` (cdi-core `clonepop`). Every strategy fills a temporary claim
//! `tmp-pvc-<target uid>` in the source's namespace and then hands its volume to the target
//! (Rebind): `copy` asks the upload and clone controllers for a host-assisted copy into it,
//! `csi-clone` has the CSI driver clone the source into it, `snapshot` takes a VolumeSnapshot of
//! the source and has the driver restore it. A temporary claim of a WaitForFirstConsumer class
//! with no node yet is bound by a prep pod (PrepClaim). A VolumeSnapshot source is restored into
//! it by the driver, or, when the target's class cannot restore it, restored by its own driver
//! into `tmp-source-pvc-<uid>` and copied from there.

use crate::runtime::run::RunAs;
use std::collections::BTreeMap;
use std::sync::Arc;

use cdi_api::enums::CloneStrategy;
use cdi_api::populators::VolumeCloneSource;
use cdi_api::{ann, finalizer};
use cdi_core::clone::{CloneClaim, CloneEnvironment, CloneError, choose_strategy};
use cdi_core::clonepop::{self, phase};
use cdi_core::populator::{self, Readiness};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::api::{DynamicObject, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use crate::cache::Changes;
use crate::clone::token::ClaimGrant;
use crate::runtime::context::Context;
use crate::runtime::error::Error;
use cdi_pki::token::Resource;

/// Write `wanted` over the target's annotations (only what changed).
async fn annotate(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    wanted: &BTreeMap<String, String>,
) -> Result<(), Error> {
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &target.namespace().unwrap_or_default());
    crate::objects::patch_claim(&claims, target, wanted, &BTreeMap::new()).await?;
    Ok(())
}

/// Stop the clone in phase Error, saying why on the target (and as a Warning event).
async fn fail(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    reason: &str,
    message: &str,
) -> Result<Action, Error> {
    let mut wanted = target.annotations().clone();
    let already = wanted.get(ann::CLONE_ERROR).map(String::as_str) == Some(message);
    wanted.insert(ann::CLONE_PHASE.into(), phase::ERROR.into());
    wanted.insert(ann::CLONE_ERROR.into(), message.into());
    annotate(ctx, target, &wanted).await?;
    if !already {
        ctx.events.record(target, true, reason, message).await;
    }
    Ok(Action::await_change())
}

fn class_provisioner(ctx: &Context, claim: &PersistentVolumeClaim) -> Option<String> {
    let name = claim.spec.as_ref()?.storage_class_name.as_deref()?;
    ctx.caches
        .classes
        .get(&ObjectRef::new(name))
        .map(|c| c.provisioner.clone())
}

fn clone_claim(ctx: &Context, claim: &PersistentVolumeClaim) -> CloneClaim {
    let spec = claim.spec.as_ref();
    let bytes = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.and_then(|q| cdi_core::Quantity::try_from(q).ok())
            .map(|q| q.value())
    };
    let volume_mode =
        cdi_core::size::resolve_volume_mode(spec.and_then(|s| s.volume_mode.as_deref()));
    let class = spec.and_then(|s| s.storage_class_name.as_deref());
    let overhead =
        cdi_core::render::filesystem_overhead(ctx.caches.config().as_ref(), class, volume_mode);
    let request = bytes(spec.and_then(|s| s.resources.as_ref()?.requests.as_ref()?.get("storage")))
        .unwrap_or(0);
    CloneClaim {
        namespace: claim.namespace().unwrap_or_default(),
        name: claim.name_any(),
        driver: class_provisioner(ctx, claim),
        volume_mode,
        request,
        usable: cdi_core::size::image_space(volume_mode, request, overhead),
        capacity: bytes(
            claim
                .status
                .as_ref()
                .and_then(|s| s.capacity.as_ref()?.get("storage")),
        ),
    }
}

/// Choose the strategy once and record it on the target (with its fallback's reason, and the
/// finalizer that keeps the target until the temporary objects are gone).
async fn choose(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    source_ns: &str,
    source_name: &str,
) -> Result<Action, Error> {
    let source = ctx.caches.claim(source_ns, source_name);
    let class_name = target
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone());
    let class = class_name
        .as_deref()
        .and_then(|n| ctx.caches.classes.get(&ObjectRef::new(n)));
    let profile = class_name.as_deref().and_then(|n| {
        ctx.caches
            .profiles()
            .into_iter()
            .find(|p| p.name_any() == n)
    });
    let snapshot_classes = crate::storageprofile::snapshot_classes(ctx).await;
    let env = CloneEnvironment {
        target_class: class_name.as_deref(),
        target_class_exists: class.is_some(),
        allow_volume_expansion: class
            .as_ref()
            .and_then(|c| c.allow_volume_expansion)
            .unwrap_or(false),
        strategy_override: ctx
            .caches
            .cdis()
            .into_iter()
            .find_map(|c| c.spec.clone_strategy_override),
        profile_strategy: profile
            .as_ref()
            .and_then(|p| p.status.as_ref()?.clone_strategy),
        profile_snapshot_class: profile
            .as_ref()
            .and_then(|p| p.status.as_ref()?.snapshot_class.as_deref()),
        snapshot_classes: &snapshot_classes,
        permissive: target.annotations().contains_key(ann::PERMISSIVE_CLONE),
    };
    let source_claim = source.as_deref().map(|s| clone_claim(ctx, s));
    let plan = match choose_strategy(
        &format!("{source_ns}/{source_name}"),
        source_claim.as_ref(),
        &clone_claim(ctx, target),
        &env,
    ) {
        Ok(plan) => plan,
        Err(CloneError::SourceMissing { .. }) => {
            let message = format!("The source pvc {source_ns}/{source_name} doesn't exist");
            ctx.events
                .record(target, true, "CloneWithoutSource", &message)
                .await;
            // A claim made in another namespace wakes nothing here.
            return Ok(Action::requeue(ctx.options.resync * 5));
        }
        Err(e @ CloneError::TargetTooSmall { .. }) => {
            ctx.events
                .record(target, true, "ErrIncompatiblePVC", &e.to_string())
                .await;
            // The detail goes into cloneError too: the DataVolume's Running condition shows it.
            let message = format!("{}: {e}", cdi_core::hostclone::VALIDATION_FAILED);
            return fail(ctx, target, "CloneValidationFailed", &message).await;
        }
        Err(e) => {
            ctx.events
                .record(target, true, "CloneNotReady", &e.to_string())
                .await;
            return Ok(Action::requeue(ctx.options.resync * 5));
        }
    };
    record(ctx, target, &plan).await
}

/// Record the chosen strategy on the target (its fallback's reason too, also as a warning
/// event) and hold it.
async fn record(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    plan: &cdi_core::clone::ClonePlan,
) -> Result<Action, Error> {
    let mut wanted = target.annotations().clone();
    wanted.insert(ann::CLONE_TYPE.into(), plan.strategy.as_str().into());
    if let Some(class) = &plan.snapshot_class {
        wanted.insert(cdi_api::ext::CLONE_SNAPSHOT_CLASS.into(), class.clone());
    }
    wanted
        .entry(ann::CLONE_PHASE.into())
        .or_insert_with(|| phase::PENDING.into());
    if let Some(reason) = plan.fallback {
        wanted
            .entry(ann::CLONE_FALLBACK_REASON.into())
            .or_insert_with(|| reason.message().into());
        ctx.events
            .record(target, true, reason.reason(), reason.message())
            .await;
    }
    hold(ctx, target, &wanted).await
}

/// Record the chosen strategy (`wanted`: the target's annotations with it) and hold the target
/// with the clone populator's finalizer.
async fn hold(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    wanted: &BTreeMap<String, String>,
) -> Result<Action, Error> {
    annotate(ctx, target, wanted).await?;
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &target.namespace().unwrap_or_default());
    let fresh = claims.get(&target.name_any()).await?;
    crate::objects::set_finalizer(&claims, &fresh, finalizer::CLONE_POPULATOR, true).await?;
    Ok(Action::await_change())
}

/// The temporary claim goes once the clone is over (kept, Lost, for debugging when the target
/// asks to retain its worker), then the finalizer.
async fn finish(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    source_ns: &str,
) -> Result<Action, Error> {
    let tmp_name = clonepop::tmp_claim_name(target);
    let retain = target
        .annotations()
        .get(ann::POD_RETAIN_AFTER_COMPLETION)
        .is_some_and(|v| v == "true");
    if !retain {
        crate::objects::delete(
            &Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), source_ns),
            &tmp_name,
        )
        .await?;
    }
    // A snapshot restored for a copy holds nothing worth keeping.
    crate::objects::delete(
        &Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), source_ns),
        &clonepop::tmp_source_claim_name(target),
    )
    .await?;
    crate::objects::delete(
        &Api::<Pod>::namespaced(ctx.client.clone(), source_ns),
        &clonepop::prep_pod_name(target),
    )
    .await?;
    let snapshots: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        source_ns,
        &crate::objects::snapshot_api("VolumeSnapshot", "volumesnapshots"),
    );
    match snapshots
        .delete(&clonepop::tmp_snapshot_name(target), &Default::default())
        .await
    {
        Ok(_) => {}
        // None made, or no snapshot API at all.
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &target.namespace().unwrap_or_default());
    crate::objects::set_finalizer(&claims, target, finalizer::CLONE_POPULATOR, false).await?;
    Ok(Action::await_change())
}

/// One pass over a clone target.
pub async fn reconcile(
    target: Arc<PersistentVolumeClaim>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let Some(vcs_name) = clonepop::clone_source_name(&target).map(str::to_string) else {
        return Ok(Action::await_change());
    };
    let ns = target.namespace().unwrap_or_default();
    let source_ns = clonepop::source_namespace(&target);
    ctx.caches.ready().await;
    let anns = target.annotations().clone();
    let clone_phase = anns.get(ann::CLONE_PHASE).cloned().unwrap_or_default();
    let holds = target
        .finalizers()
        .iter()
        .any(|f| f == finalizer::CLONE_POPULATOR);
    if target.metadata.deletion_timestamp.is_some() || clone_phase == phase::SUCCEEDED {
        return if holds {
            finish(&ctx, &target, &source_ns).await
        } else {
            Ok(Action::await_change())
        };
    }
    let bound = target
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty());
    if bound {
        // Handed over (or bound by someone else): the clone is over.
        annotate(&ctx, &target, &clonepop::succeeded(&target)).await?;
        return Ok(Action::await_change());
    }
    let class = target
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .filter(|n| !n.is_empty())
        .and_then(|n| ctx.caches.classes.get(&ObjectRef::new(n)));
    let node = match populator::readiness(&target, class.as_deref()) {
        Readiness::Wait => return Ok(Action::await_change()),
        Readiness::Refused(message) => {
            return fail(&ctx, &target, "ErrClaimNotValid", &message).await;
        }
        Readiness::Ready { node } => node,
    };
    let Some(vcs) = Api::<VolumeCloneSource>::namespaced(ctx.client.clone(), &source_ns)
        .get_opt(&vcs_name)
        .await?
    else {
        // Created with or after its claim: looked for again slowly.
        return Ok(Action::requeue(ctx.options.resync * 5));
    };
    let from_snapshot = vcs.spec.source.kind == "VolumeSnapshot";
    if vcs.spec.source.kind != "PersistentVolumeClaim" && !from_snapshot {
        return fail(
            &ctx,
            &target,
            "CloneSourceNotSupported",
            &format!(
                "VolumeCloneSource {source_ns}/{vcs_name}: a {} source is not cloned by this version of cdi-rs; clone a PersistentVolumeClaim or a VolumeSnapshot",
                vcs.spec.source.kind
            ),
        )
        .await;
    }
    // Nothing of the source is looked at before the claim is shown to be allowed to copy it.
    let source = (source_ns.clone(), vcs.spec.source.name.clone());
    let tokens = crate::clone::token::tokens(&ctx).await?;
    let resource = if from_snapshot {
        Resource::snapshots()
    } else {
        Resource::claims()
    };
    match crate::clone::token::check_claim(tokens, &target, &source, resource) {
        ClaimGrant::Allowed => {}
        ClaimGrant::Wait => return Ok(Action::await_change()),
        ClaimGrant::Refused(message) => {
            return fail(&ctx, &target, crate::clone::token::NOT_AUTHORIZED, &message).await;
        }
    }
    let strategy = anns
        .get(ann::CLONE_TYPE)
        .and_then(|s| s.parse::<CloneStrategy>().ok());
    if from_snapshot {
        return restore_snapshot(&ctx, &target, &vcs, holds, node.as_deref()).await;
    }
    let Some(strategy) = strategy else {
        return choose(&ctx, &target, &source_ns, &vcs.spec.source.name).await;
    };
    if !holds {
        // Chosen before (by an earlier pass, or given): kept, and the finalizer added.
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
        crate::objects::set_finalizer(&claims, &target, finalizer::CLONE_POPULATOR, true).await?;
        return Ok(Action::await_change());
    }
    match strategy {
        CloneStrategy::Copy => host_clone(&ctx, &target, &vcs, node.as_deref()).await,
        CloneStrategy::CsiClone => csi_clone(&ctx, &target, &vcs, node.as_deref()).await,
        CloneStrategy::Snapshot => snapshot_clone(&ctx, &target, &vcs, node.as_deref()).await,
    }
}

/// Write the phase onto the target.
async fn set_phase(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    phase: &str,
) -> Result<(), Error> {
    let mut wanted = target.annotations().clone();
    wanted.insert(ann::CLONE_PHASE.into(), phase.into());
    annotate(ctx, target, &wanted).await
}

/// Create the temporary claim (once), filled as `fill` says.
async fn create_tmp(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    vcs: &VolumeCloneSource,
    node: Option<&str>,
    fill: clonepop::Fill<'_>,
    source_bytes: i64,
) -> Result<(), Error> {
    if crate::objects::live(&ctx.client, target).await?.is_none() {
        return Ok(());
    }
    let preallocation = ctx
        .caches
        .config()
        .and_then(|c| c.status?.preallocation)
        .unwrap_or(false);
    let mut claim = clonepop::tmp_claim(target, vcs, node, preallocation, fill);
    clonepop::at_least(&mut claim, source_bytes);
    let source_ns = vcs.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &source_ns);
    match claims.create(&PostParams::default(), &claim).await {
        Ok(_) => tracing::info!(claim = %format!("{source_ns}/{}", claim.name_any()), fill = ?fill,
            "created the clone's temporary claim"),
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// A temporary claim the driver fills: bound (by a prep pod when its class waits for a first
/// consumer and no node was chosen), then handed over.
async fn prep_and_rebind(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    tmp: &PersistentVolumeClaim,
) -> Result<Action, Error> {
    crate::populator::copy_events(ctx, tmp, target).await;
    let source_ns = tmp.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &source_ns);
    let prep_name = clonepop::prep_pod_name(target);
    let bound = tmp.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if !bound {
        let class_wffc = tmp
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref())
            .and_then(|n| ctx.caches.classes.get(&ObjectRef::new(n)))
            .and_then(|c| c.volume_binding_mode.clone())
            .as_deref()
            == Some("WaitForFirstConsumer");
        let unplaced = !tmp.annotations().contains_key(ann::SELECTED_NODE);
        if class_wffc && unplaced && ctx.caches.pod(&source_ns, &prep_name).is_none() {
            let pod = clonepop::prep_pod(target, tmp, &ctx.options.cloner_image);
            crate::objects::create(&pods, &pod).await?;
            tracing::info!(pod = %format!("{source_ns}/{prep_name}"), "created the prep pod");
            set_phase(ctx, target, phase::PREP_CLAIM).await?;
        }
        // The temporary claim's binding wakes the target.
        return Ok(Action::await_change());
    }
    if ctx.caches.pod(&source_ns, &prep_name).is_some() {
        crate::objects::delete(&pods, &prep_name).await?;
    }
    rebind(ctx, target, tmp).await
}

/// Hand the temporary claim's volume to the target (Rebind).
async fn rebind(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    tmp: &PersistentVolumeClaim,
) -> Result<Action, Error> {
    set_phase(ctx, target, phase::REBIND).await?;
    let Some(volume) = tmp.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
        return Ok(Action::await_change());
    };
    crate::objects::hand_over(&ctx.client, &volume, target).await?;
    // The target's binding wakes the next pass.
    Ok(Action::await_change())
}

/// Why the source cannot be given to its driver now (not bound, or a pod writes it): an event
/// for the latter, and when to look again.
async fn source_unready(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    vcs: &VolumeCloneSource,
) -> Result<Option<Action>, Error> {
    let source_ns = vcs.namespace().unwrap_or_default();
    let later = Action::requeue(ctx.options.resync * 2);
    let Some(source) = ctx.caches.claim(&source_ns, &vcs.spec.source.name) else {
        return Ok(Some(later));
    };
    // Bound is not filled: a DataVolume's claim is populated once the DataVolume succeeded.
    if !crate::clone::source::populated(ctx, &source).await? {
        return Ok(Some(later));
    }
    if let Some(message) = crate::clone::source::source_in_use(ctx, &source) {
        ctx.events
            .record(
                target,
                true,
                cdi_core::hostclone::CLONE_SOURCE_IN_USE,
                &message,
            )
            .await;
        return Ok(Some(later));
    }
    Ok(None)
}

/// `csi-clone`: the driver clones the source (bound, not written by a pod) into the temporary
/// claim.
async fn csi_clone(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    vcs: &VolumeCloneSource,
    node: Option<&str>,
) -> Result<Action, Error> {
    let source_ns = vcs.namespace().unwrap_or_default();
    if let Some(tmp) = ctx
        .caches
        .claim(&source_ns, &clonepop::tmp_claim_name(target))
    {
        return prep_and_rebind(ctx, target, &tmp).await;
    }
    if let Some(wait) = source_unready(ctx, target, vcs).await? {
        return Ok(wait);
    }
    // As large as the source's volume, at least.
    let capacity = ctx
        .caches
        .claim(&source_ns, &vcs.spec.source.name)
        .map(|c| clone_claim(ctx, &c))
        .and_then(|c| c.capacity)
        .unwrap_or(0);
    create_tmp(ctx, target, vcs, node, clonepop::Fill::CsiClone, capacity).await?;
    set_phase(ctx, target, phase::CSI_CLONE).await?;
    Ok(Action::await_change())
}

/// `snapshot`: a VolumeSnapshot of the source, restored by the driver into the temporary claim.
async fn snapshot_clone(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    vcs: &VolumeCloneSource,
    node: Option<&str>,
) -> Result<Action, Error> {
    let source_ns = vcs.namespace().unwrap_or_default();
    if let Some(tmp) = ctx
        .caches
        .claim(&source_ns, &clonepop::tmp_claim_name(target))
    {
        return prep_and_rebind(ctx, target, &tmp).await;
    }
    let snapshots: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &source_ns,
        &crate::objects::snapshot_api("VolumeSnapshot", "volumesnapshots"),
    );
    let name = clonepop::tmp_snapshot_name(target);
    // Snapshots are not in the caches: their readiness is looked at on a timer.
    let later = Action::requeue(ctx.options.resync);
    let Some(snapshot) = snapshots.get_opt(&name).await? else {
        if let Some(wait) = source_unready(ctx, target, vcs).await? {
            return Ok(wait);
        }
        let class = target
            .annotations()
            .get(cdi_api::ext::CLONE_SNAPSHOT_CLASS)
            .cloned();
        let object: DynamicObject = serde_json::from_value(clonepop::tmp_snapshot(
            target,
            &source_ns,
            &vcs.spec.source.name,
            class.as_deref(),
        ))
        .map_err(|e| Error::Other(e.to_string()))?;
        crate::objects::create(&snapshots, &object).await?;
        tracing::info!(snapshot = %format!("{source_ns}/{name}"), "created the clone's snapshot");
        set_phase(ctx, target, phase::SNAPSHOT).await?;
        return Ok(later);
    };
    if let Some(message) = snapshot.data["status"]["error"]["message"].as_str() {
        ctx.events
            .record(target, true, "SnapshotFailed", message)
            .await;
    }
    if snapshot.data["status"]["readyToUse"] != true {
        return Ok(later);
    }
    let restores = clonepop::restore_size(&snapshot.data).unwrap_or(0);
    create_tmp(
        ctx,
        target,
        vcs,
        node,
        clonepop::Fill::Restore(&name),
        restores,
    )
    .await?;
    set_phase(ctx, target, phase::SNAPSHOT_CLONE).await?;
    Ok(Action::await_change())
}

/// A clone of a VolumeSnapshot (upstream's snapshot source). The strategy is chosen once
/// (cdi-core `clone::snapshot_strategy`): `snapshot`, restored by the CSI driver into the
/// temporary claim (`SnapshotClone`, the DataVolume's `CloneFromSnapshotSourceInProgress`) and
/// handed over; or, when the target's class cannot restore it, `copy`: restored by a class of
/// its driver into `tmp-source-pvc-<uid>` (`SnapshotClone`), copied host-assisted into the
/// temporary claim (`HostClone`), handed over. The snapshot must be ready and no larger than
/// the target.
async fn restore_snapshot(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    vcs: &VolumeCloneSource,
    holds: bool,
    node: Option<&str>,
) -> Result<Action, Error> {
    let source_ns = vcs.namespace().unwrap_or_default();
    let strategy = target
        .annotations()
        .get(ann::CLONE_TYPE)
        .and_then(|s| s.parse::<CloneStrategy>().ok());
    if let Some(tmp) = ctx
        .caches
        .claim(&source_ns, &clonepop::tmp_claim_name(target))
    {
        return if strategy == Some(CloneStrategy::Copy) {
            copy_into(ctx, target, &tmp).await
        } else {
            prep_and_rebind(ctx, target, &tmp).await
        };
    }
    let name = &vcs.spec.source.name;
    // Snapshots are not in the caches: looked at on a timer.
    let later = Action::requeue(ctx.options.resync * 2);
    let Some(snapshot) = crate::objects::get_snapshot(&ctx.client, &source_ns, name).await? else {
        let message = format!("The source snapshot {source_ns}/{name} doesn't exist");
        ctx.events
            .record(target, true, "CloneWithoutSource", &message)
            .await;
        return Ok(later);
    };
    if snapshot.data["status"]["readyToUse"] != true {
        return Ok(later);
    }
    let found = crate::objects::snapshot_source(&ctx.client, &snapshot).await?;
    let wanted = clone_claim(ctx, target);
    if found.restore_size > wanted.request {
        let message = format!(
            "target resources requests storage size is smaller than the source: the snapshot {source_ns}/{name} restores {} bytes, the claim asks for {}",
            found.restore_size, wanted.request
        );
        ctx.events
            .record(target, true, "ErrIncompatiblePVC", &message)
            .await;
        let message = format!("{}: {message}", cdi_core::hostclone::VALIDATION_FAILED);
        return fail(ctx, target, "CloneValidationFailed", &message).await;
    }
    let Some(strategy) = strategy else {
        let expands = target
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref())
            .and_then(|n| ctx.caches.classes.get(&ObjectRef::new(n)))
            .and_then(|c| c.allow_volume_expansion)
            .unwrap_or(false);
        let plan = cdi_core::clone::snapshot_strategy(&found, &wanted, expands);
        return record(ctx, target, &plan).await;
    };
    if !holds {
        return hold(ctx, target, target.annotations()).await;
    }
    if strategy != CloneStrategy::Copy {
        let restores = found.restore_size;
        create_tmp(
            ctx,
            target,
            vcs,
            node,
            clonepop::Fill::Restore(name),
            restores,
        )
        .await?;
        set_phase(ctx, target, phase::SNAPSHOT_CLONE).await?;
        return Ok(Action::await_change());
    }
    let restored = clonepop::tmp_source_claim_name(target);
    if ctx.caches.claim(&source_ns, &restored).is_some() {
        // Its source pod's scheduling binds it (restored_for_copy): copied from at once.
        create_tmp(ctx, target, vcs, node, clonepop::Fill::CopyOf(&restored), 0).await?;
        set_phase(ctx, target, phase::HOST_CLONE).await?;
        return Ok(Action::await_change());
    }
    // Restored by a class of the snapshot's driver (the first by name, as upstream).
    let driver = found.driver.as_deref().unwrap_or("");
    let Some(class) = cdi_core::hostclone::restore_class(&ctx.caches.classes(), driver) else {
        let message = format!(
            "VolumeSnapshot {source_ns}/{name}: no StorageClass of its CSI driver {} to restore it into for a copy; create one",
            cdi_core::hostclone::driver_name(driver)
        );
        ctx.events
            .record(target, true, "CloneValidationFailed", &message)
            .await;
        return Ok(later);
    };
    let mode = found.volume_mode.map(|m| m.as_str());
    let size = snapshot.data["status"]["restoreSize"]
        .as_str()
        .unwrap_or("0")
        .to_string();
    let claim = clonepop::tmp_source_claim(target, vcs, &class, mode, &size);
    if crate::objects::live(&ctx.client, target).await?.is_none() {
        return Ok(Action::await_change());
    }
    crate::objects::create(
        &Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &source_ns),
        &claim,
    )
    .await?;
    tracing::info!(claim = %format!("{source_ns}/{restored}"), %class,
        "restored the snapshot for a copy");
    set_phase(ctx, target, phase::SNAPSHOT_CLONE).await?;
    Ok(Action::await_change())
}

/// The `copy` strategy: HostClone, then Rebind.
async fn host_clone(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    vcs: &VolumeCloneSource,
    node: Option<&str>,
) -> Result<Action, Error> {
    let source_ns = vcs.namespace().unwrap_or_default();
    let tmp_name = clonepop::tmp_claim_name(target);
    let Some(tmp) = ctx.caches.claim(&source_ns, &tmp_name) else {
        create_tmp(ctx, target, vcs, node, clonepop::Fill::Copy, 0).await?;
        set_phase(ctx, target, phase::HOST_CLONE).await?;
        return Ok(Action::await_change());
    };
    copy_into(ctx, target, &tmp).await
}

/// A host-assisted copy into the temporary claim: its worker's state and progress mirrored on
/// the target while it runs, then Rebind.
async fn copy_into(
    ctx: &Context,
    target: &PersistentVolumeClaim,
    tmp: &PersistentVolumeClaim,
) -> Result<Action, Error> {
    let source_ns = tmp.namespace().unwrap_or_default();
    crate::populator::copy_events(ctx, tmp, target).await;
    let mut progress = None;
    if let Some(pod_name) = tmp.annotations().get(ann::CLONE_SOURCE_POD_NAME)
        && let Some(pod) = ctx.caches.pod(&source_ns, pod_name)
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    {
        let uid = target.metadata.uid.clone().unwrap_or_default();
        progress = crate::progress::clone_progress(&ctx.http, &pod, &uid).await;
    }
    let mut wanted = clonepop::mirrored(target, tmp, progress.as_deref());
    if !clonepop::host_clone_done(tmp) {
        wanted.insert(ann::CLONE_PHASE.into(), phase::HOST_CLONE.into());
        annotate(ctx, target, &wanted).await?;
        // Progress is read on a timer; the copy's end changes the temporary claim.
        return Ok(if progress.is_some() {
            Action::requeue(ctx.options.resync)
        } else {
            Action::await_change()
        });
    }
    annotate(ctx, target, &wanted).await?;
    rebind(ctx, target, tmp).await
}

/// The cache subscriptions the clone populator is woken by.
pub struct Triggers {
    targets: Changes<PersistentVolumeClaim>,
    tmps: Changes<PersistentVolumeClaim>,
    events: Changes<Event>,
}

impl Triggers {
    pub fn subscribe(feeds: &mut crate::cache::Feeds) -> Triggers {
        Triggers {
            targets: feeds.claims.subscribe(),
            tmps: feeds.claims.subscribe(),
            events: feeds.events.subscribe(),
        }
    }
}

/// Run the clone populator over claims; a temporary claim (and its events) wakes the target its
/// `events.source` names.
pub async fn run(ctx: Context, triggers: Triggers) -> anyhow::Result<()> {
    ctx.caches.ready().await;
    let claims = ctx.caches.claims.clone();
    let target_of = |c: &PersistentVolumeClaim| {
        clonepop::target_of(c).map(|(ns, name)| ObjectRef::new(&name).within(&ns))
    };
    // Only clone targets are passed over: the others would each cost a pass that does nothing.
    let targets = triggers.targets.filter(|c: &Arc<PersistentVolumeClaim>| {
        futures::future::ready(clonepop::clone_source_name(c).is_some())
    });
    Controller::for_shared_stream(targets, ctx.caches.claims.clone())
        .watches_shared_stream(triggers.tmps, move |c: Arc<PersistentVolumeClaim>| {
            target_of(&c)
        })
        .watches_shared_stream(triggers.events, move |e: Arc<Event>| {
            let o = &e.involved_object;
            let tmp =
                claims.get(&ObjectRef::new(o.name.as_deref()?).within(o.namespace.as_deref()?))?;
            target_of(&tmp)
        })
        .run_as(
            "clone-populator",
            ctx.metrics.clone(),
            Arc::new(ctx),
            reconcile,
        )
        .await;
    Ok(())
}
