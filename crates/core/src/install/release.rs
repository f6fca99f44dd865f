//! What a release is made of (its version, images, pull policy, verbosity, monitoring
//! namespace), read from the operator's environment or tagged from a registry, and the labels
//! every object it writes carries.

use serde_json::{Value, json};

use super::names::{MANAGED_BY, UPDATE_VERSION};
use super::pieces::pod_namespace;

/// What a release is made of: the operator's environment upstream names the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub namespace: String,
    pub version: String,
    pub operator_image: String,
    pub controller_image: String,
    pub importer_image: String,
    pub cloner_image: String,
    pub upload_server_image: String,
    pub upload_proxy_image: String,
    pub apiserver_image: String,
    pub pull_policy: String,
    pub verbosity: u32,
    /// Where Prometheus runs (its ServiceAccount `prometheus-k8s` reads CDI's metrics
    /// endpoints); upstream's `MONITORING_NAMESPACE`.
    pub monitoring_namespace: String,
}

/// Upstream's default monitoring namespace.
pub const MONITORING_NAMESPACE: &str = "monitoring";

/// The operator's environment variables for the images (upstream's names), in manifest order.
const IMAGE_ENV: [&str; 7] = [
    "OPERATOR_IMAGE",
    "CONTROLLER_IMAGE",
    "IMPORTER_IMAGE",
    "CLONER_IMAGE",
    "APISERVER_IMAGE",
    "UPLOAD_SERVER_IMAGE",
    "UPLOAD_PROXY_IMAGE",
];

impl Release {
    /// A release whose images are `<registry>/cdi-<component>:<tag>`, as upstream names them.
    pub fn tagged(registry: &str, tag: &str, namespace: &str) -> Release {
        let image = |c: &str| format!("{}/cdi-{c}:{tag}", registry.trim_end_matches('/'));
        Release {
            namespace: namespace.to_string(),
            version: tag.to_string(),
            operator_image: image("operator"),
            controller_image: image("controller"),
            importer_image: image("importer"),
            cloner_image: image("cloner"),
            upload_server_image: image("uploadserver"),
            upload_proxy_image: image("uploadproxy"),
            apiserver_image: image("apiserver"),
            pull_policy: "IfNotPresent".into(),
            verbosity: 1,
            monitoring_namespace: MONITORING_NAMESPACE.into(),
        }
    }

    fn images(&self) -> [&String; 7] {
        [
            &self.operator_image,
            &self.controller_image,
            &self.importer_image,
            &self.cloner_image,
            &self.apiserver_image,
            &self.upload_server_image,
            &self.upload_proxy_image,
        ]
    }

    /// The release the operator runs: its environment (as its Deployment sets it) and its
    /// namespace. A missing variable is named.
    pub fn from_env(
        get: impl Fn(&str) -> Option<String>,
        namespace: &str,
    ) -> Result<Release, String> {
        let need = |name: &str| {
            get(name).filter(|v| !v.is_empty()).ok_or_else(|| {
                format!("the operator's environment has no {name}: set it in the cdi-operator Deployment (cdi install prints one)")
            })
        };
        let mut images = Vec::new();
        for name in IMAGE_ENV {
            images.push(need(name)?);
        }
        let verbosity = match get("VERBOSITY").filter(|v| !v.is_empty()) {
            None => 1,
            Some(v) => v
                .parse()
                .map_err(|_| format!("VERBOSITY {v:?} is not a number"))?,
        };
        let [
            operator,
            controller,
            importer,
            cloner,
            apiserver,
            upload_server,
            upload_proxy,
        ] = <[String; 7]>::try_from(images).expect("seven names were read");
        Ok(Release {
            namespace: namespace.to_string(),
            version: need("OPERATOR_VERSION")?,
            operator_image: operator,
            controller_image: controller,
            importer_image: importer,
            cloner_image: cloner,
            upload_server_image: upload_server,
            upload_proxy_image: upload_proxy,
            apiserver_image: apiserver,
            pull_policy: get("PULL_POLICY")
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "IfNotPresent".into()),
            verbosity,
            monitoring_namespace: get("MONITORING_NAMESPACE")
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| MONITORING_NAMESPACE.into()),
        })
    }

    /// The operator container's environment for this release.
    pub(super) fn env(&self) -> Value {
        let mut env = vec![json!({"name": "OPERATOR_VERSION", "value": self.version})];
        for (name, image) in IMAGE_ENV.iter().zip(self.images()) {
            env.push(json!({"name": name, "value": image}));
        }
        env.push(json!({"name": "PULL_POLICY", "value": self.pull_policy}));
        env.push(json!({"name": "VERBOSITY", "value": self.verbosity.to_string()}));
        env.push(json!({"name": "MONITORING_NAMESPACE", "value": self.monitoring_namespace}));
        env.push(pod_namespace());
        Value::Array(env)
    }
}

/// The labels every component object carries (upstream's), and the release that wrote it.
pub(super) fn labels(release: &Release, more: &[(&str, &str)]) -> Value {
    let mut l = json!({
        "cdi.kubevirt.io": "",
        "app": "containerized-data-importer",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/component": "storage",
        UPDATE_VERSION: release.version,
    });
    for (k, v) in more {
        l[*k] = json!(v);
    }
    l
}
