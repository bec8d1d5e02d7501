//! `list` and `once`: one pass over the Pods' records and the check role's reports, read
//! from the cluster or from files; `once` copies under the watch's Lease and exits 0, 1 or 2.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::board::{Backoff, Board};
use crate::cli::{Copying, Election, Input};
use crate::leader::Ended;
use crate::metrics::{Health, Metrics};
use crate::platforms::{Known, Nodes, known_in_cluster, nodes_from_files};
use crate::runner::{Runner, Totals};
use crate::{leader, reports, source, watch};

type Records = Vec<(
    String,
    image_swapper_policy::plan::FillRecord,
    Option<std::time::SystemTime>,
)>;

/// What one pass reads: the Pods' records, the copies the check role's reports name (and the
/// notes of what they name that is refused), the nodes' platforms (what a warming pulls), and
/// the client they came from (none when read from files).
struct Read {
    records: Records,
    report_copies: Vec<reports::ReportCopy>,
    report_notes: Vec<String>,
    nodes: Known,
    client: Option<kube::Client>,
}

/// The nodes' platforms: from `--nodes` files, else from the cluster when there is one.
async fn nodes(input: &Input, client: Option<&kube::Client>) -> anyhow::Result<Known> {
    if !input.nodes.is_empty() {
        return Ok(Known::from_nodes(&nodes_from_files(&input.nodes)?));
    }
    Ok(match client {
        Some(client) => known_in_cluster(client).await,
        None => Known::Unknown("read from files, and no --nodes given".to_string()),
    })
}

async fn read(input: &Input) -> anyhow::Result<Read> {
    let ids = source::check_policy_ids(&input.check.check_policy);
    if !input.pods.is_empty() || !input.reports.is_empty() {
        let Some(settings) = &input.settings else {
            anyhow::bail!(
                "--pods and --reports need --settings (the swapping policy's settings) to check their copies"
            );
        };
        let policy = source::policy_from_file(settings)?;
        let pods = source::pods_from_files(&input.pods)?;
        let reports = reports::reports_from_files(&input.reports)?;
        // A report's copy runs only for a Pod the input names: give --pods beside --reports.
        if input.pods.is_empty() && !input.reports.is_empty() {
            tracing::warn!(
                "--reports without --pods: a report's copy runs only for a Pod that runs its image, and no Pod is given (kubectl get pods -A -o json)"
            );
        }
        let guards = reports::guards_from_pods(&pods);
        let (report_copies, report_notes) =
            reports::report_copies(&reports, &ids, &policy, &guards);
        return Ok(Read {
            records: source::records(&pods, &policy),
            report_copies,
            report_notes,
            nodes: nodes(input, None).await?,
            client: None,
        });
    }
    let client = source::client().await?;
    let policy = match &input.settings {
        Some(settings) => source::policy_from_file(settings)?,
        None => source::policy_from_cluster(&client, &input.swap_policy).await?,
    };
    let pods = source::pods_from_cluster(&client).await?;
    let reports = reports::reports_from_cluster(&client).await?;
    let guards =
        reports::guards_from_cluster(&client, &reports, &ids, &input.check.check_policy).await?;
    let (report_copies, report_notes) = reports::report_copies(&reports, &ids, &policy, &guards);
    Ok(Read {
        records: source::records(&pods, &policy),
        report_copies,
        report_notes,
        nodes: nodes(input, Some(&client)).await?,
        client: Some(client),
    })
}

/// Logs every note once; how many there were.
fn notes(read: &Read) -> usize {
    let mut count = 0;
    for (pod, record, _) in &read.records {
        for note in &record.notes {
            tracing::warn!(%pod, "{note}");
            count += 1;
        }
    }
    for note in &read.report_notes {
        tracing::warn!("{note}");
        count += 1;
    }
    count
}

