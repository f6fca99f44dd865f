//! The development cluster with CDI: the kubesim simulator knows nothing of CDI, and this crate
//! adds what `cdi dev` needs on top of it: the names by which its kubelet tells CDI's programs
//! their pod's root and address, and a stand-in for KubeVirt (VirtualMachines whose launcher
//! pods consume DataVolumes, as in the WaitForFirstConsumer handshake; see
//! `docs/design.md#the-waitforfirstconsumer-handshake`). It also holds the demo's narrator.

pub mod story;
pub mod vmconsumer;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ApiResource;
use kubesim::agents::kubelet::{ImageMap, PodEnv};
use kubesim::cluster::{Config, Extras};
use serde_json::{Value, json};

/// The simulated cluster of `cdi dev` in `dir`, its API server on `addr`: kubelets that run
/// `images` and tell the programs their pod as CDI's read it, and the KubeVirt stand-in.
pub fn cluster_config(dir: PathBuf, addr: SocketAddr, images: ImageMap) -> Config {
    let mut config = Config::new(dir, addr);
    config.kubelet.images = images;
    config.kubelet.pod_env = pod_env();
    config.extras = extras();
    config
}

/// The variables CDI's programs read their pod from (`cdi_core::devpod`).
pub fn pod_env() -> PodEnv {
    use cdi_core::devpod;
    PodEnv {
        root: devpod::ROOT_ENV.into(),
        ip: devpod::IP_ENV.into(),
        capacity: devpod::CAPACITY_ENV.into(),
    }
}

/// What the simulator gets for KubeVirt's part: its two kinds, the VM consumer agent, and the
/// kinds that agent reads (DataVolumes among them) as wake-ups.
pub fn extras() -> Extras {
    use cdi_api::datavolume::DataVolume;
    use cdi_api::kubevirt::{VirtualMachine, VirtualMachineInstance};
    Extras {
        crds: kubevirt_crds(),
        watch: vec![
            ApiResource::erase::<DataVolume>(&()),
            ApiResource::erase::<VirtualMachine>(&()),
            ApiResource::erase::<VirtualMachineInstance>(&()),
        ],
        agents: vec![Arc::new(|client, changes, every| {
            Box::pin(vmconsumer::agent::run(client, changes, every))
        })],
    }
}

/// The kubevirt.io CustomResourceDefinitions the VM consumer serves: VirtualMachine and
/// VirtualMachineInstance, schemas open (KubeVirt's own are far larger; fields are kept as given).
fn kubevirt_crds() -> Vec<CustomResourceDefinition> {
    let crd = |kind: &str, plural: &str, short: &[&str], columns: Value| {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.kubevirt.io")},
            "spec": {"group": "kubevirt.io", "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(),
                    "listKind": format!("{kind}List"), "shortNames": short, "categories": ["all"]},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}
        }))
        .expect("a CRD")
    };
    let age = json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"});
    vec![
        crd(
            "VirtualMachine",
            "virtualmachines",
            &["vm", "vms"],
            json!([age,
            {"name": "Status", "type": "string", "jsonPath": ".status.printableStatus"},
            {"name": "Ready", "type": "string", "jsonPath": ".status.ready"}]),
        ),
        crd(
            "VirtualMachineInstance",
            "virtualmachineinstances",
            &["vmi", "vmis"],
            json!([age,
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "IP", "type": "string", "jsonPath": ".status.interfaces[0].ipAddress"},
            {"name": "NodeName", "type": "string", "jsonPath": ".status.nodeName"}]),
        ),
    ]
}
