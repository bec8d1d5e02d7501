//! The lookup budget of one admission: policy-server interrupts an evaluation that overruns its
//! timeout and rejects the Pod whatever `onLookupError` says, so the policy stops starting
//! lookups that would likely end past `lookupBudgetMilliseconds`, and the images it did not look
//! up follow `onLookupError` instead.
//!
//! "Likely" is measured, not guessed, and the contract is the one the timeouts are sized for:
//! no lookup starts once the budget has run out, so the evaluation ends within the budget plus
//! one lookup of the slowest registry.
//!
//! - A registry this admission has asked already: its next lookup starts only when the time
//!   the evaluation has run plus that registry's slowest lookup so far fits in the budget.
//! - A registry not yet asked, alone: its lookup starts while any of the budget is left.
//!   Nothing this admission measured predicts it: the second mirror of an ordered list may be
//!   five times further than the first, and the first lookup of a fresh policy-server costs
//!   half as much again as a later one (KUBEWARDEN.md, policy-server 1.35), so any factor is
//!   either too timid for failover between near mirrors or too bold for a far one. Predicted
//!   at five times the slowest lookup so far (0.4.0), ordered mirrors 20 ms apart no longer
//!   failed over at the default budget on 1.35 (issue 31).
//! - A registry not yet asked, as part of a sequence (`verifySource`'s first step: the
//!   mirror's digest, then one lookup of the source): predicted at the slowest lookup so far
//!   and at no less than a quarter of the budget (200 ms by default, four round trips to a
//!   registry 50 ms away), so that no lookup is spent on a comparison the budget would then
//!   cut short.
//!
//! The admission asks the first image of each registry first (`pod`), so that a registry not
//! yet asked is asked while the budget is fresh.
//!
//! The time is the wall clock around each host call, so it includes the wait for the host's
//! lock while other admissions' lookups run (policy-server serialises them), which the
//! evaluation timeout counts too.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::registry::{LookupError, Manifest, Refusal, Registry, registry_host};
use crate::signatures::Verification;

/// A monotonic clock; the module's own in the policy, a hand-moved one in unit tests.
pub trait Clock {
    /// Time since an arbitrary fixed origin.
    fn now(&self) -> Duration;
}

/// `std::time::Instant`: on `wasm32-wasip1` it is WASI's `clock_time_get` (monotonic clock),
/// which kwctl and policy-server provide; it reads the host's real time, host calls included.
pub struct MonotonicClock(Instant);

impl MonotonicClock {
    pub fn start() -> MonotonicClock {
        MonotonicClock(Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// What the budget saw, for the warning, the rejection and the audit annotations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BudgetReport {
    pub limit: Duration,
    /// How long the evaluation had run at the last lookup's end or the last refusal.
    pub elapsed: Duration,
    /// The lookups' own time, added up.
    pub lookup_time: Duration,
    pub lookups: usize,
    pub slowest: Duration,
    /// Lookups, or sequences of lookups, not started because they would likely have ended
    /// past the limit.
    pub refused: usize,
}

impl BudgetReport {
    pub fn elapsed_ms(&self) -> u64 {
        whole_ms(self.elapsed)
    }

    pub fn lookup_ms(&self) -> u64 {
        whole_ms(self.lookup_time)
    }

    pub fn limit_ms(&self) -> u64 {
        whole_ms(self.limit)
    }

    pub fn slowest_ms(&self) -> u64 {
        whole_ms(self.slowest)
    }
}

/// Milliseconds as u64: `Duration::as_millis` is u128, whose formatting the module would
/// otherwise carry for numbers that never pass 2^64.
fn whole_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The least a lookup on a registry not yet asked is predicted to take, as a share of the
/// budget (see the module's documentation).
const UNASKED_REGISTRY_SHARE: u32 = 4;

/// How a lookup is weighed: alone, or as part of a sequence that must conclude.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Weighed {
    Alone,
    InSequence,
}

/// A verification (`v2/verify`) asks the registry for the image's digest, then its signature
/// manifest and each signature layer: about two lookups' time (KUBEWARDEN.md, measured on
/// policy-server 1.35: medians 532 ms and 268 ms). A registry whose lookups were measured but
/// none of its verifications is predicted this many lookups per verification.
const LOOKUPS_PER_VERIFICATION: u32 = 2;

/// A [`Registry`] that asks `inner` only while the budget allows, and says
/// [`LookupError::OverBudget`] otherwise.
///
/// Time counts from the clock's origin, which `validate` sets as the evaluation starts:
/// policy-server's timeout counts the whole evaluation, reading the request included.
pub struct Budgeted<'r, R, C> {
    inner: &'r mut R,
    clock: &'r C,
    report: BudgetReport,
    /// The slowest lookup so far on each registry host.
    slowest_by_host: BTreeMap<String, Duration>,
    /// The slowest verification so far on each registry host.
    slowest_verification_by_host: BTreeMap<String, Duration>,
    /// Registry hosts of sequences already judged affordable (`verifySource`'s first step):
    /// their first lookup was planned with the rest, and is weighed as the plan weighed it.
    planned_hosts: BTreeSet<String>,
}

