//! Host-assisted clones in `cdi dev` with the real controller, upload server and cloner: a claim
//! asking to be a copy of another (`k8s.io/CloneRequest`) gets an upload pod, a source pod in
//! the source's namespace sends the source volume to it, and the copy holds the source's bytes.

mod devcluster;

use std::path::{Path, PathBuf};

use devcluster::{
    Controller, Down, cdi, doctor, find_pod_process, get_json, kubectl, kubectl_as, volume_file,
    wait_for,
};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// `cdi dev` in a temporary directory with `cdi controller` against it, both stopped (the
/// controller first) when dropped.
struct Running {
    controller: Option<Controller>,
    dir: PathBuf,
    tmp: tempfile::TempDir,
}

impl Running {
    fn start() -> Running {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cluster");
        let (ok, out, err) = cdi(&["dev", "up", "--addr", "127.0.0.1:0"], &dir);
        assert!(ok, "{out}{err}");
        // Made before the controller starts, so a failed start still stops the cluster.
        let mut running = Running {
            controller: None,
            dir,
            tmp,
        };
        running.controller = Some(controller(&running.dir, running.tmp.path()));
        running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.controller.take();
        drop(Down(&self.dir));
    }
}

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

/// Blank DataVolumes on the CSI class in `ns` (`(name, volume mode, size)`), once Succeeded,
/// with data scattered over each: the bytes of each, in order.
fn sources(dir: &Path, ns: &str, volumes: &[(&str, &str, &str)]) -> Vec<Vec<u8>> {
    let manifests: Vec<String> = volumes
        .iter()
        .map(|(name, mode, size)| blank_volume(name, ns, mode, size))
        .collect();
    kubectl(dir, &["apply", "-f", "-"], Some(&manifests.join("---")));
    volumes
        .iter()
        .map(|(name, _, _)| {
            wait_for(&format!("{name} to succeed"), 90, || {
                get_json(dir, ns, &format!("dv/{name}"))
                    .filter(|d| d["status"]["phase"] == "Succeeded")
            });
            scatter(&volume_file(dir, ns, name))
        })
        .collect()
}

/// A DataVolume in `default` cloning claim `default/source` onto `class`, of `mode`, sized
/// `size` or (none) from the source.
fn clone_of(name: &str, source: &str, class: &str, mode: &str, size: Option<&str>) -> String {
    let resources = size
        .map(|s| format!(", resources: {{requests: {{storage: {s}}}}}"))
        .unwrap_or_default();
    format!(
        "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {{name: {name}}}\nspec:\n  source: {{pvc: {{namespace: default, name: {source}}}}}\n  storage: {{storageClassName: {class}, volumeMode: {mode}, accessModes: [ReadWriteOnce]{resources}}}\n"
    )
}

/// A storage quantity as kubectl shows it (`NNMi` or plain bytes), in bytes.
fn quantity_bytes(q: &Value) -> u64 {
    let q = q.as_str().unwrap();
    match q.strip_suffix("Mi") {
        Some(n) => n.parse::<u64>().unwrap() * MIB,
        None => q.parse::<u64>().unwrap(),
    }
}

fn annotations(v: &Value) -> &serde_json::Map<String, Value> {
    v["metadata"]["annotations"].as_object().unwrap()
}

/// The reasons of the events on `name` in `ns`.
fn event_reasons(dir: &Path, ns: &str, name: &str) -> String {
    kubectl(
        dir,
        &[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            &format!("involvedObject.name={name}"),
            "-o",
            "jsonpath={.items[*].reason}",
        ],
        None,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_asking_for_a_copy_gets_the_sources_bytes_across_modes() {
    let cluster = Running::start();
    let dir = cluster.dir.clone();
    kubectl(&dir, &["create", "namespace", "golden"], None);
    let [fs_bytes, block_bytes] = sources(
        &dir,
        "golden",
        &[
            ("fs-image", "Filesystem", "64Mi"),
            ("block-image", "Block", "32Mi"),
        ],
    )
    .try_into()
    .unwrap();

    // Filesystem → Filesystem, Filesystem → Block, Block → Filesystem; and a claim in another
    // namespace asking for a copy, refused.
    let copies = [
        ("fs-copy", "golden/fs-image", "Filesystem"),
        ("fs-to-block", "golden/fs-image", "Block"),
        ("block-to-fs", "golden/block-image", "Filesystem"),
    ];
    let mut manifests: Vec<String> = copies
        .iter()
        .map(|(name, source, mode)| clone_claim(name, "golden", source, mode, "64Mi"))
        .collect();
    manifests.push(clone_claim(
        "stolen",
        "default",
        "golden/fs-image",
        "Filesystem",
        "64Mi",
    ));
    kubectl(&dir, &["apply", "-f", "-"], Some(&manifests.join("---")));
    for (name, _, _) in copies {
        let claim = wait_for(&format!("{name} to be a copy"), 120, || {
            get_json(&dir, "golden", &format!("pvc/{name}"))
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
                .ends_with(&format!("-golden/{name}")),
            "{anns:?}"
        );
    }
    let read = |name: &str| std::fs::read(volume_file(&dir, "golden", name)).unwrap();
    assert!(
        read("fs-copy") == fs_bytes,
        "fs-copy holds the source's bytes"
    );
    assert!(
        read("fs-to-block")[..fs_bytes.len()] == fs_bytes[..],
        "the Block copy starts with the source's disk image"
    );
    assert!(
        read("block-to-fs") == block_bytes,
        "block-to-fs holds the device's bytes"
    );

    // The source pods go, and so does the finalizer; the events say what happened.
    for (name, _, _) in copies {
        let claim = get_json(&dir, "golden", &format!("pvc/{name}")).unwrap();
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
            get_json(&dir, "golden", &format!("pvc/{name}")).filter(|c| {
                let finalizers = c["metadata"]["finalizers"].as_array().cloned();
                !finalizers
                    .unwrap_or_default()
                    .contains(&Value::from("cdi.kubevirt.io/cloneSource"))
            })
        });
        let events = event_reasons(&dir, "golden", name);
        assert!(events.contains("CloneSucceeded"), "{name}: {events}");
        assert!(!events.contains("UploadSucceeded"), "{name}: {events}");
    }
    // The claim of another namespace is told why, and no pod was made for it.
    wait_for("the cross-namespace claim to be refused", 60, || {
        event_reasons(&dir, "default", "stolen")
            .contains("CloneNotAuthorized")
            .then_some(())
    });
    let stolen = get_json(&dir, "default", "pvc/stolen").unwrap();
    assert!(!annotations(&stolen).contains_key("cdi.kubevirt.io/storage.uploadPodName"));
    let pods = kubectl(&dir, &["get", "pods", "-A", "-o", "name"], None);
    assert!(!pods.contains("cdi-upload-stolen"), "{pods}");

    // A DataVolume cloning a claim of its namespace on a class no CSI driver serves (the
    // host-assisted copy onto its own claim), with no size of its own: the source's. One in
    // another namespace is refused before anything is made.
    let dv = |name: &str, ns: &str| {
        format!(
            r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {{name: {name}, namespace: {ns}}}
spec:
  source: {{pvc: {{namespace: golden, name: fs-image}}}}
  storage: {{storageClassName: local-path, accessModes: [ReadWriteOnce]}}
"#
        )
    };
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "{}---{}",
            dv("vm-disk", "golden"),
            dv("elsewhere", "default")
        )),
    );
    let done = wait_for("the clone DataVolume to succeed", 120, || {
        get_json(&dir, "golden", "dv/vm-disk").filter(|d| d["status"]["phase"] == "Succeeded")
    });
    assert_eq!(done["status"]["progress"], "100.0%");
    let claim = get_json(&dir, "golden", "pvc/vm-disk").unwrap();
    assert_eq!(
        annotations(&claim)["k8s.io/CloneRequest"],
        "golden/fs-image"
    );
    assert!(
        read("vm-disk") == fs_bytes,
        "vm-disk holds the source's disk image"
    );
    let events = kubectl(
        &dir,
        &[
            "get",
            "events",
            "-n",
            "golden",
            "--field-selector",
            "involvedObject.name=vm-disk,involvedObject.kind=DataVolume",
            "-o",
            "jsonpath={.items[*].message}",
        ],
        None,
    );
    assert!(
        events.contains("Successfully cloned from golden/fs-image into golden/vm-disk"),
        "{events}"
    );
    let elsewhere = wait_for("the cross-namespace DataVolume to be refused", 60, || {
        get_json(&dir, "default", "dv/elsewhere").filter(|d| {
            d["status"]["conditions"]
                .to_string()
                .contains("from another namespace, and it has no clone token")
        })
    });
    assert_eq!(elsewhere["status"]["phase"], "Pending");
    assert!(get_json(&dir, "default", "pvc/elsewhere").is_none());
}

