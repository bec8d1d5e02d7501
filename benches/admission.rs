//! `make bench`: what the policy costs per admission, in the test rig's wasm host.
//!
//! For Pods of 1, 10, 100 and 1,000 containers it prints the evaluation time (median and 99th
//! percentile) with a fresh instance per evaluation (what policy-server does) and with a reused
//! instance, the host lookups per admission, and the guest's peak memory; beside them the floor,
//! a policy that only parses the request and accepts it. Lookups are answered at once from
//! memory, then by a real registry on loopback, then by one 20 and 100 ms away (the lookup
//! budget at work), `verifySource`'s comparisons at those distances, and by concurrent
//! evaluations sharing the host's serialised lookups, as policy-server's workers do. A benchmark
//! prints figures; it asserts nothing.

#[path = "../tests/rig/mod.rs"]
mod rig;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rig::hosts::{InstantHost, LiveHost, LookupLock, SerialisedHost, locate};
use rig::images::{Image, Index, push_apps};
use rig::proxy::{HostModel, LatencyProxy, Transport};
use rig::registry::TestRegistry;
use rig::wapc::{SharedHost, WasmPolicy};
use serde_json::{Value, json};

const SIZES: [usize; 4] = [1, 10, 100, 1000];
const MIRROR: &str = "mirror.example.com";

/// A realistic mix: two containers in five share a Docker Hub image, one is an Argo image,
/// one an excluded pause image, one an image no rule covers.
fn images(containers: usize) -> Vec<String> {
    (0..containers)
        .map(|i| match i % 5 {
            0 | 1 => format!("nginx:1.{}", i / 5),
            2 => format!("quay.io/argoproj/argocd:v2.{i}"),
            3 => "registry.k8s.io/pause:3.10".to_string(),
            _ => format!("ghcr.io/example/service-{i}:1.0"),
        })
        .collect()
}

fn settings(mirror: &str, swap_policy: &str) -> Value {
    json!({
        "swapPolicy": swap_policy,
        "mirrors": [
            {"source": "docker.io", "target": format!("{mirror}/dockerhub")},
            {"source": "quay.io/argoproj", "target": format!("{mirror}/quay/argoproj")},
        ],
        "exclude": ["registry.k8s.io/pause:*"],
    })
}

/// Where the policy will look each matched image up.
fn lookup_of(image: &str, mirror: &str) -> Option<String> {
    if let Some(rest) = image.strip_prefix("quay.io/") {
        Some(format!("{mirror}/quay/{rest}"))
    } else if image.starts_with("nginx:") {
        Some(format!("{mirror}/dockerhub/library/{image}"))
    } else {
        None
    }
}

fn payload(containers: usize, mirror: &str, swap_policy: &str) -> Vec<u8> {
    let spec = json!({"containers": images(containers).iter().enumerate()
        .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
        .collect::<Vec<_>>()});
    json!({"settings": settings(mirror, swap_policy), "request": rig::pod_request("CREATE", spec)})
        .to_string()
        .into_bytes()
}

struct Figures {
    median: Duration,
    p99: Duration,
    memory: usize,
}

fn figures(mut times: Vec<Duration>, memory: usize) -> Figures {
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    Figures {
        median: at(0.5),
        p99: at(0.99),
        memory,
    }
}

fn iterations(containers: usize) -> usize {
    runs(match containers {
        1 | 10 => 400,
        100 => 200,
        _ => 60,
    })
}

/// `full` runs, or 3 under `BENCH_QUICK=1` (CI's run, which shows that every table prints:
/// its figures are the test build's, not the release build's).
fn runs(full: usize) -> usize {
    if std::env::var("BENCH_QUICK").as_deref() == Ok("1") {
        full.min(3)
    } else {
        full
    }
}

