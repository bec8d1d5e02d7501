//! A rule whose target is a pull-through cache (`pullThrough: true`) is warmed, not copied: the
//! fill job asks the cache for the manifest (by the source's tag) and the cache fetches it from
//! its upstream. The cache is Debian's `docker-registry` in proxy mode (`proxy.remoteurl`), its
//! upstream a plain registry 20 ms away through the latency proxy. A proxy-mode registry refuses
//! every push, so a copy where a warming belongs fails, and an image the cache holds once its
//! upstream is stopped is one the warming made it fetch: pulled whole from the cache with the
//! upstream gone, every platform's manifest and every layer, as a node would pull it.
//!
//! A warming pulls the platforms the nodes run (`--nodes`, as `kubectl get nodes -o json`
//! writes them) and writes nothing: the runs that show it have a read-only TMPDIR. What the
//! cache asked its upstream is read from the latency proxy between them.

mod rig;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rig::images::{DOCKER_MANIFEST, Image, Index};
use rig::plane::{ControlPlane, find_tools};
use rig::proxy::LatencyProxy;
use rig::pull_through::TagFilledCache;
use rig::read_only::run_with_read_only_tmpdir;
use rig::registry::{TestRegistry, sha256};
use rig::{fill_mirror, pod_with_entry_by_hand, run, text, write_json};
use serde_json::{Value, json};

/// The upstream's distance from the cache.
const AWAY: Duration = Duration::from_millis(20);

struct Chain {
    upstream: TestRegistry,
    /// The cache reaches its upstream through it; it saw every request.
    far: LatencyProxy,
    cache: TestRegistry,
    dir: tempfile::TempDir,
}

impl Chain {
    fn start(name: &str) -> Chain {
        let upstream = TestRegistry::start(&format!("{name}-upstream")).expect("upstream");
        let far = LatencyProxy::network(&upstream.host, AWAY).expect("latency proxy");
        let cache = TestRegistry::start_proxy(&format!("{name}-cache"), &far.host).expect("cache");
        Chain {
            upstream,
            far,
            cache,
            dir: tempfile::tempdir().expect("dir"),
        }
    }

    /// Settings routing the upstream's images to the cache, its layout as distribution's proxy
    /// keeps it (the upstream's paths at the cache's root); the rule marked `pullThrough`
    /// unless `marked` is false.
    fn settings(&self, marked: bool) -> Value {
        let mut rule = json!({"source": self.upstream.host, "target": self.cache.host});
        if marked {
            rule["pullThrough"] = json!(true);
        }
        json!({"mirrors": [rule]})
    }

    /// `fill-mirror ARGS --pods --settings` over Pods recorded as lacking `images`, one each.
    fn fill(&self, mode: &str, settings: &Value, images: &[&str]) -> (Option<i32>, String) {
        self.fill_with(mode, settings, images, &[], None)
    }

    /// [`Chain::fill`] with more arguments, and TMPDIR a read-only folder when one is given.
    fn fill_with(
        &self,
        mode: &str,
        settings: &Value,
        images: &[&str],
        more: &[&str],
        read_only_tmpdir: Option<&Path>,
    ) -> (Option<i32>, String) {
        let items: Vec<Value> = images
            .iter()
            .enumerate()
            .map(|(i, image)| pod_with_entry_by_hand(&format!("p{i}"), image, &settings["mirrors"]))
            .collect();
        let pods = self.dir.path().join("pods.json");
        let settings_path = self.dir.path().join("settings.json");
        write_json(&pods, &json!({"items": items}));
        write_json(&settings_path, settings);
        let (pods, settings_path) = (
            pods.display().to_string(),
            settings_path.display().to_string(),
        );
        let mut args = vec![mode, "--pods", &pods, "--settings", &settings_path];
        // `list` asks no registry.
        if mode == "once" {
            args.push("--insecure");
        }
        args.extend(more);
        let output = match read_only_tmpdir {
            Some(tmpdir) => run_with_read_only_tmpdir(&args, tmpdir),
            None => run(&args),
        };
        (
            output.status.code(),
            format!("{}{}", text(&output.stdout), text(&output.stderr)),
        )
    }

