//! The import state machine: Info → Transfer/Convert → Resize → Complete (or Error), for one
//! source into one target.
//!
//! Random-access sources (local files, HTTP servers with range support) are converted in place:
//! raw and qcow2 need no scratch space. Sequential sources (a server without ranges, a
//! compressed stream, a download that must be checksummed first, an upload) convert raw and
//! qcow2 images as they arrive and spool anything else to scratch, and so a qcow2 image whose
//! layout does not stream (see `formats::qcow2::stream`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cdi_core::size::{self, Overhead, VolumeMode};

use crate::checksum::{Checksum, Hasher};
use crate::convert::{Progress, Tuning};
use crate::error::ImportError;
use crate::formats;
use crate::formats::probe::{self, Compression, Detected, Format, PROBE_LEN};
use crate::reading::{Counting, peek, read_full};
use crate::sources::file::{FileReader, FileSource};
use crate::sources::{RangeReader, Source};
use crate::task::blocking;
use crate::writer::{Target, TargetKind, WriteStats};

// Its public path before it moved to `reading`.
pub use crate::reading::decoder;

/// Where the image goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSpec {
    /// A disk image file that may hold data of its own (`cdi import DEST`). The image is written
    /// to a hidden file beside it and renamed over it once complete, so a failed import leaves
    /// an existing file as it was and creates none. A link is followed (the file it names is
    /// replaced); an existing block device is written in place, as [`TargetSpec::Block`].
    File(PathBuf),
    /// The importer pod's disk image on its Filesystem volume (`/data/disk.img`), written in
    /// place and removed on failure. The pod owns that file: the controller starts a failed
    /// import over, and the volume is sized for one image, not for a copy beside the old one.
    VolumeFile(PathBuf),
    /// A block device (`/dev/cdi-block-volume`), written in place; on failure its contents are
    /// whatever was written.
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
    /// For the cases that need a scratch copy (a sequential source of a non-raw image).
    pub scratch_dir: PathBuf,
    /// The scratch directory is a volume the pod has only when it was given one (upstream's
    /// contract): when it is missing, the import stops with [`ImportError::ScratchRequired`]
    /// instead of spooling onto the container's own filesystem, and when it is there, a source
    /// read in order that may need it goes through it at once (the pod was given it because an
    /// earlier one found it needed). Otherwise it is created when needed.
    pub scratch_mounted: bool,
    pub tuning: Tuning,
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
    /// Bytes of the image that hold data (allocated, on a file).
    pub written: u64,
    /// Bytes left as holes (on a file), or zeroed without data (on a block device).
    pub holes: u64,
    pub scratch_used: bool,
    pub preallocated: bool,
    pub elapsed: Duration,
}

/// The result of the transfer and conversion, before resizing.
struct Converted {
    format: Format,
    compression: Option<Compression>,
    virtual_size: u64,
    stats: WriteStats,
    scratch_used: bool,
}

/// Import `source` into the target. On failure nothing is left that claims to be the requested
/// image, and nothing the import did not create is removed (see [`TargetSpec`]).
pub async fn import(
    source: &dyn Source,
    opts: &ImportOptions,
    progress: Arc<Progress>,
) -> Result<ImportReport, ImportError> {
    let started = Instant::now();
    source.check()?;
    refuse_same_file(source, &opts.target)?;
    let mut report = match &opts.target {
        TargetSpec::File(dest) => import_replacing(source, opts, dest, &progress).await?,
        TargetSpec::VolumeFile(path) => {
            let target = Target::create_file(path)?;
            let result = import_inner(source, opts, &target, &progress).await;
            if result.is_err() {
                let _ = std::fs::remove_file(path);
            }
            result?
        }
        TargetSpec::Block(path) => {
            import_inner(source, opts, &Target::open_block(path)?, &progress).await?
        }
    };
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Import a local file (see [`import`]).
pub async fn import_file(
    src: &Path,
    opts: &ImportOptions,
    progress: Arc<Progress>,
) -> Result<ImportReport, ImportError> {
    import(&FileSource::new(src), opts, progress).await
}

/// Refuse a target that is the source file itself (by a link, a hard link or another name):
/// writing it would destroy the image being read.
fn refuse_same_file(source: &dyn Source, target: &TargetSpec) -> Result<(), ImportError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Some(image) = source.local_path() else {
        return Ok(());
    };
    let dest = match target {
        TargetSpec::File(p) | TargetSpec::VolumeFile(p) | TargetSpec::Block(p) => p,
    };
    // A missing file is reported when it is opened; a missing target is not the source.
    let (Ok(a), Ok(b)) = (std::fs::metadata(image), std::fs::metadata(dest)) else {
        return Ok(());
    };
    let same_inode = (a.dev(), a.ino()) == (b.dev(), b.ino());
    // Two device nodes of one disk are one disk.
    let same_device =
        a.file_type().is_block_device() && b.file_type().is_block_device() && a.rdev() == b.rdev();
    if same_inode || same_device {
        return Err(ImportError::SameFile {
            image: image.to_path_buf(),
            target: dest.clone(),
        });
    }
    Ok(())
}

