//! The rig's model of policy-server 1.35 held against the real policy-server 1.35: the same
//! scenarios through both, the built module (annotated by the real kwctl) in each, and what the
//! policy can observe compared: the answer (allowed, the patched Pod, warnings, audit
//! annotations, status code and message), the requests that reached each registry and their
//! order, and the time the policy measured, within [`within_tolerance`].
//!
//! The real host runs as kubewarden-controller v1.35.0 configures it: `policies.yml` as its
//! `policyserver_controller_configmap.go` writes a ClusterAdmissionPolicy (`namespacedName`,
//! `module`, `policyMode`, `allowedToMutate`, `contextAwareResources`, `settings`,
//! `hostCapabilities: ["*"]`), `sources.yaml` with `source_authorities` (a registry over HTTPS,
//! the registry process's TLS twin) or `insecure_sources` (plain HTTP, where the host's error
//! texts name `http://` as the rig's `LiveHost`'s do). Each registry is behind
//! [`LatencyProxy::network`] for the host (the network alone: a round trip per connection and
//! per request) and behind [`LatencyProxy::start_in`] for the 1.35 model (what the model says
//! the host costs, over HTTPS or plain HTTP as the host reaches it). Each side has its own
//! proxies, so host names differ: answers are compared with each side's names replaced by the
//! same placeholders. The Kubernetes lists go to a real kube-apiserver for the host, and to the
//! rig's `kubernetes::Cluster` holding the same objects for the model.
//!
//! What was found and changed in the model is in the rig's own documentation (`proxy.rs`
//! `cold_start`, `hosts.rs` `LookupLock`, `cold_verification`, `LiveHost::verify` and its error
//! texts, `kubernetes.rs`). Needs the real tools (`rig::tools`): outside CI, without them, each
//! test says it did not run.

mod rig;

use std::thread;
use std::time::{Duration, Instant};

use rig::hanging::HangingRegistry;
use rig::hosts::{LiveHost, PolicyServer as ModelServer};
use rig::kubernetes::{Access, Cluster};
use rig::proxy::{HostModel, HostProcess, LatencyProxy, Transport};
use rig::registry::{TestRegistry, TlsTwin};
use rig::tools::{
    ControlPlane, PolicyServer as RealServer, PolicyServerOptions, RealTools, ServingCertificate,
};
use rig::{Response, pod_request};
use serde_json::{Value, json};

/// One test at a time: each starts a policy-server (and one a control plane), and their times
/// are compared; several at once on a small machine would compare the machine's load.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The policy's key in `policies.yml`, as the controller names a ClusterAdmissionPolicy.
const ID: &str = "clusterwide-image-swapper";

/// How far apart the model's time and the host's may be, as the policy measures them (its
/// audit summary's `evaluationMilliseconds`): 25% of the host's, and at least 200 ms. The
/// host's own times scatter that much on a loaded machine (the same lookup 20 ms away: 430 to
/// 590 ms from one run to the next); a model off by a lookup or more is found.
fn within_tolerance(model: Duration, host: Duration) -> bool {
    let allowed = (host / 4).max(Duration::from_millis(200));
    model.abs_diff(host) <= allowed
}

/// The same for the first lookup of a process, whose extra cost is the host's own work (its
/// first TLS configuration and client), which a loaded machine stretches: the host may take
/// up to [`COLD_SLACK`] more than the tolerance allows. Measured here: 30-350 ms more than a
/// later lookup, most often under 100 ms (the model adds 100 ms).
fn within_cold_tolerance(model: Duration, host: Duration) -> bool {
    within_tolerance(model, host) || (host > model && within_tolerance(model + COLD_SLACK, host))
}

const COLD_SLACK: Duration = Duration::from_millis(300);

/// `policies.yml` with the policy, as the controller writes it for a ClusterAdmissionPolicy
/// (`namespacedName`, `module`, `policyMode`, `allowedToMutate`, `contextAwareResources` when
/// any, `settings`, `timeoutEvalSeconds` when set, `hostCapabilities: ["*"]` for a cluster-wide
/// policy).
fn policies_yml(tools: &RealTools, settings: &Value, context_aware: &[(&str, &str)]) -> String {
    let module = tools.annotated_policy();
    let mut entry = json!({
        "namespacedName": {"namespace": "", "name": "image-swapper"},
        "module": format!("file://{}", module.display()),
        "policyMode": "protect",
        "allowedToMutate": true,
        "settings": settings,
        "hostCapabilities": ["*"],
    });
    if !context_aware.is_empty() {
        entry["contextAwareResources"] = context_aware
            .iter()
            .map(|(api_version, kind)| json!({"apiVersion": api_version, "kind": kind}))
            .collect();
    }
    serde_yaml::to_string(&json!({ ID: entry })).expect("policies.yml")
}

/// What the policy's answer shows the API server, from either host, with host names replaced.
#[derive(Debug, PartialEq, Clone)]
struct Observed {
    allowed: bool,
    /// The Pod after the patch; `None` when nothing changed.
    patched: Option<Value>,
    warnings: Vec<String>,
    audit: serde_json::Map<String, Value>,
    code: Option<u64>,
    message: Option<String>,
}

/// Replaces each `(name, placeholder)` in every string of `value`.
fn renamed(value: &Value, names: &[(String, String)]) -> Value {
    let text = names
        .iter()
        .fold(value.to_string(), |text, (name, placeholder)| {
            text.replace(name.as_str(), placeholder)
        });
    serde_json::from_str(&text).expect("renamed JSON")
}

impl Observed {
    /// From the real policy-server's AdmissionReview, the patch applied to `request`'s object.
    fn from_review(review: &Value, request: &Value, names: &[(String, String)]) -> Observed {
        let response = &review["response"];
        let patched = response["patch"].as_str().map(|patch| {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(patch)
                .expect("the patch is base64");
            let patch: json_patch::Patch =
                serde_json::from_slice(&bytes).expect("the patch is a JSON patch");
            let mut object = request["object"].clone();
            json_patch::patch(&mut object, &patch).expect("the patch applies");
            object
        });
        let observed = Observed {
            allowed: response["allowed"].as_bool().expect("allowed"),
            patched: patched.filter(|object| *object != request["object"]),
            warnings: strings(&response["warnings"]),
            audit: response["auditAnnotations"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(key, text)| {
                    let text = text.as_str().unwrap_or_default();
                    (
                        key.clone(),
                        serde_json::from_str(text).unwrap_or_else(|_| json!(text)),
                    )
                })
                .collect(),
            code: response["status"]["code"].as_u64(),
            message: response["status"]["message"].as_str().map(str::to_string),
        };
        observed.renamed(names)
    }

