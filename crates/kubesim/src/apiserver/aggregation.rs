//! API aggregation, as kube-apiserver's aggregator does it: an APIService that names a Service
//! takes its group and version; requests for them (once this server has authenticated and
//! authorized them) are proxied to the Service over TLS, trusting the APIService's `caBundle`,
//! with this server's front-proxy client certificate and the caller's identity in
//! `X-Remote-User`, `X-Remote-Group` and `X-Remote-Uid`. The extension server learns whom to
//! believe from the ConfigMap `kube-system/extension-apiserver-authentication`, as kube
//! publishes it; the groups show in discovery.

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::errors::{ApiError, ApiResult, error_chain};
use super::rbac::UserInfo;
use super::store::{ListOptions, Store};

/// The CN of the front-proxy client certificate extension servers accept.
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";
/// Where extension servers find the CAs and header names of delegated authentication.
pub const AUTHENTICATION_CONFIG_MAP: (&str, &str) =
    ("kube-system", "extension-apiserver-authentication");

/// This server's side of aggregation: the front-proxy CA and its client certificate.
pub struct FrontProxy {
    ca_pem: String,
    /// The client certificate and its key, PEM, as reqwest takes an identity.
    identity_pem: String,
}

impl FrontProxy {
    pub fn generate() -> std::io::Result<FrontProxy> {
        let ca = super::pki::Ca::generate()?;
        let (cert, key) = ca.client_cert(FRONT_PROXY_CLIENT, &[])?;
        Ok(FrontProxy {
            ca_pem: ca.cert_pem().to_string(),
            identity_pem: format!("{cert}{key}"),
        })
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }
}

/// Publish `kube-system/extension-apiserver-authentication` as kube-apiserver does.
pub fn publish(store: &Store, client_ca: &str, proxy: &FrontProxy) {
    let Some(def) = store.registry().get("", "v1", "configmaps").cloned() else {
        return;
    };
    let (ns, name) = AUTHENTICATION_CONFIG_MAP;
    let list = |v: &[&str]| serde_json::to_string(v).unwrap_or_default();
    let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
    "metadata": {"name": name},
    "data": {
        "client-ca-file": client_ca,
        "requestheader-client-ca-file": proxy.ca_pem,
        "requestheader-allowed-names": list(&[FRONT_PROXY_CLIENT]),
        "requestheader-username-headers": list(&["X-Remote-User"]),
        "requestheader-uid-headers": list(&["X-Remote-Uid"]),
        "requestheader-group-headers": list(&["X-Remote-Group"]),
        "requestheader-extra-headers-prefix": list(&["X-Remote-Extra-"]),
    }});
    let _ = store.create(&def, ns, config, false, None);
}

fn api_services(store: &Store) -> Vec<Value> {
    // Every request asks: while none was ever written (none at start), there is nothing to list.
    if store.group_version("apiregistration.k8s.io") == 0 {
        return Vec::new();
    }
    let Some(def) = store
        .registry()
        .get("apiregistration.k8s.io", "v1", "apiservices")
        .cloned()
    else {
        return Vec::new();
    };
    store.list(&def, None, &ListOptions::default()).0
}

/// The APIService that serves `/apis/<group>/<version>/…` (or its OpenAPI document,
/// `/openapi/v3/apis/<group>/<version>`) elsewhere, if one does.
pub fn served_elsewhere(store: &Store, path: &str) -> Option<Value> {
    let path = path.trim_start_matches('/');
    let mut parts = path.strip_prefix("openapi/v3/").unwrap_or(path).split('/');
    if parts.next() != Some("apis") {
        return None;
    }
    let (group, version) = (parts.next()?, parts.next()?);
    api_services(store).into_iter().find(|s| {
        s["spec"]["group"] == group
            && s["spec"]["version"] == version
            && s["spec"]["service"].is_object()
    })
}

/// The groups and versions APIServices bring to discovery, by group.
pub fn groups(store: &Store) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut services = api_services(store);
    // Higher priority first, as kube orders versions.
    services.sort_by_key(|s| -s["spec"]["versionPriority"].as_i64().unwrap_or(0));
    for s in services.iter().filter(|s| s["spec"]["service"].is_object()) {
        let (Some(group), Some(version)) =
            (s["spec"]["group"].as_str(), s["spec"]["version"].as_str())
        else {
            continue;
        };
        match out.iter_mut().find(|(g, _)| g == group) {
            Some((_, versions)) => versions.push(version.to_string()),
            None => out.push((group.to_string(), vec![version.to_string()])),
        }
    }
    out
}

