//! Getting a pod ready to run: its volumes resolved to host paths (claims to their volumes'
//! directories or block files; Secrets, ConfigMaps, downward API and emptyDir written into the
//! pod's directory), each container's environment, and each container's root: a directory where
//! its mount paths are links to those volumes and its termination log is a file.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, KeyToPath, ObjectFieldSelector, PersistentVolume, PersistentVolumeClaim,
    Pod, Secret, Volume,
};
use kube::{Api, Client};

use super::images::expand;
use crate::agents::volumes::{CSI_DRIVER, SHARED_DRIVER};

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

fn invalid(field: &str, value: &str, why: &str) -> String {
    format!("{field}: Invalid value: {value:?}: {why}")
}

/// Why `value` cannot be one component of a host path (a pod's uid, a container's or a
/// volume's name), if it cannot. The API server checks names too; the kubelet does not rely on
/// it, since it is the one making the paths.
pub fn bad_component(value: &str) -> Option<&'static str> {
    if value.is_empty() {
        Some("must not be empty")
    } else if value == "." || value == ".." {
        Some("must not be \".\" or \"..\"")
    } else if value.contains('/') {
        Some("must not contain '/'")
    } else if value.contains('\0') {
        Some("must not contain NUL")
    } else {
        None
    }
}

fn component(field: &str, value: &str) -> Result<(), String> {
    match bad_component(value) {
        Some(why) => Err(invalid(field, value, why)),
        None => Ok(()),
    }
}

/// A path below a volume (a `subPath`, an item's `path`, a key as a file name): relative, no
/// `..`, naming something inside. Returns its plain components.
fn relative(value: &str) -> Result<PathBuf, &'static str> {
    if value.contains('\0') {
        return Err("must not contain NUL");
    }
    let path = Path::new(value);
    if path.is_absolute() {
        return Err("must be a relative path");
    }
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            _ => return Err("must not contain '..'"),
        }
    }
    if out.as_os_str().is_empty() {
        return Err("must name something inside the volume");
    }
    Ok(out)
}

/// A path the container sees (`mountPath`, `devicePath`, `terminationMessagePath`) as a path
/// below its root: `..` stops at the root, as it does at `/`, so it never leads out. The root
/// itself is refused: a link there would replace it.
fn in_container(value: &str) -> Result<PathBuf, &'static str> {
    if value.contains('\0') {
        return Err("must not contain NUL");
    }
    let mut out = PathBuf::new();
    for c in Path::new(value).components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    if out.as_os_str().is_empty() {
        return Err("names the container's root, which cannot be a mount or a file");
    }
    Ok(out)
}

/// Where a container's mounts, devices and termination log go, below its root.
struct Layout {
    /// Each `volumeMounts` entry: the path, and its `subPath` below the volume.
    mounts: Vec<(PathBuf, Option<PathBuf>)>,
    devices: Vec<PathBuf>,
    log: PathBuf,
}

/// Check the paths of a container (`field` names it in messages, as `spec.containers[0]`).
/// Mounts may not share a path or lie inside one another, nor the termination log inside a
/// mount: every mount is a link, and making one inside another would make it in the volume
/// the other points to, outside the pod's directory.
fn layout(c: &Container, field: &str) -> Result<Layout, String> {
    let mut at: Vec<(PathBuf, String, &str)> = Vec::new();
    let mut mounts = Vec::new();
    for (j, m) in c.volume_mounts.iter().flatten().enumerate() {
        let f = format!("{field}.volumeMounts[{j}].mountPath");
        let path = in_container(&m.mount_path).map_err(|why| invalid(&f, &m.mount_path, why))?;
        let sub = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => Some(relative(sub).map_err(|why| {
                invalid(
                    &format!("{field}.volumeMounts[{j}].subPath"),
                    sub,
                    &format!("{why}: it must stay inside the volume"),
                )
            })?),
            None => None,
        };
        at.push((path.clone(), f, &m.mount_path));
        mounts.push((path, sub));
    }
    let mut devices = Vec::new();
    for (j, d) in c.volume_devices.iter().flatten().enumerate() {
        let f = format!("{field}.volumeDevices[{j}].devicePath");
        let path = in_container(&d.device_path).map_err(|why| invalid(&f, &d.device_path, why))?;
        at.push((path.clone(), f, &d.device_path));
        devices.push(path);
    }
    for (i, (a, fa, va)) in at.iter().enumerate() {
        for (b, fb, vb) in &at[i + 1..] {
            let (inner, outer) = if b.starts_with(a) {
                ((fb, vb), (fa, va))
            } else if a.starts_with(b) {
                ((fa, va), (fb, vb))
            } else {
                continue;
            };
            let why = if a == b {
                format!("must be unique: {} is {:?} too", outer.0, outer.1)
            } else {
                format!(
                    "lies inside {} {:?}: the cdi dev kubelet does not nest mounts",
                    outer.0, outer.1
                )
            };
            return Err(invalid(inner.0, inner.1, &why));
        }
    }
    let log_path = c
        .termination_message_path
        .as_deref()
        .unwrap_or("/dev/termination-log");
    let f = format!("{field}.terminationMessagePath");
    let log = in_container(log_path).map_err(|why| invalid(&f, log_path, why))?;
    if let Some((_, fa, va)) = at.iter().find(|(a, _, _)| log.starts_with(a)) {
        return Err(invalid(
            &f,
            log_path,
            &format!(
                "lies inside {fa} {va:?}: the kubelet writes the termination log only in the \
                 container's own root"
            ),
        ));
    }
    Ok(Layout {
        mounts,
        devices,
        log,
    })
}

