//! Whose the managed DataSource is (upstream's `shouldReconcileCron` and `getDataSource`).
//!
//! Upstream updates a DataSource only while its `cdi.kubevirt.io/dataImportCron` label names
//! the cron. One labelled for another cron that names it as well stops the pass with a Warning
//! `ErrDataSourceAlreadyManaged`. One without the label (a user's, or one unlabelled to stop
//! the updates, as SSP does) or labelled for a cron that no longer names it is left as it is
//! with a log line only, and the cron goes on to say `UpToDate=True` while VMs get what the
//! DataSource names, not the cron's import. cdi-rs does not take either over, but says so:
//! `UpToDate=False` naming the DataSource, who holds it and the fix, and a Warning event.

use std::time::Duration;

use cdi_api::datasource::{DataImportCron, DataSource};
use cdi_api::keys::label;

use super::Plan;

/// Upstream's event reason for a DataSource another cron manages (here on `UpToDate` too).
pub const ALREADY_MANAGED: &str = "ErrDataSourceAlreadyManaged";
/// The reason for a DataSource no cron manages but not labelled for this one (cdi-rs's;
/// upstream only logs it).
pub const NOT_MANAGED: &str = "ErrDataSourceNotManaged";

/// How soon a cron whose DataSource is not its own looks again: what hands it over (the other
/// cron deleted, the DataSource deleted) sends this cron no event; a label naming this cron
/// does, at once.
pub(super) const CONFLICT_WAIT: Duration = Duration::from_secs(60);

/// Who holds a managed DataSource that is not the cron's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// Another cron that names it as its `managedDataSource` too.
    Cron(String),
    /// Labelled for a cron that is gone or now manages another DataSource.
    StaleLabel(String),
    /// Without the label (or with it empty): not a cron's.
    Unlabelled,
}

/// Who holds `existing` when it is not `cron`'s. `other_manager` is the cron its label names
/// when that cron still names it (the controller reads it; this crate reads no cron).
pub fn holder(
    cron: &DataImportCron,
    existing: Option<&DataSource>,
    other_manager: Option<&str>,
) -> Option<Holder> {
    let own = cron.metadata.name.as_deref().unwrap_or("");
    if let Some(other) = other_manager.filter(|o| !o.is_empty() && *o != own) {
        return Some(Holder::Cron(other.to_string()));
    }
    let labelled = existing?
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(label::DATA_IMPORT_CRON))
        .map(String::as_str)
        .unwrap_or("");
    match labelled {
        // An empty label is no label (upstream's).
        "" => Some(Holder::Unlabelled),
        l if l == own => None,
        l => Some(Holder::StaleLabel(l.to_string())),
    }
}

/// The reason and message for `holder`: the DataSource, who holds it, and the fix (a cron's
/// spec cannot change: another `managedDataSource` is another cron).
pub fn conflict(cron: &DataImportCron, holder: &Holder) -> (&'static str, String) {
    let ds = &cron.spec.managed_data_source;
    let own = cron.metadata.name.as_deref().unwrap_or("");
    let key = label::DATA_IMPORT_CRON;
    let fix = format!(
        "label it {key}={own} to hand it to this DataImportCron, or recreate this \
         DataImportCron with another managedDataSource"
    );
    match holder {
        // Upstream's words first, so what looks for them finds them.
        Holder::Cron(other) => (
            ALREADY_MANAGED,
            format!(
                "DataSource {ds} is already managed by DataImportCron {other}; this \
                 DataImportCron neither imports nor updates it: recreate it with another \
                 managedDataSource, or delete DataImportCron {other} and label DataSource \
                 {ds} {key}={own}"
            ),
        ),
        Holder::StaleLabel(gone) => (
            NOT_MANAGED,
            format!(
                "DataSource {ds} is labelled {key}={gone}, not for this DataImportCron, so it \
                 is not updated and VMs get what it names, not this DataImportCron's \
                 imports: {fix}"
            ),
        ),
        Holder::Unlabelled => (
            NOT_MANAGED,
            format!(
                "DataSource {ds} has no {key} label, so it is not updated and VMs get what it \
                 names, not this DataImportCron's imports: {fix}"
            ),
        ),
    }
}

/// Put `conflict` (from [`conflict`]) in the plan's Warning event, and look again within
/// [`CONFLICT_WAIT`].
pub(super) fn warn(plan: &mut Plan, conflict: (&'static str, String)) {
    plan.warning = Some(conflict);
    plan.requeue_after = Some(
        plan.requeue_after
            .map_or(CONFLICT_WAIT, |r| r.min(CONFLICT_WAIT)),
    );
}