/// Where a Service reference (`{namespace, name, port}`, port 443 unless given) is reached: its
/// name as a host (`<name>.<namespace>.svc`, what the server's certificate names), the port, and
/// the Service's cluster IP and port to connect to for that host.
pub(crate) fn service_address(
    store: &Store,
    service: &Value,
) -> Result<(String, u16, std::net::SocketAddr), String> {
    let (ns, name) = (
        service["namespace"].as_str().unwrap_or(""),
        service["name"].as_str().unwrap_or(""),
    );
    let port = service["port"].as_u64().unwrap_or(443) as u16;
    let def = store
        .registry()
        .get("", "v1", "services")
        .cloned()
        .ok_or("no services")?;
    let svc = store
        .get(&def, ns, name)
        .map_err(|_| format!("service \"{ns}/{name}\" not found"))?;
    let ip: std::net::IpAddr = svc["spec"]["clusterIP"]
        .as_str()
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| format!("service \"{ns}/{name}\" has no cluster IP"))?;
    Ok((
        format!("{name}.{ns}.svc"),
        port,
        std::net::SocketAddr::new(ip, port),
    ))
}

/// A client that trusts the certificates of a `caBundle` (base64 PEM) and only them, when one is
/// given; else the host's roots.
pub(crate) fn trusting(
    client: reqwest::ClientBuilder,
    ca_bundle: Option<&str>,
) -> Result<reqwest::ClientBuilder, String> {
    let Some(bundle) = ca_bundle else {
        return Ok(client);
    };
    use base64::Engine;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(bundle)
        .map_err(|e| format!("the caBundle is not base64: {e}"))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| format!("the caBundle holds no certificate: {e}"))?;
    Ok(client.tls_certs_only(certs))
}

/// kube's answer when the extension server cannot be reached.
fn unavailable(why: String) -> ApiError {
    ApiError {
        code: 503,
        reason: "ServiceUnavailable",
        message: format!("error trying to reach service: {why}"),
        details: None,
    }
}

/// Proxy `req` (from `user`, already authorized) to the Service of `api_service`.
pub async fn proxy(
    store: &Store,
    proxy: &FrontProxy,
    api_service: &Value,
    user: &UserInfo,
    req: Request,
) -> ApiResult<Response> {
    let spec = &api_service["spec"];
    let (host, port, at) = service_address(store, &spec["service"]).map_err(unavailable)?;
    let mut client = reqwest::Client::builder().resolve(&host, at).identity(
        reqwest::Identity::from_pem(proxy.identity_pem.as_bytes())
            .map_err(|e| ApiError::internal(format!("the front-proxy identity: {e}")))?,
    );
    if spec["insecureSkipTLSVerify"] == json!(true) {
        client = client.tls_danger_accept_invalid_certs(true);
    } else {
        client = trusting(client, spec["caBundle"].as_str()).map_err(unavailable)?;
    }
    let client = client
        .build()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let url = format!("https://{host}:{port}{path_and_query}");
    let method = reqwest::Method::from_bytes(req.method().as_str().as_bytes())
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let mut out = client.request(method, &url);
    for (k, v) in req.headers() {
        let k = k.as_str();
        // Credentials and impersonation stop here: the identity travels in X-Remote-*.
        let dropped = k == "authorization"
            || k.starts_with("impersonate-")
            || k.starts_with("x-remote-")
            || k == "host"
            || k == "content-length";
        if !dropped {
            out = out.header(k, v.as_bytes());
        }
    }
    out = out.header("X-Remote-User", user.name.as_str());
    for g in &user.groups {
        out = out.header("X-Remote-Group", g.as_str());
    }
    if !user.uid.is_empty() {
        out = out.header("X-Remote-Uid", user.uid.as_str());
    }
    let body = axum::body::to_bytes(req.into_body(), super::http::MAX_BODY)
        .await
        .map_err(|_| ApiError::too_large(super::http::MAX_BODY))?;
    let answer = out
        .body(body)
        .send()
        .await
        .map_err(|e| unavailable(error_chain(&e)))?;
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut response = Response::builder().status(status);
    for (k, v) in answer.headers() {
        if !matches!(
            k.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) {
            response = response.header(k.as_str(), v.as_bytes());
        }
    }
    let body = Body::from_stream(answer.bytes_stream());
    Ok(response
        .body(body)
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response()))
}
