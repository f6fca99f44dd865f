//! cdi-upload: the upload data path. The upload server each upload pod runs ([`server`]), the
//! upload proxy in front of them ([`proxy`]), and the source side of a host-assisted clone
//! ([`cloner`], packing its volume with [`pack`]), which streams into an upload server. Their
//! certificates and tokens are cdi-pki's; the API that hands out tokens is cdi-apiserver.

pub mod cloner;
pub mod pack;
pub mod proxy;
pub mod server;
