//! The import state machine: Info → Transfer/Convert → Resize → Complete (or Error), for one
//! source into one target.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cdi_core::size::{self, Overhead, VolumeMode};

use crate::checksum::{Checksum, Hasher};
use crate::convert::{self, Progress, Tuning};
use crate::error::ImportError;
use crate::probe::{self, Compression, Detected, Format, PROBE_LEN};
use crate::qemu;
use crate::reader::{FileReader, RangeReader};
use crate::writer::{Op, Target, TargetKind, WriteStats};

/// Where the image goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSpec {
    /// A disk image file on a Filesystem volume (`/data/disk.img`).
    File(PathBuf),
    /// A block device (`/dev/cdi-block-volume`).
    Block(PathBuf),
}

/// How large the image may and should be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeSpec {
    /// The claim's request in bytes (`IMPORTER_IMAGE_SIZE`).
    pub requested: u64,
    /// The space the volume offers, in bytes (free space of the filesystem, or the device size).
    pub capacity: u64,
}

/// Everything an import needs besides the source.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    pub target: TargetSpec,
    /// `None`: the image keeps its own virtual size.
    pub size: Option<SizeSpec>,
    pub overhead: Overhead,
    pub preallocate: bool,
    pub checksum: Option<Checksum>,
    /// For the few cases that need a scratch copy (a compressed non-raw image).
    pub scratch_dir: PathBuf,
    pub tuning: Tuning,
}

/// The phases of an import, as upstream names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Info,
    Transfer,
    Convert,
    Resize,
    Complete,
}

/// What an import did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportReport {
    pub format: Format,
    pub compression: Option<Compression>,
    pub virtual_size: u64,
    /// The image's final size on the target.
    pub final_size: u64,
    /// Source bytes transferred.
    pub transferred: u64,
    pub written: u64,
    pub holes: u64,
    pub scratch_used: bool,
    pub preallocated: bool,
    pub elapsed: Duration,
}

/// The size the image must be grown to, and the most it may be.
fn size_limit(opts: &ImportOptions, target: &Target) -> Result<Option<u64>, ImportError> {
    match (&opts.target, opts.size) {
        (TargetSpec::Block(_), _) => Ok(Some(target.size()?)),
        (TargetSpec::File(_), Some(s)) => Ok(Some(size::resize_target(
            VolumeMode::Filesystem,
            s.capacity as i64,
            s.requested as i64,
            opts.overhead,
        ) as u64)),
        (TargetSpec::File(_), None) => Ok(None),
    }
}

fn check_fits(virtual_size: u64, limit: Option<u64>) -> Result<(), ImportError> {
    match limit {
        Some(usable) if virtual_size > usable => Err(ImportError::TooLarge {
            virtual_size,
            usable,
        }),
        _ => Ok(()),
    }
}

fn open_target(spec: &TargetSpec) -> Result<Target, ImportError> {
    match spec {
        TargetSpec::File(p) => Target::create_file(p),
        TargetSpec::Block(p) => Target::open_block(p),
    }
}

/// Hash a whole local file.
fn hash_file(path: &Path, checksum: &Checksum) -> Result<String, ImportError> {
    let mut file = std::fs::File::open(path)
        .map_err(|e| ImportError::io(format!("opening {}", path.display()), e))?;
    let mut hasher = Hasher::new(checksum.algorithm);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| ImportError::io(format!("reading {}", path.display()), e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finish())
}

/// Import a local file.
pub async fn import_file(
    src: &Path,
    opts: &ImportOptions,
    progress: Arc<Progress>,
) -> Result<ImportReport, ImportError> {
    let started = Instant::now();
    match import_file_inner(src, opts, &progress).await {
        Ok(mut report) => {
            report.elapsed = started.elapsed();
            Ok(report)
        }
        Err(err) => {
            // Whatever the target held is not the requested image: leave nothing that claims to be.
            discard(&opts.target);
            Err(err)
        }
    }
}

async fn import_file_inner(
    src: &Path,
    opts: &ImportOptions,
    progress: &Progress,
) -> Result<ImportReport, ImportError> {
    if let Some(expected) = &opts.checksum {
        let (path, checksum) = (src.to_path_buf(), expected.clone());
        let actual = blocking(move || hash_file(&path, &checksum)).await?;
        if actual != expected.hex {
            return Err(ImportError::ChecksumMismatch {
                expected: expected.to_string(),
                actual: format!("{}:{actual}", expected.algorithm.name()),
            });
        }
    }
    let reader = Arc::new(FileReader::open(src)?);
    progress
        .total
        .store(reader.size(), std::sync::atomic::Ordering::Relaxed);
    import_reader(reader, Some(src), opts, progress).await
}

