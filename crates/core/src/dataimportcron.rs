//! DataImportCron (docs/design.md#dataimportcron; upstream's DataImportCron controller): a DataSource kept pointing
//! at the newest import of a registry image. The image's digest is polled on the cron's
//! schedule (upstream polls from a CronJob; here the controller does, and writes the same
//! annotations, so a digest set from outside works too); a new digest is imported into a
//! DataVolume named after the managed DataSource and the digest, pinned to the digest; once it
//! succeeded the DataSource names it and imports beyond `importsToKeep` are deleted, least
//! recently used first. Conditions `Progressing` and `UpToDate` say where it stands, with
//! upstream's reasons and messages.
//!
//! [`poll_due`] says whether this pass polls; the controller polls and gives the outcome to
//! [`decide`], which says what to write and create. A managed DataSource that is not the
//! cron's is never taken over; [`ownership`] says whose it is and what to do.

pub mod ownership;

use std::collections::BTreeMap;
use std::time::Duration;

use cdi_api::datasource::{
    DataImportCron, DataImportCronCondition, DataImportCronStatus, DataSource, DataSourceSource,
    DataSourceSpec, ImportStatus,
};
use cdi_api::datavolume::{DataVolume, DataVolumeSourcePvc};
use cdi_api::enums::{
    ConditionStatus, DataImportCronConditionType, DataImportCronGarbageCollect,
    DataImportCronRetentionPolicy, DataImportCronSourceFormat, DataVolumePhase,
};
use cdi_api::keys::{ann, label};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;

/// Upstream's annotations on the cron.
pub const DESIRED_DIGEST: &str = "cdi.kubevirt.io/storage.import.sourceDesiredDigest";
pub const NEXT_CRON_TIME: &str = "cdi.kubevirt.io/storage.import.nextCronTime";
pub const LAST_CRON_TIME: &str = "cdi.kubevirt.io/storage.import.lastCronTime";
/// The class the cron's current import went to.
pub const STORAGE_CLASS: &str = "cdi.kubevirt.io/storage.import.storageClass";
/// On the DataVolumes and claims of imports: when the cron last found them current.
pub const LAST_USE_TIME: &str = "cdi.kubevirt.io/storage.import.lastUseTime";
/// Set (`true`) on what a cron with `retentionPolicy: None` makes.
pub const CLEANUP_LABEL: &str = "cdi.kubevirt.io/dataImportCron.cleanup";

/// The reason on `UpToDate` when the source could not be polled (cdi-rs's; upstream's poller
/// job fails without a word on the cron).
pub const POLL_FAILED: &str = "PollFailed";

const DEFAULT_IMPORTS_TO_KEEP: usize = 3;
/// How soon a snapshot not ready yet is looked at again.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(2);
/// Characters of the digest in an import's name.
const DIGEST_IN_NAME: usize = 12;

/// The cron's schedule, parsed (upstream takes standard five-field expressions and `@daily`
/// and the like).
pub fn schedule(cron: &DataImportCron) -> Result<Option<croner::Cron>, String> {
    let text = cron.spec.schedule.trim();
    if text.is_empty() {
        return Ok(None);
    }
    croner::parser::CronParser::new()
        .parse(text)
        .map(Some)
        .map_err(|e| format!("Illegal cron schedule {text:?}: {e}"))
}

/// The first time after `now` the schedule names.
fn next_time(schedule: &croner::Cron, now: Timestamp) -> Option<Timestamp> {
    let zoned = now.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC);
    schedule
        .find_next_occurrence(&zoned, false)
        .ok()
        .map(|z| z.timestamp())
}

fn annotation<'a>(cron: &'a DataImportCron, key: &str) -> Option<&'a str> {
    cron.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn parse_time(text: &str) -> Option<Timestamp> {
    text.parse().ok()
}

/// The prefix of a claim source's "digest": its uid (upstream's).
pub const UID_PREFIX: &str = "uid:";

/// Why a cron's ServiceAccount may not clone its claim (upstream's condition reason).
pub const NOT_AUTHORIZED: &str = "NotAuthorized";
/// How soon a cron refused the clone asks again (a RoleBinding changes without an event here).
const AUTHORIZATION_WAIT: Duration = Duration::from_secs(60);

/// The user a cron's ServiceAccount is to SubjectAccessReviews (`spec.serviceAccountName`,
/// `default` when unset): name and groups, as upstream's AuthorizeSA asks.
pub fn service_account_user(cron: &DataImportCron) -> (String, Vec<String>) {
    let ns = cron.metadata.namespace.clone().unwrap_or_default();
    let sa = cron
        .spec
        .service_account_name
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into());
    (
        format!("system:serviceaccount:{ns}:{sa}"),
        vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{ns}"),
        ],
    )
}

