//! `cdi dev launcher`: what the development cluster runs in place of virt-launcher. There is no
//! hypervisor here; the launcher proves the VM could start: each disk is where KubeVirt would
//! look for it, and its virtual size is what the DataVolume asked for (docs/design.md#the-size-math).

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use cdi_core::devpod::DevPod;

/// A disk's format and virtual size, from its first bytes and its length.
pub fn inspect(path: &Path) -> anyhow::Result<(&'static str, u64)> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = f.metadata()?.len();
    let mut head = [0u8; 32];
    let n = f.read(&mut head)?;
    if n >= 32 && head[..4] == *b"QFI\xfb" {
        let size = u64::from_be_bytes(head[24..32].try_into().unwrap_or_default());
        return Ok(("qcow2", size));
    }
    Ok(("raw", len))
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

pub fn run(name: &str, disks: &[String]) -> anyhow::Result<()> {
    let pod = DevPod::from_env(|k| std::env::var(k).ok()).map_err(anyhow::Error::msg)?;
    let mut report = Vec::new();
    for d in disks {
        let Some((disk, path)) = d.split_once('=') else {
            bail!("--disk {d:?}: expected NAME=PATH");
        };
        let host: PathBuf = pod.path(Path::new(path));
        match inspect(&host) {
            Ok((format, size)) => report.push(format!(
                "disk {disk}: {path}: {format}, virtual size {size} bytes ({})",
                gib(size)
            )),
            Err(e) => {
                let message = format!("VM {name}: disk {disk} is not usable at {path}: {e:#}");
                let _ = std::fs::write(pod.path(Path::new("/dev/termination-log")), &message);
                bail!("{message}");
            }
        }
    }
    let text = report.join("\n");
    println!("VM {name}: {} disk(s) ready", disks.len());
    println!("{text}");
    // Kept for `kubectl get pod -o yaml` once the pod stops.
    let _ = std::fs::write(pod.path(Path::new("/dev/termination-log")), &text);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        println!("VM {name}: stopped");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_sizes() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("disk.img");
        std::fs::File::create(&raw)
            .unwrap()
            .set_len(3 << 20)
            .unwrap();
        assert_eq!(inspect(&raw).unwrap(), ("raw", 3 << 20));
        let mut q = b"QFI\xfb".to_vec();
        q.resize(24, 0);
        q.extend_from_slice(&(10u64 << 30).to_be_bytes());
        let qcow = dir.path().join("q.img");
        std::fs::write(&qcow, &q).unwrap();
        assert_eq!(inspect(&qcow).unwrap(), ("qcow2", 10 << 30));
        assert!(inspect(&dir.path().join("missing")).is_err());
    }
}
