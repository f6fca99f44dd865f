//! cdi-apiserver: what upstream's cdi-apiserver serves. The admission webhooks of DataVolumes
//! and the kinds around them, with clone authorization ([`webhook`]), the UploadTokenRequest
//! API's rules ([`tokenapi`]), and the HTTPS server that serves both, as an aggregated API
//! behind the Kubernetes API server ([`server`]).

pub mod server;
pub mod tokenapi;
pub mod webhook;