    /// From the rig's answer.
    fn from_model(response: &Response, request: &Value, names: &[(String, String)]) -> Observed {
        let observed = Observed {
            allowed: response.accepted,
            patched: response
                .mutated
                .clone()
                .filter(|object| *object != request["object"]),
            warnings: response.warnings.clone(),
            audit: response.audit.clone(),
            code: response.code,
            message: response.message.clone(),
        };
        observed.renamed(names)
    }

    /// The times the policy measured, which the answers carry (its audit summary's
    /// `evaluationMilliseconds` and `lookupMilliseconds`): compared as times, not as answers.
    fn measured(&self) -> Vec<(String, u64)> {
        let summary = self.audit.get("summary").and_then(Value::as_object);
        ["evaluationMilliseconds", "lookupMilliseconds"]
            .iter()
            .filter_map(|key| Some((key.to_string(), summary?.get(*key)?.as_u64()?)))
            .collect()
    }

    /// Without the times the policy measured ([`Observed::measured`]).
    fn answer(&self) -> Observed {
        let mut answer = self.clone();
        if let Some(summary) = answer
            .audit
            .get_mut("summary")
            .and_then(Value::as_object_mut)
        {
            for key in ["evaluationMilliseconds", "lookupMilliseconds"] {
                if summary.contains_key(key) {
                    summary.insert(key.to_string(), json!("measured"));
                }
            }
        }
        answer
    }

    fn renamed(self, names: &[(String, String)]) -> Observed {
        let rename_text = |text: &str| match renamed(&json!(text), names) {
            Value::String(text) => text,
            _ => text.to_string(),
        };
        Observed {
            allowed: self.allowed,
            patched: self.patched.map(|p| renamed(&p, names)),
            warnings: self.warnings.iter().map(|w| rename_text(w)).collect(),
            audit: match renamed(&Value::Object(self.audit), names) {
                Value::Object(map) => map,
                _ => serde_json::Map::new(),
            },
            code: self.code,
            message: self.message.as_deref().map(rename_text),
        }
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

/// A Pod of `images` in `namespace`.
fn pod_in(namespace: &str, images: &[&str]) -> Value {
    let containers: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
        .collect();
    let mut request = pod_request("CREATE", json!({ "containers": containers }));
    request["namespace"] = json!(namespace);
    request["object"]["metadata"]["namespace"] = json!(namespace);
    request
}

fn pod(images: &[&str]) -> Value {
    pod_in("default", images)
}

/// One scenario's upstream: where a registry answers, as each side reaches it.
struct Upstream {
    /// `127.0.0.1:PORT` of the registry over plain HTTP (or of a port nothing listens on, or
    /// of another server): what the model asks, and the host too over [`Transport::PlainHttp`].
    address: String,
    /// The same registry over HTTPS, which the host asks over [`Transport::Https`].
    tls: Option<TlsTwin>,
    /// Where the host asks over HTTPS: the twin's address, or a server that never answers,
    /// whatever the protocol.
    tls_host: Option<String>,
    /// Its name in the compared answers.
    placeholder: String,
    /// Reached without a proxy: a port nothing listens on refuses the connection itself,
    /// where a proxy would accept it and then close it.
    direct: bool,
}

impl Upstream {
    fn plain(address: &str, placeholder: &str) -> Upstream {
        Upstream {
            address: address.to_string(),
            tls: None,
            tls_host: None,
            placeholder: placeholder.to_string(),
            direct: false,
        }
    }

    /// A port nothing listens on, asked without a proxy.
    fn refusing(placeholder: &str) -> Upstream {
        Upstream {
            direct: true,
            ..Upstream::plain(
                &format!("127.0.0.1:{}", rig::tools::free_port()),
                placeholder,
            )
        }
    }

    /// `registry`, over HTTPS too with `certificate`.
    fn registry(
        registry: &TestRegistry,
        placeholder: &str,
        certificate: &ServingCertificate,
    ) -> Upstream {
        let twin = registry
            .tls_twin(&certificate.cert_pem, &certificate.key_pem)
            .expect("TLS registry");
        Upstream {
            address: registry.host.clone(),
            tls_host: Some(twin.host.clone()),
            tls: Some(twin),
            placeholder: placeholder.to_string(),
            direct: false,
        }
    }

    /// A registry that hangs, asked over HTTPS by the host (it never gets as far as a TLS
    /// handshake) and over HTTP by the model, without a proxy.
    fn hanging(registry: &HangingRegistry, placeholder: &str) -> Upstream {
        Upstream {
            tls_host: Some(registry.host.clone()),
            direct: true,
            ..Upstream::plain(&registry.host, placeholder)
        }
    }
}

/// How one side reaches one upstream.
struct Route {
    /// The host name the side's settings and Pods use for the upstream.
    host: String,
    proxy: Option<LatencyProxy>,
    /// The host reaches it over HTTPS: what reached the registry is in its TLS twin's log.
    over_tls: bool,
}

/// The real policy-server and the rig's model of it, each with its own routes to the same
/// upstreams.
struct Sides<'a> {
    upstreams: &'a [Upstream],
    real: RealServer,
    real_routes: Vec<Route>,
    model: ModelServer<LiveHost>,
    model_routes: Vec<Route>,
    /// The settings with the placeholders.
    settings: Value,
}

/// What one admission gave on one side.
struct Admission {
    observed: Observed,
    took: Duration,
}

impl<'a> Sides<'a> {
    /// Starts both hosts with `settings`, where each upstream's placeholder stands for its
    /// address; `round_trip` away.
    fn start(
        tools: &RealTools,
        upstreams: &'a [Upstream],
        round_trip: Duration,
        settings: &Value,
        options: Options,
    ) -> Sides<'a> {
        let process = HostProcess::fresh();
        let mut real_routes = Vec::new();
        let mut model_routes = Vec::new();
        let mut sources = json!({"insecure_sources": [], "source_authorities": {}});
        for upstream in upstreams {
            let (address, transport) = match (&upstream.tls_host, options.transport) {
                (Some(tls_host), Transport::Https) => (tls_host.as_str(), Transport::Https),
                _ => (upstream.address.as_str(), Transport::PlainHttp),
            };
            let (real, model) = if upstream.direct {
                (
                    (address.to_string(), None),
                    (upstream.address.clone(), None),
                )
            } else {
                let real = LatencyProxy::network(address, round_trip).expect("proxy");
                let model = LatencyProxy::start_in(
                    &upstream.address,
                    round_trip,
                    HostModel::V1_35,
                    transport,
                    &process,
                )
                .expect("proxy");
                (
                    (real.host.clone(), Some(real)),
                    (model.host.clone(), Some(model)),
                )
            };
            match (transport, &options.certificate) {
                (Transport::Https, Some(certificate)) => {
                    sources["source_authorities"][&real.0] =
                        json!([{"type": "Data", "data": certificate.cert_pem}]);
                }
                _ => {
                    sources["insecure_sources"]
                        .as_array_mut()
                        .expect("a list")
                        .push(json!(real.0));
                }
            }
            real_routes.push(Route {
                host: real.0,
                proxy: real.1,
                over_tls: transport == Transport::Https,
            });
            model_routes.push(Route {
                host: model.0,
                proxy: model.1,
                over_tls: false,
            });
        }
        let sources = serde_yaml::to_string(&sources).expect("sources.yaml");
        let sides = |routes: &[Route]| -> Vec<(String, String)> {
            upstreams
                .iter()
                .zip(routes)
                .map(|(u, r)| (u.placeholder.clone(), r.host.clone()))
                .collect()
        };
        let real_settings = renamed(settings, &sides(&real_routes));
        let context_aware: Vec<(&str, &str)> = options
            .context_aware
            .iter()
            .map(|(a, k)| (a.as_str(), k.as_str()))
            .collect();
        let real = RealServer::start(
            tools,
            &policies_yml(tools, &real_settings, &context_aware),
            PolicyServerOptions {
                kubeconfig: options.kubeconfig.as_deref(),
                sources: Some(&sources),
                workers: Some(options.workers),
                policy_timeout: Some(HostModel::V1_35.policy_timeout()),
                env: Vec::new(),
            },
        );
        let model = ModelServer::for_model(
            LiveHost {
                cluster: options.cluster,
                error_shape: HostModel::V1_35.error_shape(),
                ..LiveHost::default()
            },
            HostModel::V1_35,
        );
        Sides {
            upstreams,
            real,
            real_routes,
            model,
            model_routes,
            settings: settings.clone(),
        }
    }

