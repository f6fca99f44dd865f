//! `cdi cloner`: the source side of a host-assisted clone (upstream's cdi-cloner). The source
//! volume is sent in one request to the upload server of the clone's target over mutual TLS:
//! a Filesystem volume as a tar stream (see [`crate::pack`]), a Block volume as its bytes. The
//! header `x-cdi-content-type` says which. Nothing is retried here: a failed run ends the
//! process, and the pod's restart sends the volume again, as upstream's does.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use cdi_importer::convert::Progress;
use tokio::sync::mpsc;

use crate::server::CONTENT_TYPE_HEADER;

/// `x-cdi-content-type` of a Filesystem volume's tar stream.
pub const FILESYSTEM_CLONE: &str = "filesystem-clone";
/// `x-cdi-content-type` of a Block volume's bytes.
pub const BLOCKDEVICE_CLONE: &str = "blockdevice-clone";
/// The termination message of a finished clone source (plain text, as upstream's).
pub const COMPLETE_MESSAGE: &str = "Clone Complete";
/// … when the target was asked to preallocate.
pub const COMPLETE_PREALLOCATED_MESSAGE: &str = "Clone Complete, Preallocation applied";

/// The volume to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloneSource {
    /// A Filesystem volume mounted here.
    Filesystem(PathBuf),
    /// A Block volume's device.
    Block(PathBuf),
}

impl CloneSource {
    pub fn content_type(&self) -> &'static str {
        match self {
            CloneSource::Filesystem(_) => FILESYSTEM_CLONE,
            CloneSource::Block(_) => BLOCKDEVICE_CLONE,
        }
    }

    /// The bytes that will be sent (the progress metric's whole): a Filesystem volume's file
    /// data (holes are not sent), a device's size.
    pub fn bytes(&self) -> std::io::Result<u64> {
        match self {
            CloneSource::Filesystem(dir) => crate::pack::directory_data_bytes(dir),
            CloneSource::Block(device) => device_size(device),
        }
    }
}

/// A device's size (a regular file standing for one: its length).
fn device_size(path: &std::path::Path) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    std::fs::File::open(path)?.seek(SeekFrom::End(0))
}

/// Why the clone source failed.
#[derive(Debug, thiserror::Error)]
pub enum ClonerError {
    #[error("{0}")]
    Config(String),
    #[error("reading the source volume: {0}")]
    Source(std::io::Error),
    #[error("sending the volume to {url}: {message}")]
    Send { url: String, message: String },
    #[error("the upload server at {url} refused the volume with {status}: {body}")]
    Refused {
        url: String,
        status: u16,
        body: String,
    },
}

/// Upstream's environment, read.
#[derive(Debug, Clone)]
pub struct ClonerConfig {
    pub url: String,
    /// The client certificate and its key (PEM), which the upload server checks.
    pub client_cert_pem: String,
    pub client_key_pem: String,
    /// The CA bundle the upload server's certificate is checked against.
    pub server_ca_pem: String,
    /// The UID the progress metric is labelled with (the clone's target).
    pub owner_uid: String,
    pub preallocation: bool,
    pub source: CloneSource,
}

impl ClonerConfig {
    /// From upstream's variables (`UPLOAD_URL`, `CLIENT_CERT`, `CLIENT_KEY`, `SERVER_CA_CERT`,
    /// `OWNER_UID`, `PREALLOCATION`, `VOLUME_MODE`, `MOUNT_POINT`); a missing one is an error
    /// naming it. `place` maps a container path to where it is (the development cluster's pod
    /// root).
    pub fn from_env(
        get: impl Fn(&str) -> Option<String>,
        place: impl Fn(&std::path::Path) -> PathBuf,
    ) -> Result<ClonerConfig, ClonerError> {
        let need = |name: &str| {
            get(name).filter(|v| !v.is_empty()).ok_or_else(|| {
                ClonerError::Config(format!("environment variable {name} is not set"))
            })
        };
        let mount = PathBuf::from(need("MOUNT_POINT")?);
        let source = match need("VOLUME_MODE")?.to_ascii_lowercase().as_str() {
            "block" => CloneSource::Block(place(&mount)),
            "filesystem" => CloneSource::Filesystem(place(&mount)),
            other => {
                return Err(ClonerError::Config(format!(
                    "VOLUME_MODE {other:?}: expected block or filesystem"
                )));
            }
        };
        Ok(ClonerConfig {
            url: need("UPLOAD_URL")?,
            client_cert_pem: need("CLIENT_CERT")?,
            client_key_pem: need("CLIENT_KEY")?,
            server_ca_pem: need("SERVER_CA_CERT")?,
            owner_uid: need("OWNER_UID")?,
            // Upstream takes a value that does not parse as false.
            preallocation: need("PREALLOCATION")?.parse().unwrap_or(false),
            source,
        })
    }

    /// The termination message of a finished run.
    pub fn complete_message(&self) -> &'static str {
        if self.preallocation {
            COMPLETE_PREALLOCATED_MESSAGE
        } else {
            COMPLETE_MESSAGE
        }
    }
}

/// A `Write` that hands full buffers to the request body.
struct Chunks {
    tx: mpsc::Sender<std::io::Result<Bytes>>,
}

impl Write for Chunks {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tx
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the request ended")
            })?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Read the source on a thread of its own into the channel, 1 MiB at a time.
