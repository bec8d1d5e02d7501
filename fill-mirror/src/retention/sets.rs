//! What the retention keeps in the mirror's in-use repository, read and written: every
//! cluster's in-use set (an OCI artifact tagged with the cluster id, written by the watch, only
//! read here) and the prune's own ledger (the same shape, tagged `_prune-ledger`: a cluster id
//! cannot start with `_`, so the two never meet).

use bytes::Bytes;
use serde_json::{Value, json};

use crate::in_use_set::{InUseSet, MEDIA_TYPE, check_cluster_id};
use crate::retention::mirror::Mirror;
use crate::retention::plan::Ledger;

/// The ledger's tag in the in-use repository.
pub const LEDGER_TAG: &str = "_prune-ledger";
/// The ledger's `artifactType` and layer media type.
pub const LEDGER_MEDIA_TYPE: &str = "application/vnd.kubewarden.image-swapper.prune-ledger.v1+json";

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";

/// The one layer of `media_type` of the artifact `repository:tag`, or None when the tag names
/// nothing.
async fn read_artifact(
    mirror: &Mirror,
    repository: &str,
    tag: &str,
    media_type: &str,
) -> Result<Option<Bytes>, String> {
    let where_ = format!("{}/{repository}:{tag}", mirror.host);
    let Some(manifest) = mirror.manifest(repository, tag).await? else {
        return Ok(None);
    };
    let manifest: Value =
        serde_json::from_slice(&manifest).map_err(|error| format!("{where_}: {error}"))?;
    let layer = manifest
        .get("layers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|layer| layer.get("mediaType").and_then(Value::as_str) == Some(media_type))
        .and_then(|layer| layer.get("digest").and_then(Value::as_str))
        .ok_or_else(|| format!("{where_}: no layer of media type {media_type}"))?;
    let blob = mirror
        .blob(repository, layer)
        .await
        .map_err(|error| format!("{where_}: {error}"))?;
    Ok(Some(blob))
}

/// Every cluster's set in `repository` (its tags that are cluster ids), each checked to be the
/// set of the cluster its tag names. One that does not read is an error: the prune cannot know
/// what that cluster uses.
pub async fn read_sets(mirror: &Mirror, repository: &str) -> Result<Vec<InUseSet>, String> {
    let mut sets = Vec::new();
    for tag in mirror.tags(repository).await? {
        if check_cluster_id(&tag).is_err() {
            continue;
        }
        let where_ = format!("{}/{repository}:{tag}", mirror.host);
        let Some(layer) = read_artifact(mirror, repository, &tag, MEDIA_TYPE).await? else {
            continue;
        };
        let set: InUseSet = serde_json::from_slice(&layer)
            .map_err(|error| format!("{where_}: not an in-use set: {error}"))?;
        if set.cluster != tag {
            return Err(format!(
                "{where_}: the set names cluster {:?}, not its tag",
                set.cluster
            ));
        }
        sets.push(set);
    }
    Ok(sets)
}

/// The prune's ledger; empty before its first run.
pub async fn read_ledger(mirror: &Mirror, repository: &str) -> Result<Ledger, String> {
    match read_artifact(mirror, repository, LEDGER_TAG, LEDGER_MEDIA_TYPE).await? {
        None => Ok(Ledger::default()),
        Some(layer) => serde_json::from_slice(&layer).map_err(|error| {
            format!(
                "{}/{repository}:{LEDGER_TAG}: not the prune's ledger: {error}",
                mirror.host
            )
        }),
    }
}

/// Stores `ledger` as the artifact `repository:_prune-ledger` (the empty config, one layer).
pub async fn write_ledger(
    mirror: &Mirror,
    repository: &str,
    ledger: &Ledger,
) -> Result<(), String> {
    let layer = Bytes::from(serde_json::to_vec(ledger).map_err(|error| error.to_string())?);
    let empty = Bytes::from_static(b"{}");
    let layer_size = layer.len();
    let layer_digest = mirror.push_blob(repository, layer).await?;
    let empty_digest = mirror.push_blob(repository, empty).await?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": LEDGER_MEDIA_TYPE,
        "config": {"mediaType": EMPTY_MEDIA_TYPE, "digest": empty_digest, "size": 2},
        "layers": [{"mediaType": LEDGER_MEDIA_TYPE, "digest": layer_digest, "size": layer_size}],
    });
    let bytes = Bytes::from(manifest.to_string());
    mirror
        .put_manifest(repository, LEDGER_TAG, OCI_MANIFEST, bytes)
        .await
}
