//! Readiness probes: HTTP GET (success is a status from 200 to 399; HTTPS without certificate
//! checks, as kubelet does) and TCP connects, against the pod's own address. Exec probes would
//! run a command inside the image, which this kubelet has not got: such a container never becomes
//! ready, and its status says why.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A probe's timing, with Kubernetes' defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl Timing {
    pub fn of(p: &Probe) -> Timing {
        let secs =
            |v: Option<i32>, default: i32| Duration::from_secs(v.unwrap_or(default).max(0) as u64);
        Timing {
            initial_delay: secs(p.initial_delay_seconds, 0),
            period: secs(p.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: secs(p.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: p.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: p.failure_threshold.unwrap_or(3).max(1) as u32,
        }
    }
}

/// What to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    Http {
        url: String,
        headers: Vec<(String, String)>,
    },
    Tcp(SocketAddr),
}

/// A port by number or by the name of one of the container's ports.
fn port(c: &Container, p: &IntOrString) -> Result<u16, String> {
    match p {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("port {n} is out of range")),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|cp| cp.name.as_deref() == Some(name.as_str()))
            .and_then(|cp| u16::try_from(cp.container_port).ok())
            .ok_or_else(|| format!("the container has no port named {name:?}")),
    }
}

/// The check a probe describes, against `pod_ip` unless it names a host.
pub fn check(c: &Container, p: &Probe, pod_ip: IpAddr) -> Result<Check, String> {
    if let Some(h) = &p.http_get {
        let port = port(c, &h.port)?;
        let host = h.host.clone().unwrap_or_else(|| pod_ip.to_string());
        let scheme = h.scheme.as_deref().unwrap_or("HTTP").to_ascii_lowercase();
        let path = h.path.as_deref().unwrap_or("/");
        let sep = if path.starts_with('/') { "" } else { "/" };
        return Ok(Check::Http {
            url: format!("{scheme}://{host}:{port}{sep}{path}"),
            headers: h
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
        });
    }
    if let Some(t) = &p.tcp_socket {
        let ip = match &t.host {
            Some(h) => h
                .parse()
                .map_err(|_| format!("tcpSocket host {h:?} is not an address"))?,
            None => pod_ip,
        };
        return Ok(Check::Tcp(SocketAddr::new(ip, port(c, &t.port)?)));
    }
    Err(
        "the cdi dev kubelet runs httpGet and tcpSocket probes only (exec and grpc need the image)"
            .into(),
    )
}

/// Run one check: Ok when it passed, Err with what failed (kubelet's wording where it has one).
pub async fn run(check: &Check, timeout: Duration) -> Result<(), String> {
    match check {
        Check::Tcp(addr) => {
            match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("dial tcp {addr}: {e}")),
                Err(_) => Err(format!("dial tcp {addr}: i/o timeout")),
            }
        }
        Check::Http { url, headers } => {
            let client = reqwest::Client::builder()
                .timeout(timeout)
                .no_proxy()
                .tls_danger_accept_invalid_certs(true)
                .redirect(reqwest::redirect::Policy::limited(10))
                .build()
                .map_err(|e| e.to_string())?;
            let mut request = client.get(url).header("User-Agent", "kube-probe/1.33");
            for (k, v) in headers {
                request = request.header(k, v);
            }
            match request.send().await {
                Ok(r) if (200..400).contains(&r.status().as_u16()) => Ok(()),
                Ok(r) => Err(format!(
                    "HTTP probe failed with statuscode: {}",
                    r.status().as_u16()
                )),
                Err(e) => Err(format!("Get {url:?}: {e}")),
            }
        }
    }
}

/// Consecutive results turned into readiness by the thresholds.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    successes: u32,
    failures: u32,
    pub ready: bool,
}

impl Tracker {
    /// Record a result; true when readiness changed.
    pub fn record(&mut self, ok: bool, t: &Timing) -> bool {
        let before = self.ready;
        if ok {
            self.failures = 0;
            self.successes += 1;
            if self.successes >= t.success_threshold {
                self.ready = true;
            }
        } else {
            self.successes = 0;
            self.failures += 1;
            if self.failures >= t.failure_threshold {
                self.ready = false;
            }
        }
        before != self.ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn checks_from_probes() {
        let c: Container = serde_json::from_value(json!({
            "name": "c", "ports": [{"name": "http", "containerPort": 8080}]
        }))
        .unwrap();
        let ip: IpAddr = "127.2.0.3".parse().unwrap();
        let p: Probe =
            serde_json::from_value(json!({"httpGet": {"port": "http", "path": "healthz"}}))
                .unwrap();
        assert_eq!(
            check(&c, &p, ip).unwrap(),
            Check::Http {
                url: "http://127.2.0.3:8080/healthz".into(),
                headers: vec![]
            }
        );
        let p: Probe = serde_json::from_value(json!({"tcpSocket": {"port": 9}})).unwrap();
        assert_eq!(
            check(&c, &p, ip).unwrap(),
            Check::Tcp("127.2.0.3:9".parse().unwrap())
        );
        let p: Probe = serde_json::from_value(json!({"httpGet": {"port": "nope"}})).unwrap();
        assert!(check(&c, &p, ip).unwrap_err().contains("\"nope\""));
        let p: Probe = serde_json::from_value(json!({"exec": {"command": ["true"]}})).unwrap();
        assert!(check(&c, &p, ip).unwrap_err().contains("exec"));
    }

    #[test]
    fn thresholds() {
        let p: Probe =
            serde_json::from_value(json!({"successThreshold": 2, "failureThreshold": 2})).unwrap();
        let t = Timing::of(&p);
        assert_eq!(t.period, Duration::from_secs(10));
        let mut r = Tracker::default();
        assert!(!r.record(true, &t));
        assert!(r.record(true, &t) && r.ready);
        assert!(!r.record(false, &t) && r.ready);
        assert!(r.record(false, &t) && !r.ready);
    }
}
