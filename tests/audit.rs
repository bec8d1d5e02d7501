//! After admission: Kubewarden's audit scanner replays every running Pod through
//! `/audit/<policy>`. Through the built module, with requests in the scanner's exact shape
//! (`rig::audit_request`) and a real registry: the check role reports a mirror image a lifecycle
//! rule pruned, and the swapping policy answers the scanner without a lookup, so that a scan
//! never holds up admissions behind the host's lookup lock.

mod rig;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rig::hosts::{HOST_CACHE, LiveHost, LookupLock, PolicyServer, SerialisedHost};
use rig::images::Image;
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::wapc::SharedHost;
use rig::{Response, audit_request, pod_request, shared, validate};
use serde_json::{Value, json};

const ORIGINALS: &str = "image-swapper.kubewarden.io/original-images";

fn swap_settings(mirror: &str) -> Value {
    json!({"mirrors": [{"source": "docker.io", "target": format!("{mirror}/hub")}]})
}

/// The same block as the swapping policy's, plus `action: check`: operators copy one block.
fn check_settings(mirror: &str) -> Value {
    let mut settings = swap_settings(mirror);
    settings["action"] = json!("check");
    settings
}

/// `validate` against a live registry: the answer and the lookups made.
fn run(settings: &Value, request: &Value) -> (Response, Vec<String>) {
    let host = shared(LiveHost::default());
    let response = validate(settings, request, host.clone());
    let lookups = host.lock().unwrap().lookups();
    (response, lookups)
}

/// A mirror holding `hub/library/nginx:1.27`; its digest.
fn mirror_with_nginx(name: &str) -> (TestRegistry, String) {
    let mirror = TestRegistry::start(name).expect("registry");
    let digest =
        Image::new("nginx 1.27", "linux/amd64").push(&mirror, "hub/library/nginx", Some("1.27"));
    (mirror, digest)
}

fn web(image: &str) -> Value {
    json!({"containers": [{"name": "web", "image": image}]})
}

/// The motivating case, after admission: a Pod is admitted and swapped, runs, and a lifecycle
/// rule prunes its pinned digest. The check role, on a policy-server of its own (its 60-second
/// cache included), passes it before the prune, still passes it within the minute the host
/// keeps that answer, and reports it after, naming container, image, the mirror's answer, the
/// original and the refill line.
#[test]
fn a_pod_whose_pinned_mirror_image_is_pruned_is_reported_with_what_to_do() {
    let (mirror, digest) = mirror_with_nginx("audit-pruned");
    let admission = pod_request("CREATE", web("nginx:1.27"));
    let (admitted, _) = run(&swap_settings(&mirror.host), &admission);
    let running = admitted.mutated.expect("the Pod is swapped at admission");
    let pinned = format!("{}/hub/library/nginx:1.27@{digest}", mirror.host);
    assert_eq!(running["spec"]["containers"][0]["image"], json!(pinned));
    let request = audit_request(
        1,
        running["spec"].clone(),
        running["metadata"]["annotations"].clone(),
    );

    let check = PolicyServer::new(LiveHost::default());
    let before = validate(&check_settings(&mirror.host), &request, check.evaluation());
    assert!(before.accepted && before.mutated.is_none(), "{before:?}");
    let by_digest = format!("{}/hub/library/nginx@{digest}", mirror.host);
    assert_eq!(
        check.host().lookups(),
        [format!("OciManifestDigest {by_digest}")]
    );

    mirror
        .delete_manifest("hub/library/nginx", &digest)
        .expect("prune");
    check.advance(HOST_CACHE - Duration::from_secs(1));
    let cached = validate(&check_settings(&mirror.host), &request, check.evaluation());
    assert!(
        cached.accepted,
        "within the minute, the host's cached answer: {cached:?}"
    );
    check.advance(Duration::from_secs(1));
    let after = validate(&check_settings(&mirror.host), &request, check.evaluation());
    assert_eq!(
        check.host().lookups().len(),
        2,
        "once, and once the cache expired"
    );
    assert!(!after.accepted, "{after:?}");
    assert_eq!(
        after.code, None,
        "a finding is the report's fail, not error"
    );
    assert_eq!(
        after.message.as_deref(),
        Some(format!(
            "a mirror image the Pod runs is gone from the mirror: containers \"web\": image \"{pinned}\" is gone from the mirror (asked for \"{by_digest}\", it answered: registry: manifest unknown); it was swapped from \"nginx:1.27\": refill the mirror (skopeo copy --all --preserve-digests docker://docker.io/library/nginx@{digest} docker://{}/hub/library/nginx:{}) or roll the workload out so that its new Pods are decided afresh",
            mirror.host,
            digest.replacen(':', "-", 1)
        ).as_str())
    );
}

