//! Where worker pods may run. Beyond upstream (docs/design.md#worker-pods-follow-the-first-consumer): a worker pod filling a claim bound for a
//! consumer inherits the consumer's tolerations for the taints of the node the claim was bound
//! on, so the importer can run where the VM will (upstream needs an admin to copy them into the
//! CDI resource's `spec.workload`).

use std::collections::BTreeMap;

use cdi_api::config::CDIConfig;
use cdi_api::{ann, ext};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, Taint, Toleration};
use serde::{Deserialize, Serialize};

/// The taint effects that keep a pod off a node.
const EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

pub use k8s_rules::toleration::tolerates;

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

/// The `worker-placement` value that restores upstream's placement.
pub const UPSTREAM: &str = "cdi";

fn opted_out(anns: Option<&BTreeMap<String, String>>) -> bool {
    anns.and_then(|a| a.get(ext::WORKER_PLACEMENT))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(UPSTREAM))
}

/// The event when a `worker-placement` value is not one.
pub const ERR_PLACEMENT: &str = "ErrWorkerPlacement";

/// Why `anns`' `worker-placement` value (on the object `what`) is not one, with the fix.
pub fn placement_refused(anns: Option<&BTreeMap<String, String>>, what: &str) -> Option<String> {
    let value = anns?.get(ext::WORKER_PLACEMENT)?;
    (!value.trim().eq_ignore_ascii_case(UPSTREAM)).then(|| {
        format!(
            "the {} annotation of {what} is {value:?}, which cdi-rs does not know: its worker \
             pods follow their first consumer; write \"{UPSTREAM}\" for upstream's placement, \
             or remove the annotation",
            ext::WORKER_PLACEMENT
        )
    })
}

/// Whether the worker pods of `claim` follow its first consumer: unless the claim (from its
/// DataVolume) or the CDIConfig says `cdi-rs.dev/worker-placement: "cdi"`.
pub fn follows_consumer(claim: &PersistentVolumeClaim, config: Option<&CDIConfig>) -> bool {
    !opted_out(claim.metadata.annotations.as_ref())
        && !opted_out(config.and_then(|c| c.metadata.annotations.as_ref()))
}

/// What a claim's worker pods inherit, recorded on the claim when its node was selected: kept
/// when the consumer is gone, and visible (`kubectl get pvc -o yaml`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Inherited {
    /// The consumer pod the node was selected for; none when no pod mounting the claim was
    /// found then (a node selected by hand, or a consumer already gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
    /// The selected node whose taints the tolerations are for.
    pub node: String,
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
}

impl Inherited {
    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// One line for people: which tolerations, from whom, for which node.
    pub fn describe(&self) -> String {
        let who = self
            .consumer
            .as_deref()
            .map_or("no consumer pod".to_string(), |c| format!("pod {c}"));
        if self.tolerations.is_empty() {
            return format!("no tolerations from {who} for node {}", self.node);
        }
        let list: Vec<String> = self.tolerations.iter().map(describe_toleration).collect();
        format!(
            "toleration{} {} from {who} for node {}",
            if list.len() == 1 { "" } else { "s" },
            list.join(", "),
            self.node
        )
    }
}

/// `key=value:Effect`, `key:Effect` (Exists), or `*` for a toleration of every taint.
fn describe_toleration(t: &Toleration) -> String {
    let key = t.key.as_deref().unwrap_or("");
    let exists = t.operator.as_deref() == Some("Exists");
    let mut out = match (key.is_empty(), exists) {
        (true, _) => "*".to_string(),
        (false, true) => key.to_string(),
        (false, false) => format!("{key}={}", t.value.as_deref().unwrap_or("")),
    };
    if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty()) {
        out.push(':');
        out.push_str(effect);
    }
    out
}

