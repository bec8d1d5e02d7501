//! A real OCI registry on loopback (Debian's `docker-registry`, the CNCF distribution server),
//! started and stopped by the tests, and a small client that pushes and deletes manifests.

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
}

impl TestRegistry {
    pub fn start(name: &str) -> anyhow::Result<TestRegistry> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let host = format!("127.0.0.1:{port}");
        let dir = std::env::temp_dir().join(format!(
            "image-swapper-rig-{name}-{}-{port}",
            std::process::id()
        ));
        let storage = dir.join("storage");
        std::fs::create_dir_all(&storage)?;
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n",
                storage.display()
            ),
        )?;
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(10))
            .build();
        let mut registry = TestRegistry {
            host,
            config,
            storage,
            child: None,
            agent,
        };
        registry.resume()?;
        Ok(registry)
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
            if self
                .agent
                .get(&format!("http://{}/v2/", self.host))
                .call()
                .is_ok()
            {
                return Ok(());
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

    fn url(&self, repository: &str, kind: &str, reference: &str) -> String {
        format!("http://{}/v2/{repository}/{kind}/{reference}", self.host)
    }

    /// Uploads a blob (monolithic upload) and returns its digest.
    pub fn push_blob(&self, repository: &str, bytes: &[u8]) -> anyhow::Result<String> {
        let digest = sha256(bytes);
        let started = self
            .agent
            .post(&format!(
                "http://{}/v2/{repository}/blobs/uploads/",
                self.host
            ))
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
        self.agent
            .put(&format!("{location}{separator}digest={digest}"))
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
        self.agent
            .put(&self.url(repository, "manifests", reference))
            .set("Content-Type", media_type)
            .send_bytes(bytes)
            .with_context(|| format!("pushing manifest {repository}:{reference}"))?;
        Ok(sha256(bytes))
    }

    /// Deletes a manifest by digest, as a registry lifecycle rule does.
    pub fn delete_manifest(&self, repository: &str, digest: &str) -> anyhow::Result<()> {
        self.agent
            .delete(&self.url(repository, "manifests", digest))
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

pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}
