//! The DataVolume controller: observe (the DataVolume, its claim, PVC prime, the claim's events,
//! the worker's progress, the cached classes, profiles, drivers and config), decide (cdi-core
//! `datavolume::decide`, one [`Kind`](cdi_core::datavolume::Kind) per source kind), execute the
//! plan.

use crate::runtime::run::RunAs;
use std::sync::Arc;

use crate::clone::token::DvGrant;
use cdi_api::config::CDIConfig;
use cdi_api::datavolume::DataVolume;
use cdi_api::enums::DataVolumePhase;
use cdi_api::finalizer;
use cdi_api::keys::ann;
use cdi_api::populators::{VolumeCloneSource, VolumeImportSource};
use cdi_api::storageprofile::StorageProfile;
use cdi_core::datavolume::{
    self, ClaimStep, Companion, Leftover, Plan, PodStep, Requeue, Snapshot,
};
use cdi_pki::token::Resource;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::cache::Changes;
use crate::runtime::context::Context;
use crate::runtime::error::Error;

/// Everything the decision needs, read once.
struct Observed {
    claim: Option<PersistentVolumeClaim>,
    prime: Option<PersistentVolumeClaim>,
    claim_events: Vec<Event>,
    progress: Option<String>,
    first_consumer: Option<Pod>,
    clone_source: Option<PersistentVolumeClaim>,
    classes: Vec<StorageClass>,
    profiles: Vec<StorageProfile>,
    drivers: Vec<String>,
    config: Option<CDIConfig>,
}

/// Read from the caches: the claim, PVC prime, the first-consumer pod and the worker pod are
/// the stores' copies, whose changes wake this DataVolume after the store holds them. Only
/// progress is asked of the worker itself.
async fn observe(ctx: &Context, dv: &DataVolume) -> Observed {
    let ns = dv.namespace().unwrap_or_default();
    let caches = &ctx.caches;
    let mut observed = Observed {
        claim: None,
        prime: None,
        claim_events: Vec::new(),
        progress: None,
        first_consumer: None,
        clone_source: datavolume::clone_source_of(dv)
            .and_then(|(ns, name)| caches.claim(&ns, &name))
            .map(|c| c.as_ref().clone()),
        classes: caches.classes(),
        profiles: caches.profiles(),
        drivers: caches.csi_drivers(),
        config: caches.config(),
    };
    let Some(claim) = caches.claim(&ns, &dv.name_any()) else {
        return observed;
    };
    let pending = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending");
    if pending {
        observed.claim_events = caches.claim_events(&ns, &claim.name_any());
    }
    if pending || dv.annotations().contains_key(cdi_api::ext::FIRST_CONSUMER) {
        observed.first_consumer = caches
            .pod(&ns, &cdi_core::first_consumer::pod_name(dv))
            // Only the pod made for this DataVolume is its to delete.
            .filter(|p| {
                p.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == dv.metadata.uid.as_ref())
            })
            .map(|p| p.as_ref().clone());
    }
    if cdi_core::populator::source_of(&claim).is_some() {
        observed.prime = caches
            .claim(&ns, &cdi_core::populator::prime_name(&claim))
            .map(|p| p.as_ref().clone());
    }
    if let Some(pod) = caches.pod(&ns, &cdi_core::import::pod_name(&claim))
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    {
        let owner = cdi_core::import::owner_uid(&claim);
        observed.progress = crate::progress::import_progress(&ctx.http, &pod, &owner).await;
    }
    // A host-assisted copy's progress is its source pod's, in the source's namespace.
    if let Some(pod_name) = claim.annotations().get(cdi_api::ann::CLONE_SOURCE_POD_NAME)
        && let Some((source_ns, _)) = cdi_core::hostclone::clone_request(&claim)
        && let Some(pod) = caches.pod(&source_ns, pod_name)
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    {
        let owner = claim
            .annotations()
            .get(cdi_api::ann::OWNER_UID)
            .cloned()
            .unwrap_or_else(|| cdi_core::import::owner_uid(&claim));
        observed.progress = crate::progress::clone_progress(&ctx.http, &pod, &owner).await;
    }
    observed.claim = Some(claim.as_ref().clone());
    observed
}

