//! The HTTP surface: discovery, the REST verbs on every resource, watches as streamed JSON lines.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::auth::{Authenticator, Peer};
use super::errors::{ApiError, ApiResult};
use super::patch::{self, PatchKind};
use super::rbac::{Attributes, UserInfo};
use super::registry::{Registry, ResourceDef};
use super::selector::{FieldSelector, LabelSelector};
use super::store::{
    ChangeKind, DeleteOptions, ListOptions, Owner, Propagation, Store, WriteOptions,
};
use super::view::Resource;

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

/// The audit log's file, shared by the requests that write to it.
type AuditLog = Arc<std::sync::Mutex<std::fs::File>>;

/// Append one event to the audit log; a lost line is not worth failing the request over.
fn write_audit(audit: &AuditLog, event: &Value) {
    let mut f = audit.lock().unwrap_or_else(|e| e.into_inner());
    let _ = std::io::Write::write_all(&mut *f, format!("{event}\n").as_bytes());
}

/// The RBAC policy and the RBAC group's version it was read at.
type CachedPolicy = (u64, Arc<super::rbac::Policy>);

/// Where a node's kubelet keeps the logs of containers, which `pods/log` reads as kube-apiserver
/// asks the kubelet for them.
pub trait PodLogs: Send + Sync {
    /// The log of run `instance` (its restart count then) of `container` of pod `pod_uid` on
    /// `node`.
    fn log_file(
        &self,
        node: &str,
        pod_uid: &str,
        container: &str,
        instance: u32,
    ) -> std::path::PathBuf;
}

impl Default for ApiServer {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a request points.
enum Target {
    Version,
    OpenApiRoot,
    OpenApi(String, String),
    ApiVersions,
    Groups,
    Group(String),
    Resources(String, String),
    Collection {
        def: ResourceDef,
        ns: Option<String>,
    },
    Item {
        def: ResourceDef,
        ns: String,
        name: String,
        sub: Option<String>,
    },
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(v).unwrap_or_default(),
    )
        .into_response()
}

pub use super::http::MAX_BODY;

/// The finalizers of kube's in-use protection: a claim stays until no running pod mounts it, a
/// volume until no claim is bound to it.
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// The query parameters: the first value of each (as kube decodes options), and every value.
#[derive(Debug, Clone, Default)]
struct Query {
    all: HashMap<String, Vec<String>>,
}

impl Query {
    fn get(&self, name: &str) -> Option<&String> {
        self.all.get(name).and_then(|v| v.first())
    }

    /// A boolean option as kube-apiserver converts it (Convert_Slice_string_To_bool): absent,
    /// "0" and "false" in any case are false; anything else, "True" included, is true.
    fn flag(&self, name: &str) -> bool {
        self.opt_flag(name).unwrap_or(false)
    }

    fn opt_flag(&self, name: &str) -> Option<bool> {
        self.get(name)
            .map(|v| !(v == "0" || v.eq_ignore_ascii_case("false")))
    }

    /// An integer option; a malformed one is a 400 with Go's strconv message, as kube answers.
    fn int(&self, name: &str) -> ApiResult<Option<i64>> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let digits = v.strip_prefix(['+', '-']).unwrap_or(v);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ApiError::bad_request(format!(
                "strconv.ParseInt: parsing {}: invalid syntax",
                super::validation::go_quote(v)
            )));
        }
        v.parse::<i64>().map(Some).map_err(|_| {
            ApiError::bad_request(format!(
                "strconv.ParseInt: parsing {}: value out of range",
                super::validation::go_quote(v)
            ))
        })
    }

    /// `resourceVersion`, which the storage parses as an unsigned integer ("" and "0": any).
    fn resource_version(&self) -> ApiResult<Option<u64>> {
        match self.get("resourceVersion").map(String::as_str) {
            None | Some("") | Some("0") => Ok(None),
            Some(rv) => rv.parse::<u64>().map(Some).map_err(|_| {
                let why = if rv.bytes().all(|b| b.is_ascii_digit()) {
                    "value out of range"
                } else {
                    "invalid syntax"
                };
                let q = super::validation::go_quote(rv);
                ApiError::bad_request(format!(
                    "invalid resource version: resourceVersion: Invalid value: {q}: strconv.ParseUint: parsing {q}: {why}"
                ))
            }),
        }
    }

    /// The write options every create, update, patch and delete validates
    /// (ValidateCreateOptions and friends): `dryRun` may only be `All`, `fieldValidation` one
    /// of the known directives, `fieldManager` short and printable.
    fn write_options(&self, options_kind: &str) -> ApiResult<()> {
        self.options_checked(options_kind, false)
    }

    /// The options of a PATCH: an apply must name its field manager.
    fn patch_options(&self, apply: bool) -> ApiResult<()> {
        self.options_checked("PatchOptions", apply)
    }

    fn options_checked(&self, options_kind: &str, apply: bool) -> ApiResult<()> {
        use super::validation::{BadValue, FieldError, go_quote};
        let mut errs = Vec::new();
        if apply && self.get("fieldManager").is_none_or(|m| m.is_empty()) {
            errs.push((
                "fieldManager".to_string(),
                "Required value: is required for apply patch".to_string(),
            ));
        }
        if let Some(manager) = self.get("fieldManager") {
            if manager.len() > 128 {
                errs.push((
                    "fieldManager".to_string(),
                    "Too long: may not be longer than 128".to_string(),
                ));
            }
            if manager.chars().any(|c| c.is_control()) {
                errs.push(
                    FieldError::invalid(
                        "fieldManager",
                        manager,
                        "must only contain printable characters",
                    )
                    .cause(),
                );
            }
        }
        let dry_run = self.all.get("dryRun").cloned().unwrap_or_default();
        if dry_run.iter().any(|d| d != "All") {
            let list: Vec<String> = dry_run.iter().map(|d| go_quote(d)).collect();
            errs.push(
                FieldError::not_supported(
                    "dryRun",
                    BadValue::Raw(format!("[]string{{{}}}", list.join(", "))),
                    &["All"],
                )
                .cause(),
            );
        }
        if let Some(v) = self.get("fieldValidation")
            && !["", "Ignore", "Strict", "Warn"].contains(&v.as_str())
        {
            errs.push(
                FieldError::not_supported(
                    "fieldValidation",
                    BadValue::Str(v.clone()),
                    &["", "Ignore", "Strict", "Warn"],
                )
                .cause(),
            );
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(
                &format!("{options_kind}.meta.k8s.io"),
                "",
                errs,
            ))
        }
    }
}

fn query(req: &Request) -> Query {
    let mut q = Query::default();
    for p in req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        q.all
            .entry(super::http::decode(k))
            .or_default()
            .push(super::http::decode(v));
    }
    q
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

    fn route(&self, path: &str) -> ApiResult<Target> {
        let segs: Vec<&str> = path
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
            ["version"] => return Ok(Target::Version),
            ["openapi", "v3"] => return Ok(Target::OpenApiRoot),
            ["openapi", "v3", "api", v] => {
                return Ok(Target::OpenApi(String::new(), v.to_string()));
            }
            ["openapi", "v3", "apis", g, v] => {
                return Ok(Target::OpenApi(g.to_string(), v.to_string()));
            }
            ["api"] => return Ok(Target::ApiVersions),
            ["apis"] => return Ok(Target::Groups),
            ["apis", g] => return Ok(Target::Group(g.to_string())),
            ["api", v] => return Ok(Target::Resources(String::new(), v.to_string())),
            ["apis", g, v] => return Ok(Target::Resources(g.to_string(), v.to_string())),
            ["api", v, rest @ ..] => ("", *v, rest),
            ["apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => return Err(ApiError::path_not_found()),
        };
        let registry = self.store.registry();
        let def = |plural: &str| {
            registry
                .get(group, version, plural)
                .cloned()
                .ok_or_else(ApiError::path_not_found)
        };
        let core_ns = group.is_empty();
        let mut target = match rest {
            [plural] => Target::Collection {
                def: def(plural)?,
                ns: None,
            },
            ["namespaces", name] if core_ns => Target::Item {
                def: def("namespaces")?,
                ns: String::new(),
                name: name.to_string(),
                sub: None,
            },
            ["namespaces", name, sub @ ("status" | "finalize")] if core_ns => Target::Item {
                def: def("namespaces")?,
                ns: String::new(),
                name: name.to_string(),
                sub: Some(sub.to_string()),
            },
            ["namespaces", ns, plural] => {
                let d = def(plural)?;
                if !d.namespaced {
                    return Err(ApiError::path_not_found());
                }
                Target::Collection {
                    def: d,
                    ns: Some(ns.to_string()),
                }
            }
            ["namespaces", ns, plural, name] => Target::Item {
                def: def(plural)?,
                ns: ns.to_string(),
                name: name.to_string(),
                sub: None,
            },
            ["namespaces", ns, plural, name, sub] => Target::Item {
                def: def(plural)?,
                ns: ns.to_string(),
                name: name.to_string(),
                sub: Some(sub.to_string()),
            },
            [plural, name] => Target::Item {
                def: def(plural)?,
                ns: String::new(),
                name: name.to_string(),
                sub: None,
            },
            [plural, name, sub] => Target::Item {
                def: def(plural)?,
                ns: String::new(),
                name: name.to_string(),
                sub: Some(sub.to_string()),
            },
            _ => return Err(ApiError::path_not_found()),
        };
        match &mut target {
            Target::Item { ns, name, .. } => {
                *ns = super::http::decode_segment(ns);
                *name = super::http::decode_segment(name);
                // As the registry's key function: a name must be usable as a path segment.
                let problems = super::validation::is_path_segment_name(name);
                if !problems.is_empty() {
                    return Err(ApiError::bad_request(format!(
                        "Name parameter invalid: {}: {}",
                        super::validation::go_quote(name),
                        problems.join(";")
                    )));
                }
            }
            Target::Collection { ns: Some(ns), .. } => *ns = super::http::decode_segment(ns),
            _ => {}
        }
        Ok(target)
    }
}

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
    let target = server.route(req.uri().path());
    let call = Call::new(&server, &req, user);
    let counted = describe(&req, target.as_ref().ok(), &call.q);
    let response = match dispatch(target, call, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    server.metrics.count(counted, response.status().as_u16());
    response
}

impl ApiServer {
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

/// The uids the authenticator checks tokens against.
struct Live<'a>(&'a Store);

impl super::auth::Lookup for Live<'_> {
    fn uid(&self, plural: &str, namespace: &str, name: &str) -> Option<String> {
        let def = self.0.registry().get("", "v1", plural)?.clone();
        let obj = self.0.get(&def, namespace, name).ok()?;
        obj["metadata"]["uid"].as_str().map(str::to_string)
    }
}

