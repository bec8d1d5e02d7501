//! The watch mode: follows the Pods that carry the record and the swapping policy's
//! ClusterAdmissionPolicy with kube-runtime's watcher (its list, resume from the last
//! resourceVersion, relist on 410 and backoff), and puts every record on the board, read against
//! the settings in force; a change of the settings reads every record again at once. It follows
//! the workload templates of the namespaces the policy covers (`coverage.rs`, with a watch of the
//! namespaces' labels). Each period it also reads the check role's reports and fills what their
//! findings name. With retention on, its template watches also fill the in-use set's stores.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use image_swapper_policy::plan::{copy_for, pod_key, read_record};
use image_swapper_policy::policy::Policy;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::DynamicObject;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::Notify;

use crate::board::Board;
use crate::coverage::Coverage;
use crate::in_use::{Scope, ScopeSender, Writers};
use crate::metrics::{Health, Metrics};
use crate::reports::{guards_from_cluster, report_copies, reports_from_cluster};
use crate::retention::ages::SetAges;
use crate::retention::sets::pushed_hosts;
use crate::runner::lock;
use crate::source::{
    check_policy_ids, created, policy_from_document, policy_resource, record_selector,
};
use crate::templates::{TemplateEvent, namespace_of, templates_of};

pub struct Watch {
    pub client: Client,
    /// The swapping policy's name; none: the settings are `fixed`.
    pub swap_policy: Option<String>,
    pub fixed: Option<Policy>,
    pub board: Arc<Mutex<Board>>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub wake: Arc<Notify>,
    /// Also follow the workload templates, to fill the mirror ahead of their first Pods.
    pub templates: bool,
    /// The check role's ClusterAdmissionPolicy, whose results in the reports are read; none:
    /// the reports are not read.
    pub check_policy: Option<String>,
    /// How often the reports are read.
    pub period: std::time::Duration,
    /// Each period, the clusters' in-use sets' ages read from the mirror (the stale-set alert).
    pub set_ages: Option<Arc<SetAges>>,
    /// With retention on: the in-use set's stores of the workload kinds, filled by the
    /// template watches, and where the policy's scope is sent as it changes.
    pub in_use: Option<(Writers, ScopeSender)>,
    /// Kubewarden's own namespace, which no policy sees: nothing there is filled.
    pub kubewarden_namespace: Option<String>,
}

/// The board's key of the copies the check role's reports name (`Reports/<namespace>` each):
/// filled as a template's are (there is no Pod record to mark), and replaced at each reading.
pub const REPORTS: &str = "Reports";

/// The namespace of a Pod's key (`namespace/name`).
fn pod_namespace(key: &str) -> &str {
    key.split('/').next().unwrap_or_default()
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
    /// Each workload template's images and labels, to route again when the settings change.
    templates: BTreeMap<String, (Vec<String>, Value)>,
    /// During a list of a kind: the templates it named so far.
    templates_listing: BTreeMap<&'static str, BTreeSet<String>>,
    /// The namespaces the policy covers: where templates are filled.
    coverage: Coverage,
}

