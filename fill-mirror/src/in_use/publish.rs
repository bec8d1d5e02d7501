//! Each period: the set computed from the stores, looked up in the mirror, merged with the set
//! published before (read back from the mirror each time, so that a restart or a failover
//! forgets nothing; a set that cannot be read back is not overwritten),
//! every digest anchored (`inuse-<cluster>-<hex>`: the manifest's own bytes put under that
//! tag, with its own media type), and the set pushed to each mirror registry as an OCI
//! artifact at `<registry>/<repository>:<cluster>`. Nothing is ever deleted here.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;

use crate::in_use_set::{self, InUseSet, anchor_tag};
use crate::metrics::{Metrics, RegistryLabel};
use crate::mirror_api::{Mirror, split_host};
use crate::oci_artifact::push_artifact;
use crate::referrers::Referrers;
use crate::registry_http::RegistryHttp;
use crate::retention::sets::{pushed_hosts, read_set};

use super::merge::merged;
use super::named::named;
use super::resolve::{AT_ONCE, Found, resolve};
use super::stores::{Stores, watch_pods};
use super::{Retention, Scope};

struct Publisher {
    retention: Retention,
    mirror: Mirror,
    referrers: Referrers,
    metrics: Arc<Metrics>,
}

/// Computes and publishes the set every period, while this replica leads (or always, with
/// no election), with the Pods followed into `stores` meanwhile.
pub async fn publish_every_period(
    retention: Retention,
    http: RegistryHttp,
    client: kube::Client,
    (stores, pods): (
        Stores,
        kube::runtime::reflector::store::Writer<k8s_openapi::api::core::v1::Pod>,
    ),
    mut scope: watch::Receiver<Option<Scope>>,
    leading: Option<watch::Receiver<bool>>,
    metrics: Arc<Metrics>,
) {
    tokio::spawn(watch_pods(client, pods));
    let publisher = Publisher {
        mirror: Mirror::new(http.clone()),
        referrers: Referrers::new(http),
        retention,
        metrics,
    };
    stores.ready().await;
    let _ = scope.wait_for(Option::is_some).await;
    tracing::info!(cluster = %publisher.retention.cluster, "the in-use set is computed and published every period");
    let mut due = tokio::time::interval(publisher.retention.period);
    due.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        due.tick().await;
        if leading.as_ref().is_some_and(|leading| !*leading.borrow()) {
            continue;
        }
        let Some(scope) = scope.borrow().clone() else {
            continue;
        };
        publisher.pass(&stores, &scope).await;
    }
}

impl Publisher {
    async fn pass(&self, stores: &Stores, scope: &Scope) {
        let snapshot = stores.snapshot();
        let named = named(&snapshot.objects(), scope);
        let found = resolve(&self.mirror, &self.referrers, &named, &scope.policy).await;
        for failure in &found.failures {
            tracing::warn!(%failure, "a lookup of an image in use failed; what the set named before stays in it");
        }
        for registry in pushed_hosts(&scope.policy) {
            if let Err(error) = self.publish(&registry, &found, scope).await {
                self.metrics
                    .in_use_publish_failures
                    .get_or_create(&label(&registry))
                    .inc();
                tracing::warn!(%registry, %error, "the in-use set was not published; again next period");
            }
        }
    }

    async fn publish(&self, registry: &str, found: &Found, scope: &Scope) -> Result<(), String> {
        let repository = format!("{registry}/{}", self.retention.repository);
        let cluster = self.retention.cluster.clone();
        // Read back at each pass, not only at start: a replica that leads again after another
        // led meanwhile, or a restart, starts from what the mirror holds.
        let read = read_set(&self.mirror, &repository, &cluster).await?;
        let seen = found.seen.get(registry).map_or(&[][..], Vec::as_slice);
        let previous = read.as_ref();
        let set = merged(
            &cluster,
            seen,
            previous,
            Timestamp::now(),
            self.retention.keep_for,
            self.retention.period,
        );
        // Owned items: a stream over borrowed ones trips rustc's Send check of the spawned task
        // (rust-lang/rust#102211).
        let anchors: Vec<(String, String)> = (set.images.iter())
            .map(|image| {
                (
                    format!("{registry}/{}", image.repository),
                    image.digest.clone(),
                )
            })
            .collect();
        let anchored: Vec<_> = futures::stream::iter(anchors)
            .map(|(at, digest)| async move {
                let anchored = self.anchor(&at, &digest, found, scope).await;
                (at, digest, anchored)
            })
            .buffer_unordered(AT_ONCE)
            .collect()
            .await;
        for (at, digest, anchored) in anchored {
            if let Err(error) = anchored {
                tracing::warn!(repository = %at, %digest, %error, "cannot anchor an image in use; again next period");
            }
        }
        self.push_set(&repository, &set).await?;
        let label = label(registry);
        let count = i64::try_from(set.images.len()).unwrap_or(i64::MAX);
        self.metrics.in_use_images.get_or_create(&label).set(count);
        let published = set.published.as_millisecond() as f64 / 1000.0;
        self.metrics
            .in_use_published
            .get_or_create(&label)
            .set(published);
        tracing::info!(%registry, images = set.images.len(), "published the in-use set");
        Ok(())
    }

    /// Puts the anchor of `digest` in `repository` (`host/path`) unless the tag names it
    /// already (asked at each pass: a manifest deleted and copied again loses its tags); none
    /// in a pull-through cache, which takes no push.
    async fn anchor(
        &self,
        repository: &str,
        digest: &str,
        found: &Found,
        scope: &Scope,
    ) -> Result<(), String> {
        let Some(tag) = anchor_tag(&self.retention.cluster, digest) else {
            return Ok(());
        };
        if pull_through(repository, scope) {
            return Ok(());
        }
        let held = self.mirror.manifest(repository, &tag).await?;
        if held.is_some_and(|held| held.digest == digest) {
            return Ok(());
        }
        let manifest = match found.manifests.get(&format!("{repository}@{digest}")) {
            Some(manifest) => manifest.clone(),
            None => match self.mirror.manifest(repository, digest).await? {
                Some(manifest) => manifest,
                // Gone from the mirror: nothing to anchor.
                None => return Ok(()),
            },
        };
        self.mirror
            .put_manifest(repository, &tag, &manifest)
            .await?;
        let (registry, _) = split_host(repository);
        self.metrics
            .in_use_anchors
            .get_or_create(&label(registry))
            .inc();
        Ok(())
    }

    /// The set as an OCI artifact: the empty config, one layer of the set's JSON.
    async fn push_set(&self, repository: &str, set: &InUseSet) -> Result<(), String> {
        let json = serde_json::to_vec(set).map_err(|error| format!("the set: {error}"))?;
        let mut annotations = serde_json::Map::new();
        let created = serde_json::Value::String(set.published.to_string());
        annotations.insert("org.opencontainers.image.created".to_string(), created);
        let layer = Bytes::from(json);
        let media_type = in_use_set::MEDIA_TYPE;
        push_artifact(
            &self.mirror,
            repository,
            &set.cluster,
            media_type,
            layer,
            annotations,
        )
        .await
    }
}

fn label(registry: &str) -> RegistryLabel {
    RegistryLabel {
        registry: registry.to_string(),
    }
}

/// Whether `repository` (`host/path`) lies under a target marked `pullThrough`.
fn pull_through(repository: &str, scope: &Scope) -> bool {
    scope.policy.router.rules.iter().any(|rule| {
        rule.targets.iter().any(|target| {
            target.pull_through && target.prefix.resolved().strip_from(repository).is_some()
        })
    })
}
