//! The verifiers an admission reads from the cluster (`verifiers`), beside the policy's own
//! `signatures`, for both roles; and what it says when a `module` pattern matched no policy.
//! Separate because it is the one step that reads the cluster, not a registry.

use std::collections::BTreeMap;

use crate::policy::Policy;
use crate::verifiers::{Cluster, reader_may_list, verifier_rules};

use super::report::capped;

/// The policy for one admission with the rules of the cluster's verifiers beside its own
/// `signatures`; when they cannot be read, or the PolicyServer's ServiceAccount (when named) may
/// not list and watch them, marked so that nothing is swapped unverified. With
/// it, when a `module` pattern matched no policy or a policy with a verifier's settings matched
/// no pattern: the warnings and the audit annotation that say so, naming the patterns and the
/// policies read.
pub(super) fn with_verifier_rules(
    policy: &Policy,
    namespace: &str,
    cluster: &mut impl Cluster,
) -> (Policy, Option<(Vec<String>, String)>) {
    let mut policy = policy.clone();
    let mut unmatched = None;
    // Asked first: a list the PolicyServer may not make never returns, and one it may not
    // watch is never refreshed; either is a read that cannot be trusted.
    let may_list = match &policy.verifiers_reader {
        Some(account) => reader_may_list(account, namespace, cluster),
        None => Ok(()),
    };
    match may_list.and_then(|()| verifier_rules(&policy.verifiers, namespace, cluster)) {
        Ok(read) => {
            let mut said = Vec::new();
            if !read.unmatched.is_empty() {
                let globs: Vec<String> = read.unmatched.iter().map(|g| format!("{g:?}")).collect();
                let policies = match read.read.len() {
                    0 => "none".to_string(),
                    _ => capped(read.read.clone(), "policies").join(", "),
                };
                said.push(format!(
                    "verifiers: the module pattern{} {} matched no policy read (read: {policies}); images are verified only under the verifiers found, so a verifier loaded from another module name is not applied here: correct the pattern, or omit module to find verifiers by their settings",
                    if globs.len() == 1 { "" } else { "s" },
                    globs.join(", ")
                ));
            }
            if !read.left_out.is_empty() {
                let one = read.left_out.len() == 1;
                said.push(format!(
                    "verifiers: {} {} verify-image-signatures' signatures in {} settings, but no module pattern of verifiers matches {} module, so {} rules are not applied here: add a pattern for that module, or omit module to find verifiers by their settings",
                    capped(read.left_out.clone(), "policies").join(", "),
                    if one { "has" } else { "have" },
                    if one { "its" } else { "their" },
                    if one { "its" } else { "their" },
                    if one { "its" } else { "their" },
                ));
            }
            if !said.is_empty() {
                let audit = serde_json::json!({"globs": read.unmatched, "leftOut": read.left_out,
                    "read": read.read});
                unmatched = Some((said, audit.to_string()));
            }
            policy.signatures.extend(read.rules);
        }
        Err(why) => policy.verifiers_unreadable = Some(why),
    }
    (policy, unmatched)
}

/// Adds the warnings and audit annotation of `module` patterns that matched no policy, and of
/// verifiers no pattern matched.
pub(super) fn tell_unmatched(
    warnings: &mut Vec<String>,
    audit: &mut BTreeMap<String, String>,
    unmatched: Option<(Vec<String>, String)>,
) {
    if let Some((said, annotation)) = unmatched {
        warnings.extend(said);
        audit.insert(VERIFIERS_UNMATCHED.to_string(), annotation);
    }
}

/// The audit annotation naming the `module` patterns of `verifiers` that matched no policy
/// (`globs`), and the verifiers no pattern matched (`leftOut`).
pub const VERIFIERS_UNMATCHED: &str = "verifiers-unmatched";
