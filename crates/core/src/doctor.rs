//! `cdi doctor` (docs/doctor.md): why a DataVolume is not progressing, and what to do, from what the
//! cluster shows — the DataVolume's conditions, its claims, their class and profile, CDIConfig,
//! the pods that fill or use the claims, the nodes and the events. One cause is named: the
//! first that applies in the order below, which goes from what stops everything (a failure) to
//! what only slows things down (a clone's fallback).
//!
//! Everything is read as the cluster has it, written by anyone: a missing or odd field makes a
//! finding less precise, never a panic.

use std::collections::BTreeMap;

use cdi_api::config::CDIConfig;
use cdi_api::datasource::DataSource;
use cdi_api::datavolume::DataVolume;
use cdi_api::storageprofile::StorageProfile;
use cdi_api::{ann, ext, label};
use k8s_openapi::api::core::v1::{
    Event, Node, PersistentVolume, PersistentVolumeClaim, Pod, Taint, Toleration,
};
use k8s_openapi::api::storage::v1::StorageClass;
use serde::Serialize;

mod source;
mod text;
mod worker;

/// What the doctor reads for one DataVolume: the DataVolume and the rest of its namespace (claims,
/// pods, events) and of the cluster (volumes, classes, profiles, nodes, CDIConfig, the CDI
/// resource's name, the DataSources a `sourceRef` may name).
pub struct Scene<'a> {
    pub dv: &'a DataVolume,
    pub claims: &'a [PersistentVolumeClaim],
    pub volumes: &'a [PersistentVolume],
    pub classes: &'a [StorageClass],
    pub profiles: &'a [StorageProfile],
    pub config: Option<&'a CDIConfig>,
    /// The CDI resource's name, for the `spec.workload` fix (`cdi` when there is none).
    pub cdi: Option<&'a str>,
    pub pods: &'a [Pod],
    pub nodes: &'a [Node],
    pub events: &'a [Event],
    /// The namespace's DataSources, and those of other namespaces a `sourceRef` names.
    pub data_sources: &'a [DataSource],
}

/// The cause the doctor names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Cause {
    /// Done: the claim holds the disk.
    Succeeded,
    /// `Failed`: CDI will not try again.
    Failed,
    /// A pod using the claim cannot run where the volume is, because the immediate-bind
    /// annotation (or `--force-bind`) let the worker pod choose the node.
    ImmediateBind,
    /// As above, because `HonorWaitForFirstConsumer` is off.
    GateOff,
    /// A pod using the claim cannot run where the volume is.
    ConsumerBlocked,
    /// No class named and none is the default.
    NoDefaultStorageClass,
    /// `spec.storage` leaves the access modes to a profile that has none.
    ProfileWithoutClaimPropertySets,
    /// The claim CDI would create is not valid (other render errors).
    ClaimNotValid,
    /// The storage provisioner fails to make the volume.
    ProvisioningFailed,
    /// A ResourceQuota refused the worker pod.
    Quota,
    /// The API server refused the worker pod for another reason.
    WorkerRefused,
    /// The clone or DataSource source does not exist or is not ready.
    SourceNotReady,
    /// A pod writes the clone's source: the copy waits until none does.
    SourceInUse,
    /// The DataSource the `sourceRef` names can never be ready as written (it refers to itself,
    /// to another namespace, too deep, or to nothing).
    DataSourceInvalid,
    /// The worker pod cannot be scheduled.
    WorkerUnschedulable,
    /// The worker pod keeps failing and restarting.
    CrashLoop,
    /// The claim waits for its first consumer, and nothing uses it.
    WaitingForConsumer,
    /// The first consumer exists but cannot be scheduled.
    ConsumerUnschedulable,
    /// The `cdi-rs.dev/first-consumer` template cannot be read.
    FirstConsumerTemplate,
    /// The upload pod is ready and waits for a client.
    UploadWaiting,
    /// A clone proceeds by a slower host-assisted copy.
    CloneFallback,
    /// Work is under way.
    Progressing,
    /// None of the above: the conditions are quoted.
    Pending,
}

/// The doctor's answer for one DataVolume.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Diagnosis {
    pub namespace: String,
    pub name: String,
    pub phase: String,
    pub progress: String,
    pub cause: Cause,
    /// One line, for the listing.
    pub summary: String,
    /// One paragraph: what is happening, why, and what to do.
    pub explanation: String,
}

fn anns(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    meta.annotations.as_ref().unwrap_or(&EMPTY)
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or("")
}

