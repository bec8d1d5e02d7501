//! A mirror that hangs, or answers too late, through the built module, under policy-server's
//! evaluation timeout (the rig's epoch interruption, `rig::wapc`). No policy and no host can
//! cancel a host call in progress, so the admission waits as long as the connection lives; the
//! timeout then takes effect the moment the guest runs again, and policy-server answers for it:
//! refused, code 500, "Policy execution interrupted because it exceeded the allowed execution
//! time", whatever the policy would have said. Behind the serialised host (policy-server's
//! process-wide lookup lock), another admission whose mirror is healthy waits too, and is refused
//! the same way. Only a policy whose `timeoutEvalSeconds` outlasts the hang gets to answer, and
//! then it starts nothing after the hanging lookup. The README's figures for a hanging registry
//! come from these tests (`cargo test --test hanging_registry -- --nocapture` prints them).

mod rig;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rig::hanging::HangingRegistry;
use rig::hosts::{LiveHost, LookupLock, SerialisedHost};
use rig::images::push_apps;
use rig::proxy::{HostModel, LatencyProxy, Transport};
use rig::registry::TestRegistry;
use rig::wapc::{EPOCH_TICK, INTERRUPTED, SharedHost};
use rig::{Response, pod_request, policy_timeout, shared, validate, validate_within};
use serde_json::{Value, json};

/// How long the hanging mirror holds each connection before it dies.
const HOLD: Duration = Duration::from_secs(3);

/// How long after a host call returns the interruption may take: the guest traps at its next
/// epoch check, within microseconds; the slack is for a loaded machine.
const SLACK: Duration = Duration::from_millis(500);

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

/// The default timeout in seconds (`--policy-timeout`), for the messages.
fn default_timeout() -> u64 {
    policy_timeout().expect("policy-server's default timeout")
}

#[test]
fn a_hanging_mirror_holds_the_admission_past_the_timeout_and_policy_server_refuses_it() {
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
    eprintln!(
        "a Pod of 3 images, its mirror hanging {HOLD:?}, timeout {} s: answered after {took:?}: {response:?}",
        default_timeout()
    );

    assert!(response.interrupted(), "{response:?}");
    assert_eq!(response.message.as_deref(), Some(INTERRUPTED));
    assert_eq!(
        host.lock().unwrap().exchanges.len(),
        1,
        "interrupted as soon as the guest ran again: no lookup after the hanging one"
    );
    // The host's client ignores the ping that died and asks for the manifest on a new
    // connection, which the registry holds as long: one lookup lasts two connections' lives.
    assert!(
        took >= 2 * HOLD,
        "the host call cannot be interrupted, and outlives its failed ping: {took:?}"
    );
    assert!(
        took < 2 * HOLD + SLACK,
        "interrupted when the call returned, not later: {took:?}"
    );
}

/// With `timeoutEvalSeconds` above the hang (as an operator may set it, up to 30), the policy
/// answers for itself: every image kept, with its warnings, and nothing started after the
/// hanging lookup, because the budget had run out.
#[test]
fn under_a_timeout_longer_than_the_hang_the_policy_keeps_the_images_and_starts_nothing_after_it() {
    let hanging = HangingRegistry::start(HOLD).expect("hanging registry");
    let host = shared(LiveHost::default());
    let timeout = 2 * HOLD.as_secs() + 3;
    rig::policy();
    let started = Instant::now();
    let response = validate_within(
        &settings(&hanging.host),
        &pod(&["app0:1", "app1:1", "app2:1"]),
        host.clone(),
        Some(timeout),
    );
    let took = started.elapsed();
    eprintln!(
        "a Pod of 3 images, its mirror hanging {HOLD:?}, timeoutEvalSeconds {timeout}: answered after {took:?}"
    );

    assert!(response.accepted, "{response:?}");
    assert!(response.mutated.is_none(), "every image kept as written");
    assert_eq!(
        host.lock().unwrap().exchanges.len(),
        1,
        "the budget starts nothing after the hanging lookup"
    );
    assert!(took >= 2 * HOLD, "{took:?}");
    assert!(took < 2 * HOLD + SLACK, "nothing after it: {took:?}");
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
/// admission whose mirror is healthy waits behind the hanging one. Its own lookup then succeeds,
/// but the wait counted against its timeout: policy-server refuses it too, the moment the lookup
/// returns.
#[test]
fn behind_the_hosts_lookup_lock_an_admission_with_a_healthy_mirror_waits_and_is_refused_too() {
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
        "hanging mirror {HOLD:?}: its admission answered after {stuck_took:?}; an admission of another mirror, started 200 ms later, after {waited:?}: {healthy_response:?}"
    );
    assert!(stuck.interrupted(), "{stuck:?}");
    assert!(
        waited >= 2 * HOLD - Duration::from_millis(300),
        "waited only {waited:?} for the lock"
    );
    assert!(waited < 2 * HOLD + SLACK, "{waited:?}");
    assert!(
        healthy_response.interrupted(),
        "refused once its lookup returned: {healthy_response:?}"
    );
    let healthy_lookup = format!("{}/hub/library/app0:1", healthy.host);
    let exchanges = &live.lock().unwrap().exchanges;
    assert!(
        exchanges
            .iter()
            .any(|e| e.image == healthy_lookup && e.answer.is_ok()),
        "its lookup ran to the end before the interruption: {:?}",
        exchanges.iter().map(|e| &e.image).collect::<Vec<_>>()
    );
}

