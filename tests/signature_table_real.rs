//! The signature spellings table (`tests/signatures.rs`'s, there with a stand-in verifier in the
//! rig's runtime) through the real programs: the built module (annotated by the real kwctl)
//! beside the real verify-image-signatures 1.0.11, in both orders, each row judged against the
//! real verifier alone on the Pod as the user wrote it. A row: the verifier's rules (on the
//! sources, on `*`, or on the mirror's name only), the swapper's rules pasted (`signatures`) or
//! read from the cluster (`verifiers`, a real AdmissionPolicy in a real kube-apiserver),
//! `verifySource` (the default, at the source, or `false`, at the mirror), `onUnverified` keep or
//! reject, the verifier first (a mutating policy; with `verifiers` a mutating team policy, whose
//! 1.38 webhook `kw.ap.<ns>.…` sorts before `kw.cap.…`) or last (with `verifiers` a validating
//! team policy, called after every mutation), the image (signed, unsigned, or `late`: unsigned
//! and absent from the mirror) spelled as its source, under the mirror's name, or pinned there.
//! 3 × 2 × 2 × 2 × 2 × 3 × 3 = 432 rows, each a test of its own (its path names the row).
//!
//! How it is run, and why. `kwctl run` was measured here: 0.2 s for the verifier on a request
//! its rules do not name, 0.05 s for the swapper without lookups (kwctl keeps compiled modules),
//! and 0.38 s a run in the rows of `mod under_kwctl` (verifications, the API server's lists), on
//! a machine of two cores under a load of 14. The table asks 864 chained evaluations: under
//! `kwctl run`, 330 s of runs (165 s on two threads), more than this binary's share of CI. So the
//! whole table is served by one policy-server 1.35 (both modules, every setting a policy of its
//! own, the Kubernetes capability on a real kube-apiserver 1.36 holding the team's
//! AdmissionPolicies), and each row's AdmissionReview is POSTed to the first policy, its JSON
//! patch applied to the object, and the patched object POSTed to the second: what the API server
//! does between two mutating webhooks (`tests/real_chain.rs` shows these policies in a real API
//! server's chain). Measured under the same load: 36 s until the servers are ready (policy-server
//! compiles 23 policies), 3 s for the verifier alone, 28 s for the 432 rows (65 ms a row); about
//! 100 s for the binary. Twelve rows also run under `kwctl run` itself, the verifier's answer
//! then the swapper's, and must end as policy-server's and as the verifier alone.
//!
//! The policies reach the registries through the rig's relay, [`ROUND_TRIP`] away (2 ms: 26 s
//! for the rows, 61 ms a row). One earlier run at 10 ms took 300 s for the rows (694 ms a row);
//! that did not come back: with the relay at 10 ms the rows took 20.5 s and 20.7 s (47-48 ms a
//! row, the verifier alone 36 ms an answer), at 50 ms 55 s (128 ms a row), on this machine
//! under a load of 4.5. The registries answer the same requests at every distance (278 at the
//! source, 860 at the mirror, 125 connections, 84 of them HTTPS attempts on the plain
//! registries): about 1,260 round trips over two threads, 6 s at 10 ms. Most host calls are
//! answered from policy-server's 60 s cache; what is asked again every admission is a failed
//! verification (never cached), two requests on a kept connection. The 300 s were not the
//! round trips; their cause is not known (the same code and relay gave the figures above).
//! [`one_admission_at_a_distance`] prints one admission's requests and time at 2, 10 and 50
//! ms; docs/performance.md ("Signatures at a distance") has its figures. Every limit here is
//! generous, so the distance changes no row's outcome, only the time.
//!
//! The rows are computed once per binary, by the first test that asks (the servers and
//! registries live for that computation only, so nothing outlives the binary), and each test
//! asserts its own row. A row ends as the verifier alone ends on the Pod as written: refused
//! when it refuses; admitted at the same content (the digest the verifier's image names, or its
//! tag's digest when it pins nothing) when it admits. Two kinds of row differ, by design (see
//! [`Difference`]); [`differences_are_only_the_documented_ones`] counts them.

mod rig;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rig::chain::{self, Entry};
use rig::cosign::{Signer, signature_tag};
use rig::images::Image;
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::tools::{ControlPlane, PolicyServer, PolicyServerOptions, RealTools};
use serde_json::{Value, json};

const REPOSITORY: &str = "org/app";
const VERIFIER_MODULE: &str =
    "registry://ghcr.io/kubewarden/policies/verify-image-signatures:v1.0.11";