/// The DataVolume's condition `type_`: (status, reason, message), empty strings when absent.
fn condition<'a>(dv: &'a DataVolume, type_: &str) -> (&'a str, &'a str, &'a str) {
    dv.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_.as_str() == type_)
        .map(|c| {
            (
                c.status.as_str(),
                c.reason.as_ref().map(|r| r.as_str()).unwrap_or(""),
                c.message.as_deref().unwrap_or(""),
            )
        })
        .unwrap_or(("", "", ""))
}

fn claim_phase(c: &PersistentVolumeClaim) -> &str {
    c.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// CDI's own pods (importer, upload, cloner, the first-consumer pod).
fn is_cdis(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(label::APP))
        .is_some_and(|v| v == label::APP_VALUE)
}

fn is_first_consumer(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(ext::FIRST_CONSUMER_FOR))
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) || pod.metadata.deletion_timestamp.is_some()
}

/// The scheduler's reason when `pod` is unschedulable (and not on its way out).
fn unschedulable(pod: &Pod) -> Option<&str> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    crate::first_consumer::unschedulable(pod).map(clause)
}

/// A quoted message as a clause: its first meaningful line (a message can be a whole log),
/// without its final full stop, since the doctor's sentence goes on after it.
fn clause(m: &str) -> &str {
    text::first_line(m).trim_end_matches('.')
}

fn times(n: i32) -> String {
    match n {
        1 => "once".into(),
        2 => "twice".into(),
        n => format!("{n} times"),
    }
}

/// The node a claim's volume is on: the scheduler's choice, or the volume's node affinity.
fn node_of(claim: &PersistentVolumeClaim, volumes: &[PersistentVolume]) -> Option<String> {
    if let Some(n) = anns(&claim.metadata).get(ann::SELECTED_NODE) {
        return Some(n.clone());
    }
    let volume = claim.spec.as_ref()?.volume_name.as_deref()?;
    let pv = volumes.iter().find(|v| name_of(&v.metadata) == volume)?;
    pv.spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .find(|e| e.key == "kubernetes.io/hostname" && e.operator == "In")
        .and_then(|e| e.values.as_ref()?.first().cloned())
}

fn taint_text(t: &Taint) -> String {
    match t.value.as_deref() {
        Some(v) if !v.is_empty() => format!("{}={v}:{}", t.key, t.effect),
        _ => format!("{}:{}", t.key, t.effect),
    }
}

/// What keeps `pod` off `node`: the node's untolerated NoSchedule/NoExecute taints, and the
/// pod's node selector terms the node does not carry.
fn blockers(pod: &Pod, node: &Node) -> (Vec<Taint>, Vec<String>) {
    let tolerations: &[Toleration] = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or(&[]);
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
        .filter(|t| {
            !tolerations
                .iter()
                .any(|tol| crate::placement::tolerates(tol, t))
        })
        .cloned()
        .collect();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let selector = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, v)| labels.get(k) != Some(v))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    (taints, selector)
}

fn class_of<'a>(s: &Scene<'a>, claim: Option<&PersistentVolumeClaim>) -> Option<&'a StorageClass> {
    let named = claim
        .and_then(|c| c.spec.as_ref()?.storage_class_name.as_deref())
        .or_else(|| requested_class(s.dv));
    match named {
        Some(n) => s.classes.iter().find(|c| name_of(&c.metadata) == n),
        None => crate::render::default_storage_class(s.classes, true),
    }
}

fn requested_class(dv: &DataVolume) -> Option<&str> {
    dv.spec
        .pvc
        .as_ref()
        .and_then(|p| p.storage_class_name.as_deref())
        .or_else(|| {
            dv.spec
                .storage
                .as_ref()
                .and_then(|p| p.storage_class_name.as_deref())
        })
}

fn is_wffc(class: Option<&StorageClass>) -> bool {
    class.and_then(|c| c.volume_binding_mode.as_deref()) == Some("WaitForFirstConsumer")
}

fn gate_on(config: Option<&CDIConfig>) -> bool {
    config.is_some_and(|c| {
        c.spec
            .gate_enabled(cdi_api::gate::HONOR_WAIT_FOR_FIRST_CONSUMER)
    })
}

/// The claim's last warning event of `reason`, newest first.
fn last_warning<'a>(s: &'a Scene<'_>, kind: &str, name: &str, reason: &str) -> Option<&'a str> {
    s.events
        .iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some(kind)
                && e.involved_object.name.as_deref() == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .max_by_key(|e| {
            e.last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or_else(|| e.event_time.as_ref().map(|t| t.0))
        })
        .and_then(|e| e.message.as_deref())
        .map(clause)
}

