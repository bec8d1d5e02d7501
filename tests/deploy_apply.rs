//! `deploy/` on a real API server (kube-apiserver 1.36 from the real tools): every overlay applied
//! with the commands docs/install*.md (and docs/migrating.md) type, in their order, on Kubewarden's
//! CRDs of 1.35 and of 1.38, the monitoring CRDs the overlays render
//! (`tests/deploy_apply/monitoring_crds.yaml`), and a stand-in for the one rule of Kubewarden's
//! controller that an install meets at apply time: its PolicyServer webhook refuses a
//! PolicyServer whose `imagePullSecret` does not exist or is not `kubernetes.io/dockerconfigjson`.
//! And the ValidatingAdmissionPolicy that holds the fill job's identity to Pods' records.
//!
//! No kubelet and no Kubewarden controller run: a Job the page runs is played by running its
//! containers' kubectl scripts here, as the Job's ServiceAccount; a `kubectl wait` for a policy's
//! `PolicyActive` is read as "the policy and its PolicyServer exist". The install pages walked
//! through block by block, on one API server: [`walkthrough`].

mod rig;
#[path = "deploy_apply/walkthrough.rs"]
mod walkthrough;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine as _;
use rig::tools::{ControlPlane, RealTools, ServingCertificate, scratch_dir};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};

/// Kubewarden's CRDs per release the docs cover: (release, folder).
const RELEASES: [(&str, &str); 2] = [
    ("1.35", "scripts/kubewarden-crds"),
    ("1.38", "scripts/kubewarden-crds-1.38"),
];

/// The namespace the chart installs Kubewarden into, where the controller reads
/// PolicyServers' pull Secrets.
const KUBEWARDEN: &str = "kubewarden";

/// The fill job's identity, which the ValidatingAdmissionPolicy holds to Pods' records.
const FILL_JOB: &str = "system:serviceaccount:kubewarden:fill-mirror";

