//! The real kube-rs client and runtime against the embedded API server, in process.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cdi_api::DataVolume;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{Controller, controller::Action, watcher};
use kube::{Api, Client, ResourceExt};
use kubesim::apiserver::ApiServer;
use serde_json::json;

fn client(server: &ApiServer) -> Client {
    Client::new(server.router(), "default")
}

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    c.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    c.data = Some([("k".to_string(), "v".to_string())].into());
    c
}

async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in cdi_api::crd::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
}

#[tokio::test]
async fn crud_selectors_conflicts_and_patches() {
    let server = ApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(client(&server), "default");
    let a = cms
        .create(
            &PostParams::default(),
            &cm("a", &[("app", "cdi"), ("tier", "web")]),
        )
        .await
        .unwrap();
    assert!(a.metadata.uid.is_some() && a.metadata.creation_timestamp.is_some());
    cms.create(&PostParams::default(), &cm("b", &[("app", "other")]))
        .await
        .unwrap();
    let err = cms
        .create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{err}"
    );

    let names = |l: kube::core::ObjectList<ConfigMap>| {
        l.items.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            cms.list(&ListParams::default().labels("app=cdi"))
                .await
                .unwrap()
        ),
        ["a"]
    );
    assert_eq!(
        names(
            cms.list(&ListParams::default().labels("app in (cdi,other),tier!=db"))
                .await
                .unwrap()
        ),
        ["a", "b"]
    );
    assert_eq!(
        names(
            cms.list(&ListParams::default().fields("metadata.name=b"))
                .await
                .unwrap()
        ),
        ["b"]
    );
    let page = cms.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(names(page.clone()), ["a"]);
    let rest = cms
        .list(
            &ListParams::default()
                .limit(1)
                .continue_token(page.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(names(rest), ["b"]);

    // A stale resourceVersion is a conflict.
    let mut stale = a.clone();
    let mut fresh = a.clone();
    fresh.data = Some([("k".to_string(), "new".to_string())].into());
    cms.replace("a", &PostParams::default(), &fresh)
        .await
        .unwrap();
    stale.data = Some([("k".to_string(), "lost update".to_string())].into());
    let err = cms
        .replace("a", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.reason == "Conflict"),
        "{err}"
    );

    let merged = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": null, "x": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        merged.labels(),
        &BTreeMap::from([
            ("app".to_string(), "cdi".to_string()),
            ("x".to_string(), "1".to_string())
        ])
    );
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/data/j", "value": "p"}])).unwrap();
    let patched = cms
        .patch("a", &PatchParams::default(), &Patch::<()>::Json(jp))
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["j"], "p");
    let applied = cms
        .patch("c", &PatchParams::apply("test").force(), &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}})))
        .await
        .unwrap();
    assert_eq!(applied.data.unwrap()["a"], "b", "apply creates");

    cms.delete("b", &DeleteParams::default()).await.unwrap();
    let err = cms.get("b").await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404 && s.reason == "NotFound"),
        "{err}"
    );

    let mut generated = cm("", &[]);
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".into());
    let g = cms
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    assert!(g.name_any().starts_with("gen-") && g.name_any().len() > 4);

    // deletecollection with a selector.
    cms.create(&PostParams::default(), &cm("drop-1", &[("batch", "x")]))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &cm("drop-2", &[("batch", "x")]))
        .await
        .unwrap();
    cms.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("batch=x"),
    )
    .await
    .unwrap();
    assert!(
        cms.list(&ListParams::default().labels("batch=x"))
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(cms.get_opt("a").await.unwrap().is_some(), "others stay");

    let other: Api<ConfigMap> = Api::namespaced(client(&server), "missing");
    let err = other
        .create(&PostParams::default(), &cm("x", &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404),
        "{err}"
    );
}

