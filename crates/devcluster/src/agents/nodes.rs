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
