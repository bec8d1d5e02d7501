//! The fill job's state, without I/O: the copies asked for (one per destination however many
//! Pods ask), what became of each, the per-source backoff, and which Pods' records can be
//! marked. The watch and the one-shot run drive it; its decisions are tested here.

mod marks;
mod outcome;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use image_swapper_policy::plan::{Copy, FillRecord};

use crate::reports::ReportCopy;

pub use marks::{Mark, MarkResult};
pub use outcome::{Backoff, CopyItem, Outcome, Status};

#[derive(Clone, Debug)]
struct PodState {
    record: FillRecord,
    /// When the policy wrote the record (the Pod's creation, to the second).
    created: Option<SystemTime>,
    /// The record text a mark was last sent for and refused for good: not sent again until
    /// the record changes.
    refused_text: Option<String>,
    retry_at: Option<Instant>,
    retry_delay: Option<Duration>,
}

#[derive(Debug)]
pub struct Board {
    copies: BTreeMap<String, CopyItem>,
    pods: BTreeMap<String, PodState>,
    /// The copies of each workload template's images (`Kind/namespace/name`): filled ahead of
    /// the first Pod.
    templates: BTreeMap<String, Vec<Copy>>,
    /// Source registry host: not before then, and the last delay.
    hosts: BTreeMap<String, (Instant, Duration)>,
    backoff: Backoff,
    /// Whether a failed copy is queued again (the watch) or final (the one-shot run).
    retry_failures: bool,
}

impl Board {
    pub fn new(backoff: Backoff, retry_failures: bool) -> Board {
        Board {
            copies: BTreeMap::new(),
            pods: BTreeMap::new(),
            templates: BTreeMap::new(),
            hosts: BTreeMap::new(),
            backoff,
            retry_failures,
        }
    }

    /// A Pod's record as read now (its event, or a list): its copies are asked for, each once
    /// per destination. A copy made before this Pod was recorded is asked for again: the policy
    /// found the mirror without it after the copy, so the mirror lost it since.
    pub fn pod_seen(&mut self, pod: &str, record: FillRecord, created: Option<SystemTime>) {
        let now = SystemTime::now();
        for (copy, signs) in record.entries.iter().flat_map(|e| {
            std::iter::once((&e.copy, None)).chain(
                e.signature
                    .as_ref()
                    .map(|s| (s, Some(e.copy.source.clone()))),
            )
        }) {
            let asked = created.unwrap_or(now).min(now);
            match self.copies.get_mut(&copy.destination) {
                None => {
                    self.copies.insert(
                        copy.destination.clone(),
                        CopyItem {
                            copy: copy.clone(),
                            signs,
                            status: Status::Queued,
                            asked,
                            not_before: None,
                            delay: None,
                        },
                    );
                }
                Some(item) => {
                    if let (Status::Done(made), Some(created)) = (&item.status, created)
                        && whole_seconds(created) > whole_seconds(*made)
                    {
                        item.status = Status::Queued;
                        item.asked = asked;
                    }
                    renew(item, copy);
                }
            }
        }
        let previous = self.pods.remove(pod);
        let refused_text = previous
            .and_then(|p| p.refused_text)
            .filter(|text| *text == record.text);
        self.pods.insert(
            pod.to_string(),
            PodState {
                record,
                created,
                refused_text,
                retry_at: None,
                retry_delay: None,
            },
        );
    }

    /// A workload template's images, as copies: each asked for once per destination, like a
    /// record's, so that the first Pod finds the mirror full. A copy the mirror holds is not
    /// asked again (one lookup per distinct image, until the board forgets it).
    pub fn template_seen(&mut self, template: &str, copies: Vec<Copy>) {
        let copies = copies.into_iter().map(|copy| (copy, None)).collect();
        self.asked_without_record(template, copies);
    }