/// The claim a cron imports from (`spec.template.spec.source.pvc`), by namespace (the cron's
/// when it names none) and name.
pub fn claim_source(cron: &DataImportCron) -> Option<(String, String)> {
    let pvc = cron.spec.template.spec.source.as_ref()?.pvc.as_ref()?;
    let ns = if pvc.namespace.is_empty() {
        cron.metadata.namespace.clone().unwrap_or_default()
    } else {
        pvc.namespace.clone()
    };
    Some((ns, pvc.name.clone()))
}

/// Whether this pass polls the source: the cron has a schedule, and its next time is unset
/// (a new cron polls at once), unreadable, or past.
pub fn poll_due(cron: &DataImportCron, now: Timestamp) -> bool {
    matches!(schedule(cron), Ok(Some(_)))
        && annotation(cron, NEXT_CRON_TIME)
            .and_then(parse_time)
            .is_none_or(|next| next <= now)
}

/// What polling the source gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poll {
    /// Not polled this pass.
    NotDue,
    /// The image's digest (`sha256:…`), or for a claim source its uid (`uid:…`).
    Digest(String),
    /// Why the digest could not be read.
    Failed(String),
}

/// What the controller observed for one cron.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    pub cron: &'a DataImportCron,
    pub now: Timestamp,
    pub poll: Poll,
    /// The DataVolume and claim named by `status.currentImports[0]`.
    pub dv: Option<&'a DataVolume>,
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// The DataSource named by `spec.managedDataSource`.
    pub data_source: Option<&'a DataSource>,
    /// Another cron already managing that DataSource, if one does.
    pub other_manager: Option<String>,
    /// The claims labelled as this cron's.
    pub claims: Vec<&'a PersistentVolumeClaim>,
    /// The class imports go to: the template's, else the default; none when neither is.
    pub class: Option<String>,
    /// The source format of the StorageProfile of that class.
    pub format: DataImportCronSourceFormat,
    /// The VolumeSnapshot named by `status.currentImports[0]`: whether it is ready to use.
    pub snapshot: Option<bool>,
    /// The snapshot class to take it with (the StorageProfile's), if any.
    pub snapshot_class: Option<String>,
    /// The snapshots labelled as this cron's: name and `lastUseTime`.
    pub snapshots: Vec<(String, String)>,
    /// For a cron that clones a claim: why its ServiceAccount may not (upstream's AuthorizeSA),
    /// if it may not.
    pub clone_denied: Option<String>,
}

/// What the DataSource needs.
#[derive(Debug, Clone, PartialEq)]
pub enum DataSourceChange {
    Create(Box<DataSource>),
    /// Its labels and source, as a merge patch.
    Patch(serde_json::Value),
}

/// What a pass does.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// A merge patch of the cron's annotations (`None` removes one).
    pub annotations: BTreeMap<String, Option<String>>,
    pub status: DataImportCronStatus,
    pub create_dv: Option<DataVolume>,
    /// Imports to delete, by name: the DataVolume, and its claim when it has none.
    pub delete: Vec<String>,
    pub data_source: Option<DataSourceChange>,
    /// Claims and DataVolumes to mark as used now (`lastUseTime`), by name.
    pub touch: Option<String>,
    /// The VolumeSnapshot of a succeeded import to take (snapshot source format).
    pub create_snapshot: Option<serde_json::Value>,
    /// Snapshots to delete, by name.
    pub delete_snapshots: Vec<String>,
    /// Upstream's `kubevirt_cdi_dataimportcron_outdated`: (outdated, pending).
    pub outdated: (bool, bool),
    /// A Warning event: reason and message.
    pub warning: Option<(&'static str, String)>,
    /// When to look again unless something changes first.
    pub requeue_after: Option<Duration>,
}

fn time(ts: Timestamp) -> Time {
    Time(ts)
}

/// Set a condition as upstream does: the transition time moves only when the status does.
fn set_condition(
    conditions: &mut Vec<DataImportCronCondition>,
    type_: DataImportCronConditionType,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    let existing = conditions.iter_mut().find(|c| c.type_ == type_);
    match existing {
        Some(c) => {
            let changed = c.status != status
                || c.reason.as_deref() != Some(reason)
                || c.message.as_deref() != Some(message);
            if c.status != status {
                c.last_transition_time = Some(time(now));
            }
            if changed {
                c.last_heartbeat_time = Some(time(now));
            }
            c.status = status;
            c.reason = Some(reason.into());
            c.message = Some(message.into());
        }
        None => conditions.push(DataImportCronCondition {
            type_,
            status,
            last_transition_time: Some(time(now)),
            last_heartbeat_time: Some(time(now)),
            reason: Some(reason.into()),
            message: Some(message.into()),
        }),
    }
}