/// A hidden file beside the destination that the image is written to; removed when dropped
/// (a failed, cancelled or panicking import) unless it was renamed over the destination.
struct Staged {
    path: PathBuf,
    committed: bool,
}

impl Staged {
    fn create(dest: &Path) -> Result<(Staged, std::fs::File), ImportError> {
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = dest.file_name().ok_or_else(|| {
            ImportError::Unsupported(format!("{} does not name a file", dest.display()))
        })?;
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(ImportError::Unsupported(format!(
                    "cannot write {}: {} is not a directory",
                    dest.display(),
                    dir.display()
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ImportError::Unsupported(format!(
                    "cannot write {}: the directory {} does not exist",
                    dest.display(),
                    dir.display()
                )));
            }
            Err(e) => return Err(ImportError::io(format!("reading {}", dir.display()), e)),
        }
        let mut attempt = 0u32;
        loop {
            use std::os::unix::ffi::OsStrExt;
            // NAME cut short so the whole stays within the 255-byte limit of a file name.
            let suffix = format!(".cdi-import-{}-{attempt}", std::process::id());
            let keep = name.len().min(255 - 1 - suffix.len());
            let mut temp = std::ffi::OsString::from(".");
            temp.push(std::ffi::OsStr::from_bytes(&name.as_bytes()[..keep]));
            temp.push(&suffix);
            let path = dir.join(temp);
            // create_new: never take over a file that is there, whoever made it.
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => {
                    let staged = Staged {
                        path,
                        committed: false,
                    };
                    return Ok((staged, file));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                    attempt += 1;
                }
                Err(e) => {
                    return Err(ImportError::io(
                        format!("creating a temporary file in {}", dir.display()),
                        e,
                    ));
                }
            }
        }
    }

    /// Put the complete image in place of `dest`, with the owner and permissions `dest` had.
    fn commit(mut self, dest: &Path) -> Result<(), ImportError> {
        if let Ok(old) = std::fs::metadata(dest) {
            use std::os::unix::fs::MetadataExt;
            // Before the mode: a chown clears set-id bits. lchown: never through a link put in
            // the file's place. Only root may give a file away; others keep the mode alone.
            match std::os::unix::fs::lchown(&self.path, Some(old.uid()), Some(old.gid())) {
                Err(e) if e.kind() != std::io::ErrorKind::PermissionDenied => {
                    return Err(ImportError::io(
                        format!("copying the owner of {}", dest.display()),
                        e,
                    ));
                }
                _ => {}
            }
            std::fs::set_permissions(&self.path, old.permissions()).map_err(|e| {
                ImportError::io(format!("copying the permissions of {}", dest.display()), e)
            })?;
        }
        std::fs::rename(&self.path, dest)
            .map_err(|e| ImportError::io(format!("renaming the image to {}", dest.display()), e))?;
        self.committed = true;
        // The rename is durable once the directory is.
        if let Some(dir) = dest.parent().filter(|d| !d.as_os_str().is_empty())
            && let Ok(d) = std::fs::File::open(dir)
        {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The path `dest` names through any chain of links, relative ones read from the link's
/// directory; the last may name nothing yet. Bounded as the kernel bounds it (40).
fn resolve_links(dest: &Path) -> Result<PathBuf, ImportError> {
    let mut path = dest.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_symlink() => {
                let target = std::fs::read_link(&path).map_err(|e| {
                    ImportError::io(format!("reading the link {}", path.display()), e)
                })?;
                path = match path.parent() {
                    Some(dir) => dir.join(target),
                    None => target,
                };
            }
            _ => return Ok(path),
        }
    }
    Err(ImportError::Unsupported(format!(
        "{}: too many levels of links",
        dest.display()
    )))
}

