//! The registry lookups a decision needs, as one small interface: Kubewarden's OCI host
//! capabilities implement it in the module (`host`), an in-memory table in unit tests. It is a
//! file of its own so that the decision, the budget and the host all depend on it, not on each
//! other.

use crate::policy::Platform;

/// The registry lookups a decision needs; Kubewarden's OCI host capabilities in the policy
/// module, an in-memory table in unit tests.
pub trait Registry {
    /// The manifest digest the registry serves for `image` (`v1/manifest_digest`).
    fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError>;
    /// The manifest or index itself (`v1/oci_manifest`), for `verifySource`.
    fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError>;
}

/// What `verifySource` needs of a manifest: the content it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Manifest {
    /// A single-platform image, named by its config digest.
    Image { config_digest: String },
    /// A multi-platform index.
    Index { entries: Vec<IndexEntry> },
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
    /// Not asked: the admission's lookup budget would likely have run out first.
    OverBudget,
}