/// The import's name: `<managedDataSource>-<first 12 of the digest's hex>` (upstream's).
pub fn import_name(cron: &DataImportCron, digest: &str) -> Option<String> {
    // A claim's uid (`uid:` + its uid) names its imports as a digest does.
    let (hex, uid) = match digest.strip_prefix("sha256:") {
        Some(hex) => (hex, false),
        None => (digest.strip_prefix(UID_PREFIX)?, true),
    };
    let part = hex.get(..DIGEST_IN_NAME)?;
    let fits = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c) || (uid && c == '-');
    if !part.chars().all(fits) || part.ends_with('-') {
        return None;
    }
    Some(format!("{}-{part}", cron.spec.managed_data_source))
}

/// The registry URL pinned to `digest`, its tag dropped: `docker://host/repo:tag` →
/// `docker://host/repo@sha256:…`.
pub fn pinned_url(url: &str, digest: &str) -> String {
    let base = url.split('@').next().unwrap_or(url);
    let (scheme, rest) = base.split_once("://").unwrap_or(("docker", base));
    // A tag is a colon after the last slash (a colon before it is the registry's port).
    let repo = match rest.rsplit_once('/') {
        Some((head, last)) => format!("{head}/{}", last.split(':').next().unwrap_or(last)),
        None => rest.split(':').next().unwrap_or(rest).to_string(),
    };
    format!("{scheme}://{repo}@{digest}")
}

/// The labels of everything the cron makes: upstream's recommended ones, the cron's name, its
/// KubeVirt labels, and the clean-up label when its imports go with it.
fn resource_labels(cron: &DataImportCron) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (
            "app.kubernetes.io/managed-by".to_string(),
            "cdi-controller".to_string(),
        ),
        (
            "app.kubernetes.io/component".to_string(),
            "storage".to_string(),
        ),
        (
            label::DATA_IMPORT_CRON.to_string(),
            cron.metadata.name.clone().unwrap_or_default(),
        ),
    ]);
    for (k, v) in cron.metadata.labels.iter().flatten() {
        if crate::datasource::allowed_label(k) {
            labels.insert(k.clone(), v.clone());
        }
    }
    if cron.spec.retention_policy == Some(DataImportCronRetentionPolicy::None) {
        labels.insert(CLEANUP_LABEL.into(), "true".into());
    }
    labels
}

/// The DataVolume importing `digest`: the template, pinned to the digest, bound at once.
fn import_dv(cron: &DataImportCron, name: &str, digest: &str, now: Timestamp) -> DataVolume {
    let template = &cron.spec.template;
    let mut spec = template.spec.clone();
    if let Some(reg) = spec.source.as_mut().and_then(|s| s.registry.as_mut())
        && let Some(url) = reg.url.as_mut()
    {
        *url = pinned_url(url, digest);
    }
    let mut labels = template.metadata.labels.clone().unwrap_or_default();
    labels.extend(resource_labels(cron));
    let mut annotations = template.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(ann::IMMEDIATE_BINDING.into(), "true".into());
    annotations.insert(LAST_USE_TIME.into(), now.to_string());
    if let Some(v) = cron
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ann::POD_RETAIN_AFTER_COMPLETION))
    {
        annotations.insert(ann::POD_RETAIN_AFTER_COMPLETION.into(), v.clone());
    }
    let mut dv = DataVolume::new(name, spec);
    dv.metadata = ObjectMeta {
        name: Some(name.into()),
        namespace: cron.metadata.namespace.clone(),
        labels: Some(labels),
        annotations: Some(annotations),
        owner_references: owned_by(cron),
        ..Default::default()
    };
    dv
}

/// With `retentionPolicy: None`, what the cron makes goes with it: owned by the cron, it is
/// deleted by the garbage collector (upstream deletes it by the clean-up label when it sees the
/// cron gone; the same objects).
fn owned_by(cron: &DataImportCron) -> Option<Vec<OwnerReference>> {
    if cron.spec.retention_policy != Some(DataImportCronRetentionPolicy::None) {
        return None;
    }
    Some(vec![OwnerReference {
        api_version: format!("{}/{}", cdi_api::GROUP, cdi_api::VERSION),
        kind: "DataImportCron".into(),
        name: cron.metadata.name.clone()?,
        uid: cron.metadata.uid.clone()?,
        ..Default::default()
    }])
}

