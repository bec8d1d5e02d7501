//! policy-server 1.38's lookups, through the built module, beside 1.35's: one process whose
//! concurrent evaluations look up different images at once (1.35 serialises them behind its
//! process-wide lock), and whose identical concurrent misses make one registry call (moka's
//! `entry().or_try_insert_with`), a failure shared with the waiting calls but not kept. The
//! mirror is a real registry behind the latency proxy, which counts the requests it relays.

mod rig;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rig::hosts::{HOST_CACHE, LiveHost, LookupLock, SerialisedHost};
use rig::images::push_apps;
use rig::proxy::{HostModel, LatencyProxy, Transport};
use rig::registry::TestRegistry;
use rig::wapc::SharedHost;
use rig::{Response, pod_request, validate};
use serde_json::{Value, json};

fn pod(image: &str) -> Value {
    pod_request(
        "CREATE",
        json!({"containers": [{"name": "web", "image": image}]}),
    )
}

fn settings(mirror: &str) -> Value {
    json!({"mirrors": [{"source": "docker.io", "target": format!("{mirror}/hub")}]})
}

fn far(registry: &TestRegistry, round_trip: u64, model: HostModel) -> LatencyProxy {
    LatencyProxy::start_as(
        &registry.host,
        Duration::from_millis(round_trip),
        model,
        Transport::Https,
    )
    .expect("proxy")
}

/// One policy-server process of `model`'s release: its lookups and cache over one live host.
struct Process {
    lock: Arc<LookupLock>,
    live: Arc<Mutex<LiveHost>>,
}

impl Process {
    fn of(model: HostModel) -> Process {
        Process {
            lock: Arc::new(LookupLock::for_model(model)),
            live: Arc::new(Mutex::new(LiveHost {
                error_shape: model.error_shape(),
                ..LiveHost::default()
            })),
        }
    }

    fn evaluation(&self) -> SharedHost {
        Arc::new(Mutex::new(SerialisedHost {
            lock: self.lock.clone(),
            inner: self.live.clone(),
        }))
    }

    /// Admits one Pod of each image at once, one evaluation a worker; each answer and the time
    /// until the last one.
    fn admit_at_once(&self, settings: &Value, images: &[String]) -> (Vec<Response>, Duration) {
        let start = Arc::new(Barrier::new(images.len() + 1));
        let workers: Vec<_> = images
            .iter()
            .map(|image| {
                let (start, host) = (start.clone(), self.evaluation());
                let (settings, request) = (settings.clone(), pod(image));
                thread::spawn(move || {
                    start.wait();
                    validate(&settings, &request, host)
                })
            })
            .collect();
        let started = Instant::now();
        start.wait();
        let responses = workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect();
        (responses, started.elapsed())
    }

    fn exchanges(&self) -> usize {
        self.live.lock().unwrap().exchanges.len()
    }
}

/// Two admissions at once, each of an image the process has not looked up, the mirror 50 ms
/// away over HTTPS. On 1.35 the second lookup waits behind the first: together they take two
/// lookups' time. On 1.38 they run at once: about one lookup's time. Both are swapped.
#[test]
fn two_concurrent_admissions_of_fresh_images_take_one_lookup_on_1_38_and_two_on_1_35() {
    let mirror = TestRegistry::start("parallel-fresh").expect("registry");
    push_apps(&mirror, "hub", 6);
    rig::policy();
    let mut together = Vec::new();
    for (model, first) in [(HostModel::V1_35, 0), (HostModel::V1_38, 3)] {
        let proxy = far(&mirror, 50, model);
        let settings = settings(&proxy.host);
        // One admission alone, on a process of its own: what one lookup costs here.
        let alone = Process::of(model);
        let (_, single) = alone.admit_at_once(&settings, &[format!("app{first}:1")]);
        let process = Process::of(model);
        let images = [format!("app{}:1", first + 1), format!("app{}:1", first + 2)];
        let (responses, both) = process.admit_at_once(&settings, &images);
        for (response, image) in responses.iter().zip(&images) {
            assert!(
                response
                    .image("containers", 0)
                    .is_some_and(|swapped| swapped
                        .starts_with(&format!("{}/hub/library/{image}@sha256:", proxy.host))),
                "{}: {response:?}",
                model.name()
            );
        }
        assert_eq!(process.exchanges(), 2, "{}", model.name());
        eprintln!(
            "policy-server {}: one fresh lookup alone {single:?}; two admissions at once, a fresh image each: {both:?}",
            model.name()
        );
        let ratio = both.as_secs_f64() / single.as_secs_f64();
        match model.lookups() {
            rig::hosts::Lookups::Serialised => assert!(ratio > 1.6, "{}: {ratio:.2}", model.name()),
            rig::hosts::Lookups::Parallel => assert!(ratio < 1.4, "{}: {ratio:.2}", model.name()),
        }
        together.push(both);
    }
    assert!(
        together[1] < together[0],
        "1.38's two admissions end before 1.35's: {together:?}"
    );
}