/// How kube-apiserver's request metrics label a request: the verb as its authorizer names it,
/// and the resource it reaches.
fn describe(req: &Request, target: Option<&Target>, q: &Query) -> super::metrics::Request {
    let (def, sub, item) = match target {
        Some(Target::Collection { def, .. }) => (Some(def), None, false),
        Some(Target::Item { def, sub, .. }) => (Some(def), sub.clone(), true),
        _ => (None, None, false),
    };
    let verb = match (def.is_some(), req.method().as_str(), item) {
        (false, m, _) => m.to_ascii_lowercase(),
        (true, "GET", _) if q.flag("watch") => "watch".into(),
        (true, "GET", true) => "get".into(),
        (true, "GET", false) => "list".into(),
        (true, "POST", _) => "create".into(),
        (true, "PUT", _) => "update".into(),
        (true, "PATCH", _) => "patch".into(),
        (true, "DELETE", true) => "delete".into(),
        (true, "DELETE", false) => "deletecollection".into(),
        (true, m, _) => m.to_ascii_lowercase(),
    };
    super::metrics::Request {
        verb,
        group: def.map(|d| d.group.clone()).unwrap_or_default(),
        resource: def.map(|d| d.plural.clone()).unwrap_or_default(),
        subresource: sub.unwrap_or_default(),
        code: String::new(),
    }
}

/// The fields a kind's field selectors may name besides `metadata.name` and
/// `metadata.namespace` (kube's field label conversion functions), or None where this server
/// does not know the kind's set and takes any field outside `metadata`.
fn selectable_fields(def: &ResourceDef) -> Option<&'static [&'static str]> {
    Some(match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
        ],
        ("", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("", "namespaces") => &["status.phase"],
        ("", "secrets") => &["type"],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "configmaps" | "serviceaccounts" | "persistentvolumeclaims" | "persistentvolumes")
        | ("storage.k8s.io", _)
        | ("coordination.k8s.io", _)
        | ("rbac.authorization.k8s.io", _)
        | ("apps", "deployments") => &[],
        _ => return None,
    })
}

/// The selectors of a list or watch; a field selector on a field the kind does not support is
/// a 400, as kube answers it.
fn selectors(def: &ResourceDef, q: &Query) -> ApiResult<ListOptions> {
    let mut fields = FieldSelector::parse(q.get("fieldSelector").map(String::as_str).unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let unsupported =
        |field: &str| ApiError::bad_request(format!("field label not supported: {field}"));
    let known = selectable_fields(def);
    let view = super::view::of(def);
    for (field, _, _) in &mut fields.0 {
        // A view selects the stored objects, by the field its label converts to.
        if let Some(view) = view {
            *field = view
                .stored_field(field)
                .ok_or_else(|| unsupported(field))?
                .to_string();
            continue;
        }
        // A custom resource: only what its CRD declares selectable.
        let supported = matches!(field.as_str(), "metadata.name" | "metadata.namespace")
            || if def.schema.is_some() {
                def.selectable_fields.contains(field)
            } else {
                match known {
                    Some(list) => list.contains(&field.as_str()),
                    None => !field.starts_with("metadata."),
                }
            };
        if !supported {
            return Err(unsupported(field));
        }
    }
    Ok(ListOptions {
        labels: LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?,
        fields,
        ..Default::default()
    })
}

/// The options of a list: selectors, `limit`, and where a `continue` token resumes.
fn list_options(store: &Store, def: &ResourceDef, q: &Query) -> ApiResult<ListOptions> {
    let rv = q.resource_version()?;
    let mut opts = selectors(def, q)?;
    opts.limit = q.int("limit")?.filter(|l| *l > 0).map(|l| l as usize);
    if let Some(token) = q.get("continue").filter(|c| !c.is_empty()) {
        if rv.is_some() {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let (token_rv, start) = decode_continue(token)?;
        if token_rv > 0 && store.expired(token_rv as u64) {
            return Err(ApiError::gone(
                "The provided continue parameter is too old to display a consistent list result. \
                 You can start a new list without the continue parameter.",
            ));
        }
        opts.continue_after = Some(start);
    }
    Ok(opts)
}

const CONTINUE_VERSION: &str = "meta.k8s.io/v1";

/// A continue token as kube-apiserver encodes one: base64url of
/// `{"v":"meta.k8s.io/v1","rv":<list version>,"start":<position>}`.
fn encode_continue(rv: u64, position: &str) -> String {
    use base64::Engine;
    let token = json!({"v": CONTINUE_VERSION, "rv": rv, "start": position});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

/// A continue token back into (version, position); a malformed one is a 400 with kube's
/// messages (k8s.io/apiserver/pkg/storage/continue.go).
fn decode_continue(token: &str) -> ApiResult<(i64, String)> {
    use base64::Engine;
    let invalid = |why: &str| {
        let why = if why.is_empty() {
            String::new()
        } else {
            format!(": {why}")
        };
        ApiError::bad_request(format!(
            "invalid continue token: continue key is not valid{why}"
        ))
    };
    let data = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|e| {
            let at = match e {
                base64::DecodeError::InvalidByte(at, _)
                | base64::DecodeError::InvalidLastSymbol(at, _) => at,
                base64::DecodeError::InvalidLength(len) => len,
                base64::DecodeError::InvalidPadding => token.len(),
            };
            invalid(&format!("illegal base64 data at input byte {at}"))
        })?;
    let parsed: Value = serde_json::from_slice(&data).map_err(|e| invalid(&e.to_string()))?;
    let field = |name: &str| parsed.get(name).filter(|v| !v.is_null());
    let version = field("v").map(|v| v.as_str().ok_or(())).transpose();
    let rv = field("rv").map(|v| v.as_i64().ok_or(())).transpose();
    let start = field("start").map(|v| v.as_str().ok_or(())).transpose();
    let (Some(()), Ok(version), Ok(rv), Ok(start)) =
        (parsed.is_object().then_some(()), version, rv, start)
    else {
        return Err(invalid("the token does not decode to a continue token"));
    };
    if version != Some(CONTINUE_VERSION) {
        return Err(invalid("server does not recognize this encoded version"));
    }
    let rv = rv.unwrap_or(0);
    if rv == 0 {
        return Err(invalid(
            "incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        ));
    }
    let start = start.unwrap_or("");
    if start.is_empty() {
        return Err(invalid("encoded start key empty (version meta.k8s.io/v1)"));
    }
    // kube refuses keys that path.Clean would change (no climbing out of the resource).
    let key = if start.starts_with('/') {
        start.to_string()
    } else {
        format!("/{start}")
    };
    let segments: Vec<&str> = key[1..].split('/').collect();
    if key.len() > 1
        && segments
            .iter()
            .any(|s| s.is_empty() || *s == "." || *s == "..")
    {
        return Err(invalid(start));
    }
    Ok((rv, start.to_string()))
}

/// The request body, refused with 413 beyond [`MAX_BODY`] as kube-apiserver does.
async fn body_bytes(req: Request) -> ApiResult<Bytes> {
    use futures::StreamExt;
    let mut stream = req.into_body().into_data_stream();
    let mut out = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
        seen += chunk.len();
        if seen > MAX_BODY {
            // The rest is read and dropped (within reason), so that the client gets the answer
            // rather than a reset connection while it is still sending.
            out = Vec::new();
            if seen > 64 * MAX_BODY {
                break;
            }
            continue;
        }
        out.extend_from_slice(&chunk);
    }
    if seen > MAX_BODY {
        return Err(ApiError::too_large(MAX_BODY));
    }
    Ok(Bytes::from(out))
}

/// A create's or update's body, in a media type the server decodes: JSON, YAML, and protobuf for
/// the kinds kubectl's generators send. Other media types get kube's 415 (client-go does not
/// fall back to JSON on it).
async fn read_object(req: Request) -> ApiResult<Value> {
    let media = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if media == "application/vnd.kubernetes.protobuf" {
        return super::protobuf::decode(&body_bytes(req).await?);
    }
    if !matches!(media.as_str(), "" | "application/json" | "application/yaml") {
        return Err(ApiError::unsupported_media_type(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml",
        ));
    }
    parse_object(&body_bytes(req).await?)
}

/// What kube-apiserver refuses before looking further: a body of another kind or API version
/// than the URL's resource (a Secret POSTed to `configmaps`), or naming another namespace than
/// the URL. A body may leave all three out; the URL supplies them.
fn matches_url(def: &ResourceDef, ns: &str, obj: &Value) -> ApiResult<()> {
    let api_version = obj["apiVersion"].as_str().unwrap_or("");
    let kind = obj["kind"].as_str().unwrap_or("");
    if !kind.is_empty() && kind != def.kind {
        // The versioning decoder's wording, then why it cannot.
        let version = api_version.rsplit('/').next().unwrap_or("");
        return Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {}: the body is a {kind}, and {} holds {} objects",
            def.kind, def.plural, def.kind
        )));
    }
    if !api_version.is_empty() && api_version != def.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            def.api_version()
        )));
    }
    let named = obj["metadata"]["namespace"].as_str().unwrap_or("");
    if def.namespaced && !named.is_empty() && named != ns {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

fn parse_object(bytes: &[u8]) -> ApiResult<Value> {
    let v: Value = serde_json::from_slice(bytes)
        .or_else(|_| serde_saphyr::from_slice::<Value>(bytes).map_err(|e| e.to_string()))
        .map_err(|e| ApiError::bad_request(format!("the body is not a valid object: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request("the body must be an object"));
    }
    Ok(v)
}

async fn dispatch(target: ApiResult<Target>, call: Call, req: Request) -> ApiResult<Response> {
    let target = target?;
    let store = &call.store;
    match target {
        Target::Version => Ok(json_response(StatusCode::OK, &version())),
        Target::OpenApiRoot => {
            let mut root = super::openapi::root(&store.registry());
            // Aggregated group versions: their documents come from their servers.
            for (group, versions) in super::aggregation::groups(store) {
                for v in versions {
                    let p = format!("apis/{group}/{v}");
                    root["paths"][&p] = json!({"serverRelativeURL": format!("/openapi/v3/{p}")});
                }
            }
            Ok(json_response(StatusCode::OK, &root))
        }
        Target::OpenApi(g, v) => super::openapi::group_version(&store.registry(), &g, &v)
            .map(|doc| json_response(StatusCode::OK, &doc))
            .ok_or_else(ApiError::path_not_found),
        Target::ApiVersions => Ok(json_response(
            StatusCode::OK,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        )),
        Target::Groups => Ok(json_response(StatusCode::OK, &groups(store))),
        Target::Group(g) => {
            let list = groups(store);
            let found = list["groups"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["name"] == g.as_str()).cloned());
            match found {
                Some(mut group) => {
                    group["kind"] = json!("APIGroup");
                    group["apiVersion"] = json!("v1");
                    Ok(json_response(StatusCode::OK, &group))
                }
                None => Err(ApiError::path_not_found()),
            }
        }
        Target::Resources(g, v) => {
            let registry = store.registry();
            let defs = registry.in_group_version(&g, &v);
            if defs.is_empty() {
                return Err(ApiError::path_not_found());
            }
            let group_version = if g.is_empty() {
                v.clone()
            } else {
                format!("{g}/{v}")
            };
            let resources: Vec<Value> = defs.iter().flat_map(|d| d.discovery()).collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
            ))
        }
        Target::Collection { def, ns } => collection(&call, &call.resource(def)?, ns, req).await,
        Target::Item { def, ns, name, sub } => {
            let at = Named {
                res: call.resource(def)?,
                ns,
                name,
            };
            item(&call, &at, sub.as_deref(), req).await
        }
    }
}

/// What every handler of a request needs besides its target.
struct Call {
    store: Arc<Store>,
    /// Who the request acts as.
    user: UserInfo,
    pod_logs: Option<Arc<dyn PodLogs>>,
    auth: Arc<Authenticator>,
    /// Created claims and volumes get the in-use protection finalizers.
    protect_storage: bool,
    q: Query,
    method: Method,
    accept: String,
    /// Every value was checked to be "All" before a write uses this.
    dry_run: bool,
    manager: Option<String>,
    force: bool,
    writer: Option<Owner>,
    validation: String,
    /// For a server-side apply: whether the user may also create what it names, which kube asks
    /// when the object does not exist yet (`create` besides `patch`).
    may_create: bool,
    audit: Option<AuditLog>,
}

