//! Events about pods, as the kubelet and the scheduler post them (`kubectl describe pod` shows
//! them). Here, beside the kubelet, so that what goes wrong posting them is in the kubelet's
//! log, as it always was.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client};
use serde_json::json;

use crate::agents::{event_name, unique_suffix};

/// Post an event about the pod from `component` (the kubelet, the scheduler).
pub async fn event_from(
    client: &Client,
    component: &str,
    pod: &Pod,
    type_: &str,
    reason: &str,
    message: &str,
) {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let now = Timestamp::now().to_string();
    let e = json!({
        "apiVersion": "v1", "kind": "Event",
        // Named as kube's recorder names events (a generateName ending in '.' is invalid).
        "metadata": {"name": event_name(name, &unique_suffix()),
            "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": name,
            "uid": pod.metadata.uid},
        "type": type_, "reason": reason, "message": message,
        "source": {"component": component},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    });
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), ns);
    match serde_json::from_value(e) {
        Ok(e) => {
            if let Err(err) = events.create(&Default::default(), &e).await {
                tracing::debug!(error = %err, "posting an event");
            }
        }
        Err(err) => tracing::warn!(error = %err, "building an event"),
    }
}