/// Four admissions at once of one image the mirror lacks, the mirror 100 ms away. On 1.38 they
/// make one registry call between them (the others wait for it and share its failure), and
/// the failure is not kept: the next admission asks again. On 1.35 each of them asks, one after
/// the other. The registry's requests are counted at the proxy, against one lookup's count.
#[test]
fn identical_concurrent_misses_make_one_registry_call_on_1_38() {
    const AT_ONCE: usize = 4;
    let mirror = TestRegistry::start("parallel-misses").expect("registry");
    push_apps(&mirror, "hub", 1);
    rig::policy();
    for model in [HostModel::V1_35, HostModel::V1_38] {
        let proxy = far(&mirror, 100, model);
        let settings = settings(&proxy.host);
        let requests = || proxy.requests.load(Ordering::Relaxed);
        // One failed lookup alone: the registry's requests for it.
        let before = requests();
        let (alone, _) = Process::of(model).admit_at_once(&settings, &["other:1".to_string()]);
        assert!(alone[0].images_unchanged(&pod("other:1")), "{alone:?}");
        let one_lookup = requests() - before;
        assert!(one_lookup >= 2, "a ping and the manifest: {one_lookup}");

        let process = Process::of(model);
        let before = requests();
        let missing = vec!["nope:1".to_string(); AT_ONCE];
        let (responses, took) = process.admit_at_once(&settings, &missing);
        let asked = requests() - before;
        for response in &responses {
            assert!(
                response.accepted && response.warned("the mirror does not have it"),
                "{}: {response:?}",
                model.name()
            );
            assert_eq!(response.audit["kept"][0]["reason"], json!("absent"));
        }
        eprintln!(
            "policy-server {}: {AT_ONCE} admissions at once of one missing image: {asked} registry requests ({one_lookup} a lookup), {} host lookups, {took:?}",
            model.name(),
            process.exchanges()
        );
        match model.lookups() {
            rig::hosts::Lookups::Parallel => {
                assert_eq!(asked, one_lookup, "one registry call between them");
                assert_eq!(process.exchanges(), 1);
            }
            rig::hosts::Lookups::Serialised => {
                assert_eq!(asked, AT_ONCE * one_lookup, "each asks, in turn");
                assert_eq!(process.exchanges(), AT_ONCE);
            }
        }
        // A failure is never kept: the next admission of it asks the registry again.
        let before = requests();
        process.admit_at_once(&settings, &missing[..1]);
        assert_eq!(requests() - before, one_lookup, "{}", model.name());
    }
}

/// On 1.38 a success is shared with the identical calls in flight and kept for 60 s: four
/// admissions at once of one present image make one registry call, the next admission none,
/// and one a minute later asks again.
#[test]
fn identical_concurrent_lookups_of_a_present_image_are_one_call_kept_60_s_on_1_38() {
    const AT_ONCE: usize = 4;
    let mirror = TestRegistry::start("parallel-hits").expect("registry");
    push_apps(&mirror, "hub", 1);
    rig::policy();
    let model = HostModel::V1_38;
    let proxy = far(&mirror, 100, model);
    let settings = settings(&proxy.host);
    let requests = || proxy.requests.load(Ordering::Relaxed);
    let process = Process::of(model);
    let before = requests();
    let present = vec!["app0:1".to_string(); AT_ONCE];
    let (responses, _) = process.admit_at_once(&settings, &present);
    let one_lookup = requests() - before;
    assert!(one_lookup >= 2, "{one_lookup}");
    for response in &responses {
        assert!(
            response
                .image("containers", 0)
                .is_some_and(|image| image
                    .starts_with(&format!("{}/hub/library/app0:1@sha256:", proxy.host))),
            "{response:?}"
        );
    }
    assert_eq!(process.exchanges(), 1, "one lookup between them");
    let before = requests();
    process.admit_at_once(&settings, &present[..1]);
    assert_eq!(requests() - before, 0, "cached");
    process.lock.advance(HOST_CACHE);
    process.admit_at_once(&settings, &present[..1]);
    assert_eq!(requests() - before, one_lookup, "asked again after 60 s");
    assert_eq!(process.exchanges(), 2);
}
