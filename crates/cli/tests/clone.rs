//! Host-assisted clones in `cdi dev` with the real controller, upload server and cloner: a claim
//! asking to be a copy of another (`k8s.io/CloneRequest`) gets an upload pod, a source pod in
//! the source's namespace sends the source volume to it, and the copy holds the source's bytes.

mod devcluster;

use std::path::{Path, PathBuf};

use devcluster::{Controller, Down, cdi, get_json, kubectl, wait_for};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// `cdi controller` against the cluster in `dir`, once it has made its CDIConfig.
fn controller(dir: &Path, logs: &Path) -> Controller {
    let c = Controller::start(dir, &logs.join("controller.log"));
    wait_for("the controller's CDIConfig", 60, || {
        get_json(dir, "default", "cdiconfig/config")
    });
    c
}

fn blank_volume(name: &str, ns: &str, mode: &str, size: &str) -> String {
    format!(
        r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {{name: {name}, namespace: {ns}}}
spec:
  source: {{blank: {{}}}}
  pvc:
    storageClassName: csi
    volumeMode: {mode}
    accessModes: [ReadWriteOnce]
    resources: {{requests: {{storage: {size}}}}}
"#
    )
}

fn clone_claim(name: &str, ns: &str, source: &str, mode: &str, size: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}
  namespace: {ns}
  annotations: {{k8s.io/CloneRequest: "{source}"}}
spec:
  storageClassName: csi
  volumeMode: {mode}
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: {size}}}}}
"#
    )
}

/// The file holding a claim's data: the disk image of a Filesystem volume, or the Block volume.
fn volume_file(dir: &Path, ns: &str, claim: &str) -> PathBuf {
    let claim = get_json(dir, ns, &format!("pvc/{claim}")).unwrap();
    let pv = get_json(
        dir,
        ns,
        &format!("pv/{}", claim["spec"]["volumeName"].as_str().unwrap()),
    )
    .unwrap();
    let path = pv["spec"]["hostPath"]["path"]
        .as_str()
        .or(pv["spec"]["csi"]["volumeAttributes"]["path"].as_str())
        .map(PathBuf::from)
        .unwrap();
    if path.is_dir() {
        path.join("disk.img")
    } else {
        path
    }
}

/// Data at a few places of a file that is otherwise holes.
fn scatter(path: &Path) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let len = f.metadata().unwrap().len();
    for (i, at) in [0, 3 * MIB + 17, len - 4096].into_iter().enumerate() {
        f.write_all_at(&vec![i as u8 + 1; 4096], at).unwrap();
    }
    std::fs::read(path).unwrap()
}

fn annotations(v: &Value) -> &serde_json::Map<String, Value> {
    v["metadata"]["annotations"].as_object().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_asking_for_a_copy_gets_the_sources_bytes_across_namespaces_and_modes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let (ok, out, err) = cdi(&["dev", "up", "--addr", "127.0.0.1:0"], &dir);
    assert!(ok, "{out}{err}");
    let _down = Down(&dir);
    let _controller = controller(&dir, tmp.path());
    kubectl(&dir, &["create", "namespace", "golden"], None);
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "{}---{}",
            blank_volume("fs-image", "golden", "Filesystem", "64Mi"),
            blank_volume("block-image", "golden", "Block", "32Mi")
        )),
    );
    for name in ["fs-image", "block-image"] {
        wait_for(&format!("{name} to succeed"), 90, || {
            get_json(&dir, "golden", &format!("dv/{name}"))
                .filter(|d| d["status"]["phase"] == "Succeeded")
        });
    }
    let fs_bytes = scatter(&volume_file(&dir, "golden", "fs-image"));
    let block_bytes = scatter(&volume_file(&dir, "golden", "block-image"));

    // Into another namespace: Filesystem → Filesystem, Filesystem → Block, Block → Filesystem.
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "{}---{}---{}",
            clone_claim(
                "fs-copy",
                "default",
                "golden/fs-image",
                "Filesystem",
                "64Mi"
            ),
            clone_claim("fs-to-block", "default", "golden/fs-image", "Block", "64Mi"),
            clone_claim(
                "block-to-fs",
                "default",
                "golden/block-image",
                "Filesystem",
                "64Mi"
            ),
        )),
    );
    for name in ["fs-copy", "fs-to-block", "block-to-fs"] {
        let claim = wait_for(&format!("{name} to be a copy"), 120, || {
            get_json(&dir, "default", &format!("pvc/{name}"))
                .filter(|c| annotations(c).contains_key("k8s.io/CloneOf"))
        });
        let anns = annotations(&claim);
        assert_eq!(
            anns["cdi.kubevirt.io/storage.pod.phase"], "Succeeded",
            "{name}"
        );
        assert!(
            anns["cdi.kubevirt.io/uploadClientName"]
                .as_str()
                .unwrap()
                .ends_with(&format!("-default/{name}")),
            "{anns:?}"
        );
    }
    let copy = std::fs::read(volume_file(&dir, "default", "fs-copy")).unwrap();
    assert!(copy == fs_bytes, "fs-copy holds the source's bytes");
    let device = std::fs::read(volume_file(&dir, "default", "fs-to-block")).unwrap();
    assert!(
        device[..fs_bytes.len()] == fs_bytes[..],
        "the Block copy starts with the source's disk image"
    );
    let from_block = std::fs::read(volume_file(&dir, "default", "block-to-fs")).unwrap();
    assert!(
        from_block == block_bytes,
        "block-to-fs holds the device's bytes"
    );

    // The source pods and the upload pods go; the events say what happened.
    for name in ["fs-copy", "fs-to-block", "block-to-fs"] {
        let claim = get_json(&dir, "default", &format!("pvc/{name}")).unwrap();
        let source_pod = annotations(&claim)["cdi.kubevirt.io/storage.sourceClonePodName"]
            .as_str()
            .unwrap()
            .to_string();
        wait_for(&format!("the source pod of {name} to go"), 60, || {
            get_json(&dir, "golden", &format!("pod/{source_pod}"))
                .is_none()
                .then_some(())
        });
        wait_for(&format!("{name} to let go of its finalizer"), 60, || {
            get_json(&dir, "default", &format!("pvc/{name}")).filter(|c| {
                let finalizers = c["metadata"]["finalizers"].as_array().cloned();
                !finalizers
                    .unwrap_or_default()
                    .contains(&Value::from("cdi.kubevirt.io/cloneSource"))
            })
        });
        let events = kubectl(
            &dir,
            &[
                "get",
                "events",
                "--field-selector",
                &format!("involvedObject.name={name}"),
                "-o",
                "jsonpath={.items[*].reason}",
            ],
            None,
        );
        assert!(events.contains("CloneSucceeded"), "{name}: {events}");
        assert!(!events.contains("UploadSucceeded"), "{name}: {events}");
    }
}
