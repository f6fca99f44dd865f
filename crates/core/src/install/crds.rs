//! The CRDs: the CDI kinds' own, and the optional ones whose presence adds objects to an
//! install (Prometheus Operator's: CDI's rules, alerts and scrape target; the volume
//! populators' registry; docs/install.md#optional-crds).

use serde_json::{Value, json};

use super::names::CDI_GROUP;
use super::pieces::rule;
use super::release::{Release, labels};

/// The CRDs of the CDI kinds as objects to apply: the CDI kind's own (`cdi_kind`), which comes
/// with the operator's manifests, or every other, which the operator keeps.
pub fn crds(cdi_kind: bool) -> Vec<Value> {
    cdi_api::crd::crds()
        .into_iter()
        .filter(|c| (c.spec.names.kind == "CDI") == cdi_kind)
        // A CRD is plain data; its apiVersion and kind come with it.
        .map(|c| serde_json::to_value(c).expect("a CRD is JSON"))
        .collect()
}

/// The CRDs whose presence adds objects to an install: Prometheus Operator's (then CDI's rules,
/// alerts and scrape target) and the volume populators' registry.
pub const PROMETHEUS_RULE_CRD: &str = "prometheusrules.monitoring.coreos.com";

pub const SERVICE_MONITOR_CRD: &str = "servicemonitors.monitoring.coreos.com";

pub const VOLUME_POPULATOR_CRD: &str = "volumepopulators.populator.storage.k8s.io";

/// What Prometheus is allowed in CDI's namespace to find what to scrape (upstream's
/// `cdi-monitoring` Role).
pub(super) fn prometheus_rules() -> Vec<Value> {
    vec![rule(
        &[""],
        &["services", "endpoints", "pods"],
        &["get", "list", "watch"],
    )]
}

/// When Prometheus Operator's CRDs are there: the PrometheusRule with CDI's recording rules and
/// alerts, a ServiceMonitor for the metrics Service, and the Role letting Prometheus's account
/// (`prometheus-k8s` in the monitoring namespace) find its endpoints; upstream's names.
pub fn monitoring(release: &Release) -> Vec<Value> {
    let ns = &release.namespace;
    let mut rule = crate::monitoring::prometheus_rule(ns);
    rule["metadata"]["labels"] = labels(release, &[("prometheus.cdi.kubevirt.io", "true")]);
    let prometheus = labels(release, &[("prometheus.cdi.kubevirt.io", "true")]);
    vec![
        rule,
        json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": "service-monitor-cdi", "namespace": ns,
                "labels": labels(release, &[("prometheus.cdi.kubevirt.io", "true"),
                    ("openshift.io/cluster-monitoring", "")])},
            "spec": {"selector": {"matchLabels": {"prometheus.cdi.kubevirt.io": "true"}},
                "namespaceSelector": {"matchNames": [ns]},
                // cdi-rs serves its metrics over plain HTTP on the port named `metrics`.
                "endpoints": [{"port": "metrics", "scheme": "http"}]}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "cdi-monitoring", "namespace": ns, "labels": prometheus},
            "rules": prometheus_rules()}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "cdi-monitoring", "namespace": ns, "labels": prometheus},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                "name": "cdi-monitoring"},
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus-k8s",
                "namespace": release.monitoring_namespace}]}),
    ]
}

/// When the volume populators' CRD is there: CDI's populator kinds registered, so that
/// kube's volume-data-source-validator accepts claims naming them (upstream's names: each
/// kind in lower case).
pub fn volume_populators(release: &Release) -> Vec<Value> {
    [
        "VolumeImportSource",
        "VolumeUploadSource",
        "VolumeCloneSource",
    ]
    .iter()
    .map(|kind| {
        json!({"apiVersion": "populator.storage.k8s.io/v1beta1", "kind": "VolumePopulator",
                "metadata": {"name": kind.to_ascii_lowercase(), "labels": labels(release, &[])},
                "sourceKind": {"group": CDI_GROUP, "kind": kind}})
    })
    .collect()
}
