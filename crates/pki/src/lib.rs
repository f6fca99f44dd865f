//! cdi-pki: the certificates and tokens every component of cdi-rs shares. The CAs and key
//! pairs of the upload path and the API server ([`ca`]), when they are renewed ([`rotation`]),
//! serving TLS from them, following renewals ([`tls`]), and the upload and clone tokens that
//! `cdi apiserver` signs and the upload proxy and the controller check ([`token`]).

pub mod ca;
pub mod rotation;
pub mod tls;
pub mod token;
