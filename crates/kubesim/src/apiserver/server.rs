//! The HTTP surface: the [`ApiServer`] (its construction, serving over TLS, and each request's
//! way in: health, authentication and authorization, metrics, aggregated APIs), and in the
//! files below it the routing, the verbs, the subresources, admission and the reviews.

mod admit;
mod call;
mod controllers;
mod crds;
mod discovery;
mod dispatch;
mod plugins;
mod request;
mod response;
mod reviews;
mod routing;
mod subresources;
mod verbs;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

pub use super::http::MAX_BODY;
pub use call::PodLogs;
pub use plugins::{PV_PROTECTION, PVC_PROTECTION, SERVICE_ACCOUNT_DIR, SERVICE_RANGE};

use super::auth::{Authenticator, Peer};
use super::errors::{ApiError, ApiResult};
use super::rbac::{Attributes, UserInfo};
use super::registry::Registry;
use super::store::{Owner, Store};
use call::{AuditLog, Call, Live, write_audit};
use controllers::{KUBERNETES_NAMES, ensure_root_ca, publish_kubernetes_service, rbac_policy};
use dispatch::dispatch;
use request::query;
use routing::{describe, route};

/// The in-memory API server.
#[derive(Clone)]
pub struct ApiServer {
    store: Arc<Store>,
    /// Whether created claims and volumes get kube's in-use protection finalizers (the
    /// StorageObjectInUseProtection admission plugin); only where something removes them.
    protect_storage: bool,
    /// Requests answered, for `/metrics`.
    metrics: Arc<super::metrics::Metrics>,
    /// The credentials it accepts.
    auth: Arc<Authenticator>,
    /// The CA its serving certificate comes from.
    ca: Arc<super::pki::Ca>,
    /// Where the kubelets keep containers' logs, for `pods/log`.
    pod_logs: Option<Arc<dyn PodLogs>>,
    /// The front-proxy identity aggregated APIs are called with.
    front_proxy: Arc<super::aggregation::FrontProxy>,
    /// The RBAC policy as of a version of the RBAC group: read again only once it changed.
    policy: Arc<std::sync::Mutex<Option<CachedPolicy>>>,
    /// Where every authorization decision is appended, when asked for (kube-apiserver's
    /// `--audit-log-path`, at its Metadata level).
    audit: Option<AuditLog>,
}

/// The RBAC policy and the RBAC group's version it was read at.
type CachedPolicy = (u64, Arc<super::rbac::Policy>);

impl Default for ApiServer {
    fn default() -> Self {
        Self::new()
    }
}

impl ApiServer {
    pub fn new() -> ApiServer {
        Self::with_store(Store::new(Registry::with_builtins()))
    }

    /// A server whose watches can resume only within the last `history` changes.
    pub fn with_history(history: usize) -> ApiServer {
        Self::with_store(Store::with_history(Registry::with_builtins(), history))
    }

    fn with_store(store: Store) -> ApiServer {
        let ca = super::pki::Ca::generate().expect("generating the cluster CA");
        store.set_root_ca(ca.cert_pem().to_string());
        for ns in ["default", "kube-system", "kube-public"] {
            ensure_root_ca(&store, ns);
        }
        let front_proxy =
            super::aggregation::FrontProxy::generate().expect("generating the front-proxy CA");
        super::aggregation::publish(&store, ca.cert_pem(), &front_proxy);
        ApiServer {
            store: Arc::new(store),
            protect_storage: false,
            metrics: Default::default(),
            auth: Default::default(),
            ca: Arc::new(ca),
            pod_logs: None,
            front_proxy: Arc::new(front_proxy),
            policy: Default::default(),
            audit: None,
        }
    }

