//! cdi-upload: the upload path. Its [`token`]s — what `cdi apiserver` signs for an
//! UploadTokenRequest (and the DataVolume webhook for a clone), and what the upload proxy and
//! the clone controller check —, the token API's logic ([`tokenapi`]), and the upload server
//! each upload pod runs ([`server`]).

pub mod pki;
pub mod server;
pub mod token;
pub mod tokenapi;
