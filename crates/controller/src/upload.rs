//! The upload controller: for upload-target claims, the upload pod (cdi-core
//! `upload::upload_pod`) — none before the claim is bound when WaitForFirstConsumer is honoured —
//! with its Service and its serving certificate, and the pod's state written back onto the claim
//! (`storage.pod.phase`, `storage.pod.ready`). The pod goes when the upload is done (unless
//! retained); a server whose deadline passed unused is replaced, and so is one that asked for
//! scratch space (an image that does not convert as it streams in), by one with a scratch claim.
//!
//! The certificate authorities of the upload path live in Secrets in the controller's namespace
//! (upstream's names): `cdi-uploadserver-signer` signs upload servers' certificates,
//! `cdi-uploadserver-client-signer` the upload proxy's client certificate
//! (`cdi-uploadserver-client-cert`); ConfigMaps `…-bundle` publish their certificates.

use crate::runtime::run::RunAs;
use std::collections::BTreeMap;
use std::sync::Arc;

use cdi_api::config::CDIConfig;
use cdi_api::{ann, gate};
use cdi_core::import::{self, Settings};
use cdi_core::{hostclone, upload};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::runtime::context::Context;
use crate::runtime::error::Error;

/// The lifetimes the active CDI resource's `spec.certConfig` asks for (upstream's defaults
/// without one, or with one the operator reports unusable): upload servers' certificates follow
/// `server`.
pub(crate) fn lifetimes(ctx: &Context) -> cdi_pki::rotation::Lifetimes {
    let cdis = ctx.caches.cdis();
    let spec = cdi_core::install::active(&cdis).and_then(|c| c.spec.cert_config.as_ref());
    cdi_pki::rotation::Lifetimes::from_spec(spec).unwrap_or_default()
}

/// Create the upload pod, then what it needs: its Service, its certificate Secret and (when a
/// server asked for it) its scratch claim.
async fn start_pod(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    settings: &Settings,
) -> Result<(), Error> {
    let ns = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pod_name = upload::pod_name(claim);
    // The server's certificate is signed once the pod is there: the CA first.
    ctx.upload_pki
        .get(&ctx.client, &ctx.options.namespace)
        .await?;
    // Replaced when its certificate is due (upstream's refresh), if still unused.
    let refresh = lifetimes(ctx).server.renew_at(std::time::SystemTime::now());
    let deadline = k8s_openapi::jiff::Timestamp::try_from(refresh)
        .map_err(|e| Error::Other(format!("the upload server's deadline: {e}")))?;
    let spec = upload::upload_pod(claim, settings, deadline);
    let pod = match pods.create(&PostParams::default(), &spec).await {
        Ok(pod) => {
            tracing::info!(claim = %format!("{ns}/{name}"), pod = %pod_name, "created upload pod");
            pod
        }
        Err(kube::Error::Api(e)) if e.code == 409 => pods.get(&pod_name).await?,
        Err(kube::Error::Api(e)) => {
            let (anns, reason, message) = import::refused_pod(claim, &pod_name, &e.message);
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
            crate::objects::patch_claim(&claims, claim, &anns, &BTreeMap::new()).await?;
            ctx.events.record(claim, true, reason, &message).await;
            return Err(kube::Error::Api(e).into());
        }
        Err(e) => return Err(e.into()),
    };
    crate::objects::create(
        &Api::<Service>::namespaced(ctx.client.clone(), &ns),
        &upload::service(claim, &pod_name),
    )
    .await?;
    pod_needs(ctx, claim, &pod).await
}

/// What the pod waits for, owned by it so that it goes with it: its certificate Secret and,
/// when a server asked for it, its scratch claim. Made again while the pod is pending: the
/// ones of a pod it replaced may have been in the way until they went with that pod.
async fn pod_needs(ctx: &Context, claim: &PersistentVolumeClaim, pod: &Pod) -> Result<(), Error> {
    let ns = claim.namespace().unwrap_or_default();
    let pod_name = pod.name_any();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let ours =
        |owners: Option<&Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>| {
            owners
                .into_iter()
                .flatten()
                .any(|o| Some(&o.uid) == pod.metadata.uid.as_ref())
        };
    match secrets.get_opt(&pod_name).await? {
        Some(s) if ours(s.metadata.owner_references.as_ref()) => {}
        found => {
            if found.is_some() {
                crate::objects::delete(&secrets, &pod_name).await?;
            }
            let pki = ctx
                .upload_pki
                .get(&ctx.client, &ctx.options.namespace)
                .await?;
            let service = upload::service_name(&pod_name);
            let cert = pki
                .server_ca
                .server_cert(
                    &upload::server_names(&ns, &service),
                    lifetimes(ctx).server.lifetime,
                )
                .map_err(|e| Error::Other(e.to_string()))?;
            let secret =
                upload::cert_secret(pod, &cert.cert_pem, &cert.key_pem, &pki.client_bundle);
            crate::objects::create(&secrets, &secret).await?;
        }
    }
    if upload::wants_scratch(claim) {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
        let scratch = import::scratch_for(claim, pod, ctx.caches.config().as_ref());
        match claims.get_opt(&import::scratch_name(claim)).await? {
            Some(c) if ours(c.metadata.owner_references.as_ref()) => {}
            // Another pod's, on its way out with it: made once it is gone.
            Some(_) => {}
            None => {
                crate::objects::create(&claims, &scratch).await?;
                tracing::info!(claim = %format!("{ns}/{}", import::scratch_name(claim)), "created scratch claim");
            }
        }
    }
    Ok(())
}

