//! The reading of the host's error texts, for a person and for the decision.
//!
//! The host reports every failure as text, so only the text tells "the registry says there is no
//! such image" from "the registry could not be asked". The text is Rust `anyhow`'s debug form of
//! the host's error (policy-evaluator's `runtimes/callback.rs`:
//! `format!("Callback evaluation failure: {e:?}")`): up to policy-server 1.37 a first line, then
//! a `Caused by:` list; from 1.38 the whole chain on one line (`outer: cause: cause`, see
//! [`Chain`]); either with a `Stack backtrace:` when the host runs with `RUST_BACKTRACE=1`. Both
//! shapes read the same. [`read_host_error`] turns it
//! into one line for a person, and classifies it from the registry's own words only; a refusal
//! of policy-server's credentials is told apart from other lookup errors, because the operator
//! fixes it in one place (the PolicyServer's `imagePullSecret`). [`read_verification_error`]
//! reads a signature verification's texts, which wrap a lookup's.

use crate::registry::{LookupError, registry_host};
use crate::text::truncated;

mod chain;

use chain::Chain;

/// How registries word "no such manifest or repository" in the `message` of their error
/// envelope, which is all the host's OCI client prints (oci-client's `OciError` displays
/// `OCI API error: {message}`, never the code). Matched case-insensitively against each message,
/// never against the URL or the rest of the text. Each entry is `(starts with, then contains)`.
pub const ABSENT_MESSAGES: &[(&str, &str)] = &[
    // CNCF distribution (registry/api/v2/errors.go: ErrorCodeManifestUnknown, ErrorCodeNameUnknown),
    // also served by Docker Hub, GitHub and GitLab container registries (both run distribution
    // or its wording), Quay (endpoints/v2/errors.py: ManifestUnknown, NameUnknown), Zot
    // (pkg/api/errors/errors.go) and Sonatype Nexus.
    ("manifest unknown", ""),
    ("repository name not known to registry", ""),
    // Quay: a tag removed by its expiry (endpoints/v2/errors.py: TagExpired).
    ("tag has expired", ""),
    // Harbor: NOT_FOUND from the artifact controller ("artifact {repo}:{tag} not found",
    // src/controller/artifact/controller.go) and the repository manager ("repository {name}
    // not found").
    ("artifact ", " not found"),
    ("repository ", " not found"),
    // Azure Container Registry: MANIFEST_UNKNOWN "manifest tagged by \"x\" is not found" and
    // "manifest sha256:... is not found"; NAME_UNKNOWN "repository \"x\" is not found" (above).
    ("manifest ", " is not found"),
    // JFrog Artifactory: MANIFEST_UNKNOWN "The named manifest is not known to the registry."
    ("the named manifest is not known to the registry", ""),
    // Artifact Registry, a standard repository: MANIFEST_UNKNOWN (404) `Failed to fetch "<tag or
    // digest>"` (older form: `... from request "/v2/.../manifests/..."`), in public reports
    // (firezone/firezone#10484; stefanprodan/dockprom#242 on gcr.io, the same backend); its
    // NAME_UNKNOWN `Repository "<name>" not found` is the Harbor entry's. A remote repository's
    // `Received invalid response from external repository` stands under 404 and 502 alike, so
    // it is not read as absent.
    ("failed to fetch \"", ""),
    // Amazon ECR: MANIFEST_UNKNOWN "Requested image not found"; NAME_UNKNOWN "The repository with
    // name '...' does not exist in the registry with id '...'".
    ("requested image not found", ""),
    (
        "the repository with name ",
        " does not exist in the registry",
    ),
];

/// How registries word "your credentials were refused, or you have none that allow this" in
/// their error envelope (a 403, or a 4xx other than 401: oci-client reads every 401 as
/// `Not authorized: url U` without the body, `validate_registry_response` in its `client.rs`).
/// Matched case-insensitively against each message, as [`ABSENT_MESSAGES`] are.
pub const REFUSED_MESSAGES: &[(&str, &str)] = &[
    // CNCF distribution (registry/api/v2/errors.go: ErrorCodeUnauthorized, ErrorCodeDenied),
    // also Docker Hub, GitLab, Zot; Azure Container Registry adds ", visit
    // https://aka.ms/acr/authorization for more information." (public error reports).
    ("authentication required", ""),
    ("requested access to the resource is denied", ""),
    // Harbor: "unauthorized to access repository: library/x, action: pull: ..."
    // (src/server/middleware/v2auth); Quay: "access to the requested resource is not
    // authorized" (endpoints/v2/errors.py: Unauthorized).
    ("unauthorized", ""),
    ("access to the requested resource is not authorized", ""),
    // Amazon ECR: an expired registry token (DENIED, 403) and an IAM refusal ("User: arn:... is
    // not authorized to perform: ecr:BatchGetImage on resource: ...").
    ("your authorization token has expired", ""),
    ("user: ", " is not authorized to perform"),
    ("not authorized", ""),
    // Artifact Registry: 403 "Permission \"artifactregistry.repositories.downloadArtifacts\"
    // denied on resource \"projects/p/locations/l/repositories/r\" (or it may not exist)".
    ("permission ", " denied on resource"),
];

/// Docker Hub's names for itself in the URLs the host's client asks (oci-client resolves
/// `docker.io` to `index.docker.io`). Hub answers 401 for a repository that does not exist, or
/// is private, exactly as it does for refused credentials.
const DOCKER_HUB_HOSTS: &[&str] = &["docker.io", "index.docker.io", "registry-1.docker.io"];

/// The longest host text quoted in a message.
const TEXT_MAX: usize = 300;

