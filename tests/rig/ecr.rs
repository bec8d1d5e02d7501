//! Amazon ECR for the fill job: the AWS API is moto's (PyPI `moto[server]`, a real emulator of
//! ECR's API, not a stub), and the registry is a real `distribution` registry behind a front
//! that behaves as ECR's registry endpoint does where the fill job can tell:
//! - every request needs the credentials `aws ecr get-login-password` hands out (user `AWS`, the
//!   password moto issues for the account: `<account>-auth-token`), else 401;
//! - a repository ECR does not know (moto's `DescribeRepositories`) answers every request, a
//!   push included, with ECR's `NAME_UNKNOWN` ("The repository with name '…' does not exist in
//!   the registry with id '…'"), until `CreateRepository` has made it;
//! - a manifest PUT that would move a tag the repository keeps immutable (its
//!   `imageTagMutability` IMMUTABLE, or IMMUTABLE_WITH_EXCLUSION and none of its wildcard
//!   `imageTagMutabilityExclusionFilters` matching the tag; MUTABLE_WITH_EXCLUSION and one
//!   matching) is refused with ECR's `TAG_INVALID` ("The image tag '…' already exists in the '…'
//!   repository and cannot be overwritten because the tag is immutable.", the text kaniko's
//!   osscontainertools/kaniko#204 quotes from ECR in 2025), status 400 as distribution gives that
//!   code. A PUT of the digest the tag already names is accepted.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::registry::{TestRegistry, basic_auth};

/// moto's default account, and so the registry id in ECR's texts and the login password.
pub const ACCOUNT: &str = "123456789012";
pub const REGION: &str = "eu-west-1";

/// moto's server on loopback, stopped when dropped.
pub struct Moto {
    /// `http://127.0.0.1:PORT`: the AWS CLI's `AWS_ENDPOINT_URL`.
    pub endpoint: String,
    process: Child,
}

impl Moto {
    pub fn start() -> anyhow::Result<Moto> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let process = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("moto_server (pip install 'moto[server]'): {e}"))?;
        let endpoint = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while ureq::get(&format!("{endpoint}/moto-api/")).call().is_err() {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "moto_server did not start"
            );
            thread::sleep(Duration::from_millis(100));
        }
        Ok(Moto { endpoint, process })
    }

    /// The environment the AWS CLI needs to reach this moto as the account's administrator.
    pub fn environment(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", "testing".to_string()),
            ("AWS_SECRET_ACCESS_KEY", "testing".to_string()),
            ("AWS_REGION", REGION.to_string()),
        ]
    }

    /// ECR's API, as the CLI calls it.
    pub fn ecr(&self, action: &str, body: &serde_json::Value) -> Result<serde_json::Value, String> {
        ecr_api(&self.endpoint, action, body)
    }

    /// The repository, as `DescribeRepositories` gives it, if it exists.
    pub fn repository(&self, name: &str) -> Option<serde_json::Value> {
        describe_repository(&self.endpoint, name)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// ECR's API at `endpoint`, as the CLI calls it (JSON 1.1, signed for the region; moto reads
/// the region from the signature's scope and checks nothing else).
fn ecr_api(
    endpoint: &str,
    action: &str,
    body: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    {
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential=testing/20260101/{REGION}/ecr/aws4_request, SignedHeaders=host, Signature=0"
        );
        match ureq::post(&format!("{endpoint}/"))
            .set(
                "X-Amz-Target",
                &format!("AmazonEC2ContainerRegistry_V20150921.{action}"),
            )
            .set("Content-Type", "application/x-amz-json-1.1")
            .set("Authorization", &authorization)
            .send_string(&body.to_string())
        {
            Ok(answer) => {
                let text = answer.into_string().map_err(|e| e.to_string())?;
                serde_json::from_str(&text).map_err(|e| e.to_string())
            }
            Err(ureq::Error::Status(_, answer)) => Err(answer.into_string().unwrap_or_default()),
            Err(error) => Err(error.to_string()),
        }
    }
}

pub(super) fn describe_repository(endpoint: &str, name: &str) -> Option<serde_json::Value> {
    ecr_api(
        endpoint,
        "DescribeRepositories",
        &serde_json::json!({"repositoryNames": [name]}),
    )
    .ok()?
    .get("repositories")?
    .get(0)
    .cloned()
}

/// ECR's registry endpoint in front of `storage`, its repositories those moto knows.
pub struct EcrRegistry {
    /// `127.0.0.1:PORT`: the registry host, as images name it.
    pub host: String,
    stop: Arc<AtomicBool>,
}

