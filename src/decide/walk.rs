//! The walk over a rule's mirrors, in the order the settings list them (the words for when
//! none serves are `failure`'s). Separate from the table because it is the only part that
//! weighs several answers: the first mirror that holds the image wins; "absent" and "stale" move to the next,
//! and so does a lookup error, which is remembered; when none holds it, any lookup error makes
//! it `onLookupError`'s case, else `onMissing`'s.

use crate::policy::{Policy, SwapPolicy};
use crate::reference::Reference;
use crate::registry::{LookupError, Registry};
use crate::rules::{Destination, MirrorRepository};
use crate::text::quote;

use super::failure::{Failure, earlier_failures, fallback};
use super::mirror_signature::{signature_copied, verified_at_mirror_name};
use super::verify_source::{SourceCheck, check_source};
use super::{Decision, Note, PullSecrets, Reason, joined, mirror_digest};
use crate::signatures::{Verification, covers, verifications_for};

/// One mirror's answer: the image to write (and what to tell), or why not, naming the
/// reference that was looked up.
type Attempt = Result<(String, Option<Note>), (String, Failure)>;

pub(super) fn decide_mirror(
    image: &str,
    reference: &Reference,
    destination: &Destination<'_>,
    policy: &Policy,
    secrets: PullSecrets<'_>,
    registry: &mut impl Registry,
) -> Decision {
    if let Some(decision) = unreadable_verifiers(image, reference, destination, policy) {
        return decision;
    }
    // The rules of `signatures` match the image as the Pod writes it, as a verifier does.
    let verifications = verifications_for(&policy.signatures, image);
    decide_verified(
        image,
        reference,
        destination,
        &verifications,
        policy,
        secrets,
        registry,
    )
}

/// Rules that could not be read may cover this image: nothing is swapped unverified, and the
/// image is `onLookupError`'s case.
pub(super) fn unreadable_verifiers(
    image: &str,
    reference: &Reference,
    destination: &Destination<'_>,
    policy: &Policy,
) -> Option<Decision> {
    let why = policy.verifiers_unreadable.as_ref()?;
    let first = destination.targets.first().map_or_else(
        || image.to_string(),
        |target| tagged(&target.repository, reference),
    );
    let failure = Failure::LookupError(format!(
        "could not read the verifier policies whose signatures it may need ({why})"
    ));
    Some(fallback(policy, image, vec![(first, failure)]))
}

