//! Raw images (and ISO images, which are raw): copied as they are, from reads at random or from
//! a stream.

use std::io::Read;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use tokio::sync::mpsc;

use crate::convert::{Progress, Tuning, fit};
use crate::error::ImportError;
use crate::reading::read_full;
use crate::sources::RangeReader;
use crate::task::blocking;
use crate::writer::{Op, Target, WriteStats, send, stopped};

/// Copy the raw image `reader` holds into `target`, refusing one larger than `limit`; returns
/// its size and what was written.
pub(crate) async fn convert(
    reader: Arc<dyn RangeReader>,
    target: &Target,
    limit: Option<u64>,
    tuning: Tuning,
    progress: &Progress,
) -> Result<(u64, WriteStats), ImportError> {
    let len = reader.size();
    fit(target, len, limit)?;
    let writer = target.writer(tuning.parallel, tuning.writeback_window)?;
    let copied = copy(reader, len, writer.sender(), tuning, progress).await;
    writer.finish_after(copied.map(|()| len)).await
}

/// Copy a raw image of `len` bytes (only the first `len` bytes of the source are used).
pub async fn copy(
    reader: Arc<dyn RangeReader>,
    len: u64,
    tx: mpsc::Sender<Op>,
    tuning: Tuning,
    progress: &Progress,
) -> Result<(), ImportError> {
    let chunks = (0..len.div_ceil(tuning.request_bytes)).map(|i| {
        let offset = i * tuning.request_bytes;
        (offset, tuning.request_bytes.min(len - offset))
    });
    stream::iter(chunks)
        .map(|(offset, n)| {
            let reader = reader.clone();
            async move { Ok::<_, ImportError>((offset, reader.read_at(offset, n as usize).await?, n)) }
        })
        .buffer_unordered(tuning.parallel)
        .try_for_each(|(offset, data, n)| {
            let tx = tx.clone();
            async move {
                if (data.len() as u64) < n {
                    return Err(ImportError::Damaged(format!("source ended at {} of {len} bytes", offset + data.len() as u64)));
                }
                progress.add(n);
                send(&tx, Op::Data { offset, data }).await
            }
        })
        .await
}

/// Copy a raw image read as a stream into `target`, never past `limit`; `context` names the
/// stream in messages. Returns its size and what was written.
pub(crate) async fn copy_stream(
    mut stream: Box<dyn Read + Send>,
    target: &Target,
    limit: Option<u64>,
    tuning: Tuning,
    context: &'static str,
) -> Result<(u64, WriteStats), ImportError> {
    let writer = target.writer(tuning.parallel, tuning.writeback_window)?;
    let tx = writer.sender();
    let chunk = tuning.request_bytes as usize;
    let written = blocking(move || {
        let mut offset = 0u64;
        loop {
            let mut buf = vec![0u8; chunk];
            let n =
                read_full(&mut stream, &mut buf).map_err(|e| ImportError::from_read(context, e))?;
            if n == 0 {
                return Ok(offset);
            }
            buf.truncate(n);
            if let Some(usable) = limit
                && offset + n as u64 > usable
            {
                return Err(ImportError::StreamTooLarge { usable });
            }
            tx.blocking_send(Op::Data {
                offset,
                data: Bytes::from(buf),
            })
            .map_err(|_| stopped())?;
            offset += n as u64;
        }
    })
    .await;
    writer.finish_after(written).await
}
