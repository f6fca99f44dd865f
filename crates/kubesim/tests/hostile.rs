//! What a hostile review found in the embedded API server, each checked against what
//! kube-apiserver does: garbage collection of dependents whose owners are gone, names and pods
//! validated per kind, query parameters parsed as kube parses them (the Python client's
//! `watch=True`), and limits on request bodies and object sizes.

mod common;

use std::io::BufRead;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, Client, ResourceExt};
use kubesim::apiserver::ApiServer;
use serde_json::{Value, json};

fn client(server: &ApiServer) -> Client {
    Client::new(server.router(), "default")
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

fn reference(kind: &str, api_version: &str, name: &str, uid: &str, block: bool) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: None,
        block_owner_deletion: Some(block),
    }
}

fn cm_ref(owner: &ConfigMap, block: bool) -> OwnerReference {
    reference(
        "ConfigMap",
        "v1",
        &owner.name_any(),
        &owner.uid().unwrap(),
        block,
    )
}

fn owned(name: &str, refs: Vec<OwnerReference>, finalizers: &[&str]) -> ConfigMap {
    let mut c = cm(name);
    c.metadata.owner_references = Some(refs);
    if !finalizers.is_empty() {
        c.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
    }
    c
}

const HOLD: &str = "example.com/hold";

async fn release(cms: &Api<ConfigMap>, name: &str) {
    cms.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
}

async fn exists(cms: &Api<ConfigMap>, name: &str) -> bool {
    cms.get_opt(name).await.unwrap().is_some()
}

async fn terminating(cms: &Api<ConfigMap>, name: &str) -> bool {
    cms.get_opt(name)
        .await
        .unwrap()
        .is_some_and(|c| c.metadata.deletion_timestamp.is_some())
}

/// The next event of a watch as ("TYPE", name).
async fn next_event(
    events: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin),
) -> (String, String) {
    let ev = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .expect("an event within 10 s")
        .unwrap()
        .expect("the watch goes on");
    match ev {
        WatchEvent::Added(c) => ("ADDED".into(), c.name_any()),
        WatchEvent::Modified(c) => ("MODIFIED".into(), c.name_any()),
        WatchEvent::Deleted(c) => ("DELETED".into(), c.name_any()),
        other => panic!("unexpected {other:?}"),
    }
}

fn pair(t: &str, n: &str) -> (String, String) {
    (t.to_string(), n.to_string())
}

#[tokio::test]
async fn dependents_of_owners_already_gone_are_collected() {
    let server = ApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(client(&server), "default");
    let pp = PostParams::default();
    let owner = cms.create(&pp, &cm("dv")).await.unwrap();
    cms.delete("dv", &DeleteParams::default()).await.unwrap();

    // The DataVolume controller's race: the claim's create lands after its owner's deletion.
    // kube admits it (201) and its garbage collector deletes it.
    let rv = server.store().resource_version().to_string();
    let mut events = cms
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    let created = cms
        .create(&pp, &owned("claim", vec![cm_ref(&owner, true)], &[]))
        .await
        .unwrap();
    assert_eq!(created.name_any(), "claim");
    assert_eq!(next_event(&mut events).await, pair("ADDED", "claim"));
    assert_eq!(next_event(&mut events).await, pair("DELETED", "claim"));
    assert!(!exists(&cms, "claim").await);

    // An owner of the same name but another uid is not the owner.
    let again = cms.create(&pp, &cm("dv")).await.unwrap();
    cms.create(&pp, &owned("stale", vec![cm_ref(&owner, false)], &[]))
        .await
        .unwrap();
    assert!(
        !exists(&cms, "stale").await,
        "a uid mismatch is an absent owner"
    );
    cms.create(&pp, &owned("fresh", vec![cm_ref(&again, false)], &[]))
        .await
        .unwrap();
    assert!(exists(&cms, "fresh").await, "a live owner keeps it");

    // With one live owner left, the dependent stays and loses the dangling reference.
    cms.create(
        &pp,
        &owned(
            "shared",
            vec![cm_ref(&again, false), cm_ref(&owner, true)],
            &[],
        ),
    )
    .await
    .unwrap();
    let shared = cms.get("shared").await.unwrap();
    let uids: Vec<String> = shared
        .owner_references()
        .iter()
        .map(|r| r.uid.clone())
        .collect();
    assert_eq!(uids, [again.uid().unwrap()]);

    // An owner of a kind the server does not serve cannot be looked up: left alone, as kube's
    // collector does.
    let unknown = reference("Nothing", "example.com/v1", "x", "u-1", true);
    cms.create(&pp, &owned("unresolved", vec![unknown], &[]))
        .await
        .unwrap();
    assert_eq!(
        cms.get("unresolved")
            .await
            .unwrap()
            .owner_references()
            .len(),
        1
    );

    // An update that adds a dangling reference is noticed too.
    cms.create(&pp, &cm("plain")).await.unwrap();
    cms.patch(
        "plain",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"ownerReferences": [cm_ref(&owner, false)]}})),
    )
    .await
    .unwrap();
    assert!(!exists(&cms, "plain").await);

    // Cluster-scoped owners are looked up without the dependent's namespace.
    let pvs: Api<PersistentVolume> = Api::all(client(&server));
    let pv: PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "pv-1"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "hostPath": {"path": "/tmp/pv-1"}}}))
    .unwrap();
    let pv = pvs.create(&pp, &pv).await.unwrap();
    let pv_ref = reference("PersistentVolume", "v1", "pv-1", &pv.uid().unwrap(), false);
    cms.create(&pp, &owned("on-pv", vec![pv_ref], &[]))
        .await
        .unwrap();
    assert!(exists(&cms, "on-pv").await);
    pvs.delete("pv-1", &DeleteParams::default()).await.unwrap();
    assert!(!exists(&cms, "on-pv").await);
}