/// The record the swapping policy writes on a Pod kept on its source image and the fill job
/// drops once it has copied it (`src/plan/unmirrored.rs`).
const RECORD_ANNOTATION: &str = "image-swapper.kubewarden.io/unmirrored-images";
const RECORD_LABEL: &str = "image-swapper.kubewarden.io/unmirrored";

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A stand-in for kubewarden-controller's validating webhook of PolicyServers
/// (`vpolicyserver.kb.io`; v1.35.0 `api/policies/v1/policyserver_webhook.go` and
/// `internal/policyserver` `ValidateImagePullSecret`), its one rule an install meets at apply
/// time: a PolicyServer whose `spec.imagePullSecret` names a Secret that does not exist in the
/// controller's namespace, or one not of type `kubernetes.io/dockerconfigjson`, is refused, in
/// the controller's words. It reads the Secret through the API server, as the controller does.
/// Served over TLS on loopback; stopped on drop.
struct ControllerStandIn {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControllerStandIn {
    /// Starts the webhook and registers it with `plane` as a ValidatingWebhookConfiguration; returns
    /// once the API server calls it.
    fn install(plane: &ControlPlane) -> ControllerStandIn {
        let certificate = ServingCertificate::loopback();
        let certs = vec![
            CertificateDer::from_pem_slice(certificate.cert_pem.as_bytes())
                .expect("the serving certificate"),
        ];
        let key = PrivateKeyDer::from_pem_slice(certificate.key_pem.as_bytes()).expect("its key");
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("the TLS configuration"),
        );
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let kubeconfig = plane.kubeconfig.clone();
        let cache = plane.data_dir().join("kubectl-cache");
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            for connection in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(connection) = connection else { continue };
                let config = config.clone();
                let kubeconfig = kubeconfig.clone();
                let cache = cache.clone();
                std::thread::spawn(move || {
                    let _ = serve(connection, config, &kubeconfig, &cache);
                });
            }
        });
        let stand_in = ControllerStandIn {
            port,
            stop,
            thread: Some(thread),
        };
        let ca_bundle = base64::engine::general_purpose::STANDARD.encode(&certificate.cert_pem);
        let configuration = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "kubewarden-controller-stand-in"},
            "webhooks": [{
                "name": "vpolicyserver.kb.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "clientConfig": {
                    "url": format!("https://127.0.0.1:{port}/validate-policies-kubewarden-io-v1-policyserver"),
                    "caBundle": ca_bundle,
                },
                "rules": [{
                    "apiGroups": ["policies.kubewarden.io"],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["policyservers"],
                }],
            }],
        });
        plane.kubectl_ok(&["apply", "-f", "-"], Some(&configuration.to_string()));
        // The API server reads webhook configurations asynchronously: wait until it calls this one.
        let probe = json!({
            "apiVersion": "policies.kubewarden.io/v1",
            "kind": "PolicyServer",
            "metadata": {"name": "probe"},
            "spec": {"image": "policy-server", "replicas": 1, "imagePullSecret": "no-such-secret"},
        })
        .to_string();
        let started = Instant::now();
        loop {
            let output = plane.kubectl(&["create", "--dry-run=server", "-f", "-"], Some(&probe));
            if text(&output).contains("vpolicyserver.kb.io") {
                return stand_in;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the API server never called the controller's stand-in: {}",
                text(&output)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for ControllerStandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Answers the AdmissionReviews of one connection (HTTP/1.1 over TLS, kept alive).
fn serve(
    connection: TcpStream,
    config: Arc<rustls::ServerConfig>,
    kubeconfig: &Path,
    cache: &Path,
) -> std::io::Result<()> {
    let tls = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    let mut stream = BufReader::new(rustls::StreamOwned::new(tls, connection));
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        if stream.read_line(&mut line)? == 0 {
            return Ok(());
        }
        loop {
            line.clear();
            stream.read_line(&mut line)?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        stream.read_exact(&mut body)?;
        let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let answer = review_policy_server(&review["request"], kubeconfig, cache).to_string();
        let writer = stream.get_mut();
        write!(
            writer,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
            answer.len()
        )?;
        writer.flush()?;
    }
}

/// The controller's answer to a PolicyServer's creation or update.
fn review_policy_server(request: &Value, kubeconfig: &Path, cache: &Path) -> Value {
    let object = &request["object"];
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let secret = object["spec"]["imagePullSecret"]
        .as_str()
        .unwrap_or_default();
    let refusal = if secret.is_empty() {
        None
    } else {
        pull_secret_error(secret, kubeconfig, cache)
    };
    let mut response = json!({"uid": request["uid"], "allowed": refusal.is_none()});
    if let Some(error) = refusal {
        // apierrors.NewInvalid of a field.Invalid on spec.imagePullSecret.
        response["status"] = json!({
            "status": "Failure",
            "code": 422,
            "reason": "Invalid",
            "message": format!(
                "PolicyServer.policies.kubewarden.io \"{name}\" is invalid: spec.imagePullSecret: Invalid value: \"{secret}\": {error}"
            ),
        });
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

/// `ValidateImagePullSecret`'s error for Secret `name` in the controller's namespace, if any.
fn pull_secret_error(name: &str, kubeconfig: &Path, cache: &Path) -> Option<String> {
    let output = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache)
        .args(["get", "secret", "-n", KUBEWARDEN, name, "-o", "json"])
        .output();
    let output = match output {
        Ok(output) => output,
        Err(error) => return Some(format!("cannot get spec.ImagePullSecret: {error}")),
    };
    if !output.status.success() {
        // kubectl's "Error from server (NotFound): " before the API server's own words.
        let said = String::from_utf8_lossy(&output.stderr);
        let said = said.trim();
        let error = said.split_once("): ").map_or(said, |(_, error)| error);
        return Some(format!("cannot get spec.ImagePullSecret: {error}"));
    }
    let secret: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    (secret["type"] != "kubernetes.io/dockerconfigjson").then(|| {
        format!(
            "spec.ImagePullSecret secret \"{name}\" is not of type kubernetes.io/dockerconfigjson"
        )
    })
}

/// Step 1 of the walkthroughs as this test can have it: an API server with Kubewarden `release`'s
/// CRDs (from `folder`), the monitoring CRDs, the namespace `kubewarden`, and the controller's
/// PolicyServer check.
fn kubewarden_installed(tools: &RealTools, folder: &str) -> (ControlPlane, ControllerStandIn) {
    let plane = ControlPlane::start(tools, false);
    let root = rig::root();
    plane.kubectl_ok(&["apply", "-f", &root.join(folder).to_string_lossy()], None);
    plane.kubectl_ok(
        &[
            "apply",
            "-f",
            &root
                .join("tests/deploy_apply/monitoring_crds.yaml")
                .to_string_lossy(),
        ],
        None,
    );
    plane.kubectl_ok(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "--all",
        ],
        None,
    );
    plane.kubectl_ok(&["create", "namespace", KUBEWARDEN], None);
    let stand_in = ControllerStandIn::install(&plane);
    (plane, stand_in)
}

/// The platform folders of deploy/ beside base/.
fn overlays() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(rig::root().join("deploy"))
        .expect("deploy/")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.join("kustomization.yaml").exists() && !path.ends_with("base"))
        .filter_map(|path| Some(path.file_name()?.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names
}

/// The words of a shell command line: quotes removed, `#` comments dropped.
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut started = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                started = true;
            }
            (None, '#') if !started => break,
            (None, c) if c.is_whitespace() => {
                if started {
                    words.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            (None, c) => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        words.push(word);
    }
    words
}

/// The commands of `page`'s console block that applies `deploy/<overlay>` (`kubectl apply -k
/// deploy/<overlay>`), in order; `None` when the page has no such block. A page has one at most.
fn install_commands(page: &str, overlay: &str) -> Option<Vec<Vec<String>>> {
    let text = std::fs::read_to_string(rig::root().join("docs").join(page)).expect("page");
    let target = format!("deploy/{overlay}");
    let mut found = Vec::new();
    for block in text.split("```console\n").skip(1) {
        let block = block.split("```").next().unwrap_or_default();
        let commands: Vec<Vec<String>> = block
            .replace("\\\n", " ")
            .lines()
            .map(words)
            .filter(|words| !words.is_empty())
            .collect();
        let applies = commands.iter().any(|c| {
            c.len() == 4 && c[0] == "kubectl" && c[1] == "apply" && c[2] == "-k" && c[3] == target
        });
        if applies {
            found.push(commands);
        }
    }
    assert!(
        found.len() <= 1,
        "{page}: {} console blocks apply {target}: which is the order?",
        found.len()
    );
    found.pop()
}

/// The install page (`docs/install.md` or a platform's `docs/install-*.md`) whose console block
/// applies `deploy/<overlay>`, with that block's commands: exactly one page installs each overlay.
fn install_page(overlay: &str) -> (String, Vec<Vec<String>>) {
    let mut pages: Vec<String> = std::fs::read_dir(rig::root().join("docs"))
        .expect("docs/")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("install") && name.ends_with(".md"))
        .collect();
    pages.sort();
    let mut found: Vec<(String, Vec<Vec<String>>)> = pages
        .into_iter()
        .filter_map(|page| Some((page.clone(), install_commands(&page, overlay)?)))
        .collect();
    let names: Vec<&str> = found.iter().map(|(page, _)| page.as_str()).collect();
    assert_eq!(
        names.len(),
        1,
        "docs/install*.md: pages with a console block applying deploy/{overlay}: {names:?}"
    );
    found.remove(0)
}

