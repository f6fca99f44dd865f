//! Placement beyond upstream (docs/design.md#worker-pods-follow-the-first-consumer): an unknown
//! `worker-placement` value is said, and the temporary first-consumer pod
//! (docs/design.md#a-first-consumer-without-kubevirt) is made and deleted.

use cdi_api::ann;
use cdi_api::enums::DataVolumePhase as Phase;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::claims::owned_by;
use crate::dvstatus::Event;

use super::bound::phase_of;
use super::plan::{Plan, PodStep};
use super::snapshot::Snapshot;

/// Placement beyond upstream (docs/design.md#worker-pods-follow-the-first-consumer): an unknown `worker-placement` value is said; the
/// first-consumer pod is made while the DataVolume waits for a consumer and none has chosen the
/// claim's node, and deleted once its work is done (the wait is over and what worker pods
/// inherit from it is recorded).
pub(super) fn placement(
    s: &Snapshot<'_>,
    claim: &PersistentVolumeClaim,
    phase: Option<&Phase>,
    plan: &mut Plan,
) {
    let dv = s.dv;
    let what = format!(
        "DataVolume {}/{}",
        dv.metadata.namespace.as_deref().unwrap_or(""),
        dv.metadata.name.as_deref().unwrap_or("")
    );
    if let Some(message) =
        crate::placement::placement_refused(dv.metadata.annotations.as_ref(), &what)
    {
        plan.events
            .push(Event::warning(crate::placement::ERR_PLACEMENT, message));
    }
    let waiting = matches!(
        phase,
        Some(Phase::WaitForFirstConsumer | Phase::PendingPopulation)
    );
    let anns = claim.metadata.annotations.as_ref();
    let selected = anns
        .and_then(|a| a.get(ann::SELECTED_NODE))
        .is_some_and(|n| !n.is_empty());
    if let Some(pod) = s.first_consumer {
        let ended = matches!(phase, Some(Phase::Succeeded | Phase::Failed));
        let recorded = anns.is_some_and(|a| a.contains_key(cdi_api::ext::WORKER_TOLERATIONS))
            || !crate::placement::follows_consumer(claim, s.config);
        if ended || (!waiting && recorded) || crate::first_consumer::template(dv).is_none() {
            plan.first_consumer = pod.metadata.name.clone().map(PodStep::Delete);
        } else if let Some(reason) = crate::first_consumer::unschedulable(pod) {
            plan.events.push(Event::warning(
                crate::first_consumer::UNSCHEDULABLE,
                format!(
                    "the first-consumer pod {} of {what} cannot be scheduled: {reason}; \
                     change the {} template, or the nodes",
                    pod.metadata.name.as_deref().unwrap_or(""),
                    cdi_api::ext::FIRST_CONSUMER
                ),
            ));
        }
        return;
    }
    if !waiting || selected || !owned_by(claim, dv) || phase_of(claim) != Some("Pending") {
        return;
    }
    match crate::first_consumer::template(dv) {
        None => {}
        Some(Err(message)) => plan
            .events
            .push(Event::warning(crate::first_consumer::ERR_TEMPLATE, message)),
        Some(Ok(t)) => {
            let name = claim.metadata.name.as_deref().unwrap_or("");
            let pod = crate::first_consumer::pod(dv, name, &t, s.worker_image);
            plan.first_consumer = Some(PodStep::Create(Box::new(pod)));
        }
    }
}