    /// Whether `image` pulls whole from the cache (`skopeo copy --all` into a folder): every
    /// manifest and blob a node needs, which only the cache can serve once its upstream is gone.
    fn pulls_whole(&self, image: &str) -> Result<(), String> {
        let into = self
            .dir
            .path()
            .join(format!("pulled-{}", image.replace(['/', ':', '@'], "-")));
        let output = std::process::Command::new("skopeo")
            .args(["copy", "--all", "--src-tls-verify=false"])
            .arg(format!("docker://{}/{image}", self.cache.host))
            .arg(format!("dir:{}", into.display()))
            .output()
            .expect("skopeo");
        if output.status.success() {
            Ok(())
        } else {
            Err(text(&output.stderr))
        }
    }

    /// Whether the cache serves `image`'s `architecture` (Linux) whole, as a node of it pulls:
    /// skopeo picks that platform's manifest out of the index, then its config and layers.
    fn pulls_platform(&self, image: &str, architecture: &str) -> Result<(), String> {
        let into = self.dir.path().join(format!(
            "pulled-{architecture}-{}",
            image.replace(['/', ':', '@'], "-")
        ));
        let output = std::process::Command::new("skopeo")
            .args(["--override-os", "linux", "--override-arch", architecture])
            .args(["copy", "--src-tls-verify=false"])
            .arg(format!("docker://{}/{image}", self.cache.host))
            .arg(format!("dir:{}", into.display()))
            .output()
            .expect("skopeo");
        if output.status.success() {
            Ok(())
        } else {
            Err(text(&output.stderr))
        }
    }

    /// How many times the cache asked its upstream for the blob `digest` of `repository`.
    fn upstream_blob_gets(&self, repository: &str, digest: &str) -> usize {
        let asked = format!("GET /v2/{repository}/blobs/{digest}");
        self.far
            .seen()
            .iter()
            .filter(|seen| **seen == asked)
            .count()
    }