/// Generous limits (a loaded CI machine decides nothing by time here; the budget's subject is
/// `tests/distance.rs`'s), in the order the docs give them.
const LOOKUP_BUDGET_MS: u64 = 8_000;
const POLICY_TIMEOUT_SECONDS: u64 = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum RulesOn {
    Sources,
    Everything,
    MirrorName,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Read {
    Signatures,
    Verifiers,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum VerifyAt {
    Source,
    Mirror,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum OnUnverified {
    Keep,
    Reject,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Order {
    VerifierFirst,
    VerifierLast,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Tag {
    Unsigned,
    Signed,
    /// Unsigned at the source, never copied: the mirror lacks it.
    Late,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Spelling {
    Source,
    Mirror,
    MirrorPinned,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Row {
    rules_on: RulesOn,
    read: Read,
    verify_at: VerifyAt,
    on_unverified: OnUnverified,
    order: Order,
    tag: Tag,
    spelling: Spelling,
}

impl Row {
    fn new(
        rules_on: RulesOn,
        read: Read,
        verify_at: VerifyAt,
        on_unverified: OnUnverified,
        order: Order,
        tag: Tag,
        spelling: Spelling,
    ) -> Row {
        Row {
            rules_on,
            read,
            verify_at,
            on_unverified,
            order,
            tag,
            spelling,
        }
    }

    fn all() -> Vec<Row> {
        let mut rows = Vec::new();
        for rules_on in [RulesOn::Sources, RulesOn::Everything, RulesOn::MirrorName] {
            for read in [Read::Signatures, Read::Verifiers] {
                for verify_at in [VerifyAt::Source, VerifyAt::Mirror] {
                    for on_unverified in [OnUnverified::Keep, OnUnverified::Reject] {
                        for order in [Order::VerifierFirst, Order::VerifierLast] {
                            for tag in [Tag::Unsigned, Tag::Signed, Tag::Late] {
                                for spelling in
                                    [Spelling::Source, Spelling::Mirror, Spelling::MirrorPinned]
                                {
                                    rows.push(Row::new(
                                        rules_on,
                                        read,
                                        verify_at,
                                        on_unverified,
                                        order,
                                        tag,
                                        spelling,
                                    ));
                                }
                            }
                        }
                    }
                }
            }
        }
        rows
    }

    /// The verifier of this row: mutating (it pins what it verifies) except last under
    /// `verifiers`, where the team's policy is validating.
    fn verifier(&self) -> VerifierPolicy {
        VerifierPolicy {
            rules_on: self.rules_on,
            mutating: !(self.read == Read::Verifiers && self.order == Order::VerifierLast),
        }
    }

    /// The namespace of the request: under `verifiers`, the one whose AdmissionPolicy is this
    /// row's verifier.
    fn namespace(&self) -> String {
        match self.read {
            Read::Signatures => "plain".to_string(),
            Read::Verifiers => self.verifier().namespace(),
        }
    }
}

/// One verify-image-signatures policy: its rules, and whether it mutates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct VerifierPolicy {
    rules_on: RulesOn,
    mutating: bool,
}

impl VerifierPolicy {
    const ALL: [VerifierPolicy; 6] = [
        VerifierPolicy::of(RulesOn::Sources, true),
        VerifierPolicy::of(RulesOn::Sources, false),
        VerifierPolicy::of(RulesOn::Everything, true),
        VerifierPolicy::of(RulesOn::Everything, false),
        VerifierPolicy::of(RulesOn::MirrorName, true),
        VerifierPolicy::of(RulesOn::MirrorName, false),
    ];

    const fn of(rules_on: RulesOn, mutating: bool) -> VerifierPolicy {
        VerifierPolicy { rules_on, mutating }
    }

    fn id(&self) -> String {
        format!(
            "verifier-{}-{}",
            rules_name(self.rules_on),
            if self.mutating { "first" } else { "last" }
        )
    }

    /// The team namespace whose AdmissionPolicy is this verifier.
    fn namespace(&self) -> String {
        format!("team-{}", self.id().trim_start_matches("verifier-"))
    }

    fn settings(&self, world: &World) -> Value {
        let mut settings = json!({"signatures": [world.rule(self.rules_on)]});
        if !self.mutating {
            settings["modifyImagesWithDigest"] = json!(false);
        }
        settings
    }
}

fn rules_name(rules_on: RulesOn) -> &'static str {
    match rules_on {
        RulesOn::Sources => "sources",
        RulesOn::Everything => "everything",
        RulesOn::MirrorName => "mirror-name",
    }
}

/// The swapper's policy id and settings for a row.
fn swapper_id(row: &Row) -> String {
    let read = match row.read {
        Read::Signatures => format!("signatures-{}", rules_name(row.rules_on)),
        Read::Verifiers => "verifiers".to_string(),
    };
    format!("swapper-{read}-{:?}-{:?}", row.verify_at, row.on_unverified).to_lowercase()
}

fn swapper_settings(row: &Row, world: &World) -> Value {
    let mut settings = json!({
        "mirrors": [{"source": world.source_host(), "target": format!("{}/cache", world.mirror_host())}],
        "lookupBudgetMilliseconds": LOOKUP_BUDGET_MS,
        "onUnverified": match row.on_unverified {
            OnUnverified::Keep => "keep",
            OnUnverified::Reject => "reject",
        },
    });
    match row.read {
        Read::Signatures => settings["signatures"] = json!([world.rule(row.rules_on)]),
        Read::Verifiers => settings["verifiers"] = json!([{}]),
    }
    if row.verify_at == VerifyAt::Mirror {
        settings["verifySource"] = json!(false);
    }
    settings
}

/// The source and its mirror (plain HTTP on loopback), one signing key: at the source
/// `org/app:signed` (signed), `:unsigned` and `:late`; the mirror holds `signed` (and its
/// signature, copied as the fill job copies it) and `unsigned`, at the same digests.
/// The policies reach both through a relay that adds [`ROUND_TRIP`] to every exchange, as a
/// registry in the same region is; the test's own pushes and reads go straight to them.
struct World {
    source: TestRegistry,
    mirror: TestRegistry,
    source_far: LatencyProxy,
    mirror_far: LatencyProxy,
    signer: Signer,
    digests: HashMap<Tag, String>,
}

/// The network's round trip between the policies and the registries.
const ROUND_TRIP: Duration = Duration::from_millis(2);

impl World {
    fn start() -> World {
        World::start_at(ROUND_TRIP)
    }

    /// The same world with the policies `round_trip` away from the registries.
    fn start_at(round_trip: Duration) -> World {
        let source = TestRegistry::start("table-source").expect("registry");
        let mirror = TestRegistry::start("table-mirror").expect("registry");
        let signer = Signer::generate();
        let mut digests = HashMap::new();
        for (tag, name) in [
            (Tag::Signed, "signed"),
            (Tag::Unsigned, "unsigned"),
            (Tag::Late, "late"),
        ] {
            let image = Image::new(&format!("table {name}"), "linux/amd64");
            let digest = image.push(&source, REPOSITORY, Some(name));
            if tag != Tag::Late {
                image.push(&mirror, &format!("cache/{REPOSITORY}"), Some(name));
            }
            digests.insert(tag, digest);
        }
        signer.sign(&source, REPOSITORY, &digests[&Tag::Signed], &[]);
        let signature = signature_tag(&digests[&Tag::Signed]);
        let status = std::process::Command::new("skopeo")
            .args(["copy", "--all", "--preserve-digests"])
            .args(["--src-tls-verify=false", "--dest-tls-verify=false"])
            .arg(format!("docker://{}/{REPOSITORY}:{signature}", source.host))
            .arg(format!(
                "docker://{}/cache/{REPOSITORY}:{signature}",
                mirror.host
            ))
            .status()
            .expect("skopeo");
        assert!(status.success(), "skopeo copied the signature");
        let far = |registry: &TestRegistry| {
            LatencyProxy::network(&registry.host, round_trip).expect("latency proxy")
        };
        World {
            source_far: far(&source),
            mirror_far: far(&mirror),
            source,
            mirror,
            signer,
            digests,
        }
    }

    /// The source's host as the policies name it (behind its relay).
    fn source_host(&self) -> &str {
        &self.source_far.host
    }

    fn mirror_host(&self) -> &str {
        &self.mirror_far.host
    }

    fn rule(&self, rules_on: RulesOn) -> Value {
        let pattern = match rules_on {
            RulesOn::Sources => format!("{}/org/*", self.source_host()),
            RulesOn::Everything => "*".to_string(),
            RulesOn::MirrorName => format!("{}/*", self.mirror_host()),
        };
        json!({"image": pattern, "pubKeys": [self.signer.public_pem]})
    }

    fn tag_name(tag: Tag) -> &'static str {
        match tag {
            Tag::Unsigned => "unsigned",
            Tag::Signed => "signed",
            Tag::Late => "late",
        }
    }

    /// The image as the Pod writes it.
    fn image(&self, tag: Tag, spelling: Spelling) -> String {
        let name = World::tag_name(tag);
        match spelling {
            Spelling::Source => format!("{}/{REPOSITORY}:{name}", self.source_host()),
            Spelling::Mirror => format!("{}/cache/{REPOSITORY}:{name}", self.mirror_host()),
            Spelling::MirrorPinned => format!(
                "{}/cache/{REPOSITORY}:{name}@{}",
                self.mirror_host(),
                self.digests[&tag]
            ),
        }
    }

    /// The content an admitted image names: the digest it pins, else the digest its tag names
    /// in its registry now; None when that registry does not hold it (the Pod would never run).
    fn content(&self, image: &str) -> Option<String> {
        let under = |host: &str| image.strip_prefix(&format!("{host}/"));
        let (registry, rest) = if let Some(rest) = under(self.source_host()) {
            (&self.source, rest)
        } else if let Some(rest) = under(self.mirror_host()) {
            (&self.mirror, rest)
        } else {
            return None;
        };
        let (name, reference) = match rest.split_once('@') {
            Some((name, digest)) => (name.split(':').next().unwrap_or(name), digest),
            None => rest.rsplit_once(':')?,
        };
        registry.digest_of(name, reference)
    }
}

/// What a webhook, or a chain of them, ends with: the image stored, or the refusal.
type Admitted = Result<String, String>;

/// One row's outcome, as plain data (the servers are gone when tests read it).
#[derive(Clone, Debug)]
struct Outcome {
    written: String,
    /// The verifier alone on the Pod as written, and the content it admits.
    alone: Admitted,
    alone_content: Option<String>,
    /// The verifier alone on the source spelling of the same image.
    alone_on_source: Admitted,
    chain: Admitted,
    chain_content: Option<String>,
}

/// Why a row's chain may differ from the verifier alone on the Pod as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Difference {
    /// The verifier alone admits a name under the mirror that the mirror does not hold (`late`
    /// spelled there, rules on the sources): the Pod would never run. The chain refuses it: the
    /// swapper does not write an unverified source back (the first case).
    NeverRuns,
    /// The verifier alone admits the mirror's spelling of an image whose source spelling it
    /// refuses (rules on the sources do not match the mirror's name): the same content, unsigned
    /// at its source, would run under the mirror's name. The chain refuses it, as the verifier
    /// alone refuses the source: a covered image under a mirror's name that does not verify is
    /// refused, whatever `onUnverified` and `onLookupError` say (settings.md, signatures.md).
    MirrorNameEscapesTheRules,
}

/// What the chain must end with: refused, or admitted at this content.
#[derive(Clone, Debug, PartialEq)]
enum Expected {
    Refused,
    Admitted(String),
}

impl Outcome {
    fn expected(&self, row: &Row) -> (Expected, Option<Difference>) {
        let under_mirror = row.spelling != Spelling::Source;
        match (&self.alone, &self.alone_content) {
            (Err(_), _) => (Expected::Refused, None),
            (Ok(_), None) => (Expected::Refused, Some(Difference::NeverRuns)),
            (Ok(_), Some(_)) if under_mirror && self.alone_on_source.is_err() => (
                Expected::Refused,
                Some(Difference::MirrorNameEscapesTheRules),
            ),
            (Ok(_), Some(content)) => (Expected::Admitted(content.clone()), None),
        }
    }

    fn ended(&self) -> Expected {
        match (&self.chain, &self.chain_content) {
            (Ok(_), Some(content)) => Expected::Admitted(content.clone()),
            // Admitted at nothing the registries hold: shown as its image, never equal.
            (Ok(image), None) => Expected::Admitted(format!("nothing: {image}")),
            (Err(_), _) => Expected::Refused,
        }
    }
}

/// Everything the tests read: each row's outcome through policy-server, the kwctl rows', and
/// the time each took. None: the real tools are absent (outside CI), nothing ran.
struct Table {
    rows: HashMap<Row, Outcome>,
    kwctl: HashMap<Row, Outcome>,
    figures: String,
}

/// The table, computed once by the first test that asks; a failure while computing it is every
/// row's failure, with its message.
fn table() -> Option<&'static Table> {
    static TABLE: OnceLock<Result<Option<Table>, String>> = OnceLock::new();
    let computed = TABLE.get_or_init(|| {
        std::panic::catch_unwind(compute).map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        })
    });
    match computed {
        Ok(table) => table.as_ref(),
        Err(message) => panic!("the table could not be computed: {message}"),
    }
}

