//! What every reconcile shares: the client, the options, the metrics, the caches of what the
//! controllers read, the event recorder, and what the upload and clone paths read once.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;

use crate::pki::cache::PkiCache;
use crate::pki::tokens::CloneTokens;
use crate::{cache, events, progress, serve};

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The importer pod's image (upstream's `IMPORTER_IMAGE`).
    pub importer_image: String,
    /// The upload pod's image (upstream's `UPLOADSERVER_IMAGE`).
    pub upload_server_image: String,
    /// The clone source pod's image (upstream's `CLONER_IMAGE`).
    pub cloner_image: String,
    pub pull_policy: String,
    /// `-v=N` for worker pods.
    pub verbosity: u32,
    /// Where the leader election Lease lives.
    pub namespace: String,
    /// This instance's identity in the election.
    pub identity: String,
    /// How often progress is read and unfinished work looked at again.
    pub resync: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            importer_image: "quay.io/kubevirt/cdi-importer:latest".into(),
            upload_server_image: "quay.io/kubevirt/cdi-uploadserver:latest".into(),
            cloner_image: "quay.io/kubevirt/cdi-cloner:latest".into(),
            pull_policy: "IfNotPresent".into(),
            verbosity: 1,
            namespace: "cdi".into(),
            identity: "cdi-controller".into(),
            resync: Duration::from_secs(2),
        }
    }
}

/// What the reconcilers share.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub options: Arc<Options>,
    pub metrics: Arc<serve::Metrics>,
    /// The one client progress is read with from worker pods (connections are reused).
    pub http: reqwest::Client,
    /// The cluster-wide objects reconciles read; filled while [`run_controllers`] runs (each
    /// run, a leadership term, starts from a fresh list).
    pub caches: cache::Caches,
    /// Events on the objects reconciled (kube-runtime's Recorder).
    pub events: Arc<events::Events>,
    /// The upload path's certificate authorities, read when needed and again once rotated.
    pub upload_pki: Arc<PkiCache>,
    /// The keys of clone tokens, read once they are needed.
    pub clone_tokens: Arc<tokio::sync::OnceCell<CloneTokens>>,
}

impl Context {
    pub fn new(client: Client, options: Options, metrics: Arc<serve::Metrics>) -> Context {
        Context {
            events: Arc::new(events::Events::new(client.clone(), &options.identity)),
            client,
            options: Arc::new(options),
            metrics,
            http: progress::client(),
            caches: cache::new().0,
            upload_pki: Default::default(),
            clone_tokens: Default::default(),
        }
    }
}