/// The record on `claim`: `Ok(None)` when there is none, `Err` with the fix when the annotation
/// is not one (anyone may write a claim's annotations).
pub fn recorded(claim: &PersistentVolumeClaim) -> Result<Option<Inherited>, String> {
    let Some(text) = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ext::WORKER_TOLERATIONS))
    else {
        return Ok(None);
    };
    serde_json::from_str(text).map(Some).map_err(|e| {
        format!(
            "the annotation {} of claim {}/{} is not a record of inherited tolerations ({e}); \
             its worker pods inherit none: remove the annotation to have it recorded again",
            ext::WORKER_TOLERATIONS,
            claim.metadata.namespace.as_deref().unwrap_or(""),
            claim.metadata.name.as_deref().unwrap_or("")
        )
    })
}

/// The node to record the inheritance for, when it is due now: the claim's workers follow its
/// consumer, its node was selected, nothing is recorded yet, and it is not PVC prime (which
/// carries its target's record).
pub fn to_record(claim: &PersistentVolumeClaim, config: Option<&CDIConfig>) -> Option<String> {
    let anns = claim.metadata.annotations.as_ref()?;
    if anns.contains_key(ext::WORKER_TOLERATIONS)
        || anns.contains_key(ann::POPULATOR_KIND)
        || !follows_consumer(claim, config)
    {
        return None;
    }
    anns.get(ann::SELECTED_NODE)
        .filter(|n| !n.is_empty())
        .cloned()
}

/// Whether `pod` names claim `claim` among its volumes.
pub(crate) fn mounts(pod: &Pod, claim: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .any(|v| {
            v.persistent_volume_claim
                .as_ref()
                .is_some_and(|c| c.claim_name == claim)
        })
}

/// The pod the claim's node was selected for: of the pods in its namespace that mount it and are
/// not placed elsewhere, the one on the node, else a temporary provisioning pod (KubeVirt's, or
/// cdi-rs's first consumer), else the oldest still unscheduled. The scheduler says nowhere which
/// pod it was; this is the pod that would have been.
pub fn consumer_of<'a>(
    claim: &PersistentVolumeClaim,
    node: &str,
    pods: &'a [Pod],
) -> Option<&'a Pod> {
    let name = claim.metadata.name.as_deref()?;
    let ns = claim.metadata.namespace.as_deref();
    let candidates = pods.iter().filter(|p| {
        p.metadata.namespace.as_deref() == ns
            && mounts(p, name)
            && p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_none_or(|n| n.is_empty() || n == node)
    });
    let rank = |p: &Pod| {
        let on_node = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
        let temporary =
            p.metadata.annotations.as_ref().is_some_and(|a| {
                a.contains_key(cdi_api::kubevirt::EPHEMERAL_PROVISIONING_ANNOTATION)
            }) || p
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(ext::FIRST_CONSUMER_FOR));
        (
            !on_node,
            !temporary,
            p.metadata.creation_timestamp.clone(),
            p.metadata.name.clone(),
        )
    };
    candidates.min_by_key(|p| rank(p))
}

/// The record for a claim whose node was selected: the consumer's tolerations for that node's
/// taints (none without a consumer, or when the node is gone).
pub fn record(node_name: &str, consumer: Option<&Pod>, node: Option<&Node>) -> Inherited {
    Inherited {
        consumer: consumer.and_then(|p| p.metadata.name.clone()),
        node: node_name.to_string(),
        tolerations: match (consumer, node) {
            (Some(p), Some(n)) => inherited_tolerations(p, n),
            _ => Vec::new(),
        },
    }
}

/// The tolerations a worker pod for `claim` inherits: the record's, when it follows its
/// consumer (`Err` when the record is unreadable; it then inherits none).
pub fn for_worker(
    claim: &PersistentVolumeClaim,
    config: Option<&CDIConfig>,
) -> Result<Vec<Toleration>, String> {
    if !follows_consumer(claim, config) {
        return Ok(Vec::new());
    }
    Ok(recorded(claim)?.map(|r| r.tolerations).unwrap_or_default())
}

