//! What a host-assisted clone sends: a Filesystem volume as a tar stream, a Block volume as its
//! bytes. Files with holes become GNU sparse members: their holes are neither read nor sent, and
//! the upload server (the tar crate, as GNU tar) leaves them holes in the copy.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The directory a fresh filesystem has at its root; it is the target's own, never copied.
pub const LOST_FOUND: &str = "lost+found";

const BLOCK: u64 = 512;
/// Sparse map entries in a GNU header, and in each extension block after it.
const IN_HEADER: usize = 4;
const PER_EXTENSION: usize = 21;
/// Holes shorter than this are sent as zeros: a map entry per small hole costs more than it saves.
const SMALL_HOLE: u64 = 64 << 10;
/// A file in more pieces than this is sent whole (the map is held in memory; the upload server
/// leaves zeros as holes anyway).
const MAX_EXTENTS: usize = 1 << 16;

/// The data extents of `file` (`len` bytes long) as (offset, length): where the filesystem holds
/// data, widened to 512-byte boundaries (a sparse member's segments must be; the end is capped at
/// `len`), holes under 64 KiB included. The whole file when the filesystem cannot tell (no
/// `SEEK_DATA`) or it is in too many pieces.
pub fn data_extents(file: &File, len: u64) -> io::Result<Vec<(u64, u64)>> {
    use rustix::fs::{SeekFrom, seek};
    let mut extents: Vec<(u64, u64)> = Vec::new();
    let mut at = 0u64;
    while at < len {
        let start = match seek(file, SeekFrom::Data(at)) {
            Ok(s) => s,
            // No data after `at`: the rest is a hole.
            Err(rustix::io::Errno::NXIO) => break,
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOTSUP) if at == 0 => {
                return Ok(if len == 0 { Vec::new() } else { vec![(0, len)] });
            }
            Err(e) => return Err(e.into()),
        };
        // A file that grew since its length was read: what lies past `len` is not sent.
        if start >= len {
            break;
        }
        let end = seek(file, SeekFrom::Hole(start))?.min(len);
        let (start, end) = (start / BLOCK * BLOCK, end.div_ceil(BLOCK) * BLOCK);
        let end = end.min(len);
        match extents.last_mut() {
            Some((o, l)) if *o + *l + SMALL_HOLE >= start => *l = end.max(*o + *l) - *o,
            _ => extents.push((start, end - start)),
        }
        if extents.len() > MAX_EXTENTS {
            return Ok(vec![(0, len)]);
        }
        at = end.max(at + 1);
    }
    Ok(extents)
}

/// The bytes a sparse member stores: its extension headers (the map entries the header had no
/// room for), then its data segments read from the file.
struct SparseBody<'a> {
    file: &'a File,
    prefix: io::Cursor<Vec<u8>>,
    segments: std::vec::IntoIter<(u64, u64)>,
    current: Option<(u64, u64)>,
    sent: &'a AtomicU64,
}

impl Read for SparseBody<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.prefix.read(buf)?;
        if n > 0 {
            return Ok(n);
        }
        loop {
            match self.current {
                Some((_, 0)) | None => match self.segments.next() {
                    Some(s) => self.current = Some(s),
                    None => return Ok(0),
                },
                Some((offset, left)) => {
                    let want = (left as usize).min(buf.len());
                    let n = self.file.read_at(&mut buf[..want], offset)?;
                    if n == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the file shrank while it was read",
                        ));
                    }
                    self.current = Some((offset + n as u64, left - n as u64));
                    self.sent.fetch_add(n as u64, Ordering::Relaxed);
                    return Ok(n);
                }
            }
        }
    }
}

/// A regular member's bytes: exactly the `left` its header announced, counted as sent.
struct Dense<'a> {
    file: &'a File,
    at: u64,
    left: u64,
    sent: &'a AtomicU64,
}

