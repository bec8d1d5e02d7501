//! Amazon ECR's lifecycle policy evaluation, as ECR's user guide states it ("Lifecycle policy
//! evaluation rules", https://docs.aws.amazon.com/AmazonECR/latest/userguide/LifecyclePolicies.html#lp_evaluation_rules,
//! and the properties page, lifecycle_policy_parameters.html): which images of a repository a
//! policy expires. The tests hold deploy/'s rules to it; moto, the tests' ECR, stores a policy
//! but never applies one, and ECR's own preview needs an AWS account.
//!
//! What is implemented, each from that page:
//! - the policy is refused when two rules share a priority, when a rule with `tagStatus` `any` is
//!   not the one of the highest priority value ("must have the highest value for rulePriority
//!   and be evaluated last"), when more than one rule selects untagged images, when two rules
//!   share a set of tag prefixes, when `tagged` names no prefix or pattern list, or `untagged` one;
//! - every rule identifies the images its tagging requirement selects (`any`: all; `untagged`:
//!   none with a tag; `tagged`: each of `tagPrefixList`'s prefixes, or each of `tagPatternList`'s
//!   patterns, matched by one of the image's tags), "at the same time, regardless of rule
//!   priority";
//! - `imageCountMoreThan` marks the images it identifies beyond the count, youngest to oldest by
//!   push time; `sinceImagePushed` those pushed more than the count of days ago;
//! - "An image that matches the tagging requirements of a rule cannot be expired by a rule with a
//!   lower priority", while the lower rule still counts it ("can still identify them as if they
//!   haven't been expired"): the user guide's worked examples (lifecycle_policy_examples.html)
//!   are this module's tests, in tests/ecr_lifecycle.rs.

use std::collections::BTreeSet;

/// One image (a manifest) of a repository, as the evaluation sees it.
#[derive(Debug, Clone)]
pub struct Image {
    pub name: String,
    pub tags: Vec<String>,
    /// Days since its push (fractional: two images of one day keep their order).
    pub pushed_days_ago: f64,
}

impl Image {
    pub fn new(name: &str, tags: &[&str], pushed_days_ago: f64) -> Image {
        Image {
            name: name.to_string(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            pushed_days_ago,
        }
    }
}

/// The names of the images `policy` (a lifecycle policy's JSON text) expires, or why ECR refuses
/// the policy.
pub fn expired(policy: &str, images: &[Image]) -> Result<BTreeSet<String>, String> {
    let policy: serde_json::Value =
        serde_json::from_str(policy).map_err(|e| format!("the policy is not JSON: {e}"))?;
    let mut rules: Vec<&serde_json::Value> = policy["rules"]
        .as_array()
        .ok_or("the policy has no rules")?
        .iter()
        .collect();
    rules.sort_by_key(|rule| rule["rulePriority"].as_u64().unwrap_or(u64::MAX));
    check(&rules)?;
    // Every rule's tagging requirement, over every image, at once.
    let identified: Vec<Vec<bool>> = rules
        .iter()
        .map(|rule| images.iter().map(|image| selects(rule, image)).collect())
        .collect();
    let mut expired = BTreeSet::new();
    for (at, rule) in rules.iter().enumerate() {
        let selection = &rule["selection"];
        let count = selection["countNumber"]
            .as_u64()
            .ok_or_else(|| format!("rule {}: no countNumber", rule["rulePriority"]))?;
        let mut seen: Vec<usize> = (0..images.len()).filter(|i| identified[at][*i]).collect();
        let marked: Vec<usize> = match selection["countType"].as_str() {
            Some("imageCountMoreThan") => {
                seen.sort_by(|a, b| {
                    images[*a]
                        .pushed_days_ago
                        .total_cmp(&images[*b].pushed_days_ago)
                });
                seen.into_iter().skip(count as usize).collect()
            }
            Some("sinceImagePushed") => {
                if selection["countUnit"] != "days" {
                    return Err(format!(
                        "rule {}: countUnit must be days",
                        rule["rulePriority"]
                    ));
                }
                seen.into_iter()
                    .filter(|i| images[*i].pushed_days_ago > count as f64)
                    .collect()
            }
            other => {
                return Err(format!(
                    "rule {}: countType {other:?}",
                    rule["rulePriority"]
                ));
            }
        };
        if rule["action"]["type"] != "expire" {
            return Err(format!(
                "rule {}: action must be expire",
                rule["rulePriority"]
            ));
        }
        for image in marked {
            let higher_selects = (0..at).any(|higher| identified[higher][image]);
            if !higher_selects {
                expired.insert(images[image].name.clone());
            }
        }
    }
    Ok(expired)
}

/// ECR's checks of a policy's rules (sorted by priority), naming the rule that fails.
fn check(rules: &[&serde_json::Value]) -> Result<(), String> {
    let mut priorities = BTreeSet::new();
    let mut prefix_sets = BTreeSet::new();
    let mut untagged = 0;
    for (at, rule) in rules.iter().enumerate() {
        let priority = rule["rulePriority"]
            .as_u64()
            .ok_or_else(|| format!("a rule without rulePriority: {rule}"))?;
        if !priorities.insert(priority) {
            return Err(format!("rulePriority {priority} twice"));
        }
        let selection = &rule["selection"];
        let listed = |key: &str| -> Vec<String> {
            selection[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        };
        let (prefixes, patterns) = (listed("tagPrefixList"), listed("tagPatternList"));
        match selection["tagStatus"].as_str() {
            Some("any") if at + 1 != rules.len() => {
                return Err(format!(
                    "rule {priority}: tagStatus any must have the highest rulePriority"
                ));
            }
            Some("any") => {}
            Some("untagged") => {
                untagged += 1;
                if untagged > 1 || !prefixes.is_empty() || !patterns.is_empty() {
                    return Err(format!(
                        "rule {priority}: one untagged rule, without tag lists"
                    ));
                }
            }
            Some("tagged") => {
                if prefixes.is_empty() == patterns.is_empty() {
                    return Err(format!(
                        "rule {priority}: tagged needs tagPrefixList or tagPatternList"
                    ));
                }
                let set: BTreeSet<String> = prefixes.into_iter().collect();
                if !set.is_empty() && !prefix_sets.insert(set) {
                    return Err(format!(
                        "rule {priority}: its tag prefixes are another rule's"
                    ));
                }
            }
            other => return Err(format!("rule {priority}: tagStatus {other:?}")),
        }
    }
    Ok(())
}

/// Whether `rule`'s tagging requirement selects `image`.
fn selects(rule: &serde_json::Value, image: &Image) -> bool {
    let selection = &rule["selection"];
    let every = |key: &str, matches: &dyn Fn(&str, &str) -> bool| {
        selection[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .all(|wanted| image.tags.iter().any(|tag| matches(wanted, tag)))
    };
    match selection["tagStatus"].as_str() {
        Some("any") => true,
        Some("untagged") => image.tags.is_empty(),
        Some("tagged") => {
            !image.tags.is_empty()
                && every("tagPrefixList", &|prefix, tag| tag.starts_with(prefix))
                && every("tagPatternList", &wildcard)
        }
        _ => false,
    }
}

/// An ECR tag pattern: `*` any run of characters, every other character itself.
fn wildcard(pattern: &str, tag: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == tag,
        Some((head, rest)) => {
            tag.starts_with(head)
                && (head.len()..=tag.len())
                    .filter(|at| tag.is_char_boundary(*at))
                    .any(|at| wildcard(rest, &tag[at..]))
        }
    }
}