impl<'r, R: Registry, C: Clock> Budgeted<'r, R, C> {
    pub fn new(inner: &'r mut R, clock: &'r C, limit: Duration) -> Self {
        Budgeted {
            inner,
            clock,
            report: BudgetReport {
                limit,
                ..BudgetReport::default()
            },
            slowest_by_host: BTreeMap::new(),
            slowest_verification_by_host: BTreeMap::new(),
            planned_hosts: BTreeSet::new(),
        }
    }

    pub fn report(&self) -> BudgetReport {
        self.report
    }

    /// What a lookup on `host` will likely take. A registry asked already: its slowest lookup.
    /// One not yet asked, in a sequence (or named by one judged affordable): the slowest
    /// lookup so far on any registry, and no less than a quarter of the budget. One not yet
    /// asked, alone: nothing, so that it starts while any of the budget is left.
    fn predicted(&self, host: &str, weighed: Weighed) -> Duration {
        if let Some(slowest) = self.slowest_by_host.get(host) {
            return *slowest;
        }
        if weighed == Weighed::InSequence || self.planned_hosts.contains(host) {
            self.report
                .slowest
                .max(self.report.limit / UNASKED_REGISTRY_SHARE)
        } else {
            Duration::ZERO
        }
    }

    /// Whether lookups of `images`, in that order, would likely all end within the budget, or
    /// why not. None starts once the budget has run out. The first lookup of an admission is
    /// predicted to take no time: with nothing measured there is nothing to predict from, and
    /// an admission that looks nothing up swaps nothing.
    fn predicted_to_fit(
        &self,
        images: &[&str],
        now: Duration,
        weighed: Weighed,
    ) -> Result<(), Refusal> {
        let first_of_admission = usize::from(self.report.lookups == 0);
        let needed: Duration = images
            .iter()
            .skip(first_of_admission)
            .map(|image| self.predicted(registry_host(image), weighed))
            .sum();
        if now < self.report.limit && now + needed <= self.report.limit {
            return Ok(());
        }
        let mut registries: Vec<&str> = Vec::new();
        for image in images {
            let host = registry_host(image);
            if !registries.contains(&host) {
                registries.push(host);
            }
        }
        Err(Refusal {
            registry: registries.join(" then "),
            needed_ms: whole_ms(needed),
            left_ms: whole_ms(self.report.limit.saturating_sub(now)),
        })
    }

    /// [`Budgeted::predicted_to_fit`], counting a no as a refusal.
    fn fits(&mut self, images: &[&str], weighed: Weighed) -> Result<(), Refusal> {
        let now = self.clock.now();
        let fits = self.predicted_to_fit(images, now, weighed);
        if fits.is_err() {
            self.report.refused += 1;
            self.report.elapsed = self.report.elapsed.max(now);
        }
        fits
    }

