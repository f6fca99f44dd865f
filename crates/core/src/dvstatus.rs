//! A DataVolume's status from its claim (docs/design.md#the-import-flow, upstream's DataVolume controller): phase,
//! restart count, progress, the Ready/Bound/Running conditions and the events that go with
//! their changes. The claim's annotations are the message bus; this reads them.

use std::collections::BTreeMap;

use cdi_api::ann;
use cdi_api::datavolume::{DataVolume, DataVolumeCondition, DataVolumeStatus};
use cdi_api::enums::{
    ConditionStatus, DataVolumeConditionReason as Reason, DataVolumeConditionType as Type,
    DataVolumePhase as Phase,
};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// An event to record on the DataVolume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub warning: bool,
    pub reason: String,
    pub message: String,
}

impl Event {
    pub fn normal(reason: &str, message: String) -> Event {
        Event {
            warning: false,
            reason: reason.into(),
            message,
        }
    }

    pub fn warning(reason: &str, message: String) -> Event {
        Event {
            warning: true,
            reason: reason.into(),
            message,
        }
    }
}

/// What the status is computed from.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    pub dv: &'a DataVolume,
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// The claim's class binds WaitForFirstConsumer.
    pub class_wffc: bool,
    /// The `HonorWaitForFirstConsumer` gate.
    pub honor_wffc: bool,
    /// The claim already holds the DataVolume's data (adopted, pre-populated): no work.
    pub populated: bool,
    /// Progress read from the worker pod's metrics ("NN.NN%"), when running.
    pub progress: Option<String>,
    /// The populator path: the claim is filled through PVC prime (this one, once it exists).
    pub populator: Option<Option<&'a PersistentVolumeClaim>>,
    pub now: Timestamp,
}

/// What external population needs to know beyond the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct External {
    /// The claim's class is served by a CSI driver (a CSIDriver object names its provisioner):
    /// only CSI provisioners hand claims to populators.
    pub csi_driver: bool,
}

/// The new status and the events to record.
#[derive(Debug, Clone, PartialEq)]
pub struct Computed {
    pub status: DataVolumeStatus,
    pub events: Vec<Event>,
}

fn annotations(claim: Option<&PersistentVolumeClaim>) -> BTreeMap<String, String> {
    claim.map(crate::import::annotations).unwrap_or_default()
}

/// The kind and name of what populates an externally populated claim.
fn populator_of(claim: &PersistentVolumeClaim) -> (&str, &str) {
    claim
        .spec
        .as_ref()
        .and_then(|s| {
            s.data_source_ref
                .as_ref()
                .map(|r| (r.kind.as_str(), r.name.as_str()))
                .or_else(|| {
                    s.data_source
                        .as_ref()
                        .map(|r| (r.kind.as_str(), r.name.as_str()))
                })
        })
        .unwrap_or(("", ""))
}

/// Why an externally populated claim will never be filled: only CSI provisioners hand claims to
/// populators (a snapshot restores without one).
fn external_refusal(
    claim: &PersistentVolumeClaim,
    external: External,
) -> Option<crate::source::Refusal> {
    let (kind, _) = populator_of(claim);
    (!external.csi_driver && kind != "VolumeSnapshot").then(|| crate::source::Refusal {
        reason: "NoCSIDriverForExternalPopulation",
        message: "No CSI drivers were found: External population not supported".into(),
    })
}

/// Upstream's external-population phase: PendingPopulation while the claim waits, Succeeded once
/// it is bound (the populator has filled it).
fn external_phase(claim: &PersistentVolumeClaim) -> (Phase, Option<Event>) {
    let (_, populator) = populator_of(claim);
    let name = claim.metadata.name.as_deref().unwrap_or("");
    match claim.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Bound") => (
            Phase::Succeeded,
            Some(Event::normal(
                "ExternalPopulationSucceeded",
                format!("PVC {name} successfully populated by {populator}"),
            )),
        ),
        _ => (Phase::PendingPopulation, None),
    }
}

/// The import phase from the worker pod's phase on the claim (upstream's `updateStatusPhase`).
/// `worker` is the claim the pod works on: the claim itself, or PVC prime on the populator path.
fn import_phase(
    claim: &PersistentVolumeClaim,
    worker: Option<&PersistentVolumeClaim>,
    anns: &BTreeMap<String, String>,
    current: Phase,
) -> (Phase, Option<Event>) {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let pod_phase = anns.get(ann::POD_PHASE).map(String::as_str);
    let bound = worker.and_then(|w| w.status.as_ref()?.phase.as_deref()) == Some("Bound");
    let has_pod = worker
        .and_then(|w| w.metadata.annotations.as_ref())
        .is_some_and(|a| a.contains_key(ann::IMPORT_POD_NAME));
    if pod_phase != Some("Succeeded") && !(bound && has_pod) {
        return (current, None);
    }
    match pod_phase {
        None | Some("Pending") => (
            Phase::ImportScheduled,
            pod_phase
                .map(|_| Event::normal("ImportScheduled", format!("Import into {name} scheduled"))),
        ),
        Some("Running") => (
            Phase::ImportInProgress,
            Some(Event::normal(
                "ImportInProgress",
                format!("Import into {name} in progress"),
            )),
        ),
        Some("Failed") => {
            let fatal = anns.get(ann::IMPORT_FATAL_ERROR).map(String::as_str) == Some("true");
            (
                if fatal { Phase::Failed } else { current },
                Some(Event::warning(
                    "ImportFailed",
                    format!("Failed to import into PVC {name}"),
                )),
            )
        }
        Some("Succeeded") => (
            Phase::Succeeded,
            Some(Event::normal(
                "ImportSucceeded",
                format!("Successfully imported into PVC {name}"),
            )),
        ),
        Some(_) => (Phase::ImportScheduled, None),
    }
}

