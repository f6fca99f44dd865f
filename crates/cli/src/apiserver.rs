//! `cdi apiserver`: the aggregated token API (`upload.cdi.kubevirt.io/v1beta1`, upstream's
//! cdi-apiserver) and the DataVolume admission webhook, against the cluster of the current
//! kubeconfig, or in-cluster. It reads its serving certificate and the token key from the
//! Secrets the controller keeps, whom to believe from
//! `kube-system/extension-apiserver-authentication`, and registers its APIService and its
//! MutatingWebhookConfiguration.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use cdi_apiserver::server::{self as apiserver, ApiServerConfig};
use cdi_apiserver::tokenapi::{GROUP, RequestHeaders, VERSION};
use cdi_controller::pki::names;
use cdi_pki::token::{API_ISSUER, Signer};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};

#[derive(clap::Args)]
pub struct ApiServerArgs {
    /// Log verbosity as upstream's components take it (`-v=1`); 3 and above log debug detail.
    #[arg(short = 'v', value_name = "LEVEL", default_value_t = 1)]
    verbosity: u32,
    /// Where the API is served (HTTPS).
    #[arg(long, default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// The namespace of the controller's Secrets and of the Service the APIService names.
    #[arg(long, env = "POD_NAMESPACE", default_value = "cdi")]
    namespace: String,
    /// The Service in front of this server.
    #[arg(long, default_value = names::API_SERVICE)]
    service: String,
    #[arg(long, default_value_t = 443)]
    service_port: u16,
}

/// Wait for an object the controller (or the API server) makes, saying what is awaited.
async fn wait_for<K>(api: &Api<K>, name: &str) -> anyhow::Result<K>
where
    K: Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut said = false;
    loop {
        if let Some(found) = api.get_opt(name).await? {
            return Ok(found);
        }
        if !said {
            eprintln!("waiting for {name} (the controller makes it)");
            said = true;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn secret_text(secret: &Secret, key: &str) -> anyhow::Result<Vec<u8>> {
    let name = secret.metadata.name.as_deref().unwrap_or("");
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .with_context(|| format!("Secret {name} has no {key}"))
}

pub fn run(args: &ApiServerArgs) -> anyhow::Result<()> {
    crate::pod_logging(args.verbosity);
    let pod = cdi_core::devpod::DevPod::from_env(|k| std::env::var(k).ok())
        .map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .context("connecting to the cluster (set KUBECONFIG, or run in a pod)")?;
        let ns = args.namespace.as_str();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let key = wait_for(&secrets, names::SIGNING_KEY).await?;
        let private = String::from_utf8(secret_text(&key, names::SIGNING_KEY_PRIVATE)?)?;
        let signer = Signer::new(API_ISSUER, &private).context("the token signing key")?;
        let cert = wait_for(&secrets, names::API_CERT).await?;
        let bundle = wait_for(&maps, names::API_SIGNER_BUNDLE).await?;
        let (serving_now, serving) = tokio::sync::watch::channel(serving_pair(&cert)?);
        let (bundle_now, bundles) = tokio::sync::watch::channel(bundle_text(&bundle)?);
        let auth = wait_for(
            &Api::<ConfigMap>::namespaced(client.clone(), "kube-system"),
            "extension-apiserver-authentication",
        )
        .await?;
        let data = auth.data.unwrap_or_default();
        let front_proxy_ca = data
            .get("requestheader-client-ca-file")
            .cloned()
            .context("extension-apiserver-authentication has no requestheader-client-ca-file: the API server does not aggregate")?;
        let config = ApiServerConfig {
            listen: pod.listen(args.listen),
            serving,
            front_proxy_ca_pem: front_proxy_ca.into_bytes(),
            headers: RequestHeaders::from_config_map(&data),
            signer,
        };
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("listening on {}", config.listen))?;
        // Registered now and again with each new bundle: the aggregator trusts this server by
        // its caBundle.
        let api_service = tokio::spawn(register_api_service(
            client.clone(),
            ns.to_string(),
            args.service.clone(),
            args.service_port,
            bundles.clone(),
        ));
        // The DataVolume webhook fails closed: registered only once the Service reaches this
        // server (before, every DataVolume write would be refused).
        let webhooks = tokio::spawn(register_webhook(
            client.clone(),
            (ns.to_string(), args.service.clone(), args.service_port),
            bundles,
        ));
        // A rotation by the operator: the new certificate and bundle are taken up as they come.
        let rotated = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let (Ok(cert), Ok(bundle)) = (
                    secrets.get(names::API_CERT).await,
                    maps.get(names::API_SIGNER_BUNDLE).await,
                ) else {
                    continue;
                };
                if let (Ok(pair), Ok(text)) = (serving_pair(&cert), bundle_text(&bundle)) {
                    serving_now.send_if_modified(|seen| replace(seen, pair));
                    bundle_now.send_if_modified(|seen| replace(seen, text));
                }
            }
        });
        // The first line says where: tests and scripts read it.
        println!("cdi apiserver on https://{}", listener.local_addr()?);
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let outcome = tokio::select! {
            r = apiserver::run(config, client, listener) => r.map_err(anyhow::Error::from),
            _ = tokio::signal::ctrl_c() => Ok(()),
            _ = terminate.recv() => Ok(()),
        };
        for task in [api_service, webhooks, rotated] {
            task.abort();
        }
        outcome
    })
}