pub async fn list(input: Input) -> anyhow::Result<u8> {
    let read = read(&input).await?;
    let refused = notes(&read);
    let mut copies = source::copies(&read.records);
    for copy in read.report_copies.iter().map(|c| &c.copy) {
        if !copies.iter().any(|c| c.destination == copy.destination) {
            copies.push(copy.clone());
        }
    }
    for copy in &copies {
        match &copy.warm {
            // A pull-through cache is not pushed to: the line says what is asked of it instead.
            Some(warm) => println!("{copy} warmed by a pull of {}", warm.reference),
            None => println!("{copy}"),
        }
    }
    if copies.iter().any(|copy| copy.warm.is_some()) {
        eprintln!(
            "fill-mirror: a pull-through cache is warmed with the platforms the nodes run: {}",
            read.nodes.describe()
        );
    }
    if refused > 0 {
        eprintln!(
            "fill-mirror: listed {} copies, {refused} refused",
            copies.len()
        );
    }
    Ok(0)
}

pub async fn once(input: Input, copying: Copying, election: Election) -> anyhow::Result<u8> {
    let read = read(&input).await?;
    let client = read.client.clone();
    // From the cluster, the run takes the watch's Lease, so that no copy is made beside a
    // watch replica that copies the same.
    let elector = match &client {
        Some(client) if !election.no_election => Arc::new(leader::Elector::new(
            client.clone(),
            client.default_namespace(),
            &election.lease,
            election.identity.clone().map_or_else(
                || format!("fill-mirror-once-{}", std::process::id()),
                |id| format!("{id}-once"),
            ),
            leader::Timing::for_duration(election.lease_duration),
            Arc::new(Metrics::default()),
        )),
        _ => return Ok(copy_once(read, copying, None).await?.1),
    };
    if let Some(holder) = elector.take_for_run().await? {
        println!(
            "fill-mirror: the Lease {} is held by {holder}: the watch copies and marks, nothing done",
            election.lease
        );
        return Ok(0);
    }
    // Renewed while the run copies; lost, the run stops copying and marking at once.
    let keeping = tokio::spawn(elector.clone().run());
    let copied = copy_once(read, copying, Some(elector.leading())).await;
    keeping.abort();
    let _ = keeping.await;
    elector.release().await;
    let (ended, status) = copied?;
    if ended == Ended::LostLease {
        let holder = elector.holder().await.unwrap_or_else(|| "no one".into());
        println!(
            "fill-mirror: lost the Lease {} (held by {holder} now): stopped copying and marking",
            election.lease
        );
    }
    Ok(status)
}

async fn copy_once(
    read: Read,
    copying: Copying,
    leading: Option<tokio::sync::watch::Receiver<bool>>,
) -> anyhow::Result<(Ended, u8)> {
    let refused = notes(&read);
    let metrics = Arc::new(Metrics::default());
    for _ in 0..refused {
        metrics.counted("refused");
    }
    let mut board = Board::new(Backoff::default(), false);
    for (pod, record, created) in read.records {
        board.pod_seen(&pod, record, created);
    }
    // A report's copies have no Pod record to mark: they are filled as a template's are.
    board.reports_seen(watch::REPORTS, read.report_copies);
    let engine = copying.engine().await?;
    let (referrers, warmer) = copying.registry_clients(&engine, Nodes::Fixed(read.nodes))?;
    let mut runner = Runner {
        board: Arc::new(Mutex::new(board)),
        metrics,
        health: Arc::new(Health::default()),
        referrers,
        warmer,
        engine,
        jobs: copying.jobs.max(1),
        wake: Arc::new(Notify::new()),
        client: read.client,
        leading,
        period: Duration::MAX,
        totals: Totals::default(),
    };
    let ended = runner.run_until_idle().await;
    let t = &runner.totals;
    println!(
        "fill-mirror: {} copied, {} failed, {} skipped, {} gone, {} refused, {} marked",
        t.copied,
        t.failed,
        t.present,
        t.gone,
        refused + t.refused,
        t.marked
    );
    // A run that lost the Lease exits 1, as one whose copy failed: what it did not make is for
    // whoever leads now, or the next run.
    let failed = t.failed > 0 || ended == Ended::LostLease;
    Ok((ended, u8::from(failed)))
}
