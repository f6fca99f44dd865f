//! The ResourceQuota admission plugin, for pods and claims: a create that would take a
//! namespace's usage past a quota's `hard` limit is refused as kube-apiserver refuses it
//! (403, `exceeded quota: NAME, requested: …, used: …, limited: …`), and a pod whose containers
//! leave out a compute resource a quota limits is refused with `failed quota: NAME: must
//! specify …`. Usage is counted from the stored objects at each create: pods that have not
//! ended, and every claim. Quotas with `scopes` or a `scopeSelector` are not enforced, and
//! `status.used` is not kept (kube's quota controller does that).

use std::collections::BTreeMap;

use k8s_rules::Quantity;
use serde_json::Value;

use super::errors::ApiError;
use super::store::{ListOptions, Store};

/// The compute resources a pod's containers must state when a quota limits them, with what
/// each reads: (quota key, requests or limits, resource).
const COMPUTE: [(&str, &str, &str); 6] = [
    ("cpu", "requests", "cpu"),
    ("requests.cpu", "requests", "cpu"),
    ("memory", "requests", "memory"),
    ("requests.memory", "requests", "memory"),
    ("limits.cpu", "limits", "cpu"),
    ("limits.memory", "limits", "memory"),
];

fn quantity(v: &Value) -> Option<Quantity> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.to_string().parse().ok(),
        _ => None,
    }
}

/// What one object uses, by quota key.
type Usage = BTreeMap<String, Quantity>;

/// What one pod uses of each quota key: its containers' sum, or the largest init container's
/// when that is more (the pod needs that much while it runs).
fn pod_usage(pod: &Value) -> Usage {
    let sum = |list: &Value, kind: &str, resource: &str| {
        list.as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| quantity(&c["resources"][kind][resource]))
            .fold(Quantity::from_bytes(0), |a, q| a.plus(&q))
    };
    let most = |list: &Value, kind: &str, resource: &str| {
        list.as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| quantity(&c["resources"][kind][resource]))
            .max_by(|a, b| a.nanos().cmp(&b.nanos()))
    };
    let mut used = BTreeMap::new();
    for (key, kind, resource) in COMPUTE {
        let mut q = sum(&pod["spec"]["containers"], kind, resource);
        if let Some(init) = most(&pod["spec"]["initContainers"], kind, resource)
            && init.nanos() > q.nanos()
        {
            q = init;
        }
        used.insert(key.to_string(), q);
    }
    for key in ["pods", "count/pods"] {
        used.insert(key.to_string(), Quantity::from_bytes(1));
    }
    used
}

/// What one claim uses: its request, in total and for its class, and one claim.
fn claim_usage(claim: &Value) -> Usage {
    let request = quantity(&claim["spec"]["resources"]["requests"]["storage"])
        .unwrap_or_else(|| Quantity::from_bytes(0));
    let mut used = BTreeMap::new();
    used.insert("requests.storage".to_string(), request);
    for key in ["persistentvolumeclaims", "count/persistentvolumeclaims"] {
        used.insert(key.to_string(), Quantity::from_bytes(1));
    }
    if let Some(class) = claim["spec"]["storageClassName"].as_str() {
        let per = format!("{class}.storageclass.storage.k8s.io/");
        used.insert(format!("{per}requests.storage"), request);
        used.insert(
            format!("{per}persistentvolumeclaims"),
            Quantity::from_bytes(1),
        );
    }
    used
}