impl Read for Dense<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (self.left as usize).min(buf.len());
        if want == 0 {
            return Ok(0);
        }
        // Positional: finding the extents moved the file's offset.
        let n = self.file.read_at(&mut buf[..want], self.at)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file shrank while it was read",
            ));
        }
        self.at += n as u64;
        self.left -= n as u64;
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// The header and extension blocks of a sparse member of `len` bytes with `extents`. The map
/// always ends at `len` (an empty last entry when the file ends in a hole), as GNU tar writes it.
fn sparse_header(
    meta: &std::fs::Metadata,
    len: u64,
    extents: &[(u64, u64)],
) -> (tar::Header, Vec<u8>) {
    let mut map = extents.to_vec();
    if map.last().is_none_or(|(o, l)| o + l < len) {
        map.push((len, 0));
    }
    let mut header = tar::Header::new_gnu();
    header.set_metadata_in_mode(meta, tar::HeaderMode::Complete);
    header.set_entry_type(tar::EntryType::GNUSparse);
    header.set_size(extents.iter().map(|(_, l)| l).sum());
    let mut extension = Vec::new();
    if let Some(gnu) = header.as_gnu_mut() {
        gnu.set_real_size(len);
        for (slot, (o, l)) in gnu.sparse.iter_mut().zip(&map) {
            slot.set_offset(*o);
            slot.set_length(*l);
        }
        let rest: Vec<&[(u64, u64)]> = map
            .get(IN_HEADER..)
            .unwrap_or_default()
            .chunks(PER_EXTENSION)
            .collect();
        gnu.set_is_extended(!rest.is_empty());
        for (i, chunk) in rest.iter().enumerate() {
            let mut ext = tar::GnuExtSparseHeader::new();
            for (slot, (o, l)) in ext.sparse.iter_mut().zip(chunk.iter()) {
                slot.set_offset(*o);
                slot.set_length(*l);
            }
            ext.set_is_extended(i + 1 < rest.len());
            extension.extend_from_slice(ext.as_bytes());
        }
    }
    (header, extension)
}

/// Write the tree under `root` as a tar stream to `out` (members named `./…`, as `tar -C root .`
/// names them), `lost+found` at the top left out. `sent` counts the file bytes sent. Sockets,
/// FIFOs and device nodes are left out with a warning: they hold no data.
pub fn pack_directory<W: Write>(root: &Path, out: W, sent: &AtomicU64) -> io::Result<W> {
    let mut builder = tar::Builder::new(Fuse {
        inner: out,
        blown: false,
    });
    builder.mode(tar::HeaderMode::Complete);
    builder.follow_symlinks(false);
    if let Err(e) = walk(&mut builder, root, sent) {
        // The builder ends the archive when dropped: a stream cut short must not look whole.
        builder.get_mut().blown = true;
        return Err(e);
    }
    Ok(builder.into_inner()?.inner)
}

/// A writer that refuses every write once blown.
struct Fuse<W> {
    inner: W,
    blown: bool,
}

impl<W: Write> Write for Fuse<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.blown {
            return Err(io::Error::other("the archive was abandoned"));
        }
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.blown {
            return Err(io::Error::other("the archive was abandoned"));
        }
        self.inner.flush()
    }
}

fn walk<W: Write>(builder: &mut tar::Builder<W>, root: &Path, sent: &AtomicU64) -> io::Result<()> {
    let mut stack: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(relative) = stack.pop() {
        let dir = root.join(&relative);
        let mut names: Vec<_> = std::fs::read_dir(&dir)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()?;
        names.sort();
        // Popped in reverse: the tree goes out in name order.
        for name in names.into_iter().rev() {
            if relative.as_os_str().is_empty() && name == LOST_FOUND {
                continue;
            }
            let path = relative.join(&name);
            let full = root.join(&path);
            let meta = std::fs::symlink_metadata(&full)?;
            let member = Path::new(".").join(&path);
            let kind = meta.file_type();
            if kind.is_dir() {
                builder.append_dir(&member, &full)?;
                stack.push(path);
            } else if kind.is_symlink() {
                let mut header = tar::Header::new_gnu();
                header.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
                header.set_size(0);
                builder.append_link(&mut header, &member, std::fs::read_link(&full)?)?;
            } else if kind.is_file() {
                append_file(builder, &member, &full, &meta, sent)?;
            } else {
                tracing::warn!(path = %full.display(), "left out of the clone: not a file, directory or link");
            }
        }
    }
    Ok(())
}

fn append_file<W: Write>(
    builder: &mut tar::Builder<W>,
    member: &Path,
    full: &Path,
    meta: &std::fs::Metadata,
    sent: &AtomicU64,
) -> io::Result<()> {
    let file = File::open(full)?;
    let len = file.metadata()?.len();
    let extents = data_extents(&file, len)?;
    let dense = extents.len() == 1 && extents[0] == (0, len);
    if dense || len == 0 {
        let mut header = tar::Header::new_gnu();
        header.set_metadata_in_mode(meta, tar::HeaderMode::Complete);
        header.set_size(len);
        let body = Dense {
            file: &file,
            at: 0,
            left: len,
            sent,
        };
        return builder.append_data(&mut header, member, body);
    }
    let (mut header, extension) = sparse_header(meta, len, &extents);
    let body = SparseBody {
        file: &file,
        prefix: io::Cursor::new(extension),
        segments: extents.into_iter(),
        current: None,
        sent,
    };
    builder.append_data(&mut header, member, body)
}

