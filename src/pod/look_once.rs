//! One answer per distinct lookup per admission: the registry interface wrapped so that many
//! containers with one image, or several decisions needing one manifest, cost one host call.

use std::collections::BTreeMap;

use crate::registry::{LookupError, Manifest, Registry};
use crate::signatures::Verification;

/// Asks the registry once per distinct lookup per admission, however many containers or
/// decisions need it; lookups keep the order of their first use. A refusal of the budget is
/// remembered too: the budget only shrinks, so asking again would be refused again.
pub(super) struct LookOnce<'r, R: Registry> {
    inner: &'r mut R,
    digests: BTreeMap<String, Result<String, LookupError>>,
    manifests: BTreeMap<String, Result<Manifest, LookupError>>,
    /// Keyed by the image and what was asked of it.
    verifications: BTreeMap<String, Result<String, LookupError>>,
}

impl<'r, R: Registry> LookOnce<'r, R> {
    pub(super) fn new(inner: &'r mut R) -> Self {
        LookOnce {
            inner,
            digests: BTreeMap::new(),
            manifests: BTreeMap::new(),
            verifications: BTreeMap::new(),
        }
    }
}

impl<R: Registry> Registry for LookOnce<'_, R> {
    fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
        let inner = &mut self.inner;
        self.digests
            .entry(image.to_string())
            .or_insert_with(|| inner.manifest_digest(image))
            .clone()
    }

    fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError> {
        let inner = &mut self.inner;
        self.manifests
            .entry(image.to_string())
            .or_insert_with(|| inner.manifest(image))
            .clone()
    }

    fn verify(
        &mut self,
        image: &str,
        verification: &Verification<'_>,
    ) -> Result<String, LookupError> {
        let inner = &mut self.inner;
        self.verifications
            .entry(format!("{image} {verification:?}"))
            .or_insert_with(|| inner.verify(image, verification))
            .clone()
    }

    fn affordable(&mut self, images: &[&str]) -> Result<(), crate::registry::Refusal> {
        self.inner.affordable(images)
    }

    fn would_fit(&self, images: &[&str]) -> bool {
        self.inner.would_fit(images)
    }
}
