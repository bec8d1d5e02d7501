//! One registry's set of this period: what is in use now, at `now`, and what the set published
//! before names and was seen within the retention's age, at its own `lastSeen`. Pure, so the
//! age's edge is tested without a registry or a clock.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::in_use_set::{InUseImage, InUseSet};

/// One digest in use now: its repository (without the host), digest, and what names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seen {
    pub repository: String,
    pub digest: String,
    pub used_by: Vec<String>,
}

/// The set to publish: `seen` at `now`, and each entry of `previous` not seen now whose
/// `lastSeen` is within `keep_for` of `now`. Sorted by repository, then digest.
pub fn merged(
    cluster: &str,
    seen: &[Seen],
    previous: Option<&InUseSet>,
    now: Timestamp,
    keep_for: Duration,
    period: Duration,
) -> InUseSet {
    let mut images: BTreeMap<(String, String), InUseImage> = BTreeMap::new();
    let age = i64::try_from(keep_for.as_secs()).unwrap_or(i64::MAX);
    for image in previous.iter().flat_map(|set| &set.images) {
        let old = now.as_second().saturating_sub(image.last_seen.as_second());
        if old <= age {
            images.insert(
                (image.repository.clone(), image.digest.clone()),
                image.clone(),
            );
        }
    }
    for image in seen {
        let mut used_by = image.used_by.clone();
        used_by.sort();
        used_by.dedup();
        images.insert(
            (image.repository.clone(), image.digest.clone()),
            InUseImage {
                repository: image.repository.clone(),
                digest: image.digest.clone(),
                last_seen: now,
                used_by,
            },
        );
    }
    InUseSet {
        cluster: cluster.to_string(),
        published: now,
        period_seconds: period.as_secs(),
        images: images.into_values().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn image(digest: &str, last_seen: &str) -> InUseImage {
        InUseImage {
            repository: "hub/app".into(),
            digest: digest.into(),
            last_seen: at(last_seen),
            used_by: vec!["Deployment shop/old".into()],
        }
    }

    #[test]
    fn an_entry_no_longer_named_stays_until_it_is_older_than_the_age() {
        let previous = InUseSet {
            cluster: "prod".into(),
            published: at("2026-12-01T00:00:00Z"),
            period_seconds: 600,
            images: vec![
                image("sha256:kept", "2026-11-01T00:00:00Z"),
                image("sha256:aged", "2026-10-31T23:59:59Z"),
                image("sha256:renewed", "2026-10-01T00:00:00Z"),
            ],
        };
        let seen = [Seen {
            repository: "hub/app".into(),
            digest: "sha256:renewed".into(),
            used_by: vec![
                "Pod shop/b".into(),
                "Pod shop/a".into(),
                "Pod shop/a".into(),
            ],
        }];
        let now = at("2026-12-01T00:00:00Z");
        let set = merged(
            "prod",
            &seen,
            Some(&previous),
            now,
            Duration::from_secs(30 * DAY),
            Duration::from_secs(600),
        );
        let digests: Vec<(&str, String)> = set
            .images
            .iter()
            .map(|i| (i.digest.as_str(), i.last_seen.to_string()))
            .collect();
        assert_eq!(
            digests,
            [
                ("sha256:kept", "2026-11-01T00:00:00Z".to_string()),
                ("sha256:renewed", "2026-12-01T00:00:00Z".to_string()),
            ]
        );
        assert_eq!(set.images[1].used_by, ["Pod shop/a", "Pod shop/b"]);
        assert_eq!((set.published, set.period_seconds), (now, 600));
    }
}
