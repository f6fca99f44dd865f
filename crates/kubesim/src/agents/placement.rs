//! What the scheduler and the PV controller both decide by: whether a node satisfies a node
//! selector (a pod's required affinity, a volume's node affinity), and whether a volume can hold
//! a claim.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelector, NodeSelectorRequirement, PersistentVolume, PersistentVolumeClaim,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_rules::Quantity;

use super::name;
use crate::apiserver::selector::Requirement;

fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match req.operator.as_str() {
        "Gt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v > x)
        }
        "Lt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v < x)
        }
        // The set-based operators mean what they mean in label selectors.
        op => Requirement::from_expression(&req.key, op, values).is_some_and(|r| r.holds(value)),
    }
}

/// Whether `node` satisfies a node selector (terms ORed, requirements within a term ANDed).
pub fn selector_matches(selector: &NodeSelector, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    selector.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        (!exprs.is_empty() || !fields.is_empty())
            && exprs
                .iter()
                .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
            && fields
                .iter()
                .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(name(node))))
    })
}

pub(crate) fn storage(map: Option<&BTreeMap<String, K8sQuantity>>) -> Option<i128> {
    map?.get("storage")
        .and_then(|q| Quantity::try_from(q).ok())
        .map(|q| q.milli_value())
}

fn volume_mode(mode: Option<&String>) -> &str {
    mode.map(String::as_str).unwrap_or("Filesystem")
}

/// Why `volume` cannot hold `claim`, or `None` when it can (ignoring who it is bound to).
pub fn misfit(claim: &PersistentVolumeClaim, volume: &PersistentVolume) -> Option<String> {
    let (Some(cs), Some(vs)) = (claim.spec.as_ref(), volume.spec.as_ref()) else {
        return Some("no spec".into());
    };
    let claim_class = cs.storage_class_name.as_deref().unwrap_or("");
    let volume_class = vs.storage_class_name.as_deref().unwrap_or("");
    if claim_class != volume_class {
        return Some(format!(
            "storage class {volume_class:?} is not the claim's {claim_class:?}"
        ));
    }
    let wanted = storage(cs.resources.as_ref().and_then(|r| r.requests.as_ref())).unwrap_or(0);
    let offered = storage(vs.capacity.as_ref()).unwrap_or(0);
    if offered < wanted {
        return Some("capacity is smaller than the claim's request".into());
    }
    let modes = vs.access_modes.as_deref().unwrap_or_default();
    if let Some(m) = cs
        .access_modes
        .iter()
        .flatten()
        .find(|m| !modes.contains(m))
    {
        return Some(format!("access mode {m} is not offered"));
    }
    if volume_mode(cs.volume_mode.as_ref()) != volume_mode(vs.volume_mode.as_ref()) {
        return Some("volume mode differs".into());
    }
    if let Some(sel) = &cs.selector {
        let labels = volume.metadata.labels.clone().unwrap_or_default();
        if !crate::apiserver::selector::selects(sel, &labels) {
            return Some("labels do not match the claim's selector".into());
        }
    }
    None
}
