//! The decision for one image: the table of DESIGN.md as one pure function over [`Registry`].

use crate::policy::{Fallback, Platform, Policy, SwapPolicy};
use crate::reference::{Reference, parse_digest};
use crate::rules::{Destination, Route};

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
    fn is_runnable(&self) -> bool {
        self.os != "unknown" && self.architecture != "unknown" && !self.os.is_empty()
    }

    /// The entry's whole platform, for messages: `linux/arm64/v8`,
    /// `windows/amd64 os.version 10.0.17763.5830`.
    fn describe(&self) -> String {
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

    fn selected_by(&self, platform: &Platform) -> bool {
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

/// Why an image was not swapped as asked, in a word: the audit annotations' reason codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// The mirror said it lacks the image.
    Absent,
    /// The mirror's copy differs from the source's content (`verifySource`).
    Stale,
    /// The registry could not be asked, or its answer could not be trusted.
    LookupError,
    /// Not looked up (or not compared): the lookup budget was spent.
    Budget,
    /// The mirror needs a pull secret the Pod lacks and cannot gain after creation.
    NoPullSecret,
    /// The image string is not a reference a runtime would pull.
    InvalidReference,
    /// A rule matched but names no valid mirror repository.
    Unroutable,
    /// Swapped without comparing with the source, which could not be asked (`verifySource`).
    SourceUnverified,
}

impl Reason {
    pub fn code(self) -> &'static str {
        match self {
            Reason::Absent => "absent",
            Reason::Stale => "stale",
            Reason::LookupError => "lookup-error",
            Reason::Budget => "budget",
            Reason::NoPullSecret => "no-pull-secret",
            Reason::InvalidReference => "invalid-reference",
            Reason::Unroutable => "unroutable",
            Reason::SourceUnverified => "source-unverified",
        }
    }
}

/// A reason and the sentence that explains it to a person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub reason: Reason,
    pub text: String,
}