/// Reads a host error text: one readable line, and whether the registry said "absent".
///
/// - A registry error envelope (`Registry error: url U, envelope: OCI API errors: [OCI API error:
///   M]`) becomes `registry: M`, absent when M is one of [`ABSENT_MESSAGES`].
/// - An HTTP status without an envelope (`Server error: url U, code: C, message: M`) becomes
///   `HTTP C from U: M`, absent only for 404 on a manifest URL (the distribution spec's answer
///   for an unknown manifest).
/// - A refusal of policy-server's credentials (any 401, a token server's refusal, a 403, or a
///   message of [`REFUSED_MESSAGES`]) is a lookup error that names `image`'s registry and where
///   the credentials come from; Docker Hub's, that the repository may not exist.
/// - Anything else is a lookup error: its first error, and what its causes add to it without
///   the HTTP client's wrappers (`... (Connect): Connection refused (os error 111)`), the same
///   from either shape of the text.
pub fn read_host_error(text: &str, image: &str) -> LookupError {
    let text = strip_prefixes(text);
    if text.trim().is_empty() {
        return LookupError::Failed("policy-server's host call failed with no text".to_string());
    }
    if let Some(capability) = denied_capability(text) {
        return LookupError::Failed(format!(
            "policy-server did not grant this policy the host capability {capability:?}: grant it in PolicyServer spec.namespacedPoliciesCapabilities (a namespaced AdmissionPolicy), or in the policy's hostCapabilities in policies.yml (a policy-server run by hand); cluster-wide policies are granted every capability"
        ));
    }
    let chain = Chain::read(text);
    let head = chain
        .head
        .strip_prefix("Fail to interact with OCI registry: ")
        .unwrap_or(chain.head);
    // oci-client's `UnauthorizedError` (any 401) and `AuthenticationFailure` (the token server
    // refused): the registry's words are not in the text, only that it said no.
    if head.starts_with("Not authorized: url ") || head.starts_with("Authentication failure: ") {
        return credentials_refused(&one_line(head), image);
    }
    if let Some(messages) = envelope_messages(head) {
        // Absent only when the registry says nothing else: "authentication required; manifest
        // unknown" is a registry that could not be asked properly, not a pruned image.
        let absent = messages.iter().all(|m| is_absent_message(m));
        let line = one_line(&format!("registry: {}", messages.join("; ")));
        if messages.iter().any(|m| is_refused_message(m)) {
            return credentials_refused(&line, image);
        }
        return if absent {
            LookupError::Absent(line)
        } else {
            LookupError::Failed(line)
        };
    }
    if let Some((url, code, message)) = server_error(head) {
        let line = one_line(&if message.trim().is_empty() {
            format!("HTTP {code} from {url}")
        } else {
            format!("HTTP {code} from {url}: {message}")
        });
        if code == "401" || code == "403" {
            return credentials_refused(&line, image);
        }
        return if code == "404" && url.contains("/manifests/") {
            LookupError::Absent(line)
        } else {
            LookupError::Failed(line)
        };
    }
    let head = one_line(head);
    let line = match chain.causes() {
        Some(causes) if !head.contains(causes.as_str()) => format!("{head}: {causes}"),
        _ => head,
    };
    LookupError::Failed(bounded(&line))
}

/// A lookup the registry refused for want of valid credentials: a lookup error whose text says
/// whose credentials they were and where they come from, since that is where the operator fixes
/// it. policy-server reads them from the docker config of the PolicyServer's `imagePullSecret`
/// at every lookup (policy-fetcher asks the `docker_credential` crate), so a renewed Secret is
/// used within the kubelet's update of the volume, without a restart.
fn credentials_refused(said: &str, image: &str) -> LookupError {
    let host = registry_host(image);
    let said = truncated(said, TEXT_MAX / 2);
    if DOCKER_HUB_HOSTS.contains(&host) {
        return LookupError::Failed(format!(
            "Docker Hub refused it ({said}): Hub answers so for a repository that does not exist or is private as well as for refused credentials, so check the image name before policy-server's credentials for docker.io"
        ));
    }
    LookupError::Failed(format!(
        "registry {host} refused policy-server's credentials for it, or policy-server has none ({said}): lookups use the docker config in the PolicyServer's imagePullSecret, read at every lookup; renew the credentials for {host} there (ECR tokens expire after 12 hours)",
        host = truncated(host, 100)
    ))
}

/// The waPC guest library and the host wrap the text in "Host error: " and
/// "Callback evaluation failure: "; the operator needs only what follows.
fn strip_prefixes(text: &str) -> &str {
    let text = text.strip_prefix("Host error: ").unwrap_or(text);
    text.strip_prefix("Callback evaluation failure: ")
        .unwrap_or(text)
}

/// The capability policy-server 1.35 refused, from its text `Policy has not been granted
/// access to the 'oci/v1/manifest_digest' host capability.` (policy-server 1.35 checks every
/// host call against the policy's allow-list; see KUBEWARDEN.md). Matched wherever it stands
/// in the text, since the host may wrap it.
fn denied_capability(text: &str) -> Option<&str> {
    const START: &str = "has not been granted access to the '";
    let rest = &text[text.find(START)? + START.len()..];
    let (capability, after) = rest.split_once('\'')?;
    after
        .starts_with(" host capability")
        .then_some(capability)
        .filter(|c| !c.is_empty() && c.len() <= 100 && !c.contains(char::is_whitespace))
}

/// The messages of oci-client's `RegistryError` display: `envelope: OCI API errors: [OCI API
/// error: M1\nOCI API error: M2]` (the envelope joins its errors with a newline).
fn envelope_messages(head: &str) -> Option<Vec<String>> {
    const START: &str = "envelope: OCI API errors: [";
    let body = &head[head.find(START)? + START.len()..];
    let body = body.strip_suffix(']').unwrap_or(body);
    let messages: Vec<String> = body
        .split("OCI API error: ")
        .map(|m| one_line(m.trim_end_matches([',', '\n', ' '])))
        .filter(|m| !m.is_empty())
        .collect();
    Some(if messages.is_empty() {
        vec!["(no message)".to_string()]
    } else {
        messages
    })
}

