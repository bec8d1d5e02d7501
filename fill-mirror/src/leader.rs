//! Leader election on a `coordination.k8s.io` Lease, so that of two replicas one copies and
//! marks while the other watches, ready to take over. It is client-go's (tools/leaderelection):
//! a Lease held by another is taken only once its record has not changed for its duration as
//! this replica measures it on its own clock, never by the holder's `renewTime`; the leader
//! stops leading when it could not renew within the renew deadline, shorter than the duration;
//! every write is a replace at the resourceVersion read, so of two writers one gets 409.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics::Metrics;

/// The election's three times, as client-go's LeaseDuration, RenewDeadline and RetryPeriod.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Written in the Lease: a replica takes a Lease held by another once its record has not
    /// changed for that long.
    pub duration: Duration,
    /// The leader leads no more when it has not renewed for that long; shorter than the
    /// duration, so that it stops before another replica may take the Lease.
    pub renew_deadline: Duration,
    /// How often a replica renews, or tries to take the Lease.
    pub retry: Duration,
}

impl Timing {
    /// From `--lease-duration` (at least 3 s): the renew deadline two thirds of it, a try every
    /// fifth (15 s: 10 s and 3 s, client-go's 15 s, 10 s and 2 s give or take a second).
    pub fn for_duration(seconds: u64) -> Timing {
        let duration = Duration::from_secs(seconds.max(3));
        Timing {
            duration,
            renew_deadline: duration * 2 / 3,
            retry: duration / 5,
        }
    }
}

/// The Lease's record as this replica last saw it change.
struct Observed {
    spec: LeaseSpec,
    /// When this replica saw it change, on its own monotonic clock.
    at: Instant,
    /// How many changes of it this replica saw under the same holder: that holder renews it.
    renewals: u32,
}

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    pub timing: Timing,
    observed: Mutex<Option<Observed>>,
    /// When the last round that took or renewed the Lease began.
    renewed: Mutex<Option<Instant>>,
    leading: watch::Sender<bool>,
    metrics: Arc<Metrics>,
}

/// Whether the Lease `spec` is another's to keep: it names a holder other than `identity`,
/// and its record changed (its holder renewed it) less than its own duration before `now`,
/// this replica's clock. `renewTime` is not read: it is the holder's clock.
fn held_by_another(spec: &LeaseSpec, identity: &str, changed_at: Instant, now: Instant) -> bool {
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() || holder == identity {
        return false;
    }
    let seconds = u64::try_from(spec.lease_duration_seconds.unwrap_or(15).max(1)).unwrap_or(1);
    now.saturating_duration_since(changed_at) < Duration::from_secs(seconds)
}