impl Call {
    fn new(server: &ApiServer, req: &Request, user: UserInfo) -> Call {
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
            server.decide(&user, &a, req.uri())
        };
        Call {
            may_create,
            audit: server.audit.clone(),
            store: server.store.clone(),
            user,
            pod_logs: server.pod_logs.clone(),
            auth: server.auth.clone(),
            protect_storage: server.protect_storage,
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

    /// Where the objects of `def` are (for a view, another resource's).
    fn resource(&self, def: ResourceDef) -> ApiResult<Resource> {
        Resource::new(self.store.clone(), def)
    }

    /// `kubectl get` asks for a Table.
    fn wants_table(&self) -> bool {
        super::table::wants_table(&self.accept)
    }

    /// A Table of `items`, their whole objects in the rows if asked (`includeObject=Object`).
    fn table(&self, def: &ResourceDef, items: &[Value], rv: &str) -> Value {
        let include = self.q.get("includeObject").is_some_and(|i| i == "Object");
        super::table::table(def, items, rv, include)
    }

    /// How this request writes: its dry run, and its field manager as the owner of what it sets.
    fn write(&self, status_only: bool) -> WriteOptions<'_> {
        WriteOptions {
            dry_run: self.dry_run,
            status_only,
            owner: self.writer.as_ref(),
        }
    }

    /// A refused method, in kube's words: `PUT is not supported on pods/binding`.
    fn not_supported(&self, def: &ResourceDef, sub: &str) -> ApiError {
        ApiError::method_not_allowed(format!(
            "{} is not supported on {}/{sub}",
            self.method, def.plural
        ))
    }
}

/// A collection: list, watch, create, delete the matching.
async fn collection(
    call: &Call,
    res: &Resource,
    ns: Option<String>,
    req: Request,
) -> ApiResult<Response> {
    let (def, q) = (&res.def, &call.q);
    match call.method {
        Method::GET if q.flag("watch") => watch(call, res.clone(), ns),
        Method::GET => {
            let opts = list_options(&call.store, def, q)?;
            let (items, rv, next) = res.list(ns.as_deref(), &opts);
            let next = next.map(|position| encode_continue(rv, &position));
            if call.wants_table() {
                let mut t = call.table(def, &items, &rv.to_string());
                if let Some(next) = next {
                    t["metadata"]["continue"] = json!(next);
                }
                return Ok(json_response(StatusCode::OK, &t));
            }
            let mut meta = json!({"resourceVersion": rv.to_string()});
            if let Some(next) = next {
                meta["continue"] = json!(next);
            }
            Ok(json_response(
                StatusCode::OK,
                &json!({"apiVersion": def.api_version(), "kind": format!("{}List", def.kind), "metadata": meta, "items": items}),
            ))
        }
        Method::POST => {
            let ns = ns.unwrap_or_default();
            if def.namespaced && ns.is_empty() {
                return Err(ApiError::method_not_allowed(format!(
                    "{} must be created in a namespace",
                    def.plural
                )));
            }
            q.write_options("CreateOptions")?;
            let obj = read_object(req).await?;
            matches_url(def, &ns, &obj)?;
            if def.create_only {
                let mut review = obj;
                review["status"] = answer_review(call, def, &ns, &review)?;
                return Ok(json_response(StatusCode::CREATED, &review));
            }
            let mut obj = obj;
            let warnings = admit_create(call, def, &ns, &mut obj, None).await?;
            if call.protect_storage {
                protect(def, &mut obj);
            }
            let created = create(res, &ns, obj, call.dry_run, call.writer.as_ref())?;
            Ok(with_warnings(
                json_response(StatusCode::CREATED, &created),
                &warnings,
            ))
        }
        Method::DELETE => {
            q.write_options("DeleteOptions")?;
            let opts = list_options(&call.store, def, q)?;
            let (items, _, _) = res.list(ns.as_deref(), &opts);
            let mut deleted = Vec::new();
            for item in items {
                let name = item["metadata"]["name"].as_str().unwrap_or("").to_string();
                let ins = item["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                if let Ok(d) = res.delete(
                    &ins,
                    &name,
                    &DeleteOptions {
                        dry_run: call.dry_run,
                        ..Default::default()
                    },
                ) {
                    deleted.push(d);
                }
            }
            Ok(json_response(
                StatusCode::OK,
                &json!({"apiVersion": def.api_version(), "kind": format!("{}List", def.kind), "metadata": {"resourceVersion": res.store.resource_version().to_string()}, "items": deleted}),
            ))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "{} is not supported on {}",
            call.method, def.plural
        ))),
    }
}

/// The object an item request names.
struct Named {
    res: Resource,
    ns: String,
    name: String,
}

/// A subresource's handler, for every method on `{object}/{name}`.
type SubresourceHandler =
    for<'a> fn(&'a Call, &'a Named, Request) -> BoxFuture<'a, ApiResult<Response>>;

/// A subresource the server serves: for which kinds, and its handler.
struct Subresource {
    name: &'static str,
    served: fn(&ResourceDef) -> bool,
    handle: SubresourceHandler,
}

fn declares(def: &ResourceDef, sub: &str) -> bool {
    def.subresources.iter().any(|s| s == sub)
}

/// Every subresource served. A name not here, or not served for the kind, is a 404.
const SUBRESOURCES: &[Subresource] = &[
    Subresource {
        name: "status",
        // Read and patched through on every kind, as this server always has; only a PUT
        // requires the kind to declare it (see `status`).
        served: |_| true,
        handle: |call, at, req| Box::pin(status(call, at, req)),
    },
    Subresource {
        name: "binding",
        served: |def| declares(def, "binding"),
        handle: |call, at, req| Box::pin(binding(call, at, req)),
    },
    Subresource {
        name: "scale",
        served: |def| declares(def, "scale"),
        handle: |call, at, req| Box::pin(scale(call, at, req)),
    },
    Subresource {
        name: "log",
        served: |def| def.group.is_empty() && def.plural == "pods",
        handle: |call, at, req| Box::pin(pod_log(call, at, req)),
    },
    Subresource {
        name: "token",
        served: |def| declares(def, "token"),
        handle: |call, at, req| Box::pin(token_request(call, at, req)),
    },
];

/// One object: get, replace, patch, delete, and its subresources.
async fn item(call: &Call, at: &Named, sub: Option<&str>, req: Request) -> ApiResult<Response> {
    let def = &at.res.def;
    if def.create_only {
        return Err(ApiError::method_not_allowed(format!(
            "{} only supports create",
            def.plural
        )));
    }
    if let Some(sub) = sub {
        // A subresource the kind does not serve is not there at all, as kube answers it
        // (a GET of csidrivers/rancher.io/local-path is a 404, not a refused method).
        let found = SUBRESOURCES
            .iter()
            .find(|s| s.name == sub && (s.served)(def))
            .ok_or_else(ApiError::path_not_found)?;
        return (found.handle)(call, at, req).await;
    }
    match call.method {
        Method::GET => get(call, at),
        Method::PUT => update(call, at, Write::Update, req).await,
        Method::PATCH => patch(call, at, Write::Update, req).await,
        Method::DELETE => delete(call, at, req).await,
        _ => Err(call.not_supported(def, "")),
    }
}

fn get(call: &Call, at: &Named) -> ApiResult<Response> {
    call.q.resource_version()?;
    let obj = at.res.get(&at.ns, &at.name)?;
    if call.wants_table() {
        let rv = obj["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("")
            .to_string();
        return Ok(json_response(
            StatusCode::OK,
            &call.table(&at.res.def, &[obj], &rv),
        ));
    }
    Ok(json_response(StatusCode::OK, &obj))
}

/// A PUT of the object (`Write::Update`) or of its status (`Write::Status`).
async fn update(call: &Call, at: &Named, how: Write, req: Request) -> ApiResult<Response> {
    let Named { res, ns, name } = at;
    let (def, store) = (&res.def, &call.store);
    let status = how == Write::Status;
    call.q.write_options("UpdateOptions")?;
    let mut obj = read_object(req).await?;
    matches_url(def, ns, &obj)?;
    let mut warnings = admit(def, &mut obj, &call.validation, how, Some(name.as_str()))?;
    let current = res.get(ns, name).ok();
    if !status && let Some(current) = &current {
        validate_update(def, &expandable_classes(store, def), current, &obj)?;
    }
    if let Some(current) = &current {
        warnings.extend(webhooks(call, def, ns, name, Some(current), &mut obj, how).await?);
    }
    let updated = res.update(ns, name, obj, &call.write(status))?;
    after_write(store, def, &updated);
    Ok(with_warnings(
        json_response(StatusCode::OK, &updated),
        &warnings,
    ))
}

/// A PATCH of the object (`Write::Update`) or of its status (`Write::Status`), in any of the
/// patch types; an apply creates what does not exist.
async fn patch(call: &Call, at: &Named, how: Write, req: Request) -> ApiResult<Response> {
    let Named { res, ns, name } = at;
    let (def, store) = (&res.def, &call.store);
    let status = how == Write::Status;
    let req_path = req.uri().path().to_string();
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let kind = PatchKind::from_content_type(&ct)?;
    call.q.patch_options(kind == PatchKind::Apply)?;
    let body = body_bytes(req).await?;
    let mut warnings = Vec::new();
    // An apply claims the fields it sets and conflicts with other managers'.
    let apply_owner = if kind == PatchKind::Apply {
        let applied = serde_json::from_slice::<Value>(&body)
            .or_else(|_| serde_saphyr::from_slice::<Value>(&body).map_err(|e| e.to_string()))
            .ok();
        Some(Owner {
            manager: call.manager.clone().unwrap_or_default(),
            applied,
            force: call.force,
        })
    } else {
        call.writer.clone()
    };
    let write = WriteOptions {
        owner: apply_owner.as_ref(),
        ..call.write(status)
    };
    let expandable = expandable_classes(store, def);
    // With webhooks to call, the patched object is made from a read and sent to them; the
    // write then happens only if nothing changed the object meanwhile (else a conflict, which
    // clients retry).
    let reviewed = match res.get(ns, name) {
        Ok(current) if super::admission::any(store, def) => {
            let mut next = patch::apply(kind, &current, &body)?;
            warnings = admit(def, &mut next, &call.validation, how, Some(name.as_str()))?;
            if !status {
                validate_update(def, &expandable, &current, &next)?;
            }
            warnings.extend(webhooks(call, def, ns, name, Some(&current), &mut next, how).await?);
            Some((current["metadata"]["resourceVersion"].clone(), next))
        }
        _ => None,
    };
    let result = res.modify(ns, name, &write, |current| {
        if let Some((version, next)) = &reviewed {
            if current["metadata"]["resourceVersion"] != *version {
                return Err(ApiError::conflict(&def.group, &def.plural, name));
            }
            return Ok(next.clone());
        }
        let mut next = patch::apply(kind, current, &body)?;
        warnings = admit(def, &mut next, &call.validation, how, Some(name.as_str()))?;
        if !status {
            validate_update(def, &expandable, current, &next)?;
        }
        Ok(next)
    });
    let updated = match result {
        Err(e) if e.code == 404 && kind == PatchKind::Apply && !status => {
            // Server-side apply creates what does not exist, for whoever may create it.
            if !call.may_create {
                let mut a = super::auth::request_attributes("PATCH", &req_path, false, None);
                a.verb = "create".into();
                return Err(ApiError::forbidden_request(&call.user, &a));
            }
            let mut obj = parse_object(&body)?;
            obj["metadata"]["name"] = json!(name);
            warnings = admit_create(call, def, ns, &mut obj, None).await?;
            if call.protect_storage {
                protect(def, &mut obj);
            }
            create(res, ns, obj, call.dry_run, apply_owner.as_ref())?
        }
        other => other?,
    };
    after_write(store, def, &updated);
    Ok(with_warnings(
        json_response(StatusCode::OK, &updated),
        &warnings,
    ))
}

async fn delete(call: &Call, at: &Named, req: Request) -> ApiResult<Response> {
    let Named { res, ns, name } = at;
    let (def, store, q) = (&res.def, &call.store, &call.q);
    q.write_options("DeleteOptions")?;
    let body = body_bytes(req).await?;
    let opts: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&body).unwrap_or(json!({}))
    };
    let policy = q
        .get("propagationPolicy")
        .cloned()
        .or_else(|| opts["propagationPolicy"].as_str().map(str::to_string))
        .or_else(|| (opts["orphanDependents"] == json!(true)).then(|| "Orphan".to_string()));
    let propagation = match policy.as_deref() {
        Some("Orphan") => Propagation::Orphan,
        Some("Foreground") => Propagation::Foreground,
        None | Some("Background") => Propagation::Background,
        Some(other) => {
            // ValidateDeleteOptions.
            let e = super::validation::FieldError::not_supported(
                "propagationPolicy",
                super::validation::BadValue::Str(other.to_string()),
                &["Foreground", "Background", "Orphan", "nil"],
            );
            return Err(ApiError::invalid(
                "DeleteOptions.meta.k8s.io",
                "",
                vec![e.cause()],
            ));
        }
    };
    let grace_period = q
        .int("gracePeriodSeconds")?
        .or_else(|| opts["gracePeriodSeconds"].as_i64());
    let body_dry_run = opts["dryRun"]
        .as_array()
        .is_some_and(|d| d.iter().any(|v| v == "All"));
    let how = DeleteOptions {
        propagation,
        precondition_uid: opts["preconditions"]["uid"].as_str().map(str::to_string),
        grace_period,
        dry_run: call.dry_run || body_dry_run,
    };
    if super::admission::any(store, def)
        && let Ok(current) = res.get(ns, name)
    {
        let attempt = super::admission::Attempt {
            operation: "DELETE",
            def,
            subresource: "",
            namespace: ns,
            name,
            old: Some(&current),
            user: &call.user,
            dry_run: how.dry_run,
        };
        super::admission::validate(store, &attempt, None).await?;
    }
    // A CRD's objects go with it, and its kind stops being served when it goes: the store
    // does both, for the collector's deletes too.
    let deleted = res.delete(ns, name, &how)?;
    if is_cluster_role(def) {
        aggregate_cluster_roles(store);
    }
    if def.group.is_empty()
        && def.plural == "serviceaccounts"
        && name == super::store::DEFAULT_SERVICE_ACCOUNT
        && !how.dry_run
    {
        ensure_default_service_account(store, ns);
    }
    if def.group.is_empty()
        && def.plural == "configmaps"
        && name == super::store::ROOT_CA_CONFIG_MAP
        && !how.dry_run
    {
        ensure_root_ca(store, ns);
    }
    Ok(json_response(StatusCode::OK, &deleted))
}

