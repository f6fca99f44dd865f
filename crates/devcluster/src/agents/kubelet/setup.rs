//! Getting a pod ready to run: its volumes resolved to host paths (claims to their volumes'
//! directories or block files; Secrets, ConfigMaps, downward API and emptyDir written into the
//! pod's directory), each container's environment, and each container's root: a directory where
//! its mount paths are links to those volumes and its termination log is a file.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, KeyToPath, ObjectFieldSelector, PersistentVolume, PersistentVolumeClaim,
    Pod, Secret, Volume,
};
use kube::{Api, Client};

use super::images::expand;
use crate::agents::localpath::CSI_DRIVER;

/// Why a pod cannot start yet: something still to come (the container stays
/// `ContainerCreating`), a mistake in the pod (`CreateContainerConfigError`), or an image with
/// nothing to run (`ErrImagePull`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    Waiting(String),
    Config(String),
    /// No program for the image.
    Image(String),
}

impl Blocked {
    pub fn reason(&self) -> &'static str {
        match self {
            Blocked::Waiting(_) => "ContainerCreating",
            Blocked::Config(_) => "CreateContainerConfigError",
            Blocked::Image(_) => "ErrImagePull",
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Blocked::Waiting(m) | Blocked::Config(m) | Blocked::Image(m) => m,
        }
    }
}

/// A pod's directory on its node: `volumes/<name>`, `containers/<name>/root`, `logs/<name>.log`.
#[derive(Debug, Clone)]
pub struct PodDir(pub PathBuf);

impl PodDir {
    pub fn volume(&self, name: &str) -> PathBuf {
        self.0.join("volumes").join(name)
    }

    pub fn root(&self, container: &str) -> PathBuf {
        self.0.join("containers").join(container).join("root")
    }

    pub fn log(&self, container: &str) -> PathBuf {
        self.0.join("logs").join(format!("{container}.log"))
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

fn io_blocked(what: &str, e: io::Error) -> Blocked {
    Blocked::Waiting(format!("{what}: {e}"))
}

fn pod_ns(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

async fn claim_volume(client: &Client, ns: &str, claim: &str) -> Result<HostVolume, Blocked> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvc = claims
        .get_opt(claim)
        .await
        .map_err(|e| Blocked::Waiting(format!("reading claim {ns}/{claim}: {e}")))?
        .ok_or_else(|| Blocked::Waiting(format!("persistentvolumeclaim \"{claim}\" not found")))?;
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let name = pvc.spec.as_ref().and_then(|s| s.volume_name.clone());
    let (true, Some(name)) = (bound, name) else {
        return Err(Blocked::Waiting(format!(
            "waiting for persistentvolumeclaim \"{claim}\" to be bound"
        )));
    };
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get_opt(&name)
        .await
        .map_err(|e| Blocked::Waiting(format!("reading volume {name}: {e}")))?
        .ok_or_else(|| Blocked::Waiting(format!("persistentvolume \"{name}\" not found")))?;
    let path = crate::agents::localpath::volume_path(&pv).ok_or_else(|| {
        Blocked::Config(format!(
            "persistentvolume \"{name}\" (of claim \"{claim}\") has no source the cdi dev \
             kubelet can mount: it mounts hostPath, local and {CSI_DRIVER} volumes"
        ))
    })?;
    let block = pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
    let capacity = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref()?.get("storage"))
        .and_then(|q| cdi_core::Quantity::try_from(q).ok())
        .map(|q| q.value().max(0) as u64);
    Ok(HostVolume {
        path,
        block,
        capacity,
    })
}

/// Write `files` (relative path → content) into `dir`, replacing what was there.
fn write_files(dir: &Path, files: &BTreeMap<String, Vec<u8>>, mode: Option<i32>) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    for (rel, content) in files {
        let rel = Path::new(rel);
        if rel.is_absolute() || rel.components().any(|c| c.as_os_str() == "..") {
            return Err(io::Error::other(format!(
                "{}: a volume file path must be relative and stay inside the volume",
                rel.display()
            )));
        }
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, content)?;
        if let Some(mode) = mode {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode as u32 & 0o777))?;
        }
    }
    Ok(())
}

