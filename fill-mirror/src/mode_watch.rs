//! `watch`: the Deployment's mode. Follows the recorded Pods, the templates, the reports and
//! the settings; elects the copier by a Lease; serves /metrics, /healthz and /readyz.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::board::{Backoff, Board};
use crate::cli::{Check, Copying, Election, RetentionArgs};
use crate::in_use::{self, Retention, Stores};
use crate::metrics::{self, Health, Metrics};
use crate::platforms::Nodes;
use crate::registry_http::RegistryHttp;
use crate::retention::ages::SetAges;
use crate::runner::{Runner, Totals};
use crate::{in_use_set, leader, source, watch};

/// What the watch follows besides the recorded Pods and the settings.
pub struct Follow {
    /// The workload templates.
    pub templates: bool,
    /// The check role's reports, each period: its policy.
    pub reports: Option<Check>,
    /// The in-use set: computed and published each period with `--cluster-id`.
    pub retention: RetentionArgs,
    /// Kubewarden's own namespace, which no policy sees (none: every namespace may be seen).
    pub kubewarden_namespace: Option<String>,
}

/// The watch's periods.
pub struct Timing {
    pub retry: Duration,
    pub period: Duration,
}

pub async fn watch(
    settings: Option<String>,
    swap_policy: String,
    copying: Copying,
    listen: String,
    timing: Timing,
    follow: Follow,
    election: Election,
) -> anyhow::Result<u8> {
    let client = source::client().await?;
    let retention = retention_of(follow.retention, timing.period, &client).await?;
    let fixed = settings
        .as_deref()
        .map(source::policy_from_file)
        .transpose()?;
    let metrics = Arc::new(Metrics::default());
    let elector = if election.no_election {
        metrics.leader.set(1);
        None
    } else {
        let identity = election
            .identity
            .clone()
            .unwrap_or_else(|| format!("fill-mirror-{}", std::process::id()));
        Some(Arc::new(leader::Elector::new(
            client.clone(),
            client.default_namespace(),
            &election.lease,
            identity,
            leader::Timing::for_duration(election.lease_duration),
            metrics.clone(),
        )))
    };
    let leading = elector.as_ref().map(|elector| elector.leading());
    let electing = elector.clone().map(|elector| tokio::spawn(elector.run()));
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
    let engine = copying.engine().await?;
    // Every cluster's set is read from the repository this one publishes to (`--in-use-repository`).
    let set_ages = Arc::new(SetAges {
        http: RegistryHttp::new(engine.access.clone())?,
        repository: retention.as_ref().map_or_else(
            || in_use_set::DEFAULT_REPOSITORY.to_string(),
            |retention| retention.repository.clone(),
        ),
        metrics: metrics.clone(),
        exported: Default::default(),
    });
    // The in-use set's stores (the template watches fill the workload kinds') and the
    // policy's scope as the watch reads it.
    let (scope_tx, scope_rx) = tokio::sync::watch::channel(None);
    let (stores, writers) = match &retention {
        Some(_) => {
            let (stores, writers, pods) = Stores::new();
            (Some((stores, pods)), Some(writers))
        }
        None => (None, None),
    };
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
        check_policy: follow.reports.map(|check| check.check_policy),
        period: timing.period,
        set_ages: Some(set_ages),
        in_use: writers.map(|writers| (writers, scope_tx)),
        kubewarden_namespace: follow.kubewarden_namespace,
    };
    let watching = tokio::spawn(watcher.run());
    let publishing = match (retention, stores) {
        (Some(retention), Some(stores)) => tokio::spawn(in_use::publish_every_period(
            retention,
            RegistryHttp::new(engine.access.clone())?,
            client.clone(),
            stores,
            scope_rx,
            leading.clone(),
            metrics.clone(),
        )),
        _ => tokio::spawn(futures::future::pending()),
    };
    // What a warming pulls out of an image index: the platforms of the nodes, as they join
    // and leave.
    let (referrers, warmer) = copying.registry_clients(&engine, Nodes::watch(client.clone()))?;
    let mut runner = Runner {
        board,
        metrics,
        health,
        referrers,
        warmer,
        engine,
        jobs: copying.jobs.max(1),
        wake,
        client: Some(client),
        leading,
        period: timing.period,
        totals: Totals::default(),
    };
    let stop = async {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = terminated() => {}
        }
        tracing::info!("stopping");
    };
    tokio::select! {
        () = runner.run(stop) => {}
        _ = watching => anyhow::bail!("the watch ended"),
        _ = publishing => anyhow::bail!("the in-use set's publishing ended"),
        served = server => anyhow::bail!("the metrics server ended: {served:?}"),
    }
    // The copies under way have stopped (the runner waited for its jobs, skopeo killed with
    // them); the renewals stop next, then the Lease is given up, so that the standby takes it
    // at its next try rather than after the whole duration (a rolling update, a drain).
    if let (Some(electing), Some(elector)) = (electing, elector) {
        electing.abort();
        let _ = electing.await;
        elector.release().await;
    }
    Ok(0)
}

/// The retention's part of the watch, when `--cluster-id` turns it on.
async fn retention_of(
    args: RetentionArgs,
    period: Duration,
    client: &kube::Client,
) -> anyhow::Result<Option<Retention>> {
    let cluster = match args.cluster_id.as_deref() {
        None => {
            tracing::info!("no --cluster-id: the in-use set is not published (retention off)");
            return Ok(None);
        }
        Some(CLUSTER_ID_AUTO) => kube_system_uid(client).await?,
        Some(id) => id.to_string(),
    };
    crate::in_use_set::check_cluster_id(&cluster).map_err(anyhow::Error::msg)?;
    tracing::info!(cluster, "the in-use set is published under this cluster id");
    if args.in_use_repository.is_empty() || args.in_use_repository.starts_with('/') {
        anyhow::bail!(
            "--in-use-repository {:?}: a repository path under the registry",
            args.in_use_repository
        );
    }
    Ok(Some(Retention {
        cluster,
        repository: args.in_use_repository,
        keep_for: Duration::from_secs(args.keep_for.saturating_mul(86_400)),
        period,
    }))
}

/// `--cluster-id auto`: the UID of the namespace `kube-system`, which every cluster has, which no
/// other cluster shares and which lives as long as the cluster (a lowercase UUID: a valid id).
/// Two clusters under one id would overwrite each other's set, and the prune would then delete
/// what one of them runs; a name typed per cluster is easier to read but easy to copy.
pub const CLUSTER_ID_AUTO: &str = "auto";

async fn kube_system_uid(client: &kube::Client) -> anyhow::Result<String> {
    use k8s_openapi::api::core::v1::Namespace;
    // A list by name, not a get: the ServiceAccount lists and watches namespaces already.
    let listed = kube::Api::<Namespace>::all(client.clone())
        .list(&kube::api::ListParams::default().fields("metadata.name=kube-system"))
        .await
        .map_err(|error| {
            anyhow::anyhow!("--cluster-id auto: could not list the namespace kube-system ({error})")
        })?;
    listed
        .items
        .into_iter()
        .find_map(|namespace| namespace.metadata.uid)
        .ok_or_else(|| anyhow::anyhow!("--cluster-id auto: the namespace kube-system has no uid"))
}

async fn terminated() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut signal) => {
            signal.recv().await;
        }
        Err(_) => futures::future::pending().await,
    }
}