/// `{object}/status`: the object as a GET reads it; writes change only its status.
async fn status(call: &Call, at: &Named, req: Request) -> ApiResult<Response> {
    match call.method {
        Method::GET => get(call, at),
        Method::PUT if !at.res.def.has_status() => Err(ApiError::path_not_found()),
        Method::PUT => update(call, at, Write::Status, req).await,
        Method::PATCH => patch(call, at, Write::Status, req).await,
        _ => Err(call.not_supported(&at.res.def, "status")),
    }
}

/// `pods/{name}/binding`: the scheduler's placement of a pod on a node.
async fn binding(call: &Call, at: &Named, req: Request) -> ApiResult<Response> {
    if call.method != Method::POST {
        return Err(call.not_supported(&at.res.def, "binding"));
    }
    let Named { res, ns, name } = at;
    let binding = read_object(req).await?;
    let node = binding["target"]["name"].as_str().unwrap_or("").to_string();
    if node.is_empty() {
        return Err(ApiError::invalid(
            "Binding",
            name,
            vec![("target.name".into(), "Required value".into())],
        ));
    }
    res.modify(ns, name, &call.write(false), |current| {
        if current["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty())
        {
            return Err(ApiError::conflict("", "pods", name));
        }
        let mut next = current.clone();
        next["spec"]["nodeName"] = json!(node);
        Ok(next)
    })?;
    // As kube-apiserver's binding does: the pod is now scheduled.
    res.modify(ns, name, &call.write(true), |current| {
        let mut next = current.clone();
        if !next["status"].is_object() {
            next["status"] = json!({});
        }
        let mut conditions: Vec<Value> = next["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conditions.retain(|c| c["type"] != "PodScheduled");
        conditions.push(json!({"type": "PodScheduled", "status": "True",
            "lastTransitionTime": super::store::now()}));
        next["status"]["conditions"] = json!(conditions);
        Ok(next)
    })?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

/// How a write of `scale` makes the next Scale from the current one.
type ScaleChange = dyn Fn(&Value) -> ApiResult<Value> + Send + Sync;

/// The `scale` subresource (autoscaling/v1 Scale) of an object with `spec.replicas`, as
/// `kubectl scale` reads and patches it: `spec.replicas`, and the pods' count and selector.
async fn scale(call: &Call, at: &Named, req: Request) -> ApiResult<Response> {
    let Named { res, ns, name } = at;
    let as_scale = |obj: &Value| {
        let selector = obj["spec"]["selector"]["matchLabels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let meta = &obj["metadata"];
        json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
                "creationTimestamp": meta["creationTimestamp"]},
            "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(1)},
            "status": {"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0),
                "selector": selector}})
    };
    let next_scale: Box<ScaleChange> = match call.method {
        Method::GET => {
            return Ok(json_response(
                StatusCode::OK,
                &as_scale(&res.get(ns, name)?),
            ));
        }
        Method::PUT => {
            let body = read_object(req).await?;
            Box::new(move |_| Ok(body.clone()))
        }
        Method::PATCH => {
            let ct = req
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let kind = PatchKind::from_content_type(&ct)?;
            let body = body_bytes(req).await?;
            Box::new(move |current| patch::apply(kind, current, &body))
        }
        _ => return Err(call.not_supported(&res.def, "scale")),
    };
    let def = res.def.clone();
    let updated = res.modify(ns, name, &call.write(false), |current| {
        let wanted = next_scale(&as_scale(current))?;
        let asked_version = wanted["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if call.method == Method::PUT
            && !asked_version.is_empty()
            && Some(asked_version) != current["metadata"]["resourceVersion"].as_str()
        {
            return Err(ApiError::conflict(&def.group, &def.plural, name));
        }
        let replicas = wanted["spec"]["replicas"].as_i64().unwrap_or(0);
        if replicas < 0 {
            return Err(ApiError::invalid(
                "Scale.autoscaling",
                name,
                vec![(
                    "spec.replicas".into(),
                    format!("Invalid value: {replicas}: must be greater than or equal to 0"),
                )],
            ));
        }
        let mut next = current.clone();
        next["spec"]["replicas"] = json!(replicas);
        Ok(next)
    })?;
    Ok(json_response(StatusCode::OK, &as_scale(&updated)))
}

/// `pods/log` as `kubectl logs` asks it: the current run of a container (`container`, needed when
/// the pod has several), or the one before (`previous`), its last `tailLines` lines or
/// `limitBytes` bytes, and with `follow` what it writes until it ends.
async fn pod_log(call: &Call, at: &Named, _req: Request) -> ApiResult<Response> {
    if call.method != Method::GET {
        return Err(call.not_supported(&at.res.def, "log"));
    }
    let Named { res, ns, name } = at;
    let pod = res.get(ns, name)?;
    let bad = |m: String| ApiError::bad_request(m);
    let containers: Vec<&str> = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod["spec"][*k].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str())
        .collect();
    let mains: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let container = match call.q.get("container").filter(|c| !c.is_empty()) {
        Some(c) if containers.contains(&c.as_str()) => c.clone(),
        Some(c) => {
            return Err(bad(format!("container {c} is not valid for pod {name}")));
        }
        None if mains.len() == 1 => mains[0].to_string(),
        None => {
            return Err(bad(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                mains.join(" ")
            )));
        }
    };
    let status = ["initContainerStatuses", "containerStatuses"]
        .iter()
        .flat_map(|k| pod["status"][*k].as_array().into_iter().flatten())
        .find(|s| s["name"] == container.as_str())
        .cloned()
        .unwrap_or(Value::Null);
    let restarts = status["restartCount"].as_u64().unwrap_or(0) as u32;
    let state = &status["state"];
    let ended_before = status["lastState"]["terminated"].is_object() && restarts > 0;
    let previous = call.q.flag("previous");
    // As the kubelet picks the run: the current one once it has started, else (waiting to
    // restart) the one that ended last; `previous`, the one that ended last.
    let instance = if previous {
        ended_before.then(|| restarts - 1).ok_or_else(|| {
            bad(format!(
                "previous terminated container {container:?} in pod {name:?} not found"
            ))
        })?
    } else if state["running"].is_object() || state["terminated"].is_object() {
        restarts
    } else if ended_before {
        restarts - 1
    } else {
        let reason = state["waiting"]["reason"]
            .as_str()
            .unwrap_or("ContainerCreating");
        return Err(bad(format!(
            "container {container:?} in pod {name:?} is waiting to start: {reason}"
        )));
    };
    let node = pod["spec"]["nodeName"].as_str().unwrap_or("");
    let Some(logs) = call.pod_logs.as_ref().filter(|_| !node.is_empty()) else {
        return Err(bad(format!(
            "container {container:?} in pod {name:?} has no logs on this cluster"
        )));
    };
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
    let file = logs.log_file(node, uid, &container, instance);
    let text = std::fs::read(&file).unwrap_or_default();
    let tail = call.q.int("tailLines")?.filter(|n| *n >= 0);
    let limit = call.q.int("limitBytes")?.filter(|n| *n > 0);
    let mut head = text.as_slice();
    if let Some(n) = tail {
        head = tail_lines(head, n as usize);
    }
    if let Some(limit) = limit {
        head = &head[..head.len().min(limit as usize)];
    }
    let text_plain = [(header::CONTENT_TYPE, "text/plain")];
    if !call.q.flag("follow") || previous {
        return Ok((StatusCode::OK, text_plain, head.to_vec()).into_response());
    }
    // Follow: what is there, then what the run writes, until it is no longer the running one.
    let store = call.store.clone();
    let def = res.def.clone();
    let (ns, name) = (ns.clone(), name.clone());
    let first = head.to_vec();
    let mut offset = text.len() as u64;
    let stream = body_stream(move |tx| async move {
        if tx.send(Ok(Bytes::from(first))).await.is_err() {
            return;
        }
        let mut changes = store.subscribe();
        loop {
            let running = store.get(&def, &ns, &name).ok().is_some_and(|pod| {
                ["initContainerStatuses", "containerStatuses"]
                    .iter()
                    .flat_map(|k| pod["status"][*k].as_array().cloned().unwrap_or_default())
                    .any(|s| {
                        s["name"] == container.as_str()
                            && s["restartCount"].as_u64().unwrap_or(0) as u32 == instance
                            && s["state"]["running"].is_object()
                    })
            });
            let more = read_from(&file, &mut offset);
            if !more.is_empty() && tx.send(Ok(Bytes::from(more))).await.is_err() {
                return;
            }
            if !running {
                let rest = read_from(&file, &mut offset);
                if !rest.is_empty() {
                    let _ = tx.send(Ok(Bytes::from(rest))).await;
                }
                return;
            }
            // The log grows between changes of the cluster too: look again soon.
            let _ = tokio::time::timeout(Duration::from_millis(200), changes.changed()).await;
        }
    });
    Ok((StatusCode::OK, text_plain, Body::from_stream(stream)).into_response())
}