/// A tag-only mirror image with no record (no status either): the one source the rule's
/// target inverts to is named, and its tag copied.
#[test]
fn a_tag_only_mirror_image_the_mirror_lacks_is_reported() {
    let mirror = TestRegistry::start("audit-tag").expect("registry");
    let image = format!("{}/hub/library/redis:7", mirror.host);
    let (response, lookups) = run(
        &check_settings(&mirror.host),
        &audit_request(2, web(&image), json!({})),
    );
    assert!(
        !response.accepted && response.code.is_none(),
        "{response:?}"
    );
    let message = response.message.unwrap_or_default();
    assert!(
        message.contains(&format!(
            "containers \"web\": image \"{image}\" is gone from the mirror (asked for \"{image}\", it answered: registry: manifest unknown); no record names its source; by the mirror's layout it is a copy of \"docker.io/library/redis:7\": refill the mirror (skopeo copy --all --preserve-digests docker://docker.io/library/redis:7 docker://{image}) or roll the workload out"
        )),
        "{message}"
    );
    assert_eq!(lookups.len(), 1);
}

/// A Pod k8s-image-swapper swapped (`<registry>/<source host>/<path>`, no record), running a tag
/// whose digest ECR's lifecycle expired: the check role, under `defaultMirror`'s layout, names
/// its source and the copy of the digest the container runs (its status' `imageID`) to the tag
/// it names. Under a prefix (its `prefix` option) and at the registry's root (its default: the
/// source host is the repository's first path component).
#[rstest::rstest]
#[case::under_a_prefix("audit-adopted", Some("cache"))]
#[case::at_the_registry_root("audit-adopted-root", None)]
fn a_pod_k8s_image_swapper_swapped_is_reported_with_the_copy_of_what_it_runs(
    #[case] name: &str,
    #[case] prefix: Option<&str>,
) {
    let mirror = TestRegistry::start(name).expect("registry");
    let (registry, path) = match prefix {
        Some(prefix) => (
            format!("{}/{prefix}", mirror.host),
            format!("{prefix}/docker.io/library/nginx"),
        ),
        None => (mirror.host.clone(), "docker.io/library/nginx".to_string()),
    };
    let repository = format!("{}/{path}", mirror.host);
    let running = Image::new("nginx 1.27", "linux/amd64").push(&mirror, &path, Some("1.27"));
    mirror
        .delete_manifest(&path, &running)
        .expect("the lifecycle rule expires it");
    let image = format!("{repository}:1.27");
    let mut request = audit_request(3, web(&image), json!({}));
    request["object"]["status"]["containerStatuses"] = json!([
        {"name": "web", "image": image, "imageID": format!("{repository}@{running}"), "ready": true}
    ]);
    let settings = json!({
        "action": "check",
        "defaultMirror": {"registry": registry},
    });
    let (response, lookups) = run(&settings, &request);
    assert!(
        !response.accepted && response.code.is_none(),
        "a finding: {response:?}"
    );
    let message = response.message.unwrap_or_default();
    assert!(
        message.ends_with(&format!(
            "no record names its source; by the mirror's layout it is a copy of \"docker.io/library/nginx:1.27\": refill the mirror, at the digest the container runs ({running}) (skopeo copy --all --preserve-digests docker://docker.io/library/nginx@{running} docker://{image}) or roll the workload out so that its new Pods are decided afresh"
        )),
        "{message}"
    );
    assert_eq!(lookups, [format!("OciManifestDigest {image}")]);
}

