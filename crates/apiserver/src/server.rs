//! The aggregated token API (`cdi apiserver`, upstream's cdi-apiserver for
//! `upload.cdi.kubevirt.io/v1beta1`): discovery and an OpenAPI v3 document so kubectl and the
//! client libraries know the kind, and `create` of UploadTokenRequests. The caller is who the
//! aggregator says (over its front-proxy client certificate, see [`crate::tokenapi`]); a
//! SubjectAccessReview decides whether they may have a token.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use serde_json::{Value, json};

use crate::tokenapi::{self, GROUP, RESOURCE, RequestHeaders, VERSION};
use cdi_pki::token::Signer;

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(String),
    #[error("{context}: {error}")]
    Io {
        context: String,
        error: std::io::Error,
    },
}

/// The largest request body taken (an UploadTokenRequest is a few hundred bytes).
const MAX_BODY: usize = 1 << 20;

pub struct ApiServerConfig {
    pub listen: SocketAddr,
    /// The serving certificate and key (PEM) as they are now, the APIService's caBundle
    /// vouching for them; a new value (a rotation) serves the next connections.
    pub serving: tokio::sync::watch::Receiver<cdi_pki::ca::KeyPair>,
    /// The CA of the aggregator's front-proxy client certificate
    /// (`requestheader-client-ca-file`).
    pub front_proxy_ca_pem: Vec<u8>,
    pub headers: RequestHeaders,
    /// Signs upload tokens and the DataVolume webhook's clone tokens.
    pub signer: Signer,
}

type Body = Full<Bytes>;

fn json_answer(status: StatusCode, value: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(value.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// A kube `Status` failure.
fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    json_answer(
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}),
    )
}

fn group_version() -> String {
    format!("{GROUP}/{VERSION}")
}

/// Discovery: the group.
pub fn api_group() -> Value {
    let gv = json!({"groupVersion": group_version(), "version": VERSION});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [gv],
        "preferredVersion": gv})
}

/// Discovery: the version's one resource, create only.
pub fn resource_list() -> Value {
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version(),
        "resources": [{"name": RESOURCE, "singularName": "uploadtokenrequest", "namespaced": true,
            "kind": "UploadTokenRequest", "verbs": ["create"]}]})
}

/// The OpenAPI v3 document of the group version. kubectl validates requests against the
/// kind's schema, and learns from the PATCH operation's `fieldValidation` parameter that the
/// server checks fields itself.
pub fn openapi() -> Value {
    let gvk = json!({"group": GROUP, "version": VERSION, "kind": "UploadTokenRequest"});
    let schema_ref =
        json!({"$ref": "#/components/schemas/io.kubevirt.cdi.upload.v1beta1.UploadTokenRequest"});
    let body = json!({"content": {"application/json": {"schema": schema_ref}}});
    let ns = json!({"name": "namespace", "in": "path", "required": true,
        "schema": {"type": "string", "uniqueItems": true}});
    let query = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
    let collection = format!("/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{RESOURCE}");
    json!({
        "openapi": "3.0.0",
        "info": {"title": "cdi-api", "version": VERSION},
        "paths": {
            collection.clone(): {
                "parameters": [ns],
                "post": {
                    "operationId": "createNamespacedUploadTokenRequest",
                    "x-kubernetes-action": "post",
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": [query("dryRun"), query("fieldManager"), query("fieldValidation")],
                    "requestBody": body,
                    "responses": {"201": {"description": "Created", "content": body["content"]}}
                }
            },
            format!("{collection}/{{name}}"): {
                "parameters": [ns, {"name": "name", "in": "path", "required": true,
                    "schema": {"type": "string", "uniqueItems": true}}],
                "patch": {
                    "operationId": "patchNamespacedUploadTokenRequest",
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": [query("fieldValidation")],
                    "responses": {"200": {"description": "OK"}}
                }
            }
        },
        "components": {"schemas": {
            "io.kubevirt.cdi.upload.v1beta1.UploadTokenRequest": {
                "description": "UploadTokenRequest is the CR used to initiate a CDI upload",
                "type": "object",
                "required": ["spec"],
                "x-kubernetes-group-version-kind": [gvk],
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"type": "object"},
                    "spec": {
                        "description": "Spec contains the parameters of the request",
                        "type": "object",
                        "required": ["pvcName"],
                        "properties": {"pvcName": {"type": "string",
                            "description": "PvcName is the name of the PVC to upload to"}}
                    },
                    "status": {
                        "description": "Status contains the status of the request",
                        "type": "object",
                        "properties": {"token": {"type": "string",
                            "description": "Token is a JWT token to be inserted in \"Authentication Bearer header\""}}
                    }
                }
            }
        }}
    })
}

