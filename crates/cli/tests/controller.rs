//! `cdi controller` in `cdi dev`: the import path end to end with the real controller binary
//! and real importer pods, driven with kubectl as a user would.

mod devcluster;

use std::path::Path;
use std::time::Duration;

use cdi_testkit::images::{assert_same, convert, oracle, pattern, qemu_img};
use cdi_testkit::{Behaviour, FileServer};
use devcluster::{
    Controller, Down, cdi, doctor, kubectl, pod_process, pod_process_named, wait_for, within,
};
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn get(dir: &Path, what: &str) -> Option<Value> {
    let out = std::process::Command::new("kubectl")
        .args(["get", what, "-o", "json"])
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

/// A cluster with the controller running, `HonorWaitForFirstConsumer` set as `gate`, and the
/// seed's class. No CDI `spec.workload`: worker pods reach the tainted node only by following
/// their claim's consumer (docs/design.md#worker-pods-follow-the-first-consumer).
struct Setup {
    _tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
    controller: Controller,
}

fn setup(gate: bool) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let (ok, out, err) = cdi(&["dev", "up", "--addr", "127.0.0.1:0"], &dir);
    assert!(ok, "{out}{err}");
    let controller = Controller::start(&dir, &tmp.path().join("controller.log"));
    wait_for("CDIConfig config", 30, || get(&dir, "cdiconfig/config"));
    let gates = if gate {
        r#"["HonorWaitForFirstConsumer"]"#
    } else {
        "[]"
    };
    devcluster::set_feature_gates(&dir, gates);
    kubectl(&dir, &["apply", "-f", "-"], Some(SETUP));
    Setup {
        _tmp: tmp,
        dir,
        controller,
    }
}

const SETUP: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: local-path-wffc}
provisioner: rancher.io/local-path
parameters:
  nodePath: /data/vm-disks
  pathPattern: "{{ .PVC.Namespace }}/{{ .PVC.Name }}/"
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
"#;

/// A DataVolume of 1Gi on the seed's class with `source` as written (a YAML flow mapping, or
/// nothing for none).
fn data_volume_from(name: &str, source: &str) -> String {
    let source = if source.is_empty() {
        String::new()
    } else {
        format!("\n  source: {source}")
    };
    format!(
        r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {{name: {name}}}
spec:{source}
  pvc:
    storageClassName: local-path-wffc
    accessModes: [ReadWriteOnce]
    resources: {{requests: {{storage: 1Gi}}}}
"#
    )
}

fn data_volume(name: &str, url: &str, size: &str, extra_annotations: &str) -> String {
    format!(
        r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: {name}
  annotations: {{{extra_annotations}}}
spec:
  source: {{http: {{url: "{url}"}}}}
  pvc:
    storageClassName: local-path-wffc
    accessModes: [ReadWriteOnce]
    resources: {{requests: {{storage: {size}}}}}
"#
    )
}

/// The VM's first consumer as KubeVirt's temporary pod would be: its scheduling constraints,
/// the claim, a command that exits at once.
fn consumer(name: &str, claim: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: Never
  nodeSelector: {{node-role.kubernetes.io/virt-local: "true"}}
  tolerations: [{{key: virt-local, operator: Equal, value: "true", effect: NoSchedule}}]
  containers: [{{name: compute, image: quay.io/kubevirt/virt-launcher:v1.6.0, command: [/bin/bash], args: [-c, echo, bound PVCs]}}]
  volumes: [{{name: root, persistentVolumeClaim: {{claimName: {claim}}}}}]
"#
    )
}

/// The names of every claim in the namespace.
fn claim_names(dir: &Path) -> Vec<String> {
    names_of(dir, "pvc")
}

/// The PersistentVolume a claim is bound to.
fn volume_of(dir: &Path, claim: &Value) -> Value {
    let name = claim["spec"]["volumeName"].as_str().expect("a bound claim");
    get(dir, &format!("pv/{name}")).unwrap()
}

fn phase(dv: &Value) -> String {
    dv["status"]["phase"].as_str().unwrap_or("").to_string()
}

/// Serve a qcow2 of `size` pattern bytes; the image's bytes as qemu-img reads them.
async fn serve_image(dir: &Path, size: u64, slow: bool) -> (FileServer, Vec<u8>) {
    let raw = dir.join("src.raw");
    std::fs::write(&raw, pattern(size)).unwrap();
    convert(&raw, "qcow2", &[], &dir.join("src.qcow2"));
    let expected = oracle(&dir.join("src.qcow2"), "qcow2");
    let server = FileServer::start(None).await;
    server.add(
        "/disk.qcow2",
        std::fs::read(dir.join("src.qcow2")).unwrap(),
        Behaviour {
            ranges: true,
            // A slow server, so that ImportInProgress lasts long enough to be seen.
            delay_body: slow.then_some(Duration::from_millis(700)),
            ..Default::default()
        },
    );
    (server, expected)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_seed_scenario_places_and_fills_the_disk_on_node_2() {
    let s = setup(true);
    let _down = Down(&s.dir);
    let (server, expected) = serve_image(s._tmp.path(), 8 * MIB, true).await;
    let url = server.url("/disk.qcow2");
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&data_volume("vm-root", &url, "2Gi", "")),
    );

    // Waits for its first consumer: no importer pod meanwhile.
    wait_for("WaitForFirstConsumer", 30, || {
        let dv = get(&s.dir, "dv/vm-root")?;
        (phase(&dv) == "WaitForFirstConsumer").then_some(())
    });
    another_pass(&s, "import", "pvc/vm-root");
    assert!(
        get(&s.dir, "pod/importer-vm-root").is_none(),
        "an importer pod before the claim is bound"
    );
    let dv = get(&s.dir, "dv/vm-root").unwrap();
    let bound = dv["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Bound")
        .unwrap()
        .clone();
    assert_eq!(
        (bound["status"].as_str(), bound["message"].as_str()),
        (
            Some("False"),
            Some(
                "target PVC vm-root Pending and waiting for first consumer to be created before binding"
            )
        )
    );

    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&consumer("virt-launcher-vm-tmp", "vm-root")),
    );
    let mut phases: Vec<String> = vec!["WaitForFirstConsumer".into()];
    let dv = wait_for("the import to succeed", 90, || {
        let dv = get(&s.dir, "dv/vm-root")?;
        let p = phase(&dv);
        if phases.last() != Some(&p) {
            phases.push(p.clone());
        }
        if get(&s.dir, "pod/importer-vm-root").is_some() {
            let claim = get(&s.dir, "pvc/vm-root").unwrap();
            assert_eq!(
                claim["status"]["phase"], "Bound",
                "importer pod before the claim was bound"
            );
        }
        (p == "Succeeded").then_some(dv)
    });
    let allowed = [
        "WaitForFirstConsumer",
        "PVCBound",
        "ImportScheduled",
        "ImportInProgress",
        "Succeeded",
    ];
    assert!(
        phases.iter().all(|p| allowed.contains(&p.as_str())),
        "{phases:?}"
    );
    let order: Vec<usize> = phases
        .iter()
        .map(|p| allowed.iter().position(|a| a == p).unwrap())
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{phases:?}");
    assert!(
        phases.contains(&"ImportInProgress".to_string()),
        "{phases:?}"
    );
    assert_eq!(dv["status"]["progress"], "100.0%");

    // Placement: the claim, the volume and the data are on node-2.
    let claim = get(&s.dir, "pvc/vm-root").unwrap();
    assert_eq!(
        claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"],
        "node-2"
    );
    let pv_name = claim["spec"]["volumeName"].as_str().unwrap();
    let pv = get(&s.dir, &format!("pv/{pv_name}")).unwrap();
    let path = pv["spec"]["hostPath"]["path"].as_str().unwrap().to_string();
    assert!(
        path.contains("/nodes/node-2/data/vm-disks/default/vm-root"),
        "{path}"
    );
    let disk = std::fs::read(Path::new(&path).join("disk.img")).unwrap();
    // spec.pvc: the claim asks for exactly 2Gi; the image gets the usable part of it (docs/design.md#the-size-math).
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "2Gi");
    let usable = cdi_core::size::usable_space(2 << 30, "0.06".parse().unwrap()) as usize;
    assert_eq!(disk.len(), usable);
    assert_same(&disk[..expected.len()], &expected, "the imported image");
    // The importer pod is gone once done; the claim says it succeeded.
    wait_for("the importer pod to go", 30, || {
        get(&s.dir, "pod/importer-vm-root").is_none().then_some(())
    });
    assert_eq!(
        claim["metadata"]["annotations"]["cdi.kubevirt.io/storage.pod.phase"],
        "Succeeded"
    );
    // With no CDI spec.workload, the importer reached the tainted node by the consumer's
    // toleration, recorded on the claim and said in an event.
    let record: Value = serde_json::from_str(
        claim["metadata"]["annotations"]["cdi-rs.dev/worker-tolerations"]
            .as_str()
            .expect("the record"),
    )
    .unwrap();
    assert_eq!(record["consumer"], "virt-launcher-vm-tmp");
    assert_eq!(record["node"], "node-2");
    assert_eq!(record["tolerations"][0]["key"], "virt-local");
    assert!(
        events_of(&s.dir, "vm-root")
            .iter()
            .any(|(reason, message)| reason == "WorkerTolerationsInherited"
                && message.contains("virt-local=true:NoSchedule from pod virt-launcher-vm-tmp")),
        "{:?}",
        events_of(&s.dir, "vm-root")
    );
    drop(s.controller);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_gate_the_importer_binds_the_claim_wherever_it_lands() {
    let s = setup(false);
    let _down = Down(&s.dir);
    let (server, _) = serve_image(s._tmp.path(), MIB, false).await;
    let url = server.url("/disk.qcow2");
    let retain = r#"cdi.kubevirt.io/storage.pod.retainAfterCompletion: "true""#;
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&data_volume("early", &url, "1Gi", retain)),
    );
    let dv = wait_for("the import to succeed", 60, || {
        let dv = get(&s.dir, "dv/early")?;
        (phase(&dv) == "Succeeded").then_some(dv)
    });
    assert_eq!(dv["status"]["claimName"], "early");
    let claim = get(&s.dir, "pvc/early").unwrap();
    let anns = &claim["metadata"]["annotations"];
    assert!(
        anns.get("cdi.kubevirt.io/storage.bind.immediate.requested")
            .is_some(),
        "{anns}"
    );
    // The importer was the first consumer: the claim went where the importer was scheduled (kept
    // by retainAfterCompletion), with no regard for the VM that is to use it.
    let node = anns["volume.kubernetes.io/selected-node"].as_str().unwrap();
    let pod = get(&s.dir, "pod/importer-early").expect("retained importer pod");
    assert_eq!(pod["spec"]["nodeName"].as_str(), Some(node));
    assert_eq!(pod["status"]["phase"], "Succeeded");

    // The VM then needs another node: `cdi doctor` says the gate put the disk where it is.
    let d = blocked_elsewhere(&s.dir, "early", node, "GateOff");
    let explanation = d["explanation"].as_str().unwrap();
    assert!(
        explanation.contains(&format!("bound to a volume on {node}"))
            && explanation.contains("volume node affinity conflict")
            && explanation.contains("HonorWaitForFirstConsumer"),
        "{d}"
    );
    drop(s.controller);
}

/// Pod `vm-elsewhere`, using `claim` (whose volume is on `node`), pinned to another node:
/// `cdi doctor`'s answer once it names `cause`.
fn blocked_elsewhere(dir: &Path, claim: &str, node: &str, cause: &str) -> Value {
    let elsewhere = if node == "node-1" { "node-3" } else { "node-1" };
    kubectl(
        dir,
        &["apply", "-f", "-"],
        Some(&pinned("vm-elsewhere", claim, elsewhere)),
    );
    wait_for("the doctor to see the VM blocked", 60, || {
        Some(doctor(dir, &[claim])).filter(|d| d["cause"] == cause)
    })
}

/// A pod using `claim` that must run on `node`.
fn pinned(name: &str, claim: &str, node: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  tolerations: [{{key: virt-local, operator: Exists}}]
  containers: [{{name: compute, image: quay.io/kubevirt/virt-launcher:v1.6.0, command: [/bin/sh], args: [-c, sleep 600]}}]
  volumes: [{{name: root, persistentVolumeClaim: {{claimName: {claim}}}}}]
"#
    )
}

/// A plain HTTP GET over a socket: status line, headers and body as text.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).unwrap();
    out
}

/// The controller's metrics address, from the line it logs at start.
fn metrics_addr(s: &Setup) -> String {
    let log = std::fs::read_to_string(s._tmp.path().join("controller.log")).unwrap();
    log.lines()
        .find_map(|l| l.strip_prefix("metrics, healthz and readyz on http://"))
        .expect("the controller prints its address")
        .to_string()
}