/// One container, its mirror copy signed (key-based) on a registry on loopback, a fresh
/// instance and a fresh host per admission (no cache): the admission without `signatures` (one
/// existence lookup), and with a rule over the image (one verification, which stands in for
/// the lookup).
fn signatures(policy: &WasmPolicy) {
    let registry = TestRegistry::start("bench-signatures").expect("registry (make deps)");
    let signer = rig::cosign::Signer::generate();
    let digest =
        Image::new("signed app", "linux/amd64").push(&registry, "cache/org/app", Some("1"));
    signer.sign(&registry, "cache/org/app", &digest, &[]);
    let mirrors =
        json!([{"source": "src.example.com", "target": format!("{}/cache", registry.host)}]);
    let request = rig::pod_request(
        "CREATE",
        json!({"containers": [{"name": "web", "image": "src.example.com/org/app:1"}]}),
    );
    println!(
        "\nsignatures: one container, a registry on loopback, fresh instance and host; ms per admission"
    );
    println!("| settings | host calls | median | p99 |");
    println!("|---|---:|---:|---:|");
    let rule = json!({"image": "src.example.com/org/*", "pubKeys": [signer.public_pem]});
    // The same rule in a verify-image-signatures ClusterAdmissionPolicy, read by `verifiers`.
    let cluster = rig::kubernetes::Cluster::with_policies(&[(
        "ClusterAdmissionPolicy",
        None,
        "verify-image-signatures",
        json!({"module": "registry://ghcr.io/kubewarden/policies/verify-image-signatures:v1.0.11",
            "settings": {"signatures": [rule]}}),
    )]);
    for (name, settings, cluster) in [
        ("without signatures", json!({"mirrors": mirrors}), None),
        // Verified at the mirror (`verifySource: false`): the source here is no registry.
        (
            "signatures (pubKeys, at the mirror)",
            json!({"mirrors": mirrors, "signatures": [rule], "verifySource": false}),
            None,
        ),
        (
            "verifiers (the same rule, read from a ClusterAdmissionPolicy, at the mirror)",
            json!({"mirrors": mirrors, "verifiers": [{"module": "*/verify-image-signatures*"}], "verifySource": false}),
            Some(cluster),
        ),
    ] {
        let payload = json!({"settings": settings, "request": request}).to_string();
        let runs = runs(200);
        let mut times = Vec::with_capacity(runs);
        let mut calls = 0;
        for _ in 0..runs {
            let host = Arc::new(Mutex::new(LiveHost {
                cluster: cluster.clone(),
                ..LiveHost::default()
            }));
            let started = Instant::now();
            let evaluation = policy.call("validate", payload.as_bytes(), host.clone());
            times.push(started.elapsed());
            let response = rig::answer_of(&evaluation, "");
            assert_eq!(
                response.image("containers", 0),
                Some(format!("{}/cache/org/app:1@{digest}", registry.host).as_str()),
                "{name}: swapped"
            );
            calls = host.lock().map(|h| h.exchanges.len()).unwrap_or(0);
        }
        times.sort_unstable();
        println!(
            "| {name} | {calls} | {} | {} |",
            ms(times[runs / 2]),
            ms(times[runs * 99 / 100])
        );
    }
}

fn fresh(policy: &WasmPolicy, payload: &[u8], host: SharedHost, runs: usize) -> Figures {
    let mut times = Vec::with_capacity(runs);
    let mut memory = 0;
    for _ in 0..runs {
        let started = Instant::now();
        let evaluation = policy.call("validate", payload, host.clone());
        times.push(started.elapsed());
        memory = memory.max(evaluation.memory_bytes);
        if let Err(error) = evaluation.result {
            panic!("evaluation failed: {error}");
        }
    }
    figures(times, memory)
}

fn reused(policy: &WasmPolicy, payload: &[u8], host: SharedHost, runs: usize) -> Figures {
    let mut instance = policy.reused_instance(host).expect("instance");
    let mut times = Vec::with_capacity(runs);
    let mut memory = 0;
    for _ in 0..runs {
        let started = Instant::now();
        let evaluation = instance.call("validate", payload);
        times.push(started.elapsed());
        memory = memory.max(evaluation.memory_bytes);
        if let Err(error) = evaluation.result {
            panic!("evaluation failed: {error}");
        }
    }
    figures(times, memory)
}

