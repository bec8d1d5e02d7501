//! The OCI 1.1 referrers API (`GET /v2/<name>/referrers/<digest>`, distribution-spec v1.1
//! "Listing Referrers"): the one registry request skopeo cannot make, so it is made here, over
//! the same TLS stack as the rest of the binary (rustls with ring). A registry that does not
//! serve it answers 404; then the tag schema (`sha256-<hex>`) is read instead (`attached.rs`).
//! With the login skopeo gets for the host (the merged auth file: the user's entry, or the
//! binary's own ECR or Artifact Registry token), sent only when the registry asks for one: to a
//! `WWW-Authenticate: Basic` challenge as Basic, to a `Bearer realm=…` challenge by the Docker
//! registry token protocol (the realm asked for a token with the login, anonymously without
//! one), so that a private source's referrers travel as its image does.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::credentials::Access;

/// What the index's `Accept` asks for: the referrers API answers with an OCI image index.
const INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The most pages of one referrers answer read: a registry that pages without end is not
/// followed for ever.
const MAX_PAGES: usize = 100;

/// A registry's answer: its status, its body, and the next page its `Link` names.
struct Answer {
    status: u16,
    body: Bytes,
    next: Option<String>,
}

#[derive(Clone)]
pub struct Referrers {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>,
    /// Which hosts are asked over plain HTTP (`--insecure`, sources.yaml's `insecure_sources`,
    /// as skopeo's `--tls-verify=false` falls back to it).
    access: Arc<Access>,
}

impl std::fmt::Debug for Referrers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Referrers")
            .field("access", &self.access)
            .finish()
    }
}

