//! The target side of a host-assisted clone (upstream's upload server `cloneProcessor`): the
//! source volume arrives as its cloner packed it (a Filesystem volume's tar stream, a Block
//! volume's bytes) and is written as it is. Nothing is probed or converted: a clone copies bytes,
//! whatever image format they hold.

use std::io::Read;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::convert::{Progress, Tuning};
use crate::error::ImportError;
use crate::pod::PodPaths;
use crate::reading::{Counting, read_full};
use crate::sources::Source;
use crate::task::blocking;
use crate::writer::{Op, Target, stopped};

/// The member of a Filesystem volume's tar stream that a Block target takes (upstream takes the
/// first whose name contains it).
pub const DISK_IMAGE: &str = "disk.img";

/// How the source was packed (the request's `x-cdi-content-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClonePacking {
    /// `filesystem-clone`: a tar stream of the source's files.
    Filesystem,
    /// `blockdevice-clone`: the source device's bytes.
    Block,
}

impl ClonePacking {
    /// From the header's value; `None` for anything else (an ordinary upload).
    pub fn from_header(value: &str) -> Option<ClonePacking> {
        match value {
            "filesystem-clone" => Some(ClonePacking::Filesystem),
            "blockdevice-clone" => Some(ClonePacking::Block),
            _ => None,
        }
    }
}

/// Write the clone stream `source` onto the pod's volume, its disk image preallocated when
/// asked (a Block volume is allocated already). On failure a Filesystem volume holds nothing of
/// it (a Block one holds what was written).
pub async fn receive(
    source: &dyn Source,
    packing: ClonePacking,
    paths: &PodPaths,
    preallocate: bool,
    progress: Arc<Progress>,
) -> Result<(), ImportError> {
    let (_, mode, capacity) = crate::pod::volume(paths)?;
    let block = mode == cdi_api::VolumeMode::Block;
    let disk = paths.data_dir.join(DISK_IMAGE);
    if packing == ClonePacking::Filesystem && !block {
        crate::archive::unpack(source, &paths.data_dir, capacity, None, progress).await?;
        if preallocate && disk.is_file() {
            let target = Target::new_file(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&disk)
                    .map_err(|e| ImportError::io(format!("opening {}", disk.display()), e))?,
                &disk,
                &disk,
            );
            target.preallocate(target.size()?)?;
        }
        return Ok(());
    }
    let opened = source.open().await?;
    progress.total.store(
        opened.size.unwrap_or(0),
        std::sync::atomic::Ordering::Relaxed,
    );
    let input: Box<dyn Read + Send> = Box::new(Counting {
        inner: (opened.stream)(16)?,
        hasher: Arc::new(Mutex::new(None)),
        progress,
    });
    let target = if block {
        Target::open_block(&paths.block_device)?
    } else {
        Target::create_file(&disk)?
    };
    let result = match packing {
        ClonePacking::Block => copy(input, &target, capacity, "the clone stream").await,
        ClonePacking::Filesystem => disk_image_of(input, &target, capacity).await,
    };
    let result = result
        .and_then(|_| {
            if preallocate {
                target.preallocate(target.size()?)
            } else {
                Ok(())
            }
        })
        .and_then(|_| target.sync());
    if result.is_err() && !block {
        let _ = std::fs::remove_file(&disk);
    }
    result
}

/// Copy `input` into `target` from offset 0, refusing more than `limit` bytes. A file target
/// ends as long as the stream: zeros are written as holes, so a device whose tail is zero would
/// otherwise leave a shorter (smaller) disk.
async fn copy(
    input: Box<dyn Read + Send>,
    target: &Target,
    limit: u64,
    context: &'static str,
) -> Result<(), ImportError> {
    let (len, _) =
        crate::formats::raw::copy_stream(input, target, Some(limit), Tuning::default(), context)
            .await?;
    target.set_len(len)
}

/// The tar stream's disk image (its holes read as zeros), copied into `target`.
async fn disk_image_of(
    input: Box<dyn Read + Send>,
    target: &Target,
    limit: u64,
) -> Result<(), ImportError> {
    let tuning = Tuning::default();
    let writer = target.writer(tuning.parallel, tuning.writeback_window)?;
    let tx = writer.sender();
    let chunk = tuning.request_bytes as usize;
    let copied = blocking(move || {
        let damaged = |e: std::io::Error| ImportError::from_read("reading the clone's tar stream", e);
        let mut archive = tar::Archive::new(input);
        for entry in archive.entries().map_err(damaged)? {
            let mut entry = entry.map_err(damaged)?;
            let named = entry
                .path()
                .map(|p| p.to_string_lossy().contains(DISK_IMAGE))
                .unwrap_or(false);
            let kind = entry.header().entry_type();
            if !named || !(kind.is_file() || kind.is_gnu_sparse()) {
                continue;
            }
            let size = entry.size();
            if size > limit {
                return Err(ImportError::StreamTooLarge { usable: limit });
            }
            let mut offset = 0u64;
            loop {
                let mut buf = vec![0u8; chunk];
                let n = read_full(&mut entry, &mut buf).map_err(damaged)?;
                if n == 0 {
                    if offset != size {
                        return Err(ImportError::Damaged(format!(
                            "the clone's {DISK_IMAGE} ended at {offset} of its {size} bytes"
                        )));
                    }
                    return Ok(offset);
                }
                buf.truncate(n);
                tx.blocking_send(Op::Data {
                    offset,
                    data: Bytes::from(buf),
                })
                .map_err(|_| stopped())?;
                offset += n as u64;
            }
        }
        Err(ImportError::Damaged(format!(
            "the clone's tar stream has no {DISK_IMAGE}: a Block target takes the disk image of a Filesystem source"
        )))
    })
    .await;
    writer.finish_after(copied).await.map(|_| ())
}
