//! Signature verification beside a verifier, with real parts: images signed as `cosign sign
//! --key` signs them (and with a certificate), pushed with their `sha256-<hex>.sig` tags to real
//! registries on loopback; the built module verifying mirror copies through the rig's
//! `oci/v2/verify` (which checks the signatures for real, as the host does); and a verifier
//! that does what Kubewarden's verify-image-signatures 1.0.11 does (each rule a glob on the
//! image as the Pod writes it, every matching rule verified through the same host, the image
//! pinned to the verified digest), chained with the swapper as the API server chains mutating
//! webhooks: in the order of their configurations' names, each fed the other's answer.

mod rig;

use rig::cosign::{Signer, signature_tag};
use rig::hosts::LiveHost;
use rig::images::Image;
use rig::registry::TestRegistry;
use rig::tools::RealTools;
use rig::wapc::SharedHost;
use rig::{pod_request, shared, validate};
use serde_json::{Value, json};
use wildmatch::WildMatch;

/// The source, its mirror, and one signer; `org/app:signed` is signed, `org/app:unsigned` is
/// not; the mirror holds copies of both (same digests) without signatures.
struct World {
    source: TestRegistry,
    mirror: TestRegistry,
    signer: Signer,
    signed: String,
    unsigned: String,
}

const REPOSITORY: &str = "org/app";

impl World {
    fn start(name: &str, signer: Signer) -> World {
        let source = TestRegistry::start(&format!("{name}-source")).expect("registry");
        let mirror = TestRegistry::start(&format!("{name}-mirror")).expect("registry");
        let signed_image = Image::new(&format!("{name} signed"), "linux/amd64");
        let unsigned_image = Image::new(&format!("{name} unsigned"), "linux/amd64");
        let signed = signed_image.push(&source, REPOSITORY, Some("signed"));
        let unsigned = unsigned_image.push(&source, REPOSITORY, Some("unsigned"));
        signer.sign(&source, REPOSITORY, &signed, &[]);
        let mirrored = format!("cache/{REPOSITORY}");
        signed_image.push(&mirror, &mirrored, Some("signed"));
        unsigned_image.push(&mirror, &mirrored, Some("unsigned"));
        World {
            source,
            mirror,
            signer,
            signed,
            unsigned,
        }
    }

    fn image(&self, tag: &str) -> String {
        format!("{}/{REPOSITORY}:{tag}", self.source.host)
    }

    fn mirror_image(&self, tag: &str, digest: &str) -> String {
        format!("{}/cache/{REPOSITORY}:{tag}@{digest}", self.mirror.host)
    }

    /// A `sources.yaml` (`NAME-sources.yml` in the temporary folder) that lets kwctl reach
    /// the world's two loopback registries over plain HTTP.
    fn insecure_sources(&self, name: &str) -> std::path::PathBuf {
        let sources = std::env::temp_dir().join(format!("{name}-sources.yml"));
        std::fs::write(
            &sources,
            format!(
                "insecure_sources: [\"{}\", \"{}\"]\n",
                self.source.host, self.mirror.host
            ),
        )
        .expect("sources");
        sources
    }

    /// The copy that brings the signed image's signature to the mirror (what the fill job
    /// runs for the check role's finding).
    fn copy_signature(&self) {
        self.copy_tag(&signature_tag(&self.signed));
    }

    /// `skopeo copy` of one tag of the source's repository to the mirror's.
    fn copy_tag(&self, tag: &str) {
        let status = std::process::Command::new("skopeo")
            .args([
                "copy",
                "--all",
                "--preserve-digests",
                "--src-tls-verify=false",
                "--dest-tls-verify=false",
                &format!("docker://{}/{REPOSITORY}:{tag}", self.source.host),
                &format!("docker://{}/cache/{REPOSITORY}:{tag}", self.mirror.host),
            ])
            .status()
            .expect("skopeo");
        assert!(status.success(), "skopeo copied {tag}");
    }

    /// The rule an operator writes for the source's images, as verify-image-signatures reads it.
    fn rule(&self, image: &str) -> Value {
        match &self.signer.certificate_pem {
            Some(certificate) => {
                let mut rule = json!({"image": image, "certificates": [certificate], "requireRekorBundle": false});
                if let Some(chain) = &self.signer.chain_pem {
                    rule["certificateChain"] = json!([chain]);
                }
                rule
            }
            None => json!({"image": image, "pubKeys": [self.signer.public_pem]}),
        }
    }

    /// The same, verifying covered images at the mirror (`verifySource: false`): the copy's own
    /// signature, under the tag the mirror holds.
    fn swapper_settings_at_mirror(&self) -> Value {
        let mut settings = self.swapper_settings(true);
        settings["verifySource"] = json!(false);
        settings
    }

    /// The swapper's settings with `rules` as its `signatures`.
    fn settings_with(&self, rules: &[Value]) -> Value {
        let mut settings = self.swapper_settings(false);
        settings["signatures"] = json!(rules);
        settings
    }

    fn swapper_settings(&self, signatures: bool) -> Value {
        let mut settings = json!({"mirrors": [{"source": self.source.host, "target": format!("{}/cache", self.mirror.host)}]});
        if signatures {
            settings["signatures"] = json!([self.rule(&format!("{}/org/*", self.source.host))]);
        }
        settings
    }
}

/// What the API server ends with: the image stored, or the refusal.
type Admitted = Result<String, String>;

fn pod(image: &str) -> Value {
    pod_request(
        "CREATE",
        json!({"containers": [{"name": "web", "image": image}]}),
    )
}

