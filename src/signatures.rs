//! `signatures`: which images must verify before they are swapped, and the verifications that
//! ask it. The rules are verify-image-signatures' own (kubewarden/policies), so that an
//! operator pastes theirs: a rule's `image` is matched against the image string exactly as the
//! Pod writes it (its `WildMatch`), every rule that matches must verify (its
//! `verify_container_images` verifies each), and a `certificates` rule verifies once per
//! certificate, all of which must hold (its loop over `certificates`).
//!
//! A verification names the image it verifies: the mirror copy the policy would swap to, at its
//! mirror name. Cosign signatures live beside the image, in its own repository, as tag
//! `sha256-<hex>.sig` (sigstore-rs `triangulate`), so a mirror copy verifies only once the
//! signature was copied with it.

use std::collections::BTreeMap;

use crate::glob::Glob;

/// One rule of `signatures`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignatureRule {
    /// Matched against the image string as written in the Pod.
    pub image: Glob,
    pub check: SignatureCheck,
    /// Annotations every signature must carry.
    pub annotations: Option<BTreeMap<String, String>>,
    /// Where the rule was written, for messages: `signatures[0]`, or the verifier policy and
    /// its entry.
    pub origin: String,
}

/// What a signature must satisfy: one of the kinds verify-image-signatures knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignatureCheck {
    /// Signed with every one of these PEM public keys.
    PubKeys(Vec<String>),
    /// Keyless, with exactly these `(issuer, subject)`.
    Keyless(Vec<(String, String)>),
    /// Keyless, issuer and a subject under this URL prefix.
    KeylessPrefix(Vec<(String, String)>),
    /// Keyless, signed in GitHub Actions of this owner (and repository).
    GithubActions { owner: String, repo: Option<String> },
    /// Signed with every one of these PEM certificates, each verified on its own.
    Certificates {
        certificates: Vec<String>,
        chain: Option<Vec<String>>,
        require_rekor_bundle: bool,
    },
    /// A verifier's rule this policy could not read (verify-image-signatures would refuse it,
    /// or reads it in a way no host verification here asks): why, naming the rule. An image
    /// its `image` pattern matches cannot be verified, and is `onLookupError`'s case.
    Unreadable(String),
}

/// One host verification (`oci/v2/verify`), borrowed from its rule: what the host is asked,
/// without the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verification<'p> {
    PubKeys {
        keys: &'p [String],
        annotations: Option<&'p BTreeMap<String, String>>,
    },
    Keyless {
        identities: &'p [(String, String)],
        annotations: Option<&'p BTreeMap<String, String>>,
    },
    KeylessPrefix {
        prefixes: &'p [(String, String)],
        annotations: Option<&'p BTreeMap<String, String>>,
    },
    GithubActions {
        owner: &'p str,
        repo: Option<&'p str>,
        annotations: Option<&'p BTreeMap<String, String>>,
    },
    Certificate {
        certificate: &'p str,
        chain: Option<&'p [String]>,
        require_rekor_bundle: bool,
        annotations: Option<&'p BTreeMap<String, String>>,
    },
    /// Not asked of the host: the rule could not be read, and why.
    Unreadable { why: &'p str },
}

impl SignatureRule {
    /// The host verifications this rule asks of one image, in order.
    pub fn verifications(&self) -> Vec<Verification<'_>> {
        let annotations = self.annotations.as_ref();
        match &self.check {
            SignatureCheck::PubKeys(keys) => vec![Verification::PubKeys { keys, annotations }],
            SignatureCheck::Keyless(identities) => vec![Verification::Keyless {
                identities,
                annotations,
            }],
            SignatureCheck::KeylessPrefix(prefixes) => vec![Verification::KeylessPrefix {
                prefixes,
                annotations,
            }],
            SignatureCheck::GithubActions { owner, repo } => vec![Verification::GithubActions {
                owner,
                repo: repo.as_deref(),
                annotations,
            }],
            SignatureCheck::Certificates {
                certificates,
                chain,
                require_rekor_bundle,
            } => certificates
                .iter()
                .map(|certificate| Verification::Certificate {
                    certificate,
                    chain: chain.as_deref(),
                    require_rekor_bundle: *require_rekor_bundle,
                    annotations,
                })
                .collect(),
            SignatureCheck::Unreadable(why) => vec![Verification::Unreadable { why }],
        }
    }
}

