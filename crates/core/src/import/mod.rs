//! The import controller's decisions (docs/design.md#the-import-flow; upstream's PVC-level
//! import controller): which claims get an importer pod ([`claim`]), the pod itself ([`pod`],
//! on the parts every worker pod shares: [`worker`], [`settings`]), scratch space
//! ([`scratch`]), pods it may not use ([`refusal`]), and what the pod's state writes back onto
//! the claim's annotations ([`status`]).

pub mod claim;
pub mod pod;
pub mod refusal;
pub mod scratch;
pub mod settings;
pub mod status;
pub mod worker;

pub use claim::{
    Next, annotations, honors_wffc, is_complete, is_import_claim, next, next_for, owner_uid,
    pod_name,
};
pub use pod::{CERT_DIR, CONTAINER, GOOGLE_CREDENTIALS_DIR, GOOGLE_CREDENTIALS_FILE, importer_pod};
pub use refusal::{
    ERR_CREATING_POD, ERR_EXCEEDED_QUOTA, foreign_pod, refusal_over, refusal_reason, refused_pod,
};
pub use scratch::{
    SCRATCH_MOUNT, SCRATCH_VOLUME_NAME, scratch_claim, scratch_for, scratch_just_requested,
    scratch_name, wants_scratch,
};
pub use settings::{Settings, Worker};
pub use status::{
    Outcome, POD_RUNNING_REASON, annotation_patch, delete_pod_when_done, labels_to_add,
    signal_name, signal_of, update_from_pod, update_from_worker,
};
pub(crate) use worker::var;
pub use worker::{
    BLOCK_DEVICE, DATA_MOUNT, DATA_VOLUME_NAME, METRICS_PORT, METRICS_PORT_NAME, controlled_by,
    worker_pod_annotations, worker_pod_spec, worker_security_context,
};

#[cfg(test)]
mod tests;