    /// The copies the check role's reports name, under `key/<namespace>` (the namespace of the
    /// report, which asks for them), replacing the last reading's: filled as a template's are (no
    /// record to mark), each signature copy with the image it signs, so that it is refused as
    /// a record's is once the source's tag names another digest.
    pub fn reports_seen(&mut self, key: &str, copies: Vec<ReportCopy>) {
        let mut by_namespace: BTreeMap<String, Vec<(Copy, Option<String>)>> = BTreeMap::new();
        for c in copies {
            let namespaced = format!("{key}/{}", c.namespace);
            by_namespace
                .entry(namespaced)
                .or_default()
                .push((c.copy, c.signs));
        }
        let listed: BTreeSet<String> = by_namespace.keys().cloned().collect();
        self.retain_templates(key, &listed);
        for (namespaced, copies) in by_namespace {
            self.asked_without_record(&namespaced, copies);
        }
    }

    fn asked_without_record(&mut self, key: &str, copies: Vec<(Copy, Option<String>)>) {
        let now = SystemTime::now();
        for (copy, signs) in &copies {
            let item = self
                .copies
                .entry(copy.destination.clone())
                .or_insert_with(|| CopyItem {
                    copy: copy.clone(),
                    signs: signs.clone(),
                    status: Status::Queued,
                    asked: now,
                    not_before: None,
                    delay: None,
                });
            if item.signs.is_none() {
                item.signs.clone_from(signs);
            }
            renew(item, copy);
        }
        let copies = copies.into_iter().map(|(copy, _)| copy).collect();
        self.templates.insert(key.to_string(), copies);
    }

    pub fn template_gone(&mut self, template: &str) {
        self.templates.remove(template);
    }

    /// Once a period: forgets the finished copies nothing names any more (the board stays the
    /// size of what the cluster asks for), and asks again for the images templates name that
    /// were made or gone for longer than `period`, so that an image the mirror lost since (a
    /// lifecycle rule), or a source pushed again, is seen to: one lookup per distinct image per
    /// period. A copy a recorded Pod names is kept: its mark waits for it.
    pub fn refresh(&mut self, period: Duration) {
        let now = SystemTime::now();
        let by_pods: BTreeSet<&str> = self
            .pods
            .values()
            .flat_map(|pod| pod.record.entries.iter())
            .flat_map(|e| std::iter::once(&e.copy).chain(e.signature.as_ref()))
            .map(|copy| copy.destination.as_str())
            .collect();
        let by_templates: BTreeSet<&str> = self
            .templates
            .values()
            .flatten()
            .map(|copy| copy.destination.as_str())
            .collect();
        let mut forgotten = Vec::new();
        for (destination, item) in &mut self.copies {
            let named = by_pods.contains(destination.as_str())
                || by_templates.contains(destination.as_str());
            let finished = match &item.status {
                Status::Done(made) => Some(*made),
                Status::Gone | Status::Failed => Some(item.asked),
                Status::Queued | Status::Running => None,
            };
            let Some(finished) = finished else { continue };
            if !named {
                forgotten.push(destination.clone());
            } else if !by_pods.contains(destination.as_str())
                && now.duration_since(finished).unwrap_or_default() >= period
            {
                item.status = Status::Queued;
                item.asked = now;
            }
        }
        for destination in forgotten {
            self.copies.remove(&destination);
        }
    }

    /// Keeps only the templates of `kind` a fresh list named (keys `Kind/...`).
    pub fn retain_templates(&mut self, kind: &str, listed: &BTreeSet<String>) {
        let prefix = format!("{kind}/");
        self.templates
            .retain(|key, _| !key.starts_with(&prefix) || listed.contains(key));
    }

    /// The Pod was deleted, or lost its record.
    pub fn pod_gone(&mut self, pod: &str) {
        self.pods.remove(pod);
    }

    /// Keeps only the Pods a fresh list named.
    pub fn retain_pods(&mut self, listed: &BTreeSet<String>) {
        self.pods.retain(|key, _| listed.contains(key));
    }

