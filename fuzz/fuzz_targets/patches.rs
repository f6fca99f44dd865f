//! JSON, merge and strategic merge patches as the API server applies them to a stored object.
#![no_main]

use kubesim::apiserver::patch::{PatchKind, apply};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    let kind = match kind % 3 {
        0 => PatchKind::Json,
        1 => PatchKind::Merge,
        _ => PatchKind::Strategic,
    };
    let current = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"a": "b"}, "finalizers": ["x"]},
        "spec": {"containers": [{"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}]}],
            "volumes": [{"name": "v", "emptyDir": {}}]}});
    let _ = apply(kind, &current, body);
});