fn dv_phase(dv: &DataVolume) -> Option<DataVolumePhase> {
    dv.status.as_ref().and_then(|s| s.phase.clone())
}

/// A DataVolume whose import failed the way a new digest may mend (upstream's
/// `deleteErroneousDataVolume`): Running False because of an error or an image pull.
fn erroneous(dv: &DataVolume) -> bool {
    dv.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.type_.as_str() == "Running"
                && c.status == ConditionStatus::False
                && matches!(
                    c.reason.as_ref().map(|r| r.as_str()),
                    Some("Error" | "ImagePullFailed")
                )
        })
}

fn last_use(claim: &PersistentVolumeClaim) -> String {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LAST_USE_TIME))
        .cloned()
        .unwrap_or_default()
}

/// Decide one pass: follow the schedule, follow a change of class, see where the current
/// import stands (and record its success), keep the DataSource on the last good import, start
/// a new import when the digest moved, and say whether the cron is up to date.
pub fn decide(o: &Observed) -> Plan {
    let holder = ownership::holder(o.cron, o.data_source, o.other_manager.as_deref());
    // Another cron's DataSource: this cron does nothing else (upstream skips the pass) but
    // says so, on the cron as well as in an event.
    if let Some(h @ ownership::Holder::Cron(_)) = &holder {
        return held_by_another_cron(o, h);
    }
    let mut pass = Pass::new(o);
    pass.follow_schedule();
    if pass.class_changed() {
        return pass.stopped();
    }
    let current = pass.imports.first().cloned();
    let succeeded = current.as_ref().is_some_and(|c| pass.import_succeeded(c));
    if succeeded && let Some(c) = &current {
        pass.record_success(c);
    }
    // The managed DataSource names the last successful import.
    pass.plan.data_source = data_source_change(o.cron, o.data_source, &pass.plan.status, o.format);
    let up = pass.next_import(succeeded);
    pass.finish(up, holder)
}

/// The pass when the managed DataSource is another cron's: only `UpToDate` says so, with a
/// warning.
fn held_by_another_cron(o: &Observed, holder: &ownership::Holder) -> Plan {
    let mut plan = Plan {
        status: o.cron.status.clone().unwrap_or_default(),
        ..Default::default()
    };
    let mut conditions = plan.status.conditions.take().unwrap_or_default();
    let (reason, message) = ownership::conflict(o.cron, holder);
    set_condition(
        &mut conditions,
        DataImportCronConditionType::UpToDate,
        ConditionStatus::False,
        reason,
        &message,
        o.now,
    );
    ownership::warn(&mut plan, (reason, message));
    plan.status.conditions = Some(conditions);
    plan.outdated = (true, false);
    plan
}

/// One pass in the making: the plan, and the parts of the status it changes before they go
/// back into it.
struct Pass<'a> {
    o: &'a Observed<'a>,
    plan: Plan,
    conditions: Vec<DataImportCronCondition>,
    imports: Vec<ImportStatus>,
    /// The digest to import: the cron's, or the one just polled.
    desired: String,
    /// Why the source cannot be polled (it stands until a poll succeeds).
    poll_error: Option<String>,
}

