//! A containerDisk image in a registry (`docker://host/repo:tag`, or `@digest`): the disk is the
//! one file under `disk/` of the image's merged layers. Layers are read from the top down, each
//! as it downloads (decompressed on the way, never extracted to scratch), whiteouts and opaque
//! directories of upper layers hiding what they hide below; the first visible file is streamed
//! into the converter while the rest of its layer is read to make sure it is the only one. The
//! image's config is read first: its architecture, the bootc labels upstream refuses, and the
//! `*_KUBEVIRT_IO_*` environment that becomes claim labels.
//!
//! Reaching the registry, authenticating and reading the manifest (an index's entry by
//! architecture) is cdi-registry's, which the controller shares for digests; here the layers are
//! streamed with its client, each download resumed by range after a broken connection and
//! checked against its digest.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cdi_registry::oci_client::client::BlobResponse;
use cdi_registry::oci_client::manifest::{OciDescriptor, OciImageIndex, OciImageManifest};
use cdi_registry::{Connection, chain, speaks_tls};
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use sha2::Digest;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

use crate::error::ImportError;
use crate::sources::http::HttpSource;
use crate::sources::http::StreamReader;
use crate::sources::oci_archive::Archive;
use crate::sources::source::{Opened, Source};

/// Where callers have always found it; the registry crate picks index entries by it.
pub use cdi_registry::host_architecture;

/// Upstream's messages for an image that holds no disk, or more than one.
pub const NO_DISK: &str = "Failed to find VM disk image file in the container image";
pub const MANY_DISKS: &str = "image directory contains more than one file";
/// Upstream's refusal of a bootc image.
pub const BOOTC: &str = "bootc image detected: this image contains an ostree-based bootable OS (containers.bootc=1 or ostree.bootable=1) and cannot be imported as a regular container disk; bootc-to-disk conversion is not yet implemented";

/// Why an archive inside the importer pod is not read.
pub const ARCHIVE_ELSEWHERE: &str = "an oci-archive is read from where it is served over HTTP(S) \
     (oci-archive:https://host/path/image.tar, or oci-archive://host/path/image.tar); a path in \
     the importer pod's filesystem names nothing, since nothing puts files there";

/// Where the disk is in the image.
const DISK_DIR: &str = "disk";

/// Bytes sent to the converter at once.
const CHUNK: usize = 1 << 20;

/// Broken downloads resumed per blob before giving up.
const RESUMES: u32 = 5;

/// A registry image and how to reach it.
pub struct RegistrySource {
    /// `docker://…` or `oci-archive:…` as given (never holds credentials: those come from the
    /// Secret).
    url: String,
    origin: Origin,
    /// CAs trusted besides the system's (the registry's copy is in its `cdi_registry::Image`;
    /// this one reaches an oci-archive's server).
    ca_certs_pem: Vec<Vec<u8>>,
    /// Upstream's INSECURE_TLS: the registry is listed in CDIConfig's insecureRegistries, so
    /// its certificate is not checked, and plain HTTP is used when it speaks no TLS.
    insecure: bool,
    /// The architecture to pick from an index (and to require of a single image), in the
    /// registry's terms (`amd64`, `arm64`, …); this machine's when not given.
    architecture: Option<String>,
    /// What the last opening learnt: the image's labels and the walk's outcome.
    state: Mutex<State>,
}

impl std::fmt::Debug for RegistrySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credentials.
        f.debug_struct("RegistrySource")
            .field("url", &self.url)
            .field("insecure", &self.insecure)
            .field("architecture", &self.architecture)
            .finish_non_exhaustive()
    }
}

/// Where the image is.
enum Origin {
    /// An image in a registry, with what reaches it.
    Registry(cdi_registry::Image),
    /// An oci-archive served over HTTP(S): its location (`https://…`, `http://…`, or
    /// `//host/path` to be reached as an insecure registry would be), and the Secret's
    /// credentials as basic auth.
    Archive {
        location: String,
        credentials: Option<(String, String)>,
    },
}

/// The image, reached (cloned once per layer: the size of a variant does not matter).
#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
enum Store {
    Registry(Connection),
    Archive(Arc<Archive>),
}