    /// A verification of `image` starts on the same terms as a lookup, predicted at the
    /// registry's slowest verification so far, or, before its first, at
    /// [`LOOKUPS_PER_VERIFICATION`] times its slowest lookup (nothing when it was never asked,
    /// as for a lookup).
    fn verification_fits(&mut self, image: &str) -> Result<(), Refusal> {
        let host = registry_host(image);
        let now = self.clock.now();
        let needed = match (
            self.slowest_verification_by_host.get(host),
            self.slowest_by_host.get(host),
        ) {
            (Some(slowest), _) => *slowest,
            (None, Some(lookup)) => *lookup * LOOKUPS_PER_VERIFICATION,
            (None, None) => Duration::ZERO,
        };
        let needed = if self.report.lookups == 0 {
            Duration::ZERO
        } else {
            needed
        };
        if now < self.report.limit && now + needed <= self.report.limit {
            return Ok(());
        }
        self.report.refused += 1;
        self.report.elapsed = self.report.elapsed.max(now);
        Err(Refusal {
            registry: host.to_string(),
            needed_ms: whole_ms(needed),
            left_ms: whole_ms(self.report.limit.saturating_sub(now)),
        })
    }

    fn guarded<T>(
        &mut self,
        image: &str,
        lookup: impl FnOnce(&mut R) -> Result<T, LookupError>,
    ) -> Result<T, LookupError> {
        self.fits(&[image], Weighed::Alone)
            .map_err(LookupError::OverBudget)?;
        let took = self.timed(lookup);
        let host = self
            .slowest_by_host
            .entry(registry_host(image).to_string())
            .or_default();
        *host = (*host).max(took.1);
        took.0
    }

    /// Runs one host call, and counts it in the report: its answer, and what it took.
    fn timed<T>(
        &mut self,
        lookup: impl FnOnce(&mut R) -> Result<T, LookupError>,
    ) -> (Result<T, LookupError>, Duration) {
        let before = self.clock.now();
        let answer = lookup(self.inner);
        let after = self.clock.now();
        let took = after.saturating_sub(before);
        let report = &mut self.report;
        report.lookups += 1;
        report.lookup_time += took;
        report.slowest = report.slowest.max(took);
        report.elapsed = report.elapsed.max(after);
        (answer, took)
    }
}

