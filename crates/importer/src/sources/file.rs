//! A local image file or block device: read at random, and by qemu-img in place.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::buffer::Buffer;
use crate::error::ImportError;
use crate::sources::source::{Opened, RangeReader, Source};

/// A local file or block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSource {
    pub path: PathBuf,
}

impl FileSource {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileSource { path: path.into() }
    }
}

impl Source for FileSource {
    fn name(&self) -> String {
        self.path.display().to_string()
    }

    fn local_path(&self) -> Option<&Path> {
        Some(&self.path)
    }

    /// Refuse what is neither a regular file nor a block device. A missing source is reported
    /// when it is opened.
    fn check(&self) -> Result<(), ImportError> {
        use std::os::unix::fs::FileTypeExt;
        if let Ok(m) = std::fs::metadata(&self.path)
            && !(m.is_file() || m.file_type().is_block_device())
        {
            return Err(not_a_source(&self.path, &m));
        }
        Ok(())
    }

    fn open(&self) -> BoxFuture<'_, Result<Opened, ImportError>> {
        Box::pin(async move {
            let reader = FileReader::open(&self.path)?;
            let path = self.path.clone();
            Ok(Opened {
                size: Some(reader.size()),
                reader: Some(Arc::new(reader)),
                // Opened anew: the reader's descriptor may have been moved to its end.
                stream: Box::new(move |_| {
                    let file = File::open(&path)
                        .map_err(|e| ImportError::io(format!("opening {}", path.display()), e))?;
                    Ok(Box::new(file))
                }),
            })
        })
    }
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
fn not_a_source(path: &Path, meta: &std::fs::Metadata) -> ImportError {
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

    fn read_at(&self, offset: u64, len: usize) -> BoxFuture<'_, Result<Bytes, ImportError>> {
        let file = self.file.clone();
        let len = len.min(self.len.saturating_sub(offset) as usize);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || pread(&file, offset, len))
                .await
                .map_err(|e| ImportError::Internal(format!("reader task: {e}")))?
                .map_err(|e| ImportError::io(format!("reading {len} bytes at {offset}"), e))
        })
    }
}
