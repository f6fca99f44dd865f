//! The doctor on what a DataVolume copies from: a DataSource that can never be ready as written,
//! a clone source that does not exist, one a pod writes, or a source not ready yet.

use cdi_api::datasource::{DATA_SOURCE_READY, DataSource};
use cdi_api::enums::DataSourceReason;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use k8s_openapi::jiff::Timestamp;

use super::{Cause, Finding, Scene, clause, finding, finished, name_of};
use crate::clone::wait::{CLONE_WITHOUT_SOURCE, source_needed};

use crate::clone::host::CLONE_SOURCE_IN_USE;

/// The events of `reason` about any of `on` (kind, name), newest first.
pub(super) fn events_on<'a>(s: &Scene<'a>, on: &[(&str, &str)], reason: &str) -> Vec<&'a Event> {
    let about = |e: &Event| {
        let o = &e.involved_object;
        on.iter()
            .any(|(k, n)| o.kind.as_deref() == Some(*k) && o.name.as_deref() == Some(*n))
    };
    let mut found: Vec<&'a Event> = s
        .events
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason) && about(e))
        .collect();
    found.sort_by_key(|e| std::cmp::Reverse(when(e)));
    found
}

/// When an event last happened: a series' last time, else its own.
fn when(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref())
        .map(|t| t.0)
        .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
}

/// What holds the DataVolume up at its source, if anything: a DataSource that can never be
/// ready (while no claim is made), a clone source that does not exist, one a pod writes, or a
/// source not ready yet by the DataVolume's Running condition (`run`: reason, message).
pub(super) fn find(
    s: &Scene<'_>,
    id: &str,
    claim: Option<&PersistentVolumeClaim>,
    prime: Option<&PersistentVolumeClaim>,
    run: (&str, &str),
) -> Option<Finding> {
    let claims: Vec<&PersistentVolumeClaim> = [claim, prime].into_iter().flatten().collect();
    let invalid = match claim {
        None => data_source_invalid(s, id),
        Some(_) => None,
    };
    invalid
        .or_else(|| source_missing(s, id, &claims, run.0))
        .or_else(|| source_in_use(s, id, &claims))
        .or_else(|| source_unpopulated(s, id, &claims))
        .or_else(|| not_ready(id, run))
}

fn data_source<'a>(s: &Scene<'a>, (ns, name): (&str, &str)) -> Option<&'a DataSource> {
    s.data_sources
        .iter()
        .find(|d| d.metadata.namespace.as_deref() == Some(ns) && name_of(&d.metadata) == name)
}

/// What the DataVolume copies from, as (kind, namespace, name): the PVC or VolumeSnapshot of its
/// `spec.source`, or what the DataSource its `sourceRef` names stands for.
fn copied_from(s: &Scene<'_>) -> Option<(&'static str, String, String)> {
    let dv = s.dv;
    let own = dv.metadata.namespace.as_deref().unwrap_or("");
    let or_own = |ns: &str| {
        if ns.is_empty() {
            own.to_string()
        } else {
            ns.to_string()
        }
    };
    let source = match crate::datasource::source_ref_target(dv) {
        Some(Ok(at)) => {
            let found = data_source(s, (at.0.as_str(), at.1.as_str()));
            crate::datasource::source_of_ref(dv, &at, found).ok()?
        }
        _ => dv.spec.source.clone()?,
    };
    if let Some(p) = &source.pvc {
        return Some(("PVC", or_own(p.namespace.as_str()), p.name.clone()));
    }
    let p = source.snapshot.as_ref()?;
    Some((
        "VolumeSnapshot",
        or_own(p.namespace.as_str()),
        p.name.clone(),
    ))
}

