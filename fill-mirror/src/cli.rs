//! The command line: the modes and their flags.

use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::credentials;
use crate::platforms::Nodes;
use crate::referrers::Referrers;
use crate::registry_http::RegistryHttp;
use crate::skopeo::Skopeo;
use crate::warm::Warmer;

#[derive(Parser)]
#[command(
    name = "fill-mirror",
    version,
    about = "Keeps the image swapper's mirror full"
)]
pub struct Cli {
    #[command(subcommand)]
    pub mode: Mode,
    /// Log lines as JSON (default) or as text.
    #[arg(long, global = true, default_value = "json", value_parser = ["json", "text"])]
    pub log_format: String,
}

#[derive(Subcommand)]
pub enum Mode {
    /// Print the copies the records ask for, one "SOURCE DESTINATION" a line; copy nothing.
    List(Input),
    /// Copy what the records ask for, mark them, and exit 0, 1 or 2.
    Once {
        #[command(flatten)]
        input: Input,
        #[command(flatten)]
        copying: Copying,
        /// Takes the watch's Lease for the run: while a watch replica holds it, the watch
        /// copies and this run does nothing (exit 0); a run that loses it stops (exit 1).
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
        /// How often an image a template names is looked up again, finished copies nothing
        /// names are forgotten, and the in-use set is published, in seconds.
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
        /// Kubewarden's own namespace: its controller leaves it out of every policy
        /// (policy-server accepts what comes from it unchanged), so nothing there is filled.
        /// Empty: no namespace is left out.
        #[arg(long, default_value = "kubewarden")]
        kubewarden_namespace: String,
        #[command(flatten)]
        election: Election,
        #[command(flatten)]
        retention: RetentionArgs,
    },
    /// Delete from a plain mirror what no cluster's in-use set has named for --keep-for, or with
    /// --unanchor-only remove only its anchor tags (a dry run unless --delete); exit 0 when it ran, 1 when a deletion failed, 2 when it could not
    /// run, 3 when a stale set blocked every deletion.
    Prune(Prune),
}

#[derive(Args)]
pub struct Prune {
    /// A mirror to prune: HOST[/PATH], the repositories under PATH (every repository of HOST
    /// without one). Repeatable; a registry's other repositories are never touched.
    #[arg(long, required = true)]
    pub mirror: Vec<String>,
    /// The repository the clusters publish their in-use sets in, in each mirror registry.
    #[arg(long, default_value = crate::in_use_set::DEFAULT_REPOSITORY)]
    pub in_use_repository: String,
    /// How long a digest stays after a set last named it, or after the prune first saw it
    /// named by none (30d, 12h, ...).
    #[arg(long, default_value = "30d", value_parser = crate::retention::parse_duration)]
    pub keep_for: i64,
    /// A cluster's set published longer ago than this blocks every deletion (the cluster may
    /// use what it no longer says).
    #[arg(long, default_value = "1h", value_parser = crate::retention::parse_duration)]
    pub stale_after: i64,
    /// The most manifests one run deletes (oldest first); with --unanchor-only, the most
    /// digests whose anchors it removes.
    #[arg(long, default_value_t = 20)]
    pub max_deletions: usize,
    /// Delete: without it the run only says what it would delete (or unanchor), and why.
    #[arg(long)]
    pub delete: bool,
    /// Where the registry's own rules delete (ECR lifecycle, Artifact Registry cleanup, Harbor
    /// retention): remove only the anchor tags `inuse-*` of what no fresh set has named for
    /// --keep-for, so those rules expire it; never delete a manifest by digest. On an
    /// --ecr-registry through ECR's API (DescribeImages, BatchDeleteImage), where an image whose
    /// anchors are its last tags goes with them. --max-deletions then bounds the digests
    /// unanchored in a run.
    #[arg(long)]
    pub unanchor_only: bool,
    /// The plan as lines a person reads, or as one JSON object.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// Plain HTTP and unverified TLS for every registry.
    #[arg(long)]
    pub insecure: bool,
    #[command(flatten)]
    pub access: credentials::AccessArgs,
}