#[tokio::test]
async fn custom_resources_from_the_generated_crds() {
    let server = ApiServer::new();
    let client = client(&server);
    install_crds(&client).await;
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), "default");
    let dv: DataVolume = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "disk"},
        "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}},
        "status": {"phase": "Succeeded"}
    }))
    .unwrap();
    let created = dvs.create(&PostParams::default(), &dv).await.unwrap();
    assert!(created.status.is_none(), "status is ignored on create");
    assert_eq!(created.metadata.generation, Some(1));

    let mut with_status = created.clone();
    with_status.status = Some(serde_json::from_value(json!({"phase": "ImportScheduled"})).unwrap());
    with_status.spec.priority_class_name = Some("ignored-by-status".into());
    let s = dvs
        .replace_status("disk", &PostParams::default(), &with_status)
        .await
        .unwrap();
    assert_eq!(s.phase().map(|p| p.as_str()), Some("ImportScheduled"));
    assert_eq!(
        s.spec.priority_class_name, None,
        "the status endpoint does not change spec"
    );
    assert_eq!(s.metadata.generation, Some(1));

    let mut spec_change = s.clone();
    spec_change.spec.priority_class_name = Some("high".into());
    spec_change.status = None;
    let u = dvs
        .replace("disk", &PostParams::default(), &spec_change)
        .await
        .unwrap();
    assert_eq!(
        u.metadata.generation,
        Some(2),
        "a spec change bumps the generation"
    );
    assert_eq!(
        u.phase().map(|p| p.as_str()),
        Some("ImportScheduled"),
        "the main endpoint keeps status"
    );

    // Discovery sees the new kinds with their short names.
    let discovery = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    let (ar, caps) = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .find(|(ar, _)| ar.kind == "DataVolume")
        .expect("DataVolume discovered");
    assert_eq!(
        (ar.plural.as_str(), ar.group.as_str()),
        ("datavolumes", "cdi.kubevirt.io")
    );
    assert!(caps.subresources.iter().any(|(s, _)| s.plural == "status"));

    // Deleting the CRD removes the resource.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete("datavolumes.cdi.kubevirt.io", &DeleteParams::default())
        .await
        .unwrap();
    assert!(dvs.list(&ListParams::default()).await.is_err());
}

