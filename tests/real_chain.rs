//! The real admission chain: kube-apiserver 1.36 calls policy-server 1.35 over TLS (a
//! MutatingWebhookConfiguration whose `clientConfig.url` is the policy's `/validate/<id>`, its
//! certificate as `caBundle`), which runs the built module (annotated by the real kwctl) against
//! registries on loopback. Each scenario is asserted on what the API server stored (`kubectl get
//! pod -o json`) and what kubectl printed. The tools come from `scripts/real-tools.sh`; without
//! them each test says it did not run (and fails under `CI=true`).

mod rig;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rig::chain::{self, Entry, Webhook, apply, pod};
use rig::cosign::{Signer, signature_tag};
use rig::hanging::HangingRegistry;
use rig::images::Image;
use rig::registry::TestRegistry;
use rig::tools::{PolicyServer, PolicyServerOptions, RealTools};
use serde_json::{Value, json};

const ORIGINAL_IMAGES: &str = "image-swapper.kubewarden.io/original-images";
const UNMIRRORED_IMAGES: &str = "image-swapper.kubewarden.io/unmirrored-images";
const UNMIRRORED: &str = "image-swapper.kubewarden.io/unmirrored";

/// A source registry and its mirror, both plain HTTP on loopback, routed
/// `<source>` -> `<mirror>/cache`.
struct Registries {
    source: TestRegistry,
    mirror: TestRegistry,
}

impl Registries {
    fn start(name: &str) -> Registries {
        Registries {
            source: TestRegistry::start(&format!("{name}-source")).expect("registry"),
            mirror: TestRegistry::start(&format!("{name}-mirror")).expect("registry"),
        }
    }

    /// `<source>/<repository>:<tag>`.
    fn image(&self, repository: &str, tag: &str) -> String {
        format!("{}/{repository}:{tag}", self.source.host)
    }

    /// What the swap writes for it: `<mirror>/cache/<repository>:<tag>@<digest>`.
    fn mirror_image(&self, repository: &str, tag: &str, digest: &str) -> String {
        format!("{}/cache/{repository}:{tag}@{digest}", self.mirror.host)
    }

    /// The route, and a lookup budget within the generous evaluation timeout of [`options`].
    fn settings(&self) -> Value {
        json!({"mirrors": [{"source": self.source.host,
            "target": format!("{}/cache", self.mirror.host)}],
            "lookupBudgetMilliseconds": LOOKUP_BUDGET_MS})
    }

    fn sources(&self) -> String {
        chain::insecure_sources(&[&self.source.host, &self.mirror.host])
    }
}

/// `skopeo copy --all --preserve-digests`, the fill job's copy, between plain-HTTP registries.
fn skopeo_copy(from: &str, to: &str) {
    let status = std::process::Command::new("skopeo")
        .args(["copy", "--all", "--preserve-digests"])
        .args(["--src-tls-verify=false", "--dest-tls-verify=false"])
        .arg(format!("docker://{from}"))
        .arg(format!("docker://{to}"))
        .status()
        .expect("skopeo");
    assert!(status.success(), "skopeo copy {from} {to}");
}

/// Limits generous enough that a loaded machine (CI runs test binaries at once) decides nothing
/// by time, in the order the docs give them (budget < `--policy-timeout` - 1 s <
/// `timeoutSeconds`): time is scenario d's subject, and the budget's is `tests/distance.rs`'s.
const LOOKUP_BUDGET_MS: u64 = 8_000;
const POLICY_TIMEOUT_SECONDS: u64 = 10;
const WEBHOOK_TIMEOUT_SECONDS: u32 = 15;

/// A policy-server's options: plain-HTTP `sources`, the generous evaluation timeout.
fn options(sources: &str) -> PolicyServerOptions<'_> {
    PolicyServerOptions {
        sources: Some(sources),
        policy_timeout: Some(POLICY_TIMEOUT_SECONDS),
        ..PolicyServerOptions::default()
    }
}

fn swapper(tools: &RealTools) -> PathBuf {
    tools.annotated_policy()
}