impl Note {
    fn new(reason: Reason, text: String) -> Note {
        Note { reason, text }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not the policy's business: no rule matches, or an `exclude` pattern does.
    Unchanged,
    /// Already under a mirror target: admitting a swapped Pod again changes nothing.
    AlreadySwapped,
    /// Write `image`; add `pull_secret` to the Pod when it has one; tell `note` if any.
    Swap {
        image: String,
        pull_secret: Option<String>,
        note: Option<Note>,
    },
    /// Keep the original image, and tell the user why.
    Keep(Note),
    /// Refuse the Pod, for this reason.
    Reject(Note),
}

/// The longest image string quoted in a message; Kubernetes truncates long warnings anyway.
const QUOTE_MAX: usize = 200;

/// An image string for a message: quoted, escaped, and cut to a readable length.
pub fn quote(image: &str) -> String {
    let (kept, cut) = cut_at(image, QUOTE_MAX);
    if cut {
        format!("{kept:?}…")
    } else {
        format!("{kept:?}")
    }
}

/// `text` cut to at most `max` characters, marked with `…` when cut: messages and audit
/// values stay bounded whatever the request or the host sent.
pub fn truncated(text: &str, max: usize) -> String {
    match cut_at(text, max) {
        (kept, true) => format!("{kept}…"),
        (kept, false) => kept.to_string(),
    }
}

/// The first `max` characters of `text`, and whether anything was cut.
fn cut_at(text: &str, max: usize) -> (&str, bool) {
    match text.char_indices().nth(max) {
        Some((at, _)) => (&text[..at], true),
        None => (text, false),
    }
}

pub fn decide(image: &str, policy: &Policy, registry: &mut impl Registry) -> Decision {
    let reference = match Reference::parse(image) {
        Ok(reference) => reference,
        Err(error) => {
            return Decision::Keep(Note::new(
                Reason::InvalidReference,
                format!(
                    "image {}: not swapped, not a valid image reference: {error}",
                    quote(image)
                ),
            ));
        }
    };
    match policy.router.route(&reference) {
        Route::NotMatched | Route::Excluded(_) => Decision::Unchanged,
        Route::AlreadySwapped => Decision::AlreadySwapped,
        Route::Unroutable { rule, reason } => Decision::Keep(Note::new(
            Reason::Unroutable,
            format!("image {}: not swapped, {rule}: {reason}", quote(image)),
        )),
        Route::Mirror(destination) => {
            decide_mirror(image, &reference, &destination, policy, registry)
        }
    }
}

fn decide_mirror(
    image: &str,
    reference: &Reference,
    destination: &Destination<'_>,
    policy: &Policy,
    registry: &mut impl Registry,
) -> Decision {
    let repository = &destination.repository;
    let tagged = match reference.tag() {
        Some(tag) => joined(repository, ':', tag),
        None => repository.clone(),
    };
    let pull_secret = destination.pull_secret.map(str::to_string);
    let swap = |image: String| Decision::Swap {
        image,
        pull_secret: pull_secret.clone(),
        note: None,
    };
    match (policy.swap_policy, reference.digest()) {
        (SwapPolicy::Always, Some(digest)) => swap(joined(&tagged, '@', digest)),
        (SwapPolicy::Always, None) => swap(tagged),
        // The digest names the content: the mirror must serve exactly it.
        (SwapPolicy::Exists, Some(digest)) => {
            let lookup = joined(repository, '@', digest);
            match verified_digest(registry, &lookup) {
                Ok(answer) if answer == digest => swap(joined(&tagged, '@', digest)),
                Ok(answer) => fallback(
                    policy,
                    image,
                    &lookup,
                    Failure::LookupError(format!(
                        "could not verify it: the mirror answered digest {answer} for it"
                    )),
                ),
                Err(error) => fallback(policy, image, &lookup, error.into()),
            }
        }
        (SwapPolicy::Exists, None) => {
            let mirror_digest = match verified_digest(registry, &tagged) {
                Ok(digest) => digest,
                Err(error) => return fallback(policy, image, &tagged, error.into()),
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
                        return fallback(policy, image, &tagged, failure);
                    }
                    SourceCheck::Failed(why) => {
                        let failure = Failure::LookupError(format!(
                            "could not compare it with the source ({why})"
                        ));
                        return fallback(policy, image, &tagged, failure);
                    }
                    // The comparison was not made, so nothing says the copy is current.
                    SourceCheck::OverBudget => {
                        return fallback(
                            policy,
                            image,
                            &tagged,
                            Failure::Budget("not compared with the source"),
                        );
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
            Decision::Swap {
                image,
                pull_secret,
                note,
            }
        }
    }
}

/// What the source says of the mirror's copy of a tag.
#[derive(Debug, PartialEq, Eq)]
enum SourceCheck {
    /// Same digest, or another encoding of the same content.
    Same,
    /// The source could not be asked: the mirror serves, which is what a mirror is for.
    Unreachable(String),
    /// The content differs: the tag moved upstream, or platforms are missing.
    Stale(String),
    /// The digests differ and the manifests needed to compare them could not be read.
    Failed(String),
    /// A lookup the comparison needed was not made: the budget was spent.
    OverBudget,
}

/// Compares the mirror's copy (`mirror` = repository@digest) with the source tag, with as few
/// lookups as the case allows: one when the digests are equal, three when they are not.
fn check_source(
    source: &Reference,
    mirror: &str,
    mirror_digest: &str,
    platforms: &[Platform],
    registry: &mut impl Registry,
) -> SourceCheck {
    let source_tag = source.as_str();
    let source_digest = match verified_digest(registry, source_tag) {
        Ok(digest) => digest,
        Err(LookupError::OverBudget) => return SourceCheck::OverBudget,
        Err(LookupError::Absent(why) | LookupError::Failed(why)) => {
            return SourceCheck::Unreachable(format!("{}: {why}", quote(source_tag)));
        }
    };
    if source_digest == mirror_digest {
        return SourceCheck::Same;
    }
    let digests = format!("source {source_digest}, mirror {mirror_digest}");
    let source_manifest = registry.manifest(&format!("{}@{source_digest}", source.name()));
    if source_manifest == Err(LookupError::OverBudget) {
        return SourceCheck::OverBudget;
    }
    let mirror_manifest = registry.manifest(mirror);
    let (source_manifest, mirror_manifest) = match (source_manifest, mirror_manifest) {
        (Ok(s), Ok(m)) => (s, m),
        (_, Err(LookupError::OverBudget)) => return SourceCheck::OverBudget,
        (Err(LookupError::Absent(why) | LookupError::Failed(why)), _)
        | (_, Err(LookupError::Absent(why) | LookupError::Failed(why))) => {
            return SourceCheck::Failed(format!("{digests}: {why}"));
        }
        (Err(LookupError::OverBudget), _) => return SourceCheck::OverBudget,
    };
    match (&source_manifest, &mirror_manifest) {
        (
            Manifest::Image {
                config_digest: source_config,
            },
            Manifest::Image {
                config_digest: mirror_config,
            },
        ) => {
            if source_config == mirror_config {
                SourceCheck::Same
            } else {
                SourceCheck::Stale(format!(
                    "the tag now names other content upstream ({digests})"
                ))
            }
        }
        (Manifest::Index { entries }, mirror_manifest) => {
            compare_index(entries, mirror_manifest, mirror_digest, platforms, &digests)
        }
        (Manifest::Image { .. }, Manifest::Index { .. }) => SourceCheck::Stale(format!(
            "the source is now a single-platform image, the mirror an index ({digests})"
        )),
    }
}

/// A source index against the mirror's copy: every source entry a wanted platform selects
/// (all runnable ones when `platforms` is empty) must be held by the mirror, by digest. An
/// os/architecture may select several entries (one per `os.version`, variant or
/// `os.features`), and each of them counts.
fn compare_index(
    entries: &[IndexEntry],
    mirror: &Manifest,
    mirror_digest: &str,
    platforms: &[Platform],
    digests: &str,
) -> SourceCheck {
    let selected: Vec<&IndexEntry> = entries
        .iter()
        .filter(|e| e.is_runnable())
        .filter(|e| platforms.is_empty() || platforms.iter().any(|p| e.selected_by(p)))
        .collect();
    let not_upstream: Vec<String> = platforms
        .iter()
        .filter(|p| !entries.iter().any(|e| e.is_runnable() && e.selected_by(p)))
        .map(Platform::to_string)
        .collect();
    if selected.is_empty() && platforms.is_empty() {
        return SourceCheck::Stale(format!(
            "the source index lists no runnable platform ({digests})"
        ));
    }
    let not_mirrored: Vec<String> = selected
        .iter()
        .filter(|entry| !mirror_holds(mirror, mirror_digest, &entry.digest))
        .map(|entry| entry.describe())
        .collect();
    let mut reasons = Vec::new();
    if !not_mirrored.is_empty() {
        reasons.push(format!(
            "it lacks the source's manifest for {}",
            not_mirrored.join(", ")
        ));
    }
    if !not_upstream.is_empty() {
        reasons.push(format!(
            "the source lists no manifest for {}",
            not_upstream.join(", ")
        ));
    }
    if reasons.is_empty() {
        SourceCheck::Same
    } else {
        SourceCheck::Stale(format!("{} ({digests})", reasons.join("; ")))
    }
}

/// Whether the mirror holds the very manifest `digest`: as its single manifest, or listed in
/// its own index.
fn mirror_holds(mirror: &Manifest, mirror_digest: &str, digest: &str) -> bool {
    match mirror {
        Manifest::Image { .. } => digest == mirror_digest,
        Manifest::Index { entries } => entries.iter().any(|e| e.digest == digest),
    }
}

/// `left` `separator` `right`, without the formatting machinery: this runs for every image.
fn joined(left: &str, separator: char, right: &str) -> String {
    let mut text = String::with_capacity(left.len() + 1 + right.len());
    text.push_str(left);
    text.push(separator);
    text.push_str(right);
    text
}

/// A digest the host answered, checked to be a digest: a malformed answer verifies nothing.
fn verified_digest(registry: &mut impl Registry, image: &str) -> Result<String, LookupError> {
    let answer = registry.manifest_digest(image)?;
    match parse_digest(&answer) {
        Ok(_) => Ok(answer),
        Err(error) => Err(LookupError::Failed(format!(
            "the host answered {}: {error}",
            quote(&answer)
        ))),
    }
}

/// Why the mirror cannot be used, and so which setting decides.
enum Failure {
    /// `onMissing`: the mirror lacks the image.
    Missing(String),
    /// `onMissing`: the mirror holds a stale copy.
    Stale(String),
    /// `onLookupError`: the answer could not be had or could not be trusted.
    LookupError(String),
    /// `onLookupError`: the lookup (or comparison) was not made within the budget.
    Budget(&'static str),
}

impl From<LookupError> for Failure {
    fn from(error: LookupError) -> Self {
        match error {
            LookupError::Absent(why) => {
                Failure::Missing(format!("the mirror does not have it ({why})"))
            }
            LookupError::Failed(why) => {
                Failure::LookupError(format!("could not look it up ({why})"))
            }
            LookupError::OverBudget => Failure::Budget("not looked up"),
        }
    }
}

fn fallback(policy: &Policy, image: &str, lookup: &str, failure: Failure) -> Decision {
    let (action, setting, reason, text) = match failure {
        Failure::Missing(text) => (policy.on_missing, "onMissing", Reason::Absent, text),
        Failure::Stale(text) => (policy.on_missing, "onMissing", Reason::Stale, text),
        Failure::LookupError(text) => (
            policy.on_lookup_error,
            "onLookupError",
            Reason::LookupError,
            text,
        ),
        Failure::Budget(what) => (
            policy.on_lookup_error,
            "onLookupError",
            Reason::Budget,
            format!(
                "{what}: the lookup budget of {} ms was spent",
                policy.lookup_budget_ms
            ),
        ),
    };
    match action {
        Fallback::Keep => Decision::Keep(Note::new(
            reason,
            format!(
                "image {}: kept, not swapped to {}: {text}",
                quote(image),
                quote(lookup)
            ),
        )),
        Fallback::Reject => Decision::Reject(Note::new(
            reason,
            format!(
                "image {}: cannot be swapped to {}: {text}; {setting} is reject",
                quote(image),
                quote(lookup)
            ),
        )),
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::policy::Policy;
    use crate::settings::parse_settings;
    use rstest::rstest;
    use std::collections::BTreeMap;

    pub const DIGEST_A: &str =
        "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    pub const DIGEST_B: &str =
        "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    /// A registry in memory that records the lookups it was asked for.
    #[derive(Default)]
    pub struct FakeRegistry {
        pub answers: BTreeMap<String, Result<String, LookupError>>,
        pub manifests: BTreeMap<String, Manifest>,
        pub asked: Vec<String>,
    }

    impl FakeRegistry {
        pub fn with(mut self, image: &str, answer: Result<&str, LookupError>) -> Self {
            self.answers
                .insert(image.to_string(), answer.map(str::to_string));
            self
        }
    }

    impl Registry for FakeRegistry {
        fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
            self.asked.push(image.to_string());
            self.answers
                .get(image)
                .cloned()
                .unwrap_or_else(|| Err(LookupError::Absent("manifest unknown".to_string())))
        }

        fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError> {
            self.asked.push(format!("manifest {image}"));
            self.manifests
                .get(image)
                .cloned()
                .ok_or_else(|| LookupError::Absent("manifest unknown".to_string()))
        }
    }

    pub fn policy_from(json: &str) -> Policy {
        Policy::from_settings(&parse_settings(json.as_bytes()).expect("valid settings"))
            .expect("valid settings")
    }

    const HUB: &str = r#""mirrors":[{"source":"docker.io","target":"mirror.example.com/dockerhub","pullSecret":"pull"}]"#;

    fn absent() -> LookupError {
        LookupError::Absent("manifest unknown".to_string())
    }

    fn failed() -> LookupError {
        LookupError::Failed("connection refused".to_string())
    }

    fn swap(image: &str) -> Decision {
        Decision::Swap {
            image: image.to_string(),
            pull_secret: Some("pull".to_string()),
            note: None,
        }
    }

    fn tag_at(d: &str) -> String {
        format!("mirror.example.com/dockerhub/library/nginx:1.27@{d}")
    }

    #[rstest]
    #[case::no_rule(
        "",
        "ghcr.io/org/app:1",
        FakeRegistry::default(),
        Decision::Unchanged,
        0
    )]
    #[case::excluded(
        r#","exclude":["docker.io/library/nginx:*"]"#,
        "nginx:1.27",
        FakeRegistry::default(),
        Decision::Unchanged,
        0
    )]
    #[case::already_swapped(
        "",
        "mirror.example.com/dockerhub/library/nginx:1.27",
        FakeRegistry::default(),
        Decision::AlreadySwapped,
        0
    )]
    #[case::always_tag(
        r#","swapPolicy":"always""#,
        "nginx:1.27",
        FakeRegistry::default(),
        swap("mirror.example.com/dockerhub/library/nginx:1.27"),
        0
    )]
    #[case::always_keeps_source_digest(r#","swapPolicy":"always""#, &format!("nginx:1.27@{DIGEST_A}"), FakeRegistry::default(), swap(&tag_at(DIGEST_A)), 0)]
    #[case::tag_found_is_pinned("", "nginx:1.27", FakeRegistry::default().with("mirror.example.com/dockerhub/library/nginx:1.27", Ok(DIGEST_B)), swap(&tag_at(DIGEST_B)), 1)]
    #[case::tag_found_unpinned(r#","pinDigest":false"#, "nginx:1.27", FakeRegistry::default().with("mirror.example.com/dockerhub/library/nginx:1.27", Ok(DIGEST_B)), swap("mirror.example.com/dockerhub/library/nginx:1.27"), 1)]
    #[case::digest_found("", &format!("nginx:1.27@{DIGEST_A}"), FakeRegistry::default().with(&format!("mirror.example.com/dockerhub/library/nginx@{DIGEST_A}"), Ok(DIGEST_A)), swap(&tag_at(DIGEST_A)), 1)]
    #[case::digest_only_found("", &format!("nginx@{DIGEST_A}"), FakeRegistry::default().with(&format!("mirror.example.com/dockerhub/library/nginx@{DIGEST_A}"), Ok(DIGEST_A)), swap(&format!("mirror.example.com/dockerhub/library/nginx@{DIGEST_A}")), 1)]
    fn swaps_only_to_what_was_verified(
        #[case] extra: &str,
        #[case] image: &str,
        #[case] mut registry: FakeRegistry,
        #[case] expected: Decision,
        #[case] lookups: usize,
    ) {
        let policy = policy_from(&format!("{{{HUB}{extra}}}"));
        assert_eq!(decide(image, &policy, &mut registry), expected);
        assert_eq!(
            registry.asked.len(),
            lookups,
            "lookups: {:?}",
            registry.asked
        );
    }

    #[rstest]
    #[case::missing_kept(
        "",
        Err(absent()),
        "image \"nginx:1.27\": kept, not swapped to \"mirror.example.com/dockerhub/library/nginx:1.27\": the mirror does not have it (manifest unknown)"
    )]
    #[case::missing_rejected(
        r#","onMissing":"reject""#,
        Err(absent()),
        "image \"nginx:1.27\": cannot be swapped to \"mirror.example.com/dockerhub/library/nginx:1.27\": the mirror does not have it (manifest unknown); onMissing is reject"
    )]
    #[case::error_kept(
        "",
        Err(failed()),
        "image \"nginx:1.27\": kept, not swapped to \"mirror.example.com/dockerhub/library/nginx:1.27\": could not look it up (connection refused)"
    )]
    #[case::error_rejected(
        r#","onLookupError":"reject""#,
        Err(failed()),
        "image \"nginx:1.27\": cannot be swapped to \"mirror.example.com/dockerhub/library/nginx:1.27\": could not look it up (connection refused); onLookupError is reject"
    )]
    #[case::error_is_not_missing(
        r#","onMissing":"reject""#,
        Err(failed()),
        "image \"nginx:1.27\": kept, not swapped to \"mirror.example.com/dockerhub/library/nginx:1.27\": could not look it up (connection refused)"
    )]
    #[case::malformed_answer_is_an_error(
        "",
        Ok("latest"),
        "image \"nginx:1.27\": kept, not swapped to \"mirror.example.com/dockerhub/library/nginx:1.27\": could not look it up (the host answered \"latest\": invalid digest format)"
    )]
    fn falls_back_as_configured(
        #[case] extra: &str,
        #[case] answer: Result<&str, LookupError>,
        #[case] message: &str,
    ) {
        let policy = policy_from(&format!("{{{HUB}{extra}}}"));
        let mut registry =
            FakeRegistry::default().with("mirror.example.com/dockerhub/library/nginx:1.27", answer);
        let decision = decide("nginx:1.27", &policy, &mut registry);
        let text = match decision {
            Decision::Keep(note) | Decision::Reject(note) => note.text,
            other => panic!("expected a fallback, got {other:?}"),
        };
        assert_eq!(text, message);
    }

    #[test]
    fn a_digest_lookup_answered_with_another_digest_is_not_trusted() {
        let policy = policy_from(&format!("{{{HUB}}}"));
        let lookup = format!("mirror.example.com/dockerhub/library/nginx@{DIGEST_A}");
        let mut registry = FakeRegistry::default().with(&lookup, Ok(DIGEST_B));
        let decision = decide(&format!("nginx@{DIGEST_A}"), &policy, &mut registry);
        assert!(
            matches!(&decision, Decision::Keep(note) if note.text.contains(DIGEST_B)),
            "{decision:?}"
        );
    }

    #[rstest]
    #[case::empty("")]
    #[case::garbage("::not an image::")]
    #[case::upper_case("NGINX")]
    fn invalid_images_are_kept_with_a_warning(#[case] image: &str) {
        let policy = policy_from(&format!("{{{HUB}}}"));
        let mut registry = FakeRegistry::default();
        let decision = decide(image, &policy, &mut registry);
        assert!(
            matches!(&decision, Decision::Keep(note) if note.text.contains("not a valid image reference") && note.reason == Reason::InvalidReference)
        );
        assert!(registry.asked.is_empty());
    }

    #[test]
    fn long_images_are_cut_in_messages() {
        let quoted = quote(&"a".repeat(10_000));
        assert!(quoted.len() < 220 && quoted.ends_with('…'), "{quoted}");
    }
}

