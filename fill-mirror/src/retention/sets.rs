//! What the retention keeps in the mirror's in-use repository, read and written: every
//! cluster's in-use set (an OCI artifact tagged with the cluster id, written by the watch, only
//! read here) and the prune's own ledger (the same shape, tagged `_prune-ledger`: a cluster id
//! cannot start with `_`, so the two never meet).

use bytes::Bytes;
use image_swapper_policy::policy::Policy;

use crate::in_use_set::{InUseSet, MEDIA_TYPE, check_cluster_id};
use crate::mirror_api::Mirror;
use crate::oci_artifact::{push_artifact, read_artifact};
use crate::retention::plan::Ledger;

/// The ledger's tag in the in-use repository.
pub const LEDGER_TAG: &str = "_prune-ledger";
/// The ledger's `artifactType` and layer media type.
pub const LEDGER_MEDIA_TYPE: &str = "application/vnd.kubewarden.image-swapper.prune-ledger.v1+json";

/// The set `repository:cluster` (`host/path`) holds, checked to be that cluster's; None when
/// the tag names nothing. The watch reads its own back so before each publication.
pub async fn read_set(
    mirror: &Mirror,
    repository: &str,
    cluster: &str,
) -> Result<Option<InUseSet>, String> {
    let Some(layer) = read_artifact(mirror, repository, cluster, MEDIA_TYPE).await? else {
        return Ok(None);
    };
    let set: InUseSet = serde_json::from_slice(&layer)
        .map_err(|error| format!("{repository}:{cluster}: not an in-use set: {error}"))?;
    if set.cluster != cluster {
        return Err(format!(
            "{repository}:{cluster}: the set names cluster {:?}, not its tag",
            set.cluster
        ));
    }
    Ok(Some(set))
}

/// Every cluster's set in `repository` (`host/path`; its tags that are cluster ids), each
/// checked to be the set of the cluster its tag names. One that does not read is an error: the
/// prune cannot know what that cluster uses.
pub async fn read_sets(mirror: &Mirror, repository: &str) -> Result<Vec<InUseSet>, String> {
    let mut sets = Vec::new();
    for tag in mirror.tags(repository).await? {
        if check_cluster_id(&tag).is_err() {
            continue;
        }
        if let Some(set) = read_set(mirror, repository, &tag).await? {
            sets.push(set);
        }
    }
    Ok(sets)
}

/// The prune's ledger in `repository` (`host/path`); empty before its first run.
pub async fn read_ledger(mirror: &Mirror, repository: &str) -> Result<Ledger, String> {
    match read_artifact(mirror, repository, LEDGER_TAG, LEDGER_MEDIA_TYPE).await? {
        None => Ok(Ledger::default()),
        Some(layer) => serde_json::from_slice(&layer)
            .map_err(|error| format!("{repository}:{LEDGER_TAG}: not the prune's ledger: {error}")),
    }
}

/// Stores `ledger` as the artifact `repository:_prune-ledger` (the empty config, one layer).
pub async fn write_ledger(
    mirror: &Mirror,
    repository: &str,
    ledger: &Ledger,
) -> Result<(), String> {
    let layer = Bytes::from(serde_json::to_vec(ledger).map_err(|error| error.to_string())?);
    let annotations = serde_json::Map::new();
    push_artifact(
        mirror,
        repository,
        LEDGER_TAG,
        LEDGER_MEDIA_TYPE,
        layer,
        annotations,
    )
    .await
}

/// The mirror registries a policy pushes to, where the sets are published (its targets' hosts,
/// pull-through caches left out: they take no push), each once and sorted.
pub fn pushed_hosts(policy: &Policy) -> Vec<String> {
    let router = &policy.router;
    let mut hosts: Vec<String> = router
        .rules
        .iter()
        .flat_map(|rule| rule.targets.iter())
        .filter(|target| !target.pull_through)
        .map(|target| target.prefix.host().to_string())
        .chain(router.default_mirrors.iter().map(|p| p.host().to_string()))
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}
