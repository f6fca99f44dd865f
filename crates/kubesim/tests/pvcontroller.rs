//! The PV controller loop against the API server, with plain Kubernetes objects.

mod common;

use std::time::Duration;

use common::wait_for;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kubesim::agents::pvcontroller::agent;
use kubesim::apiserver::ApiServer;
use serde_json::json;

async fn start() -> (ApiServer, Client, tokio::task::JoinHandle<()>) {
    let (server, client) = common::with_nodes().await;
    let changes = kubesim::agents::Changes::start(&client);
    let task = tokio::spawn(agent::run(
        client.clone(),
        changes,
        Duration::from_millis(30),
    ));
    (server, client, task)
}

fn volume(name: &str, class: &str, size: &str, policy: &str) -> PersistentVolume {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"tier": name}}, "spec": {
        "storageClassName": class, "capacity": {"storage": size},
        "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": policy,
        "hostPath": {"path": format!("/tmp/{name}")}}}),
    )
    .unwrap()
}

fn claim(name: &str, class: &str, size: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
        "storageClassName": class, "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}}}}))
    .unwrap()
}

async fn phase_of_claim(claims: &Api<PersistentVolumeClaim>, name: &str) -> String {
    let c = claims.get(name).await.unwrap();
    c.status.and_then(|s| s.phase).unwrap_or_default()
}

async fn phase_of_volume(volumes: &Api<PersistentVolume>, name: &str) -> String {
    let v = volumes.get(name).await.unwrap();
    v.status.and_then(|s| s.phase).unwrap_or_default()
}

#[tokio::test]
async fn a_claim_binds_the_smallest_volume_that_fits() {
    let (_server, client, task) = start().await;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    for v in [
        volume("small", "manual", "1Gi", "Retain"),
        volume("big", "manual", "10Gi", "Retain"),
        volume("medium", "manual", "5Gi", "Retain"),
        volume("other-class", "fast", "3Gi", "Retain"),
    ] {
        volumes.create(&pp, &v).await.unwrap();
    }
    claims
        .create(&pp, &claim("disk", "manual", "2Gi"))
        .await
        .unwrap();
    let mut picky = claim("picky", "manual", "2Gi");
    picky.spec.as_mut().unwrap().selector =
        Some(serde_json::from_value(json!({"matchLabels": {"tier": "big"}})).unwrap());
    claims.create(&pp, &picky).await.unwrap();
    // Nothing of class "nothing" exists: the claim waits.
    claims
        .create(&pp, &claim("waits", "nothing", "1Gi"))
        .await
        .unwrap();

    wait_for("disk bound", async || {
        (phase_of_claim(&claims, "disk").await == "Bound").then_some(())
    })
    .await;
    let disk = claims.get("disk").await.unwrap();
    assert_eq!(disk.spec.unwrap().volume_name.as_deref(), Some("medium"));
    let status = disk.status.unwrap();
    assert_eq!(status.capacity.unwrap()["storage"].0, "5Gi");
    assert_eq!(status.access_modes.unwrap(), ["ReadWriteOnce"]);
    assert_eq!(
        disk.metadata.annotations.unwrap()["pv.kubernetes.io/bind-completed"],
        "yes"
    );
    wait_for("medium bound", async || {
        (phase_of_volume(&volumes, "medium").await == "Bound").then_some(())
    })
    .await;
    let claim_ref = volumes
        .get("medium")
        .await
        .unwrap()
        .spec
        .unwrap()
        .claim_ref
        .unwrap();
    assert_eq!(claim_ref.name.as_deref(), Some("disk"));
    assert!(claim_ref.uid.is_some_and(|u| !u.is_empty()));

    wait_for("picky bound", async || {
        (phase_of_claim(&claims, "picky").await == "Bound").then_some(())
    })
    .await;
    let picky = claims.get("picky").await.unwrap();
    assert_eq!(picky.spec.unwrap().volume_name.as_deref(), Some("big"));
    assert_eq!(phase_of_claim(&claims, "waits").await, "Pending");
    assert_eq!(phase_of_volume(&volumes, "small").await, "Available");
    assert_eq!(phase_of_volume(&volumes, "other-class").await, "Available");
    task.abort();
}

#[tokio::test]
async fn changing_claim_ref_moves_the_volume_and_the_old_claim_is_lost() {
    let (_server, client, task) = start().await;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    volumes
        .create(&pp, &volume("pv", "manual", "1Gi", "Retain"))
        .await
        .unwrap();
    claims
        .create(&pp, &claim("first", "manual", "1Gi"))
        .await
        .unwrap();
    wait_for("first bound", async || {
        (phase_of_claim(&claims, "first").await == "Bound").then_some(())
    })
    .await;
    // The second claim cannot bind: the only volume is taken.
    claims
        .create(&pp, &claim("second", "manual", "1Gi"))
        .await
        .unwrap();
    // A whole pass over the new claim: it did not bind it.
    agent::pass(&client, &mut Default::default()).await.unwrap();
    assert_eq!(phase_of_claim(&claims, "second").await, "Pending");

    // An administrator hands the volume to the second claim.
    volumes
        .patch(
            "pv",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"claimRef": {"name": "second", "uid": null}}})),
        )
        .await
        .unwrap();
    wait_for("second bound", async || {
        (phase_of_claim(&claims, "second").await == "Bound").then_some(())
    })
    .await;
    wait_for("first lost", async || {
        (phase_of_claim(&claims, "first").await == "Lost").then_some(())
    })
    .await;
    let first = claims.get("first").await.unwrap();
    assert!(first.status.unwrap().capacity.is_none());
    assert_eq!(
        claims
            .get("second")
            .await
            .unwrap()
            .spec
            .unwrap()
            .volume_name
            .as_deref(),
        Some("pv")
    );
    assert_eq!(phase_of_volume(&volumes, "pv").await, "Bound");
    task.abort();
}

