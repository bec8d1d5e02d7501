//! The fill job's metrics, in one struct registered once (as kube-rs' controller-rs does), and
//! the HTTP port that serves them with the probes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RegistryLabel {
    pub registry: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// One cluster's in-use set in one mirror registry.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SetLabel {
    pub registry: String,
    pub cluster: String,
}

/// The `result` label's values of `fill_mirror_copies_total`.
pub const RESULTS: [&str; 5] = ["copied", "present", "gone", "failed", "refused"];

pub struct Metrics {
    /// Images recorded Pods name and the mirror lacks, by target registry.
    pub missing_images: Family<RegistryLabel, Gauge>,
    /// Copies by result: copied, present, gone, failed, refused.
    pub copies: Family<ResultLabel, Counter>,
    pub copy_duration: Histogram,
    /// From the record (the Pod's creation) to the image in the mirror.
    pub time_to_mirror: Histogram,
    pub queue_depth: Gauge,
    /// 429 and 5xx answers, by source registry.
    pub source_throttled: Family<RegistryLabel, Counter>,
    pub last_sync: Gauge<f64, AtomicU64>,
    pub leader: Gauge,
    /// How long ago each cluster published its in-use set, by mirror registry (read each period).
    pub in_use_set_age: Family<SetLabel, Gauge<f64, AtomicU64>>,
    /// Digests the published in-use set names (in use now, or within `--keep-for`), by registry.
    pub in_use_images: Family<RegistryLabel, Gauge>,
    /// Anchor tags put on digests in use, by registry.
    pub in_use_anchors: Family<RegistryLabel, Counter>,
    /// When the in-use set was last published, by registry (Unix seconds).
    pub in_use_published: Family<RegistryLabel, Gauge<f64, AtomicU64>>,
    /// Periods whose in-use set could not be published, by registry.
    pub in_use_publish_failures: Family<RegistryLabel, Counter>,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut metrics = Metrics {
            missing_images: Family::default(),
            copies: Family::default(),
            copy_duration: Histogram::new(exponential_buckets(0.25, 2.0, 12)),
            time_to_mirror: Histogram::new(exponential_buckets(0.25, 2.0, 14)),
            queue_depth: Gauge::default(),
            source_throttled: Family::default(),
            last_sync: Gauge::default(),
            leader: Gauge::default(),
            in_use_set_age: Family::default(),
            in_use_images: Family::default(),
            in_use_anchors: Family::default(),
            in_use_published: Family::default(),
            in_use_publish_failures: Family::default(),
            registry: Registry::default(),
        };
        let r = &mut metrics.registry;
        r.register(
            "fill_mirror_missing_images",
            "Images that recorded Pods name and the mirror lacks, by target registry",
            metrics.missing_images.clone(),
        );
        r.register(
            "fill_mirror_copies",
            "Copies by result: copied, present, gone, failed, refused",
            metrics.copies.clone(),
        );
        r.register(
            "fill_mirror_copy_duration_seconds",
            "How long one copy took, its destination check included",
            metrics.copy_duration.clone(),
        );
        r.register(
            "fill_mirror_time_to_mirror_seconds",
            "From a Pod's record to its image in the mirror",
            metrics.time_to_mirror.clone(),
        );
        r.register(
            "fill_mirror_queue_depth",
            "Copies queued or running",
            metrics.queue_depth.clone(),
        );
        r.register(
            "fill_mirror_source_throttled",
            "429 and 5xx answers of source registries, by registry",
            metrics.source_throttled.clone(),
        );
        r.register(
            "fill_mirror_last_sync_timestamp_seconds",
            "When the watch last heard from the API server (Unix seconds)",
            metrics.last_sync.clone(),
        );
        r.register(
            "fill_mirror_leader",
            "1 when this replica copies and marks",
            metrics.leader.clone(),
        );
        r.register(
            "fill_mirror_in_use_set_age_seconds",
            "How long ago each cluster published its in-use set in a mirror registry",
            metrics.in_use_set_age.clone(),
        );
        r.register(
            "fill_mirror_in_use_images",
            "Digests the published in-use set names (in use now or within --keep-for), by registry",
            metrics.in_use_images.clone(),
        );
        r.register(
            "fill_mirror_in_use_anchors_written",
            "Anchor tags (inuse-<cluster>-<hex>) put on digests in use, by registry",
            metrics.in_use_anchors.clone(),
        );
        r.register(
            "fill_mirror_in_use_published_timestamp_seconds",
            "When the in-use set was last published, by registry (Unix seconds)",
            metrics.in_use_published.clone(),
        );
        r.register(
            "fill_mirror_in_use_publish_failures",
            "Periods whose in-use set could not be published, by registry",
            metrics.in_use_publish_failures.clone(),
        );
        // Every result exported from the start, at 0: a counter that appears at 1 shows no
        // increase() to Prometheus, so the alerts on a first failure or a first gone source
        // would miss it.
        for result in RESULTS {
            let _ = metrics.copies.get_or_create(&ResultLabel {
                result: result.to_string(),
            });
        }
        metrics
    }
}

