//! What travels with an image, as `fill-mirror once` copies it (skopeo, Debian's
//! `docker-registry` on loopback, the source 20 ms away through the rig's latency proxy): the
//! cosign tags of every digest of an index, the referrers the source serves by the OCI 1.1
//! referrers API or lists by the tag schema, a signature tag that follows its source, no
//! signature copied for a digest the source's tag no longer names (issue #47), and a tag the
//! source moved whose new digest is copied beside the mirror's tag, which never moves.

mod rig;

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use rig::images::{Artifact, Image, Index, OCI_INDEX, OCI_MANIFEST};
use rig::proxy::LatencyProxy;
use rig::referrers::{Guard, ReferrersFront, push_referrer};
use rig::registry::{TestRegistry, basic_auth};
use rig::{pod_recorded_by_hand, run, settings, text, write_json};
use serde_json::{Value, json};

/// The source registry's round trip.
const AWAY: Duration = Duration::from_millis(20);

/// `sha256:<hex>` -> `sha256-<hex>.<suffix>`: cosign's tag for `digest`.
fn cosign_tag(digest: &str, suffix: &str) -> String {
    format!("{}.{suffix}", digest.replacen(':', "-", 1))
}

/// `fill-mirror once --insecure` over `pods`, with settings routing `source` to
/// `mirror/hub`.
fn once(source: &str, mirror: &str, pods: &[Value]) -> Output {
    once_with(source, mirror, pods, None)
}