fn image_of(object: &Value) -> String {
    object["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The swapper's webhook: the built module.
fn swapper(settings: &Value, object: &Value, host: SharedHost) -> Admitted {
    let mut request = pod("");
    request["object"] = object.clone();
    let response = validate(settings, &request, host);
    if !response.accepted {
        return Err(response.message.unwrap_or_default());
    }
    Ok(response
        .mutated
        .as_ref()
        .map_or_else(|| image_of(object), image_of))
}

/// verify-image-signatures 1.0.11's answer for a one-container Pod (its
/// `verify_container_images`, `handle_verification_response`, `add_digest_if_not_present`):
/// every rule whose pattern matches the image as written (by `wildmatch`, the verifier's own
/// matcher) is verified through the host, the first failure's text goes into `Resource web is
/// not accepted: verification of image X failed: E`, and a verified image is pinned to
/// `image@digest` unless it already names that digest.
fn verifier(rules: &[Value], image: &str, host: &SharedHost) -> Admitted {
    let mut pinned = image.to_string();
    let mut errors = Vec::new();
    for rule in rules {
        let pattern = rule["image"].as_str().unwrap_or_default();
        if !WildMatch::new(pattern).matches(image) {
            continue;
        }
        let requests: Vec<Value> = match rule.get("certificates") {
            Some(certificates) => certificates
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    // The SDK sends PEM texts as their bytes.
                    let chain: Option<Vec<&[u8]>> = rule["certificateChain"].as_array().map(|chain| {
                        chain.iter().filter_map(Value::as_str).map(str::as_bytes).collect()
                    });
                    json!({"type": "SigstoreCertificateVerify", "image": image, "certificate": c.as_str().unwrap_or_default().as_bytes(), "certificate_chain": chain, "require_rekor_bundle": false, "annotations": null})
                })
                .collect(),
            None => vec![json!({"type": "SigstorePubKeyVerify", "image": image, "pub_keys": rule["pubKeys"], "annotations": null})],
        };
        for request in requests {
            let answer = host.lock().expect("host").call(
                "kubewarden",
                "oci",
                "v2/verify",
                request.to_string().as_bytes(),
            );
            match answer {
                Ok(bytes) => {
                    let response: Value = serde_json::from_slice(&bytes).expect("JSON");
                    let digest = response["digest"].as_str().unwrap_or_default();
                    if !image.contains(digest) {
                        pinned = format!("{image}@{digest}");
                    }
                }
                Err(error) => {
                    // The SDK 0.17's `Error::HostCall`, around the waPC guest's text, as the real
                    // verifier words it.
                    errors.push(format!("verification of image {image} failed: error invoking host capability oci.verify: Host error: {}{error}", rig::wapc::CALLBACK_FAILURE));
                    break;
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(pinned)
    } else {
        Err(format!(
            "Resource web is not accepted: {}",
            errors.join(", ")
        ))
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Order {
    SwapperFirst,
    VerifierFirst,
}

/// The two webhooks chained as the API server chains them: each sees the Pod as the one before
/// it left it, and a refusal ends the admission.
fn admit(world: &World, order: Order, rules: &[Value], signatures: bool, image: &str) -> Admitted {
    admit_with(order, rules, &world.swapper_settings(signatures), image)
}

/// The same chain with the swapper's settings as given.
fn admit_with(order: Order, rules: &[Value], settings: &Value, image: &str) -> Admitted {
    let host = shared(LiveHost::default());
    match order {
        Order::SwapperFirst => {
            let swapped = swapper(settings, &pod(image)["object"], host.clone())?;
            verifier(rules, &swapped, &(host as SharedHost))
        }
        Order::VerifierFirst => {
            let pinned = verifier(rules, image, &(host.clone() as SharedHost))?;
            swapper(settings, &pod(&pinned)["object"], host)
        }
    }
}

/// Both orders, a verifier over the sources and one over every image: the unsigned image is
/// refused and the signed one admitted, 8 of 8 as without the swapper; the signed image is
/// swapped (at its verified digest) only once its signature is in the mirror.
fn eight_outcomes(world: &World) {
    let by_source = vec![world.rule(&format!("{}/org/*", world.source.host))];
    let everything = vec![world.rule("*")];
    let mut outcomes = Vec::new();
    for order in [Order::SwapperFirst, Order::VerifierFirst] {
        for (rules, named) in [(&by_source, "sources"), (&everything, "*")] {
            for (tag, signed) in [("unsigned", false), ("signed", true)] {
                let image = world.image(tag);
                let without = verifier(rules, &image, &(shared(LiveHost::default()) as SharedHost));
                // The swapper holds the rules of the verifier it sits beside.
                let with = admit_with(order, rules, &world.settings_with(rules), &image);
                assert_eq!(
                    without.is_ok(),
                    signed,
                    "without the swapper: {tag} {without:?}"
                );
                assert_eq!(
                    with.is_ok(),
                    without.is_ok(),
                    "{order:?}, verifier over {named}, {tag}: {with:?}"
                );
                if let Ok(stored) = &with {
                    assert!(
                        !stored.contains(&world.unsigned),
                        "the unsigned image was admitted: {stored}"
                    );
                }
                outcomes.push((order, named, tag, with));
            }
        }
    }
    assert_eq!(outcomes.iter().filter(|o| o.3.is_ok()).count(), 4);
}

fn signed_outcomes(world: &World) -> Vec<String> {
    let rules = vec![world.rule("*")];
    [Order::SwapperFirst, Order::VerifierFirst]
        .into_iter()
        .map(|order| {
            admit_with(
                order,
                &rules,
                &world.settings_with(&rules),
                &world.image("signed"),
            )
            .expect("signed admitted")
        })
        .collect()
}

fn signature_verification_in_both_orders(world: World) {
    // The signature is not in the mirror yet: admitted as without the swapper, at its source
    // (which the verifier pins, in either order), not swapped.
    eight_outcomes(&world);
    let pinned = format!("{}@{}", world.image("signed"), world.signed);
    assert_eq!(
        signed_outcomes(&world),
        vec![pinned.clone(), pinned],
        "kept at its source while the mirror lacks the signature"
    );
    // Once the signature is copied, the signed image is swapped at its verified digest, in
    // both orders, and every outcome is still the one without the swapper.
    world.copy_signature();
    eight_outcomes(&world);
    let swapped = world.mirror_image("signed", &world.signed);
    assert_eq!(signed_outcomes(&world), vec![swapped.clone(), swapped]);
}

#[test]
fn key_signed_images_are_verified_as_without_the_swapper_in_both_orders() {
    signature_verification_in_both_orders(World::start("sig-key", Signer::generate()));
}

#[test]
fn certificate_signed_images_are_verified_as_without_the_swapper_in_both_orders() {
    signature_verification_in_both_orders(World::start(
        "sig-cert",
        Signer::with_certificate("release@example.com"),
    ));
}

/// The risk this setting removes: without it, the swapper first and a verifier over the
/// sources, an unsigned image is swapped and never verified (KUBEWARDEN.md's measured table).
#[test]
fn without_signatures_an_unsigned_image_swapped_first_escapes_a_verifier_over_the_sources() {
    let world = World::start("sig-off", Signer::generate());
    let rules = vec![world.rule(&format!("{}/org/*", world.source.host))];
    let admitted = admit(
        &world,
        Order::SwapperFirst,
        &rules,
        false,
        &world.image("unsigned"),
    );
    assert_eq!(
        admitted,
        Ok(world.mirror_image("unsigned", &world.unsigned)),
        "as today without signatures"
    );
}

/// A rule that matches only the mirror's name (on the target, `<mirror>/*`), pasted into the
/// swapper as the verifier after it holds it: alone, the verifier admits the source unverified
/// (its rule does not match the source's name); chained, the swapper swaps only to a copy that
/// verifies under that rule, so the unsigned image stays at its source and is admitted as alone,
/// where before it was swapped on an existence lookup and the verifier then refused it.
#[test]
fn a_rule_on_the_mirror_name_alone_ends_as_the_verifier_alone() {
    let world = World::start("sig-mirror-rule", Signer::generate());
    world.copy_signature();
    let rules = vec![world.rule(&format!("{}/*", world.mirror.host))];
    let settings = world.settings_with(&rules);
    for (tag, digest) in [("unsigned", &world.unsigned), ("signed", &world.signed)] {
        let image = world.image(tag);
        let alone = verifier(&rules, &image, &(shared(LiveHost::default()) as SharedHost));
        assert_eq!(
            alone,
            Ok(image.clone()),
            "alone: the rule does not match the source"
        );
        let chained = admit_with(Order::SwapperFirst, &rules, &settings, &image);
        let expected = match tag {
            "unsigned" => image.clone(),
            _ => world.mirror_image(tag, digest),
        };
        assert_eq!(chained, Ok(expected), "{tag}");
    }
}

const ORDERS: [Order; 2] = [Order::SwapperFirst, Order::VerifierFirst];

/// The publisher deletes the signature of the digest the mirror copied. Without `verifySource`
/// the mirror's old signature still verifies, and a verifier over the sources, seeing the
/// mirror's name, verifies nothing: the chain admits what the verifier alone refuses. With it,
/// the swapper verifies at the source as that verifier does, and the chain refuses in both
/// orders from the next admission on.
#[test]
fn a_signature_deleted_at_the_source_is_refused_at_once_with_verify_source() {
    let world = World::start("sig-revoked", Signer::generate());
    world.copy_signature();
    let rules = vec![world.rule(&format!("{}/org/*", world.source.host))];
    let image = world.image("signed");
    let mut settings = world.swapper_settings(true);
    settings["verifySource"] = json!(true);
    let swapped = world.mirror_image("signed", &world.signed);
    for order in ORDERS {
        let admitted = admit_with(order, &rules, &settings, &image);
        assert_eq!(admitted, Ok(swapped.clone()), "{order:?}, still signed");
    }
    let signature = world
        .source
        .digest_of(REPOSITORY, &signature_tag(&world.signed))
        .expect("the source's signature");
    world
        .source
        .delete_manifest(REPOSITORY, &signature)
        .expect("signature deleted at the source");
    let alone = verifier(&rules, &image, &(shared(LiveHost::default()) as SharedHost));
    assert!(alone.is_err(), "the verifier alone refuses: {alone:?}");
    for order in ORDERS {
        let admitted = admit_with(order, &rules, &settings, &image);
        assert!(
            admitted
                .as_ref()
                .is_err_and(|refusal| refusal.contains("verification of image")),
            "{order:?}, signature deleted: {admitted:?}"
        );
    }
    // What the swapper itself says, first in the chain: kept at its source, for that reason.
    let response = validate(&settings, &pod(&image), shared(LiveHost::default()));
    assert_eq!(response.image("containers", 0), None, "not swapped");
    assert_eq!(
        response.audit["kept"][0]["reason"],
        json!("unverified-at-source")
    );
    assert_eq!(response.unmirrored(), None, "no copy would help");
    // With `verifySource: false` the mirror's stale signature still verifies...
    let mut at_mirror = world.swapper_settings(true);
    at_mirror["verifySource"] = json!(false);
    let stale = admit_with(Order::SwapperFirst, &rules, &at_mirror, &image);
    assert_eq!(stale, Ok(swapped.clone()));
    // ...and the check role, scanning the Pods that run the swap, reports it (`fail`), naming
    // the mirror's stale signature tag and the command that removes it.
    let mut check = world.swapper_settings(true);
    check["action"] = json!("check");
    let running = rig::audit_request(
        1,
        json!({"containers": [{"name": "web", "image": swapped}]}),
        json!({"image-swapper.kubewarden.io/original-images": json!({"web": image}).to_string()}),
    );
    let report = validate(&check, &running, shared(LiveHost::default()));
    let message = report.message.clone().unwrap_or_default();
    assert!(
        !report.accepted && report.code.is_none(),
        "a finding: {report:?}"
    );
    let stale_tag = format!(
        "{}/cache/{REPOSITORY}:{}",
        world.mirror.host,
        signature_tag(&world.signed)
    );
    assert!(
        message.contains("no longer verifies at its source")
            && message.contains(&format!("remove it (skopeo delete docker://{stale_tag})")),
        "{message}"
    );
    // The command as the report gives it removes the tag, after which the mirror's copy no
    // longer verifies either: the chain refuses even without verifySource.
    let status = std::process::Command::new("skopeo")
        .args([
            "delete",
            "--tls-verify=false",
            &format!("docker://{stale_tag}"),
        ])
        .status()
        .expect("skopeo");
    assert!(status.success(), "skopeo delete {stale_tag}");
    let after = admit_with(Order::SwapperFirst, &rules, &at_mirror, &image);
    assert!(after.is_err(), "the stale signature removed: {after:?}");
    // The Pods still run content whose source no longer vouches for it: still a finding,
    // until they are rolled out.
    let report = validate(&check, &running, shared(LiveHost::default()));
    assert!(!report.accepted, "still a finding: {report:?}");
}

/// With a rule that also covers the mirror's name (rules on `*`) and covered images verified at
/// their source (the default), the swap requires the mirror's signature tag of the digest it
/// swaps to to be the source's, since a verifier after it verifies the copy where it runs. The
/// check role, scanning a Pod that runs such a copy, requires the same: absent, or another
/// manifest under the tag, is a finding (`fail`) naming the tag and both digests, with the copy
/// that brings the source's signature; once copied, the Pod passes.
#[test]
fn the_check_role_reports_a_mirror_copy_without_the_sources_signature_under_a_rule_on_it() {
    let world = World::start("sig-check-copy", Signer::generate());
    let image = world.image("signed");
    let running_image = world.mirror_image("signed", &world.signed);
    let mut check = world.settings_with(&[world.rule("*")]);
    check["action"] = json!("check");
    let running = rig::audit_request(
        1,
        json!({"containers": [{"name": "web", "image": running_image}]}),
        json!({"image-swapper.kubewarden.io/original-images": json!({"web": image}).to_string()}),
    );
    let tag = signature_tag(&world.signed);
    let source_signature = world
        .source
        .digest_of(REPOSITORY, &tag)
        .expect("the source's signature");
    let report = || validate(&check, &running, shared(LiveHost::default()));

    // The mirror holds the image, not its signature.
    let absent = report();
    let message = absent.message.clone().unwrap_or_default();
    assert!(
        !absent.accepted && absent.code.is_none(),
        "a finding: {absent:?}"
    );
    let copy = format!(
        "docker://{}/{REPOSITORY}:{tag} docker://{}/cache/{REPOSITORY}:{tag}",
        world.source.host, world.mirror.host
    );
    assert!(
        message.contains("lacks its source's signature in the mirror")
            && message.contains(&format!("the mirror lacks its signature tag {tag}"))
            && message.contains(&copy),
        "{message}"
    );

    // Another manifest under the signature tag: the finding names both digests.
    let status = std::process::Command::new("skopeo")
        .args([
            "copy",
            "--all",
            "--preserve-digests",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            &format!("docker://{}", world.image("unsigned")),
            &format!("docker://{}/cache/{REPOSITORY}:{tag}", world.mirror.host),
        ])
        .status()
        .expect("skopeo");
    assert!(
        status.success(),
        "skopeo copied another manifest under {tag}"
    );
    let other = report();
    let message = other.message.clone().unwrap_or_default();
    assert!(
        !other.accepted && other.code.is_none(),
        "a finding: {other:?}"
    );
    assert!(
        message.contains(&format!(
            "its signature tag {tag} there is {}, not the source's {source_signature}",
            world.unsigned
        )),
        "{message}"
    );

    // The source's signature copied as the finding says: the Pod passes.
    world.copy_signature();
    let copied = report();
    assert!(copied.accepted, "{copied:?}");
}

/// The publisher ships a fixed build under the same tag and signs it. Verified at the source
/// (the default, and `verifySource: true`) the mirror's old copy (and its old, valid signature)
/// is never swapped to: the new digest is admitted at its source, pinned by the verifier, until
/// the mirror holds it; then swapped to it, in both orders. The mirror's own signature is never
/// asked: only the source's verification names what may be swapped to.
#[test]
fn a_source_re_signed_and_re_tagged_is_swapped_at_its_new_digest_with_verify_source() {
    let world = World::start("sig-resigned", Signer::generate());
    world.copy_signature();
    let fixed = Image::new("sig-resigned fixed build", "linux/amd64");
    let fixed_digest = fixed.push(&world.source, REPOSITORY, Some("signed"));
    world
        .signer
        .sign(&world.source, REPOSITORY, &fixed_digest, &[]);
    let rules = vec![world.rule(&format!("{}/org/*", world.source.host))];
    let image = world.image("signed");
    let default = world.swapper_settings(true);
    let mut verify_source = default.clone();
    verify_source["verifySource"] = json!(true);
    let never_at_the_mirror = |settings: &Value| {
        let host = shared(LiveHost::default());
        validate(settings, &pod(&image), host.clone());
        let asked = host.lock().expect("host").lookups();
        assert!(
            !asked
                .iter()
                .any(|l| l.contains("Verify") && l.contains(&world.mirror.host)),
            "the mirror's signature was asked: {asked:?}"
        );
    };
    for settings in [&default, &verify_source] {
        never_at_the_mirror(settings);
        for order in ORDERS {
            let admitted = admit_with(order, &rules, settings, &image);
            assert_eq!(
                admitted,
                Ok(format!("{image}@{fixed_digest}")),
                "{order:?}, the mirror holds only the old build: {settings}"
            );
        }
    }
    world.copy_tag("signed");
    world.copy_tag(&signature_tag(&fixed_digest));
    for settings in [&default, &verify_source] {
        never_at_the_mirror(settings);
        for order in ORDERS {
            let admitted = admit_with(order, &rules, settings, &image);
            assert_eq!(
                admitted,
                Ok(world.mirror_image("signed", &fixed_digest)),
                "{order:?}, the fixed build copied: {settings}"
            );
        }
    }
}

/// The source moves a covered tag to a new signed build while the mirror's tag holds the old one
/// (default settings: verified at the source): the Pod is kept at its source and recorded; `fill-mirror once` (the built binary) over that Pod copies the new digest beside
/// the mirror's tag with its signature, the mirror's tag not moved; the next Pod is swapped to
/// the new digest in both orders. Counted as present, the copy left every next Pod kept.
#[test]
fn a_tag_moved_at_the_source_is_filled_beside_the_mirror_tag_and_swapped() {
    let world = World::start("sig-moved-fill", Signer::generate());
    world.copy_signature();
    let fixed = Image::new("sig-moved-fill fixed build", "linux/amd64");
    let fixed_digest = fixed.push(&world.source, REPOSITORY, Some("signed"));
    world
        .signer
        .sign(&world.source, REPOSITORY, &fixed_digest, &[]);
    let rules = vec![world.rule(&format!("{}/org/*", world.source.host))];
    let image = world.image("signed");
    let settings = world.swapper_settings(true);
    let kept = validate(&settings, &pod(&image), shared(LiveHost::default()));
    let recorded = kept.mutated.expect("the kept Pod, with its record");
    assert_eq!(image_of(&recorded), image, "kept at its source");
    assert_eq!(
        recorded["metadata"]["labels"]["image-swapper.kubewarden.io/unmirrored"], "true",
        "{recorded:#}"
    );

    let dir = std::env::temp_dir().join(format!("sig-moved-fill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let (pods, settings_file) = (dir.join("pods.json"), dir.join("settings.json"));
    std::fs::write(&pods, json!({"items": [recorded]}).to_string()).expect("pods");
    std::fs::write(&settings_file, settings.to_string()).expect("settings");
    let output = std::process::Command::new(rig::fill_mirror())
        .args(["once", "--insecure", "--pods"])
        .arg(&pods)
        .arg("--settings")
        .arg(&settings_file)
        .output()
        .expect("fill-mirror once");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{said}");
    assert_eq!(
        world
            .mirror
            .digest_of(&format!("cache/{REPOSITORY}"), "signed"),
        Some(world.signed.clone()),
        "the mirror's tag moved: {said}"
    );
    for order in ORDERS {
        assert_eq!(
            admit_with(order, &rules, &settings, &image),
            Ok(world.mirror_image("signed", &fixed_digest)),
            "{order:?}, after the fill: {said}"
        );
    }
}

/// A certificate rule that requires a Rekor bundle is not satisfied by signatures without one
/// (the rig's, like `cosign sign --tlog-upload=false`'s), as on the host: the copy is kept
/// unverified, never swapped.
#[test]
fn a_rule_that_requires_a_rekor_bundle_refuses_signatures_without_one() {
    let world = World::start("sig-rekor", Signer::with_certificate("release@example.com"));
    world.copy_signature();
    let mut settings = world.swapper_settings_at_mirror();
    let response = validate(
        &settings,
        &pod(&world.image("signed")),
        shared(LiveHost::default()),
    );
    assert_eq!(
        response.image("containers", 0),
        Some(world.mirror_image("signed", &world.signed).as_str()),
        "without the requirement: swapped"
    );
    settings["signatures"][0]["requireRekorBundle"] = json!(true);
    let response = validate(
        &settings,
        &pod(&world.image("signed")),
        shared(LiveHost::default()),
    );
    let source = world.image("signed");
    assert_eq!(
        response.image("containers", 0).unwrap_or(&source),
        source,
        "kept at its source"
    );
    assert_eq!(response.audit["kept"][0]["reason"], json!("unverified"));
    assert!(
        response.warned("not signed with its certificate: verification failed"),
        "{:?}",
        response.warnings
    );
}

/// A host that trusts every verification (answering one digest) and keeps each request as
/// the guest sent it: what the host receives, to compare whole.
#[derive(Default)]
struct TrustingHost {
    requests: Vec<Value>,
}

const TRUSTED_DIGEST: &str =
    "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

impl rig::wapc::Host for TrustingHost {
    fn call(
        &mut self,
        _binding: &str,
        _namespace: &str,
        operation: &str,
        payload: &[u8],
    ) -> Result<Vec<u8>, String> {
        if operation != "v2/verify" {
            return Err(format!("unexpected host call {operation}"));
        }
        self.requests
            .push(serde_json::from_slice(payload).map_err(|e| e.to_string())?);
        Ok(json!({"is_trusted": true, "digest": TRUSTED_DIGEST})
            .to_string()
            .into_bytes())
    }
}

/// Every kind of rule reaches the host as verify-image-signatures' own request for it (the
/// SDK 0.17.3's `SigstoreVerificationInputV2`, which both send through the same helpers),
/// compared whole and in order: the annotations, the Rekor bundle flag, a keyless identity's
/// issuer and subject, a GitHub Actions repository and a certificate chain are each part of
/// what the host verifies, so a request that dropped or changed one would verify less.
#[test]
fn every_rule_reaches_the_host_as_the_verifiers_own_request() {
    let key = Signer::generate();
    let (alice, bob) = (
        Signer::with_certificate("alice@example.com"),
        Signer::with_certificate("bob@example.com"),
    );
    let pem = |signer: &Signer, field: &str| -> String {
        match field {
            "certificate" => signer.certificate_pem.clone().expect("certificate"),
            _ => signer.chain_pem.clone().expect("chain"),
        }
    };
    let bytes = |text: String| json!(text.into_bytes());
    let annotations = json!({"env": "prod"});
    let settings = json!({
        "verifySource": false,
        "mirrors": [{"source": "registry.example.com", "target": "mirror.example.com/cache"}],
        "signatures": [
            {"image": "registry.example.com/*", "pubKeys": [key.public_pem], "annotations": annotations},
            {"image": "registry.example.com/*", "keyless": [{"issuer": "https://accounts.example.com", "subject": "ci@example.com"}]},
            {"image": "registry.example.com/*", "keylessPrefix": [{"issuer": "https://token.actions.githubusercontent.com", "urlPrefix": "https://github.com/org/app/"}]},
            {"image": "registry.example.com/*", "githubActions": {"owner": "org", "repo": "app"}},
            {"image": "registry.example.com/*", "certificates": [pem(&alice, "certificate"), pem(&bob, "certificate")],
             "certificateChain": [pem(&alice, "chain")], "requireRekorBundle": true, "annotations": annotations},
        ]
    });
    let mirror = "mirror.example.com/cache/org/app:1";
    let host = shared(TrustingHost::default());
    let response = validate(
        &settings,
        &pod("registry.example.com/org/app:1"),
        host.clone(),
    );
    assert_eq!(
        response.image("containers", 0),
        Some(format!("{mirror}@{TRUSTED_DIGEST}").as_str())
    );
    let chain = json!([bytes(pem(&alice, "chain"))]);
    let expected = vec![
        json!({"type": "SigstorePubKeyVerify", "image": mirror, "pub_keys": [key.public_pem], "annotations": annotations}),
        json!({"type": "SigstoreKeylessVerify", "image": mirror, "keyless": [{"issuer": "https://accounts.example.com", "subject": "ci@example.com"}], "annotations": null}),
        json!({"type": "SigstoreKeylessPrefixVerify", "image": mirror, "keyless_prefix": [{"issuer": "https://token.actions.githubusercontent.com", "url_prefix": "https://github.com/org/app/"}], "annotations": null}),
        json!({"type": "SigstoreGithubActionsVerify", "image": mirror, "owner": "org", "repo": "app", "annotations": null}),
        json!({"type": "SigstoreCertificateVerify", "image": mirror, "certificate": bytes(pem(&alice, "certificate")), "certificate_chain": chain, "require_rekor_bundle": true, "annotations": annotations}),
        json!({"type": "SigstoreCertificateVerify", "image": mirror, "certificate": bytes(pem(&bob, "certificate")), "certificate_chain": chain, "require_rekor_bundle": true, "annotations": annotations}),
    ];
    let requests = host.lock().expect("host").requests.clone();
    assert_eq!(requests.len(), expected.len(), "{requests:#?}");
    for (sent, wanted) in requests.iter().zip(&expected) {
        assert_eq!(sent, wanted);
    }
}

const VERIFY_MODULE: &str =
    "registry://ghcr.io/kubewarden/policies/verify-image-signatures:v1.0.11";

/// The cluster of the `verifiers` tests: verify-image-signatures deployed as namespace
/// `team`'s own AdmissionPolicy, validating (`mutating: false`), its rules on the sources.
fn team_verifier(world: &World) -> rig::kubernetes::Cluster {
    let rule = world.rule(&format!("{}/org/*", world.source.host));
    rig::kubernetes::Cluster::with_policies(&[(
        "AdmissionPolicy",
        Some("team"),
        "verify-image-signatures",
        json!({"module": VERIFY_MODULE, "mutating": false,
            "settings": {"signatures": [rule], "modifyImagesWithDigest": false}}),
    )])
}

/// The swapper (cluster-wide, mutating) then namespace `team`'s validating verifier, which
/// runs after every mutation whatever the names: what the API server stores, or the refusal.
fn admit_in(
    namespace: &str,
    settings: &Value,
    cluster: &rig::kubernetes::Cluster,
    image: &str,
) -> Admitted {
    let host = shared(LiveHost {
        cluster: Some(cluster.clone()),
        ..LiveHost::default()
    });
    let mut request = pod(image);
    request["namespace"] = json!(namespace);
    request["object"]["metadata"]["namespace"] = json!(namespace);
    let response = validate(settings, &request, host.clone());
    if !response.accepted {
        return Err(response.message.unwrap_or_default());
    }
    let stored = response.image("containers", 0).unwrap_or(image).to_string();
    let in_team = cluster
        .objects
        .iter()
        .any(|o| o.pointer("/metadata/namespace") == Some(&json!(namespace)));
    if in_team {
        let rules = [world_rule_of(cluster)];
        // Validating: it verifies and never patches.
        verifier(&rules, &stored, &(host as SharedHost))?;
    }
    Ok(stored)
}

/// Namespace `team`'s mutating verifier (pinning what it verifies), then the swapper reading
/// the verifiers from the cluster: what the API server stores, or the first refusal.
fn admit_after_team_verifier(
    settings: &Value,
    cluster: &rig::kubernetes::Cluster,
    image: &str,
) -> Admitted {
    let host = shared(LiveHost {
        cluster: Some(cluster.clone()),
        ..LiveHost::default()
    });
    let pinned = verifier(
        &[world_rule_of(cluster)],
        image,
        &(host.clone() as SharedHost),
    )?;
    let mut request = pod(&pinned);
    request["namespace"] = json!("team");
    request["object"]["metadata"]["namespace"] = json!("team");
    let response = validate(settings, &request, host);
    if !response.accepted {
        return Err(response.message.unwrap_or_default());
    }
    Ok(response
        .image("containers", 0)
        .unwrap_or(&pinned)
        .to_string())
}

fn world_rule_of(cluster: &rig::kubernetes::Cluster) -> Value {
    cluster.objects[0]["spec"]["settings"]["signatures"][0].clone()
}

/// `verifiers`: a verifier the webhook order cannot put first (validating, and namespaced)
/// with rules on the sources, and the swapper cluster-wide without `signatures` of its own.
/// Without `verifiers` the unsigned image is swapped and the verifier, seeing the mirror's
/// name, verifies nothing; with it, in that namespace every outcome is the verifier's own, and
/// elsewhere the swap is as without it.
#[test]
fn verifiers_read_from_the_cluster_cover_a_namespaced_validating_verifier() {
    let world = World::start("sig-verifiers", Signer::generate());
    let cluster = team_verifier(&world);
    let without = world.swapper_settings(false);
    let mut settings = without.clone();
    settings["verifiers"] = json!([{"module": "*/verify-image-signatures:*"}]);
    let (unsigned, signed) = (world.image("unsigned"), world.image("signed"));
    // The hole, as it stands without `verifiers`.
    assert_eq!(
        admit_in("team", &without, &cluster, &unsigned),
        Ok(world.mirror_image("unsigned", &world.unsigned)),
        "without verifiers the unsigned image escapes the team's verifier"
    );
    let refused = admit_in("team", &settings, &cluster, &unsigned);
    assert!(
        refused
            .as_ref()
            .is_err_and(|m| m.contains("verification of image")),
        "unsigned in team: {refused:?}"
    );
    assert_eq!(
        admit_in("team", &settings, &cluster, &signed),
        Ok(world.mirror_image("signed", &world.signed)),
        "signed in team, verified at its source: swapped at that digest (no rule matches the mirror's name, so the copy needs no signature there)"
    );
    let mut at_mirror = settings.clone();
    at_mirror["verifySource"] = json!(false);
    assert_eq!(
        admit_in("team", &at_mirror, &cluster, &signed),
        Ok(signed.clone()),
        "signed in team, verified at the mirror, its signature not yet there: kept at its source"
    );
    world.copy_signature();
    assert_eq!(
        admit_in("team", &settings, &cluster, &signed),
        Ok(world.mirror_image("signed", &world.signed)),
        "signed in team, its signature copied: swapped at the verified digest"
    );
    // A namespace without a verifier: as today.
    assert_eq!(
        admit_in("other", &settings, &cluster, &unsigned),
        Ok(world.mirror_image("unsigned", &world.unsigned))
    );
}

/// How the Pod names the image: as the source, under the mirror's name by tag, or pinned there.
#[derive(Clone, Copy, Debug)]
enum Spelling {
    Source,
    Mirror,
    MirrorPinned,
}

impl Spelling {
    const ALL: [Spelling; 3] = [Spelling::Source, Spelling::Mirror, Spelling::MirrorPinned];

    fn of(self, world: &World, tag: &str, digest: &str) -> String {
        match self {
            Spelling::Source => world.image(tag),
            Spelling::Mirror => format!("{}/cache/{REPOSITORY}:{tag}", world.mirror.host),
            Spelling::MirrorPinned => world.mirror_image(tag, digest),
        }
    }
}

/// Where the verifier sits: a mutating one named to sort before the swapper, one after it, or
/// (with `verifiers`) namespace `team`'s validating one, read from the cluster.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Placement {
    Before,
    After,
    TeamValidating,
    /// (with `verifiers`) namespace `team`'s mutating one, whose webhook (1.38's
    /// `kw.ap.team.…`) the API server calls before the swapper's (`kw.cap.…`).
    TeamMutatingFirst,
}

/// Every spelling of a covered image, every placement of the verifier, rules on the sources
/// and on `*`, verified at the source (the default) and at the mirror (`verifySource: false`),
/// `onUnverified` keep and reject, the swapper's rules pasted (`signatures`) or read
/// (`verifiers`): every row ends as the verifier alone ends on the source (the name a Pod can
/// pull without the swapper), and nothing unsigned ever runs under the mirror's name: with
/// the verifier before the swapper, rules on the sources and `keep`, the mirror spelling of an
/// unsigned image is refused, not written back to a source no verifier would see again; the
/// same with `verifiers` when the team's verifier is mutating and called first.
#[test]
fn every_spelling_of_a_covered_image_ends_as_the_verifier_alone_ends() {
    let world = World::start("sig-spellings", Signer::generate());
    world.copy_signature();
    let mut rows = 0;
    for (rules_on, rule) in [
        (
            "sources",
            world.rule(&format!("{}/org/*", world.source.host)),
        ),
        ("*", world.rule("*")),
    ] {
        let rules = vec![rule.clone()];
        let cluster = rig::kubernetes::Cluster::with_policies(&[(
            "AdmissionPolicy",
            Some("team"),
            "verify-image-signatures",
            json!({"module": VERIFY_MODULE, "mutating": false,
                "settings": {"signatures": [rule], "modifyImagesWithDigest": false}}),
        )]);
        let mutating_cluster = rig::kubernetes::Cluster::with_policies(&[(
            "AdmissionPolicy",
            Some("team"),
            "verify-image-signatures",
            json!({"module": VERIFY_MODULE, "mutating": true,
                "settings": {"signatures": [rule]}}),
        )]);
        for read in ["signatures", "verifiers"] {
            for verify_source in [None, Some(false)] {
                for on_unverified in ["keep", "reject"] {
                    let mut settings = world.swapper_settings(false);
                    match read {
                        "signatures" => settings["signatures"] = json!(rules),
                        _ => settings["verifiers"] = json!([{}]),
                    }
                    if let Some(at_source) = verify_source {
                        settings["verifySource"] = json!(at_source);
                    }
                    settings["onUnverified"] = json!(on_unverified);
                    let placements: &[Placement] = match read {
                        "signatures" => &[Placement::Before, Placement::After],
                        _ => &[Placement::TeamValidating, Placement::TeamMutatingFirst],
                    };
                    for &placement in placements {
                        for (tag, digest) in
                            [("unsigned", &world.unsigned), ("signed", &world.signed)]
                        {
                            let alone = verifier(
                                &rules,
                                &world.image(tag),
                                &(shared(LiveHost::default()) as SharedHost),
                            );
                            assert_eq!(alone.is_ok(), tag == "signed", "{alone:?}");
                            for spelling in Spelling::ALL {
                                let image = spelling.of(&world, tag, digest);
                                let with = match placement {
                                    Placement::Before => {
                                        admit_with(Order::VerifierFirst, &rules, &settings, &image)
                                    }
                                    Placement::After => {
                                        admit_with(Order::SwapperFirst, &rules, &settings, &image)
                                    }
                                    Placement::TeamValidating => {
                                        admit_in("team", &settings, &cluster, &image)
                                    }
                                    Placement::TeamMutatingFirst => admit_after_team_verifier(
                                        &settings,
                                        &mutating_cluster,
                                        &image,
                                    ),
                                };
                                let row = format!(
                                    "rules on {rules_on}, {read}, verifySource {verify_source:?}, onUnverified {on_unverified}, verifier {placement:?}, {tag} as {spelling:?} ({image}): {with:?}"
                                );
                                rows += 1;
                                if let Ok(stored) = &with {
                                    assert!(
                                        !(stored.starts_with(&world.mirror.host)
                                            && stored.contains(&world.unsigned)),
                                        "unsigned under the mirror's name: {row}"
                                    );
                                    assert!(
                                        stored.contains(&world.signed),
                                        "admitted other than the signed digest, pinned: {row}"
                                    );
                                }
                                assert_eq!(with.is_ok(), alone.is_ok(), "{row}");
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(rows, 2 * (2 * 2 * 2 + 2 * 2 * 2) * 2 * 3);
}

/// Verifiers that cannot be read (a kind not granted in `contextAwareResources`, or no
/// Kubernetes client) keep every image bound for a mirror, with the host's words:
/// `onLookupError`'s case, never a swap unverified.
#[test]
fn verifiers_that_cannot_be_read_keep_every_image() {
    let world = World::start("sig-verifiers-unread", Signer::generate());
    let mut settings = world.swapper_settings(false);
    settings["verifiers"] = json!([{"module": "*/verify-image-signatures:*"}]);
    let mut not_granted = team_verifier(&world);
    not_granted.granted = Some(vec![(
        "policies.kubewarden.io/v1".to_string(),
        "ClusterAdmissionPolicy".to_string(),
    )]);
    let image = world.image("unsigned");
    for (cluster, said) in [
        (
            Some(not_granted),
            "could not list ClusterAdmissionPolicyGroup objects (Policy has not been granted access to Kubernetes policies.kubewarden.io/v1/ClusterAdmissionPolicyGroup resources. The violation has been reported. List the four",
        ),
        (
            None,
            "could not list ClusterAdmissionPolicy objects (kube::Client was not initialized properly)",
        ),
    ] {
        let host = shared(LiveHost {
            cluster,
            ..LiveHost::default()
        });
        let response = validate(&settings, &pod(&image), host);
        assert!(response.accepted);
        assert_eq!(response.image("containers", 0), None, "not swapped");
        assert!(response.warned(said), "{:?}", response.warnings);
        assert_eq!(response.audit["kept"][0]["reason"], json!("lookup-error"));
    }
}

/// A mirror tag that names other content than the signed digest, beside that digest's
/// signature, is never swapped to; a pinned image is swapped only to its own digest.
#[test]
fn a_mirror_copy_of_another_digest_is_never_swapped_to() {
    let world = World::start("sig-other", Signer::generate());
    world.copy_signature();
    let other = Image::new("something else", "linux/amd64");
    let other_digest = other.push(
        &world.mirror,
        &format!("cache/{REPOSITORY}"),
        Some("signed"),
    );
    let settings = world.swapper_settings_at_mirror();
    let host = shared(LiveHost::default());
    let by_tag = swapper(
        &settings,
        &pod(&world.image("signed"))["object"],
        host.clone(),
    );
    assert_eq!(by_tag, Ok(world.image("signed")), "kept at its source");
    let pinned = format!("{}@{}", world.image("signed"), world.signed);
    let by_digest = swapper(&settings, &pod(&pinned)["object"], host);
    assert_eq!(
        by_digest,
        Ok(world.mirror_image("signed", &world.signed)),
        "the verified digest, never {other_digest}"
    );
}

/// The warning names the image and the host's reason; `onUnverified: reject` refuses instead.
#[test]
fn an_unverified_copy_is_kept_with_the_hosts_reason_or_refused() {
    let world = World::start("sig-warn", Signer::generate());
    let image = world.image("signed");
    let mut settings = world.swapper_settings_at_mirror();
    let response = validate(&settings, &pod(&image), shared(LiveHost::default()));
    assert!(response.accepted);
    let warning = response.warnings.join("\n");
    let mirror = format!("{}/cache/{REPOSITORY}:signed", world.mirror.host);
    assert!(
        warning.contains(&format!("its copy there does not verify (not signed with its public key: no signatures found for image: {mirror})")),
        "{warning}"
    );
    assert_eq!(response.audit["kept"][0]["reason"], json!("unverified"));
    let record = response.unmirrored().expect("recorded for the fill job");
    assert_eq!(
        record["web"]["signatureCopy"],
        json!(format!(
            "skopeo copy --all --preserve-digests docker://{}/{REPOSITORY}:{tag} docker://{}/cache/{REPOSITORY}:{tag}",
            world.source.host,
            world.mirror.host,
            tag = signature_tag(&world.signed)
        ))
    );
    settings["onUnverified"] = json!("reject");
    let response = validate(&settings, &pod(&image), shared(LiveHost::default()));
    assert!(!response.accepted);
    assert!(
        response
            .message
            .as_deref()
            .is_some_and(|m| m.contains("onUnverified is reject")),
        "{:?}",
        response.message
    );
}

/// A certificate the host cannot verify with (no key usage, no code signing) is the host's
/// error, in its words, read as a lookup error: not a refusal of the image, nothing swapped.
/// (Real kwctl 1.35 answered the same text for such a certificate.)
#[test]
fn a_certificate_the_host_refuses_is_a_lookup_error_in_its_words() {
    let world = World::start(
        "sig-bare-cert",
        Signer::with_bare_certificate("a@example.com"),
    );
    world.copy_signature();
    let response = validate(
        &world.swapper_settings_at_mirror(),
        &pod(&world.image("signed")),
        shared(LiveHost::default()),
    );
    assert!(response.accepted);
    assert_eq!(response.image("containers", 0), None);
    assert!(
        response.warned(
            "could not look it up (Bundled certificate does not have digital signature key usage)"
        ),
        "{:?}",
        response.warnings
    );
    assert_eq!(response.audit["kept"][0]["reason"], json!("lookup-error"));
}

/// Verifications at a distance, within the budget: eight signed images on a mirror 50 ms away
/// (behind the rig's latency proxy, under both host models), every signature copied. The
/// first verification starts on the fresh budget, later ones only while the registry's slowest
/// verification fits; the images not verified follow `onLookupError` with the budget's
/// warning, and none is swapped unverified. The evaluation ends within the budget and one
/// verification.
#[test]
fn verifications_at_a_distance_stay_within_the_budget() {
    use rig::proxy::{HostModel, LatencyProxy, Transport};
    use std::time::{Duration, Instant};
    let world = World::start("sig-far", Signer::generate());
    let mirrored = format!("cache/{REPOSITORY}");
    let digests: Vec<String> = (0..8)
        .map(|i| {
            let image = Image::new(&format!("far app {i}"), "linux/amd64");
            let tag = format!("v{i}");
            let digest = image.push(&world.source, REPOSITORY, Some(&tag));
            world.signer.sign(&world.source, REPOSITORY, &digest, &[]);
            image.push(&world.mirror, &mirrored, Some(&tag));
            world.signer.sign(&world.mirror, &mirrored, &digest, &[]);
            digest
        })
        .collect();
    rig::policy();
    for model in HostModel::ALL {
        let far = LatencyProxy::start_as(
            &world.mirror.host,
            Duration::from_millis(50),
            model,
            Transport::Https,
        )
        .expect("proxy");
        let mut settings = world.swapper_settings(true);
        settings["mirrors"][0]["target"] = json!(format!("{}/cache", far.host));
        // Verified at the mirror: each image one verification there.
        settings["verifySource"] = json!(false);
        // One image first: what one verification costs at this distance. It also opens the
        // process's cosign connection, which the host keeps (`LiveHost::verify`): the Pod
        // after is a running policy-server's, whose verifications ask on that connection.
        let process = LiveHost::default();
        let one = Instant::now();
        let single = validate(
            &settings,
            &pod(&world.image("v0")),
            shared(LiveHost {
                cosign: process.cosign.clone(),
                ..LiveHost::default()
            }),
        );
        let verification = one.elapsed();
        assert_eq!(
            single.image("containers", 0),
            Some(format!("{}/cache/{REPOSITORY}:v0@{}", far.host, digests[0]).as_str()),
            "{}: {single:?}",
            model.name()
        );
        let containers: Vec<Value> = (0..8)
            .map(|i| json!({"name": format!("c{i}"), "image": world.image(&format!("v{i}"))}))
            .collect();
        let request = pod_request("CREATE", json!({ "containers": containers }));
        let host = shared(LiveHost {
            cosign: process.cosign.clone(),
            ..LiveHost::default()
        });
        let started = Instant::now();
        let response = validate(&settings, &request, host.clone());
        let took = started.elapsed();
        assert!(response.accepted, "{response:?}");
        let object = response
            .mutated
            .clone()
            .unwrap_or_else(|| request["object"].clone());
        let images: Vec<String> = (0..8)
            .map(|i| {
                object["spec"]["containers"][i]["image"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        let swapped = images.iter().filter(|i| i.starts_with(&far.host)).count();
        for (i, image) in images.iter().enumerate() {
            if image.starts_with(&far.host) {
                assert!(
                    image.ends_with(&digests[i]),
                    "swapped only at its verified digest: {image}"
                );
            } else {
                assert_eq!(image, &world.image(&format!("v{i}")), "kept as written");
            }
        }
        let verified = host.lock().expect("host").exchanges.len();
        println!(
            "policy-server {}: one verification {verification:?}; 8 images: {swapped} swapped after {verified} verifications in {took:?}",
            model.name()
        );
        assert!((1..8).contains(&swapped), "{swapped} swapped: {images:?}");
        assert_eq!(verified, swapped, "no verification after the budget");
        assert!(
            response.warned("lookup budget of 800 ms: "),
            "{:?}",
            response.warnings
        );
        // The next verification was refused while time was left, predicted from this
        // registry's verifications: never started to run past the budget.
        assert!(
            response
                .warnings
                .iter()
                .any(|w| w.starts_with("lookup budget of 800 ms: ")
                    && w.contains(&format!("({} would need about ", far.host))
                    && w.contains(" ms were left)")),
            "policy-server {}: {:?}",
            model.name(),
            response.warnings
        );
        assert!(
            took < Duration::from_millis(800) + verification + Duration::from_millis(150),
            "policy-server {}: {took:?}, one verification {verification:?}",
            model.name()
        );
    }
}

/// Verification at the source, at a distance: `verifySource` with `signatures`, the covered
/// source and its mirror each 50 ms away (under every host model). The source is verified as a
/// verifier on it verifies (a verification costs about two lookups, as measured on the real
/// policy-server 1.35), then the mirror's copy of that digest is asked, and the image is
/// swapped to it: the admission ends within the budget and one call of the slowest kind, and
/// within the `timeoutEvalSeconds` the time rule gives that budget (budget + the slowest call +
/// 1 s: 3 s), never interrupted.
#[test]
fn a_covered_source_50_ms_away_is_verified_at_the_source_within_the_budget() {
    use rig::proxy::{HostModel, LatencyProxy, Transport};
    use std::time::{Duration, Instant};
    const TIMEOUT_S: u64 = 3;
    let world = World::start("sig-source-far", Signer::generate());
    world.copy_signature();
    rig::policy();
    for model in HostModel::ALL {
        let name = model.name();
        let at = |registry: &TestRegistry| {
            LatencyProxy::start_as(
                &registry.host,
                Duration::from_millis(50),
                model,
                Transport::Https,
            )
            .expect("proxy")
        };
        let (source, mirror) = (at(&world.source), at(&world.mirror));
        let settings = json!({
            "mirrors": [{"source": source.host, "target": format!("{}/cache", mirror.host)}],
            "verifySource": true,
            "signatures": [world.rule(&format!("{}/org/*", source.host))],
        });
        let image = format!("{}/{REPOSITORY}:signed", source.host);
        let host = shared(LiveHost::default());
        let started = Instant::now();
        let response = rig::validate_within(&settings, &pod(&image), host.clone(), Some(TIMEOUT_S));
        let took = started.elapsed();
        let asked = host.lock().expect("host").lookups();
        println!("policy-server {name}: verified at a source 50 ms away in {took:?}: {asked:?}");
        assert!(response.accepted, "policy-server {name}: {response:?}");
        assert_eq!(
            response.image("containers", 0),
            Some(format!("{}/cache/{REPOSITORY}:signed@{}", mirror.host, world.signed).as_str()),
            "policy-server {name}: swapped at the digest verified at the source: {:?} {asked:?}",
            response.warnings
        );
        assert!(
            asked.first().is_some_and(|first| first.ends_with(&image)),
            "policy-server {name}: the source verified first: {asked:?}"
        );
        // Then the mirror asked for exactly that digest, once, and nothing verified there: a
        // second verification would not fit the time rule at a distance.
        let digest_at_mirror = format!("{}/cache/{REPOSITORY}@{}", mirror.host, world.signed);
        assert_eq!(asked.len(), 2, "policy-server {name}: {asked:?}");
        assert!(
            asked[1].ends_with(&digest_at_mirror) && !asked[1].contains("Verify"),
            "policy-server {name}: the mirror's copy looked up, not verified: {asked:?}"
        );
        let round_trip = Duration::from_millis(50);
        let lookup = model.lookup(round_trip);
        // Two connections and their pings, the digest, the signature manifest, its layer.
        let verification = round_trip * (2 * model.lookup_round_trips() + 1) + model.overhead() * 2;
        let bound =
            Duration::from_millis(800) + verification.max(lookup) + Duration::from_millis(150);
        assert!(
            took < bound,
            "policy-server {name}: {took:?} against {bound:?}: {asked:?}"
        );
        assert!(
            response.warnings.is_empty(),
            "policy-server {name}: {:?}",
            response.warnings
        );
    }
}

/// Runs the real kwctl on one case against the registries (plain HTTP on loopback, named
/// in `insecure_sources`), recording its host interactions, and writes the case to
/// `e2e/cases/<name>`: the request, the settings, kwctl's session under a header that says how
/// it was made, and what kwctl answered as the expectation (the figures of time left out).
fn record_case(tools: &RealTools, world: &World, name: &str, settings: &Value, image: &str) {
    let dir = rig::root().join("e2e/cases").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("case directory");
    let sources = world.insecure_sources(name);
    let request = pod(image);
    std::fs::write(
        dir.join("request.json"),
        serde_json::to_string_pretty(&request).expect("JSON") + "\n",
    )
    .expect("request");
    std::fs::write(
        dir.join("settings.yml"),
        serde_yaml::to_string(settings).expect("YAML"),
    )
    .expect("settings");
    let session = std::env::temp_dir().join(format!("{name}-session.yml"));
    let output = std::process::Command::new(tools.bin("kwctl"))
        .arg("run")
        .arg("--sigstore-trust-config")
        .arg(tools.sigstore_trust_config())
        .arg("--settings-path")
        .arg(dir.join("settings.yml"))
        .arg("--request-path")
        .arg(dir.join("request.json"))
        .arg("--sources-path")
        .arg(&sources)
        .arg("--record-host-capabilities-interactions")
        .arg(&session)
        .arg(tools.annotated_policy())
        .output()
        .expect("kwctl runs");
    assert!(output.status.success(), "{name}: {output:?}");
    let version = tools.kwctl_version();
    let header = format!(
        "# Recorded by real kwctl ({version}) against CNCF distribution registries over plain HTTP on\n# loopback (insecure_sources), images signed as `cosign sign --key` signs them:\n# KWCTL=kwctl cargo test --test signatures record_signature_cases -- --ignored\n"
    );
    let recorded = std::fs::read_to_string(&session).expect("kwctl wrote the session");
    std::fs::write(dir.join("session.yml"), header + &recorded).expect("session");

    let answer: Value = serde_json::from_slice(&output.stdout).expect("kwctl's answer");
    let mut expect = json!({"allowed": answer["allowed"]});
    if let Some(patch) = answer["patch"].as_str() {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .expect("base64 patch");
        // The whole JSON patch: its operations, paths and values, in kwctl's order.
        expect["patch"] = serde_json::from_slice(&bytes).expect("JSON patch");
    }
    if answer["warnings"].as_array().is_some_and(|w| !w.is_empty()) {
        expect["warnings"] = answer["warnings"].clone();
    }
    if let Some(message) = answer["status"]["message"].as_str() {
        expect["message"] = json!(message);
    }
    let mut audit = serde_json::Map::new();
    for (key, value) in answer["auditAnnotations"].as_object().into_iter().flatten() {
        let mut value: Value =
            serde_json::from_str(value.as_str().unwrap_or("null")).expect("JSON");
        if let Some(summary) = value.as_object_mut().filter(|_| key == "summary") {
            summary.remove("evaluationMilliseconds");
            summary.remove("lookupMilliseconds");
        }
        audit.insert(key.clone(), value);
    }
    expect["auditAnnotations"] = Value::Object(audit);
    std::fs::write(
        dir.join("expect.json"),
        serde_json::to_string_pretty(&expect).expect("JSON") + "\n",
    )
    .expect("expect");
}

/// One webhook through real kwctl, its lookups live (the registries named in
/// `insecure_sources`): the object it stores, or its refusal.
fn kwctl_webhook(
    tools: &RealTools,
    module: &std::path::Path,
    settings: &Value,
    object: &Value,
    sources: &std::path::Path,
) -> Admitted {
    let mut request = pod("");
    request["object"] = object.clone();
    let (answer, _) = tools.kwctl_run(
        module,
        settings,
        &request,
        &["--sources-path".as_ref(), sources.as_os_str()],
        &[],
    );
    if answer["allowed"] != json!(true) {
        return Err(answer["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string());
    }
    let Some(patch) = answer["patch"].as_str() else {
        return Ok(image_of(object));
    };
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .expect("base64");
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("JSON patch");
    let mut patched = object.clone();
    json_patch::patch(&mut patched, &patch).expect("the patch applies");
    Ok(image_of(&patched))
}

/// The two webhooks in `order` under the real kwctl: what the API server stores, or the
/// refusal.
fn kwctl_chain(
    tools: &RealTools,
    order: Order,
    (verifier_wasm, verifier_settings): (&std::path::Path, &Value),
    (swapper_wasm, swapper_settings): (&std::path::Path, &Value),
    image: &str,
    sources: &std::path::Path,
) -> Admitted {
    let (first, second) = match order {
        Order::SwapperFirst => (
            (swapper_wasm, swapper_settings),
            (verifier_wasm, verifier_settings),
        ),
        Order::VerifierFirst => (
            (verifier_wasm, verifier_settings),
            (swapper_wasm, swapper_settings),
        ),
    };
    let stored = kwctl_webhook(tools, first.0, first.1, &pod(image)["object"], sources)?;
    kwctl_webhook(tools, second.0, second.1, &pod(&stored)["object"], sources)
}

/// The chain of the tests above, with the real verify-image-signatures 1.0.11 module and the
/// real kwctl 1.35 (the real tools) instead of the rig: every outcome (the image stored, or a
/// refusal) is the rig's.
#[test]
fn the_chain_is_the_real_verifiers() {
    let Some(tools) = RealTools::find("the_chain_is_the_real_verifiers") else {
        return;
    };
    let verifier_wasm = tools.bin("verify-image-signatures.wasm");
    let swapper_wasm = tools.annotated_policy();
    for signer in [
        Signer::generate(),
        Signer::with_certificate("release@example.com"),
    ] {
        let world = World::start("sig-chain", signer);
        let sources = world.insecure_sources("sig-chain");
        let by_source = vec![world.rule(&format!("{}/org/*", world.source.host))];
        let everything = vec![world.rule("*")];
        for copied in [false, true] {
            if copied {
                world.copy_signature();
            }
            for order in [Order::SwapperFirst, Order::VerifierFirst] {
                for rules in [&by_source, &everything] {
                    for signatures in [false, true] {
                        for tag in ["unsigned", "signed"] {
                            let image = world.image(tag);
                            let swapper_settings = world.swapper_settings(signatures);
                            let verifier_settings = json!({"signatures": rules});
                            let real = kwctl_chain(
                                &tools,
                                order,
                                (&verifier_wasm, &verifier_settings),
                                (&swapper_wasm, &swapper_settings),
                                &image,
                                &sources,
                            );
                            let ours = admit(&world, order, rules, signatures, &image);
                            println!(
                                "{order:?} copied={copied} signatures={signatures} {} {tag}: {real:?}",
                                rules[0]["image"]
                            );
                            assert_eq!(
                                real.is_ok(),
                                ours.is_ok(),
                                "{order:?} {tag}: real {real:?}, rig {ours:?}"
                            );
                            if let (Ok(real), Ok(ours)) = (&real, &ours) {
                                assert_eq!(real, ours, "{order:?} {tag}");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// An image written under the mirror's name, whose source is unsigned and which the mirror
/// does not hold, under the real kwctl and verify-image-signatures 1.0.11: a verifier first
/// (rules on the sources) admits the mirror's name it does not match, and the swapper, with its
/// default `keep` fallbacks, must refuse it rather than write the unsigned source back, which
/// no verifier would see. Both orders, rules on the sources and on `*`: refused, as the verifier
/// alone refuses the source; the signed image's mirror spelling is admitted pinned to its
/// verified digest.
#[test]
fn a_mirror_spelling_of_an_unsigned_image_is_refused_in_both_orders_under_the_real_verifier() {
    let Some(tools) = RealTools::find(
        "a_mirror_spelling_of_an_unsigned_image_is_refused_in_both_orders_under_the_real_verifier",
    ) else {
        return;
    };
    let verifier_wasm = tools.bin("verify-image-signatures.wasm");
    let swapper_wasm = tools.annotated_policy();
    let world = World::start("sig-late", Signer::generate());
    world.copy_signature();
    let sources = world.insecure_sources("sig-late");
    let mut rows = 0;
    for rule in [
        world.rule(&format!("{}/org/*", world.source.host)),
        world.rule("*"),
    ] {
        let rules = vec![rule];
        let verifier_settings = json!({"signatures": rules});
        let swapper_settings = world.swapper_settings(true);
        for order in [Order::VerifierFirst, Order::SwapperFirst] {
            for (tag, digest) in [("unsigned", &world.unsigned), ("signed", &world.signed)] {
                let image = Spelling::Mirror.of(&world, tag, digest);
                let real = kwctl_chain(
                    &tools,
                    order,
                    (&verifier_wasm, &verifier_settings),
                    (&swapper_wasm, &swapper_settings),
                    &image,
                    &sources,
                );
                let row = format!("{order:?}, rule {}, {image}: {real:?}", rules[0]["image"]);
                println!("{row}");
                rows += 1;
                match tag {
                    "unsigned" => assert!(real.is_err(), "admitted: {row}"),
                    _ => assert!(
                        real.as_deref()
                            .is_ok_and(|stored| stored.ends_with(digest.as_str())),
                        "{row}"
                    ),
                }
                assert_eq!(
                    real.is_ok(),
                    admit_with(order, &rules, &swapper_settings, &image).is_ok(),
                    "the rig differs: {row}"
                );
            }
        }
    }
    assert_eq!(rows, 8);
}

/// The rig's answers to `v2/verify` are real kwctl's, to the letter: each request below is
/// answered by kwctl (its session records the host's text) and by the rig's host, and the two
/// are compared whole (kwctl 1.35 of the real tools).
#[test]
fn verification_texts_are_kwctls() {
    let Some(tools) = RealTools::find("verification_texts_are_kwctls") else {
        return;
    };
    let world = World::start("sig-texts", Signer::generate());
    world.copy_signature();
    let stranger = Signer::generate();
    let certified = Signer::with_certificate("other@example.com");
    let cases = [
        ("no signature tag", world.swapper_settings(true), "unsigned"),
        ("signed", world.swapper_settings(true), "signed"),
        (
            "the mirror lacks the image",
            world.swapper_settings(true),
            "absent",
        ),
        (
            "another key",
            json!({"mirrors": [{"source": world.source.host, "target": format!("{}/cache", world.mirror.host)}], "signatures": [{"image": "*", "pubKeys": [stranger.public_pem]}]}),
            "signed",
        ),
        (
            "annotations the signature lacks",
            json!({"mirrors": [{"source": world.source.host, "target": format!("{}/cache", world.mirror.host)}], "signatures": [{"image": "*", "pubKeys": [world.signer.public_pem], "annotations": {"env": "prod"}}]}),
            "signed",
        ),
        (
            "another certificate",
            json!({"mirrors": [{"source": world.source.host, "target": format!("{}/cache", world.mirror.host)}], "signatures": [{"image": "*", "certificates": [certified.certificate_pem], "certificateChain": [certified.chain_pem], "requireRekorBundle": false}]}),
            "signed",
        ),
    ];
    for (name, settings, tag) in &cases {
        let image = world.image(tag);
        let case = format!("sig-texts-{}", name.replace(' ', "-"));
        record_case(&tools, &world, &case, settings, &image);
        let dir = rig::root().join("e2e/cases").join(&case);
        let session = std::fs::read_to_string(dir.join("session.yml")).expect("session");
        let _ = std::fs::remove_dir_all(&dir);
        let kwctl_host = rig::hosts::ReplayHost::parse(&session).expect("session");
        let mut rig_host = LiveHost::default();
        for exchange in kwctl_host.pending() {
            let Some(fields) = &exchange.fields else {
                continue;
            };
            let mut request = fields.clone();
            request["type"] = json!(exchange.tag);
            let ours = rig::wapc::Host::call(
                &mut rig_host,
                "kubewarden",
                "oci",
                "v2/verify",
                request.to_string().as_bytes(),
            )
            .map(String::from_utf8)
            .map(Result::unwrap_or_default);
            println!("{name}: kwctl {:?}\n{name}: rig {ours:?}", exchange.answer);
            match (&ours, &exchange.answer) {
                // kwctl records an error's Display, the first part of the anyhow chain the
                // guest gets from policy-server: ours must be that, then only its causes.
                (Err(ours), Err(recorded)) => {
                    let rest = ours.strip_prefix(recorded.as_str());
                    assert!(
                        rest.is_some_and(
                            |rest| rest.is_empty() || rest.starts_with("\n\nCaused by:")
                        ),
                        "{name}: rig {ours:?}, kwctl {recorded:?}"
                    );
                }
                _ => assert_eq!(&ours, &exchange.answer, "{name}"),
            }
        }
    }
}

/// Records the e2e cases of `signatures` with real kwctl: swapped once the signature is in the
/// mirror (by key, by certificate, and pinned as a verifier that runs first leaves the image),
/// kept or refused while it is not, and kept when the mirror's tag names another digest than
/// the one signed. It rewrites the committed cases, so it runs only by hand: `cargo test --test
/// signatures record_signature_cases -- --ignored` (with the real tools).
#[test]
#[ignore = "rewrites e2e/cases/signatures-*: run by hand"]
fn record_signature_cases() {
    let tools = RealTools::find("record_signature_cases").expect("the real tools");
    // Verified at the mirror, as these cases were recorded: verification at the source has
    // the unit tests and the rig's tables.
    let mirror_mode = |mut settings: Value| {
        settings["verifySource"] = json!(false);
        settings
    };
    let keyed = World::start("e2e-sig-key", Signer::generate());
    let settings = keyed.swapper_settings(true);
    let settings = mirror_mode(settings);
    let mut rejecting = settings.clone();
    rejecting["onUnverified"] = json!("reject");
    let signed = keyed.image("signed");
    record_case(
        &tools,
        &keyed,
        "signatures-unverified-kept",
        &settings,
        &signed,
    );
    record_case(
        &tools,
        &keyed,
        "signatures-unverified-rejected",
        &rejecting,
        &signed,
    );
    record_case(
        &tools,
        &keyed,
        "signatures-unsigned-kept",
        &settings,
        &keyed.image("unsigned"),
    );
    keyed.copy_signature();
    record_case(
        &tools,
        &keyed,
        "signatures-verified-swapped",
        &settings,
        &signed,
    );
    let pinned = format!("{signed}@{}", keyed.signed);
    record_case(
        &tools,
        &keyed,
        "signatures-pinned-by-verifier-swapped",
        &settings,
        &pinned,
    );

    let certified = World::start(
        "e2e-sig-cert",
        Signer::with_certificate("release@example.com"),
    );
    certified.copy_signature();
    let settings = certified.swapper_settings(true);
    let settings = mirror_mode(settings);
    record_case(
        &tools,
        &certified,
        "signatures-certificate-swapped",
        &settings,
        &certified.image("signed"),
    );

    let other = World::start("e2e-sig-other", Signer::generate());
    other.copy_signature();
    Image::new("another build", "linux/amd64").push(
        &other.mirror,
        &format!("cache/{REPOSITORY}"),
        Some("signed"),
    );
    let settings = other.swapper_settings(true);
    let settings = mirror_mode(settings);
    record_case(
        &tools,
        &other,
        "signatures-other-digest-kept",
        &settings,
        &other.image("signed"),
    );
}

/// The rig's host keeps the cosign connection as the real policy-server 1.35 does: measured
/// against it (`model_vs_host` `repeated_verifications_host_and_model`, 50 ms), after a
/// registry's first verification the host opened no connection there, and an unsigned image
/// admitted again cost two requests, `GET /v2/` and the signature manifest (the failed
/// verification is asked again, the copy's digest for `signatureCopy` answered from the 60 s
/// cache). The same here, through the 1.35 model's process and its proxy.
#[test]
fn a_failed_verification_asked_again_keeps_its_connection() {
    use rig::hosts::PolicyServer as ModelServer;
    use rig::proxy::{HostModel, LatencyProxy, Transport};
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    let world = World::start("sig-again", Signer::generate());
    let unsigned = Image::new("sig-again unsigned", "linux/amd64");
    let digest = unsigned.push(&world.mirror, &format!("cache/{REPOSITORY}"), Some("u0"));
    let far = LatencyProxy::start_as(
        &world.mirror.host,
        Duration::from_millis(5),
        HostModel::V1_35,
        Transport::Https,
    )
    .expect("proxy");
    let mut settings = world.swapper_settings_at_mirror();
    settings["mirrors"][0]["target"] = json!(format!("{}/cache", far.host));
    rig::policy();
    let process = ModelServer::for_model(LiveHost::default(), HostModel::V1_35);
    let first = validate(&settings, &pod(&world.image("u0")), process.evaluation());
    assert!(first.accepted, "kept: {first:?}");
    let (connections, seen) = (far.connections.load(Ordering::Relaxed), far.seen().len());
    let again = validate(&settings, &pod(&world.image("u0")), process.evaluation());
    assert_eq!(again.image("containers", 0), first.image("containers", 0));
    assert_eq!(
        far.connections.load(Ordering::Relaxed) - connections,
        0,
        "no new connection for the verification asked again: {:?}",
        far.seen()
    );
    assert_eq!(
        far.seen()[seen..].to_vec(),
        vec![
            "GET /v2/".to_string(),
            format!(
                "GET /v2/cache/{REPOSITORY}/manifests/{}",
                signature_tag(&digest)
            ),
        ],
        "what the second admission asked"
    );
}
