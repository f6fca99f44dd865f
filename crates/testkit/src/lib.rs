//! Test servers that are real: TCP on 127.0.0.1, real HTTP/1.1 framing, real TLS. Each fault a
//! test needs (no range support, redirects, auth, a connection dropped mid-body, a stall, a lying
//! Content-Length) is a setting, so tests cause the fault for real instead of mocking a client.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

pub mod gcs;
pub mod oci;
pub mod registry;
pub mod s3;

/// One served file and how the server misbehaves.
#[derive(Debug, Clone, Default)]
pub struct Behaviour {
    /// Answer `Range` requests with 206 (otherwise the whole body with 200, and no Accept-Ranges).
    pub ranges: bool,
    /// `Authorization: Basic` credentials required (401 otherwise).
    pub basic_auth: Option<(String, String)>,
    /// Headers every request must carry (400 otherwise), as "Name: value".
    pub required_headers: Vec<(String, String)>,
    /// Close the connection after this many body bytes, on the first `times` responses.
    pub drop_after: Option<(u64, usize)>,
    /// Stop sending for this long after this many body bytes, on the first response that gets
    /// that far.
    pub stall_after: Option<(u64, Duration)>,
    /// Announce this Content-Length but send the real body.
    pub lie_content_length: Option<u64>,
    /// Do not answer HEAD (405), as some servers do.
    pub no_head: bool,
    /// Wait this long before every response body: a slow server.
    pub delay_body: Option<Duration>,
    /// Leave out `Connection: close` yet serve one request per connection, closing it a moment
    /// after the response: a keep-alive connection the client reuses just as the server drops it.
    pub close_silently: bool,
}

/// What the server saw, for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub status: u16,
    /// Body bytes actually sent.
    pub sent: u64,
    /// The request came through as a proxy request (`GET http://host/path`).
    pub proxied: bool,
}

/// What a path serves: bytes in memory, or a file read as requested (for large images).
#[derive(Clone)]
enum Body {
    Memory(Arc<Vec<u8>>),
    File(Arc<std::fs::File>, u64),
    /// [`generated`] bytes of this length, made as they are sent (images larger than memory).
    Generated(u64),
}

/// Generated image content at `offset`: every 4 KiB block non-zero (nothing becomes a hole),
/// starting with its own index, so a block written in the wrong place shows.
pub fn generated(offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut at = offset;
    while out.len() < len {
        let block = at / 4096;
        let mut content = [(block % 251) as u8 + 1; 4096];
        content[..8].copy_from_slice(&(block + 1).to_le_bytes());
        let from = (at % 4096) as usize;
        let n = (4096 - from).min(len - out.len());
        out.extend_from_slice(&content[from..from + n]);
        at += n as u64;
    }
    out
}

impl Body {
    fn len(&self) -> u64 {
        match self {
            Body::Memory(d) => d.len() as u64,
            Body::File(_, len) => *len,
            Body::Generated(len) => *len,
        }
    }

    fn chunk(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        match self {
            Body::Memory(d) => Ok(d[offset as usize..offset as usize + len].to_vec()),
            Body::File(f, _) => {
                let mut buf = vec![0u8; len];
                std::os::unix::fs::FileExt::read_exact_at(f.as_ref(), &mut buf, offset)?;
                Ok(buf)
            }
            Body::Generated(_) => Ok(generated(offset, len)),
        }
    }
}

#[derive(Default)]
struct State {
    files: HashMap<String, (Body, Behaviour)>,
    redirects: HashMap<String, String>,
    log: Vec<Logged>,
    drops_done: usize,
    stalls_done: usize,
}

