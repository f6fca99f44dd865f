//! The DataVolume decision: a snapshot of what the controller observed goes in, a plan comes out
//! (the claim to create or adopt, annotations to write, companion objects, the status, the
//! events, when to look again). The controller only observes and executes.
//!
//! What differs between source kinds is one [`Kind`]: import (http and blank, classic or through
//! the populator), upload and external population today; clone and snapshot are more kinds, not
//! branches of these.
//!
//! [`decide`] reads as its steps, one file each: `refused` (stop before any claim),
//! `new_claim` or `existing_claim` (plan the claim), the kind's status, `cleanup` (what
//! goes, the finalizer) and `consumer` (the first-consumer pod). What goes in is
//! [`Snapshot`], what comes out is [`Plan`]; [`refs`] holds what a DataVolume names, shared
//! with the status, clone and first-consumer modules.

use cdi_api::datavolume::DataVolume;
use cdi_api::enums::DataVolumePhase as Phase;
use cdi_api::gate;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use std::ops::ControlFlow::{Break, Continue};

use crate::dvstatus::{Computed, Observed};

mod bound;
mod cleanup;
mod companions;
mod consumer;
mod existing_claim;
mod kinds;
mod new_claim;
mod plan;
pub mod refs;
mod refused;
mod snapshot;

pub use bound::{COMPONENT, bound_condition};
pub use companions::{
    clone_source, clone_source_name, import_source, import_source_name, snapshot_fallback_claim,
    snapshot_fallback_name, upload_source,
};
pub use kinds::{Clone, ExternalPopulation, Import, Kind, Upload, kind_of};
pub use plan::{ClaimStep, Companion, Leftover, Plan, PodStep, Requeue};
pub use refs::{clone_source_of, holds_finalizer, made_for, owner_reference, snapshot_source_of};
pub use snapshot::Snapshot;

/// Decide what to do about a DataVolume: stop early for what refuses it; else plan its claim
/// (new or existing), read its status from the claim as this pass leaves it, and clean up,
/// place and poll from there.
pub fn decide(s: &Snapshot<'_>) -> Plan {
    if s.dv.metadata.deletion_timestamp.is_some() {
        return cleanup::deleting(s);
    }
    let filled = match refused::check(s) {
        Continue(filled) => filled,
        Break(stopped) => return stopped,
    };
    let kind = kind_of(&filled);
    let mut plan = Plan::idle();
    let planned = match s.claim {
        None => new_claim::plan(s, &filled, kind, &mut plan).map_continue(|c| (c, false)),
        Some(c) => existing_claim::plan(s, c, &mut plan),
    };
    let (claim, populated) = match planned {
        Continue(planned) => planned,
        Break(stopped) => return stopped,
    };
    let status = kind.status(&observe(s, &claim, populated), s);
    plan.delete = cleanup::finished(s, kind, &claim, &status);
    consumer::placement(s, &claim, status.status.phase.as_ref(), &mut plan);
    cleanup::finalizer(s, &mut plan);
    plan.requeue = requeue(s.dv, &status);
    plan.status = Some(status);
    plan
}

/// What the status is read from: the claim as this pass leaves it, whether its class binds
/// WaitForFirstConsumer and whether that is honoured, and the worker's progress.
fn observe<'a>(
    s: &Snapshot<'a>,
    claim: &'a PersistentVolumeClaim,
    populated: bool,
) -> Observed<'a> {
    let class = kinds::class_of(s, Some(claim));
    let class_wffc =
        class.and_then(|c| c.volume_binding_mode.as_deref()) == Some("WaitForFirstConsumer");
    Observed {
        dv: s.dv,
        claim: Some(claim),
        class_wffc,
        honor_wffc: s
            .config
            .is_some_and(|c| c.spec.gate_enabled(gate::HONOR_WAIT_FOR_FIRST_CONSUMER)),
        populated,
        progress: s.progress.clone(),
        populator: None,
        now: s.now,
    }
}

/// Progress is read from the running worker (an importer, or a copy's source pod), which
/// sends no events when it changes (as upstream: only while it runs). A scheduled worker's
/// start, the claim's binding and the claim's events all wake this controller: looking again
/// without one would only cost, for every DataVolume waiting its turn.
fn requeue(dv: &DataVolume, status: &Computed) -> Requeue {
    let in_progress =
        |p: Option<&Phase>| matches!(p, Some(Phase::ImportInProgress | Phase::CloneInProgress));
    let running = in_progress(dv.status.as_ref().and_then(|s| s.phase.as_ref()))
        || in_progress(status.status.phase.as_ref());
    if running {
        Requeue::Soon
    } else {
        Requeue::OnChange
    }
}

#[cfg(test)]
mod tests;
