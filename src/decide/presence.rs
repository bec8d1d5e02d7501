//! What the mirror said of an image the check role asked about: the one answer both the check
//! and the signed checks (`check_signed`) give, and the report reads.

use crate::registry::Refusal;

/// What the mirror said of a mirror image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Presence {
    /// It holds it.
    Present,
    /// It said it lacks it: the mirror's words. A finding (the report's `fail`).
    Gone(String),
    /// It could not be asked, or its answer could not be trusted: why. Not a finding (the
    /// report's `error`): nothing is known of the image.
    NotChecked(String),
    /// Not asked: the lookup budget would likely have run out first, and why.
    OverBudget(Refusal),
    /// A mirror image that is there, swapped from a source a rule of `signatures` covers, whose
    /// digest no longer verifies at that source (its signature deleted or replaced): the host's
    /// words and the digest. The mirror's own signature still vouches for it. A finding.
    RevokedAtSource { answer: String, digest: String },
    /// A mirror image pinned to `digest` under a tag whose source now names another digest,
    /// `now`, which verifies there (`verifySource: false` trusts the mirror's tags, so the
    /// check is where a moved tag is seen). A finding.
    Drifted { digest: String, now: String },
    /// A mirror image that verifies at its source, under a rule that also covers the mirror's
    /// own name, whose mirror lacks the source's signature of `digest` (its `sha256-<hex>.sig`
    /// absent or another manifest): why, naming both. A verifier whose rules match the mirror's
    /// name refuses what it runs, or admits another signature. A finding.
    SignatureNotCopied { why: String, digest: String },
    /// A source image a target holds, but whose copy there does not verify under
    /// `signatures`: the target (its index), the host's words, and the digest the target
    /// serves when it was learned, which names the signature tag to copy. A finding.
    Unverified {
        target: usize,
        answer: String,
        digest: Option<String>,
    },
}
