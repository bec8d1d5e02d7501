//! Small images with known content, made by the tests: single-platform manifests in OCI or
//! Docker v2 format, and multi-platform indexes.

use serde_json::json;

use super::registry::{TestRegistry, sha256};

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// One platform's image: a config and one layer, and the manifest that names them.
#[derive(Clone, Debug)]
pub struct Image {
    pub os: String,
    pub architecture: String,
    pub config: Vec<u8>,
    pub layer: Vec<u8>,
    pub manifest: Vec<u8>,
    pub media_type: &'static str,
}

impl Image {
    /// An OCI image whose content is determined by `content`.
    pub fn new(content: &str, platform: &str) -> Image {
        let (os, architecture) = platform.split_once('/').unwrap_or(("linux", platform));
        let layer = format!("layer of {content} for {platform}").into_bytes();
        let config = serde_json::to_vec(&json!({
            "architecture": architecture,
            "os": os,
            "config": {"Labels": {"content": content}},
            "rootfs": {"type": "layers", "diff_ids": [sha256(&layer)]},
        }))
        .expect("config JSON");
        let mut image = Image {
            os: os.to_string(),
            architecture: architecture.to_string(),
            config,
            layer,
            manifest: Vec::new(),
            media_type: OCI_MANIFEST,
        };
        image.manifest = image.manifest_json(
            OCI_MANIFEST,
            "application/vnd.oci.image.config.v1+json",
            "application/vnd.oci.image.layer.v1.tar+gzip",
        );
        image
    }

    /// The same config and layer under a Docker v2 manifest: another manifest digest, the same
    /// content, as a copy that converts formats makes.
    pub fn as_docker_v2(&self) -> Image {
        let mut image = self.clone();
        image.media_type = DOCKER_MANIFEST;
        image.manifest = self.manifest_json(
            DOCKER_MANIFEST,
            "application/vnd.docker.container.image.v1+json",
            "application/vnd.docker.image.rootfs.diff.tar.gzip",
        );
        image
    }

    fn manifest_json(&self, media_type: &str, config_type: &str, layer_type: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": media_type,
            "config": {"mediaType": config_type, "digest": sha256(&self.config), "size": self.config.len()},
            "layers": [{"mediaType": layer_type, "digest": sha256(&self.layer), "size": self.layer.len()}],
        }))
        .expect("manifest JSON")
    }

    pub fn digest(&self) -> String {
        sha256(&self.manifest)
    }

    pub fn config_digest(&self) -> String {
        sha256(&self.config)
    }

    /// Pushes blobs and manifest; tags it when `tag` is given, else stores it by digest.
    pub fn push(&self, registry: &TestRegistry, repository: &str, tag: Option<&str>) -> String {
        registry
            .push_blob(repository, &self.config)
            .expect("push config");
        registry
            .push_blob(repository, &self.layer)
            .expect("push layer");
        let digest = self.digest();
        registry
            .push_manifest(
                repository,
                tag.unwrap_or(&digest),
                self.media_type,
                &self.manifest,
            )
            .expect("push manifest")
    }
}

/// A multi-platform index over single-platform images.
pub struct Index {
    pub images: Vec<Image>,
    pub manifest: Vec<u8>,
}

impl Index {
    pub fn new(images: Vec<Image>) -> Index {
        let manifests: Vec<_> = images
            .iter()
            .map(|image| {
                json!({
                    "mediaType": image.media_type,
                    "digest": image.digest(),
                    "size": image.manifest.len(),
                    "platform": {"os": image.os, "architecture": image.architecture},
                })
            })
            .collect();
        let manifest = serde_json::to_vec(
            &json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}),
        )
        .expect("index JSON");
        Index { images, manifest }
    }

    pub fn digest(&self) -> String {
        sha256(&self.manifest)
    }

    pub fn push(&self, registry: &TestRegistry, repository: &str, tag: &str) -> String {
        for image in &self.images {
            image.push(registry, repository, None);
        }
        registry
            .push_manifest(repository, tag, OCI_INDEX, &self.manifest)
            .expect("push index")
    }
}

/// Fills `registry` with `n` small distinct images, `{prefix}/library/app{i}:1`, so that Pods of
/// `app{i}:1` images routed to `{registry}/{prefix}` find them all.
pub fn push_apps(registry: &TestRegistry, prefix: &str, n: usize) {
    for i in 0..n {
        Image::new(&format!("app {i}"), "linux/amd64").push(
            registry,
            &format!("{prefix}/library/app{i}"),
            Some("1"),
        );
    }
}

/// An OCI artifact (a Helm chart, a signature): the empty config, its content in one layer, and
/// an `artifactType`. Every such artifact shares one config digest.
pub struct Artifact {
    pub layer: Vec<u8>,
    pub manifest: Vec<u8>,
}

/// OCI's empty config, `{}`.
pub const EMPTY_CONFIG: &[u8] = b"{}";

impl Artifact {
    pub fn new(content: &str) -> Artifact {
        let layer = format!("artifact {content}").into_bytes();
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": "application/vnd.example.chart.v1",
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": sha256(EMPTY_CONFIG), "size": EMPTY_CONFIG.len()},
            "layers": [{"mediaType": "application/vnd.example.chart.content.v1.tar+gzip", "digest": sha256(&layer), "size": layer.len()}],
        }))
        .expect("manifest JSON");
        Artifact { layer, manifest }
    }

    pub fn push(&self, registry: &TestRegistry, repository: &str, tag: &str) -> String {
        registry
            .push_blob(repository, EMPTY_CONFIG)
            .expect("push config");
        registry
            .push_blob(repository, &self.layer)
            .expect("push layer");
        registry
            .push_manifest(repository, tag, OCI_MANIFEST, &self.manifest)
            .expect("push manifest")
    }
}
