//! The mirror after months of churn, under the prune's own decision (`src/retention/plan.rs`,
//! compiled in here as the binary compiles it): one cluster whose 10 Deployments each roll out a
//! new image version every day (a Deployment keeps its last 10 ReplicaSets, all of which a
//! rollback can return to, so all of them are in use), 3 images that never change, and every
//! image signed (a `sha256-<hex>.sig` tag). Each day the fill copies the new versions, the
//! watch publishes the set (an entry it no longer sees stays until `--keep-for` after it was last
//! seen, as the watch keeps it), and the prune runs once and its deletions are applied. Printed:
//! the mirror's manifests per day without pruning (everything ever copied) and with the prune
//! at `--keep-for` 30 days and 7 days. Figures only, no assertion on them: the unit tests and
//! tests/prune.rs assert the decision.

// cargo test builds a bench with cfg(test): the files' own unit tests come along, unused here.
#[allow(dead_code, unused_imports)]
#[path = "../src/in_use_set.rs"]
mod in_use_set;
#[allow(dead_code, unused_imports)]
#[path = "../src/retention/plan.rs"]
mod plan;

use std::collections::BTreeMap;
use std::time::Instant;

use in_use_set::{InUseImage, InUseSet};
use k8s_openapi::jiff::Timestamp;
use plan::{Ledger, Manifest, Parameters, Repository};

const DAY: i64 = 86_400;
const DAYS: i64 = 90;
const ROLLING: usize = 10;
const STABLE: usize = 3;
/// A Deployment's `revisionHistoryLimit` (Kubernetes' default).
const HISTORY: usize = 10;
const MAX_DELETIONS: usize = 100;

/// A digest of its own for (app, version).
fn digest(app: usize, version: i64) -> String {
    format!("sha256:{:032x}{:032x}", app + 1, version + 1)
}

fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replacen(':', "-", 1))
}

/// One mirror under one retention: the repositories' manifests, the cluster's set as the watch
/// keeps it, and the prune's ledger.
struct Mirror {
    keep_for_days: Option<i64>,
    /// Repository -> digest -> tags.
    manifests: BTreeMap<String, BTreeMap<String, Vec<String>>>,
    /// (repository, digest) -> last seen in use.
    named: BTreeMap<(String, String), Timestamp>,
    ledger: Ledger,
    deleted: usize,
    plan_time: std::time::Duration,
}

impl Mirror {
    fn new(keep_for_days: Option<i64>) -> Mirror {
        Mirror {
            keep_for_days,
            manifests: BTreeMap::new(),
            named: BTreeMap::new(),
            ledger: Ledger::default(),
            deleted: 0,
            plan_time: std::time::Duration::ZERO,
        }
    }

    fn size(&self) -> usize {
        self.manifests.values().map(BTreeMap::len).sum()
    }

    /// The fill's copy of an image and its signature.
    fn copy(&mut self, repository: &str, digest: &str, tag: String) {
        let repo = self.manifests.entry(repository.to_string()).or_default();
        repo.entry(digest.to_string()).or_default().push(tag);
        // The signature's manifest: a digest of its own (an image's digests start with 0).
        let sig = format!("sha256:f{}", &digest[8..]);
        repo.insert(sig, vec![signature_tag(digest)]);
    }

    /// One day: the images in use named now, the set published, the prune applied.
    fn day(&mut self, now: Timestamp, in_use: &[(String, String)]) {
        for key in in_use {
            self.named.insert(key.clone(), now);
        }
        let Some(keep_days) = self.keep_for_days else {
            return;
        };
        let keep_for = keep_days * DAY;
        // The watch drops an entry once it was last seen longer than --keep-for ago.
        self.named
            .retain(|_, seen| now.as_second() - seen.as_second() <= keep_for);
        let set = InUseSet {
            cluster: "one".to_string(),
            published: now,
            period_seconds: 600,
            images: self
                .named
                .iter()
                .map(|((repository, digest), seen)| InUseImage {
                    repository: repository.clone(),
                    digest: digest.clone(),
                    last_seen: *seen,
                    used_by: Vec::new(),
                })
                .collect(),
        };
        let inventory: Vec<Repository> = self
            .manifests
            .iter()
            .map(|(name, digests)| Repository {
                name: name.clone(),
                manifests: digests
                    .iter()
                    .map(|(digest, tags)| Manifest {
                        digest: digest.clone(),
                        tags: tags.clone(),
                        subject: None,
                    })
                    .collect(),
            })
            .collect();
        let parameters = Parameters {
            now,
            keep_for_seconds: keep_for,
            stale_after_seconds: 3600,
            max_deletions: MAX_DELETIONS,
        };
        let started = Instant::now();
        let decided = plan::plan(&[set], &self.ledger, &inventory, &parameters);
        self.plan_time = started.elapsed();
        for deletion in &decided.delete {
            if let Some(repo) = self.manifests.get_mut(&deletion.repository) {
                repo.remove(&deletion.digest);
            }
        }
        self.deleted += decided.delete.len();
        self.ledger = decided.ledger;
    }
}

fn main() {
    let start = Timestamp::from_second(1_780_000_000).expect("a time");
    let mut mirrors = [
        Mirror::new(None),
        Mirror::new(Some(30)),
        Mirror::new(Some(7)),
    ];
    println!(
        "month-of-churn: {ROLLING} Deployments rolling a new version daily (revisionHistoryLimit \
         {HISTORY}), {STABLE} stable images, every image signed; one prune a day, \
         --max-deletions {MAX_DELETIONS}"
    );
    println!(
        "{:>4} {:>14} {:>16} {:>19} {:>18}",
        "day", "in use (+sig)", "never pruned", "pruned, keep 30d", "pruned, keep 7d"
    );
    for day in 0..DAYS {
        let now = Timestamp::from_second(start.as_second() + day * DAY).expect("a time");
        let mut in_use = Vec::new();
        for app in 0..ROLLING {
            let repository = format!("hub/app-{app}");
            let fresh = digest(app, day);
            for mirror in mirrors.iter_mut() {
                mirror.copy(&repository, &fresh, format!("v{day}"));
            }
            // The running version and the ReplicaSets a rollback can return to.
            for back in 0..=HISTORY as i64 {
                if day - back >= 0 {
                    in_use.push((repository.clone(), digest(app, day - back)));
                }
            }
        }
        for app in 0..STABLE {
            let repository = format!("hub/stable-{app}");
            let stable = digest(100 + app, 0);
            if day == 0 {
                for mirror in mirrors.iter_mut() {
                    mirror.copy(&repository, &stable, "1".to_string());
                }
            }
            in_use.push((repository, stable));
        }
        for mirror in mirrors.iter_mut() {
            mirror.day(now, &in_use);
        }
        if day % 5 == 4 || day == 0 || day == DAYS - 1 {
            println!(
                "{:>4} {:>14} {:>16} {:>19} {:>18}",
                day + 1,
                in_use.len() * 2,
                mirrors[0].size(),
                mirrors[1].size(),
                mirrors[2].size()
            );
        }
    }
    let bound = |keep: i64| (ROLLING * (HISTORY + 1 + keep as usize) + STABLE) * 2;
    println!(
        "bound (in use plus the age's window, signatures counted): keep 30d {}, keep 7d {}; \
         deleted over {DAYS} days: {} and {}; one plan of the last day: {:?} and {:?}",
        bound(30),
        bound(7),
        mirrors[1].deleted,
        mirrors[2].deleted,
        mirrors[1].plan_time,
        mirrors[2].plan_time
    );
}
