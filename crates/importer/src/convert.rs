//! What every conversion shares, whatever the source and the format (see [`crate::formats`]):
//! the bounds on work in flight, the count of source bytes consumed, and sizing the target for
//! the image.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ImportError;
use crate::writer::Target;

/// Bounds on the work in flight.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// Largest single read request, and largest decompressed output of one request.
    pub request_bytes: u64,
    /// Requests in flight at once.
    pub parallel: usize,
    /// Holes between clusters up to this size are read through rather than split.
    pub max_gap: u64,
    /// Written bytes the page cache may hold before the writer waits for the disk
    /// ([`crate::writer::WINDOW`]); 0 leaves writeback to the kernel.
    pub writeback_window: u64,
    /// What a qcow2 image read in order may make the conversion hold (clusters that arrive
    /// before the tables that place them) before it goes through scratch instead.
    pub stream_hold: u64,
}

impl Default for Tuning {
    fn default() -> Self {
        // One request in flight per core, at least two so that transfer overlaps decompression;
        // more than four only adds memory.
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        Tuning {
            request_bytes: 2 << 20,
            parallel: cores.clamp(2, 4),
            max_gap: 64 << 10,
            writeback_window: crate::writer::WINDOW,
            stream_hold: 64 << 20,
        }
    }
}

/// Bytes of the source consumed so far, for progress reporting.
#[derive(Debug, Default)]
pub struct Progress {
    pub done: AtomicU64,
    pub total: AtomicU64,
}

impl Progress {
    pub fn add(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }
}

/// Refuse an image of `virtual_size` larger than `limit`, and size the target for it: the image,
/// or the limit when that is larger (an image is only ever grown).
pub(crate) fn fit(
    target: &Target,
    virtual_size: u64,
    limit: Option<u64>,
) -> Result<(), ImportError> {
    if let Some(usable) = limit
        && virtual_size > usable
    {
        return Err(ImportError::TooLarge {
            virtual_size,
            usable,
        });
    }
    target.set_len(virtual_size.max(limit.unwrap_or(0)))
}