/// Keys to files: every key, or only `items` (each under its path); a missing item key is an
/// error unless the source is optional.
fn select(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    what: &str,
    optional: bool,
) -> Result<BTreeMap<String, Vec<u8>>, Blocked> {
    let Some(items) = items else {
        return Ok(data);
    };
    let mut out = BTreeMap::new();
    for item in items {
        match data.get(&item.key) {
            Some(v) => {
                out.insert(item.path.clone(), v.clone());
            }
            None if optional => {}
            None => {
                return Err(Blocked::Config(format!(
                    "couldn't find key {} in {what}",
                    item.key
                )));
            }
        }
    }
    Ok(out)
}

async fn secret_data(
    client: &Client,
    ns: &str,
    name: &str,
    optional: bool,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, Blocked> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    match api.get_opt(name).await {
        Ok(Some(s)) => Ok(Some(
            s.data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect(),
        )),
        Ok(None) if optional => Ok(None),
        Ok(None) => Err(Blocked::Config(format!("secret \"{name}\" not found"))),
        Err(e) => Err(Blocked::Waiting(format!("reading secret {ns}/{name}: {e}"))),
    }
}

async fn config_map_data(
    client: &Client,
    ns: &str,
    name: &str,
    optional: bool,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, Blocked> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    match api.get_opt(name).await {
        Ok(Some(c)) => {
            let mut out: BTreeMap<String, Vec<u8>> = c
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            out.extend(
                c.binary_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0)),
            );
            Ok(Some(out))
        }
        Ok(None) if optional => Ok(None),
        Ok(None) => Err(Blocked::Config(format!("configmap \"{name}\" not found"))),
        Err(e) => Err(Blocked::Waiting(format!(
            "reading configmap {ns}/{name}: {e}"
        ))),
    }
}

/// A downward API field of the pod (`metadata.name`, `metadata.labels['k']`, `status.podIP`…).
fn field(
    pod: &Pod,
    pod_ip: Ipv4Addr,
    host_ip: Ipv4Addr,
    f: &ObjectFieldSelector,
) -> Result<String, Blocked> {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref();
    let path = f.field_path.as_str();
    let keyed = |prefix: &str, map: &Option<BTreeMap<String, String>>| -> Option<String> {
        let key = path
            .strip_prefix(prefix)?
            .strip_prefix("['")?
            .strip_suffix("']")?;
        Some(
            map.as_ref()
                .and_then(|m| m.get(key))
                .cloned()
                .unwrap_or_default(),
        )
    };
    let value = match path {
        "metadata.name" => m.name.clone(),
        "metadata.namespace" => m.namespace.clone(),
        "metadata.uid" => m.uid.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.podIP" | "status.podIPs" => Some(pod_ip.to_string()),
        "status.hostIP" | "status.hostIPs" => Some(host_ip.to_string()),
        _ => keyed("metadata.labels", &m.labels)
            .or_else(|| keyed("metadata.annotations", &m.annotations)),
    };
    match value {
        Some(v) => Ok(v),
        None if path.starts_with("metadata.") || path.starts_with("spec.") => Ok(String::new()),
        None => Err(Blocked::Config(format!(
            "unsupported fieldRef {path:?}: the cdi dev kubelet knows metadata.name, \
             metadata.namespace, metadata.uid, metadata.labels['…'], metadata.annotations['…'], \
             spec.nodeName, spec.serviceAccountName, status.podIP and status.hostIP"
        ))),
    }
}

