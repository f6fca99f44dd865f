//! The contract between the development cluster's kubelet and the programs it runs. That kubelet
//! runs containers as host processes, so a pod's filesystem is a directory of links (its volumes,
//! secrets and termination log under their mount paths) and its address one of its own in
//! 127.0.0.0/8. It tells our programs both through the environment; every absolute path they
//! would use in a container is then taken inside that directory, and listeners on "any address"
//! bind the pod's address instead, so two pods can serve the same port.

use std::net::{IpAddr, SocketAddr};
use std::path::{Component, Path, PathBuf};

/// The directory standing for the container's `/`.
pub const ROOT_ENV: &str = "CDI_POD_ROOT";
/// The pod's own address.
pub const IP_ENV: &str = "CDI_POD_IP";
/// The size of each claim volume, by the path the container sees it at: `PATH=BYTES,…`. A
/// directory on the host reports the host's free space; a provisioned volume has its own size,
/// and cdi-rs's programs take this one, as they would the size of a real volume.
pub const CAPACITY_ENV: &str = "CDI_POD_CAPACITY";

/// Where a container path is on the host: below `root` when there is one, the path itself
/// otherwise. `..` cannot climb out of the root.
pub fn in_root(root: Option<&Path>, path: &Path) -> PathBuf {
    let Some(root) = root else {
        return path.to_path_buf();
    };
    let mut out = root.to_path_buf();
    let mut depth = 0usize;
    for c in path.components() {
        match c {
            Component::Normal(part) => {
                out.push(part);
                depth += 1;
            }
            Component::ParentDir if depth > 0 => {
                out.pop();
                depth -= 1;
            }
            // The root, `.`, a `..` at the top and prefixes stay where they are.
            _ => {}
        }
    }
    out
}

/// The address to listen on: the pod's own instead of an unspecified one.
pub fn listen_on(pod_ip: Option<IpAddr>, addr: SocketAddr) -> SocketAddr {
    match pod_ip {
        Some(ip) if addr.ip().is_unspecified() => SocketAddr::new(ip, addr.port()),
        _ => addr,
    }
}

/// Both, read from an environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DevPod {
    pub root: Option<PathBuf>,
    pub ip: Option<IpAddr>,
    /// Volume capacities by container path.
    pub capacities: Vec<(PathBuf, u64)>,
}

impl DevPod {
    /// From the variables; an address that does not parse is an error naming it.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<DevPod, String> {
        let root = get(ROOT_ENV).filter(|r| !r.is_empty()).map(PathBuf::from);
        let ip = match get(IP_ENV).filter(|v| !v.is_empty()) {
            Some(v) => Some(
                v.parse()
                    .map_err(|_| format!("{IP_ENV}={v:?} is not an IP address"))?,
            ),
            None => None,
        };
        let mut capacities = Vec::new();
        for item in get(CAPACITY_ENV)
            .unwrap_or_default()
            .split(',')
            .filter(|i| !i.is_empty())
        {
            let parsed = item
                .rsplit_once('=')
                .and_then(|(p, b)| Some((PathBuf::from(p), b.parse().ok()?)));
            match parsed {
                Some(c) => capacities.push(c),
                None => return Err(format!("{CAPACITY_ENV}: {item:?} is not PATH=BYTES")),
            }
        }
        Ok(DevPod {
            root,
            ip,
            capacities,
        })
    }

    /// The capacity of the volume seen at container path `at`, when the kubelet gave one.
    pub fn capacity(&self, at: &Path) -> Option<u64> {
        self.capacities
            .iter()
            .find(|(p, _)| p == at)
            .map(|(_, b)| *b)
    }

    pub fn path(&self, path: &Path) -> PathBuf {
        in_root(self.root.as_deref(), path)
    }

    pub fn listen(&self, addr: SocketAddr) -> SocketAddr {
        listen_on(self.ip, addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_root() {
        let root = Path::new("/srv/pod/root");
        assert_eq!(in_root(None, Path::new("/data")), Path::new("/data"));
        assert_eq!(
            in_root(Some(root), Path::new("/dev/termination-log")),
            Path::new("/srv/pod/root/dev/termination-log")
        );
        assert_eq!(
            in_root(Some(root), Path::new("/../../etc/passwd")),
            Path::new("/srv/pod/root/etc/passwd")
        );
        assert_eq!(
            in_root(Some(root), Path::new("/a/b/../c")),
            Path::new("/srv/pod/root/a/c")
        );
        assert_eq!(in_root(Some(root), Path::new("data")), root.join("data"));
    }

    #[test]
    fn unspecified_listeners_take_the_pod_address() {
        let ip: IpAddr = "127.2.0.5".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8443".parse().unwrap();
        let fixed: SocketAddr = "127.0.0.1:9000".parse().unwrap();
        assert_eq!(listen_on(Some(ip), any), "127.2.0.5:8443".parse().unwrap());
        assert_eq!(listen_on(Some(ip), fixed), fixed);
        assert_eq!(listen_on(None, any), any);
    }

    #[test]
    fn read_from_the_environment() {
        let env = |k: &str| match k {
            ROOT_ENV => Some("/r".to_string()),
            IP_ENV => Some("127.3.0.2".to_string()),
            CAPACITY_ENV => Some("/data=1073741824,/dev/xvda=5".to_string()),
            _ => None,
        };
        let pod = DevPod::from_env(env).unwrap();
        assert_eq!(pod.capacity(Path::new("/data")), Some(1 << 30));
        assert_eq!(pod.capacity(Path::new("/dev/xvda")), Some(5));
        assert_eq!(pod.capacity(Path::new("/scratch")), None);
        let bad = DevPod::from_env(|k| (k == CAPACITY_ENV).then(|| "/data".to_string()));
        assert!(bad.unwrap_err().contains("PATH=BYTES"));
        assert_eq!(pod.path(Path::new("/data")), Path::new("/r/data"));
        assert_eq!(pod.ip, Some("127.3.0.2".parse().unwrap()));
        let bad = DevPod::from_env(|k| (k == IP_ENV).then(|| "nope".to_string()));
        assert!(bad.unwrap_err().contains("CDI_POD_IP=\"nope\""));
        assert_eq!(DevPod::from_env(|_| None).unwrap(), DevPod::default());
    }
}
