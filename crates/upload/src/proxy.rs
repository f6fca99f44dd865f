//! The upload proxy (`cdi upload-proxy`, upstream's cdi-uploadproxy): the one public door of the
//! upload path. It checks the caller's upload token (signed by `cdi apiserver`, five minutes,
//! one claim), waits (at most 10 s) for that claim's upload server to be ready, and streams the
//! request to it over mutual TLS. Nothing reaches an upload server without a valid token.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cdi_api::ann;
use futures::{StreamExt, TryStreamExt};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{Endpoints, PersistentVolumeClaim};

use crate::server::{HEALTHZ, Lingering, UPLOAD_PATHS, linger};
use cdi_pki::token::{Operation, TokenError, Validator};

/// How long a request waits for its upload server to be ready, and how often it looks.
pub const WAIT_READY: Duration = Duration::from_secs(10);
pub const WAIT_INTERVAL: Duration = Duration::from_secs(1);

/// What the proxy needs.
pub struct ProxyConfig {
    pub listen: SocketAddr,
    /// Its certificates as they are now; a new value (a rotation) serves the next requests.
    pub tls: tokio::sync::watch::Receiver<ProxyTls>,
    pub validator: Validator,
}

/// The proxy's TLS material (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyTls {
    /// Its own serving certificate and key.
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    /// The client certificate and key upload servers accept.
    pub client_cert_pem: Vec<u8>,
    pub client_key_pem: Vec<u8>,
    /// The CAs upload servers' certificates are signed by (a bundle).
    pub server_ca_pem: Vec<u8>,
}

/// What the proxy serves and connects with, built from [`ProxyTls`].
struct Material {
    acceptor: tokio_rustls::TlsAcceptor,
    client_identity: reqwest::Identity,
    server_cas: Vec<reqwest::Certificate>,
}

impl Material {
    fn build(tls: &ProxyTls) -> Result<Material, String> {
        let serving = cdi_pki::tls::tls_config(&cdi_pki::tls::Tls {
            cert_pem: tls.cert_pem.clone(),
            key_pem: tls.key_pem.clone(),
            client_ca_pem: None,
        })
        .map_err(|e| e.to_string())?;
        let identity = [tls.client_cert_pem.as_slice(), b"\n", &tls.client_key_pem].concat();
        Ok(Material {
            acceptor: tokio_rustls::TlsAcceptor::from(serving),
            client_identity: reqwest::Identity::from_pem(&identity)
                .map_err(|e| format!("the upload servers' client certificate: {e}"))?,
            server_cas: reqwest::Certificate::from_pem_bundle(&tls.server_ca_pem)
                .map_err(|e| format!("the upload servers' CA bundle: {e}"))?,
        })
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ProxyError(pub String);

type Body = BoxBody<Bytes, std::io::Error>;

fn answer(status: StatusCode, text: impl Into<Bytes>) -> Response<Body> {
    let body = Full::new(text.into())
        .map_err(|never| match never {})
        .boxed();
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r
}

/// The token of an `Authorization: Bearer <token>` header (upstream's pattern: the scheme in
/// any case, then the token's URL-safe characters only).
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(char::is_whitespace)?;
    let token = token.trim_start();
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-._~+/".contains(c);
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && token.chars().all(allowed))
        .then_some(token)
}

/// The upload server path a request goes to: archives go to the archive endpoint whatever the
/// client asked for (upstream's `resolveUploadPath`).
pub fn server_path(content_type: Option<&str>, requested: &str) -> Result<String, String> {
    match content_type.unwrap_or("") {
        "" | "kubevirt" => Ok(requested.to_string()),
        "archive" if requested.contains("alpha") => Ok("/v1alpha1/upload-archive".into()),
        "archive" => Ok("/v1beta1/upload-archive".into()),
        other => Err(format!("upload content-type {other} is invalid")),
    }
}

/// CORS as upstream allows it (everything): a preflight's answer, when the request is one.
fn preflight(req: &Request<Incoming>) -> Option<Response<Body>> {
    let h = req.headers();
    if req.method() != Method::OPTIONS
        || !h.contains_key(hyper::header::ORIGIN)
        || !h.contains_key(hyper::header::ACCESS_CONTROL_REQUEST_METHOD)
    {
        return None;
    }
    let mut r = answer(StatusCode::NO_CONTENT, "");
    let out = r.headers_mut();
    out.insert(
        hyper::header::ACCESS_CONTROL_ALLOW_ORIGIN,
        hyper::header::HeaderValue::from_static("*"),
    );
    for (from, to) in [
        (
            hyper::header::ACCESS_CONTROL_REQUEST_METHOD,
            hyper::header::ACCESS_CONTROL_ALLOW_METHODS,
        ),
        (
            hyper::header::ACCESS_CONTROL_REQUEST_HEADERS,
            hyper::header::ACCESS_CONTROL_ALLOW_HEADERS,
        ),
    ] {
        if let Some(v) = h.get(&from) {
            out.insert(to, v.clone());
        }
    }
    Some(r)
}

