//! `make bench`: what the policy costs per admission, in the test rig's wasm host.
//!
//! For Pods of 1, 10, 100 and 1,000 containers it prints the evaluation time (median and 99th
//! percentile) with a fresh instance per evaluation (what policy-server does) and with a reused
//! instance, the host lookups per admission, and the guest's peak memory; beside them the floor,
//! a policy that only parses the request and accepts it. Lookups are answered at once from
//! memory, then by a real registry on loopback. A benchmark prints figures; it asserts nothing.

#[path = "../tests/rig/mod.rs"]
mod rig;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rig::hosts::{InstantHost, LiveHost, locate};
use rig::images::Image;
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
    match containers {
        1 | 10 => 400,
        100 => 200,
        _ => 60,
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
    let root = rig::root();
    let policy = rig::policy();
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
}
