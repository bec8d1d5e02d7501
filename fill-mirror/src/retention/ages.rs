//! The stale-set signal: each period the watch reads every cluster's in-use set from each
//! mirror registry (read only, as the prune reads them) and exports how long ago each was
//! published, `fill_mirror_in_use_set_age_seconds{registry,cluster}`, which the stale-set alert
//! reads. A set too old blocks every deletion of the prune: the alert says so before it runs.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::jiff::Timestamp;

use crate::metrics::{Metrics, SetLabel};
use crate::mirror_api::Mirror;
use crate::registry_http::RegistryHttp;
use crate::retention::sets::read_sets;

pub struct SetAges {
    pub http: RegistryHttp,
    /// The repository the sets are published in, in each registry.
    pub repository: String,
    pub metrics: Arc<Metrics>,
    /// The (registry, cluster) series exported so far: a set no longer in its registry has its
    /// series removed, so that a cluster gone for good stops the alert once its tag is deleted.
    pub exported: Mutex<BTreeSet<(String, String)>>,
}

impl SetAges {
    /// Reads the sets of every registry of `hosts` and exports their ages; a registry that does
    /// not answer keeps its last figures (their age then rises no more: its log line says why).
    pub async fn export(&self, hosts: &[String]) {
        let now = Timestamp::now();
        let mirror = Mirror::new(self.http.clone());
        for host in hosts {
            let repository = format!("{host}/{}", self.repository);
            match read_sets(&mirror, &repository).await {
                Ok(sets) => {
                    let listed: BTreeSet<(String, String)> = sets
                        .iter()
                        .map(|set| (host.clone(), set.cluster.clone()))
                        .collect();
                    if let Ok(mut exported) = self.exported.lock() {
                        for (registry, cluster) in exported.iter() {
                            if registry == host
                                && !listed.contains(&(registry.clone(), cluster.clone()))
                            {
                                self.metrics.in_use_set_age.remove(&SetLabel {
                                    registry: registry.clone(),
                                    cluster: cluster.clone(),
                                });
                            }
                        }
                        exported.retain(|(registry, _)| registry != host);
                        exported.extend(listed);
                    }
                    for set in sets {
                        let label = SetLabel {
                            registry: host.clone(),
                            cluster: set.cluster.clone(),
                        };
                        let age = (now.as_second() - set.published.as_second()) as f64;
                        self.metrics.in_use_set_age.get_or_create(&label).set(age);
                    }
                }
                Err(error) => tracing::warn!(
                    registry = %host,
                    %error,
                    "cannot read the clusters' in-use sets; again next period"
                ),
            }
        }
    }
}
