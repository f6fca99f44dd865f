//! `/metrics`, `/healthz` and `/readyz` of the controller.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of a reconcile count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    controller: &'static str,
    result: &'static str,
}

/// Labels of a reconcile failure.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Failure {
    controller: &'static str,
    kind: &'static str,
}

/// Labels of a reconcile duration.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Controller {
    controller: &'static str,
}

/// Labels of a DataImportCron's outdated gauge (upstream's).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Cron {
    namespace: String,
    cron_name: String,
    pending: String,
}

/// Labels of a StorageProfile's info gauge (upstream's).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Profile {
    storageclass: String,
    provisioner: String,
    complete: String,
    default: String,
    virtdefault: String,
    rwx: String,
    smartclone: String,
    degraded: String,
}

impl From<&cdi_core::storageprofile::Info> for Profile {
    fn from(i: &cdi_core::storageprofile::Info) -> Self {
        Profile {
            storageclass: i.storage_class.clone(),
            provisioner: i.provisioner.clone(),
            complete: i.complete.to_string(),
            default: i.default.to_string(),
            virtdefault: i.virt_default.to_string(),
            rwx: i.rwx.to_string(),
            smartclone: i.smart_clone.to_string(),
            degraded: i.degraded.to_string(),
        }
    }
}

/// The controller's metrics (prometheus-client): upstream's `kubevirt_cdi_datavolume_pending`,
/// `kubevirt_cdi_dataimportcron_outdated` and `kubevirt_cdi_storageprofile_info`, and cdi-rs's
/// own leader gauge, reconcile counts and durations per controller.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    leading: AtomicBool,
    leader: Gauge,
    cr_ready: Gauge,
    datavolume_pending: Gauge,
    cron_outdated: Family<Cron, Gauge>,
    profiles: Family<Profile, Gauge>,
    /// Each class's current series, so a change of labels replaces it.
    profile_series: Mutex<HashMap<String, Profile>>,
    reconciles: Family<Outcome, Counter>,
    failures: Family<Failure, Counter>,
    durations: Family<Controller, Histogram, fn() -> Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::build(false)
    }
}

impl Metrics {
    /// The operator's: upstream's `kubevirt_cdi_cr_ready` (-1 until the CDI resource was read)
    /// and the reconcile figures; it has no lease, so it is always ready.
    pub fn for_operator() -> Metrics {
        Metrics::build(true)
    }

