//! `fill-mirror list` and `fill-mirror once` as a CronJob or a person runs them, on Pods from
//! `kubectl get pods -o json` output and real registries on loopback (Debian's
//! `docker-registry`), copying with skopeo.

mod rig;

use std::path::PathBuf;

use rig::images::{Image, Index};
use rig::registry::TestRegistry;
use rig::{pod_recorded_by_hand, run, settings, text, write_json};
use serde_json::{Value, json};

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            dir: tempfile::tempdir().expect("a temporary folder"),
        }
    }

    fn write(&self, name: &str, value: &Value) -> String {
        let path: PathBuf = self.dir.path().join(name);
        write_json(&path, value);
        path.display().to_string()
    }
}

/// The pods file and the settings file for Pods of `images` (each under `source`) recorded as
/// lacking them, with records written by hand: each copied to the same path under `mirror/hub`.
fn inputs(files: &Files, source: &str, mirror: &str, pods: &[(&str, &str)]) -> (String, String) {
    let settings = settings(source, mirror);
    let items: Vec<Value> = pods
        .iter()
        .map(|(name, image)| {
            let path = image
                .strip_prefix(&format!("{source}/"))
                .expect("an image under the source");
            pod_recorded_by_hand(name, image, &format!("{mirror}/hub/{path}"))
        })
        .collect();
    (
        files.write(
            "pods.json",
            &json!({"apiVersion": "v1", "kind": "List", "items": items}),
        ),
        files.write("settings.json", &settings),
    )
}

#[test]
fn list_prints_each_copy_once_and_refuses_a_record_the_policy_did_not_write() {
    let files = Files::new();
    let settings = settings("src.example", "m.example");
    let own = pod_recorded_by_hand("own", "src.example/app/web:1", "m.example/hub/app/web:1");
    let twin = pod_recorded_by_hand("twin", "src.example/app/web:1", "m.example/hub/app/web:1");
    let mut forged = own.clone();
    forged["metadata"]["name"] = json!("forged");
    forged["spec"]["containers"][0]["image"] = json!("src.example/app/db:1");
    let record = json!({"c0": {"source": "src.example/app/db:1",
        "copy": "skopeo copy --all --preserve-digests docker://evil.example/x:1 docker://m.example/hub/app/db:1"}});
    forged["metadata"]["annotations"] =
        json!({"image-swapper.kubewarden.io/unmirrored-images": record.to_string()});
    let pods = files.write("pods.json", &json!({"items": [own, twin, forged]}));
    let settings = files.write("settings.json", &settings);

    let output = run(&["list", "--pods", &pods, "--settings", &settings]);

    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(
        text(&output.stdout),
        "src.example/app/web:1 m.example/hub/app/web:1\n"
    );
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("refused default/forged container c0: its record is not the policy's own"),
        "{stderr}"
    );
    assert!(stderr.contains("listed 1 copies, 1 refused"), "{stderr}");
}

#[test]
fn once_copies_a_multi_platform_image_once_with_every_digest() {
    let source = TestRegistry::start("fill-once-src").expect("source registry");
    let mirror = TestRegistry::start("fill-once-mirror").expect("mirror registry");
    let index = Index::new(vec![
        Image::new("web", "linux/amd64"),
        Image::new("web", "linux/arm64"),
    ]);
    let digest = index.push(&source, "app/web", "1");
    let image = format!("{}/app/web:1", source.host);
    let files = Files::new();
    let (pods, settings) = inputs(
        &files,
        &source.host,
        &mirror.host,
        &[("a", &image), ("b", &image), ("c", &image)],
    );

    let output = run(&[
        "once",
        "--insecure",
        "--pods",
        &pods,
        "--settings",
        &settings,
    ]);

    let stdout = text(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}{}",
        text(&output.stderr)
    );
    assert!(
        stdout.contains("fill-mirror: 1 copied, 0 failed, 0 skipped, 0 gone, 0 refused"),
        "{stdout}"
    );
    assert_eq!(mirror.digest_of("hub/app/web", "1"), Some(digest));
    for platform in &index.images {
        assert_eq!(
            mirror.digest_of("hub/app/web", &platform.digest()),
            Some(platform.digest()),
            "{} {}",
            platform.os,
            platform.architecture
        );
    }
}

