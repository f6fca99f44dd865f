//! A stream handed over by the caller, read once from its first byte: an upload's request body.
//! The caller feeds chunks (or the error that ended them) into the [`Feeder`] and drops it at
//! the end; the import reads them as a sequential source (raw and qcow2 convert as they arrive,
//! other formats go through scratch).

use std::sync::Mutex;

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use crate::error::ImportError;
use crate::sources::http::StreamReader;
use crate::sources::source::{Opened, Source};

/// Where the caller puts the stream's chunks; dropping it ends the stream.
pub type Feeder = mpsc::Sender<Result<Bytes, ImportError>>;

/// A one-shot sequential source.
pub struct StreamSource {
    name: String,
    size: Option<u64>,
    reader: Mutex<Option<StreamReader>>,
}

/// A source named `name` (for messages) of `size` bytes when known, the sender its chunks go
/// into (`depth` may wait unread), and a receiver told when the import has read the whole
/// stream.
pub fn channel(
    name: &str,
    size: Option<u64>,
    depth: usize,
) -> (Feeder, StreamSource, oneshot::Receiver<()>) {
    let (tx, rx) = mpsc::channel(depth.max(1));
    let (end_tx, end_rx) = oneshot::channel();
    let source = StreamSource {
        name: name.to_string(),
        size,
        reader: Mutex::new(Some(StreamReader::new(rx, Some(end_tx)))),
    };
    (tx, source, end_rx)
}

impl Source for StreamSource {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn open(&self) -> BoxFuture<'_, Result<Opened, ImportError>> {
        Box::pin(async move {
            let reader = self
                .reader
                .lock()
                .map_err(|_| ImportError::Unsupported("the stream's lock is poisoned".into()))?
                .take()
                .ok_or_else(|| {
                    ImportError::Unsupported(format!("{} can be read only once", self.name))
                })?;
            Ok(Opened {
                size: self.size,
                reader: None,
                stream: Box::new(move |_| Ok(Box::new(reader))),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn chunks_in_order_then_the_end_is_told_once_read() {
        let (tx, source, mut end) = channel("upload", Some(6), 2);
        tokio::spawn(async move {
            for c in [&b"abc"[..], b"def"] {
                tx.send(Ok(Bytes::from_static(c))).await.unwrap();
            }
        });
        let opened = source.open().await.unwrap();
        assert_eq!(opened.size, Some(6));
        assert!(opened.reader.is_none());
        let mut stream = (opened.stream)(1).unwrap();
        assert!(end.try_recv().is_err(), "nothing read yet");
        let all = tokio::task::spawn_blocking(move || {
            let mut all = Vec::new();
            stream.read_to_end(&mut all).unwrap();
            all
        })
        .await
        .unwrap();
        assert_eq!(all, b"abcdef");
        end.await.unwrap();
        assert!(source.open().await.is_err(), "a second read is refused");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_error_from_the_caller_ends_the_stream_as_an_error() {
        let (tx, source, end) = channel("upload", None, 2);
        tokio::spawn(async move {
            tx.send(Ok(Bytes::from_static(b"abc"))).await.unwrap();
            let broken = ImportError::Unsupported("the client went away".into());
            tx.send(Err(broken)).await.unwrap();
        });
        let opened = source.open().await.unwrap();
        let mut stream = (opened.stream)(1).unwrap();
        let err = tokio::task::spawn_blocking(move || {
            let mut all = Vec::new();
            stream.read_to_end(&mut all).unwrap_err()
        })
        .await
        .unwrap();
        assert!(err.to_string().contains("the client went away"), "{err}");
        assert!(end.await.is_err(), "the end was never reached");
    }
}
