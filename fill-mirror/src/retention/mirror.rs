//! The retention's requests to one mirror registry (distribution-spec's API: the catalog, tag
//! lists, manifests, blobs, uploads and the deletion of a manifest by digest), on the binary's
//! one HTTP client (`registry_http.rs`) with the login it holds for the host, answering a
//! registry's Basic or Bearer challenge as the referrers' client does.

use std::sync::Mutex;

use bytes::Bytes;
use http::{HeaderMap, Method, header};

use crate::digest::digest_of;
use crate::registry_http::{RegistryHttp, challenge, read_body};

/// The manifests' media types a manifest request accepts.
pub const MANIFESTS: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// The most a catalog page, a tag list, a manifest or a set may hold.
const LIMIT: usize = 16 << 20;

/// The most pages of a catalog or a tag list followed.
const MAX_PAGES: usize = 1000;

/// A registry's answer, its body read whole.
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// One mirror registry, and the `Authorization` its last challenge was answered with.
pub struct Mirror {
    http: RegistryHttp,
    /// `host[:port]`, as images name it: the login is looked up under it.
    pub host: String,
    origin: String,
    authorization: Mutex<Option<String>>,
}

impl Mirror {
    pub fn new(http: RegistryHttp, host: &str) -> Mirror {
        Mirror {
            origin: http.origin(host),
            http,
            host: host.to_string(),
            authorization: Mutex::new(None),
        }
    }

