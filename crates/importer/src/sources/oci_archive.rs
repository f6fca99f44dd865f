//! An `oci-archive` (a tar of an OCI image layout: `oci-layout`, `index.json`, `blobs/<alg>/<hex>`)
//! served over HTTP(S), read in place by range requests: the tar's headers are walked first (one
//! small request per entry), then `index.json`, the manifest and the config are read whole and
//! each layer is streamed from where it lies in the tar. Nothing is downloaded twice and nothing
//! goes to scratch.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::error::ImportError;
use crate::sources::http::{HttpClient, HttpReader, HttpSource};
use crate::sources::source::RangeReader;

/// The largest `index.json`, manifest or config read whole.
const SMALL: u64 = 4 << 20;
/// The range a layer is read by.
const PIECE: usize = 8 << 20;
const BLOCK: u64 = 512;

pub struct Archive {
    /// The archive's URL, for messages.
    url: String,
    reader: HttpReader,
    /// Path in the tar → (offset of its data, length).
    entries: HashMap<String, (u64, u64)>,
}

impl std::fmt::Debug for Archive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archive")
            .field("url", &self.url)
            .field("entries", &self.entries.len())
            .finish_non_exhaustive()
    }
}

fn octal(field: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(field).ok()?;
    let text = text.trim_matches(|c: char| c == '\0' || c == ' ');
    if text.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(text, 8).ok()
}

/// A tar path without `./` in front.
fn clean(path: &str) -> String {
    path.trim_start_matches("./")
        .trim_start_matches('/')
        .to_string()
}

impl Archive {
    /// Reach the archive and list its entries.
    pub async fn open(source: HttpSource) -> Result<Archive, ImportError> {
        let url = crate::sources::http::redact(&source.url);
        let client = HttpClient::new(source)?;
        let info = client.info().await?;
        let damaged =
            |why: String| ImportError::Damaged(format!("{url}: not an oci-archive: {why}"));
        let len = match (info.ranges, info.len) {
            (true, Some(len)) => len,
            _ => {
                return Err(ImportError::Unsupported(format!(
                    "{url}: the server does not answer range requests, which reading an \
                     oci-archive in place needs; serve it from one that does (nginx, any object \
                     store) or push it to a registry (skopeo copy oci-archive:FILE docker://…)"
                )));
            }
        };
        let reader = HttpReader::new(client, len);
        let mut entries = HashMap::new();
        let mut at = 0u64;
        // A long name (GNU `L`) or a PAX `path` applies to the entry after it.
        let mut next_name: Option<String> = None;
        while at + BLOCK <= len {
            let header = reader.read_at(at, BLOCK as usize).await?;
            if header.iter().all(|b| *b == 0) {
                break;
            }
            let size = octal(&header[124..136])
                .ok_or_else(|| damaged(format!("a tar header at byte {at} is not valid")))?;
            let data = at + BLOCK;
            if data + size > len {
                return Err(damaged(format!(
                    "an entry at byte {at} runs past the end of the archive"
                )));
            }
            let kind = header[156];
            let mut name = || -> String {
                next_name.take().unwrap_or_else(|| {
                    let field = |r: std::ops::Range<usize>| {
                        let raw = &header[r];
                        let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
                        String::from_utf8_lossy(&raw[..end]).into_owned()
                    };
                    let (prefix, base) = (field(345..500), field(0..100));
                    if &header[257..262] == b"ustar" && !prefix.is_empty() {
                        format!("{prefix}/{base}")
                    } else {
                        base
                    }
                })
            };
            match kind {
                b'L' | b'x' if size <= SMALL => {
                    let body = reader.read_at(data, size as usize).await?;
                    if kind == b'L' {
                        let end = body.iter().position(|b| *b == 0).unwrap_or(body.len());
                        next_name = Some(String::from_utf8_lossy(&body[..end]).into_owned());
                    } else {
                        next_name = pax_path(&body);
                    }
                }
                b'0' | 0 | b'7' => {
                    entries.insert(clean(&name()), (data, size));
                }
                _ => {
                    name();
                }
            }
            at = data + size.div_ceil(BLOCK) * BLOCK;
        }
        if !entries.contains_key("index.json") {
            return Err(damaged(
                "it has no index.json (an OCI image layout's tar is made by skopeo copy … oci-archive:FILE)"
                    .into(),
            ));
        }
        Ok(Archive {
            url,
            reader,
            entries,
        })
    }

    /// Where a blob is in the layout (`blobs/<alg>/<hex>`); `None` for what is no digest.
    pub fn blob_path(digest: &str) -> Option<String> {
        let (alg, hex) = digest.split_once(':')?;
        let plain = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric());
        (plain(alg) && plain(hex)).then(|| format!("blobs/{alg}/{hex}"))
    }

    /// Where a blob's bytes are.
    pub fn blob(&self, digest: &str) -> Result<(u64, u64), ImportError> {
        Self::blob_path(digest)
            .and_then(|p| self.entries.get(&p).copied())
            .ok_or_else(|| {
                ImportError::Damaged(format!(
                    "{}: the archive has no blob {digest}, which its image names",
                    self.url
                ))
            })
    }

    /// A small file of the archive, whole.
    pub async fn read(&self, path: &str) -> Result<Vec<u8>, ImportError> {
        let (offset, len) = self.entries.get(path).copied().ok_or_else(|| {
            ImportError::Damaged(format!("{}: the archive has no {path}", self.url))
        })?;
        if len > SMALL {
            return Err(ImportError::Damaged(format!(
                "{}: {path} is {len} bytes, too large to be what it should be",
                self.url
            )));
        }
        Ok(self.reader.read_at(offset, len as usize).await?.to_vec())
    }

    /// A blob's bytes from `from` on, read by ranges.
    pub fn stream(
        self: &Arc<Self>,
        digest: &str,
        from: u64,
    ) -> Result<BoxStream<'static, std::io::Result<Bytes>>, ImportError> {
        let (offset, len) = self.blob(digest)?;
        let archive = self.clone();
        Ok(futures::stream::unfold(from, move |at| {
            let archive = archive.clone();
            async move {
                if at >= len {
                    return None;
                }
                let want = (len - at).min(PIECE as u64) as usize;
                match archive.reader.read_at(offset + at, want).await {
                    Ok(bytes) => Some((Ok(bytes), at + want as u64)),
                    // The reader retried already; the caller may resume from `at`.
                    Err(e) => Some((Err(std::io::Error::other(e)), len)),
                }
            }
        })
        .boxed())
    }
}

/// The `path` record of a PAX extended header.
fn pax_path(body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    text.lines().find_map(|line| {
        let (_, record) = line.split_once(' ')?;
        record.strip_prefix("path=").map(str::to_string)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_fields_and_blob_paths() {
        assert_eq!(octal(b"00000001750\0"), Some(0o1750));
        assert_eq!(octal(b"\0\0\0"), Some(0));
        assert_eq!(octal(b"zz"), None);
        assert_eq!(
            Archive::blob_path("sha256:ab12").as_deref(),
            Some("blobs/sha256/ab12")
        );
        assert_eq!(Archive::blob_path("sha256:../../etc/passwd"), None);
        assert_eq!(Archive::blob_path("nodigest"), None);
        assert_eq!(
            pax_path(b"30 mtime=1700000000.123456789\n29 path=blobs/sha256/abcdef\n").as_deref(),
            Some("blobs/sha256/abcdef")
        );
    }
}
