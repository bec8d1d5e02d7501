//! One repository pulled through a cache as a node pulls it (distribution-spec "Pulling"): the
//! manifest the reference names, and under an image index only the manifests of the nodes'
//! platforms (every one when they are unknown); then each manifest's config and layers. Every
//! body is checked against the digest that names it: a manifest read whole (it is small), a
//! blob streamed and discarded chunk by chunk, so that a truncated or altered body is a failure
//! and nothing is ever held whole or written.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use image_swapper_policy::reference::Reference;
use serde_json::Value;

use super::answers::{
    DOCKER_LIST, DOCKER_MANIFEST, Failure, OCI_INDEX, OCI_MANIFEST, descriptor, header, is_index,
    is_manifest, refusal,
};
use crate::digest::{Streamed, digest_of};
use crate::platforms::Known;
use crate::registry_http::{RegistryHttp, challenge, read_body};

/// The largest manifest read (distribution's own limit for a manifest it accepts is 4 MiB).
const MANIFEST_LIMIT: usize = 4 << 20;

/// Blobs of one image pulled at once (containerd's default `max_concurrent_downloads`).
const BLOBS_AT_ONCE: usize = 3;

/// How long a blob's body may stay silent before the pull gives up on it.
const SILENCE: Duration = Duration::from_secs(60);

/// Redirects followed for one request (a blob is often served from object storage).
const MAX_REDIRECTS: usize = 5;

/// How an index nests: an index may list indexes, and no more.
const MAX_DEPTH: usize = 2;

/// The pulls of one repository: the `Authorization` its registry asked for, the blobs pulled
/// already (an old and a new digest share most), and what was read.
pub struct Pull<'a> {
    http: &'a RegistryHttp,
    known: &'a Known,
    /// The host the image names, whose login answers a challenge.
    host: String,
    /// `scheme://host` of its registry API.
    origin: String,
    /// `scheme://host/v2/<path>`.
    base: String,
    authorization: Mutex<Option<String>>,
    pulled: Mutex<HashSet<String>>,
    manifests: AtomicU64,
    bytes: AtomicU64,
}