/// `once`, with `auths` (a docker config's `auths`) as `--auth-file` when given.
fn once_with(source: &str, mirror: &str, pods: &[Value], auths: Option<Value>) -> Output {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = |name: &str| -> PathBuf { dir.path().join(name) };
    write_json(&path("pods.json"), &json!({"items": pods}));
    write_json(&path("settings.json"), &settings(source, mirror));
    let mut args = vec![
        "once".to_string(),
        "--insecure".to_string(),
        "--pods".to_string(),
        path("pods.json").display().to_string(),
        "--settings".to_string(),
        path("settings.json").display().to_string(),
    ];
    if let Some(auths) = auths {
        write_json(&path("auth.json"), &json!({ "auths": auths }));
        args.push("--auth-file".to_string());
        args.push(path("auth.json").display().to_string());
        // The source's login, for the namespace of the Pods that ask.
        args.push("--source-namespaces".to_string());
        args.push(format!("{source}=default"));
    }
    run(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// A Pod of `image` (under `source`), recorded as lacking it: the record written by hand, its
/// copy to the same path under `mirror/hub`.
fn pod(image: &str, source: &str, mirror: &str) -> Value {
    let path = image
        .strip_prefix(&format!("{source}/"))
        .expect("an image under the source");
    pod_recorded_by_hand("p", image, &format!("{mirror}/hub/{path}"))
}

fn succeeded(output: &Output) -> String {
    let both = format!("{}{}", text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{both}");
    both
}

#[test]
fn every_digest_of_an_index_brings_its_cosign_tags() {
    let source = TestRegistry::start("att-tags-src").expect("source registry");
    let mirror = TestRegistry::start("att-tags-mirror").expect("mirror registry");
    let far = LatencyProxy::network(&source.host, AWAY).expect("latency proxy");
    let index = Index::new(vec![
        Image::new("web", "linux/amd64"),
        Image::new("web", "linux/arm64"),
    ]);
    let digest = index.push(&source, "app/web", "1");
    let amd64 = index.images[0].digest();
    let tags = [
        cosign_tag(&digest, "sig"),
        cosign_tag(&digest, "att"),
        cosign_tag(&digest, "sbom"),
        cosign_tag(&amd64, "sig"),
    ];
    for tag in &tags {
        Artifact::new(tag).push(&source, "app/web", tag);
    }
    let image = format!("{}/app/web:1", far.host);

    let output = once(
        &far.host,
        &mirror.host,
        &[pod(&image, &far.host, &mirror.host)],
    );

    succeeded(&output);
    assert_eq!(mirror.digest_of("hub/app/web", "1"), Some(digest.clone()));
    for platform in &index.images {
        assert_eq!(
            mirror.digest_of("hub/app/web", &platform.digest()),
            Some(platform.digest())
        );
    }
    for tag in &tags {
        let at_source = source.digest_of("app/web", tag);
        assert!(at_source.is_some(), "the source has {tag}");
        assert_eq!(mirror.digest_of("hub/app/web", tag), at_source, "{tag}");
    }
    let arm64_sig = cosign_tag(&index.images[1].digest(), "sig");
    assert_eq!(mirror.digest_of("hub/app/web", &arm64_sig), None);
}

/// The mirror holds the image already (never copied over) and an older signature of its
/// digest: the signature tag is copied over from the source, the image tag is not.
#[test]
fn a_signature_tag_follows_its_source_and_the_image_tag_stays() {
    let source = TestRegistry::start("att-follow-src").expect("source registry");
    let mirror = TestRegistry::start("att-follow-mirror").expect("mirror registry");
    let far = LatencyProxy::network(&source.host, AWAY).expect("latency proxy");
    let web = Image::new("web", "linux/amd64");
    let digest = web.push(&source, "app/web", Some("1"));
    web.push(&mirror, "hub/app/web", Some("1"));
    let sig = cosign_tag(&digest, "sig");
    let resigned = Artifact::new("signature after a key rotation").push(&source, "app/web", &sig);
    let stale = Artifact::new("signature before it").push(&mirror, "hub/app/web", &sig);
    assert_ne!(resigned, stale);
    let image = format!("{}/app/web:1", far.host);

    let output = once(
        &far.host,
        &mirror.host,
        &[pod(&image, &far.host, &mirror.host)],
    );

    let words = succeeded(&output);
    assert!(words.contains("1 copied, 0 failed, 1 skipped"), "{words}");
    assert_eq!(mirror.digest_of("hub/app/web", &sig), Some(resigned));
    assert_eq!(mirror.digest_of("hub/app/web", "1"), Some(digest));
}

/// The source serves the referrers API (the rig's front, over Debian's registry, one referrer
/// per page): its referrers, untagged, are copied by digest, every page of them, and the
/// mirror, serving the API too, lists them by their `subject`.
#[test]
fn referrers_the_source_serves_by_the_api_are_copied_and_listed_at_the_mirror() {
    let source = TestRegistry::start("att-api-src").expect("source registry");
    let mirror = TestRegistry::start("att-api-mirror").expect("mirror registry");
    let source_front = ReferrersFront::start(&source).expect("source front");
    let mirror_front = ReferrersFront::start(&mirror).expect("mirror front");
    let far = LatencyProxy::network(&source_front.host, AWAY).expect("latency proxy");
    let web = Image::new("web", "linux/amd64");
    let digest = web.push(&source, "app/web", Some("1"));
    let sbom = push_referrer(
        &source,
        "app/web",
        "application/spdx+json",
        "sbom of web",
        (&web.manifest, OCI_MANIFEST),
    );
    let provenance = push_referrer(
        &source,
        "app/web",
        "application/vnd.in-toto+json",
        "provenance of web",
        (&web.manifest, OCI_MANIFEST),
    );
    let mut both = vec![sbom.clone(), provenance.clone()];
    both.sort();
    assert_eq!(
        source_front
            .referrers("app/web", &digest)
            .expect("source lists"),
        both,
        "one page each"
    );
    let image = format!("{}/app/web:1", far.host);

    let output = once(
        &far.host,
        &mirror_front.host,
        &[pod(&image, &far.host, &mirror_front.host)],
    );

    succeeded(&output);
    assert_eq!(mirror.digest_of("hub/app/web", "1"), Some(digest.clone()));
    for referrer in &both {
        assert_eq!(
            mirror.digest_of("hub/app/web", referrer),
            Some(referrer.clone()),
            "copied by digest"
        );
    }
    assert_eq!(
        mirror_front
            .referrers("hub/app/web", &digest)
            .expect("mirror lists"),
        both
    );
}

/// A private source (Debian's registry with htpasswd) whose referrers API asks for the same
/// credentials, by Basic as distribution does or by a Bearer token its realm gives only for
/// them: the referrers request carries the login skopeo gets from the auth file, and the
/// referrer is copied.
#[rstest::rstest]
#[case::basic(false)]
#[case::bearer_token_for_the_credentials(true)]
fn a_private_source_s_referrers_are_read_with_its_login(#[case] bearer: bool) {
    let source = TestRegistry::start_with_basic_auth("att-private-src", "puller", "pull-token")
        .expect("source registry");
    let mirror = TestRegistry::start("att-private-mirror").expect("mirror registry");
    let login = basic_auth("puller", "pull-token");
    let auth = login.trim_start_matches("Basic ").to_string();
    let guard = if bearer {
        Guard::Bearer(auth.clone())
    } else {
        Guard::Basic(auth.clone())
    };
    let front = ReferrersFront::start_guarded(&source, guard).expect("source front");
    let far = LatencyProxy::network(&front.host, AWAY).expect("latency proxy");
    let web = Image::new("private web", "linux/amd64");
    let digest = web.push(&source, "app/web", Some("1"));
    let sbom = push_referrer(
        &source,
        "app/web",
        "application/spdx+json",
        "sbom of the private web",
        (&web.manifest, OCI_MANIFEST),
    );
    let image = format!("{}/app/web:1", far.host);

    let output = once_with(
        &far.host,
        &mirror.host,
        &[pod(&image, &far.host, &mirror.host)],
        Some(json!({ far.host.clone(): { "auth": auth } })),
    );

    succeeded(&output);
    assert_eq!(mirror.digest_of("hub/app/web", "1"), Some(digest));
    assert_eq!(
        mirror.digest_of("hub/app/web", &sbom),
        Some(sbom.clone()),
        "the private source's referrer, copied by digest"
    );
}

/// A listener that records the head of every request it gets and answers an empty referrers
/// index: a host a registry's `Link` could send the controller to.
fn recording_listener() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let origin = format!("http://{}", listener.local_addr().expect("address"));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorded = seen.clone();
    std::thread::spawn(move || {
        for mut client in listener.incoming().flatten() {
            let mut head = [0u8; 8192];
            let n = client.read(&mut head).unwrap_or(0);
            if let Ok(mut seen) = recorded.lock() {
                seen.push(String::from_utf8_lossy(&head[..n]).into_owned());
            }
            let body = format!(r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[]}}"#);
            let _ = write!(
                client,
                "HTTP/1.1 200 OK\r\nContent-Type: {OCI_INDEX}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (origin, seen)
}

/// A private source whose referrers API pages with a `Link` to another host (plain HTTP): the
/// controller does not follow it, so the token its realm gave never leaves the registry, and
/// the copy says why its referrers were not read.
#[test]
fn a_next_page_on_another_host_is_not_followed_with_the_credentials() {
    let source = TestRegistry::start_with_basic_auth("att-link-src", "puller", "pull-token")
        .expect("source registry");
    let mirror = TestRegistry::start("att-link-mirror").expect("mirror registry");
    let auth = basic_auth("puller", "pull-token")
        .trim_start_matches("Basic ")
        .to_string();
    let (elsewhere, seen) = recording_listener();
    let front = ReferrersFront::start_paging(
        &source,
        Guard::Bearer(auth.clone()),
        Some(elsewhere.clone()),
    )
    .expect("source front");
    let far = LatencyProxy::network(&front.host, AWAY).expect("latency proxy");
    let web = Image::new("private web, paged", "linux/amd64");
    web.push(&source, "app/web", Some("1"));
    for (kind, content) in [
        ("application/spdx+json", "sbom"),
        ("application/vnd.in-toto+json", "provenance"),
    ] {
        push_referrer(
            &source,
            "app/web",
            kind,
            content,
            (&web.manifest, OCI_MANIFEST),
        );
    }
    let image = format!("{}/app/web:1", far.host);

    let output = once_with(
        &far.host,
        &mirror.host,
        &[pod(&image, &far.host, &mirror.host)],
        Some(json!({ far.host.clone(): { "auth": auth } })),
    );

    let both = format!("{}{}", text(&output.stdout), text(&output.stderr));
    let requests = seen.lock().map(|seen| seen.clone()).unwrap_or_default();
    assert!(
        requests.is_empty(),
        "the other host was asked: {requests:?}\n{both}"
    );
    assert!(
        both.contains(&format!("names another origin than http://{}", far.host))
            && both.contains(&elsewhere),
        "{both}"
    );
}

/// A source without the referrers API (Debian's registry answers 404): the tag schema's
/// index (`sha256-<hex>`) is read, and only the manifests whose `subject` is the image are
/// copied; the mirror's `sha256-<hex>` tag, a pinned image's own tag there, is not written.
#[test]
fn a_referrer_listed_by_the_tag_schema_is_copied_and_nothing_else_it_lists() {
    let source = TestRegistry::start("att-schema-src").expect("source registry");
    let mirror = TestRegistry::start("att-schema-mirror").expect("mirror registry");
    let far = LatencyProxy::network(&source.host, AWAY).expect("latency proxy");
    let web = Image::new("web", "linux/amd64");
    let digest = web.push(&source, "app/web", Some("1"));
    let sbom = push_referrer(
        &source,
        "app/web",
        "application/spdx+json",
        "sbom of web",
        (&web.manifest, OCI_MANIFEST),
    );
    let unrelated = Image::new("not a referrer", "linux/amd64");
    let unrelated_digest = unrelated.push(&source, "app/web", None);
    let schema_tag = digest.replacen(':', "-", 1);
    let listing = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": sbom, "size": 1, "artifactType": "application/spdx+json"},
            {"mediaType": OCI_MANIFEST, "digest": unrelated_digest, "size": unrelated.manifest.len()},
        ],
    }))
    .expect("index JSON");
    source
        .push_manifest("app/web", &schema_tag, OCI_INDEX, &listing)
        .expect("push the tag schema's index");
    let image = format!("{}/app/web:1", far.host);

    let output = once(
        &far.host,
        &mirror.host,
        &[pod(&image, &far.host, &mirror.host)],
    );

    succeeded(&output);
    assert_eq!(mirror.digest_of("hub/app/web", &sbom), Some(sbom.clone()));
    assert_eq!(mirror.digest_of("hub/app/web", &unrelated_digest), None);
    assert_eq!(mirror.digest_of("hub/app/web", &schema_tag), None);
}

/// The record was written when the source's tag named D_old (its signature copy names
/// D_old's `.sig`); the publisher has moved the tag to D_new since. D_old's signature is not
/// copied (refused, naming both digests); the image copied is D_new, with its own signature.
#[test]
fn the_signature_of_a_digest_the_source_tag_no_longer_names_is_not_copied() {
    let source = TestRegistry::start("att-moved-src").expect("source registry");
    let mirror = TestRegistry::start("att-moved-mirror").expect("mirror registry");
    let far = LatencyProxy::network(&source.host, AWAY).expect("latency proxy");
    let old = Image::new("web build 1", "linux/amd64");
    let old_digest = old.push(&source, "app/web", Some("1"));
    let old_sig = cosign_tag(&old_digest, "sig");
    Artifact::new("signature of build 1").push(&source, "app/web", &old_sig);
    let image = format!("{}/app/web:1", far.host);
    let mut recorded = pod(&image, &far.host, &mirror.host);
    let annotation = "/metadata/annotations/image-swapper.kubewarden.io~1unmirrored-images";
    let mut record: Value = serde_json::from_str(
        recorded
            .pointer(annotation)
            .and_then(Value::as_str)
            .expect("the policy wrote a record"),
    )
    .expect("record JSON");
    record["c0"]["signatureCopy"] = json!(format!(
        "skopeo copy --all --preserve-digests docker://{}/app/web:{old_sig} docker://{}/hub/app/web:{old_sig}",
        far.host, mirror.host
    ));
    *recorded.pointer_mut(annotation).expect("annotation") = json!(record.to_string());
    let new = Image::new("web build 2", "linux/amd64");
    let new_digest = new.push(&source, "app/web", Some("1"));
    let new_sig = cosign_tag(&new_digest, "sig");
    Artifact::new("signature of build 2").push(&source, "app/web", &new_sig);

    let output = once(&far.host, &mirror.host, &[recorded]);

    let words = succeeded(&output);
    assert_eq!(mirror.digest_of("hub/app/web", &old_sig), None, "{words}");
    assert!(words.contains("1 refused"), "{words}");
    assert!(
        words.contains(&old_digest) && words.contains(&new_digest),
        "the refusal names both digests: {words}"
    );
    assert_eq!(mirror.digest_of("hub/app/web", "1"), Some(new_digest));
    assert_eq!(
        mirror.digest_of("hub/app/web", &new_sig),
        source.digest_of("app/web", &new_sig)
    );
}

/// The mirror's tag holds D_old (copied before the publisher moved the source's tag) and a
/// Pod is recorded for it (the policy verified D_new at the source and found no copy of it):
/// the mirror's tag is not moved, D_new is copied beside it under its own tag `sha256-<hex>`
/// with its signature, which the policy finds by digest (`<repository>@D_new`) and swaps the
/// next Pod to; nothing signed for D_old is carried, and the copy is not `present`.
#[test]
fn a_moved_source_tag_is_copied_beside_the_mirror_tag_with_its_signature() {
    let source = TestRegistry::start("att-moved-tag-src").expect("source registry");
    let mirror = TestRegistry::start("att-moved-tag-mirror").expect("mirror registry");
    let far = LatencyProxy::network(&source.host, AWAY).expect("latency proxy");
    let old = Image::new("web build 1", "linux/amd64");
    let old_digest = old.push(&source, "app/web", Some("1"));
    old.push(&mirror, "hub/app/web", Some("1"));
    let old_sig = cosign_tag(&old_digest, "sig");
    Artifact::new("signature of build 1").push(&source, "app/web", &old_sig);
    let new_digest = Image::new("web build 2", "linux/amd64").push(&source, "app/web", Some("1"));
    let new_sig = cosign_tag(&new_digest, "sig");
    Artifact::new("signature of build 2").push(&source, "app/web", &new_sig);
    let image = format!("{}/app/web:1", far.host);

    let output = once(
        &far.host,
        &mirror.host,
        &[pod(&image, &far.host, &mirror.host)],
    );

    let words = succeeded(&output);
    let beside = new_digest.replacen(':', "-", 1);
    assert_eq!(
        mirror.digest_of("hub/app/web", &new_digest).as_deref(),
        Some(new_digest.as_str()),
        "the mirror holds no copy of the digest the source's tag names now: {words}"
    );
    assert_eq!(
        mirror.digest_of("hub/app/web", &beside).as_deref(),
        Some(new_digest.as_str()),
        "{words}"
    );
    assert_eq!(
        mirror.digest_of("hub/app/web", "1"),
        Some(old_digest.clone()),
        "the mirror's image tag moved"
    );
    assert_eq!(
        mirror.digest_of("hub/app/web", &new_sig),
        source.digest_of("app/web", &new_sig),
        "{words}"
    );
    assert_eq!(mirror.digest_of("hub/app/web", &old_sig), None, "{words}");
    assert!(
        words.contains("2 copied, 0 failed, 0 skipped") && words.contains(&old_digest),
        "{words}"
    );
}

/// The mirror's tag holds D_old (copied before the publisher moved the source's tag; never
/// copied over): nothing signed for D_old is carried to it from the source.
#[test]
fn nothing_signed_is_carried_to_a_mirror_tag_the_source_has_moved_from() {
    let source = TestRegistry::start("att-drift-src").expect("source registry");
    let mirror = TestRegistry::start("att-drift-mirror").expect("mirror registry");
    let far = LatencyProxy::network(&source.host, AWAY).expect("latency proxy");
    let old = Image::new("web build 1", "linux/amd64");
    let old_digest = old.push(&source, "app/web", Some("1"));
    old.push(&mirror, "hub/app/web", Some("1"));
    let old_sig = cosign_tag(&old_digest, "sig");
    Artifact::new("signature of build 1").push(&source, "app/web", &old_sig);
    let new_digest = Image::new("web build 2", "linux/amd64").push(&source, "app/web", Some("1"));
    let image = format!("{}/app/web:1", far.host);

    let output = once(
        &far.host,
        &mirror.host,
        &[pod(&image, &far.host, &mirror.host)],
    );

    let words = succeeded(&output);
    assert_eq!(
        mirror.digest_of("hub/app/web", "1"),
        Some(old_digest.clone())
    );
    assert_eq!(mirror.digest_of("hub/app/web", &old_sig), None, "{words}");
    assert!(
        words.contains(&old_digest) && words.contains(&new_digest),
        "the line names both digests: {words}"
    );
}
