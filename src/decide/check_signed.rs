//! The check role's judgement of a pinned mirror image a rule of `signatures` (or of a
//! verifier) covers: which source it is the copy of, and whether that source still vouches for
//! the digest it runs (a revocation), or (with the mirror's tags trusted) whether the source's
//! tag still names it (a drift), and (under a rule that covers the mirror's name too) whether the
//! mirror holds the source's signature of it. Separate from `check` because it is the one part that asks
//! the source.

use crate::policy::Policy;
use crate::reference::Reference;
use crate::registry::{LookupError, Registry};
use crate::signatures::{Verification, covers, rules_covering};
use crate::text::quote;

use super::failure::Failure;
use super::images::MirrorImage;
use super::mirror_digest;
use super::mirror_signature::signature_copied;
use super::presence::Presence;

/// The spellings of a pinned mirror image's source that a rule of `signatures` (or of a
/// verifier) covers, with the source the check asks: the Pod's record of its original when
/// routing it gives this very image, and the sources that route to the mirror image (so that
/// an image written under the mirror's name by hand is checked as its source too).
pub(super) fn signed_mirror(
    image: &str,
    original: Option<&str>,
    mirror: &MirrorImage,
    policy: &Policy,
) -> Option<(Vec<String>, Reference)> {
    if policy.signatures.is_empty() {
        return None;
    }
    mirror.digest()?;
    let recorded = original
        .filter(|original| policy.router.is_swap_of(original, image))
        .and_then(|original| Some((original, Reference::parse(original).ok()?)));
    let written = Reference::parse(image).ok()?;
    let sources = policy.router.sources_of(&written);
    let mut spellings: Vec<String> = sources.iter().flat_map(|s| s.spellings()).collect();
    let chosen = match recorded {
        Some((original, reference)) => {
            spellings.push(original.to_string());
            reference
        }
        None => sources
            .iter()
            .find(|source| source.forward)
            .or_else(|| sources.first())?
            .reference
            .clone(),
    };
    let (rules, _) = rules_covering(&policy.signatures, &spellings);
    (!rules.is_empty()).then_some((spellings, chosen))
}

/// With the mirror's tags trusted: whether the source's tag still names the digest the mirror
/// image pins, and verifies there.
pub(super) fn check_drift(
    tagged: &str,
    mirror: &MirrorImage,
    verifications: &[Verification<'_>],
    registry: &mut impl Registry,
) -> Presence {
    let digest = mirror.digest().unwrap_or_default();
    match mirror_digest(registry, tagged, verifications) {
        Ok(now) if now == digest => Presence::Present,
        Ok(now) => Presence::Drifted {
            digest: digest.to_string(),
            now,
        },
        Err(LookupError::Unverified(answer)) => Presence::RevokedAtSource {
            answer,
            digest: digest.to_string(),
        },
        Err(LookupError::Absent(why) | LookupError::Failed(why)) => Presence::NotChecked(format!(
            "could not verify it at its source {} ({why})",
            quote(tagged)
        )),
        Err(LookupError::OverBudget(refusal)) => Presence::OverBudget(refusal),
    }
}

/// Whether the digest a mirror image pins still verifies at its source, as a verifier on the
/// source would verify it now.
pub(super) fn check_at_source(
    source: &str,
    mirror: &MirrorImage,
    verifications: &[Verification<'_>],
    registry: &mut impl Registry,
) -> Presence {
    let digest = mirror.digest().unwrap_or_default();
    match mirror_digest(registry, source, verifications) {
        Ok(answer) if answer == digest => Presence::Present,
        Ok(answer) => Presence::NotChecked(format!(
            "its source's verification answered digest {answer} for {}",
            quote(source)
        )),
        Err(LookupError::Unverified(answer)) => Presence::RevokedAtSource {
            answer,
            digest: digest.to_string(),
        },
        Err(LookupError::Absent(why) | LookupError::Failed(why)) => Presence::NotChecked(format!(
            "could not verify it at its source {} ({why})",
            quote(source)
        )),
        Err(LookupError::OverBudget(refusal)) => Presence::OverBudget(refusal),
    }
}

/// Under a rule that also covers the mirror image's own name (rules on `*`, or on the target),
/// whether the mirror's signature tag of the digest it pins is the source's (`source` is
/// `name@digest`): the swap requires it of every copy it swaps to (`mirror_signature`), since a
/// verifier after this policy verifies the copy where it runs. One lookup at each side.
pub(super) fn check_mirror_signature(
    image: &str,
    source: &str,
    mirror: &MirrorImage,
    policy: &Policy,
    registry: &mut impl Registry,
) -> Presence {
    let Some(digest) = mirror.digest() else {
        return Presence::Present;
    };
    if !covers(&policy.signatures, image) {
        return Presence::Present;
    }
    let source_name = source.split_once('@').map_or(source, |(name, _)| name);
    match signature_copied(source_name, mirror.repository(), digest, registry) {
        Ok(()) => Presence::Present,
        Err((_, Failure::Unverified(why, _))) => Presence::SignatureNotCopied {
            why,
            digest: digest.to_string(),
        },
        Err((_, Failure::Budget { refusal, .. })) => Presence::OverBudget(refusal),
        Err((_, Failure::LookupError(why))) => Presence::NotChecked(why),
        Err((at, _)) => Presence::NotChecked(format!(
            "its signature in the mirror ({}) could not be compared with the source's",
            quote(&at)
        )),
    }
}
