//! ISO 9660 images: recognised by the first volume descriptor, and copied as raw ([`super::raw`]):
//! the disk a VM reads is the image's bytes as they are.

use super::kind::magic_at;

/// The volume descriptor's identifier, after the 32 KiB system area and the descriptor's type
/// byte: the furthest magic [`super::probe::PROBE_LEN`] must reach.
const MAGIC_OFFSET: usize = 0x8001;
const MAGIC: &[u8] = b"CD001";

/// Whether `head` is the start of an ISO 9660 image.
pub fn detect(head: &[u8]) -> bool {
    magic_at(head, MAGIC_OFFSET, MAGIC)
}
