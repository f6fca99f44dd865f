//! The upload server (`cdi upload-server`, upstream's cdi-uploadserver): one per upload claim,
//! behind the upload proxy. It takes exactly one upload over mutual TLS and writes it through the
//! importer's pipeline (formats, compression, resize to the claim, sparse writes, preallocation),
//! streaming: the body is never held in memory. Then it ends, and its termination message says
//! how.
//!
//! Upstream's contract: a POST only (else 404), from a client whose verified certificate has the
//! common name `CLIENT_NAME` (else 401); one upload at a time (503) and none after one succeeded
//! (409); sync endpoints answer once the image is complete, async ones once the body is taken in;
//! a failed upload can be sent again. Beyond upstream, the pod has no scratch space until it
//! asks for it: an image that needs it is answered 503 and the server ends saying so.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use cdi_core::Quantity;
use cdi_core::size::{Overhead, VolumeMode};
use cdi_importer::ImportError;
use cdi_importer::clone::ClonePacking;
use cdi_importer::convert::{Progress, Tuning};
use cdi_importer::import::{ImportOptions, SizeSpec};
use cdi_importer::pod::PodPaths;
use cdi_importer::sources::stream;
use futures::{Stream, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::Notify;

/// The server's TLS material (PEM): cdi-pki's, named here for the server's callers.
pub use cdi_pki::tls::Tls;
use cdi_pki::tls::tls_config;

/// The port upstream's upload server listens on.
pub const PORT: u16 = 8443;
/// The client common name the controller gives upload pods (the upload proxy's certificate).
pub const UPLOAD_CLIENT_NAME: &str = "client.upload-server.cdi.kubevirt.io";
pub const HEALTHZ: &str = "/healthz";
/// The header a clone source sets to say how its stream is packed.
pub const CONTENT_TYPE_HEADER: &str = "x-cdi-content-type";

/// What an upload endpoint does with the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// The body is the image; answer once it is complete.
    Sync,
    /// The body is the image; answer once it is taken in, finish in the background.
    Async,
    /// The body is a tar archive unpacked onto the Filesystem volume.
    Archive,
    /// A multipart form whose part `file` is the image; answer once complete.
    Form,
    /// A multipart form, answered as [`Endpoint::Async`].
    FormAsync,
}

impl Endpoint {
    /// The endpoint a path names (upstream's v1beta1 paths and their v1alpha1 aliases).
    pub fn of(path: &str) -> Option<Endpoint> {
        let rest = path
            .strip_prefix("/v1beta1/")
            .or_else(|| path.strip_prefix("/v1alpha1/"))?;
        Some(match rest {
            "upload" => Endpoint::Sync,
            "upload-async" => Endpoint::Async,
            "upload-archive" => Endpoint::Archive,
            "upload-form" => Endpoint::Form,
            "upload-form-async" => Endpoint::FormAsync,
            _ => return None,
        })
    }

    fn is_async(self) -> bool {
        matches!(self, Endpoint::Async | Endpoint::FormAsync)
    }

    fn is_form(self) -> bool {
        matches!(self, Endpoint::Form | Endpoint::FormAsync)
    }
}

/// Every path the upload server (and the proxy in front of it) serves uploads on.
pub const UPLOAD_PATHS: [&str; 10] = [
    "/v1beta1/upload",
    "/v1alpha1/upload",
    "/v1beta1/upload-async",
    "/v1alpha1/upload-async",
    "/v1beta1/upload-archive",
    "/v1alpha1/upload-archive",
    "/v1beta1/upload-form",
    "/v1alpha1/upload-form",
    "/v1beta1/upload-form-async",
    "/v1alpha1/upload-form-async",
];

/// How the server runs (upstream's environment).
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub tls: Tls,
    /// The common name the client's certificate must carry.
    pub client_name: String,
    /// The claim's request in bytes (`UPLOAD_IMAGE_SIZE`).
    pub image_size: Option<u64>,
    pub overhead: Overhead,
    pub preallocation: bool,
    /// When the server gives up waiting for an upload (its certificate is due for renewal).
    pub deadline: Option<SystemTime>,
    pub paths: PodPaths,
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Config(String),
    #[error("{context}: {error}")]
    Io {
        context: String,
        error: std::io::Error,
    },
    /// An async upload failed after it was answered.
    #[error("the upload failed after it was accepted: {0}")]
    Upload(String),
}