/// Put `new` in `seen`; whether that changed it.
fn replace<T: PartialEq>(seen: &mut T, new: T) -> bool {
    let changed = *seen != new;
    *seen = new;
    changed
}

fn serving_pair(secret: &Secret) -> anyhow::Result<cdi_pki::ca::KeyPair> {
    cdi_controller::pki::certs::pair_of(secret).with_context(|| {
        format!(
            "Secret {} holds no readable tls.crt and tls.key",
            names::API_CERT
        )
    })
}

fn bundle_text(map: &ConfigMap) -> anyhow::Result<String> {
    map.data
        .as_ref()
        .and_then(|d| d.get(names::BUNDLE_KEY))
        .cloned()
        .with_context(|| {
            format!(
                "ConfigMap {} has no {}",
                names::API_SIGNER_BUNDLE,
                names::BUNDLE_KEY
            )
        })
}

/// Apply `o` server-side as `cdi-apiserver`, until that works.
async fn apply_until_done(
    client: &kube::Client,
    resource: &kube::api::ApiResource,
    o: &serde_json::Value,
) {
    let name = o["metadata"]["name"].as_str().unwrap_or("");
    loop {
        match Api::<DynamicObject>::all_with(client.clone(), resource)
            .patch(
                name,
                &PatchParams::apply("cdi-apiserver").force(),
                &Patch::Apply(o),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(kind = %resource.kind, %name, "registered");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, kind = %resource.kind, %name, "registering");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Register the APIService with the bundle, and again whenever the bundle changes.
async fn register_api_service(
    client: kube::Client,
    ns: String,
    service: String,
    port: u16,
    mut bundles: tokio::sync::watch::Receiver<String>,
) {
    use base64::Engine;
    let resource = kube::api::ApiResource {
        group: "apiregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "apiregistration.k8s.io/v1".into(),
        kind: "APIService".into(),
        plural: "apiservices".into(),
    };
    loop {
        let ca = bundles.borrow_and_update().clone();
        let o = serde_json::json!({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": format!("{VERSION}.{GROUP}"),
                "labels": {"cdi.kubevirt.io": "cdi-api"}},
            "spec": {"group": GROUP, "version": VERSION, "groupPriorityMinimum": 1000,
                "versionPriority": 15,
                "service": {"namespace": ns, "name": service, "port": port},
                "caBundle": base64::engine::general_purpose::STANDARD.encode(ca.as_bytes())}});
        apply_until_done(&client, &resource, &o).await;
        if bundles.changed().await.is_err() {
            return;
        }
    }
}

/// Register the webhooks once this server answers through its Service (the API server calls
/// them there, and the Service sends to this pod only once it is ready), then again whenever
/// the bundle changes.
async fn register_webhook(
    client: kube::Client,
    (ns, service, port): (String, String, u16),
    mut bundles: tokio::sync::watch::Receiver<String>,
) {
    let through = format!("https://{service}.{ns}.svc:{port}/readyz");
    let mut said = false;
    loop {
        let ca = bundles.borrow().clone();
        let answer = match reqwest::Certificate::from_pem_bundle(ca.as_bytes()).and_then(|cas| {
            reqwest::Client::builder()
                .tls_certs_only(cas)
                .timeout(Duration::from_secs(5))
                .build()
        }) {
            Ok(http) => http.get(&through).send().await.map_err(|e| e.to_string()),
            Err(e) => Err(format!("no client for the Service: {e}")),
        };
        match answer {
            Ok(r) if r.status().is_success() => break,
            outcome => {
                if !said {
                    let why = match outcome {
                        Ok(r) => r.status().to_string(),
                        Err(e) => e,
                    };
                    tracing::info!(url = %through, %why, "waiting for the Service to reach this server before registering the webhooks");
                    said = true;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    loop {
        let ca = bundles.borrow_and_update().clone();
        // Each configuration by its kind and name (server-side apply: made or brought up to date).
        for webhook in cdi_apiserver::webhook::configurations(&ns, &service, port, &ca) {
            let kind = webhook["kind"].as_str().unwrap_or("").to_string();
            let resource = kube::core::ApiResource {
                group: "admissionregistration.k8s.io".into(),
                version: "v1".into(),
                api_version: "admissionregistration.k8s.io/v1".into(),
                plural: format!("{}s", kind.to_ascii_lowercase()),
                kind,
            };
            apply_until_done(&client, &resource, &webhook).await;
        }
        if bundles.changed().await.is_err() {
            return;
        }
    }
}
