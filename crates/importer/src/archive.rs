//! `contentType: archive`: a tar (optionally compressed) unpacked onto the filesystem volume.

use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::checksum::{Checksum, Hasher};
use crate::convert::Progress;
use crate::error::ImportError;
use crate::formats::probe::Detected;
use crate::import::verify;
use crate::reading::{Counting, decoder, peek};
use crate::sources::Source;
use crate::task::blocking;

/// Fails a read once more than `limit` bytes came through: an archive cannot expand past the
/// volume.
struct Bounded<R> {
    inner: R,
    seen: u64,
    limit: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.seen += n as u64;
        if self.seen > self.limit {
            return Err(std::io::Error::other(format!(
                "the archive expands past the {} bytes the volume has",
                self.limit
            )));
        }
        Ok(n)
    }
}

/// Remove everything under `dir` but `dir` itself (the volume's mount point).
fn clear(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}

/// Unpack every member under `dest`, as `tar::Archive::unpack` does (directories last, so that
/// their permissions do not stop what goes inside them), but refusing the archive when a member
/// would land outside `dest` (a `..` component, a path through a link), where the tar crate skips
/// it without a word: a volume missing files it should have is worse than a clear refusal.
fn unpack_entries<R: Read>(archive: &mut tar::Archive<R>, dest: &Path) -> Result<(), ImportError> {
    // The tar crate quotes the header bytes it could not read: the archive is named as not
    // one, rather than its bytes echoed (`from_read` keeps a transfer's own error).
    let damaged = |e: std::io::Error| {
        ImportError::from_read(
            "not a tar archive, or a damaged one (its headers do not check out)",
            e,
        )
    };
    let mut directories = Vec::new();
    let place = |entry: &mut tar::Entry<'_, R>| -> Result<(), ImportError> {
        // The member's name as the archive spells it, made safe to show (it is the uploader's).
        let name = entry
            .path()
            .map(|p| crate::error::printable(&p.display().to_string()))
            .unwrap_or_default();
        // Writing the member: its failures are the volume's (no space, I/O), not the archive's.
        let placed = entry
            .unpack_in(dest)
            .map_err(|e| ImportError::io(format!("unpacking \"{name}\""), e))?;
        if placed {
            Ok(())
        } else {
            Err(ImportError::Unsupported(format!(
                "the archive's member \"{name}\" would be written outside the volume; refusing the \
                 archive"
            )))
        }
    };
    for entry in archive.entries().map_err(damaged)? {
        let mut entry = entry.map_err(damaged)?;
        if entry.header().entry_type() == tar::EntryType::Directory {
            directories.push(entry);
        } else {
            place(&mut entry)?;
        }
    }
    for mut dir in directories {
        place(&mut dir)?;
    }
    Ok(())
}

/// Unpack `source` into `dir`. Members cannot escape `dir`: absolute paths are taken as relative
/// to it (as GNU tar does), and an archive with a member that would leave it is refused. On any
/// failure, what was unpacked is removed.
pub async fn unpack(
    source: &dyn Source,
    dir: &Path,
    capacity: u64,
    checksum: Option<&Checksum>,
    progress: Arc<Progress>,
) -> Result<(), ImportError> {
    let opened = source.open().await?;
    progress.total.store(
        opened.size.unwrap_or(0),
        std::sync::atomic::Ordering::Relaxed,
    );
    let input = (opened.stream)(16)?;
    let hasher = Arc::new(Mutex::new(checksum.map(|c| Hasher::new(c.algorithm))));
    let counted: Box<dyn Read + Send> = Box::new(Counting {
        inner: input,
        hasher: hasher.clone(),
        progress,
    });
    let dest = dir.to_path_buf();
    let result = blocking(move || {
        let (detected, stream) = peek(counted, "reading the archive")?;
        let (stream, inner) = match detected {
            Detected::Compressed(c) => {
                let (inner, stream) = peek(decoder(c, stream)?, c.name())?;
                (stream, inner)
            }
            image => (stream, image),
        };
        // A disk image is not an archive, whatever the DataVolume says.
        if let Detected::Image(format) = inner
            && !matches!(format, crate::formats::probe::Format::Raw)
        {
            return Err(ImportError::Unsupported(format!(
                "contentType archive needs a tar archive, and this is a {} image; use contentType \
                 kubevirt for disk images",
                format.name()
            )));
        }
        let mut archive = tar::Archive::new(Bounded {
            inner: stream,
            seen: 0,
            limit: capacity,
        });
        archive.set_preserve_permissions(true);
        archive.set_unpack_xattrs(false);
        archive.set_overwrite(true);
        unpack_entries(&mut archive, &dest)?;
        // Hash whatever follows the tar end marker too: the checksum covers the whole download.
        let mut rest = archive.into_inner();
        std::io::copy(&mut rest, &mut std::io::sink())
            .map_err(|e| ImportError::Damaged(format!("reading the archive: {e}")))?;
        Ok(())
    })
    .await;
    let result = result.and_then(|()| match checksum {
        Some(expected) => {
            let actual = hasher
                .lock()
                .expect("hasher lock")
                .take()
                .map(Hasher::finish)
                .unwrap_or_default();
            verify(expected, &actual)
        }
        None => Ok(()),
    });
    if result.is_err() {
        clear(dir);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random bytes sent as an archive: named as not one, nothing of them echoed.
    #[test]
    fn bytes_that_are_no_archive_are_not_echoed() {
        let dir = tempfile::tempdir().unwrap();
        let mut header = vec![0u8; 512];
        let name = "abc\u{202e}txt.exe".as_bytes();
        header[..name.len()].copy_from_slice(name);
        header[148..156].copy_from_slice(b"z\xe2\x80\xae\x1b[2J");
        header.extend_from_slice(&[0u8; 1024]);
        let mut archive = tar::Archive::new(header.as_slice());
        let err = unpack_entries(&mut archive, dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a tar archive, or a damaged one"), "{err}");
        assert!(!err.chars().any(crate::error::is_deceptive), "{err:?}");
        assert!(err.is_ascii(), "{err}");
    }
}
