//! Drives the board: starts the copies it allows (a bounded number at once), records how each
//! ended, and sends the marks the mirror now allows (a bounded number at once), keeping the
//! metrics in step.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use image_swapper_policy::plan::Copy;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::attached::{self, Carried};
use crate::board::{Board, Mark, MarkResult, Outcome};
use crate::leader::{Ended, leadership_changed, lost};
use crate::metrics::{Health, Metrics, RegistryLabel};
use crate::referrers::Referrers;
use crate::skopeo::Skopeo;
use crate::warm::Warmer;

/// How many marking patches go to the API server at once.
const MARKS_AT_ONCE: usize = 16;

/// The totals a one-shot run ends with.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Totals {
    pub copied: usize,
    pub failed: usize,
    pub present: usize,
    pub gone: usize,
    pub marked: usize,
    /// Not copied on purpose (a signature of a digest the source's tag no longer names).
    pub refused: usize,
}

pub struct Runner {
    pub board: Arc<Mutex<Board>>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub engine: Skopeo,
    /// For what travels with an image (`attached.rs`).
    pub referrers: Referrers,
    /// For a pull-through target (`warm.rs`).
    pub warmer: Warmer,
    pub jobs: usize,
    /// Rung when the board gains work.
    pub wake: Arc<Notify>,
    /// The client marks are sent with; none: nothing is marked (a dry look).
    pub client: Option<kube::Client>,
    /// Whether this replica holds the Lease, as it changes; none: no election, it always
    /// copies. A copy under way when it turns false stops, and is queued again.
    pub leading: Option<watch::Receiver<bool>>,
    /// How often the board is refreshed (`Board::refresh`).
    pub period: Duration,
    pub totals: Totals,
}

