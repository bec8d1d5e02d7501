//! The registry requests the in-use set needs beyond a copy: a manifest read with its media
//! type, the same bytes put under another tag (an anchor), a blob pushed and read (the set's
//! layer). Over the binary's one HTTP client and logins (`registry_http.rs`), answering a
//! registry's challenge as the referrers client does; distribution-spec's endpoints.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use http::Method;
use http::header::{ACCEPT, CONTENT_TYPE, HeaderName, LOCATION};

use crate::digest::digest_of;
use crate::registry_http::{RegistryHttp, challenge, read_body};

/// Every manifest type a mirror may hold: OCI and Docker, images and indexes.
pub const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// The most a manifest (or the set's layer) may hold: distribution refuses manifests over 4 MiB.
const MANIFEST_LIMIT: usize = 4 << 20;
const SET_LIMIT: usize = 64 << 20;

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
    headers: http::HeaderMap,
    body: Bytes,
}

pub struct Mirror {
    http: RegistryHttp,
    /// The `Authorization` last answered per repository (`host/path`), sent first next time.
    authorizations: Mutex<HashMap<String, String>>,
}

impl Mirror {
    pub fn new(http: RegistryHttp) -> Mirror {
        Mirror {
            http,
            authorizations: Mutex::new(HashMap::new()),
        }
    }

    /// One request to `repository` (`host/path`) at `/v2/<path>/<rest>` (or at the absolute
    /// `rest` a `Location` gave), answered with the login of the host when it asks for one.
    async fn call(
        &self,
        method: Method,
        repository: &str,
        rest: &str,
        headers: &[(HeaderName, &str)],
        body: Bytes,
        limit: usize,
    ) -> Result<Answer, String> {
        let (host, path) = repository
            .split_once('/')
            .ok_or_else(|| format!("{repository:?} names no registry host"))?;
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
            .and_then(|a| a.get(repository).cloned());
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
            && let Some(challenge) = answer.headers.get(http::header::WWW_AUTHENTICATE)
        {
            let challenge = challenge.to_str().unwrap_or_default().to_string();
            let authorization = self.http.authorize(&challenge, host).await?;
            answer = self
                .once(method, &url, headers, Some(&authorization), body, limit)
                .await?;
            if let Ok(mut known) = self.authorizations.lock() {
                known.insert(repository.to_string(), authorization);
            }
        }
        Ok(answer)
    }

    async fn once(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, &str)],
        authorization: Option<&str>,
        body: Bytes,
        limit: usize,
    ) -> Result<Answer, String> {
        let response = self
            .http
            .request(method, url, headers, body, authorization)
            .await?;
        let status = response.status().as_u16();
        let mut headers = response.headers().clone();
        if challenge(&response).is_none() {
            headers.remove(http::header::WWW_AUTHENTICATE);
        }
        let body = read_body(response, url, limit).await?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// The manifest `reference` (a tag or a digest) names in `repository`; none when the
    /// registry has none (404).
    pub async fn manifest(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<Option<Manifest>, String> {
        let rest = format!("manifests/{reference}");
        let answer = self
            .call(
                Method::GET,
                repository,
                &rest,
                &[(ACCEPT, MANIFEST_TYPES)],
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
        let answer = self
            .call(
                Method::PUT,
                repository,
                &rest,
                &[(CONTENT_TYPE, &manifest.media_type)],
                manifest.bytes.clone(),
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

    /// Pushes `bytes` as a blob of `repository` unless it holds it (a monolithic upload:
    /// POST, then PUT with the digest).
    pub async fn push_blob(&self, repository: &str, bytes: &Bytes) -> Result<String, String> {
        let digest = digest_of(bytes);
        let head = self
            .call(
                Method::HEAD,
                repository,
                &format!("blobs/{digest}"),
                &[],
                Bytes::new(),
                0,
            )
            .await?;
        if head.status == 200 {
            return Ok(digest);
        }
        let started = self
            .call(
                Method::POST,
                repository,
                "blobs/uploads/",
                &[],
                Bytes::new(),
                MANIFEST_LIMIT,
            )
            .await?;
        let location = match (started.status, started.headers.get(LOCATION)) {
            (202, Some(location)) => location.to_str().unwrap_or_default().to_string(),
            (status, _) => {
                return Err(format!(
                    "POST {repository}/blobs/uploads/: {status}, no upload location"
                ));
            }
        };
        let separator = if location.contains('?') { '&' } else { '?' };
        let at = format!("{location}{separator}digest={digest}");
        let length = bytes.len().to_string();
        let put = self
            .call(
                Method::PUT,
                repository,
                &at,
                &[
                    (CONTENT_TYPE, "application/octet-stream"),
                    (http::header::CONTENT_LENGTH, &length),
                ],
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
            .call(Method::GET, repository, &rest, &[], Bytes::new(), SET_LIMIT)
            .await?;
        if matches!(answer.status, 301 | 302 | 303 | 307 | 308)
            && let Some(location) = answer.headers.get(LOCATION).and_then(|l| l.to_str().ok())
        {
            let location = location.to_string();
            answer = self
                .once(Method::GET, &location, &[], None, Bytes::new(), SET_LIMIT)
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
