//! A DataVolume without a claim: what a clone copies must exist, be ready and fit first; then
//! the claim is rendered (docs/design.md#rendering-the-claim) and made, after the companions
//! its path needs.

use std::ops::ControlFlow::{self, Break, Continue};

use cdi_api::ann;
use cdi_api::datavolume::{DataVolume, SourceKind};
use cdi_api::enums::DataVolumePhase as Phase;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::dvstatus::Event;
use crate::render::{self, RenderContext, RenderedClaim};
use crate::source::{Filled, Refusal};

use super::companions::{snapshot_fallback_claim, snapshot_fallback_name};
use super::kinds::Kind;
use super::plan::{ClaimStep, Companion, Plan, Requeue};
use super::refs::{clone_source_of, snapshot_source_of};
use super::snapshot::Snapshot;

/// The claim to create, as the API server will hold it (Pending), with the companions, events
/// and DataVolume annotations it brings added to `plan`; or the plan that stops the pass.
pub(super) fn plan(
    s: &Snapshot<'_>,
    filled: &Result<Filled, Refusal>,
    kind: &dyn Kind,
    plan: &mut Plan,
) -> ControlFlow<Plan, PersistentVolumeClaim> {
    let dv = s.dv;
    let from = clone_from(s, filled)?;
    let mut rendered = render(s, from.size)?;
    if let Some(refused) = clone_refusal(s, from.claim, &rendered.claim) {
        return Break(refused);
    }
    if let Some(snapshot) = &from.snapshot
        && !rendered.use_populator
    {
        let restore = restore_for_copy(s, snapshot, &mut rendered.claim)?;
        plan.create.push(Companion::RestoreClaim(Box::new(restore)));
    }
    plan.events.extend(
        rendered
            .warnings
            .iter()
            .map(|w| Event::warning("SizeWarning", w.clone())),
    );
    plan.create.extend(kind.companions(dv, &rendered));
    record_path(dv, rendered.use_populator, plan);
    // The status is that of the claim as the API server will hold it: Pending.
    let mut claim = rendered.claim;
    claim.status.get_or_insert_default().phase = Some("Pending".into());
    plan.claim = ClaimStep::Create(Box::new(claim.clone()));
    Continue(claim)
}

/// What a clone copies, once it is there to copy: the source claim or the snapshot, and the
/// size the claim is rendered from.
#[derive(Default)]
struct CloneFrom<'a> {
    claim: Option<&'a PersistentVolumeClaim>,
    snapshot: Option<(String, String)>,
    size: Option<i64>,
}

/// What the DataVolume clones, if it clones, or the plan that waits for it.
fn clone_from<'a>(
    s: &Snapshot<'a>,
    filled: &Result<Filled, Refusal>,
) -> ControlFlow<Plan, CloneFrom<'a>> {
    let mut from = CloneFrom::default();
    if matches!(filled, Ok(Filled::Import(SourceKind::Pvc)))
        && let Some(source) = clone_source_of(s.dv)
    {
        let claim = source_claim(s, &source)?;
        from.claim = Some(claim);
        from.size = image_size(s, claim);
    }
    if matches!(filled, Ok(Filled::Import(SourceKind::Snapshot)))
        && let Some(snapshot) = snapshot_source_of(s.dv)
    {
        from.size = Some(ready_snapshot(s, &snapshot)?);
        from.snapshot = Some(snapshot);
    }
    Continue(from)
}

/// The claim a clone copies: upstream waits for it before making the claim.
fn source_claim<'a>(
    s: &Snapshot<'a>,
    (src_ns, src_name): &(String, String),
) -> ControlFlow<Plan, &'a PersistentVolumeClaim> {
    if let Some(refusal) = s.clone_refusal {
        return Break(Plan::refused(
            s.dv,
            refusal,
            Phase::Pending,
            s.now,
            Requeue::OnChange,
        ));
    }
    match s.clone_source {
        Some(source) => Continue(source),
        None => {
            let refusal =
                crate::clone::wait::source_missing(s.dv, (src_ns.as_str(), src_name.as_str()));
            // A claim made in another namespace wakes nothing here.
            Break(Plan::refused(
                s.dv,
                &refusal,
                Phase::Pending,
                s.now,
                Requeue::Soon,
            ))
        }
    }
}

/// What the source claim holds for a disk image (a Filesystem source's space less its
/// overhead): the target adds its own overhead, and a Block target needs none.
fn image_size(s: &Snapshot<'_>, source: &PersistentVolumeClaim) -> Option<i64> {
    claim_size(source).map(|bytes| {
        let spec = source.spec.as_ref();
        let mode = crate::size::resolve_volume_mode(spec.and_then(|s| s.volume_mode.as_deref()));
        let class = spec.and_then(|s| s.storage_class_name.as_deref());
        let overhead = render::filesystem_overhead(s.config, class, mode);
        crate::size::image_space(mode, bytes, overhead)
    })
}

/// A claim's size: its capacity once bound, else its request.
fn claim_size(claim: &PersistentVolumeClaim) -> Option<i64> {
    let capacity = claim.status.as_ref()?.capacity.as_ref();
    let request = claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref();
    let q = capacity
        .and_then(|c| c.get("storage"))
        .or_else(|| request.and_then(|r| r.get("storage")))?;
    crate::quantity::Quantity::try_from(q)
        .ok()
        .map(|q| q.value())
}

