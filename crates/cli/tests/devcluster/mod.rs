//! What the tests driving `cdi dev` share: running `cdi … --dir DIR`, the machine's kubectl
//! against its kubeconfig, and stopping the cluster when a test ends, even by a panic.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `cdi ARGS --dir DIR`: success, stdout, stderr.
pub fn cdi(args: &[&str], dir: &Path) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cdi"))
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// kubectl against the cluster in `dir`, `stdin` fed to it; fails the test when kubectl fails.
pub fn kubectl(dir: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let (ok, out, err) = kubectl_as(&dir.join("kubeconfig"), args, stdin);
    assert!(ok, "kubectl {args:?}: {err}");
    out
}

/// kubectl with the kubeconfig at `config` (a user's), `stdin` fed to it: success, stdout,
/// stderr.
#[allow(dead_code)]
pub fn kubectl_as(config: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", config)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl is installed");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Stops the cluster even when an assertion fails, so no process outlives the test.
pub struct Down<'a>(pub &'a Path);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        let keep = std::env::var_os("CDI_TEST_KEEP").filter(|_| failed);
        if let (Some(_), Some(parent)) = (&keep, self.0.parent()) {
            // What the cluster held when the test failed, beside the controller's logs.
            let state = Command::new("kubectl")
                .args(["get", "pods,pvc,pv,dv,events,leases", "-A", "-o", "yaml"])
                .env("KUBECONFIG", self.0.join("kubeconfig"))
                .output();
            if let Ok(out) = state {
                let _ = std::fs::write(parent.join("state.yaml"), out.stdout);
            }
        }
        let _ = cdi(&["dev", "down"], self.0);
        if let (Some(keep), Some(parent)) = (keep, self.0.parent()) {
            // Kept for a post-mortem: the temporary directory goes with the test.
            let to = Path::new(&keep).join(format!("{}", std::process::id()));
            let _ = std::fs::create_dir_all(&to);
            let _ = Command::new("cp").arg("-a").arg(parent).arg(&to).status();
            eprintln!(
                "kept the failed test's cluster and logs in {}",
                to.display()
            );
        }
    }
}

/// `cdi controller` against the cluster in a directory; killed when dropped.
#[allow(dead_code)] // not every test crate runs the controller
pub struct Controller(std::process::Child);

#[allow(dead_code)]
impl Controller {
    /// Start it, installing the CRDs; `log` receives its output.
    pub fn start(dir: &Path, log: &Path) -> Controller {
        let out = std::fs::File::create(log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_cdi"))
            .args([
                "controller",
                "--install-crds",
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            .env("KUBECONFIG", dir.join("kubeconfig"))
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Controller(child)
    }

    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }

    /// Kill it at once (as a crash would).
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Make StorageProfile `csi` name clone strategy `strategy`, and wait until its status says it.
#[allow(dead_code)]
pub fn set_clone_strategy(dir: &Path, strategy: &str) {
    set_profile_clone_strategy(dir, "csi", strategy);
}

/// Make StorageProfile `profile` name clone strategy `strategy`, and wait until its status says
/// it.
#[allow(dead_code)]
pub fn set_profile_clone_strategy(dir: &Path, profile: &str, strategy: &str) {
    kubectl(
        dir,
        &[
            "patch",
            "storageprofile",
            profile,
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"cloneStrategy":"{strategy}"}}}}"#),
        ],
        None,
    );
    wait_for(&format!("profile {profile} to say {strategy}"), 30, || {
        get_json(dir, "default", &format!("storageprofile/{profile}"))
            .filter(|p| p["status"]["cloneStrategy"] == strategy)
    });
}

/// The file holding a claim's data: the disk image of a Filesystem volume, or the Block volume.
/// Waits for the claim to be bound (a populated DataVolume can say Succeeded a moment before its
/// claim takes the volume over).
#[allow(dead_code)]
pub fn volume_file(dir: &Path, ns: &str, claim: &str) -> PathBuf {
    let claim = wait_for(&format!("{claim} to be bound"), 30, || {
        get_json(dir, ns, &format!("pvc/{claim}")).filter(|c| c["spec"]["volumeName"].is_string())
    });
    let pv = get_json(
        dir,
        ns,
        &format!("pv/{}", claim["spec"]["volumeName"].as_str().unwrap()),
    )
    .unwrap();
    let path = pv["spec"]["hostPath"]["path"]
        .as_str()
        .or(pv["spec"]["csi"]["volumeAttributes"]["path"].as_str())
        .map(PathBuf::from)
        .unwrap();
    if path.is_dir() {
        path.join("disk.img")
    } else {
        path
    }
}