/// A destination that exists is never copied over: the tag keeps the mirror's content. One whose
/// source tag names the same content is skipped; one whose source tag moved to other content
/// gets that content copied beside it, under its digest's own tag.
#[test]
fn once_leaves_an_existing_destination_as_it_is() {
    let source = TestRegistry::start("fill-keep-src").expect("source registry");
    let mirror = TestRegistry::start("fill-keep-mirror").expect("mirror registry");
    let moved = Image::new("new", "linux/amd64").push(&source, "app/web", Some("1"));
    let kept = Image::new("old", "linux/amd64").push(&mirror, "hub/app/web", Some("1"));
    let same = Image::new("api", "linux/amd64");
    same.push(&source, "app/api", Some("1"));
    same.push(&mirror, "hub/app/api", Some("1"));
    let image = format!("{}/app/web:1", source.host);
    let api = format!("{}/app/api:1", source.host);
    let files = Files::new();
    let (pods, settings) = inputs(
        &files,
        &source.host,
        &mirror.host,
        &[("a", &image), ("b", &api)],
    );

    let output = run(&[
        "once",
        "--insecure",
        "--pods",
        &pods,
        "--settings",
        &settings,
    ]);

    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("1 copied, 0 failed, 1 skipped"), "{stdout}");
    assert_eq!(mirror.digest_of("hub/app/web", "1"), Some(kept));
    assert_eq!(
        mirror.digest_of("hub/app/web", &moved.replacen(':', "-", 1)),
        Some(moved)
    );
}

/// Exit statuses: 0 when the source is gone (nothing any run can copy), 1 when a copy failed
/// (the mirror down: the next run tries again), 2 when the run cannot run (settings refused).
#[test]
fn once_exits_0_for_a_gone_source_1_for_a_failed_copy_2_for_bad_settings() {
    let source = TestRegistry::start("fill-status-src").expect("source registry");
    let mut mirror = TestRegistry::start("fill-status-mirror").expect("mirror registry");
    Image::new("web", "linux/amd64").push(&source, "app/web", Some("1"));
    let files = Files::new();
    let gone = format!("{}/app/none:1", source.host);
    let (pods, settings) = inputs(&files, &source.host, &mirror.host, &[("a", &gone)]);
    let output = run(&[
        "once",
        "--insecure",
        "--pods",
        &pods,
        "--settings",
        &settings,
    ]);
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("0 failed, 0 skipped, 1 gone"), "{stdout}");

    let image = format!("{}/app/web:1", source.host);
    let (pods, settings) = inputs(&files, &source.host, &mirror.host, &[("a", &image)]);
    mirror.stop();
    let output = run(&[
        "once",
        "--insecure",
        "--pods",
        &pods,
        "--settings",
        &settings,
    ]);
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("0 copied, 1 failed"), "{stdout}");

    let bad = files.write("bad.json", &json!({"mirrors": [{"source": "docker.io"}]}));
    let output = run(&["once", "--pods", &pods, "--settings", &bad]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("settings"),
        "{}",
        text(&output.stderr)
    );
}

