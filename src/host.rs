//! [`Registry`] on Kubewarden's host capabilities: the OCI lookups and the signature
//! verifications, each failure read by [`errors`] from the host's text.

mod errors;
mod kubernetes;

use kubewarden_policy_sdk::Error;
use kubewarden_policy_sdk::host_capabilities::oci::{self, OciManifestResponse};
use kubewarden_policy_sdk::host_capabilities::verification::{
    self, KeylessInfo, KeylessPrefixInfo, VerificationResponse,
};

use crate::registry::{ImageManifest, IndexEntry, LookupError, Manifest, Registry};
use crate::signatures::Verification;

use errors::one_line;
pub use errors::{ABSENT_MESSAGES, REFUSED_MESSAGES, read_host_error, read_verification_error};
pub use kubernetes::KubewardenCluster;

/// The policy-server (or `kwctl`) that runs the module.
pub struct KubewardenHost;

impl Registry for KubewardenHost {
    fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
        match oci::get_manifest_digest(image) {
            Ok(answer) => Ok(answer.digest),
            Err(error) => Err(lookup_error(error, image)),
        }
    }

    fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError> {
        match oci::get_manifest(image) {
            Ok(OciManifestResponse::Image(manifest)) => Ok(Manifest::Image(ImageManifest {
                config_digest: manifest.config().digest().to_string(),
                layers: manifest
                    .layers()
                    .iter()
                    .map(|layer| layer.digest().to_string())
                    .collect(),
                artifact_type: manifest.artifact_type().as_ref().map(ToString::to_string),
            })),
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
                            os_version: platform.and_then(|p| p.os_version().clone()),
                            os_features: platform
                                .and_then(|p| p.os_features().clone())
                                .unwrap_or_default(),
                        }
                    })
                    .collect(),
            }),
            Err(error) => Err(lookup_error(error, image)),
        }
    }

    fn verify(
        &mut self,
        image: &str,
        verification: &Verification<'_>,
    ) -> Result<String, LookupError> {
        if let Verification::Unreadable { why } = verification {
            return Err(LookupError::Failed((*why).to_string()));
        }
        match verify_on_host(image, verification) {
            None => Err(LookupError::Failed("nothing to ask the host".to_string())),
            Some(Ok(answer)) if answer.is_trusted => Ok(answer.digest),
            Some(Ok(_)) => Err(LookupError::Unverified(
                "policy-server answered that it is not trusted".to_string(),
            )),
            Some(Err(Error::HostCall { source, .. })) => {
                Err(read_verification_error(&source.to_string(), image))
            }
            Some(Err(other)) => Err(lookup_error(other, image)),
        }
    }
}

/// Asks the host (`oci/v2/verify`) as verify-image-signatures asks it, one call per
/// verification; the SDK's helpers take owned lists, so the rule's are copied per call. None
/// for a rule that could not be read, which asks the host nothing.
fn verify_on_host(
    image: &str,
    verification: &Verification<'_>,
) -> Option<kubewarden_policy_sdk::error::Result<VerificationResponse>> {
    Some(match *verification {
        Verification::Unreadable { .. } => return None,
        Verification::PubKeys { keys, annotations } => {
            verification::verify_pub_keys_image(image, keys.to_vec(), annotations.cloned())
        }
        Verification::Keyless {
            identities,
            annotations,
        } => verification::verify_keyless_exact_match(
            image,
            identities
                .iter()
                .map(|(issuer, subject)| KeylessInfo {
                    issuer: issuer.clone(),
                    subject: subject.clone(),
                })
                .collect(),
            annotations.cloned(),
        ),
        Verification::KeylessPrefix {
            prefixes,
            annotations,
        } => verification::verify_keyless_prefix_match(
            image,
            prefixes
                .iter()
                .map(|(issuer, url_prefix)| KeylessPrefixInfo {
                    issuer: issuer.clone(),
                    url_prefix: url_prefix.clone(),
                })
                .collect(),
            annotations.cloned(),
        ),
        Verification::GithubActions {
            owner,
            repo,
            annotations,
        } => verification::verify_keyless_github_actions(
            image,
            owner.to_string(),
            repo.map(str::to_string),
            annotations.cloned(),
        ),
        Verification::Certificate {
            certificate,
            chain,
            require_rekor_bundle,
            annotations,
        } => verification::verify_certificate(
            image,
            certificate.to_string(),
            chain.map(<[String]>::to_vec),
            require_rekor_bundle,
            annotations.cloned(),
        ),
    })
}

/// A failed host call: the host's text, read for "absent"; any other SDK error (an answer
/// that does not deserialise) is a lookup error.
fn lookup_error(error: Error, image: &str) -> LookupError {
    match error {
        Error::HostCall { source, .. } => read_host_error(&source.to_string(), image),
        other => LookupError::Failed(format!(
            "policy-server's answer could not be read: {}",
            one_line(&other.to_string())
        )),
    }
}
