//! Upload DataVolumes in `cdi dev` with the real controller and upload server: the upload pod
//! becomes ready, a client holding the upload proxy's certificate posts the image with curl, and
//! the volume holds what qemu-img makes of it.

mod devcluster;

use std::path::Path;
use std::process::Command;

use cdi_testkit::images::{assert_same, convert, oracle, pattern};
use devcluster::{Controller, Down, cdi, doctor, get_json, kubectl, start_proxy, wait_for};
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn get(dir: &Path, what: &str) -> Option<Value> {
    get_json(dir, "default", what)
}

/// One cluster of this file at a time: every development cluster gives its pods addresses from
/// the same ranges, and two upload servers of two clusters can get the same address and port.
static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `cdi controller` against the cluster in `dir`, once it has installed the CRDs (kubectl
/// validates what it applies against their schemas).
fn controller(dir: &Path, logs: &Path) -> Controller {
    let c = Controller::start(dir, &logs.join("controller.log"));
    wait_for("the controller's CDIConfig", 60, || {
        get(dir, "cdiconfig/config")
    });
    c
}

fn phase(dv: &Value) -> String {
    dv["status"]["phase"].as_str().unwrap_or("").to_string()
}

/// An upload DataVolume of `size`, bound at once (what `--force-bind` asks for), on the classic
/// path.
fn upload_volume(name: &str, class: &str, mode: &str, size: &str) -> String {
    upload_volume_on(name, class, mode, size, false)
}

fn upload_volume_on(name: &str, class: &str, mode: &str, size: &str, populator: bool) -> String {
    format!(
        r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: {name}
  annotations: {{cdi.kubevirt.io/storage.bind.immediate.requested: "true", cdi.kubevirt.io/storage.usePopulator: "{populator}"}}
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
        get_json(dir, "kube-system", "secret/cdi-uploadserver-client-cert")
    });
    let decode = |k: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"][k].as_str().unwrap())
            .unwrap()
    };
    let bundle = get_json(
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

/// The names of a pod's volumes.
fn volumes(pod: &Value) -> Vec<String> {
    pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str().map(String::from))
        .collect()
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
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let (ok, out, err) = cdi(&["dev", "up", "--addr", "127.0.0.1:0"], &dir);
    assert!(ok, "{out}{err}");
    let _down = Down(&dir);
    let _controller = controller(&dir, tmp.path());
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "{}---{}---{}",
            upload_volume("up-fs", "csi", "Filesystem", "1Gi"),
            upload_volume("up-block", "csi", "Block", "64Mi"),
            upload_volume("up-vmdk", "csi", "Filesystem", "64Mi")
        )),
    );
    let raw = tmp.path().join("src.raw");
    std::fs::write(&raw, pattern(5 * MIB)).unwrap();
    let qcow2 = tmp.path().join("src.qcow2");
    convert(&raw, "qcow2", &[], &qcow2);
    let expected = oracle(&qcow2, "qcow2");
    let vmdk = tmp.path().join("src.vmdk");
    convert(&raw, "vmdk", &[], &vmdk);
    for name in ["up-fs", "up-block", "up-vmdk"] {
        wait_for(&format!("{name} to be ready for the upload"), 60, || {
            get(&dir, &format!("dv/{name}")).filter(|d| phase(d) == "UploadReady")
        });
        // Raw and qcow2 stream: a server has no scratch space until one asks for it.
        let pod = get(&dir, &format!("pod/cdi-upload-{name}")).unwrap();
        let has = volumes(&pod);
        assert!(has.contains(&"cdi-data-vol".to_string()), "{name}: {has:?}");
        assert!(
            !has.contains(&"cdi-scratch-vol".to_string()),
            "{name}: {has:?}"
        );
    }
    // `cdi doctor` says the pod waits for a client, and how to be one.
    let d = doctor(&dir, &["up-fs"]);
    assert_eq!(d["cause"], "UploadWaiting", "{d}");
    assert!(
        d["explanation"]
            .as_str()
            .unwrap()
            .contains("cdi image-upload dv up-fs -n default --no-create"),
        "{d}"
    );
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

    // A VMDK converts only from a copy: the server says to send it again and asks for scratch
    // space, the next server has it and takes the same upload.
    let (code, body) = curl_upload(&dir, Some(&creds), "up-vmdk", "/v1beta1/upload", &vmdk);
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("send the upload again"), "{body}");
    wait_for("an upload server with scratch space", 60, || {
        get(&dir, "pod/cdi-upload-up-vmdk").filter(|p| {
            volumes(p).contains(&"cdi-scratch-vol".to_string())
                && p["status"]["containerStatuses"][0]["ready"] == true
        })
    });
    let scratch = get(&dir, "pvc/up-vmdk-scratch").unwrap();
    assert_eq!(scratch["metadata"]["ownerReferences"][0]["kind"], "Pod");
    let claim = get(&dir, "pvc/up-vmdk").unwrap();
    assert_eq!(
        claim["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.requiresScratch"],
        "true"
    );
    let (code, body) = curl_upload(&dir, Some(&creds), "up-vmdk", "/v1beta1/upload", &vmdk);
    assert_eq!(code, 200, "{body}");
    wait_for("the VMDK upload to succeed", 60, || {
        get(&dir, "dv/up-vmdk").filter(|d| phase(d) == "Succeeded")
    });
    let disk = std::fs::read(volume_path(&dir, "up-vmdk")).unwrap();
    assert_same(
        &disk[..expected.len()],
        &expected,
        "VMDK upload through scratch",
    );
    wait_for("the scratch claim to go with the pod", 60, || {
        get(&dir, "pvc/up-vmdk-scratch").is_none().then_some(())
    });

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