impl Watch {
    pub async fn run(mut self) {
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
            templates: BTreeMap::new(),
            templates_listing: BTreeMap::new(),
            coverage: Coverage::excluding(self.kubewarden_namespace.clone()),
        };
        // Records and templates alike are read only where the policy covers the namespace.
        let mut namespaces = watcher::watcher(
            Api::<Namespace>::all(self.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .boxed();
        let (mut w, scope) =
            (self.in_use.take()).map_or((Writers::default(), None), |(w, s)| (w, Some(s)));
        // The in-use set needs the workload kinds whether or not their templates are filled.
        let mut templates = if self.templates || w.wanted() {
            let (c, spec) = (&self.client, "/spec/template/spec");
            let cron_spec = "/spec/jobTemplate/spec/template/spec";
            futures::stream::select_all([
                templates_of::<Deployment>(c, "Deployment", spec, w.deployments.take()),
                templates_of::<StatefulSet>(c, "StatefulSet", spec, w.stateful_sets.take()),
                templates_of::<DaemonSet>(c, "DaemonSet", spec, w.daemon_sets.take()),
                templates_of::<ReplicaSet>(c, "ReplicaSet", spec, w.replica_sets.take()),
                templates_of::<Job>(c, "Job", spec, w.jobs.take()),
                templates_of::<CronJob>(c, "CronJob", cron_spec, w.cron_jobs.take()),
            ])
            .boxed()
        } else {
            futures::stream::pending().boxed()
        };
        let (mut pods, mut policies) = (pods, policies);
        // The first tick is at once: the reports are read as soon as the settings are in.
        let mut reports_due = tokio::time::interval(self.period);
        reports_due.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ages_due = tokio::time::interval(self.period);
        ages_due.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Scope::share(scope.as_ref(), known.policy.as_ref(), &known.coverage);
        loop {
            tokio::select! {
                _ = reports_due.tick(), if self.check_policy.is_some() && known.policy.is_some() => {
                    self.read_reports(&mut known).await;
                }
                _ = ages_due.tick(), if self.set_ages.is_some() && known.policy.is_some() => {
                    if let (Some(ages), Some(policy)) = (self.set_ages.clone(), &known.policy) {
                        let hosts = pushed_hosts(policy);
                        tokio::spawn(async move { ages.export(&hosts).await });
                    }
                }
                Some(event) = pods.next() => match event {
                    Ok(event) => {
                        self.metrics.synced();
                        self.pod_event(&mut known, event);
                    }
                    Err(error) => tracing::warn!(%error, "the watch of the recorded Pods failed; it resumes, or lists again"),
                },
                Some(event) = templates.next() => self.template_event(&mut known, event),
                Some(event) = namespaces.next() => match event {
                    Ok(event) => {
                        self.namespace_event(&mut known, event);
                        Scope::share(scope.as_ref(), known.policy.as_ref(), &known.coverage);
                    }
                    Err(error) => tracing::warn!(%error, "the watch of the namespaces failed; it resumes, or lists again"),
                },
                Some(event) = policies.next() => match event {
                    Ok(event) => {
                        self.policy_event(&mut known, event);
                        Scope::share(scope.as_ref(), known.policy.as_ref(), &known.coverage);
                    }
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
        let document = serde_json::to_value(&object).unwrap_or_default();
        if let Err(error) = known.coverage.follow(&document) {
            tracing::error!(policy = %name, %error, "cannot read which namespaces the swapping policy covers; no template is filled until it can be read");
        }
        let policy = policy_from_document(&document, &format!("ClusterAdmissionPolicy {name}"));
        match policy {
            Ok(policy) => {
                tracing::info!(policy = %name, "read the swapping policy's settings; reading every record again");
                known.policy = Some(policy);
                self.read_records(known, None);
                self.route_templates(known, None);
                self.wake.notify_one();
            }
            Err(error) => {
                tracing::error!(%error, "cannot use the swapping policy's settings; keeping the last")
            }
        }
    }

    fn template_event(&self, known: &mut Known, event: TemplateEvent) {
        // Watched for the in-use set only (`--no-templates`): nothing to fill.
        if !self.templates {
            return;
        }
        match event {
            TemplateEvent::Init(kind) => {
                known.templates_listing.insert(kind, BTreeSet::new());
            }
            TemplateEvent::Apply(key, images, labels) => {
                if let Some(kind) = key.split('/').next()
                    && let Some(listing) = known.templates_listing.get_mut(kind)
                {
                    listing.insert(key.clone());
                }
                self.route_template(known, &key, &images, &labels);
                known.templates.insert(key, (images, labels));
            }
            TemplateEvent::Delete(key) => {
                known.templates.remove(&key);
                lock(&self.board).template_gone(&key);
            }
            TemplateEvent::InitDone(kind) => {
                let listed = known.templates_listing.remove(kind).unwrap_or_default();
                let prefix = format!("{kind}/");
                known
                    .templates
                    .retain(|key, _| !key.starts_with(&prefix) || listed.contains(key));
                lock(&self.board).retain_templates(kind, &listed);
                tracing::info!(%kind, templates = listed.len(), "listed the workload templates; watching");
            }
        }
        self.wake.notify_one();
    }

    /// Puts a template's images on the board as copies, routed by the settings in force; an
    /// image no rule routes (excluded, unmatched, already a mirror image) has none, and neither
    /// has a template whose Pods the policy does not see.
    fn route_template(&self, known: &Known, key: &str, images: &[String], labels: &Value) {
        let Some(policy) = known.policy.as_ref() else {
            return;
        };
        let covered = namespace_of(key)
            .is_some_and(|namespace| known.coverage.covers_pod(namespace, Some(labels)));
        let copies = if covered {
            images
                .iter()
                .filter_map(|image| copy_for(image, policy))
                .collect()
        } else {
            Vec::new()
        };
        lock(&self.board).template_seen(key, copies);
    }

    /// Routes again the templates of `namespace` (or every template): its labels, or the
    /// settings, changed.
    fn route_templates(&self, known: &Known, namespace: Option<&str>) {
        for (key, (images, labels)) in &known.templates {
            if namespace.is_none_or(|namespace| namespace_of(key) == Some(namespace)) {
                self.route_template(known, key, images, labels);
            }
        }
    }

    fn namespace_event(&self, known: &mut Known, event: Event<Namespace>) {
        match event {
            Event::Apply(namespace) | Event::InitApply(namespace) => {
                let name = namespace.metadata.name.clone().unwrap_or_default();
                let labels = namespace.metadata.labels.clone().unwrap_or_default();
                if known.coverage.namespace_seen(&name, labels) {
                    self.route_templates(known, Some(&name));
                    self.read_records(known, Some(&name));
                    self.wake.notify_one();
                }
            }
            Event::Delete(namespace) => {
                known
                    .coverage
                    .namespace_gone(&namespace.metadata.name.unwrap_or_default());
            }
            Event::Init | Event::InitDone => {}
        }
    }

    /// Reads the check role's reports and puts the copies their `fail` results name on the
    /// board, checked against the settings in force; a note for each refused, logged once.
    async fn read_reports(&self, known: &mut Known) {
        let (Some(policy), Some(check)) = (known.policy.as_ref(), self.check_policy.as_ref())
        else {
            return;
        };
        let ids = check_policy_ids(check);
        let read = async {
            let reports = reports_from_cluster(&self.client).await?;
            let guards = guards_from_cluster(&self.client, &reports, &ids, check).await?;
            anyhow::Ok((reports, guards))
        };
        let (reports, guards) = match read.await {
            Ok(read) => read,
            Err(error) => {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "cannot read the check role's reports; again next period"
                );
                return;
            }
        };
        let (copies, notes) = report_copies(&reports, &ids, policy, &guards);
        tracing::info!(
            reports = reports.len(),
            copies = copies.len(),
            "read the check role's reports"
        );
        for note in notes {
            if known.noted.insert(note.clone()) {
                self.metrics.counted("refused");
                tracing::warn!("{note}");
            }
        }
        lock(&self.board).reports_seen(REPORTS, copies);
        self.wake.notify_one();
    }

    /// Reads again the records of the Pods of `namespace` (or of every Pod): its labels, or the
    /// settings, changed.
    fn read_records(&self, known: &mut Known, namespace: Option<&str>) {
        let pods: Vec<(String, Value)> = known
            .pods
            .iter()
            .filter(|(key, _)| namespace.is_none_or(|namespace| pod_namespace(key) == namespace))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (key, value) in pods {
            self.read(known, &key, &value);
        }
    }

    /// Puts a Pod's record on the board, read against the settings in force. A record in a
    /// namespace the policy does not cover was not written by it (anyone who may label a Pod
    /// there can write one): it is ignored, so that nobody has the controller copy for them
    /// with its own logins by writing a record the policy never would.
    fn read(&self, known: &mut Known, key: &str, pod: &Value) {
        let Some(policy) = known.policy.as_ref() else {
            return;
        };
        let labels = pod.pointer("/metadata/labels");
        if !known.coverage.covers_pod(pod_namespace(key), labels) {
            lock(&self.board).pod_gone(key);
            let note = format!(
                "ignored the record of Pod {key}: the swapping policy does not see it (its namespace, its labels, or Kubewarden's own namespace), so it did not write it"
            );
            if known.noted.insert(note.clone()) {
                self.metrics.counted("refused");
                tracing::warn!(pod = %key, "{note}");
            }
            return;
        }
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
