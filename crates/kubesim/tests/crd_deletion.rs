//! Deleting a CustomResourceDefinition deletes its objects, as kube-apiserver does: the CRD stays
//! `Terminating` under the `customresourcecleanup.apiextensions.k8s.io` finalizer until the last
//! of them is gone (each as its own finalizers allow), creating one meanwhile is refused, and
//! then its kind is no longer served. A CRD the garbage collector deletes (CDI's CRDs go with
//! the CDI resource that owns them) goes the same way.

use std::fmt::Debug;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::wait::{Condition, await_condition, conditions};
use kube::{Api, Client, Resource, ResourceExt};
use kubesim::apiserver::ApiServer;
use serde::de::DeserializeOwned;
use serde_json::json;

const CRD: &str = "widgets.example.com";
const CLEANUP: &str = "customresourcecleanup.apiextensions.k8s.io";
const HOLD: &str = "example.com/hold";

fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD},
        "spec": {"group": "example.com", "scope": "Namespaced",
          "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
          "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
            "type": "object", "properties": {"spec": {"type": "object"}}}}}]}
    }))
    .unwrap()
}

fn widget_resource() -> ApiResource {
    ApiResource {
        group: "example.com".into(),
        version: "v1".into(),
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

fn widgets(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &widget_resource())
}

fn widget(name: &str, finalizers: &[&str]) -> DynamicObject {
    serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": name, "finalizers": finalizers}, "spec": {}}))
    .unwrap()
}

/// The CRD's `Terminating` condition, as "status reason".
fn terminating(crd: &CustomResourceDefinition) -> Option<String> {
    let conditions = crd.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == "Terminating")?;
    Some(format!(
        "{} {}",
        c.status,
        c.reason.as_deref().unwrap_or("")
    ))
}

/// The object once a watch sees `cond` hold for it (None: gone); fail after 30 s naming `what`.
async fn until<K>(what: &str, api: &Api<K>, name: &str, cond: impl Condition<K>) -> Option<K>
where
    K: Resource + Clone + Debug + Send + DeserializeOwned + 'static,
{
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(api.clone(), name, cond),
    )
    .await
    .unwrap_or_else(|_| panic!("{what}: not within 30 s"))
    .unwrap()
}