/// The restore size of the snapshot a snapshot clone restores, once it exists and is ready to
/// use; until then the plan that waits for it.
fn ready_snapshot(
    s: &Snapshot<'_>,
    (src_ns, src_name): &(String, String),
) -> ControlFlow<Plan, i64> {
    let dv = s.dv;
    if let Some(refusal) = s.clone_refusal {
        return Break(Plan::refused(
            dv,
            refusal,
            Phase::Pending,
            s.now,
            Requeue::OnChange,
        ));
    }
    let id = format!(
        "{}/{}",
        dv.metadata.namespace.as_deref().unwrap_or(""),
        dv.metadata.name.as_deref().unwrap_or("")
    );
    let waiting = |reason, message: String| {
        let refusal = Refusal { reason, message };
        // Snapshots are not watched: looked at again on a timer.
        Plan::refused(dv, &refusal, Phase::Pending, s.now, Requeue::Soon)
    };
    let Some(snapshot) = s.clone_snapshot else {
        return Break(waiting(
            "CloneWithoutSource",
            format!(
                "The source snapshot {src_ns}/{src_name} doesn't exist; DataVolume {id} is cloned once it does"
            ),
        ));
    };
    match crate::clone::populator::restore_size(snapshot) {
        Some(size) if snapshot["status"]["readyToUse"] == true => Continue(size),
        _ => Break(waiting(
            "SnapshotNotReady",
            format!(
                "The source snapshot {src_ns}/{src_name} is not ready to use yet; DataVolume {id} is cloned once it is"
            ),
        )),
    }
}

/// The claim as the DataVolume asks for it, sized from what it clones when it clones; or the
/// plan that says why it cannot be made.
fn render(s: &Snapshot<'_>, clone_size: Option<i64>) -> ControlFlow<Plan, RenderedClaim> {
    let context = RenderContext {
        storage_classes: s.classes,
        storage_profiles: s.profiles,
        config: s.config,
        csi_drivers: s.csi_drivers,
        clone_size,
    };
    match render::render_claim(s.dv, &context) {
        Ok(r) => Continue(r),
        Err(e) => {
            let refusal = Refusal {
                reason: "ErrClaimNotValid",
                // Render errors name the DataVolume themselves.
                message: e.to_string(),
            };
            Break(Plan::refused(
                s.dv,
                &refusal,
                Phase::Pending,
                s.now,
                Requeue::OnChange,
            ))
        }
    }
}

/// Upstream's validateClone, before the claim is made: a claim the clone from `source` could
/// never fill (too small, another content type) is not made; the DataVolume waits, saying why,
/// instead of a claim that waits for ever with only a warning event on it.
fn clone_refusal(
    s: &Snapshot<'_>,
    source: Option<&PersistentVolumeClaim>,
    claim: &PersistentVolumeClaim,
) -> Option<Plan> {
    let why = crate::clone::host::validate_with(source?, claim, s.config).err()?;
    let refusal = Refusal {
        reason: "CloneValidationFailed",
        message: format!("{}: {why}", crate::clone::host::VALIDATION_FAILED),
    };
    // A source elsewhere wakes nothing here.
    Some(Plan::refused(
        s.dv,
        &refusal,
        Phase::Pending,
        s.now,
        Requeue::Soon,
    ))
}

/// Off the populator path (upstream's legacy snapshot clone) the snapshot is restored into a
/// claim of a class of its driver, which the claim copies: that claim to restore into, with
/// `claim` annotated to copy it; or the plan that says no class can restore it.
fn restore_for_copy(
    s: &Snapshot<'_>,
    snapshot: &(String, String),
    claim: &mut PersistentVolumeClaim,
) -> ControlFlow<Plan, PersistentVolumeClaim> {
    let dv = s.dv;
    let driver = s.clone_snapshot_driver.unwrap_or("");
    let Some(class) = crate::clone::host::restore_class(s.classes, driver) else {
        let refusal = Refusal {
            reason: "CloneValidationFailed",
            message: format!(
                "DataVolume {}/{}: no StorageClass of the CSI driver {} of VolumeSnapshot {}/{} to restore it into for a copy; create one",
                dv.metadata.namespace.as_deref().unwrap_or(""),
                dv.metadata.name.as_deref().unwrap_or(""),
                crate::clone::host::driver_name(driver),
                snapshot.0,
                snapshot.1
            ),
        };
        return Break(Plan::refused(
            dv,
            &refusal,
            Phase::Pending,
            s.now,
            Requeue::Soon,
        ));
    };
    let restore_size = s
        .clone_snapshot
        .and_then(|v| v["status"]["restoreSize"].as_str())
        .unwrap_or("0");
    let restore = snapshot_fallback_claim(dv, claim, snapshot, &class, restore_size);
    claim
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            ann::CLONE_REQUEST.into(),
            format!("{}/{}", snapshot.0, snapshot_fallback_name(dv)),
        );
    Continue(restore)
}

/// As upstream: the DataVolume says which path it took.
fn record_path(dv: &DataVolume, use_populator: bool, plan: &mut Plan) {
    let path = use_populator.to_string();
    if dv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ann::USE_POPULATOR))
        != Some(&path)
    {
        plan.dv_annotations
            .insert(ann::USE_POPULATOR.into(), Some(path));
    }
}