    /// Waits (up to `seconds`) until the cache's storage holds the blobs `digests`. Distribution's
    /// proxy stores a blob it serves from its upstream on a goroutine of its own, beside the
    /// answer (`ServeBlob` in registry/proxy/proxyblobstore.go), so it can land just after the
    /// warming's GET ended.
    fn wait_until_stored(&self, digests: &[String], seconds: u64) {
        let data = |digest: &String| {
            let hex = digest.trim_start_matches("sha256:");
            self.cache
                .storage()
                .join("docker/registry/v2/blobs/sha256")
                .join(&hex[..2])
                .join(hex)
                .join("data")
        };
        let deadline = Instant::now() + Duration::from_secs(seconds);
        while Instant::now() < deadline && !digests.iter().all(|d| data(d).exists()) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A Node as `kubectl get nodes -o json` writes it: its platform in its status, or (a node
/// just registered) in its labels only.
fn node(name: &str, os: &str, architecture: &str, in_status: bool) -> Value {
    let mut node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": os, "kubernetes.io/arch": architecture}},
    });
    if in_status {
        node["status"] = json!({"nodeInfo": {
            "architecture": architecture, "operatingSystem": os, "bootID": "b", "containerRuntimeVersion": "containerd://2.1.4",
            "kernelVersion": "6.1.0", "kubeProxyVersion": "", "kubeletVersion": "v1.36.0", "machineID": "m",
            "osImage": "Debian GNU/Linux 12 (bookworm)", "systemUUID": "u"}});
    }
    node
}

/// Pushes `images` and an index over them under `repository:tag`: OCI's image index, or
/// Docker's manifest list (of Docker v2 manifests).
fn push_multi_arch(
    registry: &TestRegistry,
    repository: &str,
    tag: &str,
    images: &[Image],
    docker: bool,
) -> String {
    if !docker {
        return Index::new(images.to_vec()).push(registry, repository, tag);
    }
    const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
    let manifests: Vec<Value> = images
        .iter()
        .map(|image| {
            image.push(registry, repository, None);
            json!({
                "mediaType": DOCKER_MANIFEST,
                "digest": image.digest(),
                "size": image.manifest.len(),
                "platform": {"os": image.os, "architecture": image.architecture},
            })
        })
        .collect();
    let list = serde_json::to_vec(
        &json!({"schemaVersion": 2, "mediaType": DOCKER_LIST, "manifests": manifests}),
    )
    .expect("list JSON");
    registry
        .push_manifest(repository, tag, DOCKER_LIST, &list)
        .expect("push the manifest list")
}

#[test]
fn a_pull_through_cache_is_warmed_by_tag_and_holds_the_image_once_its_upstream_is_gone() {
    let mut chain = Chain::start("warm");
    let index = Index::new(vec![
        Image::new("web", "linux/amd64"),
        Image::new("web", "linux/arm64"),
    ]);
    let web = index.push(&chain.upstream, "team/web", "1");
    let pinned = Image::new("app", "linux/amd64").push(&chain.upstream, "team/app", Some("2"));
    let by_tag = format!("{}/team/web:1", chain.upstream.host);
    let by_pin = format!("{}/team/app:2@{pinned}", chain.upstream.host);
    let settings = chain.settings(true);

    let (listed, words) = chain.fill("list", &settings, &[&by_tag, &by_pin]);
    assert_eq!(listed, Some(0), "{words}");
    assert!(
        words.contains("warmed with the platforms the nodes run: every platform (read from files, and no --nodes given)"),
        "{words}"
    );
    assert!(
        words.contains(&format!(
            "{by_tag} {}/team/web:1 warmed by a pull of {}/team/web:1",
            chain.cache.host, chain.cache.host
        )),
        "{words}"
    );
    assert!(
        words.contains(&format!(
            "warmed by a pull of {}/team/app:2\n",
            chain.cache.host
        )),
        "the pinned image is asked for by its tag, which the cache fills on: {words}"
    );

    let (status, words) = chain.fill("once", &settings, &[&by_tag, &by_pin]);
    assert_eq!(status, Some(0), "{words}");
    assert!(words.contains("fill-mirror: 2 copied, 0 failed"), "{words}");

    chain.upstream.stop();
    assert_eq!(chain.cache.digest_of("team/web", "1"), Some(web));
    assert_eq!(chain.pulls_whole("team/web:1"), Ok(()));
    assert_eq!(
        chain.cache.digest_of("team/app", &pinned),
        Some(pinned.clone())
    );
    assert_eq!(chain.pulls_whole(&format!("team/app@{pinned}")), Ok(()));
}

#[test]
fn a_pinned_image_whose_tag_moved_upstream_is_asked_for_by_its_digest_too() {
    let mut chain = Chain::start("moved");
    let pinned = Image::new("old", "linux/amd64").push(&chain.upstream, "team/app", Some("2"));
    let moved = Image::new("new", "linux/amd64").push(&chain.upstream, "team/app", Some("2"));
    assert_ne!(pinned, moved);
    let image = format!("{}/team/app:2@{pinned}", chain.upstream.host);

    let (status, words) = chain.fill("once", &chain.settings(true), &[&image]);

    assert_eq!(status, Some(0), "{words}");
    assert!(words.contains("fill-mirror: 1 copied, 0 failed"), "{words}");
    chain.upstream.stop();
    assert_eq!(
        chain.cache.digest_of("team/app", &pinned),
        Some(pinned.clone())
    );
    assert_eq!(chain.pulls_whole(&format!("team/app@{pinned}")), Ok(()));
}

/// A pinned digest the upstream lost: distribution's proxy answers its request with a 500, not
/// "not found", so the warming fails (and is tried again later), and nothing is counted filled.
#[test]
fn a_pinned_image_the_cache_cannot_get_is_not_counted_filled() {
    let chain = Chain::start("lost");
    let pinned = Image::new("old", "linux/amd64").push(&chain.upstream, "team/app", Some("2"));
    Image::new("new", "linux/amd64").push(&chain.upstream, "team/app", Some("2"));
    chain
        .upstream
        .delete_manifest("team/app", &pinned)
        .expect("delete the old digest upstream");
    let image = format!("{}/team/app:2@{pinned}", chain.upstream.host);

    let (status, words) = chain.fill("once", &chain.settings(true), &[&image]);

    assert_eq!(status, Some(1), "{words}");
    assert!(words.contains("fill-mirror: 0 copied, 1 failed"), "{words}");
}

/// ECR's cache, as the rig's `TagFilledCache` behaves (it fills on a tag only, and answers "not
/// found" for a digest it has not stored even when its upstream has it): a pinned image is
/// warmed by its tag and then held by its digest; one whose tag moved upstream is refused, since
/// no request can make such a cache store the pinned digest.
#[test]
fn an_ecr_like_cache_is_filled_by_the_tag_and_a_moved_tag_is_refused() {
    let upstream = TestRegistry::start("ecr-like-upstream").expect("upstream");
    let storage = TestRegistry::start("ecr-like-storage").expect("storage");
    let cache = TagFilledCache::start(&upstream, &storage).expect("cache");
    let kept = Image::new("kept", "linux/amd64").push(&upstream, "team/kept", Some("1"));
    let old = Image::new("old", "linux/amd64").push(&upstream, "team/moved", Some("2"));
    Image::new("new", "linux/amd64").push(&upstream, "team/moved", Some("2"));
    let dir = tempfile::tempdir().expect("dir");
    let settings =
        json!({"mirrors": [{"source": upstream.host, "target": cache.host, "pullThrough": true}]});
    let pinned = format!("{}/team/kept:1@{kept}", upstream.host);
    let moved = format!("{}/team/moved:2@{old}", upstream.host);
    let pods: Vec<Value> = [("kept", &pinned), ("moved", &moved)]
        .iter()
        .map(|(name, image)| pod_with_entry_by_hand(name, image, &settings["mirrors"]))
        .collect();
    write_json(&dir.path().join("pods.json"), &json!({"items": pods}));
    write_json(&dir.path().join("settings.json"), &settings);
    let path = |name: &str| dir.path().join(name).display().to_string();

    let output = run(&[
        "once",
        "--insecure",
        "--pods",
        &path("pods.json"),
        "--settings",
        &path("settings.json"),
    ]);

    let words = format!("{}{}", text(&output.stdout), text(&output.stderr));
    assert!(
        words.contains("fill-mirror: 1 copied, 0 failed, 0 skipped, 0 gone, 1 refused"),
        "{words}"
    );
    assert!(
        words.contains(&format!("the cache lacks the pinned {old}")),
        "{words}"
    );
    assert_eq!(storage.digest_of("team/kept", &kept), Some(kept));
}

#[test]
fn an_image_the_upstream_lacks_is_gone_through_the_cache() {
    let chain = Chain::start("absent");
    let image = format!("{}/team/typo:1", chain.upstream.host);

    let (status, words) = chain.fill("once", &chain.settings(true), &[&image]);

    assert!(words.contains("0 failed, 0 skipped, 1 gone"), "{words}");
    assert!(
        words.contains("has no such image, and its upstream gave it none"),
        "{words}"
    );
    assert_eq!(
        status,
        Some(0),
        "a gone image is not a failed copy: {words}"
    );
}

/// What the mark guards: the same cache behind a rule without it is pushed to, and a cache
/// refuses pushes. (An image by tag would not show it: distribution's proxy fills on the
/// existence check before any push. A pinned image's copy goes to a tag of its own, which no
/// upstream has, as on ECR.)
#[test]
fn without_the_mark_a_cache_is_pushed_to_and_refuses() {
    let chain = Chain::start("unmarked");
    let pinned = Image::new("app", "linux/amd64").push(&chain.upstream, "team/app", Some("2"));
    let image = format!("{}/team/app:2@{pinned}", chain.upstream.host);

    let (status, words) = chain.fill("once", &chain.settings(false), &[&image]);

    assert_ne!(status, Some(0), "{words}");
    assert!(words.contains("0 copied, 1 failed"), "{words}");
}

/// A multi-arch image on nodes of one platform: `list` says which, the warming pulls that
/// platform's manifest, config and layer through the cache and not the other's, writes nothing
/// (TMPDIR read-only), and the cache serves that platform whole with its upstream gone.
#[rstest::rstest]
#[case::an_oci_index("oci-index", false)]
#[case::a_docker_manifest_list("docker-list", true)]
fn a_multi_arch_image_is_warmed_with_the_nodes_platform_only_and_nothing_written(
    #[case] name: &str,
    #[case] docker: bool,
) {
    let mut chain = Chain::start(name);
    let images: Vec<Image> = ["linux/amd64", "linux/arm64"]
        .iter()
        .map(|platform| {
            let image = Image::new("web", platform);
            if docker { image.as_docker_v2() } else { image }
        })
        .collect();
    let index = push_multi_arch(&chain.upstream, "team/web", "1", &images, docker);
    let (amd64, arm64) = (&images[0], &images[1]);
    let image = format!("{}/team/web:1", chain.upstream.host);
    let nodes = chain.dir.path().join("nodes.json");
    write_json(
        &nodes,
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            node("a", "linux", "amd64", true),
            node("b", "linux", "amd64", false),
        ]}),
    );
    let nodes = nodes.display().to_string();
    let settings = chain.settings(true);

    let (listed, words) = chain.fill_with("list", &settings, &[&image], &["--nodes", &nodes], None);
    assert_eq!(listed, Some(0), "{words}");
    assert!(
        words.contains("warmed with the platforms the nodes run: linux/amd64 (2 nodes)"),
        "{words}"
    );

    let tmpdir = tempfile::tempdir().expect("a temporary folder");
    let (status, words) = chain.fill_with(
        "once",
        &settings,
        &[&image],
        &["--nodes", &nodes],
        Some(tmpdir.path()),
    );
    assert_eq!(status, Some(0), "{words}");
    assert!(words.contains("fill-mirror: 1 copied, 0 failed"), "{words}");

    let wanted = [amd64.config_digest(), sha256(&amd64.layer)];
    for digest in &wanted {
        assert!(
            chain.upstream_blob_gets("team/web", digest) > 0,
            "the cache never asked its upstream for {digest}: {:#?}",
            chain.far.seen()
        );
    }
    for digest in [arm64.config_digest(), sha256(&arm64.layer)] {
        assert_eq!(
            chain.upstream_blob_gets("team/web", &digest),
            0,
            "arm64's {digest} was pulled for amd64 nodes: {:#?}",
            chain.far.seen()
        );
    }
    chain.wait_until_stored(&wanted, 10);
    chain.upstream.stop();
    assert_eq!(chain.cache.digest_of("team/web", "1"), Some(index));
    assert_eq!(chain.pulls_platform("team/web:1", "amd64"), Ok(()));
    assert!(
        chain.pulls_platform("team/web:1", "arm64").is_err(),
        "the cache serves arm64, which no node runs"
    );
}

