//! `cdi dev up` / `cdi dev down` as a user runs them, with the machine's kubectl.

mod devcluster;

use devcluster::{Down, cdi, kubectl};

use std::time::Duration;

const SEED: &str = "
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: vm-disk}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 10Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: virt-launcher-vm}
spec:
  nodeSelector: {node-role.kubernetes.io/virt-local: \"true\"}
  tolerations: [{key: virt-local, operator: Equal, value: \"true\", effect: NoSchedule}]
  containers: [{name: compute, image: registry.example/vm-image:1}]
  volumes: [{name: disk, persistentVolumeClaim: {claimName: vm-disk}}]
";

#[test]
fn up_places_the_seed_vm_and_its_disk_on_node_2_and_down_stops_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (ok, out, err) = cdi(&["dev", "up", "--addr", "127.0.0.1:0"], dir);
    assert!(ok, "{out}{err}");
    let _down = Down(dir);
    assert!(
        out.contains(&format!("kubeconfig: {}", dir.join("kubeconfig").display())),
        "{out}"
    );

    let (again, _, err) = cdi(&["dev", "up", "--addr", "127.0.0.1:0"], dir);
    assert!(!again && err.contains("already up"), "{err}");

    kubectl(dir, &["apply", "-f", "-"], Some(SEED));
    let mut table = String::new();
    for _ in 0..100 {
        table = kubectl(dir, &["get", "pods,pvc,pv", "-o", "wide"], None);
        if table.contains("Bound") && table.lines().filter(|l| l.contains("node-2")).count() == 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The pod, the claim (selected node) and the volume (node affinity) all say node-2.
    assert_eq!(
        table.lines().filter(|l| l.contains("node-2")).count(),
        3,
        "{table}"
    );
    let volume_dirs = std::fs::read_dir(dir.join("nodes/node-2/opt/local-path-provisioner"))
        .unwrap()
        .count();
    assert_eq!(volume_dirs, 1);
    let scheduler_log = std::fs::read_to_string(dir.join("logs/scheduler.log")).unwrap();
    assert!(scheduler_log.contains("bound pod"), "{scheduler_log}");

    let mut pods = String::new();
    for _ in 0..100 {
        pods = kubectl(dir, &["get", "pods"], None);
        if pods.contains("ErrImagePull") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let row: Vec<&str> = pods
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        row[..3],
        ["virt-launcher-vm", "0/1", "ErrImagePull"],
        "{pods}"
    );
    // Its image has no program here (the kubelet reports ErrImagePull), so nothing runs and
    // deleting it finishes at once instead of hanging in Terminating.
    kubectl(
        dir,
        &["delete", "pod", "virt-launcher-vm", "--timeout=10s"],
        None,
    );
    let pods = kubectl(dir, &["get", "pods", "-o", "name"], None);
    assert_eq!(pods, "");
    let kubelet_log = std::fs::read_to_string(dir.join("logs/kubelet.log")).unwrap();
    assert!(kubelet_log.contains("deleted pod"), "{kubelet_log}");

    let pid: i32 = std::fs::read_to_string(dir.join("cdi-dev.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (ok, out, _) = cdi(&["dev", "down"], dir);
    assert!(ok && out.contains("stopped"), "{out}");
    // Gone, or a zombie waiting for its reaper (an empty command line).
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(cmdline.is_empty(), "pid {pid} still runs");
    let (ok, out, _) = cdi(&["dev", "down"], dir);
    assert!(
        ok && out.contains("no development cluster is running"),
        "{out}"
    );
}

#[test]
fn nodes_come_from_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let bad = tmp.path().join("bad.yaml");
    std::fs::write(&bad, "- name: edge\n  taints: [\"edge=true\"]\n").unwrap();
    let bad_arg = bad.to_str().unwrap();
    let (ok, _, err) = cdi(
        &["dev", "up", "--addr", "127.0.0.1:0", "--nodes", bad_arg],
        &dir,
    );
    assert!(
        !ok && err.contains("bad.yaml") && err.contains("key=value:Effect"),
        "{err}"
    );

    let good = tmp.path().join("nodes.yaml");
    std::fs::write(
        &good,
        "- name: edge-1\n  labels: {zone: edge}\n  taints: [\"edge=true:NoSchedule\"]\n- name: core-1\n  cpu: \"2\"\n",
    )
    .unwrap();
    let good_arg = good.to_str().unwrap();
    let (ok, out, err) = cdi(
        &["dev", "up", "--addr", "127.0.0.1:0", "--nodes", good_arg],
        &dir,
    );
    assert!(ok, "{out}{err}");
    let _down = Down(&dir);
    let nodes = kubectl(
        &dir,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.taints[0].key} {.status.allocatable.cpu}{\"\\n\"}{end}",
        ],
        None,
    );
    assert_eq!(nodes, "core-1  2\nedge-1 edge 8\n");
    assert!(dir.join("nodes/edge-1").is_dir() && dir.join("nodes/core-1").is_dir());
}

/// kubectl with the kubeconfig at `path`: (success, stdout, stderr).
fn kubectl_with(path: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    devcluster::kubectl_as(path, args, None)
}

#[test]
fn a_user_kubeconfig_holds_what_rbac_grants_its_user_and_groups() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let (ok, _, err) = cdi(&["dev", "kubeconfig", "--user", "alice"], &dir);
    assert!(!ok && err.contains("no development cluster is up"), "{err}");

    let (ok, out, err) = cdi(&["dev", "up", "--addr", "127.0.0.1:0"], &dir);
    assert!(ok, "{out}{err}");
    let _down = Down(&dir);
    let (ok, alice, err) = cdi(
        &["dev", "kubeconfig", "--user", "alice", "--group", "devs"],
        &dir,
    );
    assert!(ok, "{err}");
    let path = tmp.path().join("alice");
    std::fs::write(&path, alice).unwrap();

    let (ok, who, err) = kubectl_with(&path, &["auth", "whoami", "-o", "json"]);
    assert!(ok, "{err}");
    let who: serde_json::Value = serde_json::from_str(&who).unwrap();
    assert_eq!(who["status"]["userInfo"]["username"], "alice");
    assert_eq!(
        who["status"]["userInfo"]["groups"],
        serde_json::json!(["devs", "system:authenticated"])
    );
    let (ok, _, err) = kubectl_with(&path, &["get", "pods"]);
    assert!(
        !ok && err.contains(
            r#"pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "default""#
        ),
        "{err}"
    );
    kubectl(
        &dir,
        &[
            "create",
            "rolebinding",
            "devs-view",
            "--clusterrole=view",
            "--group=devs",
        ],
        None,
    );
    let (ok, _, err) = kubectl_with(&path, &["get", "pods"]);
    assert!(ok, "{err}");
    // The admin kubeconfig is the one `cdi dev up` wrote.
    let (ok, admin, _) = cdi(&["dev", "kubeconfig"], &dir);
    assert!(ok);
    assert_eq!(
        admin,
        std::fs::read_to_string(dir.join("kubeconfig")).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn up_with_cdi_imports_a_data_volume_with_nothing_else_started() {
    use cdi_testkit::images::{convert, pattern};
    use cdi_testkit::{Behaviour, FileServer};
    let tmp = tempfile::tempdir().unwrap();
    let data = pattern(4 << 20);
    std::fs::write(tmp.path().join("src.raw"), &data).unwrap();
    convert(
        &tmp.path().join("src.raw"),
        "qcow2",
        &[],
        &tmp.path().join("src.qcow2"),
    );
    let server = FileServer::start(None).await;
    server.add(
        "/disk.qcow2",
        std::fs::read(tmp.path().join("src.qcow2")).unwrap(),
        Behaviour::default(),
    );
    let dir = tmp.path().join("cluster");
    let (ok, out, err) = cdi(&["dev", "up", "--addr", "127.0.0.1:0", "--cdi"], &dir);
    assert!(ok, "{out}{err}");
    let _down = Down(&dir);
    let out = kubectl(
        &dir,
        &[
            "rollout",
            "status",
            "-n",
            "cdi",
            "deployment/cdi-deployment",
            "--timeout=120s",
        ],
        None,
    );
    assert!(out.contains("successfully rolled out"), "{out}");
    let dv = format!(
        "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {{name: disk}}\nspec:\n  source: {{http: {{url: \"{}\"}}}}\n  storage: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 64Mi}}}}}}\n",
        server.url("/disk.qcow2")
    );
    // The example CDI resource honours WaitForFirstConsumer; this import has no consumer.
    devcluster::set_feature_gates(&dir, "[]");
    // The CRDs are the operator's to install: applied once they are there.
    devcluster::wait_for("the operator to install the CRDs", 60, || {
        let out = std::process::Command::new("kubectl")
            .args(["get", "crd", "datavolumes.cdi.kubevirt.io"])
            .env("KUBECONFIG", dir.join("kubeconfig"))
            .output()
            .unwrap();
        out.status.success().then_some(())
    });
    kubectl(&dir, &["apply", "-f", "-"], Some(&dv));
    kubectl(
        &dir,
        &[
            "wait",
            "--for=jsonpath={.status.phase}=Succeeded",
            "dv/disk",
            "--timeout=120s",
        ],
        None,
    );
    // The controller ran in the cluster under its ServiceAccount, and says so in its log.
    let pod = kubectl(
        &dir,
        &[
            "get",
            "pods",
            "-n",
            "cdi",
            "-l",
            "cdi.kubevirt.io=cdi-deployment",
            "-o",
            "jsonpath={.items[0].spec.serviceAccountName}",
        ],
        None,
    );
    assert_eq!(pod, "cdi-sa");
    let log = kubectl(
        &dir,
        &["logs", "-n", "cdi", "deployment/cdi-deployment"],
        None,
    );
    assert!(log.contains("metrics, healthz and readyz on"), "{log}");

    // Uploads work with nothing else set up: the token API and the upload proxy run in the
    // cluster, and CDIConfig says where the proxy is and which CA signed its certificate.
    devcluster::set_feature_gates(&dir, r#"["HonorWaitForFirstConsumer"]"#);
    for deployment in ["cdi-apiserver", "cdi-uploadproxy"] {
        kubectl(
            &dir,
            &[
                "rollout",
                "status",
                "-n",
                "cdi",
                &format!("deployment/{deployment}"),
                "--timeout=120s",
            ],
            None,
        );
    }
    let qcow2 = tmp.path().join("src.qcow2");
    let upload_image = |name: &str, image: &std::path::Path, extra: &[&str]| {
        let mut args = vec![
            "image-upload",
            "dv",
            name,
            "--size",
            "64Mi",
            "--image-path",
            image.to_str().unwrap(),
            "--access-mode",
            "ReadWriteOnce",
            "--wait-secs",
            "60",
        ];
        args.extend_from_slice(extra);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cdi"))
            .args(&args)
            .env("KUBECONFIG", dir.join("kubeconfig"))
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let upload = |name: &str, extra: &[&str]| upload_image(name, &qcow2, extra);
    // A token only for whom RBAC allows it: aggregated into edit by CDI's ClusterRole.
    let (ok, alice, err) = cdi(&["dev", "kubeconfig", "--user", "alice"], &dir);
    assert!(ok, "{err}");
    let alice_path = tmp.path().join("alice");
    std::fs::write(&alice_path, alice).unwrap();
    let request = tmp.path().join("token.yaml");
    std::fs::write(
        &request,
        "apiVersion: upload.cdi.kubevirt.io/v1beta1\nkind: UploadTokenRequest\nmetadata: {name: t}\nspec: {pvcName: disk}\n",
    )
    .unwrap();
    let ask = || {
        kubectl_with(
            &alice_path,
            &["create", "-f", request.to_str().unwrap(), "-o", "json"],
        )
    };
    let (ok, _, err) = ask();
    assert!(!ok, "alice has no role yet");
    assert!(
        err.contains(
            r#"User "alice" cannot create resource "uploadtokenrequests" in API group "upload.cdi.kubevirt.io" in the namespace "default""#
        ),
        "{err}"
    );
    kubectl(
        &dir,
        &[
            "create",
            "rolebinding",
            "alice-edits",
            "--clusterrole=edit",
            "--user=alice",
        ],
        None,
    );
    let answer = devcluster::wait_for("alice's token", 30, || {
        let (ok, out, _) = ask();
        ok.then_some(out)
    });
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let token = answer["status"]["token"].as_str().unwrap_or_default();
    assert_eq!(token.split('.').count(), 3, "a JWT: {answer}");

    // The default class waits for a first consumer: refused without --force-bind.
    let (ok, out, err) = upload("waits", &[]);
    assert!(!ok, "{out}{err}");
    assert!(
        err.contains(
            "cannot upload to DataVolume in WaitForFirstConsumer phase, make sure the PVC is \
             Bound, or use force-bind flag"
        ),
        "{out}{err}"
    );
    let (ok, out, err) = upload("uploaded", &["--force-bind"]);
    assert!(ok, "{out}{err}");
    for line in [
        "DataVolume default/uploaded created",
        "Uploading data to https://",
        "Uploading data completed successfully",
        "Processing completed successfully",
    ] {
        assert!(out.contains(line), "{line:?} in {out}");
    }
    let phase = kubectl(
        &dir,
        &["get", "dv", "uploaded", "-o", "jsonpath={.status.phase}"],
        None,
    );
    assert_eq!(phase, "Succeeded");
    let claim: serde_json::Value = serde_json::from_str(&kubectl(
        &dir,
        &["get", "pvc", "uploaded", "-o", "json"],
        None,
    ))
    .unwrap();
    let pv: serde_json::Value = serde_json::from_str(&kubectl(
        &dir,
        &[
            "get",
            "pv",
            claim["spec"]["volumeName"].as_str().unwrap(),
            "-o",
            "json",
        ],
        None,
    ))
    .unwrap();
    let disk =
        std::path::Path::new(pv["spec"]["hostPath"]["path"].as_str().unwrap()).join("disk.img");
    let disk = std::fs::read(disk).unwrap();
    assert_eq!(&disk[..data.len()], &data[..], "the uploaded image");

    // A VMDK needs scratch space, which the first server has not: the client is told so,
    // waits for the server that has it and sends the image again.
    let vmdk = tmp.path().join("src.vmdk");
    convert(&tmp.path().join("src.raw"), "vmdk", &[], &vmdk);
    let (ok, out, err) = upload_image("uploaded-vmdk", &vmdk, &["--force-bind"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("waiting for the upload server to be ready again"),
        "{out}"
    );
    assert!(out.contains("Processing completed successfully"), "{out}");

    hostile_uploads(&dir, tmp.path(), &data);

    // The same in-cluster client under a ServiceAccount RBAC grants nothing is refused.
    let limited = "apiVersion: v1\nkind: Pod\nmetadata: {name: limited, namespace: cdi}\nspec:\n  containers:\n  - {name: c, image: quay.io/kubevirt/cdi-controller:v1.60.1}\n";
    kubectl(&dir, &["apply", "-f", "-"], Some(limited));
    let log = devcluster::wait_for("the limited controller to be refused", 60, || {
        let out = std::process::Command::new("kubectl")
            .args(["logs", "-n", "cdi", "limited"])
            .env("KUBECONFIG", dir.join("kubeconfig"))
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stdout).into_owned();
        log.contains("system:serviceaccount:cdi:default")
            .then_some(log)
    });
    assert!(log.contains("forbidden"), "{log}");
}

/// A loop device over a file, detached when dropped.
struct LoopDevice(String);

impl LoopDevice {
    fn attach(file: &std::path::Path) -> LoopDevice {
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show", "--read-only"])
            .arg(file)
            .output()
            .unwrap();
        assert!(out.status.success(), "losetup: {out:?}");
        LoopDevice(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
    }
}

/// `cdi image-upload` as a hostile user runs it, against a cluster whose uploads work: what is
/// not an image is refused before anything is created, a block device is read to its end, two
/// uploads into one DataVolume end at once, and a damaged image is said, not waited on.
fn hostile_uploads(dir: &std::path::Path, tmp: &std::path::Path, data: &[u8]) {
    let upload = |name: &str, image: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cdi"))
            .args(["image-upload", "dv", name, "--size", "64Mi", "--force-bind"])
            .args(["--access-mode", "ReadWriteOnce", "--wait-secs", "60"])
            .arg("--image-path")
            .arg(image)
            .env("KUBECONFIG", dir.join("kubeconfig"))
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let exists = |name: &str| {
        std::process::Command::new("kubectl")
            .args(["get", "dv", name])
            .env("KUBECONFIG", dir.join("kubeconfig"))
            .output()
            .unwrap()
            .status
            .success()
    };
    let empty = tmp.join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    for (image, said) in [
        (tmp, "is a directory"),
        (std::path::Path::new("/dev/zero"), "is a character device"),
        (empty.as_path(), "is empty: no data is not an image"),
    ] {
        let (ok, text) = upload("refused", image);
        assert!(!ok && text.contains(said), "{}: {text}", image.display());
        assert!(
            !exists("refused"),
            "nothing is created for {}",
            image.display()
        );
    }

    // A block device holding the qcow2: streamed to its end, as a file would be.
    let qcow2 = tmp.join("src.qcow2");
    let device = LoopDevice::attach(&qcow2);
    let (ok, text) = upload("from-device", std::path::Path::new(&device.0));
    assert!(ok, "{text}");
    let disk = std::fs::read(devcluster::volume_file(dir, "default", "from-device")).unwrap();
    assert_eq!(&disk[..data.len()], data, "the device's image");
    drop(device);

    // Two uploads into one new DataVolume: one fills it, the other says at once that it is
    // being filled or was.
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| upload("twice", &qcow2));
        let b = s.spawn(|| upload("twice", &qcow2));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(a.0 != b.0, "exactly one upload fills it:\n{}\n{}", a.1, b.1);
    let loser = if a.0 { &b.1 } else { &a.1 };
    assert!(
        loser.contains("DataVolume default/twice already uploaded")
            || loser.contains("another upload into DataVolume default/twice is under way"),
        "{loser}"
    );
    // At most a try again when it came as the winner's server ended (502), never the end of
    // its tries.
    assert!(!loser.contains("(--retry)"), "{loser}");

    // A damaged qcow2 (its L1 table inside the header) is refused with the reason; so is one
    // cut short, found only once the server took it in: the client does not wait on either.
    let mut damaged = std::fs::read(&qcow2).unwrap();
    damaged[40..48].copy_from_slice(&0u64.to_be_bytes());
    let path = tmp.join("damaged.qcow2");
    std::fs::write(&path, &damaged).unwrap();
    let (ok, text) = upload("damaged", &path);
    assert!(!ok, "{text}");
    assert!(text.contains("overlaps the header"), "{text}");
    let whole = std::fs::read(&qcow2).unwrap();
    let cut = tmp.join("cut.qcow2");
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let (ok, text) = upload("cut", &cut);
    assert!(!ok, "{text}");
    assert!(text.contains("invalid qcow2 image"), "{text}");
    assert!(!text.contains("timed out"), "{text}");
}
