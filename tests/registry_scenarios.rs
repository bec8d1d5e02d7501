//! The built policy module, in a real wasm runtime, against a real registry on loopback.

mod rig;

use std::time::Duration;

use rig::hosts::{LiveHost, PolicyServer};
use rig::images::Image;
use rig::registry::TestRegistry;
use rig::{pod_request, shared, validate, validate_settings};
use serde_json::{Value, json};

const REPOSITORY: &str = "dockerhub/library/nginx";

fn settings(mirror: &TestRegistry, extra: Value) -> Value {
    let mut settings = json!({"mirrors": [{"source": "docker.io", "target": format!("{}/dockerhub", mirror.host)}]});
    if let (Some(settings), Some(extra)) = (settings.as_object_mut(), extra.as_object()) {
        settings.extend(extra.clone());
    }
    settings
}

fn one_container(image: &str) -> Value {
    pod_request(
        "CREATE",
        json!({"containers": [{"name": "web", "image": image}]}),
    )
}

#[test]
fn mirror_holding_the_tag_gets_the_pod_pinned_to_its_digest() {
    let mirror = TestRegistry::start("tag").expect("registry");
    let digest = Image::new("nginx 1.27", "linux/amd64").push(&mirror, REPOSITORY, Some("1.27"));
    let host = shared(LiveHost::default());
    let response = validate(
        &settings(&mirror, json!({})),
        &one_container("nginx:1.27"),
        host.clone(),
    );
    assert!(response.accepted);
    assert_eq!(
        response.image("containers", 0),
        Some(format!("{}/{REPOSITORY}:1.27@{digest}", mirror.host).as_str())
    );
    assert_eq!(host.lock().unwrap().exchanges.len(), 1);
}

/// The motivating case, through one policy-server process (its 60-second cache of successful
/// lookups, keyed by the image string): a lifecycle rule prunes the mirror right after a swap.
/// For up to a minute the host answers from its cache and the Pod is still swapped: that is the
/// policy's whole staleness window, which the README states. Once the entry expires, the next
/// admission, with nothing restarted, keeps the original image instead of sending the node to a
/// missing one; failures are never cached, so a refill is seen at the very next admission.
#[test]
fn pruned_mirror_falls_back_once_the_hosts_cache_expires_and_recovers_when_refilled() {
    let mirror = TestRegistry::start("prune").expect("registry");
    let image = Image::new("nginx 1.27", "linux/amd64");
    let digest = image.push(&mirror, REPOSITORY, Some("1.27"));
    let settings = settings(&mirror, json!({}));
    let request = one_container("nginx:1.27");
    let server = PolicyServer::new(LiveHost::default());
    let swapped = format!("{}/{REPOSITORY}:1.27@{digest}", mirror.host);

    let first = validate(&settings, &request, server.evaluation());
    assert_eq!(first.image("containers", 0), Some(swapped.as_str()));
    assert_eq!(
        first.audit["swapped"],
        json!([{"container": "web", "from": "nginx:1.27", "to": swapped}])
    );

    mirror.delete_manifest(REPOSITORY, &digest).expect("prune");
    server.advance(Duration::from_secs(59));
    let within_a_minute = validate(&settings, &request, server.evaluation());
    assert_eq!(
        within_a_minute.image("containers", 0),
        Some(swapped.as_str()),
        "59 s after the lookup, the host answers from its cache: swapped to the pruned image"
    );
    assert_eq!(server.host().exchanges.len(), 1, "answered from the cache");

    server.advance(Duration::from_secs(1));
    // The host now runs with RUST_BACKTRACE=1: its texts carry a cause list and a backtrace.
    server.host().backtrace = true;
    let after_prune = validate(&settings, &request, server.evaluation());
    assert!(after_prune.accepted);
    assert_eq!(
        after_prune.image("containers", 0),
        Some("nginx:1.27"),
        "the original image stays"
    );
    // ...and the Pod says which image the mirror lacks, for the fill job.
    assert_eq!(
        after_prune.unmirrored(),
        Some(json!({"web": {
            "source": "nginx:1.27",
            "mirror": format!("{}/{REPOSITORY}:1.27", mirror.host),
            "copy": format!("skopeo copy --all --preserve-digests docker://docker.io/library/nginx:1.27 docker://{}/{REPOSITORY}:1.27", mirror.host),
        }}))
    );
    assert_eq!(
        after_prune.warnings,
        [format!(
            "image \"nginx:1.27\": kept, not swapped to \"{}/{REPOSITORY}:1.27\": the mirror does not have it (registry: manifest unknown)",
            mirror.host
        )],
        "one line, the registry's words once, no backtrace"
    );
    assert_eq!(
        after_prune.audit["kept"],
        json!([{"image": "nginx:1.27", "reason": "absent"}])
    );
    server.host().backtrace = false;

    image.push(&mirror, REPOSITORY, Some("1.27"));
    let refilled = validate(&settings, &request, server.evaluation());
    assert_eq!(refilled.image("containers", 0), Some(swapped.as_str()));
    assert_eq!(
        server.host().exchanges.len(),
        3,
        "the first lookup, the one after the cache expired (a failure, not cached), the refill's"
    );
}

