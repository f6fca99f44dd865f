//! The target: a file (`/data/disk.img`) or a block device, written positionally on a thread of
//! its own, with all-zero blocks left as holes.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use bytes::Bytes;
use rustix::fs::{FallocateFlags, fallocate};
use tokio::sync::mpsc;

use crate::error::ImportError;

/// The granularity of hole detection: a filesystem block.
pub const BLOCK: usize = 4096;
static ZEROS: [u8; BLOCK] = [0; BLOCK];

/// What is written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// A regular file, created empty: everything not written reads as zeros.
    File,
    /// A block device (or a preallocated file): old contents must be zeroed explicitly.
    Block,
}

/// One positional write.
#[derive(Debug)]
pub enum Op {
    Data {
        offset: u64,
        data: Bytes,
    },
    /// `len` bytes of zeros at `offset` (a no-op on a fresh file).
    Zero {
        offset: u64,
        len: u64,
    },
    /// Several writes sent at once (one wake-up of the writer per request, not per cluster).
    Many(Vec<Op>),
}

/// What the writer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Bytes written to the target.
    pub written: u64,
    /// Bytes left as holes (or zeroed without writing data).
    pub holes: u64,
}

/// The open target.
pub struct Target {
    file: File,
    path: PathBuf,
    /// What messages call it: the destination, when `path` is a temporary file standing in for it.
    name: PathBuf,
    kind: TargetKind,
}

impl Target {
    /// Create (or truncate) the image file at `path`.
    pub fn create_file(path: &Path) -> Result<Target, ImportError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| ImportError::io(format!("creating {}", path.display()), e))?;
        Ok(Target::new_file(file, path, path))
    }

    /// An empty image file already open at `path`, named `name` in messages.
    pub fn new_file(file: File, path: &Path, name: &Path) -> Target {
        Target {
            file,
            path: path.to_path_buf(),
            name: name.to_path_buf(),
            kind: TargetKind::File,
        }
    }

    /// Open an existing block device.
    pub fn open_block(path: &Path) -> Result<Target, ImportError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| ImportError::io(format!("opening block device {}", path.display()), e))?;
        Ok(Target {
            file,
            path: path.to_path_buf(),
            name: path.to_path_buf(),
            kind: TargetKind::Block,
        })
    }

    pub fn kind(&self) -> TargetKind {
        self.kind
    }

    /// Where the target is written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes allocated to the target (on a file, what is not a hole).
    pub fn allocated(&self) -> Result<u64, ImportError> {
        use std::os::unix::fs::MetadataExt;
        self.file
            .metadata()
            .map(|m| m.blocks() * 512)
            .map_err(|e| ImportError::io(format!("reading {}", self.name.display()), e))
    }

    /// The target's current size (the device size for a block device).
    pub fn size(&self) -> Result<u64, ImportError> {
        use std::io::{Seek, SeekFrom};
        let mut f = &self.file;
        f.seek(SeekFrom::End(0))
            .map_err(|e| ImportError::io(format!("sizing {}", self.name.display()), e))
    }

    /// Make a file target exactly `len` bytes (new space reads as zeros). A block device keeps
    /// its size; it must be at least `len`.
    pub fn set_len(&self, len: u64) -> Result<(), ImportError> {
        match self.kind {
            TargetKind::File => self.file.set_len(len).map_err(|e| {
                ImportError::io(
                    format!("resizing {} to {len} bytes", self.name.display()),
                    e,
                )
            }),
            TargetKind::Block => {
                let size = self.size()?;
                if size < len {
                    return Err(ImportError::TooLarge {
                        virtual_size: len,
                        usable: size,
                    });
                }
                Ok(())
            }
        }
    }

    /// Another handle on the same file, for work done on a blocking thread.
    pub fn try_clone(&self) -> Result<Target, ImportError> {
        Ok(Target {
            file: self
                .file
                .try_clone()
                .map_err(|e| ImportError::io("duplicating the target", e))?,
            path: self.path.clone(),
            name: self.name.clone(),
            kind: self.kind,
        })
    }

    /// Allocate every byte of `len` without changing the data (preallocation).
    pub fn preallocate(&self, len: u64) -> Result<(), ImportError> {
        if len == 0 || self.kind == TargetKind::Block {
            return Ok(());
        }
        fallocate(&self.file, FallocateFlags::KEEP_SIZE, 0, len).map_err(|e| {
            ImportError::io(format!("preallocating {}", self.name.display()), e.into())
        })
    }

    /// Flush data and metadata to stable storage.
    pub fn sync(&self) -> Result<(), ImportError> {
        self.file
            .sync_all()
            .map_err(|e| ImportError::io(format!("syncing {}", self.name.display()), e))
    }

    /// Start the writer thread; it owns a clone of the file and paces writeback by `window`
    /// (0: unpaced).
    pub fn writer(&self, depth: usize, window: u64) -> Result<Writer, ImportError> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| ImportError::io("duplicating the target", e))?;
        let (tx, rx) = mpsc::channel(depth);
        let kind = self.kind;
        let path = self.name.clone();
        let handle = std::thread::Builder::new()
            .name("cdi-writer".into())
            .spawn(move || {
                write_loop(file, kind, window, rx)
                    .map_err(|e| ImportError::io(format!("writing {}", path.display()), e))
            })
            .map_err(|e| ImportError::io("starting the writer", e))?;
        Ok(Writer {
            tx: Some(tx),
            handle: Some(handle),
        })
    }
}

