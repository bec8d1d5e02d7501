//! What the cluster names, before the mirror is asked: every image a running or pending Pod
//! runs or is about to pull, every image a workload template names (a Deployment scaled to
//! zero included), and every image a ReplicaSet a rollback can return to holds, in the
//! namespaces the policy covers; each mapped to its mirror repositories by the policy crate's
//! own routing (`mirror_image` for what is already under a target, `source_image` for what a
//! rule routes there), never by a rule of its own.

use std::collections::BTreeMap;

use image_swapper_policy::decide::images::{MirrorImage, mirror_image, source_image};
use image_swapper_policy::policy::Policy;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodTemplateSpec};

use super::Scope;

/// The annotation the Deployment controller numbers its ReplicaSets' revisions with.
pub const REVISION: &str = "deployment.kubernetes.io/revision";
/// A Deployment's `revisionHistoryLimit` when it sets none (apps/v1's default).
const DEFAULT_HISTORY: usize = 10;

/// One image as the cluster names it, and what names it (`Deployment shop/web`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Named {
    pub image: String,
    pub used_by: String,
}

/// What the mirror is asked for one named image: a digest it pins, or a tag to look up.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pin {
    Digest(String),
    Tag(String),
}

/// One named image in one mirror repository (`host/path`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InMirror {
    pub repository: String,
    pub pin: Pin,
}

/// The objects the set is computed from, as the watch's stores hold them.
#[derive(Default)]
pub struct Objects<'a> {
    pub pods: Vec<&'a Pod>,
    /// Workload templates other than ReplicaSets: kind, `namespace/name`, Pod template.
    pub templates: Vec<(&'static str, String, &'a PodTemplateSpec)>,
    pub deployments: Vec<&'a Deployment>,
    pub replica_sets: Vec<&'a ReplicaSet>,
}

fn key(namespace: Option<&String>, name: Option<&String>) -> String {
    format!(
        "{}/{}",
        namespace.map_or("", String::as_str),
        name.map_or("", String::as_str)
    )
}

fn namespace_of(key: &str) -> &str {
    key.split('/').next().unwrap_or_default()
}

/// The images of a Pod spec's containers, init and ephemeral containers.
fn spec_images(spec: &PodSpec) -> Vec<String> {
    let ephemeral = spec.ephemeral_containers.iter().flatten();
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.image.clone())
        .chain(ephemeral.filter_map(|c| c.image.clone()))
        .collect()
}

/// Every image the covered namespaces name, with what names it.
pub fn named(objects: &Objects<'_>, scope: &Scope) -> Vec<Named> {
    let covered = |key: &str| scope.coverage.covers(namespace_of(key));
    let mut named = Vec::new();
    for pod in &objects.pods {
        let key = key(pod.metadata.namespace.as_ref(), pod.metadata.name.as_ref());
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if !covered(&key) || !matches!(phase, None | Some("Pending" | "Running")) {
            continue;
        }
        let used_by = format!("Pod {key}");
        let spec = pod.spec.iter().flat_map(spec_images);
        let statuses = pod.status.iter().flat_map(|status| {
            let lists = [
                &status.container_statuses,
                &status.init_container_statuses,
                &status.ephemeral_container_statuses,
            ];
            lists
                .into_iter()
                .flatten()
                .flatten()
                .map(|s| s.image_id.clone())
        });
        for image in spec.chain(statuses.filter_map(|id| pulled_digest(&id))) {
            named.push(Named {
                image,
                used_by: used_by.clone(),
            });
        }
    }
    for (kind, key, template) in &objects.templates {
        if covered(key) {
            for image in template.spec.iter().flat_map(spec_images) {
                named.push(Named {
                    image,
                    used_by: format!("{kind} {key}"),
                });
            }
        }
    }
    for (replica_set, revision) in rollback_targets(objects) {
        let key = key(
            replica_set.metadata.namespace.as_ref(),
            replica_set.metadata.name.as_ref(),
        );
        let template = replica_set.spec.as_ref().and_then(|s| s.template.as_ref());
        if covered(&key) {
            for image in template
                .and_then(|t| t.spec.as_ref())
                .map(spec_images)
                .unwrap_or_default()
            {
                named.push(Named {
                    image,
                    used_by: format!("ReplicaSet {key} (revision {revision})"),
                });
            }
        }
    }
    named.sort();
    named.dedup();
    named
}