fn config_error(e: impl std::fmt::Display) -> ServerError {
    ServerError::Config(e.to_string())
}

impl Config {
    /// From upstream's environment: `TLS_CERT_FILE`, `TLS_KEY_FILE`, `CLIENT_CERT_FILE`,
    /// `CLIENT_NAME`, `UPLOAD_IMAGE_SIZE`, `FILESYSTEM_OVERHEAD`, `PREALLOCATION`, `DEADLINE`
    /// (RFC 3339), `LISTEN_ADDRESS`, `LISTEN_PORT`. Files are read below `paths.root`.
    pub fn from_env(env: &HashMap<String, String>, paths: PodPaths) -> Result<Config, ServerError> {
        let get = |k: &str| env.get(k).map(String::as_str).filter(|v| !v.is_empty());
        let read = |var: &str| -> Result<Option<Vec<u8>>, ServerError> {
            let Some(file) = get(var) else {
                return Ok(None);
            };
            let path = cdi_core::devpod::in_root(paths.root.as_deref(), Path::new(file));
            std::fs::read(&path)
                .map(Some)
                .map_err(|error| ServerError::Io {
                    context: format!("reading {var} {}", path.display()),
                    error,
                })
        };
        let (Some(cert_pem), Some(key_pem)) = (read("TLS_CERT_FILE")?, read("TLS_KEY_FILE")?)
        else {
            return Err(ServerError::Config(
                "TLS_CERT_FILE and TLS_KEY_FILE are required: the upload server serves HTTPS only"
                    .into(),
            ));
        };
        let address = env
            .get("LISTEN_ADDRESS")
            .map(String::as_str)
            .unwrap_or("0.0.0.0");
        let address = if address.is_empty() {
            "0.0.0.0"
        } else {
            address
        };
        let port = match get("LISTEN_PORT") {
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| config_error(format!("LISTEN_PORT={p:?} is not a port")))?,
            None => PORT,
        };
        let listen = format!("{address}:{port}")
            .parse::<SocketAddr>()
            .or_else(|_| format!("[{address}]:{port}").parse())
            .map_err(|_| config_error(format!("LISTEN_ADDRESS={address:?} is not an address")))?;
        let image_size = get("UPLOAD_IMAGE_SIZE")
            .map(|v| {
                v.parse::<Quantity>()
                    .map(|q| q.value().max(0) as u64)
                    .map_err(|e| config_error(format!("UPLOAD_IMAGE_SIZE: {e}")))
            })
            .transpose()?;
        let overhead = match get(cdi_api::env::FILESYSTEM_OVERHEAD) {
            Some(v) => v
                .parse()
                .map_err(|e| config_error(format!("FILESYSTEM_OVERHEAD: {e}")))?,
            None => Overhead::ZERO,
        };
        let preallocation = match get(cdi_api::env::PREALLOCATION).map(str::to_ascii_lowercase) {
            None => false,
            Some(v) if matches!(v.as_str(), "1" | "t" | "true") => true,
            Some(v) if matches!(v.as_str(), "0" | "f" | "false") => false,
            Some(v) => {
                return Err(config_error(format!(
                    "PREALLOCATION={v:?} is not a boolean"
                )));
            }
        };
        let deadline = get("DEADLINE")
            .map(|v| {
                v.parse::<k8s_openapi::jiff::Timestamp>()
                    .map(SystemTime::from)
                    .map_err(|e| config_error(format!("DEADLINE={v:?}: {e}")))
            })
            .transpose()?;
        Ok(Config {
            listen,
            tls: Tls {
                cert_pem,
                key_pem,
                client_ca_pem: read("CLIENT_CERT_FILE")?,
            },
            client_name: get("CLIENT_NAME").unwrap_or(UPLOAD_CLIENT_NAME).to_string(),
            image_size,
            overhead,
            preallocation,
            deadline,
            paths,
        })
    }
}

/// How the server ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunResult {
    /// The deadline passed with no upload done.
    pub deadline_passed: bool,
    pub preallocation_applied: bool,
    /// The image sent does not convert as it streams in and the pod has no scratch space: the
    /// next server is to have it.
    pub scratch_required: bool,
    /// The upload done was a clone's.
    pub clone: bool,
}

