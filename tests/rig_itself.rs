//! The rig's own machinery, which every other test binary trusts: the evaluation timeout as
//! policy-server applies it (`rig::wapc`).

mod rig;

use std::thread;
use std::time::{Duration, Instant};

use rig::hosts::InstantHost;
use rig::wapc::{EPOCH_TICK, Host, INTERRUPTED_GUEST_ERROR};
use rig::{pod_request, shared};
use serde_json::json;

/// A host whose every call takes `delay`, then answers as the instant host does.
struct SlowHost {
    delay: Duration,
    inner: InstantHost,
}

impl Host for SlowHost {
    fn call(
        &mut self,
        binding: &str,
        namespace: &str,
        operation: &str,
        payload: &[u8],
    ) -> Result<Vec<u8>, String> {
        thread::sleep(self.delay);
        self.inner.call(binding, namespace, operation, payload)
    }
}

fn payload() -> Vec<u8> {
    json!({
        "settings": {"mirrors": [{"source": "docker.io", "target": "m.example/hub"}]},
        "request": pod_request("CREATE", json!({"containers": [{"name": "c", "image": "app:1"}]})),
    })
    .to_string()
    .into_bytes()
}

/// One evaluation whose single lookup takes `delay`, within `timeout` seconds.
fn evaluate(delay: Duration, timeout: u64) -> (bool, Duration) {
    let host = shared(SlowHost {
        delay,
        inner: InstantHost::default(),
    });
    let started = Instant::now();
    let evaluation = rig::policy().call_within("validate", &payload(), host, Some(timeout));
    (evaluation.interrupted, started.elapsed())
}

/// The deadline is `timeout` epochs after the call and the epoch ticks once a second at a phase
/// of its own: an evaluation is interrupted between `timeout - 1` and `timeout` seconds in. So
/// one whose lookup ends before `timeout - 1` s is never interrupted, one whose lookup ends after
/// `timeout` s always is, and when the lookup returns, not before.
#[test]
fn an_evaluation_is_interrupted_between_timeout_minus_one_and_timeout_seconds_in() {
    rig::policy();
    let runs: Vec<_> = [
        (EPOCH_TICK.mul_f64(0.7), 2, false),
        (EPOCH_TICK.mul_f64(2.2), 2, true),
        (EPOCH_TICK.mul_f64(1.7), 3, false),
        (EPOCH_TICK.mul_f64(3.2), 3, true),
    ]
    .into_iter()
    .map(|(delay, timeout, expected)| {
        thread::spawn(move || (delay, timeout, expected, evaluate(delay, timeout)))
    })
    .collect();
    for run in runs {
        let (delay, timeout, expected, (interrupted, took)) = run.join().expect("run");
        assert_eq!(
            interrupted, expected,
            "a lookup of {delay:?} within {timeout} s, answered after {took:?}"
        );
        assert!(took >= delay, "the host call ran to its end: {took:?}");
    }
}

/// The count starts at the `validate` call, not when the instance was made: an instance kept
/// past its timeout still gets the whole timeout for its call.
#[test]
fn the_deadline_counts_from_the_call_not_from_instantiation() {
    let host = shared(SlowHost {
        delay: Duration::ZERO,
        inner: InstantHost::default(),
    });
    let mut instance = rig::policy().reused_instance(host).expect("an instance");
    let timeout = rig::policy_timeout().expect("a default timeout");
    thread::sleep(EPOCH_TICK * u32::try_from(timeout + 1).unwrap());
    let evaluation = instance.call("validate", &payload());
    assert!(!evaluation.interrupted, "{:?}", evaluation.result);
    assert!(evaluation.result.is_ok(), "{:?}", evaluation.result);
}

/// An interrupted call carries the text wasmtime-provider gives policy-evaluator, and
/// `rig::validate` answers for it as policy-server does.
#[test]
fn an_interrupted_evaluation_gets_policy_servers_answer() {
    let slow = || {
        shared(SlowHost {
            delay: EPOCH_TICK.mul_f64(2.2),
            inner: InstantHost::default(),
        })
    };
    let request = pod_request(
        "CREATE",
        json!({"containers": [{"name": "c", "image": "app:1"}]}),
    );
    let settings = json!({"mirrors": [{"source": "docker.io", "target": "m.example/hub"}]});
    let payload = json!({"settings": settings, "request": request}).to_string();
    let call = thread::spawn(move || {
        rig::policy().call_within("validate", payload.as_bytes(), slow(), Some(2))
    });
    let response = rig::validate_within(&settings, &request, slow(), Some(2));
    let evaluation = call.join().expect("call");
    assert!(evaluation.interrupted);
    assert_eq!(evaluation.result, Err(INTERRUPTED_GUEST_ERROR.to_string()));
    assert!(response.interrupted(), "{response:?}");
    assert_eq!(
        rig::wapc::interrupted_answer(request["uid"].as_str().unwrap()),
        json!({
            "uid": "1299d386-525b-4032-98ae-1949f69f9cfc",
            "allowed": false,
            "status": {
                "message": "Policy execution interrupted because it exceeded the allowed execution time",
                "code": 500,
            },
        })
    );
}
