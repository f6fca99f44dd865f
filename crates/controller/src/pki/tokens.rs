//! The keys that check and make clone tokens, from the token signing key.

use cdi_pki::token::{API_ISSUER, EXTENDED_ISSUER, Signer, Validator};

use crate::runtime::error::Error;

/// The keys that check and make clone tokens (the token signing key the controller keeps).
pub struct CloneTokens {
    pub(crate) short: Validator,
    pub(crate) long: Validator,
    pub(crate) signer: Signer,
}

impl CloneTokens {
    pub fn new(private_pem: &str, public_pem: &str) -> Result<CloneTokens, Error> {
        let e = |e: cdi_pki::token::TokenError| Error::Other(format!("the token key: {e}"));
        Ok(CloneTokens {
            short: Validator::new(API_ISSUER, public_pem).map_err(e)?,
            long: Validator::new(EXTENDED_ISSUER, public_pem).map_err(e)?,
            signer: Signer::new(EXTENDED_ISSUER, private_pem).map_err(e)?,
        })
    }
}
