//! The failure this project was made for, on a real node, and the retention that prevents it: a
//! real node (`rig::node`: the tools' kubelet and kube-scheduler, containerd, runc) beside
//! kube-apiserver and kube-controller-manager, in network and mount namespaces of the test's own
//! (`rig::netns`), pulling from a mirror 5 ms away that allows deletes.
//!
//! A Deployment runs its image pinned in the mirror. A retention rule of 0.7.0's kind (ECR's
//! age-only rule, evaluated as ECR documents it by `rig::lifecycle` over the mirror's tags, the
//! images taken as pushed 40 days ago; what it expires deleted through the registry API) deletes
//! the image, and the Deployment's next replica, on a node that does not hold the image, cannot
//! pull it. Then the same with the rules deploy/ ships (deploy/eks-ecr/aws/lifecycle-policy.json)
//! and the image anchored as the fill controller anchors it (the tag fill-mirror's own
//! `anchor_tag` names, put here by the test as the watch puts it: a manifest PUT of the same
//! bytes): nothing is deleted, and the next replica pulls the image and runs, its `imageID` the
//! digest.

mod rig;

#[allow(dead_code)] // the record's reading half is the prune's
#[path = "../fill-mirror/src/in_use_set.rs"]
mod in_use_set;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use rig::lifecycle::{self, Image};
use rig::netns::{self, Isolated};
use rig::node::{Node, NodeTools};
use rig::proxy::LatencyProxy;
use rig::registry::TestRegistry;
use rig::tools::ControlPlane;
use serde_json::{Value, json};

const TEST: &str = "an_age_only_rule_breaks_a_deployment_and_the_shipped_rules_keep_it";
/// deploy/eks-ecr/aws/lifecycle-policy.json as 0.7.0 shipped it: one age-only rule.
const AGE_ONLY_0_7: &str = r#"{"rules":[{"rulePriority":1,"description":"Expire images pushed more than 30 days ago: the check reports their Pods and the fill job copies them again","selection":{"tagStatus":"any","countType":"sinceImagePushed","countUnit":"days","countNumber":30},"action":{"type":"expire"}}]}"#;
/// The image's repository in the mirror, as deploy/registry's rule names Docker Hub's `team/web`.
const REPOSITORY: &str = "dockerhub/team/web";
/// The cluster id the anchor is put for.
const CLUSTER: &str = "prod";
/// How long ago every image of the mirror was pushed, as the retention sees it: past 30 days.
const PUSHED_DAYS_AGO: f64 = 40.0;
const APPS: &str = "default";
const MIRROR_AWAY: Duration = Duration::from_millis(5);
const RUN_LIMIT: Duration = Duration::from_secs(600);

#[test]
fn an_age_only_rule_breaks_a_deployment_and_the_shipped_rules_keep_it() {
    let Some(kit) = NodeTools::find(TEST) else {
        return;
    };
    let Some(run) = netns::isolated(TEST, &kit.kit, RUN_LIMIT, &[]) else {
        return;
    };
    prove(&kit, &run);
}

