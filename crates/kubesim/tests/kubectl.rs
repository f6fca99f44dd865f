//! kubectl (the machine's, 1.27–1.33) against the listening server, through a written kubeconfig.

use std::path::Path;
use std::process::Command;

use kubesim::apiserver::ApiServer;

struct Kubectl {
    kubeconfig: std::path::PathBuf,
}

impl Kubectl {
    async fn run(&self, args: &[&str], stdin: Option<&Path>) -> (bool, String, String) {
        let mut cmd = Command::new("kubectl");
        cmd.args(args).env("KUBECONFIG", &self.kubeconfig);
        if let Some(file) = stdin {
            cmd.stdin(std::fs::File::open(file).unwrap());
        }
        let out = tokio::task::spawn_blocking(move || cmd.output().expect("kubectl is installed"))
            .await
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into(),
            String::from_utf8_lossy(&out.stderr).into(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args, None).await;
        assert!(ok, "kubectl {args:?}: {err}");
        out
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_applies_gets_watches_patches_and_deletes() {
    let server = ApiServer::new();
    let (addr, _task) = server.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig(&format!("https://{addr}"))).unwrap();
    let k = Kubectl { kubeconfig };

    let crds = dir.path().join("crds.yaml");
    let all: String = cdi_api::crd::rendered()
        .into_iter()
        .map(|(_, y)| format!("---\n{y}"))
        .collect();
    std::fs::write(&crds, all).unwrap();
    let (ok, out, err) = k.run(&["apply", "-f", "-"], Some(&crds)).await;
    assert!(ok, "{err}");
    assert_eq!(out.matches("created").count(), 10, "{out}");

    let dv = dir.path().join("dv.yaml");
    std::fs::write(
        &dv,
        "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata:\n  name: disk\nspec:\n  source:\n    blank: {}\n  storage:\n    resources:\n      requests:\n        storage: 1Gi\n",
    )
    .unwrap();
    let out = k.ok(&["apply", "-f", dv.to_str().unwrap()]).await;
    assert!(
        out.contains("datavolume.cdi.kubevirt.io/disk created"),
        "{out}"
    );
    std::fs::write(
        &dv,
        std::fs::read_to_string(&dv).unwrap().replace("1Gi", "2Gi"),
    )
    .unwrap();
    let out = k.ok(&["apply", "-f", dv.to_str().unwrap()]).await;
    assert!(out.contains("configured"), "{out}");

    // The fields every object has are explained too, as upstream's CRDs list them.
    let out = k.ok(&["explain", "dv"]).await;
    for field in ["apiVersion", "kind", "metadata", "spec", "status"] {
        assert!(out.contains(&format!("{field}\t")), "{field}: {out}");
    }

    let out = k.ok(&["get", "dv"]).await;
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "PHASE", "PROGRESS", "RESTARTS", "AGE"],
        "printer columns: {out}"
    );
    assert!(out.lines().nth(1).unwrap().starts_with("disk"), "{out}");

    let out = k
        .ok(&[
            "get",
            "datavolume",
            "disk",
            "-o",
            "jsonpath={.spec.storage.resources.requests.storage} {.metadata.generation}",
        ])
        .await;
    assert_eq!(out, "2Gi 2");

    k.ok(&["label", "dv", "disk", "tier=gold"]).await;
    assert!(
        k.ok(&["get", "dv", "-l", "tier=gold", "-o", "name"])
            .await
            .contains("datavolume.cdi.kubevirt.io/disk")
    );
    k.ok(&[
        "patch",
        "dv",
        "disk",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"annotations":{"a":"b"}}}"#,
    ])
    .await;
    let described = k.ok(&["describe", "dv", "disk"]).await;
    assert!(
        described.contains("tier=gold") && described.contains("a: b"),
        "{described}"
    );

    let resources = k.ok(&["api-resources"]).await;
    assert!(
        resources.lines().any(|l| l.starts_with("datavolumes")
            && l.contains("dv,dvs")
            && l.contains("DataVolume")),
        "{resources}"
    );

    // `get -w` sees a change made while it watches.
    let watcher = {
        let k = Kubectl {
            kubeconfig: k.kubeconfig.clone(),
        };
        tokio::spawn(async move {
            k.run(&["get", "dv", "-w", "--request-timeout=4s"], None)
                .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    k.ok(&["label", "dv", "disk", "watched=yes"]).await;
    let (_, watched, _) = watcher.await.unwrap();
    assert!(
        watched.lines().filter(|l| l.starts_with("disk")).count() >= 2,
        "the watch printed the change: {watched}"
    );

    // Built-in kinds: a second apply is a strategic merge patch (env merged by name).
    let pod = dir.path().join("pod.yaml");
    let pod_yaml = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: c\n    image: busybox\n    env:\n    - name: A\n      value: \"1\"\n";
    std::fs::write(&pod, pod_yaml).unwrap();
    k.ok(&["apply", "-f", pod.to_str().unwrap()]).await;
    std::fs::write(&pod, pod_yaml.replace("\"1\"", "\"2\"")).unwrap();
    assert!(
        k.ok(&["apply", "-f", pod.to_str().unwrap()])
            .await
            .contains("pod/p configured")
    );
    assert_eq!(
        k.ok(&[
            "get",
            "pod",
            "p",
            "-o",
            "jsonpath={.spec.containers[0].env[0].value}"
        ])
        .await,
        "2"
    );

    // kubectl validates strictly: the server refuses unknown fields and invalid values.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata:\n  name: bad\nspec:\n  bogus: 1\n  source:\n    blank: {}\n  storage: {}\n").unwrap();
    let (ok, _, err) = k.run(&["apply", "-f", bad.to_str().unwrap()], None).await;
    assert!(!ok && err.contains("unknown field \"spec.bogus\""), "{err}");
    std::fs::write(&bad, "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata:\n  name: bad\nspec:\n  contentType: tarball\n  storage: {}\n").unwrap();
    let (ok, _, err) = k.run(&["apply", "-f", bad.to_str().unwrap()], None).await;
    assert!(
        !ok && err.contains("spec.contentType: Unsupported value: \"tarball\""),
        "{err}"
    );

    let out = k.ok(&["delete", "dv", "disk"]).await;
    assert!(out.contains("deleted"), "{out}");
    let (_, out, err) = k.run(&["get", "dv"], None).await;
    assert!(
        out.is_empty() && err.contains("No resources found"),
        "{out}{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_over_tls_trusts_the_written_ca() {
    let server = ApiServer::new();
    let (addr, _task) = server.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig(&format!("https://{addr}"))).unwrap();
    let k = Kubectl { kubeconfig };
    let out = k.ok(&["get", "namespaces", "-o", "name"]).await;
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "namespace/default",
            "namespace/kube-public",
            "namespace/kube-system"
        ]
    );
}