/// The toleration a fix would add for `t`, as JSON.
fn toleration_json(t: &Taint) -> String {
    match t.value.as_deref() {
        Some(v) if !v.is_empty() => format!(
            r#"{{"key":"{}","operator":"Equal","value":"{v}","effect":"{}"}}"#,
            t.key, t.effect
        ),
        _ => format!(
            r#"{{"key":"{}","operator":"Exists","effect":"{}"}}"#,
            t.key, t.effect
        ),
    }
}

struct Finding {
    cause: Cause,
    summary: String,
    explanation: String,
}

fn finding(
    cause: Cause,
    summary: impl Into<String>,
    explanation: impl Into<String>,
) -> Option<Finding> {
    Some(Finding {
        cause,
        summary: summary.into(),
        explanation: explanation.into(),
    })
}

/// Why the DataVolume of `s` is where it is, and what to do.
pub fn diagnose(s: &Scene<'_>) -> Diagnosis {
    let dv = s.dv;
    let ns = dv.metadata.namespace.clone().unwrap_or_default();
    let name = name_of(&dv.metadata).to_string();
    let status = dv.status.as_ref();
    let phase = status
        .and_then(|s| s.phase.as_ref())
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let progress = status
        .and_then(|s| s.progress.clone())
        .unwrap_or_else(|| "N/A".into());
    let found = find(s, &ns, &name, &phase).unwrap_or_else(|| {
        let conditions: Vec<String> = ["Running", "Bound", "Ready"]
            .iter()
            .filter_map(|t| {
                let (st, reason, message) = condition(dv, t);
                (!st.is_empty()).then(|| {
                    let reason = if reason.is_empty() { "" } else { reason };
                    format!("{t}={st} {reason} {message}")
                        .trim_end()
                        .to_string()
                })
            })
            .collect();
        let phase_text = if phase.is_empty() {
            "no phase yet"
        } else {
            &phase
        };
        Finding {
            cause: Cause::Pending,
            summary: format!("{phase_text}; no known cause"),
            explanation: format!(
                "DataVolume {ns}/{name} is {phase_text} and none of the causes cdi doctor knows \
                 applies. {}Its controller's log (kubectl logs -n cdi deploy/cdi-deployment) \
                 says what it last did with it.",
                if conditions.is_empty() {
                    "It has no conditions: is the CDI controller running? ".to_string()
                } else {
                    format!("Its conditions: {}. ", conditions.join("; "))
                }
            ),
        }
    });
    Diagnosis {
        namespace: ns,
        name,
        phase,
        progress,
        cause: found.cause,
        summary: text::summary(&found.summary),
        explanation: found.explanation,
    }
}

/// The first cause that applies, in this order: from what stops everything (a failure) to what
/// only slows things down (a clone's fallback).
fn find(s: &Scene<'_>, ns: &str, name: &str, phase: &str) -> Option<Finding> {
    let l = Look::new(s, ns, name, phase);
    failed(&l)
        .or_else(|| consumer_blocked(s, &l.id, l.claim))
        .or_else(|| succeeded(&l))
        .or_else(|| no_default_class(&l))
        .or_else(|| claim_not_valid(&l))
        .or_else(|| provisioning_failed(&l))
        .or_else(|| quota(&l))
        .or_else(|| worker_refused(&l))
        .or_else(|| source::find(s, &l.id, l.claim, l.prime, (l.run_reason, l.run_message)))
        .or_else(|| worker_trouble(&l))
        .or_else(|| waiting_for_consumer(s, &l.id, phase, l.claim, l.prime))
        .or_else(|| upload_waiting(&l))
        .or_else(|| clone_fallback(&l))
        .or_else(|| progressing(&l))
}

/// What every check of [`find`] reads: the DataVolume, its claim and PVC prime, and its
/// Running condition.
struct Look<'a> {
    s: &'a Scene<'a>,
    dv: &'a DataVolume,
    /// `namespace/name`.
    id: String,
    ns: &'a str,
    name: &'a str,
    phase: &'a str,
    claim_name: &'a str,
    claim: Option<&'a PersistentVolumeClaim>,
    prime: Option<&'a PersistentVolumeClaim>,
    run_reason: &'a str,
    /// As a clause.
    run_message: &'a str,
}