fn ended(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

fn pretty(map: &BTreeMap<String, Quantity>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Refuse creating `obj` (a pod or claim, `plural`) in `ns` when a quota there forbids it.
pub fn admit(store: &Store, plural: &str, ns: &str, obj: &Value) -> Result<(), ApiError> {
    if plural != "pods" && plural != "persistentvolumeclaims" {
        return Ok(());
    }
    let Some(quotas) = store.registry().get("", "v1", "resourcequotas").cloned() else {
        return Ok(());
    };
    let (quotas, _, _) = store.list(&quotas, Some(ns), &ListOptions::default());
    let quotas: Vec<&Value> = quotas
        .iter()
        .filter(|q| {
            q["spec"]["hard"].as_object().is_some_and(|h| !h.is_empty())
                && q["spec"]["scopes"].as_array().is_none_or(|s| s.is_empty())
                && q["spec"]["scopeSelector"].is_null()
        })
        .collect();
    if quotas.is_empty() {
        return Ok(());
    }
    let name = obj["metadata"]["name"]
        .as_str()
        .or_else(|| obj["metadata"]["generateName"].as_str())
        .unwrap_or("");
    let forbidden =
        |why: String| ApiError::forbidden(format!("{plural} {name:?} is forbidden: {why}"));
    let (requested, usage): (Usage, fn(&Value) -> Usage) = if plural == "pods" {
        (pod_usage(obj), pod_usage)
    } else {
        (claim_usage(obj), claim_usage)
    };
    let def = store
        .registry()
        .get("", "v1", plural)
        .cloned()
        .ok_or_else(ApiError::path_not_found)?;
    let (existing, _, _) = store.list(&def, Some(ns), &ListOptions::default());
    let mut used: BTreeMap<String, Quantity> = BTreeMap::new();
    for o in existing.iter().filter(|o| plural != "pods" || !ended(o)) {
        for (k, q) in usage(o) {
            let sum = used.get(&k).map_or(q, |u| u.plus(&q));
            used.insert(k, sum);
        }
    }
    for quota in quotas {
        let quota_name = quota["metadata"]["name"].as_str().unwrap_or("");
        let hard = quota["spec"]["hard"].as_object().unwrap();
        if plural == "pods" {
            // Every container states each compute resource the quota limits.
            let mut missing: Vec<&str> = COMPUTE
                .iter()
                .filter(|(key, _, _)| hard.contains_key(*key))
                .filter(|(_, kind, resource)| {
                    obj["spec"]["containers"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| quantity(&c["resources"][*kind][*resource]).is_none())
                })
                .map(|(key, _, _)| *key)
                .collect();
            missing.sort_unstable();
            if !missing.is_empty() {
                return Err(forbidden(format!(
                    "failed quota: {quota_name}: must specify {}",
                    missing.join(",")
                )));
            }
        }
        let mut over_requested = BTreeMap::new();
        let mut over_used = BTreeMap::new();
        let mut over_hard = BTreeMap::new();
        for (key, limit) in hard {
            let (Some(limit), Some(asked)) = (quantity(limit), requested.get(key)) else {
                continue;
            };
            let now = used
                .get(key)
                .cloned()
                .unwrap_or_else(|| Quantity::from_bytes(0));
            if now.plus(asked).nanos() > limit.nanos() {
                over_requested.insert(key.clone(), *asked);
                over_used.insert(key.clone(), now);
                over_hard.insert(key.clone(), limit);
            }
        }
        if !over_requested.is_empty() {
            return Err(forbidden(format!(
                "exceeded quota: {quota_name}, requested: {}, used: {}, limited: {}",
                pretty(&over_requested),
                pretty(&over_used),
                pretty(&over_hard)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_uses_its_containers_or_its_largest_init_container() {
        let pod = json!({"spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
                {"resources": {"requests": {"cpu": "200m"}, "limits": {"cpu": "1"}}},
            ],
            "initContainers": [{"resources": {"requests": {"memory": "1Gi"}}}],
        }});
        let u = pod_usage(&pod);
        assert_eq!(u["requests.cpu"].to_string(), "300m");
        assert_eq!(u["cpu"].to_string(), "300m");
        assert_eq!(u["requests.memory"].to_string(), "1Gi");
        assert_eq!(u["limits.cpu"].to_string(), "1");
        assert_eq!(u["pods"].to_string(), "1");
        let claim = json!({"spec": {"storageClassName": "fast",
            "resources": {"requests": {"storage": "10Gi"}}}});
        let u = claim_usage(&claim);
        assert_eq!(
            u["fast.storageclass.storage.k8s.io/requests.storage"].to_string(),
            "10Gi"
        );
    }
}
