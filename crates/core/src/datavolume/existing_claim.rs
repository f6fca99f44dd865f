//! A DataVolume whose claim exists: its own (whose Pending wait is copied onto it), one it may
//! adopt (pre-populated, or allowed by the config), or one it may not take.

use std::ops::ControlFlow::{self, Break, Continue};

use cdi_api::ann;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::claims::{adoptable, owned_by, populated_for};
use crate::dvstatus::{self, Event};
use crate::source::Refusal;

use super::bound::{bound_condition, with_annotations};
use super::plan::{ClaimStep, Plan, Requeue};
use super::refs::owner_reference;
use super::snapshot::Snapshot;

/// The claim as the next observation will see it (with this pass's annotations), and whether
/// it already holds the DataVolume's data; or the plan that stops the pass.
pub(super) fn plan(
    s: &Snapshot<'_>,
    c: &PersistentVolumeClaim,
    plan: &mut Plan,
) -> ControlFlow<Plan, (PersistentVolumeClaim, bool)> {
    let dv = s.dv;
    let mut populated = populated_for(c, dv);
    let has_controller = c
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true));
    if owned_by(c, dv) {
        plan.claim_annotations = bound_condition(c, s.claim_events);
    } else if !has_controller && adoptable(c, dv, s.config) {
        adopt(s, c, plan);
        populated = true;
    } else if !populated {
        return Break(taken(s));
    }
    Continue((with_annotations(c, &plan.claim_annotations), populated))
}

/// Take the claim over: the DataVolume joins its owners and marks it populated for itself.
fn adopt(s: &Snapshot<'_>, c: &PersistentVolumeClaim, plan: &mut Plan) {
    let name = s.dv.metadata.name.clone().unwrap_or_default();
    let mut owners = c.metadata.owner_references.clone().unwrap_or_default();
    owners.extend(owner_reference(s.dv));
    plan.claim = ClaimStep::Adopt(owners);
    plan.claim_annotations
        .insert(ann::POPULATED_FOR.into(), Some(name.clone()));
    plan.events.push(Event::normal(
        "Bound",
        format!("Adopted existing claim {name}"),
    ));
}

/// Someone else's claim holds the name: the DataVolume says so and how to resolve it.
fn taken(s: &Snapshot<'_>) -> Plan {
    let name = s.dv.metadata.name.as_deref().unwrap_or("");
    let refusal = Refusal {
        reason: "ErrResourceExists",
        message: format!(
            "Resource \"{name}\" already exists and is not managed by DataVolume; \
             delete the claim, or annotate the DataVolume {} to adopt it",
            ann::PRE_POPULATED
        ),
    };
    // The status records the event once, when it first says so.
    let status = dvstatus::claim_taken_status(s.dv, &refusal, s.now);
    Plan::stopped(status, Requeue::OnChange)
}