/// The proxy's state.
struct Proxy {
    client: kube::Client,
    validator: Validator,
    tls: cdi_pki::tls::Following<Material>,
}

/// Why a claim cannot take an upload: the status to answer and upstream's words.
type Refusal = (StatusCode, String);

fn unavailable(message: String) -> Refusal {
    (StatusCode::SERVICE_UNAVAILABLE, message)
}

/// Upstream's words for a claim whose one upload is done, answered 409.
fn finished(name: &str) -> Refusal {
    (
        StatusCode::CONFLICT,
        format!("rejecting Upload Request for PVC {name} that already finished uploading"),
    )
}

/// The claim that takes the upload once its upload server is ready (`None` while it is not),
/// or why none will now: a claim whose one upload is done is answered 409, not 503 (sending
/// again will not change it), the rest 503.
async fn upload_target(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<PersistentVolumeClaim>, Refusal> {
    let claims: kube::Api<PersistentVolumeClaim> = kube::Api::namespaced(client.clone(), namespace);
    let claim = match claims.get_opt(name).await {
        Ok(Some(c)) => c,
        Ok(None) => {
            return Err(unavailable(format!(
                "rejecting Upload Request for PVC {name} that doesn't exist"
            )));
        }
        Err(e) => return Err(unavailable(unreadable(namespace, name, &e))),
    };
    // On the populator path the upload goes to PVC prime.
    let populated = claim
        .spec
        .as_ref()
        .and_then(|s| s.data_source_ref.as_ref())
        .is_some_and(|r| {
            r.kind == cdi_api::populators::VOLUME_UPLOAD_SOURCE_KIND
                && r.api_group.as_deref() == Some(cdi_api::GROUP)
        });
    // Populated, the target says it is done (PVC prime is gone by then).
    if populated && cdi_core::import::is_complete(&claim) {
        return Err(finished(name));
    }
    let claim = if populated {
        let prime = cdi_core::populator::prime_name(&claim);
        match claims.get_opt(&prime).await {
            Ok(Some(p)) => p,
            // Not made yet: wait for it.
            Ok(None) => return Ok(None),
            Err(e) => return Err(unavailable(unreadable(namespace, &prime, &e))),
        }
    } else {
        claim
    };
    let anns = claim.metadata.annotations.clone().unwrap_or_default();
    if !anns.contains_key(ann::UPLOAD_REQUEST) {
        return Err(unavailable(format!("PVC {name} is not an upload target")));
    }
    if cdi_core::import::is_complete(&claim) {
        return Err(finished(name));
    }
    Ok((anns.get(ann::POD_READY).map(String::as_str) == Some("true")).then_some(claim))
}

/// What an uploader is told when the claim cannot be read: the API's error (which names the
/// proxy's service account and dumps a Status) stays in the proxy's log.
fn unreadable(namespace: &str, name: &str, e: &kube::Error) -> String {
    tracing::error!(claim = %format!("{namespace}/{name}"), error = %e, "reading the upload's PVC failed");
    format!("the upload proxy could not read PVC {namespace}/{name}; try again later")
}

/// The claim once its upload server is ready (waiting at most [`WAIT_READY`]).
async fn wait_ready(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<PersistentVolumeClaim, Refusal> {
    let started = tokio::time::Instant::now();
    loop {
        if let Some(claim) = upload_target(client, namespace, name).await? {
            return Ok(claim);
        }
        if started.elapsed() >= WAIT_READY {
            return Err(unavailable(format!(
                "the upload server for PVC {namespace}/{name} is not ready after {} s; try again",
                WAIT_READY.as_secs()
            )));
        }
        tokio::time::sleep(WAIT_INTERVAL).await;
    }
}

/// A ready address of a Service (what cluster DNS gives for a headless one).
async fn service_address(
    client: &kube::Client,
    namespace: &str,
    service: &str,
) -> Result<std::net::IpAddr, String> {
    let endpoints: kube::Api<Endpoints> = kube::Api::namespaced(client.clone(), namespace);
    let found = endpoints
        .get_opt(service)
        .await
        .map_err(|e| {
            tracing::error!(service = %format!("{namespace}/{service}"), error = %e, "reading the upload Service's endpoints failed");
            format!("the upload proxy could not find the upload server of {namespace}/{service}; try again later")
        })?;
    found
        .and_then(|e| e.subsets)
        .into_iter()
        .flatten()
        .flat_map(|s| s.addresses.unwrap_or_default())
        .find_map(|a| a.ip.parse().ok())
        .ok_or_else(|| format!("the upload Service {namespace}/{service} has no ready address"))
}

impl Proxy {
    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        if let Some(r) = preflight(&req) {
            return r;
        }
        let origin = req.headers().contains_key(hyper::header::ORIGIN);
        // A refusal answered before the body is read still reads it a while (`Lingering`).
        let (parts, body) = req.into_parts();
        let mut body = Lingering(Some(body));
        let mut response = self.route(&parts, &mut body).await;
        if origin {
            response.headers_mut().insert(
                hyper::header::ACCESS_CONTROL_ALLOW_ORIGIN,
                hyper::header::HeaderValue::from_static("*"),
            );
        }
        response
    }

    async fn route(&self, parts: &Parts, body: &mut Lingering) -> Response<Body> {
        let path = parts.uri.path().to_string();
        if path == HEALTHZ {
            return answer(StatusCode::OK, "OK");
        }
        if !UPLOAD_PATHS.contains(&path.as_str()) {
            return answer(
                StatusCode::NOT_FOUND,
                format!(
                    "{path} is not an upload endpoint: send the image to /v1beta1/upload or /v1beta1/upload-async"
                ),
            );
        }
        // Refused before the body is read (so no `100 Continue` invites it): an upload is a
        // POST, and clients ask with HEAD whether an async endpoint exists.
        if parts.method != Method::POST && parts.method != Method::HEAD {
            let mut r = answer(
                StatusCode::METHOD_NOT_ALLOWED,
                format!(
                    "{} is not an upload: send the image with POST",
                    parts.method
                ),
            );
            r.headers_mut().insert(
                hyper::header::ALLOW,
                hyper::header::HeaderValue::from_static("POST, HEAD"),
            );
            return r;
        }
        let header = parts
            .headers
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let Some(token) = header.and_then(bearer) else {
            tracing::warn!("refused an upload without a bearer token");
            return answer(
                StatusCode::UNAUTHORIZED,
                "an upload needs an Authorization: Bearer header with a token from an UploadTokenRequest",
            );
        };
        let payload = match self.validator.validate(token) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "refused an upload token");
                let text = match e {
                    TokenError::Expired => "the upload token expired: request a new one",
                    _ => "the upload token is not valid",
                };
                return answer(StatusCode::UNAUTHORIZED, text);
            }
        };
        if payload.operation != Operation::Upload
            || payload.name.is_empty()
            || payload.namespace.is_empty()
            || payload.resource.resource != "persistentvolumeclaims"
        {
            tracing::warn!(?payload, "refused a token that is not for an upload");
            return answer(
                StatusCode::UNAUTHORIZED,
                "the token is not for an upload into a PVC",
            );
        }
        let (ns, name) = (payload.namespace.as_str(), payload.name.as_str());
        // Tokens are signed for a claim's name only; one signed before that rule held may name
        // a path, which must not reach the API's URL.
        if !cdi_core::naming::is_object_name(name) || !cdi_core::naming::is_object_name(ns) {
            tracing::warn!(
                ?payload,
                "refused a token whose claim is not an object name"
            );
            return answer(
                StatusCode::UNAUTHORIZED,
                "the token does not name a PVC: request a new one for the PVC's name",
            );
        }
        tracing::info!(claim = %format!("{ns}/{name}"), "valid upload token");
        let claim = match wait_ready(&self.client, ns, name).await {
            Ok(c) => c,
            Err((status, message)) => return answer(status, message),
        };
        let anns = claim.metadata.annotations.clone().unwrap_or_default();
        let server_path = match server_path(anns.get(ann::CONTENT_TYPE).map(String::as_str), &path)
        {
            Ok(p) => p,
            Err(e) => {
                return answer(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("rejecting upload request for PVC {name} - {e}"),
                );
            }
        };
        let target = claim.metadata.name.clone().unwrap_or_default();
        match self.forward(parts, body, ns, &target, &server_path).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "proxying the upload failed");
                answer(
                    StatusCode::BAD_GATEWAY,
                    format!("error in upload-proxy: {e}"),
                )
            }
        }
    }

    /// Stream the request to the claim's upload server and its answer back.
    async fn forward(
        &self,
        parts: &Parts,
        body: &mut Lingering,
        namespace: &str,
        claim: &str,
        path: &str,
    ) -> Result<Response<Body>, String> {
        let url = cdi_core::upload::server_url(namespace, claim, path);
        let host = url
            .trim_start_matches("https://")
            .split(':')
            .next()
            .unwrap_or_default()
            .to_string();
        let service = host.split('.').next().unwrap_or_default().to_string();
        // The Service's endpoints follow the pod's readiness a moment later.
        let started = tokio::time::Instant::now();
        let ip = loop {
            match service_address(&self.client, namespace, &service).await {
                Ok(ip) => break ip,
                Err(e) if started.elapsed() >= WAIT_READY => return Err(e),
                Err(_) => tokio::time::sleep(WAIT_INTERVAL / 4).await,
            }
        };
        let port = cdi_core::upload::PORT as u16;
        let tls = self.tls.get();
        let client = reqwest::Client::builder()
            .tls_certs_only(tls.server_cas.clone())
            .identity(tls.client_identity.clone())
            .resolve(&host, SocketAddr::new(ip, port))
            .http1_only()
            .timeout(Duration::from_secs(24 * 3600))
            .build()
            .map_err(|e| format!("making the client: {e}"))?;
        let mut forwarded = client.request(parts.method.clone(), &url);
        for (name, value) in &parts.headers {
            // The token stays here; hop-by-hop headers are the connection's own.
            if name == hyper::header::AUTHORIZATION
                || name == hyper::header::HOST
                || name == hyper::header::CONNECTION
                || name == hyper::header::TRANSFER_ENCODING
            {
                continue;
            }
            forwarded = forwarded.header(name, value);
        }
        let body = body.0.take().ok_or("the request's body was lost")?;
        let response = forwarded
            .body(reqwest::Body::wrap_stream(relay(body)))
            .send()
            .await
            .map_err(|e| format!("sending to the upload server: {e}"))?;
        let mut out = Response::builder().status(response.status().as_u16());
        for (name, value) in response.headers() {
            if name != hyper::header::CONNECTION && name != hyper::header::TRANSFER_ENCODING {
                out = out.header(name.as_str(), value.as_bytes());
            }
        }
        let body = http_body_util::StreamBody::new(
            response
                .bytes_stream()
                .map_ok(hyper::body::Frame::data)
                .map_err(std::io::Error::other),
        );
        out.body(BodyExt::boxed(body))
            .map_err(|e| format!("the upload server's answer: {e}"))
    }
}

