//! cdi-controller: the controllers of cdi-rs, each a thin shell around decisions in `cdi-core`
//! (observe, decide, act). `cdi controller` runs them:
//!
//! - `config`: creates CDIConfig `config` and keeps its status (effective values).
//! - `storageprofile`: one StorageProfile per StorageClass.
//! - `datavolume`: renders each DataVolume's claim and computes the DataVolume's status.
//! - `import`: runs the importer pod for claims with an import source, honouring
//!   WaitForFirstConsumer, and writes the pod's state onto the claim.
//! - `populator`: PVC prime for claims populated from a VolumeImportSource, and the rebind.
//! - `upload`: runs the upload pod (with its Service and certificates) for upload-target claims
//!   and writes the pod's state onto the claim.
//! - `placement` (used by the worker-pod controllers): what a claim's worker pods inherit from
//!   the consumer its node was selected for.
//!
//! They share one [`Context`]: reflector stores of what they read (`cache`), the event
//! recorder (`events`), the metrics and one HTTP client for progress reads.
//!
//! Every reconciler is level-triggered and idempotent: killing the controller at any point and
//! starting it again converges.

pub mod cache;
pub mod clone;
pub mod config;
pub mod dataimportcron;
pub mod datasource;
pub mod datavolume;
pub mod events;
pub mod import;
pub mod operator;
pub mod pki;
pub mod placement;
pub mod populator;
pub mod progress;
pub mod serve;
pub mod storageprofile;
pub mod upload;

pub mod manager;
pub mod objects;
pub mod runtime;

pub use manager::{run_as_leader, run_controllers};
pub use objects::*;
pub use runtime::context::{Context, Options};
pub use runtime::error::Error;
pub use runtime::guard::guarded;
pub use runtime::lease::{Lease, lead};
