//! The qcow2 header and the table entries it leads to, read from any bytes.
#![no_main]

use cdi_importer::formats::qcow2::{entries, header_read_len, l1_entry, l2_entry, parse_header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let _ = header_read_len(data, len);
    let Ok(header) = parse_header(data, len) else {
        return;
    };
    // The entries as the converter reads them: the tables are read from the same bytes.
    for raw in entries(data).take(64) {
        let _ = l1_entry(&header, raw, len);
        let _ = l2_entry(&header, raw, len);
    }
    let _ = (header.cluster_size(), header.l2_entries(), header.l2_span());
});