impl<'a> Look<'a> {
    fn new(s: &'a Scene<'a>, ns: &'a str, name: &'a str, phase: &'a str) -> Look<'a> {
        let dv = s.dv;
        let claim_name = dv
            .status
            .as_ref()
            .and_then(|st| st.claim_name.as_deref())
            .unwrap_or(name);
        let claim = s.claims.iter().find(|c| name_of(&c.metadata) == claim_name);
        let prime = claim.and_then(|c| {
            let by_ann = anns(&c.metadata).get(ann::PVC_PRIME_NAME).cloned();
            let uid = c.metadata.uid.as_deref().unwrap_or("");
            let by_uid = (!uid.is_empty()).then(|| format!("prime-{uid}"));
            s.claims.iter().find(|p| {
                let n = name_of(&p.metadata);
                Some(n) == by_ann.as_deref() || Some(n) == by_uid.as_deref()
            })
        });
        let (_, run_reason, run_message) = condition(dv, "Running");
        Look {
            s,
            dv,
            id: format!("{ns}/{name}"),
            ns,
            name,
            phase,
            claim_name,
            claim,
            prime,
            run_reason,
            run_message: clause(run_message),
        }
    }

    /// The claim and PVC prime, those that exist.
    fn claims(&self) -> impl Iterator<Item = &'a PersistentVolumeClaim> {
        [self.claim, self.prime].into_iter().flatten()
    }

    /// The first of the claims' annotation `key`, empty when none has it.
    fn claim_running(&self, key: &str) -> String {
        self.claims()
            .find_map(|c| anns(&c.metadata).get(key).cloned())
            .unwrap_or_default()
    }
}

fn failed(l: &Look<'_>) -> Option<Finding> {
    if l.phase != "Failed" {
        return None;
    }
    let (id, ns, name) = (&l.id, l.ns, l.name);
    let why = if l.run_message.is_empty() {
        clause(condition(l.dv, "Ready").2)
    } else {
        l.run_message
    };
    finding(
        Cause::Failed,
        format!("failed for good: {why}"),
        format!(
            "DataVolume {id} failed and CDI will not try again: {why}. Fix what the message \
             names (the source, its checksum or the image), then delete the DataVolume and \
             create it again (kubectl delete dv -n {ns} {name}; kubectl apply -f …)."
        ),
    )
}

fn succeeded(l: &Look<'_>) -> Option<Finding> {
    if l.phase != "Succeeded" {
        return None;
    }
    let (id, claim_name) = (&l.id, l.claim_name);
    finding(
        Cause::Succeeded,
        format!("succeeded: claim {claim_name} holds the disk"),
        format!(
            "DataVolume {id} succeeded: claim {claim_name} holds the disk, and every pod \
             using it can be scheduled. Nothing to do."
        ),
    )
}

fn no_default_class(l: &Look<'_>) -> Option<Finding> {
    let (id, claim, claim_name) = (&l.id, l.claim, l.claim_name);
    let pending_claim = claim.is_none_or(|c| claim_phase(c) == "Pending");
    let no_class = pending_claim
        && requested_class(l.dv).is_none()
        && crate::render::default_storage_class(l.s.classes, true).is_none()
        && claim.is_none_or(|c| {
            c.spec
                .as_ref()
                .and_then(|sp| sp.storage_class_name.as_deref())
                .is_none()
        });
    if !no_class {
        return None;
    }
    finding(
        Cause::NoDefaultStorageClass,
        "no StorageClass named and none is the default",
        format!(
            "DataVolume {id} names no StorageClass and no class is marked default, so its \
             claim {} Name one in spec.storage.storageClassName (or spec.pvc), or make one \
             the default: kubectl patch storageclass CLASS -p \
             '{{\"metadata\":{{\"annotations\":{{\"storageclass.kubernetes.io/is-default-class\":\"true\"}}}}}}'.",
            if claim.is_some() {
                format!("{claim_name} has no class and nothing binds it.")
            } else {
                "cannot be made.".to_string()
            }
        ),
    )
}

