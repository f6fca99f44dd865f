//! A real container registry on 127.0.0.1 for tests: Debian's `docker-registry` (the CNCF
//! distribution registry) with a configuration of its own, with or without TLS (a test CA) and
//! basic authentication (an htpasswd file made with `htpasswd -B`); images are pushed into it
//! from OCI layouts by `skopeo copy`. Stopped when dropped.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::TestCa;

/// How the registry is set up.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub tls: bool,
    /// Basic authentication with this user and password.
    pub auth: Option<(String, String)>,
}

pub struct Registry {
    child: Child,
    _dir: tempfile::TempDir,
    /// `127.0.0.1:<port>`.
    pub host: String,
    /// The CA of the registry's certificate, when it serves TLS.
    pub ca: Option<TestCa>,
    auth: Option<(String, String)>,
}

fn run(command: &mut Command, what: &str) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e} (scripts/test installs it)"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Registry {
    pub fn start(options: Options) -> Registry {
        let dir = tempfile::tempdir().expect("a registry directory");
        let root = dir.path().join("storage");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:0\n  secret: cdi-rs-tests\n",
            root.display()
        );
        let ca = options.tls.then(TestCa::new);
        if let Some(ca) = &ca {
            let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
            std::fs::write(&cert, &ca.cert_pem).expect("writing the certificate");
            std::fs::write(&key, &ca.key_pem).expect("writing the key");
            config += &format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            );
        }
        if let Some((user, password)) = &options.auth {
            let line = run(
                Command::new("htpasswd").args(["-Bbn", user, password]),
                "htpasswd",
            );
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, line.trim()).expect("writing htpasswd");
            config += &format!(
                "auth:\n  htpasswd:\n    realm: cdi-rs-tests\n    path: {}\n",
                file.display()
            );
        }
        let file = dir.path().join("config.yml");
        std::fs::write(&file, config).expect("writing the registry's config");
        let mut child = Command::new("docker-registry")
            .arg("serve")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting docker-registry (scripts/test installs it)");
        // It logs where it listens once it does.
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let deadline = Instant::now() + Duration::from_secs(60);
        let host = loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                panic!("docker-registry ended before it listened");
            };
            if let Some(at) = line.find("listening on ") {
                let rest = &line[at + "listening on ".len()..];
                break rest
                    .split(['"', ' ', ','])
                    .next()
                    .unwrap_or_default()
                    .to_string();
            }
            assert!(Instant::now() < deadline, "docker-registry did not listen");
        };
        std::thread::spawn(move || for _ in lines {});
        Registry {
            child,
            _dir: dir,
            host,
            ca,
            auth: options.auth,
        }
    }

    /// `docker://<host>/<name>` (name is `repo:tag` or `repo@digest`).
    pub fn url(&self, name: &str) -> String {
        format!("docker://{}/{name}", self.host)
    }

    /// Copy what `tag` names in the layout (an image, or an index and all its images) to
    /// `name` in the registry.
    pub fn push(&self, layout: &Path, tag: &str, name: &str) {
        let mut skopeo = Command::new("skopeo");
        skopeo.args(["copy", "--quiet", "--all", "--dest-tls-verify=false"]);
        if let Some((user, password)) = &self.auth {
            skopeo.arg(format!("--dest-creds={user}:{password}"));
        }
        skopeo
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(self.url(name));
        run(&mut skopeo, "skopeo copy");
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