/// A claim that is no upload target.
const PLAIN_CLAIM: &str = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: plain}
spec:
  storageClassName: csi
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 64Mi}}
"#;

/// The requests the upload pod of `claim` logged.
fn upload_requests(dir: &Path, claim: &str) -> usize {
    kubectl(dir, &["logs", &format!("cdi-upload-{claim}")], None)
        .lines()
        .filter(|l| l.contains("upload request"))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_proxy_lets_only_valid_tokens_through() {
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    use cdi_pki::token::Operation;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let (ok, out, err) = cdi(&["dev", "up", "--addr", "127.0.0.1:0"], &dir);
    assert!(ok, "{out}{err}");
    let _down = Down(&dir);
    let _controller = controller(&dir, tmp.path());
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "{}---{PLAIN_CLAIM}---{}---{}---{}",
            upload_volume("via-proxy", "csi", "Filesystem", "1Gi"),
            upload_volume_on("populated", "csi", "Filesystem", "1Gi", true),
            upload_volume("form", "csi", "Filesystem", "1Gi"),
            upload_volume("form-async", "csi", "Block", "64Mi")
        )),
    );
    let raw = tmp.path().join("src.raw");
    let data = pattern(4 * MIB);
    std::fs::write(&raw, &data).unwrap();
    let xz = tmp.path().join("src.raw.xz");
    let status = Command::new("xz")
        .args(["-k", "-T1", "-3"])
        .arg(&raw)
        .status()
        .expect("xz is installed");
    assert!(status.success());
    let proxy = start_proxy(&dir, tmp.path());
    wait_for("via-proxy to be ready for the upload", 60, || {
        get(&dir, "dv/via-proxy").filter(|d| phase(d) == "UploadReady")
    });

    // Refused by the proxy, before any upload server: missing, forged, expired, not an upload.
    let upload = "/v1beta1/upload";
    assert_eq!(proxy.post(None, upload, &xz).0, 401);
    let (other_key, _) = cdi_pki::token::generate_key().unwrap();
    let forged = proxy.token(Some(&other_key), Operation::Upload, "via-proxy", 0);
    assert_eq!(proxy.post(Some(&forged), upload, &xz).0, 401);
    let expired = proxy.token(None, Operation::Upload, "via-proxy", 20 * 60);
    let (code, body) = proxy.post(Some(&expired), upload, &xz);
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("expired"), "{body}");
    let clone = proxy.token(None, Operation::Clone, "via-proxy", 0);
    assert_eq!(proxy.post(Some(&clone), upload, &xz).0, 401);
    let (code, body) = proxy.post(
        Some(&proxy.token(None, Operation::Upload, "plain", 0)),
        upload,
        &xz,
    );
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("PVC plain is not an upload target"), "{body}");
    let (code, body) = proxy.post(
        Some(&proxy.token(None, Operation::Upload, "missing", 0)),
        upload,
        &xz,
    );
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("doesn't exist"), "{body}");
    // A token signed for a path rather than a claim's name never reaches the API's URL.
    for path in ["../kube-system/x", "via-proxy/status"] {
        let (code, body) = proxy.post(
            Some(&proxy.token(None, Operation::Upload, path, 0)),
            upload,
            &xz,
        );
        assert_eq!(code, 401, "{path}: {body}");
        assert!(body.contains("does not name a PVC"), "{body}");
    }
    // Not a POST: refused with the reason before the body is asked for (no 100 Continue).
    let put = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "-X",
            "PUT",
            "--resolve",
        ])
        .arg(&proxy.resolve)
        .arg("--cacert")
        .arg(&proxy.ca)
        .arg("-H")
        .arg(format!(
            "Authorization: Bearer {token_for_put}",
            token_for_put = proxy.token(None, Operation::Upload, "via-proxy", 0)
        ))
        .arg("--data-binary")
        .arg(format!("@{}", xz.display()))
        .arg(format!("https://{}{upload}", proxy.host))
        .output()
        .unwrap();
    let put = String::from_utf8_lossy(&put.stdout).into_owned();
    assert!(put.ends_with("\n405"), "{put}");
    assert!(
        put.contains("PUT is not an upload: send the image with POST"),
        "{put}"
    );
    assert_eq!(
        upload_requests(&dir, "via-proxy"),
        0,
        "no request reached the pod"
    );

    // A valid token: the xz-compressed raw image goes through to the volume.
    let token = proxy.token(None, Operation::Upload, "via-proxy", 0);
    let (code, body) = proxy.post(Some(&token), "/v1beta1/upload-async", &xz);
    assert_eq!(code, 200, "{body}");
    wait_for("via-proxy to succeed", 60, || {
        get(&dir, "dv/via-proxy").filter(|d| phase(d) == "Succeeded")
    });
    let disk = std::fs::read(volume_path(&dir, "via-proxy")).unwrap();
    assert_same(&disk[..data.len()], &data, "xz upload through the proxy");
    // Done: the proxy refuses another upload into it, as final (409, not 503: no retry).
    let (code, body) = proxy.post(Some(&token), upload, &xz);
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("already finished uploading"), "{body}");

    // Multipart forms, as a browser sends them: the xz image to the sync form endpoint, a
    // qcow2 to the async one into a Block volume.
    let qcow2 = tmp.path().join("src.qcow2");
    convert(&raw, "qcow2", &[], &qcow2);
    for (name, path, image) in [
        ("form", "/v1beta1/upload-form", &xz),
        ("form-async", "/v1beta1/upload-form-async", &qcow2),
    ] {
        wait_for(&format!("{name} to be ready for the upload"), 60, || {
            get(&dir, &format!("dv/{name}")).filter(|d| phase(d) == "UploadReady")
        });
        let token = proxy.token(None, Operation::Upload, name, 0);
        let (code, body) = proxy.post_form(Some(&token), path, image);
        assert_eq!(code, 200, "{name}: {body}");
        wait_for(&format!("{name} to succeed"), 60, || {
            get(&dir, &format!("dv/{name}")).filter(|d| phase(d) == "Succeeded")
        });
        let disk = std::fs::read(volume_path(&dir, name)).unwrap();
        assert_same(&disk[..data.len()], &data, name);
    }

    // The populator path: the token names the target; the image lands in PVC prime, whose
    // volume the target then takes over.
    wait_for("populated to be ready for the upload", 60, || {
        get(&dir, "dv/populated").filter(|d| phase(d) == "UploadReady")
    });
    let target = get(&dir, "pvc/populated").unwrap();
    let prime = format!("prime-{}", target["metadata"]["uid"].as_str().unwrap());
    assert_eq!(
        target["spec"]["dataSourceRef"]["kind"], "VolumeUploadSource",
        "{target}"
    );
    let token = proxy.token(None, Operation::Upload, "populated", 0);
    let (code, body) = proxy.post(Some(&token), "/v1beta1/upload", &raw);
    assert_eq!(code, 200, "{body}");
    wait_for("populated to succeed", 60, || {
        get(&dir, "dv/populated").filter(|d| phase(d) == "Succeeded")
    });
    wait_for("the target to take over PVC prime's volume", 60, || {
        get(&dir, "pvc/populated").filter(|c| c["status"]["phase"] == "Bound")
    });
    let disk = std::fs::read(volume_path(&dir, "populated")).unwrap();
    assert_same(&disk[..data.len()], &data, "upload through the populator");
    wait_for("PVC prime to go", 60, || {
        get(&dir, &format!("pvc/{prime}")).is_none().then_some(())
    });
    // Populated, its PVC prime gone: another upload is told at once it is done.
    let (code, body) = proxy.post(Some(&token), "/v1beta1/upload", &raw);
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("already finished uploading"), "{body}");
}

