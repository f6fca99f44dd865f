//! Quantities in CDI's custom resources are admitted as kube-apiserver admits them under
//! upstream's CRDs: an integer or a string matching kube's quantity pattern. "10 Gi" or "abc"
//! as a DataVolume's storage request is a 422 naming the field, before any controller sees it;
//! "10Gi" and 10737418240 are accepted.

mod common;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, Client};
use kubesim::apiserver::ApiServer;
use serde_json::{Value, json};

const DVS: &str = "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes";

struct Http {
    base: String,
    client: reqwest::Client,
    _server: ApiServer,
}

impl Http {
    /// A server with CDI's CRDs installed, listening on 127.0.0.1.
    async fn start() -> Http {
        let server = ApiServer::new();
        let crds: Api<CustomResourceDefinition> = Api::all(Client::new(server.router(), "default"));
        for crd in cdi_api::crd::crds() {
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        let (addr, _task) = server.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
        Http {
            base: format!("https://{addr}"),
            client: common::admin_client(&server),
            _server: server,
        }
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let code = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            code,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
}

/// A blank DataVolume whose `spec.<kind>.resources.requests.storage` is `storage`.
fn dv(name: &str, kind: &str, storage: Value) -> Value {
    let mut spec = json!({"source": {"blank": {}}});
    spec[kind] = json!({"resources": {"requests": {"storage": storage}}});
    if kind == "pvc" {
        spec[kind]["accessModes"] = json!(["ReadWriteOnce"]);
    }
    json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": name}, "spec": spec})
}

#[tokio::test]
async fn a_storage_request_that_is_not_a_quantity_is_refused_naming_the_field() {
    let http = Http::start().await;
    let pattern = cdi_api::crd::QUANTITY_PATTERN;
    for (i, (kind, bad)) in [
        ("storage", "10 Gi"),
        ("storage", "abc"),
        ("pvc", "10 Gi"),
        ("pvc", "1GB"),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("bad-{i}");
        let (code, body) = http.post(DVS, &dv(&name, kind, json!(bad))).await;
        assert_eq!(code, 422, "{kind} {bad:?}: {body}");
        let field = format!("spec.{kind}.resources.requests.storage");
        let detail = format!("Invalid value: \"{bad}\": {field} in body should match '{pattern}'");
        assert_eq!(
            body["message"],
            format!("DataVolume.cdi.kubevirt.io \"{name}\" is invalid: {field}: {detail}"),
            "{body}"
        );
        assert_eq!(body["reason"], "Invalid");
        assert_eq!(body["details"]["causes"][0]["field"], field.as_str());
        assert_eq!(body["details"]["causes"][0]["reason"], "FieldValueInvalid");
    }
    // A limit is a quantity too.
    let mut limited = dv("bad-limit", "storage", json!("1Gi"));
    limited["spec"]["storage"]["resources"]["limits"] = json!({"storage": "lots"});
    let (code, body) = http.post(DVS, &limited).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["details"]["causes"][0]["field"],
        "spec.storage.resources.limits.storage"
    );
}

#[tokio::test]
async fn quantities_as_strings_or_integers_are_accepted() {
    let http = Http::start().await;
    for (i, (kind, good)) in [
        ("storage", json!("10Gi")),
        ("storage", json!(10737418240u64)),
        ("pvc", json!("10Gi")),
        ("pvc", json!(10737418240u64)),
        ("storage", json!("1.5e9")),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("good-{i}");
        let (code, body) = http.post(DVS, &dv(&name, kind, good.clone())).await;
        assert_eq!(code, 201, "{kind} {good}: {body}");
        assert_eq!(
            body["spec"][kind]["resources"]["requests"]["storage"], good,
            "stored as sent"
        );
    }
}

/// The CDI kind is served at v1alpha1 too, as upstream's CRD serves it: an object written at
/// either version is read at both, each answer naming the version asked for; a watch at
/// v1alpha1 sees v1alpha1 objects; discovery lists both, v1beta1 preferred.
#[tokio::test]
async fn a_further_served_version_reads_and_writes_the_same_objects() {
    use futures::StreamExt;
    let http = Http::start().await;
    let alpha = "/apis/cdi.kubevirt.io/v1alpha1/cdis";
    let beta = "/apis/cdi.kubevirt.io/v1beta1/cdis";
    let (code, made) = http
        .post(
            alpha,
            &json!({"apiVersion": "cdi.kubevirt.io/v1alpha1", "kind": "CDI",
                "metadata": {"name": "old"}, "spec": {"imagePullPolicy": "Always"}}),
        )
        .await;
    assert_eq!(code, 201, "{made}");
    assert_eq!(made["apiVersion"], "cdi.kubevirt.io/v1alpha1");
    let get = |path: String| {
        let (client, base) = (http.client.clone(), http.base.clone());
        async move {
            let r = client.get(format!("{base}{path}")).send().await.unwrap();
            let code = r.status().as_u16();
            (
                code,
                serde_json::from_str::<Value>(&r.text().await.unwrap()).unwrap(),
            )
        }
    };
    let (code, read) = get(format!("{beta}/old")).await;
    assert_eq!(code, 200, "{read}");
    assert_eq!(read["apiVersion"], "cdi.kubevirt.io/v1beta1");
    assert_eq!(read["spec"]["imagePullPolicy"], "Always");
    let (_, list) = get(alpha.to_string()).await;
    assert_eq!(list["items"][0]["apiVersion"], "cdi.kubevirt.io/v1alpha1");
    assert_eq!(list["items"][0]["metadata"]["name"], "old");
    // Discovery: both versions, the stored one preferred.
    let (_, group) = get("/apis/cdi.kubevirt.io".to_string()).await;
    assert_eq!(group["preferredVersion"]["version"], "v1beta1", "{group}");
    assert!(
        group["versions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["version"] == "v1alpha1"),
        "{group}"
    );
    let (code, resources) = get("/apis/cdi.kubevirt.io/v1alpha1".to_string()).await;
    assert_eq!(code, 200);
    assert_eq!(resources["resources"][0]["kind"], "CDI");
    // The kube client at v1alpha1, watching.
    let client = Client::new(http._server.router(), "default");
    let ar = kube::api::ApiResource {
        group: "cdi.kubevirt.io".into(),
        version: "v1alpha1".into(),
        api_version: "cdi.kubevirt.io/v1alpha1".into(),
        kind: "CDI".into(),
        plural: "cdis".into(),
    };
    let api: Api<kube::api::DynamicObject> = Api::all_with(client, &ar);
    let mut events = kube::runtime::watcher(api, Default::default()).boxed();
    let first = loop {
        match events.next().await.unwrap().unwrap() {
            kube::runtime::watcher::Event::InitApply(o) => break o,
            _ => continue,
        }
    };
    assert_eq!(
        first.types.as_ref().map(|t| t.api_version.as_str()),
        Some("cdi.kubevirt.io/v1alpha1")
    );
    // Written at v1beta1, read back at v1alpha1 with the change.
    let (code, made) = http
        .post(
            beta,
            &json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI",
                "metadata": {"name": "new"}, "spec": {}}),
        )
        .await;
    assert_eq!(code, 201, "{made}");
    let (_, read) = get(format!("{alpha}/new")).await;
    assert_eq!(read["apiVersion"], "cdi.kubevirt.io/v1alpha1");
}
