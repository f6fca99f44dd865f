//! One way to run a controller: kube-runtime's `Controller` with the triggers a controller
//! attached, its reconcile under the panic guard, and the one error policy: a failing object is
//! tried again after its own exponential backoff, and each failure is counted by kind.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use kube::Resource;
use kube::runtime::controller::{Action, Controller};
use serde::de::DeserializeOwned;

use super::backoff::Backoff;
use super::error::Error;
use super::guard::guarded;
use crate::serve::Metrics;

/// What the runtime keeps beside a controller's own context.
pub struct Shared<T> {
    name: &'static str,
    ctx: Arc<T>,
    metrics: Arc<Metrics>,
    backoff: Backoff,
}

/// The one error policy: count the failure of `object` by its kind, log it, and say how long the
/// object waits before its next try (its backoff).
fn failed(
    name: &'static str,
    object: &str,
    metrics: &Metrics,
    backoff: &Backoff,
    error: &Error,
) -> std::time::Duration {
    metrics.failed(name, error.kind());
    let delay = backoff.failed(object);
    // A conflict is routine (another writer won the race) and is retried at once.
    if error.kind() == "conflict" {
        tracing::debug!(controller = name, object, %error, ?delay, "reconcile failed");
    } else {
        tracing::warn!(controller = name, object, %error, ?delay, "reconcile failed");
    }
    delay
}

/// `namespace/name`, or `name` for a cluster-scoped object.
fn key_of<K: Resource>(object: &K) -> String {
    let meta = object.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

/// Running a controller the one way: `controller.run_as(name, metrics, ctx, reconcile)`.
pub trait RunAs<K> {
    /// Run the controller (its triggers attached) under `name`: each pass of `reconcile` over
    /// an object gets `ctx`, runs under the panic guard and is counted in `metrics`; a failure
    /// is retried after the object's backoff. Ends when the controller's streams end.
    fn run_as<T, R, F>(
        self,
        name: &'static str,
        metrics: Arc<Metrics>,
        ctx: Arc<T>,
        reconcile: R,
    ) -> impl Future<Output = ()> + Send
    where
        T: Send + Sync + 'static,
        R: FnMut(Arc<K>, Arc<T>) -> F + Send,
        F: Future<Output = Result<Action, Error>> + Send + 'static;
}

impl<K> RunAs<K> for Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn run_as<T, R, F>(
        self,
        name: &'static str,
        metrics: Arc<Metrics>,
        ctx: Arc<T>,
        mut reconcile: R,
    ) -> impl Future<Output = ()> + Send
    where
        T: Send + Sync + 'static,
        R: FnMut(Arc<K>, Arc<T>) -> F + Send,
        F: Future<Output = Result<Action, Error>> + Send + 'static,
    {
        let shared = Arc::new(Shared {
            name,
            ctx,
            metrics,
            backoff: Backoff::default(),
        });
        self.run(
            move |object, shared: Arc<Shared<T>>| {
                let key = key_of(object.as_ref());
                let pass = reconcile(object, shared.ctx.clone());
                async move {
                    let result = guarded(&shared.metrics, shared.name, &key, pass).await;
                    if result.is_ok() {
                        shared.backoff.succeeded(&key);
                    }
                    result
                }
            },
            |object, error, shared| {
                let key = key_of(object.as_ref());
                let delay = failed(shared.name, &key, &shared.metrics, &shared.backoff, error);
                Action::requeue(delay)
            },
            shared,
        )
        .for_each(move |r| async move {
            if let Err(e) = r {
                tracing::debug!(controller = name, error = %e, "controller");
            }
        })
    }
}

/// Run a controller of one object (or of all of a kind at once, as the StorageProfiles'): `pass`
/// once, then again on each of `changes` and every `period`. A failure is counted and, like a
/// failing object's in [`RunAs`], tried again after its backoff even when nothing changes.
pub async fn run_singleton<S, P, F>(
    name: &'static str,
    object: &str,
    metrics: &Metrics,
    mut changes: S,
    period: std::time::Duration,
    mut pass: P,
) where
    S: futures::Stream + Unpin,
    P: FnMut() -> F,
    F: Future<Output = Result<(), Error>>,
{
    let backoff = Backoff::default();
    loop {
        // The next pass comes with a change, or after `period` (after the backoff if it failed).
        let wait = match guarded(metrics, name, object, pass()).await {
            Ok(()) => {
                backoff.succeeded(object);
                period
            }
            Err(error) => failed(name, object, metrics, &backoff, &error),
        };
        tokio::select! {
            _ = changes.next() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