impl<'a> Pass<'a> {
    fn new(o: &'a Observed<'a>) -> Pass<'a> {
        let mut plan = Plan {
            status: o.cron.status.clone().unwrap_or_default(),
            ..Default::default()
        };
        let conditions = plan.status.conditions.take().unwrap_or_default();
        let imports = plan.status.current_imports.take().unwrap_or_default();
        Pass {
            o,
            plan,
            conditions,
            imports,
            desired: annotation(o.cron, DESIRED_DIGEST).unwrap_or("").to_string(),
            poll_error: None,
        }
    }

    fn condition(
        &mut self,
        type_: DataImportCronConditionType,
        status: ConditionStatus,
        reason: &str,
        message: &str,
    ) {
        set_condition(
            &mut self.conditions,
            type_,
            status,
            reason,
            message,
            self.o.now,
        );
    }

    /// Look again no later than `wait` from now.
    fn wake_within(&mut self, wait: Duration) {
        self.plan.requeue_after = Some(self.plan.requeue_after.map_or(wait, |r| r.min(wait)));
    }

    /// The schedule: poll at once when new, then at each time it names.
    fn follow_schedule(&mut self) {
        let (cron, now) = (self.o.cron, self.o.now);
        let schedule = match schedule(cron) {
            Err(e) => {
                self.poll_error = Some(e);
                return;
            }
            Ok(None) => return,
            Ok(Some(s)) => s,
        };
        self.take_poll();
        let next = match (
            &self.o.poll,
            annotation(cron, NEXT_CRON_TIME).and_then(parse_time),
        ) {
            (Poll::NotDue, Some(next)) if next > now => Some(next),
            _ => next_time(&schedule, now),
        };
        if let Some(next) = next {
            let text = next.to_string();
            if annotation(cron, NEXT_CRON_TIME) != Some(text.as_str()) {
                self.plan
                    .annotations
                    .insert(NEXT_CRON_TIME.into(), Some(text));
            }
            let wait = next.duration_since(now).as_secs_f64().max(1.0);
            self.plan.requeue_after = Some(Duration::from_secs_f64(wait));
        }
    }

    /// What this pass's poll gave: a digest (recorded), or why there is none.
    fn take_poll(&mut self) {
        match &self.o.poll {
            Poll::Digest(d) => {
                self.plan
                    .annotations
                    .insert(LAST_CRON_TIME.into(), Some(self.o.now.to_string()));
                if *d != self.desired {
                    self.plan
                        .annotations
                        .insert(DESIRED_DIGEST.into(), Some(d.clone()));
                    self.desired = d.clone();
                }
            }
            Poll::Failed(e) => self.poll_error = Some(format!("Failed to get image digest: {e}")),
            // The last poll's failure stands until a poll succeeds.
            Poll::NotDue => {
                self.poll_error = self
                    .conditions
                    .iter()
                    .find(|c| {
                        c.type_ == DataImportCronConditionType::UpToDate
                            && c.reason.as_deref() == Some(POLL_FAILED)
                    })
                    .and_then(|c| c.message.clone())
            }
        }
    }

    /// The class imports go to changed (the template's, or the default): the current import on
    /// the old class goes first, then the class is recorded and the image imported anew
    /// (upstream's). A claim of the cron's still pending on another class just goes. True
    /// when something goes: the pass stops there.
    fn class_changed(&mut self) -> bool {
        let o = self.o;
        let Some(desired_class) = &o.class else {
            return false;
        };
        let claim_class =
            |c: &PersistentVolumeClaim| c.spec.as_ref().and_then(|s| s.storage_class_name.clone());
        let cron_name = o.cron.metadata.name.as_deref().unwrap_or("");
        if let Some(claim) = o.claim.filter(|c| {
            c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
                && made_by(c.metadata.labels.as_ref(), cron_name)
                && claim_class(c).is_some_and(|sc| sc != *desired_class)
        }) {
            self.plan
                .delete
                .push(claim.metadata.name.clone().unwrap_or_default());
            self.plan.requeue_after = Some(Duration::from_secs(1));
            return true;
        }
        match annotation(o.cron, STORAGE_CLASS) {
            Some(recorded) if recorded != desired_class => {
                let old = self.imports.first().map(|i| i.data_volume_name.clone());
                if let Some(old) =
                    old.filter(|_| o.dv.is_some() || o.claim.is_some() || o.snapshot.is_some())
                {
                    if o.dv.is_some() || o.claim.is_some() {
                        self.plan.delete.push(old.clone());
                    }
                    if o.snapshot.is_some() {
                        self.plan.delete_snapshots.push(old);
                    }
                    self.plan.requeue_after = Some(Duration::from_secs(1));
                    return true;
                }
                self.plan
                    .annotations
                    .insert(STORAGE_CLASS.into(), Some(desired_class.clone()));
            }
            Some(_) => {}
            None => {
                self.plan
                    .annotations
                    .insert(STORAGE_CLASS.into(), Some(desired_class.clone()));
            }
        }
        false
    }

    /// The plan of a pass that stops once something is deleted for a change of class.
    fn stopped(mut self) -> Plan {
        self.plan.status.conditions = Some(self.conditions);
        self.plan.status.current_imports = Some(self.imports);
        self.plan
    }

    /// Where the current import stands: whether it succeeded, else what `Progressing` says;
    /// an import that is gone is forgotten, to be imported again.
    fn import_succeeded(&mut self, current: &ImportStatus) -> bool {
        let o = self.o;
        let snapshots_wanted = o.format == DataImportCronSourceFormat::Snapshot;
        let progressing = DataImportCronConditionType::Progressing;
        match (o.dv, o.claim) {
            (Some(dv), _) => match dv_phase(dv) {
                Some(DataVolumePhase::Succeeded) => return true,
                Some(DataVolumePhase::ImportScheduled) => self.condition(
                    progressing,
                    ConditionStatus::False,
                    "ImportScheduled",
                    "Import is scheduled",
                ),
                Some(DataVolumePhase::ImportInProgress) => self.condition(
                    progressing,
                    ConditionStatus::True,
                    "ImportProgressing",
                    "Import is progressing",
                ),
                phase => {
                    let phase = phase.map(|p| p.as_str().to_string()).unwrap_or_default();
                    self.condition(
                        progressing,
                        ConditionStatus::False,
                        &phase,
                        &format!("Import DataVolume phase {phase}"),
                    )
                }
            },
            // The DataVolume gone (garbage-collected after it succeeded), its claim stays: the
            // import. Not a claim going with its deleted DataVolume, nor one whose import
            // failed: taking those would move the DataSource off the good image and delete it.
            (None, Some(claim))
                if claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                    && claim.metadata.deletion_timestamp.is_none()
                    && claim
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(cdi_api::ann::POD_PHASE))
                        .is_none_or(|p| p != "Failed") =>
            {
                return true;
            }
            // Only the snapshot of an import is left: it is the import.
            (None, None) if o.snapshot.is_some() && snapshots_wanted => return true,
            // Snapshots no longer wanted: the image is imported again as a claim.
            (None, None) if o.snapshot.is_some() => {
                self.plan
                    .delete_snapshots
                    .push(current.data_volume_name.clone());
                self.imports.clear();
            }
            _ => {
                // The import is gone: imported again below.
                self.imports.clear();
                self.condition(
                    progressing,
                    ConditionStatus::False,
                    "NoImport",
                    "No current import",
                );
            }
        }
        false
    }

    /// The current import succeeded: it is the last import, in use now; what is beyond
    /// `importsToKeep` goes; with the snapshot format, it is snapshotted and the claim goes
    /// once the snapshot is ready.
    fn record_success(&mut self, c: &ImportStatus) {
        let o = self.o;
        let ns = o.cron.metadata.namespace.clone().unwrap_or_default();
        let last = DataVolumeSourcePvc {
            namespace: ns,
            name: c.data_volume_name.clone(),
        };
        if self.plan.status.last_imported_pvc.as_ref() != Some(&last) {
            self.plan.status.last_import_timestamp = Some(time(o.now));
            self.plan.status.last_imported_pvc = Some(last);
        }
        self.plan.touch = Some(c.data_volume_name.clone());
        self.condition(
            DataImportCronConditionType::Progressing,
            ConditionStatus::False,
            "NoImport",
            "No current import",
        );
        self.plan.delete = garbage(o, &c.data_volume_name);
        if o.format == DataImportCronSourceFormat::Snapshot {
            self.plan
                .delete_snapshots
                .extend(garbage_snapshots(o, &c.data_volume_name));
            match o.snapshot {
                // Taken of the claim, which goes once the snapshot is ready (upstream's).
                None => self.plan.create_snapshot = Some(snapshot_of(o, &c.data_volume_name)),
                Some(true) if o.dv.is_some() || o.claim.is_some() => {
                    self.plan.delete.push(c.data_volume_name.clone())
                }
                _ => {}
            }
        }
    }

    /// A new digest is imported once the current import is done (never in its middle); what
    /// `UpToDate` says of where the imports stand.
    fn next_import(&mut self, succeeded: bool) -> (ConditionStatus, &'static str, String) {
        let snapshots_wanted = self.o.format == DataImportCronSourceFormat::Snapshot;
        let snapshot_ready = self.o.snapshot == Some(true);
        let digest_updated = !self.desired.is_empty()
            && self
                .imports
                .first()
                .is_none_or(|i| i.digest != self.desired);
        if digest_updated {
            self.import_new_digest(succeeded);
            (
                ConditionStatus::False,
                "Outdated",
                "Source digest updated since last import".into(),
            )
        } else if succeeded && snapshots_wanted && !snapshot_ready {
            // Nothing wakes the cron when a snapshot becomes ready (upstream's either).
            self.wake_within(SNAPSHOT_WAIT);
            (
                ConditionStatus::False,
                "ImportProgressing",
                "Snapshot of imported data is progressing".into(),
            )
        } else if succeeded {
            self.plan.status.source_format = Some(self.o.format);
            (
                ConditionStatus::True,
                "UpToDate",
                "Latest import is up to date".into(),
            )
        } else if !self.imports.is_empty() {
            (
                ConditionStatus::False,
                "ImportProgressing",
                "Import is progressing".into(),
            )
        } else {
            (
                ConditionStatus::False,
                "NoDigest",
                "No source digest".into(),
            )
        }
    }

    /// The digest moved: an import that failed the way a new digest may mend goes; once the
    /// current import is done (or there is none), the new digest is imported, if the cron's
    /// ServiceAccount may.
    fn import_new_digest(&mut self, succeeded: bool) {
        let o = self.o;
        if let Some(dv) = o.dv.filter(|dv| erroneous(dv))
            && !self.imports.is_empty()
        {
            self.plan
                .delete
                .push(dv.metadata.name.clone().unwrap_or_default());
            self.imports.clear();
            return;
        }
        if !succeeded && !self.imports.is_empty() {
            return;
        }
        let desired = self.desired.clone();
        match import_name(o.cron, &desired) {
            // Upstream's AuthorizeSA: the cron's ServiceAccount must be allowed to clone.
            Some(_) if o.clone_denied.is_some() => {
                self.condition(
                    DataImportCronConditionType::Progressing,
                    ConditionStatus::False,
                    NOT_AUTHORIZED,
                    "Not authorized to create DataVolume",
                );
                self.wake_within(AUTHORIZATION_WAIT);
            }
            Some(name) => {
                self.plan.create_dv = Some(import_dv(o.cron, &name, &desired, o.now));
                self.imports = vec![ImportStatus {
                    data_volume_name: name,
                    digest: desired,
                }];
            }
            None => {
                self.poll_error = Some(format!(
                    "the source digest {desired:?} is not sha256:<hex> (or uid:<uid> for a claim); it is what {DESIRED_DIGEST} says"
                ))
            }
        }
    }

    /// `UpToDate` (a poll error, or a DataSource not the cron's, says more than where the
    /// imports stand), the last poll's time, the imports, and whether the cron is outdated.
    fn finish(
        mut self,
        up: (ConditionStatus, &'static str, String),
        holder: Option<ownership::Holder>,
    ) -> Plan {
        let cron = self.o.cron;
        // A DataSource not the cron's (unlabelled, or labelled for a cron that no longer names
        // it): the imports go on as upstream's do, but VMs get what the DataSource names, so
        // the cron is not up to date, and an event says why.
        let conflict = holder.as_ref().map(|h| ownership::conflict(cron, h));
        let up = match (self.poll_error.take(), &conflict) {
            // A source that cannot be polled (beyond upstream, whose poller job just fails):
            // the cron says why, and the next scheduled time tries again. It stands until a
            // poll succeeds, so it keeps the condition; the event says the conflict meanwhile.
            (Some(e), _) => (ConditionStatus::False, POLL_FAILED, e),
            (None, Some((reason, message))) => (ConditionStatus::False, *reason, message.clone()),
            (None, None) => up,
        };
        self.condition(DataImportCronConditionType::UpToDate, up.0, up.1, &up.2);
        let up_to_date = up.0 == ConditionStatus::True;
        let mut plan = self.plan;
        if let Some(conflict) = conflict {
            ownership::warn(&mut plan, conflict);
        }
        if let Some(last) = plan
            .annotations
            .get(LAST_CRON_TIME)
            .cloned()
            .flatten()
            .or_else(|| annotation(cron, LAST_CRON_TIME).map(str::to_string))
            .as_deref()
            .and_then(parse_time)
        {
            plan.status.last_execution_timestamp = Some(time(last));
        }
        plan.status.current_imports = (!self.imports.is_empty()).then_some(self.imports);
        plan.status.conditions = Some(self.conditions);
        // Pending: it waits for a default storage class (its template names none, and there is
        // none), which upstream's alert leaves out.
        plan.outdated = (!up_to_date, !up_to_date && self.o.class.is_none());
        plan
    }
}