impl<'a> Pull<'a> {
    pub fn new(http: &'a RegistryHttp, reference: &Reference, known: &'a Known) -> Pull<'a> {
        let host = reference.domain().to_string();
        let origin = http.origin(&host);
        Pull {
            base: format!("{origin}/v2/{}", reference.path()),
            origin,
            http,
            known,
            host,
            authorization: Mutex::new(None),
            pulled: Mutex::new(HashSet::new()),
            manifests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// Logs what was pulled for `image`.
    pub fn done(&self, image: &str) {
        let blobs = self.pulled.lock().map_or(0, |pulled| pulled.len());
        tracing::info!(
            %image,
            platforms = %self.known.describe(),
            manifests = self.manifests.load(Ordering::Relaxed),
            blobs,
            bytes = self.bytes.load(Ordering::Relaxed),
            "pulled through the cache, the bytes discarded"
        );
    }

    /// Pulls the image `reference` (a tag or a digest) names: the digest of its manifest;
    /// `None` when the cache says it has none (404).
    pub async fn image(&self, reference: &str) -> Result<Option<String>, Failure> {
        let expected = reference.contains(':').then_some(reference);
        let Some((digest, body, media_type)) = self.manifest(reference, expected, None).await?
        else {
            return Ok(None);
        };
        let mut pending = vec![(digest.clone(), body, media_type, 0)];
        while let Some((digest, body, media_type, depth)) = pending.pop() {
            let document: Value = serde_json::from_slice(&body)
                .map_err(|error| format!("the manifest {digest} is not JSON: {error}"))?;
            let media_type = document
                .get("mediaType")
                .and_then(Value::as_str)
                .map(str::to_string)
                .or(media_type)
                .unwrap_or_default();
            if is_index(&media_type, &document) {
                if depth >= MAX_DEPTH {
                    return Err(
                        format!("the index {digest} nests more than {MAX_DEPTH} deep").into(),
                    );
                }
                for entry in self.entries(&digest, &document) {
                    let (child, size) = descriptor(&entry, &digest)?;
                    let Some((_, body, media_type)) =
                        self.manifest(&child, Some(&child), size).await?
                    else {
                        return Err(format!(
                            "the index {digest} lists {child}, which the cache does not have"
                        )
                        .into());
                    };
                    pending.push((child, body, media_type, depth + 1));
                }
            } else if is_manifest(&media_type, &document) {
                self.blobs(&digest, &document).await?;
            } else {
                return Err(format!(
                    "{digest} is {media_type:?}: neither an image manifest nor an index (OCI or Docker v2)"
                )
                .into());
            }
        }
        Ok(Some(digest))
    }

    /// The entries of an index the nodes want; all, and said so, when their platforms are
    /// not known.
    fn entries(&self, digest: &str, index: &Value) -> Vec<Value> {
        let entries = index
            .get("manifests")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if let Known::Unknown(why) = self.known {
            tracing::info!(index = %digest, %why, "no node's platform is known: every platform of the index is pulled");
        }
        entries
            .into_iter()
            .filter(|entry| self.known.wants(entry))
            .collect()
    }

    /// A manifest, checked: by digest against it (and its size when an index names one), by
    /// tag against the `Docker-Content-Digest` the registry sends. Its digest, bytes and type.
    async fn manifest(
        &self,
        reference: &str,
        expected: Option<&str>,
        size: Option<u64>,
    ) -> Result<Option<(String, Bytes, Option<String>)>, Failure> {
        let url = format!("{}/manifests/{reference}", self.base);
        let accept = [OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST].join(", ");
        let response = self.get(&url, &accept).await?;
        match response.status().as_u16() {
            200 => {}
            404 => return Ok(None),
            _ => return Err(refusal(response, &url).await),
        }
        let media_type = header(&response, http::header::CONTENT_TYPE).map(|value| {
            value
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string()
        });
        let announced = header(&response, "docker-content-digest");
        let body = read_body(response, &url, MANIFEST_LIMIT).await?;
        let digest = match expected {
            Some(expected) => {
                let mut check = Streamed::new(expected, size)?;
                check.update(&body)?;
                check
                    .finish()
                    .map_err(|words| format!("GET {url}: {words}"))?;
                expected.to_string()
            }
            None => {
                let digest = digest_of(&body);
                if let Some(announced) = announced.filter(|a| a.starts_with("sha256:"))
                    && announced != digest
                {
                    return Err(format!("GET {url}: the registry says {announced} and the bytes that came are {digest}").into());
                }
                digest
            }
        };
        self.manifests.fetch_add(1, Ordering::Relaxed);
        Ok(Some((digest, body, media_type)))
    }

    /// A manifest's config and layers, a few at once, each once per pull; foreign layers (a
    /// registry does not serve them: the runtime fetches them from their `urls`) left out.
    async fn blobs(&self, manifest: &str, document: &Value) -> Result<(), Failure> {
        let mut wanted = Vec::new();
        let config = document.get("config").into_iter();
        let layers = document
            .get("layers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten();
        for entry in config.chain(layers) {
            let media_type = entry.get("mediaType").and_then(Value::as_str).unwrap_or("");
            if media_type.contains("foreign") || media_type.contains("nondistributable") {
                continue;
            }
            let (digest, size) = descriptor(entry, manifest)?;
            let fresh = self
                .pulled
                .lock()
                .map_or(true, |mut pulled| pulled.insert(digest.clone()));
            if fresh {
                wanted.push((digest, size));
            }
        }
        let mut streams = futures::stream::iter(wanted)
            .map(|(digest, size)| self.blob(manifest, digest, size))
            .buffer_unordered(BLOBS_AT_ONCE);
        while let Some(result) = streams.next().await {
            result?;
        }
        Ok(())
    }

    /// One blob streamed through the check and dropped, chunk by chunk.
    async fn blob(&self, manifest: &str, digest: String, size: Option<u64>) -> Result<(), Failure> {
        let url = format!("{}/blobs/{digest}", self.base);
        let response = self.get(&url, "*/*").await?;
        match response.status().as_u16() {
            200 => {}
            404 => {
                return Err(
                    format!("GET {url}: 404: the cache has not the blob {manifest} names").into(),
                );
            }
            _ => return Err(refusal(response, &url).await),
        }
        let mut check = Streamed::new(&digest, size)?;
        let mut body = response.into_body();
        loop {
            let frame = match tokio::time::timeout(SILENCE, body.frame()).await {
                Err(_) => {
                    return Err(format!(
                        "GET {url}: no byte for {SILENCE:?}, {} read",
                        check.seen()
                    )
                    .into());
                }
                Ok(None) => break,
                Ok(Some(Err(error))) => {
                    return Err(format!("GET {url}: {error}, {} bytes read", check.seen()).into());
                }
                Ok(Some(Ok(frame))) => frame,
            };
            if let Some(chunk) = frame.data_ref() {
                check
                    .update(chunk)
                    .map_err(|words| format!("GET {url}: {words}"))?;
            }
        }
        let read = check.seen();
        check
            .finish()
            .map_err(|words| format!("GET {url}: {words}"))?;
        self.bytes.fetch_add(read, Ordering::Relaxed);
        Ok(())
    }

    /// A GET with the repository's `Authorization`, asked for again when the registry
    /// challenges it (a first request, an expired token); redirects followed, the
    /// `Authorization` kept only for the same origin (a presigned object storage URL carries
    /// its own).
    async fn get(&self, url: &str, accept: &str) -> Result<http::Response<Incoming>, Failure> {
        let mut url = url.to_string();
        let mut retried = false;
        for _ in 0..=MAX_REDIRECTS {
            let same_origin = url
                .strip_prefix(&self.origin)
                .is_some_and(|rest| rest.starts_with('/'));
            let authorization = if same_origin {
                self.authorization.lock().ok().and_then(|a| a.clone())
            } else {
                None
            };
            let response = self
                .http
                .send(&url, accept, authorization.as_deref())
                .await?;
            let status = response.status();
            if status == http::StatusCode::UNAUTHORIZED
                && same_origin
                && !retried
                && let Some(challenge) = challenge(&response)
            {
                retried = true;
                let answered = self.http.authorize(&challenge, &self.host).await?;
                if let Ok(mut authorization) = self.authorization.lock() {
                    *authorization = Some(answered);
                }
                continue;
            }
            if status.is_redirection()
                && let Some(location) = header(&response, http::header::LOCATION)
            {
                url = if location.starts_with('/') {
                    format!("{}{location}", self.origin)
                } else {
                    location
                };
                continue;
            }
            return Ok(response);
        }
        Err(format!("GET {url}: more than {MAX_REDIRECTS} redirects").into())
    }
}