fn ms(duration: Duration) -> String {
    format!("{:.3}", duration.as_secs_f64() * 1000.0)
}

fn mib(bytes: usize) -> String {
    format!("{:.1}", bytes as f64 / (1024.0 * 1024.0))
}

fn main() {
    // `BENCH_ONLY=fill-job make bench`: the fill job's figures only.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("fill-job") {
        fill_job();
        return;
    }
    // `BENCH_ONLY=ahead make bench`: a workload's first Pods, filled from its template.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("ahead") {
        ahead();
        return;
    }
    let root = rig::root();
    let policy = rig::policy();
    // `BENCH_ONLY=signatures make bench`: an admission with one verified image beside one
    // without `signatures`.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("signatures") {
        signatures(policy);
        return;
    }
    // `BENCH_ONLY=ordered make bench`: ordered mirrors at a distance only.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("ordered") {
        distance(policy, true);
        return;
    }
    let floor = WasmPolicy::load(&root.join("target/floor-policy.wasm"))
        .expect("target/floor-policy.wasm (make bench builds it)");
    let size = |name: &str| {
        std::fs::metadata(root.join(name))
            .map(|m| m.len())
            .unwrap_or(0)
    };
    println!(
        "module: policy.wasm {} bytes; floor policy {} bytes",
        size("policy.wasm"),
        size("target/floor-policy.wasm")
    );
    println!(
        "machine: {} cores, {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(
                |c| c.lines().find(|l| l.starts_with("model name")).map(|l| l
                    .split(':')
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .to_string())
            )
            .unwrap_or_default()
    );

    println!("\ninstant host (lookups answered from memory); times in ms per admission");
    println!(
        "| containers | lookups | fresh median | fresh p99 | reused median | reused p99 | floor fresh median | floor fresh p99 | floor reused median | fresh / floor | fresh µs per container | peak memory MiB | floor peak memory MiB |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for containers in SIZES {
        let payload = payload(containers, MIRROR, "exists");
        let mut host = InstantHost::default();
        for image in images(containers) {
            if let Some(lookup) = lookup_of(&image, MIRROR) {
                host.digests
                    .insert(lookup, format!("sha256:{:064x}", image.len()));
            }
        }
        let host = Arc::new(Mutex::new(host));
        let runs = iterations(containers);
        // One evaluation first, to count its lookups and check that it swaps.
        let probe = rig::parse_response(
            &policy
                .call("validate", &payload, host.clone())
                .result
                .expect("evaluation"),
        );
        assert!(probe.mutated.is_some(), "the bench Pod should be swapped");
        let lookups = host.lock().map(|h| h.calls).unwrap_or(0);
        let fresh_figures = fresh(policy, &payload, host.clone(), runs);
        let reused_figures = reused(policy, &payload, host.clone(), runs);
        let floor_figures = fresh(&floor, &payload, host.clone(), runs);
        let floor_reused = reused(&floor, &payload, host.clone(), runs);
        println!(
            "| {containers} | {lookups} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.1} | {} | {} |",
            ms(fresh_figures.median),
            ms(fresh_figures.p99),
            ms(reused_figures.median),
            ms(reused_figures.p99),
            ms(floor_figures.median),
            ms(floor_figures.p99),
            ms(floor_reused.median),
            fresh_figures.median.as_secs_f64() / floor_figures.median.as_secs_f64(),
            fresh_figures.median.as_secs_f64() * 1e6 / containers as f64,
            mib(fresh_figures.memory),
            mib(floor_figures.memory),
        );
    }

    println!(
        "\nswapPolicy: always (the same Pods, no lookup): the policy's own work; fresh instance, ms per admission"
    );
    println!("| containers | median | p99 | floor median | ratio |");
    println!("|---:|---:|---:|---:|---:|");
    for containers in SIZES {
        let payload = payload(containers, MIRROR, "always");
        let host: SharedHost = Arc::new(Mutex::new(InstantHost::default()));
        let runs = iterations(containers);
        let always = fresh(policy, &payload, host.clone(), runs);
        let floor_figures = fresh(&floor, &payload, host, runs);
        println!(
            "| {containers} | {} | {} | {} | {:.2} |",
            ms(always.median),
            ms(always.p99),
            ms(floor_figures.median),
            always.median.as_secs_f64() / floor_figures.median.as_secs_f64()
        );
    }
    // `BENCH_ONLY=own-work make bench`: the policy's own work only, to compare two builds of
    // the module on one machine in a few seconds.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("own-work") {
        return;
    }
    signatures(policy);

    println!(
        "\nlive host (a registry on loopback, HEAD per lookup); fresh instance, times in ms per admission"
    );
    println!("| containers | lookups | median | p99 |");
    println!("|---:|---:|---:|---:|");
    let registry = TestRegistry::start("bench").expect("registry (make deps)");
    for containers in SIZES {
        let payload = payload(containers, &registry.host, "exists");
        let lookups: std::collections::BTreeSet<String> = images(containers)
            .iter()
            .filter_map(|image| lookup_of(image, &registry.host))
            .collect();
        for lookup in lookups {
            let (_, repository, tag) = locate(&lookup).expect("host/repository:tag");
            Image::new(&lookup, "linux/amd64").push(&registry, &repository, Some(&tag));
        }
        let host = Arc::new(Mutex::new(LiveHost::default()));
        let runs = iterations(containers).min(40);
        let live = fresh(policy, &payload, host.clone(), runs);
        let lookups = host.lock().map(|h| h.exchanges.len() / runs).unwrap_or(0);
        println!(
            "| {containers} | {lookups} | {} | {} |",
            ms(live.median),
            ms(live.p99)
        );
    }
    drop(registry);
    distance(policy, false);
    distance(policy, true);
    verify_source(policy);
    concurrency();
    throughput();
    fill_job();
    ahead();
}

