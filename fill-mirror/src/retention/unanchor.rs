//! The plan of `fill-mirror prune --unanchor-only`, a pure function over the prune's own plan:
//! where the registry's rules delete (ECR, Artifact Registry, Harbor), what the prune would
//! delete is instead handed back to those rules by removing its anchor tags, and its manifest is
//! left where it is. The same inputs, ages, stale-set block and bound per run as the prune;
//! a digest that carries no anchor is the registry's business already and is not listed.

use serde::Serialize;

use crate::in_use_set::{InUseSet, parse_anchor_tag};
use crate::retention::plan::{Deletion, Gone, Keep, Ledger, Parameters, Repository, Stale, plan};

/// One digest whose anchors go, and why no cluster uses it any more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unanchoring {
    pub repository: String,
    pub digest: String,
    /// Its anchor tags (`inuse-<cluster>-<hex>` naming this very digest), every cluster's.
    pub anchors: Vec<String>,
    /// The anchors are every tag the image has: on ECR their removal deletes the image ("When
    /// you remove the last tag from an image, the image is deleted"), elsewhere it leaves an
    /// untagged manifest to the registry's rules.
    pub last_tags: bool,
    pub why: Gone,
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnanchorPlan {
    pub kept: Vec<Keep>,
    /// The digests this run unanchors, oldest first, at most `max_deletions`; empty when
    /// blocked.
    pub unanchor: Vec<Unanchoring>,
    /// Unanchorable too, but held back by `max_deletions` or by a stale set.
    pub held: Vec<Unanchoring>,
    /// The stale sets; any one blocks every removal.
    pub blocked: Vec<Stale>,
    /// The ledger to store for the next run (the prune's, unchanged).
    #[serde(skip)]
    pub ledger: Ledger,
}

/// The plan: the prune's decision taken whole (no bound), its deletions that carry anchors
/// kept in its order (oldest first, attached artifacts just before their subject), then cut
/// at `max_deletions` unless a stale set blocks.
pub fn unanchor_plan(
    sets: &[InUseSet],
    ledger: &Ledger,
    inventory: &[Repository],
    parameters: &Parameters,
) -> UnanchorPlan {
    let unbounded = Parameters {
        max_deletions: usize::MAX,
        ..*parameters
    };
    let whole = plan(sets, ledger, inventory, &unbounded);
    let mut held: Vec<Unanchoring> = (whole.delete.into_iter())
        .chain(whole.held)
        .filter_map(anchored)
        .collect();
    let unanchor = if whole.blocked.is_empty() {
        let cut = held.len().min(parameters.max_deletions);
        held.drain(..cut).collect()
    } else {
        Vec::new()
    };
    UnanchorPlan {
        kept: whole.kept,
        unanchor,
        held,
        blocked: whole.blocked,
        ledger: whole.ledger,
    }
}

