//! Import progress, read from the worker pod's metrics endpoint as upstream does:
//! `https://<pod IP>:<port named metrics>/metrics`, certificate not checked (the importer makes a
//! fresh self-signed one), the counter `kubevirt_cdi_import_progress_total{ownerUID="…"}`.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

/// The metric's value for `owner_uid` in a Prometheus text page, as "NN.NN%".
pub fn parse(page: &str, metric: &str, owner_uid: &str) -> Option<String> {
    let prefix = format!("{metric}{{ownerUID=\"{owner_uid}\"}} ");
    page.lines().find_map(|line| {
        let value: f64 = line.strip_prefix(&prefix)?.trim().parse().ok()?;
        (0.0..=100.0)
            .contains(&value)
            .then(|| format!("{value:.2}%"))
    })
}

/// The pod's metrics URL, from its IP and its port named `metrics`.
pub fn metrics_url(pod: &Pod) -> Option<String> {
    let ip = pod.status.as_ref()?.pod_ip.clone()?;
    let port = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(cdi_core::import::METRICS_PORT_NAME))?
        .container_port;
    Some(format!("https://{ip}:{port}/metrics"))
}

/// The client progress is read with: short timeouts, no proxy (pod IPs), and the importer's
/// self-signed certificate accepted, as upstream does.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .no_proxy()
        .tls_danger_accept_invalid_certs(true)
        .build()
        .unwrap_or_default()
}

/// Read the clone progress of the source pod for `owner_uid` (the clone's target); `None` when
/// it cannot be read now.
pub async fn clone_progress(
    client: &reqwest::Client,
    pod: &Pod,
    owner_uid: &str,
) -> Option<String> {
    let url = metrics_url(pod)?;
    let page = client.get(&url).send().await.ok()?.text().await.ok()?;
    parse(&page, "kubevirt_cdi_clone_progress_total", owner_uid)
}

/// Read the import progress of the pod for `owner_uid`; `None` when it cannot be read now.
pub async fn import_progress(
    client: &reqwest::Client,
    pod: &Pod,
    owner_uid: &str,
) -> Option<String> {
    let url = metrics_url(pod)?;
    let page = client.get(&url).send().await.ok()?.text().await.ok()?;
    parse(&page, "kubevirt_cdi_import_progress_total", owner_uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_from_a_page() {
        let page = "# TYPE kubevirt_cdi_import_progress_total counter\n\
            kubevirt_cdi_import_progress_total{ownerUID=\"other\"} 10\n\
            kubevirt_cdi_import_progress_total{ownerUID=\"abc\"} 45.123\n";
        assert_eq!(
            parse(page, "kubevirt_cdi_import_progress_total", "abc").as_deref(),
            Some("45.12%")
        );
        assert_eq!(
            parse(page, "kubevirt_cdi_import_progress_total", "none"),
            None
        );
        assert_eq!(parse("x{ownerUID=\"a\"} 300", "x", "a"), None);
    }
}