#[test]
fn digest_references_are_swapped_only_when_the_mirror_has_that_digest() {
    let mirror = TestRegistry::start("digest").expect("registry");
    let present = Image::new("present", "linux/amd64");
    let present_digest = present.push(&mirror, REPOSITORY, None);
    let absent_digest = Image::new("absent", "linux/amd64").digest();
    let host = shared(LiveHost::default());

    let found = validate(
        &settings(&mirror, json!({})),
        &one_container(&format!("nginx:1.27@{present_digest}")),
        host.clone(),
    );
    assert_eq!(
        found.image("containers", 0),
        Some(format!("{}/{REPOSITORY}:1.27@{present_digest}", mirror.host).as_str())
    );

    let request = one_container(&format!("nginx@{absent_digest}"));
    let kept = validate(&settings(&mirror, json!({})), &request, host.clone());
    assert!(kept.accepted && kept.images_unchanged(&request), "{kept:?}");
    assert!(kept.warned(&absent_digest), "{:?}", kept.warnings);

    let rejected = validate(
        &settings(&mirror, json!({"onMissing": "reject"})),
        &request,
        host.clone(),
    );
    assert!(!rejected.accepted);
    let message = rejected.message.expect("a rejection message");
    assert!(
        message.contains(&format!("nginx@{absent_digest}"))
            && message.contains("onMissing is reject"),
        "{message}"
    );

    // A real registry answers a digest lookup with that digest or not at all; a mirror that
    // answers another one (a broken cache, a front that resolves references its own way) does
    // not hold the image asked for, however it answers.
    let (lying, stop) = answering_another_manifest(&mirror, &present_digest);
    let request = one_container(&format!("nginx:1.27@{absent_digest}"));
    let other = validate(
        &json!({"mirrors": [{"source": "docker.io", "target": format!("{lying}/dockerhub")}]}),
        &request,
        shared(LiveHost::default()),
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        other.accepted && other.images_unchanged(&request),
        "not swapped to a digest the mirror does not serve: {other:?}"
    );
    assert!(
        other.warned(&format!(
            "could not verify it: the mirror answered digest {present_digest} for it"
        )),
        "{:?}",
        other.warnings
    );
}

/// A front of `registry` that answers every manifest request with the manifest `reference`
/// names, whatever reference was asked: a lookup by digest gets another digest.
fn answering_another_manifest(
    registry: &TestRegistry,
    reference: &str,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let upstream = registry.host.clone();
    let reference = reference.to_string();
    rig::front::serve("lying front", move |request| {
        let url = request.url().to_string();
        let url = match url.rsplit_once("/manifests/") {
            Some((repository, _)) => format!("{repository}/manifests/{reference}"),
            None => url,
        };
        let answer = ureq::request(request.method().as_str(), &format!("http://{upstream}{url}"))
            .set("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.v2+json")
            .call();
        let response = match answer {
            Ok(response) | Err(ureq::Error::Status(_, response)) => response,
            Err(_) => return,
        };
        let status = response.status();
        let headers: Vec<tiny_http::Header> = ["Docker-Content-Digest", "Content-Type"]
            .into_iter()
            .filter_map(|name| tiny_http::Header::from_bytes(name, response.header(name)?).ok())
            .collect();
        let mut body = Vec::new();
        let _ = std::io::Read::read_to_end(&mut response.into_reader(), &mut body);
        let length = body.len();
        let reply = tiny_http::Response::new(
            status.into(),
            headers,
            std::io::Cursor::new(body),
            Some(length),
            None,
        );
        let _ = request.respond(reply);
    })
    .expect("front")
}

