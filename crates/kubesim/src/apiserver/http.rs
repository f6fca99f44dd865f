//! What every part of the API server that reads requests shares: the body limit and the
//! percent-decoding of paths and queries.

/// Request bodies over this are refused (kube-apiserver's MaxRequestBodyBytes, 3 MiB).
pub const MAX_BODY: usize = 3 << 20;

/// Percent-decoding of a path segment (no `+` for spaces there).
pub(crate) fn decode_segment(s: &str) -> String {
    decode(&s.replace('+', "%2B"))
}

/// Percent-decoding of query components (`+` is a space).
pub(crate) fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
