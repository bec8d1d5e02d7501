//! The election of the replica that copies, against a real kube-apiserver (etcd and
//! kube-apiserver from the real tools, on loopback), with replicas of the binary: two started
//! together elect one; a leader cut off from the API server stops before the other takes over; a
//! leader whose renewals lose to another write steps down; SIGTERM hands the Lease over within
//! seconds; a Lease renewed by a holder whose clock is an hour behind is not taken; `once` stops
//! the moment it loses the Lease; and the standby copies nothing while the other leads, by the
//! metric of copies per replica. The source registry is 50 ms away (the rig's relay).

mod rig;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rig::api_proxy::ApiProxy;
use rig::images::Image;
use rig::plane::{ControlPlane, find_tools};
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::replica::{Replica, eventually, holder, lease, micro_time};
use rig::{fill_mirror, pod_recorded_by_hand, settings};
use serde_json::json;

const LEASE: &str = "fill-mirror";

struct Cluster {
    plane: ControlPlane,
    source: TestRegistry,
    /// The source as Pods name it, away by the relay's round trip.
    far: LatencyProxy,
    mirror: TestRegistry,
    dir: tempfile::TempDir,
}

fn cluster(test: &str) -> Option<Cluster> {
    cluster_away(test, Duration::from_millis(50))
}

/// The same, the source `away` (a round trip).
fn cluster_away(test: &str, away: Duration) -> Option<Cluster> {
    let tools = find_tools(test)?;
    let plane = ControlPlane::start(tools);
    let source = TestRegistry::start(&format!("{test}-src")).expect("source registry");
    let far = LatencyProxy::network(&source.host, away).expect("relay");
    let mirror = TestRegistry::start(&format!("{test}-mirror")).expect("mirror registry");
    let settings = settings(&far.host, &mirror.host);
    plane.install_policy_crd();
    plane.apply_swapping_policy("image-swapper", &settings);
    Some(Cluster {
        plane,
        source,
        far,
        mirror,
        dir: tempfile::tempdir().expect("a temporary folder"),
    })
}

impl Cluster {
    /// Pushes `app/NAME:1` to the source and creates Pod NAME running it, recorded as admission
    /// records it when the mirror lacks it (the record written by hand).
    fn pod(&self, name: &str) {
        Image::new(name, "linux/amd64").push(&self.source, &format!("app/{name}"), Some("1"));
        let image = format!("{}/app/{name}:1", self.far.host);
        let mirror = format!("{}/hub/app/{name}:1", self.mirror.host);
        let pod = pod_recorded_by_hand(name, &image, &mirror);
        self.plane
            .kubectl(&["create", "-f", "-"], Some(&pod.to_string()));
    }

    fn in_mirror(&self, name: &str) -> bool {
        self.mirror
            .digest_of(&format!("hub/app/{name}"), "1")
            .is_some()
    }

    /// A kubeconfig whose server is `proxy`.
    fn through(&self, proxy: &ApiProxy, name: &str) -> std::path::PathBuf {
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        proxy.kubeconfig(&self.plane.kubeconfig, &path);
        path
    }
}

/// Which of `replicas` say they lead now (a replica whose metrics cannot be read does not).
fn leaders<'a>(replicas: &[&'a Replica]) -> Vec<&'a str> {
    replicas
        .iter()
        .filter(|replica| replica.leads() == Some(true))
        .map(|replica| replica.identity.as_str())
        .collect()
}

/// Samples `replicas` every 100 ms for `seconds`, failing when two say they lead at once; the
/// leaders seen, in order, each once.
fn never_two_leaders(
    replicas: &[&Replica],
    seconds: u64,
    logs: impl Fn() -> String,
) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        let now = leaders(replicas);
        assert!(now.len() < 2, "{now:?} lead at once\n{}", logs());
        if let Some(leader) = now.first()
            && seen.last().map(String::as_str) != Some(*leader)
        {
            seen.push(leader.to_string());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    seen
}

/// Every `fill_mirror_copies_total` series of `standby` is 0, and it serves all five.
fn copied_nothing(standby: &Replica) {
    let series = standby.copy_series();
    assert_eq!(series.len(), 5, "{series:?}");
    assert!(
        series.iter().all(|(_, value)| *value == 0.0),
        "{} copied while the other led: {series:?}\n{}",
        standby.identity,
        standby.log()
    );
}

