//! A mirror that hangs, through the built module: it accepts connections and never answers.
//! No policy can cancel a host call, so the admission waits as long as the connection lives; what
//! the policy can do is start nothing after it. Behind the serialised host (policy-server's
//! process-wide lookup lock), another admission whose mirror is healthy waits too. The README's
//! figures for a hanging registry come from these tests (`cargo test --test hanging_registry --
//! --nocapture` prints them).

mod rig;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rig::hanging::HangingRegistry;
use rig::hosts::{LiveHost, LookupLock, SerialisedHost};
use rig::images::push_apps;
use rig::proxy::HostModel;
use rig::registry::TestRegistry;
use rig::wapc::SharedHost;
use rig::{Response, pod_request, shared, validate};
use serde_json::{Value, json};

/// How long the hanging mirror holds each connection before it dies.
const HOLD: Duration = Duration::from_secs(3);

fn pod(images: &[&str]) -> Value {
    let containers: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
        .collect();
    pod_request("CREATE", json!({ "containers": containers }))
}

fn settings(mirror_host: &str) -> Value {
    json!({"mirrors": [{"source": "docker.io", "target": format!("{mirror_host}/hub")}]})
}

#[test]
fn a_hanging_mirror_holds_the_admission_for_its_first_lookup_and_no_other() {
    let hanging = HangingRegistry::start(HOLD).expect("hanging registry");
    let host = shared(LiveHost::default());
    rig::policy();
    let started = Instant::now();
    let response = validate(
        &settings(&hanging.host),
        &pod(&["app0:1", "app1:1", "app2:1"]),
        host.clone(),
    );
    let took = started.elapsed();
    eprintln!("a Pod of 3 images, its mirror hanging {HOLD:?}: answered after {took:?}");

    assert!(response.accepted, "{response:?}");
    assert!(response.mutated.is_none(), "every image kept as written");
    assert_eq!(
        host.lock().unwrap().exchanges.len(),
        1,
        "the budget starts nothing after the hanging lookup"
    );
    // The host's client ignores the ping that died and asks for the manifest on a new
    // connection, which the registry holds as long: one lookup lasts two connections' lives.
    assert!(
        took >= 2 * HOLD,
        "the host call cannot be interrupted, and outlives its failed ping: {took:?}"
    );
    assert!(
        took < 2 * HOLD + Duration::from_millis(500),
        "nothing after it: {took:?}"
    );
    assert_eq!(
        response.warnings[0],
        format!(
            "image \"app0:1\": kept, not swapped to \"{}/hub/library/app0:1\": could not look it up (error sending request for url (http://{}/v2/hub/library/app0/manifests/1): connection closed before message completed)",
            hanging.host, hanging.host
        )
    );
    assert!(
        response.warnings[1].starts_with("lookup budget of 800 ms: 2 images were not looked up")
            && response.warnings[1].contains(&format!(
                "(the budget had run out before a lookup on {})",
                hanging.host
            ))
            && response.warnings[1].contains("; the evaluation had run 6"),
        "{:?}",
        response.warnings
    );
}

/// policy-server takes one lock around every OCI lookup of the process, for every policy: an
/// admission whose mirror is healthy waits behind the hanging one, and answers only after it.
#[test]
fn behind_the_hosts_lookup_lock_an_admission_with_a_healthy_mirror_waits_too() {
    let hanging = HangingRegistry::start(HOLD).expect("hanging registry");
    let healthy = TestRegistry::start("beside-hanging").expect("registry");
    push_apps(&healthy, "hub", 1);
    // The lock of the releases that have one (1.38's lookups run at once: no such wait).
    let lock = Arc::new(LookupLock::for_model(HostModel::V1_35));
    let live = Arc::new(Mutex::new(LiveHost::default()));
    rig::policy();
    let admit = |mirror: String, delay: Duration| {
        let host: SharedHost = Arc::new(Mutex::new(SerialisedHost {
            lock: lock.clone(),
            inner: live.clone(),
        }));
        thread::spawn(move || -> (Duration, Response) {
            thread::sleep(delay);
            let started = Instant::now();
            let response = validate(&settings(&mirror), &pod(&["app0:1"]), host);
            (started.elapsed(), response)
        })
    };
    let stuck = admit(hanging.host.clone(), Duration::ZERO);
    let waiting = admit(healthy.host.clone(), Duration::from_millis(200));
    let (stuck_took, stuck) = stuck.join().expect("evaluation");
    let (waited, healthy_response) = waiting.join().expect("evaluation");
    eprintln!(
        "hanging mirror {HOLD:?}: its admission answered after {stuck_took:?}; an admission of another mirror, started 200 ms later, after {waited:?}"
    );
    assert!(stuck.accepted && stuck.mutated.is_none(), "{stuck:?}");
    assert!(
        waited >= 2 * HOLD - Duration::from_millis(300),
        "waited only {waited:?} for the lock"
    );
    assert!(
        healthy_response.image("containers", 0).is_some_and(
            |image| image.starts_with(&format!("{}/hub/library/app0:1@", healthy.host))
        ),
        "swapped once the lock was free: {healthy_response:?}"
    );
}
