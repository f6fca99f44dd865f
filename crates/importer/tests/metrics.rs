//! The progress metric over HTTPS, scraped as the import controller scrapes it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cdi_importer::convert::Progress;

#[tokio::test]
async fn progress_is_served_over_https() {
    let progress = Arc::new(Progress::default());
    progress.total.store(1000, Ordering::Relaxed);
    progress.add(250);
    let (addr, task) = cdi_importer::metrics::serve(
        cdi_importer::metrics::IMPORT_PROGRESS,
        "127.0.0.1:0".parse().unwrap(),
        "uid-1".into(),
        progress.clone(),
    )
    .await
    .unwrap();
    let client = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let body = client
        .get(format!("https://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        body.contains("kubevirt_cdi_import_progress_total{ownerUID=\"uid-1\"} 25.00\n"),
        "{body}"
    );
    progress.add(750);
    let body = client
        .get(format!("https://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains("} 100.00"), "{body}");
    let status = client
        .get(format!("https://{addr}/other"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 404);
    task.abort();
}
