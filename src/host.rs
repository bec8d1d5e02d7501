//! [`Registry`] on Kubewarden's OCI host capabilities, and the reading of the host's errors.
//!
//! The host reports every failure as text, so only the text tells "the registry says there is no
//! such image" from "the registry could not be asked". An image is taken as absent only when the
//! text carries one of [`ABSENT_MARKERS`]; anything else (timeouts, refused connections, 401,
//! 429, 5xx, texts no registry was seen to give) is a lookup error, handled by `onLookupError`.

use kubewarden_policy_sdk::Error;
use kubewarden_policy_sdk::host_capabilities::oci::{self, OciManifestResponse};

use crate::decide::{IndexEntry, LookupError, Manifest, Registry};

/// How registries and the host word "no such manifest or repository" (matched case-insensitively).
pub const ABSENT_MARKERS: &[&str] = &[
    // distribution, Harbor, Quay, Artifactory: MANIFEST_UNKNOWN and NAME_UNKNOWN, as the host's
    // OCI client prints them ("OCI API error: manifest unknown").
    "manifest unknown",
    "manifest_unknown",
    "repository name not known to registry",
    "name_unknown",
    // Harbor's and Artifact Registry's NOT_FOUND.
    "not_found",
    "requested entity was not found",
    // Amazon ECR.
    "requested image not found",
    "does not exist in the registry",
    // The host's OCI client, for a 404 without an error body.
    "image manifest not found",
    "code: 404",
    "image not found",
];

/// Reads a host error text.
pub fn classify(text: &str) -> LookupError {
    let lower = text.to_ascii_lowercase();
    if ABSENT_MARKERS.iter().any(|marker| lower.contains(marker)) {
        LookupError::Absent(text.to_string())
    } else {
        LookupError::Failed(text.to_string())
    }
}

/// The policy-server (or `kwctl`) that runs the module.
pub struct KubewardenHost;

impl Registry for KubewardenHost {
    fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
        match oci::get_manifest_digest(image) {
            Ok(answer) => Ok(answer.digest),
            Err(error) => Err(lookup_error(error)),
        }
    }

    fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError> {
        match oci::get_manifest(image) {
            Ok(OciManifestResponse::Image(manifest)) => Ok(Manifest::Image {
                config_digest: manifest.config().digest().to_string(),
            }),
            Ok(OciManifestResponse::ImageIndex(index)) => Ok(Manifest::Index {
                entries: index
                    .manifests()
                    .iter()
                    .map(|descriptor| {
                        let platform = descriptor.platform().as_ref();
                        IndexEntry {
                            digest: descriptor.digest().to_string(),
                            os: platform.map(|p| p.os().to_string()).unwrap_or_default(),
                            architecture: platform
                                .map(|p| p.architecture().to_string())
                                .unwrap_or_default(),
                            variant: platform.and_then(|p| p.variant().clone()),
                        }
                    })
                    .collect(),
            }),
            Err(error) => Err(lookup_error(error)),
        }
    }
}

/// A failed host call: the host's text, read for "absent"; any other SDK error (an answer
/// that does not deserialise) is a lookup error.
fn lookup_error(error: Error) -> LookupError {
    match error {
        Error::HostCall { source, .. } => classify(&host_message(&source.to_string())),
        other => LookupError::Failed(other.to_string()),
    }
}

/// The waPC guest library and the host wrap the registry's text in "Host error: " and
/// "Callback evaluation failure: "; the operator needs only the registry's words.
fn host_message(text: &str) -> String {
    let text = text.strip_prefix("Host error: ").unwrap_or(text);
    text.strip_prefix("Callback evaluation failure: ")
        .unwrap_or(text)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::distribution_manifest_unknown(
        "Fail to interact with OCI registry: Registry error: url http://127.0.0.1:5101/v2/library/nope/manifests/1.0, envelope: OCI API errors: [OCI API error: manifest unknown]",
        true
    )]
    #[case::distribution_name_unknown(
        "Callback evaluation failure: Fail to interact with OCI registry: Registry error: url http://127.0.0.1:5101/v2/x/manifests/1, envelope: OCI API errors: [OCI API error: repository name not known to registry]",
        true
    )]
    #[case::recorded_replay_error("Failed to retrieve OCI manifest digest: image not found", true)]
    #[case::ecr("Requested image not found", true)]
    #[case::ecr_repository(
        "The repository with name 'x' does not exist in the registry with id '1234'",
        true
    )]
    #[case::harbor_code("NOT_FOUND: artifact x:1 not found", true)]
    #[case::bare_404(
        "Server error: url https://m.io/v2/x/manifests/1, code: 404, message: ",
        true
    )]
    #[case::unreachable(
        "Fail to interact with OCI registry: error sending request for url (https://index.docker.io/v2/library/busybox/manifests/latest)",
        false
    )]
    #[case::unauthorized(
        "Fail to interact with OCI registry: Registry error: url https://m.io/v2/x/manifests/1, envelope: OCI API errors: [OCI API error: authentication required]",
        false
    )]
    #[case::rate_limited(
        "Server error: url https://m.io/v2/x/manifests/1, code: 429, message: toomanyrequests",
        false
    )]
    #[case::server_error(
        "Server error: url https://m.io/v2/x/manifests/1, code: 500, message: ",
        false
    )]
    #[case::dns(
        "dns error: failed to lookup address information: Name or service not known",
        false
    )]
    #[case::timeout("operation timed out", false)]
    #[case::unrecognised("something new", false)]
    fn only_explicit_unknowns_are_absent(#[case] text: &str, #[case] absent: bool) {
        assert_eq!(matches!(classify(text), LookupError::Absent(_)), absent);
    }

    #[test]
    fn the_guest_library_prefix_is_dropped() {
        assert_eq!(
            host_message("Host error: Callback evaluation failure: manifest unknown"),
            "manifest unknown"
        );
    }
}