#[test]
fn init_and_ephemeral_containers_are_checked_like_the_others() {
    let (mirror, digest) = mirror_with_nginx("audit-lists");
    let m = &mirror.host;
    let spec = json!({
        "initContainers": [{"name": "init", "image": format!("{m}/hub/library/busybox:1.36")}],
        "containers": [{"name": "web", "image": format!("{m}/hub/library/nginx:1.27@{digest}")},
                       {"name": "side", "image": "ghcr.io/example/sidecar:2"}],
        "ephemeralContainers": [{"name": "debug", "image": format!("{m}/hub/library/alpine:3.20")}],
    });
    let (response, lookups) = run(&check_settings(m), &audit_request(3, spec, json!({})));
    let message = response.message.unwrap_or_default();
    assert!(
        message.starts_with(
            "2 mirror images the Pod runs are gone from the mirror: initContainers \"init\""
        ) && message.contains("; ephemeralContainers \"debug\": image"),
        "{message}"
    );
    assert!(!message.contains("\"web\""), "{message}");
    assert_eq!(lookups.len(), 3, "the source image needs none: {lookups:?}");
}

#[test]
fn a_registry_that_cannot_be_asked_is_an_error_naming_what_was_not_checked() {
    let (mut mirror, digest) = mirror_with_nginx("audit-down");
    let pinned = format!("{}/hub/library/nginx:1.27@{digest}", mirror.host);
    mirror.stop();
    let (response, _) = run(
        &check_settings(&mirror.host),
        &audit_request(4, web(&pinned), json!({})),
    );
    assert!(!response.accepted, "{response:?}");
    assert_eq!(response.code, Some(500), "the report's error, not fail");
    let message = response.message.unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "the Pod's mirror images could not all be checked: containers \"web\": image \"{pinned}\" not checked: could not ask the mirror for"
        )) && message.contains("Connection refused"),
        "{message}"
    );
}

/// With the mirror 50 ms away a lookup costs about 200 ms: under a budget of 100 ms the first
/// image is checked (the first lookup is always made) and the second is not started.
#[test]
fn a_spent_budget_is_an_error_naming_the_images_not_checked() {
    let mirror = TestRegistry::start("audit-budget").expect("registry");
    let a = Image::new("a", "linux/amd64").push(&mirror, "hub/library/a", Some("1"));
    let b = Image::new("b", "linux/amd64").push(&mirror, "hub/library/b", Some("1"));
    let far = LatencyProxy::start(&mirror.host, Duration::from_millis(50)).expect("proxy");
    let m = &far.host;
    let spec = json!({"containers": [
        {"name": "a", "image": format!("{m}/hub/library/a:1@{a}")},
        {"name": "b", "image": format!("{m}/hub/library/b:1@{b}")},
    ]});
    let mut settings = check_settings(m);
    settings["lookupBudgetMilliseconds"] = json!(100);
    let (response, lookups) = run(&settings, &audit_request(5, spec, json!({})));
    assert_eq!(response.code, Some(500), "{response:?}");
    let message = response.message.unwrap_or_default();
    assert!(
        message.starts_with("the Pod's mirror images could not all be checked: not checked in time, within the lookup budget of 100 ms (the evaluation had run ")
            && message.contains(&format!("in 1 lookup): containers \"b\" image \"{m}/hub/library/b:1@{b}\" ("))
            && (message.ends_with(&format!("(the budget had run out before a lookup on {m})"))
                || message.contains(&format!("({m} would need about "))),
        "{message}"
    );
    assert_eq!(lookups.len(), 1, "{lookups:?}");
}