impl Metrics {
    pub fn counted(&self, result: &str) {
        self.copies
            .get_or_create(&ResultLabel {
                result: result.to_string(),
            })
            .inc();
    }

    pub fn synced(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.last_sync.set(now);
    }

    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

/// What the probes read: ready once the settings and the first list are in; alive while the
/// main loop turns.
#[derive(Default)]
pub struct Health {
    pub ready: AtomicBool,
    /// Unix seconds of the main loop's last turn.
    pub heartbeat: AtomicU64,
}

impl Health {
    pub fn beat(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.heartbeat.store(now, Ordering::Relaxed);
    }

    fn alive(&self) -> bool {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        now.saturating_sub(self.heartbeat.load(Ordering::Relaxed)) < 120
    }
}

#[derive(Clone)]
struct Served {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

async fn metrics(State(served): State<Served>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        served.metrics.encode(),
    )
}

async fn healthz(State(served): State<Served>) -> impl IntoResponse {
    if served.health.alive() {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the main loop has not turned for 120 s",
        )
    }
}

async fn readyz(State(served): State<Served>) -> impl IntoResponse {
    if served.health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the settings or the first list are not in yet",
        )
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the process ends.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(self::metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Served { metrics, health });
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_carry_their_documented_names() {
        let metrics = Metrics::default();
        metrics.counted("copied");
        metrics
            .missing_images
            .get_or_create(&RegistryLabel {
                registry: "m.io".into(),
            })
            .set(3);
        let mirror = RegistryLabel {
            registry: "m.io".into(),
        };
        metrics.in_use_images.get_or_create(&mirror).set(7);
        metrics.in_use_anchors.get_or_create(&mirror).inc();
        metrics.in_use_published.get_or_create(&mirror).set(1.5);
        metrics.in_use_publish_failures.get_or_create(&mirror).inc();
        let text = metrics.encode();
        for line in [
            "fill_mirror_copies_total{result=\"copied\"} 1",
            "fill_mirror_copies_total{result=\"gone\"} 0",
            "fill_mirror_copies_total{result=\"failed\"} 0",
            "fill_mirror_missing_images{registry=\"m.io\"} 3",
            "fill_mirror_in_use_images{registry=\"m.io\"} 7",
            "fill_mirror_in_use_anchors_written_total{registry=\"m.io\"} 1",
            "fill_mirror_in_use_published_timestamp_seconds{registry=\"m.io\"} 1.5",
            "fill_mirror_in_use_publish_failures_total{registry=\"m.io\"} 1",
            "fill_mirror_queue_depth 0",
            "fill_mirror_leader 0",
            "# TYPE fill_mirror_copy_duration_seconds histogram",
            "# TYPE fill_mirror_time_to_mirror_seconds histogram",
            "# TYPE fill_mirror_last_sync_timestamp_seconds gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }
}
