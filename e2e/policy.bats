#!/usr/bin/env bats
# End-to-end tests under `kwctl run`, with recorded host interactions (no network needed).
# Run with `make e2e-tests` from the repository root: real kwctl when it is installed, else the
# project's stand-in (examples/kwctl-standin.rs); KWCTL=... and POLICY=... choose explicitly.

load helpers

@test "swaps to the mirror, pinned to the digest the mirror answered" {
  check_case swap-pinned
}

@test "a mirror rule's pullSecret is appended to imagePullSecrets when the Pod is swapped there" {
  check_case swap-pull-secret
}

@test "mirror lacks the image: keeps the original, warns, and records it with the copy that fills it" {
  check_case mirror-missing-kept
}

@test "mirror lacks the image with onMissing reject: rejects, naming image and mirror" {
  check_case mirror-missing-rejected
}

@test "registry unreachable: keeps the original and warns, even with onMissing reject" {
  check_case lookup-error-kept
}

@test "registry unreachable with onLookupError reject: rejects" {
  check_case lookup-error-rejected
}

@test "digest reference: looked up by digest and swapped" {
  check_case digest-reference
}

@test "already swapped image: no lookup, no patch" {
  check_case already-swapped
}

@test "a custom kind whose object is Pod-shaped (spec.containers) is not a Pod: unchanged, no lookup" {
  check_case pod-shaped-other-kind-unchanged
}

@test "a Deployment is accepted unchanged: its template is never touched (the kind check itself: the Pod-shaped custom kind)" {
  check_case deployment-unchanged
}

@test "an update that only changes labels: no lookup, no patch" {
  check_case label-only-update
}

@test "invalid settings are refused" {
  check_case invalid-settings
}

@test "signatures with pinDigest false are refused: a verified image is always pinned" {
  check_case signatures-unpinned-refused
}

@test "a static Pod's mirror Pod: no lookup, no patch" {
  check_case static-pod-mirror
}

@test "kubectl apply re-sends the original image: the running swap is kept, no lookup" {
  check_case reapply-unchanged
}

@test "two rules sharing one mirror repository are refused" {
  check_case overlapping-targets
}

@test "a re-applied digest original whose running image names another digest is decided afresh" {
  check_case reapply-other-digest
}

@test "pods/ephemeralcontainers: only ephemeral containers are looked at" {
  check_case ephemeral-containers-only
}

@test "an absent wording among other registry errors is a lookup error, not absent" {
  check_case envelope-not-only-absent
}

@test "an exclude pattern spelled as the Pod writes the image is refused with the spelling that matches" {
  check_case exclude-never-matching
}

@test "two spellings of one mirror registry (default port) are refused as one target" {
  check_case targets-one-registry-two-spellings
}

@test "ordered mirrors: the first pruned, the second holding the image: swapped to the second" {
  check_case ordered-first-pruned
}

@test "ordered mirrors: the first refusing connections: swapped to the second, with a warning naming the first" {
  check_case ordered-first-refusing
}

@test "ordered mirrors: neither holds the image: onMissing, naming each mirror's outcome" {
  check_case ordered-neither
}

@test "verifySource: a copy re-encoded to OCI (other digest, same config) is swapped to the mirror's digest" {
  check_case verify-source-reencoded
}

@test "verifySource: a stale copy (the tag names other content upstream) is kept, naming both digests" {
  check_case verify-source-stale
}

@test "check role, audit scan: a pinned mirror image the mirror holds passes, no patch" {
  check_case check-pinned-present
}

@test "check role, audit scan: a pruned pinned mirror image fails, naming container, answer, original and the refill line" {
  check_case check-pinned-pruned
}

@test "check role, audit scan: a tag-only mirror image the mirror lacks fails" {
  check_case check-tag-absent
}

@test "check role, audit scan: init and ephemeral containers are checked like the others" {
  check_case check-init-and-ephemeral
}

@test "check role, audit scan: a registry that cannot be asked is an error (code 500), not a finding" {
  check_case check-lookup-error
}

@test "check role: a Pod without mirror images passes without a lookup" {
  check_case check-no-mirror-image
}

@test "swapping policy, audit scan: accepted unchanged without a lookup" {
  check_case swap-audit-scan-unchanged
}

@test "swapping policy: the scanner's shape with a username is an admission, swapped" {
  check_case swap-audit-shape-with-username
}

@test "policy-server 1.35 refuses the OCI capability: kept, the warning says what to grant where" {
  check_case capability-not-granted
}

@test "credentials the mirror refused: the warning names the registry and the PolicyServer's imagePullSecret" {
  check_case credentials-refused
}

@test "Docker Hub's 401 (a repository that does not exist) does not blame policy-server's credentials" {
  check_case docker-hub-401
}

@test "a digest the pull-through cache has not stored is asked for by its tag, and swapped when the tag names it" {
  check_case digest-pinned-first-pull
}

@test "check role: a source image the mirror lacks is reported, with the copy that fills it" {
  check_case check-unmirrored
}

@test "check role: a source image the mirror holds passes after one lookup" {
  check_case check-source-mirrored
}

@test "check role: reportUnmirrored false reports only gone images, without a lookup" {
  check_case check-report-only-gone
}

@test "check role: a real admission is answered at once, without a lookup" {
  check_case check-admission-answered-at-once
}

@test "check role with checkAdmissions (protect): a real admission is checked" {
  check_case check-protect-admission
}

@test "signatures: a mirror copy whose signature is in the mirror is swapped at the verified digest" {
  check_case signatures-verified-swapped
}

@test "signatures: a certificate-signed copy is swapped at the verified digest" {
  check_case signatures-certificate-swapped
}

@test "signatures: an image a verifier pinned first is swapped only to that digest" {
  check_case signatures-pinned-by-verifier-swapped
}

@test "signatures: a copy whose signature the mirror lacks is kept, recorded with the signature copy" {
  check_case signatures-unverified-kept
}

@test "signatures: an unsigned image is kept at its source, for the verifier to refuse" {
  check_case signatures-unsigned-kept
}

@test "signatures: onUnverified reject refuses the Pod" {
  check_case signatures-unverified-rejected
}

@test "signatures: a mirror tag naming another digest than the signed one is not swapped to" {
  check_case signatures-other-digest-kept
}

@test "verifiers: a namespaced verifier's rules, read from the cluster, keep an unsigned image at its source" {
  check_case verifiers-namespaced-unsigned-kept
}

@test "verifiers: a signed image whose copy verifies under a namespaced verifier's rules is swapped at its verified digest" {
  check_case verifiers-namespaced-signed-swapped
}

@test "verifiers that cannot be read keep the image, with the host's reason" {
  check_case verifiers-unreadable-kept
}
