//! A worker pod's termination message, as the controller reads it from the pod's status (anyone
//! who can write the status can write it): parsed, and what it says printed back the same.
#![no_main]

use cdi_api::TerminationMessage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let m = TerminationMessage::parse(text);
    let _ = m.is_fatal();
    let again = TerminationMessage::parse(&m.to_json());
    assert_eq!(again.to_json(), m.to_json(), "{text:?}");
});