#[test]
fn a_pod_without_images_a_rule_routes_is_accepted_without_a_lookup() {
    let mirror = TestRegistry::start("audit-none").expect("registry");
    let (response, lookups) = run(
        &check_settings(&mirror.host),
        &audit_request(6, web("ghcr.io/org/app:1.0"), json!({})),
    );
    assert!(
        response.accepted && response.mutated.is_none(),
        "{response:?}"
    );
    assert!(lookups.is_empty(), "{lookups:?}");
}

/// The scanner is told apart by all of its marks at once (`is_audit_scan`): an empty
/// `userInfo` and a request uid that is the Pod's own. A request with only one of them is an
/// admission and is swapped: the scanner's shape with a username, and a request uid of its own
/// without one (a hand-written request for `kwctl run`, which names no requester; the API server
/// always does); then the API server's request, both marks gone.
#[test]
fn the_swapping_policy_answers_the_scanner_unchanged_and_an_admission_as_today() {
    let (mirror, digest) = mirror_with_nginx("audit-swap");
    let settings = swap_settings(&mirror.host);
    let scanned = audit_request(7, web("nginx:1.27"), json!({}));
    let (response, lookups) = run(&settings, &scanned);
    assert!(
        response.accepted && response.mutated.is_none(),
        "{response:?}"
    );
    assert!(response.warnings.is_empty() && response.audit.is_empty());
    assert!(lookups.is_empty(), "{lookups:?}");

    let own_uid = json!("1299d386-525b-4032-98ae-1949f69f9cfc");
    let username = json!({"username": "system:serviceaccount:kube-system:replicaset-controller"});
    let mut with_username = scanned.clone();
    with_username["userInfo"] = username.clone();
    let mut own_uid_only = scanned.clone();
    own_uid_only["uid"] = own_uid.clone();
    let mut admitted = scanned.clone();
    admitted["uid"] = own_uid;
    admitted["userInfo"] = username;
    for (what, request) in [
        ("the scanner's shape with a username", with_username),
        ("a request uid of its own, no username", own_uid_only),
        ("the API server's request", admitted),
    ] {
        let (response, lookups) = run(&settings, &request);
        assert_eq!(
            response.image("containers", 0),
            Some(format!("{}/hub/library/nginx:1.27@{digest}", mirror.host).as_str()),
            "{what}: swapped as an admission: {response:?}"
        );
        assert_eq!(lookups.len(), 1, "{what}: {lookups:?}");
        assert!(
            response
                .mutated
                .as_ref()
                .is_some_and(|pod| pod["metadata"]["annotations"][ORIGINALS].is_string()),
            "{what}: recorded"
        );
    }
}

/// policy-server's workers (one per CPU; 2 here), taking requests in the order they came.
const WORKERS: usize = 2;

/// One request of a scan, or the admission among them.
struct Job {
    settings: Value,
    request: Value,
}

/// Runs `jobs` on [`WORKERS`] threads sharing one host behind the lookup lock, as one
/// policy-server process does; each answer with the time from the scan's start.
fn serve(jobs: Vec<Job>, host: &Arc<Mutex<LiveHost>>) -> Vec<(Duration, Response)> {
    let lock = Arc::new(LookupLock::default());
    let queue = Arc::new(Mutex::new(
        jobs.into_iter().enumerate().collect::<VecDeque<_>>(),
    ));
    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let queue = queue.clone();
            let host = SerialisedHost {
                lock: lock.clone(),
                inner: host.clone(),
            };
            thread::spawn(move || {
                let mut answers = Vec::new();
                while let Some((index, job)) = queue.lock().unwrap().pop_front() {
                    let shared_host: SharedHost = Arc::new(Mutex::new(host.clone()));
                    let response = validate(&job.settings, &job.request, shared_host);
                    answers.push((index, started.elapsed(), response));
                }
                answers
            })
        })
        .collect();
    let mut answers: Vec<_> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("worker"))
        .collect();
    answers.sort_by_key(|(index, ..)| *index);
    answers.into_iter().map(|(_, at, r)| (at, r)).collect()
}

/// The scanner's batch: 100 Pods at once, its client giving up after 10 s.
const SCAN: usize = 100;
const SCANNER_TIMEOUT: Duration = Duration::from_secs(10);

