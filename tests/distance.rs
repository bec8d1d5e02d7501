//! A registry far away, through the built module: the lookup budget keeps every admission inside
//! policy-server's evaluation timeout. The mirror is a real registry behind a proxy that adds
//! round trips to every connection and request; the module reads its own clock (WASI
//! `clock_time_get`), which is how these tests also show that the clock works under the host.
//! Each test runs under every host model: policy-server 1.31's lookups, 1.35's, which cost two
//! round trips more, and 1.38's, which cost 1.35's but are no longer serialised per process
//! (`rig::proxy::HostModel`, `rig::hosts::Lookups`).

mod rig;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rig::hosts::{LiveHost, LookupLock, SerialisedHost};
use rig::images::push_apps;
use rig::proxy::{HostModel, HostProcess, LatencyProxy, Transport};
use rig::registry::TestRegistry;
use rig::wapc::SharedHost;
use rig::{Response, pod_request, shared, validate};
use serde_json::{Value, json};

const BUDGET_MS: u64 = 800;

/// A mirror holding `app0:1` … `app{n-1}:1` under `hub/library/`.
/// A mirror `round_trip` away over HTTPS, for `model`'s host.
fn far(mirror: &TestRegistry, round_trip: u64, model: HostModel) -> LatencyProxy {
    LatencyProxy::start_as(
        &mirror.host,
        Duration::from_millis(round_trip),
        model,
        Transport::Https,
    )
    .expect("proxy")
}

fn filled_mirror(name: &str, n: usize) -> TestRegistry {
    let mirror = TestRegistry::start(name).expect("registry");
    push_apps(&mirror, "hub", n);
    mirror
}

fn pod(images: impl Iterator<Item = String>) -> Value {
    let containers: Vec<Value> = images
        .enumerate()
        .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
        .collect();
    pod_request("CREATE", json!({ "containers": containers }))
}

fn settings(mirror_host: &str, extra: Value) -> Value {
    let mut settings = json!({
        "mirrors": [{"source": "docker.io", "target": format!("{mirror_host}/hub")}],
        "lookupBudgetMilliseconds": BUDGET_MS,
    });
    if let (Some(settings), Some(extra)) = (settings.as_object_mut(), extra.as_object()) {
        settings.extend(extra.clone());
    }
    settings
}

