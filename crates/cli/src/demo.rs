//! `cdi demo`: the WaitForFirstConsumer story of the seed document, for real, on one machine.
//! It starts the development cluster and the controllers in this process (the importer and the
//! VM's launcher run as pods, that is as processes), serves a qcow2 of a small real filesystem
//! on 127.0.0.1, applies the seed's VirtualMachine and prints what happens, in order.

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
use cdi_dev::story::{Narrator, Scene};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use kubesim::cluster;
use serde_json::json;

use crate::demo_image;
use crate::timeline::Timeline;

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
    /// Fill the disk by uploading the image instead (`cdi image-upload`, through CDI's token API
    /// and upload proxy running in the cluster): first the refusal of an upload into a
    /// DataVolume still waiting for its first consumer, then the VM's disk with `--force-bind`.
    #[arg(long, conflicts_with = "populator")]
    upload: bool,
    /// Tell the golden-image story instead: the image imported once into namespace `golden`
    /// and published as a DataSource, a clone refused to a user who may not read `golden`, then
    /// two VMs in namespace `vms` on disks cloned from it through `sourceRef` (a host-assisted
    /// copy on local-path, the clone populator on the CSI-like class), CDI running in the
    /// cluster with its admission webhook.
    #[arg(long, conflicts_with_all = ["populator", "upload"])]
    clone: bool,
}

const NS: &str = "default";
const VM: &str = "vm-with-wffc-disk";
const DV: &str = "vm-with-wffc-disk-root";

