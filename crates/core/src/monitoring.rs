//! Upstream's Prometheus rules for CDI (`pkg/monitoring/rules`): the recording rules and the
//! eight alerts, as the PrometheusRule `prometheus-cdi-rules` the operator installs in CDI's
//! namespace, each alert with upstream's labels, summary and runbook.

use serde_json::{Value, json};

/// The PrometheusRule's name.
pub const RULE_NAME: &str = "prometheus-cdi-rules";
/// Where upstream's runbooks are: one page per alert.
pub const RUNBOOK_URL: &str = "https://kubevirt.io/monitoring/runbooks/";
/// A worker pod restarted more often than this is unusual (upstream's threshold).
pub const UNUSUAL_RESTART_COUNT: u32 = 3;

/// One alert: name, expression, `for`, severity, operator health impact, summary.
pub struct Alert {
    pub name: &'static str,
    pub expr: &'static str,
    pub for_: &'static str,
    pub severity: &'static str,
    pub health_impact: &'static str,
    pub summary: &'static str,
}

/// Upstream's alerts, in its order.
pub const ALERTS: [Alert; 8] = [
    Alert {
        name: "CDIOperatorDown",
        expr: "cluster:kubevirt_cdi_operator_up:sum == 0",
        for_: "10m",
        severity: "critical",
        health_impact: "critical",
        summary: "CDI operator is down",
    },
    Alert {
        name: "CDINotReady",
        expr: "kubevirt_cdi_cr_ready == 0",
        for_: "10m",
        severity: "critical",
        health_impact: "critical",
        summary: "CDI is not available to use",
    },
    Alert {
        name: "CDIDataVolumeUnusualRestartCount",
        expr: "cluster:kubevirt_cdi_import_pods_high_restart:count > 0 or \
               cluster:kubevirt_cdi_upload_pods_high_restart:count > 0 or \
               cluster:kubevirt_cdi_clone_pods_high_restart:count > 0",
        for_: "5m",
        severity: "warning",
        health_impact: "none",
        summary: "Some CDI population workloads have an unusual restart count, meaning they are \
                  probably failing and need to be investigated",
    },
    Alert {
        name: "CDIStorageProfilesIncomplete",
        expr: r#"sum by(storageclass,provisioner) ((kubevirt_cdi_storageprofile_info{complete="false"}>0))"#,
        for_: "5m",
        severity: "info",
        health_impact: "none",
        summary: "Incomplete StorageProfile {{ $labels.storageclass }}, accessMode/volumeMode \
                  cannot be inferred by CDI for PVC population request",
    },
    Alert {
        name: "CDIDataImportCronOutdated",
        expr: r#"sum by(namespace,cron_name) (kubevirt_cdi_dataimportcron_outdated{pending="false"}) > 0"#,
        for_: "15m",
        severity: "warning",
        health_impact: "none",
        summary: "DataImportCron (recurring polling of VM templates disk image sources, also known \
                  as golden images) PVCs are not being updated on the defined schedule",
    },
    Alert {
        name: "CDINoDefaultStorageClass",
        expr: r#"sum(kubevirt_cdi_storageprofile_info{default="true"} or on() vector(0)) + sum(kubevirt_cdi_storageprofile_info{virtdefault="true"} or on() vector(0)) + (count(kubevirt_cdi_datavolume_pending == 0) or on() vector(0)) == 0"#,
        for_: "5m",
        severity: "warning",
        health_impact: "none",
        summary: "No default StorageClass or virtualization StorageClass, and a DataVolume is \
                  pending for one",
    },
    Alert {
        name: "CDIMultipleDefaultVirtStorageClasses",
        expr: r#"sum(kubevirt_cdi_storageprofile_info{virtdefault="true"} or on() vector(0)) > 1"#,
        for_: "5m",
        severity: "warning",
        health_impact: "none",
        summary: "More than one default virtualization StorageClass detected",
    },
    Alert {
        name: "CDIDefaultStorageClassDegraded",
        expr: r#"sum(kubevirt_cdi_storageprofile_info{default="true",degraded="false"} or on() vector(0)) + sum(kubevirt_cdi_storageprofile_info{virtdefault="true",degraded="false"} or on() vector(0)) + on () (0*(sum(kubevirt_cdi_storageprofile_info{default="true"}) or sum(kubevirt_cdi_storageprofile_info{virtdefault="true"}))) == 0"#,
        for_: "5m",
        severity: "warning",
        health_impact: "none",
        summary: "Default storage class has no smart clone or ReadWriteMany",
    },
];

