//! Why a pass stops before any claim is planned: the claim of that name is being deleted and is
//! not this DataVolume's, its `sourceRef` stands for no source, or its source cannot be read
//! (docs/design.md#refusals-fail-fast).

use std::ops::ControlFlow::{self, Break, Continue};

use cdi_api::enums::DataVolumePhase as Phase;

use crate::claims::{claim_made_for, owned_by};
use crate::dvstatus;
use crate::source::{self, Filled, Refusal};

use super::plan::{Plan, Requeue};
use super::snapshot::Snapshot;

/// What fills the DataVolume (as [`source::check`] reads it), or the plan that stops the pass.
/// Once its claim is made, a source that can no longer be read stops nothing: the claim is
/// judged as it is.
pub(super) fn check(s: &Snapshot<'_>) -> ControlFlow<Plan, Result<Filled, Refusal>> {
    let dv = s.dv;
    if let Some(c) = s.claim
        && c.metadata.deletion_timestamp.is_some()
        && !owned_by(c, dv)
    {
        // Left by an earlier DataVolume of this name (or by no DataVolume) and still in use:
        // neither adopted nor reported as this DataVolume's, and replaced once it is gone.
        let name = dv.metadata.name.as_deref().unwrap_or("");
        let refusal = Refusal {
            reason: "ErrClaimBeingDeleted",
            message: format!(
                "PVC {name} is being deleted and is not this DataVolume's (a pod may still use \
                 it); a new claim is made once it is gone"
            ),
        };
        let status = dvstatus::claim_taken_status(dv, &refusal, s.now);
        return Break(Plan::stopped(status, Requeue::Soon));
    }
    if let Some(refusal) = s.source_ref_refusal
        && !claim_made_for(s.claim, dv)
    {
        // A DataSource's changes do not wake its DataVolumes.
        return Break(Plan::refused(
            dv,
            refusal,
            Phase::Pending,
            s.now,
            Requeue::Soon,
        ));
    }
    let filled = source::check(dv);
    if !claim_made_for(s.claim, dv)
        && let Err(refusal) = &filled
    {
        // A source a later version may fill waits (Pending); a malformed one fails.
        let phase = if refusal.reason == source::UNSUPPORTED_SOURCE {
            Phase::Pending
        } else {
            Phase::Failed
        };
        return Break(Plan::refused(dv, refusal, phase, s.now, Requeue::OnChange));
    }
    Continue(filled)
}