/// The board, even if a thread panicked holding it: it holds plain data, each change whole.
pub fn lock(board: &Mutex<Board>) -> MutexGuard<'_, Board> {
    board
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A job that ended: a copy (the board's), or what travelled with one, or a copy stopped
/// unfinished because this replica no longer leads.
enum Finished {
    Copy(Copy, Outcome, Duration),
    Carried(Copy, Vec<Carried>),
    Stopped(Copy),
}

impl Runner {
    /// Runs until the board is idle and every mark it allows is sent (the one-shot run), or
    /// until it loses the Lease: then the copies under way stop, and nothing is marked.
    pub async fn run_until_idle(&mut self) -> Ended {
        let mut running = JoinSet::new();
        loop {
            if !self.leads() {
                while let Some(joined) = running.join_next().await {
                    if let Ok(done) = joined {
                        self.finished(done, &mut running);
                    }
                }
                self.gauges();
                return Ended::LostLease;
            }
            self.start(&mut running);
            if running.is_empty() {
                self.mark().await;
                let idle = lock(&self.board).idle();
                if idle {
                    break;
                }
                let wait = lock(&self.board)
                    .next_wakeup()
                    .map_or(Duration::from_millis(100), |at| {
                        at.saturating_duration_since(Instant::now())
                    });
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = leadership_changed(&mut self.leading) => {}
                }
                continue;
            }
            if let Some(Ok(done)) = running.join_next().await {
                self.finished(done, &mut running);
            }
            if self.leads() {
                self.mark().await;
            }
        }
        self.gauges();
        Ended::Idle
    }

    fn leads(&self) -> bool {
        self.leading
            .as_ref()
            .is_none_or(|leading| *leading.borrow())
    }

    /// Runs until `stop` (the watch). Copies start and marks go only while this replica leads;
    /// a replica that does not lead keeps its board in step, ready to take over. Stopped, it
    /// returns once every job has ended.
    pub async fn run(&mut self, stop: impl Future<Output = ()>) {
        let mut running = JoinSet::new();
        let mut stop = std::pin::pin!(stop);
        let mut refreshed = Instant::now();
        loop {
            self.health.beat();
            if refreshed.elapsed() >= self.period {
                lock(&self.board).refresh(self.period);
                refreshed = Instant::now();
            }
            if self.leads() {
                self.start(&mut running);
            }
            self.gauges();
            let wait = lock(&self.board)
                .next_wakeup()
                .map_or(Duration::from_secs(5), |at| {
                    at.saturating_duration_since(Instant::now())
                        .min(Duration::from_secs(5))
                });
            tokio::select! {
                Some(joined) = running.join_next(), if !running.is_empty() => {
                    if let Ok(done) = joined {
                        self.finished(done, &mut running);
                    }
                    while let Some(Ok(done)) = running.try_join_next() {
                        self.finished(done, &mut running);
                    }
                }
                () = self.wake.notified() => {}
                () = leadership_changed(&mut self.leading) => {}
                () = tokio::time::sleep(wait) => {}
                () = &mut stop => {
                    running.shutdown().await;
                    return;
                }
            }
            if self.leads() {
                self.mark().await;
            }
        }
    }

    fn start(&mut self, running: &mut JoinSet<Finished>) {
        let room = self.jobs.saturating_sub(running.len());
        let mut board = lock(&self.board);
        let started = board.start(Instant::now(), room);
        let started: Vec<(Copy, Option<String>, Skopeo)> = started
            .into_iter()
            .map(|copy| {
                let signs = board.item(&copy.destination).and_then(|i| i.signs.clone());
                let requesters = board.requesters(&copy.destination);
                let engine =
                    (self.engine).anonymous_at(self.engine.anonymous_for(&copy, &requesters));
                (copy, signs, engine)
            })
            .collect();
        drop(board);
        for (copy, signs, engine) in started {
            let (warmer, leading) = (self.warmer.clone(), self.leading.clone());
            running.spawn(async move {
                let began = Instant::now();
                let copying = async {
                    match (&copy.warm, &signs) {
                        (Some(warm), _) => warmer.warm(&copy, warm).await,
                        (None, Some(signs)) => {
                            attached::copy_signature(&engine, &copy, signs).await
                        }
                        (None, None) => engine.copy(&copy).await,
                    }
                };
                // The Lease lost: the copy stops (skopeo killed with its future); checked first,
                // so that a copy started as the Lease was lost never starts skopeo.
                tokio::select! {
                    biased;
                    () = lost(leading) => Finished::Stopped(copy),
                    outcome = copying => Finished::Copy(copy, outcome, began.elapsed()),
                }
            });
        }
    }

    fn finished(&mut self, done: Finished, running: &mut JoinSet<Finished>) {
        let (copy, outcome, took) = match done {
            Finished::Copy(copy, outcome, took) => (copy, outcome, took),
            Finished::Carried(copy, carried) => return self.carried(&copy, carried),
            Finished::Stopped(copy) => {
                // Queued again (after `--retry`) for when this replica leads again; not a
                // result: no metric, no total.
                let stopped = Outcome::Failed("stopped: this replica lost the Lease".into());
                lock(&self.board).finished(&copy, &stopped, Instant::now());
                tracing::info!(source = %copy.source, destination = %copy.destination, "copy stopped: this replica lost the Lease");
                return;
            }
        };
        let waits = lock(&self.board).finished(&copy, &outcome, Instant::now());
        self.metrics.counted(outcome.label());
        self.metrics.copy_duration.observe(took.as_secs_f64());
        let (source, destination) = (&copy.source, &copy.destination);
        match &outcome {
            Outcome::Copied | Outcome::Present => {
                if let (Outcome::Copied, Some(warm)) = (&outcome, &copy.warm) {
                    self.totals.copied += 1;
                    tracing::info!(%source, through = %warm.reference, seconds = took.as_secs_f64(), "warmed: the pull-through cache holds it");
                } else if outcome == Outcome::Copied {
                    self.totals.copied += 1;
                    tracing::info!(%source, %destination, seconds = took.as_secs_f64(), "copied");
                } else {
                    self.totals.present += 1;
                    tracing::info!(%destination, "the mirror holds it already, not copied over");
                }
                let board = lock(&self.board);
                let item = board.item(destination);
                if let Some(item) = item
                    && let Ok(waited) = SystemTime::now().duration_since(item.asked)
                {
                    self.metrics.time_to_mirror.observe(waited.as_secs_f64());
                }
                // Nothing travels into a pull-through cache: it cannot be pushed to.
                let image = item.is_some_and(|item| item.signs.is_none()) && copy.warm.is_none();
                let requesters = board.requesters(destination);
                drop(board);
                // What travels with the image, as a job of its own after the image's (so the
                // record's mark does not wait for it), in the same `--jobs` room.
                if image && self.leads() {
                    let anonymous = self.engine.anonymous_for(&copy, &requesters);
                    let engine = self.engine.anonymous_at(anonymous.clone());
                    let (referrers, copy) = (self.referrers.anonymous_at(anonymous), copy.clone());
                    let leading = self.leading.clone();
                    running.spawn(async move {
                        tokio::select! {
                            biased;
                            () = lost(leading) => Finished::Carried(copy, Vec::new()),
                            carried = attached::carry(&engine, &referrers, &copy) => Finished::Carried(copy, carried),
                        }
                    });
                }
            }
            Outcome::Refused(reason) => {
                self.totals.refused += 1;
                tracing::warn!(%source, %destination, %reason, "refused: not copied");
            }
            Outcome::Gone(words) => {
                self.totals.gone += 1;
                tracing::warn!(%source, %destination, answer = %words, "the source registry has no such image: nothing to copy");
            }
            Outcome::Throttled(words, _) => {
                self.totals.failed += 1;
                self.metrics
                    .source_throttled
                    .get_or_create(&RegistryLabel {
                        registry: copy.source_host().to_string(),
                    })
                    .inc();
                tracing::warn!(%source, %destination, answer = %words, wait_seconds = waits.map(|d| d.as_secs()), "the source registry is throttling: its copies wait");
            }
            Outcome::Failed(words) => {
                self.totals.failed += 1;
                tracing::warn!(%source, %destination, error = %words, again_in_seconds = waits.map(|d| d.as_secs()), "copy failed");
            }
        }
    }

    /// Counts and logs what travelled with `image`, each as a copy of its own.
    fn carried(&mut self, image: &Copy, carried: Vec<Carried>) {
        let source = &image.source;
        for Carried {
            destination,
            outcome,
        } in carried
        {
            self.metrics.counted(outcome.label());
            match &outcome {
                Outcome::Copied => {
                    self.totals.copied += 1;
                    tracing::info!(%source, %destination, "copied with the image");
                }
                Outcome::Present => self.totals.present += 1,
                Outcome::Gone(words) => {
                    self.totals.gone += 1;
                    tracing::warn!(%source, %destination, answer = %words, "gone at the source before it was copied with the image");
                }
                Outcome::Refused(reason) => {
                    self.totals.refused += 1;
                    tracing::warn!(%source, %destination, %reason, "refused: not copied with the image");
                }
                Outcome::Throttled(words, _) | Outcome::Failed(words) => {
                    self.totals.failed += 1;
                    tracing::warn!(%source, %destination, error = %words, "not copied with the image; again when the image is asked for again");
                }
            }
        }
    }

    fn gauges(&self) {
        let board = lock(&self.board);
        self.metrics.queue_depth.set(board.queue_depth() as i64);
        for (registry, count) in board.missing() {
            self.metrics
                .missing_images
                .get_or_create(&RegistryLabel { registry })
                .set(count);
        }
    }

    async fn mark(&mut self) {
        let Some(client) = self.client.clone() else {
            return;
        };
        let marks = lock(&self.board).marks(Instant::now());
        if marks.is_empty() {
            return;
        }
        let results: Vec<(Mark, MarkResult)> = futures::stream::iter(marks)
            .map(|mark| {
                let client = client.clone();
                async move {
                    let result = send_mark(&client, &mark).await;
                    (mark, result)
                }
            })
            .buffer_unordered(MARKS_AT_ONCE)
            .collect()
            .await;
        let now = Instant::now();
        let mut board = lock(&self.board);
        for (mark, result) in results {
            if result == MarkResult::Marked {
                self.totals.marked += 1;
            }
            board.marked(&mark, result, now);
        }
        drop(board);
        self.gauges();
    }
}