impl Referrers {
    /// The system's roots, and sources.yaml's authorities (for any host: the client is one).
    pub fn new(access: Arc<Access>) -> anyhow::Result<Referrers> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        for bundle in access.authorities() {
            for cert in CertificateDer::pem_file_iter(&bundle)
                .map_err(|error| anyhow::anyhow!("{}: {error}", bundle.display()))?
            {
                let cert =
                    cert.map_err(|error| anyhow::anyhow!("{}: {error}", bundle.display()))?;
                roots
                    .add(cert)
                    .map_err(|error| anyhow::anyhow!("{}: {error}", bundle.display()))?;
            }
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|error| anyhow::anyhow!("TLS: {error}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Referrers {
            client: Client::builder(TokioExecutor::new()).build(connector),
            access,
        })
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
        // Docker Hub's API host, as containers/image names it.
        let host = if host == "docker.io" {
            "registry-1.docker.io"
        } else {
            host
        };
        let scheme = if self.access.plain_http(host) {
            "http"
        } else {
            "https"
        };
        let origin = format!("{scheme}://{host}");
        let mut url = format!("{origin}/v2/{path}/referrers/{digest}");
        // The `Authorization` sent once a challenge asked for one.
        let mut authorization: Option<String> = None;
        let mut listed = Vec::new();
        // A registry may page the answer: each page names the next in `Link` (`rel="next"`).
        for _ in 0..MAX_PAGES {
            let (mut answer, challenge) = self.get(&url, authorization.as_deref()).await?;
            if let (401, Some(challenge), None) = (answer.status, challenge, &authorization) {
                // The login of the host the image names (`docker.io`, not its API host).
                let login = self.access.login(repository_host(repository)).await?;
                let answered = self.answer(&challenge, login.as_deref()).await?;
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

    /// The `Authorization` that answers `challenge` (a `WWW-Authenticate` value) with `login`
    /// (base64 of `user:password`, a docker config's `auth`): Basic with the login itself,
    /// Bearer with a token its realm gives for the login (or anonymously without one).
    async fn answer(&self, challenge: &str, login: Option<&str>) -> Result<String, String> {
        if scheme_is(challenge, "Basic") {
            return match login {
                Some(login) => Ok(format!("Basic {login}")),
                None => Err(format!(
                    "the registry asks for credentials ({challenge}) and the auth file has none for it"
                )),
            };
        }
        let token = self.token(challenge, login).await?;
        Ok(format!("Bearer {token}"))
    }

    /// One GET: the answer, and a Basic or Bearer challenge when one came.
    async fn get(
        &self,
        url: &str,
        authorization: Option<&str>,
    ) -> Result<(Answer, Option<String>), String> {
        let mut request = http::Request::get(url).header(http::header::ACCEPT, INDEX);
        if let Some(authorization) = authorization {
            request = request.header(http::header::AUTHORIZATION, authorization);
        }
        let request = request
            .body(Empty::new())
            .map_err(|error| format!("GET {url}: {error}"))?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|error| format!("GET {url}: {error}"))?;
            let status = response.status().as_u16();
            let challenge = response
                .headers()
                .get(http::header::WWW_AUTHENTICATE)
                .and_then(|value| value.to_str().ok())
                .filter(|value| scheme_is(value, "Bearer") || scheme_is(value, "Basic"))
                .map(str::to_string);
            let next = response
                .headers()
                .get_all(http::header::LINK)
                .iter()
                .filter_map(|value| value.to_str().ok())
                .find_map(next_link);
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|error| format!("GET {url}: {error}"))?
                .to_bytes();
            Ok((Answer { status, body, next }, challenge))
        };
        tokio::time::timeout(TIMEOUT, exchange)
            .await
            .map_err(|_| format!("GET {url}: no answer within {TIMEOUT:?}"))?
    }

    /// A token from a Bearer challenge's realm (the Docker registry token protocol:
    /// `GET realm?service=…&scope=…`, with the login as Basic when there is one, answering
    /// `token` or `access_token`).
    async fn token(&self, challenge: &str, login: Option<&str>) -> Result<String, String> {
        let fields = challenge_fields(challenge);
        let realm = fields
            .iter()
            .find(|(k, _)| k == "realm")
            .map(|(_, v)| v.clone())
            .ok_or_else(|| format!("a Bearer challenge without a realm: {challenge}"))?;
        let query: Vec<String> = fields
            .iter()
            .filter(|(k, _)| k == "service" || k == "scope")
            .map(|(k, v)| format!("{k}={}", query_escape(v)))
            .collect();
        let url = if query.is_empty() {
            realm
        } else {
            format!("{realm}?{}", query.join("&"))
        };
        let basic = login.map(|login| format!("Basic {login}"));
        let (answer, _) = self.get(&url, basic.as_deref()).await?;
        if answer.status != 200 {
            let whose = if login.is_some() {
                "no token for the auth file's login"
            } else {
                "no anonymous token"
            };
            return Err(format!("GET {url}: {} ({whose})", answer.status));
        }
        let answer: Value =
            serde_json::from_slice(&answer.body).map_err(|error| format!("GET {url}: {error}"))?;
        answer
            .get("token")
            .or_else(|| answer.get("access_token"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("GET {url}: no token in the answer"))
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

/// The host part of `host/path`.
fn repository_host(repository: &str) -> &str {
    repository.split('/').next().unwrap_or(repository)
}

/// Whether a `WWW-Authenticate` value is a challenge of `scheme` (case-insensitive, RFC 9110).
fn scheme_is(challenge: &str, scheme: &str) -> bool {
    challenge
        .split_once(' ')
        .map_or(challenge, |(first, _)| first)
        .eq_ignore_ascii_case(scheme)
}

/// `key="value"` pairs of a `WWW-Authenticate: Bearer …` challenge.
fn challenge_fields(challenge: &str) -> Vec<(String, String)> {
    let mut fields = Vec::new();
    let mut rest = challenge
        .split_once(' ')
        .map_or("", |(_, fields)| fields)
        .trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim().to_string();
        let (value, after) = match after.strip_prefix('"') {
            Some(quoted) => match quoted.split_once('"') {
                Some((value, after)) => (value.to_string(), after),
                None => (quoted.to_string(), ""),
            },
            None => match after.split_once(',') {
                Some((value, after)) => (value.to_string(), after),
                None => (after.to_string(), ""),
            },
        };
        fields.push((key, value));
        rest = after.trim_start_matches(',').trim();
    }
    fields
}

/// A query value with every byte outside RFC 3986's unreserved set percent-encoded.
fn query_escape(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_challenge_is_read_field_by_field() {
        let fields = challenge_fields(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/nginx:pull""#,
        );
        assert_eq!(
            fields,
            [
                ("realm", "https://auth.docker.io/token"),
                ("service", "registry.docker.io"),
                ("scope", "repository:library/nginx:pull"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        assert_eq!(
            query_escape("repository:library/nginx:pull"),
            "repository%3Alibrary%2Fnginx%3Apull"
        );
    }

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
