//! The CSI-like driver's VolumeSnapshots (copies, readyToUse, restoreSize), restores from them,
//! and volume expansion, on a whole `cluster::start`, through the API server with kube-rs.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use common::wait_for;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kubesim::agents::snapshots::agent::resource;
use kubesim::cluster::{self, Config, Running};
use serde_json::{Value, json};

async fn start() -> (tempfile::TempDir, Running) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().to_path_buf(), "127.0.0.1:0".parse().unwrap());
    config.every = Duration::from_millis(30);
    (dir, cluster::start(&config).await.unwrap())
}

fn claims(client: &Client) -> Api<PersistentVolumeClaim> {
    Api::namespaced(client.clone(), "default")
}

fn snapshots(client: &Client) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        "default",
        &resource("VolumeSnapshot", "volumesnapshots"),
    )
}

fn contents(client: &Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &resource("VolumeSnapshotContent", "volumesnapshotcontents"),
    )
}

async fn create_claim(client: &Client, value: Value) {
    let c: PersistentVolumeClaim = serde_json::from_value(value).unwrap();
    claims(client)
        .create(&PostParams::default(), &c)
        .await
        .unwrap();
}

fn claim(name: &str, mode: &str, size: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"storageClassName": "csi", "volumeMode": mode,
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}})
}

/// A pod on node-1 using `fs` at data/ and `blk` at dev/blk, running `script`.
async fn pod(client: &Client, name: &str, fs: &str, blk: &str, script: &str) -> Pod {
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": "node-1"},
        "containers": [{"name": "main", "image": "busybox", "command": ["/bin/sh", "-c", script],
            "volumeMounts": [{"name": "fs", "mountPath": "/data"}],
            "volumeDevices": [{"name": "blk", "devicePath": "/dev/blk"}]}],
        "volumes": [{"name": "fs", "persistentVolumeClaim": {"claimName": fs}},
            {"name": "blk", "persistentVolumeClaim": {"claimName": blk}}]}}))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &p).await.unwrap();
    wait_for(&format!("pod {name} to finish"), async || {
        let p = pods.get(name).await.unwrap();
        let phase = p.status.as_ref()?.phase.clone()?;
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(p)
    })
    .await
}

fn message(p: &Pod) -> String {
    let s = &p
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    let t = s.state.clone().unwrap().terminated.unwrap();
    assert_eq!(t.exit_code, 0, "{t:?}");
    t.message.unwrap_or_default()
}

async fn volume_path(client: &Client, claim: &str) -> PathBuf {
    let name = claims(client)
        .get(claim)
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&name)
        .await
        .unwrap();
    let csi = pv.spec.unwrap().csi.unwrap();
    PathBuf::from(csi.volume_attributes.unwrap()["path"].clone())
}

async fn snapshot(client: &Client, name: &str, source: &str, class: Option<&str>) {
    let mut spec = json!({"source": {"persistentVolumeClaimName": source}});
    if let Some(c) = class {
        spec["volumeSnapshotClassName"] = json!(c);
    }
    let o: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": name}, "spec": spec}))
    .unwrap();
    snapshots(client)
        .create(&PostParams::default(), &o)
        .await
        .unwrap();
}

async fn ready_snapshot(client: &Client, name: &str) -> Value {
    wait_for(&format!("snapshot {name} to be ready"), async || {
        let s = serde_json::to_value(snapshots(client).get(name).await.unwrap()).unwrap();
        (s["status"]["readyToUse"] == true).then_some(s)
    })
    .await
}

const OFFSET: u64 = 1 << 20;

