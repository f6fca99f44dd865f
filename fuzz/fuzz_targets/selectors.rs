//! Label and field selectors as the API server reads them from a query string.
#![no_main]

use std::collections::BTreeMap;

use kubesim::apiserver::selector::{FieldSelector, LabelSelector};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(s) = LabelSelector::parse(text) {
        let labels = BTreeMap::from([("app".to_string(), "cdi".to_string())]);
        let _ = s.matches(&labels);
    }
    if let Ok(s) = FieldSelector::parse(text) {
        let _ = s.matches(
            &serde_json::json!({"metadata": {"name": "a", "namespace": "b"},
            "status": {"phase": "Bound"}}),
        );
    }
});
