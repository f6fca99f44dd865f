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
    /// True once every store has listed: what reconciles wait on (see [`Caches::ready`]).
    ready: tokio::sync::watch::Receiver<bool>,
}

/// The writing ends; [`Feeds::run`] keeps the stores up to date.
pub struct Feeds {
    classes: reflector::store::Writer<StorageClass>,
    profiles: reflector::store::Writer<StorageProfile>,
    drivers: reflector::store::Writer<CSIDriver>,
    configs: reflector::store::Writer<CDIConfig>,
    cdis: reflector::store::Writer<CDI>,
    stores: Caches,
    ready: tokio::sync::watch::Sender<bool>,
}

/// Empty stores and the feeds that fill them.
pub fn new() -> (Caches, Feeds) {
    let (classes_r, classes) = reflector::store_shared(BUFFER);
    let (profiles_r, profiles) = reflector::store_shared(BUFFER);
    let (drivers_r, drivers) = reflector::store_shared(BUFFER);
    let (configs_r, configs) = reflector::store_shared(BUFFER);
    let (cdis_r, cdis) = reflector::store_shared(BUFFER);
    let (ready_tx, ready) = tokio::sync::watch::channel(false);
    let caches = Caches {
        classes: classes_r,
        profiles: profiles_r,
        drivers: drivers_r,
        configs: configs_r,
        cdis: cdis_r,
        ready,
    };
    let feeds = Feeds {
        classes,
        profiles,
        drivers,
        configs,
        cdis,
        stores: caches.clone(),
        ready: ready_tx,
    };
    (caches, feeds)
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
        let announce = announce(self.stores, self.ready);
        tokio::join!(
            feed(&client, self.classes),
            feed(&client, self.profiles),
            feed(&client, self.drivers),
            feed(&client, self.configs),
            feed(&client, self.cdis),
            announce,
        );
    }
}

/// Say `ready` once every store has listed. This is the only task that waits on the stores
/// themselves: kube-runtime wakes only the last of several tasks waiting on one store's first
/// list, and a reconcile left waiting there never ran again (a DataVolume stuck for good after
/// a controller restart).
async fn announce(stores: Caches, ready: tokio::sync::watch::Sender<bool>) {
    let _ = tokio::join!(
        stores.classes.wait_until_ready(),
        stores.profiles.wait_until_ready(),
        stores.drivers.wait_until_ready(),
        stores.configs.wait_until_ready(),
        stores.cdis.wait_until_ready(),
    );
    ready.send_replace(true);
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
    /// Wait until every store has listed its objects once; any number of tasks may wait.
    pub async fn ready(&self) {
        // Only dropped feeds fail the wait, and then the controllers stop anyway.
        let _ = self.ready.clone().wait_for(|r| *r).await;
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

#[cfg(test)]
mod tests {
    use kube::runtime::watcher::Event;

    #[tokio::test]
    async fn every_reconcile_waiting_for_the_first_lists_is_woken() {
        let (caches, mut feeds) = super::new();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let caches = caches.clone();
                tokio::spawn(async move { caches.ready().await })
            })
            .collect();
        let announce = tokio::spawn(super::announce(feeds.stores.clone(), feeds.ready.clone()));
        // On this single-threaded runtime, the spawned tasks now run until they wait.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        feeds.classes.apply_watcher_event(&Event::InitDone);
        feeds.profiles.apply_watcher_event(&Event::InitDone);
        feeds.drivers.apply_watcher_event(&Event::InitDone);
        feeds.configs.apply_watcher_event(&Event::InitDone);
        feeds.cdis.apply_watcher_event(&Event::InitDone);
        let all = async {
            announce.await.unwrap();
            for w in waiters {
                w.await.unwrap();
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(30), all)
            .await
            .expect("every waiter woke");
    }
}