#[tokio::test]
async fn deleting_the_claim_releases_or_fails_the_volume_by_reclaim_policy() {
    let (_server, client, task) = start().await;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    volumes
        .create(&pp, &volume("kept", "retain", "1Gi", "Retain"))
        .await
        .unwrap();
    volumes
        .create(&pp, &volume("handmade", "delete", "1Gi", "Delete"))
        .await
        .unwrap();
    claims
        .create(&pp, &claim("a", "retain", "1Gi"))
        .await
        .unwrap();
    claims
        .create(&pp, &claim("b", "delete", "1Gi"))
        .await
        .unwrap();
    for (c, v) in [("a", "kept"), ("b", "handmade")] {
        wait_for("bound", async || {
            (phase_of_claim(&claims, c).await == "Bound"
                && phase_of_volume(&volumes, v).await == "Bound")
                .then_some(())
        })
        .await;
        claims.delete(c, &DeleteParams::default()).await.unwrap();
    }
    wait_for("kept released", async || {
        (phase_of_volume(&volumes, "kept").await == "Released").then_some(())
    })
    .await;
    let message = wait_for("handmade failed", async || {
        let v = volumes.get("handmade").await.unwrap().status?;
        (v.phase.as_deref() == Some("Failed")).then_some(v.message?)
    })
    .await;
    assert!(message.contains("\"handmade\""), "{message}");
    // A new claim of the same name does not get the released volume back.
    claims
        .create(&pp, &claim("a", "retain", "1Gi"))
        .await
        .unwrap();
    // A whole pass over the new claim: it did not bind it.
    agent::pass(&client, &mut Default::default()).await.unwrap();
    assert_eq!(phase_of_claim(&claims, "a").await, "Pending");
    assert_eq!(phase_of_volume(&volumes, "kept").await, "Released");
    task.abort();
}

#[tokio::test]
async fn with_the_scheduler_a_wffc_claim_binds_the_local_volume_of_the_pods_node() {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::storage::v1::StorageClass;
    use kubesim::agents::scheduler;

    let (_server, client, task) = start().await;
    let pp = PostParams::default();
    let scheduler = tokio::spawn(scheduler::agent::run(
        client.clone(),
        kubesim::agents::Changes::start(&client),
        Duration::from_millis(30),
    ));
    let classes: Api<StorageClass> = Api::all(client.clone());
    let class = json!({"metadata": {"name": "local"}, "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer"});
    classes
        .create(&pp, &serde_json::from_value(class).unwrap())
        .await
        .unwrap();
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    for node in ["node-1", "node-2", "node-3"] {
        let v = json!({"metadata": {"name": format!("local-{node}")}, "spec": {
            "storageClassName": "local", "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"], "local": {"path": "/x"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}});
        volumes
            .create(&pp, &serde_json::from_value(v).unwrap())
            .await
            .unwrap();
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    claims
        .create(&pp, &claim("disk", "local", "1Gi"))
        .await
        .unwrap();
    // A whole pass over the new claim: it did not bind it.
    agent::pass(&client, &mut Default::default()).await.unwrap();
    assert_eq!(
        phase_of_claim(&claims, "disk").await,
        "Pending",
        "no consumer yet"
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let vm: Pod = serde_json::from_value(json!({"metadata": {"name": "vm"}, "spec": {
        "containers": [{"name": "c", "image": "x"}],
        "nodeSelector": {"node-role.kubernetes.io/virt-local": "true"},
        "tolerations": [{"key": "virt-local", "operator": "Exists", "effect": "NoSchedule"}],
        "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "disk"}}]}}))
    .unwrap();
    pods.create(&pp, &vm).await.unwrap();
    let node = wait_for("vm scheduled", async || {
        pods.get("vm").await.unwrap().spec?.node_name
    })
    .await;
    assert_eq!(node, "node-2");
    // The scheduler binds the pod once the claim names its volume; the claim's phase is the PV
    // controller's next write.
    let bound = wait_for("the claim bound", async || {
        let c = claims.get("disk").await.unwrap();
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await;
    assert_eq!(
        bound.spec.unwrap().volume_name.as_deref(),
        Some("local-node-2")
    );
    scheduler.abort();
    task.abort();
}
