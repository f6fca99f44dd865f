//! The API server's request counts, as kube-apiserver exposes them at `/metrics`:
//! `apiserver_request_total` by verb, group, resource, subresource and code. What a load test
//! reads to tell how many requests a controller needs per object.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// One kind of request, as kube-apiserver labels it.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Request {
    /// get, list, watch, create, update, patch, delete, deletecollection (for resources); the
    /// lower-case method for everything else.
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub code: String,
}

/// The counters and their registry.
pub struct Metrics {
    requests: Family<Request, Counter>,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        let requests = Family::<Request, Counter>::default();
        let mut registry = Registry::default();
        registry.register(
            "apiserver_request",
            "Counter of apiserver requests broken out for each verb, group, resource, subresource and HTTP response code.",
            requests.clone(),
        );
        Metrics { requests, registry }
    }
}

impl Metrics {
    /// Count one answered request.
    pub fn count(&self, mut request: Request, code: u16) {
        request.code = code.to_string();
        self.requests.get_or_create(&request).inc();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