/// The DataVolume `default/name` once its condition `kind` has `reason`.
fn with_condition(dir: &Path, name: &str, kind: &str, reason: &str) -> Value {
    wait_for(&format!("DataVolume {name} to say {reason}"), 60, || {
        get_json(dir, "default", &format!("dv/{name}")).filter(|d| {
            d["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == kind && c["reason"] == reason)
        })
    })
}

/// A clone of a source not there yet waits for it, saying so; one too small for its source says
/// that instead of making a claim.
#[tokio::test(flavor = "multi_thread")]
async fn a_clone_of_a_missing_source_waits_and_says_so() {
    let cluster = Running::start();
    let dir = cluster.dir.clone();
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {name: early}
spec:
  source: {pvc: {namespace: default, name: later}}
  storage: {storageClassName: local-path, accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}
"#,
        ),
    );
    let dv = with_condition(&dir, "early", "Running", "CloneWithoutSource");
    assert_eq!(dv["status"]["phase"], "Pending");
    assert!(
        get_json(&dir, "default", "pvc/early").is_none(),
        "no claim before the source"
    );
    let d = doctor(&dir, &["early", "-n", "default"]);
    assert_eq!(d["cause"], "SourceNotReady", "{d}");
    assert_eq!(
        d["summary"], "waits for source PVC default/later (deleted or not yet created)",
        "{d}"
    );
    // Once the source is there, the clone goes ahead.
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&blank_volume("later", "default", "Filesystem", "32Mi")),
    );
    wait_for("the clone to succeed once its source exists", 120, || {
        get_json(&dir, "default", "dv/early").filter(|d| d["status"]["phase"] == "Succeeded")
    });
    // A clone too small for what its source holds makes no claim that would wait for ever:
    // the DataVolume stays Pending and says why in its conditions (upstream's validateClone).
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {name: too-small}
spec:
  source: {pvc: {namespace: default, name: later}}
  storage: {storageClassName: local-path, accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}
"#,
        ),
    );
    let dv = with_condition(&dir, "too-small", "Running", "CloneValidationFailed");
    assert_eq!(dv["status"]["phase"], "Pending");
    let said = dv["status"]["conditions"].to_string();
    assert!(
        said.contains(
            "The clone doesn't meet the validation requirements: target resources requests \
             storage size is smaller than the source"
        ),
        "{said}"
    );
    assert!(get_json(&dir, "default", "pvc/too-small").is_none());
    wait_for("the refusal's event", 30, || {
        event_reasons(&dir, "default", "too-small")
            .contains("CloneValidationFailed")
            .then_some(())
    });
}

/// The clone DataVolume `name` of claim `golden` on the CSI class.
fn csi_clone_volume(name: &str) -> String {
    format!(
        r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {{name: {name}}}
spec:
  source: {{pvc: {{namespace: default, name: golden}}}}
  storage: {{storageClassName: csi, accessModes: [ReadWriteOnce]}}
"#
    )
}

/// Wait for the clone DataVolume `name` to succeed by `strategy`; check its bytes, that the
/// temporary objects and the finalizer are gone, and the DataVolume's events.
fn assert_cloned(dir: &Path, name: &str, strategy: &str, bytes: &[u8], phases: &[&str]) {
    let dv = wait_for(&format!("{name} to succeed"), 120, || {
        get_json(dir, "default", &format!("dv/{name}"))
            .filter(|d| d["status"]["phase"] == "Succeeded")
    });
    assert_eq!(dv["status"]["progress"], "100.0%");
    let claim = get_json(dir, "default", &format!("pvc/{name}")).unwrap();
    let anns = annotations(&claim);
    assert_eq!(anns["cdi.kubevirt.io/cloneType"], strategy, "{name}");
    assert_eq!(anns["cdi.kubevirt.io/clonePhase"], "Succeeded", "{name}");
    assert_eq!(claim["spec"]["dataSourceRef"]["kind"], "VolumeCloneSource");
    let copy = std::fs::read(volume_file(dir, "default", name)).unwrap();
    assert!(
        copy[..bytes.len()] == bytes[..],
        "{name} holds the source's disk image"
    );
    let uid = claim["metadata"]["uid"].as_str().unwrap().to_string();
    wait_for(
        &format!("the temporary objects of {name} to go"),
        60,
        || {
            let gone = get_json(dir, "default", &format!("pvc/tmp-pvc-{uid}")).is_none()
                && get_json(
                    dir,
                    "default",
                    &format!("volumesnapshot/tmp-snapshot-{uid}"),
                )
                .is_none()
                && get_json(dir, "default", &format!("pod/prep-{uid}")).is_none();
            let released = get_json(dir, "default", &format!("pvc/{name}")).is_some_and(|c| {
                !c["metadata"]["finalizers"]
                    .to_string()
                    .contains("cdi.kubevirt.io/clonePopulator")
            });
            (gone && released).then_some(())
        },
    );
    let events = kubectl(
        dir,
        &[
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={name},involvedObject.kind=DataVolume"),
            "-o",
            "jsonpath={.items[*].reason}",
        ],
        None,
    );
    for reason in phases {
        assert!(events.contains(reason), "{name}: {reason} in {events}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_clone_populator_clones_by_snapshot_csi_clone_and_copy() {
    let cluster = Running::start();
    let dir = cluster.dir.clone();
    let bytes = sources(&dir, "default", &[("golden", "Filesystem", "64Mi")]).remove(0);

    // The CSI class has a VolumeSnapshotClass: the default strategy, snapshot (a snapshot of the
    // source restored into tmp-pvc-<uid>, whose volume the target takes over).
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&csi_clone_volume("by-snapshot")),
    );
    assert_cloned(
        &dir,
        "by-snapshot",
        "snapshot",
        &bytes,
        &["CloneScheduled", "CloneSucceeded"],
    );

    // The profile says csi-clone, then copy: the driver's clone, then the host-assisted copy.
    for (strategy, name, phases) in [
        (
            "csi-clone",
            "by-csi-clone",
            &["CloneScheduled", "CloneSucceeded"][..],
        ),
        (
            "copy",
            "by-copy",
            &["CloneScheduled", "CloneInProgress", "CloneSucceeded"][..],
        ),
    ] {
        devcluster::set_clone_strategy(&dir, strategy);
        kubectl(&dir, &["apply", "-f", "-"], Some(&csi_clone_volume(name)));
        assert_cloned(&dir, name, strategy, &bytes, phases);
    }
}