/// The upload phase from the upload pod's state on the claim (upstream's upload `updateStatusPhase`):
/// UploadScheduled once the claim the pod works on is bound, UploadReady while the upload server
/// is ready, Succeeded when it is done.
fn upload_phase(
    claim: &PersistentVolumeClaim,
    worker: Option<&PersistentVolumeClaim>,
    anns: &BTreeMap<String, String>,
    current: Phase,
) -> (Phase, Option<Event>) {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let pod_phase = anns.get(ann::POD_PHASE).map(String::as_str);
    let bound = worker.and_then(|w| w.status.as_ref()?.phase.as_deref()) == Some("Bound");
    let target = worker
        .and_then(|w| w.metadata.annotations.as_ref())
        .is_some_and(|a| a.contains_key(ann::UPLOAD_REQUEST));
    if pod_phase != Some("Succeeded") && !(bound && target) {
        return (current, None);
    }
    match pod_phase {
        Some("Pending") => (
            Phase::UploadScheduled,
            Some(Event::normal(
                "UploadScheduled",
                format!("Upload into {name} scheduled"),
            )),
        ),
        Some("Running") if anns.get(ann::POD_READY).map(String::as_str) == Some("true") => (
            Phase::UploadReady,
            Some(Event::normal(
                "UploadReady",
                format!("Upload into {name} ready"),
            )),
        ),
        Some("Failed") => (
            Phase::UploadScheduled,
            Some(Event::warning(
                "UploadFailed",
                format!("Upload into {name} failed"),
            )),
        ),
        Some("Succeeded") => (
            Phase::Succeeded,
            Some(Event::normal(
                "UploadSucceeded",
                format!("Successfully uploaded into {name}"),
            )),
        ),
        _ => (Phase::UploadScheduled, None),
    }
}

/// Set a condition, keeping its transition time unless its status changed (upstream's
/// `updateCondition`).
fn set(
    conditions: &mut Vec<DataVolumeCondition>,
    type_: Type,
    status: ConditionStatus,
    message: &str,
    reason: &str,
    now: &Time,
) {
    let reason = (!reason.is_empty()).then(|| {
        reason
            .parse::<Reason>()
            .unwrap_or(Reason::Other(reason.into()))
    });
    let message = (!message.is_empty()).then(|| message.to_string());
    let i = match conditions.iter().position(|c| c.type_ == type_) {
        Some(i) => i,
        None => {
            conditions.push(DataVolumeCondition {
                type_,
                status: ConditionStatus::Unknown,
                last_transition_time: None,
                last_heartbeat_time: None,
                reason: None,
                message: None,
            });
            conditions.len() - 1
        }
    };
    let c = &mut conditions[i];
    if c.status != status || c.last_transition_time.is_none() {
        c.last_transition_time = Some(now.clone());
        c.last_heartbeat_time = Some(now.clone());
        c.message = message;
        c.reason = reason;
    } else if c.message != message || c.reason != reason {
        c.message = message;
        c.reason = reason;
        c.last_heartbeat_time = Some(now.clone());
    }
    c.status = status;
}

fn condition_status(value: &str) -> ConditionStatus {
    match value.to_ascii_lowercase().as_str() {
        "true" => ConditionStatus::True,
        "false" => ConditionStatus::False,
        _ => ConditionStatus::Unknown,
    }
}

/// Bound from the claim (one not bound sets Ready False first, as upstream's), Ready from the
/// phase, Running from the worker's annotations on the claim (a running transfer leaves Ready
/// False, `TransferRunning`).
fn update_conditions(
    conditions: &mut Vec<DataVolumeCondition>,
    phase: &Phase,
    claim: Option<&PersistentVolumeClaim>,
    anns: &BTreeMap<String, String>,
    now: &Time,
) {
    use ConditionStatus::{False, True, Unknown};
    let (bound, message, reason) = bound(claim, anns);
    set(conditions, Type::Bound, bound, &message, &reason, now);
    if bound != True {
        set(conditions, Type::Ready, False, "", "", now);
    }
    let ready = match phase {
        Phase::Succeeded => True,
        Phase::Unknown => Unknown,
        _ => False,
    };
    set(conditions, Type::Ready, ready, "", "", now);
    let (running, message, reason) = running(anns);
    set(conditions, Type::Running, running, message, reason, now);
    if running == True {
        set(conditions, Type::Ready, False, "", "TransferRunning", now);
    }
}