fn prove(kit: &NodeTools, run: &Isolated) {
    let begun = Instant::now();
    let mirror = TestRegistry::start("retention-mirror").expect("mirror registry");
    let far = LatencyProxy::network(&mirror.host, MIRROR_AWAY).expect("proxy");
    let digest = push_busybox(kit, &mirror);
    let plane = ControlPlane::start(&kit.tools, true);
    let node = Node::start(
        kit,
        &plane,
        &run.node_dir("node"),
        &[&far.host],
        &run.cgroup_root("node"),
    );
    wait_for_default_account(&plane);
    let image = format!("{}/{REPOSITORY}:1.0@{digest}", far.host);
    let ran = format!("{}/{REPOSITORY}@{digest}", far.host);
    println!("up after {:.1} s", begun.elapsed().as_secs_f64());

    // 1. 0.7.0's rule: the running image expires, the next replica cannot pull it.
    deploy(&plane, "aged", &image);
    let first = running_replica(&plane, &node, "aged", &BTreeSet::new());
    assert_eq!(node.image_id(APPS, &first, "web"), Some(ran.clone()));
    let deleted = retention(&mirror, AGE_ONLY_0_7);
    assert_eq!(deleted, BTreeSet::from([digest.clone()]), "0.7.0's rule");
    assert_eq!(mirror.digest_of(REPOSITORY, &digest), None);
    node.forget_image(&digest);
    scale(&plane, "aged", 2);
    let reason = failing_replica(&plane, "aged", &BTreeSet::from([first.clone()]))
        .unwrap_or_else(|| panic!("the new replica pulled a deleted image?\n{}", pods(&plane)));
    println!("0.7.0's rule: the new replica: {reason}");
    let still = node.pod(APPS, &first).expect("the first replica");
    assert_eq!(still["status"]["phase"], "Running", "{still:#}");
    plane.kubectl_ok(
        &["delete", "deployment", "aged", "-n", APPS, "--wait=true"],
        None,
    );

    // 2. The shipped rules, the image anchored: nothing expires, the next replica runs.
    let copied_back = push_busybox(kit, &mirror);
    assert_eq!(copied_back, digest);
    anchor(&mirror, &digest);
    deploy(&plane, "web", &image);
    let first = running_replica(&plane, &node, "web", &BTreeSet::new());
    let shipped =
        std::fs::read_to_string(rig::root().join("deploy/eks-ecr/aws/lifecycle-policy.json"))
            .expect("deploy/eks-ecr/aws/lifecycle-policy.json");
    let deleted = retention(&mirror, &shipped);
    node.forget_image(&digest);
    scale(&plane, "web", 2);
    // The node's outcome first: under a rule that deleted the image, the wait ends with the
    // kubelet's ErrImagePull.
    let second = running_replica(&plane, &node, "web", &BTreeSet::from([first]));
    assert_eq!(
        node.image_id(APPS, &second, "web"),
        Some(ran),
        "the image the new replica runs"
    );
    assert_eq!(deleted, BTreeSet::new(), "the shipped rules");
    assert_eq!(
        mirror.digest_of(REPOSITORY, &digest).as_deref(),
        Some(digest.as_str())
    );
    println!(
        "the shipped rules: {second} pulled {digest} and runs; {:.1} s in all",
        begun.elapsed().as_secs_f64()
    );
}

/// The tools' busybox (`node/img/bb-oci`) pushed into the mirror as `REPOSITORY:1.0`, as the
/// fill controller copies it: its digest as the registry serves it.
fn push_busybox(kit: &NodeTools, mirror: &TestRegistry) -> String {
    let status = Command::new("skopeo")
        .args(["copy", "-q", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:1.0", kit.kit.join("img/bb-oci").display()))
        .arg(format!("docker://{}/{REPOSITORY}:1.0", mirror.host))
        .status()
        .expect("skopeo");
    assert!(status.success(), "skopeo copy of the busybox image");
    mirror
        .digest_of(REPOSITORY, "1.0")
        .expect("the pushed image")
}

/// The anchor tag fill-mirror's watch puts on a digest its cluster uses: the same manifest
/// bytes, PUT under `inuse-<cluster>-<hex>`.
fn anchor(mirror: &TestRegistry, digest: &str) {
    let tag = in_use_set::anchor_tag(CLUSTER, digest).expect("a sha256 digest");
    let answer = ureq::get(&format!(
        "http://{}/v2/{REPOSITORY}/manifests/{digest}",
        mirror.host
    ))
    .set(
        "Accept",
        "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json",
    )
    .call()
    .expect("the manifest");
    let media_type = answer.content_type().to_string();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut answer.into_reader(), &mut bytes).expect("manifest bytes");
    let put = mirror
        .push_manifest(REPOSITORY, &tag, &media_type, &bytes)
        .expect("the anchor");
    assert_eq!(put, digest, "the anchor names another manifest");
}

/// A retention run over the mirror's repository: `policy` evaluated as ECR does
/// (`rig::lifecycle`) over its images, each with every tag that names it and pushed
/// [`PUSHED_DAYS_AGO`]; each image it expires deleted by digest through the registry API, as
/// ECR deletes an expired image with its tags. The digests deleted.
fn retention(mirror: &TestRegistry, policy: &str) -> BTreeSet<String> {
    let listed: Value = ureq::get(&format!("http://{}/v2/{REPOSITORY}/tags/list", mirror.host))
        .call()
        .expect("tags/list")
        .into_string()
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .expect("tags JSON");
    let mut tags_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for tag in listed["tags"].as_array().into_iter().flatten() {
        let tag = tag.as_str().expect("a tag");
        let digest = mirror.digest_of(REPOSITORY, tag).expect("a tag's digest");
        tags_of.entry(digest).or_default().push(tag.to_string());
    }
    let images: Vec<Image> = tags_of
        .iter()
        .map(|(digest, tags)| {
            let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
            Image::new(digest, &tags, PUSHED_DAYS_AGO)
        })
        .collect();
    println!("retention sees {images:?}");
    let expired = lifecycle::expired(policy, &images).unwrap_or_else(|e| panic!("{e}"));
    for digest in &expired {
        mirror
            .delete_manifest(REPOSITORY, digest)
            .expect("the expired image deleted");
    }
    expired
}

/// A Deployment `name` of one replica of `image`, its Pods labelled `app=<name>`.
fn deploy(plane: &ControlPlane, name: &str, image: &str) {
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": APPS},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "web",
                    "image": image,
                    "command": ["/bin/busybox", "sh", "-c", "exec /bin/busybox sleep 3600"]}]}}}});
    plane.kubectl_ok(&["apply", "-f", "-"], Some(&deployment.to_string()));
}

