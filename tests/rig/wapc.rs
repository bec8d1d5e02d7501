//! A waPC host on wasmtime: loads `policy.wasm` as policy-server does (compiled once, a fresh
//! instance per evaluation) and forwards the guest's host calls to a [`Host`].
//!
//! Loaded for policy-server ([`WasmPolicy::load_for_policy_server`]), it interrupts an
//! evaluation as policy-server does, read from its sources (policy-server v1.31.0 `src/lib.rs`
//! and `src/evaluation/evaluation_environment.rs`; kubewarden-controller v1.35.0
//! `crates/policy-server/src/lib.rs`; policy-evaluator v0.30.4 `src/runtimes/wapc/stack_pre.rs`
//! and `src/runtimes/wapc/runtime.rs`, the same at v1.35.0; wasmtime-provider v2.13.0 and
//! v2.19.0 `src/provider.rs`):
//! - the engine has wasmtime's epoch interruption, and a task increments the epoch once a second
//!   (`tokio::time::interval(1 s)`), for the whole process;
//! - each evaluation's deadline is the policy's `timeoutEvalSeconds`, else `--policy-timeout`
//!   (default 2), in epochs: `set_epoch_deadline(n)` before each waPC init function, and again
//!   just before the `validate` guest call, so the count starts at the call, not at
//!   instantiation, and the call is interrupted between `n - 1` and `n` seconds after it starts;
//! - epochs are checked only while wasm code runs: a host call in progress is never interrupted,
//!   and the interruption comes when the guest runs again after the call returns;
//! - an interrupted `validate` is answered by the host, not the guest: [`interrupted_answer`].
//!
//! Loaded as `kwctl run` loads it ([`WasmPolicy::load`]), there is no deadline: kwctl builds
//! its evaluator with `epoch_deadline: None` (kubewarden-controller v1.35.0
//! `crates/kwctl/src/command/run/evaluator.rs`).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use sha2::Digest;

use wasmtime::error::Context;
use wasmtime::{
    Caller, Config, Engine, Instance, InstancePre, Linker, Memory, Module, Store, Trap, TypedFunc,
};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p1::WasiP1Ctx;

/// Answers the guest's host calls (`binding`, `namespace`, `operation`, payload).
pub trait Host: Send {
    fn call(
        &mut self,
        binding: &str,
        namespace: &str,
        operation: &str,
        payload: &[u8],
    ) -> Result<Vec<u8>, String>;
}

pub type SharedHost = Arc<Mutex<dyn Host>>;

/// The prefix policy-evaluator puts before a failed host callback's message.
pub const CALLBACK_FAILURE: &str = "Callback evaluation failure: ";

struct State {
    wasi: WasiP1Ctx,
    host: SharedHost,
    operation: Vec<u8>,
    payload: Vec<u8>,
    guest_response: Option<Vec<u8>>,
    guest_error: Option<Vec<u8>>,
    host_response: Vec<u8>,
    host_error: Vec<u8>,
}

/// The text policy-evaluator answers for a `validate` call its epoch deadline interrupted
/// (v0.30.4 `src/runtimes/wapc/runtime.rs`, `Runtime::validate`; the same at kubewarden-controller
/// v1.35.0 `crates/policy-evaluator/src/runtimes/wapc/runtime.rs`): policy-server 1.31 and 1.35.
pub const INTERRUPTED: &str =
    "Policy execution interrupted because it exceeded the allowed execution time";

/// What wasmtime-provider reports for a guest call that trapped on its deadline (v2.13.0,
/// `src/provider.rs`, `call`), the text policy-evaluator looks for.
pub const INTERRUPTED_GUEST_ERROR: &str = "guest code interrupted, execution deadline exceeded";

/// How often policy-server's ticker increments the engine's epoch.
pub const EPOCH_TICK: Duration = Duration::from_secs(1);

/// The AdmissionResponse policy-server sends for an evaluation its timeout interrupted, whatever
/// the policy would have answered: `AdmissionResponse::reject(uid, INTERRUPTED, 500)` in
/// policy-evaluator v0.30.4 (`src/admission_response.rs`): not allowed, a status with the message
/// and code 500, and nothing else (no warnings, no patch, no audit annotations).
pub fn interrupted_answer(uid: &str) -> Value {
    json!({"uid": uid, "allowed": false, "status": {"message": INTERRUPTED, "code": 500}})
}

/// An evaluation's deadline in epoch ticks: the policy's `timeoutEvalSeconds`, else
/// policy-server's `--policy-timeout`; `None` under `kwctl run` (no deadline).
pub type Timeout = Option<u64>;

