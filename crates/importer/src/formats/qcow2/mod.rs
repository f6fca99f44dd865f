//! The qcow2 format (versions 2 and 3): header, extensions and table entries, decoded from
//! bytes with every field an untrusted image controls checked before it is used.
//!
//! An image must never make the importer read a host path or allocate without bound, so backing
//! files, external data files and encryption are refused, and every offset is checked against
//! the file's length.

pub mod convert;
pub mod stream;
pub mod write;

use std::fmt;

/// The smallest and largest cluster sizes qemu creates (512 B and 2 MiB).
pub const MIN_CLUSTER_BITS: u32 = 9;
pub const MAX_CLUSTER_BITS: u32 = 21;
/// qemu's limit on the L1 table (32 MiB of entries); larger tables are refused, not read.
pub const MAX_L1_BYTES: u64 = 32 << 20;
/// qemu's largest disk (`BDRV_MAX_LENGTH`: `INT64_MAX` rounded down to 1 GiB), which it checks
/// every image's size against. Guest offsets are not limited by the 56-bit host offsets of the
/// tables; in practice the L1 limit binds first (2 EiB with 2 MiB clusters).
pub const MAX_VIRTUAL_SIZE: u64 = i64::MAX as u64 & !((1 << 30) - 1);

const MAGIC: &[u8; 4] = b"QFI\xfb";
const V2_HEADER_LEN: usize = 72;
const V3_MIN_HEADER_LEN: usize = 104;

const INCOMPAT_DIRTY: u64 = 1 << 0;
const INCOMPAT_CORRUPT: u64 = 1 << 1;
const INCOMPAT_DATA_FILE: u64 = 1 << 2;
const INCOMPAT_COMPRESSION: u64 = 1 << 3;
const INCOMPAT_EXTL2: u64 = 1 << 4;
const INCOMPAT_KNOWN: u64 =
    INCOMPAT_DIRTY | INCOMPAT_CORRUPT | INCOMPAT_DATA_FILE | INCOMPAT_COMPRESSION | INCOMPAT_EXTL2;

const EXT_END: u32 = 0;
const EXT_EXTERNAL_DATA_FILE: u32 = 0x4441_5441;
const EXT_FULL_DISK_ENCRYPTION: u32 = 0x0537_be77;

/// Offset bits of L1 and standard L2 entries (bits 9–55).
const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
const L2_COMPRESSED: u64 = 1 << 62;
const L2_ZERO: u64 = 1;

/// Whether `head` is the start of a qcow2 image.
pub fn detect(head: &[u8]) -> bool {
    head.starts_with(MAGIC)
}

/// How compressed clusters are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterCompression {
    /// Raw deflate (no zlib header).
    Deflate,
    Zstd,
}

/// A checked qcow2 header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub cluster_bits: u32,
    pub virtual_size: u64,
    pub l1_size: u32,
    pub l1_table_offset: u64,
    pub compression: ClusterCompression,
    /// The image was not closed cleanly; refcounts may be stale but the tables are usable.
    pub dirty: bool,
}

impl Header {
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// Entries in one L2 table.
    pub fn l2_entries(&self) -> u64 {
        self.cluster_size() / 8
    }

    /// Guest bytes one L2 table maps.
    pub fn l2_span(&self) -> u64 {
        self.cluster_size() * self.l2_entries()
    }
}