    /// Up to `room` queued copies whose source registry and own backoff allow them now,
    /// marked running.
    pub fn start(&mut self, now: Instant, room: usize) -> Vec<Copy> {
        let mut started = Vec::new();
        for item in self.copies.values_mut() {
            if started.len() >= room {
                break;
            }
            let host_waits = self
                .hosts
                .get(item.copy.source_host())
                .is_some_and(|(until, _)| *until > now);
            if item.status == Status::Queued
                && item.not_before.is_none_or(|at| at <= now)
                && !host_waits
            {
                item.status = Status::Running;
                started.push(item.copy.clone());
            }
        }
        started
    }

    /// When the next queued copy may start, if any waits.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let copies = self
            .copies
            .values()
            .filter(|item| item.status == Status::Queued)
            .filter_map(|item| {
                let host = self.hosts.get(item.copy.source_host()).map(|(at, _)| *at);
                item.not_before.into_iter().chain(host).max()
            });
        let marks = self.pods.values().filter_map(|p| p.retry_at);
        copies.chain(marks).min()
    }

    /// Records how a copy ended; says how long it waits when it is queued again.
    pub fn finished(&mut self, copy: &Copy, outcome: &Outcome, now: Instant) -> Option<Duration> {
        let retry = self.retry_failures;
        let item = self.copies.get_mut(&copy.destination)?;
        match outcome {
            Outcome::Copied | Outcome::Present => {
                item.status = Status::Done(SystemTime::now());
                item.delay = None;
                item.not_before = None;
                self.hosts.remove(copy.source_host());
                None
            }
            Outcome::Gone(_) | Outcome::Refused(_) => {
                item.status = Status::Gone;
                None
            }
            Outcome::Throttled(_, retry_after) if retry => {
                let host = copy.source_host().to_string();
                let delay = self
                    .backoff
                    .next(self.hosts.get(&host).map(|(_, d)| *d))
                    .max(retry_after.unwrap_or_default());
                self.hosts.insert(host, (now + delay, delay));
                item.status = Status::Queued;
                Some(delay)
            }
            Outcome::Failed(_) if retry => {
                let delay = self.backoff.next(item.delay);
                item.delay = Some(delay);
                item.not_before = Some(now + delay);
                item.status = Status::Queued;
                Some(delay)
            }
            Outcome::Throttled(..) | Outcome::Failed(_) => {
                item.status = Status::Failed;
                None
            }
        }
    }

    /// The namespaces that ask for the copy to `destination` now: of the recorded Pods whose
    /// records name it, and of the templates and reports (keys `Kind/namespace/...`) that do.
    pub fn requesters(&self, destination: &str) -> BTreeSet<String> {
        let by_pods = self.pods.iter().filter(|(_, pod)| {
            pod.record.entries.iter().any(|e| {
                e.copy.destination == destination
                    || e.signature
                        .as_ref()
                        .is_some_and(|s| s.destination == destination)
            })
        });
        let by_templates = self
            .templates
            .iter()
            .filter(|(_, copies)| copies.iter().any(|c| c.destination == destination));
        by_pods
            .filter_map(|(key, _)| key.split('/').next())
            .chain(by_templates.filter_map(|(key, _)| key.split('/').nth(1)))
            .map(str::to_string)
            .collect()
    }

    /// Queued and running copies.
    pub fn queue_depth(&self) -> usize {
        self.copies
            .values()
            .filter(|item| matches!(item.status, Status::Queued | Status::Running))
            .count()
    }

    /// Whether nothing is queued or running.
    pub fn idle(&self) -> bool {
        self.queue_depth() == 0
    }

    pub fn item(&self, destination: &str) -> Option<&CopyItem> {
        self.copies.get(destination)
    }

    /// Per target registry: the distinct images that recorded Pods or workload templates name
    /// and the mirror does not hold yet. Every registry a copy was ever asked for is named, 0 when none lacks.
    pub fn missing(&self) -> BTreeMap<String, i64> {
        let mut counts: BTreeMap<String, i64> = self
            .copies
            .values()
            .map(|item| (item.copy.destination_host().to_string(), 0))
            .collect();
        let named: BTreeSet<&str> = self
            .pods
            .values()
            .flat_map(|pod| pod.record.entries.iter())
            .map(|entry| entry.copy.destination.as_str())
            .chain(
                self.templates
                    .values()
                    .flatten()
                    .map(|c| c.destination.as_str()),
            )
            .collect();
        for destination in named {
            let done = self
                .copies
                .get(destination)
                .is_some_and(|item| matches!(item.status, Status::Done(_)));
            if !done && let Some((host, _)) = destination.split_once('/') {
                *counts.entry(host.to_string()).or_default() += 1;
            }
        }
        counts
    }
}

