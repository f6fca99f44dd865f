//! The DataVolume controller (import and blank sources): render the claim
//! (cdi-core `render`), adopt claims already populated for the DataVolume, and compute the
//! status from the claim (cdi-core `dvstatus`), with upstream's events. The populator path
//! goes through a VolumeImportSource and PVC prime (see `populator`) when the class's provisioner
//! has a CSIDriver object, unless the DataVolume says `usePopulator: "false"`.

use std::sync::Arc;

use cdi_api::config::CDIConfig;
use cdi_api::datavolume::DataVolume;
use cdi_api::enums::DataVolumePhase;
use cdi_api::populators::{ImportSourceType, VolumeImportSource, VolumeImportSourceSpec};
use cdi_api::storageprofile::StorageProfile;
use cdi_api::{ann, gate};
use cdi_core::claims::{adoptable, claim_made_for, owned_by, populated_for};
use cdi_core::dvstatus::{self, Observed};
use cdi_core::render::{self, RenderContext};
use cdi_core::source::Refusal;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use crate::{Context, Error, events};

/// Take the claim over: the DataVolume becomes its controller, and it counts as populated.
async fn adopt(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    dv: &DataVolume,
) -> Result<(), kube::Error> {
    let ns = claim.namespace().unwrap_or_default();
    let mut owners = claim.owner_references().to_vec();
    owners.extend(dv.controller_owner_ref(&()));
    let patch = json!({"metadata": {"ownerReferences": owners,
        "annotations": {ann::POPULATED_FOR: dv.name_any()}}});
    Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns)
        .patch(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    tracing::info!(claim = %format!("{ns}/{}", claim.name_any()), "adopted claim");
    Ok(())
}

/// The names of the CSIDriver objects: the provisioners that are CSI drivers. Listed, not
/// fetched by name: a provisioner name such as rancher.io/local-path is no object name.
async fn csi_drivers(ctx: &Context) -> Result<Vec<String>, kube::Error> {
    Ok(Api::<CSIDriver>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|d| d.name_any())
        .collect())
}

async fn config(ctx: &Context) -> Result<Option<CDIConfig>, kube::Error> {
    Api::<CDIConfig>::all(ctx.client.clone())
        .get_opt(cdi_api::name::CDI_CONFIG)
        .await
}

