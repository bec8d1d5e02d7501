//! `prune`: the CronJob's mode that deletes from a plain mirror what no cluster uses any more.
//! It reads everything from the registry (every cluster's in-use set, its own ledger, the
//! inventory), applies the pure plan (`retention::plan`), stores the ledger, deletes only with
//! `--delete`, and prints the plan with each reason. Exit 0 when it ran (dry or not), 1 when a
//! deletion failed, 2 when it could not run, 3 when a stale set blocked every deletion.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::cli::Prune;
use crate::credentials::Access;
use crate::mirror_api::Mirror;
use crate::referrers::Referrers;
use crate::registry_http::RegistryHttp;
use crate::retention::plan::{Deletion, Gone, Keep, Kept, Parameters, Plan, Stale, plan};
use crate::retention::{inventory, say_duration, sets};

/// A stale set blocked every deletion.
pub const BLOCKED: u8 = 3;

/// One registry's run: the plan, and what the deletions did.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Run {
    registry: String,
    #[serde(flatten)]
    plan: Plan,
    deleted: Vec<String>,
    failed: Vec<Failure>,
}

#[derive(Serialize)]
struct Failure {
    digest: String,
    repository: String,
    error: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    dry_run: bool,
    now: Timestamp,
    keep_for_seconds: i64,
    stale_after_seconds: i64,
    max_deletions: usize,
    registries: Vec<Run>,
}

/// `--mirror host[/path]` values grouped by host: each host is pruned once, under its paths.
pub fn by_host(mirrors: &[String]) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let mut hosts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for mirror in mirrors {
        let (host, path) = mirror.split_once('/').unwrap_or((mirror, ""));
        anyhow::ensure!(
            !host.is_empty() && (host.contains('.') || host.contains(':') || host == "localhost"),
            "--mirror {mirror:?}: not HOST[/PATH] of a registry (a host with a dot or a port)"
        );
        hosts
            .entry(host.to_string())
            .or_default()
            .push(path.trim_end_matches('/').to_string());
    }
    Ok(hosts)
}