fn produce(
    source: CloneSource,
    tx: mpsc::Sender<std::io::Result<Bytes>>,
    progress: Arc<Progress>,
) -> std::io::Result<()> {
    let out = std::io::BufWriter::with_capacity(1 << 20, Chunks { tx });
    let mut out = match &source {
        CloneSource::Filesystem(dir) => crate::pack::pack_directory(dir, out, &progress.done)?,
        CloneSource::Block(device) => {
            let mut out = out;
            let mut input = std::fs::File::open(device)?;
            let mut counted = CountedRead {
                inner: &mut input,
                progress: &progress,
            };
            std::io::copy(&mut counted, &mut out)?;
            out
        }
    };
    out.flush()
}

struct CountedRead<'a, R> {
    inner: R,
    progress: &'a Progress,
}

impl<R: std::io::Read> std::io::Read for CountedRead<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.progress.done.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Send the source to the upload server; `progress` counts what was read against its whole.
pub async fn send(config: &ClonerConfig, progress: Arc<Progress>) -> Result<(), ClonerError> {
    let source = config.source.clone();
    let total = {
        let source = source.clone();
        tokio::task::spawn_blocking(move || source.bytes())
            .await
            .map_err(|e| ClonerError::Config(e.to_string()))?
            .map_err(ClonerError::Source)?
    };
    progress.total.store(total, Ordering::Relaxed);
    tracing::info!(url = %config.url, content_type = source.content_type(), bytes = total, "sending the volume");

    let send_error = |message: String| ClonerError::Send {
        url: config.url.clone(),
        message,
    };
    let identity = reqwest::Identity::from_pem(
        format!("{}\n{}", config.client_cert_pem, config.client_key_pem).as_bytes(),
    )
    .map_err(|e| ClonerError::Config(format!("the client certificate: {e}")))?;
    let ca = reqwest::Certificate::from_pem_bundle(config.server_ca_pem.as_bytes())
        .map_err(|e| ClonerError::Config(format!("the upload server's CA bundle: {e}")))?;
    let client = reqwest::Client::builder()
        .tls_certs_only(ca)
        .identity(identity)
        .http1_only()
        .build()
        .map_err(|e| send_error(format!("making the client: {e}")))?;

    let (tx, rx) = mpsc::channel(8);
    let producer = {
        let progress = progress.clone();
        tokio::task::spawn_blocking(move || {
            let abort = tx.clone();
            let produced = produce(source, tx, progress);
            if let Err(e) = &produced {
                // The body ends with an error, not cleanly: the server must not take a stream
                // cut short for the whole volume.
                let _ = abort.blocking_send(Err(std::io::Error::new(e.kind(), e.to_string())));
            }
            produced
        })
    };
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    let sent = client
        .post(&config.url)
        .header(CONTENT_TYPE_HEADER, config.source.content_type())
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await;
    // The reading side's error says more than the request's when both failed.
    let produced = producer
        .await
        .map_err(|e| ClonerError::Config(e.to_string()))?;
    let response = match (sent, produced) {
        (_, Err(e)) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(ClonerError::Source(e));
        }
        (Err(e), _) => return Err(send_error(e.to_string())),
        (Ok(r), _) => r,
    };
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    if !status.is_success() {
        return Err(ClonerError::Refused {
            url: config.url.clone(),
            status: status.as_u16(),
            body,
        });
    }
    tracing::info!(
        sent = progress.done.load(Ordering::Relaxed),
        "the volume was sent"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn configuration_from_upstreams_variables() {
        let mut env: HashMap<&str, &str> = HashMap::from([
            (
                "UPLOAD_URL",
                "https://cdi-upload-tmp.ns.svc:8443/v1beta1/upload",
            ),
            ("CLIENT_CERT", "cert"),
            ("CLIENT_KEY", "key"),
            ("SERVER_CA_CERT", "ca"),
            ("OWNER_UID", "uid-1"),
            ("PREALLOCATION", "true"),
            ("VOLUME_MODE", "filesystem"),
            ("MOUNT_POINT", "/var/run/cdi/clone/source"),
        ]);
        let read = |env: &HashMap<&str, &str>| {
            ClonerConfig::from_env(
                |k| env.get(k).map(|v| v.to_string()),
                |p| PathBuf::from("/root").join(p.strip_prefix("/").unwrap()),
            )
        };
        let config = read(&env).unwrap();
        assert_eq!(
            config.source,
            CloneSource::Filesystem("/root/var/run/cdi/clone/source".into())
        );
        assert_eq!(config.complete_message(), COMPLETE_PREALLOCATED_MESSAGE);
        env.insert("VOLUME_MODE", "block");
        env.insert("PREALLOCATION", "nonsense");
        let config = read(&env).unwrap();
        assert_eq!(config.source.content_type(), BLOCKDEVICE_CLONE);
        assert_eq!(config.complete_message(), COMPLETE_MESSAGE);
        env.remove("OWNER_UID");
        assert_eq!(
            read(&env).unwrap_err().to_string(),
            "environment variable OWNER_UID is not set"
        );
        env.insert("OWNER_UID", "u");
        env.insert("VOLUME_MODE", "tape");
        assert!(
            read(&env)
                .unwrap_err()
                .to_string()
                .contains("VOLUME_MODE \"tape\"")
        );
    }
}