/// A compiled policy module.
pub struct WasmPolicy {
    engine: Engine,
    pre: InstancePre<State>,
    /// The deadline of [`WasmPolicy::call`]; [`WasmPolicy::call_within`] sets another.
    timeout: Timeout,
    /// Whether the engine counts epochs (loaded for policy-server).
    epochs: bool,
}

/// The outcome of one waPC call.
pub struct Evaluation {
    /// The guest's answer, or why there is none (an interrupted call:
    /// [`INTERRUPTED_GUEST_ERROR`]).
    pub result: Result<Vec<u8>, String>,
    /// The guest's linear memory after the call: its peak, since wasm memory never shrinks.
    pub memory_bytes: usize,
    /// The call ran past its deadline and was interrupted: policy-server answers
    /// [`interrupted_answer`] for it.
    pub interrupted: bool,
}

/// An instance kept across calls: what a host that reused instances would pay.
pub struct ReusedInstance {
    store: Store<State>,
    guest_call: TypedFunc<(i32, i32), i32>,
    memory: Memory,
    /// The deadline of each call; `None` when the engine does not count epochs.
    timeout: Option<Timeout>,
}

impl WasmPolicy {
    /// The module as `kwctl run` runs it: no evaluation timeout.
    pub fn load(path: &Path) -> wasmtime::Result<WasmPolicy> {
        Self::load_with(path, None, false)
    }

    /// The module as policy-server runs it: epoch interruption, a ticker incrementing the
    /// epoch once a second for as long as the policy is loaded, and `timeout` (in seconds) as
    /// the deadline of every [`WasmPolicy::call`].
    pub fn load_for_policy_server(path: &Path, timeout: u64) -> wasmtime::Result<WasmPolicy> {
        let policy = Self::load_with(path, Some(timeout), true)?;
        let ticking = policy.engine.weak();
        std::thread::spawn(move || {
            while let Some(engine) = ticking.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        });
        Ok(policy)
    }

    fn load_with(path: &Path, timeout: Timeout, epochs: bool) -> wasmtime::Result<WasmPolicy> {
        let mut config = Config::new();
        config.cranelift_opt_level(wasmtime::OptLevel::Speed);
        config.epoch_interruption(epochs);
        let engine = Engine::new(&config)?;
        let module = compiled(&engine, path)?;
        let mut linker: Linker<State> = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |state: &mut State| &mut state.wasi)?;
        add_wapc_imports(&mut linker)?;
        let pre = linker.instantiate_pre(&module)?;
        Ok(WasmPolicy {
            engine,
            pre,
            timeout,
            epochs,
        })
    }

    fn new_store(&self, host: SharedHost) -> Store<State> {
        let wasi = WasiCtxBuilder::new().inherit_stderr().build_p1();
        Store::new(
            &self.engine,
            State {
                wasi,
                host,
                operation: Vec::new(),
                payload: Vec::new(),
                guest_response: None,
                guest_error: None,
                host_response: Vec::new(),
                host_error: Vec::new(),
            },
        )
    }

    fn start(&self, host: SharedHost, timeout: Timeout) -> wasmtime::Result<ReusedInstance> {
        let timeout = self.epochs.then_some(timeout);
        let mut store = self.new_store(host);
        let instance: Instance = self.pre.instantiate(&mut store)?;
        for init in ["_initialize", "_start", "wapc_init"] {
            if let Ok(function) = instance.get_typed_func::<(), ()>(&mut store, init) {
                // wasmtime-provider gives each init function the same deadline as the call.
                set_deadline(&mut store, timeout);
                function.call(&mut store, ())?;
            }
        }
        let guest_call = instance.get_typed_func::<(i32, i32), i32>(&mut store, "__guest_call")?;
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or_else(|| wasmtime::format_err!("the module exports no memory"))?;
        Ok(ReusedInstance {
            store,
            guest_call,
            memory,
            timeout,
        })
    }

    /// One call on a fresh instance, as policy-server makes every evaluation, within the
    /// policy's timeout.
    pub fn call(&self, operation: &str, payload: &[u8], host: SharedHost) -> Evaluation {
        self.call_within(operation, payload, host, self.timeout)
    }

    /// The same within `timeout` seconds: a policy whose `timeoutEvalSeconds` differs from
    /// policy-server's `--policy-timeout` (only for a policy loaded for policy-server).
    pub fn call_within(
        &self,
        operation: &str,
        payload: &[u8],
        host: SharedHost,
        timeout: Timeout,
    ) -> Evaluation {
        assert!(
            self.epochs || timeout.is_none(),
            "a timeout needs a policy loaded for policy-server (WasmPolicy::load_for_policy_server)"
        );
        match self.start(host, timeout) {
            Ok(mut instance) => instance.call(operation, payload),
            Err(error) => Evaluation {
                result: Err(format!("instantiation failed: {error:#}")),
                memory_bytes: 0,
                interrupted: false,
            },
        }
    }

    pub fn reused_instance(&self, host: SharedHost) -> wasmtime::Result<ReusedInstance> {
        self.start(host, self.timeout)
    }
}

