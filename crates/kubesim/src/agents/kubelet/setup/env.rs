//! A container's environment (Service variables, `envFrom`, `env` with its references resolved)
//! and the pod's resolver configuration.

use std::io;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::{Api, Client};

use super::blocked::Blocked;
use super::dirs::PodDir;
use super::sources::{config_map_data, field, key_of, pod_ns, secret_data};
use crate::agents::kubelet::images::expand;

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