pub async fn prune(args: Prune) -> anyhow::Result<u8> {
    let hosts = by_host(&args.mirror)?;
    let access = Arc::new(Access::new(&args.access, args.insecure).await?);
    let http = RegistryHttp::new(access)?;
    let referrers = Referrers::new(http.clone());
    let mirror = Mirror::new(http);
    let parameters = Parameters {
        now: Timestamp::now(),
        keep_for_seconds: args.keep_for,
        stale_after_seconds: args.stale_after,
        max_deletions: args.max_deletions,
    };
    let mut report = Report {
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
        let read = async {
            let sets = sets::read_sets(&mirror, repository).await?;
            let ledger = sets::read_ledger(&mirror, repository).await?;
            let inventory =
                inventory::inventory(&mirror, &referrers, &host, &paths, in_use).await?;
            Ok::<_, String>(plan(&sets, &ledger, &inventory, &parameters))
        };
        let plan = read
            .await
            .map_err(|error| anyhow::anyhow!("{host}: {error}"))?;
        // Stored before any deletion, dry runs included: the ages a dry run shows are then the
        // ones a run with --delete acts on.
        sets::write_ledger(&mirror, repository, &plan.ledger)
            .await
            .map_err(|error| anyhow::anyhow!("{host}: storing the prune's ledger: {error}"))?;
        let mut run = Run {
            registry: host.clone(),
            plan,
            deleted: Vec::new(),
            failed: Vec::new(),
        };
        if args.delete {
            for deletion in &run.plan.delete {
                let at = format!("{host}/{}", deletion.repository);
                match mirror.delete(&at, &deletion.digest).await {
                    Ok(()) => run.deleted.push(deletion.digest.clone()),
                    Err(error) => run.failed.push(Failure {
                        digest: deletion.digest.clone(),
                        repository: deletion.repository.clone(),
                        error,
                    }),
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
    let blocked = report
        .registries
        .iter()
        .any(|run| !run.plan.blocked.is_empty());
    Ok(match (failed, blocked) {
        (true, _) => 1,
        (false, true) => BLOCKED,
        (false, false) => 0,
    })
}

/// The report as lines a person reads: per registry, what blocks, what goes, what waits, what
/// stays, each with its reason, then a summary line.
fn lines(report: &Report) -> String {
    let now = report.now;
    let gone = |deletion: &Deletion| say_gone(&deletion.why, now, report.keep_for_seconds);
    let kept = |keep: &Keep| say_kept(&keep.why, now, report.keep_for_seconds);
    let tags = |deletion: &Deletion| {
        if deletion.tags.is_empty() {
            String::new()
        } else {
            format!(" (tags {})", deletion.tags.join(", "))
        }
    };
    let mut out = String::new();
    for run in &report.registries {
        let host = &run.registry;
        let mode = if report.dry_run {
            "dry run: nothing is deleted (--delete acts)"
        } else {
            "--delete"
        };
        out.push_str(&format!("prune of {host} ({mode})\n"));
        for stale in &run.plan.blocked {
            out.push_str(&say_blocked(stale, now, report.stale_after_seconds));
        }
        let failed: BTreeMap<&str, &str> = run
            .failed
            .iter()
            .map(|f| (f.digest.as_str(), f.error.as_str()))
            .collect();
        for deletion in &run.plan.delete {
            let verb = match (report.dry_run, failed.get(deletion.digest.as_str())) {
                (true, _) => "would delete".to_string(),
                (false, Some(error)) => format!("FAILED to delete ({error})"),
                (false, None) => "deleted".to_string(),
            };
            out.push_str(&format!(
                "{verb} {host}/{}@{}{}: {}\n",
                deletion.repository,
                deletion.digest,
                tags(deletion),
                gone(deletion)
            ));
        }
        for deletion in &run.plan.held {
            let why = if run.plan.blocked.is_empty() {
                format!("beyond --max-deletions {} this run", report.max_deletions)
            } else {
                "blocked by a stale set".to_string()
            };
            out.push_str(&format!(
                "held ({why}) {host}/{}@{}{}: {}\n",
                deletion.repository,
                deletion.digest,
                tags(deletion),
                gone(deletion)
            ));
        }
        for keep in &run.plan.kept {
            out.push_str(&format!(
                "kept {host}/{}@{}: {}\n",
                keep.repository,
                keep.digest,
                kept(keep)
            ));
        }
        out.push_str(&format!(
            "summary {host}: {} kept, {} {}, {} held, {} failed, {} stale sets\n",
            run.plan.kept.len(),
            if report.dry_run {
                run.plan.delete.len()
            } else {
                run.deleted.len()
            },
            if report.dry_run {
                "would be deleted"
            } else {
                "deleted"
            },
            run.plan.held.len(),
            run.failed.len(),
            run.plan.blocked.len()
        ));
    }
    out
}

/// Why a digest goes, as the report says it.
pub fn say_gone(why: &Gone, now: Timestamp, keep_for_seconds: i64) -> String {
    let ago = |time: Timestamp| say_duration(now.as_second() - time.as_second());
    let keep_for = say_duration(keep_for_seconds);
    match why {
        Gone::NamedLast { cluster, last_seen } => format!(
            "named last by cluster {cluster:?} at {last_seen} ({} ago, longer than --keep-for {keep_for})",
            ago(*last_seen)
        ),
        Gone::UnnamedSince { since } => format!(
            "named by no cluster's set since first seen so at {since} ({} ago, longer than --keep-for {keep_for})",
            ago(*since)
        ),
        Gone::Attached { subject } => format!("attached to {subject}, which goes"),
    }
}

/// Why a digest stays, as the report says it.
pub fn say_kept(why: &Kept, now: Timestamp, keep_for_seconds: i64) -> String {
    let ago = |time: Timestamp| say_duration(now.as_second() - time.as_second());
    let keep_for = say_duration(keep_for_seconds);
    match why {
        Kept::Named {
            cluster,
            last_seen,
            used_by,
        } => format!(
            "named by cluster {cluster:?} at {last_seen} ({} ago){}",
            ago(*last_seen),
            if used_by.is_empty() {
                String::new()
            } else {
                format!(": {}", used_by.join(", "))
            }
        ),
        Kept::Attached { subject } => format!("attached to {subject}, which stays"),
        Kept::Anchored { cluster } => {
            format!("anchored by cluster {cluster:?}, whose set still names it")
        }
        Kept::UnnamedSince { since } => format!(
            "named by no set, but only since {since} ({} ago, within --keep-for {keep_for})",
            ago(*since)
        ),
    }
}

/// The line that says a stale set blocks every deletion (or removal) of a run.
pub fn say_blocked(stale: &Stale, now: Timestamp, stale_after_seconds: i64) -> String {
    format!(
        "blocked: the in-use set of cluster {:?} was published at {} ({} ago), longer ago than --stale-after {}: no deletion until it is published again\n",
        stale.cluster,
        stale.published,
        say_duration(now.as_second() - stale.published.as_second()),
        say_duration(stale_after_seconds)
    )
}