fn scale(plane: &ControlPlane, name: &str, replicas: u32) {
    plane.kubectl_ok(
        &[
            "scale",
            &format!("deployment/{name}"),
            "-n",
            APPS,
            &format!("--replicas={replicas}"),
        ],
        None,
    );
}

/// The names of the Deployment `name`'s Pods, but `known`.
fn replicas(plane: &ControlPlane, name: &str, known: &BTreeSet<String>) -> Vec<Value> {
    plane.get_json(&["pods", "-n", APPS, "-l", &format!("app={name}")])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["metadata"]["name"]
                .as_str()
                .is_some_and(|n| !known.contains(n))
        })
        .cloned()
        .collect()
}

/// Waits for a replica of `name` but `known` to exist, then for it to run: its name.
fn running_replica(
    plane: &ControlPlane,
    node: &Node,
    name: &str,
    known: &BTreeSet<String>,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let pod = loop {
        if let Some(pod) = replicas(plane, name, known).into_iter().next() {
            break pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no new replica of {name}\n{}",
            pods(plane)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    node.wait_running(APPS, &pod, Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("{e}\n{}\nkubelet:\n{}", pods(plane), node.kubelet_log(30)));
    pod
}

/// Waits up to 2 minutes for a replica of `name` but `known` whose image cannot be pulled: the
/// kubelet's reason and message.
fn failing_replica(plane: &ControlPlane, name: &str, known: &BTreeSet<String>) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        for pod in replicas(plane, name, known) {
            for status in pod["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let waiting = &status["state"]["waiting"];
                let reason = waiting["reason"].as_str().unwrap_or_default();
                if ["ErrImagePull", "ImagePullBackOff"].contains(&reason) {
                    return Some(format!("{reason}: {}", waiting["message"]));
                }
                assert!(
                    !status["state"]["running"].is_object(),
                    "a new replica runs: {status:#}"
                );
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

/// The ServiceAccount admission plugin wants the namespace's `default` account, which
/// kube-controller-manager makes.
fn wait_for_default_account(plane: &ControlPlane) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !plane
        .kubectl(&["get", "serviceaccount", "-n", APPS, "default"], None)
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "no default ServiceAccount");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// For a failure's message: every Pod, its image and its containers' states.
fn pods(plane: &ControlPlane) -> String {
    let all = plane.get_json(&["pods", "-A"]);
    let pods: Vec<Value> = all["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            json!({"name": p["metadata"]["name"], "image": p["spec"]["containers"][0]["image"],
            "status": p["status"]["containerStatuses"]})
        })
        .collect();
    format!("pods: {:#}", Value::Array(pods))
}
