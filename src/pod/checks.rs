//! Step 2 of the check role: one lookup per distinct image to check, asked as the swap's
//! decisions are (the first image of each registry first, each lookup once, within the
//! budget), and what it means for each container. Mirror images are asked whether they are
//! still there; source images a rule routes (with `reportUnmirrored`), whether any target holds
//! them. The check role's answer is built by `check_report`.

use std::collections::BTreeMap;

use crate::decide::check;
use crate::decide::presence::Presence;
use crate::policy::Policy;
use crate::registry::{Registry, registry_host};

use super::candidates::Candidate;
use super::decisions::first_of_each_registry;
use super::look_once::LookOnce;

/// A container whose image the check asked about, and what the mirror said of it.
pub(super) struct Checked {
    /// The container's place among the candidates.
    pub(super) candidate: usize,
    pub(super) image: check::CheckedImage,
    pub(super) presence: Presence,
}

/// Checks every candidate whose image lies under a target, and (with `reportUnmirrored`)
/// every one a rule routes to a mirror; the others need no lookup.
pub(super) fn check_all(
    candidates: &[Candidate<'_>],
    originals: &BTreeMap<String, String>,
    policy: &Policy,
    registry: &mut impl Registry,
) -> Vec<Checked> {
    let mut registry = LookOnce::new(registry);
    // Distinct images in container order, and each container's.
    let mut distinct: Vec<check::CheckedImage> = Vec::new();
    let mut index_of: BTreeMap<&str, usize> = BTreeMap::new();
    let mut of_container: Vec<(usize, usize)> = Vec::new();
    for (at, candidate) in candidates.iter().enumerate() {
        let index = match index_of.get(candidate.image) {
            Some(&index) => index,
            None => {
                let original = originals.get(candidate.name).map(String::as_str);
                let Some(image) = check::CheckedImage::of(candidate.image, original, policy) else {
                    continue;
                };
                distinct.push(image);
                index_of.insert(candidate.image, distinct.len() - 1);
                distinct.len() - 1
            }
        };
        of_container.push((at, index));
    }
    let order = first_of_each_registry(
        distinct
            .iter()
            .map(|image| vec![registry_host(image.first_lookup())]),
    );
    let mut presence: Vec<Option<Presence>> = vec![None; distinct.len()];
    for index in order {
        if let (Some(image), Some(slot)) = (distinct.get(index), presence.get_mut(index)) {
            *slot = Some(image.check(policy, &mut registry));
        }
    }
    of_container
        .into_iter()
        .filter_map(|(candidate, index)| {
            Some(Checked {
                candidate,
                image: distinct.get(index)?.clone(),
                presence: presence.get(index)?.clone()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::{ORIGINAL_IMAGES_ANNOTATION, Outcome, Verdict, admit};
    use crate::budget::tests::FakeClock;
    use crate::decide::tests::{DIGEST_A, FakeRegistry, policy_from};
    use crate::registry::LookupError;
    use kubewarden_policy_sdk::request::{GroupVersionKind, KubernetesAdmissionRequest, UserInfo};
    use serde_json::{Value, json};

    const UID: &str = "6b3a9f0c-7d1e-4f53-9d4c-2f0a8e1b7c55";
    const SWAP: &str = r#"{"mirrors":[{"source":"docker.io","target":"m.io/hub"}]}"#;
    const CHECK: &str =
        r#"{"action":"check","mirrors":[{"source":"docker.io","target":"m.io/hub"}]}"#;
    const PINNED: &str = "m.io/hub/library/nginx:1.27@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const BY_DIGEST: &str = "m.io/hub/library/nginx@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    /// A running Pod as the audit scanner sends it: a CREATE whose uid is the Pod's, with an
    /// empty userInfo and the Pod's status.
    fn scanned(spec: Value, annotations: Value) -> KubernetesAdmissionRequest {
        let object = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "default", "uid": UID,
                         "resourceVersion": "4711", "annotations": annotations},
            "spec": spec,
            "status": {"phase": "Running"},
        });
        KubernetesAdmissionRequest {
            uid: UID.to_string(),
            kind: GroupVersionKind {
                group: String::new(),
                version: "v1".to_string(),
                kind: "Pod".to_string(),
            },
            operation: "CREATE".to_string(),
            object,
            old_object: Value::Null,
            ..Default::default()
        }
    }

    /// The same Pod as the API server sends it: a request uid of its own and a username.
    fn admitted(spec: Value) -> KubernetesAdmissionRequest {
        let mut request = scanned(spec, json!({}));
        request.uid = "1299d386-525b-4032-98ae-1949f69f9cfc".to_string();
        request.user_info = UserInfo {
            username: "kubernetes-admin".to_string(),
            ..Default::default()
        };
        request
    }

    fn run(
        settings: &str,
        request: KubernetesAdmissionRequest,
        registry: &mut FakeRegistry,
    ) -> Outcome {
        admit(
            request,
            &policy_from(settings),
            registry,
            &mut crate::verifiers::NoCluster,
            &FakeClock::default(),
        )
    }

    fn web(image: &str) -> Value {
        json!({"containers": [{"name": "web", "image": image}]})
    }

    fn recorded(original: &str) -> Value {
        json!({ ORIGINAL_IMAGES_ANNOTATION: json!({"web": original}).to_string() })
    }

    #[test]
    fn the_swapping_policy_answers_the_audit_scanner_unchanged_without_a_lookup() {
        let mut registry =
            FakeRegistry::default().with("m.io/hub/library/nginx:1.27", Ok(DIGEST_A));
        let outcome = run(SWAP, scanned(web("nginx:1.27"), json!({})), &mut registry);
        assert_eq!(outcome, Outcome::unchanged());
        assert!(registry.asked.is_empty(), "{:?}", registry.asked);
    }

    #[test]
    fn the_same_pod_from_the_api_server_is_swapped() {
        let mut registry =
            FakeRegistry::default().with("m.io/hub/library/nginx:1.27", Ok(DIGEST_A));
        let outcome = run(SWAP, admitted(web("nginx:1.27")), &mut registry);
        assert!(matches!(outcome.verdict, Verdict::Mutate(_)), "{outcome:?}");
        assert_eq!(registry.asked, ["m.io/hub/library/nginx:1.27"]);
    }

    /// Only both marks together are the scanner: an empty username alone (a request uid of its
    /// own), or the Pod's uid with a username, is decided as any admission.
    #[test]
    fn one_mark_of_the_scanner_alone_is_an_admission() {
        for request in [
            {
                let mut r = scanned(web("nginx:1.27"), json!({}));
                r.uid = "another".to_string();
                r
            },
            {
                let mut r = admitted(web("nginx:1.27"));
                r.uid = UID.to_string();
                r
            },
        ] {
            let mut registry =
                FakeRegistry::default().with("m.io/hub/library/nginx:1.27", Ok(DIGEST_A));
            let outcome = run(SWAP, request, &mut registry);
            assert!(matches!(outcome.verdict, Verdict::Mutate(_)), "{outcome:?}");
        }
    }

    #[test]
    fn a_pinned_mirror_image_the_mirror_holds_passes_after_one_lookup_by_digest() {
        let mut registry = FakeRegistry::default().with(BY_DIGEST, Ok(DIGEST_A));
        let outcome = run(
            CHECK,
            scanned(web(PINNED), recorded("nginx:1.27")),
            &mut registry,
        );
        assert_eq!(outcome.verdict, Verdict::Accept);
        assert_eq!(registry.asked, [BY_DIGEST]);
    }

    #[test]
    fn a_pruned_mirror_image_is_a_finding_that_says_what_to_do() {
        let mut registry = FakeRegistry::default();
        let outcome = run(
            CHECK,
            scanned(web(PINNED), recorded("nginx:1.27")),
            &mut registry,
        );
        let Verdict::Reject(message) = outcome.verdict else {
            panic!("expected a finding, got {outcome:?}");
        };
        assert_eq!(
            message,
            format!(
                "a mirror image the Pod runs is gone from the mirror: containers \"web\": image \"{PINNED}\" is gone from the mirror (asked for \"{BY_DIGEST}\", it answered: manifest unknown); it was swapped from \"nginx:1.27\": refill the mirror (skopeo copy --all --preserve-digests docker://docker.io/library/nginx@{DIGEST_A} docker://m.io/hub/library/nginx:sha256-{}) or roll the workload out so that its new Pods are decided afresh",
                &DIGEST_A[7..]
            )
        );
    }

    #[test]
    fn without_a_matching_record_or_a_source_the_finding_says_roll_out() {
        // The record names another image than the one the container runs: it is ignored; and
        // the one source the mirror's layout inverts to is excluded, so it routes nowhere: no
        // copy is guessed.
        let settings = r#"{"action":"check","mirrors":[{"source":"docker.io","target":"m.io/hub"}],
            "exclude":["docker.io/library/nginx:*"]}"#;
        let outcome = run(
            settings,
            scanned(web("m.io/hub/library/nginx:1.27"), recorded("redis:7")),
            &mut FakeRegistry::default(),
        );
        let Verdict::Reject(message) = outcome.verdict else {
            panic!("expected a finding, got {outcome:?}");
        };
        assert!(
            message.ends_with("roll the workload out so that its new Pods are decided afresh, or refill the mirror from the image's source"),
            "{message}"
        );
        assert!(
            message.contains("asked for \"m.io/hub/library/nginx:1.27\""),
            "{message}"
        );
    }

    /// A running Pod with its status, as the audit scanner sends it.
    fn running(image: &str, image_id: &str, annotations: Value) -> KubernetesAdmissionRequest {
        let mut request = scanned(web(image), annotations);
        request.object["status"]["containerStatuses"] =
            json!([{"name": "web", "image": image, "imageID": image_id}]);
        request
    }

    /// A Pod another swapper put under the mirror (k8s-image-swapper's layout, `<registry>/<source
    /// host>/<path>`, no record): the one source that routes there is named, and its refill
    /// copies the digest the container runs to the tag it names, so that the fill job puts back
    /// what ECR's lifecycle expired, as the container runs it.
    #[test]
    fn a_pod_another_swapper_swapped_gets_the_copy_from_its_source_at_the_running_digest() {
        let settings = r#"{"action":"check","defaultMirror":{"registry":"ecr.example.com/cache"}}"#;
        let image = "ecr.example.com/cache/docker.io/library/nginx:1.27";
        let repository = "ecr.example.com/cache/docker.io/library/nginx";
        let outcome = run(
            settings,
            running(image, &format!("{repository}@{DIGEST_A}"), json!({})),
            &mut FakeRegistry::default(),
        );
        let Verdict::Reject(message) = outcome.verdict else {
            panic!("expected a finding, got {outcome:?}");
        };
        assert!(
            message.ends_with(&format!(
                "no record names its source; by the mirror's layout it is a copy of \"docker.io/library/nginx:1.27\": refill the mirror, at the digest the container runs ({DIGEST_A}) (skopeo copy --all --preserve-digests docker://docker.io/library/nginx@{DIGEST_A} docker://{image}) or roll the workload out so that its new Pods are decided afresh"
            )),
            "{message}"
        );
    }

    /// The policy's own swap by tag, recorded: the refill copies the running digest too, not the
    /// source's tag, which may name a newer build by now.
    #[test]
    fn a_recorded_swap_by_tag_is_refilled_at_the_digest_the_container_runs() {
        let image = "m.io/hub/library/nginx:1.27";
        let outcome = run(
            CHECK,
            running(
                image,
                &format!("m.io/hub/library/nginx@{DIGEST_A}"),
                recorded("nginx:1.27"),
            ),
            &mut FakeRegistry::default(),
        );
        let Verdict::Reject(message) = outcome.verdict else {
            panic!("expected a finding, got {outcome:?}");
        };
        assert!(
            message.contains(&format!(
                "it was swapped from \"nginx:1.27\": refill the mirror, at the digest the container runs ({DIGEST_A}) (skopeo copy --all --preserve-digests docker://docker.io/library/nginx@{DIGEST_A} docker://{image})"
            )),
            "{message}"
        );
        // Without a status, the source's tag.
        let outcome = run(
            CHECK,
            scanned(web(image), recorded("nginx:1.27")),
            &mut FakeRegistry::default(),
        );
        let Verdict::Reject(message) = outcome.verdict else {
            panic!("expected a finding, got {outcome:?}");
        };
        assert!(
            message.contains(&format!(
                "refill the mirror (skopeo copy --all --preserve-digests docker://docker.io/library/nginx:1.27 docker://{image})"
            )),
            "{message}"
        );
    }

    #[test]
    fn every_container_list_is_checked_and_each_finding_named() {
        let spec = json!({
            "initContainers": [{"name": "init", "image": "m.io/hub/library/busybox:1"}],
            "containers": [{"name": "web", "image": PINNED}, {"name": "side", "image": "ghcr.io/x/y:1"}],
            "ephemeralContainers": [{"name": "debug", "image": "m.io/hub/library/alpine:3"}],
        });
        let mut registry = FakeRegistry::default().with(BY_DIGEST, Ok(DIGEST_A));
        let outcome = run(CHECK, scanned(spec, json!({})), &mut registry);
        let Verdict::Reject(message) = outcome.verdict else {
            panic!("expected a finding, got {outcome:?}");
        };
        assert!(
            message.starts_with("2 mirror images the Pod runs are gone"),
            "{message}"
        );
        assert!(
            message.contains("initContainers \"init\": image \"m.io/hub/library/busybox:1\""),
            "{message}"
        );
        assert!(
            message.contains("ephemeralContainers \"debug\": image \"m.io/hub/library/alpine:3\""),
            "{message}"
        );
        assert!(!message.contains("\"web\""), "{message}");
        assert_eq!(
            registry.asked.len(),
            3,
            "the source image is not looked up: {:?}",
            registry.asked
        );
    }

    #[test]
    fn a_lookup_that_could_not_be_made_is_an_error_not_a_finding() {
        let failed = LookupError::Failed("connection refused".to_string());
        let mut registry = FakeRegistry::default().with(BY_DIGEST, Err(failed));
        let outcome = run(CHECK, scanned(web(PINNED), json!({})), &mut registry);
        assert_eq!(
            outcome.verdict,
            Verdict::Error(format!(
                "the Pod's mirror images could not all be checked: containers \"web\": image \"{PINNED}\" not checked: could not ask the mirror for \"{BY_DIGEST}\" (connection refused)"
            ))
        );
    }

    #[test]
    fn a_pod_without_images_a_rule_routes_needs_no_lookup() {
        let mut registry = FakeRegistry::default();
        let outcome = run(
            CHECK,
            scanned(web("ghcr.io/o/a:1"), json!({})),
            &mut registry,
        );
        assert_eq!(outcome, Outcome::unchanged());
        assert!(registry.asked.is_empty());
    }

    /// A running source image that a rule routes to a mirror that lacks it: a finding of its
    /// own kind, with the copy that fills the first target. By tag: the tag, which the mirror
    /// just said it lacks; by digest: the digest, to a tag of its own.
    #[test]
    fn a_source_image_the_mirror_lacks_is_reported_with_the_copy_that_fills_it() {
        let outcome = run(
            CHECK,
            scanned(web("nginx:1.27"), json!({})),
            &mut FakeRegistry::default(),
        );
        assert_eq!(
            outcome.verdict,
            Verdict::Reject("a source image the Pod runs is not in the mirror: containers \"web\": image \"nginx:1.27\" is not in the mirror (asked for \"m.io/hub/library/nginx:1.27\", it answered: manifest unknown); fill the mirror (skopeo copy --all --preserve-digests docker://docker.io/library/nginx:1.27 docker://m.io/hub/library/nginx:1.27), and the next Pods that name it are swapped".to_string())
        );
        let pinned = format!("nginx:1.27@{DIGEST_A}");
        let outcome = run(
            CHECK,
            scanned(web(&pinned), json!({})),
            &mut FakeRegistry::default(),
        );
        let Verdict::Reject(message) = outcome.verdict else {
            panic!("a finding: {outcome:?}");
        };
        assert!(
            message.contains(&format!(
                "(skopeo copy --all --preserve-digests docker://docker.io/library/nginx@{DIGEST_A} docker://m.io/hub/library/nginx:sha256-{})",
                &DIGEST_A[7..]
            )),
            "{message}"
        );
    }

    #[test]
    fn a_source_image_the_mirror_holds_passes_after_one_lookup() {
        let mut registry =
            FakeRegistry::default().with("m.io/hub/library/nginx:1.27", Ok(DIGEST_A));
        let outcome = run(CHECK, scanned(web("nginx:1.27"), json!({})), &mut registry);
        assert_eq!(outcome.verdict, Verdict::Accept);
        assert_eq!(registry.asked, ["m.io/hub/library/nginx:1.27"]);
    }

    #[test]
    fn report_unmirrored_false_reports_only_gone_images() {
        let settings = r#"{"action":"check","reportUnmirrored":false,"mirrors":[{"source":"docker.io","target":"m.io/hub"}]}"#;
        let mut registry = FakeRegistry::default();
        let outcome = run(
            settings,
            scanned(web("nginx:1.27"), json!({})),
            &mut registry,
        );
        assert_eq!(outcome, Outcome::unchanged());
        assert!(registry.asked.is_empty());
    }

    /// Both kinds in one Pod: each under its own head, so that reports can be filtered.
    #[test]
    fn gone_and_not_in_the_mirror_have_heads_of_their_own() {
        let spec = json!({"containers": [
            {"name": "web", "image": PINNED},
            {"name": "cache", "image": "redis:7"},
        ]});
        let outcome = run(
            CHECK,
            scanned(spec, json!({})),
            &mut FakeRegistry::default(),
        );
        let Verdict::Reject(message) = outcome.verdict else {
            panic!("a finding: {outcome:?}");
        };
        assert!(
            message.starts_with(
                "a mirror image the Pod runs is gone from the mirror: containers \"web\""
            ),
            "{message}"
        );
        assert!(message.contains("; and a source image the Pod runs is not in the mirror: containers \"cache\": image \"redis:7\""), "{message}");
    }

    /// The monitor deployment's check serves the scanner: an admission is answered at once,
    /// without a lookup, unless `checkAdmissions` asks for it (`mode: protect`).
    #[test]
    fn admissions_are_checked_only_when_asked() {
        let mut registry = FakeRegistry::default();
        let outcome = run(CHECK, admitted(web(PINNED)), &mut registry);
        assert_eq!(outcome, Outcome::unchanged());
        assert!(registry.asked.is_empty());

        let protect = r#"{"action":"check","checkAdmissions":true,"mirrors":[{"source":"docker.io","target":"m.io/hub"}]}"#;
        let outcome = run(protect, admitted(web(PINNED)), &mut registry);
        assert!(matches!(outcome.verdict, Verdict::Reject(_)), "{outcome:?}");
        assert_eq!(registry.asked, [BY_DIGEST]);
    }

    #[test]
    fn the_check_role_never_rewrites_a_source_image() {
        let protect = r#"{"action":"check","checkAdmissions":true,"mirrors":[{"source":"docker.io","target":"m.io/hub"}]}"#;
        let mut registry =
            FakeRegistry::default().with("m.io/hub/library/nginx:1.27", Ok(DIGEST_A));
        let outcome = run(protect, admitted(web("nginx:1.27")), &mut registry);
        assert_eq!(outcome.verdict, Verdict::Accept);
        assert!(outcome.warnings.is_empty());
    }

    const SIGNED_CHECK: &str = r#"{"action":"check","mirrors":[{"source":"docker.io","target":"m.io/hub"}],
        "signatures":[{"image":"nginx*","pubKeys":["-----BEGIN PUBLIC KEY-----\nKEY\n-----END PUBLIC KEY-----"]}]}"#;
    const SOURCE_BY_DIGEST: &str = "docker.io/library/nginx@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const STALE_SIGNATURE: &str = "m.io/hub/library/nginx:sha256-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.sig";

    /// A running mirror image swapped from a source `signatures` covers: its digest is
    /// verified again at the source; one whose signature was removed there is a finding that
    /// names the mirror's stale signature tag and the command that removes it.
    #[test]
    fn a_running_mirror_image_whose_source_no_longer_verifies_is_a_finding() {
        let mut registry = FakeRegistry::default().with(BY_DIGEST, Ok(DIGEST_A));
        registry.verifications.insert(
            SOURCE_BY_DIGEST.to_string(),
            Err(LookupError::Unverified(format!(
                "no signatures found for image: {SOURCE_BY_DIGEST}"
            ))),
        );
        let pod = scanned(web(PINNED), recorded("nginx:1.27"));
        let outcome = run(SIGNED_CHECK, pod, &mut registry);
        let Verdict::Reject(message) = &outcome.verdict else {
            panic!("no finding: {outcome:?}");
        };
        assert!(
            message.contains(
                "no longer verifies at its source (asked for \"docker.io/library/nginx@sha256:aaaa"
            ),
            "{message}"
        );
        assert!(
            message.contains(&format!(
                "remove it (skopeo delete docker://{STALE_SIGNATURE})"
            )),
            "{message}"
        );
        assert_eq!(
            registry.asked,
            [BY_DIGEST.to_string(), format!("verify {SOURCE_BY_DIGEST}")]
        );

        // Still signed at the source: nothing to report. Without the record, or a record the
        // image is no swap of, the image is judged as the source that routes to it: verified
        // there too.
        registry
            .verifications
            .insert(SOURCE_BY_DIGEST.to_string(), Ok(DIGEST_A.to_string()));
        let pod = scanned(web(PINNED), recorded("nginx:1.27"));
        assert_eq!(
            run(SIGNED_CHECK, pod, &mut registry).verdict,
            Verdict::Accept
        );
        for annotations in [json!({}), recorded("nginx:1.26")] {
            registry.asked.clear();
            let pod = scanned(web(PINNED), annotations);
            assert_eq!(
                run(SIGNED_CHECK, pod, &mut registry).verdict,
                Verdict::Accept
            );
            assert_eq!(
                registry.asked,
                [BY_DIGEST.to_string(), format!("verify {SOURCE_BY_DIGEST}")]
            );
        }
    }
}