/// The Bound condition (status, message, reason) from the claim's phase, and what binding
/// waits for (its Bound condition annotations).
fn bound(
    claim: Option<&PersistentVolumeClaim>,
    anns: &BTreeMap<String, String>,
) -> (ConditionStatus, String, String) {
    use ConditionStatus::{False, True};
    let get = |k: &str| anns.get(k).cloned().unwrap_or_default();
    let Some(c) = claim else {
        return (False, "No PVC found".into(), "NotFound".into());
    };
    let name = c.metadata.name.as_deref().unwrap_or("");
    let claim_cond = anns.get(ann::BOUND_CONDITION).map(|v| condition_status(v));
    match c.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Bound") => match claim_cond {
            None | Some(True) => (True, format!("PVC {name} Bound"), "Bound".into()),
            Some(_) => (
                False,
                get(ann::BOUND_CONDITION_MESSAGE),
                get(ann::BOUND_CONDITION_REASON),
            ),
        },
        Some("Pending") => match claim_cond {
            None | Some(True) => (False, format!("PVC {name} Pending"), "Pending".into()),
            Some(_) => {
                let prime = anns
                    .get(ann::PVC_PRIME_NAME)
                    .map(|p| format!("[{p}] : "))
                    .unwrap_or_default();
                let message = format!(
                    "target PVC {name} Pending and {prime}{}",
                    get(ann::BOUND_CONDITION_MESSAGE)
                );
                (False, message, get(ann::BOUND_CONDITION_REASON))
            }
        },
        Some("Lost") => (False, "Claim Lost".into(), "ClaimLost".into()),
        _ => (False, String::new(), String::new()),
    }
}

/// The Running condition (status, message, reason): the worker pod cannot be scheduled, the
/// clone populator stopped for good, or what the worker's Running condition annotations say.
fn running(anns: &BTreeMap<String, String>) -> (ConditionStatus, &str, &str) {
    let get = |k: &str| anns.get(k).map(String::as_str).unwrap_or("");
    let running_message = get(ann::RUNNING_CONDITION_MESSAGE);
    let running_reason = get(ann::RUNNING_CONDITION_REASON);
    if get(ann::POD_SCHEDULABLE) == "false" {
        (
            ConditionStatus::False,
            "Importer pod cannot be scheduled",
            "Unschedulable",
        )
    } else if get(ann::CLONE_PHASE) == crate::clone::populator::phase::ERROR {
        // The clone populator stopped for good (a target too small, a refused token): its
        // phase keeps the DataVolume's, so the reason is said here, as upstream's populator
        // writes cloneError as the claim's running condition.
        (ConditionStatus::False, get(ann::CLONE_ERROR), "Error")
    } else if let Some(v) = anns.get(ann::RUNNING_CONDITION) {
        (condition_status(v), running_message, running_reason)
    } else {
        (ConditionStatus::False, running_message, running_reason)
    }
}

fn find(conditions: &[DataVolumeCondition], t: Type) -> Option<&DataVolumeCondition> {
    conditions.iter().find(|c| c.type_ == t)
}

/// The status of a DataVolume the controller refuses (cdi-core `source::check`: Failed) or cannot
/// render a claim for yet (Pending, until its profile or class is fixed), with the reason on the
/// Ready and Running conditions, so `kubectl get dv` and `describe` say what is
/// wrong instead of an empty phase; the event is recorded once, when the status first says so.
pub fn refused_status(
    dv: &DataVolume,
    refusal: &crate::source::Refusal,
    phase: Phase,
    now: Timestamp,
) -> Computed {
    stopped_status(dv, refusal, phase, ("No PVC found", "NotFound"), now)
}

/// The status of a DataVolume whose claim name is taken by a claim that is not its own (an
/// unrelated claim, or one being deleted): Pending, with why on every condition, Bound too.
pub fn claim_taken_status(
    dv: &DataVolume,
    refusal: &crate::source::Refusal,
    now: Timestamp,
) -> Computed {
    let bound = (refusal.message.as_str(), refusal.reason);
    stopped_status(dv, refusal, Phase::Pending, bound, now)
}

fn stopped_status(
    dv: &DataVolume,
    refusal: &crate::source::Refusal,
    phase: Phase,
    (bound_message, bound_reason): (&str, &str),
    now: Timestamp,
) -> Computed {
    let current = dv.status.clone().unwrap_or_default();
    let mut status = current.clone();
    let now = Time(now);
    let mut conditions = status.conditions.take().unwrap_or_default();
    let (reason, message) = (refusal.reason, refusal.message.as_str());
    set(
        &mut conditions,
        Type::Bound,
        ConditionStatus::False,
        bound_message,
        bound_reason,
        &now,
    );
    set(
        &mut conditions,
        Type::Ready,
        ConditionStatus::False,
        message,
        reason,
        &now,
    );
    set(
        &mut conditions,
        Type::Running,
        ConditionStatus::False,
        message,
        reason,
        &now,
    );
    status.conditions = Some(conditions);
    status.phase = Some(phase);
    status.progress = Some("N/A".into());
    let said = find(current.conditions.as_deref().unwrap_or(&[]), Type::Running)
        .is_some_and(|c| c.message.as_deref() == Some(message));
    let events = if said {
        Vec::new()
    } else {
        vec![Event::warning(reason, message.to_string())]
    };
    Computed { status, events }
}

