//! HTTP(S) sources: probing, range reads for random access, and a sequential stream, both
//! resuming a broken transfer with a range request from the last byte received.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE, RANGE};
use tokio::sync::mpsc;

use crate::buffer::Buffer;
use crate::error::ImportError;
use crate::sources::source::{Opened, RangeReader, Source};

/// Where and how to fetch.
#[derive(Clone, Default)]
pub struct HttpSource {
    pub url: String,
    /// Basic auth (`accessKeyId`/`secretKey` of the DataVolume's secret).
    pub basic_auth: Option<(String, String)>,
    /// Extra headers; their values may be secrets and are never logged.
    pub headers: Vec<(String, String)>,
    /// PEM certificates to trust besides the system roots (`IMPORTER_CERT_DIR`).
    pub ca_certs_pem: Vec<Vec<u8>>,
    /// Skip TLS verification (`insecureSkipVerify`).
    pub insecure: bool,
    pub retry: RetryPolicy,
    /// Signs every request (an S3 object's SigV4 headers).
    pub signer: Option<Arc<dyn Signer>>,
}

/// What a source that authenticates each request adds to it.
pub trait Signer: Send + Sync {
    /// The headers that authenticate a `method` request for `url` (their values are secrets).
    fn headers(&self, method: &str, url: &str) -> Result<Vec<(String, String)>, ImportError>;

    /// Called before each request: a signer that holds an expiring credential (an OAuth token)
    /// gets or renews it here. Most need nothing.
    fn ready(&self) -> BoxFuture<'_, Result<(), ImportError>> {
        Box::pin(async { Ok(()) })
    }
}

impl std::fmt::Debug for HttpSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSource")
            .field("url", &redact(&self.url))
            .field(
                "basic_auth",
                &self.basic_auth.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "headers",
                &self
                    .headers
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("insecure", &self.insecure)
            .field("signed", &self.signer.is_some())
            .finish()
    }
}

impl Source for HttpSource {
    fn name(&self) -> String {
        redact(&self.url)
    }

    fn open(&self) -> BoxFuture<'_, Result<Opened, ImportError>> {
        Box::pin(async move {
            let client = HttpClient::new(self.clone())?;
            let info = client.info().await?;
            let reader: Option<Arc<dyn RangeReader>> = match info.len {
                Some(len) if info.ranges => Some(Arc::new(HttpReader::new(client.clone(), len))),
                _ => None,
            };
            Ok(Opened {
                size: info.len,
                reader,
                stream: Box::new(move |depth| Ok(Box::new(stream(client, info, depth)))),
            })
        })
    }
}

/// How broken transfers are retried.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts after the first, per request.
    pub retries: u32,
    /// The first backoff; it doubles after each failure.
    pub backoff: Duration,
    /// No data for this long counts as a broken connection.
    pub stall: Duration,
    pub connect: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries: 5,
            backoff: Duration::from_millis(500),
            stall: Duration::from_secs(60),
            connect: Duration::from_secs(30),
        }
    }
}

/// A URL without credentials, for messages.
pub fn redact(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        Err(_) => url.to_string(),
    }
}

/// What the server told about the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpInfo {
    pub len: Option<u64>,
    /// The server answered a range request with 206.
    pub ranges: bool,
}

/// A configured client for one source.
#[derive(Clone)]
pub struct HttpClient {
    client: reqwest::Client,
    source: Arc<HttpSource>,
}

fn http_error(url: &str, status: StatusCode) -> ImportError {
    ImportError::Http {
        url: redact(url),
        status: Some(status.as_u16()),
        message: format!("HTTP {status}"),
    }
}

/// A transfer that broke without an HTTP status.
fn broken(url: &str, message: String) -> ImportError {
    ImportError::Http {
        url: redact(url),
        status: None,
        message,
    }
}

fn transport_error(url: &str, err: reqwest::Error) -> ImportError {
    // reqwest's Display names the URL; rebuild the message without credentials.
    let err = err.without_url();
    let mut message = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    broken(url, message)
}

/// `builder` trusting the system roots and `ca_certs_pem` (PEM bundles), or, when `insecure`,
/// any certificate.
pub(crate) fn trusting(
    mut builder: reqwest::ClientBuilder,
    ca_certs_pem: &[Vec<u8>],
    insecure: bool,
) -> Result<reqwest::ClientBuilder, ImportError> {
    let mut extra = Vec::new();
    for pem in ca_certs_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| {
            ImportError::Unsupported(format!(
                "a certificate in the CA directory is not valid PEM: {e}"
            ))
        })?;
        extra.extend(certs);
    }
    if !extra.is_empty() {
        builder = builder.tls_certs_merge(extra);
    }
    if insecure {
        builder = builder.tls_danger_accept_invalid_certs(true);
    }
    Ok(builder)
}