#[tokio::test]
async fn foreground_deletion_waits_only_for_blocking_dependents() {
    let server = ApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(client(&server), "default");
    let pp = PostParams::default();

    let owner = cms.create(&pp, &cm("owner")).await.unwrap();
    cms.create(&pp, &owned("blocking", vec![cm_ref(&owner, true)], &[HOLD]))
        .await
        .unwrap();
    cms.create(&pp, &owned("loose", vec![cm_ref(&owner, false)], &[HOLD]))
        .await
        .unwrap();
    cms.delete("owner", &DeleteParams::foreground())
        .await
        .unwrap();
    let waiting = cms.get("owner").await.unwrap();
    assert!(waiting.metadata.deletion_timestamp.is_some());
    assert_eq!(waiting.finalizers(), ["foregroundDeletion"]);
    assert!(terminating(&cms, "blocking").await && terminating(&cms, "loose").await);

    // A dependent that does not block goes without releasing its owner...
    release(&cms, "loose").await;
    assert!(!exists(&cms, "loose").await);
    assert!(terminating(&cms, "owner").await);
    // ...the blocking one does.
    release(&cms, "blocking").await;
    assert!(!exists(&cms, "blocking").await);
    assert!(!exists(&cms, "owner").await);

    // Only non-blocking dependents: the owner goes at once, they are collected on their own.
    let owner = cms.create(&pp, &cm("owner2")).await.unwrap();
    cms.create(&pp, &owned("loose2", vec![cm_ref(&owner, false)], &[HOLD]))
        .await
        .unwrap();
    cms.delete("owner2", &DeleteParams::foreground())
        .await
        .unwrap();
    assert!(!exists(&cms, "owner2").await);
    assert!(terminating(&cms, "loose2").await);
    release(&cms, "loose2").await;
    assert!(!exists(&cms, "loose2").await);

    // A chain: the middle dependent goes in the foreground too and waits for its own.
    let top = cms.create(&pp, &cm("top")).await.unwrap();
    let middle = cms
        .create(&pp, &owned("middle", vec![cm_ref(&top, true)], &[]))
        .await
        .unwrap();
    cms.create(&pp, &owned("bottom", vec![cm_ref(&middle, true)], &[HOLD]))
        .await
        .unwrap();
    cms.delete("top", &DeleteParams::foreground())
        .await
        .unwrap();
    assert!(terminating(&cms, "top").await);
    let middle = cms.get("middle").await.unwrap();
    assert_eq!(middle.finalizers(), ["foregroundDeletion"]);
    assert!(terminating(&cms, "bottom").await);
    release(&cms, "bottom").await;
    for name in ["bottom", "middle", "top"] {
        assert!(!exists(&cms, name).await, "{name}");
    }
}

#[tokio::test]
async fn background_and_orphan_propagation() {
    let server = ApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(client(&server), "default");
    let pp = PostParams::default();

    // Background: the owner goes at once, its dependents (and theirs) after it.
    let root = cms.create(&pp, &cm("root")).await.unwrap();
    let child = cms
        .create(&pp, &owned("child", vec![cm_ref(&root, false)], &[]))
        .await
        .unwrap();
    cms.create(&pp, &owned("grandchild", vec![cm_ref(&child, false)], &[]))
        .await
        .unwrap();
    cms.create(&pp, &owned("held", vec![cm_ref(&root, true)], &[HOLD]))
        .await
        .unwrap();
    cms.delete("root", &DeleteParams::background())
        .await
        .unwrap();
    assert!(!exists(&cms, "root").await);
    assert!(!exists(&cms, "child").await && !exists(&cms, "grandchild").await);
    assert!(terminating(&cms, "held").await);
    release(&cms, "held").await;

    // Orphan, of an owner held by its own finalizer: the dependents let go of it at once
    // and stay when it finally goes.
    let mut parent = cm("parent");
    parent.metadata.finalizers = Some(vec![HOLD.into()]);
    let parent = cms.create(&pp, &parent).await.unwrap();
    cms.create(&pp, &owned("kept", vec![cm_ref(&parent, true)], &[]))
        .await
        .unwrap();
    cms.delete("parent", &DeleteParams::orphan()).await.unwrap();
    assert!(cms.get("kept").await.unwrap().owner_references().is_empty());
    assert!(terminating(&cms, "parent").await);
    release(&cms, "parent").await;
    assert!(!exists(&cms, "parent").await);
    assert!(exists(&cms, "kept").await);
}

// --- plain HTTP against a served server -------------------------------------------------------

struct Http {
    base: String,
    client: reqwest::Client,
    _server: ApiServer,
}

impl Http {
    async fn start(server: ApiServer) -> Http {
        let (addr, _task) = server.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
        Http {
            base: format!("https://{addr}"),
            client: common::admin_client(&server),
            _server: server,
        }
    }

    async fn send(&self, method: &str, path: &str, body: Option<(&str, Vec<u8>)>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some((content_type, bytes)) = body {
            req = req.header("content-type", content_type).body(bytes);
        }
        let resp = req.send().await.unwrap();
        let code = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            code,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn json(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let ct = if method == "PATCH" {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        self.send(method, path, Some((ct, body.to_string().into_bytes())))
            .await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.send("GET", path, None).await
    }
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code})
}

const SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

#[tokio::test]
async fn invalid_names_are_refused_as_kube_refuses_them() {
    let http = Http::start(ApiServer::new()).await;
    let (code, body) = http
        .json(
            "POST",
            CMS,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "UPPER_case"}}),
        )
        .await;
    assert_eq!(code, 422);
    let mut want = status(
        422,
        "Invalid",
        &format!(
            "ConfigMap \"UPPER_case\" is invalid: metadata.name: Invalid value: \"UPPER_case\": {SUBDOMAIN}"
        ),
    );
    want["details"] = json!({"name": "UPPER_case", "kind": "ConfigMap", "causes": [{
        "reason": "FieldValueInvalid", "field": "metadata.name",
        "message": format!("Invalid value: \"UPPER_case\": {SUBDOMAIN}")}]});
    assert_eq!(body, want);

    for bad in ["a/b", "..", "a%b", &"x".repeat(300)] {
        let (code, body) = http
            .json("POST", CMS, &json!({"metadata": {"name": bad}}))
            .await;
        assert_eq!(code, 422, "{bad}: {body}");
        assert_eq!(body["details"]["causes"][0]["field"], "metadata.name");
    }
    let (_, list) = http.get(CMS).await;
    let stored: Vec<&Value> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["metadata"]["name"] != "kube-root-ca.crt")
        .collect();
    assert!(stored.is_empty(), "nothing was stored: {stored:?}");

    // Names in the path must be usable as path segments.
    let (code, body) = http.get(&format!("{CMS}/a%2Fb")).await;
    assert_eq!(
        (code, body),
        (
            400,
            status(
                400,
                "BadRequest",
                "Name parameter invalid: \"a/b\": may not contain '/'"
            )
        )
    );

    // Per kind: namespaces are labels, services DNS-1035 labels.
    let (code, body) = http
        .json(
            "POST",
            "/api/v1/namespaces",
            &json!({"metadata": {"name": "a.b"}}),
        )
        .await;
    assert_eq!(code, 422);
    assert_eq!(
        body["message"],
        "Namespace \"a.b\" is invalid: metadata.name: Invalid value: \"a.b\": must not contain dots"
    );
    let (code, _) = http
        .json(
            "POST",
            "/api/v1/namespaces/default/services",
            &json!({"metadata": {"name": "1st"}}),
        )
        .await;
    assert_eq!(code, 422);

    // A bad generateName is reported with the name made from it.
    let (code, body) = http
        .json("POST", CMS, &json!({"metadata": {"generateName": "Gen-"}}))
        .await;
    assert_eq!(code, 422);
    let fields: Vec<&str> = body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["metadata.generateName", "metadata.name"]);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains(": [metadata.generateName")
    );
    let (code, body) = http
        .json("POST", CMS, &json!({"metadata": {"generateName": "gen-"}}))
        .await;
    assert_eq!(code, 201);
    let name = body["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");

    // Labels.
    let (code, body) = http
        .json(
            "POST",
            CMS,
            &json!({"metadata": {"name": "l", "labels": {"a": "not ok"}}}),
        )
        .await;
    assert_eq!(code, 422);
    assert_eq!(body["details"]["causes"][0]["field"], "metadata.labels");
}