async fn merge<K>(api: &Api<K>, name: &str, patch: serde_json::Value) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// Apply the plan, in its order.
async fn execute(
    ctx: &Context,
    dv: &DataVolume,
    claim_version: Option<&str>,
    plan: Plan,
) -> Result<Action, Error> {
    let ns = dv.namespace().unwrap_or_default();
    let name = dv.name_any();
    // The cache can still hold a DataVolume that was just deleted; what is made for it would
    // outlive it (and start an import), so ask the API server before creating anything.
    if plan.creates() && crate::objects::live(&ctx.client, dv).await?.is_none() {
        return Ok(Action::await_change());
    }
    let dvs = Api::<DataVolume>::namespaced(ctx.client.clone(), &ns);
    if plan.finalizer == Some(true) {
        crate::objects::set_finalizer(&dvs, dv, finalizer::DATA_VOLUME, true).await?;
    }
    create_companions(ctx, &ns, &plan.create).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    write_claim(ctx, dv, &claims, claim_version, &plan.claim).await?;
    first_consumer(ctx, &ns, plan.first_consumer.as_ref()).await?;
    if !plan.claim_annotations.is_empty() {
        let patch = json!({"metadata": {"annotations": plan.claim_annotations}});
        merge(&claims, &name, patch).await?;
    }
    if !plan.dv_annotations.is_empty() {
        let patch = json!({"metadata": {"annotations": plan.dv_annotations}});
        merge(&dvs, &name, patch).await?;
    }
    delete_leftovers(ctx, &plan.delete).await?;
    if plan.finalizer == Some(false) {
        crate::objects::set_finalizer(&dvs, dv, finalizer::DATA_VOLUME, false).await?;
    }
    for e in &plan.events {
        ctx.events
            .record(dv, e.warning, &e.reason, &e.message)
            .await;
    }
    if let Some(computed) = &plan.status {
        write_status(ctx, dv, computed).await?;
    }
    Ok(match plan.requeue {
        Requeue::Soon => Action::requeue(ctx.options.resync),
        Requeue::OnChange => Action::await_change(),
    })
}

/// Create the plan's companion objects (populator sources, restore claims), each in its
/// namespace (the DataVolume's unless it names one).
async fn create_companions(ctx: &Context, ns: &str, create: &[Companion]) -> Result<(), Error> {
    let sources: Api<VolumeImportSource> = Api::namespaced(ctx.client.clone(), ns);
    for c in create {
        match c {
            Companion::ImportSource(s) => crate::objects::create(&sources, s.as_ref()).await?,
            Companion::UploadSource(s) => {
                crate::objects::create(&Api::namespaced(ctx.client.clone(), ns), s.as_ref()).await?
            }
            Companion::CloneSource(s) => {
                let at = s.namespace().unwrap_or_else(|| ns.to_string());
                crate::objects::create(&Api::namespaced(ctx.client.clone(), &at), s.as_ref())
                    .await?
            }
            Companion::RestoreClaim(c) => {
                let at = c.namespace().unwrap_or_else(|| ns.to_string());
                crate::objects::create(
                    &Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &at),
                    c.as_ref(),
                )
                .await?
            }
        }
    }
    Ok(())
}

/// Create the DataVolume's claim (a quota refusal said on the DataVolume) or adopt the one
/// there, as the plan says.
async fn write_claim(
    ctx: &Context,
    dv: &DataVolume,
    claims: &Api<PersistentVolumeClaim>,
    claim_version: Option<&str>,
    step: &ClaimStep,
) -> Result<(), Error> {
    match step {
        ClaimStep::Keep => {}
        ClaimStep::Create(claim) => match crate::objects::create(claims, claim.as_ref()).await {
            Err(kube::Error::Api(e))
                if cdi_core::import::refusal_reason(&e.message)
                    == cdi_core::import::ERR_EXCEEDED_QUOTA =>
            {
                // As upstream: said on the DataVolume, which stays Pending; retried with
                // back-off until the quota allows it.
                ctx.events
                    .record(dv, true, cdi_core::import::ERR_EXCEEDED_QUOTA, &e.message)
                    .await;
                return Err(kube::Error::Api(e).into());
            }
            Err(e) => return Err(e.into()),
            Ok(()) => tracing::info!("created claim"),
        },
        ClaimStep::Adopt(owners) => {
            // The list replaces the claim's: from the cached claim, so only onto that version
            // (a newer one says 409, and the pass is retried with it).
            merge(
                claims,
                &dv.name_any(),
                json!({"metadata": {"ownerReferences": owners, "resourceVersion": claim_version}}),
            )
            .await?;
            tracing::info!("adopted claim");
        }
    }
    Ok(())
}

