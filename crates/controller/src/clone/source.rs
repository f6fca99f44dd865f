//! The clone controller (upstream's, for host-assisted copies): a bound claim annotated
//! `k8s.io/CloneRequest` gets, once its upload server is ready, a source pod in the source's
//! namespace (cdi-core `hostclone::source_pod`) with a client certificate only that server
//! takes. When the server has written the copy, the claim says `k8s.io/CloneOf` and the source
//! pod goes. The claim holds finalizer `cdi.kubevirt.io/cloneSource` while a source pod may exist:
//! the pod has no owner in another namespace to go with.

use crate::runtime::run::RunAs;
use std::collections::BTreeMap;
use std::sync::Arc;

use cdi_api::{ann, finalizer};
use cdi_core::hostclone;
use cdi_core::import::{self, Settings};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::api::PostParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use crate::runtime::context::Context;
use crate::runtime::error::Error;

/// The source claim is populated: a DataVolume's claim once the DataVolume succeeded, any other
/// claim once bound (upstream's `IsPopulated`).
pub(crate) async fn populated(
    ctx: &Context,
    source: &PersistentVolumeClaim,
) -> Result<bool, Error> {
    let bound = source.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    // A snapshot restored for a copy holds its data once provisioned; the source pod's
    // scheduling binds it (a class that waits for a first consumer).
    if cdi_core::hostclone::restored_for_copy(source).is_some() {
        return Ok(true);
    }
    let owner = source
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "DataVolume");
    let Some(owner) = owner else {
        return Ok(bound);
    };
    let dvs: Api<cdi_api::datavolume::DataVolume> =
        Api::namespaced(ctx.client.clone(), &source.namespace().unwrap_or_default());
    let succeeded = dvs.get_opt(&owner.name).await?.is_some_and(|dv| {
        dv.status.and_then(|s| s.phase) == Some(cdi_api::enums::DataVolumePhase::Succeeded)
    });
    Ok(bound && succeeded)
}

/// Which pod of the source's namespace writes the source (cdi-core `hostclone::source_in_use`
/// over the pods cache), if one does.
pub(crate) fn source_in_use(ctx: &Context, source: &PersistentVolumeClaim) -> Option<String> {
    let ns = source.namespace();
    let pods: Vec<Pod> = ctx
        .caches
        .pods
        .state()
        .iter()
        .filter(|p| p.namespace() == ns)
        .map(|p| p.as_ref().clone())
        .collect();
    hostclone::source_in_use(source, &pods)
}

/// Create the source pod and its client certificate, once the source can be read.
async fn start_source_pod(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    source_ref: &(String, String),
) -> Result<Action, Error> {
    let later = Action::requeue(ctx.options.resync * 2);
    // Checked again here: nothing reads a source the claim may not copy.
    let (granted, resource) = crate::clone::token::grant_of(ctx, source_ref);
    if !crate::clone::token::claim_allowed(ctx, claim, &granted, resource).await? {
        return Ok(Action::await_change());
    }
    let Some(source) = ctx.caches.claim(&source_ref.0, &source_ref.1) else {
        let message = format!(
            "The source pvc {}/{} doesn't exist",
            source_ref.0, source_ref.1
        );
        ctx.events
            .record(claim, true, "CloneWithoutSource", &message)
            .await;
        return Ok(later);
    };
    if !populated(ctx, &source).await? {
        let message = format!(
            "{} {}/{}: the copy starts once it is",
            cdi_core::hostclone::SOURCE_NOT_POPULATED,
            source_ref.0,
            source_ref.1
        );
        ctx.events
            .record(
                claim,
                false,
                cdi_core::hostclone::CLONE_SOURCE_NOT_POPULATED,
                &message,
            )
            .await;
        return Ok(later);
    }
    if let Some(message) = source_in_use(ctx, &source) {
        ctx.events
            .record(claim, true, hostclone::CLONE_SOURCE_IN_USE, &message)
            .await;
        return Ok(later);
    }
    let pki = ctx
        .upload_pki
        .get(&ctx.client, &ctx.options.namespace)
        .await?;
    let worker = import::Worker {
        image: ctx.options.cloner_image.clone(),
        pull_policy: ctx.options.pull_policy.clone(),
        verbosity: ctx.options.verbosity,
    };
    let placement = ctx.caches.cdis().into_iter().find_map(|c| c.spec.workload);
    let mut settings = Settings::for_claim(&worker, ctx.caches.config().as_ref(), claim, placement);
    // The source pod goes to the source, not to where the target's consumer was placed.
    settings.inherited.clear();
    let spec = hostclone::source_pod(claim, &source, &settings, &pki.server_bundle);
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &source_ref.0);
    let pod = match pods_api.create(&PostParams::default(), &spec).await {
        Ok(pod) => {
            tracing::info!(claim = %format!("{}/{}", claim.namespace().unwrap_or_default(), claim.name_any()),
                pod = %format!("{}/{}", source_ref.0, pod.name_any()), "created clone source pod");
            pod
        }
        Err(kube::Error::Api(e)) if e.code == 409 => pods_api.get(&spec.name_any()).await?,
        Err(kube::Error::Api(e)) => {
            let message = format!("Error starting pod '{}': {}", spec.name_any(), e.message);
            ctx.events
                .record(claim, true, import::refusal_reason(&e.message), &message)
                .await;
            return Err(kube::Error::Api(e).into());
        }
        Err(e) => return Err(e.into()),
    };
    ensure_secret(ctx, claim, source_ref, &pod).await?;
    Ok(Action::await_change())
}

