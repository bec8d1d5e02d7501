//! A real OCI registry on loopback (Debian's `docker-registry`, the CNCF distribution server),
//! started and stopped by the tests, and a small client that pushes and deletes manifests. It
//! runs plain, with basic auth (an htpasswd file, as a registry whose credentials expire), or
//! in proxy mode (a pull-through cache of another registry).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

const REGISTRY_BINARY: &str = "docker-registry";

/// One registry process with its own storage, on a port of its own.
pub struct TestRegistry {
    /// `127.0.0.1:PORT`: the registry host as images name it.
    pub host: String,
    config: PathBuf,
    storage: PathBuf,
    child: Option<Child>,
    agent: ureq::Agent,
    /// With basic auth: the user the tests push as, and its password.
    credentials: Option<(String, String)>,
}

/// What a registry adds to the plain configuration.
enum Mode<'a> {
    Plain,
    /// Basic auth from an htpasswd file (distribution's `auth.htpasswd`).
    BasicAuth {
        user: &'a str,
        password: &'a str,
    },
    /// A pull-through cache of `upstream` (distribution's `proxy.remoteurl`).
    Proxy {
        upstream: &'a str,
    },
}

impl TestRegistry {
    pub fn start(name: &str) -> anyhow::Result<TestRegistry> {
        Self::start_in(name, Mode::Plain)
    }

    /// A registry that accepts only `user` with `password` (basic auth, as distribution's
    /// htpasswd access controller does it: 401 with `WWW-Authenticate: Basic` otherwise).
    pub fn start_with_basic_auth(
        name: &str,
        user: &str,
        password: &str,
    ) -> anyhow::Result<TestRegistry> {
        Self::start_in(name, Mode::BasicAuth { user, password })
    }

    /// A pull-through cache of the registry at `upstream` (`127.0.0.1:PORT`, plain HTTP): it
    /// fetches what it is asked for from the upstream, keeps it, and refuses pushes.
    pub fn start_proxy(name: &str, upstream: &str) -> anyhow::Result<TestRegistry> {
        Self::start_in(name, Mode::Proxy { upstream })
    }