/// Create or delete the first-consumer pod, as the plan says (one gone already is fine).
async fn first_consumer(ctx: &Context, ns: &str, step: Option<&PodStep>) -> Result<(), Error> {
    match step {
        None => {}
        Some(PodStep::Create(pod)) => {
            crate::objects::create(
                &Api::<Pod>::namespaced(ctx.client.clone(), ns),
                pod.as_ref(),
            )
            .await?;
            tracing::info!(pod = %pod.name_any(), "created the first-consumer pod");
        }
        Some(PodStep::Delete(pod)) => {
            let pods = Api::<Pod>::namespaced(ctx.client.clone(), ns);
            match pods.delete(pod, &Default::default()).await {
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
                Ok(_) => tracing::info!(%pod, "deleted the first-consumer pod"),
            }
        }
    }
    Ok(())
}

/// Delete what the DataVolume no longer needs (populator sources, restore claims).
async fn delete_leftovers(ctx: &Context, delete: &[Leftover]) -> Result<(), Error> {
    for l in delete {
        let client = ctx.client.clone();
        match l {
            Leftover::ImportSource { namespace, name } => {
                crate::objects::delete(
                    &Api::<VolumeImportSource>::namespaced(client, namespace),
                    name,
                )
                .await?
            }
            Leftover::CloneSource { namespace, name } => {
                crate::objects::delete(
                    &Api::<VolumeCloneSource>::namespaced(client, namespace),
                    name,
                )
                .await?
            }
            Leftover::RestoreClaim { namespace, name } => {
                crate::objects::delete(
                    &Api::<PersistentVolumeClaim>::namespaced(client, namespace),
                    name,
                )
                .await?
            }
        }
        tracing::info!(?l, "deleted");
    }
    Ok(())
}

/// Write the computed status when it changed, then record its events.
async fn write_status(
    ctx: &Context,
    dv: &DataVolume,
    computed: &cdi_core::dvstatus::Computed,
) -> Result<(), Error> {
    if dv.status.as_ref() != Some(&computed.status) {
        let api: Api<DataVolume> =
            Api::namespaced(ctx.client.clone(), &dv.namespace().unwrap_or_default());
        match api
            .patch_status(
                &dv.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&crate::objects::status_patch(
                    dv.status.as_ref(),
                    &computed.status,
                )?),
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
        ctx.events
            .record(dv, e.warning, &e.reason, &e.message)
            .await;
    }
    Ok(())
}

/// Keep a granted cross-namespace clone's tokens: the DataVolume's short one swapped for a
/// long one bound to it, and its claim given one bound to the claim.
async fn authorize_clone(
    ctx: &Context,
    dv: &DataVolume,
    extend: Option<&str>,
    claim: Option<&PersistentVolumeClaim>,
    source: Option<(&(String, String), Resource)>,
) -> Result<(), Error> {
    let ns = dv.namespace().unwrap_or_default();
    if let Some(long) = extend {
        let patch = json!({"metadata": {"annotations": {ann::EXTENDED_CLONE_TOKEN: long}}});
        merge(
            &Api::<DataVolume>::namespaced(ctx.client.clone(), &ns),
            &dv.name_any(),
            patch,
        )
        .await?;
    }
    let (Some(claim), Some((source, resource))) = (claim, source) else {
        return Ok(());
    };
    let ours = claim
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == dv.metadata.uid.as_ref());
    if !ours {
        return Ok(());
    }
    let tokens = crate::clone::token::tokens(ctx).await?;
    if let Some(token) = crate::clone::token::claim_token(tokens, claim, source, resource) {
        let patch = json!({"metadata": {"annotations": {ann::EXTENDED_CLONE_TOKEN: token}}});
        merge(
            &Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns),
            &claim.name_any(),
            patch,
        )
        .await?;
    }
    Ok(())
}

