//! Upload DataVolumes in `cdi dev` with the real controller and upload server: the upload pod
//! becomes ready, a client holding the upload proxy's certificate posts the image with curl, and
//! the volume holds what qemu-img makes of it.

mod devcluster;

use std::path::Path;
use std::process::Command;

use cdi_testkit::images::{assert_same, convert, oracle, pattern};
use devcluster::{Controller, Down, cdi, kubectl, wait_for};
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn get(dir: &Path, what: &str) -> Option<Value> {
    get_in(dir, "default", what)
}

fn get_in(dir: &Path, namespace: &str, what: &str) -> Option<Value> {
    let out = Command::new("kubectl")
        .args(["get", what, "-n", namespace, "-o", "json"])
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

fn phase(dv: &Value) -> String {
    dv["status"]["phase"].as_str().unwrap_or("").to_string()
}

/// An upload DataVolume of `size`, bound at once (what `--force-bind` asks for).
fn upload_volume(name: &str, class: &str, mode: &str, size: &str) -> String {
    format!(
        r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: {name}
  annotations: {{cdi.kubevirt.io/storage.bind.immediate.requested: "true", cdi.kubevirt.io/storage.usePopulator: "false"}}
spec:
  source: {{upload: {{}}}}
  pvc:
    storageClassName: {class}
    volumeMode: {mode}
    accessModes: [ReadWriteOnce]
    resources: {{requests: {{storage: {size}}}}}
"#
    )
}

/// What the upload proxy holds: its client certificate and the CA of upload servers, written to
/// files for curl.
struct ProxyCredentials {
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    ca: std::path::PathBuf,
}

fn proxy_credentials(dir: &Path, out: &Path) -> ProxyCredentials {
    use base64::Engine;
    let secret = wait_for("the proxy's client certificate", 30, || {
        get_in(dir, "kube-system", "secret/cdi-uploadserver-client-cert")
    });
    let decode = |k: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"][k].as_str().unwrap())
            .unwrap()
    };
    let bundle = get_in(
        dir,
        "kube-system",
        "configmap/cdi-uploadserver-signer-bundle",
    )
    .unwrap();
    let creds = ProxyCredentials {
        cert: out.join("client.crt"),
        key: out.join("client.key"),
        ca: out.join("server-ca.crt"),
    };
    std::fs::write(&creds.cert, decode("tls.crt")).unwrap();
    std::fs::write(&creds.key, decode("tls.key")).unwrap();
    std::fs::write(&creds.ca, bundle["data"]["ca-bundle.crt"].as_str().unwrap()).unwrap();
    creds
}

/// curl as the upload proxy would post: to the upload Service's name, at the pod's address.
/// The HTTP status and the body.
fn curl_upload(
    dir: &Path,
    creds: Option<&ProxyCredentials>,
    claim: &str,
    path: &str,
    image: &Path,
) -> (u16, String) {
    let pod = get(dir, &format!("pod/cdi-upload-{claim}")).unwrap();
    let ip = pod["status"]["podIP"].as_str().unwrap();
    let host = format!("cdi-upload-{claim}.default.svc");
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-o", "-", "-w", "\n%{http_code}", "--resolve"])
        .arg(format!("{host}:8443:{ip}"))
        .arg("--data-binary")
        .arg(format!("@{}", image.display()));
    match creds {
        Some(c) => {
            cmd.arg("--cacert").arg(&c.ca);
            cmd.arg("--cert").arg(&c.cert).arg("--key").arg(&c.key);
        }
        None => {
            cmd.arg("--insecure");
        }
    }
    cmd.arg(format!("https://{host}:8443{path}"));
    let out = cmd.output().expect("curl is installed");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    let code = code
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("curl: {text} {}", String::from_utf8_lossy(&out.stderr)));
    (
        code,
        format!("{body}{}", String::from_utf8_lossy(&out.stderr)),
    )
}

