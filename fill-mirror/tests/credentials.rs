//! Registry access of `fill-mirror once`, the real binary and skopeo against real registries on
//! loopback: ECR's token from the binary's own AWS identity and its repositories (ECR's API is
//! moto's server, its registry endpoint the rig's front on Debian's `docker-registry`), the
//! user's docker config merged with those logins, Artifact Registry's token from a stand-in for
//! the GKE metadata server, and Kubewarden's sources.yaml (an insecure host, a private CA).

mod rig;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use rig::ecr::{ACCOUNT, EcrRegistry, Moto};
use rig::images::Image;
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::{fill_mirror, mirror_by_hand, pod_recorded_by_hand, text, write_json};
use serde_json::{Value, json};

/// A registry's distance for the sources behind the latency proxy.
const ROUND_TRIP: Duration = Duration::from_millis(20);

/// The environment variables of registry access the binary reads, cleared so that the test's
/// own environment cannot lend it anything.
const ACCESS_ENV: [&str; 9] = [
    "REGISTRY_AUTH_FILE",
    "FILL_MIRROR_ECR_REGISTRIES",
    "FILL_MIRROR_SOURCE_NAMESPACES",
    "KUBEWARDEN_SOURCES_PATH",
    "GCE_METADATA_HOST",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_ECR",
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
];

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn printed(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

/// `fill-mirror once --pods PODS --settings SETTINGS ARGS` with `env`.
fn once(pods: &Path, settings: &Path, args: &[&str], env: &[(&str, String)]) -> Run {
    let mut command = fill_mirror();
    command
        .arg("once")
        .arg("--pods")
        .arg(pods)
        .arg("--settings")
        .arg(settings)
        .args(args)
        .args(["--log-format", "text"]);
    for name in ACCESS_ENV {
        command.env_remove(name);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    let output: Output = command.output().expect("run fill-mirror");
    Run {
        code: output.status.code(),
        stdout: text(&output.stdout),
        stderr: text(&output.stderr),
    }
}

/// The Pods file and the settings file for Pods of `images`, recorded as lacking them, under
/// `rules` (the swapping policy's `mirrors`).
fn inputs(dir: &Path, rules: Value, images: &[&str]) -> (PathBuf, PathBuf) {
    let items: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(i, image)| {
            pod_recorded_by_hand(&format!("p{i}"), image, &mirror_by_hand(&rules, image))
        })
        .collect();
    let settings = json!({ "mirrors": rules });
    let (pods, settings_file) = (dir.join("pods.json"), dir.join("settings.json"));
    write_json(
        &pods,
        &json!({"apiVersion": "v1", "kind": "List", "items": items}),
    );
    write_json(&settings_file, &settings);
    (pods, settings_file)
}

fn basic(user: &str, password: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// skopeo behind a script that keeps, at each run, its arguments (a line in `seen/args`) and
/// the auth file it was handed (its mode and its content, before the binary's private folder is
/// gone), then runs skopeo.
fn recording_skopeo(dir: &Path) -> (PathBuf, PathBuf) {
    let script = dir.join("skopeo");
    let seen = dir.join("seen");
    std::fs::create_dir_all(&seen).expect("dir");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{seen}/args'\nfor arg in \"$@\"; do\n  case $arg in --authfile=*)\n    file=${{arg#--authfile=}}\n    stat -c %a \"$file\" > '{seen}/mode'\n    cat \"$file\" > '{seen}/auth.json' ;;\n  esac\ndone\nexec skopeo \"$@\"\n",
            seen = seen.display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(
        &script,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .expect("chmod");
    (script, seen)
}

/// Without a token skopeo is refused; with `--ecr-registry` the binary's own token reaches it
/// (ECR then says the repository does not exist); with `--ecr-create-repositories` the
/// repository is made, IMMUTABLE_WITH_EXCLUSION (the signature tags excluded) with scan on
/// push, and the image copied into it.
#[test]
fn on_ecr_a_missing_repository_is_created_then_copied_with_the_binary_s_own_token() {
    let source = TestRegistry::start("cred-ecr-src").expect("source registry");
    let far = LatencyProxy::network(&source.host, ROUND_TRIP).expect("latency proxy");
    let storage = TestRegistry::start("cred-ecr-storage").expect("storage registry");
    let moto = Moto::start().expect("moto_server (scripts/ensure-python-tools.sh)");
    let ecr = EcrRegistry::start(&storage, &moto).expect("ECR front");
    let digest = Image::new("app 1 for ecr", "linux/amd64").push(&source, "team/app", Some("1"));
    let dir = tempfile::tempdir().expect("dir");
    let (pods, settings) = inputs(
        dir.path(),
        json!([{"source": far.host, "target": format!("{}/cache", ecr.host)}]),
        &[&format!("{}/team/app:1", far.host)],
    );
    let env = moto.environment();

    let anonymous = once(&pods, &settings, &["--insecure"], &env);
    assert_eq!(anonymous.code, Some(1), "{}", anonymous.printed());
    assert!(
        anonymous.stderr.contains("Not Authorized") || anonymous.stderr.contains("unauthorized"),
        "{}",
        anonymous.printed()
    );

    let logged_in = once(
        &pods,
        &settings,
        &["--insecure", "--ecr-registry", &ecr.host],
        &env,
    );
    assert_eq!(logged_in.code, Some(1), "{}", logged_in.printed());
    assert!(
        logged_in.stderr.contains(&format!(
            "The repository with name 'cache/team/app' does not exist in the registry with id '{ACCOUNT}'"
        )),
        "{}",
        logged_in.printed()
    );
    assert_eq!(moto.repository("cache/team/app"), None);

    let created = once(
        &pods,
        &settings,
        &[
            "--insecure",
            "--ecr-registry",
            &ecr.host,
            "--ecr-create-repositories",
        ],
        &env,
    );
    assert_eq!(created.code, Some(0), "{}", created.printed());
    assert!(
        created
            .stdout
            .contains("fill-mirror: 1 copied, 0 failed, 0 skipped, 0 gone, 0 refused")
            && created
                .stderr
                .contains("created ECR repository cache/team/app"),
        "{}",
        created.printed()
    );
    let repository = moto.repository("cache/team/app").expect("created");
    assert_eq!(
        repository["imageTagMutability"],
        json!("IMMUTABLE_WITH_EXCLUSION"),
        "{repository}"
    );
    assert_eq!(
        repository["imageTagMutabilityExclusionFilters"],
        json!([{"filterType": "WILDCARD", "filter": "sha256-*.sig"},
                    {"filterType": "WILDCARD", "filter": "sha256-*.att"},
                    {"filterType": "WILDCARD", "filter": "sha256-*.sbom"}]),
        "{repository}"
    );
    assert_eq!(
        repository["imageScanningConfiguration"]["scanOnPush"],
        json!(true),
        "{repository}"
    );
    assert_eq!(storage.digest_of("cache/team/app", "1"), Some(digest));
}

/// A typo'd image with `--ecr-create-repositories`: the source answers first, so the copy is
/// `gone` and no empty repository is left in ECR for it (issue #49: one made for every typo,
/// never deleted).
#[test]
fn on_ecr_no_repository_is_created_for_a_source_that_is_gone() {
    let source = TestRegistry::start("cred-ecr-gone-src").expect("source registry");
    let far = LatencyProxy::network(&source.host, ROUND_TRIP).expect("latency proxy");
    let storage = TestRegistry::start("cred-ecr-gone-storage").expect("storage registry");
    let moto = Moto::start().expect("moto_server (scripts/ensure-python-tools.sh)");
    let ecr = EcrRegistry::start(&storage, &moto).expect("ECR front");
    let dir = tempfile::tempdir().expect("dir");
    let (pods, settings) = inputs(
        dir.path(),
        json!([{"source": far.host, "target": format!("{}/cache", ecr.host)}]),
        &[&format!("{}/team/typo:1", far.host)],
    );

    let run = once(
        &pods,
        &settings,
        &[
            "--insecure",
            "--ecr-registry",
            &ecr.host,
            "--ecr-create-repositories",
        ],
        &moto.environment(),
    );

    assert_eq!(run.code, Some(0), "{}", run.printed());
    assert!(
        run.stdout
            .contains("fill-mirror: 0 copied, 0 failed, 0 skipped, 1 gone, 0 refused"),
        "{}",
        run.printed()
    );
    assert_eq!(moto.repository("cache/team/typo"), None);
}

/// Two ECR registries (from FILL_MIRROR_ECR_REGISTRIES) and the user's docker config (a
/// private source's credentials, another host's entry): skopeo reads one file with a login per
/// host, the user's entries kept, only the binary able to read it; the user's file untouched.
#[test]
fn two_ecr_logins_and_the_auth_file_s_own_entries_are_merged_into_one_private_file() {
    let source = TestRegistry::start_with_basic_auth("cred-merge-src", "puller", "pull-token")
        .expect("source registry");
    let storage = TestRegistry::start("cred-merge-storage").expect("storage registry");
    let moto = Moto::start().expect("moto_server (scripts/ensure-python-tools.sh)");
    let first = EcrRegistry::start(&storage, &moto).expect("ECR front");
    let second = EcrRegistry::start(&storage, &moto).expect("ECR front");
    let a = Image::new("a 1 for ecr", "linux/amd64").push(&source, "team/a", Some("1"));
    let b = Image::new("b 1 for ecr", "linux/amd64").push(&source, "other/b", Some("1"));
    let dir = tempfile::tempdir().expect("dir");
    let (pods, settings) = inputs(
        dir.path(),
        json!([
            {"source": format!("{}/team", source.host), "target": format!("{}/cache", first.host)},
            {"source": format!("{}/other", source.host), "target": format!("{}/cache2", second.host)},
        ]),
        &[
            &format!("{}/team/a:1", source.host),
            &format!("{}/other/b:1", source.host),
        ],
    );
    let user_config = json!({"auths": {
        source.host.clone(): {"username": "puller", "password": "pull-token",
            "auth": basic("puller", "pull-token")},
        "quay.io": {"auth": basic("robot", "quay")},
    }});
    let auth_file = dir.path().join("config.json");
    write_json(&auth_file, &user_config);
    let (skopeo, seen) = recording_skopeo(dir.path());
    let mut env = moto.environment();
    env.push((
        "FILL_MIRROR_ECR_REGISTRIES",
        format!("{},{}", first.host, second.host),
    ));
    env.push(("REGISTRY_AUTH_FILE", auth_file.display().to_string()));
    // The private source's login, for the namespace of the Pods that ask.
    env.push((
        "FILL_MIRROR_SOURCE_NAMESPACES",
        format!("{}=default", source.host),
    ));

    let run = once(
        &pods,
        &settings,
        &[
            "--insecure",
            "--ecr-create-repositories",
            "--skopeo",
            &skopeo.display().to_string(),
        ],
        &env,
    );

    assert_eq!(run.code, Some(0), "{}", run.printed());
    assert!(
        run.stdout
            .contains("fill-mirror: 2 copied, 0 failed, 0 skipped, 0 gone, 0 refused"),
        "{}",
        run.printed()
    );
    // A rule on a source path puts what follows it under the target: team/a under cache/a.
    assert_eq!(storage.digest_of("cache/a", "1"), Some(a));
    assert_eq!(storage.digest_of("cache2/b", "1"), Some(b));
    let merged: Value = serde_json::from_str(
        &std::fs::read_to_string(seen.join("auth.json")).expect("the auth file skopeo read"),
    )
    .expect("JSON");
    let ecr_login = basic("AWS", &EcrRegistry::password());
    assert_eq!(
        merged,
        json!({"auths": {
            source.host.clone(): {"username": "puller", "password": "pull-token",
                "auth": basic("puller", "pull-token")},
            "quay.io": {"auth": basic("robot", "quay")},
            first.host.clone(): {"auth": ecr_login},
            second.host.clone(): {"auth": ecr_login},
        }})
    );
    assert_eq!(
        std::fs::read_to_string(seen.join("mode"))
            .expect("mode")
            .trim(),
        "600"
    );
    let untouched: Value =
        serde_json::from_str(&std::fs::read_to_string(&auth_file).expect("user's file"))
            .expect("JSON");
    assert_eq!(untouched, user_config);
}

/// An AWS API that cannot be reached fails the copy with words that name the host, the flag
/// and the AWS error, and the run exits 1.
#[test]
fn an_ecr_token_that_cannot_be_had_fails_the_copy_naming_the_host_and_the_flag() {
    let source = TestRegistry::start("cred-noaws-src").expect("source registry");
    let mirror = TestRegistry::start("cred-noaws-mirror").expect("mirror registry");
    Image::new("web", "linux/amd64").push(&source, "app/web", Some("1"));
    let dir = tempfile::tempdir().expect("dir");
    let (pods, settings) = inputs(
        dir.path(),
        json!([{"source": source.host, "target": format!("{}/hub", mirror.host)}]),
        &[&format!("{}/app/web:1", source.host)],
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let env = vec![
        ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{closed}")),
        ("AWS_ACCESS_KEY_ID", "testing".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_string()),
        ("AWS_REGION", "eu-west-1".to_string()),
        ("AWS_MAX_ATTEMPTS", "1".to_string()),
    ];

    let run = once(
        &pods,
        &settings,
        &["--insecure", "--ecr-registry", &mirror.host],
        &env,
    );

    assert_eq!(run.code, Some(1), "{}", run.printed());
    assert!(
        run.stderr.contains(&format!(
            "--ecr-registry {}: GetAuthorizationToken: ",
            mirror.host
        )) && run.stderr.contains("dispatch failure"),
        "{}",
        run.printed()
    );
    assert_eq!(mirror.digest_of("hub/app/web", "1"), None);
}

/// A stand-in for the GKE metadata server (Google's is not reachable here): its token endpoint
/// answers a request with `Metadata-Flavor: Google` with `token`, any other with 403, as
/// Google's does.
struct MetadataServer {
    host: String,
    asked: Arc<Mutex<Vec<String>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl MetadataServer {
    fn start(token: &str) -> MetadataServer {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = asked.clone();
        let token = token.to_string();
        let (host, stop) = rig::front::serve("metadata server", move |request| {
            let flavor = request
                .headers()
                .iter()
                .any(|h| h.field.equiv("Metadata-Flavor") && h.value.as_str() == "Google");
            let url = request.url().to_string();
            if let Ok(mut log) = log.lock() {
                log.push(format!("{url} flavor={flavor}"));
            }
            let (code, body) = if !flavor {
                (403, "Missing Metadata-Flavor:Google header.".to_string())
            } else if url == "/computeMetadata/v1/instance/service-accounts/default/token" {
                (
                    200,
                    json!({"access_token": token, "expires_in": 3599, "token_type": "Bearer"})
                        .to_string(),
                )
            } else {
                (404, "not found".to_string())
            };
            let _ = request.respond(tiny_http::Response::from_string(body).with_status_code(code));
        })
        .expect("metadata server");
        MetadataServer { host, asked, stop }
    }
}

impl Drop for MetadataServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `--gar-registry`: the metadata server's access token, as `oauth2accesstoken`, is what the
/// mirror (basic auth with that token as the password) lets push.
#[test]
fn on_artifact_registry_the_metadata_server_s_token_lets_the_copy_push() {
    let source = TestRegistry::start("cred-gar-src").expect("source registry");
    let far = LatencyProxy::network(&source.host, ROUND_TRIP).expect("latency proxy");
    let token = "ya29.a-token-of-the-pod-s-service-account";
    let mirror = TestRegistry::start_with_basic_auth("cred-gar-mirror", "oauth2accesstoken", token)
        .expect("mirror registry");
    let metadata = MetadataServer::start(token);
    let digest = Image::new("gar", "linux/amd64").push(&source, "app/web", Some("1"));
    let dir = tempfile::tempdir().expect("dir");
    let (pods, settings) = inputs(
        dir.path(),
        json!([{"source": far.host, "target": format!("{}/hub", mirror.host)}]),
        &[&format!("{}/app/web:1", far.host)],
    );

    let run = once(
        &pods,
        &settings,
        &["--insecure", "--gar-registry", &mirror.host],
        &[("GCE_METADATA_HOST", metadata.host.clone())],
    );

    assert_eq!(run.code, Some(0), "{}", run.printed());
    assert!(
        run.stdout.contains("fill-mirror: 1 copied, 0 failed"),
        "{}",
        run.printed()
    );
    assert_eq!(mirror.digest_of("hub/app/web", "1"), Some(digest));
    let asked = metadata.asked.lock().expect("log").clone();
    assert_eq!(
        asked,
        vec!["/computeMetadata/v1/instance/service-accounts/default/token flavor=true".to_string()],
        "one token for the one copy"
    );
}

fn sources_yaml(dir: &Path, yaml: &str) -> PathBuf {
    let path = dir.join("sources.yaml");
    std::fs::write(&path, yaml).expect("sources.yaml");
    path
}

/// sources.yaml's `insecure_sources` lets skopeo use plain HTTP for the hosts it names, and
/// only those: without `--insecure`, a mirror it does not name is asked over verified HTTPS.
#[test]
fn sources_yaml_s_insecure_hosts_are_reached_over_plain_http_and_only_they() {
    let source = TestRegistry::start("cred-insecure-src").expect("source registry");
    let far = LatencyProxy::network(&source.host, ROUND_TRIP).expect("latency proxy");
    let mirror = TestRegistry::start("cred-insecure-mirror").expect("mirror registry");
    let digest = Image::new("insecure", "linux/amd64").push(&source, "app/web", Some("1"));
    let dir = tempfile::tempdir().expect("dir");
    let (pods, settings) = inputs(
        dir.path(),
        json!([{"source": far.host, "target": format!("{}/hub", mirror.host)}]),
        &[&format!("{}/app/web:1", far.host)],
    );

    let source_only = sources_yaml(
        dir.path(),
        &format!("insecure_sources:\n  - \"{}\"\n", far.host),
    );
    let (skopeo, seen) = recording_skopeo(dir.path());
    let run = once(
        &pods,
        &settings,
        &[
            "--sources-path",
            &source_only.display().to_string(),
            "--skopeo",
            &skopeo.display().to_string(),
        ],
        &[],
    );
    assert_eq!(run.code, Some(1), "{}", run.printed());
    assert!(
        run.stderr
            .contains("server gave HTTP response to HTTPS client"),
        "{}",
        run.printed()
    );
    assert_eq!(mirror.digest_of("hub/app/web", "1"), None);
    let args = std::fs::read_to_string(seen.join("args")).expect("skopeo's arguments");
    let mirror_image = format!("docker://{}/", mirror.host);
    let mirror_runs: Vec<&str> = args
        .lines()
        .filter(|line| line.contains(&mirror_image))
        .collect();
    assert!(
        !mirror_runs.is_empty()
            && mirror_runs.iter().all(|line| {
                !line.contains("--tls-verify=false") && !line.contains("--dest-tls-verify=false")
            }),
        "the mirror is not in insecure_sources: verified TLS: {args}"
    );

    let both = sources_yaml(
        dir.path(),
        &format!(
            "insecure_sources:\n  - \"{}\"\n  - \"{}\"\n",
            far.host, mirror.host
        ),
    );
    let run = once(
        &pods,
        &settings,
        &[],
        &[("KUBEWARDEN_SOURCES_PATH", both.display().to_string())],
    );
    assert_eq!(run.code, Some(0), "{}", run.printed());
    assert!(
        run.stdout.contains("fill-mirror: 1 copied, 0 failed"),
        "{}",
        run.printed()
    );
    assert_eq!(mirror.digest_of("hub/app/web", "1"), Some(digest));
}

/// A CA of the registry's own, made for the test, and the registry's serving certificate for
/// 127.0.0.1 signed by it.
fn private_ca() -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "fill-mirror test CA");
    let ca_cert = ca.self_signed(&ca_key).expect("CA");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut serving = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
    serving
        .subject_alt_names
        .push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
    let cert = serving
        .signed_by(&key, &ca_cert, &ca_key)
        .expect("serving certificate");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

/// sources.yaml's `source_authorities`: a source and a mirror served over HTTPS with
/// certificates of a private CA are reached, TLS verified, with that CA (a `Data` entry for one,
/// a `Path` entry for the other), by skopeo and by the referrers client; refused without it.
#[test]
fn sources_yaml_s_authority_lets_skopeo_verify_a_registry_with_a_private_ca() {
    let source_storage = TestRegistry::start("cred-ca-src").expect("source registry");
    let storage = TestRegistry::start("cred-ca-mirror").expect("mirror registry");
    let (ca, cert, key) = private_ca();
    let source = source_storage
        .tls_twin(&cert, &key)
        .expect("the source over TLS");
    let mirror = storage.tls_twin(&cert, &key).expect("the mirror over TLS");
    let digest = Image::new("ca", "linux/amd64").push(&source_storage, "app/web", Some("1"));
    let dir = tempfile::tempdir().expect("dir");
    let (pods, settings) = inputs(
        dir.path(),
        json!([{"source": source.host, "target": format!("{}/hub", mirror.host)}]),
        &[&format!("{}/app/web:1", source.host)],
    );

    let without = sources_yaml(dir.path(), "insecure_sources: []\n");
    let run = once(
        &pods,
        &settings,
        &["--sources-path", &without.display().to_string()],
        &[],
    );
    assert_eq!(run.code, Some(1), "{}", run.printed());
    assert!(
        run.stderr
            .contains("certificate signed by unknown authority"),
        "{}",
        run.printed()
    );

    let ca_file = dir.path().join("mirror-ca.pem");
    std::fs::write(&ca_file, &ca).expect("CA file");
    let (skopeo, seen) = recording_skopeo(dir.path());
    let with = sources_yaml(
        dir.path(),
        &format!(
            "insecure_sources: [\"unrelated.example:5000\"]\nsource_authorities:\n  \"{}\":\n    - type: Path\n      path: {}\n  \"{}\":\n    - type: Data\n      data: |\n{}",
            mirror.host,
            ca_file.display(),
            source.host,
            ca.lines()
                .map(|line| format!("        {line}\n"))
                .collect::<String>()
        ),
    );
    let run = once(
        &pods,
        &settings,
        &[
            "--sources-path",
            &with.display().to_string(),
            "--skopeo",
            &skopeo.display().to_string(),
        ],
        &[],
    );
    assert_eq!(run.code, Some(0), "{}", run.printed());
    assert!(
        run.stdout.contains("fill-mirror: 1 copied, 0 failed"),
        "{}",
        run.printed()
    );
    assert_eq!(storage.digest_of("hub/app/web", "1"), Some(digest));
    assert!(
        mirror
            .requests()
            .iter()
            .any(|r| r.starts_with("PUT /v2/hub/app/web/manifests/")),
        "the copy went over TLS: {:?}",
        mirror.requests()
    );
    // Each host as sources.yaml says: both verified, each with its own CA folder; another
    // host's insecure entry changes nothing for them.
    let args = std::fs::read_to_string(seen.join("args")).expect("skopeo's arguments");
    let copy = args
        .lines()
        .find(|line| line.starts_with("copy "))
        .expect("a copy");
    // skopeo's layout: a folder per host holding its ca.crt.
    let mirror_ca = format!("/certs/{} ", mirror.host);
    let source_ca = format!("/certs/{} ", source.host);
    assert!(
        !copy.contains("tls-verify=false")
            && copy.contains("--src-cert-dir=")
            && copy.contains(&source_ca)
            && copy.contains("--dest-cert-dir=")
            && copy.contains(&mirror_ca),
        "{copy}"
    );
}

/// Each sources.yaml authority is trusted for its own host only, by the binary's own client as
/// by skopeo's `--cert-dir`: two registries on loopback over TLS, each with a certificate of
/// its own private CA; a pull-through cache (warmed by the binary's client, no skopeo) whose
/// entry names the other registry's CA is refused even though its own CA is listed, for the
/// other host; with its own CA under its own name it is warmed.
#[test]
fn a_sources_yaml_authority_is_trusted_for_its_own_host_only() {
    let cache_storage = TestRegistry::start("cred-scope-cache").expect("cache registry");
    let other_storage = TestRegistry::start("cred-scope-other").expect("other registry");
    let (cache_ca, cache_cert, cache_key) = private_ca();
    let (other_ca, other_cert, other_key) = private_ca();
    let cache = cache_storage
        .tls_twin(&cache_cert, &cache_key)
        .expect("the cache over TLS");
    let other = other_storage
        .tls_twin(&other_cert, &other_key)
        .expect("the other registry over TLS");
    Image::new("scoped", "linux/amd64").push(&cache_storage, "hub/app/web", Some("1"));
    let dir = tempfile::tempdir().expect("dir");
    let (pods, settings) = inputs(
        dir.path(),
        json!([{"source": "src.example", "target": format!("{}/hub", cache.host), "pullThrough": true}]),
        &["src.example/app/web:1"],
    );
    let entry = |host: &str, ca: &str| {
        format!(
            "  \"{host}\":\n    - type: Data\n      data: |\n{}",
            ca.lines()
                .map(|line| format!("        {line}\n"))
                .collect::<String>()
        )
    };
    let crossed = sources_yaml(
        dir.path(),
        &format!(
            "source_authorities:\n{}{}",
            entry(&cache.host, &other_ca),
            entry(&other.host, &cache_ca)
        ),
    );
    let run = once(
        &pods,
        &settings,
        &["--sources-path", &crossed.display().to_string()],
        &[],
    );
    assert_eq!(run.code, Some(1), "{}", run.printed());
    assert!(
        run.stdout.contains("fill-mirror: 0 copied, 1 failed"),
        "{}",
        run.printed()
    );

    let own = sources_yaml(
        dir.path(),
        &format!(
            "source_authorities:\n{}{}",
            entry(&cache.host, &cache_ca),
            entry(&other.host, &other_ca)
        ),
    );
    let run = once(
        &pods,
        &settings,
        &["--sources-path", &own.display().to_string()],
        &[],
    );
    assert_eq!(run.code, Some(0), "{}", run.printed());
    assert!(
        run.stdout.contains("fill-mirror: 1 copied, 0 failed"),
        "{}",
        run.printed()
    );
    assert!(
        cache
            .requests()
            .iter()
            .any(|r| r.starts_with("GET /v2/hub/app/web/manifests/1")),
        "the warming went over TLS: {:?}",
        cache.requests()
    );
}

/// A sources.yaml that is not Kubewarden's form stops the run (exit 2) naming the flag.
#[test]
fn a_sources_yaml_in_another_form_stops_the_run_naming_the_flag() {
    let dir = tempfile::tempdir().expect("dir");
    let (pods, settings) = inputs(
        dir.path(),
        json!([{"source": "src.example", "target": "m.example/hub"}]),
        &["src.example/app/web:1"],
    );
    let bad = sources_yaml(dir.path(), "insecure_sources: {registry: true}\n");

    let run = once(
        &pods,
        &settings,
        &["--sources-path", &bad.display().to_string()],
        &[],
    );

    assert_eq!(run.code, Some(2), "{}", run.printed());
    assert!(
        run.stderr.contains(&format!(
            "--sources-path {}: not Kubewarden's sources.yaml",
            bad.display()
        )),
        "{}",
        run.printed()
    );
}
