//! Volumes' data on the host: copied for clones and snapshots (sparse files stay sparse) and
//! removed when reclaimed.

/// Copy a volume's directory tree (or its file) for a clone.
pub(crate) fn copy_tree(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    if from.is_dir() {
        std::fs::create_dir_all(to)?;
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        Ok(())
    } else {
        copy_sparse(from, to)
    }
}

/// Copy only the data extents of a file, so a clone of a sparse block volume stays sparse.
fn copy_sparse(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    use rustix::fs::{SeekFrom, seek};
    use std::os::unix::fs::FileExt;
    let src = std::fs::File::open(from)?;
    let dst = std::fs::File::create(to)?;
    let len = src.metadata()?.len();
    dst.set_len(len)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    while offset < len {
        // ENXIO: no data after `offset`, the rest is a hole.
        let Ok(start) = seek(&src, SeekFrom::Data(offset)) else {
            break;
        };
        let end = seek(&src, SeekFrom::Hole(start)).map_err(std::io::Error::from)?;
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(buf.len());
            src.read_exact_at(&mut buf[..n], at)?;
            dst.write_all_at(&buf[..n], at)?;
            at += n as u64;
        }
        offset = end;
    }
    Ok(())
}

/// Remove a volume's (or a snapshot's) directory or file; already gone is fine.
pub(crate) fn remove(path: &std::path::Path) -> std::io::Result<()> {
    let removed = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match removed {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
