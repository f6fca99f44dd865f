//! kubesim: a Kubernetes cluster simulated in one process. An API server that kubectl, kube-rs
//! and the Python client talk to unchanged, and the agents that make objects happen: nodes,
//! scheduler, PV controller, provisioners, snapshotter, Deployments, Services, and kubelets that
//! run pods as host processes. It knows nothing of CDI; `cdi dev` adds CDI and a KubeVirt
//! stand-in on top of it (the `cdi-dev` crate).

pub mod agents;
pub mod apiserver;
pub mod cluster;
