//! `prune --unanchor-only`: the CronJob's mode where the registry's own rules delete (ECR
//! lifecycle, Artifact Registry cleanup, Harbor retention) and an anchor tag keeps an image from
//! them. It reads what the prune reads, applies the same decision (`retention::unanchor`),
//! stores the same ledger, and with `--delete` removes the anchor tags of what no fresh set has
//! named for the age, never a manifest by digest: the registry's rules then expire it. On an
//! `--ecr-registry` the inventory and removals are ECR's API (credentials/ecr_images.rs), and
//! an image whose anchors are its last tags goes with them. Exit codes as the prune's: 0 ran,
//! 1 a removal failed, 2 could not run, 3 a stale set blocked every removal.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::cli::Prune;
use crate::credentials::{Access, ecr_host};
use crate::mirror_api::Mirror;
use crate::mode_prune::{BLOCKED, by_host, say_blocked, say_gone, say_kept};
use crate::referrers::Referrers;
use crate::registry_http::RegistryHttp;
use crate::retention::plan::Parameters;
use crate::retention::unanchor::{UnanchorPlan, Unanchoring, unanchor_plan};
use crate::retention::{inventory, say_duration, sets};

/// One registry's run: the plan, and what the removals did.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Run {
    registry: String,
    /// An `--ecr-registry`: removing an image's last tags deletes the image.
    ecr: bool,
    #[serde(flatten)]
    plan: UnanchorPlan,
    /// The anchor tags removed, as `repository:tag`.
    removed: Vec<String>,
    failed: Vec<Failure>,
}

#[derive(Serialize)]
struct Failure {
    repository: String,
    digest: String,
    tag: String,
    error: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    mode: &'static str,
    dry_run: bool,
    now: Timestamp,
    keep_for_seconds: i64,
    stale_after_seconds: i64,
    max_deletions: usize,
    registries: Vec<Run>,
}

pub async fn unanchor(args: Prune) -> anyhow::Result<u8> {
    let hosts = by_host(&args.mirror)?;
    for host in hosts.keys() {
        let named = args.access.ecr_registries.iter().any(|ecr| ecr == host);
        anyhow::ensure!(
            named || ecr_host(host).is_none(),
            "--mirror {host}: an ECR registry not named by --ecr-registry: ECR lists no catalog \
             and deletes no tag through the registry, so --unanchor-only reads and removes \
             through ECR's API, with --ecr-registry {host} (docs/retention.md, EKS with ECR)"
        );
    }
    let access = Arc::new(Access::new(&args.access, args.insecure).await?);
    let http = RegistryHttp::new(access.clone())?;
    let referrers = Referrers::new(http.clone());
    let mirror = Mirror::new(http);
    let parameters = Parameters {
        now: Timestamp::now(),
        keep_for_seconds: args.keep_for,
        stale_after_seconds: args.stale_after,
        max_deletions: args.max_deletions,
    };
    let mut report = Report {
        mode: "unanchor",
        dry_run: !args.delete,
        now: parameters.now,
        keep_for_seconds: args.keep_for,
        stale_after_seconds: args.stale_after,
        max_deletions: args.max_deletions,
        registries: Vec::new(),
    };
    for (host, paths) in hosts {
        let in_use = &args.in_use_repository;
        let repository = &format!("{host}/{in_use}");
        let ecr = access.is_ecr_registry(&host);
        let read = async {
            let sets = sets::read_sets(&mirror, repository).await?;
            let ledger = sets::read_ledger(&mirror, repository).await?;
            let inventory = if ecr {
                access.ecr_inventory(&host, &paths, in_use).await?
            } else {
                inventory::inventory(&mirror, &referrers, &host, &paths, in_use).await?
            };
            Ok::<_, String>(unanchor_plan(&sets, &ledger, &inventory, &parameters))
        };
        let plan = read
            .await
            .map_err(|error| anyhow::anyhow!("{host}: {error}"))?;
        // Stored before any removal, as the prune stores it: a dry run's ages are the ones a
        // run with --delete acts on.
        sets::write_ledger(&mirror, repository, &plan.ledger)
            .await
            .map_err(|error| anyhow::anyhow!("{host}: storing the prune's ledger: {error}"))?;
        let mut run = Run {
            registry: host.clone(),
            ecr,
            plan,
            removed: Vec::new(),
            failed: Vec::new(),
        };
        if args.delete {
            for unanchoring in &run.plan.unanchor {
                let at = format!("{host}/{}", unanchoring.repository);
                let outcomes = if ecr {
                    (access.ecr_untag(&host, &unanchoring.repository, &unanchoring.anchors)).await
                } else {
                    let mut outcomes = Vec::new();
                    for tag in &unanchoring.anchors {
                        outcomes.push(mirror.delete_tag(&at, tag).await);
                    }
                    outcomes
                };
                for (tag, outcome) in unanchoring.anchors.iter().zip(outcomes) {
                    match outcome {
                        Ok(()) => run
                            .removed
                            .push(format!("{}:{tag}", unanchoring.repository)),
                        Err(error) => run.failed.push(Failure {
                            repository: unanchoring.repository.clone(),
                            digest: unanchoring.digest.clone(),
                            tag: tag.clone(),
                            error,
                        }),
                    }
                }
            }
        }
        report.registries.push(run);
    }
    if args.output == "json" {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", lines(&report));
    }
    let failed = report.registries.iter().any(|run| !run.failed.is_empty());
    let blocked = (report.registries.iter()).any(|run| !run.plan.blocked.is_empty());
    Ok(match (failed, blocked) {
        (true, _) => 1,
        (false, true) => BLOCKED,
        (false, false) => 0,
    })
}