/// The phase of a claim a source kind still has to fill, and the event that goes with a change;
/// `None` leaves it to the rules every kind shares (a lost claim, a phase nobody knows).
type KindPhase<'f> = &'f dyn Fn(
    &PersistentVolumeClaim,
    &BTreeMap<String, String>,
    Phase,
    bool,
) -> Option<(Phase, Option<Event>)>;

/// The status of an import (or blank) DataVolume, classic or through the populator.
pub fn import_status(o: &Observed<'_>) -> Computed {
    worker_status(o, import_phase)
}

/// The status of an upload DataVolume, classic or through the populator.
pub fn upload_status(o: &Observed<'_>) -> Computed {
    worker_status(o, upload_phase)
}

/// A worker kind's phase from the claim it fills, the claim its pod works on (the claim itself,
/// or PVC prime), the claim's annotations and the current phase.
type WorkerPhase = fn(
    &PersistentVolumeClaim,
    Option<&PersistentVolumeClaim>,
    &BTreeMap<String, String>,
    Phase,
) -> (Phase, Option<Event>);

/// What the kinds a worker pod fills share: Pending or WaitForFirstConsumer before the claim is
/// bound (PendingPopulation on the populator path), then `worker_phase`.
fn worker_status(o: &Observed<'_>, worker_phase: WorkerPhase) -> Computed {
    let phase =
        |c: &PersistentVolumeClaim, anns: &BTreeMap<String, String>, phase: Phase, unset: bool| {
            let worker = match o.populator {
                Some(prime) => prime,
                None => Some(c),
            };
            if anns.get(ann::POD_PHASE).map(String::as_str) == Some("Succeeded") {
                return Some(worker_phase(c, worker, anns, phase));
            }
            match c.status.as_ref().and_then(|s| s.phase.as_deref()) {
                Some("Pending") if o.populator.is_some() => {
                    // Upstream's shouldBeMarkedPendingPopulation: the first consumer decides.
                    Some(
                        if crate::populator::waits_for_first_consumer(anns, o.class_wffc) {
                            (Phase::PendingPopulation, None)
                        } else {
                            worker_phase(c, worker, anns, phase)
                        },
                    )
                }
                Some("Pending") => Some((
                    if o.honor_wffc && o.class_wffc {
                        Phase::WaitForFirstConsumer
                    } else {
                        Phase::Pending
                    },
                    None,
                )),
                Some("Bound") => {
                    let phase = if matches!(
                        phase,
                        Phase::Pending | Phase::WaitForFirstConsumer | Phase::Unknown
                    ) || unset
                    {
                        Phase::PvcBound
                    } else {
                        phase
                    };
                    Some(worker_phase(c, worker, anns, phase))
                }
                _ => None,
            }
        };
    computed(o, &phase)
}

/// `<namespace>/<name>` of a clone DataVolume's source and of the DataVolume, for its events.
fn clone_names(dv: &DataVolume) -> (String, String) {
    let (ns, name) = crate::datavolume::refs::clone_source_of(dv).unwrap_or_default();
    let own = format!(
        "{}/{}",
        dv.metadata.namespace.as_deref().unwrap_or(""),
        dv.metadata.name.as_deref().unwrap_or("")
    );
    (format!("{ns}/{name}"), own)
}

/// The phase of a clone DataVolume and its event (upstream's clone phase maps): on the populator
/// path from the target claim's `clonePhase`, else from the host-assisted copy's upload pod.
fn clone_phase(
    dv: &DataVolume,
    anns: &BTreeMap<String, String>,
    populating: bool,
) -> (Phase, Option<Event>) {
    let (from, into) = clone_names(dv);
    let scheduled = || {
        (
            Phase::CloneScheduled,
            Some(Event::normal(
                "CloneScheduled",
                format!("Cloning from {from} into {into} scheduled"),
            )),
        )
    };
    let in_progress = || {
        (
            Phase::CloneInProgress,
            Some(Event::normal(
                "CloneInProgress",
                format!("Cloning from {from} into {into} in progress"),
            )),
        )
    };
    let succeeded = || {
        (
            Phase::Succeeded,
            Some(Event::normal(
                "CloneSucceeded",
                format!("Successfully cloned from {from} into {into}"),
            )),
        )
    };
    if !populating {
        // The copy is complete when the clone controller says so (the upload server and the
        // source pod both done), not when the upload server alone is.
        if anns.contains_key(ann::CLONE_OF) {
            return succeeded();
        }
        return match anns.get(ann::POD_PHASE).map(String::as_str) {
            Some("Running" | "Succeeded") => in_progress(),
            _ => scheduled(),
        };
    }
    match anns.get(ann::CLONE_PHASE).map(String::as_str).unwrap_or("") {
        "" | "Pending" => scheduled(),
        "HostClone" => in_progress(),
        "Rebind" => (
            Phase::RebindInProgress,
            Some(Event::normal(
                "RebindInProgress",
                format!("Rebinding PersistentVolumeClaim for DataVolume {into}"),
            )),
        ),
        "PrepClaim" => (
            Phase::PrepClaimInProgress,
            Some(Event::normal(
                "PrepClaimInProgress",
                format!("Prepping PersistentVolumeClaim for DataVolume {into}"),
            )),
        ),
        "CSIClone" => (Phase::CsiCloneInProgress, None),
        "SnapshotClone" => (Phase::CloneFromSnapshotSourceInProgress, None),
        "Snapshot" => (Phase::SnapshotForSmartCloneInProgress, None),
        "Succeeded" => succeeded(),
        // Error and anything unknown: the phase stays (Running says the cloneError).
        _ => (Phase::Other(String::new()), None),
    }
}

