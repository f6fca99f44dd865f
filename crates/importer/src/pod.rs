//! The importer pod's contract with the import controller: upstream's environment variables in,
//! the image on the volume and a JSON termination message out.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cdi_core::Quantity;
use cdi_core::size::{self, Overhead, VolumeMode};

use crate::convert::{Progress, Tuning};
use crate::error::ImportError;
use crate::import::{self, ImportOptions, SizeSpec, TargetSpec};
use crate::sources::http::{HttpSource, RetryPolicy};

/// Upstream's message for a successful import.
pub const COMPLETE_MESSAGE: &str = "Import Complete";

/// Where things are inside the pod; every path can be moved for running outside one.
#[derive(Debug, Clone)]
pub struct PodPaths {
    /// The filesystem volume's mount point; the image is `disk.img` in it.
    pub data_dir: PathBuf,
    /// The block volume's device; its existence means the volume is Block.
    pub block_device: PathBuf,
    pub scratch_dir: PathBuf,
    pub termination_log: PathBuf,
    /// Mounted secrets, one file per extra header.
    pub extra_headers_dir: PathBuf,
    /// Where paths named by the environment (the CA directory) are, when the pod is a directory
    /// on the host (`cdi dev`).
    pub root: Option<PathBuf>,
    /// The filesystem volume's size when the pod was told it (`cdi dev`), instead of the free
    /// space of the filesystem holding the data directory.
    pub data_capacity: Option<u64>,
}

impl PodPaths {
    /// Every path moved below `root` (see `cdi_core::devpod`).
    pub fn in_root(self, root: Option<PathBuf>) -> PodPaths {
        let at = |p: PathBuf| cdi_core::devpod::in_root(root.as_deref(), &p);
        PodPaths {
            data_dir: at(self.data_dir),
            block_device: at(self.block_device),
            scratch_dir: at(self.scratch_dir),
            termination_log: at(self.termination_log),
            extra_headers_dir: at(self.extra_headers_dir),
            root,
            data_capacity: self.data_capacity,
        }
    }
}

impl Default for PodPaths {
    fn default() -> Self {
        PodPaths {
            data_dir: "/data".into(),
            block_device: "/dev/cdi-block-volume".into(),
            scratch_dir: "/scratch".into(),
            termination_log: "/dev/termination-log".into(),
            extra_headers_dir: "/extraheaders".into(),
            root: None,
            data_capacity: None,
        }
    }
}

/// What kind of data the import produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentType {
    /// A disk image, converted to raw.
    KubeVirt,
    /// A tar archive unpacked onto the filesystem volume.
    Archive,
}

/// The source as the environment describes it.
#[derive(Debug, Clone)]
pub enum PodSource {
    Http(HttpSource),
    /// `registry`: a containerDisk image.
    Registry(Arc<crate::sources::registry::RegistrySource>),
    /// `none`: a blank image.
    Blank,
}

/// The importer's configuration, read from the environment.
#[derive(Debug, Clone)]
pub struct PodConfig {
    pub source: PodSource,
    pub content_type: ContentType,
    /// The claim's request in bytes.
    pub image_size: Option<u64>,
    pub overhead: Overhead,
    pub preallocation: bool,
    pub checksum: Option<crate::checksum::Checksum>,
    pub owner_uid: String,
}

pub use cdi_api::termination::{FailureReason, TerminationMessage};

/// Write the termination message (JSON, within kubelet's limit).
pub fn write_termination_message(path: &Path, message: &TerminationMessage) -> std::io::Result<()> {
    std::fs::write(path, message.to_json())
}

fn env_bool(env: &HashMap<String, String>, name: &str) -> Result<bool, ImportError> {
    match env.get(name).map(|s| s.trim()) {
        None | Some("") => Ok(false),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "1" | "t" | "true" => Ok(true),
            "0" | "f" | "false" => Ok(false),
            _ => Err(ImportError::Config(format!(
                "{name}={v:?} is not a boolean; use \"true\" or \"false\""
            ))),
        },
    }
}