/// The image a container status's `imageID` names by digest (`repository@sha256:…`, with
/// dockershim's `docker-pullable://` taken off); none for a bare image id, which names a
/// config, not a manifest.
fn pulled_digest(image_id: &str) -> Option<String> {
    let image = image_id
        .strip_prefix("docker-pullable://")
        .unwrap_or(image_id);
    (!image.is_empty() && !image.starts_with("sha256:") && image.contains('@'))
        .then(|| image.to_string())
}

/// The ReplicaSets a Deployment can be rolled back to, each with its revision: per Deployment
/// (its controller owner), the newest `revisionHistoryLimit` + 1 by revision (the current
/// one and the history the Deployment controller keeps). A ReplicaSet without a Deployment is
/// a workload of its own, and counts whatever its revision.
pub fn rollback_targets<'a>(objects: &Objects<'a>) -> Vec<(&'a ReplicaSet, u64)> {
    let limits: BTreeMap<&str, usize> = objects
        .deployments
        .iter()
        .filter_map(|d| {
            let limit = d.spec.as_ref().and_then(|s| s.revision_history_limit);
            let limit = limit.map_or(DEFAULT_HISTORY, |l| usize::try_from(l).unwrap_or(0));
            Some((d.metadata.uid.as_deref()?, limit))
        })
        .collect();
    let mut owned: BTreeMap<&str, Vec<(&ReplicaSet, u64)>> = BTreeMap::new();
    let mut targets = Vec::new();
    for replica_set in &objects.replica_sets {
        let revision = replica_set
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REVISION))
            .and_then(|r| r.parse::<u64>().ok())
            .unwrap_or(0);
        let owner = replica_set
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == "Deployment");
        match owner {
            Some(owner) => owned
                .entry(owner.uid.as_str())
                .or_default()
                .push((replica_set, revision)),
            None => targets.push((*replica_set, revision)),
        }
    }
    for (uid, mut sets) in owned {
        // A Deployment not (or no more) in the store: its ReplicaSets are being collected.
        let Some(limit) = limits.get(uid) else {
            continue;
        };
        sets.sort_by_key(|set| std::cmp::Reverse(set.1));
        targets.extend(sets.into_iter().take(limit + 1));
    }
    targets
}

/// Where `image` lies in the mirror: itself when it is already under a target, else each
/// target a rule routes it to; nothing for an image the policy leaves alone.
pub fn in_mirror(image: &str, policy: &Policy) -> Vec<InMirror> {
    let pinned = |target: &MirrorImage| InMirror {
        repository: target.repository().to_string(),
        pin: match target.digest() {
            Some(digest) => Pin::Digest(digest.to_string()),
            None => Pin::Tag(
                target
                    .lookup
                    .strip_prefix(target.repository())
                    .and_then(|rest| rest.strip_prefix(':'))
                    .unwrap_or("latest")
                    .to_string(),
            ),
        },
    };
    if let Some(mirror) = mirror_image(image, &policy.router) {
        return vec![pinned(&mirror)];
    }
    source_image(image, policy)
        .map(|source| source.targets.iter().map(pinned).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn replica_set(name: &str, owner: &str, revision: u64) -> ReplicaSet {
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "shop",
                "annotations": {REVISION: revision.to_string()},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                     "uid": owner, "controller": true}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_rollback_reaches_the_current_replica_set_and_the_history_the_limit_keeps() {
        let web: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-web"},
            "spec": {"revisionHistoryLimit": 1, "selector": {}, "template": {}},
        }))
        .unwrap();
        let sets = [
            replica_set("web-1", "u-web", 1),
            replica_set("web-3", "u-web", 3),
            replica_set("web-2", "u-web", 2),
            replica_set("gone-1", "u-deleted", 1),
        ];
        let objects = Objects {
            deployments: vec![&web],
            replica_sets: sets.iter().collect(),
            ..Objects::default()
        };
        let mut kept: Vec<(String, u64)> = rollback_targets(&objects)
            .into_iter()
            .map(|(set, revision)| (set.metadata.name.clone().unwrap(), revision))
            .collect();
        kept.sort();
        assert_eq!(kept, [("web-2".to_string(), 2), ("web-3".to_string(), 3)]);
    }

    #[test]
    fn an_image_id_names_a_digest_and_a_bare_image_id_does_not() {
        let digest = "sha256:92fa270a8071da49ccdad2b13d1a7db83ae7749a89946990b1cf6c9b09131374";
        assert_eq!(
            pulled_digest(&format!("docker-pullable://m.io/hub/web@{digest}")),
            Some(format!("m.io/hub/web@{digest}"))
        );
        assert_eq!(pulled_digest(digest), None);
        assert_eq!(pulled_digest(""), None);
    }
}
