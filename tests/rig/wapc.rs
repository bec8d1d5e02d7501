//! A waPC host on wasmtime: loads `policy.wasm` as policy-server does (compiled once, a fresh
//! instance per evaluation) and forwards the guest's host calls to a [`Host`].

use std::path::Path;
use std::sync::{Arc, Mutex};

use sha2::Digest;

use wasmtime::error::Context;
use wasmtime::{
    Caller, Config, Engine, Instance, InstancePre, Linker, Memory, Module, Store, TypedFunc,
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

/// A compiled policy module.
pub struct WasmPolicy {
    engine: Engine,
    pre: InstancePre<State>,
}

/// The outcome of one waPC call.
pub struct Evaluation {
    pub result: Result<Vec<u8>, String>,
    /// The guest's linear memory after the call: its peak, since wasm memory never shrinks.
    pub memory_bytes: usize,
}

/// An instance kept across calls: what a host that reused instances would pay.
pub struct ReusedInstance {
    store: Store<State>,
    guest_call: TypedFunc<(i32, i32), i32>,
    memory: Memory,
}

impl WasmPolicy {
    pub fn load(path: &Path) -> wasmtime::Result<WasmPolicy> {
        let mut config = Config::new();
        config.cranelift_opt_level(wasmtime::OptLevel::Speed);
        let engine = Engine::new(&config)?;
        let module = compiled(&engine, path)?;
        let mut linker: Linker<State> = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |state: &mut State| &mut state.wasi)?;
        add_wapc_imports(&mut linker)?;
        let pre = linker.instantiate_pre(&module)?;
        Ok(WasmPolicy { engine, pre })
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

    fn start(&self, host: SharedHost) -> wasmtime::Result<ReusedInstance> {
        let mut store = self.new_store(host);
        let instance: Instance = self.pre.instantiate(&mut store)?;
        for init in ["_initialize", "_start", "wapc_init"] {
            if let Ok(function) = instance.get_typed_func::<(), ()>(&mut store, init) {
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
        })
    }

    /// One call on a fresh instance, as policy-server makes every evaluation.
    pub fn call(&self, operation: &str, payload: &[u8], host: SharedHost) -> Evaluation {
        match self.start(host) {
            Ok(mut instance) => instance.call(operation, payload),
            Err(error) => Evaluation {
                result: Err(format!("instantiation failed: {error:#}")),
                memory_bytes: 0,
            },
        }
    }

    pub fn reused_instance(&self, host: SharedHost) -> wasmtime::Result<ReusedInstance> {
        self.start(host)
    }
}

impl ReusedInstance {
    pub fn call(&mut self, operation: &str, payload: &[u8]) -> Evaluation {
        let state = self.store.data_mut();
        state.operation = operation.as_bytes().to_vec();
        state.payload = payload.to_vec();
        state.guest_response = None;
        state.guest_error = None;
        let outcome = self.guest_call.call(
            &mut self.store,
            (operation.len() as i32, payload.len() as i32),
        );
        let memory_bytes = self.memory.data_size(&self.store);
        let state = self.store.data_mut();
        let result = match outcome {
            Ok(1) => state
                .guest_response
                .take()
                .ok_or_else(|| "the guest returned no response".to_string()),
            Ok(_) => Err(
                String::from_utf8_lossy(&state.guest_error.take().unwrap_or_default()).into_owned(),
            ),
            Err(trap) => Err(format!("trap: {trap:#}")),
        };
        Evaluation {
            result,
            memory_bytes,
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

/// Fails when the module is older than the sources, so no test passes on a stale build.
pub fn check_fresh(module: &Path, sources: &Path) -> wasmtime::Result<()> {
    let built = std::fs::metadata(module)
        .and_then(|m| m.modified())
        .with_context(|| {
            format!(
                "{} is missing: run `make policy.wasm` (or `make test`)",
                module.display()
            )
        })?;
    for entry in std::fs::read_dir(sources)? {
        let entry = entry?;
        if entry.metadata()?.modified()? > built {
            wasmtime::bail!(
                "{} is older than {}: run `make policy.wasm` (or `make test`)",
                module.display(),
                entry.path().display()
            );
        }
    }
    Ok(())
}
