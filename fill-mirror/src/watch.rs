//! The watch mode: follows the Pods that carry the record and the swapping policy's
//! ClusterAdmissionPolicy with kube-runtime's watcher (its list, resume from the last
//! resourceVersion, relist on 410 and backoff), and puts every record on the board, read against
//! the settings in force; a change of the settings reads every record again at once.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use image_swapper_policy::pod::fill::{pod_key, read_record};
use image_swapper_policy::policy::Policy;
use k8s_openapi::api::core::v1::Pod;
use kube::api::DynamicObject;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::Notify;

use crate::board::Board;
use crate::metrics::{Health, Metrics};
use crate::runner::lock;
use crate::source::{created, policy_from_document, policy_resource, record_selector};

pub struct Watch {
    pub client: Client,
    /// The swapping policy's name; none: the settings are `fixed`.
    pub swap_policy: Option<String>,
    pub fixed: Option<Policy>,
    pub board: Arc<Mutex<Board>>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub wake: Arc<Notify>,
}

struct Known {
    policy: Option<Policy>,
    /// The recorded Pods as last seen, to read again when the settings change.
    pods: BTreeMap<String, Value>,
    /// During a list: the Pods it named so far.
    listing: Option<BTreeSet<String>>,
    pods_listed: bool,
    /// Notes already logged, so that a record refused is named once, not at each event.
    noted: HashSet<String>,
}

impl Watch {
    pub async fn run(self) {
        let pods = watcher::watcher(
            Api::<Pod>::all(self.client.clone()),
            watcher::Config::default().labels(&record_selector()),
        )
        .default_backoff()
        .boxed();
        let policies = match &self.swap_policy {
            Some(name) => watcher::watcher(
                Api::<DynamicObject>::all_with(self.client.clone(), &policy_resource()),
                watcher::Config::default().fields(&format!("metadata.name={name}")),
            )
            .default_backoff()
            .boxed(),
            None => futures::stream::pending().boxed(),
        };
        let mut known = Known {
            policy: self.fixed.clone(),
            pods: BTreeMap::new(),
            listing: None,
            pods_listed: false,
            noted: HashSet::new(),
        };
        let (mut pods, mut policies) = (pods, policies);
        loop {
            tokio::select! {
                Some(event) = pods.next() => match event {
                    Ok(event) => {
                        self.metrics.synced();
                        self.pod_event(&mut known, event);
                    }
                    Err(error) => tracing::warn!(%error, "the watch of the recorded Pods failed; it resumes, or lists again"),
                },
                Some(event) = policies.next() => match event {
                    Ok(event) => self.policy_event(&mut known, event),
                    Err(error) => tracing::warn!(%error, "the watch of the swapping policy failed; it resumes, or lists again"),
                },
            }
            let ready = known.policy.is_some() && known.pods_listed;
            self.health.ready.store(ready, Ordering::Relaxed);
        }
    }

    fn pod_event(&self, known: &mut Known, event: Event<Pod>) {
        match event {
            Event::Init => known.listing = Some(BTreeSet::new()),
            Event::InitApply(pod) | Event::Apply(pod) => {
                let Ok(value) = serde_json::to_value(&pod) else {
                    return;
                };
                let key = pod_key(&value);
                if let Some(listing) = known.listing.as_mut() {
                    listing.insert(key.clone());
                }
                self.read(known, &key, &value);
                known.pods.insert(key, value);
            }
            Event::Delete(pod) => {
                let Ok(value) = serde_json::to_value(&pod) else {
                    return;
                };
                let key = pod_key(&value);
                known.pods.remove(&key);
                lock(&self.board).pod_gone(&key);
            }
            Event::InitDone => {
                let listed = known.listing.take().unwrap_or_default();
                known.pods.retain(|key, _| listed.contains(key));
                lock(&self.board).retain_pods(&listed);
                known.pods_listed = true;
                tracing::info!(pods = listed.len(), "listed the recorded Pods; watching");
            }
        }
        self.wake.notify_one();
    }

    fn policy_event(&self, known: &mut Known, event: Event<DynamicObject>) {
        let object = match event {
            Event::Apply(object) | Event::InitApply(object) => object,
            Event::Delete(_) => {
                tracing::warn!("the swapping policy was deleted; keeping its last settings");
                return;
            }
            Event::Init | Event::InitDone => return,
        };
        let name = self.swap_policy.clone().unwrap_or_default();
        let policy = serde_json::to_value(&object)
            .map_err(anyhow::Error::from)
            .and_then(|document| {
                policy_from_document(&document, &format!("ClusterAdmissionPolicy {name}"))
            });
        match policy {
            Ok(policy) => {
                tracing::info!(policy = %name, "read the swapping policy's settings; reading every record again");
                known.policy = Some(policy);
                let pods: Vec<(String, Value)> = known
                    .pods
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                for (key, value) in pods {
                    self.read(known, &key, &value);
                }
                self.wake.notify_one();
            }
            Err(error) => {
                tracing::error!(%error, "cannot use the swapping policy's settings; keeping the last")
            }
        }
    }

    /// Puts a Pod's record on the board, read against the settings in force.
    fn read(&self, known: &mut Known, key: &str, pod: &Value) {
        let Some(policy) = known.policy.as_ref() else {
            return;
        };
        match read_record(pod, policy) {
            None => lock(&self.board).pod_gone(key),
            Some(record) => {
                for note in &record.notes {
                    if known.noted.insert(note.clone()) {
                        self.metrics.counted("refused");
                        tracing::warn!(pod = %key, "{note}");
                    }
                }
                lock(&self.board).pod_seen(key, record, created(pod));
            }
        }
    }
}