#[tokio::test]
async fn finalizers_and_garbage_collection() {
    let server = ApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(client(&server), "default");
    let mut held = cm("held", &[]);
    held.metadata.finalizers = Some(vec!["cdi.kubevirt.io/test".into()]);
    cms.create(&PostParams::default(), &held).await.unwrap();
    cms.delete("held", &DeleteParams::default()).await.unwrap();
    let still = cms.get("held").await.unwrap();
    assert!(
        still.metadata.deletion_timestamp.is_some(),
        "finalizers keep the object"
    );
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(
        cms.get("held").await.is_err(),
        "gone with the last finalizer"
    );

    let owned = |name: &str, owner: &ConfigMap| {
        let mut c = cm(name, &[]);
        c.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: owner.name_any(),
            uid: owner.uid().unwrap(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        c
    };
    for policy in ["Background", "Orphan", "Foreground"] {
        let owner = cms
            .create(
                &PostParams::default(),
                &cm(&format!("owner-{}", policy.to_lowercase()), &[]),
            )
            .await
            .unwrap();
        cms.create(
            &PostParams::default(),
            &owned(&format!("child-{}", policy.to_lowercase()), &owner),
        )
        .await
        .unwrap();
        let params = match policy {
            "Background" => DeleteParams::background(),
            "Orphan" => DeleteParams::orphan(),
            _ => DeleteParams::foreground(),
        };
        cms.delete(&owner.name_any(), &params).await.unwrap();
        let child = cms
            .get_opt(&format!("child-{}", policy.to_lowercase()))
            .await
            .unwrap();
        match policy {
            "Orphan" => assert!(
                child
                    .unwrap()
                    .metadata
                    .owner_references
                    .unwrap_or_default()
                    .is_empty()
            ),
            _ => assert!(child.is_none(), "{policy}: dependents are collected"),
        }
        assert!(
            cms.get_opt(&owner.name_any()).await.unwrap().is_none(),
            "{policy}: the owner is gone"
        );
    }

    // Deleting a namespace removes what is in it.
    let namespaces: Api<Namespace> = Api::all(client(&server));
    let mut ns = Namespace::default();
    ns.metadata.name = Some("scratch".into());
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let in_ns: Api<ConfigMap> = Api::namespaced(client(&server), "scratch");
    in_ns
        .create(&PostParams::default(), &cm("x", &[]))
        .await
        .unwrap();
    namespaces
        .delete("scratch", &DeleteParams::default())
        .await
        .unwrap();
    assert!(namespaces.get_opt("scratch").await.unwrap().is_none());
    assert!(in_ns.get_opt("x").await.unwrap().is_none());
}

#[tokio::test]
async fn watches_resume_and_expire() {
    let server = ApiServer::with_history(20);
    let cms: Api<ConfigMap> = Api::namespaced(client(&server), "default");
    let first = cms
        .create(&PostParams::default(), &cm("w0", &[("app", "cdi")]))
        .await
        .unwrap();
    let rv = first.resource_version().unwrap();
    cms.create(&PostParams::default(), &cm("w1", &[("app", "cdi")]))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &cm("other", &[("app", "x")]))
        .await
        .unwrap();
    cms.delete("w0", &DeleteParams::default()).await.unwrap();

    // Resume from a version: exactly what happened after it, filtered by the selector.
    let mut stream = cms
        .watch(&WatchParams::default().labels("app=cdi").timeout(2), &rv)
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    while let Some(ev) = stream.try_next().await.unwrap() {
        match ev {
            WatchEvent::Added(c) => seen.push(format!("ADDED {}", c.name_any())),
            WatchEvent::Deleted(c) => seen.push(format!("DELETED {}", c.name_any())),
            WatchEvent::Modified(c) => seen.push(format!("MODIFIED {}", c.name_any())),
            _ => {}
        }
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(seen, ["ADDED w1", "DELETED w0"]);

    for i in 0..30 {
        cms.create(&PostParams::default(), &cm(&format!("n{i}"), &[]))
            .await
            .unwrap();
    }
    let mut expired = cms
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .boxed();
    match expired.try_next().await {
        Ok(Some(WatchEvent::Error(e))) => assert_eq!(e.code, 410),
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 410),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
}

#[tokio::test]
async fn watcher_and_controller_react() {
    let server = ApiServer::new();
    let client = client(&server);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    // A controller that marks every ConfigMap it reconciles.
    let reconcile = |obj: Arc<ConfigMap>, client: Arc<Client>| async move {
        let api: Api<ConfigMap> = Api::namespaced((*client).clone(), "default");
        api.patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"reconciled": "true"}}})),
        )
        .await?;
        Ok::<_, kube::Error>(Action::await_change())
    };
    let controller = Controller::new(cms.clone(), watcher::Config::default())
        .run(
            reconcile,
            |_obj, _err: &kube::Error, _ctx| Action::requeue(Duration::from_millis(200)),
            Arc::new(client.clone()),
        )
        .for_each(|_| async {});
    let task = tokio::spawn(controller);

    let mut events = watcher(cms.clone(), watcher::Config::default()).boxed();
    cms.create(&PostParams::default(), &cm("seen", &[]))
        .await
        .unwrap();
    let mut saw_apply = false;
    let mut saw_reconciled = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !(saw_apply && saw_reconciled) && tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(10), events.try_next()).await {
            Ok(Ok(Some(watcher::Event::Apply(c) | watcher::Event::InitApply(c))))
                if c.name_any() == "seen" =>
            {
                saw_apply = true;
                saw_reconciled |= c
                    .annotations()
                    .get("reconciled")
                    .is_some_and(|v| v == "true");
            }
            Ok(Ok(Some(_))) => {}
            other => panic!("watcher stopped: {other:?}"),
        }
    }
    task.abort();
    assert!(saw_apply, "the watcher saw the new object");
    assert!(saw_reconciled, "the controller reconciled it");
}

