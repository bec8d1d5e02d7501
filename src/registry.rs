//! The registry lookups a decision needs, as one small interface: Kubewarden's OCI host
//! capabilities implement it in the module (`host`), an in-memory table in unit tests. It is a
//! file of its own so that the decision, the budget and the host all depend on it, not on each
//! other.

use crate::policy::Platform;
use crate::signatures::Verification;

/// The registry lookups a decision needs; Kubewarden's OCI host capabilities in the policy
/// module, an in-memory table in unit tests.
pub trait Registry {
    /// The manifest digest the registry serves for `image` (`v1/manifest_digest`).
    fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError>;
    /// The manifest or index itself (`v1/oci_manifest`), for `verifySource`.
    fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError>;
    /// Verifies `image`'s cosign signatures as `verification` asks (`v2/verify`), and answers
    /// the digest that verified: it stands in for the existence lookup of `image`. A copy that
    /// is there but does not verify is [`LookupError::Unverified`].
    fn verify(
        &mut self,
        image: &str,
        verification: &Verification<'_>,
    ) -> Result<String, LookupError>;
    /// Whether the lookups of `images`, made in that order, are likely to end within the
    /// admission's lookup budget; asked before a decision starts a sequence of lookups, so that
    /// none is spent on a decision the budget would then cut short. Without a budget, always.
    fn affordable(&mut self, _images: &[&str]) -> Result<(), Refusal> {
        Ok(())
    }
    /// The same prediction without a refusal: asked to choose between plans, of which the one
    /// not chosen is not a lookup refused. Without a budget, always.
    fn would_fit(&self, _images: &[&str]) -> bool {
        true
    }
}

/// `Registry::verify` for the registries of unit tests that never verify: a lookup error.
/// A macro, not a default method, so that no wrapper of a real registry forgets to pass
/// verifications on.
#[cfg(test)]
macro_rules! never_verifies {
    () => {
        fn verify(
            &mut self,
            image: &str,
            _verification: &crate::signatures::Verification<'_>,
        ) -> Result<String, crate::registry::LookupError> {
            Err(crate::registry::LookupError::Failed(format!(
                "{image}: this test registry does not verify"
            )))
        }
    };
}
#[cfg(test)]
pub(crate) use never_verifies;

/// The registry host of a fully qualified image reference: what a lookup's cost depends on.
pub fn registry_host(image: &str) -> &str {
    image.split_once('/').map_or(image, |(host, _)| host)
}

/// What `verifySource` needs of a manifest: the content it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Manifest {
    /// A single-platform image or an artifact: its config, and for artifacts its layers.
    Image(ImageManifest),
    /// A multi-platform index.
    Index { entries: Vec<IndexEntry> },
}

/// The digest of OCI's empty config (`{}`), which artifacts use when they have no config.
pub const EMPTY_CONFIG_DIGEST: &str =
    "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";

/// A single manifest, as far as its content goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageManifest {
    pub config_digest: String,
    /// The layer digests, in order.
    pub layers: Vec<String>,
    /// Set on OCI artifacts (Helm charts, signatures, SBOMs).
    pub artifact_type: Option<String>,
}

impl ImageManifest {
    /// Whether two manifests name the same content. An image's content is its config (which
    /// names the uncompressed layers, so a copy that recompresses them still compares equal).
    /// An artifact's config says nothing of its content (they share the empty config), so
    /// artifacts are the same only with the same config and the same layers.
    pub fn same_content(&self, other: &ImageManifest) -> bool {
        let artifact =
            |m: &ImageManifest| m.artifact_type.is_some() || m.config_digest == EMPTY_CONFIG_DIGEST;
        self.config_digest == other.config_digest
            && self.artifact_type == other.artifact_type
            && (!(artifact(self) || artifact(other)) || self.layers == other.layers)
    }
}

/// One entry of an index: a manifest digest and the whole platform it is for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexEntry {
    pub digest: String,
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
    /// Windows images list one entry per `os.version` for one os/architecture.
    pub os_version: Option<String>,
    pub os_features: Vec<String>,
}

impl IndexEntry {
    /// Build attestations and other non-runnable entries say `unknown/unknown`.
    pub fn is_runnable(&self) -> bool {
        self.os != "unknown" && self.architecture != "unknown" && !self.os.is_empty()
    }

    /// The entry's whole platform, for messages: `linux/arm64/v8`,
    /// `windows/amd64 os.version 10.0.17763.5830`.
    pub fn describe(&self) -> String {
        let mut text = format!("{}/{}", self.os, self.architecture);
        if let Some(variant) = &self.variant {
            text.push('/');
            text.push_str(variant);
        }
        if let Some(version) = &self.os_version {
            text.push_str(" os.version ");
            text.push_str(version);
        }
        if !self.os_features.is_empty() {
            text.push_str(" os.features ");
            text.push_str(&self.os_features.join(","));
        }
        text
    }

    /// Whether `other` is listed for the very same platform: os, architecture, variant,
    /// `os.version` and `os.features`.
    pub fn same_platform(&self, other: &IndexEntry) -> bool {
        self.os == other.os
            && self.architecture == other.architecture
            && self.variant == other.variant
            && self.os_version == other.os_version
            && self.os_features == other.os_features
    }

    pub fn selected_by(&self, platform: &Platform) -> bool {
        platform.covers(&self.os, &self.architecture, self.variant.as_deref())
    }
}

/// Why a lookup gave no digest. Only a registry's explicit "unknown" is [`LookupError::Absent`];
/// anything the policy cannot recognise is [`LookupError::Failed`], so that an outage is never
/// mistaken for a pruned image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LookupError {
    Absent(String),
    Failed(String),
    /// Verified, and it did not verify: the image is there (or its signature is not), but no
    /// signature satisfies the rule. The host's words.
    Unverified(String),
    /// Not asked: the admission's lookup budget would likely have run out first.
    OverBudget(Refusal),
}

/// Why the budget did not start a lookup (or a sequence of lookups): the registry whose
/// lookup was not started, what it was predicted to need, and what was left of the budget.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refusal {
    pub registry: String,
    pub needed_ms: u64,
    pub left_ms: u64,
}

impl Refusal {
    /// "mirror.example.com would need about 320 ms, 150 ms were left", or, when nothing was
    /// left, "the budget had run out before a lookup on mirror.example.com".
    pub fn describe(&self) -> String {
        if self.left_ms == 0 {
            format!(
                "the budget had run out before a lookup on {}",
                self.registry
            )
        } else {
            format!(
                "{} would need about {} ms, {} ms were left",
                self.registry, self.needed_ms, self.left_ms
            )
        }
    }
}