/// What the warming checks in the cache's answers: a layer whose bytes are not the digest's
/// (altered, or cut short with a length that agrees) fails it, and a 429 TOOMANYREQUESTS is
/// throttling. A front between fill-mirror and the cache answers those requests itself.
#[rstest::rstest]
#[case::a_layer_altered("altered", &["copy failed", "not the content named"])]
#[case::a_layer_cut_short("cut", &["copy failed", "bytes came of the"])]
#[case::the_manifest_throttled("throttled", &["is throttling", "429 TOOMANYREQUESTS slow down"])]
fn a_cache_s_bad_answer_fails_the_warming(#[case] bad: &'static str, #[case] words: &[&str]) {
    let chain = Chain::start(&format!("bad-{bad}"));
    let web = Image::new("web", "linux/amd64");
    web.push(&chain.upstream, "team/web", Some("1"));
    let layer_path = format!("/v2/team/web/blobs/{}", sha256(&web.layer));
    let layer = text(&web.layer);
    let (front, stop) =
        rig::front::relay("bad cache", &chain.cache.host, move |method, url| {
            match (bad, method, url) {
                ("altered", "GET", url) if url == layer_path => Some((200, layer.to_uppercase())),
                ("cut", "GET", url) if url == layer_path => {
                    Some((200, layer[..layer.len() / 2].to_string()))
                }
                ("throttled", "GET", "/v2/team/web/manifests/1") => Some((
                    429,
                    r#"{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}"#.to_string(),
                )),
                _ => None,
            }
        })
        .expect("a front");
    let settings = json!({"mirrors": [
        {"source": chain.upstream.host, "target": front, "pullThrough": true}]});
    let image = format!("{}/team/web:1", chain.upstream.host);

    let (status, said) = chain.fill("once", &settings, &[&image]);
    stop.store(true, Ordering::Relaxed);

    assert_eq!(status, Some(1), "{said}");
    assert!(said.contains("fill-mirror: 0 copied, 1 failed"), "{said}");
    for words in words {
        assert!(said.contains(words), "{words:?} not in: {said}");
    }
}