/// How many passes `controller` has made, as its metrics count them.
fn passes(s: &Setup, controller: &str) -> u64 {
    let prefix = format!("cdi_rs_reconcile_total{{controller=\"{controller}\",");
    http_get(&metrics_addr(s), "/metrics")
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Make `controller` look at `object` again (an annotation changes) and wait until it has made
/// a pass since: what it did not do by then, it did not decide to do. A signal, not a sleep.
fn another_pass(s: &Setup, controller: &str, object: &str) {
    for round in 0..2 {
        let before = passes(s, controller);
        kubectl(
            &s.dir,
            &[
                "annotate",
                "--overwrite",
                object,
                &format!("test.cdi-rs.dev/nudge={before}-{round}"),
            ],
            None,
        );
        wait_for(&format!("a {controller} pass over {object}"), 30, || {
            (passes(s, controller) > before).then_some(())
        });
    }
}

fn condition(dv: &Value, type_: &str) -> Value {
    dv["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_consumer_it_waits_and_says_so() {
    let s = setup(true);
    let _down = Down(&s.dir);
    let (server, _) = serve_image(s._tmp.path(), MIB, false).await;
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&data_volume(
            "lonely",
            &server.url("/disk.qcow2"),
            "1Gi",
            "",
        )),
    );
    // Waiting, and saying what for in the PV controller's words: by then the claim has been
    // seen by every controller, and none started an import.
    let dv = wait_for("WaitForFirstConsumer, explained", 30, || {
        get(&s.dir, "dv/lonely").filter(|d| {
            phase(d) == "WaitForFirstConsumer"
                && condition(d, "Bound")["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("waiting for first consumer"))
        })
    });
    let bound = condition(&dv, "Bound");
    assert_eq!(
        (bound["status"].as_str(), bound["reason"].as_str()),
        (Some("False"), Some("Pending"))
    );
    // In the PV controller's words, as upstream passes them on.
    assert_eq!(
        bound["message"],
        "target PVC lonely Pending and waiting for first consumer to be created before binding"
    );
    assert!(get(&s.dir, "pod/importer-lonely").is_none());
    // `cdi doctor` says what is missing and what would do.
    let d = doctor(&s.dir, &["lonely"]);
    assert_eq!(d["cause"], "WaitingForConsumer", "{d}");
    assert_eq!(
        d["summary"],
        "claim lonely waits for a first consumer, and no pod uses it"
    );
    assert!(
        d["explanation"]
            .as_str()
            .unwrap()
            .contains("cdi-rs.dev/first-consumer"),
        "{d}"
    );
    // kubectl shows it as upstream's columns do.
    let table = kubectl(&s.dir, &["get", "dv", "lonely"], None);
    assert!(
        table.contains("WaitForFirstConsumer") && table.contains("N/A"),
        "{table}"
    );
    // The controller's endpoints: it leads, and serves upstream's pending gauge.
    let addr = metrics_addr(&s);
    assert!(http_get(&addr, "/readyz").starts_with("HTTP/1.1 200"));
    let metrics = http_get(&addr, "/metrics");
    assert!(
        metrics.contains("\nkubevirt_cdi_datavolume_pending 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("\ncdi_rs_controller_leader 1\n"),
        "{metrics}"
    );
    // Our own figures: every controller has counted its passes.
    for controller in ["config", "storageprofile", "datavolume", "import"] {
        assert!(
            metrics.contains(&format!(
                "cdi_rs_reconcile_total{{controller=\"{controller}\",result=\"ok\"}}"
            )),
            "{controller}: {metrics}"
        );
    }
    drop(s.controller);
}

#[tokio::test(flavor = "multi_thread")]
async fn storage_api_sizes_and_a_block_volume_bound_at_once() {
    let s = setup(true);
    let _down = Down(&s.dir);
    let (server, expected) = serve_image(s._tmp.path(), 3 * MIB, false).await;
    let url = server.url("/disk.qcow2");
    // spec.storage: the claim is inflated so that the disk gets the whole request (docs/design.md#the-size-math).
    let storage = format!(
        r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {{name: sized}}
spec:
  source: {{http: {{url: "{url}"}}}}
  storage:
    storageClassName: local-path-wffc
    accessModes: [ReadWriteOnce]
    resources: {{requests: {{storage: 1Gi}}}}
"#
    );
    // A Block volume of the CSI-like class on the classic path; the immediate-bind annotation
    // makes the importer its first consumer although the gate is on.
    let block = format!(
        r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: raw-block
  annotations: {{cdi.kubevirt.io/storage.bind.immediate.requested: "true", cdi.kubevirt.io/storage.usePopulator: "false"}}
spec:
  source: {{http: {{url: "{url}"}}}}
  pvc:
    storageClassName: csi
    volumeMode: Block
    accessModes: [ReadWriteOnce]
    resources: {{requests: {{storage: 64Mi}}}}
"#
    );
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&format!("{storage}---{block}")),
    );
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&consumer("user", "sized")),
    );
    for name in ["sized", "raw-block"] {
        wait_for(&format!("{name} to succeed"), 60, || {
            get(&s.dir, &format!("dv/{name}")).filter(|d| phase(d) == "Succeeded")
        });
    }
    let claim = get(&s.dir, "pvc/sized").unwrap();
    assert_eq!(
        claim["spec"]["resources"]["requests"]["storage"],
        "1138166334"
    );
    let pv = volume_of(&s.dir, &claim);
    let disk = Path::new(pv["spec"]["hostPath"]["path"].as_str().unwrap()).join("disk.img");
    assert_eq!(std::fs::metadata(&disk).unwrap().len(), 1 << 30);

    let claim = get(&s.dir, "pvc/raw-block").unwrap();
    let anns = &claim["metadata"]["annotations"];
    assert!(
        anns.get("cdi.kubevirt.io/storage.bind.immediate.requested")
            .is_some()
    );
    let pv = volume_of(&s.dir, &claim);
    let file = pv["spec"]["csi"]["volumeAttributes"]["path"]
        .as_str()
        .unwrap()
        .to_string();
    let data = std::fs::read(&file).unwrap();
    assert_eq!(data.len() as u64, 64 * MIB, "Block volumes get no overhead");
    assert_same(&data[..expected.len()], &expected, "the block volume");

    // A VM needing another node: the immediate binding chose this one, and `cdi doctor` says so.
    let node = anns["volume.kubernetes.io/selected-node"].as_str().unwrap();
    let d = blocked_elsewhere(&s.dir, "raw-block", node, "ImmediateBind");
    assert_eq!(
        d["summary"],
        format!(
            "pod vm-elsewhere using claim raw-block cannot be scheduled where the volume is ({node})"
        )
    );
    // The one with a consumer in place is fine.
    assert_eq!(doctor(&s.dir, &["sized"])["cause"], "Succeeded");
    drop(s.controller);
}

/// `source.s3` with the DataVolume's Secret (`accessKeyId`, `secretKey`) against a real
/// S3-compatible server: imported, byte-equal to qemu-img's conversion; with the wrong secret
/// the DataVolume says the server refused it, and nothing is imported. `source.gcs` with a
/// Secret holding a service-account key (`credentials.json`) against a GCS emulator, on the
/// classic and the populator path.
#[tokio::test(flavor = "multi_thread")]
async fn object_storage_sources_import_with_the_data_volumes_secret() {
    let s = setup(false);
    let _down = Down(&s.dir);
    let dir = s._tmp.path();
    let raw = dir.join("src.raw");
    std::fs::write(&raw, pattern(8 * MIB)).unwrap();
    convert(&raw, "qcow2", &[], &dir.join("src.qcow2"));
    let expected = oracle(&dir.join("src.qcow2"), "qcow2");
    let s3 = tokio::task::spawn_blocking(cdi_testkit::s3::S3Server::start)
        .await
        .unwrap();
    s3.put(
        "images",
        "disk.qcow2",
        &std::fs::read(dir.join("src.qcow2")).unwrap(),
    );
    let url = s3.url("images", "disk.qcow2");
    let secret = |name: &str, key: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}}}\nstringData: {{accessKeyId: \"{}\", secretKey: \"{key}\"}}\n",
            s3.access_key
        )
    };
    let docs = [
        secret("s3-creds", &s3.secret_key),
        secret("stale-creds", "not-the-secret"),
        data_volume_from(
            "from-s3",
            &format!(r#"{{s3: {{url: "{url}", secretRef: s3-creds}}}}"#),
        ),
        data_volume_from(
            "refused",
            &format!(r#"{{s3: {{url: "{url}", secretRef: stale-creds}}}}"#),
        ),
        // Through the populator: its VolumeImportSource carries the S3 source to PVC prime.
        format!(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {{name: populated}}\nspec:\n  source: {{s3: {{url: \"{url}\", secretRef: s3-creds}}}}\n  storage: {{storageClassName: csi, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}\n"
        ),
        consumer("vm-pod", "populated"),
    ]
    .join("---\n");
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&docs));
    let gcs = cdi_testkit::gcs::GcsServer::start().await;
    gcs.put(
        "images",
        "fedora/disk.qcow2",
        &std::fs::read(dir.join("src.qcow2")).unwrap(),
    )
    .await;
    let key = gcs.service_account("importer@cdi-test.iam.gserviceaccount.com");
    std::fs::write(dir.join("credentials.json"), &key.json).unwrap();
    let from_file = format!(
        "--from-file=credentials.json={}",
        dir.join("credentials.json").display()
    );
    kubectl(
        &s.dir,
        &["create", "secret", "generic", "gcs-key", &from_file],
        None,
    );
    let url = gcs.url("images", "fedora/disk.qcow2");
    let docs = [
        data_volume_from(
            "from-gcs",
            &format!(r#"{{gcs: {{url: "{url}", secretRef: gcs-key}}}}"#),
        ),
        format!(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {{name: populated-gcs}}\nspec:\n  source: {{gcs: {{url: \"{url}\", secretRef: gcs-key}}}}\n  storage: {{storageClassName: csi, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}\n"
        ),
        consumer("gcs-vm-pod", "populated-gcs"),
    ]
    .join("---\n");
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&docs));
    for name in ["from-gcs", "populated-gcs"] {
        wait_for(&format!("the GCS import {name} to succeed"), 120, || {
            get(&s.dir, &format!("dv/{name}")).filter(|d| phase(d) == "Succeeded")
        });
        let disk = std::fs::read(devcluster::volume_file(&s.dir, "default", name)).unwrap();
        assert_same(&disk[..expected.len()], &expected, name);
    }
    let claim = get(&s.dir, "pvc/from-gcs").unwrap();
    assert_eq!(
        claim["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.source"],
        "gcs"
    );
    assert!(gcs.tokens_granted() >= 2, "each import bought its token");
    wait_for("the S3 import to succeed", 120, || {
        get(&s.dir, "dv/from-s3").filter(|d| phase(d) == "Succeeded")
    });
    let claim = get(&s.dir, "pvc/from-s3").unwrap();
    assert_eq!(
        claim["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.source"],
        "s3"
    );
    let disk = std::fs::read(devcluster::volume_file(&s.dir, "default", "from-s3")).unwrap();
    assert_same(&disk[..expected.len()], &expected, "the S3 object's image");
    wait_for("the populated S3 import to succeed", 120, || {
        get(&s.dir, "dv/populated").filter(|d| phase(d) == "Succeeded")
    });
    let claim = get(&s.dir, "pvc/populated").unwrap();
    assert_eq!(claim["spec"]["dataSourceRef"]["kind"], "VolumeImportSource");
    let disk = std::fs::read(devcluster::volume_file(&s.dir, "default", "populated")).unwrap();
    assert_same(&disk[..expected.len()], &expected, "the populated image");
    let dv = wait_for("the refusal, said", 90, || {
        get(&s.dir, "dv/refused").filter(|d| {
            condition(d, "Running")["message"]
                .as_str()
                .unwrap_or("")
                .contains("HTTP 403")
        })
    });
    assert_ne!(phase(&dv), "Succeeded");
    assert!(!dv.to_string().contains("not-the-secret"));
}

/// A DataImportCron whose template clones a claim imports it by its uid (upstream's `uid:`
/// digest), as its ServiceAccount: without the right to clone the claim it is `Progressing=False`
/// with `NotAuthorized` and creates nothing; given `create datavolumes/source`, the clone runs
/// and the managed DataSource names it, holding the claim's bytes. Another class in the template
/// replaces the import with one on that class.
#[tokio::test(flavor = "multi_thread")]
async fn data_import_crons_clone_a_claim_as_their_service_account() {
    let s = setup(false);
    let _down = Down(&s.dir);
    let dir = s._tmp.path();
    let raw = dir.join("src.raw");
    std::fs::write(&raw, pattern(6 * MIB)).unwrap();
    convert(&raw, "qcow2", &[], &dir.join("src.qcow2"));
    let expected = oracle(&dir.join("src.qcow2"), "qcow2");
    let server = FileServer::start(None).await;
    server.add(
        "/golden.qcow2",
        std::fs::read(dir.join("src.qcow2")).unwrap(),
        Behaviour {
            ranges: true,
            ..Default::default()
        },
    );
    let golden = data_volume(
        "golden-disk",
        &server.url("/golden.qcow2"),
        "64Mi",
        r#"cdi.kubevirt.io/storage.bind.immediate.requested: "true""#,
    );
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&golden));
    wait_for("the golden disk to succeed", 120, || {
        get(&s.dir, "dv/golden-disk").filter(|d| phase(d) == "Succeeded")
    });
    let uid = get(&s.dir, "pvc/golden-disk").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let cron = "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataImportCron\nmetadata: {name: golden-cron}\nspec:\n  schedule: \"0 0 1 1 *\"\n  managedDataSource: golden\n  serviceAccountName: importer\n  template:\n    spec:\n      source: {pvc: {namespace: default, name: golden-disk}}\n      pvc: {storageClassName: local-path-wffc, accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}\n";
    kubectl(&s.dir, &["apply", "-f", "-"], Some(cron));
    let refused = wait_for("the clone refused to the ServiceAccount", 60, || {
        get(&s.dir, "dataimportcron/golden-cron")
            .filter(|c| condition(c, "Progressing")["reason"] == "NotAuthorized")
    });
    assert_eq!(
        condition(&refused, "Progressing")["message"],
        "Not authorized to create DataVolume"
    );
    assert_eq!(
        refused["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.sourceDesiredDigest"],
        format!("uid:{uid}").as_str()
    );
    let import = format!("golden-{}", &uid[..12]);
    assert!(get(&s.dir, &format!("dv/{import}")).is_none());

    let grant = "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: clone-source}\nrules:\n- {apiGroups: [cdi.kubevirt.io], resources: [datavolumes/source], verbs: [create]}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: importer-clones}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: clone-source}\nsubjects:\n- {kind: ServiceAccount, name: importer, namespace: default}\n";
    kubectl(&s.dir, &["apply", "-f", "-"], Some(grant));
    // A RoleBinding sends the cron no event: a touch asks again at once (else within a minute).
    kubectl(
        &s.dir,
        &["annotate", "dataimportcron/golden-cron", "touched=1"],
        None,
    );
    wait_for("the DataSource to name the clone", 180, || {
        get(&s.dir, "datasource/golden").filter(|d| {
            d["spec"]["source"]["pvc"]["name"] == import.as_str()
                && condition(d, "Ready")["status"] == "True"
        })
    });
    let disk = std::fs::read(devcluster::volume_file(&s.dir, "default", &import)).unwrap();
    assert_same(&disk[..expected.len()], &expected, "the cron's clone");
    let cron_now = get(&s.dir, "dataimportcron/golden-cron").unwrap();
    assert_eq!(
        cron_now["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.storageClass"],
        "local-path-wffc"
    );

    // Another class for the imports: the current one goes and is made again on the new class.
    kubectl(
        &s.dir,
        &[
            "patch",
            "dataimportcron/golden-cron",
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/spec/template/spec/pvc/storageClassName","value":"local-path"}]"#,
        ],
        None,
    );
    wait_for("the import made again on the new class", 180, || {
        get(&s.dir, &format!("pvc/{import}"))
            .filter(|c| c["spec"]["storageClassName"] == "local-path")
            .and_then(|_| get(&s.dir, "datasource/golden"))
            .filter(|d| condition(d, "Ready")["status"] == "True")
            .and_then(|_| get(&s.dir, "dataimportcron/golden-cron"))
            .filter(|c| {
                c["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.storageClass"]
                    == "local-path"
                    && condition(c, "UpToDate")["status"] == "True"
            })
    });
    let disk = std::fs::read(devcluster::volume_file(&s.dir, "default", &import)).unwrap();
    assert_same(
        &disk[..expected.len()],
        &expected,
        "the clone on the new class",
    );
}

/// A DataImportCron never takes over a managed DataSource that is not its own, and says so:
/// one another cron manages (upstream's `ErrDataSourceAlreadyManaged`) and one a user made
/// without the `cdi.kubevirt.io/dataImportCron` label leave the cron `UpToDate=False` naming
/// the DataSource, who holds it and the fix, with a Warning event saying the same, and the
/// DataSource as it was. Labelled for the cron, the user's DataSource is the cron's.
#[tokio::test(flavor = "multi_thread")]
async fn data_import_crons_leave_data_sources_not_theirs_and_say_so() {
    let s = setup(false);
    let _down = Down(&s.dir);
    // The crons clone this claim, read for its uid; their ServiceAccount may not clone it, so
    // nothing is imported and the passes are quick.
    let users = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: golden-disk}\nspec: {storageClassName: local-path-wffc, accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}\n---\napiVersion: cdi.kubevirt.io/v1beta1\nkind: DataSource\nmetadata: {name: users}\nspec: {source: {pvc: {namespace: default, name: golden-disk}}}\n";
    kubectl(&s.dir, &["apply", "-f", "-"], Some(users));
    let cron = |name: &str, ds: &str| {
        format!(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataImportCron\nmetadata: {{name: {name}}}\nspec:\n  schedule: \"0 0 1 1 *\"\n  managedDataSource: {ds}\n  template:\n    spec:\n      source: {{pvc: {{namespace: default, name: golden-disk}}}}\n      pvc: {{storageClassName: local-path-wffc, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 64Mi}}}}}}\n"
        )
    };
    let label = "cdi.kubevirt.io/dataImportCron";
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&cron("first-cron", "shared")),
    );
    wait_for("the first cron's DataSource", 60, || {
        get(&s.dir, "datasource/shared").filter(|d| d["metadata"]["labels"][label] == "first-cron")
    });
    let docs = [cron("second-cron", "shared"), cron("users-cron", "users")].join("---\n");
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&docs));

    // The condition, and the event with the same words.
    let said = |cron: &str, reason: &str| {
        let c = wait_for(&format!("{cron} to say {reason}"), 60, || {
            get(&s.dir, &format!("dataimportcron/{cron}"))
                .filter(|c| condition(c, "UpToDate")["reason"] == reason)
        });
        let up = condition(&c, "UpToDate");
        assert_eq!(up["status"], "False", "{c}");
        let message = up["message"].as_str().unwrap_or("").to_string();
        wait_for(&format!("{cron}'s {reason} event"), 30, || {
            events_of(&s.dir, cron)
                .into_iter()
                .find(|(r, m)| r == reason && *m == message)
        });
        message
    };
    let taken = said("second-cron", "ErrDataSourceAlreadyManaged");
    assert!(
        taken.starts_with("DataSource shared is already managed by DataImportCron first-cron"),
        "{taken}"
    );
    let unlabelled = said("users-cron", "ErrDataSourceNotManaged");
    assert!(
        unlabelled.contains(&format!("DataSource users has no {label} label"))
            && unlabelled.contains(&format!("{label}=users-cron")),
        "{unlabelled}"
    );
    // Neither DataSource changed hands.
    let shared = get(&s.dir, "datasource/shared").unwrap();
    assert_eq!(
        shared["metadata"]["labels"][label], "first-cron",
        "{shared}"
    );
    let theirs = get(&s.dir, "datasource/users").unwrap();
    assert!(theirs["metadata"]["labels"][label].is_null(), "{theirs}");
    assert_eq!(theirs["spec"]["source"]["pvc"]["name"], "golden-disk");

    // The label the message asks for hands it over; the label wakes the cron (sooner than the
    // minute a cron in conflict looks again in).
    kubectl(
        &s.dir,
        &["label", "datasource/users", &format!("{label}=users-cron")],
        None,
    );
    wait_for("the cron to take the DataSource it is given", 45, || {
        get(&s.dir, "datasource/users")
            .filter(|d| d["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "cdi-controller")
            .and_then(|_| get(&s.dir, "dataimportcron/users-cron"))
            .filter(|c| condition(c, "UpToDate")["reason"] != "ErrDataSourceNotManaged")
    });
}

/// List `host` in CDIConfig's `insecureRegistries` (a registry without TLS on 127.0.0.1).
fn insecure_registry(dir: &Path, host: &str) {
    kubectl(
        dir,
        &[
            "patch",
            "cdiconfig",
            "config",
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"insecureRegistries":["{host}"]}}}}"#),
        ],
        None,
    );
}