/// Two replicas started together, both finding no Lease (their API server's answers held back
/// by a second, so that each reads before either creates): one creates it and leads, the other
/// gets 409 and follows; over two lease durations neither ever leads beside the other, the
/// Lease keeps its first holder, and the follower copies nothing of what the leader copies.
#[test]
fn two_replicas_started_together_elect_one() {
    let Some(cluster) = cluster("elect-together") else {
        return;
    };
    let proxy = ApiProxy::start(cluster.plane.api_port());
    proxy.hold_back(Duration::from_secs(1));
    let kubeconfig = cluster.through(&proxy, "held-back");
    // Renewals of 2 s (a read and a write, each answered a second late) within a deadline of 6.
    let election = ["--lease-duration", "9"];
    let a = Replica::start(&kubeconfig, "a", &election, cluster.dir.path());
    let b = Replica::start(&kubeconfig, "b", &election, cluster.dir.path());
    let logs = || format!("a:\n{}\nb:\n{}", a.log(), b.log());
    let seen = never_two_leaders(&[&a, &b], 20, logs);
    assert_eq!(
        seen.len(),
        1,
        "leaders one after the other: {seen:?}\n{}",
        logs()
    );
    let leader = if seen[0] == "a" { &a } else { &b };
    let follower = if seen[0] == "a" { &b } else { &a };
    assert!(
        follower
            .log()
            .contains("another replica created the Lease first"),
        "the two did not race to create the Lease: {}",
        logs()
    );
    let lease = lease(&cluster.plane, LEASE).expect("the Lease");
    assert_eq!(lease["spec"]["holderIdentity"], seen[0].as_str(), "{lease}");
    assert_eq!(lease["spec"]["leaseTransitions"], 0, "{lease}");

    proxy.hold_back(Duration::ZERO);
    assert!(eventually(30, || a.ready() && b.ready()), "{}", logs());
    for name in ["one", "two"] {
        cluster.pod(name);
    }
    assert!(
        eventually(60, || cluster.in_mirror("one") && cluster.in_mirror("two")),
        "not copied: {}",
        logs()
    );
    let copied = "fill_mirror_copies_total{result=\"copied\"}";
    assert!(
        eventually(10, || leader.metric(copied) == Some(2.0)),
        "{}",
        logs()
    );
    copied_nothing(follower);
}

