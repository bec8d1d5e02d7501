//! The lookup budget of one admission: policy-server interrupts an evaluation that overruns its
//! timeout and rejects the Pod whatever `onLookupError` says, so the policy stops starting
//! lookups that would likely end past `lookupBudgetMilliseconds`, and the images it did not look
//! up follow `onLookupError` instead.
//!
//! "Likely" is measured, not guessed: a lookup is started only when the time spent so far plus
//! the slowest lookup of this admission fits in the budget. The time is the wall clock around
//! each host call, so it includes the wait for the host's lock while other admissions' lookups
//! run (policy-server serialises them), which the evaluation timeout counts too.

use std::time::{Duration, Instant};

use crate::registry::{LookupError, Manifest, Registry};

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
    /// From the budget's start to the end of the last lookup made.
    pub spent: Duration,
    pub lookups: usize,
    pub slowest: Duration,
    /// Lookups not started because they would likely have ended past the limit.
    pub refused: usize,
}

impl BudgetReport {
    pub fn spent_ms(&self) -> u64 {
        whole_ms(self.spent)
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

/// A [`Registry`] that asks `inner` only while the budget allows, and says
/// [`LookupError::OverBudget`] otherwise.
///
/// Time counts from the clock's origin, which `validate` sets as the evaluation starts:
/// policy-server's timeout counts the whole evaluation, reading the request included.
pub struct Budgeted<'r, R, C> {
    inner: &'r mut R,
    clock: &'r C,
    report: BudgetReport,
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
        }
    }

    pub fn report(&self) -> BudgetReport {
        self.report
    }

    fn elapsed(&self) -> Duration {
        self.clock.now()
    }

    fn guarded<T>(
        &mut self,
        lookup: impl FnOnce(&mut R) -> Result<T, LookupError>,
    ) -> Result<T, LookupError> {
        let before = self.elapsed();
        // The first lookup always starts: with nothing measured yet there is nothing to
        // predict from, and an admission that looks nothing up swaps nothing.
        if before + self.report.slowest > self.report.limit {
            self.report.refused += 1;
            return Err(LookupError::OverBudget);
        }
        let answer = lookup(self.inner);
        let after = self.elapsed();
        self.report.lookups += 1;
        self.report.slowest = self.report.slowest.max(after.saturating_sub(before));
        self.report.spent = after;
        answer
    }
}

impl<R: Registry, C: Clock> Registry for Budgeted<'_, R, C> {
    fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
        self.guarded(|inner| inner.manifest_digest(image))
    }

    fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError> {
        self.guarded(|inner| inner.manifest(image))
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
        assert_eq!(report.spent, Duration::from_millis(600));
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
        assert_eq!(report.spent, Duration::from_millis(1_500));
        assert_eq!(report.refused, 4);
    }

    #[test]
    fn the_slowest_lookup_so_far_is_the_prediction() {
        // Lookups end at 100, 400 (slowest now 300), 500 and 600. A fifth would start at 600:
        // predicted by the slowest it ends at 900 and is refused; predicted by the last lookup
        // (100) it would have been started.
        let (made, report) = run(800, &[100, 300, 100, 100], 10);
        assert_eq!(made, 4);
        assert_eq!(report.spent, Duration::from_millis(600));
        assert_eq!(report.slowest, Duration::from_millis(300));
    }

    #[test]
    fn fast_lookups_all_fit() {
        let (made, report) = run(800, &[1], 100);
        assert_eq!(made, 100);
        assert_eq!(report.refused, 0);
    }

    /// Reading a large request before the first lookup spends budget too.
    #[test]
    fn time_before_the_first_lookup_counts() {
        // 500 + 200 = 700; a second would end at 900.
        let (made, report) = run_after(500, 800, &[200], 5);
        assert_eq!(made, 1);
        assert_eq!(report.spent, Duration::from_millis(700));
    }
}
