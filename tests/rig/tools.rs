//! The real Kubewarden and Kubernetes programs (kwctl and policy-server 1.35, kube-apiserver
//! 1.36, verify-image-signatures 1.0.11), where `scripts/real-tools.sh` unpacks them, and the two
//! servers a test starts from them: a loopback control plane and a policy-server, each stopped
//! when the test drops it.
//!
//! A test that needs them asks [`RealTools::find`] first. Outside CI, when they are absent, the
//! test says that it did not run and how to get them, and passes; under `CI=true` their absence
//! fails it, so a CI run never counts a test that did not run.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The folder holding `bin/` with the real tools.
#[derive(Clone, Debug)]
pub struct RealTools {
    pub dir: PathBuf,
}

/// What every test that uses the real tools needs; each is in `bin/` after `scripts/real-tools.sh`.
const NEEDED: [&str; 5] = [
    "kwctl",
    "policy-server",
    "kube-apiserver",
    "etcd",
    "verify-image-signatures.wasm",
];

impl RealTools {
    /// The tools when present. Absent: under `CI=true` the test fails naming what is missing;
    /// otherwise it prints why `test` did not run and how to get the tools, and gets `None`.
    pub fn find(test: &str) -> Option<RealTools> {
        let dir = std::env::var_os("TOOLS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                    .join(".cache/image-swapper-tools")
            });
        let mut missing: Vec<&str> = NEEDED
            .iter()
            .copied()
            .filter(|name| !dir.join("bin").join(name).exists())
            .collect();
        // The control plane's client: kubectl on PATH (`scripts/ensure-packages.sh kubectl`).
        let kubectl = Command::new("kubectl")
            .args(["version", "--client"])
            .output()
            .is_ok_and(|output| output.status.success());
        if !kubectl {
            missing.push("kubectl (on PATH)");
        }
        if missing.is_empty() {
            return Some(RealTools { dir });
        }
        let how = format!(
            "missing in {}/bin: {}; `scripts/real-tools.sh` unpacks them (docs/development.md, The real tools)",
            dir.display(),
            missing.join(", ")
        );
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("{test}: the real tools are required in CI: {how}");
        }
        // Straight to stderr, past the test harness's capture, so that a passing run still
        // shows what did not run.
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "SKIPPED {test}: did not run: {how}");
        None
    }

    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("bin").join(name)
    }

    /// Sigstore's public trusted root as a client trust config, so that kwctl and policy-server
    /// start without fetching it (copied beside `bin/` by `scripts/real-tools.sh`).
    pub fn sigstore_trust_config(&self) -> PathBuf {
        self.dir.join("sigstore-trust-config.json")
    }

    /// The built `policy.wasm` annotated by the real kwctl with `metadata.yml` and the README
    /// (`make annotated-policy.wasm`'s command): policy-server 1.35 refuses a module without
    /// the annotations ("Policy is missing protocol version, which is required for
    /// KubewardenWapc execution mode"). Made once per test binary, under `target/real-tools/`,
    /// and reused while it is newer than what it is made from.
    pub fn annotated_policy(&self) -> PathBuf {
        static ANNOTATED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
        ANNOTATED
            .get_or_init(|| {
                let root = super::root();
                let module = root.join("policy.wasm");
                if let Err(error) = super::wapc::check_fresh(&module, &root) {
                    panic!("{error:#}");
                }
                let dir = root.join("target/real-tools");
                std::fs::create_dir_all(&dir).expect("target/real-tools");
                let annotated = dir.join("annotated-policy.wasm");
                let inputs = [
                    module.clone(),
                    root.join("metadata.yml"),
                    root.join("README.md"),
                ];
                let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified());
                let fresh = modified(&annotated).is_ok_and(|made| {
                    inputs
                        .iter()
                        .all(|input| modified(input).is_ok_and(|input| input <= made))
                });
                if !fresh {
                    // Written beside and renamed, so that test binaries running at once never
                    // read a half-written module.
                    let partial = dir.join(format!("annotated-policy.{}.wasm", std::process::id()));
                    let output = Command::new(self.bin("kwctl"))
                        .current_dir(&root)
                        .args(["annotate", "-m", "metadata.yml", "-u", "README.md", "-o"])
                        .arg(&partial)
                        .arg(&module)
                        .output()
                        .expect("kwctl annotate");
                    assert!(
                        output.status.success(),
                        "kwctl annotate: {}",
                        String::from_utf8_lossy(&output.stderr)
                    );
                    std::fs::rename(&partial, &annotated).expect("annotated-policy.wasm");
                }
                annotated
            })
            .clone()
    }

    /// `kwctl --version`'s first line, for the headers of what kwctl records.
    pub fn kwctl_version(&self) -> String {
        let output = Command::new(self.bin("kwctl"))
            .arg("--version")
            .output()
            .expect("kwctl --version");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    }
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free loopback port")
}

