//! A registry that serves the OCI 1.1 referrers API, for tests of what travels with an image:
//! Debian's `docker-registry` (distribution 2.8) has none, and no registry installable here
//! from Debian, PyPI, npm or crates.io serves it (distribution 3 and zot are not packaged). So
//! a front on loopback answers `GET /v2/<name>/referrers/<digest>` itself, as distribution-spec
//! v1.1 "Listing Referrers" says: an image index of every manifest of the repository whose
//! `subject` is that digest, read from the registry's own storage (so a manifest pushed by any
//! client, through the front or not, is listed, as distribution 3 lists it), one referrer per
//! page with a `Link` to the next, and relays every other request to the registry byte for
//! byte. In front of a registry that asks for credentials, the front asks for them too
//! (`Guard`): as distribution does (`Basic`), or by a Bearer token its own realm gives for
//! them (`Bearer`, as Docker Hub and most registries with a token service do).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use serde_json::{Value, json};

use super::images::{OCI_INDEX, OCI_MANIFEST};
use super::registry::{TestRegistry, sha256};

/// What the front asks of a referrers request.
#[derive(Clone, Debug)]
pub enum Guard {
    /// Nothing: anyone may list.
    Open,
    /// `Authorization: Basic <this>` (base64 of `user:password`), else 401 with
    /// `WWW-Authenticate: Basic realm="Registry Realm"`, as distribution's htpasswd answers.
    Basic(String),
    /// `Authorization: Bearer <a token of its realm>`, else 401 with a Bearer challenge
    /// naming the front's `/token`, which gives a token only for `Basic <this>`.
    Bearer(String),
}

/// The token the Bearer realm gives.
const TOKEN: &str = "referrers-token-for-the-puller";

/// The front; stopped on drop.
pub struct ReferrersFront {
    /// `127.0.0.1:PORT`: the registry host as images name it.
    pub host: String,
    stop: Arc<AtomicBool>,
}

impl ReferrersFront {
    pub fn start(registry: &TestRegistry) -> anyhow::Result<ReferrersFront> {
        ReferrersFront::start_guarded(registry, Guard::Open)
    }

    /// A front whose referrers requests need what `guard` says.
    pub fn start_guarded(registry: &TestRegistry, guard: Guard) -> anyhow::Result<ReferrersFront> {
        ReferrersFront::start_paging(registry, guard, None)
    }

    /// A front whose `Link` to the next page is the absolute URL of `next_origin`
    /// (`scheme://host:port`) when one is given: a registry that sends its client elsewhere.
    pub fn start_paging(
        registry: &TestRegistry,
        guard: Guard,
        next_origin: Option<String>,
    ) -> anyhow::Result<ReferrersFront> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let host = listener.local_addr()?.to_string();
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let upstream = registry.host.clone();
        let storage = registry.storage().to_path_buf();
        let front = host.clone();
        thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let (upstream, storage) = (upstream.clone(), storage.clone());
                        let (guard, front) = (guard.clone(), front.clone());
                        let next_origin = next_origin.clone().unwrap_or_default();
                        thread::spawn(move || {
                            let _ =
                                serve(client, &upstream, &storage, &guard, &front, &next_origin);
                        });
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Ok(ReferrersFront { host, stop })
    }

    /// The digests the front lists as referrers of `digest` in `repository`, every page, as
    /// a client of the API reads them.
    pub fn referrers(&self, repository: &str, digest: &str) -> anyhow::Result<Vec<String>> {
        let mut listed = Vec::new();
        let mut path = format!("/v2/{repository}/referrers/{digest}");
        loop {
            let answer = ureq::get(&format!("http://{}{path}", self.host)).call()?;
            let next = answer
                .header("Link")
                .and_then(|link| link.strip_prefix('<')?.split_once('>'))
                .map(|(next, _)| next.to_string());
            let index: Value = serde_json::from_str(&answer.into_string()?)?;
            listed.extend(
                index["manifests"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|d| d["digest"].as_str().map(str::to_string)),
            );
            match next {
                Some(next) => path = next,
                None => return Ok(listed),
            }
        }
    }
}

