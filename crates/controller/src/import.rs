//! The import controller: for claims with an import source, the importer pod (cdi-core
//! `import::importer_pod`) — none before the claim is bound when WaitForFirstConsumer is
//! honoured — and the pod's state written back onto the claim's annotations; the pod is deleted
//! when the import is done (unless retained) or failed for good.

use crate::runtime::run::RunAs;
use std::collections::BTreeMap;
use std::sync::Arc;

use cdi_api::config::CDIConfig;
use cdi_api::{ann, gate};
use cdi_core::import::{self, Settings};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::runtime::context::Context;
use crate::runtime::error::Error;

/// One pass over a claim: its importer pod, and the pod's state onto the claim.
pub async fn reconcile(
    claim: Arc<PersistentVolumeClaim>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    if !import::is_import_claim(&claim) {
        return Ok(Action::await_change());
    }
    let ns = claim.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pod_name = import::pod_name(&claim);
    ctx.caches.ready().await;
    // The store's copy: the pod's changes wake this claim after the store holds them. A pod
    // created by the previous pass and not yet seen is created again, which says 409.
    let pod = ctx.caches.pod(&ns, &pod_name);
    let cfg = ctx.caches.config();
    let Some(pod) = pod else {
        return start_pod(&ctx, &claim, &claims, &pods, &pod_name, cfg.as_ref()).await;
    };
    follow_pod(&ctx, &claim, &claims, &pods, &pod_name, &pod, cfg.as_ref()).await
}

/// No importer pod: decide whether one is due, on the claim as it is now, and create it.
async fn start_pod(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    claims: &Api<PersistentVolumeClaim>,
    pods: &Api<Pod>,
    pod_name: &str,
    cfg: Option<&CDIConfig>,
) -> Result<Action, Error> {
    let gate_on = cfg.is_some_and(|c| c.spec.gate_enabled(gate::HONOR_WAIT_FOR_FIRST_CONSUMER));
    let Some(claim) = crate::placement::due_claim(ctx, claim, gate_on, import::next).await? else {
        return Ok(Action::await_change());
    };
    create_pod(ctx, &claim, claims, pods, pod_name, cfg).await?;
    // The pod's creation wakes this claim.
    Ok(Action::await_change())
}

