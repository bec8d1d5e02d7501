//! The ECR repositories `fill-mirror once --ecr-create-repositories` makes and fills, the real
//! binary and skopeo against ECR's API (moto's server) and the rig's ECR registry front (on
//! Debian's `docker-registry`), the sources 20 ms away through the latency proxy: repositories in
//! k8s-image-swapper's default layout at the registry's root (`docker.io/library/nginx`), and
//! tag immutability that still lets a re-signed image's signature tag follow its source
//! (`IMMUTABLE_WITH_EXCLUSION`, the signature tags excluded), where plain `IMMUTABLE` refuses it.

mod rig;

#[allow(dead_code)] // the record's reading half is the prune's
#[path = "../src/in_use_set.rs"]
mod in_use_set;

use std::path::Path;
use std::time::Duration;

use rig::ecr::{EcrRegistry, Moto};
use rig::images::{Artifact, Image};
use rig::proxy::LatencyProxy;
use rig::registry::{TestRegistry, basic_auth};
use rig::{fill_mirror, mirror_by_hand, pod_recorded_by_hand, text, write_json};
use serde_json::{Value, json};

/// The sources' distance.
const AWAY: Duration = Duration::from_millis(20);

/// The environment variables of registry access the binary reads, cleared so that the test's
/// own environment cannot lend it anything.
const ACCESS_ENV: [&str; 6] = [
    "REGISTRY_AUTH_FILE",
    "FILL_MIRROR_ECR_REGISTRIES",
    "KUBEWARDEN_SOURCES_PATH",
    "AWS_ENDPOINT_URL_ECR",
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
];

/// ECR as the tests reach it: moto's API, the registry front, its storage.
struct Ecr {
    moto: Moto,
    front: EcrRegistry,
    storage: TestRegistry,
}

impl Ecr {
    fn start(name: &str) -> Ecr {
        let storage = TestRegistry::start(name).expect("storage registry");
        let moto = Moto::start().expect("moto_server (scripts/ensure-python-tools.sh)");
        let front = EcrRegistry::start(&storage, &moto).expect("ECR front");
        Ecr {
            moto,
            front,
            storage,
        }
    }

    /// `fill-mirror once --insecure --ecr-registry FRONT --ecr-create-repositories ARGS` over
    /// Pods of `images`, each recorded as lacking its image under `rules`: its exit code and
    /// everything it printed.
    fn fill(&self, dir: &Path, rules: &Value, images: &[&str], args: &[&str]) -> (i32, String) {
        let settings = json!({ "mirrors": rules });
        // Each record written by hand.
        let items: Vec<Value> = images
            .iter()
            .enumerate()
            .map(|(i, image)| {
                pod_recorded_by_hand(&format!("p{i}"), image, &mirror_by_hand(rules, image))
            })
            .collect();
        write_json(&dir.join("pods.json"), &json!({"items": items}));
        write_json(&dir.join("settings.json"), &settings);
        let mut command = fill_mirror();
        command
            .arg("once")
            .arg("--pods")
            .arg(dir.join("pods.json"))
            .arg("--settings")
            .arg(dir.join("settings.json"))
            .args(["--insecure", "--ecr-registry", &self.front.host])
            .arg("--ecr-create-repositories")
            .args(args)
            .args(["--log-format", "text"]);
        for name in ACCESS_ENV {
            command.env_remove(name);
        }
        command.envs(self.moto.environment());
        let output = command.output().expect("run fill-mirror");
        (
            output.status.code().unwrap_or(-1),
            format!("{}\n{}", text(&output.stdout), text(&output.stderr)),
        )
    }
}

/// `sha256:<hex>` -> cosign's signature tag for it, `sha256-<hex>.sig`.
fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replacen(':', "-", 1))
}