#[derive(Args, Clone)]
pub struct RetentionArgs {
    /// This cluster's id in the in-use set it publishes into each mirror registry (the set's
    /// tag, and part of every anchor tag `inuse-<id>-<hex>`): 1 to 40 of a-z, 0-9 and '-', or
    /// `auto` for the UID of the namespace kube-system (what deploy/ passes: unique per
    /// cluster without a value to set). Without it the in-use set is neither computed nor
    /// published: retention is off, and neither the prune nor the registries' keep rules know
    /// what this cluster uses.
    #[arg(long, env = "FILL_MIRROR_CLUSTER_ID")]
    pub cluster_id: Option<String>,
    /// The repository under each mirror registry the in-use set is published in.
    #[arg(long, default_value = crate::in_use_set::DEFAULT_REPOSITORY)]
    pub in_use_repository: String,
    /// How long, in days, an image no longer in use stays in the set (and anchored).
    #[arg(long, default_value_t = 30)]
    pub keep_for: u64,
}

#[derive(Args)]
pub struct Election {
    /// The Lease the replicas elect the copier with (in the client's namespace).
    #[arg(long, default_value = "fill-mirror")]
    pub lease: String,
    /// How long a Lease not renewed holds, in seconds (at least 3): the leader renews it every
    /// fifth of that and stops leading after two thirds without a renewal.
    #[arg(long, default_value_t = 15)]
    pub lease_duration: u64,
    /// This replica's name in the Lease (default: the host name, the Pod's name).
    #[arg(long, env = "HOSTNAME")]
    pub identity: Option<String>,
    /// No election: this replica copies and marks (a single replica).
    #[arg(long)]
    pub no_election: bool,
}

#[derive(Args)]
pub struct Input {
    /// The swapping policy's settings (or its policy object), as JSON; needed with --pods.
    #[arg(long)]
    pub settings: Option<String>,
    /// The swapping policy's ClusterAdmissionPolicy.
    #[arg(long, default_value = "image-swapper")]
    pub swap_policy: String,
    /// Pods from `kubectl get pods -o json` output instead of the cluster.
    #[arg(long)]
    pub pods: Vec<String>,
    /// The check role's reports from `kubectl get policyreports -o json` (or reports, or
    /// clusterpolicyreports) output instead of the cluster.
    #[arg(long)]
    pub reports: Vec<String>,
    /// Nodes from `kubectl get nodes -o json` output instead of the cluster: their platforms
    /// are the ones a pull-through cache is warmed with (with --pods and none of these, every
    /// platform).
    #[arg(long)]
    pub nodes: Vec<String>,
    #[command(flatten)]
    pub check: Check,
}

#[derive(Args, Clone)]
pub struct Check {
    /// The check role's ClusterAdmissionPolicy, whose `fail` results in the reports name the
    /// copies it asks for (read under both ids: clusterwide-NAME and kw.cap.NAME).
    #[arg(long, default_value = "image-swapper-check")]
    pub check_policy: String,
}

#[derive(Args, Clone)]
pub struct Copying {
    /// Copies at once.
    #[arg(long, default_value_t = 4)]
    pub jobs: usize,
    /// Plain HTTP and unverified TLS for every registry.
    #[arg(long)]
    pub insecure: bool,
    /// The skopeo binary.
    #[arg(long, default_value = "skopeo", env = "FILL_MIRROR_SKOPEO")]
    pub skopeo: String,
    /// How long one copy may take, in seconds.
    #[arg(long, default_value_t = 1800)]
    pub copy_timeout: u64,
    #[command(flatten)]
    pub access: credentials::AccessArgs,
}

impl Copying {
    pub async fn engine(&self) -> anyhow::Result<Skopeo> {
        Ok(Skopeo {
            binary: self.skopeo.clone(),
            access: Arc::new(credentials::Access::new(&self.access, self.insecure).await?),
            timeout: Duration::from_secs(self.copy_timeout),
            anonymous_at: None,
        })
    }

    /// The referrers' client and the warming, on one HTTP client with the engine's access;
    /// the warming pulls the platforms `nodes` run.
    pub fn registry_clients(
        &self,
        engine: &Skopeo,
        nodes: Nodes,
    ) -> anyhow::Result<(Referrers, Warmer)> {
        let http = RegistryHttp::new(engine.access.clone())?;
        Ok((
            Referrers::new(http.clone()),
            Warmer::new(http, nodes, Duration::from_secs(self.copy_timeout)),
        ))
    }
}