/// One destination asked for with another way to fill it (a rule marked `pullThrough` since,
/// or a Pod naming the tag a report's digest-only copy lacked): the newer way is taken, and a
/// copy that ended without filling the mirror is tried again that way. A copy that runs, or
/// that filled the mirror, stands.
fn renew(item: &mut CopyItem, copy: &Copy) {
    if item.copy == *copy || item.status == Status::Running {
        return;
    }
    item.copy = copy.clone();
    if !matches!(item.status, Status::Done(_)) {
        item.status = Status::Queued;
        item.not_before = None;
        item.delay = None;
    }
}

fn whole_seconds(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use image_swapper_policy::plan::FillEntry;

    fn copy(source: &str, destination: &str) -> Copy {
        Copy {
            source: source.to_string(),
            destination: destination.to_string(),
            warm: None,
        }
    }

    fn record(entries: &[(&str, Copy)]) -> FillRecord {
        FillRecord {
            text: format!("{entries:?}"),
            entries: entries
                .iter()
                .map(|(container, copy)| FillEntry {
                    container: container.to_string(),
                    copy: copy.clone(),
                    signature: None,
                })
                .collect(),
            notes: Vec::new(),
        }
    }

    fn nginx() -> Copy {
        copy("docker.io/library/nginx:1", "m.io/library/nginx:1")
    }

    #[test]
    fn a_copy_many_pods_ask_for_runs_once() {
        let mut board = Board::new(Backoff::default(), true);
        for i in 0..100 {
            board.pod_seen(&format!("ns/p{i}"), record(&[("web", nginx())]), None);
        }
        let now = Instant::now();
        assert_eq!(board.start(now, 4), [nginx()]);
        assert_eq!(board.start(now, 4), []);
        board.finished(&nginx(), &Outcome::Copied, now);
        let marks = board.marks(now);
        assert_eq!(marks.len(), 100);
        assert!(marks.iter().all(|m| m.filled == ["web"]));
    }

    /// A rule marked `pullThrough` after a copy into it failed: the record read again names
    /// the same destination with a warming, which is what runs next, not the failed push.
    #[test]
    fn a_destination_asked_for_another_way_is_tried_that_way() {
        let mut board = Board::new(Backoff::default(), false);
        let pushed = nginx();
        let warmed = Copy {
            warm: Some(image_swapper_policy::plan::Warm {
                reference: "m.io/library/nginx:1".to_string(),
                digest: None,
            }),
            ..nginx()
        };
        board.pod_seen("ns/p", record(&[("web", pushed.clone())]), None);
        let now = Instant::now();
        assert_eq!(board.start(now, 4), std::slice::from_ref(&pushed));
        board.finished(
            &pushed,
            &Outcome::Failed("a cache refuses pushes".into()),
            now,
        );
        assert_eq!(board.start(now, 4), []);
        board.pod_seen("ns/p", record(&[("web", warmed.clone())]), None);
        assert_eq!(board.start(now, 4), std::slice::from_ref(&warmed));
        board.finished(&warmed, &Outcome::Copied, now);
        board.pod_seen("ns/p", record(&[("web", pushed)]), None);
        assert_eq!(board.start(now, 4), [], "what filled the mirror stands");
    }

    #[test]
    fn at_most_room_copies_start_at_once() {
        let mut board = Board::new(Backoff::default(), true);
        for i in 0..10 {
            let c = copy(&format!("a.io/x{i}:1"), &format!("m.io/x{i}:1"));
            board.pod_seen(&format!("ns/p{i}"), record(&[("c", c)]), None);
        }
        assert_eq!(board.start(Instant::now(), 4).len(), 4);
        assert_eq!(board.start(Instant::now(), 2).len(), 2);
        assert_eq!(board.queue_depth(), 10);
    }

    /// A 429 holds every copy from that source registry, not only the one that got it, and
    /// for at least what `Retry-After` asked; another registry's copies go on.
    #[test]
    fn a_throttled_source_holds_all_its_copies_for_the_backoff() {
        let mut board = Board::new(Backoff::default(), true);
        let a1 = copy("a.io/x:1", "m.io/x:1");
        let a2 = copy("a.io/y:1", "m.io/y:1");
        let b = copy("b.io/z:1", "m.io/z:1");
        board.pod_seen("ns/p", record(&[("a1", a1.clone())]), None);
        let now = Instant::now();
        assert_eq!(board.start(now, 4), std::slice::from_ref(&a1));
        let waited = board.finished(
            &a1,
            &Outcome::Throttled("429".into(), Some(Duration::from_secs(30))),
            now,
        );
        assert_eq!(waited, Some(Duration::from_secs(30)));
        board.pod_seen("ns/q", record(&[("a2", a2), ("b", b.clone())]), None);
        assert_eq!(board.start(now, 4), [b]);
        assert_eq!(board.start(now + Duration::from_secs(29), 4), []);
        assert_eq!(board.start(now + Duration::from_secs(30), 4).len(), 2);
    }

    #[test]
    fn the_backoff_doubles_up_to_its_bound() {
        let mut board = Board::new(
            Backoff {
                retry: Duration::from_secs(10),
                max: Duration::from_secs(25),
            },
            true,
        );
        board.pod_seen("ns/p", record(&[("web", nginx())]), None);
        let mut now = Instant::now();
        let mut delays = Vec::new();
        for _ in 0..3 {
            let started = board.start(now, 1);
            assert_eq!(started.len(), 1);
            delays.push(board.finished(&nginx(), &Outcome::Failed("x".into()), now));
            now += Duration::from_secs(60);
        }
        assert_eq!(delays, [10, 20, 25].map(|s| Some(Duration::from_secs(s))));
    }

    #[test]
    fn the_one_shot_run_does_not_retry_a_failure() {
        let mut board = Board::new(Backoff::default(), false);
        board.pod_seen("ns/p", record(&[("web", nginx())]), None);
        let now = Instant::now();
        board.start(now, 1);
        board.finished(&nginx(), &Outcome::Failed("x".into()), now);
        assert!(board.idle());
        assert_eq!(
            board.item(&nginx().destination).map(|i| i.status.clone()),
            Some(Status::Failed)
        );
    }

    /// The missing images: a recorded image counts until the mirror holds it, once however
    /// many Pods name it, under its target registry.
    #[test]
    fn missing_images_count_each_destination_once_until_it_is_held() {
        let mut board = Board::new(Backoff::default(), true);
        board.pod_seen("ns/p", record(&[("web", nginx())]), None);
        board.pod_seen("ns/q", record(&[("web", nginx())]), None);
        board.pod_seen(
            "ns/r",
            record(&[("db", copy("a.io/pg:1", "other.io/pg:1"))]),
            None,
        );
        assert_eq!(
            board.missing(),
            BTreeMap::from([("m.io".to_string(), 1), ("other.io".to_string(), 1)])
        );
        let now = Instant::now();
        board.start(now, 4);
        board.finished(&nginx(), &Outcome::Copied, now);
        assert_eq!(
            board.missing(),
            BTreeMap::from([("m.io".to_string(), 0), ("other.io".to_string(), 1)])
        );
    }

    /// A Pod recorded after the copy was made: the mirror lost the image since, so it is
    /// copied again and the Pod is not marked by the old copy.
    #[test]
    fn a_pod_recorded_after_its_copy_copies_again() {
        let mut board = Board::new(Backoff::default(), true);
        board.pod_seen("ns/p", record(&[("web", nginx())]), None);
        let now = Instant::now();
        board.start(now, 1);
        board.finished(&nginx(), &Outcome::Copied, now);
        let later = SystemTime::now() + Duration::from_secs(5);
        board.pod_seen("ns/q", record(&[("web", nginx())]), Some(later));
        assert!(board.marks(now).iter().all(|m| m.pod != "ns/q"));
        assert_eq!(board.start(now, 1), [nginx()]);
    }

    /// A template's image is copied ahead of any Pod, counts as missing until then, and a
    /// template listed no more stops counting.
    #[test]
    fn a_template_s_images_are_filled_ahead_of_any_pod() {
        let mut board = Board::new(Backoff::default(), true);
        board.template_seen("Deployment/ns/web", vec![nginx()]);
        board.template_seen("ReplicaSet/ns/web-1", vec![nginx()]);
        assert_eq!(board.missing(), BTreeMap::from([("m.io".to_string(), 1)]));
        let now = Instant::now();
        assert_eq!(board.start(now, 4), [nginx()]);
        board.finished(&nginx(), &Outcome::Present, now);
        assert_eq!(board.missing(), BTreeMap::from([("m.io".to_string(), 0)]));
        board.template_seen("Deployment/ns/web", vec![nginx()]);
        assert_eq!(
            board.start(now, 4),
            [],
            "a held image is not looked up again"
        );
        let other = copy("a.io/x:1", "m.io/x:1");
        board.template_seen("Deployment/ns/web", vec![other]);
        board.retain_templates("Deployment", &BTreeSet::new());
        assert_eq!(board.missing(), BTreeMap::from([("m.io".to_string(), 0)]));
    }

    /// Once a period, a template's image is looked up again (the mirror may have lost it),
    /// and a finished copy nothing names is forgotten.
    #[test]
    fn a_refresh_asks_again_for_templates_and_forgets_the_rest() {
        let mut board = Board::new(Backoff::default(), true);
        let other = copy("a.io/x:1", "m.io/x:1");
        board.template_seen("Deployment/ns/web", vec![nginx()]);
        board.template_seen("Deployment/ns/old", vec![other.clone()]);
        let now = Instant::now();
        assert_eq!(board.start(now, 4).len(), 2);
        board.finished(&nginx(), &Outcome::Present, now);
        board.finished(&other, &Outcome::Present, now);
        board.template_gone("Deployment/ns/old");
        board.refresh(Duration::from_secs(3600));
        assert_eq!(board.start(now, 4), [], "within the period, no lookup");
        assert!(board.item(&other.destination).is_none(), "not forgotten");
        board.refresh(Duration::ZERO);
        assert_eq!(board.start(now, 4), [nginx()]);
    }

    #[test]
    fn a_refused_mark_is_not_sent_again_until_the_record_changes() {
        let mut board = Board::new(Backoff::default(), true);
        board.pod_seen("ns/p", record(&[("web", nginx())]), None);
        let now = Instant::now();
        board.start(now, 1);
        board.finished(&nginx(), &Outcome::Copied, now);
        let mark = board.marks(now).remove(0);
        board.marked(&mark, MarkResult::Final, now);
        assert_eq!(board.marks(now), []);
        let mut changed = record(&[("web", nginx())]);
        changed.text.push('!');
        board.pod_seen("ns/p", changed, None);
        assert_eq!(board.marks(now).len(), 1);
    }

    #[test]
    fn a_mark_the_api_server_could_not_take_waits_then_goes_again() {
        let mut board = Board::new(Backoff::default(), true);
        board.pod_seen("ns/p", record(&[("web", nginx())]), None);
        let now = Instant::now();
        board.start(now, 1);
        board.finished(&nginx(), &Outcome::Copied, now);
        let mark = board.marks(now).remove(0);
        board.marked(&mark, MarkResult::Retry, now);
        assert_eq!(board.marks(now + Duration::from_secs(4)), []);
        assert_eq!(board.marks(now + Duration::from_secs(5)).len(), 1);
    }
}