/// What was made for the DataVolume outside what it owns (cdi-core `made_for`): the claim a
/// snapshot was restored into for a copy; while it holds its finalizer and is deleted or
/// succeeded, also its VolumeCloneSource, wherever they are (its source may have changed since:
/// a DataSource's).
async fn leftovers(
    ctx: &Context,
    dv: &DataVolume,
    decided: &DataVolume,
) -> Result<Vec<Leftover>, Error> {
    let restored = datavolume::snapshot_fallback_name(dv);
    let mut found: Vec<Arc<PersistentVolumeClaim>> = datavolume::snapshot_source_of(decided)
        .and_then(|(ns, _)| ctx.caches.claim(&ns, &restored))
        .into_iter()
        .collect();
    let held = datavolume::holds_finalizer(dv);
    let ended = dv.metadata.deletion_timestamp.is_some()
        || dv.status.as_ref().and_then(|s| s.phase.as_ref()) == Some(&DataVolumePhase::Succeeded);
    let mut clone_sources = Vec::new();
    if held && ended {
        found = ctx
            .caches
            .claims
            .state()
            .into_iter()
            .filter(|c| c.name_any() == restored)
            .collect();
        let name = datavolume::clone_source_name(dv);
        clone_sources = Api::<VolumeCloneSource>::all(ctx.client.clone())
            .list(&ListParams::default().fields(&format!("metadata.name={name}")))
            .await?
            .items;
    }
    let claims = found
        .iter()
        .filter(|c| datavolume::made_for(dv, &c.metadata))
        .map(|c| Leftover::RestoreClaim {
            namespace: c.namespace().unwrap_or_default(),
            name: c.name_any(),
        });
    let sources = clone_sources
        .iter()
        .filter(|s| datavolume::made_for(dv, &s.metadata))
        .map(|s| Leftover::CloneSource {
            namespace: s.namespace().unwrap_or_default(),
            name: s.name_any(),
        });
    Ok(claims.chain(sources).collect())
}