#[derive(Default)]
struct State {
    labels: BTreeMap<String, String>,
    verdict: Option<oneshot::Receiver<Result<(), ImportError>>>,
}

/// A registry failure as the import reports it, word for word what cdi-registry says.
impl From<cdi_registry::Error> for ImportError {
    fn from(e: cdi_registry::Error) -> ImportError {
        match e {
            cdi_registry::Error::Reference(m) => ImportError::Config(m),
            cdi_registry::Error::Pull {
                url,
                status,
                message,
            } => ImportError::Http {
                url,
                status,
                message,
            },
            cdi_registry::Error::Unsupported(m) => ImportError::Unsupported(m),
        }
    }
}

impl RegistrySource {
    /// The image `url` names (`docker://…`), read with `user`/`password` when given.
    pub fn new(
        url: &str,
        credentials: Option<(String, String)>,
        ca_certs_pem: Vec<Vec<u8>>,
        insecure: bool,
        architecture: Option<String>,
    ) -> Result<RegistrySource, ImportError> {
        let origin = if let Some(location) = url.strip_prefix("oci-archive:") {
            let remote = location.starts_with("http://")
                || location.starts_with("https://")
                || location
                    .strip_prefix("//")
                    .is_some_and(|rest| rest.split('/').next().is_some_and(|h| !h.is_empty()));
            if !remote {
                return Err(ImportError::Config(format!("{url}: {ARCHIVE_ELSEWHERE}")));
            }
            Origin::Archive {
                location: location.to_string(),
                credentials,
            }
        } else {
            Origin::Registry(cdi_registry::Image::new(
                url,
                credentials,
                ca_certs_pem.clone(),
                insecure,
                architecture.clone(),
            )?)
        };
        Ok(RegistrySource {
            url: url.to_string(),
            origin,
            ca_certs_pem,
            insecure,
            architecture: architecture.filter(|a| !a.is_empty()),
            state: Mutex::new(State::default()),
        })
    }