fn ms(duration: Duration) -> u128 {
    duration.as_millis()
}

/// 100 Pods that each run their own image of the source registry: under the swapping policy,
/// the scan makes no lookup, so an admission sent among them does not queue behind the lock.
#[test]
fn a_scan_of_100_pods_against_the_swapping_policy_makes_no_lookup_and_holds_up_no_admission() {
    let mirror = TestRegistry::start("scan-swap").expect("registry");
    for i in 0..2 {
        Image::new(&format!("app {i}"), "linux/amd64").push(
            &mirror,
            &format!("hub/library/app{i}"),
            Some("1"),
        );
    }
    let far = LatencyProxy::start(&mirror.host, Duration::from_millis(50)).expect("proxy");
    let settings = swap_settings(&far.host);
    rig::policy();
    let admission = |app: usize| Job {
        settings: settings.clone(),
        request: pod_request("CREATE", web(&format!("app{app}:1"))),
    };
    let host = Arc::new(Mutex::new(LiveHost::default()));
    let alone = serve(vec![admission(0)], &host);
    let alone_ms = ms(alone[0].0);

    let host = Arc::new(Mutex::new(LiveHost::default()));
    let mut jobs: Vec<Job> = (0..SCAN)
        .map(|n| Job {
            settings: settings.clone(),
            request: audit_request(n, web(&format!("app{}:1", 1000 + n)), json!({})),
        })
        .collect();
    jobs.insert(SCAN / 2, admission(1));
    let answers = serve(jobs, &host);
    let (among, admitted) = &answers[SCAN / 2];
    assert!(
        admitted.mutated.is_some(),
        "the admission is swapped: {admitted:?}"
    );
    for (at, (_, scanned)) in answers.iter().enumerate().filter(|(at, _)| *at != SCAN / 2) {
        assert!(
            scanned.accepted && scanned.mutated.is_none(),
            "{at}: {scanned:?}"
        );
    }
    let lookups = host.lock().unwrap().lookups();
    assert_eq!(lookups.len(), 1, "the admission's only: {lookups:?}");
    let scan_ms = ms(answers.iter().map(|(at, _)| *at).max().unwrap_or_default());
    println!(
        "swapping policy, mirror 50 ms away, {WORKERS} workers: an admission alone {alone_ms} ms; sent 51st among {SCAN} audit requests, answered {} ms after the scan began; the whole scan {scan_ms} ms, {} lookup",
        ms(*among),
        lookups.len()
    );
}

/// The check role under a scan: 100 Pods with a distinct pinned mirror image each, the mirror
/// 50 ms away: every Pod is checked, with one lookup of its own, and passes. Lookups are
/// serialised in the process, so the scan's length is about 100 lookups; answers later than the
/// scanner's 10 s would be `error`s in the report. Prints the figure the docs give (Pods checked
/// per minute by one policy-server process, and how many fit the scanner's timeout), which it
/// does not assert: it is a speed.
#[test]
fn a_scan_of_100_pods_against_the_check_role_looks_each_pod_up_once_and_passes_them_all() {
    let mirror = TestRegistry::start("scan-check").expect("registry");
    let digests: Vec<String> = (0..SCAN)
        .map(|i| {
            Image::new(&format!("app {i}"), "linux/amd64").push(
                &mirror,
                &format!("hub/library/app{i}"),
                Some("1"),
            )
        })
        .collect();
    let far = LatencyProxy::start(&mirror.host, Duration::from_millis(50)).expect("proxy");
    let settings = check_settings(&far.host);
    rig::policy();
    let jobs = digests
        .iter()
        .enumerate()
        .map(|(n, digest)| Job {
            settings: settings.clone(),
            request: audit_request(
                n,
                web(&format!("{}/hub/library/app{n}:1@{digest}", far.host)),
                json!({}),
            ),
        })
        .collect();
    let host = Arc::new(Mutex::new(LiveHost::default()));
    let answers = serve(jobs, &host);
    for (n, (_, response)) in answers.iter().enumerate() {
        assert!(
            response.accepted && response.mutated.is_none(),
            "{n}: {response:?}"
        );
    }
    assert_eq!(host.lock().unwrap().lookups().len(), SCAN);
    let scan = answers.iter().map(|(at, _)| *at).max().unwrap_or_default();
    let in_time = answers
        .iter()
        .filter(|(at, _)| *at <= SCANNER_TIMEOUT)
        .count();
    println!(
        "check role, mirror 50 ms away, {WORKERS} workers, one process: {SCAN} Pods (one distinct image each) checked in {} ms, {:.0} Pods a minute; {in_time} of {SCAN} answered within the scanner's 10 s",
        ms(scan),
        SCAN as f64 * 60.0 / scan.as_secs_f64()
    );
}

