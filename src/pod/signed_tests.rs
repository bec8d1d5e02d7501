//! Admissions with `signatures` or `verifiers` where an image is written under a mirror's name:
//! a re-applied swap, an image set by hand, and the check role reading the verifiers.

use kubewarden_policy_sdk::request::{GroupVersionKind, KubernetesAdmissionRequest, UserInfo};
use serde_json::{Value, json};

use super::{ORIGINAL_IMAGES_ANNOTATION, Outcome, Verdict, admit};
use crate::budget::tests::FakeClock;
use crate::decide::tests::{DIGEST_A, FakeRegistry, policy_from};
use crate::registry::LookupError;
use crate::verifiers::{Access, AccessReview, Cluster, NoCluster, PolicyKind};

pub(super) const KEY: &str = "-----BEGIN PUBLIC KEY-----\nKEY\n-----END PUBLIC KEY-----";
pub(super) const SWAPPED: &str = "m.io/hub/library/nginx:1.27@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
pub(super) const BY_DIGEST: &str = "m.io/hub/library/nginx@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const SOURCE_AT_A: &str = "docker.io/library/nginx:1.27@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

pub(super) fn signed(extra: &str) -> String {
    format!(
        r#"{{"mirrors":[{{"source":"docker.io","target":"m.io/hub"}}],"signatures":[{{"image":"nginx*","pubKeys":[{KEY:?}]}}]{extra}}}"#
    )
}

fn pod(image: &str, originals: Option<Value>) -> Value {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team", "uid": "0e5c"},
        "spec": {"containers": [{"name": "web", "image": image}]}});
    if let Some(originals) = originals {
        pod["metadata"]["annotations"] =
            json!({ ORIGINAL_IMAGES_ANNOTATION: originals.to_string() });
    }
    pod
}