/// Upstream's message for a finished upload.
pub const COMPLETE_MESSAGE: &str = "Upload Complete";
/// … and for a finished clone.
pub const CLONE_COMPLETE_MESSAGE: &str = "Clone Complete";
pub const DEADLINE_MESSAGE: &str = "Deadline Passed";
/// Upstream's importer's words for asking for scratch space.
pub const SCRATCH_MESSAGE: &str = "scratch space required and none found";

impl RunResult {
    /// The termination message the controller reads.
    pub fn termination_message(&self) -> cdi_api::TerminationMessage {
        if self.scratch_required {
            cdi_api::TerminationMessage {
                message: Some(SCRATCH_MESSAGE.into()),
                scratch_space_required: Some(true),
                ..Default::default()
            }
        } else if self.deadline_passed {
            cdi_api::TerminationMessage {
                message: Some(DEADLINE_MESSAGE.into()),
                deadline_passed: Some(true),
                ..Default::default()
            }
        } else {
            let message = if self.clone {
                CLONE_COMPLETE_MESSAGE
            } else {
                COMPLETE_MESSAGE
            };
            cdi_api::TerminationMessage {
                message: Some(message.into()),
                preallocation_applied: Some(self.preallocation_applied),
                ..Default::default()
            }
        }
    }
}

/// Where the one upload is.
#[derive(Debug, Default)]
struct State {
    /// A request is sending its body.
    uploading: bool,
    /// An async upload is being finished after it was answered.
    processing: bool,
    done: bool,
    /// An async upload that failed after it was answered.
    failed: Option<String>,
    /// An upload needed scratch space the pod does not have.
    scratch_required: bool,
    /// What was done was a clone.
    clone: bool,
}

struct Server {
    config: Config,
    state: Mutex<State>,
    /// Told whenever the state changes.
    changed: Notify,
}

impl Server {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned one still holds a valid state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state());
        self.changed.notify_waiters();
    }
}

type Body = Full<Bytes>;

fn answer(status: StatusCode, text: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(text.into()));
    *r.status_mut() = status;
    r
}

/// Serve on `listener` until one upload is done or the deadline passes.
pub async fn run(
    config: Config,
    listener: tokio::net::TcpListener,
) -> Result<RunResult, ServerError> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls_config(&config.tls).map_err(config_error)?);
    let deadline = config.deadline;
    let server = Arc::new(Server {
        config,
        state: Mutex::new(State::default()),
        changed: Notify::new(),
    });
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let until_deadline = async {
        match deadline {
            Some(at) => {
                let left = at.duration_since(SystemTime::now()).unwrap_or_default();
                tokio::time::sleep(left).await
            }
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until_deadline);
    let mut deadline_passed = false;
    loop {
        let changed = server.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        {
            let state = server.state();
            if let Some(e) = &state.failed {
                return Err(ServerError::Upload(e.clone()));
            }
            if state.done || state.scratch_required {
                break;
            }
            if deadline_passed && !state.uploading && !state.processing {
                break;
            }
        }
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let server = server.clone();
                let handler = move |req, client_cn| handle(server.clone(), client_cn, req);
                let connection = cdi_pki::tls::serve_connection(
                    tcp,
                    acceptor.clone(),
                    handler,
                    Some(graceful.watcher()),
                );
                tokio::spawn(connection);
            }
            _ = &mut changed => {}
            _ = &mut until_deadline, if !deadline_passed => {
                tracing::info!("the deadline passed; ending once no upload is under way");
                deadline_passed = true;
            }
        }
    }
    let (done, scratch_required, preallocation_applied, clone) = {
        let state = server.state();
        (
            state.done,
            state.scratch_required,
            server.config.preallocation,
            state.clone,
        )
    };
    // Let the answer of the upload that finished reach its client.
    let _ = tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await;
    Ok(RunResult {
        deadline_passed: !done && !scratch_required,
        preallocation_applied: done && preallocation_applied,
        scratch_required,
        clone: done && clone,
    })
}

