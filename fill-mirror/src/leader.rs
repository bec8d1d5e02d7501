//! Leader election on a `coordination.k8s.io` Lease, so that of two replicas one copies and
//! marks while the other watches and is ready to take over. kube-runtime has none; this follows
//! client-go's leaderelection: the holder renews the Lease every third of its duration; another
//! replica takes it only once the holder has not renewed it for the whole duration; every write
//! is a replace at the resourceVersion read, so two replicas never both win.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::metrics::Metrics;

pub struct Elector {
    pub api: Api<Lease>,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
    pub leading: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
}

/// What the holder of a Lease read says about taking it now.
fn may_take(spec: &LeaseSpec, identity: &str, now: Timestamp) -> bool {
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() || holder == identity {
        return true;
    }
    let Some(MicroTime(renewed)) = spec.renew_time.as_ref() else {
        return true;
    };
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15).max(1));
    now.as_second() - renewed.as_second() >= duration
}

impl Elector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: String,
        duration: Duration,
        metrics: Arc<Metrics>,
    ) -> Elector {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity,
            duration,
            leading: Arc::new(AtomicBool::new(false)),
            metrics,
        }
    }

    /// Who holds the Lease now, if anyone does.
    pub async fn holder(&self) -> Option<String> {
        let lease = self.api.get_opt(&self.name).await.ok()??;
        lease
            .spec?
            .holder_identity
            .filter(|holder| !holder.is_empty())
    }

    /// Gives the Lease up when this replica holds it, so that a watch replica takes it at its
    /// next round instead of after the whole duration.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        if let Err(error) = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            tracing::warn!(lease = %self.name, %error, "could not give the Lease up; it expires");
        }
    }

    /// One round: takes or renews the Lease when it may; says whether this replica leads.
    pub async fn round(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let seconds = i32::try_from(self.duration.as_secs()).unwrap_or(15);
        let current = self.api.get_opt(&self.name).await?;
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(error) => Err(error),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if !may_take(&spec, &self.identity, now) {
            return Ok(false);
        }
        let taking = spec.holder_identity.as_deref() != Some(self.identity.as_str());
        let mut next = spec;
        if taking {
            next.acquire_time = Some(MicroTime(now));
            next.lease_transitions = Some(next.lease_transitions.unwrap_or(0) + 1);
            next.holder_identity = Some(self.identity.clone());
        }
        next.renew_time = Some(MicroTime(now));
        next.lease_duration_seconds = Some(seconds);
        lease.spec = Some(next);
        // A replace at the resourceVersion read: of two replicas that read the same Lease, one
        // write wins and the other gets 409.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                if taking {
                    tracing::info!(lease = %self.name, identity = %self.identity, "took the Lease: this replica copies and marks");
                }
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Runs for ever: renews every third of the duration; on an error, leads no more once the
    /// Lease it last renewed would have expired.
    pub async fn run(self) {
        let mut renewed_at: Option<tokio::time::Instant> = None;
        loop {
            let leading = match self.round().await {
                Ok(leading) => {
                    if leading {
                        renewed_at = Some(tokio::time::Instant::now());
                    }
                    leading
                }
                Err(error) => {
                    tracing::warn!(lease = %self.name, %error, "cannot read or renew the Lease");
                    renewed_at.is_some_and(|at| at.elapsed() < self.duration * 2 / 3)
                }
            };
            let was = self.leading.swap(leading, Ordering::SeqCst);
            if was && !leading {
                tracing::warn!(lease = %self.name, "lost the Lease: this replica stops copying and marking");
            }
            self.metrics.leader.set(i64::from(leading));
            tokio::time::sleep(self.duration / 3).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, renewed_seconds_ago: Option<i64>, now: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            renew_time: renewed_seconds_ago
                .map(|ago| MicroTime(Timestamp::from_second(now.as_second() - ago).unwrap_or(now))),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_lease_is_taken_only_when_free_own_or_expired() {
        let now = Timestamp::now();
        assert!(may_take(&spec(None, None, now), "a", now));
        assert!(may_take(&spec(Some("a"), Some(1), now), "a", now));
        assert!(!may_take(&spec(Some("b"), Some(1), now), "a", now));
        assert!(!may_take(&spec(Some("b"), Some(14), now), "a", now));
        assert!(may_take(&spec(Some("b"), Some(15), now), "a", now));
    }
}
