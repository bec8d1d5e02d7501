//! Cosign signatures, made and checked for real: a signer that pushes what `cosign sign --key`
//! pushes (a `sha256-<hex>.sig` tag beside the image, one simple-signing layer per signature,
//! its ECDSA P-256 signature in the layer's `dev.cosignproject.cosign/signature` annotation),
//! and the host's `oci/v2/verify` as policy-server 1.35 answers it, read from its source at
//! v1.35.0 (policy-evaluator `callback_handler/sigstore_verification.rs`, policy-fetcher
//! `verify/mod.rs` and `verify/errors.rs`) and sigstore-rs 0.13 (`cosign/client.rs`,
//! `cosign/signature_layers.rs`, `cosign/verification_constraint/`):
//!
//! 1. `triangulate`: the image's digest, by HEAD; a failure is `failed to get image trusted
//!    layers: Cannot fetch manifest of IMAGE: E` (E: oci-client's own words);
//! 2. the signature manifest, tag `sha256-<hex>.sig` in the image's repository; none is `no
//!    signatures found for image: IMAGE ` (with its trailing space);
//! 3. each simple-signing layer whose blob matches its digest and whose payload names the
//!    image's digest is a signature layer; none is `failed to get image trusted layers: No
//!    Signature Layer passed verification`;
//! 4. every key (`all_of`) must verify some layer's signature, with the rule's annotations in
//!    the payload's `optional`; otherwise `Image verification failed: missing signatures`,
//!    then the unsatisfied constraints in YAML. A certificate verifies with its public key:
//!    `verification failed: Several Signature Layers failed verification` when none does.
//!
//! Keyless rules need Fulcio and Rekor, which the rig does not run: their signatures are never
//! satisfied here, as on a host whose layers carry no Fulcio certificate.

use std::collections::BTreeMap;

use p256::ecdsa::signature::{Signer as _, Verifier as _};
use p256::ecdsa::{DerSignature, SigningKey, VerifyingKey};
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePublicKey, LineEnding};
use serde::Serialize;
use serde_json::{Value, json};

use super::images::OCI_MANIFEST;
use super::registry::{TestRegistry, sha256};

pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
pub const CERTIFICATE_ANNOTATION: &str = "dev.sigstore.cosign/certificate";

/// A cosign key pair, or a key with its self-signed certificate (`cosign sign --key
/// --certificate`).
pub struct Signer {
    key: SigningKey,
    /// PEM `PUBLIC KEY`: what a `pubKeys` rule lists.
    pub public_pem: String,
    /// PEM `CERTIFICATE` of the key, when made with one: what a `certificates` rule lists.
    pub certificate_pem: Option<String>,
    /// PEM `CERTIFICATE` of the CA that issued it: what `certificateChain` lists.
    pub chain_pem: Option<String>,
}

impl Signer {
    pub fn generate() -> Signer {
        Signer::of(
            SigningKey::random(&mut p256::elliptic_curve::rand_core::OsRng),
            None,
        )
    }

    fn of(key: SigningKey, certificate_pem: Option<String>) -> Signer {
        let public_pem = key
            .verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .expect("public key PEM");
        Signer {
            key,
            public_pem,
            certificate_pem,
            chain_pem: None,
        }
    }

    /// A key and its code-signing certificate for `email`, issued by a CA of its own (as
    /// verify-image-signatures' settings need: it checks each certificate against
    /// `certificateChain`, or the host's roots without one, when the policy is loaded): a
    /// subject alternative name, the key usage digitalSignature, and the extended key usage
    /// code signing (sigstore-rs `verify_key_usages` and `verify_has_san` require them).
    pub fn with_certificate(email: &str) -> Signer {
        Signer::with_certificate_usage(email, rcgen::KeyUsagePurpose::DigitalSignature)
    }

    /// A key and a bare self-signed certificate (no key usage, no extended key usage), which
    /// the host refuses to verify with.
    pub fn with_bare_certificate(email: &str) -> Signer {
        let certified =
            rcgen::generate_simple_self_signed(vec![email.to_string()]).expect("certificate");
        let key = SigningKey::from_pkcs8_der(&certified.key_pair.serialize_der())
            .expect("rcgen's key is P-256");
        Signer::of(key, Some(certified.cert.pem()))
    }