/// TLS material: a test CA and a server certificate for 127.0.0.1 and localhost.
pub struct TestCa {
    pub ca_pem: String,
    cert_der: Vec<u8>,
    key_der: Vec<u8>,
    /// The server certificate and its key in PEM, for servers configured by file.
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new() -> TestCa {
        let ca_key = rcgen::KeyPair::generate().expect("a CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "cdi-rs test CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("a CA certificate");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().expect("a server key");
        let params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .expect("params");
        let cert = params
            .signed_by(&key, &issuer)
            .expect("a server certificate");
        TestCa {
            ca_pem: ca_cert.pem(),
            cert_der: cert.der().to_vec(),
            key_der: key.serialize_der(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(self.cert_der.clone())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone())),
        )
        .expect("a server config");
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

/// A file server on 127.0.0.1; stops when dropped.
pub struct FileServer {
    addr: SocketAddr,
    tls: bool,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl FileServer {
    /// Start on an ephemeral port, plain HTTP or TLS with `ca`'s server certificate.
    pub async fn start(ca: Option<&TestCa>) -> FileServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(State::default()));
        let acceptor = ca.map(TestCa::acceptor);
        let s = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = s.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match acceptor {
                        Some(a) => {
                            if let Ok(tls) = a.accept(stream).await {
                                let _ = serve(tls, state).await;
                            }
                        }
                        None => {
                            let _ = serve(stream, state).await;
                        }
                    }
                });
            }
        });
        FileServer {
            addr,
            tls: ca.is_some(),
            state,
            task,
        }
    }

    /// Serve `data` at `path` with `behaviour`.
    pub fn add(&self, path: &str, data: Vec<u8>, behaviour: Behaviour) {
        self.state
            .lock()
            .unwrap()
            .files
            .insert(path.to_string(), (Body::Memory(Arc::new(data)), behaviour));
    }

    /// Serve the file at `file` (read on demand, so it may be large) at `path`.
    pub fn add_file(
        &self,
        path: &str,
        file: &std::path::Path,
        behaviour: Behaviour,
    ) -> std::io::Result<()> {
        let f = std::fs::File::open(file)?;
        let len = f.metadata()?.len();
        self.state
            .lock()
            .unwrap()
            .files
            .insert(path.to_string(), (Body::File(Arc::new(f), len), behaviour));
        Ok(())
    }

    /// Serve `len` bytes of [`generated`] content at `path`.
    pub fn add_generated(&self, path: &str, len: u64, behaviour: Behaviour) {
        self.state
            .lock()
            .unwrap()
            .files
            .insert(path.to_string(), (Body::Generated(len), behaviour));
    }

    /// Answer `from` with a 302 to `to`.
    pub fn redirect(&self, from: &str, to: &str) {
        self.state
            .lock()
            .unwrap()
            .redirects
            .insert(from.to_string(), to.to_string());
    }

    pub fn url(&self, path: &str) -> String {
        format!(
            "{}://{}{}",
            if self.tls { "https" } else { "http" },
            self.addr,
            path
        )
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Logged> {
        self.state.lock().unwrap().log.clone()
    }

    /// Body bytes sent in all responses so far.
    pub fn bytes_sent(&self) -> u64 {
        self.log().iter().map(|l| l.sent).sum()
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn basic(user: &str, pass: &str) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let input = format!("{user}:{pass}");
    let bytes = input.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    format!("Basic {out}")
}

/// Serve one request on `stream` (one request per connection), logging it in `state`.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    state: Arc<Mutex<State>>,
) -> std::io::Result<()> {
    let Some(head) = read_head(&mut stream).await? else {
        return Ok(());
    };
    let request = Request::parse(&head);
    let mut log = Logged {
        method: request.method.clone(),
        path: request.path.clone(),
        range: request.header("range"),
        status: 0,
        sent: 0,
        proxied: request.proxied,
    };
    let finish = |log: Logged| state.lock().unwrap().log.push(log);
    let answer = route(&state, &request).and_then(|(data, behaviour)| {
        let (status, start, end) = byte_range(log.range.as_deref(), &behaviour, data.len())?;
        Ok((data, behaviour, status, start, end))
    });
    let (data, behaviour, status, start, end) = match answer {
        Ok(served) => served,
        Err(refusal) => {
            log.status = refusal.status;
            stream.write_all(refusal.response().as_bytes()).await?;
            finish(log);
            return Ok(());
        }
    };
    let head = response_head(status, start, end, data.len(), &behaviour);
    stream.write_all(head.as_bytes()).await?;
    log.status = status;
    if request.method == "HEAD" {
        finish(log);
        if behaviour.close_silently {
            stream.flush().await?;
            // The client takes the connection back into its pool meanwhile.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        return Ok(());
    }
    if let Some(d) = behaviour.delay_body {
        tokio::time::sleep(d).await;
    }
    let faults = faults_for(&state, &behaviour, end - start);
    let (sent, result) = send_body(&mut stream, &data, start, end, faults, &state).await?;
    let _ = stream.flush().await;
    let _ = stream.shutdown().await;
    log.sent = sent;
    finish(log);
    result
}

/// Read the request head up to its blank line; `None` when there is nothing to answer (the
/// client left, the head is too long, or it was not HTTP and has been refused).
async fn read_head<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await? == 0 || head.len() > 16384 {
            return Ok(None);
        }
        head.push(byte[0]);
        // Not HTTP (a TLS handshake to a plain server): refused at once, as nginx does.
        if !byte[0].is_ascii() {
            stream
                .write_all(
                    b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                )
                .await?;
            stream.shutdown().await?;
            return Ok(None);
        }
    }
    Ok(Some(head))
}

