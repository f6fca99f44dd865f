//! cdi-upload: the upload path. So far its [`token`]s — what `cdi apiserver` signs for an
//! UploadTokenRequest (and the DataVolume webhook for a clone), and what the upload proxy and
//! the clone controller check — and the token API's logic ([`tokenapi`]).

pub mod token;
pub mod tokenapi;
