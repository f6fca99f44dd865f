//! Services on a whole development cluster: endpoints follow the pods' readiness, the cluster IP
//! forwards to ready pods, and a pod resolves the Service's name. And on the API server alone:
//! their ports are unique, also after applies.

mod common;

use common::wait_for;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use kube::api::{LogParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kubesim::apiserver::ApiServer;
use kubesim::cluster::Running;
use serde_json::{Value, json};

async fn start() -> (tempfile::TempDir, Running) {
    common::cluster().await
}

async fn create<K>(client: &Client, value: Value) -> K
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), "default");
    api.create(
        &PostParams::default(),
        &serde_json::from_value(value).unwrap(),
    )
    .await
    .unwrap()
}

/// A pod answering `/name` with its name, and `/ready` while the file `www/ready` exists.
fn echo_pod(name: &str) -> Value {
    let script = "mkdir -p www && echo \"$HOSTNAME\" > www/name && touch www/ready && \
        exec python3 -m http.server --bind \"$POD_IP\" --directory www 8080";
    json!({"metadata": {"name": name, "labels": {"app": "echo"}},
        "spec": {"containers": [{"name": "echo", "image": "docker.io/library/python:3.12",
            "command": ["/bin/sh", "-c", script],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"},
                "periodSeconds": 1, "failureThreshold": 1}}]}})
}

/// The names of the ready and the not-ready addresses of the Service's Endpoints.
async fn endpoints(client: &Client) -> (Vec<String>, Vec<String>) {
    let api: Api<Endpoints> = Api::namespaced(client.clone(), "default");
    let Some(e) = api.get_opt("echo").await.unwrap() else {
        return Default::default();
    };
    let names = |list: Option<Vec<k8s_openapi::api::core::v1::EndpointAddress>>| {
        let mut names: Vec<String> = list
            .into_iter()
            .flatten()
            .filter_map(|a| a.target_ref.and_then(|r| r.name))
            .collect();
        names.sort();
        names
    };
    let subsets = e.subsets.unwrap_or_default();
    (
        names(Some(
            subsets
                .iter()
                .flat_map(|s| s.addresses.clone().unwrap_or_default())
                .collect(),
        )),
        names(Some(
            subsets
                .iter()
                .flat_map(|s| s.not_ready_addresses.clone().unwrap_or_default())
                .collect(),
        )),
    )
}

