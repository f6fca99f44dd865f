//! Scheduling decisions, as kube-scheduler makes them for the cases the development cluster
//! needs: node selector, required node affinity, taints and tolerations, resource requests,
//! the node affinity of bound volumes, and claims of WaitForFirstConsumer classes (which are
//! provisioned where the pod goes). Pure: the loop around it reads and writes the objects.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, Pod, PodSpec, Taint, Toleration,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_rules::Quantity;

use super::placement::misfit;
pub use super::placement::selector_matches;

/// What the scheduler sees.
#[derive(Debug, Clone, Copy)]
pub struct ClusterView<'a> {
    pub nodes: &'a [Node],
    /// What the pods on each node already use.
    pub usage: &'a Usage,
    /// Claims in the pod's namespace.
    pub claims: &'a [PersistentVolumeClaim],
    pub volumes: &'a [PersistentVolume],
    pub classes: &'a [StorageClass],
}

impl Default for ClusterView<'_> {
    fn default() -> Self {
        static NONE: Usage = Usage(BTreeMap::new());
        ClusterView {
            nodes: &[],
            usage: &NONE,
            claims: &[],
            volumes: &[],
            classes: &[],
        }
    }
}

/// What the unfinished pods on each node request: computed once for a pass rather than from
/// every pod for every node and every pending pod (which made a pass quadratic in pods).
#[derive(Debug, Clone, Default)]
pub struct Usage(BTreeMap<String, Used>);

/// (pods, milli-CPU, memory bytes)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Used {
    pub pods: i64,
    pub cpu: i128,
    pub memory: i128,
}

impl Usage {
    pub fn of(pods: &[Pod]) -> Usage {
        let mut usage = Usage::default();
        for p in pods {
            let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
            let finished = matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            );
            if let Some(node) = node.filter(|n| !n.is_empty())
                && !finished
            {
                usage.add(node, p);
            }
        }
        usage
    }

    /// Count `pod` on `node` (one just bound there).
    pub fn add(&mut self, node: &str, pod: &Pod) {
        let (cpu, memory) = requests(pod);
        let used = self.0.entry(node.to_string()).or_default();
        used.pods += 1;
        used.cpu += cpu;
        used.memory += memory;
    }

    pub fn on(&self, node: &str) -> Used {
        self.0.get(node).copied().unwrap_or_default()
    }
}

/// The decision for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Bind to `node`; first set `volume.kubernetes.io/selected-node` on `select_for` (unbound
    /// claims of WaitForFirstConsumer classes) and wait for them to bind.
    Bind {
        node: String,
        select_for: Vec<String>,
    },
    /// No node fits; the message is what `PodScheduled=False, Unschedulable` says.
    Unschedulable { message: String },
}

fn node_name(n: &Node) -> &str {
    n.metadata.name.as_deref().unwrap_or("")
}

fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations
        .iter()
        .any(|t| k8s_rules::toleration::tolerates(t, taint))
}

/// (milli-CPU, memory bytes) a pod requests.
fn requests(pod: &Pod) -> (i128, i128) {
    let mut cpu = 0;
    let mut mem = 0;
    for c in pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
    {
        let r = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        cpu += r
            .and_then(|r| r.get("cpu"))
            .and_then(|q| Quantity::try_from(q).ok())
            .map(|q| q.milli_value())
            .unwrap_or(0);
        mem += r
            .and_then(|r| r.get("memory"))
            .and_then(|q| Quantity::try_from(q).ok())
            .map(|q| q.value() as i128)
            .unwrap_or(0);
    }
    (cpu, mem)
}

fn allocatable(node: &Node, name: &str) -> Option<Quantity> {
    node.status
        .as_ref()?
        .allocatable
        .as_ref()?
        .get(name)
        .and_then(|q| Quantity::try_from(q).ok())
}

/// The claims a pod mounts.
pub fn claim_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|v| {
            v.persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.clone())
        })
        .collect()
}