/// The walk once the verifications `image` must pass are known (none: an existence lookup).
pub(super) fn decide_verified(
    image: &str,
    reference: &Reference,
    destination: &Destination<'_>,
    verifications: &[Verification<'_>],
    policy: &Policy,
    secrets: PullSecrets<'_>,
    registry: &mut impl Registry,
) -> Decision {
    let mut failures: Vec<(String, Failure)> = Vec::new();
    // A covered image is verified where a verifier on its source would verify it (unless
    // `verifySource: false` trusts the mirror's tags), and only that digest's copy in a mirror
    // is swapped to: a signature removed or replaced, or a tag moved, at the source then counts
    // at the next admission, whatever the mirror still holds.
    let verified_at_source = if policy.verify_covered_at_source && !verifications.is_empty() {
        match verify_at_source(reference, verifications, registry) {
            Ok(digest) => Some(digest),
            Err(failure) => return fallback(policy, image, vec![failure]),
        }
    } else {
        None
    };
    for target in &destination.targets {
        let pull_secret = target.pull_secret.map(str::to_string);
        let attempt = match pull_secret.as_deref() {
            Some(secret) if !secrets.allow(secret) => Err((
                tagged(&target.repository, reference),
                Failure::NoPullSecret(format!(
                    "that mirror needs imagePullSecret {secret:?}, which the Pod lacks and which cannot be added after creation"
                )),
            )),
            _ => match verified_at_source.as_deref() {
                Some(digest) => holds_digest(digest, reference, target, &[], registry).and_then(
                    |(swapped, note)| {
                        // A verifier after this one may see the mirror's name: when a rule
                        // covers it, the copy needs the source's signature there too.
                        if covers(&policy.signatures, &swapped) {
                            signature_copied(
                                reference.name(),
                                &target.repository,
                                digest,
                                registry,
                            )?;
                        }
                        Ok((swapped, note))
                    },
                ),
                None => try_mirror(image, reference, target, policy, verifications, registry)
                    .and_then(|(swapped, note)| {
                        if verifications.is_empty() {
                            verified_at_mirror_name(&swapped, policy, registry)?;
                        }
                        Ok((swapped, note))
                    }),
            },
        };
        match attempt {
            Ok((swapped, note)) => {
                let note = note.or_else(|| earlier_failures(image, &swapped, &failures, policy));
                return Decision::Swap {
                    image: swapped,
                    pull_secret,
                    note,
                };
            }
            // The budget cuts the walk short: the images it did not finish follow
            // onLookupError, like any image not looked up.
            Err((lookup, failure @ Failure::Budget { .. })) => {
                let decision = fallback(policy, image, vec![(lookup, failure)]);
                return with_verified_digest(decision, verified_at_source);
            }
            Err(failure) => failures.push(failure),
        }
    }
    learn_unverified_digest(&mut failures, registry);
    with_verified_digest(fallback(policy, image, failures), verified_at_source)
}

/// A kept image that verified at its source carries the digest that verified: an image the
/// Pod wrote under a mirror's name is written back at that digest and no other.
fn with_verified_digest(decision: Decision, verified: Option<String>) -> Decision {
    match decision {
        Decision::Keep(note) => Decision::Keep(Note {
            verified_digest: verified,
            ..note
        }),
        other => other,
    }
}

/// No mirror served, and one holds a copy that did not verify by tag: the host's refusal does
/// not name the digest, which names the signature tag a copy must bring, so that copy's tag is
/// asked once more when the budget allows. Only once the walk is over, so that it never delays
/// a later mirror's verification.
fn learn_unverified_digest(failures: &mut [(String, Failure)], registry: &mut impl Registry) {
    let Some((lookup, Failure::Unverified(_, digest @ None))) = failures
        .iter_mut()
        .find(|(_, failure)| matches!(failure, Failure::Unverified(..)))
    else {
        return;
    };
    if !lookup.contains('@') && registry.would_fit(&[lookup.as_str()]) {
        *digest = super::verified_digest(registry, lookup).ok();
    }
}

/// `repository[:tag]`: the reference a tag lookup asks for.
fn tagged(repository: &str, reference: &Reference) -> String {
    match reference.tag() {
        Some(tag) => joined(repository, ':', tag),
        None => repository.to_string(),
    }
}

/// The decision table for one mirror.
fn try_mirror(
    image: &str,
    reference: &Reference,
    target: &MirrorRepository<'_>,
    policy: &Policy,
    verifications: &[Verification<'_>],
    registry: &mut impl Registry,
) -> Attempt {
    let repository = &target.repository;
    let tagged = tagged(repository, reference);
    match (policy.swap_policy, reference.digest()) {
        (SwapPolicy::Always, Some(digest)) => Ok((joined(&tagged, '@', digest), None)),
        (SwapPolicy::Always, None) => Ok((tagged, None)),
        (SwapPolicy::Exists, Some(digest)) => {
            holds_digest(digest, reference, target, verifications, registry)
        }
        (SwapPolicy::Exists, None) => {
            // verifySource's first step is the mirror's digest and one lookup of the source,
            // which conclude on their own in the usual cases (equal digests; the source down
            // or without the tag): the mirror is asked only when the source's lookup is likely
            // to fit after it. Which lookup of the source, and the steps after it, are planned
            // once the mirror has answered (`check_source`).
            if policy.verify_source
                && let Err(refusal) = registry.affordable(&[&tagged, reference.as_str()])
            {
                return Err((tagged, Failure::not_looked_up(refusal)));
            }
            let mirror_digest = match mirror_digest(registry, &tagged, verifications) {
                Ok(digest) => digest,
                Err(error) => return Err((tagged, error.into())),
            };
            let note = if policy.verify_source {
                let mirror = joined(repository, '@', &mirror_digest);
                match check_source(
                    reference,
                    &mirror,
                    &mirror_digest,
                    &policy.platforms,
                    registry,
                ) {
                    SourceCheck::Same => None,
                    SourceCheck::Unreachable(why) => Some(Note::new(
                        Reason::SourceUnverified,
                        format!(
                            "image {}: swapped to the mirror without comparing it with the source, which could not be looked up ({why})",
                            quote(image)
                        ),
                    )),
                    SourceCheck::Stale(why) => {
                        let failure = Failure::Stale(format!("the mirror copy is stale: {why}"));
                        return Err((tagged, failure));
                    }
                    SourceCheck::Failed(why) => {
                        let failure = Failure::LookupError(format!(
                            "could not compare it with the source ({why})"
                        ));
                        return Err((tagged, failure));
                    }
                    // The comparison was not made, so nothing says the copy is current.
                    SourceCheck::OverBudget { digests, refusal } => {
                        let not_done = "not compared with the source";
                        let failure = Failure::Budget {
                            not_done,
                            digests,
                            refusal,
                        };
                        return Err((tagged, failure));
                    }
                }
            } else {
                None
            };
            let image = if policy.pin_digest {
                joined(&tagged, '@', &mirror_digest)
            } else {
                tagged
            };
            Ok((image, note))
        }
    }
}

/// Whether the mirror serves exactly `digest` (and verifies there under `verifications`): the
/// digest names the content, so the swap is pinned to it.
fn holds_digest(
    digest: &str,
    reference: &Reference,
    target: &MirrorRepository<'_>,
    verifications: &[Verification<'_>],
    registry: &mut impl Registry,
) -> Attempt {
    let tagged = tagged(&target.repository, reference);
    let lookup = joined(&target.repository, '@', digest);
    match mirror_digest(registry, &lookup, verifications) {
        Ok(answer) if answer == digest => Ok((joined(&tagged, '@', digest), None)),
        Ok(answer) => Err((
            lookup,
            Failure::LookupError(format!(
                "could not verify it: the mirror answered digest {answer} for it"
            )),
        )),
        Err(LookupError::Unverified(why)) => {
            Err((lookup, Failure::unverified(why, Some(digest.to_string()))))
        }
        Err(LookupError::Absent(why)) if reference.tag().is_some() => {
            by_tag_after_digest(digest, &tagged, lookup, why, verifications, registry)
        }
        Err(error) => Err((lookup, error.into())),
    }
}

/// The digest `reference` verifies at under every verification, asked of the source itself as
/// a verifier on the source asks it. A digest reference must verify at its own digest.
fn verify_at_source(
    reference: &Reference,
    verifications: &[Verification<'_>],
    registry: &mut impl Registry,
) -> Result<String, (String, Failure)> {
    let source = reference.as_str().to_string();
    let digest = match mirror_digest(registry, &source, verifications) {
        Ok(digest) => digest,
        Err(LookupError::Unverified(why)) => {
            return Err((source, Failure::UnverifiedAtSource(why)));
        }
        Err(LookupError::OverBudget(refusal)) => {
            return Err((source, Failure::not_looked_up(refusal)));
        }
        Err(LookupError::Absent(why) | LookupError::Failed(why)) => {
            let why = format!("could not verify it at its source ({why})");
            return Err((source, Failure::LookupError(why)));
        }
    };
    match reference.digest() {
        Some(pinned) if pinned != digest => Err((
            source,
            Failure::LookupError(format!(
                "could not verify it at its source: the verification answered digest {digest} for it"
            )),
        )),
        _ => Ok(digest),
    }
}

/// `tag@digest` whose digest the mirror lacks: ask for the tag. A pull-through cache may fill
/// only on a tag (an ECR pull-through cache answers "not found" for a digest it has not stored,
/// and stores an image when it is pulled by tag), so when the tag now names that very digest
/// the mirror holds the image and the swap is pinned to it. Any other answer is the digest's:
/// the mirror lacks it. Not asked when the budget would likely run out first, which, like any
/// lookup not made, is `onLookupError`'s case.
fn by_tag_after_digest(
    digest: &str,
    tagged: &str,
    digest_lookup: String,
    absent: String,
    verifications: &[Verification<'_>],
    registry: &mut impl Registry,
) -> Attempt {
    if let Err(refusal) = registry.affordable(&[tagged]) {
        let not_done = "not asked by its tag after the mirror lacked its digest";
        return Err((
            digest_lookup,
            Failure::Budget {
                not_done,
                digests: None,
                refusal,
            },
        ));
    }
    let missing = |also: String| {
        Err((
            digest_lookup.clone(),
            Failure::Missing(format!("the mirror does not have it ({absent}{also})")),
        ))
    };
    match mirror_digest(registry, tagged, verifications) {
        Ok(answer) if answer == digest => Ok((joined(tagged, '@', digest), None)),
        Ok(answer) => missing(format!(
            "; its tag {} names another digest, {answer}",
            quote(tagged)
        )),
        Err(_) => missing(String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{DIGEST_A, DIGEST_B, FakeRegistry, policy_from};
    use super::super::{Decision, PullSecrets, Reason, decide, decide_routed, route};
    use crate::registry::{LookupError, Refusal};
    use rstest::rstest;

    /// Docker Hub to an EU mirror (with a pull secret), then a US one.
    const TWO: &str = r#""mirrors":[{"source":"docker.io","targets":[
        {"target":"eu.m.io/hub","pullSecret":"eu-pull"},{"target":"us.m.io/hub"}]}]"#;
    const EU: &str = "eu.m.io/hub/library/nginx:1.27";
    const US: &str = "us.m.io/hub/library/nginx:1.27";

    fn absent() -> Result<&'static str, LookupError> {
        Err(LookupError::Absent(
            "registry: manifest unknown".to_string(),
        ))
    }

    fn refused() -> Result<&'static str, LookupError> {
        Err(LookupError::Failed("connection refused".to_string()))
    }

    fn outcome(decision: &Decision) -> String {
        match decision {
            Decision::Swap {
                image,
                pull_secret,
                note,
            } => format!(
                "swap {image} secret {pull_secret:?}{}",
                note.as_ref()
                    .map(|n| format!(" warning {:?}: {}", n.reason, n.text))
                    .unwrap_or_default()
            ),
            Decision::Keep(note) => format!("keep {:?}: {}", note.reason, note.text),
            Decision::Reject(note) => format!("reject {:?}: {}", note.reason, note.text),
            other => format!("{other:?}"),
        }
    }

    #[rstest]
    #[case::first_holds_it(
        "",
        Ok(DIGEST_A),
        absent(),
        "swap eu.m.io/hub/library/nginx:1.27@sha256:aaaa",
        1
    )]
    #[case::first_pruned_second_holds_it(
        "",
        absent(),
        Ok(DIGEST_B),
        "swap us.m.io/hub/library/nginx:1.27@sha256:bbbb",
        2
    )]
    #[case::first_refusing_second_holds_it(
        "",
        refused(),
        Ok(DIGEST_B),
        &format!("swap {US}@{DIGEST_B} secret None warning EarlierMirrorFailed: image \"nginx:1.27\": swapped to \"{US}@{DIGEST_B}\", a later mirror of its list: \"{EU}\": could not look it up (connection refused)"),
        2
    )]
    #[case::neither_holds_it(
        "",
        absent(),
        absent(),
        &format!("keep Absent: image \"nginx:1.27\": kept, not swapped to any of 2 mirrors: \"{EU}\": the mirror does not have it (registry: manifest unknown); \"{US}\": the mirror does not have it (registry: manifest unknown)"),
        2
    )]
    #[case::neither_holds_it_rejected(
        r#","onMissing":"reject""#,
        absent(),
        absent(),
        "reject Absent: image \"nginx:1.27\": cannot be swapped to any of 2 mirrors:",
        2
    )]
    #[case::one_absent_one_erroring_is_a_lookup_error(
        r#","onMissing":"reject""#,
        absent(),
        refused(),
        &format!("keep LookupError: image \"nginx:1.27\": kept, not swapped to any of 2 mirrors: \"{EU}\": the mirror does not have it (registry: manifest unknown); \"{US}\": could not look it up (connection refused)"),
        2
    )]
    #[case::one_absent_one_erroring_rejected(
        r#","onLookupError":"reject""#,
        refused(),
        absent(),
        "reject LookupError: image \"nginx:1.27\": cannot be swapped to any of 2 mirrors:",
        2
    )]
    fn the_first_mirror_that_holds_the_image_wins(
        #[case] extra: &str,
        #[case] eu: Result<&str, LookupError>,
        #[case] us: Result<&str, LookupError>,
        #[case] expected: &str,
        #[case] lookups: usize,
    ) {
        let policy = policy_from(&format!("{{{TWO}{extra}}}"));
        let mut registry = FakeRegistry::default().with(EU, eu).with(US, us);
        let outcome = outcome(&decide("nginx:1.27", &policy, &mut registry));
        assert!(
            outcome.starts_with(expected),
            "{outcome}\n  should start with\n{expected}"
        );
        assert_eq!(registry.asked.len(), lookups, "{:?}", registry.asked);
    }

    const HUB: &str = r#""mirrors":[{"source":"docker.io","target":"m.io/hub"}]"#;
    const TAGGED: &str = "m.io/hub/library/app:1.0";

    fn by_digest(digest: &str) -> String {
        format!("m.io/hub/library/app@{digest}")
    }

    /// `tag@digest` whose digest the mirror lacks: the tag is asked, and only a tag that names
    /// that very digest (a pull-through cache that fills on a tag has just stored it) swaps.
    #[rstest]
    #[case::the_tag_names_the_digest(
        Ok(DIGEST_A),
        &format!("swap {TAGGED}@{DIGEST_A} secret None")
    )]
    #[case::the_tag_names_another_digest(
        Ok(DIGEST_B),
        &format!("keep Absent: image \"app:1.0@{DIGEST_A}\": kept, not swapped to \"{}\": the mirror does not have it (registry: manifest unknown; its tag \"{TAGGED}\" names another digest, {DIGEST_B})", by_digest(DIGEST_A))
    )]
    #[case::the_tag_is_missing_too(
        absent(),
        &format!("keep Absent: image \"app:1.0@{DIGEST_A}\": kept, not swapped to \"{}\": the mirror does not have it (registry: manifest unknown)", by_digest(DIGEST_A))
    )]
    #[case::the_tag_cannot_be_asked(
        refused(),
        &format!("keep Absent: image \"app:1.0@{DIGEST_A}\": kept, not swapped to \"{}\": the mirror does not have it (registry: manifest unknown)", by_digest(DIGEST_A))
    )]
    fn a_missing_digest_is_asked_for_by_its_tag(
        #[case] tag: Result<&str, LookupError>,
        #[case] expected: &str,
    ) {
        let policy = policy_from(&format!("{{{HUB}}}"));
        let mut registry = FakeRegistry::default()
            .with(&by_digest(DIGEST_A), absent())
            .with(TAGGED, tag);
        let image = format!("app:1.0@{DIGEST_A}");
        assert_eq!(outcome(&decide(&image, &policy, &mut registry)), expected);
        assert_eq!(registry.asked, [by_digest(DIGEST_A), TAGGED.to_string()]);
    }

    /// A digest the mirror holds, a digest without a tag, and a digest that could not be asked
    /// need no second lookup.
    #[rstest]
    #[case::held(&format!("app:1.0@{DIGEST_A}"), Ok(DIGEST_A))]
    #[case::no_tag_to_ask(&format!("app@{DIGEST_A}"), absent())]
    #[case::lookup_error(&format!("app:1.0@{DIGEST_A}"), refused())]
    fn the_tag_is_asked_only_when_the_digest_is_missing(
        #[case] image: &str,
        #[case] answer: Result<&str, LookupError>,
    ) {
        let policy = policy_from(&format!("{{{HUB}}}"));
        let mut registry = FakeRegistry::default()
            .with(&by_digest(DIGEST_A), answer)
            .with(TAGGED, Ok(DIGEST_A));
        decide(image, &policy, &mut registry);
        assert_eq!(registry.asked, [by_digest(DIGEST_A)]);
    }

    /// The tag's lookup is planned like any other: when it would likely end past the budget it
    /// is not made, and the image follows onLookupError with the budget's reason.
    #[test]
    fn the_tag_after_a_missing_digest_is_not_asked_past_the_budget() {
        struct OneLookup(FakeRegistry);
        impl crate::registry::Registry for OneLookup {
            crate::registry::never_verifies!();

            fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
                self.0.manifest_digest(image)
            }
            fn manifest(&mut self, image: &str) -> Result<crate::registry::Manifest, LookupError> {
                self.0.manifest(image)
            }
            fn affordable(&mut self, _images: &[&str]) -> Result<(), Refusal> {
                if self.0.asked.is_empty() {
                    Ok(())
                } else {
                    Err(Refusal {
                        registry: "m.io".to_string(),
                        needed_ms: 300,
                        left_ms: 100,
                    })
                }
            }
        }
        let policy = policy_from(&format!(r#"{{{HUB},"onMissing":"reject"}}"#));
        let mut registry = OneLookup(
            FakeRegistry::default()
                .with(&by_digest(DIGEST_A), absent())
                .with(TAGGED, Ok(DIGEST_A)),
        );
        let decision = decide(&format!("app:1.0@{DIGEST_A}"), &policy, &mut registry);
        assert_eq!(
            outcome(&decision),
            format!(
                "keep Budget: image \"app:1.0@{DIGEST_A}\": kept, not swapped to \"{}\": not asked by its tag after the mirror lacked its digest within the lookup budget of 800 ms: m.io would need about 300 ms, 100 ms were left",
                by_digest(DIGEST_A)
            )
        );
        assert_eq!(registry.0.asked, [by_digest(DIGEST_A)]);
    }

    #[test]
    fn the_chosen_mirrors_pull_secret_goes_with_the_swap() {
        let policy = policy_from(&format!("{{{TWO}}}"));
        let mut registry = FakeRegistry::default().with(EU, Ok(DIGEST_A));
        assert!(
            outcome(&decide("nginx:1.27", &policy, &mut registry))
                .ends_with("secret Some(\"eu-pull\")")
        );
    }

    /// After creation the Pod cannot gain the EU mirror's secret: that mirror is skipped
    /// without a lookup, and the next one serves.
    #[test]
    fn a_mirror_whose_secret_the_pod_cannot_gain_is_skipped_without_a_lookup() {
        let policy = policy_from(&format!("{{{TWO}}}"));
        let mut registry = FakeRegistry::default()
            .with(EU, Ok(DIGEST_A))
            .with(US, Ok(DIGEST_B));
        let updating = PullSecrets {
            can_add: false,
            existing: &[],
        };
        let decision = decide_routed(
            "nginx:1.27",
            route("nginx:1.27", &policy),
            &policy,
            updating,
            &mut registry,
        );
        assert!(
            outcome(&decision).starts_with(&format!("swap {US}@{DIGEST_B} secret None")),
            "{decision:?}"
        );
        assert_eq!(registry.asked, [US]);
    }

    #[test]
    fn a_walk_the_budget_cuts_short_follows_on_lookup_error() {
        struct Once(FakeRegistry);
        impl crate::registry::Registry for Once {
            crate::registry::never_verifies!();

            fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
                match self.0.asked.len() {
                    0 => self.0.manifest_digest(image),
                    _ => Err(LookupError::OverBudget(Refusal {
                        registry: "us.m.io".to_string(),
                        needed_ms: 0,
                        left_ms: 0,
                    })),
                }
            }
            fn manifest(&mut self, image: &str) -> Result<crate::registry::Manifest, LookupError> {
                self.0.manifest(image)
            }
        }
        let policy = policy_from(&format!("{{{TWO}}}"));
        let mut registry = Once(FakeRegistry::default().with(US, Ok(DIGEST_B)));
        let decision = decide("nginx:1.27", &policy, &mut registry);
        assert!(
            matches!(&decision, Decision::Keep(note) if note.reason == Reason::Budget),
            "{decision:?}"
        );
    }

    #[test]
    fn kept_images_name_each_mirrors_reason() {
        let policy = policy_from(&format!("{{{TWO}}}"));
        let mut registry = FakeRegistry::default()
            .with(EU, absent())
            .with(US, refused());
        let Decision::Keep(note) = decide("nginx:1.27", &policy, &mut registry) else {
            panic!("kept");
        };
        assert_eq!(
            note.mirrors,
            [
                (EU.to_string(), Reason::Absent),
                (US.to_string(), Reason::LookupError)
            ]
        );
    }

    #[test]
    fn default_mirror_registries_are_tried_in_order() {
        let policy = policy_from(r#"{"defaultMirror":{"registries":["a.io/cache","b.io/cache"]}}"#);
        let mut registry =
            FakeRegistry::default().with("b.io/cache/docker.io/library/nginx:1.27", Ok(DIGEST_B));
        let outcome = outcome(&decide("nginx:1.27", &policy, &mut registry));
        assert!(
            outcome.starts_with(&format!(
                "swap b.io/cache/docker.io/library/nginx:1.27@{DIGEST_B}"
            )),
            "{outcome}"
        );
        assert_eq!(registry.asked.len(), 2);
    }

    #[test]
    fn swap_policy_always_takes_the_first_mirror_without_a_lookup() {
        let policy = policy_from(&format!(r#"{{{TWO},"swapPolicy":"always"}}"#));
        let mut registry = FakeRegistry::default();
        assert!(
            outcome(&decide("nginx:1.27", &policy, &mut registry))
                .starts_with(&format!("swap {EU} secret"))
        );
        assert!(registry.asked.is_empty());
    }

    #[test]
    fn an_image_under_any_mirror_of_the_list_is_already_swapped() {
        let policy = policy_from(&format!("{{{TWO}}}"));
        let mut registry = FakeRegistry::default();
        assert_eq!(
            decide(&format!("{US}@{DIGEST_B}"), &policy, &mut registry),
            Decision::AlreadySwapped
        );
        assert!(registry.asked.is_empty());
    }

    /// A copy that did not verify by tag is asked once more for its digest (the signature tag
    /// it must bring); one asked by digest already names it, and is not asked again.
    #[rstest]
    #[case::by_tag(EU, &[EU], Some(DIGEST_A))]
    #[case::by_digest("eu.m.io/hub/library/nginx@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", &[], None)]
    fn an_unverified_copy_by_tag_is_asked_its_digest_once(
        #[case] lookup: &str,
        #[case] asked: &[&str],
        #[case] learned: Option<&str>,
    ) {
        use super::super::failure::Failure;
        let mut registry = FakeRegistry::default().with(EU, Ok(DIGEST_A));
        let mut failures = vec![(
            lookup.to_string(),
            Failure::unverified("unsigned".into(), None),
        )];
        super::learn_unverified_digest(&mut failures, &mut registry);
        assert_eq!(registry.asked, asked);
        let digest = match &failures[0].1 {
            Failure::Unverified(_, digest) => digest.clone(),
            _ => None,
        };
        assert_eq!(digest.as_deref(), learned);
    }
}
