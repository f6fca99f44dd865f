//! `cdi demo`: the WaitForFirstConsumer story of the seed document, for real, on one machine.
//! It starts the development cluster and the controllers in this process (the importer and the
//! VM's launcher run as pods, that is as processes), serves a qcow2 of a small real filesystem
//! on 127.0.0.1, applies the seed's VirtualMachine and prints what happens, in order.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use cdi_api::config::CDIConfig;
use cdi_api::datavolume::DataVolume;
use cdi_api::kubevirt::{VirtualMachine, VirtualMachineInstance};
use cdi_controller::{Context, Options, serve};
use cdi_core::quantity::Quantity;
use cdi_core::size::{self, ClaimApi, VolumeMode};
use cdi_devcluster::cluster;
use cdi_devcluster::story::{Narrator, Scene};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::demo_image;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// The root disk's request, as in the seed's VirtualMachine.
    #[arg(long, default_value = "20Gi")]
    size: String,
    /// Keep the cluster's directory (volumes, logs) here instead of a temporary one.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 180)]
    timeout: u64,
    /// Put the disk on the CSI-like class `csi` instead (its driver has a CSIDriver object): the
    /// populator path, where PVC prime is filled and its volume handed to the VM's claim.
    #[arg(long)]
    populator: bool,
}

const NS: &str = "default";
const VM: &str = "vm-with-wffc-disk";
const DV: &str = "vm-with-wffc-disk-root";