/// The request's body, a JSON object (at most [`MAX_BODY`]), or the refusal saying it is not
/// `what`.
async fn json_object(req: Request<Incoming>, what: &str) -> Result<Value, Response<Body>> {
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Err(status(
                400,
                "BadRequest",
                &format!("reading the request: {e}"),
            ));
        }
    };
    match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        _ => Err(status(
            400,
            "BadRequest",
            &format!("the request body is not {what}"),
        )),
    }
}

/// The namespace of a token request's path, if the path is one.
fn token_request_namespace(path: &str) -> Option<&str> {
    let rest = path.strip_prefix(&format!("/apis/{GROUP}/{VERSION}/namespaces/"))?;
    let (ns, resource) = rest.split_once('/')?;
    (resource == RESOURCE && !ns.is_empty()).then_some(ns)
}

struct Api {
    client: kube::Client,
    headers: RequestHeaders,
    signer: Signer,
    webhook: crate::webhook::Webhook,
}

/// The answer to a health check or a discovery request (the API group, its resources, the
/// OpenAPI document), if `path` is one.
fn discovery(path: &str, get: bool) -> Option<Response<Body>> {
    match path {
        "/healthz" | "/readyz" | "/livez" => {
            let mut r = Response::new(Full::new(Bytes::from_static(b"ok")));
            *r.status_mut() = StatusCode::OK;
            Some(r)
        }
        "/apis" if get => Some(json_answer(
            StatusCode::OK,
            &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]}),
        )),
        p if get && p == format!("/apis/{GROUP}") => {
            Some(json_answer(StatusCode::OK, &api_group()))
        }
        p if get && p == format!("/apis/{GROUP}/{VERSION}") => {
            Some(json_answer(StatusCode::OK, &resource_list()))
        }
        "/openapi/v3" if get => {
            let gv = format!("apis/{GROUP}/{VERSION}");
            Some(json_answer(
                StatusCode::OK,
                &json!({"paths": {gv.clone(): {"serverRelativeURL": format!("/openapi/v3/{gv}")}}}),
            ))
        }
        p if get && p == format!("/openapi/v3/apis/{GROUP}/{VERSION}") => {
            Some(json_answer(StatusCode::OK, &openapi()))
        }
        _ => None,
    }
}

/// Who judges the validating webhook at `path`, if it is one.
fn judged_at(path: &str) -> Option<Judged> {
    use crate::webhook as w;
    match path {
        p if p == w::VALIDATE_PATH => Some(Judged::DataVolume),
        p if p == w::CRON_VALIDATE_PATH => Some(Judged::Other(w::validate_cron)),
        p if p == w::CDI_VALIDATE_PATH => Some(Judged::Cdi),
        p if p == w::PVC_MUTATE_PATH => Some(Judged::Claim),
        p if p == w::POPULATOR_VALIDATE_PATH => Some(Judged::Other(w::validate_populator)),
        _ => None,
    }
}