/// The pod's volumes on the host; Secret, ConfigMap, downward API and emptyDir volumes are
/// written under the pod's directory now.
pub async fn volumes(
    client: &Client,
    pod: &Pod,
    dir: &PodDir,
    pod_ip: Ipv4Addr,
    host_ip: Ipv4Addr,
) -> Result<HashMap<String, HostVolume>, Blocked> {
    let ns = pod_ns(pod);
    let mut out = HashMap::new();
    let empty = Vec::new();
    let specs: &Vec<Volume> = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .unwrap_or(&empty);
    for v in specs {
        let here = dir.volume(&v.name);
        let write = |files: &BTreeMap<String, Vec<u8>>, mode: Option<i32>| {
            write_files(&here, files, mode)
                .map_err(|e| Blocked::Config(format!("writing volume \"{}\": {e}", v.name)))?;
            Ok::<_, Blocked>(HostVolume {
                path: here.clone(),
                block: false,
                capacity: None,
            })
        };
        let volume = if let Some(c) = &v.persistent_volume_claim {
            claim_volume(client, ns, &c.claim_name).await?
        } else if let Some(s) = &v.secret {
            let name = s.secret_name.as_deref().unwrap_or("");
            let optional = s.optional.unwrap_or(false);
            let data = secret_data(client, ns, name, optional)
                .await?
                .unwrap_or_default();
            let files = select(
                data,
                s.items.as_ref(),
                &format!("Secret {ns}/{name}"),
                optional,
            )?;
            write(&files, Some(s.default_mode.unwrap_or(0o644)))?
        } else if let Some(c) = &v.config_map {
            let name = c.name.as_str();
            let optional = c.optional.unwrap_or(false);
            let data = config_map_data(client, ns, name, optional)
                .await?
                .unwrap_or_default();
            let files = select(
                data,
                c.items.as_ref(),
                &format!("ConfigMap {ns}/{name}"),
                optional,
            )?;
            write(&files, Some(c.default_mode.unwrap_or(0o644)))?
        } else if let Some(d) = &v.downward_api {
            let mut files = BTreeMap::new();
            for item in d.items.iter().flatten() {
                let Some(f) = &item.field_ref else {
                    return Err(Blocked::Config(format!(
                        "volume \"{}\": only fieldRef items are supported by the cdi dev kubelet",
                        v.name
                    )));
                };
                files.insert(
                    item.path.clone(),
                    field(pod, pod_ip, host_ip, f)?.into_bytes(),
                );
            }
            write(&files, d.default_mode)?
        } else if v.empty_dir.is_some() {
            std::fs::create_dir_all(&here).map_err(|e| io_blocked("creating an emptyDir", e))?;
            HostVolume {
                path: here,
                block: false,
                capacity: None,
            }
        } else if let Some(h) = &v.host_path {
            HostVolume {
                path: h.path.clone().into(),
                block: false,
                capacity: None,
            }
        } else {
            return Err(Blocked::Config(format!(
                "volume \"{}\" is of a type the cdi dev kubelet does not mount: it mounts \
                 persistentVolumeClaim, secret, configMap, downwardAPI, emptyDir and hostPath",
                v.name
            )));
        };
        out.insert(v.name.clone(), volume);
    }
    Ok(out)
}

/// One key of a Secret's or ConfigMap's data (`None` when it or its source is optional and
/// missing).
fn key_of(
    data: Option<BTreeMap<String, Vec<u8>>>,
    key: &str,
    optional: bool,
    what: &str,
) -> Result<Option<String>, Blocked> {
    let Some(data) = data else {
        return Ok(None);
    };
    match data.get(key) {
        Some(v) => Ok(Some(String::from_utf8_lossy(v).into_owned())),
        None if optional => Ok(None),
        None => Err(Blocked::Config(format!(
            "couldn't find key {key} in {what}"
        ))),
    }
}