/// The last `n` lines of `text`.
fn tail_lines(text: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &[];
    }
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return &text[i + 1..];
            }
        }
    }
    text
}

/// What `file` holds past `offset`, moving it on.
fn read_from(file: &std::path::Path, offset: &mut u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut out = Vec::new();
    if let Ok(mut f) = std::fs::File::open(file)
        && f.seek(SeekFrom::Start(*offset)).is_ok()
    {
        let _ = f.read_to_end(&mut out);
    }
    *offset += out.len() as u64;
    out
}

/// A body stream fed by `produce` through a channel.
fn body_stream<F, Fut>(
    produce: F,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(produce(tx));
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

/// A TokenRequest (`serviceaccounts/token`, as `kubectl create token` and the kubelet ask it):
/// a signed token of the ServiceAccount for the audiences asked, bound to a pod if asked.
async fn token_request(call: &Call, at: &Named, req: Request) -> ApiResult<Response> {
    if call.method != Method::POST {
        return Err(call.not_supported(&at.res.def, "token"));
    }
    let Named { res, ns, name } = at;
    let mut request = read_object(req).await?;
    let account = res.get(ns, name)?;
    let spec = &request["spec"];
    let invalid = |field: &str, value: &str, message: &str| {
        ApiError::invalid(
            "TokenRequest.authentication.k8s.io",
            name,
            vec![(field.into(), format!("Invalid value: {value}: {message}"))],
        )
    };
    let seconds = match &spec["expirationSeconds"] {
        Value::Null => super::auth::DEFAULT_TOKEN_SECONDS,
        v => v.as_i64().ok_or_else(|| {
            invalid(
                "spec.expirationSeconds",
                &v.to_string(),
                "must be an integer",
            )
        })?,
    };
    if seconds < super::auth::MIN_TOKEN_SECONDS {
        return Err(invalid(
            "spec.expirationSeconds",
            &seconds.to_string(),
            "may not specify a duration less than 10 minutes",
        ));
    }
    if seconds > 1 << 32 {
        return Err(invalid(
            "spec.expirationSeconds",
            &seconds.to_string(),
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    let mut audiences: Vec<String> = spec["audiences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    if audiences.is_empty() {
        audiences.push(super::auth::AUDIENCE.into());
    }
    let bound = &spec["boundObjectRef"];
    let pod = match bound["kind"].as_str() {
        None => None,
        Some("Pod") => {
            let pod_name = bound["name"].as_str().unwrap_or("");
            let def = call
                .store
                .registry()
                .get("", "v1", "pods")
                .cloned()
                .ok_or_else(ApiError::path_not_found)?;
            let pod = call.store.get(&def, ns, pod_name)?;
            let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
            if let Some(asked) = bound["uid"].as_str().filter(|u| !u.is_empty())
                && asked != uid
            {
                return Err(ApiError {
                    message: format!(
                        "Operation cannot be fulfilled on Pod {pod_name:?}: the UID in the bound object reference ({asked}) does not match the UID in record. The object might have been deleted and then recreated"
                    ),
                    ..ApiError::conflict("", "pods", pod_name)
                });
            }
            let runs_as = pod["spec"]["serviceAccountName"]
                .as_str()
                .filter(|s| !s.is_empty())
                .unwrap_or(super::store::DEFAULT_SERVICE_ACCOUNT);
            if runs_as != name {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for serviceaccount {name:?} to pod running with different serviceaccount name."
                )));
            }
            Some((pod_name.to_string(), uid))
        }
        Some(kind) => {
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {kind}"
            )));
        }
    };
    let (token, expires) = call.auth.mint(&super::auth::TokenFor {
        namespace: ns.clone(),
        service_account: (
            name.clone(),
            account["metadata"]["uid"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        ),
        pod,
        audiences: audiences.clone(),
        seconds,
    });
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["kind"] = json!("TokenRequest");
    request["metadata"]["name"] = json!(name);
    request["metadata"]["namespace"] = json!(ns);
    request["spec"]["audiences"] = json!(audiences);
    request["spec"]["expirationSeconds"] = json!(seconds);
    request["status"] = json!({
        "token": token,
        "expirationTimestamp": jiff::Timestamp::from_second(expires)
            .map(|t| t.to_string())
            .unwrap_or_default(),
    });
    Ok(json_response(StatusCode::CREATED, &request))
}

/// The admission webhooks of a create or update (`how` says which, and whether of the status
/// subresource): the mutating ones' patches applied to `obj` (which is admitted again when they
/// changed it), then the validating ones asked. Returns their warnings.
async fn webhooks(
    call: &Call,
    def: &ResourceDef,
    ns: &str,
    name: &str,
    old: Option<&Value>,
    obj: &mut Value,
    how: Write,
) -> ApiResult<Vec<String>> {
    let store = &call.store;
    if !super::admission::any(store, def) {
        return Ok(Vec::new());
    }
    let (operation, subresource) = match how {
        Write::Create => ("CREATE", ""),
        Write::Update => ("UPDATE", ""),
        Write::Status => ("UPDATE", "status"),
    };
    let attempt = super::admission::Attempt {
        operation,
        def,
        subresource,
        namespace: ns,
        name,
        old,
        user: &call.user,
        dry_run: call.dry_run,
    };
    let before = obj.clone();
    let mut warnings = super::admission::mutate(store, &attempt, obj).await?;
    if *obj != before {
        warnings.extend(admit(def, obj, &call.validation, how, Some(name))?);
    }
    warnings.extend(super::admission::validate(store, &attempt, Some(obj)).await?);
    Ok(warnings)
}

/// A create's admission in kube-apiserver's order: decoding and defaults, the mutating
/// webhooks, validation, the validating webhooks. (A mutating webhook may thus fill what
/// validation requires, as CDI's claim rendering does.)
async fn admit_create(
    call: &Call,
    def: &ResourceDef,
    ns: &str,
    obj: &mut Value,
    url_name: Option<&str>,
) -> ApiResult<Vec<String>> {
    let store = &call.store;
    if !super::admission::any(store, def) {
        return admit(def, obj, &call.validation, Write::Create, url_name);
    }
    prepare(def, obj, Write::Create)?;
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
    let attempt = super::admission::Attempt {
        operation: "CREATE",
        def,
        subresource: "",
        namespace: ns,
        name: &name,
        old: None,
        user: &call.user,
        dry_run: call.dry_run,
    };
    let mut warnings = super::admission::mutate(store, &attempt, obj).await?;
    warnings.extend(admit(def, obj, &call.validation, Write::Create, url_name)?);
    warnings.extend(super::admission::validate(store, &attempt, Some(obj)).await?);
    Ok(warnings)
}

/// What a write is, for admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    Create,
    Update,
    /// Through the status subresource: only status is taken, so only the schema applies.
    Status,
}

/// `Kind`, or `Kind.group`, as Kubernetes names a kind in messages.
fn qualified_kind(def: &ResourceDef) -> String {
    if def.group.is_empty() {
        def.kind.clone()
    } else {
        format!("{}.{}", def.kind, def.group)
    }
}

/// Decode and default an object as kube-apiserver does before admission: a Secret's
/// `stringData` is folded in, defaults are set, a created object's `generateName` becomes its
/// name.
fn prepare(def: &ResourceDef, obj: &mut Value, write: Write) -> ApiResult<()> {
    super::decode::decode(def, obj)?;
    if def.group.is_empty() && def.plural == "secrets" {
        fold_string_data(obj);
        // SetDefaults_Secret.
        if obj["type"].as_str().is_none_or(str::is_empty) {
            obj["type"] = json!("Opaque");
        }
    }
    if write != Write::Status {
        match (def.group.as_str(), def.plural.as_str()) {
            ("storage.k8s.io", "storageclasses") => {
                super::validation::default_storage_class(obj);
            }
            ("", "persistentvolumes") => super::validation::default_persistent_volume(obj),
            // SetDefaults_PersistentVolumeClaimSpec.
            ("", "persistentvolumeclaims") => {
                if let Some(spec) = obj["spec"].as_object_mut()
                    && spec.get("volumeMode").is_none_or(Value::is_null)
                {
                    spec.insert("volumeMode".into(), json!("Filesystem"));
                }
            }
            _ => {}
        }
    }
    if write == Write::Create {
        generate_name(obj);
    }
    Ok(())
}

/// Admit an object before it is stored: [`prepare`], then [`check`].
fn admit(
    def: &ResourceDef,
    obj: &mut Value,
    field_validation: &str,
    write: Write,
    url_name: Option<&str>,
) -> ApiResult<Vec<String>> {
    prepare(def, obj, write)?;
    check(def, obj, field_validation, write, url_name)
}

/// Validate an object as kube-apiserver's strategies do (names, metadata, the kind's rules, a
/// custom resource's schema), every failure in one 422. Unknown fields of custom resources are
/// pruned, refused under `fieldValidation=Strict`, and reported as warnings otherwise.
fn check(
    def: &ResourceDef,
    obj: &mut Value,
    field_validation: &str,
    write: Write,
    url_name: Option<&str>,
) -> ApiResult<Vec<String>> {
    let mut causes: Vec<(String, String)> = if write == Write::Status {
        Vec::new()
    } else {
        super::validation::validate(def, obj, write == Write::Create)
            .iter()
            .map(super::validation::FieldError::cause)
            .collect()
    };
    let mut unknown = Vec::new();
    if let Some(schema) = &def.schema {
        let result = super::schema::admit(schema, obj);
        causes.extend(result.invalid);
        unknown = result.unknown;
    }
    if !causes.is_empty() {
        let name = obj["metadata"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .or(url_name)
            .unwrap_or("")
            .to_string();
        return Err(ApiError::invalid(&qualified_kind(def), &name, causes));
    }
    let unknown: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    if field_validation == "Strict" && !unknown.is_empty() {
        return Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            unknown.join(", ")
        )));
    }
    if field_validation == "Ignore" {
        return Ok(Vec::new());
    }
    Ok(unknown)
}