/// Widgets in two namespaces, one held by a finalizer: deleting their CRD deletes them all, the
/// CRD waiting, Terminating, until the held one is released; a new widget is refused meanwhile;
/// then the kind is gone, and a new CRD of the name finds nothing left.
#[tokio::test]
async fn a_deleted_crd_takes_its_objects_and_waits_for_their_finalizers() {
    let server = ApiServer::new();
    let client = Client::new(server.router(), "default");
    let pp = PostParams::default();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.create(&pp, &widget_crd()).await.unwrap();
    let other: Namespace = serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&pp, &other)
        .await
        .unwrap();
    let (here, there) = (widgets(&client, "default"), widgets(&client, "other"));
    let free_here = here.create(&pp, &widget("free", &[])).await.unwrap();
    let free_there = there.create(&pp, &widget("free", &[])).await.unwrap();
    there.create(&pp, &widget("held", &[HOLD])).await.unwrap();

    // Every change of the CRD from here on, in order.
    let fields = format!("metadata.name={CRD}");
    let mut changes = crds
        .watch(
            &WatchParams::default().fields(&fields).timeout(60),
            &crd.resource_version().unwrap(),
        )
        .await
        .unwrap()
        .boxed();

    let deleting = crds
        .delete(CRD, &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("the CRD stays while it has objects");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert!(
        deleting.finalizers().iter().any(|f| f == CLEANUP),
        "{:?}",
        deleting.finalizers()
    );

    // Its objects are deleted in every namespace; the held one waits for its finalizer...
    for (api, free) in [(&here, &free_here), (&there, &free_there)] {
        let uid = free.uid().unwrap();
        until(
            "a free widget deleted",
            api,
            "free",
            conditions::is_deleted(&uid),
        )
        .await;
    }
    until(
        "the held widget marked",
        &there,
        "held",
        |w: Option<&DynamicObject>| w.is_some_and(|w| w.metadata.deletion_timestamp.is_some()),
    )
    .await;
    // ...and so does the CRD, Terminating.
    let in_progress = |c: Option<&CustomResourceDefinition>| {
        c.and_then(terminating).as_deref() == Some("True InstanceDeletionInProgress")
    };
    let waiting = until("the CRD terminating", &crds, CRD, in_progress)
        .await
        .expect("the CRD waits for the held widget");
    assert!(waiting.finalizers().iter().any(|f| f == CLEANUP));

    // Meanwhile a new widget is refused, in kube's words.
    match here.create(&pp, &widget("late", &[])).await {
        Err(kube::Error::Api(s)) => assert_eq!(
            (s.code, s.reason.as_str(), s.message.as_str()),
            (
                405,
                "MethodNotAllowed",
                "create not allowed while custom resource definition is terminating"
            )
        ),
        other => panic!("a widget created while its CRD terminates: {other:?}"),
    }

    // Released, the held widget goes, and only then the CRD.
    let released = there
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    let released_at: u64 = released.resource_version().unwrap().parse().unwrap();
    let gone = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match changes.try_next().await.unwrap() {
                Some(WatchEvent::Deleted(c)) => return c,
                Some(WatchEvent::Modified(_) | WatchEvent::Bookmark(_)) => {}
                other => panic!("the CRD's watch: {other:?}"),
            }
        }
    })
    .await
    .expect("the CRD went within 30 s");
    let gone_at: u64 = gone.resource_version().unwrap().parse().unwrap();
    assert!(
        gone_at > released_at,
        "the CRD went (version {gone_at}) before its last widget did ({released_at})"
    );
    assert_eq!(
        terminating(&gone).as_deref(),
        Some("False InstanceDeletionCompleted")
    );

    // Its kind is no longer served, and a new CRD of the name finds nothing left.
    match here.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 404),
        other => panic!("widgets listed without their CRD: {other:?}"),
    }
    crds.create(&pp, &widget_crd()).await.unwrap();
    let all: Api<DynamicObject> = Api::all_with(client, &widget_resource());
    let left = all.list(&ListParams::default()).await.unwrap().items;
    assert!(left.is_empty(), "{left:?}");
}

/// The reported case: CDI's CRDs are owned by the CDI resource, so the garbage collector, not a
/// client, deletes them; their objects go with them all the same.
#[tokio::test]
async fn a_crd_its_owner_took_goes_with_its_objects() {
    let server = ApiServer::new();
    let client = Client::new(server.router(), "default");
    let pp = PostParams::default();
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let owner: ClusterRole =
        serde_json::from_value(json!({"metadata": {"name": "widget-installer"}})).unwrap();
    let owner = roles.create(&pp, &owner).await.unwrap();
    let mut owned = widget_crd();
    owned.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: "ClusterRole".into(),
        name: owner.name_any(),
        uid: owner.uid().unwrap(),
        ..Default::default()
    }]);
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.create(&pp, &owned).await.unwrap();
    let here = widgets(&client, "default");
    let mut made = Vec::new();
    for name in ["a", "b"] {
        made.push(here.create(&pp, &widget(name, &[])).await.unwrap());
    }
    // What a widget owns goes with it, also when the CRD's deletion took the widget.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let map: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "owned-by-a",
        "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "Widget",
            "name": "a", "uid": made[0].uid().unwrap()}]}}))
    .unwrap();
    let map = maps.create(&pp, &map).await.unwrap();

    roles
        .delete("widget-installer", &DeleteParams::default())
        .await
        .unwrap();
    let uid = crd.uid().unwrap();
    until(
        "the owned CRD collected",
        &crds,
        CRD,
        conditions::is_deleted(&uid),
    )
    .await;
    match here.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 404),
        other => panic!("widgets listed without their CRD: {other:?}"),
    }
    until(
        "the widget's ConfigMap collected",
        &maps,
        "owned-by-a",
        conditions::is_deleted(&map.uid().unwrap()),
    )
    .await;
    crds.create(&pp, &widget_crd()).await.unwrap();
    let left = here.list(&ListParams::default()).await.unwrap().items;
    assert!(left.is_empty(), "{left:?}");
}