/// k8s-image-swapper's default layout: the mirror is the registry's root and each repository
/// is the source's host and path (`nginx` -> `ACCOUNT.dkr.ecr.REGION.amazonaws.com/docker.io/
/// library/nginx`). The rig's sources are `127.0.0.1:PORT`, a host `defaultMirror` cannot put in
/// a path (it refuses a port), so each stands in for a registry host by a rule whose target is
/// that host's folder at the ECR front's root: the destinations are those `defaultMirror` gives
/// for `docker.io/library/nginx` and `quay.io/org/app`. The repositories are created under
/// those names, `IMMUTABLE_WITH_EXCLUSION` with the signature tags excluded, scan on push, and
/// the images copied into them.
#[test]
fn repositories_in_k8s_image_swapper_s_root_layout_are_created_and_filled() {
    let source = TestRegistry::start("ecr-root-src").expect("source registry");
    let docker_hub = LatencyProxy::network(&source.host, AWAY).expect("latency proxy");
    let quay = LatencyProxy::network(&source.host, AWAY).expect("latency proxy");
    let ecr = Ecr::start("ecr-root-storage");
    let nginx =
        Image::new("nginx 1.27", "linux/amd64").push(&source, "library/nginx", Some("1.27"));
    let app = Image::new("quay app 2", "linux/amd64").push(&source, "org/app", Some("2"));
    let root = &ecr.front.host;
    let rules = json!([
        {"source": docker_hub.host, "target": format!("{root}/docker.io")},
        {"source": quay.host, "target": format!("{root}/quay.io")},
    ]);
    let dir = tempfile::tempdir().expect("dir");

    let (code, printed) = ecr.fill(
        dir.path(),
        &rules,
        &[
            &format!("{}/library/nginx:1.27", docker_hub.host),
            &format!("{}/org/app:2", quay.host),
        ],
        &[],
    );

    assert_eq!(code, 0, "{printed}");
    assert!(
        printed.contains("fill-mirror: 2 copied, 0 failed, 0 skipped, 0 gone, 0 refused"),
        "{printed}"
    );
    for (repository, digest, tag) in [
        ("docker.io/library/nginx", &nginx, "1.27"),
        ("quay.io/org/app", &app, "2"),
    ] {
        assert!(
            printed.contains(&format!("created ECR repository {repository}")),
            "{printed}"
        );
        let made = ecr.moto.repository(repository).expect("created");
        assert_eq!(
            (
                &made["imageTagMutability"],
                &made["imageTagMutabilityExclusionFilters"],
                &made["imageScanningConfiguration"]["scanOnPush"],
            ),
            (
                &json!("IMMUTABLE_WITH_EXCLUSION"),
                &json!([{"filterType": "WILDCARD", "filter": "sha256-*.sig"},
                    {"filterType": "WILDCARD", "filter": "sha256-*.att"},
                    {"filterType": "WILDCARD", "filter": "sha256-*.sbom"}]),
                &json!(true),
            ),
            "{made}"
        );
        assert_eq!(
            ecr.storage.digest_of(repository, tag),
            Some(digest.clone()),
            "{repository}"
        );
    }
}

