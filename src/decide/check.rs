//! The check role's decision for one image: whether the mirror still holds what a node would
//! pull (a mirror image), or whether any mirror holds a source image a rule routes there (what
//! the mirror lacks). Beside the swap's table because it shares routing and the lookup
//! interface, and nothing else: it never rewrites, so it needs no pinning, no comparison with
//! the source and no fallback settings.

use crate::policy::Policy;
use crate::registry::{LookupError, Registry};
use crate::text::quote;

use super::check_signed::{check_at_source, check_drift, check_mirror_signature, signed_mirror};
use super::images::{MirrorImage, SourceImage, mirror_image, source_image};
use super::presence::Presence;
use super::{joined, mirror_digest, verified_digest};
use crate::signatures::{Verification, rules_covering, verifications_for};

/// What the check asks about one distinct image of the Pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckedImage {
    /// A mirror image: still there? ("gone from the mirror")
    Mirror(MirrorImage),
    /// A source image a rule routes to a mirror: does any target hold it? ("not in the mirror")
    Source(SourceImage),
    /// A mirror image pinned to a digest, swapped from `written` (the Pod's record of its
    /// original, as the Pod wrote it), which a rule of `signatures` covers: still there, and
    /// does that digest still verify at its source (`source`, `name@digest`)?
    SignedMirror {
        mirror: MirrorImage,
        /// The mirror image as the Pod writes it: what a rule on the mirror's name matches.
        image: String,
        /// Every string a Pod could write for its source (the record's original, and the
        /// sources that route to the mirror image): what the rules are matched against.
        spellings: Vec<String>,
        source: String,
        /// `name:tag` at the source, when the mirror image names a tag: asked instead of the
        /// digest when the mirror's tags are trusted (`verifySource: false`), to see it drift.
        source_tag: Option<String>,
    },
}

impl CheckedImage {
    /// What `image` is to the check: a mirror image (re-verified at its source when the swap
    /// recorded an `original` that `signatures` covers, and the image pins the digest that
    /// verified), else (with `reportUnmirrored`) a source image a rule routes, else nothing.
    /// `original` is the Pod's record, taken only when routing it gives this very image.
    pub fn of(image: &str, original: Option<&str>, policy: &Policy) -> Option<CheckedImage> {
        if let Some(mirror) = mirror_image(image, &policy.router) {
            return Some(match signed_mirror(image, original, &mirror, policy) {
                Some((spellings, reference)) => CheckedImage::SignedMirror {
                    image: image.to_string(),
                    source: joined(reference.name(), '@', mirror.digest().unwrap_or_default()),
                    source_tag: reference
                        .tag()
                        .map(|tag| joined(reference.name(), ':', tag)),
                    mirror,
                    spellings,
                },
                None => CheckedImage::Mirror(mirror),
            });
        }
        if policy.report_unmirrored {
            return source_image(image, policy).map(CheckedImage::Source);
        }
        None
    }

    /// The lookup asked first: its registry orders the checks.
    pub fn first_lookup(&self) -> &str {
        match self {
            CheckedImage::Mirror(image) | CheckedImage::SignedMirror { mirror: image, .. } => {
                &image.lookup
            }
            CheckedImage::Source(image) => image.targets.first().map_or("", |t| t.lookup.as_str()),
        }
    }

    pub fn check(&self, policy: &Policy, registry: &mut impl Registry) -> Presence {
        match self {
            CheckedImage::Mirror(image) => check(image, registry),
            CheckedImage::SignedMirror {
                mirror,
                image,
                spellings,
                source,
                source_tag,
            } => match check(mirror, registry) {
                Presence::Present => {
                    let (_, verifications) = rules_covering(&policy.signatures, spellings);
                    match source_tag {
                        Some(tagged) if !policy.verify_covered_at_source => {
                            check_drift(tagged, mirror, &verifications, registry)
                        }
                        _ => match check_at_source(source, mirror, &verifications, registry) {
                            Presence::Present => {
                                check_mirror_signature(image, source, mirror, policy, registry)
                            }
                            other => other,
                        },
                    }
                }
                other => other,
            },
            CheckedImage::Source(image) => {
                let verifications = verifications_for(&policy.signatures, &image.written);
                check_source(image, &verifications, registry)
            }
        }
    }
}

