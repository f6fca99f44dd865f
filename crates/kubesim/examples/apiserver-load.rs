//! Load test of the embedded API server over real HTTP on 127.0.0.1: writers create and update
//! ConfigMaps while watchers follow them; prints writes/s, watch event latency (p50/p99) and
//! the process's memory with the objects stored.
//!
//!   cargo run --release -p kubesim --example apiserver-load -- [OBJECTS] [WRITERS] [WATCHERS]

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, Client, Config};
use kubesim::apiserver::ApiServer;
use serde_json::json;

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<f64>()
                    .unwrap_or(0.0)
            })
        })
        .unwrap_or(0.0)
        / 1024.0
}

fn now_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

fn percentile(sorted: &[u128], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

#[tokio::main]
async fn main() -> anyhow_free::Result<()> {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().expect("numbers"));
    let objects = args.next().unwrap_or(10_000);
    let writers = args.next().unwrap_or(8);
    let watchers = args.next().unwrap_or(10);

    let rss_start = rss_mib();
    let server = ApiServer::new();
    let (addr, _task) = server.serve("127.0.0.1:0".parse().unwrap()).await?;
    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(&server.kubeconfig(&format!("https://{addr}")))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let client = Client::try_from(config)?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    // Create.
    let started = Instant::now();
    let per = objects.div_ceil(writers);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w * per)..((w + 1) * per).min(objects) {
                let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": format!("cm-{i}"), "labels": {"writer": w.to_string()}}, "data": {"payload": "x".repeat(256)}})).unwrap();
                api.create(&PostParams::default(), &cm).await.expect("create");
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let create_secs = started.elapsed().as_secs_f64();
    let rss_loaded = rss_mib();

    // Watch while updating.
    let rv = server.store().resource_version().to_string();
    let latencies = Arc::new(tokio::sync::Mutex::new(Vec::<u128>::new()));
    let updates = objects.min(5_000);
    let mut watch_tasks = Vec::new();
    for _ in 0..watchers {
        let api = api.clone();
        let rv = rv.clone();
        let latencies = latencies.clone();
        watch_tasks.push(tokio::spawn(async move {
            let mut stream = api
                .watch(&WatchParams::default().timeout(120), &rv)
                .await
                .expect("watch")
                .boxed();
            let mut seen = 0;
            while let Some(ev) = stream.try_next().await.expect("watch stream") {
                if let WatchEvent::Modified(cm) = ev {
                    let sent: u128 = cm
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get("sent"))
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    latencies
                        .lock()
                        .await
                        .push(now_micros().saturating_sub(sent));
                    seen += 1;
                    if seen == updates {
                        return;
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let per = updates.div_ceil(writers);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w * per)..((w + 1) * per).min(updates) {
                let patch =
                    json!({"metadata": {"annotations": {"sent": now_micros().to_string()}}});
                api.patch(
                    &format!("cm-{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                )
                .await
                .expect("patch");
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let update_secs = started.elapsed().as_secs_f64();
    for t in watch_tasks {
        tokio::time::timeout(Duration::from_secs(60), t).await??;
    }
    let mut l = latencies.lock().await.clone();
    l.sort_unstable();

    println!(
        "objects {objects}, writers {writers}, watchers {watchers} (kube-rs client over HTTPS on 127.0.0.1, one process)"
    );
    println!(
        "create:  {:.0} writes/s ({objects} in {create_secs:.2} s)",
        objects as f64 / create_secs
    );
    println!(
        "update:  {:.0} writes/s ({updates} merge patches in {update_secs:.2} s)",
        updates as f64 / update_secs
    );
    println!(
        "watch:   {} events delivered, latency p50 {:.2} ms, p99 {:.2} ms",
        l.len(),
        percentile(&l, 0.5),
        percentile(&l, 0.99)
    );
    println!(
        "memory:  RSS {rss_start:.1} MiB at start, {rss_loaded:.1} MiB with {objects} objects stored, {:.1} MiB after the watches",
        rss_mib()
    );
    Ok(())
}

/// The example's error type: anything that displays.
mod anyhow_free {
    pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;
}
