//! qcow2 to raw from a [`RangeReader`]: data clusters are read in parallel in source-file order,
//! coalesced into large requests, so over HTTP the image streams from the server with no scratch
//! copy; memory stays bounded by [`Tuning`], whatever the image size.

use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use tokio::sync::mpsc;

use crate::buffer::Buffer;
use crate::convert::{Progress, Tuning, fit};
use crate::error::ImportError;
use crate::formats::qcow2::{self, Cluster, ClusterCompression, Header};
use crate::sources::RangeReader;
use crate::writer::{Op, Target, TargetKind, WriteStats, send};

/// Convert the qcow2 image `reader` holds into `target`, refusing one larger than `limit`;
/// returns its virtual size and what was written.
pub(crate) async fn convert(
    reader: Arc<dyn RangeReader>,
    target: &Target,
    limit: Option<u64>,
    tuning: Tuning,
    progress: &Progress,
) -> Result<(u64, WriteStats), ImportError> {
    let header = read_header(reader.as_ref()).await?;
    fit(target, header.virtual_size, limit)?;
    let writer = target.writer(tuning.parallel, tuning.writeback_window)?;
    let zero_fill = target.kind() == TargetKind::Block;
    let written = write_raw(
        reader,
        &header,
        writer.sender(),
        zero_fill,
        tuning,
        progress,
    )
    .await;
    writer
        .finish_after(written.map(|_| header.virtual_size))
        .await
}

/// One read request: a source range and the clusters in it.
#[derive(Debug)]
struct Request {
    start: u64,
    end: u64,
    /// (guest offset, cluster) in host order.
    clusters: Vec<(u64, Cluster)>,
}

/// Group allocated clusters, sorted by host offset, into coalesced requests.
fn plan_requests(
    mut clusters: Vec<(u64, Cluster)>,
    cluster_size: u64,
    tuning: Tuning,
) -> Vec<Request> {
    let span = |c: &Cluster| match *c {
        Cluster::Data { host } => (host, host + cluster_size),
        Cluster::Compressed { host, len } => (host, host + len),
        _ => unreachable!("only allocated clusters are planned"),
    };
    clusters.sort_by_key(|(_, c)| span(c).0);
    let mut requests: Vec<Request> = Vec::new();
    let mut output = 0u64;
    for (guest, cluster) in clusters {
        let (start, end) = span(&cluster);
        if let Some(last) = requests.last_mut() {
            // Compressed clusters are packed byte by byte while their stored lengths round up to
            // sectors, so a cluster may start before the previous one's range ends.
            let fits = start <= last.end + tuning.max_gap;
            let small = end.max(last.end) - last.start <= tuning.request_bytes
                && output + cluster_size <= tuning.request_bytes;
            if fits && small {
                last.end = last.end.max(end);
                last.clusters.push((guest, cluster));
                output += cluster_size;
                continue;
            }
        }
        output = cluster_size;
        requests.push(Request {
            start,
            end,
            clusters: vec![(guest, cluster)],
        });
    }
    requests
}

/// Inflates compressed clusters; one per request, so its state is allocated once, not per
/// cluster.
pub(super) enum Inflater {
    Deflate(flate2::Decompress),
    Zstd(zstd::stream::raw::Decoder<'static>),
}

impl Inflater {
    pub(super) fn new(kind: ClusterCompression) -> Result<Inflater, String> {
        Ok(match kind {
            ClusterCompression::Deflate => Inflater::Deflate(flate2::Decompress::new(false)),
            ClusterCompression::Zstd => {
                Inflater::Zstd(zstd::stream::raw::Decoder::new().map_err(|e| format!("zstd: {e}"))?)
            }
        })
    }

