//! Events on objects, as core/v1 Events (what `kubectl describe` lists), with upstream's
//! reasons. Repeats of the same reason and message on the same object bump a count.

use k8s_openapi::api::core::v1::{Event, ObjectReference};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

/// The component the controller's events are reported by.
pub use cdi_core::datavolume::COMPONENT;

/// Record `reason`/`message` on `obj` (`warning` selects the type).
pub async fn record<K>(client: &Client, obj: &K, warning: bool, reason: &str, message: &str)
where
    K: Resource<DynamicType = ()>,
{
    let ns = obj.namespace().unwrap_or_else(|| "default".into());
    let name = obj.name_any();
    let api: Api<Event> = Api::namespaced(client.clone(), &ns);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let uid = obj.meta().uid.clone();
    // Same object, reason and message: count it again instead of adding an event.
    let same = api
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .ok()
        .and_then(|l| {
            l.items.into_iter().find(|e| {
                e.involved_object.uid == uid
                    && e.reason.as_deref() == Some(reason)
                    && e.message.as_deref() == Some(message)
            })
        });
    if let Some(e) = same {
        let count = e.count.unwrap_or(1) + 1;
        let patch = json!({"count": count, "lastTimestamp": now});
        if let Err(err) = api
            .patch(
                &e.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            tracing::debug!(error = %err, "counting an event");
        }
        return;
    }
    let event = Event {
        metadata: kube::api::ObjectMeta {
            name: Some(event_name(&name)),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some(K::api_version(&()).into_owned()),
            kind: Some(K::kind(&()).into_owned()),
            name: Some(name),
            namespace: Some(ns),
            uid,
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some(if warning { "Warning" } else { "Normal" }.into()),
        count: Some(1),
        first_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        )),
        last_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        )),
        source: Some(k8s_openapi::api::core::v1::EventSource {
            component: Some(COMPONENT.into()),
            host: None,
        }),
        ..Default::default()
    };
    if let Err(err) = api.create(&PostParams::default(), &event).await {
        tracing::debug!(error = %err, "recording an event");
    }
}

/// An event's name as client-go makes it, `<object>.<nanoseconds in hex>`.
fn event_name(object: &str) -> String {
    let nanos = k8s_openapi::jiff::Timestamp::now().as_nanosecond();
    cdi_core::naming::event_name(object, &format!("{nanos:x}"))
}
