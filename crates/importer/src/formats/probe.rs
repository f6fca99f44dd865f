//! Format and compression detection by magic bytes; each format's magic is in its module.

use super::{iso, qcow2, qemu};

/// Bytes [`probe`] wants to see: enough for every magic, including ISO 9660's at 0x8001.
pub const PROBE_LEN: usize = 0x8006;

/// Whether `head` has `magic` at `offset`.
pub(crate) fn magic_at(head: &[u8], offset: usize, magic: &[u8]) -> bool {
    head.get(offset..offset + magic.len()) == Some(magic)
}

/// A disk image format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Raw,
    Qcow2,
    Vmdk,
    Vdi,
    Vhd,
    Vhdx,
    /// An ISO 9660 image: copied as raw.
    Iso,
}

impl Format {
    pub const fn name(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Qcow2 => "qcow2",
            Format::Vmdk => "vmdk",
            Format::Vdi => "vdi",
            Format::Vhd => "vpc",
            Format::Vhdx => "vhdx",
            Format::Iso => "iso",
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A stream compression wrapped around an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    Gzip,
    Xz,
    Zstd,
}

impl Compression {
    pub const fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gz",
            Compression::Xz => "xz",
            Compression::Zstd => "zstd",
        }
    }
}

/// What the first bytes of a stream are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detected {
    Compressed(Compression),
    Image(Format),
}

/// Detect a compression or image format from the first bytes. Anything unrecognised is raw,
/// as upstream treats it. `head` may be shorter than [`PROBE_LEN`] for short files.
pub fn probe(head: &[u8]) -> Detected {
    let at = |offset: usize, magic: &[u8]| magic_at(head, offset, magic);
    if at(0, &[0x1f, 0x8b]) {
        return Detected::Compressed(Compression::Gzip);
    }
    if at(0, &[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
        return Detected::Compressed(Compression::Xz);
    }
    if at(0, &[0x28, 0xb5, 0x2f, 0xfd]) {
        return Detected::Compressed(Compression::Zstd);
    }
    let format = if qcow2::detect(head) {
        Format::Qcow2
    } else if let Some(format) = qemu::detect(head) {
        format
    } else if iso::detect(head) {
        Format::Iso
    } else {
        Format::Raw
    };
    Detected::Image(format)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(offset: usize, magic: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; PROBE_LEN];
        v[offset..offset + magic.len()].copy_from_slice(magic);
        v
    }

    #[test]
    fn magics() {
        assert_eq!(probe(&with(0, b"QFI\xfb")), Detected::Image(Format::Qcow2));
        assert_eq!(
            probe(&with(0, &[0x1f, 0x8b, 8])),
            Detected::Compressed(Compression::Gzip)
        );
        assert_eq!(
            probe(&with(0, b"\xfd7zXZ\0")),
            Detected::Compressed(Compression::Xz)
        );
        assert_eq!(
            probe(&with(0, &[0x28, 0xb5, 0x2f, 0xfd])),
            Detected::Compressed(Compression::Zstd)
        );
        assert_eq!(probe(&with(0, b"KDMV")), Detected::Image(Format::Vmdk));
        assert_eq!(
            probe(&with(0x40, &[0x7f, 0x10, 0xda, 0xbe])),
            Detected::Image(Format::Vdi)
        );
        assert_eq!(probe(&with(0, b"vhdxfile")), Detected::Image(Format::Vhdx));
        assert_eq!(probe(&with(0, b"conectix")), Detected::Image(Format::Vhd));
        assert_eq!(probe(&with(0x8001, b"CD001")), Detected::Image(Format::Iso));
        assert_eq!(probe(&[0u8; 100]), Detected::Image(Format::Raw));
        assert_eq!(probe(b""), Detected::Image(Format::Raw));
        assert_eq!(
            probe(b"QFI"),
            Detected::Image(Format::Raw),
            "too short to be qcow2"
        );
    }
}