/// The watch follows the Nodes of a real kube-apiserver (a kube-runtime reflector): with one
/// arm64 node, a recorded Pod's multi-arch image is warmed with arm64 only, and `list` from the
/// cluster says so; an amd64 node registered later (its labels only, no status yet) is followed,
/// and the next image is warmed with both.
#[test]
fn the_watch_warms_the_platforms_of_the_nodes_it_follows() {
    let Some(tools) = find_tools("pull-through warming by the nodes") else {
        return;
    };
    let plane = ControlPlane::start(tools);
    let chain = Chain::start("nodes");
    let settings = chain.settings(true);
    plane.install_policy_crd();
    plane.apply_swapping_policy("image-swapper", &settings);
    let arm = node("arm", "linux", "arm64", true);
    let status = json!({"status": arm["status"].clone()}).to_string();
    plane.kubectl(&["create", "-f", "-"], Some(&arm.to_string()));
    plane.kubectl(
        &[
            "patch",
            "node",
            "arm",
            "--subresource=status",
            "--type=merge",
            "-p",
            &status,
        ],
        None,
    );
    let push = |content: &str, tag: &str| -> Vec<Image> {
        let images: Vec<Image> = ["linux/amd64", "linux/arm64"]
            .iter()
            .map(|platform| Image::new(content, platform))
            .collect();
        push_multi_arch(&chain.upstream, "team/web", tag, &images, false);
        images
    };
    let create_pod = |name: &str, tag: &str| {
        let image = format!("{}/team/web:{tag}", chain.upstream.host);
        let pod = pod_with_entry_by_hand(name, &image, &settings["mirrors"]);
        plane.kubectl(&["create", "-f", "-"], Some(&pod.to_string()));
    };
    let first = push("web 1", "1");
    create_pod("first", "1");

    let listed = fill_mirror()
        .args(["list", "--log-format", "text"])
        .env("KUBECONFIG", &plane.kubeconfig)
        .output()
        .expect("fill-mirror list");
    let words = format!("{}{}", text(&listed.stdout), text(&listed.stderr));
    assert!(
        words.contains("warmed with the platforms the nodes run: linux/arm64 (1 node)"),
        "{words}"
    );

    let log = chain.dir.path().join("watch.log");
    let mut watch = fill_mirror()
        .args([
            "watch",
            "--insecure",
            "--no-election",
            "--no-templates",
            "--no-reports",
        ])
        .args([
            "--retry",
            "1",
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "text",
        ])
        .env("KUBECONFIG", &plane.kubeconfig)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("the watch's log"))
        .spawn()
        .expect("fill-mirror watch");
    let warmed = |images: &[Image]| {
        let digests: Vec<String> = images.iter().map(|image| sha256(&image.layer)).collect();
        // The watch sees the Pod, then warms: up to its first list and a warming.
        chain.wait_until_stored(&digests, 30);
        digests
            .iter()
            .all(|digest| chain.upstream_blob_gets("team/web", digest) > 0)
    };
    let first_warmed = warmed(&first[1..]);
    plane.kubectl(
        &["create", "-f", "-"],
        Some(&node("amd", "linux", "amd64", false).to_string()),
    );
    let second = push("web 2", "2");
    create_pod("second", "2");
    let second_warmed = warmed(&second);
    let _ = watch.kill();
    let _ = watch.wait();
    let said = std::fs::read_to_string(&log).unwrap_or_default();

    assert!(first_warmed, "arm64 of tag 1 not warmed: {said}");
    assert_eq!(
        chain.upstream_blob_gets("team/web", &sha256(&first[0].layer)),
        0,
        "amd64 of tag 1 was pulled with only an arm64 node: {said}"
    );
    assert!(second_warmed, "both platforms of tag 2 not warmed: {said}");
}

