//! Services, as kube-controller-manager's endpoints and endpointslice controllers, kube-proxy
//! and CoreDNS serve them: each Service's Endpoints and EndpointSlice list the pods its selector
//! picks (ready ones as ready, the others not), a forwarder listens on each cluster IP and port
//! and passes every connection to a ready endpoint, and a DNS server answers
//! `<service>.<namespace>.svc[.cluster.local]` with the cluster IP (a headless Service's: the
//! ready pods' addresses). Pure: [`plan`] and [`routes`] decide, [`agent`] writes and serves.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::{name, namespace};
use crate::apiserver::selector::LabelSelector;

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The cluster's DNS domain.
pub const DOMAIN: &str = "cluster.local";

/// A write of the endpoints controllers.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create or replace a Service's Endpoints.
    Endpoints {
        namespace: String,
        name: String,
        subsets: Value,
    },
    /// Create or replace a Service's EndpointSlice.
    Slice {
        namespace: String,
        name: String,
        slice: Value,
    },
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::Endpoints {
                namespace, name, ..
            } => write!(f, "Endpoints {namespace}/{name}"),
            Action::Slice {
                namespace,
                name,
                slice,
            } => {
                let ready = slice["endpoints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|e| e["conditions"]["ready"] == json!(true))
                    .count();
                write!(f, "EndpointSlice {namespace}/{name} ({ready} ready)")
            }
        }
    }
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn selects(selector: &LabelSelector, pod: &Pod) -> bool {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    selector.matches(&labels)
}

/// The port a pod serves a Service port on: a number, or the pod's container port of that name.
fn target_port(port: &k8s_openapi::api::core::v1::ServicePort, pod: &Pod) -> Option<i32> {
    match port.target_port.clone() {
        None => Some(port.port),
        Some(IntOrString::Int(n)) => Some(n),
        Some(IntOrString::String(named)) => pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(named.as_str()))
            .map(|p| p.container_port),
    }
}

/// The pods of a Service that have an address and are not finished or being deleted.
fn members<'a>(svc: &Service, pods: &'a [Pod]) -> Vec<&'a Pod> {
    let Some(selector) = svc.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return Vec::new();
    };
    if selector.is_empty() {
        return Vec::new();
    }
    let selector = LabelSelector::of_labels(selector);
    pods.iter()
        .filter(|p| namespace(*p) == namespace(svc) && selects(&selector, p))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let status = p.status.as_ref();
            let phase = status.and_then(|s| s.phase.as_deref());
            let ip = status.and_then(|s| s.pod_ip.as_deref());
            ip.is_some_and(|ip| !ip.is_empty()) && !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .collect()
}

fn address(p: &Pod) -> Value {
    json!({"ip": p.status.as_ref().and_then(|s| s.pod_ip.clone()),
        "nodeName": p.spec.as_ref().and_then(|s| s.node_name.clone()),
        "targetRef": {"kind": "Pod", "namespace": namespace(p), "name": name(p),
            "uid": p.metadata.uid.clone().unwrap_or_default()}})
}

/// A Service port as a pod serves it: (name, the pod's port, protocol).
type PortOf = (String, i32, String);