/// Asks each target for the source image, in order, until one holds it. `Gone` when every
/// target said it lacks it, with each target's answer; `NotChecked` when none holds it and one
/// could not be asked (it may hold it); `OverBudget` when a lookup was not made.
///
/// With `verifications` (the rules of `signatures` that match it), a target holds the image
/// only when its copy verifies: one that is there unverified is remembered, and reported when
/// no target serves, with the copy that brings its signature.
pub fn check_source(
    image: &SourceImage,
    verifications: &[Verification<'_>],
    registry: &mut impl Registry,
) -> Presence {
    let mut gone = Vec::new();
    let mut failed = None;
    let mut unverified = None;
    for (at, target) in image.targets.iter().enumerate() {
        let presence = if verifications.is_empty() {
            check(target, registry)
        } else {
            check_verified(at, target, verifications, registry)
        };
        match presence {
            Presence::Present => return Presence::Present,
            found @ Presence::Unverified { .. } => {
                unverified.get_or_insert(found);
            }
            Presence::Gone(answer) => gone.push((target, answer)),
            // The message names the first target it asked; a reason from another says which.
            Presence::NotChecked(why) if image.targets.len() == 1 => {
                failed.get_or_insert(why);
            }
            Presence::NotChecked(why) => {
                failed.get_or_insert(format!("{}: {why}", quote(&target.lookup)));
            }
            Presence::OverBudget(refusal) => return Presence::OverBudget(refusal),
            // A target's copy is asked at the mirror only; kept as the answer should it come.
            revoked @ (Presence::RevokedAtSource { .. }
            | Presence::Drifted { .. }
            | Presence::SignatureNotCopied { .. }) => {
                return revoked;
            }
        }
    }
    if let Some(found) = unverified {
        return found;
    }
    if let Some(why) = failed {
        return Presence::NotChecked(why);
    }
    Presence::Gone(match &gone[..] {
        [(_, answer)] => answer.clone(),
        several => several
            .iter()
            .map(|(target, answer)| format!("{}: {answer}", quote(&target.lookup)))
            .collect::<Vec<_>>()
            .join("; "),
    })
}

/// Asks the mirror for `image.lookup`.
pub fn check(image: &MirrorImage, registry: &mut impl Registry) -> Presence {
    match verified_digest(registry, &image.lookup) {
        Ok(answer) => match image.digest() {
            Some(digest) if digest != answer => Presence::NotChecked(format!(
                "the mirror answered digest {answer} for {}",
                quote(&image.lookup)
            )),
            _ => Presence::Present,
        },
        Err(LookupError::Absent(why)) => Presence::Gone(why),
        Err(LookupError::Failed(why) | LookupError::Unverified(why)) => Presence::NotChecked(why),
        Err(LookupError::OverBudget(refusal)) => Presence::OverBudget(refusal),
    }
}

/// Asks the target to verify the source image's copy. One that does not verify is looked up
/// once more, when the budget allows, for the digest that names its signature tag (the host's
/// refusal does not say it), unless the image pins it.
fn check_verified(
    at: usize,
    target: &MirrorImage,
    verifications: &[Verification<'_>],
    registry: &mut impl Registry,
) -> Presence {
    match mirror_digest(registry, &target.lookup, verifications) {
        Ok(answer) => match target.digest() {
            Some(digest) if digest != answer => Presence::NotChecked(format!(
                "the mirror answered digest {answer} for {}",
                quote(&target.lookup)
            )),
            _ => Presence::Present,
        },
        Err(LookupError::Unverified(answer)) => {
            let digest = match target.digest() {
                Some(digest) => Some(digest.to_string()),
                None if registry.would_fit(&[&target.lookup]) => {
                    verified_digest(registry, &target.lookup).ok()
                }
                None => None,
            };
            Presence::Unverified {
                target: at,
                answer,
                digest,
            }
        }
        Err(LookupError::Absent(why)) => Presence::Gone(why),
        Err(LookupError::Failed(why)) => Presence::NotChecked(why),
        Err(LookupError::OverBudget(refusal)) => Presence::OverBudget(refusal),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{DIGEST_A, DIGEST_B, FakeRegistry, policy_from};
    use super::*;
    use rstest::rstest;

    const SETTINGS: &str = r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"},
        {"source":"quay.io","targets":[{"target":"eu.m.io/quay"},{"target":"us.m.io/quay"}]}],
        "defaultMirror":{"registry":"cache.m.io/all"}}"#;

    fn lookup(image: &str) -> Option<String> {
        mirror_image(image, &policy_from(SETTINGS).router).map(|m| m.lookup)
    }

    #[rstest]
    #[case::tag("m.io/hub/library/nginx:1.27", Some("m.io/hub/library/nginx:1.27"))]
    #[case::pinned_tag_asks_the_digest(
        "m.io/hub/library/nginx:1.27@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        Some(
            "m.io/hub/library/nginx@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        )
    )]
    #[case::no_tag_is_latest("m.io/hub/app", Some("m.io/hub/app:latest"))]
    #[case::https_port_spelled_out("m.io:443/hub/app:1", Some("m.io:443/hub/app:1"))]
    #[case::second_target_of_a_list("us.m.io/quay/org/app:2", Some("us.m.io/quay/org/app:2"))]
    #[case::default_mirror(
        "cache.m.io/all/ghcr.io/org/app:3",
        Some("cache.m.io/all/ghcr.io/org/app:3")
    )]
    #[case::source_image("nginx:1.27", None)]
    #[case::another_registry("ghcr.io/org/app:1", None)]
    #[case::a_sibling_path_is_not_under_the_target("m.io/hubx/app:1", None)]
    #[case::not_a_reference("m.io/hub/App:1", None)]
    fn mirror_images_are_those_under_a_target_in_any_spelling(
        #[case] image: &str,
        #[case] expected: Option<&str>,
    ) {
        assert_eq!(lookup(image).as_deref(), expected);
    }

    #[test]
    fn a_target_written_with_its_default_port_covers_the_plain_spelling() {
        let policy = policy_from(r#"{"mirrors":[{"source":"docker.io","target":"m.io:443/hub"}]}"#);
        let image = mirror_image("m.io/hub/library/nginx:1", &policy.router);
        assert_eq!(
            image.map(|m| m.lookup).as_deref(),
            Some("m.io/hub/library/nginx:1")
        );
    }

    fn presence(image: &str, registry: &mut FakeRegistry) -> Presence {
        let image = mirror_image(image, &policy_from(SETTINGS).router).expect("a mirror image");
        check(&image, registry)
    }

    fn source(image: &str) -> Option<SourceImage> {
        source_image(image, &policy_from(SETTINGS))
    }

    #[rstest]
    #[case::tag("nginx:1.27", "docker.io/library/nginx:1.27", &["m.io/hub/library/nginx:1.27"])]
    #[case::pinned_reads_the_digest(
        &format!("nginx:1.27@{DIGEST_A}"),
        &format!("docker.io/library/nginx@{DIGEST_A}"),
        &["m.io/hub/library/nginx@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"]
    )]
    #[case::every_target_in_order(
        "quay.io/org/app:2",
        "quay.io/org/app:2",
        &["eu.m.io/quay/org/app:2", "us.m.io/quay/org/app:2"]
    )]
    #[case::default_mirror("ghcr.io/o/a:3", "ghcr.io/o/a:3", &["cache.m.io/all/ghcr.io/o/a:3"])]
    fn source_images_are_those_a_rule_routes(
        #[case] image: &str,
        #[case] from: &str,
        #[case] targets: &[&str],
    ) {
        let source = source(image).expect("routed");
        assert_eq!(source.source, from);
        let lookups: Vec<&str> = source.targets.iter().map(|t| t.lookup.as_str()).collect();
        assert_eq!(lookups, targets);
    }

    #[rstest]
    #[case::a_mirror_image("m.io/hub/library/nginx:1.27")]
    #[case::not_a_reference("m.io/hub/App:1")]
    fn images_no_rule_routes_are_no_source_images(#[case] image: &str) {
        assert_eq!(source(image), None);
    }

    #[test]
    fn a_source_image_is_present_when_any_target_holds_it() {
        let image = source("quay.io/org/app:2").expect("routed");
        let mut registry = FakeRegistry::default().with("us.m.io/quay/org/app:2", Ok(DIGEST_A));
        assert_eq!(check_source(&image, &[], &mut registry), Presence::Present);
        assert_eq!(
            registry.asked,
            ["eu.m.io/quay/org/app:2", "us.m.io/quay/org/app:2"]
        );

        let mut registry = FakeRegistry::default();
        assert_eq!(
            check_source(&image, &[], &mut registry),
            Presence::Gone("\"eu.m.io/quay/org/app:2\": manifest unknown; \"us.m.io/quay/org/app:2\": manifest unknown".to_string())
        );

        let failed = LookupError::Failed("connection refused".to_string());
        let mut registry = FakeRegistry::default().with("eu.m.io/quay/org/app:2", Err(failed));
        assert_eq!(
            check_source(&image, &[], &mut registry),
            Presence::NotChecked("\"eu.m.io/quay/org/app:2\": connection refused".to_string())
        );
    }

    #[test]
    fn present_gone_and_not_checked() {
        let pinned = format!("m.io/hub/library/nginx:1.27@{DIGEST_A}");
        let by_digest = format!("m.io/hub/library/nginx@{DIGEST_A}");
        let mut registry = FakeRegistry::default().with(&by_digest, Ok(DIGEST_A));
        assert_eq!(presence(&pinned, &mut registry), Presence::Present);
        assert_eq!(registry.asked, std::slice::from_ref(&by_digest));

        let mut registry = FakeRegistry::default();
        assert_eq!(
            presence(&pinned, &mut registry),
            Presence::Gone("manifest unknown".to_string())
        );

        let failed = LookupError::Failed("connection refused".to_string());
        let mut registry = FakeRegistry::default().with(&by_digest, Err(failed));
        assert_eq!(
            presence(&pinned, &mut registry),
            Presence::NotChecked("connection refused".to_string())
        );

        // A registry that answers another digest for a digest proves nothing.
        let mut registry = FakeRegistry::default().with(&by_digest, Ok(DIGEST_B));
        assert!(matches!(
            presence(&pinned, &mut registry),
            Presence::NotChecked(why) if why.contains(DIGEST_B)
        ));
    }

    /// The check role with `signatures` on a short name and a rule of two targets: the rule
    /// matches the image as the Pod writes it (`nginx:1`, not `docker.io/library/nginx:1`), and
    /// the targets are verified in order: the second's copy verifying is enough; when neither
    /// verifies, the first one holding a copy is named, with the digest it serves.
    #[test]
    fn a_short_name_is_verified_at_each_target_of_its_rule_in_order() {
        let policy = policy_from(
            r#"{"action":"check","mirrors":[{"source":"docker.io","targets":[{"target":"eu.m.io/hub"},{"target":"us.m.io/hub"}]}],
            "signatures":[{"image":"nginx:*","pubKeys":["-----BEGIN PUBLIC KEY-----\nKEY\n-----END PUBLIC KEY-----"]}]}"#,
        );
        let Some(image) = CheckedImage::of("nginx:1", None, &policy) else {
            panic!("a source image");
        };
        let (eu, us) = ("eu.m.io/hub/library/nginx:1", "us.m.io/hub/library/nginx:1");
        let unverified = || LookupError::Unverified("no signatures found".to_string());
        let mut registry = FakeRegistry::default().with(eu, Ok(DIGEST_A));
        registry
            .verifications
            .insert(eu.to_string(), Err(unverified()));
        registry
            .verifications
            .insert(us.to_string(), Ok(DIGEST_A.to_string()));
        assert_eq!(image.check(&policy, &mut registry), Presence::Present);
        // The first copy's digest is learned as it is found unverified: it names the
        // signature tag to copy, should no later target verify.
        assert_eq!(
            registry.asked,
            [
                format!("verify {eu}"),
                eu.to_string(),
                format!("verify {us}")
            ]
        );

        registry
            .verifications
            .insert(us.to_string(), Err(unverified()));
        registry.asked.clear();
        assert_eq!(
            image.check(&policy, &mut registry),
            Presence::Unverified {
                target: 0,
                answer: "not signed with its public key: no signatures found".to_string(),
                digest: Some(DIGEST_A.to_string())
            }
        );
        // Written in full, the image is no match for the rule: checked for presence only.
        let Some(full) = CheckedImage::of("docker.io/library/nginx:1", None, &policy) else {
            panic!("a source image");
        };
        registry.asked.clear();
        assert_eq!(full.check(&policy, &mut registry), Presence::Present);
        assert_eq!(registry.asked, [eu]);
    }

    /// A re-verification at the source answers the digest it verified: one other than the
    /// digest the mirror image pins cannot say that digest still verifies.
    #[test]
    fn a_source_verification_of_another_digest_checks_nothing() {
        let policy = policy_from(SETTINGS);
        let mirror = mirror_image(
            &format!("m.io/hub/library/nginx:1.27@{DIGEST_A}"),
            &policy.router,
        )
        .expect("a mirror image");
        let source = format!("docker.io/library/nginx@{DIGEST_A}");
        let keys = [String::from("key")];
        let verifications = [Verification::PubKeys {
            keys: &keys,
            annotations: None,
        }];
        let mut registry = FakeRegistry::default();
        registry
            .verifications
            .insert(source.clone(), Ok(DIGEST_B.to_string()));
        assert_eq!(
            check_at_source(&source, &mirror, &verifications, &mut registry),
            Presence::NotChecked(format!(
                "its source's verification answered digest {DIGEST_B} for \"{source}\""
            ))
        );
        registry
            .verifications
            .insert(source.clone(), Ok(DIGEST_A.to_string()));
        assert_eq!(
            check_at_source(&source, &mirror, &verifications, &mut registry),
            Presence::Present
        );
    }

    /// A source image with one target says why it could not be checked in the registry's
    /// words alone; with several, each reason names the target it came from.
    #[test]
    fn a_lone_targets_reason_is_not_prefixed_with_its_name() {
        let policy = policy_from(SETTINGS);
        let lone = source_image("nginx:1.27", &policy).expect("routed");
        let mut registry = FakeRegistry::default().with(
            "m.io/hub/library/nginx:1.27",
            Err(LookupError::Failed("connection refused".to_string())),
        );
        assert_eq!(
            check_source(&lone, &[], &mut registry),
            Presence::NotChecked("connection refused".to_string())
        );
    }

    /// A pinned source image's copy is asked at that digest: a verification there that names
    /// another digest is no proof the copy is the one the Pod pins.
    #[test]
    fn a_verified_copy_of_another_digest_than_the_pinned_one_checks_nothing() {
        let policy = policy_from(SETTINGS);
        let image = source_image(&format!("nginx:1.27@{DIGEST_A}"), &policy).expect("routed");
        let target = image.targets.first().expect("a target").clone();
        let keys = [String::from("key")];
        let verifications = [Verification::PubKeys {
            keys: &keys,
            annotations: None,
        }];
        let mut registry = FakeRegistry::default();
        registry
            .verifications
            .insert(target.lookup.clone(), Ok(DIGEST_B.to_string()));
        assert_eq!(
            check_verified(0, &target, &verifications, &mut registry),
            Presence::NotChecked(format!(
                "the mirror answered digest {DIGEST_B} for \"{}\"",
                target.lookup
            ))
        );
        registry
            .verifications
            .insert(target.lookup.clone(), Ok(DIGEST_A.to_string()));
        assert_eq!(
            check_verified(0, &target, &verifications, &mut registry),
            Presence::Present
        );
    }

    /// A copy that did not verify by tag is asked its digest only while the budget allows: a
    /// verification that spent it leaves the digest unknown without a refused lookup.
    #[test]
    fn an_unverified_copys_digest_is_not_asked_past_the_budget() {
        use crate::budget::{Budgeted, tests::FakeClock};
        use std::time::Duration;
        struct SlowToRefuse(FakeClock);
        impl Registry for SlowToRefuse {
            fn verify(&mut self, _: &str, _: &Verification<'_>) -> Result<String, LookupError> {
                self.0.advance(Duration::from_millis(900));
                Err(LookupError::Unverified("no signature".to_string()))
            }
            fn manifest_digest(&mut self, _: &str) -> Result<String, LookupError> {
                Ok(DIGEST_A.to_string())
            }
            fn manifest(&mut self, _: &str) -> Result<crate::registry::Manifest, LookupError> {
                Err(LookupError::Failed("not asked".to_string()))
            }
        }
        let policy = policy_from(SETTINGS);
        let image = source_image("nginx:1.27", &policy).expect("routed");
        let target = image.targets.first().expect("a target").clone();
        let keys = [String::from("key")];
        let verifications = [Verification::PubKeys {
            keys: &keys,
            annotations: None,
        }];
        let clock = FakeClock::default();
        let mut inner = SlowToRefuse(clock.clone());
        let mut budgeted = Budgeted::new(&mut inner, &clock, Duration::from_millis(800));
        let presence = check_verified(0, &target, &verifications, &mut budgeted);
        assert_eq!(
            (presence, budgeted.report().refused),
            (
                Presence::Unverified {
                    target: 0,
                    answer: "not signed with its public key: no signature".to_string(),
                    digest: None
                },
                0
            )
        );
    }
}