/// CDI cannot make the claim: a profile without claimPropertySets, no class, another render
/// error, or a clone its source could never fill (no claim is made until the DataVolume
/// changes).
fn claim_not_valid(l: &Look<'_>) -> Option<Finding> {
    let (id, run_message) = (&l.id, l.run_message);
    if l.run_reason == "ErrClaimNotValid" {
        if run_message.contains("claimPropertySet") {
            let class = class_of(l.s, l.claim);
            let class_name = class.map(|c| name_of(&c.metadata)).unwrap_or("");
            let provisioner = class.map(|c| c.provisioner.as_str()).unwrap_or("");
            return finding(
                Cause::ProfileWithoutClaimPropertySets,
                format!("StorageProfile {class_name} has no claimPropertySets"),
                format!(
                    "DataVolume {id} uses spec.storage without accessModes, so CDI takes them \
                     from StorageProfile {class_name}, which has none: CDI knows no defaults for \
                     its provisioner {provisioner}. Fill the profile: kubectl patch \
                     storageprofile {class_name} --type merge -p \
                     '{{\"spec\":{{\"claimPropertySets\":[{{\"accessModes\":[\"ReadWriteOnce\"],\"volumeMode\":\"Filesystem\"}}]}}}}' \
                     (the modes the storage supports), or set spec.storage.accessModes and \
                     volumeMode in the DataVolume. ({run_message})"
                ),
            );
        }
        if run_message.contains("no StorageClass") {
            return finding(
                Cause::NoDefaultStorageClass,
                "no StorageClass named and none is the default",
                format!(
                    "DataVolume {id}: {run_message}. Name a class in \
                     spec.storage.storageClassName, or mark one default with the \
                     storageclass.kubernetes.io/is-default-class annotation."
                ),
            );
        }
        return finding(
            Cause::ClaimNotValid,
            format!("its claim cannot be made: {run_message}"),
            format!("DataVolume {id} has no claim because CDI cannot make one: {run_message}."),
        );
    }
    if l.run_reason == "CloneValidationFailed" {
        return finding(
            Cause::ClaimNotValid,
            format!("its clone cannot be made: {run_message}"),
            format!(
                "DataVolume {id} has no claim because its source could never be copied into \
                 the claim it asks for: {run_message}. Delete the DataVolume and create it \
                 again with a larger size (or without one, to take the source's), or the \
                 source's content type."
            ),
        );
    }
    None
}

fn provisioning_failed(l: &Look<'_>) -> Option<Finding> {
    let (id, ns) = (&l.id, l.ns);
    for c in l.claims() {
        let cname = name_of(&c.metadata);
        if claim_phase(c) == "Pending"
            && let Some(m) = last_warning(l.s, "PersistentVolumeClaim", cname, "ProvisioningFailed")
        {
            let class = c
                .spec
                .as_ref()
                .and_then(|sp| sp.storage_class_name.as_deref())
                .unwrap_or("");
            return finding(
                Cause::ProvisioningFailed,
                format!("the provisioner cannot make claim {cname}'s volume: {m}"),
                format!(
                    "Claim {ns}/{cname} of DataVolume {id} is Pending because the provisioner of \
                     StorageClass {class} fails to make its volume: {m}. Fix the class or its \
                     provisioner (kubectl describe pvc -n {ns} {cname}); CDI goes on once the \
                     claim is bound."
                ),
            );
        }
    }
    None
}

fn quota(l: &Look<'_>) -> Option<Finding> {
    let (id, ns) = (&l.id, l.ns);
    let refused = [
        l.run_message.to_string(),
        clause(&l.claim_running(ann::RUNNING_CONDITION_MESSAGE)).to_string(),
    ];
    // A claim a quota refuses is said by an event on the DataVolume, as upstream does.
    let claim_refused = l
        .claim
        .is_none()
        .then(|| last_warning(l.s, "DataVolume", l.name, crate::import::ERR_EXCEEDED_QUOTA))
        .flatten()
        .map(|m| m.to_string());
    let m = refused
        .iter()
        .chain(claim_refused.iter())
        .find(|m| m.contains("exceeded quota") || m.contains("failed quota"))?;
    finding(
        Cause::Quota,
        "a ResourceQuota refuses its claim or worker pod",
        format!(
            "DataVolume {id} cannot start its work: a ResourceQuota of namespace {ns} \
             refuses its claim or worker pod ({m}). Raise the quota (kubectl describe resourcequota -n {ns}), or \
             lower what CDI's worker pods ask for with CDIConfig \
             spec.podResourceRequirements; CDI tries again on its own."
        ),
    )
}

/// The API server refused the worker pod. (A quota's refusal, ErrExceededQuota, is [`quota`]'s.)
fn worker_refused(l: &Look<'_>) -> Option<Finding> {
    let refused_reason = l.run_reason == crate::import::ERR_CREATING_POD
        || l.claim_running(ann::RUNNING_CONDITION_REASON) == crate::import::ERR_CREATING_POD;
    if !refused_reason {
        return None;
    }
    let id = &l.id;
    let claims: Vec<&PersistentVolumeClaim> = l.claims().collect();
    let m = worker::refusal(l.s, &claims, (l.run_reason, l.run_message));
    finding(
        Cause::WorkerRefused,
        format!("the API server refuses the worker pod: {m}"),
        format!(
            "DataVolume {id} cannot start its worker pod: the API server refuses it ({m}). \
             CDI builds worker pods from CDIConfig spec.podResourceRequirements and the CDI \
             resource's spec.workload: fix the setting the message names there; CDI tries \
             again on its own."
        ),
    )
}

