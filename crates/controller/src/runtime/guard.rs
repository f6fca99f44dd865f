//! The panic guard around every reconcile pass.

use super::error::Error;
use crate::serve;

/// Run one reconcile pass of `controller` over `object` (namespace/name) in a tracing span,
/// turning a panic into [`Error::Panicked`], and count it (result and duration) in `metrics`. Without the guard a panic on one object (whatever a
/// user wrote into it) would take every controller down with it, and the restarted process
/// would meet the same object and crash again.
pub async fn guarded<T>(
    metrics: &serve::Metrics,
    controller: &'static str,
    object: &str,
    pass: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    use futures::FutureExt;
    use tracing::Instrument;
    let started = std::time::Instant::now();
    // Everything the pass logs carries the controller and the object.
    let span = tracing::info_span!("reconcile", controller, object);
    span.in_scope(|| tracing::trace!("pass starts"));
    let result = match std::panic::AssertUnwindSafe(pass)
        .catch_unwind()
        .instrument(span)
        .await
    {
        Ok(r) => r,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".into());
            tracing::error!(controller, panic = %message, "reconcile panicked; retrying later");
            Err(Error::Panicked(message))
        }
    };
    let outcome = match &result {
        Ok(_) => "ok",
        Err(Error::Panicked(_)) => "panic",
        Err(_) => "error",
    };
    metrics.reconciled(controller, outcome, started.elapsed().as_secs_f64());
    tracing::debug!(controller, object, outcome, elapsed = ?started.elapsed(), "pass");
    result
}
