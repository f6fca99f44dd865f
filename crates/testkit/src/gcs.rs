//! Google Cloud Storage for tests, on 127.0.0.1: the objects are kept by a real emulator of its
//! API (`gcp-storage-emulator` from PyPI; `scripts/test` installs it into
//! `target/test-tools/gcs`, or `CDI_GCS_VENV` names a virtualenv holding it), behind a front
//! that does what the emulator does not: Google's OAuth token endpoint for service-account keys
//! (`POST /token`, RFC 7523 JWTs checked against the keys it trusts), and the check that each
//! object request carries one of the tokens it granted. Buckets named `public…` are readable
//! without one, as a public bucket is. Stopped when dropped.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A service account's JSON key, as Google issues them, with an RSA key made for the test.
pub struct ServiceAccountKey {
    pub email: String,
    /// The key file (`credentials.json`).
    pub json: String,
    public_pem: String,
}

impl ServiceAccountKey {
    /// A new key for `email` whose tokens come from `token_uri`.
    pub fn generate(email: &str, token_uri: &str) -> ServiceAccountKey {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("an RSA key");
        let json = serde_json::json!({
            "type": "service_account",
            "project_id": "cdi-test",
            "private_key_id": format!("{:x}", rand_id()),
            "private_key": pair.serialize_pem(),
            "client_email": email,
            "client_id": "1",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": token_uri,
        })
        .to_string();
        ServiceAccountKey {
            email: email.to_string(),
            json,
            public_pem: pair.public_key_pem(),
        }
    }
}

fn rand_id() -> u128 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now()) as u128
}

struct Shared {
    emulator: u16,
    token_uri: String,
    trusted: Mutex<Vec<(String, String)>>,
    granted: Mutex<Vec<String>>,
    /// Object requests refused for want of a granted token.
    refused: AtomicUsize,
}

pub struct GcsServer {
    child: Child,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
    /// `http://127.0.0.1:<port>`: the XML API's endpoint (`/bucket/object`).
    pub endpoint: String,
}

fn venv() -> std::path::PathBuf {
    std::env::var_os("CDI_GCS_VENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-tools/gcs")
        })
}

impl GcsServer {
    /// Start the emulator and its front; panics (naming the fix) when the emulator is missing.
    pub async fn start() -> GcsServer {
        let program = venv().join("bin/gcp-storage-emulator");
        assert!(
            program.exists(),
            "{} is missing: scripts/test installs gcp-storage-emulator into that virtualenv, or \
             set CDI_GCS_VENV to one holding it",
            program.display()
        );
        // The emulator cannot say which port it got: one that was free a moment ago.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut child = Command::new(&program)
            .args(["start", "-H", "127.0.0.1", "--port", &port.to_string()])
            .args(["--in-memory", "--quiet"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting gcp-storage-emulator");
        let mut tries = 0;
        while request(port, "GET", "/", "", &[]).await.is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("gcp-storage-emulator ended ({status}) before it listened");
            }
            tries += 1;
            assert!(tries < 600, "gcp-storage-emulator did not listen");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding");
        let endpoint = format!("http://{}", listener.local_addr().expect("address"));
        let shared = Arc::new(Shared {
            emulator: port,
            token_uri: format!("{endpoint}/token"),
            trusted: Mutex::new(Vec::new()),
            granted: Mutex::new(Vec::new()),
            refused: AtomicUsize::new(0),
        });
        let front = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let shared = front.clone();
                tokio::spawn(async move {
                    let _ = serve(conn, &shared).await;
                });
            }
        });
        GcsServer {
            child,
            shared,
            task,
            endpoint,
        }
    }

    /// Where keys this server trusts get their tokens.
    pub fn token_uri(&self) -> &str {
        &self.shared.token_uri
    }

    /// A key the token endpoint trusts.
    pub fn service_account(&self, email: &str) -> ServiceAccountKey {
        let key = ServiceAccountKey::generate(email, self.token_uri());
        self.shared
            .trusted
            .lock()
            .expect("lock")
            .push((key.email.clone(), key.public_pem.clone()));
        key
    }

    /// How many tokens the endpoint has granted.
    pub fn tokens_granted(&self) -> usize {
        self.shared.granted.lock().expect("lock").len()
    }

    /// How many object requests were refused for want of a token.
    pub fn refused(&self) -> usize {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Store `data` as `bucket/object`, making the bucket.
    pub async fn put(&self, bucket: &str, object: &str, data: &[u8]) {
        let port = self.shared.emulator;
        let made = format!(r#"{{"name":"{bucket}"}}"#);
        let (status, _) = request(
            port,
            "POST",
            "/storage/v1/b",
            "application/json",
            made.as_bytes(),
        )
        .await
        .expect("making the bucket");
        // 409: it was there already.
        assert!(
            status == 200 || status == 409,
            "making the bucket: {status}"
        );
        let (status, body) = request(
            port,
            "PUT",
            &format!("/{bucket}/{object}"),
            "application/octet-stream",
            data,
        )
        .await
        .expect("storing the object");
        assert_eq!(
            status,
            200,
            "storing the object: {}",
            String::from_utf8_lossy(&body)
        );
    }

    /// The object's `http://` URL.
    pub fn url(&self, bucket: &str, object: &str) -> String {
        format!("{}/{bucket}/{object}", self.endpoint)
    }
}

impl Drop for GcsServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.0 exchange with the emulator: its status and body.
async fn request(
    port: u16,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).await?;
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body).await?;
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await?;
    let status = std::str::from_utf8(&answer[..answer.len().min(12)])
        .ok()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let at = find(&answer, b"\r\n\r\n").map_or(answer.len(), |i| i + 4);
    Ok((status, answer[at..].to_vec()))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