    /// `(placeholder, host)` of each upstream on the side of `routes`.
    fn names(&self, routes: &[Route]) -> Vec<(String, String)> {
        self.upstreams
            .iter()
            .zip(routes)
            .map(|(u, r)| (u.placeholder.clone(), r.host.clone()))
            .collect()
    }

    /// `(host, placeholder)`: to read a side's answer.
    fn back(&self, routes: &[Route]) -> Vec<(String, String)> {
        self.names(routes)
            .into_iter()
            .map(|(placeholder, host)| (host, placeholder))
            .collect()
    }

    fn admit_real(&self, request: &Value) -> Admission {
        let request = renamed(request, &self.names(&self.real_routes));
        let (review, took) = self
            .real
            .post(&format!("validate/{ID}"), &RealServer::review(&request));
        Admission {
            observed: Observed::from_review(&review, &request, &self.back(&self.real_routes)),
            took,
        }
    }

    fn admit_model(&self, request: &Value) -> Admission {
        let request = renamed(request, &self.names(&self.model_routes));
        let settings = renamed(&self.settings, &self.names(&self.model_routes));
        rig::policy();
        let started = Instant::now();
        let response = rig::validate(&settings, &request, self.model.evaluation());
        let took = started.elapsed();
        Admission {
            observed: Observed::from_model(&response, &request, &self.back(&self.model_routes)),
            took,
        }
    }