/// The claims of a pod, as scheduling sees them.
struct PodClaims<'a> {
    /// Unbound claims of WaitForFirstConsumer classes: to be given the chosen node.
    select_for: Vec<String>,
    /// Those of classes without a provisioner: only a node with a free volume that fits will do
    /// (nothing will be made for them).
    static_claims: Vec<&'a PersistentVolumeClaim>,
    /// The volumes of the bound ones, whose node affinity the node must satisfy.
    bound_volumes: Vec<&'a PersistentVolume>,
}

impl<'a> PodClaims<'a> {
    /// The pod's claims, or why no node will do: a missing claim, one being deleted, or an
    /// unbound Immediate claim stops the pod everywhere.
    fn of(pod: &Pod, view: &ClusterView<'a>) -> Result<PodClaims<'a>, String> {
        let mut claims = PodClaims {
            select_for: Vec::new(),
            static_claims: Vec::new(),
            bound_volumes: Vec::new(),
        };
        for name in claim_names(pod) {
            let Some(claim) = view
                .claims
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(name.as_str()))
            else {
                return Err(format!("persistentvolumeclaim \"{name}\" not found."));
            };
            if claim.metadata.deletion_timestamp.is_some() {
                return Err(format!(
                    "persistentvolumeclaim \"{name}\" is being deleted."
                ));
            }
            let volume_name = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .filter(|v| !v.is_empty());
            let bound = volume_name.and_then(|v| {
                view.volumes
                    .iter()
                    .find(|pv| pv.metadata.name.as_deref() == Some(v))
            });
            if let Some(pv) = bound {
                claims.bound_volumes.push(pv);
                continue;
            }
            let class = claim
                .spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref());
            let class = class.and_then(|c| {
                view.classes
                    .iter()
                    .find(|sc| sc.metadata.name.as_deref() == Some(c))
            });
            let wffc = class.and_then(|sc| sc.volume_binding_mode.as_deref())
                == Some("WaitForFirstConsumer");
            if class.is_some_and(|sc| sc.provisioner == "kubernetes.io/no-provisioner") {
                claims.static_claims.push(claim);
            }
            if !wffc {
                return Err("pod has unbound immediate PersistentVolumeClaims.".into());
            }
            claims.select_for.push(name);
        }
        Ok(claims)
    }
}

/// Decide where `pod` goes.
pub fn schedule(pod: &Pod, view: &ClusterView<'_>) -> Decision {
    let total = view.nodes.len();
    let unschedulable = |message: String| Decision::Unschedulable { message };
    let claims = match PodClaims::of(pod, view) {
        Ok(claims) => claims,
        Err(why) => return unschedulable(format!("0/{total} nodes are available: {why}")),
    };
    let spec = pod.spec.clone().unwrap_or_default();
    let wanted = requests(pod);
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut feasible: Vec<(&Node, usize)> = Vec::new();
    for node in view.nodes {
        let used = view.usage.on(node_name(node));
        let reason = placement_conflict(node, &spec)
            .or_else(|| shortage(node, used, wanted))
            .or_else(|| volume_conflict(node, view, &claims));
        match reason {
            Some(r) => *reasons.entry(r).or_default() += 1,
            None => feasible.push((node, used.pods as usize)),
        }
    }
    // Fewest pods first, then by name: simple and deterministic.
    feasible.sort_by(|a, b| {
        a.1.cmp(&b.1)
            .then_with(|| node_name(a.0).cmp(node_name(b.0)))
    });
    match feasible.first() {
        Some((node, _)) => Decision::Bind {
            node: node_name(node).to_string(),
            select_for: claims.select_for,
        },
        None => {
            let parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
            unschedulable(format!(
                "0/{total} nodes are available: {}. preemption: 0/{total} nodes are available: {total} Preemption is not helpful for scheduling.",
                parts.join(", ")
            ))
        }
    }
}