impl HttpClient {
    pub fn new(source: HttpSource) -> Result<HttpClient, ImportError> {
        // Both would be sent, and which one the server believes is up to it.
        if source.basic_auth.is_some()
            && source
                .headers
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case("authorization"))
        {
            return Err(ImportError::Unsupported(
                "both a user name and password (basic auth) and an Authorization header are \
                 given; keep one of them"
                    .into(),
            ));
        }
        let builder = reqwest::Client::builder()
            .connect_timeout(source.retry.connect)
            .read_timeout(source.retry.stall)
            .redirect(reqwest::redirect::Policy::limited(10));
        let builder = trusting(builder, &source.ca_certs_pem, source.insecure)?;
        let client = builder
            .build()
            .map_err(|e| ImportError::Internal(format!("building the HTTP client: {e}")))?;
        Ok(HttpClient {
            client,
            source: Arc::new(source),
        })
    }

    pub fn url(&self) -> &str {
        &self.source.url
    }

    fn request(&self, method: reqwest::Method, range: Option<String>) -> reqwest::RequestBuilder {
        let method_name = method.to_string();
        let mut req = self
            .client
            .request(method, &self.source.url)
            .header(ACCEPT_ENCODING, "identity");
        if let Some((user, pass)) = &self.source.basic_auth {
            req = req.basic_auth(user, Some(pass));
        }
        for (name, value) in &self.source.headers {
            req = req.header(name.as_str(), value.as_str());
        }
        if let Some(signer) = &self.source.signer {
            // Signing was tried when the source was made: it cannot fail for this URL now, and
            // a request without it is refused by the server (the import then says so).
            match signer.headers(&method_name, &self.source.url) {
                Ok(headers) => {
                    for (name, value) in headers {
                        req = req.header(name, value);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "signing the request failed"),
            }
        }
        if let Some(range) = range {
            req = req.header(RANGE, range);
        }
        req
    }

    async fn signer_ready(&self) -> Result<(), ImportError> {
        match &self.source.signer {
            Some(signer) => signer.ready().await,
            None => Ok(()),
        }
    }

    /// Send a request; again, on a fresh connection, when a connection broke under it (a
    /// kept-alive connection the server has just closed) or it was answered 408, 429 or 5xx,
    /// within the transfer's retry budget. Other answers are returned.
    async fn send(
        &self,
        method: reqwest::Method,
        range: Option<String>,
    ) -> Result<reqwest::Response, ImportError> {
        let mut attempt = 0;
        loop {
            self.signer_ready().await?;
            let err = match self.request(method.clone(), range.clone()).send().await {
                Ok(resp) if !crate::error::retryable_status(resp.status().as_u16()) => {
                    return Ok(resp);
                }
                Ok(resp) => http_error(resp.url().as_str(), resp.status()),
                // No connection, or no answer in time: said at once (the pod is restarted;
                // `cdi import` should not take minutes to say a host is wrong).
                Err(e) if e.is_connect() || e.is_timeout() => {
                    return Err(transport_error(self.url(), e));
                }
                Err(e) => transport_error(self.url(), e),
            };
            if attempt >= self.source.retry.retries {
                return Err(err);
            }
            attempt += 1;
            tracing::warn!(%method, attempt, error = %err, "request failed; trying again");
            self.backoff(attempt).await;
        }
    }

    /// Probe size and range support: HEAD, then a one-byte range GET (the only reliable test of
    /// range support).
    pub async fn info(&self) -> Result<HttpInfo, ImportError> {
        let mut len = None;
        self.signer_ready().await?;
        // Only a hint (many servers answer HEAD badly): one attempt.
        if let Ok(resp) = self.request(reqwest::Method::HEAD, None).send().await
            && resp.status().is_success()
        {
            len = resp
                .headers()
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
        }
        let resp = self
            .send(reqwest::Method::GET, Some("bytes=0-0".into()))
            .await?;
        let status = resp.status();
        if status == StatusCode::PARTIAL_CONTENT {
            let total = resp
                .headers()
                .get(CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.rsplit_once('/'))
                .and_then(|(_, t)| t.parse().ok());
            return Ok(HttpInfo {
                len: total.or(len),
                ranges: total.is_some(),
            });
        }
        // The one-byte probe of an empty file is not satisfiable: that is its answer.
        let empty = resp
            .headers()
            .get(CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() == "bytes */0");
        if status == StatusCode::RANGE_NOT_SATISFIABLE && empty {
            return Ok(HttpInfo {
                len: Some(0),
                ranges: false,
            });
        }
        if !status.is_success() {
            return Err(http_error(resp.url().as_str(), status));
        }
        let len = len.or_else(|| resp.content_length());
        Ok(HttpInfo { len, ranges: false })
    }

    /// GET `bytes=start-` (or from 0 without ranges) and check the server honoured it.
    async fn open_at(
        &self,
        start: u64,
        end: Option<u64>,
        ranges: bool,
    ) -> Result<reqwest::Response, ImportError> {
        let url = self.url();
        let range = ranges.then(|| match end {
            Some(e) => format!("bytes={start}-{}", e - 1),
            None => format!("bytes={start}-"),
        });
        let resp = self.send(reqwest::Method::GET, range).await?;
        let status = resp.status();
        if !status.is_success() {
            return Err(http_error(resp.url().as_str(), status));
        }
        if ranges {
            let begins = resp
                .headers()
                .get(CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("bytes "))
                .and_then(|v| v.split_once('-'))
                .and_then(|(a, _)| a.parse::<u64>().ok());
            if status != StatusCode::PARTIAL_CONTENT || begins != Some(start) {
                return Err(broken(
                    url,
                    format!(
                        "asked for bytes from {start}, the server answered {status} without that range"
                    ),
                ));
            }
        }
        Ok(resp)
    }

    async fn backoff(&self, attempt: u32) {
        tokio::time::sleep(self.source.retry.backoff * 2u32.saturating_pow(attempt.min(6))).await;
    }
}

