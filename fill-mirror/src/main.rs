//! fill-mirror: keeps the mirror full. It reads the record the swapping policy writes on the
//! Pods it kept because the mirror lacked an image, checks each copy with the policy's own
//! rules, makes each copy once (skopeo), and marks the records filled.
//!
//! Modes: `watch` (a Deployment: follows the Pods and the settings), `once` (a CronJob or a
//! person: one pass, exit 0 when every copy was made or is there or its source is gone, 1 when
//! one failed, 2 when the run could not run), `list` (prints the copies, copies nothing).

mod attached;
mod board;
mod credentials;
mod leader;
mod metrics;
mod referrers;
mod runner;
mod skopeo;
mod source;
mod watch;

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tokio::sync::Notify;

use board::{Backoff, Board};
use metrics::{Health, Metrics};
use runner::{Runner, Totals};
use skopeo::Skopeo;

#[derive(Parser)]
#[command(
    name = "fill-mirror",
    version,
    about = "Keeps the image swapper's mirror full"
)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
    /// Log lines as JSON (default) or as text.
    #[arg(long, global = true, default_value = "json", value_parser = ["json", "text"])]
    log_format: String,
}

#[derive(Subcommand)]
enum Mode {
    /// Print the copies the records ask for, one "SOURCE DESTINATION" a line; copy nothing.
    List(Input),
    /// Copy what the records ask for, mark them, and exit 0, 1 or 2.
    Once {
        #[command(flatten)]
        input: Input,
        #[command(flatten)]
        copying: Copying,
        /// Takes the watch's Lease for the run: while a watch replica holds it, the watch
        /// copies and this run does nothing (exit 0).
        #[command(flatten)]
        election: Election,
    },
    /// Follow the recorded Pods and the settings; copy and mark as they come.
    Watch {
        /// The swapping policy's settings from this file instead of its ClusterAdmissionPolicy.
        #[arg(long)]
        settings: Option<String>,
        /// The swapping policy's ClusterAdmissionPolicy.
        #[arg(long, default_value = "image-swapper")]
        swap_policy: String,
        #[command(flatten)]
        copying: Copying,
        /// Where /metrics, /healthz and /readyz are served.
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: String,
        /// A failed copy waits this many seconds, doubled at each failure up to 300.
        #[arg(long, default_value_t = 10)]
        retry: u64,
        /// How often an image a template names is looked up again, and finished copies
        /// nothing names are forgotten, in seconds.
        #[arg(long, default_value_t = 600)]
        period: u64,
        /// Do not follow the workload templates (Deployments, StatefulSets, DaemonSets,
        /// ReplicaSets, Jobs, CronJobs); fill only what Pods' records ask for.
        #[arg(long)]
        no_templates: bool,
        /// Do not read the check role's reports each period.
        #[arg(long)]
        no_reports: bool,
        #[command(flatten)]
        check: Check,
        #[command(flatten)]
        election: Election,
    },
}

/// What the watch follows besides the recorded Pods and the settings.
struct Follow {
    /// The workload templates.
    templates: bool,
    /// The check role's reports, each period: its policy.
    reports: Option<Check>,
}

/// The watch's periods.
struct Timing {
    retry: Duration,
    period: Duration,
}

#[derive(Args)]
struct Election {
    /// The Lease the replicas elect the copier with (in the client's namespace).
    #[arg(long, default_value = "fill-mirror")]
    lease: String,
    /// How long a Lease not renewed holds, in seconds; it is renewed every third of that.
    #[arg(long, default_value_t = 15)]
    lease_duration: u64,
    /// This replica's name in the Lease (default: the host name, the Pod's name).
    #[arg(long, env = "HOSTNAME")]
    identity: Option<String>,
    /// No election: this replica copies and marks (a single replica).
    #[arg(long)]
    no_election: bool,
}

#[derive(Args)]
struct Input {
    /// The swapping policy's settings (or its policy object), as JSON; needed with --pods.
    #[arg(long)]
    settings: Option<String>,
    /// The swapping policy's ClusterAdmissionPolicy.
    #[arg(long, default_value = "image-swapper")]
    swap_policy: String,
    /// Pods from `kubectl get pods -o json` output instead of the cluster.
    #[arg(long)]
    pods: Vec<String>,
    /// The check role's reports from `kubectl get policyreports -o json` (or reports, or
    /// clusterpolicyreports) output instead of the cluster.
    #[arg(long)]
    reports: Vec<String>,
    #[command(flatten)]
    check: Check,
}