    /// `METHOD origin+path`, answered with the login when a challenge asks for one (again
    /// when a Bearer token's scope does not cover this request: a deletion's, an upload's).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        headers: &[(http::HeaderName, &str)],
        body: Bytes,
    ) -> Result<Answer, String> {
        let url = if path.starts_with("http://") || path.starts_with("https://") {
            path.to_string()
        } else {
            format!("{}{path}", self.origin)
        };
        let mut tried_fresh = false;
        loop {
            let authorization = self.authorization.lock().map_or(None, |a| a.clone());
            let response = self
                .http
                .request(
                    method.clone(),
                    &url,
                    headers,
                    body.clone(),
                    authorization.as_deref(),
                )
                .await?;
            let status = response.status().as_u16();
            if let (401, Some(asked), false) = (status, challenge(&response), tried_fresh) {
                let answered = self.http.authorize(&asked, &self.host).await?;
                if let Ok(mut slot) = self.authorization.lock() {
                    *slot = Some(answered);
                }
                tried_fresh = true;
                continue;
            }
            let headers = response.headers().clone();
            let body = if method == Method::HEAD {
                Bytes::new()
            } else {
                read_body(response, &url, LIMIT).await?
            };
            return Ok(Answer {
                status,
                headers,
                body,
            });
        }
    }

    /// Every page of a paged list (`Link: <…>; rel="next"`, within this origin), each page's
    /// `key` array of strings joined; None when the first page is a 404.
    async fn paged(&self, first: &str, key: &str) -> Result<Option<Vec<String>>, String> {
        let mut path = first.to_string();
        let mut listed = Vec::new();
        for _ in 0..MAX_PAGES {
            let answer = self.call(Method::GET, &path, &[], Bytes::new()).await?;
            match answer.status {
                200 => {}
                404 if listed.is_empty() => return Ok(None),
                status => return Err(format!("GET {}{path}: {status}", self.origin)),
            }
            let page: serde_json::Value = serde_json::from_slice(&answer.body)
                .map_err(|error| format!("GET {}{path}: {error}", self.origin))?;
            listed.extend(
                page.get(key)
                    .and_then(|v| v.as_array())
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_string)),
            );
            let next = answer
                .headers
                .get_all(header::LINK)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find_map(next_path);
            match next {
                Some(next) => path = next,
                None => return Ok(Some(listed)),
            }
        }
        Err(format!(
            "GET {}{first}: more than {MAX_PAGES} pages",
            self.origin
        ))
    }

    /// Every repository the registry lists (`GET /v2/_catalog`).
    pub async fn catalog(&self) -> Result<Vec<String>, String> {
        self.paged("/v2/_catalog?n=1000", "repositories")
            .await?
            .ok_or_else(|| format!("{}: the registry serves no catalog (404)", self.host))
    }

    /// Every tag of `repository`; none when the registry knows no such repository.
    pub async fn tags(&self, repository: &str) -> Result<Vec<String>, String> {
        Ok(self
            .paged(&format!("/v2/{repository}/tags/list?n=1000"), "tags")
            .await?
            .unwrap_or_default())
    }

    /// The digest `repository:reference` names, or None when it names nothing.
    pub async fn resolve(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<Option<String>, String> {
        let path = format!("/v2/{repository}/manifests/{reference}");
        let answer = self
            .call(
                Method::HEAD,
                &path,
                &[(header::ACCEPT, MANIFESTS)],
                Bytes::new(),
            )
            .await?;
        match answer.status {
            200 => answer
                .headers
                .get("docker-content-digest")
                .and_then(|v| v.to_str().ok())
                .map(|digest| Some(digest.to_string()))
                .ok_or_else(|| format!("HEAD {path}: 200 without a Docker-Content-Digest")),
            404 => Ok(None),
            status => Err(format!("HEAD {}{path}: {status}", self.origin)),
        }
    }

    /// The manifest `repository:reference` names, as bytes, or None when it names nothing.
    pub async fn manifest(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<Option<Bytes>, String> {
        let path = format!("/v2/{repository}/manifests/{reference}");
        let answer = self
            .call(
                Method::GET,
                &path,
                &[(header::ACCEPT, MANIFESTS)],
                Bytes::new(),
            )
            .await?;
        match answer.status {
            200 => Ok(Some(answer.body)),
            404 => Ok(None),
            status => Err(format!("GET {}{path}: {status}", self.origin)),
        }
    }

    /// The blob `digest` of `repository`, checked against its digest.
    pub async fn blob(&self, repository: &str, digest: &str) -> Result<Bytes, String> {
        let path = format!("/v2/{repository}/blobs/{digest}");
        let answer = self.call(Method::GET, &path, &[], Bytes::new()).await?;
        if answer.status != 200 {
            return Err(format!("GET {}{path}: {}", self.origin, answer.status));
        }
        if digest_of(&answer.body) != digest {
            return Err(format!(
                "GET {}{path}: the bytes are not the blob named",
                self.origin
            ));
        }
        Ok(answer.body)
    }

    /// Uploads `bytes` as a blob of `repository` (a monolithic upload) unless it is there.
    pub async fn push_blob(&self, repository: &str, bytes: Bytes) -> Result<String, String> {
        let digest = digest_of(&bytes);
        let head = format!("/v2/{repository}/blobs/{digest}");
        if self
            .call(Method::HEAD, &head, &[], Bytes::new())
            .await?
            .status
            == 200
        {
            return Ok(digest);
        }
        let start = format!("/v2/{repository}/blobs/uploads/");
        let started = self.call(Method::POST, &start, &[], Bytes::new()).await?;
        let location = started
            .headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .filter(|_| started.status == 202)
            .ok_or_else(|| {
                format!(
                    "POST {}{start}: {} without a Location",
                    self.origin, started.status
                )
            })?;
        if location.contains("://") && !location.starts_with(&format!("{}/", self.origin)) {
            return Err(format!(
                "POST {}{start}: the upload's Location is another origin ({location}): not followed",
                self.origin
            ));
        }
        let separator = if location.contains('?') { '&' } else { '?' };
        let put = format!("{location}{separator}digest={digest}");
        let octets = [(header::CONTENT_TYPE, "application/octet-stream")];
        let finished = self.call(Method::PUT, &put, &octets, bytes).await?;
        match finished.status {
            201 => Ok(digest),
            status => Err(format!("PUT {}{start}…: {status}", self.origin)),
        }
    }

    /// Puts `bytes` as the manifest `repository:tag`.
    pub async fn put_manifest(
        &self,
        repository: &str,
        tag: &str,
        media_type: &str,
        bytes: Bytes,
    ) -> Result<(), String> {
        let path = format!("/v2/{repository}/manifests/{tag}");
        let answer = self
            .call(
                Method::PUT,
                &path,
                &[(header::CONTENT_TYPE, media_type)],
                bytes,
            )
            .await?;
        match answer.status {
            201 => Ok(()),
            status => Err(format!("PUT {}{path}: {status}", self.origin)),
        }
    }

    /// Deletes the manifest `digest` of `repository`, with every tag that names it; one gone
    /// already is not a failure. distribution answers 405 where deletion is not enabled.
    pub async fn delete(&self, repository: &str, digest: &str) -> Result<(), String> {
        let path = format!("/v2/{repository}/manifests/{digest}");
        let answer = self.call(Method::DELETE, &path, &[], Bytes::new()).await?;
        match answer.status {
            202 | 200 | 404 => Ok(()),
            405 => Err(format!(
                "DELETE {}{path}: 405, the registry does not allow deletions (distribution: storage.delete.enabled, REGISTRY_STORAGE_DELETE_ENABLED=true)",
                self.origin
            )),
            status => Err(format!("DELETE {}{path}: {status}", self.origin)),
        }
    }
}

/// The path of a `Link: <…>; rel="next"` value (RFC 8288), when it stays on this origin:
/// distribution names the next page by its path.
fn next_path(value: &str) -> Option<String> {
    value.split(',').find_map(|link| {
        let (target, params) = link.trim().strip_prefix('<')?.split_once('>')?;
        let next = params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"");
        (next && target.starts_with('/') && !target.starts_with("//")).then(|| target.to_string())
    })
}