/// The report as lines a person reads: per registry, what blocks, whose anchors go (each
/// anchor, its image and the reason), what waits, what stays, then a summary line.
fn lines(report: &Report) -> String {
    let now = report.now;
    let keep_for = report.keep_for_seconds;
    let mut out = String::new();
    for run in &report.registries {
        let host = &run.registry;
        let mode = match (report.dry_run, run.ecr) {
            (true, _) => "dry run: no anchor is removed (--delete acts)",
            (false, false) => "--delete: anchors only, never a manifest",
            (false, true) => {
                "--delete: anchors only, by ECR's BatchDeleteImage; an image goes with its last tags"
            }
        };
        out.push_str(&format!("unanchor of {host} ({mode})\n"));
        for stale in &run.plan.blocked {
            out.push_str(&say_blocked(stale, now, report.stale_after_seconds));
        }
        let image = |u: &Unanchoring| format!("{host}/{}@{}", u.repository, u.digest);
        for unanchoring in &run.plan.unanchor {
            let why = say_gone(&unanchoring.why, now, keep_for);
            // ECR deletes an image with its last tag: a deletion, and counted as one.
            let rest = if run.ecr && unanchoring.last_tags {
                format!(
                    "its last tags: the image goes with them (one of --max-deletions {})",
                    report.max_deletions
                )
            } else {
                "the registry's own rules decide the rest".to_string()
            };
            for tag in &unanchoring.anchors {
                let failed = (run.failed.iter())
                    .find(|f| f.tag == *tag && f.repository == unanchoring.repository);
                let verb = match (report.dry_run, failed) {
                    (true, _) => "would remove".to_string(),
                    (false, Some(failure)) => {
                        format!("FAILED to remove ({})", failure.error)
                    }
                    (false, None) => "removed".to_string(),
                };
                out.push_str(&format!(
                    "{verb} the anchor {tag} of {}: {why}; {rest}\n",
                    image(unanchoring)
                ));
            }
        }
        for unanchoring in &run.plan.held {
            let why = if run.plan.blocked.is_empty() {
                format!("beyond --max-deletions {} this run", report.max_deletions)
            } else {
                "blocked by a stale set".to_string()
            };
            out.push_str(&format!(
                "held ({why}) the anchors {} of {}: {}\n",
                unanchoring.anchors.join(", "),
                image(unanchoring),
                say_gone(&unanchoring.why, now, keep_for)
            ));
        }
        for keep in &run.plan.kept {
            out.push_str(&format!(
                "kept {host}/{}@{}: {}\n",
                keep.repository,
                keep.digest,
                say_kept(&keep.why, now, keep_for)
            ));
        }
        let anchors: usize = run.plan.unanchor.iter().map(|u| u.anchors.len()).sum();
        let removed = if report.dry_run {
            anchors
        } else {
            run.removed.len()
        };
        let digests = run.plan.unanchor.len();
        let images = (run.plan.unanchor.iter()).filter(|u| u.last_tags).count();
        let images = if run.ecr {
            format!(" ({images} of them images that go with their last tags)")
        } else {
            String::new()
        };
        out.push_str(&format!(
            "summary {host}: {} kept, {removed} anchor{} of {digests} digest{}{images} {}, {} held, {} failed, {} stale sets (--keep-for {})\n",
            run.plan.kept.len(),
            if removed == 1 { "" } else { "s" },
            if digests == 1 { "" } else { "s" },
            if report.dry_run {
                "would be removed"
            } else {
                "removed"
            },
            run.plan.held.len(),
            run.failed.len(),
            run.plan.blocked.len(),
            say_duration(keep_for)
        ));
    }
    out
}
