//! A container's root: a directory where its mount and device paths are links to its volumes
//! and its termination log is a file, every path kept below the root and nothing made through
//! a symbolic link.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::Container;

use super::blocked::{Blocked, io_blocked};
use super::dirs::{HostVolume, PodDir};
use super::paths::{component, layout};

fn errno(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

/// Open the directory `base/rel`, making the missing ones, without following a symbolic link
/// (or anything but a directory) at any step below `base`: a container's process, or another
/// mount, may have put a link there, and nothing is to be made through it.
fn open_below(base: &Path, rel: &Path, what: &str) -> Result<OwnedFd, Blocked> {
    use rustix::fs::{CWD, Mode, OFlags, mkdirat, openat};
    use rustix::io::Errno;
    let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
    let mut fd = openat(CWD, base, flags, Mode::empty())
        .map_err(|e| io_blocked(&format!("{what}: opening {}", base.display()), errno(e)))?;
    let mut at = base.to_path_buf();
    for part in rel.components() {
        let Component::Normal(part) = part else {
            return Err(Blocked::Config(format!(
                "{what}: {} is not a plain path",
                rel.display()
            )));
        };
        at.push(part);
        match mkdirat(&fd, part, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => {
                return Err(io_blocked(
                    &format!("{what}: creating {}", at.display()),
                    errno(e),
                ));
            }
        }
        fd = match openat(&fd, part, flags | OFlags::NOFOLLOW, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::LOOP | Errno::NOTDIR) => {
                return Err(Blocked::Config(format!(
                    "{what}: {} is a symbolic link or not a directory: the kubelet makes \
                     nothing through it",
                    at.display()
                )));
            }
            Err(e) => {
                return Err(io_blocked(
                    &format!("{what}: opening {}", at.display()),
                    errno(e),
                ));
            }
        };
    }
    Ok(fd)
}

/// The directory holding `root/rel` (opened as [`open_below`] does) and the last component.
fn parent_below<'a>(
    root: &Path,
    rel: &'a Path,
    what: &str,
) -> Result<(OwnedFd, &'a std::ffi::OsStr), Blocked> {
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return Err(Blocked::Config(format!(
            "{what}: {} names the container's root",
            rel.display()
        )));
    };
    Ok((open_below(root, parent, what)?, name))
}

/// Replace whatever is at `root/rel` by a symbolic link to `target`.
fn link(target: &Path, root: &Path, rel: &Path) -> Result<(), Blocked> {
    use rustix::fs::{AtFlags, FileType, statat, symlinkat, unlinkat};
    let what = format!("linking {}", root.join(rel).display());
    let (parent, name) = parent_below(root, rel, &what)?;
    let failed = |e| io_blocked(&what, errno(e));
    match statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        // A directory in the way (made by the container's process): it goes, links in it
        // are removed, not followed.
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            std::fs::remove_dir_all(root.join(rel)).map_err(|e| io_blocked(&what, e))?
        }
        Ok(_) => unlinkat(&parent, name, AtFlags::empty()).map_err(failed)?,
        Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(failed(e)),
    }
    symlinkat(target, &parent, name).map_err(failed)
}

/// Open a termination log for writing, emptied, never through a symbolic link: the kubelet
/// empties it before each start, and the process may have replaced it by a link meanwhile.
pub fn empty_termination_log(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map(drop)
}

/// Read a termination log, not through a symbolic link.
pub fn read_termination_log(path: &Path) -> Vec<u8> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut out = Vec::new();
    let opened = std::fs::File::options()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path);
    if let Ok(mut f) = opened {
        let _ = f.read_to_end(&mut out);
    }
    out
}

