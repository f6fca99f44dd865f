//! What goes, and when: a deleted DataVolume's leftovers before its finalizer comes off, a
//! populator's source once the work succeeded, a snapshot restored for a copy once the copy is
//! done; and the finalizer, held while anything made for the DataVolume lives in another
//! namespace.

use cdi_api::enums::DataVolumePhase as Phase;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::dvstatus::Computed;

use super::kinds::Kind;
use super::plan::{Companion, Leftover, Plan};
use super::refs::holds_finalizer;
use super::snapshot::Snapshot;

/// A DataVolume being deleted: what it owns goes with it; what it made elsewhere goes before
/// its finalizer.
pub(super) fn deleting(s: &Snapshot<'_>) -> Plan {
    let mut plan = Plan::idle();
    if holds_finalizer(s.dv) {
        plan.delete = s.leftovers.to_vec();
        plan.finalizer = Some(false);
    }
    plan
}

/// What the kind's finished work leaves to delete; a snapshot restored for a copy goes once
/// the copy is done.
pub(super) fn finished(
    s: &Snapshot<'_>,
    kind: &dyn Kind,
    claim: &PersistentVolumeClaim,
    status: &Computed,
) -> Vec<Leftover> {
    let mut delete = kind.finished(s.dv, claim, status);
    if crate::clone::host::is_done(claim) {
        delete.extend(
            s.leftovers
                .iter()
                .filter(|l| matches!(l, Leftover::RestoreClaim { .. }))
                .cloned(),
        );
    }
    delete
}

/// The finalizer is added before anything is made in another namespace, and removed once the
/// DataVolume succeeded, after what it made elsewhere is deleted.
pub(super) fn finalizer(s: &Snapshot<'_>, plan: &mut Plan) {
    let dv = s.dv;
    let own = dv.metadata.namespace.as_deref().unwrap_or("");
    let elsewhere = plan.create.iter().any(|c| match c {
        Companion::CloneSource(o) => o.metadata.namespace.as_deref() != Some(own),
        Companion::RestoreClaim(o) => o.metadata.namespace.as_deref() != Some(own),
        Companion::ImportSource(_) | Companion::UploadSource(_) => false,
    });
    let said = |p: Option<&Phase>| p == Some(&Phase::Succeeded);
    let succeeded = said(dv.status.as_ref().and_then(|s| s.phase.as_ref()));
    if holds_finalizer(dv) {
        if succeeded {
            for l in s.leftovers {
                if !plan.delete.contains(l) {
                    plan.delete.push(l.clone());
                }
            }
            plan.finalizer = Some(false);
        }
    } else if elsewhere {
        plan.finalizer = Some(true);
    }
}