/// The Ready condition of DataSource `name`: (status, reason, message).
fn data_source_ready(dir: &Path, name: &str) -> Option<(String, String, String)> {
    let ds = get_json(dir, "default", &format!("datasource/{name}"))?;
    let c = ds["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?
        .clone();
    let text = |k: &str| c[k].as_str().unwrap_or("").to_string();
    Some((text("status"), text("reason"), text("message")))
}

#[tokio::test(flavor = "multi_thread")]
async fn data_sources_say_when_they_are_ready_and_source_refs_clone_what_they_name() {
    let cluster = Running::start();
    let dir = cluster.dir.clone();
    let data_source = |name: &str, source: &str| {
        format!(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataSource\nmetadata: {{name: {name}}}\nspec:\n  source: {source}\n"
        )
    };
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            &[
                data_source("fedora", "{pvc: {namespace: default, name: f40}}"),
                data_source("latest", "{dataSource: {namespace: default, name: fedora}}"),
                data_source("itself", "{dataSource: {namespace: default, name: itself}}"),
            ]
            .join("---\n"),
        ),
    );
    // Before the image exists: not ready, and a DataVolume naming it waits.
    wait_for("fedora to say its claim is missing", 60, || {
        data_source_ready(&dir, "fedora").filter(|r| r.1 == "NotFound" && r.2 == "PVC not found")
    });
    wait_for("a self reference to be told", 60, || {
        data_source_ready(&dir, "itself").filter(|r| r.1 == "SelfReference")
    });
    let vm_disk = |name: &str, ds: &str| {
        format!(
            r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {{name: {name}}}
spec:
  sourceRef: {{kind: DataSource, name: {ds}}}
  storage: {{storageClassName: local-path, accessModes: [ReadWriteOnce]}}
"#
        )
    };
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&vm_disk("no-such", "nope")),
    );
    let waiting = wait_for(
        "a DataVolume naming a missing DataSource to say so",
        60,
        || {
            get_json(&dir, "default", "dv/no-such").filter(|d| {
                d["status"]["conditions"]
                    .to_string()
                    .contains("DataSource default/nope not found")
            })
        },
    );
    assert_eq!(waiting["status"]["phase"], "Pending");

    // The image: a DataVolume labelled with the instance type KubeVirt should infer.
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: f40
  labels: {instancetype.kubevirt.io/default-preference: fedora}
spec:
  source: {blank: {}}
  storage: {storageClassName: csi, accessModes: [ReadWriteOnce], resources: {requests: {storage: 32Mi}}}
"#,
        ),
    );
    for name in ["fedora", "latest"] {
        wait_for(&format!("{name} to be ready"), 90, || {
            data_source_ready(&dir, name).filter(|r| {
                r == &(
                    "True".to_string(),
                    "Ready".to_string(),
                    "DataSource is ready to be consumed".to_string(),
                )
            })
        });
    }
    let latest = get_json(&dir, "default", "datasource/latest").unwrap();
    assert_eq!(latest["status"]["source"]["pvc"]["name"], "f40");
    let fedora = get_json(&dir, "default", "datasource/fedora").unwrap();
    assert_eq!(
        fedora["metadata"]["labels"]["instancetype.kubevirt.io/default-preference"],
        "fedora"
    );
    let bytes = scatter(&volume_file(&dir, "default", "f40"));

    // A DataVolume through the chained DataSource clones the image.
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&vm_disk("vm-root", "latest")),
    );
    wait_for("the sourceRef clone to succeed", 120, || {
        get_json(&dir, "default", "dv/vm-root").filter(|d| d["status"]["phase"] == "Succeeded")
    });
    let claim = get_json(&dir, "default", "pvc/vm-root").unwrap();
    assert_eq!(annotations(&claim)["k8s.io/CloneRequest"], "default/f40");
    let copy = std::fs::read(volume_file(&dir, "default", "vm-root")).unwrap();
    assert!(copy == bytes, "vm-root holds the image");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_source_in_use_is_waited_for_and_copies_stay_sparse_in_larger_targets() {
    let cluster = Running::start();
    let dir = cluster.dir.clone();
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&blank_volume("dev", "default", "Block", "32Mi")),
    );
    wait_for("the source to succeed", 90, || {
        get_json(&dir, "default", "dv/dev").filter(|d| d["status"]["phase"] == "Succeeded")
    });
    let bytes = scatter(&volume_file(&dir, "default", "dev"));
    // A pod writes the source: the copy waits for it.
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            r#"
apiVersion: v1
kind: Pod
metadata: {name: writer}
spec:
  containers:
  - name: c
    image: cdi-importer
    command: [/bin/sh, -c, "sleep 600"]
    volumeDevices: [{name: v, devicePath: /dev/disk}]
  volumes: [{name: v, persistentVolumeClaim: {claimName: dev}}]
"#,
        ),
    );
    wait_for("the writer to run", 60, || {
        get_json(&dir, "default", "pod/writer").filter(|p| p["status"]["phase"] == "Running")
    });
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            &[
                clone_claim("bigger", "default", "default/dev", "Block", "64Mi"),
                clone_claim("as-file", "default", "default/dev", "Filesystem", "128Mi"),
            ]
            .join("---"),
        ),
    );
    wait_for("the copy to wait for the writer", 60, || {
        event_reasons(&dir, "default", "bigger")
            .contains("CloneSourceInUse")
            .then_some(())
    });
    let waiting = get_json(&dir, "default", "pvc/bigger").unwrap();
    assert!(!annotations(&waiting).contains_key("k8s.io/CloneOf"));
    kubectl(&dir, &["delete", "pod", "writer", "--wait=false"], None);
    for name in ["bigger", "as-file"] {
        wait_for(&format!("{name} to be a copy"), 120, || {
            get_json(&dir, "default", &format!("pvc/{name}"))
                .filter(|c| annotations(c).contains_key("k8s.io/CloneOf"))
        });
    }
    // Block → Block into a larger device: the source's bytes first.
    let device = std::fs::read(volume_file(&dir, "default", "bigger")).unwrap();
    assert!(device.len() >= bytes.len());
    assert!(
        device[..bytes.len()] == bytes[..],
        "the larger device starts with the source"
    );
    // Block → Filesystem: the device's bytes as disk.img, its holes still holes.
    let file = volume_file(&dir, "default", "as-file");
    assert!(std::fs::read(&file).unwrap() == bytes);
    use std::os::unix::fs::MetadataExt;
    let allocated = std::fs::metadata(&file).unwrap().blocks() * 512;
    assert!(
        allocated < 4 * MIB,
        "{allocated} bytes allocated for 12 KiB of data"
    );
}