/// A worker pod's tolerations: the CDI resource's `spec.workload` ones, then the inherited ones
/// it does not already have. `None` when there are none.
pub fn worker_tolerations(
    workload: Option<&[Toleration]>,
    inherited: &[Toleration],
) -> Option<Vec<Toleration>> {
    let mut out: Vec<Toleration> = workload.unwrap_or_default().to_vec();
    for t in inherited {
        if !out.contains(t) {
            out.push(t.clone());
        }
    }
    (!out.is_empty()).then_some(out)
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

    fn claim(anns: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "disk", "namespace": "vms",
            "annotations": anns}}))
        .unwrap()
    }

    fn pod(name: &str, extra: serde_json::Value) -> Pod {
        let mut p = json!({"metadata": {"name": name, "namespace": "vms",
            "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [],
                "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "disk"}}]}});
        json_patch(&mut p, extra);
        serde_json::from_value(p).unwrap()
    }

    fn json_patch(into: &mut serde_json::Value, from: serde_json::Value) {
        match (into, from) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    json_patch(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    #[test]
    fn the_record_is_due_once_the_node_is_selected_unless_opted_out() {
        let selected = json!({"volume.kubernetes.io/selected-node": "node-2"});
        assert_eq!(
            to_record(&claim(selected.clone()), None).as_deref(),
            Some("node-2")
        );
        assert_eq!(to_record(&claim(json!({})), None), None);
        // Recorded already, or PVC prime (its target's record is copied), or opted out.
        let mut done = selected.clone();
        done[ext::WORKER_TOLERATIONS] = json!("{\"node\":\"node-2\"}");
        assert_eq!(to_record(&claim(done), None), None);
        let mut prime = selected.clone();
        prime[ann::POPULATOR_KIND] = json!("VolumeImportSource");
        assert_eq!(to_record(&claim(prime), None), None);
        let mut out = selected.clone();
        out[ext::WORKER_PLACEMENT] = json!("CDI");
        assert_eq!(to_record(&claim(out), None), None);
        let config: CDIConfig = serde_json::from_value(json!({"metadata": {"name": "config",
            "annotations": {(ext::WORKER_PLACEMENT): "cdi"}}, "spec": {}}))
        .unwrap();
        assert_eq!(to_record(&claim(selected.clone()), Some(&config)), None);
        // Any other value keeps the default, and is refused with the fix.
        let mut other = selected;
        other[ext::WORKER_PLACEMENT] = json!("consumer");
        let other = claim(other);
        assert!(follows_consumer(&other, None));
        let why = placement_refused(other.metadata.annotations.as_ref(), "DataVolume vms/disk");
        assert!(why.unwrap().contains("DataVolume vms/disk is \"consumer\""));
        let fine = claim(json!({(ext::WORKER_PLACEMENT): " cdi "}));
        assert_eq!(
            placement_refused(fine.metadata.annotations.as_ref(), "x"),
            None
        );
    }

    #[test]
    fn the_consumer_is_the_pod_on_the_node_then_a_temporary_one_then_the_oldest() {
        let c = claim(json!({}));
        let elsewhere = pod("elsewhere", json!({"spec": {"nodeName": "node-1"}}));
        let other_claim = pod(
            "other",
            json!({"spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "x"}}]}}),
        );
        let young = pod(
            "young",
            json!({"metadata": {"creationTimestamp": "2026-02-01T00:00:00Z"}}),
        );
        let old = pod("old", json!({}));
        let temporary = pod(
            "virt-launcher-tmp",
            json!({"metadata": {"creationTimestamp": "2026-03-01T00:00:00Z",
                "annotations": {"kubevirt.io/ephemeral-provisioning": "true"}}}),
        );
        let placed = pod(
            "placed",
            json!({"metadata": {"creationTimestamp": "2026-04-01T00:00:00Z"},
                "spec": {"nodeName": "node-2"}}),
        );
        let name = |p: Option<&Pod>| p.and_then(|p| p.metadata.name.clone());
        let mut pods = vec![elsewhere.clone(), other_claim, young.clone(), old];
        assert_eq!(
            name(consumer_of(&c, "node-2", &pods)).as_deref(),
            Some("old")
        );
        pods.push(temporary);
        assert_eq!(
            name(consumer_of(&c, "node-2", &pods)).as_deref(),
            Some("virt-launcher-tmp")
        );
        pods.push(placed);
        assert_eq!(
            name(consumer_of(&c, "node-2", &pods)).as_deref(),
            Some("placed")
        );
        assert_eq!(consumer_of(&c, "node-2", &[elsewhere]), None);
        // Another namespace's pod mounting a claim of the same name is not this claim's.
        let mut foreign = young;
        foreign.metadata.namespace = Some("other".into());
        assert_eq!(consumer_of(&c, "node-2", &[foreign]), None);
    }

    #[test]
    fn records_round_trip_and_garbage_is_refused_with_the_fix() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-2"},
            "spec": {"taints": [{"key": "virt-local", "value": "true", "effect": "NoSchedule"}]}}))
        .unwrap();
        let consumer = pod(
            "virt-launcher-tmp",
            json!({"spec": {"tolerations": [
                {"key": "virt-local", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
                {"key": "gpu", "operator": "Exists"}]}}),
        );
        let r = record("node-2", Some(&consumer), Some(&node));
        assert_eq!(r.tolerations.len(), 1);
        assert_eq!(
            r.describe(),
            "toleration virt-local=true:NoSchedule from pod virt-launcher-tmp for node node-2"
        );
        let stored = claim(json!({(ext::WORKER_TOLERATIONS): r.to_annotation()}));
        assert_eq!(recorded(&stored).unwrap(), Some(r.clone()));
        assert_eq!(for_worker(&stored, None).unwrap(), r.tolerations);
        // Opted out: nothing inherited, whatever is recorded.
        let out = claim(json!({(ext::WORKER_TOLERATIONS): r.to_annotation(),
            (ext::WORKER_PLACEMENT): "cdi"}));
        assert!(for_worker(&out, None).unwrap().is_empty());
        // No consumer, or no node: an empty record, so the question is settled.
        let none = record("node-2", None, Some(&node));
        assert_eq!(
            none.describe(),
            "no tolerations from no consumer pod for node node-2"
        );
        assert!(
            record("node-2", Some(&consumer), None)
                .tolerations
                .is_empty()
        );
        for garbage in ["[", "{\"node\": 3}", "{\"node\": \"n\", \"extra\": 1}"] {
            let bad = claim(json!({(ext::WORKER_TOLERATIONS): garbage}));
            let err = recorded(&bad).unwrap_err();
            assert!(err.contains("claim vms/disk"), "{err}");
            assert!(err.contains("remove the annotation"), "{err}");
            assert!(for_worker(&bad, None).is_err());
        }
    }

    #[test]
    fn workload_tolerations_come_first_and_are_not_repeated() {
        let a = toleration(json!({"key": "a", "operator": "Exists"}));
        let b = toleration(json!({"key": "b", "operator": "Exists"}));
        assert_eq!(worker_tolerations(None, &[]), None);
        assert_eq!(
            worker_tolerations(Some(std::slice::from_ref(&a)), &[b.clone(), a.clone()]),
            Some(vec![a.clone(), b.clone()])
        );
        assert_eq!(
            worker_tolerations(None, std::slice::from_ref(&b)),
            Some(vec![b])
        );
        assert_eq!(
            describe_toleration(&toleration(json!({"operator": "Exists"}))),
            "*"
        );
        assert_eq!(
            describe_toleration(&toleration(json!({"key": "gpu", "operator": "Exists",
                "effect": "NoExecute"}))),
            "gpu:NoExecute"
        );
    }
}