/// Check everything of the pod that becomes part of a host path, before anything is made:
/// a pod that fails is not run (`CreateContainerConfigError`, naming the field and value).
pub fn check(pod: &Pod) -> Result<(), Blocked> {
    let run = || -> Result<(), String> {
        let m = &pod.metadata;
        component("metadata.uid", m.uid.as_deref().unwrap_or(""))?;
        component("metadata.namespace", pod_ns(pod))?;
        component("metadata.name", m.name.as_deref().unwrap_or(""))?;
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        for (i, v) in spec.volumes.iter().flatten().enumerate() {
            let field = format!("spec.volumes[{i}]");
            component(&format!("{field}.name"), &v.name)?;
            let items = |kind: &str, paths: Vec<&str>| -> Result<(), String> {
                for (j, p) in paths.into_iter().enumerate() {
                    relative(p).map_err(|why| {
                        invalid(&format!("{field}.{kind}.items[{j}].path"), p, why)
                    })?;
                }
                Ok(())
            };
            fn key_paths(items: &Option<Vec<KeyToPath>>) -> Vec<&str> {
                items.iter().flatten().map(|i| i.path.as_str()).collect()
            }
            if let Some(s) = &v.secret {
                items("secret", key_paths(&s.items))?;
            }
            if let Some(c) = &v.config_map {
                items("configMap", key_paths(&c.items))?;
            }
            if let Some(d) = &v.downward_api {
                let paths = d.items.iter().flatten().map(|i| i.path.as_str()).collect();
                items("downwardAPI", paths)?;
            }
        }
        let init = spec.init_containers.iter().flatten().enumerate();
        let init = init.map(|(i, c)| (format!("spec.initContainers[{i}]"), c));
        let main = spec.containers.iter().enumerate();
        let main = main.map(|(i, c)| (format!("spec.containers[{i}]"), c));
        for (field, c) in init.chain(main) {
            component(&format!("{field}.name"), &c.name)?;
            layout(c, &field)?;
        }
        Ok(())
    };
    run().map_err(Blocked::Config)
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
    // A claim being deleted is kept only for the pods already running with it.
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(Blocked::Waiting(format!(
            "can't start pod because PVC {ns}/{claim} is being deleted"
        )));
    }
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
    let path = crate::agents::volumes::volume_path(&pv).ok_or_else(|| {
        Blocked::Config(format!(
            "persistentvolume \"{name}\" (of claim \"{claim}\") has no source the cdi dev \
             kubelet can mount: it mounts hostPath, local, {CSI_DRIVER} and {SHARED_DRIVER} volumes"
        ))
    })?;
    let block = pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
    let capacity = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref()?.get("storage"))
        .and_then(|q| k8s_rules::Quantity::try_from(q).ok())
        .map(|q| q.value().max(0) as u64);
    Ok(HostVolume {
        path,
        block,
        capacity,
    })
}

