//! Answers to the guest's OCI host calls: live from a registry over HTTP (with the error texts
//! Kubewarden's host gives), replayed from a `kwctl` session file, or instant from memory.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::wapc::Host;

/// The manifest types Kubewarden's OCI client asks for.
const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";

/// The OCI operations, by their host-call names and their tags in `kwctl` session files.
pub const OPERATIONS: [(&str, &str); 3] = [
    ("v1/manifest_digest", "OciManifestDigest"),
    ("v1/oci_manifest", "OciManifest"),
    ("v1/oci_manifest_config", "OciManifestAndConfig"),
];

fn session_tag(operation: &str) -> Option<&'static str> {
    OPERATIONS
        .iter()
        .find(|(op, _)| *op == operation)
        .map(|(_, tag)| *tag)
}

/// One host interaction, as `kwctl --record-host-capabilities-interactions` writes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Exchange {
    pub tag: String,
    pub image: String,
    pub answer: Result<String, String>,
}

impl Exchange {
    fn yaml(&self) -> String {
        let quote = |s: &str| format!("'{}'", s.replace('\'', "''"));
        let response = match &self.answer {
            Ok(payload) => format!("    type: Success\n    payload: {}\n", quote(payload)),
            Err(message) => format!("    type: Error\n    message: {}\n", quote(message)),
        };
        format!(
            "- type: Exchange\n  request: |\n    !{}\n    image: {}\n  response:\n{response}",
            self.tag, self.image
        )
    }
}

pub fn session_yaml(exchanges: &[Exchange]) -> String {
    exchanges.iter().map(Exchange::yaml).collect()
}

fn parse_image_payload(payload: &[u8]) -> Result<String, String> {
    serde_json::from_slice::<String>(payload)
        .map_err(|e| format!("the payload is not a JSON string: {e}"))
}

/// Answers from a real registry over plain HTTP, and records every exchange.
pub struct LiveHost {
    agent: ureq::Agent,
    pub exchanges: Vec<Exchange>,
}

impl Default for LiveHost {
    fn default() -> Self {
        LiveHost {
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(5))
                .build(),
            exchanges: Vec::new(),
        }
    }
}

/// `host/repository[:tag|@digest]` split as the registry API needs it.
pub fn locate(image: &str) -> Result<(String, String, String), String> {
    let (host, rest) = image
        .split_once('/')
        .ok_or_else(|| format!("{image:?} names no registry host"))?;
    let (repository, reference) = match rest.split_once('@') {
        Some((name, digest)) => (name.split(':').next().unwrap_or(name), digest),
        None => match rest.rsplit_once(':') {
            Some((name, tag)) if !tag.contains('/') => (name, tag),
            _ => (rest, "latest"),
        },
    };
    Ok((
        host.to_string(),
        repository.to_string(),
        reference.to_string(),
    ))
}

impl LiveHost {
    fn get(&self, url: &str) -> Result<ureq::Response, String> {
        self.agent
            .get(url)
            .set("Accept", ACCEPT)
            .call()
            .map_err(|e| self.error_text(url, e))
    }

    /// The texts Kubewarden's host (oci-client) gives, as recorded from kwctl 1.31.
    fn error_text(&self, url: &str, error: ureq::Error) -> String {
        const PREFIX: &str = "Fail to interact with OCI registry";
        match error {
            ureq::Error::Status(code, response) => {
                let body = response.into_string().unwrap_or_default();
                let messages: Vec<String> = serde_json::from_str::<Value>(&body)
                    .ok()
                    .and_then(|v| v.get("errors").and_then(Value::as_array).cloned())
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|e| e.get("message").and_then(Value::as_str))
                    .map(|m| format!("OCI API error: {m}"))
                    .collect();
                if messages.is_empty() {
                    format!("{PREFIX}: Server error: url {url}, code: {code}, message: {body}")
                } else {
                    format!(
                        "{PREFIX}: Registry error: url {url}, envelope: OCI API errors: [{}]",
                        messages.join(", ")
                    )
                }
            }
            ureq::Error::Transport(_) => format!("{PREFIX}: error sending request for url ({url})"),
        }
    }

    fn manifest_digest(&self, image: &str) -> Result<String, String> {
        let (host, repository, reference) = locate(image)?;
        let url = format!("http://{host}/v2/{repository}/manifests/{reference}");
        match self.agent.head(&url).set("Accept", ACCEPT).call() {
            Ok(response) => match response.header("Docker-Content-Digest") {
                Some(digest) => Ok(json!({ "digest": digest }).to_string()),
                None => Err(format!("no Docker-Content-Digest from {url}")),
            },
            // A HEAD answer has no body: ask again for the registry's own words.
            Err(ureq::Error::Status(..)) => Err(self
                .get(&url)
                .err()
                .unwrap_or_else(|| format!("{url} answered HEAD and GET differently"))),
            Err(error) => Err(self.error_text(&url, error)),
        }
    }

    fn manifest(&self, image: &str) -> Result<Value, String> {
        let (host, repository, reference) = locate(image)?;
        let url = format!("http://{host}/v2/{repository}/manifests/{reference}");
        let body = self.get(&url)?.into_string().map_err(|e| e.to_string())?;
        serde_json::from_str(&body).map_err(|e| format!("manifest of {image} is not JSON: {e}"))
    }

    fn manifest_and_config(&self, image: &str) -> Result<String, String> {
        let (host, repository, reference) = locate(image)?;
        let url = format!("http://{host}/v2/{repository}/manifests/{reference}");
        let response = self.get(&url)?;
        let digest = response
            .header("Docker-Content-Digest")
            .unwrap_or_default()
            .to_string();
        let body = response.into_string().map_err(|e| e.to_string())?;
        let manifest: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let config_digest = manifest
            .pointer("/config/digest")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                format!("Fail to interact with OCI registry: {image} is not an image manifest")
            })?;
        let config_url = format!("http://{host}/v2/{repository}/blobs/{config_digest}");
        let config: Value = serde_json::from_str(
            &self
                .get(&config_url)?
                .into_string()
                .map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
        Ok(json!({"manifest": manifest, "digest": digest, "config": config}).to_string())
    }

    pub fn lookups(&self) -> Vec<String> {
        self.exchanges
            .iter()
            .map(|e| format!("{} {}", e.tag, e.image))
            .collect()
    }
}