/// The pods that fill the claims: one that cannot be scheduled, else one in a crash loop.
fn worker_trouble(l: &Look<'_>) -> Option<Finding> {
    let (id, ns) = (&l.id, l.ns);
    let workers: Vec<&Pod> =
        l.s.pods
            .iter()
            .filter(|p| is_cdis(p) && !is_first_consumer(p) && !finished(p))
            .filter(|p| {
                l.claims()
                    .any(|c| crate::placement::mounts(p, name_of(&c.metadata)))
            })
            .collect();
    for pod in &workers {
        if let Some(why) = unschedulable(pod) {
            return Some(worker_unschedulable(l.s, id, pod, why, l.claim, l.prime));
        }
    }
    for pod in &workers {
        if let Some((count, last)) = worker::crash_loop(pod) {
            let last = last
                .or_else(|| (!l.run_message.is_empty()).then(|| l.run_message.to_string()))
                .unwrap_or_else(|| "no message".into());
            let last = clause(&last);
            let pod_name = name_of(&pod.metadata);
            let restarted = times(count);
            return finding(
                Cause::CrashLoop,
                format!("worker pod {pod_name} restarted {restarted}: {last}"),
                format!(
                    "DataVolume {id} is retrying: its worker pod {pod_name} failed and was \
                     restarted {restarted}, last with: {last}. CDI retries such errors (an \
                     unreachable or refusing source, a volume too slow or full) until they go. \
                     A fix to the server, the Secret or the certConfigMap is taken at the next \
                     restart; a wrong source needs the DataVolume deleted and created again \
                     with the right one (kubectl logs -n {ns} {pod_name} --previous shows the \
                     whole error)."
                ),
            );
        }
    }
    None
}

fn upload_waiting(l: &Look<'_>) -> Option<Finding> {
    if l.phase != "UploadReady" {
        return None;
    }
    let (id, ns, name) = (&l.id, l.ns, l.name);
    finding(
        Cause::UploadWaiting,
        "the upload pod is ready and waits for a client",
        format!(
            "DataVolume {id} is UploadReady: its upload pod waits for the image. Send it: \
             cdi image-upload dv {name} -n {ns} --no-create --image-path FILE (or virtctl \
             image-upload with the same arguments)."
        ),
    )
}

fn clone_fallback(l: &Look<'_>) -> Option<Finding> {
    let fallback = clause(&l.claim_running(ann::CLONE_FALLBACK_REASON)).to_string();
    if fallback.is_empty() {
        return None;
    }
    let id = &l.id;
    finding(
        Cause::CloneFallback,
        format!("cloning by a host-assisted copy: {fallback}"),
        format!(
            "DataVolume {id} is cloned by copying the data through pods (slower than a CSI \
             clone or snapshot) because: {fallback}. It goes on; for a faster clone next \
             time, fix what the reason names (a VolumeSnapshotClass for the driver, the same \
             provisioner and volume mode on both sides)."
        ),
    )
}

fn progressing(l: &Look<'_>) -> Option<Finding> {
    let (id, phase, run_message) = (&l.id, l.phase, l.run_message);
    let (running, _, _) = condition(l.dv, "Running");
    let moving = running == "True"
        || matches!(
            phase,
            "ImportInProgress"
                | "CloneInProgress"
                | "UploadScheduled"
                | "ImportScheduled"
                | "CloneScheduled"
                | "CSICloneInProgress"
                | "SnapshotForSmartCloneInProgress"
                | "SmartClonePVCInProgress"
                | "ExpansionInProgress"
                | "NamespaceTransferInProgress"
                | "PrepClaimInProgress"
                | "RebindInProgress"
                | "PVCBound"
        );
    if !moving {
        return None;
    }
    finding(
        Cause::Progressing,
        format!(
            "{phase}, progress {}",
            l.dv.status
                .as_ref()
                .and_then(|st| st.progress.as_deref())
                .unwrap_or("N/A")
        ),
        format!(
            "DataVolume {id} is {phase} and nothing stops it{}.",
            if run_message.is_empty() {
                String::new()
            } else {
                format!(" ({run_message})")
            }
        ),
    )
}