#[tokio::test]
async fn custom_resources_are_validated_pruned_and_defaulted() {
    let server = ApiServer::new();
    let client = client(&server);
    install_crds(&client).await;
    let dvs: Api<kube::core::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &kube::core::ApiResource::erase::<DataVolume>(&()),
    );
    let bad: kube::core::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "bad"},
        "spec": {"contentType": "tarball", "storage": {"resources": {"requests": {"storage": "1Gi"}}}}
    }))
    .unwrap();
    let err = dvs.create(&PostParams::default(), &bad).await.unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
            assert!(
                s.message
                    .contains("spec.contentType: Unsupported value: \"tarball\""),
                "{}",
                s.message
            );
        }
        other => panic!("{other}"),
    }

    let extra: kube::core::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "extra"},
        "spec": {"bogus": 1, "source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}
    }))
    .unwrap();
    let created = dvs.create(&PostParams::default(), &extra).await.unwrap();
    assert!(
        created.data["spec"].get("bogus").is_none(),
        "unknown fields are pruned"
    );
    let strict = PatchParams {
        field_validation: Some(kube::api::ValidationDirective::Strict),
        ..Default::default()
    };
    let err = dvs
        .patch(
            "extra",
            &strict,
            &Patch::Merge(json!({"spec": {"bogus": 2}})),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("unknown field \"spec.bogus\""),
        "{err}"
    );

    // A CRD of our own with a default.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced", "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
          "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "properties": {"size": {"type": "integer", "default": 3}}}}}}}]}
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let widgets: Api<kube::core::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &kube::core::ApiResource {
            group: "example.com".into(),
            version: "v1".into(),
            api_version: "example.com/v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        },
    );
    let w: kube::core::DynamicObject = serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}})).unwrap();
    let created = widgets.create(&PostParams::default(), &w).await.unwrap();
    assert_eq!(created.data["spec"]["size"], 3, "defaults are applied");
}

#[tokio::test]
async fn pods_on_a_node_are_deleted_gracefully() {
    use k8s_openapi::api::core::v1::Pod;
    let server = ApiServer::new();
    let pods: Api<Pod> = Api::namespaced(client(&server), "default");
    let pod = |name: &str, node: Option<&str>| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}})).unwrap()
    };
    pods.create(&PostParams::default(), &pod("unscheduled", None))
        .await
        .unwrap();
    pods.delete("unscheduled", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        pods.get_opt("unscheduled").await.unwrap().is_none(),
        "no node: deleted at once"
    );

    pods.create(&PostParams::default(), &pod("running", Some("node-1")))
        .await
        .unwrap();
    pods.delete("running", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = pods.get("running").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));
    pods.delete(
        "running",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        pods.get_opt("running").await.unwrap().is_none(),
        "the kubelet's zero-grace delete removes it"
    );
}

#[tokio::test]
async fn tls_with_the_written_kubeconfig() {
    let server = ApiServer::new();
    let (addr, _task) = server.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let yaml = server.kubeconfig(&format!("https://{addr}"));
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = Client::try_from(config).unwrap();
    let namespaces: Api<Namespace> = Api::all(client);
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert_eq!(names, ["default", "kube-public", "kube-system"]);
}

/// kube-rs's event Recorder writes events.k8s.io/v1 Events (a create, then a merge patch with a
/// series when the event repeats); core/v1 clients see them as the same, one, Event.
#[tokio::test]
async fn recorded_events_are_core_events() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event;
    use kube::Resource;
    use kube::runtime::events::{Event as Recorded, EventType, Recorder, Reporter};

    let server = ApiServer::new();
    let client = client(&server);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let target = cms
        .create(&PostParams::default(), &cm("recorded", &[]))
        .await
        .unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "cdi-test".into(),
            instance: Some("cdi-test-0".into()),
        },
    );
    let slow = Recorded {
        type_: EventType::Warning,
        reason: "Slow".into(),
        note: Some("the import is slow".into()),
        action: "Import".into(),
        secondary: None,
    };
    let reference = target.object_ref(&());
    recorder.publish(&slow, &reference).await.unwrap();
    recorder.publish(&slow, &reference).await.unwrap();

    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let listed = core
        .list(&ListParams::default().fields("involvedObject.name=recorded"))
        .await
        .unwrap()
        .items;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let e = &listed[0];
    assert_eq!(e.message.as_deref(), Some("the import is slow"));
    assert_eq!(e.reason.as_deref(), Some("Slow"));
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.reporting_component.as_deref(), Some("cdi-test"));
    assert_eq!(e.reporting_instance.as_deref(), Some("cdi-test-0"));
    assert_eq!(e.involved_object.kind.as_deref(), Some("ConfigMap"));
    assert_eq!(e.involved_object.uid, target.metadata.uid);
    // The repeat is counted by the series; `count` is the deprecated count, which kube's
    // conversion copies and the Recorder never sets.
    assert_eq!(e.series.as_ref().and_then(|s| s.count), Some(2));
    assert_eq!(e.count, None);

    // The events.k8s.io view of the same storage, selected by its own field labels.
    let events: Api<Event> = Api::namespaced(client, "default");
    let listed = events
        .list(&ListParams::default().fields("regarding.name=recorded,reportingController=cdi-test"))
        .await
        .unwrap()
        .items;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].note.as_deref(), Some("the import is slow"));
    assert_eq!(listed[0].series.as_ref().map(|s| s.count), Some(2));
    let err = events
        .list(&ListParams::default().fields("involvedObject.name=recorded"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 400
            && s.message == "field label not supported: involvedObject.name"),
        "{err}"
    );
}