/// What a producer sees when the writer thread has ended: the writer's own error, which says
/// why, is what [`Writer::finish_after`] reports.
pub(crate) fn stopped() -> ImportError {
    ImportError::Internal("the writer stopped early".into())
}

/// Send one write to the writer thread.
pub(crate) async fn send(tx: &mpsc::Sender<Op>, op: Op) -> Result<(), ImportError> {
    tx.send(op).await.map_err(|_| stopped())
}

/// Sends writes to the writer thread; `finish` waits for all of them.
pub struct Writer {
    tx: Option<mpsc::Sender<Op>>,
    handle: Option<JoinHandle<Result<WriteStats, ImportError>>>,
}

impl Writer {
    /// A sender for producer tasks.
    pub fn sender(&self) -> mpsc::Sender<Op> {
        self.tx.clone().expect("writer not finished")
    }

    /// Wait for the writer after the producer ended with `produced`: a writer that failed (a
    /// full disk, an I/O error) stopped the producer, so its error is the one reported.
    pub async fn finish_after<T>(
        self,
        produced: Result<T, ImportError>,
    ) -> Result<(T, WriteStats), ImportError> {
        let stats = self.finish().await?;
        Ok((produced?, stats))
    }

    /// Close the queue and wait for every write.
    pub async fn finish(mut self) -> Result<WriteStats, ImportError> {
        drop(self.tx.take());
        let handle = self.handle.take().expect("finish once");
        tokio::task::spawn_blocking(move || handle.join())
            .await
            .map_err(|e| ImportError::Internal(format!("writer join: {e}")))?
            .map_err(|_| ImportError::Internal("the writer thread panicked".into()))?
    }
}

fn write_loop(
    file: File,
    kind: TargetKind,
    window: u64,
    mut rx: mpsc::Receiver<Op>,
) -> std::io::Result<WriteStats> {
    let mut stats = WriteStats::default();
    let mut pacer = Pacer::new(&file, window)?;
    while let Some(op) = rx.blocking_recv() {
        let before = stats;
        apply(&file, kind, op, &mut stats)?;
        // Holes in a file cost no page cache; zeros on a device may be written through it.
        let mut cached = stats.written - before.written;
        if kind == TargetKind::Block {
            cached += stats.holes - before.holes;
        }
        pacer.wrote(cached)?;
    }
    pacer.finish()?;
    Ok(stats)
}

/// How much written data the writer lets the page cache hold before it waits for the disk.
/// The page cache counts against a pod's memory limit, and dirty pages cannot be dropped until
/// the disk took them: on slow storage, unpaced writing grows the cache to the limit and the
/// pod is OOM-killed (upstream's importer under its 600M limit). Paced, the cache holds at
/// most two windows: the one being flushed and the one being written.
pub const WINDOW: u64 = 32 << 20;

/// How many times per window the writer asks the kernel to start writing back what is dirty.
const KICKS: u64 = 4;