#[tokio::test]
async fn pods_with_unsafe_names_and_paths_are_refused() {
    let http = Http::start(ApiServer::new()).await;
    let pods = "/api/v1/namespaces/default/pods";
    let pod = |spec: Value| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec});

    let (code, body) = http
        .json(
            "POST",
            pods,
            &pod(json!({"containers": [{"name": "../../../../tmp/x", "image": "busybox"}]})),
        )
        .await;
    assert_eq!(code, 422);
    let label = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
    let mut want = status(
        422,
        "Invalid",
        &format!(
            "Pod \"p\" is invalid: spec.containers[0].name: Invalid value: \"../../../../tmp/x\": {label}"
        ),
    );
    want["details"] = json!({"name": "p", "kind": "Pod", "causes": [{
        "reason": "FieldValueInvalid", "field": "spec.containers[0].name",
        "message": format!("Invalid value: \"../../../../tmp/x\": {label}")}]});
    assert_eq!(body, want);

    let (code, body) = http
        .json("POST", pods, &pod(json!({
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "../v", "emptyDir": {}}],
            "initContainers": [{"name": "init", "image": "x",
                "volumeMounts": [{"name": "data", "mountPath": "/d", "subPath": "../../etc"}]}],
            "containers": [{"name": "main", "image": "x",
                "ports": [{"name": "HTTP--", "containerPort": 80}],
                "volumeMounts": [{"name": "missing", "mountPath": "/m"}, {"name": "../v", "mountPath": "/v"}]}]})))
        .await;
    assert_eq!(code, 422);
    let causes: Vec<(String, String)> = body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["field"].as_str().unwrap().to_string(),
                c["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("spec.volumes[1].name", "FieldValueInvalid"),
        ("spec.containers[0].ports[0].name", "FieldValueInvalid"),
        ("spec.containers[0].ports[0].name", "FieldValueInvalid"),
        ("spec.containers[0].ports[0].name", "FieldValueInvalid"),
        ("spec.containers[0].ports[0].name", "FieldValueInvalid"),
        (
            "spec.containers[0].volumeMounts[0].name",
            "FieldValueNotFound",
        ),
        (
            "spec.containers[0].volumeMounts[1].name",
            "FieldValueNotFound",
        ),
        (
            "spec.initContainers[0].volumeMounts.subPath",
            "FieldValueInvalid",
        ),
    ]
    .iter()
    .map(|(f, r)| (f.to_string(), r.to_string()))
    .collect();
    assert_eq!(causes, want, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("spec.initContainers[0].volumeMounts.subPath: Invalid value: \"../../etc\": must not contain '..'")
    );
    let (_, list) = http.get(pods).await;
    assert_eq!(list["items"], json!([]));

    // Updates are validated too.
    let (code, _) = http
        .json(
            "POST",
            pods,
            &pod(json!({"containers": [{"name": "main", "image": "x"}]})),
        )
        .await;
    assert_eq!(code, 201);
    let (code, _) = http
        .json(
            "PATCH",
            &format!("{pods}/p"),
            &json!({"spec": {"containers": [{"name": "Main!", "image": "x"}]}}),
        )
        .await;
    assert_eq!(code, 422);
}

