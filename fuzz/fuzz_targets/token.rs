//! A token as the upload proxy receives it from anyone on the network: checked against a key,
//! never a panic, and accepted only if that key signed it (none of these inputs is).
#![no_main]

use std::sync::OnceLock;

use cdi_pki::token::{API_ISSUER, Validator, generate_key};
use libfuzzer_sys::fuzz_target;

fn validator() -> &'static Validator {
    static V: OnceLock<Validator> = OnceLock::new();
    V.get_or_init(|| {
        let (_, public) = generate_key().expect("a key");
        Validator::new(API_ISSUER, &public).expect("a validator")
    })
}

fuzz_target!(|text: &str| {
    assert!(validator().validate(text).is_err(), "{text:?}");
});