async fn reply(conn: &mut TcpStream, status: &str, json: &str) -> std::io::Result<()> {
    let text = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{json}",
        json.len()
    );
    conn.write_all(text.as_bytes()).await?;
    conn.shutdown().await
}

/// One request per connection: the token endpoint, or an object request passed to the
/// emulator once its token is checked.
async fn serve(mut conn: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 8192];
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = find(&buf, b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or("");
    let mut words = first.split(' ');
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    if method == "POST" && path == "/token" {
        let length: usize = header("content-length")
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            let mut chunk = [0u8; 8192];
            let n = conn.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let form = String::from_utf8_lossy(&buf[head_end..]).into_owned();
        let (status, json) = grant(shared, &form);
        return reply(&mut conn, status, &json).await;
    }
    let public = path.trim_start_matches('/').starts_with("public");
    let token = header("authorization").and_then(|v| v.strip_prefix("Bearer "));
    let granted =
        token.is_some_and(|t| shared.granted.lock().expect("lock").iter().any(|g| g == t));
    if !public && !granted {
        shared.refused.fetch_add(1, Ordering::SeqCst);
        return reply(
            &mut conn,
            "401 Unauthorized",
            r#"{"error":{"code":401,"message":"Anonymous caller does not have storage.objects.get access to the Google Cloud Storage object."}}"#,
        )
        .await;
    }
    // The emulator answers HTTP/1.0 and closes: the request as it came, then its answer.
    let mut upstream = TcpStream::connect(("127.0.0.1", shared.emulator)).await?;
    upstream.write_all(&buf).await?;
    tokio::io::copy_bidirectional(&mut conn, &mut upstream)
        .await
        .map(|_| ())
}

/// Google's answer to a token request: a token for a JWT signed by a trusted key for this
/// endpoint, else `invalid_grant`.
fn grant(shared: &Shared, form: &str) -> (&'static str, String) {
    let field = |name: &str| {
        form.split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    };
    let refuse = |why: &str| {
        (
            "400 Bad Request",
            serde_json::json!({"error": "invalid_grant", "error_description": why}).to_string(),
        )
    };
    if field("grant_type").as_deref()
        != Some("urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer")
    {
        return (
            "400 Bad Request",
            r#"{"error":"unsupported_grant_type","error_description":"Invalid grant_type."}"#
                .into(),
        );
    }
    let Some(jwt) = field("assertion") else {
        return refuse("Missing required parameter: assertion");
    };
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    validation.set_audience(&[&shared.token_uri]);
    validation.set_required_spec_claims(&["exp", "iss", "aud"]);
    let trusted = shared.trusted.lock().expect("lock").clone();
    let verified = trusted.iter().find_map(|(email, pem)| {
        let key = jsonwebtoken::DecodingKey::from_rsa_pem(pem.as_bytes()).ok()?;
        let data = jsonwebtoken::decode::<serde_json::Value>(&jwt, &key, &validation).ok()?;
        (data.claims["iss"] == email.as_str()).then_some(data.claims)
    });
    let Some(claims) = verified else {
        return refuse("Invalid JWT Signature.");
    };
    if !claims["scope"]
        .as_str()
        .is_some_and(|s| s.split(' ').any(|s| s.contains("devstorage")))
    {
        return refuse("Invalid OAuth scope or ID token audience provided.");
    }
    let token = format!("ya29.test-{:x}", rand_id());
    shared.granted.lock().expect("lock").push(token.clone());
    (
        "200 OK",
        serde_json::json!({"access_token": token, "expires_in": 3599, "token_type": "Bearer"})
            .to_string(),
    )
}