/// a, b, c: a Pod swapped and pinned with its original recorded; a Pod whose image the mirror
/// lacks kept, with its record and a warning; the record's copy made as the fill job makes it,
/// and the next Pod of that image swapped, nothing restarted (policy-server keeps no failure);
/// the filled record dropped by the fill job's patch, and put back when anyone else drops it.
#[test]
fn swapped_kept_with_its_record_then_swapped_once_the_mirror_is_filled() {
    let Some(tools) = RealTools::find("real_chain::swapped_kept_with_its_record") else {
        return;
    };
    let plane = chain::shared_plane(&tools);
    let registries = Registries::start("chain-swap");
    let web = Image::new("chain web", "linux/amd64");
    let web_digest = web.push(&registries.source, "org/web", Some("1"));
    web.push(&registries.mirror, "cache/org/web", Some("1"));
    let api = Image::new("chain api", "linux/amd64");
    let api_digest = api.push(&registries.source, "org/api", Some("1"));
    let sources = registries.sources();
    let mut settings = registries.settings();
    settings["fillJobUsernames"] = json!([FILL_JOB]);
    let server = PolicyServer::start(
        &tools,
        &chain::policies_yml(
            &tools,
            &[Entry::new("image-swapper", &swapper(&tools), settings)],
        ),
        options(&sources),
    );
    chain::namespaces(&plane, &["swap"]);
    // The fill job's identity may read and patch the namespace's Pods (deploy/ grants it
    // cluster-wide); admin acts as it with `--as`.
    let role = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "fill-mirror", "namespace": "swap"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "fill-mirror", "namespace": "swap"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "fill-mirror"},
            "subjects": [{"kind": "ServiceAccount", "name": "fill-mirror", "namespace": "kubewarden"}]},
    ]});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&role.to_string()));
    Webhook {
        name: "clusterwide-image-swapper.swap",
        server: &server,
        policy: "image-swapper",
        namespaces: &["swap"],
        failure_policy: "Fail",
        timeout_seconds: WEBHOOK_TIMEOUT_SECONDS,
    }
    .install(&plane);

    // a. Swapped and pinned to the digest the mirror holds, the original recorded, no warning.
    let web_image = registries.image("org/web", "1");
    let swapped = apply(&plane, &pod("swap", "web", &web_image));
    assert_eq!(
        swapped.image(0),
        registries.mirror_image("org/web", "1", &web_digest),
        "{swapped:?}"
    );
    assert_eq!(
        swapped.json_annotation(ORIGINAL_IMAGES),
        Some(json!({"web": web_image})),
        "original recorded"
    );
    assert!(swapped.warnings.is_empty(), "{:?}", swapped.warnings);
    assert_eq!(swapped.label(UNMIRRORED), None);

    // b. The mirror lacks it: kept as written, the Pod labelled, the record naming the source,
    // the mirror image wanted and the copy; kubectl prints why.
    let api_image = registries.image("org/api", "1");
    let kept = apply(&plane, &pod("swap", "api", &api_image));
    assert_eq!(kept.image(0), api_image, "kept");
    assert_eq!(kept.label(UNMIRRORED), Some("true"), "{kept:?}");
    let record = kept.json_annotation(UNMIRRORED_IMAGES).expect("the record");
    let wanted = format!("{}/cache/org/api:1", registries.mirror.host);
    assert_eq!(record["web"]["source"], json!(api_image), "{record}");
    assert_eq!(record["web"]["mirror"], json!(wanted), "{record}");
    assert!(
        record["web"]["copy"]
            .as_str()
            .is_some_and(|copy| copy.contains("skopeo copy")),
        "{record}"
    );
    assert!(
        kept.warned(&format!("image \"{api_image}\": kept")) && kept.warned(&wanted),
        "{:?}",
        kept.warnings
    );
    assert_eq!(kept.annotation(ORIGINAL_IMAGES), None, "nothing swapped");

    // c. The fill job's copy, from the record's source to the record's mirror image; the next
    // Pod of that image is swapped at once, with no restart of anything.
    skopeo_copy(
        record["web"]["source"].as_str().expect("source"),
        record["web"]["mirror"].as_str().expect("mirror"),
    );
    let filled = apply(&plane, &pod("swap", "api-2", &api_image));
    assert_eq!(
        filled.image(0),
        registries.mirror_image("org/api", "1", &api_digest),
        "{filled:?}"
    );
    assert_eq!(filled.label(UNMIRRORED), None);
    assert!(filled.warnings.is_empty(), "{:?}", filled.warnings);

    // The filled record dropped with the fill job's patch (a `test` of the record it read,
    // then the annotation and the label removed): from anyone else the policy puts it back;
    // from the fill job's identity it goes.
    let drop_record = json!([
        {"op": "test", "path": format!("/metadata/annotations/{}", UNMIRRORED_IMAGES.replace('/', "~1")),
            "value": kept.annotation(UNMIRRORED_IMAGES)},
        {"op": "remove", "path": format!("/metadata/annotations/{}", UNMIRRORED_IMAGES.replace('/', "~1"))},
        {"op": "remove", "path": format!("/metadata/labels/{}", UNMIRRORED.replace('/', "~1"))},
    ])
    .to_string();
    for (who, impersonate) in [("admin", None), ("the fill job", Some(FILL_JOB))] {
        let mut args = vec![
            "patch",
            "pod",
            "-n",
            "swap",
            "api",
            "--type=json",
            "-p",
            &drop_record,
        ];
        let as_fill_job = impersonate.map(|user| format!("--as={user}"));
        args.extend(as_fill_job.as_deref());
        plane.kubectl_ok(&args, None);
        let stored = plane.get_json(&["pod", "-n", "swap", "api"]);
        let record = &stored["metadata"]["annotations"][UNMIRRORED_IMAGES];
        let label = &stored["metadata"]["labels"][UNMIRRORED];
        if impersonate.is_none() {
            assert_eq!(
                record.as_str(),
                kept.annotation(UNMIRRORED_IMAGES),
                "{who}: put back"
            );
            assert_eq!(label, "true", "{who}: put back");
        } else {
            assert!(
                record.is_null() && label.is_null(),
                "{who}: dropped: {stored}"
            );
        }
        assert_eq!(
            chain::image_of(&stored, 0),
            api_image,
            "{who}: the image untouched"
        );
    }
}

/// The username the API server gives the fill job of `deploy/` (its ServiceAccount).
const FILL_JOB: &str = "system:serviceaccount:kubewarden:fill-mirror";