fn guard<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Elector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: String,
        timing: Timing,
        metrics: Arc<Metrics>,
    ) -> Elector {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity,
            timing,
            observed: Mutex::new(None),
            renewed: Mutex::new(None),
            leading: watch::Sender::new(false),
            metrics,
        }
    }

    /// Whether this replica leads, as it changes.
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    fn set_leading(&self, leading: bool) {
        let was = self.leading.send_replace(leading);
        self.metrics.leader.set(i64::from(leading));
        if was && !leading {
            tracing::warn!(lease = %self.name, identity = %self.identity, "leads no more: this replica stops copying and marking");
        } else if !was && leading {
            tracing::info!(lease = %self.name, identity = %self.identity, "leads: this replica copies and marks");
        }
    }

    /// Notes the record read at `now`: a record unlike the last one seen is a change, seen now.
    fn observe(&self, spec: &LeaseSpec, now: Instant) {
        let mut observed = guard(&self.observed);
        match observed.as_mut() {
            Some(seen) if seen.spec == *spec => {}
            Some(seen) => {
                let same_holder = seen.spec.holder_identity == spec.holder_identity;
                seen.renewals = if same_holder { seen.renewals + 1 } else { 0 };
                seen.spec = spec.clone();
                seen.at = now;
            }
            None => {
                *observed = Some(Observed {
                    spec: spec.clone(),
                    at: now,
                    renewals: 0,
                })
            }
        }
    }

    /// The holder other than this replica seen renewing the Lease since this replica first read it.
    pub fn holder_renewing(&self) -> Option<String> {
        let observed = guard(&self.observed);
        let seen = observed.as_ref().filter(|seen| seen.renewals > 0)?;
        let holder = seen
            .spec
            .holder_identity
            .clone()
            .filter(|h| !h.is_empty())?;
        (holder != self.identity).then_some(holder)
    }

    /// Who holds the Lease now, if anyone does.
    pub async fn holder(&self) -> Option<String> {
        let lease = self.api.get_opt(&self.name).await.ok()??;
        lease
            .spec?
            .holder_identity
            .filter(|holder| !holder.is_empty())
    }

    /// One try: takes or renews the Lease when it may; whether this replica holds it now. A
    /// write that loses to another (409) is not holding it.
    pub async fn round(&self) -> Result<bool, kube::Error> {
        let began = Instant::now();
        let wall = MicroTime(Timestamp::now());
        let seconds = i32::try_from(self.timing.duration.as_secs()).unwrap_or(15);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(wall.clone()),
                    renew_time: Some(wall),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            // Two replicas that start together both find no Lease: one creates it.
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => Ok(self.held(&created, began)),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    tracing::info!(lease = %self.name, "another replica created the Lease first");
                    Ok(false)
                }
                Err(error) => Err(error),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let now = Instant::now();
        self.observe(&spec, now);
        let changed_at = guard(&self.observed).as_ref().map_or(now, |seen| seen.at);
        if held_by_another(&spec, &self.identity, changed_at, now) {
            return Ok(false);
        }
        let taking = spec.holder_identity.as_deref() != Some(self.identity.as_str());
        let mut next = spec;
        if taking {
            next.acquire_time = Some(wall.clone());
            next.lease_transitions = Some(next.lease_transitions.unwrap_or(0) + 1);
            next.holder_identity = Some(self.identity.clone());
        }
        next.renew_time = Some(wall);
        next.lease_duration_seconds = Some(seconds);
        lease.spec = Some(next);
        // A replace at the resourceVersion read: of two replicas that read the same Lease, one
        // write wins and the other gets 409, and holds nothing.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                if taking {
                    tracing::info!(lease = %self.name, identity = %self.identity, "took the Lease");
                }
                Ok(self.held(&written, began))
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// The Lease this replica wrote in a round that began at `began`: it holds it.
    fn held(&self, written: &Lease, began: Instant) -> bool {
        self.observe(&written.spec.clone().unwrap_or_default(), Instant::now());
        *guard(&self.renewed) = Some(began);
        true
    }

    /// Until when this replica leads without another renewal.
    fn deadline(&self) -> Option<Instant> {
        let renewed = *guard(&self.renewed);
        renewed.map(|at| at + self.timing.renew_deadline)
    }

    /// One try, and what it makes of this replica: a leader that cannot reach the API server
    /// (an error, or no answer) leads until its renew deadline, and no longer; a try that took
    /// or renewed the Lease leads until the renew deadline from when it began.
    async fn step(&self) {
        let leading = *self.leading.borrow();
        let began = Instant::now();
        // A replica that does not lead waits up to the Lease's duration for an answer.
        let deadline = self
            .deadline()
            .filter(|_| leading)
            .unwrap_or(began + self.timing.duration);
        let leads = match tokio::time::timeout_at(deadline, self.round()).await {
            Ok(Ok(leads)) => leads && Instant::now() < began + self.timing.renew_deadline,
            Ok(Err(error)) => {
                tracing::warn!(lease = %self.name, %error, "cannot read or renew the Lease");
                leading && Instant::now() < deadline
            }
            Err(_) => {
                tracing::warn!(lease = %self.name, "no answer from the API server within the renew deadline");
                false
            }
        };
        self.set_leading(leads);
    }

    /// Takes the Lease for a one-shot run: at once when it is free, released or this run's;
    /// when another holds it, once that holder has not renewed it for the Lease's duration.
    /// `Some(holder)` when the holder is seen renewing it: the run has nothing to do.
    pub async fn take_for_run(&self) -> Result<Option<String>, kube::Error> {
        loop {
            if self.round().await? {
                self.set_leading(true);
                return Ok(None);
            }
            if let Some(holder) = self.holder_renewing() {
                return Ok(Some(holder));
            }
            tokio::time::sleep(self.timing.retry).await;
        }
    }

    /// Runs until aborted: a try every `retry` from the start of the last (a slow API server
    /// does not stretch the period), and, while leading, one at the renew deadline at the
    /// latest, so that a leader cut off stops on time.
    pub async fn run(self: Arc<Self>) {
        loop {
            let began = Instant::now();
            self.step().await;
            let mut next = began + self.timing.retry;
            if *self.leading.borrow() {
                next = self.deadline().map_or(next, |deadline| next.min(deadline));
            }
            tokio::time::sleep_until(next).await;
        }
    }

    /// Gives the Lease up when this replica holds it, as client-go's ReleaseOnCancel does (no
    /// holder, a duration of 1 s), so that a standby takes it at its next try instead of after
    /// the whole duration. Call it once nothing the Lease guards runs any more.
    pub async fn release(&self) {
        self.set_leading(false);
        let giving_up = async {
            // A renewal that was under way when the run stopped may land first: read again.
            for _ in 0..3 {
                let Some(mut lease) = self.api.get_opt(&self.name).await? else {
                    return Ok(false);
                };
                let Some(spec) = lease.spec.as_mut() else {
                    return Ok(false);
                };
                if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                    return Ok(false);
                }
                let now = MicroTime(Timestamp::now());
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                spec.acquire_time = Some(now.clone());
                spec.renew_time = Some(now);
                match self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => return Ok(true),
                    Err(kube::Error::Api(status)) if status.code == 409 => continue,
                    Err(error) => return Err(error),
                }
            }
            Ok(false)
        };
        match tokio::time::timeout(self.timing.renew_deadline, giving_up).await {
            Ok(Ok(true)) => {
                tracing::info!(lease = %self.name, identity = %self.identity, "gave the Lease up")
            }
            Ok(Ok(false)) => {}
            Ok(Err(error)) => {
                tracing::warn!(lease = %self.name, %error, "could not give the Lease up; it expires")
            }
            Err(_) => {
                tracing::warn!(lease = %self.name, "could not give the Lease up in time; it expires")
            }
        }
    }
}