/// A request as the server reads it.
struct Request {
    method: String,
    path: String,
    /// Asked as an HTTP proxy, with an absolute URI.
    proxied: bool,
    /// Names in lower case.
    headers: Vec<(String, String)>,
}

impl Request {
    fn parse(head: &[u8]) -> Request {
        let text = String::from_utf8_lossy(head).to_string();
        let mut lines = text.split("\r\n");
        let mut first = lines.next().unwrap_or("").split(' ');
        let method = first.next().unwrap_or("").to_string();
        let target = first.next().unwrap_or("").to_string();
        // As an HTTP proxy, the server gets absolute URIs; it serves them from its own files.
        let (path, proxied) = match target.strip_prefix("http://") {
            Some(rest) => (
                rest.find('/')
                    .map(|i| rest[i..].to_string())
                    .unwrap_or_else(|| "/".into()),
                true,
            ),
            None => (target.clone(), false),
        };
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Request {
            method,
            path,
            proxied,
            headers,
        }
    }

    /// The value of the header `name` (lower case).
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

/// A response without a body.
struct Refusal {
    status: u16,
    reason: &'static str,
    /// Header lines, each ending in CRLF.
    extra: String,
}

impl Refusal {
    fn new(status: u16, reason: &'static str, extra: impl Into<String>) -> Refusal {
        Refusal {
            status,
            reason,
            extra: extra.into(),
        }
    }

