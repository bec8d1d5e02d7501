//! A pull-through cache that fills only on a tag, as an Amazon ECR pull-through cache rule does
//! (aws/containers-roadmap#2837): a manifest asked for by a digest the cache has not stored is
//! "not found" (ECR's `MANIFEST_UNKNOWN`, "Requested image not found"), even when the upstream
//! has it; a manifest asked for by a tag is copied from the upstream first (every platform,
//! digests preserved, by `skopeo`), then served. What is stored stays served, by tag and by
//! digest. Storage is a real registry; this front only decides when to fill it.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use super::registry::TestRegistry;

/// ECR's answer for a manifest it does not hold.
const NOT_FOUND: &str =
    r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"Requested image not found"}]}"#;

pub struct TagFilledCache {
    /// `127.0.0.1:PORT`: the cache's registry host, as images name it.
    pub host: String,
    /// How many times a tag request filled the cache from the upstream.
    pub fills: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl TagFilledCache {
    /// A cache of `upstream`, stored in `storage` (a plain registry of its own).
    pub fn start(upstream: &TestRegistry, storage: &TestRegistry) -> anyhow::Result<Self> {
        let fills = Arc::new(AtomicUsize::new(0));
        let front = Front {
            upstream: upstream.host.clone(),
            storage: storage.host.clone(),
            fills: fills.clone(),
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(20))
                .build(),
        };
        let (host, stop) =
            super::front::serve("cache front", move |request| front.answer(request))?;
        Ok(TagFilledCache { host, fills, stop })
    }
}

impl Drop for TagFilledCache {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

struct Front {
    upstream: String,
    storage: String,
    fills: Arc<AtomicUsize>,
    agent: ureq::Agent,
}

impl Front {
    fn answer(&self, request: tiny_http::Request) {
        let path = request.url().to_string();
        let accept = request
            .headers()
            .iter()
            .find(|h| h.field.equiv("Accept"))
            .map(|h| h.value.as_str().to_string())
            .unwrap_or_default();
        if let Some((repository, reference)) = manifest_path(&path)
            && !reference.contains(':')
            && !self.stored(&path, &accept)
        {
            self.fill(repository, reference);
        }
        // HEAD is answered from a GET's answer: the same headers, the body left out.
        let forwarded = self
            .agent
            .get(&format!("http://{}{path}", self.storage))
            .set("Accept", &accept)
            .call();
        let response = match forwarded {
            Ok(answer) => {
                let headers: Vec<tiny_http::Header> = ["Docker-Content-Digest", "Content-Type"]
                    .iter()
                    .filter_map(|name| {
                        let value = answer.header(name)?;
                        tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()).ok()
                    })
                    .collect();
                let mut body = Vec::new();
                let _ = std::io::Read::read_to_end(&mut answer.into_reader(), &mut body);
                let mut response = tiny_http::Response::from_data(body);
                for header in headers {
                    response.add_header(header);
                }
                response
            }
            Err(ureq::Error::Status(404, _)) if manifest_path(&path).is_some() => {
                json_response(404, NOT_FOUND)
            }
            Err(ureq::Error::Status(code, answer)) => {
                json_response(code, &answer.into_string().unwrap_or_default())
            }
            Err(error) => json_response(502, &format!("{{\"error\":{:?}}}", error.to_string())),
        };
        let _ = request.respond(response);
    }

    fn stored(&self, path: &str, accept: &str) -> bool {
        self.agent
            .head(&format!("http://{}{path}", self.storage))
            .set("Accept", accept)
            .call()
            .is_ok()
    }

    /// Copies `repository:tag` from the upstream into storage, whole. A tag the upstream lacks
    /// copies nothing, and the answer is then the storage's "not found".
    fn fill(&self, repository: &str, tag: &str) {
        let copied = Command::new("skopeo")
            .args([
                "--insecure-policy",
                "copy",
                "--all",
                "--preserve-digests",
                "--src-tls-verify=false",
                "--dest-tls-verify=false",
                &format!("docker://{}/{repository}:{tag}", self.upstream),
                &format!("docker://{}/{repository}:{tag}", self.storage),
            ])
            .output();
        if copied.is_ok_and(|output| output.status.success()) {
            self.fills.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `/v2/<repository>/manifests/<reference>` split, or None for another path.
fn manifest_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/v2/")?;
    let (repository, reference) = rest.rsplit_once("/manifests/")?;
    (!repository.is_empty() && !reference.is_empty()).then_some((repository, reference))
}

fn json_response(code: u16, body: &str) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let mut response =
        tiny_http::Response::from_data(body.as_bytes().to_vec()).with_status_code(code);
    if let Ok(header) =
        tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..])
    {
        response.add_header(header);
    }
    response
}
