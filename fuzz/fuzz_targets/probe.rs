//! Format and compression probing of an image's first bytes (qcow2, vmdk, vhd, vhdx, vdi, iso,
//! gzip, xz, zstd, tar).
#![no_main]

use cdi_importer::formats::probe::probe;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = probe(data);
});