#[cfg(test)]
mod verify_source_tests {
    use super::tests::{DIGEST_A, DIGEST_B, FakeRegistry, policy_from};
    use super::*;
    use rstest::rstest;

    const MIRROR_TAG: &str = "m.io/hub/library/app:1";
    const SOURCE_TAG: &str = "docker.io/library/app:1";
    const DIGEST_C: &str =
        "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
    const DIGEST_D: &str =
        "sha256:dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd";

    fn settings(extra: &str) -> Policy {
        policy_from(&format!(
            r#"{{"mirrors":[{{"source":"docker.io","target":"m.io/hub"}}],"verifySource":true{extra}}}"#
        ))
    }

    fn image(config: &str) -> Manifest {
        Manifest::Image {
            config_digest: config.to_string(),
        }
    }

    fn entry(digest: &str, platform: &str) -> IndexEntry {
        let mut parts = platform.split('/');
        IndexEntry {
            digest: digest.to_string(),
            os: parts.next().unwrap_or_default().to_string(),
            architecture: parts.next().unwrap_or_default().to_string(),
            variant: parts.next().map(str::to_string),
            ..IndexEntry::default()
        }
    }

    /// A source index of amd64 (DIGEST_C), arm64 (DIGEST_D) and an attestation.
    fn source_index() -> Manifest {
        Manifest::Index {
            entries: vec![
                entry(DIGEST_C, "linux/amd64"),
                entry(DIGEST_D, "linux/arm64/v8"),
                entry(DIGEST_A, "unknown/unknown"),
            ],
        }
    }

