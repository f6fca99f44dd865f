//! Taints and tolerations, matched as the scheduler matches them.

use k8s_openapi::api::core::v1::{Taint, Toleration};

/// Whether `toleration` tolerates `taint`, as Kubernetes matches them: an empty effect matches
/// every effect; `Exists` with an empty key tolerates every taint; otherwise the keys are equal
/// and, unless `Exists`, the values too.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect_ok = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let exists = toleration.operator.as_deref() == Some("Exists");
    let key = toleration.key.as_deref().unwrap_or("");
    let key_ok = (key.is_empty() && exists) || key == taint.key;
    let value_ok =
        exists || toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("");
    effect_ok && key_ok && value_ok
}