/// d. A mirror that hangs (accepts, never answers) is contained as the docs advise: the policy
/// on a policy-server of its own, its webhook `failurePolicy: Ignore` with `timeoutSeconds: 3`.
/// Its Pod is admitted unchanged once the API server gives up; a Pod for the policy on another
/// policy-server is swapped while that admission still waits; and a second policy on the hung
/// policy-server, whose mirror is healthy, waits out its timeout too (the host's lookup lock is
/// process-wide), which is why the hanging one needs a policy-server of its own.
#[test]
fn a_hung_registry_is_contained_by_a_policy_server_of_its_own() {
    let Some(tools) = RealTools::find("real_chain::a_hung_registry_is_contained") else {
        return;
    };
    let plane = chain::shared_plane(&tools);
    let registries = Registries::start("chain-hang");
    let web = Image::new("chain hang web", "linux/amd64");
    let web_digest = web.push(&registries.source, "org/web", Some("1"));
    web.push(&registries.mirror, "cache/org/web", Some("1"));
    // Longer than the whole test: the hung lookup holds its policy-server until it is dropped.
    let hanging = HangingRegistry::start(Duration::from_secs(120)).expect("hanging registry");
    let hung_settings = json!({"mirrors": [{"source": registries.source.host,
        "target": format!("{}/cache", hanging.host)}]});
    let sources = chain::insecure_sources(&[
        &registries.source.host,
        &registries.mirror.host,
        &hanging.host,
    ]);
    let module = swapper(&tools);
    let (hung_server, healthy_server) = std::thread::scope(|scope| {
        let hung = scope.spawn(|| {
            PolicyServer::start(
                &tools,
                &chain::policies_yml(
                    &tools,
                    &[
                        Entry::new("image-swapper-hung", &module, hung_settings.clone()),
                        Entry::new("neighbour", &module, registries.settings()),
                    ],
                ),
                options(&sources),
            )
        });
        let healthy = scope.spawn(|| {
            PolicyServer::start(
                &tools,
                &chain::policies_yml(
                    &tools,
                    &[Entry::new("image-swapper", &module, registries.settings())],
                ),
                options(&sources),
            )
        });
        (
            hung.join().expect("hung policy-server"),
            healthy.join().expect("healthy policy-server"),
        )
    });
    chain::namespaces(&plane, &["hang", "hang-neighbour", "hang-healthy"]);
    // The hung policy and its neighbour on one policy-server, as the docs advise for the
    // hung one (`Ignore`, a few seconds); the healthy one on its own.
    for (name, server, policy, namespace, failure_policy, timeout_seconds) in [
        (
            "clusterwide-image-swapper-hung",
            &hung_server,
            "image-swapper-hung",
            "hang",
            "Ignore",
            HUNG_TIMEOUT_SECONDS,
        ),
        (
            "clusterwide-neighbour",
            &hung_server,
            "neighbour",
            "hang-neighbour",
            "Ignore",
            HUNG_TIMEOUT_SECONDS,
        ),
        (
            "clusterwide-image-swapper.hang-healthy",
            &healthy_server,
            "image-swapper",
            "hang-healthy",
            "Fail",
            WEBHOOK_TIMEOUT_SECONDS,
        ),
    ] {
        Webhook {
            name,
            server,
            policy,
            namespaces: &[namespace],
            failure_policy,
            timeout_seconds,
        }
        .install(&plane);
    }

    let image = registries.image("org/web", "1");
    let hung_pod = pod("hang", "web", &image);
    let in_flight = std::thread::scope(|scope| {
        let hung = scope.spawn(|| apply(&plane, &hung_pod));
        // The hung policy's lookup has reached the hanging mirror.
        let started = Instant::now();
        while hanging.connections() == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no lookup reached the hanging mirror:\n{}",
                hung_server.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let healthy = apply(&plane, &pod("hang-healthy", "web", &image));
        let neighbour = apply(&plane, &pod("hang-neighbour", "web", &image));
        (hung.join().expect("hung apply"), healthy, neighbour)
    });
    let (hung, healthy, neighbour) = in_flight;
    println!(
        "hung: {:?}, healthy policy-server: {:?}, neighbour on the hung policy-server: {:?}",
        hung.took, healthy.took, neighbour.took
    );
    // The other policy-server looked the image up and swapped it while the hung lookup held
    // its own policy-server (the neighbour, asked after it, still waited on that lookup).
    assert_eq!(
        healthy.image(0),
        registries.mirror_image("org/web", "1", &web_digest),
        "{healthy:?}"
    );
    // The API server gave up on both policies of the hung policy-server after their
    // `timeoutSeconds` and admitted the Pods as written (`Ignore`): nothing of the policy's.
    for (what, applied) in [("hung", &hung), ("neighbour", &neighbour)] {
        assert_eq!(applied.image(0), image, "{what}: {applied:?}");
        assert_eq!(applied.annotation(ORIGINAL_IMAGES), None, "{what}");
        assert_eq!(applied.label(UNMIRRORED), None, "{what}");
        assert!(
            applied.warnings.is_empty(),
            "{what}: {:?}",
            applied.warnings
        );
        assert!(
            applied.took >= Duration::from_secs(HUNG_TIMEOUT_SECONDS.into()),
            "{what}: admitted after {:?}, before the webhook's timeout: not the API server's \
             timeout but an answer",
            applied.took
        );
    }
}

/// The webhook timeout of the hung registry's scenario.
const HUNG_TIMEOUT_SECONDS: u32 = 3;

/// Images for the signature scenarios: at the source, `org/app:signed` (signed as `cosign sign
/// --key` signs it), `org/app:unsigned` and `platform/base:unsigned`; the mirror holds copies
/// of all three at the same digests, and the signed one's signature.
struct SignedImages {
    registries: Registries,
    signer: Signer,
    signed: String,
    unsigned: String,
}

impl SignedImages {
    fn start(name: &str) -> SignedImages {
        let registries = Registries::start(name);
        let signer = Signer::generate();
        let mut digests = Vec::new();
        for (repository, tag) in [
            ("org/app", "signed"),
            ("org/app", "unsigned"),
            ("platform/base", "unsigned"),
        ] {
            let image = Image::new(&format!("{name} {repository} {tag}"), "linux/amd64");
            digests.push(image.push(&registries.source, repository, Some(tag)));
            image.push(
                &registries.mirror,
                &format!("cache/{repository}"),
                Some(tag),
            );
        }
        signer.sign(&registries.source, "org/app", &digests[0], &[]);
        let signature = signature_tag(&digests[0]);
        skopeo_copy(
            &format!("{}/org/app:{signature}", registries.source.host),
            &format!("{}/cache/org/app:{signature}", registries.mirror.host),
        );
        SignedImages {
            registries,
            signer,
            signed: digests[0].clone(),
            unsigned: digests[1].clone(),
        }
    }

    /// verify-image-signatures' rule for `pattern` with the signer's key.
    fn rule(&self, pattern: &str) -> Value {
        json!({"image": pattern, "pubKeys": [self.signer.public_pem]})
    }

    /// A validating verify-image-signatures policy object whose rules cover `repositories`
    /// (globs under the source registry).
    fn verifier(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        repositories: &str,
    ) -> Value {
        chain::kubewarden_policy(
            kind,
            namespace,
            name,
            VERIFIER_MODULE,
            false,
            json!({"signatures": [self.rule(&format!("{}/{repositories}", self.registries.source.host))],
                "modifyImagesWithDigest": false}),
        )
    }
}