/// The seed's class and VirtualMachine; the disk's `source` is `http` from `url`, or `upload`
/// when there is none.
fn seed_objects(url: Option<&str>, size: &str, class: &str) -> Vec<serde_json::Value> {
    let source = match url {
        Some(url) => json!({"http": {"url": url}}),
        None => json!({"upload": {}}),
    };
    vec![
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "local-path-wffc"}, "provisioner": "rancher.io/local-path",
            "parameters": {"nodePath": "/data/vm-disks", "pathPattern": "{{ .PVC.Namespace }}/{{ .PVC.Name }}/"},
            "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete"}),
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": VM, "namespace": NS},
            "spec": {"running": true,
                "dataVolumeTemplates": [{"metadata": {"name": DV}, "spec": {
                    "source": source,
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

fn gib(bytes: i64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

async fn setup(client: &Client, url: Option<&str>, size: &str, class: &str) -> anyhow::Result<()> {
    // The controller creates `config`; the demo turns the gate on, as CDI's release CR does.
    let configs: Api<CDIConfig> = Api::all(client.clone());
    for _ in 0..100 {
        if configs.get_opt("config").await?.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    crate::dev::set_feature_gates(client, &["HonorWaitForFirstConsumer"]).await?;
    // No CDI spec.workload: the importer reaches the tainted VM node by inheriting the VM's
    // toleration from the temporary pod that chose the node (docs/design.md#worker-pods-follow-the-first-consumer).
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
    upload_lines: Option<std::sync::mpsc::Receiver<String>>,
) -> anyhow::Result<(String, PathBuf)> {
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), NS);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), NS);
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    let mut narrator = Narrator::new(VM, DV, populator);
    let mut told = 0usize;
    loop {
        if Instant::now() > deadline {
            bail!(
                "the VM's launcher was not running after {} s (last DataVolume phase: {:?})",
                timeout.as_secs(),
                narrator.last_phase()
            );
        }
        // What the client said came before this look at the cluster: told first.
        for line in upload_lines.iter().flat_map(|r| r.try_iter()) {
            told += 1;
            t.say(
                &format!("upload-{told}"),
                format!("cdi image-upload: {line}"),
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
    let plan = size_plan(args)?;
    let (dir, _tmp) = demo_dir(args)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(async {
        if args.clone {
            println!("cdi demo --clone: a golden image, its DataSource, and VM disks cloned from it in another namespace, on {}", dir.display());
        } else {
            println!("cdi demo: the WaitForFirstConsumer handshake of the seed document, on {}", dir.display());
        }
        let raw = demo_image::fat16(65536, "cdi demo", &[
            ("README.TXT", b"This disk was imported by cdi-rs, placed on the node its VM runs on.\n"),
            ("SEED.TXT", b"HonorWaitForFirstConsumer: the VM's temporary pod bound the claim, then the importer filled it.\n"),
        ]);
        let qcow2 = cdi_importer::qcow2_write::from_raw(&raw);
        // Served over HTTP for an import; a local file for an upload.
        let (url, _server) = if args.upload {
            (dir.join("root.qcow2").display().to_string(), None)
        } else {
            let (addr, server): (SocketAddr, _) = demo_image::serve("/images/root.qcow2", qcow2.clone()).await?;
            (format!("http://{addr}/images/root.qcow2"), Some(server))
        };
        println!("  image: {url} (qcow2 {} bytes of a {} FAT16 filesystem)", qcow2.len(), gib(raw.len() as i64));

        let mut config =
            cdi_dev::cluster_config(dir.clone(), "127.0.0.1:0".parse()?, crate::dev::image_map(&[])?);
        config.every = Duration::from_millis(100);
        let running = cluster::start(&config).await?;
        let client = running.client.clone();
        println!("  cluster: {} (kubeconfig {})", running.url, running.kubeconfig.display());
        let controllers = start_cdi(args, &client).await?;
        if args.clone {
            println!();
            let mut t = Timeline::new();
            let told = crate::demo_clone::story(&client, &running.kubeconfig, &url, &args.size, &raw, Duration::from_secs(args.timeout), &mut t).await;
            running.stop().await;
            return told;
        }
        let class = if args.populator { "csi" } else { "local-path-wffc" };
        let source = (!args.upload).then_some(url.as_str());
        setup(&client, source, &args.size, class).await?;
        let what = if args.upload { "upload" } else { "http" };
        println!("  applied: CDIConfig gate HonorWaitForFirstConsumer (no CDI workload tolerations), class local-path-wffc, VirtualMachine {VM} ({} root disk on spec.pvc, class {class}, source {what})\n", args.size);

        let mut t = Timeline::new();
        let upload_lines = if args.upload {
            let image = dir.join("root.qcow2");
            std::fs::write(&image, &qcow2)?;
            Some(upload(&client, &running.kubeconfig, &image, &mut t).await?)
        } else {
            None
        };
        let result = follow(&client, &mut t, Duration::from_secs(args.timeout), args.populator, upload_lines).await;
        if let Some(c) = controllers {
            c.abort();
        }
        let outcome = result.and_then(|(node, path)| check_disk(args, &plan, &raw, &node, &path));
        running.stop().await;
        outcome
    })
}

/// The size math for the root disk's `--size` on spec.pvc.
fn size_plan(args: &DemoArgs) -> anyhow::Result<size::SizePlan> {
    let request: Quantity = args
        .size
        .parse()
        .map_err(|e| anyhow::anyhow!("--size {}: {e}", args.size))?;
    let bytes = request.value();
    size::plan(
        ClaimApi::Pvc,
        VolumeMode::Filesystem,
        bytes,
        size::DEFAULT_OVERHEAD,
    )
    .context("a spec.pvc claim is the request itself")
}

/// The cluster's directory: `--dir` (made if missing), else a temporary one, kept as long as
/// the returned guard.
fn demo_dir(args: &DemoArgs) -> anyhow::Result<(PathBuf, Option<TempDir>)> {
    Ok(match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            (d.clone(), None)
        }
        None => {
            let tmp = TempDir::new()?;
            (tmp.0.clone(), Some(tmp))
        }
    })
}

/// Run CDI: in the cluster for an upload or a clone (their handle is `None`), else its
/// controllers in this process.
async fn start_cdi(
    args: &DemoArgs,
    client: &Client,
) -> anyhow::Result<Option<tokio::task::JoinHandle<anyhow::Result<()>>>> {
    // The upload path needs CDI's token API and upload proxy, a clone from another
    // namespace its admission webhook: CDI runs in the cluster, as `cdi dev up --cdi`
    // installs it. Otherwise the controllers run in this process.
    if args.upload || args.clone {
        crate::dev::install_cdi(client).await?;
        if args.clone {
            // The golden image is imported before any VM uses it: no consumer to wait for.
            crate::dev::set_feature_gates(client, &[]).await?;
        }
        println!(
            "  CDI: controller, token API (with the DataVolume webhook) and upload proxy running in namespace cdi"
        );
        Ok(None)
    } else {
        let ctx = Context::new(
            client.clone(),
            Options {
                importer_image: "quay.io/kubevirt/cdi-importer:v1.66.0".into(),
                resync: Duration::from_millis(500),
                ..Options::default()
            },
            Arc::new(serve::Metrics::default()),
        );
        crate::controller::install_crds(client).await?;
        Ok(Some(tokio::spawn(cdi_controller::run_controllers(ctx))))
    }
}

/// Print the disk the VM runs on (its size, the size math, its contents) and decide: the VM on
/// node-2, the disk the size math says, holding the served image.
fn check_disk(
    args: &DemoArgs,
    plan: &size::SizePlan,
    raw: &[u8],
    node: &str,
    path: &Path,
) -> anyhow::Result<()> {
    let disk = std::fs::metadata(path.join("disk.img"))
        .map(|m| m.len() as i64)
        .unwrap_or(-1);
    // Only the start holds data; the rest of the sparse image reads as zeros.
    let head = crate::demo_image::read_head(&path.join("disk.img"), raw.len());
    let same = head.as_deref() == Some(raw);
    println!();
    println!(
        "disk image {}: virtual size {disk} bytes ({})",
        path.join("disk.img").display(),
        gib(disk)
    );
    println!(
        "size math for spec.pvc {}: claim {} bytes, disk {} bytes ({})",
        args.size,
        plan.pvc_request,
        plan.disk_image,
        gib(plan.disk_image)
    );
    println!(
        "contents: {}",
        if same {
            "the served filesystem, byte for byte"
        } else {
            "DIFFERENT from the served filesystem"
        }
    );
    if node != "node-2" {
        Err(anyhow::anyhow!(
            "the launcher runs on {node}, not on node-2 where the VM belongs"
        ))
    } else if disk != plan.disk_image {
        Err(anyhow::anyhow!(
            "the disk is {disk} bytes, the size math says {}",
            plan.disk_image
        ))
    } else if !same {
        Err(anyhow::anyhow!(
            "the imported disk does not hold the served image"
        ))
    } else {
        let how = if args.upload { "uploaded" } else { "imported" };
        println!(
            "\nOK: the VM runs on node-2 with its {} disk on node-2, {how} after the VM's constraints chose the node.",
            args.size
        );
        Ok(())
    }
}

/// `cdi image-upload` as a user runs it: first into a DataVolume that waits for a first consumer
/// (refused without `--force-bind`, told at once), then, once the VM's DataVolume has its claim,
/// into the VM's disk with `--force-bind`, in the background: its output lines come through the
/// receiver.
async fn upload(
    client: &Client,
    kubeconfig: &Path,
    image: &Path,
    t: &mut Timeline,
) -> anyhow::Result<std::sync::mpsc::Receiver<String>> {
    let exe = std::env::current_exe().context("finding the cdi executable")?;
    let image_arg = image.to_string_lossy().into_owned();
    let refused = tokio::process::Command::new(&exe)
        .args([
            "image-upload",
            "dv",
            "waiting-disk",
            "--size",
            "1Gi",
            "--access-mode",
        ])
        .args([
            "ReadWriteOnce",
            "--storage-class",
            "local-path-wffc",
            "--image-path",
            &image_arg,
        ])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .await?;
    let said = String::from_utf8_lossy(&refused.stderr).trim().to_string();
    if refused.status.success() || !said.contains("force-bind") {
        bail!("an upload into a DataVolume waiting for its first consumer was not refused: {said}");
    }
    t.say(
        "refused",
        format!("cdi image-upload dv waiting-disk (no --force-bind): {said}"),
    );
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    while claims.get_opt(DV).await?.is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    t.say("upload-start", format!("cdi image-upload dv {DV} --no-create --force-bind --image-path root.qcow2 (waits for the VM to bind the claim)"));
    let mut child = std::process::Command::new(&exe)
        .args([
            "image-upload",
            "dv",
            DV,
            "--no-create",
            "--force-bind",
            "--image-path",
            &image_arg,
        ])
        .env("KUBECONFIG", kubeconfig)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let (tx, rx) = std::sync::mpsc::channel();
    let out = child.stdout.take();
    let err = child.stderr.take();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out.into_iter().next().expect("piped")).lines() {
            let Ok(line) = line else { break };
            if !line.trim().is_empty() {
                let _ = tx.send(line);
            }
        }
        let mut rest = String::new();
        if let Some(mut e) = err {
            let _ = std::io::Read::read_to_string(&mut e, &mut rest);
        }
        let status = child.wait();
        if !status.is_ok_and(|s| s.success()) {
            let _ = tx.send(format!("failed: {}", rest.trim()));
        }
    });
    Ok(rx)
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