/// An image copied with its cosign signature, then re-signed at the source (a key rotation: the
/// signature tag now names another manifest). In a repository made `IMMUTABLE_WITH_EXCLUSION`
/// (the default) the next run copies the new signature over the old one; in a plain `IMMUTABLE`
/// one ECR refuses the moved tag (`TAG_INVALID`), the run fails naming it, and the mirror keeps
/// the old signature. The image tag itself stays immutable in both: ECR refuses to move it.
#[rstest::rstest]
#[case::immutable_with_exclusion("ecr-resign-excl", "IMMUTABLE_WITH_EXCLUSION", true)]
#[case::immutable("ecr-resign-imm", "IMMUTABLE", false)]
fn a_re_signed_image_s_signature_follows_unless_every_tag_is_immutable(
    #[case] name: &str,
    #[case] mutability: &str,
    #[case] follows: bool,
) {
    let source = TestRegistry::start(&format!("{name}-src")).expect("source registry");
    let far = LatencyProxy::network(&source.host, AWAY).expect("latency proxy");
    let ecr = Ecr::start(&format!("{name}-storage"));
    let digest = Image::new("signed web", "linux/amd64").push(&source, "app/web", Some("1"));
    let sig = signature_tag(&digest);
    let first = Artifact::new("signature by the first key").push(&source, "app/web", &sig);
    let rules = json!([{"source": far.host, "target": format!("{}/docker.io", ecr.front.host)}]);
    let image = format!("{}/app/web:1", far.host);
    let repository = "docker.io/app/web";
    let dir = tempfile::tempdir().expect("dir");
    let args = ["--ecr-image-tag-mutability", mutability];

    let (code, printed) = ecr.fill(dir.path(), &rules, &[&image], &args);
    assert_eq!(code, 0, "{printed}");
    assert_eq!(
        ecr.moto.repository(repository).expect("created")["imageTagMutability"],
        json!(mutability)
    );
    assert_eq!(ecr.storage.digest_of(repository, &sig), Some(first.clone()));

    let resigned = Artifact::new("signature by the rotated key").push(&source, "app/web", &sig);
    assert_ne!(resigned, first);
    let (code, printed) = ecr.fill(dir.path(), &rules, &[&image], &args);

    let held = ecr.storage.digest_of(repository, &sig);
    if follows {
        assert_eq!(code, 0, "{printed}");
        assert_eq!(held, Some(resigned), "{printed}");
    } else {
        assert_ne!(code, 0, "{printed}");
        assert!(
            printed.contains(&format!(
                "The image tag '{sig}' already exists in the '{repository}' repository and cannot be overwritten because the tag is immutable."
            )),
            "{printed}"
        );
        assert_eq!(held, Some(first), "{printed}");
    }
    assert_eq!(ecr.storage.digest_of(repository, "1"), Some(digest.clone()));
    // A manifest PUT through the front: its status and, refused, the body.
    let put = |tag: &str, media_type: &str, bytes: &[u8]| -> (u16, String) {
        let answer = ureq::put(&format!(
            "http://{}/v2/{repository}/manifests/{tag}",
            ecr.front.host
        ))
        .set(
            "Authorization",
            &basic_auth("AWS", &EcrRegistry::password()),
        )
        .set("Content-Type", media_type)
        .send_bytes(bytes);
        match answer {
            Ok(answer) => (answer.status(), String::new()),
            Err(ureq::Error::Status(code, answer)) => {
                (code, answer.into_string().unwrap_or_default())
            }
            Err(error) => (0, error.to_string()),
        }
    };
    let refused = |what: &str, (code, body): (u16, String)| {
        assert!(
            code == 400 && body.contains("\"code\":\"TAG_INVALID\""),
            "{what}: {code} {body}"
        );
    };
    let another = Artifact::new("another image").manifest;
    // The image tag moved by hand: ECR's answer, whatever the exclusions.
    refused(
        "moving the image tag",
        put("1", "application/vnd.oci.image.manifest.v1+json", &another),
    );
    // The watch's anchor (`inuse-<cluster>-<hex>`: the same manifest under a tag naming its own
    // digest) is put, and put again each period, under either mutability, needing no exclusion
    // filter; moved to another manifest it is refused as any immutable tag.
    let anchor = in_use_set::anchor_tag("prod", &digest).expect("a sha256 digest");
    let held = ureq::get(&format!(
        "http://{}/v2/{repository}/manifests/{digest}",
        ecr.storage.host
    ))
    .set("Accept", "application/vnd.oci.image.manifest.v1+json")
    .call()
    .expect("the copied manifest");
    let media_type = held.content_type().to_string();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut held.into_reader(), &mut bytes).expect("manifest bytes");
    for period in ["first", "next"] {
        let (code, body) = put(&anchor, &media_type, &bytes);
        assert_eq!(code, 201, "the {period} anchor PUT: {body}");
    }
    assert_eq!(ecr.storage.digest_of(repository, &anchor), Some(digest));
    refused(
        "moving the anchor",
        put(
            &anchor,
            "application/vnd.oci.image.manifest.v1+json",
            &another,
        ),
    );
}
