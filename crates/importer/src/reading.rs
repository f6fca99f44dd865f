//! Reading a source in order: filling a buffer, counting and hashing what passes, taking off a
//! stream compression, and peeking at the head to tell what the stream is.

use std::io::{Cursor, Read};
use std::sync::Arc;

use crate::checksum::Hasher;
use crate::convert::Progress;
use crate::error::ImportError;
use crate::formats::probe::{self, Compression, Detected, PROBE_LEN};

/// A reader that hashes and counts what passes through it.
pub(crate) struct Counting<R> {
    pub(crate) inner: R,
    pub(crate) hasher: Arc<std::sync::Mutex<Option<Hasher>>>,
    pub(crate) progress: Arc<Progress>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(h) = self.hasher.lock().expect("hasher lock").as_mut() {
            h.update(&buf[..n]);
        }
        self.progress.add(n as u64);
        Ok(n)
    }
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
pub(crate) fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
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

/// Peek at the head of a stream and give back a reader that still yields it.
pub(crate) fn peek(
    mut input: Box<dyn Read + Send>,
    what: &str,
) -> Result<(Detected, Box<dyn Read + Send>), ImportError> {
    let mut head = vec![0u8; PROBE_LEN];
    let n = read_full(&mut input, &mut head).map_err(|e| ImportError::from_read(what, e))?;
    head.truncate(n);
    let detected = probe::probe(&head);
    Ok((detected, Box::new(Cursor::new(head).chain(input))))
}
