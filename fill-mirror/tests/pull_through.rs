//! A rule whose target is a pull-through cache (`pullThrough: true`) is warmed, not copied: the
//! fill job asks the cache for the manifest (by the source's tag) and the cache fetches it from
//! its upstream. The cache is Debian's `docker-registry` in proxy mode (`proxy.remoteurl`), its
//! upstream a plain registry 20 ms away through the latency proxy. A proxy-mode registry refuses
//! every push, so a copy where a warming belongs fails, and an image the cache holds once its
//! upstream is stopped is one the warming made it fetch.

mod rig;

use std::time::Duration;

use rig::images::{Image, Index};
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::{policy, recorded_pod, run, text, write_json};
use serde_json::{Value, json};

/// The upstream's distance from the cache.
const AWAY: Duration = Duration::from_millis(20);

struct Chain {
    upstream: TestRegistry,
    /// Kept: the cache reaches its upstream through it.
    _far: LatencyProxy,
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
            _far: far,
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
        let policy = policy(settings);
        let items: Vec<Value> = images
            .iter()
            .enumerate()
            .map(|(i, image)| recorded_pod(&format!("p{i}"), &[image], &[image], &policy))
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
        let output = run(&args);
        (
            output.status.code(),
            format!("{}{}", text(&output.stdout), text(&output.stderr)),
        )
    }
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
        words.contains(&format!(
            "{by_tag} {}/team/web:1 warmed by a GET of {}/team/web:1",
            chain.cache.host, chain.cache.host
        )),
        "{words}"
    );
    assert!(
        words.contains(&format!(
            "warmed by a GET of {}/team/app:2\n",
            chain.cache.host
        )),
        "the pinned image is asked for by its tag, which the cache fills on: {words}"
    );

    let (status, words) = chain.fill("once", &settings, &[&by_tag, &by_pin]);
    assert_eq!(status, Some(0), "{words}");
    assert!(words.contains("fill-mirror: 2 copied, 0 failed"), "{words}");

    chain.upstream.stop();
    assert_eq!(chain.cache.digest_of("team/web", "1"), Some(web.clone()));
    assert_eq!(chain.cache.digest_of("team/web", &web), Some(web));
    assert_eq!(
        chain.cache.digest_of("team/app", &pinned),
        Some(pinned.clone())
    );
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
    assert_eq!(chain.cache.digest_of("team/app", &pinned), Some(pinned));
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
    assert_ne!(
        status,
        Some(1),
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