    /// The HTTP requests each side's registries answered so far, `PLACEHOLDER METHOD PATH`, in
    /// order per registry: `(host, model)`. The host's attempts at HTTPS on a plain registry
    /// (TLS records a plain registry cannot read) are left out: see [`Sides::https_attempts`].
    fn seen(&self) -> (Vec<String>, Vec<String>) {
        let seen = |routes: &[Route]| -> Vec<String> {
            self.upstreams
                .iter()
                .zip(routes)
                .flat_map(|(upstream, route)| {
                    let lines = match (&upstream.tls, &route.proxy) {
                        (Some(twin), _) if route.over_tls => twin.requests(),
                        (_, Some(proxy)) => proxy
                            .seen()
                            .into_iter()
                            .filter(|line| line != "TLS" && line != "?")
                            .collect(),
                        _ => Vec::new(),
                    };
                    lines
                        .into_iter()
                        .map(|line| format!("{} {line}", upstream.placeholder))
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        (seen(&self.real_routes), seen(&self.model_routes))
    }

    /// How many TLS handshakes the host began on plain registries (its HTTPS attempts before
    /// plain HTTP, for `insecure_sources`).
    fn https_attempts(&self) -> Vec<(String, usize)> {
        self.upstreams
            .iter()
            .zip(&self.real_routes)
            .filter(|(_, route)| !route.over_tls)
            .filter_map(|(upstream, route)| Some((upstream, route.proxy.as_ref()?)))
            .map(|(upstream, proxy)| {
                let handshakes = proxy.seen().iter().filter(|line| *line == "TLS").count();
                (upstream.placeholder.clone(), handshakes)
            })
            .collect()
    }
}

/// How a scenario starts its hosts beyond the registries.
struct Options {
    /// How the host reaches the registries that have a TLS twin: over HTTPS with the
    /// certificate's CA in `source_authorities`, or over plain HTTP listed in
    /// `insecure_sources` (the sources.yaml the controller writes from a PolicyServer's
    /// `sourceAuthorities` and `insecureSources`). Every other upstream is insecure.
    transport: Transport,
    certificate: Option<ServingCertificate>,
    workers: usize,
    context_aware: Vec<(String, String)>,
    kubeconfig: Option<std::path::PathBuf>,
    cluster: Option<Cluster>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            transport: Transport::PlainHttp,
            certificate: None,
            workers: 2,
            context_aware: Vec::new(),
            kubeconfig: None,
            cluster: None,
        }
    }
}

/// Admits `request` on both sides (the host first), prints both, and asserts that the answers
/// are the same and the times within [`within_tolerance`]; gives both.
fn same_answer_in_time(sides: &Sides<'_>, what: &str, request: &Value) -> (Admission, Admission) {
    same_answer_within(sides, what, request, within_tolerance)
}

/// The same for the first admission of a process that makes a lookup or a verification
/// ([`within_cold_tolerance`]).
fn same_first_answer(sides: &Sides<'_>, what: &str, request: &Value) -> (Admission, Admission) {
    same_answer_within(sides, what, request, within_cold_tolerance)
}

fn same_answer_within(
    sides: &Sides<'_>,
    what: &str,
    request: &Value,
    tolerance: fn(Duration, Duration) -> bool,
) -> (Admission, Admission) {
    let host = sides.admit_real(request);
    let model = sides.admit_model(request);
    println!(
        "{what}: host {} ms, model {} ms; the policy measured {:?} under the host, {:?} under the model",
        host.took.as_millis(),
        model.took.as_millis(),
        host.observed.measured(),
        model.observed.measured(),
    );
    assert_eq!(
        model.observed.answer(),
        host.observed.answer(),
        "{what}: the answers"
    );
    // The time the policy observes is what it measures itself (its audit summary); the
    // POST's time beside it also holds curl's start, the TLS handshake with policy-server and
    // policy-server's own work, which the model does not stand for.
    let (host_ms, model_ms) = match (
        host.observed.measured().first(),
        model.observed.measured().first(),
    ) {
        (Some((_, host)), Some((_, model))) => (*host, *model),
        _ => (host.took.as_millis() as u64, model.took.as_millis() as u64),
    };
    assert!(
        tolerance(
            Duration::from_millis(model_ms),
            Duration::from_millis(host_ms)
        ),
        "{what}: {model_ms} ms under the model, {host_ms} ms under the host"
    );
    (host, model)
}

fn mirror_with_apps(name: &str, n: usize) -> TestRegistry {
    let registry = TestRegistry::start(name).expect("registry");
    rig::images::push_apps(&registry, "hub", n);
    registry
}

/// The same certificate twice (a [`ServingCertificate`] is not `Clone`).
fn copy(certificate: &ServingCertificate) -> ServingCertificate {
    ServingCertificate {
        cert_pem: certificate.cert_pem.clone(),
        key_pem: certificate.key_pem.clone(),
    }
}

/// Asserts that both sides' registries saw the same requests in the same order.
fn same_requests(sides: &Sides<'_>, what: &str) {
    let (host, model) = sides.seen();
    println!("{what}: the registries saw {host:#?}");
    assert_eq!(
        model, host,
        "{what}: the requests that reached the registries"
    );
}

/// Asserts that both sides' registries saw the same requests in the same order, but for the
/// host's pings (`GET /v2/`) and a request the host repeats at once: in a verification the host
/// pings before each request and asks the signature manifest twice, where the model asks each
/// once and its time stands for the rest (`LiveHost::verify`).
fn same_verification_requests(sides: &Sides<'_>, what: &str) {
    let essential = |lines: Vec<String>| -> Vec<String> {
        let mut kept: Vec<String> = lines
            .into_iter()
            .filter(|line| !line.ends_with(" GET /v2/"))
            .collect();
        kept.dedup();
        kept
    };
    let (host, model) = sides.seen();
    println!("{what}: the registries saw {host:#?}");
    assert_eq!(
        essential(model),
        essential(host),
        "{what}: the requests that reached the registries, pings aside"
    );
}

/// One lookup that finds the image, over HTTPS 30 ms away: the first of a fresh process and
/// a later one. The host's first lookup costs more than its later ones; the model adds
/// [`HostModel::cold_start`] to it.
#[test]
fn one_lookup_that_finds_the_image_over_https() {
    let Some(tools) = RealTools::find("one_lookup_that_finds_the_image_over_https") else {
        return;
    };
    let _serial = one_at_a_time();
    let mirror = mirror_with_apps("mvh-one", 3);
    let certificate = ServingCertificate::loopback();
    let upstreams = [Upstream::registry(&mirror, "MIRROR", &certificate)];
    let sides = Sides::start(
        &tools,
        &upstreams,
        Duration::from_millis(30),
        &json!({"mirrors": [{"source": "docker.io", "target": "MIRROR/hub"}]}),
        Options {
            transport: Transport::Https,
            certificate: Some(copy(&certificate)),
            ..Options::default()
        },
    );
    let request = pod(&["app0:1"]);
    let (first, model) = (sides.admit_real(&request), sides.admit_model(&request));
    let (host_ms, model_ms) = (evaluation_ms(&first), evaluation_ms(&model));
    println!("the first lookup: host {host_ms} ms, model {model_ms} ms");
    assert_eq!(
        model.observed.answer(),
        first.observed.answer(),
        "the first lookup"
    );
    assert!(
        within_cold_tolerance(
            Duration::from_millis(model_ms),
            Duration::from_millis(host_ms)
        ),
        "the first lookup: {model_ms} ms under the model, {host_ms} ms under the host"
    );
    assert!(
        first.observed.patched.is_some(),
        "swapped: {:?}",
        first.observed
    );
    for i in 1..3 {
        same_answer_in_time(
            &sides,
            &format!("lookup {}", i + 1),
            &pod(&[&format!("app{i}:1")]),
        );
    }
    same_requests(&sides, "three lookups");
}

/// A lookup that fails each way, each registry plain HTTP in `insecure_sources` (where the
/// host's words name `http://` as the model's do), 30 ms away: the image absent, the connection
/// refused (no proxy: nothing listens), the registry answering 500, and one that wants
/// credentials nobody gave. The answers carry the host's error texts in their warnings.
#[test]
fn a_lookup_that_fails_each_way() {
    let Some(tools) = RealTools::find("a_lookup_that_fails_each_way") else {
        return;
    };
    let _serial = one_at_a_time();
    let mirror = mirror_with_apps("mvh-fail", 1);
    let locked = TestRegistry::start_with_basic_auth("mvh-locked", "rig", "secret")
        .expect("registry with basic auth");
    // A relay that answers 500 to every request, and closes a TLS handshake at once as a
    // registry's HTTP server does. (A server that reads a ClientHello and never answers, as
    // tiny_http alone does, holds the host's HTTPS attempt for ever: its client has no
    // timeout. The model's plain-HTTP transport does not model that.)
    let (failing, stop) = rig::front::relay("registry answering 500", &mirror.host, |_, _| {
        Some((
            500,
            r#"{"errors":[{"code":"UNKNOWN","message":"internal failure"}]}"#.to_string(),
        ))
    })
    .expect("failing registry");
    let upstreams = [
        Upstream::plain(&mirror.host, "MIRROR"),
        Upstream::refusing("REFUSING"),
        Upstream::plain(&failing, "FAILING"),
        Upstream::plain(&locked.host, "LOCKED"),
    ];
    let settings = json!({"mirrors": [
        {"source": "absent.example", "target": "MIRROR/hub"},
        {"source": "refused.example", "target": "REFUSING/hub"},
        {"source": "failing.example", "target": "FAILING/hub"},
        {"source": "locked.example", "target": "LOCKED/hub"},
    ]});
    let sides = Sides::start(
        &tools,
        &upstreams,
        Duration::from_millis(30),
        &settings,
        Options::default(),
    );
    // A first lookup warms both processes (the first lookup's own cost is the HTTPS test's).
    sides.admit_real(&pod(&["absent.example/library/app0:1"]));
    sides.admit_model(&pod(&["absent.example/library/app0:1"]));
    for (what, image) in [
        ("absent", "absent.example/library/nothing:1"),
        ("refused", "refused.example/library/app0:1"),
        ("answering 500", "failing.example/library/app0:1"),
        ("unauthorized", "locked.example/library/app0:1"),
    ] {
        let (host, _) = same_answer_in_time(&sides, what, &pod(&[image]));
        let stored = host.observed.patched.as_ref().map(|pod| &pod["spec"]);
        assert!(
            host.observed.allowed
                && stored.is_none_or(|spec| spec["containers"][0]["image"] == json!(image)),
            "{what}: kept: {:?}",
            host.observed
        );
        assert!(
            !host.observed.warnings.is_empty(),
            "{what}: a warning: {:?}",
            host.observed
        );
    }
    same_requests(&sides, "the failing lookups");
    println!(
        "the host began TLS handshakes on the plain registries: {:?}",
        sides.https_attempts()
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The mirror of the verification and concurrency tests: `hub/library/app{i}:1`, and a copy of
/// `src.example/org/app:signed` under `cache/org/app`, signed there as `cosign sign --key`
/// signs.
fn signing_mirror(name: &str, signer: &rig::cosign::Signer) -> TestRegistry {
    let mirror = mirror_with_apps(name, 6);
    for n in 0..4 {
        let image = rig::images::Image::new(&format!("{name} signed {n}"), "linux/amd64");
        let digest = image.push(&mirror, "cache/org/app", Some(&format!("signed{n}")));
        signer.sign(&mirror, "cache/org/app", &digest, &[]);
    }
    mirror
}

fn signing_settings(signer: &rig::cosign::Signer) -> Value {
    json!({
        "mirrors": [
            {"source": "docker.io", "target": "MIRROR/hub"},
            {"source": "src.example", "target": "MIRROR/cache"},
        ],
        "signatures": [{"image": "src.example/org/*", "pubKeys": [signer.public_pem]}],
        // Verification at the mirror, which these scenarios compare: `src.example` names no
        // registry (unset, a covered image would be verified at its source first).
        "verifySource": false,
    })
}

/// Both sides' answers to `requests` sent at once: `(host, model)`, in the order given.
fn at_once(sides: &Sides<'_>, requests: &[Value]) -> (Vec<Admission>, Vec<Admission>) {
    let host = thread::scope(|scope| {
        let running: Vec<_> = requests
            .iter()
            .map(|request| scope.spawn(|| sides.admit_real(request)))
            .collect();
        running
            .into_iter()
            .map(|t| t.join().expect("admission"))
            .collect()
    });
    let model = thread::scope(|scope| {
        let running: Vec<_> = requests
            .iter()
            .map(|request| scope.spawn(|| sides.admit_model(request)))
            .collect();
        running
            .into_iter()
            .map(|t| t.join().expect("admission"))
            .collect()
    });
    (host, model)
}

/// The evaluation time the policy measured, else the POST's or the call's.
fn evaluation_ms(admission: &Admission) -> u64 {
    admission
        .observed
        .measured()
        .first()
        .map_or(admission.took.as_millis() as u64, |(_, ms)| *ms)
}

/// Admissions at once, compared: each one's answer, and their times from the fastest to the
/// slowest (which of two goes first is the scheduler's choice, on either side). Gives the
/// times, `(host, model)`, in the order of `requests`.
fn same_at_once(sides: &Sides<'_>, what: &str, requests: &[Value]) -> (Vec<u64>, Vec<u64>) {
    let (host, model) = at_once(sides, requests);
    let mut times = (Vec::new(), Vec::new());
    for (n, (host, model)) in host.iter().zip(&model).enumerate() {
        let (host_ms, model_ms) = (evaluation_ms(host), evaluation_ms(model));
        println!("{what}, admission {n}: host {host_ms} ms, model {model_ms} ms");
        assert_eq!(
            model.observed.answer(),
            host.observed.answer(),
            "{what}, admission {n}: the answers"
        );
        times.0.push(host_ms);
        times.1.push(model_ms);
    }
    let (mut host_sorted, mut model_sorted) = times.clone();
    host_sorted.sort_unstable();
    model_sorted.sort_unstable();
    for (host_ms, model_ms) in host_sorted.iter().zip(&model_sorted) {
        assert!(
            within_tolerance(
                Duration::from_millis(*model_ms),
                Duration::from_millis(*host_ms)
            ),
            "{what}: {model_sorted:?} ms under the model, {host_sorted:?} ms under the host"
        );
    }
    times
}

/// A verification (`oci/v2/verify`, a key-signed image, as cosign signs), then two admissions
/// at once whose lookups are of one operation (the host's lock on it makes the second wait for
/// the first's lookup), then a verification and a lookup at once (two operations: neither
/// waits), over HTTPS 30 ms away. (At 50 ms the model's lookup, six round trips and 40 ms, is
/// 50-120 ms slower than the host's through `LatencyProxy::network`, 4.5-5 round trips and
/// 40 ms; two lookups in a row double that past the tolerance. KUBEWARDEN.md's measurement of
/// the real 1.35 through a proxy that delays every client chunk found six: which emulation a
/// real network is closer to is not settled here, so the model keeps its six.)
#[test]
fn a_verification_and_two_admissions_at_once() {
    let Some(tools) = RealTools::find("a_verification_and_two_admissions_at_once") else {
        return;
    };
    let _serial = one_at_a_time();
    let signer = rig::cosign::Signer::generate();
    let mirror = signing_mirror("mvh-sig", &signer);
    let certificate = ServingCertificate::loopback();
    let upstreams = [Upstream::registry(&mirror, "MIRROR", &certificate)];
    let sides = Sides::start(
        &tools,
        &upstreams,
        Duration::from_millis(30),
        &signing_settings(&signer),
        Options {
            transport: Transport::Https,
            certificate: Some(copy(&certificate)),
            ..Options::default()
        },
    );
    // The first lookup of each process, whose own cost the HTTPS test compares.
    sides.admit_real(&pod(&["app0:1"]));
    sides.admit_model(&pod(&["app0:1"]));
    // The first verification of each process costs the host more (its cosign client's first
    // use): compared with the first lookup's slack.
    let request = pod(&["src.example/org/app:signed1"]);
    let (first, model) = (sides.admit_real(&request), sides.admit_model(&request));
    let (host_ms, model_ms) = (evaluation_ms(&first), evaluation_ms(&model));
    println!("the first verification: host {host_ms} ms, model {model_ms} ms");
    assert_eq!(
        model.observed.answer(),
        first.observed.answer(),
        "the first verification"
    );
    assert!(
        within_cold_tolerance(
            Duration::from_millis(model_ms),
            Duration::from_millis(host_ms)
        ),
        "the first verification: {model_ms} ms under the model, {host_ms} ms under the host"
    );
    let (host, _) = same_answer_in_time(
        &sides,
        "a verification",
        &pod(&["src.example/org/app:signed3"]),
    );
    let swapped = host.observed.patched.as_ref().map(|pod| {
        pod["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    });
    assert!(
        swapped.is_some_and(|image| image.starts_with("MIRROR/cache/org/app:signed3@sha256:")),
        "verified and swapped: {:?}",
        host.observed
    );
    same_verification_requests(&sides, "a lookup and two verifications");
    // One operation: the host's lock on it makes one lookup wait for the other.
    let (host, _) = same_at_once(
        &sides,
        "two lookups at once",
        &[pod(&["app1:1"]), pod(&["app2:1"])],
    );
    let (fast, slow) = (host[0].min(host[1]), host[0].max(host[1]));
    assert!(
        slow > fast + fast / 2,
        "the host made one lookup wait for the other: {host:?} ms"
    );
    // Two operations: the lookup waits for no verification.
    let (host, _) = same_at_once(
        &sides,
        "a verification and a lookup at once",
        &[pod(&["src.example/org/app:signed0"]), pod(&["app3:1"])],
    );
    assert!(
        host[1] < host[0],
        "the host's lookup did not wait for the verification: {host:?} ms"
    );
}

/// A registry that hangs for 3 s per connection: no host call can be interrupted, so the
/// evaluation lasts as long as the lookups hang, and policy-server then answers for the
/// interrupted evaluation (refused, code 500, its text), whatever the policy would have said.
#[test]
fn a_hang_and_the_evaluation_timeout() {
    let Some(tools) = RealTools::find("a_hang_and_the_evaluation_timeout") else {
        return;
    };
    let _serial = one_at_a_time();
    let hanging = HangingRegistry::start(Duration::from_secs(3)).expect("hanging registry");
    let certificate = ServingCertificate::loopback();
    let upstreams = [Upstream::hanging(&hanging, "HANGING")];
    let sides = Sides::start(
        &tools,
        &upstreams,
        Duration::ZERO,
        &json!({"mirrors": [{"source": "docker.io", "target": "HANGING/hub"}]}),
        Options {
            transport: Transport::Https,
            certificate: Some(copy(&certificate)),
            ..Options::default()
        },
    );
    let (host, model) = same_answer_in_time(&sides, "a hang", &pod(&["app0:1"]));
    assert_eq!(host.observed.code, Some(500), "{:?}", host.observed);
    assert_eq!(
        host.observed.message.as_deref(),
        Some(rig::wapc::INTERRUPTED),
        "{:?}",
        host.observed
    );
    assert!(host.took >= Duration::from_secs(3), "{:?}", host.took);
    let _ = model;
}

/// The kinds `verifiers` lists (metadata.yml's `contextAwareResources`).
const POLICY_KINDS: [(&str, &str); 4] = [
    ("ClusterAdmissionPolicy", "clusteradmissionpolicies"),
    (
        "ClusterAdmissionPolicyGroup",
        "clusteradmissionpolicygroups",
    ),
    ("AdmissionPolicy", "admissionpolicies"),
    ("AdmissionPolicyGroup", "admissionpolicygroups"),
];

const POLICIES_API: &str = "policies.kubewarden.io/v1";

/// What the PolicyServer's ServiceAccount may do with the four kinds.
#[derive(Clone, Copy, Debug)]
struct Rbac {
    name: &'static str,
    verbs: &'static [&'static str],
    access: Access,
}

const NO_RBAC: Rbac = Rbac {
    name: "ps-none",
    verbs: &[],
    access: Access::Nothing,
};
const GET_LIST: Rbac = Rbac {
    name: "ps-list",
    verbs: &["get", "list"],
    access: Access::ListOnly,
};
const GET_LIST_WATCH: Rbac = Rbac {
    name: "ps-watch",
    verbs: &["get", "list", "watch"],
    access: Access::Watch,
};

/// A loopback API server with Kubewarden's 1.35 CRDs, namespaces `team` and `kubewarden`, and
/// in `kubewarden` one ServiceAccount per [`Rbac`] bound to a ClusterRole with its verbs.
fn kubewarden_cluster(tools: &RealTools) -> ControlPlane {
    let plane = ControlPlane::start(tools, false);
    let crds = rig::root().join("scripts/kubewarden-crds");
    plane.kubectl_ok(&["apply", "-f", &crds.display().to_string()], None);
    plane.kubectl_ok(
        &[
            "wait",
            "--for",
            "condition=established",
            "--timeout=60s",
            "crd",
            "--all",
        ],
        None,
    );
    for namespace in ["team", "kubewarden"] {
        plane.kubectl_ok(&["create", "namespace", namespace], None);
    }
    let resources: Vec<&str> = POLICY_KINDS.iter().map(|(_, plural)| *plural).collect();
    for rbac in [NO_RBAC, GET_LIST, GET_LIST_WATCH] {
        let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": rbac.name, "namespace": "kubewarden"}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": rbac.name},
             "rules": if rbac.verbs.is_empty() { json!([]) } else {
                 json!([{"apiGroups": ["policies.kubewarden.io"], "resources": resources, "verbs": rbac.verbs}])
             }},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": rbac.name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": rbac.name},
             "subjects": [{"kind": "ServiceAccount", "name": rbac.name, "namespace": "kubewarden"}]},
        ]});
        plane.kubectl_ok(&["apply", "-f", "-"], Some(&objects.to_string()));
    }
    plane
}