impl Api {
    async fn handle(&self, req: Request<Incoming>, client_cn: Option<String>) -> Response<Body> {
        let path = req.uri().path().to_string();
        if let Some(answer) = discovery(&path, req.method() == Method::GET) {
            return answer;
        }
        if req.method() == Method::POST {
            if path == crate::webhook::PATH {
                return self.admission(req).await;
            }
            if let Some(judged) = judged_at(&path) {
                return self.validation(req, judged).await;
            }
        }
        let Some(ns) = token_request_namespace(&path).map(str::to_string) else {
            return status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            );
        };
        if req.method() != Method::POST {
            return status(
                405,
                "MethodNotAllowed",
                &format!("{RESOURCE}.{GROUP} support only create"),
            );
        }
        self.create_token(req, &ns, client_cn).await
    }

    /// Create an UploadTokenRequest in `ns`: who the caller is, whether they may, and the
    /// token.
    async fn create_token(
        &self,
        req: Request<Incoming>,
        ns: &str,
        client_cn: Option<String>,
    ) -> Response<Body> {
        let headers: Vec<(String, String)> = req
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        let caller = match tokenapi::caller(&headers, client_cn.as_deref(), &self.headers) {
            Ok(c) => c,
            Err(r) => return status(r.code, "Unauthorized", &r.message),
        };
        let request = match json_object(req, "an UploadTokenRequest in JSON").await {
            Ok(v) => v,
            Err(refused) => return refused,
        };
        if let Err(refused) = self.authorize(&caller, ns).await {
            return refused;
        }
        match tokenapi::answer(&request, ns, &self.signer) {
            Ok(answer) => {
                tracing::info!(user = %caller.user, namespace = %ns,
                    claim = %request["spec"]["pvcName"].as_str().unwrap_or(""), "issued an upload token");
                json_answer(StatusCode::CREATED, &answer)
            }
            Err(r) => status(r.code, "Invalid", &r.message),
        }
    }

    /// Ask the cluster, with a SubjectAccessReview, whether `caller` may create a token in
    /// `ns`; the answer refusing the request if not.
    async fn authorize(&self, caller: &tokenapi::Caller, ns: &str) -> Result<(), Response<Body>> {
        let review: SubjectAccessReview =
            serde_json::from_value(tokenapi::access_review(caller, ns))
                .map_err(|e| status(500, "InternalError", &e.to_string()))?;
        let reviews: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
        let allowed = match reviews
            .create(&kube::api::PostParams::default(), &review)
            .await
        {
            Ok(r) => r.status.is_some_and(|s| s.allowed),
            Err(e) => {
                tracing::error!(error = %e, "the SubjectAccessReview failed");
                return Err(status(
                    500,
                    "InternalError",
                    &format!("authorizing the request: {e}"),
                ));
            }
        };
        if !allowed {
            tracing::info!(user = %caller.user, namespace = %ns, "refused an upload token");
            return Err(status(
                403,
                "Forbidden",
                &format!(
                    "{RESOURCE}.{GROUP} is forbidden: User \"{}\" cannot create resource \"{RESOURCE}\" in API group \"{GROUP}\" in the namespace \"{ns}\"",
                    caller.user
                ),
            ));
        }
        Ok(())
    }
}

/// The AdmissionReview a webhook request carries, or the answer refusing the request.
async fn admission_review(req: Request<Incoming>) -> Result<serde_json::Value, Response<Body>> {
    match json_object(req, "an AdmissionReview").await {
        Ok(v) if v["request"].is_object() => Ok(v),
        Ok(_) => Err(status(
            400,
            "BadRequest",
            "the request body is not an AdmissionReview",
        )),
        Err(refused) => Err(refused),
    }
}

/// Who judges a validating review: the DataVolume webhook (it reads the cluster), or a rule
/// on the object alone.
enum Judged {
    DataVolume,
    /// A claim rendered from its StorageProfile (mutating).
    Claim,
    /// The CDI resource's deletion.
    Cdi,
    Other(fn(&serde_json::Value) -> serde_json::Value),
}

