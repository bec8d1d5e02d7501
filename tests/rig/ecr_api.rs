//! ECR's API where it speaks of images, before moto: moto knows the repositories (it answers
//! every other action) but not the images pushed through the registry front (`ecr.rs`), and
//! computes their digests its own way; ECR's API and registry endpoint are one store. So
//! `DescribeImages` and `BatchDeleteImage` are answered here from the very storage the registry
//! front serves (distribution's `filesystem` layout), in the JSON of AWS's API reference
//! (API_DescribeImages, API_BatchDeleteImage: `imageDetails[]` of `registryId`,
//! `repositoryName`, `imageDigest` (the manifest's sha256), `imageTags` (absent when none),
//! `imagePushedAt` (epoch seconds), `imageManifestMediaType`; `imageIds[]` and `failures[]` of
//! `imageId`, `failureCode`, `failureReason`), and with ECR's documented behaviour: "When you
//! remove the last tag from an image, the image is deleted from your repository"; a digest
//! deletes the image and all its tags. An unknown repository is ECR's
//! `RepositoryNotFoundException`. One page: no `nextToken`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use serde_json::{Value, json};

use super::ecr::{ACCOUNT, Moto, describe_repository};
use super::registry::TestRegistry;

/// The API front, stopped when dropped.
pub struct EcrApi {
    /// `http://127.0.0.1:PORT`: the `AWS_ENDPOINT_URL` the binary is given.
    pub endpoint: String,
    stop: Arc<AtomicBool>,
}

impl Drop for EcrApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl EcrApi {
    pub fn start(storage: &TestRegistry, moto: &Moto) -> anyhow::Result<EcrApi> {
        let store = Store {
            root: storage.storage().join("docker/registry/v2"),
            registry: storage.host.clone(),
            moto: moto.endpoint.clone(),
        };
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(30))
            .build();
        let (host, stop) = super::front::serve("ECR API front", move |mut request| {
            let header = |name: &str| {
                (request.headers().iter())
                    .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
                    .map(|h| h.value.as_str().to_string())
            };
            let target = header("X-Amz-Target").unwrap_or_default();
            let headers: Vec<(String, String)> = (request.headers().iter())
                .map(|h| (h.field.as_str().to_string(), h.value.as_str().to_string()))
                .filter(|(name, _)| {
                    !["host", "content-length", "connection", "transfer-encoding"]
                        .contains(&name.to_ascii_lowercase().as_str())
                })
                .collect();
            let mut body = Vec::new();
            let _ = std::io::Read::read_to_end(request.as_reader(), &mut body);
            let asked: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let action = target.rsplit('.').next().unwrap_or_default();
            let (code, answer) = match action {
                "DescribeImages" | "BatchDeleteImage" => store.answer(action, &asked),
                _ => {
                    let mut forwarded = agent.post(&format!("{}/", store.moto));
                    for (name, value) in &headers {
                        forwarded = forwarded.set(name, value);
                    }
                    match forwarded.send_bytes(&body) {
                        Ok(reply) | Err(ureq::Error::Status(_, reply)) => {
                            (reply.status(), reply.into_string().unwrap_or_default())
                        }
                        Err(error) => (502, json!({"message": error.to_string()}).to_string()),
                    }
                }
            };
            let length = answer.len();
            let content = tiny_http::Header::from_bytes(
                &b"Content-Type"[..],
                &b"application/x-amz-json-1.1"[..],
            );
            let _ = request.respond(tiny_http::Response::new(
                code.into(),
                content.into_iter().collect(),
                std::io::Cursor::new(answer.into_bytes()),
                Some(length),
                None,
            ));
        })?;
        Ok(EcrApi {
            endpoint: format!("http://{host}"),
            stop,
        })
    }
}

/// The registry's storage, its HTTP API (deletion by digest), and moto (the repositories).
struct Store {
    root: PathBuf,
    registry: String,
    moto: String,
}

