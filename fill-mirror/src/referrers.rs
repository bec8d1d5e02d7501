//! The OCI 1.1 referrers API (`GET /v2/<name>/referrers/<digest>`, distribution-spec v1.1
//! "Listing Referrers"): the one registry request skopeo cannot make, so it is made here, with
//! the binary's own client and the login skopeo would get (`registry_http.rs`), so that a
//! private source's referrers travel as its image does. A registry that does not serve it
//! answers 404; then the tag schema (`sha256-<hex>`) is read instead (`attached.rs`).

use bytes::Bytes;
use serde_json::Value;

use crate::registry_http::{RegistryHttp, challenge, read_body};

/// What the index's `Accept` asks for: the referrers API answers with an OCI image index.
const INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// The most pages of one referrers answer read: a registry that pages without end is not
/// followed for ever.
const MAX_PAGES: usize = 100;

/// The most one page may hold: 16 MiB of descriptors is tens of thousands of referrers.
const PAGE_LIMIT: usize = 16 << 20;

/// A registry's answer: its status, its body, and the next page its `Link` names.
struct Answer {
    status: u16,
    body: Bytes,
    next: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Referrers {
    http: RegistryHttp,
}

impl Referrers {
    pub fn new(http: RegistryHttp) -> Referrers {
        Referrers { http }
    }

    /// This client, asking `host` anonymously (a copy whose requesters may not use its login).
    pub fn anonymous_at(&self, host: Option<String>) -> Referrers {
        Referrers {
            http: self.http.anonymous_at(host),
        }
    }

    /// The digests of the manifests that name `digest` as their `subject` in `repository`
    /// (`host/path`): `None` when the registry does not serve the referrers API (404).
    pub async fn list(
        &self,
        repository: &str,
        digest: &str,
    ) -> Result<Option<Vec<String>>, String> {
        let (host, path) = repository
            .split_once('/')
            .ok_or_else(|| format!("{repository:?} names no registry host"))?;
        let origin = self.http.origin(host);
        let mut url = format!("{origin}/v2/{path}/referrers/{digest}");
        // The `Authorization` sent once a challenge asked for one.
        let mut authorization: Option<String> = None;
        let mut listed = Vec::new();
        // A registry may page the answer: each page names the next in `Link` (`rel="next"`).
        for _ in 0..MAX_PAGES {
            let (mut answer, challenge) = self.get(&url, authorization.as_deref()).await?;
            if let (401, Some(challenge), None) = (answer.status, challenge, &authorization) {
                // The login of the host the image names (`docker.io`, not its API host).
                let answered = self.http.authorize(&challenge, host).await?;
                answer = self.get(&url, Some(&answered)).await?.0;
                authorization = Some(answered);
            }
            match answer.status {
                200 => listed.extend(
                    index_digests(&answer.body)
                        .ok_or_else(|| format!("GET {url}: 200 without an image index"))?,
                ),
                404 if listed.is_empty() => return Ok(None),
                status => return Err(format!("GET {url}: {status}")),
            }
            // The next page only from the same origin (scheme, host and port): the
            // `Authorization` goes with the request, and a registry's `Link` must not send it
            // (or the controller) anywhere else, plain `http://` included.
            url = match answer.next {
                Some(next) if next.starts_with('/') && !next.starts_with("//") => {
                    format!("{origin}{next}")
                }
                Some(next) if same_origin(&next, &origin) => next,
                Some(next) => {
                    return Err(format!(
                        "GET {url}: the next page's Link names another origin than {origin} ({next}): not followed, the registry's credentials stay with it"
                    ));
                }
                None => return Ok(Some(listed)),
            };
        }
        Err(format!(
            "GET {url}: more than {MAX_PAGES} pages of referrers"
        ))
    }

    /// One GET: the answer, and a Basic or Bearer challenge when one came.
    async fn get(
        &self,
        url: &str,
        authorization: Option<&str>,
    ) -> Result<(Answer, Option<String>), String> {
        let response = self.http.send(url, INDEX, authorization).await?;
        let status = response.status().as_u16();
        let challenge = challenge(&response);
        let next = response
            .headers()
            .get_all(http::header::LINK)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .find_map(next_link);
        let body = read_body(response, url, PAGE_LIMIT).await?;
        Ok((Answer { status, body, next }, challenge))
    }
}

/// Whether the absolute `url` lies under `origin` (`scheme://host[:port]`, no path): the same
/// scheme, host and port, and nothing after them but a path or a query.
fn same_origin(url: &str, origin: &str) -> bool {
    url.strip_prefix(origin)
        .is_some_and(|rest| rest.starts_with('/') || rest.starts_with('?'))
}

/// The target of a `Link: <…>; rel="next"` value (RFC 8288), as distribution-spec pages with.
fn next_link(value: &str) -> Option<String> {
    value.split(',').find_map(|link| {
        let (target, params) = link.trim().strip_prefix('<')?.split_once('>')?;
        params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"")
            .then(|| target.to_string())
    })
}

/// The digests an image index lists, when `body` is one.
pub fn index_digests(body: &[u8]) -> Option<Vec<String>> {
    let index: Value = serde_json::from_slice(body).ok()?;
    let manifests = index.get("manifests")?.as_array()?;
    Some(
        manifests
            .iter()
            .filter_map(|m| m.get("digest")?.as_str().map(str::to_string))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The next page's `Link` is followed only within the origin the first page came from.
    #[test]
    fn a_next_page_is_followed_only_within_its_origin() {
        let origin = "https://registry.example.com:5000";
        for same in [
            "https://registry.example.com:5000/v2/org/app/referrers/sha256:a?n=2",
            "https://registry.example.com:5000?last=x",
        ] {
            assert!(same_origin(same, origin), "{same}");
        }
        for other in [
            "http://registry.example.com:5000/v2/org/app/referrers/sha256:a",
            "https://registry.example.com/v2/",
            "https://registry.example.com:50001/v2/",
            "https://registry.example.com:5000@attacker.example/v2/",
            "https://registry.example.com:5000.attacker.example/v2/",
            "https://attacker.example/v2/",
        ] {
            assert!(!same_origin(other, origin), "{other}");
        }
    }
}