/// An upload DataVolume of archive content.
const ARCHIVE_VOLUME: &str = r#"
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: files
  annotations: {cdi.kubevirt.io/storage.bind.immediate.requested: "true", cdi.kubevirt.io/storage.usePopulator: "false"}
spec:
  source: {upload: {}}
  contentType: archive
  pvc:
    storageClassName: csi
    accessModes: [ReadWriteOnce]
    resources: {requests: {storage: 64Mi}}
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_upload_server_fails_the_upload_and_it_is_sent_again_and_archives_unpack() {
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    use cdi_pki::token::Operation;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let (ok, out, err) = cdi(&["dev", "up", "--addr", "127.0.0.1:0"], &dir);
    assert!(ok, "{out}{err}");
    let _down = Down(&dir);
    let _controller = controller(&dir, tmp.path());
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&format!(
            "{}---{ARCHIVE_VOLUME}",
            upload_volume("killed", "csi", "Filesystem", "1Gi")
        )),
    );
    let raw = tmp.path().join("src.raw");
    let data = pattern(12 * MIB);
    std::fs::write(&raw, &data).unwrap();
    let proxy = start_proxy(&dir, tmp.path());
    wait_for("killed to be ready for the upload", 60, || {
        get(&dir, "dv/killed").filter(|d| phase(d) == "UploadReady")
    });
    let token = proxy.token(None, Operation::Upload, "killed", 0);
    // A slow client: the upload is under way when its server is killed.
    let slow = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--limit-rate",
            "1M",
        ])
        .args(["--resolve", &proxy.resolve, "--cacert"])
        .arg(&proxy.ca)
        .arg("-H")
        .arg(format!("Authorization: Bearer {token}"))
        .arg("--data-binary")
        .arg(format!("@{}", raw.display()))
        .arg(format!("https://{}/v1beta1/upload", proxy.host))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the upload to reach the server", 30, || {
        (upload_requests(&dir, "killed") > 0).then_some(())
    });
    let pid = wait_for("the upload server's process", 30, || {
        devcluster::pod_process(&dir, "cdi-upload-killed")
    });
    let killed = Command::new("kill").args(["-9", &pid.to_string()]).status();
    assert!(killed.unwrap().success());
    let out = slow.wait_with_output().unwrap();
    let code = String::from_utf8_lossy(&out.stdout).to_string();
    assert_ne!(code, "200", "a broken upload is no success");
    // Nothing half-written is done: the pod restarts and is ready again, and the upload is
    // sent again.
    wait_for("the upload pod to restart", 60, || {
        get(&dir, "dv/killed").filter(|d| d["status"]["restartCount"].as_i64() >= Some(1))
    });
    assert_ne!(phase(&get(&dir, "dv/killed").unwrap()), "Succeeded");
    wait_for("killed to be ready again", 60, || {
        get(&dir, "dv/killed").filter(|d| phase(d) == "UploadReady")
    });
    let (code, body) = proxy.post(Some(&token), "/v1beta1/upload", &raw);
    assert_eq!(code, 200, "{body}");
    wait_for("killed to succeed", 60, || {
        get(&dir, "dv/killed").filter(|d| phase(d) == "Succeeded")
    });
    let disk = std::fs::read(volume_path(&dir, "killed")).unwrap();
    assert_same(&disk[..data.len()], &data, "the upload sent again");

    // An archive: the proxy sends it to the archive endpoint, and it is unpacked.
    let tree = tmp.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("a.txt"), "first file\n").unwrap();
    std::fs::write(tree.join("sub/b.bin"), pattern(MIB)).unwrap();
    let tar = tmp.path().join("files.tar");
    let made = Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&tree)
        .args(["a.txt", "sub"])
        .status();
    assert!(made.unwrap().success());
    wait_for("files to be ready for the upload", 60, || {
        get(&dir, "dv/files").filter(|d| phase(d) == "UploadReady")
    });
    let token = proxy.token(None, Operation::Upload, "files", 0);
    let (code, body) = proxy.post(Some(&token), "/v1beta1/upload", &tar);
    assert_eq!(code, 200, "{body}");
    wait_for("files to succeed", 60, || {
        get(&dir, "dv/files").filter(|d| phase(d) == "Succeeded")
    });
    let volume = volume_path(&dir, "files");
    let volume = volume.parent().unwrap();
    assert_eq!(
        std::fs::read_to_string(volume.join("a.txt")).unwrap(),
        "first file\n"
    );
    assert_eq!(
        std::fs::read(volume.join("sub/b.bin")).unwrap(),
        pattern(MIB)
    );
    assert!(
        !volume.join("disk.img").exists(),
        "an archive is no disk image"
    );
}