/// Why the pod may not go to `node` by its own placement rules (the node it names, the node
/// being cordoned, its node selector and required affinity, untolerated taints), in
/// kube-scheduler's words.
fn placement_conflict(node: &Node, spec: &PodSpec) -> Option<String> {
    let name = node_name(node);
    if let Some(wanted) = spec.node_name.as_deref().filter(|n| !n.is_empty())
        && wanted != name
    {
        return Some("node(s) didn't match the requested node name".to_string());
    }
    let node_spec = node.spec.as_ref();
    if node_spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return Some("node(s) were unschedulable".to_string());
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let affinity = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let affinity_ok = affinity.is_none_or(|sel| selector_matches(sel, node));
    if !(selector_ok && affinity_ok) {
        return Some("node(s) didn't match Pod's node affinity/selector".to_string());
    }
    let tolerations = spec.tolerations.clone().unwrap_or_default();
    node_spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !tolerates(&tolerations, t))
        .map(|t| {
            format!(
                "node(s) had untolerated taint {{{}: {}}}",
                t.key,
                t.value.as_deref().unwrap_or("")
            )
        })
}

/// What `node` lacks for the pod's requests `(milli-CPU, memory)` beside what it `used`.
fn shortage(node: &Node, used: Used, (cpu, mem): (i128, i128)) -> Option<String> {
    if allocatable(node, "pods").is_some_and(|max| used.pods + 1 > max.value()) {
        Some("Too many pods".to_string())
    } else if allocatable(node, "cpu").is_some_and(|max| used.cpu + cpu > max.milli_value()) {
        Some("Insufficient cpu".to_string())
    } else if allocatable(node, "memory").is_some_and(|max| used.memory + mem > max.value() as i128)
    {
        Some("Insufficient memory".to_string())
    } else {
        None
    }
}