/// One pass over a claim: its upload pod and what goes with it, and the pod's state onto the
/// claim.
pub async fn reconcile(
    claim: Arc<PersistentVolumeClaim>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    if !upload::is_upload_claim(&claim) {
        if let Some(message) = upload::both_upload_and_clone(&claim) {
            ctx.events
                .record(claim.as_ref(), true, "ErrClaimNotValid", &message)
                .await;
        }
        return Ok(Action::await_change());
    }
    let ns = claim.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pod_name = upload::pod_name(&claim);
    ctx.caches.ready().await;
    let pod = ctx.caches.pod(&ns, &pod_name);
    let cfg = ctx.caches.config();
    let Some(pod) = pod else {
        return make_pod(&ctx, &claim, &claims, &pod_name, cfg.as_ref()).await;
    };
    follow_pod(&ctx, &claim, &claims, &pods, &pod_name, &pod).await
}

/// No upload pod: decide whether one is due, on the claim as it is now, and create it.
async fn make_pod(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    claims: &Api<PersistentVolumeClaim>,
    pod_name: &str,
    cfg: Option<&CDIConfig>,
) -> Result<Action, Error> {
    let gate_on = cfg.is_some_and(|c| c.spec.gate_enabled(gate::HONOR_WAIT_FOR_FIRST_CONSUMER));
    let Some(claim) = crate::placement::due_claim(ctx, claim, gate_on, upload::next).await? else {
        return Ok(Action::await_change());
    };
    create_pod(ctx, claim, claims, pod_name, cfg).await
}

