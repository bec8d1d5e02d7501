//! fill-mirror: keeps the mirror full. It reads the record the swapping policy writes on the
//! Pods it kept because the mirror lacked an image, checks each copy with the policy's own
//! rules, makes each copy once (skopeo), and marks the records filled.
//!
//! Modes: `watch` (a Deployment: follows the Pods and the settings), `once` (a CronJob or a
//! person: one pass, exit 0 when every copy was made or is there or its source is gone, 1 when
//! one failed, 2 when the run could not run), `list` (prints the copies, copies nothing),
//! `prune` (a CronJob: deletes from a plain mirror what no cluster's in-use set names, or with
//! `--unanchor-only` removes only its anchor tags where the registry's own rules delete).
mod attached;
mod board;
mod cli;
mod coverage;
mod credentials;
mod digest;
mod in_use;
// The retention's shared record: the watch publishes it, the prune reads it.
mod in_use_set;
mod leader;
mod metrics;
mod mirror_api;
mod mode_once;
mod mode_prune;
mod mode_unanchor;
mod mode_watch;
mod oci_artifact;
mod platforms;
mod referrers;
mod registry_http;
mod reports;
mod retention;
mod runner;
mod skopeo;
mod source;
mod templates;
mod warm;
mod watch;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use cli::{Cli, Mode};
use mode_watch::{Follow, Timing};

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
            Mode::List(input) => mode_once::list(input).await,
            Mode::Once {
                input,
                copying,
                election,
            } => mode_once::once(input, copying, election).await,
            Mode::Prune(args) if args.unanchor_only => mode_unanchor::unanchor(args).await,
            Mode::Prune(args) => mode_prune::prune(args).await,
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
                kubewarden_namespace,
                election,
                retention,
            } => {
                let timing = Timing {
                    retry: Duration::from_secs(retry.max(1)),
                    period: Duration::from_secs(period.max(1)),
                };
                mode_watch::watch(
                    settings,
                    swap_policy,
                    copying,
                    listen,
                    timing,
                    Follow {
                        templates: !no_templates,
                        reports: (!no_reports).then_some(check),
                        retention,
                        kubewarden_namespace: Some(kubewarden_namespace)
                            .filter(|namespace| !namespace.is_empty()),
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