impl Store {
    fn answer(&self, action: &str, asked: &Value) -> (u16, String) {
        let Some(name) = asked["repositoryName"].as_str() else {
            return error("InvalidParameterException", "repositoryName is required");
        };
        if describe_repository(&self.moto, name).is_none() {
            let message = format!(
                "The repository with name '{name}' does not exist in the registry with id '{ACCOUNT}'"
            );
            return error("RepositoryNotFoundException", &message);
        }
        let manifests = self.root.join(format!("repositories/{name}/_manifests"));
        if action == "DescribeImages" {
            let details: Vec<Value> = (self.images(&manifests).into_iter())
                .map(|(digest, tags, pushed)| {
                    let mut detail = json!({
                        "registryId": ACCOUNT,
                        "repositoryName": name,
                        "imageDigest": digest,
                        "imagePushedAt": pushed,
                        "imageManifestMediaType": self.media_type(&digest),
                    });
                    if !tags.is_empty() {
                        detail["imageTags"] = json!(tags);
                    }
                    detail
                })
                .collect();
            return (200, json!({ "imageDetails": details }).to_string());
        }
        let mut deleted = Vec::new();
        let mut failures = Vec::new();
        for id in asked["imageIds"].as_array().into_iter().flatten() {
            let images = self.images(&manifests);
            let found = match (id["imageTag"].as_str(), id["imageDigest"].as_str()) {
                (Some(tag), _) => (images.iter()).find(|image| image.1.iter().any(|t| t == tag)),
                (None, Some(digest)) => images.iter().find(|image| image.0 == digest),
                (None, None) => None,
            };
            let Some((digest, tags, _)) = found else {
                failures.push(json!({
                    "imageId": id,
                    "failureCode": "ImageNotFound",
                    "failureReason": "Requested image not found",
                }));
                continue;
            };
            let removed: Vec<&String> = match id["imageTag"].as_str() {
                Some(tag) => tags.iter().filter(|t| *t == tag).collect(),
                None => tags.iter().collect(),
            };
            for tag in &removed {
                let _ = std::fs::remove_dir_all(manifests.join(format!("tags/{tag}")));
                deleted.push(json!({"imageDigest": digest, "imageTag": tag}));
            }
            if removed.len() == tags.len() {
                // The last tag, or a digest: the image goes, by distribution's own deletion.
                let url = format!("http://{}/v2/{name}/manifests/{digest}", self.registry);
                let _ = ureq::delete(&url).call();
                if tags.is_empty() {
                    deleted.push(json!({"imageDigest": digest}));
                }
            }
        }
        let answer = json!({"imageIds": deleted, "failures": failures});
        (200, answer.to_string())
    }

    /// Every manifest of the repository (its revisions), with the tags that name it and the
    /// time it was pushed (its revision link's), in seconds.
    fn images(&self, manifests: &Path) -> Vec<(String, Vec<String>, u64)> {
        let mut tags: Vec<(String, String)> = Vec::new();
        for entry in read_dir(&manifests.join("tags")) {
            let tag = entry.file_name().to_string_lossy().into_owned();
            if let Ok(link) = std::fs::read_to_string(entry.path().join("current/link")) {
                tags.push((tag, link.trim().to_string()));
            }
        }
        let mut images = Vec::new();
        for entry in read_dir(&manifests.join("revisions/sha256")) {
            let link = entry.path().join("link");
            let Ok(pushed) = std::fs::metadata(&link).and_then(|m| m.modified()) else {
                continue;
            };
            let digest = format!("sha256:{}", entry.file_name().to_string_lossy());
            let named = (tags.iter())
                .filter(|(_, names)| *names == digest)
                .map(|(tag, _)| tag.clone())
                .collect();
            let pushed = pushed.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            images.push((digest, named, pushed));
        }
        images.sort();
        images
    }

    /// The manifest's own `mediaType`, from its blob.
    fn media_type(&self, digest: &str) -> Value {
        let hex = digest.trim_start_matches("sha256:");
        let blob = (self.root).join(format!("blobs/sha256/{}/{hex}/data", &hex[..2]));
        let manifest: Value = std::fs::read(blob)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or(Value::Null);
        manifest["mediaType"].clone()
    }
}

fn read_dir(folder: &Path) -> Vec<std::fs::DirEntry> {
    std::fs::read_dir(folder)
        .map(|entries| entries.flatten().collect())
        .unwrap_or_default()
}

/// An error of ECR's API (JSON 1.1): status 400, its `__type` and message.
fn error(kind: &str, message: &str) -> (u16, String) {
    (400, json!({"__type": kind, "message": message}).to_string())
}
