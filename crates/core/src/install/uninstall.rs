//! What goes: objects an earlier release made that this one no longer makes, and on uninstall
//! what the garbage collector does not take with the resource (docs/install.md#upgrade,
//! docs/install.md#uninstall).

use super::names::{MANAGED_BY, UPDATE_VERSION};
use super::release::Release;

/// The objects an earlier release made that this one no longer makes, among those the
/// operator labels: every object this release wants is applied with its version, so what still
/// carries another one is left over (upstream prunes the same way, by its createVersion label).
pub fn leftover_selector(release: &Release) -> String {
    format!(
        "app.kubernetes.io/managed-by={MANAGED_BY},{UPDATE_VERSION},{UPDATE_VERSION}!={}",
        release.version
    )
}

/// The kinds a release's leftovers are looked for in: (apiVersion, kind, namespace); the
/// optional kinds only where their CRDs are.
pub fn leftover_kinds(
    release: &Release,
    monitoring: bool,
    populators: bool,
) -> Vec<(&'static str, &'static str, Option<String>)> {
    let ns = || Some(release.namespace.clone());
    let rbac = "rbac.authorization.k8s.io/v1";
    let mut kinds = vec![
        ("apps/v1", "Deployment", ns()),
        ("v1", "Service", ns()),
        ("v1", "ServiceAccount", ns()),
        (rbac, "Role", ns()),
        (rbac, "RoleBinding", ns()),
        (rbac, "RoleBinding", Some("kube-system".to_string())),
        (rbac, "ClusterRole", None),
        (rbac, "ClusterRoleBinding", None),
    ];
    if monitoring {
        kinds.push(("monitoring.coreos.com/v1", "PrometheusRule", ns()));
        kinds.push(("monitoring.coreos.com/v1", "ServiceMonitor", ns()));
    }
    if populators {
        kinds.push(("populator.storage.k8s.io/v1beta1", "VolumePopulator", None));
    }
    kinds
}

/// What the operator removes on uninstall besides what the garbage collector takes with the
/// resource: the webhooks and APIService `cdi apiserver` registers and the certificates the
/// controller makes (kind, name) in the namespace.
pub const LEFT_BY_COMPONENTS: &[(&str, &str)] = &[
    ("Secret", "cdi-api-signing-key"),
    ("Secret", "cdi-apiserver-signer"),
    ("Secret", "cdi-apiserver-server-cert"),
    ("Secret", "cdi-uploadproxy-signer"),
    ("Secret", "cdi-uploadproxy-server-cert"),
    ("Secret", "cdi-uploadserver-signer"),
    ("Secret", "cdi-uploadserver-client-signer"),
    ("Secret", "cdi-uploadserver-client-cert"),
    ("ConfigMap", "cdi-apiserver-signer-bundle"),
    ("ConfigMap", "cdi-uploadproxy-signer-bundle"),
    ("ConfigMap", "cdi-uploadserver-signer-bundle"),
    ("ConfigMap", "cdi-uploadserver-client-signer-bundle"),
    ("Lease", "cdi-controller-leader-election-helper"),
];

/// The labels of worker pods and Services the operator clears on uninstall (upstream's).
pub const WORKER_SELECTOR: &str =
    "cdi.kubevirt.io in (importer, cdi-upload-server, cdi-clone-source)";