fn clone_volume(name: &str, ns: &str, source: (&str, &str), class: &str) -> String {
    format!(
        r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {{name: {name}, namespace: {ns}}}
spec:
  source: {{pvc: {{namespace: {}, name: {}}}}}
  storage: {{storageClassName: {class}, accessModes: [ReadWriteOnce]}}
"#,
        source.0, source.1
    )
}

/// With CDI installed in the cluster (its DataVolume admission webhook on), a clone from another
/// namespace is admitted only for a creator who may read that namespace's volumes, and then
/// copies; a clone within a namespace needs nothing more; a claim holding a token that is not
/// its own reads nothing. The validating webhook refuses what upstream's refuses.
#[tokio::test(flavor = "multi_thread")]
async fn a_clone_from_another_namespace_needs_the_right_to_read_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let (ok, out, err) = cdi(&["dev", "up", "--addr", "127.0.0.1:0", "--cdi"], &dir);
    assert!(ok, "{out}{err}");
    let _down = Down(&dir);
    for d in ["cdi-deployment", "cdi-apiserver"] {
        let out = kubectl(
            &dir,
            &[
                "rollout",
                "status",
                "-n",
                "cdi",
                &format!("deployment/{d}"),
                "--timeout=180s",
            ],
            None,
        );
        assert!(out.contains("successfully rolled out"), "{out}");
    }
    // The example CDI resource honours WaitForFirstConsumer; these volumes have no consumer.
    devcluster::set_feature_gates(&dir, "[]");
    wait_for("the DataVolume webhook to be registered", 60, || {
        get_json(
            &dir,
            "",
            "mutatingwebhookconfiguration/cdi-api-datavolume-mutate",
        )
    });
    for ns in ["golden", "vms"] {
        kubectl(&dir, &["create", "namespace", ns], None);
    }
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&blank_volume("image", "golden", "Filesystem", "64Mi")),
    );
    wait_for("the golden image to succeed", 120, || {
        get_json(&dir, "golden", "dv/image").filter(|d| d["status"]["phase"] == "Succeeded")
    });
    let image = scatter(&volume_file(&dir, "golden", "image"));

    // Upstream's validating webhook: a DataVolume it refuses is refused at apply time, in its
    // words, and a DataVolume's spec cannot change.
    wait_for("the validating webhook to be registered", 60, || {
        get_json(
            &dir,
            "",
            "validatingwebhookconfiguration/cdi-api-datavolume-validate",
        )
    });
    let admin = dir.join("kubeconfig");
    let err = refused_apply(
        &admin,
        "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {name: no-claim, namespace: golden}\nspec: {source: {http: {url: \"ftp://images/disk.img\"}}}\n",
    );
    assert!(
        err.contains(
            "admission webhook \"datavolume-validate.cdi.kubevirt.io\" denied the request:  \
             Missing Data volume PVC"
        ),
        "{err}"
    );
    // As kube passes the webhook's Status on: no reason of its own, so kubectl names none.
    assert!(err.starts_with("Error from server: "), "{err}");
    let (ok, out, err) = kubectl_as(
        &admin,
        &[
            "patch",
            "-n",
            "golden",
            "dv/image",
            "--type=merge",
            "-p",
            r#"{"spec":{"contentType":"archive"}}"#,
        ],
        None,
    );
    assert!(!ok, "{out}");
    assert!(err.contains("Cannot update DataVolume Spec"), "{err}");
    // An externally populated DataVolume names every part of its reference that is missing.
    let err = refused_apply(
        &admin,
        "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {name: external, namespace: golden}\nspec: {storage: {resources: {requests: {storage: 1Gi}}, dataSourceRef: {kind: Blob, name: b}}}\n",
    );
    assert!(
        err.contains(
            "Required value: DataSourceRef apiGroup when kind is not 'PersistentVolumeClaim'"
        ),
        "{err}"
    );
    // A claim labelled cdi.kubevirt.io/applyStorageProfile is rendered from its profile: its
    // size grows by the filesystem overhead as spec.storage's does, and one that leaves out
    // what the profile does not know is refused, saying so.
    wait_for("the PVC rendering webhook to be registered", 60, || {
        get_json(&dir, "", "mutatingwebhookconfiguration/cdi-api-pvc-mutate")
    });
    let rendered = |name: &str, modes: &str| {
        format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: golden, labels: {{cdi.kubevirt.io/applyStorageProfile: \"true\"}}}}\nspec: {{storageClassName: local-path,{modes} resources: {{requests: {{storage: 1Gi}}}}}}\n"
        )
    };
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&rendered("rendered", " accessModes: [ReadWriteOnce],")),
    );
    let claim = get_json(&dir, "golden", "pvc/rendered").unwrap();
    assert_eq!(
        claim["spec"]["resources"]["requests"]["storage"],
        "1138166334"
    );
    kubectl(&dir, &["delete", "-n", "golden", "pvc/rendered"], None);
    let err = refused_apply(&admin, &rendered("unrendered", ""));
    assert!(
        err.contains(
            "admission webhook \"pvc-mutate.cdi.kubevirt.io\" denied the request: StorageProfile \
             local-path has no claimPropertySets: set spec.accessModes in PersistentVolumeClaim \
             golden/unrendered"
        ),
        "{err}"
    );
    // cdi-rs's own annotations: a first-consumer template that is none is refused when set,
    // with the fix.
    let (ok, out, err) = kubectl_as(
        &admin,
        &[
            "annotate",
            "-n",
            "golden",
            "dv/image",
            "cdi-rs.dev/first-consumer=nodeName: node-1",
        ],
        None,
    );
    assert!(!ok, "{out}");
    assert!(
        err.contains(
            "the cdi-rs.dev/first-consumer annotation of DataVolume golden/image is not a pod \
             scheduling template"
        ) && err.contains("write a YAML or JSON mapping of nodeSelector"),
        "{err}"
    );
    wait_for("the DataImportCron webhook to be registered", 60, || {
        get_json(
            &dir,
            "",
            "validatingwebhookconfiguration/cdi-api-dataimportcron-validate",
        )
    });
    let err = refused_apply(
        &admin,
        "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataImportCron\nmetadata: {name: fedora, namespace: golden}\nspec:\n  schedule: \"every day\"\n  managedDataSource: fedora\n  template: {spec: {source: {registry: {url: \"docker://quay.io/containerdisks/fedora:41\"}}, storage: {resources: {requests: {storage: 5Gi}}}}}\n",
    );
    assert!(
        err.contains(
            "admission webhook \"dataimportcron-validate.cdi.kubevirt.io\" denied the request:  \
             Illegal cron schedule"
        ),
        "{err}"
    );
    wait_for("the populator webhook to be registered", 60, || {
        get_json(
            &dir,
            "",
            "validatingwebhookconfiguration/cdi-api-populator-validate",
        )
    });
    let err = refused_apply(
        &admin,
        "apiVersion: cdi.kubevirt.io/v1beta1\nkind: VolumeImportSource\nmetadata: {name: nothing, namespace: golden}\nspec: {contentType: kubevirt}\n",
    );
    assert!(err.contains("Missing VolumeImport source"), "{err}");
    // A claim of the name that is not the DataVolume's to take.
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: taken, namespace: golden}\nspec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n",
        ),
    );
    let err = refused_apply(
        &admin,
        &blank_volume("taken", "golden", "Filesystem", "64Mi"),
    );
    assert!(
        err.contains("Destination PVC golden/taken already exists"),
        "{err}"
    );

    // Alice edits namespace vms only.
    let (ok, config, err) = cdi(&["dev", "kubeconfig", "--user", "alice"], &dir);
    assert!(ok, "{err}");
    let alice = tmp.path().join("alice");
    std::fs::write(&alice, config).unwrap();
    kubectl(
        &dir,
        &[
            "create",
            "rolebinding",
            "alice-edits",
            "-n",
            "vms",
            "--clusterrole=edit",
            "--user=alice",
        ],
        None,
    );
    let apply = |manifest: &str| kubectl_as(&alice, &["apply", "-f", "-"], Some(manifest));
    let (ok, out, err) = apply(&clone_volume(
        "stolen",
        "vms",
        ("golden", "image"),
        "local-path",
    ));
    assert!(!ok, "{out}");
    assert!(
        err.contains(
            "admission webhook \"datavolume-mutate.cdi.kubevirt.io\" denied the request: User \
             alice has insufficient permissions in clone source namespace golden"
        ),
        "{err}"
    );
    assert!(get_json(&dir, "vms", "dv/stolen").is_none());
    // The same through a DataSource of golden.
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataSource\nmetadata: {name: image, namespace: golden}\nspec: {source: {pvc: {namespace: golden, name: image}}}\n",
        ),
    );
    let referenced = |name: &str| {
        format!(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {{name: {name}, namespace: vms}}\nspec:\n  sourceRef: {{kind: DataSource, namespace: golden, name: image}}\n  storage: {{storageClassName: local-path, accessModes: [ReadWriteOnce]}}\n"
        )
    };
    let (ok, out, err) = apply(&referenced("stolen-by-ref"));
    assert!(!ok, "{out}");
    assert!(
        err.contains("User alice has insufficient permissions in clone source namespace golden"),
        "{err}"
    );

    // Within her namespace she needs nothing more.
    let (ok, out, err) = apply(&format!(
        "{}---{}",
        blank_volume("own", "vms", "Filesystem", "32Mi"),
        clone_volume("own-copy", "vms", ("vms", "own"), "local-path")
    ));
    assert!(ok, "{out}{err}");

    // Allowed to read golden's volumes, she clones them: a host-assisted copy and, on the CSI
    // class, through the clone populator.
    kubectl(
        &dir,
        &[
            "create",
            "rolebinding",
            "alice-clones",
            "-n",
            "golden",
            "--clusterrole=cdi.kubevirt.io:clone-sourcer",
            "--user=alice",
        ],
        None,
    );
    let (ok, out, err) = apply(&format!(
        "{}---{}",
        clone_volume("copied", "vms", ("golden", "image"), "local-path"),
        clone_volume("populated", "vms", ("golden", "image"), "csi")
    ));
    assert!(ok, "{out}{err}");
    let (ok, out, err) = apply(&referenced("by-ref"));
    assert!(ok, "{out}{err}");
    for name in ["own-copy", "copied", "populated", "by-ref"] {
        wait_for(&format!("{name} to succeed"), 180, || {
            get_json(&dir, "vms", &format!("dv/{name}"))
                .filter(|d| d["status"]["phase"] == "Succeeded")
        });
    }
    for name in ["copied", "populated", "by-ref"] {
        assert!(
            std::fs::read(volume_file(&dir, "vms", name)).unwrap() == image,
            "{name} holds the golden image"
        );
    }
    let populated = get_json(&dir, "vms", "dv/populated").unwrap();
    assert_eq!(
        annotations(&populated)["cdi.kubevirt.io/storage.usePopulator"],
        "true"
    );
    // The short token was swapped for one bound to the DataVolume, and the copy's claim has
    // its own.
    let copied = get_json(&dir, "vms", "dv/copied").unwrap();
    let long = annotations(&copied)["cdi.kubevirt.io/storage.extended.clone.token"]
        .as_str()
        .unwrap()
        .to_string();
    let claim = get_json(&dir, "vms", "pvc/copied").unwrap();
    let claim_token = annotations(&claim)["cdi.kubevirt.io/storage.extended.clone.token"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(long, claim_token);

    // A claim made by hand in vms, holding the copy's token, reads nothing.
    let forged = format!(
        r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: forged
  namespace: vms
  annotations:
    k8s.io/CloneRequest: golden/image
    cdi.kubevirt.io/storage.extended.clone.token: "{claim_token}"
spec:
  storageClassName: csi
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 64Mi}}}}
"#
    );
    kubectl(&dir, &["apply", "-f", "-"], Some(&forged));
    let refused = wait_for("the forged claim to be refused", 60, || {
        let said = kubectl(
            &dir,
            &[
                "get",
                "events",
                "-n",
                "vms",
                "--field-selector",
                "involvedObject.name=forged,reason=CloneNotAuthorized",
                "-o",
                "jsonpath={.items[*].message}",
            ],
            None,
        );
        (!said.is_empty()).then_some(said)
    });
    assert!(refused.contains("its clone token is refused"), "{refused}");
    let forged = get_json(&dir, "vms", "pvc/forged").unwrap();
    let uid = forged["metadata"]["uid"].as_str().unwrap();
    let pods = kubectl(&dir, &["get", "pods", "-A", "-o", "name"], None);
    assert!(
        !pods.contains(uid),
        "no source pod for the forged claim: {pods}"
    );
    assert!(!pods.contains("cdi-upload-forged"), "{pods}");

    // What a clone makes in the source's namespace cannot be owned by its DataVolume: it is
    // deleted once the clone succeeded, or when the DataVolume goes first, and the DataVolume
    // holds its finalizer until then.
    const FINALIZER: &str = "cdi.kubevirt.io/dataVolumeFinalizer";
    let holds = |dv: &Value| dv["metadata"]["finalizers"].to_string().contains(FINALIZER);
    let uid = |dv: &Value| dv["metadata"]["uid"].as_str().unwrap().to_string();
    let done = wait_for("populated to let go of its finalizer", 60, || {
        get_json(&dir, "vms", "dv/populated").filter(|d| !holds(d))
    });
    let clone_source = |uid: &str| format!("volumeclonesource/volume-clone-source-{uid}");
    assert!(get_json(&dir, "golden", &clone_source(&uid(&done))).is_none());
    // Clones that wait for their first consumer, deleted before they start.
    devcluster::set_feature_gates(&dir, r#"["HonorWaitForFirstConsumer"]"#);
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: image, namespace: golden}
spec: {volumeSnapshotClassName: csi-snapclass, source: {persistentVolumeClaimName: image}}
",
        ),
    );
    let from_snapshot = r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {name: waits-for-a-copy, namespace: vms}