async fn handle(
    server: Arc<Server>,
    client_cn: Option<String>,
    req: Request<Incoming>,
) -> Response<Body> {
    // A refusal answered before the body is read still reads it a while (see `Lingering`).
    let (parts, body) = req.into_parts();
    let mut body = Lingering(Some(body));
    let path = parts.uri.path().to_string();
    if path == HEALTHZ {
        return answer(StatusCode::OK, "OK");
    }
    // Every request but the probe's, so that what reached the server can be counted.
    tracing::info!(method = %parts.method, path = %path, "upload request");
    let Some(endpoint) = Endpoint::of(&path) else {
        return answer(
            StatusCode::NOT_FOUND,
            format!("{path} is not an upload endpoint"),
        );
    };
    // Upstream's clients ask the async endpoints with HEAD whether they exist.
    if endpoint.is_async() && parts.method == Method::HEAD {
        return answer(StatusCode::OK, "");
    }
    if parts.method != Method::POST {
        return answer(
            StatusCode::NOT_FOUND,
            format!(
                "{} is not an upload: send the image with POST",
                parts.method
            ),
        );
    }
    let verified = server.config.tls.client_ca_pem.is_some()
        && client_cn.as_deref() == Some(server.config.client_name.as_str());
    if !verified {
        tracing::warn!(client = ?client_cn, "refused an upload from a client without the expected certificate");
        return answer(StatusCode::UNAUTHORIZED, "");
    }
    let packing = match parts.headers.get(CONTENT_TYPE_HEADER) {
        None => None,
        Some(v) => match v.to_str().ok().and_then(ClonePacking::from_header) {
            Some(p) => Some(p),
            None => {
                return answer(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "{CONTENT_TYPE_HEADER} {v:?} is not a clone stream: a clone source sends filesystem-clone or blockdevice-clone"
                    ),
                );
            }
        },
    };
    // A clone source waits for the answer (it ends once the copy is written).
    if packing.is_some() && endpoint != Endpoint::Sync {
        return answer(
            StatusCode::BAD_REQUEST,
            "async clone not supported: a clone source sends to /v1beta1/upload",
        );
    }
    {
        let mut state = server.state();
        if state.uploading || state.processing {
            tracing::warn!("refused a concurrent upload");
            return answer(StatusCode::SERVICE_UNAVAILABLE, BUSY);
        }
        if state.done {
            tracing::warn!("refused an upload after the upload was done");
            return answer(StatusCode::CONFLICT, ALREADY_UPLOADED);
        }
        state.uploading = true;
    }
    server.changed.notify_waiters();
    let Some(body) = body.0.take() else {
        server.update(|s| s.uploading = false);
        return answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the request's body was lost",
        );
    };
    let req = Request::from_parts(parts, body);
    // In a task of its own: a client that goes away drops this handler, and the upload's end
    // must still be recorded, or the server would stay busy for ever.
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let response = upload(&server, endpoint, packing, req)
            .await
            .unwrap_or_else(|e| {
                server.update(|s| {
                    s.uploading = false;
                    s.scratch_required = matches!(e, ImportError::ScratchRequired(_));
                });
                failure(&e)
            });
        let _ = tx.send(response);
    });
    rx.await.unwrap_or_else(|_| {
        answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the upload ended without an answer",
        )
    })
}

/// What an upload while another is under way is told.
pub const BUSY: &str = "another upload into this volume is under way: try again once it ended";
/// What a second upload into a volume already done is told.
pub const ALREADY_UPLOADED: &str = "the volume was already uploaded: it takes one upload";
/// What an upload without a byte is told.
pub const EMPTY_UPLOAD: &str =
    "the upload is empty: no data is not an image; send the image's bytes";