/// A kubeconfig that is the ServiceAccount of `rbac`: its token from `kubectl create token`.
fn service_account_kubeconfig(plane: &ControlPlane, rbac: Rbac) -> std::path::PathBuf {
    let token = plane.kubectl_ok(
        &[
            "create",
            "token",
            rbac.name,
            "-n",
            "kubewarden",
            "--duration=2h",
        ],
        None,
    );
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "loopback", "cluster": {
            "server": format!("https://127.0.0.1:{}", plane.port),
            "certificate-authority": plane.ca_file().display().to_string()}}],
        "users": [{"name": rbac.name, "user": {"token": token.trim()}}],
        "contexts": [{"name": "ps", "context": {"cluster": "loopback", "user": rbac.name}}],
        "current-context": "ps",
    });
    let path = plane.data_dir().join(format!("{}.kubeconfig", rbac.name));
    std::fs::write(
        &path,
        serde_yaml::to_string(&kubeconfig).expect("kubeconfig"),
    )
    .expect("write kubeconfig");
    path
}

/// verify-image-signatures as namespace `team`'s AdmissionPolicy `name`, a rule with
/// `signer`'s key on each of `images`. (Two verifiers covering one image would make the answer
/// depend on the order of the list, which the host's reflector store does not keep: the
/// policy stops at the first that fails, and records the digest of one that passed before.)
fn team_verifier(name: &str, signer: &rig::cosign::Signer, images: &[&str]) -> Value {
    let rules: Vec<Value> = images
        .iter()
        .map(|image| json!({"image": image, "pubKeys": [signer.public_pem]}))
        .collect();
    json!({
        "apiVersion": POLICIES_API, "kind": "AdmissionPolicy",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {
            "module": "registry://ghcr.io/kubewarden/policies/verify-image-signatures:v1.0.11",
            "mutating": false,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}],
            "settings": {"signatures": rules},
        },
    })
}

