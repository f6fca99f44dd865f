//! The scheduler loop against the API server, with plain Kubernetes objects.

use std::time::Duration;

mod common;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kubesim::agents::scheduler::agent;
use serde_json::json;

#[tokio::test]
async fn pods_are_placed_or_told_why_not() {
    let (_server, client) = common::with_nodes().await;
    let changes = kubesim::agents::Changes::start(&client);
    let task = tokio::spawn(agent::run(
        client.clone(),
        changes,
        Duration::from_millis(50),
    ));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let vm: Pod = serde_json::from_value(json!({"metadata": {"name": "vm"}, "spec": {
        "containers": [{"name": "c", "image": "x"}],
        "nodeSelector": {"node-role.kubernetes.io/virt-local": "true"},
        "tolerations": [{"key": "virt-local", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]}})).unwrap();
    pods.create(&PostParams::default(), &vm).await.unwrap();
    let stuck: Pod = serde_json::from_value(json!({"metadata": {"name": "stuck"}, "spec": {
        "containers": [{"name": "c", "image": "x"}], "nodeSelector": {"disk": "nvme"}}}))
    .unwrap();
    pods.create(&PostParams::default(), &stuck).await.unwrap();

    let node = common::wait_for("vm scheduled", async || {
        pods.get("vm").await.unwrap().spec.unwrap().node_name
    })
    .await;
    assert_eq!(node, "node-2");
    let message = common::wait_for("stuck marked Unschedulable", async || {
        let s = pods.get("stuck").await.unwrap().status?;
        s.conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))?
            .message
    })
    .await;
    assert!(
        message.starts_with(
            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
        ),
        "{message}"
    );
    task.abort();
}

#[tokio::test]
async fn a_wffc_claim_gets_the_selected_node_and_the_pod_waits_for_it_to_bind() {
    let (_server, client) = common::with_nodes().await;
    let classes: Api<StorageClass> = Api::all(client.clone());
    classes
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "local-path-wffc"}, "provisioner": "rancher.io/local-path", "volumeBindingMode": "WaitForFirstConsumer"})).unwrap())
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    claims
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "disk"}, "spec": {"storageClassName": "local-path-wffc", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})).unwrap())
        .await
        .unwrap();
    let changes = kubesim::agents::Changes::start(&client);
    let task = tokio::spawn(agent::run(
        client.clone(),
        changes,
        Duration::from_millis(50),
    ));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let consumer: Pod = serde_json::from_value(json!({"metadata": {"name": "consumer"}, "spec": {
        "containers": [{"name": "c", "image": "x"}],
        "nodeSelector": {"kubernetes.io/hostname": "node-3"},
        "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "disk"}}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &consumer)
        .await
        .unwrap();

    let selected = common::wait_for("selected-node set", async || {
        claims
            .get("disk")
            .await
            .unwrap()
            .metadata
            .annotations?
            .get(agent::SELECTED_NODE)
            .cloned()
    })
    .await;
    assert_eq!(selected, "node-3");
    // A whole pass after the claim's node was chosen: the pod was not bound in it.
    agent::pass(&client).await.unwrap();
    assert!(
        pods.get("consumer")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none(),
        "the pod waits while the claim is unbound"
    );

    // Once the claim is bound (by the provisioner and PV controller, here by hand), the pod goes.
    claims
        .patch_status(
            "disk",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Bound"}})),
        )
        .await
        .unwrap();
    let node = common::wait_for("consumer scheduled", async || {
        pods.get("consumer").await.unwrap().spec.unwrap().node_name
    })
    .await;
    assert_eq!(node, "node-3");
    task.abort();
}