/// A workload's first Pods, in the real chain of `rig::ahead` (kube-apiserver and
/// kube-controller-manager, policy-server 1.35 with the module, `fill-mirror watch`; the source
/// 20 ms and the mirror 5 ms away): how long the fill controller took from the workload's
/// create to its image in the mirror, how long the controllers then took to the Pods, and how
/// many of those Pods the policy swapped on their first admission. One run each: a CronJob's
/// time to its Pod is the wait for the next minute.
fn ahead() {
    // CI's quick run has the same chain in `cargo test --test ahead_of_pods`, and this table's
    // CronJob waits for the next minute.
    if std::env::var("BENCH_QUICK").as_deref() == Ok("1") && std::env::var("BENCH_ONLY").is_err() {
        println!(
            "\nahead of the first Pod: not in the quick run (cargo test --test ahead_of_pods runs its chain)"
        );
        return;
    }
    let Some(tools) = rig::tools::RealTools::find("bench ahead of the first Pod") else {
        return;
    };
    let chain = rig::ahead::Ahead::start(&tools, &tools.annotated_policy(), rig::fill_mirror());
    println!(
        "
ahead of the first Pod: real kube-apiserver and kube-controller-manager, policy-server 1.35, fill-mirror watch (source 20 ms, mirror 5 ms away; one run)"
    );
    println!(
        "| workload | create to image in the mirror (s) | then to its Pods (s) | swapped on first admission |"
    );
    println!("|---|---:|---:|---:|");
    let seconds =
        |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.2}", d.as_secs_f64()));
    let row = |what: &str, first: &rig::ahead::FirstPods| {
        println!(
            "| {what} | {} | {} | {} of {} |",
            seconds(first.template_to_mirror),
            seconds(first.to_pods),
            first.swapped(),
            first.images.len()
        );
    };
    row(
        "Deployment, replicas 0, scaled to 3 once its image is in the mirror",
        &chain.deployment_scaled_from_zero("scaled", 3, 30),
    );
    row(
        "CronJob every minute, its first Job's Pod (to Pods: from the create)",
        &chain.cronjob_first_run("nightly"),
    );
}

