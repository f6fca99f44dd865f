//! The names an installation uses (upstream's): the operator's finalizer and labels, the
//! component Deployments and accounts, the webhooks and APIService `cdi apiserver` registers.

/// The operator's finalizer on the CDI resource (upstream's).
pub const FINALIZER: &str = "operator.cdi.kubevirt.io";

/// On the CDI resource: its `spec.config` is what CDIConfig holds (upstream's).
pub const CONFIG_AUTHORITY: &str = "cdi.kubevirt.io/configAuthority";

/// The label every object the operator keeps carries, with the release that last wrote it.
pub const UPDATE_VERSION: &str = "operator.cdi.kubevirt.io/updateVersion";

/// Who manages the component objects (upstream's value).
pub const MANAGED_BY: &str = "cdi-operator";

/// The webhook configurations `cdi apiserver` registers (upstream's names).
pub const MUTATING_WEBHOOKS: &[&str] = &["cdi-api-datavolume-mutate", "cdi-api-pvc-mutate"];

pub const VALIDATING_WEBHOOKS: &[&str] = &[
    "cdi-api-datavolume-validate",
    "cdi-api-dataimportcron-validate",
    "cdi-api-populator-validate",
    "cdi-api-validate",
];

/// The APIService of the upload token API.
pub const API_SERVICE: &str = "v1beta1.upload.cdi.kubevirt.io";

/// The three component Deployments (upstream's names).
pub const CONTROLLER: &str = "cdi-deployment";

pub const APISERVER: &str = "cdi-apiserver";

pub const UPLOAD_PROXY: &str = "cdi-uploadproxy";

pub const OPERATOR: &str = "cdi-operator";

/// The Lease one operator at a time holds (upstream's name).
pub const OPERATOR_LEASE: &str = "cdi-operator-leader-election-helper";

/// The ServiceAccount the controller runs as (upstream's).
pub const CONTROLLER_ACCOUNT: &str = "cdi-sa";

/// The API group of the CDI kinds.
pub(super) const CDI_GROUP: &str = "cdi.kubevirt.io";