/// Where an operator's verify-image-signatures comes from (the `verifiers` glob matches it).
const VERIFIER_MODULE: &str =
    "registry://ghcr.io/kubewarden/policies/verify-image-signatures:v1.0.11";

/// The RBAC a PolicyServer's ServiceAccount has on Kubewarden's policy kinds, in scenario e.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Grant {
    GetListWatch,
    GetList,
    Nothing,
}

impl Grant {
    fn verbs(self) -> &'static [&'static str] {
        match self {
            Grant::GetListWatch => &["get", "list", "watch"],
            Grant::GetList => &["get", "list"],
            Grant::Nothing => &[],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Grant::GetListWatch => "watch",
            Grant::GetList => "nowatch",
            Grant::Nothing => "none",
        }
    }

    fn namespace(self, which: &str) -> String {
        format!("verifiers-{}-{which}", self.name())
    }
}

/// e. `verifiers` read from real ClusterAdmissionPolicy and AdmissionPolicy objects through
/// policy-server's Kubernetes capability, as its ServiceAccount's RBAC allows. The cluster holds
/// a cluster-wide verifier over `platform/*` and, in each `team` namespace, a namespaced one
/// over `org/*`; three policy-servers run the same policy, their ServiceAccounts granted `get`,
/// `list` and `watch` on the policy kinds, only `get` and `list`, or nothing:
/// - with the three verbs, an image a verifier covers is swapped only when it verifies (the
///   signed one, at its digest), kept otherwise, and elsewhere swapped as without `verifiers`;
///   a verifier created later is honoured at once;
/// - without `watch`, the same at first, but a verifier created after the host's first list of
///   its kind (for a namespaced one, in its namespace: the host keeps one reflector per kind and
///   namespace, built at the first list) is never seen: the unsigned image it covers is swapped
///   to the mirror, where the server with `watch` keeps it;
/// - with nothing, the policy's list never returns: the admission waits out the webhook's
///   `timeoutSeconds` and the API server admits the Pod as written (`failurePolicy: Ignore`).
#[test]
fn verifiers_are_read_from_real_policies_as_the_policy_servers_rbac_allows() {
    let Some(tools) = RealTools::find("real_chain::verifiers_are_read_from_real_policies") else {
        return;
    };
    let plane = chain::shared_plane(&tools);
    chain::kubewarden_crds(&plane);
    let images = SignedImages::start("chain-verifiers");
    let registries = &images.registries;
    let grants = [Grant::GetListWatch, Grant::GetList, Grant::Nothing];
    let mut namespaces = Vec::new();
    for grant in grants {
        for which in ["team", "other", "late"] {
            namespaces.push(grant.namespace(which));
        }
    }
    chain::namespaces(
        &plane,
        &namespaces.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let mut objects = vec![images.verifier(
        "ClusterAdmissionPolicy",
        None,
        "verify-platform-images",
        "platform/*",
    )];
    for grant in grants {
        objects.push(images.verifier(
            "AdmissionPolicy",
            Some(&grant.namespace("team")),
            "verify-image-signatures",
            "org/*",
        ));
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&list.to_string()));

    let mut settings = registries.settings();
    settings["verifiers"] = json!([{"module": "*/verify-image-signatures:*"}]);
    let module = swapper(&tools);
    let sources = registries.sources();
    let policies = chain::policies_yml(
        &tools,
        &[Entry::new("image-swapper", &module, settings).reading_policies()],
    );
    let kubeconfigs: Vec<PathBuf> = grants
        .iter()
        .map(|grant| {
            chain::service_account_kubeconfig(
                &plane,
                "kubewarden",
                &format!("policy-server-{}", grant.name()),
                grant.verbs(),
            )
        })
        .collect();
    let servers: Vec<PolicyServer> = std::thread::scope(|scope| {
        let starting: Vec<_> = kubeconfigs
            .iter()
            .map(|kubeconfig| {
                let (policies, sources) = (&policies, &sources);
                let tools = &tools;
                scope.spawn(move || {
                    PolicyServer::start(
                        tools,
                        policies,
                        PolicyServerOptions {
                            kubeconfig: Some(kubeconfig),
                            ..options(sources)
                        },
                    )
                })
            })
            .collect();
        starting
            .into_iter()
            .map(|s| s.join().expect("policy-server"))
            .collect()
    });
    for (grant, server) in grants.iter().zip(&servers) {
        let name = format!("clusterwide-image-swapper-{}", grant.name());
        let served: Vec<String> = ["team", "other", "late"]
            .iter()
            .map(|which| grant.namespace(which))
            .collect();
        Webhook {
            name: &name,
            server,
            policy: "image-swapper",
            namespaces: &served.iter().map(String::as_str).collect::<Vec<_>>(),
            failure_policy: "Ignore",
            timeout_seconds: if *grant == Grant::Nothing {
                HUNG_TIMEOUT_SECONDS
            } else {
                WEBHOOK_TIMEOUT_SECONDS
            },
        }
        .install(&plane);
    }

    let unsigned = registries.image("org/app", "unsigned");
    let signed = registries.image("org/app", "signed");
    let base = registries.image("platform/base", "unsigned");
    for (grant, server) in grants.iter().zip(&servers).take(2) {
        let (team, other) = (grant.namespace("team"), grant.namespace("other"));
        let kept = apply(&plane, &pod(&team, "unsigned", &unsigned));
        assert_eq!(
            kept.image(0),
            unsigned,
            "{grant:?}: covered by the team's verifier, unsigned: kept\n{}",
            server.log()
        );
        assert!(
            kept.warned(&format!("image \"{unsigned}\": kept")),
            "{grant:?}: {:?}",
            kept.warnings
        );
        assert_eq!(
            apply(&plane, &pod(&team, "signed", &signed)).image(0),
            registries.mirror_image("org/app", "signed", &images.signed),
            "{grant:?}: signed, its signature in the mirror: swapped at the verified digest"
        );
        assert_eq!(
            apply(&plane, &pod(&other, "unsigned", &unsigned)).image(0),
            registries.mirror_image("org/app", "unsigned", &images.unsigned),
            "{grant:?}: no verifier covers it in {other}: swapped as without verifiers"
        );
        let base_kept = apply(&plane, &pod(&other, "base", &base));
        assert_eq!(
            base_kept.image(0),
            base,
            "{grant:?}: the cluster-wide verifier covers it: kept"
        );
        assert!(
            base_kept.warned(&format!("image \"{base}\": kept")),
            "{grant:?}: {:?}",
            base_kept.warnings
        );
    }

    // Nothing granted: the list never returns; the API server gives up and admits as written
    // an image that would otherwise be swapped.
    let none = &servers[2];
    let waited = apply(
        &plane,
        &pod(&Grant::Nothing.namespace("other"), "unsigned", &unsigned),
    );
    println!(
        "nothing granted: admitted after {:?}\npolicy-server:\n{}",
        waited.took,
        none.log()
    );
    assert_eq!(waited.image(0), unsigned, "{waited:?}");
    assert_eq!(waited.annotation(ORIGINAL_IMAGES), None);
    assert!(waited.warnings.is_empty(), "{:?}", waited.warnings);
    assert!(
        waited.took >= Duration::from_secs(HUNG_TIMEOUT_SECONDS.into()),
        "admitted after {:?}: an answer, not the webhook's timeout",
        waited.took
    );

    // Each `late` namespace's first admission, before any verifier covers it there: swapped.
    // The host has now listed that namespace's AdmissionPolicies (one reflector per kind and
    // namespace, built at its first list) and the cluster-wide policies.
    for grant in &grants[..2] {
        assert_eq!(
            apply(&plane, &pod(&grant.namespace("late"), "before", &unsigned)).image(0),
            registries.mirror_image("org/app", "unsigned", &images.unsigned),
            "{grant:?}: no verifier in late yet"
        );
    }
    // Verifiers created now: one in each `late` namespace, and a cluster-wide one over
    // `org/*`, which covers the `other` namespaces too.
    let mut created: Vec<Value> = grants[..2]
        .iter()
        .map(|grant| {
            images.verifier(
                "AdmissionPolicy",
                Some(&grant.namespace("late")),
                "verify-image-signatures",
                "org/*",
            )
        })
        .collect();
    created.push(images.verifier("ClusterAdmissionPolicy", None, "verify-org-images", "org/*"));
    let list = json!({"apiVersion": "v1", "kind": "List", "items": created});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&list.to_string()));
    for which in ["late", "other"] {
        // With `watch`, the policy-server's store has them within moments: kept.
        let namespace = Grant::GetListWatch.namespace(which);
        let started = Instant::now();
        let watched = loop {
            let answered = chain::dry_run(&plane, &pod(&namespace, "after", &unsigned));
            if answered.image(0) == unsigned {
                break answered;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "with watch, the new verifier over {namespace} was not seen within 30 s: \
                 {answered:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        assert!(
            watched.warned(&format!("image \"{unsigned}\": kept")),
            "{:?}",
            watched.warnings
        );
        // Without `watch`, after the server with `watch` has seen them: never seen, swapped
        // to the mirror as before they existed.
        let stale = apply(
            &plane,
            &pod(&Grant::GetList.namespace(which), "after", &unsigned),
        );
        assert_eq!(
            stale.image(0),
            registries.mirror_image("org/app", "unsigned", &images.unsigned),
            "without watch, a verifier created after the first list of {which}: {stale:?}"
        );
    }
}