    /// Append every authorization decision to `file` as a JSON line in audit.k8s.io/v1's Event
    /// shape (who, the verb, the object reference or path, and kube's decision annotation).
    pub fn with_audit_log(mut self, file: &std::path::Path) -> std::io::Result<ApiServer> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)?;
        self.audit = Some(Arc::new(std::sync::Mutex::new(f)));
        Ok(self)
    }

    /// Claims and volumes created from now on carry `kubernetes.io/pvc-protection` and
    /// `kubernetes.io/pv-protection`, as kube's StorageObjectInUseProtection admission plugin
    /// adds them: run the protection agent beside a server made so, or deletions never end.
    pub fn protecting_storage(mut self) -> ApiServer {
        self.protect_storage = true;
        self
    }

    /// Also accept the static tokens listed in `file` (`token,user,uid,"group1,group2"` per
    /// line, kube-apiserver's `--token-auth-file`), read as it is when a token is checked.
    pub fn with_token_file(mut self, file: std::path::PathBuf) -> ApiServer {
        Arc::get_mut(&mut self.auth)
            .expect("a server is configured before it is shared")
            .set_token_file(file);
        self
    }

    /// Serve `pods/log` from where the kubelets keep containers' logs.
    pub fn with_pod_logs(mut self, logs: Arc<dyn PodLogs>) -> ApiServer {
        self.pod_logs = Some(logs);
        self
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The server in-process, for `kube::Client::new`: its requests come from the admin unless
    /// they carry a token of their own.
    pub fn router(&self) -> axum::Router {
        self.router_as(super::auth::admin())
    }

    /// The server in-process, its requests coming from `user` unless they carry a token.
    pub fn router_as(&self, user: UserInfo) -> axum::Router {
        self.app()
            .layer(axum::middleware::map_request(move |mut req: Request| {
                let user = user.clone();
                async move {
                    req.extensions_mut().insert(Peer(user));
                    req
                }
            }))
    }

    /// The server as the network sees it: every request authenticates itself.
    fn app(&self) -> axum::Router {
        axum::Router::new()
            .fallback(handle)
            .with_state(self.clone())
    }

    /// The bearer token of the admin (`system:masters`).
    pub fn admin_token(&self) -> &str {
        self.auth.admin_token()
    }

    /// The credentials this server accepts: to mint ServiceAccount tokens, as the kubelet does.
    pub fn authenticator(&self) -> &Arc<Authenticator> {
        &self.auth
    }

    /// A kubeconfig for the admin of this server, listening at `url`.
    pub fn kubeconfig(&self, url: &str) -> String {
        super::kubeconfig::kubeconfig(
            url,
            Some(self.ca_pem()),
            &super::kubeconfig::KubeconfigUser::Token(self.admin_token()),
        )
    }

    /// Listen on `addr` (port 0 for any) with TLS, as kube-apiserver's secure port: clients
    /// trust [`ApiServer::ca_pem`] and send a bearer token (kubectl sends none over plain HTTP).
    /// Returns the bound address and the serving task.
    pub async fn serve(
        &self,
        addr: SocketAddr,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        let acceptor =
            tokio_rustls::TlsAcceptor::from(self.ca.server_config(bound, &KUBERNETES_NAMES)?);
        publish_kubernetes_service(&self.store, bound);
        let router = self.app();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, router) = (acceptor.clone(), router.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(router);
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
                });
            }
        });
        Ok((bound, task))
    }

    /// The certificate of the CA that signed the serving certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }
}