/// Name the importer pod on the claim, then create it (one there already is fine); a refusal
/// is said on the claim and in an event.
async fn create_pod(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    claims: &Api<PersistentVolumeClaim>,
    pods: &Api<Pod>,
    pod_name: &str,
    cfg: Option<&CDIConfig>,
) -> Result<(), Error> {
    let ns = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    // Name the pod on the claim first, so a restart finds it.
    let mut anns = BTreeMap::new();
    anns.insert(ann::IMPORT_POD_NAME.to_string(), pod_name.to_string());
    crate::objects::patch_claim(claims, claim, &anns, &BTreeMap::new()).await?;
    // The CDI resource's `spec.workload`, as the operator passes it on.
    let placement = ctx.caches.cdis().into_iter().find_map(|c| c.spec.workload);
    let worker = import::Worker {
        image: ctx.options.importer_image.clone(),
        pull_policy: ctx.options.pull_policy.clone(),
        verbosity: ctx.options.verbosity,
    };
    crate::placement::check(ctx, claim).await;
    let settings = Settings::for_claim(&worker, cfg, claim, placement);
    let spec = import::importer_pod(claim, &settings);
    match pods.create(&PostParams::default(), &spec).await {
        Ok(_) => {
            tracing::info!(claim = %format!("{ns}/{name}"), pod = %pod_name, "created importer pod");
            let over = import::refusal_over(claim);
            if !over.is_empty() {
                let patch = json!({"metadata": {"annotations": over}});
                claims
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(kube::Error::Api(e)) => {
            // Refused: said on the claim, whence it reaches the DataVolume.
            let (anns, reason, message) = import::refused_pod(claim, pod_name, &e.message);
            crate::objects::patch_claim(claims, claim, &anns, &BTreeMap::new()).await?;
            ctx.events.record(claim, true, reason, &message).await;
            return Err(kube::Error::Api(e).into());
        }
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// The importer pod there: a pod not the claim's is said; a deleted claim takes its pod; else
/// the scratch claim it asks for, and its state written onto the claim.
async fn follow_pod(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    claims: &Api<PersistentVolumeClaim>,
    pods: &Api<Pod>,
    pod_name: &str,
    pod: &Pod,
    cfg: Option<&CDIConfig>,
) -> Result<Action, Error> {
    if let Some(message) = import::foreign_pod(claim, pod_name, pod) {
        ctx.events
            .record(claim, true, "ImportTargetInUse", &message)
            .await;
        // The other pod's end sends this claim no event: look again later.
        return Ok(Action::requeue(ctx.options.resync * 5));
    }
    if claim.metadata.deletion_timestamp.is_some() {
        crate::objects::delete(pods, pod_name).await?;
        return Ok(Action::await_change());
    }
    // The importer asked for scratch space: its claim goes with the pod, owned by it.
    if import::wants_scratch(claim, pod) {
        let ns = claim.namespace().unwrap_or_default();
        let scratch = import::scratch_for(claim, pod, cfg);
        match claims.create(&PostParams::default(), &scratch).await {
            Ok(_) => {
                tracing::info!(claim = %format!("{ns}/{}", import::scratch_name(claim)), "created scratch claim")
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    write_outcome(ctx, claim, claims, pods, pod_name, pod).await
}

/// Write the pod's state onto the claim (annotations, and labels once complete) with its
/// events; delete the pod when it failed for good, or is done and not retained.
async fn write_outcome(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    claims: &Api<PersistentVolumeClaim>,
    pods: &Api<Pod>,
    pod_name: &str,
    pod: &Pod,
) -> Result<Action, Error> {
    let mut anns = claim.annotations().clone();
    let outcome = import::update_from_pod(&mut anns, pod);
    // Once, by the pass that says so on the claim (the passes the pod's deletion wakes see it
    // succeeded too), and before saying it, so a restart in between repeats it rather than
    // losing it.
    if outcome.complete && !import::is_complete(claim) {
        ctx.events
            .record(claim, false, "ImportSucceeded", "Import Successful")
            .await;
    }
    crate::objects::patch_claim(
        claims,
        claim,
        &anns,
        &if outcome.complete {
            import::labels_to_add(claim.labels(), &outcome.labels)
        } else {
            BTreeMap::new()
        },
    )
    .await?;
    if let Some(message) = &outcome.failed {
        ctx.events
            .record(claim, true, "ErrImportFailed", message)
            .await;
    }
    if outcome.fatal {
        crate::objects::delete(pods, pod_name).await?;
        return Ok(Action::await_change());
    }
    let scratch = import::scratch_just_requested(claim.annotations(), &anns);
    if outcome.complete || scratch {
        if import::delete_pod_when_done(&anns) && pod.metadata.deletion_timestamp.is_none() {
            crate::objects::delete(pods, pod_name).await?;
        }
        return Ok(Action::await_change());
    }
    // The pod's changes wake this claim (it owns the pod): a timer would only cost, once for
    // every worker waiting its turn on a busy cluster.
    Ok(Action::await_change())
}

/// The controller is woken by its claims and their worker pods.
pub type Triggers = crate::cache::ClaimsAndPods;

/// Run the controller over claims and the pods they own.
pub async fn run(ctx: Context, triggers: Triggers) -> anyhow::Result<()> {
    // The runner waits for the store's first list itself, which only one waiter may do.
    ctx.caches.ready().await;
    Controller::for_shared_stream(triggers.claims, ctx.caches.claims.clone())
        .owns_shared_stream(triggers.pods)
        .run_as("import", ctx.metrics.clone(), Arc::new(ctx), reconcile)
        .await;
    Ok(())
}