fn update(new: Value, old: Value) -> KubernetesAdmissionRequest {
    KubernetesAdmissionRequest {
        uid: "1299d386".to_string(),
        kind: GroupVersionKind {
            group: String::new(),
            version: "v1".to_string(),
            kind: "Pod".to_string(),
        },
        operation: "UPDATE".to_string(),
        namespace: "team".to_string(),
        object: new,
        old_object: old,
        user_info: UserInfo {
            username: "alice".to_string(),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The audit scanner's replay of a running Pod.
pub(super) fn scanned(image: &str) -> KubernetesAdmissionRequest {
    let mut request = update(pod(image, None), Value::Null);
    request.operation = "CREATE".to_string();
    request.uid = "0e5c".to_string();
    request.user_info = UserInfo::default();
    request
}

pub(super) fn run(
    settings: &str,
    request: KubernetesAdmissionRequest,
    registry: &mut FakeRegistry,
    cluster: &mut impl Cluster,
) -> Outcome {
    let policy = policy_from(settings);
    admit(request, &policy, registry, cluster, &FakeClock::default())
}

fn image_of(outcome: &Outcome) -> Option<&str> {
    match &outcome.verdict {
        Verdict::Mutate(pod) => pod.pointer("/spec/containers/0/image")?.as_str(),
        _ => None,
    }
}

pub(super) fn unsigned() -> Result<String, LookupError> {
    Err(LookupError::Unverified("no signatures found".to_string()))
}

/// `kubectl apply` re-sends `nginx:1.27` while the Pod runs its swap: the running image is
/// kept only while its source still verifies at the digest it runs.
#[test]
fn a_reapplied_swap_is_kept_only_while_its_source_verifies() {
    let record = json!({"web": "nginx:1.27"});
    let old = pod(SWAPPED, Some(record.clone()));
    let new = pod("nginx:1.27", Some(record));
    let mut registry = FakeRegistry::default().with(BY_DIGEST, Ok(DIGEST_A));
    registry
        .verifications
        .insert(SOURCE_AT_A.to_string(), Ok(DIGEST_A.to_string()));
    let outcome = run(
        &signed(""),
        update(new.clone(), old.clone()),
        &mut registry,
        &mut NoCluster,
    );
    assert_eq!(image_of(&outcome), Some(SWAPPED), "{outcome:?}");
    assert_eq!(
        registry.asked,
        [format!("verify {SOURCE_AT_A}"), BY_DIGEST.to_string()]
    );

    // Its signature removed at the source: the update is refused, naming both spellings; the
    // running image is not changed to a source no verifier before this policy saw.
    registry
        .verifications
        .insert(SOURCE_AT_A.to_string(), unsigned());
    let outcome = run(&signed(""), update(new, old), &mut registry, &mut NoCluster);
    assert!(
        matches!(&outcome.verdict, Verdict::Reject(message)
            if message.contains(&format!("image \"{SWAPPED}\" is the mirror copy of"))),
        "{outcome:?}"
    );
}

/// `kubectl set image pod/p web=<mirror name>` of an unsigned image: refused, whatever
/// `onUnverified` says, never written back to a source no verifier before this one saw.
#[rstest::rstest]
#[case::keep("")]
#[case::reject(r#","onUnverified":"reject""#)]
fn an_unsigned_image_set_under_the_mirrors_name_is_refused(#[case] extra: &str) {
    let mut registry = FakeRegistry::default().with(BY_DIGEST, Ok(DIGEST_A));
    registry
        .verifications
        .insert(SOURCE_AT_A.to_string(), unsigned());
    let refused = run(
        &signed(extra),
        update(pod(SWAPPED, None), pod("nginx:1.26", None)),
        &mut registry,
        &mut NoCluster,
    );
    assert!(
        matches!(&refused.verdict, Verdict::Reject(message) if message.contains("is the mirror copy of")),
        "{refused:?}"
    );
}

/// One ClusterAdmissionPolicy verifier covering `nginx*`.
pub(super) struct OneVerifier;

impl Cluster for OneVerifier {
    fn list(&mut self, kind: PolicyKind, _namespace: Option<&str>) -> Result<Value, String> {
        Ok(match kind {
            PolicyKind::ClusterAdmissionPolicy => json!({"items": [{"metadata": {"name": "verify"},
                "spec": {"module": "registry://ghcr.io/kubewarden/policies/verify-image-signatures:v1.0.11",
                "settings": {"signatures": [{"image": "nginx*", "pubKeys": [KEY]}]}}}]}),
            _ => json!({"items": []}),
        })
    }

    fn can_i(&mut self, _review: &AccessReview<'_>) -> Result<Access, String> {
        Ok(Access {
            allowed: true,
            reason: String::new(),
        })
    }
}

/// A `module` pattern that matches no policy read is said, in a warning and an audit
/// annotation naming the pattern and the policies read.
#[test]
fn a_module_pattern_that_matches_no_policy_is_said() {
    let settings = r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"}],
        "verifiers":[{"module":"registry://ghcr.io/kubewarden/policies/verify-image-signatures:*"}]}"#;
    let create = |image: &str| {
        let mut request = update(pod(image, None), Value::Null);
        request.operation = "CREATE".to_string();
        request
    };
    let mut registry = FakeRegistry::default().with("m.io/hub/library/busybox:1", Ok(DIGEST_A));
    let outcome = run(
        settings,
        create("busybox:1"),
        &mut registry,
        &mut OneVerifier,
    );
    assert!(
        !outcome
            .warnings
            .iter()
            .any(|w| w.contains("matched no policy")),
        "{:?}",
        outcome.warnings
    );
    assert!(!outcome.audit.contains_key(super::VERIFIERS_UNMATCHED));
    let settings = settings.replace(":*\"}", "@*\"}");
    let outcome = run(
        &settings,
        create("busybox:1"),
        &mut registry,
        &mut OneVerifier,
    );
    assert!(
        outcome.warnings.iter().any(|w| w.contains(
            "verifiers: the module pattern \"registry://ghcr.io/kubewarden/policies/verify-image-signatures@*\" matched no policy read (read: ClusterAdmissionPolicy verify (registry://ghcr.io/kubewarden/policies/verify-image-signatures:v1.0.11))"
        )),
        "{:?}",
        outcome.warnings
    );
    let audit: Value =
        serde_json::from_str(&outcome.audit[super::VERIFIERS_UNMATCHED]).expect("JSON");
    assert_eq!(
        audit["globs"],
        json!(["registry://ghcr.io/kubewarden/policies/verify-image-signatures@*"])
    );
    // The verifier the pattern missed is named too: its rules are not applied here.
    assert!(
        outcome.warnings.iter().any(|w| w.starts_with(
            "verifiers: ClusterAdmissionPolicy verify (registry://ghcr.io/kubewarden/policies/verify-image-signatures:v1.0.11) has verify-image-signatures' signatures in its settings, but no module pattern of verifiers matches its module"
        )),
        "{:?}",
        outcome.warnings
    );
    assert_eq!(
        audit["leftOut"],
        json!([
            "ClusterAdmissionPolicy verify (registry://ghcr.io/kubewarden/policies/verify-image-signatures:v1.0.11)"
        ])
    );
}

/// One verifier, as [`OneVerifier`], read by a PolicyServer whose ServiceAccount lacks `verb`.
struct Lacking(&'static str);

impl Cluster for Lacking {
    fn list(&mut self, kind: PolicyKind, namespace: Option<&str>) -> Result<Value, String> {
        OneVerifier.list(kind, namespace)
    }

    fn can_i(&mut self, review: &AccessReview<'_>) -> Result<Access, String> {
        Ok(Access {
            allowed: review.verb != self.0,
            reason: String::new(),
        })
    }
}

fn with_reader(extra: &str) -> String {
    format!(
        r#"{{"mirrors":[{{"source":"docker.io","target":"m.io/hub"}}],"verifiers":[{{"module":"*/verify-image-signatures:*"}}],"policyServerServiceAccount":"kubewarden/policy-server"{extra}}}"#
    )
}

/// With `policyServerServiceAccount`, verifiers its PolicyServer may not list or watch are read
/// as unreadable: even an image no verifier's rule covers is `onLookupError`'s, with a message
/// naming the verb, the kind and the ServiceAccount; granted both, it is swapped as before.
#[test]
fn verifiers_the_policy_server_may_not_list_or_watch_are_unreadable() {
    let create = || {
        let mut request = update(pod("busybox:1", None), Value::Null);
        request.operation = "CREATE".to_string();
        request
    };
    let mut registry = FakeRegistry::default().with("m.io/hub/library/busybox:1", Ok(DIGEST_A));
    let granted = run(&with_reader(""), create(), &mut registry, &mut Lacking("-"));
    assert_eq!(
        image_of(&granted),
        Some(format!("m.io/hub/library/busybox:1@{DIGEST_A}").as_str()),
        "{granted:?}"
    );
    let stale = run(
        &with_reader(""),
        create(),
        &mut registry,
        &mut Lacking("watch"),
    );
    assert!(
        image_of(&stale).is_none_or(|image| image == "busybox:1"),
        "kept: {stale:?}"
    );
    assert!(
        stale.warnings.iter().any(|w| w.contains(
            "the PolicyServer's ServiceAccount kubewarden/policy-server may not watch ClusterAdmissionPolicy objects"
        )),
        "{stale:?}"
    );
    let refused = run(
        &with_reader(r#","onLookupError":"reject""#),
        create(),
        &mut registry,
        &mut Lacking("list"),
    );
    assert!(
        matches!(&refused.verdict, Verdict::Reject(message) if message.contains("may not list ClusterAdmissionPolicy objects")),
        "{refused:?}"
    );
    // The check role asks too: its check of a mirror image is then an error.
    let checked = run(
        &with_reader(r#","action":"check""#),
        scanned(SWAPPED),
        &mut registry,
        &mut Lacking("watch"),
    );
    assert!(
        matches!(&checked.verdict, Verdict::Error(message) if message.contains("may not watch ClusterAdmissionPolicy objects")),
        "{checked:?}"
    );
}