/// kubectl's generators send protobuf: `create namespace|configmap|secret|serviceaccount` are
/// read; a kind this server cannot read as protobuf gets kube's 415 (client-go does not fall back
/// to JSON on it) rather than a 400 about the body's bytes.
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_create_generators_send_protobuf() {
    let server = ApiServer::new();
    let (addr, _task) = server.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig(&format!("https://{addr}"))).unwrap();
    let k = Kubectl { kubeconfig };
    let out = k.ok(&["create", "namespace", "x"]).await;
    assert!(out.contains("namespace/x created"), "{out}");
    let out = k
        .ok(&[
            "create",
            "configmap",
            "c",
            "--from-literal=a=b",
            "--from-literal=e=",
        ])
        .await;
    assert!(out.contains("configmap/c created"), "{out}");
    let out = k
        .ok(&["get", "configmap", "c", "-o", "jsonpath={.data}"])
        .await;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        serde_json::json!({"a": "b", "e": ""})
    );
    let out = k
        .ok(&[
            "create",
            "secret",
            "generic",
            "s",
            "-n",
            "x",
            "--from-literal=p=secret",
        ])
        .await;
    assert!(out.contains("secret/s created"), "{out}");
    let out = k
        .ok(&[
            "get",
            "secret",
            "s",
            "-n",
            "x",
            "-o",
            "jsonpath={.type} {.data.p}",
        ])
        .await;
    assert_eq!(out, "Opaque c2VjcmV0");
    let out = k.ok(&["create", "serviceaccount", "sa"]).await;
    assert!(out.contains("serviceaccount/sa created"), "{out}");

    let (ok, _, err) = k
        .run(&["create", "deployment", "d", "--image=i"], None)
        .await;
    assert!(!ok);
    assert!(
        err.contains("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml"),
        "{err}"
    );
}

/// `kubectl get events` prints events written through events.k8s.io/v1 (as kube-rs's Recorder
/// writes them, with no core timestamps) like any other: LAST SEEN from the event's own times.
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_gets_events_of_either_api() {
    let server = ApiServer::new();
    let (addr, _task) = server.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig(&format!("https://{addr}"))).unwrap();
    let k = Kubectl { kubeconfig };
    let event = dir.path().join("event.yaml");
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.000000Z");
    std::fs::write(
        &event,
        format!(
            "apiVersion: events.k8s.io/v1\nkind: Event\nmetadata:\n  name: disk.1\nregarding:\n  kind: ConfigMap\n  name: disk\n  namespace: default\nreason: Slow\nnote: the import is slow\ntype: Warning\naction: Import\nreportingController: cdi-test\nreportingInstance: cdi-test-0\neventTime: \"{now}\"\n"
        ),
    )
    .unwrap();
    k.ok(&["create", "-f", event.to_str().unwrap()]).await;
    for resource in ["events", "events.events.k8s.io"] {
        let out = k.ok(&["get", resource]).await;
        let mut lines = out.lines();
        let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        assert_eq!(
            header,
            [
                "NAME", "LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"
            ],
            "{resource}: {out}"
        );
        let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        assert_eq!(row[0], "disk.1", "{resource}: {out}");
        assert!(row[1].ends_with('s'), "seen seconds ago: {out}");
        assert_eq!(
            row[2..],
            ["Warning", "Slow", "disk", "the", "import", "is", "slow"],
            "{resource}: {out}"
        );
    }
}