/// A mirror that cannot be asked whether the destination exists (it answers 429, then 500, to
/// the manifest's check, through a relay that passes every other request to the real mirror) is
/// not read as lacking it: the tag exists there with other content, and a copy would move it.
/// The copy fails (exit 1, the next pass asks again) and the tag keeps its digest.
#[test]
fn once_never_copies_over_a_destination_the_mirror_could_not_be_asked_about() {
    let source = TestRegistry::start("fill-unasked-src").expect("source registry");
    let mirror = TestRegistry::start("fill-unasked-mirror").expect("mirror registry");
    Image::new("app 1 moved", "linux/amd64").push(&source, "app/web", Some("1"));
    let kept =
        Image::new("app 1 as mirrored", "linux/amd64").push(&mirror, "hub/app/web", Some("1"));
    let image = format!("{}/app/web:1", source.host);
    let files = Files::new();
    for (code, body) in [
        (
            429,
            r#"{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}"#,
        ),
        (
            500,
            r#"{"errors":[{"code":"UNKNOWN","message":"internal error"}]}"#,
        ),
    ] {
        let (front, stop) =
            rig::front::relay("unasked mirror", &mirror.host, move |method, url| {
                (["GET", "HEAD"].contains(&method) && url.starts_with("/v2/hub/app/web/manifests/"))
                    .then(|| (code, body.to_string()))
            })
            .expect("relay");
        let (pods, settings) = inputs(&files, &source.host, &front, &[("a", &image)]);
        let output = run(&[
            "once",
            "--insecure",
            "--pods",
            &pods,
            "--settings",
            &settings,
        ]);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let stdout = text(&output.stdout);
        let stderr = text(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(1),
            "answered {code}: {stdout}{stderr}"
        );
        assert!(
            stdout.contains("0 copied, 1 failed, 0 skipped"),
            "answered {code}: {stdout}{stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "could not tell whether docker://{front}/hub/app/web:1 exists"
            )),
            "answered {code}: {stderr}"
        );
        assert_eq!(
            mirror.digest_of("hub/app/web", "1"),
            Some(kept.clone()),
            "answered {code}, the mirror's tag moved: {stdout}{stderr}"
        );
    }
}

/// A source registry that answers the copy with 429 as Docker Hub does (`TOOMANYREQUESTS`) or
/// with 503 from a front without an OCI error body is named as throttling (in the watch its
/// copies then wait, `fill_mirror_source_throttled_total`); one that answers 401 is a copy that
/// failed, neither throttling nor gone. The pass fails either way (exit 1), and nothing reaches
/// the mirror. (A 5xx with an OCI error body of another code reaches skopeo's words without its
/// status, and counts as a failed copy.)
#[test]
fn once_names_a_source_answering_429_or_503_as_throttling_and_401_as_a_failure() {
    let source = TestRegistry::start("fill-throttle-src").expect("source registry");
    let mirror = TestRegistry::start("fill-throttle-mirror").expect("mirror registry");
    Image::new("web", "linux/amd64").push(&source, "app/web", Some("1"));
    let files = Files::new();
    for (code, body, throttling) in [
        (
            429,
            r#"{"errors":[{"code":"TOOMANYREQUESTS","message":"You have reached your pull rate limit."}]}"#,
            true,
        ),
        (503, "Service Unavailable", true),
        (
            401,
            r#"{"errors":[{"code":"UNAUTHORIZED","message":"no"}]}"#,
            false,
        ),
    ] {
        let (front, stop) =
            rig::front::relay("refusing source", &source.host, move |method, url| {
                (["GET", "HEAD"].contains(&method) && url.starts_with("/v2/app/web/manifests/"))
                    .then(|| (code, body.to_string()))
            })
            .expect("relay");
        let image = format!("{front}/app/web:1");
        let (pods, settings) = inputs(&files, &front, &mirror.host, &[("a", &image)]);
        let output = run(&[
            "once",
            "--insecure",
            "--pods",
            &pods,
            "--settings",
            &settings,
        ]);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let stdout = text(&output.stdout);
        let stderr = text(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(1),
            "answered {code}: {stdout}{stderr}"
        );
        assert!(
            stdout.contains("0 copied, 1 failed, 0 skipped, 0 gone"),
            "answered {code}: {stdout}{stderr}"
        );
        assert_eq!(
            stderr.contains("the source registry is throttling"),
            throttling,
            "answered {code}: {stderr}"
        );
        assert_eq!(
            mirror.digest_of("hub/app/web", "1"),
            None,
            "answered {code}"
        );
    }
}