/// Pushes a platform's image whose layer is `mib` MiB (a pattern, distinct per `seed`) to
/// `repository`, by digest: its manifest. The layer is digested by `sha256sum` and sent in one
/// upload, not through the rig's client, which digests what it pushes here, in this test's
/// debug build (a few MB/s).
fn push_big_image(
    registry: &TestRegistry,
    repository: &str,
    seed: &str,
    platform: &str,
    mib: usize,
    dir: &Path,
) -> Image {
    let block: Vec<u8> = format!("{seed} {platform} ")
        .bytes()
        .cycle()
        .take(1 << 20)
        .collect();
    let mut layer = Vec::with_capacity(mib << 20);
    for _ in 0..mib {
        layer.extend_from_slice(&block);
    }
    let file = dir.join("layer");
    std::fs::write(&file, &layer).expect("the layer's file");
    let summed = std::process::Command::new("sha256sum")
        .arg(&file)
        .output()
        .expect("sha256sum");
    let digest = format!(
        "sha256:{}",
        text(&summed.stdout).split(' ').next().unwrap_or_default()
    );
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(600))
        .build();
    let started = agent
        .post(&format!(
            "http://{}/v2/{repository}/blobs/uploads/",
            registry.host
        ))
        .call()
        .expect("an upload");
    let location = started
        .header("Location")
        .expect("its location")
        .to_string();
    let location = if location.starts_with("http") {
        location
    } else {
        format!("http://{}{location}", registry.host)
    };
    let separator = if location.contains('?') { '&' } else { '?' };
    agent
        .put(&format!("{location}{separator}digest={digest}"))
        .set("Content-Type", "application/octet-stream")
        .send_bytes(&layer)
        .expect("the layer's upload");
    let mut image = Image::new(seed, platform);
    image.layer = Vec::new();
    image.config = serde_json::to_vec(&json!({
        "architecture": image.architecture, "os": image.os,
        "rootfs": {"type": "layers", "diff_ids": [digest]},
    }))
    .expect("config JSON");
    image.manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": image.media_type,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(&image.config), "size": image.config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest, "size": layer.len()}],
    }))
    .expect("manifest JSON");
    registry
        .push_blob(repository, &image.config)
        .expect("push config");
    registry
        .push_manifest(
            repository,
            &image.digest(),
            image.media_type,
            &image.manifest,
        )
        .expect("push manifest");
    image
}

