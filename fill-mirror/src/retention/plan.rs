//! The prune's decision, a pure function: every cluster's in-use set, the prune's ledger, the
//! mirror's inventory and the clock in; what is kept and why, what is deleted and why, and what
//! blocks every deletion out. Nothing here reads a registry, so that the unit tests and the
//! month-of-churn bench run the very decision `fill-mirror prune` applies.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::in_use_set::{InUseSet, parse_anchor_tag};

/// One manifest of a mirror repository, as the inventory found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// `sha256:<hex>`.
    pub digest: String,
    /// Every tag that names it (anchors and cosign's `sha256-<hex>.sig` included).
    pub tags: Vec<String>,
    /// The digest it is attached to, when the referrers API listed it as a referrer (a tag of
    /// cosign's schema says so by itself: see [`subject_of_tag`]).
    pub subject: Option<String>,
}

/// One repository of the mirror and its manifests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repository {
    /// Without the host, as the sets name it (`hub/library/nginx`).
    pub name: String,
    pub manifests: Vec<Manifest>,
}

/// What the prune remembers between runs, per manifest: when a set last named it (and which
/// cluster), or when the prune first saw it named by none. A watch drops an entry from its set
/// once it is older than `keep_for`; the ledger keeps its last naming, so the age runs from
/// there and not again from its disappearance. An image copied by hand and not used yet is
/// deleted only `keep_for` after the prune first saw it, not at once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ledger {
    pub images: Vec<Remembered>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Remembered {
    pub repository: String,
    pub digest: String,
    /// The last time a set named it (then `named_by` is that set's cluster), or the first run
    /// that found it named by no set.
    pub since: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub named_by: Option<String>,
}

/// The prune's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Parameters {
    pub now: Timestamp,
    /// How long a digest is kept after a set last named it, or after it was first seen unnamed.
    pub keep_for_seconds: i64,
    /// A set published longer ago than this blocks every deletion.
    pub stale_after_seconds: i64,
    /// The most manifests one run deletes.
    pub max_deletions: usize,
}

/// Why a manifest stays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Kept {
    /// A set named it within `keep_for`: the latest naming, and what named it.
    Named {
        cluster: String,
        last_seen: Timestamp,
        used_by: Vec<String>,
    },
    /// An artifact (signature, attestation, SBOM) attached to a kept digest.
    Attached { subject: String },
    /// It carries the anchor tag of a cluster whose set still names it.
    Anchored { cluster: String },
    /// No set names it, but not for `keep_for` yet.
    UnnamedSince { since: Timestamp },
}

/// Why a manifest goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Gone {
    /// The latest naming of any set, older than `keep_for`.
    NamedLast {
        cluster: String,
        last_seen: Timestamp,
    },
    /// No set has named it since the prune first saw it, longer than `keep_for` ago.
    UnnamedSince { since: Timestamp },
    /// An artifact attached to a digest that goes: it goes with it.
    Attached { subject: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Keep {
    pub repository: String,
    pub digest: String,
    pub why: Kept,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Deletion {
    pub repository: String,
    pub digest: String,
    pub tags: Vec<String>,
    pub why: Gone,
}

/// A set older than `stale_after`: its cluster may use what it no longer says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stale {
    pub cluster: String,
    pub published: Timestamp,
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub kept: Vec<Keep>,
    /// What this run deletes, oldest first, at most `max_deletions`; empty when blocked.
    pub delete: Vec<Deletion>,
    /// Deletable too, but held back by `max_deletions` or by a stale set: a later run's.
    pub held: Vec<Deletion>,
    /// The stale sets; any one blocks every deletion.
    pub blocked: Vec<Stale>,
    /// The ledger to store for the next run.
    #[serde(skip)]
    pub ledger: Ledger,
}

/// The digest a tag of cosign's schema attaches its manifest to: `sha256-<hex>` alone (the
/// referrers API's tag fallback) or with `.sig`, `.att` or `.sbom`.
pub fn subject_of_tag(tag: &str) -> Option<String> {
    let rest = tag.strip_prefix("sha256-")?;
    let hex = [".sig", ".att", ".sbom"]
        .iter()
        .find_map(|suffix| rest.strip_suffix(suffix))
        .unwrap_or(rest);
    let is_hex = hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    is_hex.then(|| format!("sha256:{hex}"))
}

/// The latest naming of one digest by any set.
#[derive(Clone, Copy)]
struct Naming<'s> {
    cluster: &'s str,
    last_seen: Timestamp,
    used_by: &'s [String],
}