/// Why an image is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Qcow2Error {
    #[error("not a qcow2 image (bad magic)")]
    Magic,
    #[error("the qcow2 header is truncated: {0} bytes")]
    Truncated(usize),
    #[error("qcow2 version {0} is not supported (only 2 and 3)")]
    Version(u32),
    #[error(
        "the image has a backing file {0:?}: importing it would read a path outside the image; flatten it first with `qemu-img convert -O qcow2`"
    )]
    BackingFile(String),
    #[error(
        "the image keeps its data in an external data file: importing it would read a path outside the image; convert it to a self-contained image first"
    )]
    ExternalDataFile,
    #[error("the image is encrypted; decrypt it first (qemu-img convert with the key)")]
    Encrypted,
    #[error("the image is marked corrupt; repair it with `qemu-img check -r all` first")]
    Corrupt,
    #[error(
        "the image uses extended L2 entries (subclusters), which cdi-rs does not import; convert it with `qemu-img convert -O qcow2` first"
    )]
    ExtendedL2,
    #[error("the image uses unknown incompatible features {0:#x}")]
    UnknownFeatures(u64),
    #[error("invalid cluster size 2^{0} (qcow2 allows 2^9 to 2^21 bytes)")]
    ClusterBits(u32),
    #[error("unknown cluster compression type {0}")]
    CompressionType(u8),
    /// A header field out of range, said in full (ImportError already says "invalid qcow2
    /// image").
    #[error("{0}")]
    Invalid(String),
    #[error("the {what} at offset {offset} lies {}", past_the_end(*.file_len))]
    OutOfFile {
        what: &'static str,
        offset: u64,
        file_len: u64,
    },
    /// A table or cluster placed in the first cluster, where the header is.
    #[error("the {what} at offset {offset} overlaps the header (the image's first cluster)")]
    InHeader { what: &'static str, offset: u64 },
    #[error("the {what} at offset {offset} is not aligned to the {cluster_size}-byte cluster size")]
    Misaligned {
        what: &'static str,
        offset: u64,
        cluster_size: u64,
    },
    #[error(
        "the L1 table has {l1_size} entries but the virtual size {virtual_size} needs {needed}"
    )]
    L1TooSmall {
        l1_size: u64,
        needed: u64,
        virtual_size: u64,
    },
    #[error("virtual size {0} is larger than qemu allows ({MAX_VIRTUAL_SIZE} bytes)")]
    VirtualSize(u64),
}

/// The length of a stream whose end is not known yet: nothing read from it is past its end.
pub(crate) const OPEN_END: u64 = 1 << 56;

/// Where an out-of-file offset lies: past a known length, or past the end of a stream.
fn past_the_end(file_len: u64) -> String {
    if file_len >= OPEN_END {
        "past the end of the image".into()
    } else {
        format!("outside the {file_len}-byte image")
    }
}

/// Check that `what`, from `offset` to `end`, lies after the header and inside the file.
fn placed(
    what: &'static str,
    offset: u64,
    end: u64,
    cluster_size: u64,
    file_len: u64,
) -> Result<(), Qcow2Error> {
    if offset < cluster_size {
        return Err(Qcow2Error::InHeader { what, offset });
    }
    if end > file_len {
        return Err(Qcow2Error::OutOfFile {
            what,
            offset,
            file_len,
        });
    }
    Ok(())
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// How many bytes from the start of the image [`parse_header`] needs: the first cluster (the
/// header and its extensions live there), or the whole image if it is shorter.
pub fn header_read_len(head: &[u8], file_len: u64) -> Result<u64, Qcow2Error> {
    if head.len() < V2_HEADER_LEN {
        return Err(Qcow2Error::Truncated(head.len()));
    }
    if &head[..4] != MAGIC {
        return Err(Qcow2Error::Magic);
    }
    let bits = be32(head, 20);
    if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&bits) {
        return Err(Qcow2Error::ClusterBits(bits));
    }
    Ok((1u64 << bits).min(file_len))
}