/// Imports beyond `importsToKeep`, least recently used first (never `current`), unless the
/// cron keeps them all.
fn garbage(o: &Observed, current: &str) -> Vec<String> {
    let claims = o
        .claims
        .iter()
        .filter_map(|c| Some((c.metadata.name.clone()?, last_use(c))))
        .collect();
    surplus(o.cron, claims, current)
}

/// Snapshots beyond `importsToKeep`, least recently used first (never `current`).
fn garbage_snapshots(o: &Observed, current: &str) -> Vec<String> {
    surplus(o.cron, o.snapshots.clone(), current)
}

/// Of `imports` (name, `lastUseTime`), those beyond the cron's `importsToKeep`, newest first
/// kept; the current import counts as the newest whatever its annotation says.
fn surplus(
    cron: &DataImportCron,
    mut imports: Vec<(String, String)>,
    current: &str,
) -> Vec<String> {
    if cron
        .spec
        .garbage_collect
        .is_some_and(|g| g != DataImportCronGarbageCollect::Outdated)
    {
        return Vec::new();
    }
    let keep = cron
        .spec
        .imports_to_keep
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(DEFAULT_IMPORTS_TO_KEEP);
    imports.sort_by(|a, b| {
        (b.0 == current)
            .cmp(&(a.0 == current))
            .then_with(|| b.1.cmp(&a.1))
    });
    imports
        .into_iter()
        .skip(keep)
        .map(|(n, _)| n)
        .filter(|n| n != current)
        .collect()
}

