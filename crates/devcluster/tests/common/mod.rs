//! What the agent tests share: an API server with the default nodes, and waiting for a state.

use std::time::Duration;

use cdi_devcluster::agents::nodes::default_nodes;
use cdi_devcluster::apiserver::ApiServer;
use k8s_openapi::api::core::v1::Node;
use kube::api::PostParams;
use kube::{Api, Client};

/// An API server holding the default nodes, and an in-process client for it.
#[allow(dead_code)] // not every test crate uses it
pub async fn with_nodes() -> (ApiServer, Client) {
    let server = ApiServer::new();
    let client = Client::new(server.router(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    for (i, n) in default_nodes().iter().enumerate() {
        nodes
            .create(&PostParams::default(), &n.node(i))
            .await
            .unwrap();
    }
    (server, client)
}

/// Poll `check` until it gives a value; fail after 5 s naming `what`.
pub async fn wait_for<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    // Generous: CI runs the suites side by side on two cores; a pass returns as soon as it can.
    for _ in 0..600 {
        if let Some(v) = check().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not reached in 30 s");
}
