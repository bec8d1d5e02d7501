//! What a registry's answers to a pull mean: the manifest types a warming accepts, which of
//! them is an index, a descriptor's digest and size, and a refusal told apart as throttling
//! (429, 5xx, `TOOMANYREQUESTS`) or failure. Apart from the walk (`pull.rs`) so that it reads
//! as the steps of a pull.

use std::time::Duration;

use hyper::body::Incoming;
use serde_json::Value;

use crate::registry_http::read_body;

/// The manifest types a warming accepts, as the `Accept` of a manifest request: OCI's and
/// Docker's image indexes and image manifests.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// Why a pull stopped.
#[derive(Debug)]
pub enum Failure {
    /// The registry answered 429 or 5xx, or said TOOMANYREQUESTS: its words, its `Retry-After`.
    Throttled(String, Option<Duration>),
    Failed(String),
}

impl From<String> for Failure {
    fn from(words: String) -> Failure {
        Failure::Failed(words)
    }
}

pub fn header(
    response: &http::Response<Incoming>,
    name: impl http::header::AsHeaderName,
) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string)
}

/// A descriptor's digest and size.
pub fn descriptor(entry: &Value, of: &str) -> Result<(String, Option<u64>), Failure> {
    let digest = entry
        .get("digest")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{of} lists a descriptor without a digest"))?;
    Ok((
        digest.to_string(),
        entry.get("size").and_then(Value::as_u64),
    ))
}

pub fn is_index(media_type: &str, document: &Value) -> bool {
    match media_type {
        OCI_INDEX | DOCKER_LIST => true,
        "" => document.get("manifests").is_some(),
        _ => false,
    }
}

pub fn is_manifest(media_type: &str, document: &Value) -> bool {
    match media_type {
        OCI_MANIFEST | DOCKER_MANIFEST => true,
        "" => document.get("config").is_some(),
        _ => false,
    }
}

/// A registry's answer other than 200 or 404: throttled when it says so (429, 5xx, or its
/// error code TOOMANYREQUESTS under another status), else failed; its status and first error.
pub async fn refusal(response: http::Response<Incoming>, url: &str) -> Failure {
    let status = response.status().as_u16();
    let retry_after = header(&response, http::header::RETRY_AFTER)
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let body = read_body(response, url, 64 << 10).await.unwrap_or_default();
    let errors: Value = serde_json::from_slice(&body).unwrap_or_default();
    let first = errors.pointer("/errors/0");
    let code = first
        .and_then(|e| e.get("code"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let message = first
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let words = format!("GET {url}: {status} {code} {message}")
        .trim_end()
        .to_string();
    if status == 429 || status >= 500 || code.eq_ignore_ascii_case("TOOMANYREQUESTS") {
        Failure::Throttled(words, retry_after)
    } else {
        Failure::Failed(words)
    }
}