/// Write `files` (relative path → content) into `dir`, replacing what was there.
/// Write a volume's files as the kubelet's atomic writer does: into a fresh hidden directory,
/// published by renaming the `..data` link to it, each top-level name a link through `..data`.
/// A rewrite (a Secret changed) swaps every file at once: a file is never seen half written,
/// and a reader going through `..data` sees one version whole. (Reading two files by their own
/// links, a reader may still straddle a swap, and reads again.)
fn write_files(dir: &Path, files: &BTreeMap<String, Vec<u8>>, mode: Option<i32>) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut checked = Vec::new();
    for (name, content) in files {
        // Keys become file names too, and a Secret's keys are not the pod's to check.
        let rel = relative(name).map_err(|why| {
            io::Error::other(format!(
                "file {name:?}: {why}: a volume's files stay inside the volume"
            ))
        })?;
        if name.starts_with("..") {
            return Err(io::Error::other(format!(
                "file {name:?}: names starting with \"..\" are the kubelet's own"
            )));
        }
        checked.push((rel, content));
    }
    let data = dir.join("..data");
    if dir.exists() && !data.is_symlink() {
        // Written before in another layout (or by hand): start over.
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    let stamp = format!(
        "..{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let fresh = dir.join(&stamp);
    std::fs::create_dir(&fresh)?;
    let mut tops = std::collections::BTreeSet::new();
    for (rel, content) in &checked {
        let path = fresh.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, content)?;
        if let Some(mode) = mode {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode as u32 & 0o777))?;
        }
        if let Some(top) = rel.components().next() {
            tops.insert(top.as_os_str().to_os_string());
        }
    }
    let swap = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&swap);
    std::os::unix::fs::symlink(&stamp, &swap)?;
    std::fs::rename(&swap, &data)?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let text = name.to_string_lossy();
        if text == "..data" || *text == *stamp {
            continue;
        }
        if text.starts_with("..") {
            // An earlier version's directory: nothing links to it any more.
            std::fs::remove_dir_all(entry.path())?;
        } else if !tops.contains(&name) {
            std::fs::remove_file(entry.path())?;
        }
    }
    for top in &tops {
        let link = dir.join(top);
        if !link.is_symlink() {
            std::os::unix::fs::symlink(Path::new("..data").join(top), &link)?;
        }
    }
    Ok(())
}

/// Whether volume `dir` holds exactly `files` already.
fn holds(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let shown = entries
        .filter_map(|e| e.ok())
        .filter(|e| !e.file_name().to_string_lossy().starts_with(".."))
        .count();
    let tops: std::collections::BTreeSet<&str> = files
        .keys()
        .filter_map(|k| k.split('/').find(|c| !c.is_empty()))
        .collect();
    shown == tops.len()
        && files.iter().all(|(name, content)| {
            relative(name)
                .is_ok_and(|rel| std::fs::read(dir.join(rel)).ok().as_ref() == Some(content))
        })
}

/// Bring a running pod's Secret and ConfigMap volumes up to date, as the kubelet's periodic
/// sync does (an operator rotating a certificate relies on it); what cannot be read now is
/// left as it is.
pub async fn refresh_volumes(client: &Client, pod: &Pod, dir: &PodDir) {
    let ns = pod_ns(pod);
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let Some(Ok((files, mode, what))) = object_files(client, ns, v).await else {
            continue;
        };
        let here = dir.volume(&v.name);
        if holds(&here, &files) {
            continue;
        }
        match write_files(&here, &files, Some(mode)) {
            Ok(()) => tracing::info!(volume = %v.name, source = %what, "updated a volume"),
            Err(e) => tracing::warn!(volume = %v.name, error = %e, "updating a volume"),
        }
    }
}

/// The files of a Secret or ConfigMap volume (None for other volumes), with their mode and
/// the object they come from.
async fn object_files(
    client: &Client,
    ns: &str,
    v: &Volume,
) -> Option<Result<(BTreeMap<String, Vec<u8>>, i32, String), Blocked>> {
    let (data, items, what, mode, optional) = if let Some(s) = &v.secret {
        let name = s.secret_name.as_deref().unwrap_or("");
        let optional = s.optional.unwrap_or(false);
        (
            secret_data(client, ns, name, optional).await,
            s.items.as_ref(),
            format!("Secret {ns}/{name}"),
            s.default_mode.unwrap_or(0o644),
            optional,
        )
    } else if let Some(c) = &v.config_map {
        let optional = c.optional.unwrap_or(false);
        (
            config_map_data(client, ns, &c.name, optional).await,
            c.items.as_ref(),
            format!("ConfigMap {ns}/{}", c.name),
            c.default_mode.unwrap_or(0o644),
            optional,
        )
    } else {
        return None;
    };
    Some(data.and_then(|data| {
        let files = select(data.unwrap_or_default(), items, &what, optional)?;
        Ok((files, mode, what))
    }))
}

/// Whether the pod has volumes [`refresh_volumes`] keeps up to date.
pub fn has_refreshed_volumes(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| v.secret.is_some() || v.config_map.is_some())
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
        } else if let Some(found) = object_files(client, ns, v).await {
            let (files, mode, _) = found?;
            write(&files, Some(mode))?
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
        } else if let Some(p) = &v.projected {
            let mut files = BTreeMap::new();
            for source in p.sources.iter().flatten() {
                files
                    .extend(projected_source(client, pod, pod_ip, host_ip, &v.name, source).await?);
            }
            write(&files, Some(p.default_mode.unwrap_or(0o644)))?
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
                 persistentVolumeClaim, secret, configMap, downwardAPI, projected, emptyDir and \
                 hostPath",
                v.name
            )));
        };
        out.insert(v.name.clone(), volume);
    }
    Ok(out)
}