/// Random access over range requests.
pub struct HttpReader {
    client: HttpClient,
    len: u64,
}

impl HttpReader {
    /// A reader for a server that supports ranges and told the length.
    pub fn new(client: HttpClient, len: u64) -> Self {
        HttpReader { client, len }
    }
}

impl RangeReader for HttpReader {
    fn size(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, len: usize) -> BoxFuture<'_, Result<Bytes, ImportError>> {
        Box::pin(async move {
            let end = (offset + len as u64).min(self.len);
            let want = (end - offset) as usize;
            let mut buf = Buffer::with_len(want)
                .map_err(|e| ImportError::io("allocating a transfer buffer", e))?;
            let mut got = 0usize;
            let mut attempt = 0;
            while got < want {
                let from = offset + got as u64;
                let before = got;
                let result = async {
                    let mut body = self
                        .client
                        .open_at(from, Some(end), true)
                        .await?
                        .bytes_stream();
                    while let Some(chunk) = body.next().await {
                        let chunk = chunk.map_err(|e| transport_error(self.client.url(), e))?;
                        let n = chunk.len().min(want - got);
                        buf.bytes_mut()[got..got + n].copy_from_slice(&chunk[..n]);
                        got += n;
                    }
                    Ok::<_, ImportError>(())
                }
                .await;
                if got >= want {
                    break;
                }
                let err = match result {
                    Err(e) => e,
                    Ok(()) => broken(self.client.url(), "the response ended early".into()),
                };
                // The budget is for breaks in a row: a server that cuts every answer short but
                // sends something each time still gets the whole range.
                if got > before {
                    attempt = 0;
                }
                if attempt >= self.client.source.retry.retries || !err.is_retryable() {
                    return Err(err);
                }
                attempt += 1;
                tracing::warn!(offset = offset + got as u64, attempt, error = %err, "transfer broke; resuming with a range request");
                self.client.backoff(attempt).await;
            }
            Ok(buf.freeze())
        })
    }
}

/// The whole source as a sequential stream, resumed with range requests when the server
/// supports them. Runs on the runtime; read it from a blocking thread via [`StreamReader`].
pub fn stream(client: HttpClient, info: HttpInfo, depth: usize) -> StreamReader {
    let (tx, rx) = mpsc::channel::<Result<Bytes, ImportError>>(depth);
    tokio::spawn(async move {
        let mut pos = 0u64;
        let mut attempt = 0;
        loop {
            let before = pos;
            let result = async {
                let mut body = client
                    .open_at(pos, None, info.ranges && pos > 0)
                    .await?
                    .bytes_stream();
                while let Some(chunk) = body.next().await {
                    let chunk = chunk.map_err(|e| transport_error(client.url(), e))?;
                    pos += chunk.len() as u64;
                    if tx.send(Ok(chunk)).await.is_err() {
                        return Ok(());
                    }
                }
                Ok::<_, ImportError>(())
            }
            .await;
            let err = match result {
                Ok(()) if info.len.is_none_or(|l| pos >= l) => return,
                Ok(()) => broken(
                    client.url(),
                    format!(
                        "the response ended at {pos} of {} bytes",
                        info.len.unwrap_or(0)
                    ),
                ),
                Err(e) => e,
            };
            if pos > before {
                attempt = 0;
            }
            if !info.ranges || attempt >= client.source.retry.retries || !err.is_retryable() {
                let _ = tx.send(Err(err)).await;
                return;
            }
            attempt += 1;
            tracing::warn!(offset = pos, attempt, error = %err, "transfer broke; resuming with a range request");
            client.backoff(attempt).await;
        }
    });
    StreamReader::new(rx, None)
}

/// A blocking `Read` over the chunks a download task sends. A transfer error reaches the reader
/// as the io::Error's inner error, an [`ImportError`], so that it is reported as what it is
/// (see [`ImportError::from_read`]) rather than as damage to the image.
pub struct StreamReader {
    rx: mpsc::Receiver<Result<Bytes, ImportError>>,
    current: Bytes,
    /// Told once the reader met the end of the stream.
    at_end: Option<tokio::sync::oneshot::Sender<()>>,
}

impl StreamReader {
    pub(crate) fn new(
        rx: mpsc::Receiver<Result<Bytes, ImportError>>,
        at_end: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> StreamReader {
        StreamReader {
            rx,
            current: Bytes::new(),
            at_end,
        }
    }
}

impl Read for StreamReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(e)) => return Err(std::io::Error::other(e)),
                None => {
                    if let Some(told) = self.at_end.take() {
                        let _ = told.send(());
                    }
                    return Ok(0);
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}