#[tokio::test]
async fn custom_resource_names_are_subdomains() {
    let server = ApiServer::new();
    let crds: Api<CustomResourceDefinition> = Api::all(client(&server));
    for crd in cdi_api::crd::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let http = Http::start(server).await;
    let (code, body) = http
        .json(
            "POST",
            "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes",
            &json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                "metadata": {"name": "Bad_Name"}, "spec": {"source": {"blank": {}},
                "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["message"],
        format!(
            "DataVolume.cdi.kubevirt.io \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": {SUBDOMAIN}"
        )
    );
    assert_eq!(body["details"]["kind"], "DataVolume");
    assert_eq!(body["details"]["group"], "cdi.kubevirt.io");
}

/// A custom resource's metadata is decoded as an ObjectMeta too: a null label becomes "", a
/// number or a string where a map belongs is a 400, and typed lists of the kind keep working.
#[tokio::test]
async fn custom_resource_metadata_decodes_as_object_meta() {
    use cdi_api::datavolume::DataVolume;
    let server = ApiServer::new();
    let crds: Api<CustomResourceDefinition> = Api::all(client(&server));
    for crd in cdi_api::crd::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let http = Http::start(server.clone()).await;
    let path = "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes";
    let dv = |name: &str, meta: Value| {
        let mut m = meta;
        m["name"] = json!(name);
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": m,
            "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}})
    };
    let (code, body) = http
        .json(
            "POST",
            path,
            &dv(
                "nul",
                json!({"labels": {"x": null}, "annotations": {"y": null}}),
            ),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["metadata"]["labels"]["x"], "");
    assert_eq!(body["metadata"]["annotations"]["y"], "");
    for (name, meta) in [
        ("num", json!({"labels": {"x": 5}})),
        ("str", json!({"annotations": "str"})),
    ] {
        let (code, body) = http.json("POST", path, &dv(name, meta)).await;
        assert_eq!(code, 400, "{body}");
        assert!(
            body["message"].as_str().unwrap().starts_with(
                "DataVolume in version \"v1beta1\" cannot be handled as a DataVolume: "
            ),
            "{body}"
        );
    }
    // A JSON patch bringing a null back is normalised the same way.
    let (code, body) = http
        .send(
            "PATCH",
            &format!("{path}/nul"),
            Some((
                "application/json-patch+json",
                br#"[{"op":"add","path":"/metadata/labels","value":{"n":null}}]"#.to_vec(),
            )),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let list = Api::<DataVolume>::namespaced(client(&server), "default")
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
}

#[tokio::test]
async fn query_parameters_are_parsed_as_kube_parses_them() {
    let server = ApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(client(&server), "default");
    for name in ["a", "b", "c"] {
        cms.create(&PostParams::default(), &cm(name)).await.unwrap();
    }
    let http = Http::start(server).await;

    // Booleans: only "0" and "false" (any case) are false.
    for truthy in ["true", "True", "TRUE", "1", "t"] {
        let url = format!("{}{CMS}?watch={truthy}&timeoutSeconds=5", http.base);
        let mut resp = http.client.get(url).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let first = resp.chunk().await.unwrap().expect("a first event");
        let event: Value =
            serde_json::from_slice(first.split(|b| *b == b'\n').next().unwrap()).unwrap();
        assert_eq!(event["type"], "ADDED", "watch={truthy} is a watch");
    }
    for falsy in ["false", "False", "FALSE", "0"] {
        let (code, list) = http.get(&format!("{CMS}?watch={falsy}")).await;
        assert_eq!((code, list["kind"].as_str()), (200, Some("ConfigMapList")));
    }

    let bad = |message: &str| (400, status(400, "BadRequest", message));
    assert_eq!(
        http.get(&format!("{CMS}?limit=abc")).await,
        bad("strconv.ParseInt: parsing \"abc\": invalid syntax")
    );
    assert_eq!(
        http.get(&format!("{CMS}?watch=true&timeoutSeconds=1.5s"))
            .await,
        bad("strconv.ParseInt: parsing \"1.5s\": invalid syntax")
    );
    assert_eq!(
        http.get(&format!("{CMS}?resourceVersion=abc")).await,
        bad(
            "invalid resource version: resourceVersion: Invalid value: \"abc\": strconv.ParseUint: parsing \"abc\": invalid syntax"
        )
    );
    assert_eq!(
        http.get(&format!("{CMS}?watch=1&resourceVersion=abc"))
            .await
            .0,
        400
    );
    let (code, body) = http.get(&format!("{CMS}?limit=1&continue=garbage")).await;
    assert_eq!(code, 400);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid continue token: continue key is not valid"),
        "{body}"
    );
    let (code, body) = http.get(&format!("{CMS}?limit=1&continue=%%%")).await;
    assert_eq!(code, 400, "{body}");

    // A real token pages through; with a resourceVersion it is refused.
    let (_, page) = http.get(&format!("{CMS}?limit=2")).await;
    let names = |l: &Value| -> Vec<String> {
        l["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&page), ["a", "b"]);
    let token = page["metadata"]["continue"].as_str().unwrap().to_string();
    let (_, rest) = http.get(&format!("{CMS}?limit=2&continue={token}")).await;
    // Every namespace holds the cluster's CA as well.
    assert_eq!(names(&rest), ["c", "kube-root-ca.crt"]);
    assert!(rest["metadata"].get("continue").is_none());
    assert_eq!(
        http.get(&format!("{CMS}?limit=2&continue={token}&resourceVersion=1"))
            .await,
        bad("specifying resource version is not allowed when using continue")
    );

    // Write options.
    let (code, body) = http
        .json(
            "POST",
            &format!("{CMS}?dryRun=true"),
            &json!({"metadata": {"name": "dry"}}),
        )
        .await;
    assert_eq!(code, 422);
    assert_eq!(
        body["message"],
        "CreateOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: []string{\"true\"}: supported values: \"All\""
    );
    let (code, _) = http
        .json(
            "POST",
            &format!("{CMS}?dryRun=All"),
            &json!({"metadata": {"name": "dry"}}),
        )
        .await;
    assert_eq!(code, 201);
    assert_eq!(http.get(&format!("{CMS}/dry")).await.0, 404, "dry run");
    let (code, body) = http
        .json(
            "POST",
            &format!("{CMS}?fieldValidation=Bogus"),
            &json!({"metadata": {"name": "fv"}}),
        )
        .await;
    assert_eq!(code, 422);
    assert_eq!(
        body["message"],
        "CreateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"Bogus\": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
    );
    let (code, body) = http
        .send("DELETE", &format!("{CMS}/a?propagationPolicy=Bogus"), None)
        .await;
    assert_eq!(code, 422);
    assert_eq!(
        body["message"],
        "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"Bogus\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
    );
    assert_eq!(
        http.send("DELETE", &format!("{CMS}/a?gracePeriodSeconds=soon"), None)
            .await,
        bad("strconv.ParseInt: parsing \"soon\": invalid syntax")
    );
    assert_eq!(http.get(&format!("{CMS}/a")).await.0, 200, "still there");
}

#[tokio::test]
async fn a_continue_token_older_than_the_history_is_expired() {
    let server = ApiServer::with_history(5);
    let cms: Api<ConfigMap> = Api::namespaced(client(&server), "default");
    for name in ["a", "b"] {
        cms.create(&PostParams::default(), &cm(name)).await.unwrap();
    }
    let http = Http::start(server).await;
    let (_, page) = http.get(&format!("{CMS}?limit=1")).await;
    let token = page["metadata"]["continue"].as_str().unwrap().to_string();
    for i in 0..10 {
        cms.create(&PostParams::default(), &cm(&format!("n{i}")))
            .await
            .unwrap();
    }
    let (code, body) = http.get(&format!("{CMS}?limit=1&continue={token}")).await;
    assert_eq!(code, 410);
    assert_eq!(body["reason"], "Expired");
}

#[tokio::test]
async fn bodies_and_objects_have_kubes_size_limits() {
    let server = ApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(client(&server), "default");
    cms.create(&PostParams::default(), &cm("small"))
        .await
        .unwrap();
    let http = Http::start(server).await;
    let huge = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "small"},
        "data": {"k": "x".repeat(4 << 20)}});
    let too_large = (
        413,
        status(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: limit is 3145728",
        ),
    );
    assert_eq!(http.json("POST", CMS, &huge).await, too_large);
    assert_eq!(
        http.json("PUT", &format!("{CMS}/small"), &huge).await,
        too_large
    );
    assert_eq!(
        http.json("PATCH", &format!("{CMS}/small"), &huge).await,
        too_large
    );
    let (_, small) = http.get(&format!("{CMS}/small")).await;
    assert_eq!(small["data"], json!({"k": "v"}), "unchanged");

    // Under the body limit but over a ConfigMap's 1 MiB.
    let big = json!({"metadata": {"name": "big"}, "data": {"k": "x".repeat(3 << 19)}});
    let (code, body) = http.json("POST", CMS, &big).await;
    assert_eq!(code, 422);
    let mut want = status(
        422,
        "Invalid",
        "ConfigMap \"big\" is invalid: []: Too long: must have at most 1048576 bytes",
    );
    want["details"] = json!({"name": "big", "kind": "ConfigMap", "causes": [{
        "reason": "FieldValueTooLong", "field": "[]",
        "message": "Too long: must have at most 1048576 bytes"}]});
    assert_eq!(body, want);
    let (code, _) = http
        .json(
            "PATCH",
            &format!("{CMS}/small"),
            &json!({"data": {"k": "x".repeat(3 << 19)}}),
        )
        .await;
    assert_eq!(code, 422);

    // A Secret's limit counts decoded bytes.
    use base64::Engine;
    let payload = base64::engine::general_purpose::STANDARD.encode(vec![7u8; 3 << 19]);
    let (code, body) = http
        .json(
            "POST",
            "/api/v1/namespaces/default/secrets",
            &json!({"metadata": {"name": "s"}, "data": {"k": payload}}),
        )
        .await;
    assert_eq!(code, 422);
    assert_eq!(
        body["message"],
        "Secret \"s\" is invalid: data: Too long: must have at most 1048576 bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_watches() {
    let probe = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import kubernetes"])
        .status()
        .expect("/usr/bin/python3");
    assert!(
        probe.success(),
        "the Python client is missing: apt-get install python3-kubernetes (scripts/test does)"
    );
    let server = ApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(client(&server), "default");
    let (addr, _task) = server.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig(&format!("https://{addr}"))).unwrap();
    // Seen first (as the watch's initial state), it says the watch is established.
    cms.create(&PostParams::default(), &cm("marker"))
        .await
        .unwrap();

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python_watch.py");
    let mut child = std::process::Command::new("/usr/bin/python3")
        .arg(script)
        .arg(&kubeconfig)
        .args(["default", "py"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(60), lines.recv())
            .await
            .ok()
            .flatten()
    };
    let first = next().await;
    if first.as_deref() != Some("ADDED marker") {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!(
            "the Python watch did not start: {first:?}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    cms.create(&PostParams::default(), &cm("py")).await.unwrap();
    cms.patch(
        "py",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "changed"}})),
    )
    .await
    .unwrap();
    cms.delete("py", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(next().await.unwrap_or_default());
    }
    assert_eq!(seen, ["ADDED py", "MODIFIED py", "DELETED py", "END"]);
    assert!(child.wait().unwrap().success());
}