/// What a manifest is before attachments are followed.
enum Own {
    Kept(Kept),
    Gone(Gone, Timestamp),
}

/// The plan: see the module's comment and docs/fill-mirror.md's Pruning.
pub fn plan(
    sets: &[InUseSet],
    ledger: &Ledger,
    inventory: &[Repository],
    parameters: &Parameters,
) -> Plan {
    let now = parameters.now;
    let older_than = |time: Timestamp, seconds: i64| now.as_second() - time.as_second() > seconds;
    let blocked: Vec<Stale> = sets
        .iter()
        .filter(|set| older_than(set.published, parameters.stale_after_seconds))
        .map(|set| Stale {
            cluster: set.cluster.clone(),
            published: set.published,
        })
        .collect();
    let mut named: BTreeMap<(&str, &str), Naming> = BTreeMap::new();
    for set in sets {
        for image in &set.images {
            let key = (image.repository.as_str(), image.digest.as_str());
            if named
                .get(&key)
                .is_none_or(|n| n.last_seen < image.last_seen)
            {
                named.insert(
                    key,
                    Naming {
                        cluster: &set.cluster,
                        last_seen: image.last_seen,
                        used_by: &image.used_by,
                    },
                );
            }
        }
    }
    let names = |cluster: &str, repository: &str, digest: &str| {
        sets.iter().any(|set| {
            set.cluster == cluster
                && set
                    .images
                    .iter()
                    .any(|i| i.repository == repository && i.digest == digest)
        })
    };
    let remembered: BTreeMap<(&str, &str), &Remembered> = ledger
        .images
        .iter()
        .map(|r| ((r.repository.as_str(), r.digest.as_str()), r))
        .collect();
    let mut next_ledger = Ledger::default();
    let mut kept = Vec::new();
    let mut deletable: Vec<(Timestamp, u8, Deletion)> = Vec::new();
    for repository in inventory {
        let present: BTreeMap<&str, &Manifest> = repository
            .manifests
            .iter()
            .map(|m| (m.digest.as_str(), m))
            .collect();
        let subject_of = |m: &Manifest| {
            m.subject
                .clone()
                .or_else(|| m.tags.iter().find_map(|t| subject_of_tag(t)))
                .filter(|s| *s != m.digest && present.contains_key(s.as_str()))
        };
        // First every manifest on its own account; an attached one follows its subject after.
        let mut own: BTreeMap<&str, Own> = BTreeMap::new();
        for manifest in &repository.manifests {
            if subject_of(manifest).is_some() {
                continue;
            }
            let key = (repository.name.as_str(), manifest.digest.as_str());
            let anchor = manifest
                .tags
                .iter()
                .filter_map(|t| parse_anchor_tag(t))
                .find(|(cluster, digest)| {
                    *digest == manifest.digest && names(cluster, key.0, key.1)
                });
            // The latest naming: a set's now, or the one the ledger remembers.
            let before = remembered.get(&key).and_then(|r| {
                r.named_by.as_deref().map(|cluster| Naming {
                    cluster,
                    last_seen: r.since,
                    used_by: &[],
                })
            });
            let last = match (named.get(&key), before) {
                (Some(now), Some(before)) if before.last_seen > now.last_seen => Some(before),
                (Some(now), _) => Some(*now),
                (None, before) => before,
            };
            let decision = match (&last, anchor) {
                (Some(n), _) if !older_than(n.last_seen, parameters.keep_for_seconds) => {
                    Own::Kept(Kept::Named {
                        cluster: n.cluster.to_string(),
                        last_seen: n.last_seen,
                        used_by: n.used_by.to_vec(),
                    })
                }
                (_, Some((cluster, _))) => Own::Kept(Kept::Anchored {
                    cluster: cluster.to_string(),
                }),
                (Some(n), None) => Own::Gone(
                    Gone::NamedLast {
                        cluster: n.cluster.to_string(),
                        last_seen: n.last_seen,
                    },
                    n.last_seen,
                ),
                (None, None) => {
                    let since = remembered.get(&key).map_or(now, |r| r.since);
                    if older_than(since, parameters.keep_for_seconds) {
                        Own::Gone(Gone::UnnamedSince { since }, since)
                    } else {
                        Own::Kept(Kept::UnnamedSince { since })
                    }
                }
            };
            next_ledger.images.push(match &last {
                Some(n) => Remembered {
                    repository: key.0.to_string(),
                    digest: key.1.to_string(),
                    since: n.last_seen,
                    named_by: Some(n.cluster.to_string()),
                },
                None => Remembered {
                    repository: key.0.to_string(),
                    digest: key.1.to_string(),
                    since: remembered.get(&key).map_or(now, |r| r.since),
                    named_by: None,
                },
            });
            own.insert(&manifest.digest, decision);
        }
        for manifest in &repository.manifests {
            let (why, when, order) = match subject_of(manifest) {
                Some(subject) => match own.get(subject.as_str()) {
                    Some(Own::Gone(_, when)) => (Err(Gone::Attached { subject }), *when, 0),
                    _ => (Ok(Kept::Attached { subject }), now, 0),
                },
                None => match own.get(manifest.digest.as_str()) {
                    Some(Own::Gone(gone, when)) => (Err(gone.clone()), *when, 1),
                    Some(Own::Kept(why)) => (Ok(why.clone()), now, 1),
                    None => continue,
                },
            };
            match why {
                Ok(why) => kept.push(Keep {
                    repository: repository.name.clone(),
                    digest: manifest.digest.clone(),
                    why,
                }),
                Err(why) => deletable.push((
                    when,
                    order,
                    Deletion {
                        repository: repository.name.clone(),
                        digest: manifest.digest.clone(),
                        tags: manifest.tags.clone(),
                        why,
                    },
                )),
            }
        }
    }
    // Oldest first; a subject's attached artifacts just before it, so that a run cut short by
    // `max_deletions` never leaves a signature whose image is gone.
    deletable.sort_by(|a, b| {
        (a.0, subject_key(&a.2), a.1, &a.2.digest).cmp(&(b.0, subject_key(&b.2), b.1, &b.2.digest))
    });
    let mut held: Vec<Deletion> = deletable.into_iter().map(|(_, _, d)| d).collect();
    let delete = if blocked.is_empty() {
        let cut = held.len().min(parameters.max_deletions);
        held.drain(..cut).collect()
    } else {
        Vec::new()
    };
    Plan {
        kept,
        delete,
        held,
        blocked,
        ledger: next_ledger,
    }
}