/// The bytes a Filesystem clone will send: the data extents of every file under `root`
/// (`lost+found` left out), for the progress metric's total.
pub fn directory_data_bytes(root: &Path) -> io::Result<u64> {
    let mut total = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if dir == root && entry.file_name() == LOST_FOUND {
                continue;
            }
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                let file = File::open(entry.path())?;
                let len = file.metadata()?.len();
                total += data_extents(&file, len)?
                    .iter()
                    .map(|(_, l)| l)
                    .sum::<u64>();
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom};

    /// A file with data at these (offset, bytes) places and holes elsewhere.
    fn sparse_file(path: &Path, len: u64, data: &[(u64, Vec<u8>)]) {
        let mut f = File::create(path).unwrap();
        f.set_len(len).unwrap();
        for (at, bytes) in data {
            f.seek(SeekFrom::Start(*at)).unwrap();
            f.write_all(bytes).unwrap();
        }
    }

    fn allocated(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().blocks() * 512
    }

    #[test]
    fn extents_are_where_the_data_is() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let mib = 1u64 << 20;
        sparse_file(
            &p,
            10 * mib,
            &[(mib, vec![1; 4096]), (5 * mib, vec![2; 100])],
        );
        let f = File::open(&p).unwrap();
        let extents = data_extents(&f, 10 * mib).unwrap();
        // Filesystems allocate in blocks of at least 512 bytes; the data lies inside them.
        assert_eq!(extents.len(), 2, "{extents:?}");
        assert!(extents[0].0 <= mib && extents[0].0 + extents[0].1 >= mib + 4096);
        assert!(extents[1].0 <= 5 * mib && extents[1].0 + extents[1].1 >= 5 * mib + 100);
        assert!(extents.iter().all(|(o, l)| o % 512 == 0 && l % 512 == 0));
    }

    /// Pack a tree, unpack it with the tar crate (what the upload server does) and with GNU tar:
    /// the same bytes, and the holes still holes.
    #[test]
    fn a_tree_with_sparse_files_round_trips() {
        let src = tempfile::tempdir().unwrap();
        let mib = 1u64 << 20;
        // Many extents: more than the header and one extension block hold.
        let many: Vec<(u64, Vec<u8>)> = (0..40u64)
            .map(|i| (i * 2 * mib, vec![i as u8 + 1; 8192]))
            .collect();
        sparse_file(&src.path().join("disk.img"), 100 * mib + 7, &many);
        sparse_file(
            &src.path().join("tail"),
            3 * mib + 3,
            &[(3 * mib, vec![9; 3])],
        );
        std::fs::write(src.path().join("small"), b"hello").unwrap();
        std::fs::write(src.path().join("empty"), b"").unwrap();
        std::fs::create_dir_all(src.path().join("sub/deeper")).unwrap();
        std::fs::write(src.path().join("sub/deeper/x"), vec![7u8; 70_000]).unwrap();
        std::os::unix::fs::symlink("../small", src.path().join("sub/link")).unwrap();
        std::fs::create_dir(src.path().join(LOST_FOUND)).unwrap();
        std::fs::write(src.path().join(LOST_FOUND).join("junk"), b"x").unwrap();

        let sent = AtomicU64::new(0);
        let tar_bytes = pack_directory(src.path(), Vec::new(), &sent).unwrap();
        let data = directory_data_bytes(src.path()).unwrap();
        assert_eq!(
            sent.load(Ordering::Relaxed),
            data,
            "what is sent is what was counted"
        );
        assert_eq!(
            data,
            40 * 8192 + 3 + 5 + 70_000,
            "holes and lost+found are not counted"
        );
        assert!(
            (tar_bytes.len() as u64) < 4 * mib,
            "holes are not sent: {} bytes",
            tar_bytes.len()
        );

        let check = |out: &Path| {
            for name in ["disk.img", "tail", "small", "empty", "sub/deeper/x"] {
                let a = std::fs::read(src.path().join(name)).unwrap();
                let b = std::fs::read(out.join(name)).unwrap();
                assert!(a == b, "{name} differs");
            }
            assert_eq!(
                std::fs::read_link(out.join("sub/link")).unwrap(),
                Path::new("../small")
            );
            assert!(!out.join(LOST_FOUND).exists());
            assert!(
                allocated(&out.join("disk.img")) < 8 * mib,
                "the copy stays sparse: {} bytes allocated",
                allocated(&out.join("disk.img"))
            );
        };
        let by_crate = tempfile::tempdir().unwrap();
        tar::Archive::new(&tar_bytes[..])
            .unpack(by_crate.path())
            .unwrap();
        check(by_crate.path());

        let by_gnu = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("tar")
            .args(["-x", "-f", "-", "-C"])
            .arg(by_gnu.path())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&tar_bytes).unwrap();
        assert!(child.wait().unwrap().success());
        check(by_gnu.path());
    }
}