impl Api {
    /// An AdmissionReview for a validating webhook (upstream's rules), answered by `judge`.
    async fn validation(&self, req: Request<Incoming>, judge: Judged) -> Response<Body> {
        let review = match admission_review(req).await {
            Ok(v) => v,
            Err(refused) => return refused,
        };
        let answer = match judge {
            Judged::DataVolume => self.webhook.validate(&review).await,
            Judged::Claim => self.webhook.render_pvc(&review).await,
            Judged::Cdi => self.webhook.validate_cdi(&review).await,
            Judged::Other(judge) => judge(&review),
        };
        if answer["response"]["allowed"] == json!(false) {
            tracing::info!(kind = %review["request"]["kind"]["kind"],
                namespace = %review["request"]["namespace"],
                name = %review["request"]["name"],
                why = %answer["response"]["status"]["message"], "refused an invalid object");
        }
        json_answer(StatusCode::OK, &answer)
    }

    /// An AdmissionReview for the DataVolume webhook. The API server calls it without a client
    /// certificate (as kube's does): what it answers is checked again by the controller, and a
    /// token it gives names one clone only.
    async fn admission(&self, req: Request<Incoming>) -> Response<Body> {
        let review = match admission_review(req).await {
            Ok(v) => v,
            Err(refused) => return refused,
        };
        let answer = self.webhook.review(&review, &self.signer).await;
        if answer["response"]["allowed"] == json!(false) {
            tracing::info!(user = %review["request"]["userInfo"]["username"],
                namespace = %review["request"]["namespace"],
                name = %review["request"]["name"],
                why = %answer["response"]["status"]["message"], "refused a DataVolume");
        }
        json_answer(StatusCode::OK, &answer)
    }
}

/// Serve until the listener fails.
pub async fn run(
    config: ApiServerConfig,
    client: kube::Client,
    listener: tokio::net::TcpListener,
) -> Result<(), ServeError> {
    let front_proxy_ca = config.front_proxy_ca_pem;
    let acceptor =
        cdi_pki::tls::Following::new(config.serving, "serving certificate", move |pair| {
            let tls = cdi_pki::tls::tls_config(&cdi_pki::tls::Tls {
                cert_pem: pair.cert_pem.clone().into_bytes(),
                key_pem: pair.key_pem.clone().into_bytes(),
                client_ca_pem: Some(front_proxy_ca.clone()),
            })
            .map_err(|e| e.to_string())?;
            Ok(tokio_rustls::TlsAcceptor::from(tls))
        })
        .map_err(ServeError::Config)?;
    let api = Arc::new(Api {
        webhook: crate::webhook::Webhook {
            client: client.clone(),
        },
        client,
        headers: config.headers,
        signer: config.signer,
    });
    let error = cdi_pki::tls::serve(
        listener,
        || acceptor.get().as_ref().clone(),
        move |req, client_cn| {
            let api = api.clone();
            async move { api.handle(req, client_cn).await }
        },
    )
    .await;
    Err(ServeError::Io {
        context: "accepting".into(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_request_paths() {
        assert_eq!(
            token_request_namespace(
                "/apis/upload.cdi.kubevirt.io/v1beta1/namespaces/vms/uploadtokenrequests"
            ),
            Some("vms")
        );
        assert_eq!(
            token_request_namespace(
                "/apis/upload.cdi.kubevirt.io/v1beta1/namespaces//uploadtokenrequests"
            ),
            None
        );
        assert_eq!(
            token_request_namespace("/apis/upload.cdi.kubevirt.io/v1beta1/namespaces/vms/pods"),
            None
        );
    }

    #[test]
    fn the_openapi_document_names_the_kind_and_field_validation() {
        let doc = openapi();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let (_, schema) = schemas.iter().next().unwrap();
        assert_eq!(
            schema["x-kubernetes-group-version-kind"][0]["kind"],
            "UploadTokenRequest"
        );
        let patch = doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .find_map(|p| p.get("patch"))
            .unwrap();
        assert_eq!(patch["parameters"][0]["name"], "fieldValidation");
    }
}
