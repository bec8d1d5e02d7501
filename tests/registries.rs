//! The registries people run, through the built module: credentials that a registry stops
//! accepting (an expired ECR token) and a renewed docker config that is used without a restart;
//! Docker Hub's 401 for a repository that does not exist; a `distribution` pull-through cache
//! as the mirror; and a cache that, like ECR's, fills on a tag but not on an uncached digest.

mod rig;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use rig::hosts::{HOST_CACHE, LiveHost, PolicyServer};
use rig::images::Image;
use rig::pull_through::TagFilledCache;
use rig::registry::TestRegistry;
use rig::{Response, audit_request, pod_request, shared, validate};
use serde_json::{Value, json};

fn settings(target: &str, action: &str) -> Value {
    json!({"action": action, "mirrors": [{"source": "docker.io", "target": target}]})
}

fn web(image: &str) -> Value {
    json!({"containers": [{"name": "web", "image": image}]})
}

/// A docker config as the kubelet lays out a Secret volume (an atomic writer): the data in a
/// timestamped directory, `..data` pointing at it, and `config.json` through `..data`.
struct SecretVolume {
    dir: PathBuf,
    generation: usize,
}

impl SecretVolume {
    fn new(name: &str) -> SecretVolume {
        let dir = std::env::temp_dir().join(format!(
            "image-swapper-secret-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("secret volume");
        std::os::unix::fs::symlink("..data/config.json", dir.join("config.json"))
            .expect("config.json link");
        SecretVolume { dir, generation: 0 }
    }

    /// Writes a new version and swaps `..data` to it in one rename, as the kubelet does.
    fn write(&mut self, host: &str, user: &str, password: &str) {
        self.generation += 1;
        let version = format!(
            "..2026_12_01_08_00_0{}.000000{}",
            self.generation, self.generation
        );
        let data = self.dir.join(&version);
        std::fs::create_dir_all(&data).expect("secret data");
        let auth = {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        };
        std::fs::write(
            data.join("config.json"),
            json!({"auths": {host: {"auth": auth}}}).to_string(),
        )
        .expect("config.json");
        let staged = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&staged);
        std::os::unix::fs::symlink(&version, &staged).expect("..data_tmp");
        std::fs::rename(&staged, self.dir.join("..data")).expect("..data swap");
    }

    fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for SecretVolume {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An ECR mirror a day after installation: the credentials in the PolicyServer's
/// `imagePullSecret` worked, then the registry stopped accepting them (the token expired). The
/// warning names the registry, says whose credentials were refused and where they come from;
/// the check role's `error` says the same; and once the Secret is renewed (the kubelet swaps
/// `..data`), the very next admission swaps again, with nothing restarted.
#[test]
fn refused_credentials_name_the_registry_and_the_secret_and_a_renewed_secret_is_used_at_once() {
    let mut mirror =
        TestRegistry::start_with_basic_auth("creds", "policy-server", "token-1").expect("registry");
    let digest = Image::new("app t2", "linux/amd64").push(&mirror, "up/library/app", Some("t2"));
    let mut secret = SecretVolume::new("creds");
    secret.write(&mirror.host, "policy-server", "token-1");
    // One policy-server process throughout: its 60-second cache of successful lookups included.
    let server = PolicyServer::new(LiveHost {
        docker_config: Some(secret.path().to_path_buf()),
        ..LiveHost::default()
    });
    let target = format!("{}/up", mirror.host);
    let swap = settings(&target, "swap");
    let request = pod_request("CREATE", web("app:t2"));
    let swapped = format!("{target}/library/app:t2@{digest}");

    let first = validate(&swap, &request, server.evaluation());
    assert_eq!(
        first.image("containers", 0),
        Some(swapped.as_str()),
        "{first:?}"
    );

    // Twelve hours later the token expires, and the registry accepts only a new one. (Within a
    // minute of the first lookup the host would still answer from its cache.)
    server.advance(HOST_CACHE);
    mirror.change_password("token-2").expect("new password");
    server.host().backtrace = true;
    let refused = validate(&swap, &request, server.evaluation());
    assert!(refused.accepted && refused.mutated.is_none(), "{refused:?}");
    let url = format!("http://{}/v2/up/library/app/manifests/t2", mirror.host);
    let explained = format!(
        "registry {} refused policy-server's credentials for it, or policy-server has none (Not authorized: url {url}): lookups use the docker config in the PolicyServer's imagePullSecret, read at every lookup; renew the credentials for {} there (ECR tokens expire after 12 hours)",
        mirror.host, mirror.host
    );
    assert_eq!(
        refused.warnings,
        [format!(
            "image \"app:t2\": kept, not swapped to \"{target}/library/app:t2\": could not look it up ({explained})"
        )]
    );
    assert_eq!(
        refused.audit["kept"],
        json!([{"image": "app:t2", "reason": "lookup-error"}])
    );

    // The check role, for the Pod admitted while the credentials worked: an `error`.
    let running = first.mutated.expect("swapped");
    let scan = audit_request(
        1,
        running["spec"].clone(),
        running["metadata"]["annotations"].clone(),
    );
    let checked = validate(&settings(&target, "check"), &scan, server.evaluation());
    assert_eq!(
        (checked.accepted, checked.code),
        (false, Some(500)),
        "{checked:?}"
    );
    let by_digest = format!("{target}/library/app@{digest}");
    let digest_url = format!(
        "http://{}/v2/up/library/app/manifests/{digest}",
        mirror.host
    );
    assert_eq!(
        checked.message.as_deref(),
        Some(
            format!(
                "the Pod's mirror images could not all be checked: containers \"web\": image \"{swapped}\" not checked: could not ask the mirror for \"{by_digest}\" ({})",
                explained.replace(&url, &digest_url)
            )
            .as_str()
        )
    );

    // The Secret is renewed; the same host process, the same module: swapped again.
    secret.write(&mirror.host, "policy-server", "token-2");
    let renewed = validate(&swap, &request, server.evaluation());
    assert_eq!(
        renewed.image("containers", 0),
        Some(swapped.as_str()),
        "{renewed:?}"
    );
    assert!(renewed.warnings.is_empty(), "{:?}", renewed.warnings);
}

/// Without any credentials for a registry that needs them, the same words: the operator has
/// one place to look whether the Secret is stale or lacks the registry.
#[test]
fn a_registry_policy_server_has_no_credentials_for_is_explained_the_same_way() {
    let mirror = TestRegistry::start_with_basic_auth("nocreds", "policy-server", "token-1")
        .expect("registry");
    Image::new("app t2", "linux/amd64").push(&mirror, "up/library/app", Some("t2"));
    let target = format!("{}/up", mirror.host);
    let host = shared(LiveHost::default());
    let response = validate(
        &settings(&target, "swap"),
        &pod_request("CREATE", web("app:t2")),
        host,
    );
    assert!(response.mutated.is_none());
    assert!(
        response.warned(&format!(
            "registry {} refused policy-server's credentials for it, or policy-server has none",
            mirror.host
        )),
        "{:?}",
        response.warnings
    );
}

/// A mirror on Docker Hub (an organisation of its own), whose repository does not exist: Hub
/// answers 401, as it does for refused credentials. The warning says so, and does not send the
/// operator to a Secret that is fine. (The registry on loopback answers for `docker.io` and
/// needs credentials the host does not have: Hub's answer to an anonymous request for a
/// repository it does not have.)
#[test]
fn docker_hubs_401_for_a_missing_repository_does_not_blame_the_secret() {
    let hub = TestRegistry::start_with_basic_auth("hub", "someone", "else").expect("registry");
    let host = shared(LiveHost {
        aliases: [("docker.io".to_string(), hub.host.clone())].into(),
        ..LiveHost::default()
    });
    let settings = json!({"mirrors": [{"source": "quay.io", "target": "docker.io/myorg"}]});
    let response = validate(
        &settings,
        &pod_request("CREATE", web("quay.io/team/app:1.0")),
        host.clone(),
    );
    assert!(
        response.accepted && response.mutated.is_none(),
        "{response:?}"
    );
    assert_eq!(
        response.warnings,
        [
            "image \"quay.io/team/app:1.0\": kept, not swapped to \"docker.io/myorg/team/app:1.0\": could not look it up (Docker Hub refused it (Not authorized: url https://index.docker.io/v2/myorg/team/app/manifests/1.0): Hub answers so for a repository that does not exist or is private as well as for refused credentials, so check the image name before policy-server's credentials for docker.io)"
        ]
    );
    assert!(!response.warnings[0].contains("imagePullSecret"));
}

/// A `distribution` registry in proxy mode as the mirror: an image it has never seen is swapped
/// at its first admission (the lookup's `HEAD` fetched it from the upstream); after the upstream
/// loses it, and with the upstream down, the cache still serves it, so it is still swapped; and
/// the check role passes the running Pod.
#[test]
fn a_pull_through_cache_is_filled_by_the_first_lookup_and_keeps_serving() {
    let mut upstream = TestRegistry::start("proxy-upstream").expect("registry");
    let digest = Image::new("app 1.0", "linux/amd64").push(&upstream, "library/app", Some("1.0"));
    let cache = TestRegistry::start_proxy("proxy-cache", &upstream.host).expect("proxy");
    let swap = settings(&cache.host, "swap");
    let request = pod_request("CREATE", web("app:1.0"));
    let swapped = format!("{}/library/app:1.0@{digest}", cache.host);
    let run = |settings: &Value, request: &Value| -> Response {
        validate(settings, request, shared(LiveHost::default()))
    };

    let first = run(&swap, &request);
    assert_eq!(
        first.image("containers", 0),
        Some(swapped.as_str()),
        "{first:?}"
    );

    upstream
        .delete_manifest("library/app", &digest)
        .expect("upstream prune");
    let after_upstream_prune = run(&swap, &request);
    assert_eq!(
        after_upstream_prune.image("containers", 0),
        Some(swapped.as_str())
    );
    upstream.stop();
    let upstream_down = run(&swap, &request);
    assert_eq!(upstream_down.image("containers", 0), Some(swapped.as_str()));
    assert!(
        upstream_down.warnings.is_empty(),
        "{:?}",
        upstream_down.warnings
    );

    let running = first.mutated.expect("swapped");
    let scan = audit_request(
        1,
        running["spec"].clone(),
        running["metadata"]["annotations"].clone(),
    );
    let checked = run(&settings(&cache.host, "check"), &scan);
    assert!(checked.accepted, "{checked:?}");
}

/// A chart pins `app:1.0@sha256:D`, and the mirror is a cache that fills on a tag but answers
/// "not found" for a digest it has not stored, as an ECR pull-through cache does. The digest's
/// lookup says "not found"; the tag's fills the cache and answers D: swapped, pinned to D. The
/// next admission finds the digest at once. A tag that names other content keeps the image.
#[test]
fn a_digest_pinned_first_pull_fills_a_cache_that_fills_on_tags() {
    let upstream = TestRegistry::start("ecr-upstream").expect("registry");
    let storage = TestRegistry::start("ecr-storage").expect("registry");
    let cache = TagFilledCache::start(&upstream, &storage).expect("cache");
    let digest = Image::new("app 1.0", "linux/amd64").push(&upstream, "library/app", Some("1.0"));
    let swap = settings(&cache.host, "swap");
    let pinned = pod_request("CREATE", web(&format!("app:1.0@{digest}")));
    let host = shared(LiveHost::default());

    let first = validate(&swap, &pinned, host.clone());
    let swapped = format!("{}/library/app:1.0@{digest}", cache.host);
    assert_eq!(
        first.image("containers", 0),
        Some(swapped.as_str()),
        "{first:?}"
    );
    assert!(first.warnings.is_empty(), "{:?}", first.warnings);
    assert_eq!(
        host.lock().unwrap().lookups(),
        [
            format!("OciManifestDigest {}/library/app@{digest}", cache.host),
            format!("OciManifestDigest {}/library/app:1.0", cache.host),
        ]
    );
    assert_eq!(cache.fills.load(Ordering::Relaxed), 1);

    let again = shared(LiveHost::default());
    let second = validate(&swap, &pinned, again.clone());
    assert_eq!(second.image("containers", 0), Some(swapped.as_str()));
    assert_eq!(
        again.lock().unwrap().lookups().len(),
        1,
        "the digest is stored now"
    );

    // Upstream's app:2.0 moved on: a Pod pinned to an older digest under that tag is kept.
    let old = Image::new("app 2.0 old", "linux/amd64").push(&upstream, "library/app", Some("2.0"));
    Image::new("app 2.0 new", "linux/amd64").push(&upstream, "library/app", Some("2.0"));
    let moved = validate(
        &swap,
        &pod_request("CREATE", web(&format!("app:2.0@{old}"))),
        shared(LiveHost::default()),
    );
    assert_eq!(
        moved.image("containers", 0),
        Some(format!("app:2.0@{old}").as_str()),
        "{moved:?}"
    );
    assert!(
        moved.warned("Requested image not found; its tag") && moved.warned("names another digest"),
        "{:?}",
        moved.warnings
    );
}