    fn start_in(name: &str, mode: Mode<'_>) -> anyhow::Result<TestRegistry> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let host = format!("127.0.0.1:{port}");
        let dir = std::env::temp_dir().join(format!(
            "image-swapper-rig-{name}-{}-{port}",
            std::process::id()
        ));
        let storage = dir.join("storage");
        std::fs::create_dir_all(&storage)?;
        let config = dir.join("config.yml");
        let mut yaml = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n",
            storage.display()
        );
        let mut credentials = None;
        match mode {
            Mode::Plain => {}
            Mode::BasicAuth { user, password } => {
                let htpasswd = dir.join("htpasswd");
                write_htpasswd(&htpasswd, user, password)?;
                yaml.push_str(&format!(
                    "auth:\n  htpasswd:\n    realm: rig\n    path: {}\n",
                    htpasswd.display()
                ));
                credentials = Some((user.to_string(), password.to_string()));
            }
            Mode::Proxy { upstream } => {
                yaml.push_str(&format!("proxy:\n  remoteurl: http://{upstream}\n"));
            }
        }
        std::fs::write(&config, yaml)?;
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(10))
            .build();
        let mut registry = TestRegistry {
            host,
            config,
            storage,
            child: None,
            agent,
            credentials,
        };
        registry.resume()?;
        Ok(registry)
    }

    /// Restarts a registry with basic auth so that it accepts `password` only: the old
    /// credentials are refused from now on, as an expired registry token is.
    pub fn change_password(&mut self, password: &str) -> anyhow::Result<()> {
        let Some((user, _)) = self.credentials.clone() else {
            bail!("{} has no basic auth", self.host);
        };
        self.stop();
        let htpasswd = self.config.with_file_name("htpasswd");
        write_htpasswd(&htpasswd, &user, password)?;
        self.credentials = Some((user, password.to_string()));
        self.resume()
    }

    /// A request with the registry's credentials, when it has any.
    fn request(&self, method: &str, url: &str) -> ureq::Request {
        let request = self.agent.request(method, url);
        match &self.credentials {
            Some((user, password)) => request.set("Authorization", &basic_auth(user, password)),
            None => request,
        }
    }

    /// Starts the process again on the same port and storage, after [`TestRegistry::stop`].
    pub fn resume(&mut self) -> anyhow::Result<()> {
        let child = Command::new(REGISTRY_BINARY)
            .arg("serve")
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| {
                format!("starting `{REGISTRY_BINARY}`: install Debian's docker-registry package (`make deps`)")
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            // A registry with auth answers 401: it is up.
            match self.agent.get(&format!("http://{}/v2/", self.host)).call() {
                Ok(_) | Err(ureq::Error::Status(..)) => return Ok(()),
                Err(ureq::Error::Transport(_)) => {}
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("the registry on {} did not answer within 15 s", self.host)
    }

    /// Stops the process, as an outage would; storage is kept.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The same storage served over HTTPS by a second registry process on a port of its own,
    /// with `cert_pem` and `key_pem`: what a host that verifies TLS asks, while the tests and
    /// the rig's hosts push and read over plain HTTP. Stopped on drop.
    pub fn tls_twin(&self, cert_pem: &str, key_pem: &str) -> anyhow::Result<TlsTwin> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let host = format!("127.0.0.1:{port}");
        let dir = self.config.with_file_name(format!("tls-{port}"));
        std::fs::create_dir_all(&dir)?;
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, cert_pem)?;
        std::fs::write(&key, key_pem)?;
        let plain = std::fs::read_to_string(&self.config)?;
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            plain.replace("disabled: true", "disabled: false").replace(
                &format!("  addr: {}\n", self.host),
                &format!(
                    "  addr: {host}\n  tls:\n    certificate: {}\n    key: {}\n",
                    cert.display(),
                    key.display()
                ),
            ),
        )?;
        let log = dir.join("access.log");
        let child = Command::new(REGISTRY_BINARY)
            .arg("serve")
            .arg(&config)
            .stdout(std::fs::File::create(&log)?)
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting `{REGISTRY_BINARY}` over TLS"))?;
        let twin = TlsTwin { host, child, log };
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(&twin.host).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "the TLS registry on {} did not listen within 15 s",
                    twin.host
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(twin)
    }

    /// Its storage folder (distribution's `filesystem` driver), for a front that reads what it
    /// holds (`referrers.rs`).
    pub fn storage(&self) -> &std::path::Path {
        &self.storage
    }

    fn url(&self, repository: &str, kind: &str, reference: &str) -> String {
        format!("http://{}/v2/{repository}/{kind}/{reference}", self.host)
    }

    /// Uploads a blob (monolithic upload) and returns its digest.
    pub fn push_blob(&self, repository: &str, bytes: &[u8]) -> anyhow::Result<String> {
        let digest = sha256(bytes);
        let started = self
            .request(
                "POST",
                &format!("http://{}/v2/{repository}/blobs/uploads/", self.host),
            )
            .call()
            .context("starting a blob upload")?;
        let location = started
            .header("Location")
            .context("no upload location")?
            .to_string();
        let location = if location.starts_with("http") {
            location
        } else {
            format!("http://{}{location}", self.host)
        };
        let separator = if location.contains('?') { '&' } else { '?' };
        self.request("PUT", &format!("{location}{separator}digest={digest}"))
            .set("Content-Type", "application/octet-stream")
            .send_bytes(bytes)
            .context("finishing a blob upload")?;
        Ok(digest)
    }

    /// Puts a manifest under `reference` (a tag or its digest) and returns its digest.
    pub fn push_manifest(
        &self,
        repository: &str,
        reference: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> anyhow::Result<String> {
        self.request("PUT", &self.url(repository, "manifests", reference))
            .set("Content-Type", media_type)
            .send_bytes(bytes)
            .with_context(|| format!("pushing manifest {repository}:{reference}"))?;
        Ok(sha256(bytes))
    }

    /// The digest the registry serves for `repository:reference`, or None when it has none.
    pub fn digest_of(&self, repository: &str, reference: &str) -> Option<String> {
        let accept = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";
        self.request("HEAD", &self.url(repository, "manifests", reference))
            .set("Accept", accept)
            .call()
            .ok()?
            .header("Docker-Content-Digest")
            .map(str::to_string)
    }

    /// Deletes a manifest by digest, as a registry lifecycle rule does.
    pub fn delete_manifest(&self, repository: &str, digest: &str) -> anyhow::Result<()> {
        self.request("DELETE", &self.url(repository, "manifests", digest))
            .call()
            .with_context(|| format!("deleting {repository}@{digest}"))?;
        Ok(())
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.stop();
        if let Some(dir) = self.storage.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// An htpasswd file with one user, its password hashed with bcrypt (the only hash distribution
/// accepts), at the lowest cost: the registry checks it at every request.
fn write_htpasswd(path: &std::path::Path, user: &str, password: &str) -> anyhow::Result<()> {
    let hash = bcrypt::hash(password, 4).context("hashing the password")?;
    std::fs::write(path, format!("{user}:{hash}\n"))?;
    Ok(())
}

/// The `Authorization` header of HTTP basic auth.
pub fn basic_auth(user: &str, password: &str) -> String {
    use base64::Engine;
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {token}")
}

pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// A registry's storage served over HTTPS ([`TestRegistry::tls_twin`]).
pub struct TlsTwin {
    /// `127.0.0.1:PORT`.
    pub host: String,
    child: Child,
    /// Its access log (distribution's, on its standard output).
    log: PathBuf,
}

impl TlsTwin {
    /// `METHOD PATH` of every request it answered so far, in order, from its access log.
    pub fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                let request = line.split('"').nth(1)?;
                let mut words = request.split(' ');
                Some(format!("{} {}", words.next()?, words.next()?))
            })
            .collect()
    }
}

impl Drop for TlsTwin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