/// Sends one mark: the record's filled entries removed, by a JSON patch that tests the record
/// first.
async fn send_mark(client: &kube::Client, mark: &Mark) -> MarkResult {
    let (namespace, name) = mark.pod.split_once('/').unwrap_or(("", &mark.pod));
    let filled: Vec<&str> = mark.filled.iter().map(String::as_str).collect();
    let Some(patch) = image_swapper_policy::plan::marking_patch(&mark.text, &filled) else {
        return MarkResult::Final;
    };
    let patch: json_patch::Patch = match serde_json::from_value(patch) {
        Ok(patch) => patch,
        Err(error) => {
            tracing::error!(pod = %mark.pod, %error, "the marking patch is not a JSON patch");
            return MarkResult::Final;
        }
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    match api
        .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
    {
        Ok(_) => {
            tracing::info!(pod = %mark.pod, containers = ?mark.filled, "marked: the mirror holds them");
            MarkResult::Marked
        }
        Err(kube::Error::Api(status)) if [404, 409, 422].contains(&status.code) => {
            tracing::info!(pod = %mark.pod, answer = %status.message, "not marked: the record changed or the Pod is gone; read again at its next event");
            MarkResult::Final
        }
        Err(error) => {
            tracing::warn!(pod = %mark.pod, %error, "not marked: the API server could not take it; again later");
            MarkResult::Retry
        }
    }
}