/// Import into a file that may exist already (see [`TargetSpec::File`]).
async fn import_replacing(
    source: &dyn Source,
    opts: &ImportOptions,
    dest: &Path,
    progress: &Arc<Progress>,
) -> Result<ImportReport, ImportError> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileTypeExt;
    // Checked before anything runs: otherwise only the final rename would fail.
    if dest.as_os_str().as_bytes().ends_with(b"/") {
        return Err(ImportError::Unsupported(format!(
            "{} ends in '/': DEST is the image file to write, not a directory",
            dest.display()
        )));
    }
    // Through a link (a dangling one too) to the file it names, so the link stays a link.
    let dest = resolve_links(dest)?;
    match std::fs::metadata(&dest) {
        // A device is not replaced by a file: it is written in place, as with --block.
        Ok(m) if m.file_type().is_block_device() => {
            return import_inner(source, opts, &Target::open_block(&dest)?, progress).await;
        }
        Ok(m) if !m.is_file() => {
            return Err(ImportError::Unsupported(format!(
                "{} is neither a regular file nor a block device",
                dest.display()
            )));
        }
        Ok(_) => {}
        // Staged::create says which directory is missing or not one.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) => {}
        Err(e) => {
            return Err(ImportError::io(
                format!("cannot write {}", dest.display()),
                e,
            ));
        }
    }
    let (staged, file) = Staged::create(&dest)?;
    let target = Target::new_file(file, &staged.path, &dest);
    let report = import_inner(source, opts, &target, progress).await?;
    drop(target);
    staged.commit(&dest)?;
    Ok(report)
}