    /// The claim labels the image's environment asks for (`INSTANCETYPE_KUBEVIRT_IO_DEFAULT_…`
    /// → `instancetype.kubevirt.io/default-…`), known once the source was opened.
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.state
            .lock()
            .map(|s| s.labels.clone())
            .unwrap_or_default()
    }

    /// Wait for the last opening's walk of the image to end: an image with a second disk
    /// below the one converted, or whose download did not match its digest, fails here even
    /// when the converter read all it needed before that showed.
    pub async fn finish(&self) -> Result<(), ImportError> {
        let verdict = self.state.lock().ok().and_then(|mut s| s.verdict.take());
        match verdict {
            Some(rx) => rx.await.unwrap_or_else(|_| {
                Err(ImportError::Internal(
                    "the registry image's reader ended without a result".into(),
                ))
            }),
            None => Ok(()),
        }
    }

    /// The digest of what the URL names (an index's own, for a multi-architecture image), as
    /// upstream's poller reads it to see whether the image changed.
    pub async fn digest(&self) -> Result<String, ImportError> {
        match self.store().await? {
            Store::Registry(connection) => Ok(connection.digest().await?),
            Store::Archive(archive) => Ok(self.top(&archive).await?.0),
        }
    }

    fn wanted_architecture(&self) -> &str {
        self.architecture.as_deref().unwrap_or(host_architecture())
    }

    /// The image reached: a registry client, or the archive's entries listed.
    async fn store(&self) -> Result<Store, ImportError> {
        match &self.origin {
            Origin::Registry(image) => Ok(Store::Registry(image.connect().await?)),
            Origin::Archive {
                location,
                credentials,
            } => {
                let url = match location.strip_prefix("//") {
                    Some(rest) => {
                        let host = rest.split('/').next().unwrap_or("");
                        if self.insecure && !speaks_tls(host).await {
                            format!("http://{rest}")
                        } else {
                            format!("https://{rest}")
                        }
                    }
                    None => location.clone(),
                };
                let source = HttpSource {
                    url,
                    basic_auth: credentials.clone(),
                    ca_certs_pem: self.ca_certs_pem.clone(),
                    insecure: self.insecure,
                    ..Default::default()
                };
                let archive = Archive::open(source)
                    .await
                    .map_err(|e| self.pull_failed(e))?;
                Ok(Store::Archive(Arc::new(archive)))
            }
        }
    }

    /// A transfer error of the archive as the import reports it (upstream's ImagePullFailed).
    fn pull_failed(&self, e: ImportError) -> ImportError {
        match e {
            ImportError::Http {
                status, message, ..
            } => ImportError::Http {
                url: self.url.clone(),
                status,
                message: format!("failed to pull image: {message}"),
            },
            other => other,
        }
    }

    /// A JSON document of the archive, by path or digest.
    async fn archive_json(
        &self,
        archive: &Archive,
        path: &str,
    ) -> Result<serde_json::Value, ImportError> {
        let raw = archive.read(path).await.map_err(|e| self.pull_failed(e))?;
        serde_json::from_slice(&raw).map_err(|e| {
            ImportError::Damaged(format!(
                "{}: the archive's {path} is not JSON: {e}",
                self.url
            ))
        })
    }

    /// The archive's image: its digest and descriptor document (a manifest or an index). One
    /// entry in `index.json` is the image; several with platforms are an index to choose from.
    async fn top(&self, archive: &Archive) -> Result<(String, serde_json::Value), ImportError> {
        let raw = archive
            .read("index.json")
            .await
            .map_err(|e| self.pull_failed(e))?;
        let index: OciImageIndex = serde_json::from_slice(&raw).map_err(|e| {
            ImportError::Damaged(format!(
                "{}: the archive's index.json is not an OCI index: {e}",
                self.url
            ))
        })?;
        match index.manifests.as_slice() {
            [one] => {
                let path = blob_path(&one.digest, &self.url)?;
                Ok((one.digest.clone(), self.archive_json(archive, &path).await?))
            }
            many if !many.is_empty() && many.iter().all(|m| m.platform.is_some()) => {
                let hex: String = sha2::Sha256::digest(&raw)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                let value = serde_json::from_slice(&raw).unwrap_or_default();
                Ok((format!("sha256:{hex}"), value))
            }
            many => {
                let names: Vec<&str> = many
                    .iter()
                    .filter_map(|m| m.annotations.as_ref())
                    .filter_map(|a| a.get("org.opencontainers.image.ref.name"))
                    .map(String::as_str)
                    .collect();
                Err(ImportError::Unsupported(format!(
                    "{}: the archive holds {} images ({}); an oci-archive source holds one                      image (or one index of architectures)",
                    self.url,
                    many.len(),
                    if names.is_empty() {
                        "none named".to_string()
                    } else {
                        names.join(", ")
                    }
                )))
            }
        }
    }

    /// The archive's image manifest for the wanted architecture.
    async fn archive_manifest(&self, archive: &Archive) -> Result<OciImageManifest, ImportError> {
        let (_, top) = self.top(archive).await?;
        let is_index = |v: &serde_json::Value| v.get("manifests").is_some();
        let doc = if is_index(&top) {
            let index: OciImageIndex = serde_json::from_value(top).map_err(|e| {
                ImportError::Damaged(format!(
                    "{}: the archive's index is not valid: {e}",
                    self.url
                ))
            })?;
            let entry = cdi_registry::choose(&index, &self.url, self.wanted_architecture())?;
            let doc = self
                .archive_json(archive, &blob_path(&entry.digest, &self.url)?)
                .await?;
            if is_index(&doc) {
                return Err(ImportError::Unsupported(format!(
                    "{}: the index's linux/{} entry is another index",
                    self.url,
                    self.wanted_architecture()
                )));
            }
            doc
        } else {
            top
        };
        serde_json::from_value(doc).map_err(|e| {
            ImportError::Damaged(format!(
                "{}: the archive's image manifest is not valid: {e}",
                self.url
            ))
        })
    }

    /// The image manifest for the wanted architecture.
    async fn manifest(&self, store: &Store) -> Result<OciImageManifest, ImportError> {
        match store {
            Store::Registry(connection) => Ok(connection.manifest().await?),
            Store::Archive(archive) => self.archive_manifest(archive).await,
        }
    }

    /// Read the image's config: refuse what upstream refuses, keep the labels it asks for.
    async fn check_config(
        &self,
        store: &Store,
        manifest: &OciImageManifest,
    ) -> Result<BTreeMap<String, String>, ImportError> {
        let raw = match store {
            Store::Registry(connection) => connection.blob(&manifest.config).await?,
            Store::Archive(archive) => archive
                .read(&blob_path(&manifest.config.digest, &self.url)?)
                .await
                .map_err(|e| self.pull_failed(e))?,
        };
        let config: serde_json::Value = serde_json::from_slice(&raw).map_err(|e| {
            ImportError::Unsupported(format!("{}: the image's config is not JSON: {e}", self.url))
        })?;
        let facts = ImageConfig::read(&config);
        if let Some(wanted) = &self.architecture
            && let Some(arch) = &facts.architecture
            && arch != wanted
        {
            // Upstream's words, then where the choice is made.
            return Err(ImportError::Unsupported(format!(
                "{}: Error validating architecture: manifest image architecture: {arch:?} \
                 doesn't match requested architecture: {wanted:?} (the DataVolume's \
                 spec.source.registry.platform.architecture)",
                self.url
            )));
        }
        if facts.bootc {
            return Err(ImportError::Unsupported(format!("{}: {BOOTC}", self.url)));
        }
        Ok(facts.kubevirt_labels)
    }
}