/// The source pod's client certificate, made while the pod waits for it (again after a pass
/// that failed to make it). Its name is the clone's own, never read from the claim: an
/// annotation a user can edit must not choose whose client a certificate says it is.
async fn ensure_secret(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    source_ref: &(String, String),
    pod: &Pod,
) -> Result<(), Error> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &source_ref.0);
    if secrets.get_opt(&pod.name_any()).await?.is_some() {
        return Ok(());
    }
    let pki = ctx
        .upload_pki
        .get(&ctx.client, &ctx.options.namespace)
        .await?;
    let cert = pki
        .client_ca
        .client_cert(
            &hostclone::client_name(source_ref, claim),
            // Made once for the pod, which may wait long to start: not renewed, so long-lived.
            cdi_pki::ca::CLIENT_LIFETIME,
        )
        .map_err(|e| Error::Other(e.to_string()))?;
    crate::objects::create(
        &secrets,
        &hostclone::client_secret(pod, &cert.cert_pem, &cert.key_pem),
    )
    .await?;
    Ok(())
}

/// The claim's source pod, when the pod of that name in `namespace` is the one made for this
/// claim (its clone-source label and its `storage.ownerRef`).
fn own_source_pod(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    namespace: &str,
) -> Option<Arc<Pod>> {
    let pod = ctx
        .caches
        .pod(namespace, &hostclone::source_pod_name(claim))?;
    let owner = format!(
        "{}/{}",
        claim.namespace().unwrap_or_default(),
        claim.name_any()
    );
    let labelled = pod
        .labels()
        .get(cdi_api::label::COMPONENT)
        .map(String::as_str)
        == Some(cdi_api::label::CLONE_SOURCE_COMPONENT);
    (labelled && pod.annotations().get(ann::OWNER_REF) == Some(&owner)).then_some(pod)
}

/// Let go of the claim: its source pod deleted (by name: the cache may not hold a pod just
/// made), unless kept for debugging once it ended, then the finalizer.
async fn release(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    namespace: &str,
    holds: bool,
) -> Result<Action, Error> {
    let pod = own_source_pod(ctx, claim, namespace);
    let ended = pod.as_ref().is_some_and(|p| {
        matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
    });
    let keep = ended && !import::delete_pod_when_done(claim.annotations());
    let foreign = ctx
        .caches
        .pod(namespace, &hostclone::source_pod_name(claim))
        .is_some()
        && pod.is_none();
    if !keep && !foreign {
        crate::objects::delete(
            &Api::<Pod>::namespaced(ctx.client.clone(), namespace),
            &hostclone::source_pod_name(claim),
        )
        .await?;
    }
    if holds {
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(ctx.client.clone(), &claim.namespace().unwrap_or_default());
        crate::objects::set_finalizer(&claims, claim, finalizer::CLONE_SOURCE, false).await?;
    }
    Ok(Action::await_change())
}

