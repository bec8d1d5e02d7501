//! The re-apply rule. `kubectl apply` re-sends the image the user wrote while the live Pod runs
//! its swap; deciding it afresh would restart the container for nothing. Separate because it is
//! the one place where the live Pod's record of original images decides anything.

use std::collections::BTreeMap;

use crate::rules::Router;

use super::candidates::Candidate;

/// The old image to keep for `candidate`, when its new image is the original recorded for it in
/// the live Pod and its old image is what routing that original gives: no lookup, no restart.
/// The record alone never decides: an entry that does not match the old image is ignored.
pub(super) fn running_swap<'o>(
    candidate: &Candidate<'o>,
    recorded: &BTreeMap<String, String>,
    router: &Router,
) -> Option<&'o str> {
    let old_image = candidate.old_image?;
    let original = recorded.get(candidate.name)?;
    (original == candidate.image && router.is_swap_of(candidate.image, old_image))
        .then_some(old_image)
}