/// The verifications `image` (as the Pod writes it) must pass before it is swapped: those of
/// every rule whose pattern matches it. Empty when no rule matches: the image is swapped on an
/// existence lookup, as without `signatures`.
pub fn verifications_for<'p>(rules: &'p [SignatureRule], image: &str) -> Vec<Verification<'p>> {
    rules
        .iter()
        .filter(|rule| rule.image.matches(image))
        .flat_map(SignatureRule::verifications)
        .collect()
}

/// The rules that match any of `spellings` (the strings a Pod could write for one image), and
/// their verifications: an image judged under every name a verifier's glob could see.
pub fn rules_covering<'p>(
    rules: &'p [SignatureRule],
    spellings: &[String],
) -> (Vec<&'p SignatureRule>, Vec<Verification<'p>>) {
    let matching: Vec<&SignatureRule> = rules
        .iter()
        .filter(|rule| spellings.iter().any(|s| rule.image.matches(s)))
        .collect();
    let verifications = matching
        .iter()
        .flat_map(|rule| rule.verifications())
        .collect();
    (matching, verifications)
}

/// Whether any rule of `signatures` matches `image` as the Pod writes it.
pub fn covers(rules: &[SignatureRule], image: &str) -> bool {
    rules.iter().any(|rule| rule.image.matches(image))
}

impl Verification<'_> {
    /// What the verification requires, in a few words for messages: never the keys themselves.
    pub fn describe(&self) -> String {
        match self {
            Verification::PubKeys { keys, .. } => match keys.len() {
                1 => "signed with its public key".to_string(),
                n => format!("signed with each of its {n} public keys"),
            },
            Verification::Keyless { .. } => "signed keyless by its identities".to_string(),
            Verification::KeylessPrefix { .. } => {
                "signed keyless under its URL prefixes".to_string()
            }
            Verification::GithubActions { owner, .. } => {
                format!("signed in GitHub Actions of {owner:?}")
            }
            Verification::Certificate { .. } => "signed with its certificate".to_string(),
            Verification::Unreadable { .. } => "verified under a rule it could read".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(image: &str, check: SignatureCheck) -> SignatureRule {
        SignatureRule {
            image: Glob::new(image).expect("valid pattern"),
            check,
            annotations: None,
            origin: format!("signatures rule {image}"),
        }
    }

    #[test]
    fn every_matching_rule_is_verified_and_each_certificate_on_its_own() {
        let rules = vec![
            rule(
                "registry.example.com/org/*",
                SignatureCheck::PubKeys(vec!["KEY".to_string()]),
            ),
            rule(
                "*",
                SignatureCheck::Certificates {
                    certificates: vec!["ALICE".to_string(), "BOB".to_string()],
                    chain: None,
                    require_rekor_bundle: false,
                },
            ),
            rule(
                "ghcr.io/*",
                SignatureCheck::GithubActions {
                    owner: "org".to_string(),
                    repo: None,
                },
            ),
        ];
        let asked = verifications_for(&rules, "registry.example.com/org/app:1");
        assert_eq!(asked.len(), 3, "{asked:?}");
        assert!(matches!(asked[0], Verification::PubKeys { .. }));
        assert!(matches!(
            asked[2],
            Verification::Certificate {
                certificate: "BOB",
                ..
            }
        ));
        assert_eq!(verifications_for(&rules[..1], "nginx:1.27"), Vec::new());
    }

    #[test]
    fn rules_match_the_image_as_written_not_normalised() {
        // verify-image-signatures matches the Pod's string: "nginx" is not "docker.io/...".
        let rules = vec![rule(
            "docker.io/library/*",
            SignatureCheck::PubKeys(vec!["KEY".to_string()]),
        )];
        assert!(verifications_for(&rules, "nginx:1.27").is_empty());
        assert_eq!(
            verifications_for(&rules, "docker.io/library/nginx:1.27").len(),
            1
        );
    }
}