/// Observe, decide, execute.
pub async fn reconcile(dv: Arc<DataVolume>, ctx: Arc<Context>) -> Result<Action, Error> {
    if dv.metadata.deletion_timestamp.is_some() && !datavolume::holds_finalizer(&dv) {
        return Ok(Action::await_change());
    }
    ctx.caches.ready().await;
    // A sourceRef is decided as the source its DataSource names (upstream fills spec.source in
    // memory the same way); the DataVolume itself is not changed.
    let mut effective = None;
    let mut ref_refusal = None;
    match cdi_core::datasource::source_ref_target(&dv) {
        None => {}
        Some(Err(r)) => ref_refusal = Some(r),
        Some(Ok(at)) => {
            let found =
                Api::<cdi_api::datasource::DataSource>::namespaced(ctx.client.clone(), &at.0)
                    .get_opt(&at.1)
                    .await?;
            match cdi_core::datasource::source_of_ref(&dv, &at, found.as_ref()) {
                Ok(source) => {
                    let mut e = dv.as_ref().clone();
                    e.spec.source = Some(source);
                    e.spec.source_ref = None;
                    effective = Some(e);
                }
                Err(r) => ref_refusal = Some(r),
            }
        }
    }
    let decided = effective.as_ref().unwrap_or(dv.as_ref());
    // A clone from another namespace reads nothing without a valid token (docs/cloning.md#cross-namespace-authorization).
    let mut grant = DvGrant::NotNeeded;
    let (clone_source, resource) = match datavolume::clone_source_of(decided) {
        Some(claim) => (Some(claim), Resource::claims()),
        None => (
            datavolume::snapshot_source_of(decided),
            Resource::snapshots(),
        ),
    };
    if let Some(source) = &clone_source
        && Some(&source.0) != dv.metadata.namespace.as_ref()
    {
        let tokens = crate::clone::token::tokens(&ctx).await?;
        grant = crate::clone::token::check_dv(tokens, decided, source, resource.clone());
    }
    // The snapshot a snapshot clone restores, read until its claim is made (snapshots are not
    // in the caches).
    let mut clone_snapshot = None;
    let mut snapshot_driver = None;
    if let Some((ns, name)) = datavolume::snapshot_source_of(decided)
        && ctx
            .caches
            .claim(&dv.namespace().unwrap_or_default(), &dv.name_any())
            .is_none()
    {
        let found = crate::objects::get_snapshot(&ctx.client, &ns, &name).await?;
        // Its driver: a copy off the populator path restores it with a class of that driver.
        if let Some(snapshot) = &found {
            snapshot_driver = crate::objects::snapshot_source(&ctx.client, snapshot)
                .await?
                .driver;
        }
        clone_snapshot = found.map(|o| serde_json::to_value(o).unwrap_or_default());
    }
    let leftovers = leftovers(&ctx, &dv, decided).await?;
    let clone_refusal = match &grant {
        DvGrant::Refused(r) => Some(r),
        _ => None,
    };
    let o = observe(&ctx, decided).await;
    if let DvGrant::Granted { extend } = &grant {
        authorize_clone(
            &ctx,
            &dv,
            extend.as_deref(),
            o.claim.as_ref(),
            clone_source.as_ref().map(|s| (s, resource.clone())),
        )
        .await?;
    }
    let plan = datavolume::decide(&Snapshot {
        dv: decided,
        claim: o.claim.as_ref(),
        prime: o.prime.as_ref(),
        classes: &o.classes,
        profiles: &o.profiles,
        csi_drivers: &o.drivers,
        config: o.config.as_ref(),
        claim_events: &o.claim_events,
        progress: o.progress,
        first_consumer: o.first_consumer.as_ref(),
        clone_source: o.clone_source.as_ref(),
        source_ref_refusal: ref_refusal.as_ref(),
        clone_refusal,
        clone_snapshot: clone_snapshot.as_ref(),
        clone_snapshot_driver: snapshot_driver.as_deref(),
        leftovers: &leftovers,
        worker_image: &ctx.options.importer_image,
        now: k8s_openapi::jiff::Timestamp::now(),
    });
    let version = o
        .claim
        .as_ref()
        .and_then(|c| c.metadata.resource_version.as_deref());
    execute(&ctx, &dv, version, plan).await
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

/// The cache subscriptions the controller is woken by.
pub struct Triggers {
    configs: Changes<CDIConfig>,
    profiles: Changes<StorageProfile>,
    classes: Changes<StorageClass>,
    claims: Changes<PersistentVolumeClaim>,
    events: Changes<Event>,
}

impl Triggers {
    pub fn subscribe(feeds: &mut crate::cache::Feeds) -> Triggers {
        Triggers {
            configs: feeds.configs.subscribe(),
            profiles: feeds.profiles.subscribe(),
            classes: feeds.classes.subscribe(),
            claims: feeds.claims.subscribe(),
            events: feeds.events.subscribe(),
        }
    }
}

/// Run the controller: DataVolumes, their claims, and the config (a gate change re-evaluates
/// every DataVolume).
pub async fn run(ctx: Context, triggers: Triggers) -> anyhow::Result<()> {
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
        .owns_shared_stream(triggers.claims)
        // A claim's events say what it waits for (provisioning, a first consumer) and change
        // nothing the claim watch sees: they wake the DataVolume of the claim's name.
        .watches_shared_stream(triggers.events, |e: Arc<Event>| {
            let o = &e.involved_object;
            Some(ObjectRef::new(o.name.as_deref()?).within(o.namespace.as_deref()?))
        })
        // From the shared caches: the pass they wake reads them with the change in.
        .watches_shared_stream(triggers.configs, every(store.clone()))
        // A claim that could not be rendered (no access modes, no such class) can be once its
        // profile or class is fixed.
        .watches_shared_stream(triggers.profiles, unrendered(store.clone()))
        .watches_shared_stream(triggers.classes, unrendered(store))
        .run_as("datavolume", shared.metrics.clone(), shared, reconcile);
    tokio::select! {
        _ = controller => {}
        _ = gauge => {}
    }
    Ok(())
}