/// The files of one source of a projected volume: a Secret's or ConfigMap's keys, downward API
/// fields, or a ServiceAccount token bound to the pod (asked of the API server as the kubelet
/// asks it, with a TokenRequest).
async fn projected_source(
    client: &Client,
    pod: &Pod,
    pod_ip: Ipv4Addr,
    host_ip: Ipv4Addr,
    volume: &str,
    source: &k8s_openapi::api::core::v1::VolumeProjection,
) -> Result<BTreeMap<String, Vec<u8>>, Blocked> {
    let ns = pod_ns(pod);
    if let Some(s) = &source.secret {
        let optional = s.optional.unwrap_or(false);
        let data = secret_data(client, ns, &s.name, optional).await?;
        return select(
            data.unwrap_or_default(),
            s.items.as_ref(),
            &format!("Secret {ns}/{}", s.name),
            optional,
        );
    }
    if let Some(c) = &source.config_map {
        let optional = c.optional.unwrap_or(false);
        let data = config_map_data(client, ns, &c.name, optional).await?;
        return select(
            data.unwrap_or_default(),
            c.items.as_ref(),
            &format!("ConfigMap {ns}/{}", c.name),
            optional,
        );
    }
    if let Some(d) = &source.downward_api {
        let mut files = BTreeMap::new();
        for item in d.items.iter().flatten() {
            let Some(f) = &item.field_ref else {
                return Err(Blocked::Config(format!(
                    "volume \"{volume}\": only fieldRef items are supported by the cdi dev kubelet"
                )));
            };
            files.insert(
                item.path.clone(),
                field(pod, pod_ip, host_ip, f)?.into_bytes(),
            );
        }
        return Ok(files);
    }
    if let Some(t) = &source.service_account_token {
        let token = service_account_token(client, pod, t).await?;
        return Ok(BTreeMap::from([(t.path.clone(), token.into_bytes())]));
    }
    Err(Blocked::Config(format!(
        "volume \"{volume}\": a projected source of a kind the cdi dev kubelet does not write \
         (it writes secret, configMap, downwardAPI and serviceAccountToken)"
    )))
}

/// A token of the pod's ServiceAccount, bound to the pod, for `source`'s audience and lifetime.
async fn service_account_token(
    client: &Client,
    pod: &Pod,
    source: &k8s_openapi::api::core::v1::ServiceAccountTokenProjection,
) -> Result<String, Blocked> {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    let ns = pod_ns(pod);
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into());
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: source.audience.clone().into_iter().collect(),
            expiration_seconds: source.expiration_seconds,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), ns);
    let answer = accounts
        .create_token_request(&account, &Default::default(), &request)
        .await
        .map_err(|e| {
            Blocked::Waiting(format!(
                "requesting a token of ServiceAccount {ns}/{account}: {e}"
            ))
        })?;
    answer
        .status
        .map(|s| s.token)
        .ok_or_else(|| Blocked::Waiting(format!("no token for ServiceAccount {ns}/{account}")))
}

/// The ServiceAccount token sources of a pod's projected volumes.
fn token_sources(
    pod: &Pod,
) -> impl Iterator<
    Item = (
        &Volume,
        Option<i32>,
        &k8s_openapi::api::core::v1::ServiceAccountTokenProjection,
    ),
> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes.into_iter().flatten().flat_map(|v| {
        let p = v.projected.as_ref();
        let sources = p.and_then(|p| p.sources.as_ref()).into_iter().flatten();
        sources.filter_map(move |s| {
            let t = s.service_account_token.as_ref()?;
            Some((v, p.and_then(|p| p.default_mode), t))
        })
    })
}

/// The shortest lifetime of the pod's projected tokens, in seconds (kube's minimum is 600).
pub fn token_lifetime(pod: &Pod) -> Option<u64> {
    token_sources(pod)
        .map(|(_, _, t)| t.expiration_seconds.unwrap_or(3600).max(600) as u64)
        .min()
}

/// Write fresh ServiceAccount tokens into the pod's projected volumes, as the kubelet renews
/// them before they expire. Each file is replaced by a rename inside its directory, which a
/// container may have mounted.
pub async fn renew_tokens(client: &Client, pod: &Pod, dir: &PodDir) {
    use std::os::unix::fs::PermissionsExt;
    for (v, mode, t) in token_sources(pod) {
        let Ok(token) = service_account_token(client, pod, t).await else {
            continue;
        };
        let Ok(rel) = relative(&t.path) else { continue };
        let path = dir.volume(&v.name).join(rel);
        let fresh = path.with_extension("renewing");
        let written = std::fs::write(&fresh, token.as_bytes())
            .and_then(|()| {
                let mode = mode.unwrap_or(0o644) as u32 & 0o777;
                std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(mode))
            })
            .and_then(|()| std::fs::rename(&fresh, &path));
        if let Err(e) = written {
            tracing::warn!(volume = %v.name, error = %e, "renewing a token");
        }
    }
}