fn split_header(line: &str, origin: &str) -> Result<(String, String), ImportError> {
    let (name, value) = line.split_once(':').ok_or_else(|| {
        ImportError::Config(format!("extra header from {origin} is not \"Name: value\""))
    })?;
    Ok((name.trim().to_string(), value.trim().to_string()))
}

/// The CA certificates of `IMPORTER_CERT_DIR` (the DataVolume's `certConfigMap`), if set.
fn cert_dir(env: &HashMap<String, String>, paths: &PodPaths) -> Result<Vec<Vec<u8>>, ImportError> {
    match env.get(cdi_api::env::CERT_DIR).filter(|d| !d.is_empty()) {
        Some(dir) => read_cert_dir(&cdi_core::devpod::in_root(
            paths.root.as_deref(),
            Path::new(dir),
        )),
        None => Ok(Vec::new()),
    }
}

/// PEM files of a CA directory (a mounted ConfigMap: dot entries are its bookkeeping).
fn read_cert_dir(dir: &Path) -> Result<Vec<Vec<u8>>, ImportError> {
    let mut certs = Vec::new();
    let entries = std::fs::read_dir(dir)
        .map_err(|e| ImportError::io(format!("reading {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| ImportError::io(format!("reading {}", dir.display()), e))?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') || entry.path().is_dir() {
            continue;
        }
        certs.push(
            std::fs::read(entry.path())
                .map_err(|e| ImportError::io(format!("reading {}", entry.path().display()), e))?,
        );
    }
    Ok(certs)
}

/// Secret headers: every regular file under `dir` (not dot files or dot directories).
fn read_secret_headers(dir: &Path, out: &mut Vec<(String, String)>) -> Result<(), ImportError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let hidden = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if hidden {
            continue;
        }
        if path.is_dir() {
            read_secret_headers(&path, out)?;
        } else {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| ImportError::io(format!("reading {}", path.display()), e))?;
            out.push(split_header(text.trim_end(), "a mounted secret")?);
        }
    }
    Ok(())
}

/// The variable `name`, when set and not empty.
fn env_str<'a>(env: &'a HashMap<String, String>, name: &str) -> Option<&'a str> {
    env.get(name).map(String::as_str).filter(|v| !v.is_empty())
}

/// The source's endpoint (`IMPORTER_ENDPOINT`), which every kind but a blank image needs.
fn endpoint<'a>(env: &'a HashMap<String, String>, kind: &str) -> Result<&'a str, ImportError> {
    env_str(env, cdi_api::env::ENDPOINT).ok_or_else(|| {
        ImportError::Config(format!(
            "{} is required for {kind} source",
            cdi_api::env::ENDPOINT
        ))
    })
}

/// The access key and secret key, when both are given.
fn key_pair(env: &HashMap<String, String>) -> Option<(String, String)> {
    use cdi_api::env as e;
    match (env_str(env, e::ACCESS_KEY_ID), env_str(env, e::SECRET_KEY)) {
        (Some(u), Some(p)) => Some((u.to_string(), p.to_string())),
        _ => None,
    }
}

