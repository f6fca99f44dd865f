//! cdi-upload: the upload path. Its [`token`]s — what `cdi apiserver` signs for an
//! UploadTokenRequest (and the DataVolume webhook for a clone), and what the upload proxy and
//! the clone controller check —, the token API's logic ([`tokenapi`]), the upload server each
//! upload pod runs ([`server`]), the upload proxy in front of them ([`proxy`]), and their
//! certificates ([`pki`]), and the aggregated API that hands out tokens ([`apiserver`]). Also
//! the source side of a host-assisted clone ([`cloner`], packing its volume with [`pack`]),
//! which streams into an upload server.

pub mod apiserver;
pub mod cloner;
pub mod pack;
pub mod pki;
pub mod proxy;
pub mod rotation;
pub mod server;
pub mod token;
pub mod tokenapi;
pub mod webhook;