async fn import_inner(
    source: &dyn Source,
    opts: &ImportOptions,
    target: &Target,
    progress: &Arc<Progress>,
) -> Result<ImportReport, ImportError> {
    let limit = size_limit(opts, target)?;
    let local = source.local_path();
    // A local file is read twice rather than spooled: verified, then converted at random.
    if let (Some(path), Some(expected)) = (local, &opts.checksum) {
        let (p, c) = (path.to_path_buf(), expected.clone());
        verify(expected, &blocking(move || hash_file(&p, &c)).await?)?;
    }
    let opened = source.open().await?;
    progress
        .total
        .store(opened.size.unwrap_or(0), Ordering::Relaxed);
    let direct = match opened.reader {
        // A local file converts at random whatever its format (see Source::local_path).
        Some(reader) if local.is_some() => {
            Some(convert_random_access(reader, local, target, limit, opts, progress).await?)
        }
        // Otherwise only the formats converted natively, and not when a checksum must cover
        // the transfer: it needs every byte in order, and reads at random skip what is unused.
        Some(reader) if opts.checksum.is_none() => {
            let len = reader.size();
            let head = reader.read_at(0, PROBE_LEN.min(len as usize)).await?;
            if matches!(probe::probe(&head), Detected::Image(f) if formats::converts_at_random(f)) {
                Some(convert_random_access(reader, None, target, limit, opts, progress).await?)
            } else {
                None
            }
        }
        _ => None,
    };
    let converted = match direct {
        Some(c) => c,
        None => {
            let stream = (opened.stream)(opts.tuning.parallel * 4)?;
            let through = Through::first(opts);
            match convert_stream(stream, target, limit, opts, progress, through).await {
                Err(ImportError::NotStreamable(why)) => {
                    again_through_scratch(why, opts, target, progress)?;
                    let stream = (source.open().await?.stream)(opts.tuning.parallel * 4)?;
                    convert_stream(stream, target, limit, opts, progress, Through::Scratch).await?
                }
                other => other?,
            }
        }
    };

    // Resize: only ever grow.
    let final_size = match (target.kind(), limit) {
        (TargetKind::File, Some(l)) => converted.virtual_size.max(l),
        // A disk is whole sectors: qemu-img rounds a raw image up to 512 bytes too.
        (TargetKind::File, None) => converted.virtual_size.next_multiple_of(512),
        (TargetKind::Block, _) => target.size()?,
    };
    // Resizing, preallocating and syncing a large image take long: not on the runtime.
    let finishing = target.try_clone()?;
    let preallocate = opts.preallocate;
    let stats = converted.stats;
    let (written, holes) = blocking(move || {
        let target = finishing;
        target.set_len(final_size)?;
        if preallocate {
            target.preallocate(final_size)?;
        }
        target.sync()?;
        // On a file, what is allocated is what counts (qemu-img may have written it, not us);
        // the rest are holes. A block device has no holes: its zeros were written or zeroed.
        Ok(match target.kind() {
            TargetKind::File => {
                let allocated = target.allocated().unwrap_or(stats.written);
                let written = allocated.min(final_size);
                (written, final_size - written)
            }
            TargetKind::Block => (stats.written, stats.holes),
        })
    })
    .await?;
    Ok(ImportReport {
        format: converted.format,
        compression: converted.compression,
        virtual_size: converted.virtual_size,
        final_size,
        transferred: progress.done.load(Ordering::Relaxed),
        written,
        holes,
        scratch_used: converted.scratch_used,
        preallocated: opts.preallocate,
        elapsed: Duration::ZERO,
    })
}

pub(crate) fn verify(expected: &Checksum, actual_hex: &str) -> Result<(), ImportError> {
    if actual_hex == expected.hex {
        return Ok(());
    }
    Err(ImportError::ChecksumMismatch {
        expected: expected.to_string(),
        actual: format!("{}:{actual_hex}", expected.algorithm.name()),
    })
}

/// The most the image may be (and what it is grown to): the usable space of the claim on a
/// Filesystem volume, the device size on a block device, unbounded without a size.
fn size_limit(opts: &ImportOptions, target: &Target) -> Result<Option<u64>, ImportError> {
    match (target.kind(), opts.size) {
        (TargetKind::Block, _) => Ok(Some(target.size()?)),
        (TargetKind::File, Some(s)) => Ok(Some(size::resize_target(
            VolumeMode::Filesystem,
            s.capacity as i64,
            s.requested as i64,
            opts.overhead,
        ) as u64)),
        (TargetKind::File, None) => Ok(None),
    }
}

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
            return Ok(hasher.finish());
        }
        hasher.update(&buf[..n]);
    }
}

/// Detect the format of a random-access source and convert it into the target. Formats that
/// qemu-img converts, and compressed files, need `local_path`.
async fn convert_random_access(
    reader: Arc<dyn RangeReader>,
    local_path: Option<&Path>,
    target: &Target,
    limit: Option<u64>,
    opts: &ImportOptions,
    progress: &Arc<Progress>,
) -> Result<Converted, ImportError> {
    match formats::detect(reader.as_ref()).await? {
        Detected::Image(format) => {
            let (virtual_size, stats) = formats::convert(
                format,
                reader,
                local_path,
                target,
                limit,
                opts.tuning,
                progress,
            )
            .await?;
            Ok(Converted {
                format,
                compression: None,
                virtual_size,
                stats,
                scratch_used: false,
            })
        }
        Detected::Compressed(_) => {
            let path = local_path.ok_or_else(|| {
                ImportError::Internal("compressed images stream from a local copy".into())
            })?;
            let open = || {
                std::fs::File::open(path)
                    .map_err(|e| ImportError::io(format!("opening {}", path.display()), e))
            };
            // The checksum, if any, was verified on the file already.
            let opts = ImportOptions {
                checksum: None,
                ..opts.clone()
            };
            let through = Through::first(&opts);
            match convert_stream(Box::new(open()?), target, limit, &opts, progress, through).await {
                Err(ImportError::NotStreamable(why)) => {
                    again_through_scratch(why, &opts, target, progress)?;
                    let file = Box::new(open()?);
                    convert_stream(file, target, limit, &opts, progress, Through::Scratch).await
                }
                other => other,
            }
        }
    }
}

