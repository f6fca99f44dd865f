//! Kubernetes quantities (`10Gi`, `1.5e3`, `500m`): parsed or refused, and what parses prints
//! back to the same value.
#![no_main]

use cdi_core::Quantity;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let Ok(q) = text.parse::<Quantity>() else {
        return;
    };
    let printed = q.to_string();
    let again: Quantity = printed
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which does not parse: {e}"));
    assert_eq!(again.value(), q.value(), "{text:?} -> {printed:?}");
});