/// Parse and check the header from `head` (the image's first [`header_read_len`] bytes).
pub fn parse_header(head: &[u8], file_len: u64) -> Result<Header, Qcow2Error> {
    let want = header_read_len(head, file_len)?;
    if (head.len() as u64) < want {
        return Err(Qcow2Error::Truncated(head.len()));
    }
    let version = be32(head, 4);
    if version != 2 && version != 3 {
        return Err(Qcow2Error::Version(version));
    }
    let backing_offset = be64(head, 8);
    let backing_len = be32(head, 16) as u64;
    let cluster_bits = be32(head, 20);
    let virtual_size = be64(head, 24);
    let crypt_method = be32(head, 32);
    let l1_size = be32(head, 36);
    let l1_table_offset = be64(head, 40);
    let cluster_size = 1u64 << cluster_bits;

    if backing_offset != 0 {
        return Err(Qcow2Error::BackingFile(backing_file_name(
            head,
            backing_offset,
            backing_len,
        )));
    }
    if crypt_method != 0 {
        return Err(Qcow2Error::Encrypted);
    }

    let (extensions_start, compression, dirty) = if version == 3 {
        parse_v3_fields(head, cluster_size)?
    } else {
        (V2_HEADER_LEN, ClusterCompression::Deflate, false)
    };
    check_extensions(head, extensions_start)?;

    if virtual_size > MAX_VIRTUAL_SIZE {
        return Err(Qcow2Error::VirtualSize(virtual_size));
    }
    let header = Header {
        version,
        cluster_bits,
        virtual_size,
        l1_size,
        l1_table_offset,
        compression,
        dirty,
    };
    check_l1_table(&header, file_len)?;
    Ok(header)
}

/// The backing file's name as the header gives it, for the user; the bytes are untrusted, so
/// only printable ASCII is shown.
fn backing_file_name(head: &[u8], offset: u64, len: u64) -> String {
    head.get(offset as usize..(offset.saturating_add(len.min(1023))) as usize)
        .map(|b| {
            b.iter()
                .map(|&c| {
                    if c.is_ascii_graphic() || c == b' ' {
                        c as char
                    } else {
                        '?'
                    }
                })
                .collect()
        })
        .unwrap_or_else(|| "(outside the header)".to_string())
}

/// The fields a version 3 header adds, checked: where the header extensions start (the header's
/// length), how clusters are compressed, and whether the image was left dirty. Features this
/// converter cannot honour are refused.
fn parse_v3_fields(
    head: &[u8],
    cluster_size: u64,
) -> Result<(usize, ClusterCompression, bool), Qcow2Error> {
    if head.len() < V3_MIN_HEADER_LEN {
        return Err(Qcow2Error::Truncated(head.len()));
    }
    let incompatible = be64(head, 72);
    let header_len = be32(head, 100) as usize;
    if incompatible & !INCOMPAT_KNOWN != 0 {
        return Err(Qcow2Error::UnknownFeatures(incompatible & !INCOMPAT_KNOWN));
    }
    if incompatible & INCOMPAT_CORRUPT != 0 {
        return Err(Qcow2Error::Corrupt);
    }
    if incompatible & INCOMPAT_DATA_FILE != 0 {
        return Err(Qcow2Error::ExternalDataFile);
    }
    if incompatible & INCOMPAT_EXTL2 != 0 {
        return Err(Qcow2Error::ExtendedL2);
    }
    let dirty = incompatible & INCOMPAT_DIRTY != 0;
    if header_len < V3_MIN_HEADER_LEN || header_len as u64 > cluster_size || header_len > head.len()
    {
        return Err(Qcow2Error::Invalid(format!(
            "the header length {header_len} is out of range"
        )));
    }
    let compression_type = if header_len > V3_MIN_HEADER_LEN {
        head[104]
    } else {
        0
    };
    let compression = match compression_type {
        0 => ClusterCompression::Deflate,
        1 => ClusterCompression::Zstd,
        other => return Err(Qcow2Error::CompressionType(other)),
    };
    if compression_type != 0 && incompatible & INCOMPAT_COMPRESSION == 0 {
        return Err(Qcow2Error::Invalid(
            "the header sets a compression type without its feature bit".into(),
        ));
    }
    Ok((header_len, compression, dirty))
}