/// `source.registry` against real registries on 127.0.0.1 (Debian's docker-registry): one with
/// TLS and basic authentication, reached with the DataVolume's Secret and certConfigMap, on the
/// classic and the populator path, its image's `*_KUBEVIRT_IO_*` environment as claim labels;
/// one in plain HTTP, reached because CDIConfig lists it in `insecureRegistries`; the image as
/// an oci-archive on a web server. A tag that is not there is ImagePullFailed; `pullMethod:
/// node` is refused saying why.
#[tokio::test(flavor = "multi_thread")]
async fn registry_sources_import_containerdisks() {
    use cdi_testkit::oci::{Image, Layer, Layout};
    use cdi_testkit::registry::{Options, Registry};
    let s = setup(false);
    let _down = Down(&s.dir);
    let dir = s._tmp.path();
    let raw = dir.join("src.raw");
    std::fs::write(&raw, pattern(8 * MIB)).unwrap();
    convert(&raw, "qcow2", &[], &dir.join("src.qcow2"));
    let expected = oracle(&dir.join("src.qcow2"), "qcow2");
    let mut layout = Layout::new(&dir.join("layout"));
    let mut image = Image::new(vec![Layer::disk(
        "fedora.qcow2",
        std::fs::read(dir.join("src.qcow2")).unwrap(),
    )]);
    image.env = vec!["INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE=fedora".into()];
    let d = layout.add_image(&image);
    layout.tag("41", &d);
    let (private, plain) = tokio::task::spawn_blocking(|| {
        let private = Registry::start(Options {
            tls: true,
            auth: Some(("cdi".into(), "registry-pass".into())),
        });
        (private, Registry::start(Options::default()))
    })
    .await
    .unwrap();
    private.push(&layout.dir, "41", "containerdisks/fedora:41");
    plain.push(&layout.dir, "41", "containerdisks/fedora:41");
    insecure_registry(&s.dir, &plain.host);
    // The same image as an oci-archive on a web server.
    let files = FileServer::start(None).await;
    files.add(
        "/fedora.tar",
        layout.archive(),
        Behaviour {
            ranges: true,
            ..Default::default()
        },
    );
    let ca = private.ca.as_ref().unwrap().ca_pem.replace('\n', "\n    ");
    let private_url = private.url("containerdisks/fedora:41");
    let source = |url: &str| {
        format!(
            r#"{{registry: {{url: "{url}", secretRef: registry-creds, certConfigMap: registry-ca}}}}"#
        )
    };
    let docs = [
        "apiVersion: v1\nkind: Secret\nmetadata: {name: registry-creds}\nstringData: {accessKeyId: cdi, secretKey: registry-pass}\n".to_string(),
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: registry-ca}}\ndata:\n  ca.pem: |\n    {ca}\n"),
        data_volume_from("fedora", &source(&private_url)),
        format!(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {{name: populated}}\nspec:\n  source: {}\n  storage: {{storageClassName: csi, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}\n",
            source(&private_url)
        ),
        consumer("vm-pod", "populated"),
        data_volume_from(
            "insecure",
            &format!(r#"{{registry: {{url: "{}"}}}}"#, plain.url("containerdisks/fedora:41")),
        ),
        data_volume_from(
            "archive",
            &format!(
                r#"{{registry: {{url: "oci-archive:{}"}}}}"#,
                files.url("/fedora.tar")
            ),
        ),
        data_volume_from("no-tag", &source(&private.url("containerdisks/fedora:40"))),
        data_volume_from(
            "by-node",
            &format!(r#"{{registry: {{url: "{private_url}", pullMethod: node}}}}"#),
        ),
    ]
    .join("---\n");
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&docs));
    for name in ["fedora", "populated", "insecure", "archive"] {
        wait_for(
            &format!("the registry import {name} to succeed"),
            120,
            || get(&s.dir, &format!("dv/{name}")).filter(|d| phase(d) == "Succeeded"),
        );
        let disk = std::fs::read(devcluster::volume_file(&s.dir, "default", name)).unwrap();
        assert_same(&disk[..expected.len()], &expected, name);
        let claim = get(&s.dir, &format!("pvc/{name}")).unwrap();
        assert_eq!(
            claim["metadata"]["labels"]["instancetype.kubevirt.io/default-preference"], "fedora",
            "{name}: {claim}"
        );
    }
    let claim = get(&s.dir, "pvc/fedora").unwrap();
    assert_eq!(
        claim["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.source"],
        "registry"
    );
    let claim = get(&s.dir, "pvc/populated").unwrap();
    assert_eq!(claim["spec"]["dataSourceRef"]["kind"], "VolumeImportSource");
    let dv = wait_for("the missing tag, said", 90, || {
        get(&s.dir, "dv/no-tag").filter(|d| condition(d, "Running")["reason"] == "ImagePullFailed")
    });
    let said = condition(&dv, "Running")["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        said.contains("failed to pull image") && said.contains("fedora:40"),
        "{said}"
    );
    assert_ne!(phase(&dv), "Succeeded");
    assert!(!dv.to_string().contains("registry-pass"));
    wait_for("pullMethod node refused", 60, || {
        events_of(&s.dir, "by-node")
            .into_iter()
            .find(|(reason, message)| {
                reason == "ErrUnsupportedSource" && message.contains("pullMethod node")
            })
    });
}