    pub fn with_certificate_usage(email: &str, usage: rcgen::KeyUsagePurpose) -> Signer {
        let ca_key = rcgen::KeyPair::generate().expect("CA key pair");
        let mut ca_params = rcgen::CertificateParams::default();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "image-swapper test CA");
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
        let key_pair = rcgen::KeyPair::generate().expect("key pair");
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = vec![rcgen::SanType::Rfc822Name(
            email.to_string().try_into().expect("an email address"),
        )];
        params.key_usages = vec![usage];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::CodeSigning];
        let certificate = params
            .signed_by(&key_pair, &ca, &ca_key)
            .expect("certificate");
        let key =
            SigningKey::from_pkcs8_der(&key_pair.serialize_der()).expect("rcgen's key is P-256");
        let mut signer = Signer::of(key, Some(certificate.pem()));
        signer.chain_pem = Some(ca.pem());
        signer
    }

    /// Signs `repository@digest` as cosign does, adding a layer to its `sha256-<hex>.sig` tag
    /// (cosign appends to an existing signature manifest), with `annotations` in the payload.
    pub fn sign(
        &self,
        registry: &TestRegistry,
        repository: &str,
        digest: &str,
        annotations: &[(&str, &str)],
    ) {
        let optional: BTreeMap<&str, &str> = annotations.iter().copied().collect();
        let payload = serde_json::to_vec(&json!({
            "critical": {
                "identity": {"docker-reference": format!("{}/{repository}", registry.host)},
                "image": {"docker-manifest-digest": digest},
                "type": "cosign container image signature"
            },
            "optional": if optional.is_empty() { Value::Null } else { json!(optional) },
        }))
        .expect("payload JSON");
        let signature: DerSignature = self.key.sign(&payload);
        let mut layer_annotations = json!({
            SIGNATURE_ANNOTATION: base64(signature.as_bytes()),
        });
        if let Some(certificate) = &self.certificate_pem {
            layer_annotations[CERTIFICATE_ANNOTATION] = json!(certificate);
        }
        let layer = json!({
            "mediaType": SIMPLE_SIGNING,
            "digest": registry.push_blob(repository, &payload).expect("push payload"),
            "size": payload.len(),
            "annotations": layer_annotations,
        });
        let tag = signature_tag(digest);
        let mut layers: Vec<Value> = existing_layers(registry, repository, &tag);
        layers.push(layer);
        let diff_ids: Vec<Value> = layers.iter().map(|l| l["digest"].clone()).collect();
        let config = serde_json::to_vec(&json!({
            "architecture": "", "os": "", "config": {},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .expect("config JSON");
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": registry.push_blob(repository, &config).expect("push config"),
                "size": config.len(),
            },
            "layers": layers,
        }))
        .expect("manifest JSON");
        registry
            .push_manifest(repository, &tag, OCI_MANIFEST, &manifest)
            .expect("push signature manifest");
    }
}

fn existing_layers(registry: &TestRegistry, repository: &str, tag: &str) -> Vec<Value> {
    let url = format!("http://{}/v2/{repository}/manifests/{tag}", registry.host);
    ureq::get(&url)
        .set("Accept", OCI_MANIFEST)
        .call()
        .ok()
        .and_then(|r| r.into_string().ok())
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .and_then(|m| m["layers"].as_array().cloned())
        .unwrap_or_default()
}

/// `sha256-<hex>.sig`: where cosign keeps the signatures of `digest`.
pub fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replacen(':', "-", 1))
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// One signature layer the host would trust: its payload bytes, its signature, its optional
/// annotations.
pub struct SignatureLayer {
    pub payload: Vec<u8>,
    pub signature: Vec<u8>,
    pub optional: BTreeMap<String, String>,
}

impl SignatureLayer {
    fn signed_by(&self, key: &VerifyingKey) -> bool {
        DerSignature::from_bytes(&self.signature)
            .map(|signature| key.verify(&self.payload, &signature).is_ok())
            .unwrap_or(false)
    }

