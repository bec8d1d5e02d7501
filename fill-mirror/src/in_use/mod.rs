//! The in-use set, as the watch computes and publishes it: what the covered namespaces' Pods,
//! workload templates and rollback ReplicaSets name, mapped to the mirror by the policy's own
//! rules (`named.rs`), each tag looked up in the mirror and each digest's attached artifacts
//! added (`resolve.rs`), merged with the set published before (`merge.rs`), and pushed into each
//! mirror registry with an anchor tag on every digest (`publish.rs`), over the mirror's client
//! the prune shares (`mirror_api.rs`). The record itself is `in_use_set.rs`, shared with it too.

mod merge;
mod named;
mod publish;
mod resolve;
mod stores;

use std::time::Duration;

use image_swapper_policy::policy::Policy;

use crate::coverage::Coverage;

/// Where the watch sends the policy's scope.
pub type ScopeSender = tokio::sync::watch::Sender<Option<Scope>>;

pub use publish::publish_every_period;
pub use stores::{Stores, Writers};

/// What the retention's part of the watch runs with (`--cluster-id`, `--in-use-repository`,
/// `--keep-for`, `--period`).
#[derive(Clone, Debug)]
pub struct Retention {
    pub cluster: String,
    /// The repository the set is pushed to under each mirror registry (its tag: `cluster`).
    pub repository: String,
    /// How long an entry no longer named stays in the set.
    pub keep_for: Duration,
    /// How often the set is computed and published again.
    pub period: Duration,
}

/// What the watch knows of the swapping policy: its settings, and which namespaces it covers.
/// The watch sends it whenever either changes; the set is computed with the latest.
#[derive(Clone, Debug)]
pub struct Scope {
    pub policy: Policy,
    pub coverage: Coverage,
}

impl Scope {
    /// Sends the settings in force and the coverage as they now are, once there are settings.
    pub fn share(to: Option<&ScopeSender>, policy: Option<&Policy>, coverage: &Coverage) {
        if let (Some(to), Some(policy)) = (to, policy) {
            to.send_replace(Some(Scope {
                policy: policy.clone(),
                coverage: coverage.clone(),
            }));
        }
    }
}