/// A DataImportCron against a real registry: the first poll imports the image into
/// `<dataSource>-<digest>` and the managed DataSource names it; a VM disk clones it through the
/// DataSource. A new image pushed under the same tag is imported at the next poll, the
/// DataSource moves to it, the import beyond `importsToKeep` goes, and the VM disk made before
/// keeps its data while a new one clones the new image. A registry that cannot be reached is
/// `UpToDate=False` with the reason, tried again at the next scheduled time, and counted by
/// `kubevirt_cdi_dataimportcron_outdated` until the cron is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn data_import_crons_keep_a_data_source_fresh() {
    use cdi_testkit::oci::{Image, Layer, Layout};
    use cdi_testkit::registry::Registry;
    let s = setup(false);
    let _down = Down(&s.dir);
    let dir = s._tmp.path();
    let image = |name: &str, seed: u64| {
        let raw = dir.join(format!("{name}.raw"));
        let mut data = pattern(6 * MIB);
        data[..8].copy_from_slice(&seed.to_le_bytes());
        std::fs::write(&raw, data).unwrap();
        let qcow2 = dir.join(format!("{name}.qcow2"));
        convert(&raw, "qcow2", &[], &qcow2);
        (std::fs::read(&qcow2).unwrap(), oracle(&qcow2, "qcow2"))
    };
    let (first, first_disk) = image("first", 1);
    let (second, second_disk) = image("second", 2);
    let mut layout = Layout::new(&dir.join("layout"));
    let d = layout.add_image(&Image::new(vec![Layer::disk("disk.qcow2", first)]));
    layout.tag("first", &d);
    let d = layout.add_image(&Image::new(vec![Layer::disk("disk.qcow2", second)]));
    layout.tag("second", &d);
    let registry = tokio::task::spawn_blocking(|| Registry::start(Default::default()))
        .await
        .unwrap();
    registry.push(&layout.dir, "first", "containerdisks/fedora:latest");
    insecure_registry(&s.dir, &registry.host);
    let cron = |name: &str, ds: &str, url: &str| {
        format!(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataImportCron\nmetadata: {{name: {name}, labels: {{instancetype.kubevirt.io/default-preference: fedora}}}}\nspec:\n  schedule: \"0 0 1 1 *\"\n  managedDataSource: {ds}\n  importsToKeep: 1\n  template:\n    spec:\n      source: {{registry: {{url: \"{url}\"}}}}\n      storage: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}\n"
        )
    };
    let docs = [
        cron(
            "fedora-cron",
            "fedora",
            &registry.url("containerdisks/fedora:latest"),
        ),
        cron(
            "broken",
            "unreachable",
            "docker://127.0.0.1:1/containerdisks/none:1",
        ),
    ]
    .join("---\n");
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&docs));

    // The DataSource names the import, once it succeeded.
    let source_of = |ds: &Value| {
        ds["spec"]["source"]["pvc"]["name"]
            .as_str()
            .map(str::to_string)
    };
    let ready = |want: Option<&str>| {
        let ds = wait_for("the DataSource to name a ready import", 120, || {
            get(&s.dir, "datasource/fedora").filter(|d| {
                source_of(d).is_some_and(|n| want.is_none_or(|w| n != w))
                    && condition(d, "Ready")["status"] == "True"
            })
        });
        source_of(&ds).unwrap()
    };
    let first_import = ready(None);
    assert!(first_import.starts_with("fedora-") && first_import.len() == "fedora-".len() + 12);
    let cron_now = get(&s.dir, "dataimportcron/fedora-cron").unwrap();
    assert_eq!(
        condition(&cron_now, "UpToDate")["status"],
        "True",
        "{cron_now}"
    );
    assert_eq!(
        cron_now["status"]["lastImportedPVC"]["name"],
        first_import.as_str()
    );
    let dv = get(&s.dir, &format!("dv/{first_import}")).unwrap();
    let url = dv["spec"]["source"]["registry"]["url"].as_str().unwrap();
    assert!(
        url.contains("/containerdisks/fedora@sha256:"),
        "pinned by digest: {url}"
    );
    assert_eq!(
        dv["metadata"]["labels"]["cdi.kubevirt.io/dataImportCron"],
        "fedora-cron"
    );
    let disk = std::fs::read(devcluster::volume_file(&s.dir, "default", &first_import)).unwrap();
    assert_same(&disk[..first_disk.len()], &first_disk, "the first import");

    // A VM disk from the DataSource.
    let vm_disk = |name: &str| {
        format!(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {{name: {name}}}\nspec:\n  sourceRef: {{kind: DataSource, name: fedora}}\n  storage: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}\n"
        )
    };
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&vm_disk("vm-1")));
    wait_for("the first VM disk", 120, || {
        get(&s.dir, "dv/vm-1").filter(|d| phase(d) == "Succeeded")
    });

    // A new image under the same tag, seen at the next poll (made due now).
    registry.push(&layout.dir, "second", "containerdisks/fedora:latest");
    kubectl(
        &s.dir,
        &[
            "annotate",
            "--overwrite",
            "dataimportcron/fedora-cron",
            "cdi.kubevirt.io/storage.import.nextCronTime=2000-01-01T00:00:00Z",
        ],
        None,
    );
    let second_import = ready(Some(&first_import));
    let disk = std::fs::read(devcluster::volume_file(&s.dir, "default", &second_import)).unwrap();
    assert_same(
        &disk[..second_disk.len()],
        &second_disk,
        "the second import",
    );
    wait_for("the first import to go", 60, || {
        get(&s.dir, &format!("pvc/{first_import}"))
            .is_none()
            .then_some(())
    });
    let vm1 = std::fs::read(devcluster::volume_file(&s.dir, "default", "vm-1")).unwrap();
    assert_same(
        &vm1[..first_disk.len()],
        &first_disk,
        "the first VM disk, kept",
    );
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&vm_disk("vm-2")));
    wait_for("the second VM disk", 120, || {
        get(&s.dir, "dv/vm-2").filter(|d| phase(d) == "Succeeded")
    });
    let vm2 = std::fs::read(devcluster::volume_file(&s.dir, "default", "vm-2")).unwrap();
    assert_same(
        &vm2[..second_disk.len()],
        &second_disk,
        "the second VM disk",
    );

    // An unreachable registry: said, and tried again when the schedule next says.
    let broken = wait_for("the unreachable registry said", 60, || {
        get(&s.dir, "dataimportcron/broken")
            .filter(|c| condition(c, "UpToDate")["reason"] == "PollFailed")
    });
    let up = condition(&broken, "UpToDate");
    assert_eq!(up["status"], "False");
    let said = up["message"].as_str().unwrap_or("");
    assert!(
        said.contains("Failed to get image digest") && said.contains("127.0.0.1:1"),
        "{said}"
    );
    let next = broken["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.nextCronTime"]
        .as_str()
        .unwrap_or("");
    assert!(
        next.ends_with("-01-01T00:00:00Z"),
        "the next scheduled time: {next}"
    );
    assert!(get(&s.dir, "dv/unreachable").is_none());
    let page = http_get(&metrics_addr(&s), "/metrics");
    assert!(
        page.contains(r#"kubevirt_cdi_dataimportcron_outdated{namespace="default",cron_name="broken",pending="false"} 1"#),
        "{page}"
    );
    assert!(
        page.contains(r#"kubevirt_cdi_dataimportcron_outdated{namespace="default",cron_name="fedora-cron",pending="false"} 0"#),
        "{page}"
    );
    // A deleted cron's series goes with it.
    kubectl(&s.dir, &["delete", "dataimportcron/broken"], None);
    wait_for("the deleted cron's series to go", 30, || {
        (!http_get(&metrics_addr(&s), "/metrics").contains(r#"cron_name="broken""#)).then_some(())
    });
}

/// Where the class's StorageProfile says `dataImportCronSourceFormat: snapshot`, a cron keeps
/// each import as a VolumeSnapshot of the imported claim: the DataSource names the snapshot,
/// the claim goes once the snapshot is ready, and VM disks restore from it. With
/// `retentionPolicy: None` the DataSource and snapshot go with the cron.
#[tokio::test(flavor = "multi_thread")]
async fn data_import_crons_keep_snapshots_where_the_profile_says_so() {
    use cdi_testkit::oci::{Image, Layer, Layout};
    use cdi_testkit::registry::Registry;
    let s = setup(false);
    let _down = Down(&s.dir);
    let dir = s._tmp.path();
    let raw = dir.join("src.raw");
    std::fs::write(&raw, pattern(6 * MIB)).unwrap();
    convert(&raw, "qcow2", &[], &dir.join("src.qcow2"));
    let expected = oracle(&dir.join("src.qcow2"), "qcow2");
    let mut layout = Layout::new(&dir.join("layout"));
    let d = layout.add_image(&Image::new(vec![Layer::disk(
        "disk.qcow2",
        std::fs::read(dir.join("src.qcow2")).unwrap(),
    )]));
    layout.tag("v1", &d);
    let registry = tokio::task::spawn_blocking(|| Registry::start(Default::default()))
        .await
        .unwrap();
    registry.push(&layout.dir, "v1", "containerdisks/golden:v1");
    insecure_registry(&s.dir, &registry.host);
    kubectl(
        &s.dir,
        &[
            "patch",
            "storageprofile",
            "csi",
            "--type=merge",
            "-p",
            r#"{"spec":{"dataImportCronSourceFormat":"snapshot"}}"#,
        ],
        None,
    );
    wait_for("the profile to say snapshot", 30, || {
        get(&s.dir, "storageprofile/csi")
            .filter(|p| p["status"]["dataImportCronSourceFormat"] == "snapshot")
    });
    let cron = format!(
        "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataImportCron\nmetadata: {{name: golden-cron}}\nspec:\n  schedule: \"0 0 1 1 *\"\n  managedDataSource: golden\n  retentionPolicy: None\n  template:\n    spec:\n      source: {{registry: {{url: \"{}\"}}}}\n      storage: {{storageClassName: csi, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}\n",
        registry.url("containerdisks/golden:v1")
    );
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&cron));
    let ds = wait_for("the DataSource to name a ready snapshot", 120, || {
        get(&s.dir, "datasource/golden").filter(|d| {
            d["spec"]["source"]["snapshot"]["name"].is_string()
                && condition(d, "Ready")["status"] == "True"
        })
    });
    let import = ds["spec"]["source"]["snapshot"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let snapshot = get(&s.dir, &format!("volumesnapshot/{import}")).unwrap();
    assert_eq!(
        snapshot["metadata"]["labels"]["cdi.kubevirt.io/dataImportCron"],
        "golden-cron"
    );
    assert_eq!(
        snapshot["spec"]["source"]["persistentVolumeClaimName"],
        import.as_str()
    );
    wait_for("the imported claim to go", 60, || {
        get(&s.dir, &format!("pvc/{import}"))
            .is_none()
            .then_some(())
    });
    let cron_now = wait_for("the cron up to date", 60, || {
        get(&s.dir, "dataimportcron/golden-cron")
            .filter(|c| condition(c, "UpToDate")["status"] == "True")
    });
    assert_eq!(cron_now["status"]["sourceFormat"], "snapshot");
    let vm = "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {name: vm-disk}\nspec:\n  sourceRef: {kind: DataSource, name: golden}\n  storage: {storageClassName: csi, accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n";
    kubectl(&s.dir, &["apply", "-f", "-"], Some(vm));
    wait_for("the VM disk from the snapshot", 120, || {
        get(&s.dir, "dv/vm-disk").filter(|d| phase(d) == "Succeeded")
    });
    let disk = std::fs::read(devcluster::volume_file(&s.dir, "default", "vm-disk")).unwrap();
    assert_same(&disk[..expected.len()], &expected, "the VM disk");

    // retentionPolicy None: what the cron made goes with it; the VM disk stays.
    kubectl(&s.dir, &["delete", "dataimportcron/golden-cron"], None);
    wait_for("the cron's DataSource and snapshot to go", 60, || {
        (get(&s.dir, "datasource/golden").is_none()
            && get(&s.dir, &format!("volumesnapshot/{import}")).is_none())
        .then_some(())
    });
    assert_eq!(phase(&get(&s.dir, "dv/vm-disk").unwrap()), "Succeeded");
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_say_why_and_fatal_ones_stop() {
    let s = setup(false);
    let _down = Down(&s.dir);
    let (server, _) = serve_image(s._tmp.path(), 64 * MIB, false).await;
    let good = server.url("/disk.qcow2");
    let missing = server.url("/missing.qcow2");
    let checksum = data_volume_from(
        "bad-sum",
        &format!(
            r#"{{http: {{url: "{good}", checksum: "sha256:{}"}}}}"#,
            "0".repeat(64)
        ),
    );
    // A qcow2 that reads its data from a file on the node: refused, never followed.
    let hostile = s._tmp.path().join("backing.qcow2");
    qemu_img(&[
        "create",
        "-f",
        "qcow2",
        "-b",
        "/etc/hostname",
        "-F",
        "raw",
        hostile.to_str().unwrap(),
        "64M",
    ]);
    server.add(
        "/backing.qcow2",
        std::fs::read(&hostile).unwrap(),
        Behaviour {
            ranges: true,
            ..Default::default()
        },
    );
    let docs = [
        data_volume("not-there", &missing, "1Gi", ""),
        checksum,
        data_volume("too-small", &good, "16Mi", ""),
        data_volume("backing", &server.url("/backing.qcow2"), "1Gi", ""),
    ]
    .join("---");
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&docs));

    // 404: Running=False with the importer's message; the pod is restarted, and counted.
    // (Between restarts: once restarted, the container runs again for a moment.)
    let dv = wait_for("a restart of the 404 import, said", 60, || {
        get(&s.dir, "dv/not-there").filter(|d| {
            let running = condition(d, "Running");
            d["status"]["restartCount"].as_i64().unwrap_or(0) >= 1
                && running["status"] == "False"
                && running["message"].as_str().unwrap_or("").contains("404")
        })
    });
    assert_ne!(phase(&dv), "Failed");
    let d = doctor(&s.dir, &["not-there"]);
    assert_eq!(d["cause"], "CrashLoop", "{d}");
    assert!(
        d["summary"].as_str().unwrap().contains("404"),
        "the last error: {d}"
    );

    // Checksum mismatch: Failed, the pod gone and not recreated.
    let dv = wait_for("the checksum failure", 60, || {
        get(&s.dir, "dv/bad-sum").filter(|d| phase(d) == "Failed")
    });
    assert_eq!(condition(&dv, "Running")["reason"], "ChecksumError");
    wait_for("the failed importer to go", 30, || {
        get(&s.dir, "pod/importer-bad-sum").is_none().then_some(())
    });
    another_pass(&s, "import", "pvc/bad-sum");
    assert!(
        get(&s.dir, "pod/importer-bad-sum").is_none(),
        "a fatal import was retried"
    );
    let claim = get(&s.dir, "pvc/bad-sum").unwrap();
    assert_eq!(
        claim["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.fatalError"],
        "true"
    );

    // Images no retry can make fit or safe fail at once, with the importer's reason, and the
    // pod is not restarted.
    for (name, reason, says) in [
        (
            "too-small",
            "ImageTooLarge",
            "DataVolume too small to contain image: ",
        ),
        ("backing", "ImageRefused", "backing file"),
    ] {
        let dv = wait_for(&format!("the {name} failure"), 60, || {
            get(&s.dir, &format!("dv/{name}")).filter(|d| phase(d) == "Failed")
        });
        let running = condition(&dv, "Running");
        assert_eq!(running["reason"], reason, "{name}: {running}");
        assert!(
            running["message"].as_str().unwrap_or("").contains(says),
            "{name}: {running}"
        );
        assert_eq!(
            dv["status"]["restartCount"].as_i64().unwrap_or(0),
            0,
            "{name}"
        );
    }
    // Without a name, `cdi doctor` lists each DataVolume with its cause.
    let listed = doctor(&s.dir, &[]);
    let causes: Vec<(&str, &str)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["name"].as_str().unwrap(), d["cause"].as_str().unwrap()))
        .collect();
    assert_eq!(
        causes,
        [
            ("backing", "Failed"),
            ("bad-sum", "Failed"),
            ("not-there", "CrashLoop"),
            ("too-small", "Failed")
        ]
    );
    let d = &listed[1];
    assert!(
        d["summary"]
            .as_str()
            .unwrap()
            .starts_with("failed for good: "),
        "{d}"
    );
    // For people: one line each.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cdi"))
        .args(["doctor", "-n", "default"])
        .env("KUBECONFIG", s.dir.join("kubeconfig"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.lines().count(), 4, "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("default/not-there  ") && l.contains("CrashLoop: ")),
        "{text}"
    );
    drop(s.controller);
}