/// Where a blob is in an OCI layout.
fn blob_path(digest: &str, url: &str) -> Result<String, ImportError> {
    Archive::blob_path(digest)
        .ok_or_else(|| ImportError::Damaged(format!("{url}: {digest:?} is not a digest")))
}

/// What the importer reads from an image's config.
#[derive(Debug, Default, PartialEq)]
struct ImageConfig {
    architecture: Option<String>,
    bootc: bool,
    kubevirt_labels: BTreeMap<String, String>,
}

impl ImageConfig {
    fn read(config: &serde_json::Value) -> ImageConfig {
        let inner = &config["config"];
        let labels = inner["Labels"].as_object();
        let label_true = |name: &str| {
            labels
                .and_then(|l| l.get(name))
                .and_then(|v| v.as_str())
                .is_some_and(|v| v == "1")
        };
        let mut kubevirt_labels = BTreeMap::new();
        for item in inner["Env"].as_array().into_iter().flatten() {
            let Some((name, value)) = item.as_str().and_then(|e| e.split_once('=')) else {
                continue;
            };
            if let Some(label) = env_label(name) {
                kubevirt_labels.insert(label, value.to_string());
            }
        }
        ImageConfig {
            architecture: config["architecture"].as_str().map(str::to_string),
            bootc: label_true("containers.bootc") || label_true("ostree.bootable"),
            kubevirt_labels,
        }
    }
}

/// Upstream's rule for image environment variables that become claim labels: a name holding
/// `KUBEVIRT_IO_` is split there; the part before (if any, `_` as `.`) and `kubevirt.io/` and the
/// part after (`_` as `-`), all lower case:
/// `INSTANCETYPE_KUBEVIRT_IO_DEFAULT_INSTANCETYPE` → `instancetype.kubevirt.io/default-instancetype`.
pub fn env_label(name: &str) -> Option<String> {
    const MARK: &str = "KUBEVIRT_IO_";
    let at = name.find(MARK)?;
    let (prefix, suffix) = (name[..at].trim_end_matches('_'), &name[at + MARK.len()..]);
    // Not a label key.
    if suffix.is_empty() {
        return None;
    }
    let prefix = if prefix.is_empty() {
        String::new()
    } else {
        format!("{}.", prefix.replace('_', "."))
    };
    Some(format!("{prefix}kubevirt.io/{}", suffix.replace('_', "-")).to_ascii_lowercase())
}

impl Source for RegistrySource {
    fn name(&self) -> String {
        self.url.clone()
    }