fn seed_objects(url: &str, size: &str, class: &str) -> Vec<serde_json::Value> {
    vec![
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "local-path-wffc"}, "provisioner": "rancher.io/local-path",
            "parameters": {"nodePath": "/data/vm-disks", "pathPattern": "{{ .PVC.Namespace }}/{{ .PVC.Name }}/"},
            "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete"}),
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": VM, "namespace": NS},
            "spec": {"running": true,
                "dataVolumeTemplates": [{"metadata": {"name": DV}, "spec": {
                    "source": {"http": {"url": url}},
                    "pvc": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": size}}}}}],
                "template": {"spec": {
                    "nodeSelector": {"node-role.kubernetes.io/virt-local": "true"},
                    "tolerations": [{"key": "virt-local", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
                    "domain": {"resources": {"requests": {"memory": "2Gi"}},
                        "devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}},
                    "volumes": [{"name": "root", "dataVolume": {"name": DV}}]}}}}),
    ]
}

struct Timeline {
    start: Instant,
    seen: BTreeSet<String>,
}

impl Timeline {
    /// Print `line` once, with the time since the start.
    fn say(&mut self, key: &str, line: String) {
        if self.seen.insert(key.to_string()) {
            println!("{:>7.2}s  {line}", self.start.elapsed().as_secs_f64());
        }
    }
}

fn gib(bytes: i64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

async fn setup(client: &Client, url: &str, size: &str, class: &str) -> anyhow::Result<()> {
    // The controller creates `config`; the demo turns the gate on, as CDI's release CR does.
    let configs: Api<CDIConfig> = Api::all(client.clone());
    for _ in 0..100 {
        if configs.get_opt("config").await?.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let patch = json!({"spec": {"featureGates": ["HonorWaitForFirstConsumer"]}});
    configs
        .patch("config", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    // No CDI spec.workload: the importer reaches the tainted VM node by inheriting the VM's
    // toleration from the temporary pod that chose the node (SPEC §9).
    let objects = seed_objects(url, size, class);
    let wffc: StorageClass = serde_json::from_value(objects[0].clone())?;
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &wffc)
        .await?;
    let vm: VirtualMachine = serde_json::from_value(objects[1].clone())?;
    Api::<VirtualMachine>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &vm)
        .await?;
    Ok(())
}

/// Follow the story until the launcher runs (Ok: its node and volume) or something fails for
/// good: observe the seed's objects, let the narrator say what happened.
async fn follow(
    client: &Client,
    t: &mut Timeline,
    timeout: Duration,
    populator: bool,
) -> anyhow::Result<(String, PathBuf)> {
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), NS);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), NS);
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    let mut narrator = Narrator::new(VM, DV, populator);
    loop {
        if Instant::now() > deadline {
            bail!(
                "the VM's launcher was not running after {} s (last DataVolume phase: {:?})",
                timeout.as_secs(),
                narrator.last_phase()
            );
        }
        let all = ListParams::default();
        let scene = Scene {
            dv: dvs.get_opt(DV).await?,
            claim: claims.get_opt(DV).await?,
            vmi: vmis.get_opt(VM).await?,
            pods: pods.list(&all).await?.items,
            claims: claims.list(&all).await?.items,
            volumes: volumes.list(&all).await?.items,
        };
        let chapter = narrator.observe(&scene);
        for (key, line) in chapter.lines {
            t.say(&key, line);
        }
        match chapter.end {
            Some(Ok(end)) => return Ok((end.node, end.path)),
            Some(Err(why)) => bail!(why),
            None => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    let request: Quantity = args
        .size
        .parse()
        .map_err(|e| anyhow::anyhow!("--size {}: {e}", args.size))?;
    let bytes = request.value();
    let plan = size::plan(
        ClaimApi::Pvc,
        VolumeMode::Filesystem,
        bytes,
        size::DEFAULT_OVERHEAD,
    )
    .context("a spec.pvc claim is the request itself")?;
    let tmp;
    let dir = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            d.clone()
        }
        None => {
            tmp = TempDir::new()?;
            tmp.0.clone()
        }
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(async {
        println!("cdi demo: the WaitForFirstConsumer handshake of the seed document, on {}", dir.display());
        let raw = demo_image::fat16(65536, "cdi demo", &[
            ("README.TXT", b"This disk was imported by cdi-rs, placed on the node its VM runs on.\n"),
            ("SEED.TXT", b"HonorWaitForFirstConsumer: the VM's temporary pod bound the claim, then the importer filled it.\n"),
        ]);
        let qcow2 = cdi_importer::qcow2_write::from_raw(&raw);
        let (addr, _server): (SocketAddr, _) = demo_image::serve("/images/root.qcow2", qcow2.clone()).await?;
        let url = format!("http://{addr}/images/root.qcow2");
        println!("  image: {url} (qcow2 {} bytes of a {} FAT16 filesystem)", qcow2.len(), gib(raw.len() as i64));

        let mut config = cluster::Config::new(dir.clone(), "127.0.0.1:0".parse()?);
        config.kubelet.images = crate::dev::image_map(&[])?;
        config.every = Duration::from_millis(100);
        let running = cluster::start(&config).await?;
        let client = running.client.clone();
        println!("  cluster: {} (kubeconfig {})", running.url, running.kubeconfig.display());
        let ctx = Context::new(
            client.clone(),
            Options {
                importer_image: "quay.io/kubevirt/cdi-importer:v1.66.0".into(),
                resync: Duration::from_millis(500),
                ..Options::default()
            },
            Arc::new(serve::Metrics::default()),
        );
        crate::controller::install_crds(&client).await?;
        let controllers = tokio::spawn(cdi_controller::run_controllers(ctx));
        let class = if args.populator { "csi" } else { "local-path-wffc" };
        setup(&client, &url, &args.size, class).await?;
        println!("  applied: CDIConfig gate HonorWaitForFirstConsumer (no CDI workload tolerations), class local-path-wffc, VirtualMachine {VM} ({} root disk on spec.pvc, class {class})\n", args.size);

        let mut t = Timeline { start: Instant::now(), seen: BTreeSet::new() };
        let result = follow(&client, &mut t, Duration::from_secs(args.timeout), args.populator).await;
        controllers.abort();
        let outcome = match result {
            Ok((node, path)) => {
                let disk = std::fs::metadata(path.join("disk.img")).map(|m| m.len() as i64).unwrap_or(-1);
                // Only the start holds data; the rest of the sparse image reads as zeros.
                let head = read_head(&path.join("disk.img"), raw.len());
                let same = head.as_deref() == Some(&raw[..]);
                println!();
                println!("disk image {}: virtual size {disk} bytes ({})", path.join("disk.img").display(), gib(disk));
                println!("SPEC §3 for spec.pvc {}: claim {} bytes, disk {} bytes ({})", args.size, plan.pvc_request, plan.disk_image, gib(plan.disk_image));
                println!("contents: {}", if same { "the served filesystem, byte for byte" } else { "DIFFERENT from the served filesystem" });
                if node != "node-2" {
                    Err(anyhow::anyhow!("the launcher runs on {node}, not on node-2 where the VM belongs"))
                } else if disk != plan.disk_image {
                    Err(anyhow::anyhow!("the disk is {disk} bytes, SPEC §3 says {}", plan.disk_image))
                } else if !same {
                    Err(anyhow::anyhow!("the imported disk does not hold the served image"))
                } else {
                    println!("\nOK: the VM runs on node-2 with its {} disk on node-2, imported after the VM's constraints chose the node.", args.size);
                    Ok(())
                }
            }
            Err(e) => Err(e),
        };
        running.stop().await;
        outcome
    })
}

fn read_head(path: &Path, len: usize) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut buf = vec![0u8; len];
    std::fs::File::open(path).ok()?.read_exact(&mut buf).ok()?;
    Some(buf)
}

/// A temporary directory removed on drop (the demo's volumes live there).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<TempDir> {
        let path = std::env::temp_dir().join(format!("cdi-demo-{}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