impl PodConfig {
    /// Read the configuration from upstream's environment variables.
    pub fn from_env(
        env: &HashMap<String, String>,
        paths: &PodPaths,
    ) -> Result<PodConfig, ImportError> {
        use cdi_api::env as e;
        let get = |k: &str| env_str(env, k);
        let content_type = match get(e::CONTENT_TYPE).unwrap_or("kubevirt") {
            "kubevirt" => ContentType::KubeVirt,
            "archive" => ContentType::Archive,
            other => {
                return Err(ImportError::Config(format!(
                    "{}={other:?}: use kubevirt or archive",
                    e::CONTENT_TYPE
                )));
            }
        };
        let image_size = match get(e::IMAGE_SIZE) {
            None => None,
            Some(text) => Some(
                text.parse::<Quantity>()
                    .map_err(|err| ImportError::Config(format!("{}: {err}", e::IMAGE_SIZE)))?
                    .value()
                    .max(0) as u64,
            ),
        };
        let overhead = match get(e::FILESYSTEM_OVERHEAD) {
            None => Overhead::ZERO,
            Some(v) => v
                .parse()
                .map_err(|err| ImportError::Config(format!("{}: {err}", e::FILESYSTEM_OVERHEAD)))?,
        };
        let checksum = get(e::CHECKSUM)
            .map(|c| {
                c.parse()
                    .map_err(|err| ImportError::Config(format!("{}: {err}", e::CHECKSUM)))
            })
            .transpose()?;
        let source = PodSource::from_env(env, paths)?;
        Ok(PodConfig {
            source,
            content_type,
            image_size,
            overhead,
            preallocation: env_bool(env, e::PREALLOCATION)?,
            checksum,
            owner_uid: env.get(e::OWNER_UID).cloned().unwrap_or_default(),
        })
    }
}

impl PodSource {
    /// The source `IMPORTER_SOURCE` names (http when unset), with what its kind reads from the
    /// environment and the mounted files.
    fn from_env(env: &HashMap<String, String>, paths: &PodPaths) -> Result<PodSource, ImportError> {
        match env_str(env, cdi_api::env::SOURCE).unwrap_or("http") {
            "none" => Ok(PodSource::Blank),
            "http" => http_source(env, paths),
            "s3" => s3_source(env, paths),
            "gcs" => gcs_source(env, paths),
            "registry" => registry_source(env, paths),
            other => Err(ImportError::Config(format!(
                "Unable to connect to {other} data source: cdi-rs does not import from {other} sources yet"
            ))),
        }
    }
}

/// An HTTP(S) URL, with basic auth from the key pair and extra headers from numbered variables
/// and mounted secrets.
fn http_source(env: &HashMap<String, String>, paths: &PodPaths) -> Result<PodSource, ImportError> {
    use cdi_api::env as e;
    let url = endpoint(env, "an http")?.to_string();
    let basic_auth = key_pair(env);
    let mut headers = Vec::new();
    let mut numbered: Vec<(&String, &String)> = env
        .iter()
        .filter(|(k, _)| k.starts_with(e::EXTRA_HEADER_PREFIX))
        .collect();
    numbered.sort();
    for (name, value) in numbered {
        headers.push(split_header(value, name)?);
    }
    read_secret_headers(&paths.extra_headers_dir, &mut headers)?;
    let ca_certs_pem = cert_dir(env, paths)?;
    Ok(PodSource::Http(HttpSource {
        url,
        basic_auth,
        headers,
        ca_certs_pem,
        insecure: env_bool(env, e::INSECURE_TLS)?,
        retry: RetryPolicy::default(),
        signer: None,
    }))
}

/// An S3 object, signed with the key pair (required).
fn s3_source(env: &HashMap<String, String>, paths: &PodPaths) -> Result<PodSource, ImportError> {
    use cdi_api::env as e;
    let url = endpoint(env, "an s3")?;
    // Upstream has no anonymous S3 either.
    let (Some(key), Some(secret)) = (env_str(env, e::ACCESS_KEY_ID), env_str(env, e::SECRET_KEY))
    else {
        return Err(ImportError::Config(format!(
            "Unable to connect to s3 data source: no credentials ({} and {}); name a Secret with accessKeyId and secretKey in the DataVolume's spec.source.s3.secretRef",
            e::ACCESS_KEY_ID,
            e::SECRET_KEY
        )));
    };
    let ca_certs_pem = cert_dir(env, paths)?;
    Ok(PodSource::Http(crate::sources::s3::source(
        url,
        key,
        secret,
        ca_certs_pem,
    )?))
}