spec:
  source: {snapshot: {namespace: golden, name: image}}
  storage: {storageClassName: local-path, accessModes: [ReadWriteOnce]}
"#;
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "{}---{from_snapshot}",
            clone_volume("waits-to-populate", "vms", ("golden", "image"), "csi")
        )),
    );
    let waiting = |name: &str, phase: &str| {
        wait_for(&format!("{name} to wait for a consumer"), 90, || {
            get_json(&dir, "vms", &format!("dv/{name}"))
                .filter(|d| d["status"]["phase"] == phase && holds(d))
        })
    };
    let populating = uid(&waiting("waits-to-populate", "PendingPopulation"));
    let copying = uid(&waiting("waits-for-a-copy", "WaitForFirstConsumer"));
    let restored = format!("pvc/{copying}-host-assisted-source-pvc");
    assert!(get_json(&dir, "golden", &clone_source(&populating)).is_some());
    assert!(get_json(&dir, "golden", &restored).is_some());
    let out = kubectl(
        &dir,
        &[
            "delete",
            "dv",
            "-n",
            "vms",
            "waits-to-populate",
            "waits-for-a-copy",
            "--timeout=60s",
        ],
        None,
    );
    assert!(out.contains("deleted"), "{out}");
    for name in ["waits-to-populate", "waits-for-a-copy"] {
        assert!(get_json(&dir, "vms", &format!("dv/{name}")).is_none());
    }
    assert!(get_json(&dir, "golden", &clone_source(&populating)).is_none());
    wait_for("the restored claim to go with its DataVolume", 30, || {
        get_json(&dir, "golden", &restored).is_none().then_some(())
    });
}

