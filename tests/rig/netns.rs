//! A test run again in network and mount namespaces of its own (`unshare -n -m`), so that what
//! it starts (registries, a control plane, a real node and its Pods) has addresses and mounts
//! no other test or machine sees, and so that nothing it starts outlives it: once the run ends,
//! however it ends (a panic, a timeout, a kill), every process left in its network namespace or
//! in a node's cgroups is killed and each node's `stop-node.sh` runs again. A passing run that
//! left anything fails.
//!
//! The test's body runs only in the second process: [`isolated`] returns `None` to the first,
//! which waits for it, sweeps, and passes or fails as it did. Its output is printed indented,
//! so that its test harness's own lines are never read as this binary's (`.ci/run` counts
//! `test result:` lines).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::node::{NODE_IP, stop_node};
use super::tools::scratch_dir;

const TEST_VAR: &str = "RIG_NETNS_TEST";
const DATA_VAR: &str = "RIG_NETNS_DATA";

/// The test's own namespaces, seen from inside.
pub struct Isolated {
    /// A folder for everything the run writes (the temporary folder too); removed after it.
    pub data: PathBuf,
}

impl Isolated {
    /// A node's folder (`start-node.sh`'s DATA_DIR), which the sweep stops again whatever
    /// happened.
    pub fn node_dir(&self, name: &str) -> PathBuf {
        self.data.join(name)
    }

    /// A cgroup root for a node of this run alone (the cgroup tree is the machine's).
    pub fn cgroup_root(&self, name: &str) -> String {
        let run = self
            .data
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        format!("/{run}-{name}")
    }
}

/// Inside the namespaces made for `test`: the loopback up with the node's address on it, and
/// `Some`. Outside: runs `test` (its name as the harness filters it) again under `unshare -n
/// -m` with `env` added, for at most `within`; sweeps, stopping nodes with the node kit `kit`;
/// panics when the run failed, timed out or left anything; `None`.
pub fn isolated(
    test: &str,
    kit: &Path,
    within: Duration,
    env: &[(&str, &OsStr)],
) -> Option<Isolated> {
    if std::env::var(TEST_VAR).as_deref() == Ok(test) {
        let data = PathBuf::from(std::env::var_os(DATA_VAR).expect("the run's folder"));
        let namespace = std::fs::read_link("/proc/self/ns/net").expect("own network namespace");
        std::fs::write(data.join("netns"), namespace.to_string_lossy().as_bytes()).expect("netns");
        for args in [
            &["link", "set", "lo", "up"][..],
            &["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"],
        ] {
            let status = Command::new("ip").args(args).status().expect("ip");
            assert!(status.success(), "ip {}", args.join(" "));
        }
        return Some(Isolated { data });
    }
    let data = scratch_dir("netns");
    std::fs::create_dir_all(data.join("tmp")).expect("tmp");
    let log = data.join("run.log");
    let file = std::fs::File::create(&log).expect("log");
    let begun = Instant::now();
    let mut child = Command::new("unshare")
        .args(["--net", "--mount", "--propagation", "private", "--"])
        .arg(std::env::current_exe().expect("the test binary"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(TEST_VAR, test)
        .env(DATA_VAR, &data)
        .env("TMPDIR", data.join("tmp"))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log"))
        .stderr(file)
        .spawn()
        .expect("unshare");
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if begun.elapsed() < within => std::thread::sleep(Duration::from_millis(250)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let ran = begun.elapsed();
    // Written by the second process once inside: a run of no test (a name the harness does not
    // know) exits 0 without it.
    let entered = data.join("netns").exists();
    let left = sweep(&data, kit);
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    for line in said.lines() {
        println!("  | {line}");
    }
    println!(
        "{test}: {:.1} s in its namespaces, {:.1} s to sweep",
        ran.as_secs_f64(),
        (begun.elapsed() - ran).as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&data);
    match status {
        None => panic!(
            "{test}: no end after {} s in its namespaces; killed. Left: {left:?}",
            within.as_secs()
        ),
        Some(status) if !status.success() => panic!(
            "{test} failed in its namespaces ({status}); it left {left:?}:\n{}",
            tail(&said, 60)
        ),
        Some(_) if !entered => panic!(
            "{test}: its run never entered its namespaces (is `{test}` the test's name?):\n{}",
            tail(&said, 20)
        ),
        Some(_) => assert!(left.is_empty(), "{test} passed but left running: {left:?}"),
    }
    None
}

/// The last `lines` of the run's output, indented as it is printed.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|line| format!("  | {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Everything the run left, stopped: each node stopped again, then every process still in the
/// run's network namespace or in a node's cgroups killed. What had to be killed, named.
fn sweep(data: &Path, kit: &Path) -> Vec<String> {
    let namespace = std::fs::read_to_string(data.join("netns")).unwrap_or_default();
    let own = std::fs::read_link("/proc/self/ns/net")
        .map(|link| link.to_string_lossy().into_owned())
        .unwrap_or_default();
    let nodes: Vec<PathBuf> = std::fs::read_dir(data)
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|dir| dir.join("run/env").exists())
        .collect();
    let cgroup_roots: Vec<String> = nodes
        .iter()
        .filter_map(|dir| {
            let env = std::fs::read_to_string(dir.join("run/env")).ok()?;
            env.lines()
                .find_map(|line| line.strip_prefix("CGROUP_ROOT="))
                .filter(|root| root.len() > 1)
                .map(str::to_string)
        })
        .collect();
    let remaining = || -> Vec<u32> {
        let mut pids = if namespace.is_empty() || namespace == own {
            Vec::new()
        } else {
            in_network(&namespace)
        };
        for root in &cgroup_roots {
            pids.extend(in_cgroups(root));
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    };
    // A process the run stopped may still be exiting.
    let settling = Instant::now() + Duration::from_secs(10);
    while !remaining().is_empty() && Instant::now() < settling {
        std::thread::sleep(Duration::from_millis(200));
    }
    // Named before anything is stopped: each is a leak, however it ends.
    let left: Vec<String> = remaining()
        .into_iter()
        .map(|pid| {
            let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("{} (pid {pid})", name.trim())
        })
        .collect();
    if !left.is_empty() {
        // The node's own stop first (its sandboxes through the CRI), then whatever is left.
        for node in &nodes {
            stop_node(kit, node);
        }
        for pid in remaining() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
    // Mounts went with the run's mount namespace; cgroups and the bridge are removed here.
    for node in &nodes {
        stop_node(kit, node);
    }
    left
}

/// The processes whose network namespace is `namespace` (`net:[INODE]`).
fn in_network(namespace: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|link| link.as_os_str() == OsStr::new(namespace.trim()))
        })
        .collect()
}

/// The processes in cgroup `root` or under it, in any hierarchy (cgroup v1's controllers or
/// v2's one tree).
fn in_cgroups(root: &str) -> Vec<u32> {
    let relative = root.trim_start_matches('/');
    let mut tops = vec![Path::new("/sys/fs/cgroup").join(relative)];
    tops.extend(
        std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .filter_map(|entry| entry.ok().map(|e| e.path().join(relative))),
    );
    let mut pids = Vec::new();
    let mut pending: Vec<PathBuf> = tops.into_iter().filter(|dir| dir.is_dir()).collect();
    while let Some(dir) = pending.pop() {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(
                procs
                    .lines()
                    .filter_map(|line| line.trim().parse::<u32>().ok()),
            );
        }
        pending.extend(
            std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|path| path.is_dir()),
        );
    }
    pids
}