    fn open(&self) -> BoxFuture<'_, Result<Opened, ImportError>> {
        Box::pin(async move {
            let store = self.store().await?;
            let manifest = self.manifest(&store).await?;
            let labels = self.check_config(&store, &manifest).await?;
            let (found_tx, found_rx) = oneshot::channel();
            let (verdict_tx, verdict_rx) = oneshot::channel();
            let (tx, rx) = mpsc::channel(4);
            if let Ok(mut state) = self.state.lock() {
                state.labels = labels;
                state.verdict = Some(verdict_rx);
            }
            let walk = Walk {
                handle: Handle::current(),
                store,
                url: self.url.clone(),
                layers: manifest.layers,
            };
            tokio::task::spawn_blocking(move || {
                let mut found = Some(found_tx);
                let result = walk.run(&mut found, &tx);
                if let (Err(e), Some(found)) = (&result, found.take()) {
                    let _ = found.send(Err(e.clone_for_report()));
                } else if let Err(e) = &result {
                    let _ = tx.blocking_send(Err(e.clone_for_report()));
                }
                drop(tx);
                let _ = verdict_tx.send(result);
            });
            let size = found_rx.await.map_err(|_| {
                ImportError::Internal("the registry image's reader ended early".into())
            })??;
            Ok(Opened {
                size: Some(size),
                reader: None,
                stream: Box::new(move |_| Ok(Box::new(StreamReader::new(rx, None)))),
            })
        })
    }
}

/// Reads an image's layers for its disk, on a blocking thread.
struct Walk {
    handle: Handle,
    store: Store,
    url: String,
    layers: Vec<OciDescriptor>,
}

/// Whiteouts of upper layers: paths hidden with all below them, and directories whose lower
/// contents are hidden.
#[derive(Default)]
struct Hidden {
    paths: BTreeSet<String>,
    opaque: BTreeSet<String>,
}

impl Hidden {
    fn hides(&self, path: &str) -> bool {
        let mut at = path;
        if self.paths.contains(at) {
            return true;
        }
        while let Some((parent, _)) = at.rsplit_once('/') {
            if self.paths.contains(parent) || self.opaque.contains(parent) {
                return true;
            }
            at = parent;
        }
        false
    }

    fn extend(&mut self, other: Hidden) {
        self.paths.extend(other.paths);
        self.opaque.extend(other.opaque);
    }
}

/// A tar path as a layer holds it, without `./` or `/` in front or `/` behind.
fn clean(path: &str) -> String {
    let mut p = path;
    loop {
        if let Some(rest) = p.strip_prefix("./") {
            p = rest;
        } else if let Some(rest) = p.strip_prefix('/') {
            p = rest;
        } else {
            break;
        }
    }
    p.trim_end_matches('/').to_string()
}

impl Walk {
    /// Find the disk, send its size through `found` and its bytes through `tx`; the result
    /// says whether the image was what it should be.
    fn run(
        &self,
        found: &mut Option<oneshot::Sender<Result<u64, ImportError>>>,
        tx: &mpsc::Sender<Result<Bytes, ImportError>>,
    ) -> Result<(), ImportError> {
        let mut hidden = Hidden::default();
        for (index, layer) in self.layers.iter().enumerate().rev() {
            let what = format!("layer {} ({})", index + 1, layer.digest);
            let blob = BlobReader::new(self, layer)?;
            let decoded = decoder(blob, &what)?;
            let mut archive = tar::Archive::new(decoded);
            let mut below = Hidden::default();
            let mut disk: Option<String> = None;
            let entries = archive.entries().map_err(|e| self.damaged(&what, e))?;
            for entry in entries {
                let mut entry = entry.map_err(|e| self.damaged(&what, e))?;
                let path = clean(&String::from_utf8_lossy(&entry.path_bytes()));
                let (dir, base) = match path.rsplit_once('/') {
                    Some((d, b)) => (Some(d), b),
                    None => (None, path.as_str()),
                };
                // Whiteouts hide what lower layers have (never their own layer's entries).
                if base == ".wh..wh..opq" {
                    if let Some(dir) = dir {
                        below.opaque.insert(dir.to_string());
                    }
                    continue;
                }
                if let Some(name) = base.strip_prefix(".wh.") {
                    below.paths.insert(match dir {
                        Some(d) => format!("{d}/{name}"),
                        None => name.to_string(),
                    });
                    continue;
                }
                if !path.starts_with(&format!("{DISK_DIR}/")) || hidden.hides(&path) {
                    continue;
                }
                let kind = entry.header().entry_type();
                if !(kind.is_file() || kind == tar::EntryType::Continuous) {
                    continue;
                }
                if let Some(first) = &disk {
                    return Err(ImportError::Unsupported(format!(
                        "{}: {MANY_DISKS} ({first} and {path}); a containerDisk holds one \
                         disk image under /disk",
                        self.url
                    )));
                }
                let size = entry.header().size().map_err(|e| self.damaged(&what, e))?;
                if let Some(found) = found.take() {
                    let _ = found.send(Ok(size));
                }
                tracing::info!(image = %self.url, disk = %path, size, layer = %what, "reading the disk from the image");
                self.send(&mut entry, tx, &what)?;
                disk = Some(path);
            }
            if disk.is_some() {
                // Read the layer to its end, so its digest is checked.
                let mut rest = archive.into_inner();
                std::io::copy(&mut rest, &mut std::io::sink())
                    .map_err(|e| self.damaged(&what, e))?;
                let mut blob = rest.into_blob();
                std::io::copy(&mut blob, &mut std::io::sink())
                    .map_err(|e| self.damaged(&what, e))?;
                return Ok(());
            }
            hidden.extend(below);
        }
        Err(ImportError::Unsupported(format!(
            "{}: {NO_DISK}: no file under /{DISK_DIR} in any layer; a containerDisk holds its \
             disk image as /{DISK_DIR}/<name>",
            self.url
        )))
    }