impl Drop for ReferrersFront {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One connection: a referrers request answered, anything else relayed with `Connection:
/// close`, so that one connection carries one request and each is seen here.
fn serve(
    mut client: TcpStream,
    upstream: &str,
    storage: &Path,
    guard: &Guard,
    front: &str,
    next_origin: &str,
) -> std::io::Result<()> {
    client.set_nonblocking(false)?;
    let mut head = Vec::new();
    let mut chunk = [0u8; 8192];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = client.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        // A TLS handshake (a client trying HTTPS first, as skopeo `--tls-verify=false`
        // does): closed at once, so that it falls back to plain HTTP.
        if head.is_empty() && chunk[0] == 0x16 {
            return Ok(());
        }
        head.extend_from_slice(&chunk[..n]);
        if head.len() > 1 << 20 {
            return Ok(());
        }
    }
    let end = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(head.len())
        + 4;
    let (request, rest) = head.split_at(end);
    let request = String::from_utf8_lossy(request).into_owned();
    let mut words = request.split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let authorization = request
        .split("\r\n")
        .filter_map(|line| line.split_once(':'))
        .find(|(field, _)| field.eq_ignore_ascii_case("authorization"))
        .map(|(_, value)| value.trim().to_string());
    if let Guard::Bearer(expected) = guard
        && method == "GET"
        && path == "/token"
    {
        let (status, body) = if authorization.as_deref() == Some(&format!("Basic {expected}")) {
            ("200 OK", json!({ "token": TOKEN }).to_string())
        } else {
            (
                "401 Unauthorized",
                json!({"details": "incorrect username or password"}).to_string(),
            )
        };
        write!(
            client,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        return Ok(());
    }
    if method == "GET"
        && let Some((name, digest)) = path
            .strip_prefix("/v2/")
            .and_then(|p| p.rsplit_once("/referrers/"))
    {
        let challenge = match guard {
            Guard::Open => None,
            Guard::Basic(expected) => (authorization.as_deref()
                != Some(&format!("Basic {expected}")))
            .then(|| "Basic realm=\"Registry Realm\"".to_string()),
            Guard::Bearer(_) => (authorization.as_deref() != Some(&format!("Bearer {TOKEN}")))
                .then(|| {
                    format!(
                        "Bearer realm=\"http://{front}/token\",service=\"{front}\",scope=\"repository:{name}:pull\""
                    )
                }),
        };
        if let Some(challenge) = challenge {
            let body =
                r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#;
            write!(
                client,
                "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: {challenge}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )?;
            return Ok(());
        }
        // One referrer per answer, the next page named by `Link` (distribution-spec v1.1:
        // a registry may page the answer), so that a client that reads one page is seen.
        let mut index = index(storage, name, digest);
        let after = target
            .split_once("?last=")
            .map(|(_, last)| last.to_string());
        let mut listed: Vec<Value> = index["manifests"].as_array().cloned().unwrap_or_default();
        listed.sort_by_key(|d| d["digest"].as_str().unwrap_or_default().to_string());
        let page: Vec<Value> = listed
            .into_iter()
            .filter(|d| {
                after
                    .as_deref()
                    .is_none_or(|last| d["digest"].as_str() > Some(last))
            })
            .collect();
        let link = match page.get(1) {
            Some(_) => format!(
                "Link: <{next_origin}/v2/{name}/referrers/{digest}?last={}>; rel=\"next\"\r\n",
                page[0]["digest"].as_str().unwrap_or_default()
            ),
            None => String::new(),
        };
        index["manifests"] = Value::Array(page.into_iter().take(1).collect());
        let body = index.to_string();
        write!(
            client,
            "HTTP/1.1 200 OK\r\nContent-Type: {OCI_INDEX}\r\nContent-Length: {}\r\n{link}Connection: close\r\n\r\n{body}",
            body.len()
        )?;
        return Ok(());
    }
    let mut relayed = String::new();
    for line in request.split("\r\n").filter(|l| !l.is_empty()) {
        if !line.to_ascii_lowercase().starts_with("connection:") {
            relayed.push_str(line);
            relayed.push_str("\r\n");
        }
    }
    relayed.push_str("Connection: close\r\n\r\n");
    let mut registry = TcpStream::connect(upstream)?;
    registry.write_all(relayed.as_bytes())?;
    registry.write_all(rest)?;
    let (mut from_client, mut to_registry) = (client.try_clone()?, registry.try_clone()?);
    thread::spawn(move || {
        let _ = std::io::copy(&mut from_client, &mut to_registry);
        let _ = to_registry.shutdown(Shutdown::Write);
    });
    let _ = std::io::copy(&mut registry, &mut client);
    let _ = client.shutdown(Shutdown::Both);
    Ok(())
}

/// The referrers index of `digest` in repository `name`, from distribution's storage layout
/// (`repositories/<name>/_manifests/revisions/sha256/<hex>`, each manifest's bytes under
/// `blobs/sha256/<2 hex>/<hex>/data`).
fn index(storage: &Path, name: &str, digest: &str) -> Value {
    let root: PathBuf = storage.join("docker/registry/v2");
    let revisions = root.join(format!("repositories/{name}/_manifests/revisions/sha256"));
    let mut manifests = Vec::new();
    for entry in std::fs::read_dir(revisions).into_iter().flatten().flatten() {
        let hex = entry.file_name().to_string_lossy().into_owned();
        let Some(prefix) = hex.get(..2) else { continue };
        let Ok(bytes) = std::fs::read(root.join(format!("blobs/sha256/{prefix}/{hex}/data")))
        else {
            continue;
        };
        let Ok(manifest) = serde_json::from_slice::<Value>(&bytes) else {
            continue;
        };
        if manifest["subject"]["digest"].as_str() != Some(digest) {
            continue;
        }
        let mut descriptor = json!({
            "mediaType": manifest["mediaType"].as_str().unwrap_or(OCI_MANIFEST),
            "digest": sha256(&bytes),
            "size": bytes.len(),
        });
        if let Some(kind) = manifest["artifactType"]
            .as_str()
            .or(manifest["config"]["mediaType"].as_str())
        {
            descriptor["artifactType"] = json!(kind);
        }
        if manifest.get("annotations").is_some() {
            descriptor["annotations"] = manifest["annotations"].clone();
        }
        manifests.push(descriptor);
    }
    json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests})
}

/// Pushes, by digest only (as `oras attach` and cosign 2 with the referrers API do), an
/// artifact of `artifact_type` whose `subject` is the manifest `subject` (its bytes and media
/// type); returns the artifact's digest.
pub fn push_referrer(
    registry: &TestRegistry,
    repository: &str,
    artifact_type: &str,
    content: &str,
    subject: (&[u8], &str),
) -> String {
    const EMPTY: &[u8] = b"{}";
    let layer = format!("{artifact_type} {content}").into_bytes();
    registry
        .push_blob(repository, EMPTY)
        .expect("push empty config");
    registry.push_blob(repository, &layer).expect("push layer");
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": sha256(EMPTY), "size": EMPTY.len()},
        "layers": [{"mediaType": "application/octet-stream", "digest": sha256(&layer), "size": layer.len()}],
        "subject": {"mediaType": subject.1, "digest": sha256(subject.0), "size": subject.0.len()},
    }))
    .expect("manifest JSON");
    let digest = sha256(&manifest);
    registry
        .push_manifest(repository, &digest, OCI_MANIFEST, &manifest)
        .expect("push referrer")
}