/// The capacities of a container's claim volumes by the path it sees them at, as
/// `PATH=BYTES,…` for [`crate::agents::kubelet::PodEnv::capacity`].
pub fn capacities(c: &Container, volumes: &HashMap<String, HostVolume>) -> String {
    let mounts = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (&m.name, &m.mount_path));
    let devices = c
        .volume_devices
        .iter()
        .flatten()
        .map(|d| (&d.name, &d.device_path));
    mounts
        .chain(devices)
        .filter_map(|(name, at)| Some(format!("{at}={}", volumes.get(name)?.capacity?)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Build the container's root: its mount paths and device paths linked to the volumes (a
/// `subPath` below the volume), its termination log an empty file. Returns the log's host path.
/// Every path stays below the root, and nothing is made through a symbolic link.
pub fn root(
    dir: &PodDir,
    c: &Container,
    volumes: &HashMap<String, HostVolume>,
) -> Result<PathBuf, Blocked> {
    let field = format!("container {:?}", c.name);
    component("name", &c.name).map_err(Blocked::Config)?;
    let layout = layout(c, &field).map_err(Blocked::Config)?;
    let root = dir.root(&c.name);
    let config = |m: String| Blocked::Config(format!("{field}: {m}"));
    let mut links = Vec::new();
    for (m, (at, sub)) in c.volume_mounts.iter().flatten().zip(layout.mounts) {
        let v = volumes.get(&m.name).ok_or_else(|| {
            config(format!(
                "volumeMount {:?} names no volume of the pod",
                m.name
            ))
        })?;
        if v.block {
            return Err(config(format!(
                "volume {:?} is a Block volume: use volumeDevices, not volumeMounts",
                m.name
            )));
        }
        let mut target = v.path.clone();
        if let Some(sub) = sub {
            open_below(&v.path, &sub, "creating a subPath")?;
            target = target.join(sub);
        }
        links.push((target, at));
    }
    for (d, at) in c.volume_devices.iter().flatten().zip(layout.devices) {
        let v = volumes.get(&d.name).ok_or_else(|| {
            config(format!(
                "volumeDevice {:?} names no volume of the pod",
                d.name
            ))
        })?;
        if !v.block {
            return Err(config(format!(
                "volume {:?} is a Filesystem volume: use volumeMounts, not volumeDevices",
                d.name
            )));
        }
        links.push((v.path.clone(), at));
    }
    std::fs::create_dir_all(&root).map_err(|e| io_blocked("creating the container's root", e))?;
    for (target, at) in links {
        link(&target, &root, &at)?;
    }
    let what = "creating the termination log";
    let (parent, name) = parent_below(&root, &layout.log, what)?;
    {
        use rustix::fs::{AtFlags, FileType, Mode, OFlags, openat, statat, unlinkat};
        let failed = |e| io_blocked(what, errno(e));
        // A link left there by the process goes: the log is a file of the root's own.
        if statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink)
        {
            unlinkat(&parent, name, AtFlags::empty()).map_err(failed)?;
        }
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW;
        openat(
            &parent,
            name,
            flags | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(failed)?;
    }
    let log = root.join(&layout.log);
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn roots_link_volumes_and_devices() {
        let tmp = tempfile::tempdir().unwrap();
        let pv = tmp.path().join("pv");
        let block = tmp.path().join("disk.img");
        std::fs::create_dir_all(&pv).unwrap();
        std::fs::write(&block, b"").unwrap();
        let dir = PodDir(tmp.path().join("pod"));
        let volumes: HashMap<String, HostVolume> = [
            (
                "data".to_string(),
                HostVolume {
                    path: pv.clone(),
                    block: false,
                    capacity: None,
                },
            ),
            (
                "disk".to_string(),
                HostVolume {
                    path: block.clone(),
                    block: true,
                    capacity: None,
                },
            ),
        ]
        .into();
        let c: Container = serde_json::from_value(json!({
            "name": "c", "image": "x",
            "volumeMounts": [{"name": "data", "mountPath": "/data"},
                {"name": "data", "mountPath": "/sub", "subPath": "a/b"}],
            "volumeDevices": [{"name": "disk", "devicePath": "/dev/cdi-block-volume"}],
        }))
        .unwrap();
        let log = root(&dir, &c, &volumes).unwrap();
        let r = dir.root("c");
        assert_eq!(std::fs::read_link(r.join("data")).unwrap(), pv);
        assert_eq!(std::fs::read_link(r.join("sub")).unwrap(), pv.join("a/b"));
        assert!(pv.join("a/b").is_dir());
        assert_eq!(
            std::fs::read_link(r.join("dev/cdi-block-volume")).unwrap(),
            block
        );
        assert_eq!(log, r.join("dev/termination-log"));
        // Again, as after a restart: same links.
        root(&dir, &c, &volumes).unwrap();
        std::fs::write(r.join("data/f"), b"x").unwrap();
        assert_eq!(std::fs::read(pv.join("f")).unwrap(), b"x");

        let wrong: Container = serde_json::from_value(json!({
            "name": "c", "image": "x",
            "volumeMounts": [{"name": "disk", "mountPath": "/data"}],
        }))
        .unwrap();
        let err = root(&dir, &wrong, &volumes).unwrap_err();
        assert!(
            matches!(&err, Blocked::Config(m) if m.contains("use volumeDevices")),
            "{err:?}"
        );
        let escape: Container = serde_json::from_value(json!({
            "name": "c", "image": "x",
            "volumeMounts": [{"name": "data", "mountPath": "/d", "subPath": "../x"}],
        }))
        .unwrap();
        assert!(matches!(
            root(&dir, &escape, &volumes),
            Err(Blocked::Config(_))
        ));
    }

    #[test]
    fn nothing_is_made_through_a_link_in_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        let pv = tmp.path().join("pv");
        std::fs::create_dir_all(&pv).unwrap();
        let dir = PodDir(tmp.path().join("pod"));
        let volumes: HashMap<String, HostVolume> = [(
            "data".to_string(),
            HostVolume {
                path: pv.clone(),
                block: false,
                capacity: None,
            },
        )]
        .into();
        let c: Container = serde_json::from_value(json!({
            "name": "c", "image": "x",
            "volumeMounts": [{"name": "data", "mountPath": "/var/lib/data"},
                {"name": "data", "mountPath": "/sub", "subPath": "a/b"}],
        }))
        .unwrap();
        // The process replaced /var and /dev by links out, and a directory of its volume too.
        let r = dir.root("c");
        std::fs::create_dir_all(&r).unwrap();
        for (link, name) in [
            (pv.join("a"), "pv/a"),
            (r.join("var"), "root/var"),
            (r.join("dev"), "root/dev"),
        ] {
            std::os::unix::fs::symlink(&outside, &link).unwrap();
            let err = root(&dir, &c, &volumes).unwrap_err();
            let refused = format!("{name} is a symbolic link");
            assert!(
                matches!(&err, Blocked::Config(m) if m.contains(&refused)),
                "{err:?}"
            );
            std::fs::remove_file(&link).unwrap();
        }
        // A termination log replaced by a link: the link goes, its target is not touched.
        std::fs::create_dir_all(r.join("dev")).unwrap();
        std::fs::write(outside.join("f"), b"keep").unwrap();
        std::os::unix::fs::symlink(outside.join("f"), r.join("dev/termination-log")).unwrap();
        let log = root(&dir, &c, &volumes).unwrap();
        assert!(std::fs::symlink_metadata(&log).unwrap().is_file());
        std::fs::remove_file(&log).unwrap();
        std::os::unix::fs::symlink(outside.join("f"), &log).unwrap();
        assert!(empty_termination_log(&log).is_err());
        assert!(read_termination_log(&log).is_empty());
        assert_eq!(std::fs::read(outside.join("f")).unwrap(), b"keep");
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            1,
            "only the file the test made"
        );
        assert_eq!(std::fs::read_link(r.join("var/lib/data")).unwrap(), pv);
        assert_eq!(std::fs::read_link(r.join("sub")).unwrap(), pv.join("a/b"));
    }
}