/// The rows of `mod under_kwctl`: rules on the sources, the defaults, both reads and orders,
/// the issue's `late` and the unsigned image under the mirror's name, the signed one as its
/// source.
fn kwctl_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for read in [Read::Signatures, Read::Verifiers] {
        for order in [Order::VerifierFirst, Order::VerifierLast] {
            for (tag, spelling) in [
                (Tag::Late, Spelling::Mirror),
                (Tag::Unsigned, Spelling::Mirror),
                (Tag::Signed, Spelling::Source),
            ] {
                rows.push(Row::new(
                    RulesOn::Sources,
                    read,
                    VerifyAt::Source,
                    OnUnverified::Keep,
                    order,
                    tag,
                    spelling,
                ));
            }
        }
    }
    rows
}

/// The servers of the computation.
struct Servers<'a> {
    tools: &'a RealTools,
    world: &'a World,
    plane: &'a ControlPlane,
    server: &'a PolicyServer,
    sources_file: PathBuf,
}

fn compute() -> Option<Table> {
    let tools = RealTools::find("signature_table_real")?;
    let started = Instant::now();
    let world = World::start();
    let plane = chain::shared_plane(&tools);
    chain::kubewarden_crds(&plane);
    let namespaces: Vec<String> = VerifierPolicy::ALL.iter().map(|v| v.namespace()).collect();
    let mut all_namespaces: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    all_namespaces.push("plain");
    chain::namespaces(&plane, &all_namespaces);
    let objects: Vec<Value> = VerifierPolicy::ALL
        .iter()
        .map(|verifier| {
            chain::kubewarden_policy(
                "AdmissionPolicy",
                Some(&verifier.namespace()),
                "verify-image-signatures",
                VERIFIER_MODULE,
                verifier.mutating,
                verifier.settings(&world),
            )
        })
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&list.to_string()));

    let swapper_module = tools.annotated_policy();
    let verifier_module = tools.bin("verify-image-signatures.wasm");
    let mut entries: Vec<Entry> = VerifierPolicy::ALL
        .iter()
        .map(|verifier| {
            let mut entry = Entry::new(&verifier.id(), &verifier_module, verifier.settings(&world));
            entry.mutating = verifier.mutating;
            entry
        })
        .collect();
    let mut swappers = Vec::new();
    for row in Row::all() {
        let id = swapper_id(&row);
        if swappers.contains(&id) {
            continue;
        }
        let entry = Entry::new(&id, &swapper_module, swapper_settings(&row, &world));
        entries.push(match row.read {
            Read::Signatures => entry,
            Read::Verifiers => entry.reading_policies(),
        });
        swappers.push(id);
    }
    let sources = chain::insecure_sources(&[world.source_host(), world.mirror_host()]);
    let kubeconfig = chain::service_account_kubeconfig(
        &plane,
        "kubewarden",
        "policy-server-table",
        &["get", "list", "watch"],
    );
    let server = PolicyServer::start(
        &tools,
        &chain::policies_yml(&tools, &entries),
        PolicyServerOptions {
            kubeconfig: Some(&kubeconfig),
            sources: Some(&sources),
            policy_timeout: Some(POLICY_TIMEOUT_SECONDS),
            ..PolicyServerOptions::default()
        },
    );
    let sources_file = plane.data_dir().join("table-sources.yml");
    std::fs::write(&sources_file, &sources).expect("sources");
    let servers = Servers {
        tools: &tools,
        world: &world,
        plane: &plane,
        server: &server,
        sources_file,
    };
    let ready = started.elapsed();

    // The verifier alone, once per policy and image as written.
    let started = Instant::now();
    let mut alone_keys = Vec::new();
    for verifier in VerifierPolicy::ALL {
        for tag in [Tag::Unsigned, Tag::Signed, Tag::Late] {
            for spelling in [Spelling::Source, Spelling::Mirror, Spelling::MirrorPinned] {
                alone_keys.push((verifier, tag, spelling));
            }
        }
    }
    let alone: HashMap<(VerifierPolicy, Tag, Spelling), Admitted> =
        in_parallel(&alone_keys, |&(verifier, tag, spelling)| {
            let object = pod(&verifier.namespace(), &world.image(tag, spelling));
            servers.post(&verifier.id(), &object).map(|o| image_of(&o))
        });
    let alone_took = started.elapsed();

    let started = Instant::now();
    let all = Row::all();
    let chains = in_parallel(&all, |row| servers.chain_by_policy_server(row));
    let chains_took = started.elapsed();
    let outcome = |row: &Row, chain: Admitted| {
        let verifier = row.verifier();
        let written = world.image(row.tag, row.spelling);
        let alone_answer = alone[&(verifier, row.tag, row.spelling)].clone();
        Outcome {
            alone_content: alone_answer.as_ref().ok().and_then(|i| world.content(i)),
            alone: alone_answer,
            alone_on_source: alone[&(verifier, row.tag, Spelling::Source)].clone(),
            chain_content: chain.as_ref().ok().and_then(|i| world.content(i)),
            chain,
            written,
        }
    };
    let rows: HashMap<Row, Outcome> = chains
        .into_iter()
        .map(|(row, chain)| (row, outcome(&row, chain)))
        .collect();

    let started = Instant::now();
    let by_kwctl = kwctl_rows();
    let kwctl: HashMap<Row, Outcome> = in_parallel(&by_kwctl, |row| servers.chain_by_kwctl(row))
        .into_iter()
        .map(|(row, chain)| (row, outcome(&row, chain)))
        .collect();
    let kwctl_took = started.elapsed();
    let figures = format!(
        "servers ready in {ready:?}; {} verifier-alone answers in {alone_took:?}; {} rows (2 webhooks each) through policy-server in {chains_took:?} ({:?} a row); {} rows under kwctl run in {kwctl_took:?} ({:?} a row, 2 kwctl runs each)",
        alone_keys.len(),
        all.len(),
        chains_took / all.len() as u32,
        by_kwctl.len(),
        kwctl_took / by_kwctl.len() as u32,
    );
    // Straight to stderr, past the harness's capture: the figures of every run.
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "signature_table_real: {figures}");
    drop(servers);
    Some(Table {
        rows,
        kwctl,
        figures,
    })
}