    fn response(&self) -> String {
        let Refusal {
            status,
            reason,
            extra,
        } = self;
        format!(
            "HTTP/1.1 {status} {reason}\r\nConnection: close\r\n{extra}Content-Length: 0\r\n\r\n"
        )
    }
}

/// The file the request gets, or why it gets none: a redirect, no such path, missing
/// credentials or headers, or a HEAD the file's server does not answer.
fn route(state: &Mutex<State>, request: &Request) -> Result<(Body, Behaviour), Refusal> {
    let (file, redirect) = {
        let st = state.lock().unwrap();
        (
            st.files.get(&request.path).cloned(),
            st.redirects.get(&request.path).cloned(),
        )
    };
    if let Some(to) = redirect {
        return Err(Refusal::new(302, "Found", format!("Location: {to}\r\n")));
    }
    let Some((data, behaviour)) = file else {
        return Err(Refusal::new(404, "Not Found", ""));
    };
    if let Some((user, pass)) = &behaviour.basic_auth
        && request.header("authorization").as_deref() != Some(basic(user, pass).as_str())
    {
        return Err(Refusal::new(
            401,
            "Unauthorized",
            "WWW-Authenticate: Basic realm=\"cdi\"\r\n",
        ));
    }
    for (name, value) in &behaviour.required_headers {
        if request.header(&name.to_ascii_lowercase()).as_deref() != Some(value.as_str()) {
            return Err(Refusal::new(400, "Bad Request", ""));
        }
    }
    if request.method == "HEAD" && behaviour.no_head {
        return Err(Refusal::new(405, "Method Not Allowed", ""));
    }
    Ok((data, behaviour))
}

/// The status and the byte range `[start, end)` of a body of `total` bytes that a `Range`
/// header asks for (honoured only when the file serves ranges); 416 past the end.
fn byte_range(
    range: Option<&str>,
    behaviour: &Behaviour,
    total: u64,
) -> Result<(u16, u64, u64), Refusal> {
    match range.and_then(|r| r.strip_prefix("bytes=")) {
        Some(spec) if behaviour.ranges => {
            let (a, b) = spec.split_once('-').unwrap_or((spec, ""));
            let start: u64 = a.parse().unwrap_or(0);
            let end: u64 = if b.is_empty() {
                total.saturating_sub(1)
            } else {
                b.parse::<u64>().unwrap_or(0).min(total.saturating_sub(1))
            };
            if start >= total {
                return Err(Refusal::new(
                    416,
                    "Range Not Satisfiable",
                    format!("Content-Range: bytes */{total}\r\n"),
                ));
            }
            Ok((206, start, end + 1))
        }
        _ => Ok((200, 0, total)),
    }
}

/// The head of a response carrying bytes `[start, end)` of a body of `total` bytes.
fn response_head(status: u16, start: u64, end: u64, total: u64, behaviour: &Behaviour) -> String {
    let mut extra = String::new();
    if behaviour.ranges {
        extra.push_str("Accept-Ranges: bytes\r\n");
    }
    if status == 206 {
        extra.push_str(&format!(
            "Content-Range: bytes {start}-{}/{total}\r\n",
            end - 1
        ));
    }
    let length = behaviour.lie_content_length.unwrap_or(end - start);
    let reason = if status == 206 {
        "Partial Content"
    } else {
        "OK"
    };
    let connection = if behaviour.close_silently {
        ""
    } else {
        "Connection: close\r\n"
    };
    format!(
        "HTTP/1.1 {status} {reason}\r\n{connection}Content-Type: application/octet-stream\r\n{extra}Content-Length: {length}\r\n\r\n"
    )
}

/// Where a body is cut short: dropped after so many bytes, or stalled after so many for a
/// while.
#[derive(Clone, Copy)]
struct Faults {
    drop_at: Option<u64>,
    stall_at: Option<(u64, Duration)>,
}

/// The faults a body of `body_len` bytes meets. Faults apply only to responses long enough to
/// hit them (not to probes).
fn faults_for(state: &Mutex<State>, behaviour: &Behaviour, body_len: u64) -> Faults {
    let mut st = state.lock().unwrap();
    let mut drop_at = None;
    if let Some((n, times)) = behaviour.drop_after
        && body_len > n
        && st.drops_done < times
    {
        st.drops_done += 1;
        drop_at = Some(n);
    }
    // Counted when it happens: a probe the client hangs up on early does not use it.
    let mut stall_at = None;
    if let Some((n, d)) = behaviour.stall_after
        && body_len > n
        && st.stalls_done == 0
    {
        stall_at = Some((n, d));
    }
    Faults { drop_at, stall_at }
}

/// Send bytes `[start, end)` of `data` in chunks, meeting `faults` on the way; the bytes sent
/// and how sending ended. A body that cannot be read is an error of the server itself: the
/// request goes unlogged.
async fn send_body<S: AsyncWrite + Unpin>(
    stream: &mut S,
    data: &Body,
    start: u64,
    end: u64,
    faults: Faults,
    state: &Mutex<State>,
) -> std::io::Result<(u64, std::io::Result<()>)> {
    let Faults { drop_at, stall_at } = faults;
    let mut sent = 0u64;
    let mut offset = start;
    while offset < end {
        let mut n = (end - offset).min(256 * 1024);
        let stop = drop_at.is_some_and(|d| sent + n > d);
        if let Some(d) = drop_at
            && stop
        {
            n = d - sent;
        }
        if let Some((s, d)) = stall_at
            && sent + n > s
            && sent <= s
        {
            let first = {
                let mut st = state.lock().unwrap();
                st.stalls_done += 1;
                st.stalls_done == 1
            };
            if first {
                tokio::time::sleep(d).await;
            }
        }
        let chunk = data.chunk(offset, n as usize)?;
        if let Err(e) = stream.write_all(&chunk).await {
            return Ok((sent, Err(e)));
        }
        sent += n;
        offset += n;
        if stop {
            break;
        }
    }
    Ok((sent, Ok(())))
}

#[cfg(test)]
mod tests {
    use super::basic;