/// A container's environment: `envFrom` first, then `env` (later entries win, `$(VAR)` refers to
/// earlier ones), with Secret and ConfigMap keys and downward API fields resolved.
pub async fn environment(
    client: &Client,
    pod: &Pod,
    c: &Container,
    pod_ip: Ipv4Addr,
    host_ip: Ipv4Addr,
) -> Result<Vec<(String, String)>, Blocked> {
    let ns = pod_ns(pod);
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
        env.retain(|(name, _)| *name != k);
        env.push((k, v));
    };
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let data = if let Some(s) = &from.secret_ref {
            secret_data(client, ns, &s.name, s.optional.unwrap_or(false)).await?
        } else if let Some(m) = &from.config_map_ref {
            config_map_data(client, ns, &m.name, m.optional.unwrap_or(false)).await?
        } else {
            None
        };
        for (k, v) in data.unwrap_or_default() {
            set(
                &mut env,
                format!("{prefix}{k}"),
                String::from_utf8_lossy(&v).into_owned(),
            );
        }
    }
    for e in c.env.iter().flatten() {
        let value = match &e.value_from {
            None => {
                let known =
                    |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
                Some(expand(e.value.as_deref().unwrap_or(""), &known))
            }
            Some(from) => {
                if let Some(k) = &from.secret_key_ref {
                    let optional = k.optional.unwrap_or(false);
                    let data = secret_data(client, ns, &k.name, optional).await?;
                    key_of(data, &k.key, optional, &format!("Secret {ns}/{}", k.name))?
                } else if let Some(k) = &from.config_map_key_ref {
                    let optional = k.optional.unwrap_or(false);
                    let data = config_map_data(client, ns, &k.name, optional).await?;
                    key_of(
                        data,
                        &k.key,
                        optional,
                        &format!("ConfigMap {ns}/{}", k.name),
                    )?
                } else if let Some(f) = &from.field_ref {
                    Some(field(pod, pod_ip, host_ip, f)?)
                } else {
                    return Err(Blocked::Config(format!(
                        "env {}: only secretKeyRef, configMapKeyRef and fieldRef are supported by \
                         the cdi dev kubelet",
                        e.name
                    )));
                }
            }
        };
        if let Some(v) = value {
            set(&mut env, e.name.clone(), v);
        }
    }
    Ok(env)
}

/// Replace whatever is at `link` by a symbolic link to `target`.
fn link(target: &Path, link: &Path) -> io::Result<()> {
    if let Some(parent) = link.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::symlink_metadata(link) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(link)?,
        Ok(_) => std::fs::remove_file(link)?,
        Err(_) => {}
    }
    std::os::unix::fs::symlink(target, link)
}