/// What a Service's Endpoints and EndpointSlice should hold.
fn wanted(svc: &Service, pods: &[Pod]) -> (Value, Value) {
    let ports = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();
    let members = members(svc, pods);
    // Pods serving the same ports form one subset, as kube groups them.
    let mut subsets: BTreeMap<Vec<PortOf>, (Vec<Value>, Vec<Value>)> = BTreeMap::new();
    let mut endpoints = Vec::new();
    let mut slice_ports: Vec<Value> = Vec::new();
    for p in &members {
        let resolved: Vec<PortOf> = ports
            .iter()
            .filter_map(|port| {
                Some((
                    port.name.clone().unwrap_or_default(),
                    target_port(port, p)?,
                    port.protocol.clone().unwrap_or_else(|| "TCP".into()),
                ))
            })
            .collect();
        if resolved.is_empty() {
            continue;
        }
        let entry = subsets.entry(resolved.clone()).or_default();
        if ready(p) {
            entry.0.push(address(p));
        } else {
            entry.1.push(address(p));
        }
        for (name, port, protocol) in &resolved {
            let port = json!({"name": name, "port": port, "protocol": protocol});
            if !slice_ports.contains(&port) {
                slice_ports.push(port);
            }
        }
        endpoints.push(json!({
            "addresses": [p.status.as_ref().and_then(|s| s.pod_ip.clone())],
            "conditions": {"ready": ready(p), "serving": ready(p), "terminating": false},
            "nodeName": p.spec.as_ref().and_then(|s| s.node_name.clone()),
            "targetRef": {"kind": "Pod", "namespace": namespace(*p), "name": name(*p),
                "uid": p.metadata.uid.clone().unwrap_or_default()},
        }));
    }
    let subsets: Vec<Value> = subsets
        .into_iter()
        .map(|(ports, (ready, not_ready))| {
            let mut s = json!({"ports": ports.iter().map(|(n, p, proto)|
                json!({"name": n, "port": p, "protocol": proto})).collect::<Vec<_>>()});
            if !ready.is_empty() {
                s["addresses"] = json!(ready);
            }
            if !not_ready.is_empty() {
                s["notReadyAddresses"] = json!(not_ready);
            }
            s
        })
        .collect();
    let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "addressType": "IPv4", "endpoints": endpoints, "ports": slice_ports});
    (json!(subsets), slice)
}

/// The EndpointSlice of a Service (one each here).
pub fn slice_name(service: &str) -> String {
    super::fit(&format!("{service}-cdi-dev"), 253)
}

/// What the endpoints controllers write: the Endpoints and EndpointSlice of each Service with a
/// selector, where they differ from what is stored.
pub fn plan(
    services: &[Service],
    pods: &[Pod],
    endpoints: &[Value],
    slices: &[Value],
) -> Vec<Action> {
    let mut out = Vec::new();
    let find = |list: &[Value], ns: &str, n: &str| {
        list.iter()
            .find(|o| o["metadata"]["namespace"] == ns && o["metadata"]["name"] == n)
            .cloned()
    };
    for svc in services {
        let has_selector = svc
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .is_some_and(|s| !s.is_empty());
        if !has_selector || svc.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (ns, n) = (namespace(svc).to_string(), name(svc).to_string());
        let (subsets, slice) = wanted(svc, pods);
        let stored = find(endpoints, &ns, &n);
        let empty = subsets.as_array().is_some_and(Vec::is_empty);
        let same = match &stored {
            Some(e) => e["subsets"] == subsets || (empty && e["subsets"].is_null()),
            None => false,
        };
        if !same {
            out.push(Action::Endpoints {
                namespace: ns.clone(),
                name: n.clone(),
                subsets,
            });
        }
        let slice_n = slice_name(&n);
        let stored = find(slices, &ns, &slice_n);
        let same = stored.as_ref().is_some_and(|s| {
            let norm = |v: &Value| if v.is_null() { json!([]) } else { v.clone() };
            norm(&s["endpoints"]) == norm(&slice["endpoints"])
                && norm(&s["ports"]) == norm(&slice["ports"])
        });
        if !same {
            let mut slice = slice;
            slice["metadata"] = json!({"name": slice_n, "namespace": ns,
                "labels": {SERVICE_NAME: n,
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": n,
                    "uid": svc.metadata.uid.clone().unwrap_or_default(),
                    "controller": true, "blockOwnerDeletion": true}]});
            out.push(Action::Slice {
                namespace: ns,
                name: slice_n,
                slice,
            });
        }
    }
    out
}