/// The status of a clone DataVolume (`source.pvc`), host-assisted on the claim itself or
/// through the clone populator.
pub fn clone_status(o: &Observed<'_>) -> Computed {
    let populating = o
        .claim
        .and_then(|c| c.spec.as_ref()?.data_source_ref.as_ref())
        .is_some_and(|r| r.kind == cdi_api::populators::VOLUME_CLONE_SOURCE_KIND);
    let phase = |c: &PersistentVolumeClaim,
                 anns: &BTreeMap<String, String>,
                 current: Phase,
                 unset: bool| {
        let claim_phase = c.status.as_ref().and_then(|s| s.phase.as_deref());
        let keep = |(p, e): (Phase, Option<Event>)| match p {
            Phase::Other(ref x) if x.is_empty() => Some((
                if unset {
                    Phase::Pending
                } else {
                    current.clone()
                },
                None,
            )),
            _ => Some((p, e)),
        };
        match claim_phase {
            Some("Pending") if populating => {
                let clone = anns.get(ann::CLONE_PHASE).map(String::as_str).unwrap_or("");
                if matches!(clone, "" | "Pending")
                    && crate::populator::waits_for_first_consumer(anns, o.class_wffc)
                {
                    Some((Phase::PendingPopulation, None))
                } else {
                    keep(clone_phase(o.dv, anns, true))
                }
            }
            Some("Pending") => Some((
                if o.honor_wffc && o.class_wffc {
                    Phase::WaitForFirstConsumer
                } else {
                    Phase::Pending
                },
                None,
            )),
            Some("Bound") => keep(clone_phase(o.dv, anns, populating)),
            _ => None,
        }
    };
    computed(o, &phase)
}

/// The status of an externally populated DataVolume (upstream's external-population controller).
pub fn external_status(o: &Observed<'_>, external: External) -> Computed {
    if let Some(claim) = o.claim
        && !o.populated
        && let Some(refusal) = external_refusal(claim, external)
    {
        return claim_taken_status(o.dv, &refusal, o.now);
    }
    let phase = |c: &PersistentVolumeClaim, _: &BTreeMap<String, String>, _: Phase, _: bool| {
        let lost = c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost");
        (!lost).then(|| external_phase(c))
    };
    computed(o, &phase)
}

/// What every source kind shares: no claim yet, an adopted claim, a lost one; conditions,
/// progress, restart count and the events of their changes. `kind_phase` says the rest.
fn computed(o: &Observed<'_>, kind_phase: KindPhase<'_>) -> Computed {
    let current = o.dv.status.clone().unwrap_or_default();
    let mut status = current.clone();
    let anns = annotations(o.claim);
    let mut events = Vec::new();
    let mut phase = current.phase.clone().unwrap_or(Phase::Other(String::new()));
    match o.claim {
        None => {
            if matches!(&phase, Phase::Other(p) if p.is_empty()) {
                phase = Phase::Pending;
            }
        }
        Some(c) if c.metadata.deletion_timestamp.is_none() => {
            status.claim_name = c.metadata.name.clone();
            let event;
            (phase, event) = phase_from_claim(o, c, &anns, kind_phase, phase);
            if let Some(restarts) = anns
                .get(ann::POD_RESTARTS)
                .and_then(|r| r.parse::<i32>().ok())
                .filter(|r| *r >= 0)
            {
                status.restart_count = Some(restarts);
            }
            // The phase event only when the phase changes.
            if let Some(e) = event
                && current.phase.as_ref() != Some(&phase)
            {
                events.push(e);
            }
        }
        Some(_) => {}
    }
    status.progress = Some(progress(o, &phase, &anns, current.progress.as_ref()));
    if status.restart_count.is_none() {
        status.restart_count = Some(0);
    }
    let before = current.conditions.clone().unwrap_or_default();
    let mut conditions = before.clone();
    update_conditions(&mut conditions, &phase, o.claim, &anns, &Time(o.now));
    events.extend(condition_events(&before, &conditions, &phase));
    status.phase = Some(phase);
    status.conditions = Some(conditions);
    Computed { status, events }
}

/// The phase a claim (not being deleted) gives the DataVolume, and the event of a change: an
/// adopted claim has nothing to fill, else the kind decides; a lost claim fails, a phase
/// nobody knows is Unknown, and nothing decided is Pending.
fn phase_from_claim(
    o: &Observed<'_>,
    c: &PersistentVolumeClaim,
    anns: &BTreeMap<String, String>,
    kind_phase: KindPhase<'_>,
    mut phase: Phase,
) -> (Phase, Option<Event>) {
    let unset = matches!(&phase, Phase::Other(p) if p.is_empty());
    let claim_phase = c.status.as_ref().and_then(|s| s.phase.as_deref());
    let mut event = None;
    let decided = if o.populated {
        // Adopted or pre-populated: nothing to fill.
        matches!(claim_phase, Some("Pending") | Some("Bound")).then_some((Phase::Succeeded, None))
    } else {
        kind_phase(c, anns, phase.clone(), unset)
    };
    match decided {
        Some(d) => (phase, event) = d,
        None => match claim_phase {
            Some("Lost") => {
                phase = Phase::Failed;
                let name = c.metadata.name.clone().unwrap_or_default();
                event = Some(Event::warning("ErrClaimLost", format!("PVC {name} lost")));
            }
            Some(p) if !p.is_empty() => phase = Phase::Unknown,
            _ => {}
        },
    }
    // Nothing above decided (a claim and its PVC prime still waiting to be provisioned):
    // Pending, never no phase at all.
    if matches!(&phase, Phase::Other(p) if p.is_empty()) {
        phase = Phase::Pending;
    }
    (phase, event)
}

