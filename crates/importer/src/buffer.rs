//! Transfer buffers in anonymous mappings, recycled through a small pool.
//!
//! The pipeline allocates multi-megabyte buffers on one thread and frees them on another; glibc
//! kept such memory resident in per-thread arenas (peak RSS grew with the thread count, past
//! the 64 MiB budget), and fresh mappings for every buffer cost a page fault per page and a TLB
//! shootdown per unmap. Mappings recycled through a bounded pool avoid both.

use std::sync::Mutex;

use bytes::Bytes;
use memmap2::MmapMut;

/// Below this, the allocator does fine.
const MAP_THRESHOLD: usize = 256 * 1024;
/// The most memory the pool keeps for reuse.
const MAX_POOLED: usize = 16 << 20;

static POOL: Mutex<Vec<MmapMut>> = Mutex::new(Vec::new());

fn take(len: usize) -> std::io::Result<MmapMut> {
    let capacity = len.next_power_of_two();
    let mut pool = POOL.lock().expect("buffer pool lock");
    if let Some(i) = pool.iter().position(|m| m.len() == capacity) {
        return Ok(pool.swap_remove(i));
    }
    drop(pool);
    MmapMut::map_anon(capacity)
}

fn give_back(map: MmapMut) {
    let mut pool = POOL.lock().expect("buffer pool lock");
    let pooled: usize = pool.iter().map(|m| m.len()).sum();
    if pooled + map.len() <= MAX_POOLED {
        pool.push(map);
    }
}

/// A writable buffer; [`Buffer::freeze`] turns it into cheap `Bytes` slices.
///
/// A recycled buffer holds old data: callers fill every byte they keep (reads that come up
/// short truncate).
pub enum Buffer {
    Heap(Vec<u8>),
    Mapped { map: Option<MmapMut>, len: usize },
}

struct Frozen {
    map: Option<MmapMut>,
    len: usize,
}

impl AsRef<[u8]> for Frozen {
    fn as_ref(&self) -> &[u8] {
        &self.map.as_ref().expect("present until dropped")[..self.len]
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Some(map) = self.map.take() {
            give_back(map);
        }
    }
}

impl Buffer {
    /// A buffer of `len` bytes, to be filled by the caller.
    pub fn with_len(len: usize) -> std::io::Result<Buffer> {
        if len < MAP_THRESHOLD {
            return Ok(Buffer::Heap(vec![0u8; len]));
        }
        Ok(Buffer::Mapped {
            map: Some(take(len)?),
            len,
        })
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Buffer::Heap(v) => v,
            Buffer::Mapped { map, len } => &mut map.as_mut().expect("present until frozen")[..*len],
        }
    }

    /// Keep only the first `len` bytes.
    pub fn truncate(&mut self, new_len: usize) {
        match self {
            Buffer::Heap(v) => v.truncate(new_len),
            Buffer::Mapped { len, .. } => *len = (*len).min(new_len),
        }
    }

    pub fn freeze(mut self) -> Bytes {
        match &mut self {
            Buffer::Heap(v) => Bytes::from(std::mem::take(v)),
            Buffer::Mapped { map, len } => Bytes::from_owner(Frozen {
                map: map.take(),
                len: *len,
            }),
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Buffer::Mapped { map, .. } = self
            && let Some(map) = map.take()
        {
            give_back(map);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_fill_truncate_and_slice() {
        for size in [1000, 1 << 20] {
            let mut b = Buffer::with_len(size).unwrap();
            b.bytes_mut().fill(0);
            b.bytes_mut()[10] = 7;
            b.truncate(100);
            let bytes = b.freeze();
            assert_eq!(bytes.len(), 100);
            assert_eq!(bytes[10], 7);
            let slice = bytes.slice(10..20);
            drop(bytes);
            assert_eq!(slice[0], 7, "slices keep the buffer alive");
        }
    }

    #[test]
    fn mappings_are_recycled_within_the_bound() {
        let first = Buffer::with_len(3 << 20).unwrap().freeze();
        drop(first);
        let pooled: usize = POOL.lock().unwrap().iter().map(|m| m.len()).sum();
        assert!(pooled <= MAX_POOLED);
        let again = Buffer::with_len(3 << 20).unwrap();
        drop(again);
    }
}