/// A leader cut off from the API server (every connection closed, new ones refused) stops
/// leading before its Lease could be taken: at its renew deadline (4 s of a 6 s Lease); the
/// standby takes the Lease once it has not changed for 6 s, and fills what comes next. While
/// one leads, every copy series of the other stays 0.
#[test]
fn a_leader_cut_off_stops_before_the_other_takes_over() {
    let Some(cluster) = cluster("elect-cut") else {
        return;
    };
    let proxy = ApiProxy::start(cluster.plane.api_port());
    let election = ["--lease-duration", "6"];
    let a = Replica::start(
        &cluster.through(&proxy, "a"),
        "a",
        &election,
        cluster.dir.path(),
    );
    assert!(eventually(30, || a.leads() == Some(true)), "{}", a.log());
    let b = Replica::start(
        &cluster.plane.kubeconfig,
        "b",
        &election,
        cluster.dir.path(),
    );
    let logs = || format!("a:\n{}\nb:\n{}", a.log(), b.log());
    assert!(eventually(30, || b.ready()), "{}", logs());
    assert_eq!(b.leads(), Some(false), "{}", logs());
    cluster.pod("one");
    assert!(eventually(60, || cluster.in_mirror("one")), "{}", logs());
    let copied = "fill_mirror_copies_total{result=\"copied\"}";
    assert!(
        eventually(10, || a.metric(copied) == Some(1.0)),
        "{}",
        logs()
    );
    copied_nothing(&b);

    let cut = Instant::now();
    proxy.cut();
    let mut a_stopped = None;
    let mut b_took = None;
    while (a_stopped.is_none() || b_took.is_none()) && cut.elapsed() < Duration::from_secs(30) {
        let now = leaders(&[&a, &b]);
        assert!(
            now.len() < 2,
            "a and b lead at once, {:?} after the cut\n{}",
            cut.elapsed(),
            logs()
        );
        if a_stopped.is_none() && !now.contains(&"a") {
            a_stopped = Some(cut.elapsed());
        }
        if b_took.is_none() && now.contains(&"b") {
            b_took = Some(cut.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (Some(a_stopped), Some(b_took)) = (a_stopped, b_took) else {
        panic!(
            "a stopped after {a_stopped:?}, b took over after {b_took:?}\n{}",
            logs()
        );
    };
    println!(
        "cut off: a stopped leading {a_stopped:?} after the cut, b took over {b_took:?} after it"
    );
    assert!(a_stopped < b_took, "{a_stopped:?} {b_took:?}");
    assert!(
        a_stopped <= Duration::from_secs(5),
        "a led {a_stopped:?} cut off"
    );
    assert_eq!(holder(&cluster.plane, LEASE), "b");

    cluster.pod("two");
    assert!(eventually(60, || cluster.in_mirror("two")), "{}", logs());
    assert!(
        eventually(10, || b.metric(copied) == Some(1.0)),
        "{}",
        logs()
    );
    assert_eq!(a.metric(copied), Some(1.0), "a copied two too");
    // Back in touch, a finds the Lease renewed by b and follows.
    proxy.restore();
    let seen = never_two_leaders(&[&a, &b], 8, logs);
    assert_eq!(seen, ["b"], "{}", logs());
}

/// A leader whose every renewal loses to another write of the Lease (its API server's answers
/// held back by a second, the Lease annotated every ~0.3 s, so that its replace at the
/// resourceVersion it read gets 409) has not renewed: it stops leading before the standby may
/// take the unchanged Lease (9 s), and the standby then takes it; never both.
#[test]
fn a_leader_whose_renewals_conflict_steps_down_before_its_lease_could_be_taken() {
    let Some(cluster) = cluster("elect-conflict") else {
        return;
    };
    let proxy = ApiProxy::start(cluster.plane.api_port());
    let election = ["--lease-duration", "9"];
    let a = Replica::start(
        &cluster.through(&proxy, "a"),
        "a",
        &election,
        cluster.dir.path(),
    );
    assert!(eventually(30, || a.leads() == Some(true)), "{}", a.log());
    let b = Replica::start(
        &cluster.plane.kubeconfig,
        "b",
        &election,
        cluster.dir.path(),
    );
    let logs = || format!("a:\n{}\nb:\n{}", a.log(), b.log());
    proxy.hold_back(Duration::from_secs(1));
    // Held back alone, a goes on renewing: its rounds take 2 s, its deadline is 6 s.
    assert_eq!(never_two_leaders(&[&a, &b], 6, logs), ["a"]);

    let bumping = Arc::new(AtomicBool::new(true));
    let bumper = {
        let (bumping, kubeconfig) = (bumping.clone(), cluster.plane.kubeconfig.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while bumping.load(Ordering::SeqCst) {
                n += 1;
                let _ = std::process::Command::new("kubectl")
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(["annotate", "--overwrite", "-n", "default", "lease", LEASE])
                    .arg(format!("bump={n}"))
                    .output();
                std::thread::sleep(Duration::from_millis(100));
            }
            n
        })
    };
    let bumped = Instant::now();
    let seen = never_two_leaders(&[&a, &b], 20, logs);
    bumping.store(false, Ordering::SeqCst);
    let bumps = bumper.join().expect("the bumping thread");
    println!(
        "{bumps} writes of the Lease in {:?}; leaders seen: {seen:?}",
        bumped.elapsed()
    );
    assert_eq!(
        seen.last().map(String::as_str),
        Some("b"),
        "b never took over\n{}",
        logs()
    );
    assert_eq!(holder(&cluster.plane, LEASE), "b");
}

/// SIGTERM to the leader: it gives the Lease up as it stops, and the standby leads within a
/// few seconds, not after the Lease's 15 s.
#[test]
fn the_leader_hands_the_lease_over_on_sigterm_within_seconds() {
    let Some(cluster) = cluster("elect-sigterm") else {
        return;
    };
    let kubeconfig = &cluster.plane.kubeconfig;
    let election = ["--lease-duration", "15"];
    let mut a = Replica::start(kubeconfig, "a", &election, cluster.dir.path());
    assert!(eventually(30, || a.leads() == Some(true)), "{}", a.log());
    let b = Replica::start(kubeconfig, "b", &election, cluster.dir.path());
    assert!(eventually(30, || b.leads() == Some(false)), "{}", b.log());
    // b has read the Lease renewed at least once: it would take a Lease left to expire only
    // 15 s after its last renewal.
    std::thread::sleep(Duration::from_secs(4));

    let terminated = Instant::now();
    a.terminate();
    let status = a.exited_within(Duration::from_secs(10));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", a.log());
    assert!(
        eventually(20, || b.leads() == Some(true)),
        "b does not lead\n{}",
        b.log()
    );
    let handover = terminated.elapsed();
    println!(
        "handover on SIGTERM: b led {handover:?} after a was sent SIGTERM (Lease 15 s, tries every 3 s)"
    );
    assert!(
        handover < Duration::from_secs(6),
        "b led {handover:?} after the SIGTERM\n{}",
        b.log()
    );
    let lease = lease(&cluster.plane, LEASE).expect("the Lease");
    assert_eq!(lease["spec"]["holderIdentity"], "b", "{lease}");
    assert_eq!(lease["spec"]["leaseTransitions"], 1, "{lease}");
}

/// A Lease whose holder's clock is an hour behind: its `renewTime` is an hour old, yet the
/// holder renews it every second. A replica judging by `renewTime` against its own clock would
/// take it; this one sees the record change, and takes it only once the renewals stop and it has
/// not changed for the Lease's 5 s.
#[test]
fn a_lease_renewed_by_a_holder_whose_clock_is_behind_is_not_taken() {
    let Some(cluster) = cluster("elect-skew") else {
        return;
    };
    let hour = Duration::from_secs(3600);
    let created = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": "default"},
        "spec": {"holderIdentity": "skewed", "leaseDurationSeconds": 5,
                 "acquireTime": micro_time(hour, true), "renewTime": micro_time(hour, true),
                 "leaseTransitions": 0},
    });
    cluster
        .plane
        .kubectl(&["create", "-f", "-"], Some(&created.to_string()));
    let renewing = Arc::new(AtomicBool::new(true));
    let last_renewal = Arc::new(std::sync::Mutex::new(Instant::now()));
    let renewer = {
        let (renewing, last) = (renewing.clone(), last_renewal.clone());
        let kubeconfig = cluster.plane.kubeconfig.clone();
        std::thread::spawn(move || {
            while renewing.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_secs(1));
                let patch = json!({"spec": {"renewTime": micro_time(hour, true)}});
                let output = std::process::Command::new("kubectl")
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args([
                        "patch", "-n", "default", "lease", LEASE, "--type", "merge", "-p",
                    ])
                    .arg(patch.to_string())
                    .output()
                    .expect("kubectl patch");
                assert!(
                    output.status.success(),
                    "{}",
                    String::from_utf8_lossy(&output.stderr)
                );
                *last.lock().expect("the last renewal") = Instant::now();
            }
        })
    };
    let a = Replica::start(
        &cluster.plane.kubeconfig,
        "a",
        &["--lease-duration", "3"],
        cluster.dir.path(),
    );
    assert!(eventually(30, || a.leads().is_some()), "{}", a.log());
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(10) {
        assert_eq!(
            a.leads(),
            Some(false),
            "took a Lease still renewed\n{}",
            a.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(holder(&cluster.plane, LEASE), "skewed");

    renewing.store(false, Ordering::SeqCst);
    renewer.join().expect("the renewing thread");
    assert!(eventually(15, || a.leads() == Some(true)), "{}", a.log());
    let after = last_renewal.lock().expect("the last renewal").elapsed();
    println!("a took the Lease {after:?} after its holder's last renewal (Lease 5 s)");
    assert!(
        after >= Duration::from_millis(4500),
        "taken {after:?} after the last renewal"
    );
    assert_eq!(holder(&cluster.plane, LEASE), "a");
}

/// `once` loses the Lease mid-run (another holder written into it, as a watch replica that took
/// it over would): it stops copying at its next try, says so, exits 1, and leaves the Lease to
/// its holder. Eight images, one copy at a time, the source 300 ms away: the Lease moves after
/// the first lands.
#[test]
fn once_stops_the_moment_it_loses_the_lease() {
    let Some(cluster) = cluster_away("elect-once", Duration::from_millis(300)) else {
        return;
    };
    let names: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
    for name in &names {
        cluster.pod(name);
    }
    let run = fill_mirror()
        .args(["once", "--insecure", "--log-format", "text", "--jobs", "1"])
        .args(["--identity", "runner", "--lease-duration", "15"])
        .env("KUBECONFIG", &cluster.plane.kubeconfig)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run fill-mirror once");
    let landed = || names.iter().filter(|name| cluster.in_mirror(name)).count();
    assert!(eventually(60, || landed() >= 1), "nothing copied");
    assert_eq!(holder(&cluster.plane, LEASE), "runner-once");
    let patch = json!({"spec": {"holderIdentity": "usurper", "leaseDurationSeconds": 60,
        "renewTime": micro_time(Duration::ZERO, false)}});
    cluster.plane.kubectl(
        &[
            "patch",
            "-n",
            "default",
            "lease",
            LEASE,
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
        ],
        None,
    );
    let moved = Instant::now();
    let at_loss = landed();
    let output = run.wait_with_output().expect("once's output");
    let stopped = moved.elapsed();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    let after = landed();
    println!(
        "landed when the Lease moved: {at_loss} of 8; when once exited, {stopped:?} later: {after}"
    );
    // It learns of the loss at its next try (every 3 s of its 15 s Lease), not at its renew
    // deadline (10 s after its last renewal).
    assert!(
        stopped < Duration::from_secs(6),
        "once ran {stopped:?} after losing the Lease\n{stderr}"
    );
    assert!(
        stdout.contains(
            "lost the Lease fill-mirror (held by usurper now): stopped copying and marking"
        ),
        "{stdout}{stderr}"
    );
    assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
    // At most the copy under way may land while the run learns of the loss.
    assert!(
        after <= at_loss + 1,
        "{after} landed, {at_loss} when the Lease moved\n{stderr}"
    );
    assert!(after < names.len(), "once copied everything\n{stderr}");
    assert_eq!(
        holder(&cluster.plane, LEASE),
        "usurper",
        "once gave away a Lease not its own"
    );
}
