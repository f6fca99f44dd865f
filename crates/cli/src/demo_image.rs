//! The demo's disk: a small real FAT16 filesystem, built here so the demo needs no tools, served
//! as qcow2 over HTTP on 127.0.0.1 (ranges supported, as the importer prefers).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SECTOR: usize = 512;
const SECTORS_PER_CLUSTER: usize = 4;
const ROOT_ENTRIES: usize = 512;

/// A FAT16 filesystem of `total_sectors` sectors holding `files` (8.3 names, upper case).
pub fn fat16(total_sectors: usize, label: &str, files: &[(&str, &[u8])]) -> Vec<u8> {
    let cluster = SECTOR * SECTORS_PER_CLUSTER;
    let root_sectors = ROOT_ENTRIES * 32 / SECTOR;
    // Clusters first estimated without the FATs, then the FAT size that covers them.
    let approx_clusters = total_sectors / SECTORS_PER_CLUSTER;
    let fat_sectors = ((approx_clusters + 2) * 2).div_ceil(SECTOR);
    let data_start = 1 + 2 * fat_sectors + root_sectors;
    let clusters = (total_sectors - data_start) / SECTORS_PER_CLUSTER;
    let mut img = vec![0u8; total_sectors * SECTOR];
    // Boot sector with the BIOS parameter block.
    let b = &mut img[..SECTOR];
    b[0..3].copy_from_slice(&[0xEB, 0x3C, 0x90]);
    b[3..11].copy_from_slice(b"CDI-RS  ");
    b[11..13].copy_from_slice(&(SECTOR as u16).to_le_bytes());
    b[13] = SECTORS_PER_CLUSTER as u8;
    b[14..16].copy_from_slice(&1u16.to_le_bytes());
    b[16] = 2;
    b[17..19].copy_from_slice(&(ROOT_ENTRIES as u16).to_le_bytes());
    if total_sectors < 65536 {
        b[19..21].copy_from_slice(&(total_sectors as u16).to_le_bytes());
    } else {
        b[32..36].copy_from_slice(&(total_sectors as u32).to_le_bytes());
    }
    b[21] = 0xF8;
    b[22..24].copy_from_slice(&(fat_sectors as u16).to_le_bytes());
    b[24..26].copy_from_slice(&32u16.to_le_bytes());
    b[26..28].copy_from_slice(&64u16.to_le_bytes());
    b[36] = 0x80;
    b[38] = 0x29;
    b[39..43].copy_from_slice(&0x2024_1130u32.to_le_bytes());
    let mut vol = [b' '; 11];
    for (d, s) in vol.iter_mut().zip(label.bytes()) {
        *d = s.to_ascii_uppercase();
    }
    b[43..54].copy_from_slice(&vol);
    b[54..62].copy_from_slice(b"FAT16   ");
    b[510] = 0x55;
    b[511] = 0xAA;
    // FAT entries, root directory and data.
    let mut fat = vec![0u16; clusters + 2];
    fat[0] = 0xFFF8;
    fat[1] = 0xFFFF;
    let root = (1 + 2 * fat_sectors) * SECTOR;
    let mut entry = root;
    img[entry..entry + 11].copy_from_slice(&vol);
    img[entry + 11] = 0x08;
    entry += 32;
    let mut next = 2usize;
    for (name, content) in files {
        let (base, ext) = name.split_once('.').unwrap_or((name, ""));
        let mut short = [b' '; 11];
        for (d, s) in short[..8].iter_mut().zip(base.bytes()) {
            *d = s.to_ascii_uppercase();
        }
        for (d, s) in short[8..].iter_mut().zip(ext.bytes()) {
            *d = s.to_ascii_uppercase();
        }
        let count = content.len().div_ceil(cluster).max(1);
        let first = next;
        for i in 0..count {
            fat[first + i] = if i + 1 == count {
                0xFFFF
            } else {
                (first + i + 1) as u16
            };
            let at = (data_start + (first + i - 2) * SECTORS_PER_CLUSTER) * SECTOR;
            let part =
                &content[(i * cluster).min(content.len())..((i + 1) * cluster).min(content.len())];
            img[at..at + part.len()].copy_from_slice(part);
        }
        next += count;
        img[entry..entry + 11].copy_from_slice(&short);
        img[entry + 11] = 0x20;
        img[entry + 26..entry + 28].copy_from_slice(&(first as u16).to_le_bytes());
        img[entry + 28..entry + 32].copy_from_slice(&(content.len() as u32).to_le_bytes());
        entry += 32;
    }
    for copy in 0..2 {
        let at = (1 + copy * fat_sectors) * SECTOR;
        for (i, v) in fat.iter().enumerate() {
            img[at + 2 * i..at + 2 * i + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    img
}

/// Serve `body` at `path` on 127.0.0.1 until the task is dropped: HEAD, GET, single ranges.
pub async fn serve(
    path: &str,
    body: Vec<u8>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let body = Arc::new(body);
    let path = path.to_string();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let body = body.clone();
            let path = path.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16384 {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).into_owned();
                let mut lines = text.lines();
                let mut first = lines.next().unwrap_or("").split_whitespace();
                let (method, target) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
                let range = lines
                    .filter_map(|l| l.split_once(':'))
                    .find(|(k, _)| k.eq_ignore_ascii_case("range"))
                    .and_then(|(_, v)| v.trim().strip_prefix("bytes=").map(str::to_string));
                let len = body.len() as u64;
                let (status, start, end) = match range.as_deref().and_then(|r| r.split_once('-')) {
                    Some((a, b)) => {
                        let a: u64 = a.parse().unwrap_or(0);
                        let b: u64 = b
                            .parse()
                            .unwrap_or(len.saturating_sub(1))
                            .min(len.saturating_sub(1));
                        ("206 Partial Content", a.min(len), (b + 1).max(a.min(len)))
                    }
                    None => ("200 OK", 0, len),
                };
                let reply = if target != path {
                    "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_string()
                } else {
                    format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nAccept-Ranges: bytes\r\nContent-Type: application/octet-stream\r\n{}Connection: close\r\n\r\n",
                        end - start,
                        if status.starts_with("206") {
                            format!(
                                "Content-Range: bytes {start}-{}/{len}\r\n",
                                end.saturating_sub(1)
                            )
                        } else {
                            String::new()
                        }
                    )
                };
                if stream.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
                if method == "GET" && target == path {
                    let _ = stream.write_all(&body[start as usize..end as usize]).await;
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok((addr, task))
}

/// The first `len` bytes of the disk at `path`, to compare with the image served.
pub(crate) fn read_head(path: &std::path::Path, len: usize) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut buf = vec![0u8; len];
    std::fs::File::open(path).ok()?.read_exact(&mut buf).ok()?;
    Some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fat16_volume() {
        let img = fat16(
            65536,
            "cdi demo",
            &[("README.TXT", b"hello"), ("BIG.BIN", &[7u8; 5000])],
        );
        assert_eq!(img.len(), 65536 * 512);
        assert_eq!(&img[510..512], &[0x55, 0xAA]);
        assert_eq!(&img[54..62], b"FAT16   ");
        let fat_sectors = u16::from_le_bytes([img[22], img[23]]) as usize;
        let root = (1 + 2 * fat_sectors) * 512;
        assert_eq!(&img[root..root + 11], b"CDI DEMO   ");
        assert_eq!(&img[root + 32..root + 43], b"README  TXT");
        // BIG.BIN spans three 2 KiB clusters, chained in the FAT: 3 → 4 → 5 → end.
        let fat = 512;
        let entry = |n: usize| u16::from_le_bytes([img[fat + 2 * n], img[fat + 2 * n + 1]]);
        assert_eq!(
            (entry(2), entry(3), entry(4), entry(5)),
            (0xFFFF, 4, 5, 0xFFFF)
        );
        let data = root + 512 * 32;
        assert_eq!(&img[data..data + 5], b"hello");
    }
}