/// Every request's way in: health, authentication and authorization, metrics, aggregated
/// APIs, then its route and handler; each counted for `/metrics`.
async fn handle(State(server): State<ApiServer>, req: Request) -> Response {
    // The health checks, as probes and `kubectl get --raw /readyz` ask them: this server is up
    // and ready as soon as it answers.
    if matches!(req.uri().path(), "/healthz" | "/livez" | "/readyz") && req.method() == Method::GET
    {
        return (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "ok",
        )
            .into_response();
    }
    let user = match server.admit_request(&req) {
        Ok(who) => who,
        Err(e) => {
            server
                .metrics
                .count(describe(&req, None, &query(&req)), e.code);
            return e.into_response();
        }
    };
    if req.uri().path() == "/metrics" && req.method() == Method::GET {
        return (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            server.metrics.render(),
        )
            .into_response();
    }
    // An aggregated API's group and version go to its server.
    if let Some(api_service) = super::aggregation::served_elsewhere(&server.store, req.uri().path())
    {
        let counted = describe(&req, None, &query(&req));
        let response =
            super::aggregation::proxy(&server.store, &server.front_proxy, &api_service, &user, req)
                .await
                .unwrap_or_else(|e| e.into_response());
        server.metrics.count(counted, response.status().as_u16());
        return response;
    }
    // Routed and parsed once, for the request and for its count.
    let target = route(&server.store, req.uri().path());
    let call = server.call(&req, user);
    let counted = describe(&req, target.as_ref().ok(), &call.q);
    let response = match dispatch(target, call, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    server.metrics.count(counted, response.status().as_u16());
    response
}

impl ApiServer {
    /// What the handlers of `req` from `user` are given: the server's parts and the request's
    /// options.
    fn call(&self, req: &Request, user: UserInfo) -> Call {
        let q = query(req);
        let manager = q.get("fieldManager").cloned().filter(|m| !m.is_empty());
        let force = q.flag("force");
        let applying = req.method() == Method::PATCH
            && req
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|t| t.starts_with("application/apply-patch"));
        let may_create = applying && {
            let mut a = super::auth::request_attributes(
                req.method().as_str(),
                req.uri().path(),
                false,
                None,
            );
            a.verb = "create".into();
            self.decide(&user, &a, req.uri())
        };
        Call {
            may_create,
            audit: self.audit.clone(),
            store: self.store.clone(),
            user,
            pod_logs: self.pod_logs.clone(),
            auth: self.auth.clone(),
            protect_storage: self.protect_storage,
            method: req.method().clone(),
            accept: req
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string(),
            dry_run: q.all.contains_key("dryRun"),
            writer: manager.clone().map(|manager| Owner {
                manager,
                applied: None,
                force,
            }),
            manager,
            force,
            validation: q
                .get("fieldValidation")
                .cloned()
                .unwrap_or_else(|| "Warn".to_string()),
            q,
        }
    }

    /// Who sends `req`, once authenticated, impersonation checked and the
    /// request authorized: 401 without valid credentials, 403 where RBAC grants nothing.
    fn admit_request(&self, req: &Request) -> ApiResult<UserInfo> {
        let requester = match super::auth::bearer(req.headers()) {
            Some(token) => self
                .auth
                .verify(token, super::auth::AUDIENCE, &Live(&self.store))
                .ok_or_else(ApiError::unauthorized)?,
            None => match req.extensions().get::<Peer>() {
                Some(Peer(user)) => user.clone(),
                None => return Err(ApiError::unauthorized()),
            },
        };
        let allowed = |user: &UserInfo, a: &Attributes| self.allows(user, a);
        let user = super::auth::impersonate(requester, req.headers(), &allowed)?;
        let q = query(req);
        let attributes = super::auth::request_attributes(
            req.method().as_str(),
            req.uri().path(),
            q.flag("watch"),
            q.get("fieldSelector").map(String::as_str),
        );
        if !self.decide(&user, &attributes, req.uri()) {
            return Err(ApiError::forbidden_request(&user, &attributes));
        }
        Ok(user)
    }

    /// The authorizer's decision, written to the audit log when there is one.
    fn decide(&self, user: &UserInfo, a: &Attributes, uri: &axum::http::Uri) -> bool {
        let allowed = self.allows(user, a);
        if let Some(audit) = &self.audit {
            write_audit(audit, &super::auth::audit_event(user, a, uri, allowed));
        }
        allowed
    }

    /// The authorizer: `system:masters` may do anything, everyone else what RBAC grants.
    fn allows(&self, user: &UserInfo, a: &Attributes) -> bool {
        user.groups.iter().any(|g| g == super::rbac::MASTERS)
            || self.policy().authorize(user, a).is_some()
    }

    /// The RBAC policy, read from the store only when an RBAC object changed since.
    fn policy(&self) -> Arc<super::rbac::Policy> {
        let version = self.store.group_version("rbac.authorization.k8s.io");
        let mut cached = self.policy.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, policy)) = cached.as_ref()
            && *at == version
        {
            return policy.clone();
        }
        let policy = Arc::new(rbac_policy(&self.store));
        *cached = Some((version, policy.clone()));
        policy
    }
}