    /// Inflate one cluster into `out` (exactly its size). The stored length is rounded up to
    /// sectors, so bytes of the next cluster may follow the compressed data: decoding stops when
    /// the cluster is full. The cluster-sized output bounds what a hostile stream can expand to.
    pub(super) fn inflate(&mut self, input: &[u8], out: &mut [u8]) -> Result<(), String> {
        match self {
            Inflater::Deflate(d) => {
                d.reset(false);
                match d.decompress(input, out, flate2::FlushDecompress::Finish) {
                    Ok(_) if d.total_out() as usize == out.len() => Ok(()),
                    Ok(_) => Err(format!(
                        "deflate produced {} of {} bytes",
                        d.total_out(),
                        out.len()
                    )),
                    Err(e) => Err(format!("deflate: {e}")),
                }
            }
            Inflater::Zstd(d) => {
                use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
                d.reinit().map_err(|e| format!("zstd: {e}"))?;
                let capacity = out.len();
                let mut input = InBuffer::around(input);
                let mut output = OutBuffer::around(out);
                loop {
                    let hint = d
                        .run(&mut input, &mut output)
                        .map_err(|e| format!("zstd: {e}"))?;
                    if output.pos() == capacity || hint == 0 {
                        break;
                    }
                    if input.pos() == input.src.len() {
                        return Err(format!(
                            "zstd data ends after {} bytes of a cluster",
                            output.pos()
                        ));
                    }
                }
                let produced = output.pos();
                if produced != capacity {
                    return Err(format!("zstd produced {produced} of {capacity} bytes"));
                }
                Ok(())
            }
        }
    }
}

/// Turn one fetched request into writes: data clusters as slices of what was read, compressed
/// clusters inflated into one output buffer for the request.
fn expand(header: &Header, request: &Request, data: &Bytes) -> Result<Vec<Op>, ImportError> {
    let cs = header.cluster_size();
    let visible = |guest: u64| cs.min(header.virtual_size - guest) as usize;
    let inflated: usize = request
        .clusters
        .iter()
        .filter(|(_, c)| matches!(c, Cluster::Compressed { .. }))
        .map(|(g, _)| visible(*g))
        .sum();
    let mut out = Buffer::with_len(inflated)
        .map_err(|e| ImportError::io("allocating a transfer buffer", e))?;
    let mut inflater = None;
    let mut at = 0usize;
    let mut placed = Vec::with_capacity(request.clusters.len());
    for &(guest, cluster) in &request.clusters {
        let n = visible(guest);
        match cluster {
            Cluster::Compressed { host, len } => {
                let from = ((host - request.start) as usize).min(data.len());
                let input = &data[from..(from + len as usize).min(data.len())];
                let inflater = match &mut inflater {
                    Some(i) => i,
                    None => inflater
                        .insert(Inflater::new(header.compression).map_err(ImportError::Damaged)?),
                };
                inflater
                    .inflate(input, &mut out.bytes_mut()[at..at + n])
                    .map_err(|e| {
                        ImportError::Damaged(format!(
                            "compressed cluster at guest offset {guest} (host {host}): {e}"
                        ))
                    })?;
                placed.push((guest, None, at));
                at += n;
            }
            Cluster::Data { host } => placed.push((guest, Some(host), 0)),
            Cluster::Zero | Cluster::Unallocated => {}
        }
    }
    let out = out.freeze();
    let ops = placed
        .into_iter()
        .map(|(guest, host, at)| {
            let n = visible(guest);
            let data = match host {
                None => out.slice(at..at + n),
                Some(host) => {
                    let from = ((host - request.start) as usize).min(data.len());
                    let slice = data.slice(from..(from + n).min(data.len()));
                    if slice.len() < n {
                        // A cluster cut short by the end of the file reads as zeros past it.
                        let mut padded = slice.to_vec();
                        padded.resize(n, 0);
                        Bytes::from(padded)
                    } else {
                        slice
                    }
                }
            };
            Op::Data {
                offset: guest,
                data,
            }
        })
        .collect();
    Ok(ops)
}

/// Add `len` zero bytes at `offset` to the pending run of zeros, sending the run first when the
/// new range does not continue it.
async fn add_zeros(
    tx: &mpsc::Sender<Op>,
    run: &mut Option<(u64, u64)>,
    offset: u64,
    len: u64,
) -> Result<(), ImportError> {
    *run = match *run {
        Some((start, l)) if start + l == offset => Some((start, l + len)),
        Some((start, l)) => {
            send(
                tx,
                Op::Zero {
                    offset: start,
                    len: l,
                },
            )
            .await?;
            Some((offset, len))
        }
        None => Some((offset, len)),
    };
    Ok(())
}

/// Read and check a qcow2 header from the start of `reader`.
pub async fn read_header(reader: &dyn RangeReader) -> Result<Header, ImportError> {
    let len = reader.size();
    let first = reader.read_at(0, 4096.min(len as usize)).await?;
    let want = qcow2::header_read_len(&first, len)?;
    let head = if want as usize > first.len() {
        reader.read_at(0, want as usize).await?
    } else {
        first
    };
    Ok(qcow2::parse_header(&head, len)?)
}

/// Convert a qcow2 image to raw. The target must already be `header.virtual_size` bytes (or
/// more); unallocated and zero clusters are sent as `Op::Zero` when `zero_fill` is set (block
/// targets), and skipped otherwise.
pub async fn write_raw(
    reader: Arc<dyn RangeReader>,
    header: &Header,
    tx: mpsc::Sender<Op>,
    zero_fill: bool,
    tuning: Tuning,
    progress: &Progress,
) -> Result<(), ImportError> {
    let file_len = reader.size();
    let cs = header.cluster_size();
    let span = header.l2_span();
    let needed = header.virtual_size.div_ceil(span);
    let l1 = reader
        .read_at(header.l1_table_offset, (needed * 8) as usize)
        .await?;
    if (l1.len() as u64) < needed * 8 {
        return Err(ImportError::Damaged(
            "the L1 table is cut short by the end of the image".into(),
        ));
    }
    let l1: Vec<Option<u64>> = qcow2::entries(&l1)
        .map(|e| qcow2::l1_entry(header, e, file_len))
        .collect::<Result<_, _>>()?;

    // A window of L2 tables at a time: the table entries of a whole large image would not fit
    // the memory budget, and images are laid out mostly in guest order anyway.
    let window = (tuning.request_bytes / cs).max(1) as usize;
    for (w, chunk) in l1.chunks(window).enumerate() {
        let first_index = (w * window) as u64;
        let tables: Vec<(u64, Option<Bytes>)> = stream::iter(chunk.iter().enumerate())
            .map(|(i, l2)| {
                let reader = reader.clone();
                let index = first_index + i as u64;
                async move {
                    match l2 {
                        Some(offset) => Ok::<_, ImportError>((
                            index,
                            Some(reader.read_at(*offset, cs as usize).await?),
                        )),
                        None => Ok((index, None)),
                    }
                }
            })
            .buffered(tuning.parallel)
            .try_collect()
            .await?;

        let mut allocated = Vec::new();
        let mut zero_run: Option<(u64, u64)> = None;
        for (index, table) in tables {
            // index < needed, so the table starts inside the image.
            let base = index * span;
            let Some(table) = table else {
                // A missing L2 table maps only zeros: one run, not a walk over its clusters
                // (a sparse image of petabytes has hundreds of thousands of such tables).
                if zero_fill {
                    let len = span.min(header.virtual_size - base);
                    add_zeros(&tx, &mut zero_run, base, len).await?;
                }
                continue;
            };
            let entries = header
                .l2_entries()
                .min(header.virtual_size.saturating_sub(base).div_ceil(cs));
            for e in 0..entries {
                let guest = base + e * cs;
                let at = e as usize * 8;
                let entry = u64::from_be_bytes(table[at..at + 8].try_into().expect("8"));
                match qcow2::l2_entry(header, entry, file_len)? {
                    Cluster::Zero | Cluster::Unallocated => {
                        if zero_fill {
                            let len = cs.min(header.virtual_size - guest);
                            add_zeros(&tx, &mut zero_run, guest, len).await?;
                        }
                    }
                    other => allocated.push((guest, other)),
                }
            }
        }
        if let Some((offset, len)) = zero_run {
            send(&tx, Op::Zero { offset, len }).await?;
        }

        let header = Arc::new(header.clone());
        stream::iter(plan_requests(allocated, cs, tuning))
            .map(|request| {
                let reader = reader.clone();
                let header = header.clone();
                async move {
                    let data = reader
                        .read_at(request.start, (request.end - request.start) as usize)
                        .await?;
                    if data.is_empty() {
                        return Err(ImportError::Damaged(format!(
                            "no data at offset {}",
                            request.start
                        )));
                    }
                    let fetched = data.len() as u64;
                    let ops = tokio::task::spawn_blocking(move || expand(&header, &request, &data))
                        .await
                        .map_err(|e| ImportError::Internal(format!("decompression task: {e}")))??;
                    Ok::<_, ImportError>((fetched, ops))
                }
            })
            .buffer_unordered(tuning.parallel)
            .try_for_each(|(fetched, ops)| {
                let tx = tx.clone();
                async move {
                    progress.add(fetched);
                    send(&tx, Op::Many(ops)).await
                }
            })
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_coalesce_in_host_order_within_bounds() {
        let cs = 65536;
        let tuning = Tuning {
            request_bytes: 4 * cs,
            parallel: 2,
            max_gap: cs,
            ..Tuning::default()
        };
        let data = |host| Cluster::Data { host };
        let clusters = vec![
            (0, data(10 * cs)),
            (cs, data(3 * cs)),
            (2 * cs, data(4 * cs)),
            (3 * cs, data(6 * cs)), // a one-cluster gap: read through
            (4 * cs, data(7 * cs)), // would make the request 5 clusters: new request
            (
                5 * cs,
                Cluster::Compressed {
                    host: 8 * cs,
                    len: 1000,
                },
            ),
        ];
        let requests = plan_requests(clusters, cs, tuning);
        let ranges: Vec<(u64, u64, usize)> = requests
            .iter()
            .map(|r| (r.start / cs, r.end, r.clusters.len()))
            .collect();
        assert_eq!(
            ranges,
            vec![(3, 7 * cs, 3), (7, 8 * cs + 1000, 2), (10, 11 * cs, 1)]
        );
    }

    #[test]
    fn hostile_compressed_clusters_are_bounded() {
        let header = Header {
            version: 3,
            cluster_bits: 16,
            virtual_size: 1 << 20,
            l1_size: 1,
            l1_table_offset: 65536,
            compression: ClusterCompression::Zstd,
            dirty: false,
        };
        // A zstd frame that would expand to 1 MiB yields one 64 KiB cluster and no more.
        let bomb = zstd::bulk::compress(&vec![0u8; 1 << 20], 3).unwrap();
        let request = Request {
            start: 0,
            end: bomb.len() as u64,
            clusters: vec![(
                0,
                Cluster::Compressed {
                    host: 0,
                    len: bomb.len() as u64,
                },
            )],
        };
        let ops = expand(&header, &request, &Bytes::from(bomb)).unwrap();
        assert!(matches!(&ops[..], [Op::Data { offset: 0, data }] if data.len() == 65536));
        // A frame cut short is an error naming the cluster.
        let short = zstd::bulk::compress(&vec![7u8; 1000], 3).unwrap();
        let request = Request {
            start: 0,
            end: short.len() as u64,
            clusters: vec![(
                0,
                Cluster::Compressed {
                    host: 0,
                    len: short.len() as u64,
                },
            )],
        };
        let err = expand(&header, &request, &Bytes::from(short))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("compressed cluster at guest offset 0"),
            "{err}"
        );
        // Garbage deflate data is an error, not a panic.
        let deflate = Header {
            compression: ClusterCompression::Deflate,
            ..header
        };
        let request = Request {
            start: 0,
            end: 16,
            clusters: vec![(0, Cluster::Compressed { host: 0, len: 16 })],
        };
        assert!(expand(&deflate, &request, &Bytes::from(vec![0xffu8; 16])).is_err());
    }
}
