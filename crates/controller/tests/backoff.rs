//! The controller runtime's error policy: a reconcile that keeps failing is tried again at
//! growing intervals, per object, and each failure is counted by kind. The controller is kube's
//! own, fed one object once (so every later pass is a retry the policy asked for, not a watch
//! event); the passes are observed as they happen, not slept for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cdi_controller::runtime::backoff::Backoff;
use cdi_controller::runtime::run::RunAs;
use cdi_controller::{Error, serve};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::controller::Controller;
use kube::runtime::{reflector, watcher};
use serde_json::json;

/// How many passes the test watches: the last interval is 2^(PASSES-2) times the first delay.
const PASSES: usize = 9;

#[tokio::test]
async fn a_reconcile_that_keeps_failing_is_retried_at_growing_intervals() {
    let object: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "broken", "namespace": "default"}}))
            .unwrap();
    let (store, mut writer) = reflector::store::<ConfigMap>();
    // A first list holding the object: the controller waits for the store to have one.
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitApply(object.clone()));
    writer.apply_watcher_event(&watcher::Event::InitDone);
    // The object once, then nothing: no change wakes it again.
    let once = futures::stream::once(async move { Ok(object) }).chain(futures::stream::pending());
    let metrics = Arc::new(serve::Metrics::default());
    let (tx, mut passes) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let controller = Controller::for_stream(once, store).run_as(
        "test",
        metrics.clone(),
        Arc::new(tx),
        |_, tx| async move {
            let _ = tx.send(Instant::now());
            Err::<kube::runtime::controller::Action, _>(Error::Other("always broken".into()))
        },
    );
    let running = tokio::spawn(controller);

    let mut at = Vec::new();
    while at.len() < PASSES {
        let pass = tokio::time::timeout(Duration::from_secs(60), passes.recv())
            .await
            .expect("a pass within a minute")
            .expect("the controller runs");
        at.push(pass);
    }
    running.abort();

    // Each try waited at least the backoff's delay after the failure before it, and the delays
    // grow: the last wait is many times the first (a flat requeue would keep them equal).
    let policy = Backoff::default();
    let waits: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
    for (failures, wait) in waits.iter().enumerate() {
        assert!(
            *wait >= policy.delay(failures as u32),
            "try {} came after {wait:?}, before its backoff {:?}: {waits:?}",
            failures + 2,
            policy.delay(failures as u32)
        );
    }
    assert!(
        waits[waits.len() - 1] > waits[0] * 8,
        "the waits did not grow: {waits:?}"
    );

    // Every failure but the last one seen (whose policy may still be running) is counted.
    let page = metrics.render();
    let line = page
        .lines()
        .find(|l| {
            l.starts_with("cdi_rs_reconcile_failures_total{controller=\"test\",kind=\"other\"}")
        })
        .unwrap_or_else(|| panic!("no failure count:\n{page}"));
    let count: usize = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(
        (PASSES - 1..=PASSES).contains(&count),
        "{count} failures counted over {PASSES} passes: {line}"
    );
}
