//! With verification at the source, the mirror copy the Pod is swapped to must also verify
//! where a verifier after this policy sees it: when a rule covers the mirror's name too (rules
//! on `*`, or on the target), that verifier verifies the copy at the mirror, which then needs
//! the source's signature beside it. A second full verification does not fit the budget; the
//! cosign signature tag (`sha256-<hex>.sig`, sigstore-rs `triangulate`) of the digest that
//! verified is compared instead, one lookup at each side: the same manifest there is the same
//! signature. And a copy whose mirror name alone a rule matches (the source's name it does not)
//! is verified there before an existence-lookup swap (`verified_at_mirror_name`).

use crate::policy::Policy;
use crate::registry::{LookupError, Registry};
use crate::signatures::verifications_for;
use crate::text::quote;

use super::failure::Failure;
use super::{joined, mirror_digest, verified_digest};

/// `sha256:<hex>` -> `sha256-<hex>.sig`.
pub(super) fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replacen(':', "-", 1))
}

/// Whether `mirror_repository` holds the signature tag of `digest` that `source_repository`
/// holds; the failure (and the lookup that failed) when not.
pub(super) fn signature_copied(
    source_repository: &str,
    mirror_repository: &str,
    digest: &str,
    registry: &mut impl Registry,
) -> Result<(), (String, Failure)> {
    let tag = signature_tag(digest);
    let at_source = joined(source_repository, ':', &tag);
    let at_mirror = joined(mirror_repository, ':', &tag);
    if let Err(refusal) = registry.affordable(&[&at_source, &at_mirror]) {
        let failure = Failure::Budget {
            not_done: "its signature in the mirror not compared with the source's",
            digests: None,
            refusal,
        };
        return Err((at_mirror, failure));
    }
    let source = match verified_digest(registry, &at_source) {
        Ok(source) => source,
        Err(error) => {
            let why = format!(
                "could not look up its signature {} at the source ({})",
                quote(&at_source),
                describe(&error)
            );
            return Err((at_mirror, Failure::LookupError(why)));
        }
    };
    let unverified = |why: String| Failure::unverified(why, Some(digest.to_string()));
    match verified_digest(registry, &at_mirror) {
        Ok(mirror) if mirror == source => Ok(()),
        Ok(mirror) => Err((
            at_mirror,
            unverified(format!(
                "its signature tag {tag} there is {mirror}, not the source's {source}; a verifier whose rules match the mirror's name would verify that one"
            )),
        )),
        Err(LookupError::Absent(why)) => Err((
            at_mirror,
            unverified(format!(
                "the mirror lacks its signature tag {tag} ({why}), which a verifier whose rules match the mirror's name needs"
            )),
        )),
        Err(error) => {
            let failure = match error {
                LookupError::OverBudget(refusal) => Failure::not_looked_up(refusal),
                other => Failure::LookupError(format!(
                    "could not look up its signature in the mirror ({})",
                    describe(&other)
                )),
            };
            Err((at_mirror, failure))
        }
    }
}

/// A rule that does not match the image as the Pod writes it may match its mirror name (`*/*`
/// beside the short name `nginx:1.27`): a verifier after this policy with that rule verifies the
/// copy, where alone it would have admitted the source unverified. So the copy is swapped to only
/// when it verifies there at the digest swapped to; otherwise the source is kept, as that
/// verifier alone would see it, whatever `onUnverified` says (the source is no rule's).
pub(super) fn verified_at_mirror_name(
    swapped: &str,
    policy: &Policy,
    registry: &mut impl Registry,
) -> Result<(), (String, Failure)> {
    let verifications = verifications_for(&policy.signatures, swapped);
    if verifications.is_empty() {
        return Ok(());
    }
    let pinned = swapped.rsplit_once('@').map(|(_, digest)| digest);
    match mirror_digest(registry, swapped, &verifications) {
        Ok(answer) if pinned.is_none_or(|pinned| pinned == answer) => Ok(()),
        Ok(answer) => Err((
            swapped.to_string(),
            Failure::LookupError(format!(
                "could not verify it at its mirror name, which a rule of signatures matches: the verification answered digest {answer} for it"
            )),
        )),
        Err(LookupError::Unverified(why)) => Err((
            swapped.to_string(),
            Failure::UnverifiedAtMirrorName(
                format!(
                    "its copy there does not verify (a rule of signatures matches its mirror name, where it does not verify: {why})"
                ),
                pinned.map(str::to_string),
            ),
        )),
        Err(error) => Err((swapped.to_string(), error.into())),
    }
}