#[test]
fn mirror_down_follows_on_lookup_error_and_swaps_nothing() {
    let mut mirror = TestRegistry::start("down").expect("registry");
    Image::new("nginx", "linux/amd64").push(&mirror, REPOSITORY, Some("1.27"));
    mirror.stop();
    let request = one_container("nginx:1.27");
    let host = shared(LiveHost::default());
    let refused = format!(
        "could not look it up (error sending request for url (http://{}/v2/{REPOSITORY}/manifests/1.27): Connection refused (os error 111))",
        mirror.host
    );

    let kept = validate(
        &settings(&mirror, json!({"onMissing": "reject"})),
        &request,
        host.clone(),
    );
    assert!(
        kept.accepted && kept.mutated.is_none(),
        "an outage is not a missing image"
    );
    assert!(kept.warned(&refused), "{:?}", kept.warnings);

    host.lock().unwrap().backtrace = true;
    let rejected = validate(
        &settings(&mirror, json!({"onLookupError": "reject"})),
        &request,
        host.clone(),
    );
    assert!(!rejected.accepted && rejected.mutated.is_none());
    let message = rejected.message.clone().unwrap_or_default();
    assert!(
        message.ends_with(&format!("{refused}; onLookupError is reject")),
        "{message:?}"
    );
    assert!(!message.contains('\n') && !message.contains("backtrace"));
    assert_eq!(
        rejected.audit["rejected"],
        json!([{"image": "nginx:1.27", "reason": "lookup-error"}])
    );

    mirror.resume().expect("registry back");
    let recovered = validate(&settings(&mirror, json!({})), &request, host.clone());
    assert!(
        recovered
            .image("containers", 0)
            .is_some_and(|i| i.starts_with(&mirror.host))
    );
}

#[test]
fn one_lookup_per_distinct_image_in_container_order() {
    let mirror = TestRegistry::start("count").expect("registry");
    Image::new("nginx", "linux/amd64").push(&mirror, REPOSITORY, Some("1.27"));
    Image::new("redis", "linux/amd64").push(&mirror, "dockerhub/library/redis", Some("7"));
    Image::new("busybox", "linux/amd64").push(&mirror, "dockerhub/library/busybox", Some("1.36"));
    // The init containers first name an image no container names: were the lists looked up in
    // another order, the lookups would come in another order (busybox, redis, nginx).
    let spec = json!({
        "initContainers": [{"name": "init", "image": "busybox:1.36"}, {"name": "cache-init", "image": "redis:7"}],
        "containers": [
            {"name": "a", "image": "nginx:1.27"}, {"name": "b", "image": "nginx:1.27"}, {"name": "c", "image": "redis:7"}
        ],
    });
    let host = shared(LiveHost::default());
    let response = validate(
        &settings(&mirror, json!({})),
        &pod_request("CREATE", spec),
        host.clone(),
    );
    for (list, index) in [
        ("containers", 0),
        ("containers", 1),
        ("containers", 2),
        ("initContainers", 0),
        ("initContainers", 1),
    ] {
        assert!(
            response
                .image(list, index)
                .is_some_and(|i| i.starts_with(&mirror.host)),
            "{list}[{index}]"
        );
    }
    let lookups = host.lock().unwrap().lookups();
    assert_eq!(
        lookups,
        [
            format!("OciManifestDigest {}/{REPOSITORY}:1.27", mirror.host),
            format!(
                "OciManifestDigest {}/dockerhub/library/redis:7",
                mirror.host
            ),
            format!(
                "OciManifestDigest {}/dockerhub/library/busybox:1.36",
                mirror.host
            ),
        ]
    );
}

#[test]
fn label_only_update_looks_nothing_up_and_patches_nothing() {
    let mirror = TestRegistry::start("update").expect("registry");
    let mut request = pod_request(
        "UPDATE",
        json!({"containers": [{"name": "web", "image": "nginx:1.27"}]}),
    );
    request["oldObject"] = request["object"].clone();
    request["object"]["metadata"]["labels"] = json!({"team": "a"});
    let host = shared(LiveHost::default());
    let response = validate(&settings(&mirror, json!({})), &request, host.clone());
    assert!(response.accepted && response.mutated.is_none() && response.warnings.is_empty());
    assert!(host.lock().unwrap().exchanges.is_empty());
}