/// The `kubectl` on PATH.
fn real_kubectl() -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("kubectl"))
        .find(|path| path.is_file())
        .expect("kubectl on PATH (apt-get install kubectl)")
}

/// Plays a Job made from CronJob `cronjob` in `namespace` as the cluster would run it: its init
/// containers (a cloud CLI that writes a token to a file) by writing a stand-in token where each
/// one redirects its output; then each container's `sh -c`/`bash -c` script here, its volumes as
/// folders, its environment, and `kubectl` acting as the Pod's ServiceAccount (its RBAC).
fn play_job(plane: &ControlPlane, namespace: &str, cronjob: &str) {
    let cron = plane.get_json(&["cronjob", "-n", namespace, cronjob]);
    let pod = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    let account = pod["serviceAccountName"].as_str().unwrap_or("default");
    let dir = scratch_dir("job");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    let wrapper = bin.join("kubectl");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec '{}' --kubeconfig '{}' --cache-dir '{}' --as=system:serviceaccount:{namespace}:{account} \"$@\"\n",
            real_kubectl().display(),
            plane.kubeconfig.display(),
            plane.data_dir().join("kubectl-cache").display(),
        ),
    )
    .expect("kubectl wrapper");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let script_of = |container: &Value| -> (String, String) {
        let command: Vec<&str> = container["command"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let name = container["name"].as_str().unwrap_or_default();
        assert!(
            command.len() == 3 && command[1] == "-c",
            "{cronjob}: container {name}: not a `sh -c` script: {command:?}"
        );
        let mut script = command[2].to_string();
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let (Some(volume), Some(path)) = (mount["name"].as_str(), mount["mountPath"].as_str())
            else {
                continue;
            };
            let folder = dir.join(volume);
            std::fs::create_dir_all(&folder).expect("volume folder");
            script = script.replace(&format!("{path}/"), &format!("{}/", folder.display()));
        }
        (command[0].to_string(), script)
    };
    for init in pod["initContainers"].as_array().into_iter().flatten() {
        let (_, script) = script_of(init);
        let written: Vec<&str> = script
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == ">")
            .map(|w| w[1])
            .collect();
        assert!(
            !written.is_empty(),
            "{cronjob}: init container {}: writes no file this test can stand in for",
            init["name"]
        );
        for path in written {
            std::fs::write(path, "stand-in-token").expect("the init container's token");
        }
    }
    for container in pod["containers"].as_array().into_iter().flatten() {
        let (shell, script) = script_of(container);
        let mut command = Command::new(shell);
        command.arg("-c").arg(&script).env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        );
        for variable in container["env"].as_array().into_iter().flatten() {
            if let (Some(name), Some(value)) =
                (variable["name"].as_str(), variable["value"].as_str())
            {
                command.env(name, value);
            }
        }
        let output = command.output().expect("the Job's script");
        assert!(
            output.status.success(),
            "{cronjob}: container {} as {account}: {}",
            container["name"],
            text(&output)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `commands` (a page's console block) on `plane` in their order, each as typed, except
/// what needs what this test has not: `helm` (Kubewarden is installed already, the CRDs and the
/// controller's check), a Job's run (played by [`play_job`]) and the waits for it and for
/// `PolicyActive` (no controller: the policies and their PolicyServers must exist).
fn run_as_typed(plane: &ControlPlane, page: &str, commands: &[Vec<String>]) {
    for command in commands {
        let line = command.join(" ");
        let args: Vec<&str> = command.iter().skip(1).map(String::as_str).collect();
        match command[0].as_str() {
            "helm" => continue,
            "kubectl" => {}
            _ => panic!("{page}: `{line}`: a command this test cannot play"),
        }
        let flag = |name: &str| {
            args.iter()
                .find_map(|a| a.strip_prefix(&format!("{name}=")))
                .or_else(|| {
                    args.iter()
                        .position(|a| *a == name)
                        .and_then(|i| args.get(i + 1).copied())
                })
        };
        match args.first().copied() {
            Some("wait") if flag("--for") == Some("condition=complete") => {
                // The Job ran when it was created (below): it exists.
                let jobs: Vec<&str> = args
                    .iter()
                    .filter(|a| a.starts_with("job/"))
                    .copied()
                    .collect();
                let namespace = flag("-n").unwrap_or("default");
                plane.kubectl_ok(&[&["get", "-n", namespace][..], &jobs[..]].concat(), None);
            }
            Some("wait") if flag("--for") == Some("condition=PolicyActive") => {
                for policy in args
                    .iter()
                    .filter_map(|a| a.strip_prefix("clusteradmissionpolicy/"))
                {
                    let object = plane.get_json(&["clusteradmissionpolicy", policy]);
                    let server = object["spec"]["policyServer"].as_str().unwrap_or("default");
                    plane.kubectl_ok(&["get", "policyserver", server], None);
                }
            }
            _ => {
                let output = plane.kubectl(&args, None);
                assert!(
                    output.status.success(),
                    "{page}: `{line}` failed:\n{}",
                    text(&output)
                );
                if args.first() == Some(&"create") && args.get(1) == Some(&"job") {
                    let cronjob = flag("--from")
                        .and_then(|from| from.strip_prefix("cronjob/"))
                        .unwrap_or_else(|| panic!("{page}: `{line}`: a Job not from a CronJob"));
                    play_job(plane, flag("-n").unwrap_or("default"), cronjob);
                }
            }
        }
    }
}

/// The value of `key` in the overlay's `image-swapper-values` literals.
fn overlay_value(overlay: &str, key: &str) -> Option<String> {
    let kustomization = rig::read_yaml(
        &rig::root()
            .join("deploy")
            .join(overlay)
            .join("kustomization.yaml"),
    );
    kustomization["configMapGenerator"]
        .as_array()?
        .iter()
        .filter(|g| g["name"] == "image-swapper-values")
        .flat_map(|g| g["literals"].as_array().cloned().unwrap_or_default())
        .filter_map(|l| l.as_str().map(str::to_string))
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
}

/// A label selector's `kubectl -l` form.
fn selector_string(selector: &Value) -> String {
    let mut parts: Vec<String> = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    for expression in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = expression["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = expression["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        parts.push(match expression["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            other => panic!("operator {other}"),
        });
    }
    parts.join(",")
}

/// After the install: every object the overlay renders exists; applying it again changes
/// nothing it should not (the Secret the Job wrote stays); the Prometheus Operator's objects carry
/// the overlay's kube-prometheus-stack release label, and a ServiceMonitor selects the Service
/// kubewarden-controller makes for each PolicyServer, on its metrics port.
fn check_installed(plane: &ControlPlane, overlay: &str, how: &str) {
    let path = format!("deploy/{overlay}");
    let output = plane.kubectl(&["get", "-k", &path, "-o", "name"], None);
    assert!(
        output.status.success(),
        "{how}: not every object of {path} exists:\n{}",
        text(&output)
    );
    let secret = plane.get_json(&["secret", "-n", KUBEWARDEN, "mirror-readonly"]);
    assert_eq!(
        secret["type"], "kubernetes.io/dockerconfigjson",
        "{how}: the lookups' Secret"
    );
    plane.kubectl_ok(&["apply", "-k", &path], None);
    let again = plane.get_json(&["secret", "-n", KUBEWARDEN, "mirror-readonly"]);
    assert_eq!(
        again["data"], secret["data"],
        "{how}: applying {path} again changed the Secret the credentials Job wrote"
    );

    let rendered = plane.kubectl_ok(&["kustomize", &path], None);
    let documents: Vec<Value> = serde_yaml::Deserializer::from_str(&rendered)
        .map(|d| serde::Deserialize::deserialize(d).expect("rendered YAML"))
        .collect();
    let of_kind =
        |kind: &str| -> Vec<&Value> { documents.iter().filter(|d| d["kind"] == kind).collect() };
    let rules = of_kind("PrometheusRule");
    let monitors = of_kind("ServiceMonitor");
    if rules.is_empty() && monitors.is_empty() {
        return;
    }
    assert!(
        !rules.is_empty() && !monitors.is_empty(),
        "{how}: {path} renders the Prometheus Operator's alerts without a scrape of policy-server, or the reverse"
    );
    let release = overlay_value(overlay, "prometheusRelease")
        .unwrap_or_else(|| panic!("{how}: {path}/kustomization.yaml names no prometheusRelease"));
    let labelled: BTreeSet<String> = plane
        .kubectl_ok(
            &[
                "get",
                "prometheusrules,servicemonitors",
                "-A",
                "-l",
                &format!("release={release}"),
                "-o",
                "name",
            ],
            None,
        )
        .lines()
        .map(str::to_string)
        .collect();
    for object in rules.iter().chain(&monitors) {
        let name = format!(
            "{}.monitoring.coreos.com/{}",
            object["kind"].as_str().unwrap_or_default().to_lowercase(),
            object["metadata"]["name"].as_str().unwrap_or_default()
        );
        assert!(
            labelled.contains(&name),
            "{how}: kube-prometheus-stack (release {release}) selects {labelled:?}, not {name}"
        );
    }
    // The Services kubewarden-controller makes for the PolicyServers, with metrics on
    // (internal/controller/policyserver_controller_service.go).
    let servers: Vec<String> = of_kind("PolicyServer")
        .iter()
        .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    for server in &servers {
        let service = json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": format!("policy-server-{server}"),
                "namespace": KUBEWARDEN,
                "labels": {"app": format!("kubewarden-policy-server-{server}")},
            },
            "spec": {
                "selector": {"app": format!("kubewarden-policy-server-{server}")},
                "ports": [
                    {"name": "policy-server", "port": 443, "targetPort": 8443, "protocol": "TCP"},
                    {"name": "metrics", "port": 8080, "protocol": "TCP"},
                ],
            },
        });
        plane.kubectl_ok(&["apply", "-f", "-"], Some(&service.to_string()));
    }
    let mut scraped = BTreeSet::new();
    for monitor in &monitors {
        let namespace = monitor["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default");
        let selected = plane.get_json(&[
            "services",
            "-n",
            namespace,
            "-l",
            &selector_string(&monitor["spec"]["selector"]),
        ]);
        for service in selected["items"].as_array().into_iter().flatten() {
            let ports: BTreeSet<&str> = service["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["name"].as_str())
                .collect();
            for endpoint in monitor["spec"]["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let port = endpoint["port"].as_str().unwrap_or_default();
                assert!(
                    ports.contains(port),
                    "{how}: ServiceMonitor {} scrapes port {port:?}, which Service {} does not name ({ports:?})",
                    monitor["metadata"]["name"],
                    service["metadata"]["name"]
                );
            }
            if let Some(name) = service["metadata"]["name"].as_str() {
                scraped.insert(name.to_string());
            }
        }
    }
    // And the overlay's own Services with a port named metrics: the fill controller's.
    let mut wanted: BTreeSet<String> = servers
        .iter()
        .map(|s| format!("policy-server-{s}"))
        .collect();
    wanted.extend(
        of_kind("Service")
            .iter()
            .filter(|s| {
                s["spec"]["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["name"] == "metrics")
            })
            .filter_map(|s| s["metadata"]["name"].as_str().map(str::to_string)),
    );
    assert_eq!(
        scraped, wanted,
        "{how}: the Services a ServiceMonitor of {path} scrapes"
    );
}

/// Installs `overlay` on a fresh API server per Kubewarden release, with the commands of each page
/// that has a console block applying it, as typed; one install page must have one.
fn installs_as_typed(overlay: &str) {
    let Some(tools) = RealTools::find(&format!("deploy_apply {overlay}")) else {
        return;
    };
    assert!(
        overlays().contains(&overlay.to_string()),
        "no deploy/{overlay}"
    );
    let (page, install) = install_page(overlay);
    for (release, folder) in RELEASES {
        let (plane, _controller) = kubewarden_installed(&tools, folder);
        run_as_typed(&plane, &page, &install);
        check_installed(&plane, overlay, &format!("{page} on Kubewarden {release}"));
    }
    if let Some(migrating) = install_commands("migrating.md", overlay) {
        let (release, folder) = RELEASES[1];
        let (plane, _controller) = kubewarden_installed(&tools, folder);
        // k8s-image-swapper's webhook configuration, which the page deletes first.
        plane.kubectl_ok(
            &["apply", "-f", "-"],
            Some(
                &json!({
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": "MutatingWebhookConfiguration",
                    "metadata": {"name": "k8s-image-swapper"},
                    "webhooks": [],
                })
                .to_string(),
            ),
        );
        run_as_typed(&plane, "migrating.md", &migrating);
        check_installed(
            &plane,
            overlay,
            &format!("migrating.md on Kubewarden {release}"),
        );
    }
}

/// Every overlay in deploy/ has its test here.
#[test]
fn every_overlay_has_an_install_test() {
    assert_eq!(
        overlays(),
        [
            "eks-ecr",
            "eks-ecr-pull-through",
            "gke-artifact-registry",
            "registry"
        ],
        "an overlay without its `installs_as_typed` test below (or one gone)"
    );
}

#[test]
fn eks_ecr_installs_as_the_pages_type_it() {
    installs_as_typed("eks-ecr");
}

#[test]
fn eks_ecr_pull_through_installs_as_the_pages_type_it() {
    installs_as_typed("eks-ecr-pull-through");
}

#[test]
fn gke_artifact_registry_installs_as_the_pages_type_it() {
    installs_as_typed("gke-artifact-registry");
}

#[test]
fn registry_installs_as_the_pages_type_it() {
    installs_as_typed("registry");
}

/// The stand-in refuses what the controller refuses: applying an overlay before its pull Secret
/// exists (the order the pages had) leaves no PolicyServer, with the controller's words; a Secret
/// of another type is refused too; a docker config Secret lets the same apply through.
#[test]
fn a_policy_server_before_its_pull_secret_is_refused_with_the_controllers_words() {
    let Some(tools) = RealTools::find("deploy_apply refusal") else {
        return;
    };
    let (plane, _controller) = kubewarden_installed(&tools, RELEASES[1].1);
    let not_found = "admission webhook \"vpolicyserver.kb.io\" denied the request: \
        PolicyServer.policies.kubewarden.io \"image-swapper\" is invalid: spec.imagePullSecret: \
        Invalid value: \"mirror-readonly\": cannot get spec.ImagePullSecret: secrets \
        \"mirror-readonly\" not found";
    for overlay in overlays() {
        let output = plane.kubectl(&["apply", "-k", &format!("deploy/{overlay}")], None);
        assert!(
            !output.status.success() && text(&output).contains(not_found),
            "deploy/{overlay} applied before its pull Secret:\n{}",
            text(&output)
        );
        let servers = plane.kubectl_ok(&["get", "policyservers", "-o", "name"], None);
        assert_eq!(servers, "", "deploy/{overlay}: PolicyServers created");
    }
    plane.kubectl_ok(
        &[
            "create",
            "secret",
            "generic",
            "mirror-readonly",
            "-n",
            KUBEWARDEN,
            "--from-literal=token=x",
        ],
        None,
    );
    let output = plane.kubectl(&["apply", "-k", "deploy/registry"], None);
    assert!(
        !output.status.success()
            && text(&output).contains(
                "spec.ImagePullSecret secret \"mirror-readonly\" is not of type kubernetes.io/dockerconfigjson"
            ),
        "an Opaque pull Secret:\n{}",
        text(&output)
    );
    plane.kubectl_ok(
        &["delete", "secret", "-n", KUBEWARDEN, "mirror-readonly"],
        None,
    );
    plane.kubectl_ok(
        &[
            "create",
            "secret",
            "docker-registry",
            "mirror-readonly",
            "-n",
            KUBEWARDEN,
            "--docker-server=mirror.example.com",
            "--docker-username=reader",
            "--docker-password=token",
        ],
        None,
    );
    plane.kubectl_ok(&["apply", "-k", "deploy/registry"], None);
    let servers = plane.kubectl_ok(&["get", "policyservers", "-o", "name"], None);
    assert_eq!(
        servers.lines().collect::<BTreeSet<_>>(),
        BTreeSet::from([
            "policyserver.policies.kubewarden.io/image-swapper",
            "policyserver.policies.kubewarden.io/image-swapper-check",
        ])
    );
}

/// A Pod with the swapping policy's record, in `namespace`.
fn recorded_pod(plane: &ControlPlane, namespace: &str, name: &str) {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": name, RECORD_LABEL: "true"},
            "annotations": {
                RECORD_ANNOTATION: r#"{"app":{"source":"docker.io/library/nginx:1.27"}}"#,
                "team.example.com/owner": "payments",
            },
        },
        "spec": {"containers": [{"name": "app", "image": "docker.io/library/nginx:1.27"}]},
    });
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&pod.to_string()));
}

