//! The lifecycle rules deploy/ gives an ECR mirror (deploy/eks-ecr/aws/lifecycle-policy.json, the
//! one file the repository creation templates, the `mirror-lifecycle` CronJob and the pull-through
//! template all carry: tests/docs.rs holds them to it), evaluated as ECR documents its evaluation
//! (`rig::lifecycle`) over a repository's images with the tags the fill controller writes: what a
//! cluster uses is anchored (`inuse-<cluster>-<hex>`, fill-mirror's own `anchor_tag`) and kept
//! past the age; what no cluster anchors expires by it; the rule 0.7.0 shipped expired them all.
//! The same repository under Artifact Registry's cleanup policies as deploy/ ships them
//! (deploy/gke-artifact-registry/cleanup-policy.json), evaluated as Google documents them.

mod rig;

#[allow(dead_code)] // the record's reading half is the prune's
#[path = "../fill-mirror/src/in_use_set.rs"]
mod in_use_set;

use std::collections::BTreeSet;

use rig::lifecycle::{Image, expired};

/// deploy/eks-ecr/aws/lifecycle-policy.json as 0.7.0 shipped it: one age-only rule.
const AGE_ONLY_0_7: &str = r#"{"rules":[{"rulePriority":1,"description":"Expire images pushed more than 30 days ago: the check reports their Pods and the fill job copies them again","selection":{"tagStatus":"any","countType":"sinceImagePushed","countUnit":"days","countNumber":30},"action":{"type":"expire"}}]}"#;

fn shipped() -> String {
    std::fs::read_to_string(rig::root().join("deploy/eks-ecr/aws/lifecycle-policy.json"))
        .expect("deploy/eks-ecr/aws/lifecycle-policy.json")
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|n| n.to_string()).collect()
}

/// A digest of 64 hex digits made from a letter, as a registry would name a manifest.
fn digest(seed: char) -> String {
    format!("sha256:{}", seed.to_string().repeat(64))
}

/// One repository of the mirror as the controllers leave it, every image pushed 40 days ago
/// (past the 30 days): A to D in use by the cluster `prod` (a Deployment's running image, one
/// scaled to zero, a CronJob's, a rollback ReplicaSet's: the watch anchors them all alike), F
/// used by the second cluster `eu-2` only, E by no cluster (its version tag alone), and A's
/// cosign signature (`sha256-<hex of A>.sig`), anchored with A as an attached artifact; and G,
/// pushed 5 days ago and used by nobody yet.
fn repository() -> Vec<Image> {
    let anchor = |cluster: &str, seed: char| {
        in_use_set::anchor_tag(cluster, &digest(seed)).expect("a sha256 digest")
    };
    let signature = format!("sha256-{}.sig", "a".repeat(64));
    let prod = |name: &str, version: &str, seed: char| {
        Image::new(name, &[version, &anchor("prod", seed)], 40.0)
    };
    vec![
        prod("A", "1.0", 'a'),
        prod("B", "1.1", 'b'),
        prod("C", "1.2", 'c'),
        prod("D", "0.9", 'd'),
        Image::new("E", &["0.8"], 40.0),
        Image::new("F", &["2.0", &anchor("eu-2", 'f')], 40.0),
        Image::new("signature of A", &[&signature, &anchor("prod", '5')], 40.0),
        Image::new("G", &["2.1"], 5.0),
    ]
}

/// The shipped rules keep every anchored image and A's signature past the age, and expire E,
/// which no cluster anchors; the rule of 0.7.0 expires every image past the age, the ones that
/// run included (the failure this project was made for).
#[test]
fn the_shipped_rules_keep_what_a_cluster_anchors_and_expire_the_rest() {
    let images = repository();
    assert_eq!(expired(&shipped(), &images), Ok(names(&["E"])));
    assert_eq!(
        expired(AGE_ONLY_0_7, &images),
        Ok(names(&["A", "B", "C", "D", "E", "F", "signature of A"]))
    );
}

/// Each anchor counts alone: an image whose only anchor is another cluster's is kept, and an
/// anchor tag the prune removed (the digest no longer in use) leaves its image to the age.
#[test]
fn an_image_keeps_while_any_anchor_stays_and_expires_when_the_last_goes() {
    let both = in_use_set::anchor_tag("prod", &digest('a')).expect("anchor");
    let other = in_use_set::anchor_tag("eu-2", &digest('a')).expect("anchor");
    let twice = [Image::new("A", &["1.0", &both, &other], 40.0)];
    assert_eq!(expired(&shipped(), &twice), Ok(BTreeSet::new()));
    let one_left = [Image::new("A", &["1.0", &other], 40.0)];
    assert_eq!(expired(&shipped(), &one_left), Ok(BTreeSet::new()));
    let none_left = [Image::new("A", &["1.0"], 40.0)];
    assert_eq!(expired(&shipped(), &none_left), Ok(names(&["A"])));
}