/// `/usr/bin/time -v`'s elapsed time and peak RSS lines.
fn time_figures(said: &str) -> String {
    said.lines()
        .filter(|line| line.contains("Elapsed (wall clock)") || line.contains("Maximum resident"))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The figure docs/fill-mirror.md quotes, not a test: a four-platform image, each layer
/// `WARM_MEASURE_MIB` MiB (256 by default), warmed for amd64 and arm64 nodes through the chain
/// (upstream 20 ms away) under `/usr/bin/time -v` with a read-only TMPDIR; beside it, the
/// former way (`skopeo copy --all` into a folder) of another tag of the same size, cold too.
/// `cargo test --locked -p fill-mirror --test pull_through -- --ignored --nocapture measure`;
/// `FILL_MIRROR_BIN` names another build of the binary (the image's: `cargo build --locked
/// --profile image -p fill-mirror`, `target/image/fill-mirror`), since this test's own is a
/// debug build.
#[test]
#[ignore]
fn measure_the_warming_of_a_multi_arch_image() {
    let mib: usize = std::env::var("WARM_MEASURE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let chain = Chain::start("measure");
    let platforms = ["linux/amd64", "linux/arm64", "linux/ppc64le", "linux/s390x"];
    for tag in ["new", "old"] {
        let images: Vec<Image> = platforms
            .iter()
            .map(|platform| {
                push_big_image(
                    &chain.upstream,
                    "team/big",
                    tag,
                    platform,
                    mib,
                    chain.dir.path(),
                )
            })
            .collect();
        let index = Index::new(images);
        chain
            .upstream
            .push_manifest("team/big", tag, rig::images::OCI_INDEX, &index.manifest)
            .expect("push the index");
    }
    let nodes = chain.dir.path().join("nodes.json");
    write_json(
        &nodes,
        &json!({"items": [node("a", "linux", "amd64", true), node("b", "linux", "arm64", true)]}),
    );
    let pods = chain.dir.path().join("pods.json");
    let settings_path = chain.dir.path().join("settings.json");
    let settings = chain.settings(true);
    let image = format!("{}/team/big:new", chain.upstream.host);
    write_json(
        &pods,
        &json!({"items": [pod_with_entry_by_hand("p", &image, &settings["mirrors"])]}),
    );
    write_json(&settings_path, &settings);
    let tmpdir = tempfile::tempdir().expect("a temporary folder");
    let output = std::process::Command::new("unshare")
        .args(["--map-root-user", "--mount", "sh", "-c"])
        .arg(r#"mount --bind -o ro "$0" "$0" && exec "$@""#)
        .arg(tmpdir.path())
        .args(["/usr/bin/time", "-v"])
        .arg(std::env::var("FILL_MIRROR_BIN").unwrap_or(env!("CARGO_BIN_EXE_fill-mirror").into()))
        .args(["once", "--insecure"])
        .args(["--log-format", "text", "--pods"])
        .arg(&pods)
        .arg("--settings")
        .arg(&settings_path)
        .arg("--nodes")
        .arg(&nodes)
        .env("TMPDIR", tmpdir.path())
        .output()
        .expect("time fill-mirror");
    let said = text(&output.stderr);
    assert!(output.status.success(), "{said}");
    let pulled = said
        .lines()
        .find(|line| line.contains("pulled through the cache"))
        .unwrap_or_default();
    println!(
        "warming, {} platforms of {mib} MiB of 4, nothing written: {}\n  {pulled}",
        2,
        time_figures(&said)
    );

    let into = chain.dir.path().join("old-way");
    let old = std::process::Command::new("/usr/bin/time")
        .args([
            "-v",
            "skopeo",
            "copy",
            "--all",
            "--preserve-digests",
            "--src-tls-verify=false",
        ])
        .arg(format!("docker://{}/team/big:old", chain.cache.host))
        .arg(format!("dir:{}", into.display()))
        .output()
        .expect("time skopeo");
    let old_said = text(&old.stderr);
    assert!(old.status.success(), "{old_said}");
    let written: u64 = std::fs::read_dir(&into)
        .expect("skopeo's folder")
        .filter_map(|entry| entry.ok()?.metadata().ok())
        .map(|metadata| metadata.len())
        .sum();
    println!(
        "former way (skopeo copy --all into a folder), 4 platforms: {}; {} MiB written",
        time_figures(&old_said),
        written >> 20
    );
}