/// A VMDK from a server without range support has to be copied to scratch space (qemu-img
/// converts it from a file): the first importer asks for it, the next one gets a
/// `<claim>-scratch` claim (owned by the pod, so it goes with it) and imports.
#[tokio::test(flavor = "multi_thread")]
async fn an_image_that_needs_scratch_gets_a_scratch_claim() {
    let s = setup(false);
    let _down = Down(&s.dir);
    let (server, expected) = serve_image(s._tmp.path(), 4 * MIB, false).await;
    let vmdk = s._tmp.path().join("src.vmdk");
    convert(&s._tmp.path().join("src.raw"), "vmdk", &[], &vmdk);
    // Served without range support: it can only be read in order.
    server.add(
        "/no-ranges.vmdk",
        std::fs::read(&vmdk).unwrap(),
        Behaviour::default(),
    );
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&data_volume(
            "spooled",
            &server.url("/no-ranges.vmdk"),
            "1Gi",
            "",
        )),
    );
    wait_for("the scratch claim", 60, || {
        get(&s.dir, "pvc/spooled-scratch")
            .filter(|c| c["metadata"]["ownerReferences"][0]["kind"] == "Pod")
    });
    wait_for("the import through scratch", 120, || {
        get(&s.dir, "dv/spooled").filter(|d| phase(d) == "Succeeded")
    });
    let claim = get(&s.dir, "pvc/spooled").unwrap();
    assert_eq!(
        claim["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.requiresScratch"],
        "true"
    );
    let pv = volume_of(&s.dir, &claim);
    let disk =
        std::fs::read(Path::new(pv["spec"]["hostPath"]["path"].as_str().unwrap()).join("disk.img"))
            .unwrap();
    assert_same(&disk[..expected.len()], &expected, "through scratch");
    wait_for("the scratch claim to go with the pod", 60, || {
        get(&s.dir, "pvc/spooled-scratch").is_none().then_some(())
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn a_controller_killed_mid_import_converges_after_restart() {
    let mut s = setup(true);
    let _down = Down(&s.dir);
    let (server, expected) = serve_image(s._tmp.path(), 8 * MIB, true).await;
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&data_volume(
            "survivor",
            &server.url("/disk.qcow2"),
            "1Gi",
            "",
        )),
    );
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&consumer("user", "survivor")),
    );
    wait_for("the import to run", 60, || {
        get(&s.dir, "pod/importer-survivor").filter(|p| p["status"]["phase"] == "Running")
    });
    s.controller.kill();
    // A new instance takes over once the dead one's lease expires.
    let _second = Controller::start(&s.dir, &s._tmp.path().join("controller-2.log"));
    wait_for("the import to succeed after the restart", 90, || {
        get(&s.dir, "dv/survivor").filter(|d| phase(d) == "Succeeded")
    });
    wait_for("no importer pod left", 30, || {
        get(&s.dir, "pod/importer-survivor").is_none().then_some(())
    });
    let names = claim_names(&s.dir);
    assert_eq!(names, ["survivor"], "no extra claims");
    let claim = get(&s.dir, "pvc/survivor").unwrap();
    let pv = volume_of(&s.dir, &claim);
    let disk =
        std::fs::read(Path::new(pv["spec"]["hostPath"]["path"].as_str().unwrap()).join("disk.img"))
            .unwrap();
    assert_same(
        &disk[..expected.len()],
        &expected,
        "the image after the restart",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_seeds_virtual_machine_runs_on_node_2() {
    let s = setup(true);
    let _down = Down(&s.dir);
    let (server, _) = serve_image(s._tmp.path(), 2 * MIB, false).await;
    let vm = format!(
        r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {{name: vm-with-wffc-disk}}
spec:
  running: true
  dataVolumeTemplates:
  - metadata: {{name: vm-with-wffc-disk-root}}
    spec:
      source: {{http: {{url: "{url}"}}}}
      pvc:
        storageClassName: local-path-wffc
        accessModes: [ReadWriteOnce]
        resources: {{requests: {{storage: 1Gi}}}}
  - metadata: {{name: vm-with-wffc-disk-data}}
    spec:
      source: {{blank: {{}}}}
      pvc:
        storageClassName: local-path-wffc
        accessModes: [ReadWriteOnce]
        resources: {{requests: {{storage: 64Mi}}}}
  template:
    spec:
      nodeSelector: {{node-role.kubernetes.io/virt-local: "true"}}
      tolerations:
      - {{key: virt-local, operator: Equal, value: "true", effect: NoSchedule}}
      - {{key: gpu, operator: Exists, effect: NoSchedule}}
      domain:
        resources: {{requests: {{memory: 2Gi}}}}
        devices: {{disks: [{{name: root, disk: {{bus: virtio}}}}, {{name: data, disk: {{bus: virtio}}}}]}}
      volumes:
      - {{name: root, dataVolume: {{name: vm-with-wffc-disk-root}}}}
      - {{name: data, dataVolume: {{name: vm-with-wffc-disk-data}}}}
"#,
        url = server.url("/disk.qcow2")
    );
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&vm));
    let vmi = wait_for("the VMI to run", 90, || {
        get(&s.dir, "vmi/vm-with-wffc-disk").filter(|v| v["status"]["phase"] == "Running")
    });
    assert_eq!(vmi["status"]["nodeName"], "node-2");
    let vm = wait_for("the VM to say Running", 30, || {
        get(&s.dir, "vm/vm-with-wffc-disk").filter(|v| v["status"]["printableStatus"] == "Running")
    });
    assert_eq!(vm["status"]["ready"], true);
    let dv = get(&s.dir, "dv/vm-with-wffc-disk-root").unwrap();
    assert_eq!(phase(&dv), "Succeeded");
    // Both disks' workers followed KubeVirt's temporary pod onto node-2, tolerating its taint
    // and not the gpu taint the VM tolerates elsewhere.
    for disk in ["vm-with-wffc-disk-root", "vm-with-wffc-disk-data"] {
        assert_eq!(
            phase(&get(&s.dir, &format!("dv/{disk}")).unwrap()),
            "Succeeded"
        );
        let claim = get(&s.dir, &format!("pvc/{disk}")).unwrap();
        let record: Value = serde_json::from_str(
            claim["metadata"]["annotations"]["cdi-rs.dev/worker-tolerations"]
                .as_str()
                .expect("the record"),
        )
        .unwrap();
        assert_eq!(record["node"], "node-2", "{disk}");
        let keys: Vec<&str> = record["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["key"].as_str())
            .collect();
        assert_eq!(keys, ["virt-local"], "{disk}");
        assert!(
            record["consumer"]
                .as_str()
                .is_some_and(|c| c.starts_with("virt-launcher-vm-with-wffc-disk-")),
            "{disk}: {record}"
        );
    }
    assert_eq!(
        dv["metadata"]["ownerReferences"][0]["kind"],
        "VirtualMachine"
    );
    // The temporary pod is gone; the launcher found its disk.
    let pods = get(&s.dir, "pods").unwrap();
    let names: Vec<&str> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    let events = kubectl(&s.dir, &["get", "events"], None);
    assert!(
        events.contains("Deleted WaitForFirstConsumer temporary pod"),
        "{events}"
    );
    let launcher = &pods["items"][0];
    assert_eq!(launcher["spec"]["nodeName"], "node-2");
    // What the launcher printed, as a user reads it.
    let log = kubectl(
        &s.dir,
        &["logs", launcher["metadata"]["name"].as_str().unwrap()],
        None,
    );
    let usable = cdi_core::size::usable_space(1 << 30, "0.06".parse().unwrap());
    assert!(
        log.contains(&format!("raw, virtual size {usable} bytes")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_existing_claim_is_adopted_when_allowed() {
    let s = setup(true);
    let _down = Down(&s.dir);
    // A claim someone filled already, bound through a consumer.
    let claim = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: golden}
spec:
  storageClassName: local-path-wffc
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
"#;
    kubectl(&s.dir, &["apply", "-f", "-"], Some(claim));
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&consumer("filler", "golden")),
    );
    wait_for("the claim to bind", 30, || {
        get(&s.dir, "pvc/golden").filter(|c| c["status"]["phase"] == "Bound")
    });
    // Not adopted unless allowed: the DataVolume waits, says why, and leaves the claim alone.
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&data_volume(
            "golden",
            "http://127.0.0.1:9/unused",
            "1Gi",
            "",
        )),
    );
    let dv = wait_for("the DataVolume to say the claim is not its own", 30, || {
        get(&s.dir, "dv/golden").filter(|d| {
            phase(d) == "Pending" && condition(d, "Ready")["reason"] == "ErrResourceExists"
        })
    });
    assert!(
        condition(&dv, "Bound")["message"]
            .as_str()
            .is_some_and(|m| m.contains("already exists and is not managed by DataVolume")),
        "{dv}"
    );
    assert!(
        get(&s.dir, "pvc/golden").unwrap()["metadata"]["ownerReferences"].is_null(),
        "the claim is left alone"
    );
    let adopt = r#"cdi.kubevirt.io/allowClaimAdoption: "true""#;
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&data_volume(
            "golden",
            "http://127.0.0.1:9/unused",
            "1Gi",
            adopt,
        )),
    );
    let dv = wait_for("the adopted DataVolume to succeed", 30, || {
        get(&s.dir, "dv/golden").filter(|d| phase(d) == "Succeeded")
    });
    assert_eq!(dv["status"]["progress"], "100.0%");
    let claim = get(&s.dir, "pvc/golden").unwrap();
    assert_eq!(
        claim["metadata"]["ownerReferences"][0]["kind"],
        "DataVolume"
    );
    assert_eq!(
        claim["metadata"]["annotations"]["cdi.kubevirt.io/storage.populatedFor"],
        "golden"
    );
    another_pass(&s, "import", "pvc/golden");
    assert!(
        get(&s.dir, "pod/importer-golden").is_none(),
        "an adopted claim is not imported into"
    );
}

fn csi_data_volume(name: &str, url: &str, annotations: &str) -> String {
    format!(
        r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: {name}
  annotations: {{{annotations}}}
spec:
  source: {{http: {{url: "{url}"}}}}
  storage:
    storageClassName: csi
    accessModes: [ReadWriteOnce]
    volumeMode: Filesystem
    resources: {{requests: {{storage: 1Gi}}}}
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_populator_fills_prime_and_hands_its_volume_to_the_target() {
    let s = setup(true);
    let _down = Down(&s.dir);
    let (server, expected) = serve_image(s._tmp.path(), 4 * MIB, true).await;
    let url = server.url("/disk.qcow2");
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&csi_data_volume("pop", &url, "")),
    );
    let dv = wait_for("PendingPopulation", 30, || {
        get(&s.dir, "dv/pop").filter(|d| phase(d) == "PendingPopulation")
    });
    assert_eq!(
        dv["metadata"]["annotations"]["cdi.kubevirt.io/storage.usePopulator"],
        "true"
    );
    let target = get(&s.dir, "pvc/pop").unwrap();
    assert_eq!(
        target["spec"]["dataSourceRef"]["kind"],
        "VolumeImportSource"
    );
    let uid = target["metadata"]["uid"].as_str().unwrap().to_string();
    let prime_name = format!("prime-{uid}");
    another_pass(&s, "populator", "pvc/pop");
    assert!(
        get(&s.dir, &format!("pvc/{prime_name}")).is_none(),
        "PVC prime before a consumer"
    );

    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&consumer("vm-pod", "pop")),
    );
    let mut saw_prime = false;
    let dv = wait_for("the populated DataVolume", 90, || {
        let dv = get(&s.dir, "dv/pop")?;
        let target = get(&s.dir, "pvc/pop")?;
        if let Some(prime) = get(&s.dir, &format!("pvc/{prime_name}")) {
            saw_prime = true;
            assert_eq!(
                prime["metadata"]["annotations"]["volume.kubernetes.io/selected-node"], "node-2",
                "PVC prime goes where the consumer was scheduled"
            );
            // And its importer tolerates what the consumer tolerated there.
            let record = prime["metadata"]["annotations"]["cdi-rs.dev/worker-tolerations"]
                .as_str()
                .unwrap_or("");
            assert!(record.contains("\"virt-local\""), "{record}");
        }
        // The DataVolume says Succeeded a moment after the hand-over; the target's mirrored
        // pod phase, written before it, is what shows the order.
        if phase(&dv) != "Succeeded" && target["status"]["phase"] == "Bound" {
            assert_eq!(
                target["metadata"]["annotations"]["cdi.kubevirt.io/storage.pod.phase"], "Succeeded",
                "the target bound before the import succeeded"
            );
        }
        (phase(&dv) == "Succeeded").then_some(dv)
    });
    assert!(saw_prime);
    assert_eq!(dv["status"]["progress"], "100.0%");
    // The volume moved to the target; PVC prime is gone; the source CR too.
    let target = wait_for("the target to bind", 30, || {
        get(&s.dir, "pvc/pop").filter(|c| c["status"]["phase"] == "Bound")
    });
    let pv = volume_of(&s.dir, &target);
    assert_eq!(pv["spec"]["claimRef"]["name"], "pop");
    assert_eq!(pv["spec"]["claimRef"]["uid"].as_str(), Some(uid.as_str()));
    let path = pv["spec"]["csi"]["volumeAttributes"]["path"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(path.contains("/nodes/node-2/"), "{path}");
    let disk = std::fs::read(Path::new(&path).join("disk.img")).unwrap();
    assert_same(&disk[..expected.len()], &expected, "the populated image");
    wait_for("PVC prime to go", 30, || {
        get(&s.dir, &format!("pvc/{prime_name}"))
            .is_none()
            .then_some(())
    });
    wait_for("the VolumeImportSource to go", 30, || {
        let list = get(&s.dir, "volumeimportsources")?;
        list["items"].as_array()?.is_empty().then_some(())
    });
    let events = kubectl(&s.dir, &["get", "events"], None);
    assert!(events.contains(&format!("[{prime_name}] :")), "{events}");

    // usePopulator "false" takes the classic path on the same class.
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&csi_data_volume(
            "classic",
            &url,
            r#"cdi.kubevirt.io/storage.usePopulator: "false""#,
        )),
    );
    let dv = wait_for("WaitForFirstConsumer on the classic path", 30, || {
        get(&s.dir, "dv/classic").filter(|d| phase(d) == "WaitForFirstConsumer")
    });
    assert_eq!(
        dv["metadata"]["annotations"]["cdi.kubevirt.io/storage.usePopulator"],
        "false"
    );
    assert!(
        get(&s.dir, "pvc/classic").unwrap()["spec"]
            .get("dataSourceRef")
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn populator_failures_show_on_the_data_volume() {
    let mut s = setup(true);
    let _down = Down(&s.dir);
    let (server, _) = serve_image(s._tmp.path(), MIB, false).await;
    let missing = server.url("/missing.qcow2");
    let good = server.url("/disk.qcow2");
    let retain = r#"cdi.kubevirt.io/storage.pod.retainAfterCompletion: "true""#;
    let checksum = format!(
        r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {{name: pop-sum}}
spec:
  source: {{http: {{url: "{good}", checksum: "sha256:{}"}}}}
  storage:
    storageClassName: csi
    accessModes: [ReadWriteOnce]
    volumeMode: Filesystem
    resources: {{requests: {{storage: 1Gi}}}}
"#,
        "0".repeat(64)
    );
    let docs = [
        csi_data_volume("pop-404", &missing, ""),
        checksum,
        csi_data_volume("pop-kept", &good, retain),
    ]
    .join("---");
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&docs));
    for claim in ["pop-404", "pop-sum", "pop-kept"] {
        kubectl(
            &s.dir,
            &["apply", "-f", "-"],
            Some(&consumer(&format!("{claim}-user"), claim)),
        );
    }

    // A failing import on PVC prime: the DataVolume says why; the target has prime's events.
    let dv = wait_for("the prime failure on the DataVolume", 60, || {
        get(&s.dir, "dv/pop-404").filter(|d| {
            condition(d, "Running")["message"]
                .as_str()
                .is_some_and(|m| m.contains("404"))
        })
    });
    assert_ne!(phase(&dv), "Failed");
    let uid = get(&s.dir, "pvc/pop-404").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let events = wait_for("prime's events on the target", 30, || {
        let e = kubectl(
            &s.dir,
            &[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=pop-404",
            ],
            None,
        );
        // Prime's failure is copied on a later pass than its first events: wait for it.
        (e.contains(&format!("[prime-{uid}] :")) && e.contains("ErrImportFailed")).then_some(e)
    });
    assert!(events.contains("ErrImportFailed"), "{events}");
    // The DataVolume's Bound condition quotes PVC prime, as upstream's does.
    let dv = wait_for("prime's news in the Bound condition", 30, || {
        get(&s.dir, "dv/pop-404").filter(|d| {
            condition(d, "Bound")["message"].as_str().is_some_and(|m| {
                m.starts_with(&format!("target PVC pop-404 Pending and [prime-{uid}] : "))
            })
        })
    });
    assert_eq!(condition(&dv, "Bound")["status"], "False");

    // A fatal error on PVC prime fails the DataVolume.
    let dv = wait_for("the checksum failure", 60, || {
        get(&s.dir, "dv/pop-sum").filter(|d| phase(d) == "Failed")
    });
    assert_eq!(condition(&dv, "Running")["reason"], "ChecksumError");

    // retainAfterCompletion keeps PVC prime (Lost) and its pod.
    wait_for("the retained import to succeed", 60, || {
        get(&s.dir, "dv/pop-kept").filter(|d| phase(d) == "Succeeded")
    });
    let uid = get(&s.dir, "pvc/pop-kept").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let prime = wait_for("PVC prime Lost", 30, || {
        get(&s.dir, &format!("pvc/prime-{uid}")).filter(|p| p["status"]["phase"] == "Lost")
    });
    assert_eq!(
        prime["metadata"]["annotations"]["cdi.kubevirt.io/storage.pod.retainAfterCompletion"],
        "true"
    );
    another_pass(&s, "populator", "pvc/pop-kept");
    assert!(
        get(&s.dir, &format!("pvc/prime-{uid}")).is_some(),
        "a retained PVC prime was deleted"
    );
    let pod = get(&s.dir, &format!("pod/importer-prime-{uid}")).expect("the retained importer pod");
    assert_eq!(pod["status"]["phase"], "Succeeded");

    // A controller stopped between the rebind and PVC prime's deletion: the next one finishes.
    s.controller.kill();
    let retain_off = "cdi.kubevirt.io/storage.pod.retainAfterCompletion-";
    kubectl(
        &s.dir,
        &["annotate", "pvc", &format!("prime-{uid}"), retain_off],
        None,
    );
    let _next = Controller::start(&s.dir, &s._tmp.path().join("controller-2.log"));
    wait_for("PVC prime to go after the restart", 60, || {
        get(&s.dir, &format!("pvc/prime-{uid}"))
            .is_none()
            .then_some(())
    });
    assert_eq!(phase(&get(&s.dir, "dv/pop-kept").unwrap()), "Succeeded");
    assert_eq!(
        get(&s.dir, "pvc/pop-kept").unwrap()["status"]["phase"],
        "Bound"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_populator_converges_across_controller_restarts() {
    let mut s = setup(true);
    let _down = Down(&s.dir);
    let (server, expected) = serve_image(s._tmp.path(), 6 * MIB, true).await;
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&csi_data_volume("again", &server.url("/disk.qcow2"), "")),
    );
    wait_for("PendingPopulation", 30, || {
        get(&s.dir, "dv/again").filter(|d| phase(d) == "PendingPopulation")
    });
    // Killed before PVC prime exists.
    s.controller.kill();
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&consumer("again-user", "again")),
    );
    let mut second = Controller::start(&s.dir, &s._tmp.path().join("controller-2.log"));
    let uid = get(&s.dir, "pvc/again").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    // Killed while PVC prime's import runs.
    wait_for("the import on PVC prime", 90, || {
        get(&s.dir, &format!("pod/importer-prime-{uid}"))
            .filter(|p| p["status"]["phase"] == "Running")
    });
    second.kill();
    let _third = Controller::start(&s.dir, &s._tmp.path().join("controller-3.log"));
    wait_for("the DataVolume to succeed", 120, || {
        get(&s.dir, "dv/again").filter(|d| phase(d) == "Succeeded")
    });
    wait_for("PVC prime to go", 30, || {
        get(&s.dir, &format!("pvc/prime-{uid}"))
            .is_none()
            .then_some(())
    });
    wait_for("no importer pod left", 30, || {
        get(&s.dir, &format!("pod/importer-prime-{uid}"))
            .is_none()
            .then_some(())
    });
    let names = claim_names(&s.dir);
    assert_eq!(names, ["again"], "no claims left behind");
    let target = get(&s.dir, "pvc/again").unwrap();
    let pv = volume_of(&s.dir, &target);
    let path = pv["spec"]["csi"]["volumeAttributes"]["path"]
        .as_str()
        .unwrap()
        .to_string();
    let disk = std::fs::read(Path::new(&path).join("disk.img")).unwrap();
    assert_same(
        &disk[..expected.len()],
        &expected,
        "the image after two restarts",
    );
}