/// Where connections to each cluster IP and port go: the ready endpoints of its Service's
/// slices, at the port of the same name (kube-proxy's view).
pub fn routes(services: &[Service], slices: &[Value]) -> HashMap<SocketAddrV4Key, Vec<SocketAddr>> {
    let mut out = HashMap::new();
    for svc in services {
        // The API server's own Service points at where it listens already.
        if namespace(svc) == "default" && name(svc) == "kubernetes" {
            continue;
        }
        let Some(spec) = &svc.spec else { continue };
        let Some(ip) = spec
            .cluster_ip
            .as_deref()
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
        else {
            continue;
        };
        let mine: Vec<&Value> = slices
            .iter()
            .filter(|s| {
                s["metadata"]["namespace"] == namespace(svc)
                    && s["metadata"]["labels"][SERVICE_NAME] == name(svc)
            })
            .collect();
        for port in spec.ports.iter().flatten() {
            if port.protocol.as_deref().unwrap_or("TCP") != "TCP" {
                continue;
            }
            let port_name = port.name.clone().unwrap_or_default();
            let mut backends = Vec::new();
            for slice in &mine {
                let Some(target) = slice["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| p["name"].as_str().unwrap_or("") == port_name)
                    .and_then(|p| p["port"].as_u64())
                else {
                    continue;
                };
                for e in slice["endpoints"].as_array().into_iter().flatten() {
                    if e["conditions"]["ready"] != json!(true) {
                        continue;
                    }
                    for a in e["addresses"].as_array().into_iter().flatten() {
                        if let Some(ip) = a.as_str().and_then(|a| a.parse::<Ipv4Addr>().ok()) {
                            backends.push(SocketAddr::from((ip, target as u16)));
                        }
                    }
                }
            }
            out.insert((ip, port.port as u16), backends);
        }
    }
    out
}

/// An APIService's `Available` condition, as kube's availability controller sets it: a local one
/// always is; one served elsewhere is while its discovery answers through the proxy.
pub fn availability(api_service: &Value, discovery: Option<Result<(), String>>) -> Value {
    let (ok, reason, message) = match discovery {
        None => (
            true,
            "Local",
            "Local APIServices are always available".to_string(),
        ),
        Some(Ok(())) => (true, "Passed", "all checks passed".to_string()),
        Some(Err(why)) => (false, "FailedDiscoveryCheck", why),
    };
    let status = if ok { "True" } else { "False" };
    let since = api_service["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Available" && c["status"] == status && c["reason"] == reason)
        .and_then(|c| c["lastTransitionTime"].as_str().map(str::to_string))
        .unwrap_or_else(crate::apiserver::store::now);
    json!({"type": "Available", "status": status, "reason": reason, "message": message,
        "lastTransitionTime": since})
}

/// A cluster IP and port.
pub type SocketAddrV4Key = (Ipv4Addr, u16);

/// The addresses DNS answers for each name (lower case, no trailing dot): a Service's cluster
/// IP, or a headless Service's ready pods.
pub fn records(services: &[Service], slices: &[Value]) -> HashMap<String, Vec<Ipv4Addr>> {
    let mut out = HashMap::new();
    for svc in services {
        let Some(spec) = &svc.spec else { continue };
        let ips: Vec<Ipv4Addr> = match spec.cluster_ip.as_deref() {
            Some("None") => slices
                .iter()
                .filter(|s| {
                    s["metadata"]["namespace"] == namespace(svc)
                        && s["metadata"]["labels"][SERVICE_NAME] == name(svc)
                })
                .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
                .filter(|e| e["conditions"]["ready"] == json!(true))
                .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
                .filter_map(|a| a.as_str().and_then(|a| a.parse().ok()))
                .collect(),
            Some(ip) => ip.parse().ok().into_iter().collect(),
            None => Vec::new(),
        };
        let fqdn = format!("{}.{}.svc.{DOMAIN}", name(svc), namespace(svc)).to_lowercase();
        out.insert(fqdn, ips);
    }
    out
}

/// A DNS answer: the response to `query` (bytes) from `records`. Names in the cluster domain are
/// answered (an unknown one NXDOMAIN); others REFUSED, so that a resolver goes on to the
/// host's servers listed after this one.
pub fn answer(query: &[u8], records: &HashMap<String, Vec<Ipv4Addr>>) -> Option<Vec<u8>> {
    use hickory_proto::op::{Message, MessageType, ResponseCode};
    use hickory_proto::rr::{RData, Record, RecordType, rdata::A};
    let request = Message::from_vec(query).ok()?;
    if request.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.recursion_available = false;
    let Some(q) = request.queries.first() else {
        response.metadata.response_code = ResponseCode::FormErr;
        return response.to_vec().ok();
    };
    response.add_query(q.clone());
    let asked = q.name().to_ascii().to_lowercase();
    let asked = asked.trim_end_matches('.');
    if asked != DOMAIN && !asked.ends_with(&format!(".{DOMAIN}")) {
        response.metadata.response_code = ResponseCode::Refused;
        return response.to_vec().ok();
    }
    response.metadata.authoritative = true;
    match records.get(asked) {
        None => response.metadata.response_code = ResponseCode::NXDomain,
        Some(ips) => {
            if q.query_type() == RecordType::A {
                for ip in ips {
                    response.add_answer(Record::from_rdata(q.name().clone(), 5, RData::A(A(*ip))));
                }
            }
        }
    }
    response.to_vec().ok()
}

pub mod agent {
    use std::collections::HashMap;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::sync::{Arc, Mutex, RwLock};
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{Endpoints, Service};
    use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
    use kube::{Api, Client};
    use serde_json::json;

    use super::{Action, SocketAddrV4Key, plan, records, routes};
    use crate::agents::{Reader, list_all};

    /// The DNS records, shared with the DNS server.
    pub type Records = Arc<RwLock<HashMap<String, Vec<Ipv4Addr>>>>;

    fn slices_api(client: &Client) -> Api<DynamicObject> {
        let gvk = kube::api::GroupVersionKind::gvk("discovery.k8s.io", "v1", "EndpointSlice");
        let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "endpointslices");
        Api::all_with(client.clone(), &resource)
    }

    fn slices_in(client: &Client, ns: &str) -> Api<DynamicObject> {
        let gvk = kube::api::GroupVersionKind::gvk("discovery.k8s.io", "v1", "EndpointSlice");
        let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "endpointslices");
        Api::namespaced_with(client.clone(), ns, &resource)
    }

    /// One listener per cluster IP and port, each with the endpoints it forwards to.
    #[derive(Default)]
    pub struct Proxy {
        listeners: HashMap<SocketAddrV4Key, Listener>,
    }

    struct Listener {
        backends: Arc<Mutex<Vec<SocketAddr>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Listener {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl Proxy {
        /// Listen where the routes say, forward where they point; stop listening elsewhere.
        pub async fn sync(&mut self, routes: HashMap<SocketAddrV4Key, Vec<SocketAddr>>) {
            self.listeners.retain(|key, _| routes.contains_key(key));
            for (key, backends) in routes {
                if let Some(l) = self.listeners.get(&key) {
                    *l.backends.lock().unwrap_or_else(|e| e.into_inner()) = backends;
                    continue;
                }
                let listener = match tokio::net::TcpListener::bind(SocketAddr::from(key)).await {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!(address = %SocketAddr::from(key), error = %e, "cannot listen for a Service");
                        continue;
                    }
                };
                let shared = Arc::new(Mutex::new(backends));
                let task = tokio::spawn(forward(listener, shared.clone()));
                self.listeners.insert(
                    key,
                    Listener {
                        backends: shared,
                        task,
                    },
                );
            }
        }
    }

    /// Each connection to a ready endpoint, taken in turn; none ready: the connection is closed.
    async fn forward(listener: tokio::net::TcpListener, backends: Arc<Mutex<Vec<SocketAddr>>>) {
        let mut turn = 0usize;
        while let Ok((mut inbound, _)) = listener.accept().await {
            let choices = backends.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if choices.is_empty() {
                continue;
            }
            let to = choices[turn % choices.len()];
            turn = turn.wrapping_add(1);
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    }

    async fn list_slices(client: &Client) -> Result<Vec<Value>, kube::Error> {
        Ok(slices_api(client)
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter_map(|s| serde_json::to_value(s).ok())
            .collect())
    }

    async fn pass(
        reader: &Reader,
        client: &Client,
        proxy: &tokio::sync::Mutex<Proxy>,
        dns: &Records,
    ) -> Result<(), kube::Error> {
        let cluster = reader.read().await?;
        let services: Vec<Service> = list_all(client).await?;
        let endpoints: Vec<Value> = list_all::<Endpoints>(client)
            .await?
            .into_iter()
            .filter_map(|e| serde_json::to_value(e).ok())
            .collect();
        let mut slices = list_slices(client).await?;
        let actions = plan(&services, &cluster.pods, &endpoints, &slices);
        for action in &actions {
            let what = action.to_string();
            match write(client, action).await {
                Ok(()) => tracing::info!("wrote {what}"),
                Err(e) => tracing::warn!(error = %e, "writing {what} failed"),
            }
        }
        // What was just written is what the proxy and DNS follow (read back: a write may have
        // failed).
        if !actions.is_empty() {
            slices = list_slices(client).await?;
        }
        proxy.lock().await.sync(routes(&services, &slices)).await;
        *dns.write().unwrap_or_else(|e| e.into_inner()) = records(&services, &slices);
        check_api_services(client).await
    }

    /// Each APIService's `Available` condition: its discovery asked through this cluster's
    /// proxy to it.
    async fn check_api_services(client: &Client) -> Result<(), kube::Error> {
        let gvk = kube::api::GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService");
        let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "apiservices");
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        for s in api.list(&Default::default()).await?.items {
            let s = serde_json::to_value(&s).map_err(kube::Error::SerdeError)?;
            let spec = &s["spec"];
            let discovery = if spec["service"].is_object() {
                let path = format!(
                    "/apis/{}/{}",
                    spec["group"].as_str().unwrap_or(""),
                    spec["version"].as_str().unwrap_or("")
                );
                let request = axum::http::Request::get(&path)
                    .body(Vec::new())
                    .map_err(kube::Error::HttpError)?;
                Some(
                    client
                        .request_text(request)
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("failing or missing response from {path}: {e}")),
                )
            } else {
                None
            };
            let condition = super::availability(&s, discovery);
            let current = s["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Available"))
                .cloned();
            if current.as_ref() == Some(&condition) {
                continue;
            }
            let name = s["metadata"]["name"].as_str().unwrap_or("");
            api.patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"conditions": [condition]}})),
            )
            .await?;
            tracing::info!("APIService {name}: Available {}", condition["status"]);
        }
        Ok(())
    }

    use serde_json::Value;

    async fn write(client: &Client, action: &Action) -> Result<(), kube::Error> {
        match action {
            Action::Endpoints {
                namespace,
                name,
                subsets,
            } => {
                let api: Api<Endpoints> = Api::namespaced(client.clone(), namespace);
                let object = json!({"apiVersion": "v1", "kind": "Endpoints",
                    "metadata": {"name": name}, "subsets": subsets});
                match api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&object))
                    .await
                {
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        let object: Endpoints =
                            serde_json::from_value(object).map_err(kube::Error::SerdeError)?;
                        api.create(&PostParams::default(), &object).await?;
                    }
                    other => {
                        other?;
                    }
                }
            }
            Action::Slice {
                namespace,
                name,
                slice,
            } => {
                let api = slices_in(client, namespace);
                match api
                    .patch(name, &PatchParams::default(), &Patch::Merge(slice))
                    .await
                {
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        let object: DynamicObject = serde_json::from_value(slice.clone())
                            .map_err(kube::Error::SerdeError)?;
                        api.create(&PostParams::default(), &object).await?;
                    }
                    other => {
                        other?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Serve DNS on `socket` from `records` until dropped.
    pub async fn serve_dns(socket: tokio::net::UdpSocket, dns: Records) {
        let mut buf = vec![0u8; 1500];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            let answer = {
                let records = dns.read().unwrap_or_else(|e| e.into_inner());
                super::answer(&buf[..n], &records)
            };
            if let Some(answer) = answer {
                let _ = socket.send_to(&answer, from).await;
            }
        }
    }

    pub async fn run(
        client: Client,
        changes: crate::agents::Changes,
        every: Duration,
        dns: Records,
    ) {
        let reader = Reader::Shared(client.clone(), changes.clone());
        let proxy = tokio::sync::Mutex::new(Proxy::default());
        run_on_change!(
            changes.subscribe(),
            every,
            pass(&reader, &client, &proxy, &dns)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, cluster_ip: &str, target: Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": "s1"},
            "spec": {"selector": {"app": "web"}, "clusterIP": cluster_ip,
                "ports": [{"name": "http", "port": 80, "targetPort": target, "protocol": "TCP"}]}}))
        .unwrap()
    }

    fn pod(name: &str, ip: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c",
                "ports": [{"name": "web", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready",
                "status": if ready { "True" } else { "False" }}]}}))
        .unwrap()
    }

    #[test]
    fn endpoints_list_ready_and_unready_pods_at_their_named_ports() {
        let service = svc("web", "127.96.0.10", json!("web"));
        let pods = [pod("a", "127.1.0.2", true), pod("b", "127.2.0.2", false)];
        let actions = plan(std::slice::from_ref(&service), &pods, &[], &[]);
        let Action::Endpoints { subsets, .. } = &actions[0] else {
            panic!("{actions:?}")
        };
        assert_eq!(subsets[0]["addresses"][0]["ip"], "127.1.0.2");
        assert_eq!(subsets[0]["notReadyAddresses"][0]["ip"], "127.2.0.2");
        assert_eq!(subsets[0]["ports"][0]["port"], 8080);
        let Action::Slice { slice, name, .. } = &actions[1] else {
            panic!("{actions:?}")
        };
        assert_eq!(slice["metadata"]["labels"][SERVICE_NAME], "web");
        // The proxy forwards to the ready one only; DNS names the cluster IP.
        let mut stored = slice.clone();
        stored["metadata"]["name"] = json!(name);
        let routes = routes(
            std::slice::from_ref(&service),
            std::slice::from_ref(&stored),
        );
        assert_eq!(
            routes[&("127.96.0.10".parse().unwrap(), 80)],
            ["127.1.0.2:8080".parse::<SocketAddr>().unwrap()]
        );
        let records = records(std::slice::from_ref(&service), &[stored.clone()]);
        assert_eq!(
            records["web.ns.svc.cluster.local"],
            ["127.96.0.10".parse::<Ipv4Addr>().unwrap()]
        );
        // Stored as wanted: nothing to write.
        let mut endpoints = json!({"metadata": {"name": "web", "namespace": "ns"}});
        endpoints["subsets"] = subsets.clone();
        assert_eq!(plan(&[service], &pods, &[endpoints], &[stored]), []);
    }

    #[test]
    fn dns_answers_cluster_names_and_refuses_others() {
        use hickory_proto::op::{Message, Query, ResponseCode};
        use hickory_proto::rr::{Name, RecordType};
        let records = HashMap::from([(
            "web.ns.svc.cluster.local".to_string(),
            vec!["127.96.0.10".parse().unwrap()],
        )]);
        let ask = |name: &str| {
            let mut m = Message::query();
            m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
            Message::from_vec(&answer(&m.to_vec().unwrap(), &records).unwrap()).unwrap()
        };
        let found = ask("WEB.ns.svc.cluster.local.");
        assert_eq!(found.metadata.response_code, ResponseCode::NoError);
        assert_eq!(found.answers.len(), 1);
        assert_eq!(
            ask("other.ns.svc.cluster.local.").metadata.response_code,
            ResponseCode::NXDomain
        );
        assert_eq!(
            ask("example.com.").metadata.response_code,
            ResponseCode::Refused
        );
        assert_eq!(answer(b"\x00\x01garbage", &records), None);
    }
}