/// `kubectl patch pod` as the fill job's ServiceAccount, with a JSON patch.
fn patch_as_fill_job(plane: &ControlPlane, namespace: &str, pod: &str, patch: &Value) -> Output {
    plane.kubectl(
        &[
            &format!("--as={FILL_JOB}"),
            "patch",
            "pod",
            "-n",
            namespace,
            pod,
            "--type=json",
            "-p",
            &patch.to_string(),
        ],
        None,
    )
}

/// The ValidatingAdmissionPolicy deploy/ ships, with the fill job's ServiceAccount and RBAC as the
/// base renders them: the fill job's identity, which may patch any Pod, changes a Pod's record and
/// nothing else, in kube-system as anywhere. Its image patch is refused, the record patch it sends
/// (drop the record and the label, testing the record read) passes, and so does an administrator's
/// image patch.
#[test]
fn the_fill_jobs_identity_may_drop_records_and_nothing_else() {
    let Some(tools) = RealTools::find("deploy_apply fill-job admission") else {
        return;
    };
    let plane = ControlPlane::start(&tools, false);
    plane.kubectl_ok(&["create", "namespace", KUBEWARDEN], None);
    plane.kubectl_ok(&["create", "namespace", "shop"], None);
    let rendered = plane.kubectl_ok(&["kustomize", "deploy/registry"], None);
    let wanted: Vec<Value> = serde_yaml::Deserializer::from_str(&rendered)
        .map(|d| serde::Deserialize::deserialize(d).expect("rendered YAML"))
        .filter(|d: &Value| {
            let kind = d["kind"].as_str().unwrap_or_default();
            kind.starts_with("ValidatingAdmissionPolicy")
                || (["ServiceAccount", "ClusterRole", "ClusterRoleBinding"].contains(&kind)
                    && d["metadata"]["name"] == "fill-mirror")
        })
        .collect();
    let kinds: BTreeSet<&str> = wanted.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "ClusterRole",
            "ClusterRoleBinding",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]),
        "deploy/base renders the fill job's identity and the policy that holds it"
    );
    let list = json!({"apiVersion": "v1", "kind": "List", "items": wanted});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&list.to_string()));
    for namespace in ["kube-system", "shop"] {
        recorded_pod(&plane, namespace, "app");
    }
    let image_patch = json!([
        {"op": "replace", "path": "/spec/containers/0/image", "value": "attacker.example.com/app:1"}
    ]);
    // The API server compiles a new policy in the background: wait until it refuses.
    let started = Instant::now();
    let refused = loop {
        let output = plane.kubectl(
            &[
                &format!("--as={FILL_JOB}"),
                "patch",
                "pod",
                "-n",
                "kube-system",
                "app",
                "--dry-run=server",
                "--type=json",
                "-p",
                &image_patch.to_string(),
            ],
            None,
        );
        if !output.status.success() || started.elapsed() > Duration::from_secs(30) {
            break output;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        text(&refused).contains("ValidatingAdmissionPolicy 'image-swapper-fill-mirror'"),
        "the fill job's image patch in kube-system (dry run):\n{}",
        text(&refused)
    );
    let image = |namespace: &str| {
        plane.get_json(&["pod", "-n", namespace, "app"])["spec"]["containers"][0]["image"].clone()
    };
    for namespace in ["kube-system", "shop"] {
        let output = patch_as_fill_job(&plane, namespace, "app", &image_patch);
        assert!(
            !output.status.success()
                && text(&output).contains("ValidatingAdmissionPolicy 'image-swapper-fill-mirror'")
                && text(&output).contains("not its spec"),
            "the fill job's image patch in {namespace}:\n{}",
            text(&output)
        );
        assert_eq!(
            image(namespace),
            "docker.io/library/nginx:1.27",
            "{namespace}"
        );
    }
    let others = [
        (
            json!([{"op": "add", "path": "/metadata/labels/app", "value": "other"}]),
            "label image-swapper.kubewarden.io/unmirrored",
        ),
        (
            json!([{"op": "add", "path": "/metadata/annotations/team.example.com~1owner", "value": "x"}]),
            "annotation image-swapper.kubewarden.io/unmirrored-images",
        ),
        (
            json!([{"op": "add", "path": "/metadata/finalizers", "value": ["example.com/hold"]}]),
            "owners or finalizers",
        ),
    ];
    for (patch, said) in &others {
        let output = patch_as_fill_job(&plane, "shop", "app", patch);
        assert!(
            !output.status.success() && text(&output).contains(said),
            "the fill job's patch {patch}:\n{}",
            text(&output)
        );
    }
    // The patch the fill job sends once the mirror holds some images of the record: the rest
    // stays recorded.
    let escaped = |key: &str| key.replace('/', "~1");
    let shrink = json!([
        {"op": "replace", "path": format!("/metadata/annotations/{}", escaped(RECORD_ANNOTATION)), "value": "{}"}
    ]);
    let output = patch_as_fill_job(&plane, "shop", "app", &shrink);
    assert!(
        output.status.success(),
        "the fill job's partial record patch:\n{}",
        text(&output)
    );
    recorded_pod(&plane, "shop", "app");
    // The patch the fill job sends once the mirror holds every image of the record.
    let record = plane.get_json(&["pod", "-n", "kube-system", "app"])["metadata"]["annotations"]
        [RECORD_ANNOTATION]
        .clone();
    let drop_record = json!([
        {"op": "test", "path": format!("/metadata/annotations/{}", escaped(RECORD_ANNOTATION)), "value": record},
        {"op": "remove", "path": format!("/metadata/annotations/{}", escaped(RECORD_ANNOTATION))},
        {"op": "remove", "path": format!("/metadata/labels/{}", escaped(RECORD_LABEL))},
    ]);
    for namespace in ["kube-system", "shop"] {
        let output = patch_as_fill_job(&plane, namespace, "app", &drop_record);
        assert!(
            output.status.success(),
            "the fill job's record patch in {namespace}:\n{}",
            text(&output)
        );
        let metadata = &plane.get_json(&["pod", "-n", namespace, "app"])["metadata"];
        assert!(
            metadata["annotations"].get(RECORD_ANNOTATION).is_none()
                && metadata["labels"].get(RECORD_LABEL).is_none()
                && metadata["labels"]["app"] == "app"
                && metadata["annotations"]["team.example.com/owner"] == "payments",
            "{namespace}: {metadata:#}"
        );
    }
    plane.kubectl_ok(
        &[
            "patch",
            "pod",
            "-n",
            "shop",
            "app",
            "--type=json",
            "-p",
            &image_patch.to_string(),
        ],
        None,
    );
    assert_eq!(
        image("shop"),
        "attacker.example.com/app:1",
        "the administrator's patch"
    );
}

