//! The check role with `signatures` or `verifiers`: a running mirror image whose source no
//! longer verifies, a drifted tag, and the mirror's signature tag under a rule on its name.
//! Beside the swap's cases (`signed_tests`), whose Pods and runs it shares.

use super::Verdict;
use super::signed_tests::{BY_DIGEST, KEY, OneVerifier, SWAPPED, run, scanned, signed, unsigned};
use crate::decide::tests::{DIGEST_A, DIGEST_B, FakeRegistry};
use crate::registry::LookupError;
use crate::verifiers::NoCluster;

const CHECK_WITH_VERIFIERS: &str = r#"{"action":"check","mirrors":[{"source":"docker.io","target":"m.io/hub"}],
    "verifiers":[{"module":"*/verify-image-signatures:*"}]}"#;

/// The check role applies the verifiers' rules: a running mirror image whose source no longer
/// verifies under them is a finding; verifiers it cannot read make the check an error.
#[test]
fn the_check_role_reports_a_revocation_under_a_verifiers_rules() {
    let mut registry = FakeRegistry::default().with(BY_DIGEST, Ok(DIGEST_A));
    let source = "docker.io/library/nginx@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    registry
        .verifications
        .insert(source.to_string(), unsigned());
    let outcome = run(
        CHECK_WITH_VERIFIERS,
        scanned(SWAPPED),
        &mut registry,
        &mut OneVerifier,
    );
    assert!(
        matches!(&outcome.verdict, Verdict::Reject(message) if message.contains("no longer verifies at its source")),
        "{outcome:?}"
    );
    let outcome = run(
        CHECK_WITH_VERIFIERS,
        scanned(SWAPPED),
        &mut registry,
        &mut NoCluster,
    );
    assert!(
        matches!(&outcome.verdict, Verdict::Error(message) if message.contains("could not read the verifier policies")),
        "{outcome:?}"
    );
}

/// `verifySource: false` trusts the mirror's tags: the check compares the running digest with
/// what the source's tag names now.
#[test]
fn the_check_role_reports_a_drifted_tag_when_the_mirrors_tags_are_trusted() {
    let settings = signed(r#","action":"check","verifySource":false"#);
    let mut registry = FakeRegistry::default().with(BY_DIGEST, Ok(DIGEST_A));
    registry.verifications.insert(
        "docker.io/library/nginx:1.27".to_string(),
        Ok(DIGEST_B.to_string()),
    );
    let outcome = run(&settings, scanned(SWAPPED), &mut registry, &mut NoCluster);
    assert!(
        matches!(&outcome.verdict, Verdict::Reject(message) if message.contains(&format!("now names {DIGEST_B}"))),
        "{outcome:?}"
    );
    registry.verifications.insert(
        "docker.io/library/nginx:1.27".to_string(),
        Ok(DIGEST_A.to_string()),
    );
    let outcome = run(&settings, scanned(SWAPPED), &mut registry, &mut NoCluster);
    assert_eq!(outcome.verdict, Verdict::Accept);
}

/// Under a rule that also covers the mirror's name (`*`), the check role holds a running mirror
/// image that verifies at its source to what the swap requires: the mirror's signature tag of
/// its digest is the source's. Absent, or another manifest, is a finding naming the tag and
/// both digests, with the copy; the same signature passes.
#[test]
fn the_check_role_compares_the_mirrors_signature_under_a_rule_on_the_mirrors_name() {
    const SOURCE_SIG: &str = "docker.io/library/nginx:sha256-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.sig";
    const MIRROR_SIG: &str = "m.io/hub/library/nginx:sha256-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.sig";
    let settings = format!(
        r#"{{"action":"check","mirrors":[{{"source":"docker.io","target":"m.io/hub"}}],"signatures":[{{"image":"*","pubKeys":[{KEY:?}]}}]}}"#
    );
    let at_mirror = |answer: Result<&str, LookupError>| {
        let mut registry = FakeRegistry::default()
            .with(BY_DIGEST, Ok(DIGEST_A))
            .with(SOURCE_SIG, Ok(DIGEST_B))
            .with(MIRROR_SIG, answer);
        registry.verifications.insert(
            "docker.io/library/nginx@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".to_string(),
            Ok(DIGEST_A.to_string()),
        );
        run(&settings, scanned(SWAPPED), &mut registry, &mut NoCluster)
    };
    let absent = at_mirror(Err(LookupError::Absent("manifest unknown".to_string())));
    assert!(
        matches!(&absent.verdict, Verdict::Reject(message)
            if message.contains("lacks its source's signature in the mirror")
            && message.contains("the mirror lacks its signature tag sha256-")
            && message.contains(&format!("docker://{SOURCE_SIG} docker://{MIRROR_SIG}"))),
        "{absent:?}"
    );
    let another = at_mirror(Ok(DIGEST_A));
    assert!(
        matches!(&another.verdict, Verdict::Reject(message)
            if message.contains(&format!("there is {DIGEST_A}, not the source's {DIGEST_B}"))),
        "{another:?}"
    );
    assert_eq!(at_mirror(Ok(DIGEST_B)).verdict, Verdict::Accept);
}