impl EcrRegistry {
    pub fn start(storage: &TestRegistry, moto: &Moto) -> anyhow::Result<EcrRegistry> {
        // The gate's address is the one images name, and the front rewrites redirects to it.
        let gate = TcpListener::bind("127.0.0.1:0")?;
        let host = gate.local_addr()?.to_string();
        let front = Front {
            host: host.clone(),
            storage: storage.host.clone(),
            moto: moto.endpoint.clone(),
            agent: ureq::AgentBuilder::new()
                .redirects(0)
                .timeout(Duration::from_secs(30))
                .build(),
        };
        let (inner, stop) = super::front::serve("ECR front", move |request| front.answer(request))?;
        plain_http_gate(gate, &inner, stop.clone())?;
        Ok(EcrRegistry { host, stop })
    }

    /// The credentials `aws ecr get-login-password` gives for moto's account.
    pub fn password() -> String {
        format!("{ACCOUNT}-auth-token")
    }
}

impl Drop for EcrRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

struct Front {
    host: String,
    storage: String,
    /// moto's endpoint, where ECR's repositories are.
    moto: String,
    agent: ureq::Agent,
}

type Answer = tiny_http::Response<std::io::Cursor<Vec<u8>>>;

fn answer(code: u16, headers: Vec<(String, String)>, body: Vec<u8>, length: usize) -> Answer {
    let headers = headers
        .into_iter()
        .filter_map(|(name, value)| {
            tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()).ok()
        })
        .collect();
    tiny_http::Response::new(
        code.into(),
        headers,
        std::io::Cursor::new(body),
        Some(length),
        None,
    )
}

fn json(code: u16, body: String) -> Answer {
    let length = body.len();
    let headers = vec![("Content-Type".to_string(), "application/json".to_string())];
    answer(code, headers, body.into_bytes(), length)
}

impl Front {
    fn answer(&self, mut request: tiny_http::Request) {
        let headers: Vec<(String, String)> = request
            .headers()
            .iter()
            .map(|h| {
                (
                    h.field.as_str().as_str().to_string(),
                    h.value.as_str().to_string(),
                )
            })
            .collect();
        let header = |name: &str| -> Vec<String> {
            headers
                .iter()
                .filter(|(field, _)| field.eq_ignore_ascii_case(name))
                .map(|(_, value)| value.clone())
                .collect()
        };
        let expected = basic_auth("AWS", &EcrRegistry::password());
        if header("Authorization").first() != Some(&expected) {
            let mut refused = json(
                401,
                r#"{"errors":[{"code":"DENIED","message":"Not Authorized"}]}"#.to_string(),
            );
            if let Ok(challenge) = tiny_http::Header::from_bytes(
                &b"WWW-Authenticate"[..],
                format!(
                    "Basic realm=\"https://{}/\",service=\"ecr.amazonaws.com\"",
                    self.host
                )
                .as_bytes(),
            ) {
                refused.add_header(challenge);
            }
            let _ = request.respond(refused);
            return;
        }
        let url = request.url().to_string();
        let described = match repository_of(&url) {
            Some(repository) => match describe_repository(&self.moto, repository) {
                Some(described) => Some(described),
                None => {
                    let _ = request.respond(json(
                        404,
                        format!(
                            r#"{{"errors":[{{"code":"NAME_UNKNOWN","message":"The repository with name '{repository}' does not exist in the registry with id '{ACCOUNT}'"}}]}}"#
                        ),
                    ));
                    return;
                }
            },
            None => None,
        };
        let method = request.method().as_str().to_string();
        let mut body = Vec::new();
        let _ = std::io::Read::read_to_end(request.as_reader(), &mut body);
        if method == "PUT"
            && let Some(described) = &described
            && let Some((repository, tag)) = tag_of(&url)
            && keeps(described, tag)
            && self.moves(repository, tag, &body)
        {
            let _ = request.respond(json(
                400,
                format!(
                    r#"{{"errors":[{{"code":"TAG_INVALID","message":"The image tag '{tag}' already exists in the '{repository}' repository and cannot be overwritten because the tag is immutable."}}]}}"#
                ),
            ));
            return;
        }
        let mut forwarded = self
            .agent
            .request(&method, &format!("http://{}{url}", self.storage));
        for name in ["Content-Type", "Content-Range"] {
            if let Some(value) = header(name).first() {
                forwarded = forwarded.set(name, value);
            }
        }
        let accept = header("Accept").join(", ");
        if !accept.is_empty() {
            forwarded = forwarded.set("Accept", &accept);
        }
        let reply = match forwarded.send_bytes(&body) {
            Ok(reply) | Err(ureq::Error::Status(_, reply)) => reply,
            Err(error) => {
                let _ =
                    request.respond(json(502, format!("{{\"error\":{:?}}}", error.to_string())));
                return;
            }
        };
        let code = reply.status();
        // A redirect names the host the client asked (a relay's, when one is before the gate).
        let origin = header("Host").first().cloned().unwrap_or(self.host.clone());
        let length: usize = reply
            .header("Content-Length")
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        let headers: Vec<(String, String)> = reply
            .headers_names()
            .into_iter()
            .filter(|name| {
                !["content-length", "transfer-encoding", "connection", "date"]
                    .contains(&name.to_ascii_lowercase().as_str())
            })
            .filter_map(|name| {
                let value = reply.header(&name)?.replace(&self.storage, &origin);
                Some((name, value))
            })
            .collect();
        let mut data = Vec::new();
        let _ = std::io::Read::read_to_end(&mut reply.into_reader(), &mut data);
        let length = if method == "HEAD" { length } else { data.len() };
        let _ = request.respond(answer(code, headers, data, length));
    }
}