    /// Send the entry's bytes; once the converter stops reading, read on without sending.
    fn send(
        &self,
        entry: &mut impl Read,
        tx: &mpsc::Sender<Result<Bytes, ImportError>>,
        what: &str,
    ) -> Result<(), ImportError> {
        let mut listening = true;
        loop {
            let mut buf = vec![0u8; CHUNK];
            let mut filled = 0;
            while filled < CHUNK {
                let n = entry
                    .read(&mut buf[filled..])
                    .map_err(|e| self.damaged(what, e))?;
                if n == 0 {
                    break;
                }
                filled += n;
            }
            if filled == 0 {
                return Ok(());
            }
            buf.truncate(filled);
            if listening && tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                listening = false;
            }
        }
    }

    /// A layer that could not be read: a transfer error as it is, anything else as damage.
    fn damaged(&self, what: &str, e: std::io::Error) -> ImportError {
        match e.into_inner() {
            Some(inner) => match inner.downcast::<ImportError>() {
                Ok(import) => *import,
                Err(other) => ImportError::Damaged(format!("{}: {what}: {other}", self.url)),
            },
            None => ImportError::Damaged(format!("{}: {what} could not be read", self.url)),
        }
    }
}

/// A layer's bytes as a blocking `Read`: downloaded on the runtime, resumed by range after a
/// broken connection, and checked against the layer's digest at its end.
struct BlobReader {
    handle: Handle,
    store: Store,
    url: String,
    layer: OciDescriptor,
    stream: Option<BoxStream<'static, std::io::Result<Bytes>>>,
    current: Bytes,
    offset: u64,
    hasher: Option<sha2::Sha256>,
    resumes: u32,
    done: bool,
}

impl BlobReader {
    fn new(walk: &Walk, layer: &OciDescriptor) -> Result<BlobReader, ImportError> {
        let hasher = layer.digest.starts_with("sha256:").then(sha2::Sha256::new);
        let mut reader = BlobReader {
            handle: walk.handle.clone(),
            store: walk.store.clone(),
            url: walk.url.clone(),
            layer: layer.clone(),
            stream: None,
            current: Bytes::new(),
            offset: 0,
            hasher,
            resumes: 0,
            done: false,
        };
        reader.connect()?;
        Ok(reader)
    }

    fn http_error(&self, message: String, status: Option<u16>) -> ImportError {
        ImportError::Http {
            url: format!("{} (blob {})", self.url, self.layer.digest),
            status,
            message,
        }
    }

