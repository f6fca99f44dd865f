//! The nodes of `cdi dev`: by default three, the second labelled and tainted for virtual machines
//! as in the WaitForFirstConsumer seed document.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Label every node carries with its own name.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// One node to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// (key, value, effect)
    pub taints: Vec<(String, String, String)>,
    pub cpu: String,
    pub memory: String,
    pub pods: String,
}

impl NodeConfig {
    pub fn plain(name: &str) -> NodeConfig {
        NodeConfig {
            name: name.into(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            cpu: "8".into(),
            memory: "32Gi".into(),
            pods: "110".into(),
        }
    }

    /// The Node object, Ready, with its hostname label, allocatable resources and, as the
    /// `index`th node, its addresses: InternalIP `127.<index+1>.0.1` and pod CIDR
    /// `127.<index+1>.0.0/16` (all of 127.0.0.0/8 is local, so every pod gets its own address).
    pub fn node(&self, index: usize) -> Node {
        let octet = index + 1;
        let mut labels = self.labels.clone();
        labels.insert(HOSTNAME_LABEL.into(), self.name.clone());
        labels.insert("kubernetes.io/os".into(), "linux".into());
        let resources: BTreeMap<String, Quantity> = [
            ("cpu".to_string(), Quantity(self.cpu.clone())),
            ("memory".to_string(), Quantity(self.memory.clone())),
            ("pods".to_string(), Quantity(self.pods.clone())),
        ]
        .into();
        Node {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: (!self.taints.is_empty()).then(|| {
                    self.taints
                        .iter()
                        .map(|(key, value, effect)| Taint {
                            key: key.clone(),
                            value: Some(value.clone()),
                            effect: effect.clone(),
                            ..Default::default()
                        })
                        .collect()
                }),
                pod_cidr: Some(format!("127.{octet}.0.0/16")),
                pod_cidrs: Some(vec![format!("127.{octet}.0.0/16")]),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(vec![
                    NodeAddress {
                        type_: "InternalIP".into(),
                        address: format!("127.{octet}.0.1"),
                    },
                    NodeAddress {
                        type_: "Hostname".into(),
                        address: self.name.clone(),
                    },
                ]),
                allocatable: Some(resources.clone()),
                capacity: Some(resources),
                conditions: Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    reason: Some("KubeletReady".into()),
                    message: Some("cdi dev kubelet is posting ready status".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }
}

/// One node as a nodes file describes it (`cdi dev up --nodes FILE`).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeEntry {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    /// `key=value:Effect` or `key:Effect`.
    #[serde(default)]
    taints: Vec<String>,
    cpu: Option<String>,
    memory: Option<String>,
    pods: Option<String>,
}

/// Nodes from YAML: a list of `{name, labels, taints: ["key=value:Effect"], cpu, memory, pods}`
/// (resources default to 8 CPUs, 32Gi, 110 pods).
pub fn parse_nodes(yaml: &str) -> Result<Vec<NodeConfig>, String> {
    let entries: Vec<NodeEntry> = serde_saphyr::from_str(yaml).map_err(|e| {
        format!("expected a list of nodes such as `- {{name: node-1, taints: [\"k=v:NoSchedule\"]}}`: {e}")
    })?;
    if entries.is_empty() {
        return Err("the list of nodes is empty: a cluster needs at least one".into());
    }
    let mut out: Vec<NodeConfig> = Vec::new();
    for e in entries {
        let valid_name = !e.name.is_empty()
            && e.name.len() <= 253
            && e.name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
        if !valid_name {
            return Err(format!(
                "node name {:?} is not a DNS subdomain (lower-case letters, digits, '-' and '.')",
                e.name
            ));
        }
        if out.iter().any(|n| n.name == e.name) {
            return Err(format!("node {:?} is listed twice", e.name));
        }
        let mut node = NodeConfig::plain(&e.name);
        node.labels = e.labels;
        for t in &e.taints {
            let (kv, effect) = t.rsplit_once(':').ok_or_else(|| {
                format!(
                    "taint {t:?} of node {:?}: expected key=value:Effect",
                    e.name
                )
            })?;
            if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
                return Err(format!(
                    "taint {t:?} of node {:?}: the effect must be NoSchedule, PreferNoSchedule or NoExecute",
                    e.name
                ));
            }
            let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
            if key.is_empty() {
                return Err(format!("taint {t:?} of node {:?} has no key", e.name));
            }
            node.taints.push((key.into(), value.into(), effect.into()));
        }
        for (field, value) in [("cpu", e.cpu), ("memory", e.memory), ("pods", e.pods)] {
            let Some(value) = value else { continue };
            value
                .parse::<k8s_rules::Quantity>()
                .map_err(|err| format!("{field} of node {:?}: {err}", e.name))?;
            match field {
                "cpu" => node.cpu = value,
                "memory" => node.memory = value,
                _ => node.pods = value,
            }
        }
        out.push(node);
    }
    Ok(out)
}

/// The default nodes: `node-1`, `node-2` (label `node-role.kubernetes.io/virt-local=true`,
/// taint `virt-local=true:NoSchedule`), `node-3`.
pub fn default_nodes() -> Vec<NodeConfig> {
    let mut virt = NodeConfig::plain("node-2");
    virt.labels
        .insert("node-role.kubernetes.io/virt-local".into(), "true".into());
    virt.taints
        .push(("virt-local".into(), "true".into(), "NoSchedule".into()));
    vec![
        NodeConfig::plain("node-1"),
        virt,
        NodeConfig::plain("node-3"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_from_yaml() {
        let nodes = parse_nodes(
            "- name: a\n- name: gpu-1\n  labels: {gpu: \"true\"}\n  taints: [\"gpu=true:NoSchedule\", \"dedicated:NoExecute\"]\n  cpu: \"4\"\n  memory: 16Gi\n",
        )
        .unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[1].labels["gpu"], "true");
        assert_eq!(
            nodes[1].taints,
            vec![
                ("gpu".into(), "true".into(), "NoSchedule".into()),
                ("dedicated".into(), String::new(), "NoExecute".into())
            ]
        );
        assert_eq!(
            (nodes[1].cpu.as_str(), nodes[1].memory.as_str()),
            ("4", "16Gi")
        );
        assert_eq!(nodes[0].pods, "110");
        let node = nodes[1].node(1);
        assert_eq!(node.spec.unwrap().pod_cidr.as_deref(), Some("127.2.0.0/16"));
        for (bad, says) in [
            ("[]", "empty"),
            ("- name: A", "DNS"),
            ("- name: a\n- name: a", "twice"),
            ("- name: a\n  taints: [\"x=y\"]", "key=value:Effect"),
            ("- name: a\n  taints: [\"x=y:Sometimes\"]", "NoSchedule"),
            ("- name: a\n  memory: lots", "memory of node \"a\""),
            ("- name: a\n  colour: red", "colour"),
        ] {
            let err = parse_nodes(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