// --- bodies decoded into their kinds' types, as kube-apiserver decodes them ---------------------

const PVCS: &str = "/api/v1/namespaces/default/persistentvolumeclaims";

fn claim(name: &str, requests: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": requests}}})
}

/// One object with a `null` where a typed client expects a value (or bytes that are not base64)
/// must not break every typed list of its kind: nulls in maps become Go's zero values, what does
/// not decode is a 400, and a claim's storage request is validated as kube validates it.
#[tokio::test]
async fn nulls_and_undecodable_values_never_reach_typed_lists() {
    use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Secret};
    use k8s_openapi::api::storage::v1::StorageClass;
    let server = ApiServer::new();
    let http = Http::start(server.clone()).await;

    // `storage:` with no value in YAML, as `kubectl create -f` sends it: a zero quantity.
    let yaml = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: nul\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage:\n";
    let (code, body) = http
        .send(
            "POST",
            PVCS,
            Some(("application/yaml", yaml.as_bytes().to_vec())),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["message"],
        "PersistentVolumeClaim \"nul\" is invalid: spec.resources[storage]: Invalid value: \"0\": must be greater than zero"
    );
    for (name, storage, value) in [("zero", json!("0"), "0"), ("neg", json!("-1Gi"), "-1Gi")] {
        let (code, body) = http
            .json("POST", PVCS, &claim(name, json!({"storage": storage})))
            .await;
        assert_eq!(code, 422, "{body}");
        assert_eq!(
            body["message"],
            format!(
                "PersistentVolumeClaim \"{name}\" is invalid: spec.resources[storage]: Invalid value: \"{value}\": must be greater than zero"
            )
        );
    }
    let (code, body) = http.json("POST", PVCS, &claim("none", json!({}))).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["message"],
        "PersistentVolumeClaim \"none\" is invalid: spec.resources[storage]: Required value"
    );
    let (code, body) = http
        .json("POST", PVCS, &claim("abc", json!({"storage": "abc"})))
        .await;
    assert_eq!(
        (code, body),
        (
            400,
            status(
                400,
                "BadRequest",
                "PersistentVolumeClaim in version \"v1\" cannot be handled as a PersistentVolumeClaim: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            )
        )
    );
    // A bare number is a quantity to Go; stored as the string typed clients expect.
    let (code, body) = http
        .json(
            "POST",
            PVCS,
            &claim("ok", json!({"storage": 1024, "cpu": null})),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(
        body["spec"]["resources"]["requests"],
        json!({"storage": "1024", "cpu": "0"})
    );
    // A patch cannot bring the null back.
    let (code, _) = http
        .send(
            "PATCH",
            &format!("{PVCS}/ok"),
            Some((
                "application/json-patch+json",
                br#"[{"op":"add","path":"/spec/resources/requests/storage","value":null}]"#
                    .to_vec(),
            )),
        )
        .await;
    assert_eq!(code, 422);

    // Maps of strings: null is "".
    let (code, body) = http
        .json(
            "POST",
            "/apis/storage.k8s.io/v1/storageclasses",
            &json!({"metadata": {"name": "sc", "labels": {"l": null}}, "provisioner": "p",
                "parameters": {"a": null}}),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["parameters"], json!({"a": ""}));
    assert_eq!(body["metadata"]["labels"], json!({"l": ""}));
    let (code, body) = http
        .json(
            "POST",
            CMS,
            &json!({"metadata": {"name": "c", "annotations": {"a": null}}, "data": {"k": null}}),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["data"], json!({"k": ""}));
    let (code, body) = http
        .json(
            "POST",
            "/api/v1/nodes",
            &json!({"metadata": {"name": "n"}, "status": {"capacity": {"cpu": null}}}),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = http
        .json(
            "POST",
            "/api/v1/namespaces/default/pods",
            &json!({"metadata": {"name": "p"}, "spec": {"nodeSelector": {"a": null},
                "containers": [{"name": "c", "image": "i", "resources": {"limits": {"cpu": null}}}]}}),
        )
        .await;
    assert_eq!(code, 201, "{body}");

    // Bytes that are not base64, and a value of the wrong type.
    let (code, body) = http
        .json(
            "POST",
            "/api/v1/namespaces/default/secrets",
            &json!({"metadata": {"name": "s"}, "data": {"k": "!!!"}}),
        )
        .await;
    assert_eq!(
        (code, body),
        (
            400,
            status(
                400,
                "BadRequest",
                "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data at input byte 0"
            )
        )
    );
    let (code, body) = http
        .json(
            "POST",
            "/api/v1/persistentvolumes",
            &json!({"metadata": {"name": "pv"}, "spec": {"accessModes": "ReadWriteOnce"}}),
        )
        .await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().starts_with(
            "PersistentVolume in version \"v1\" cannot be handled as a PersistentVolume: "
        ),
        "{body}"
    );

    // Every typed list still decodes.
    let client = client(&server);
    let lp = kube::api::ListParams::default();
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    assert_eq!(claims.list(&lp).await.unwrap().items.len(), 1);
    let classes: Api<StorageClass> = Api::all(client.clone());
    assert_eq!(classes.list(&lp).await.unwrap().items.len(), 1);
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    // The one stored here, and kube-root-ca.crt.
    assert_eq!(cms.list(&lp).await.unwrap().items.len(), 2);
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    assert!(secrets.list(&lp).await.unwrap().items.is_empty());
    let nodes: Api<Node> = Api::all(client.clone());
    assert_eq!(nodes.list(&lp).await.unwrap().items.len(), 1);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::default_namespaced(client.clone());
    assert_eq!(pods.list(&lp).await.unwrap().items.len(), 1);
    let pvs: Api<PersistentVolume> = Api::all(client);
    assert!(pvs.list(&lp).await.unwrap().items.is_empty());
}

/// A field selector on a field the kind cannot select by is refused, as kube refuses it, rather
/// than matching nothing (a typo would otherwise read as "no such objects").
/// A list or watch of `path` is kube's 400 for a field selector on `field`.
async fn field_refused(http: &Http, path: &str, field: &str) {
    let (code, body) = http.get(path).await;
    assert_eq!(
        (code, body),
        (
            400,
            status(
                400,
                "BadRequest",
                &format!("field label not supported: {field}")
            )
        ),
        "{path}"
    );
}

#[tokio::test]
async fn field_selectors_on_unsupported_fields_are_refused() {
    let http = Http::start(ApiServer::new()).await;
    for (path, field) in [
        (
            "/api/v1/namespaces/default/pods?fieldSelector=spec.bogus%3Dx",
            "spec.bogus",
        ),
        (
            &format!("{CMS}?fieldSelector=metadata.nam%3Dx") as &str,
            "metadata.nam",
        ),
        (
            &format!("{CMS}?fieldSelector=data.k%3Dv&watch=true") as &str,
            "data.k",
        ),
        (
            "/api/v1/namespaces/default/secrets?fieldSelector=type%3Dx,spec.x%3Dy",
            "spec.x",
        ),
    ] {
        field_refused(&http, path, field).await;
    }
    for path in [
        "/api/v1/namespaces/default/pods?fieldSelector=spec.nodeName%3Dn,status.phase!%3DRunning",
        "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dx",
        "/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name%3Dx",
        "/api/v1/namespaces/default/secrets?fieldSelector=type%3Dopaque",
    ] {
        let (code, body) = http.get(path).await;
        assert_eq!(code, 200, "{path}: {body}");
    }
}

/// A name with a slash (a provisioner's, looked up as a CSIDriver) reads as a subresource the
/// kind does not serve: kube answers 404, which kube-rs's `get_opt` takes as "not there".
#[tokio::test]
async fn unknown_subresources_are_not_found() {
    let server = ApiServer::new();
    let drivers: Api<k8s_openapi::api::storage::v1::CSIDriver> = Api::all(client(&server));
    assert!(
        drivers
            .get_opt("rancher.io/local-path")
            .await
            .unwrap()
            .is_none()
    );
    let http = Http::start(server).await;
    let (code, body) = http
        .get("/api/v1/namespaces/default/configmaps/x/bogus")
        .await;
    assert_eq!(code, 404, "{body}");
}

/// A custom resource is selectable by name, namespace and what its CRD declares in
/// `selectableFields`, nothing else: a DataVolume by `status.phase` is a 400, as kube answers.
#[tokio::test]
async fn field_selectors_on_custom_resources_are_only_the_declared_ones() {
    let server = ApiServer::new();
    let crds: Api<CustomResourceDefinition> = Api::all(client(&server));
    for crd in cdi_api::crd::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let widget: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "selectableFields": [{"jsonPath": ".spec.color"}],
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "color": {"type": "string"}, "size": {"type": "string"}}}}}}}]}
    }))
    .unwrap();
    crds.create(&PostParams::default(), &widget).await.unwrap();
    let http = Http::start(server).await;
    for (color, name) in [("red", "a"), ("blue", "b")] {
        let (code, body) = http
            .json(
                "POST",
                "/apis/example.com/v1/namespaces/default/widgets",
                &json!({"apiVersion": "example.com/v1", "kind": "Widget",
                    "metadata": {"name": name}, "spec": {"color": color, "size": "s"}}),
            )
            .await;
        assert_eq!(code, 201, "{body}");
    }
    let dvs = "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes";
    let widgets = "/apis/example.com/v1/namespaces/default/widgets";
    for (path, field) in [
        (
            format!("{dvs}?fieldSelector=status.phase%3DSucceeded"),
            "status.phase",
        ),
        (
            format!("{dvs}?fieldSelector=spec.source.http.url%3Dx&watch=true"),
            "spec.source.http.url",
        ),
        (
            format!("{widgets}?fieldSelector=spec.size%3Ds"),
            "spec.size",
        ),
    ] {
        field_refused(&http, &path, field).await;
    }
    let (code, body) = http
        .get(&format!("{widgets}?fieldSelector=spec.color%3Dblue"))
        .await;
    assert_eq!(code, 200, "{body}");
    let names: Vec<&Value> = body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| &w["metadata"]["name"])
        .collect();
    assert_eq!(names, [&json!("b")]);
    let (code, body) = http
        .get(&format!("{dvs}?fieldSelector=metadata.name%3Dx"))
        .await;
    assert_eq!(code, 200, "{body}");
}

