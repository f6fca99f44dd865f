//! The CDI resource's status from what the operator observes of its Deployments (upstream's
//! phases and conditions), its `kubevirt_cdi_cr_ready` metric, and which resource is the
//! installation (docs/install.md#status).

use cdi_api::config::{CDI, CDIStatus, OperatorCondition};
use cdi_api::enums::{CdiPhase, ConditionStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::names::{APISERVER, CONTROLLER, FINALIZER, UPDATE_VERSION, UPLOAD_PROXY};
use super::release::Release;

/// Whether a Deployment has rolled out its current template and all its replicas are ready.
pub fn rolled_out(d: &Deployment) -> bool {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(s) = &d.status else {
        return false;
    };
    s.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
        && s.updated_replicas.unwrap_or(0) == want
        && s.ready_replicas.unwrap_or(0) == want
        && s.replicas.unwrap_or(0) == want
}

fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: &Time,
) -> OperatorCondition {
    OperatorCondition {
        type_: type_.into(),
        status: if status {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        },
        reason: (!reason.is_empty()).then(|| reason.to_string()),
        message: (!message.is_empty()).then(|| message.to_string()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

/// A condition that is False, without a reason.
const NONE: (bool, &str, &str) = (false, "", "");

/// Conditions as upstream's operator SDK sets them, keeping a transition time that did not
/// change.
fn conditions(
    old: Option<&[OperatorCondition]>,
    [available, progressing, degraded]: [(bool, &str, &str); 3],
    now: &Time,
) -> Vec<OperatorCondition> {
    [
        ("Available", available),
        ("Progressing", progressing),
        ("Degraded", degraded),
    ]
    .into_iter()
    .map(|(t, (s, reason, message))| {
        let mut c = condition(t, s, reason, message, now);
        if let Some(prev) = old.into_iter().flatten().find(|c| c.type_ == t)
            && prev.status == c.status
            && prev.reason == c.reason
            && prev.message == c.message
        {
            c = prev.clone();
        }
        c
    })
    .collect()
}

/// The CDI resource's status, from what the operator sees of its Deployments (upstream's
/// phases and conditions): `Deploying` until every component has rolled out, then `Deployed`
/// (Available); `Upgrading` while a new release rolls out over a deployed one; Degraded when a
/// deployed component loses a replica. `deployments` are the components' as observed.
pub fn status(cdi: &CDI, release: &Release, deployments: &[Deployment], now: Time) -> CDIStatus {
    let old = cdi.status.clone().unwrap_or_default();
    let old_conditions = old.conditions.as_deref();
    let ready = [CONTROLLER, APISERVER, UPLOAD_PROXY].iter().all(|name| {
        deployments
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(name))
            .is_some_and(|d| {
                rolled_out(d)
                    && d.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(UPDATE_VERSION))
                        == Some(&release.version)
            })
    });
    let observed = old.observed_version.clone().filter(|v| !v.is_empty());
    let mut status = CDIStatus {
        operator_version: Some(release.version.clone()),
        target_version: Some(release.version.clone()),
        observed_version: observed.clone(),
        ..Default::default()
    };
    let deployed_before = matches!(old.phase, Some(CdiPhase::Deployed | CdiPhase::Upgrading));
    let upgrading = deployed_before && observed.as_deref() != Some(release.version.as_str());
    let upgrade = format!("Started upgrade to version {}", release.version);
    let (phase, conds) = if ready {
        status.observed_version = Some(release.version.clone());
        (
            CdiPhase::Deployed,
            [
                (true, "DeployCompleted", "Deployment Completed"),
                NONE,
                NONE,
            ],
        )
    } else if upgrading {
        let started = (true, "UpgradeStarted", upgrade.as_str());
        (CdiPhase::Upgrading, [(true, "", ""), started, started])
    } else if deployed_before {
        (
            CdiPhase::Deployed,
            [
                (true, "DeployCompleted", "Deployment Completed"),
                NONE,
                (true, "", ""),
            ],
        )
    } else {
        (
            CdiPhase::Deploying,
            [NONE, (true, "DeployStarted", "Started Deployment"), NONE],
        )
    };
    status.phase = Some(phase);
    status.conditions = Some(conditions(old_conditions, conds, &now));
    status
}

/// `kubevirt_cdi_cr_ready` from the resource's conditions (upstream's rule): 1 when Available,
/// 0 when not and not progressing, and unchanged (None) while progressing.
pub fn cr_ready(status: Option<&CDIStatus>) -> Option<i64> {
    let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    let is = |t: &str| {
        conditions
            .iter()
            .any(|c| c.type_ == t && c.status == ConditionStatus::True)
    };
    if is("Available") {
        Some(1)
    } else if !is("Progressing") {
        Some(0)
    } else {
        None
    }
}

/// Which CDI resource is the installation: the one that holds the finalizer, else the oldest.
/// Any other is refused (upstream's `ConfigError`).
pub fn active(all: &[CDI]) -> Option<&CDI> {
    let holds = |c: &&CDI| {
        c.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    };
    all.iter().find(holds).or_else(|| {
        all.iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .min_by_key(|c| {
                (
                    c.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    c.metadata.name.clone(),
                )
            })
    })
}

/// The status of a CDI resource that is not the installation.
pub fn unwanted(now: Time) -> CDIStatus {
    CDIStatus {
        phase: Some(CdiPhase::Error),
        conditions: Some(conditions(
            None,
            [
                NONE,
                NONE,
                (
                    true,
                    "ConfigError",
                    "Reconciling to error state, unwanted CDI object",
                ),
            ],
            &now,
        )),
        ..Default::default()
    }
}
