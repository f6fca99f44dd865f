//! Where a pod's files are on its node, and a volume on the host.

use std::path::PathBuf;

/// A pod's directory on its node: `volumes/<name>`, `containers/<name>/root`,
/// `logs/<name>/<restart count>.log`.
#[derive(Debug, Clone)]
pub struct PodDir(pub PathBuf);

impl PodDir {
    pub fn volume(&self, name: &str) -> PathBuf {
        self.0.join("volumes").join(name)
    }

    pub fn root(&self, container: &str) -> PathBuf {
        self.0.join("containers").join(container).join("root")
    }

    /// The log of a container's `instance`-th run (its restart count then), as the kubelet keeps
    /// the current and the previous one.
    pub fn log(&self, container: &str, instance: u32) -> PathBuf {
        self.logs(container).join(format!("{instance}.log"))
    }

    pub fn logs(&self, container: &str) -> PathBuf {
        self.0.join("logs").join(container)
    }
}

/// A volume on the host: a directory, or a file standing for a block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostVolume {
    pub path: PathBuf,
    pub block: bool,
    /// A claim's volume: its capacity in bytes (what cdi-rs programs take as its size).
    pub capacity: Option<u64>,
}