fn describe(error: &LookupError) -> String {
    match error {
        LookupError::Absent(why) | LookupError::Failed(why) | LookupError::Unverified(why) => {
            why.clone()
        }
        LookupError::OverBudget(refusal) => refusal.describe(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{DIGEST_A, DIGEST_B, FakeRegistry, policy_from};
    use super::super::{Decision, Reason, decide};
    use crate::registry::LookupError;
    use rstest::rstest;

    const SOURCE_SIG: &str = "docker.io/library/nginx:sha256-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb.sig";
    const MIRROR_SIG: &str = "m.io/hub/library/nginx:sha256-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb.sig";

    /// A rule that matches only the mirror's name (`*/*` beside the short name `nginx:1.27`):
    /// alone, a verifier with it admits the short name unverified; after the swapper it
    /// verifies the copy. So the copy is swapped to only when it verifies at the digest swapped
    /// to, and otherwise the source is kept, as that verifier alone would have it.
    #[rstest]
    #[case::the_copy_verifies(Ok(DIGEST_A.to_string()), true)]
    #[case::the_copy_is_unsigned(Err(LookupError::Unverified("no signatures found".to_string())), false)]
    fn a_rule_on_the_mirror_name_alone_is_verified_at_the_copy_before_the_swap(
        #[case] at_mirror: Result<String, LookupError>,
        #[case] swapped: bool,
        #[values("keep", "reject")] on_unverified: &str,
    ) {
        // `onUnverified: reject` too keeps the source: no rule covers it as the Pod writes it,
        // so the verifier alone admits it.
        let policy = policy_from(&format!(
            r#"{{"mirrors":[{{"source":"docker.io","target":"m.io/hub"}}],"verifySource":false,
            "onUnverified":"{on_unverified}",
            "signatures":[{{"image":"*/*","pubKeys":["-----BEGIN PUBLIC KEY-----\nK\n-----END PUBLIC KEY-----"]}}]}}"#
        ));
        let copy = format!("m.io/hub/library/nginx:1.27@{DIGEST_A}");
        let mut registry =
            FakeRegistry::default().with("m.io/hub/library/nginx:1.27", Ok(DIGEST_A));
        registry.verifications.insert(copy.clone(), at_mirror);
        let decision = decide("nginx:1.27", &policy, &mut registry);
        match (swapped, &decision) {
            (true, Decision::Swap { image, .. }) => assert_eq!(*image, copy),
            (false, Decision::Keep(note)) => {
                assert_eq!(note.reason, Reason::Unverified, "{}", note.text);
                assert!(
                    note.text.contains("matches its mirror name"),
                    "{}",
                    note.text
                );
            }
            _ => panic!("{swapped}, onUnverified {on_unverified}: {decision:?}"),
        }
        assert_eq!(
            registry.asked,
            [
                "m.io/hub/library/nginx:1.27".to_string(),
                format!("verify {copy}")
            ]
        );
    }

    /// Rules on `*` (so on the mirror's name too), verified at the source at B, the mirror
    /// holding B: swapped only when the mirror's signature tag of B is the source's.
    #[rstest]
    #[case::same_signature(Ok(DIGEST_A), None)]
    #[case::another_signature(Ok(DIGEST_B), Some(Reason::Unverified))]
    #[case::no_signature(Err(LookupError::Absent("manifest unknown".to_string())), Some(Reason::Unverified))]
    #[case::mirror_down(Err(LookupError::Failed("connection refused".to_string())), Some(Reason::LookupError))]
    fn a_copy_a_rule_covers_at_the_mirror_needs_the_sources_signature_there(
        #[case] at_mirror: Result<&str, LookupError>,
        #[case] kept: Option<Reason>,
    ) {
        let policy = policy_from(
            r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"}],
            "signatures":[{"image":"*","pubKeys":["-----BEGIN PUBLIC KEY-----\nK\n-----END PUBLIC KEY-----"]}]}"#,
        );
        let pinned = format!("m.io/hub/library/nginx@{DIGEST_B}");
        let mut registry = FakeRegistry::default()
            .with(&pinned, Ok(DIGEST_B))
            .with(SOURCE_SIG, Ok(DIGEST_A))
            .with(MIRROR_SIG, at_mirror);
        registry.verifications.insert(
            "docker.io/library/nginx:1.27".to_string(),
            Ok(DIGEST_B.to_string()),
        );
        let decision = decide("nginx:1.27", &policy, &mut registry);
        match (kept, &decision) {
            (None, Decision::Swap { image, .. }) => {
                assert_eq!(*image, format!("m.io/hub/library/nginx:1.27@{DIGEST_B}"));
            }
            (Some(reason), Decision::Keep(note)) => {
                assert_eq!(note.reason, reason, "{}", note.text);
                if reason == Reason::Unverified {
                    // The digest names the signature tag the fill job copies.
                    assert_eq!(note.unverified_digest.as_deref(), Some(DIGEST_B));
                }
            }
            _ => panic!("{kept:?}: {decision:?}"),
        }
        assert_eq!(
            registry.asked,
            [
                "verify docker.io/library/nginx:1.27".to_string(),
                pinned,
                SOURCE_SIG.to_string(),
                MIRROR_SIG.to_string()
            ]
        );
    }
}
