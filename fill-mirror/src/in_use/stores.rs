//! The objects the set is computed from, in kube-runtime reflector stores: every Pod (a watch
//! of its own: the watch's other Pod watch sees only the recorded ones), and the workload
//! kinds, whose stores the watch's own template watches fill (`watch.rs` reflects into the
//! writers), so that each kind is watched once.

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};

use super::named::Objects;

#[derive(Clone)]
pub struct Stores {
    pub pods: Store<Pod>,
    pub deployments: Store<Deployment>,
    pub replica_sets: Store<ReplicaSet>,
    pub stateful_sets: Store<StatefulSet>,
    pub daemon_sets: Store<DaemonSet>,
    pub jobs: Store<Job>,
    pub cron_jobs: Store<CronJob>,
}

/// The workload kinds' writers, for the watch's template watches (each taken by its watch;
/// none when retention is off).
#[derive(Default)]
pub struct Writers {
    pub deployments: Option<Writer<Deployment>>,
    pub replica_sets: Option<Writer<ReplicaSet>>,
    pub stateful_sets: Option<Writer<StatefulSet>>,
    pub daemon_sets: Option<Writer<DaemonSet>>,
    pub jobs: Option<Writer<Job>>,
    pub cron_jobs: Option<Writer<CronJob>>,
}

impl Writers {
    /// Whether any store waits for a watch.
    pub fn wanted(&self) -> bool {
        self.deployments.is_some()
    }
}

/// What a snapshot of the stores holds, owned for the time of one pass.
pub struct Snapshot {
    pods: Vec<std::sync::Arc<Pod>>,
    deployments: Vec<std::sync::Arc<Deployment>>,
    replica_sets: Vec<std::sync::Arc<ReplicaSet>>,
    stateful_sets: Vec<std::sync::Arc<StatefulSet>>,
    daemon_sets: Vec<std::sync::Arc<DaemonSet>>,
    jobs: Vec<std::sync::Arc<Job>>,
    cron_jobs: Vec<std::sync::Arc<CronJob>>,
}

impl Stores {
    /// The stores, the workload kinds' writers, and the Pods' writer (for [`watch_pods`]).
    pub fn new() -> (Stores, Writers, Writer<Pod>) {
        let (pods, pods_writer) = reflector::store();
        let (deployments, deployments_writer) = reflector::store();
        let (replica_sets, replica_sets_writer) = reflector::store();
        let (stateful_sets, stateful_sets_writer) = reflector::store();
        let (daemon_sets, daemon_sets_writer) = reflector::store();
        let (jobs, jobs_writer) = reflector::store();
        let (cron_jobs, cron_jobs_writer) = reflector::store();
        (
            Stores {
                pods,
                deployments,
                replica_sets,
                stateful_sets,
                daemon_sets,
                jobs,
                cron_jobs,
            },
            Writers {
                deployments: Some(deployments_writer),
                replica_sets: Some(replica_sets_writer),
                stateful_sets: Some(stateful_sets_writer),
                daemon_sets: Some(daemon_sets_writer),
                jobs: Some(jobs_writer),
                cron_jobs: Some(cron_jobs_writer),
            },
            pods_writer,
        )
    }

    /// Waits until every store has had its first list.
    pub async fn ready(&self) {
        let _ = self.pods.wait_until_ready().await;
        let _ = self.deployments.wait_until_ready().await;
        let _ = self.replica_sets.wait_until_ready().await;
        let _ = self.stateful_sets.wait_until_ready().await;
        let _ = self.daemon_sets.wait_until_ready().await;
        let _ = self.jobs.wait_until_ready().await;
        let _ = self.cron_jobs.wait_until_ready().await;
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            pods: self.pods.state(),
            deployments: self.deployments.state(),
            replica_sets: self.replica_sets.state(),
            stateful_sets: self.stateful_sets.state(),
            daemon_sets: self.daemon_sets.state(),
            jobs: self.jobs.state(),
            cron_jobs: self.cron_jobs.state(),
        }
    }
}

impl Snapshot {
    pub fn objects(&self) -> Objects<'_> {
        let key = |meta: &kube::api::ObjectMeta| {
            format!(
                "{}/{}",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            )
        };
        let mut templates = Vec::new();
        for d in &self.deployments {
            if let Some(spec) = &d.spec {
                templates.push(("Deployment", key(&d.metadata), &spec.template));
            }
        }
        for s in &self.stateful_sets {
            if let Some(spec) = &s.spec {
                templates.push(("StatefulSet", key(&s.metadata), &spec.template));
            }
        }
        for d in &self.daemon_sets {
            if let Some(spec) = &d.spec {
                templates.push(("DaemonSet", key(&d.metadata), &spec.template));
            }
        }
        for j in &self.jobs {
            if let Some(spec) = &j.spec {
                templates.push(("Job", key(&j.metadata), &spec.template));
            }
        }
        for c in &self.cron_jobs {
            let template = c.spec.job_template.spec.as_ref();
            if let Some(spec) = template {
                templates.push(("CronJob", key(&c.metadata), &spec.template));
            }
        }
        Objects {
            pods: self.pods.iter().map(|p| p.as_ref()).collect(),
            templates,
            deployments: self.deployments.iter().map(|d| d.as_ref()).collect(),
            replica_sets: self.replica_sets.iter().map(|r| r.as_ref()).collect(),
        }
    }
}

/// Follows every Pod into `writer` (their managed fields dropped: the store holds what the
/// set reads), until the process ends.
pub async fn watch_pods(client: Client, writer: Writer<Pod>) {
    watcher::watcher(Api::<Pod>::all(client), watcher::Config::default())
        .default_backoff()
        .modify(|pod| pod.managed_fields_mut().clear())
        .reflect(writer)
        .for_each(|event| async move {
            if let Err(error) = event {
                tracing::warn!(%error, "the watch of the Pods in use failed; it resumes, or lists again");
            } else if let Ok(Event::InitDone) = event {
                tracing::debug!("listed the Pods in use");
            }
        })
        .await;
}
