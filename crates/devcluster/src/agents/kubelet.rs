//! The kubelet of each node. This first part does what a kubelet must do even for pods it does
//! not run: finish their graceful deletion (the API server only marks a pod on a node; its
//! kubelet stops the containers and then deletes it with a zero grace period). Running pods as
//! processes comes next; until then nothing runs, so there is nothing to stop.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};

/// One pass for `node`: finish the deletion of its pods marked for deletion.
pub async fn pass(client: &Client, node: &str) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    for pod in pods.list(&on_node).await?.items {
        if pod.metadata.deletion_timestamp.is_none() {
            continue;
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or("");
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        match api
            .delete(name, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => tracing::info!(pod = %format!("{ns}/{name}"), node, "deleted pod"),
            // Someone else finished it meanwhile.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Run passes for `node` until the task is dropped.
pub async fn run(client: Client, node: String, every: std::time::Duration) {
    run_every!(every, pass(&client, &node))
}
