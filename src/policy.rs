//! The settings once validated: what the decisions run on.
//!
//! `settings` builds a [`Policy`] from what the operator wrote; `decide` and `pod` read it. It
//! holds only checked values, so nothing downstream validates again.

use serde::{Deserialize, Serialize};

use crate::rules::Router;
use crate::signatures::SignatureRule;

/// The settings, validated and ready for decisions.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Swap images at admission, or only check that the mirror images a Pod names are there.
    pub action: Action,
    pub router: Router,
    pub swap_policy: SwapPolicy,
    /// Tag references: also require the mirror's content to be the source's.
    pub verify_source: bool,
    /// Images a rule of `signatures` or `verifiers` covers: verified at their source, and only
    /// the mirror copy of the digest that verified there swapped to (`verifySource` unless set
    /// to false).
    pub verify_covered_at_source: bool,
    /// With `verify_source`, the platforms a mirror copy of a multi-platform source must cover;
    /// empty means every platform the source lists.
    pub platforms: Vec<Platform>,
    pub pin_digest: bool,
    pub on_missing: Fallback,
    pub on_lookup_error: Fallback,
    /// All the lookups of one admission together, in milliseconds.
    pub lookup_budget_ms: u64,
    /// The check role: also report source images that no target of their rule holds.
    pub report_unmirrored: bool,
    /// The check role: also check admissions (`mode: protect`), not only the audit scanner's
    /// requests.
    pub check_admissions: bool,
    /// `signatures`: the images that must verify at their mirror name before a swap.
    pub signatures: Vec<SignatureRule>,
    /// A mirror copy that does not verify: keep the source, or refuse the Pod.
    pub on_unverified: Fallback,
    /// `verifiers`: patterns on the `spec.module` of the cluster's policies whose `signatures`
    /// count as this policy's own at each admission.
    /// `None`: every policy whose `settings.signatures` has verify-image-signatures' shape.
    pub verifiers: Vec<Option<crate::glob::Glob>>,
    /// Set for one admission when the verifiers could not be read: why. Every image bound for
    /// a mirror is then `onLookupError`'s case, since rules it could not read may cover it.
    pub verifiers_unreadable: Option<String>,
    /// `policyServerServiceAccount`: asked, before the verifiers are read, whether it may list
    /// and watch them; unset, the host's lists are trusted as they come.
    pub verifiers_reader: Option<crate::verifiers::ServiceAccount>,
    /// `fillJobUsernames`: who may drop entries of the record of unmirrored images.
    pub fill_job_usernames: Vec<String>,
}

impl Policy {
    /// Whether `signatures` or `verifiers` is set: images written under a target are then
    /// judged as the sources that route there.
    pub fn verifies(&self) -> bool {
        !self.signatures.is_empty() || !self.verifiers.is_empty()
    }
}

/// The module's two roles, one setting apart so that operators copy one block of settings.
#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    /// Rewrite images to the mirror (the mutating policy).
    #[default]
    Swap,
    /// Rewrite nothing; refuse a Pod whose mirror images the mirror no longer holds (the
    /// policy the audit scanner replays running Pods through, or a validating one).
    Check,
}

#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum SwapPolicy {
    /// Swap only to what a lookup has just verified.
    #[default]
    Exists,
    /// Swap without looking.
    Always,
}

#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum Fallback {
    /// Admit the Pod with its original image, and say why in a warning.
    #[default]
    Keep,
    /// Refuse the Pod, and say why.
    Reject,
}

impl Fallback {
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::Keep => "keep",
            Fallback::Reject => "reject",
        }
    }
}

/// `os/architecture[/variant]`, as the `platforms` setting names platforms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Platform {
    pub fn parse(text: &str) -> Option<Platform> {
        let parts: Vec<&str> = text.split('/').collect();
        let word = |s: &&str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        if !(2..=3).contains(&parts.len()) || !parts.iter().all(word) {
            return None;
        }
        Some(Platform {
            os: parts[0].to_string(),
            architecture: parts[1].to_string(),
            variant: parts.get(2).map(|v| v.to_string()),
        })
    }

    /// Whether an index entry's platform is one this platform selects: a platform named
    /// without a variant selects every variant of its architecture, and every `os.version`
    /// and `os.features` (a Windows index lists one entry per `os.version`).
    pub fn covers(&self, os: &str, architecture: &str, variant: Option<&str>) -> bool {
        self.os == os
            && self.architecture == architecture
            && self
                .variant
                .as_deref()
                .is_none_or(|wanted| Some(wanted) == variant)
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        match &self.variant {
            Some(variant) => write!(f, "/{variant}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Platform;
    use rstest::rstest;

    #[rstest]
    #[case::same("linux/amd64", ("linux", "amd64", None), true)]
    #[case::any_variant("linux/arm64", ("linux", "arm64", Some("v8")), true)]
    #[case::exact_variant("linux/arm/v7", ("linux", "arm", Some("v7")), true)]
    #[case::other_variant("linux/arm/v7", ("linux", "arm", Some("v6")), false)]
    #[case::variant_missing("linux/arm/v7", ("linux", "arm", None), false)]
    #[case::other_arch("linux/amd64", ("linux", "arm64", None), false)]
    #[case::other_os("linux/amd64", ("windows", "amd64", None), false)]
    fn platforms_cover_index_entries(
        #[case] wanted: &str,
        #[case] entry: (&str, &str, Option<&str>),
        #[case] covered: bool,
    ) {
        let platform = Platform::parse(wanted).expect("valid platform");
        assert_eq!(platform.covers(entry.0, entry.1, entry.2), covered);
        assert_eq!(platform.to_string(), wanted);
    }
}
