//! Writing a qcow2 (version 3, 64 KiB clusters, 16-bit refcounts, no compression) from a raw
//! image: all-zero clusters are left unallocated. Used to make test and demo images without
//! qemu-img; the oracle tests check qemu-img reads them back byte for byte.

const CLUSTER_BITS: u32 = 16;
const CLUSTER: u64 = 1 << CLUSTER_BITS;
/// Entries per L2 table (8-byte entries in one cluster).
const L2_ENTRIES: u64 = CLUSTER / 8;
/// Clusters one refcount block counts (16-bit refcounts).
const REFCOUNTS_PER_BLOCK: u64 = CLUSTER / 2;
/// The "refcount is exactly one" flag of L1 and L2 entries.
const COPIED: u64 = 1 << 63;

fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// The qcow2 image of `raw`; the virtual size is rounded up to whole 512-byte sectors (read
/// as zeros), as qemu-img does.
pub fn from_raw(raw: &[u8]) -> Vec<u8> {
    let size = raw.len() as u64;
    let virtual_size = size.div_ceil(512) * 512;
    let guest_clusters = div_ceil(size, CLUSTER);
    let data: Vec<u64> = (0..guest_clusters)
        .filter(|&i| {
            let start = (i * CLUSTER) as usize;
            let end = ((i + 1) * CLUSTER).min(size) as usize;
            raw[start..end].iter().any(|&b| b != 0)
        })
        .collect();
    let l2_tables = div_ceil(guest_clusters, L2_ENTRIES).max(1);
    let l1_clusters = div_ceil(l2_tables * 8, CLUSTER).max(1);
    // Header, refcount table, refcount blocks, L1, L2s, data: the blocks must count themselves.
    let fixed = 2 + l1_clusters + l2_tables + data.len() as u64;
    let mut blocks = 1;
    while div_ceil(fixed + blocks, REFCOUNTS_PER_BLOCK) > blocks {
        blocks += 1;
    }
    let total = fixed + blocks;
    assert!(
        blocks * 8 <= CLUSTER,
        "image too large for one refcount table cluster"
    );
    let refcount_table = CLUSTER;
    let first_block = 2 * CLUSTER;
    let l1 = first_block + blocks * CLUSTER;
    let first_l2 = l1 + l1_clusters * CLUSTER;
    let first_data = first_l2 + l2_tables * CLUSTER;
    let mut out = vec![0u8; (total * CLUSTER) as usize];
    let put64 = |out: &mut [u8], at: u64, v: u64| {
        out[at as usize..at as usize + 8].copy_from_slice(&v.to_be_bytes())
    };
    let put32 = |out: &mut [u8], at: u64, v: u32| {
        out[at as usize..at as usize + 4].copy_from_slice(&v.to_be_bytes())
    };
    // Header (version 3, 104 bytes), then the end-of-extensions marker (zeros).
    out[0..4].copy_from_slice(b"QFI\xfb");
    put32(&mut out, 4, 3);
    put32(&mut out, 20, CLUSTER_BITS);
    put64(&mut out, 24, virtual_size);
    put32(&mut out, 36, (l2_tables) as u32);
    put64(&mut out, 40, l1);
    put64(&mut out, 48, refcount_table);
    put32(&mut out, 56, 1);
    put32(&mut out, 96, 4);
    put32(&mut out, 100, 104);
    // Refcount table → blocks; every cluster of the file counted once.
    for b in 0..blocks {
        put64(&mut out, refcount_table + b * 8, first_block + b * CLUSTER);
    }
    for c in 0..total {
        let at = first_block + (c / REFCOUNTS_PER_BLOCK) * CLUSTER + (c % REFCOUNTS_PER_BLOCK) * 2;
        out[at as usize..at as usize + 2].copy_from_slice(&1u16.to_be_bytes());
    }
    // L1 → every L2 table (allocated even when empty, for simplicity).
    for t in 0..l2_tables {
        put64(&mut out, l1 + t * 8, (first_l2 + t * CLUSTER) | COPIED);
    }
    for (n, &guest) in data.iter().enumerate() {
        let host = first_data + n as u64 * CLUSTER;
        let table = guest / L2_ENTRIES;
        put64(
            &mut out,
            first_l2 + table * CLUSTER + (guest % L2_ENTRIES) * 8,
            host | COPIED,
        );
        let start = (guest * CLUSTER) as usize;
        let end = ((guest + 1) * CLUSTER).min(size) as usize;
        out[host as usize..host as usize + (end - start)].copy_from_slice(&raw[start..end]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_clusters_are_not_stored() {
        let mut raw = vec![0u8; 5 * CLUSTER as usize + 100];
        raw[3] = 1;
        raw[4 * CLUSTER as usize] = 2;
        let q = from_raw(&raw);
        // Header, refcount table, one block, L1, one L2, two data clusters.
        assert_eq!(q.len() as u64, 7 * CLUSTER);
        assert_eq!(&q[..4], b"QFI\xfb");
        assert_eq!(
            u64::from_be_bytes(q[24..32].try_into().unwrap()),
            5 * CLUSTER + 512
        );
    }
}
