//! A stand-in for Docker Hub's answers to a repository that does not exist (Docker Hub itself is
//! not reachable here): its token service gives a token to anyone, anonymous or with good
//! credentials, whatever the scope (docker/hub-feedback#1771 "Dockerhub token server always
//! issues a token"), and refuses bad credentials with 401 `incorrect username or password`;
//! its registry then answers the manifest of a repository that does not exist with 401
//! `UNAUTHORIZED` "authentication required", `error="insufficient_scope"` in the challenge
//! (distribution#2624 shows Docker Hub's answer byte for byte), never 404. skopeo reaches it as
//! `docker.io` through a `registries.conf` whose `docker.io` location is this front.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::ecr::plain_http_gate;
use super::front::serve;

/// The front; stopped on drop.
pub struct DockerHubFront {
    /// `127.0.0.1:PORT`, plain HTTP (a TLS handshake closed at once).
    pub host: String,
    stop: Arc<AtomicBool>,
}

impl DockerHubFront {
    /// A front whose token service takes `login` (base64 of `user:password`) as good.
    pub fn start(login: &str) -> anyhow::Result<DockerHubFront> {
        let gate = TcpListener::bind("127.0.0.1:0")?;
        let host = gate.local_addr()?.to_string();
        let good = format!("Basic {login}");
        let realm = format!("Bearer realm=\"http://{host}/token\",service=\"registry.docker.io\"");
        let (inner, stop) = serve("Docker Hub front", move |request| {
            let url = request.url().to_string();
            let authorization = request
                .headers()
                .iter()
                .find(|h| h.field.equiv("Authorization"))
                .map(|h| h.value.as_str().to_string());
            let unauthorized = |detail: serde_json::Value| {
                serde_json::json!({"errors": [{"code": "UNAUTHORIZED", "message": "authentication required", "detail": detail}]})
                    .to_string()
            };
            let (code, challenge, body) = if url.starts_with("/token") {
                match &authorization {
                    Some(sent) if *sent != good => (
                        401,
                        None,
                        r#"{"details":"incorrect username or password"}"#.to_string(),
                    ),
                    _ => (
                        200,
                        None,
                        r#"{"token":"hub-token","access_token":"hub-token"}"#.to_string(),
                    ),
                }
            } else if url == "/v2/" && authorization.is_none() {
                (
                    401,
                    Some(realm.clone()),
                    unauthorized(serde_json::Value::Null),
                )
            } else if url == "/v2/" {
                (200, None, "{}".to_string())
            } else {
                let name = url
                    .trim_start_matches("/v2/")
                    .split("/manifests/")
                    .next()
                    .unwrap_or_default()
                    .to_string();
                (
                    401,
                    Some(format!(
                        "{realm},scope=\"repository:{name}:pull\",error=\"insufficient_scope\""
                    )),
                    unauthorized(serde_json::json!([
                        {"Type": "repository", "Class": "", "Name": name, "Action": "pull"}
                    ])),
                )
            };
            let mut headers =
                vec![tiny_http::Header::from_bytes("Content-Type", "application/json").ok()];
            headers.push(
                challenge.and_then(|c| tiny_http::Header::from_bytes("WWW-Authenticate", c).ok()),
            );
            let length = body.len();
            let _ = request.respond(tiny_http::Response::new(
                code.into(),
                headers.into_iter().flatten().collect(),
                std::io::Cursor::new(body.into_bytes()),
                Some(length),
                None,
            ));
        })?;
        plain_http_gate(gate, &inner, stop.clone())?;
        Ok(DockerHubFront { host, stop })
    }
}

impl Drop for DockerHubFront {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A `registries.conf` in `dir` that sends `docker.io` to `host` (plain HTTP): the front, or a
/// latency proxy before it.
pub fn registries_conf(dir: &Path, host: &str) -> PathBuf {
    let path = dir.join("registries.conf");
    let text =
        format!("[[registry]]\nprefix = \"docker.io\"\nlocation = \"{host}\"\ninsecure = true\n");
    std::fs::write(&path, text).expect("registries.conf");
    path
}