/// Refuse an L1 table too small to map the virtual size, larger than qemu allows, or not
/// cluster-aligned within the file.
fn check_l1_table(header: &Header, file_len: u64) -> Result<(), Qcow2Error> {
    let Header {
        virtual_size,
        l1_size,
        l1_table_offset,
        ..
    } = *header;
    let cluster_size = header.cluster_size();
    let needed = virtual_size.div_ceil(header.l2_span());
    if (l1_size as u64) < needed {
        return Err(Qcow2Error::L1TooSmall {
            l1_size: l1_size as u64,
            needed,
            virtual_size,
        });
    }
    let l1_bytes = l1_size as u64 * 8;
    if l1_bytes > MAX_L1_BYTES {
        return Err(Qcow2Error::Invalid(format!(
            "the L1 table of {l1_bytes} bytes is larger than qemu allows"
        )));
    }
    if l1_size > 0 {
        if !l1_table_offset.is_multiple_of(cluster_size) {
            return Err(Qcow2Error::Misaligned {
                what: "L1 table",
                offset: l1_table_offset,
                cluster_size,
            });
        }
        placed(
            "L1 table",
            l1_table_offset,
            l1_table_offset.saturating_add(l1_bytes),
            cluster_size,
            file_len,
        )?;
    }
    Ok(())
}

fn check_extensions(head: &[u8], start: usize) -> Result<(), Qcow2Error> {
    let mut at = start;
    loop {
        if at + 8 > head.len() {
            // No end marker within the first cluster: only acceptable if nothing is there.
            return Ok(());
        }
        let kind = be32(head, at);
        let len = be32(head, at + 4) as usize;
        match kind {
            EXT_END => return Ok(()),
            EXT_EXTERNAL_DATA_FILE => return Err(Qcow2Error::ExternalDataFile),
            EXT_FULL_DISK_ENCRYPTION => return Err(Qcow2Error::Encrypted),
            _ => {}
        }
        let next = at + 8 + len.div_ceil(8) * 8;
        if next > head.len() {
            return Err(Qcow2Error::Invalid(format!(
                "the header extension {kind:#x} runs past the first cluster"
            )));
        }
        at = next;
    }
}

/// One L2 entry, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cluster {
    /// Not allocated: reads as zeros (there is no backing file).
    Unallocated,
    /// Allocated or not, marked as reading zeros.
    Zero,
    /// Stored uncompressed at this host offset.
    Data { host: u64 },
    /// Compressed, `len` bytes at `host` (clamped to the end of the file).
    Compressed { host: u64, len: u64 },
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cluster::Unallocated => f.write_str("unallocated"),
            Cluster::Zero => f.write_str("zero"),
            Cluster::Data { host } => write!(f, "data@{host}"),
            Cluster::Compressed { host, len } => write!(f, "compressed@{host}+{len}"),
        }
    }
}

/// Decode an L1 entry: the L2 table's offset, or `None` when unallocated.
pub fn l1_entry(header: &Header, entry: u64, file_len: u64) -> Result<Option<u64>, Qcow2Error> {
    let offset = entry & OFFSET_MASK;
    if offset == 0 {
        return Ok(None);
    }
    let cluster_size = header.cluster_size();
    if !offset.is_multiple_of(cluster_size) {
        return Err(Qcow2Error::Misaligned {
            what: "L2 table",
            offset,
            cluster_size,
        });
    }
    placed(
        "L2 table",
        offset,
        offset.saturating_add(cluster_size),
        cluster_size,
        file_len,
    )?;
    Ok(Some(offset))
}

/// Decode a standard (64-bit) L2 entry.
pub fn l2_entry(header: &Header, entry: u64, file_len: u64) -> Result<Cluster, Qcow2Error> {
    let cluster_size = header.cluster_size();
    if entry & L2_COMPRESSED != 0 {
        let x = 62 - (header.cluster_bits - 8);
        let host = entry & ((1u64 << x) - 1);
        let sectors = (entry >> x) & ((1u64 << (header.cluster_bits - 8)) - 1);
        let len = (sectors + 1) * 512 - (host & 511);
        placed("compressed cluster", host, host + 1, cluster_size, file_len)?;
        // The last sector may run past the end of the file; qemu reads what is there.
        return Ok(Cluster::Compressed {
            host,
            len: len.min(file_len - host),
        });
    }
    if header.version >= 3 && entry & L2_ZERO != 0 {
        return Ok(Cluster::Zero);
    }
    let host = entry & OFFSET_MASK;
    if host == 0 {
        return Ok(Cluster::Unallocated);
    }
    if !host.is_multiple_of(cluster_size) {
        return Err(Qcow2Error::Misaligned {
            what: "data cluster",
            offset: host,
            cluster_size,
        });
    }
    placed("data cluster", host, host + 1, cluster_size, file_len)?;
    Ok(Cluster::Data { host })
}