/// The events recorded on the object named `name`, as (reason, message) pairs.
fn events_of(dir: &Path, name: &str) -> Vec<(String, String)> {
    let list = get(dir, "events").unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["involvedObject"]["name"] == name)
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
            (s("reason"), s("message"))
        })
        .collect()
}

/// The process of a pod's first container, found by the `HOSTNAME` the kubelet gives it and
/// the cluster directory its root lies in.
/// What a hostile user can write into a spec, a status or a name, and what killing a worker
/// does: each ends in a message naming the problem, and the controller keeps running.
#[tokio::test(flavor = "multi_thread")]
async fn refusals_hostile_status_long_names_and_killed_importers_are_explained() {
    let mut s = setup(false);
    let _down = Down(&s.dir);
    let (server, expected) = serve_image(s._tmp.path(), 8 * MIB, true).await;
    let url = server.url("/disk.qcow2");
    // The import killed below stalls long past its first MiB (once), so it is still running
    // whenever the test gets there; resumed after the kill, it completes.
    server.add(
        "/stalling.qcow2",
        std::fs::read(s._tmp.path().join("src.qcow2")).unwrap(),
        Behaviour {
            ranges: true,
            stall_after: Some((MIB, Duration::from_secs(600))),
            ..Default::default()
        },
    );
    let stalling = server.url("/stalling.qcow2");
    let long = "l".repeat(250);
    let no_source = data_volume_from("no-source", "");
    let two_sources = data_volume_from(
        "two-sources",
        &format!(r#"{{http: {{url: "{url}"}}, blank: {{}}}}"#),
    );
    let bad_url = data_volume_from("bad-url", r#"{http: {url: "ftp://127.0.0.1/disk.qcow2"}}"#);
    // spec.storage on a class whose profile has no claimPropertySets: no claim until it has.
    let no_modes = format!(
        r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {{name: no-modes}}
spec:
  source: {{http: {{url: "{url}"}}}}
  storage:
    storageClassName: local-path
    resources: {{requests: {{storage: 64Mi}}}}
"#
    );
    // Filled by a populator cdi-rs knows nothing of, on the CSI-like class (a CSIDriver) and
    // on local-path (none).
    let external = |name: &str, class: &str| {
        format!(
            r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {{name: {name}}}
spec:
  storage:
    storageClassName: {class}
    accessModes: [ReadWriteOnce]
    resources: {{requests: {{storage: 64Mi}}}}
    dataSourceRef: {{apiGroup: example.com, kind: Blob, name: golden}}
"#
        )
    };
    let docs = [
        no_source,
        two_sources,
        bad_url,
        no_modes,
        data_volume_from(
            "later",
            r#"{imageio: {url: "https://engine/ovirt-engine/api", diskId: "d1"}}"#,
        ),
        external("external", "csi"),
        external("no-csi", "local-path-wffc"),
        data_volume(&long, &url, "1Gi", ""),
        data_volume("killed", &stalling, "1Gi", ""),
        data_volume_from("no-such-class", &format!(r#"{{http: {{url: "{url}"}}}}"#))
            .replace("local-path-wffc", "gone"),
    ]
    .join("---");
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&docs));

    // Specs upstream's webhook would refuse: Failed, with the reason on the conditions and an
    // event, and no claim made for them.
    for (name, says) in [
        (
            "no-source",
            "Data volume should have either Source or SourceRef",
        ),
        ("two-sources", "Multiple Data volume sources"),
        ("bad-url", "Invalid source URL scheme: ftp://"),
    ] {
        let dv = wait_for(&format!("{name} refused"), 30, || {
            get(&s.dir, &format!("dv/{name}")).filter(|d| phase(d) == "Failed")
        });
        let running = condition(&dv, "Running");
        assert_eq!(running["reason"], "ErrInvalidSource", "{running}");
        let message = running["message"].as_str().unwrap_or("");
        assert!(
            message.contains(says) && message.contains(name),
            "{message}"
        );
        // Recorded right after the status.
        wait_for(&format!("{name}'s event"), 30, || {
            events_of(&s.dir, name)
                .iter()
                .any(|(r, m)| r == "ErrInvalidSource" && m == message)
                .then_some(())
        });
        assert!(get(&s.dir, &format!("pvc/{name}")).is_none());
    }

    // A source a later version fills: Pending, saying so, and no claim.
    let dv = wait_for("the unsupported source said", 30, || {
        get(&s.dir, "dv/later").filter(|d| {
            phase(d) == "Pending" && condition(d, "Running")["reason"] == "ErrUnsupportedSource"
        })
    });
    assert!(
        condition(&dv, "Running")["message"]
            .as_str()
            .unwrap_or("")
            .contains("imageio")
    );
    assert!(get(&s.dir, "pvc/later").is_none());
    // External population waits for its populator; without a CSI driver, nothing will come.
    let dv = wait_for("the external population to wait", 30, || {
        get(&s.dir, "dv/external").filter(|d| phase(d) == "PendingPopulation")
    });
    let claim = get(&s.dir, "pvc/external").unwrap();
    assert_eq!(claim["spec"]["dataSourceRef"]["kind"], "Blob");
    assert_eq!(
        claim["metadata"]["annotations"]["cdi.kubevirt.io/externalPopulation"],
        "true"
    );
    assert!(
        get(&s.dir, "volumeimportsources")
            .is_some_and(|l| l["items"].as_array().is_some_and(|i| i.is_empty()))
    );
    assert_eq!(dv["status"]["progress"], "N/A");
    wait_for("the missing CSI driver said", 30, || {
        events_of(&s.dir, "no-csi")
            .iter()
            .any(|(r, _)| r == "NoCSIDriverForExternalPopulation")
            .then_some(())
    });
    assert_eq!(phase(&get(&s.dir, "dv/no-csi").unwrap()), "Pending");

    // A StorageProfile status with no conditions (anyone may write one): the controller puts
    // Recognized back and stays up.
    kubectl(
        &s.dir,
        &[
            "patch",
            "storageprofile",
            "local-path-wffc",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"conditions":[]}}"#,
        ],
        None,
    );
    wait_for("Recognized restored", 30, || {
        get(&s.dir, "storageprofile/local-path-wffc").filter(|p| {
            p["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Recognized"))
        })
    });
    assert!(s.controller.alive(), "the controller died");

    // SIGKILL to the importer: said so, then restarted and resumed.
    let killed = "the importer was killed by signal 9 (SIGKILL); it restarts and resumes";
    let pid = wait_for("the importer to run", 60, || {
        pod_process(&s.dir, "importer-killed")
    });
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    wait_for("the kill explained", 60, || {
        get(&s.dir, "dv/killed").filter(|d| condition(d, "Running")["message"] == killed)
    });
    wait_for("the kill's event on the claim", 30, || {
        events_of(&s.dir, "killed")
            .iter()
            .any(|(r, m)| r == "ErrImportFailed" && m == killed)
            .then_some(())
    });

    // A claim that cannot be rendered yet says why, and is made once the profile is fixed.
    let dv = wait_for("no-modes explained", 30, || {
        get(&s.dir, "dv/no-modes")
            .filter(|d| condition(d, "Running")["reason"] == "ErrClaimNotValid")
    });
    assert_eq!(phase(&dv), "Pending");
    let d = doctor(&s.dir, &["no-modes"]);
    assert_eq!(d["cause"], "ProfileWithoutClaimPropertySets", "{d}");
    assert!(
        d["explanation"]
            .as_str()
            .unwrap()
            .contains("kubectl patch storageprofile local-path"),
        "{d}"
    );
    kubectl(
        &s.dir,
        &[
            "patch",
            "storageprofile",
            "local-path",
            "--type=merge",
            "-p",
            r#"{"spec":{"claimPropertySets":[{"accessModes":["ReadWriteOnce"],"volumeMode":"Filesystem"}]}}"#,
        ],
        None,
    );
    wait_for("no-modes imported once its profile is fixed", 120, || {
        get(&s.dir, "dv/no-modes").filter(|d| phase(d) == "Succeeded")
    });

    // A proxy removed from CDIConfig's spec leaves its status too.
    let proxy = |p: &str| {
        kubectl(
            &s.dir,
            &["patch", "cdiconfig", "config", "--type=merge", "-p", p],
            None,
        )
    };
    proxy(r#"{"spec":{"importProxy":{"HTTPProxy":"http://127.0.0.1:9"}}}"#);
    wait_for("the proxy in status", 30, || {
        get(&s.dir, "cdiconfig/config").filter(|c| !c["status"]["importProxy"].is_null())
    });
    proxy(r#"{"spec":{"importProxy":null}}"#);
    wait_for("the proxy gone from status", 30, || {
        get(&s.dir, "cdiconfig/config").filter(|c| c["status"]["importProxy"].is_null())
    });

    // A 250-character name imports; its importer pod has upstream's shortened name.
    for name in [long.as_str(), "killed"] {
        wait_for(
            &format!("{} to succeed", &name[..name.len().min(10)]),
            120,
            || get(&s.dir, &format!("dv/{name}")).filter(|d| phase(d) == "Succeeded"),
        );
        let claim = get(&s.dir, &format!("pvc/{name}")).unwrap();
        let pod = claim["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.importPodName"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(pod.len() <= 253, "{pod}");
        let pv = volume_of(&s.dir, &claim);
        let disk = std::fs::read(
            Path::new(pv["spec"]["hostPath"]["path"].as_str().unwrap()).join("disk.img"),
        )
        .unwrap();
        assert_same(&disk[..expected.len()], &expected, name);
    }
    let claim = get(&s.dir, &format!("pvc/{long}")).unwrap();
    let pod = &claim["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.importPodName"];
    assert!(
        pod.as_str()
            .is_some_and(|p| p.len() == 17 && p.starts_with("importer-")),
        "{pod}"
    );

    // Worker pod settings the API server refuses: the DataVolume says so, and imports once they
    // are fixed.
    let resources = |r: &str| {
        kubectl(
            &s.dir,
            &[
                "patch",
                "cdiconfig",
                "config",
                "--type=merge",
                "-p",
                &format!(r#"{{"spec":{{"podResourceRequirements":{r}}}}}"#),
            ],
            None,
        )
    };
    resources(r#"{"requests":{"cpu":"2"},"limits":{"cpu":"100m"}}"#);
    wait_for("the refusing settings in status", 30, || {
        get(&s.dir, "cdiconfig/config")
            .filter(|c| c["status"]["defaultPodResourceRequirements"]["limits"]["cpu"] == "100m")
    });
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&data_volume("refused-pod", &url, "1Gi", "")),
    );
    let dv = wait_for("the refused pod explained", 60, || {
        get(&s.dir, "dv/refused-pod")
            .filter(|d| condition(d, "Running")["reason"] == "ErrCreatingPod")
    });
    let message = condition(&dv, "Running")["message"].to_string();
    assert!(
        message.contains("importer-refused-pod") && message.contains("cpu"),
        "{message}"
    );
    assert_eq!(doctor(&s.dir, &["refused-pod"])["cause"], "WorkerRefused");
    // Settings the API server takes but no node fits: the pod is made and cannot be placed,
    // and the refusal no longer speaks on any condition.
    resources(r#"{"requests":{"cpu":"100"},"limits":{"cpu":"200"}}"#);
    let dv = wait_for("the unschedulable pod explained", 60, || {
        get(&s.dir, "dv/refused-pod")
            .filter(|d| condition(d, "Running")["reason"] == "Unschedulable")
    });
    for c in ["Bound", "Ready", "Running"] {
        let said = condition(&dv, c)["message"].to_string();
        assert!(!said.contains("was refused"), "{c}: {said}");
    }
    let d = doctor(&s.dir, &["refused-pod"]);
    assert_eq!(d["cause"], "WorkerUnschedulable", "{d}");
    assert!(
        d["summary"].as_str().unwrap().contains("Insufficient cpu"),
        "{d}"
    );
    resources("null");
    // The next importer is made with the settings the controller holds then: delete the stuck
    // one once the fixed settings are in effect.
    wait_for("the fixed settings in status", 30, || {
        get(&s.dir, "cdiconfig/config")
            .filter(|c| c["status"]["defaultPodResourceRequirements"]["requests"]["cpu"] != "100")
    });
    kubectl(&s.dir, &["delete", "pod", "importer-refused-pod"], None);
    wait_for("the import once the settings are fixed", 120, || {
        get(&s.dir, "dv/refused-pod").filter(|d| phase(d) == "Succeeded")
    });

    // A class that does not exist: the provisioner's words, through `cdi doctor`.
    let d = wait_for("the provisioner's failure explained", 30, || {
        Some(doctor(&s.dir, &["no-such-class"])).filter(|d| d["cause"] == "ProvisioningFailed")
    });
    assert!(
        d["summary"]
            .as_str()
            .unwrap()
            .contains(r#"storageclass.storage.k8s.io "gone" not found"#),
        "{d}"
    );
    // No class named and no default: said, with the annotation that makes one the default.
    kubectl(
        &s.dir,
        &[
            "annotate",
            "storageclass",
            "local-path",
            "storageclass.kubernetes.io/is-default-class=false",
            "--overwrite",
        ],
        None,
    );
    let no_class = format!(
        r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {{name: no-class}}
spec:
  source: {{http: {{url: "{url}"}}}}
  storage:
    accessModes: [ReadWriteOnce]
    resources: {{requests: {{storage: 64Mi}}}}
"#
    );
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&no_class));
    let d = wait_for("no default class explained", 30, || {
        Some(doctor(&s.dir, &["no-class"])).filter(|d| d["cause"] == "NoDefaultStorageClass")
    });
    assert!(
        d["explanation"]
            .as_str()
            .unwrap()
            .contains("storageclass.kubernetes.io/is-default-class"),
        "{d}"
    );

    // ResourceQuotas: a worker pod over the CPU quota, a claim over the storage quota. Both
    // say upstream's ErrExceededQuota, and `cdi doctor` names the quota.
    kubectl(&s.dir, &["create", "namespace", "tight"], None);
    let quotas = r#"
apiVersion: v1
kind: ResourceQuota
metadata: {name: cpu, namespace: tight}
spec: {hard: {requests.cpu: 50m}}
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: storage, namespace: tight}
spec: {hard: {requests.storage: 100Mi}}
"#;
    kubectl(&s.dir, &["apply", "-f", "-"], Some(quotas));
    let in_tight = |name: &str, size: &str| {
        data_volume(name, &url, size, "").replace(
            &format!("name: {name}\n"),
            &format!("name: {name}\n  namespace: tight\n"),
        )
    };
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(
            &[
                in_tight("over-cpu", "64Mi"),
                in_tight("over-storage", "1Gi"),
            ]
            .join("---"),
        ),
    );
    for (name, refused) in [
        (
            "over-cpu",
            r#"pods "importer-over-cpu" is forbidden: exceeded quota: cpu, requested: requests.cpu=100m, used: requests.cpu=0, limited: requests.cpu=50m"#,
        ),
        (
            "over-storage",
            // What is used depends on whether over-cpu's claim was created first.
            r#"persistentvolumeclaims "over-storage" is forbidden: exceeded quota: storage, requested: requests.storage=1Gi, used: requests.storage=*, limited: requests.storage=100Mi"#,
        ),
    ] {
        let d = wait_for(&format!("{name} explained"), 60, || {
            Some(doctor(&s.dir, &[name, "-n", "tight"])).filter(|d| d["cause"] == "Quota")
        });
        let explanation = d["explanation"].as_str().unwrap();
        let (before, after) = refused.split_once('*').unwrap_or((refused, ""));
        let at = explanation.find(before);
        assert!(
            at.is_some_and(|at| explanation[at + before.len()..].contains(after)),
            "{refused}: {d}"
        );
        let events = kubectl(
            &s.dir,
            &["get", "events", "-n", "tight", "-o", "json"],
            None,
        );
        assert!(events.contains("ErrExceededQuota"), "{events}");
    }
    assert!(s.controller.alive(), "the controller died");
}

