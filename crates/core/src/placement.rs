//! Where worker pods may run. Beyond upstream (SPEC §9): a worker pod filling a claim bound for a
//! consumer inherits the consumer's tolerations for the taints of the node the claim was bound
//! on, so the importer can run where the VM will (upstream needs an admin to copy them into the
//! CDI resource's `spec.workload`).

use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};

/// The taint effects that keep a pod off a node.
const EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

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

/// The consumer's tolerations a worker pod on `node` inherits: those that tolerate one of the
/// node's scheduling taints, and no other (a toleration for another node's taint, or a broad
/// one matching nothing here, is not the consumer's business on this node).
pub fn inherited_tolerations(consumer: &Pod, node: &Node) -> Vec<Toleration> {
    let taints: Vec<&Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| EFFECTS.contains(&t.effect.as_str()))
        .collect();
    consumer
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .into_iter()
        .flatten()
        .filter(|tol| taints.iter().any(|taint| tolerates(tol, taint)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: Some(value.into()),
            effect: effect.into(),
            ..Default::default()
        }
    }

    fn toleration(v: serde_json::Value) -> Toleration {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn tolerations_match_as_kubernetes_does() {
        let t = taint("k", "v", "NoSchedule");
        let rows = [
            (
                json!({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}),
                true,
            ),
            (json!({"key": "k", "value": "v"}), true),
            (json!({"key": "k", "operator": "Exists"}), true),
            (json!({"operator": "Exists"}), true),
            (json!({"key": "k", "value": "w"}), false),
            (
                json!({"key": "k", "operator": "Exists", "effect": "NoExecute"}),
                false,
            ),
            (json!({"key": "other", "operator": "Exists"}), false),
        ];
        for (tol, want) in rows {
            assert_eq!(tolerates(&toleration(tol.clone()), &t), want, "{tol}");
        }
    }

    #[test]
    fn only_tolerations_for_the_nodes_taints_are_inherited() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-2"},
            "spec": {"taints": [
                {"key": "virt-local", "value": "true", "effect": "NoSchedule"},
                {"key": "gpu", "value": "a100", "effect": "NoExecute"}]}}))
        .unwrap();
        let consumer: Pod = serde_json::from_value(json!({"metadata": {"name": "virt-launcher"},
            "spec": {"containers": [], "tolerations": [
                {"key": "virt-local", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
                {"key": "gpu", "operator": "Exists"},
                {"key": "elsewhere", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                    "effect": "NoExecute", "tolerationSeconds": 300}]}}))
        .unwrap();
        let keys: Vec<String> = inherited_tolerations(&consumer, &node)
            .into_iter()
            .filter_map(|t| t.key)
            .collect();
        assert_eq!(keys, ["virt-local", "gpu"]);
        // An untainted node inherits nothing.
        let plain: Node = serde_json::from_value(json!({"metadata": {"name": "node-1"}})).unwrap();
        assert!(inherited_tolerations(&consumer, &plain).is_empty());
    }
}