/// The variables of one Service, as the kubelet sets them (`<NAME>_SERVICE_HOST`, `_PORT`,
/// `_PORT_<PORT NAME>`, and the Docker-link ones).
fn service_variables(service: &k8s_openapi::api::core::v1::Service) -> Vec<(String, String)> {
    let spec = service.spec.clone().unwrap_or_default();
    let Some(ip) = spec.cluster_ip.filter(|ip| !ip.is_empty() && ip != "None") else {
        return Vec::new();
    };
    let ports = spec.ports.unwrap_or_default();
    let Some(first) = ports.first() else {
        return Vec::new();
    };
    let upper = |s: &str| s.to_uppercase().replace('-', "_");
    let prefix = upper(service.metadata.name.as_deref().unwrap_or(""));
    let mut out = vec![
        (format!("{prefix}_SERVICE_HOST"), ip.clone()),
        (format!("{prefix}_SERVICE_PORT"), first.port.to_string()),
    ];
    for p in &ports {
        if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
            out.push((
                format!("{prefix}_SERVICE_PORT_{}", upper(name)),
                p.port.to_string(),
            ));
        }
    }
    let proto = |p: &k8s_openapi::api::core::v1::ServicePort| {
        p.protocol.clone().unwrap_or_else(|| "TCP".into())
    };
    out.push((
        format!("{prefix}_PORT"),
        format!("{}://{ip}:{}", proto(first).to_lowercase(), first.port),
    ));
    for p in &ports {
        let (n, pr) = (p.port, proto(p));
        let base = format!("{prefix}_PORT_{n}_{}", pr.to_uppercase());
        out.push((base.clone(), format!("{}://{ip}:{n}", pr.to_lowercase())));
        out.push((format!("{base}_PROTO"), pr.to_lowercase()));
        out.push((format!("{base}_PORT"), n.to_string()));
        out.push((format!("{base}_ADDR"), ip.clone()));
    }
    out
}

/// The Service variables a container gets: those of the `kubernetes` Service (which in-cluster
/// clients find the API server by), and, unless the pod turns service links off, those of every
/// Service in its namespace.
pub async fn service_env(client: &Client, pod: &Pod) -> Vec<(String, String)> {
    use k8s_openapi::api::core::v1::Service;
    let ns = pod_ns(pod);
    let links = pod
        .spec
        .as_ref()
        .and_then(|s| s.enable_service_links)
        .unwrap_or(true);
    let mut services: Vec<Service> = Vec::new();
    if links {
        let here: Api<Service> = Api::namespaced(client.clone(), ns);
        if let Ok(list) = here.list(&Default::default()).await {
            services.extend(list.items.into_iter().filter(|s| {
                !(ns == "default" && s.metadata.name.as_deref() == Some("kubernetes"))
            }));
        }
    }
    let default: Api<Service> = Api::namespaced(client.clone(), "default");
    if let Ok(Some(kubernetes)) = default.get_opt("kubernetes").await {
        services.push(kubernetes);
    }
    services.iter().flat_map(service_variables).collect()
}

/// The pod's resolver configuration, as the kubelet writes it for the `ClusterFirst` policy (the
/// default): the cluster's DNS server first, searching the pod's namespace, then the host's
/// servers (the cluster's refuses names outside the cluster domain). None: the host's own
/// (policy `Default`, or no cluster DNS).
pub fn resolv_conf(pod: &Pod, dir: &PodDir, dns: Option<Ipv4Addr>) -> io::Result<Option<PathBuf>> {
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    let Some(dns) = dns.filter(|_| matches!(policy, "ClusterFirst" | "ClusterFirstWithHostNet"))
    else {
        return Ok(None);
    };
    let ns = pod_ns(pod);
    let domain = crate::agents::services::DOMAIN;
    let host = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let upstream: String = host
        .lines()
        .filter(|l| l.trim_start().starts_with("nameserver"))
        .map(|l| format!("{}\n", l.trim()))
        .collect();
    let text = format!(
        "search {ns}.svc.{domain} svc.{domain} {domain}\nnameserver {dns}\n{upstream}options ndots:5\n"
    );
    let path = dir.0.join("etc").join("resolv.conf");
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&path, text)?;
    Ok(Some(path))
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
    // The service variables come first: what the container sets wins.
    let mut env: Vec<(String, String)> = service_env(client, pod).await;
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

