//! What the kubelets are told: which images run which programs, the restart back-off, the
//! cluster's DNS server, and the names of the variables a pod's processes learn their
//! surroundings from.

use std::net::Ipv4Addr;

use super::images::ImageMap;
use super::status::Backoff;

/// What the kubelets are told: which images run which programs, and the restart back-off.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    pub images: ImageMap,
    pub backoff: Backoff,
    /// The cluster's DNS server (kubelet's `--cluster-dns`), which pods of the `ClusterFirst`
    /// DNS policy resolve through.
    pub dns: Option<Ipv4Addr>,
    /// The variables telling a pod's programs where their container's `/` is, their address and
    /// their volumes' sizes: the contract of this process runtime with the programs it runs.
    pub pod_env: PodEnv,
}

/// The names of the variables a container's process is told its pod's root directory, address
/// and volume capacities by (`PATH=BYTES,…`). Whoever composes the cluster with its programs
/// chooses them; by default they are `KUBESIM_POD_ROOT`, `KUBESIM_POD_IP`, `KUBESIM_POD_CAPACITY`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEnv {
    pub root: String,
    pub ip: String,
    pub capacity: String,
}

impl Default for PodEnv {
    fn default() -> Self {
        PodEnv {
            root: "KUBESIM_POD_ROOT".into(),
            ip: "KUBESIM_POD_IP".into(),
            capacity: "KUBESIM_POD_CAPACITY".into(),
        }
    }
}

impl Default for KubeletConfig {
    fn default() -> Self {
        KubeletConfig {
            images: ImageMap::default(),
            backoff: Backoff::KUBELET,
            dns: None,
            pod_env: PodEnv::default(),
        }
    }
}