/// Sets the store's deadline `timeout` epochs from now, as wasmtime-provider does before each
/// guest call; far away for no timeout on an engine that counts epochs (policy-server with
/// `--disable-timeout-protection` builds an engine without epochs; the effect is the same).
/// `timeout` is `None` when the engine does not count epochs.
fn set_deadline(store: &mut Store<State>, timeout: Option<Timeout>) {
    if let Some(timeout) = timeout {
        store.set_epoch_deadline(timeout.unwrap_or(u64::MAX / 2));
    }
}

impl ReusedInstance {
    pub fn call(&mut self, operation: &str, payload: &[u8]) -> Evaluation {
        let state = self.store.data_mut();
        state.operation = operation.as_bytes().to_vec();
        state.payload = payload.to_vec();
        state.guest_response = None;
        state.guest_error = None;
        // The deadline counts from the call, not from the instance's creation.
        set_deadline(&mut self.store, self.timeout);
        let outcome = self.guest_call.call(
            &mut self.store,
            (operation.len() as i32, payload.len() as i32),
        );
        let memory_bytes = self.memory.data_size(&self.store);
        let state = self.store.data_mut();
        let mut interrupted = false;
        let result = match outcome {
            Ok(1) => state
                .guest_response
                .take()
                .ok_or_else(|| "the guest returned no response".to_string()),
            Ok(_) => Err(
                String::from_utf8_lossy(&state.guest_error.take().unwrap_or_default()).into_owned(),
            ),
            Err(trap) if trap.downcast_ref::<Trap>() == Some(&Trap::Interrupt) => {
                interrupted = true;
                Err(INTERRUPTED_GUEST_ERROR.to_string())
            }
            Err(trap) => Err(format!("trap: {trap:#}")),
        };
        Evaluation {
            result,
            memory_bytes,
            interrupted,
        }
    }
}

/// The module compiled for `engine`, from a cache of earlier compilations when one matches the
/// module's bytes and the engine's settings (policy-server keeps compiled modules too); a debug
/// build of wasmtime takes seconds to compile the policy, and every test process and kwctl
/// stand-in run would pay it.
fn compiled(engine: &Engine, path: &Path) -> wasmtime::Result<Module> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let bytes = std::fs::read(path).with_context(|| format!("loading {}", path.display()))?;
    let mut key = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut key);
    let digest = sha2::Sha256::digest(&bytes);
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/rig-modules");
    let cached = dir.join(format!("{digest:x}-{:016x}.cwasm", key.finish()));
    // SAFETY: the file is one this function wrote with `Module::serialize` for an engine with
    // the same compatibility hash; a file that does not deserialise is compiled afresh.
    if let Ok(module) = unsafe { Module::deserialize_file(engine, &cached) } {
        return Ok(module);
    }
    let module =
        Module::new(engine, &bytes).with_context(|| format!("compiling {}", path.display()))?;
    if std::fs::create_dir_all(&dir).is_ok() {
        let partial = cached.with_extension(format!("{}.partial", std::process::id()));
        if let Ok(serialized) = module.serialize()
            && std::fs::write(&partial, serialized).is_ok()
        {
            let _ = std::fs::rename(&partial, &cached);
        }
    }
    Ok(module)
}

fn memory(caller: &mut Caller<'_, State>) -> wasmtime::Result<Memory> {
    caller
        .get_export("memory")
        .and_then(|e| e.into_memory())
        .ok_or_else(|| wasmtime::format_err!("the module exports no memory"))
}

fn read(caller: &mut Caller<'_, State>, ptr: i32, len: i32) -> wasmtime::Result<Vec<u8>> {
    let memory = memory(caller)?;
    let mut buffer = vec![0; usize::try_from(len)?];
    memory.read(&caller, usize::try_from(ptr)?, &mut buffer)?;
    Ok(buffer)
}

fn write(caller: &mut Caller<'_, State>, ptr: i32, bytes: &[u8]) -> wasmtime::Result<()> {
    let memory = memory(caller)?;
    memory.write(caller, usize::try_from(ptr)?, bytes)?;
    Ok(())
}