#[derive(Args, Clone)]
struct Check {
    /// The check role's ClusterAdmissionPolicy, whose `fail` results in the reports name the
    /// copies it asks for (read under both ids: clusterwide-NAME and kw.cap.NAME).
    #[arg(long, default_value = "image-swapper-check")]
    check_policy: String,
}

#[derive(Args, Clone)]
struct Copying {
    /// Copies at once.
    #[arg(long, default_value_t = 4)]
    jobs: usize,
    /// Plain HTTP and unverified TLS for every registry.
    #[arg(long)]
    insecure: bool,
    /// The skopeo binary.
    #[arg(long, default_value = "skopeo", env = "FILL_MIRROR_SKOPEO")]
    skopeo: String,
    /// How long one copy may take, in seconds.
    #[arg(long, default_value_t = 1800)]
    copy_timeout: u64,
    #[command(flatten)]
    access: credentials::AccessArgs,
}

impl Copying {
    async fn engine(&self) -> anyhow::Result<Skopeo> {
        Ok(Skopeo {
            binary: self.skopeo.clone(),
            access: Arc::new(credentials::Access::new(&self.access, self.insecure).await?),
            timeout: Duration::from_secs(self.copy_timeout),
        })
    }

    fn referrers(&self, engine: &Skopeo) -> anyhow::Result<referrers::Referrers> {
        referrers::Referrers::new(engine.access.clone())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if cli.log_format == "json" {
        logs.json().flatten_event(true).init();
    } else {
        logs.init();
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            return ExitCode::from(2);
        }
    };
    let status = runtime.block_on(async {
        match cli.mode {
            Mode::List(input) => list(input).await,
            Mode::Once {
                input,
                copying,
                election,
            } => once(input, copying, election).await,
            Mode::Watch {
                settings,
                swap_policy,
                copying,
                listen,
                retry,
                period,
                no_templates,
                no_reports,
                check,
                election,
            } => {
                let timing = Timing {
                    retry: Duration::from_secs(retry.max(1)),
                    period: Duration::from_secs(period.max(1)),
                };
                watch(
                    settings,
                    swap_policy,
                    copying,
                    listen,
                    timing,
                    Follow {
                        templates: !no_templates,
                        reports: (!no_reports).then_some(check),
                    },
                    election,
                )
                .await
            }
        }
    });
    match status {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "fill-mirror could not run");
            ExitCode::from(2)
        }
    }
}

type Records = Vec<(
    String,
    image_swapper_policy::pod::fill::FillRecord,
    Option<std::time::SystemTime>,
)>;

/// What one pass reads: the Pods' records, the copies the check role's reports name (and the
/// notes of what they name that is refused), and the client they came from (none when read
/// from files).
struct Read {
    records: Records,
    report_copies: Vec<image_swapper_policy::pod::fill::Copy>,
    report_notes: Vec<String>,
    client: Option<kube::Client>,
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
        let reports = source::reports_from_files(&input.reports)?;
        let (report_copies, report_notes) = source::report_copies(&reports, &ids, &policy);
        return Ok(Read {
            records: source::records(&pods, &policy),
            report_copies,
            report_notes,
            client: None,
        });
    }
    let client = source::client().await?;
    let policy = match &input.settings {
        Some(settings) => source::policy_from_file(settings)?,
        None => source::policy_from_cluster(&client, &input.swap_policy).await?,
    };
    let pods = source::pods_from_cluster(&client).await?;
    let reports = source::reports_from_cluster(&client).await?;
    let (report_copies, report_notes) = source::report_copies(&reports, &ids, &policy);
    Ok(Read {
        records: source::records(&pods, &policy),
        report_copies,
        report_notes,
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

async fn list(input: Input) -> anyhow::Result<u8> {
    let read = read(&input).await?;
    let refused = notes(&read);
    let mut copies = source::copies(&read.records);
    for copy in &read.report_copies {
        if !copies.iter().any(|c| c.destination == copy.destination) {
            copies.push(copy.clone());
        }
    }
    for copy in &copies {
        println!("{copy}");
    }
    if refused > 0 {
        eprintln!(
            "fill-mirror: listed {} copies, {refused} refused",
            copies.len()
        );
    }
    Ok(0)
}

async fn once(input: Input, copying: Copying, election: Election) -> anyhow::Result<u8> {
    let read = read(&input).await?;
    let client = read.client.clone();
    // From the cluster, the run takes the watch's Lease, so that no copy is made beside a
    // watch replica that copies the same.
    let elector = match &client {
        Some(client) if !election.no_election => {
            let elector = leader::Elector::new(
                client.clone(),
                client.default_namespace(),
                &election.lease,
                election.identity.clone().map_or_else(
                    || format!("fill-mirror-once-{}", std::process::id()),
                    |id| format!("{id}-once"),
                ),
                Duration::from_secs(election.lease_duration.max(3)),
                Arc::new(Metrics::default()),
            );
            if !elector.round().await? {
                let holder = elector.holder().await.unwrap_or_default();
                println!(
                    "fill-mirror: the Lease {} is held by {holder}: the watch copies and marks, nothing done",
                    election.lease
                );
                return Ok(0);
            }
            Some(Arc::new(elector))
        }
        _ => None,
    };
    let renewing = elector.clone().map(|elector| {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(elector.duration / 3).await;
                if let Err(error) = elector.round().await {
                    tracing::warn!(%error, "cannot renew the Lease");
                }
            }
        })
    });
    let status = copy_once(read, copying).await;
    if let Some(renewing) = renewing {
        renewing.abort();
    }
    if let Some(elector) = elector {
        elector.release().await;
    }
    status
}

