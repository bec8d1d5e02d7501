//! The one client of a mirror registry's distribution API that the in-use set's publishing and
//! the prune share: the catalog, tag lists, manifests read, resolved, put and deleted, blobs
//! pushed and read. Over the binary's one HTTP client and logins (`registry_http.rs`),
//! answering a registry's Basic or Bearer challenge as the referrers client does.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HeaderName, LOCATION};
use http::{HeaderMap, Method};

mod lists;
mod untag;

use crate::digest::digest_of;
use crate::registry_http::{RegistryHttp, challenge, read_body};

/// Every manifest type a mirror may hold: OCI and Docker, images and indexes.
const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// The most a manifest may hold: distribution refuses manifests over 4 MiB.
const MANIFEST_LIMIT: usize = 4 << 20;
/// The most a blob read whole may hold (an in-use set's layer, the prune's ledger).
const BLOB_LIMIT: usize = 64 << 20;

/// A manifest as the registry serves it: its bytes (their digest is the manifest's), and the
/// media type to send it back with.
#[derive(Clone, Debug)]
pub struct Manifest {
    pub bytes: Bytes,
    pub media_type: String,
    pub digest: String,
}

/// A registry's answer, its body read.
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
}

/// The mirror registries, and the `Authorization` each last challenge was answered with: a
/// Bearer token under the repository (`host/path`) it was asked for (its scope), a Basic login
/// under the host (it holds for every repository); the repository's first, then the host's.
pub struct Mirror {
    http: RegistryHttp,
    authorizations: Mutex<HashMap<String, String>>,
}

/// `host/path` split at the host (the path empty for a bare host).
pub fn split_host(repository: &str) -> (&str, &str) {
    repository.split_once('/').unwrap_or((repository, ""))
}

impl Mirror {
    pub fn new(http: RegistryHttp) -> Mirror {
        Mirror {
            http,
            authorizations: Mutex::new(HashMap::new()),
        }
    }

    /// One request about `repository` (`host/path`, or a bare host for the catalog) to
    /// `/v2/<path>/<rest>`, to the absolute path `rest` (a `Link`'s, a `Location`'s) or to the
    /// URL `rest`, answered with the login of the host when a challenge asks for one (again
    /// when a Bearer token's scope does not cover this request: a deletion's, an upload's).
    async fn call(
        &self,
        method: Method,
        repository: &str,
        rest: &str,
        headers: &[(HeaderName, &str)],
        body: Bytes,
        limit: usize,
    ) -> Result<Answer, String> {
        let (host, path) = split_host(repository);
        let url = if rest.starts_with("http://") || rest.starts_with("https://") {
            rest.to_string()
        } else if rest.starts_with('/') {
            format!("{}{rest}", self.http.origin(host))
        } else {
            format!("{}/v2/{path}/{rest}", self.http.origin(host))
        };
        let known = self
            .authorizations
            .lock()
            .ok()
            .and_then(|known| known.get(repository).or_else(|| known.get(host)).cloned());
        let mut answer = self
            .once(
                method.clone(),
                &url,
                headers,
                known.as_deref(),
                body.clone(),
                limit,
            )
            .await?;
        if answer.status == 401
            && let Some(asked) = answer.headers.get(http::header::WWW_AUTHENTICATE)
        {
            let asked = asked.to_str().unwrap_or_default().to_string();
            let authorization = self.http.authorize(&asked, host).await?;
            answer = self
                .once(method, &url, headers, Some(&authorization), body, limit)
                .await?;
            let under = if authorization.starts_with("Basic ") {
                host
            } else {
                repository
            };
            if let Ok(mut known) = self.authorizations.lock() {
                known.insert(under.to_string(), authorization);
            }
        }
        Ok(answer)
    }