/// How a stream of an image that is not raw is converted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Through {
    /// As it arrives where the format allows (qcow2), else through scratch.
    Stream,
    /// Spooled to scratch, then converted at random.
    Scratch,
}

impl Through {
    /// A pod given scratch space was given it because an earlier attempt needed it.
    fn first(opts: &ImportOptions) -> Through {
        if opts.scratch_mounted && opts.scratch_dir.is_dir() {
            Through::Scratch
        } else {
            Through::Stream
        }
    }
}

/// A stream turned out not to convert as it arrived (`why`): in a pod, ask for scratch space
/// (the stream cannot be read again there); elsewhere, make the target ready to be written again
/// by a second reading through scratch.
fn again_through_scratch(
    why: String,
    opts: &ImportOptions,
    target: &Target,
    progress: &Progress,
) -> Result<(), ImportError> {
    if opts.scratch_mounted {
        return Err(ImportError::ScratchRequired(format!(
            "the image cannot be converted as it streams in: {why}"
        )));
    }
    tracing::info!(reason = %why, "the image does not convert as it streams in; reading it again through scratch");
    // What the first reading wrote must not show through the holes of the second.
    if target.kind() == TargetKind::File {
        target.set_len(0)?;
    }
    progress.done.store(0, Ordering::Relaxed);
    Ok(())
}

/// Convert a sequential stream: raw and (`through` [`Through::Stream`]) qcow2 images as they
/// arrive; anything else is spooled to scratch and converted from there. A checksum covers the
/// stream as received.
async fn convert_stream(
    input: Box<dyn Read + Send>,
    target: &Target,
    limit: Option<u64>,
    opts: &ImportOptions,
    progress: &Arc<Progress>,
    through: Through,
) -> Result<Converted, ImportError> {
    let hasher = Arc::new(std::sync::Mutex::new(
        opts.checksum.as_ref().map(|c| Hasher::new(c.algorithm)),
    ));
    let counted: Box<dyn Read + Send> = Box::new(Counting {
        inner: input,
        hasher: hasher.clone(),
        progress: progress.clone(),
    });
    let (compression, stream, inner) = detect_stream(counted).await?;
    let context = compression.map(|c| c.name()).unwrap_or("the source");

    let result = if formats::streams(inner) {
        let (virtual_size, stats) =
            formats::raw::copy_stream(stream, target, limit, opts.tuning, context).await?;
        Converted {
            format: inner,
            compression,
            virtual_size,
            stats,
            scratch_used: false,
        }
    } else if inner == Format::Qcow2 && through == Through::Stream {
        let (virtual_size, stats) =
            formats::qcow2::stream::convert(stream, target, limit, opts.tuning, context).await?;
        Converted {
            format: inner,
            compression,
            virtual_size,
            stats,
            scratch_used: false,
        }
    } else {
        let converted =
            convert_through_scratch(stream, inner, target, limit, opts, context).await?;
        Converted {
            compression,
            ..converted
        }
    };
    if let Some(expected) = &opts.checksum {
        let actual = hasher
            .lock()
            .expect("hasher lock")
            .take()
            .map(Hasher::finish)
            .unwrap_or_default();
        verify(expected, &actual)?;
    }
    Ok(result)
}

