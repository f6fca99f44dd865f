//! `/metrics`, `/healthz` and `/readyz` of the controller.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;

/// The controller's gauges.
#[derive(Debug, Default)]
pub struct Metrics {
    leader: AtomicBool,
    datavolume_pending: AtomicI64,
}

impl Metrics {
    pub fn set_leader(&self, leading: bool) {
        self.leader.store(leading, Ordering::SeqCst);
    }

    pub fn leader(&self) -> bool {
        self.leader.load(Ordering::SeqCst)
    }

    pub fn set_datavolume_pending(&self, n: i64) {
        self.datavolume_pending.store(n, Ordering::SeqCst);
    }

    /// The Prometheus text page.
    pub fn render(&self) -> String {
        format!(
            "# HELP kubevirt_cdi_datavolume_pending Number of DataVolumes pending for default storage class to be configured\n\
             # TYPE kubevirt_cdi_datavolume_pending gauge\n\
             kubevirt_cdi_datavolume_pending {}\n\
             # HELP cdi_rs_controller_leader Whether this controller instance holds the leader lease\n\
             # TYPE cdi_rs_controller_leader gauge\n\
             cdi_rs_controller_leader {}\n",
            self.datavolume_pending.load(Ordering::SeqCst),
            u8::from(self.leader()),
        )
    }
}

/// The router: `/healthz` (the process answers), `/readyz` (it leads and runs the controllers;
/// a standby is alive but not ready), `/metrics`.
pub fn router(metrics: Arc<Metrics>) -> Router {
    let page = metrics.clone();
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let m = metrics.clone();
                async move {
                    if m.leader() {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not leading")
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let m = page.clone();
                async move { m.render() }
            }),
        )
}

/// Serve the router on `addr`; the bound address and the task.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router(metrics)).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok((bound, task))
}
