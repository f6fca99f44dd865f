//! What a pod of the development cluster gets from it, as a pod of a real one does: its
//! ServiceAccount's credentials at the path in-cluster clients read (client-go's kubectl here),
//! limited by RBAC; and its containers' logs served as `kubectl logs` reads them.

mod common;

use common::wait_for;
use futures::{AsyncBufReadExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{LogParams, PostParams};
use kube::{Api, Client};
use kubesim::cluster::Running;
use serde_json::{Value, json};

async fn start() -> (tempfile::TempDir, Running) {
    common::cluster().await
}

async fn create<K>(client: &Client, value: Value) -> Result<K, kube::Error>
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
}

async fn ended(client: &Client, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    wait_for(&format!("pod {name} to end"), async || {
        let p = pods.get(name).await.unwrap();
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        matches!(phase.as_deref(), Some("Succeeded" | "Failed")).then_some(p)
    })
    .await
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// A pod running the machine's kubectl with `args`, as ServiceAccount `account`.
fn kubectl_pod(name: &str, account: &str, args: &[&str]) -> Value {
    json!({"metadata": {"name": name}, "spec": {"restartPolicy": "Never",
        "serviceAccountName": account,
        "containers": [{"name": "kubectl", "image": "bitnami/kubectl:1.32",
            "command": [which("kubectl")], "args": args}]}})
}

fn which(program: &str) -> String {
    let out = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_cluster_client_in_a_pod_is_its_service_account_and_holds_only_its_role() {
    if !rustix::process::geteuid().is_root() {
        eprintln!(
            "skipped: the kubelet gives a pod its ServiceAccount path in a mount namespace of its \
             own, which needs root"
        );
        return;
    }
    let (_dir, running) = start().await;
    let client = running.client.clone();
    create::<ServiceAccount>(&client, json!({"metadata": {"name": "reader"}}))
        .await
        .unwrap();
    create::<Role>(
        &client,
        json!({"metadata": {"name": "cm-reader"}, "rules": [{"apiGroups": [""],
            "resources": ["configmaps"], "verbs": ["get", "list"]}]}),
    )
    .await
    .unwrap();
    create::<RoleBinding>(
        &client,
        json!({"metadata": {"name": "reader"}, "roleRef": {"apiGroup":
            "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader"}]}),
    )
    .await
    .unwrap();

    create::<Pod>(
        &client,
        kubectl_pod("lists", "reader", &["get", "configmaps", "-o", "name"]),
    )
    .await
    .unwrap();
    create::<Pod>(&client, kubectl_pod("pries", "reader", &["get", "secrets"]))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let lists = ended(&client, "lists").await;
    let log = pods.logs("lists", &LogParams::default()).await.unwrap();
    assert_eq!(phase(&lists), "Succeeded", "{log}");
    // Found from KUBERNETES_SERVICE_HOST/PORT, trusted through the mounted ca.crt, in the
    // namespace of the mounted file.
    assert!(log.contains("configmap/kube-root-ca.crt"), "{log}");
    let pries = ended(&client, "pries").await;
    assert_eq!(phase(&pries), "Failed");
    let log = pods.logs("pries", &LogParams::default()).await.unwrap();
    assert!(
        log.contains(
            r#"secrets is forbidden: User "system:serviceaccount:default:reader" cannot list resource "secrets" in API group "" in the namespace "default""#
        ),
        "{log}"
    );

    // What the admission plugin added: the projected volume, mounted read-only.
    let spec = lists.spec.unwrap();
    let volume = spec.volumes.unwrap().pop().unwrap();
    assert!(volume.name.starts_with("kube-api-access-"), "{volume:?}");
    let sources = volume.projected.unwrap().sources.unwrap();
    assert_eq!(
        sources[0].service_account_token.as_ref().unwrap().path,
        "token"
    );
    let mount = &spec.containers[0].volume_mounts.as_ref().unwrap()[0];
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        ("/var/run/secrets/kubernetes.io/serviceaccount", Some(true))
    );
    // Opting out leaves the pod without credentials; a missing ServiceAccount is refused.
    let mut quiet = kubectl_pod("quiet", "reader", &["version"]);
    quiet["spec"]["automountServiceAccountToken"] = json!(false);
    let quiet = create::<Pod>(&client, quiet).await.unwrap();
    assert!(quiet.spec.unwrap().volumes.is_none());
    match create::<Pod>(&client, kubectl_pod("ghost", "nobody", &["version"])).await {
        Err(kube::Error::Api(e)) => assert_eq!(
            (e.code, e.message.as_str()),
            (
                403,
                r#"pods "ghost" is forbidden: error looking up service account default/nobody: serviceaccount "nobody" not found"#
            )
        ),
        other => panic!("expected 403, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_logs_are_served_current_previous_tail_and_followed() {
    let (dir, running) = start().await;
    let client = running.client.clone();
    // Run 0 fails; run 1 waits for a file in its emptyDir, says so, and succeeds.
    let script = "n=$(cat state/n 2>/dev/null || echo 0); echo \"run $n line 1\"; \
        echo \"run $n line 2\"; echo $((n + 1)) > state/n; [ \"$n\" -ge 1 ] || exit 1; \
        while [ ! -e state/go ]; do sleep 0.05; done; echo after go";
    create::<Pod>(
        &client,
        json!({"metadata": {"name": "talker"}, "spec": {"restartPolicy": "OnFailure",
            "containers": [{"name": "main", "image": "docker.io/library/busybox:1.36",
                "command": ["/bin/sh", "-c", script],
                "volumeMounts": [{"name": "state", "mountPath": "/state"}]}],
            "volumes": [{"name": "state", "emptyDir": {}}]}}),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let logs = |p: LogParams| {
        let pods = pods.clone();
        async move { pods.logs("talker", &p).await }
    };
    let talker = wait_for("run 1 to have written its lines", async || {
        let p = pods.get("talker").await.unwrap();
        let status = p.status.as_ref()?.container_statuses.as_ref()?[0].clone();
        let running = status.state.as_ref()?.running.is_some();
        let written = logs(LogParams::default())
            .await
            .is_ok_and(|l| l.contains("run 1 line 2"));
        (status.restart_count == 1 && running && written).then_some(p)
    })
    .await;
    assert_eq!(
        logs(LogParams::default()).await.unwrap(),
        "run 1 line 1\nrun 1 line 2\n"
    );
    let previous = LogParams {
        previous: true,
        ..Default::default()
    };
    assert_eq!(
        logs(previous).await.unwrap(),
        "run 0 line 1\nrun 0 line 2\n"
    );
    let tail = LogParams {
        tail_lines: Some(1),
        ..Default::default()
    };
    assert_eq!(logs(tail).await.unwrap(), "run 1 line 2\n");
    let wrong = LogParams {
        container: Some("other".into()),
        ..Default::default()
    };
    assert!(matches!(logs(wrong).await, Err(kube::Error::Api(e)) if e.code == 400));

    // Follow: what is there, then what the run writes once told to go, until it ends.
    let follow = LogParams {
        follow: true,
        ..Default::default()
    };
    let mut lines = pods.log_stream("talker", &follow).await.unwrap().lines();
    assert_eq!(lines.try_next().await.unwrap().unwrap(), "run 1 line 1");
    assert_eq!(lines.try_next().await.unwrap().unwrap(), "run 1 line 2");
    let uid = talker.metadata.uid.unwrap();
    let node = talker.spec.unwrap().node_name.unwrap();
    std::fs::write(
        dir.path()
            .join("nodes")
            .join(node)
            .join("pods")
            .join(uid)
            .join("volumes/state/go"),
        "",
    )
    .unwrap();
    assert_eq!(lines.try_next().await.unwrap().unwrap(), "after go");
    assert_eq!(
        lines.try_next().await.unwrap(),
        None,
        "the stream ends with the run"
    );
    assert_eq!(phase(&ended(&client, "talker").await), "Succeeded");
}
