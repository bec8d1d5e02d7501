//! The registry requests fill-mirror makes itself, beside skopeo (the referrers API, the
//! warming's pulls through a cache), over the TLS stack of the rest of the binary (rustls with
//! ring): one client, and the login skopeo would get for the host (the merged auth file: the
//! user's entry, or the binary's own ECR or Artifact Registry token), sent only when the
//! registry asks for one: to a `WWW-Authenticate: Basic` challenge as Basic, to a
//! `Bearer realm=…` challenge by the Docker registry token protocol (the realm asked for a
//! token with the login, anonymously without one). A file of its own so that both users share
//! it without depending on each other.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::credentials::Access;

/// How long a registry may take to answer a request's headers, and to send a small body whole.
pub const TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub struct RegistryHttp {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// Which hosts are asked over plain HTTP (`--insecure`, sources.yaml's `insecure_sources`,
    /// as skopeo's `--tls-verify=false` falls back to it), and the logins.
    access: Arc<Access>,
}

impl std::fmt::Debug for RegistryHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryHttp")
            .field("access", &self.access)
            .finish()
    }
}

impl RegistryHttp {
    /// The system's roots, and sources.yaml's authorities (for any host: the client is one).
    pub fn new(access: Arc<Access>) -> anyhow::Result<RegistryHttp> {
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
        Ok(RegistryHttp {
            client: Client::builder(TokioExecutor::new()).build(connector),
            access,
        })
    }

    /// `scheme://host` of the registry API of `host` (Docker Hub's API host, as
    /// containers/image names it, for `docker.io`).
    pub fn origin(&self, host: &str) -> String {
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
        format!("{scheme}://{host}")
    }

    /// One GET, answered as far as its headers (within [`TIMEOUT`]); the body is the caller's
    /// to read, or to stream.
    pub async fn send(
        &self,
        url: &str,
        accept: &str,
        authorization: Option<&str>,
    ) -> Result<http::Response<Incoming>, String> {
        let headers = [(http::header::ACCEPT, accept)];
        self.request(
            http::Method::GET,
            url,
            &headers,
            Bytes::new(),
            authorization,
        )
        .await
    }

    /// Any request, with `body` (empty for a HEAD, a GET or a DELETE): the prune's deletions
    /// and its ledger's upload (`retention/`) go through the one client the reads use.
    pub async fn request(
        &self,
        method: http::Method,
        url: &str,
        headers: &[(http::HeaderName, &str)],
        body: Bytes,
        authorization: Option<&str>,
    ) -> Result<http::Response<Incoming>, String> {
        let mut request = http::Request::builder().method(method.clone()).uri(url);
        for (name, value) in headers {
            request = request.header(name, *value);
        }
        if let Some(authorization) = authorization {
            request = request.header(http::header::AUTHORIZATION, authorization);
        }
        let request = request
            .body(Full::new(body))
            .map_err(|error| format!("{method} {url}: {error}"))?;
        match tokio::time::timeout(TIMEOUT, self.client.request(request)).await {
            Err(_) => Err(format!("{method} {url}: no answer within {TIMEOUT:?}")),
            Ok(Err(error)) => Err(format!("{method} {url}: {error}")),
            Ok(Ok(response)) => Ok(response),
        }
    }

    /// The `Authorization` that answers `challenge` (a `WWW-Authenticate` value) with the login
    /// of `host` (the host the image names, `docker.io` rather than its API host): Basic with
    /// the login itself, Bearer with a token its realm gives for the login (or anonymously
    /// without one).
    pub async fn authorize(&self, challenge: &str, host: &str) -> Result<String, String> {
        let login = self.access.login(host).await?;
        if scheme_is(challenge, "Basic") {
            return match login {
                Some(login) => Ok(format!("Basic {login}")),
                None => Err(format!(
                    "the registry asks for credentials ({challenge}) and the auth file has none for {host}"
                )),
            };
        }
        let token = self.token(challenge, login.as_deref()).await?;
        Ok(format!("Bearer {token}"))
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
        let response = self
            .send(&url, "application/json", basic.as_deref())
            .await?;
        let status = response.status().as_u16();
        let body = read_body(response, &url, TOKEN_LIMIT).await?;
        if status != 200 {
            let whose = if login.is_some() {
                "no token for the auth file's login"
            } else {
                "no anonymous token"
            };
            return Err(format!("GET {url}: {status} ({whose})"));
        }
        let answer: Value =
            serde_json::from_slice(&body).map_err(|error| format!("GET {url}: {error}"))?;
        answer
            .get("token")
            .or_else(|| answer.get("access_token"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("GET {url}: no token in the answer"))
    }
}

/// The most a token answer may hold: a token service that sends more is not a token service.
const TOKEN_LIMIT: usize = 1 << 20;

/// A response's whole body, when it holds at most `limit` bytes and comes within [`TIMEOUT`].
pub async fn read_body(
    response: http::Response<Incoming>,
    url: &str,
    limit: usize,
) -> Result<Bytes, String> {
    let body = Limited::new(response.into_body(), limit).collect();
    match tokio::time::timeout(TIMEOUT, body).await {
        Err(_) => Err(format!(
            "GET {url}: the body did not come within {TIMEOUT:?}"
        )),
        Ok(Err(error)) => Err(format!("GET {url}: {error} (at most {limit} bytes read)")),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

/// A response's Basic or Bearer challenge, when it carries one.
pub fn challenge<B>(response: &http::Response<B>) -> Option<String> {
    response
        .headers()
        .get(http::header::WWW_AUTHENTICATE)
        .and_then(|value| value.to_str().ok())
        .filter(|value| scheme_is(value, "Bearer") || scheme_is(value, "Basic"))
        .map(str::to_string)
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
}