/// The volume directories left under the nodes (the class keeps them under `data/vm-disks`).
fn volume_dirs(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for node in std::fs::read_dir(dir.join("nodes")).unwrap().flatten() {
        let ns = node.path().join("data/vm-disks/default");
        for d in std::fs::read_dir(ns).into_iter().flatten().flatten() {
            found.push(d.path());
        }
    }
    found
}

/// Nothing is left of deleted DataVolumes: no claim, volume, pod or directory, whether they are
/// deleted in bulk after succeeding or right after being created (before the controller saw
/// them, or while it acts on them).
#[tokio::test(flavor = "multi_thread")]
async fn deleted_datavolumes_leave_no_claim_volume_pod_or_directory() {
    let s = setup(false);
    let _down = Down(&s.dir);
    let raw = s._tmp.path().join("small.raw");
    std::fs::write(&raw, pattern(MIB)).unwrap();
    let server = FileServer::start(None).await;
    server.add(
        "/small.raw",
        std::fs::read(&raw).unwrap(),
        Behaviour {
            ranges: true,
            ..Default::default()
        },
    );
    let url = server.url("/small.raw");
    let nothing_left = |what: &str| {
        wait_for(what, 120, || {
            let empty = |kind: &str| {
                get(&s.dir, kind)
                    .is_some_and(|l| l["items"].as_array().is_some_and(|i| i.is_empty()))
            };
            (empty("dv")
                && empty("pvc")
                && empty("pv")
                && empty("pods")
                && volume_dirs(&s.dir).is_empty())
            .then_some(())
        })
    };

    // In bulk, once they succeeded.
    let docs: Vec<String> = (0..30)
        .map(|i| data_volume(&format!("bulk-{i}"), &url, "64Mi", ""))
        .collect();
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&docs.join("---")));
    wait_for("every import to succeed", 180, || {
        let list = get(&s.dir, "dv")?;
        let items = list["items"].as_array()?;
        (items.len() == 30 && items.iter().all(|d| phase(d) == "Succeeded")).then_some(())
    });
    kubectl(&s.dir, &["delete", "dv", "--all", "--wait=false"], None);
    nothing_left("nothing left after the bulk delete");

    // Created and deleted at once, over and over.
    for i in 0..20 {
        let name = format!("churn-{i}");
        kubectl(
            &s.dir,
            &["apply", "-f", "-"],
            Some(&data_volume(&name, &url, "64Mi", "")),
        );
        kubectl(&s.dir, &["delete", "dv", &name, "--wait=false"], None);
    }
    // One more that succeeds: the controller has worked through what came before it.
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&data_volume("marker", &url, "64Mi", "")),
    );
    wait_for("the marker to succeed", 60, || {
        get(&s.dir, "dv/marker").filter(|d| phase(d) == "Succeeded")
    });
    kubectl(&s.dir, &["delete", "dv", "marker", "--wait=false"], None);
    nothing_left("nothing left after the create-delete loop");

    // A claim a running pod uses outlives its DataVolume (in-use protection); a DataVolume made
    // again under the name says it waits for that claim, then gets a claim of its own.
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&data_volume("held", &url, "64Mi", "")),
    );
    let first = wait_for("the first held import", 60, || {
        get(&s.dir, "dv/held").filter(|d| phase(d) == "Succeeded")
    });
    let holder = r#"
apiVersion: v1
kind: Pod
metadata: {name: holder}
spec:
  containers: [{name: c, image: busybox, command: [/bin/sh, -c, "sleep 300"]}]
  volumes: [{name: d, persistentVolumeClaim: {claimName: held}}]
"#;
    kubectl(&s.dir, &["apply", "-f", "-"], Some(holder));
    wait_for("the holder to run", 60, || {
        get(&s.dir, "pod/holder").filter(|p| p["status"]["phase"] == "Running")
    });
    kubectl(&s.dir, &["delete", "dv", "held", "--wait=false"], None);
    wait_for("the held claim to be Terminating", 60, || {
        get(&s.dir, "pvc/held").filter(|c| !c["metadata"]["deletionTimestamp"].is_null())
    });
    kubectl(
        &s.dir,
        &["apply", "-f", "-"],
        Some(&data_volume("held", &url, "64Mi", "")),
    );
    let waiting = wait_for("the new DataVolume to wait for the old claim", 60, || {
        get(&s.dir, "dv/held").filter(|d| {
            d["metadata"]["uid"] != first["metadata"]["uid"]
                && phase(d) == "Pending"
                && condition(d, "Ready")["reason"] == "ErrClaimBeingDeleted"
        })
    });
    assert_eq!(
        condition(&waiting, "Bound")["reason"],
        "ErrClaimBeingDeleted"
    );
    kubectl(&s.dir, &["delete", "pod", "holder", "--wait=false"], None);
    let second = wait_for("the new DataVolume's own import", 120, || {
        get(&s.dir, "dv/held").filter(|d| phase(d) == "Succeeded")
    });
    let claim = get(&s.dir, "pvc/held").unwrap();
    assert_eq!(
        claim["metadata"]["ownerReferences"][0]["uid"],
        second["metadata"]["uid"]
    );
    kubectl(&s.dir, &["delete", "dv", "held", "--wait=false"], None);
    nothing_left("nothing left after the held claim");
}

/// Placement beyond upstream, side by side in one cluster: a DataVolume opted out of following
/// its consumer stays unschedulable on the tainted node as upstream's would; a first-consumer
/// template for node-3 binds and fills the disk there with no other consumer; a template no
/// node satisfies waits, with the scheduler's reason.
#[tokio::test(flavor = "multi_thread")]
async fn placement_follows_the_consumer_or_a_first_consumer_template() {
    let s = setup(true);
    let _down = Down(&s.dir);
    let (server, expected) = serve_image(s._tmp.path(), MIB, false).await;
    let url = server.url("/disk.qcow2");
    let upstream = r#"cdi-rs.dev/worker-placement: cdi"#;
    let on_node_3 =
        r#"cdi-rs.dev/first-consumer: '{"nodeSelector": {"kubernetes.io/hostname": "node-3"}}'"#;
    let nowhere = r#"cdi-rs.dev/first-consumer: "nodeSelector: {kubernetes.io/hostname: node-9}""#;
    let manifests = [
        data_volume("upstream", &url, "1Gi", upstream),
        consumer("virt-launcher-upstream", "upstream"),
        data_volume("on-node-3", &url, "1Gi", on_node_3),
        data_volume("nowhere", &url, "1Gi", nowhere),
    ]
    .join("\n---\n");
    kubectl(&s.dir, &["apply", "-f", "-"], Some(&manifests));

    // Opted out: the importer gets no toleration and cannot go where the claim is.
    let dv = wait_for("the opted-out importer to be unschedulable", 90, || {
        get(&s.dir, "dv/upstream").filter(|d| condition(d, "Running")["reason"] == "Unschedulable")
    });
    assert_eq!(phase(&dv), "ImportScheduled");
    let pod = get(&s.dir, "pod/importer-upstream").unwrap();
    assert_eq!(pod["spec"]["tolerations"], Value::Null);
    let scheduler = events_of(&s.dir, "importer-upstream");
    assert!(
        scheduler
            .iter()
            .any(|(reason, message)| reason == "FailedScheduling"
                && message.contains("1 node(s) had untolerated taint {virt-local: true}")),
        "{scheduler:?}"
    );
    let claim = get(&s.dir, "pvc/upstream").unwrap();
    assert_eq!(
        claim["metadata"]["annotations"]["cdi-rs.dev/worker-tolerations"],
        Value::Null
    );
    // `cdi doctor` names the taint and both ways out.
    let d = doctor(&s.dir, &["upstream"]);
    assert_eq!(d["cause"], "WorkerUnschedulable", "{d}");
    assert_eq!(
        d["summary"],
        "worker pod importer-upstream does not tolerate taint virt-local=true:NoSchedule of node \
         node-2, where the claim is"
    );
    let explanation = d["explanation"].as_str().unwrap();
    for fix in [
        "kubectl annotate pvc -n default upstream cdi-rs.dev/worker-placement-; kubectl delete \
         pod -n default importer-upstream",
        r#"kubectl patch cdi cdi --type merge -p '{"spec":{"workload":{"tolerations":[{"key":"virt-local","operator":"Equal","value":"true","effect":"NoSchedule"}]}}}'"#,
    ] {
        assert!(explanation.contains(fix), "{fix}: {explanation}");
    }
    // The first fix works: the new importer inherits the consumer's toleration.
    kubectl(
        &s.dir,
        &[
            "annotate",
            "pvc",
            "upstream",
            "cdi-rs.dev/worker-placement-",
        ],
        None,
    );
    kubectl(&s.dir, &["delete", "pod", "importer-upstream"], None);

    // The first-consumer pod bound the claim on node-3; the import filled it there.
    let dv = wait_for("the node-3 import", 90, || {
        get(&s.dir, "dv/on-node-3").filter(|d| phase(d) == "Succeeded")
    });
    assert_eq!(dv["status"]["progress"], "100.0%");
    let claim = get(&s.dir, "pvc/on-node-3").unwrap();
    assert_eq!(
        claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"],
        "node-3"
    );
    let pv = volume_of(&s.dir, &claim);
    let path = pv["spec"]["hostPath"]["path"].as_str().unwrap().to_string();
    assert!(path.contains("/nodes/node-3/"), "{path}");
    let disk = std::fs::read(Path::new(&path).join("disk.img")).unwrap();
    assert_same(&disk[..expected.len()], &expected, "the imported image");
    wait_for("the temporary pod to go", 30, || {
        get(&s.dir, "pod/on-node-3-first-consumer")
            .is_none()
            .then_some(())
    });

    // No node fits: it waits, and says why in the scheduler's words.
    let events = wait_for("the scheduler's reason on the DataVolume", 60, || {
        let events = events_of(&s.dir, "nowhere");
        events
            .iter()
            .any(|(reason, _)| reason == "FirstConsumerUnschedulable")
            .then_some(events)
    });
    let (_, message) = events
        .iter()
        .find(|(reason, _)| reason == "FirstConsumerUnschedulable")
        .unwrap();
    assert!(
        message.contains(
            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector"
        ),
        "{message}"
    );
    assert_eq!(
        phase(&get(&s.dir, "dv/nowhere").unwrap()),
        "WaitForFirstConsumer"
    );
    assert!(get(&s.dir, "pod/importer-nowhere").is_none());
    let d = doctor(&s.dir, &["nowhere"]);
    assert_eq!(d["cause"], "ConsumerUnschedulable", "{d}");
    assert!(
        d["summary"]
            .as_str()
            .unwrap()
            .starts_with("first consumer nowhere-first-consumer cannot be scheduled: 0/3 nodes"),
        "{d}"
    );
    wait_for(
        "the opted-out import once the doctor's fix is applied",
        90,
        || get(&s.dir, "dv/upstream").filter(|d| phase(d) == "Succeeded"),
    );
    let pod = get(&s.dir, "pod/importer-upstream");
    let claim = get(&s.dir, "pvc/upstream").unwrap();
    assert!(
        claim["metadata"]["annotations"]["cdi-rs.dev/worker-tolerations"]
            .as_str()
            .is_some_and(|t| t.contains("virt-launcher-upstream")),
        "{claim} {pod:?}"
    );
    drop(s.controller);
}

/// A small deterministic generator, so that a chaos run is repeated from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Where the chaos run's upload proxy is now (it is restarted on another port when killed).
#[derive(Clone)]
struct ProxyAt {
    host: String,
    resolve: String,
    ca: std::path::PathBuf,
}

