//! The objects reconciles read, held in reflector stores shared by the controllers instead of
//! fetched on every pass: the cluster-wide settings (StorageClasses, StorageProfiles,
//! CSIDrivers, CDIConfig, the CDI resource) and the objects the passes look at (claims, pods,
//! the claims' events). One watch per kind feeds every controller.
//!
//! A controller that reacts to changes of a kind subscribes to its feed: it is woken only after
//! the store holds the change, so the pass never reads the object as it was before. Deletions
//! wake it too (kube-runtime's own shared streams carry only applied objects, and a claim whose
//! importer pod was deleted must hear of it).

use std::sync::Arc;

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use cdi_api::config::{CDI, CDIConfig};
use cdi_api::storageprofile::StorageProfile;

/// Read handles to the stores.
#[derive(Clone)]
pub struct Caches {
    pub classes: Store<StorageClass>,
    pub profiles: Store<StorageProfile>,
    pub drivers: Store<CSIDriver>,
    pub configs: Store<CDIConfig>,
    pub cdis: Store<CDI>,
    pub claims: Store<PersistentVolumeClaim>,
    pub pods: Store<Pod>,
    /// The events about claims (`involvedObject.kind=PersistentVolumeClaim`).
    pub events: Store<Event>,
    /// True once every store has listed: what reconciles wait on (see [`Caches::ready`]).
    ready: tokio::sync::watch::Receiver<bool>,
}

/// What a subscriber receives: every object applied or deleted, after the store has it.
pub type Changes<K> = mpsc::UnboundedReceiver<Arc<K>>;

/// A store's writing end and its subscribers.
pub struct Feed<K: kube::Resource<DynamicType = ()> + Clone + 'static> {
    writer: reflector::store::Writer<K>,
    subscribers: Vec<mpsc::UnboundedSender<Arc<K>>>,
}

impl<K> Feed<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    fn new() -> (Store<K>, Feed<K>) {
        let writer = reflector::store::Writer::default();
        (
            writer.as_reader(),
            Feed {
                writer,
                subscribers: Vec::new(),
            },
        )
    }

    /// Changes from now on. Unbounded: a controller that is busy must not stop the store (and
    /// every other controller reading it); what waits is a pointer per change.
    pub fn subscribe(&mut self) -> Changes<K> {
        let (tx, rx) = mpsc::unbounded();
        self.subscribers.push(tx);
        rx
    }

    /// Apply one watch event to the store, then tell the subscribers.
    fn apply(&mut self, event: watcher::Event<K>) {
        let reader = self.writer.as_reader();
        // A relist replaces the store: what it no longer holds was deleted while the watch was
        // down, and is told as a deletion (the writer drops it silently).
        let before = match event {
            watcher::Event::InitDone => reader.state(),
            _ => Vec::new(),
        };
        self.writer.apply_watcher_event(&event);
        let changed: Vec<Arc<K>> = match event {
            watcher::Event::Apply(o) => reader.get(&ObjectRef::from_obj(&o)).into_iter().collect(),
            watcher::Event::Delete(o) => vec![Arc::new(o)],
            // After a (re)list, everything: what changed while the watch was down is in it.
            watcher::Event::InitDone => {
                let mut all = reader.state();
                all.extend(
                    before
                        .into_iter()
                        .filter(|o| reader.get(&ObjectRef::from_obj(o.as_ref())).is_none()),
                );
                all
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => Vec::new(),
        };
        // A dropped subscriber (its controller stopped) is forgotten.
        self.subscribers
            .retain(|s| changed.iter().all(|o| s.unbounded_send(o.clone()).is_ok()));
    }
}

/// The writing ends; [`Feeds::run`] keeps the stores up to date.
/// The subscriptions of a controller woken by claims and their worker pods (import, upload,
/// the clone source).
pub struct ClaimsAndPods {
    pub claims: Changes<PersistentVolumeClaim>,
    pub pods: Changes<Pod>,
}

impl ClaimsAndPods {
    pub fn subscribe(feeds: &mut Feeds) -> ClaimsAndPods {
        ClaimsAndPods {
            claims: feeds.claims.subscribe(),
            pods: feeds.pods.subscribe(),
        }
    }
}

