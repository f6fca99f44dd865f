//! CDIConfig's status: the effective values every controller reads (docs/design.md#compatibility-with-upstream; upstream's
//! config controller). Spec values win where they are valid; the rest are upstream's defaults.

use std::collections::BTreeMap;

use cdi_api::config::{CDIConfigSpec, CDIConfigStatus, FilesystemOverhead, Percent};
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use crate::size::Overhead;

/// Upstream's global default overhead, as written in the status.
pub const DEFAULT_OVERHEAD_TEXT: &str = "0.06";

/// Worker pods' default resources: limits cpu 750m, memory 600M; requests cpu 100m, memory 60M.
pub fn default_pod_resources() -> ResourceRequirements {
    let q = |s: &str| K8sQuantity(s.into());
    ResourceRequirements {
        limits: Some(BTreeMap::from([
            ("cpu".into(), q("750m")),
            ("memory".into(), q("600M")),
        ])),
        requests: Some(BTreeMap::from([
            ("cpu".into(), q("100m")),
            ("memory".into(), q("60M")),
        ])),
        ..Default::default()
    }
}

/// The defaults with each resource the spec names replaced.
fn pod_resources(spec: Option<&ResourceRequirements>) -> ResourceRequirements {
    let mut out = default_pod_resources();
    let Some(spec) = spec else {
        return out;
    };
    for (from, to) in [
        (&spec.limits, &mut out.limits),
        (&spec.requests, &mut out.requests),
    ] {
        if let (Some(from), Some(to)) = (from, to.as_mut()) {
            for (k, v) in from {
                to.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

fn valid(p: &Percent) -> bool {
    p.0.parse::<Overhead>().is_ok()
}

/// What the cluster says about the upload proxy: where it is exposed (the spec's override wins)
/// and the CA of its certificate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UploadProxy<'a> {
    pub url: Option<&'a str>,
    pub ca: Option<&'a str>,
}

/// The status for `spec` in a cluster with `classes` and `proxy`.
pub fn status(
    spec: &CDIConfigSpec,
    classes: &[StorageClass],
    proxy: UploadProxy<'_>,
) -> CDIConfigStatus {
    let fs = spec.filesystem_overhead.as_ref();
    let global = fs
        .and_then(|f| f.global.clone())
        .filter(valid)
        .unwrap_or_else(|| Percent(DEFAULT_OVERHEAD_TEXT.into()));
    let per_class: BTreeMap<String, Percent> = classes
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .map(|name| {
            let value = fs
                .and_then(|f| f.storage_class.as_ref())
                .and_then(|m| m.get(&name))
                .filter(|p| valid(p))
                .cloned()
                .unwrap_or_else(|| global.clone());
            (name, value)
        })
        .collect();
    let scratch = spec
        .scratch_space_storage_class
        .as_deref()
        .filter(|name| {
            classes
                .iter()
                .any(|c| c.metadata.name.as_deref() == Some(*name))
        })
        .unwrap_or("")
        .to_string();
    CDIConfigStatus {
        upload_proxy_url: spec
            .upload_proxy_url_override
            .clone()
            .or_else(|| proxy.url.map(str::to_string)),
        upload_proxy_ca: proxy.ca.map(str::to_string),
        import_proxy: spec.import_proxy.clone(),
        scratch_space_storage_class: Some(scratch),
        default_pod_resource_requirements: Some(pod_resources(
            spec.pod_resource_requirements.as_ref(),
        )),
        filesystem_overhead: Some(FilesystemOverhead {
            global: Some(global),
            storage_class: Some(per_class),
        }),
        preallocation: Some(spec.preallocation.unwrap_or(false)),
        image_pull_secrets: spec.image_pull_secrets.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(name: &str) -> StorageClass {
        serde_json::from_value(json!({"metadata": {"name": name}, "provisioner": "x"})).unwrap()
    }

    #[test]
    fn defaults_for_every_class() {
        let s = status(
            &CDIConfigSpec::default(),
            &[class("a"), class("b")],
            UploadProxy::default(),
        );
        let fs = s.filesystem_overhead.unwrap();
        assert_eq!(fs.global, Some(Percent("0.06".into())));
        assert_eq!(fs.storage_class.unwrap().len(), 2);
        assert_eq!(s.preallocation, Some(false));
        assert_eq!(s.scratch_space_storage_class.as_deref(), Some(""));
        let r = s.default_pod_resource_requirements.unwrap();
        assert_eq!(r.limits.unwrap()["cpu"].0, "750m");
        assert_eq!(r.requests.unwrap()["memory"].0, "60M");
    }

    #[test]
    fn the_spec_wins_where_valid() {
        let spec: CDIConfigSpec = serde_json::from_value(json!({
            "filesystemOverhead": {"global": "0.1", "storageClass": {"a": "0.2", "b": "2"}},
            "scratchSpaceStorageClass": "b",
            "preallocation": true,
            "uploadProxyURLOverride": "https://upload.example",
            "podResourceRequirements": {"limits": {"cpu": "2"}},
        }))
        .unwrap();
        let s = status(
            &spec,
            &[class("a"), class("b"), class("c")],
            UploadProxy {
                url: Some("ignored"),
                ca: None,
            },
        );
        let fs = s.filesystem_overhead.unwrap();
        let per = fs.storage_class.unwrap();
        assert_eq!(fs.global, Some(Percent("0.1".into())));
        assert_eq!(per["a"], Percent("0.2".into()));
        // An invalid per-class value falls back to the global one.
        assert_eq!(per["b"], Percent("0.1".into()));
        assert_eq!(per["c"], Percent("0.1".into()));
        assert_eq!(s.scratch_space_storage_class.as_deref(), Some("b"));
        assert_eq!(s.preallocation, Some(true));
        assert_eq!(
            s.upload_proxy_url.as_deref(),
            Some("https://upload.example")
        );
        let r = s.default_pod_resource_requirements.unwrap();
        assert_eq!(r.limits.as_ref().unwrap()["cpu"].0, "2");
        assert_eq!(r.limits.unwrap()["memory"].0, "600M");
        // A scratch class that does not exist is not reported.
        let spec: CDIConfigSpec =
            serde_json::from_value(json!({"scratchSpaceStorageClass": "gone"})).unwrap();
        assert_eq!(
            status(&spec, &[class("a")], UploadProxy::default())
                .scratch_space_storage_class
                .as_deref(),
            Some("")
        );
    }
}