impl ProxyAt {
    fn of(p: &devcluster::UploadProxy) -> ProxyAt {
        ProxyAt {
            host: p.host.clone(),
            resolve: p.resolve.clone(),
            ca: p.ca.clone(),
        }
    }
}

/// What a client such as virtctl does against faults: while the DataVolume is UploadReady,
/// upload (slowly, so that faults strike mid-upload) with a fresh token through the proxy where
/// it is now; after any failure, look again. Ends once the DataVolume succeeded, or at `stop`.
fn upload_client(
    dir: std::path::PathBuf,
    name: String,
    image: std::path::PathBuf,
    key: String,
    at: std::sync::Arc<std::sync::Mutex<ProxyAt>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<usize> {
    use cdi_pki::token::{API_ISSUER, LIFETIME, Payload, Signer};
    std::thread::spawn(move || {
        let signer = Signer::new(API_ISSUER, &key).unwrap();
        let mut attempts = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let phase = get(&dir, &format!("dv/{name}")).map(|d| phase(&d));
            match phase.as_deref() {
                Some("Succeeded") => break,
                Some("UploadReady") => {
                    attempts += 1;
                    let p = at.lock().unwrap().clone();
                    let token = signer.sign(&Payload::upload("default", &name), LIFETIME);
                    let _ = std::process::Command::new("curl")
                        .args(["-sS", "-o", "/dev/null", "--limit-rate", "3M", "--resolve"])
                        .arg(&p.resolve)
                        .arg("--cacert")
                        .arg(&p.ca)
                        .arg("-H")
                        .arg(format!("Authorization: Bearer {token}"))
                        .arg("--data-binary")
                        .arg(format!("@{}", image.display()))
                        .arg(format!("https://{}/v1beta1/upload", p.host))
                        .output();
                }
                _ => {}
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        attempts
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// The controller killed and another started (it takes over once the lease expires).
    Controller,
    /// The worker pod's process killed (SIGKILL).
    Worker,
    /// Every node's kubelet restarted, the pods' processes with them.
    Kubelet,
    /// The upload proxy killed and another started (upload scenarios; none for the others).
    Proxy,
}

/// What fills a scenario's DataVolume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Filler {
    Http,
    Blank,
    /// A client uploads the image through the proxy, again after any failure.
    Upload,
    /// A clone of a DataVolume imported first (`<name>-src`, on the CSI-like class): on the
    /// classic path a host-assisted copy; through the clone populator by the strategy named.
    Clone(&'static str),
}

/// One randomized scenario: what is imported, on which path, what fails and when.
#[derive(Debug)]
struct Scenario {
    name: String,
    filler: Filler,
    populator: bool,
    consumer_first: bool,
    fault: Fault,
    after: Duration,
}

impl Scenario {
    fn random(i: usize, rng: &mut Rng) -> Scenario {
        let filler = [
            Filler::Http,
            Filler::Http,
            Filler::Blank,
            Filler::Upload,
            Filler::Upload,
            Filler::Clone("copy"),
            Filler::Clone("snapshot"),
            Filler::Clone("csi-clone"),
        ][rng.below(8) as usize];
        let populator = rng.below(2) == 0;
        // Off the populator path a clone is a host-assisted copy.
        let filler = match filler {
            Filler::Clone(_) if !populator => Filler::Clone("copy"),
            other => other,
        };
        Scenario {
            name: format!("chaos-{i}"),
            filler,
            populator,
            consumer_first: rng.below(3) == 0,
            // The proxy's fault only where there is an upload.
            fault: [
                Fault::None,
                Fault::Controller,
                Fault::Worker,
                Fault::Kubelet,
                Fault::Proxy,
            ][rng.below(if filler == Filler::Upload { 5 } else { 4 }) as usize],
            after: Duration::from_millis(rng.below(5000)),
        }
    }

    /// The DataVolume a clone scenario copies.
    fn source(&self) -> String {
        format!("{}-src", self.name)
    }

    /// A clone's source: the image imported on the CSI-like class, bound at once (nothing
    /// consumes it).
    fn source_volume(&self, url: &str) -> String {
        format!(
            r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: {name}
  annotations: {{cdi.kubevirt.io/storage.bind.immediate.requested: "true"}}
spec:
  source: {{http: {{url: "{url}"}}}}
  storage: {{storageClassName: csi, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 64Mi}}}}}}
"#,
            name = self.source()
        )
    }

    fn data_volume(&self, url: &str) -> String {
        let source = match self.filler {
            Filler::Http => format!(r#"{{http: {{url: "{url}"}}}}"#),
            Filler::Blank => "{blank: {}}".to_string(),
            Filler::Upload => "{upload: {}}".to_string(),
            Filler::Clone(_) => format!("{{pvc: {{namespace: default, name: {}}}}}", self.source()),
        };
        let (api, class) = if self.populator {
            ("storage", "csi")
        } else {
            ("pvc", "local-path-wffc")
        };
        // A clone asks for no size: it gets its source's.
        let (api, resources) = match self.filler {
            Filler::Clone(_) => ("storage", ""),
            _ => (api, "\n    resources: {requests: {storage: 64Mi}}"),
        };
        format!(
            r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {{name: {name}}}
spec:
  source: {source}
  {api}:
    storageClassName: {class}
    accessModes: [ReadWriteOnce]{resources}
"#,
            name = self.name
        )
    }
}

/// The names of the objects of `kind` in the namespace.
fn names_of(dir: &Path, kind: &str) -> Vec<String> {
    get(dir, kind)
        .and_then(|l| {
            l["items"].as_array().map(|items| {
                items
                    .iter()
                    .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// Faults at random moments (the controller, a worker's process, the kubelets, the upload proxy)
/// while DataVolumes import over HTTP or blank, are uploaded through the proxy by a client
/// that sends again after a failure, or clone another (host-assisted, or through the clone
/// populator by copy, snapshot or CSI clone), on the classic and the populator path, the
/// consumer created before or after: each DataVolume succeeds with the image's bytes, as without faults,
/// and once deleted nothing is left of it. `CDI_CHAOS=N` scenarios (3 by default),
/// `CDI_CHAOS_SEED` repeats a run; `scripts/chaos` runs 100.
#[tokio::test(flavor = "multi_thread")]
async fn chaos_every_data_volume_converges_and_nothing_leaks() {
    let count: usize = std::env::var("CDI_CHAOS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    let seed: u64 = std::env::var("CDI_CHAOS_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("chaos: {count} scenarios, CDI_CHAOS_SEED={seed}");
    let mut rng = Rng(seed);
    let mut s = setup(true);
    let _down = Down(&s.dir);
    let (server, expected) = serve_image(s._tmp.path(), 6 * MIB, true).await;
    let url = server.url("/disk.qcow2");
    let dev_pid: i32 = std::fs::read_to_string(s.dir.join("cdi-dev.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let signal = |pid: i32, sig| {
        let _ = rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), sig);
    };
    // Uploads go through a proxy of their own, restarted when the proxy's fault kills it.
    let image = s._tmp.path().join("upload.raw");
    std::fs::write(&image, &expected).unwrap();
    let mut proxies = 1;
    let proxy_dir = |n: usize| {
        let d = s._tmp.path().join(format!("proxy-{n}"));
        std::fs::create_dir_all(&d).unwrap();
        d
    };
    let mut proxy = devcluster::start_proxy(&s.dir, &proxy_dir(proxies));
    let proxy_at = std::sync::Arc::new(std::sync::Mutex::new(ProxyAt::of(&proxy)));
    let mut controllers = 1;
    let mut failures: Vec<String> = Vec::new();
    let mut hits = std::collections::BTreeMap::<String, (usize, usize)>::new();
    let mut fillers = std::collections::BTreeMap::<String, usize>::new();
    let started = std::time::Instant::now();
    for i in 0..count {
        let sc = Scenario::random(i, &mut rng);
        let user = format!("{}-user", sc.name);
        // A clone's source is imported first, and the CSI class's profile names the strategy.
        let mut expected_claims = vec![sc.name.clone()];
        if let Filler::Clone(strategy) = sc.filler {
            if sc.populator {
                devcluster::set_clone_strategy(&s.dir, strategy);
            }
            kubectl(&s.dir, &["apply", "-f", "-"], Some(&sc.source_volume(&url)));
            wait_for(&format!("{} to be imported", sc.source()), 120, || {
                get(&s.dir, &format!("dv/{}", sc.source())).filter(|d| phase(d) == "Succeeded")
            });
            expected_claims.push(sc.source());
            expected_claims.sort();
        }
        let docs = [sc.data_volume(&url), consumer(&user, &sc.name)];
        let order = if sc.consumer_first { [1, 0] } else { [0, 1] };
        for d in order {
            kubectl(&s.dir, &["apply", "-f", "-"], Some(&docs[d]));
        }
        let upload = sc.filler == Filler::Upload;
        // A host-assisted copy's worker is its target's upload server (the cloner's stream ends
        // with it); CSI clones and snapshots have none.
        let worker = if upload || matches!(sc.filler, Filler::Clone(_)) {
            "cdi-upload-"
        } else {
            "importer-"
        };
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let client = upload.then(|| {
            upload_client(
                s.dir.clone(),
                sc.name.clone(),
                image.clone(),
                proxy.signing_key.clone(),
                proxy_at.clone(),
                stop.clone(),
            )
        });
        // A worker's fault strikes while one runs (it does for a second or two), at a random
        // moment of it; the controller's, at a random moment after the apply.
        if matches!(sc.fault, Fault::Worker | Fault::Kubelet | Fault::Proxy) {
            let _ = within(60, || pod_process_named(&s.dir, worker));
            std::thread::sleep(sc.after / 4);
        } else {
            std::thread::sleep(sc.after);
        }
        // Whether the fault found what it kills: a worker only runs for part of the import.
        let hit = match sc.fault {
            Fault::None => true,
            Fault::Controller => {
                s.controller.kill();
                controllers += 1;
                s.controller = Controller::start(
                    &s.dir,
                    &s._tmp.path().join(format!("controller-{controllers}.log")),
                );
                true
            }
            Fault::Worker => match pod_process_named(&s.dir, worker) {
                Some(pid) => {
                    signal(pid, rustix::process::Signal::KILL);
                    true
                }
                None => false,
            },
            Fault::Kubelet => {
                let running = pod_process_named(&s.dir, worker).is_some();
                signal(dev_pid, rustix::process::Signal::USR1);
                running
            }
            Fault::Proxy => {
                let _ = proxy.child.kill();
                let _ = proxy.child.wait();
                proxies += 1;
                proxy = devcluster::start_proxy(&s.dir, &proxy_dir(proxies));
                *proxy_at.lock().unwrap() = ProxyAt::of(&proxy);
                true
            }
        };
        let path = if sc.populator { "populator" } else { "classic" };
        *fillers
            .entry(format!("{:?} {path}", sc.filler))
            .or_default() += 1;
        let entry = hits.entry(format!("{:?}", sc.fault)).or_default();
        entry.0 += 1;
        entry.1 += usize::from(hit);

        let mut fail = |what: String| {
            eprintln!("chaos: {} ({sc:?}): {what}", sc.name);
            failures.push(format!("{}: {what}", sc.name));
        };
        let done = within(180, || {
            get(&s.dir, &format!("dv/{}", sc.name))
                .filter(|d| matches!(phase(d).as_str(), "Succeeded" | "Failed"))
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(c) = client {
            let attempts = c.join().unwrap_or(0);
            eprintln!("chaos: {} uploaded in {attempts} attempt(s)", sc.name);
        }
        match done.as_ref().map(phase).as_deref() {
            Some("Succeeded") => {}
            other => {
                let now = get(&s.dir, &format!("dv/{}", sc.name));
                fail(format!(
                    "ended {other:?}, not Succeeded; status {}",
                    now.map(|d| d["status"].to_string()).unwrap_or_default()
                ));
            }
        }
        // The workers go, and only the claim is left: no PVC prime, no second volume.
        let tidy = within(60, || {
            let pods = names_of(&s.dir, "pods");
            let mut claims = names_of(&s.dir, "pvc");
            claims.sort();
            (pods.iter().all(|p| *p == user) && claims == expected_claims).then_some(())
        });
        if tidy.is_none() {
            fail(format!(
                "left behind: pods {:?}, claims {:?}",
                names_of(&s.dir, "pods"),
                names_of(&s.dir, "pvc")
            ));
        }
        let mut disk_path = None;
        if let Some(claim) = get(&s.dir, &format!("pvc/{}", sc.name))
            && claim["spec"]["volumeName"].is_string()
        {
            let pv = volume_of(&s.dir, &claim);
            let dir = pv["spec"]["hostPath"]["path"]
                .as_str()
                .or(pv["spec"]["csi"]["volumeAttributes"]["path"].as_str())
                .map(std::path::PathBuf::from);
            if let Some(dir) = dir {
                match std::fs::read(dir.join("disk.img")) {
                    Ok(disk) if sc.filler != Filler::Blank => {
                        if disk.len() < expected.len() || disk[..expected.len()] != expected[..] {
                            fail("the disk differs from the image".into());
                        }
                    }
                    Ok(disk) => {
                        if disk.iter().any(|b| *b != 0) {
                            fail("the blank disk is not all zeros".into());
                        }
                    }
                    Err(e) => fail(format!("no disk image: {e}")),
                }
                disk_path = Some(dir);
            }
        }
        // Deleted, nothing is left: no claim, volume, pod, or directory.
        kubectl(&s.dir, &["delete", "dv", &sc.name, "--wait=false"], None);
        if matches!(sc.filler, Filler::Clone(_)) {
            kubectl(
                &s.dir,
                &["delete", "dv", &sc.source(), "--wait=false"],
                None,
            );
        }
        kubectl(&s.dir, &["delete", "pod", &user, "--wait=false"], None);
        let gone = within(120, || {
            (names_of(&s.dir, "dv").is_empty()
                && names_of(&s.dir, "pvc").is_empty()
                && names_of(&s.dir, "pv").is_empty()
                && names_of(&s.dir, "pods").is_empty()
                && names_of(&s.dir, "volumesnapshots").is_empty()
                && disk_path.as_ref().is_none_or(|p| !p.exists()))
            .then_some(())
        });
        if gone.is_none() {
            fail(format!(
                "after deleting: dvs {:?}, claims {:?}, volumes {:?}, pods {:?}, directory {:?}",
                names_of(&s.dir, "dv"),
                names_of(&s.dir, "pvc"),
                names_of(&s.dir, "pv"),
                names_of(&s.dir, "pods"),
                disk_path.filter(|p| p.exists())
            ));
            break;
        }
    }
    eprintln!(
        "chaos: {count} scenarios in {:.0} s (seed {seed}); fillers: {fillers:?}; faults (count, found running): {hits:?}; {} failed",
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(failures.is_empty(), "chaos seed {seed}: {failures:#?}");
}