/// A GCS object, signed with a mounted service account key, or read anonymously without one.
fn gcs_source(env: &HashMap<String, String>, paths: &PodPaths) -> Result<PodSource, ImportError> {
    let url = endpoint(env, "a gcs")?;
    // The Secret's key file, where upstream mounts it; without one, anonymous.
    let account = match env_str(env, cdi_api::env::GOOGLE_CREDENTIALS) {
        Some(file) => {
            let path = cdi_core::devpod::in_root(paths.root.as_deref(), Path::new(file));
            let json = std::fs::read(&path).map_err(|err| {
                ImportError::Config(format!(
                    "Unable to connect to gcs data source: reading the service account key {file}: {err}; the DataVolume's secretRef must name a Secret holding credentials.json"
                ))
            })?;
            Some(crate::sources::gcs::ServiceAccount::from_json(&json, file)?)
        }
        None => None,
    };
    Ok(PodSource::Http(crate::sources::gcs::source(
        url,
        account,
        cert_dir(env, paths)?,
    )?))
}

/// A containerDisk image in a registry, with the key pair as its credentials.
fn registry_source(
    env: &HashMap<String, String>,
    paths: &PodPaths,
) -> Result<PodSource, ImportError> {
    use cdi_api::env as e;
    let url = endpoint(env, "a registry")?;
    let credentials = key_pair(env);
    Ok(PodSource::Registry(Arc::new(
        crate::sources::registry::RegistrySource::new(
            url,
            credentials,
            cert_dir(env, paths)?,
            env_bool(env, e::INSECURE_TLS)?,
            env_str(env, e::REGISTRY_IMAGE_ARCHITECTURE).map(str::to_string),
        )?,
    )))
}

/// Free bytes of the filesystem holding `dir`.
fn available_space(dir: &Path) -> Result<u64, ImportError> {
    let stat = rustix::fs::statvfs(dir)
        .map_err(|e| ImportError::io(format!("measuring {}", dir.display()), e.into()))?;
    Ok(stat.f_bavail * stat.f_frsize)
}

/// The pod's volume: where the image goes, the volume mode, and the space it offers (the device
/// size of a Block volume; the size the pod was told, else the free space, of a Filesystem one).
pub fn volume(paths: &PodPaths) -> Result<(TargetSpec, VolumeMode, u64), ImportError> {
    if paths.block_device.exists() {
        let capacity = crate::writer::Target::open_block(&paths.block_device)?.size()?;
        return Ok((
            TargetSpec::Block(paths.block_device.clone()),
            VolumeMode::Block,
            capacity,
        ));
    }
    let capacity = match paths.data_capacity {
        Some(bytes) => bytes,
        None => available_space(&paths.data_dir)?,
    };
    // The volume's disk.img is the pod's own and is written in place (no second copy fits a
    // volume sized for one image); see TargetSpec::VolumeFile.
    Ok((
        TargetSpec::VolumeFile(paths.data_dir.join("disk.img")),
        VolumeMode::Filesystem,
        capacity,
    ))
}

