//! API aggregation: an APIService sends its group and version to a Service; the extension
//! server (a real HTTPS server here, requiring the front-proxy client certificate the API
//! server publishes the CA of) sees the caller in X-Remote-User and X-Remote-Group, and the group
//! shows in discovery (`kubectl api-resources`).

mod common;

use std::process::Command;
use std::sync::Arc;

use axum::Json;
use axum::http::HeaderMap;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use kube::api::{DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const GROUP: &str = "upload.cdi.kubevirt.io";

/// The extension server: discovery of `upload.cdi.kubevirt.io/v1beta1`, and
/// UploadTokenRequests answered with who asked.
async fn extension_server(front_proxy_ca: &str) -> (u16, String, tokio::task::JoinHandle<()>) {
    let (ca_pem, chain, key) = common::test_ca(&["cdi-api.cdi.svc"]);
    // Only callers with a certificate from the front-proxy CA get in.
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_certs(front_proxy_ca) {
        roots.add(c).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let discovery = || async {
        Json(json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": format!("{GROUP}/v1beta1"),
            "resources": [{"name": "uploadtokenrequests", "singularName": "uploadtokenrequest",
                "namespaced": true, "kind": "UploadTokenRequest", "verbs": ["create"]}]}))
    };
    let token = |headers: HeaderMap, Json(mut body): Json<Value>| async move {
        let user = headers
            .get("x-remote-user")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let groups: Vec<&str> = headers
            .get_all("x-remote-group")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        body["status"] = json!({"token": format!("{user}|{}", groups.join(","))});
        (axum::http::StatusCode::CREATED, Json(body))
    };
    // Its OpenAPI document, which kubectl validates a request against.
    let openapi = || async {
        let gvk = json!([{"group": GROUP, "version": "v1beta1", "kind": "UploadTokenRequest"}]);
        // kubectl learns from the kind's PATCH operation that the server checks fields itself.
        let patch = json!({"x-kubernetes-group-version-kind": gvk[0], "parameters": [
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}]});
        Json(
            json!({"openapi": "3.0.0", "info": {"title": "cdi-api", "version": "v1beta1"},
            "paths": {format!("/apis/{GROUP}/v1beta1/namespaces/{{namespace}}/uploadtokenrequests/{{name}}"):
                {"patch": patch}},
            "components": {"schemas": {"v1beta1.UploadTokenRequest": {"type": "object",
                "x-kubernetes-group-version-kind": gvk,
                "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                    "metadata": {"type": "object"},
                    "spec": {"type": "object", "properties": {"pvcName": {"type": "string"}}},
                    "status": {"type": "object",
                        "properties": {"token": {"type": "string"}}}}}}}}),
        )
    };
    let app = axum::Router::new()
        .route(
            &format!("/apis/{GROUP}/v1beta1"),
            axum::routing::get(discovery),
        )
        .route(
            &format!("/openapi/v3/apis/{GROUP}/v1beta1"),
            axum::routing::get(openapi),
        )
        .route(
            &format!("/apis/{GROUP}/v1beta1/namespaces/{{ns}}/uploadtokenrequests"),
            axum::routing::post(token),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = common::serve_tls(listener, Arc::new(config), app);
    (port, ca_pem, task)
}

fn rustls_pki_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.unwrap())
        .collect()
}

