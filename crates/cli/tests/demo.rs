//! `cdi demo`, as the README runs it: exit 0, and the timeline in the handshake's order.

use std::process::Command;

/// Every line of `order` appears in `text`, each after the one before.
fn assert_in_order(text: &str, order: &[&str]) {
    let mut at = 0;
    for line in order {
        let found = text[at..]
            .find(line)
            .unwrap_or_else(|| panic!("{line:?} not after byte {at} in:\n{text}"));
        at += found + line.len();
    }
}

#[test]
fn the_demo_tells_the_seed_story_and_succeeds() {
    let out = Command::new(env!("CARGO_BIN_EXE_cdi"))
        .arg("demo")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let order = [
        "DataVolume vm-with-wffc-disk-root: WaitForFirstConsumer",
        "temporary pod virt-launcher-vm-with-wffc-disk-",
        "volume.kubernetes.io/selected-node=node-2",
        // No CDI spec.workload in the demo: the importer reaches node-2 by inheriting.
        "its worker pods inherit toleration virt-local=true:NoSchedule from pod virt-launcher-vm-with-wffc-disk-",
        "importer pod importer-vm-with-wffc-disk-root created (claim vm-with-wffc-disk-root is Bound)",
        "DataVolume vm-with-wffc-disk-root: Succeeded (100.0%)",
        "Running on node-2",
        "virtual size 20258488320 bytes",
        "contents: the served filesystem, byte for byte",
        "OK: the VM runs on node-2",
    ];
    assert_in_order(&stdout, &order);
    assert!(
        stdout.contains("node affinity kubernetes.io/hostname In [\"node-2\"]"),
        "{stdout}"
    );
}

#[test]
fn a_bad_size_is_refused_with_the_reason() {
    let out = Command::new(env!("CARGO_BIN_EXE_cdi"))
        .args(["demo", "--size", "lots"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--size lots"), "{stderr}");
}

#[test]
fn the_populator_demo_hands_prime_s_volume_to_the_vm() {
    let out = Command::new(env!("CARGO_BIN_EXE_cdi"))
        .args(["demo", "--populator"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let order = [
        "DataVolume vm-with-wffc-disk-root: PendingPopulation",
        "launcher pod virt-launcher-vm-with-wffc-disk-",
        "created for vm-with-wffc-disk-root, selected-node=node-2",
        "DataVolume vm-with-wffc-disk-root: Succeeded (100.0%)",
        "Running on node-2",
        "virtual size 20258488320 bytes",
        "OK: the VM runs on node-2",
    ];
    assert_in_order(&stdout, &order);
    assert!(
        stdout.contains("rebound: claimRef now vm-with-wffc-disk-root"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "its worker pods inherit toleration virt-local=true:NoSchedule from pod virt-launcher-"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("Lost: its volume was handed to vm-with-wffc-disk-root"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("temporary pod"),
        "no temporary pod on the populator path:\n{stdout}"
    );
}

#[test]
fn the_upload_demo_is_refused_without_force_bind_then_fills_the_vm_disk() {
    let out = Command::new(env!("CARGO_BIN_EXE_cdi"))
        .args(["demo", "--upload"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let order = [
        "cdi image-upload dv waiting-disk (no --force-bind): error: cannot upload to DataVolume in WaitForFirstConsumer phase, make sure the PVC is Bound, or use force-bind flag",
        "--no-create --force-bind",
        // The client starts once it sees the pod ready; the controller writes UploadReady when
        // it does: either can be told first.
        "cdi image-upload: Uploading data to https://",
        "DataVolume vm-with-wffc-disk-root: Succeeded (100.0%)",
        "Running on node-2",
        "contents: the served filesystem, byte for byte",
        "OK: the VM runs on node-2 with its 20Gi disk on node-2, uploaded",
    ];
    assert_in_order(&stdout, &order);
    assert_in_order(
        &stdout,
        &[
            "DataVolume vm-with-wffc-disk-root: UploadReady",
            "DataVolume vm-with-wffc-disk-root: Succeeded (100.0%)",
        ],
    );
    // The upload pod reaches the tainted node as an importer does: by the VM's toleration.
    assert!(
        stdout.contains("upload pod cdi-upload-vm-with-wffc-disk-root running on node-2"),
        "{stdout}"
    );
    assert!(
        stdout.contains("its worker pods inherit toleration virt-local=true:NoSchedule"),
        "{stdout}"
    );
}

#[test]
fn the_clone_demo_refuses_then_clones_the_golden_image_into_two_vms() {
    let out = Command::new(env!("CARGO_BIN_EXE_cdi"))
        .args(["demo", "--clone"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_in_order(
        &stdout,
        &[
            "DataVolume golden/fedora: Succeeded",
            "DataSource golden/fedora: Ready (DataSource is ready to be consumed)",
            "alice creates DataVolume vms/vm-local-root (sourceRef golden/fedora): refused: \
             admission webhook \"datavolume-mutate.cdi.kubevirt.io\" denied the request: User \
             alice has insufficient permissions in clone source namespace golden",
            "RoleBinding golden/alice-clones",
            "alice creates DataVolume vms/vm-csi-root",
        ],
    );
    // Each disk's story, in its order (the two run side by side; the phases in between can be
    // shorter than the demo's look, their events are told).
    assert_in_order(
        &stdout,
        &[
            "claim vms/vm-local-root: host-assisted copy of golden/fedora",
            "event on DataVolume vms/vm-local-root: CloneSucceeded: Successfully cloned from golden/fedora into vms/vm-local-root",
        ],
    );
    assert_in_order(
        &stdout,
        &[
            "DataVolume vms/vm-local-root: Succeeded",
            "VirtualMachine vms/vm-local: launcher virt-launcher-vm-local-",
        ],
    );
    // The strategy is told in the same look as the phase it leads to.
    assert!(
        stdout.contains(
            "claim vms/vm-csi-root: clone strategy snapshot (StorageProfile csi says \
             cloneStrategy snapshot)"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "event on DataVolume vms/vm-csi-root: CloneSucceeded: Successfully cloned from \
             golden/fedora into vms/vm-csi-root"
        ),
        "{stdout}"
    );
    assert_in_order(
        &stdout,
        &[
            "DataVolume vms/vm-csi-root: Succeeded",
            "VirtualMachine vms/vm-csi: launcher virt-launcher-vm-csi-",
        ],
    );
    for disk in ["vm-local-root", "vm-csi-root"] {
        assert!(
            stdout.contains(&format!("vms/{disk}: "))
                && stdout.contains("holds the golden image, byte for byte"),
            "{stdout}"
        );
    }
    assert!(
        stdout.contains("OK: both VMs run on disks cloned from golden/fedora"),
        "{stdout}"
    );
}