/// Run the import the configuration describes; the returned message is the success message.
pub async fn run(
    config: &PodConfig,
    paths: &PodPaths,
    progress: Arc<Progress>,
) -> Result<TerminationMessage, ImportError> {
    let (target, mode, capacity) = volume(paths)?;
    let block = mode == VolumeMode::Block;
    let size = config.image_size.map(|requested| SizeSpec {
        requested,
        capacity,
    });
    let done = || TerminationMessage {
        scratch_space_required: None,
        preallocation_applied: Some(config.preallocation),
        message: Some(COMPLETE_MESSAGE.to_string()),
        ..Default::default()
    };

    match (&config.source, config.content_type) {
        (PodSource::Blank, ContentType::Archive) => Err(ImportError::Config(
            "Cannot create empty disk with content type archive".into(),
        )),
        (PodSource::Blank, ContentType::KubeVirt) => {
            blank(&target, mode, size, config.overhead, config.preallocation)?;
            Ok(done())
        }
        (PodSource::Http(src), ContentType::Archive) => {
            if block {
                return Err(ImportError::Config(
                    "contentType archive needs a Filesystem volume, not Block".into(),
                ));
            }
            crate::archive::unpack(
                src,
                &paths.data_dir,
                capacity,
                config.checksum.as_ref(),
                progress,
            )
            .await?;
            Ok(done())
        }
        (PodSource::Registry(_), ContentType::Archive) => Err(ImportError::Config(
            "Unsupported content type archive when importing from a registry: its disk image is \
             imported with contentType kubevirt"
                .into(),
        )),
        (PodSource::Registry(src), ContentType::KubeVirt) => {
            disk_image(src.as_ref(), config, paths, target, mode, size, progress).await?;
            // A second disk below the one converted, or a layer not matching its digest, shows
            // only once the whole layer is read.
            src.finish().await?;
            let labels = src.labels();
            Ok(TerminationMessage {
                labels: (!labels.is_empty()).then_some(labels),
                ..done()
            })
        }
        (PodSource::Http(src), ContentType::KubeVirt) => {
            disk_image(src, config, paths, target, mode, size, progress).await?;
            Ok(done())
        }
    }
}

/// Import a disk image from `src` into the pod's volume.
async fn disk_image(
    src: &dyn crate::sources::Source,
    config: &PodConfig,
    paths: &PodPaths,
    target: TargetSpec,
    mode: VolumeMode,
    size: Option<SizeSpec>,
    progress: Arc<Progress>,
) -> Result<(), ImportError> {
    let opts = ImportOptions {
        target,
        size,
        overhead: config.overhead.for_mode(mode),
        preallocate: config.preallocation,
        checksum: config.checksum.clone(),
        scratch_dir: paths.scratch_dir.clone(),
        scratch_mounted: true,
        tuning: Tuning::default(),
    };
    let report = import::import(src, &opts, progress).await?;
    tracing::info!(
        format = %report.format,
        virtual_size = report.virtual_size,
        final_size = report.final_size,
        transferred = report.transferred,
        written = report.written,
        scratch = report.scratch_used,
        "import complete"
    );
    Ok(())
}

/// A blank image: on a filesystem, a sparse file of the usable size (allocated when asked); on a
/// block device, nothing to do unless preallocation asks for zeros.
fn blank(
    target: &TargetSpec,
    mode: VolumeMode,
    size: Option<SizeSpec>,
    overhead: Overhead,
    preallocate: bool,
) -> Result<(), ImportError> {
    let size =
        size.ok_or_else(|| ImportError::Config("a blank image needs IMPORTER_IMAGE_SIZE".into()))?;
    match target {
        TargetSpec::File(path) | TargetSpec::VolumeFile(path) => {
            let len =
                size::resize_target(mode, size.capacity as i64, size.requested as i64, overhead)
                    as u64;
            let t = crate::writer::Target::create_file(path)?;
            t.set_len(len)?;
            if preallocate {
                t.preallocate(len)?;
            }
            t.sync()
        }
        TargetSpec::Block(path) => {
            if !preallocate {
                return Ok(());
            }
            let t = crate::writer::Target::open_block(path)?;
            let len = t.size()?.min(size.requested);
            let device = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| ImportError::io(format!("opening {}", path.display()), e))?;
            let zeros = vec![0u8; 1 << 20];
            let mut offset = 0;
            while offset < len {
                let n = (len - offset).min(zeros.len() as u64) as usize;
                std::os::unix::fs::FileExt::write_all_at(&device, &zeros[..n], offset)
                    .map_err(|e| ImportError::io(format!("zeroing {}", path.display()), e))?;
                offset += n as u64;
            }
            t.sync()
        }
    }
}
