//! The mirror's lists, which only the prune reads: the catalog and a repository's tags, each
//! followed page by page (distribution's `Link` to the next page).

use bytes::Bytes;
use http::Method;
use http::header::LINK;

use super::{Mirror, split_host};

/// The most a catalog page or a tag list may hold.
const LIST_LIMIT: usize = 16 << 20;
/// The most pages of a catalog or a tag list followed.
const MAX_PAGES: usize = 1000;

impl Mirror {
    /// Every page of a paged list (`Link: <…>; rel="next"`, within this origin), each page's
    /// `key` array of strings joined; None when the first page is a 404.
    async fn paged(
        &self,
        repository: &str,
        first: &str,
        key: &str,
    ) -> Result<Option<Vec<String>>, String> {
        let (host, _) = split_host(repository);
        let mut rest = first.to_string();
        let mut listed = Vec::new();
        for _ in 0..MAX_PAGES {
            let answer = self
                .call(
                    Method::GET,
                    repository,
                    &rest,
                    &[],
                    Bytes::new(),
                    LIST_LIMIT,
                )
                .await?;
            match answer.status {
                200 => {}
                404 if listed.is_empty() => return Ok(None),
                status => return Err(format!("GET {host}{rest}: {status}")),
            }
            let page: serde_json::Value = serde_json::from_slice(&answer.body)
                .map_err(|error| format!("GET {host}{rest}: {error}"))?;
            listed.extend(
                page.get(key)
                    .and_then(|v| v.as_array())
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_string)),
            );
            let next = answer
                .headers
                .get_all(LINK)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find_map(next_path);
            match next {
                Some(next) => rest = next,
                None => return Ok(Some(listed)),
            }
        }
        Err(format!("GET {host}{first}: more than {MAX_PAGES} pages"))
    }

    /// Every repository the registry `host` lists (`GET /v2/_catalog`).
    pub async fn catalog(&self, host: &str) -> Result<Vec<String>, String> {
        self.paged(host, "/v2/_catalog?n=1000", "repositories")
            .await?
            .ok_or_else(|| format!("{host}: the registry serves no catalog (404)"))
    }

    /// Every tag of `repository` (`host/path`); none when the registry knows no such repository.
    pub async fn tags(&self, repository: &str) -> Result<Vec<String>, String> {
        let (_, path) = split_host(repository);
        Ok(self
            .paged(repository, &format!("/v2/{path}/tags/list?n=1000"), "tags")
            .await?
            .unwrap_or_default())
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