fn errno(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

/// Open the directory `base/rel`, making the missing ones, without following a symbolic link
/// (or anything but a directory) at any step below `base`: a container's process, or another
/// mount, may have put a link there, and nothing is to be made through it.
fn open_below(base: &Path, rel: &Path, what: &str) -> Result<OwnedFd, Blocked> {
    use rustix::fs::{CWD, Mode, OFlags, mkdirat, openat};
    use rustix::io::Errno;
    let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
    let mut fd = openat(CWD, base, flags, Mode::empty())
        .map_err(|e| io_blocked(&format!("{what}: opening {}", base.display()), errno(e)))?;
    let mut at = base.to_path_buf();
    for part in rel.components() {
        let Component::Normal(part) = part else {
            return Err(Blocked::Config(format!(
                "{what}: {} is not a plain path",
                rel.display()
            )));
        };
        at.push(part);
        match mkdirat(&fd, part, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => {
                return Err(io_blocked(
                    &format!("{what}: creating {}", at.display()),
                    errno(e),
                ));
            }
        }
        fd = match openat(&fd, part, flags | OFlags::NOFOLLOW, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::LOOP | Errno::NOTDIR) => {
                return Err(Blocked::Config(format!(
                    "{what}: {} is a symbolic link or not a directory: the kubelet makes \
                     nothing through it",
                    at.display()
                )));
            }
            Err(e) => {
                return Err(io_blocked(
                    &format!("{what}: opening {}", at.display()),
                    errno(e),
                ));
            }
        };
    }
    Ok(fd)
}

/// The directory holding `root/rel` (opened as [`open_below`] does) and the last component.
fn parent_below<'a>(
    root: &Path,
    rel: &'a Path,
    what: &str,
) -> Result<(OwnedFd, &'a std::ffi::OsStr), Blocked> {
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return Err(Blocked::Config(format!(
            "{what}: {} names the container's root",
            rel.display()
        )));
    };
    Ok((open_below(root, parent, what)?, name))
}

/// Replace whatever is at `root/rel` by a symbolic link to `target`.
fn link(target: &Path, root: &Path, rel: &Path) -> Result<(), Blocked> {
    use rustix::fs::{AtFlags, FileType, statat, symlinkat, unlinkat};
    let what = format!("linking {}", root.join(rel).display());
    let (parent, name) = parent_below(root, rel, &what)?;
    let failed = |e| io_blocked(&what, errno(e));
    match statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        // A directory in the way (made by the container's process): it goes, links in it
        // are removed, not followed.
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            std::fs::remove_dir_all(root.join(rel)).map_err(|e| io_blocked(&what, e))?
        }
        Ok(_) => unlinkat(&parent, name, AtFlags::empty()).map_err(failed)?,
        Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(failed(e)),
    }
    symlinkat(target, &parent, name).map_err(failed)
}

/// Open a termination log for writing, emptied, never through a symbolic link: the kubelet
/// empties it before each start, and the process may have replaced it by a link meanwhile.
pub fn empty_termination_log(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map(drop)
}

/// Read a termination log, not through a symbolic link.
pub fn read_termination_log(path: &Path) -> Vec<u8> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut out = Vec::new();
    let opened = std::fs::File::options()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path);
    if let Ok(mut f) = opened {
        let _ = f.read_to_end(&mut out);
    }
    out
}