async fn fetch(url: &str) -> Option<String> {
    let answer = reqwest::get(url).await.ok()?;
    answer.status().is_success().then_some(())?;
    Some(answer.text().await.ok()?.trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_forwards_to_its_ready_pods_by_cluster_ip_and_name() {
    let (dir, running) = start().await;
    let client = running.client.clone();
    create::<Pod>(&client, echo_pod("a")).await;
    create::<Pod>(&client, echo_pod("b")).await;
    let svc: Service = create(
        &client,
        json!({"metadata": {"name": "echo"}, "spec": {"selector": {"app": "echo"},
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
    )
    .await;
    let ip = svc.spec.unwrap().cluster_ip.unwrap();
    assert!(ip.starts_with("127."), "{ip}");

    wait_for("both pods to be ready endpoints", async || {
        let (ready, _) = endpoints(&client).await;
        (ready == ["a", "b"]).then_some(())
    })
    .await;
    // Each connection goes to a ready pod, in turn.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        if let Some(name) = fetch(&format!("http://{ip}/name")).await {
            seen.insert(name);
        }
    }
    assert_eq!(seen, ["a".to_string(), "b".to_string()].into());

    // `a` fails its readiness probe: it leaves the ready endpoints and gets no more traffic.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let a = pods.get("a").await.unwrap();
    let ready_file = dir
        .path()
        .join("nodes")
        .join(a.spec.unwrap().node_name.unwrap())
        .join("pods")
        .join(a.metadata.uid.unwrap())
        .join("containers/echo/root/www/ready");
    std::fs::remove_file(&ready_file).unwrap();
    wait_for("a to leave the ready endpoints", async || {
        let (ready, not_ready) = endpoints(&client).await;
        (ready == ["b"] && not_ready == ["a"]).then_some(())
    })
    .await;
    wait_for("the forwarder to follow", async || {
        let mut answers = Vec::new();
        for _ in 0..4 {
            answers.push(fetch(&format!("http://{ip}/name")).await?);
        }
        answers.iter().all(|n| n == "b").then_some(())
    })
    .await;

    // By name from a pod, through the resolver configuration the kubelet gives it.
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped the DNS part: the cluster DNS listens on port 53, which needs root");
        return;
    }
    let script = "getent hosts echo.default.svc.cluster.local && \
        python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://echo/name\").read().decode().strip())'";
    create::<Pod>(
        &client,
        json!({"metadata": {"name": "client"}, "spec": {"restartPolicy": "Never",
            "containers": [{"name": "client", "image": "docker.io/library/python:3.12",
                "command": ["/bin/sh", "-c", script]}]}}),
    )
    .await;
    let done = wait_for("the client pod to end", async || {
        let p = pods.get("client").await.unwrap();
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        matches!(phase.as_deref(), Some("Succeeded" | "Failed")).then_some(phase)
    })
    .await;
    let log = pods.logs("client", &LogParams::default()).await.unwrap();
    assert_eq!(done.as_deref(), Some("Succeeded"), "{log}");
    let words: Vec<&str> = log.split_whitespace().collect();
    assert_eq!(
        words,
        [ip.as_str(), "echo.default.svc.cluster.local", "b"],
        "{log}"
    );
}

/// kube-apiserver's rules for a Service's ports, through the kube client: a number and protocol,
/// and a name, appear once (else a 422), and applying a Service again, as the operator does on
/// each pass, merges its ports by number and protocol (cdi-api once had ten `443/TCP`).
#[tokio::test]
async fn ports_are_unique_and_applies_merge_them() {
    let server = ApiServer::new();
    let services: Api<Service> =
        Api::namespaced(Client::new(server.router(), "default"), "default");
    let service = |ports: Value| {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": ports}})
    };
    let refusal = async |ports: Value| {
        let svc: Service = serde_json::from_value(service(ports)).unwrap();
        match services.create(&PostParams::default(), &svc).await {
            Err(kube::Error::Api(s)) if s.code == 422 && s.reason == "Invalid" => s.message,
            other => panic!("expected a 422, got {other:?}"),
        }
    };
    assert_eq!(
        refusal(json!([{"port": 443, "targetPort": 8443}, {"port": 443, "protocol": "TCP"}])).await,
        "Service \"web\" is invalid: [spec.ports[0].name: Required value, spec.ports[1].name: Required value, spec.ports[1]: Duplicate value: core.ServicePort{Name:\"\", Protocol:\"TCP\", AppProtocol:(*string)(nil), Port:443, TargetPort:intstr.IntOrString{Type:0, IntVal:0, StrVal:\"\"}, NodePort:0}]"
    );
    assert_eq!(
        refusal(json!([{"name": "https", "port": 443}, {"name": "https", "port": 8443}])).await,
        "Service \"web\" is invalid: spec.ports[1].name: Duplicate value: \"https\""
    );

    let apply = PatchParams::apply("test").force();
    let once = service(json!([{"port": 443, "targetPort": 8443, "protocol": "TCP"}]));
    for _ in 0..3 {
        services
            .patch("web", &apply, &Patch::Apply(&once))
            .await
            .unwrap();
    }
    type Port = (Option<String>, i32, Option<String>);
    let ports = |svc: Service| -> Vec<Port> {
        let ports = svc.spec.unwrap().ports.unwrap_or_default();
        ports
            .into_iter()
            .map(|p| (p.name, p.port, p.protocol))
            .collect()
    };
    let port = |name: Option<&str>, protocol: &str| -> Port {
        (name.map(str::to_string), 443, Some(protocol.to_string()))
    };
    assert_eq!(
        ports(services.get("web").await.unwrap()),
        [port(None, "TCP")]
    );
    // The same number over UDP is another port; the TCP one takes the name given it.
    let both = service(json!([
        {"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"},
        {"name": "quic", "port": 443, "targetPort": 8443, "protocol": "UDP"}]));
    let applied = services
        .patch("web", &apply, &Patch::Apply(&both))
        .await
        .unwrap();
    assert_eq!(
        ports(applied),
        [port(Some("https"), "TCP"), port(Some("quic"), "UDP")]
    );
}
