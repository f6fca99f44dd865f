//! Admission webhooks: a real HTTPS webhook server (axum, under a CA of the test's own) that the
//! API server calls with AdmissionReviews, by URL and through a Service.

mod common;

use std::sync::{Arc, Mutex};

use axum::Json;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use kube::api::{DynamicObject, PostParams};
use kube::{Api, Client};
use kubesim::apiserver::ApiServer;
use serde_json::{Value, json};

/// A webhook server: `/validate` denies ConfigMaps holding a key `forbidden`, `/mutate` labels
/// every object `mutated=yes`; every review it gets is kept.
struct Hooks {
    port: u16,
    ca_pem: String,
    seen: Arc<Mutex<Vec<Value>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Hooks {
    async fn start(names: &[&str]) -> Hooks {
        use base64::Engine;
        let (ca_pem, chain, key) = common::test_ca(names);
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let seen = Arc::new(Mutex::new(Vec::new()));
        let respond = |seen: Arc<Mutex<Vec<Value>>>, mutate: bool| {
            move |Json(review): Json<Value>| {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push(review.clone());
                    let request = &review["request"];
                    let mut response = json!({"uid": request["uid"], "allowed": true});
                    if mutate {
                        let patch = json!([{"op": "add", "path": "/metadata/labels",
                            "value": {"mutated": "yes"}}]);
                        response["patchType"] = json!("JSONPatch");
                        response["patch"] = json!(
                            base64::engine::general_purpose::STANDARD.encode(patch.to_string())
                        );
                    } else if request["object"]["data"].get("forbidden").is_some() {
                        response["allowed"] = json!(false);
                        response["status"] = json!({"code": 403,
                            "message": "configmaps may not hold a key named forbidden"});
                    }
                    Json(
                        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                        "response": response}),
                    )
                }
            }
        };
        let app = axum::Router::new()
            .route(
                "/validate",
                axum::routing::post(respond(seen.clone(), false)),
            )
            .route("/mutate", axum::routing::post(respond(seen.clone(), true)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = common::serve_tls(listener, Arc::new(config), app);
        Hooks {
            port,
            ca_pem,
            seen,
            _task: task,
        }
    }

    fn ca_bundle(&self) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }
}

fn configmaps_rule() -> Value {
    json!([{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
        "resources": ["configmaps"], "scope": "Namespaced"}])
}

async fn configure(client: &Client, kind: &str, name: &str, webhooks: Value) {
    let plural = format!("{}s", kind.to_lowercase());
    let gvk = kube::api::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, &plural);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
        "metadata": {"name": name}, "webhooks": webhooks}))
    .unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