/// The deletion as a removal of its anchors; None when it carries none. Only a tag that is an
/// anchor of this digest counts: another `inuse-` tag was put by someone else, for a reason.
fn anchored(deletion: Deletion) -> Option<Unanchoring> {
    let anchors: Vec<String> = (deletion.tags.iter())
        .filter(|tag| parse_anchor_tag(tag).is_some_and(|(_, digest)| digest == deletion.digest))
        .cloned()
        .collect();
    (!anchors.is_empty()).then_some(Unanchoring {
        last_tags: anchors.len() == deletion.tags.len(),
        repository: deletion.repository,
        digest: deletion.digest,
        anchors,
        why: deletion.why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::in_use_set::InUseImage;
    use crate::retention::plan::{Kept, Manifest, Remembered};
    use k8s_openapi::jiff::Timestamp;

    const DAY: i64 = 86_400;
    const NOW: i64 = 1_796_000_000;

    fn digest(n: u8) -> String {
        format!("sha256:{}", format!("{n:02x}").repeat(32))
    }

    fn anchor(cluster: &str, n: u8) -> String {
        format!("inuse-{cluster}-{}", format!("{n:02x}").repeat(32))
    }

    fn days_ago(days: i64) -> Timestamp {
        Timestamp::from_second(NOW - days * DAY).unwrap()
    }

    fn set(cluster: &str, published: Timestamp, images: &[(u8, i64)]) -> InUseSet {
        InUseSet {
            cluster: cluster.to_string(),
            published,
            period_seconds: 600,
            images: (images.iter())
                .map(|(n, days)| InUseImage {
                    repository: "hub/app".to_string(),
                    digest: digest(*n),
                    last_seen: days_ago(*days),
                    used_by: vec![],
                })
                .collect(),
        }
    }

    /// The ledger of a prune that last saw cluster "one" name each of `images` that many days
    /// ago: "one"'s watch has dropped them from its set since.
    fn ledger(images: &[(u8, i64)]) -> Ledger {
        Ledger {
            images: (images.iter())
                .map(|(n, days)| Remembered {
                    repository: "hub/app".to_string(),
                    digest: digest(*n),
                    since: days_ago(*days),
                    named_by: Some("one".to_string()),
                })
                .collect(),
        }
    }

    fn inventory(manifests: &[(u8, Vec<String>)]) -> Vec<Repository> {
        vec![Repository {
            name: "hub/app".to_string(),
            manifests: (manifests.iter())
                .map(|(n, tags)| Manifest {
                    digest: digest(*n),
                    tags: tags.clone(),
                    subject: None,
                })
                .collect(),
        }]
    }

    fn parameters(max: usize) -> Parameters {
        Parameters {
            now: days_ago(0),
            keep_for_seconds: 30 * DAY,
            stale_after_seconds: 3600,
            max_deletions: max,
        }
    }

    #[test]
    fn the_anchors_of_what_goes_go_and_nothing_else_of_it_or_of_what_stays() {
        // 5 and 6 were dropped from "one"'s set; 8 is still in it, named 40 days ago: "one"
        // still anchors it (its watch keeps what it used for its own age), so its anchor stays.
        let sets = [set("one", days_ago(0), &[(1, 0), (8, 40)])];
        let plan = unanchor_plan(
            &sets,
            &ledger(&[(5, 40), (6, 50)]),
            &inventory(&[
                (1, vec!["1.0".into(), anchor("one", 1)]),
                (
                    5,
                    vec![
                        "0.9".into(),
                        anchor("one", 5),
                        anchor("two", 5),
                        "inuse-mine".into(),
                    ],
                ),
                (6, vec!["0.8".into()]),
                (8, vec![anchor("one", 8)]),
            ]),
            &parameters(20),
        );
        assert_eq!(plan.unanchor.len(), 1, "{plan:?}");
        assert_eq!(plan.unanchor[0].digest, digest(5));
        assert_eq!(
            plan.unanchor[0].anchors,
            [anchor("one", 5), anchor("two", 5)]
        );
        assert!(matches!(plan.unanchor[0].why, Gone::NamedLast { .. }));
        assert!(!plan.unanchor[0].last_tags, "0.9 and inuse-mine stay on it");
        assert!(
            plan.held.is_empty(),
            "6 has no anchor: the registry's already"
        );
        assert!(matches!(&plan.kept[0].why, Kept::Named { cluster, .. } if cluster == "one"));
        assert_eq!(
            plan.kept[1].why,
            Kept::Anchored {
                cluster: "one".into()
            }
        );
    }

    #[test]
    fn a_stale_set_blocks_every_removal_and_the_bound_counts_digests_oldest_first() {
        let tagged = inventory(&[
            (5, vec![anchor("one", 5)]),
            (6, vec![anchor("one", 6)]),
            (7, vec![anchor("one", 7)]),
        ]);
        let fresh = [set("one", days_ago(0), &[])];
        let dropped = ledger(&[(5, 40), (6, 60), (7, 50)]);
        let bounded = unanchor_plan(&fresh, &dropped, &tagged, &parameters(2));
        let digests: Vec<&str> = bounded.unanchor.iter().map(|u| u.digest.as_str()).collect();
        assert_eq!(digests, [digest(6), digest(7)]);
        assert!(
            bounded.unanchor.iter().all(|u| u.last_tags),
            "each image's one tag is its anchor: on ECR it goes with it, and counts"
        );
        assert_eq!(bounded.held.len(), 1);
        let stale = Timestamp::from_second(NOW - 2 * 3600).unwrap();
        let blocked = [fresh[0].clone(), set("two", stale, &[])];
        let plan = unanchor_plan(&blocked, &dropped, &tagged, &parameters(2));
        assert!(plan.unanchor.is_empty());
        assert_eq!(plan.held.len(), 3);
        assert_eq!(plan.blocked[0].cluster, "two");
    }
}