/// A static Pod's mirror Pod (`kubernetes.io/config.mirror`): the swapping policy leaves it
/// alone, but its node pulls the image the manifest names, so the check role asks for it like
/// any other and reports it when the mirror lost it.
#[test]
fn the_check_role_checks_a_static_pods_mirror_pod() {
    let (mirror, digest) = mirror_with_nginx("audit-static");
    let pinned = format!("{}/hub/library/nginx:1.27@{digest}", mirror.host);
    let annotations = json!({"kubernetes.io/config.mirror": "3f7c1c5a6f0c4f27b2d1e0a9c8b7a6f5"});
    let request = audit_request(11, web(&pinned), annotations);
    let (present, lookups) = run(&check_settings(&mirror.host), &request);
    assert!(present.accepted, "{present:?}");
    assert_eq!(lookups.len(), 1, "{lookups:?}");
    mirror
        .delete_manifest("hub/library/nginx", &digest)
        .expect("prune");
    let (gone, _) = run(&check_settings(&mirror.host), &request);
    assert_eq!((gone.accepted, gone.code), (false, None), "{gone:?}");
    assert!(
        gone.message.as_deref().is_some_and(|m| m.starts_with(&format!(
            "a mirror image the Pod runs is gone from the mirror: containers \"web\": image \"{pinned}\" is gone from the mirror"
        ))),
        "{gone:?}"
    );
}

/// With `checkAdmissions` (protect mode), an UPDATE is checked for the containers whose image
/// changed only: an unchanged container is already running, and refusing the update for it
/// would block every label change of a Pod whose image was pruned.
#[test]
fn on_update_the_check_role_asks_only_for_changed_images() {
    let (mirror, digest) = mirror_with_nginx("audit-update");
    let present = format!("{}/hub/library/nginx:1.27@{digest}", mirror.host);
    let pruned = format!("{}/hub/library/nginx:0.9", mirror.host);
    let mut settings = check_settings(&mirror.host);
    settings["checkAdmissions"] = json!(true);
    let update = |old: &[&str], new: &[&str]| {
        let containers = |images: &[&str]| -> Value {
            json!({"containers": images.iter().enumerate()
                .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
                .collect::<Vec<_>>()})
        };
        let mut request = pod_request("UPDATE", containers(new));
        request["oldObject"] = request["object"].clone();
        request["oldObject"]["spec"] = containers(old);
        run(&settings, &request)
    };
    // A label change of a Pod whose second image is gone: nothing changed, nothing asked.
    let (labels, lookups) = update(&[&present, &pruned], &[&present, &pruned]);
    assert!(labels.accepted, "{labels:?}");
    assert!(lookups.is_empty(), "{lookups:?}");
    // The first container's image set to the gone one: that one is asked for, and refused.
    let (changed, lookups) = update(&[&present, &pruned], &[&pruned, &pruned]);
    assert_eq!(lookups, [format!("OciManifestDigest {pruned}")]);
    assert_eq!(
        (changed.accepted, changed.code),
        (false, None),
        "{changed:?}"
    );
    assert!(
        changed
            .message
            .as_deref()
            .is_some_and(|m| m.contains("containers \"c0\": image") && !m.contains("\"c1\"")),
        "{changed:?}"
    );
}