impl Host for LiveHost {
    fn call(
        &mut self,
        binding: &str,
        namespace: &str,
        operation: &str,
        payload: &[u8],
    ) -> Result<Vec<u8>, String> {
        let tag = match (binding, namespace, session_tag(operation)) {
            ("kubewarden", "oci", Some(tag)) => tag,
            _ => {
                return Err(format!(
                    "unknown host call {binding}/{namespace}/{operation}"
                ));
            }
        };
        let image = parse_image_payload(payload)?;
        let answer = match tag {
            "OciManifestDigest" => self.manifest_digest(&image),
            "OciManifest" => self.manifest(&image).map(|v| v.to_string()),
            _ => self.manifest_and_config(&image),
        };
        self.exchanges.push(Exchange {
            tag: tag.to_string(),
            image,
            answer: answer.clone(),
        });
        answer.map(String::into_bytes)
    }
}

#[derive(Deserialize)]
struct RecordedExchange {
    request: String,
    response: RecordedResponse,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum RecordedResponse {
    Success { payload: String },
    Error { message: String },
}

/// Named as kwctl tags them in session files.
#[derive(Deserialize)]
#[allow(clippy::enum_variant_names)]
enum RecordedRequest {
    OciManifestDigest { image: String },
    OciManifest { image: String },
    OciManifestAndConfig { image: String },
}

/// Plays a `kwctl` session file back strictly in order, as `--replay-host-capabilities-interactions` does.
pub struct ReplayHost {
    pending: VecDeque<Exchange>,
    pub calls: Vec<String>,
}

impl ReplayHost {
    pub fn load(path: &Path) -> anyhow::Result<ReplayHost> {
        let text = std::fs::read_to_string(path)?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> anyhow::Result<ReplayHost> {
        let recorded: Vec<RecordedExchange> = serde_yaml::from_str(text)?;
        let mut pending = VecDeque::new();
        for exchange in recorded {
            let (tag, image) = match serde_yaml::from_str::<RecordedRequest>(&exchange.request)? {
                RecordedRequest::OciManifestDigest { image } => ("OciManifestDigest", image),
                RecordedRequest::OciManifest { image } => ("OciManifest", image),
                RecordedRequest::OciManifestAndConfig { image } => ("OciManifestAndConfig", image),
            };
            let answer = match exchange.response {
                RecordedResponse::Success { payload } => Ok(payload),
                RecordedResponse::Error { message } => Err(message),
            };
            pending.push_back(Exchange {
                tag: tag.to_string(),
                image,
                answer,
            });
        }
        Ok(ReplayHost {
            pending,
            calls: Vec::new(),
        })
    }

    pub fn remaining(&self) -> usize {
        self.pending.len()
    }

    /// The exchanges not yet played, in order.
    pub fn pending(&self) -> impl Iterator<Item = &Exchange> {
        self.pending.iter()
    }
}

impl Host for ReplayHost {
    fn call(
        &mut self,
        _binding: &str,
        _namespace: &str,
        operation: &str,
        payload: &[u8],
    ) -> Result<Vec<u8>, String> {
        let image = parse_image_payload(payload)?;
        let tag = session_tag(operation).unwrap_or("unknown");
        self.calls.push(format!("{tag} {image}"));
        // Like kwctl, the entry is consumed before it is compared.
        match self.pending.pop_front() {
            Some(expected) if expected.tag == tag && expected.image == image => {
                expected.answer.map(String::into_bytes)
            }
            _ => Err(format!("Replay error: unexpected request {tag} {image}")),
        }
    }
}

/// Answers `v1/manifest_digest` at once from a table: the benchmark's host, which costs nothing.
#[derive(Default)]
pub struct InstantHost {
    pub digests: BTreeMap<String, String>,
    pub calls: usize,
}

impl Host for InstantHost {
    fn call(
        &mut self,
        _binding: &str,
        _namespace: &str,
        _operation: &str,
        payload: &[u8],
    ) -> Result<Vec<u8>, String> {
        self.calls += 1;
        let image = parse_image_payload(payload)?;
        match self.digests.get(&image) {
            Some(digest) => Ok(json!({ "digest": digest }).to_string().into_bytes()),
            None => Err("Fail to interact with OCI registry: Registry error: url instant, envelope: OCI API errors: [OCI API error: manifest unknown]".to_string()),
        }
    }
}