/// Name the upload pod on the claim (and a clone target's client, once its source checks
/// out), then start the pod from the claim as patched.
async fn create_pod(
    ctx: &Context,
    claim: PersistentVolumeClaim,
    claims: &Api<PersistentVolumeClaim>,
    pod_name: &str,
    cfg: Option<&CDIConfig>,
) -> Result<Action, Error> {
    let mut anns = BTreeMap::from([(ann::UPLOAD_POD_NAME.to_string(), pod_name.to_string())]);
    if let Some(source) = hostclone::clone_request(&claim) {
        match clone_target_checks(ctx, &claim, &source).await {
            Some(client) => {
                anns.insert(ann::UPLOAD_CLIENT_NAME.into(), client);
            }
            None => return Ok(Action::requeue(ctx.options.resync * 5)),
        }
    }
    // Name the pod on the claim first, so a restart finds it.
    crate::objects::patch_claim(claims, &claim, &anns, &BTreeMap::new()).await?;
    // The pod is made from the claim as patched (a clone's client name).
    let mut claim = claim;
    claim
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .extend(anns);
    let placement = ctx.caches.cdis().into_iter().find_map(|c| c.spec.workload);
    let worker = import::Worker {
        image: ctx.options.upload_server_image.clone(),
        pull_policy: ctx.options.pull_policy.clone(),
        verbosity: ctx.options.verbosity,
    };
    crate::placement::check(ctx, &claim).await;
    let settings = Settings::for_claim(&worker, cfg, &claim, placement);
    start_pod(ctx, &claim, &settings).await?;
    let over = import::refusal_over(&claim);
    if !over.is_empty() {
        let patch = json!({"metadata": {"annotations": over}});
        claims
            .patch(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
    }
    // The pod's creation wakes this claim.
    Ok(Action::await_change())
}

/// The upload pod there: a pod not the claim's is said; a deleted claim takes its pod; a
/// pending pod gets what it needs; then its state is written onto the claim.
async fn follow_pod(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    claims: &Api<PersistentVolumeClaim>,
    pods: &Api<Pod>,
    pod_name: &str,
    pod: &Pod,
) -> Result<Action, Error> {
    if let Some(message) = upload::foreign_pod(claim, pod) {
        ctx.events
            .record(claim, true, "UploadTargetInUse", &message)
            .await;
        return Ok(Action::requeue(ctx.options.resync * 5));
    }
    if claim.metadata.deletion_timestamp.is_some() {
        crate::objects::delete(pods, pod_name).await?;
        return Ok(Action::await_change());
    }
    let pending = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending");
    if pending && pod.metadata.deletion_timestamp.is_none() {
        pod_needs(ctx, claim, pod).await?;
    }
    write_outcome(ctx, claim, claims, pods, pod_name, pod).await
}

/// Write the pod's state onto the claim with its events; replace a server past its deadline
/// or asking for scratch space; once done, delete the pod (unless retained) and its Service.
async fn write_outcome(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    claims: &Api<PersistentVolumeClaim>,
    pods: &Api<Pod>,
    pod_name: &str,
    pod: &Pod,
) -> Result<Action, Error> {
    let mut anns = claim.annotations().clone();
    let outcome = upload::update_from_pod(&mut anns, pod);
    // A clone's completion is told by the clone controller.
    if outcome.complete && !upload::is_complete(claim) && !upload::is_clone_target(claim) {
        ctx.events
            .record(claim, false, "UploadSucceeded", "Upload Successful")
            .await;
    }
    crate::objects::patch_claim(claims, claim, &anns, &BTreeMap::new()).await?;
    if let Some(message) = &outcome.failed {
        ctx.events
            .record(claim, true, "UploadFailed", message)
            .await;
    }
    // An unused server past its deadline is replaced (with a fresh certificate), and one that
    // asked for scratch space by one that has it.
    if upload::deadline_passed(pod) || import::scratch_just_requested(claim.annotations(), &anns) {
        crate::objects::delete(pods, pod_name).await?;
        return Ok(Action::await_change());
    }
    if outcome.complete {
        if import::delete_pod_when_done(&anns) && pod.metadata.deletion_timestamp.is_none() {
            crate::objects::delete(pods, pod_name).await?;
        }
        let ns = claim.namespace().unwrap_or_default();
        crate::objects::delete(
            &Api::<Service>::namespaced(ctx.client.clone(), &ns),
            &upload::service_name(pod_name),
        )
        .await?;
    }
    Ok(Action::await_change())
}

/// A clone target's upload server starts only for a source that exists and fits (upstream's
/// clone validation in its upload controller): the client name its server is to take, or `None`
/// after an event saying what is wrong (looked at again later: the source's changes do not wake
/// the target). A target that does not fit also says so in its running condition, which its
/// DataVolume's Running condition shows (the event alone is easily missed).
async fn clone_target_checks(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    source: &(String, String),
) -> Option<String> {
    let (granted, resource) = crate::clone::token::grant_of(ctx, source);
    match crate::clone::token::claim_allowed(ctx, claim, &granted, resource).await {
        Ok(true) => {}
        Ok(false) => return None,
        Err(e) => {
            tracing::warn!(error = %e, "reading the clone token keys");
            return None;
        }
    }
    let Some(found) = ctx.caches.claim(&source.0, &source.1) else {
        let message = format!("The source pvc {}/{} doesn't exist", source.0, source.1);
        ctx.events
            .record(claim, true, "CloneWithoutSource", &message)
            .await;
        return None;
    };
    if let Err(message) = hostclone::validate_with(&found, claim, ctx.caches.config().as_ref()) {
        let anns = BTreeMap::from([
            (ann::RUNNING_CONDITION.to_string(), "false".to_string()),
            (
                ann::RUNNING_CONDITION_REASON.into(),
                "ErrIncompatiblePVC".into(),
            ),
            (ann::RUNNING_CONDITION_MESSAGE.into(), message.clone()),
        ]);
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(ctx.client.clone(), &claim.namespace().unwrap_or_default());
        if let Err(e) = crate::objects::patch_claim(&claims, claim, &anns, &BTreeMap::new()).await {
            tracing::warn!(error = %e, "writing the clone target's running condition");
        }
        ctx.events
            .record(claim, true, "ErrIncompatiblePVC", &message)
            .await;
        return None;
    }
    Some(hostclone::client_name(source, claim))
}

/// The controller is woken by its claims and their worker pods.
pub type Triggers = crate::cache::ClaimsAndPods;

/// Run the controller over claims and the pods they own.
pub async fn run(ctx: Context, triggers: Triggers) -> anyhow::Result<()> {
    // The proxy and the token API need the certificates and the key before any upload claim.
    let early = ctx.clone();
    tokio::spawn(async move {
        while let Err(e) = early
            .upload_pki
            .get(&early.client, &early.options.namespace)
            .await
        {
            tracing::warn!(error = %e, namespace = %early.options.namespace, "making the upload certificates; trying again");
            tokio::time::sleep(early.options.resync * 10).await;
        }
    });
    ctx.caches.ready().await;
    Controller::for_shared_stream(triggers.claims, ctx.caches.claims.clone())
        .owns_shared_stream(triggers.pods)
        .run_as("upload", ctx.metrics.clone(), Arc::new(ctx), reconcile)
        .await;
    Ok(())
}