/// The anchor rule's count is what makes it keep: ECR has only `expire`, so the rule expires the
/// anchored images beyond its count, the oldest first. Below the count nothing anchored expires
/// whatever its age; the images a repository can hold (its quota, 100,000 by default) stay
/// below it.
#[test]
fn the_anchor_rule_expires_no_anchored_image_below_its_count() {
    let policy: serde_json::Value = serde_json::from_str(&shipped()).expect("JSON");
    let anchor_rule = policy["rules"]
        .as_array()
        .and_then(|rules| {
            rules
                .iter()
                .find(|r| r["selection"]["tagPrefixList"] == serde_json::json!(["inuse-"]))
        })
        .expect("a rule selecting the anchors");
    assert_eq!(anchor_rule["selection"]["countType"], "imageCountMoreThan");
    let count = anchor_rule["selection"]["countNumber"]
        .as_u64()
        .expect("countNumber");
    assert!(count >= 100_000, "{count}");
    let old: Vec<Image> = (0..500)
        .map(|i| {
            let hex = format!("{i:064x}");
            let tag = in_use_set::anchor_tag("prod", &format!("sha256:{hex}")).expect("anchor");
            Image::new(&format!("image {i}"), &[&tag], 3650.0 - i as f64)
        })
        .collect();
    assert_eq!(expired(&shipped(), &old), Ok(BTreeSet::new()));
}

/// The evaluation is ECR's: the outcomes of the user guide's worked examples
/// (https://docs.aws.amazon.com/AmazonECR/latest/userguide/lifecycle_policy_examples.html,
/// "Filtering on multiple rules" A and B, "multiple tags in a single rule" A and B, "all images"
/// A and B), and the policies ECR refuses.
#[test]
fn the_evaluation_gives_the_user_guides_worked_examples() {
    let rule = |priority: u64, status: &str, prefixes: &[&str], count: &str, n: u64| {
        let mut selection =
            serde_json::json!({"tagStatus": status, "countType": count, "countNumber": n});
        if !prefixes.is_empty() {
            selection["tagPrefixList"] = serde_json::json!(prefixes);
        }
        if count == "sinceImagePushed" {
            selection["countUnit"] = "days".into();
        }
        serde_json::json!({"rulePriority": priority, "selection": selection, "action": {"type": "expire"}})
    };
    let policy = |rules: Vec<serde_json::Value>| serde_json::json!({ "rules": rules }).to_string();
    let more = "imageCountMoreThan";
    let since = "sinceImagePushed";
    let multiple = [
        Image::new("A", &["beta-1", "prod-1"], 10.0),
        Image::new("B", &["beta-2", "prod-2"], 9.0),
        Image::new("C", &["beta-3"], 8.0),
    ];
    let prod_first = policy(vec![
        rule(1, "tagged", &["prod"], more, 1),
        rule(2, "tagged", &["beta"], more, 1),
    ]);
    assert_eq!(expired(&prod_first, &multiple), Ok(names(&["A"])));
    let beta_first = policy(vec![
        rule(1, "tagged", &["beta"], more, 1),
        rule(2, "tagged", &["prod"], more, 1),
    ]);
    assert_eq!(expired(&beta_first, &multiple), Ok(names(&["A", "B"])));
    let tags = [
        Image::new("A", &["alpha-1"], 12.0),
        Image::new("B", &["beta-1"], 11.0),
        Image::new("C", &["alpha-2", "beta-2"], 10.0),
        Image::new("D", &["alpha-3"], 4.0),
        Image::new("E", &["beta-3"], 3.0),
        Image::new("F", &["alpha-4", "beta-4"], 2.0),
    ];
    let both = policy(vec![rule(1, "tagged", &["alpha", "beta"], since, 5)]);
    assert_eq!(expired(&both, &tags), Ok(names(&["C"])));
    let not_exclusive = [
        Image::new("A", &["alpha-1", "beta-1", "gamma-1"], 10.0),
        Image::new("B", &["alpha-2", "beta-2"], 9.0),
        Image::new("C", &["alpha-3", "beta-3", "gamma-2"], 8.0),
    ];
    let both_count = policy(vec![rule(1, "tagged", &["alpha", "beta"], more, 1)]);
    assert_eq!(expired(&both_count, &not_exclusive), Ok(names(&["A", "B"])));
    let all = [
        Image::new("A", &["alpha-1"], 4.0),
        Image::new("B", &["beta-1"], 3.0),
        Image::new("C", &[], 2.0),
        Image::new("D", &["alpha-2"], 1.0),
    ];
    let keep_one = policy(vec![rule(1, "any", &[], more, 1)]);
    assert_eq!(expired(&keep_one, &all), Ok(names(&["A", "B", "C"])));
    // D and E were both pushed "1 day ago"; the guide keeps E, the later.
    let combined = [
        Image::new("A", &["alpha-1", "beta-1"], 4.0),
        Image::new("B", &[], 3.0),
        Image::new("C", &["alpha-2"], 2.0),
        Image::new("D", &["git hash"], 1.01),
        Image::new("E", &[], 1.0),
    ];
    let three = policy(vec![
        rule(1, "tagged", &["alpha"], more, 1),
        rule(2, "untagged", &[], since, 1),
        rule(3, "any", &[], more, 1),
    ]);
    assert_eq!(expired(&three, &combined), Ok(names(&["A", "B", "D"])));
    // Refused: `any` not last, two untagged rules, a prefix set twice, a priority twice.
    for refused in [
        policy(vec![
            rule(1, "any", &[], since, 30),
            rule(2, "tagged", &["inuse-"], more, 9),
        ]),
        policy(vec![
            rule(1, "untagged", &[], since, 1),
            rule(2, "untagged", &[], more, 1),
        ]),
        policy(vec![
            rule(1, "tagged", &["a"], more, 1),
            rule(2, "tagged", &["a"], since, 1),
        ]),
        policy(vec![
            rule(1, "tagged", &["a"], more, 1),
            rule(1, "tagged", &["b"], more, 1),
        ]),
    ] {
        assert!(expired(&refused, &all).is_err(), "{refused}");
    }
}