#[test]
fn invalid_settings_are_refused_with_the_field_and_value() {
    for (settings, message) in [
        (
            json!({"mirrors": [{"source": "docker.io", "target": "mirror/hub"}]}),
            "mirrors[0].target: \"mirror/hub\": \"mirror\" is not a registry host",
        ),
        (
            json!({"mirrors": [], "onMissing": "drop"}),
            "onMissing: unknown variant `drop`, expected `keep` or `reject`",
        ),
        (
            json!({"defaultMirror": {"registry": "m.io"}, "exclud": []}),
            "exclud: unknown field `exclud`",
        ),
        (json!({}), "mirrors: no mirror is configured"),
        (
            json!({"mirrors": [
                {"source": "docker.io", "target": "mirror.example.com/hub"},
                {"source": "quay.io", "target": "mirror.example.com/hub"}
            ]}),
            "mirrors[1].target: \"mirror.example.com/hub\" is also the target of mirrors[0], so two images would share one mirror image",
        ),
        (
            json!({"mirrors": [{"source": "Quay.io", "target": "m.io/q"}]}),
            "mirrors[0].source: \"Quay.io\": registry host \"Quay.io\" has upper-case letters",
        ),
    ] {
        let (valid, answer) = validate_settings(&settings);
        assert!(!valid, "{settings}");
        let answer = answer.expect("a message");
        assert!(
            answer.starts_with(message),
            "{answer:?} should start with {message:?}"
        );
    }
    assert_eq!(
        validate_settings(&json!({"defaultMirror": {"registry": "m.io/cache"}})),
        (true, None)
    );
}

/// The rig's host writes what kwctl 1.31 wrote against a distribution registry on loopback
/// (KUBEWARDEN.md, recorded live), whole: first line and `Caused by:` list, with the backtrace
/// appended in `RUST_BACKTRACE=1` mode.
#[test]
fn the_rig_host_writes_the_real_hosts_whole_error_texts() {
    use rig::hosts::BACKTRACE;
    use rig::wapc::Host;
    let mut registry = TestRegistry::start("texts").expect("registry");
    let image = json!(format!("{}/up/library/nope:1.0", registry.host)).to_string();
    let ask = |backtrace: bool| {
        let mut host = LiveHost {
            backtrace,
            // kwctl 1.31's shape, whatever RIG_POLICY_SERVER says (1.38's: tests/host_texts.rs).
            error_shape: rig::hosts::ErrorShape::Debug,
            ..LiveHost::default()
        };
        let payload = image.clone();
        host.call(
            "kubewarden",
            "oci",
            "v1/manifest_digest",
            payload.as_bytes(),
        )
        .expect_err("no such image")
    };
    let url = format!("http://{}/v2/up/library/nope/manifests/1.0", registry.host);
    let absent = format!(
        "Fail to interact with OCI registry: Registry error: url {url}, envelope: OCI API errors: [OCI API error: manifest unknown]\n\nCaused by:\n    Registry error: url {url}, envelope: OCI API errors: [OCI API error: manifest unknown]"
    );
    assert_eq!(ask(false), absent);
    assert_eq!(ask(true), format!("{absent}{BACKTRACE}"));
    registry.stop();
    assert_eq!(
        ask(false),
        format!(
            "Fail to interact with OCI registry: error sending request for url ({url})\n\nCaused by:\n    0: error sending request for url ({url})\n    1: client error (Connect)\n    2: tcp connect error\n    3: Connection refused (os error 111)"
        )
    );
}

/// Time to mirror, at the Pod: created while the mirror lacks its image, the Pod is kept and
/// records the copy that fills it; an UPDATE that changes no image (a label) keeps the record
/// as it is, with no patch; `kubectl set image` (an UPDATE) to an image the mirror holds swaps
/// it and removes the record, label and all.
#[test]
fn an_update_that_swaps_a_recorded_container_removes_its_record() {
    let mirror = TestRegistry::start("record").expect("registry");
    let settings = settings(&mirror, json!({}));
    let created = one_container("nginx:1.28");
    let kept = validate(&settings, &created, shared(LiveHost::default()));
    let entry = kept.unmirrored().expect("recorded")["web"].clone();
    assert_eq!(
        entry["copy"],
        json!(format!(
            "skopeo copy --all --preserve-digests docker://docker.io/library/nginx:1.28 docker://{}/{REPOSITORY}:1.28",
            mirror.host
        ))
    );
    let running = kept.mutated.expect("the record is a patch");

    let mut relabelled = one_container("nginx:1.28");
    relabelled["operation"] = json!("UPDATE");
    relabelled["oldObject"] = running.clone();
    relabelled["object"] = running.clone();
    relabelled["object"]["metadata"]["labels"]["tier"] = json!("web");
    let unchanged = validate(&settings, &relabelled, shared(LiveHost::default()));
    assert!(
        unchanged.accepted && unchanged.mutated.is_none(),
        "{unchanged:?}"
    );

    let mut set_image = relabelled.clone();
    set_image["oldObject"] = relabelled["object"].clone();
    set_image["object"]["spec"]["containers"][0]["image"] = json!("nginx:1.28-alpine");
    Image::new("nginx 1.28 alpine", "linux/amd64").push(&mirror, REPOSITORY, Some("1.28-alpine"));
    let swapped = validate(&settings, &set_image, shared(LiveHost::default()));
    assert!(
        swapped.image("containers", 0).is_some_and(
            |i| i.starts_with(&format!("{}/{REPOSITORY}:1.28-alpine@sha256:", mirror.host))
        ),
        "{swapped:?}"
    );
    assert_eq!(swapped.unmirrored(), None);
    let pod = swapped.mutated.expect("swapped");
    assert_eq!(pod["metadata"]["labels"], json!({"tier": "web"}), "{pod}");
    assert!(
        pod["metadata"]["annotations"]
            .get("image-swapper.kubewarden.io/unmirrored-images")
            .is_none(),
        "{pod}"
    );
}