    fn carries(&self, annotations: Option<&BTreeMap<String, String>>) -> bool {
        annotations.is_none_or(|wanted| {
            wanted
                .iter()
                .all(|(k, v)| self.optional.get(k).is_some_and(|have| have == v))
        })
    }

    /// Reads the layers of a signature manifest whose blobs `fetch` gives, as sigstore-rs
    /// `build_signature_layers` does: a layer that is not simple signing, whose blob does not
    /// match its digest, or whose payload names another digest is skipped.
    pub fn read_all(
        manifest: &Value,
        digest: &str,
        mut fetch: impl FnMut(&str) -> Option<Vec<u8>>,
    ) -> Vec<SignatureLayer> {
        let decode = |text: &str| {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.decode(text).ok()
        };
        manifest["layers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|layer| layer["mediaType"] == SIMPLE_SIGNING)
            .filter_map(|layer| {
                let blob_digest = layer["digest"].as_str()?;
                let payload = fetch(blob_digest)?;
                if sha256(&payload) != blob_digest {
                    return None;
                }
                let simple: Value = serde_json::from_slice(&payload).ok()?;
                if simple.pointer("/critical/image/docker-manifest-digest")? != digest {
                    return None;
                }
                let signature = decode(layer["annotations"][SIGNATURE_ANNOTATION].as_str()?)?;
                let optional = simple["optional"]
                    .as_object()
                    .map(|o| {
                        o.iter()
                            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                            .collect()
                    })
                    .unwrap_or_default();
                Some(SignatureLayer {
                    payload,
                    signature,
                    optional,
                })
            })
            .collect()
    }
}

/// policy-fetcher's `Signature`, serialised as its error lists unsatisfied constraints.
#[derive(Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
enum Constraint<'a> {
    PubKey {
        owner: Option<String>,
        key: &'a str,
        annotations: Option<&'a BTreeMap<String, String>>,
    },
}

/// Judges the trusted layers against one `v2/verify` request, as the host does: `Ok` when the
/// request is satisfied, else the host's text (without the callback prefix).
pub fn judge(request: &Value, layers: &[SignatureLayer]) -> Result<(), String> {
    let annotations: Option<BTreeMap<String, String>> =
        serde_json::from_value(request["annotations"].clone()).ok();
    match request["type"].as_str().unwrap_or_default() {
        "SigstorePubKeyVerify" => {
            let keys: Vec<String> =
                serde_json::from_value(request["pub_keys"].clone()).unwrap_or_default();
            if keys.is_empty() {
                return Err("Must provide at least one pub key".to_string());
            }
            let unsatisfied: Vec<&String> = keys
                .iter()
                .filter(|pem| {
                    let Ok(key) = VerifyingKey::from_public_key_pem(pem.trim()) else {
                        return true;
                    };
                    !layers
                        .iter()
                        .any(|l| l.signed_by(&key) && l.carries(annotations.as_ref()))
                })
                .collect();
            if unsatisfied.is_empty() {
                return Ok(());
            }
            let mut text = "Image verification failed: missing signatures\nThe following constraints were not satisfied:\n".to_string();
            for key in unsatisfied {
                let constraint = Constraint::PubKey {
                    owner: None,
                    key,
                    annotations: annotations.as_ref(),
                };
                text.push_str(&serde_yaml::to_string(&constraint).unwrap_or_default());
            }
            Err(text)
        }
        "SigstoreCertificateVerify" => {
            let pem: Vec<u8> =
                serde_json::from_value(request["certificate"].clone()).unwrap_or_default();
            // `CertificateVerifier::from_pem(..)?` in policy-evaluator: its words alone.
            let key = certificate_key(&pem)?;
            let chain: Vec<Vec<u8>> =
                serde_json::from_value(request["certificate_chain"].clone()).unwrap_or_default();
            if !chain.is_empty() && !issued_by_one_of(&pem, &chain) {
                // sigstore-rs `CertificatePool::verify_der_cert` (webpki): its exact words
                // were not confirmed here.
                return Err("Certificate pool error: UnknownIssuer".to_string());
            }
            // sigstore-rs `CertificateVerifier::verify` (`cosign/verification_constraint/
            // certificate_verifier.rs`): with `require_rekor_bundle`, a layer without a Rekor
            // bundle is ignored. The rig signs as `cosign sign --tlog-upload=false` does, so
            // its layers carry none: such a rule is never satisfied here, as on the host.
            let require_rekor_bundle = request["require_rekor_bundle"] == Value::Bool(true);
            let satisfied = !require_rekor_bundle
                && layers
                    .iter()
                    .any(|l| l.signed_by(&key) && l.carries(annotations.as_ref()));
            if satisfied {
                Ok(())
            } else {
                Err(
                    "verification failed: Several Signature Layers failed verification"
                        .to_string(),
                )
            }
        }
        // Keyless: no layer here carries a Fulcio certificate, so no constraint is met.
        _ => Err("Image verification failed: missing signatures\nThe following constraints were not satisfied:\n".to_string()),
    }
}

