//! Deployments and ReplicaSets on a whole development cluster, driven by the machine's kubectl
//! as a user drives them: `rollout status`, `scale`, a new template rolled out, a deleted pod
//! replaced.

mod common;

use std::process::Command;

use kubesim::cluster::Running;

struct Cluster {
    _dir: tempfile::TempDir,
    running: Running,
}

impl Cluster {
    async fn start() -> Cluster {
        let (dir, running) = common::cluster().await;
        Cluster { _dir: dir, running }
    }

    /// kubectl: (success, stdout, stderr).
    async fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        use std::io::Write;
        let mut cmd = Command::new("kubectl");
        cmd.args(args)
            .env("KUBECONFIG", &self.running.kubeconfig)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let input = stdin.unwrap_or("").to_string();
        let out = tokio::task::spawn_blocking(move || {
            let mut child = cmd.spawn().expect("kubectl is installed");
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
            child.wait_with_output().unwrap()
        })
        .await
        .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into(),
            String::from_utf8_lossy(&out.stderr).into(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.kubectl(args, None).await;
        assert!(ok, "kubectl {args:?}: {err}");
        out
    }

    /// The names of the running, ready pods of the Deployment, and their template hashes.
    async fn ready_pods(&self) -> Vec<(String, String)> {
        let out = self
            .ok(&["get", "pods", "-l", "app=web", "-o", "json"])
            .await;
        let list: serde_json::Value = serde_json::from_str(&out).unwrap();
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter(|p| {
                p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            })
            .map(|p| {
                (
                    p["metadata"]["name"].as_str().unwrap().to_string(),
                    p["metadata"]["labels"]["pod-template-hash"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                )
            })
            .collect()
    }
}

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: docker.io/library/busybox:1.36
        command: [/bin/sh, -c, "exec sleep 3600"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_rolls_out_scales_updates_and_replaces_a_deleted_pod() {
    let c = Cluster::start().await;
    let (ok, _, err) = c.kubectl(&["apply", "-f", "-"], Some(DEPLOYMENT)).await;
    assert!(ok, "{err}");
    let out = c
        .ok(&["rollout", "status", "deployment/web", "--timeout=60s"])
        .await;
    assert!(
        out.contains("deployment \"web\" successfully rolled out"),
        "{out}"
    );
    let first = c.ready_pods().await;
    assert_eq!(first.len(), 2, "{first:?}");
    let table = c.ok(&["get", "deployment", "web"]).await;
    assert!(table.contains("2/2"), "{table}");

    // Scale up through the scale subresource.
    let out = c.ok(&["scale", "deployment/web", "--replicas=3"]).await;
    assert!(out.contains("deployment.apps/web scaled"), "{out}");
    c.ok(&["rollout", "status", "deployment/web", "--timeout=60s"])
        .await;
    let scaled = c.ready_pods().await;
    assert_eq!(scaled.len(), 3, "{scaled:?}");

    // A new template: a new ReplicaSet takes over, the old one keeps none.
    c.ok(&[
        "patch",
        "deployment/web",
        "-p",
        r#"{"spec":{"template":{"metadata":{"annotations":{"version":"2"}}}}}"#,
    ])
    .await;
    c.ok(&["rollout", "status", "deployment/web", "--timeout=60s"])
        .await;
    let rolled = c.ready_pods().await;
    assert_eq!(rolled.len(), 3, "{rolled:?}");
    assert!(
        rolled.iter().all(|(_, hash)| *hash != first[0].1),
        "every pod is of the new template: {rolled:?} vs {first:?}"
    );
    let sets = c
        .ok(&[
            "get",
            "replicasets",
            "-o",
            "jsonpath={range .items[*]}{.spec.replicas} {.metadata.annotations.deployment\\.kubernetes\\.io/revision}{\"\\n\"}{end}",
        ])
        .await;
    let mut sets: Vec<&str> = sets.lines().collect();
    sets.sort();
    assert_eq!(sets, ["0 1", "3 2"]);
    let revision = c
        .ok(&[
            "get",
            "deployment/web",
            "-o",
            "jsonpath={.metadata.annotations.deployment\\.kubernetes\\.io/revision}",
        ])
        .await;
    assert_eq!(revision, "2");

    // A deleted pod is replaced by its ReplicaSet.
    let gone = rolled[0].0.clone();
    c.ok(&["delete", "pod", &gone, "--wait=true"]).await;
    let pods = common::wait_for("a replacement pod to be ready", async || {
        let pods = c.ready_pods().await;
        (pods.len() == 3 && pods.iter().all(|(n, _)| *n != gone)).then_some(pods)
    })
    .await;
    assert_eq!(pods.len(), 3, "{pods:?}");
    assert!(pods.iter().all(|(n, _)| *n != gone), "{pods:?}");
}
