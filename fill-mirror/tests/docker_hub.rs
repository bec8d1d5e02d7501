//! Docker Hub's answer to a repository that does not exist, as `fill-mirror once` reads it
//! through real skopeo: 401 `UNAUTHORIZED` "authentication required" (skopeo: "denied:
//! requested access to the resource is denied / unauthorized: authentication required"), not
//! 404. A typo'd image is `gone`, anonymously or with good credentials; bad credentials (the
//! token service's 401 "incorrect username or password", skopeo: "unable to retrieve auth
//! token: invalid username/password") stay `failed`. Docker Hub is the rig's stand-in
//! (`rig/hub.rs`), 20 ms away through the latency proxy, reached as `docker.io` by a
//! `registries.conf`.

mod rig;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use rig::hub::{DockerHubFront, registries_conf};
use rig::proxy::LatencyProxy;
use rig::registry::{TestRegistry, basic_auth};
use rig::{fill_mirror, pod_recorded_by_hand, settings, text, write_json};
use serde_json::json;

/// Docker Hub's distance.
const AWAY: Duration = Duration::from_millis(20);

/// skopeo with `--registries-conf conf`, for the binary's `--skopeo`.
fn skopeo_with(dir: &Path, conf: &Path) -> PathBuf {
    let script = dir.join("skopeo");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec skopeo --registries-conf '{}' \"$@\"\n",
            conf.display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(
        &script,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .expect("chmod");
    script
}

/// `fill-mirror once` over a Pod recorded as lacking `docker.io/library/typo:1`, routed to the
/// mirror, with `password` for the user `puller` in the auth file when given.
fn once_for_a_typo(password: Option<&str>) -> Output {
    let login = basic_auth("puller", "pull-token");
    let hub = DockerHubFront::start(login.trim_start_matches("Basic ")).expect("Docker Hub front");
    let far = LatencyProxy::network(&hub.host, AWAY).expect("latency proxy");
    let mirror = TestRegistry::start("hub-typo-mirror").expect("mirror registry");
    let dir = tempfile::tempdir().expect("dir");
    let registries = registries_conf(dir.path(), &far.host);
    let skopeo = skopeo_with(dir.path(), &registries);
    let rules = settings("docker.io", &mirror.host);
    let image = "docker.io/library/typo:1";
    // The record written by hand: the rule docker.io -> MIRROR/hub keeps the path.
    let pod = pod_recorded_by_hand("p", image, &format!("{}/hub/library/typo:1", mirror.host));
    let path = |name: &str| dir.path().join(name);
    write_json(&path("pods.json"), &json!({"items": [pod]}));
    write_json(&path("settings.json"), &rules);
    let mut command = fill_mirror();
    command
        .args(["once", "--insecure", "--log-format", "text", "--skopeo"])
        .arg(&skopeo)
        .arg("--pods")
        .arg(path("pods.json"))
        .arg("--settings")
        .arg(path("settings.json"))
        .env_remove("REGISTRY_AUTH_FILE");
    if let Some(password) = password {
        // skopeo looks a login up by the host it reaches (the location registries.conf names).
        let auth = basic_auth("puller", password);
        write_json(
            &path("auth.json"),
            &json!({"auths": {far.host.clone(): {"auth": auth.trim_start_matches("Basic ")}}}),
        );
        command.arg("--auth-file").arg(path("auth.json"));
        command.args(["--source-namespaces", "docker.io=*"]);
    }
    command.output().expect("run fill-mirror")
}

#[rstest::rstest]
#[case::anonymous(None)]
#[case::with_good_credentials(Some("pull-token"))]
fn a_typo_d_docker_hub_image_is_gone_not_failed(#[case] password: Option<&str>) {
    let output = once_for_a_typo(password);
    let words = format!("{}{}", text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{words}");
    assert!(
        words.contains("fill-mirror: 0 copied, 0 failed, 0 skipped, 1 gone, 0 refused"),
        "{words}"
    );
}

#[test]
fn bad_docker_hub_credentials_stay_failed() {
    let output = once_for_a_typo(Some("a-revoked-token"));
    let words = format!("{}{}", text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(1), "{words}");
    assert!(
        words.contains("fill-mirror: 0 copied, 1 failed, 0 skipped, 0 gone, 0 refused")
            && words.contains("invalid username/password"),
        "{words}"
    );
}
