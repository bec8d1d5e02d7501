//! The real admission chain: kube-apiserver 1.36 calls policy-server 1.35 over TLS (a
//! MutatingWebhookConfiguration whose `clientConfig.url` is the policy's `/validate/<id>`, its
//! certificate as `caBundle`), which runs the built module (annotated by the real kwctl) against
//! registries on loopback. Each scenario is asserted on what the API server stored (`kubectl get
//! pod -o json`) and what kubectl printed. The tools come from `scripts/real-tools.sh`; without
//! them each test says it did not run (and fails under `CI=true`).

mod rig;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rig::chain::{self, Entry, Webhook, apply, pod};
use rig::hanging::HangingRegistry;
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

/// d. A mirror that hangs (accepts, never answers) is contained as the docs advise: the policy
/// on a policy-server of its own, its webhook `failurePolicy: Ignore` with `timeoutSeconds: 3`.
/// Its Pod is admitted unchanged once the API server gives up; a Pod for the policy on another
/// policy-server is swapped while that admission still waits; and a second policy on the hung
/// policy-server, whose mirror is healthy, waits out its timeout too (the host's lookup lock is
/// process-wide), which is why the hanging one needs a policy-server of its own.
#[test]
fn a_hung_registry_is_contained_by_a_policy_server_of_its_own() {
    let Some(tools) = RealTools::find("real_chain::a_hung_registry_is_contained") else {
        return;
    };
    let plane = chain::shared_plane(&tools);
    let registries = Registries::start("chain-hang");
    let web = Image::new("chain hang web", "linux/amd64");
    let web_digest = web.push(&registries.source, "org/web", Some("1"));
    web.push(&registries.mirror, "cache/org/web", Some("1"));
    // Longer than the whole test: the hung lookup holds its policy-server until it is dropped.
    let hanging = HangingRegistry::start(Duration::from_secs(120)).expect("hanging registry");
    let hung_settings = json!({"mirrors": [{"source": registries.source.host,
        "target": format!("{}/cache", hanging.host)}]});
    let sources = chain::insecure_sources(&[
        &registries.source.host,
        &registries.mirror.host,
        &hanging.host,
    ]);
    let module = swapper(&tools);
    let (hung_server, healthy_server) = std::thread::scope(|scope| {
        let hung = scope.spawn(|| {
            PolicyServer::start(
                &tools,
                &chain::policies_yml(
                    &tools,
                    &[
                        Entry::new("image-swapper-hung", &module, hung_settings.clone()),
                        Entry::new("neighbour", &module, registries.settings()),
                    ],
                ),
                PolicyServerOptions {
                    sources: Some(&sources),
                    ..PolicyServerOptions::default()
                },
            )
        });
        let healthy = scope.spawn(|| {
            PolicyServer::start(
                &tools,
                &chain::policies_yml(
                    &tools,
                    &[Entry::new("image-swapper", &module, registries.settings())],
                ),
                PolicyServerOptions {
                    sources: Some(&sources),
                    ..PolicyServerOptions::default()
                },
            )
        });
        (
            hung.join().expect("hung policy-server"),
            healthy.join().expect("healthy policy-server"),
        )
    });
    chain::namespaces(&plane, &["hang", "hang-neighbour", "hang-healthy"]);
    for (name, server, policy, namespace) in [
        (
            "clusterwide-image-swapper-hung",
            &hung_server,
            "image-swapper-hung",
            "hang",
        ),
        (
            "clusterwide-neighbour",
            &hung_server,
            "neighbour",
            "hang-neighbour",
        ),
        (
            "clusterwide-image-swapper",
            &healthy_server,
            "image-swapper",
            "hang-healthy",
        ),
    ] {
        Webhook {
            name,
            server,
            policy,
            namespaces: &[namespace],
            failure_policy: "Ignore",
            timeout_seconds: HUNG_TIMEOUT_SECONDS,
        }
        .install(&plane);
    }

    let image = registries.image("org/web", "1");
    let hung_pod = pod("hang", "web", &image);
    let in_flight = std::thread::scope(|scope| {
        let hung = scope.spawn(|| apply(&plane, &hung_pod));
        // The hung policy's lookup has reached the hanging mirror.
        let started = Instant::now();
        while hanging.connections() == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no lookup reached the hanging mirror:\n{}",
                hung_server.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let healthy = apply(&plane, &pod("hang-healthy", "web", &image));
        let still_waiting = !hung.is_finished();
        let neighbour = apply(&plane, &pod("hang-neighbour", "web", &image));
        (
            hung.join().expect("hung apply"),
            healthy,
            still_waiting,
            neighbour,
        )
    });
    let (hung, healthy, still_waiting, neighbour) = in_flight;
    println!(
        "hung: {:?}, healthy policy-server: {:?}, neighbour on the hung policy-server: {:?}",
        hung.took, healthy.took, neighbour.took
    );
    // The other policy-server answered, and swapped, while the hung admission waited.
    assert_eq!(
        healthy.image(0),
        registries.mirror_image("org/web", "1", &web_digest),
        "{healthy:?}"
    );
    assert!(
        still_waiting,
        "the hung admission had returned before the other policy-server answered: {hung:?}"
    );
    // The API server gave up on both policies of the hung policy-server after their
    // `timeoutSeconds` and admitted the Pods as written (`Ignore`): nothing of the policy's.
    for (what, applied) in [("hung", &hung), ("neighbour", &neighbour)] {
        assert_eq!(applied.image(0), image, "{what}: {applied:?}");
        assert_eq!(applied.annotation(ORIGINAL_IMAGES), None, "{what}");
        assert_eq!(applied.label(UNMIRRORED), None, "{what}");
        assert!(
            applied.warnings.is_empty(),
            "{what}: {:?}",
            applied.warnings
        );
        assert!(
            applied.took >= Duration::from_secs(HUNG_TIMEOUT_SECONDS.into()),
            "{what}: admitted after {:?}, before the webhook's timeout: not the API server's \
             timeout but an answer",
            applied.took
        );
    }
}

/// The webhook timeout of the hung registry's scenario.
const HUNG_TIMEOUT_SECONDS: u32 = 3;