/// The fill controller's own work over the Pods' records: `fill-mirror list` reading N recorded
/// Pods (a tenth of them naming images no other Pod names, as a rollout's replicas share one;
/// each record written by the policy crate's own writer) and checking each copy against the
/// settings' routing. The copies themselves cost what skopeo costs, per distinct image.
fn fill_job() {
    let settings =
        json!({"mirrors": [{"source": "docker.io", "target": "mirror.example.com/dockerhub"}]});
    let parsed = image_swapper_policy::settings::parse_settings(settings.to_string().as_bytes())
        .expect("settings");
    let policy = image_swapper_policy::policy::Policy::from_settings(&parsed).expect("settings");
    let binary = rig::fill_mirror();
    let dir = std::env::temp_dir().join(format!("image-swapper-bench-fill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let settings_path = dir.join("settings.json");
    std::fs::write(&settings_path, settings.to_string()).expect("settings");
    println!(
        "
fill controller: fill-mirror list over recorded Pods (median of 3 runs)"
    );
    println!("| recorded Pods | distinct copies | seconds |");
    println!("|---:|---:|---:|");
    for pods in [10_usize, 100, 1_000] {
        let items: Vec<Value> = (0..pods)
            .map(|n| {
                let image = format!("app{}:1", n / 10);
                let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("web-{n}"), "namespace": "default"},
                    "spec": {"containers": [{"name": "web", "image": image}]}});
                assert!(
                    image_swapper_policy::plan::write_record(&mut pod, &[&image], &policy),
                    "no record for {image}"
                );
                pod
            })
            .collect();
        let pods_path = dir.join(format!("pods-{pods}.json"));
        std::fs::write(
            &pods_path,
            json!({"kind": "List", "items": items}).to_string(),
        )
        .expect("pods");
        let mut times = Vec::new();
        let mut copies = 0;
        for _ in 0..3 {
            let started = Instant::now();
            let output = std::process::Command::new(binary)
                .arg("list")
                .arg("--pods")
                .arg(&pods_path)
                .arg("--settings")
                .arg(&settings_path)
                .output()
                .expect("fill-mirror");
            times.push(started.elapsed());
            assert!(output.status.success(), "{output:?}");
            copies = String::from_utf8_lossy(&output.stdout).lines().count();
        }
        assert_eq!(copies, pods.div_ceil(10), "one copy per distinct image");
        times.sort();
        println!("| {pods} | {copies} | {:.2} |", times[1].as_secs_f64());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

const DISTANCES_MS: [u64; 3] = [0, 20, 100];

/// A mirror holding `bench/library/app{i}:1` for i < n, and the way to it `ms` away.
fn distant_mirror(name: &str, n: usize) -> TestRegistry {
    let mirror = TestRegistry::start(name).expect("registry (make deps)");
    push_apps(&mirror, "bench", n);
    mirror
}

/// A Pod of `app{i}:1` images; `targets` are the mirror hosts, tried in order.
fn pod_payload(targets: &[&str], images: impl Iterator<Item = usize>) -> Vec<u8> {
    let containers: Vec<Value> = images
        .map(|i| json!({"name": format!("c{i}"), "image": format!("app{i}:1")}))
        .collect();
    let targets: Vec<Value> = targets
        .iter()
        .map(|host| json!({"target": format!("{host}/bench")}))
        .collect();
    let settings = json!({"mirrors": [{"source": "docker.io", "targets": targets}]});
    json!({"settings": settings, "request": rig::pod_request("CREATE", json!({"containers": containers}))})
        .to_string()
        .into_bytes()
}

/// `runs` admissions of `payload`, each against a live host of its own: the median time in ms,
/// the lookups and answer of the last, and how many policy-server would have interrupted (its
/// evaluation timeout: refused, code 500).
fn median_of_live_runs(
    policy: &WasmPolicy,
    payload: &[u8],
    runs: usize,
) -> (f64, usize, rig::Response, usize) {
    let mut times = Vec::new();
    let mut last = None;
    let mut interrupted = 0;
    for _ in 0..runs {
        let host = Arc::new(Mutex::new(LiveHost::default()));
        let started = Instant::now();
        let evaluation = policy.call("validate", payload, host.clone());
        times.push(started.elapsed());
        let answer = rig::answer_of(&evaluation, "");
        interrupted += usize::from(answer.interrupted());
        let lookups = host.lock().map(|h| h.exchanges.len()).unwrap_or(0);
        last = Some((lookups, answer));
    }
    times.sort();
    let median = times
        .get(runs / 2)
        .map_or(0.0, |t| t.as_secs_f64() * 1000.0);
    let (lookups, answer) = last.expect("at least one run");
    (median, lookups, answer, interrupted)
}

fn swapped_images(answer: &rig::Response) -> usize {
    answer
        .mutated
        .as_ref()
        .and_then(|pod| pod["spec"]["containers"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter(|c| c["image"].as_str().is_some_and(|i| i.contains("@sha256:")))
        .count()
}

/// One admission at a time, the mirror at a distance (two round trips per connection, one per
/// request: four per lookup), the default budget of 800 ms. With `walk`, the rule lists two
/// mirrors at that distance and the first lacks every image: each image costs two lookups.
fn distance(policy: &WasmPolicy, walk: bool) {
    let runs = runs(3);
    let what = if walk {
        "two mirrors in order, the first lacking every image"
    } else {
        "one mirror"
    };
    println!(
        "\nregistry distance, {what} (round trip added to every connection and request; a lookup is four round trips), default lookup budget 800 ms, fresh instance, median of {runs}; interrupted: runs policy-server's 2 s evaluation timeout stopped (refused, code 500)"
    );
    println!(
        "| round trip ms | distinct images | lookups made | images swapped | ms per admission | interrupted |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    let mirror = distant_mirror("distance", 30);
    let empty = TestRegistry::start("distance-empty").expect("registry (make deps)");
    for round_trip in DISTANCES_MS {
        let delay = Duration::from_millis(round_trip);
        let proxy = LatencyProxy::start(&mirror.host, delay).expect("proxy");
        let empty_proxy = LatencyProxy::start(&empty.host, delay).expect("proxy");
        let targets: Vec<&str> = match walk {
            true => vec![&empty_proxy.host, &proxy.host],
            false => vec![&proxy.host],
        };
        for images in [1, 5, 30] {
            let payload = pod_payload(&targets, 0..images);
            let (median, lookups, answer, interrupted) =
                median_of_live_runs(policy, &payload, runs);
            println!(
                "| {round_trip} | {images} | {lookups} | {} | {median:.0} | {interrupted} of {runs} |",
                swapped_images(&answer)
            );
        }
    }
}

/// `verifySource`: one image, the source and the mirror both at the distance, for the four
/// comparisons people meet: an identical copy (the digests), a copy of one platform of a
/// two-platform source with `platforms: [linux/amd64]` (the source's index lists the mirror's
/// digest), a copy re-encoded to another manifest format (both manifests), and a stale copy (the
/// tag moved upstream; both manifests). At the default budget and at 2,000 ms, so that the
/// figures say what budget each case needs.
fn verify_source(policy: &WasmPolicy) {
    let runs = runs(3);
    println!(
        "\nverifySource, one image, the source and the mirror at the distance; lookups made, the decision, and ms per admission (median of {runs})"
    );
    println!("| round trip ms | comparison | budget ms | lookups | decision | ms per admission |");
    println!("|---:|---|---:|---:|---|---:|");
    let upstream = TestRegistry::start("vs-upstream").expect("registry (make deps)");
    let mirror = TestRegistry::start("vs-mirror").expect("registry (make deps)");
    let image = Image::new("app v1", "linux/amd64");
    // (name, repository, platforms)
    let cases: [(&str, &str, &[&str]); 4] = [
        ("same digest", "copy", &[]),
        ("one platform", "subset", &["linux/amd64"]),
        ("re-encoded", "converted", &[]),
        ("stale", "moved", &[]),
    ];
    for (_, repository, _) in cases {
        let repository = format!("library/{repository}");
        let copy = match repository.as_str() {
            "library/subset" => {
                let arm64 = Image::new("app v1", "linux/arm64");
                Index::new(vec![image.clone(), arm64]).push(&upstream, &repository, "1");
                image.clone()
            }
            "library/converted" => {
                image.push(&upstream, &repository, Some("1"));
                image.as_docker_v2()
            }
            "library/moved" => {
                image.push(&upstream, &repository, Some("1"));
                Image::new("app v0", "linux/amd64")
            }
            _ => {
                image.push(&upstream, &repository, Some("1"));
                image.clone()
            }
        };
        copy.push(&mirror, &format!("up/{repository}"), Some("1"));
    }
    // 50 ms: about 200 ms a lookup, as against a plain-HTTP registry tried over HTTPS first.
    for round_trip in [0, 20, 50, 100] {
        let delay = Duration::from_millis(round_trip);
        let up = LatencyProxy::start(&upstream.host, delay).expect("proxy");
        let down = LatencyProxy::start(&mirror.host, delay).expect("proxy");
        for (name, repository, platforms) in cases {
            for budget in [800, 2000] {
                let settings = json!({
                    "mirrors": [{"source": up.host, "target": format!("{}/up", down.host)}],
                    "verifySource": true,
                    "platforms": platforms,
                    "lookupBudgetMilliseconds": budget,
                });
                let request = rig::pod_request(
                    "CREATE",
                    json!({"containers": [{"name": "app", "image": format!("{}/library/{repository}:1", up.host)}]}),
                );
                let payload = json!({"settings": settings, "request": request})
                    .to_string()
                    .into_bytes();
                let (median, lookups, answer, _) = median_of_live_runs(policy, &payload, runs);
                let warned = |text: &str| answer.warnings.iter().any(|w| w.contains(text));
                let decision = match &answer.mutated {
                    _ if answer.interrupted() => "refused: interrupted (500)",
                    Some(_) => "swapped",
                    None if warned("lookup budget") => "kept: budget",
                    None if warned("the mirror copy is stale") => "kept: stale",
                    None => "kept",
                };
                println!(
                    "| {round_trip} | {name} | {budget} | {lookups} | {decision} | {median:.0} |"
                );
            }
        }
    }
}

/// policy-server's workers: `workers` threads evaluating back to back for a while, sharing one
/// host whose lookups are serialised behind one lock and cached for 60 s when successful
/// (policy-evaluator's `cached`). Each Pod has 4 images: 2 shared by every Pod (cache hits after
/// the first) and 2 never asked before.
fn concurrency() {
    let seconds = if runs(4) < 4 { 2 } else { 6 };
    const FRESH_POOL: usize = 400;
    println!(
        "\nconcurrent admissions ({seconds} s each; Pods of 4 images, 2 of them fresh; host lookups serialised and cached as in policy-server; default budget 800 ms)"
    );
    println!(
        "| round trip ms | workers | admissions/s | median ms | max ms | over 1 s | refused | images swapped | kept by the budget |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mirror = distant_mirror("concurrency", FRESH_POOL + 2);
    for round_trip in [20, 100] {
        for workers in [1, 2, 4] {
            let proxy = LatencyProxy::start(&mirror.host, Duration::from_millis(round_trip))
                .expect("proxy");
            let lock = Arc::new(LookupLock::default());
            let live = Arc::new(Mutex::new(LiveHost::default()));
            let next_fresh = Arc::new(std::sync::atomic::AtomicUsize::new(2));
            let deadline = Instant::now() + Duration::from_secs(seconds);
            let threads: Vec<_> = (0..workers)
                .map(|_| {
                    let host = SerialisedHost {
                        lock: lock.clone(),
                        inner: live.clone(),
                    };
                    let proxy_host = proxy.host.clone();
                    let next_fresh = next_fresh.clone();
                    // The compiled module is shared by the workers, as policy-server shares it.
                    let policy: &'static WasmPolicy = rig::policy();
                    std::thread::spawn(move || {
                        let mut results = Vec::new();
                        while Instant::now() < deadline {
                            let a = next_fresh.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
                            if a + 1 >= FRESH_POOL + 2 {
                                break;
                            }
                            let payload =
                                pod_payload(&[proxy_host.as_str()], [0, 1, a, a + 1].into_iter());
                            let shared: SharedHost = Arc::new(Mutex::new(host.clone()));
                            let started = Instant::now();
                            let evaluation = policy.call("validate", &payload, shared);
                            let took = started.elapsed();
                            let answer = rig::answer_of(&evaluation, "");
                            let budget = answer
                                .audit
                                .get("summary")
                                .and_then(|s| s["notLookedUp"].as_u64())
                                .unwrap_or(0);
                            results.push((took, swapped_images(&answer), budget, answer.accepted));
                        }
                        results
                    })
                })
                .collect();
            let started = Instant::now();
            let mut results: Vec<(Duration, usize, u64, bool)> = threads
                .into_iter()
                .flat_map(|t| t.join().expect("worker"))
                .collect();
            let elapsed = started.elapsed().as_secs_f64();
            results.sort_by_key(|r| r.0);
            let n = results.len().max(1);
            let median = results.get(n / 2).map_or(Duration::ZERO, |r| r.0);
            let max = results.last().map_or(Duration::ZERO, |r| r.0);
            let over = results
                .iter()
                .filter(|r| r.0 > Duration::from_secs(1))
                .count();
            let swapped: usize = results.iter().map(|r| r.1).sum();
            let budget: u64 = results.iter().map(|r| r.2).sum();
            let refused = results.iter().filter(|r| !r.3).count();
            println!(
                "| {round_trip} | {workers} | {:.1} | {:.0} | {:.0} | {over} of {} | {refused} | {swapped} of {} | {budget} |",
                results.len() as f64 / elapsed,
                median.as_secs_f64() * 1000.0,
                max.as_secs_f64() * 1000.0,
                results.len(),
                results.len() * 4,
            );
        }
    }
}

/// How many fresh lookups one policy-server process completes a second: its host serialises
/// them behind one lock, so 2 workers evaluating Pods of one fresh image each finish about one
/// lookup's time apart. Per host model (the rig's 1.31 and 1.35) and distance, over HTTPS.
fn throughput() {
    const PODS: usize = 12;
    println!(
        "\nlookup throughput of one policy-server process (2 workers, {PODS} Pods of one fresh image each, over HTTPS)"
    );
    println!("| host model | round trip ms | one lookup ms | lookups/s |");
    println!("|---|---:|---:|---:|");
    let mirror = distant_mirror("throughput", PODS);
    for model in HostModel::ALL {
        for round_trip in [20, 50, 100] {
            let proxy = LatencyProxy::start_as(
                &mirror.host,
                Duration::from_millis(round_trip),
                model,
                Transport::Https,
            )
            .expect("proxy");
            let lock = Arc::new(LookupLock::default());
            let live = Arc::new(Mutex::new(LiveHost::default()));
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let started = Instant::now();
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let host = SerialisedHost {
                        lock: lock.clone(),
                        inner: live.clone(),
                    };
                    let (proxy_host, next) = (proxy.host.clone(), next.clone());
                    let policy: &'static WasmPolicy = rig::policy();
                    std::thread::spawn(move || {
                        loop {
                            let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if n >= PODS {
                                return;
                            }
                            let payload = pod_payload(&[proxy_host.as_str()], [n].into_iter());
                            let shared: SharedHost = Arc::new(Mutex::new(host.clone()));
                            // An interrupted evaluation is policy-server's refusal: counted in
                            // time, like any other.
                            let _ = rig::answer_of(&policy.call("validate", &payload, shared), "");
                        }
                    })
                })
                .collect();
            for thread in threads {
                thread.join().expect("worker");
            }
            let elapsed = started.elapsed().as_secs_f64();
            let lookups = live.lock().map(|l| l.exchanges.len()).unwrap_or(0);
            println!(
                "| {} | {round_trip} | {:.0} | {:.1} |",
                model.name(),
                elapsed * 1000.0 / lookups.max(1) as f64,
                lookups as f64 / elapsed
            );
        }
    }
}