/// How a one-shot run under the Lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Every copy it could make was made and every mark sent.
    Idle,
    /// It lost the Lease: it stopped copying and marking there.
    LostLease,
}

/// Resolves once `leading` turns false; never without an election (none).
pub async fn lost(leading: Option<watch::Receiver<bool>>) {
    match leading {
        Some(mut leading) => {
            if leading.wait_for(|leads| !*leads).await.is_err() {
                futures::future::pending::<()>().await;
            }
        }
        None => futures::future::pending().await,
    }
}

/// Resolves when `leading` changes; never without an election (none).
pub async fn leadership_changed(leading: &mut Option<watch::Receiver<bool>>) {
    let changed = match leading {
        Some(leading) => leading.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        futures::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, renewed: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            renew_time: Some(MicroTime(renewed)),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_lease_is_another_s_until_its_record_has_not_changed_for_its_duration() {
        let now = Instant::now();
        let wall = Timestamp::now();
        let ago = |seconds| now - Duration::from_secs(seconds);
        assert!(!held_by_another(&spec(None, wall), "a", ago(0), now));
        assert!(!held_by_another(&spec(Some(""), wall), "a", ago(0), now));
        assert!(!held_by_another(&spec(Some("a"), wall), "a", ago(0), now));
        assert!(held_by_another(&spec(Some("b"), wall), "a", ago(1), now));
        assert!(held_by_another(&spec(Some("b"), wall), "a", ago(14), now));
        assert!(!held_by_another(&spec(Some("b"), wall), "a", ago(15), now));
    }

    /// The holder's clock an hour behind: its renewTime is old, the record changes all the same.
    #[test]
    fn a_renewal_stamped_by_a_clock_an_hour_behind_still_holds() {
        let now = Instant::now();
        let an_hour_ago = Timestamp::from_second(Timestamp::now().as_second() - 3600)
            .unwrap_or(Timestamp::UNIX_EPOCH);
        assert!(held_by_another(
            &spec(Some("b"), an_hour_ago),
            "a",
            now - Duration::from_secs(1),
            now
        ));
    }

    #[test]
    fn the_leader_stops_before_another_may_take_the_lease() {
        for seconds in [3, 15, 60] {
            let timing = Timing::for_duration(seconds);
            assert!(timing.renew_deadline < timing.duration, "{timing:?}");
            assert!(timing.retry * 2 < timing.renew_deadline, "{timing:?}");
        }
    }
}