/// f. The real verify-image-signatures 1.0.11 chained with the swapper in both orders, as the
/// API server orders mutating webhooks (by configuration name: `clusterwide-image-swapper`
/// before `clusterwide-verify-image-signatures`, and 1.37.2's `kw.ap.<ns>.verify-image-signatures`
/// before `kw.cap.image-swapper`), its rules on the sources or on every image, the swapper
/// with the same rule in `signatures`: every image admitted or refused as by the verifier alone
/// (the unsigned one refused by the verifier, the signed one admitted at the digest the
/// verifier alone pins, from the mirror).
#[test]
fn the_real_verifier_chained_in_both_orders_decides_as_alone() {
    let Some(tools) = RealTools::find("real_chain::the_real_verifier_chained_in_both_orders")
    else {
        return;
    };
    let plane = chain::shared_plane(&tools);
    let images = SignedImages::start("chain-verifier");
    let registries = &images.registries;
    let by_source = images.rule(&format!("{}/org/*", registries.source.host));
    let mut swapper_settings = registries.settings();
    swapper_settings["signatures"] = json!([by_source]);
    let verifier_module = tools.bin("verify-image-signatures.wasm");
    let sources = registries.sources();
    let server = PolicyServer::start(
        &tools,
        &chain::policies_yml(
            &tools,
            &[
                Entry::new("image-swapper", &swapper(&tools), swapper_settings),
                Entry::new(
                    "verifier-sources",
                    &verifier_module,
                    json!({"signatures": [by_source]}),
                ),
                Entry::new(
                    "verifier-all",
                    &verifier_module,
                    json!({"signatures": [images.rule("*")]}),
                ),
            ],
        ),
        options(&sources),
    );
    // (namespace, the configurations' names and policies in the order the API server calls them)
    let chains: [(&str, &[(&str, &str)]); 6] = [
        (
            "alone-sources",
            &[("clusterwide-verify-image-signatures", "verifier-sources")],
        ),
        (
            "alone-all",
            &[("clusterwide-verify-image-signatures", "verifier-all")],
        ),
        (
            "swapper-first-sources",
            &[
                ("clusterwide-image-swapper", "image-swapper"),
                ("clusterwide-verify-image-signatures", "verifier-sources"),
            ],
        ),
        (
            "swapper-first-all",
            &[
                ("clusterwide-image-swapper", "image-swapper"),
                ("clusterwide-verify-image-signatures", "verifier-all"),
            ],
        ),
        (
            "verifier-first-sources",
            &[
                (
                    "kw.ap.verifier-first-sources.verify-image-signatures",
                    "verifier-sources",
                ),
                ("kw.cap.image-swapper", "image-swapper"),
            ],
        ),
        (
            "verifier-first-all",
            &[
                (
                    "kw.ap.verifier-first-all.verify-image-signatures",
                    "verifier-all",
                ),
                ("kw.cap.image-swapper", "image-swapper"),
            ],
        ),
    ];
    chain::namespaces(&plane, &chains.map(|(namespace, _)| namespace));
    for (namespace, webhooks) in &chains {
        let names: Vec<String> = webhooks
            .iter()
            .map(|(name, _)| format!("{name}.{namespace}"))
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(sorted, names, "the API server calls them in this order");
        for ((_, policy), name) in webhooks.iter().zip(&names) {
            Webhook {
                name,
                server: &server,
                policy,
                namespaces: &[namespace],
                failure_policy: "Fail",
                timeout_seconds: WEBHOOK_TIMEOUT_SECONDS,
            }
            .install(&plane);
        }
    }

    let unsigned = registries.image("org/app", "unsigned");
    let signed = registries.image("org/app", "signed");
    let mut table = Vec::new();
    for rules in ["sources", "all"] {
        let alone_namespace = format!("alone-{rules}");
        for (tag, image) in [("unsigned", &unsigned), ("signed", &signed)] {
            let alone = apply(&plane, &pod(&alone_namespace, tag, image));
            for order in ["swapper-first", "verifier-first"] {
                let namespace = format!("{order}-{rules}");
                let chained = apply(&plane, &pod(&namespace, tag, image));
                table.push(format!(
                    "{namespace} {tag}: alone {}, chained {}",
                    outcome(&alone),
                    outcome(&chained)
                ));
                match (&alone.stored, &chained.stored) {
                    (None, None) => {
                        for applied in [&alone, &chained] {
                            assert!(
                                applied.refused.as_deref().is_some_and(|refusal| refusal
                                    .contains(&format!("admission webhook \"verifier-{rules}.kubewarden.admission\" denied the request"))),
                                "{namespace} {tag}: refused by the verifier: {applied:?}"
                            );
                        }
                    }
                    (Some(_), Some(_)) => {
                        assert_eq!(
                            alone.image(0),
                            format!("{signed}@{}", images.signed),
                            "{namespace}: the verifier alone pins the signed image"
                        );
                        assert_eq!(
                            chained.image(0),
                            registries.mirror_image("org/app", "signed", &images.signed),
                            "{namespace}: the same digest, from the mirror"
                        );
                    }
                    _ => panic!("{namespace} {tag}: alone {alone:?}, chained {chained:?}"),
                }
            }
        }
    }
    println!("{}", table.join("\n"));
    assert_eq!(
        table
            .iter()
            .filter(|row| row.contains("chained admitted"))
            .count(),
        4,
        "the signed image in the four chains: {table:#?}"
    );
}