/// The versions Artifact Registry's cleanup `policies` (a policy file's JSON) delete, as Google
/// documents them (https://cloud.google.com/artifact-registry/docs/repositories/cleanup-policy-overview):
/// a Delete policy's conditions select a version (`tagState`, `tagPrefixes`: one of its tags
/// starts with one of them, `olderThan`: uploaded longer ago), and "when an artifact matches the
/// criteria for both a delete policy and a keep policy, the artifact is kept".
fn artifact_registry_deleted(policies: &str, images: &[Image]) -> BTreeSet<String> {
    let policies: Vec<serde_json::Value> = serde_json::from_str(policies).expect("a JSON list");
    let days = |age: &str| -> f64 {
        match age.split_at(age.len().saturating_sub(1)) {
            (n, "d") => n.parse().expect("days"),
            (n, "s") => n.parse::<f64>().expect("seconds") / 86_400.0,
            _ => panic!("olderThan {age:?}"),
        }
    };
    let matches = |policy: &serde_json::Value, image: &Image| {
        let condition = &policy["condition"];
        let state = match condition["tagState"].as_str().unwrap_or("any") {
            "tagged" => !image.tags.is_empty(),
            "untagged" => image.tags.is_empty(),
            "any" => true,
            other => panic!("tagState {other:?}"),
        };
        let prefixes = condition["tagPrefixes"].as_array().is_none_or(|prefixes| {
            prefixes
                .iter()
                .filter_map(|p| p.as_str())
                .any(|prefix| image.tags.iter().any(|tag| tag.starts_with(prefix)))
        });
        let older = condition["olderThan"]
            .as_str()
            .is_none_or(|age| image.pushed_days_ago > days(age));
        state && prefixes && older
    };
    let of = |kind: &str| -> Vec<&serde_json::Value> {
        policies
            .iter()
            .filter(|p| p["action"]["type"] == kind)
            .collect()
    };
    let (deletes, keeps) = (of("Delete"), of("Keep"));
    images
        .iter()
        .filter(|image| deletes.iter().any(|p| matches(p, image)))
        .filter(|image| !keeps.iter().any(|p| matches(p, image)))
        .map(|image| image.name.clone())
        .collect()
}

/// Artifact Registry's cleanup policies as deploy/ ships them
/// (deploy/gke-artifact-registry/cleanup-policy.json), over the same repository: the anchored
/// images and the signature kept, E deleted; the delete policy alone, a rule of 0.7.0's kind,
/// deletes everything past the age.
#[test]
fn the_artifact_registry_policies_keep_what_a_cluster_anchors() {
    let shipped = std::fs::read_to_string(
        rig::root().join("deploy/gke-artifact-registry/cleanup-policy.json"),
    )
    .expect("deploy/gke-artifact-registry/cleanup-policy.json");
    let images = repository();
    assert_eq!(artifact_registry_deleted(&shipped, &images), names(&["E"]));
    let policies: Vec<serde_json::Value> = serde_json::from_str(&shipped).expect("JSON");
    let delete_only = serde_json::Value::Array(
        policies
            .into_iter()
            .filter(|p| p["action"]["type"] == "Delete")
            .collect(),
    );
    assert_eq!(
        artifact_registry_deleted(&delete_only.to_string(), &images),
        names(&["A", "B", "C", "D", "E", "F", "signature of A"])
    );
}