/// The client's body as the upload server's request body. When the server answers before
/// taking all of it (a refusal), the rest is still read a while, so that the client, still
/// sending, hears the answer instead of a reset connection.
fn relay(body: Incoming) -> impl futures::Stream<Item = std::io::Result<Bytes>> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let mut data = body.into_data_stream();
        while let Some(chunk) = data.next().await {
            if tx.send(chunk.map_err(std::io::Error::other)).await.is_err() {
                linger(data).await;
                return;
            }
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
}

/// Serve until the listener fails.
pub async fn run(
    config: ProxyConfig,
    client: kube::Client,
    listener: tokio::net::TcpListener,
) -> Result<(), ProxyError> {
    let proxy = Arc::new(Proxy {
        client,
        validator: config.validator,
        tls: cdi_pki::tls::Following::new(config.tls, "upload proxy certificates", Material::build)
            .map_err(ProxyError)?,
    });
    let tls = proxy.tls.clone();
    let error = cdi_pki::tls::serve(
        listener,
        || tls.get().acceptor.clone(),
        move |req, _| {
            let proxy = proxy.clone();
            async move { proxy.handle(req).await }
        },
    )
    .await;
    Err(ProxyError(format!("accepting: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_as_upstream_matches_them() {
        assert_eq!(bearer("Bearer abc.def-_~+/"), Some("abc.def-_~+/"));
        assert_eq!(bearer("bearer   abc"), Some("abc"));
        assert_eq!(bearer("BEARER\tabc"), Some("abc"));
        assert_eq!(bearer("Bearer"), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer abc def"), None);
        assert_eq!(bearer("Bearer abc\"<script>"), None);
    }

    #[test]
    fn archives_go_to_the_archive_endpoint() {
        assert_eq!(
            server_path(None, "/v1beta1/upload-async").unwrap(),
            "/v1beta1/upload-async"
        );
        assert_eq!(
            server_path(Some("kubevirt"), "/v1alpha1/upload").unwrap(),
            "/v1alpha1/upload"
        );
        assert_eq!(
            server_path(Some("archive"), "/v1alpha1/upload").unwrap(),
            "/v1alpha1/upload-archive"
        );
        assert_eq!(
            server_path(Some("archive"), "/v1beta1/upload-form").unwrap(),
            "/v1beta1/upload-archive"
        );
        assert!(server_path(Some("vmdk"), "/v1beta1/upload").is_err());
    }
}