/// Time to mirror, once filled: the fill job, having copied a kept Pod's images, drops their
/// entries with one update (the watch mode's patch: the entries it filled taken out of the
/// annotation, and the label with the last one). From a username in `fillJobUsernames` the
/// policy lets them go, so the label the kept-Pods alert counts goes with the last entry; the
/// same update from anyone else gets the whole record back.
#[test]
fn the_fill_jobs_update_clears_the_record_and_no_one_elses_does() {
    const ANNOTATION: &str = "image-swapper.kubewarden.io/unmirrored-images";
    const LABEL: &str = "image-swapper.kubewarden.io/unmirrored";
    let mirror = TestRegistry::start("filled").expect("registry");
    let fill_job = "system:serviceaccount:kubewarden:fill-mirror";
    let settings = settings(&mirror, json!({"fillJobUsernames": [fill_job]}));
    let spec = json!({"containers": [
        {"name": "web", "image": "nginx:1.28"},
        {"name": "side", "image": "busybox:1.37"},
    ]});
    let kept = validate(
        &settings,
        &pod_request("CREATE", spec),
        shared(LiveHost::default()),
    );
    let record = kept.unmirrored().expect("both kept and recorded");
    let running = kept.mutated.expect("the record is a patch");
    let update = |username: &str, object: &Value| {
        let mut request = pod_request("UPDATE", json!({}));
        request["userInfo"]["username"] = json!(username);
        request["oldObject"] = running.clone();
        request["object"] = object.clone();
        request
    };
    // The Pod as it leaves admission: the policy's patch applied, or the update as sent.
    let admitted = |username: &str, object: &Value| {
        let response = validate(
            &settings,
            &update(username, object),
            shared(LiveHost::default()),
        );
        assert!(response.accepted, "{response:?}");
        response.mutated.unwrap_or_else(|| object.clone())
    };
    let entries = |pod: &Value| -> Vec<String> {
        pod["metadata"]["annotations"][ANNOTATION]
            .as_str()
            .and_then(|text| serde_json::from_str::<serde_json::Map<String, Value>>(text).ok())
            .map(|record| record.keys().cloned().collect())
            .unwrap_or_default()
    };

    // web's image copied: its entry dropped, side's kept as it was.
    let mut web_filled = running.clone();
    web_filled["metadata"]["annotations"][ANNOTATION] =
        json!(json!({"side": record["side"].clone()}).to_string());
    let pod = admitted(fill_job, &web_filled);
    assert_eq!(
        (entries(&pod), &pod["metadata"]["labels"][LABEL]),
        (vec!["side".to_string()], &json!("true")),
        "{pod}"
    );

    // Both copied: annotation and label removed, and they stay removed.
    let mut all_filled = running.clone();
    for (field, key) in [("annotations", ANNOTATION), ("labels", LABEL)] {
        if let Some(map) = all_filled["metadata"][field].as_object_mut() {
            map.remove(key);
        }
    }
    let pod = admitted(fill_job, &all_filled);
    assert_eq!(
        (entries(&pod), pod["metadata"]["labels"].get(LABEL)),
        (Vec::<String>::new(), None),
        "{pod}"
    );

    // Anyone else's identical update (another ServiceAccount, a user) gets the record back.
    for other in [
        "system:serviceaccount:default:fill-mirror",
        "kubernetes-admin",
    ] {
        let pod = admitted(other, &all_filled);
        assert_eq!(
            (entries(&pod), &pod["metadata"]["labels"][LABEL]),
            (vec!["side".to_string(), "web".to_string()], &json!("true")),
            "{other}: {pod}"
        );
    }
}
