//! A real S3-compatible server on 127.0.0.1 for tests: moto's server (from PyPI; `scripts/test`
//! installs it into `target/test-tools/moto`, or `CDI_MOTO_VENV` names a virtualenv holding it),
//! with its IAM authentication on, so a request signed with the wrong secret is refused as S3
//! refuses it. Stopped when dropped.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Makes a user allowed everything on S3 and its access key (the first actions, before moto
/// authenticates any), then prints the key and its secret.
const SETUP: &str = r#"
import boto3, json, sys
iam = boto3.client("iam", endpoint_url=sys.argv[1], region_name="us-east-1",
                   aws_access_key_id="setup", aws_secret_access_key="setup")
iam.create_user(UserName="cdi")
iam.put_user_policy(UserName="cdi", PolicyName="s3", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="cdi")["AccessKey"]
print(key["AccessKeyId"], key["SecretAccessKey"])
"#;

/// Puts a file as an object (creating its bucket), signed with the given key.
const PUT: &str = r#"
import boto3, sys
endpoint, key, secret, bucket, name, path = sys.argv[1:7]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id=key, aws_secret_access_key=secret)
if bucket not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
    s3.create_bucket(Bucket=bucket)
s3.upload_file(path, bucket, name)
"#;

/// The number of unauthenticated actions `SETUP` takes.
const SETUP_ACTIONS: &str = "3";

pub struct S3Server {
    child: Child,
    venv: PathBuf,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    pub access_key: String,
    pub secret_key: String,
}

fn venv() -> PathBuf {
    std::env::var_os("CDI_MOTO_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-tools/moto")
        })
}

impl S3Server {
    /// Start the server and make its user; panics (naming the fix) when moto is not installed.
    pub fn start() -> S3Server {
        let venv = venv();
        let server = venv.join("bin/moto_server");
        assert!(
            server.exists(),
            "{} is missing: scripts/test installs moto (pip install 'moto[server]') into that \
             virtualenv, or set CDI_MOTO_VENV to one holding it",
            server.display()
        );
        let mut child = Command::new(&server)
            .args(["-H", "127.0.0.1", "-p", "0"])
            .env("INITIAL_NO_AUTH_ACTION_COUNT", SETUP_ACTIONS)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting moto_server");
        // Werkzeug says where it listens once it does.
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let deadline = Instant::now() + Duration::from_secs(60);
        let endpoint = loop {
            let line = match lines.next() {
                Some(Ok(line)) => line,
                _ => {
                    let _ = child.kill();
                    panic!("moto_server ended before it listened");
                }
            };
            if let Some(at) = line.find("Running on http://127.0.0.1:") {
                break line[at + "Running on ".len()..].trim().to_string();
            }
            assert!(Instant::now() < deadline, "moto_server did not listen");
        };
        // Keep draining its log, or it blocks once the pipe is full.
        std::thread::spawn(move || for _ in lines {});
        let mut server = S3Server {
            child,
            venv,
            endpoint,
            access_key: String::new(),
            secret_key: String::new(),
        };
        let out = server.python(SETUP, &[]);
        let mut words = out.split_whitespace();
        server.access_key = words.next().expect("an access key").to_string();
        server.secret_key = words.next().expect("a secret").to_string();
        server
    }

    fn python(&self, script: &str, args: &[&str]) -> String {
        let out = Command::new(self.venv.join("bin/python"))
            .arg("-c")
            .arg(script)
            .arg(&self.endpoint)
            .args(args)
            .output()
            .expect("running the virtualenv's python");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Store `data` as `bucket/key`.
    pub fn put(&self, bucket: &str, key: &str, data: &[u8]) {
        let file = tempfile::NamedTempFile::new().expect("a temporary file");
        std::fs::write(file.path(), data).expect("writing the object");
        let path = file.path().to_string_lossy().into_owned();
        self.python(
            PUT,
            &[&self.access_key, &self.secret_key, bucket, key, &path],
        );
    }

    /// The path-style URL of `bucket/key`.
    pub fn url(&self, bucket: &str, key: &str) -> String {
        format!("{}/{bucket}/{key}", self.endpoint)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
