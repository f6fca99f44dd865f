//! `cdi dev up` runs pods: the real importer (image `cdi-importer`) fills a claim on node-2, and
//! two pods of a mapped image serve the same port on addresses of their own, readiness-probed.
//! Driven with the machine's kubectl, as a user would.

mod devcluster;

use devcluster::{Down, cdi, kubectl};

use std::path::Path;

use cdi_testkit::images::{assert_same, convert, oracle, pattern};
use cdi_testkit::{Behaviour, FileServer};

fn get_json(dir: &Path, what: &str) -> serde_json::Value {
    serde_json::from_str(&kubectl(dir, &["get", what, "-o", "json"], None)).unwrap()
}

const MIB: usize = 1 << 20;

fn importer_pod(url: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: disk}}
spec:
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 64Mi}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: importer-disk}}
spec:
  restartPolicy: OnFailure
  nodeSelector: {{node-role.kubernetes.io/virt-local: "true"}}
  tolerations: [{{key: virt-local, operator: Equal, value: "true", effect: NoSchedule}}]
  containers:
  - name: importer
    image: quay.io/kubevirt/cdi-importer:v1.60.1
    env:
    - {{name: IMPORTER_SOURCE, value: http}}
    - {{name: IMPORTER_ENDPOINT, value: "{url}"}}
    - {{name: IMPORTER_CONTENTTYPE, value: kubevirt}}
    - {{name: IMPORTER_IMAGE_SIZE, value: 64Mi}}
    - {{name: FILESYSTEM_OVERHEAD, value: "0.06"}}
    - {{name: OWNER_UID, value: 0b5e7a52}}
    - {{name: PREALLOCATION, value: "false"}}
    volumeMounts: [{{name: cdi-data-vol, mountPath: /data}}]
  volumes: [{{name: cdi-data-vol, persistentVolumeClaim: {{claimName: disk}}}}]
"#
    )
}

fn server_pod(name: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  containers:
  - name: server
    image: example.com/tools/probe-target:1
    args: [--addr, "$(POD_IP):8080", --kubeconfig, kubeconfig]
    env: [{{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}]
    ports: [{{name: http, containerPort: 8080}}]
    readinessProbe:
      httpGet: {{path: /readyz, port: http, scheme: HTTPS}}
      periodSeconds: 1
"#
    )
}

fn pid_of(pod: &serde_json::Value) -> Option<i32> {
    pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()?
        .strip_prefix("process://")?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_importer_and_probed_servers_run_as_pods() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The qcow2 the importer pod fetches, from a server on 127.0.0.1.
    let data = pattern(8 * MIB as u64);
    std::fs::write(dir.join("src.raw"), &data).unwrap();
    convert(&dir.join("src.raw"), "qcow2", &[], &dir.join("src.qcow2"));
    let expected = oracle(&dir.join("src.qcow2"), "qcow2");
    let server = FileServer::start(None).await;
    server.add(
        "/disk.qcow2",
        std::fs::read(dir.join("src.qcow2")).unwrap(),
        Behaviour {
            ranges: true,
            ..Default::default()
        },
    );
    let cluster = dir.join("cluster");
    let exe = env!("CARGO_BIN_EXE_cdi");
    let image = format!("probe-target={exe} dev apiserver");
    let (ok, out, err) = cdi(
        &["dev", "up", "--addr", "127.0.0.1:0", "--image", &image],
        &cluster,
    );
    assert!(ok, "{out}{err}");
    let _down = Down(&cluster);

    kubectl(
        &cluster,
        &["apply", "-f", "-"],
        Some(&importer_pod(&server.url("/disk.qcow2"))),
    );
    kubectl(
        &cluster,
        &["apply", "-f", "-"],
        Some(&(server_pod("server-a") + "---" + &server_pod("server-b"))),
    );

    let pod = devcluster::wait_for("the importer pod to succeed", 60, || {
        let p = get_json(&cluster, "pod/importer-disk");
        (p["status"]["phase"] == "Succeeded").then_some(p)
    });
    assert_eq!(pod["spec"]["nodeName"], "node-2");
    let message = pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    let message: serde_json::Value = serde_json::from_str(&message).unwrap();
    assert_eq!(message["message"], "Import Complete");
    let pv = get_json(&cluster, "pv");
    let path = pv["items"][0]["spec"]["hostPath"]["path"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        path.starts_with(cluster.join("nodes/node-2").to_str().unwrap()),
        "{path}"
    );
    let disk = std::fs::read(Path::new(&path).join("disk.img")).unwrap();
    assert_same(&disk[..expected.len()], &expected, "the imported image");

    // Both servers listen on 8080, each on its own address, and pass their readiness probes.
    let mut ips = Vec::new();
    let mut pids = Vec::new();
    for name in ["server-a", "server-b"] {
        let p = devcluster::wait_for("the server pod to be ready", 60, || {
            let p = get_json(&cluster, &format!("pod/{name}"));
            let ready = p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            ready.then_some(p)
        });
        ips.push(p["status"]["podIP"].as_str().unwrap().to_string());
        pids.push(pid_of(&p).unwrap());
    }
    assert_ne!(ips[0], ips[1]);
    for ip in &ips {
        assert!(ip.starts_with("127."), "{ip}");
        // Reachable from here, as pod IPs are from a node of a real cluster.
        std::net::TcpStream::connect((ip.as_str(), 8080)).unwrap();
    }
    let wide = kubectl(&cluster, &["get", "pods", "-o", "wide"], None);
    for ip in &ips {
        assert!(wide.contains(ip.as_str()), "{wide}");
    }
    let line = |name: &str| {
        let l = wide.lines().find(|l| l.starts_with(name)).unwrap_or("");
        l.split_whitespace().take(4).collect::<Vec<_>>().join(" ")
    };
    assert_eq!(
        line("importer-disk"),
        "importer-disk 0/1 Completed 0",
        "{wide}"
    );
    assert_eq!(line("server-a"), "server-a 1/1 Running 0", "{wide}");

    let (ok, out, _) = cdi(&["dev", "down"], &cluster);
    assert!(ok && out.contains("stopped"), "{out}");
    for pid in pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(cmdline.is_empty(), "pod process {pid} outlived the cluster");
    }
}