/// The answer for a failed upload (upstream's `handleStreamError`): a refusal of the image is
/// the client's to mend (4xx with the reason), anything else is the server's (5xx).
fn failure(e: &ImportError) -> Response<Body> {
    tracing::error!(error = %e, "saving the stream failed");
    match e {
        ImportError::TooLarge { .. } | ImportError::StreamTooLarge { .. } => answer(
            StatusCode::BAD_REQUEST,
            format!(
                "Saving stream failed: effective image size is larger than the reported available storage: {e}"
            ),
        ),
        ImportError::Qcow2(_)
        | ImportError::Damaged(_)
        | ImportError::Unsupported(_)
        | ImportError::ChecksumMismatch { .. }
        | ImportError::Config(_) => answer(
            StatusCode::BAD_REQUEST,
            format!("Saving stream failed: {e}"),
        ),
        // This server ends and the next one has scratch space: the same upload will do then.
        ImportError::ScratchRequired(_) => answer(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "Saving stream failed: {e}; the upload server is restarted with scratch space: send the upload again"
            ),
        ),
        _ => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Saving stream failed: {e}"),
        ),
    }
}

fn broken_body(e: impl std::fmt::Display) -> ImportError {
    ImportError::Http {
        url: "the upload".into(),
        status: None,
        message: format!("the request body broke off: {e}"),
    }
}

/// An image's bytes as they arrive.
pub type ImageStream = std::pin::Pin<Box<dyn Stream<Item = Result<Bytes, ImportError>> + Send>>;

/// The image's bytes (and their length, when told): the body, or the `file` part of a
/// multipart form.
async fn image_stream(
    endpoint: Endpoint,
    req: Request<Incoming>,
) -> Result<(Option<u64>, ImageStream), Response<Body>> {
    let content_type = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let length = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let body = req.into_body().into_data_stream();
    if !endpoint.is_form() {
        return Ok((length, Box::pin(body.map(|c| c.map_err(broken_body)))));
    }
    form_file(&content_type, body)
        .await
        .map(|file| (None, file))
        .map_err(|message| answer(StatusCode::BAD_REQUEST, message))
}

/// The bytes of a multipart form's part `file` (the parts before it are skipped), or why the
/// form has none. The part is streamed, never held.
pub async fn form_file<S, E>(content_type: &str, body: S) -> Result<ImageStream, String>
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
{
    let boundary = multer::parse_boundary(content_type).map_err(|e| {
        format!("expected a multipart/form-data request with a part named \"file\": {e}")
    })?;
    let mut form = multer::Multipart::new(body, boundary);
    loop {
        match form.next_field().await {
            Ok(Some(field)) if field.name() == Some("file") => {
                return Ok(Box::pin(field.map(|c| c.map_err(broken_body))));
            }
            Ok(Some(field)) => {
                tracing::info!(part = ?field.name(), "ignoring a form part");
            }
            Ok(None) => return Err("the form has no part named \"file\"".into()),
            Err(e) => return Err(format!("reading the multipart form: {e}")),
        }
    }
}

