//! What a pod's volumes and variables are made from: its namespace's Secrets and ConfigMaps (all
//! keys, or the items asked for) and its downward API fields.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{ConfigMap, KeyToPath, ObjectFieldSelector, Pod, Secret};
use kube::{Api, Client};

use super::blocked::Blocked;

pub(super) fn pod_ns(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// Keys to files: every key, or only `items` (each under its path); a missing item key is an
/// error unless the source is optional.
pub(super) fn select(
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

pub(super) async fn secret_data(
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

pub(super) async fn config_map_data(
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

/// One key of a Secret's or ConfigMap's data (`None` when it or its source is optional and
/// missing).
pub(super) fn key_of(
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

/// A downward API field of the pod (`metadata.name`, `metadata.labels['k']`, `status.podIP`…).
pub(super) fn field(
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