/// Create the DataVolume's claim; the reason when it cannot be rendered (yet).
async fn create_claim(
    ctx: &Context,
    dv: &DataVolume,
    cfg: Option<&CDIConfig>,
) -> Result<Option<Refusal>, Error> {
    let ns = dv.namespace().unwrap_or_default();
    let classes = Api::<StorageClass>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let profiles = Api::<StorageProfile>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let drivers = csi_drivers(ctx).await?;
    let render_ctx = RenderContext {
        storage_classes: &classes,
        storage_profiles: &profiles,
        config: cfg,
        csi_drivers: &drivers,
    };
    let rendered = match render::render_claim(dv, &render_ctx) {
        Ok(r) => r,
        Err(e) => {
            return Ok(Some(Refusal {
                reason: "ErrClaimNotRendered",
                // Render errors name the DataVolume themselves.
                message: e.to_string(),
            }));
        }
    };
    for w in &rendered.warnings {
        events::record(&ctx.client, dv, true, "SizeWarning", w).await;
    }
    // Only CDI's own sources go through a VolumeImportSource; an externally populated claim
    // keeps the dataSourceRef the DataVolume gave it.
    if rendered.use_populator && dv.spec.source.is_some() {
        create_import_source(ctx, dv).await?;
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    match claims.create(&PostParams::default(), &rendered.claim).await {
        Ok(_) => tracing::info!(dv = %format!("{ns}/{}", dv.name_any()), "created claim"),
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    // As upstream: the DataVolume says which path it took.
    let path = rendered.use_populator.to_string();
    if dv.annotations().get(ann::USE_POPULATOR) != Some(&path) {
        let api: Api<DataVolume> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = json!({"metadata": {"annotations": {ann::USE_POPULATOR: path}}});
        api.patch(
            &dv.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    }
    Ok(None)
}

fn import_source_name(dv: &DataVolume) -> String {
    format!(
        "{}-{}",
        cdi_api::name::VOLUME_IMPORT_SOURCE_PREFIX,
        dv.metadata.uid.as_deref().unwrap_or("")
    )
}

/// The VolumeImportSource the claim's `dataSourceRef` names, owned by the DataVolume.
async fn create_import_source(ctx: &Context, dv: &DataVolume) -> Result<(), Error> {
    let ns = dv.namespace().unwrap_or_default();
    let source = dv.spec.source.clone().unwrap_or_default();
    let mut object = VolumeImportSource::new(
        &import_source_name(dv),
        VolumeImportSourceSpec {
            source: Some(ImportSourceType {
                http: source.http,
                blank: source.blank,
                ..Default::default()
            }),
            content_type: dv.spec.content_type,
            preallocation: dv.spec.preallocation,
            ..Default::default()
        },
    );
    object.metadata.namespace = Some(ns.clone());
    object.metadata.owner_references = dv.controller_owner_ref(&()).map(|o| vec![o]);
    match Api::<VolumeImportSource>::namespaced(ctx.client.clone(), &ns)
        .create(&PostParams::default(), &object)
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
        Ok(_) => Ok(()),
    }
}

/// The claim's Bound condition annotations from its latest event while it is Pending (upstream's
/// `UpdatePVCBoundConditionFromEvents`: "waiting for first consumer to be created before
/// binding" reaches the DataVolume), and none once it is Bound.
async fn bound_condition_from_events(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
) -> Result<Option<PersistentVolumeClaim>, kube::Error> {
    let ns = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    let anns = claim.annotations();
    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
    let patch = match phase {
        Some("Bound") if anns.contains_key(ann::BOUND_CONDITION) => {
            json!({"metadata": {"annotations": {
            ann::BOUND_CONDITION: null, ann::BOUND_CONDITION_REASON: null, ann::BOUND_CONDITION_MESSAGE: null}}})
        }
        Some("Pending") => {
            let events: Api<k8s_openapi::api::core::v1::Event> =
                Api::namespaced(ctx.client.clone(), &ns);
            let list = events
                .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
                .await?;
            // With a PVC prime, only its re-emitted events count, without their prefix.
            let prime = anns.get(ann::PVC_PRIME_NAME).map(|p| format!("[{p}] : "));
            let latest = list
                .items
                .into_iter()
                .filter(|e| e.involved_object.uid == claim.metadata.uid)
                // What binding waits for is said by the PV controller and provisioners (copied
                // from PVC prime by the populator); the controller's own warnings on the claim
                // (a refused importer pod) are not that, and would outlive their cause there.
                .filter(|e| {
                    prime.is_some()
                        || e.source.as_ref().and_then(|s| s.component.as_deref())
                            != Some(events::COMPONENT)
                })
                .filter(|e| {
                    prime.as_ref().is_none_or(|p| {
                        e.message.as_deref().is_some_and(|m| m.contains(p.as_str()))
                    })
                })
                .max_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
            let Some(mut message) = latest.and_then(|e| e.message) else {
                return Ok(None);
            };
            if let Some(p) = &prime
                && let Some(at) = message.find(p.as_str())
            {
                message = message[at + p.len()..].to_string();
            }
            if anns.get(ann::BOUND_CONDITION_MESSAGE) == Some(&message) {
                return Ok(None);
            }
            json!({"metadata": {"annotations": {ann::BOUND_CONDITION: "false",
                ann::BOUND_CONDITION_REASON: "Pending", ann::BOUND_CONDITION_MESSAGE: message}}})
        }
        _ => return Ok(None),
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    Ok(Some(
        claims
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?,
    ))
}

/// The importer pod of a claim, if it runs.
async fn importer_pod(ctx: &Context, claim: &PersistentVolumeClaim) -> Option<Pod> {
    let ns = claim.namespace()?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    pods.get_opt(&cdi_core::import::pod_name(claim))
        .await
        .ok()
        .flatten()
}

/// Write the computed status when it changed, then record its events.
async fn write_status(
    ctx: &Context,
    dv: &DataVolume,
    computed: &dvstatus::Computed,
) -> Result<(), Error> {
    if dv.status.as_ref() != Some(&computed.status) {
        let api: Api<DataVolume> =
            Api::namespaced(ctx.client.clone(), &dv.namespace().unwrap_or_default());
        match api
            .patch_status(
                &dv.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&crate::status_patch(dv.status.as_ref(), &computed.status)?),
            )
            .await
        {
            // Deleted meanwhile: nothing to say, and no events about it.
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
    }
    for e in &computed.events {
        events::record(&ctx.client, dv, e.warning, &e.reason, &e.message).await;
    }
    Ok(())
}

async fn reconcile(dv: Arc<DataVolume>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = dv.namespace().unwrap_or_default();
    let name = dv.name_any();
    if dv.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let mut claim = claims.get_opt(&name).await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    if let Some(c) = &claim
        && c.metadata.deletion_timestamp.is_some()
        && !owned_by(c, &dv)
    {
        // Left by an earlier DataVolume of this name (or by no DataVolume) and still in use:
        // neither adopted nor reported as this DataVolume's, and replaced once it is gone.
        let refusal = Refusal {
            reason: "ErrClaimBeingDeleted",
            message: format!(
                "PVC {name} is being deleted and is not this DataVolume's (a pod may still use \
                 it); a new claim is made once it is gone"
            ),
        };
        write_status(&ctx, &dv, &dvstatus::claim_taken_status(&dv, &refusal, now)).await?;
        return Ok(Action::requeue(ctx.options.resync));
    }
    let filled = cdi_core::source::check(&dv);
    if !claim_made_for(claim.as_ref(), &dv)
        && let Err(refusal) = &filled
    {
        // A source a later version may fill waits (Pending); a malformed one fails.
        let phase = if refusal.reason == cdi_core::source::UNSUPPORTED_SOURCE {
            DataVolumePhase::Pending
        } else {
            DataVolumePhase::Failed
        };
        let computed = dvstatus::refused_status(&dv, refusal, phase, now);
        write_status(&ctx, &dv, &computed).await?;
        return Ok(Action::await_change());
    }
    let cfg = config(&ctx).await?;
    if claim.is_none() {
        // The cache can still hold a DataVolume that was just deleted; a claim made for it would
        // outlive it (and start an import), so ask the API server before creating anything.
        if !crate::still_current(&ctx.client, dv.as_ref()).await? {
            return Ok(Action::await_change());
        }
        if let Some(refusal) = create_claim(&ctx, &dv, cfg.as_ref()).await? {
            let computed = dvstatus::refused_status(&dv, &refusal, DataVolumePhase::Pending, now);
            write_status(&ctx, &dv, &computed).await?;
            return Ok(Action::await_change());
        }
        claim = claims.get_opt(&name).await?;
    }
    if let Some(c) = &claim
        && owned_by(c, &dv)
        && let Some(updated) = bound_condition_from_events(&ctx, c).await?
    {
        claim = Some(updated);
    }
    let mut populated = false;
    if let Some(c) = &claim {
        populated = populated_for(c, &dv);
        let has_controller = c
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true));
        if !owned_by(c, &dv) && !has_controller && adoptable(c, &dv, cfg.as_ref()) {
            adopt(&ctx, c, &dv).await?;
            events::record(
                &ctx.client,
                dv.as_ref(),
                false,
                "Bound",
                &format!("Adopted existing claim {name}"),
            )
            .await;
            populated = true;
        } else if !owned_by(c, &dv) && !populated {
            let refusal = Refusal {
                reason: "ErrResourceExists",
                message: format!(
                    "Resource \"{name}\" already exists and is not managed by DataVolume; delete \
                     the claim, or annotate the DataVolume {} to adopt it",
                    ann::PRE_POPULATED
                ),
            };
            // The status records the event once, when it first says so.
            write_status(&ctx, &dv, &dvstatus::claim_taken_status(&dv, &refusal, now)).await?;
            return Ok(Action::await_change());
        }
    }
    let class_name = claim
        .as_ref()
        .and_then(|c| c.spec.as_ref()?.storage_class_name.clone());
    let class = match class_name {
        Some(n) => {
            Api::<StorageClass>::all(ctx.client.clone())
                .get_opt(&n)
                .await?
        }
        None => None,
    };
    let class_wffc = class
        .as_ref()
        .and_then(|c| c.volume_binding_mode.as_deref())
        == Some("WaitForFirstConsumer");
    let external = match (&filled, &class) {
        (Ok(cdi_core::source::Filled::External), Some(class)) => Some(dvstatus::External {
            csi_driver: csi_drivers(&ctx).await?.contains(&class.provisioner),
        }),
        (Ok(cdi_core::source::Filled::External), None) => {
            Some(dvstatus::External { csi_driver: false })
        }
        _ => None,
    };
    let honor_wffc = cfg
        .as_ref()
        .is_some_and(|c| c.spec.gate_enabled(gate::HONOR_WAIT_FOR_FIRST_CONSUMER));
    let in_progress =
        dv.status.as_ref().and_then(|s| s.phase.clone()) == Some(DataVolumePhase::ImportInProgress);
    let mut progress = None;
    if let Some(c) = &claim
        && let Some(pod) = importer_pod(&ctx, c).await
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    {
        let owner = cdi_core::import::owner_uid(c);
        progress = crate::progress::import_progress(&ctx.http, &pod, &owner).await;
    }
    // The populator path: the claim's dataSourceRef names our VolumeImportSource.
    let populating = claim
        .as_ref()
        .and_then(cdi_core::populator::import_source_name)
        .is_some();
    let prime = match (&claim, populating) {
        (Some(c), true) => claims.get_opt(&cdi_core::populator::prime_name(c)).await?,
        _ => None,
    };
    let computed = dvstatus::import_status(&Observed {
        dv: &dv,
        claim: claim.as_ref(),
        class_wffc,
        honor_wffc,
        populated,
        progress,
        external,
        populator: populating.then_some(prime.as_ref()),
        now: k8s_openapi::jiff::Timestamp::now(),
    });
    // Once done, the populator's source goes (upstream deletes it when the DataVolume succeeded).
    if populating && computed.status.phase == Some(DataVolumePhase::Succeeded) {
        let sources: Api<VolumeImportSource> = Api::namespaced(ctx.client.clone(), &ns);
        match sources
            .delete(&import_source_name(&dv), &Default::default())
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
    }
    write_status(&ctx, &dv, &computed).await?;
    // Events on a Pending claim (what it waits for) send no watch event to this controller.
    let claim_pending = claim
        .as_ref()
        .and_then(|c| c.status.as_ref()?.phase.as_deref())
        == Some("Pending");
    let running = in_progress
        || claim_pending
        || computed.status.phase == Some(DataVolumePhase::ImportInProgress)
        || computed.status.phase == Some(DataVolumePhase::ImportScheduled);
    Ok(if running {
        // Progress is read from the pod, which sends no events when it changes.
        Action::requeue(ctx.options.resync)
    } else {
        Action::await_change()
    })
}

fn error_policy(dv: Arc<DataVolume>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(dv = %dv.name_any(), error = %error, "reconcile failed");
    Action::requeue(ctx.options.resync)
}

/// The `kubevirt_cdi_datavolume_pending` gauge: DataVolumes still Pending.
fn count_pending(dvs: &[Arc<DataVolume>]) -> i64 {
    dvs.iter()
        .filter(|d| {
            matches!(
                d.status.as_ref().and_then(|s| s.phase.clone()),
                None | Some(DataVolumePhase::Pending)
            )
        })
        .count() as i64
}

type Store = kube::runtime::reflector::Store<DataVolume>;
type Refs = Vec<kube::runtime::reflector::ObjectRef<DataVolume>>;

/// Every DataVolume, whatever changed.
fn every<T>(store: Store) -> impl Fn(T) -> Refs {
    move |_| {
        store
            .state()
            .iter()
            .map(|d| kube::runtime::reflector::ObjectRef::from_obj(d.as_ref()))
            .collect()
    }
}

/// The DataVolumes still without a phase or Pending: those whose claim may not exist yet.
fn unrendered<T>(store: Store) -> impl Fn(T) -> Refs {
    move |_| {
        store
            .state()
            .iter()
            .filter(|d| {
                matches!(
                    d.status.as_ref().and_then(|s| s.phase.clone()),
                    None | Some(DataVolumePhase::Pending)
                )
            })
            .map(|d| kube::runtime::reflector::ObjectRef::from_obj(d.as_ref()))
            .collect()
    }
}

/// Run the controller: DataVolumes, their claims, and the config (a gate change re-evaluates
/// every DataVolume).
pub async fn run(ctx: Context) -> anyhow::Result<()> {
    let client = ctx.client.clone();
    let shared = Arc::new(ctx.clone());
    let controller = Controller::new(
        Api::<DataVolume>::all(client.clone()),
        watcher::Config::default(),
    );
    let store = controller.store();
    // Counted from the controller's own cache: no extra listing.
    // Polled with the controller rather than spawned, so it cannot stop unnoticed.
    let gauge = {
        let (store, ctx) = (store.clone(), ctx.clone());
        async move {
            loop {
                ctx.metrics
                    .set_datavolume_pending(count_pending(&store.state()));
                tokio::time::sleep(ctx.options.resync).await;
            }
        }
    };
    let controller = controller
        .owns(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            watcher::Config::default(),
        )
        .watches(
            Api::<CDIConfig>::all(client.clone()),
            watcher::Config::default(),
            every(store.clone()),
        )
        // A claim that could not be rendered (no access modes, no such class) can be once its
        // profile or class is fixed.
        .watches(
            Api::<StorageProfile>::all(client.clone()),
            watcher::Config::default(),
            unrendered(store.clone()),
        )
        .watches(
            Api::<StorageClass>::all(client.clone()),
            watcher::Config::default(),
            unrendered(store),
        )
        .run(
            |o, c| {
                let metrics = c.metrics.clone();
                let object = format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any());
                async move { crate::guarded(&metrics, "datavolume", &object, reconcile(o, c)).await }
            },
            error_policy,
            shared,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "datavolume controller");
            }
        });
    tokio::select! {
        _ = controller => {}
        _ = gauge => {}
    }
    Ok(())
}
