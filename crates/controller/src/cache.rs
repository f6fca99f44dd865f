//! The cluster-wide objects every reconcile reads (StorageClasses, StorageProfiles, CSIDrivers,
//! CDIConfig, the CDI resource), held in reflector stores shared by the controllers instead of
//! listed on every pass.
//!
//! A controller that reacts to a change of one of them subscribes to the same store: it is woken
//! only after the store holds the change, so the pass never reads the object as it was before.

use futures::StreamExt;
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::runtime::reflector::{self, ReflectHandle, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use cdi_api::config::{CDI, CDIConfig};
use cdi_api::storageprofile::StorageProfile;

/// How many changes a subscriber may lag behind before the store waits for it.
const BUFFER: usize = 256;

/// Read handles to the stores.
#[derive(Clone)]
pub struct Caches {
    pub classes: Store<StorageClass>,
    pub profiles: Store<StorageProfile>,
    pub drivers: Store<CSIDriver>,
    pub configs: Store<CDIConfig>,
    pub cdis: Store<CDI>,
}

/// The writing ends; [`Feeds::run`] keeps the stores up to date.
pub struct Feeds {
    classes: reflector::store::Writer<StorageClass>,
    profiles: reflector::store::Writer<StorageProfile>,
    drivers: reflector::store::Writer<CSIDriver>,
    configs: reflector::store::Writer<CDIConfig>,
    cdis: reflector::store::Writer<CDI>,
}

/// Empty stores and the feeds that fill them.
pub fn new() -> (Caches, Feeds) {
    let (classes_r, classes) = reflector::store_shared(BUFFER);
    let (profiles_r, profiles) = reflector::store_shared(BUFFER);
    let (drivers_r, drivers) = reflector::store_shared(BUFFER);
    let (configs_r, configs) = reflector::store_shared(BUFFER);
    let (cdis_r, cdis) = reflector::store_shared(BUFFER);
    (
        Caches {
            classes: classes_r,
            profiles: profiles_r,
            drivers: drivers_r,
            configs: configs_r,
            cdis: cdis_r,
        },
        Feeds {
            classes,
            profiles,
            drivers,
            configs,
            cdis,
        },
    )
}

/// Who wants to hear about changes. Every subscription must be polled: a subscriber that stops
/// reading stops its store once the buffer is full.
impl Feeds {
    pub fn classes(&self) -> ReflectHandle<StorageClass> {
        self.classes.subscribe().expect("a shared store")
    }

    pub fn profiles(&self) -> ReflectHandle<StorageProfile> {
        self.profiles.subscribe().expect("a shared store")
    }

    pub fn configs(&self) -> ReflectHandle<CDIConfig> {
        self.configs.subscribe().expect("a shared store")
    }

    /// Keep every store up to date until the client fails.
    pub async fn run(self, client: Client) {
        tokio::join!(
            feed(&client, self.classes),
            feed(&client, self.profiles),
            feed(&client, self.drivers),
            feed(&client, self.configs),
            feed(&client, self.cdis),
        );
    }
}

async fn feed<K>(client: &Client, writer: reflector::store::Writer<K>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect_shared(writer)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "cache watch");
            }
        })
        .await;
}

impl Caches {
    /// Wait until every store has listed its objects once.
    pub async fn ready(&self) {
        // Only a dropped writer fails the wait, and then the controllers stop anyway.
        let _ = tokio::join!(
            self.classes.wait_until_ready(),
            self.profiles.wait_until_ready(),
            self.drivers.wait_until_ready(),
            self.configs.wait_until_ready(),
            self.cdis.wait_until_ready(),
        );
    }

    /// Every StorageClass, by name.
    pub fn classes(&self) -> Vec<StorageClass> {
        sorted(&self.classes)
    }

    pub fn profiles(&self) -> Vec<StorageProfile> {
        sorted(&self.profiles)
    }

    /// The names of the CSIDriver objects: the provisioners that are CSI drivers.
    pub fn csi_drivers(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .drivers
            .state()
            .iter()
            .filter_map(|d| d.metadata.name.clone())
            .collect();
        names.sort();
        names
    }

    /// CDIConfig `config`.
    pub fn config(&self) -> Option<CDIConfig> {
        self.configs
            .get(&reflector::ObjectRef::new(cdi_api::name::CDI_CONFIG))
            .map(|c| c.as_ref().clone())
    }

    /// The CDI resources (one in a sane cluster).
    pub fn cdis(&self) -> Vec<CDI> {
        sorted(&self.cdis)
    }
}

/// The store's objects in name order: decisions that pick "the first" are then the same on
/// every pass.
fn sorted<K: kube::Resource<DynamicType = ()> + Clone + 'static>(store: &Store<K>) -> Vec<K> {
    let mut all: Vec<K> = store.state().iter().map(|o| o.as_ref().clone()).collect();
    all.sort_by(|a, b| a.meta().name.cmp(&b.meta().name));
    all
}
