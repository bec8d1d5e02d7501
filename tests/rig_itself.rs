//! The rig's own machinery, which every other test binary trusts: the check that refuses a stale
//! `policy.wasm`, and the evaluation timeout as policy-server applies it (`rig::wapc`).

mod rig;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use rig::hosts::InstantHost;
use rig::wapc::{EPOCH_TICK, Host, INTERRUPTED_GUEST_ERROR, check_fresh, module_inputs};
use rig::{pod_request, shared};
use serde_json::json;

/// A directory of its own under the system's temporary one, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("rig-itself-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `path` under `root` and dates it `age` before now.
fn file(root: &Path, path: &str, age: Duration) -> PathBuf {
    let path = root.join(path);
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("directories");
    std::fs::write(&path, "").expect("file");
    File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(SystemTime::now() - age))
        .expect("set the modification time");
    path
}

const OLD: Duration = Duration::from_secs(3600);
const BUILT: Duration = Duration::from_secs(60);
const EDITED: Duration = Duration::from_secs(1);

/// A crate whose module was built a minute ago from sources an hour old.
fn crate_built_after_its_sources(name: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new(name);
    for source in [
        "Cargo.toml",
        "Cargo.lock",
        "src/lib.rs",
        "src/decide/mod.rs",
        "src/decide/walk.rs",
    ] {
        file(&dir.0, source, OLD);
    }
    let module = file(&dir.0, "policy.wasm", BUILT);
    (dir, module)
}

#[test]
fn a_module_built_after_all_its_sources_is_fresh() {
    let (dir, module) = crate_built_after_its_sources("fresh");
    check_fresh(&module, &dir.0).expect("fresh");
}

#[test]
fn an_edit_at_any_depth_of_src_or_in_the_manifests_makes_the_module_stale() {
    for edited in [
        "src/lib.rs",
        "src/decide/walk.rs",
        "src/pod/deeper/still.rs",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        let (dir, module) = crate_built_after_its_sources("stale");
        let path = file(&dir.0, edited, EDITED);
        let error = check_fresh(&module, &dir.0).expect_err(edited);
        assert!(
            format!("{error:#}").contains(&format!("is older than {}", path.display())),
            "{edited}: {error:#}"
        );
    }
}

/// The check follows the Makefile, which rebuilds for `.rs` files only: a newer file of another
/// kind must not refuse a module that `make policy.wasm` would not rebuild.
#[test]
fn a_newer_file_the_makefile_does_not_build_from_is_not_refused() {
    let (dir, module) = crate_built_after_its_sources("other-files");
    file(&dir.0, "src/decide/notes.md", EDITED);
    file(&dir.0, "README.md", EDITED);
    check_fresh(&module, &dir.0).expect("still fresh");
}

#[test]
fn a_missing_module_is_refused() {
    let (dir, _) = crate_built_after_its_sources("missing");
    let error = check_fresh(&dir.0.join("absent.wasm"), &dir.0).expect_err("missing");
    assert!(
        format!("{error:#}").contains("absent.wasm is missing"),
        "{error:#}"
    );
}

/// The rig's inputs are the Makefile's `SOURCES`, as make itself expands them.
#[test]
fn the_inputs_are_the_makefiles_sources() {
    let root = rig::root();
    let output = std::process::Command::new("make")
        .current_dir(&root)
        .args([
            "--no-print-directory",
            "-s",
            "--eval=rig-print-sources: ; @echo $(SOURCES)",
            "rig-print-sources",
        ])
        .output()
        .expect("make");
    assert!(output.status.success(), "{output:?}");
    let mut makefile: Vec<PathBuf> = String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .map(|path| root.join(path))
        .collect();
    let mut ours = module_inputs(&root).expect("inputs");
    makefile.sort();
    ours.sort();
    assert!(
        ours.iter()
            .any(|p| p.parent().and_then(Path::parent) == Some(&root.join("src"))),
        "files in folders under src/: {ours:?}"
    );
    assert_eq!(ours, makefile);
}

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