/// The VolumeSnapshot of the import `name` (upstream's: the claim's name, the cron's labels,
/// the restore size and volume mode it will need).
fn snapshot_of(o: &Observed, name: &str) -> serde_json::Value {
    let mut labels = resource_labels(o.cron);
    labels.insert(label::APP.into(), label::APP_VALUE.into());
    labels.insert(label::COMPONENT.into(), String::new());
    let claim_spec = o.claim.and_then(|c| c.spec.as_ref());
    let mode = claim_spec
        .and_then(|s| s.volume_mode.clone())
        .unwrap_or_else(|| "Filesystem".into());
    let size = claim_spec
        .and_then(|s| {
            s.resources
                .as_ref()?
                .requests
                .as_ref()?
                .get("storage")
                .cloned()
        })
        .map(|q| q.0)
        .unwrap_or_default();
    let mut snapshot = serde_json::json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {
            "name": name,
            "namespace": o.cron.metadata.namespace,
            "labels": labels,
            "annotations": {
                (LAST_USE_TIME): o.now.to_string(),
                "cdi.kubevirt.io/storage.import.sourceVolumeMode": mode,
                "cdi.kubevirt.io/storage.import.advisedRestoreSize": size,
            },
        },
        "spec": {"source": {"persistentVolumeClaimName": name}},
    });
    if let Some(owners) = owned_by(o.cron) {
        snapshot["metadata"]["ownerReferences"] = serde_json::json!(owners);
    }
    if let Some(class) = &o.snapshot_class {
        snapshot["spec"]["volumeSnapshotClassName"] = serde_json::json!(class);
    }
    snapshot
}

