//! Upstream's Prometheus rules for CDI against Prometheus' own rule checker: `promtool check
//! rules` accepts them, and `promtool test rules` shows each alert firing on the series that
//! should fire it (and not on those that should not) — first on made-up series, then on what
//! the controller's `/metrics` says about the development cluster's classes.

mod devcluster;

use std::path::Path;
use std::process::Command;

use cdi_core::monitoring::{ALERTS, RUNBOOK_URL, groups};
use devcluster::{Controller, Down, cdi, kubectl, wait_for};
use serde_json::{Value, json};

/// promtool: `CDI_PROMTOOL`, or what scripts/test unpacks from Debian's prometheus package
/// into `target/test-tools/prometheus`.
fn promtool_path() -> std::path::PathBuf {
    std::env::var_os("CDI_PROMTOOL").map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/test-tools/prometheus/usr/bin/promtool")
        },
        Into::into,
    )
}

/// Run promtool; its output, and whether it succeeded.
fn promtool(args: &[&str]) -> (bool, String) {
    let path = promtool_path();
    let out = Command::new(&path).args(args).output().unwrap_or_else(|e| {
        panic!(
            "{}: {e} (scripts/test unpacks Debian's prometheus package there)",
            path.display()
        )
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The rules file (JSON is YAML) in `dir`.
fn rules_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("rules.json");
    std::fs::write(&path, json!({"groups": groups("cdi")}).to_string()).unwrap();
    path
}

/// What `alert` carries besides its series' labels.
fn alert_labels(alert: &str, extra: Value) -> Value {
    let a = ALERTS.iter().find(|a| a.name == alert).unwrap();
    let mut labels = json!({
        "severity": a.severity,
        "operator_health_impact": a.health_impact,
        "kubernetes_operator_part_of": "kubevirt",
        "kubernetes_operator_component": "containerized-data-importer",
    });
    for (k, v) in extra.as_object().unwrap() {
        labels[k] = v.clone();
    }
    labels
}

/// The expected firing of `alert` with `extra` labels (its summary templated with `class`).
fn firing(alert: &str, extra: Value, class: &str) -> Value {
    let a = ALERTS.iter().find(|a| a.name == alert).unwrap();
    json!({
        "exp_labels": alert_labels(alert, extra),
        "exp_annotations": {
            "summary": a.summary.replace("{{ $labels.storageclass }}", class),
            "runbook_url": format!("{RUNBOOK_URL}{alert}"),
        },
    })
}

/// `promtool test rules` of `tests` against the rules, in `dir`.
fn test_rules(dir: &Path, tests: Vec<Value>) {
    let rules = rules_file(dir);
    let file = dir.join("tests.json");
    let doc = json!({
        "rule_files": [rules.to_str().unwrap()],
        "evaluation_interval": "1m",
        "tests": tests,
    });
    std::fs::write(&file, doc.to_string()).unwrap();
    let (ok, out) = promtool(&["test", "rules", file.to_str().unwrap()]);
    assert!(ok, "{out}");
}

fn info(class: &str, labels: &str) -> String {
    format!(
        "kubevirt_cdi_storageprofile_info{{storageclass=\"{class}\",provisioner=\"p\",{labels}}}"
    )
}

/// One test case: `series` (name, values) and, at `at`, each alert's expected firings.
fn case(series: &[(&str, &str)], at: &str, alerts: &[(&str, Vec<Value>)]) -> Value {
    json!({
        "interval": "1m",
        "input_series": series.iter().map(|(s, v)| json!({"series": s, "values": v})).collect::<Vec<_>>(),
        "alert_rule_test": alerts.iter().map(|(name, exp)| json!({
            "eval_time": at, "alertname": name, "exp_alerts": exp,
        })).collect::<Vec<_>>(),
    })
}

#[test]
fn promtool_accepts_the_rules_and_each_alert_fires_when_it_should() {
    let tmp = tempfile::tempdir().unwrap();
    let (ok, out) = promtool(&["check", "rules", rules_file(tmp.path()).to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains("SUCCESS: 16 rules found"), "{out}");

    let complete = r#"complete="true",default="true",virtdefault="false",rwx="true",smartclone="true",degraded="false""#;
    let none = Vec::new;
    test_rules(
        tmp.path(),
        vec![
            // The operator's pod down, CDI not ready.
            case(
                &[
                    (r#"up{namespace="cdi",pod="cdi-operator-5d9f"}"#, "0x20"),
                    ("kubevirt_cdi_cr_ready", "0x20"),
                ],
                "11m",
                &[
                    (
                        "CDIOperatorDown",
                        vec![firing("CDIOperatorDown", json!({}), "")],
                    ),
                    ("CDINotReady", vec![firing("CDINotReady", json!({}), "")]),
                ],
            ),
            // Up and ready: quiet.
            case(
                &[
                    (r#"up{namespace="cdi",pod="cdi-operator-5d9f"}"#, "1x20"),
                    ("kubevirt_cdi_cr_ready", "1x20"),
                ],
                "11m",
                &[("CDIOperatorDown", none()), ("CDINotReady", none())],
            ),
            // An importer restarted 4 times fires; an upload server restarted 3 times does not.
            case(
                &[(
                    r#"kube_pod_container_status_restarts_total{pod="importer-disk",container="importer"}"#,
                    "4x20",
                )],
                "6m",
                &[(
                    "CDIDataVolumeUnusualRestartCount",
                    vec![firing("CDIDataVolumeUnusualRestartCount", json!({}), "")],
                )],
            ),
            case(
                &[(
                    r#"kube_pod_container_status_restarts_total{pod="cdi-upload-disk",container="cdi-upload-server"}"#,
                    "3x20",
                )],
                "6m",
                &[("CDIDataVolumeUnusualRestartCount", none())],
            ),
            // An incomplete profile; two virtualization defaults; a degraded default.
            case(
                &[
                    (
                        &info(
                            "local",
                            r#"complete="false",default="true",virtdefault="true",rwx="false",smartclone="false",degraded="true""#,
                        ),
                        "1x20",
                    ),
                    (
                        &info(
                            "other",
                            r#"complete="true",default="false",virtdefault="true",rwx="true",smartclone="true",degraded="false""#,
                        ),
                        "1x20",
                    ),
                ],
                "6m",
                &[
                    (
                        "CDIStorageProfilesIncomplete",
                        vec![firing(
                            "CDIStorageProfilesIncomplete",
                            json!({"storageclass": "local", "provisioner": "p"}),
                            "local",
                        )],
                    ),
                    (
                        "CDIMultipleDefaultVirtStorageClasses",
                        vec![firing(
                            "CDIMultipleDefaultVirtStorageClasses",
                            json!({}),
                            "",
                        )],
                    ),
                    // The virtualization default is not degraded: quiet.
                    ("CDIDefaultStorageClassDegraded", none()),
                ],
            ),
            case(
                &[(
                    &info(
                        "local",
                        r#"complete="true",default="true",virtdefault="false",rwx="false",smartclone="true",degraded="true""#,
                    ),
                    "1x20",
                )],
                "6m",
                &[(
                    "CDIDefaultStorageClassDegraded",
                    vec![firing("CDIDefaultStorageClassDegraded", json!({}), "")],
                )],
            ),
            // No default class and a DataVolume waiting for one; then a default.
            case(
                &[
                    (
                        &info(
                            "local",
                            r#"complete="true",default="false",virtdefault="false",rwx="true",smartclone="true",degraded="false""#,
                        ),
                        "1x20",
                    ),
                    ("kubevirt_cdi_datavolume_pending", "1x20"),
                ],
                "6m",
                &[(
                    "CDINoDefaultStorageClass",
                    vec![firing("CDINoDefaultStorageClass", json!({}), "")],
                )],
            ),
            case(
                &[
                    (&info("local", complete), "1x20"),
                    ("kubevirt_cdi_datavolume_pending", "0x20"),
                ],
                "6m",
                &[
                    ("CDINoDefaultStorageClass", none()),
                    ("CDIStorageProfilesIncomplete", none()),
                    ("CDIDefaultStorageClassDegraded", none()),
                ],
            ),
            // An outdated cron fires after 15 minutes; one waiting for a default class does not.
            case(
                &[
                    (
                        r#"kubevirt_cdi_dataimportcron_outdated{namespace="golden",cron_name="fedora",pending="false"}"#,
                        "1x30",
                    ),
                    (
                        r#"kubevirt_cdi_dataimportcron_outdated{namespace="golden",cron_name="centos",pending="true"}"#,
                        "1x30",
                    ),
                ],
                "16m",
                &[(
                    "CDIDataImportCronOutdated",
                    vec![firing(
                        "CDIDataImportCronOutdated",
                        json!({"namespace": "golden", "cron_name": "fedora"}),
                        "",
                    )],
                )],
            ),
        ],
    );
}

/// The controller's metrics address, from the line it logs at start.
fn metrics_addr(log: &Path) -> String {
    let log = std::fs::read_to_string(log).unwrap();
    log.lines()
        .find_map(|l| l.strip_prefix("metrics, healthz and readyz on http://"))
        .expect("the controller prints its address")
        .to_string()
}

/// The `kubevirt_cdi_*` samples of the controller's `/metrics` page: (series, value).
fn scrape(addr: &str) -> Vec<(String, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).unwrap();
    page.lines()
        .filter(|l| l.starts_with("kubevirt_cdi_"))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.to_string()))
        })
        .collect()
}

