//! A volume's files written as the kubelet's atomic writer writes them: a rewrite swaps every
//! file at once.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use super::paths::relative;

/// Write `files` (relative path → content) into `dir`, replacing what was there.
/// Write a volume's files as the kubelet's atomic writer does: into a fresh hidden directory,
/// published by renaming the `..data` link to it, each top-level name a link through `..data`.
/// A rewrite (a Secret changed) swaps every file at once: a file is never seen half written,
/// and a reader going through `..data` sees one version whole. (Reading two files by their own
/// links, a reader may still straddle a swap, and reads again.)
pub(super) fn write_files(
    dir: &Path,
    files: &BTreeMap<String, Vec<u8>>,
    mode: Option<i32>,
) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut checked = Vec::new();
    for (name, content) in files {
        // Keys become file names too, and a Secret's keys are not the pod's to check.
        let rel = relative(name).map_err(|why| {
            io::Error::other(format!(
                "file {name:?}: {why}: a volume's files stay inside the volume"
            ))
        })?;
        if name.starts_with("..") {
            return Err(io::Error::other(format!(
                "file {name:?}: names starting with \"..\" are the kubelet's own"
            )));
        }
        checked.push((rel, content));
    }
    let data = dir.join("..data");
    if dir.exists() && !data.is_symlink() {
        // Written before in another layout (or by hand): start over.
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    let stamp = format!(
        "..{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let fresh = dir.join(&stamp);
    std::fs::create_dir(&fresh)?;
    let mut tops = std::collections::BTreeSet::new();
    for (rel, content) in &checked {
        let path = fresh.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, content)?;
        if let Some(mode) = mode {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode as u32 & 0o777))?;
        }
        if let Some(top) = rel.components().next() {
            tops.insert(top.as_os_str().to_os_string());
        }
    }
    let swap = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&swap);
    std::os::unix::fs::symlink(&stamp, &swap)?;
    std::fs::rename(&swap, &data)?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let text = name.to_string_lossy();
        if text == "..data" || *text == *stamp {
            continue;
        }
        if text.starts_with("..") {
            // An earlier version's directory: nothing links to it any more.
            std::fs::remove_dir_all(entry.path())?;
        } else if !tops.contains(&name) {
            std::fs::remove_file(entry.path())?;
        }
    }
    for top in &tops {
        let link = dir.join(top);
        if !link.is_symlink() {
            std::os::unix::fs::symlink(Path::new("..data").join(top), &link)?;
        }
    }
    Ok(())
}

/// Whether volume `dir` holds exactly `files` already.
pub(super) fn holds(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let shown = entries
        .filter_map(|e| e.ok())
        .filter(|e| !e.file_name().to_string_lossy().starts_with(".."))
        .count();
    let tops: std::collections::BTreeSet<&str> = files
        .keys()
        .filter_map(|k| k.split('/').find(|c| !c.is_empty()))
        .collect();
    shown == tops.len()
        && files.iter().all(|(name, content)| {
            relative(name)
                .is_ok_and(|rel| std::fs::read(dir.join(rel)).ok().as_ref() == Some(content))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_stay_inside_their_volume() {
        let tmp = tempfile::tempdir().unwrap();
        for bad in ["../x", "/x", ".", ""] {
            let files: BTreeMap<String, Vec<u8>> = [(bad.to_string(), b"x".to_vec())].into();
            assert!(
                write_files(&tmp.path().join("v"), &files, None).is_err(),
                "{bad}"
            );
        }
        let files: BTreeMap<String, Vec<u8>> = [("a/b".to_string(), b"x".to_vec())].into();
        write_files(&tmp.path().join("v"), &files, Some(0o600)).unwrap();
        assert_eq!(std::fs::read(tmp.path().join("v/a/b")).unwrap(), b"x");
        let reserved: BTreeMap<String, Vec<u8>> = [("..data".to_string(), b"x".to_vec())].into();
        assert!(write_files(&tmp.path().join("v"), &reserved, None).is_err());
    }

    #[test]
    fn a_rewritten_volume_swaps_every_file_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let v = tmp.path().join("v");
        let first: BTreeMap<String, Vec<u8>> = [
            ("tls.crt".to_string(), b"old cert".to_vec()),
            ("tls.key".to_string(), b"old key".to_vec()),
            ("gone".to_string(), b"x".to_vec()),
        ]
        .into();
        write_files(&v, &first, None).unwrap();
        assert!(holds(&v, &first));
        let second: BTreeMap<String, Vec<u8>> = [
            ("tls.crt".to_string(), b"new cert".to_vec()),
            ("tls.key".to_string(), b"new key".to_vec()),
        ]
        .into();
        assert!(!holds(&v, &second));
        // A reader holding the old directory open keeps reading the old pair whole.
        let old = std::fs::read_link(v.join("..data")).unwrap();
        write_files(&v, &second, Some(0o600)).unwrap();
        assert!(holds(&v, &second));
        assert_eq!(std::fs::read(v.join("tls.key")).unwrap(), b"new key");
        assert!(!v.join("gone").exists());
        assert!(!v.join(&old).exists(), "the old version is cleared");
        let shown: Vec<String> = std::fs::read_dir(&v)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with(".."))
            .collect();
        assert_eq!(shown.len(), 2, "{shown:?}");
    }
}