/// The repository and digest a deletion's group is ordered by: its subject's for an attached
/// artifact, its own otherwise.
fn subject_key(deletion: &Deletion) -> (&str, &str) {
    let digest = match &deletion.why {
        Gone::Attached { subject } => subject.as_str(),
        _ => deletion.digest.as_str(),
    };
    (deletion.repository.as_str(), digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::in_use_set::InUseImage;

    const DAY: i64 = 86_400;
    const NOW: &str = "2026-12-05T03:00:00Z";

    fn digest(n: u8) -> String {
        format!("sha256:{}", format!("{n:02x}").repeat(32))
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn days_ago(days: i64) -> Timestamp {
        Timestamp::from_second(at(NOW).as_second() - days * DAY).unwrap()
    }

    fn set(cluster: &str, published: Timestamp, images: &[(u8, Timestamp)]) -> InUseSet {
        InUseSet {
            cluster: cluster.to_string(),
            published,
            period_seconds: 600,
            images: images
                .iter()
                .map(|(n, last_seen)| InUseImage {
                    repository: "hub/app".to_string(),
                    digest: digest(*n),
                    last_seen: *last_seen,
                    used_by: vec![format!("Deployment shop/app-{n}")],
                })
                .collect(),
        }
    }

    fn manifest(n: u8, tags: &[&str]) -> Manifest {
        Manifest {
            digest: digest(n),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            subject: None,
        }
    }

    fn inventory(manifests: Vec<Manifest>) -> Vec<Repository> {
        vec![Repository {
            name: "hub/app".to_string(),
            manifests,
        }]
    }

    fn parameters(max_deletions: usize) -> Parameters {
        Parameters {
            now: at(NOW),
            keep_for_seconds: 30 * DAY,
            stale_after_seconds: 3600,
            max_deletions,
        }
    }

    fn deleted(plan: &Plan) -> Vec<String> {
        plan.delete.iter().map(|d| d.digest.clone()).collect()
    }

    #[test]
    fn what_a_fresh_set_names_stays_and_what_it_named_past_the_age_goes_with_its_reason() {
        let sets = [set(
            "one",
            days_ago(0),
            &[(1, days_ago(0)), (5, days_ago(40))],
        )];
        let plan = plan(
            &sets,
            &Ledger::default(),
            &inventory(vec![manifest(1, &["1.0"]), manifest(5, &["0.9"])]),
            &parameters(20),
        );
        assert_eq!(deleted(&plan), [digest(5)]);
        assert_eq!(
            plan.delete[0].why,
            Gone::NamedLast {
                cluster: "one".to_string(),
                last_seen: days_ago(40)
            }
        );
        assert_eq!(plan.kept.len(), 1);
        assert!(matches!(&plan.kept[0].why, Kept::Named { cluster, .. } if cluster == "one"));
        assert_eq!(plan.ledger.images[1].named_by.as_deref(), Some("one"));
    }

    #[test]
    fn the_latest_naming_of_any_cluster_counts() {
        let sets = [
            set("one", days_ago(0), &[(5, days_ago(40))]),
            set("two", days_ago(0), &[(5, days_ago(2))]),
        ];
        let plan = plan(
            &sets,
            &Ledger::default(),
            &inventory(vec![manifest(5, &["0.9"])]),
            &parameters(20),
        );
        assert!(plan.delete.is_empty());
        assert!(matches!(&plan.kept[0].why, Kept::Named { cluster, .. } if cluster == "two"));
    }

    #[test]
    fn a_stale_set_blocks_every_deletion_and_is_named() {
        let published = Timestamp::from_second(at(NOW).as_second() - 3 * 3600).unwrap();
        let sets = [
            set("one", days_ago(0), &[(5, days_ago(40))]),
            set("two", published, &[(6, days_ago(0))]),
        ];
        let plan = plan(
            &sets,
            &Ledger::default(),
            &inventory(vec![manifest(5, &[]), manifest(6, &[])]),
            &parameters(20),
        );
        assert!(plan.delete.is_empty());
        assert_eq!(
            plan.blocked,
            [Stale {
                cluster: "two".to_string(),
                published
            }]
        );
        assert_eq!(plan.held.len(), 1, "what it would delete is still listed");
    }

    #[test]
    fn an_image_never_named_waits_for_the_age_from_when_it_was_first_seen() {
        let inventory = inventory(vec![manifest(7, &["hand-copied"])]);
        let first = plan(&[], &Ledger::default(), &inventory, &parameters(20));
        assert!(first.delete.is_empty());
        assert_eq!(first.ledger.images[0].since, at(NOW));
        let mut old = first.ledger.clone();
        old.images[0].since = days_ago(29);
        assert!(
            plan(&[], &old, &inventory, &parameters(20))
                .delete
                .is_empty()
        );
        old.images[0].since = days_ago(31);
        let later = plan(&[], &old, &inventory, &parameters(20));
        assert_eq!(deleted(&later), [digest(7)]);
        assert_eq!(
            later.delete[0].why,
            Gone::UnnamedSince {
                since: days_ago(31)
            }
        );
        assert_eq!(
            later.ledger.images[0].since,
            days_ago(31),
            "kept until it is gone"
        );
    }

    #[test]
    fn attached_artifacts_follow_their_subject_either_way() {
        let sig = |n: u8| format!("sha256-{}.sig", format!("{n:02x}").repeat(32));
        let mut referrer = manifest(9, &[]);
        referrer.subject = Some(digest(5));
        let sets = [set(
            "one",
            days_ago(0),
            &[(1, days_ago(0)), (5, days_ago(40))],
        )];
        let plan = plan(
            &sets,
            &Ledger::default(),
            &inventory(vec![
                manifest(1, &["1.0"]),
                manifest(2, &[&sig(1)]),
                manifest(5, &["0.9"]),
                manifest(6, &[&sig(5)]),
                referrer,
            ]),
            &parameters(20),
        );
        assert_eq!(deleted(&plan), [digest(6), digest(9), digest(5)]);
        assert!(
            plan.kept
                .iter()
                .any(|k| k.digest == digest(2) && k.why == Kept::Attached { subject: digest(1) })
        );
    }

    #[test]
    fn an_anchor_of_a_cluster_whose_set_still_names_it_keeps_it() {
        let hex = format!("{:02x}", 5).repeat(32);
        let sets = [set("one", days_ago(0), &[(5, days_ago(40))])];
        let anchored = inventory(vec![manifest(5, &[&format!("inuse-one-{hex}")])]);
        let plan_of =
            |sets: &[InUseSet]| plan(sets, &Ledger::default(), &anchored, &parameters(20));
        assert_eq!(
            plan_of(&sets).kept[0].why,
            Kept::Anchored {
                cluster: "one".to_string()
            }
        );
        // The anchor of a cluster whose set no longer names it protects nothing.
        let other = [set("two", days_ago(0), &[(5, days_ago(40))])];
        assert_eq!(deleted(&plan_of(&other)), [digest(5)]);
    }

    #[test]
    fn a_run_deletes_at_most_max_deletions_oldest_first() {
        let sets = [set(
            "one",
            days_ago(0),
            &[(1, days_ago(50)), (2, days_ago(60)), (3, days_ago(40))],
        )];
        let plan = plan(
            &sets,
            &Ledger::default(),
            &inventory(vec![manifest(1, &[]), manifest(2, &[]), manifest(3, &[])]),
            &parameters(2),
        );
        assert_eq!(deleted(&plan), [digest(2), digest(1)]);
        assert_eq!(plan.held.len(), 1);
        assert_eq!(plan.held[0].digest, digest(3));
    }

    #[test]
    fn an_image_a_set_stopped_naming_ages_from_its_last_naming_the_ledger_remembers() {
        let inventory = inventory(vec![manifest(5, &["0.9"])]);
        let named = [set("one", days_ago(0), &[(5, days_ago(25))])];
        let first = plan(&named, &Ledger::default(), &inventory, &parameters(20));
        assert!(first.delete.is_empty());
        assert_eq!(first.ledger.images[0].since, days_ago(25));
        // Dropped from the set by its watch: its last naming, 31 days ago by now, still counts.
        let mut ledger = first.ledger.clone();
        ledger.images[0].since = days_ago(31);
        let later = plan(&[], &ledger, &inventory, &parameters(20));
        assert_eq!(deleted(&later), [digest(5)]);
        assert_eq!(
            later.delete[0].why,
            Gone::NamedLast {
                cluster: "one".to_string(),
                last_seen: days_ago(31)
            }
        );
    }

    #[test]
    fn cosign_tags_name_their_subject_and_nothing_else_does() {
        let hex = "ab".repeat(32);
        for suffix in ["", ".sig", ".att", ".sbom"] {
            assert_eq!(
                subject_of_tag(&format!("sha256-{hex}{suffix}")),
                Some(format!("sha256:{hex}"))
            );
        }
        for tag in [
            "1.0",
            "sha256-abc.sig",
            &format!("sha256-{hex}.txt"),
            &format!("inuse-one-{hex}"),
        ] {
            assert_eq!(subject_of_tag(tag), None, "{tag}");
        }
    }
}