fn data_source_change(
    cron: &DataImportCron,
    existing: Option<&DataSource>,
    status: &DataImportCronStatus,
    format: DataImportCronSourceFormat,
) -> Option<DataSourceChange> {
    let name = cron.metadata.name.clone().unwrap_or_default();
    let labels = resource_labels(cron);
    // The snapshot has the import's name.
    let source = status.last_imported_pvc.clone().map(|pvc| match format {
        DataImportCronSourceFormat::Snapshot => DataSourceSource {
            snapshot: Some(cdi_api::datavolume::DataVolumeSourceSnapshot {
                namespace: pvc.namespace,
                name: pvc.name,
            }),
            ..Default::default()
        },
        DataImportCronSourceFormat::Pvc => DataSourceSource {
            pvc: Some(pvc),
            ..Default::default()
        },
    });
    match existing {
        None => {
            let mut ds = DataSource::new(
                &cron.spec.managed_data_source,
                DataSourceSpec {
                    source: source.unwrap_or_default(),
                },
            );
            ds.metadata.namespace = cron.metadata.namespace.clone();
            ds.metadata.labels = Some(labels);
            ds.metadata.owner_references = owned_by(cron);
            Some(DataSourceChange::Create(Box::new(ds)))
        }
        Some(ds) => {
            let managed = ds
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(label::DATA_IMPORT_CRON))
                == Some(&name);
            // Not this cron's DataSource: never adopted.
            if !managed {
                return None;
            }
            let current = ds.metadata.labels.clone().unwrap_or_default();
            let new_labels: BTreeMap<&String, &String> = labels
                .iter()
                .filter(|(k, v)| current.get(*k) != Some(*v))
                .collect();
            let new_source = source.filter(|s| *s != ds.spec.source);
            if new_labels.is_empty() && new_source.is_none() {
                return None;
            }
            let mut patch = serde_json::json!({"metadata": {"labels": new_labels}});
            if let Some(s) = new_source {
                // The whole source is replaced: whatever else a user wrote there goes.
                patch["spec"] = serde_json::json!({"source": {
                    "pvc": s.pvc, "snapshot": s.snapshot, "dataSource": null,
                }});
            }
            Some(DataSourceChange::Patch(patch))
        }
    }
}

/// Whether a claim, DataVolume or DataSource was made by `cron` (its label).
pub fn made_by(labels: Option<&BTreeMap<String, String>>, cron: &str) -> bool {
    labels
        .and_then(|l| l.get(label::DATA_IMPORT_CRON))
        .is_some_and(|v| v == cron)
}

#[cfg(test)]
mod tests;