/// Creates `object` and gives it as the API server stored it.
fn create(plane: &ControlPlane, object: &Value) -> Value {
    plane.kubectl_ok(&["create", "-f", "-"], Some(&object.to_string()));
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    plane.get_json(&["admissionpolicies", "-n", "team", name])
}

/// Every object of the four kinds, as the API server stores them.
fn policies_in(plane: &ControlPlane) -> Vec<Value> {
    POLICY_KINDS
        .iter()
        .flat_map(|(_, plural)| {
            plane.get_json(&[plural, "-A"])["items"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

/// The swapper with `verifiers`. Its budget is wide enough that every lookup the policy
/// plans fits on both sides (at 800 ms, whether the digest lookup after a failed verification
/// fits depends on a few milliseconds either way).
fn verifiers_settings() -> Value {
    json!({
        "lookupBudgetMilliseconds": 1200,
        "mirrors": [
            {"source": "docker.io", "target": "MIRROR/hub"},
            {"source": "src.example", "target": "MIRROR/cache"},
        ],
        "verifiers": [{"module": "*/verify-image-signatures:*"}],
        // Verification at the mirror, as in `signing_settings`.
        "verifySource": false,
    })
}

/// One PolicyServer's RBAC, with the policy's `contextAwareResources` granting the four kinds
/// (`granted`) or none: the first admission in `team` (each list's first, which builds its
/// reflector), a second, then a verifier created in `team` whose key did not sign the next
/// Pod's image, and that admission.
fn kubernetes_lists(
    tools: &RealTools,
    plane: &ControlPlane,
    upstreams: &[Upstream],
    certificate: &ServingCertificate,
    rbac: Rbac,
    granted: bool,
) {
    let what = format!(
        "{} ({}), {}",
        rbac.name,
        rbac.verbs.join(", "),
        if granted { "granted" } else { "not granted" }
    );
    let kinds: Vec<(String, String)> = POLICY_KINDS
        .iter()
        .map(|(kind, _)| (POLICIES_API.to_string(), kind.to_string()))
        .collect();
    let mut cluster = Cluster::with_objects(policies_in(plane));
    cluster.access = rbac.access;
    cluster.granted = Some(if granted { kinds.clone() } else { Vec::new() });
    cluster.never = NEVER_HERE + Duration::from_secs(2);
    let sides = Sides::start(
        tools,
        upstreams,
        Duration::from_millis(20),
        &verifiers_settings(),
        Options {
            transport: Transport::Https,
            certificate: Some(copy(certificate)),
            context_aware: if granted { kinds } else { Vec::new() },
            kubeconfig: Some(service_account_kubeconfig(plane, rbac)),
            cluster: Some(cluster.clone()),
            ..Options::default()
        },
    );
    let first = pod_in("team", &["src.example/org/app:signed0"]);
    if rbac.access == Access::Nothing && granted {
        // The host never answers the first list; neither side answers within NEVER_HERE.
        let request = renamed(&first, &sides.names(&sides.real_routes));
        let started = Instant::now();
        let host = sides.real.try_post(
            &format!("validate/{ID}"),
            &RealServer::review(&request),
            NEVER_HERE,
        );
        println!("{what}: the host after {:?}: {host:?}", started.elapsed());
        assert!(host.is_err(), "{what}: the host answered: {host:?}");
        let request = renamed(&first, &sides.names(&sides.model_routes));
        let settings = renamed(&sides.settings, &sides.names(&sides.model_routes));
        let evaluation = sides.model.evaluation();
        let started = Instant::now();
        let model = thread::spawn(move || rig::validate(&settings, &request, evaluation));
        thread::sleep(NEVER_HERE);
        assert!(
            !model.is_finished(),
            "{what}: the model answered within {NEVER_HERE:?}"
        );
        let _ = model.join();
        assert!(
            started.elapsed() >= cluster.never,
            "{what}: the model's hold"
        );
        return;
    }
    let (host, _) = same_first_answer(&sides, &format!("{what}: the first lists"), &first);
    println!("{what}: first {:?}", host.observed);
    same_answer_in_time(
        &sides,
        &format!("{what}: the lists again"),
        &pod_in("team", &["src.example/org/app:signed1"]),
    );
    let other = rig::cosign::Signer::generate();
    let created = create(
        plane,
        &team_verifier(
            &format!("{}-later", rbac.name),
            &other,
            &["src.example/org/app:signed2"],
        ),
    );
    cluster.add(created);
    // The watch's event comes within milliseconds on loopback.
    thread::sleep(Duration::from_secs(2));
    let (host, _) = same_answer_in_time(
        &sides,
        &format!("{what}: after a verifier was created"),
        &pod_in("team", &["src.example/org/app:signed2"]),
    );
    println!("{what}: later {:?}", host.observed);
    plane.kubectl_ok(
        &[
            "delete",
            "admissionpolicy",
            "-n",
            "team",
            &format!("{}-later", rbac.name),
        ],
        None,
    );
}

/// How long a test waits for an answer the host never gives.
const NEVER_HERE: Duration = Duration::from_secs(6);

/// The Kubernetes list with and without the grant: the policy's `contextAwareResources` (all
/// four kinds, or none) and the PolicyServer's RBAC on them (none; `get` and `list`; `get`,
/// `list` and `watch`), policy-server 1.35 reading a real API server as that ServiceAccount.
#[test]
fn the_kubernetes_list_with_and_without_the_grant() {
    let Some(tools) = RealTools::find("the_kubernetes_list_with_and_without_the_grant") else {
        return;
    };
    let _serial = one_at_a_time();
    let signer = rig::cosign::Signer::generate();
    let mirror = signing_mirror("mvh-k8s", &signer);
    let certificate = ServingCertificate::loopback();
    let upstreams = [Upstream::registry(&mirror, "MIRROR", &certificate)];
    let plane = kubewarden_cluster(&tools);
    create(
        &plane,
        &team_verifier(
            "verify-image-signatures",
            &signer,
            &["src.example/org/app:signed0", "src.example/org/app:signed1"],
        ),
    );
    for (rbac, granted) in [
        (GET_LIST_WATCH, true),
        (GET_LIST, true),
        (NO_RBAC, true),
        (GET_LIST_WATCH, false),
    ] {
        kubernetes_lists(&tools, &plane, &upstreams, &certificate, rbac, granted);
    }
}

/// `policyServerServiceAccount` under policy-server 1.35 reading a real API server as a
/// ServiceAccount with `get` and `list` on the four kinds (and `create` on
/// subjectaccessreviews, to ask): the policy's `can_i` is refused `watch`, so the verifiers
/// are unreadable, in the host's and the model's (grants table) words alike. `watch` granted
/// then, a question asked again within 5 s is answered from the host's cache (still refused);
/// asked after 5 s, it is allowed and the verifiers are read.
#[test]
fn can_i_and_its_5_s_cache() {
    let Some(tools) = RealTools::find("can_i_and_its_5_s_cache") else {
        return;
    };
    let _serial = one_at_a_time();
    let signer = rig::cosign::Signer::generate();
    let mirror = signing_mirror("mvh-can-i", &signer);
    let certificate = ServingCertificate::loopback();
    let upstreams = [Upstream::registry(&mirror, "MIRROR", &certificate)];
    let plane = kubewarden_cluster(&tools);
    create(
        &plane,
        &team_verifier(
            "verify-image-signatures",
            &signer,
            &["src.example/org/app:signed0", "src.example/org/app:signed1"],
        ),
    );
    let asker = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "ask-access"},
         "rules": [{"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "ask-access"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ask-access"},
         "subjects": [{"kind": "ServiceAccount", "name": GET_LIST.name, "namespace": "kubewarden"}]},
    ]});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&asker.to_string()));
    let kinds: Vec<(String, String)> = POLICY_KINDS
        .iter()
        .map(|(kind, _)| (POLICIES_API.to_string(), kind.to_string()))
        .collect();
    let user = format!("system:serviceaccount:kubewarden:{}", GET_LIST.name);
    let grant = |verbs: &[&str]| rig::kubernetes::Grant {
        user: user.clone(),
        binding: GET_LIST.name.to_string(),
        verbs: verbs.iter().map(|verb| verb.to_string()).collect(),
    };
    let mut cluster = Cluster::with_objects(policies_in(&plane));
    // What the lists see once asked: by then `watch` is granted.
    cluster.access = Access::Watch;
    cluster.granted = Some(kinds.clone());
    cluster.grant(grant(GET_LIST.verbs));
    let mut settings = verifiers_settings();
    settings["policyServerServiceAccount"] = json!(format!("kubewarden/{}", GET_LIST.name));
    let sides = Sides::start(
        &tools,
        &upstreams,
        Duration::from_millis(20),
        &settings,
        Options {
            transport: Transport::Https,
            certificate: Some(copy(&certificate)),
            context_aware: kinds,
            kubeconfig: Some(service_account_kubeconfig(&plane, GET_LIST)),
            cluster: Some(cluster.clone()),
            ..Options::default()
        },
    );
    let refused = |admission: &Admission| {
        admission
            .observed
            .warnings
            .iter()
            .any(|warning| warning.contains("may not watch"))
    };
    let asked = Instant::now();
    let (host, _) = same_first_answer(
        &sides,
        "without watch",
        &pod_in("team", &["src.example/org/app:signed0"]),
    );
    assert!(refused(&host), "without watch: {:?}", host.observed);

    let rules = json!([{"apiGroups": ["policies.kubewarden.io"],
        "resources": POLICY_KINDS.iter().map(|(_, plural)| *plural).collect::<Vec<_>>(),
        "verbs": GET_LIST_WATCH.verbs}]);
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": GET_LIST.name}, "rules": rules});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&role.to_string()));
    cluster.grant(grant(GET_LIST_WATCH.verbs));
    let (host, _) = same_answer_in_time(
        &sides,
        "watch granted, asked again within 5 s",
        &pod_in("team", &["src.example/org/app:signed0"]),
    );
    assert!(
        asked.elapsed() < rig::kubernetes::CAN_I_CACHE,
        "the second question came {:?} after the first: not within the cache",
        asked.elapsed()
    );
    assert!(refused(&host), "within 5 s: {:?}", host.observed);

    thread::sleep(rig::kubernetes::CAN_I_CACHE + Duration::from_secs(1));
    let (host, _) = same_first_answer(
        &sides,
        "watch granted, asked after 5 s",
        &pod_in("team", &["src.example/org/app:signed1"]),
    );
    assert!(!refused(&host), "after 5 s: {:?}", host.observed);
    println!("after 5 s: {:?}", host.observed);
}

