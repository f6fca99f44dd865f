//! `cdi controller` in `cdi dev`: the import path end to end with the real controller binary
//! and real importer pods, driven with kubectl as a user would.

mod devcluster;

use std::path::Path;
use std::time::Duration;

use cdi_testkit::images::{assert_same, convert, oracle, pattern};
use cdi_testkit::{Behaviour, FileServer};
use devcluster::{Controller, Down, cdi, kubectl, wait_for};
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

/// A cluster with the controller running, `HonorWaitForFirstConsumer` set as `gate`, worker
/// pods allowed on the tainted node (CDI `spec.workload`), and the seed's class.
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
    kubectl(
        &dir,
        &[
            "patch",
            "cdiconfig",
            "config",
            "--type",
            "merge",
            "-p",
            &format!(r#"{{"spec":{{"featureGates":{gates}}}}}"#),
        ],
        None,
    );
    kubectl(&dir, &["apply", "-f", "-"], Some(SETUP));
    Setup {
        _tmp: tmp,
        dir,
        controller,
    }
}

const SETUP: &str = r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: CDI
metadata: {name: cdi}
spec:
  workload:
    tolerations: [{key: virt-local, operator: Equal, value: "true", effect: NoSchedule}]
---
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
            // One streamed response with a pause mid-way, so ImportInProgress lasts long enough
            // to be seen.
            ranges: !slow,
            stall_after: slow.then_some((2 * MIB, Duration::from_secs(3))),
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
    std::thread::sleep(Duration::from_secs(2));
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
        (Some("False"), Some("PVC vm-root Pending"))
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
    // spec.pvc: the claim asks for exactly 2Gi; the image gets the usable part of it (SPEC §3).
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
    drop(s.controller);
}
