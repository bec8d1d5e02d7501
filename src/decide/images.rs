//! The images the check role and the plan of copies ask about: a mirror image as the lookup a
//! node's pull makes, and a source image a rule routes, with each target's lookup. Apart from
//! `check` because the plan of copies names them too, and the signed checks read them.

use crate::policy::Policy;
use crate::reference::Reference;
use crate::rules::Router;

use super::{Routed, joined, route};

/// A mirror image, as the lookup that asks the mirror for exactly what a node pulls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorImage {
    /// `repository@digest` when the image names a digest (the kubelet pulls the digest, the
    /// tag beside it is ignored), else `repository:tag`.
    pub lookup: String,
    /// Where the repository ends in `lookup`.
    repository_end: usize,
}

impl MirrorImage {
    pub fn repository(&self) -> &str {
        &self.lookup[..self.repository_end]
    }

    /// The digest the image pins, if it pins one.
    pub fn digest(&self) -> Option<&str> {
        self.lookup[self.repository_end..].strip_prefix('@')
    }

    /// `repository:tag` or `repository@digest` under `repository`.
    fn under(repository: &str, reference: &Reference) -> MirrorImage {
        let lookup = match (reference.digest(), reference.tag()) {
            (Some(digest), _) => joined(repository, '@', digest),
            (None, Some(tag)) => joined(repository, ':', tag),
            (None, None) => repository.to_string(),
        };
        MirrorImage {
            lookup,
            repository_end: repository.len(),
        }
    }
}

/// A source image a rule routes to a mirror: where the copy that fills the mirror comes from,
/// and each target's lookup, in the rule's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceImage {
    /// The image as the Pod writes it: what the rules of `signatures` match.
    pub written: String,
    /// The source repository, normalised (`docker.io/library/nginx`).
    pub name: String,
    /// `name@digest` when the image names a digest (what the kubelet pulls), else `name:tag`:
    /// what a copy reads from the source.
    pub source: String,
    /// The same reference under each target, asked as a node would pull it.
    pub targets: Vec<MirrorImage>,
}

/// The source image `image` names, when a rule routes it to a mirror; `None` for images no
/// rule routes (unmatched, excluded, already under a target, not a reference).
pub fn source_image(image: &str, policy: &Policy) -> Option<SourceImage> {
    let Routed::Mirror {
        reference,
        destination,
    } = route(image, policy)
    else {
        return None;
    };
    let source = MirrorImage::under(reference.name(), &reference).lookup;
    let targets = destination
        .targets
        .iter()
        .map(|target| MirrorImage::under(&target.repository, &reference))
        .collect();
    Some(SourceImage {
        written: image.to_string(),
        name: reference.name().to_string(),
        source,
        targets,
    })
}

/// The mirror image `image` names, when it lies under a configured target in any spelling a
/// runtime resolves to it; `None` for every other image (no rule's business, or not a
/// reference a runtime would pull, which no node can pull either).
pub fn mirror_image(image: &str, router: &Router) -> Option<MirrorImage> {
    let reference = Reference::parse(image).ok()?;
    router.target_of(&reference)?;
    Some(MirrorImage::under(reference.name(), &reference))
}