fn kubectl(kubeconfig: &std::path::Path, args: &[&str], stdin: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl is installed");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

async fn create_dynamic(
    client: &Client,
    group: &str,
    kind: &str,
    plural: &str,
    ns: Option<&str>,
    v: Value,
) {
    let (g, version) = group.rsplit_once('/').unwrap_or(("", group));
    let gvk = kube::api::GroupVersionKind::gvk(g, version, kind);
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, plural);
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let mut v = v;
    v["apiVersion"] = json!(group);
    v["kind"] = json!(kind);
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_service_proxies_its_group_with_the_callers_identity() {
    let (_dir, running) = common::cluster().await;
    let client = running.client.clone();
    for ns in ["cdi", "a"] {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    // As an extension server does: the front-proxy CA from the published ConfigMap.
    let published = Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .get("extension-apiserver-authentication")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(
        published["requestheader-allowed-names"],
        r#"["front-proxy-client"]"#
    );
    assert_eq!(
        published["requestheader-username-headers"],
        r#"["X-Remote-User"]"#
    );
    let (port, ca, _server) = extension_server(&published["requestheader-client-ca-file"]).await;

    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "cdi-api"},
        "spec": {"ports": [{"port": 443, "targetPort": port}]}}))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), "cdi")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    create_dynamic(
        &client,
        "discovery.k8s.io/v1",
        "EndpointSlice",
        "endpointslices",
        Some("cdi"),
        json!({"metadata": {"name": "cdi-api-1", "labels": {"kubernetes.io/service-name": "cdi-api"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
            "ports": [{"name": "", "port": port, "protocol": "TCP"}]}),
    )
    .await;
    use base64::Engine;
    create_dynamic(
        &client,
        "apiregistration.k8s.io/v1",
        "APIService",
        "apiservices",
        None,
        json!({"metadata": {"name": format!("v1beta1.{GROUP}")},
            "spec": {"group": GROUP, "version": "v1beta1", "groupPriorityMinimum": 1000,
                "versionPriority": 15, "service": {"namespace": "cdi", "name": "cdi-api"},
                "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca)}}),
    )
    .await;

    // Discovery lists the group as soon as the forwarder reaches the extension server.
    let kubeconfig = running.kubeconfig.clone();
    let listed = common::wait_for("the group in discovery", async || {
        let (ok, out, err) = kubectl(
            &kubeconfig,
            &["api-resources", &format!("--api-group={GROUP}")],
            "",
        );
        (ok && out.contains("uploadtokenrequests")).then(|| format!("{out}{err}"))
    })
    .await;
    assert!(listed.contains("uploadtokenrequests"), "{listed}");
    assert!(listed.contains(&format!("{GROUP}/v1beta1")), "{listed}");
    // The availability check reaches it too.
    let table = common::wait_for("the APIService to be Available", async || {
        let (_, out, _) = kubectl(
            &kubeconfig,
            &["get", "apiservice", &format!("v1beta1.{GROUP}")],
            "",
        );
        (out.contains("cdi/cdi-api") && out.contains("True")).then_some(out)
    })
    .await;
    assert!(table.contains("True"), "{table}");

    // This server authorizes first; the extension server sees whom it let through.
    let request = format!(
        "apiVersion: {GROUP}/v1beta1\nkind: UploadTokenRequest\nmetadata: {{name: disk, namespace: a}}\nspec: {{pvcName: disk}}\n"
    );
    let (ok, _, err) = kubectl(
        &kubeconfig,
        &["--as=alice", "create", "-f", "-", "-o", "json"],
        &request,
    );
    assert!(
        !ok && err.contains(&format!(
            r#"User "alice" cannot create resource "uploadtokenrequests" in API group "{GROUP}" in the namespace "a""#
        )),
        "{err}"
    );
    let (ok, _, err) = kubectl(
        &kubeconfig,
        &[
            "create",
            "role",
            "uploader",
            "--verb=create",
            &format!("--resource=uploadtokenrequests.{GROUP}"),
            "-n",
            "a",
        ],
        "",
    );
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(
        &kubeconfig,
        &[
            "create",
            "rolebinding",
            "alice-uploads",
            "--role=uploader",
            "--user=alice",
            "-n",
            "a",
        ],
        "",
    );
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &[
            "--as=alice",
            "--as-group=devs",
            "create",
            "-f",
            "-",
            "-o",
            "json",
        ],
        &request,
    );
    assert!(ok, "{err}");
    let answer: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(answer["status"]["token"], "alice|devs,system:authenticated");
}