/// Writeback in windows: each full window is flushed (`fdatasync`) on a thread of its own while
/// the next is written, then dropped from the cache (`POSIX_FADV_DONTNEED`); a window waits for
/// the previous window's flush before its own starts, which paces the writer to the disk.
/// Within a window, every quarter starts writeback without waiting (`POSIX_FADV_DONTNEED` on
/// dirty pages does), so the disk is kept busy and the flush finds little left: a flush is a
/// journal commit and a cache flush of the device, and flushing a small window often cost a
/// third of the import's time on this machine's disk.
pub(crate) struct Pacer {
    file: File,
    window: u64,
    since: u64,
    since_kick: u64,
    flushing: Option<JoinHandle<std::io::Result<()>>>,
}

impl Pacer {
    pub(crate) fn new(file: &File, window: u64) -> std::io::Result<Pacer> {
        Ok(Pacer {
            file: file.try_clone()?,
            window,
            since: 0,
            since_kick: 0,
            flushing: None,
        })
    }

    pub(crate) fn wrote(&mut self, bytes: u64) -> std::io::Result<()> {
        self.since += bytes;
        self.since_kick += bytes;
        if self.window == 0 {
            return Ok(());
        }
        if self.since < self.window {
            if self.since_kick >= self.window / KICKS {
                self.since_kick = 0;
                rustix::fs::fadvise(&self.file, 0, None, rustix::fs::Advice::DontNeed)?;
            }
            return Ok(());
        }
        self.since = 0;
        self.since_kick = 0;
        self.wait()?;
        let file = self.file.try_clone()?;
        self.flushing = Some(
            std::thread::Builder::new()
                .name("cdi-flush".into())
                .spawn(move || flush(&file))?,
        );
        Ok(())
    }

    fn wait(&mut self) -> std::io::Result<()> {
        match self.flushing.take() {
            None => Ok(()),
            Some(h) => h
                .join()
                .map_err(|_| std::io::Error::other("the flushing thread panicked"))?,
        }
    }

    /// Wait for the last flush; what follows the last window is the caller's to sync.
    pub(crate) fn finish(mut self) -> std::io::Result<()> {
        self.wait()
    }
}

/// Write the file's dirty pages back, then drop its clean ones from the cache.
fn flush(file: &File) -> std::io::Result<()> {
    file.sync_data()?;
    rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed)?;
    Ok(())
}

fn apply(file: &File, kind: TargetKind, op: Op, stats: &mut WriteStats) -> std::io::Result<()> {
    match op {
        Op::Data { offset, data } => write_sparse(file, kind, offset, &data, stats),
        Op::Zero { offset, len } => {
            zero(file, kind, offset, len)?;
            stats.holes += len;
            Ok(())
        }
        Op::Many(ops) => ops
            .into_iter()
            .try_for_each(|op| apply(file, kind, op, stats)),
    }
}

/// Write `data` at `offset`, skipping all-zero blocks (zeroing them explicitly on a block
/// device, whose old contents would otherwise show through).
fn write_sparse(
    file: &File,
    kind: TargetKind,
    offset: u64,
    data: &[u8],
    stats: &mut WriteStats,
) -> std::io::Result<()> {
    let mut run_start: Option<usize> = None;
    let mut pos = 0;
    while pos < data.len() {
        // Blocks aligned to the target's block grid, so holes line up with filesystem blocks.
        let abs = offset + pos as u64;
        let end = (pos + BLOCK - (abs % BLOCK as u64) as usize).min(data.len());
        let is_zero = data[pos..end] == ZEROS[..end - pos];
        match (is_zero, run_start) {
            (false, None) => run_start = Some(pos),
            (true, Some(start)) => {
                file.write_all_at(&data[start..pos], offset + start as u64)?;
                stats.written += (pos - start) as u64;
                run_start = None;
            }
            _ => {}
        }
        if is_zero {
            zero(file, kind, abs, (end - pos) as u64)?;
            stats.holes += (end - pos) as u64;
        }
        pos = end;
    }
    if let Some(start) = run_start {
        file.write_all_at(&data[start..], offset + start as u64)?;
        stats.written += (data.len() - start) as u64;
    }
    Ok(())
}