/// Why the pod's volumes keep it off `node`: a bound volume's node affinity, or no free volume
/// there for a claim of a class without a provisioner.
fn volume_conflict(node: &Node, view: &ClusterView<'_>, claims: &PodClaims<'_>) -> Option<String> {
    let affinity_conflict = claims
        .bound_volumes
        .iter()
        .filter_map(|pv| pv.spec.as_ref()?.node_affinity.as_ref()?.required.as_ref())
        .any(|sel| !selector_matches(sel, node));
    if affinity_conflict {
        return Some("node(s) had volume node affinity conflict".to_string());
    }
    let free_here = |claim: &PersistentVolumeClaim| {
        view.volumes.iter().any(|pv| {
            let spec = pv.spec.as_ref();
            spec.is_some_and(|s| s.claim_ref.is_none())
                && misfit(claim, pv).is_none()
                && spec
                    .and_then(|s| s.node_affinity.as_ref()?.required.as_ref())
                    .is_none_or(|sel| selector_matches(sel, node))
        })
    };
    (!claims.static_claims.iter().all(|c| free_here(c)))
        .then(|| "node(s) didn't find available persistent volumes to bind".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::nodes::default_nodes;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "default"}, "spec": spec}),
        )
        .unwrap()
    }

    fn containers() -> serde_json::Value {
        json!([{"name": "c", "image": "x"}])
    }

    fn nodes() -> Vec<Node> {
        default_nodes()
            .iter()
            .enumerate()
            .map(|(i, n)| n.node(i))
            .collect()
    }

    /// Requests of unfinished pods count against their node, once per pass; a pod bound in the
    /// pass counts for the next; the emptiest node that fits wins.
    #[test]
    fn requests_fill_nodes_and_finished_pods_free_them() {
        let nodes = nodes();
        let on = |node: &str, cpu: &str, phase: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "x"},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x",
                    "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]},
                "status": {"phase": phase}}))
            .unwrap()
        };
        // node-1 and node-3 (node-2 is tainted) have 8 CPUs each.
        let pods = vec![
            on("node-1", "7500m", "Running"),
            on("node-3", "4", "Running"),
            on("node-3", "4", "Succeeded"),
        ];
        let mut usage = Usage::of(&pods);
        assert_eq!(
            usage.on("node-3"),
            Used {
                pods: 1,
                cpu: 4000,
                memory: 1 << 30
            }
        );
        let wants = |cpu: &str| {
            pod(json!({"containers": [{"name": "c", "image": "x",
                "resources": {"requests": {"cpu": cpu}}}]}))
        };
        let view = ClusterView {
            nodes: &nodes,
            usage: &usage,
            ..Default::default()
        };
        assert_eq!(
            schedule(&wants("1"), &view),
            Decision::Bind {
                node: "node-3".into(),
                select_for: vec![]
            }
        );
        usage.add("node-3", &on("node-3", "3500m", "Pending"));
        let view = ClusterView {
            nodes: &nodes,
            usage: &usage,
            ..Default::default()
        };
        let Decision::Unschedulable { message } = schedule(&wants("1"), &view) else {
            panic!("both nodes are full");
        };
        assert!(message.contains("2 Insufficient cpu"), "{message}");
        assert_eq!(
            schedule(&wants("500m"), &view),
            Decision::Bind {
                node: "node-1".into(),
                select_for: vec![]
            },
            "both have 500m left: the one with fewer pods"
        );
    }

    #[test]
    fn the_seed_vm_lands_on_the_tainted_labelled_node() {
        let nodes = nodes();
        let view = ClusterView {
            nodes: &nodes,
            ..Default::default()
        };
        let vm = pod(json!({
            "containers": containers(),
            "nodeSelector": {"node-role.kubernetes.io/virt-local": "true"},
            "tolerations": [{"key": "virt-local", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
        }));
        assert_eq!(
            schedule(&vm, &view),
            Decision::Bind {
                node: "node-2".into(),
                select_for: vec![]
            }
        );
        // Without the toleration nothing fits, and the message says why, per node.
        let no_toleration = pod(
            json!({"containers": containers(), "nodeSelector": {"node-role.kubernetes.io/virt-local": "true"}}),
        );
        assert_eq!(
            schedule(&no_toleration, &view),
            Decision::Unschedulable {
                message: "0/3 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {virt-local: true}. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.".into()
            }
        );
        // A plain pod avoids the tainted node.
        let plain = pod(json!({"containers": containers()}));
        assert_eq!(
            schedule(&plain, &view),
            Decision::Bind {
                node: "node-1".into(),
                select_for: vec![]
            }
        );
    }

    #[test]
    fn required_affinity_and_match_fields() {
        let nodes = nodes();
        let view = ClusterView {
            nodes: &nodes,
            ..Default::default()
        };
        let affinity = |exprs: serde_json::Value| {
            pod(
                json!({"containers": containers(), "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [exprs]}}}}),
            )
        };
        let p = affinity(
            json!({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-3"]}]}),
        );
        assert_eq!(
            schedule(&p, &view),
            Decision::Bind {
                node: "node-3".into(),
                select_for: vec![]
            }
        );
        let p = affinity(
            json!({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]}),
        );
        assert_eq!(
            schedule(&p, &view),
            Decision::Bind {
                node: "node-3".into(),
                select_for: vec![]
            },
            "node-2 is tainted"
        );
        let p = affinity(json!({"matchExpressions": [{"key": "missing", "operator": "Exists"}]}));
        assert!(matches!(
            schedule(&p, &view),
            Decision::Unschedulable { .. }
        ));
    }

    #[test]
    fn static_wffc_claims_need_a_free_volume_on_the_node() {
        let nodes = nodes();
        let classes: Vec<StorageClass> = vec![serde_json::from_value(json!({"metadata": {"name": "local"}, "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"})).unwrap()];
        let claims: Vec<PersistentVolumeClaim> = vec![serde_json::from_value(json!({"metadata": {"name": "disk"}, "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})).unwrap()];
        let on = |node: &str, size: &str| -> PersistentVolume {
            serde_json::from_value(json!({"metadata": {"name": format!("pv-{node}-{size}")}, "spec": {"storageClassName": "local", "capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}})).unwrap()
        };
        // node-1 has one too small; only node-3's fits.
        let volumes = vec![on("node-1", "512Mi"), on("node-3", "2Gi")];
        let view = ClusterView {
            nodes: &nodes,
            claims: &claims,
            volumes: &volumes,
            classes: &classes,
            ..Default::default()
        };
        let p = pod(
            json!({"containers": containers(), "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "disk"}}]}),
        );
        assert_eq!(
            schedule(&p, &view),
            Decision::Bind {
                node: "node-3".into(),
                select_for: vec!["disk".into()]
            }
        );
        let none = vec![on("node-1", "512Mi")];
        let view = ClusterView {
            volumes: &none,
            ..view
        };
        match schedule(&p, &view) {
            Decision::Unschedulable { message } => assert!(
                message.contains("2 node(s) didn't find available persistent volumes to bind"),
                "{message}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn resources_claims_and_volume_affinity() {
        let nodes = nodes();
        let big = pod(
            json!({"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "9", "memory": "1Gi"}}}]}),
        );
        let view = ClusterView {
            nodes: &nodes,
            ..Default::default()
        };
        match schedule(&big, &view) {
            Decision::Unschedulable { message } => assert!(
                message.contains("2 Insufficient cpu")
                    && message.contains("1 node(s) had untolerated taint"),
                "{message}"
            ),
            other => panic!("{other:?}"),
        }

        let classes: Vec<StorageClass> = vec![
            serde_json::from_value(json!({"metadata": {"name": "local-path-wffc"}, "provisioner": "rancher.io/local-path", "volumeBindingMode": "WaitForFirstConsumer"})).unwrap(),
            serde_json::from_value(json!({"metadata": {"name": "immediate"}, "provisioner": "rancher.io/local-path", "volumeBindingMode": "Immediate"})).unwrap(),
        ];
        let claims: Vec<PersistentVolumeClaim> = vec![
            serde_json::from_value(json!({"metadata": {"name": "wffc"}, "spec": {"storageClassName": "local-path-wffc"}})).unwrap(),
            serde_json::from_value(json!({"metadata": {"name": "imm"}, "spec": {"storageClassName": "immediate"}})).unwrap(),
            serde_json::from_value(json!({"metadata": {"name": "bound"}, "spec": {"storageClassName": "local-path-wffc", "volumeName": "pv-3"}})).unwrap(),
        ];
        let volumes: Vec<PersistentVolume> = vec![serde_json::from_value(json!({"metadata": {"name": "pv-3"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-3"]}]}]}}}})).unwrap()];
        let view = ClusterView {
            nodes: &nodes,
            claims: &claims,
            volumes: &volumes,
            classes: &classes,
            ..Default::default()
        };
        let with = |claims: &[&str]| {
            let vols: Vec<serde_json::Value> = claims
                .iter()
                .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
                .collect();
            pod(json!({"containers": containers(), "volumes": vols}))
        };
        assert_eq!(
            schedule(&with(&["wffc"]), &view),
            Decision::Bind {
                node: "node-1".into(),
                select_for: vec!["wffc".into()]
            }
        );
        assert_eq!(
            schedule(&with(&["bound", "wffc"]), &view),
            Decision::Bind {
                node: "node-3".into(),
                select_for: vec!["wffc".into()]
            }
        );
        match schedule(&with(&["imm"]), &view) {
            Decision::Unschedulable { message } => assert!(
                message.contains("unbound immediate PersistentVolumeClaims"),
                "{message}"
            ),
            other => panic!("{other:?}"),
        }
        match schedule(&with(&["nope"]), &view) {
            Decision::Unschedulable { message } => assert!(
                message.contains("persistentvolumeclaim \"nope\" not found"),
                "{message}"
            ),
            other => panic!("{other:?}"),
        }
    }
}

/// The scheduler as a loop: every pending pod for `default-scheduler` is decided and acted on
/// (level-triggered, so a restart or a missed event converges on the next pass).
pub mod agent {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
    use kube::api::{Patch, PatchParams, PostParams};
    use kube::{Api, Client};
    use serde_json::json;

    use std::collections::HashMap;

    use super::{ClusterView, Decision, Usage, schedule};
    use crate::agents::{Reader, namespace};

    /// The annotation the scheduler sets on a WaitForFirstConsumer claim.
    pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

    /// One pass over the pending pods, reading straight from the API.
    pub async fn pass(client: &Client) -> Result<(), kube::Error> {
        pass_reading(&Reader::Api(client.clone()), client).await
    }

    async fn pass_reading(reader: &Reader, client: &Client) -> Result<(), kube::Error> {
        let cluster = reader.read().await?;
        let all_pods = &cluster.pods;
        let mut usage = Usage::of(all_pods);
        // Claim names are per namespace: a pod sees only its own namespace's.
        let mut by_namespace: HashMap<&str, Vec<PersistentVolumeClaim>> = HashMap::new();
        for c in &cluster.claims {
            by_namespace
                .entry(namespace(c))
                .or_default()
                .push(c.clone());
        }
        for pod in all_pods.iter().filter(|p| {
            let spec = p.spec.as_ref();
            spec.and_then(|s| s.node_name.as_deref())
                .is_none_or(str::is_empty)
                && spec
                    .and_then(|s| s.scheduler_name.as_deref())
                    .is_none_or(|s| s == "default-scheduler")
                && p.metadata.deletion_timestamp.is_none()
        }) {
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
            let claims = by_namespace.get(ns.as_str()).map_or(&[][..], Vec::as_slice);
            let view = ClusterView {
                nodes: &cluster.nodes,
                usage: &usage,
                claims,
                volumes: &cluster.volumes,
                classes: &cluster.classes,
            };
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            match schedule(pod, &view) {
                Decision::Bind { node, select_for } => {
                    let mut waiting = false;
                    for claim_name in &select_for {
                        let Some(claim) = claims
                            .iter()
                            .find(|c| c.metadata.name.as_deref() == Some(claim_name.as_str()))
                        else {
                            continue;
                        };
                        let selected = claim
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(SELECTED_NODE));
                        if selected.is_none() {
                            let patch = json!({"metadata": {"annotations": {SELECTED_NODE: node}}});
                            claims_api
                                .patch(claim_name, &PatchParams::default(), &Patch::Merge(patch))
                                .await?;
                            tracing::info!(claim = %format!("{ns}/{claim_name}"), %node, pod = %name, "selected node for claim");
                        }
                        let bound =
                            claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
                        waiting |= !bound;
                    }
                    if waiting {
                        // The provisioner and the PV controller bind the claims; the pod waits.
                        continue;
                    }
                    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name}, "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
                    // A conflict means someone else bound it meanwhile: fine.
                    let bound: Result<serde_json::Value, _> = pods
                        .create_subresource("binding", &name, &PostParams::default(), &binding)
                        .await;
                    if bound.is_ok() {
                        tracing::info!(pod = %format!("{ns}/{name}"), %node, "bound pod");
                        // The next pod of this pass sees what this one takes.
                        usage.add(&node, pod);
                    }
                }
                Decision::Unschedulable { message } => {
                    let already = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
                        .is_some_and(|c| {
                            c.status == "False" && c.message.as_deref() == Some(message.as_str())
                        });
                    if !already {
                        let now = jiff::Timestamp::now()
                            .round(jiff::Unit::Second)
                            .map(|t| t.to_string())
                            .unwrap_or_default();
                        let status = json!({"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message, "lastTransitionTime": now}]}});
                        pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                            .await?;
                        tracing::info!(pod = %format!("{ns}/{name}"), %message, "unschedulable");
                        // As kube-scheduler says it: `kubectl describe pod` shows why.
                        crate::agents::kubelet::events::event_from(
                            client,
                            "default-scheduler",
                            pod,
                            "Warning",
                            "FailedScheduling",
                            &message,
                        )
                        .await;
                    }
                }
            }
        }
        Ok(())
    }

    /// Run passes until the task is dropped.
    pub async fn run(client: Client, changes: crate::agents::Changes, every: Duration) {
        let reader = Reader::Shared(client.clone(), changes.clone());
        run_on_change!(changes.subscribe(), every, pass_reading(&reader, &client))
    }
}