fn volume_path(dir: &Path, claim: &str) -> std::path::PathBuf {
    let claim = get(dir, &format!("pvc/{claim}")).unwrap();
    let pv = get(
        dir,
        &format!("pv/{}", claim["spec"]["volumeName"].as_str().unwrap()),
    )
    .unwrap();
    let path = pv["spec"]["hostPath"]["path"]
        .as_str()
        .or(pv["spec"]["csi"]["volumeAttributes"]["path"].as_str())
        .map(std::path::PathBuf::from)
        .unwrap();
    // A Filesystem volume is a directory holding the image; a Block one is the image.
    if path.is_dir() {
        path.join("disk.img")
    } else {
        path
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn upload_volumes_are_filled_by_the_holder_of_the_proxy_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let (ok, out, err) = cdi(&["dev", "up", "--addr", "127.0.0.1:0"], &dir);
    assert!(ok, "{out}{err}");
    let _down = Down(&dir);
    let _controller = Controller::start(&dir, &tmp.path().join("controller.log"));
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "{}---{}",
            upload_volume("up-fs", "csi", "Filesystem", "1Gi"),
            upload_volume("up-block", "csi", "Block", "64Mi")
        )),
    );
    let raw = tmp.path().join("src.raw");
    std::fs::write(&raw, pattern(5 * MIB)).unwrap();
    let qcow2 = tmp.path().join("src.qcow2");
    convert(&raw, "qcow2", &[], &qcow2);
    let expected = oracle(&qcow2, "qcow2");
    for name in ["up-fs", "up-block"] {
        wait_for(&format!("{name} to be ready for the upload"), 60, || {
            get(&dir, &format!("dv/{name}")).filter(|d| phase(d) == "UploadReady")
        });
    }
    let creds = proxy_credentials(&dir, tmp.path());
    // Without the proxy's certificate: refused, and nothing is written.
    let (code, body) = curl_upload(&dir, None, "up-fs", "/v1beta1/upload", &qcow2);
    assert_eq!(code, 401, "{body}");
    assert_eq!(
        phase(&get(&dir, "dv/up-fs").unwrap()),
        "UploadReady",
        "a refused client changes nothing"
    );

    // qcow2 through the async endpoint into Filesystem, raw through the sync one into Block.
    let (code, body) = curl_upload(&dir, Some(&creds), "up-fs", "/v1beta1/upload-async", &qcow2);
    assert_eq!(code, 200, "{body}");
    let (code, body) = curl_upload(&dir, Some(&creds), "up-block", "/v1alpha1/upload", &raw);
    assert_eq!(code, 200, "{body}");
    for name in ["up-fs", "up-block"] {
        wait_for(&format!("{name} to succeed"), 60, || {
            get(&dir, &format!("dv/{name}")).filter(|d| phase(d) == "Succeeded")
        });
    }
    let disk = std::fs::read(volume_path(&dir, "up-fs")).unwrap();
    assert_same(&disk[..expected.len()], &expected, "qcow2 upload");
    assert!(disk[expected.len()..].iter().all(|b| *b == 0));
    let block = std::fs::read(volume_path(&dir, "up-block")).unwrap();
    assert_eq!(block.len() as u64, 64 * MIB);
    assert_same(&block[..expected.len()], &expected, "raw upload to Block");

    // The upload pods and their Services go once done; the events say what happened.
    for name in ["up-fs", "up-block"] {
        wait_for(&format!("the upload pod of {name} to go"), 60, || {
            get(&dir, &format!("pod/cdi-upload-{name}"))
                .is_none()
                .then_some(())
        });
        wait_for(&format!("the upload Service of {name} to go"), 60, || {
            get(&dir, &format!("service/cdi-upload-{name}"))
                .is_none()
                .then_some(())
        });
    }
    let events = kubectl(
        &dir,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=up-fs",
            "-o",
            "jsonpath={.items[*].reason}",
        ],
        None,
    );
    for reason in ["UploadScheduled", "UploadReady", "UploadSucceeded"] {
        assert!(events.contains(reason), "{reason} in {events}");
    }
}
