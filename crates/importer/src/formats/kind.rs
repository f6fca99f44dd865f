//! The names detection gives: image formats, stream compressions, and what the head of a
//! stream is; with the magic-byte test each format's module recognises itself by. Kept apart
//! from [`super::probe`], which asks each format in turn, so that the format modules and the
//! probe both depend on this file and not on each other.

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