    fn registry(mirror: &str, source: Result<&str, LookupError>) -> FakeRegistry {
        FakeRegistry::default()
            .with(MIRROR_TAG, Ok(mirror))
            .with(SOURCE_TAG, source)
    }

    fn with_manifests(
        mut registry: FakeRegistry,
        source_digest: &str,
        source: Manifest,
        mirror_digest: &str,
        mirror: Manifest,
    ) -> FakeRegistry {
        registry
            .manifests
            .insert(format!("docker.io/library/app@{source_digest}"), source);
        registry
            .manifests
            .insert(format!("m.io/hub/library/app@{mirror_digest}"), mirror);
        registry
    }

    fn outcome(decision: &Decision) -> String {
        match decision {
            Decision::Swap {
                image, note: None, ..
            } => format!("swap {image}"),
            Decision::Swap {
                image,
                note: Some(note),
                ..
            } => format!("swap {image} warning {}", note.text),
            Decision::Keep(note) => format!("keep {}", note.text),
            Decision::Reject(note) => format!("reject {}", note.text),
            other => format!("{other:?}"),
        }
    }

    #[rstest]
    #[case::same_digest(
        "",
        registry(DIGEST_B, Ok(DIGEST_B)),
        "swap m.io/hub/library/app:1@sha256:bbbb",
        2
    )]
    #[case::tag_moved_upstream(
        "",
        with_manifests(
            registry(DIGEST_B, Ok(DIGEST_A)),
            DIGEST_A,
            image(DIGEST_C),
            DIGEST_B,
            image(DIGEST_D)
        ),
        "keep image \"docker.io/library/app:1\": kept, not swapped to \"m.io/hub/library/app:1\": the mirror copy is stale: the tag now names other content upstream (source sha256:aaaa",
        4
    )]
    #[case::tag_moved_upstream_rejected(
        r#","onMissing":"reject""#,
        with_manifests(
            registry(DIGEST_B, Ok(DIGEST_A)),
            DIGEST_A,
            image(DIGEST_C),
            DIGEST_B,
            image(DIGEST_D)
        ),
        "reject image \"docker.io/library/app:1\": cannot be swapped to \"m.io/hub/library/app:1\": the mirror copy is stale",
        4
    )]
    #[case::converted_format_same_config(
        "",
        with_manifests(
            registry(DIGEST_B, Ok(DIGEST_A)),
            DIGEST_A,
            image(DIGEST_C),
            DIGEST_B,
            image(DIGEST_C)
        ),
        "swap m.io/hub/library/app:1@sha256:bbbb",
        4
    )]
    #[case::single_platform_copy_covers_listed_platform(
        r#","platforms":["linux/amd64"]"#,
        with_manifests(
            registry(DIGEST_C, Ok(DIGEST_B)),
            DIGEST_B,
            source_index(),
            DIGEST_C,
            image(DIGEST_A)
        ),
        "swap m.io/hub/library/app:1@sha256:cccc",
        4
    )]
    #[case::single_platform_copy_lacks_other_platforms(
        "",
        with_manifests(
            registry(DIGEST_C, Ok(DIGEST_B)),
            DIGEST_B,
            source_index(),
            DIGEST_C,
            image(DIGEST_A)
        ),
        "keep image \"docker.io/library/app:1\": kept, not swapped to \"m.io/hub/library/app:1\": the mirror copy is stale: it lacks the source's manifest for linux/arm64/v8 (source sha256:bbbb",
        4
    )]
    #[case::index_copy_covers_every_platform(
        "",
        with_manifests(registry(DIGEST_A, Ok(DIGEST_B)), DIGEST_B, source_index(), DIGEST_A,
            Manifest::Index { entries: vec![entry(DIGEST_D, "linux/arm64/v8"), entry(DIGEST_C, "linux/amd64")] }),
        "swap m.io/hub/library/app:1@sha256:aaaa",
        4
    )]
    #[case::index_copy_with_other_manifest(
        r#","platforms":["linux/arm64"]"#,
        with_manifests(registry(DIGEST_A, Ok(DIGEST_B)), DIGEST_B, source_index(), DIGEST_A,
            Manifest::Index { entries: vec![entry(DIGEST_A, "linux/arm64/v8"), entry(DIGEST_C, "linux/amd64")] }),
        "keep image \"docker.io/library/app:1\": kept, not swapped to \"m.io/hub/library/app:1\": the mirror copy is stale: it lacks the source's manifest for linux/arm64",
        4
    )]
    #[case::source_single_mirror_index(
        "",
        with_manifests(
            registry(DIGEST_A, Ok(DIGEST_B)),
            DIGEST_B,
            image(DIGEST_C),
            DIGEST_A,
            source_index()
        ),
        "keep image \"docker.io/library/app:1\": kept, not swapped to \"m.io/hub/library/app:1\": the mirror copy is stale: the source is now a single-platform image",
        4
    )]
    #[case::source_unreachable(
        "",
        registry(DIGEST_B, Err(LookupError::Failed("error sending request".to_string()))),
        &format!("swap m.io/hub/library/app:1@{DIGEST_B} warning image \"docker.io/library/app:1\": swapped to the mirror without comparing it with the source, which could not be looked up (\"docker.io/library/app:1\": error sending request)"),
        2
    )]
    #[case::manifests_unreadable(
        "",
        registry(DIGEST_B, Ok(DIGEST_A)),
        "keep image \"docker.io/library/app:1\": kept, not swapped to \"m.io/hub/library/app:1\": could not compare it with the source (source sha256:aaaa",
        4
    )]
    #[case::mirror_missing_needs_no_source_lookup(
        "",
        FakeRegistry::default(),
        "keep image \"docker.io/library/app:1\": kept, not swapped to \"m.io/hub/library/app:1\": the mirror does not have it",
        1
    )]
    fn verify_source_compares_content(
        #[case] extra: &str,
        #[case] mut registry: FakeRegistry,
        #[case] expected: &str,
        #[case] lookups: usize,
    ) {
        let decision = decide(SOURCE_TAG, &settings(extra), &mut registry);
        let outcome = outcome(&decision);
        assert!(
            outcome.starts_with(expected),
            "{outcome}\n  should start with\n{expected}"
        );
        assert_eq!(registry.asked.len(), lookups, "{:?}", registry.asked);
    }

    #[test]
    fn a_wanted_platform_the_source_lacks_is_named_as_such() {
        let mut registry = with_manifests(
            registry(DIGEST_C, Ok(DIGEST_B)),
            DIGEST_B,
            source_index(),
            DIGEST_C,
            image(DIGEST_A),
        );
        let policy = settings(r#","platforms":["linux/amd64","linux/s390x"]"#);
        let outcome = outcome(&decide(SOURCE_TAG, &policy, &mut registry));
        assert!(
            outcome.contains("stale: the source lists no manifest for linux/s390x (source"),
            "{outcome}"
        );
    }

    #[test]
    fn stale_warning_shows_both_digests() {
        let mut registry = with_manifests(
            registry(DIGEST_B, Ok(DIGEST_A)),
            DIGEST_A,
            image(DIGEST_C),
            DIGEST_B,
            image(DIGEST_D),
        );
        let outcome = outcome(&decide(SOURCE_TAG, &settings(""), &mut registry));
        assert!(
            outcome.contains("stale") && outcome.contains(DIGEST_A) && outcome.contains(DIGEST_B),
            "{outcome}"
        );
    }

    #[test]
    fn digest_references_need_no_source_lookup() {
        let lookup = format!("m.io/hub/library/app@{DIGEST_A}");
        let mut registry = FakeRegistry::default().with(&lookup, Ok(DIGEST_A));
        let decision = decide(&format!("app@{DIGEST_A}"), &settings(""), &mut registry);
        assert!(
            matches!(decision, Decision::Swap { note: None, .. }),
            "{decision:?}"
        );
        assert_eq!(registry.asked, [lookup]);
    }

    fn windows_entry(digest: &str, version: &str) -> IndexEntry {
        IndexEntry {
            os_version: Some(version.to_string()),
            ..entry(digest, "windows/amd64")
        }
    }

    /// A Windows index lists one entry per os.version: each must be held by the mirror.
    #[rstest]
    #[case::every_os_version_held(
        vec![windows_entry(DIGEST_C, "10.0.17763.1"), windows_entry(DIGEST_D, "10.0.20348.1")],
        "swap"
    )]
    #[case::second_os_version_stale(
        vec![windows_entry(DIGEST_C, "10.0.17763.1"), windows_entry(DIGEST_B, "10.0.20348.1")],
        "keep image \"docker.io/library/app:1\": kept, not swapped to \"m.io/hub/library/app:1\": the mirror copy is stale: it lacks the source's manifest for windows/amd64 os.version 10.0.20348.1 (source"
    )]
    fn every_entry_a_platform_selects_is_compared(
        #[case] mirror_entries: Vec<IndexEntry>,
        #[case] expected: &str,
    ) {
        let source = Manifest::Index {
            entries: vec![
                windows_entry(DIGEST_C, "10.0.17763.1"),
                windows_entry(DIGEST_D, "10.0.20348.1"),
            ],
        };
        let mut registry = with_manifests(
            registry(DIGEST_A, Ok(DIGEST_B)),
            DIGEST_B,
            source,
            DIGEST_A,
            Manifest::Index {
                entries: mirror_entries,
            },
        );
        let policy = settings(r#","platforms":["windows/amd64"]"#);
        let outcome = outcome(&decide(SOURCE_TAG, &policy, &mut registry));
        assert!(outcome.starts_with(expected), "{outcome}");
    }

    #[test]
    fn os_features_are_part_of_an_entrys_identity() {
        let with_features = IndexEntry {
            os_features: vec!["win32k".to_string()],
            ..windows_entry(DIGEST_D, "10.0.20348.1")
        };
        assert_eq!(
            with_features.describe(),
            "windows/amd64 os.version 10.0.20348.1 os.features win32k"
        );
        let source = Manifest::Index {
            entries: vec![windows_entry(DIGEST_C, "10.0.17763.1"), with_features],
        };
        // The mirror is a single-platform copy of the first entry: the second is missing.
        let mut registry = with_manifests(
            registry(DIGEST_C, Ok(DIGEST_B)),
            DIGEST_B,
            source,
            DIGEST_C,
            image(DIGEST_A),
        );
        let outcome = outcome(&decide(SOURCE_TAG, &settings(""), &mut registry));
        assert!(
            outcome.contains("lacks the source's manifest for windows/amd64 os.version 10.0.20348.1 os.features win32k"),
            "{outcome}"
        );
    }

    /// A registry that refuses every lookup after the first `allowed` ones, as the budget does.
    struct Rationed {
        inner: FakeRegistry,
        allowed: usize,
    }

    impl Registry for Rationed {
        fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
            if self.allowed == 0 {
                return Err(LookupError::OverBudget);
            }
            self.allowed -= 1;
            self.inner.manifest_digest(image)
        }

        fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError> {
            if self.allowed == 0 {
                return Err(LookupError::OverBudget);
            }
            self.allowed -= 1;
            self.inner.manifest(image)
        }
    }

    /// The budget runs out between the mirror lookup and the comparison: onLookupError,
    /// never a swap, and never "source unreachable" (which would swap).
    #[rstest]
    #[case::before_the_source_digest(1, "", "keep")]
    #[case::before_the_manifests(2, "", "keep")]
    #[case::before_the_mirror_manifest(3, "", "keep")]
    #[case::rejected(1, r#","onLookupError":"reject""#, "reject")]
    fn a_comparison_cut_by_the_budget_is_a_lookup_error(
        #[case] allowed: usize,
        #[case] extra: &str,
        #[case] verdict: &str,
    ) {
        let inner = with_manifests(
            registry(DIGEST_B, Ok(DIGEST_A)),
            DIGEST_A,
            image(DIGEST_C),
            DIGEST_B,
            image(DIGEST_C),
        );
        let mut registry = Rationed { inner, allowed };
        let decision = decide(SOURCE_TAG, &settings(extra), &mut registry);
        let note = match (&decision, verdict) {
            (Decision::Keep(note), "keep") | (Decision::Reject(note), "reject") => note,
            _ => panic!("expected {verdict}, got {decision:?}"),
        };
        assert_eq!(note.reason, Reason::Budget);
        assert!(
            note.text
                .contains("not compared with the source: the lookup budget of 800 ms was spent"),
            "{}",
            note.text
        );
    }
}