/// Pods kube refuses (422) rather than letting them fail later in the kubelet: projected file
/// paths that leave the volume or collide with the atomic writer's `..` entries, device paths
/// with backsteps, bad node selector keys, unknown toleration operators and effects, and
/// requests above limits.
#[tokio::test]
async fn pods_kube_refuses_are_refused() {
    let http = Http::start(ApiServer::new()).await;
    const PODS: &str = "/api/v1/namespaces/default/pods";
    let pod = |spec: Value| json!({"metadata": {"name": "p"}, "spec": spec});
    let container = json!({"name": "c", "image": "i"});
    let cases: Vec<(Value, Vec<(&str, &str)>)> = vec![
        (
            pod(json!({"containers": [container],
            "volumes": [
                {"name": "s", "secret": {"secretName": "x", "items": [{"key": "k", "path": "/etc/passwd"}]}},
                {"name": "m", "configMap": {"name": "x", "items": [{"key": "k", "path": "a/../../b"}]}},
                {"name": "d", "downwardAPI": {"items": [{"path": "..data", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                {"name": "j", "projected": {"sources": [{"secret": {"name": "x", "items": [{"key": "", "path": "ok"}]}}]}},
            ]})),
            vec![
                (
                    "spec.volumes[0].secret.items[0].path",
                    "Invalid value: \"/etc/passwd\": must be a relative path",
                ),
                (
                    "spec.volumes[1].configMap.items[0].path",
                    "Invalid value: \"a/../../b\": must not contain '..'",
                ),
                (
                    "spec.volumes[2].downwardAPI.items[0].path",
                    "Invalid value: \"..data\": must not start with '..'",
                ),
                (
                    "spec.volumes[3].projected.sources[0].secret.items[0].key",
                    "Required value",
                ),
            ],
        ),
        (
            pod(json!({"containers": [{"name": "c", "image": "i",
                "volumeDevices": [{"name": "v", "devicePath": "/dev/../etc/x"}],
                "resources": {"requests": {"cpu": "2", "hugepages-2Mi": "2Mi"},
                    "limits": {"cpu": "1", "memory": "-1", "hugepages-2Mi": "4Mi"}}}]})),
            vec![
                (
                    "spec.containers[0].volumeDevices[0].devicePath",
                    "Invalid value: \"/dev/../etc/x\": can not contain backsteps ('..')",
                ),
                (
                    "spec.containers[0].resources.limits[memory]",
                    "Invalid value: \"-1\": must be greater than or equal to 0",
                ),
                (
                    "spec.containers[0].resources.requests",
                    "Invalid value: \"2\": must be less than or equal to cpu limit of 1",
                ),
                (
                    "spec.containers[0].resources.requests",
                    "Invalid value: \"2Mi\": must be equal to hugepages-2Mi limit of 4Mi",
                ),
            ],
        ),
        (
            pod(
                json!({"containers": [container], "nodeSelector": {"bad key": "v"},
                "tolerations": [
                    {"key": "k", "operator": "Like", "effect": "Sometimes"},
                    {"operator": "Equal", "value": "v"},
                    {"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5},
                ]}),
            ),
            vec![
                (
                    "spec.nodeSelector",
                    "Invalid value: \"bad key\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                ),
                (
                    "spec.tolerations[0].operator",
                    "Unsupported value: \"Like\": supported values: \"Equal\", \"Exists\"",
                ),
                (
                    "spec.tolerations[0].effect",
                    "Unsupported value: \"Sometimes\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"",
                ),
                (
                    "spec.tolerations[1].operator",
                    "Invalid value: \"Equal\": operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
                ),
                (
                    "spec.tolerations[2].effect",
                    "Invalid value: \"NoSchedule\": effect must be 'NoExecute' when `tolerationSeconds` is set",
                ),
            ],
        ),
    ];
    for (body, want) in cases {
        let (code, got) = http.json("POST", PODS, &body).await;
        assert_eq!(code, 422, "{got}");
        let causes: Vec<(String, String)> = got["details"]["causes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["field"].as_str().unwrap().to_string(),
                    c["message"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        for (field, message) in want {
            assert!(
                causes.contains(&(field.to_string(), message.to_string())),
                "{field}: {message} not in {causes:#?}"
            );
        }
    }
    // What kube takes: requests at or below limits, Exists with no key, relative paths.
    let (code, body) = http
        .json(
            "POST",
            PODS,
            &pod(json!({"containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "1"}}}],
                "tolerations": [{"operator": "Exists"}],
                "volumes": [{"name": "s", "secret": {"secretName": "x", "items": [{"key": "k", "path": "a/b..c"}]}}]})),
        )
        .await;
    assert_eq!(code, 201, "{body}");
}

// --- storage classes, volumes and claims validated as kube validates them ----------------------

const CLASSES: &str = "/apis/storage.k8s.io/v1/storageclasses";

/// StorageClass: unsupported reclaim policies and binding modes are refused with kube's supported
/// lists, absent ones default to Delete and Immediate, and provisioner, parameters and
/// reclaimPolicy cannot change (volumeBindingMode is immutable).
#[tokio::test]
async fn storage_classes_kube_refuses_are_refused() {
    let server = ApiServer::new();
    let http = Http::start(server.clone()).await;
    let class = |name: &str, extra: Value| {
        let mut c = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name}, "provisioner": "example.com/disk"});
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        c
    };
    let (code, body) = http
        .json(
            "POST",
            CLASSES,
            &class(
                "bogus",
                json!({"reclaimPolicy": "Bogus", "volumeBindingMode": "Bogus"}),
            ),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["message"],
        "StorageClass.storage.k8s.io \"bogus\" is invalid: [reclaimPolicy: Unsupported value: \"Bogus\": supported values: \"Delete\", \"Retain\", volumeBindingMode: Unsupported value: \"Bogus\": supported values: \"Immediate\", \"WaitForFirstConsumer\"]"
    );
    let (code, body) = http
        .json(
            "POST",
            CLASSES,
            &class("plain", json!({"parameters": {"a": "1"}})),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["reclaimPolicy"], "Delete");
    assert_eq!(body["volumeBindingMode"], "Immediate");
    // A re-apply that omits the defaulted fields changes nothing.
    let (code, body) = http
        .json(
            "PUT",
            &format!("{CLASSES}/plain"),
            &class("plain", json!({"parameters": {"a": "1"}})),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = http
        .json(
            "PATCH",
            &format!("{CLASSES}/plain"),
            &json!({"provisioner": "other.io/x", "parameters": {"a": "2"},
                "reclaimPolicy": "Retain", "volumeBindingMode": "WaitForFirstConsumer"}),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["message"],
        "StorageClass.storage.k8s.io \"plain\" is invalid: [parameters: Forbidden: updates to parameters are forbidden., provisioner: Forbidden: updates to provisioner are forbidden., reclaimPolicy: Forbidden: updates to reclaimPolicy are forbidden., volumeBindingMode: Invalid value: \"WaitForFirstConsumer\": field is immutable]"
    );
    // Metadata still changes (the default-class annotation).
    let (code, body) = http
        .json(
            "PATCH",
            &format!("{CLASSES}/plain"),
            &json!({"metadata": {"annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
}

/// PersistentVolume: reclaim policy, access modes, capacity and a local volume's node affinity as
/// ValidatePersistentVolumeSpec.
#[tokio::test]
async fn volumes_kube_refuses_are_refused() {
    let server = ApiServer::new();
    let http = Http::start(server.clone()).await;
    let (code, body) = http
        .json(
            "POST",
            "/api/v1/persistentvolumes",
            &json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv"},
                "spec": {"persistentVolumeReclaimPolicy": "Bogus", "accessModes": ["ReadWriteAll"],
                    "local": {"path": "/x"}}}),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["message"],
        "PersistentVolume \"pv\" is invalid: [spec.accessModes: Unsupported value: \"ReadWriteAll\": supported values: \"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOnce\", \"ReadWriteOncePod\", spec.capacity: Required value, spec.capacity: Unsupported value: core.ResourceList(nil): supported values: \"storage\", spec.persistentVolumeReclaimPolicy: Unsupported value: \"Bogus\": supported values: \"Delete\", \"Recycle\", \"Retain\", spec.nodeAffinity: Required value: Local volume requires node affinity]"
    );
    let (code, body) = http
        .json(
            "POST",
            "/api/v1/persistentvolumes",
            &json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv"},
                "spec": {"capacity": {"storage": "1Gi"}, "local": {"path": "/x"}}}),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["message"],
        "PersistentVolume \"pv\" is invalid: [spec.accessModes: Required value, spec.nodeAffinity: Required value: Local volume requires node affinity]"
    );
    // Defaults as SetDefaults_PersistentVolume; the source stays what it was made with.
    let (code, body) = http
        .json(
            "POST",
            "/api/v1/persistentvolumes",
            &json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv"},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                    "hostPath": {"path": "/tmp/pv"}}}),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(
        (
            &body["spec"]["persistentVolumeReclaimPolicy"],
            &body["spec"]["volumeMode"],
            &body["status"]["phase"]
        ),
        (&json!("Retain"), &json!("Filesystem"), &json!("Pending"))
    );
    let (code, body) = http
        .json(
            "PATCH",
            "/api/v1/persistentvolumes/pv",
            &json!({"spec": {"hostPath": {"path": "/etc"}}}),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["message"],
        "PersistentVolume \"pv\" is invalid: spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable after creation"
    );
}

/// PersistentVolumeClaim: access modes required and supported, volume modes supported, data
/// sources consistent; after creation the spec is immutable except what the PV controller
/// (volumeName, once) and expansion (a bound claim's request) change.
#[tokio::test]
async fn claims_kube_refuses_are_refused() {
    let server = ApiServer::new();
    let http = Http::start(server.clone()).await;
    let (code, body) = http
        .json(
            "POST",
            PVCS,
            &json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "c"},
                "spec": {"volumeMode": "Raw", "resources": {"requests": {"storage": "1Gi"}},
                    "dataSource": {"kind": "PersistentVolumeClaim", "name": "a"},
                    "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "b"}}}),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["message"],
        "PersistentVolumeClaim \"c\" is invalid: [spec.accessModes: Required value: at least 1 access mode is required, spec.volumeMode: Unsupported value: \"Raw\": supported values: \"Block\", \"Filesystem\", spec: Invalid value: \"spec.dataSource\": must match dataSourceRef]"
    );
    let (code, body) = http
        .json("POST", PVCS, &claim("c", json!({"storage": "1Gi"})))
        .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["spec"]["volumeMode"], "Filesystem");
    let at = format!("{PVCS}/c");
    // Any spec change of an unbound claim, the storage request included.
    for change in [
        json!({"spec": {"accessModes": ["ReadWriteMany"]}}),
        json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}}),
    ] {
        let (code, body) = http.json("PATCH", &at, &change).await;
        assert_eq!(code, 422, "{body}");
        assert_eq!(
            body["message"],
            "PersistentVolumeClaim \"c\" is invalid: spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"
        );
    }
    let (code, body) = http
        .json("PATCH", &at, &json!({"spec": {"volumeMode": "Block"}}))
        .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["message"],
        "PersistentVolumeClaim \"c\" is invalid: [spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims, volumeMode: Invalid value: \"Block\": field is immutable]"
    );
    // The same request written differently is no change; metadata changes freely.
    let (code, body) = http
        .json(
            "PATCH",
            &at,
            &json!({"metadata": {"labels": {"a": "b"}, "finalizers": ["x/y"]},
                "spec": {"resources": {"requests": {"storage": "1024Mi"}}}}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    // The PV controller binds: volumeName once, then never again.
    let (code, body) = http
        .json("PATCH", &at, &json!({"spec": {"volumeName": "pv-1"}}))
        .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = http
        .json("PATCH", &at, &json!({"spec": {"volumeName": "pv-2"}}))
        .await;
    assert_eq!(code, 422, "{body}");
    // A bound claim's request may change; below status.capacity it may not.
    let (code, body) = http
        .json(
            "PATCH",
            &format!("{at}/status"),
            &json!({"status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = http
        .json(
            "PATCH",
            &at,
            &json!({"spec": {"resources": {"requests": {"storage": "512Mi"}}}}),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["message"],
        "PersistentVolumeClaim \"c\" is invalid: spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"
    );
    let (code, body) = http
        .json(
            "PATCH",
            &at,
            &json!({"metadata": {"finalizers": null}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
}

/// What kube-apiserver refuses before anything else: a body that is not what its URL names (another
/// kind, API version or namespace), an apply without a field manager, a field of the wrong type
/// (named in the message). The health checks answer.
#[tokio::test]
async fn bodies_must_be_what_their_url_names() {
    let http = Http::start(ApiServer::new()).await;
    let bad = |message: &str| status(400, "BadRequest", message);
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}});
    let (code, body) = http.json("POST", CMS, &secret).await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("Secret in version \"v1\" cannot be handled as a ConfigMap: "),
        "{body}"
    );
    let other_group =
        json!({"apiVersion": "apps/v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
    assert_eq!(
        http.json("POST", CMS, &other_group).await,
        (
            400,
            bad(
                "the API version in the data (apps/v1) does not match the expected API version (v1)"
            )
        )
    );
    let elsewhere = bad(
        "the namespace of the provided object does not match the namespace sent on the request",
    );
    let in_other = json!({"metadata": {"name": "c", "namespace": "kube-system"}});
    assert_eq!(
        http.json("POST", CMS, &in_other).await,
        (400, elsewhere.clone())
    );
    // Nothing was created by the refusals; the same object in its own namespace is.
    let (code, _) = http.get(&format!("{CMS}/c")).await;
    assert_eq!(code, 404);
    let (code, body) = http
        .json(
            "POST",
            CMS,
            &json!({"metadata": {"name": "c", "namespace": "default"}}),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let mut moved = body.clone();
    moved["metadata"]["namespace"] = json!("kube-system");
    assert_eq!(
        http.json("PUT", &format!("{CMS}/c"), &moved).await,
        (400, elsewhere)
    );

    // Server-side apply needs a field manager.
    let (code, body) = http
        .send(
            "PATCH",
            &format!("{CMS}/c"),
            Some((
                "application/apply-patch+yaml",
                br#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}}"#.to_vec(),
            )),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
    );

    // A field of the wrong type is named.
    let (code, body) = http
        .json("POST", CMS, &json!({"metadata": {"name": 7}}))
        .await;
    assert_eq!(
        (code, body),
        (
            400,
            bad(
                "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: json: cannot unmarshal number into Go struct field ObjectMeta.metadata.name of type string"
            )
        )
    );
    let (code, body) = http
        .json(
            "POST",
            "/api/v1/namespaces/default/pods",
            &json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": 5}]}}),
        )
        .await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().ends_with(
            "json: cannot unmarshal number into Go struct field spec.containers.image of type string"
        ),
        "{body}"
    );

    for path in ["/healthz", "/livez", "/readyz"] {
        assert_eq!(
            http.get(path).await,
            (200, Value::String("ok".into())),
            "{path}"
        );
    }
}