/// Add the in-use protection finalizer of a created claim or volume (once).
fn protect(def: &ResourceDef, obj: &mut Value) {
    let finalizer = match (def.group.as_str(), def.plural.as_str()) {
        ("", "persistentvolumeclaims") => PVC_PROTECTION,
        ("", "persistentvolumes") => PV_PROTECTION,
        _ => return,
    };
    let Some(meta) = obj["metadata"].as_object_mut() else {
        return;
    };
    let list = meta.entry("finalizers").or_insert_with(|| json!([]));
    if !list.is_array() {
        *list = json!([]);
    }
    if let Some(list) = list.as_array_mut()
        && !list.iter().any(|f| f == finalizer)
    {
        list.push(json!(finalizer));
    }
}

/// A name from `generateName` as kube makes one: the prefix (cut to 58 bytes, so that the name
/// stays a valid label) and five random characters of its alphabet.
fn generate_name(obj: &mut Value) {
    if obj["metadata"]["name"]
        .as_str()
        .is_some_and(|n| !n.is_empty())
    {
        return;
    }
    let Some(prefix) = obj["metadata"]["generateName"]
        .as_str()
        .filter(|p| !p.is_empty())
        .map(str::to_string)
    else {
        return;
    };
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut cut = prefix.len().min(58);
    while !prefix.is_char_boundary(cut) {
        cut -= 1;
    }
    let seed = super::store::new_uid().replace('-', "");
    let suffix: String = seed
        .as_bytes()
        .chunks(2)
        .take(5)
        .map(|pair| {
            let n = u8::from_str_radix(std::str::from_utf8(pair).unwrap_or("0"), 16).unwrap_or(0);
            ALPHABET[n as usize % ALPHABET.len()] as char
        })
        .collect();
    obj["metadata"]["name"] = json!(format!("{}{suffix}", &prefix[..cut]));
}

fn is_claims(def: &ResourceDef) -> bool {
    def.group.is_empty() && def.plural == "persistentvolumeclaims"
}

/// The classes with `allowVolumeExpansion`, read before a claim is changed (not while the store
/// is held for the change).
fn expandable_classes(store: &Store, def: &ResourceDef) -> BTreeSet<String> {
    if !is_claims(def) {
        return BTreeSet::new();
    }
    let Some(classes) = store
        .registry()
        .get("storage.k8s.io", "v1", "storageclasses")
        .cloned()
    else {
        return BTreeSet::new();
    };
    let (items, _, _) = store.list(&classes, None, &ListOptions::default());
    items
        .iter()
        .filter(|c| c["allowVolumeExpansion"] == true)
        .filter_map(|c| c["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// Rules kube-apiserver applies to changes of existing objects, all failures in one 422
/// (ValidateStorageClassUpdate, ValidatePersistentVolumeClaimUpdate). Then, for claims, the
/// PersistentVolumeClaimResize admission plugin: a bound claim's request may grow only when its
/// class has `allowVolumeExpansion`.
fn validate_update(
    def: &ResourceDef,
    expandable: &BTreeSet<String>,
    current: &Value,
    next: &Value,
) -> ApiResult<()> {
    use super::validation::{
        FieldError, claim_update, persistent_volume_update, storage_class_update,
    };
    let errors = match (def.group.as_str(), def.plural.as_str()) {
        ("storage.k8s.io", "storageclasses") => storage_class_update(current, next),
        ("", "persistentvolumes") => persistent_volume_update(current, next),
        ("", "persistentvolumeclaims") => claim_update(current, next),
        _ => return Ok(()),
    };
    let name = current["metadata"]["name"].as_str().unwrap_or("");
    if !errors.is_empty() {
        return Err(ApiError::invalid(
            &qualified_kind(def),
            name,
            errors.iter().map(FieldError::cause).collect(),
        ));
    }
    if !is_claims(def) || current["status"]["phase"] != "Bound" {
        return Ok(());
    }
    let size = |v: &Value| {
        v.as_str()
            .and_then(|s| s.parse::<k8s_rules::Quantity>().ok())
            .map(|q| q.milli_value())
    };
    let path = |o: &Value| o["spec"]["resources"]["requests"]["storage"].clone();
    let (Some(old), Some(new)) = (size(&path(current)), size(&path(next))) else {
        return Ok(());
    };
    let class = current["spec"]["storageClassName"].as_str().unwrap_or("");
    if new > old && !expandable.contains(class) {
        return Err(ApiError::forbidden(format!(
            "persistentvolumeclaims \"{name}\" is forbidden: only dynamically provisioned pvc \
             can be resized and the storageclass that provisions the pvc must support resize"
        )));
    }
    Ok(())
}

/// A Secret's write-only `stringData` is merged into `data` (base64) on every write, its keys
/// winning, as kube-apiserver does; it is never stored.
fn fold_string_data(secret: &mut Value) {
    use base64::Engine;
    let Some(map) = secret.as_object_mut() else {
        return;
    };
    let Some(Value::Object(strings)) = map.remove("stringData") else {
        return;
    };
    let data = map.entry("data").or_insert_with(|| json!({}));
    if data.is_null() {
        *data = json!({});
    }
    if let Some(data) = data.as_object_mut() {
        for (k, v) in strings {
            let text = v.as_str().unwrap_or_default();
            data.insert(
                k,
                base64::engine::general_purpose::STANDARD
                    .encode(text)
                    .into(),
            );
        }
    }
}

fn with_warnings(mut response: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let text = format!("299 - {}", serde_json::to_string(w).unwrap_or_default());
        if let Ok(v) = axum::http::HeaderValue::from_str(&text) {
            response.headers_mut().append(header::WARNING, v);
        }
    }
    response
}

fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-cdi-dev",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24",
        "compiler": "rustc",
        "platform": "linux/amd64",
    })
}

/// The API groups: the served ones, then those of aggregated APIs.
fn groups(store: &Store) -> Value {
    let mut all: Vec<(String, Vec<String>)> = store.registry().groups().into_iter().collect();
    for (group, versions) in super::aggregation::groups(store) {
        if !all.iter().any(|(g, _)| *g == group) {
            all.push((group, versions));
        }
    }
    let groups: Vec<Value> = all
        .into_iter()
        .map(|(name, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
                .collect();
            json!({"name": name, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn create(
    res: &Resource,
    ns: &str,
    obj: Value,
    dry_run: bool,
    owner: Option<&Owner>,
) -> ApiResult<Value> {
    let (store, def) = (&*res.store, &res.def);
    let is_crd = def.group == "apiextensions.k8s.io" && def.plural == "customresourcedefinitions";
    let custom = if is_crd {
        Some(crd_resource(&obj)?)
    } else {
        None
    };
    let mut obj = obj;
    if def.group.is_empty() && def.plural == "persistentvolumeclaims" {
        default_storage_class(store, &mut obj);
    }
    if def.group.is_empty() && def.plural == "pods" {
        admit_service_account(store, ns, &mut obj)?;
    }
    if def.group.is_empty() {
        super::quota::admit(store, &def.plural, ns, &obj)?;
    }
    if def.group.is_empty() && def.plural == "services" && !dry_run {
        allocate_cluster_ip(store, &mut obj)?;
    }
    let created = res.create(ns, obj, dry_run, owner)?;
    if let (Some(custom), false) = (custom, dry_run) {
        store.register(custom);
        return mark_established(store, def, &created);
    }
    if !dry_run && def.group.is_empty() && def.plural == "namespaces" {
        let ns = created["metadata"]["name"].as_str().unwrap_or("");
        ensure_default_service_account(store, ns);
        ensure_root_ca(store, ns);
    }
    if !dry_run && is_cluster_role(def) {
        aggregate_cluster_roles(store);
        // The role as aggregated, when it aggregates.
        let name = created["metadata"]["name"].as_str().unwrap_or("");
        return Ok(res.get(ns, name).unwrap_or_else(|_| created.clone()));
    }
    Ok(created)
}

/// Make namespace `ns`'s `default` ServiceAccount, as kube's serviceaccount controller does for
/// a new namespace and again when it is deleted (not in a namespace being deleted: the store
/// refuses that).
fn ensure_default_service_account(store: &Store, ns: &str) {
    use super::store::DEFAULT_SERVICE_ACCOUNT;
    let Some(def) = store.registry().get("", "v1", "serviceaccounts").cloned() else {
        return;
    };
    if store.get(&def, ns, DEFAULT_SERVICE_ACCOUNT).is_ok() {
        return;
    }
    let account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": DEFAULT_SERVICE_ACCOUNT}});
    let _ = store.create(&def, ns, account, false, None);
}

/// Publish the cluster's CA as `kube-root-ca.crt` in namespace `ns`, as kube-controller-manager's
/// root CA publisher does (again when it is deleted).
fn ensure_root_ca(store: &Store, ns: &str) {
    use super::store::ROOT_CA_CONFIG_MAP;
    let (Some(def), Some(pem)) = (
        store.registry().get("", "v1", "configmaps").cloned(),
        store.root_ca(),
    ) else {
        return;
    };
    if store.get(&def, ns, ROOT_CA_CONFIG_MAP).is_ok() {
        return;
    }
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": ROOT_CA_CONFIG_MAP, "annotations": {"kubernetes.io/description":
            "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
        "data": {"ca.crt": pem}});
    let _ = store.create(&def, ns, config_map, false, None);
}

/// Where a pod's ServiceAccount credentials are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The lifetime the ServiceAccount admission plugin asks for a pod's token (kube's 3607 s).
const POD_TOKEN_SECONDS: i64 = 3607;

/// kube's ServiceAccount admission plugin on a new pod: it runs as `default` unless it names
/// another ServiceAccount, which must exist; unless the pod or its ServiceAccount opts out
/// (`automountServiceAccountToken: false`), a projected volume with a token bound to the pod,
/// the cluster CA and the namespace is mounted at [`SERVICE_ACCOUNT_DIR`] in every container.
fn admit_service_account(store: &Store, ns: &str, pod: &mut Value) -> ApiResult<()> {
    if !pod["spec"].is_object() {
        return Ok(());
    }
    let account = pod["spec"]["serviceAccountName"]
        .as_str()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            pod["spec"]["serviceAccount"]
                .as_str()
                .filter(|s| !s.is_empty())
        })
        .unwrap_or(super::store::DEFAULT_SERVICE_ACCOUNT)
        .to_string();
    pod["spec"]["serviceAccountName"] = json!(account);
    pod["spec"]["serviceAccount"] = json!(account);
    let def = store
        .registry()
        .get("", "v1", "serviceaccounts")
        .cloned()
        .ok_or_else(ApiError::path_not_found)?;
    let found = store.get(&def, ns, &account).map_err(|_| {
        let name = pod["metadata"]["name"].as_str().unwrap_or("");
        ApiError::forbidden(format!(
            "pods {name:?} is forbidden: error looking up service account {ns}/{account}: serviceaccount {account:?} not found"
        ))
    })?;
    let automount = pod["spec"]["automountServiceAccountToken"]
        .as_bool()
        .or_else(|| found["automountServiceAccountToken"].as_bool())
        .unwrap_or(true);
    if !automount {
        return Ok(());
    }
    let mounted = |c: &Value| {
        c["volumeMounts"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["mountPath"] == SERVICE_ACCOUNT_DIR))
    };
    let volume = format!("kube-api-access-{}", &super::auth::random_hex(3)[..5]);
    let mut needed = false;
    for list in ["initContainers", "containers"] {
        for c in pod["spec"][list].as_array_mut().into_iter().flatten() {
            if !c.is_object() || mounted(c) {
                continue;
            }
            needed = true;
            let mount = json!({"name": volume, "readOnly": true, "mountPath": SERVICE_ACCOUNT_DIR});
            match c["volumeMounts"].as_array_mut() {
                Some(mounts) => mounts.push(mount),
                None => c["volumeMounts"] = json!([mount]),
            }
        }
    }
    if needed {
        let projected = json!({"name": volume, "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": POD_TOKEN_SECONDS, "path": "token"}},
            {"configMap": {"name": super::store::ROOT_CA_CONFIG_MAP,
                "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}});
        match pod["spec"]["volumes"].as_array_mut() {
            Some(volumes) => volumes.push(projected),
            None => pod["spec"]["volumes"] = json!([projected]),
        }
    }
    Ok(())
}

/// Where Services' cluster IPs come from (kube's `--service-cluster-ip-range`; all of
/// 127.0.0.0/8 is local here, so a forwarder can listen on each).
pub const SERVICE_RANGE: (u32, u32) = (0x7f60_0000, 12);

/// kube's Service REST on create: the defaults (type ClusterIP, TCP, `targetPort` = `port`,
/// session affinity None) and a cluster IP from [`SERVICE_RANGE`], picked at random among the
/// free ones, as kube's allocator does; one asked for must be free.
fn allocate_cluster_ip(store: &Store, svc: &mut Value) -> ApiResult<()> {
    if !svc["spec"].is_object() {
        return Ok(());
    }
    let spec = &mut svc["spec"];
    if spec["type"].as_str().is_none_or(str::is_empty) {
        spec["type"] = json!("ClusterIP");
    }
    if spec["sessionAffinity"].is_null() {
        spec["sessionAffinity"] = json!("None");
    }
    for port in spec["ports"].as_array_mut().into_iter().flatten() {
        if port["protocol"].is_null() {
            port["protocol"] = json!("TCP");
        }
        if port["targetPort"].is_null() {
            port["targetPort"] = port["port"].clone();
        }
    }
    if spec["type"] == "ExternalName" {
        return Ok(());
    }
    let asked = spec["clusterIP"].as_str().unwrap_or("").to_string();
    if asked == "None" {
        spec["clusterIPs"] = json!(["None"]);
        return Ok(());
    }
    let def = store
        .registry()
        .get("", "v1", "services")
        .cloned()
        .ok_or_else(ApiError::path_not_found)?;
    let (services, _, _) = store.list(&def, None, &ListOptions::default());
    let used: BTreeSet<String> = services
        .iter()
        .filter_map(|s| s["spec"]["clusterIP"].as_str().map(str::to_string))
        .collect();
    let name = svc["metadata"]["name"].as_str().unwrap_or("").to_string();
    let ip = if asked.is_empty() {
        let (base, bits) = SERVICE_RANGE;
        let size = 1u32 << (32 - bits);
        let start = u32::from_str_radix(&super::auth::random_hex(4), 16).unwrap_or(0) % size;
        (0..size)
            .map(|i| std::net::Ipv4Addr::from(base + (start + i) % size))
            // Neither the network's address nor its broadcast, as kube leaves them.
            .filter(|ip| !matches!(u32::from(*ip) - base, 0) && u32::from(*ip) - base != size - 1)
            .map(|ip| ip.to_string())
            .find(|ip| !used.contains(ip))
            .ok_or_else(|| ApiError::internal("no cluster IP is free"))?
    } else {
        if asked.parse::<std::net::Ipv4Addr>().is_err() {
            return Err(ApiError::invalid(
                "Service",
                &name,
                vec![(
                    "spec.clusterIPs[0]".into(),
                    format!(
                        "Invalid value: {asked:?}: must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
                    ),
                )],
            ));
        }
        if used.contains(&asked) {
            return Err(ApiError::invalid(
                "Service",
                &name,
                vec![(
                    "spec.clusterIPs".into(),
                    format!(
                        "Invalid value: []string{{{asked:?}}}: failed to allocate IP {asked}: provided IP is already allocated"
                    ),
                )],
            ));
        }
        asked
    };
    svc["spec"]["clusterIP"] = json!(ip);
    svc["spec"]["clusterIPs"] = json!([ip]);
    svc["spec"]["ipFamilies"] = json!(["IPv4"]);
    svc["spec"]["ipFamilyPolicy"] = json!("SingleStack");
    Ok(())
}

/// The names the API server is known by inside the cluster, in its serving certificate.
const KUBERNETES_NAMES: [&str; 4] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// The `kubernetes` Service in `default` and its Endpoints, pointing at where the server listens,
/// as kube-apiserver keeps them: what pods' `KUBERNETES_SERVICE_HOST`/`_PORT` come from.
fn publish_kubernetes_service(store: &Store, at: SocketAddr) {
    let registry = store.registry();
    let (Some(services), Some(endpoints)) = (
        registry.get("", "v1", "services").cloned(),
        registry.get("", "v1", "endpoints").cloned(),
    ) else {
        return;
    };
    let (ip, port) = (at.ip().to_string(), at.port());
    let service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
            "ports": [{"name": "https", "port": port, "protocol": "TCP", "targetPort": port}],
            "sessionAffinity": "None"}});
    let addresses = json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
        "subsets": [{"addresses": [{"ip": ip}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}]});
    for (def, obj) in [(services, service), (endpoints, addresses)] {
        let _ = store.delete(&def, "default", "kubernetes", &DeleteOptions::default());
        let _ = store.create(&def, "default", obj, false, None);
    }
}

