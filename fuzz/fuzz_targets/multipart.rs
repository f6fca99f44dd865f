//! A multipart form as the upload server receives it from a client: its Content-Type (the first
//! line of the input) and body (the rest), read in small pieces. Never a panic, and the `file`
//! part yields no more bytes than the body holds.
#![no_main]

use bytes::Bytes;
use futures::StreamExt;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|b| *b == b'\n').unwrap_or(data.len());
    let content_type = String::from_utf8_lossy(&data[..split]).into_owned();
    let body = data.get(split + 1..).unwrap_or_default().to_vec();
    let total = body.len();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        // Pieces of 7 bytes: boundaries fall across chunks.
        let chunks: Vec<Result<Bytes, std::io::Error>> = body
            .chunks(7)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let Ok(mut file) =
            cdi_upload::server::form_file(&content_type, futures::stream::iter(chunks)).await
        else {
            return;
        };
        let mut got = 0usize;
        while let Some(chunk) = file.next().await {
            match chunk {
                Ok(c) => got += c.len(),
                Err(_) => break,
            }
        }
        assert!(got <= total, "{got} bytes out of a {total}-byte body");
    });
});
