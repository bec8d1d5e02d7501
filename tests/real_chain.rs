//! The real admission chain: kube-apiserver 1.36 calls policy-server 1.35 over TLS (a
//! MutatingWebhookConfiguration whose `clientConfig.url` is the policy's `/validate/<id>`, its
//! certificate as `caBundle`), which runs the built module (annotated by the real kwctl) against
//! registries on loopback. Each scenario is asserted on what the API server stored (`kubectl get
//! pod -o json`) and what kubectl printed. The tools come from `scripts/real-tools.sh`; without
//! them each test says it did not run (and fails under `CI=true`).

mod rig;

use std::path::PathBuf;

use rig::chain::{self, Entry, Webhook, apply, pod};
use rig::images::Image;
use rig::registry::TestRegistry;
use rig::tools::{PolicyServer, PolicyServerOptions, RealTools};
use serde_json::{Value, json};

const ORIGINAL_IMAGES: &str = "image-swapper.kubewarden.io/original-images";
const UNMIRRORED_IMAGES: &str = "image-swapper.kubewarden.io/unmirrored-images";
const UNMIRRORED: &str = "image-swapper.kubewarden.io/unmirrored";

/// A source registry and its mirror, both plain HTTP on loopback, routed
/// `<source>` -> `<mirror>/cache`.
struct Registries {
    source: TestRegistry,
    mirror: TestRegistry,
}

impl Registries {
    fn start(name: &str) -> Registries {
        Registries {
            source: TestRegistry::start(&format!("{name}-source")).expect("registry"),
            mirror: TestRegistry::start(&format!("{name}-mirror")).expect("registry"),
        }
    }

    /// `<source>/<repository>:<tag>`.
    fn image(&self, repository: &str, tag: &str) -> String {
        format!("{}/{repository}:{tag}", self.source.host)
    }

    /// What the swap writes for it: `<mirror>/cache/<repository>:<tag>@<digest>`.
    fn mirror_image(&self, repository: &str, tag: &str, digest: &str) -> String {
        format!("{}/cache/{repository}:{tag}@{digest}", self.mirror.host)
    }

    fn settings(&self) -> Value {
        json!({"mirrors": [{"source": self.source.host,
            "target": format!("{}/cache", self.mirror.host)}]})
    }

    fn sources(&self) -> String {
        chain::insecure_sources(&[&self.source.host, &self.mirror.host])
    }
}

/// `skopeo copy --all --preserve-digests`, the fill job's copy, between plain-HTTP registries.
fn skopeo_copy(from: &str, to: &str) {
    let status = std::process::Command::new("skopeo")
        .args(["copy", "--all", "--preserve-digests"])
        .args(["--src-tls-verify=false", "--dest-tls-verify=false"])
        .arg(format!("docker://{from}"))
        .arg(format!("docker://{to}"))
        .status()
        .expect("skopeo");
    assert!(status.success(), "skopeo copy {from} {to}");
}

fn swapper(tools: &RealTools) -> PathBuf {
    tools.annotated_policy()
}

/// a, b, c: a Pod swapped and pinned with its original recorded; a Pod whose image the mirror
/// lacks kept, with its record and a warning; the record's copy made as the fill job makes it,
/// and the next Pod of that image swapped, nothing restarted (policy-server keeps no failure).
#[test]
fn swapped_kept_with_its_record_then_swapped_once_the_mirror_is_filled() {
    let Some(tools) = RealTools::find("real_chain::swapped_kept_with_its_record") else {
        return;
    };
    let plane = chain::shared_plane(&tools);
    let registries = Registries::start("chain-swap");
    let web = Image::new("chain web", "linux/amd64");
    let web_digest = web.push(&registries.source, "org/web", Some("1"));
    web.push(&registries.mirror, "cache/org/web", Some("1"));
    let api = Image::new("chain api", "linux/amd64");
    let api_digest = api.push(&registries.source, "org/api", Some("1"));
    let sources = registries.sources();
    let server = PolicyServer::start(
        &tools,
        &chain::policies_yml(
            &tools,
            &[Entry::new(
                "image-swapper",
                &swapper(&tools),
                registries.settings(),
            )],
        ),
        PolicyServerOptions {
            sources: Some(&sources),
            ..PolicyServerOptions::default()
        },
    );
    chain::namespaces(&plane, &["swap"]);
    Webhook {
        name: "clusterwide-image-swapper",
        server: &server,
        policy: "image-swapper",
        namespaces: &["swap"],
        failure_policy: "Fail",
        timeout_seconds: 10,
    }
    .install(&plane);

    // a. Swapped and pinned to the digest the mirror holds, the original recorded, no warning.
    let web_image = registries.image("org/web", "1");
    let swapped = apply(&plane, &pod("swap", "web", &web_image));
    assert_eq!(
        swapped.image(0),
        registries.mirror_image("org/web", "1", &web_digest),
        "{swapped:?}"
    );
    assert_eq!(
        swapped.json_annotation(ORIGINAL_IMAGES),
        Some(json!({"web": web_image})),
        "original recorded"
    );
    assert!(swapped.warnings.is_empty(), "{:?}", swapped.warnings);
    assert_eq!(swapped.label(UNMIRRORED), None);

    // b. The mirror lacks it: kept as written, the Pod labelled, the record naming the source,
    // the mirror image wanted and the copy; kubectl prints why.
    let api_image = registries.image("org/api", "1");
    let kept = apply(&plane, &pod("swap", "api", &api_image));
    assert_eq!(kept.image(0), api_image, "kept");
    assert_eq!(kept.label(UNMIRRORED), Some("true"), "{kept:?}");
    let record = kept.json_annotation(UNMIRRORED_IMAGES).expect("the record");
    let wanted = format!("{}/cache/org/api:1", registries.mirror.host);
    assert_eq!(record["web"]["source"], json!(api_image), "{record}");
    assert_eq!(record["web"]["mirror"], json!(wanted), "{record}");
    assert!(
        record["web"]["copy"]
            .as_str()
            .is_some_and(|copy| copy.contains("skopeo copy")),
        "{record}"
    );
    assert!(
        kept.warned(&format!("image \"{api_image}\": kept")) && kept.warned(&wanted),
        "{:?}",
        kept.warnings
    );
    assert_eq!(kept.annotation(ORIGINAL_IMAGES), None, "nothing swapped");

    // c. The fill job's copy, from the record's source to the record's mirror image; the next
    // Pod of that image is swapped at once, with no restart of anything.
    skopeo_copy(
        record["web"]["source"].as_str().expect("source"),
        record["web"]["mirror"].as_str().expect("mirror"),
    );
    let filled = apply(&plane, &pod("swap", "api-2", &api_image));
    assert_eq!(
        filled.image(0),
        registries.mirror_image("org/api", "1", &api_digest),
        "{filled:?}"
    );
    assert_eq!(filled.label(UNMIRRORED), None);
    assert!(filled.warnings.is_empty(), "{:?}", filled.warnings);
}