fn snapshot_volume(name: &str, snapshot: &str, class: &str, size: Option<&str>) -> String {
    let resources = size
        .map(|s| format!(", resources: {{requests: {{storage: {s}}}}}"))
        .unwrap_or_default();
    format!(
        r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {{name: {name}}}
spec:
  source: {{snapshot: {{namespace: default, name: {snapshot}}}}}
  storage: {{storageClassName: {class}, accessModes: [ReadWriteOnce]{resources}}}
"#
    )
}

/// A DataVolume from a VolumeSnapshot (`source.snapshot`, and a DataSource naming one): waits
/// for the snapshot, sizes from its restoreSize, is restored by the driver into the clone
/// populator's temporary claim and handed over; onto a class of no CSI driver the snapshot is
/// restored into a claim of its driver's class and copied host-assisted.
#[tokio::test(flavor = "multi_thread")]
async fn a_data_volume_is_restored_from_a_snapshot() {
    let cluster = Running::start();
    let dir = cluster.dir.clone();
    // A DataVolume of a snapshot not taken yet waits for it.
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "{}---{}",
            blank_volume("golden", "default", "Filesystem", "64Mi"),
            snapshot_volume("restored", "golden-snap", "csi", None)
        )),
    );
    wait_for("the restore to wait for its snapshot", 60, || {
        get_json(&dir, "default", "dv/restored").filter(|d| {
            d["status"]["conditions"]
                .to_string()
                .contains("The source snapshot default/golden-snap doesn't exist")
        })
    });
    wait_for("the source to succeed", 90, || {
        get_json(&dir, "default", "dv/golden").filter(|d| d["status"]["phase"] == "Succeeded")
    });
    let bytes = scatter(&volume_file(&dir, "default", "golden"));
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            r#"
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: golden-snap}
spec:
  volumeSnapshotClassName: csi-snapclass
  source: {persistentVolumeClaimName: golden}
---
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataSource
metadata: {name: golden-snap}
spec: {source: {snapshot: {namespace: default, name: golden-snap}}}
"#,
        ),
    );
    // Sized from the snapshot; one larger than it; one through the DataSource; one onto a class
    // the snapshot's driver does not serve.
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "{}---{}---{}",
            snapshot_volume("restored-larger", "golden-snap", "csi", Some("128Mi")),
            snapshot_volume("on-local-path", "golden-snap", "local-path", None),
            r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {name: by-ref}
spec:
  sourceRef: {kind: DataSource, name: golden-snap}
  storage: {storageClassName: csi, accessModes: [ReadWriteOnce]}
"#
        )),
    );
    for name in ["restored", "restored-larger", "by-ref"] {
        assert_cloned(
            &dir,
            name,
            "snapshot",
            &bytes,
            // The restore itself can be over before the DataVolume looks again: its phase
            // (CloneFromSnapshotSourceInProgress) is not always seen.
            &["CloneScheduled", "CloneSucceeded"],
        );
    }
    let restored = get_json(&dir, "default", "pvc/restored").unwrap();
    let larger = get_json(&dir, "default", "pvc/restored-larger").unwrap();
    let source = get_json(&dir, "default", "pvc/golden").unwrap();
    // Sized from the snapshot's restoreSize (the source's 64Mi), with the filesystem overhead
    // of a spec.storage request on top, as a claim clone is.
    let asked = quantity_bytes(&restored["spec"]["resources"]["requests"]["storage"]);
    let had = quantity_bytes(&source["status"]["capacity"]["storage"]);
    assert!(asked > had && asked < had + had / 5, "{asked} for {had}");
    assert!(quantity_bytes(&larger["spec"]["resources"]["requests"]["storage"]) > 128 * MIB);
    // The snapshot is the user's: it stays.
    assert!(get_json(&dir, "default", "volumesnapshot/golden-snap").is_some());
    // Off the populator path: the snapshot restored into a claim of its driver's class, copied
    // by the host-assisted path, and the restored claim gone once the copy is done.
    let done = wait_for("the local-path copy of the snapshot", 120, || {
        get_json(&dir, "default", "dv/on-local-path")
            .filter(|d| d["status"]["phase"] == "Succeeded")
    });
    let uid = done["metadata"]["uid"].as_str().unwrap().to_string();
    let claim = get_json(&dir, "default", "pvc/on-local-path").unwrap();
    assert_eq!(
        annotations(&claim)["k8s.io/CloneRequest"],
        format!("default/{uid}-host-assisted-source-pvc")
    );
    assert!(annotations(&claim).contains_key("k8s.io/CloneOf"));
    let copy = std::fs::read(volume_file(&dir, "default", "on-local-path")).unwrap();
    assert!(
        copy[..bytes.len()] == bytes[..],
        "the copy holds the snapshot's data"
    );
    wait_for("the restored claim to go", 60, || {
        get_json(
            &dir,
            "default",
            &format!("pvc/{uid}-host-assisted-source-pvc"),
        )
        .is_none()
        .then_some(())
    });
}

/// Write `len` bytes of pseudo-random data at the start of `path` (data that neither compresses
/// nor has holes, so the copy takes a while).
fn fill_random(path: &Path, len: u64) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut buf = vec![0u8; 4 << 20];
    let mut written = 0;
    while written < len {
        for chunk in buf.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
        }
        f.write_all(&buf).unwrap();
        written += buf.len() as u64;
    }
    f.sync_all().unwrap();
}

