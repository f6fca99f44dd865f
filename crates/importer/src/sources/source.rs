//! The contract every source keeps: the [`Source`] trait, what opening one gives ([`Opened`]),
//! and reads at any offset ([`RangeReader`]). In a file of its own so that each source module
//! depends on it, not on `sources/mod.rs`, which re-exports it for the import.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::error::ImportError;

/// A source of image bytes.
///
/// A source must provide a [`name`](Source::name) for messages and an [`open`](Source::open)
/// that tells the size when it is known and gives the bytes from the start as a sequential
/// stream; it also gives a [`RangeReader`] when it can serve reads at any offset (raw and
/// qcow2 images then convert without a scratch copy). [`local_path`](Source::local_path) and
/// [`check`](Source::check) concern a file on this machine; other sources keep the defaults.
pub trait Source: Send + Sync {
    /// The source in messages: a path, or a URL without credentials.
    fn name(&self) -> String;

    /// The file on this machine the source is, if it is one. Reading it again is cheap, so it is
    /// verified against a checksum before it is converted (at random, not spooled), formats
    /// only qemu-img converts are read from it in place, and it is refused as its own target.
    fn local_path(&self) -> Option<&Path> {
        None
    }

    /// Refuse, before the import creates anything, a source [`open`](Source::open) would refuse.
    fn check(&self) -> Result<(), ImportError> {
        Ok(())
    }

    /// Start reading (a server may be asked here for the size and for range support).
    fn open(&self) -> BoxFuture<'_, Result<Opened, ImportError>>;
}

/// Starts an opened source's stream; the argument is how many chunks may be read ahead.
pub type StartStream = Box<dyn FnOnce(usize) -> Result<Box<dyn Read + Send>, ImportError> + Send>;

/// An opened source.
pub struct Opened {
    /// The length in bytes, when the source tells it.
    pub size: Option<u64>,
    /// Reads at any offset: only when the source serves them and knows its size.
    pub reader: Option<Arc<dyn RangeReader>>,
    /// The whole source from its first byte, as a blocking `Read` for a blocking thread. Started
    /// on the runtime, and only when the source is read as a stream: starting it may start a
    /// transfer.
    pub stream: StartStream,
}

/// A source read at any offset. Reads may run concurrently.
pub trait RangeReader: Send + Sync + 'static {
    /// The source's length in bytes.
    fn size(&self) -> u64;

    /// Read exactly `len` bytes at `offset` (fewer only at the end of the source).
    fn read_at(&self, offset: u64, len: usize) -> BoxFuture<'_, Result<Bytes, ImportError>>;
}