    /// (Re)start the download at `offset`.
    fn connect(&mut self) -> Result<(), ImportError> {
        let (client, reference, layer, offset) = match &self.store {
            Store::Registry(connection) => (
                connection.client().clone(),
                connection.reference().clone(),
                self.layer.clone(),
                self.offset,
            ),
            Store::Archive(archive) => {
                self.stream = Some(archive.stream(&self.layer.digest, self.offset)?);
                return Ok(());
            }
        };
        let response = self.handle.block_on(async move {
            if offset == 0 {
                client
                    .pull_blob_stream(&reference, &layer)
                    .await
                    .map(|s| (s.stream, true))
            } else {
                client
                    .pull_blob_stream_partial(&reference, &layer, offset, None)
                    .await
                    .map(|r| match r {
                        BlobResponse::Full(s) => (s.stream, false),
                        BlobResponse::Partial(s) => (s.stream, true),
                    })
            }
        });
        match response {
            Ok((stream, true)) => {
                self.stream = Some(stream);
                Ok(())
            }
            Ok((_, false)) => Err(self.http_error(
                format!("the registry cannot resume the download at byte {offset}"),
                None,
            )),
            Err(e) => Err(self.http_error(chain(&e), None)),
        }
    }

    fn finish(&mut self) -> std::io::Result<()> {
        self.done = true;
        if let Some(hasher) = self.hasher.take() {
            let hex: String = hasher
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let actual = format!("sha256:{hex}");
            if actual != self.layer.digest {
                return Err(std::io::Error::other(ImportError::Damaged(format!(
                    "{}: layer {} arrived as {actual}: the download does not match the image",
                    self.url, self.layer.digest
                ))));
            }
        }
        Ok(())
    }
}

impl Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            if self.done {
                return Ok(0);
            }
            let Some(stream) = self.stream.as_mut() else {
                return Ok(0);
            };
            // The stream's own digest check is redundant with ours, but a partial stream has
            // none: every part goes through the one hasher here.
            let next = self.handle.block_on(stream.next());
            match next {
                Some(Ok(chunk)) => self.current = chunk,
                None => self.finish()?,
                Some(Err(e)) => {
                    if self.resumes >= RESUMES {
                        return Err(std::io::Error::other(self.http_error(
                            format!(
                                "the download broke {} times: {}",
                                self.resumes + 1,
                                chain(&e)
                            ),
                            None,
                        )));
                    }
                    self.resumes += 1;
                    tracing::warn!(image = %self.url, layer = %self.layer.digest, offset = self.offset, error = %chain(&e), "resuming a broken layer download");
                    std::thread::sleep(Duration::from_millis(200 << self.resumes.min(5)));
                    self.connect().map_err(std::io::Error::other)?;
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        if let Some(h) = self.hasher.as_mut() {
            h.update(&buf[..n]);
        }
        self.offset += n as u64;
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

/// A layer's tar, decompressed by what its first bytes say (media types lie more often).
enum Decoded {
    Tar(std::io::BufReader<BlobReader>),
    Gzip(Box<flate2::read::MultiGzDecoder<std::io::BufReader<BlobReader>>>),
    Zstd(zstd::Decoder<'static, std::io::BufReader<BlobReader>>),
}

fn decoder(blob: BlobReader, what: &str) -> Result<Decoded, ImportError> {
    use std::io::BufRead;
    let mut buffered = std::io::BufReader::with_capacity(CHUNK, blob);
    let head = buffered
        .fill_buf()
        .map_err(|e| ImportError::Damaged(format!("{what} could not be read: {e}")))?;
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Decoded::Gzip(Box::new(flate2::read::MultiGzDecoder::new(buffered)))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Decoded::Zstd(
            zstd::Decoder::with_buffer(buffered)
                .map_err(|e| ImportError::Damaged(format!("{what}: {e}")))?,
        )
    } else {
        Decoded::Tar(buffered)
    })
}

impl Decoded {
    fn into_blob(self) -> std::io::BufReader<BlobReader> {
        match self {
            Decoded::Tar(r) => r,
            Decoded::Gzip(r) => r.into_inner(),
            Decoded::Zstd(r) => r.finish(),
        }
    }
}

impl Read for Decoded {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Decoded::Tar(r) => r.read(buf),
            Decoded::Gzip(r) => r.read(buf),
            Decoded::Zstd(r) => r.read(buf),
        }
    }
}

