//! Work that blocks (file and device I/O, qemu-img, decompression) run off the async runtime,
//! its panics and cancellations turned into an [`ImportError`].

use crate::error::ImportError;

/// Run `f` on a blocking thread and wait for it.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ImportError> + Send + 'static,
) -> Result<T, ImportError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ImportError::Internal(e.to_string()))?
}