#[tokio::test]
async fn snapshots_are_copies_that_claims_restore() {
    let (_dir, running) = start().await;
    let client = running.client.clone();
    create_claim(&client, claim("fs-src", "Filesystem", "1Gi")).await;
    create_claim(&client, claim("blk-src", "Block", "64Mi")).await;
    let write = format!(
        "echo hello > data/f && printf BLOCKDATA | dd of=dev/blk bs=1 seek={OFFSET} conv=notrunc 2>/dev/null"
    );
    message(&pod(&client, "writer", "fs-src", "blk-src", &write).await);

    snapshot(&client, "snap-fs", "fs-src", None).await;
    snapshot(&client, "snap-blk", "blk-src", Some("csi-snapclass")).await;
    let fs = ready_snapshot(&client, "snap-fs").await;
    let blk = ready_snapshot(&client, "snap-blk").await;
    assert_eq!(fs["status"]["restoreSize"], "1Gi");
    assert_eq!(blk["status"]["restoreSize"], "64Mi");
    let content_name = blk["status"]["boundVolumeSnapshotContentName"]
        .as_str()
        .unwrap()
        .to_string();
    let content =
        serde_json::to_value(contents(&client).get(&content_name).await.unwrap()).unwrap();
    assert_eq!(content["spec"]["sourceVolumeMode"], "Block");
    assert_eq!(content["spec"]["deletionPolicy"], "Delete");
    assert_eq!(content["spec"]["volumeSnapshotRef"]["name"], "snap-blk");
    assert_eq!(content["status"]["restoreSize"], 64 << 20);

    // Changing the sources afterwards does not change the snapshots.
    std::fs::write(volume_path(&client, "fs-src").await.join("f"), "changed\n").unwrap();

    let mut fs_restore = claim("fs-restore", "Filesystem", "2Gi");
    fs_restore["spec"]["dataSource"] =
        json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap-fs"});
    create_claim(&client, fs_restore).await;
    let mut blk_restore = claim("blk-restore", "Block", "64Mi");
    blk_restore["spec"]["dataSourceRef"] = json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap-blk"});
    create_claim(&client, blk_restore).await;
    let read = format!(
        "{{ cat data/f; dd if=dev/blk bs=1 skip={OFFSET} count=9 2>/dev/null; }} > \"$KUBESIM_POD_ROOT/dev/termination-log\""
    );
    let reader = pod(&client, "reader", "fs-restore", "blk-restore", &read).await;
    assert_eq!(message(&reader), "hello\nBLOCKDATA");
    // The restored block volume is as long as the claim and stays sparse.
    let restored = std::fs::metadata(volume_path(&client, "blk-restore").await).unwrap();
    assert_eq!(restored.len(), 64 << 20);
    assert!(
        restored.blocks() * 512 < 8 << 20,
        "{} blocks",
        restored.blocks()
    );

    // Deleting a snapshot whose content says Delete removes the content and the copy.
    let handle = content["status"]["snapshotHandle"]
        .as_str()
        .unwrap()
        .to_string();
    let copy = running_root(&client, &handle).await;
    assert!(copy.is_file());
    snapshots(&client)
        .delete("snap-blk", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the content to go", async || {
        contents(&client)
            .get_opt(&content_name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(!copy.exists());
    running.stop().await;
}

/// The node data root is the `nodes` directory of the cluster's directory.
async fn running_root(client: &Client, handle: &str) -> PathBuf {
    let src = volume_path(client, "blk-src").await;
    let root = src
        .ancestors()
        .find(|p| p.ends_with("nodes"))
        .unwrap()
        .to_path_buf();
    root.join(handle)
}

#[tokio::test]
async fn snapshot_and_restore_errors() {
    let (_dir, running) = start().await;
    let client = running.client.clone();
    snapshot(&client, "of-nothing", "nope", Some("csi-snapclass")).await;
    let s = wait_for("an error on the snapshot", async || {
        let s = serde_json::to_value(snapshots(&client).get("of-nothing").await.unwrap()).unwrap();
        s["status"]["error"]["message"].as_str().map(str::to_string)
    })
    .await;
    assert!(
        s.contains("persistentvolumeclaims \"nope\" not found"),
        "{s}"
    );

    // A restore smaller than the snapshot is refused with the provisioner's words.
    create_claim(&client, claim("src", "Filesystem", "1Gi")).await;
    create_claim(&client, claim("other", "Block", "1Mi")).await;
    message(&pod(&client, "user", "src", "other", "true").await);
    snapshot(&client, "snap", "src", None).await;
    ready_snapshot(&client, "snap").await;
    let mut small = claim("small", "Filesystem", "512Mi");
    small["metadata"]["annotations"] = json!({"volume.kubernetes.io/selected-node": "node-1"});
    small["spec"]["dataSource"] =
        json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"});
    create_claim(&client, small).await;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let refused = wait_for("a ProvisioningFailed event", async || {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.involved_object.name.as_deref() == Some("small"))
            .and_then(|e| e.message)
    })
    .await;
    assert!(
        refused.contains("requested volume size 536870912 is less than the size 1073741824"),
        "{refused}"
    );
    assert_eq!(
        claims(&client)
            .get("small")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Pending")
    );
    running.stop().await;
}

fn size_patch(size: &str) -> Value {
    json!({"spec": {"resources": {"requests": {"storage": size}}}})
}

#[tokio::test]
async fn volumes_grow_where_the_class_allows_it() {
    let (_dir, running) = start().await;
    let client = running.client.clone();
    create_claim(&client, claim("fs", "Filesystem", "1Gi")).await;
    create_claim(&client, claim("blk", "Block", "64Mi")).await;
    message(&pod(&client, "user", "fs", "blk", "true").await);
    let api = claims(&client);
    api.patch(
        "blk",
        &PatchParams::default(),
        &Patch::Merge(&size_patch("128Mi")),
    )
    .await
    .unwrap();
    wait_for("the claim's capacity to grow", async || {
        let c = api.get("blk").await.unwrap();
        (c.status?.capacity?.get("storage")?.0 == "128Mi").then_some(())
    })
    .await;
    assert_eq!(
        std::fs::metadata(volume_path(&client, "blk").await)
            .unwrap()
            .len(),
        128 << 20
    );

    // Shrinking below the capacity is refused by the API server.
    let err = api
        .patch(
            "blk",
            &PatchParams::default(),
            &Patch::Merge(&size_patch("64Mi")),
        )
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(e) => {
            assert_eq!(e.code, 422);
            assert!(
                e.message.contains("can not be less than status.capacity"),
                "{}",
                e.message
            );
        }
        other => panic!("{other}"),
    }

    // local-path volumes cannot grow: the class does not allow it.
    let lp: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {"name": "lp"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
    .unwrap();
    api.create(&PostParams::default(), &lp).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let user: Pod = serde_json::from_value(json!({"metadata": {"name": "lp-user"}, "spec": {
        "restartPolicy": "Never", "containers": [{"name": "c", "image": "x", "command": ["true"]}],
        "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "lp"}}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &user).await.unwrap();
    wait_for("lp to bind", async || {
        let c = api.get("lp").await.unwrap();
        (c.status?.phase.as_deref() == Some("Bound")).then_some(())
    })
    .await;
    let err = api
        .patch(
            "lp",
            &PatchParams::default(),
            &Patch::Merge(&size_patch("2Gi")),
        )
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(e) => {
            assert_eq!(e.code, 403);
            assert!(e.message.contains("must support resize"), "{}", e.message);
        }
        other => panic!("{other}"),
    }
    running.stop().await;
}