    /// One request as it is, its body read (none for a HEAD); a challenge other than Basic or
    /// Bearer is left out of the headers (nothing answers it).
    async fn once(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, &str)],
        authorization: Option<&str>,
        body: Bytes,
        limit: usize,
    ) -> Result<Answer, String> {
        let head = method == Method::HEAD;
        let response = self
            .http
            .request(method, url, headers, body, authorization)
            .await?;
        let status = response.status().as_u16();
        let mut headers = response.headers().clone();
        if challenge(&response).is_none() {
            headers.remove(http::header::WWW_AUTHENTICATE);
        }
        let body = if head {
            Bytes::new()
        } else {
            read_body(response, url, limit).await?
        };
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// The digest `repository:reference` names, or None when it names nothing.
    pub async fn resolve(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<Option<String>, String> {
        let rest = format!("manifests/{reference}");
        let accept = [(ACCEPT, MANIFEST_TYPES)];
        let answer = self
            .call(Method::HEAD, repository, &rest, &accept, Bytes::new(), 0)
            .await?;
        match answer.status {
            200 => answer
                .headers
                .get("docker-content-digest")
                .and_then(|v| v.to_str().ok())
                .map(|digest| Some(digest.to_string()))
                .ok_or_else(|| {
                    format!("HEAD {repository}/{rest}: 200 without a Docker-Content-Digest")
                }),
            404 => Ok(None),
            status => Err(format!("HEAD {repository}/{rest}: {status}")),
        }
    }

    /// The manifest `reference` (a tag or a digest) names in `repository`; none when the
    /// registry has none (404).
    pub async fn manifest(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<Option<Manifest>, String> {
        let rest = format!("manifests/{reference}");
        let accept = [(ACCEPT, MANIFEST_TYPES)];
        let answer = self
            .call(
                Method::GET,
                repository,
                &rest,
                &accept,
                Bytes::new(),
                MANIFEST_LIMIT,
            )
            .await?;
        match answer.status {
            200 => {}
            404 => return Ok(None),
            status => return Err(format!("GET {repository}/{rest}: {status}")),
        }
        let digest = digest_of(&answer.body);
        if reference.starts_with("sha256:") && reference != digest {
            return Err(format!(
                "GET {repository}/{rest}: the bytes that came are {digest}"
            ));
        }
        // The manifest's own `mediaType` first: what the registry sends back as Content-Type
        // may be a default for a manifest that names none.
        let own = serde_json::from_slice::<serde_json::Value>(&answer.body)
            .ok()
            .and_then(|m| m.get("mediaType")?.as_str().map(str::to_string));
        let header = answer
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_string());
        let media_type = own
            .or(header)
            .ok_or_else(|| format!("GET {repository}/{rest}: no media type"))?;
        Ok(Some(Manifest {
            bytes: answer.body,
            media_type,
            digest,
        }))
    }

    /// Puts `manifest`'s exact bytes under `tag` in `repository`, with its own media type.
    pub async fn put_manifest(
        &self,
        repository: &str,
        tag: &str,
        manifest: &Manifest,
    ) -> Result<(), String> {
        let rest = format!("manifests/{tag}");
        let content_type = [(CONTENT_TYPE, manifest.media_type.as_str())];
        let bytes = manifest.bytes.clone();
        let answer = self
            .call(
                Method::PUT,
                repository,
                &rest,
                &content_type,
                bytes,
                MANIFEST_LIMIT,
            )
            .await?;
        match answer.status {
            200..=202 => Ok(()),
            status => Err(format!(
                "PUT {repository}/{rest}: {status} {}",
                String::from_utf8_lossy(&answer.body)
            )),
        }
    }

    /// Deletes the manifest `digest` of `repository`, with every tag that names it; one gone
    /// already is not a failure. distribution answers 405 where deletion is not enabled.
    pub async fn delete(&self, repository: &str, digest: &str) -> Result<(), String> {
        let rest = format!("manifests/{digest}");
        let answer = self
            .call(
                Method::DELETE,
                repository,
                &rest,
                &[],
                Bytes::new(),
                MANIFEST_LIMIT,
            )
            .await?;
        match answer.status {
            202 | 200 | 404 => Ok(()),
            405 => Err(format!(
                "DELETE {repository}/{rest}: 405, the registry does not allow deletions (distribution: storage.delete.enabled, REGISTRY_STORAGE_DELETE_ENABLED=true)"
            )),
            status => Err(format!("DELETE {repository}/{rest}: {status}")),
        }
    }

    /// Pushes `bytes` as a blob of `repository` unless it holds it (a monolithic upload: POST,
    /// then PUT with the digest, never to another origin than the registry's: the login would
    /// go with it).
    pub async fn push_blob(&self, repository: &str, bytes: &Bytes) -> Result<String, String> {
        let digest = digest_of(bytes);
        let blob = format!("blobs/{digest}");
        let head = self
            .call(Method::HEAD, repository, &blob, &[], Bytes::new(), 0)
            .await?;
        if head.status == 200 {
            return Ok(digest);
        }
        let start = "blobs/uploads/";
        let started = self
            .call(
                Method::POST,
                repository,
                start,
                &[],
                Bytes::new(),
                MANIFEST_LIMIT,
            )
            .await?;
        let location = started
            .headers
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .filter(|_| started.status == 202)
            .ok_or_else(|| {
                format!(
                    "POST {repository}/{start}: {}, no upload location",
                    started.status
                )
            })?;
        let origin = self.http.origin(split_host(repository).0);
        if location.contains("://") && !location.starts_with(&format!("{origin}/")) {
            return Err(format!(
                "POST {repository}/{start}: the upload's Location is another origin ({location}): not followed"
            ));
        }
        let separator = if location.contains('?') { '&' } else { '?' };
        let at = format!("{location}{separator}digest={digest}");
        let length = bytes.len().to_string();
        let octets = [
            (CONTENT_TYPE, "application/octet-stream"),
            (CONTENT_LENGTH, length.as_str()),
        ];
        let put = self
            .call(
                Method::PUT,
                repository,
                &at,
                &octets,
                bytes.clone(),
                MANIFEST_LIMIT,
            )
            .await?;
        match put.status {
            201 | 204 => Ok(digest),
            status => Err(format!("PUT the blob {digest} of {repository}: {status}")),
        }
    }

    /// The blob `digest` of `repository`, checked against its digest; one redirect followed
    /// (a registry whose storage serves blobs elsewhere), without the registry's login.
    pub async fn blob(&self, repository: &str, digest: &str) -> Result<Bytes, String> {
        let rest = format!("blobs/{digest}");
        let mut answer = self
            .call(
                Method::GET,
                repository,
                &rest,
                &[],
                Bytes::new(),
                BLOB_LIMIT,
            )
            .await?;
        if matches!(answer.status, 301 | 302 | 303 | 307 | 308)
            && let Some(location) = answer.headers.get(LOCATION).and_then(|l| l.to_str().ok())
        {
            let location = location.to_string();
            answer = self
                .once(Method::GET, &location, &[], None, Bytes::new(), BLOB_LIMIT)
                .await?;
        }
        if answer.status != 200 {
            return Err(format!("GET {repository}/{rest}: {}", answer.status));
        }
        if digest_of(&answer.body) != digest {
            return Err(format!(
                "GET {repository}/{rest}: the bytes are not {digest}"
            ));
        }
        Ok(answer.body)
    }
}
