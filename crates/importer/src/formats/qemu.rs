//! The formats converted through `qemu-img` (vmdk, vdi, vhd, vhdx): inspected first, so that an
//! image that would make qemu open another host path is refused before conversion. qemu-img
//! reads a file, so these convert only from a local copy of the source.

use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use crate::convert::{Progress, fit};
use crate::error::ImportError;
use crate::formats::kind::{Format, magic_at};
use crate::task::blocking;
use crate::writer::{Target, WriteStats};

/// The qemu-img format `head` is the start of, if any. A fixed-size VHD has no header: it is
/// recognised by its footer ([`vhd_footer`]).
pub fn detect(head: &[u8]) -> Option<Format> {
    let at = |offset: usize, magic: &[u8]| magic_at(head, offset, magic);
    if at(0, b"KDMV") || at(0, b"COWD") || at(0, b"# Disk DescriptorFile") {
        Some(Format::Vmdk)
    } else if at(0x40, &[0x7f, 0x10, 0xda, 0xbe]) {
        Some(Format::Vdi)
    } else if at(0, b"vhdxfile") {
        Some(Format::Vhdx)
    } else if at(0, b"conectix") {
        // A dynamic VHD starts with a copy of its footer.
        Some(Format::Vhd)
    } else {
        None
    }
}

/// A fixed-size VHD is raw data followed by a 512-byte footer starting with `conectix`.
pub fn vhd_footer(tail: &[u8]) -> bool {
    tail.len() >= 512 && tail[tail.len() - 512..].starts_with(b"conectix")
}

/// Convert the `format` image at `local_path` (`len` bytes) into `target` with qemu-img,
/// refusing one larger than `limit`; returns its virtual size (qemu-img's writes are not in the
/// stats).
pub(crate) async fn convert(
    format: Format,
    local_path: Option<&Path>,
    len: u64,
    target: &Target,
    limit: Option<u64>,
    progress: &Progress,
) -> Result<(u64, WriteStats), ImportError> {
    let path = local_path
        .ok_or_else(|| ImportError::Internal(format!("{format} is converted from a local copy")))?;
    let (p, t) = (path.to_path_buf(), target.path().to_path_buf());
    let virtual_size = blocking(move || inspect(&p, format)).await?;
    fit(target, virtual_size, limit)?;
    let p = path.to_path_buf();
    blocking(move || convert_to_raw(&p, format, &t)).await?;
    progress.add(len);
    Ok((virtual_size, WriteStats::default()))
}

#[derive(Debug, Deserialize)]
struct Info {
    #[serde(rename = "virtual-size")]
    virtual_size: u64,
    #[serde(rename = "backing-filename")]
    backing_filename: Option<String>,
    #[serde(rename = "format-specific")]
    format_specific: Option<FormatSpecific>,
    encrypted: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct FormatSpecific {
    data: Option<FormatData>,
}

#[derive(Debug, Deserialize)]
struct FormatData {
    extents: Option<Vec<Extent>>,
}

#[derive(Debug, Deserialize)]
struct Extent {
    filename: String,
}

fn run(cmd: &mut Command, what: &str) -> Result<Vec<u8>, ImportError> {
    let out = cmd.output().map_err(|e| {
        ImportError::io(
            format!("running qemu-img ({what}); is qemu-utils installed?"),
            e,
        )
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(ImportError::Damaged(format!(
            "qemu-img {what}: {}",
            stderr.trim()
        )));
    }
    Ok(out.stdout)
}

/// The virtual size of `path` read as `format`, refusing backing files, encryption and extents in
/// other files.
pub fn inspect(path: &Path, format: Format) -> Result<u64, ImportError> {
    let out = run(
        Command::new("qemu-img")
            .args(["info", "--output=json", "-f", format.name()])
            .arg(path),
        "info",
    )?;
    let info: Info = serde_json::from_slice(&out)
        .map_err(|e| ImportError::Internal(format!("qemu-img info output: {e}")))?;
    if let Some(backing) = info.backing_filename {
        return Err(ImportError::Unsupported(format!(
            "the {format} image has a backing file {backing:?}: importing it would read a path outside the image; flatten it first"
        )));
    }
    if info.encrypted == Some(true) {
        return Err(ImportError::Unsupported(format!(
            "the {format} image is encrypted; decrypt it first"
        )));
    }
    let extents = info
        .format_specific
        .and_then(|f| f.data)
        .and_then(|d| d.extents)
        .unwrap_or_default();
    let own = path.to_string_lossy();
    if let Some(other) = extents.iter().find(|e| e.filename != own) {
        return Err(ImportError::Unsupported(format!(
            "the {format} image keeps data in another file {:?}: importing it would read a path outside the image; convert it to a single-file image first",
            other.filename
        )));
    }
    Ok(info.virtual_size)
}

/// Convert `src` to raw into the existing target `dst` (sparse: qemu-img skips zeros).
pub fn convert_to_raw(src: &Path, format: Format, dst: &Path) -> Result<(), ImportError> {
    run(
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", format.name(), "-O", "raw"])
            .arg(src)
            .arg(dst),
        "convert",
    )?;
    Ok(())
}