/// oci-client's `ServerError` display: `Server error: url {url}, code: {code}, message: {message}`.
fn server_error(head: &str) -> Option<(&str, &str, &str)> {
    let rest = head.strip_prefix("Server error: url ")?;
    let (url, rest) = rest.split_once(", code: ")?;
    // An empty message leaves ", message:" last, its space trimmed with the text's end.
    let (code, message) = rest
        .split_once(", message:")
        .map_or((rest, ""), |(code, message)| (code, message.trim_start()));
    Some((url, code, message))
}

fn is_absent_message(message: &str) -> bool {
    matches_wording(message, ABSENT_MESSAGES)
}

fn is_refused_message(message: &str) -> bool {
    matches_wording(message, REFUSED_MESSAGES)
}

fn matches_wording(message: &str, wordings: &[(&str, &str)]) -> bool {
    let message = message.trim().to_ascii_lowercase();
    wordings.iter().any(|(start, then)| {
        message
            .strip_prefix(start)
            .is_some_and(|rest| rest.contains(then))
    })
}

/// Newlines, tabs and other control characters become single spaces.
pub(super) fn one_line(text: &str) -> String {
    let mut line = String::with_capacity(text.len());
    for word in text.split(|c: char| c.is_whitespace() || c.is_control()) {
        if word.is_empty() {
            continue;
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    bounded(&line)
}

fn bounded(text: &str) -> String {
    truncated(text, TEXT_MAX)
}

/// How the host words a verification that was made and did not hold, or could not be made
/// (policy-fetcher `verify/mod.rs` and `verify/errors.rs`, policy-evaluator
/// `sigstore_verification.rs`, sigstore-rs 0.13 `cosign/client.rs`, all at v1.35.0):
///
/// - `no signatures found for image: IMAGE ` (no `sha256-<hex>.sig` tag beside the image),
///   `Image verification failed: ...` (signatures there, none satisfies the rule; the lines
///   after it list the rule), `verification failed: ...` (a certificate's), and
///   `failed to get image trusted layers: No Signature Layer passed verification` (signature
///   layers that name another digest) are [`LookupError::Unverified`], in the first line;
/// - `failed to get image trusted layers: Cannot fetch manifest of IMAGE: E`, the image's own
///   lookup, is read as a lookup's text E is: absent when the registry says so;
/// - anything else is a lookup error.
pub fn read_verification_error(text: &str, image: &str) -> LookupError {
    let stripped = strip_prefixes(text);
    if denied_capability(stripped).is_some() {
        return read_host_error(text, image);
    }
    let first = Chain::read(stripped)
        .head
        .lines()
        .next()
        .unwrap_or_default()
        .trim_end();
    const UNVERIFIED: [&str; 3] = [
        "no signatures found for image",
        "Image verification failed",
        "verification failed: ",
    ];
    if UNVERIFIED.iter().any(|start| first.starts_with(start)) {
        return LookupError::Unverified(bounded(first));
    }
    if let Some(rest) = first.strip_prefix("failed to get image trusted layers: ") {
        if rest.starts_with("No Signature Layer passed verification") {
            return LookupError::Unverified(format!(
                "{}: no signature there names the image's digest",
                bounded(rest)
            ));
        }
        if let Some(fetch) = rest.strip_prefix("Cannot fetch manifest of ")
            && let Some((_, said)) = fetch.split_once(": ")
        {
            return read_host_error(said, image);
        }
        return LookupError::Failed(bounded(first));
    }
    read_host_error(text, image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const ABSENT_FULL: &str = "Callback evaluation failure: Fail to interact with OCI registry: Registry error: url http://127.0.0.1:5102/v2/up/library/nope/manifests/1.0, envelope: OCI API errors: [OCI API error: manifest unknown]\n\nCaused by:\n    Registry error: url http://127.0.0.1:5102/v2/up/library/nope/manifests/1.0, envelope: OCI API errors: [OCI API error: manifest unknown]";
    const REFUSED_FULL: &str = "Callback evaluation failure: Fail to interact with OCI registry: error sending request for url (http://127.0.0.1:5102/v2/up/library/nope/manifests/1.0)\n\nCaused by:\n    0: error sending request for url (http://127.0.0.1:5102/v2/up/library/nope/manifests/1.0)\n    1: client error (Connect)\n    2: tcp connect error\n    3: Connection refused (os error 111)";
    const BACKTRACE: &str = "\n\nStack backtrace:\n   0: anyhow::error::<impl anyhow::Error>::msg\n   1: policy_evaluator::callback_handler::oci::get_oci_digest_cached::{{closure}}\n   2: tokio::runtime::task::core::Core<T,S>::poll\n   3: std::panicking::try";

    /// The recorded texts of kwctl 1.31 (KUBEWARDEN.md), with and without a backtrace, each
    /// to one line that names what the registry said, once.
    #[rstest]
    #[case::absent(ABSENT_FULL, true, "registry: manifest unknown")]
    #[case::absent_with_backtrace(&format!("{ABSENT_FULL}{BACKTRACE}"), true, "registry: manifest unknown")]
    // kwctl records and replays only the first line; under RUST_BACKTRACE=1 the backtrace then
    // follows it directly (seen with kwctl 1.35 replaying a session it recorded).
    #[case::first_line_only_with_backtrace(
        &format!("{}{BACKTRACE}", ABSENT_FULL.split("\n\n").next().unwrap_or_default()),
        true,
        "registry: manifest unknown"
    )]
    #[case::refused(
        REFUSED_FULL,
        false,
        "error sending request for url (http://127.0.0.1:5102/v2/up/library/nope/manifests/1.0): Connection refused (os error 111)"
    )]
    #[case::refused_with_backtrace(
        &format!("{REFUSED_FULL}{BACKTRACE}"),
        false,
        "error sending request for url (http://127.0.0.1:5102/v2/up/library/nope/manifests/1.0): Connection refused (os error 111)"
    )]
    #[case::first_line_only(
        "Fail to interact with OCI registry: error sending request for url (https://index.docker.io/v2/library/busybox/manifests/latest)",
        false,
        "error sending request for url (https://index.docker.io/v2/library/busybox/manifests/latest)"
    )]
    #[case::guest_library_prefix(
        "Host error: Callback evaluation failure: Fail to interact with OCI registry: Registry error: url https://m.io/v2/x/manifests/1, envelope: OCI API errors: [OCI API error: manifest unknown]",
        true,
        "registry: manifest unknown"
    )]
    #[case::an_absent_wording_among_other_errors_is_not_absent(
        "Fail to interact with OCI registry: Registry error: url https://m.io/v2/x/manifests/1, envelope: OCI API errors: [OCI API error: authentication required\nOCI API error: manifest unknown]",
        false,
        "registry m.io refused policy-server's credentials for it, or policy-server has none (registry: authentication required; manifest unknown): lookups use the docker config in the PolicyServer's imagePullSecret, read at every lookup; renew the credentials for m.io there (ECR tokens expire after 12 hours)"
    )]
    #[case::two_absent_wordings(
        "Fail to interact with OCI registry: Registry error: url https://m.io/v2/x/manifests/1, envelope: OCI API errors: [OCI API error: manifest unknown\nOCI API error: repository name not known to registry]",
        true,
        "registry: manifest unknown; repository name not known to registry"
    )]
    #[case::server_error_404(
        "Fail to interact with OCI registry: Server error: url https://m.io/v2/x/manifests/1, code: 404, message: \n\nCaused by:\n    Server error: url https://m.io/v2/x/manifests/1, code: 404, message: ",
        true,
        "HTTP 404 from https://m.io/v2/x/manifests/1"
    )]
    #[case::server_error_500(
        "Fail to interact with OCI registry: Server error: url https://m.io/v2/x/manifests/1, code: 500, message: upstream\ttimed out\n",
        false,
        "HTTP 500 from https://m.io/v2/x/manifests/1: upstream timed out"
    )]
    #[case::a_404_from_the_token_server_is_no_answer_about_the_image(
        "Fail to interact with OCI registry: Server error: url https://auth.m.io/token?scope=x, code: 404, message: ",
        false,
        "HTTP 404 from https://auth.m.io/token?scope=x"
    )]
    #[case::a_capability_policy_server_1_35_did_not_grant(
        "Policy has not been granted access to the 'oci/v1/manifest_digest' host capability.",
        false,
        "policy-server did not grant this policy the host capability \"oci/v1/manifest_digest\": grant it in PolicyServer spec.namespacedPoliciesCapabilities (a namespaced AdmissionPolicy), or in the policy's hostCapabilities in policies.yml (a policy-server run by hand); cluster-wide policies are granted every capability"
    )]
    #[case::a_capability_refusal_in_the_hosts_wrapping(
        &format!("Callback evaluation failure: Policy has not been granted access to the 'oci/v1/oci_manifest' host capability.{BACKTRACE}"),
        false,
        "policy-server did not grant this policy the host capability \"oci/v1/oci_manifest\": grant it in PolicyServer spec.namespacedPoliciesCapabilities (a namespaced AdmissionPolicy), or in the policy's hostCapabilities in policies.yml (a policy-server run by hand); cluster-wide policies are granted every capability"
    )]
    fn host_texts_become_one_readable_line(
        #[case] text: &str,
        #[case] absent: bool,
        #[case] line: &str,
    ) {
        let read = read_host_error(text, "m.io/x:1");
        match (&read, absent) {
            (LookupError::Absent(got), true) | (LookupError::Failed(got), false) => {
                assert_eq!(got, line);
                assert!(!got.contains('\n') && !got.contains("backtrace"));
            }
            _ => panic!("{read:?}: expected absent = {absent}"),
        }
    }

    /// Refused credentials, in the host's words for a 401 (recorded from policy-server 1.31
    /// against a registry with basic auth), a token server's refusal, and each registry's words
    /// in a 403: one line that names the registry and where policy-server's credentials come
    /// from. Docker Hub's 401 is also its answer for a missing repository: it says so instead.
    #[rstest]
    #[case::not_authorized(
        "Callback evaluation failure: Fail to interact with OCI registry: Not authorized: url https://m.io:5443/v2/up/library/app/manifests/t2\n\nCaused by:\n    Not authorized: url https://m.io:5443/v2/up/library/app/manifests/t2",
        "m.io:5443/up/library/app:t2",
        "registry m.io:5443 refused policy-server's credentials for it, or policy-server has none (Not authorized: url https://m.io:5443/v2/up/library/app/manifests/t2): lookups use the docker config in the PolicyServer's imagePullSecret, read at every lookup; renew the credentials for m.io:5443 there (ECR tokens expire after 12 hours)"
    )]
    #[case::not_authorized_with_backtrace(
        &format!("Fail to interact with OCI registry: Not authorized: url https://m.io/v2/x/manifests/1\n\nCaused by:\n    Not authorized: url https://m.io/v2/x/manifests/1{BACKTRACE}"),
        "m.io/x:1",
        "registry m.io refused policy-server's credentials for it, or policy-server has none (Not authorized: url https://m.io/v2/x/manifests/1): lookups use the docker config in the PolicyServer's imagePullSecret, read at every lookup; renew the credentials for m.io there (ECR tokens expire after 12 hours)"
    )]
    #[case::token_server(
        "Fail to interact with OCI registry: Authentication failure: {\"details\":\"incorrect username or password\"}\n",
        "harbor.example.com/quay/app:1",
        "registry harbor.example.com refused policy-server's credentials for it, or policy-server has none (Authentication failure: {\"details\":\"incorrect username or password\"}): lookups use the docker config in the PolicyServer's imagePullSecret, read at every lookup; renew the credentials for harbor.example.com there (ECR tokens expire after 12 hours)"
    )]
    #[case::ecr_token_expired(
        "Fail to interact with OCI registry: Registry error: url https://123456789012.dkr.ecr.eu-west-1.amazonaws.com/v2/cache/app/manifests/1, envelope: OCI API errors: [OCI API error: Your authorization token has expired. Reauthenticate and try again.]",
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com/cache/app:1",
        "registry 123456789012.dkr.ecr.eu-west-1.amazonaws.com refused policy-server's credentials for it, or policy-server has none (registry: Your authorization token has expired. Reauthenticate and try again.): lookups use the docker config in the PolicyServer's imagePullSecret, read at every lookup; renew the credentials for 123456789012.dkr.ecr.eu-west-1.amazonaws.com there (ECR tokens expire after 12 hours)"
    )]
    #[case::docker_hub_401(
        "Fail to interact with OCI registry: Not authorized: url https://index.docker.io/v2/myorg/nope/manifests/1.0\n\nCaused by:\n    Not authorized: url https://index.docker.io/v2/myorg/nope/manifests/1.0",
        "docker.io/myorg/nope:1.0",
        "Docker Hub refused it (Not authorized: url https://index.docker.io/v2/myorg/nope/manifests/1.0): Hub answers so for a repository that does not exist or is private as well as for refused credentials, so check the image name before policy-server's credentials for docker.io"
    )]
    fn refused_credentials_name_the_registry_and_the_secret(
        #[case] text: &str,
        #[case] image: &str,
        #[case] line: &str,
    ) {
        assert_eq!(
            read_host_error(text, image),
            LookupError::Failed(line.to_string())
        );
    }

    /// Every registry's wording for refused credentials or denied access, and wordings that
    /// only look alike.
    #[rstest]
    #[case::distribution_unauthorized("authentication required", true)]
    #[case::distribution_denied("requested access to the resource is denied", true)]
    #[case::acr(
        "authentication required, visit https://aka.ms/acr/authorization for more information.",
        true
    )]
    #[case::harbor(
        "unauthorized to access repository: library/nginx, action: pull: unauthorized to access repository: library/nginx, action: pull",
        true
    )]
    #[case::quay("access to the requested resource is not authorized", true)]
    #[case::ecr_expired(
        "Your authorization token has expired. Reauthenticate and try again.",
        true
    )]
    #[case::ecr_iam(
        "User: arn:aws:sts::123456789012:assumed-role/node/i-0 is not authorized to perform: ecr:BatchGetImage on resource: arn:aws:ecr:eu-west-1:123456789012:repository/cache/app",
        true
    )]
    #[case::artifact_registry(
        "Permission \"artifactregistry.repositories.downloadArtifacts\" denied on resource \"projects/p/locations/europe/repositories/r\" (or it may not exist)",
        true
    )]
    #[case::absent("manifest unknown", false)]
    #[case::rate_limited("toomanyrequests: You have reached your pull rate limit.", false)]
    #[case::unavailable("service unavailable", false)]
    fn refusal_wordings_are_read_from_the_envelope(#[case] message: &str, #[case] refused: bool) {
        let error = format!(
            "Registry error: url https://m.io/v2/x/manifests/1, envelope: OCI API errors: [OCI API error: {message}]"
        );
        let first_line = format!("Fail to interact with OCI registry: {error}");
        let texts = [vec![first_line.clone()], shapes(&[&first_line, &error])].concat();
        let first = read_host_error(&first_line, "m.io/x:1");
        for text in &texts {
            let read = read_host_error(text, "m.io/x:1");
            let blames_credentials =
                matches!(&read, LookupError::Failed(line) if line.contains("imagePullSecret"));
            assert_eq!(blames_credentials, refused, "{text:?}: {read:?}");
            assert_eq!(read, first, "{text:?}");
        }
    }

    /// Every registry's wording for a missing manifest or repository, and wordings that only
    /// look alike.
    #[rstest]
    #[case::distribution_manifest("manifest unknown", true)]
    #[case::distribution_name("repository name not known to registry", true)]
    #[case::quay_tag_expired("Tag has expired", true)]
    #[case::harbor_artifact("artifact library/nginx:1.27 not found", true)]
    #[case::harbor_repository("repository library/nope not found", true)]
    #[case::acr_tag("manifest tagged by \"1.27\" is not found", true)]
    #[case::acr_digest(
        "manifest sha256:3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf3a25d2cf is not found",
        true
    )]
    #[case::acr_repository("repository \"library/nope\" is not found", true)]
    #[case::artifactory("The named manifest is not known to the registry.", true)]
    #[case::ecr_image("Requested image not found", true)]
    #[case::ecr_repository(
        "The repository with name 'team/app' does not exist in the registry with id '123456789012'",
        true
    )]
    #[case::distribution_wrong_accept(
        "OCI index found, but accept header does not support OCI indexes",
        false
    )]
    #[case::unauthorized("authentication required", false)]
    #[case::denied("requested access to the resource is denied", false)]
    #[case::rate_limited("toomanyrequests: You have reached your pull rate limit.", false)]
    #[case::gar_failed_to_fetch("Failed to fetch \"1.27\"", true)]
    #[case::gar_failed_to_fetch_from_request(
        "Failed to fetch \"latest\" from request \"/v2/p/r/app/manifests/latest\".",
        true
    )]
    #[case::gar_repository("Repository \"p/r/nope\" not found", true)]
    #[case::gar_remote_upstream(
        "Received invalid response from external repository; url=https://registry-1.docker.io/v2/library/nope/manifests/1",
        false
    )]
    #[case::gar_quota("Resource has been exhausted (e.g. check quota).", false)]
    #[case::failed_to_fetch_a_token("failed to fetch oauth token: unexpected status", false)]
    #[case::artifact_store_error("artifact storage unavailable", false)]
    fn registry_wordings_are_read_from_the_envelope(#[case] message: &str, #[case] absent: bool) {
        let error = format!(
            "Registry error: url https://m.io/v2/x/manifests/1, envelope: OCI API errors: [OCI API error: {message}]"
        );
        let first_line = format!("Fail to interact with OCI registry: {error}");
        let texts = [vec![first_line.clone()], shapes(&[&first_line, &error])].concat();
        let first = read_host_error(&first_line, "m.io/x:1");
        for text in &texts {
            let read = read_host_error(text, "m.io/x:1");
            assert_eq!(
                matches!(read, LookupError::Absent(_)),
                absent,
                "{text:?}: {read:?}"
            );
            assert_eq!(read, first, "{text:?}");
        }
    }

    /// A marker in the URL (a repository called `not_found`) never makes an outage "absent".
    #[rstest]
    #[case::transport(
        "Fail to interact with OCI registry: error sending request for url (https://m.io/v2/manifest-unknown/not_found/manifests/latest)\n\nCaused by:\n    0: error sending request for url (https://m.io/v2/manifest-unknown/not_found/manifests/latest)\n    1: operation timed out"
    )]
    #[case::denied_in_envelope(
        "Fail to interact with OCI registry: Registry error: url https://m.io/v2/image-not-found/manifests/1, envelope: OCI API errors: [OCI API error: requested access to the resource is denied]"
    )]
    fn words_in_the_url_are_never_read(#[case] text: &str) {
        assert!(
            matches!(read_host_error(text, "m.io/x:1"), LookupError::Failed(_)),
            "{text}"
        );
    }

    /// `chain` as policy-server up to 1.37 writes it: anyhow's debug form, the first error, a
    /// blank line and `Caused by:` (its one entry unnumbered, several numbered from 0).
    fn debug_shape(chain: &[&str]) -> String {
        let mut text = chain.first().copied().unwrap_or_default().to_string();
        match chain.get(1..).unwrap_or_default() {
            [] => {}
            [cause] => text.push_str(&format!("\n\nCaused by:\n    {cause}")),
            causes => {
                text.push_str("\n\nCaused by:");
                for (n, cause) in causes.iter().enumerate() {
                    text.push_str(&format!("\n    {n}: {cause}"));
                }
            }
        }
        text
    }

    /// `chain` as policy-server 1.38 writes it: `anyhow!("{e:#}")` (cache_return.rs), anyhow's
    /// alternate display, which writes each error of the chain after the one before and ": ".
    fn alternate_shape(chain: &[&str]) -> String {
        chain.join(": ")
    }

    /// Every whole text the host may send for `chain`: both shapes, each in the host's wrapping
    /// (`Callback evaluation failure: `), with and without a backtrace, and the waPC guest's
    /// `Host error: ` before it.
    fn shapes(chain: &[&str]) -> Vec<String> {
        let mut texts = Vec::new();
        for shape in [debug_shape(chain), alternate_shape(chain)] {
            texts.push(shape.clone());
            texts.push(format!("Callback evaluation failure: {shape}"));
            texts.push(format!("Callback evaluation failure: {shape}{BACKTRACE}"));
            texts.push(format!("Host error: Callback evaluation failure: {shape}"));
        }
        texts
    }

    fn described(read: LookupError) -> String {
        match read {
            LookupError::Unverified(why) => format!("unverified {why}"),
            LookupError::Absent(why) => format!("absent {why}"),
            LookupError::Failed(why) => format!("failed {why}"),
            LookupError::OverBudget(refusal) => format!("budget {refusal:?}"),
        }
    }

    /// The manifest URL of the tables' cases (a macro, for `concat!`).
    macro_rules! u {
        () => {
            "https://m.io/v2/hub/app/manifests/1"
        };
    }
    const CONNECTION_REFUSED: &str = "failed error sending request for url (https://m.io/v2/hub/app/manifests/1): Connection refused (os error 111)";
    const CREDENTIALS: &str = "failed registry m.io refused policy-server's credentials for it, or policy-server has none (Not authorized: url https://m.io/v2/hub/app/manifests/1): lookups use the docker config in the PolicyServer's imagePullSecret, read at every lookup; renew the credentials for m.io there (ECR tokens expire after 12 hours)";

    /// Every host text the policy classifies, as the chain of errors the host holds, read in
    /// both shapes (up to 1.37 multi-line, from 1.38 on one line), each wrapped and with a
    /// backtrace: one reading, which is what the warnings and audit annotations say.
    #[rstest]
    #[case::absent_distribution(
        &[concat!("Fail to interact with OCI registry: Registry error: url ", u!(), ", envelope: OCI API errors: [OCI API error: manifest unknown]"),
          concat!("Registry error: url ", u!(), ", envelope: OCI API errors: [OCI API error: manifest unknown]")],
        "absent registry: manifest unknown"
    )]
    #[case::absent_two_wordings(
        &[concat!("Fail to interact with OCI registry: Registry error: url ", u!(), ", envelope: OCI API errors: [OCI API error: manifest unknown\nOCI API error: repository name not known to registry]"),
          concat!("Registry error: url ", u!(), ", envelope: OCI API errors: [OCI API error: manifest unknown\nOCI API error: repository name not known to registry]")],
        "absent registry: manifest unknown; repository name not known to registry"
    )]
    #[case::absent_ecr_repository(
        &[concat!("Fail to interact with OCI registry: Registry error: url ", u!(), ", envelope: OCI API errors: [OCI API error: The repository with name 'hub/app' does not exist in the registry with id '123456789012']"),
          concat!("Registry error: url ", u!(), ", envelope: OCI API errors: [OCI API error: The repository with name 'hub/app' does not exist in the registry with id '123456789012']")],
        "absent registry: The repository with name 'hub/app' does not exist in the registry with id '123456789012'"
    )]
    #[case::absent_http_404(
        &[concat!("Fail to interact with OCI registry: Server error: url ", u!(), ", code: 404, message: "),
          concat!("Server error: url ", u!(), ", code: 404, message: ")],
        "absent HTTP 404 from https://m.io/v2/hub/app/manifests/1"
    )]
    #[case::http_500(
        &[concat!("Fail to interact with OCI registry: Server error: url ", u!(), ", code: 500, message: upstream timed out"),
          concat!("Server error: url ", u!(), ", code: 500, message: upstream timed out")],
        "failed HTTP 500 from https://m.io/v2/hub/app/manifests/1: upstream timed out"
    )]
    #[case::token_server_404(
        &["Fail to interact with OCI registry: Server error: url https://auth.m.io/token?scope=x, code: 404, message: ",
          "Server error: url https://auth.m.io/token?scope=x, code: 404, message: "],
        "failed HTTP 404 from https://auth.m.io/token?scope=x"
    )]
    #[case::unrecognised_wording_is_a_lookup_error(
        &[concat!("Fail to interact with OCI registry: Registry error: url ", u!(), ", envelope: OCI API errors: [OCI API error: artifact storage unavailable]"),
          concat!("Registry error: url ", u!(), ", envelope: OCI API errors: [OCI API error: artifact storage unavailable]")],
        "failed registry: artifact storage unavailable"
    )]
    #[case::not_authorized(
        &[concat!("Fail to interact with OCI registry: Not authorized: url ", u!(), ""), concat!("Not authorized: url ", u!(), "")],
        CREDENTIALS
    )]
    #[case::token_server_refusal(
        &["Fail to interact with OCI registry: Authentication failure: {\"details\":\"incorrect username or password\"}",
          "Authentication failure: {\"details\":\"incorrect username or password\"}"],
        "failed registry m.io refused policy-server's credentials for it, or policy-server has none (Authentication failure: {\"details\":\"incorrect username or password\"}): lookups use the docker config in the PolicyServer's imagePullSecret, read at every lookup; renew the credentials for m.io there (ECR tokens expire after 12 hours)"
    )]
    #[case::refused_in_the_envelope(
        &[concat!("Fail to interact with OCI registry: Registry error: url ", u!(), ", envelope: OCI API errors: [OCI API error: Your authorization token has expired. Reauthenticate and try again.]"),
          concat!("Registry error: url ", u!(), ", envelope: OCI API errors: [OCI API error: Your authorization token has expired. Reauthenticate and try again.]")],
        "failed registry m.io refused policy-server's credentials for it, or policy-server has none (registry: Your authorization token has expired. Reauthenticate and try again.): lookups use the docker config in the PolicyServer's imagePullSecret, read at every lookup; renew the credentials for m.io there (ECR tokens expire after 12 hours)"
    )]
    #[case::connection_refused(
        &[concat!("Fail to interact with OCI registry: error sending request for url (", u!(), ")"), concat!("error sending request for url (", u!(), ")"),
          "client error (Connect)", "tcp connect error", "Connection refused (os error 111)"],
        CONNECTION_REFUSED
    )]
    #[case::hang_closed_without_answer(
        &[concat!("Fail to interact with OCI registry: error sending request for url (", u!(), ")"), concat!("error sending request for url (", u!(), ")"),
          "client error (SendRequest)", "connection closed before message completed"],
        "failed error sending request for url (https://m.io/v2/hub/app/manifests/1): connection closed before message completed"
    )]
    #[case::hang_timed_out(
        &[concat!("Fail to interact with OCI registry: error sending request for url (", u!(), ")"), concat!("error sending request for url (", u!(), ")"),
          "operation timed out"],
        "failed error sending request for url (https://m.io/v2/hub/app/manifests/1): operation timed out"
    )]
    #[case::dns_whose_root_cause_has_a_colon(
        &[concat!("Fail to interact with OCI registry: error sending request for url (", u!(), ")"), concat!("error sending request for url (", u!(), ")"),
          "client error (Connect)", "dns error", "failed to lookup address information: Name or service not known"],
        "failed error sending request for url (https://m.io/v2/hub/app/manifests/1): failed to lookup address information: Name or service not known"
    )]
    #[case::tls_whose_root_cause_has_a_colon(
        &[concat!("Fail to interact with OCI registry: error sending request for url (", u!(), ")"), concat!("error sending request for url (", u!(), ")"),
          "client error (Connect)", "invalid peer certificate: UnknownIssuer"],
        "failed error sending request for url (https://m.io/v2/hub/app/manifests/1): invalid peer certificate: UnknownIssuer"
    )]
    #[case::an_outer_error_that_does_not_repeat_its_cause(
        &["Fail to interact with OCI registry: operation timed out"],
        "failed operation timed out"
    )]
    fn host_texts_read_the_same_in_both_shapes(#[case] chain: &[&str], #[case] expected: &str) {
        for text in shapes(chain) {
            assert_eq!(
                described(read_host_error(&text, "m.io/hub/app:1")),
                expected,
                "{text:?}"
            );
        }
    }

    /// policy-server's refusal of a capability is one error with no cause (`host_capability_denied`
    /// in policy-evaluator `runtimes/callback.rs`: 1.35's text, and @5d3bf086's, which adds "The
    /// violation has been reported."), in both shapes and under the guest library's prefix.
    #[rstest]
    #[case::v1_35(
        "Policy has not been granted access to the 'oci/v1/manifest_digest' host capability."
    )]
    #[case::from_1_38(
        "Policy has not been granted access to the 'oci/v1/manifest_digest' host capability. The violation has been reported."
    )]
    fn a_denied_capability_reads_the_same_in_both_shapes(#[case] text: &str) {
        let expected = "failed policy-server did not grant this policy the host capability \"oci/v1/manifest_digest\": grant it in PolicyServer spec.namespacedPoliciesCapabilities (a namespaced AdmissionPolicy), or in the policy's hostCapabilities in policies.yml (a policy-server run by hand); cluster-wide policies are granted every capability";
        for text in [
            text.to_string(),
            format!("Host error: {text}"),
            format!("{text}{BACKTRACE}"),
        ] {
            assert_eq!(
                described(read_host_error(&text, "m.io/hub/app:1")),
                expected,
                "{text:?}"
            );
            assert_eq!(
                described(read_verification_error(&text, "m.io/hub/app:1")),
                expected,
                "{text:?}"
            );
        }
    }

    /// A verification's texts (the chains the rig's `oci/v2/verify` gives, from policy-fetcher
    /// and sigstore-rs at v1.35.0), in both shapes: the same reading.
    #[rstest]
    #[case::no_signature_tag(&["no signatures found for image: m.io/hub/app:1 "], "unverified no signatures found for image: m.io/hub/app:1")]
    #[case::signatures_satisfy_nothing(
        &["Image verification failed: missing signatures\nThe following constraints were not satisfied:\nkind: pubKey\nowner: null\nkey: |\n  -----BEGIN PUBLIC KEY-----\n  MFkw\n  -----END PUBLIC KEY-----\nannotations: null\n"],
        "unverified Image verification failed: missing signatures"
    )]
    #[case::certificate(&["verification failed: Several Signature Layers failed verification"], "unverified verification failed: Several Signature Layers failed verification")]
    #[case::signature_of_another_digest(
        &["failed to get image trusted layers: No Signature Layer passed verification", "No Signature Layer passed verification"],
        "unverified No Signature Layer passed verification: no signature there names the image's digest"
    )]
    #[case::image_absent(
        &[concat!("failed to get image trusted layers: Cannot fetch manifest of m.io/hub/app:1: Registry error: url ", u!(), ", envelope: OCI API errors: [OCI API error: manifest unknown]"),
          concat!("Cannot fetch manifest of m.io/hub/app:1: Registry error: url ", u!(), ", envelope: OCI API errors: [OCI API error: manifest unknown]")],
        "absent registry: manifest unknown"
    )]
    #[case::image_refused_credentials(
        &[concat!("failed to get image trusted layers: Cannot fetch manifest of m.io/hub/app:1: Not authorized: url ", u!(), ""),
          concat!("Cannot fetch manifest of m.io/hub/app:1: Not authorized: url ", u!(), "")],
        CREDENTIALS
    )]
    #[case::registry_down(
        &[concat!("failed to get image trusted layers: Cannot fetch manifest of m.io/hub/app:1: error sending request for url (", u!(), ")"),
          concat!("Cannot fetch manifest of m.io/hub/app:1: error sending request for url (", u!(), ")")],
        "failed error sending request for url (https://m.io/v2/hub/app/manifests/1)"
    )]
    fn verification_texts_read_the_same_in_both_shapes(
        #[case] chain: &[&str],
        #[case] expected: &str,
    ) {
        for text in shapes(chain) {
            assert_eq!(
                described(read_verification_error(&text, "m.io/hub/app:1")),
                expected,
                "{text:?}"
            );
        }
    }

    /// The one-line shape is read by its repetitions only: a text that repeats nothing is one
    /// error, and a long text is not searched.
    #[rstest]
    #[case::no_repetition(
        "Fail to interact with OCI registry: something: else entirely",
        "failed something: else entirely"
    )]
    #[case::many_segments(&format!("Fail to interact with OCI registry: {}", ["x"; 80].join(": ")), &format!("failed {}", truncated(&["x"; 80].join(": "), TEXT_MAX)))]
    fn one_line_texts_without_a_repeated_cause_are_one_error(
        #[case] text: &str,
        #[case] expected: &str,
    ) {
        assert_eq!(described(read_host_error(text, "m.io/hub/app:1")), expected);
    }

    #[test]
    fn long_texts_are_bounded() {
        let text = format!("something new: {}", "x".repeat(5_000));
        let LookupError::Failed(line) = read_host_error(&text, "m.io/x:1") else {
            panic!("not a failure");
        };
        assert!(line.chars().count() <= TEXT_MAX + 1, "{}", line.len());
    }

    /// The host's words for a verification, whole as policy-server 1.35 sends them (the
    /// `Image verification failed` text goes on with the rule in YAML).
    #[rstest]
    #[case::no_signature_tag(
        "Callback evaluation failure: no signatures found for image: m.io/hub/app:1 ",
        "unverified no signatures found for image: m.io/hub/app:1"
    )]
    #[case::signatures_satisfy_nothing(
        "Callback evaluation failure: Image verification failed: missing signatures\nThe following constraints were not satisfied:\nkind: pubKey\nowner: null\nkey: |\n  -----BEGIN PUBLIC KEY-----\n  MFkw\n  -----END PUBLIC KEY-----\nannotations: null\n",
        "unverified Image verification failed: missing signatures"
    )]
    #[case::certificate(
        "Callback evaluation failure: verification failed: Several Signature Layers failed verification",
        "unverified verification failed: Several Signature Layers failed verification"
    )]
    #[case::signature_of_another_digest(
        "Callback evaluation failure: failed to get image trusted layers: No Signature Layer passed verification\n\nCaused by:\n    No Signature Layer passed verification",
        "unverified No Signature Layer passed verification: no signature there names the image's digest"
    )]
    #[case::image_absent(
        "Callback evaluation failure: failed to get image trusted layers: Cannot fetch manifest of m.io/hub/app:1: Registry error: url https://m.io/v2/hub/app/manifests/1, envelope: OCI API errors: [OCI API error: manifest unknown]\n\nCaused by:\n    Cannot fetch manifest of m.io/hub/app:1: Registry error: url https://m.io/v2/hub/app/manifests/1, envelope: OCI API errors: [OCI API error: manifest unknown]",
        "absent registry: manifest unknown"
    )]
    #[case::registry_down(
        "Callback evaluation failure: failed to get image trusted layers: Cannot fetch manifest of m.io/hub/app:1: error sending request for url (https://m.io/v2/)",
        "failed error sending request for url (https://m.io/v2/)"
    )]
    fn verification_texts_are_read_for_what_they_say(#[case] text: &str, #[case] expected: &str) {
        let read = match read_verification_error(text, "m.io/hub/app:1") {
            LookupError::Unverified(why) => format!("unverified {why}"),
            LookupError::Absent(why) => format!("absent {why}"),
            LookupError::Failed(why) => format!("failed {why}"),
            LookupError::OverBudget(refusal) => format!("budget {refusal:?}"),
        };
        assert_eq!(read, expected);
    }
}