/// Every manifest type, for a HEAD that answers whatever the tag names.
const MANIFESTS: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json";

impl Front {
    /// Whether putting `manifest` under `tag` moves it: the storage holds the tag, at another
    /// digest.
    fn moves(&self, repository: &str, tag: &str, manifest: &[u8]) -> bool {
        use sha2::Digest;
        let wanted = format!("sha256:{:x}", sha2::Sha256::digest(manifest));
        let held = self
            .agent
            .head(&format!(
                "http://{}/v2/{repository}/manifests/{tag}",
                self.storage
            ))
            .set("Accept", MANIFESTS)
            .call()
            .ok()
            .and_then(|answer| answer.header("Docker-Content-Digest").map(str::to_string));
        held.is_some_and(|held| held != wanted)
    }
}

/// Whether ECR keeps `tag` from moving in the repository `described` (its
/// `DescribeRepositories` entry).
fn keeps(described: &serde_json::Value, tag: &str) -> bool {
    let excluded = described["imageTagMutabilityExclusionFilters"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|filter| filter["filterType"] == "WILDCARD")
        .filter_map(|filter| filter["filter"].as_str())
        .any(|filter| wildcard(filter, tag));
    match described["imageTagMutability"].as_str() {
        Some("IMMUTABLE") => true,
        Some("IMMUTABLE_WITH_EXCLUSION") => !excluded,
        Some("MUTABLE_WITH_EXCLUSION") => excluded,
        _ => false,
    }
}

/// An ECR wildcard filter: `*` matches any run of characters, every other character itself.
fn wildcard(filter: &str, tag: &str) -> bool {
    match filter.split_once('*') {
        None => filter == tag,
        Some((head, rest)) => {
            tag.starts_with(head)
                && (0..=tag.len() - head.len())
                    .filter(|at| tag.is_char_boundary(head.len() + at))
                    .any(|at| wildcard(rest, &tag[head.len() + at..]))
        }
    }
}

/// The repository and tag a manifest path names by tag (`/v2/<repository>/manifests/<tag>`);
/// None for a digest.
fn tag_of(path: &str) -> Option<(&str, &str)> {
    let (repository, reference) = path.strip_prefix("/v2/")?.rsplit_once("/manifests/")?;
    (!reference.contains(':')).then_some((repository, reference))
}

/// A listener that relays plain HTTP to `inner` and closes a TLS handshake at once. skopeo
/// with `--tls-verify=false` tries HTTPS first; a Go server on a plain port answers the
/// handshake with an error at once, while tiny_http would wait for a request line, and the
/// client for its 10-second TLS handshake timeout.
pub fn plain_http_gate(
    listener: TcpListener,
    inner: &str,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    listener.set_nonblocking(true)?;
    let inner = inner.to_string();
    thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let Ok((client, _)) = listener.accept() else {
                thread::sleep(Duration::from_millis(2));
                continue;
            };
            let inner = inner.clone();
            thread::spawn(move || {
                let _ = client.set_nonblocking(false);
                let mut first = [0u8; 1];
                // 0x16: a TLS handshake record.
                if client
                    .peek(&mut first)
                    .map_or(true, |n| n == 0 || first[0] == 0x16)
                {
                    return;
                }
                let Ok(server) = TcpStream::connect(&inner) else {
                    return;
                };
                let (Ok(mut client_in), Ok(mut server_out)) =
                    (client.try_clone(), server.try_clone())
                else {
                    return;
                };
                let (mut server_in, mut client_out) = (server, client);
                let up = thread::spawn(move || {
                    let _ = std::io::copy(&mut client_in, &mut server_out);
                    let _ = server_out.shutdown(std::net::Shutdown::Write);
                });
                let _ = std::io::copy(&mut server_in, &mut client_out);
                let _ = client_out.shutdown(std::net::Shutdown::Write);
                let _ = up.join();
            });
        }
    });
    Ok(())
}

/// The repository a registry API path names: `/v2/<repository>/(manifests|blobs|tags)/...`.
fn repository_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v2/")?;
    ["/manifests/", "/blobs/", "/tags/"]
        .iter()
        .filter_map(|marker| rest.find(marker))
        .min()
        .map(|end| &rest[..end])
}
