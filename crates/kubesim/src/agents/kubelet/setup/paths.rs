//! The names and paths a pod gives that become host paths (its uid, containers' and volumes'
//! names, items' paths, mount and device paths, the termination log), checked before anything
//! is made from them.

use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, KeyToPath, Pod};

use super::blocked::Blocked;
use super::sources::pod_ns;

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

pub(super) fn component(field: &str, value: &str) -> Result<(), String> {
    match bad_component(value) {
        Some(why) => Err(invalid(field, value, why)),
        None => Ok(()),
    }
}

/// A path below a volume (a `subPath`, an item's `path`, a key as a file name): relative, no
/// `..`, naming something inside. Returns its plain components.
pub(super) fn relative(value: &str) -> Result<PathBuf, &'static str> {
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
pub(super) struct Layout {
    /// Each `volumeMounts` entry: the path, and its `subPath` below the volume.
    pub(super) mounts: Vec<(PathBuf, Option<PathBuf>)>,
    pub(super) devices: Vec<PathBuf>,
    pub(super) log: PathBuf,
}

/// Check the paths of a container (`field` names it in messages, as `spec.containers[0]`).
/// Mounts may not share a path or lie inside one another, nor the termination log inside a
/// mount: every mount is a link, and making one inside another would make it in the volume
/// the other points to, outside the pod's directory.
pub(super) fn layout(c: &Container, field: &str) -> Result<Layout, String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
}