/// The capacities of a container's claim volumes by the path it sees them at, as
/// `PATH=BYTES,…` for [`super::PodEnv::capacity`].
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
/// Every path stays below the root, and nothing is made through a symbolic link.
pub fn root(
    dir: &PodDir,
    c: &Container,
    volumes: &HashMap<String, HostVolume>,
) -> Result<PathBuf, Blocked> {
    let field = format!("container {:?}", c.name);
    component("name", &c.name).map_err(Blocked::Config)?;
    let layout = layout(c, &field).map_err(Blocked::Config)?;
    let root = dir.root(&c.name);
    let config = |m: String| Blocked::Config(format!("{field}: {m}"));
    let mut links = Vec::new();
    for (m, (at, sub)) in c.volume_mounts.iter().flatten().zip(layout.mounts) {
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
        if let Some(sub) = sub {
            open_below(&v.path, &sub, "creating a subPath")?;
            target = target.join(sub);
        }
        links.push((target, at));
    }
    for (d, at) in c.volume_devices.iter().flatten().zip(layout.devices) {
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
        links.push((v.path.clone(), at));
    }
    std::fs::create_dir_all(&root).map_err(|e| io_blocked("creating the container's root", e))?;
    for (target, at) in links {
        link(&target, &root, &at)?;
    }
    let what = "creating the termination log";
    let (parent, name) = parent_below(&root, &layout.log, what)?;
    {
        use rustix::fs::{AtFlags, FileType, Mode, OFlags, openat, statat, unlinkat};
        let failed = |e| io_blocked(what, errno(e));
        // A link left there by the process goes: the log is a file of the root's own.
        if statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink)
        {
            unlinkat(&parent, name, AtFlags::empty()).map_err(failed)?;
        }
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW;
        openat(
            &parent,
            name,
            flags | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(failed)?;
    }
    let log = root.join(&layout.log);
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

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u-1"}, "spec": spec}))
        .unwrap()
    }

    fn refused(pod: &Pod) -> String {
        match check(pod) {
            Err(Blocked::Config(m)) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn names_and_paths_from_the_pod_are_checked_before_use() {
        let c = |extra: serde_json::Value| {
            let mut c = json!({"name": "c", "image": "x"});
            c.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            c
        };
        let ok = pod(json!({"containers": [c(json!({
            "volumeMounts": [{"name": "v", "mountPath": "/../../data/../d", "subPath": "./a/b"}],
            "terminationMessagePath": "/../../../log"}))],
            "volumes": [{"name": "v", "emptyDir": {}}]}));
        assert_eq!(check(&ok), Ok(()));

        let mut bad_uid = ok.clone();
        bad_uid.metadata.uid = Some("../..".into());
        assert!(refused(&bad_uid).starts_with("metadata.uid: "));
        let cases = [
            (
                json!({"containers": [{"name": "../../x", "image": "x"}]}),
                "spec.containers[0].name: Invalid value: \"../../x\": must not contain '/'",
            ),
            (
                json!({"containers": [c(json!({}))], "initContainers": [{"name": "..", "image": "x"}]}),
                "spec.initContainers[0].name: Invalid value: \"..\"",
            ),
            (
                json!({"containers": [c(json!({}))], "volumes": [{"name": "a/b", "emptyDir": {}}]}),
                "spec.volumes[0].name: Invalid value: \"a/b\"",
            ),
            (
                json!({"containers": [c(json!({}))], "volumes": [{"name": "s",
                    "secret": {"secretName": "s", "items": [{"key": "k", "path": "../x"}]}}]}),
                "spec.volumes[0].secret.items[0].path: Invalid value: \"../x\": must not contain '..'",
            ),
            (
                json!({"containers": [c(json!({}))], "volumes": [{"name": "s",
                    "configMap": {"name": "s", "items": [{"key": "k", "path": "/etc/x"}]}}]}),
                "spec.volumes[0].configMap.items[0].path: Invalid value: \"/etc/x\": must be a relative path",
            ),
            (
                json!({"containers": [c(json!({}))], "volumes": [{"name": "d",
                    "downwardAPI": {"items": [{"path": "a/../../x",
                        "fieldRef": {"fieldPath": "metadata.name"}}]}}]}),
                "spec.volumes[0].downwardAPI.items[0].path: Invalid value: \"a/../../x\"",
            ),
            (
                json!({"containers": [c(json!({"volumeMounts": [
                    {"name": "v", "mountPath": "/d", "subPath": "../../x"}]}))]}),
                "spec.containers[0].volumeMounts[0].subPath: Invalid value: \"../../x\"",
            ),
            (
                json!({"containers": [c(json!({"volumeMounts": [
                    {"name": "v", "mountPath": "/data"},
                    {"name": "w", "mountPath": "/data/../.."}]}))]}),
                "spec.containers[0].volumeMounts[1].mountPath: Invalid value: \"/data/../..\": names the container's root",
            ),
            (
                json!({"containers": [c(json!({"volumeMounts": [
                    {"name": "v", "mountPath": "/data/x"}, {"name": "w", "mountPath": "/data/"}]}))]}),
                "spec.containers[0].volumeMounts[0].mountPath: Invalid value: \"/data/x\": lies inside spec.containers[0].volumeMounts[1].mountPath \"/data/\"",
            ),
            (
                json!({"containers": [c(json!({"volumeMounts": [{"name": "v", "mountPath": "/dev/x"}],
                    "volumeDevices": [{"name": "w", "devicePath": "/dev/x"}]}))]}),
                "spec.containers[0].volumeDevices[0].devicePath: Invalid value: \"/dev/x\": must be unique",
            ),
            (
                json!({"containers": [c(json!({"volumeMounts": [{"name": "v", "mountPath": "/dev"}]}))]}),
                "spec.containers[0].terminationMessagePath: Invalid value: \"/dev/termination-log\": lies inside",
            ),
            (
                json!({"containers": [c(json!({"terminationMessagePath": "/.."}))]}),
                "spec.containers[0].terminationMessagePath: Invalid value: \"/..\": names the container's root",
            ),
        ];
        for (spec, want) in cases {
            let m = refused(&pod(spec));
            assert!(m.starts_with(want), "{m}\nwanted {want}");
        }
    }

    #[test]
    fn nothing_is_made_through_a_link_in_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        let pv = tmp.path().join("pv");
        std::fs::create_dir_all(&pv).unwrap();
        let dir = PodDir(tmp.path().join("pod"));
        let volumes: HashMap<String, HostVolume> = [(
            "data".to_string(),
            HostVolume {
                path: pv.clone(),
                block: false,
                capacity: None,
            },
        )]
        .into();
        let c: Container = serde_json::from_value(json!({
            "name": "c", "image": "x",
            "volumeMounts": [{"name": "data", "mountPath": "/var/lib/data"},
                {"name": "data", "mountPath": "/sub", "subPath": "a/b"}],
        }))
        .unwrap();
        // The process replaced /var and /dev by links out, and a directory of its volume too.
        let r = dir.root("c");
        std::fs::create_dir_all(&r).unwrap();
        for (link, name) in [
            (pv.join("a"), "pv/a"),
            (r.join("var"), "root/var"),
            (r.join("dev"), "root/dev"),
        ] {
            std::os::unix::fs::symlink(&outside, &link).unwrap();
            let err = root(&dir, &c, &volumes).unwrap_err();
            let refused = format!("{name} is a symbolic link");
            assert!(
                matches!(&err, Blocked::Config(m) if m.contains(&refused)),
                "{err:?}"
            );
            std::fs::remove_file(&link).unwrap();
        }
        // A termination log replaced by a link: the link goes, its target is not touched.
        std::fs::create_dir_all(r.join("dev")).unwrap();
        std::fs::write(outside.join("f"), b"keep").unwrap();
        std::os::unix::fs::symlink(outside.join("f"), r.join("dev/termination-log")).unwrap();
        let log = root(&dir, &c, &volumes).unwrap();
        assert!(std::fs::symlink_metadata(&log).unwrap().is_file());
        std::fs::remove_file(&log).unwrap();
        std::os::unix::fs::symlink(outside.join("f"), &log).unwrap();
        assert!(empty_termination_log(&log).is_err());
        assert!(read_termination_log(&log).is_empty());
        assert_eq!(std::fs::read(outside.join("f")).unwrap(), b"keep");
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            1,
            "only the file the test made"
        );
        assert_eq!(std::fs::read_link(r.join("var/lib/data")).unwrap(), pv);
        assert_eq!(std::fs::read_link(r.join("sub")).unwrap(), pv.join("a/b"));
    }

    #[test]
    fn files_stay_inside_their_volume() {
        let tmp = tempfile::tempdir().unwrap();
        for bad in ["../x", "/x", ".", ""] {
            let files: BTreeMap<String, Vec<u8>> = [(bad.to_string(), b"x".to_vec())].into();
            assert!(
                write_files(&tmp.path().join("v"), &files, None).is_err(),
                "{bad}"
            );
        }
        let files: BTreeMap<String, Vec<u8>> = [("a/b".to_string(), b"x".to_vec())].into();
        write_files(&tmp.path().join("v"), &files, Some(0o600)).unwrap();
        assert_eq!(std::fs::read(tmp.path().join("v/a/b")).unwrap(), b"x");
        let reserved: BTreeMap<String, Vec<u8>> = [("..data".to_string(), b"x".to_vec())].into();
        assert!(write_files(&tmp.path().join("v"), &reserved, None).is_err());
    }

    #[test]
    fn a_rewritten_volume_swaps_every_file_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let v = tmp.path().join("v");
        let first: BTreeMap<String, Vec<u8>> = [
            ("tls.crt".to_string(), b"old cert".to_vec()),
            ("tls.key".to_string(), b"old key".to_vec()),
            ("gone".to_string(), b"x".to_vec()),
        ]
        .into();
        write_files(&v, &first, None).unwrap();
        assert!(holds(&v, &first));
        let second: BTreeMap<String, Vec<u8>> = [
            ("tls.crt".to_string(), b"new cert".to_vec()),
            ("tls.key".to_string(), b"new key".to_vec()),
        ]
        .into();
        assert!(!holds(&v, &second));
        // A reader holding the old directory open keeps reading the old pair whole.
        let old = std::fs::read_link(v.join("..data")).unwrap();
        write_files(&v, &second, Some(0o600)).unwrap();
        assert!(holds(&v, &second));
        assert_eq!(std::fs::read(v.join("tls.key")).unwrap(), b"new key");
        assert!(!v.join("gone").exists());
        assert!(!v.join(&old).exists(), "the old version is cleared");
        let shown: Vec<String> = std::fs::read_dir(&v)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with(".."))
            .collect();
        assert_eq!(shown.len(), 2, "{shown:?}");
    }
}