async fn copy_once(read: Read, copying: Copying) -> anyhow::Result<u8> {
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
    board.template_seen(watch::REPORTS, read.report_copies);
    let engine = copying.engine().await?;
    let mut runner = Runner {
        board: Arc::new(Mutex::new(board)),
        metrics,
        health: Arc::new(Health::default()),
        referrers: copying.referrers(&engine)?,
        engine,
        jobs: copying.jobs.max(1),
        wake: Arc::new(Notify::new()),
        client: read.client,
        leading: None,
        period: Duration::MAX,
        totals: Totals::default(),
    };
    runner.run_until_idle().await;
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
    Ok(if t.failed > 0 { 1 } else { 0 })
}

async fn watch(
    settings: Option<String>,
    swap_policy: String,
    copying: Copying,
    listen: String,
    timing: Timing,
    follow: Follow,
    election: Election,
) -> anyhow::Result<u8> {
    let client = source::client().await?;
    let fixed = settings
        .as_deref()
        .map(source::policy_from_file)
        .transpose()?;
    let metrics = Arc::new(Metrics::default());
    let leading = if election.no_election {
        metrics.leader.set(1);
        None
    } else {
        let identity = election
            .identity
            .clone()
            .unwrap_or_else(|| format!("fill-mirror-{}", std::process::id()));
        let elector = leader::Elector::new(
            client.clone(),
            client.default_namespace(),
            &election.lease,
            identity,
            Duration::from_secs(election.lease_duration.max(3)),
            metrics.clone(),
        );
        let leading = elector.leading.clone();
        tokio::spawn(elector.run());
        Some(leading)
    };
    let health = Arc::new(Health::default());
    health.beat();
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|error| anyhow::anyhow!("--listen {listen}: {error}"))?;
    tracing::info!(address = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "serving /metrics, /healthz, /readyz");
    let board = Arc::new(Mutex::new(Board::new(
        Backoff {
            retry: timing.retry,
            max: Duration::from_secs(300),
        },
        true,
    )));
    let wake = Arc::new(Notify::new());
    let server = tokio::spawn(metrics::serve(listener, metrics.clone(), health.clone()));
    let watcher = watch::Watch {
        client: client.clone(),
        swap_policy: fixed.is_none().then_some(swap_policy),
        fixed,
        board: board.clone(),
        metrics: metrics.clone(),
        health: health.clone(),
        wake: wake.clone(),
        templates: follow.templates,
        check_policy_ids: follow
            .reports
            .map(|check| source::check_policy_ids(&check.check_policy)),
        period: timing.period,
    };
    let watching = tokio::spawn(watcher.run());
    let engine = copying.engine().await?;
    let mut runner = Runner {
        board,
        metrics,
        health,
        referrers: copying.referrers(&engine)?,
        engine,
        jobs: copying.jobs.max(1),
        wake,
        client: Some(client),
        leading,
        period: timing.period,
        totals: Totals::default(),
    };
    tokio::select! {
        () = runner.run() => {}
        _ = watching => anyhow::bail!("the watch ended"),
        served = server => anyhow::bail!("the metrics server ended: {served:?}"),
        _ = tokio::signal::ctrl_c() => tracing::info!("stopping"),
        () = terminated() => tracing::info!("stopping"),
    }
    Ok(0)
}

async fn terminated() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut signal) => {
            signal.recv().await;
        }
        Err(_) => futures::future::pending().await,
    }
}