/// A pod using the bound claim that cannot be scheduled, and why the volume is where it is.
fn consumer_blocked(
    s: &Scene<'_>,
    id: &str,
    claim: Option<&PersistentVolumeClaim>,
) -> Option<Finding> {
    let claim = claim?;
    if claim_phase(claim) != "Bound" {
        return None;
    }
    let cname = name_of(&claim.metadata);
    let (pod, why) = s
        .pods
        .iter()
        .filter(|p| !is_cdis(p) && crate::placement::mounts(p, cname))
        .find_map(|p| unschedulable(p).map(|why| (p, why)))?;
    let pod_name = name_of(&pod.metadata);
    let node = node_of(claim, s.volumes).unwrap_or_else(|| "its node".into());
    let class = class_of(s, Some(claim));
    // On the DataVolume (`--force-bind` of a DataVolume upload) or, for a claim CDI did not
    // make, on the claim (`--force-bind` of a claim upload).
    let immediate = anns(&s.dv.metadata).contains_key(ann::IMMEDIATE_BINDING)
        || anns(&claim.metadata).contains_key(ann::IMMEDIATE_BINDING);
    let recreate = "delete the DataVolume and create it again so the consumer's pod chooses the \
                    node, then start the consumer";
    // Without the gate CDI marks every claim for immediate binding itself: the gate first.
    let (cause, because) = if is_wffc(class) && !gate_on(s.config) {
        (
            Cause::GateOff,
            format!(
                "the HonorWaitForFirstConsumer feature gate is off, so CDI's worker pod bound \
                 the WaitForFirstConsumer claim on {node} before any consumer existed. Add \
                 HonorWaitForFirstConsumer to the featureGates of the CDI resource's \
                 spec.config (or of CDIConfig config when no operator manages it), \
                 then {recreate}"
            ),
        )
    } else if immediate && is_wffc(class) {
        (
            Cause::ImmediateBind,
            format!(
                "the DataVolume asked for immediate binding ({} — also what `image-upload \
                 --force-bind` sets), so CDI's worker pod, not the consumer, chose {node}. \
                 Remove the annotation, {recreate}",
                ann::IMMEDIATE_BINDING
            ),
        )
    } else {
        (
            Cause::ConsumerBlocked,
            format!(
                "the volume is on {node}. Let the pod run there (its node selector, affinity \
                 and tolerations), or {recreate}"
            ),
        )
    };
    finding(
        cause,
        format!(
            "pod {pod_name} using claim {cname} cannot be scheduled where the volume is ({node})"
        ),
        format!(
            "DataVolume {id}'s claim {cname} is bound to a volume on {node}, and pod {pod_name}, \
             which uses it, cannot be scheduled: {why}. This is because {because}."
        ),
    )
}

fn worker_unschedulable(
    s: &Scene<'_>,
    id: &str,
    pod: &Pod,
    why: &str,
    claim: Option<&PersistentVolumeClaim>,
    prime: Option<&PersistentVolumeClaim>,
) -> Finding {
    let pod_name = name_of(&pod.metadata);
    let node_name = [claim, prime]
        .into_iter()
        .flatten()
        .find_map(|c| node_of(c, s.volumes));
    let node = node_name
        .as_deref()
        .and_then(|n| s.nodes.iter().find(|x| name_of(&x.metadata) == n));
    let cdi = s.cdi.unwrap_or("cdi");
    let (taints, selector) = node.map(|n| blockers(pod, n)).unwrap_or_default();
    let mut text = format!(
        "DataVolume {id} waits for its worker pod {pod_name}, which cannot be scheduled: {why}."
    );
    let summary;
    if let (Some(n), false) = (&node_name, taints.is_empty()) {
        let list: Vec<String> = taints.iter().map(taint_text).collect();
        summary = format!(
            "worker pod {pod_name} does not tolerate taint {} of node {n}, where the claim is",
            list.join(", ")
        );
        let follows = claim.is_none_or(|c| crate::placement::follows_consumer(c, s.config));
        let opted_out_on_dv = anns(&s.dv.metadata)
            .get(ext::WORKER_PLACEMENT)
            .is_some_and(|v| v.trim().eq_ignore_ascii_case(crate::placement::UPSTREAM));
        let first = if follows {
            "give the claim's first consumer (the VM, or the cdi-rs.dev/first-consumer \
             template) a toleration for it: CDI's worker pods inherit the consumer's \
             tolerations for the taints of the node it chose"
                .to_string()
        } else if opted_out_on_dv {
            let claim_name = claim.map(|c| name_of(&c.metadata)).unwrap_or("");
            format!(
                "remove the {key} annotation (it asks for upstream's placement) from the \
                 DataVolume's claim and delete the waiting pod, so that CDI records the \
                 tolerations of the consumer that chose {n} and makes a new pod that has them \
                 (kubectl annotate pvc -n {ns} {claim_name} {key}-; kubectl delete pod -n \
                 {ns} {pod_name})",
                key = ext::WORKER_PLACEMENT,
                ns = s.dv.metadata.namespace.as_deref().unwrap_or(""),
            )
        } else {
            format!(
                "remove the {} annotation from CDIConfig config (it asks for upstream's \
                 placement for every DataVolume) and delete the waiting pod {pod_name}, so \
                 that CDI records the tolerations of the consumer that chose the node and makes \
                 a new pod that has them",
                ext::WORKER_PLACEMENT
            )
        };
        let tolerations: Vec<String> = taints.iter().map(toleration_json).collect();
        text.push_str(&format!(
            " The claim's volume is on node {n}, whose taint {} the pod does not tolerate. \
             Either {first}; or let every CDI worker pod tolerate it through the CDI resource: \
             kubectl patch cdi {cdi} --type merge -p \
             '{{\"spec\":{{\"workload\":{{\"tolerations\":[{}]}}}}}}'.",
            list.join(", "),
            tolerations.join(",")
        ));
    } else if let (Some(n), false) = (&node_name, selector.is_empty()) {
        summary = format!(
            "worker pod {pod_name}'s node selector {} does not match node {n}, where the claim is",
            selector.join(", ")
        );
        text.push_str(&format!(
            " The claim's volume is on node {n}, which lacks the labels {} that the CDI \
             resource's spec.workload.nodeSelector asks of every worker pod. Change \
             spec.workload of CDI {cdi} (kubectl edit cdi {cdi}), or label the node.",
            selector.join(", ")
        ));
    } else {
        summary = format!("worker pod {pod_name} cannot be scheduled: {why}");
        text.push_str(&format!(
            " The CDI resource's spec.workload (kubectl edit cdi {cdi}) sets the node \
             selector, affinity and tolerations of every worker pod; CDIConfig \
             spec.podResourceRequirements what they ask for."
        ));
    }
    Finding {
        cause: Cause::WorkerUnschedulable,
        summary,
        explanation: text,
    }
}