/// `work` over `items` on two threads (the machines this runs on have two cores); the answers
/// keyed by item.
fn in_parallel<K, V, F>(items: &[K], work: F) -> HashMap<K, V>
where
    K: Clone + Eq + std::hash::Hash + Send + Sync,
    V: Send,
    F: Fn(&K) -> V + Sync,
{
    let next = Mutex::new(0usize);
    let answers = Mutex::new(HashMap::new());
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                loop {
                    let index = {
                        let mut next = next.lock().expect("queue");
                        *next += 1;
                        *next - 1
                    };
                    let Some(item) = items.get(index) else {
                        return;
                    };
                    let answer = work(item);
                    answers
                        .lock()
                        .expect("answers")
                        .insert(item.clone(), answer);
                }
            });
        }
    });
    answers.into_inner().expect("answers")
}

/// A one-container Pod in `namespace` naming `image`.
fn pod(namespace: &str, image: &str) -> Value {
    let mut request = rig::pod_request(
        "CREATE",
        json!({"containers": [{"name": "web", "image": image}]}),
    );
    request["object"]["metadata"]["namespace"] = json!(namespace);
    request["object"].clone()
}

fn image_of(object: &Value) -> String {
    object["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The request the API server sends for `object`.
fn request_for(object: &Value) -> Value {
    let mut request = rig::pod_request("CREATE", object["spec"].clone());
    request["object"] = object.clone();
    request["namespace"] = object["metadata"]["namespace"].clone();
    request
}

/// An AdmissionResponse applied as the API server applies it: the object patched, or the
/// refusal's message.
fn applied(object: &Value, response: &Value) -> Result<Value, String> {
    if response["allowed"] != json!(true) {
        return Err(response["status"]["message"]
            .as_str()
            .unwrap_or("refused without a message")
            .to_string());
    }
    let Some(patch) = response["patch"].as_str() else {
        return Ok(object.clone());
    };
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .expect("base64 patch");
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("JSON patch");
    let mut patched = object.clone();
    json_patch::patch(&mut patched, &patch).expect("the patch applies");
    Ok(patched)
}

impl Servers<'_> {
    /// One webhook: policy-server's policy `id` on `object`.
    fn post(&self, id: &str, object: &Value) -> Result<Value, String> {
        let (answer, _) = self.server.post(
            &format!("validate/{id}"),
            &PolicyServer::review(&request_for(object)),
        );
        applied(object, &answer["response"])
    }

    /// One webhook under `kwctl run`: the module with `settings` on `object`; the swapper with
    /// `verifiers` reads the API server (`--allow-context-aware`, the admin's kubeconfig).
    fn kwctl(
        &self,
        module: &Path,
        settings: &Value,
        object: &Value,
        context_aware: bool,
    ) -> Result<Value, String> {
        let mut extra = vec!["--sources-path".as_ref(), self.sources_file.as_os_str()];
        let mut env = Vec::new();
        if context_aware {
            extra.push("--allow-context-aware".as_ref());
            env.push(("KUBECONFIG", self.plane.kubeconfig.as_path()));
        }
        let (answer, _) =
            self.tools
                .kwctl_run(module, settings, &request_for(object), &extra, &env);
        applied(object, &answer)
    }

    /// The row's two webhooks in its order, each fed the object the other left: the image
    /// stored, or the first refusal.
    fn chain_by_policy_server(&self, row: &Row) -> Admitted {
        let object = pod(&row.namespace(), &self.world.image(row.tag, row.spelling));
        let (verifier, swapper) = (row.verifier().id(), swapper_id(row));
        let (first, second) = match row.order {
            Order::VerifierFirst => (verifier, swapper),
            Order::VerifierLast => (swapper, verifier),
        };
        let object = self.post(&first, &object)?;
        self.post(&second, &object).map(|o| image_of(&o))
    }

    fn chain_by_kwctl(&self, row: &Row) -> Admitted {
        let object = pod(&row.namespace(), &self.world.image(row.tag, row.spelling));
        let verifier = (
            self.tools.bin("verify-image-signatures.wasm"),
            row.verifier().settings(self.world),
            false,
        );
        let swapper = (
            self.tools.annotated_policy(),
            swapper_settings(row, self.world),
            row.read == Read::Verifiers,
        );
        let (first, second) = match row.order {
            Order::VerifierFirst => (verifier, swapper),
            Order::VerifierLast => (swapper, verifier),
        };
        let object = self.kwctl(&first.0, &first.1, &object, first.2)?;
        self.kwctl(&second.0, &second.1, &object, second.2)
            .map(|o| image_of(&o))
    }
}

/// A row ends as the verifier alone ends (or as a documented [`Difference`] says).
fn check(row: Row) {
    let Some(table) = table() else {
        return;
    };
    let outcome = &table.rows[&row];
    let (expected, difference) = outcome.expected(&row);
    assert_eq!(
        outcome.ended(),
        expected,
        "{row:?}: the Pod names {}; the verifier alone: {:?} (content {:?}; on the source: {:?}); the chain: {:?}{}",
        outcome.written,
        without_backtrace(&outcome.alone),
        outcome.alone_content,
        without_backtrace(&outcome.alone_on_source),
        without_backtrace(&outcome.chain),
        difference.map_or(String::new(), |d| format!(
            "; expected refused by design: {d:?}"
        )),
    );
}

/// A refusal's text without the host's backtrace (policy-server's anyhow chain carries one).
fn without_backtrace(admitted: &Admitted) -> Admitted {
    admitted.clone().map_err(|refusal| {
        refusal
            .split("\n\nStack backtrace:")
            .next()
            .unwrap_or_default()
            .to_string()
    })
}

/// A row under `kwctl run` ends as the same row through policy-server, and as the verifier alone.
fn check_kwctl(row: Row) {
    let Some(table) = table() else {
        return;
    };
    let by_kwctl = &table.kwctl[&row];
    let by_server = &table.rows[&row];
    println!("{}", table.figures);
    assert_eq!(
        without_backtrace(&by_kwctl.chain),
        without_backtrace(&by_server.chain),
        "{row:?}: kwctl ended {:?}, policy-server {:?}",
        by_kwctl.chain,
        by_server.chain
    );
    assert_eq!(
        by_kwctl.ended(),
        by_kwctl.expected(&row).0,
        "{row:?}: {by_kwctl:?}"
    );
}

/// The rows that differ from the verifier alone on the Pod as written are the two documented
/// kinds, each in the rows the reasoning of [`Difference`] names and no other: rules on the
/// sources, the image under the mirror's name (by tag or pinned), `late` (never runs) or
/// `unsigned` (its source refused), in every read, mode, fallback and order: 2 × 2 × 2 × 2 × 2
/// = 32 rows each.
#[test]
fn differences_are_only_the_documented_ones() {
    let Some(table) = table() else {
        return;
    };
    println!("{}", table.figures);
    let mut counts: HashMap<Difference, usize> = HashMap::new();
    for (row, outcome) in &table.rows {
        let (_, difference) = outcome.expected(row);
        if let Some(difference) = difference {
            *counts.entry(difference).or_default() += 1;
            let named = row.rules_on == RulesOn::Sources
                && row.spelling != Spelling::Source
                && match difference {
                    Difference::NeverRuns => row.tag == Tag::Late,
                    Difference::MirrorNameEscapesTheRules => row.tag == Tag::Unsigned,
                };
            assert!(named, "{row:?} differs as {difference:?}: {outcome:?}");
        }
    }
    println!("rows that differ from the verifier alone, by design: {counts:?}");
    assert_eq!(counts.get(&Difference::NeverRuns), Some(&32));
    assert_eq!(
        counts.get(&Difference::MirrorNameEscapesTheRules),
        Some(&32)
    );
    assert_eq!(table.rows.len(), 432);
}

// One test per row: `rules_on_sources::signatures::verify_at_source::keep::verifier_first::
// unsigned::as_mirror`, and so on; each macro adds one dimension of the row.
macro_rules! spellings {
    ($($p:expr),*) => {
        #[test]
        fn as_source() {
            crate::check(crate::Row::new($($p,)* crate::Spelling::Source));
        }
        #[test]
        fn as_mirror() {
            crate::check(crate::Row::new($($p,)* crate::Spelling::Mirror));
        }
        #[test]
        fn as_mirror_pinned() {
            crate::check(crate::Row::new($($p,)* crate::Spelling::MirrorPinned));
        }
    };
}

macro_rules! tags {
    ($($p:expr),*) => {
        mod unsigned { spellings!($($p,)* crate::Tag::Unsigned); }
        mod signed { spellings!($($p,)* crate::Tag::Signed); }
        mod late { spellings!($($p,)* crate::Tag::Late); }
    };
}

macro_rules! orders {
    ($($p:expr),*) => {
        mod verifier_first { tags!($($p,)* crate::Order::VerifierFirst); }
        mod verifier_last { tags!($($p,)* crate::Order::VerifierLast); }
    };
}

macro_rules! fallbacks {
    ($($p:expr),*) => {
        mod keep { orders!($($p,)* crate::OnUnverified::Keep); }
        mod reject { orders!($($p,)* crate::OnUnverified::Reject); }
    };
}

macro_rules! modes {
    ($($p:expr),*) => {
        mod verify_at_source { fallbacks!($($p,)* crate::VerifyAt::Source); }
        mod verify_at_mirror { fallbacks!($($p,)* crate::VerifyAt::Mirror); }
    };
}

macro_rules! reads {
    ($($p:expr),*) => {
        mod signatures { modes!($($p,)* crate::Read::Signatures); }
        mod verifiers { modes!($($p,)* crate::Read::Verifiers); }
    };
}

mod rules_on_sources {
    reads!(crate::RulesOn::Sources);
}
mod rules_on_everything {
    reads!(crate::RulesOn::Everything);
}
mod rules_on_mirror_name {
    reads!(crate::RulesOn::MirrorName);
}

/// The rows of [`kwctl_rows`] under `kwctl run` itself.
macro_rules! kwctl_cases {
    ($($p:expr),*) => {
        #[test]
        fn late_as_mirror() {
            crate::check_kwctl(crate::Row::new(
                crate::RulesOn::Sources, $($p,)* crate::Tag::Late, crate::Spelling::Mirror));
        }
        #[test]
        fn unsigned_as_mirror() {
            crate::check_kwctl(crate::Row::new(
                crate::RulesOn::Sources, $($p,)* crate::Tag::Unsigned, crate::Spelling::Mirror));
        }
        #[test]
        fn signed_as_source() {
            crate::check_kwctl(crate::Row::new(
                crate::RulesOn::Sources, $($p,)* crate::Tag::Signed, crate::Spelling::Source));
        }
    };
}

macro_rules! kwctl_orders {
    ($($p:expr),*) => {
        mod verifier_first {
            kwctl_cases!($($p,)* crate::VerifyAt::Source, crate::OnUnverified::Keep,
                crate::Order::VerifierFirst);
        }
        mod verifier_last {
            kwctl_cases!($($p,)* crate::VerifyAt::Source, crate::OnUnverified::Keep,
                crate::Order::VerifierLast);
        }
    };
}

mod under_kwctl {
    mod signatures {
        kwctl_orders!(crate::Read::Signatures);
    }
    mod verifiers {
        kwctl_orders!(crate::Read::Verifiers);
    }
}

/// Where one admission's time goes at a distance: the swapper alone under the real
/// policy-server 1.35, one row at a time (no other request in flight), at each round trip of
/// `PROBE_ROUND_TRIPS` (milliseconds, default `2,10,50`), for `signatures` and `verifiers` with
/// `verifySource` true and false. Prints, per admission, the time from POST to answer, the
/// swapper's own `evaluationMilliseconds`, and the connections and requests that crossed the
/// relays (`TLS` is an HTTPS attempt against the plain-HTTP registry). A measurement, not a
/// check: `cargo test --test signature_table_real one_admission_at_a_distance -- --ignored
/// --nocapture`.
#[test]
#[ignore = "a measurement: prints figures, asserts nothing"]
fn one_admission_at_a_distance() {
    let Some(tools) = RealTools::find("signature_table_real") else {
        return;
    };
    let round_trips: Vec<u64> = std::env::var("PROBE_ROUND_TRIPS")
        .unwrap_or_else(|_| "2,10,50".to_string())
        .split(',')
        .filter_map(|ms| ms.trim().parse().ok())
        .collect();
    let repeats: usize = std::env::var("PROBE_REPEATS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    let plane = chain::shared_plane(&tools);
    chain::kubewarden_crds(&plane);
    let verifier = VerifierPolicy::of(RulesOn::Sources, true);
    chain::namespaces(&plane, &[&verifier.namespace(), "plain"]);
    let swapper_module = tools.annotated_policy();
    let verifier_module = tools.bin("verify-image-signatures.wasm");
    let mut rows = Vec::new();
    for read in [Read::Signatures, Read::Verifiers] {
        for verify_at in [VerifyAt::Source, VerifyAt::Mirror] {
            rows.push((read, verify_at));
        }
    }
    let images = [
        (Tag::Signed, Spelling::Source),
        (Tag::Signed, Spelling::Mirror),
        (Tag::Unsigned, Spelling::Source),
        (Tag::Unsigned, Spelling::Mirror),
        (Tag::Late, Spelling::Source),
        (Tag::Late, Spelling::Mirror),
    ];
    for ms in round_trips {
        let world = World::start_at(Duration::from_millis(ms));
        let policy = chain::kubewarden_policy(
            "AdmissionPolicy",
            Some(&verifier.namespace()),
            "verify-image-signatures",
            VERIFIER_MODULE,
            verifier.mutating,
            verifier.settings(&world),
        );
        plane.kubectl_ok(&["apply", "-f", "-"], Some(&policy.to_string()));
        let mut entries = vec![Entry::new(
            &verifier.id(),
            &verifier_module,
            verifier.settings(&world),
        )];
        for &(read, verify_at) in &rows {
            let row = probe_row(read, verify_at, Tag::Signed, Spelling::Source);
            let entry = Entry::new(
                &swapper_id(&row),
                &swapper_module,
                swapper_settings(&row, &world),
            );
            entries.push(match read {
                Read::Signatures => entry,
                Read::Verifiers => entry.reading_policies(),
            });
        }
        let sources = chain::insecure_sources(&[world.source_host(), world.mirror_host()]);
        let kubeconfig = chain::service_account_kubeconfig(
            &plane,
            "kubewarden",
            "policy-server-probe",
            &["get", "list", "watch"],
        );
        let server = PolicyServer::start(
            &tools,
            &chain::policies_yml(&tools, &entries),
            PolicyServerOptions {
                kubeconfig: Some(&kubeconfig),
                sources: Some(&sources),
                policy_timeout: Some(POLICY_TIMEOUT_SECONDS),
                ..PolicyServerOptions::default()
            },
        );
        let relays = [&world.source_far, &world.mirror_far];
        let measure = |id: &str, object: &Value, what: &str| {
            for repeat in 0..repeats {
                for relay in relays {
                    relay
                        .requests
                        .store(0, std::sync::atomic::Ordering::Relaxed);
                    relay
                        .connections
                        .store(0, std::sync::atomic::Ordering::Relaxed);
                    relay.seen.lock().unwrap_or_else(|e| e.into_inner()).clear();
                }
                let (answer, took) = server.post(
                    &format!("validate/{id}"),
                    &PolicyServer::review(&request_for(object)),
                );
                let count = |relay: &LatencyProxy| {
                    (
                        relay.connections.load(std::sync::atomic::Ordering::Relaxed),
                        relay.requests.load(std::sync::atomic::Ordering::Relaxed),
                    )
                };
                let (source, mirror) = (count(&world.source_far), count(&world.mirror_far));
                let evaluation = answer["response"]["auditAnnotations"]
                    .as_object()
                    .and_then(|audit| audit.iter().find(|(key, _)| key.ends_with("summary")))
                    .and_then(|(_, summary)| summary.as_str())
                    .and_then(|summary| serde_json::from_str::<Value>(summary).ok())
                    .map(|summary| summary["evaluationMilliseconds"].to_string())
                    .unwrap_or_else(|| "-".to_string());
                let image = applied(object, &answer["response"])
                    .map(|o| image_of(&o))
                    .unwrap_or_else(|refusal| {
                        format!("refused: {}", refusal.lines().next().unwrap_or_default())
                    });
                println!(
                    "{ms} ms | {id} | {what} | #{repeat} | {took:?} | eval {evaluation} ms | source conns {} reqs {} | mirror conns {} reqs {} | {image}",
                    source.0, source.1, mirror.0, mirror.1
                );
                if repeat == 0 {
                    println!("    source: {:?}", world.source_far.seen());
                    println!("    mirror: {:?}", world.mirror_far.seen());
                }
            }
        };
        for &(read, verify_at) in &rows {
            for (tag, spelling) in images {
                let row = probe_row(read, verify_at, tag, spelling);
                let object = pod(&row.namespace(), &world.image(tag, spelling));
                measure(
                    &swapper_id(&row),
                    &object,
                    &format!("{tag:?} as {spelling:?}"),
                );
            }
        }
        for (tag, spelling) in images {
            let object = pod(&verifier.namespace(), &world.image(tag, spelling));
            measure(&verifier.id(), &object, &format!("{tag:?} as {spelling:?}"));
        }
        drop(server);
    }
}

/// A row of [`one_admission_at_a_distance`]: rules on the sources, `keep`, the verifier first.
fn probe_row(read: Read, verify_at: VerifyAt, tag: Tag, spelling: Spelling) -> Row {
    Row::new(
        RulesOn::Sources,
        read,
        verify_at,
        OnUnverified::Keep,
        Order::VerifierFirst,
        tag,
        spelling,
    )
}
