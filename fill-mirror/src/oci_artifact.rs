//! The records fill-mirror keeps in the mirror itself (each cluster's in-use set, the prune's
//! ledger) as OCI artifacts of one shape, written and read here for both: the empty config and
//! one JSON layer of the record's media type (also the `artifactType`), under a tag.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::digest::digest_of;
use crate::mirror_api::{Manifest, Mirror};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";

/// Pushes `layer` as the artifact `repository:tag` (`host/path`), of `media_type`, with
/// `annotations` on its manifest (none when empty).
pub async fn push_artifact(
    mirror: &Mirror,
    repository: &str,
    tag: &str,
    media_type: &str,
    layer: Bytes,
    annotations: Map<String, Value>,
) -> Result<(), String> {
    let empty = Bytes::from_static(b"{}");
    let layer_digest = mirror.push_blob(repository, &layer).await?;
    let empty_digest = mirror.push_blob(repository, &empty).await?;
    let mut manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": media_type,
        "config": {"mediaType": EMPTY_MEDIA_TYPE, "digest": empty_digest, "size": empty.len(), "data": "e30="},
        "layers": [{"mediaType": media_type, "digest": layer_digest, "size": layer.len()}],
    });
    if !annotations.is_empty() {
        manifest["annotations"] = Value::Object(annotations);
    }
    let bytes = Bytes::from(manifest.to_string());
    let manifest = Manifest {
        digest: digest_of(&bytes),
        bytes,
        media_type: OCI_MANIFEST.to_string(),
    };
    mirror.put_manifest(repository, tag, &manifest).await
}

/// The one layer of `media_type` of the artifact `repository:tag` (`host/path`), or None when
/// the tag names nothing.
pub async fn read_artifact(
    mirror: &Mirror,
    repository: &str,
    tag: &str,
    media_type: &str,
) -> Result<Option<Bytes>, String> {
    let Some(manifest) = mirror.manifest(repository, tag).await? else {
        return Ok(None);
    };
    let manifest: Value = serde_json::from_slice(&manifest.bytes)
        .map_err(|error| format!("{repository}:{tag}: {error}"))?;
    let layer = manifest
        .get("layers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|layer| layer.get("mediaType").and_then(Value::as_str) == Some(media_type))
        .and_then(|layer| layer.get("digest").and_then(Value::as_str))
        .ok_or_else(|| format!("{repository}:{tag}: no layer of media type {media_type}"))?;
    let blob = mirror
        .blob(repository, layer)
        .await
        .map_err(|error| format!("{repository}:{tag}: {error}"))?;
    Ok(Some(blob))
}