fn is_cluster_role(def: &ResourceDef) -> bool {
    def.group == "rbac.authorization.k8s.io" && def.plural == "clusterroles"
}

/// The DefaultStorageClass admission plugin: a claim created without `storageClassName` (absent,
/// not `""`) gets the default class; with several defaults, the newest, as Kubernetes picks.
fn default_storage_class(store: &Store, claim: &mut Value) {
    if !claim["spec"]["storageClassName"].is_null() {
        return;
    }
    let Some(classes) = store
        .registry()
        .get("storage.k8s.io", "v1", "storageclasses")
        .cloned()
    else {
        return;
    };
    let (items, _, _) = store.list(&classes, None, &ListOptions::default());
    let default = items
        .iter()
        .filter(|c| {
            let a = &c["metadata"]["annotations"];
            a["storageclass.kubernetes.io/is-default-class"] == "true"
                || a["storageclass.beta.kubernetes.io/is-default-class"] == "true"
        })
        .max_by_key(|c| {
            (
                c["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                c["metadata"]["name"].as_str().unwrap_or("").to_string(),
            )
        });
    if let (Some(class), Some(spec)) = (default, claim["spec"].as_object_mut()) {
        spec.insert("storageClassName".into(), class["metadata"]["name"].clone());
    }
}

fn after_write(store: &Store, def: &ResourceDef, obj: &Value) {
    if def.group == "apiextensions.k8s.io"
        && def.plural == "customresourcedefinitions"
        && let Ok(custom) = crd_resource(obj)
    {
        store.register(custom);
    }
    if is_cluster_role(def) {
        aggregate_cluster_roles(store);
    }
}

fn rbac_def(store: &Store, plural: &str) -> Option<ResourceDef> {
    store
        .registry()
        .get("rbac.authorization.k8s.io", "v1", plural)
        .cloned()
}

/// The RBAC objects the store holds (those that decode; the API refuses the others).
fn rbac_policy(store: &Store) -> super::rbac::Policy {
    fn all<T: serde::de::DeserializeOwned>(store: &Store, plural: &str) -> Vec<T> {
        let Some(def) = rbac_def(store, plural) else {
            return Vec::new();
        };
        store
            .list(&def, None, &ListOptions::default())
            .0
            .into_iter()
            .filter_map(|o| serde_json::from_value(o).ok())
            .collect()
    }
    super::rbac::Policy {
        roles: all(store, "roles"),
        cluster_roles: all(store, "clusterroles"),
        role_bindings: all(store, "rolebindings"),
        cluster_role_bindings: all(store, "clusterrolebindings"),
    }
}

/// kube's clusterrole aggregation controller, run on every ClusterRole write: an aggregated
/// role's rules become those of the roles its selectors pick, repeated while one aggregated role
/// feeds another (`edit` into `admin`).
fn aggregate_cluster_roles(store: &Store) {
    let Some(def) = rbac_def(store, "clusterroles") else {
        return;
    };
    for _ in 0..8 {
        let changed = rbac_policy(store).aggregated();
        if changed.is_empty() {
            return;
        }
        for (name, rules) in changed {
            let rules = serde_json::to_value(&rules).unwrap_or_default();
            let write = WriteOptions::default();
            let _ = store.modify(&def, "", &name, &write, |current| {
                let mut next = current.clone();
                next["rules"] = rules.clone();
                Ok(next)
            });
        }
    }
}

/// The status of a review: access reviews answered by the RBAC authorizer, a TokenReview by the
/// authenticator, a SelfSubjectReview with the caller.
fn answer_review(call: &Call, def: &ResourceDef, ns: &str, review: &Value) -> ApiResult<Value> {
    match def.kind.as_str() {
        "SelfSubjectAccessReview" => {
            access_review(&call.store, def, ns, review, Some(&call.user), None)
        }
        "SelfSubjectRulesReview" => Ok(rules_review(&call.store, &call.user, review)),
        "TokenReview" => Ok(token_review(call, review)),
        "SelfSubjectReview" => Ok(json!({"userInfo": super::auth::user_json(&call.user)})),
        _ => access_review(&call.store, def, ns, review, None, call.audit.as_ref()),
    }
}

/// What the caller may do in `spec.namespace` (cluster-wide rules included), as
/// `kubectl auth can-i --list` shows it.
fn rules_review(store: &Store, user: &UserInfo, review: &Value) -> Value {
    let ns = review["spec"]["namespace"].as_str().unwrap_or("");
    let (mut resource_rules, mut path_rules) = (Vec::new(), Vec::new());
    for (_, rule) in rbac_policy(store).rules_for(user, ns) {
        let mut out = json!({"verbs": rule.verbs});
        if let Some(urls) = rule.non_resource_urls.filter(|u| !u.is_empty()) {
            out["nonResourceURLs"] = json!(urls);
            if !path_rules.contains(&out) {
                path_rules.push(out);
            }
            continue;
        }
        out["apiGroups"] = json!(rule.api_groups.unwrap_or_default());
        out["resources"] = json!(rule.resources.unwrap_or_default());
        if let Some(names) = rule.resource_names.filter(|n| !n.is_empty()) {
            out["resourceNames"] = json!(names);
        }
        if !resource_rules.contains(&out) {
            resource_rules.push(out);
        }
    }
    json!({"resourceRules": resource_rules, "nonResourceRules": path_rules, "incomplete": false})
}

/// Whether `spec.token` authenticates, for `spec.audiences` (this server's own by default).
fn token_review(call: &Call, review: &Value) -> Value {
    let token = review["spec"]["token"].as_str().unwrap_or("");
    let asked: Vec<String> = review["spec"]["audiences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    let audiences = if asked.is_empty() {
        vec![super::auth::AUDIENCE.to_string()]
    } else {
        asked
    };
    for audience in &audiences {
        if let Some(user) = call.auth.verify(token, audience, &Live(&call.store)) {
            return json!({"authenticated": true, "user": super::auth::user_json(&user), "audiences": [audience]});
        }
    }
    json!({"authenticated": false, "user": {}, "error": "invalid bearer token"})
}

/// A SubjectAccessReview (or LocalSubjectAccessReview) answered by the RBAC authorizer: whether
/// the user or groups in its spec may do what it asks.
fn access_review(
    store: &Store,
    def: &ResourceDef,
    ns: &str,
    review: &Value,
    caller: Option<&UserInfo>,
    audit: Option<&AuditLog>,
) -> ApiResult<Value> {
    use super::validation::FieldError;
    let spec = &review["spec"];
    let resource = spec.get("resourceAttributes").filter(|v| v.is_object());
    let path = spec.get("nonResourceAttributes").filter(|v| v.is_object());
    let text = |v: &Value, k: &str| v[k].as_str().unwrap_or("").to_string();
    // A SelfSubjectAccessReview asks about its caller.
    let user = caller.cloned().unwrap_or_else(|| UserInfo {
        name: text(spec, "user"),
        uid: text(spec, "uid"),
        groups: spec["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_str().map(String::from))
            .collect(),
    });
    let mut errs = Vec::new();
    if resource.is_some() && path.is_some() {
        errs.push(
            FieldError::invalid(
                "spec.nonResourceAttributes",
                "",
                "cannot be specified in combination with resourceAttributes",
            )
            .cause(),
        );
    }
    if resource.is_none() && path.is_none() {
        // Go prints the nil attributes it names as "null".
        errs.push(
            FieldError::invalid(
                "spec.resourceAttributes",
                "null",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )
            .cause(),
        );
    }
    if caller.is_none() && user.name.is_empty() && user.groups.is_empty() {
        errs.push(
            FieldError::invalid(
                "spec.user",
                "",
                "at least one of user or group must be specified",
            )
            .cause(),
        );
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid(
            &format!("{}.{}", def.kind, def.group),
            "",
            errs,
        ));
    }
    let attributes = match (resource, path) {
        (Some(r), _) => Attributes {
            verb: text(r, "verb"),
            resource_request: true,
            // A LocalSubjectAccessReview asks about its own namespace.
            namespace: if def.namespaced {
                ns.to_string()
            } else {
                text(r, "namespace")
            },
            api_group: text(r, "group"),
            resource: text(r, "resource"),
            subresource: text(r, "subresource"),
            name: text(r, "name"),
            path: String::new(),
        },
        (None, Some(p)) => Attributes {
            verb: text(p, "verb"),
            path: text(p, "path"),
            ..Default::default()
        },
        (None, None) => unreachable!("refused above"),
    };
    let decided = rbac_policy(store).authorize(&user, &attributes);
    if let Some(audit) = audit.filter(|_| caller.is_none()) {
        // A decision made for another (a server delegating authorization) is logged as the
        // reviewed user's, marked so: what that user's roles must allow.
        let mut line = super::auth::audit_event(
            &user,
            &attributes,
            &axum::http::Uri::from_static("/apis/authorization.k8s.io/v1/subjectaccessreviews"),
            decided.is_some(),
        );
        line["annotations"]["cdi-rs.dev/subject-access-review"] = json!("true");
        write_audit(audit, &line);
    }
    Ok(match decided {
        Some(reason) => json!({"allowed": true, "reason": reason}),
        None => json!({"allowed": false}),
    })
}

/// The served resource a CRD defines (its storage version).
fn crd_resource(crd: &Value) -> ApiResult<ResourceDef> {
    let name = crd["metadata"]["name"].as_str().unwrap_or("").to_string();
    let invalid = |field: &str, msg: &str| {
        ApiError::invalid(
            "CustomResourceDefinition",
            &name,
            vec![(field.into(), msg.into())],
        )
    };
    let spec = &crd["spec"];
    let group = spec["group"]
        .as_str()
        .filter(|g| !g.is_empty())
        .ok_or_else(|| invalid("spec.group", "Required value"))?;
    let names = &spec["names"];
    let plural = names["plural"]
        .as_str()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| invalid("spec.names.plural", "Required value"))?;
    let kind = names["kind"]
        .as_str()
        .filter(|k| !k.is_empty())
        .ok_or_else(|| invalid("spec.names.kind", "Required value"))?;
    if name != format!("{plural}.{group}") {
        return Err(invalid(
            "metadata.name",
            &format!("must be spec.names.plural+\".\"+spec.group: {plural}.{group}"),
        ));
    }
    let versions = spec["versions"]
        .as_array()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| invalid("spec.versions", "Required value"))?;
    let storage = versions
        .iter()
        .find(|v| v["storage"] == json!(true))
        .ok_or_else(|| {
            invalid(
                "spec.versions",
                "exactly one version must be marked as storage version",
            )
        })?;
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let served_versions = versions
        .iter()
        .filter(|v| v["served"] == json!(true) && v["storage"] != json!(true))
        .filter_map(|v| v["name"].as_str().map(str::to_string))
        .collect();
    let mut subresources = Vec::new();
    if storage["subresources"]["status"].is_object() {
        subresources.push("status".to_string());
    }
    Ok(ResourceDef {
        group: group.to_string(),
        version: storage["name"].as_str().unwrap_or("v1").to_string(),
        kind: kind.to_string(),
        plural: plural.to_string(),
        singular: names["singular"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| kind.to_lowercase()),
        namespaced: spec["scope"] != json!("Cluster"),
        short_names: strings(&names["shortNames"]),
        categories: strings(&names["categories"]),
        subresources,
        create_only: false,
        schema: Some(storage["schema"]["openAPIV3Schema"].clone()),
        printer_columns: storage["additionalPrinterColumns"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
        selectable_fields: storage["selectableFields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["jsonPath"].as_str())
            .map(|p| p.trim_start_matches('.').to_string())
            .collect(),
        served_versions,
        storage_version: None,
    })
}

fn mark_established(store: &Store, def: &ResourceDef, crd: &Value) -> ApiResult<Value> {
    let name = crd["metadata"]["name"].as_str().unwrap_or("").to_string();
    let mut next = crd.clone();
    let now = super::store::now();
    next["status"] = json!({
        "acceptedNames": crd["spec"]["names"],
        "storedVersions": crd["spec"]["versions"].as_array().map(|vs| vs.iter().filter(|v| v["storage"] == json!(true)).map(|v| v["name"].clone()).collect::<Vec<_>>()).unwrap_or_default(),
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
    });
    next["metadata"]["resourceVersion"] = json!("");
    store.update(
        def,
        "",
        &name,
        next,
        &WriteOptions {
            status_only: true,
            ..Default::default()
        },
    )
}

/// A watch: past events (from a version, or synthetic ADDED for the current state), then live
/// ones, as JSON lines; bookmarks when asked; closed after `timeoutSeconds`.
fn watch(call: &Call, res: Resource, ns: Option<String>) -> ApiResult<Response> {
    let (q, as_table) = (&call.q, call.wants_table());
    let (store, def) = (call.store.clone(), res.def.clone());
    let opts = selectors(&def, q)?;
    let rv = q.resource_version()?;
    let send_initial = q.opt_flag("sendInitialEvents");
    // Without sendInitialEvents, a watch from no version (or "0") starts with the current
    // objects (the legacy behaviour); sendInitialEvents says so explicitly either way.
    let initial = send_initial.unwrap_or(rv.is_none());
    let bookmarks = q.flag("allowWatchBookmarks");
    let send_initial_end = send_initial == Some(true);
    let timeout = Duration::from_secs(
        q.int("timeoutSeconds")?
            .filter(|t| *t > 0)
            .map(|t| t as u64)
            .unwrap_or(1800),
    );
    let since = if initial { None } else { rv };

    let (past, mut rx, at) = match store.watch_from(since.or(Some(store.resource_version()))) {
        Ok(w) => w,
        // As kube-apiserver: the watch starts, then says 410 in an ERROR event.
        Err(e) if e.code == 410 => {
            let line = ndjson(&json!({"type": "ERROR", "object": e.status()}));
            return Ok((
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                Body::from(line),
            )
                .into_response());
        }
        Err(e) => return Err(e),
    };
    let mut lines: Vec<Value> = Vec::new();
    let mut last = since.unwrap_or(at);
    if initial {
        let (items, rv_now, _) = res.list(
            ns.as_deref(),
            &ListOptions {
                labels: opts.labels.clone(),
                fields: opts.fields.clone(),
                ..Default::default()
            },
        );
        lines.extend(
            items
                .into_iter()
                .map(|o| json!({"type": "ADDED", "object": o})),
        );
        last = rv_now.max(at);
        if send_initial_end {
            lines.push(json!({"type": "BOOKMARK", "object": {"kind": def.kind, "apiVersion": def.api_version(), "metadata": {"resourceVersion": last.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}}}));
        }
    }
    // Changes are of the stored objects (a view's too), which the selectors name.
    let matches = {
        let def = res.stored_def().clone();
        let ns = ns.clone();
        let opts = opts.clone();
        move |c: &super::store::Change| -> bool {
            c.group == def.group
                && c.plural == def.plural
                && ns
                    .as_ref()
                    .is_none_or(|n| !def.namespaced || *n == c.namespace)
                && opts.labels.matches(
                    &c.object["metadata"]["labels"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| {
                                    (k.clone(), v.as_str().unwrap_or_default().to_string())
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                )
                && opts.fields.matches(&c.object)
        }
    };
    let threshold = last;
    for change in past.iter().filter(|c| c.rv > threshold) {
        if matches(change) {
            let mut line = json!({"type": change.kind.as_str()});
            line["object"] = res.to_served(change.object.clone());
            lines.push(line);
        }
        last = last.max(change.rv);
    }

    // `kubectl get -w` asks for each event's object as a one-row Table.
    let shape = {
        let def = def.clone();
        move |event: Value| -> Value {
            if !as_table || event["type"] == "BOOKMARK" || event["type"] == "ERROR" {
                return event;
            }
            let rv = event["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("")
                .to_string();
            json!({"type": event["type"], "object": super::table::table(&def, &[event["object"].clone()], &rv, false)})
        }
    };
    let lines: Vec<Value> = lines.into_iter().map(&shape).collect();
    let (tx, body_rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(256);
    let kind = def.kind.clone();
    let api_version = def.api_version();
    tokio::spawn(async move {
        for line in lines {
            if tx.send(Ok(ndjson(&line))).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(Duration::from_secs(5));
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = ticker.tick(), if bookmarks => {
                    let b = json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": last.to_string()}}});
                    if tx.send(Ok(ndjson(&b))).await.is_err() { return; }
                }
                changed = rx.changed() => {
                    if changed.is_err() { return; }
                    // Too slow a reader (its next changes already dropped from the history):
                    // end the watch; the client lists again.
                    let Some(changes) = store.changes_after(last) else { return };
                    for c in changes {
                        last = c.rv;
                        if matches(&c) {
                            let kind = match c.kind { ChangeKind::Added => "ADDED", ChangeKind::Modified => "MODIFIED", ChangeKind::Deleted => "DELETED" };
                            let mut event = json!({"type": kind});
                            event["object"] = res.to_served(c.object.clone());
                            if tx.send(Ok(ndjson(&shape(event)))).await.is_err() { return; }
                        }
                    }
                },
                _ = tx.closed() => return,
            }
        }
    });
    let stream = futures::stream::unfold(body_rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response())
}

fn ndjson(v: &Value) -> Bytes {
    let mut line = serde_json::to_vec(v).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}