pub struct Feeds {
    pub classes: Feed<StorageClass>,
    pub profiles: Feed<StorageProfile>,
    drivers: Feed<CSIDriver>,
    pub configs: Feed<CDIConfig>,
    pub cdis: Feed<CDI>,
    pub claims: Feed<PersistentVolumeClaim>,
    pub pods: Feed<Pod>,
    pub events: Feed<Event>,
    stores: Caches,
    ready: tokio::sync::watch::Sender<bool>,
}

/// The field selector of the events the controllers read.
const CLAIM_EVENTS: &str = "involvedObject.kind=PersistentVolumeClaim";

/// Empty stores and the feeds that fill them.
pub fn new() -> (Caches, Feeds) {
    let (classes_r, classes) = Feed::new();
    let (profiles_r, profiles) = Feed::new();
    let (drivers_r, drivers) = Feed::new();
    let (configs_r, configs) = Feed::new();
    let (cdis_r, cdis) = Feed::new();
    let (claims_r, claims) = Feed::new();
    let (pods_r, pods) = Feed::new();
    let (events_r, events) = Feed::new();
    let (ready_tx, ready) = tokio::sync::watch::channel(false);
    let caches = Caches {
        classes: classes_r,
        profiles: profiles_r,
        drivers: drivers_r,
        configs: configs_r,
        cdis: cdis_r,
        claims: claims_r,
        pods: pods_r,
        events: events_r,
        ready,
    };
    let feeds = Feeds {
        classes,
        profiles,
        drivers,
        configs,
        cdis,
        claims,
        pods,
        events,
        stores: caches.clone(),
        ready: ready_tx,
    };
    (caches, feeds)
}

impl Feeds {
    /// Keep every store up to date until the client fails.
    pub async fn run(self, client: Client) {
        let announce = announce(self.stores, self.ready);
        let all = watcher::Config::default;
        tokio::join!(
            feed(&client, all(), self.classes),
            feed(&client, all(), self.profiles),
            feed(&client, all(), self.drivers),
            feed(&client, all(), self.configs),
            feed(&client, all(), self.cdis),
            feed(&client, all(), self.claims),
            feed(&client, all(), self.pods),
            feed(&client, all().fields(CLAIM_EVENTS), self.events),
            announce,
        );
    }
}

/// Say `ready` once every store has listed. This is the only task that waits on the stores
/// themselves: kube-runtime wakes only the last of several tasks waiting on one store's first
/// list (a controller's runner waits there too), and a reconcile left waiting there never ran
/// again (a DataVolume stuck for good after a controller restart). Once this wait is over the
/// store answers every later wait at once, so controllers start only after [`Caches::ready`].
async fn announce(stores: Caches, ready: tokio::sync::watch::Sender<bool>) {
    let _ = tokio::join!(
        stores.classes.wait_until_ready(),
        stores.profiles.wait_until_ready(),
        stores.drivers.wait_until_ready(),
        stores.configs.wait_until_ready(),
        stores.cdis.wait_until_ready(),
        stores.claims.wait_until_ready(),
        stores.pods.wait_until_ready(),
        stores.events.wait_until_ready(),
    );
    ready.send_replace(true);
}

async fn feed<K>(client: &Client, config: watcher::Config, mut feed: Feed<K>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let mut events =
        std::pin::pin!(watcher(Api::<K>::all(client.clone()), config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => feed.apply(event),
            Err(e) => tracing::debug!(error = %e, "cache watch"),
        }
    }
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

    pub fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.claims.get(&ObjectRef::new(name).within(namespace))
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
    }

    /// The events about the claim `name` in `namespace`, oldest first.
    pub fn claim_events(&self, namespace: &str, name: &str) -> Vec<Event> {
        let mut events: Vec<Event> = self
            .events
            .state()
            .iter()
            .filter(|e| {
                e.involved_object.name.as_deref() == Some(name)
                    && e.involved_object.namespace.as_deref() == Some(namespace)
            })
            .map(|e| e.as_ref().clone())
            .collect();
        events.sort_by(|a, b| {
            (a.metadata.creation_timestamp.as_ref(), a.name_any())
                .cmp(&(b.metadata.creation_timestamp.as_ref(), b.name_any()))
        });
        events
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
        feeds.classes.apply(Event::InitDone);
        feeds.profiles.apply(Event::InitDone);
        feeds.drivers.apply(Event::InitDone);
        feeds.configs.apply(Event::InitDone);
        feeds.cdis.apply(Event::InitDone);
        feeds.claims.apply(Event::InitDone);
        feeds.pods.apply(Event::InitDone);
        feeds.events.apply(Event::InitDone);
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