/// The images of the mutated Pod, or the requested ones when nothing changed.
fn images(response: &Response, request: &Value) -> Vec<String> {
    let pod = response.mutated.as_ref().unwrap_or(&request["object"]);
    pod["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .map(|c| c["image"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// How many of the first containers were swapped; asserts the rest were kept as written.
fn swapped_prefix(images: &[String], mirror_host: &str) -> usize {
    let swapped = images
        .iter()
        .take_while(|i| i.starts_with(mirror_host) && i.contains("@sha256:"))
        .count();
    for (i, image) in images.iter().enumerate().skip(swapped) {
        assert_eq!(
            image,
            &format!("app{i}:1"),
            "container {i}: kept as written"
        );
    }
    swapped
}

#[test]
fn a_pod_of_32_images_on_a_mirror_100_ms_away_is_admitted_in_time_with_the_first_swapped() {
    let mirror = filled_mirror("far", 32);
    for model in HostModel::ALL {
        images_100_ms_away(&mirror, model);
    }
}

fn images_100_ms_away(mirror: &TestRegistry, model: HostModel) {
    let far = far(mirror, 100, model);
    let lookup_ms = model.lookup(Duration::from_millis(100)).as_millis() as u64;
    let request = pod((0..32).map(|i| format!("app{i}:1")));
    let host = shared(LiveHost::default());
    rig::policy(); // compiled once per process, as policy-server does, before the clock starts
    let started = Instant::now();
    let response = validate(&settings(&far.host, json!({})), &request, host.clone());
    let took = started.elapsed();

    assert!(response.accepted, "{response:?}");
    let images = images(&response, &request);
    let swapped = swapped_prefix(&images, &far.host);
    let lookups = host.lock().unwrap().exchanges.len();
    assert!((1..32).contains(&swapped), "{swapped} swapped: {images:?}");
    assert_eq!(
        lookups, swapped,
        "one lookup per swapped image, none after the budget"
    );
    let kept = 32 - swapped;
    let warning = response
        .warnings
        .iter()
        .find(|w| w.starts_with("lookup budget of 800 ms: "))
        .unwrap_or_else(|| panic!("no budget warning in {:?}", response.warnings));
    let made = match lookups {
        1 => "1 lookup".to_string(),
        n => format!("{n} lookups"),
    };
    assert!(
        warning.contains(&format!("ms of it in {made} (the slowest "))
            && warning.contains(&format!("{kept} images were not looked up or compared in time and kept as they were (onLookupError is keep)"))
            && warning.contains(&format!("({} would need about ", far.host)),
        "{warning}"
    );
    // A lookup costs four round trips on 1.31 (connect, TLS, GET /v2/, HEAD), 400 ms, and six
    // on 1.35, 600 ms. The budget starts no second lookup on a registry whose first would end
    // past 800 ms, so the evaluation ends before policy-server's default timeout (2 s) can
    // interrupt it: that comes at the first tick of its one-second clock after 1 s.
    assert!(
        took < Duration::from_secs(1),
        "policy-server {}: took {took:?}",
        model.name()
    );
    // The module's own clock saw the lookups take their time.
    let summary = &response.audit["summary"];
    let spent = summary["lookupMilliseconds"].as_u64().expect("spent");
    assert!(
        spent >= lookup_ms * lookups as u64 - 50 && spent as u128 <= took.as_millis(),
        "the module measured {spent} ms of {took:?}"
    );
    assert_eq!(summary["kept"], json!(kept));
    assert_eq!(summary["notLookedUp"], json!(kept));
}

/// A proxy `round_trip` away for lookups of `process`.
fn far_in(
    registry: &TestRegistry,
    round_trip: u64,
    model: HostModel,
    process: &HostProcess,
) -> LatencyProxy {
    LatencyProxy::start_in(
        &registry.host,
        Duration::from_millis(round_trip),
        model,
        Transport::Https,
        process,
    )
    .expect("proxy")
}

/// One policy-server process of `model`'s release: its lookups (behind its lock up to 1.37)
/// and 60-second cache, over one live host.
fn policy_server(model: HostModel) -> (Arc<LookupLock>, Arc<Mutex<LiveHost>>) {
    (
        Arc::new(LookupLock::for_model(model)),
        Arc::new(Mutex::new(LiveHost {
            error_shape: model.error_shape(),
            ..LiveHost::default()
        })),
    )
}

fn evaluation(lock: &Arc<LookupLock>, live: &Arc<Mutex<LiveHost>>) -> SharedHost {
    Arc::new(Mutex::new(SerialisedHost {
        lock: lock.clone(),
        inner: live.clone(),
    }))
}

/// Issue 31: a rule with two targets on two hosts, each 20 ms away over HTTPS; the first lacks
/// a fresh image, the second holds it. Three Pods, one fresh image each, through one fresh
/// policy-server process (its first lookup cold), at the default budget and at 1.5 and 2.5 s.
/// Predicted at five times the first answer (0.4.0), the second target was never asked at the
/// default budget on 1.35 (0 of 3, as measured on the real host), and not on the cold
/// admission at any budget; now every Pod is swapped to the second target.
#[test]
fn ordered_mirrors_fail_over_between_hosts_20_ms_away() {
    let first = TestRegistry::start("failover-first").expect("registry");
    let second = TestRegistry::start("failover-second").expect("registry");
    push_apps(&second, "hub", 9);
    rig::policy();
    for model in HostModel::ALL {
        let mut row = Vec::new();
        for (n, budget) in [800u64, 1_500, 2_500].into_iter().enumerate() {
            let process = HostProcess::fresh();
            let first_far = far_in(&first, 20, model, &process);
            let second_far = far_in(&second, 20, model, &process);
            let settings = json!({
                "mirrors": [{"source": "docker.io", "targets": [
                    {"target": format!("{}/hub", first_far.host)},
                    {"target": format!("{}/hub", second_far.host)},
                ]}],
                "lookupBudgetMilliseconds": budget,
            });
            let (lock, live) = policy_server(model);
            let mut swapped = 0;
            let mut first_costs = Vec::new();
            let mut kept = Vec::new();
            for pod_n in 0..3 {
                let image = format!("app{}:1", n * 3 + pod_n);
                let request = pod(std::iter::once(image.clone()));
                let started = Instant::now();
                let response = validate(&settings, &request, evaluation(&lock, &live));
                let took = started.elapsed();
                assert!(response.accepted, "{response:?}");
                let exchanges = live.lock().unwrap().exchanges.len();
                assert!(exchanges >= 1);
                let summary = &response.audit["summary"];
                first_costs.push(summary["lookupMilliseconds"].as_u64().unwrap_or(0));
                let got = images(&response, &request);
                if got[0].starts_with(&format!("{}/hub/library/{image}@sha256:", second_far.host)) {
                    swapped += 1;
                } else {
                    kept.push(format!(
                        "Pod {pod_n} kept after {took:?}: {:?}",
                        response.warnings
                    ));
                }
                // Within the budget and one lookup of the slowest registry, with room to spare
                // under the documented timeoutEvalSeconds.
                let bound = Duration::from_millis(budget)
                    + model.lookup(Duration::from_millis(20))
                    + model.cold_start();
                assert!(took < bound, "{took:?} against {bound:?}");
            }
            row.push((
                format!("{budget} ms: {swapped} of 3 (lookups {first_costs:?} ms)"),
                kept,
            ));
        }
        eprintln!(
            "policy-server {}: ordered targets 20 ms away, the first lacking the image: {}",
            model.name(),
            row.iter()
                .map(|(figures, _)| figures.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        );
        for (figures, kept) in &row {
            assert!(
                kept.is_empty(),
                "policy-server {}, {figures}: {kept:?}",
                model.name()
            );
        }
    }
}

/// Two mirrors, 20 ms and 100 ms away, and a Pod that names six images of the near one, then
/// one of the far one, admitted three times by one fresh policy-server process (its lock and
/// 60-second cache). The far mirror is asked second, while the budget is fresh, and its image
/// is swapped on every admission; nothing starts after the budget has run out, so every
/// admission ends within the budget and one lookup of the far registry: before 1.6 s.
/// On 1.35 and 1.38 the fresh process's cold start makes the near registry's first lookup
/// refuse every later near one, so the far mirror comes second in container order too; the
/// order itself is shown by `a_far_mirror_the_pod_names_last_is_asked_while_the_budget_is_fresh`.
/// The `timeoutEvalSeconds` of the near-and-far admissions.
const NEAR_AND_FAR_TIMEOUT_S: u64 = 3;

#[test]
fn a_near_and_a_far_mirror_each_predicted_from_its_own_timing() {
    let near_registry = filled_mirror("two-near", 6);
    let far_registry = filled_mirror("two-far", 1);
    for model in HostModel::ALL {
        near_and_far(&near_registry, &far_registry, model);
    }
}

fn near_and_far(near_registry: &TestRegistry, far_registry: &TestRegistry, model: HostModel) {
    let process = HostProcess::fresh();
    let near = far_in(near_registry, 20, model, &process);
    let far = far_in(far_registry, 100, model, &process);
    let settings = json!({
        "mirrors": [
            {"source": "docker.io", "target": format!("{}/hub", near.host)},
            {"source": "quay.io/far", "target": format!("{}/hub/library", far.host)},
        ],
        "lookupBudgetMilliseconds": BUDGET_MS,
    });
    let request = pod((0..6)
        .map(|i| format!("app{i}:1"))
        .chain(std::iter::once("quay.io/far/app0:1".to_string())));
    let (lock, live) = policy_server(model);
    rig::policy();
    for admission in 0..3 {
        let started = Instant::now();
        // timeoutEvalSeconds as the time rule sizes it for this budget and the far lookup
        // (budget + one lookup + 1 s): under the 2 s default an evaluation past 1 s may be
        // interrupted at the host's tick, on a loaded machine too.
        let response = rig::validate_within(
            &settings,
            &request,
            evaluation(&lock, &live),
            Some(NEAR_AND_FAR_TIMEOUT_S),
        );
        let took = started.elapsed();
        assert!(response.accepted, "{response:?}");
        let images = images(&response, &request);
        let summary = &response.audit["summary"];
        let evaluation_ms = summary["evaluationMilliseconds"].as_u64().expect("ms");
        eprintln!(
            "policy-server {}, admission {admission}: near mirror 20 ms, far mirror 100 ms away: {took:?}, the module measured {evaluation_ms} ms; {:?}",
            model.name(),
            response.warnings
        );
        assert!(
            images[6].starts_with(&format!("{}/hub/library/app0:1@sha256:", far.host)),
            "policy-server {}, admission {admission}: {images:?} {:?}",
            model.name(),
            response.warnings
        );
        assert!(
            took < Duration::from_millis(1_600),
            "policy-server {}, admission {admission}: {took:?}",
            model.name()
        );
        // The near images not looked up in time name their registry, what a lookup there
        // would need, and what was left: never "spent" while most of the budget was left.
        for warning in &response.warnings {
            assert!(
                warning.starts_with("lookup budget of 800 ms: ")
                    && (warning.contains(&format!("({} would need about ", near.host))
                        || warning.contains(&format!(
                            "(the budget had run out before a lookup on {})",
                            near.host
                        ))),
                "{warning}"
            );
        }
    }
}

/// The budget's order of lookups, seen where it decides the outcome: a Pod that names six
/// images of a mirror 20 ms away, then one of a mirror 100 ms away, through a warm
/// policy-server process (its cold start spent, which would otherwise make the near registry's
/// first lookup the slowest and refuse every later one, whatever the order). The far mirror is
/// asked second, while the budget is fresh, and the near images fill what is left: the
/// evaluation ends within the budget and one near lookup. In container order the near lookups
/// would spend the budget first and the far one would start at its end, ending about a far
/// lookup past it (issue 40, item 4).
#[test]
fn a_far_mirror_the_pod_names_last_is_asked_while_the_budget_is_fresh() {
    let near_registry = filled_mirror("last-near", 6);
    let far_registry = filled_mirror("last-far", 1);
    rig::policy();
    for model in HostModel::ALL {
        far_named_last(&near_registry, &far_registry, model);
    }
}

fn far_named_last(near_registry: &TestRegistry, far_registry: &TestRegistry, model: HostModel) {
    let process = HostProcess::warm();
    let near = far_in(near_registry, 20, model, &process);
    let far = far_in(far_registry, 100, model, &process);
    let settings = json!({
        "mirrors": [
            {"source": "docker.io", "target": format!("{}/hub", near.host)},
            {"source": "quay.io/far", "target": format!("{}/hub/library", far.host)},
        ],
        "lookupBudgetMilliseconds": BUDGET_MS,
    });
    let request = pod((0..6)
        .map(|i| format!("app{i}:1"))
        .chain(std::iter::once("quay.io/far/app0:1".to_string())));
    let host = shared(LiveHost::default());
    let response = rig::validate_within(
        &settings,
        &request,
        host.clone(),
        Some(NEAR_AND_FAR_TIMEOUT_S),
    );
    let name = model.name();
    assert!(response.accepted, "policy-server {name}: {response:?}");
    let asked: Vec<String> = host
        .lock()
        .unwrap()
        .exchanges
        .iter()
        .map(|exchange| exchange.image.clone())
        .collect();
    assert!(
        asked.len() >= 2 && asked[1].starts_with(&far.host),
        "policy-server {name}: the far mirror asked second, while the budget is fresh: {asked:?}"
    );
    let images = images(&response, &request);
    assert!(
        images[6].starts_with(&format!("{}/hub/library/app0:1@sha256:", far.host)),
        "policy-server {name}: {images:?} {:?}",
        response.warnings
    );
    let evaluation_ms = response.audit["summary"]["evaluationMilliseconds"]
        .as_u64()
        .expect("ms");
    let bound = BUDGET_MS + model.lookup(Duration::from_millis(20)).as_millis() as u64;
    eprintln!(
        "policy-server {name}: the far mirror named last, the module measured {evaluation_ms} ms (bound {bound} ms) in {} lookups",
        asked.len()
    );
    assert!(
        evaluation_ms < bound,
        "policy-server {name}: the module measured {evaluation_ms} ms, past the budget and one near lookup ({bound} ms); asked {asked:?}"
    );
}

#[test]
fn with_on_lookup_error_reject_the_budget_refuses_the_pod_and_says_why() {
    let mirror = filled_mirror("far-reject", 30);
    for model in HostModel::ALL {
        let far = far(&mirror, 100, model);
        refused_with_reject(&far);
    }
}

fn refused_with_reject(far: &LatencyProxy) {
    let request = pod((0..30).map(|i| format!("app{i}:1")));
    let response = validate(
        &settings(&far.host, json!({"onLookupError": "reject"})),
        &request,
        shared(LiveHost::default()),
    );
    assert!(!response.accepted);
    let message = response.message.unwrap_or_default();
    assert!(
        message.starts_with("lookup budget of 800 ms: ")
            && message.contains(
                "not looked up or compared in time and refused (onLookupError is reject)"
            ),
        "{message}"
    );
}

#[test]
fn the_same_pod_on_a_near_mirror_is_swapped_whole() {
    let mirror = filled_mirror("near", 30);
    let request = pod((0..30).map(|i| format!("app{i}:1")));
    let host = shared(LiveHost::default());
    let response = validate(&settings(&mirror.host, json!({})), &request, host.clone());
    assert!(response.accepted);
    let images = images(&response, &request);
    assert_eq!(
        swapped_prefix(&images, &mirror.host),
        30,
        "{:?}",
        response.warnings
    );
    assert!(response.warnings.is_empty(), "{:?}", response.warnings);
    assert_eq!(host.lock().unwrap().exchanges.len(), 30);
}

/// policy-server's workers evaluate concurrently while its host serialises lookups behind one
/// lock. Four evaluations of eight fresh images each, the mirror 20 ms away: none overruns
/// (each ends within the budget, plus the wait for one lookup of each other evaluation and one
/// of its own), none is refused, and the images each looked up in time are swapped.
#[test]
fn four_concurrent_admissions_share_the_serialised_host_and_all_finish_in_time() {
    const WORKERS: usize = 4;
    const IMAGES: usize = 8;
    let mirror = filled_mirror("busy", WORKERS * IMAGES);
    for model in HostModel::ALL {
        four_concurrent(&mirror, model, WORKERS, IMAGES);
    }
}

fn four_concurrent(mirror: &TestRegistry, model: HostModel, workers: usize, images_each: usize) {
    let far = far(mirror, 20, model);
    let (lock, live) = policy_server(model);
    rig::policy();
    // One lookup alone: its time, to bound the waits.
    let single = {
        let started = Instant::now();
        let request = pod(std::iter::once("app0:1".to_string()));
        validate(
            &settings(&far.host, json!({})),
            &request,
            shared(LiveHost::default()),
        );
        started.elapsed()
    };
    let threads: Vec<_> = (0..workers)
        .map(|w| {
            let host = SerialisedHost {
                lock: lock.clone(),
                inner: live.clone(),
            };
            let settings = settings(&far.host, json!({}));
            thread::spawn(move || {
                let request =
                    pod((0..images_each).map(|i| format!("app{}:1", w * images_each + i)));
                let shared_host: SharedHost = Arc::new(Mutex::new(host));
                let started = Instant::now();
                let response = validate(&settings, &request, shared_host);
                (started.elapsed(), response, request)
            })
        })
        .collect();
    let mut total_swapped = 0;
    for thread in threads {
        let (took, response, request) = thread.join().expect("worker");
        assert!(response.accepted, "{response:?}");
        let images = images(&response, &request);
        let swapped = images
            .iter()
            .filter(|i| i.starts_with(&far.host) && i.contains("@sha256:"))
            .count();
        total_swapped += swapped;
        let bound = Duration::from_millis(BUDGET_MS) + single * (workers as u32 + 1);
        assert!(took < bound, "took {took:?}, bound {bound:?}");
    }
    let lookups = live.lock().unwrap().exchanges.len();
    assert_eq!(
        total_swapped, lookups,
        "every image looked up in time was swapped"
    );
    assert!(
        lookups >= workers,
        "each evaluation looked up at least its first image"
    );
}