fn outcome(applied: &chain::Applied) -> &'static str {
    if applied.stored.is_some() {
        "admitted"
    } else {
        "refused"
    }
}

/// g. `policyServerServiceAccount`: a PolicyServer that may not list or watch the verifier
/// kinds is found out before the lists are read (the host's `can_i`, a SubjectAccessReview for
/// that ServiceAccount), and its verifiers are read as unreadable: `onLookupError` keeps the
/// image at its source with a warning naming the verb, the kind and the ServiceAccount, or
/// refuses the Pod. Three policy-servers as in scenario e (their ServiceAccounts granted `get`,
/// `list` and `watch` on the policy kinds, only `get` and `list`, or nothing; each may create
/// SubjectAccessReviews, as Kubewarden's chart grants by default), in namespaces no verifier
/// covers, where without the setting the image would be swapped:
/// - with the three verbs, swapped as without the setting;
/// - without `watch`, kept (or refused) at once, where scenario e shows the list answering once
///   and then going stale;
/// - with nothing, kept (or refused) with an answer, where scenario e waits out the webhook's
///   `timeoutSeconds`.
///
/// And the extra cost per admission, printed: `image-swapper` beside `image-swapper-unchecked`
/// (the same settings without `policyServerServiceAccount`) on the server with the three verbs,
/// POSTed to policy-server directly.
#[test]
fn a_policy_server_that_may_not_list_or_watch_the_verifiers_is_found_out() {
    let Some(tools) = RealTools::find("real_chain::a_policy_server_that_may_not_list_or_watch")
    else {
        return;
    };
    let plane = chain::shared_plane(&tools);
    chain::kubewarden_crds(&plane);
    let images = SignedImages::start("chain-can-i");
    let registries = &images.registries;
    let grants = [Grant::GetListWatch, Grant::GetList, Grant::Nothing];
    let namespace = |grant: Grant, fallback: &str| format!("can-i-{}-{fallback}", grant.name());
    let mut namespaces = Vec::new();
    for grant in grants {
        for fallback in ["keep", "reject"] {
            namespaces.push(namespace(grant, fallback));
        }
    }
    chain::namespaces(
        &plane,
        &namespaces.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let module = swapper(&tools);
    let sources = registries.sources();
    let account = |grant: Grant| format!("policy-server-can-i-{}", grant.name());
    let mut kubeconfigs = Vec::new();
    for grant in grants {
        kubeconfigs.push(chain::service_account_kubeconfig(
            &plane,
            "kubewarden",
            &account(grant),
            grant.verbs(),
        ));
    }
    // Kubewarden's chart grants every PolicyServer `create` on SubjectAccessReviews
    // (`policyServer.permissions`); the host sends `can_i` as its own ServiceAccount.
    let subjects: Vec<Value> = grants
        .iter()
        .map(|grant| json!({"kind": "ServiceAccount", "name": account(*grant), "namespace": "kubewarden"}))
        .collect();
    let review_rights = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "policy-server-can-i"},
            "rules": [{"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
                "verbs": ["create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "policy-server-can-i"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": "policy-server-can-i"},
            "subjects": subjects}]});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&review_rights.to_string()));

    let policies: Vec<String> = grants
        .iter()
        .map(|grant| {
            let mut settings = registries.settings();
            settings["verifiers"] = json!([{"module": "*/verify-image-signatures:*"}]);
            let unchecked = settings.clone();
            settings["policyServerServiceAccount"] =
                json!(format!("kubewarden/{}", account(*grant)));
            let mut rejecting = settings.clone();
            rejecting["onLookupError"] = json!("reject");
            chain::policies_yml(
                &tools,
                &[
                    Entry::new("image-swapper", &module, settings).reading_policies(),
                    Entry::new("image-swapper-reject", &module, rejecting).reading_policies(),
                    Entry::new("image-swapper-unchecked", &module, unchecked).reading_policies(),
                ],
            )
        })
        .collect();
    let servers: Vec<PolicyServer> = std::thread::scope(|scope| {
        let starting: Vec<_> = policies
            .iter()
            .zip(&kubeconfigs)
            .map(|(policies, kubeconfig)| {
                let (sources, tools) = (&sources, &tools);
                scope.spawn(move || {
                    PolicyServer::start(
                        tools,
                        policies,
                        PolicyServerOptions {
                            kubeconfig: Some(kubeconfig),
                            ..options(sources)
                        },
                    )
                })
            })
            .collect();
        starting
            .into_iter()
            .map(|s| s.join().expect("policy-server"))
            .collect()
    });
    for (grant, server) in grants.iter().zip(&servers) {
        for (fallback, policy) in [
            ("keep", "image-swapper"),
            ("reject", "image-swapper-reject"),
        ] {
            let served = namespace(*grant, fallback);
            Webhook {
                name: &format!("clusterwide-can-i-{}-{fallback}", grant.name()),
                server,
                policy,
                namespaces: &[served.as_str()],
                failure_policy: "Ignore",
                timeout_seconds: WEBHOOK_TIMEOUT_SECONDS,
            }
            .install(&plane);
        }
    }

    let unsigned = registries.image("org/app", "unsigned");
    let swapped = registries.mirror_image("org/app", "unsigned", &images.unsigned);
    for fallback in ["keep", "reject"] {
        let admitted = apply(
            &plane,
            &pod(
                &namespace(Grant::GetListWatch, fallback),
                "unsigned",
                &unsigned,
            ),
        );
        assert_eq!(
            admitted.image(0),
            swapped,
            "{fallback}: list and watch granted, no verifier covers it: swapped\n{admitted:?}\n{}",
            servers[0].log()
        );
    }
    for (grant, server, verb) in [
        (Grant::GetList, &servers[1], "watch"),
        (Grant::Nothing, &servers[2], "list"),
    ] {
        let why = format!(
            "the PolicyServer's ServiceAccount kubewarden/{} may not {verb} ClusterAdmissionPolicy objects",
            account(grant)
        );
        let kept = apply(
            &plane,
            &pod(&namespace(grant, "keep"), "unsigned", &unsigned),
        );
        println!(
            "{grant:?}, onLookupError: keep: answered in {:?}",
            kept.took
        );
        assert_eq!(
            kept.image(0),
            unsigned,
            "{grant:?}: no {verb}: kept at its source\n{kept:?}\n{}",
            server.log()
        );
        assert!(
            kept.warned(&format!("image \"{unsigned}\": kept")) && kept.warned(&why),
            "{grant:?}: the warning names the verb, the kind and the ServiceAccount: {:?}",
            kept.warnings
        );
        assert!(
            kept.took < Duration::from_secs(WEBHOOK_TIMEOUT_SECONDS.into()),
            "{grant:?}: answered after {:?}: the webhook's timeout, not the policy's answer",
            kept.took
        );
        let refused = apply(
            &plane,
            &pod(&namespace(grant, "reject"), "unsigned", &unsigned),
        );
        println!(
            "{grant:?}, onLookupError: reject: answered in {:?}",
            refused.took
        );
        let refusal = refused.refused.as_deref().unwrap_or_default();
        assert!(
            refusal.contains(&why),
            "{grant:?}: no {verb}, onLookupError: reject: refused, naming why: {refused:?}"
        );
    }

    // The extra cost per admission: can_i's eight SubjectAccessReviews (list and watch on four
    // kinds), which policy-server caches 5 s per question, beside the same policy without them.
    let watching = &servers[0];
    let request = |n: usize| {
        let mut request = rig::pod_request(
            "CREATE",
            json!({"containers": [{"name": "web", "image": unsigned}]}),
        );
        request["uid"] = json!(format!("5c0e1d2a-0b7c-4d8e-9f10-{n:012x}"));
        request["namespace"] = json!(namespace(Grant::GetListWatch, "keep"));
        request["object"]["metadata"]["namespace"] = request["namespace"].clone();
        PolicyServer::review(&request)
    };
    let time = |policy: &str, n: usize| {
        let (answer, took) = watching.post(&format!("validate/{policy}"), &request(n));
        assert_eq!(answer["response"]["allowed"], json!(true), "{answer}");
        took
    };
    time("image-swapper-unchecked", 0);
    std::thread::sleep(Duration::from_millis(5_500));
    let cold = time("image-swapper", 1);
    let (mut checked, mut unchecked) = (Vec::new(), Vec::new());
    for n in 0..15 {
        checked.push(time("image-swapper", 2 * n + 2));
        unchecked.push(time("image-swapper-unchecked", 2 * n + 3));
    }
    checked.sort();
    unchecked.sort();
    println!(
        "can_i cost: first admission after the host's 5 s cache expired {cold:?}; \
         median of 15 (cached) {:?} with policyServerServiceAccount, {:?} without",
        checked[7], unchecked[7]
    );
}