/// Whether the first `len` bytes of two files are the same (read a piece at a time).
fn same_start(a: &Path, b: &Path, len: u64) -> bool {
    use std::io::Read;
    let (mut a, mut b) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let (mut x, mut y) = (vec![0u8; 8 << 20], vec![0u8; 8 << 20]);
    let mut left = len;
    while left > 0 {
        let n = left.min(x.len() as u64) as usize;
        if a.read_exact(&mut x[..n]).is_err() || b.read_exact(&mut y[..n]).is_err() {
            return false;
        }
        if x[..n] != y[..n] {
            return false;
        }
        left -= n as u64;
    }
    true
}

/// A host-assisted copy whose cloner is killed mid-stream starts again and completes; one whose
/// controller is killed, and whose source is deleted, while it streams completes too (the
/// source claim stays until its reader is gone, then goes); and once the copies are deleted
/// nothing of them is left: no pod, claim, Service or Secret.
#[tokio::test(flavor = "multi_thread")]
async fn a_copy_converges_when_its_cloner_or_controller_dies_or_its_source_goes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let (ok, out, err) = cdi(&["dev", "up", "--addr", "127.0.0.1:0"], &dir);
    assert!(ok, "{out}{err}");
    let _down = Down(&dir);
    let mut controller = controller(&dir, tmp.path());
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&blank_volume("src", "default", "Filesystem", "1Gi")),
    );
    wait_for("the source to succeed", 90, || {
        get_json(&dir, "default", "dv/src").filter(|d| d["status"]["phase"] == "Succeeded")
    });
    const DATA: u64 = 768 * MIB;
    let source = volume_file(&dir, "default", "src");
    fill_random(&source, DATA);
    let copy = |name: &str| {
        format!(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {{name: {name}}}\nspec:\n  source: {{pvc: {{namespace: default, name: src}}}}\n  storage: {{storageClassName: local-path, accessModes: [ReadWriteOnce]}}\n"
        )
    };
    let cloner = || find_pod_process(&dir, |host| host.ends_with(b"-source-pod"));
    let kill = |pid: i32| {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::KILL,
        );
    };

    // The cloner killed while it streams.
    kubectl(&dir, &["apply", "-f", "-"], Some(&copy("first")));
    let pid = wait_for("the first copy's cloner to run", 120, cloner);
    kill(pid);
    wait_for("the first copy to succeed", 240, || {
        get_json(&dir, "default", "dv/first").filter(|d| d["status"]["phase"] == "Succeeded")
    });
    // The kill found the cloner at work: its container was started again.
    let restarted = kubectl(
        &dir,
        &[
            "get",
            "events",
            "--field-selector",
            "reason=BackOff",
            "-o",
            "jsonpath={.items[*].message}",
        ],
        None,
    );
    assert!(
        restarted.contains("Back-off restarting failed container cdi-clone-source"),
        "{restarted}"
    );
    let first = volume_file(&dir, "default", "first");
    assert!(
        same_start(&source, &first, DATA),
        "first holds the source's data"
    );

    // The controller killed, and the source deleted, while the second copy streams. Its upload
    // server is paused meanwhile (the cloner waits on it, and says how far it got): the
    // DataVolume shows the cloner's progress.
    kubectl(&dir, &["apply", "-f", "-"], Some(&copy("second")));
    wait_for("the second copy's cloner to run", 120, cloner);
    let server = wait_for("the second copy's upload server", 60, || {
        devcluster::pod_process_named(&dir, "cdi-upload-second")
    });
    let signal = |pid: i32, sig| {
        let _ = rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), sig);
    };
    signal(server, rustix::process::Signal::STOP);
    let progress = wait_for("the copy's progress on the DataVolume", 60, || {
        get_json(&dir, "default", "dv/second").and_then(|d| {
            let p = d["status"]["progress"].as_str()?.to_string();
            let value: f64 = p.strip_suffix('%')?.parse().ok()?;
            (d["status"]["phase"] == "CloneInProgress" && value < 100.0).then_some(p)
        })
    });
    eprintln!("the second copy at {progress} while its server is paused");
    controller.kill();
    kubectl(&dir, &["delete", "dv", "src", "--wait=false"], None);
    let again = tmp.path().join("again");
    std::fs::create_dir_all(&again).unwrap();
    let _controller = self::controller(&dir, &again);
    signal(server, rustix::process::Signal::CONT);
    wait_for("the second copy to succeed", 240, || {
        get_json(&dir, "default", "dv/second").filter(|d| d["status"]["phase"] == "Succeeded")
    });
    let second = volume_file(&dir, "default", "second");
    assert!(
        same_start(&first, &second, DATA),
        "second holds the source's data"
    );
    wait_for("the source claim to go once nothing reads it", 60, || {
        get_json(&dir, "default", "pvc/src").is_none().then_some(())
    });

    // Deleted, nothing of the copies is left.
    kubectl(
        &dir,
        &["delete", "dv", "first", "second", "--wait=false"],
        None,
    );
    let names = |kind: &str| {
        kubectl(&dir, &["get", kind, "-o", "name"], None)
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    wait_for("nothing to be left", 120, || {
        let left: Vec<String> = ["pods", "pvc", "services", "secrets", "dv"]
            .iter()
            .flat_map(|k| names(k))
            .filter(|n| n != "service/kubernetes")
            .collect();
        left.is_empty().then_some(())
    });
}