/// Set the CDIConfig's feature gates (a JSON list).
#[allow(dead_code)]
pub fn set_feature_gates(dir: &Path, gates: &str) {
    // Where an operator installed CDI, its CDI resource is the authority on CDIConfig (edits
    // there are undone), so the gates go into its spec.config, as an admin would set them.
    let installed = kubectl(dir, &["get", "cdi", "-o", "name"], None);
    let (target, patch) = match installed.lines().next() {
        Some(cdi) => (
            cdi.to_string(),
            format!(r#"{{"spec":{{"config":{{"featureGates":{gates}}}}}}}"#),
        ),
        None => (
            "cdiconfig/config".to_string(),
            format!(r#"{{"spec":{{"featureGates":{gates}}}}}"#),
        ),
    };
    kubectl(
        dir,
        &["patch", &target, "--type", "merge", "-p", &patch],
        None,
    );
    // Applied once CDIConfig holds them.
    let want: serde_json::Value = serde_json::from_str(gates).unwrap();
    wait_for("CDIConfig to hold the feature gates", 60, || {
        let out = kubectl(dir, &["get", "cdiconfig", "config", "-o", "json"], None);
        let config: serde_json::Value = serde_json::from_str(&out).ok()?;
        let held = &config["spec"]["featureGates"];
        (held == &want || (held.is_null() && want == serde_json::json!([]))).then_some(())
    });
}

/// Poll `check` every 100 ms for up to `secs` seconds.
#[allow(dead_code)]
pub fn wait_for<T>(what: &str, secs: u64, check: impl FnMut() -> Option<T>) -> T {
    within(secs, check).unwrap_or_else(|| panic!("{what}: not reached in {secs} s"))
}

/// Poll `check` every 100 ms for up to `secs` seconds; None when it never held.
#[allow(dead_code)] // not every test crate needs the answer without a panic
pub fn within<T>(secs: u64, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    for _ in 0..secs * 10 {
        if let Some(v) = check() {
            return Some(v);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    None
}

/// The process of pod `pod` of the cluster in `dir`.
#[allow(dead_code)]
pub fn pod_process(dir: &Path, pod: &str) -> Option<i32> {
    find_pod_process(dir, |host| host == pod.as_bytes())
}

/// The process of any pod of the cluster in `dir` whose name starts with `prefix`.
#[allow(dead_code)]
pub fn pod_process_named(dir: &Path, prefix: &str) -> Option<i32> {
    find_pod_process(dir, |host| host.starts_with(prefix.as_bytes()))
}

/// A process of the cluster in `dir` (its `CDI_POD_ROOT` lies there) whose `HOSTNAME`, the pod's
/// name, satisfies `name`.
#[allow(dead_code)]
pub fn find_pod_process(dir: &Path, name: impl Fn(&[u8]) -> bool) -> Option<i32> {
    let root = format!("CDI_POD_ROOT={}", dir.display());
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let env = std::fs::read(e.path().join("environ")).ok()?;
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        let has_root = vars.iter().any(|v| v.starts_with(root.as_bytes()));
        let named = vars
            .iter()
            .any(|v| v.strip_prefix(b"HOSTNAME=").is_some_and(&name));
        (has_root && named).then_some(pid)
    })
}

/// `kubectl get WHAT -n NAMESPACE -o json`, when it exists.
#[allow(dead_code)]
pub fn get_json(dir: &Path, namespace: &str, what: &str) -> Option<serde_json::Value> {
    let out = Command::new("kubectl")
        .args(["get", what, "-n", namespace, "-o", "json"])
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

/// `cdi upload-proxy` as a process against the cluster, with the Secrets the controller made
/// written to files; killed when dropped.
#[allow(dead_code)]
pub struct UploadProxy {
    pub child: std::process::Child,
    /// The name its certificate holds, at the address it listens on.
    pub host: String,
    pub resolve: String,
    pub ca: std::path::PathBuf,
    pub signing_key: String,
}

impl Drop for UploadProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[allow(dead_code)]
pub fn secret_file(dir: &Path, out: &Path, secret: &str, key: &str) -> std::path::PathBuf {
    use base64::Engine;
    let s = wait_for(&format!("Secret {secret}"), 30, || {
        get_json(dir, "kube-system", &format!("secret/{secret}"))
    });
    let data = base64::engine::general_purpose::STANDARD
        .decode(s["data"][key].as_str().unwrap())
        .unwrap();
    let path = out.join(format!("{secret}-{key}"));
    std::fs::write(&path, data).unwrap();
    path
}

#[allow(dead_code)]
pub fn bundle_file(dir: &Path, out: &Path, map: &str) -> std::path::PathBuf {
    let m = wait_for(&format!("ConfigMap {map}"), 30, || {
        get_json(dir, "kube-system", &format!("configmap/{map}"))
    });
    let path = out.join(format!("{map}.crt"));
    std::fs::write(&path, m["data"]["ca-bundle.crt"].as_str().unwrap()).unwrap();
    path
}

#[allow(dead_code)]
pub fn start_proxy(dir: &Path, out: &Path) -> UploadProxy {
    use std::io::BufRead;
    let f = |secret: &str, key: &str| secret_file(dir, out, secret, key);
    let public = f("cdi-api-signing-key", "id_rsa.pub");
    let signing_key = std::fs::read_to_string(f("cdi-api-signing-key", "id_rsa")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cdi"))
        .args(["upload-proxy", "--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(f("cdi-uploadproxy-server-cert", "tls.crt"))
        .arg("--tls-key")
        .arg(f("cdi-uploadproxy-server-cert", "tls.key"))
        .arg("--client-cert")
        .arg(f("cdi-uploadserver-client-cert", "tls.crt"))
        .arg("--client-key")
        .arg(f("cdi-uploadserver-client-cert", "tls.key"))
        .arg("--server-ca")
        .arg(bundle_file(dir, out, "cdi-uploadserver-signer-bundle"))
        .arg("--apiserver-public-key-file")
        .arg(public)
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(out.join("proxy.log")).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("upload proxy on https://")
        .unwrap_or_else(|| panic!("the proxy said {line:?}"))
        .to_string();
    let port = addr.rsplit_once(':').unwrap().1.to_string();
    let host = "cdi-uploadproxy.kube-system.svc".to_string();
    UploadProxy {
        child,
        resolve: format!("{host}:{port}:127.0.0.1"),
        host: format!("{host}:{port}"),
        ca: bundle_file(dir, out, "cdi-uploadproxy-signer-bundle"),
        signing_key,
    }
}

#[allow(dead_code)]
impl UploadProxy {
    /// A token for an upload into `default/claim`, issued `ago` in the past by `key`.
    pub fn token(
        &self,
        key: Option<&str>,
        op: cdi_pki::token::Operation,
        claim: &str,
        ago: u64,
    ) -> String {
        use cdi_pki::token::{API_ISSUER, LIFETIME, Payload, Signer};
        let signer = Signer::new(API_ISSUER, key.unwrap_or(&self.signing_key)).unwrap();
        let mut payload = Payload::upload("default", claim);
        payload.operation = op;
        let issued = std::time::SystemTime::now() - std::time::Duration::from_secs(ago);
        signer.sign_at(&payload, issued, LIFETIME)
    }

    /// curl posting `image` to `path` with `token`: the status and the body.
    pub fn post(&self, token: Option<&str>, path: &str, image: &Path) -> (u16, String) {
        self.send(token, path, image, false)
    }

    /// The same as a multipart form whose part `file` is `image` (`curl -F`).
    #[allow(dead_code)]
    pub fn post_form(&self, token: Option<&str>, path: &str, image: &Path) -> (u16, String) {
        self.send(token, path, image, true)
    }

    fn send(&self, token: Option<&str>, path: &str, image: &Path, form: bool) -> (u16, String) {
        let mut cmd = Command::new("curl");
        cmd.args([
            "-sS",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "--resolve",
            &self.resolve,
        ])
        .arg("--cacert")
        .arg(&self.ca);
        if form {
            cmd.arg("-F").arg(format!("file=@{}", image.display()));
        } else {
            cmd.arg("--data-binary")
                .arg(format!("@{}", image.display()));
        }
        if let Some(t) = token {
            cmd.arg("-H").arg(format!("Authorization: Bearer {t}"));
        }
        cmd.arg(format!("https://{}{path}", self.host));
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
}

/// `cdi doctor ARGS -o json` against the cluster in `dir`: its answer (an object for one
/// DataVolume, a list without a name).
#[allow(dead_code)]
pub fn doctor(dir: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_cdi"))
        .arg("doctor")
        .args(args)
        .args(["-o", "json"])
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cdi doctor {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}