/// A mirror that answers, but after 3 s: a single lookup outlasts the default timeout of 2 s
/// (under both host models), and the evaluation is interrupted when the answer arrives. With
/// `timeoutEvalSeconds: 5` the same lookup fits and the first image is swapped; the Pod's second
/// image is not looked up, since the lookup budget ran out during the first: a policy that
/// started it would run past the timeout and be interrupted, Pod refused.
#[test]
fn a_lookup_that_takes_3_s_is_interrupted_under_the_default_timeout_and_fits_a_5_s_one() {
    const SLOW: Duration = Duration::from_secs(3);
    let mirror = TestRegistry::start("slow-mirror").expect("registry");
    push_apps(&mirror, "hub", 2);
    rig::policy();
    let runs: Vec<_> = HostModel::ALL
        .into_iter()
        .flat_map(|model| [(model, policy_timeout()), (model, Some(5))])
        .map(|(model, timeout)| {
            let round_trip = model.round_trip_for(SLOW);
            let proxy = LatencyProxy::start_as(&mirror.host, round_trip, model, Transport::Https)
                .expect("proxy");
            thread::spawn(move || {
                let host = shared(LiveHost::default());
                let started = Instant::now();
                let response = validate_within(
                    &settings(&proxy.host),
                    &pod(&["app0:1", "app1:1"]),
                    host.clone(),
                    timeout,
                );
                let took = started.elapsed();
                let lookups: Vec<_> = host
                    .lock()
                    .unwrap()
                    .exchanges
                    .iter()
                    .map(|e| e.answer.is_ok())
                    .collect();
                let network = model.lookup(round_trip);
                (
                    model,
                    timeout,
                    proxy.host.clone(),
                    network,
                    took,
                    response,
                    lookups,
                )
            })
        })
        .collect();
    for run in runs {
        let (model, timeout, mirror_host, network, took, response, lookups) =
            run.join().expect("run");
        eprintln!(
            "{}: a lookup of {SLOW:?}, timeout {} s: answered after {took:?}: {}",
            model.name(),
            timeout.unwrap_or_default(),
            response
                .message
                .as_deref()
                .or(response.image("containers", 0))
                .unwrap_or_default()
        );
        assert_eq!(lookups, [true], "{}: one lookup, answered", model.name());
        assert!(
            took >= network,
            "{}: the call ran to its end ({network:?}): {took:?}",
            model.name()
        );
        if timeout == policy_timeout() {
            assert!(response.interrupted(), "{}: {response:?}", model.name());
            assert!(
                took < SLOW + SLACK,
                "{}: interrupted when the answer came: {took:?}",
                model.name()
            );
        } else {
            let limit = EPOCH_TICK * u32::try_from(timeout.unwrap_or_default() - 1).unwrap();
            assert!(took < limit, "{}: {took:?} within {limit:?}", model.name());
            assert!(
                response
                    .image("containers", 0)
                    .is_some_and(|image| image
                        .starts_with(&format!("{mirror_host}/hub/library/app0:1@sha256:"))),
                "{}: swapped: {response:?}",
                model.name()
            );
            assert_eq!(
                response.image("containers", 1),
                Some("app1:1"),
                "{}: the second image kept: {response:?}",
                model.name()
            );
            assert!(
                response.warned("lookup budget of 800 ms: 1 image was not looked up"),
                "{}: {:?}",
                model.name(),
                response.warnings
            );
        }
    }
}