/// The DataSource the `sourceRef` names, when its Ready condition gives a reason only an edit of
/// that DataSource mends (it refers to itself, to another namespace, too deep, or to nothing):
/// no change elsewhere makes it ready, so CDI does not go on by itself.
fn data_source_invalid(s: &Scene<'_>, id: &str) -> Option<Finding> {
    let (ns, name) = crate::datasource::source_ref_target(s.dv)?.ok()?;
    let ready = data_source(s, (ns.as_str(), name.as_str()))?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == DATA_SOURCE_READY)?;
    let reason = ready.reason.as_deref().unwrap_or("");
    let why = match reason.parse::<DataSourceReason>().ok()? {
        DataSourceReason::SelfReference => {
            "its spec.source.dataSource names the DataSource itself, so it never resolves to an \
             image"
        }
        DataSourceReason::CrossNamespaceReference => {
            "its spec.source.dataSource names a DataSource of another namespace, which a \
             DataSource may not follow"
        }
        DataSourceReason::MaxReferenceDepthReached => {
            "its spec.source.dataSource names a DataSource that names another in turn, and a \
             DataSource follows one reference at most"
        }
        DataSourceReason::NoSource => "its spec.source names no PVC, VolumeSnapshot or DataSource",
        _ => return None,
    };
    let message = clause(ready.message.as_deref().unwrap_or(""));
    finding(
        Cause::DataSourceInvalid,
        format!("DataSource {ns}/{name} can never be ready: {reason} ({message})"),
        format!(
            "DataVolume {id} clones what DataSource {ns}/{name} names (spec.sourceRef), and that \
             DataSource is not ready and never will be as written: {why} (Ready=False, \
             {reason}: {message}). CDI does not go on by itself: make the DataSource's \
             spec.source name the image, a PVC (spec.source.pvc), a VolumeSnapshot \
             (spec.source.snapshot) or a DataSource of namespace {ns} that names one (kubectl \
             edit datasource -n {ns} {name}); the DataVolume goes on once the DataSource is \
             Ready."
        ),
    )
}

/// A clone waiting for a source that does not exist: said by the DataVolume's Running condition
/// (CloneWithoutSource), or by the event a clone controller records on the claim while a source
/// it has yet to read is missing (a controller that does not say so on the DataVolume). An event
/// outlives what it reported: not when the source is in the namespace now, nor once the copy
/// read it.
fn source_missing(
    s: &Scene<'_>,
    id: &str,
    claims: &[&PersistentVolumeClaim],
    run_reason: &str,
) -> Option<Finding> {
    let (kind, ns, name) = copied_from(s)?;
    if run_reason != CLONE_WITHOUT_SOURCE {
        let claim = claims.first()?;
        let here = kind == "PVC"
            && s.dv.metadata.namespace.as_deref() == Some(ns.as_str())
            && s.claims.iter().any(|c| name_of(&c.metadata) == name);
        let on: Vec<(&str, &str)> = claims
            .iter()
            .map(|c| ("PersistentVolumeClaim", name_of(&c.metadata)))
            .collect();
        if here || !source_needed(claim) || events_on(s, &on, CLONE_WITHOUT_SOURCE).is_empty() {
            return None;
        }
    }
    finding(
        Cause::SourceNotReady,
        format!("waits for source {kind} {ns}/{name} (deleted or not yet created)"),
        format!(
            "DataVolume {id} clones {kind} {ns}/{name}, which does not exist: it was deleted \
             before the copy read it, or is not created yet. Nothing is copied until it exists: \
             create it (or restore it), or delete the DataVolume and create it again from a \
             source that exists. CDI looks for the source again by itself and the clone goes \
             on once it is there."
        ),
    )
}