fn config_map(name: &str, data: Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": data})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_by_url_deny_mutate_and_follow_their_failure_policy() {
    let hooks = Hooks::start(&["127.0.0.1"]).await;
    let server = ApiServer::new();
    let client = Client::new(server.router(), "default");
    configure(
        &client,
        "ValidatingWebhookConfiguration",
        "deny-forbidden",
        json!([{"name": "deny.hooks.test", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"url": format!("https://127.0.0.1:{}/validate", hooks.port),
                "caBundle": hooks.ca_bundle()},
            "rules": configmaps_rule()}]),
    )
    .await;
    configure(
        &client,
        "MutatingWebhookConfiguration",
        "label",
        json!([{"name": "label.hooks.test", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"url": format!("https://127.0.0.1:{}/mutate", hooks.port),
                "caBundle": hooks.ca_bundle()},
            "objectSelector": {"matchExpressions": [{"key": "skip-mutation", "operator": "DoesNotExist"}]},
            "rules": configmaps_rule()}]),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    // Denied with the webhook's message and code.
    match cms
        .create(
            &PostParams::default(),
            &config_map("bad", json!({"forbidden": "x"})),
        )
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(
            (e.code, e.message.as_str()),
            (
                403,
                "admission webhook \"deny.hooks.test\" denied the request: configmaps may not hold a key named forbidden"
            )
        ),
        other => panic!("expected a denial, got {other:?}"),
    }
    // Allowed, and patched by the mutating webhook first.
    let good = cms
        .create(
            &PostParams::default(),
            &config_map("good", json!({"k": "v"})),
        )
        .await
        .unwrap();
    assert_eq!(good.metadata.labels.unwrap()["mutated"], "yes");
    // An update is reviewed too, with the object before it.
    let mut changed = cms.get("good").await.unwrap();
    changed.data = Some([("forbidden".to_string(), "y".to_string())].into());
    assert!(matches!(
        cms.replace("good", &PostParams::default(), &changed).await,
        Err(kube::Error::Api(e)) if e.code == 403
    ));
    let reviews = hooks.seen.lock().unwrap().clone();
    let update = reviews
        .iter()
        .rev()
        .find(|r| r["request"]["operation"] == "UPDATE")
        .expect("an UPDATE review");
    assert_eq!(update["request"]["oldObject"]["data"]["k"], "v");
    assert_eq!(
        update["request"]["userInfo"]["username"],
        "kubernetes-admin"
    );
    assert_eq!(update["request"]["namespace"], "default");
    // The object selector keeps the mutating webhook off labelled objects.
    let mut skipped = config_map("skipped", json!({}));
    skipped.metadata.labels = Some([("skip-mutation".to_string(), "1".to_string())].into());
    let skipped = cms.create(&PostParams::default(), &skipped).await.unwrap();
    assert!(!skipped.metadata.labels.unwrap().contains_key("mutated"));

    // A webhook that cannot be reached: Fail refuses, Ignore lets the request through.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    for (policy, ns) in [("Fail", "strict"), ("Ignore", "lenient")] {
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns, "labels": {"policy": policy}}}))
                .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
        configure(
            &client,
            "ValidatingWebhookConfiguration",
            &format!("down-{ns}"),
            json!([{"name": format!("down.{ns}.hooks.test"), "admissionReviewVersions": ["v1"],
                "sideEffects": "None", "failurePolicy": policy, "timeoutSeconds": 2,
                "clientConfig": {"url": format!("https://127.0.0.1:{closed}/validate"),
                    "caBundle": hooks.ca_bundle()},
                "namespaceSelector": {"matchLabels": {"policy": policy}},
                "rules": configmaps_rule()}]),
        )
        .await;
    }
    let strict: Api<ConfigMap> = Api::namespaced(client.clone(), "strict");
    match strict
        .create(&PostParams::default(), &config_map("c", json!({})))
        .await
    {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 500);
            assert!(
                e.message
                    .starts_with("Internal error occurred: failed calling webhook \"down.strict.hooks.test\": failed to call webhook: Post"),
                "{}",
                e.message
            );
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    let lenient: Api<ConfigMap> = Api::namespaced(client.clone(), "lenient");
    lenient
        .create(&PostParams::default(), &config_map("c", json!({})))
        .await
        .unwrap();
    // And `default` matches neither namespace selector.
    cms.create(&PostParams::default(), &config_map("plain", json!({})))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_behind_a_service_is_called_at_its_cluster_ip_by_its_service_name() {
    let hooks = Hooks::start(&["hooks.default.svc"]).await;
    let (_dir, running) = common::cluster().await;
    let client = running.client.clone();
    // A Service without a selector, its endpoint the webhook server (as an operator may point
    // a Service at something outside the cluster).
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "hooks"},
        "spec": {"ports": [{"port": 443, "targetPort": hooks.port}]}}))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let gvk = kube::api::GroupVersionKind::gvk("discovery.k8s.io", "v1", "EndpointSlice");
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "endpointslices");
    let slices: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    let slice: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "hooks-1", "labels": {"kubernetes.io/service-name": "hooks"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
        "ports": [{"name": "", "port": hooks.port, "protocol": "TCP"}]}))
    .unwrap();
    slices.create(&PostParams::default(), &slice).await.unwrap();
    configure(
        &client,
        "ValidatingWebhookConfiguration",
        "by-service",
        json!([{"name": "deny.hooks.test", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"service": {"namespace": "default", "name": "hooks",
                "path": "/validate"}, "caBundle": hooks.ca_bundle()},
            "rules": configmaps_rule()}]),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    // The forwarder follows the slice on its next pass: until then the call fails closed.
    let last: Option<String> = common::wait_for(
        "the webhook behind the Service to answer",
        async || match cms
            .create(
                &PostParams::default(),
                &config_map("bad", json!({"forbidden": "x"})),
            )
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 403 => Some(None),
            _ => None,
        },
    )
    .await;
    assert_eq!(last, None, "the webhook behind the Service never answered");
    assert!(!hooks.seen.lock().unwrap().is_empty());
    cms.create(
        &PostParams::default(),
        &config_map("good", json!({"k": "v"})),
    )
    .await
    .unwrap();
}