/// The claim (or PVC prime) waits for a first consumer under WaitForFirstConsumer.
fn waiting_for_consumer(
    s: &Scene<'_>,
    id: &str,
    phase: &str,
    claim: Option<&PersistentVolumeClaim>,
    prime: Option<&PersistentVolumeClaim>,
) -> Option<Finding> {
    if !matches!(phase, "WaitForFirstConsumer" | "PendingPopulation") {
        return None;
    }
    let claim = claim?;
    let cname = name_of(&claim.metadata);
    if claim_phase(claim) != "Pending" {
        return None;
    }
    let class = class_of(s, Some(claim));
    let class_name = class.map(|c| name_of(&c.metadata)).unwrap_or("");
    if let Some(Err(m)) = crate::first_consumer::template(s.dv) {
        return finding(
            Cause::FirstConsumerTemplate,
            "its first-consumer template cannot be read",
            format!("DataVolume {id} waits for a first consumer, and {m}."),
        );
    }
    let consumers: Vec<&Pod> = s
        .pods
        .iter()
        .filter(|p| (!is_cdis(p) || is_first_consumer(p)) && !finished(p))
        .filter(|p| {
            [Some(claim), prime]
                .into_iter()
                .flatten()
                .any(|c| crate::placement::mounts(p, name_of(&c.metadata)))
        })
        .collect();
    if let Some((pod, why)) = consumers
        .iter()
        .find_map(|p| unschedulable(p).map(|w| (p, w)))
    {
        let pod_name = name_of(&pod.metadata);
        let what = if is_first_consumer(pod) {
            format!(
                "the pod cdi-rs made from the {} template",
                ext::FIRST_CONSUMER
            )
        } else {
            "the consumer".to_string()
        };
        return finding(
            Cause::ConsumerUnschedulable,
            format!("first consumer {pod_name} cannot be scheduled: {why}"),
            format!(
                "DataVolume {id}'s claim {cname} (StorageClass {class_name}, \
                 WaitForFirstConsumer) is bound where its first consumer is scheduled, and \
                 {what}, pod {pod_name}, cannot be: {why}. Change its node selector, affinity \
                 or tolerations so that a node fits, or free room on a node that does."
            ),
        );
    }
    if !consumers.is_empty() {
        return None;
    }
    finding(
        Cause::WaitingForConsumer,
        format!("claim {cname} waits for a first consumer, and no pod uses it"),
        format!(
            "DataVolume {id} waits for its first consumer: its claim {cname} is of StorageClass \
             {class_name}, which binds WaitForFirstConsumer, and no pod uses it yet, so no node \
             is chosen and nothing is imported. Start what uses the disk (a VM with this \
             DataVolume starts its import when it starts; a stopped VM never does), or give the \
             DataVolume a {} annotation with a pod scheduling template (nodeSelector, affinity, \
             tolerations) for cdi-rs to place it, or the {}: \"true\" annotation to let the \
             worker pod choose the node.",
            ext::FIRST_CONSUMER,
            ann::IMMEDIATE_BINDING
        ),
    )
}

#[cfg(test)]
mod tests;