/// The info series of `class`, as the page has it.
fn profile_series(samples: &[(String, String)], class: &str) -> Option<String> {
    samples
        .iter()
        .map(|(s, _)| s)
        .find(|s| {
            s.starts_with("kubevirt_cdi_storageprofile_info{")
                && s.contains(&format!("storageclass=\"{class}\""))
        })
        .cloned()
}

/// The scraped samples, held for 20 minutes, as one promtool case judged at 6 minutes.
fn held(samples: &[(String, String)], alerts: &[(&str, Vec<Value>)]) -> Value {
    let series: Vec<(String, String)> = samples
        .iter()
        .map(|(s, v)| (s.clone(), format!("{v}x20")))
        .collect();
    let refs: Vec<(&str, &str)> = series
        .iter()
        .map(|(s, v)| (s.as_str(), v.as_str()))
        .collect();
    case(&refs, "6m", alerts)
}

fn incomplete(class: &str, provisioner: &str) -> Value {
    firing(
        "CDIStorageProfilesIncomplete",
        json!({"storageclass": class, "provisioner": provisioner}),
        class,
    )
}

#[test]
fn the_controllers_metrics_fire_the_alerts_the_cluster_deserves() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let (ok, out, err) = cdi(&["dev", "up", "--addr", "127.0.0.1:0"], &dir);
    assert!(ok, "{out}{err}");
    let _down = Down(&dir);
    let log = tmp.path().join("controller.log");
    let _controller = Controller::start(&dir, &log);
    let addr = wait_for("the controller's metrics", 30, || {
        std::fs::read_to_string(&log)
            .ok()?
            .contains("metrics, healthz and readyz on http://")
            .then(|| metrics_addr(&log))
    });
    let samples = wait_for("a series per class", 60, || {
        let s = scrape(&addr);
        ["local-path", "csi", "shared"]
            .iter()
            .all(|c| profile_series(&s, c).is_some())
            .then_some(s)
    });
    // The classes as the development cluster makes them: none of their provisioners is in
    // CDI's table (incomplete), none offers ReadWriteMany (degraded); the CSI-like class clones
    // by snapshot through its VolumeSnapshotClass, the other two only by copying.
    for (class, labels) in [
        (
            "local-path",
            r#"provisioner="rancher.io/local-path",complete="false",default="true",virtdefault="false",rwx="false",smartclone="false",degraded="true""#,
        ),
        (
            "csi",
            r#"provisioner="csi.cdi-rs.dev",complete="false",default="false",virtdefault="false",rwx="false",smartclone="true",degraded="true""#,
        ),
        (
            "shared",
            r#"provisioner="shared.cdi-rs.dev",complete="false",default="false",virtdefault="false",rwx="false",smartclone="false",degraded="true""#,
        ),
    ] {
        let series = profile_series(&samples, class).unwrap();
        assert!(series.contains(labels), "{class}: {series}");
    }
    // So Prometheus would say: three incomplete profiles, a degraded default; nothing pends.
    test_rules(
        tmp.path(),
        vec![held(
            &samples,
            &[
                (
                    "CDIStorageProfilesIncomplete",
                    vec![
                        incomplete("csi", "csi.cdi-rs.dev"),
                        incomplete("local-path", "rancher.io/local-path"),
                        incomplete("shared", "shared.cdi-rs.dev"),
                    ],
                ),
                (
                    "CDIDefaultStorageClassDegraded",
                    vec![firing("CDIDefaultStorageClassDegraded", json!({}), "")],
                ),
                ("CDINoDefaultStorageClass", Vec::new()),
                ("CDIMultipleDefaultVirtStorageClasses", Vec::new()),
            ],
        )],
    );

    // Filling local-path's profile with ReadWriteMany completes it; two virtualization
    // defaults are one too many.
    kubectl(
        &dir,
        &[
            "patch",
            "storageprofile",
            "local-path",
            "--type=merge",
            "-p",
            r#"{"spec":{"claimPropertySets":[{"accessModes":["ReadWriteMany"],"volumeMode":"Filesystem"}]}}"#,
        ],
        None,
    );
    for class in ["csi", "shared"] {
        kubectl(
            &dir,
            &[
                "annotate",
                "storageclass",
                class,
                "storageclass.kubevirt.io/is-default-virt-class=true",
            ],
            None,
        );
    }
    let samples = wait_for("the new labels", 60, || {
        let s = scrape(&addr);
        let local = profile_series(&s, "local-path")?;
        let shared = profile_series(&s, "shared")?;
        (local.contains(r#"complete="true""#)
            && local.contains(r#"rwx="true""#)
            && shared.contains(r#"virtdefault="true""#)
            && profile_series(&s, "csi")?.contains(r#"virtdefault="true""#))
        .then_some(s)
    });
    // One series per class: the old labels went.
    let series = samples
        .iter()
        .filter(|(s, _)| s.starts_with("kubevirt_cdi_storageprofile_info{"))
        .count();
    assert_eq!(series, 3, "{samples:?}");
    test_rules(
        tmp.path(),
        vec![held(
            &samples,
            &[
                (
                    "CDIStorageProfilesIncomplete",
                    vec![
                        incomplete("csi", "csi.cdi-rs.dev"),
                        incomplete("shared", "shared.cdi-rs.dev"),
                    ],
                ),
                (
                    "CDIMultipleDefaultVirtStorageClasses",
                    vec![firing(
                        "CDIMultipleDefaultVirtStorageClasses",
                        json!({}),
                        "",
                    )],
                ),
            ],
        )],
    );

    // No default of either kind, and a DataVolume waiting for one.
    for (class, key) in [
        ("local-path", "storageclass.kubernetes.io/is-default-class"),
        ("csi", "storageclass.kubevirt.io/is-default-virt-class"),
        ("shared", "storageclass.kubevirt.io/is-default-virt-class"),
    ] {
        kubectl(
            &dir,
            &["annotate", "storageclass", class, &format!("{key}-")],
            None,
        );
    }
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {name: no-class}
spec:
  source: {blank: {}}
  storage: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}
"#,
        ),
    );
    let samples = wait_for("the pending DataVolume counted", 60, || {
        let s = scrape(&addr);
        (s.iter()
            .any(|(n, v)| n == "kubevirt_cdi_datavolume_pending" && v == "1")
            && !s.iter().any(|(n, _)| {
                n.contains(r#"default="true""#) || n.contains(r#"virtdefault="true""#)
            }))
        .then_some(s)
    });
    test_rules(
        tmp.path(),
        vec![held(
            &samples,
            &[(
                "CDINoDefaultStorageClass",
                vec![firing("CDINoDefaultStorageClass", json!({}), "")],
            )],
        )],
    );

    // A deleted class takes its series along.
    kubectl(&dir, &["delete", "storageclass", "shared"], None);
    wait_for("the deleted class's series to go", 60, || {
        profile_series(&scrape(&addr), "shared")
            .is_none()
            .then_some(())
    });
}