/// What a stream is, read from its head: its compression if any, the (decompressed) stream from
/// its first byte, and the image format inside. One layer of compression only.
async fn detect_stream(
    counted: Box<dyn Read + Send>,
) -> Result<(Option<Compression>, Box<dyn Read + Send>, Format), ImportError> {
    let (detected, stream) = blocking(move || peek(counted, "reading the source")).await?;
    match detected {
        Detected::Compressed(c) => {
            let decoded = decoder(c, stream)?;
            let (inner, decoded) = blocking(move || peek(decoded, c.name())).await?;
            match inner {
                Detected::Image(f) => Ok((Some(c), decoded, f)),
                Detected::Compressed(n) => Err(ImportError::Unsupported(format!(
                    "{} inside {}: decompress one layer first",
                    n.name(),
                    c.name()
                ))),
            }
        }
        Detected::Image(f) => Ok((None, stream, f)),
    }
}

/// Spool a stream of an `inner` image to a scratch file, then convert that at random. The
/// result says scratch was used; its compression is the caller's to fill in.
async fn convert_through_scratch(
    stream: Box<dyn Read + Send>,
    inner: Format,
    target: &Target,
    limit: Option<u64>,
    opts: &ImportOptions,
    context: &'static str,
) -> Result<Converted, ImportError> {
    // The file is removed when this is dropped, after the conversion from it.
    let scratch_file = spool(stream, inner, limit, opts, context).await?;
    let scratch = scratch_file.path();
    let inner_opts = ImportOptions {
        checksum: None,
        ..opts.clone()
    };
    let reader: Arc<dyn RangeReader> = Arc::new(FileReader::open(scratch)?);
    // The bytes were counted as they arrived; the scratch copy is not counted again.
    let uncounted = Arc::new(Progress::default());
    let converted = Box::pin(convert_random_access(
        reader,
        Some(scratch),
        target,
        limit,
        &inner_opts,
        &uncounted,
    ))
    .await?;
    Ok(Converted {
        scratch_used: true,
        ..converted
    })
}

/// Copy a stream of an `inner` image to a new scratch file in the scratch directory, bounded: a
/// bomb cannot fill more than the target could hold.
async fn spool(
    mut stream: Box<dyn Read + Send>,
    inner: Format,
    limit: Option<u64>,
    opts: &ImportOptions,
    context: &'static str,
) -> Result<tempfile::NamedTempFile, ImportError> {
    if opts.scratch_mounted && !opts.scratch_dir.is_dir() {
        return Err(ImportError::ScratchRequired(format!(
            "a {inner} image read in order is converted from a copy"
        )));
    }
    std::fs::create_dir_all(&opts.scratch_dir)
        .map_err(|e| ImportError::io(format!("creating {}", opts.scratch_dir.display()), e))?;
    // A new file under a random name (O_CREAT|O_EXCL, so never through a link planted in
    // a shared directory such as /tmp), removed when dropped however the import ends.
    let scratch_file = tempfile::Builder::new()
        .prefix("cdi-scratch-")
        .suffix(".img")
        .tempfile_in(&opts.scratch_dir)
        .map_err(|e| {
            ImportError::io(
                format!("creating a scratch file in {}", opts.scratch_dir.display()),
                e,
            )
        })?;
    let bound = limit
        .map(|l| l.saturating_add(l / 8).saturating_add(64 << 20))
        .unwrap_or(u64::MAX);
    let dst = scratch_file.path().to_path_buf();
    let mut out = scratch_file
        .as_file()
        .try_clone()
        .map_err(|e| ImportError::io(format!("opening {}", dst.display()), e))?;
    let window = opts.tuning.writeback_window;
    blocking(move || {
        let written = |e| ImportError::io(format!("writing {}", dst.display()), e);
        // The scratch copy is page cache too: paced like the target.
        let mut pacer = crate::writer::Pacer::new(&out, window).map_err(written)?;
        let mut total = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n =
                read_full(&mut stream, &mut buf).map_err(|e| ImportError::from_read(context, e))?;
            if n == 0 {
                return pacer.finish().map_err(written);
            }
            total += n as u64;
            if total > bound {
                return Err(ImportError::Damaged(format!(
                    "the source expands past {bound} bytes, more than the target can hold"
                )));
            }
            std::io::Write::write_all(&mut out, &buf[..n]).map_err(written)?;
            pacer.wrote(n as u64).map_err(written)?;
        }
    })
    .await?;
    Ok(scratch_file)
}