/// Remove a half-written file target, so nothing claims to be a complete image.
fn discard(target: &TargetSpec) {
    if let TargetSpec::File(path) = target {
        let _ = std::fs::remove_file(path);
    }
}

/// Detect the format of a random-access source and convert it into the target.
pub async fn import_reader<R: RangeReader>(
    reader: Arc<R>,
    local_path: Option<&Path>,
    opts: &ImportOptions,
    progress: &Progress,
) -> Result<ImportReport, ImportError> {
    // Info.
    let len = reader.size();
    let head = reader.read_at(0, PROBE_LEN.min(len as usize)).await?;
    let detected = match probe::probe(&head) {
        Detected::Image(Format::Raw)
            if len >= 512 && probe::probe_footer(&reader.read_at(len - 512, 512).await?) =>
        {
            Detected::Image(Format::Vhd)
        }
        other => other,
    };
    let target = open_target(&opts.target)?;
    let limit = size_limit(opts, &target)?;
    let zero_fill = target.kind() == TargetKind::Block;

    let (format, virtual_size, stats, compression, scratch_used) = match detected {
        Detected::Image(format @ (Format::Raw | Format::Iso)) => {
            check_fits(len, limit)?;
            target.set_len(len.max(limit.unwrap_or(0)))?;
            let writer = target.writer(opts.tuning.parallel)?;
            convert::copy_raw(reader.clone(), len, writer.sender(), opts.tuning, progress).await?;
            (format, len, writer.finish().await?, None, false)
        }
        Detected::Image(Format::Qcow2) => {
            let header = convert::read_qcow2_header(reader.as_ref()).await?;
            check_fits(header.virtual_size, limit)?;
            target.set_len(header.virtual_size.max(limit.unwrap_or(0)))?;
            let writer = target.writer(opts.tuning.parallel)?;
            convert::convert_qcow2(
                reader.clone(),
                &header,
                writer.sender(),
                zero_fill,
                opts.tuning,
                progress,
            )
            .await?;
            (
                Format::Qcow2,
                header.virtual_size,
                writer.finish().await?,
                None,
                false,
            )
        }
        Detected::Image(format) => {
            let path = local_path.ok_or_else(|| {
                ImportError::Internal(format!("{format} images are converted from a local copy"))
            })?;
            let (p, f) = (path.to_path_buf(), format);
            let virtual_size = blocking(move || qemu::inspect(&p, f)).await?;
            check_fits(virtual_size, limit)?;
            target.set_len(virtual_size.max(limit.unwrap_or(0)))?;
            let (p, t) = (path.to_path_buf(), target.path().to_path_buf());
            blocking(move || qemu::convert_to_raw(&p, f, &t)).await?;
            progress.add(len);
            // qemu-img wrote the data itself; the file's allocation tells what it wrote.
            (format, virtual_size, WriteStats::default(), None, false)
        }
        Detected::Compressed(compression) => {
            let path = local_path.ok_or_else(|| {
                ImportError::Internal("compressed images stream from a local file".into())
            })?;
            let report =
                import_compressed(path, compression, &target, limit, opts, progress).await?;
            (report.0, report.1, report.2, Some(compression), report.3)
        }
    };

    // Resize: only ever grow.
    let final_size = match (&opts.target, limit) {
        (TargetSpec::File(_), Some(l)) => virtual_size.max(l),
        (TargetSpec::File(_), None) => virtual_size,
        (TargetSpec::Block(_), _) => target.size()?,
    };
    target.set_len(final_size)?;
    if opts.preallocate {
        target.preallocate(final_size)?;
    }
    target.sync()?;
    Ok(ImportReport {
        format,
        compression,
        virtual_size,
        final_size,
        transferred: progress.done.load(std::sync::atomic::Ordering::Relaxed),
        written: stats.written,
        holes: stats.holes,
        scratch_used,
        preallocated: opts.preallocate,
        elapsed: Duration::ZERO,
    })
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ImportError> + Send + 'static,
) -> Result<T, ImportError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ImportError::Internal(e.to_string()))?
}

/// A decompressing reader for a stream compression.
pub fn decoder<'a>(
    compression: Compression,
    input: Box<dyn Read + Send + 'a>,
) -> Result<Box<dyn Read + Send + 'a>, ImportError> {
    Ok(match compression {
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(input)),
        Compression::Xz => Box::new(liblzma::read::XzDecoder::new_multi_decoder(input)),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::new(input)
                .map_err(|e| ImportError::io("starting zstd", e))?,
        ),
    })
}

