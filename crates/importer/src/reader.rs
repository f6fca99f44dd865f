//! Random access to a source: a local file, or (with range support) an HTTP server.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::buffer::Buffer;
use crate::error::ImportError;

/// A source that can be read at any offset. Reads may run concurrently.
pub trait RangeReader: Send + Sync + 'static {
    /// The source's length in bytes.
    fn size(&self) -> u64;

    /// Read exactly `len` bytes at `offset` (fewer only at the end of the source).
    fn read_at(
        &self,
        offset: u64,
        len: usize,
    ) -> impl Future<Output = Result<Bytes, ImportError>> + Send;
}

/// A local file read with positional reads on the blocking pool.
#[derive(Clone)]
pub struct FileReader {
    file: Arc<File>,
    len: u64,
}

impl FileReader {
    pub fn open(path: &Path) -> Result<Self, ImportError> {
        let file = File::open(path)
            .map_err(|e| ImportError::io(format!("opening {}", path.display()), e))?;
        let len = file
            .metadata()
            .map_err(|e| ImportError::io(format!("reading {}", path.display()), e))?
            .len();
        Ok(FileReader {
            file: Arc::new(file),
            len,
        })
    }
}

/// Read up to `len` bytes at `offset`, stopping early only at end of file.
pub(crate) fn pread(file: &File, offset: u64, len: usize) -> std::io::Result<Bytes> {
    let mut buf = Buffer::with_len(len)?;
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf.bytes_mut()[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(done);
    Ok(buf.freeze())
}

impl RangeReader for FileReader {
    fn size(&self) -> u64 {
        self.len
    }

    async fn read_at(&self, offset: u64, len: usize) -> Result<Bytes, ImportError> {
        let file = self.file.clone();
        let len = len.min(self.len.saturating_sub(offset) as usize);
        tokio::task::spawn_blocking(move || pread(&file, offset, len))
            .await
            .map_err(|e| ImportError::Internal(format!("reader task: {e}")))?
            .map_err(|e| ImportError::io(format!("reading {len} bytes at {offset}"), e))
    }
}
