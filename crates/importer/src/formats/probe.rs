//! Format and compression detection by magic bytes; each format's magic is in its module.

use super::kind::magic_at;
use super::{iso, qcow2, qemu};

// The path crates/cli and the tests name them by.
pub use super::kind::{Compression, Detected, Format};

/// Bytes [`probe`] wants to see: enough for every magic, including ISO 9660's at 0x8001.
pub const PROBE_LEN: usize = 0x8006;

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