/// Read up to `buf.len()` bytes, stopping early only at the end of the stream.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// A compressed local file: a raw image inside streams straight to the target; anything else is
/// decompressed to scratch first (its tables must be read at random).
async fn import_compressed(
    path: &Path,
    compression: Compression,
    target: &Target,
    limit: Option<u64>,
    opts: &ImportOptions,
    progress: &Progress,
) -> Result<(Format, u64, WriteStats, bool), ImportError> {
    let src = path.to_path_buf();
    let open = move || -> Result<Box<dyn Read + Send>, ImportError> {
        let file = std::fs::File::open(&src)
            .map_err(|e| ImportError::io(format!("opening {}", src.display()), e))?;
        decoder(
            compression,
            Box::new(std::io::BufReader::with_capacity(1 << 20, file)),
        )
    };
    let mut peek = open()?;
    let mut head = vec![0u8; PROBE_LEN];
    let n = read_full(&mut peek, &mut head)
        .map_err(|e| ImportError::Damaged(format!("{}: {e}", compression.name())))?;
    head.truncate(n);
    drop(peek);
    let inner = match probe::probe(&head) {
        Detected::Image(f) => f,
        Detected::Compressed(c) => {
            return Err(ImportError::Unsupported(format!(
                "{} inside {}: decompress one layer first",
                c.name(),
                compression.name()
            )));
        }
    };
    // A bomb cannot write more than the target holds (plus the metadata a format may carry).
    let bound = limit.map(|l| l + l / 8 + (64 << 20)).unwrap_or(u64::MAX);
    let chunk = opts.tuning.request_bytes as usize;

    if matches!(inner, Format::Raw | Format::Iso) {
        let writer = target.writer(opts.tuning.parallel)?;
        let tx = writer.sender();
        let mut reader = open()?;
        let limit_for_raw = limit;
        let total = tokio::task::spawn_blocking(move || -> Result<u64, ImportError> {
            let mut offset = 0u64;
            loop {
                let mut buf = vec![0u8; chunk];
                let n = read_full(&mut reader, &mut buf)
                    .map_err(|e| ImportError::Damaged(format!("{}: {e}", compression.name())))?;
                if n == 0 {
                    return Ok(offset);
                }
                buf.truncate(n);
                offset += n as u64;
                if let Some(usable) = limit_for_raw
                    && offset > usable
                {
                    return Err(ImportError::TooLarge {
                        virtual_size: offset,
                        usable,
                    });
                }
                tx.blocking_send(Op::Data {
                    offset: offset - n as u64,
                    data: Bytes::from(buf),
                })
                .map_err(|_| ImportError::Internal("the writer stopped early".into()))?;
            }
        })
        .await
        .map_err(|e| ImportError::Internal(e.to_string()))?;
        let stats = writer.finish().await?;
        let total = total?;
        progress.add(std::fs::metadata(path).map(|m| m.len()).unwrap_or(0));
        return Ok((inner, total, stats, false));
    }

    // Decompress to scratch, then import the scratch copy.
    std::fs::create_dir_all(&opts.scratch_dir)
        .map_err(|e| ImportError::io(format!("creating {}", opts.scratch_dir.display()), e))?;
    let scratch = opts.scratch_dir.join("cdi-scratch.img");
    let dst = scratch.clone();
    let mut reader = open()?;
    blocking(move || {
        let mut out = std::fs::File::create(&dst)
            .map_err(|e| ImportError::io(format!("creating {}", dst.display()), e))?;
        let mut written = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = read_full(&mut reader, &mut buf)
                .map_err(|e| ImportError::Damaged(format!("{}: {e}", compression.name())))?;
            if n == 0 {
                return Ok(());
            }
            written += n as u64;
            if written > bound {
                return Err(ImportError::Damaged(format!(
                    "decompressed data exceeds {bound} bytes, more than the target can hold"
                )));
            }
            std::io::Write::write_all(&mut out, &buf[..n])
                .map_err(|e| ImportError::io(format!("writing {}", dst.display()), e))?;
        }
    })
    .await?;
    let inner_opts = ImportOptions {
        checksum: None,
        ..opts.clone()
    };
    let result = Box::pin(import_reader(
        Arc::new(FileReader::open(&scratch)?),
        Some(&scratch),
        &inner_opts,
        progress,
    ))
    .await;
    let _ = std::fs::remove_file(&scratch);
    let report = result?;
    let _ = target;
    Ok((
        report.format,
        report.virtual_size,
        WriteStats {
            written: report.written,
            holes: report.holes,
        },
        true,
    ))
}