async fn upload(
    server: &Arc<Server>,
    endpoint: Endpoint,
    packing: Option<ClonePacking>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ImportError> {
    let (length, chunks) = match image_stream(endpoint, req).await {
        Ok(s) => s,
        Err(refused) => {
            server.update(|s| s.uploading = false);
            return Ok(refused);
        }
    };
    // Nothing is written before a byte arrived: an empty body would otherwise make an empty
    // disk and use up the volume's one upload.
    let mut chunks = match first_bytes(chunks).await {
        Ok(Some(chunks)) => chunks,
        Ok(None) => {
            tracing::warn!("refused an empty upload");
            server.update(|s| s.uploading = false);
            return Ok(answer(StatusCode::BAD_REQUEST, EMPTY_UPLOAD));
        }
        Err(e) => {
            server.update(|s| s.uploading = false);
            return Err(e);
        }
    };
    let (feeder, source, taken_in) = stream::channel("the upload", length, 16);
    let (drain_tx, drain_rx) = tokio::sync::oneshot::channel::<()>();
    // The body goes into the pipeline as it arrives; it stops when the pipeline stops reading,
    // unless told to read the rest (see `settle`).
    let mut feeding = tokio::spawn(async move {
        while let Some(chunk) = chunks.next().await {
            let failed = chunk.is_err();
            if feeder.send(chunk).await.is_err() {
                if drain_rx.await.is_ok() {
                    while let Ok(Some(Ok(_))) =
                        tokio::time::timeout(DRAIN_IDLE, chunks.next()).await
                    {}
                } else {
                    // Refused (the image, or the volume's room): the answer must reach the
                    // client still sending.
                    linger(chunks).await;
                }
                return;
            }
            if failed {
                return;
            }
        }
    });
    let mut drain = Some(drain_tx);
    let config = server.config.clone();
    let mut work = write_in_background(config, endpoint, packing, source);
    if endpoint.is_async() {
        tokio::select! {
            biased;
            result = &mut work => {
                // Finished (or failed) before the answer: as a sync upload.
                settle(flatten(result), &mut drain, &mut feeding).await?;
            }
            told = taken_in => {
                if told.is_err() {
                    // The stream was dropped unread: the pipeline failed; its error says why.
                    settle(flatten(work.await), &mut drain, &mut feeding).await?;
                } else {
                    server.update(|s| {
                        s.uploading = false;
                        s.processing = true;
                    });
                    let server = server.clone();
                    tokio::spawn(async move {
                        let result = flatten(work.await);
                        server.update(|s| {
                            s.processing = false;
                            match result {
                                Ok(()) => s.done = true,
                                Err(ImportError::ScratchRequired(why)) => {
                                    tracing::error!(reason = %why, "the upload was answered, then found to need scratch space");
                                    s.scratch_required = true;
                                }
                                Err(e) => s.failed = Some(e.to_string()),
                            }
                        });
                    });
                    tracing::info!("the upload is taken in; finishing it in the background");
                    return Ok(answer(StatusCode::OK, ""));
                }
            }
        }
    } else {
        settle(flatten(work.await), &mut drain, &mut feeding).await?;
    }
    server.update(|s| {
        s.uploading = false;
        s.done = true;
        s.clone = packing.is_some();
    });
    tracing::info!(endpoint = ?endpoint, clone = ?packing, "upload complete");
    Ok(answer(StatusCode::OK, ""))
}

/// The stream with its first bytes read (and put back in front), or `None` when it ends
/// without any.
async fn first_bytes(mut chunks: ImageStream) -> Result<Option<ImageStream>, ImportError> {
    loop {
        match chunks.next().await {
            None => return Ok(None),
            Some(Err(e)) => return Err(e),
            Some(Ok(c)) if c.is_empty() => continue,
            Some(Ok(c)) => {
                let first = futures::stream::once(async move { Ok(c) });
                return Ok(Some(Box::pin(first.chain(chunks))));
            }
        }
    }
}

/// How long a request body that will not be used is still read once the request is answered.
pub const LINGER: Duration = Duration::from_secs(5);

/// Read what is left of a body that will not be used, for at most [`LINGER`], dropping it: a
/// connection closed while the client still sends is reset, and a reset loses the answer that
/// was on its way (a refusal becomes "connection reset by peer"). Reading a while after
/// answering lets the client hear why and stop (a lingering close, as web servers do).
pub async fn linger<S, E>(mut rest: S)
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    let _ = tokio::time::timeout(LINGER, async {
        while let Some(Ok(_)) = rest.next().await {}
    })
    .await;
}

/// A request body that lingers (see [`linger`]) when dropped unread.
pub struct Lingering(pub Option<Incoming>);

impl Drop for Lingering {
    fn drop(&mut self) {
        // A body already at its end (a probe's, a HEAD's) has nothing left to read.
        use hyper::body::Body as _;
        if let Some(body) = self.0.take().filter(|b| !b.is_end_stream())
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(linger(body.into_data_stream()));
        }
    }
}

/// How long the rest of a body that will not be used is read while it keeps coming.
const DRAIN_IDLE: Duration = Duration::from_secs(30);

/// An upload's result; when it needs scratch space, the rest of its body is read first (and
/// dropped), so that the client, still sending, hears that it is to send it again rather than
/// losing the connection. Other failures are answered at once: the body is of no use.
async fn settle(
    result: Result<(), ImportError>,
    drain: &mut Option<tokio::sync::oneshot::Sender<()>>,
    feeding: &mut tokio::task::JoinHandle<()>,
) -> Result<(), ImportError> {
    if let Err(ImportError::ScratchRequired(why)) = &result
        && let Some(tx) = drain.take()
    {
        tracing::info!(reason = %why, "the image needs scratch space; reading the rest of the upload before answering");
        let _ = tx.send(());
        let _ = feeding.await;
    }
    result
}