/// One pass over a clone target claim.
pub async fn reconcile(
    claim: Arc<PersistentVolumeClaim>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let ns = claim.namespace().unwrap_or_default();
    let holds = claim
        .finalizers()
        .iter()
        .any(|f| f == finalizer::CLONE_SOURCE);
    ctx.caches.ready().await;
    let Some(source) = hostclone::clone_request(&claim) else {
        if holds {
            // The request was removed (or spoiled) mid-clone: whatever source pod it had goes.
            let made_in = ctx
                .caches
                .pods
                .state()
                .into_iter()
                .find(|p| p.name_any() == hostclone::source_pod_name(&claim))
                .and_then(|p| p.namespace())
                .unwrap_or_else(|| ns.clone());
            return release(&ctx, &claim, &made_in, holds).await;
        }
        return Ok(Action::await_change());
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    if claim.metadata.deletion_timestamp.is_some() || hostclone::is_done(&claim) {
        return release(&ctx, &claim, &source.0, holds).await;
    }
    // Nothing of another namespace is touched (no pod read, made or deleted there).
    let (granted, resource) = crate::clone::token::grant_of(&ctx, &source);
    if !crate::clone::token::claim_allowed(&ctx, &claim, &granted, resource).await? {
        return Ok(Action::await_change());
    }
    let pod_name = hostclone::source_pod_name(&claim);
    let pod = own_source_pod(&ctx, &claim, &source.0);
    let anns = claim.annotations().clone();
    let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if !bound {
        return Ok(Action::await_change());
    }
    if !holds || anns.get(ann::CLONE_SOURCE_POD_NAME) != Some(&pod_name) {
        let named = BTreeMap::from([(ann::CLONE_SOURCE_POD_NAME.to_string(), pod_name)]);
        crate::objects::patch_claim(&claims, &claim, &named, &BTreeMap::new()).await?;
        let fresh = claims.get(&claim.name_any()).await?;
        crate::objects::set_finalizer(&claims, &fresh, finalizer::CLONE_SOURCE, true).await?;
        return Ok(Action::await_change());
    }

    let upload_done = anns.get(ann::POD_PHASE).map(String::as_str) == Some("Succeeded");
    let mut wanted = anns.clone();
    let source_ended = match &pod {
        Some(pod) => hostclone::update_from_source_pod(&mut wanted, pod),
        None => true,
    };
    if upload_done && source_ended {
        wanted.insert(ann::CLONE_OF.into(), "true".into());
        crate::objects::patch_claim(&claims, &claim, &wanted, &BTreeMap::new()).await?;
        ctx.events
            .record(claim.as_ref(), false, "CloneSucceeded", "Clone Complete")
            .await;
        return Ok(Action::await_change());
    }
    crate::objects::patch_claim(&claims, &claim, &wanted, &BTreeMap::new()).await?;
    if let Some(pod) = &pod {
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending") {
            ensure_secret(&ctx, &claim, &source, pod).await?;
        }
        // The source pod's changes wake this claim.
        return Ok(Action::await_change());
    }
    if upload_done {
        return Ok(Action::await_change());
    }
    let ready = anns.get(ann::POD_READY).map(String::as_str) == Some("true");
    if !ready {
        // The upload server's readiness is written onto the claim, which wakes this pass.
        return Ok(Action::await_change());
    }
    start_source_pod(&ctx, &claim, &source).await
}

/// The controller is woken by its claims and their worker pods.
pub type Triggers = crate::cache::ClaimsAndPods;

/// Run the controller over clone target claims; a source pod wakes the claim its
/// `storage.ownerRef` annotation names (it has no owner reference across namespaces).
pub async fn run(ctx: Context, triggers: Triggers) -> anyhow::Result<()> {
    ctx.caches.ready().await;
    // Only clone targets (and claims still holding the finalizer) are passed over: the others
    // would each cost a pass that does nothing.
    let ours = triggers.claims.filter(|c: &Arc<PersistentVolumeClaim>| {
        futures::future::ready(
            hostclone::clone_request(c).is_some()
                || c.finalizers().iter().any(|f| f == finalizer::CLONE_SOURCE),
        )
    });
    Controller::for_shared_stream(ours, ctx.caches.claims.clone())
        .watches_shared_stream(triggers.pods, |pod: Arc<Pod>| {
            let owner = pod.annotations().get(ann::OWNER_REF)?;
            let (ns, name) = owner.split_once('/')?;
            Some(ObjectRef::new(name).within(ns))
        })
        .run_as(
            "clone-source",
            ctx.metrics.clone(),
            Arc::new(ctx),
            reconcile,
        )
        .await;
    Ok(())
}