/// h. The write-back after a verifier that ran first. On 1.38 a team's namespaced verifier
/// (`kw.ap.<ns>.verify-image-signatures`, mutating by default) sorts before
/// `kw.cap.image-swapper`: it sees a Pod naming the mirror's spelling of an image, which its
/// rules (on the sources) do not name, and admits it. The swapper must not then write the
/// image back to its source spelling when the source is unsigned: under `signatures` and
/// under `verifiers` (reading the team's real AdmissionPolicy through policy-server 1.35's
/// Kubernetes capability), with the defaults `onUnverified: keep` and `onLookupError: keep`,
/// the mirror spelling of an unsigned image the mirror lacks is refused by the swapper; alone,
/// the verifier admits it as written (a Pod that would never pull). The signed image's mirror
/// spelling is admitted at its verified digest, and the unsigned source refused by the verifier,
/// in every chain as alone.
#[test]
fn a_namespaced_verifier_called_first_is_not_undone_by_the_write_back() {
    let Some(tools) = RealTools::find("real_chain::a_namespaced_verifier_called_first") else {
        return;
    };
    let plane = chain::shared_plane(&tools);
    chain::kubewarden_crds(&plane);
    let images = SignedImages::start("chain-late");
    let registries = &images.registries;
    // Unsigned at the source, never copied: the mirror lacks it.
    Image::new("chain-late org/app late", "linux/amd64").push(
        &registries.source,
        "org/app",
        Some("late"),
    );
    let (alone, by_signatures, by_verifiers) = ("late-alone", "late-signatures", "late-verifiers");
    chain::namespaces(&plane, &[alone, by_signatures, by_verifiers]);
    let team_verifier = |namespace: &str| {
        images.verifier(
            "AdmissionPolicy",
            Some(namespace),
            "verify-image-signatures",
            "org/*",
        )
    };
    let list = json!({"apiVersion": "v1", "kind": "List",
        "items": [team_verifier(by_signatures), team_verifier(by_verifiers)]});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&list.to_string()));

    let by_source = images.rule(&format!("{}/org/*", registries.source.host));
    let mut with_signatures = registries.settings();
    with_signatures["signatures"] = json!([by_source]);
    let mut with_verifiers = registries.settings();
    with_verifiers["verifiers"] = json!([{"module": "*/verify-image-signatures:*"}]);
    let module = swapper(&tools);
    let sources = registries.sources();
    let kubeconfig = chain::service_account_kubeconfig(
        &plane,
        "kubewarden",
        "policy-server-late",
        &["get", "list", "watch"],
    );
    let server = PolicyServer::start(
        &tools,
        &chain::policies_yml(
            &tools,
            &[
                Entry::new("swapper-signatures", &module, with_signatures),
                Entry::new("swapper-verifiers", &module, with_verifiers).reading_policies(),
                Entry::new(
                    "team-verifier",
                    &tools.bin("verify-image-signatures.wasm"),
                    json!({"signatures": [by_source]}),
                ),
            ],
        ),
        PolicyServerOptions {
            kubeconfig: Some(&kubeconfig),
            ..options(&sources)
        },
    );
    // The names the controller gives a namespaced policy's and a cluster-wide policy's webhook;
    // the API server calls them in this order (by name).
    for (namespace, swapper_policy) in [
        (alone, None),
        (by_signatures, Some("swapper-signatures")),
        (by_verifiers, Some("swapper-verifiers")),
    ] {
        let verifier_name = format!("kw.ap.{namespace}.verify-image-signatures");
        let swapper_name = format!("kw.cap.image-swapper.{namespace}");
        assert!(verifier_name < swapper_name, "the verifier is called first");
        let mut webhooks = vec![(verifier_name, "team-verifier")];
        webhooks.extend(swapper_policy.map(|policy| (swapper_name, policy)));
        for (name, policy) in &webhooks {
            Webhook {
                name,
                server: &server,
                policy,
                namespaces: &[namespace],
                failure_policy: "Fail",
                timeout_seconds: WEBHOOK_TIMEOUT_SECONDS,
            }
            .install(&plane);
        }
    }

    let late_at_mirror = format!("{}/cache/org/app:late", registries.mirror.host);
    let signed_at_mirror = format!("{}/cache/org/app:signed", registries.mirror.host);
    let unsigned = registries.image("org/app", "unsigned");

    let admitted_alone = apply(&plane, &pod(alone, "late", &late_at_mirror));
    assert_eq!(
        admitted_alone.image(0),
        late_at_mirror,
        "alone, the team's verifier admits the mirror spelling its rules do not name: {admitted_alone:?}"
    );
    for (namespace, policy) in [
        (by_signatures, "swapper-signatures"),
        (by_verifiers, "swapper-verifiers"),
    ] {
        let late = apply(&plane, &pod(namespace, "late", &late_at_mirror));
        assert!(
            late.stored.is_none(),
            "{namespace}: the unsigned source written back after the verifier ran: {late:?}\n{}",
            server.log()
        );
        let refusal = late.refused.as_deref().unwrap_or_default();
        assert!(
            refusal.contains(&format!(
                "admission webhook \"{policy}.kubewarden.admission\" denied the request"
            )) && refusal.contains(&late_at_mirror),
            "{namespace}: refused by the swapper, naming the image: {refusal}"
        );

        let signed = apply(&plane, &pod(namespace, "signed", &signed_at_mirror));
        assert_eq!(
            signed.image(0),
            registries.mirror_image("org/app", "signed", &images.signed),
            "{namespace}: the signed image's mirror spelling, at its verified digest: {signed:?}"
        );
        let source = apply(&plane, &pod(namespace, "unsigned", &unsigned));
        assert!(
            source.refused.as_deref().is_some_and(|refusal| refusal
                .contains("admission webhook \"team-verifier.kubewarden.admission\" denied")),
            "{namespace}: the unsigned source, refused by the verifier as alone: {source:?}"
        );
    }
}