    #[test]
    fn basic_auth_header() {
        assert_eq!(
            basic("Aladdin", "open sesame"),
            "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        assert_eq!(basic("a", "b"), "Basic YTpi");
    }
}

/// Disk images for tests, generated at test time.
pub mod images {
    use std::path::Path;
    use std::process::Command;

    /// Deterministic image content: runs of random data, runs of zeros, sparse blocks, and data
    /// up to the last byte, so every conversion path (holes, partial clusters) is exercised.
    pub fn pattern(size: u64) -> Vec<u8> {
        let mut data = vec![0u8; size as usize];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut offset = 0usize;
        while offset < data.len() {
            let run = (next() % (256 * 1024)) as usize + 512;
            let end = (offset + run).min(data.len());
            match next() % 4 {
                0 | 1 => data[offset..end].iter_mut().for_each(|b| *b = next() as u8),
                2 => data[offset..end]
                    .iter_mut()
                    .step_by(4096)
                    .for_each(|b| *b = 0xa5),
                _ => {}
            }
            offset = end;
        }
        let tail = data.len().saturating_sub(100);
        data[tail..].fill(0x5a);
        data
    }

    /// Run `qemu-img` with `args`, panicking with its stderr on failure.
    pub fn qemu_img(args: &[&str]) {
        let out = Command::new("qemu-img")
            .args(args)
            .output()
            .expect("qemu-img runs (install qemu-utils)");
        assert!(
            out.status.success(),
            "qemu-img {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Convert a raw file to `format` with extra `-o`-style arguments.
    pub fn convert(src: &Path, format: &str, extra: &[&str], dst: &Path) {
        let mut args = vec!["convert", "-f", "raw", "-O", format];
        args.extend_from_slice(extra);
        let (s, d) = (
            src.to_str().expect("utf-8 path"),
            dst.to_str().expect("utf-8 path"),
        );
        args.push(s);
        args.push(d);
        qemu_img(&args);
    }

    /// qemu-img's raw conversion of `image` (the oracle).
    pub fn oracle(image: &Path, format: &str) -> Vec<u8> {
        let out = image.with_extension("oracle");
        qemu_img(&[
            "convert",
            "-f",
            format,
            "-O",
            "raw",
            image.to_str().expect("utf-8"),
            out.to_str().expect("utf-8"),
        ]);
        let data = std::fs::read(&out).expect("oracle output");
        let _ = std::fs::remove_file(out);
        data
    }

    /// Assert two images are equal, naming the first differing byte instead of dumping them.
    pub fn assert_same(actual: &[u8], expected: &[u8], what: &str) {
        assert_eq!(actual.len(), expected.len(), "{what}: length");
        if let Some(i) = actual.iter().zip(expected).position(|(a, b)| a != b) {
            panic!("{what}: first difference at byte {i}");
        }
    }
}