/// Repeated verifications 50 ms away, over HTTPS and over plain HTTP (`insecure_sources`), the
/// host against the model: a signed image first (the process's first verification), then an
/// unsigned image three times (a failed verification is never cached, so each admission asks
/// again) and another signed image. Prints each admission's time as the policy measured it on
/// both sides, and the connections and requests the host's registry saw; asserts nothing on
/// time (a measurement: `cargo test --test model_vs_host repeated_verifications -- --ignored
/// --nocapture`). What it found and what the model does since is in `LiveHost::verify`: the
/// host's cosign client keeps its connection between verifications (so does the model now);
/// a new signed image costs the host ten requests and the model six.
#[test]
#[ignore = "a measurement: prints host and model times, asserts nothing on time"]
fn repeated_verifications_host_and_model() {
    let Some(tools) = RealTools::find("repeated_verifications_host_and_model") else {
        return;
    };
    let _serial = one_at_a_time();
    let signer = rig::cosign::Signer::generate();
    let mirror = signing_mirror("mvh-repeat", &signer);
    for n in 0..2 {
        let image = rig::images::Image::new(&format!("mvh-repeat unsigned {n}"), "linux/amd64");
        image.push(&mirror, "cache/org/app", Some(&format!("unsigned{n}")));
    }
    for transport in [Transport::Https, Transport::PlainHttp] {
        let certificate = ServingCertificate::loopback();
        let upstreams = [Upstream::registry(&mirror, "MIRROR", &certificate)];
        let sides = Sides::start(
            &tools,
            &upstreams,
            Duration::from_millis(50),
            &signing_settings(&signer),
            Options {
                transport,
                certificate: Some(copy(&certificate)),
                ..Options::default()
            },
        );
        let images = [
            "src.example/org/app:signed0",
            "src.example/org/app:unsigned0",
            "src.example/org/app:unsigned0",
            "src.example/org/app:unsigned0",
            "src.example/org/app:signed1",
            "src.example/org/app:unsigned1",
        ];
        for image in images {
            let before = sides.seen().0.len();
            let connections = |routes: &[Route]| -> usize {
                routes
                    .iter()
                    .filter_map(|route| route.proxy.as_ref())
                    .map(|proxy| proxy.connections.load(std::sync::atomic::Ordering::Relaxed))
                    .sum()
            };
            let (host_connections, model_connections) = (
                connections(&sides.real_routes),
                connections(&sides.model_routes),
            );
            let host = sides.admit_real(&pod(&[image]));
            let model = sides.admit_model(&pod(&[image]));
            let seen = sides.seen().0;
            println!(
                "{transport:?} 50 ms {image}: host {} ms, model {} ms (policy-measured); connections host {} model {}; host's requests {:?}; same answer: {}",
                evaluation_ms(&host),
                evaluation_ms(&model),
                connections(&sides.real_routes) - host_connections,
                connections(&sides.model_routes) - model_connections,
                &seen[before.min(seen.len())..],
                host.observed.answer() == model.observed.answer(),
            );
            if host.observed.answer() != model.observed.answer() {
                println!(
                    "    host:  {:?}\n    model: {:?}",
                    host.observed.answer(),
                    model.observed.answer()
                );
            }
        }
        println!(
            "{transport:?}: HTTPS attempts on plain registries {:?}",
            sides.https_attempts()
        );
    }
}