fn zero(file: &File, kind: TargetKind, offset: u64, len: u64) -> std::io::Result<()> {
    if kind == TargetKind::File || len == 0 {
        return Ok(());
    }
    if fallocate(
        file,
        FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE,
        offset,
        len,
    )
    .is_ok()
    {
        return Ok(());
    }
    let mut done = 0;
    while done < len {
        let n = (len - done).min(BLOCK as u64) as usize;
        file.write_all_at(&ZEROS[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn zero_blocks_become_holes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let target = Target::create_file(&path).unwrap();
        target.set_len(64 * 1024).unwrap();
        let writer = target.writer(4, WINDOW).unwrap();
        let mut data = vec![0u8; 32 * 1024];
        data[5000] = 7; // second block
        data[20000..20010].fill(9); // fifth block
        writer
            .sender()
            .send(Op::Data {
                offset: 8192,
                data: Bytes::from(data.clone()),
            })
            .await
            .unwrap();
        let stats = writer.finish().await.unwrap();
        assert_eq!(stats.written, 2 * BLOCK as u64);
        assert_eq!(stats.holes, 32 * 1024 - 2 * BLOCK as u64);
        let back = std::fs::read(&path).unwrap();
        assert_eq!(back.len(), 64 * 1024);
        assert_eq!(&back[8192..8192 + data.len()], &data[..]);
        assert!(back[..8192].iter().all(|&b| b == 0));
        use std::os::unix::fs::MetadataExt;
        let blocks = std::fs::metadata(&path).unwrap().blocks();
        assert!(
            blocks * 512 <= 4 * BLOCK as u64,
            "allocated {} bytes",
            blocks * 512
        );
    }

    #[tokio::test]
    async fn a_failing_writer_reports_its_own_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, b"").unwrap();
        // Opened read-only, every write fails, as on a full or broken disk.
        let target = Target::new_file(std::fs::File::open(&path).unwrap(), &path, &path);
        let writer = target.writer(1, WINDOW).unwrap();
        let tx = writer.sender();
        let mut produced = Ok(());
        for i in 0..64u64 {
            let op = Op::Data {
                offset: i * BLOCK as u64,
                data: Bytes::from(vec![1u8; BLOCK]),
            };
            if let Err(e) = send(&tx, op).await {
                produced = Err(e);
                break;
            }
        }
        assert!(produced.is_err(), "the producer saw the writer stop");
        drop(tx);
        let err = writer.finish_after(produced).await.unwrap_err().to_string();
        assert!(err.contains("writing") && err.contains("disk.img"), "{err}");
        assert!(!err.contains("stopped early"), "{err}");
    }

    #[tokio::test]
    async fn paced_writes_land_and_leave_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let target = Target::create_file(&path).unwrap();
        target.set_len(1 << 20).unwrap();
        // A window of two blocks: many flushes, each waited for by the next.
        let writer = target.writer(2, 2 * BLOCK as u64).unwrap();
        let data: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8 + 1).collect();
        for (i, chunk) in data.chunks(3 * BLOCK).enumerate() {
            writer
                .sender()
                .send(Op::Data {
                    offset: (i * 3 * BLOCK) as u64,
                    data: Bytes::from(chunk.to_vec()),
                })
                .await
                .unwrap();
        }
        let stats = writer.finish().await.unwrap();
        assert_eq!(stats.written, 1 << 20);
        assert_eq!(std::fs::read(&path).unwrap(), data);
    }

    #[tokio::test]
    async fn block_targets_are_zeroed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        std::fs::write(&path, vec![0xffu8; 16384]).unwrap();
        let target = Target::open_block(&path).unwrap();
        assert_eq!(target.size().unwrap(), 16384);
        let writer = target.writer(2, WINDOW).unwrap();
        writer
            .sender()
            .send(Op::Data {
                offset: 0,
                data: Bytes::from(vec![0u8; 4096]),
            })
            .await
            .unwrap();
        writer
            .sender()
            .send(Op::Zero {
                offset: 8192,
                len: 8192,
            })
            .await
            .unwrap();
        writer.finish().await.unwrap();
        let back = std::fs::read(&path).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0));
        assert!(back[4096..8192].iter().all(|&b| b == 0xff), "untouched");
        assert!(back[8192..].iter().all(|&b| b == 0));
        assert!(matches!(
            target.set_len(1 << 20),
            Err(ImportError::TooLarge { .. })
        ));
    }
}