/// Whether the PEM certificate `pem` is signed (ECDSA P-256, SHA-256) by the key of one of the
/// PEM certificates of `chain`: the rig's stand-in for webpki's path building, enough for a
/// leaf issued by a CA.
fn issued_by_one_of(pem: &[u8], chain: &[Vec<u8>]) -> bool {
    use x509_cert::der::{DecodePem, Encode};
    let Ok(leaf) = x509_cert::Certificate::from_pem(pem) else {
        return false;
    };
    let (Ok(tbs), Some(signature)) = (leaf.tbs_certificate.to_der(), leaf.signature.as_bytes())
    else {
        return false;
    };
    let Ok(signature) = DerSignature::from_bytes(signature) else {
        return false;
    };
    chain.iter().any(|issuer| {
        x509_cert::Certificate::from_pem(issuer)
            .ok()
            .and_then(|issuer| issuer.tbs_certificate.subject_public_key_info.to_der().ok())
            .and_then(|spki| VerifyingKey::from_public_key_der(&spki).ok())
            .is_some_and(|key| key.verify(&tbs, &signature).is_ok())
    })
}

/// The P-256 public key of a PEM certificate, once it passes sigstore-rs 0.13's checks in
/// `CertificateVerifier::from_der` (`crypto/certificate.rs`), in their order and words: a key
/// usage extension, the extended key usage code signing, a subject alternative name, and not
/// before its validity. (Its check of the key usage bits is not modelled: real kwctl 1.35
/// accepted certificates with digitalSignature and with contentCommitment alike.)
fn certificate_key(pem: &[u8]) -> Result<VerifyingKey, String> {
    use x509_cert::der::{DecodePem, Encode};
    use x509_cert::ext::pkix::{ExtendedKeyUsage, KeyUsage, SubjectAltName};
    let certificate = x509_cert::Certificate::from_pem(pem).map_err(|e| e.to_string())?;
    let tbs = &certificate.tbs_certificate;
    if !matches!(tbs.get::<KeyUsage>(), Ok(Some(_))) {
        return Err("Bundled certificate does not have digital signature key usage".to_string());
    }
    let code_signing = x509_cert::der::oid::ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.3");
    match tbs.get::<ExtendedKeyUsage>() {
        Ok(Some((_, usages))) if usages.0.contains(&code_signing) => {}
        _ => {
            return Err(
                "Bundled certificate does not have code signing extended key usage".to_string(),
            );
        }
    }
    if !matches!(tbs.get::<SubjectAltName>(), Ok(Some(_))) {
        return Err("Certificate without Subject Alternative Name".to_string());
    }
    if std::time::SystemTime::now() < tbs.validity.not_before.to_system_time() {
        return Err(format!(
            "Certificate validity check failed: cannot be used before {}",
            tbs.validity.not_before
        ));
    }
    let spki = tbs
        .subject_public_key_info
        .to_der()
        .map_err(|e| e.to_string())?;
    VerifyingKey::from_public_key_der(&spki).map_err(|e| e.to_string())
}