/// A fresh folder under the system's temporary folder, removed by whoever owns it.
pub fn scratch_dir(what: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "image-swapper-{what}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

/// etcd and kube-apiserver (and kube-controller-manager when asked) on free loopback ports,
/// started by the tools' `start.sh` with its certificates and an admin kubeconfig; stopped and
/// removed on drop.
pub struct ControlPlane {
    tools: RealTools,
    data: PathBuf,
    pub kubeconfig: PathBuf,
    pub port: u16,
}

impl ControlPlane {
    pub fn start(tools: &RealTools, controller_manager: bool) -> ControlPlane {
        // A port found free can be taken before etcd or the API server binds it (a client's
        // ephemeral port, another test's plane): start.sh then stops what it started, and the
        // plane starts again on other ports, three times at most.
        let mut last = String::new();
        for _ in 0..3 {
            let data = scratch_dir("k8s");
            let kubeconfig = data.join("admin.kubeconfig");
            let port = free_port();
            let output = Command::new(tools.dir.join("start.sh"))
                .arg(&data)
                .env("K8S_DIR", &tools.dir)
                .env("KUBE_PORT", port.to_string())
                .env("ETCD_PORT", free_port().to_string())
                .env("ETCD_PEER_PORT", free_port().to_string())
                .env("KCM_PORT", free_port().to_string())
                .env("START_KCM", if controller_manager { "1" } else { "0" })
                .env("KUBECONFIG_OUT", &kubeconfig)
                .output()
                .expect("start.sh");
            let plane = ControlPlane {
                tools: tools.clone(),
                data,
                kubeconfig,
                port,
            };
            if output.status.success() {
                return plane;
            }
            last = format!(
                "{}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            if !last.contains("already in use") {
                break;
            }
        }
        panic!("start.sh: {last}");
    }

    /// The API server's CA, for a client of it (PEM).
    pub fn ca_file(&self) -> PathBuf {
        self.data.join("pki/ca.crt")
    }

    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// `kubectl --kubeconfig <admin> ARGS`, with `stdin` fed when given. Its discovery cache is
    /// this control plane's own (`kubectl-cache` in its folder): kubectl's default cache is keyed
    /// by host and port, and a loopback port is reused by later control planes with other CRDs.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.data.join("kubectl-cache"))
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("kubectl (apt-get install kubectl)");
        if let Some(text) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("kubectl's stdin")
                .write_all(text.as_bytes())
                .expect("write to kubectl");
        }
        child.wait_with_output().expect("kubectl")
    }

    /// `kubectl ARGS` that must succeed; its standard output.
    pub fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let output = self.kubectl(args, stdin);
        assert!(
            output.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `kubectl get ARGS -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.kubectl_ok(&all, None)).expect("kubectl's JSON")
    }

    /// Stops the API server and starts it again on the same data, port and certificates (a
    /// restart under running clients).
    pub fn restart_api_server(&self) {
        let stop = Command::new(self.tools.dir.join("stop.sh"))
            .arg(&self.data)
            .env("K8S_DIR", &self.tools.dir)
            .output()
            .expect("stop.sh");
        assert!(stop.status.success(), "stop.sh");
        let output = Command::new(self.tools.dir.join("start.sh"))
            .arg(&self.data)
            .env("K8S_DIR", &self.tools.dir)
            .env("KUBE_PORT", self.port.to_string())
            .env("ETCD_PORT", free_port().to_string())
            .env("ETCD_PEER_PORT", free_port().to_string())
            .env("KCM_PORT", free_port().to_string())
            .env("START_KCM", "0")
            .env("KUBECONFIG_OUT", &self.kubeconfig)
            .output()
            .expect("start.sh");
        assert!(
            output.status.success(),
            "start.sh again: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(self.tools.dir.join("stop.sh"))
            .arg(&self.data)
            .env("K8S_DIR", &self.tools.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// A serving certificate for 127.0.0.1 and localhost, self-signed (so it is its own CA bundle).
pub struct ServingCertificate {
    pub cert_pem: String,
    pub key_pem: String,
}

impl ServingCertificate {
    pub fn loopback() -> ServingCertificate {
        let key = rcgen::KeyPair::generate().expect("key pair");
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
        let cert = params.self_signed(&key).expect("self-signed certificate");
        ServingCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// A real policy-server serving `policies.yml` over TLS on loopback; killed on drop.
pub struct PolicyServer {
    child: Child,
    dir: PathBuf,
    pub port: u16,
    pub readiness_port: u16,
    /// The serving certificate, which is also the CA bundle a webhook needs.
    pub cert_pem: String,
}

/// How to start a [`PolicyServer`] beyond its policies.
#[derive(Default)]
pub struct PolicyServerOptions<'a> {
    /// Reads the API server for the Kubernetes capability; none: no connection, ignored.
    pub kubeconfig: Option<&'a Path>,
    /// `sources.yaml` text (insecure sources, CAs).
    pub sources: Option<&'a str>,
    pub workers: Option<usize>,
    /// `--policy-timeout`, seconds.
    pub policy_timeout: Option<u64>,
    /// More environment (e.g. `RUST_BACKTRACE`).
    pub env: Vec<(&'a str, &'a str)>,
}

impl PolicyServer {
    /// Starts policy-server with `policies` (the `policies.yml` text) and waits until it is ready.
    pub fn start(tools: &RealTools, policies: &str, options: PolicyServerOptions) -> PolicyServer {
        let dir = scratch_dir("policy-server");
        let certificate = ServingCertificate::loopback();
        std::fs::write(dir.join("tls.crt"), &certificate.cert_pem).expect("tls.crt");
        std::fs::write(dir.join("tls.key"), &certificate.key_pem).expect("tls.key");
        std::fs::write(dir.join("policies.yml"), policies).expect("policies.yml");
        std::fs::write(dir.join("sources.yaml"), options.sources.unwrap_or("{}\n"))
            .expect("sources.yaml");
        for sub in ["dl", "sig"] {
            std::fs::create_dir_all(dir.join(sub)).expect("policy-server folders");
        }
        let port = free_port();
        let readiness_port = free_port();
        let mut command = Command::new(tools.bin("policy-server"));
        command
            .current_dir(&dir)
            .args([
                "--addr",
                "127.0.0.1",
                "--log-no-color",
                "--log-level",
                "warn",
            ])
            .args(["--port", &port.to_string()])
            .args(["--readiness-probe-port", &readiness_port.to_string()])
            .args(["--cert-file", "tls.crt", "--key-file", "tls.key"])
            .args([
                "--policies",
                "policies.yml",
                "--sources-path",
                "sources.yaml",
            ])
            .args([
                "--policies-download-dir",
                "dl",
                "--sigstore-cache-dir",
                "sig",
            ])
            .arg("--sigstore-trust-config")
            .arg(tools.sigstore_trust_config())
            .args([
                "--workers",
                &options.workers.unwrap_or(2).to_string(),
                "--policy-timeout",
                &options.policy_timeout.unwrap_or(2).to_string(),
            ])
            .env_remove("KUBECONFIG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("policy-server.log")).expect("log file"));
        match options.kubeconfig {
            Some(kubeconfig) => {
                command.env("KUBECONFIG", kubeconfig);
            }
            None => {
                command.arg("--ignore-kubernetes-connection-failure");
            }
        }
        for (key, value) in &options.env {
            command.env(key, value);
        }
        let child = command.spawn().expect("policy-server");
        let mut server = PolicyServer {
            child,
            dir,
            port,
            readiness_port,
            cert_pem: certificate.cert_pem,
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&mut self) {
        let started = Instant::now();
        let url = format!("http://127.0.0.1:{}/readiness", self.readiness_port);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("policy-server exited ({status}):\n{}", self.log());
            }
            if ureq::get(&url).call().is_ok() {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "policy-server not ready after 120 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What policy-server wrote to its standard error.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("policy-server.log")).unwrap_or_default()
    }

    /// The webhook URL of policy `id`.
    pub fn url(&self, id: &str) -> String {
        format!("https://127.0.0.1:{}/validate/{id}", self.port)
    }

    /// The serving certificate's file (PEM), the CA bundle of a client.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }

    /// POSTs `review` (an AdmissionReview) to `path` (`validate/<id>` or `audit/<id>`) and returns
    /// the answer, with the time it took.
    pub fn post(&self, path: &str, review: &Value) -> (Value, Duration) {
        self.try_post(path, review, Duration::from_secs(300))
            .unwrap_or_else(|error| panic!("POST {path}: {error}\npolicy-server:\n{}", self.log()))
    }

    /// The same, giving up after `max_time`: what curl said when there was no answer (a call
    /// the host never answers leaves the admission waiting as long as its client does).
    pub fn try_post(
        &self,
        path: &str,
        review: &Value,
        max_time: Duration,
    ) -> Result<(Value, Duration), String> {
        let started = Instant::now();
        let output = Command::new("curl")
            .args(["-sS", "--fail-with-body", "--max-time"])
            .arg(format!("{:.3}", max_time.as_secs_f64()))
            .arg("--cacert")
            .arg(self.ca_file())
            .args([
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                "@-",
            ])
            .arg(format!("https://127.0.0.1:{}/{path}", self.port))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .expect("curl's stdin")
                    .write_all(review.to_string().as_bytes())?;
                child.wait_with_output()
            })
            .expect("curl");
        let took = started.elapsed();
        if !output.status.success() {
            return Err(format!(
                "{}{}",
                String::from_utf8_lossy(&output.stderr),
                String::from_utf8_lossy(&output.stdout)
            ));
        }
        let answer = serde_json::from_slice(&output.stdout)
            .map_err(|e| format!("policy-server's answer is not JSON: {e}"))?;
        Ok((answer, took))
    }

    /// An AdmissionReview around `request` (an AdmissionRequest), as the API server sends it.
    pub fn review(request: &Value) -> Value {
        serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": request,
        })
    }
}

impl Drop for PolicyServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl RealTools {
    /// `kwctl run` of `module` on `request` with `settings`, offline (Sigstore's root from a
    /// file), with `extra` arguments and `env` in its environment (`KUBECONFIG`): kwctl's
    /// AdmissionResponse, and its standard error.
    pub fn kwctl_run(
        &self,
        module: &Path,
        settings: &Value,
        request: &Value,
        extra: &[&std::ffi::OsStr],
        env: &[(&str, &Path)],
    ) -> (Value, String) {
        let dir = scratch_dir("kwctl-run");
        std::fs::write(dir.join("settings.json"), settings.to_string()).expect("settings");
        std::fs::write(dir.join("request.json"), request.to_string()).expect("request");
        let output = Command::new(self.bin("kwctl"))
            .arg("run")
            .arg("--sigstore-trust-config")
            .arg(self.sigstore_trust_config())
            .arg("--settings-path")
            .arg(dir.join("settings.json"))
            .arg("--request-path")
            .arg(dir.join("request.json"))
            .args(extra)
            .arg(module)
            .env("NO_COLOR", "1")
            .env_remove("KUBECONFIG")
            .envs(env.iter().map(|(key, value)| (key, value)))
            .output()
            .expect("kwctl run");
        let _ = std::fs::remove_dir_all(&dir);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "kwctl run: {stderr}");
        let answer = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("kwctl run's answer: {e}: {stderr}"));
        (answer, stderr)
    }
}