/// Decode a big-endian table of 64-bit entries.
pub fn entries(table: &[u8]) -> impl Iterator<Item = u64> + '_ {
    table
        .chunks_exact(8)
        .map(|c| u64::from_be_bytes(c.try_into().expect("8 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A minimal valid v3 header for a 1 MiB image with 64 KiB clusters, L1 in cluster 3.
    pub(crate) fn v3_header() -> Vec<u8> {
        let mut h = vec![0u8; 65536];
        h[..4].copy_from_slice(MAGIC);
        h[4..8].copy_from_slice(&3u32.to_be_bytes());
        h[20..24].copy_from_slice(&16u32.to_be_bytes());
        h[24..32].copy_from_slice(&(1u64 << 20).to_be_bytes());
        h[36..40].copy_from_slice(&1u32.to_be_bytes());
        h[40..48].copy_from_slice(&(3u64 << 16).to_be_bytes());
        h[96..100].copy_from_slice(&4u32.to_be_bytes());
        h[100..104].copy_from_slice(&112u32.to_be_bytes());
        h
    }

    const FILE_LEN: u64 = 4 << 16;

    #[test]
    fn a_valid_header() {
        let h = parse_header(&v3_header(), FILE_LEN).unwrap();
        assert_eq!(
            (h.version, h.cluster_size(), h.virtual_size),
            (3, 65536, 1 << 20)
        );
        assert_eq!(h.compression, ClusterCompression::Deflate);
    }

    #[test]
    fn hostile_headers_are_refused() {
        type Mutation = Box<dyn Fn(&mut Vec<u8>)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|h| h[0] = b'X'), "bad magic"),
            (
                Box::new(|h| h[4..8].copy_from_slice(&4u32.to_be_bytes())),
                "version 4",
            ),
            (
                Box::new(|h| {
                    h[8..16].copy_from_slice(&512u64.to_be_bytes());
                    h[16..20].copy_from_slice(&10u32.to_be_bytes());
                    h[512..522].copy_from_slice(b"/etc/shado");
                }),
                "backing file \"/etc/shado\"",
            ),
            (
                Box::new(|h| h[32..36].copy_from_slice(&2u32.to_be_bytes())),
                "encrypted",
            ),
            (
                Box::new(|h| h[72..80].copy_from_slice(&INCOMPAT_DATA_FILE.to_be_bytes())),
                "external data file",
            ),
            (
                Box::new(|h| h[72..80].copy_from_slice(&INCOMPAT_CORRUPT.to_be_bytes())),
                "marked corrupt",
            ),
            (
                Box::new(|h| h[72..80].copy_from_slice(&INCOMPAT_EXTL2.to_be_bytes())),
                "extended L2",
            ),
            (
                Box::new(|h| h[72..80].copy_from_slice(&(1u64 << 40).to_be_bytes())),
                "unknown incompatible",
            ),
            (
                Box::new(|h| h[20..24].copy_from_slice(&30u32.to_be_bytes())),
                "cluster size 2^30",
            ),
            (
                Box::new(|h| h[20..24].copy_from_slice(&8u32.to_be_bytes())),
                "cluster size 2^8",
            ),
            (Box::new(|h| h[104] = 7), "compression type 7"),
            (Box::new(|h| h[104] = 1), "without its feature bit"),
            (
                Box::new(|h| h[36..40].copy_from_slice(&0u32.to_be_bytes())),
                "needs 1",
            ),
            (
                Box::new(|h| h[40..48].copy_from_slice(&(3u64 << 16 | 8).to_be_bytes())),
                "not aligned",
            ),
            (
                Box::new(|h| h[40..48].copy_from_slice(&(9u64 << 16).to_be_bytes())),
                "outside the",
            ),
            (
                Box::new(|h| h[40..48].copy_from_slice(&0u64.to_be_bytes())),
                "L1 table at offset 0 overlaps the header",
            ),
            (
                Box::new(|h| h[24..32].copy_from_slice(&u64::MAX.to_be_bytes())),
                "virtual size 18446744073709551615 is larger than qemu allows",
            ),
            (
                Box::new(|h| {
                    h[112..116].copy_from_slice(&EXT_EXTERNAL_DATA_FILE.to_be_bytes());
                    h[116..120].copy_from_slice(&8u32.to_be_bytes());
                }),
                "external data file",
            ),
            (
                Box::new(|h| {
                    h[112..116].copy_from_slice(&0x1234u32.to_be_bytes());
                    h[116..120].copy_from_slice(&u32::MAX.to_be_bytes());
                }),
                "runs past the first cluster",
            ),
            (
                Box::new(|h| h[100..104].copy_from_slice(&1u32.to_be_bytes())),
                "header length 1",
            ),
        ];
        for (mutate, want) in cases {
            let mut h = v3_header();
            mutate(&mut h);
            let err = parse_header(&h, FILE_LEN).expect_err(want).to_string();
            assert!(err.contains(want), "want {want:?}, got {err:?}");
        }
    }

    #[test]
    fn a_stream_of_unknown_length_is_not_given_one_in_messages() {
        let mut h = v3_header();
        h[40..48].copy_from_slice(&0u64.to_be_bytes());
        let err = parse_header(&h, OPEN_END).unwrap_err().to_string();
        assert_eq!(
            err,
            "the L1 table at offset 0 overlaps the header (the image's first cluster)"
        );
        let far = Qcow2Error::OutOfFile {
            what: "L2 table",
            offset: 1 << 40,
            file_len: OPEN_END,
        };
        assert_eq!(
            far.to_string(),
            "the L2 table at offset 1099511627776 lies past the end of the image"
        );
    }

    #[test]
    fn table_entries() {
        let h = parse_header(&v3_header(), FILE_LEN).unwrap();
        assert_eq!(l1_entry(&h, 0, FILE_LEN).unwrap(), None);
        assert_eq!(
            l1_entry(&h, (2 << 16) | (1 << 63), FILE_LEN).unwrap(),
            Some(2 << 16)
        );
        assert!(l1_entry(&h, 2 << 16 | 512, FILE_LEN).is_err());
        assert!(l1_entry(&h, 8 << 16, FILE_LEN).is_err());
        assert_eq!(l2_entry(&h, 0, FILE_LEN).unwrap(), Cluster::Unallocated);
        assert_eq!(l2_entry(&h, 1, FILE_LEN).unwrap(), Cluster::Zero);
        assert_eq!(
            l2_entry(&h, (2 << 16) | 1, FILE_LEN).unwrap(),
            Cluster::Zero
        );
        assert_eq!(
            l2_entry(&h, (2 << 16) | (1 << 63), FILE_LEN).unwrap(),
            Cluster::Data { host: 2 << 16 }
        );
        assert!(l2_entry(&h, 0x100 << 16, FILE_LEN).is_err(), "past the end");
        assert!(l2_entry(&h, 512, FILE_LEN).is_err(), "misaligned");
        // Compressed: x = 62 - 8 = 54 bits of offset, then 8 bits of extra sectors.
        let host = (2u64 << 16) + 100;
        let entry = L2_COMPRESSED | (3u64 << 54) | host;
        assert_eq!(
            l2_entry(&h, entry, FILE_LEN).unwrap(),
            Cluster::Compressed {
                host,
                len: 4 * 512 - 100
            }
        );
    }

    /// A v3 header with `cluster_bits` clusters, `virtual_size` bytes and `l1_size` entries in
    /// an L1 table at cluster 1, and the length of a file holding that table.
    fn sized_header(cluster_bits: u32, virtual_size: u64, l1_size: u32) -> (Vec<u8>, u64) {
        let cluster = 1u64 << cluster_bits;
        let mut h = v3_header();
        h.resize(cluster as usize, 0);
        h[20..24].copy_from_slice(&cluster_bits.to_be_bytes());
        h[24..32].copy_from_slice(&virtual_size.to_be_bytes());
        h[36..40].copy_from_slice(&l1_size.to_be_bytes());
        h[40..48].copy_from_slice(&cluster.to_be_bytes());
        (h, cluster + (l1_size as u64 * 8).next_multiple_of(cluster))
    }

    #[test]
    fn virtual_sizes_up_to_qemus_limit_are_accepted() {
        const PIB: u64 = 1 << 50;
        // 100 PiB with 2 MiB clusters, as `qemu-img create -o cluster_size=2M x 100P` makes it.
        let l2_span = 1u64 << 39;
        let needed = (100 * PIB).div_ceil(l2_span) as u32;
        let (h, len) = sized_header(21, 100 * PIB, needed);
        assert_eq!(parse_header(&h, len).unwrap().virtual_size, 100 * PIB);
        // The largest image qemu creates: an L1 table of 32 MiB with 2 MiB clusters.
        let (h, len) = sized_header(21, 1 << 61, 1 << 22);
        assert_eq!(parse_header(&h, len).unwrap().virtual_size, 1 << 61);
        // One byte more needs an L1 table qemu refuses.
        let (h, len) = sized_header(21, (1 << 61) + 1, (1 << 22) + 1);
        let err = parse_header(&h, len).unwrap_err().to_string();
        assert!(err.contains("L1 table of"), "{err}");
        // Past qemu's largest disk, whatever the tables say.
        let (h, len) = sized_header(21, MAX_VIRTUAL_SIZE + 1, u32::MAX);
        assert_eq!(
            parse_header(&h, len),
            Err(Qcow2Error::VirtualSize(MAX_VIRTUAL_SIZE + 1))
        );
    }

    proptest! {
        #[test]
        fn huge_virtual_sizes_parse_without_overflow(
            virtual_size in prop_oneof![any::<u64>(), (1u64 << 55)..(1u64 << 62)],
            bits in MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS,
            slack in 0u64..3,
        ) {
            let span = 1u64 << (2 * bits - 3);
            let l1_size = (virtual_size.div_ceil(span) + slack).min(u32::MAX as u64) as u32;
            let (h, len) = sized_header(bits, virtual_size, l1_size);
            if let Ok(header) = parse_header(&h, len) {
                // What the conversion computes from an accepted header stays in range: the guest
                // offset of every L2 table, and the end of the last cluster.
                prop_assert!(header.virtual_size <= MAX_VIRTUAL_SIZE);
                prop_assert!(header.l1_size as u64 * 8 <= MAX_L1_BYTES);
                let mapped = (header.l1_size as u64).checked_mul(header.l2_span());
                prop_assert!(mapped.is_some_and(|m| m >= header.virtual_size));
                prop_assert!(header.virtual_size.checked_add(header.cluster_size()).is_some());
            }
        }

        #[test]
        fn any_header_bytes_are_checked_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..300), len in 0u64..(1 << 30)) {
            let mut h = v3_header();
            let n = bytes.len();
            h[..n].copy_from_slice(&bytes);
            if let Ok(header) = parse_header(&h, len) {
                for e in [0u64, u64::MAX, 1 << 62, 0x00ff_ffff_ffff_fe00] {
                    let _ = l1_entry(&header, e, len);
                    let _ = l2_entry(&header, e, len);
                }
            }
        }

        #[test]
        fn decoded_clusters_stay_inside_the_file(entry in any::<u64>(), bits in MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS, file_len in (1u64 << 21)..(1u64 << 40)) {
            let header = Header { version: 3, cluster_bits: bits, virtual_size: 1 << 30, l1_size: 1, l1_table_offset: 0, compression: ClusterCompression::Deflate, dirty: false };
            match l2_entry(&header, entry, file_len) {
                Ok(Cluster::Data { host }) => prop_assert!(host < file_len && host % header.cluster_size() == 0),
                Ok(Cluster::Compressed { host, len }) => prop_assert!(host + len <= file_len && len <= header.cluster_size() * 2 + 512),
                _ => {}
            }
        }
    }
}
