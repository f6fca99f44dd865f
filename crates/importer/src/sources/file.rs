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
        use std::io::Seek;
        use std::os::unix::fs::FileTypeExt;
        let file = File::open(path)
            .map_err(|e| ImportError::io(format!("opening {}", path.display()), e))?;
        let kind = file
            .metadata()
            .map_err(|e| ImportError::io(format!("reading {}", path.display()), e))?;
        let len = if kind.is_file() {
            kind.len()
        } else if kind.file_type().is_block_device() {
            // A device's metadata says 0 bytes; its end is its size.
            (&file).seek(std::io::SeekFrom::End(0)).map_err(|e| {
                ImportError::io(format!("finding the size of {}", path.display()), e)
            })?
        } else {
            return Err(not_a_source(path, &kind));
        };
        Ok(FileReader {
            file: Arc::new(file),
            len,
        })
    }
}

/// Refuse what cannot be read at random or has no size: read as a file it would be an empty
/// image (a FIFO, a character device such as /dev/zero, a socket, a directory).
pub(crate) fn not_a_source(path: &Path, meta: &std::fs::Metadata) -> ImportError {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    let what = if t.is_fifo() {
        "a FIFO (pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_dir() {
        "a directory"
    } else {
        "not a file"
    };
    ImportError::Unsupported(format!(
        "{} is not a regular file or block device ({what}): the source must be an image file, a block device or an http(s):// URL",
        path.display()
    ))
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