/// The capacities of a container's claim volumes by the path it sees them at, as
/// `PATH=BYTES,…` for `cdi_core::devpod::CAPACITY_ENV`.
pub fn capacities(c: &Container, volumes: &HashMap<String, HostVolume>) -> String {
    let mounts = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (&m.name, &m.mount_path));
    let devices = c
        .volume_devices
        .iter()
        .flatten()
        .map(|d| (&d.name, &d.device_path));
    mounts
        .chain(devices)
        .filter_map(|(name, at)| Some(format!("{at}={}", volumes.get(name)?.capacity?)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Build the container's root: its mount paths and device paths linked to the volumes (a
/// `subPath` below the volume), its termination log an empty file. Returns the log's host path.
pub fn root(
    dir: &PodDir,
    c: &Container,
    volumes: &HashMap<String, HostVolume>,
) -> Result<PathBuf, Blocked> {
    let root = dir.root(&c.name);
    let config = |m: String| Blocked::Config(format!("container \"{}\": {m}", c.name));
    let mut links = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let v = volumes.get(&m.name).ok_or_else(|| {
            config(format!(
                "volumeMount {:?} names no volume of the pod",
                m.name
            ))
        })?;
        if v.block {
            return Err(config(format!(
                "volume {:?} is a Block volume: use volumeDevices, not volumeMounts",
                m.name
            )));
        }
        let mut target = v.path.clone();
        if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            if Path::new(sub).is_absolute() || sub.split('/').any(|p| p == "..") {
                return Err(config(format!(
                    "subPath {sub:?} must be relative and stay inside the volume"
                )));
            }
            target = target.join(sub);
            std::fs::create_dir_all(&target).map_err(|e| io_blocked("creating a subPath", e))?;
        }
        links.push((target, m.mount_path.clone()));
    }
    for d in c.volume_devices.iter().flatten() {
        let v = volumes.get(&d.name).ok_or_else(|| {
            config(format!(
                "volumeDevice {:?} names no volume of the pod",
                d.name
            ))
        })?;
        if !v.block {
            return Err(config(format!(
                "volume {:?} is a Filesystem volume: use volumeMounts, not volumeDevices",
                d.name
            )));
        }
        links.push((v.path.clone(), d.device_path.clone()));
    }
    std::fs::create_dir_all(&root).map_err(|e| io_blocked("creating the container's root", e))?;
    for (target, at) in links {
        let at = cdi_core::devpod::in_root(Some(&root), Path::new(&at));
        link(&target, &at).map_err(|e| io_blocked(&format!("linking {}", at.display()), e))?;
    }
    let log_path = c
        .termination_message_path
        .as_deref()
        .unwrap_or("/dev/termination-log");
    let log = cdi_core::devpod::in_root(Some(&root), Path::new(log_path));
    if let Some(parent) = log.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| io_blocked("creating the termination log", e))?;
    }
    std::fs::write(&log, b"").map_err(|e| io_blocked("creating the termination log", e))?;
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn roots_link_volumes_and_devices() {
        let tmp = tempfile::tempdir().unwrap();
        let pv = tmp.path().join("pv");
        let block = tmp.path().join("disk.img");
        std::fs::create_dir_all(&pv).unwrap();
        std::fs::write(&block, b"").unwrap();
        let dir = PodDir(tmp.path().join("pod"));
        let volumes: HashMap<String, HostVolume> = [
            (
                "data".to_string(),
                HostVolume {
                    path: pv.clone(),
                    block: false,
                    capacity: None,
                },
            ),
            (
                "disk".to_string(),
                HostVolume {
                    path: block.clone(),
                    block: true,
                    capacity: None,
                },
            ),
        ]
        .into();
        let c: Container = serde_json::from_value(json!({
            "name": "c", "image": "x",
            "volumeMounts": [{"name": "data", "mountPath": "/data"},
                {"name": "data", "mountPath": "/sub", "subPath": "a/b"}],
            "volumeDevices": [{"name": "disk", "devicePath": "/dev/cdi-block-volume"}],
        }))
        .unwrap();
        let log = root(&dir, &c, &volumes).unwrap();
        let r = dir.root("c");
        assert_eq!(std::fs::read_link(r.join("data")).unwrap(), pv);
        assert_eq!(std::fs::read_link(r.join("sub")).unwrap(), pv.join("a/b"));
        assert!(pv.join("a/b").is_dir());
        assert_eq!(
            std::fs::read_link(r.join("dev/cdi-block-volume")).unwrap(),
            block
        );
        assert_eq!(log, r.join("dev/termination-log"));
        // Again, as after a restart: same links.
        root(&dir, &c, &volumes).unwrap();
        std::fs::write(r.join("data/f"), b"x").unwrap();
        assert_eq!(std::fs::read(pv.join("f")).unwrap(), b"x");

        let wrong: Container = serde_json::from_value(json!({
            "name": "c", "image": "x",
            "volumeMounts": [{"name": "disk", "mountPath": "/data"}],
        }))
        .unwrap();
        let err = root(&dir, &wrong, &volumes).unwrap_err();
        assert!(
            matches!(&err, Blocked::Config(m) if m.contains("use volumeDevices")),
            "{err:?}"
        );
        let escape: Container = serde_json::from_value(json!({
            "name": "c", "image": "x",
            "volumeMounts": [{"name": "data", "mountPath": "/d", "subPath": "../x"}],
        }))
        .unwrap();
        assert!(matches!(
            root(&dir, &escape, &volumes),
            Err(Blocked::Config(_))
        ));
    }

    #[test]
    fn files_stay_inside_their_volume() {
        let tmp = tempfile::tempdir().unwrap();
        let files: BTreeMap<String, Vec<u8>> = [("../x".to_string(), b"x".to_vec())].into();
        assert!(write_files(&tmp.path().join("v"), &files, None).is_err());
        let files: BTreeMap<String, Vec<u8>> = [("a/b".to_string(), b"x".to_vec())].into();
        write_files(&tmp.path().join("v"), &files, Some(0o600)).unwrap();
        assert_eq!(std::fs::read(tmp.path().join("v/a/b")).unwrap(), b"x");
    }
}