fn flatten(
    finished: Result<Result<(), ImportError>, tokio::sync::oneshot::error::RecvError>,
) -> Result<(), ImportError> {
    finished
        .map_err(|_| ImportError::Internal("the upload's thread ended without a word".into()))?
}

/// Write the image on a thread of its own, with a runtime of its own: the import's future is
/// not `Send` for every lifetime a spawned task needs, and a large conversion should not share
/// the threads that answer requests anyway.
fn write_in_background(
    config: Config,
    endpoint: Endpoint,
    packing: Option<ClonePacking>,
    source: stream::StreamSource,
) -> tokio::sync::oneshot::Receiver<Result<(), ImportError>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("upload".into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|e| ImportError::io("starting the upload's runtime", e))
                .and_then(|rt| rt.block_on(write_image(&config, endpoint, packing, &source)));
            let _ = tx.send(result);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "could not start the upload's thread");
    }
    rx
}

/// Write the uploaded image (or unpack the archive, or write the clone) onto the volume.
async fn write_image(
    config: &Config,
    endpoint: Endpoint,
    packing: Option<ClonePacking>,
    source: &stream::StreamSource,
) -> Result<(), ImportError> {
    let progress = Arc::new(Progress::default());
    if let Some(packing) = packing {
        return cdi_importer::clone::receive(
            source,
            packing,
            &config.paths,
            config.preallocation,
            progress,
        )
        .await;
    }
    let (target, mode, capacity) = cdi_importer::pod::volume(&config.paths)?;
    if endpoint == Endpoint::Archive {
        if mode == VolumeMode::Block {
            return Err(ImportError::Config(
                "an archive upload needs a Filesystem volume, not Block".into(),
            ));
        }
        return cdi_importer::archive::unpack(
            source,
            &config.paths.data_dir,
            capacity,
            None,
            progress,
        )
        .await;
    }
    let opts = ImportOptions {
        target,
        size: config.image_size.map(|requested| SizeSpec {
            requested,
            capacity,
        }),
        overhead: config.overhead.for_mode(mode),
        preallocate: config.preallocation,
        checksum: None,
        scratch_dir: config.paths.scratch_dir.clone(),
        scratch_mounted: true,
        tuning: Tuning::default(),
    };
    let report = cdi_importer::import::import(source, &opts, progress).await?;
    tracing::info!(
        format = %report.format,
        virtual_size = report.virtual_size,
        final_size = report.final_size,
        transferred = report.transferred,
        written = report.written,
        scratch = report.scratch_used,
        "upload written"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_their_aliases() {
        for path in UPLOAD_PATHS {
            assert!(Endpoint::of(path).is_some(), "{path}");
        }
        assert_eq!(Endpoint::of("/v1alpha1/upload"), Some(Endpoint::Sync));
        assert_eq!(
            Endpoint::of("/v1beta1/upload-form-async"),
            Some(Endpoint::FormAsync)
        );
        assert_eq!(Endpoint::of("/v1beta1/uploads"), None);
        assert_eq!(Endpoint::of("/v2/upload"), None);
        assert_eq!(Endpoint::of("/upload"), None);
    }

    #[test]
    fn termination_messages_as_upstream_writes_them() {
        let done = RunResult {
            deadline_passed: false,
            preallocation_applied: true,
            scratch_required: false,
            clone: false,
        };
        assert_eq!(
            done.termination_message().to_json(),
            r#"{"preallocationApplied":true,"message":"Upload Complete"}"#
        );
        let cloned = RunResult {
            clone: true,
            preallocation_applied: false,
            ..done
        };
        assert_eq!(
            cloned.termination_message().to_json(),
            r#"{"preallocationApplied":false,"message":"Clone Complete"}"#
        );
        let late = RunResult {
            deadline_passed: true,
            preallocation_applied: false,
            scratch_required: false,
            clone: false,
        };
        assert_eq!(
            late.termination_message().to_json(),
            r#"{"message":"Deadline Passed","deadlinePassed":true}"#
        );
        let spool = RunResult {
            deadline_passed: false,
            preallocation_applied: false,
            scratch_required: true,
            clone: false,
        };
        let said = cdi_api::TerminationMessage::parse(&spool.termination_message().to_json());
        assert_eq!(said.scratch_space_required, Some(true));
    }
}