/// Each reason the clone populator falls back to a host-assisted copy (upstream's events and
/// `cdi.kubevirt.io/cloneFallbackReason`), and the copy it makes: a Block target of a
/// Filesystem source, a larger target on a class that cannot expand, a target on the class of
/// another CSI driver (`shared`), a VolumeSnapshot onto that class (restored by its own driver
/// into `tmp-source-pvc-<uid>` and copied from there), and no VolumeSnapshotClass for the driver.
#[tokio::test(flavor = "multi_thread")]
async fn each_fallback_to_a_copy_says_why_and_copies() {
    let cluster = Running::start();
    let dir = cluster.dir.clone();
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: csi-fixed}
provisioner: csi.cdi-rs.dev
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: false
"#,
        ),
    );
    let bytes = sources(&dir, "default", &[("golden", "Filesystem", "64Mi")]).remove(0);
    let target = |name: &str, class: &str, mode: &str, size: Option<&str>| {
        clone_of(name, "golden", class, mode, size)
    };
    let told = |name: &str, reason: &str, message: &str| {
        let claim = get_json(&dir, "default", &format!("pvc/{name}")).unwrap();
        assert_eq!(
            annotations(&claim)["cdi.kubevirt.io/cloneFallbackReason"],
            message,
            "{name}"
        );
        let events = event_reasons(&dir, "default", name);
        assert!(events.contains(reason), "{name}: {reason} in {events}");
    };
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "{}\n---\n{}",
            target("to-block", "csi", "Block", None),
            target("larger-fixed", "csi-fixed", "Filesystem", Some("128Mi"))
        )),
    );
    assert_cloned(&dir, "to-block", "copy", &bytes, &["CloneSucceeded"]);
    told(
        "to-block",
        "IncompatibleVolumeModes",
        "The volume modes of source and target are incompatible",
    );
    assert_cloned(&dir, "larger-fixed", "copy", &bytes, &["CloneSucceeded"]);
    told(
        "larger-fixed",
        "NoVolumeExpansion",
        "No volume expansion is possible",
    );
    // Onto another CSI driver's class: from the claim (by csi-clone, as its profile says), and
    // from a snapshot of it.
    devcluster::set_profile_clone_strategy(&dir, "shared", "csi-clone");
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata: {name: golden}\nspec: {volumeSnapshotClassName: csi-snapclass, source: {persistentVolumeClaimName: golden}}\n",
        ),
    );
    wait_for("the snapshot to be ready", 60, || {
        get_json(&dir, "default", "volumesnapshot/golden")
            .filter(|s| s["status"]["readyToUse"] == true)
    });
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "{}\n---\n{}",
            target("to-shared", "shared", "Filesystem", None),
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {name: snapshot-to-shared}\nspec:\n  source: {snapshot: {namespace: default, name: golden}}\n  storage: {storageClassName: shared, accessModes: [ReadWriteOnce]}\n"
        )),
    );
    assert_cloned(&dir, "to-shared", "copy", &bytes, &["CloneSucceeded"]);
    told(
        "to-shared",
        "IncompatibleProvisioners",
        "Provisioners are incompatible",
    );
    let restored = |name: &str| {
        let uid = get_json(&dir, "default", &format!("pvc/{name}")).unwrap()["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_string();
        format!("pvc/tmp-source-pvc-{uid}")
    };
    let from_snapshot = restored("snapshot-to-shared");
    assert_cloned(
        &dir,
        "snapshot-to-shared",
        "copy",
        &bytes,
        &["CloneSucceeded"],
    );
    // Copied from the claim the snapshot was restored into (which binding spoke of).
    let restored_events = event_reasons(&dir, "default", from_snapshot.trim_start_matches("pvc/"));
    assert!(
        restored_events.contains("WaitForFirstConsumer"),
        "{restored_events}"
    );
    told(
        "snapshot-to-shared",
        "NoProvisionerMatch",
        "The storageclass provisioner does not match the volumesnapshotcontent driver",
    );
    wait_for("the restored snapshot to go", 30, || {
        get_json(&dir, "default", &from_snapshot)
            .is_none()
            .then_some(())
    });
    // A profile asking for snapshots of a driver without a VolumeSnapshotClass. (Named: with
    // no class the profile's own default becomes copy, as upstream's does.)
    kubectl(
        &dir,
        &[
            "patch",
            "storageprofile",
            "csi",
            "--type=merge",
            "-p",
            r#"{"spec":{"cloneStrategy":"snapshot"}}"#,
        ],
        None,
    );
    kubectl(
        &dir,
        &["delete", "volumesnapshotclass", "csi-snapclass"],
        None,
    );
    wait_for("the profile to have no snapshot class", 30, || {
        get_json(&dir, "default", "storageprofile/csi").filter(|p| {
            p["status"]["cloneStrategy"] == "snapshot" && p["status"]["snapshotClass"].is_null()
        })
    });
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&target("no-snapshots", "csi", "Filesystem", None)),
    );
    assert_cloned(&dir, "no-snapshots", "copy", &bytes, &["CloneSucceeded"]);
    told(
        "no-snapshots",
        "NoVolumeSnapshotClass",
        "No compatible volumesnapshotclass found",
    );
}

/// Sizes compare by what volumes hold for a disk image (docs/design.md#the-size-math): a `spec.storage` Filesystem
/// image of 64Mi (its claim asks for more, for the filesystem's overhead) clones onto a Block
/// disk of 64Mi, asked for or not, and a Filesystem clone that names no size is the size of its
/// source (clones of clones do not grow).
#[tokio::test(flavor = "multi_thread")]
async fn a_filesystem_image_clones_onto_a_block_disk_of_its_size() {
    let cluster = Running::start();
    let dir = cluster.dir.clone();
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {name: image}\nspec:\n  source: {blank: {}}\n  storage: {storageClassName: csi, accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}\n",
        ),
    );
    wait_for("the image to succeed", 90, || {
        get_json(&dir, "default", "dv/image").filter(|d| d["status"]["phase"] == "Succeeded")
    });
    let bytes = scatter(&volume_file(&dir, "default", "image"));
    assert_eq!(bytes.len() as u64, 64 * MIB);
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "{}---\n{}---\n{}",
            clone_of("as-block", "image", "csi", "Block", None),
            clone_of("as-block-sized", "image", "csi", "Block", Some("64Mi")),
            clone_of("as-files", "image", "csi", "Filesystem", None),
        )),
    );
    for (name, strategy) in [
        ("as-block", "copy"),
        ("as-block-sized", "copy"),
        ("as-files", "snapshot"),
    ] {
        assert_cloned(&dir, name, strategy, &bytes, &["CloneSucceeded"]);
    }
    let request = |name: &str| {
        let claim = get_json(&dir, "default", &format!("pvc/{name}")).unwrap();
        quantity_bytes(&claim["spec"]["resources"]["requests"]["storage"])
    };
    assert_eq!(request("as-block"), 64 * MIB);
    assert_eq!(
        std::fs::read(volume_file(&dir, "default", "as-block-sized")).unwrap(),
        bytes
    );
    assert_eq!(request("as-files"), request("image"));
}

/// The clone populator's CSI clone and snapshot for Block volumes and for targets larger than
/// their source (PVC prime expanded before it is handed over): the target holds the source's
/// bytes, and larger targets have their size.
#[tokio::test(flavor = "multi_thread")]
async fn block_and_larger_targets_clone_by_snapshot_and_csi_clone() {
    let cluster = Running::start();
    let dir = cluster.dir.clone();
    let [fs_bytes, block_bytes] = sources(
        &dir,
        "default",
        &[
            ("golden", "Filesystem", "64Mi"),
            ("golden-block", "Block", "32Mi"),
        ],
    )
    .try_into()
    .unwrap();
    let target = |name: &str, source: &str, mode: &str, size: Option<&str>| {
        clone_of(name, source, "csi", mode, size)
    };
    for strategy in ["snapshot", "csi-clone"] {
        devcluster::set_clone_strategy(&dir, strategy);
        let block = format!("block-by-{strategy}");
        let larger = format!("larger-by-{strategy}");
        kubectl(
            &dir,
            &["apply", "-f", "-"],
            Some(&format!(
                "{}\n---\n{}",
                target(&block, "golden-block", "Block", None),
                target(&larger, "golden", "Filesystem", Some("256Mi"))
            )),
        );
        assert_cloned(&dir, &block, strategy, &block_bytes, &["CloneSucceeded"]);
        assert_cloned(&dir, &larger, strategy, &fs_bytes, &["CloneSucceeded"]);
        let claim = get_json(&dir, "default", &format!("pvc/{larger}")).unwrap();
        let capacity = &claim["status"]["capacity"]["storage"];
        assert!(
            quantity_bytes(capacity) >= 256 * MIB,
            "{larger} has {capacity}"
        );
    }
}

/// `kubectl apply` of `manifest` as the kubeconfig at `config`, which must be refused: what
/// kubectl said.
fn refused_apply(config: &std::path::Path, manifest: &str) -> String {
    let (ok, out, err) = kubectl_as(config, &["apply", "-f", "-"], Some(manifest));
    assert!(!ok, "{out}");
    err
}