/// The fill controller with exactly the rights deploy/ gives it: its ServiceAccount, ClusterRole,
/// Lease Role and their bindings and the ValidatingAdmissionPolicy, as deploy/registry renders
/// them, on a real API server; the real binary (`fill-mirror watch`) runs with a token of that
/// ServiceAccount (TokenRequest), the namespace its kubeconfig's. It takes the Lease, lists and
/// watches everything it follows without a refusal, copies a recorded Pod's image into the
/// mirror, and its marking patch passes the ValidatingAdmissionPolicy: the record is dropped.
#[test]
fn the_fill_controller_fills_and_marks_with_the_rights_deploy_gives_it() {
    let Some(tools) = RealTools::find("deploy_apply fill controller rights") else {
        return;
    };
    let plane = ControlPlane::start(&tools, false);
    let root = rig::root();
    plane.kubectl_ok(
        &["apply", "-f", &root.join(RELEASES[1].1).to_string_lossy()],
        None,
    );
    plane.kubectl_ok(&["create", "namespace", KUBEWARDEN], None);
    let rendered = plane.kubectl_ok(&["kustomize", "deploy/registry"], None);
    let documents: Vec<Value> = serde_yaml::Deserializer::from_str(&rendered)
        .map(|d| serde::Deserialize::deserialize(d).expect("rendered YAML"))
        .collect();
    let rights: Vec<Value> = documents
        .iter()
        .filter(|d| {
            let kind = d["kind"].as_str().unwrap_or_default();
            let name = d["metadata"]["name"].as_str().unwrap_or_default();
            kind.starts_with("ValidatingAdmissionPolicy")
                || ([
                    "ServiceAccount",
                    "ClusterRole",
                    "ClusterRoleBinding",
                    "Role",
                    "RoleBinding",
                ]
                .contains(&kind)
                    && name.starts_with("fill-mirror"))
        })
        .cloned()
        .collect();
    assert_eq!(
        rights.len(),
        7,
        "deploy/registry's fill controller rights: {rights:#?}"
    );
    let list = json!({"apiVersion": "v1", "kind": "List", "items": rights});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&list.to_string()));

    let source = rig::registry::TestRegistry::start("deploy-fill-src").expect("source registry");
    let mirror = rig::registry::TestRegistry::start("deploy-fill-mirror").expect("mirror registry");
    let digest = rig::images::Image::new("web", "linux/amd64").push(&source, "app/web", Some("1"));
    // The swapping policy as deploy/ names it, routing the loopback source to the mirror.
    let settings = json!({"mirrors": [{"source": source.host, "target": format!("{}/hub", mirror.host)}],
                          "fillJobUsernames": [FILL_JOB]});
    let mut swapping = documents
        .iter()
        .find(|d| d["kind"] == "ClusterAdmissionPolicy" && d["metadata"]["name"] == "image-swapper")
        .cloned()
        .expect("the swapping policy");
    swapping["spec"]["settings"] = settings.clone();
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&swapping.to_string()));
    let parsed = image_swapper_policy::settings::parse_settings(settings.to_string().as_bytes())
        .expect("settings");
    let policy = image_swapper_policy::policy::Policy::from_settings(&parsed).expect("settings");
    let image = format!("{}/app/web:1", source.host);
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"containers": [{"name": "web", "image": image}]}});
    assert!(image_swapper_policy::plan::write_record(
        &mut pod,
        &[&image],
        &policy
    ));
    plane.kubectl_ok(&["create", "-f", "-"], Some(&pod.to_string()));

    // A kubeconfig of the ServiceAccount's token, as the Pod's mounted token would be.
    let token = plane.kubectl_ok(&["create", "token", "fill-mirror", "-n", KUBEWARDEN], None);
    let dir = scratch_dir("fill-controller-rights");
    let kubeconfig = dir.join("fill-mirror.kubeconfig");
    let config = json!({"apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "plane", "cluster": {
            "server": format!("https://127.0.0.1:{}", plane.port),
            "certificate-authority": plane.ca_file()}}],
        "users": [{"name": "fill-mirror", "user": {"token": token.trim()}}],
        "contexts": [{"name": "fill-mirror", "context": {
            "cluster": "plane", "user": "fill-mirror", "namespace": KUBEWARDEN}}],
        "current-context": "fill-mirror"});
    std::fs::write(&kubeconfig, config.to_string()).expect("kubeconfig");
    let log = dir.join("fill-mirror.log");
    let mut child = Command::new(rig::fill_mirror())
        .args([
            "watch",
            "--insecure",
            "--retry",
            "1",
            "--log-format",
            "text",
            // As deploy/base runs it: the cluster id read with the ServiceAccount's rights.
            "--cluster-id",
            "auto",
        ])
        .args([
            "--listen",
            &format!("127.0.0.1:{}", rig::tools::free_port()),
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("HOSTNAME", "fill-mirror-rights-0")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start fill-mirror watch");
    let deadline = Instant::now() + Duration::from_secs(60);
    let marked = loop {
        let pod = plane.get_json(&["pod", "-n", "default", "web"]);
        let recorded = pod["metadata"]["labels"].get(RECORD_LABEL).is_some()
            || pod["metadata"]["annotations"]
                .get(RECORD_ANNOTATION)
                .is_some();
        if !recorded || Instant::now() > deadline {
            break !recorded;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    // The in-use set, published under the UID of kube-system (`--cluster-id auto`, read with
    // the ServiceAccount's list of namespaces) into the mirror, as deploy/base runs the watch.
    let cluster = plane.get_json(&["namespace", "kube-system"])["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let published = loop {
        let published = mirror.digest_of("image-swapper/in-use", &cluster);
        if published.is_some() || Instant::now() > deadline {
            break published;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    // The template watches start with the Pods'; give a refusal of theirs the time to show.
    std::thread::sleep(Duration::from_secs(2));
    let _ = child.kill();
    let _ = child.wait();
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(marked, "the record stayed on default/web:\n{logged}");
    assert_eq!(
        mirror.digest_of("hub/app/web", "1").as_deref(),
        Some(digest.as_str()),
        "{logged}"
    );
    let lease = plane.get_json(&["lease", "-n", KUBEWARDEN, "fill-mirror"]);
    assert_eq!(
        lease["spec"]["holderIdentity"], "fill-mirror-rights-0",
        "{lease:#}\n{logged}"
    );
    assert!(
        !logged.to_ascii_lowercase().contains("forbidden"),
        "a call the rights do not allow:\n{logged}"
    );
    assert!(
        published.is_some(),
        "no in-use set image-swapper/in-use:{cluster} in the mirror:\n{logged}"
    );
}