/// Upstream's recording rules in `namespace` (CDI's): (record, expression), sorted by record
/// and expression as upstream's registry sorts them.
pub fn recording_rules(namespace: &str) -> Vec<(String, String)> {
    let operator_up =
        format!("sum(up{{namespace='{namespace}', pod=~'cdi-operator-.*'}} or vector(0))");
    let high_restart = |pod: &str, container: &str| {
        format!(
            "count(kube_pod_container_status_restarts_total{{pod=~'{pod}', container='{container}'}} > {UNUSUAL_RESTART_COUNT}) or on() vector(0)"
        )
    };
    let import = high_restart("importer-.*", "importer");
    let upload = high_restart("cdi-upload-.*", "cdi-upload-server");
    let clone = high_restart(".*-source-pod", "cdi-clone-source");
    let mut rules: Vec<(String, String)> = [
        ("kubevirt_cdi_operator_up", &operator_up),
        ("cluster:kubevirt_cdi_operator_up:sum", &operator_up),
        ("kubevirt_cdi_import_pods_high_restart", &import),
        (
            "cluster:kubevirt_cdi_import_pods_high_restart:count",
            &import,
        ),
        ("kubevirt_cdi_upload_pods_high_restart", &upload),
        (
            "cluster:kubevirt_cdi_upload_pods_high_restart:count",
            &upload,
        ),
        ("kubevirt_cdi_clone_pods_high_restart", &clone),
        ("cluster:kubevirt_cdi_clone_pods_high_restart:count", &clone),
    ]
    .into_iter()
    .map(|(r, e)| (r.to_string(), e.to_string()))
    .collect();
    rules.sort_by(|a, b| format!("{}:{}", a.0, a.1).cmp(&format!("{}:{}", b.0, b.1)));
    rules
}

/// The rule groups (`recordingRules.rules`, `alerts.rules`), as a PrometheusRule's
/// `spec.groups` and a Prometheus rules file's `groups` have them.
pub fn groups(namespace: &str) -> Value {
    let recording: Vec<Value> = recording_rules(namespace)
        .into_iter()
        .map(|(record, expr)| json!({"record": record, "expr": expr}))
        .collect();
    let alerts: Vec<Value> = ALERTS
        .iter()
        .map(|a| {
            json!({
                "alert": a.name,
                "expr": a.expr,
                "for": a.for_,
                "annotations": {
                    "summary": a.summary,
                    "runbook_url": format!("{RUNBOOK_URL}{}", a.name),
                },
                "labels": {
                    "severity": a.severity,
                    "operator_health_impact": a.health_impact,
                    "kubernetes_operator_part_of": "kubevirt",
                    "kubernetes_operator_component": cdi_api::label::APP_VALUE,
                },
            })
        })
        .collect();
    json!([
        {"name": "recordingRules.rules", "rules": recording},
        {"name": "alerts.rules", "rules": alerts},
    ])
}

/// The PrometheusRule `prometheus-cdi-rules` in `namespace`, as upstream's operator makes it.
pub fn prometheus_rule(namespace: &str) -> Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": RULE_NAME,
            "namespace": namespace,
            "labels": {
                cdi_api::label::COMPONENT: "",
                cdi_api::label::PROMETHEUS: "true",
            },
        },
        "spec": {"groups": groups(namespace)},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_holds_upstreams_recording_rules_and_eight_alerts() {
        let rule = prometheus_rule("cdi");
        let groups = rule["spec"]["groups"].as_array().unwrap();
        let records: Vec<&str> = groups[0]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["record"].as_str().unwrap())
            .collect();
        assert_eq!(
            records,
            [
                "cluster:kubevirt_cdi_clone_pods_high_restart:count",
                "cluster:kubevirt_cdi_import_pods_high_restart:count",
                "cluster:kubevirt_cdi_operator_up:sum",
                "cluster:kubevirt_cdi_upload_pods_high_restart:count",
                "kubevirt_cdi_clone_pods_high_restart",
                "kubevirt_cdi_import_pods_high_restart",
                "kubevirt_cdi_operator_up",
                "kubevirt_cdi_upload_pods_high_restart",
            ]
        );
        assert_eq!(
            groups[0]["rules"][2]["expr"],
            "sum(up{namespace='cdi', pod=~'cdi-operator-.*'} or vector(0))"
        );
        let alerts = groups[1]["rules"].as_array().unwrap();
        assert_eq!(alerts.len(), 8);
        assert_eq!(
            alerts[1]["annotations"]["runbook_url"],
            "https://kubevirt.io/monitoring/runbooks/CDINotReady"
        );
        assert_eq!(
            alerts[1]["labels"]["kubernetes_operator_component"],
            "containerized-data-importer"
        );
    }
}
