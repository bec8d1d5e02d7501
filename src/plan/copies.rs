//! The copies the policy suggests, in the one form the fill job reads (`COPY_COMMAND`): each safe
//! to run unread, copying exactly what a Pod needs and never moving a mirror tag to other
//! content.

use crate::decide::images::{MirrorImage, SourceImage};
use crate::reference::Reference;

/// The copy that puts a gone mirror image back, safe to run unread: exactly what the kubelet
/// pulls, and never a mirror tag moved to other content. A pinned image copies its digest from
/// the source (which a copy with preserved digests shares) to a tag of its own
/// (`sha256-<hex>`): the tag beside the digest may name newer content in the mirror now, and a
/// tag keeps "delete untagged" rules off the copy. An image by tag copies to the mirror's tag,
/// which the mirror just said it lacks: the digest the container runs (`running`, from its
/// status) when known, so that its next pull gets what it runs now, else the source's tag.
pub(crate) fn refill_command(
    original: &str,
    image: &MirrorImage,
    running: Option<&str>,
) -> Option<String> {
    let original = Reference::parse(original).ok()?;
    let source = match (image.digest(), running, original.tag()) {
        (Some(digest), _, _) | (None, Some(digest), _) => format!("{}@{digest}", original.name()),
        (None, None, Some(tag)) => format!("{}:{tag}", original.name()),
        (None, None, None) => original.as_str().to_string(),
    };
    let destination = match image.digest() {
        Some(digest) => own_tag(image.repository(), digest),
        None => image.lookup.clone(),
    };
    Some(copy_command(&source, &destination))
}

/// The copy that fills the first target with a source image no target holds: by digest to a
/// tag of its own, or by tag to the same tag (which every target just said it lacks).
pub(crate) fn fill_command(source: &SourceImage) -> String {
    let Some(first) = source.targets.first() else {
        return String::new();
    };
    let destination = match first.digest() {
        Some(digest) => own_tag(first.repository(), digest),
        None => first.lookup.clone(),
    };
    copy_command(&source.source, &destination)
}

/// The copy of a source image's cosign signature to a mirror repository: the tag
/// `sha256-<hex>.sig` beside the image, where verifiers look for it (sigstore-rs
/// `triangulate`), copied as it is, so that the mirror's copy of `digest` verifies under the
/// same rule as the source. A signature names the image's digest, not its name, so the copy
/// verifies at the mirror name.
pub(crate) fn signature_command(source_name: &str, repository: &str, digest: &str) -> String {
    copy_command(
        &signature_tag(source_name, digest),
        &signature_tag(repository, digest),
    )
}

/// `repository:sha256-<hex>.sig`: cosign's signature tag of `digest` in `repository`.
pub(crate) fn signature_tag(repository: &str, digest: &str) -> String {
    format!("{}.sig", own_tag(repository, digest))
}

/// `repository:sha256-<hex>`: the tag a copy by digest is pushed to.
fn own_tag(repository: &str, digest: &str) -> String {
    format!("{repository}:{}", digest.replacen(':', "-", 1))
}

/// The form the fill job finds in a report's message, and a person can run as it is:
/// `skopeo copy --all --preserve-digests docker://SOURCE docker://DESTINATION`, both references
/// in the reference grammar's characters only, so the copy ends at the first other character.
pub const COPY_COMMAND: &str = "skopeo copy --all --preserve-digests";

fn copy_command(source: &str, destination: &str) -> String {
    format!("{COPY_COMMAND} docker://{source} docker://{destination}")
}
