//! An installation of CDI, as its operator makes it (upstream's `pkg/operator/resources`): the
//! operator's own manifests (what `cdi install` prints), the objects it keeps for a `CDI`
//! resource (each component's ServiceAccount, least-privilege RBAC, Service and Deployment), and
//! the resource's status from what it observes. Pure: `cdi operator` applies and writes.
//!
//! One file per part: `names`, `release`, `operator` (its own manifests),
//! `components` (what it keeps, from `rbac` and `deployments`), `crds` (and the
//! optional objects their presence adds), `status`, `uninstall` (leftovers).

mod components;
mod crds;
mod deployments;
mod names;
mod operator;
mod pieces;
mod rbac;
mod release;
mod status;
mod uninstall;

pub use components::{DEFAULT_PRIORITY_CLASS, components, owned, priority_class};
pub use crds::{
    PROMETHEUS_RULE_CRD, SERVICE_MONITOR_CRD, VOLUME_POPULATOR_CRD, crds, monitoring,
    volume_populators,
};
pub use names::{
    API_SERVICE, APISERVER, CONFIG_AUTHORITY, CONTROLLER, CONTROLLER_ACCOUNT, FINALIZER,
    MANAGED_BY, MUTATING_WEBHOOKS, OPERATOR, OPERATOR_LEASE, UPDATE_VERSION, UPLOAD_PROXY,
    VALIDATING_WEBHOOKS,
};
pub use operator::{example_cdi, operator_manifests};
pub use release::{MONITORING_NAMESPACE, Release};
pub use status::{active, cr_ready, rolled_out, status, unwanted};
pub use uninstall::{LEFT_BY_COMPONENTS, WORKER_SELECTOR, leftover_kinds, leftover_selector};

#[cfg(test)]
mod tests;