fn add_wapc_imports(linker: &mut Linker<State>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "wapc",
        "__guest_request",
        |mut caller: Caller<'_, State>, op_ptr: i32, ptr: i32| {
            let operation = std::mem::take(&mut caller.data_mut().operation);
            let payload = std::mem::take(&mut caller.data_mut().payload);
            write(&mut caller, op_ptr, &operation)?;
            write(&mut caller, ptr, &payload)
        },
    )?;
    linker.func_wrap(
        "wapc",
        "__guest_response",
        |mut caller: Caller<'_, State>, ptr: i32, len: i32| {
            let bytes = read(&mut caller, ptr, len)?;
            caller.data_mut().guest_response = Some(bytes);
            Ok(())
        },
    )?;
    linker.func_wrap(
        "wapc",
        "__guest_error",
        |mut caller: Caller<'_, State>, ptr: i32, len: i32| {
            let bytes = read(&mut caller, ptr, len)?;
            caller.data_mut().guest_error = Some(bytes);
            Ok(())
        },
    )?;
    linker.func_wrap(
        "wapc",
        "__host_call",
        |mut caller: Caller<'_, State>,
         bd_ptr: i32,
         bd_len: i32,
         ns_ptr: i32,
         ns_len: i32,
         op_ptr: i32,
         op_len: i32,
         ptr: i32,
         len: i32|
         -> wasmtime::Result<i32> {
            let binding = String::from_utf8(read(&mut caller, bd_ptr, bd_len)?)?;
            let namespace = String::from_utf8(read(&mut caller, ns_ptr, ns_len)?)?;
            let operation = String::from_utf8(read(&mut caller, op_ptr, op_len)?)?;
            let payload = read(&mut caller, ptr, len)?;
            let host = caller.data().host.clone();
            let answer = host
                .lock()
                .map_err(|_| wasmtime::format_err!("host lock poisoned"))?
                .call(&binding, &namespace, &operation, &payload);
            let state = caller.data_mut();
            match answer {
                Ok(response) => {
                    state.host_response = response;
                    Ok(1)
                }
                Err(message) => {
                    state.host_error = format!("{CALLBACK_FAILURE}{message}").into_bytes();
                    Ok(0)
                }
            }
        },
    )?;
    linker.func_wrap(
        "wapc",
        "__host_response_len",
        |caller: Caller<'_, State>| caller.data().host_response.len() as i32,
    )?;
    linker.func_wrap(
        "wapc",
        "__host_response",
        |mut caller: Caller<'_, State>, ptr: i32| {
            let bytes = std::mem::take(&mut caller.data_mut().host_response);
            write(&mut caller, ptr, &bytes)
        },
    )?;
    linker.func_wrap("wapc", "__host_error_len", |caller: Caller<'_, State>| {
        caller.data().host_error.len() as i32
    })?;
    linker.func_wrap(
        "wapc",
        "__host_error",
        |mut caller: Caller<'_, State>, ptr: i32| {
            let bytes = std::mem::take(&mut caller.data_mut().host_error);
            write(&mut caller, ptr, &bytes)
        },
    )?;
    linker.func_wrap(
        "wapc",
        "__console_log",
        |mut caller: Caller<'_, State>, ptr: i32, len: i32| {
            let bytes = read(&mut caller, ptr, len)?;
            eprintln!("guest: {}", String::from_utf8_lossy(&bytes));
            Ok(())
        },
    )?;
    Ok(())
}

/// Fails when the module is older than any file it is built from, so no test passes on a stale
/// build: the inputs `make policy.wasm` names (the Makefile's `SOURCES`: every `.rs` file under
/// `root/src`, at any depth, and `Cargo.toml` and `Cargo.lock`).
pub fn check_fresh(module: &Path, root: &Path) -> wasmtime::Result<()> {
    let built = std::fs::metadata(module)
        .and_then(|m| m.modified())
        .with_context(|| {
            format!(
                "{} is missing: run `make policy.wasm` (or `make test`)",
                module.display()
            )
        })?;
    for input in module_inputs(root)? {
        let modified = std::fs::metadata(&input)
            .and_then(|m| m.modified())
            .with_context(|| format!("reading {}", input.display()))?;
        if modified > built {
            wasmtime::bail!(
                "{} is older than {}: run `make policy.wasm` (or `make test`)",
                module.display(),
                input.display()
            );
        }
    }
    Ok(())
}

/// The files `policy.wasm` is built from, as the Makefile's `SOURCES` lists them.
pub fn module_inputs(root: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut inputs = vec![root.join("Cargo.toml"), root.join("Cargo.lock")];
    let mut folders = vec![root.join("src")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                inputs.push(path);
            }
        }
    }
    Ok(inputs)
}