/// The progress shown: whole once succeeded; while in progress what the worker (or the
/// populator, through the claim) reports, else the last known.
fn progress(
    o: &Observed<'_>,
    phase: &Phase,
    anns: &BTreeMap<String, String>,
    last: Option<&String>,
) -> String {
    match phase {
        Phase::Succeeded => "100.0%".into(),
        Phase::ImportInProgress | Phase::CloneInProgress => o
            .progress
            .clone()
            .or_else(|| {
                o.populator
                    .is_some()
                    .then(|| anns.get(ann::POPULATOR_PROGRESS).cloned())
                    .flatten()
            })
            .or(last.cloned())
            .unwrap_or_else(|| "N/A".into()),
        _ => last.cloned().unwrap_or_else(|| "N/A".into()),
    }
}

/// Bound condition changes are events; so is a stop that says why (Running False while the
/// work is under way, with a new message).
fn condition_events(
    before: &[DataVolumeCondition],
    conditions: &[DataVolumeCondition],
    phase: &Phase,
) -> Vec<Event> {
    let mut events = Vec::new();
    if let Some(b) = find(conditions, Type::Bound) {
        let old = find(before, Type::Bound);
        let changed = old
            .is_none_or(|o| o.status != b.status || o.reason != b.reason || o.message != b.message);
        if changed && let (Some(r), Some(m)) = (&b.reason, &b.message) {
            events.push(Event::normal(r.as_str(), m.clone()));
        }
    }
    if let (Some(ready), Some(bound), Some(running)) = (
        find(conditions, Type::Ready),
        find(conditions, Type::Bound),
        find(conditions, Type::Running),
    ) {
        let in_progress = bound.status == ConditionStatus::True
            || matches!(
                phase,
                Phase::PendingPopulation
                    | Phase::ImportScheduled
                    | Phase::ImportInProgress
                    | Phase::UploadScheduled
                    | Phase::UploadReady
            );
        let old_message = find(before, Type::Running).and_then(|c| c.message.clone());
        if ready.status == ConditionStatus::False
            && running.status == ConditionStatus::False
            && in_progress
            && let Some(m) = &running.message
            && m != "Scratch space required"
            && old_message.as_ref() != Some(m)
        {
            let reason = running
                .reason
                .as_ref()
                .map(|r| r.as_str().to_string())
                .unwrap_or_default();
            events.push(Event::warning(&reason, m.clone()));
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dv(status: serde_json::Value) -> DataVolume {
        serde_json::from_value(
            json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "disk", "namespace": "vms"},
            "spec": {"source": {"http": {"url": "http://x/disk.qcow2"}}, "storage": {}},
            "status": status}),
        )
        .unwrap()
    }

    fn claim(phase: &str, anns: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(
            json!({"metadata": {"name": "disk", "namespace": "vms", "annotations": anns},
            "status": {"phase": phase}}),
        )
        .unwrap()
    }

    fn observe<'a>(dv: &'a DataVolume, claim: Option<&'a PersistentVolumeClaim>) -> Observed<'a> {
        Observed {
            dv,
            claim,
            class_wffc: true,
            honor_wffc: true,
            populated: false,
            progress: None,
            populator: None,
            now: "2026-11-30T12:00:00Z".parse().unwrap(),
        }
    }

    fn phase_of(c: &Computed) -> String {
        c.status.phase.as_ref().unwrap().as_str().to_string()
    }

    fn cond(c: &Computed, t: Type) -> &DataVolumeCondition {
        find(c.status.conditions.as_ref().unwrap(), t).unwrap()
    }

    #[test]
    fn a_refused_datavolume_fails_and_says_why_once() {
        let mut d = dv(json!({}));
        d.spec.source = None;
        let refusal = crate::source::check(&d).unwrap_err();
        let now = "2026-11-30T12:00:00Z".parse().unwrap();
        let first = refused_status(&d, &refusal, Phase::Failed, now);
        assert_eq!(phase_of(&first), "Failed");
        for t in [Type::Ready, Type::Running] {
            let c = cond(&first, t);
            assert_eq!(c.status, ConditionStatus::False);
            assert_eq!(c.message.as_deref(), Some(refusal.message.as_str()));
            assert_eq!(c.reason, Some(Reason::Other("ErrInvalidSource".into())));
        }
        assert_eq!(first.events.len(), 1);
        assert!(first.events[0].warning);
        // Once the status says it, the next pass changes nothing and records nothing.
        d.status = Some(first.status.clone());
        let later = "2026-11-30T12:05:00Z".parse().unwrap();
        let again = refused_status(&d, &refusal, Phase::Failed, later);
        assert_eq!(again.status, first.status);
        assert!(again.events.is_empty());
    }

    #[test]
    fn the_seed_scenario_phases_in_order() {
        let d = dv(json!({}));
        let none = import_status(&observe(&d, None));
        assert_eq!(phase_of(&none), "Pending");
        assert_eq!(none.status.progress.as_deref(), Some("N/A"));
        assert_eq!(
            cond(&none, Type::Bound).message.as_deref(),
            Some("No PVC found")
        );

        let pending = claim(
            "Pending",
            json!({"cdi.kubevirt.io/storage.import.endpoint": "x"}),
        );
        let wffc = import_status(&observe(&d, Some(&pending)));
        assert_eq!(phase_of(&wffc), "WaitForFirstConsumer");
        let bound = cond(&wffc, Type::Bound);
        assert_eq!(
            (bound.status, bound.message.as_deref()),
            (ConditionStatus::False, Some("PVC disk Pending"))
        );
        assert!(wffc.events.iter().any(|e| e.reason == "Pending"));

        // Gate off (or an Immediate class): plain Pending.
        let mut o = observe(&d, Some(&pending));
        o.honor_wffc = false;
        assert_eq!(phase_of(&import_status(&o)), "Pending");

        let d = dv(json!({"phase": "WaitForFirstConsumer"}));
        let scheduled = claim(
            "Bound",
            json!({"cdi.kubevirt.io/storage.import.importPodName": "importer-disk"}),
        );
        let s = import_status(&observe(&d, Some(&scheduled)));
        assert_eq!(phase_of(&s), "ImportScheduled");
        assert_eq!(cond(&s, Type::Bound).status, ConditionStatus::True);

        let d = dv(json!({"phase": "ImportScheduled"}));
        let running = claim(
            "Bound",
            json!({"cdi.kubevirt.io/storage.import.importPodName": "importer-disk",
            "cdi.kubevirt.io/storage.pod.phase": "Running", "cdi.kubevirt.io/storage.pod.restarts": "2",
            "cdi.kubevirt.io/storage.condition.running": "true"}),
        );
        let mut o = observe(&d, Some(&running));
        o.progress = Some("45.12%".into());
        let r = import_status(&o);
        assert_eq!(phase_of(&r), "ImportInProgress");
        assert_eq!(r.status.progress.as_deref(), Some("45.12%"));
        assert_eq!(r.status.restart_count, Some(2));
        assert_eq!(cond(&r, Type::Running).status, ConditionStatus::True);
        assert_eq!(
            cond(&r, Type::Ready).reason.as_ref().map(|r| r.as_str()),
            Some("TransferRunning")
        );
        assert!(r.events.iter().any(|e| e.reason == "ImportInProgress"));

        let d = dv(json!({"phase": "ImportInProgress"}));
        let done = claim(
            "Bound",
            json!({"cdi.kubevirt.io/storage.import.importPodName": "importer-disk",
            "cdi.kubevirt.io/storage.pod.phase": "Succeeded", "cdi.kubevirt.io/storage.condition.running": "false",
            "cdi.kubevirt.io/storage.condition.running.reason": "Completed",
            "cdi.kubevirt.io/storage.condition.running.message": "Import Complete"}),
        );
        let s = import_status(&observe(&d, Some(&done)));
        assert_eq!(phase_of(&s), "Succeeded");
        assert_eq!(s.status.progress.as_deref(), Some("100.0%"));
        assert_eq!(cond(&s, Type::Ready).status, ConditionStatus::True);
        assert!(s.events.iter().any(|e| e.reason == "ImportSucceeded"));
    }

    #[test]
    fn failures() {
        let d = dv(json!({"phase": "ImportInProgress"}));
        let failing = claim(
            "Bound",
            json!({"cdi.kubevirt.io/storage.import.importPodName": "importer-disk",
            "cdi.kubevirt.io/storage.pod.phase": "Running", "cdi.kubevirt.io/storage.condition.running": "false",
            "cdi.kubevirt.io/storage.condition.running.reason": "Error",
            "cdi.kubevirt.io/storage.condition.running.message": "Unable to connect to http data source: 404"}),
        );
        let f = import_status(&observe(&d, Some(&failing)));
        assert_eq!(phase_of(&f), "ImportInProgress");
        let warn = f.events.iter().find(|e| e.warning).unwrap();
        assert_eq!(warn.message, "Unable to connect to http data source: 404");

        let fatal = claim(
            "Bound",
            json!({"cdi.kubevirt.io/storage.import.importPodName": "importer-disk",
            "cdi.kubevirt.io/storage.pod.phase": "Failed", "cdi.kubevirt.io/storage.import.fatalError": "true"}),
        );
        assert_eq!(
            phase_of(&import_status(&observe(&d, Some(&fatal)))),
            "Failed"
        );
        let not_fatal = claim(
            "Bound",
            json!({"cdi.kubevirt.io/storage.import.importPodName": "importer-disk",
            "cdi.kubevirt.io/storage.pod.phase": "Failed"}),
        );
        assert_eq!(
            phase_of(&import_status(&observe(&d, Some(&not_fatal)))),
            "ImportInProgress"
        );
        let lost = claim("Lost", json!({}));
        let l = import_status(&observe(&d, Some(&lost)));
        assert_eq!(phase_of(&l), "Failed");
        assert!(l.events.iter().any(|e| e.reason == "ErrClaimLost"));
        let unschedulable = claim(
            "Bound",
            json!({"cdi.kubevirt.io/storage.pod.schedulable": "false"}),
        );
        let u = import_status(&observe(&d, Some(&unschedulable)));
        assert_eq!(
            cond(&u, Type::Running).message.as_deref(),
            Some("Importer pod cannot be scheduled")
        );
    }

    #[test]
    fn transition_times_stay_while_nothing_changes() {
        let d = dv(json!({}));
        let pending = claim("Pending", json!({}));
        let first = import_status(&observe(&d, Some(&pending)));
        let mut again_dv = d.clone();
        again_dv.status = Some(first.status.clone());
        let mut o = observe(&again_dv, Some(&pending));
        o.now = "2026-11-30T13:00:00Z".parse().unwrap();
        let second = import_status(&o);
        assert_eq!(first.status.conditions, second.status.conditions);
        assert!(second.events.is_empty(), "{:?}", second.events);
    }

    /// The populator path while the claim and its PVC prime wait to be provisioned (a node was
    /// selected, so not PendingPopulation): Pending, where the phase used to stay empty.
    #[test]
    fn a_claim_waiting_on_its_prime_is_pending() {
        let d = dv(json!({}));
        let target = claim(
            "Pending",
            json!({"volume.kubernetes.io/selected-node": "node-1"}),
        );
        let prime = claim("Pending", json!({}));
        let mut o = observe(&d, Some(&target));
        o.populator = Some(Some(&prime));
        assert_eq!(phase_of(&import_status(&o)), "Pending");
        o.populator = Some(None);
        assert_eq!(phase_of(&import_status(&o)), "Pending");
    }

    /// An empty selected-node annotation is no node chosen, as for the populator itself: the
    /// DataVolume waits for its first consumer (PendingPopulation).
    #[test]
    fn an_empty_selected_node_is_none() {
        let d = dv(json!({}));
        let target = claim("Pending", json!({"volume.kubernetes.io/selected-node": ""}));
        let mut o = observe(&d, Some(&target));
        o.populator = Some(None);
        assert_eq!(phase_of(&import_status(&o)), "PendingPopulation");
        let anns = crate::import::annotations(&target);
        assert!(crate::populator::waits_for_first_consumer(&anns, true));
        assert!(!crate::populator::waits_for_first_consumer(&anns, false));
        assert_eq!(crate::populator::selected_node(&anns), None);
    }

    /// A claim of the DataVolume's name that is not its own: Pending, and every condition (Bound
    /// too) says why.
    #[test]
    fn a_taken_claim_name_is_pending_with_the_reason() {
        let d = dv(json!({}));
        let refusal = crate::source::Refusal {
            reason: "ErrResourceExists",
            message: "claim disk is someone else's".into(),
        };
        let computed = claim_taken_status(&d, &refusal, "2026-11-30T12:00:00Z".parse().unwrap());
        assert_eq!(phase_of(&computed), "Pending");
        for t in [Type::Bound, Type::Ready, Type::Running] {
            assert_eq!(
                cond(&computed, t).message.as_deref(),
                Some("claim disk is someone else's")
            );
        }
    }

    /// External population: PendingPopulation while the claim waits for its populator,
    /// Succeeded (with upstream's event) once bound; no CSI driver, no population, said once.
    #[test]
    fn external_population_waits_then_succeeds() {
        let mut d = dv(json!({}));
        d.spec.source = None;
        let with_ref = |phase: &str| -> PersistentVolumeClaim {
            serde_json::from_value(json!({"metadata": {"name": "disk", "namespace": "vms"},
                "spec": {"dataSourceRef": {"apiGroup": "example.com", "kind": "Blob", "name": "b"}},
                "status": {"phase": phase}}))
            .unwrap()
        };
        let pending = with_ref("Pending");
        let waiting = external_status(&observe(&d, Some(&pending)), External { csi_driver: true });
        assert_eq!(phase_of(&waiting), "PendingPopulation");
        let bound = with_ref("Bound");
        d.status = Some(waiting.status);
        let done = external_status(&observe(&d, Some(&bound)), External { csi_driver: true });
        assert_eq!(phase_of(&done), "Succeeded");
        assert!(
            done.events
                .iter()
                .any(|e| e.reason == "ExternalPopulationSucceeded"
                    && e.message == "PVC disk successfully populated by b")
        );

        let d = {
            let mut d = dv(json!({}));
            d.spec.source = None;
            d
        };
        let refused = external_status(&observe(&d, Some(&pending)), External { csi_driver: false });
        assert_eq!(phase_of(&refused), "Pending");
        assert!(
            refused
                .events
                .iter()
                .any(|e| e.reason == "NoCSIDriverForExternalPopulation" && e.warning)
        );
    }

    #[test]
    fn populated_claims_need_no_work() {
        let d = dv(json!({"phase": "Pending"}));
        let bound = claim("Bound", json!({}));
        let mut o = observe(&d, Some(&bound));
        o.populated = true;
        assert_eq!(phase_of(&import_status(&o)), "Succeeded");
    }
}