/// A clone waiting for pods that write its source (CloneSourceInUse: on its claim, or on the
/// DataVolume as upstream records it), named with the fix. An event outlives what it reported:
/// a pod of this namespace that is gone or done no longer counts, nor does any once the copy
/// read its source.
fn source_in_use(s: &Scene<'_>, id: &str, claims: &[&PersistentVolumeClaim]) -> Option<Finding> {
    if claims.first().is_some_and(|c| !source_needed(c)) {
        return None;
    }
    let own = s.dv.metadata.namespace.as_deref().unwrap_or("");
    let mut on = vec![("DataVolume", name_of(&s.dv.metadata))];
    on.extend(
        claims
            .iter()
            .map(|c| ("PersistentVolumeClaim", name_of(&c.metadata))),
    );
    let mut source = None;
    let mut writers: Vec<String> = Vec::new();
    for e in events_on(s, &on, CLONE_SOURCE_IN_USE) {
        let Some((pod, claim)) = e.message.as_deref().and_then(writer) else {
            continue;
        };
        let (pod_ns, pod_name) = pod.split_once('/').unwrap_or((own, pod));
        let gone = pod_ns == own
            && !s
                .pods
                .iter()
                .any(|p| name_of(&p.metadata) == pod_name && !finished(p));
        if gone {
            continue;
        }
        if source.is_none() {
            source = Some(format!("{pod_ns}/{claim}"));
        }
        let pod = format!("{pod_ns}/{pod_name}");
        if !writers.contains(&pod) {
            writers.push(pod);
        }
    }
    let source = source?;
    let src_ns = source.split_once('/').map_or("", |(ns, _)| ns);
    let (who, verb, them) = match writers.as_slice() {
        [one] => (format!("pod {one}"), "writes", "it"),
        many => (format!("pods {}", many.join(", ")), "write", "them"),
    };
    finding(
        Cause::SourceInUse,
        format!("clone source PVC {source} is in use by {who}"),
        format!(
            "DataVolume {id} waits to clone PVC {source}: {who} {verb} it, and CDI copies no \
             volume that may change while it is read. Stop {them} (a VM: virtctl stop), or have \
             {them} mount the claim read-only; CDI looks again by itself, and the clone starts \
             once no pod writes the source (kubectl get pods -n {src_ns} lists them)."
        ),
    )
}

/// A copy waiting for its source to be filled (the clone controller's CloneSourceNotPopulated
/// on the claim). An event outlives what it reported: not once the copy read the source, nor
/// when the source claim here says its own population succeeded.
fn source_unpopulated(
    s: &Scene<'_>,
    id: &str,
    claims: &[&PersistentVolumeClaim],
) -> Option<Finding> {
    let claim = claims.first()?;
    if !source_needed(claim) {
        return None;
    }
    let on: Vec<(&str, &str)> = claims
        .iter()
        .map(|c| ("PersistentVolumeClaim", name_of(&c.metadata)))
        .collect();
    let events = events_on(s, &on, crate::clone::host::CLONE_SOURCE_NOT_POPULATED);
    let message = events.first()?.message.as_deref()?;
    let source = message
        .strip_prefix(crate::clone::host::SOURCE_NOT_POPULATED)?
        .split(':')
        .next()?
        .trim();
    let (src_ns, src_name) = source.split_once('/')?;
    let done = s.dv.metadata.namespace.as_deref() == Some(src_ns)
        && s.claims
            .iter()
            .any(|c| name_of(&c.metadata) == src_name && crate::import::is_complete(c));
    if done {
        return None;
    }
    finding(
        Cause::SourceNotReady,
        format!("waits for source PVC {source} to be populated"),
        format!(
            "DataVolume {id} clones PVC {source}, which is not populated yet (its DataVolume \
             has not succeeded: an import, upload or clone still to finish). The copy starts \
             by itself once it has; `cdi doctor` on the source's DataVolume says what holds it."
        ),
    )
}

/// The pod and the claim a CloneSourceInUse event names: `pod <ns>/<name> using
/// PersistentVolumeClaim <claim>`, after `[tmp-pvc-…] : ` when copied from a temporary claim.
fn writer(m: &str) -> Option<(&str, &str)> {
    let (before, claim) = m.split_once(" using PersistentVolumeClaim ")?;
    let pod = before.rsplit(' ').next().filter(|p| !p.is_empty())?;
    Some((pod, claim.trim()))
}

/// A source not ready yet, by the DataVolume's Running condition: CDI goes on once it is.
fn not_ready(id: &str, (reason, message): (&str, &str)) -> Option<Finding> {
    if !matches!(
        reason,
        CLONE_WITHOUT_SOURCE | "SnapshotNotReady" | "DataSourceNotFound" | "DataSourceNotReady"
    ) {
        return None;
    }
    finding(
        Cause::SourceNotReady,
        format!("its source is not ready: {message}"),
        format!(
            "DataVolume {id} waits for its source ({reason}): {message}. Create the source, or \
             wait until it is ready (a DataSource is ready once its claim or snapshot is); CDI \
             goes on by itself."
        ),
    )
}
