//! `make bench`'s fill-mirror figures, in a real chain: the real kube-apiserver (the real tools),
//! `fill-mirror watch` as the Deployment runs it (the release of the bench's build), skopeo, and
//! real registries on loopback, the source 20 ms away and the mirror 5 ms away behind the rig's
//! network proxy. Pods carry the record admission writes (in the documented form, by hand); the
//! clock starts when the Pod's create is sent. Figures, never asserts on time:
//!
//! - the first Pod's image in the mirror, one new image at a time (median of 20);
//! - 100 Pods asking for one image: copies made, the image in the mirror, every record marked,
//!   and the marks' time after the copy landed;
//! - 20 Pods of 20 distinct images created at once: all in the mirror.
//!
//! `BENCH_QUICK=1` (CI's run): 3 images, 10 Pods, 5 images, to show that it runs to its end.
//! Where the real tools are absent it says so and prints nothing else (in CI, it fails).

#[path = "../tests/rig/mod.rs"]
mod rig;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use rig::images::Image;
use rig::plane::{ControlPlane, find_tools};
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::{fill_mirror, pod_with_entry_by_hand, settings};
use serde_json::{Value, json};

const LABEL: &str = "image-swapper.kubewarden.io/unmirrored";

struct Sizes {
    one_at_a_time: usize,
    crowd: usize,
    distinct: usize,
}

struct Chain {
    plane: ControlPlane,
    source: TestRegistry,
    mirror: TestRegistry,
    source_far: LatencyProxy,
    mirror_far: LatencyProxy,
    /// The settings' `mirrors`, which route each recorded image to the mirror.
    rules: serde_json::Value,
    watch: Child,
    metrics: String,
}

impl Drop for Chain {
    fn drop(&mut self) {
        let _ = self.watch.kill();
        let _ = self.watch.wait();
    }
}

impl Chain {
    fn start() -> Option<Chain> {
        let tools = find_tools("fill-mirror bench")?;
        let plane = ControlPlane::start(tools);
        let source = TestRegistry::start("bench-fill-src").expect("source registry");
        let mirror = TestRegistry::start("bench-fill-mirror").expect("mirror registry");
        let source_far =
            LatencyProxy::network(&source.host, Duration::from_millis(20)).expect("proxy");
        let mirror_far =
            LatencyProxy::network(&mirror.host, Duration::from_millis(5)).expect("proxy");
        let settings = settings(&source_far.host, &mirror_far.host);
        plane.install_policy_crd();
        plane.apply_swapping_policy("image-swapper", &settings);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let watch = fill_mirror()
            .args([
                "watch",
                "--insecure",
                "--no-election",
                "--log-format",
                "text",
            ])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("KUBECONFIG", &plane.kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start fill-mirror watch");
        let chain = Chain {
            rules: settings["mirrors"].clone(),
            plane,
            source,
            mirror,
            source_far,
            mirror_far,
            watch,
            metrics: format!("http://127.0.0.1:{port}/metrics"),
        };
        let ready = format!("http://127.0.0.1:{port}/readyz");
        let deadline = Instant::now() + Duration::from_secs(60);
        while ureq::get(&ready).call().is_err() {
            assert!(Instant::now() < deadline, "fill-mirror watch is not ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(chain)
    }

    fn push(&self, repository: &str) {
        Image::new(repository, "linux/amd64").push(&self.source, repository, Some("1"));
    }

    fn pod(&self, name: &str, repository: &str) -> Value {
        let image = format!("{}/{repository}:1", self.source_far.host);
        pod_with_entry_by_hand(name, &image, &self.rules)
    }

    fn create(&self, pods: Vec<Value>) {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": pods});
        self.plane
            .kubectl(&["create", "-f", "-"], Some(&list.to_string()));
    }

    fn in_mirror(&self, repository: &str) -> bool {
        self.mirror
            .digest_of(&format!("hub/{repository}"), "1")
            .is_some()
    }

    fn recorded_left(&self) -> usize {
        let selector = format!("{LABEL}=true");
        self.plane
            .get_json(&["pods", "-n", "default", "-l", &selector])["items"]
            .as_array()
            .map_or(usize::MAX, Vec::len)
    }

    fn copied(&self) -> f64 {
        let text = ureq::get(&self.metrics)
            .call()
            .ok()
            .and_then(|r| r.into_string().ok())
            .unwrap_or_default();
        text.lines()
            .find_map(|l| {
                l.strip_prefix("fill_mirror_copies_total{result=\"copied\"} ")?
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0)
    }
}

/// Waits for `condition`, polling every 20 ms, up to `seconds`; when it held.
fn until(seconds: u64, mut condition: impl FnMut() -> bool) -> Option<Instant> {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        if condition() {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn s(duration: Duration) -> String {
    format!("{:.2}", duration.as_secs_f64())
}

fn main() {
    let quick = std::env::var("BENCH_QUICK").as_deref() == Ok("1");
    let sizes = if quick {
        Sizes {
            one_at_a_time: 3,
            crowd: 10,
            distinct: 5,
        }
    } else {
        Sizes {
            one_at_a_time: 20,
            crowd: 100,
            distinct: 20,
        }
    };
    let Some(chain) = Chain::start() else {
        return;
    };
    println!(
        "\nfill-mirror watch, real kube-apiserver, skopeo; the source {} ms away, the mirror {} ms away; seconds from the Pod's create",
        chain.source_far.round_trip.as_millis(),
        chain.mirror_far.round_trip.as_millis()
    );

    let mut times = Vec::new();
    for i in 0..sizes.one_at_a_time {
        let repository = format!("app/first{i}");
        chain.push(&repository);
        let started = Instant::now();
        chain.create(vec![chain.pod(&format!("first{i}"), &repository)]);
        let landed = until(60, || chain.in_mirror(&repository))
            .unwrap_or_else(|| panic!("{repository} is not in the mirror after 60 s"));
        times.push(landed - started);
    }
    times.sort();
    println!("| first Pod's image in the mirror | Pods | median | min | max |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| one new image at a time | {} | {} | {} | {} |",
        times.len(),
        s(times[times.len() / 2]),
        s(times[0]),
        s(times[times.len() - 1])
    );

    let copied_before = chain.copied();
    chain.push("app/crowd");
    let pods = (0..sizes.crowd)
        .map(|i| chain.pod(&format!("crowd{i}"), "app/crowd"))
        .collect();
    let started = Instant::now();
    chain.create(pods);
    let landed = until(120, || chain.in_mirror("app/crowd")).expect("app/crowd in the mirror");
    let marked = until(120, || chain.recorded_left() == 0).expect("every crowd Pod marked");
    let copies = chain.copied() - copied_before;
    println!(
        "\n| Pods asking for one image | copies made | in the mirror | all marked | marks after the copy |"
    );
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {copies} | {} | {} | {} |",
        sizes.crowd,
        s(landed - started),
        s(marked - started),
        s(marked.saturating_duration_since(landed))
    );

    let repositories: Vec<String> = (0..sizes.distinct)
        .map(|i| format!("app/distinct{i}"))
        .collect();
    for repository in &repositories {
        chain.push(repository);
    }
    let pods = repositories
        .iter()
        .enumerate()
        .map(|(i, repository)| chain.pod(&format!("distinct{i}"), repository))
        .collect();
    let started = Instant::now();
    chain.create(pods);
    let all = until(120, || repositories.iter().all(|r| chain.in_mirror(r)))
        .expect("every distinct image in the mirror");
    println!("\n| distinct images at once | all in the mirror |");
    println!("|---:|---:|");
    println!("| {} | {} |", sizes.distinct, s(all - started));
}