    fn build(operator: bool) -> Metrics {
        let mut registry = Registry::default();
        let cr_ready = Gauge::default();
        cr_ready.set(-1);
        let leader = Gauge::default();
        let datavolume_pending = Gauge::default();
        let cron_outdated = Family::<Cron, Gauge>::default();
        let profiles = Family::<Profile, Gauge>::default();
        let reconciles = Family::<Outcome, Counter>::default();
        let failures = Family::<Failure, Counter>::default();
        // From 1 ms to about 33 s.
        let durations =
            Family::<Controller, Histogram, fn() -> Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            });
        if operator {
            registry.register(
                "kubevirt_cdi_cr_ready",
                "CDI install ready",
                cr_ready.clone(),
            );
        }
        let mut own = Registry::default();
        let controller = if operator { &mut own } else { &mut registry };
        controller.register(
            "kubevirt_cdi_datavolume_pending",
            "Number of DataVolumes pending for default storage class to be configured",
            datavolume_pending.clone(),
        );
        controller.register(
            "kubevirt_cdi_dataimportcron_outdated",
            "DataImportCron has an outdated import",
            cron_outdated.clone(),
        );
        controller.register(
            "kubevirt_cdi_storageprofile_info",
            "`StorageProfiles` info labels: `storageclass`, `provisioner`, `complete` indicates \
             if all storage profiles recommended PVC settings are complete, `default` indicates \
             if it's the Kubernetes default storage class, `virtdefault` indicates if it's the \
             default virtualization storage class, `rwx` indicates if the storage class supports \
             `ReadWriteMany`, `smartclone` indicates if it supports snapshot or CSI based clone, \
             `degraded` indicates it is not optimal for virtualization",
            profiles.clone(),
        );
        controller.register(
            "cdi_rs_controller_leader",
            "Whether this controller instance holds the leader lease",
            leader.clone(),
        );
        registry.register(
            "cdi_rs_reconcile",
            "Reconcile passes by controller and result (ok, error, panic)",
            reconciles.clone(),
        );
        registry.register(
            "cdi_rs_reconcile_failures",
            "Failed reconcile passes by controller and kind of failure (conflict, not_found, \
             forbidden, invalid, throttled, server, refused, transport, other, panic)",
            failures.clone(),
        );
        registry.register(
            "cdi_rs_reconcile_duration_seconds",
            "How long reconcile passes take, by controller",
            durations.clone(),
        );
        Metrics {
            registry,
            leading: AtomicBool::new(operator),
            cr_ready,
            leader,
            datavolume_pending,
            cron_outdated,
            profiles,
            profile_series: Mutex::default(),
            reconciles,
            failures,
            durations,
        }
    }

    pub fn set_cr_ready(&self, ready: i64) {
        self.cr_ready.set(ready);
    }

    pub fn set_leader(&self, leading: bool) {
        self.leading.store(leading, Ordering::SeqCst);
        self.leader.set(i64::from(leading));
    }

    pub fn leader(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    pub fn set_datavolume_pending(&self, n: i64) {
        self.datavolume_pending.set(n);
    }

    /// A DataImportCron's outdated gauge: one series, `pending` saying whether it waits for a
    /// default storage class.
    pub fn set_cron_outdated(&self, namespace: &str, cron: &str, outdated: bool, pending: bool) {
        self.remove_cron_outdated(namespace, cron);
        self.cron_outdated
            .get_or_create(&Cron {
                namespace: namespace.into(),
                cron_name: cron.into(),
                pending: pending.to_string(),
            })
            .set(i64::from(outdated));
    }

    pub fn remove_cron_outdated(&self, namespace: &str, cron: &str) {
        for pending in ["true", "false"] {
            self.cron_outdated.remove(&Cron {
                namespace: namespace.into(),
                cron_name: cron.into(),
                pending: pending.into(),
            });
        }
    }

    /// A StorageProfile's info gauge: one series per class, replaced when its labels change.
    pub fn set_storage_profile(&self, info: &cdi_core::storageprofile::Info) {
        let labels = Profile::from(info);
        let mut series = self
            .profile_series
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(old) = series.insert(info.storage_class.clone(), labels.clone())
            && old != labels
        {
            self.profiles.remove(&old);
        }
        self.profiles.get_or_create(&labels).set(1);
    }

    /// The class is gone: so is its series.
    pub fn remove_storage_profile(&self, class: &str) {
        let mut series = self
            .profile_series
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(old) = series.remove(class) {
            self.profiles.remove(&old);
        }
    }

    /// The classes that have a series.
    pub fn storage_profile_classes(&self) -> Vec<String> {
        let series = self
            .profile_series
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        series.keys().cloned().collect()
    }

    /// Count one reconcile pass of `controller` and how long it took.
    pub fn reconciled(&self, controller: &'static str, result: &'static str, seconds: f64) {
        self.reconciles
            .get_or_create(&Outcome { controller, result })
            .inc();
        self.durations
            .get_or_create(&Controller { controller })
            .observe(seconds);
    }

    /// Count a failed pass of `controller` by the kind of its failure.
    pub fn failed(&self, controller: &'static str, kind: &'static str) {
        self.failures
            .get_or_create(&Failure { controller, kind })
            .inc();
    }

    /// The Prometheus text page.
    pub fn render(&self) -> String {
        let mut page = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut page, &self.registry);
        page
    }
}

/// The router: `/healthz` (the process answers), `/readyz` (it leads and runs the controllers;
/// a standby is alive but not ready), `/metrics`.
pub fn router(metrics: Arc<Metrics>) -> Router {
    let page = metrics.clone();
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let m = metrics.clone();
                async move {
                    if m.leader() {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not leading")
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let m = page.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.render(),
                    )
                }
            }),
        )
}

/// Serve the router on `addr`; the bound address and the task.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router(metrics)).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_has_upstreams_gauge_and_our_reconcile_figures() {
        let m = Metrics::default();
        m.set_leader(true);
        m.set_datavolume_pending(3);
        m.reconciled("datavolume", "ok", 0.004);
        m.reconciled("datavolume", "error", 0.5);
        m.reconciled("import", "ok", 0.01);
        let page = m.render();
        for line in [
            "# TYPE kubevirt_cdi_datavolume_pending gauge",
            "kubevirt_cdi_datavolume_pending 3",
            "cdi_rs_controller_leader 1",
            "cdi_rs_reconcile_total{controller=\"datavolume\",result=\"ok\"} 1",
            "cdi_rs_reconcile_total{controller=\"datavolume\",result=\"error\"} 1",
            "cdi_rs_reconcile_duration_seconds_count{controller=\"import\"} 1",
            "# EOF",
        ] {
            assert!(page.lines().any(|l| l == line), "{line} in\n{page}");
        }
        m.set_leader(false);
        assert!(!m.leader());
        assert!(
            m.render()
                .lines()
                .any(|l| l == "cdi_rs_controller_leader 0")
        );
    }
}