/// A core/v1 Event, as this system's components write them, read and watched through
/// events.k8s.io/v1.
#[tokio::test]
async fn core_events_read_through_events_k8s_io() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event;

    let server = ApiServer::new();
    let client = client(&server);
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let before = events.list(&ListParams::default()).await.unwrap();
    let mut watch = events
        .watch(
            &WatchParams::default()
                .fields("regarding.name=claim")
                .timeout(5),
            before.metadata.resource_version.as_deref().unwrap(),
        )
        .await
        .unwrap()
        .boxed();

    let core: Api<CoreEvent> = Api::namespaced(client, "default");
    let written: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "claim.1"},
        "involvedObject": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "namespace": "default", "name": "claim"},
        "reason": "Provisioning", "message": "provisioning a volume", "type": "Normal",
        "source": {"component": "local-path-provisioner"},
        "count": 3,
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:02:00Z",
        "reportingComponent": "local-path-provisioner",
    }))
    .unwrap();
    core.create(&PostParams::default(), &written).await.unwrap();

    let read = events.get("claim.1").await.unwrap();
    assert_eq!(
        read.regarding.as_ref().unwrap().name.as_deref(),
        Some("claim")
    );
    assert_eq!(read.note.as_deref(), Some("provisioning a volume"));
    assert_eq!(read.deprecated_count, Some(3));
    assert_eq!(
        read.deprecated_source
            .as_ref()
            .unwrap()
            .component
            .as_deref(),
        Some("local-path-provisioner")
    );
    assert_eq!(
        read.reporting_controller.as_deref(),
        Some("local-path-provisioner")
    );
    assert!(read.deprecated_first_timestamp.is_some() && read.deprecated_last_timestamp.is_some());

    match watch.try_next().await.unwrap() {
        Some(WatchEvent::Added(e)) => {
            assert_eq!(e.name_any(), "claim.1");
            assert_eq!(e.note.as_deref(), Some("provisioning a volume"));
        }
        other => panic!("expected the event ADDED, got {other:?}"),
    }

    // Errors name the resource asked for.
    let err = events.get("missing").await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404
            && s.message == "events.events.k8s.io \"missing\" not found"),
        "{err}"
    );
}

/// The count of `apiserver_request_total` samples whose labels include all of `want`.
fn requests(text: &str, want: &[&str]) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| want.iter().all(|w| l.contains(w)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn requests_are_counted_by_verb_resource_and_code() {
    let server = ApiServer::new();
    let c = client(&server);
    let cms: Api<ConfigMap> = Api::default_namespaced(c.clone());
    cms.create(&PostParams::default(), &cm("one", &[]))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &cm("one", &[]))
        .await
        .unwrap_err();
    cms.get("one").await.unwrap();
    cms.list(&ListParams::default()).await.unwrap();
    cms.patch(
        "one",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "w"}})),
    )
    .await
    .unwrap();
    cms.delete("one", &DeleteParams::default()).await.unwrap();
    let metrics = c
        .request_text(
            axum::http::Request::get("/metrics")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let cm = r#"resource="configmaps""#;
    for (verb, code, n) in [
        ("create", "201", 1),
        ("create", "409", 1),
        ("get", "200", 1),
        ("list", "200", 1),
        ("patch", "200", 1),
        ("delete", "200", 1),
    ] {
        let (v, k) = (format!(r#"verb="{verb}""#), format!(r#"code="{code}""#));
        assert_eq!(
            requests(&metrics, &[cm, &v, &k]),
            n,
            "{verb} {code}:\n{metrics}"
        );
    }
    assert!(
        metrics.contains("# TYPE apiserver_request counter"),
        "{metrics}"
    );
}