impl<R: Registry, C: Clock> Registry for Budgeted<'_, R, C> {
    fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
        self.guarded(image, |inner| inner.manifest_digest(image))
    }

    fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError> {
        self.guarded(image, |inner| inner.manifest(image))
    }

    fn verify(
        &mut self,
        image: &str,
        verification: &Verification<'_>,
    ) -> Result<String, LookupError> {
        self.verification_fits(image)
            .map_err(LookupError::OverBudget)?;
        let (answer, took) = self.timed(|inner| inner.verify(image, verification));
        let host = self
            .slowest_verification_by_host
            .entry(registry_host(image).to_string())
            .or_default();
        *host = (*host).max(took);
        answer
    }

    fn affordable(&mut self, images: &[&str]) -> Result<(), Refusal> {
        self.fits(images, Weighed::InSequence)?;
        for image in images {
            self.planned_hosts.insert(registry_host(image).to_string());
        }
        Ok(())
    }

    fn would_fit(&self, images: &[&str]) -> bool {
        self.predicted_to_fit(images, self.clock.now(), Weighed::InSequence)
            .is_ok()
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A clock that moves only when told, from zero (the start of the evaluation): the fake
    /// registry moves it by each lookup's latency.
    #[derive(Clone, Default)]
    pub struct FakeClock(pub Rc<Cell<Duration>>);

    impl FakeClock {
        pub fn advance(&self, by: Duration) {
            self.0.set(self.0.get() + by);
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> Duration {
            self.0.get()
        }
    }

    /// Answers every lookup with one digest after the next latency of `latencies`
    /// (the last one repeats).
    struct SlowRegistry {
        clock: FakeClock,
        latencies: Vec<u64>,
        asked: usize,
    }

    impl Registry for SlowRegistry {
        crate::registry::never_verifies!();

        fn manifest_digest(&mut self, _image: &str) -> Result<String, LookupError> {
            let ms = self
                .latencies
                .get(self.asked)
                .or(self.latencies.last())
                .copied()
                .unwrap_or(0);
            self.asked += 1;
            self.clock.advance(Duration::from_millis(ms));
            Ok("sha256:x".to_string())
        }

        fn manifest(&mut self, _image: &str) -> Result<Manifest, LookupError> {
            Err(LookupError::Failed("not used".to_string()))
        }
    }

    /// Lookups take `lookup_ms`, verifications `verify_ms`, on one registry.
    struct Verifying {
        clock: FakeClock,
        lookup_ms: u64,
        verify_ms: u64,
    }

    impl Registry for Verifying {
        fn verify(
            &mut self,
            _image: &str,
            _verification: &Verification<'_>,
        ) -> Result<String, LookupError> {
            self.clock.advance(Duration::from_millis(self.verify_ms));
            Ok("sha256:x".to_string())
        }

        fn manifest_digest(&mut self, _image: &str) -> Result<String, LookupError> {
            self.clock.advance(Duration::from_millis(self.lookup_ms));
            Ok("sha256:x".to_string())
        }

        fn manifest(&mut self, _image: &str) -> Result<Manifest, LookupError> {
            Err(LookupError::Failed("not used".to_string()))
        }
    }

    const KEYS: [String; 0] = [];

    /// A verification before the registry's first is predicted at two of its lookups; after,
    /// at its slowest verification.
    #[rstest::rstest]
    #[case::two_lookups_fit(200, 400, 2, Some(Refusal { registry: "m.io".into(), needed_ms: 400, left_ms: 200 }))]
    #[case::two_lookups_do_not_fit(300, 400, 1, Some(Refusal { registry: "m.io".into(), needed_ms: 600, left_ms: 500 }))]
    fn verifications_are_predicted_from_the_registrys_own_timing(
        #[case] lookup_ms: u64,
        #[case] verify_ms: u64,
        #[case] calls: usize,
        #[case] refusal: Option<Refusal>,
    ) {
        let clock = FakeClock::default();
        let mut registry = Verifying {
            clock: clock.clone(),
            lookup_ms,
            verify_ms,
        };
        let mut budgeted = Budgeted::new(&mut registry, &clock, Duration::from_millis(800));
        let verification = Verification::PubKeys {
            keys: &KEYS,
            annotations: None,
        };
        assert!(budgeted.manifest_digest("m.io/a:1").is_ok());
        let mut refused = None;
        for _ in 0..3 {
            if let Err(LookupError::OverBudget(why)) = budgeted.verify("m.io/a:1", &verification) {
                refused = Some(why);
                break;
            }
        }
        assert_eq!(budgeted.report().lookups, calls);
        assert_eq!(budgeted.report().refused, usize::from(refusal.is_some()));
        assert_eq!(refused, refusal);
    }

    /// A budget already spent refuses a verification even when nothing predicts its length (no
    /// lookup yet): it would start at the limit, and end past it.
    #[test]
    fn a_verification_at_the_limit_is_refused_before_any_lookup() {
        let clock = FakeClock::default();
        let mut registry = Verifying {
            clock: clock.clone(),
            lookup_ms: 100,
            verify_ms: 100,
        };
        let mut budgeted = Budgeted::new(&mut registry, &clock, Duration::from_millis(800));
        clock.advance(Duration::from_millis(800));
        let verification = Verification::PubKeys {
            keys: &KEYS,
            annotations: None,
        };
        assert_eq!(
            budgeted.verify("m.io/a:1", &verification),
            Err(LookupError::OverBudget(Refusal {
                registry: "m.io".into(),
                needed_ms: 0,
                left_ms: 0
            }))
        );
        assert_eq!(
            (budgeted.report().lookups, budgeted.report().refused),
            (0, 1)
        );
    }

    /// Runs `tries` lookups under a budget of `limit_ms` and says how many were made.
    fn run(limit_ms: u64, latencies: &[u64], tries: usize) -> (usize, BudgetReport) {
        run_after(0, limit_ms, latencies, tries)
    }

    /// The same, `before_ms` into the evaluation.
    fn run_after(
        before_ms: u64,
        limit_ms: u64,
        latencies: &[u64],
        tries: usize,
    ) -> (usize, BudgetReport) {
        let clock = FakeClock::default();
        clock.advance(Duration::from_millis(before_ms));
        let mut registry = SlowRegistry {
            clock: clock.clone(),
            latencies: latencies.to_vec(),
            asked: 0,
        };
        let mut budgeted = Budgeted::new(&mut registry, &clock, Duration::from_millis(limit_ms));
        let made = (0..tries)
            .filter(|_| budgeted.manifest_digest("x").is_ok())
            .count();
        (made, budgeted.report())
    }

    #[test]
    fn lookups_stop_before_one_would_likely_end_past_the_budget() {
        // 300 ms each: 0 -> 300 -> 600; a third would start at 600 and likely end at 900.
        let (made, report) = run(800, &[300], 10);
        assert_eq!(made, 2);
        assert_eq!(report.lookups, 2);
        assert_eq!(report.refused, 8);
        assert_eq!(report.elapsed, Duration::from_millis(600));
        assert_eq!(report.slowest, Duration::from_millis(300));
    }

    #[test]
    fn a_lookup_that_ends_exactly_at_the_budget_is_still_made() {
        let (made, _) = run(800, &[400], 5);
        assert_eq!(made, 2);
    }

    #[test]
    fn a_first_lookup_longer_than_the_budget_is_made_and_nothing_after_it() {
        let (made, report) = run(800, &[1_500, 1], 5);
        assert_eq!(made, 1);
        assert_eq!(report.elapsed, Duration::from_millis(1_500));
        assert_eq!(report.refused, 4);
    }

    #[test]
    fn the_slowest_lookup_so_far_is_the_prediction() {
        // Lookups end at 100, 400 (slowest now 300), 500 and 600. A fifth would start at 600:
        // predicted by the slowest it ends at 900 and is refused; predicted by the last lookup
        // (100) it would have been started.
        let (made, report) = run(800, &[100, 300, 100, 100], 10);
        assert_eq!(made, 4);
        assert_eq!(report.elapsed, Duration::from_millis(600));
        assert_eq!(report.slowest, Duration::from_millis(300));
    }

    #[test]
    fn fast_lookups_all_fit() {
        let (made, report) = run(800, &[1], 100);
        assert_eq!(made, 100);
        assert_eq!(report.refused, 0);
    }

    /// Answers every lookup after the latency of its registry host (the image's first segment).
    struct Hosts {
        clock: FakeClock,
        latency_ms: BTreeMap<&'static str, u64>,
        /// Each lookup made: its host and the time it ended.
        ended: Vec<(String, Duration)>,
    }

    impl Hosts {
        fn new(clock: &FakeClock, latency_ms: &[(&'static str, u64)]) -> Hosts {
            Hosts {
                clock: clock.clone(),
                latency_ms: latency_ms.iter().copied().collect(),
                ended: Vec::new(),
            }
        }
    }

    impl Registry for Hosts {
        crate::registry::never_verifies!();

        fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
            let host = registry_host(image);
            let ms = self.latency_ms.get(host).copied().unwrap_or(0);
            self.clock.advance(Duration::from_millis(ms));
            self.ended.push((host.to_string(), self.clock.now()));
            Ok("sha256:x".to_string())
        }

        fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError> {
            self.manifest_digest(image)
                .and(Err(LookupError::Failed("not used".to_string())))
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Asks `images` in order under an 800 ms budget; the hosts of the lookups made.
    fn asked(latency_ms: &[(&'static str, u64)], images: &[&str]) -> Vec<String> {
        let clock = FakeClock::default();
        let mut hosts = Hosts::new(&clock, latency_ms);
        let mut budgeted = Budgeted::new(&mut hosts, &clock, Duration::from_millis(800));
        for image in images {
            let _ = budgeted.manifest_digest(image);
        }
        hosts.ended.into_iter().map(|(host, _)| host).collect()
    }

    /// The contract: no lookup starts once the budget has run out. Near lookups of 30 ms end
    /// at 30 … 780 (the 27th would end at 810); the far registry, never asked, starts with 20 ms
    /// left and ends within the budget plus its own lookup. With none left, it is not started.
    #[test]
    fn a_registry_not_yet_asked_starts_while_any_of_the_budget_is_left() {
        let clock = FakeClock::default();
        let mut hosts = Hosts::new(&clock, &[("near.io", 30), ("far.io", 150)]);
        let mut budgeted = Budgeted::new(&mut hosts, &clock, Duration::from_millis(800));
        for _ in 0..27 {
            let _ = budgeted.manifest_digest("near.io/a");
        }
        assert!(budgeted.manifest_digest("far.io/a").is_ok(), "780 + 150");
        assert_eq!(hosts.ended.len(), 27, "26 near, then the far one");
        assert_eq!(hosts.ended.last(), Some(&("far.io".to_string(), ms(930))));

        let clock = FakeClock::default();
        let mut hosts = Hosts::new(&clock, &[("near.io", 400), ("far.io", 150)]);
        let mut budgeted = Budgeted::new(&mut hosts, &clock, Duration::from_millis(800));
        let _ = budgeted.manifest_digest("near.io/a");
        let _ = budgeted.manifest_digest("near.io/a");
        assert_eq!(
            budgeted.manifest_digest("far.io/a"),
            Err(LookupError::OverBudget(Refusal {
                registry: "far.io".to_string(),
                needed_ms: 0,
                left_ms: 0,
            })),
            "800: the budget has run out"
        );
    }

    /// policy-server 1.35's timing (KUBEWARDEN.md): a mirror 20 ms away answers in about
    /// 160 ms, one 100 ms away in 650. The far one, asked second, starts with 640 ms left and
    /// ends at 810 ms, within the budget plus one lookup of the slowest registry; after it,
    /// nothing starts. On 1.31's timing (100 and 420 ms) the near lookups go on after it.
    #[test]
    fn a_lone_lookup_on_a_registry_not_yet_asked_is_not_held_back_by_another_registrys_timing() {
        let images = [
            "near.io/a",
            "far.io/a",
            "near.io/a",
            "near.io/a",
            "near.io/a",
        ];
        let made = asked(&[("near.io", 160), ("far.io", 650)], &images);
        assert_eq!(made, ["near.io", "far.io"]);
        let made = asked(&[("near.io", 100), ("far.io", 420)], &images);
        assert_eq!(made, ["near.io", "far.io", "near.io", "near.io"]);
    }

    /// Ordered mirrors on two hosts, 20 ms away on policy-server 1.35 (issue 31): the first
    /// lookup of a fresh process took 457 ms and found nothing; the second mirror is asked
    /// with 343 ms left. Predicted at five times 457 ms (0.4.0) it was not.
    #[test]
    fn the_second_mirror_of_an_ordered_list_is_asked_after_a_slow_first_answer() {
        let made = asked(
            &[("first.io", 457), ("second.io", 180)],
            &["first.io/a", "second.io/a"],
        );
        assert_eq!(made, ["first.io", "second.io"]);
    }

    /// A registry a plan named (`verifySource`'s first step names the source's) is weighed as
    /// the plan weighed it; a sequence weighs a registry not yet asked at a quarter of the
    /// budget at least, where a lone lookup on it would start.
    #[test]
    fn a_registry_a_plan_named_is_predicted_as_the_plan_was() {
        let clock = FakeClock::default();
        let mut hosts = Hosts::new(&clock, &[("m.io", 205), ("s.io", 205)]);
        let mut budgeted = Budgeted::new(&mut hosts, &clock, Duration::from_millis(800));
        assert!(budgeted.affordable(&["m.io/a", "s.io/a"]).is_ok());
        let _ = budgeted.manifest_digest("m.io/a");
        assert!(budgeted.manifest_digest("s.io/a").is_ok(), "205 + 205");

        let clock = FakeClock::default();
        let mut hosts = Hosts::new(&clock, &[("m.io", 650), ("s.io", 205)]);
        let mut budgeted = Budgeted::new(&mut hosts, &clock, Duration::from_millis(800));
        let _ = budgeted.manifest_digest("m.io/a");
        assert_eq!(
            budgeted.affordable(&["m.io/b", "s.io/b"]),
            Err(Refusal {
                registry: "m.io then s.io".to_string(),
                needed_ms: 1_300,
                left_ms: 150,
            }),
            "650 + 650 + 650"
        );
        assert!(
            budgeted.manifest_digest("s.io/a").is_ok(),
            "alone: 150 left"
        );
    }

    /// The case of 0.3 (mirrors 20 ms and 100 ms away, 85 and 405 ms a lookup): eight
    /// near lookups end at 680 ms, and the far one starts then and ends at 1,085 ms, within
    /// the budget plus one lookup of the slowest registry, which the documented timeouts allow
    /// for (README, "Deploy"). Nothing starts after it.
    #[test]
    fn a_distant_registry_asked_late_ends_within_the_budget_and_one_of_its_lookups() {
        let clock = FakeClock::default();
        let mut hosts = Hosts::new(&clock, &[("near.io", 85), ("far.io", 405)]);
        let mut budgeted = Budgeted::new(&mut hosts, &clock, Duration::from_millis(800));
        let mut images = ["near.io/a"; 8].to_vec();
        images.extend(["far.io/a", "near.io/a"]);
        for image in images {
            let _ = budgeted.manifest_digest(image);
        }
        assert_eq!(hosts.ended.len(), 9);
        assert_eq!(hosts.ended.last(), Some(&("far.io".to_string(), ms(1_085))));
        assert!(ms(1_085) <= ms(800 + 405));
    }

    #[test]
    fn a_registry_asked_is_predicted_from_its_own_slowest_lookup() {
        // near 85 → 85; far (not yet asked) → 490; near 85 each → 575, 660, 745; the next
        // near one would end at 830, and far again (405) at 1,150.
        let mut images = vec!["near.io/a", "far.io/a"];
        images.extend(["near.io/a"; 4]);
        images.push("far.io/a");
        let made = asked(&[("near.io", 85), ("far.io", 405)], &images);
        assert_eq!(made, ["near.io", "far.io", "near.io", "near.io", "near.io"]);
    }

    /// A sequence (verifySource's first step) starts only when all of it fits: nothing
    /// measured, the first lookup is free and an unknown registry costs a quarter of the budget.
    #[test]
    fn a_sequence_starts_only_when_all_of_it_is_likely_to_fit() {
        let clock = FakeClock::default();
        let mut hosts = Hosts::new(&clock, &[("m.io", 85), ("s.io", 250)]);
        let mut budgeted = Budgeted::new(&mut hosts, &clock, Duration::from_millis(800));
        let sequence = ["m.io/a", "s.io/a", "s.io/a", "m.io/a"];
        assert!(
            budgeted.affordable(&sequence).is_ok(),
            "0 + 200 + 200 + 200"
        );
        let _ = budgeted.manifest_digest("m.io/a");
        assert!(
            budgeted.affordable(&sequence[1..]).is_ok(),
            "85 + 200 + 200 + 85"
        );
        let _ = budgeted.manifest_digest("s.io/a");
        assert!(
            budgeted.affordable(&sequence[2..]).is_ok(),
            "335 + 250 + 85"
        );
        // A second image's whole sequence: 335 + 85 + 250 + 250 + 85 = 1,005.
        assert!(budgeted.affordable(&sequence).is_err());
        assert_eq!(budgeted.report().refused, 1);
        assert_eq!(hosts.ended.len(), 2, "a refused sequence asks nothing");
    }

    /// Choosing between plans predicts as `affordable` does, and a plan not chosen is not a
    /// refusal: the budget's figures count only lookups and sequences not started.
    #[test]
    fn a_plan_weighed_and_not_chosen_is_no_refusal() {
        let clock = FakeClock::default();
        let mut hosts = Hosts::new(&clock, &[("m.io", 205), ("s.io", 205)]);
        let mut budgeted = Budgeted::new(&mut hosts, &clock, Duration::from_millis(800));
        assert!(
            budgeted.affordable(&["m.io/a", "s.io/a"]).is_ok(),
            "the image's first step"
        );
        let _ = budgeted.manifest_digest("m.io/a");
        assert!(
            !budgeted.would_fit(&["s.io/a", "s.io/a", "m.io/a"]),
            "205 + 3 × 205"
        );
        assert!(budgeted.would_fit(&["s.io/a", "m.io/a"]), "205 + 2 × 205");
        assert_eq!(budgeted.report().refused, 0);
        assert!(
            budgeted
                .affordable(&["s.io/a", "s.io/a", "m.io/a"])
                .is_err()
        );
        assert_eq!(budgeted.report().refused, 1);
    }

    /// Reading a large request before the first lookup spends budget too.
    #[test]
    fn time_before_the_first_lookup_counts() {
        // 500 + 200 = 700; a second would end at 900.
        let (made, report) = run_after(500, 800, &[200], 5);
        assert_eq!(made, 1);
        assert_eq!(report.elapsed, Duration::from_millis(700));
    }
}