impl ImportError {
    /// A copy for a second reader of the same failure (the message and its kind, which is
    /// what reports use).
    fn clone_for_report(&self) -> ImportError {
        match self {
            ImportError::Http {
                url,
                status,
                message,
            } => ImportError::Http {
                url: url.clone(),
                status: *status,
                message: message.clone(),
            },
            ImportError::Damaged(m) => ImportError::Damaged(m.clone()),
            ImportError::Unsupported(m) => ImportError::Unsupported(m.clone()),
            ImportError::Config(m) => ImportError::Config(m.clone()),
            other => ImportError::Internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_environment_names_become_upstreams_labels() {
        assert_eq!(
            env_label("INSTANCETYPE_KUBEVIRT_IO_DEFAULT_INSTANCETYPE").as_deref(),
            Some("instancetype.kubevirt.io/default-instancetype")
        );
        assert_eq!(
            env_label("INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE_KIND").as_deref(),
            Some("instancetype.kubevirt.io/default-preference-kind")
        );
        assert_eq!(
            env_label("KUBEVIRT_IO_TEST_TEST").as_deref(),
            Some("kubevirt.io/test-test")
        );
        assert_eq!(
            env_label("TEST_TEST_KUBEVIRT_IO_TEST").as_deref(),
            Some("test.test.kubevirt.io/test")
        );
        assert_eq!(env_label("PATH"), None);
        assert_eq!(env_label("A_KUBEVIRT_IO_"), None);
    }

    #[test]
    fn the_config_says_architecture_bootc_and_labels() {
        let config = serde_json::json!({
            "architecture": "arm64",
            "config": {
                "Env": ["PATH=/bin", "INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE=fedora", "BROKEN"],
                "Labels": {"containers.bootc": "1"},
            },
        });
        let read = ImageConfig::read(&config);
        assert_eq!(read.architecture.as_deref(), Some("arm64"));
        assert!(read.bootc);
        assert_eq!(
            read.kubevirt_labels,
            BTreeMap::from([(
                "instancetype.kubevirt.io/default-preference".to_string(),
                "fedora".to_string()
            )])
        );
        // Anything may be in a config: nothing there panics or is taken for what it is not.
        let odd =
            ImageConfig::read(&serde_json::json!({"config": {"Env": [1, null], "Labels": "x"}}));
        assert_eq!(odd, ImageConfig::default());
    }

    #[test]
    fn whiteouts_hide_paths_and_what_is_below_them() {
        let mut hidden = Hidden::default();
        hidden.paths.insert("disk/old.img".into());
        hidden.opaque.insert("disk/sub".into());
        assert!(hidden.hides("disk/old.img"));
        assert!(!hidden.hides("disk/new.img"));
        assert!(hidden.hides("disk/sub/a.img"));
        assert!(!hidden.hides("disk/sub"));
        hidden.paths.insert("disk".into());
        assert!(hidden.hides("disk/new.img"));
        assert_eq!(clean("./disk/a.img"), "disk/a.img");
        assert_eq!(clean("/disk/"), "disk");
    }

    #[test]
    fn registry_urls_are_docker_references() {
        let s = RegistrySource::new(
            "docker://127.0.0.1:5000/vm/disk:v1",
            None,
            vec![],
            false,
            None,
        )
        .unwrap();
        let Origin::Registry(image) = &s.origin else {
            panic!("a registry")
        };
        assert_eq!(image.reference().registry(), "127.0.0.1:5000");
        assert_eq!(image.reference().repository(), "vm/disk");
        assert_eq!(image.reference().tag(), Some("v1"));
        let err = RegistrySource::new("http://x/y", None, vec![], false, None)
            .err()
            .unwrap();
        assert!(err.to_string().contains("docker://"), "{err}");
        for (url, location) in [
            ("oci-archive:https://files/d.tar", "https://files/d.tar"),
            ("oci-archive://files:8080/d.tar", "//files:8080/d.tar"),
        ] {
            let s = RegistrySource::new(url, None, vec![], false, None).unwrap();
            assert!(
                matches!(&s.origin, Origin::Archive { location: l, .. } if l == location),
                "{url}"
            );
        }
        for url in ["oci-archive:/images/d.tar", "oci-archive:///d.tar"] {
            let err = RegistrySource::new(url, None, vec![], false, None)
                .err()
                .unwrap();
            assert!(err.to_string().contains(ARCHIVE_ELSEWHERE), "{url}: {err}");
        }
    }
}
